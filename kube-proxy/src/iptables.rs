//! kube-proxy's iptables mode, rendered purely from one snapshot into the ruleset model
//! (reference/kube-proxy.md §1.1–1.4: chain layout, names, rule shapes, comments). Printed, the
//! ruleset is the `iptables-restore` input kube-proxy would write, byte for byte.
//!
//! One function per chain kind: the entry points of a service port in the shared chains
//! (`entries`), its `KUBE-SVC`/`KUBE-SVL` masquerade rule, `KUBE-EXT`, `KUBE-FW`, the endpoint
//! choice and the `KUBE-SEP` chains; [`render`] assembles them with the fixed chains.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use podpath_ruleset::{Addr, Command, MarkOp, Match, RecentOp, Rule, Ruleset, Table, Target};

use super::model::{Categorized, Endpoint, ServiceKey, ServicePort};
use super::names;

/// `1 << masqueradeBit` with kube-proxy's default bit 14.
pub const MASQ_MARK: u32 = 0x4000;

/// Settings that shape the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderConfig {
    pub node_name: String,
    pub node_ips: Vec<IpAddr>,
    /// `--cluster-cidr`: traffic from elsewhere to a ClusterIP is masqueraded.
    pub cluster_cidr: Option<IpNet>,
    /// Lab knob (`--masquerade=false`): leave out the masquerade of external traffic, to show
    /// why scenario 4 breaks without it.
    pub masquerade_external: bool,
    /// `MASQUERADE --random-fully` (iptables ≥ 1.6.2).
    pub random_fully: bool,
    /// kube-proxy's `--iptables-localhost-nodeports` (default true): NodePorts answer on
    /// 127.0.0.1 too (with `route_localnet`, and `KUBE-FIREWALL` dropping martian localnet
    /// packets from outside); false excludes `127.0.0.0/8` from the jump to `KUBE-NODEPORTS`.
    pub localhost_nodeports: bool,
}

impl RenderConfig {
    /// The family of this proxier (its node addresses'): `ip6tables` rules when IPv6.
    pub fn ipv6(&self) -> bool {
        self.node_ips.first().is_some_and(IpAddr::is_ipv6)
    }

    /// kube-proxy's defaults for the node `node_name` at `node_ip`: the lab's pod network
    /// 10.244.0.0/16 as `--cluster-cidr`, external traffic masqueraded, `--random-fully`,
    /// localhost NodePorts. Fields are public to change.
    pub fn new(node_name: &str, node_ip: IpAddr) -> RenderConfig {
        RenderConfig {
            node_name: node_name.into(),
            node_ips: vec![node_ip],
            cluster_cidr: Some("10.244.0.0/16".parse().expect("constant")),
            masquerade_external: true,
            random_fully: true,
            localhost_nodeports: true,
        }
    }
}

/// One service port and its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceState {
    pub port: ServicePort,
    pub endpoints: Vec<Endpoint>,
}

/// Above this many endpoints (all service ports together), kube-proxy's large-cluster mode.
pub const LARGE_CLUSTER_ENDPOINTS: usize = 1000;

/// Whether these service ports make a large cluster (kube-proxy's `largeClusterMode`).
pub fn large_cluster(services: &[ServiceState]) -> bool {
    services.iter().map(|s| s.endpoints.len()).sum::<usize>() > LARGE_CLUSTER_ENDPOINTS
}

/// Probability of rule `i` of `n` (kube-proxy: `1/(n-i)`, printed as `%0.10f`).
pub fn probability(i: usize, n: usize) -> f64 {
    1.0 / (n - i) as f64
}

/// The rendered tables and the nat chains they own (for stale-chain cleanup next time).
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub ruleset: Ruleset,
    pub nat_chains: BTreeSet<String>,
}

/// The filter and nat chains kube-proxy always writes, in its order.
pub const FILTER_CHAINS: [&str; 5] =
    ["KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL"];
pub const NAT_CHAINS: [&str; 4] = ["KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING"];

/// kubelet's martian-drop chain, which kube-proxy writes too when localhost NodePorts are on.
pub const FIREWALL_CHAIN: &str = "KUBE-FIREWALL";
const LOCALNET: &str = "127.0.0.0/8";

/// Renders filter then nat. `existing_nat_chains` are the chains the kernel holds now: those
/// of ours that are no longer used are flushed and deleted in the same restore.
pub fn render(cfg: &RenderConfig, services: &[ServiceState], existing_nat_chains: &BTreeSet<String>) -> Rendered {
    render_inner(cfg, services, existing_nat_chains, None)
}

/// A partial sync (kube-proxy's MinimizeIPTablesRestore): the top-level chains in full, but
/// the per-service chains only of the service ports in `changed`; the others are not mentioned,
/// so `iptables-restore --noflush` leaves them as they are.
pub fn render_partial(
    cfg: &RenderConfig,
    services: &[ServiceState],
    existing_nat_chains: &BTreeSet<String>,
    changed: &BTreeSet<ServiceKey>,
) -> Rendered {
    render_inner(cfg, services, existing_nat_chains, Some(changed))
}

/// The rules of every service port, gathered per place they go, in the order they are written.
#[derive(Default)]
struct Parts {
    filter_nodeports: Vec<Rule>,
    filter_services: Vec<Rule>,
    filter_external: Vec<Rule>,
    filter_firewall: Vec<Rule>,
    nat_nodeports: Vec<Rule>,
    nat_services: Vec<Rule>,
    /// Per-service nat chains written this time, in kube-proxy's order, and their rules.
    nat_chains: Vec<String>,
    nat_rules: Vec<Rule>,
    /// Per-service chains left as they are (partial sync): still ours, not stale.
    kept: Vec<String>,
}

/// What the rules of one service port depend on, worked out once.
struct Port<'a> {
    eps: Categorized<'a>,
    svc_chain: String,
    svl_chain: String,
    ext_chain: String,
    fw_chain: String,
    /// kube-proxy's large-cluster mode: endpoint rules carry no comment.
    large: bool,
}

/// The port's categorised endpoints and their questions, straight on the port.
impl<'a> std::ops::Deref for Port<'a> {
    type Target = Categorized<'a>;
    fn deref(&self) -> &Categorized<'a> {
        &self.eps
    }
}

impl<'a> Port<'a> {
    fn new(cfg: &RenderConfig, st: &'a ServiceState) -> Port<'a> {
        let eps = Categorized::new(&st.port, &st.endpoints, &cfg.node_name);
        let hash = names::service_hash(&eps.spn, &st.port.protocol);
        Port {
            eps,
            svc_chain: format!("KUBE-SVC-{hash}"),
            svl_chain: format!("KUBE-SVL-{hash}"),
            ext_chain: format!("KUBE-EXT-{hash}"),
            fw_chain: format!("KUBE-FW-{hash}"),
            large: false,
        }
    }
    /// `-m comment` on an endpoint rule, unless the cluster is large (kube-proxy drops those
    /// comments above 1,000 endpoints: they are 40 % of the table's size).
    fn endpoint_comment(&self, r: Rule, text: impl Into<String>) -> Rule {
        if self.large {
            r
        } else {
            r.comment(text)
        }
    }
    fn internal_chain(&self) -> &str {
        if self.sp.internal_policy_local {
            &self.svl_chain
        } else {
            &self.svc_chain
        }
    }
    fn external_policy_chain(&self) -> &str {
        if self.sp.external_policy_local {
            &self.svl_chain
        } else {
            &self.svc_chain
        }
    }
    /// Where load-balancer IPs lead: the firewall chain when source ranges are set.
    fn lb_chain(&self) -> &str {
        if self.sp.source_ranges.is_empty() {
            &self.ext_chain
        } else {
            &self.fw_chain
        }
    }
    /// REJECT (no endpoints at all) or DROP (none on this node), with its comment.
    fn no_endpoints(&self) -> (&'static str, String) {
        if self.has_endpoints() {
            ("DROP", format!("{} has no local endpoints", self.spn))
        } else {
            ("REJECT", format!("{} has no endpoints", self.spn))
        }
    }
    /// `-A CHAIN <comment> -m P -p P -d IP --dport PORT -j TARGET`: one service address.
    fn to(&self, chain: &str, text: &str, ip: &IpAddr, target: &str) -> Rule {
        Rule::new(chain).comment(text).proto(&self.sp.protocol).dst(Addr::Host(*ip)).dport(self.sp.port).jump(target)
    }
    /// `-A CHAIN <comment> -m P -p P [--dst-type LOCAL] --dport PORT -j TARGET`: a node port.
    fn node_port(&self, chain: &str, text: &str, port: u16, local_only: bool, target: &str) -> Rule {
        let r = Rule::new(chain).comment(text);
        let r = if local_only { r.dst_type("LOCAL") } else { r };
        r.proto(&self.sp.protocol).dport(port).jump(target)
    }
    fn sep_chain(&self, e: &Endpoint) -> String {
        names::endpoint_chain(&self.spn, &self.sp.protocol, &e.addr())
    }
    /// The endpoints a service chain picks from: (chain, endpoints) for SVC and SVL in use.
    fn picking(&self) -> Vec<(&str, &[Endpoint])> {
        let mut out: Vec<(&str, &[Endpoint])> = vec![];
        if self.uses_cluster() {
            out.push((&self.svc_chain, &self.cluster_eps));
        }
        if self.uses_local() {
            out.push((&self.svl_chain, &self.local_eps));
        }
        out
    }
}

/// A service port's entry points in the shared chains: `KUBE-SERVICES` (ClusterIP, external
/// and load-balancer IPs), `KUBE-NODEPORTS`, and the filter chains that reject or drop what has
/// no endpoints and what a source range does not allow.
fn entries(p: &Port<'_>, out: &mut Parts) {
    let sp = p.sp;
    let spn = &p.spn;
    let (no_eps_target, no_eps_comment) = p.no_endpoints();
    if let Some(cip) = &sp.cluster_ip {
        if p.has_internal() {
            out.nat_services.push(p.to("KUBE-SERVICES", &format!("{spn} cluster IP"), cip, p.internal_chain()));
        } else {
            out.filter_services.push(p.to("KUBE-SERVICES", &no_eps_comment, cip, no_eps_target));
        }
    }
    // External destinations go to the EXT chain whenever there are endpoints: with
    // externalTrafficPolicy Local and none on this node, EXT still short-circuits pod and node
    // traffic to the cluster endpoints, and what it does not DNAT is dropped in filter.
    for eip in &sp.external_ips {
        if p.has_endpoints() {
            out.nat_services.push(p.to("KUBE-SERVICES", &format!("{spn} external IP"), eip, &p.ext_chain));
        }
        if !p.has_external() {
            out.filter_external.push(p.to("KUBE-EXTERNAL-SERVICES", &no_eps_comment, eip, no_eps_target));
        }
    }
    for lip in &sp.load_balancer_ips {
        if p.has_endpoints() {
            out.nat_services.push(p.to("KUBE-SERVICES", &format!("{spn} loadbalancer IP"), lip, p.lb_chain()));
            if !sp.source_ranges.is_empty() {
                let text = format!("{spn} traffic not accepted by {}", p.fw_chain);
                out.filter_firewall.push(p.to("KUBE-PROXY-FIREWALL", &text, lip, "DROP"));
            }
        }
    }
    if !p.has_external() {
        for lip in &sp.load_balancer_ips {
            out.filter_external.push(p.to("KUBE-EXTERNAL-SERVICES", &no_eps_comment, lip, no_eps_target));
        }
    }
    if let Some(np) = sp.node_port {
        if p.has_endpoints() {
            out.nat_nodeports.push(p.node_port("KUBE-NODEPORTS", spn, np, false, &p.ext_chain));
        }
        if !p.has_external() {
            out.filter_external.push(p.node_port("KUBE-EXTERNAL-SERVICES", &no_eps_comment, np, true, no_eps_target));
        }
    }
    if let Some(hc) = sp.health_check_node_port {
        let rule = Rule::new("KUBE-NODEPORTS").comment(format!("{spn} health check node port")).proto("tcp");
        out.filter_nodeports.push(rule.dport(hc).jump("ACCEPT"));
    }
}

/// The per-service nat chains in use, in kube-proxy's order of declaration.
fn service_chains(p: &Port<'_>) -> Vec<String> {
    let mut chains = vec![];
    chains.extend(p.uses_cluster().then(|| p.svc_chain.clone()));
    chains.extend(p.uses_local().then(|| p.svl_chain.clone()));
    chains.extend(p.uses_ext().then(|| p.ext_chain.clone()));
    chains.extend(p.uses_fw().then(|| p.fw_chain.clone()));
    chains
}

/// The `KUBE-SEP` chains in use (each endpoint once, even when both SVC and SVL pick it).
fn used_endpoints(p: &Port<'_>) -> BTreeSet<Endpoint> {
    p.picking().into_iter().flat_map(|(_, eps)| eps.iter().cloned()).collect()
}

/// Off-cluster clients of the ClusterIP are masqueraded: the first rule of its chain.
fn cluster_ip_masquerade(cfg: &RenderConfig, p: &Port<'_>, out: &mut Vec<Rule>) {
    let (Some(cip), true, Some(cidr)) = (&p.sp.cluster_ip, p.has_internal(), &cfg.cluster_cidr) else { return };
    let rule = Rule::new(p.internal_chain())
        .comment(format!("{} cluster IP", p.spn))
        .proto(&p.sp.protocol)
        .dst(Addr::Host(*cip))
        .dport(p.sp.port)
        .not_src(Addr::Net(*cidr));
    out.push(rule.jump("KUBE-MARK-MASQ"));
}

/// `KUBE-EXT`: masquerade external traffic (or, with externalTrafficPolicy Local, send pod and
/// node traffic the cluster-wide way), then pick an endpoint by the external policy.
fn ext_chain(cfg: &RenderConfig, p: &Port<'_>, out: &mut Vec<Rule>) {
    if !p.uses_ext() {
        return;
    }
    let (spn, ext) = (&p.spn, p.ext_chain.as_str());
    if !p.sp.external_policy_local {
        if cfg.masquerade_external {
            let text = format!("masquerade traffic for {spn} external destinations");
            out.push(Rule::new(ext).comment(text).jump("KUBE-MARK-MASQ"));
        }
    } else {
        if let Some(cidr) = &cfg.cluster_cidr {
            let text = format!("pod traffic for {spn} external destinations");
            out.push(Rule::new(ext).comment(text).src(Addr::Net(*cidr)).jump(&p.svc_chain));
        }
        let text = format!("masquerade LOCAL traffic for {spn} external destinations");
        out.push(Rule::new(ext).comment(text).src_type("LOCAL").jump("KUBE-MARK-MASQ"));
        let text = format!("route LOCAL traffic for {spn} external destinations");
        out.push(Rule::new(ext).comment(text).src_type("LOCAL").jump(&p.svc_chain));
    }
    if p.has_external() {
        out.push(Rule::new(ext).jump(p.external_policy_chain()));
    }
}

/// `KUBE-FW`: load-balancer traffic from the allowed source ranges goes on to `KUBE-EXT`; the
/// rest falls through (and `KUBE-PROXY-FIREWALL` drops it in filter).
fn fw_chain(cfg: &RenderConfig, p: &Port<'_>, out: &mut Vec<Rule>) {
    if !p.uses_fw() {
        return;
    }
    let (spn, fw, ext) = (&p.spn, p.fw_chain.as_str(), p.ext_chain.as_str());
    for range in &p.sp.source_ranges {
        out.push(Rule::new(fw).comment(format!("{spn} loadbalancer IP")).src(Addr::Net(*range)).jump(ext));
    }
    // VIP-style LBs: the node itself sends with the LB IP as source.
    if p.sp.source_ranges.iter().any(|r| cfg.node_ips.iter().any(|ip| r.contains(ip))) {
        for lip in &p.sp.load_balancer_ips {
            out.push(Rule::new(fw).comment(format!("{spn} loadbalancer IP")).src(Addr::Host(*lip)).jump(ext));
        }
    }
    out.push(Rule::new(fw).comment(format!("other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL")));
}

/// `KUBE-SVC`/`KUBE-SVL`: affinity first (a client seen recently goes back to its endpoint),
/// then each endpoint with kube-proxy's chained probabilities (1/n, 1/(n-1), …, the rest).
fn endpoint_choice(p: &Port<'_>, out: &mut Vec<Rule>) {
    for (chain, eps) in p.picking() {
        let with_sep: Vec<(String, &Endpoint)> = eps.iter().map(|e| (p.sep_chain(e), e)).collect();
        if let Some(secs) = p.sp.affinity_seconds {
            for (sep, e) in &with_sep {
                let recent = Match::Recent {
                    name: sep.clone(),
                    op: RecentOp::Check { seconds: u32::try_from(secs).ok(), reap: true },
                    extra: vec![],
                };
                let r = p.endpoint_comment(Rule::new(chain), format!("{} -> {}", p.spn, e.addr()));
                out.push(r.with(recent).jump(sep));
            }
        }
        let n = with_sep.len();
        for (i, (sep, e)) in with_sep.iter().enumerate() {
            let rule = p.endpoint_comment(Rule::new(chain), format!("{} -> {}", p.spn, e.addr()));
            let rule = if i + 1 < n { rule.with(Match::Probability(probability(i, n))) } else { rule };
            out.push(rule.jump(sep));
        }
    }
}

/// `KUBE-SEP`: hairpin traffic (the endpoint reaching itself) is masqueraded, then DNAT (and the
/// affinity list noted).
fn endpoint_chains(p: &Port<'_>, out: &mut Vec<Rule>) {
    for e in used_endpoints(p) {
        let sep = p.sep_chain(&e);
        out.push(p.endpoint_comment(Rule::new(&sep), &p.spn).src(Addr::Host(e.ip)).jump("KUBE-MARK-MASQ"));
        let mut dnat = p.endpoint_comment(Rule::new(&sep), &p.spn);
        if p.sp.affinity_seconds.is_some() {
            dnat = dnat.with(Match::Recent { name: sep.clone(), op: RecentOp::Set, extra: vec![] });
        }
        out.push(dnat.proto(&p.sp.protocol).target(Target::Dnat { to: e.addr() }));
    }
}

/// Everything of one service port.
fn service_port(cfg: &RenderConfig, st: &ServiceState, emit: bool, large: bool, out: &mut Parts) {
    let p = Port { large, ..Port::new(cfg, st) };
    entries(&p, out);
    if !p.has_endpoints() {
        return;
    }
    if !emit {
        // Unchanged since the last sync: its chains stay as they are in the kernel; only their
        // names are needed (so they are not taken for stale ones).
        out.kept.extend(service_chains(&p));
        out.kept.extend(used_endpoints(&p).iter().map(|e| p.sep_chain(e)).collect::<BTreeSet<_>>());
        return;
    }
    out.nat_chains.extend(service_chains(&p));
    out.nat_chains.extend(used_endpoints(&p).iter().map(|e| p.sep_chain(e)));
    let rules = &mut out.nat_rules;
    cluster_ip_masquerade(cfg, &p, rules);
    ext_chain(cfg, &p, rules);
    fw_chain(cfg, &p, rules);
    endpoint_choice(&p, rules);
    endpoint_chains(&p, rules);
}

/// The fixed filter table with the service ports' rules.
fn filter_table(cfg: &RenderConfig, parts: &mut Parts) -> Table {
    let mut t = Table::new("filter");
    for c in FILTER_CHAINS {
        t.declare(c);
    }
    // IPv6 has no route_localnet: no localhost NodePorts and no martians to drop.
    if cfg.localhost_nodeports && !cfg.ipv6() {
        // route_localnet lets 127.0.0.1 NodePorts work, and lets martian localnet packets in
        // from outside too (https://issue.k8s.io/90259): those are dropped here.
        t.declare(FIREWALL_CHAIN);
        t.append(
            Rule::new(FIREWALL_CHAIN)
                .comment("block incoming localnet connections")
                .with(Match::Destination { addr: Addr::Net(LOCALNET.parse().expect("constant")), negated: false })
                .with(Match::Source { addr: Addr::Net(LOCALNET.parse().expect("constant")), negated: true })
                .with(Match::ConnState {
                    states: vec!["RELATED".into(), "ESTABLISHED".into(), "DNAT".into()],
                    negated: true,
                })
                .jump("DROP"),
        );
    }
    let rules = std::mem::take(&mut parts.filter_nodeports)
        .into_iter()
        .chain(std::mem::take(&mut parts.filter_services))
        .chain(std::mem::take(&mut parts.filter_external))
        .chain([
            Rule::new("KUBE-FORWARD").ct_state(&["INVALID"]).jump("DROP"),
            Rule::new("KUBE-FORWARD")
                .comment("kubernetes forwarding rules")
                .with(Match::Mark { value: MASQ_MARK, mask: Some(MASQ_MARK), negated: false })
                .jump("ACCEPT"),
            Rule::new("KUBE-FORWARD")
                .comment("kubernetes forwarding conntrack rule")
                .ct_state(&["RELATED", "ESTABLISHED"])
                .jump("ACCEPT"),
        ])
        .chain(std::mem::take(&mut parts.filter_firewall));
    for r in rules {
        t.append(r);
    }
    t
}

/// The nat table: fixed chains, the service ports' chains, stale chains emptied and deleted.
fn nat_table(cfg: &RenderConfig, parts: Parts, existing: &BTreeSet<String>) -> (Table, BTreeSet<String>) {
    let mut t = Table::new("nat");
    for c in NAT_CHAINS {
        t.declare(c);
    }
    let active: BTreeSet<String> = parts.nat_chains.iter().chain(&parts.kept).cloned().collect();
    for c in &parts.nat_chains {
        t.declare(c.clone());
    }
    let stale: Vec<&String> = existing.iter().filter(|c| names::is_service_chain(c) && !active.contains(*c)).collect();
    for c in &stale {
        t.declare(c.to_string());
    }
    for r in parts.nat_nodeports.into_iter().chain(parts.nat_services) {
        t.append(r);
    }
    let last = Rule::new("KUBE-SERVICES")
        .comment("kubernetes service nodeports; NOTE: this must be the last rule in this chain")
        .dst_type("LOCAL");
    // As kube-proxy: localhost NodePorts never work for IPv6, and for IPv4 only with them on.
    let last = if cfg.ipv6() {
        last.with(Match::Destination { addr: Addr::Net("::1/128".parse().expect("constant")), negated: true })
    } else if cfg.localhost_nodeports {
        last
    } else {
        last.with(Match::Destination { addr: Addr::Net("127.0.0.0/8".parse().expect("constant")), negated: true })
    };
    t.append(last.jump("KUBE-NODEPORTS"));
    t.append(Rule::new("KUBE-MARK-MASQ").target(Target::Mark(MarkOp::Or(MASQ_MARK))));
    t.append(
        Rule::new("KUBE-POSTROUTING")
            .with(Match::Mark { value: MASQ_MARK, mask: Some(MASQ_MARK), negated: true })
            .jump("RETURN"),
    );
    t.append(Rule::new("KUBE-POSTROUTING").target(Target::Mark(MarkOp::Xor(MASQ_MARK))));
    t.append(
        Rule::new("KUBE-POSTROUTING")
            .comment("kubernetes service traffic requiring SNAT")
            .target(Target::Masquerade { random_fully: cfg.random_fully }),
    );
    for r in parts.nat_rules {
        t.append(r);
    }
    for c in stale {
        t.commands.push(Command::DeleteChain(c.clone()));
    }
    (t, active)
}

fn render_inner(
    cfg: &RenderConfig,
    services: &[ServiceState],
    existing_nat_chains: &BTreeSet<String>,
    only: Option<&BTreeSet<ServiceKey>>,
) -> Rendered {
    let mut sorted: Vec<&ServiceState> = services.iter().collect();
    // In the order of the printed names (kube-proxy's goldens), not of their fields.
    sorted.sort_by_cached_key(|s| (s.port.spn().to_string(), s.port.protocol.clone()));
    let mut parts = Parts::default();
    let large = large_cluster(services);
    for st in sorted {
        let emit = only.is_none_or(|set| set.contains(&st.port.key()));
        service_port(cfg, st, emit, large, &mut parts);
    }
    let filter = filter_table(cfg, &mut parts);
    let (nat, nat_chains) = nat_table(cfg, parts, existing_nat_chains);
    Rendered { ruleset: Ruleset { tables: vec![filter, nat] }, nat_chains }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn ep(ip: &str, port: u16, node: &str) -> Endpoint {
        Endpoint {
            ip: ip.parse().unwrap(),
            port,
            node: Some(node.into()),
            ready: true,
            serving: true,
            terminating: false,
        }
    }

    fn sp(ns: &str, name: &str, port_name: &str, proto: &str, cip: &str, port: u16) -> ServicePort {
        ServicePort { cluster_ip: Some(cip.parse().unwrap()), ..ServicePort::new(ns, name, port_name, proto, port) }
    }

    fn cfg() -> RenderConfig {
        RenderConfig::new("node-1", "192.168.56.11".parse().unwrap())
    }

    /// Every feature in one ruleset, compared whole with a file reviewed rule by rule against
    /// kube-proxy's shapes (reference/kube-proxy.md §1.4).
    pub(crate) fn services() -> Vec<ServiceState> {
        let svc1 = sp("ns1", "svc1", "p80", "tcp", "10.96.0.41", 80);
        let mut svc2 = sp("ns2", "svc2", "", "tcp", "10.96.0.42", 80);
        svc2.node_port = Some(30080);
        svc2.load_balancer_ips = vec!["198.51.100.7".parse().unwrap()];
        svc2.external_policy_local = true;
        svc2.health_check_node_port = Some(32000);
        let svc3 = sp("ns3", "svc3", "dns", "udp", "10.96.0.43", 53);
        let mut svc4 = sp("ns4", "svc4", "", "tcp", "10.96.0.44", 80);
        svc4.external_ips = vec!["169.10.10.1".parse().unwrap()];
        svc4.affinity_seconds = Some(10800);
        let mut svc5 = sp("ns5", "svc5", "p80", "tcp", "10.96.0.45", 80);
        svc5.node_port = Some(30005);
        svc5.load_balancer_ips = vec!["198.51.100.8".parse().unwrap()];
        svc5.source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
        let mut svc6 = sp("ns6", "svc6", "", "tcp", "10.96.0.46", 80);
        svc6.internal_policy_local = true;
        vec![
            ServiceState {
                port: svc1,
                endpoints: vec![ep("10.244.1.5", 8080, "node-1"), ep("10.244.2.5", 8080, "node-2")],
            },
            ServiceState { port: svc2, endpoints: vec![ep("10.244.2.6", 8080, "node-2")] },
            ServiceState { port: svc3, endpoints: vec![] },
            ServiceState { port: svc4, endpoints: vec![ep("10.244.1.7", 80, "node-1")] },
            ServiceState {
                port: svc5,
                endpoints: vec![
                    ep("10.244.1.8", 80, "node-1"),
                    ep("10.244.2.8", 80, "node-2"),
                    ep("10.244.3.8", 80, "node-3"),
                ],
            },
            ServiceState {
                port: svc6,
                endpoints: vec![ep("10.244.1.9", 80, "node-1"), ep("10.244.2.9", 80, "node-2")],
            },
        ]
    }

    #[test]
    fn whole_ruleset_golden() {
        let existing: BTreeSet<String> =
            ["KUBE-SEP-STALESTALESTALE", "KUBE-SERVICES", "OTHER-CHAIN"].map(String::from).into();
        let out = render(&cfg(), &services(), &existing);
        let text = out.ruleset.to_string();
        let golden = include_str!("testdata/golden.rules");
        if text != golden {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/proxy/testdata/golden.rules.new");
            std::fs::write(path, &text).unwrap();
            panic!("the ruleset differs from testdata/golden.rules; the new one is in {path}");
        }
        assert!(out.nat_chains.contains("KUBE-SVC-XPGD46QRK7WJZT7O"));
        assert!(!out.nat_chains.contains("KUBE-SEP-STALESTALESTALE"));
        assert_eq!(podpath_ruleset::lint::lint(&out.ruleset, TOP_LEVEL), Vec::<String>::new());
    }

    /// Chains reached from built-in chains, or always written (kube-proxy's layout).
    const TOP_LEVEL: &[&str] = &[
        "KUBE-SERVICES",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-FORWARD",
        "KUBE-PROXY-FIREWALL",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
        "KUBE-FIREWALL",
    ];

    #[test]
    fn every_single_service_renders_without_lint_problems() {
        // Each service of the golden set alone, with and without endpoints: no dangling,
        // empty or unused chain in any combination.
        for st in services() {
            for eps in [st.endpoints.clone(), vec![]] {
                let one = ServiceState { port: st.port.clone(), endpoints: eps };
                let out = render(&cfg(), &[one], &BTreeSet::new());
                assert_eq!(
                    podpath_ruleset::lint::lint(&out.ruleset, TOP_LEVEL),
                    Vec::<String>::new(),
                    "{}",
                    st.port.spn()
                );
            }
        }
    }

    #[test]
    fn a_partial_sync_rewrites_only_the_changed_services_chains() {
        let all = services();
        let full = render(&cfg(), &all, &BTreeSet::new());
        let changed: BTreeSet<ServiceKey> = [all[0].port.key()].into();
        let part = render_partial(&cfg(), &all, &full.nat_chains, &changed);
        let (full_text, part_text) = (full.ruleset.to_string(), part.ruleset.to_string());
        assert_eq!(part.nat_chains, full.nat_chains, "unchanged chains stay active (not stale)");
        assert!(part_text.contains(":KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]"));
        assert!(part_text.contains("-A KUBE-SVC-XPGD46QRK7WJZT7O "));
        assert!(!part_text.contains("KUBE-SVC-NUKIZ6OKUXPJNT4C -"), "svc5's chain is not touched");
        // The top-level chains are complete either way.
        let top = |t: &str| {
            t.lines().filter(|l| l.starts_with("-A KUBE-SERVICES") || l.starts_with("-A KUBE-NODEPORTS")).count()
        };
        assert_eq!(top(&part_text), top(&full_text));
        assert!(!part_text.contains("-X "), "nothing is stale");
    }

    #[test]
    fn probabilities_are_kube_proxys() {
        let printed = |i, n| Rule::new("X").with(Match::Probability(probability(i, n))).to_string();
        assert_eq!(printed(0, 2), "-A X -m statistic --mode random --probability 0.5000000000");
        assert_eq!(printed(0, 3), "-A X -m statistic --mode random --probability 0.3333333333");
        assert_eq!(printed(1, 3), "-A X -m statistic --mode random --probability 0.5000000000");
    }

    #[test]
    fn masquerade_knob_removes_only_the_external_masquerade() {
        let mut c = cfg();
        c.masquerade_external = false;
        let out = render(&c, &services(), &BTreeSet::new()).ruleset.to_string();
        assert!(!out.contains("masquerade traffic for"));
        assert!(out.contains("! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"), "the ClusterIP masquerade stays");
    }

    /// Above 1,000 endpoints, endpoint rules lose their comments (kube-proxy's large-cluster
    /// mode); at 1,000 they keep them.
    #[test]
    fn large_clusters_drop_endpoint_comments() {
        let eps = |n: usize| -> Vec<Endpoint> {
            (0..n).map(|i| ep(&format!("10.244.{}.{}", i / 250, i % 250 + 1), 8080, "node-2")).collect()
        };
        for (n, large) in [(1000, false), (1001, true)] {
            let st = ServiceState { port: sp("ns1", "big", "", "tcp", "10.96.0.50", 80), endpoints: eps(n) };
            let text = render(&cfg(), &[st], &BTreeSet::new()).ruleset.to_string();
            let sep_dnat = text.lines().find(|l| l.starts_with("-A KUBE-SEP-") && l.contains("DNAT")).unwrap();
            let svc_jump = text.lines().find(|l| l.starts_with("-A KUBE-SVC-") && l.contains("-j KUBE-SEP-")).unwrap();
            assert_eq!(!sep_dnat.contains("--comment"), large, "{n}: {sep_dnat}");
            assert_eq!(!svc_jump.contains("--comment"), large, "{n}: {svc_jump}");
            // The Service's own rules keep theirs.
            assert!(text.contains("--comment \"ns1/big cluster IP\""), "{n}");
        }
    }

    /// Localhost NodePorts: on (kube-proxy's default), the martian drop in KUBE-FIREWALL; off,
    /// the jump to KUBE-NODEPORTS leaves out 127.0.0.0/8.
    #[test]
    fn localhost_nodeports_on_and_off() {
        let on = render(&cfg(), &services(), &BTreeSet::new()).ruleset.to_string();
        assert!(on.contains("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n"), "{on}");
        assert!(on.contains("-A KUBE-FIREWALL -m comment --comment \"block incoming localnet connections\" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP\n"));
        let off = RenderConfig { localhost_nodeports: false, ..cfg() };
        let off = render(&off, &services(), &BTreeSet::new()).ruleset.to_string();
        assert!(off.contains("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS\n"), "{off}");
        assert!(!off.contains("KUBE-FIREWALL"));
    }
}
