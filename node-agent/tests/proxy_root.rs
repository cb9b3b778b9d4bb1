//! The rendered ruleset through the real `iptables-restore` in a namespace of the test's own:
//! the kernel and iptables accept every rule shape, and `iptables-save` prints what kube-proxy's
//! rules look like on a real node (reference/kube-proxy.md §1.4.13).

use std::collections::BTreeSet;

use kube_proxy::iptables::{render, RenderConfig, ServiceState};
use kube_proxy::model::{Endpoint, ServicePort};
use podpath_ruleset::exec::RestoreSession;
use podpath_ruleset::{Backend, Iptables};
use testkit::netns::{host_state, root_or_explain, Netns};

fn svc(endpoints: usize) -> ServiceState {
    let port = ServicePort {
        cluster_ip: Some("10.96.0.42".parse().unwrap()),
        node_port: Some(30080),
        external_ips: vec!["169.10.10.1".parse().unwrap()],
        load_balancer_ips: vec!["198.51.100.7".parse().unwrap()],
        source_ranges: vec!["203.0.113.0/24".parse().unwrap()],
        affinity_seconds: Some(600),
        ..ServicePort::new("default", "contour", "http", "tcp", 80)
    };
    let endpoints = (0..endpoints)
        .map(|i| Endpoint {
            ip: format!("10.244.{}.5", i + 1).parse().unwrap(),
            port: 8080,
            node: Some(format!("node-{}", i + 1).into()),
            ready: true,
            serving: true,
            terminating: false,
        })
        .collect();
    ServiceState { port, endpoints }
}

#[test]
fn the_kernel_takes_every_rule_and_stale_chains_go() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("ppx");
    let cfg = RenderConfig::new("node-1", "192.168.56.11".parse().unwrap());
    let ipt = Iptables::new(Backend::System).in_netns(&ns.name);
    let first = render(&cfg, &[svc(3)], &BTreeSet::new());
    if let Err(e) = ipt.restore(&first.ruleset) {
        panic!("iptables-restore refused the ruleset: {e}\n{}", first.ruleset);
    }
    let saved = ipt.save_text("nat").unwrap();
    // kube-proxy's rules as engineers see them on real nodes.
    assert!(saved.contains("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000"), "{saved}");
    assert!(saved.contains("--probability 0.33333333349"), "{saved}");
    assert!(saved.contains("-A KUBE-SERVICES -d 10.96.0.42/32 -p tcp -m comment --comment \"default/contour:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-"), "{saved}");
    // One endpoint fewer: its chain is stale and removed in the same restore.
    let existing: BTreeSet<String> =
        podpath_ruleset::parse(&saved).unwrap().tables[0].chains.iter().map(|c| c.name.clone()).collect();
    let second = render(&cfg, &[svc(2)], &existing);
    ipt.restore(&second.ruleset).unwrap();
    let saved = ipt.save_text("nat").unwrap();
    let seps = saved.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count();
    assert_eq!(seps, 2, "{saved}");
    assert!(saved.contains("--probability 0.50000000000"));
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// The IPv6 proxier's ruleset through the real `ip6tables-restore`: the same shapes with v6
/// addresses, `[addr]:port` DNATs, no KUBE-FIREWALL and `! -d ::1/128` before the NodePorts
/// jump (kube-proxy never answers NodePorts on ::1).
#[test]
fn ip6tables_takes_the_ipv6_proxiers_rules() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("ppx6");
    let cfg = RenderConfig {
        cluster_cidr: Some("fd00:10:244::/56".parse().unwrap()),
        ..RenderConfig::new("node-1", "fd00:56::11".parse().unwrap())
    };
    let port = ServicePort {
        cluster_ip: Some("fd00:10:96::2a".parse().unwrap()),
        node_port: Some(30080),
        load_balancer_ips: vec!["2001:db8:100::7".parse().unwrap()],
        source_ranges: vec!["2001:db8:113::/64".parse().unwrap()],
        affinity_seconds: Some(600),
        ..ServicePort::new("default", "contour", "http", "tcp", 80)
    };
    let endpoints = (1..=2)
        .map(|i| Endpoint {
            ip: format!("fd00:10:244:{i}::5").parse().unwrap(),
            port: 8080,
            node: Some(format!("node-{i}").into()),
            ready: true,
            serving: true,
            terminating: false,
        })
        .collect();
    let rendered = render(&cfg, &[ServiceState { port, endpoints }], &BTreeSet::new());
    let ipt = Iptables::new(Backend::System).v6().in_netns(&ns.name);
    if let Err(e) = ipt.restore(&rendered.ruleset) {
        panic!("ip6tables-restore refused the ruleset: {e}\n{}", rendered.ruleset);
    }
    let nat = ipt.save_text("nat").unwrap();
    assert!(nat.contains("-A KUBE-SERVICES -d fd00:10:96::2a/128 -p tcp -m comment --comment \"default/contour:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-"), "{nat}");
    assert!(nat.contains("-j DNAT --to-destination [fd00:10:244:1::5]:8080"), "{nat}");
    assert!(nat.contains("! -s fd00:10:244::/56 -d fd00:10:96::2a/128"), "{nat}");
    assert!(
        nat.contains("-A KUBE-SERVICES ! -d ::1/128 -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"),
        "{nat}"
    );
    let filter = ipt.save_text("filter").unwrap();
    assert!(!filter.contains("KUBE-FIREWALL"), "{filter}");
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// A kept `iptables-nft-restore` (the proxies' restores): one input after another in one
/// process, each applied before `restore` returns (a table that changes nothing included); a
/// rejected line named as in a restore of its own, the next restore in a new process; the
/// process gone once idle.
#[test]
fn a_kept_restore_process_applies_each_input_before_returning() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("ppks");
    let cfg = RenderConfig::new("node-1", "192.168.56.11".parse().unwrap());
    let ipt = Iptables::new(Backend::Nft).in_netns(&ns.name);
    let session = RestoreSession::new(&ipt)
        .expect("iptables-nft-restore is a program of its own")
        .with_idle(std::time::Duration::from_millis(300));
    let first = render(&cfg, &[svc(3)], &BTreeSet::new());
    session.restore(&first.ruleset).unwrap_or_else(|e| panic!("{e}\n{}", first.ruleset));
    let saved = ipt.save_text("nat").unwrap();
    assert_eq!(saved.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count(), 3, "{saved}");
    let existing: BTreeSet<String> =
        podpath_ruleset::parse(&saved).unwrap().tables[0].chains.iter().map(|c| c.name.clone()).collect();
    session.restore(&render(&cfg, &[svc(2)], &existing).ruleset).unwrap();
    let saved = ipt.save_text("nat").unwrap();
    assert_eq!(saved.lines().filter(|l| l.starts_with(":KUBE-SEP-")).count(), 2, "{saved}");
    assert!(saved.contains("--probability 0.50000000000"), "{saved}");
    // A table whose commit changes nothing (an empty chain declared again) gives the kernel no
    // new generation: the restore still returns, at once.
    let noop = podpath_ruleset::parse("*filter\n:KUBE-PPKS-EMPTY - [0:0]\nCOMMIT\n").unwrap();
    for _ in 0..2 {
        let t = std::time::Instant::now();
        session.restore(&noop).unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "a restore that changes nothing hung");
    }
    assert!(session.is_running());
    // A rule the kernel refuses: the error names the line of this input iptables-nft names
    // (the table's COMMIT, where nf_tables checks the jump), not one counted from the first.
    let bad = podpath_ruleset::parse("*nat\n:KUBE-PPKS - [0:0]\n-A KUBE-PPKS -j KUBE-PPKS-MISSING\nCOMMIT\n").unwrap();
    let err = session.restore(&bad).expect_err("a jump to a missing chain").to_string();
    assert!(err.contains("'KUBE-PPKS-MISSING' does not exist") && err.contains("line: 4"), "{err}");
    assert!(err.ends_with("(input: COMMIT)"), "{err}");
    assert!(!session.is_running());
    session.restore(&render(&cfg, &[svc(1)], &BTreeSet::new()).ruleset).unwrap();
    assert!(ipt.save_text("nat").unwrap().contains("default/contour:http cluster IP"));
    // Idle: the process is ended.
    let t = std::time::Instant::now();
    while session.is_running() {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the idle process was not ended");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}
