//! NetworkPolicy benchmark (root; prints figures, asserts nothing about speed), on a two-node
//! lab with 100 pods (`podpath/echo`, spread over both nodes):
//!
//! 1. Policy create → enforced on every node: the targets (`role: target`, one pod on each
//!    node) are isolated by a deny-all; at t0 a policy allowing ingress from the probing pods
//!    is created through the REST API, and a pod on the other node of each target keeps
//!    opening connections to it (a fresh SYN every 2 ms, each waiting 2 ms); the time is the
//!    moment both connect. The allow policy is deleted and the deny checked between rounds.
//!    p50/p99/max over the rounds (iptables and nftables modes).
//! 2. Requests/s from a pod to a pod on the other node, one new connection per request, 4
//!    concurrent clients: with no policy (before and after, averaged), with 100 policies loaded
//!    on the other pods, and with 100 policies that all select the server (each allowing one
//!    other pod; the client is allowed by the last), where every SYN meets the whole union.
//!    Same run, same load generator.
//!
//! Run: `cargo build --release --workspace --bins && sudo cargo bench -p podpath-e2e --bench netpol`
//! Env: `PODPATH_BENCH_ROUNDS` (default 30), `PODPATH_BENCH_SECONDS` (default 3).
//! With `PODPATH_FIGURES=book/perf/figures.tsv` its figures are appended to the book's
//! performance data (`testkit::figures`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use podpath_e2e::{wait_for, Lab};
use podpath_lab::state::ApiAccess;

const PODS: usize = 100;

#[path = "support/mod.rs"]
mod support;
use support::api;

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p podpath-e2e --bench netpol");

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn pod_json(name: &str, node: &str, role: &str) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"role": role, "name": name}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "podpath/echo", "ports": [{"containerPort": 8080}]}]}
    })
    .to_string()
}

/// p0…p99 (p0, p1: targets on node-1, node-2; p2, p3: probes on node-2, node-1; the rest fill).
fn create_pods(lab: &Lab) -> Vec<(String, String)> {
    let a = &api(lab);
    let mut out = vec![];
    for i in 0..PODS {
        let node = format!("node-{}", i % 2 + 1);
        let role = match i {
            0 | 1 => "target",
            2 | 3 => "probe",
            _ => "filler",
        };
        let node = if i == 2 {
            "node-2".to_string()
        } else if i == 3 {
            "node-1".to_string()
        } else {
            node
        };
        let name = format!("p{i}");
        let (code, body) =
            a.request("POST", "/api/v1/namespaces/default/pods", &pod_json(&name, &node, role)).expect("create pod");
        assert_eq!(code, 201, "{body}");
        out.push((name, node));
    }
    support::wait_ready(a, PODS, Duration::from_secs(180));
    out
}

fn pod_ip(a: &ApiAccess, name: &str) -> std::net::IpAddr {
    let (_, body) = a.request("GET", &format!("/api/v1/namespaces/default/pods/{name}"), "").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["status"]["podIP"].as_str().unwrap().parse().unwrap()
}

fn pod_ns(lab: &Lab, a: &ApiAccess, name: &str) -> String {
    let st = podpath_lab::load_state(&lab.state).unwrap().unwrap();
    format!("/proc/{}/ns/net", podpath_lab::hosts::pod_pid(&st, a, "default", name).unwrap())
}

fn policy(name: &str, selector: serde_json::Value, from: Option<serde_json::Value>) -> String {
    let mut spec = serde_json::json!({"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"]});
    if let Some(f) = from {
        spec["ingress"] = serde_json::json!([{"from": [{"podSelector": {"matchLabels": f}}]}]);
    }
    serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                       "metadata": {"name": name}, "spec": spec})
    .to_string()
}

const POLICIES: &str = "/apis/networking.k8s.io/v1/namespaces/default/networkpolicies";

/// A thread in `ns` that tries to connect to `to` until it succeeds or `stop`; the instant it
/// did.
fn prober(ns: String, to: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Option<Instant>> {
    std::thread::spawn(move || {
        let f = std::fs::File::open(&ns).expect("pod netns");
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        while !stop.load(Ordering::Relaxed) {
            if TcpStream::connect_timeout(&to, Duration::from_millis(2)).is_ok() {
                return Some(Instant::now());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    })
}

fn connects(ns: &str, to: SocketAddr) -> bool {
    let (ns, to) = (ns.to_string(), to);
    std::thread::spawn(move || {
        let f = std::fs::File::open(&ns).expect("pod netns");
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        TcpStream::connect_timeout(&to, Duration::from_millis(300)).is_ok()
    })
    .join()
    .unwrap()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn create_to_enforced(mode: &str) {
    let lab = Lab::up("npbench", &["--nodes", "2", "--proxy-mode", mode]).expect("podpath up");
    create_pods(&lab);
    let a = api(&lab);
    let targets = [("p0", "p2"), ("p1", "p3")]; // (target, probe on the other node)
    let deny = policy("deny-targets", serde_json::json!({"role": "target"}), None);
    let (code, body) = a.request("POST", POLICIES, &deny).unwrap();
    assert_eq!(code, 201, "{body}");
    let addrs: Vec<(String, SocketAddr)> =
        targets.iter().map(|(t, p)| (pod_ns(&lab, &a, p), SocketAddr::new(pod_ip(&a, t), 8080))).collect();
    wait_for(Duration::from_secs(10), "targets isolated", || {
        if addrs.iter().any(|(ns, to)| connects(ns, *to)) {
            Err("a probe still connects".into())
        } else {
            Ok(())
        }
    });
    let rounds = env_or("PODPATH_BENCH_ROUNDS", 30);
    let mut times = vec![];
    for _ in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let probes: Vec<_> = addrs.iter().map(|(ns, to)| prober(ns.clone(), *to, stop.clone())).collect();
        std::thread::sleep(Duration::from_millis(20));
        let allow =
            policy("allow-probes", serde_json::json!({"role": "target"}), Some(serde_json::json!({"role": "probe"})));
        let t0 = Instant::now();
        let (code, body) = a.request("POST", POLICIES, &allow).unwrap();
        assert_eq!(code, 201, "{body}");
        let watchdog = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(5));
                stop.store(true, Ordering::Relaxed);
            })
        };
        let done: Vec<Option<Instant>> = probes.into_iter().map(|p| p.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        let _ = watchdog;
        match done.iter().copied().collect::<Option<Vec<Instant>>>() {
            Some(all) => {
                times.push(all.iter().map(|t| t.duration_since(t0).as_secs_f64() * 1000.0).fold(0.0, f64::max))
            }
            None => eprintln!("a round timed out (5 s)"),
        }
        let (code, body) = a.request("DELETE", &format!("{POLICIES}/allow-probes"), "").unwrap();
        assert_eq!(code, 200, "{body}");
        wait_for(Duration::from_secs(10), "isolated again", || {
            if addrs.iter().any(|(ns, to)| connects(ns, *to)) {
                Err("a probe still connects".into())
            } else {
                Ok(())
            }
        });
    }
    times.sort_by(f64::total_cmp);
    if times.is_empty() {
        println!("{mode}: create → enforced on both nodes: every round timed out");
        return;
    }
    BENCH.record(
        &format!("{mode} mode: policy created → enforced on both nodes, p99"),
        (percentile(&times, 0.99) * 10.0).round() / 10.0,
        "ms",
        "≤ 100",
    );
    println!(
        "{mode}: policy create → enforced on both nodes, {PODS} pods, {} rounds: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        times.len(),
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times.last().unwrap()
    );
}

/// Requests/s, a new connection each, `clients` threads in `ns` for `secs`.
fn load(ns: &str, to: SocketAddr, clients: usize, secs: u64) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (ns, done, stop) = (ns.to_string(), done.clone(), stop.clone());
            std::thread::spawn(move || {
                let f = std::fs::File::open(&ns).expect("pod netns");
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let mut buf = [0u8; 4096];
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else { continue };
                    // Closed with a reset: tens of thousands of connections from one pod would
                    // otherwise sit in TIME_WAIT and run out of source ports, and every later
                    // phase of the bench would measure that.
                    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                    if s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").is_ok()
                        && s.read(&mut buf).is_ok_and(|n| n > 0)
                    {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    stop.store(true, Ordering::Relaxed);
    let elapsed = t.elapsed().as_secs_f64();
    for t in threads {
        t.join().unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / elapsed
}

fn throughput(mode: &str) {
    let lab = Lab::up("npbench", &["--nodes", "2", "--proxy-mode", mode]).expect("podpath up");
    create_pods(&lab);
    let a = api(&lab);
    let (server, client) = ("p0", "p2"); // node-1 ← node-2
    let (ns, to) = (pod_ns(&lab, &a, client), SocketAddr::new(pod_ip(&a, server), 8080));
    let secs = env_or("PODPATH_BENCH_SECONDS", 3);
    let _ = load(&ns, to, 4, 1); // warm-up
    let create = |name: String, selector: serde_json::Value, from: String| {
        let body = policy(&name, selector, Some(serde_json::json!({"name": from})));
        let (code, out) = a.request("POST", POLICIES, &body).unwrap();
        assert_eq!(code, 201, "{out}");
    };
    let none = load(&ns, to, 4, secs);
    // 100 policies loaded, each isolating one of the other pods (the server and client are
    // not selected): what a node carries when a cluster has policies.
    for i in 0..100 {
        let (sel, from) = (format!("p{}", 4 + i % (PODS - 4)), format!("p{}", 4 + (i + 1) % (PODS - 4)));
        create(format!("other{i:03}"), serde_json::json!({"name": sel}), from);
    }
    std::thread::sleep(Duration::from_secs(2));
    let loaded = load(&ns, to, 4, secs);
    // The worst case: 100 policies select the server; policy i allows one filler pod, the last
    // the client, so every SYN meets the whole union.
    for i in 0..100 {
        let from = if i == 99 { client.to_string() } else { format!("p{}", 4 + i % (PODS - 4)) };
        create(format!("np{i:03}"), serde_json::json!({"role": "target"}), from);
    }
    std::thread::sleep(Duration::from_secs(2));
    assert!(connects(&ns, to), "the client is allowed by the last policy");
    let union = load(&ns, to, 4, secs);
    for name in (0..100).map(|i| format!("other{i:03}")).chain((0..100).map(|i| format!("np{i:03}"))) {
        let (code, out) = a.request("DELETE", &format!("{POLICIES}/{name}"), "").unwrap();
        assert_eq!(code, 200, "{out}");
    }
    std::thread::sleep(Duration::from_secs(2));
    let none2 = load(&ns, to, 4, secs);
    let base = (none + none2) / 2.0;
    BENCH.record(
        &format!("{mode} mode: req/s with 100 policies selecting the server ÷ none"),
        (union / base * 100.0).round() / 100.0,
        "ratio",
        "≥ 0.9",
    );
    println!(
        "{mode}: pod → pod across nodes, new connection per request, 4 clients: {none:.0} and {none2:.0} req/s without \
         policies; {loaded:.0} req/s with 100 policies on other pods (ratio {:.2}); {union:.0} req/s with 100 policies \
         selecting the server (ratio {:.2})",
        loaded / base,
        union / base
    );
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |part: &str| args.is_empty() || args.iter().any(|a| a == part);
    for mode in ["iptables", "nftables"] {
        if want("latency") {
            create_to_enforced(mode);
        }
        if want("throughput") {
            throughput(mode);
        }
    }
}
