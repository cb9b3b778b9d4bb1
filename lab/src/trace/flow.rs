//! Where the probe's packets went (pure): the flow's address tuples through every NAT, the hosts
//! crossed in order, the legs a relay (lb-sim's userspace or L7 modes) opened, and which routes
//! to ask each host about.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use super::parse::{CtEntry, Observation};
use super::route::RouteQuery;

/// What was observed, per host (`client`, `gateway`, `node-N`).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub from: String,
    /// The probe's own address and the address it connected to.
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    pub packets: BTreeMap<String, Vec<Observation>>,
    pub conntrack: BTreeMap<String, Vec<CtEntry>>,
}

/// The flow's tuples: forward (request) and backward (reply) direction, across every NAT on
/// the way (the closure over the hosts' conntrack entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tuples {
    pub forward: BTreeSet<(SocketAddr, SocketAddr)>,
    pub backward: BTreeSet<(SocketAddr, SocketAddr)>,
}

fn rev(t: (SocketAddr, SocketAddr)) -> (SocketAddr, SocketAddr) {
    (t.1, t.0)
}

/// The flow's tuples, starting from the probe's (src, dst).
pub fn tuples(start: (SocketAddr, SocketAddr), conntrack: &BTreeMap<String, Vec<CtEntry>>) -> Tuples {
    let mut t = Tuples::default();
    t.forward.insert(start);
    t.backward.insert(rev(start));
    loop {
        let before = (t.forward.len(), t.backward.len());
        for e in conntrack.values().flatten() {
            if t.forward.contains(&e.orig) || t.forward.contains(&rev(e.reply)) {
                t.forward.insert(e.orig);
                t.forward.insert(rev(e.reply));
                // Between the hooks: destination translated (PREROUTING), source not yet
                // (POSTROUTING); the reply likewise the other way round.
                t.forward.insert((e.orig.0, e.reply.0));
                t.backward.insert(e.reply);
                t.backward.insert(rev(e.orig));
                t.backward.insert((e.reply.0, e.orig.0));
            }
        }
        if (t.forward.len(), t.backward.len()) == before {
            return t;
        }
    }
}

/// The DSCP the probe's packets carry (0x2d, TOS byte 0xb4): the request's first packet is
/// recognised by it on every host, also after NAT changed its addresses and ports, and relays
/// keep it on the connections they open for the request (`podpath_client::relay`).
pub const PROBE_TOS: u32 = 0xb4;

/// The hosts the request's first packet crossed, in order: the sender first, then by the TTL
/// the packet arrived with (every router on the way takes one off).
pub fn request_path(observed: &Observed, t: &Tuples) -> Vec<String> {
    path_of(observed, |o| o.is_syn() && t.forward.contains(&(o.src, o.dst)))
}

/// One TCP connection carrying the request: the probe's own, or one a relay opened for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leg {
    /// The connection's first tuple (as its sender made it).
    pub start: (SocketAddr, SocketAddr),
    pub tuples: Tuples,
    /// The hosts its first packet crossed (the sender first, when traced).
    pub path: Vec<String>,
}

/// Adds to the forward tuples those of the same packets at later hooks of a host: a packet keeps
/// its trace id through the hooks of one namespace (and its IP ID or flow label through NAT),
/// so its tuple after a DNAT is known even where conntrack never confirmed the flow (the packet
/// was dropped on that host: a NetworkPolicy's drop after kube-proxy's DNAT).
fn with_same_packets(mut t: Tuples, observed: &Observed) -> Tuples {
    loop {
        let before = t.forward.len();
        for obs in observed.packets.values() {
            let seen: BTreeSet<(&str, u32)> = obs
                .iter()
                .filter(|o| o.is_syn() && t.forward.contains(&(o.src, o.dst)))
                .map(|o| (o.id.as_str(), o.ip_id))
                .collect();
            for o in obs.iter().filter(|o| o.is_syn() && seen.contains(&(o.id.as_str(), o.ip_id))) {
                t.forward.insert((o.src, o.dst));
            }
        }
        if t.forward.len() == before {
            return t;
        }
    }
}

impl Leg {
    fn new(start: (SocketAddr, SocketAddr), observed: &Observed) -> Leg {
        let tuples = with_same_packets(tuples(start, &observed.conntrack), observed);
        let path = request_path(observed, &tuples);
        Leg { start, tuples, path }
    }
}

/// A process that accepted a leg and opened its own connection onward: the userspace proxy on
/// a node, lb-sim's NodePort or L7 load balancer on the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay {
    pub host: String,
    /// The address it accepted the connection on (after any REDIRECT).
    pub accepted_on: SocketAddr,
    /// Its connections for the request, in order, with how each went (`connected`, `refused
    /// (reset from …)`, `no answer`); the last one is the one the request went on.
    pub attempts: Vec<(Leg, String)>,
}

/// The request's connections end to end: `legs[i]` reaches `relays[i]`, which opened `legs[i+1]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flow {
    pub legs: Vec<Leg>,
    pub relays: Vec<Relay>,
}

/// How a relay's connection went: a reset back to the relay host means refused; a conntrack
/// entry that saw both directions, connected. Conntrack forgets a refused connection at once.
fn attempt_result(observed: &Observed, host: &str, leg: &Leg) -> String {
    let reset = observed
        .packets
        .get(host)
        .into_iter()
        .flatten()
        .find(|o| o.has_flag("RST") && leg.tuples.backward.contains(&(o.src, o.dst)));
    if let Some(r) = reset {
        return format!("refused (reset from {})", r.src);
    }
    let entry = observed.conntrack.get(host).into_iter().flatten().find(|e| e.orig == leg.start);
    match entry {
        Some(e) if e.assured || e.state == "ESTABLISHED" => "connected".into(),
        Some(e) if e.state == "SYN_SENT" => "no answer".into(),
        Some(e) => format!("not answered ({})", e.state),
        // Namespaces without NAT rules track no connections (the gateway).
        None => "no conntrack entry".into(),
    }
}

/// Follows the request through relays: where a leg ends on a host that then opened connections
/// with the probe's DSCP, those are the relay's attempts, and the last one carries the request on.
pub fn follow(observed: &Observed) -> Flow {
    let (Some(src), Some(dst)) = (observed.src, observed.dst) else { return Flow::default() };
    let mut flow = Flow { legs: vec![Leg::new((src, dst), observed)], relays: vec![] };
    let mut known: BTreeSet<(SocketAddr, SocketAddr)> = flow.legs[0].tuples.forward.clone();
    // Bounded: the lab has at most two relays on a path (gateway, then a node).
    for _ in 0..4 {
        let leg = flow.legs.last().expect("one leg at least");
        let Some(host) = leg.path.last().cloned() else { break };
        let obs = observed.packets.get(&host).map(Vec::as_slice).unwrap_or_default();
        // Where it was delivered: the destination after this host's NAT (a REDIRECT to a proxy
        // port), else the last destination seen.
        let translated = observed
            .conntrack
            .get(&host)
            .into_iter()
            .flatten()
            .find(|e| leg.tuples.forward.contains(&e.orig))
            .map(|e| e.reply.0);
        let seen = obs
            .iter()
            .filter(|o| o.is_syn() && leg.tuples.forward.contains(&(o.src, o.dst)))
            .map(|o| o.dst)
            .next_back();
        let Some(accepted_on) = translated.or(seen) else { break };
        let mut starts: Vec<(SocketAddr, SocketAddr)> = Vec::new();
        for o in obs {
            let opened_here = o.is_syn() && o.iif.is_none() && u32::from(o.tos) & 0xfc == PROBE_TOS;
            if opened_here && !known.contains(&(o.src, o.dst)) && !starts.contains(&(o.src, o.dst)) {
                starts.push((o.src, o.dst));
            }
        }
        if starts.is_empty() {
            break;
        }
        let attempts: Vec<(Leg, String)> = starts
            .iter()
            .map(|s| {
                let leg = Leg::new(*s, observed);
                known.extend(leg.tuples.forward.iter().copied());
                let result = attempt_result(observed, &host, &leg);
                (leg, result)
            })
            .collect();
        flow.legs.push(attempts.last().expect("non-empty").0.clone());
        flow.relays.push(Relay { host, accepted_on, attempts });
    }
    flow
}

/// The connections to ask a host's conntrack about: the first tuple of each of the probe's
/// SYNs the host traced (one packet: one trace id and IP ID), which is the packet before this
/// host's NAT, the original direction of its entry. A host that traced none has no entry of the
/// flow: it is not asked.
pub fn conntrack_queries(obs: &[Observation]) -> Vec<(SocketAddr, SocketAddr)> {
    let mut packets = BTreeSet::new();
    let mut out = vec![];
    for o in obs.iter().filter(|o| o.is_syn()) {
        if packets.insert((o.id.as_str(), o.ip_id)) && !out.contains(&(o.src, o.dst)) {
            out.push((o.src, o.dst));
        }
    }
    out
}

/// The hosts the reply's first packet (SYN-ACK) crossed, in order.
pub fn reply_path(observed: &Observed, t: &Tuples) -> Vec<String> {
    path_of(observed, |o| o.is_syn_ack() && t.backward.contains(&(o.src, o.dst)))
}

fn path_of(observed: &Observed, wanted: impl Fn(&Observation) -> bool) -> Vec<String> {
    let mut hosts: Vec<(bool, u8, String)> = observed
        .packets
        .iter()
        .filter_map(|(host, obs)| {
            let mine: Vec<&Observation> = obs.iter().filter(|o| wanted(o)).collect();
            let ttl = mine.iter().map(|o| o.ttl).max()?;
            // A packet made here (no input interface) comes before every packet received.
            let sent_here = mine.iter().any(|o| o.iif.is_none());
            Some((!sent_here, u8::MAX - ttl, host.clone()))
        })
        .collect();
    hosts.sort();
    hosts.into_iter().map(|(_, _, h)| h).collect()
}

/// The route lookups that explain where each host sent the request: ((leg, host), `ip route
/// get` arguments), with the packet's addresses as it left the host (after any DNAT) and the
/// interface it came in on, so the kernel answers for exactly this packet. A leg's last host
/// before a relay delivered it locally: no lookup there.
pub fn route_queries(observed: &Observed, flow: &Flow) -> Vec<((usize, String), RouteQuery)> {
    let mut out = Vec::new();
    for (k, leg) in flow.legs.iter().enumerate() {
        let relayed = k < flow.relays.len();
        for (i, host) in leg.path.iter().enumerate() {
            if relayed && i + 1 == leg.path.len() {
                continue;
            }
            if let Some(args) = route_query(observed, &leg.tuples, host) {
                out.push(((k, host.clone()), args));
            }
        }
    }
    out
}

fn route_query(observed: &Observed, t: &Tuples, host: &str) -> Option<RouteQuery> {
    let obs: Vec<&Observation> =
        observed.packets[host].iter().filter(|o| o.is_syn() && t.forward.contains(&(o.src, o.dst))).collect();
    let (Some(first), Some(last)) = (obs.first(), obs.last()) else { return None };
    Some(RouteQuery {
        dst: last.dst.ip(),
        from: first.iif.as_ref().map(|iif| (first.src.ip(), iif.clone())),
        sport: first.src.port(),
        dport: last.dst.port(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse::parse_nft_monitor;

    /// A request DNATed to a pod of the same node and dropped there by a NetworkPolicy: the node
    /// has no conntrack entry (the flow was never confirmed), yet the packet after the DNAT is
    /// the same packet (trace id and flow label), so it is part of the flow.
    #[test]
    fn a_packet_dropped_after_its_dnat_stays_in_the_flow() {
        let node = "trace id 9da4829b ip6 nat PREROUTING packet: iif \"eth0\" ip6 saddr 2001:db8:113::10 ip6 daddr 2001:db8:100::1 ip6 dscp 0x2d ip6 ecn not-ect ip6 hoplimit 63 ip6 flowlabel 378401 ip6 length 40 tcp sport 36167 tcp dport 80 tcp flags == syn tcp window 64800
trace id 9da4829b ip6 nat KUBE-SEP-A rule meta l4proto tcp counter packets 0 bytes 0 dnat to [fd00:10:244:1::3]:8080 (verdict accept)
trace id 9da4829b ip6 filter FORWARD packet: iif \"eth0\" oif \"cni0\" ip6 saddr 2001:db8:113::10 ip6 daddr fd00:10:244:1::3 ip6 dscp 0x2d ip6 ecn not-ect ip6 hoplimit 62 ip6 flowlabel 378401 ip6 length 40 tcp sport 36167 tcp dport 8080 tcp flags == syn tcp window 64800
trace id 9da4829b ip6 filter PODPATH-ING-X rule counter packets 0 bytes 0 drop (verdict drop)
trace id 5555aaaa ip6 filter FORWARD packet: iif \"eth0\" oif \"cni0\" ip6 saddr 2001:db8:113::10 ip6 daddr fd00:10:244:1::9 ip6 dscp 0x2d ip6 ecn not-ect ip6 hoplimit 62 ip6 flowlabel 1 ip6 length 40 tcp sport 36167 tcp dport 8080 tcp flags == syn tcp window 64800
";
        let (src, dst) = ("[2001:db8:113::10]:36167".parse().unwrap(), "[2001:db8:100::1]:80".parse().unwrap());
        let observed = Observed {
            from: "client".into(),
            src: Some(src),
            dst: Some(dst),
            packets: BTreeMap::from([("node-1".to_string(), parse_nft_monitor(node))]),
            conntrack: BTreeMap::new(),
        };
        let flow = follow(&observed);
        let after_dnat = (src, "[fd00:10:244:1::3]:8080".parse().unwrap());
        assert!(flow.legs[0].tuples.forward.contains(&after_dnat), "{:?}", flow.legs[0].tuples);
        // Another packet (another id and flow label) is not.
        assert!(!flow.legs[0].tuples.forward.iter().any(|t| t.1.ip().to_string() == "fd00:10:244:1::9"));
        // conntrack is asked about each packet's first tuple: the DNATed one is the same packet.
        assert_eq!(
            conntrack_queries(&observed.packets["node-1"]),
            [(src, dst), (src, "[fd00:10:244:1::9]:8080".parse().unwrap())]
        );
    }
}
