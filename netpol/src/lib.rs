//! The NetworkPolicy enforcer: `networking.k8s.io/v1` NetworkPolicies enforced for the pods
//! of one node, as a CNI's policy agent does (it runs inside the node agent, beside kube-proxy,
//! and reads the API only through `podpath_client`).
//!
//! How: watch caches of pods, namespaces and policies (projections only) → the pure plan ([`render::plan`]) → the difference from the
//! plan last applied, written in the proxy's rule language by a [`PolicyKernel`]: filter-table
//! chains through the proxy's iptables backend ([`IptablesPolicyKernel`], iptables and userspace
//! modes) or the table `ip podpath-policy` through `nft -f` ([`NftPolicyKernel`], nftables
//! mode). The loop ([`run`]) renders on every cache change and rewrites everything when the
//! rules vanished.
//!
//! Why its own crate and the proxy's rule language: it shares no code with kube-proxy — only
//! the rule model and the kernel layer of `podpath_ruleset` — but it writes in the same
//! language as the node's proxy mode (so `podpath trace`, which follows iptables rules through
//! xtables-monitor, names the policy rule that allowed or dropped a packet), and the node agent
//! picks the form from the proxy mode it runs.
//!
//! What it is not: a NetworkPolicy API (validation and defaults are `api::netpol`'s) or a
//! CNI plugin; IPv4 only.

mod error;
pub mod render;

pub use error::{NetpolError, Result};

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use api::k8s_openapi::api::core::v1 as core;
use api::k8s_openapi::api::networking::v1::NetworkPolicy;
use api::netpol::Pod;
use podpath_client::reflector::Store;
use podpath_ruleset::kernel::{missing_jumps, Jump, Kernel};
use podpath_ruleset::nft::{delete_chains, NftFamily, Transaction};
use podpath_ruleset::{Command as RuleCommand, Nft, Ruleset, Table};
use render::Plan;

/// What policies need of a pod: where it is, what it is called and labelled, its named ports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// None: not on the pod network (hostNetwork, or no address yet).
    pub ip: Option<IpAddr>,
    /// Every address (`podIPs`): one per family on a dual-stack node.
    pub ips: Vec<IpAddr>,
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
        let mut ips: Vec<IpAddr> = if host_network {
            vec![]
        } else {
            p.status
                .as_ref()
                .and_then(|s| s.pod_ips.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|i| i.ip.parse().ok())
                .collect()
        };
        if ips.is_empty() {
            ips.extend(ip);
        }
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
            ips: if ended { vec![] } else { ips },
            node: spec.and_then(|s| s.node_name.clone()),
            named_ports,
        }
    }
}

/// A namespace's labels (what namespaceSelectors match).
pub fn namespace_labels(n: &core::Namespace) -> BTreeMap<String, String> {
    n.metadata.labels.clone().unwrap_or_default()
}

/// The pods of the pod network as the policy semantics see them (namespace labels joined),
/// each at its primary address.
pub fn world(pods: &[PodView], namespaces: &BTreeMap<String, BTreeMap<String, String>>) -> Vec<(Pod, Option<String>)> {
    world_of(pods, namespaces, |v| v.ip)
}

/// The pods with an address of one family, each at that address (`v6`: IPv6), for the plan of
/// that family.
pub fn world_family(
    pods: &[PodView],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    v6: bool,
) -> Vec<(Pod, Option<String>)> {
    world_of(pods, namespaces, |v| v.ips.iter().copied().find(|a| a.is_ipv6() == v6))
}

fn world_of(
    pods: &[PodView],
    namespaces: &BTreeMap<String, BTreeMap<String, String>>,
    address: impl Fn(&PodView) -> Option<IpAddr>,
) -> Vec<(Pod, Option<String>)> {
    pods.iter()
        .filter_map(|v| {
            let ip = address(v)?;
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

/// The one place policy rules reach the kernel: the difference between two plans, written in
/// the proxy's rule language.
pub trait PolicyKernel: Send + Sync + 'static {
    /// Brings the kernel from `before` (None: unknown, so everything is written again and
    /// left-overs removed) to `after`; the number of commands sent.
    fn apply(&self, before: Option<&Plan>, after: &Plan) -> Result<usize>;
    /// Whether the rules are still in place (a flush or a deleted table makes the next sync a
    /// full one).
    fn present(&self) -> Result<bool>;
    /// Work deferred to a later `apply` even without changes (stale chains).
    fn pending(&self) -> bool {
        false
    }
}

/// nftables mode: the table `ip podpath-policy`, changed by `nft -f` transactions of
/// differences (elements for membership, chains only where a pod's rules changed).
#[derive(Debug, Default)]
pub struct NftPolicyKernel {
    nft: Nft,
    /// `ip podpath-policy`, or `ip6` for the IPv6 enforcer.
    family: NftFamily,
    /// Chains flushed by an earlier transaction, deleted a second later at the soonest (a map
    /// element may have pointed at them: kube-proxy's rule), and when they were flushed.
    stale: std::sync::Mutex<(Vec<String>, Option<Instant>)>,
}

impl NftPolicyKernel {
    /// The kernel of the enforcer of one family.
    pub fn for_family(v6: bool) -> NftPolicyKernel {
        NftPolicyKernel { family: if v6 { NftFamily::Ip6 } else { NftFamily::Ip }, ..Default::default() }
    }
}

impl PolicyKernel for NftPolicyKernel {
    fn apply(&self, before: Option<&Plan>, after: &Plan) -> Result<usize> {
        let (old, new) = (before.map(render::nft), render::nft(after));
        let (mut tx, flushed) = Transaction::between(old.as_ref(), &new);
        let mut stale = self.stale.lock().unwrap_or_else(|e| e.into_inner());
        if old.is_none() {
            // The table is replaced whole: nothing stale survives.
            stale.0.clear();
        } else if !stale.0.is_empty() && stale.1.is_some_and(|t| t.elapsed() >= Duration::from_secs(1)) {
            tx.ops.extend(delete_chains(self.family, render::TABLE, &stale.0).ops);
            stale.0.clear();
        }
        if tx.is_empty() {
            return Ok(0);
        }
        self.nft.apply(&tx).map_err(|e| net_err("apply the NetworkPolicy table", e))?;
        if !flushed.is_empty() {
            stale.0.extend(flushed);
            stale.1 = Some(Instant::now());
        }
        Ok(tx.len())
    }
    fn present(&self) -> Result<bool> {
        self.nft.has_table(self.family, render::TABLE).map_err(|e| net_err("list the NetworkPolicy table", e))
    }
    fn pending(&self) -> bool {
        !self.stale.lock().unwrap_or_else(|e| e.into_inner()).0.is_empty()
    }
}

/// The jump into the policy chains: first in FORWARD, before kube-proxy's KUBE-FORWARD accepts
/// marked (masqueraded) traffic.
pub const FORWARD_JUMP: Jump = Jump {
    table: "filter",
    from: "FORWARD",
    to: render::IPT_CHAIN,
    first: true,
    new_only: false,
    local_only: false,
    comment: "podpath NetworkPolicy enforcement",
};

/// Whether a filter-table chain is one of the policy chains.
pub fn is_policy_chain(name: &str) -> bool {
    name == render::IPT_CHAIN || name.starts_with("PODPATH-ING-") || name.starts_with("PODPATH-EGR-")
}

/// iptables modes: filter-table chains through the proxy's own kernel (backend, restore),
/// readable in `iptables-save` and shown by `xtables-monitor --trace`.
pub struct IptablesPolicyKernel<K: Kernel> {
    pub kernel: Arc<K>,
}

impl<K: Kernel> PolicyKernel for IptablesPolicyKernel<K> {
    fn apply(&self, before: Option<&Plan>, after: &Plan) -> Result<usize> {
        let new = render::iptables(after);
        let mut out = Table::new("filter");
        let old = match before {
            Some(p) => render::iptables(p),
            None => {
                // Everything is written again; the kernel says which jump is missing and which
                // chains of an earlier run are left over.
                let saved = self.kernel.save("filter", None)?;
                if first_in_forward(&saved) {
                    out.commands.extend(missing_jumps(&[FORWARD_JUMP], "filter", &saved));
                } else {
                    // Present but behind kube-proxy's jumps (each inserts itself first), where
                    // KUBE-FORWARD would accept masqueraded traffic before any policy: moved.
                    let jump = FORWARD_JUMP.rule();
                    for _ in saved.rules().filter(|r| **r == jump) {
                        out.commands.push(RuleCommand::Delete(jump.clone()));
                    }
                    out.commands.push(RuleCommand::Insert { position: 1, rule: jump });
                }
                let mut left = Table::new("filter");
                for c in saved.chains.iter().filter(|c| is_policy_chain(&c.name)) {
                    left.declare(c.name.clone());
                }
                left
            }
        };
        let rules_of = |t: &Table, chain: &str| t.rules().filter(|r| r.chain == chain).cloned().collect::<Vec<_>>();
        for c in &new.chains {
            let rules = rules_of(&new, &c.name);
            if before.is_none() || rules_of(&old, &c.name) != rules {
                out.declare(c.name.clone());
                for r in rules {
                    out.append(r);
                }
            }
        }
        for c in old.chains.iter().filter(|c| !new.declares(&c.name)) {
            out.declare(c.name.clone());
            out.commands.push(RuleCommand::DeleteChain(c.name.clone()));
        }
        if out.chains.is_empty() && out.commands.is_empty() {
            return Ok(0);
        }
        let n = out.commands.len() + out.chains.len();
        self.kernel.restore(&Ruleset { tables: vec![out] })?;
        Ok(n)
    }
    fn present(&self) -> Result<bool> {
        let forward = self.kernel.save("filter", Some("FORWARD"))?;
        Ok(first_in_forward(&forward))
    }
}

/// Whether the first rule of `FORWARD` in `saved` is the jump into the policy chains (first:
/// before kube-proxy's KUBE-FORWARD, which accepts packets marked for masquerade, NodePort
/// traffic from outside among them).
fn first_in_forward(saved: &Table) -> bool {
    saved.rules().find(|r| r.chain == "FORWARD").is_some_and(|r| *r == FORWARD_JUMP.rule())
}

fn net_err(what: &str, source: podpath_ruleset::RulesetError) -> NetpolError {
    NetpolError { what: what.into(), source }
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

/// Removes the policy rules of both forms (`--cleanup`, and at start the form this mode does
/// not use); nothing there, or no `nft`, is fine.
pub fn cleanup(nft_table: bool, iptables: Option<&dyn Kernel>) -> Result<()> {
    let nft = Nft::default();
    for family in [NftFamily::Ip, NftFamily::Ip6] {
        if nft_table && nft.has_table(family, render::TABLE).unwrap_or(false) {
            nft.delete_table(family, render::TABLE).map_err(|e| net_err("delete the NetworkPolicy table", e))?;
        }
    }
    if let Some(k) = iptables {
        let saved = k.save("filter", None)?;
        let rs = podpath_ruleset::kernel::removal(&[FORWARD_JUMP], &[saved], |_, c| is_policy_chain(c));
        if !rs.tables.is_empty() {
            k.restore(&rs)?;
        }
    }
    Ok(())
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
    /// The family this enforcer keeps (IPv6: the pods' IPv6 addresses and IPv6 ipBlocks).
    pub v6: bool,
}

/// What one sync did (for logs and tests).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synced {
    pub commands: usize,
    pub full: bool,
}

/// Keeps the kernel's rules equal to the plan rendered from the caches; `done` (tests and
/// benchmarks) hears of every sync that wrote something.
pub async fn run<K: PolicyKernel>(e: Enforcer<K>, done: Option<tokio::sync::mpsc::UnboundedSender<Synced>>) {
    e.pods.wait_synced().await;
    e.namespaces.wait_synced().await;
    e.policies.wait_synced().await;
    let (mut pods_rx, mut ns_rx, mut pol_rx) = (e.pods.changes(), e.namespaces.changes(), e.policies.changes());
    let mut last: Option<Plan> = None;
    // Often enough to take back the first place in FORWARD soon after kube-proxy's first sync
    // (its jumps insert themselves first), cheap enough to do every two seconds.
    let mut check = tokio::time::interval(e.period.min(Duration::from_secs(2)));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        pods_rx.borrow_and_update();
        ns_rx.borrow_and_update();
        pol_rx.borrow_and_update();
        let plan = current_plan(&e);
        if last.as_ref() != Some(&plan) || e.kernel.pending() {
            let full = last.is_none();
            let (kernel, before, after) = (e.kernel.clone(), last.take(), plan.clone());
            let applied = tokio::task::spawn_blocking(move || kernel.apply(before.as_ref(), &after)).await;
            match applied {
                Ok(Ok(commands)) => {
                    tracing::debug!(commands, full, "NetworkPolicy rules applied");
                    last = Some(plan);
                    if let (Some(d), true) = (&done, commands > 0) {
                        let _ = d.send(Synced { commands, full });
                    }
                }
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "NetworkPolicy rules not applied; the next sync writes them all")
                }
                Err(err) => tracing::warn!(error = %err, "NetworkPolicy sync task failed"),
            }
        }
        let retry = last.is_none() || e.kernel.pending();
        tokio::select! {
            _ = pods_rx.changed() => {}
            _ = ns_rx.changed() => {}
            _ = pol_rx.changed() => {}
            _ = tokio::time::sleep(Duration::from_millis(1100)), if retry => {}
            _ = check.tick() => {
                let kernel = e.kernel.clone();
                if let Ok(Ok(false)) = tokio::task::spawn_blocking(move || kernel.present()).await {
                    tracing::warn!("the NetworkPolicy rules are gone; writing them again");
                    last = None;
                }
            }
        }
    }
}

/// The plan for this node from the caches now.
fn current_plan<K: PolicyKernel>(e: &Enforcer<K>) -> Plan {
    let namespaces: BTreeMap<String, BTreeMap<String, String>> = e.namespaces.entries().into_iter().collect();
    let w = world_family(&e.pods.list(), &namespaces, e.v6);
    let local: std::collections::BTreeSet<(String, String)> = w
        .iter()
        .filter(|(_, n)| n.as_deref() == Some(e.node_name.as_str()))
        .map(|(p, _)| (p.namespace.clone(), p.name.clone()))
        .collect();
    let pods: Vec<Pod> = w.into_iter().map(|(p, _)| p).collect();
    render::plan_family(
        &e.policies.list(),
        &pods,
        &|p: &Pod| local.contains(&(p.namespace.clone(), p.name.clone())),
        e.v6,
    )
}
