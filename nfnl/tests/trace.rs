//! The trace listener against the kernel: in a namespace of its own, iptables-nft rules and an
//! nft table that sets the trace flag on one datagram; the listener must get that datagram's
//! events (the packet once per base chain, every rule it hit with its handle, the policies),
//! and a hit's handle must sit at the position `iptables-save` prints its rule at. Root only;
//! the host's namespace is compared before and after.

use std::time::{Duration, Instant};

use nfnl::trace::{Kind, Listener, TraceEvent};
use testkit::netns::{host_state, root_or_explain, Netns};

const TRACE_TABLE: &str = "table ip nfnl-trace-test {
    chain output { type filter hook output priority -350; udp dport 9 meta nftrace set 1; }
}";

#[test]
fn the_listener_hears_every_chain_a_traced_datagram_crosses() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("nftr");
    for rule in [
        "-t mangle -A OUTPUT -p udp -j MARK --set-mark 0x4000",
        "-N NFNL-CHOSEN",
        "-A NFNL-CHOSEN -p tcp -j ACCEPT",
        "-A NFNL-CHOSEN -p udp --dport 10 -j ACCEPT",
        "-A NFNL-CHOSEN -p udp --dport 9 -m comment --comment the-one -j RETURN",
        "-A NFNL-CHOSEN -j DROP",
        "-A OUTPUT -p udp -j NFNL-CHOSEN",
    ] {
        let mut argv = vec!["iptables"];
        argv.extend(rule.split(' '));
        let (ok, out) = ns.run(&argv);
        assert!(ok, "iptables {rule}: {out}");
    }
    let (ok, out) = ns.run(&["sh", "-c", &format!("echo '{TRACE_TABLE}' | nft -f -")]);
    assert!(ok, "nft: {out}");
    let mut listener = ns.in_thread(|| Listener::open().expect("listener"));
    let mut socket = ns.in_thread(|| nfnl::Socket::open().expect("socket"));
    ns.in_thread(|| {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        s.send_to(b"traced", "127.0.0.1:9").unwrap();
        // Not traced: another port.
        s.send_to(b"quiet", "127.0.0.1:10").unwrap();
    });
    let mut events: Vec<TraceEvent> = vec![];
    let t = Instant::now();
    while !events.iter().any(|e| e.table == "filter" && e.kind == Kind::Policy) {
        assert!(t.elapsed() < Duration::from_secs(5), "no filter policy event: {events:#?}");
        listener.read(&mut events).expect("read");
        std::thread::sleep(Duration::from_millis(5));
    }
    // One datagram, whose id every event carries; the packet once per base chain entered.
    let id = events[0].id;
    assert!(events.iter().all(|e| e.id == id && e.family == 2), "{events:#?}");
    let with_packet: Vec<(&str, &str)> =
        events.iter().filter(|e| e.network.is_some()).map(|e| (e.table.as_str(), e.chain.as_str())).collect();
    assert_eq!(with_packet, [("nfnl-trace-test", "output"), ("mangle", "OUTPUT"), ("filter", "OUTPUT")]);
    let filter_packet = events.iter().find(|e| e.table == "filter" && e.network.is_some()).unwrap();
    let ip = filter_packet.network.as_deref().unwrap();
    assert_eq!((ip[0] >> 4, ip[9]), (4, 17), "an IPv4 UDP header");
    let udp = filter_packet.transport.as_deref().unwrap();
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), 9);
    assert_eq!(filter_packet.mark, Some(0x4000), "the mark mangle set");
    assert!(filter_packet.oif.is_some_and(|(_, kind)| kind == 772), "out through loopback: {filter_packet:?}");

    // The hits in filter: the jump, the RETURN of the third rule, the chain's policy.
    let hits: Vec<&TraceEvent> = events.iter().filter(|e| e.table == "filter").collect();
    assert_eq!(hits[0].verdict, Some((-3, Some("NFNL-CHOSEN".into()))), "{hits:#?}");
    let chosen = hits.iter().find(|e| e.chain == "NFNL-CHOSEN").expect("a hit in NFNL-CHOSEN");
    assert_eq!((chosen.kind, chosen.verdict.clone()), (Kind::Rule, Some((-5, None))));
    assert_eq!(hits.last().unwrap().policy, Some(1), "policy ACCEPT");
    // Its handle's position among the chain's handles is its rule's line in iptables-save.
    let handles = socket.rule_handles(2, "filter", "NFNL-CHOSEN").expect("handles");
    assert_eq!(handles.len(), 4, "{handles:?}");
    let at = handles.iter().position(|h| Some(*h) == chosen.handle).expect("the hit's handle is listed");
    let (_, saved) = ns.run(&["iptables-save", "-t", "filter"]);
    let lines: Vec<&str> = saved.lines().filter(|l| l.starts_with("-A NFNL-CHOSEN ")).collect();
    assert!(lines[at].contains("the-one"), "{at}: {lines:?}");
    assert_eq!(socket.rule_handles(2, "filter", "NO-SUCH-CHAIN").expect("none"), Vec::<u64>::new());
    assert_eq!(socket.rule_handles(2, "no-such-table", "OUTPUT").expect("none"), Vec::<u64>::new());

    // Nothing more: the untraced datagram made no event.
    std::thread::sleep(Duration::from_millis(50));
    let mut more = vec![];
    listener.read(&mut more).expect("read");
    assert!(more.iter().all(|e| e.id == id), "{more:#?}");
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}
