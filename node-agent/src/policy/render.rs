//! NetworkPolicies → one nftables table per node (pure), in the per-pod-chain form of
//! kube-router and Calico with nftables sets for the peers (kube-network-policies' idea):
//!
//! - `forward` (hook forward): established and related packets pass (a connection made before a
//!   policy keeps working, as conntrack-based implementations behave); then a packet *from* a
//!   local pod isolated for egress jumps to that pod's `egress-NS/NAME` chain (via the map
//!   `egress-pods`), and a packet *to* a local pod isolated for ingress to its `ingress-NS/NAME`
//!   chain (map `ingress-pods`);
//! - a pod's chain holds every rule of every policy that isolates it, one line per (rule, peer,
//!   port), commented `NS/POLICY ingress[i] from[j] ports[k]`; a match passes (`return` for
//!   egress, so the destination's ingress is still checked; `accept` for ingress), and the
//!   chain ends in `drop`;
//! - a peer selecting pods is a named set of their addresses (`from-NS/POLICY-i-j`,
//!   `to-NS/POLICY-i-j`), so a pod's label change moves a few elements; an `ipBlock` is written
//!   in the rule; a named port is resolved on the destination: in an ingress chain it is the
//!   pod's own port, in an egress chain a set of (address, protocol, port) of the pods that
//!   name it.
//!
//! The forward hook sees traffic after kube-proxy's DNAT (destination: the chosen pod) and
//! before its masquerade (source: the client), which is what real implementations see; traffic
//! the node itself sends to its pods (probes, the userspace proxy) takes the output hook and is
//! never filtered. Same-node pod traffic reaches the forward hook because the bridge routes it
//! (`routeSameBridge` in the CNI configuration). What a connection is allowed by is decided by
//! `api::netpol`, whose predicates these rules are built from.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use api::k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use api::netpol::{self, Direction, End, Pod};
use podpath_ruleset::nft::{Chain, Element, NftFamily, NftTable, Set};

/// The table's name.
pub const TABLE: &str = "podpath-policy";
/// The maps from a local pod's address to its chains.
pub const INGRESS_PODS: &str = "ingress-pods";
pub const EGRESS_PODS: &str = "egress-pods";

/// nftables keeps comments of at most 128 bytes.
const COMMENT_MAX: usize = 127;
/// Names (chains, sets) longer than this are shortened with a hash.
const NAME_MAX: usize = 200;

/// The table for the pods of one node: `pods` are every pod of the pod network (with an
/// address), `local` says which of them run on this node.
pub fn render(policies: &[NetworkPolicy], pods: &[Pod], local: &dyn Fn(&Pod) -> bool) -> NftTable {
    let mut t = NftTable::new(NftFamily::Ip, TABLE);
    t.comment = Some("NetworkPolicy enforcement by the podpath node agent".into());
    t.add_chain(
        Chain::base("forward", "filter", "forward", 0)
            .rule("ct state established,related accept")
            .rule(format!("ip saddr vmap @{EGRESS_PODS}"))
            .rule(format!("ip daddr vmap @{INGRESS_PODS}")),
    );
    t.sets.push(Set::map(INGRESS_PODS, "ipv4_addr", "verdict").with_comment("local pods isolated for ingress"));
    t.sets.push(Set::map(EGRESS_PODS, "ipv4_addr", "verdict").with_comment("local pods isolated for egress"));
    let mut sets: BTreeMap<String, Set> = BTreeMap::new();
    let mut sorted: Vec<&NetworkPolicy> = policies.iter().collect();
    sorted.sort_by_key(|p| key(p));
    for pod in pods.iter().filter(|p| local(p)) {
        let IpAddr::V4(ip) = pod.ip else { continue };
        for direction in [Direction::Ingress, Direction::Egress] {
            let isolating: Vec<&NetworkPolicy> = sorted
                .iter()
                .copied()
                .filter(|p| netpol::selects_pod(p, pod) && netpol::types(p).contains(&direction))
                .collect();
            if isolating.is_empty() {
                continue;
            }
            let chain_name = name(direction_word(direction), &format!("{}/{}", pod.namespace, pod.name));
            let mut chain = Chain::regular(&chain_name).with_comment(comment(&format!(
                "{} of pod {}/{}",
                direction.name(),
                pod.namespace,
                pod.name
            )));
            for p in &isolating {
                for line in policy_lines(p, direction, pod, pods, &mut sets) {
                    chain = chain.rule(line);
                }
            }
            let names: Vec<String> = isolating.iter().map(|p| key(p)).collect();
            chain = chain.rule(format!(
                "drop comment {}",
                quoted(&format!(
                    "no policy allows this {} (isolated by {})",
                    direction.name().to_lowercase(),
                    names.join(", ")
                ))
            ));
            t.add_chain(chain);
            let map = if direction == Direction::Ingress { INGRESS_PODS } else { EGRESS_PODS };
            t.add_element(map, Element::key(&[&ip.to_string()]).to(format!("jump {chain_name}")));
        }
    }
    t.sets.extend(sets.into_values());
    t
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

/// A peer as a match on the other end's address: `@set` of pods, an ipBlock, or nothing that
/// can match (an IPv6 block in this IPv4 table).
enum PeerMatch {
    Any,
    Set(String),
    Block(String),
    Never,
}

/// The lines one policy gives `pod`'s chain for `direction`.
fn policy_lines(
    p: &NetworkPolicy,
    direction: Direction,
    pod: &Pod,
    pods: &[Pod],
    sets: &mut BTreeMap<String, Set>,
) -> Vec<String> {
    let policy = key(p);
    let ns = p.metadata.namespace.as_deref().unwrap_or("default");
    let rules = netpol::rules(p, direction);
    let (addr, verdict, peer_word, set_prefix) = match direction {
        Direction::Ingress => ("saddr", "accept", "from", "from"),
        Direction::Egress => ("daddr", "return", "to", "to"),
    };
    let dir = direction_word(direction);
    let mut out = vec![];
    for (i, (peers, ports)) in rules.iter().enumerate() {
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
                quoted(&c)
            };
            let set_base =
                name(set_prefix, &format!("{policy}-{i}-{}", j.map_or("all".to_string(), |j| j.to_string())));
            let m = match peer {
                None => PeerMatch::Any,
                Some(peer) => match &peer.ip_block {
                    Some(block) => block_match(addr, block),
                    None => {
                        let mut set = Set::plain(&set_base, "ipv4_addr")
                            .with_comment(comment(&format!("{policy} {dir}[{i}] {peer_word}[{}]", j.unwrap_or(0))));
                        for other in pods {
                            if let IpAddr::V4(ip) = other.ip {
                                if netpol::peer_matches(peer, ns, &End::Pod(other)) {
                                    set.insert(Element::key(&[&ip.to_string()]));
                                }
                            }
                        }
                        sets.insert(set_base.clone(), set);
                        PeerMatch::Set(set_base.clone())
                    }
                },
            };
            let peer_text = match &m {
                PeerMatch::Any => String::new(),
                PeerMatch::Set(s) => format!("ip {addr} @{s} "),
                PeerMatch::Block(b) => format!("{b} "),
                PeerMatch::Never => continue,
            };
            for (k, port) in &ports {
                let Some(port) = port else {
                    out.push(format!("{peer_text}{verdict} comment {}", label(None)));
                    continue;
                };
                let proto = port.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase();
                let port_text = match &port.port {
                    None => format!("meta l4proto {proto}"),
                    Some(IntOrString::Int(n)) => match port.end_port {
                        Some(e) if e > *n => format!("{proto} dport {n}-{e}"),
                        _ => format!("{proto} dport {n}"),
                    },
                    Some(IntOrString::String(port_name)) if direction == Direction::Ingress => {
                        // The pod's own container port of that name and protocol, if it has one.
                        match pod
                            .named_ports
                            .iter()
                            .find(|(n, _, pr)| n == port_name && pr.eq_ignore_ascii_case(&proto))
                        {
                            Some((_, number, _)) => format!("{proto} dport {number}"),
                            None => continue,
                        }
                    }
                    Some(IntOrString::String(port_name)) => {
                        // Egress to a named port: the destination pods that match the peer and
                        // name such a port, each with its own number.
                        let set_name = format!("{set_base}-port{}", k.unwrap_or(0));
                        let mut set = Set::plain(&set_name, "ipv4_addr . inet_proto . inet_service").with_comment(
                            comment(&format!("{policy} {dir}[{i}] ports[{}] ({port_name})", k.unwrap_or(0))),
                        );
                        for other in pods {
                            let IpAddr::V4(ip) = other.ip else { continue };
                            if peer.is_some_and(|x| !netpol::peer_matches(x, ns, &End::Pod(other))) {
                                continue;
                            }
                            for (n, number, pr) in &other.named_ports {
                                if n == port_name && pr.eq_ignore_ascii_case(&proto) {
                                    set.insert(Element::key(&[&ip.to_string(), &proto, &number.to_string()]));
                                }
                            }
                        }
                        sets.insert(set_name.clone(), set);
                        out.push(format!(
                            "ip daddr . meta l4proto . th dport @{set_name} {verdict} comment {}",
                            label(*k)
                        ));
                        continue;
                    }
                };
                out.push(format!("{peer_text}{port_text} {verdict} comment {}", label(*k)));
            }
        }
    }
    out
}

/// `ip saddr CIDR ip saddr != { EXCEPT, … }` (IPv4 blocks only).
fn block_match(addr: &str, block: &IPBlock) -> PeerMatch {
    let Ok(ipnet::IpNet::V4(net)) = block.cidr.parse::<ipnet::IpNet>() else { return PeerMatch::Never };
    let mut text = format!("ip {addr} {}", net.trunc());
    let except: BTreeSet<String> = block
        .except
        .iter()
        .flatten()
        .filter_map(|e| match e.parse::<ipnet::IpNet>() {
            Ok(ipnet::IpNet::V4(n)) => Some(n.trunc().to_string()),
            _ => None,
        })
        .collect();
    if !except.is_empty() {
        text.push_str(&format!(" ip {addr} != {{ {} }}", except.into_iter().collect::<Vec<_>>().join(", ")));
    }
    PeerMatch::Block(text)
}

#[cfg(test)]
mod tests;
