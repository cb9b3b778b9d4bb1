//! The agent's Node: what it reports (pure, from host facts read once), registration, and the
//! heartbeat loop that keeps it Ready and marks it NotReady when the agent stops.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use api::convert::{from_proto, to_proto};
use api::k8s_openapi::api::core::v1 as core;
use api::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use api::proto as pb;

use podpath_client::ApiClient;

use crate::error::{AgentError, Result};

/// The version string the agent reports as kubelet and kube-proxy version.
pub const VERSION: &str = concat!("v1.32.0-podpath.", env!("CARGO_PKG_VERSION"));

/// Facts about the machine the agent runs on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostFacts {
    pub kernel_version: String,
    pub os_image: String,
    pub machine_id: String,
    pub boot_id: String,
    pub architecture: String,
    pub cpus: usize,
    pub memory_kib: u64,
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path).map(|s| s.trim().to_string()).unwrap_or_default()
}

/// Reads the host facts (best effort: a missing file gives an empty value).
pub fn host_facts() -> HostFacts {
    let os_image = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_string())))
        .unwrap_or_else(|| "Linux".into());
    let memory_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("MemTotal:").and_then(|v| v.split_whitespace().next()?.parse().ok()))
        })
        .unwrap_or(0);
    HostFacts {
        kernel_version: read_trim("/proc/sys/kernel/osrelease"),
        os_image,
        machine_id: read_trim("/etc/machine-id"),
        boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
        architecture: match std::env::consts::ARCH {
            "x86_64" => "amd64".into(),
            "aarch64" => "arm64".into(),
            other => other.into(),
        },
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        memory_kib,
    }
}

/// How the agent describes its node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    /// The InternalIPs, primary family first.
    pub internal_ips: Vec<IpAddr>,
    /// The ExternalIPs, if any.
    pub external_ips: Vec<IpAddr>,
    pub max_pods: u32,
    pub labels: BTreeMap<String, String>,
    /// The kubelet API's port (0: none), published as `status.daemonEndpoints`.
    pub kubelet_port: u16,
    /// Annotations the agent publishes on its Node (its local-path root).
    pub annotations: BTreeMap<String, String>,
}

fn ready_condition(ready: bool) -> pb::Condition {
    pb::Condition {
        r#type: "Ready".into(),
        status: if ready { "True" } else { "False" }.into(),
        reason: Some(if ready { "KubeletReady" } else { "KubeletNotReady" }.into()),
        message: Some(if ready { "node-agent is posting ready status" } else { "node-agent stopped" }.into()),
        ..Default::default()
    }
}

/// The Node object the agent registers (pure).
pub fn node_object(cfg: &NodeConfig, facts: &HostFacts) -> core::Node {
    let mut labels = cfg.labels.clone();
    labels.insert("kubernetes.io/hostname".into(), cfg.name.clone());
    labels.insert("kubernetes.io/os".into(), "linux".into());
    labels.insert("kubernetes.io/arch".into(), facts.architecture.clone());
    let capacity: BTreeMap<String, Quantity> = [
        ("cpu".to_string(), Quantity(facts.cpus.to_string())),
        ("memory".to_string(), Quantity(format!("{}Ki", facts.memory_kib))),
        ("pods".to_string(), Quantity(cfg.max_pods.to_string())),
    ]
    .into();
    core::Node {
        metadata: api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(cfg.name.clone()),
            labels: Some(labels),
            annotations: (!cfg.annotations.is_empty()).then(|| cfg.annotations.clone()),
            ..Default::default()
        },
        spec: None,
        status: Some(core::NodeStatus {
            addresses: Some(
                cfg.internal_ips
                    .iter()
                    .map(|ip| core::NodeAddress { type_: "InternalIP".into(), address: ip.to_string() })
                    .chain(
                        cfg.external_ips
                            .iter()
                            .map(|ip| core::NodeAddress { type_: "ExternalIP".into(), address: ip.to_string() }),
                    )
                    .chain([core::NodeAddress { type_: "Hostname".into(), address: cfg.name.clone() }])
                    .collect(),
            ),
            // Ready from the start; the server stamps lastHeartbeatTime when it posts a heartbeat
            // (a change, or every 5 minutes: the Lease is renewed at each one).
            conditions: Some(vec![core::NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                message: Some("node-agent is posting ready status".into()),
                ..Default::default()
            }]),
            allocatable: Some(capacity.clone()),
            capacity: Some(capacity),
            daemon_endpoints: (cfg.kubelet_port != 0).then(|| core::NodeDaemonEndpoints {
                kubelet_endpoint: Some(core::DaemonEndpoint { port: i32::from(cfg.kubelet_port) }),
            }),
            node_info: Some(core::NodeSystemInfo {
                architecture: facts.architecture.clone(),
                boot_id: facts.boot_id.clone(),
                container_runtime_version: concat!("podpath://", env!("CARGO_PKG_VERSION")).into(),
                kernel_version: facts.kernel_version.clone(),
                kube_proxy_version: VERSION.into(),
                kubelet_version: VERSION.into(),
                machine_id: facts.machine_id.clone(),
                operating_system: "linux".into(),
                os_image: facts.os_image.clone(),
                system_uuid: facts.machine_id.clone(),
                swap: None,
            }),
            ..Default::default()
        }),
    }
}

/// Registers (or re-registers) the node; returns it as stored, with its pod CIDR.
pub async fn register(client: &ApiClient, node: &core::Node) -> Result<core::Node> {
    let mut nodes = client.nodes.clone();
    let resp = nodes
        .register(pb::RegisterNodeRequest { node: Some(to_proto(node)) })
        .await
        .map_err(|status| AgentError::Api { call: "Nodes.Register", status })?;
    from_proto(&resp.into_inner()).map_err(|source| AgentError::Decode { what: "Node", source })
}

/// Posts the Ready condition (True while running, False when stopping).
pub async fn heartbeat(client: &ApiClient, name: &str, ready: bool) -> Result<core::Node> {
    let mut nodes = client.nodes.clone();
    let resp = nodes
        .heartbeat(pb::HeartbeatRequest { name: name.to_string(), conditions: vec![ready_condition(ready)] })
        .await
        .map_err(|status| AgentError::Api { call: "Nodes.Heartbeat", status })?;
    from_proto(&resp.into_inner()).map_err(|source| AgentError::Decode { what: "Node", source })
}

/// Heartbeats every `interval` until `shutdown`, then reports NotReady once. A failed heartbeat
/// is logged and retried at the next tick (after a re-registration if the node is gone).
pub async fn run_heartbeats(
    client: ApiClient,
    node: core::Node,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let name = node.metadata.name.clone().unwrap_or_default();
    let mut tick = tokio::time::interval(interval);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                match heartbeat(&client, &name, true).await {
                    Ok(_) => {}
                    Err(AgentError::Api { status, .. }) if status.code() == tonic::Code::NotFound => {
                        tracing::warn!(node = %name, "the Node was deleted; registering it again");
                        if let Err(e) = register(&client, &node).await {
                            tracing::warn!(node = %name, error = %e, "re-registration failed");
                        }
                    }
                    Err(e) => tracing::warn!(node = %name, error = %e, "heartbeat failed"),
                }
            }
            _ = &mut shutdown => {
                if let Err(e) = heartbeat(&client, &name, false).await {
                    tracing::warn!(node = %name, error = %e, "could not report NotReady");
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_object_has_every_field_clients_require() {
        let facts = HostFacts {
            kernel_version: "6.1".into(),
            os_image: "Debian".into(),
            machine_id: "m".into(),
            boot_id: "b".into(),
            architecture: "amd64".into(),
            cpus: 2,
            memory_kib: 1024,
        };
        let cfg = NodeConfig {
            name: "node-1".into(),
            internal_ips: vec!["192.168.56.11".parse().unwrap()],
            external_ips: vec![],
            max_pods: 110,
            labels: BTreeMap::new(),
            kubelet_port: 10250,
            annotations: BTreeMap::new(),
        };
        let n = node_object(&cfg, &facts);
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v.pointer("/status/daemonEndpoints/kubeletEndpoint/Port"), Some(&serde_json::json!(10250)));
        for f in [
            "architecture",
            "bootID",
            "containerRuntimeVersion",
            "kernelVersion",
            "kubeProxyVersion",
            "kubeletVersion",
            "machineID",
            "operatingSystem",
            "osImage",
            "systemUUID",
        ] {
            assert!(v["status"]["nodeInfo"][f].as_str().is_some_and(|s| !s.is_empty()), "{f}");
        }
        assert_eq!(v["status"]["addresses"][0], serde_json::json!({"type": "InternalIP", "address": "192.168.56.11"}));
        assert_eq!(v["status"]["capacity"]["pods"], "110");
        assert_eq!(v["metadata"]["labels"]["kubernetes.io/hostname"], "node-1");
        assert!(!host_facts().kernel_version.is_empty());
    }
}
