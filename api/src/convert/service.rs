//! Service ↔ proto.

use k8s_openapi::api::core::v1 as core;

use super::meta::*;
use super::ProtoConvert;
use crate::proto as pb;
use crate::Error;

impl ProtoConvert for core::Service {
    type Proto = pb::Service;
    extra_accessors!();

    fn to_typed(&self) -> pb::Service {
        let spec = self.spec.as_ref().map(|s| pb::ServiceSpec {
            r#type: s.type_.clone(),
            ports: s
                .ports
                .iter()
                .flatten()
                .map(|p| pb::ServicePort {
                    name: p.name.clone(),
                    protocol: p.protocol.clone(),
                    port: p.port,
                    target_port: p.target_port.as_ref().map(int_or_string),
                    node_port: p.node_port,
                    app_protocol: p.app_protocol.clone(),
                })
                .collect(),
            selector: map(&s.selector),
            cluster_ip: s.cluster_ip.clone(),
            cluster_ips: list(&s.cluster_ips),
            ip_families: list(&s.ip_families),
            ip_family_policy: s.ip_family_policy.clone(),
            external_ips: list(&s.external_ips),
            external_name: s.external_name.clone(),
            external_traffic_policy: s.external_traffic_policy.clone(),
            internal_traffic_policy: s.internal_traffic_policy.clone(),
            health_check_node_port: s.health_check_node_port,
            load_balancer_ip: s.load_balancer_ip.clone(),
            load_balancer_source_ranges: list(&s.load_balancer_source_ranges),
            load_balancer_class: s.load_balancer_class.clone(),
            allocate_load_balancer_node_ports: s.allocate_load_balancer_node_ports,
            session_affinity: s.session_affinity.clone(),
            session_affinity_timeout_seconds: s
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds),
            publish_not_ready_addresses: s.publish_not_ready_addresses,
        });
        let status = self.status.as_ref().map(|s| pb::ServiceStatus {
            load_balancer_ingress: s
                .load_balancer
                .as_ref()
                .and_then(|l| l.ingress.as_ref())
                .into_iter()
                .flatten()
                .map(|i| pb::LoadBalancerIngress {
                    ip: i.ip.clone(),
                    hostname: i.hostname.clone(),
                    ip_mode: i.ip_mode.clone(),
                })
                .collect(),
            conditions: conditions(&s.conditions),
        });
        pb::Service { metadata: Some(object_meta(&self.metadata)), spec, status, extra_json: String::new() }
    }

    fn from_typed(p: &pb::Service) -> Result<Self, Error> {
        let spec = p
            .spec
            .as_ref()
            .map(|s| -> Result<core::ServiceSpec, Error> {
                Ok(core::ServiceSpec {
                    type_: s.r#type.clone(),
                    ports: opt_list(
                        &s.ports
                            .iter()
                            .map(|p| {
                                Ok(core::ServicePort {
                                    name: p.name.clone(),
                                    protocol: p.protocol.clone(),
                                    port: p.port,
                                    target_port: p.target_port.as_ref().map(int_or_string_back).transpose()?,
                                    node_port: p.node_port,
                                    app_protocol: p.app_protocol.clone(),
                                })
                            })
                            .collect::<Result<Vec<_>, Error>>()?,
                    ),
                    selector: opt_map(&s.selector),
                    cluster_ip: s.cluster_ip.clone(),
                    cluster_ips: opt_list(&s.cluster_ips),
                    ip_families: opt_list(&s.ip_families),
                    ip_family_policy: s.ip_family_policy.clone(),
                    external_ips: opt_list(&s.external_ips),
                    external_name: s.external_name.clone(),
                    external_traffic_policy: s.external_traffic_policy.clone(),
                    internal_traffic_policy: s.internal_traffic_policy.clone(),
                    health_check_node_port: s.health_check_node_port,
                    load_balancer_ip: s.load_balancer_ip.clone(),
                    load_balancer_source_ranges: opt_list(&s.load_balancer_source_ranges),
                    load_balancer_class: s.load_balancer_class.clone(),
                    allocate_load_balancer_node_ports: s.allocate_load_balancer_node_ports,
                    session_affinity: s.session_affinity.clone(),
                    session_affinity_config: s.session_affinity_timeout_seconds.map(|t| core::SessionAffinityConfig {
                        client_ip: Some(core::ClientIPConfig { timeout_seconds: Some(t) }),
                    }),
                    publish_not_ready_addresses: s.publish_not_ready_addresses,
                    traffic_distribution: None,
                })
            })
            .transpose()?;
        let status = p
            .status
            .as_ref()
            .map(|s| -> Result<core::ServiceStatus, Error> {
                Ok(core::ServiceStatus {
                    load_balancer: Some(core::LoadBalancerStatus {
                        ingress: opt_list(
                            &s.load_balancer_ingress
                                .iter()
                                .map(|i| core::LoadBalancerIngress {
                                    ip: i.ip.clone(),
                                    hostname: i.hostname.clone(),
                                    ip_mode: i.ip_mode.clone(),
                                    ports: None,
                                })
                                .collect::<Vec<_>>(),
                        ),
                    }),
                    conditions: conditions_back(&s.conditions)?,
                })
            })
            .transpose()?;
        Ok(core::Service { metadata: object_meta_back(&p.metadata)?, spec, status })
    }
}
