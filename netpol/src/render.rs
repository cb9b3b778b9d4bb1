//! NetworkPolicies → what one node enforces (pure): [`plan`] lists, per local pod and
//! direction, the lines of every policy that isolates it (one per rule × peer × port, commented
//! `NS/POLICY ingress[i] from[j] ports[k]`); two printers write it in the proxy's language, in
//! the per-pod-chain form of kube-router and Calico:
//!
//! - [`nft`]: the table `ip podpath-policy` — a `forward` chain where established and related
//!   packets pass, then a packet *from* a local pod isolated for egress jumps to its
//!   `egress-NS/NAME` chain (map `egress-pods`) and one *to* a pod isolated for ingress to its
//!   `ingress-NS/NAME` chain (map `ingress-pods`); a peer selecting pods is a named set of their
//!   addresses (`from-NS/POLICY-i-j`), so a label change moves a few elements; egress to a named
//!   port is a set of (address, protocol, port) of the pods that name it;
//! - [`iptables`]: filter chains — `PODPATH-POLICY` (established passes, then a jump per isolated
//!   pod and direction) and `PODPATH-ING-…`/`PODPATH-EGR-…` per pod, one rule per peer address
//!   and port, an ipBlock's `except` as the prefixes that remain ([`cidr_minus`]).
//!
//! A matching line passes (`return` for egress, so the destination's ingress is still checked;
//! `accept` for ingress); a pod's chain ends in a commented drop.
//!
//! The forward hook sees traffic after kube-proxy's DNAT (destination: the chosen pod) and
//! before its masquerade (source: the client), which is what real implementations see; traffic
//! the node itself sends to its pods (probes, the userspace proxy) takes the output hook and is
//! never filtered. Same-node pod traffic reaches the forward hook because the bridge routes it
//! (`routeSameBridge` in the CNI configuration). What a connection is allowed by is decided by
//! `api::netpol`, whose predicates these rules are built from.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use api::k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use api::netpol::{self, Direction, End, Pod};
use podpath_ruleset::nft::{Chain, Element, NftFamily, NftTable, Set};
use podpath_ruleset::Table;

/// The table's name.
pub const TABLE: &str = "podpath-policy";
/// The maps from a local pod's address to its chains.
pub const INGRESS_PODS: &str = "ingress-pods";
pub const EGRESS_PODS: &str = "egress-pods";

/// nftables keeps comments of at most 128 bytes.
const COMMENT_MAX: usize = 127;
/// Names (chains, sets) longer than this are shortened with a hash.
const NAME_MAX: usize = 200;

/// One isolated local pod's rules for one direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodChain {
    pub direction: Direction,
    /// `namespace/name`.
    pub pod: String,
    pub ip: IpAddr,
    pub lines: Vec<Line>,
    /// The policies that isolate it (`namespace/name`).
    pub isolated_by: Vec<String>,
}

/// One (rule, peer, port) of a policy: what the other end and the port must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub peer: Peer,
    pub port: Port,
    /// `NS/POLICY ingress[i] from[j] ports[k]`.
    pub comment: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    Any,
    /// The addresses of the pods a selector picks (a named set in nftables).
    Pods {
        set: String,
        comment: String,
        addrs: BTreeSet<IpAddr>,
    },
    /// An ipBlock of the plan's family.
    Block {
        cidr: IpNet,
        except: Vec<IpNet>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Port {
    Any,
    /// A protocol without a port.
    Proto(String),
    /// `lo`…`hi` of a protocol (one port when equal).
    Range {
        proto: String,
        lo: u16,
        hi: u16,
    },
    /// Egress to a named port: the destinations (address, protocol, number) that name it and
    /// match the peer (the line's peer is then `Any`).
    Named {
        set: String,
        comment: String,
        dests: BTreeSet<(IpAddr, String, u16)>,
    },
}

/// What a node enforces for one IP family, before it is written in either rule language.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The IPv6 plan (table `ip6 podpath-policy`, ip6tables); else IPv4.
    pub v6: bool,
    pub chains: Vec<PodChain>,
}

/// The IPv4 plan for the pods of one node ([`plan_family`]).
pub fn plan(policies: &[NetworkPolicy], pods: &[Pod], local: &dyn Fn(&Pod) -> bool) -> Plan {
    plan_family(policies, pods, local, false)
}

/// The plan of one family for the pods of one node: `pods` are every pod of the pod network,
/// each with its address of that family (pods without one are left out by the caller),
/// `local` says which of them run on this node; ipBlocks of the other family are no peers here
/// (a dual-stack node enforces each family with its own table, as Calico does).
pub fn plan_family(policies: &[NetworkPolicy], pods: &[Pod], local: &dyn Fn(&Pod) -> bool, v6: bool) -> Plan {
    let mut sorted: Vec<&NetworkPolicy> = policies.iter().collect();
    sorted.sort_by_key(|p| key(p));
    let mut out = Plan { v6, chains: vec![] };
    for pod in pods.iter().filter(|p| local(p)) {
        let ip = pod.ip;
        if ip.is_ipv6() != v6 {
            continue;
        }
        for direction in [Direction::Ingress, Direction::Egress] {
            let isolating: Vec<&NetworkPolicy> = sorted
                .iter()
                .copied()
                .filter(|p| netpol::selects_pod(p, pod) && netpol::types(p).contains(&direction))
                .collect();
            if isolating.is_empty() {
                continue;
            }
            out.chains.push(PodChain {
                direction,
                pod: format!("{}/{}", pod.namespace, pod.name),
                ip,
                lines: isolating.iter().flat_map(|p| policy_lines(p, direction, pod, pods, v6)).collect(),
                isolated_by: isolating.iter().map(|p| key(p)).collect(),
            });
        }
    }
    out
}

/// The nftables table for the pods of one node (see the module's text).
pub fn render(policies: &[NetworkPolicy], pods: &[Pod], local: &dyn Fn(&Pod) -> bool) -> NftTable {
    nft(&plan(policies, pods, local))
}

fn drop_comment(c: &PodChain) -> String {
    comment(&format!(
        "no policy allows this {} (isolated by {})",
        c.direction.name().to_lowercase(),
        c.isolated_by.join(", ")
    ))
}

fn verdict_of(d: Direction) -> (&'static str, &'static str) {
    match d {
        Direction::Ingress => ("saddr", "accept"),
        Direction::Egress => ("daddr", "return"),
    }
}

/// The plan as one nftables table.
pub fn nft(plan: &Plan) -> NftTable {
    // The family's words: `ip`/`ip6`, `ipv4_addr`/`ipv6_addr`.
    let (ip, addr_type) = if plan.v6 { ("ip6", "ipv6_addr") } else { ("ip", "ipv4_addr") };
    let mut t = NftTable::new(if plan.v6 { NftFamily::Ip6 } else { NftFamily::Ip }, TABLE);
    t.comment = Some("NetworkPolicy enforcement by the podpath node agent".into());
    t.add_chain(
        Chain::base("forward", "filter", "forward", 0)
            .rule("ct state established,related accept")
            .rule(format!("{ip} saddr vmap @{EGRESS_PODS}"))
            .rule(format!("{ip} daddr vmap @{INGRESS_PODS}")),
    );
    t.sets.push(Set::map(INGRESS_PODS, addr_type, "verdict").with_comment("local pods isolated for ingress"));
    t.sets.push(Set::map(EGRESS_PODS, addr_type, "verdict").with_comment("local pods isolated for egress"));
    let mut sets: BTreeMap<String, Set> = BTreeMap::new();
    for c in &plan.chains {
        let chain_name = name(direction_word(c.direction), &c.pod);
        let (addr, verdict) = verdict_of(c.direction);
        let mut chain =
            Chain::regular(&chain_name).with_comment(comment(&format!("{} of pod {}", c.direction.name(), c.pod)));
        for l in &c.lines {
            let peer = match &l.peer {
                Peer::Any => String::new(),
                Peer::Pods { set, comment, addrs } => {
                    let mut s = Set::plain(set, addr_type).with_comment(comment.clone());
                    for a in addrs {
                        s.insert(Element::key(&[&a.to_string()]));
                    }
                    sets.insert(set.clone(), s);
                    format!("{ip} {addr} @{set} ")
                }
                Peer::Block { cidr, except } => {
                    let mut text = format!("{ip} {addr} {cidr} ");
                    if !except.is_empty() {
                        let list: Vec<String> = except.iter().map(|e| e.to_string()).collect();
                        text.push_str(&format!("{ip} {addr} != {{ {} }} ", list.join(", ")));
                    }
                    text
                }
            };
            let port = match &l.port {
                Port::Any => String::new(),
                Port::Proto(p) => format!("meta l4proto {p} "),
                Port::Range { proto, lo, hi } if lo == hi => format!("{proto} dport {lo} "),
                Port::Range { proto, lo, hi } => format!("{proto} dport {lo}-{hi} "),
                Port::Named { set, comment, dests } => {
                    let mut s = Set::plain(set, &format!("{addr_type} . inet_proto . inet_service"))
                        .with_comment(comment.clone());
                    for (a, proto, n) in dests {
                        s.insert(Element::key(&[&a.to_string(), proto, &n.to_string()]));
                    }
                    sets.insert(set.clone(), s);
                    format!("{ip} daddr . meta l4proto . th dport @{set} ")
                }
            };
            chain = chain.rule(format!("{peer}{port}{verdict} comment {}", quoted(&l.comment)));
        }
        chain = chain.rule(format!("drop comment {}", quoted(&drop_comment(c))));
        t.add_chain(chain);
        let map = if c.direction == Direction::Ingress { INGRESS_PODS } else { EGRESS_PODS };
        t.add_element(map, Element::key(&[&c.ip.to_string()]).to(format!("jump {chain_name}")));
    }
    t.sets.extend(sets.into_values());
    t
}

/// The chain of the filter table every forwarded packet goes through first (iptables modes).
pub const IPT_CHAIN: &str = "PODPATH-POLICY";

/// An iptables chain of one pod and direction: `PODPATH-ING-`/`PODPATH-EGR-` + 16 characters
/// of a hash of `namespace/name` (iptables keeps names to 28 characters).
pub fn ipt_chain(direction: Direction, pod: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(pod.as_bytes());
    let prefix = if direction == Direction::Ingress { "PODPATH-ING-" } else { "PODPATH-EGR-" };
    format!("{prefix}{}", &data_encoding::BASE32.encode(&digest)[..16])
}

/// The plan as filter-table chains (iptables modes): `PODPATH-POLICY` (established passes,
/// then a jump per isolated pod and direction, commented with the pod) and a chain per pod
/// whose lines are one rule per peer address or prefix and port; sets become address lists
/// and an ipBlock's `except` becomes the prefixes that remain.
pub fn iptables(plan: &Plan) -> Table {
    use podpath_ruleset::{Addr, Match, Rule};
    let mut t = Table::new("filter");
    t.declare(IPT_CHAIN);
    t.append(
        Rule::new(IPT_CHAIN)
            .ct_state(&["RELATED", "ESTABLISHED"])
            .comment("connections made before a policy keep working")
            .jump("ACCEPT"),
    );
    let host = |ip: IpAddr| Addr::Net(IpNet::from(ip));
    let mut jumps = vec![];
    let mut chains = vec![];
    for c in &plan.chains {
        let chain = ipt_chain(c.direction, &c.pod);
        let jump = match c.direction {
            Direction::Egress => Rule::new(IPT_CHAIN).src(host(c.ip)),
            Direction::Ingress => Rule::new(IPT_CHAIN).dst(host(c.ip)),
        };
        jumps.push((c.direction, jump.comment(format!("{} of pod {}", c.direction.name(), c.pod)).jump(&chain)));
        let (_, verdict) = verdict_of(c.direction);
        let verdict = if verdict == "accept" { "ACCEPT" } else { "RETURN" };
        let addr_match = |r: Rule, a: Addr| match c.direction {
            Direction::Ingress => r.src(a),
            Direction::Egress => r.dst(a),
        };
        let mut rules = vec![];
        for l in &c.lines {
            let peers: Vec<Option<Addr>> = match &l.peer {
                Peer::Any => vec![None],
                Peer::Pods { addrs, .. } => addrs.iter().map(|a| Some(host(*a))).collect(),
                Peer::Block { cidr, except } => {
                    cidr_minus(*cidr, except).into_iter().map(|n| Some(Addr::Net(n))).collect()
                }
            };
            let ports: Vec<IptPort> = match &l.port {
                Port::Any => vec![(None, None)],
                Port::Proto(p) => vec![(None, Some((p.clone(), None)))],
                Port::Range { proto, lo, hi } if lo == hi => vec![(None, Some((proto.clone(), Some(lo.to_string()))))],
                Port::Range { proto, lo, hi } => vec![(None, Some((proto.clone(), Some(format!("{lo}:{hi}")))))],
                Port::Named { dests, .. } => dests
                    .iter()
                    .map(|(ip, proto, n)| (Some(host(*ip)), Some((proto.clone(), Some(n.to_string())))))
                    .collect(),
            };
            for peer in &peers {
                for (dest, port) in &ports {
                    let mut r = Rule::new(&chain);
                    if let Some(a) = peer {
                        r = addr_match(r, *a);
                    }
                    if let Some(d) = dest {
                        r = r.dst(*d);
                    }
                    if let Some((proto, number)) = port {
                        r = match number {
                            Some(n) => r
                                .with(Match::Protocol { proto: proto.clone(), negated: false })
                                .with(Match::Module(proto.clone()))
                                .with(Match::DestinationPort { port: n.clone(), negated: false }),
                            None => r.with(Match::Protocol { proto: proto.clone(), negated: false }),
                        };
                    }
                    rules.push(r.comment(l.comment.clone()).jump(verdict));
                }
            }
        }
        rules.push(Rule::new(&chain).comment(drop_comment(c)).jump("DROP"));
        chains.push((chain, rules));
    }
    // Egress checks first: a packet must pass its source's egress, then its destination's
    // ingress.
    jumps.sort_by_key(|(d, _)| *d == Direction::Ingress);
    for (_, j) in jumps {
        t.append(j);
    }
    for (name, rules) in chains {
        t.declare(&name);
        for r in rules {
            t.append(r);
        }
    }
    t
}

/// One port match of an iptables rule: a destination (egress to a named port) and the
/// protocol with its port or range (`80`, `80:90`).
type IptPort = (Option<podpath_ruleset::Addr>, Option<(String, Option<String>)>);

/// `net` without the `except` prefixes, as the fewest prefixes that remain.
pub fn cidr_minus(net: IpNet, except: &[IpNet]) -> Vec<IpNet> {
    if except.iter().any(|e| e.contains(&net)) {
        return vec![];
    }
    if !except.iter().any(|e| net.contains(e)) {
        return vec![net];
    }
    // Some except lies strictly inside: split in halves and look again.
    let Ok(halves) = net.subnets(net.prefix_len() + 1) else { return vec![] };
    halves.flat_map(|h| cidr_minus(h, except)).collect()
}

fn key(p: &NetworkPolicy) -> String {
    format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or("default"), p.metadata.name.as_deref().unwrap_or(""))
}

fn direction_word(d: Direction) -> &'static str {
    match d {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    }
}

/// `PREFIX-REST`, or `PREFIX-<hash>` when that would be too long for the kernel.
fn name(prefix: &str, rest: &str) -> String {
    let n = format!("{prefix}-{rest}");
    if n.len() <= NAME_MAX {
        return n;
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(rest.as_bytes());
    format!("{prefix}-{}", data_encoding::BASE32.encode(&digest)[..16].to_ascii_lowercase())
}

fn comment(text: &str) -> String {
    let mut s = text.replace('"', "'");
    if s.len() > COMMENT_MAX {
        let mut cut = COMMENT_MAX - 1;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
        while s.len() > COMMENT_MAX {
            s.pop();
            s.pop();
            s.push('…');
        }
    }
    s
}

fn quoted(text: &str) -> String {
    format!("\"{}\"", comment(text))
}

/// The lines one policy gives `pod`'s chain for `direction`.
fn policy_lines(p: &NetworkPolicy, direction: Direction, pod: &Pod, pods: &[Pod], v6: bool) -> Vec<Line> {
    let policy = key(p);
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let (peer_word, set_prefix) = match direction {
        Direction::Ingress => ("from", "from"),
        Direction::Egress => ("to", "to"),
    };
    let dir = direction_word(direction);
    let mut out = vec![];
    for (i, (peers, ports)) in netpol::rules(p, direction).iter().enumerate() {
        let peers: Vec<(Option<usize>, Option<&NetworkPolicyPeer>)> = match peers.as_deref() {
            None | Some([]) => vec![(None, None)],
            Some(list) => list.iter().enumerate().map(|(j, x)| (Some(j), Some(x))).collect(),
        };
        let ports: Vec<(Option<usize>, Option<&NetworkPolicyPort>)> = match ports.as_deref() {
            None | Some([]) => vec![(None, None)],
            Some(list) => list.iter().enumerate().map(|(k, x)| (Some(k), Some(x))).collect(),
        };
        for (j, peer) in &peers {
            let label = |port: Option<usize>| {
                let mut c = format!("{policy} {dir}[{i}]");
                if let Some(j) = j {
                    c.push_str(&format!(" {peer_word}[{j}]"));
                }
                if let Some(k) = port {
                    c.push_str(&format!(" ports[{k}]"));
                }
                comment(&c)
            };
            let set_base =
                name(set_prefix, &format!("{policy}-{i}-{}", j.map_or("all".to_string(), |j| j.to_string())));
            let m = match peer {
                None => Peer::Any,
                Some(peer) => match &peer.ip_block {
                    Some(block) => match block_of(block, v6) {
                        Some(b) => b,
                        None => continue,
                    },
                    None => Peer::Pods {
                        set: set_base.clone(),
                        comment: comment(&format!("{policy} {dir}[{i}] {peer_word}[{}]", j.unwrap_or(0))),
                        addrs: pods
                            .iter()
                            .filter(|o| netpol::peer_matches(peer, ns, &End::Pod(o)))
                            .map(|o| o.ip)
                            .filter(|a| a.is_ipv6() == v6)
                            .collect(),
                    },
                },
            };
            for (k, port) in &ports {
                let Some(port) = port else {
                    out.push(Line { peer: m.clone(), port: Port::Any, comment: label(None) });
                    continue;
                };
                let proto = port.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
                let line_port = match &port.port {
                    None => Port::Proto(proto),
                    Some(IntOrString::Int(n)) => {
                        let lo = u16::try_from(*n).unwrap_or(0);
                        let hi = port.end_port.and_then(|e| u16::try_from(e).ok()).filter(|e| *e > lo).unwrap_or(lo);
                        Port::Range { proto, lo, hi }
                    }
                    Some(IntOrString::String(port_name)) if direction == Direction::Ingress => {
                        // The pod's own container port of that name and protocol, if it has one.
                        match pod
                            .named_ports
                            .iter()
                            .find(|(n, _, pr)| n == port_name && pr.eq_ignore_ascii_case(&proto))
                        {
                            Some((_, number, _)) => Port::Range { proto, lo: *number, hi: *number },
                            None => continue,
                        }
                    }
                    Some(IntOrString::String(port_name)) => {
                        // Egress to a named port: the destination pods that match the peer and
                        // name such a port, each with its own number.
                        let mut dests = BTreeSet::new();
                        for other in pods {
                            let ip = other.ip;
                            if ip.is_ipv6() != v6 {
                                continue;
                            }
                            if peer.is_some_and(|x| !netpol::peer_matches(x, ns, &End::Pod(other))) {
                                continue;
                            }
                            for (n, number, pr) in &other.named_ports {
                                if n == port_name && pr.eq_ignore_ascii_case(&proto) {
                                    dests.insert((ip, proto.clone(), *number));
                                }
                            }
                        }
                        out.push(Line {
                            peer: Peer::Any,
                            port: Port::Named {
                                set: format!("{set_base}-port{}", k.unwrap_or(0)),
                                comment: comment(&format!(
                                    "{policy} {dir}[{i}] ports[{}] ({port_name})",
                                    k.unwrap_or(0)
                                )),
                                dests,
                            },
                            comment: label(*k),
                        });
                        continue;
                    }
                };
                out.push(Line { peer: m.clone(), port: line_port, comment: label(*k) });
            }
        }
    }
    out
}

/// An ipBlock of the plan's family (None for the other family's: its own table has it).
fn block_of(block: &IPBlock, v6: bool) -> Option<Peer> {
    let net = block.cidr.parse::<IpNet>().ok().filter(|n| n.addr().is_ipv6() == v6)?;
    let except: BTreeSet<IpNet> = block
        .except
        .iter()
        .flatten()
        .filter_map(|e| e.parse::<IpNet>().ok())
        .filter(|n| n.addr().is_ipv6() == v6)
        .map(|n| n.trunc())
        .collect();
    Some(Peer::Block { cidr: net.trunc(), except: except.into_iter().collect() })
}

#[cfg(test)]
mod tests;
