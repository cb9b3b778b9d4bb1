//! kube-proxy's nftables mode, rendered purely from one snapshot into the nftables model
//! (`podpath_ruleset::nft`), after reference/kube-proxy-nftables.md: the table `ip kube-proxy`,
//! its base chains, sets and verdict maps, and per service port the chains and elements of the
//! current layout (v1.36+: one `numgen … map` DNAT rule per Service, masquerade marks inline,
//! a `hairpin-connections` set) or of v1.34 (`--nftables-layout v1.34`: per-endpoint chains and
//! `mark-for-masquerade`), or podpath's own layout for scale (`--nftables-layout shared-maps`:
//! a Service with the common features is map elements only — see [`Layout::SharedMaps`]). The
//! transaction between two renders is the sync (`nft::Transaction`).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ipnet::IpNet;
use podpath_ruleset::nft::{Chain, Element, NftFamily, NftTable, Set};
use sha2::{Digest, Sha256};

use super::iptables::{RenderConfig, ServiceState};
use super::model::{Categorized, Endpoint, Family, ServicePort};

/// The table kube-proxy owns (one per IP family).
pub const TABLE: &str = "kube-proxy";
/// Printed by kube-proxy with Go's `%#08x`.
pub const MASQ_MARK: &str = "0x00004000";

/// Which generation of kube-proxy's nftables rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// v1.36 and later.
    #[default]
    Current,
    /// v1.34–v1.35: per-endpoint chains, a `mark-for-masquerade` chain.
    V134,
    /// Not kube-proxy's (the idea of an open upstream proposal): every endpoint is an element of
    /// one shared map `endpoints` keyed by the Service address, protocol, port and an index, and
    /// one DNAT rule per endpoint count (chain `lb-N`) looks the packet's own key and `numgen
    /// random mod N` up in it. A Service port whose policies are Cluster, without session
    /// affinity or source ranges, is then only elements: a cold load is element inserts and an
    /// endpoint change a handful of elements. Other Service ports get the current layout's chains.
    SharedMaps,
}

impl Layout {
    /// The layouts that write the current generation's fixed part (hairpin set, inline marks).
    fn is_current(self) -> bool {
        matches!(self, Layout::Current | Layout::SharedMaps)
    }
}

impl std::str::FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Layout, String> {
        match s {
            "current" | "v1.36" => Ok(Layout::Current),
            "v1.34" => Ok(Layout::V134),
            "shared-maps" => Ok(Layout::SharedMaps),
            other => Err(format!("nftables layout {other:?}: expected current (v1.36), v1.34 or shared-maps")),
        }
    }
}

/// The nftables mode's own settings, beside the iptables mode's [`RenderConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NftConfig {
    pub layout: Layout,
    /// The Service CIDRs: addresses in them that no Service holds are dropped.
    pub service_cidrs: Vec<IpNet>,
}

/// kube-proxy's nftables chain hash: the first 8 characters of base32(sha256(base)).
pub fn hash8(base: &str) -> String {
    data_encoding::BASE32.encode(&Sha256::digest(base.as_bytes()))[..8].to_string()
}

/// `<ns>/<svc>/<proto>/<portName>` (the port name may be empty).
pub fn service_base(sp: &ServicePort) -> String {
    format!("{}/{}/{}/{}", sp.id.namespace, sp.id.name, sp.protocol, sp.id.port)
}

/// `<service base>__<ip>/<port>`, IPv6 colons as dots.
pub fn endpoint_base(sp: &ServicePort, e: &Endpoint) -> String {
    format!("{}__{}/{}", service_base(sp), e.ip.to_string().replace(':', "."), e.port)
}

/// `<prefix><hash>-<base>`, cut to 240 characters with `...` as knftables allows.
fn name(prefix: &str, base: &str) -> String {
    let mut n = format!("{}-{base}", hash8(base));
    if n.len() > 240 {
        n.truncate(237);
        n.push_str("...");
    }
    format!("{prefix}{n}")
}

/// A chain name of a service port (`service-`, `local-`, `external-`, `firewall-`).
pub fn service_chain(prefix: &str, sp: &ServicePort) -> String {
    name(prefix, &service_base(sp))
}

/// `endpoint-…` of one endpoint.
pub fn endpoint_chain(sp: &ServicePort, e: &Endpoint) -> String {
    name("endpoint-", &endpoint_base(sp, e))
}

/// `affinity-…`: the set of clients stuck to one endpoint.
pub fn affinity_set(sp: &ServicePort, e: &Endpoint) -> String {
    name("affinity-", &endpoint_base(sp, e))
}

/// Whether a chain is one a sync made per Service (kube-proxy tells them by a `/`).
pub fn is_service_chain(name: &str) -> bool {
    name.contains('/')
}

const NO_ENDPOINT_HELP: &str = "helper for @no-endpoint-services / @no-endpoint-nodeports";

/// The fixed part: base chains and their jumps, sets and maps, the fixed chains.
fn fixed(cfg: &RenderConfig, nft: &NftConfig) -> NftTable {
    let mut t = NftTable::new(NftFamily::Ip, TABLE);
    t.comment = Some("rules for kube-proxy".into());
    let new = |to: &str| format!("ct state new jump {to}");
    for c in [
        Chain::base("filter-prerouting-pre-dnat", "filter", "prerouting", -110).rule(new("firewall-check")),
        Chain::base("filter-output-pre-dnat", "filter", "output", -110).rule(new("firewall-check")),
        Chain::base("filter-input", "filter", "input", 0)
            .rule(new("nodeport-endpoints-check"))
            .rule(new("service-endpoints-check")),
        Chain::base("filter-forward", "filter", "forward", 0)
            .rule(new("service-endpoints-check"))
            .rule(new("cluster-ips-check")),
        Chain::base("filter-output", "filter", "output", 0)
            .rule(new("service-endpoints-check"))
            .rule(new("cluster-ips-check")),
        Chain::base("nat-prerouting", "nat", "prerouting", -100).rule("jump services"),
        Chain::base("nat-output", "nat", "output", -100).rule("jump services"),
        Chain::base("nat-postrouting", "nat", "postrouting", 100).rule("jump masquerading"),
    ] {
        t.add_chain(c);
    }
    let tuple = "ipv4_addr . inet_proto . inet_service";
    t.sets.push(Set::plain("cluster-ips", "ipv4_addr").with_comment("Active ClusterIPs"));
    t.sets.push(Set::plain("nodeport-ips", "ipv4_addr").with_comment("IPs that accept NodePort traffic"));
    if nft.layout.is_current() {
        t.sets.push(
            Set::plain("hairpin-connections", "ipv4_addr . ipv4_addr . inet_proto . inet_service")
                .with_comment("service hairpin connections"),
        );
    }
    t.sets.push(
        Set::map("service-ips", tuple, "verdict").with_comment("ClusterIP, ExternalIP and LoadBalancer IP traffic"),
    );
    t.sets.push(Set::map("service-nodeports", "inet_proto . inet_service", "verdict").with_comment("NodePort traffic"));
    t.sets.push(
        Set::map("no-endpoint-services", tuple, "verdict")
            .with_comment("vmap to drop or reject packets to services with no endpoints"),
    );
    t.sets.push(
        Set::map("no-endpoint-nodeports", "inet_proto . inet_service", "verdict")
            .with_comment("vmap to drop or reject packets to service nodeports with no endpoints"),
    );
    t.sets.push(
        Set::map("firewall-ips", tuple, "verdict")
            .with_comment("destinations that are subject to LoadBalancerSourceRanges"),
    );
    if nft.layout == Layout::SharedMaps {
        // `typeof` (numgen has no type name); `tcp dport` stands for any port: only the field's
        // type and size count, and nft 1.0.6 cannot read a `th dport` key back from the kernel
        // ("conflicting protocols"), which breaks every later transaction.
        t.sets.push(
            Set::map_of(
                "endpoints",
                "ip daddr . meta l4proto . tcp dport . numgen random mod 1",
                "ip daddr . tcp dport",
            )
            .with_comment("Service address . protocol . port . endpoint index : endpoint"),
        );
    }
    for ip in nodeport_ips(cfg) {
        t.add_element_if_absent("nodeport-ips", Element::key(&[&ip]));
    }

    let masq = if cfg.random_fully { "masquerade fully-random" } else { "masquerade" };
    let mut services = Chain::regular("services");
    let mut masquerading = Chain::regular("masquerading");
    match nft.layout {
        Layout::Current | Layout::SharedMaps => {
            if let Some(cidr) = cfg.cluster_cidr.filter(|c| Family::of_net(c) == family(cfg)) {
                services = services.rule(format!(
                    "ip daddr @cluster-ips ip saddr != {cidr} mark set mark or {MASQ_MARK} comment \"masquerade clusterIP traffic from outside cluster\""
                ));
            }
            masquerading =
                masquerading.rule(format!("mark and {MASQ_MARK} != 0 mark set mark xor {MASQ_MARK} {masq}")).rule(
                    format!("ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections {masq}"),
                );
        }
        Layout::V134 => {
            masquerading = masquerading
                .rule(format!("mark and {MASQ_MARK} == 0 return"))
                .rule(format!("mark set mark xor {MASQ_MARK}"))
                .rule(masq);
        }
    }
    services = services
        .rule("ip daddr . meta l4proto . th dport vmap @service-ips")
        .rule("ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports");
    t.add_chain(services);
    t.add_chain(masquerading);
    if nft.layout == Layout::V134 {
        t.add_chain(Chain::regular("mark-for-masquerade").rule(format!("mark set mark or {MASQ_MARK}")));
    }
    let mut check = Chain::regular("cluster-ips-check")
        .rule("ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"");
    let cidrs: Vec<String> =
        nft.service_cidrs.iter().filter(|c| Family::of_net(c) == family(cfg)).map(|c| c.to_string()).collect();
    if !cidrs.is_empty() {
        check = check.rule(format!(
            "ip daddr {{ {} }} drop comment \"Drop traffic to unallocated ClusterIPs\"",
            cidrs.join(", ")
        ));
    }
    t.add_chain(check);
    t.add_chain(Chain::regular("reject-chain").with_comment(NO_ENDPOINT_HELP).rule("reject"));
    t.add_chain(
        Chain::regular("service-endpoints-check").rule("ip daddr . meta l4proto . th dport vmap @no-endpoint-services"),
    );
    t.add_chain(
        Chain::regular("nodeport-endpoints-check")
            .rule("ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"),
    );
    t.add_chain(Chain::regular("firewall-check").rule("ip daddr . meta l4proto . th dport vmap @firewall-ips"));
    t
}

/// The node addresses that accept NodePort traffic.
fn nodeport_ips(cfg: &RenderConfig) -> impl Iterator<Item = String> + '_ {
    cfg.node_ips.iter().filter(|ip| Family::of(ip) == family(cfg) && !ip.is_loopback()).map(|ip| ip.to_string())
}

/// The whole table for these service ports.
pub fn render(cfg: &RenderConfig, nft: &NftConfig, services: &[ServiceState]) -> NftTable {
    // The head, then the service ports: the order a load in parts writes (and nft lists).
    let mut t = head(cfg, nft, services);
    for st in services {
        add_port(cfg, nft, st, &mut t);
    }
    if cfg.ipv6() {
        to_ip6(&mut t);
    }
    t
}

/// The fixed chains and sets, and (shared-maps) the DNAT chains for every endpoint count up
/// to the largest in use, so that an endpoint more or less is elements only.
fn head(cfg: &RenderConfig, nft: &NftConfig, services: &[ServiceState]) -> NftTable {
    let mut t = fixed(cfg, nft);
    let most = services.iter().filter_map(|st| shared(cfg, nft, st).map(|p| p.cluster_eps.len())).max();
    for n in 1..=most.unwrap_or(0) {
        add_lb_chains(cfg, n, &mut t);
    }
    t
}

/// A load from nothing in parts, first the head: the fixed chains and sets with every shared
/// DNAT chain these service ports use. Then each [`render_part`] of them, in order: the head
/// with every part merged ([`merge_part`]) is `render(cfg, nft, services)`, in the same order.
/// Pure.
pub fn render_head(cfg: &RenderConfig, nft: &NftConfig, services: &[ServiceState]) -> NftTable {
    let mut t = head(cfg, nft, services);
    if cfg.ipv6() {
        to_ip6(&mut t);
    }
    t
}

/// What these service ports add to the head of a load in parts ([`render_head`]): their
/// chains, their sets and their elements, with the fixed sets declared (without their
/// elements) so that the part can be written alone. Pure.
pub fn render_part(cfg: &RenderConfig, nft: &NftConfig, services: &[ServiceState]) -> NftTable {
    let mut t = fixed(cfg, nft);
    t.chains.clear();
    for s in &mut t.sets {
        s.elements.clear();
    }
    for st in services {
        add_port(cfg, nft, st, &mut t);
    }
    if cfg.ipv6() {
        to_ip6(&mut t);
    }
    t
}

/// `table` with a part of a load in parts ([`render_part`]) added: its chains (a service
/// port's own, so new to the table; rules for a chain the table has are appended to it), its
/// sets and elements.
pub fn merge_part(table: &mut NftTable, part: NftTable) {
    // The part's few names indexed, the table's many only looked up: no copy of them per part.
    let names: HashMap<&str, usize> = part.chains.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
    let mut into = vec![None; part.chains.len()];
    for (at, c) in table.chains.iter().enumerate() {
        if let Some(&i) = names.get(c.name.as_str()) {
            into[i] = Some(at);
        }
    }
    for (c, at) in part.chains.into_iter().zip(into) {
        match at {
            Some(at) => table.chains[at].rules.extend(c.rules),
            None => table.chains.push(c),
        }
    }
    for s in part.sets {
        match table.set_mut(&s.name) {
            Some(mine) => {
                for (k, e) in s.elements {
                    mine.elements.entry(k).or_insert(e);
                }
            }
            None => table.sets.push(s),
        }
    }
}

/// The IPv6 proxier's table from the rules written for IPv4: kube-proxy's two tables differ in
/// exactly these words (`ip6 kube-proxy`; `ip6 daddr`/`ip6 saddr`; `dnat ip6 to`; `ipv6_addr`),
/// its rules being formatted with the family's `ip`/`ip6` and address type. Pure.
pub fn to_ip6(t: &mut NftTable) {
    t.family = podpath_ruleset::nft::NftFamily::Ip6;
    for c in &mut t.chains {
        for r in &mut c.rules {
            *r = ip6_words(r);
        }
    }
    for s in &mut t.sets {
        s.key_type = ip6_words(&s.key_type).replace("ipv4_addr", "ipv6_addr");
        if let Some(v) = &mut s.value_type {
            *v = ip6_words(v).replace("ipv4_addr", "ipv6_addr");
        }
    }
}

/// `ip` → `ip6` where it names the network header (`ip daddr`, `ip saddr`, `dnat ip to`,
/// `dnat ip addr . port to`); quoted comments are left alone.
fn ip6_words(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut quoted = false;
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('"') {
            quoted = !quoted;
            out.push('"');
            rest = r;
            continue;
        }
        let at_word = out.is_empty() || out.ends_with([' ', '{', '(', '.']);
        if !quoted && at_word {
            if let Some(r) = rest.strip_prefix("ip ") {
                if ["daddr", "saddr", "to ", "addr "].iter().any(|w| r.starts_with(w)) {
                    out.push_str("ip6 ");
                    rest = r;
                    continue;
                }
            }
        }
        let ch = rest.chars().next().expect("non-empty");
        out.push(ch);
        rest = &rest[ch.len_utf8()..];
    }
    out
}

/// Adds one service port's elements, chains and sets to `t`; for a port the shared maps carry,
/// the endpoint count whose DNAT chains it uses.
fn add_port(cfg: &RenderConfig, nft: &NftConfig, st: &ServiceState, t: &mut NftTable) -> Option<usize> {
    match shared(cfg, nft, st) {
        Some(port) => {
            shared_service(cfg, &port, t);
            Some(port.cluster_eps.len())
        }
        None => {
            service(cfg, nft, st, t);
            None
        }
    }
}

/// shared-maps: the DNAT chains of endpoint count `n`.
fn add_lb_chains(cfg: &RenderConfig, n: usize, t: &mut NftTable) {
    t.add_chain(lb_chain(n));
    if cfg.masquerade_external {
        t.add_chain(
            Chain::regular(format!("lb-ext-{n}"))
                .rule(format!("mark set mark or {MASQ_MARK} comment \"masquerade\""))
                .rule(format!("goto lb-{n}")),
        );
    }
}

/// What a partial sync must know of the service ports it does not touch: how many use each
/// shared DNAT chain count and each hairpin element (both can be shared between ports).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shared {
    counts: BTreeMap<usize, usize>,
    hairpin: HashMap<String, usize>,
}

impl Shared {
    /// The sharing among all these service ports.
    pub fn of(cfg: &RenderConfig, nft: &NftConfig, states: &[ServiceState]) -> Shared {
        let mut s = Shared::default();
        for st in states {
            s.count(cfg, nft, st, 1);
        }
        s
    }

    /// The largest endpoint count in use: DNAT chains exist for 1 to it.
    fn most(&self) -> usize {
        self.counts.keys().next_back().copied().unwrap_or(0)
    }

    /// Counts a port in (`by` 1) or out (-1); the endpoint counts whose DNAT chains that
    /// makes needed (`made`) or no longer needed (`gone`).
    fn count(
        &mut self,
        cfg: &RenderConfig,
        nft: &NftConfig,
        st: &ServiceState,
        by: isize,
    ) -> (std::ops::RangeInclusive<usize>, std::ops::RangeInclusive<usize>) {
        let was = self.most();
        if let Some(port) = shared(cfg, nft, st) {
            let n = port.cluster_eps.len();
            let c = self.counts.entry(n).or_default();
            *c = c.saturating_add_signed(by);
            if *c == 0 {
                self.counts.remove(&n);
            }
        }
        let now = self.most();
        if nft.layout.is_current() {
            let p = Port::new(&st.port, &st.endpoints, &cfg.node_name);
            for e in hairpin_elements(&p) {
                let c = self.hairpin.entry(e.key_text().to_string()).or_default();
                *c = c.saturating_add_signed(by);
                if *c == 0 {
                    self.hairpin.remove(e.key_text());
                }
            }
        }
        (was + 1..=now, now + 1..=was)
    }
}

/// A partial sync's two tables, made from the changed service ports only: what they held
/// (`old`) and what they hold now (`new`), with the shared DNAT chains that came or went and
/// without hairpin elements other ports still use. `Transaction::between(before, after)` is
/// then the sync, whatever the size of the table; `shared` is updated.
pub fn render_changed(
    cfg: &RenderConfig,
    nft: &NftConfig,
    shared: &mut Shared,
    old: &[&ServiceState],
    new: &[&ServiceState],
) -> (NftTable, NftTable) {
    let mut skeleton = fixed(cfg, nft);
    skeleton.chains.clear();
    for s in &mut skeleton.sets {
        s.elements.clear();
    }
    let (mut before, mut after) = (skeleton.clone(), skeleton);
    for st in old {
        add_port(cfg, nft, st, &mut before);
        for n in shared.count(cfg, nft, st, -1).1 {
            add_lb_chains(cfg, n, &mut before);
        }
    }
    for st in new {
        add_port(cfg, nft, st, &mut after);
        for n in shared.count(cfg, nft, st, 1).0 {
            add_lb_chains(cfg, n, &mut after);
        }
    }
    // (Chains that went with an old state and came back with a new one are in both tables,
    // the same: no change.) Hairpin elements another port still uses stay in the kernel.
    if let Some(set) = before.set_mut("hairpin-connections") {
        set.elements.retain(|k, _| !shared.hairpin.contains_key(k));
    }
    if cfg.ipv6() {
        to_ip6(&mut before);
        to_ip6(&mut after);
    }
    (before, after)
}

/// shared-maps: the DNAT of every Service port with `n` endpoints: the packet's own address,
/// protocol and port and `numgen random mod n` looked up in `endpoints`.
fn lb_chain(n: usize) -> Chain {
    let mut c = Chain::regular(format!("lb-{n}"));
    for proto in ["tcp", "udp", "sctp"] {
        c = c
            .rule(format!("dnat ip to ip daddr . meta l4proto . {proto} dport . numgen random mod {n} map @endpoints"));
    }
    c
}

/// shared-maps: the service port, when it is one the shared maps carry (Cluster policies, no
/// affinity, no source ranges, endpoints somewhere).
fn shared<'a>(cfg: &RenderConfig, nft: &NftConfig, st: &'a ServiceState) -> Option<Port<'a>> {
    let sp = &st.port;
    if nft.layout != Layout::SharedMaps
        || sp.internal_policy_local
        || sp.external_policy_local
        || sp.affinity_seconds.is_some()
    {
        return None;
    }
    let mut port = Port::new(sp, &st.endpoints, &cfg.node_name);
    let fam = port_family(sp);
    port.cluster_eps.retain(|e| Family::of(&e.ip) == fam);
    (!port.cluster_eps.is_empty() && !port.uses_fw()).then_some(port)
}

/// shared-maps: one service port as elements: each address it answers on goes to `lb-N` (or
/// `lb-ext-N`, which marks for masquerade first), and `endpoints` holds its N endpoints under
/// each of those addresses.
fn shared_service(cfg: &RenderConfig, p: &Port<'_>, t: &mut NftTable) {
    let sp = p.sp;
    let proto = sp.protocol.as_str();
    let port = sp.port.to_string();
    let n = p.cluster_eps.len();
    let external = if cfg.masquerade_external { format!("goto lb-ext-{n}") } else { format!("goto lb-{n}") };
    let add_endpoints = |t: &mut NftTable, addr: &str, port: &str| {
        for (i, e) in p.cluster_eps.iter().enumerate() {
            // Formatted in one go: a load of 10,000 Services writes ~150,000 of these.
            let key = Element::joined(format!("{addr} . {proto} . {port} . {i}"));
            t.add_element_if_absent("endpoints", key.to(format!("{} . {}", e.ip, e.port)));
        }
    };
    if let Some(cip) = sp.cluster_ip.map(|ip| ip.to_string()) {
        t.add_element_if_absent("cluster-ips", Element::key(&[&cip]));
        t.add_element_if_absent(
            "service-ips",
            Element::key(&[&cip, proto, &port]).with_comment(&p.spn).to(format!("goto lb-{n}")),
        );
        add_endpoints(t, &cip, &port);
    }
    for ip in same(sp, &sp.external_ips).chain(same(sp, &sp.load_balancer_ips)) {
        t.add_element_if_absent(
            "service-ips",
            Element::key(&[&ip, proto, &port]).with_comment(&p.spn).to(external.clone()),
        );
        add_endpoints(t, &ip, &port);
    }
    if let Some(np) = sp.node_port.map(|n| n.to_string()) {
        t.add_element_if_absent(
            "service-nodeports",
            Element::key(&[proto, &np]).with_comment(&p.spn).to(external.clone()),
        );
        for ip in nodeport_ips(cfg) {
            add_endpoints(t, &ip, &np);
        }
    }
    for e in hairpin_elements(p) {
        t.add_element_if_absent("hairpin-connections", e);
    }
}

/// The `hairpin-connections` elements of a service port: each local endpoint reaching itself.
/// Two Service ports with the same pods and target port share them.
fn hairpin_elements<'a>(p: &'a Port<'_>) -> impl Iterator<Item = Element> + 'a {
    let proto = p.sp.protocol.as_str();
    let fam = port_family(p.sp);
    p.local_eps.iter().filter(move |e| Family::of(&e.ip) == fam).map(move |e| {
        let (ip, eport) = (e.ip.to_string(), e.port.to_string());
        Element::key(&[&ip, &ip, proto, &eport])
    })
}

/// What a service port's rules depend on.
/// What a service port's rules depend on.
type Port<'a> = Categorized<'a>;

/// `goto reject-chain` when there is no endpoint anywhere, else `drop` (none on this node).
fn no_endpoint_verdict(p: &Port<'_>) -> &'static str {
    if p.has_endpoints() {
        "drop"
    } else {
        "goto reject-chain"
    }
}

/// The family of this proxier's rules (its node addresses').
fn family(cfg: &RenderConfig) -> Family {
    if cfg.ipv6() {
        Family::V6
    } else {
        Family::V4
    }
}

/// A service port's family: its ClusterIP's (the proxier of each family reads only its own).
fn port_family(sp: &ServicePort) -> Family {
    sp.cluster_ip.map(|ip| Family::of(&ip)).unwrap_or_default()
}

/// The addresses of `ips` of the port's family.
fn same<'a>(sp: &ServicePort, ips: &'a [IpAddr]) -> impl Iterator<Item = String> + 'a {
    let fam = port_family(sp);
    ips.iter().filter(move |ip| Family::of(ip) == fam).map(|ip| ip.to_string())
}

/// One service port's elements and chains.
fn service(cfg: &RenderConfig, nft: &NftConfig, st: &ServiceState, t: &mut NftTable) {
    let sp = &st.port;
    // A service port's chains are its own (their names hold its name): new to the table, so
    // pushed without a lookup; only an endpoint picked by both the cluster and the local
    // chain comes twice. (A lookup per chain made 10,000 Services take seconds.)
    let mut chains_made: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut sets_made: std::collections::HashSet<String> = std::collections::HashSet::new();
    let p = Port::new(sp, &st.endpoints, &cfg.node_name);
    let proto = sp.protocol.as_str();
    let port = sp.port.to_string();
    let svc_chain = service_chain("service-", sp);
    let local_chain = service_chain("local-", sp);
    let ext_chain = service_chain("external-", sp);
    let fw_chain = service_chain("firewall-", sp);
    let internal = if sp.internal_policy_local { &local_chain } else { &svc_chain };
    let external_policy = if sp.external_policy_local { &local_chain } else { &svc_chain };

    // Elements.
    if let Some(cip) = sp.cluster_ip.map(|ip| ip.to_string()) {
        t.add_element_if_absent("cluster-ips", Element::key(&[&cip]));
        if p.has_internal() {
            t.add_element_if_absent("service-ips", Element::key(&[&cip, proto, &port]).to(format!("goto {internal}")));
        } else {
            let verdict = if !p.has_endpoints() { "goto reject-chain" } else { "drop" };
            t.add_element_if_absent(
                "no-endpoint-services",
                Element::key(&[&cip, proto, &port]).with_comment(&p.spn).to(verdict),
            );
        }
    }
    let external_ips: Vec<String> = same(sp, &sp.external_ips).chain(same(sp, &sp.load_balancer_ips)).collect();
    for ip in &external_ips {
        if p.has_endpoints() {
            t.add_element_if_absent("service-ips", Element::key(&[ip, proto, &port]).to(format!("goto {ext_chain}")));
        }
        if !p.has_external() {
            t.add_element_if_absent(
                "no-endpoint-services",
                Element::key(&[ip, proto, &port]).with_comment(&p.spn).to(no_endpoint_verdict(&p)),
            );
        }
    }
    let uses_fw = p.uses_fw();
    if uses_fw {
        for ip in same(sp, &sp.load_balancer_ips) {
            t.add_element_if_absent("firewall-ips", Element::key(&[&ip, proto, &port]).to(format!("goto {fw_chain}")));
        }
    }
    if let Some(np) = sp.node_port.map(|n| n.to_string()) {
        if p.has_endpoints() {
            t.add_element_if_absent("service-nodeports", Element::key(&[proto, &np]).to(format!("goto {ext_chain}")));
        }
        if !p.has_external() {
            t.add_element_if_absent(
                "no-endpoint-nodeports",
                Element::key(&[proto, &np]).with_comment(&p.spn).to(no_endpoint_verdict(&p)),
            );
        }
    }
    if nft.layout.is_current() {
        for e in hairpin_elements(&p) {
            t.add_element_if_absent("hairpin-connections", e);
        }
    }

    // Chains: the endpoint choice of the cluster and local policy chains.
    let mut picking: Vec<(&String, &[Endpoint])> = vec![];
    if p.uses_cluster() {
        picking.push((&svc_chain, &p.cluster_eps));
    }
    if p.uses_local() {
        picking.push((&local_chain, &p.local_eps));
    }
    for (chain_name, eps) in picking {
        let mut chain = Chain::regular(chain_name.clone());
        let is_cluster_chain = chain_name == &svc_chain;
        if nft.layout == Layout::V134 && is_cluster_chain {
            if let (Some(cip), Some(cidr)) = (sp.cluster_ip, cfg.cluster_cidr) {
                chain = chain.rule(format!("ip daddr {cip} ip saddr != {cidr} jump mark-for-masquerade"));
            }
        }
        let per_endpoint = nft.layout == Layout::V134 || sp.affinity_seconds.is_some();
        if per_endpoint {
            if let Some(timeout) = sp.affinity_seconds {
                for e in eps {
                    chain = chain.rule(format!("ip saddr @{} goto {}", affinity_set(sp, e), endpoint_chain(sp, e)));
                    if sets_made.insert(affinity_set(sp, e)) {
                        let mut set = Set::plain(affinity_set(sp, e), "ipv4_addr");
                        set.flags = vec!["dynamic".into(), "timeout".into()];
                        set.timeout = Some(format!("{timeout}s"));
                        t.sets.push(set);
                    }
                }
            }
            let choices: Vec<String> =
                eps.iter().enumerate().map(|(i, e)| format!("{i} : goto {}", endpoint_chain(sp, e))).collect();
            chain = chain.rule(format!("numgen random mod {} vmap {{ {} }}", eps.len(), choices.join(" , ")));
            for e in eps {
                let name = endpoint_chain(sp, e);
                if !chains_made.insert(name.clone()) {
                    continue;
                }
                let mut ep = Chain::regular(name);
                if nft.layout == Layout::V134 {
                    ep = ep.rule(format!("ip saddr {} jump mark-for-masquerade", e.ip));
                }
                if sp.affinity_seconds.is_some() {
                    ep = ep.rule(format!("update @{} {{ ip saddr }}", affinity_set(sp, e)));
                }
                ep = ep.rule(format!("meta l4proto {proto} dnat to {}", e.addr()));
                t.chains.push(ep);
            }
        } else {
            let choices: Vec<String> =
                eps.iter().enumerate().map(|(i, e)| format!("{i} : {} . {}", e.ip, e.port)).collect();
            chain = chain.rule(format!(
                "meta l4proto {proto} dnat ip addr . port to numgen random mod {} map {{ {} }}",
                eps.len(),
                choices.join(" , ")
            ));
        }
        t.chains.push(chain);
    }

    // The external chain: masquerade (or short-circuit) then the external policy's chain.
    if p.uses_ext() {
        let mut ext = Chain::regular(ext_chain.clone());
        let mark = match nft.layout {
            Layout::Current | Layout::SharedMaps => format!("mark set mark or {MASQ_MARK}"),
            Layout::V134 => "jump mark-for-masquerade".to_string(),
        };
        if !sp.external_policy_local {
            if cfg.masquerade_external {
                ext = ext.rule(match nft.layout {
                    Layout::Current | Layout::SharedMaps => format!("{mark} comment \"masquerade\""),
                    Layout::V134 => mark.clone(),
                });
            }
            ext = ext.rule(format!("goto {svc_chain}"));
        } else {
            if let Some(cidr) = cfg.cluster_cidr {
                ext = ext.rule(format!("ip saddr {cidr} goto {svc_chain} comment \"short-circuit pod traffic\""));
            }
            ext = ext
                .rule(format!("fib saddr type local {mark} comment \"masquerade local traffic\""))
                .rule(format!("fib saddr type local goto {svc_chain} comment \"short-circuit local traffic\""));
            if p.uses_local() {
                ext = ext.rule(format!("goto {external_policy}"));
            }
        }
        t.chains.push(ext);
    }
    if uses_fw {
        let mut ranges: Vec<String> =
            sp.source_ranges.iter().filter(|r| Family::of_net(r) == port_family(sp)).map(|r| r.to_string()).collect();
        // A range holding the node's own address lets the node reach the VIPs too.
        if sp.source_ranges.iter().any(|r| cfg.node_ips.iter().any(|ip| r.contains(ip))) {
            ranges.extend(same(sp, &sp.load_balancer_ips));
        }
        t.chains.push(Chain::regular(fw_chain.clone()).rule(format!("ip saddr != {{ {} }} drop", ranges.join(", "))));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use podpath_ruleset::nft::Transaction;

    fn cfg() -> RenderConfig {
        RenderConfig::new("node-1", "192.168.56.11".parse().unwrap())
    }

    /// Every rule and set the layouts write goes over netlink (`nfnl`), and so does a load of
    /// the whole table: a new rule form that the netlink layer cannot write fails here rather
    /// than falling back to `nft -f` in silence.
    #[test]
    fn every_rule_the_layouts_write_compiles() {
        let states = crate::iptables::tests::services();
        for layout in [Layout::Current, Layout::V134, Layout::SharedMaps] {
            let nft = NftConfig { layout, service_cidrs: vec!["10.96.0.0/12".parse().unwrap()] };
            let table = render(&cfg(), &nft, &states);
            assert_eq!(nfnl::unwritable(&table), Vec::<String>::new(), "{layout:?}");
        }
    }

    /// A load in parts writes what the whole render does: the head with every part merged is
    /// the rendered table, in the same order, in every layout, for IPv4 and IPv6, with
    /// parts of one port, of a few and of all; two ports on one external address and one node
    /// port (the first keeps them in both) among them.
    #[test]
    fn head_and_parts_make_the_whole_table() {
        let mut v4 = crate::iptables::tests::services();
        for (name, eps) in [("dup-a", 2), ("dup-b", 3)] {
            let mut port = ServicePort::new("dup", name, "", "tcp", 80);
            port.cluster_ip = Some(format!("10.96.0.{}", 50 + eps).parse().unwrap());
            port.external_ips = vec!["169.10.10.9".parse().unwrap()];
            port.node_port = Some(30999);
            let endpoints = (0..eps).map(|i| ep(&format!("10.244.{eps}.{}", i + 20), 80, "node-2")).collect();
            v4.push(ServiceState { port, endpoints });
        }
        let mut v6 = v4.clone();
        for (i, st) in v6.iter_mut().enumerate() {
            st.port.cluster_ip = Some(format!("fd00:10:96::{:x}", i + 1).parse().unwrap());
            st.port.load_balancer_ips.clear();
            st.port.external_ips.clear();
            st.port.source_ranges.clear();
            for (j, e) in st.endpoints.iter_mut().enumerate() {
                e.ip = format!("fd00:10:244::{:x}", i * 16 + j + 2).parse().unwrap();
            }
        }
        let cfg6 = RenderConfig {
            cluster_cidr: Some("fd00:10:244::/56".parse().unwrap()),
            ..RenderConfig::new("node-1", "fd00:56::11".parse().unwrap())
        };
        for layout in [Layout::Current, Layout::V134, Layout::SharedMaps] {
            let nft = NftConfig { layout, service_cidrs: vec!["10.96.0.0/12".parse().unwrap()] };
            for (cfg, states) in [(cfg(), &v4), (cfg6.clone(), &v6)] {
                let whole = render(&cfg, &nft, states);
                for per_part in [1, 2, 4, 7, states.len()] {
                    let mut t = render_head(&cfg, &nft, states);
                    for part in states.chunks(per_part) {
                        merge_part(&mut t, render_part(&cfg, &nft, part));
                    }
                    assert_eq!(t, whole, "{layout:?}, {per_part} per part, ipv6 {}", cfg.ipv6());
                }
            }
        }
    }

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

    /// The reference's worked example: `demo/web`, LoadBalancer with NodePort 30080.
    fn demo_web() -> ServiceState {
        let mut port = ServicePort::new("demo", "web", "http", "TCP", 80);
        port.cluster_ip = Some("10.96.12.34".parse().unwrap());
        port.node_port = Some(30080);
        port.load_balancer_ips = vec!["203.0.113.10".parse().unwrap()];
        ServiceState { port, endpoints: vec![ep("10.244.1.5", 8080, "node-1"), ep("10.244.2.7", 8080, "node-2")] }
    }

    #[test]
    fn names_are_kube_proxys() {
        let mut sp = ServicePort::new("ns1", "svc1", "p80", "tcp", 80);
        assert_eq!(service_chain("service-", &sp), "service-ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(
            endpoint_chain(&sp, &ep("10.180.0.1", 80, "x")),
            "endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80"
        );
        sp.id = crate::model::ServicePortName::new("ns5", "svc5", "p80");
        assert_eq!(affinity_set(&sp, &ep("10.180.0.3", 80, "x")), "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80");
        assert_eq!(hash8("ns2/svc2/tcp/p80"), "42NFTM6N");
        assert_eq!(hash8("kube-system/kube-dns/udp/dns"), "FY5PMXPG");
        assert_eq!(hash8("demo/web/tcp/http"), "AXK6CI2C");
        assert_eq!(hash8("default/kubernetes/tcp/https"), "2QRHZV4L");
    }

    /// shared-maps: the worked example's Service is elements only, its DNAT the shared rule of
    /// its endpoint count; an endpoint replaced is a handful of element commands.
    #[test]
    fn shared_maps_make_a_plain_service_elements_only() {
        use podpath_ruleset::nft::Op;
        let config = NftConfig { layout: Layout::SharedMaps, ..Default::default() };
        let t = render(&cfg(), &config, &[demo_web()]);
        let text = Transaction::between(None, &t).0.text();
        for line in [
            "add map ip kube-proxy endpoints { typeof ip daddr . meta l4proto . tcp dport . numgen random mod 1 : ip daddr . tcp dport ; comment \"Service address . protocol . port . endpoint index : endpoint\" ; }",
            "add element ip kube-proxy service-ips { 10.96.12.34 . tcp . 80 comment \"demo/web:http\" : goto lb-2 }",
            "add element ip kube-proxy service-ips { 203.0.113.10 . tcp . 80 comment \"demo/web:http\" : goto lb-ext-2 }",
            "add element ip kube-proxy service-nodeports { tcp . 30080 comment \"demo/web:http\" : goto lb-ext-2 }",
            "add element ip kube-proxy endpoints { 10.96.12.34 . tcp . 80 . 0 : 10.244.1.5 . 8080 }",
            "add element ip kube-proxy endpoints { 10.96.12.34 . tcp . 80 . 1 : 10.244.2.7 . 8080 }",
            "add element ip kube-proxy endpoints { 203.0.113.10 . tcp . 80 . 0 : 10.244.1.5 . 8080 }",
            "add element ip kube-proxy endpoints { 192.168.56.11 . tcp . 30080 . 1 : 10.244.2.7 . 8080 }",
            "add element ip kube-proxy hairpin-connections { 10.244.1.5 . 10.244.1.5 . tcp . 8080 }",
            "add rule ip kube-proxy lb-2 dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @endpoints",
            "add rule ip kube-proxy lb-ext-2 mark set mark or 0x00004000 comment \"masquerade\"",
            "add rule ip kube-proxy lb-ext-2 goto lb-2",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
        assert!(!text.contains("AXK6CI2C"), "no chain of the Service's own:\n{text}");

        let mut next = demo_web();
        next.endpoints[1] = ep("10.244.2.9", 8080, "node-2");
        let (tx, stale) = Transaction::between(Some(&t), &render(&cfg(), &config, &[next]));
        assert!(stale.is_empty(), "{stale:?}");
        assert!(
            tx.ops.iter().all(|op| matches!(op, Op::AddElement { .. } | Op::DeleteElement { .. })),
            "{}",
            tx.text()
        );
        assert_eq!(tx.ops.len(), 6, "index 1 of three addresses, out and in:\n{}", tx.text());

        // Affinity (or a Local policy, or source ranges) keeps the current layout's chains.
        let mut sticky = demo_web();
        sticky.port.affinity_seconds = Some(10800);
        let text = Transaction::between(None, &render(&cfg(), &config, &[sticky])).0.text();
        assert!(text.contains("service-AXK6CI2C-demo/web/tcp/http") && !text.contains("lb-2"), "{text}");
    }

    /// A partial sync made from the changed ports only leaves the kernel holding exactly what a
    /// whole render holds, in every layout, through endpoint-count changes, a port created and
    /// one deleted, and a hairpin element two ports share; and it deletes only what is there.
    #[test]
    fn a_sync_of_the_changed_ports_only_ends_where_a_whole_render_does() {
        use podpath_ruleset::nft::Listing;
        let with = |name: &str, cip: &str, eps: Vec<Endpoint>| {
            let mut st = demo_web();
            st.port.id = crate::model::ServicePortName::new("demo", name, "http");
            st.port.cluster_ip = Some(cip.parse().unwrap());
            st.port.load_balancer_ips = vec![];
            st.port.node_port = None;
            st.endpoints = eps;
            st
        };
        let a = || ep("10.244.1.5", 8080, "node-1");
        let b = || ep("10.244.2.7", 8080, "node-2");
        let c = || ep("10.244.3.9", 8080, "node-3");
        let mut sticky = with("sticky", "10.96.0.30", vec![a(), b()]);
        sticky.port.affinity_seconds = Some(60);
        let start = vec![
            demo_web(),
            with("twin", "10.96.0.31", vec![a(), b()]),
            with("one", "10.96.0.32", vec![c()]),
            sticky.clone(),
        ];
        let steps: Vec<Vec<ServiceState>> = vec![
            // demo/web loses node-1's endpoint: count 2 → 1, its hairpin element still twin's.
            vec![with("web", "10.96.12.34", vec![b()]), start[1].clone(), start[2].clone(), sticky.clone()],
            // twin deleted (the last user of the hairpin element and of count 2), a new port.
            vec![
                with("web", "10.96.12.34", vec![b()]),
                start[2].clone(),
                sticky.clone(),
                with("new", "10.96.0.33", vec![a(), b(), c()]),
            ],
            // sticky loses its affinity set and chains with its last endpoint.
            vec![
                with("web", "10.96.12.34", vec![b()]),
                start[2].clone(),
                with("sticky", "10.96.0.30", vec![]),
                with("new", "10.96.0.33", vec![a(), b(), c()]),
            ],
        ];
        for layout in [Layout::Current, Layout::V134, Layout::SharedMaps] {
            let config = NftConfig { layout, ..Default::default() };
            let mut kernel = render(&cfg(), &config, &start);
            let mut shared = Shared::of(&cfg(), &config, &start);
            let mut states = start.clone();
            for next in &steps {
                let key = |s: &ServiceState| s.port.key();
                let old: Vec<&ServiceState> =
                    states.iter().filter(|s| !next.iter().any(|n| key(n) == key(s) && n == *s)).collect();
                let new: Vec<&ServiceState> =
                    next.iter().filter(|n| !states.iter().any(|s| key(n) == key(s) && *n == s)).collect();
                let (before, after) = render_changed(&cfg(), &config, &mut shared, &old, &new);
                let held = Listing::of(&kernel);
                for (set, els) in &Listing::of(&before).sets {
                    assert!(els.is_subset(&held.sets[set]), "{layout:?}: deletes only what is there: {set}");
                }
                kernel.replace_part(&before, &after);
                assert_eq!(Listing::of(&kernel), Listing::of(&render(&cfg(), &config, next)), "{layout:?}");
                assert_eq!(shared, Shared::of(&cfg(), &config, next), "{layout:?}");
                states = next.clone();
            }
        }
    }

    /// The transaction lines the reference gives for the worked example (current layout).
    #[test]
    fn the_worked_example_renders_the_references_lines() {
        let t = render(&cfg(), &NftConfig::default(), &[demo_web()]);
        let text = Transaction::between(None, &t).0.text();
        for line in [
            "add rule ip kube-proxy service-AXK6CI2C-demo/web/tcp/http meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.2.7 . 8080 }",
            "add rule ip kube-proxy external-AXK6CI2C-demo/web/tcp/http mark set mark or 0x00004000 comment \"masquerade\"",
            "add rule ip kube-proxy external-AXK6CI2C-demo/web/tcp/http goto service-AXK6CI2C-demo/web/tcp/http",
            "add element ip kube-proxy hairpin-connections { 10.244.1.5 . 10.244.1.5 . tcp . 8080 }",
            "add element ip kube-proxy cluster-ips { 10.96.12.34 }",
            "add element ip kube-proxy service-ips { 10.96.12.34 . tcp . 80 : goto service-AXK6CI2C-demo/web/tcp/http }",
            "add element ip kube-proxy service-ips { 203.0.113.10 . tcp . 80 : goto external-AXK6CI2C-demo/web/tcp/http }",
            "add element ip kube-proxy service-nodeports { tcp . 30080 : goto external-AXK6CI2C-demo/web/tcp/http }",
            "add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.244.0.0/16 mark set mark or 0x00004000 comment \"masquerade clusterIP traffic from outside cluster\"",
            "add rule ip kube-proxy masquerading mark and 0x00004000 != 0 mark set mark xor 0x00004000 masquerade fully-random",
            "add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
            "add chain ip kube-proxy filter-prerouting-pre-dnat { type filter hook prerouting priority -110 ; }",
            "add chain ip kube-proxy reject-chain { comment \"helper for @no-endpoint-services / @no-endpoint-nodeports\" ; }",
            "add element ip kube-proxy nodeport-ips { 192.168.56.11 }",
        ] {
            assert!(text.lines().any(|l| l == line), "missing: {line}\n{text}");
        }
        assert!(!text.contains("chain ip kube-proxy endpoint-"), "no per-endpoint chains in the current layout");
    }

    /// The v1.34 shapes of the upstream golden test: ns5/svc5 with affinity and source ranges.
    #[test]
    fn the_v134_layout_has_per_endpoint_chains_and_mark_for_masquerade() {
        let mut port = ServicePort::new("ns5", "svc5", "p80", "tcp", 80);
        port.cluster_ip = Some("172.30.0.45".parse().unwrap());
        port.node_port = Some(3002);
        port.load_balancer_ips = vec!["5.6.7.8".parse().unwrap()];
        port.source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
        port.affinity_seconds = Some(10800);
        let st = ServiceState { port, endpoints: vec![ep("10.180.0.3", 80, "other")] };
        let c = RenderConfig {
            cluster_cidr: Some("10.0.0.0/8".parse().unwrap()),
            node_ips: vec!["192.168.0.2".parse().unwrap()],
            ..cfg()
        };
        let nft = NftConfig { layout: Layout::V134, service_cidrs: vec![] };
        let text = Transaction::between(None, &render(&c, &nft, &[st])).0.text();
        // The golden test writes the mark as 0x4000; kube-proxy's own formatting (and the
        // kernel's listing) is 0x00004000.
        for line in [
            "add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }",
            "add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
            "add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80",
            "add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }",
            "add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade",
            "add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80",
            "add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade",
            "add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }",
            "add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80",
            "add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop",
            "add element ip kube-proxy cluster-ips { 172.30.0.45 }",
            "add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }",
            "add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }",
            "add element ip kube-proxy service-nodeports { tcp . 3002 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }",
            "add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }",
            "add rule ip kube-proxy mark-for-masquerade mark set mark or 0x00004000",
            "add rule ip kube-proxy masquerading mark and 0x00004000 == 0 return",
        ] {
            assert!(text.lines().any(|l| l == line), "missing: {line}\n{text}");
        }
        assert!(!text.contains("hairpin-connections"));
    }

    /// The golden test's ns2/svc2 (ETP=Local, no local endpoint) and ns6/svc6 (no endpoints).
    #[test]
    fn no_endpoints_and_no_local_endpoints() {
        let mut p2 = ServicePort::new("ns2", "svc2", "p80", "tcp", 80);
        p2.cluster_ip = Some("172.30.0.42".parse().unwrap());
        p2.node_port = Some(3001);
        p2.external_ips = vec!["192.168.99.22".parse().unwrap()];
        p2.load_balancer_ips = vec!["1.2.3.4".parse().unwrap()];
        p2.external_policy_local = true;
        let mut p6 = ServicePort::new("ns6", "svc6", "p80", "tcp", 80);
        p6.cluster_ip = Some("172.30.0.46".parse().unwrap());
        let states = [
            ServiceState { port: p2, endpoints: vec![ep("10.180.0.2", 80, "other")] },
            ServiceState { port: p6, endpoints: vec![] },
        ];
        let c = RenderConfig { cluster_cidr: Some("10.0.0.0/8".parse().unwrap()), ..cfg() };
        let t = render(&c, &NftConfig::default(), &states);
        let text = Transaction::between(None, &t).0.text();
        for line in [
            "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment \"short-circuit pod traffic\"",
            "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local mark set mark or 0x00004000 comment \"masquerade local traffic\"",
            "add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment \"short-circuit local traffic\"",
            "add element ip kube-proxy no-endpoint-nodeports { tcp . 3001 comment \"ns2/svc2:p80\" : drop }",
            "add element ip kube-proxy no-endpoint-services { 1.2.3.4 . tcp . 80 comment \"ns2/svc2:p80\" : drop }",
            "add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment \"ns2/svc2:p80\" : drop }",
            "add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment \"ns6/svc6:p80\" : goto reject-chain }",
        ] {
            assert!(text.lines().any(|l| l == line), "missing: {line}\n{text}");
        }
        assert_eq!(
            t.chain("external-42NFTM6N-ns2/svc2/tcp/p80").unwrap().rules.len(),
            3,
            "no final goto without local endpoints"
        );
        assert!(!text.contains("ns6/svc6/tcp/p80"), "no chains for a Service without endpoints");
    }

    #[test]
    fn one_endpoint_more_rewrites_one_chain_and_nothing_else() {
        let before = render(&cfg(), &NftConfig::default(), &[demo_web()]);
        let mut more = demo_web();
        more.endpoints.push(ep("10.244.2.9", 8080, "node-2"));
        let after = render(&cfg(), &NftConfig::default(), &[more]);
        let (tx, stale) = Transaction::between(Some(&before), &after);
        assert!(stale.is_empty());
        assert_eq!(
            tx.text(),
            "add chain ip kube-proxy service-AXK6CI2C-demo/web/tcp/http\n\
             flush chain ip kube-proxy service-AXK6CI2C-demo/web/tcp/http\n\
             add rule ip kube-proxy service-AXK6CI2C-demo/web/tcp/http meta l4proto tcp dnat ip addr . port to numgen random mod 3 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.2.7 . 8080 , 2 : 10.244.2.9 . 8080 }\n"
        );
        // The Service deleted: its elements go, its chains are flushed now and deleted later.
        let empty = render(&cfg(), &NftConfig::default(), &[]);
        let (tx, stale) = Transaction::between(Some(&after), &empty);
        assert_eq!(stale, ["service-AXK6CI2C-demo/web/tcp/http", "external-AXK6CI2C-demo/web/tcp/http"]);
        assert!(
            tx.text().contains("delete element ip kube-proxy service-nodeports { tcp . 30080 }\n"),
            "{}",
            tx.text()
        );
    }
}
