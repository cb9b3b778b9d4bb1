//! Endpoints and EndpointSlice ↔ proto.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;

use super::meta::*;
use super::ProtoConvert;
use crate::proto as pb;
use crate::Error;

fn endpoint_address(a: &core::EndpointAddress) -> pb::EndpointAddress {
    pb::EndpointAddress {
        ip: a.ip.clone(),
        hostname: a.hostname.clone(),
        node_name: a.node_name.clone(),
        target_ref: a.target_ref.as_ref().map(object_ref),
    }
}

fn endpoint_address_back(a: &pb::EndpointAddress) -> core::EndpointAddress {
    core::EndpointAddress {
        ip: a.ip.clone(),
        hostname: a.hostname.clone(),
        node_name: a.node_name.clone(),
        target_ref: a.target_ref.as_ref().map(object_ref_back),
    }
}

impl ProtoConvert for core::Endpoints {
    type Proto = pb::Endpoints;
    extra_accessors!();

    fn to_typed(&self) -> pb::Endpoints {
        pb::Endpoints {
            metadata: Some(object_meta(&self.metadata)),
            subsets: self
                .subsets
                .iter()
                .flatten()
                .map(|s| pb::EndpointSubset {
                    addresses: s.addresses.iter().flatten().map(endpoint_address).collect(),
                    not_ready_addresses: s.not_ready_addresses.iter().flatten().map(endpoint_address).collect(),
                    ports: s
                        .ports
                        .iter()
                        .flatten()
                        .map(|p| pb::EndpointPort {
                            name: p.name.clone(),
                            port: Some(p.port),
                            protocol: p.protocol.clone(),
                            app_protocol: p.app_protocol.clone(),
                        })
                        .collect(),
                })
                .collect(),
            extra_json: String::new(),
        }
    }

    fn from_typed(p: &pb::Endpoints) -> Result<Self, Error> {
        Ok(core::Endpoints {
            metadata: object_meta_back(&p.metadata)?,
            subsets: opt_list(
                &p.subsets
                    .iter()
                    .map(|s| core::EndpointSubset {
                        addresses: opt_list(&s.addresses.iter().map(endpoint_address_back).collect::<Vec<_>>()),
                        not_ready_addresses: opt_list(
                            &s.not_ready_addresses.iter().map(endpoint_address_back).collect::<Vec<_>>(),
                        ),
                        ports: opt_list(
                            &s.ports
                                .iter()
                                .map(|p| core::EndpointPort {
                                    name: p.name.clone(),
                                    port: p.port.unwrap_or_default(),
                                    protocol: p.protocol.clone(),
                                    app_protocol: p.app_protocol.clone(),
                                })
                                .collect::<Vec<_>>(),
                        ),
                    })
                    .collect::<Vec<_>>(),
            ),
        })
    }
}

// === EndpointSlice ===

impl ProtoConvert for discovery::EndpointSlice {
    type Proto = pb::EndpointSlice;
    extra_accessors!();

    fn to_typed(&self) -> pb::EndpointSlice {
        pb::EndpointSlice {
            metadata: Some(object_meta(&self.metadata)),
            address_type: self.address_type.clone(),
            endpoints: self
                .endpoints
                .iter()
                .map(|e| pb::Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: e.conditions.as_ref().map(|c| pb::EndpointConditions {
                        ready: c.ready,
                        serving: c.serving,
                        terminating: c.terminating,
                    }),
                    hostname: e.hostname.clone(),
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    target_ref: e.target_ref.as_ref().map(object_ref),
                })
                .collect(),
            ports: self
                .ports
                .iter()
                .flatten()
                .map(|p| pb::EndpointPort {
                    name: p.name.clone(),
                    port: p.port,
                    protocol: p.protocol.clone(),
                    app_protocol: p.app_protocol.clone(),
                })
                .collect(),
            extra_json: String::new(),
        }
    }

    fn from_typed(p: &pb::EndpointSlice) -> Result<Self, Error> {
        Ok(discovery::EndpointSlice {
            metadata: object_meta_back(&p.metadata)?,
            address_type: p.address_type.clone(),
            endpoints: p
                .endpoints
                .iter()
                .map(|e| discovery::Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: e.conditions.as_ref().map(|c| discovery::EndpointConditions {
                        ready: c.ready,
                        serving: c.serving,
                        terminating: c.terminating,
                    }),
                    hostname: e.hostname.clone(),
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    target_ref: e.target_ref.as_ref().map(object_ref_back),
                    ..Default::default()
                })
                .collect(),
            ports: opt_list(
                &p.ports
                    .iter()
                    .map(|p| discovery::EndpointPort {
                        name: p.name.clone(),
                        port: p.port,
                        protocol: p.protocol.clone(),
                        app_protocol: p.app_protocol.clone(),
                    })
                    .collect::<Vec<_>>(),
            ),
        })
    }
}
