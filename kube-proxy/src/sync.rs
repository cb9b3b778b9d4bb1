//! The iptables proxier's sync loop: watch caches → one snapshot → the pure renderer → restores
//! planned by `podpath_ruleset::plan` → the [`Kernel`]. Jump rules from the built-in chains and the
//! canary chains are added on full syncs where `iptables-save` lacks them; a vanished canary
//! (someone deleted the chains) forces one. Nothing is programmed before the first complete list
//! of Services and EndpointSlices.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use podpath_client::reflector::Store;
use podpath_ruleset::plan::{self, Applied};
use podpath_ruleset::Table;

use super::iptables::{render, render_partial, RenderConfig, ServiceState};
use super::model::{ServiceKey, ServiceView, SliceView};
use crate::error::{ProxyError, Result};
use crate::health::Health;
use podpath_ruleset::kernel::{missing_jumps, removal, Jump, Kernel};

/// How often a full sync runs when nothing forces one (kube-proxy's `fullSyncPeriod`); between
/// them, partial syncs and the canary check every sync period.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// How often the kernel's rules are compared with what the proxy wrote (at least: a check
/// that took `t` waits 10 `t`, so a huge table costs at most a tenth of a core).
pub const VERIFY_PERIOD: Duration = Duration::from_secs(3);

/// What differs between the kernel's tables and what the proxy wrote: its chains (gone, or
/// another number of rules) and the jumps into them from the built-in chains. Catches what the
/// canary does not: `iptables -t nat -F` empties every chain, the canary too, without deleting
/// any. Every table written is read (mangle holds only the canary, but a table left unread
/// would read as gone, and be rewritten at every check).
pub fn drift<K: Kernel + ?Sized>(k: &K, cfg: &RenderConfig, applied: &Applied) -> Result<Vec<String>> {
    let saved = TABLES.iter().map(|t| k.save(t, None)).collect::<podpath_ruleset::Result<Vec<_>>>()?;
    let mut out = applied.drift(&saved);
    for t in &saved {
        for cmd in missing_jumps(&jumps(cfg), &t.name, t) {
            let rule = match cmd {
                podpath_ruleset::Command::Insert { rule, .. } | podpath_ruleset::Command::Append(rule) => rule,
                _ => continue,
            };
            out.push(format!("{} jump from {} to {} is gone", t.name, rule.chain, rule.jump_target().unwrap_or("?")));
        }
    }
    Ok(out)
}

/// kube-proxy's liveness canary (an empty chain in mangle, nat and filter).
pub const CANARY: &str = "KUBE-PROXY-CANARY";

const PORTALS: &str = "kubernetes service portals";
const EXTERNAL: &str = "kubernetes externally-visible service portals";
const FIREWALL: &str = "kubernetes load balancer firewall";

/// A jump first in a built-in chain: `[-m conntrack --ctstate NEW] -m comment --comment COMMENT
/// -j TO`.
const fn jump(
    table: &'static str,
    from: &'static str,
    to: &'static str,
    new_only: bool,
    comment: &'static str,
) -> Jump {
    Jump { table, from, to, first: true, new_only, local_only: false, comment }
}

/// Every jump kube-proxy's iptables mode installs, in its order.
pub const JUMPS: &[Jump] = &[
    jump("filter", "INPUT", "KUBE-EXTERNAL-SERVICES", true, EXTERNAL),
    jump("filter", "FORWARD", "KUBE-EXTERNAL-SERVICES", true, EXTERNAL),
    jump("filter", "INPUT", "KUBE-NODEPORTS", false, "kubernetes health check service ports"),
    jump("filter", "FORWARD", "KUBE-SERVICES", true, PORTALS),
    jump("filter", "OUTPUT", "KUBE-SERVICES", true, PORTALS),
    jump("filter", "FORWARD", "KUBE-FORWARD", false, "kubernetes forwarding rules"),
    jump("filter", "INPUT", "KUBE-PROXY-FIREWALL", true, FIREWALL),
    jump("filter", "OUTPUT", "KUBE-PROXY-FIREWALL", true, FIREWALL),
    jump("filter", "FORWARD", "KUBE-PROXY-FIREWALL", true, FIREWALL),
    jump("nat", "OUTPUT", "KUBE-SERVICES", false, PORTALS),
    jump("nat", "PREROUTING", "KUBE-SERVICES", false, PORTALS),
    jump("nat", "POSTROUTING", "KUBE-POSTROUTING", false, "kubernetes postrouting rules"),
];

/// The jumps into `KUBE-FIREWALL` (kubelet's, no comment, first in INPUT and OUTPUT), written
/// when localhost NodePorts are on.
pub const FIREWALL_JUMPS: &[Jump] = &[
    Jump {
        table: "filter",
        from: "INPUT",
        to: "KUBE-FIREWALL",
        first: true,
        new_only: false,
        local_only: false,
        comment: "",
    },
    Jump {
        table: "filter",
        from: "OUTPUT",
        to: "KUBE-FIREWALL",
        first: true,
        new_only: false,
        local_only: false,
        comment: "",
    },
];

/// The jumps a sync with `cfg` keeps in place.
pub fn jumps(cfg: &RenderConfig) -> Vec<Jump> {
    let mut out = JUMPS.to_vec();
    if cfg.localhost_nodeports && !cfg.ipv6() {
        out.extend_from_slice(FIREWALL_JUMPS);
    }
    out
}

/// The tables the proxies write to.
pub const TABLES: [&str; 3] = ["nat", "filter", "mangle"];

/// `--cleanup`: removes every jump, chain and canary the iptables mode ever created, in one
/// restore (kubelet's chains are not ours).
pub fn cleanup<K: Kernel + ?Sized>(k: &K) -> Result<()> {
    let saved = TABLES.iter().map(|t| k.save(t, None)).collect::<podpath_ruleset::Result<Vec<Table>>>()?;
    // KUBE-FIREWALL too: the node agent is this node's kubelet as well as its proxy, so the
    // martian drop and its jumps are ours (a kubelet's own canary and hint chains are not).
    let all: Vec<Jump> = JUMPS.iter().chain(FIREWALL_JUMPS).copied().collect();
    let plan = removal(&all, &saved, |table, c| match table {
        "mangle" => c == CANARY,
        _ => c.starts_with("KUBE-") && !matches!(c, "KUBE-KUBELET-CANARY" | "KUBE-IPTABLES-HINT"),
    });
    if plan.tables.is_empty() {
        return Ok(());
    }
    Ok(k.restore(&plan)?)
}

/// `conntrack` arguments that remove UDP flows a sync made stale (kube-proxy clears them after
/// each sync, since UDP has no connection end): flows DNATed to an endpoint that went away, and
/// flows to a service IP created while it had no endpoints (they would keep being rejected).
pub fn stale_udp_flows(prev: &BTreeMap<ServiceKey, ServiceState>, now: &[ServiceState]) -> Vec<Vec<String>> {
    let mut out = vec![];
    let ips = |st: &ServiceState| -> Vec<String> {
        st.port
            .cluster_ip
            .iter()
            .chain(&st.port.external_ips)
            .chain(&st.port.load_balancer_ips)
            .map(|ip| ip.to_string())
            .collect()
    };
    let s = |x: &str| x.to_string();
    for st in now.iter().filter(|st| st.port.protocol == "udp") {
        let before = prev.get(&st.port.key());
        let had = before.map(|b| !b.endpoints.is_empty()).unwrap_or(false);
        if !had && !st.endpoints.is_empty() {
            for ip in ips(st) {
                out.push(vec![s("-D"), s("-p"), s("udp"), s("--orig-dst"), ip]);
            }
        }
    }
    for (key, old) in prev.iter().filter(|(_, o)| o.port.protocol == "udp") {
        let current = now.iter().find(|st| &st.port.key() == key);
        for ep in &old.endpoints {
            if current.is_some_and(|c| c.endpoints.iter().any(|e| e.ip == ep.ip && e.port == ep.port)) {
                continue;
            }
            for ip in ips(old) {
                out.push(vec![s("-D"), s("-p"), s("udp"), s("--orig-dst"), ip, s("--dst-nat"), ep.ip.to_string()]);
            }
            if let Some(np) = old.port.node_port {
                out.push(vec![
                    s("-D"),
                    s("-p"),
                    s("udp"),
                    s("--dport"),
                    np.to_string(),
                    s("--dst-nat"),
                    ep.ip.to_string(),
                ]);
            }
        }
    }
    out
}

/// One sync. A full one writes every chain, the canaries and the missing jumps from built-in
/// chains (deleting stale chains found with `iptables-save`); a partial one writes the chains of
/// changed services, minus whatever the kernel already holds, and reads nothing from the kernel
/// (at 10,000 Services an `iptables-save` alone costs more than the whole partial sync).
pub fn sync_once<K: Kernel + ?Sized>(
    k: &K,
    cfg: &RenderConfig,
    state: &[ServiceState],
    changed: &BTreeSet<ServiceKey>,
    full: bool,
    applied: &mut Applied,
) -> Result<()> {
    let rs = if full {
        applied.clear();
        let nat = k.save("nat", None)?;
        let filter = k.save("filter", None)?;
        let existing = nat.chains.iter().map(|c| c.name.clone()).collect();
        let mut rs = render(cfg, state, &existing).ruleset;
        for t in rs.tables.iter_mut() {
            let saved = if t.name == "nat" { &nat } else { &filter };
            let jumps = missing_jumps(&jumps(cfg), &t.name, saved);
            t.commands.extend(jumps);
            t.declare(CANARY);
        }
        let mut mangle = Table::new("mangle");
        mangle.declare(CANARY);
        rs.tables.push(mangle);
        rs
    } else {
        let rendered = render_partial(cfg, state, &applied.chains("nat"), changed);
        plan::minimize(&rendered.ruleset, applied)
    };
    // One input (iptables-legacy): the rendered ruleset as it is (regrouping it into batches
    // would only copy every rule); iptables-nft: batches at chain boundaries.
    let write = || -> Result<()> {
        match k.batch_lines() {
            None if rs.tables.is_empty() => Ok(()),
            None => Ok(k.restore(&rs)?),
            Some(_) => Ok(plan::batches(&rs, k.batch_lines()).iter().try_for_each(|b| k.restore(b))?),
        }
    };
    if !full {
        write()?;
        applied.record(&rs);
        return Ok(());
    }
    // What a full sync writes is recorded on the other core while the kernel takes it
    // (45,000 rules at 1,000 Services).
    let (written, recorded) = std::thread::scope(|s| {
        let recorded = s.spawn(|| {
            let mut fresh = Applied::default();
            fresh.record(&rs);
            fresh
        });
        (write(), recorded.join())
    });
    written?;
    *applied = recorded.unwrap_or_else(|_| {
        let mut again = Applied::default();
        again.record(&rs);
        again
    });
    Ok(())
}

pub use super::tracker::snapshot;

/// The proxier: until the stores' watches end, a full sync first, then a sync after every
/// change (at most one per `min_interval`), and a full resync every `period` or when the canary
/// chain is gone.
pub struct Proxier<K> {
    pub kernel: Arc<K>,
    pub render: RenderConfig,
    pub services: Arc<Store<ServiceView>>,
    pub slices: Arc<Store<SliceView>>,
    pub health: Arc<Health>,
    /// Full resync period (kube-proxy's syncPeriod).
    pub period: Duration,
    /// Minimum time between syncs (kube-proxy's minSyncPeriod).
    pub min_interval: Duration,
    /// Where healthCheckNodePort listeners bind (`None`: no listeners).
    pub health_check_bind: Option<std::net::IpAddr>,
}

/// Runs `p` (see [`Proxier`]); `synced` fires after the first successful sync.
pub async fn run_proxier<K: Kernel>(p: Proxier<K>, synced: Option<tokio::sync::oneshot::Sender<()>>) {
    let Proxier { kernel, render: cfg, services, slices, health, period, min_interval, health_check_bind } = p;
    let mut health_servers = health_check_bind.map(|b| super::service_health::HealthServers::new(b, health.clone()));
    services.wait_synced().await;
    slices.wait_synced().await;
    let mut synced = synced;
    let mut full = true;
    let mut svc_changes = services.changes();
    let mut slice_changes = slices.changes();
    let mut last_full = tokio::time::Instant::now();
    // What the kernel holds since the last successful sync (partial syncs compare against it).
    let mut last: BTreeMap<ServiceKey, ServiceState> = BTreeMap::new();
    // The chains the kernel holds (partial syncs leave out the ones that did not change).
    let mut applied = Some(Applied::default());
    let mut verify_every = VERIFY_PERIOD;
    let mut was_large = false;
    loop {
        super::stall::hold().await;
        let started = tokio::time::Instant::now();
        let state = snapshot(&services.list(), &slices.list(), &cfg.node_name);
        let checks = super::service_health::wanted(&state, &cfg.node_name);
        let kernel2 = kernel.clone();
        let cfg2 = cfg.clone();
        let need_full = full;
        let changed: BTreeSet<ServiceKey> =
            state.iter().filter(|st| last.get(&st.port.key()) != Some(*st)).map(|st| st.port.key()).collect();
        // For the debug line below: which Services this sync wrote (timing breakdowns read it).
        let changed_names = tracing::enabled!(tracing::Level::DEBUG)
            .then(|| super::model::names_summary(changed.iter().map(|k| k.name.to_string())));
        let stale = stale_udp_flows(&last, &state);
        // Crossing the large-cluster threshold changes every endpoint rule: a full sync.
        let large = super::iptables::large_cluster(&state);
        let need_full = need_full || large != was_large;
        was_large = large;
        let next: BTreeMap<ServiceKey, ServiceState> = state.iter().map(|st| (st.port.key(), st.clone())).collect();
        let mut held = applied.take().unwrap_or_default();
        let result = tokio::task::spawn_blocking(move || -> (Result<()>, Applied) {
            let r = sync_once(&*kernel2, &cfg2, &state, &changed, need_full, &mut held);
            if r.is_ok() {
                kernel2.clear_conntrack(&stale);
            } else {
                held.clear();
            }
            (r, held)
        })
        .await
        .unwrap_or_else(|e| (Err(ProxyError::Task(format!("sync task failed: {e}"))), Default::default()));
        applied = Some(result.1);
        match result.0 {
            Ok(()) => {
                last = next;
                health.updated();
                health.metrics.synced(need_full, started.elapsed());
                if let Some(a) = &applied {
                    for table in ["filter", "nat"] {
                        health.metrics.iptables_rules(table, a.rule_count(table));
                    }
                }
                if let Some(servers) = health_servers.as_mut() {
                    servers.sync(checks).await;
                }
                if need_full {
                    last_full = tokio::time::Instant::now();
                }
                full = false;
                tracing::debug!(
                    took_ms = started.elapsed().as_millis() as u64,
                    full = need_full,
                    services = changed_names.as_deref().unwrap_or(""),
                    "iptables synced"
                );
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
            }
            Err(e) => {
                tracing::warn!("iptables sync failed (retrying with a full sync): {e}");
                health.metrics.sync_error("iptables");
                full = true;
            }
        }
        tokio::select! {
            r = svc_changes.changed() => { if r.is_err() { return; } health.queued(); }
            r = slice_changes.changed() => { if r.is_err() { return; } health.queued(); }
            _ = tokio::time::sleep(if full { Duration::from_secs(1) } else { period.min(verify_every) }) => {
                // kube-proxy's canary monitor: a deleted table gets a full sync; otherwise a
                // full one only every FULL_SYNC_PERIOD (partial syncs keep health fresh).
                let k = kernel.clone();
                let canary = tokio::task::spawn_blocking(move || k.save("nat", Some(CANARY))).await;
                let present = matches!(canary, Ok(Ok(t)) if t.declares(CANARY));
                if !present || last_full.elapsed() >= FULL_SYNC_PERIOD {
                    full = true;
                } else if let Some(held) = applied.take() {
                    // Beyond the canary: chains emptied or edited in place are rewritten too.
                    let (k, c) = (kernel.clone(), cfg.clone());
                    let t = std::time::Instant::now();
                    let (held, found) = tokio::task::spawn_blocking(move || { let d = drift(&*k, &c, &held); (held, d) })
                        .await
                        .unwrap_or_else(|e| (Applied::default(), Err(ProxyError::Task(e.to_string()))));
                    applied = Some(held);
                    verify_every = VERIFY_PERIOD.max(t.elapsed() * 10);
                    if let Ok(found) = found {
                        if !found.is_empty() {
                            tracing::warn!(changes = %found.join("; "), "the iptables rules were changed from outside the proxy; rewriting them");
                            health.metrics.rules_repaired("iptables");
                            full = true;
                        }
                    }
                }
            }
        }
        // Batch what arrives meanwhile (kube-proxy's minSyncPeriod).
        let wait = min_interval.saturating_sub(started.elapsed());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, ServicePort};

    fn dns(endpoints: &[&str]) -> ServiceState {
        ServiceState {
            port: ServicePort {
                cluster_ip: Some("10.96.0.10".parse().unwrap()),
                node_port: Some(30053),
                ..ServicePort::new("kube-system", "dns", "dns", "udp", 53)
            },
            endpoints: endpoints
                .iter()
                .map(|ip| Endpoint {
                    ip: ip.parse().unwrap(),
                    port: 53,
                    node: None,
                    ready: true,
                    serving: true,
                    terminating: false,
                })
                .collect(),
        }
    }

    fn map(states: &[ServiceState]) -> BTreeMap<ServiceKey, ServiceState> {
        states.iter().map(|s| (s.port.key(), s.clone())).collect()
    }

    #[test]
    fn udp_flows_of_a_removed_endpoint_and_of_a_service_that_got_endpoints() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let gone = stale_udp_flows(&map(&[dns(&["10.244.1.2", "10.244.2.2"])]), &[dns(&["10.244.1.2"])]);
        assert_eq!(
            gone,
            vec![
                v(&["-D", "-p", "udp", "--orig-dst", "10.96.0.10", "--dst-nat", "10.244.2.2"]),
                v(&["-D", "-p", "udp", "--dport", "30053", "--dst-nat", "10.244.2.2"]),
            ]
        );
        let first = stale_udp_flows(&map(&[dns(&[])]), &[dns(&["10.244.1.2"])]);
        assert_eq!(first, vec![v(&["-D", "-p", "udp", "--orig-dst", "10.96.0.10"])]);
        assert!(stale_udp_flows(&map(&[dns(&["10.244.1.2"])]), &[dns(&["10.244.1.2"])]).is_empty());
        let mut tcp = dns(&["10.244.1.2"]);
        tcp.port.protocol = "tcp".into();
        assert!(stale_udp_flows(&map(&[tcp]), &[]).is_empty(), "TCP flows end by themselves");
    }
}
