//! The proxier over a fake iptables with real restore semantics, and packets traced through
//! the rules it writes (no root, no kernel).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kube_proxy::health::Health;
use kube_proxy::iptables::{RenderConfig, ServiceState};
use kube_proxy::metrics::Metrics;
use kube_proxy::model::{Endpoint, ServicePort, ServiceView, SliceView};
use kube_proxy::sync::{self, Proxier};
use podpath_client::reflector::{Change, Store, Watched};
use podpath_ruleset::kernel::Kernel;
use podpath_ruleset::plan::Applied;
use podpath_ruleset::{Ruleset, Table};
use serde_json::json;
use testkit::iptables::{FakeIptables, Packet, Tracer, Verdict};

#[derive(Default)]
struct Fake(Mutex<FakeIptables>);

fn err(stderr: String) -> podpath_ruleset::RulesetError {
    podpath_ruleset::RulesetError::Failed {
        cmd: "iptables-restore (fake)".into(),
        netns: None,
        stderr,
        input_line: None,
    }
}

impl Kernel for Fake {
    fn save(&self, table: &str, chain: Option<&str>) -> podpath_ruleset::Result<Table> {
        let f = self.0.lock().unwrap();
        Ok(match chain {
            None => f.save(table),
            Some(c) => f.save_chain(table, c),
        })
    }
    fn restore(&self, rs: &Ruleset) -> podpath_ruleset::Result<()> {
        self.0.lock().unwrap().restore(rs).map_err(err)
    }
    fn clear_conntrack(&self, _deletes: &[Vec<String>]) {}
}

impl Fake {
    fn chains(&self, table: &str) -> BTreeSet<String> {
        self.0.lock().unwrap().chains(table)
    }
}

const NODE_IP: &str = "192.168.56.11";

fn cfg() -> RenderConfig {
    RenderConfig { random_fully: false, ..RenderConfig::new("node-1", NODE_IP.parse().unwrap()) }
}

fn port(name: &str) -> ServicePort {
    ServicePort {
        cluster_ip: Some("10.96.0.10".parse().unwrap()),
        node_port: Some(30080),
        ..ServicePort::new("default", name, "http", "tcp", 80)
    }
}

fn eps(list: &[(&str, &str)]) -> Vec<Endpoint> {
    list.iter()
        .map(|(ip, node)| Endpoint {
            ip: ip.parse().unwrap(),
            port: 8080,
            node: Some((*node).into()),
            ready: true,
            serving: true,
            terminating: false,
        })
        .collect()
}

/// The tables after one full sync.
fn programmed(states: &[ServiceState]) -> FakeIptables {
    let f = Fake::default();
    sync::sync_once(&f, &cfg(), states, &BTreeSet::new(), true, &mut Applied::default()).unwrap();
    f.0.into_inner().unwrap()
}

fn pkt(src: &str, dst: &str, dport: u16) -> Packet {
    Packet { src: src.parse().unwrap(), dst: dst.parse().unwrap(), proto: "tcp".into(), dport, mark: 0 }
}

fn local() -> Vec<IpAddr> {
    vec![NODE_IP.parse().unwrap()]
}

#[test]
fn a_node_port_is_masqueraded_and_dnated_to_an_endpoint() {
    let ipt = programmed(&[ServiceState {
        port: port("web"),
        endpoints: eps(&[("10.244.1.5", "node-1"), ("10.244.2.5", "node-2")]),
    }]);
    let mut t = Tracer::new(&ipt, local());
    t.statistic = Box::new(|_| false); // never the first: the last endpoint
    let tr = t.trace("nat", "PREROUTING", pkt("203.0.113.10", NODE_IP, 30080));
    assert_eq!(tr.verdict, Verdict::Dnat("10.244.2.5:8080".parse().unwrap()));
    assert_eq!(tr.packet.mark, 0x4000, "external traffic is marked for masquerade");
    let chains = tr.chains();
    assert!(chains[..3] == ["PREROUTING", "KUBE-SERVICES", "KUBE-NODEPORTS"], "{chains:?}");
    assert!(chains.iter().any(|c| c.starts_with("KUBE-EXT-")) && chains.last().unwrap().starts_with("KUBE-SEP-"));
    // …and masqueraded on the way out.
    let out = Tracer::new(&ipt, local()).trace("nat", "POSTROUTING", tr.packet.clone());
    assert_eq!(out.verdict, Verdict::Masquerade);
    // A pod calling the ClusterIP keeps its address (no mark), and gets the first endpoint when
    // the statistic matches.
    let mut t = Tracer::new(&ipt, local());
    t.statistic = Box::new(|_| true);
    let tr = t.trace("nat", "PREROUTING", pkt("10.244.2.9", "10.96.0.10", 80));
    assert_eq!((tr.verdict, tr.packet.mark), (Verdict::Dnat("10.244.1.5:8080".parse().unwrap()), 0));
}

#[test]
fn no_endpoints_reject_and_source_ranges_drop() {
    let mut lb = port("lb");
    lb.cluster_ip = Some("10.96.0.20".parse().unwrap());
    lb.node_port = None;
    lb.load_balancer_ips = vec!["198.51.100.7".parse().unwrap()];
    lb.source_ranges = vec!["203.0.113.0/25".parse().unwrap()];
    let ipt = programmed(&[
        ServiceState { port: port("empty"), endpoints: vec![] },
        ServiceState { port: lb, endpoints: eps(&[("10.244.1.5", "node-1")]) },
    ]);
    let mut t = Tracer::new(&ipt, local());
    let rejected = t.trace("filter", "OUTPUT", pkt("10.244.1.9", "10.96.0.10", 80));
    assert_eq!(rejected.verdict, Verdict::Reject);
    assert!(rejected.steps.iter().any(|s| s.rule.contains("default/empty:http has no endpoints")));
    // Allowed source: DNAT; another source falls through KUBE-FW and is dropped in filter.
    let ok = t.trace("nat", "PREROUTING", pkt("203.0.113.10", "198.51.100.7", 80));
    assert_eq!(ok.verdict, Verdict::Dnat("10.244.1.5:8080".parse().unwrap()));
    let other = t.trace("nat", "PREROUTING", pkt("203.0.113.200", "198.51.100.7", 80));
    assert_eq!(other.verdict, Verdict::Accept, "not DNATed");
    assert!(other.chains().iter().any(|c| c.starts_with("KUBE-FW-")));
    let dropped = t.trace("filter", "FORWARD", other.packet);
    assert_eq!(dropped.verdict, Verdict::Drop);
}

#[test]
fn local_policy_and_session_affinity() {
    let mut local_svc = port("local");
    local_svc.external_policy_local = true;
    let mut sticky = port("sticky");
    sticky.cluster_ip = Some("10.96.0.30".parse().unwrap());
    sticky.node_port = None;
    sticky.affinity_seconds = Some(10800);
    let ipt = programmed(&[
        ServiceState { port: local_svc, endpoints: eps(&[("10.244.2.5", "node-2")]) },
        ServiceState { port: sticky, endpoints: eps(&[("10.244.1.5", "node-1"), ("10.244.2.5", "node-2")]) },
    ]);
    let mut t = Tracer::new(&ipt, local());
    // No local endpoint for ETP=Local: the NodePort is not DNATed, and filter drops it.
    let tr = t.trace("nat", "PREROUTING", pkt("203.0.113.10", NODE_IP, 30080));
    assert_eq!(tr.verdict, Verdict::Accept);
    assert_eq!(t.trace("filter", "INPUT", tr.packet).verdict, Verdict::Drop);
    // Affinity: the first choice sticks even when the dice say otherwise.
    t.statistic = Box::new(|_| true);
    let first = t.trace("nat", "OUTPUT", pkt(NODE_IP, "10.96.0.30", 80)).verdict;
    t.statistic = Box::new(|_| false);
    for _ in 0..3 {
        assert_eq!(t.trace("nat", "OUTPUT", pkt(NODE_IP, "10.96.0.30", 80)).verdict, first);
    }
    assert_ne!(
        t.trace("nat", "OUTPUT", pkt("10.244.3.3", "10.96.0.30", 80)).verdict,
        first,
        "another client is not sticky"
    );
}

fn service(name: &str) -> core::Service {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }))
    .unwrap()
}

fn slice(name: &str, ips: &[&str]) -> discovery::EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-abc"), "namespace": "default", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-2"})).collect::<Vec<_>>()
    }))
    .unwrap()
}

/// Fills a cache as the agent's reflectors do: each object's key and what the proxy reads of it.
fn replace<T: Watched, V: Clone + Send + Sync + 'static>(store: &Store<V>, items: Vec<T>, view: impl Fn(&T) -> V) {
    store.apply(Change::Replace(items.into_iter().map(|o| (o.key(), view(&o))).collect::<BTreeMap<_, _>>()));
}

#[tokio::test]
async fn the_sync_loop_waits_for_lists_then_syncs_partially_and_repairs_a_flushed_table() {
    let fake = Arc::new(Fake::default());
    let services: Arc<Store<ServiceView>> = Store::new();
    let slices: Arc<Store<SliceView>> = Store::new();
    let health = Health::new(Duration::from_secs(60), Arc::new(Metrics::new()));
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(sync::run_proxier(
        Proxier {
            kernel: fake.clone(),
            render: cfg(),
            services: services.clone(),
            slices: slices.clone(),
            health,
            // The canary check runs every period.
            period: Duration::from_millis(200),
            min_interval: Duration::ZERO,
            health_check_bind: None,
        },
        Some(tx),
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    replace(&services, vec![service("web")], ServiceView::of);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(fake.chains("nat").iter().all(|c| !c.starts_with("KUBE-")), "nothing before both lists");
    replace(&slices, vec![slice("web", &["10.244.2.5", "10.244.2.6"])], SliceView::of);
    rx.await.unwrap();
    let seps = |f: &Fake| f.chains("nat").into_iter().filter(|c| c.starts_with("KUBE-SEP-")).count();
    assert_eq!(seps(&fake), 2);
    assert!(fake.0.lock().unwrap().rules("nat", "PREROUTING")[0].contains("-j KUBE-SERVICES"));

    // One endpoint goes: its chain is deleted by the next (partial) sync.
    replace(&slices, vec![slice("web", &["10.244.2.5"])], SliceView::of);
    for _ in 0..100 {
        if seps(&fake) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seps(&fake), 1);

    // Someone flushes everything (canary gone): the canary check forces a full sync that puts
    // it all back.
    *fake.0.lock().unwrap() = FakeIptables::default();
    for _ in 0..100 {
        if seps(&fake) == 1 && fake.chains("nat").contains(sync::CANARY) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seps(&fake), 1);
    assert!(fake.0.lock().unwrap().rules("nat", "PREROUTING")[0].contains("-j KUBE-SERVICES"));
}

/// Rules as the proxy wrote them are no drift: an idle node rewrites nothing (every table
/// written is compared, mangle's canary included — once read as "gone" at every check).
#[test]
fn what_a_full_sync_wrote_reads_back_as_no_drift_and_a_flush_as_drift() {
    let fake = Fake::default();
    let mut applied = podpath_ruleset::plan::Applied::default();
    let state = vec![ServiceState { port: port("web"), endpoints: eps(&[("10.244.2.5", "node-2")]) }];
    sync::sync_once(&fake, &cfg(), &state, &BTreeSet::new(), true, &mut applied).unwrap();
    assert!(fake.chains("mangle").contains(sync::CANARY));
    assert_eq!(sync::drift(&fake, &cfg(), &applied).unwrap(), Vec::<String>::new());
    *fake.0.lock().unwrap() = FakeIptables::default();
    let found = sync::drift(&fake, &cfg(), &applied).unwrap();
    assert!(found.iter().any(|d| d.contains("is gone")), "{found:?}");
}

/// The fake, restoring in batches of at most `lines` lines (as the nft backend does).
struct Batched {
    inner: Fake,
    lines: usize,
    restores: std::sync::atomic::AtomicUsize,
}

impl Kernel for Batched {
    fn save(&self, table: &str, chain: Option<&str>) -> podpath_ruleset::Result<Table> {
        self.inner.save(table, chain)
    }
    fn restore(&self, rs: &Ruleset) -> podpath_ruleset::Result<()> {
        self.restores.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.restore(rs)
    }
    fn clear_conntrack(&self, _deletes: &[Vec<String>]) {}
    fn batch_lines(&self) -> Option<usize> {
        Some(self.lines)
    }
}

fn dump(f: &FakeIptables) -> Vec<(String, String, Vec<String>)> {
    let mut out = vec![];
    for table in ["filter", "nat", "mangle"] {
        for chain in f.chains(table) {
            out.push((table.to_string(), chain.clone(), f.rules(table, &chain)));
        }
    }
    out
}

/// Batched full syncs and minimized partial syncs end in exactly the tables one full restore of
/// the same state gives, and a partial sync after one endpoint change writes one small batch.
#[test]
fn batched_and_minimized_syncs_equal_one_full_restore() {
    let mut states: Vec<ServiceState> = (0..30)
        .map(|i| {
            let mut p = port(&format!("svc-{i}"));
            p.cluster_ip = Some(format!("10.96.1.{}", i + 1).parse().unwrap());
            p.node_port = Some(30100 + i);
            p.external_policy_local = i % 3 == 0;
            let list: Vec<(String, &str)> =
                (0..3).map(|j| (format!("10.244.{}.{}", j + 1, i + 10), ["node-1", "node-2", "node-3"][j])).collect();
            let refs: Vec<(&str, &str)> = list.iter().map(|(a, b)| (a.as_str(), *b)).collect();
            ServiceState { port: p, endpoints: eps(&refs) }
        })
        .collect();
    let batched = Batched { inner: Fake::default(), lines: 40, restores: Default::default() };
    let mut applied = Applied::default();
    let count = |b: &Batched| b.restores.swap(0, std::sync::atomic::Ordering::Relaxed);
    sync::sync_once(&batched, &cfg(), &states, &BTreeSet::new(), true, &mut applied).unwrap();
    assert!(count(&batched) > 10, "a full sync of this size is cut into batches");

    // One endpoint goes away: a partial sync.
    states[7].endpoints.pop();
    let changed: BTreeSet<kube_proxy::model::ServiceKey> = [states[7].port.key()].into();
    sync::sync_once(&batched, &cfg(), &states, &changed, false, &mut applied).unwrap();
    assert_eq!(count(&batched), 1, "one small restore");

    let expected = programmed(&states);
    assert_eq!(dump(&batched.inner.0.lock().unwrap()), dump(&expected));
    // Another full sync finds every jump in place: nothing duplicated.
    sync::sync_once(&batched, &cfg(), &states, &BTreeSet::new(), true, &mut applied).unwrap();
    count(&batched);
    assert_eq!(dump(&batched.inner.0.lock().unwrap()), dump(&expected));
    // Nothing changed: nothing written.
    sync::sync_once(&batched, &cfg(), &states, &BTreeSet::new(), false, &mut applied).unwrap();
    assert_eq!(count(&batched), 0);
}
