//! The whole `iptables-restore` input of kube-proxy's iptables mode, rendered purely from one
//! snapshot (reference/kube-proxy.md §1.1–1.4: chain layout, names, rule shapes, comments).

use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::IpAddr;

use ipnet::IpNet;

use super::model::{categorize, Endpoint, ServicePort};
use super::names;

/// `1 << masqueradeBit` with kube-proxy's default bit 14.
pub const MASQ_MARK: &str = "0x4000";

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
}

/// One service port and its endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceState {
    pub port: ServicePort,
    pub endpoints: Vec<Endpoint>,
}

fn comment(text: &str) -> String {
    if text.contains(' ') {
        format!("-m comment --comment \"{text}\"")
    } else {
        format!("-m comment --comment {text}")
    }
}

fn host(ip: &IpAddr) -> String {
    ip.to_string()
}

/// Probability of rule `i` of `n` (kube-proxy: `%0.10f` of `1/(n-i)`).
pub fn probability(i: usize, n: usize) -> String {
    format!("{:.10}", 1.0 / (n - i) as f64)
}

/// The rendered tables and the nat chains they own (for stale-chain cleanup next time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    pub text: String,
    pub nat_chains: BTreeSet<String>,
}

/// Identifies a service port across syncs (what a partial sync compares).
pub fn service_key(sp: &ServicePort) -> String {
    format!("{} {}", sp.spn(), sp.protocol)
}

/// Renders filter then nat. `existing_nat_chains` are the chains `iptables-save -t nat` shows
/// now: those of ours that are no longer used are flushed and deleted in the same restore.
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
    changed: &BTreeSet<String>,
) -> Rendered {
    render_inner(cfg, services, existing_nat_chains, Some(changed))
}

fn render_inner(
    cfg: &RenderConfig,
    services: &[ServiceState],
    existing_nat_chains: &BTreeSet<String>,
    only: Option<&BTreeSet<String>>,
) -> Rendered {
    let mut kept: Vec<String> = vec![];
    let mut filter = String::new();
    let mut nat_chains: Vec<String> = vec![];
    let mut nat = String::new();
    let mut filter_nodeports = String::new();
    let mut filter_services = String::new();
    let mut filter_external = String::new();
    let mut filter_firewall = String::new();
    let mut nat_services = String::new();
    let mut nat_nodeports = String::new();

    let mut sorted: Vec<&ServiceState> = services.iter().collect();
    sorted.sort_by_key(|s| (s.port.spn(), s.port.protocol.clone()));

    for st in sorted {
        let sp = &st.port;
        let spn = sp.spn();
        let mut service_chains: Vec<String> = vec![];
        let emit = only.is_none_or(|set| set.contains(&service_key(sp)));
        let proto = &sp.protocol;
        let pm = format!("-m {proto} -p {proto}");
        let hash = names::service_hash(&spn, proto);
        let svc_chain = format!("KUBE-SVC-{hash}");
        let svl_chain = format!("KUBE-SVL-{hash}");
        let ext_chain = format!("KUBE-EXT-{hash}");
        let fw_chain = format!("KUBE-FW-{hash}");

        let (cluster_eps, local_eps) = categorize(&st.endpoints, &cfg.node_name);
        let uses_cluster = !cluster_eps.is_empty() && sp.uses_cluster_endpoints();
        let uses_local = !local_eps.is_empty() && sp.uses_local_endpoints();
        let internal_eps = if sp.internal_policy_local { &local_eps } else { &cluster_eps };
        let external_eps = if sp.external_policy_local { &local_eps } else { &cluster_eps };
        let has_endpoints = !cluster_eps.is_empty() || !local_eps.is_empty();
        let has_internal = !internal_eps.is_empty();
        let has_external = !external_eps.is_empty();
        let internal_chain = if sp.internal_policy_local { &svl_chain } else { &svc_chain };
        let external_policy_chain = if sp.external_policy_local { &svl_chain } else { &svc_chain };
        let uses_ext = has_endpoints && sp.externally_accessible();
        let lb_chain = if sp.source_ranges.is_empty() { &ext_chain } else { &fw_chain };

        let (internal_target, internal_comment, external_target, external_comment) = if !has_endpoints {
            ("REJECT", format!("{spn} has no endpoints"), "REJECT", format!("{spn} has no endpoints"))
        } else {
            ("DROP", format!("{spn} has no local endpoints"), "DROP", format!("{spn} has no local endpoints"))
        };

        // One service address and port: `-A CHAIN <comment> -m P -p P -d IP --dport PORT -j TARGET`.
        let to = |chain: &str, text: &str, ip: &IpAddr, target: &str| {
            format!("-A {chain} {} {pm} -d {} --dport {} -j {target}\n", comment(text), host(ip), sp.port)
        };
        // ClusterIP.
        if let Some(cip) = &sp.cluster_ip {
            if has_internal {
                nat_services.push_str(&to("KUBE-SERVICES", &format!("{spn} cluster IP"), cip, internal_chain));
            } else {
                filter_services.push_str(&to("KUBE-SERVICES", &internal_comment, cip, internal_target));
            }
        }
        // External destinations go to the EXT chain whenever there are endpoints: with
        // externalTrafficPolicy Local and none on this node, EXT still short-circuits pod and
        // node traffic to the cluster endpoints, and what it does not DNAT is dropped in filter.
        // External IPs.
        for eip in &sp.external_ips {
            if has_endpoints {
                nat_services.push_str(&to("KUBE-SERVICES", &format!("{spn} external IP"), eip, &ext_chain));
            }
            if !has_external {
                filter_external.push_str(&to("KUBE-EXTERNAL-SERVICES", &external_comment, eip, external_target));
            }
        }
        // Load-balancer IPs.
        for lip in &sp.load_balancer_ips {
            if has_endpoints {
                nat_services.push_str(&to("KUBE-SERVICES", &format!("{spn} loadbalancer IP"), lip, lb_chain));
                if !sp.source_ranges.is_empty() {
                    let text = format!("{spn} traffic not accepted by {fw_chain}");
                    filter_firewall.push_str(&to("KUBE-PROXY-FIREWALL", &text, lip, "DROP"));
                }
            }
        }
        if !has_external {
            for lip in &sp.load_balancer_ips {
                filter_external.push_str(&to("KUBE-EXTERNAL-SERVICES", &external_comment, lip, external_target));
            }
        }
        // NodePort.
        if let Some(np) = sp.node_port {
            if has_endpoints {
                writeln!(nat_nodeports, "-A KUBE-NODEPORTS {} {pm} --dport {np} -j {ext_chain}", comment(&spn))
                    .unwrap();
            }
            if !has_external {
                writeln!(
                    filter_external,
                    "-A KUBE-EXTERNAL-SERVICES {} -m addrtype --dst-type LOCAL {pm} --dport {np} -j {external_target}",
                    comment(&external_comment)
                )
                .unwrap();
            }
        }
        if let Some(hc) = sp.health_check_node_port {
            writeln!(
                filter_nodeports,
                "-A KUBE-NODEPORTS {} -m tcp -p tcp --dport {hc} -j ACCEPT",
                comment(&format!("{spn} health check node port"))
            )
            .unwrap();
        }
        if !has_endpoints {
            continue;
        }
        if !emit {
            // Unchanged since the last sync: its chains stay as they are in the kernel; only
            // their names are needed (so they are not taken for stale ones).
            kept.extend(uses_cluster.then(|| svc_chain.clone()));
            kept.extend(uses_local.then(|| svl_chain.clone()));
            kept.extend(uses_ext.then(|| ext_chain.clone()));
            kept.extend((uses_ext && !sp.source_ranges.is_empty()).then(|| fw_chain.clone()));
            let used = cluster_eps.iter().filter(|_| uses_cluster).chain(local_eps.iter().filter(|_| uses_local));
            kept.extend(used.map(|e| names::endpoint_chain(&spn, proto, &e.addr())).collect::<BTreeSet<_>>());
            continue;
        }

        // The per-service nat chains, declared in kube-proxy's order.
        let mut chain_rules = String::new();
        if uses_cluster {
            service_chains.push(svc_chain.clone());
        }
        if uses_local {
            service_chains.push(svl_chain.clone());
        }
        if uses_ext {
            service_chains.push(ext_chain.clone());
        }
        if uses_ext && !sp.source_ranges.is_empty() {
            service_chains.push(fw_chain.clone());
        }

        // Off-cluster clients of the ClusterIP are masqueraded (first rule of its chain).
        if let (Some(cip), true) = (&sp.cluster_ip, has_internal) {
            if let Some(cidr) = &cfg.cluster_cidr {
                writeln!(
                    chain_rules,
                    "-A {internal_chain} {} {pm} -d {} --dport {} ! -s {cidr} -j KUBE-MARK-MASQ",
                    comment(&format!("{spn} cluster IP")),
                    host(cip),
                    sp.port
                )
                .unwrap();
            }
        }

        if uses_ext {
            if !sp.external_policy_local {
                if cfg.masquerade_external {
                    writeln!(
                        chain_rules,
                        "-A {ext_chain} {} -j KUBE-MARK-MASQ",
                        comment(&format!("masquerade traffic for {spn} external destinations"))
                    )
                    .unwrap();
                }
            } else {
                if let Some(cidr) = &cfg.cluster_cidr {
                    writeln!(
                        chain_rules,
                        "-A {ext_chain} {} -s {cidr} -j {svc_chain}",
                        comment(&format!("pod traffic for {spn} external destinations"))
                    )
                    .unwrap();
                }
                writeln!(
                    chain_rules,
                    "-A {ext_chain} {} -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
                    comment(&format!("masquerade LOCAL traffic for {spn} external destinations"))
                )
                .unwrap();
                writeln!(
                    chain_rules,
                    "-A {ext_chain} {} -m addrtype --src-type LOCAL -j {svc_chain}",
                    comment(&format!("route LOCAL traffic for {spn} external destinations"))
                )
                .unwrap();
            }
            if has_external {
                writeln!(chain_rules, "-A {ext_chain} -j {external_policy_chain}").unwrap();
            }
            if !sp.source_ranges.is_empty() {
                for range in &sp.source_ranges {
                    writeln!(
                        chain_rules,
                        "-A {fw_chain} {} -s {range} -j {ext_chain}",
                        comment(&format!("{spn} loadbalancer IP"))
                    )
                    .unwrap();
                }
                // VIP-style LBs: the node itself sends with the LB IP as source.
                if sp.source_ranges.iter().any(|r| cfg.node_ips.iter().any(|ip| r.contains(ip))) {
                    for lip in &sp.load_balancer_ips {
                        writeln!(
                            chain_rules,
                            "-A {fw_chain} {} -s {} -j {ext_chain}",
                            comment(&format!("{spn} loadbalancer IP")),
                            host(lip)
                        )
                        .unwrap();
                    }
                }
                writeln!(
                    chain_rules,
                    "-A {fw_chain} {}",
                    comment(&format!("other traffic to {spn} will be dropped by KUBE-PROXY-FIREWALL"))
                )
                .unwrap();
            }
        }

        let mut used: BTreeSet<Endpoint> = BTreeSet::new();
        for (chain, eps, active) in [(&svc_chain, &cluster_eps, uses_cluster), (&svl_chain, &local_eps, uses_local)] {
            if !active {
                continue;
            }
            let with_sep: Vec<(String, &Endpoint)> =
                eps.iter().map(|e| (names::endpoint_chain(&spn, proto, &e.addr()), e)).collect();
            if let Some(secs) = sp.affinity_seconds {
                for (sep, e) in &with_sep {
                    writeln!(
                        chain_rules,
                        "-A {chain} {} -m recent --name {sep} --rcheck --seconds {secs} --reap -j {sep}",
                        comment(&format!("{spn} -> {}", e.addr()))
                    )
                    .unwrap();
                }
            }
            let n = with_sep.len();
            for (i, (sep, e)) in with_sep.iter().enumerate() {
                let stat = if i + 1 < n {
                    format!(" -m statistic --mode random --probability {}", probability(i, n))
                } else {
                    String::new()
                };
                writeln!(chain_rules, "-A {chain} {}{stat} -j {sep}", comment(&format!("{spn} -> {}", e.addr())))
                    .unwrap();
                used.insert((*e).clone());
            }
        }
        for e in &used {
            let sep = names::endpoint_chain(&spn, proto, &e.addr());
            service_chains.push(sep.clone());
            writeln!(chain_rules, "-A {sep} {} -s {} -j KUBE-MARK-MASQ", comment(&spn), host(&e.ip)).unwrap();
            let recent =
                if sp.affinity_seconds.is_some() { format!(" -m recent --name {sep} --set") } else { String::new() };
            writeln!(chain_rules, "-A {sep} {}{recent} {pm} -j DNAT --to-destination {}", comment(&spn), e.addr())
                .unwrap();
        }
        nat_chains.extend(service_chains);
        nat.push_str(&chain_rules);
    }

    // filter
    filter.push_str("*filter\n");
    for c in ["KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL"] {
        writeln!(filter, ":{c} - [0:0]").unwrap();
    }
    filter.push_str(&filter_nodeports);
    filter.push_str(&filter_services);
    filter.push_str(&filter_external);
    filter.push_str("-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n");
    writeln!(
        filter,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {MASQ_MARK}/{MASQ_MARK} -j ACCEPT"
    )
    .unwrap();
    filter.push_str(
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n",
    );
    filter.push_str(&filter_firewall);
    filter.push_str("COMMIT\n");

    // nat
    let mut out = filter;
    out.push_str("*nat\n");
    for c in ["KUBE-NODEPORTS", "KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING"] {
        writeln!(out, ":{c} - [0:0]").unwrap();
    }
    let active: BTreeSet<String> = nat_chains.iter().chain(&kept).cloned().collect();
    for c in &nat_chains {
        writeln!(out, ":{c} - [0:0]").unwrap();
    }
    let stale: Vec<&String> =
        existing_nat_chains.iter().filter(|c| names::is_service_chain(c) && !active.contains(*c)).collect();
    for c in &stale {
        writeln!(out, ":{c} - [0:0]").unwrap();
    }
    out.push_str(&nat_nodeports);
    out.push_str(&nat_services);
    out.push_str(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n",
    );
    writeln!(out, "-A KUBE-MARK-MASQ -j MARK --or-mark {MASQ_MARK}").unwrap();
    writeln!(out, "-A KUBE-POSTROUTING -m mark ! --mark {MASQ_MARK}/{MASQ_MARK} -j RETURN").unwrap();
    writeln!(out, "-A KUBE-POSTROUTING -j MARK --xor-mark {MASQ_MARK}").unwrap();
    writeln!(
        out,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if cfg.random_fully { " --random-fully" } else { "" }
    )
    .unwrap();
    out.push_str(&nat);
    for c in &stale {
        writeln!(out, "-X {c}").unwrap();
    }
    out.push_str("COMMIT\n");
    Rendered { text: out, nat_chains: active }
}

#[cfg(test)]
mod tests {
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
        RenderConfig {
            node_name: "node-1".into(),
            node_ips: vec!["192.168.56.11".parse().unwrap()],
            cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
            masquerade_external: true,
            random_fully: true,
        }
    }

    /// Every feature in one ruleset, compared whole with a file reviewed rule by rule against
    /// kube-proxy's shapes (reference/kube-proxy.md §1.4).
    fn services() -> Vec<ServiceState> {
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
        let golden = include_str!("testdata/golden.rules");
        if out.text != golden {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/proxy/testdata/golden.rules.new");
            std::fs::write(path, &out.text).unwrap();
            panic!("the ruleset differs from testdata/golden.rules; the new one is in {path}");
        }
        assert!(out.nat_chains.contains("KUBE-SVC-XPGD46QRK7WJZT7O"));
        assert!(!out.nat_chains.contains("KUBE-SEP-STALESTALESTALE"));
        assert_eq!(testkit::iptables::lint(&out.text, TOP_LEVEL), Vec::<String>::new());
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
    ];

    #[test]
    fn every_single_service_renders_without_lint_problems() {
        // Each service of the golden set alone, with and without endpoints: no dangling,
        // empty or unused chain in any combination.
        for st in services() {
            for eps in [st.endpoints.clone(), vec![]] {
                let one = ServiceState { port: st.port.clone(), endpoints: eps };
                let out = render(&cfg(), &[one], &BTreeSet::new());
                assert_eq!(testkit::iptables::lint(&out.text, TOP_LEVEL), Vec::<String>::new(), "{}", st.port.spn());
            }
        }
    }

    #[test]
    fn a_partial_sync_rewrites_only_the_changed_services_chains() {
        let all = services();
        let full = render(&cfg(), &all, &BTreeSet::new());
        let changed: BTreeSet<String> = [service_key(&all[0].port)].into();
        let part = render_partial(&cfg(), &all, &full.nat_chains, &changed);
        assert_eq!(part.nat_chains, full.nat_chains, "unchanged chains stay active (not stale)");
        assert!(part.text.contains(":KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]"));
        assert!(part.text.contains("-A KUBE-SVC-XPGD46QRK7WJZT7O "));
        assert!(!part.text.contains("KUBE-SVC-NUKIZ6OKUXPJNT4C -"), "svc5's chain is not touched");
        // The top-level chains are complete either way.
        let top = |t: &str| {
            t.lines().filter(|l| l.starts_with("-A KUBE-SERVICES") || l.starts_with("-A KUBE-NODEPORTS")).count()
        };
        assert_eq!(top(&part.text), top(&full.text));
        assert!(!part.text.contains("-X "), "nothing is stale");
    }

    #[test]
    fn probabilities_are_kube_proxys() {
        assert_eq!(probability(0, 2), "0.5000000000");
        assert_eq!(probability(0, 3), "0.3333333333");
        assert_eq!(probability(1, 3), "0.5000000000");
    }

    #[test]
    fn masquerade_knob_removes_only_the_external_masquerade() {
        let mut c = cfg();
        c.masquerade_external = false;
        let out = render(&c, &services(), &BTreeSet::new()).text;
        assert!(!out.contains("masquerade traffic for"));
        assert!(out.contains("! -s 10.244.0.0/16 -j KUBE-MARK-MASQ"), "the ClusterIP masquerade stays");
    }
}
