//! Root test of the gateway's routing in a private namespace: resilient nexthop groups keep
//! the healthy nodes' hash buckets (their flows) where they are when a node is withdrawn, the
//! proxies' addresses come and go with their label, and a final sync leaves nothing of lb-sim's.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use lb_sim::routing::{self, Ip, IpCommand, Observed, Wanted};
use testkit::netns::{host_state, root_or_explain, Netns};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Bucket index → the gateway address it sends to.
fn buckets(ns: &Netns, group: &str) -> BTreeMap<u32, String> {
    let nexthops: BTreeMap<String, String> = ns
        .ip(&["nexthop", "show", "proto", "78"])
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.get(2) == Some(&"via")).then(|| (w[1].to_string(), w[3].to_string()))
        })
        .collect();
    ns.ip(&["nexthop", "bucket", "list", "id", group])
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let index = w.iter().position(|x| *x == "index").and_then(|i| w[i + 1].parse().ok())?;
            let nhid = w.iter().position(|x| *x == "nhid").map(|i| w[i + 1].to_string())?;
            Some((index, nexthops.get(&nhid).cloned().unwrap_or(nhid)))
        })
        .collect()
}

fn want(nodes: &[&str], addresses: &[&str]) -> Wanted {
    let mut routes = BTreeMap::new();
    if !nodes.is_empty() {
        routes.insert(ip("198.51.100.1"), nodes.iter().map(|n| ip(n)).collect::<BTreeSet<_>>());
    }
    Wanted { routes, addresses: addresses.iter().map(|a| ip(a)).collect(), ..Default::default() }
}

#[test]
fn withdrawing_a_node_moves_only_its_buckets_and_cleanup_leaves_nothing() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("lbr");
    ns.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "peer0"]);
    ns.ip(&["link", "set", "eth0", "up"]);
    ns.ip(&["link", "set", "peer0", "up"]);
    ns.ip(&["addr", "add", "192.168.56.2/24", "dev", "eth0"]);
    let gw = IpCommand { netns: Some(ns.name.clone()) };
    let (n1, n2, n3) = ("192.168.56.11", "192.168.56.12", "192.168.56.13");
    // What each sync leaves for the next, as lb-sim keeps it: it must be what the kernel lists.
    let mut known: Option<Observed> = None;
    let in_line = |known: &Option<Observed>| assert_eq!(known.as_ref(), Some(&gw.observe().unwrap()));

    routing::sync(&gw, &want(&[n1, n2, n3], &["198.51.100.9"]), &mut known).expect("first sync");
    in_line(&known);
    let route = ns.ip(&["route", "show", "198.51.100.1"]);
    assert!(route.contains("nhid 65536") && route.contains("proto 78"), "{route}");
    let all = buckets(&ns, "65536");
    assert_eq!(all.len(), routing::BUCKETS as usize);
    assert_eq!(all.values().collect::<BTreeSet<_>>().len(), 3, "{all:?}");
    let addrs = ns.ip(&["-o", "addr", "show", "dev", "lo"]);
    assert!(addrs.contains("198.51.100.9/32") && addrs.contains("lo:pplb"), "{addrs}");
    assert_eq!(
        routing::sync(&gw, &want(&[n1, n2, n3], &["198.51.100.9"]), &mut None).unwrap(),
        0,
        "nothing to change (the kernel read afresh)"
    );
    assert_eq!(routing::sync(&gw, &want(&[n1, n2, n3], &["198.51.100.9"]), &mut known).unwrap(), 0);

    routing::sync(&gw, &want(&[n1, n3], &[]), &mut known).expect("withdraw node 2");
    in_line(&known);
    let after = buckets(&ns, "65536");
    for (i, to) in &all {
        if to != n2 {
            assert_eq!(&after[i], to, "bucket {i} of a healthy node moved");
        } else {
            assert_ne!(after[i], n2, "bucket {i} still goes to the withdrawn node");
        }
    }
    assert!(!ns.ip(&["-o", "addr", "show", "dev", "lo"]).contains("198.51.100.9"));

    // A nexthop deleted behind lb-sim's back (as the kernel does when its device goes): the
    // next change, planned from what lb-sim believed, fails, and the sync reads the kernel and
    // makes it again.
    let n4 = "192.168.56.14";
    routing::sync(&gw, &want(&[n1, n3, n4], &[]), &mut known).expect("a fourth node");
    in_line(&known);
    let id = known.as_ref().unwrap().nexthops.iter().find(|(_, to)| **to == ip(n3)).map(|(id, _)| id.to_string());
    ns.ip(&["nexthop", "del", "id", &id.expect("node 3's nexthop")]);
    routing::sync(&gw, &want(&[n1, n3], &["198.51.100.9"]), &mut known).expect("after a nexthop went");
    in_line(&known);
    assert!(ns.ip(&["nexthop", "show", "proto", "78"]).contains(&format!("via {n3} ")), "node 3 is back");

    routing::sync(&gw, &Wanted::default(), &mut known).expect("cleanup");
    assert_eq!(ns.ip(&["nexthop", "show", "proto", "78"]).trim(), "");
    assert_eq!(ns.ip(&["route", "show", "proto", "78"]).trim(), "");
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// Client ports whose SYNs a node holds (`SYN-RECV`: its answers cannot be delivered).
fn syns_held(node: &Netns) -> BTreeSet<u16> {
    let (ok, out) = node.run(&["ss", "-Htn", "state", "syn-recv"]);
    assert!(ok, "ss: {out}");
    out.lines().filter_map(|l| l.split_whitespace().last()?.rsplit_once(':')?.1.parse().ok()).collect()
}

/// Client ports whose socket, still connecting, has sent its SYN at least twice.
fn syns_sent_twice(client: &Netns) -> BTreeSet<u16> {
    let (ok, out) = client.run(&["ss", "-Htin", "state", "syn-sent"]);
    assert!(ok, "ss: {out}");
    let mut twice = BTreeSet::new();
    let mut port = None;
    for line in out.lines() {
        if !line.starts_with(char::is_whitespace) {
            // `Recv-Q Send-Q Local Peer`: the local address is the third column.
            port = line.split_whitespace().nth(2).and_then(|a| a.rsplit_once(':')?.1.parse::<u16>().ok());
        } else if let Some(p) = port.take() {
            let segs = line.split_whitespace().find_map(|w| w.strip_prefix("segs_out:")?.parse::<u32>().ok());
            if segs.is_some_and(|n| n >= 2) {
                twice.insert(p);
            }
        }
    }
    twice
}

#[test]
fn a_retransmitted_syn_takes_the_node_its_first_syn_took() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let new_ns = |tag: &str| {
        let ns = Netns::new(tag);
        // Addresses usable at once, link-local ones too (no duplicate detection to wait for).
        let (ok, out) =
            ns.run(&["sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0"]);
        assert!(ok, "{out}");
        ns
    };
    let (client, gw) = (new_ns("lbc"), new_ns("lbg"));
    let nodes = [new_ns("lbn"), new_ns("lbn")];
    let (vip4, vip6) = ("198.51.100.1", "2001:db8:100::1");
    let veth = |from: &Netns, dev: &str, to: &Netns, v4: &str, v6: &str| {
        from.ip(&["link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", &to.name]);
        for (ns, a4, a6, d) in [
            (from, format!("{v4}.1/24"), format!("{v6}::1/64"), dev),
            (to, format!("{v4}.2/24"), format!("{v6}::2/64"), "eth0"),
        ] {
            ns.ip(&["link", "set", d, "up"]);
            ns.ip(&["addr", "add", &a4, "dev", d]);
            ns.ip(&["addr", "add", &a6, "dev", d]);
        }
    };
    veth(&gw, "c0", &client, "10.0.0", "fd00:0");
    client.ip(&["route", "add", "default", "via", "10.0.0.1"]);
    client.ip(&["-6", "route", "add", "default", "via", "fd00::1"]);
    for (i, node) in nodes.iter().enumerate() {
        let n = i + 1;
        veth(&gw, &format!("n{n}"), node, &format!("10.{n}.0"), &format!("fd00:{n}"));
        node.ip(&["addr", "add", &format!("{vip4}/32"), "dev", "lo"]);
        node.ip(&["addr", "add", &format!("{vip6}/128"), "dev", "lo"]);
        // The way back leads to a neighbour that never answers: a node's SYN-ACKs are lost,
        // so the client sends its SYNs again and the node keeps each SYN it got.
        node.ip(&["route", "add", "10.0.0.0/24", "via", &format!("10.{n}.0.9")]);
        node.ip(&["-6", "route", "add", "fd00::/64", "via", &format!("fd00:{n}::9")]);
        for to in [format!("10.{n}.0.2"), format!("fd00:{n}::2")] {
            let (ok, out) = gw.run(&["ping", "-c1", "-W2", &to]);
            assert!(ok, "the gateway reaches {to}: {out}");
        }
    }
    for key in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
        let (ok, out) = gw.run(&["sysctl", "-qw", key]);
        assert!(ok, "{key}: {out}");
    }
    let problems = gw.in_thread(routing::hash_by_five_tuple);
    assert!(problems.is_empty(), "{problems:?}");
    let routes = BTreeMap::from([
        (ip(vip4), BTreeSet::from([ip("10.1.0.2"), ip("10.2.0.2")])),
        (ip(vip6), BTreeSet::from([ip("fd00:1::2"), ip("fd00:2::2")])),
    ]);
    let gw_ip = IpCommand { netns: Some(gw.name.clone()) };
    routing::sync(&gw_ip, &Wanted { routes, ..Default::default() }, &mut None).expect("the VIPs' routes");
    let _listeners: Vec<_> =
        nodes.iter().flat_map(|n| [n.bind_tcp(&format!("{vip4}:80")), n.bind_tcp(&format!("[{vip6}]:80"))]).collect();

    // 16 connections a family, each SYN sent again after 1 s: a TCP socket draws a new hash
    // for its packets each time, which the kernel's default multipath policy would follow.
    let targets: Vec<std::net::SocketAddr> =
        vec![format!("{vip4}:80").parse().unwrap(), format!("[{vip6}]:80").parse().unwrap()];
    let sockets = client.in_thread(move || {
        let mut all = Vec::new();
        for dst in &targets {
            for _ in 0..16 {
                let s = socket2::Socket::new(socket2::Domain::for_address(*dst), socket2::Type::STREAM, None).unwrap();
                s.set_nonblocking(true).unwrap();
                let _ = s.connect(&(*dst).into());
                all.push(s);
            }
        }
        all
    });
    let ports: BTreeSet<u16> = sockets.iter().map(|s| s.local_addr().unwrap().as_socket().unwrap().port()).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let held = loop {
        // Retransmissions first, then what the nodes hold: every SYN sent is in by then.
        let again = ports.is_subset(&syns_sent_twice(&client));
        let held = nodes.each_ref().map(syns_held);
        if again && ports.iter().all(|p| held.iter().any(|h| h.contains(p))) {
            break held;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every SYN sent twice and received: {ports:?}, held {held:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    drop(sockets);
    for port in &ports {
        let at: Vec<usize> = (0..2).filter(|i| held[*i].contains(port)).map(|i| i + 1).collect();
        assert_eq!(
            at.len(),
            1,
            "client port {port}'s SYNs reached nodes {at:?} (node 1 held {:?}, node 2 {:?})",
            held[0],
            held[1]
        );
    }
    assert!(held.iter().all(|h| !h.is_empty()), "flows are spread by port: {held:?}");
    drop((client, gw, nodes));
    assert_eq!(host_state(), before, "the host namespace changed");
}
