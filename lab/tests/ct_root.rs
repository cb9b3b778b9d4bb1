//! Root test of `trace::ct`: a connection's conntrack entry asked over ctnetlink reads the same
//! as `conntrack -G` prints it for the same tuple (a plain connection and a DNATed one, IPv4 and
//! IPv6), and a tuple with no connection has none.

use std::net::{SocketAddr, TcpStream};

use podpath_lab::trace::{ct, parse};
use testkit::netns::{host_state, root_or_explain, Netns};

#[test]
fn conntrack_entries_over_netlink_read_as_conntrack_prints_them() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("ctnl");
    // NAT and a `ct` match in the namespace: conntrack tracks its connections of both
    // families, and port 81 is DNATed.
    let listener = ns.bind_tcp("127.0.0.1:0");
    let port = listener.local_addr().unwrap().port();
    let listener6 = ns.bind_tcp("[::1]:0");
    let port6 = listener6.local_addr().unwrap().port();
    let rules = format!(
        "table inet ctnl {{ chain out {{ type nat hook output priority -100; \
         ip daddr 127.0.0.1 tcp dport 81 dnat ip to 127.0.0.1:{port}; }}; \
         chain track {{ type filter hook output priority 0; ct state new accept; }}; }}"
    );
    let (ok, out) = ns.run(&["nft", &rules]);
    assert!(ok, "{out}");

    let connect = |to: SocketAddr| -> (TcpStream, SocketAddr) {
        let s = ns.in_thread(move || TcpStream::connect(to).unwrap());
        let local = s.local_addr().unwrap();
        (s, local)
    };
    let plain: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let dnatted: SocketAddr = "127.0.0.1:81".parse().unwrap();
    let v6: SocketAddr = format!("[::1]:{port6}").parse().unwrap();
    let mut open = vec![];
    for to in [plain, dnatted, v6] {
        let (s, from) = connect(to);
        open.push(s);
        let ours = ct::get(&ns.name, (from, to)).unwrap_or_else(|| panic!("no entry for {from} → {to}"));
        let argv = ct::tool_argv((from, to));
        let (ok, text) = ns.run(&argv.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(ok, "{text}");
        let tool = parse::parse_conntrack(&text);
        assert_eq!(tool.len(), 1, "{text}");
        let t = &tool[0];
        assert_eq!(
            (&ours.proto, &ours.state, ours.assured, ours.orig, ours.reply),
            (&t.proto, &t.state, t.assured, t.orig, t.reply),
            "{from} → {to}: conntrack printed {text}"
        );
        assert_eq!(ours.is_natted(), to == dnatted, "{ours:?}");
        assert_eq!(ours.state, "ESTABLISHED", "{ours:?}");
    }
    let nothing: SocketAddr = "127.0.0.1:1".parse().unwrap();
    assert!(ct::get(&ns.name, (nothing, plain)).is_none(), "no such connection");
    drop((open, listener, listener6));
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}
