//! Cluster DNS benchmark (root; prints figures, asserts nothing about speed), in a one-node lab:
//!
//! 1. A queries (`kubernetes.default.svc.cluster.local`) over UDP from the node's namespace,
//!    64 in flight, through the `kube-dns` Service VIP (10.96.0.10, the node's iptables DNAT to
//!    the two DNS pods) against straight to one DNS pod: queries/s and p50/p99 latency.
//! 2. A Service created → its name answered: p50/p99 over 50 creations.
//! 3. The DNS server's resident memory with the lab's few Services, then with 10,000 more
//!    (without endpoints).
//!
//! Run: `cargo build --release --workspace --bins && sudo cargo bench -p podpath-e2e --bench dns`
//! With `PODPATH_FIGURES=book/perf/figures.tsv` its figures are appended to the book's
//! performance data (`testkit::figures`).

use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use podpath_e2e::Lab;

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p podpath-e2e --bench dns");

const QUERIES: usize = 100_000;
const IN_FLIGHT: usize = 64;

fn query(id: u16) -> Vec<u8> {
    query_for(id, "kubernetes.default.svc.cluster.local")
}

fn query_for(id: u16, name: &str) -> Vec<u8> {
    let mut q = vec![(id >> 8) as u8, id as u8, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// (queries/s, p50 ms, p99 ms, lost) for `QUERIES` queries with `IN_FLIGHT` outstanding.
fn load(server: SocketAddr) -> (f64, f64, f64, usize) {
    let s = UdpSocket::bind("0.0.0.0:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut sent: HashMap<u16, Instant> = HashMap::new();
    let mut lat = Vec::with_capacity(QUERIES);
    let (mut next, mut lost) = (0usize, 0usize);
    let mut buf = [0u8; 1500];
    let t0 = Instant::now();
    while lat.len() + lost < QUERIES {
        while sent.len() < IN_FLIGHT && next < QUERIES {
            let id = (next % 65_536) as u16;
            s.send_to(&query(id), server).unwrap();
            sent.insert(id, Instant::now());
            next += 1;
        }
        match s.recv(&mut buf) {
            Ok(n) if n >= 2 => {
                if let Some(t) = sent.remove(&u16::from_be_bytes([buf[0], buf[1]])) {
                    lat.push(t.elapsed().as_secs_f64() * 1000.0);
                }
            }
            _ => {
                // Nothing for 500 ms: what is outstanding is lost.
                lost += sent.len();
                sent.clear();
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    lat.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q) as usize];
    (lat.len() as f64 / secs, p(0.5), p(0.99), lost)
}

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The podpath-dns processes (by their executable), of this lab's state directory.
fn dns_pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|p| p.file_name().is_some_and(|n| n == "podpath-dns"))
        })
        .collect()
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the DNS bench runs as root (it creates a lab)");
        return;
    }
    let before: Vec<i32> = dns_pids();
    let lab = Lab::up("dnsbench", &["--nodes", "1"]).expect("podpath up");
    lab.wait_for_cluster_dns();
    let pod_ip = lab.cluster_dns_pods("{.items[0].status.podIP}");
    let vip: SocketAddr = "10.96.0.10:53".parse().unwrap();
    let direct: SocketAddr = format!("{pod_ip}:53").parse().unwrap();
    let (d, v) = lab.in_netns("node-1", move || (load(direct), load(vip)));
    println!(
        "A queries, {QUERIES} with {IN_FLIGHT} in flight, from the node: straight to one DNS pod {:.0} q/s (p50 {:.2} ms, p99 {:.2} ms, lost {}); through the kube-dns VIP {:.0} q/s (p50 {:.2} ms, p99 {:.2} ms, lost {}) = {:.2} of direct",
        d.0, d.1, d.2, d.3, v.0, v.1, v.2, v.3, v.0 / d.0
    );

    BENCH.record("A queries through the kube-dns VIP", v.0.round(), "q/s", "≥ 20000");
    BENCH.record(
        "A queries through the VIP ÷ straight to a DNS pod",
        (v.0 / d.0 * 100.0).round() / 100.0,
        "ratio",
        "≥ 0.8",
    );
    let st = podpath_lab::state::load_state(&lab.state).unwrap().expect("lab state");
    let api = podpath_lab::state::ApiAccess::of(&st).unwrap();
    // Created → answered: the create's reply, then the name asked every millisecond.
    let mut waits = vec![];
    for i in 0..50 {
        let body = format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"fresh{i}","namespace":"default"}},"spec":{{"ports":[{{"port":80}}]}}}}"#
        );
        let t = Instant::now();
        let (code, out) = api.request("POST", "/api/v1/namespaces/default/services", &body).unwrap();
        assert!(code == 201, "{code} {out}");
        let name = format!("fresh{i}.default.svc.cluster.local");
        let waited = lab.in_netns("node-1", move || {
            let s = UdpSocket::bind("0.0.0.0:0").unwrap();
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let mut buf = [0u8; 512];
            while t.elapsed() < Duration::from_secs(10) {
                s.send_to(&query_for(2, &name), "10.96.0.10:53").unwrap();
                if matches!(s.recv(&mut buf), Ok(n) if n > 8 && buf[7] == 1) {
                    return t.elapsed();
                }
            }
            panic!("{name} not answered within 10 s");
        });
        waits.push(waited.as_secs_f64() * 1000.0);
    }
    waits.sort_by(|a, b| a.total_cmp(b));
    println!(
        "Service created → answered through the VIP (from the create request on), 50 Services: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        waits[24], waits[48], waits[49]
    );
    BENCH.record("Service created → name answered through the VIP, p99 of 50", waits[48], "ms", "");
    let pids: Vec<i32> = dns_pids().into_iter().filter(|p| !before.contains(p)).collect();
    let idle: Vec<String> = pids.iter().map(|p| format!("{:.1} MiB", rss_kib(*p) as f64 / 1024.0)).collect();
    println!("podpath-dns resident memory with the lab's own Services: {}", idle.join(", "));

    // 10,000 Services, created over REST by 8 clients, then the server's memory once settled.
    let t = Instant::now();
    std::thread::scope(|scope| {
        for w in 0..8 {
            let api = &api;
            scope.spawn(move || {
                for i in (w..10_000).step_by(8) {
                    let body = format!(
                        r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"s{i}","namespace":"default"}},"spec":{{"ports":[{{"name":"http","port":80}}]}}}}"#
                    );
                    let (code, out) = api.request("POST", "/api/v1/namespaces/default/services", &body).unwrap();
                    assert!(code == 201, "{code} {out}");
                }
            });
        }
    });
    let created = t.elapsed();
    // Settled: the last Service answers (an answer count of 1 in the header).
    let answered = lab.in_netns("node-1", move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let t = Instant::now();
        let mut buf = [0u8; 512];
        while t.elapsed() < Duration::from_secs(60) {
            s.send_to(&query_for(1, "s9999.default.svc.cluster.local"), "10.96.0.10:53").unwrap();
            if matches!(s.recv(&mut buf), Ok(n) if n > 8 && buf[7] == 1) {
                return Some(t.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    });
    std::thread::sleep(Duration::from_secs(3));
    let rss: Vec<String> = pids.iter().map(|p| format!("{:.1} MiB", rss_kib(*p) as f64 / 1024.0)).collect();
    if let Some(max) = pids.iter().map(|p| rss_kib(*p) as f64 / 1024.0).reduce(f64::max) {
        BENCH.record("podpath-dns RSS with 10,000 more Services", (max * 10.0).round() / 10.0, "MiB", "≤ 30");
    }
    println!(
        "10,000 Services created in {:.1} s, the last answered {:?} later; podpath-dns resident memory: {} ({} servers)",
        created.as_secs_f64(),
        answered.expect("s9999 answered within 60 s"),
        rss.join(", "),
        pids.len()
    );
}
