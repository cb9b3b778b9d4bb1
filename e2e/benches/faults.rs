//! Fault benchmark (root; prints figures, asserts nothing about speed). A two-node lab, a
//! LoadBalancer Service with one `podpath/echo` pod per node, and 8 clients in the lab's
//! external client sending requests through the load balancer (a new connection each, 1 s
//! timeout) for the whole run. Per fault it prints:
//!
//! - **detect**: from the fault to the cluster's first reaction (the LB withdrawing the node,
//!   the node turning NotReady, the agent counting a repair, the pod's endpoint leaving);
//! - **route around**: from the fault to the last failed request before service is whole again
//!   (0 when none failed);
//! - **failed/sent**: requests failed out of those sent from the fault until it was cleared;
//! - **heal**: from `fault clear` (or `node start`) to the state before the fault; for a
//!   flush and a killed pod, which nobody clears, from the fault itself.
//!
//! Faults: node-2's uplink down (`externalTrafficPolicy: Local`), node-2 stopped (its agent and
//! pods gone, `Cluster`), node-2 partitioned from the API, node-1's rules flushed, node-2's pod
//! killed.
//!
//! Run: `cargo build --release --workspace --bins && sudo cargo bench -p podpath-e2e --bench faults`
//! With `PODPATH_FIGURES=book/perf/figures.tsv` its figures are appended to the book's
//! performance data (`testkit::figures`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use podpath_e2e::{wait_for, Lab};

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p podpath-e2e --bench faults");

/// Every request's end: when, and whether it was answered.
type Log = Arc<Mutex<Vec<(Instant, bool)>>>;

fn load(lab: &Lab, to: SocketAddr, stop: Arc<AtomicBool>, log: Log) -> Vec<std::thread::JoinHandle<()>> {
    (0..8)
        .map(|_| {
            let (stop, log) = (stop.clone(), log.clone());
            let ns = std::fs::File::open(format!("/run/netns/pp-{}-client", lab.name)).expect("client netns");
            std::thread::spawn(move || {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
                let mut buf = [0u8; 2048];
                while !stop.load(Ordering::Relaxed) {
                    let ok = TcpStream::connect_timeout(&to, Duration::from_secs(1)).is_ok_and(|mut s| {
                        // Closed with a reset, so a minute of requests does not use up the
                        // client's source ports in TIME_WAIT.
                        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
                        s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").is_ok()
                            && s.read(&mut buf).is_ok_and(|n| n > 0)
                    });
                    log.lock().unwrap().push((Instant::now(), ok));
                    if !ok {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            })
        })
        .collect()
}

fn in_rotation(lab: &Lab, node_ip: &str) -> bool {
    lab.exec("gateway", &["ip", "nexthop", "show"]).contains(node_ip)
}

fn node_ready(lab: &Lab, node: &str) -> bool {
    lab.kubectl(&["get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]) == "True"
}

struct Figures {
    fault: &'static str,
    detect: Option<Duration>,
    route_around: Duration,
    failed: usize,
    sent: usize,
    heal: Option<Duration>,
}

fn print(f: &Figures) {
    let ms = |d: Option<Duration>| d.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0)).unwrap_or("—".into());
    BENCH.record(
        &format!("{}: the load balancer routes around it", f.fault),
        (f.route_around.as_secs_f64() * 100.0).round() / 100.0,
        "s",
        "",
    );
    println!(
        "{:<44} detect {:>9}  route around {:>9}  failed {:>4}/{:<5}  heal {:>9}",
        f.fault,
        ms(f.detect),
        ms(Some(f.route_around)),
        f.failed,
        f.sent,
        ms(f.heal)
    );
}

/// Requests from `from` to `to` in the log: (failed, sent, last failure after `from`).
fn count(log: &Log, from: Instant, to: Instant) -> (usize, usize, Duration) {
    let l = log.lock().unwrap();
    let window: Vec<&(Instant, bool)> = l.iter().filter(|(t, _)| *t >= from && *t <= to).collect();
    let failed: Vec<&&(Instant, bool)> = window.iter().filter(|(_, ok)| !ok).collect();
    let last = failed.iter().map(|(t, _)| t.duration_since(from)).max().unwrap_or_default();
    (failed.len(), window.len(), last)
}

/// Polls `f` every 20 ms until it holds (at most `limit`); the time it took.
fn until(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let lab = Lab::up("fbench", &["--nodes", "2"]).expect("podpath up");
    lab.web_pod_on_each_node_behind_a_load_balancer();
    let ip = lab.lb_ip("web");
    let to: SocketAddr = format!("{ip}:80").parse().unwrap();
    wait_for(Duration::from_secs(20), "both nodes in rotation", || {
        if in_rotation(&lab, "192.168.56.11") && in_rotation(&lab, "192.168.56.12") {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |part: &str| args.is_empty() || args.iter().any(|a| a == part);
    let stop = Arc::new(AtomicBool::new(false));
    let log: Log = Arc::default();
    let clients = load(&lab, to, stop.clone(), log.clone());
    std::thread::sleep(Duration::from_secs(1));
    println!("2 nodes, one pod each behind a passthrough LoadBalancer, 8 clients (new connection per request):");

    // 1. node-2's uplink down, externalTrafficPolicy Local.
    if want("link") {
        lab.kubectl(&["patch", "svc", "web", "--type=merge", "-p", r#"{"spec":{"externalTrafficPolicy":"Local"}}"#]);
        std::thread::sleep(Duration::from_secs(2));
        let t0 = Instant::now();
        assert!(lab.run("fault", &["link", "down", "node-2"]).0);
        let detect = until(Duration::from_secs(30), || !in_rotation(&lab, "192.168.56.12"));
        std::thread::sleep(Duration::from_secs(2));
        let t1 = Instant::now();
        assert!(lab.run("fault", &["clear", "node-2"]).0);
        let heal = until(Duration::from_secs(30), || in_rotation(&lab, "192.168.56.12"));
        let (failed, sent, last) = count(&log, t0, t1);
        print(&Figures { fault: "link down node-2 (Local)", detect, route_around: last, failed, sent, heal });
        lab.kubectl(&["patch", "svc", "web", "--type=merge", "-p", r#"{"spec":{"externalTrafficPolicy":"Cluster"}}"#]);
        std::thread::sleep(Duration::from_secs(2));
    }

    // 2. node-2 stopped (power loss), Cluster.
    if want("stop") {
        let t0 = Instant::now();
        assert!(lab.run("node", &["stop", "node-2"]).0);
        let detect = until(Duration::from_secs(30), || !in_rotation(&lab, "192.168.56.12"));
        // Until the stopped node's pod is no ready endpoint, node-1's proxy still sends it
        // half of what reaches it (Cluster policy).
        let gone = until(Duration::from_secs(60), || lab.ready_endpoints("web").len() == 1);
        let _ = until(Duration::from_secs(30), || !node_ready(&lab, "node-2"));
        std::thread::sleep(Duration::from_secs(2));
        let (failed, sent, _) = count(&log, t0, Instant::now());
        if let Some(g) = gone {
            BENCH.record(
                "node stop node-2 (Cluster): its pod's endpoint not ready",
                (g.as_secs_f64() * 100.0).round() / 100.0,
                "s",
                "",
            );
        }
        BENCH.record("node stop node-2 (Cluster): requests failed of those sent", failed as f64, "requests", "");
        println!(
            "node stop: endpoint not ready after {}, {failed}/{sent} requests failed",
            gone.map(|g| format!("{:.2} s", g.as_secs_f64())).unwrap_or("—".into())
        );
        let t1 = Instant::now();
        assert!(lab.run("node", &["start", "node-2"]).0);
        let heal = until(Duration::from_secs(60), || {
            in_rotation(&lab, "192.168.56.12") && node_ready(&lab, "node-2") && lab.ready_endpoints("web").len() == 2
        });
        let (failed, sent, last) = count(&log, t0, t1);
        print(&Figures { fault: "node stop node-2 (Cluster)", detect, route_around: last, failed, sent, heal });
        std::thread::sleep(Duration::from_secs(2));
    }

    // 3. node-2 partitioned from the API.
    if want("partition") {
        let t0 = Instant::now();
        assert!(lab.run("fault", &["blackhole", "node-2", "192.168.56.10/32"]).0);
        let detect = until(Duration::from_secs(40), || !node_ready(&lab, "node-2"));
        let _ = until(Duration::from_secs(20), || lab.ready_endpoints("web").len() == 1);
        std::thread::sleep(Duration::from_secs(1));
        let t1 = Instant::now();
        assert!(lab.run("fault", &["clear", "node-2"]).0);
        let heal =
            until(Duration::from_secs(30), || node_ready(&lab, "node-2") && lab.ready_endpoints("web").len() == 2);
        let (failed, sent, last) = count(&log, t0, t1);
        print(&Figures { fault: "node-2 partitioned from the API", detect, route_around: last, failed, sent, heal });
        std::thread::sleep(Duration::from_secs(2));
    }

    // 4. node-1's service proxy rules flushed.
    if want("flush") {
        let t0 = Instant::now();
        let (ok, out) = lab.run("fault", &["flush-rules", "node-1"]);
        assert!(ok, "{out}");
        let repaired = Instant::now().duration_since(t0);
        std::thread::sleep(Duration::from_secs(1));
        let (failed, sent, last) = count(&log, t0, Instant::now());
        print(&Figures {
            fault: "flush-rules node-1",
            detect: Some(repaired),
            route_around: last,
            failed,
            sent,
            heal: Some(repaired),
        });
    }

    // 5. node-2's pod killed (restartPolicy Always).
    if want("kill") {
        let old_restarts =
            lab.kubectl(&["get", "pod", "web-2", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"]);
        let t0 = Instant::now();
        assert!(lab.run("fault", &["kill", "pod", "default/web-2"]).0);
        let detect = until(Duration::from_secs(20), || lab.ready_endpoints("web").len() == 1);
        let heal = until(Duration::from_secs(60), || {
            lab.kubectl(&["get", "pod", "web-2", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"])
                != old_restarts
                && lab.ready_endpoints("web").len() == 2
        });
        let (failed, sent, last) = count(&log, t0, Instant::now());
        print(&Figures { fault: "kill pod default/web-2 (restarted)", detect, route_around: last, failed, sent, heal });
    }

    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
}
