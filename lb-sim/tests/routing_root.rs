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
