//! The nftables mode's rendered table through the real `nft` in a namespace of the test's own,
//! in both layouts: the kernel takes every rule, set and map; `nft list table` prints back
//! exactly the model (rule by rule, in the form nft lists them; element by element); a partial
//! transaction changes only what it says, and stale chains are deleted afterwards.

#[path = "support/churn.rs"]
mod churn;
#[path = "support/fixtures.rs"]
mod fixtures;

use kube_proxy::iptables::ServiceState;
use kube_proxy::model::ServicePort;
use kube_proxy::nftables::{render, Layout, NftConfig, TABLE};
use podpath_ruleset::nft::{delete_chains, Listing, NftFamily, NftTable, Transaction};
use podpath_ruleset::Nft;
use testkit::netns::{host_state, root_or_explain, Netns};

use fixtures::{cfg, cfg_v6, ep, services, services_v6};

fn assert_kernel_holds(nft: &Nft, t: &NftTable) {
    let text = nft.list_table(t.family, TABLE, false).unwrap().expect("the table exists");
    let Listing { chains: got_chains, sets: got_sets } = Listing::parse(&text);
    let Listing { chains: want_chains, sets: want_sets } = Listing::of(t);
    assert_eq!(got_chains.keys().collect::<Vec<_>>(), want_chains.keys().collect::<Vec<_>>(), "chains\n{text}");
    for (name, want) in &want_chains {
        assert_eq!(&got_chains[name], want, "chain {name}\n{text}");
    }
    assert_eq!(got_sets, want_sets, "sets and maps\n{text}");
}

#[test]
fn every_layout_loads_and_lists_back_as_rendered() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("ppnft");
    let nft = Nft::in_netns(&ns.name);
    for layout in [Layout::Current, Layout::V134, Layout::SharedMaps] {
        let config = NftConfig { layout, service_cidrs: vec!["10.96.0.0/12".parse().unwrap()] };
        let first = render(&cfg(), &config, &services());
        let (tx, _) = Transaction::between(None, &first);
        if let Err(e) = nft.apply(&tx) {
            panic!("{layout:?}: nft refused the table: {e}\n{}", tx.text());
        }
        assert_kernel_holds(&nft, &first);

        // A partial sync: one endpoint fewer for `lb`, `empty` gone; only those change.
        let mut next_services = services();
        next_services[0].endpoints.pop();
        // 3 → 2 endpoints: in the shared-maps layout a count no Service had, so a new DNAT
        // chain beside the elements (nft must read the shared map's key back from the kernel).
        next_services[6].endpoints.pop();
        next_services.retain(|s| s.port.id.name != "empty");
        let second = render(&cfg(), &config, &next_services);
        let (tx, stale) = Transaction::between(Some(&first), &second);
        let text = tx.text();
        assert!(!text.contains("delete table") && !text.contains("chain ip kube-proxy services"), "{text}");
        nft.apply(&tx).unwrap_or_else(|e| panic!("{layout:?}: {e}\n{text}"));
        match layout {
            Layout::Current => assert!(stale.is_empty(), "{stale:?}"),
            Layout::V134 => assert_eq!(stale.len(), 2, "the endpoint chains of the endpoints that went: {stale:?}"),
            // An endpoint count no Service has any more leaves its DNAT chains.
            Layout::SharedMaps => assert!(stale.iter().all(|c| c.starts_with("lb-")), "{stale:?}"),
        }
        nft.apply(&delete_chains(NftFamily::Ip, TABLE, &stale)).unwrap();
        assert_kernel_holds(&nft, &second);

        // A first sync over a table someone edited replaces it whole.
        ns.run(&["nft", "add", "chain", "ip", TABLE, "stray/chain"]);
        let (tx, _) = Transaction::between(None, &second);
        nft.apply(&tx).unwrap();
        assert_kernel_holds(&nft, &second);
        nft.delete_table(NftFamily::Ip, TABLE).unwrap();
        assert!(!nft.has_table(NftFamily::Ip, TABLE).unwrap());
    }
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// The shared-maps layout's partial syncs are element commands only: they go to the kernel as
/// one netlink batch (no `nft` process) and the table lists back as rendered, comments
/// included; a batch the kernel refuses changes nothing.
#[test]
fn element_only_syncs_go_over_netlink_and_list_back_as_rendered() {
    use kube_proxy::nft_sync::{sync_full, NftablesKernel};
    use kube_proxy::nftables::{render_changed, Shared};
    if !root_or_explain() {
        return;
    }
    let before_host = host_state();
    let ns = Netns::new("ppnl");
    ns.in_thread(|| {
        let listed = |nft: &Nft| Listing::parse(&nft.list_table(NftFamily::Ip, TABLE, false).unwrap().expect("table"));
        let (k, nft) = (NftablesKernel::default(), Nft::default());
        let config = NftConfig { layout: Layout::SharedMaps, service_cidrs: vec!["10.96.0.0/12".parse().unwrap()] };
        let states = services();
        let (mut table, _) = sync_full(&k, &cfg(), &config, &states).unwrap();
        let mut shared = Shared::of(&cfg(), &config, &states);
        // One endpoint of `plain` replaced, `plain-dns` deleted, a new plain Service with the
        // same endpoint count as `plain-dns` had.
        let mut next = states.clone();
        next[6].endpoints[2] = ep("10.244.3.99", 8080, "node-3", true);
        next.remove(7);
        next.push(ServiceState {
            port: ServicePort {
                cluster_ip: Some("10.96.0.28".parse().unwrap()),
                ..ServicePort::new("default", "fresh", "metrics", "tcp", 9153)
            },
            endpoints: vec![ep("10.244.1.12", 9153, "node-1", true)],
        });
        let (old, new) = (vec![&states[6], &states[7]], vec![&next[6], next.last().unwrap()]);
        let (before, after) = render_changed(&cfg(), &config, &mut shared, &old, &new);
        let (tx, stale) = Transaction::between(Some(&before), &after);
        assert!(stale.is_empty(), "{stale:?}");
        let mut socket = nfnl::Socket::open().unwrap();
        let sent = socket.apply(&tx, &after.sets).unwrap_or_else(|e| panic!("{e}\n{}", tx.text()));
        assert!(sent, "not elements only:\n{}", tx.text());
        table.replace_part(&before, &after);
        let want = Listing::of(&render(&cfg(), &config, &next));
        // The proxier keeps the chains it wrote, not the elements (the kernel has those).
        assert_eq!(Listing::of(&table).chains, want.chains);
        assert_eq!(listed(&nft), want, "the kernel holds what the layout renders");
        assert!(want.sets["service-ips"].iter().any(|e| e.contains("comment \"default/fresh:metrics\"")));

        // Deleting an element that is not there: the kernel refuses the batch, whole.
        let (tx, _) = Transaction::between(Some(&after), &before);
        let mut bad = tx.clone();
        bad.ops.retain(|op| matches!(op, podpath_ruleset::nft::Op::DeleteElement { .. }));
        bad.ops
            .extend(tx.ops.iter().filter(|op| matches!(op, podpath_ruleset::nft::Op::DeleteElement { .. })).cloned());
        assert!(socket.apply(&bad, &after.sets).is_err(), "the second delete of the same elements fails");
        assert_eq!(listed(&nft), want, "nothing of a refused batch is applied");
        // One socket carries batch after batch: back to `states`, and forward again.
        let mut socket = nfnl::Socket::open().unwrap();
        let (back_before, back_after) = render_changed(&cfg(), &config, &mut shared, &new, &old);
        let (back, _) = Transaction::between(Some(&back_before), &back_after);
        assert!(socket.apply(&back, &back_after.sets).unwrap());
        assert_eq!(listed(&nft), Listing::of(&render(&cfg(), &config, &states)));
        let (before, after) = render_changed(&cfg(), &config, &mut shared, &old, &new);
        let (forward, _) = Transaction::between(Some(&before), &after);
        assert!(socket.apply(&forward, &after.sets).unwrap());
        assert_eq!(listed(&nft), want);
    });
    drop(ns);
    assert_eq!(host_state(), before_host, "the host namespace changed");
}

/// Random churn of 300 Services in every layout: after every batch of changes synced the way
/// the proxier syncs them (tracker → partial render → one netlink batch), the kernel's table
/// is exactly the table rendered whole from the caches, each batch written in one transaction;
/// and new connections to the Services all the while never meet a half-applied one (each
/// reaches a ready endpoint the Service had before or after the batch, and none fails while it
/// had endpoints before and after, but for the kernel's own commit race, bounded: see
/// `churn::Soaked::raced`).
#[test]
fn churn_leaves_the_kernel_equal_to_the_model_after_every_batch() {
    if !root_or_explain() {
        return;
    }
    let before_host = host_state();
    for (layout, seed) in [("current", 1), ("v1.34", 2), ("shared-maps", 3)] {
        let ns = Netns::new("ppsoak");
        let s = ns.in_thread(move || {
            let mut c = churn::Churn::new(300, seed);
            let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
            churn::soak(&mut c, layout, 1..=12, 40, until, true)
        });
        assert_eq!(s.difference, None, "{layout}");
        eprintln!(
            "{layout}: {} batches, {} connections, {} lost, {} raced a commit",
            s.batches, s.connections, s.lost, s.raced
        );
        assert!(s.batches >= 10 && s.changes >= s.batches, "{layout}: {s:?}");
        assert_eq!(
            s.half_applied,
            Vec::<String>::new(),
            "{layout}: {} connections; the batches:\n{}",
            s.connections,
            s.batch_log.join("\n")
        );
        assert!(s.answered >= 200, "{layout}: too few connections answered to tell: {s:?}");
        assert!(s.lost * 100 <= s.connections, "{layout}: {} of {} connections lost", s.lost, s.connections);
        assert!(
            s.raced * 100 <= s.connections,
            "{layout}: {} of {} connections raced a commit",
            s.raced,
            s.connections
        );
        drop(ns);
    }
    assert_eq!(host_state(), before_host);
}

/// The namespace's nf_tables generation moves with every transaction (ours over netlink, an
/// `nft` run, anyone's) and stays put otherwise: what spares the proxier's periodic listings.
#[test]
fn the_generation_moves_with_every_transaction_and_only_then() {
    use kube_proxy::nft_sync::{sync_full, NftKernel, NftablesKernel};
    if !root_or_explain() {
        return;
    }
    let before_host = host_state();
    let ns = Netns::new("ppgen");
    ns.in_thread(|| {
        let k = NftablesKernel::default();
        let config = NftConfig { layout: Layout::SharedMaps, service_cidrs: vec![] };
        let g0 = k.generation().expect("a generation");
        assert_eq!(k.generation(), Some(g0), "nothing happened");
        sync_full(&k, &cfg(), &config, &services()).unwrap();
        let g1 = k.generation().unwrap();
        assert_ne!(g1, g0, "our load moved it");
        let out = std::process::Command::new("nft").args(["add", "table", "ip", "somebody-else"]).output().unwrap();
        assert!(out.status.success());
        let g2 = k.generation().unwrap();
        assert_ne!(g2, g1, "another table's change moves it too");
        assert_eq!(k.generation(), Some(g2));
    });
    drop(ns);
    assert_eq!(host_state(), before_host);
}

/// The table of one family through both paths, each in a namespace of its own: `nft -f`
/// (`text`) and netlink (`netlink`, a few rules per transaction, so that a load from nothing
/// goes in many parts).
struct BothPaths {
    family: NftFamily,
    text: kube_proxy::nft_sync::NftablesKernel,
    netlink: kube_proxy::nft_sync::NftablesKernel,
    _namespaces: (Netns, Netns),
}

impl BothPaths {
    fn new(family: NftFamily, text_tag: &str, netlink_tag: &str) -> BothPaths {
        use kube_proxy::nft_sync::NftablesKernel;
        let (text_ns, netlink_ns) = (Netns::new(text_tag), Netns::new(netlink_tag));
        let mut text = NftablesKernel::text(Nft::in_netns(&text_ns.name));
        text.family = family;
        let mut netlink = NftablesKernel::in_netns(Nft::in_netns(&netlink_ns.name));
        netlink.family = family;
        netlink.rules_per_part = 4;
        BothPaths { family, text, netlink, _namespaces: (text_ns, netlink_ns) }
    }

    /// Both kernels list the table alike, word for word and as JSON (handles aside), and no
    /// transaction of the netlink side went to `nft -f`; the listing.
    fn same(&self, what: &str) -> String {
        let json = |k: &kube_proxy::nft_sync::NftablesKernel| {
            testkit::nft::listed_json(k.nft.netns.as_deref().unwrap(), self.family.name(), TABLE)
        };
        let (a, b) = (
            self.text.nft.list_table(self.family, TABLE, false).unwrap(),
            self.netlink.nft.list_table(self.family, TABLE, false).unwrap(),
        );
        assert!(a.is_some(), "{what}: no table");
        assert_eq!(b, a, "{what}: netlink (left) and nft -f (right) differ");
        assert_eq!(json(&self.netlink), json(&self.text), "{what}: the JSON listings differ");
        assert_eq!(self.netlink.nft_runs(), 0, "{what}: a transaction went to nft -f");
        a.unwrap()
    }
}

/// The reference check of the netlink layer: in every layout, the same ruleset loaded over
/// netlink (one batch) in one namespace and through `nft -f` in another lists back the same,
/// word for word (`nft list`) and object for object (`nft -j list`, handles aside) — for the
/// full load of every rule shape the layouts write, and after every batch of random churn
/// synced into both.
#[test]
fn a_table_loaded_over_netlink_lists_back_as_the_one_nft_loads() {
    use kube_proxy::nft_sync::{sync_changed, sync_full, NftKernel};
    use kube_proxy::nftables::Shared;
    use kube_proxy::tracker::Tracker;
    if !root_or_explain() {
        return;
    }
    let before_host = host_state();
    let both = BothPaths::new(NftFamily::Ip, "pptx", "ppnl");
    let (text, netlink) = (&both.text, &both.netlink);
    let same = |what: &str| both.same(what);
    for layout in [Layout::Current, Layout::V134, Layout::SharedMaps] {
        let config = NftConfig { layout, service_cidrs: vec!["10.96.0.0/12".parse().unwrap()] };
        // From nothing (the netlink side in parts), then over the table that is there (one
        // transaction).
        for k in [text, netlink] {
            k.delete_table().unwrap_or_default();
            sync_full(k, &cfg(), &config, &services()).unwrap();
        }
        same(&format!("{layout:?}: full load from nothing"));
        for k in [text, netlink] {
            sync_full(k, &cfg(), &config, &services()).unwrap();
        }
        let listed = same(&format!("{layout:?}: full load over the table"));
        for shape in ["numgen random mod 2 vmap", "fib saddr type local", "ip saddr != { ", "masquerade"] {
            if layout != Layout::SharedMaps || shape != "numgen random mod 2 vmap" {
                assert!(listed.contains(shape), "{layout:?}: the fixture lost its {shape:?} rule\n{listed}");
            }
        }

        // Churn, synced into both kernels alike.
        let mut churn = churn::Churn::new(60, layout as u64 + 7);
        let mut tracker = Tracker::new("node-1");
        tracker.update(&churn.services, &churn.slices);
        let state = tracker.list();
        let mut kept = vec![];
        for k in [text, netlink] {
            let (table, _) = sync_full(k, &cfg(), &config, &state).unwrap();
            kept.push((table, Shared::of(&cfg(), &config, &state)));
        }
        same(&format!("{layout:?}: churn start"));
        for batch in 0..15 {
            let did: Vec<&str> = (0..1 + batch % 6).map(|_| churn.step()).collect();
            let delta = tracker.update(&churn.services, &churn.slices);
            for (k, (table, shared)) in [text, netlink].into_iter().zip(kept.iter_mut()) {
                let (stale, _) = sync_changed(k, &cfg(), &config, shared, table, &delta.old, &delta.new)
                    .unwrap_or_else(|e| panic!("{layout:?} batch {batch} {did:?}: {e}"));
                let stale: Vec<String> = stale.into_iter().filter(|c| table.chain(c).is_none()).collect();
                if !stale.is_empty() {
                    k.apply(&delete_chains(NftFamily::Ip, TABLE, &stale)).unwrap();
                }
            }
            same(&format!("{layout:?}: after batch {batch} {did:?}"));
        }
    }
    drop(both);
    assert_eq!(host_state(), before_host, "the host namespace changed");
}

/// The netlink layer's reference check for the IPv6 proxier's table (`ip6 kube-proxy`): in
/// every layout the same ruleset loaded over netlink in one namespace and through `nft -f` in
/// another lists back the same, word for word and object for object — from nothing (in
/// parts), over the table, and after a partial sync (an endpoint fewer, a Service gone).
#[test]
fn the_ipv6_table_over_netlink_lists_back_as_the_one_nft_loads() {
    use kube_proxy::nft_sync::{sync_changed, sync_full, NftKernel};
    use kube_proxy::nftables::Shared;
    if !root_or_explain() {
        return;
    }
    let before_host = host_state();
    let both = BothPaths::new(NftFamily::Ip6, "pptx6", "ppnl6");
    let (text, netlink) = (&both.text, &both.netlink);
    let same = |what: &str| both.same(what);
    for layout in [Layout::Current, Layout::V134, Layout::SharedMaps] {
        let config = NftConfig { layout, service_cidrs: vec!["fd00:10:96::/112".parse().unwrap()] };
        // Every rule and set of the render goes over netlink (none silently through nft -f).
        let rendered = render(&cfg_v6(), &config, &services_v6());
        assert_eq!(nfnl::unwritable(&rendered), Vec::<String>::new(), "{layout:?}");
        for k in [text, netlink] {
            k.delete_table().unwrap_or_default();
            sync_full(k, &cfg_v6(), &config, &services_v6()).unwrap();
        }
        same(&format!("{layout:?}: full load from nothing"));
        let mut kept = vec![];
        for k in [text, netlink] {
            kept.push(sync_full(k, &cfg_v6(), &config, &services_v6()).unwrap().0);
        }
        let listed = same(&format!("{layout:?}: full load over the table"));
        for shape in ["ip6 saddr != { ", "masquerade", "reject", "ip6 daddr"] {
            assert!(listed.contains(shape), "{layout:?}: the fixture lost its {shape:?} rule\n{listed}");
        }
        // A partial sync, as the proxier makes one.
        let mut next = services_v6();
        next[0].endpoints.pop();
        next.retain(|s| s.port.id.name != "empty");
        for (k, table) in [text, netlink].into_iter().zip(kept.iter_mut()) {
            let mut shared = Shared::of(&cfg_v6(), &config, &services_v6());
            let (stale, _) = sync_changed(k, &cfg_v6(), &config, &mut shared, table, &services_v6(), &next)
                .unwrap_or_else(|e| panic!("{layout:?}: {e}"));
            let stale: Vec<String> = stale.into_iter().filter(|c| table.chain(c).is_none()).collect();
            if !stale.is_empty() {
                k.apply(&delete_chains(NftFamily::Ip6, TABLE, &stale)).unwrap();
            }
        }
        same(&format!("{layout:?}: after a partial sync"));
    }
    drop(both);
    assert_eq!(host_state(), before_host, "the host namespace changed");
}

/// The IPv6 proxier's table, `ip6 kube-proxy`, in every layout: nft takes it, lists it back as
/// rendered, and a partial sync between two renders changes only what it says; the `ip` table
/// of the IPv4 proxier beside it is left alone.
#[test]
fn the_ipv6_table_loads_and_lists_back_in_every_layout() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("ppnft6");
    let nft = Nft::in_netns(&ns.name);
    let v4 = render(&cfg(), &NftConfig::default(), &services());
    nft.apply(&Transaction::between(None, &v4).0).unwrap();
    for layout in [Layout::Current, Layout::V134, Layout::SharedMaps] {
        let config = NftConfig { layout, service_cidrs: vec!["fd00:10:96::/112".parse().unwrap()] };
        let first = render(&cfg_v6(), &config, &services_v6());
        assert_eq!(first.family, NftFamily::Ip6);
        let (tx, _) = Transaction::between(None, &first);
        let text = tx.text();
        assert!(text.contains("table ip6 kube-proxy") && !text.contains(" ip daddr"), "{text}");
        if let Err(e) = nft.apply(&tx) {
            panic!("{layout:?}: nft refused the IPv6 table: {e}\n{text}");
        }
        assert_kernel_holds(&nft, &first);
        let mut next = services_v6();
        next[0].endpoints.pop();
        next.retain(|s| s.port.id.name != "empty");
        let second = render(&cfg_v6(), &config, &next);
        let (tx, stale) = Transaction::between(Some(&first), &second);
        nft.apply(&tx).unwrap_or_else(|e| panic!("{layout:?}: {e}\n{}", tx.text()));
        nft.apply(&delete_chains(NftFamily::Ip6, TABLE, &stale)).unwrap();
        assert_kernel_holds(&nft, &second);
        nft.delete_table(NftFamily::Ip6, TABLE).unwrap();
    }
    assert_kernel_holds(&nft, &v4);
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}
