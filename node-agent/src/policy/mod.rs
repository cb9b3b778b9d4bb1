//! NetworkPolicy enforcement for the pods of this node: watch caches of pods, namespaces and
//! policies (projections only) → the pure renderer ([`render`]) → the difference from what was
//! last applied (`podpath_ruleset::nft::Transaction::between`: elements for membership
//! changes, whole chains only where a pod's rules changed) → `nft -f`, through the same
//! `podpath_ruleset::Nft` as the nftables proxier, in every proxy mode (the filter lives in a
//! table of its own, as kube-network-policies keeps its own next to kube-proxy's).

pub mod render;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::k8s_openapi::api::core::v1 as core;
use api::k8s_openapi::api::networking::v1::NetworkPolicy;
use api::netpol::Pod;
use podpath_client::reflector::Store;
use podpath_ruleset::nft::{delete_chains, NftFamily, NftTable, Transaction};
use podpath_ruleset::Nft;

use crate::error::{AgentError, Result};

/// What policies need of a pod: where it is, what it is called and labelled, its named ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// None: not on the pod network (hostNetwork, or no address yet).
    pub ip: Option<IpAddr>,
    pub node: Option<String>,
    /// Container ports with a name: name, number, protocol.
    pub named_ports: Vec<(String, u16, String)>,
}

impl PodView {
    pub fn of(p: &core::Pod) -> PodView {
        let spec = p.spec.as_ref();
        let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
        let ip = if host_network {
            None
        } else {
            p.status.as_ref().and_then(|s| s.pod_ip.as_deref()).and_then(|i| i.parse().ok())
        };
        // A pod that has ended holds no address any more (kubelet's rule for its IP's reuse).
        let ended = matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let named_ports = spec
            .map(|s| {
                s.containers
                    .iter()
                    .flat_map(|c| c.ports.iter().flatten())
                    .filter_map(|cp| {
                        let name = cp.name.clone()?;
                        let number = u16::try_from(cp.container_port).ok()?;
                        Some((name, number, cp.protocol.clone().unwrap_or_else(|| "TCP".into())))
                    })
                    .collect()
            })
            .unwrap_or_default();
        PodView {
            namespace: p.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: p.metadata.name.clone().unwrap_or_default(),
            labels: p.metadata.labels.clone().unwrap_or_default(),
            ip: ip.filter(|_| !ended),
            node: spec.and_then(|s| s.node_name.clone()),
            named_ports,
        }
    }
}

/// A namespace's labels (what namespaceSelectors match).
pub fn namespace_labels(n: &core::Namespace) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

/// The pods of the pod network as the policy semantics see them (namespace labels joined).
pub fn world(pods: &[PodView], namespaces: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<(Pod, Option<String>)> {
    pods.iter()
        .filter_map(|v| {
            let ip = v.ip?;
            Some((
                Pod {
                    namespace: v.namespace.clone(),
                    name: v.name.clone(),
                    labels: v.labels.clone(),
                    namespace_labels: namespaces.get(&v.namespace).cloned().unwrap_or_default(),
                    ip,
                    named_ports: v.named_ports.clone(),
                },
                v.node.clone(),
            ))
        })
        .collect()
}

/// The one place policy rules reach the kernel.
pub trait PolicyKernel: Send + Sync + 'static {
    fn apply(&self, tx: &Transaction) -> Result<()>;
    fn has_table(&self) -> Result<bool>;
}

/// `nft` in the agent's network namespace.
#[derive(Debug, Default)]
pub struct NftPolicyKernel {
    nft: Nft,
}

impl PolicyKernel for NftPolicyKernel {
    fn apply(&self, tx: &Transaction) -> Result<()> {
        self.nft.apply(tx).map_err(|e| net_err("apply the NetworkPolicy table", e))
    }
    fn has_table(&self) -> Result<bool> {
        self.nft.has_table(NftFamily::Ip, render::TABLE).map_err(|e| net_err("list the NetworkPolicy table", e))
    }
}

fn net_err(what: &str, e: podpath_ruleset::RulesetError) -> AgentError {
    AgentError::Network { what: what.into(), source: Box::new(e) }
}

/// Whether the `nft` command runs here.
pub fn nft_available() -> bool {
    std::process::Command::new("nft")
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Deletes the policy table (`--cleanup`); no table, or no `nft`, is fine.
pub fn cleanup() {
    let nft = Nft::default();
    if nft.has_table(NftFamily::Ip, render::TABLE).unwrap_or(false) {
        if let Err(e) = nft.delete_table(NftFamily::Ip, render::TABLE) {
            tracing::warn!(error = %e, "cannot delete the NetworkPolicy table");
        }
    }
}

/// The enforcer's inputs.
pub struct Enforcer<K: PolicyKernel> {
    pub kernel: Arc<K>,
    pub node_name: String,
    pub pods: Arc<Store<PodView>>,
    pub namespaces: Arc<Store<BTreeMap<String, String>>>,
    pub policies: Arc<Store<NetworkPolicy>>,
    /// How often the table's presence is checked when nothing changes.
    pub period: Duration,
}

/// What one sync did (for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    pub commands: usize,
    pub full: bool,
}

/// Keeps the kernel's table equal to the rendering of the caches; `done` (tests) hears of every
/// sync.
pub async fn run<K: PolicyKernel>(e: Enforcer<K>, done: Option<tokio::sync::mpsc::UnboundedSender<Synced>>) {
    e.pods.wait_synced().await;
    e.namespaces.wait_synced().await;
    e.policies.wait_synced().await;
    let (mut pods_rx, mut ns_rx, mut pol_rx) = (e.pods.changes(), e.namespaces.changes(), e.policies.changes());
    let mut last: Option<NftTable> = None;
    let mut stale: Vec<String> = vec![];
    let mut stale_since = Instant::now();
    let mut check = tokio::time::interval(e.period);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        pods_rx.borrow_and_update();
        ns_rx.borrow_and_update();
        pol_rx.borrow_and_update();
        let table = {
            let namespaces: BTreeMap<String, BTreeMap<String, String>> = e.namespaces.entries().into_iter().collect();
            let w = world(&e.pods.list(), &namespaces);
            let pods: Vec<Pod> = w.iter().map(|(p, _)| p.clone()).collect();
            let local: std::collections::BTreeSet<(String, String)> = w
                .iter()
                .filter(|(_, n)| n.as_deref() == Some(e.node_name.as_str()))
                .map(|(p, _)| (p.namespace.clone(), p.name.clone()))
                .collect();
            render::render(&e.policies.list(), &pods, &|p: &Pod| local.contains(&(p.namespace.clone(), p.name.clone())))
        };
        let (mut tx, new_stale) = Transaction::between(last.as_ref(), &table);
        // Chains flushed by an earlier sync are deleted a second later at the soonest: a map
        // element may still have pointed at them (kube-proxy's rule).
        if !stale.is_empty() && stale_since.elapsed() >= Duration::from_secs(1) {
            let del = delete_chains(NftFamily::Ip, render::TABLE, &stale);
            tx.ops.extend(del.ops);
            stale.clear();
        }
        if !tx.is_empty() {
            let full = last.is_none();
            let kernel = e.kernel.clone();
            let applied = tokio::task::spawn_blocking(move || kernel.apply(&tx).map(|_| tx.len())).await;
            match applied {
                Ok(Ok(commands)) => {
                    tracing::debug!(commands, full, "NetworkPolicy rules applied");
                    stale.extend(new_stale);
                    stale_since = Instant::now();
                    last = Some(table);
                    if let Some(d) = &done {
                        let _ = d.send(Synced { commands, full });
                    }
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "NetworkPolicy rules not applied; the next sync replaces the table");
                    last = None;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "NetworkPolicy sync task failed");
                    last = None;
                }
            }
        }
        let wait_stale = !stale.is_empty();
        tokio::select! {
            _ = pods_rx.changed() => {}
            _ = ns_rx.changed() => {}
            _ = pol_rx.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(1100)), if wait_stale => {}
            _ = check.tick() => {
                // Someone deleted the table: write it whole again.
                let kernel = e.kernel.clone();
                if let Ok(Ok(false)) = tokio::task::spawn_blocking(move || kernel.has_table()).await {
                    tracing::warn!("the NetworkPolicy table is gone; writing it again");
                    last = None;
                }
            }
        }
    }
}
