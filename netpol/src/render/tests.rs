//! The rendered rules, interpreted packet by packet over the upstream suite's 3 × 3 world
//! spread over two nodes, against the pure model (`api::netpol::connection`), for every case of
//! `testdata/netpol-cases.yaml`.

use super::*;

/// The upstream suite's 3 × 3 world over two nodes' pod CIDRs: a and b on node-1, c on node-2.
pub(crate) fn world() -> Vec<Pod> {
    netpol::suite_world(|i, j| format!("10.244.{}.{}", if j == 2 { 2 } else { 1 }, 10 + i * 3 + j).parse().unwrap())
}

/// The world at IPv6 addresses: fd00:10:244:1::M and fd00:10:244:2::M.
pub(crate) fn world_v6() -> Vec<Pod> {
    netpol::suite_world(|i, j| {
        format!("fd00:10:244:{}::{}", if j == 2 { 2 } else { 1 }, 10 + i * 3 + j).parse().unwrap()
    })
}

/// The cases for IPv6 pods: the pod network fd00:10:244::/56, single addresses as /128.
pub(crate) fn cases_v6(pods: &[Pod]) -> Vec<(String, Vec<NetworkPolicy>)> {
    let v4 = cases(pods, "fd00:10:244::/56");
    v4.into_iter()
        .map(|(name, policies)| {
            let text = serde_json::to_string(&policies).unwrap().replace("/32\"", "/128\"");
            (name, serde_json::from_str(&text).unwrap())
        })
        .collect()
}

/// The cases, with placeholders filled for `pods`.
pub(crate) fn cases(pods: &[Pod], pod_cidr: &str) -> Vec<(String, Vec<NetworkPolicy>)> {
    let text = include_str!("../../testdata/netpol-cases.yaml");
    let mut filled = text.replace("{pods}", pod_cidr);
    for p in pods {
        filled = filled.replace(&format!("{{ip:{}/{}}}", p.namespace, p.name), &p.ip.to_string());
    }
    let raw: Vec<serde_json::Value> = serde_yaml::from_str(&filled).expect("cases parse");
    raw.into_iter()
        .map(|c| {
            let name = c["name"].as_str().unwrap().to_string();
            let policies = c["policies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    let mut p: NetworkPolicy = serde_json::from_value(p.clone()).unwrap();
                    api::ApiObject::apply_defaults(&mut p);
                    p
                })
                .collect();
            (name, policies)
        })
        .collect()
}

/// A packet as the interpreter sees it.
#[derive(Clone, Copy)]
struct Packet<'a> {
    src: IpAddr,
    dst: IpAddr,
    proto: &'a str,
    dport: u16,
}

fn in_set(t: &NftTable, set: &str, key: &[String]) -> bool {
    let s = t.set(set).unwrap_or_else(|| panic!("rule names a missing set {set}"));
    s.elements.values().any(|e| e.fields().eq(key.iter().map(String::as_str)))
}

fn in_cidr(ip: IpAddr, cidr: &str) -> bool {
    cidr.parse::<ipnet::IpNet>().unwrap_or_else(|_| panic!("{cidr}")).contains(&ip)
}

/// Whether every match of `rule` holds for `p` (the verdict word ends the matches).
fn matches(t: &NftTable, rule: &str, p: Packet<'_>) -> (bool, String) {
    let rule = rule.split(" comment \"").next().unwrap();
    let tokens: Vec<&str> = rule.split_whitespace().collect();
    let mut i = 0;
    let mut ok = true;
    let addr = |w: &str| if w == "saddr" { p.src } else { p.dst };
    while i < tokens.len() {
        match tokens[i] {
            "accept" | "return" | "drop" => return (ok, tokens[i].to_string()),
            "ip" | "ip6" if tokens[i + 1] == "daddr" && tokens.get(i + 2) == Some(&".") => {
                // ip daddr . meta l4proto . th dport @set
                let set = tokens[i + 8].trim_start_matches('@');
                ok &= in_set(t, set, &[p.dst.to_string(), p.proto.to_string(), p.dport.to_string()]);
                i += 9;
            }
            "ip" | "ip6" => {
                let a = addr(tokens[i + 1]);
                let arg = tokens[i + 2];
                if arg == "!=" {
                    // != { n, n }
                    let mut j = i + 4;
                    let mut any = false;
                    while tokens[j] != "}" {
                        any |= in_cidr(a, tokens[j].trim_end_matches(','));
                        j += 1;
                    }
                    ok &= !any;
                    i = j + 1;
                } else if let Some(set) = arg.strip_prefix('@') {
                    ok &= in_set(t, set, &[a.to_string()]);
                    i += 3;
                } else {
                    ok &= in_cidr(a, arg);
                    i += 3;
                }
            }
            "meta" => {
                ok &= tokens[i + 2] == p.proto;
                i += 3;
            }
            proto @ ("tcp" | "udp" | "sctp") => {
                assert_eq!(tokens[i + 1], "dport");
                let (lo, hi) = match tokens[i + 2].split_once('-') {
                    Some((l, h)) => (l.parse::<u16>().unwrap(), h.parse::<u16>().unwrap()),
                    None => (tokens[i + 2].parse().unwrap(), tokens[i + 2].parse().unwrap()),
                };
                ok &= proto == p.proto && (lo..=hi).contains(&p.dport);
                i += 3;
            }
            other => panic!("the interpreter does not know {other:?} in {rule:?}"),
        }
    }
    panic!("no verdict in {rule:?}")
}

/// Runs a jumped-to chain: Some(true) accepted, Some(false) dropped, None returned.
fn run_chain(t: &NftTable, chain: &str, p: Packet<'_>) -> Option<bool> {
    for rule in &t.chain(chain).unwrap_or_else(|| panic!("missing chain {chain}")).rules {
        let (hit, verdict) = matches(t, rule, p);
        if hit {
            return match verdict.as_str() {
                "accept" => Some(true),
                "drop" => Some(false),
                _ => None,
            };
        }
    }
    None
}

/// What one node's forward hook does with a new connection's first packet: passes it or not.
fn forward(t: &NftTable, p: Packet<'_>) -> bool {
    let lookup = |map: &str, ip: IpAddr| {
        t.set(map)
            .unwrap()
            .elements
            .values()
            .find(|e| e.key_text() == ip.to_string())
            .map(|e| e.value.as_deref().unwrap().strip_prefix("jump ").expect("a jump").to_string())
    };
    if let Some(chain) = lookup(EGRESS_PODS, p.src) {
        if let Some(verdict) = run_chain(t, &chain, p) {
            return verdict;
        }
    }
    if let Some(chain) = lookup(INGRESS_PODS, p.dst) {
        if let Some(verdict) = run_chain(t, &chain, p) {
            return verdict;
        }
    }
    true
}

fn node_of(p: &Pod) -> u8 {
    if p.name == "c" {
        2
    } else {
        1
    }
}

#[test]
fn every_case_enforces_what_the_model_decides_for_every_pair_port_and_protocol() {
    every_case_in(false);
}

/// The same over IPv6 addresses (the `ip6 podpath-policy` table of a dual-stack or IPv6 node):
/// pods at fd00:10:244:N::M, ipBlocks of IPv6 prefixes.
#[test]
fn the_ipv6_table_enforces_what_the_model_decides_for_every_case() {
    every_case_in(true);
}

fn every_case_in(v6: bool) {
    let pods = if v6 { world_v6() } else { world() };
    let mut checked = 0;
    let all_cases = if v6 { cases_v6(&pods) } else { cases(&pods, "10.244.0.0/16") };
    for (case, policies) in all_cases {
        let tables: Vec<NftTable> =
            [1u8, 2].iter().map(|n| nft(&plan_family(&policies, &pods, &|p: &Pod| node_of(p) == *n, v6))).collect();
        if v6 {
            assert_eq!(tables[0].family, NftFamily::Ip6);
            assert!(tables[0].chains[0].rules.iter().all(|r| !r.contains("ip saddr") && !r.contains("ip daddr")));
        }
        for src in &pods {
            for dst in &pods {
                for (port, proto) in [(80, "tcp"), (81, "tcp"), (80, "udp"), (81, "udp")] {
                    let p = Packet { src: src.ip, dst: dst.ip, proto, dport: port };
                    // The source's node, then the destination's (once when they share one).
                    let mut nodes = vec![node_of(src)];
                    if node_of(dst) != node_of(src) {
                        nodes.push(node_of(dst));
                    }
                    let got = nodes.iter().all(|n| forward(&tables[*n as usize - 1], p));
                    let want =
                        netpol::connection(&policies, &End::Pod(src), &End::Pod(dst), port, &proto.to_uppercase());
                    assert_eq!(
                        got,
                        want.allowed(),
                        "case {case}: {}/{} → {}/{} {proto}/{port}: rules say {got}, the model {}",
                        src.namespace,
                        src.name,
                        dst.namespace,
                        dst.name,
                        want.explain(&End::Pod(src), &End::Pod(dst))
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 25 * 81 * 4, "{checked}");
}

/// The iptables form of the same cases, traced through `testkit::iptables` (restore semantics,
/// conntrack: every traced packet is NEW) from the FORWARD jump of each node.
#[test]
fn the_iptables_form_enforces_the_same_for_every_case() {
    use testkit::iptables::{FakeIptables, Packet as IptPacket, Tracer, Verdict};
    let pods = world();
    for (case, policies) in cases(&pods, "10.244.0.0/16") {
        let nodes: Vec<FakeIptables> = [1u8, 2]
            .iter()
            .map(|n| {
                let mut f = FakeIptables::default();
                let table = iptables(&plan(&policies, &pods, &|p: &Pod| node_of(p) == *n));
                f.restore(&podpath_ruleset::Ruleset { tables: vec![table] }).unwrap_or_else(|e| panic!("{case}: {e}"));
                f
            })
            .collect();
        for src in &pods {
            for dst in &pods {
                for (port, proto) in [(80, "tcp"), (81, "udp")] {
                    let mut hosts = vec![node_of(src)];
                    if node_of(dst) != node_of(src) {
                        hosts.push(node_of(dst));
                    }
                    let got = hosts.iter().all(|n| {
                        let mut t = Tracer::new(&nodes[*n as usize - 1], vec![]);
                        let packet = IptPacket { src: src.ip, dst: dst.ip, proto: proto.into(), dport: port, mark: 0 };
                        t.trace("filter", IPT_CHAIN, packet).verdict != Verdict::Drop
                    });
                    let want =
                        netpol::connection(&policies, &End::Pod(src), &End::Pod(dst), port, &proto.to_uppercase());
                    assert_eq!(
                        got,
                        want.allowed(),
                        "case {case}: {}/{} → {}/{} {proto}/{port}",
                        src.namespace,
                        src.name,
                        dst.namespace,
                        dst.name
                    );
                }
            }
        }
    }
}

#[test]
fn an_except_leaves_the_fewest_prefixes() {
    let n = |s: &str| s.parse::<IpNet>().unwrap();
    assert_eq!(cidr_minus(n("10.0.0.0/30"), &[n("10.0.0.1/32")]), [n("10.0.0.0/32"), n("10.0.0.2/31")]);
    assert_eq!(cidr_minus(n("10.0.0.0/8"), &[]), [n("10.0.0.0/8")]);
    assert!(cidr_minus(n("10.1.0.0/16"), &[n("10.0.0.0/8")]).is_empty());
    assert_eq!(cidr_minus(n("10.244.0.0/16"), &[n("10.244.1.7/32")]).len(), 16);
}

#[test]
fn the_iptables_form_reads_as_kube_router_writes_it() {
    let pods = world();
    let (_, policies) =
        cases(&pods, "10.244.0.0/16").into_iter().find(|(n, _)| n == "allow-port-81-from-namespace-y").unwrap();
    let t = iptables(&plan(&policies, &pods, &|p: &Pod| node_of(p) == 1));
    let text = podpath_ruleset::Ruleset { tables: vec![t] }.to_string();
    let chain = ipt_chain(Direction::Ingress, "x/a");
    assert!(chain.len() <= 28, "{chain}");
    for want in [
        "-A PODPATH-POLICY -m conntrack --ctstate RELATED,ESTABLISHED".to_string(),
        format!("-A PODPATH-POLICY -d 10.244.1.10/32 -m comment --comment \"Ingress of pod x/a\" -j {chain}"),
        format!("-A {chain} -s 10.244.1.13/32 -p tcp -m tcp --dport 81 -m comment --comment \"x/y-81 ingress[0] from[0] ports[0]\" -j ACCEPT"),
        format!("-A {chain} -m comment --comment \"no policy allows this ingress (isolated by x/y-81)\" -j DROP"),
    ] {
        assert!(text.contains(&want), "{want:?} missing from\n{text}");
    }
}

#[test]
fn the_table_reads_as_per_pod_chains_named_rules_and_peer_sets() {
    let pods = world();
    let (_, policies) =
        cases(&pods, "10.244.0.0/16").into_iter().find(|(n, _)| n == "allow-port-81-from-namespace-y").unwrap();
    let t = render(&policies, &pods, &|p: &Pod| node_of(p) == 1);
    let text = podpath_ruleset::nft::Transaction::between(None, &t).0.text();
    for want in [
        "ip saddr vmap @egress-pods",
        "ip daddr vmap @ingress-pods",
        "10.244.1.10 : jump ingress-x/a",
        "ip saddr @from-x/y-81-0-0 tcp dport 81 accept comment \"x/y-81 ingress[0] from[0] ports[0]\"",
        "drop comment \"no policy allows this ingress (isolated by x/y-81)\"",
        "ct state established,related accept",
    ] {
        assert!(text.contains(want), "{want:?} missing from\n{text}");
    }
    // Only x/a is isolated; the peer set holds y's pods of every node.
    assert_eq!(t.set(INGRESS_PODS).unwrap().elements.len(), 1);
    assert_eq!(t.set(EGRESS_PODS).unwrap().elements.len(), 0);
    assert_eq!(t.set("from-x/y-81-0-0").unwrap().elements.len(), 3);
}

#[test]
fn a_label_change_on_one_pod_moves_a_few_elements_not_chains() {
    let mut pods = world();
    let (_, policies) =
        cases(&pods, "10.244.0.0/16").into_iter().find(|(n, _)| n == "allow-from-pod-b-in-any-namespace").unwrap();
    let before = render(&policies, &pods, &|p: &Pod| node_of(p) == 1);
    // y/c (node-2) becomes a `b`: one more address in x/a's peer set on node-1.
    let yc = pods.iter_mut().find(|p| p.namespace == "y" && p.name == "c").unwrap();
    yc.labels.insert("pod".into(), "b".into());
    let after = render(&policies, &pods, &|p: &Pod| node_of(p) == 1);
    let (tx, stale) = podpath_ruleset::nft::Transaction::between(Some(&before), &after);
    assert!(stale.is_empty());
    assert_eq!(
        tx.text().lines().collect::<Vec<_>>(),
        ["add element ip podpath-policy from-x/any-b-0-0 { 10.244.2.15 }"]
    );
}

#[test]
fn long_names_are_shortened_and_comments_fit_the_kernel() {
    let long = "n".repeat(250);
    assert!(name("ingress", &format!("x/{long}")).len() < 40);
    assert_eq!(name("ingress", "x/a"), "ingress-x/a");
    let c = comment(&"é".repeat(200));
    assert!(c.len() <= COMMENT_MAX && c.ends_with('…'));
    assert!(!comment("a \"quoted\" word").contains('"'));
}
