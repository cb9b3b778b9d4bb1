//! Node ↔ proto.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

use super::meta::*;
use super::ProtoConvert;
use crate::proto as pb;
use crate::Error;

fn quantities(
    m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, String> {
    m.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

fn quantities_back(
    m: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>> {
    if m.is_empty() {
        None
    } else {
        Some(
            m.iter()
                .map(|(k, v)| (k.clone(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone())))
                .collect(),
        )
    }
}

impl ProtoConvert for core::Node {
    type Proto = pb::Node;
    extra_accessors!();

    fn to_typed(&self) -> pb::Node {
        let spec = self.spec.as_ref().map(|s| pb::NodeSpec {
            pod_cidr: s.pod_cidr.clone(),
            pod_cidrs: list(&s.pod_cidrs),
            unschedulable: s.unschedulable,
            provider_id: s.provider_id.clone(),
            taints: s
                .taints
                .iter()
                .flatten()
                .map(|t| pb::Taint { key: t.key.clone(), value: t.value.clone(), effect: t.effect.clone() })
                .collect(),
        });
        let status = self.status.as_ref().map(|s| pb::NodeStatus {
            conditions: conditions(&s.conditions),
            addresses: s
                .addresses
                .iter()
                .flatten()
                .map(|a| pb::NodeAddress { r#type: a.type_.clone(), address: a.address.clone() })
                .collect(),
            capacity: quantities(&s.capacity),
            allocatable: quantities(&s.allocatable),
            node_info: s.node_info.as_ref().map(|i| pb::NodeSystemInfo {
                machine_id: i.machine_id.clone(),
                system_uuid: i.system_uuid.clone(),
                boot_id: i.boot_id.clone(),
                kernel_version: i.kernel_version.clone(),
                os_image: i.os_image.clone(),
                container_runtime_version: i.container_runtime_version.clone(),
                kubelet_version: i.kubelet_version.clone(),
                kube_proxy_version: i.kube_proxy_version.clone(),
                operating_system: i.operating_system.clone(),
                architecture: i.architecture.clone(),
            }),
            kubelet_endpoint_port: s
                .daemon_endpoints
                .as_ref()
                .and_then(|d| d.kubelet_endpoint.as_ref())
                .map(|k| k.port),
        });
        pb::Node { metadata: Some(object_meta(&self.metadata)), spec, status, extra_json: String::new() }
    }

    fn from_typed(p: &pb::Node) -> Result<Self, Error> {
        let spec = p.spec.as_ref().map(|s| core::NodeSpec {
            pod_cidr: s.pod_cidr.clone(),
            pod_cidrs: opt_list(&s.pod_cidrs),
            unschedulable: s.unschedulable,
            provider_id: s.provider_id.clone(),
            taints: opt_list(
                &s.taints
                    .iter()
                    .map(|t| core::Taint {
                        key: t.key.clone(),
                        value: t.value.clone(),
                        effect: t.effect.clone(),
                        time_added: None,
                    })
                    .collect::<Vec<_>>(),
            ),
            ..Default::default()
        });
        let status = p
            .status
            .as_ref()
            .map(|s| -> Result<core::NodeStatus, Error> {
                Ok(core::NodeStatus {
                    conditions: conditions_back(&s.conditions)?,
                    addresses: opt_list(
                        &s.addresses
                            .iter()
                            .map(|a| core::NodeAddress { type_: a.r#type.clone(), address: a.address.clone() })
                            .collect::<Vec<_>>(),
                    ),
                    capacity: quantities_back(&s.capacity),
                    allocatable: quantities_back(&s.allocatable),
                    node_info: s.node_info.as_ref().map(|i| core::NodeSystemInfo {
                        machine_id: i.machine_id.clone(),
                        system_uuid: i.system_uuid.clone(),
                        boot_id: i.boot_id.clone(),
                        kernel_version: i.kernel_version.clone(),
                        os_image: i.os_image.clone(),
                        container_runtime_version: i.container_runtime_version.clone(),
                        kubelet_version: i.kubelet_version.clone(),
                        kube_proxy_version: i.kube_proxy_version.clone(),
                        operating_system: i.operating_system.clone(),
                        architecture: i.architecture.clone(),
                        swap: None,
                    }),
                    daemon_endpoints: s.kubelet_endpoint_port.map(|port| core::NodeDaemonEndpoints {
                        kubelet_endpoint: Some(core::DaemonEndpoint { port }),
                    }),
                    ..Default::default()
                })
            })
            .transpose()?;
        Ok(core::Node { metadata: object_meta_back(&p.metadata)?, spec, status })
    }
}
