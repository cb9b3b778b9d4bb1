//! Service proxy benchmark (prints figures). For 1,000 and 10,000 Services with 10 endpoints
//! each, for both iptables backends (legacy and nft) and for the nftables mode (kube-proxy's
//! current and v1.34 layouts, and podpath's shared-maps layout), each in a fresh namespace of
//! its own:
//! - full sync (render + `iptables-restore --noflush`, or the nftables transaction as one
//!   netlink batch) beside the bare restore / `nft -f` of the same text;
//! - a sync after one endpoint change (partial render + restore; in nftables mode the
//!   transaction made from the changed port alone) into the full table.
//!
//! Then, through the real proxier loop (watch cache → change tracker → render → kernel) at 100
//! Services (all modes) and 10,000 (nftables modes), the latency from an EndpointSlice event
//! reaching the agent's cache to its rules being applied (p50/p99), with the process's RSS; and
//! a soak of random churn at 10,000 Services (120 s per nftables mode) comparing the kernel's
//! table with the model after every batch, with new connections to the Services meanwhile.
//!
//! "Full sync" and "sync after one endpoint change" are the proxier's own `sync_once` (render,
//! minimize, batch, `iptables-restore`, plus on full syncs the jump checks and `iptables-save`),
//! run inside the namespace by re-executing this binary there.
//!
//! Run: `sudo cargo bench -p podpath-kube-proxy --bench proxy [-- SIZES [MODES]]`, e.g.
//! `-- 1000,10000 legacy,nft,nftables,v1.34,shared-maps` (the default; `nftables` is
//! kube-proxy's nftables mode, `v1.34` and `shared-maps` the same mode with
//! `--nftables-layout v1.34` / `shared-maps`; `dual` adds a dual-stack node's two shared-maps
//! tables, `ip` and `ip6 kube-proxy`, loaded and changed one after the other). A step that has not finished after
//! `PODPATH_BENCH_LIMIT_SECONDS` (default 300) is stopped and reported as such.
//! With `PODPATH_FIGURES=book/perf/figures.tsv` its figures are appended to the book's
//! performance data (`testkit::figures`).

#[path = "../tests/support/churn.rs"]
mod churn;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kube_proxy::iptables::{render, render_partial, RenderConfig, ServiceState};
use kube_proxy::model::ServiceKey;
use kube_proxy::model::{Endpoint, ServicePort};
use kube_proxy::sync::sync_once;
use podpath_ruleset::kernel::{IptablesKernel, Kernel};
use podpath_ruleset::plan::{batches, Applied};
use podpath_ruleset::{Backend, Iptables, Ruleset, Table};

fn services(n: usize, eps: usize) -> Vec<ServiceState> {
    (0..n)
        .map(|i| ServiceState {
            port: ServicePort {
                cluster_ip: Some(format!("10.96.{}.{}", i / 250, i % 250 + 1).parse().unwrap()),
                node_port: Some(30000 + (i % 2768) as u16),
                ..ServicePort::new("bench", &format!("svc-{i}"), "http", "tcp", 80)
            },
            endpoints: (0..eps)
                .map(|j| Endpoint {
                    ip: format!("10.{}.{}.{}", 100 + j, i / 250, i % 250 + 2).parse().unwrap(),
                    port: 8080,
                    node: Some(format!("node-{}", j % 3 + 1).into()),
                    ready: true,
                    serving: true,
                    terminating: false,
                })
                .collect(),
        })
        .collect()
}

fn config() -> RenderConfig {
    RenderConfig::new("node-1", "192.168.56.11".parse().unwrap())
}

/// The same Services' IPv6 side (a dual-stack cluster's second family): ClusterIPs of
/// fd00:10:96::/112, endpoints fd00:10:1JJ::I.
fn services_v6(n: usize, eps: usize) -> Vec<ServiceState> {
    services(n, eps)
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            s.port.cluster_ip = Some(format!("fd00:10:96::{:x}", i + 1).parse().unwrap());
            for (j, e) in s.endpoints.iter_mut().enumerate() {
                e.ip = format!("fd00:10:{}::{:x}", 100 + j, i + 2).parse().unwrap();
            }
            s
        })
        .collect()
}

fn config_v6() -> RenderConfig {
    RenderConfig {
        cluster_cidr: Some("fd00:10::/32".parse().unwrap()),
        ..RenderConfig::new("node-1", "fd00:56::11".parse().unwrap())
    }
}

/// In the namespace: a dual-stack node's two nftables proxiers in the shared-maps layout, one
/// after the other: the cold load of `ip kube-proxy` and of `ip6 kube-proxy` (both over
/// netlink), then one endpoint change in each; then the `ip6` table again through `nft -f` (the
/// path it took before the netlink layer wrote `ip6`), for comparison.
fn child_nft_dual(n: usize) {
    use kube_proxy::nft_sync::{sync_changed, sync_full, NftKernel, NftablesKernel};
    use podpath_ruleset::nft::NftFamily;
    let nft = nft_config("shared-maps");
    let mut text6 = NftablesKernel::text(podpath_ruleset::Nft::default());
    text6.family = NftFamily::Ip6;
    for (family, kernel, cfg, mut state) in [
        ("v4", NftablesKernel::default(), config(), services(n, 10)),
        ("v6", NftablesKernel::for_family(NftFamily::Ip6), config_v6(), services_v6(n, 10)),
        ("v6text", text6, config_v6(), services_v6(n, 10)),
    ] {
        // Each from nothing.
        let _ = kernel.delete_table();
        let t = Instant::now();
        let (mut table, _) = sync_full(&kernel, &cfg, &nft, &state).expect("full sync");
        println!("{family}-full {}", t.elapsed().as_secs_f64() * 1e3);
        let mut shared = kube_proxy::nftables::Shared::of(&cfg, &nft, &state);
        let old = state[n / 2].clone();
        state[n / 2].endpoints.pop();
        let t = Instant::now();
        sync_changed(&kernel, &cfg, &nft, &mut shared, &mut table, &[old], &state[n / 2..=n / 2])
            .expect("partial sync");
        println!("{family}-partial {}", t.elapsed().as_secs_f64() * 1e3);
    }
}

/// Milliseconds the restores of `inputs` (one after the other) take in `ns`, or `None` when they
/// ran past `limit` (the child doing them is then killed).
fn restore(ns: &str, backend: Backend, inputs: &[Ruleset], limit: Duration) -> Option<f64> {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["--child-restore".to_string(), backend.name().to_string()];
    for (i, rs) in inputs.iter().enumerate() {
        let path = dir.path().join(format!("{i}.rules"));
        std::fs::write(&path, rs.to_string()).unwrap();
        args.push(path.display().to_string());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    get(&in_netns(ns, &args, limit), "restore")
}

/// In the namespace: restores the given files in order (each parsed first, not timed).
fn child_restore(backend: Backend, files: &[String]) {
    let inputs: Vec<Ruleset> =
        files.iter().map(|f| podpath_ruleset::parse(&std::fs::read_to_string(f).unwrap()).unwrap()).collect();
    let ipt = Iptables::new(backend);
    let t = Instant::now();
    for rs in &inputs {
        ipt.restore(rs).expect("iptables-restore");
    }
    println!("restore {}", t.elapsed().as_secs_f64() * 1e3);
}

fn show(ms: Option<f64>, limit: Duration) -> String {
    match ms {
        Some(ms) if ms >= 10_000.0 => format!("{:.1} s", ms / 1e3),
        Some(ms) => format!("{ms:.0} ms"),
        None => format!("> {} s (stopped)", limit.as_secs()),
    }
}

fn args() -> Vec<String> {
    std::env::args().skip(1).filter(|a| a != "--bench").collect()
}

fn limit() -> Duration {
    Duration::from_secs(std::env::var("PODPATH_BENCH_LIMIT_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(300))
}

/// In the namespace: the proxier's full sync, then a sync after one endpoint change.
fn child_sync(n: usize, backend: Backend) {
    let ipt = IptablesKernel::new(backend);
    let cfg = config();
    let mut state = services(n, 10);
    let mut applied = Applied::default();
    let t = Instant::now();
    sync_once(&ipt, &cfg, &state, &BTreeSet::new(), true, &mut applied).expect("full sync");
    println!("full {}", t.elapsed().as_secs_f64() * 1e3);
    state[n / 2].endpoints.pop();
    let changed: BTreeSet<ServiceKey> = [state[n / 2].port.key()].into();
    let t = Instant::now();
    sync_once(&ipt, &cfg, &state, &changed, false, &mut applied).expect("partial sync");
    println!("partial {}", t.elapsed().as_secs_f64() * 1e3);
}

/// The nftables layout of a bench mode: `nftables` (kube-proxy's current, v1.36), `v1.34`,
/// `shared-maps`; None for an iptables backend.
fn nft_layout(mode: &str) -> Option<&'static str> {
    match mode {
        "nftables" => Some("current"),
        "v1.34" => Some("v1.34"),
        "shared-maps" => Some("shared-maps"),
        _ => None,
    }
}

/// The nftables mode's settings for a bench mode.
fn nft_config(mode: &str) -> kube_proxy::nftables::NftConfig {
    let layout = nft_layout(mode).expect("an nftables mode");
    kube_proxy::nftables::NftConfig { layout: layout.parse().unwrap(), service_cidrs: vec![] }
}

/// In the namespace: the nftables proxier's full sync, then a sync after one endpoint change.
fn child_nft_sync(n: usize, mode: &str) {
    use kube_proxy::nft_sync::{sync_full, NftablesKernel};
    let k = NftablesKernel::default();
    let (cfg, nft) = (config(), nft_config(mode));
    let mut state = services(n, 10);
    let t = Instant::now();
    let (mut table, _) = sync_full(&k, &cfg, &nft, &state).expect("full sync");
    println!("full {}", t.elapsed().as_secs_f64() * 1e3);
    let mut shared = kube_proxy::nftables::Shared::of(&cfg, &nft, &state);
    // 100 single endpoint replacements (a pod replaced by another), each its own partial sync.
    let mut times = vec![];
    for c in 0..100 {
        let i = (c * 97) % n;
        let old = state[i].clone();
        state[i].endpoints[c % 10].ip = format!("10.99.{}.{}", c / 250, c % 250 + 1).parse().unwrap();
        let t = Instant::now();
        kube_proxy::nft_sync::sync_changed(&k, &cfg, &nft, &mut shared, &mut table, &[old], &state[i..=i])
            .expect("partial sync");
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("replace-p50 {}", times[50]);
    println!("replace-p99 {}", times[98]);
    // The proxier's partial sync: the changed port, as it was and as it is.
    let old = state[n / 2].clone();
    state[n / 2].endpoints.pop();
    let t = Instant::now();
    kube_proxy::nft_sync::sync_changed(&k, &cfg, &nft, &mut shared, &mut table, &[old], &state[n / 2..=n / 2])
        .expect("partial sync");
    println!("partial {}", t.elapsed().as_secs_f64() * 1e3);
}

/// In the namespace: the bare kernel insertion of a full sync's elements — the table's chains
/// and rules loaded first, then its elements' netlink batch, encoded beforehand, timed alone.
/// With `PROF` set, also the times of the render and the encoding (on standard error): where
/// the cold load spends what the kernel does not.
fn child_nft_elements(n: usize, mode: &str) {
    use podpath_ruleset as _;
    let table = kube_proxy::nftables::render(&config(), &nft_config(mode), &services(n, 10));
    let (text, _) = podpath_ruleset::nft::Transaction::between(None, &nfnl::skeleton(&table));
    podpath_ruleset::Nft::default().apply(&text).expect("chains and rules");
    let (batch, acks) = nfnl::encode_elements(&table, 1).expect("elements");
    let mut socket = nfnl::Socket::open().expect("netlink socket");
    let t = Instant::now();
    socket.send(&batch, acks, 1).expect("element batch");
    println!("insert {}", t.elapsed().as_secs_f64() * 1e3);
    let skeleton = nfnl::skeleton(&table);
    println!("elements {}", table.size().1 - skeleton.size().1);
    if std::env::var("PROF").is_ok() {
        let t = Instant::now();
        let table = kube_proxy::nftables::render(&config(), &nft_config(mode), &services(n, 10));
        eprintln!("render {:?}", t.elapsed());
        let t = Instant::now();
        let _ = nfnl::skeleton(&table);
        eprintln!("skeleton {:?}", t.elapsed());
        let t = Instant::now();
        let _ = nfnl::encode_elements(&table, 1);
        eprintln!("encode {:?}", t.elapsed());
    }
}

/// In the namespace: the bare `nft -f FILE`.
fn child_nft_file(file: &str) {
    let t = Instant::now();
    let status = Command::new("nft").args(["-f", file]).status().expect("run nft");
    assert!(status.success(), "nft -f {file}");
    println!("restore {}", t.elapsed().as_secs_f64() * 1e3);
}

/// Runs this binary in `ns` with `args`; its `key value` lines, or `None` past `limit`.
fn in_netns(ns: &str, args: &[&str], limit: Duration) -> Option<Vec<(String, f64)>> {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(exe)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("re-run the bench in the namespace");
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "the bench child failed in {ns}");
            let mut out = String::new();
            std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
            return Some(
                out.lines()
                    .filter_map(|l| l.split_once(' '))
                    .map(|(k, v)| (k.to_string(), v.trim().parse().unwrap()))
                    .collect(),
            );
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn get(v: &Option<Vec<(String, f64)>>, key: &str) -> Option<f64> {
    v.as_ref().and_then(|v| v.iter().find(|(k, _)| k == key).map(|(_, x)| *x))
}

/// Service `i` for the latency runs (one port; NodePort for the first 2,000, which the node
/// port range holds, ClusterIP after).
fn latency_service(i: usize) -> k8s_openapi::api::core::v1::Service {
    churn::service(i, if i < 2000 { churn::Kind::NodePort } else { churn::Kind::ClusterIp })
}

/// Service `i`'s endpoint `j` at generation `gen` (only the last endpoint changes with it).
fn latency_address(i: usize, j: usize, gen: usize) -> String {
    let second = if j == 9 && gen > 0 { 200 + gen % 50 } else { 100 + j };
    format!("10.{second}.{}.{}", i / 250, i % 250 + 1)
}

/// Service `i`'s EndpointSlice, generation `gen`.
fn latency_slice(i: usize, gen: usize) -> k8s_openapi::api::discovery::v1::EndpointSlice {
    let eps: Vec<(String, bool)> = (0..10).map(|j| (latency_address(i, j, gen), true)).collect();
    churn::slice(i, &eps)
}

/// The resident memory of this process (VmRSS), in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

/// In the namespace: the real proxier loop (`mode`: an iptables backend's name, or `nftables`)
/// over in-memory stores holding `n` Services × 10 endpoints; 200 times, one EndpointSlice
/// changes and we wait for the restore or transaction carrying it. Also prints the process's
/// resident memory once the rules are programmed: the stores and the proxier, as in the agent.
fn child_latency(mode: &str, n: usize) {
    use kube_proxy::model::{ServiceView, SliceView};
    use kube_proxy::nft_sync::{NftKernel, NftablesKernel};
    use podpath_client::reflector::{Change, Store, Watched};
    use podpath_ruleset::nft::Transaction;
    use std::sync::{mpsc, Arc, Mutex};

    /// Either kernel, telling the bench what it applied and when.
    struct Watching<K> {
        inner: K,
        applied: Mutex<mpsc::Sender<(Instant, String)>>,
    }
    impl<K> Watching<K> {
        fn tell(&self, text: String) {
            let _ = self.applied.lock().unwrap().send((Instant::now(), text));
        }
    }
    impl Kernel for Watching<IptablesKernel> {
        fn save(&self, table: &str, chain: Option<&str>) -> podpath_ruleset::Result<Table> {
            self.inner.save(table, chain)
        }
        fn restore(&self, rs: &Ruleset) -> podpath_ruleset::Result<()> {
            self.inner.restore(rs)?;
            self.tell(rs.to_string());
            Ok(())
        }
        fn clear_conntrack(&self, deletes: &[Vec<String>]) {
            self.inner.clear_conntrack(deletes)
        }
        fn batch_lines(&self) -> Option<usize> {
            self.inner.batch_lines()
        }
    }
    impl NftKernel for Watching<NftablesKernel> {
        fn apply(&self, tx: &Transaction) -> kube_proxy::Result<()> {
            self.inner.apply(tx).inspect_err(|e| eprintln!("apply: {e}"))?;
            self.tell(tx.text());
            Ok(())
        }
        fn apply_elements(&self, tx: &Transaction, sets: &[podpath_ruleset::nft::Set]) -> kube_proxy::Result<()> {
            self.inner.apply_elements(tx, sets).inspect_err(|e| eprintln!("apply_elements: {e}"))?;
            self.tell(tx.text());
            Ok(())
        }
        fn apply_full(&self, table: &podpath_ruleset::nft::NftTable) -> kube_proxy::Result<()> {
            self.inner.apply_full(table).inspect_err(|e| eprintln!("apply_full: {e}"))?;
            self.tell(String::new());
            Ok(())
        }
        fn chain_rules(&self, chain: &str) -> kube_proxy::Result<Option<Vec<String>>> {
            self.inner.chain_rules(chain)
        }
        fn delete_table(&self) -> kube_proxy::Result<()> {
            self.inner.delete_table()
        }
        fn clear_conntrack(&self, deletes: &[Vec<String>]) {
            self.inner.clear_conntrack(deletes)
        }
    }

    let nftables = nft_layout(mode).is_some();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let (tx, rx) = mpsc::channel();
        // The agent's caches: what the proxy reads of each object.
        let services: Arc<Store<ServiceView>> = Store::new();
        let slices: Arc<Store<SliceView>> = Store::new();
        let health =
            kube_proxy::health::Health::new(Duration::from_secs(60), Arc::new(kube_proxy::metrics::Metrics::new()));
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        // The watch caches first (as the agent's reflectors hold them), measured apart.
        println!("rss-start {}", rss_mib());
        services.apply(Change::Replace((0..n).map(latency_service).map(|s| (s.key(), ServiceView::of(&s))).collect()));
        slices.apply(Change::Replace(
            (0..n).map(|i| latency_slice(i, 0)).map(|s| (s.key(), SliceView::of(&s))).collect(),
        ));
        podpath_client::memory::trim();
        println!("rss-caches {}", rss_mib());
        if nftables {
            tokio::spawn(kube_proxy::nft_sync::run_nft_proxier(
                kube_proxy::nft_sync::NftProxier {
                    kernel: Arc::new(Watching { inner: NftablesKernel::default(), applied: Mutex::new(tx) }),
                    render: config(),
                    nft: nft_config(mode),
                    services: services.clone(),
                    slices: slices.clone(),
                    health,
                    period: Duration::from_secs(3600),
                    min_interval: Duration::ZERO,
                    health_check_bind: None,
                },
                Some(synced_tx),
            ));
        } else {
            tokio::spawn(kube_proxy::sync::run_proxier(
                kube_proxy::sync::Proxier {
                    kernel: Arc::new(Watching {
                        inner: IptablesKernel::new(mode.parse().unwrap()),
                        applied: Mutex::new(tx),
                    }),
                    render: config(),
                    services: services.clone(),
                    slices: slices.clone(),
                    health,
                    period: Duration::from_secs(3600),
                    min_interval: Duration::ZERO,
                    health_check_bind: None,
                },
                Some(synced_tx),
            ));
        }
        synced_rx.await.unwrap();
        println!("rss {}", rss_mib());
        let mut samples = vec![];
        for k in 1..=200 {
            // Service i's generations 1, 2…: each change gives its last endpoint a new address.
            let (i, gen) = (k % n, k / n + 1);
            let s = latency_slice(i, gen);
            let address = latency_address(i, 9, gen);
            // How the new endpoint appears in the applied rules: a map element, or a DNAT rule.
            let want =
                if nftables && mode != "v1.34" { format!("{address} . 8080") } else { format!("{address}:8080") };
            while rx.try_recv().is_ok() {}
            let t = Instant::now();
            slices.apply(Change::Apply(s.key(), SliceView::of(&s)));
            let rx = &rx;
            let done = tokio::task::block_in_place(|| loop {
                let (at, text) = rx.recv_timeout(Duration::from_secs(10)).expect("a restore within 10 s");
                if text.contains(&want) {
                    break at;
                }
            });
            samples.push(done.duration_since(t).as_secs_f64() * 1e3);
        }
        samples.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)];
        println!("p50 {}", pct(0.50));
        println!("p99 {}", pct(0.99));
        println!("max {}", samples[samples.len() - 1]);
        println!("rss-after {}", rss_mib());
    });
}

/// In the namespace: random churn at `n` Services for `seconds`, the kernel compared with the
/// model after every batch ([`churn::soak`]).
fn child_soak(mode: &str, n: usize, seconds: u64) {
    let layout = nft_layout(mode).expect("an nftables mode");
    let mut c = churn::Churn::new(n, 23);
    let until = Instant::now() + Duration::from_secs(seconds);
    let s = churn::soak(&mut c, layout, 1..=20, usize::MAX, until, true);
    let mut ms = s.sync_ms.clone();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| ms.get(((ms.len() as f64 * p) as usize).min(ms.len().saturating_sub(1))).copied().unwrap_or(0.0);
    println!("batches {}", s.batches);
    println!("changes {}", s.changes);
    println!("sync-p50 {}", pct(0.5));
    println!("sync-p99 {}", pct(0.99));
    println!("differences {}", u8::from(s.difference.is_some()));
    println!("connections {}", s.connections);
    println!("answered {}", s.answered);
    println!("lost {}", s.lost);
    println!("raced {}", s.raced);
    println!("half-applied {}", s.half_applied.len());
    for h in &s.half_applied {
        eprintln!("half-applied: {h}");
    }
    if let Some(d) = s.difference {
        eprintln!("{d}");
    }
}

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p podpath-kube-proxy --bench proxy");

/// A figure into `PODPATH_FIGURES` (the book's performance data), when it was measured.
fn figure(figure: String, value: Option<f64>, unit: &str, target: &str) {
    if let Some(value) = value {
        BENCH.record(&figure, value, unit, target);
    }
}

fn main() {
    let args = args();
    if let Some(pos) = args.iter().position(|a| a == "--child-soak") {
        child_soak(&args[pos + 1], args[pos + 2].parse().unwrap(), args[pos + 3].parse().unwrap());
        return;
    }
    if let Some(pos) = args.iter().position(|a| a == "--child-sync") {
        let n = args[pos + 1].parse().unwrap();
        child_sync(n, args[pos + 2].parse().unwrap());
        return;
    }
    if let Some(pos) = args.iter().position(|a| a == "--child-restore") {
        child_restore(args[pos + 1].parse().unwrap(), &args[pos + 2..]);
        return;
    }
    if let Some(pos) = args.iter().position(|a| a == "--child-nft-sync") {
        child_nft_sync(args[pos + 1].parse().unwrap(), &args[pos + 2]);
        return;
    }
    if let Some(pos) = args.iter().position(|a| a == "--child-nft-elements") {
        child_nft_elements(args[pos + 1].parse().unwrap(), &args[pos + 2]);
        return;
    }
    if let Some(pos) = args.iter().position(|a| a == "--child-nft-dual") {
        child_nft_dual(args[pos + 1].parse().unwrap());
        return;
    }
    if let Some(pos) = args.iter().position(|a| a == "--child-nft-file") {
        child_nft_file(&args[pos + 1]);
        return;
    }
    if let Some(pos) = args.iter().position(|a| a == "--child-latency") {
        child_latency(&args[pos + 1], args[pos + 2].parse().unwrap());
        return;
    }
    let positional: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let sizes: Vec<usize> = positional
        .first()
        .map(|s| s.split(',').map(|n| n.parse().expect("SIZES: comma-separated numbers")).collect())
        .unwrap_or_else(|| vec![1000, 10000]);
    let modes: Vec<String> = positional
        .get(1)
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_else(|| ["legacy", "nft", "nftables", "v1.34", "shared-maps"].map(String::from).to_vec());
    let nft_modes: Vec<&str> = modes.iter().map(String::as_str).filter(|m| nft_layout(m).is_some()).collect();
    // `dual`: a dual-stack node's two shared-maps tables (not one of the iptables backends).
    let dual = modes.iter().any(|m| m == "dual");
    let backends: Vec<Backend> = modes
        .iter()
        .filter(|m| !nft_modes.contains(&m.as_str()) && m.as_str() != "dual")
        .map(|b| b.parse().unwrap())
        .collect();
    let limit = limit();
    let cfg = config();
    let root = testkit::netns::root_or_explain();
    for &n in &sizes {
        let mut state = services(n, 10);
        let t = Instant::now();
        let full = render(&cfg, &state, &BTreeSet::new());
        let render_ms = t.elapsed().as_secs_f64() * 1e3;
        state[n / 2].endpoints.pop();
        let changed: BTreeSet<ServiceKey> = [state[n / 2].port.key()].into();
        let t = Instant::now();
        let part = render_partial(&cfg, &state, &full.nat_chains, &changed);
        let part_render_ms = t.elapsed().as_secs_f64() * 1e3;
        let (full_text, part_text) = (full.ruleset.to_string(), part.ruleset.to_string());
        println!("{n} Services × 10 endpoints: {} lines, {} KiB", full_text.lines().count(), full_text.len() / 1024);
        figure(
            format!("iptables render, {} Services × 10", testkit::figures::thousands(n as u64)),
            Some(render_ms),
            "ms",
            "",
        );
        println!(
            "  render: full {render_ms:.1} ms, partial (1 endpoint removed) {part_render_ms:.2} ms, {} lines",
            part_text.lines().count()
        );
        if !root {
            continue;
        }
        if dual {
            let ns = testkit::netns::Netns::new("ppb");
            let out = in_netns(&ns.name, &["--child-nft-dual", &n.to_string()], limit);
            drop(ns);
            let size = format!("{} × 10", testkit::figures::thousands(n as u64));
            for (family, name) in [("v4", "IPv4 (netlink)"), ("v6", "IPv6 (netlink)"), ("v6text", "IPv6 (nft -f)")] {
                let (full, partial) = (get(&out, &format!("{family}-full")), get(&out, &format!("{family}-partial")));
                figure(format!("dual-stack shared-maps, {name} table cold load, {size}"), full, "ms", "");
                figure(format!("dual-stack shared-maps, {name} table one endpoint change, {size}"), partial, "ms", "");
                println!(
                    "  dual-stack shared-maps, {name} table: cold load {}, one endpoint change {}",
                    show(full, limit),
                    show(partial, limit)
                );
            }
        }
        for &backend in &backends {
            let b = backend.name();
            // Fresh namespaces: a restore must not find the chains an earlier one created.
            let ns = testkit::netns::Netns::new("ppb");
            let bare = restore(&ns.name, backend, std::slice::from_ref(&full.ruleset), limit);
            drop(ns);
            let batches = batches(&full.ruleset, IptablesKernel::new(backend).batch_lines());
            let bare_batches = if batches.len() > 1 {
                let ns = testkit::netns::Netns::new("ppb");
                restore(&ns.name, backend, &batches, limit)
            } else {
                bare
            };
            let ns = testkit::netns::Netns::new("ppb");
            let out = in_netns(&ns.name, &["--child-sync", &n.to_string(), b], limit);
            let (sync_ms, partial_ms) = (get(&out, "full"), get(&out, "partial"));
            let ratio = |base: Option<f64>| match (sync_ms, base) {
                (Some(s), Some(b)) => format!("{:.2}", s / b),
                _ => "-".into(),
            };
            if batches.len() > 1 {
                println!(
                    "  {b:>6}: full sync {} | bare restore: one input {} (ratio {}), the same {} batches {} (ratio {})",
                    show(sync_ms, limit),
                    show(bare, limit),
                    ratio(bare),
                    batches.len(),
                    show(bare_batches, limit),
                    ratio(bare_batches)
                );
            } else {
                println!(
                    "  {b:>6}: full sync {} | bare restore {} (ratio {})",
                    show(sync_ms, limit),
                    show(bare, limit),
                    ratio(bare)
                );
            }
            println!("  {b:>6}: sync after one endpoint change {}", show(partial_ms, limit));
            let size = format!("{} × 10", testkit::figures::thousands(n as u64));
            figure(format!("iptables-{b} full sync, {size}"), sync_ms, "ms", "");
            figure(format!("iptables-{b} one endpoint change, {size}"), partial_ms, "ms", "");
        }
        for &mode in &nft_modes {
            // The nftables mode: the same Services as one table `ip kube-proxy`.
            let nft_cfg = nft_config(mode);
            let table = kube_proxy::nftables::render(&cfg, &nft_cfg, &services(n, 10));
            let text = podpath_ruleset::nft::Transaction::between(None, &table).0.text();
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("full.nft");
            std::fs::write(&file, &text).unwrap();
            let ns = testkit::netns::Netns::new("ppb");
            let bare = get(&in_netns(&ns.name, &["--child-nft-file", file.to_str().unwrap()], limit), "restore");
            drop(ns);
            let ns = testkit::netns::Netns::new("ppb");
            let out = in_netns(&ns.name, &["--child-nft-sync", &n.to_string(), mode], limit);
            drop(ns);
            let (sync_ms, partial_ms) = (get(&out, "full"), get(&out, "partial"));
            let ratio = match (sync_ms, bare) {
                (Some(s), Some(b)) => format!("{:.2}", s / b),
                _ => "-".into(),
            };
            let (rules, elements) = table.size();
            let layout = match mode {
                "shared-maps" => "shared-maps layout",
                "v1.34" => "v1.34 layout",
                _ => "current (v1.36) layout",
            };
            let size = format!("{} × 10", testkit::figures::thousands(n as u64));
            figure(
                format!("{layout} cold load over netlink, {size}"),
                sync_ms,
                "ms",
                if mode == "shared-maps" { "≤ 1500" } else { "" },
            );
            if let (Some(s), Some(b)) = (sync_ms, bare) {
                figure(
                    format!("{layout} cold load ÷ nft -f of the same text, {size}"),
                    Some((s / b * 100.0).round() / 100.0),
                    "ratio",
                    "≤ 1.0",
                );
            }
            println!(
                "  nftables ({layout}, {rules} rules, {elements} elements, {} commands): full sync over netlink {} | bare nft -f of the same text {} (ratio {ratio})",
                text.lines().count(),
                show(sync_ms, limit),
                show(bare, limit)
            );
            if mode == "shared-maps" {
                let ns = testkit::netns::Netns::new("ppb");
                let out = in_netns(&ns.name, &["--child-nft-elements", &n.to_string(), mode], limit);
                let insert = get(&out, "insert");
                let ratio = match (sync_ms, insert) {
                    (Some(s), Some(b)) => format!("{:.2}", s / b),
                    _ => "-".into(),
                };
                if let (Some(s), Some(b)) = (sync_ms, insert) {
                    figure(
                        format!("shared-maps cold load ÷ bare element insertion, {size}"),
                        Some(s / b),
                        "ratio",
                        "≤ 1.2",
                    );
                }
                println!(
                    "  {mode}: bare kernel insertion of its {} elements (one netlink batch) {} (full sync ratio {ratio})",
                    get(&out, "elements").unwrap_or(0.0),
                    show(insert, limit)
                );
            }
            println!("  {mode}: sync after one endpoint removed {}", show(partial_ms, limit));
            let f = |k: &str| get(&out, k).map(|v| format!("{v:.1} ms")).unwrap_or("-".into());
            println!("  {mode}: one endpoint replaced, 100 times: p50 {}, p99 {}", f("replace-p50"), f("replace-p99"));
            figure(
                format!("{layout} one endpoint replaced, p99 of 100, {size}"),
                get(&out, "replace-p99"),
                "ms",
                "≤ 10",
            );
        }
    }
    if !root {
        return;
    }
    // The iptables modes at 100 Services only: at 10,000 a sync is a restore of the table.
    let runs: Vec<(&str, usize)> = backends
        .iter()
        .map(|b| (b.name(), 100))
        .chain(nft_modes.iter().flat_map(|&m| [(m, 100), (m, 10_000)]))
        .collect();
    println!(
        "event (an EndpointSlice changed in the agent's cache) → rules applied, 200 changes, 10 endpoints per Service:"
    );
    for (name, n) in runs {
        let ns = testkit::netns::Netns::new("ppb");
        let out = in_netns(&ns.name, &["--child-latency", name, &n.to_string()], limit);
        let f = |k: &str| get(&out, k).map(|v| format!("{v:.1} ms")).unwrap_or("-".into());
        let m = |k: &str| get(&out, k).map(|v| format!("{v:.1} MiB")).unwrap_or("-".into());
        let target = if n <= 100 { "≤ 20" } else { "≤ 50" };
        figure(
            format!(
                "{name}: EndpointSlice event → rules applied, p99 of 200, {} Services",
                testkit::figures::thousands(n as u64)
            ),
            get(&out, "p99"),
            "ms",
            target,
        );
        if n >= 10_000 {
            figure(
                format!("{name}: bench process RSS after the changes, {} × 10", testkit::figures::thousands(n as u64)),
                get(&out, "rss-after"),
                "MiB",
                "≤ 60",
            );
        }
        println!(
            "  {name:>11} at {n:>6} Services: p50 {}, p99 {}, max {} | RSS when the first sync is done {}, after the changes {}",
            f("p50"),
            f("p99"),
            f("max"),
            m("rss"),
            m("rss-after")
        );
    }
    println!("soak: random Service/endpoint churn (batches of 1–20 changes), the kernel's table compared with the model after every batch, new connections to the Services all the while:");
    for &m in &nft_modes {
        let (n, seconds) = (10_000, 120);
        let ns = testkit::netns::Netns::new("ppb");
        let out = in_netns(&ns.name, &["--child-soak", m, &n.to_string(), &seconds.to_string()], limit);
        let f = |k: &str| get(&out, k).map(|v| format!("{v:.0}")).unwrap_or("-".into());
        let ms = |k: &str| get(&out, k).map(|v| format!("{v:.1} ms")).unwrap_or("-".into());
        figure(
            format!(
                "{m}: soak at {} Services, {seconds} s: differences from the model",
                testkit::figures::thousands(n as u64)
            ),
            get(&out, "differences"),
            "count",
            "0",
        );
        figure(
            format!(
                "{m}: soak at {} Services, {seconds} s: half-applied Services met",
                testkit::figures::thousands(n as u64)
            ),
            get(&out, "half-applied"),
            "count",
            "0",
        );
        println!(
            "  {m:>11} at {n} Services, {seconds} s: {} batches, {} changes, partial sync p50 {}, p99 {}; differences: {} | new connections meanwhile: {}, answered {}, lost {}, raced a commit {}, half-applied {}",
            f("batches"),
            f("changes"),
            ms("sync-p50"),
            ms("sync-p99"),
            f("differences"),
            f("connections"),
            f("answered"),
            f("lost"),
            f("raced"),
            f("half-applied")
        );
    }
}
