//! The netlink layer's proof, on its own: a table of every form it writes (base and regular
//! chains with comments; verdict maps, `numgen` maps, concatenations, typeof maps, interval
//! and timeout sets declared; `ct`, `fib`, `mark`, `dnat`, `masquerade`, `reject`, `update`, anonymous
//! sets) is loaded in one network namespace through this crate and in another through
//! `nft -f` of the same transaction, and `nft list` and `nft -j list` (handles aside) must agree
//! word for word — from nothing, after a change of elements and rules, and after deletions.
//! Root only (namespaces); the host's namespace is compared before and after.

use podpath_ruleset::nft::{Chain, Element, NftFamily, NftTable, Op, Set, Transaction};
use podpath_ruleset::Nft;
use testkit::netns::{host_state, root_or_explain, Netns};
use testkit::nft::listed_json;

const TABLE: &str = "nfnl-roundtrip";

fn table() -> NftTable {
    let mut t = NftTable::new(NftFamily::Ip, TABLE);
    t.comment = Some("the netlink layer's round trip".into());
    t.add_chain(Chain::base("nat-prerouting", "nat", "prerouting", -100).rule("jump services"));
    t.add_chain(Chain::base("nat-postrouting", "nat", "postrouting", 100).rule("jump masquerading"));
    t.add_chain(
        Chain::base("filter-forward", "filter", "forward", 0)
            .rule("ct state new jump firewall")
            .rule("ct state invalid drop"),
    );
    t.add_chain(
        Chain::regular("services")
            .rule("ip daddr . meta l4proto . th dport vmap @service-ips")
            .rule("ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports")
            .with_comment("the entry of every Service address"),
    );
    t.add_chain(
        Chain::regular("masquerading")
            .rule("mark and 0x00004000 == 0 return")
            .rule("mark set mark xor 0x00004000")
            .rule("masquerade fully-random"),
    );
    t.add_chain(Chain::regular("mark-for-masquerade").rule("mark set mark or 0x00004000"));
    t.add_chain(
        Chain::regular("firewall")
            .rule("ip daddr . meta l4proto . th dport vmap @firewall-ips")
            .rule("ip saddr != { 203.0.113.0/25, 198.51.100.0/24 } drop"),
    );
    t.add_chain(Chain::regular("reject-chain").rule("reject").with_comment("no endpoints"));
    t.add_chain(
        Chain::regular("service-web")
            .rule("ip daddr 10.96.0.20 ip saddr != 10.244.0.0/16 jump mark-for-masquerade")
            .rule("ip saddr @affinity-web goto endpoint-web-1")
            .rule("meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.2.7 . 8080 }"),
    );
    t.add_chain(
        Chain::regular("service-dns")
            .rule("numgen random mod 2 vmap { 0 : goto endpoint-web-1, 1 : goto reject-chain }")
            .rule("dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @endpoints"),
    );
    t.add_chain(
        Chain::regular("endpoint-web-1")
            .rule("ip saddr 10.244.1.5 jump mark-for-masquerade")
            .rule("update @affinity-web { ip saddr }")
            .rule("meta l4proto tcp dnat to 10.244.1.5:8080"),
    );
    t.add_chain(
        Chain::regular("external-web")
            .rule("fib saddr type local mark set mark or 0x00004000 comment \"local traffic\"")
            .rule("goto service-web"),
    );
    let tuple = "ipv4_addr . inet_proto . inet_service";
    let mut service_ips = Set::map("service-ips", tuple, "verdict").with_comment("ClusterIP and LB IP traffic");
    service_ips.insert(Element::key(&["10.96.0.20", "tcp", "80"]).to("goto service-web").with_comment("default/web"));
    service_ips.insert(Element::key(&["198.51.100.1", "tcp", "80"]).to("goto external-web"));
    service_ips.insert(Element::key(&["10.96.0.10", "udp", "53"]).to("goto service-dns"));
    t.sets.push(service_ips);
    let mut nodeports = Set::map("service-nodeports", "inet_proto . inet_service", "verdict");
    nodeports.insert(Element::key(&["tcp", "30080"]).to("goto external-web"));
    t.sets.push(nodeports);
    let mut firewall = Set::map("firewall-ips", tuple, "verdict");
    firewall.insert(Element::key(&["198.51.100.1", "tcp", "80"]).to("drop"));
    t.sets.push(firewall);
    let mut endpoints =
        Set::map_of("endpoints", "ip daddr . meta l4proto . tcp dport . numgen random mod 1", "ip daddr . tcp dport");
    endpoints.insert(Element::key(&["10.96.0.10", "tcp", "53", "0"]).to("10.244.1.8 . 53"));
    endpoints.insert(Element::key(&["10.96.0.10", "tcp", "53", "1"]).to("10.244.2.8 . 53"));
    t.sets.push(endpoints);
    let mut affinity = Set::plain("affinity-web", "ipv4_addr");
    affinity.flags = vec!["dynamic".into(), "timeout".into()];
    affinity.timeout = Some("10800s".into());
    t.sets.push(affinity);
    let mut nodeport_ips = Set::plain("nodeport-ips", "ipv4_addr").with_comment("IPs that accept NodePort traffic");
    nodeport_ips.insert(Element::key(&["192.168.56.11"]));
    t.sets.push(nodeport_ips);
    // Declared only: the elements of a named interval set are not a form this layer writes.
    let mut cidrs = Set::plain("pod-cidrs", "ipv4_addr");
    cidrs.flags = vec!["interval".into()];
    t.sets.push(cidrs);
    t
}

/// One transaction both ways: `nft -f` in `text`, this crate in `netlink` (which must take it).
fn apply(tx: &Transaction, sets: &[Set], text: &Nft, socket: &mut nfnl::Socket) {
    text.apply(tx).unwrap_or_else(|e| panic!("nft -f refused the transaction: {e}\n{}", tx.text()));
    assert!(socket.apply(tx, sets).unwrap(), "not a transaction this layer writes:\n{}", tx.text());
}

#[test]
fn a_table_of_every_form_lists_back_as_the_one_nft_loads() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let (text_ns, netlink_ns) = (Netns::new("nfrt"), Netns::new("nfrn"));
    let text = Nft::in_netns(&text_ns.name);
    let mut socket = nfnl::Socket::open_in(Some(&netlink_ns.name)).unwrap();
    let same = |what: &str| {
        let a = text.list_table(NftFamily::Ip, TABLE, false).unwrap();
        let b = Nft::in_netns(&netlink_ns.name).list_table(NftFamily::Ip, TABLE, false).unwrap();
        assert!(a.is_some(), "{what}: no table");
        assert_eq!(b, a, "{what}: netlink (left) and nft -f (right) differ");
        assert_eq!(
            listed_json(&netlink_ns.name, "ip", TABLE),
            listed_json(&text_ns.name, "ip", TABLE),
            "{what}: the JSON listings differ"
        );
        a.unwrap()
    };

    let first = table();
    assert_eq!(nfnl::unwritable(&first), Vec::<String>::new(), "the fixture holds a form this layer cannot write");
    let (load, _) = Transaction::between(None, &first);
    apply(&load, &[], &text, &mut socket);
    let listed = same("the load from nothing");
    for shape in
        ["numgen random mod 2", "fib saddr type local", "masquerade fully-random", "flags interval", "timeout 3h"]
    {
        assert!(listed.contains(shape), "the fixture lost its {shape:?}\n{listed}");
    }
    let g = socket.generation().unwrap();
    assert!(
        socket.has_table(NftFamily::Ip, TABLE).unwrap() && !socket.has_table(NftFamily::Ip, "no-such-table").unwrap()
    );
    assert!(!socket.has_table(NftFamily::Ip6, TABLE).unwrap(), "an ip table is not an ip6 one");

    // Elements in and out, a chain rewritten, a chain and a set added.
    let mut next = first.clone();
    let ips = next.set_mut("service-ips").unwrap();
    ips.elements.retain(|k, _| !k.starts_with("198.51.100.1"));
    ips.insert(Element::key(&["10.96.0.21", "tcp", "443"]).to("goto reject-chain"));
    next.set_mut("nodeport-ips").unwrap().insert(Element::key(&["192.168.56.12"]));
    next.chain_mut("service-web").unwrap().rules =
        vec!["meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.244.2.7 . 8080 }".into()];
    next.add_chain(Chain::regular("endpoint-web-2").rule("meta l4proto tcp dnat to 10.244.2.7:8080"));
    next.sets.push(Set::plain("cluster-ips", "ipv4_addr").with_comment("Active ClusterIPs"));
    let (change, _) = Transaction::between(Some(&first), &next);
    assert!(change.ops.iter().any(|o| matches!(o, Op::DeleteElement { .. })), "the change deletes an element");
    apply(&change, &first.sets, &text, &mut socket);
    same("after elements, a rewritten chain, a new chain and set");
    assert_ne!(socket.generation().unwrap(), g, "the generation moves with a transaction");

    // What it does not write it refuses to guess: the transaction goes to `nft -f` instead.
    let mut interval = next.clone();
    interval.set_mut("pod-cidrs").unwrap().insert(Element::key(&["10.244.2.0/24"]));
    assert_eq!(nfnl::unwritable(&interval), ["the elements of set pod-cidrs"]);
    let (tx, _) = Transaction::between(Some(&next), &interval);
    assert!(!socket.apply(&tx, &next.sets).unwrap(), "an interval element is not this layer's to write");

    // Deletions: a chain nothing jumps to, a set no rule names, then the table.
    let mut tx = Transaction::new(&next);
    tx.ops.push(Op::DeleteChain("endpoint-web-2".into()));
    tx.ops.push(Op::DeleteSet("cluster-ips".into(), false));
    apply(&tx, &next.sets, &text, &mut socket);
    same("after deleting a chain and a set");
    let mut tx = Transaction::new(&next);
    tx.ops.push(Op::DeleteTable);
    apply(&tx, &[], &text, &mut socket);
    assert!(!socket.has_table(NftFamily::Ip, TABLE).unwrap(), "the table is gone over netlink");
    assert!(!text.has_table(NftFamily::Ip, TABLE).unwrap(), "and through nft -f");
    drop((text_ns, netlink_ns));
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// `podpath trace`'s table shapes (DSCP, TCP flags, an interface name, `meta nftrace set 1`,
/// filter chains at priority -350), in both families, list back as nft's own.
#[test]
fn the_trace_tables_shapes_list_back_as_the_ones_nft_loads() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let (text_ns, netlink_ns) = (Netns::new("nftt"), Netns::new("nftn"));
    let text = Nft::in_netns(&text_ns.name);
    let mut socket = nfnl::Socket::open_in(Some(&netlink_ns.name)).unwrap();
    for (family, ip) in [(NftFamily::Ip, "ip"), (NftFamily::Ip6, "ip6")] {
        let mut t = NftTable::new(family, "trace-shapes");
        t.comment = Some("a trace table".into());
        t.add_chain(Chain::base("prerouting", "filter", "prerouting", -350).rule("iifname != \"lo\" jump probe"));
        t.add_chain(Chain::base("output", "filter", "output", -350).rule("jump probe"));
        t.add_chain(
            Chain::regular("probe")
                .rule(format!("{ip} dscp 0x2d tcp flags & (syn | ack) == syn goto traced"))
                .rule("tcp dport 41000 tcp flags & (syn | ack) == syn | ack goto traced")
                .rule(format!("{ip} dscp 0x2d tcp flags & rst == rst meta nftrace set 1"))
                .rule(format!("{ip} dscp 0x2d udp dport 9 goto traced")),
        );
        t.add_chain(Chain::regular("traced").rule("meta nftrace set 1"));
        assert_eq!(nfnl::unwritable(&t), Vec::<String>::new(), "{ip}");
        apply(&Transaction::between(None, &t).0, &[], &text, &mut socket);
        let a = text.list_table(family, "trace-shapes", false).unwrap();
        let b = Nft::in_netns(&netlink_ns.name).list_table(family, "trace-shapes", false).unwrap();
        assert!(a.as_deref().is_some_and(|l| l.contains("meta nftrace set 1")), "{ip}: {a:?}");
        assert_eq!(b, a, "{ip}: netlink (left) and nft -f (right) differ");
        assert_eq!(listed_json(&netlink_ns.name, ip, "trace-shapes"), listed_json(&text_ns.name, ip, "trace-shapes"));
        let mut tx = Transaction::new(&t);
        tx.ops.push(Op::DeleteTable);
        apply(&tx, &[], &text, &mut socket);
        assert!(!socket.has_table(family, "trace-shapes").unwrap(), "{ip}: the table is gone");
    }
    drop((text_ns, netlink_ns));
    assert_eq!(host_state(), before, "the host namespace changed");
}
