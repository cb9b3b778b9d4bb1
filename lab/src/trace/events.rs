//! The kernel's trace events, read by the trace itself over netlink (`nfnl::trace`) in a
//! namespace lab's iptables modes, made into the same [`Observation`]s `xtables-monitor
//! --trace` output is parsed into (pure): a packet per base chain it enters, with the rules it
//! hit there. A hit carries its rule's handle only; [`place`] puts the rule `iptables-save`
//! prints at that handle's position in its chain beside it.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use nfnl::trace::{Kind, TraceEvent};

use super::parse::{Observation, RuleHit, TCP_FLAGS};

/// `ARPHRD_LOOPBACK`: xtables-monitor marks a packet that came in over loopback so.
const ARPHRD_LOOPBACK: u16 = 772;

/// A verdict in xtables-monitor's words (`ACCEPT`, `JUMP:CHAIN`…).
fn verdict_word(code: i32, chain: Option<&str>) -> String {
    match (code, chain) {
        (1, _) => "ACCEPT".into(),
        (0, _) => "DROP".into(),
        (2, _) => "STOLEN".into(),
        (3, _) => "QUEUE".into(),
        (-1, _) => "CONTINUE".into(),
        (-2, _) => "BREAK".into(),
        (-3, Some(c)) => format!("JUMP:{c}"),
        (-4, Some(c)) => format!("GOTO:{c}"),
        (-5, _) => "RETURN".into(),
        (code, _) => format!("0x{:x}", code as u32),
    }
}

/// The packet an event carries (its network and transport headers, devices, mark) as an
/// observation with no hits yet; None when the headers are not an IP packet's.
fn packet(e: &TraceEvent, name_of: &mut impl FnMut(u32) -> Option<String>) -> Option<Observation> {
    let ip = e.network.as_deref()?;
    let mut o = Observation::new(format!("{:08x}", e.id));
    let (src, dst, proto): (IpAddr, IpAddr, u8) = match ip.first()? >> 4 {
        4 if ip.len() >= 20 => {
            o.tos = ip[1];
            o.ip_id = u16::from_be_bytes([ip[4], ip[5]]) as u32;
            o.ttl = ip[8];
            let octets = |at: usize| Ipv4Addr::new(ip[at], ip[at + 1], ip[at + 2], ip[at + 3]);
            (octets(12).into(), octets(16).into(), ip[9])
        }
        6 if ip.len() >= 40 => {
            o.tos = (ip[0] & 0x0f) << 4 | ip[1] >> 4;
            // The flow label is what stays the same of one packet across hooks, as the IPv4 id.
            o.ip_id = u32::from_be_bytes([0, ip[1] & 0x0f, ip[2], ip[3]]);
            o.ttl = ip[7];
            let addr = |at: usize| Ipv6Addr::from(<[u8; 16]>::try_from(&ip[at..at + 16]).expect("16 bytes"));
            (addr(8).into(), addr(24).into(), ip[6])
        }
        _ => return None,
    };
    let th = e.transport.as_deref().unwrap_or_default();
    let ports = (th.len() >= 4).then(|| (u16::from_be_bytes([th[0], th[1]]), u16::from_be_bytes([th[2], th[3]])));
    let (sport, dport) = match proto {
        6 | 17 | 132 => ports.unwrap_or_default(),
        _ => (0, 0),
    };
    o.proto = match proto {
        6 => "TCP",
        17 => "UDP",
        132 => "SCTP",
        1 => "ICMP",
        58 => "ICMPv6",
        _ => "IP",
    }
    .into();
    if proto == 6 && th.len() >= 14 {
        o.flags = TCP_FLAGS.iter().filter(|(bit, _)| th[13] & bit != 0).map(|(_, n)| n.to_string()).collect();
    }
    o.src = SocketAddr::new(src, sport);
    o.dst = SocketAddr::new(dst, dport);
    o.iif = e.iif.and_then(|(i, _)| name_of(i));
    o.oif = e.oif.and_then(|(i, _)| name_of(i));
    if e.iif.is_some_and(|(_, kind)| kind == ARPHRD_LOOPBACK) {
        o.flags.insert(0, "LOOPBACK".into());
    }
    o.mark = e.mark.filter(|m| *m != 0).map(|m| format!("0x{m:x}"));
    Some(o)
}

/// One namespace's events as observations, in the order the kernel sent them: an event that
/// carries the packet starts an observation (the first event of each base chain the packet
/// enters), and every event is a hit of the latest observation of its packet id. `name_of`
/// names an interface of that namespace by index.
pub fn observations(events: &[TraceEvent], mut name_of: impl FnMut(u32) -> Option<String>) -> Vec<Observation> {
    let mut names: BTreeMap<u32, Option<String>> = BTreeMap::new();
    let mut named = |i: u32| names.entry(i).or_insert_with(|| name_of(i)).clone();
    let mut out: Vec<Observation> = vec![];
    for e in events {
        if e.network.is_some() {
            if let Some(o) = packet(e, &mut named) {
                out.push(o);
            }
        }
        let id = format!("{:08x}", e.id);
        let Some(o) = out.iter_mut().rev().find(|o| o.id == id) else { continue };
        let (kind, verdict) = match e.kind {
            Kind::Rule => ("rule", e.verdict.as_ref().map(|(c, ch)| verdict_word(*c, ch.as_deref()))),
            Kind::Return => ("return", e.verdict.as_ref().map(|(c, ch)| verdict_word(*c, ch.as_deref()))),
            Kind::Policy => ("policy", e.policy.map(|p| verdict_word(p as i32, None))),
            Kind::Unknown => continue,
        };
        o.hits.push(RuleHit {
            table: e.table.clone(),
            chain: e.chain.clone(),
            kind: kind.into(),
            verdict: verdict.unwrap_or_default(),
            rule: None,
            parsed: None,
            handle: e.handle,
        });
    }
    out
}

/// The source port of a UDP datagram to a loopback address's `port` that an event carries (the
/// trace's sync datagrams), read from the raw headers: whether a host's events are all in is
/// asked often, before any observation is made.
pub fn loopback_datagram_to(e: &TraceEvent, port: u16) -> Option<u16> {
    let ip = e.network.as_deref()?;
    let (proto, loopback) = match ip.first()? >> 4 {
        4 if ip.len() >= 20 => (ip[9], ip[16] == 127),
        6 if ip.len() >= 40 => (ip[6], ip[24..40] == Ipv6Addr::LOCALHOST.octets()),
        _ => return None,
    };
    let th = e.transport.as_deref().filter(|t| t.len() >= 4)?;
    (proto == 17 && loopback && u16::from_be_bytes([th[2], th[3]]) == port).then(|| u16::from_be_bytes([th[0], th[1]]))
}

/// The (table, chain) of every rule hit with a handle in the tables `iptables-save` prints
/// (`saved`), by packets other than those `skip` names: the chains whose handles [`place`]
/// needs.
pub fn chains_hit<'a>(
    obs: &'a [Observation],
    saved: &[&str],
    skip: impl Fn(&Observation) -> bool,
) -> Vec<(&'a str, &'a str)> {
    let mut out: Vec<(&str, &str)> = obs
        .iter()
        .filter(|o| !skip(o))
        .flat_map(|o| &o.hits)
        .filter(|h| h.kind == "rule" && h.handle.is_some() && saved.contains(&h.table.as_str()))
        .map(|h| (h.table.as_str(), h.chain.as_str()))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Puts beside each rule hit the rule as `iptables-save` prints it: the hit's handle has a
/// position among its chain's handles (`handles`: (table, chain) → handles in order), and the
/// chain's `-A` lines in `saves` (table → that table's `iptables-save -t` text) are in the same
/// order. A handle not listed (the chain was rewritten in between) leaves the hit without its
/// rule.
pub fn place(
    obs: &mut [Observation],
    handles: &BTreeMap<(String, String), Vec<u64>>,
    saves: &BTreeMap<String, String>,
) {
    let lines: BTreeMap<&str, BTreeMap<&str, Vec<&str>>> =
        saves.iter().map(|(table, text)| (table.as_str(), rules_by_chain(text))).collect();
    for hit in obs.iter_mut().flat_map(|o| o.hits.iter_mut()) {
        let Some(handle) = hit.handle else { continue };
        let Some(list) = handles.get(&(hit.table.clone(), hit.chain.clone())) else { continue };
        let Some(at) = list.iter().position(|h| *h == handle) else { continue };
        let saved = lines.get(hit.table.as_str()).and_then(|chains| chains.get(hit.chain.as_str()));
        // Only when the counts agree: a chain of another length was rewritten in between.
        let Some(line) = saved.filter(|l| l.len() == list.len()).and_then(|l| l.get(at)) else { continue };
        hit.parsed = podpath_ruleset::text::parse_rule_line(line).ok();
        hit.rule = Some(line.to_string());
    }
}

/// Chain → its `-A` lines in order, from one table's `iptables-save` text.
fn rules_by_chain(save: &str) -> BTreeMap<&str, Vec<&str>> {
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in save.lines() {
        if let Some(rest) = line.strip_prefix("-A ") {
            out.entry(rest.split_whitespace().next().unwrap_or("")).or_default().push(line);
        }
    }
    out
}

/// `iptables-save` output (every table) split by table: table → its text.
pub fn split_save(text: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut table: Option<String> = None;
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            table = Some(name.trim().to_string());
        }
        if let Some(t) = &table {
            let text = out.entry(t.clone()).or_default();
            text.push_str(line);
            text.push('\n');
        }
        if line == "COMMIT" {
            table = None;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::parse::parse_monitor;

    fn ev(id: u32, table: &str, chain: &str, kind: Kind) -> TraceEvent {
        TraceEvent { id, family: 2, table: table.into(), chain: chain.into(), kind, ..Default::default() }
    }

    /// An IPv4 TCP SYN 203.0.113.10:45565 → 198.51.100.1:80, TOS 0xb4, TTL 63, id 46801.
    fn syn() -> (Vec<u8>, Vec<u8>) {
        let mut ip = vec![0x45, 0xb4, 0, 60, 0xb6, 0xd1, 0x40, 0, 63, 6, 0, 0];
        ip.extend([203, 0, 113, 10, 198, 51, 100, 1]);
        let mut tcp = vec![0xb1, 0xfd, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0xa0, 0x02];
        tcp.extend([0xfa, 0xf0, 0, 0, 0, 0]);
        (ip, tcp)
    }

    /// The same packet through a node's nat PREROUTING and on to filter FORWARD, as
    /// xtables-monitor printed it in a lab (rules aside: those come from `place`).
    #[test]
    fn events_make_the_observations_xtables_monitor_printed() {
        let (ip, tcp) = syn();
        let with_packet = |mut e: TraceEvent, iif: u32, oif: Option<u32>, mark: Option<u32>| {
            e.network = Some(ip.clone());
            e.transport = Some(tcp.clone());
            e.iif = Some((iif, 1));
            e.oif = oif.map(|o| (o, 1));
            e.mark = mark;
            e
        };
        let rule = |table: &str, chain: &str, handle: u64, code: i32, to: Option<&str>| {
            let mut e = ev(0x6190c49c, table, chain, Kind::Rule);
            e.handle = Some(handle);
            e.verdict = Some((code, to.map(str::to_string)));
            e
        };
        let mut policy = ev(0x6190c49c, "nat", "PREROUTING", Kind::Policy);
        policy.policy = Some(1);
        let events = vec![
            with_packet(rule("nat", "PREROUTING", 0x15, -3, Some("KUBE-SERVICES")), 2, None, None),
            rule("nat", "KUBE-SERVICES", 0x51, -3, Some("KUBE-EXT-X")),
            rule("nat", "KUBE-MARK-MASQ", 0x8, -1, None),
            rule("nat", "KUBE-POSTROUTING", 0xf, -5, None),
            policy,
            with_packet(rule("filter", "FORWARD", 0x23, -3, Some("PODPATH-POLICY")), 2, Some(2), Some(0x4000)),
        ];
        let got = observations(&events, |i| (i == 2).then(|| "eth0".to_string()));
        let printed = "PACKET: 2 6190c49c IN=eth0 MACSRC=92:e3:28:78:bf:89 MACDST=42:b3:16:b4:8d:59 MACPROTO=0800 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=63 ID=46801 DF SPORT=45565 DPORT=80 SYN \n \
             TRACE: 2 6190c49c nat:PREROUTING:rule:0x15:JUMP:KUBE-SERVICES  -4 -t nat -A PREROUTING -j KUBE-SERVICES\n \
             TRACE: 2 6190c49c nat:KUBE-SERVICES:rule:0x51:JUMP:KUBE-EXT-X  -4 -t nat -A KUBE-SERVICES -j KUBE-EXT-X\n \
             TRACE: 2 6190c49c nat:KUBE-MARK-MASQ:rule:0x8:CONTINUE  -4 -t nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n \
             TRACE: 2 6190c49c nat:KUBE-POSTROUTING:rule:0xf:RETURN  -4 -t nat -A KUBE-POSTROUTING -j RETURN\n \
             TRACE: 2 6190c49c nat:PREROUTING:policy:ACCEPT \n\
             PACKET: 2 6190c49c IN=eth0 OUT=eth0 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=63 ID=46801 DF SPORT=45565 DPORT=80 SYN MARK=0x4000 \n \
             TRACE: 2 6190c49c filter:FORWARD:rule:0x23:JUMP:PODPATH-POLICY  -4 -t filter -A FORWARD -j PODPATH-POLICY\n";
        let mut want = parse_monitor(printed);
        for h in want.iter_mut().flat_map(|o| o.hits.iter_mut()) {
            (h.rule, h.parsed) = (None, None);
        }
        assert_eq!(got, want);
    }

    #[test]
    fn loopback_udp_and_ipv6_packets_read_as_the_monitors_do() {
        let mut e = ev(0x08fb357e, "podpath-trace", "prerouting", Kind::Policy);
        e.policy = Some(1);
        e.network = Some(vec![0x45, 0xb4, 0, 41, 0xf2, 0x71, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
        e.transport = Some(vec![0x94, 0x13, 0, 9, 0, 21, 0, 0]);
        e.iif = Some((1, ARPHRD_LOOPBACK));
        let got = observations(&[e], |_| Some("lo".into()));
        let want = parse_monitor(
            "PACKET: 2 08fb357e IN=lo LOOPBACK SRC=127.0.0.1 DST=127.0.0.1 LEN=41 TOS=0xb4 TTL=64 ID=62065 DF SPORT=37907 DPORT=9 \n \
             TRACE: 2 08fb357e podpath-trace:prerouting:policy:ACCEPT \n",
        );
        assert_eq!(got, want);

        // IPv6: traffic class 0xb4, flow label 452502, hop limit 63, TCP SYN to port 80.
        // 452502 is 0x6e796: version 6, class 0xb4, label 0x6e796, 40 bytes, TCP, hop limit 63.
        let mut ip6 = vec![0x6b, 0x46, 0xe7, 0x96, 0, 40, 6, 63];
        ip6.extend("2001:db8:113::10".parse::<Ipv6Addr>().unwrap().octets());
        ip6.extend("2001:db8:100::1".parse::<Ipv6Addr>().unwrap().octets());
        let mut e = ev(0x8c1131e9, "nat", "PREROUTING", Kind::Policy);
        e.family = 10;
        e.policy = Some(1);
        e.network = Some(ip6);
        e.transport = Some(syn().1);
        let o = &observations(&[e], |_| None)[0];
        assert_eq!((o.tos, o.ip_id, o.ttl, o.proto.as_str()), (0xb4, 452502, 63, "TCP"));
        assert_eq!(o.src, "[2001:db8:113::10]:45565".parse().unwrap());
        assert_eq!(o.dst, "[2001:db8:100::1]:80".parse().unwrap());
        assert_eq!(o.flags, ["SYN"]);
    }

    #[test]
    fn a_sync_datagram_is_known_by_its_headers() {
        let mut e = ev(1, "podpath-trace", "traced", Kind::Rule);
        e.network = Some(vec![0x45, 0xb4, 0, 41, 0, 1, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
        e.transport = Some(vec![0x94, 0x13, 0, 9, 0, 21, 0, 0]);
        assert_eq!(loopback_datagram_to(&e, 9), Some(37907));
        assert_eq!(loopback_datagram_to(&e, 53), None);
        let (ip, tcp) = syn();
        (e.network, e.transport) = (Some(ip), Some(tcp));
        assert_eq!(loopback_datagram_to(&e, 80), None, "TCP, and not to loopback");
        let mut ip6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        ip6.extend(Ipv6Addr::LOCALHOST.octets());
        ip6.extend(Ipv6Addr::LOCALHOST.octets());
        (e.network, e.transport) = (Some(ip6), Some(vec![0x94, 0x14, 0, 9]));
        assert_eq!(loopback_datagram_to(&e, 9), Some(37908));
        e.transport = None;
        assert_eq!(loopback_datagram_to(&e, 9), None);
    }

    #[test]
    fn an_event_of_no_packet_seen_yet_or_not_ip_is_left_out() {
        let mut e = ev(1, "filter", "INPUT", Kind::Rule);
        assert!(observations(std::slice::from_ref(&e), |_| None).is_empty());
        e.network = Some(vec![0x15, 0, 0]);
        assert!(observations(&[e], |_| None).is_empty());
    }

    #[test]
    fn a_hit_gets_the_saved_rule_at_its_handles_position() {
        let (ip, tcp) = syn();
        let mut a = ev(5, "nat", "KUBE-SVC-X", Kind::Rule);
        (a.network, a.transport, a.handle, a.verdict) =
            (Some(ip), Some(tcp), Some(0x4b), Some((-3, Some("KUBE-SEP-B".into()))));
        let mut b = ev(5, "nat", "KUBE-SEP-B", Kind::Rule);
        (b.handle, b.verdict) = (Some(0x90), Some((1, None)));
        let mut trace = ev(5, "podpath-trace", "traced", Kind::Rule);
        (trace.handle, trace.verdict) = (Some(0xb), Some((-1, None)));
        let mut obs = observations(&[a, b, trace], |_| None);
        let save = split_save(
            "# Generated by iptables-save\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n*nat\n:KUBE-SVC-X - [0:0]\n\
             -A KUBE-SVC-X -m statistic --mode random --probability 0.5 -j KUBE-SEP-A\n-A KUBE-SVC-X -j KUBE-SEP-B\n\
             -A KUBE-SEP-B -p tcp -j DNAT --to-destination 10.244.2.3:8080\nCOMMIT\n",
        );
        assert_eq!(save.keys().collect::<Vec<_>>(), ["filter", "nat"]);
        let tables: Vec<&str> = save.keys().map(String::as_str).collect();
        assert_eq!(chains_hit(&obs, &tables, |_| false), [("nat", "KUBE-SEP-B"), ("nat", "KUBE-SVC-X")]);
        assert_eq!(chains_hit(&obs, &tables, |o| o.dst.port() == 80), []);
        let mut handles = BTreeMap::new();
        handles.insert(("nat".to_string(), "KUBE-SVC-X".to_string()), vec![0x4a, 0x4b]);
        // A chain rewritten since the packet passed: its handle is gone, its hit stays bare.
        handles.insert(("nat".to_string(), "KUBE-SEP-B".to_string()), vec![0x99]);
        place(&mut obs, &handles, &save);
        let hits = &obs[0].hits;
        assert_eq!(hits[0].rule.as_deref(), Some("-A KUBE-SVC-X -j KUBE-SEP-B"));
        assert!(hits[0].parsed.is_some());
        assert_eq!((hits[1].rule.as_deref(), hits[2].rule.as_deref()), (None, None));
        assert_eq!(hits[1].verdict, "ACCEPT");
        assert_eq!(hits[2].verdict, "CONTINUE");
    }

    #[test]
    fn verdicts_read_in_the_monitors_words() {
        assert_eq!(verdict_word(-3, Some("KUBE-SERVICES")), "JUMP:KUBE-SERVICES");
        assert_eq!(verdict_word(-4, Some("traced")), "GOTO:traced");
        assert_eq!((verdict_word(0, None), verdict_word(-5, None)), ("DROP".into(), "RETURN".into()));
        assert_eq!(verdict_word(-7, None), "0xfffffff9");
    }
}
