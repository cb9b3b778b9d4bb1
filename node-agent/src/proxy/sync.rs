//! The iptables proxier's sync loop: watch caches → one snapshot → the pure renderer → one
//! atomic `iptables-restore --noflush`. Jump rules from the built-in chains and the canary
//! chains are ensured on full syncs; a vanished canary (someone flushed the tables) forces one.
//! Nothing is programmed before the first complete list of Services and EndpointSlices.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use podpath_client::reflector::Store;

use super::iptables::{render, render_partial, service_key, RenderConfig, ServiceState};
use super::model;
use super::restore;
use crate::error::{AgentError, Result};
use crate::health::Health;

/// How often a full sync runs when nothing forces one (kube-proxy's `fullSyncPeriod`); between
/// them, partial syncs and the canary check every sync period.
pub const FULL_SYNC_PERIOD: Duration = Duration::from_secs(3600);

/// kube-proxy's liveness canary (an empty chain in mangle, nat and filter).
pub const CANARY: &str = "KUBE-PROXY-CANARY";

/// A jump rule from a built-in chain into one of ours (kube-proxy's `iptablesJumpChains`):
/// `[-m conntrack --ctstate NEW] -m comment --comment COMMENT -j TO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jump {
    pub table: &'static str,
    pub from: &'static str,
    pub to: &'static str,
    /// Only new connections (`-m conntrack --ctstate NEW`).
    pub new_only: bool,
    pub comment: &'static str,
}

const fn jump(
    table: &'static str,
    from: &'static str,
    to: &'static str,
    new_only: bool,
    comment: &'static str,
) -> Jump {
    Jump { table, from, to, new_only, comment }
}

const PORTALS: &str = "kubernetes service portals";
const EXTERNAL: &str = "kubernetes externally-visible service portals";
const FIREWALL: &str = "kubernetes load balancer firewall";

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

/// The iptables commands the proxier runs (real binaries, or a fake in tests).
pub trait Iptables: Send + Sync + 'static {
    /// `iptables-restore --noflush` of a whole input.
    fn restore(&self, text: &str) -> Result<()>;
    /// `iptables-save -t TABLE`.
    fn save(&self, table: &str) -> Result<String>;
    /// Chain names of a table.
    fn chains(&self, table: &str) -> Result<BTreeSet<String>> {
        Ok(saved_chains(&self.save(table)?))
    }
    /// Creates a chain if missing.
    fn ensure_chain(&self, table: &str, chain: &str) -> Result<()>;
    /// Inserts a rule at the top of a chain unless present (`-C`, then `-I 1`).
    fn ensure_rule_first(&self, table: &str, chain: &str, rule: &[&str]) -> Result<()>;
    /// Appends a rule to a chain unless present (`-C`, then `-A`).
    fn ensure_rule_last(&self, table: &str, chain: &str, rule: &[&str]) -> Result<()>;
    /// Deletes a rule if present.
    fn delete_rule(&self, table: &str, chain: &str, rule: &[&str]) -> Result<()>;
    /// Flushes and deletes a chain if present.
    fn delete_chain(&self, table: &str, chain: &str) -> Result<()>;
    /// Largest restore input (in lines) worth sending at once; `None`: any size (see
    /// [`super::restore`]).
    fn batch_lines(&self) -> Option<usize> {
        None
    }
    /// Whether a chain exists (the canary check).
    fn has_chain(&self, table: &str, chain: &str) -> Result<bool> {
        Ok(self.chains(table)?.contains(chain))
    }
}

/// Which iptables implementation writes the rules. Never both in one namespace: the kernel
/// would evaluate both rulesets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `iptables-nft` (nf_tables). The default: the distributions' `iptables` is this one, so a
    /// user's `iptables-save` in a node shows our rules; netfilter traces of a namespace are read
    /// in that namespace (`xtables-monitor --trace`); and a sync after one endpoint change takes
    /// milliseconds even at 10,000 Services. Its weak point, restores of tens of thousands of
    /// lines, is handled by batching (see [`super::restore`]).
    Nft,
    /// `iptables-legacy` (x_tables): every restore replaces the whole table, atomically, so a
    /// full sync is faster but even a one-endpoint change costs time proportional to the table.
    Legacy,
}

impl Backend {
    pub fn parse(s: &str) -> std::result::Result<Backend, String> {
        match s {
            "nft" => Ok(Backend::Nft),
            "legacy" => Ok(Backend::Legacy),
            other => Err(format!("iptables backend {other:?}: expected nft or legacy")),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Legacy => "legacy",
        }
    }
    /// `iptables`, `iptables-save` or `iptables-restore` of this backend.
    fn tool(self, base: &str) -> String {
        match base.split_once('-') {
            Some((head, tail)) => format!("{head}-{}-{tail}", self.name()),
            None => format!("{base}-{}", self.name()),
        }
    }
}

/// Whether the *other* backend holds kube-proxy chains in this namespace (a proxy started with
/// the other backend before, and not cleaned up). Looked up without side effects: legacy tables
/// of a namespace are listed in `/proc/net/ip_tables_names` once they exist.
pub fn other_backend_in_use(backend: Backend) -> bool {
    match backend {
        Backend::Nft => {
            let names = std::fs::read_to_string("/proc/net/ip_tables_names").unwrap_or_default();
            names.lines().any(|t| t == "nat")
                && run(&["iptables-legacy-save", "-t", "nat"], None).is_ok_and(|out| out.contains(CANARY))
        }
        Backend::Legacy => run(&["iptables-nft-save", "-t", "nat"], None).is_ok_and(|out| out.contains(CANARY)),
    }
}

/// The real `iptables`, `iptables-save` and `iptables-restore` of one backend, in the current
/// namespace.
#[derive(Debug, Clone, Copy)]
pub struct IptablesCmd {
    pub backend: Backend,
}

fn run(args: &[&str], stdin: Option<&str>) -> std::result::Result<String, String> {
    let mut cmd = Command::new(args[0]);
    cmd.args(&args[1..]).stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", args[0]))?;
    if let Some(text) = stdin {
        let mut input = child.stdin.take().expect("piped");
        input.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

fn ipt_err(what: String, msg: String) -> AgentError {
    AgentError::Network { what, source: msg.into() }
}

impl Iptables for IptablesCmd {
    fn restore(&self, text: &str) -> Result<()> {
        let tool = self.backend.tool("iptables-restore");
        run(&[&tool, "--noflush", "-w", "5"], Some(text)).map(|_| ()).map_err(|e| ipt_err(tool.clone(), e))
    }
    fn save(&self, table: &str) -> Result<String> {
        let tool = self.backend.tool("iptables-save");
        run(&[&tool, "-t", table], None).map_err(|e| ipt_err(format!("{tool} -t {table}"), e))
    }
    fn ensure_chain(&self, table: &str, chain: &str) -> Result<()> {
        let ipt = self.backend.tool("iptables");
        if run(&[&ipt, "-w", "5", "-t", table, "-S", chain], None).is_ok() {
            return Ok(());
        }
        run(&[&ipt, "-w", "5", "-t", table, "-N", chain], None)
            .map(|_| ())
            .map_err(|e| ipt_err(format!("create chain {chain} in {table}"), e))
    }
    fn ensure_rule_first(&self, table: &str, chain: &str, rule: &[&str]) -> Result<()> {
        let ipt = self.backend.tool("iptables");
        let mut check = vec![ipt.as_str(), "-w", "5", "-t", table, "-C", chain];
        check.extend_from_slice(rule);
        if run(&check, None).is_ok() {
            return Ok(());
        }
        let mut insert = vec![ipt.as_str(), "-w", "5", "-t", table, "-I", chain, "1"];
        insert.extend_from_slice(rule);
        run(&insert, None).map(|_| ()).map_err(|e| ipt_err(format!("insert a jump into {table} {chain}"), e))
    }
    fn ensure_rule_last(&self, table: &str, chain: &str, rule: &[&str]) -> Result<()> {
        let ipt = self.backend.tool("iptables");
        let mut check = vec![ipt.as_str(), "-w", "5", "-t", table, "-C", chain];
        check.extend_from_slice(rule);
        if run(&check, None).is_ok() {
            return Ok(());
        }
        let mut append = vec![ipt.as_str(), "-w", "5", "-t", table, "-A", chain];
        append.extend_from_slice(rule);
        run(&append, None).map(|_| ()).map_err(|e| ipt_err(format!("append a jump to {table} {chain}"), e))
    }
    fn delete_rule(&self, table: &str, chain: &str, rule: &[&str]) -> Result<()> {
        let ipt = self.backend.tool("iptables");
        let mut del = vec![ipt.as_str(), "-w", "5", "-t", table, "-D", chain];
        del.extend_from_slice(rule);
        while run(&del, None).is_ok() {}
        Ok(())
    }
    fn delete_chain(&self, table: &str, chain: &str) -> Result<()> {
        let ipt = self.backend.tool("iptables");
        if run(&[&ipt, "-w", "5", "-t", table, "-S", chain], None).is_err() {
            return Ok(());
        }
        run(&[&ipt, "-w", "5", "-t", table, "-F", chain], None).map_err(|e| ipt_err(format!("flush {chain}"), e))?;
        run(&[&ipt, "-w", "5", "-t", table, "-X", chain], None)
            .map(|_| ())
            .map_err(|e| ipt_err(format!("delete {chain}"), e))
    }
    fn has_chain(&self, table: &str, chain: &str) -> Result<bool> {
        Ok(run(&[&self.backend.tool("iptables"), "-w", "5", "-t", table, "-S", chain], None).is_ok())
    }
    fn batch_lines(&self) -> Option<usize> {
        match self.backend {
            Backend::Nft => Some(NFT_BATCH_LINES),
            Backend::Legacy => None,
        }
    }
}

/// iptables-nft restore batch size: 2,000-line batches took 1.3 s for 1,000 Services × 10
/// endpoints where one 47,000-line restore took 5 s (benches/proxy.rs); smaller batches add
/// process starts without gaining more.
pub const NFT_BATCH_LINES: usize = 2000;

/// Whether `MASQUERADE --random-fully` is available (iptables ≥ 1.6.2).
pub fn iptables_supports_random_fully() -> bool {
    let Ok(v) = run(&["iptables", "--version"], None) else { return false };
    let ver = v.split_whitespace().find(|w| w.starts_with('v')).unwrap_or("v0").trim_start_matches('v');
    let mut p = ver.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
    (p.next().unwrap_or(0), p.next().unwrap_or(0), p.next().unwrap_or(0)) >= (1, 6, 2)
}

/// The chains declared in `iptables-save` output.
pub fn saved_chains(saved: &str) -> BTreeSet<String> {
    saved.lines().filter_map(|l| l.strip_prefix(':')?.split_whitespace().next().map(str::to_string)).collect()
}

/// A rule's words as `iptables-save` prints them (words with spaces quoted).
fn as_saved(words: &[&str]) -> String {
    words.iter().map(|w| if w.contains(' ') { format!("\"{w}\"") } else { w.to_string() }).collect::<Vec<_>>().join(" ")
}

/// The `-I FROM 1 …` lines of the jumps of `table` that `saved` (its `iptables-save`) lacks —
/// written in the full sync's own restore, so that a full sync costs one `iptables-save` per
/// table and one restore instead of dozens of `iptables -C/-I` runs.
pub fn missing_jumps(table: &str, saved: &str) -> Vec<String> {
    JUMPS
        .iter()
        .filter(|j| j.table == table)
        .filter(|j| {
            let line = format!("-A {} {}", j.from, as_saved(&jump_rule(j)));
            !saved.lines().any(|l| l == line)
        })
        .map(|j| format!("-I {} 1 {}", j.from, as_saved(&jump_rule(j))))
        .collect()
}

fn jump_rule(j: &Jump) -> Vec<&'static str> {
    let mut r: Vec<&str> = if j.new_only { vec!["-m", "conntrack", "--ctstate", "NEW"] } else { vec![] };
    r.extend_from_slice(&["-m", "comment", "--comment", j.comment]);
    r.extend_from_slice(&["-j", j.to]);
    r
}

/// Creates our top-level chains, the jumps into them (first in each built-in chain) and the
/// canaries.
pub fn ensure_jumps<I: Iptables + ?Sized>(ipt: &I) -> Result<()> {
    for j in JUMPS {
        ipt.ensure_chain(j.table, j.to)?;
        ipt.ensure_rule_first(j.table, j.from, &jump_rule(j))?;
    }
    for table in ["mangle", "nat", "filter"] {
        ipt.ensure_chain(table, CANARY)?;
    }
    Ok(())
}

/// `--cleanup`: removes every jump, chain and canary the proxier ever created. The chains go in
/// one restore per table (declaring a chain flushes it, so chains that jump to each other can
/// all be deleted at once).
pub fn cleanup<I: Iptables + ?Sized>(ipt: &I) -> Result<()> {
    for j in JUMPS {
        ipt.delete_rule(j.table, j.from, &jump_rule(j))?;
    }
    let mut text = String::new();
    for table in ["nat", "filter"] {
        // kubelet's chains are not ours.
        let ours: Vec<String> = ipt
            .chains(table)?
            .into_iter()
            .filter(|c| {
                c.starts_with("KUBE-")
                    && !matches!(c.as_str(), "KUBE-KUBELET-CANARY" | "KUBE-FIREWALL" | "KUBE-IPTABLES-HINT")
            })
            .collect();
        if ours.is_empty() {
            continue;
        }
        text.push_str(&format!("*{table}\n"));
        for c in &ours {
            text.push_str(&format!(":{c} - [0:0]\n"));
        }
        for c in &ours {
            text.push_str(&format!("-X {c}\n"));
        }
        text.push_str("COMMIT\n");
    }
    if !text.is_empty() {
        ipt.restore(&text)?;
    }
    ipt.delete_chain("mangle", CANARY)
}

/// `conntrack` arguments that remove UDP flows a sync made stale (kube-proxy clears them after
/// each sync, since UDP has no connection end): flows DNATed to an endpoint that went away, and
/// flows to a service IP created while it had no endpoints (they would keep being rejected).
pub fn stale_udp_flows(prev: &BTreeMap<String, ServiceState>, now: &[ServiceState]) -> Vec<Vec<String>> {
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
        let before = prev.get(&service_key(&st.port));
        let had = before.map(|b| !b.endpoints.is_empty()).unwrap_or(false);
        if !had && !st.endpoints.is_empty() {
            for ip in ips(st) {
                out.push(vec![s("-D"), s("-p"), s("udp"), s("--orig-dst"), ip]);
            }
        }
    }
    for (key, old) in prev.iter().filter(|(_, o)| o.port.protocol == "udp") {
        let current = now.iter().find(|st| &service_key(&st.port) == key);
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

/// Runs `conntrack` with each argument list ("no entries" is not an error).
fn flush_conntrack(deletes: &[Vec<String>]) {
    for args in deletes {
        match Command::new("conntrack").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status() {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("cannot run conntrack to clear stale UDP flows ({e}); install the conntrack package");
                return;
            }
        }
    }
}

/// One sync. A full one writes every chain, the canaries and the missing jumps from built-in
/// chains (deleting stale chains found with `iptables-save`); a partial one writes the chains of changed services, minus whatever the
/// kernel already holds, and runs no other iptables command (at 10,000 Services an
/// `iptables-save` alone costs more than the whole partial sync).
pub fn sync_once<I: Iptables + ?Sized>(
    ipt: &I,
    cfg: &RenderConfig,
    state: &[ServiceState],
    changed: &BTreeSet<String>,
    full: bool,
    applied: &mut restore::Applied,
) -> Result<()> {
    let tables = if full {
        applied.clear();
        let nat = ipt.save("nat")?;
        let filter = ipt.save("filter")?;
        let mut tables = restore::parse(&render(cfg, state, &saved_chains(&nat)).text);
        for t in tables.iter_mut() {
            let saved = if t.name == "nat" { &nat } else { &filter };
            t.inserts = missing_jumps(&t.name, saved);
            t.chains.push(restore::ChainBlock { name: CANARY.into(), rules: vec![] });
        }
        tables.push(restore::TableInput {
            name: "mangle".into(),
            chains: vec![restore::ChainBlock { name: CANARY.into(), rules: vec![] }],
            ..Default::default()
        });
        tables
    } else {
        let rendered = render_partial(cfg, state, &applied.chains("nat"), changed);
        restore::minimize(&restore::parse(&rendered.text), applied)
    };
    for batch in restore::batches(&tables, ipt.batch_lines()) {
        ipt.restore(&batch)?;
    }
    applied.record(&tables);
    Ok(())
}

/// The snapshot the renderer takes: every service port with its endpoints.
pub fn snapshot(services: &[core::Service], slices: &[discovery::EndpointSlice]) -> Vec<ServiceState> {
    let mut out = vec![];
    for s in services {
        for port in model::service_ports(s) {
            let endpoints = model::endpoints(&port, slices);
            out.push(ServiceState { port, endpoints });
        }
    }
    out
}

/// The proxier: until the stores' watches end, a full sync first, then a sync after every
/// change (at most one per `min_interval`), and a full resync every `period` or when the canary
/// chain is gone.
pub struct Proxier<I> {
    pub ipt: Arc<I>,
    pub render: RenderConfig,
    pub services: Arc<Store<core::Service>>,
    pub slices: Arc<Store<discovery::EndpointSlice>>,
    pub health: Arc<Health>,
    /// Full resync period (kube-proxy's syncPeriod).
    pub period: Duration,
    /// Minimum time between syncs (kube-proxy's minSyncPeriod).
    pub min_interval: Duration,
    /// Where healthCheckNodePort listeners bind (`None`: no listeners).
    pub health_check_bind: Option<std::net::IpAddr>,
}

/// Runs `p` (see [`Proxier`]); `synced` fires after the first successful sync.
pub async fn run_proxier<I: Iptables>(p: Proxier<I>, synced: Option<tokio::sync::oneshot::Sender<()>>) {
    let Proxier { ipt, render: cfg, services, slices, health, period, min_interval, health_check_bind } = p;
    let mut health_servers = health_check_bind.map(|b| super::service_health::HealthServers::new(b, health.clone()));
    services.wait_synced().await;
    slices.wait_synced().await;
    let mut synced = synced;
    let mut full = true;
    let mut svc_changes = services.changes();
    let mut slice_changes = slices.changes();
    let mut last_full = tokio::time::Instant::now();
    // What the kernel holds since the last successful sync (partial syncs compare against it).
    let mut last: BTreeMap<String, ServiceState> = BTreeMap::new();
    // The chains the kernel holds (partial syncs leave out the ones that did not change).
    let mut applied = Some(restore::Applied::default());
    loop {
        let started = tokio::time::Instant::now();
        let state = snapshot(&services.list(), &slices.list());
        let checks = super::service_health::wanted(&state, &cfg.node_name);
        let ipt2 = ipt.clone();
        let cfg2 = cfg.clone();
        let need_full = full;
        let changed: BTreeSet<String> = state
            .iter()
            .filter(|st| last.get(&service_key(&st.port)) != Some(*st))
            .map(|st| service_key(&st.port))
            .collect();
        let stale = stale_udp_flows(&last, &state);
        let next: BTreeMap<String, ServiceState> = state.iter().map(|st| (service_key(&st.port), st.clone())).collect();
        let mut held = applied.take().unwrap_or_default();
        let result = tokio::task::spawn_blocking(move || -> (Result<()>, restore::Applied) {
            let r = sync_once(&*ipt2, &cfg2, &state, &changed, need_full, &mut held);
            if r.is_ok() {
                flush_conntrack(&stale);
            } else {
                held.clear();
            }
            (r, held)
        })
        .await
        .unwrap_or_else(|e| (Err(AgentError::Process(format!("sync task failed: {e}"))), Default::default()));
        applied = Some(result.1);
        match result.0 {
            Ok(()) => {
                last = next;
                health.updated();
                if let Some(servers) = health_servers.as_mut() {
                    servers.sync(checks).await;
                }
                if need_full {
                    last_full = tokio::time::Instant::now();
                }
                full = false;
                tracing::debug!(took_ms = started.elapsed().as_millis() as u64, full = need_full, "iptables synced");
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
            _ = tokio::time::sleep(if full { Duration::from_secs(1) } else { period }) => {
                // kube-proxy's canary monitor: a flushed table gets a full sync; otherwise a
                // full one only every FULL_SYNC_PERIOD (partial syncs keep health fresh).
                let ipt = ipt.clone();
                let canary = tokio::task::spawn_blocking(move || ipt.has_chain("nat", CANARY)).await;
                if !matches!(canary, Ok(Ok(true))) || last_full.elapsed() >= FULL_SYNC_PERIOD {
                    full = true;
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
    use crate::proxy::model::{Endpoint, ServicePort};

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

    fn map(states: &[ServiceState]) -> BTreeMap<String, ServiceState> {
        states.iter().map(|s| (service_key(&s.port), s.clone())).collect()
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
