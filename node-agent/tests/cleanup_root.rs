//! `node-agent --cleanup` against the rules of every proxy mode, in a namespace of its own.

#[path = "../../kube-proxy/tests/support/fixtures.rs"]
mod fixtures;

use std::collections::BTreeSet;

use fixtures::{cfg, services};
use kube_proxy::nftables::{render, NftConfig, TABLE};
use podpath_ruleset::nft::{NftFamily, Transaction};
use podpath_ruleset::Nft;
use testkit::netns::{host_state, root_or_explain, Netns};

/// `node-agent --cleanup` in a namespace holding both modes' rules (as after a switch of
/// modes) removes the nftables table and the iptables chains and jumps alike.
#[test]
fn cleanup_removes_the_rules_of_every_mode() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("ppcl");
    let nft = Nft::in_netns(&ns.name);
    let table = render(&cfg(), &NftConfig::default(), &services());
    nft.apply(&Transaction::between(None, &table).0).unwrap();
    let ipt = podpath_ruleset::Iptables::new(podpath_ruleset::Backend::Nft).in_netns(&ns.name);
    let rs = kube_proxy::iptables::render(&cfg(), &services(), &BTreeSet::new()).ruleset;
    ipt.restore(&rs).unwrap();
    let (ok, out) = ns.run(&[env!("CARGO_BIN_EXE_node-agent"), "--cleanup"]);
    assert!(ok, "{out}");
    assert!(out.contains("and its nftables table ip kube-proxy"), "{out}");
    assert!(!nft.has_table(NftFamily::Ip, TABLE).unwrap());
    let nat = ipt.save_text("nat").unwrap();
    assert!(!nat.contains("KUBE-SVC-") && !nat.contains("KUBE-SERVICES"), "{nat}");
    // Nothing left: a second cleanup finds nothing and says so.
    let (ok, out) = ns.run(&[env!("CARGO_BIN_EXE_node-agent"), "--cleanup"]);
    assert!(ok && !out.contains("nftables table"), "{out}");
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}
