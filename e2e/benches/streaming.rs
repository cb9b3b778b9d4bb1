//! Streaming benchmark (root; prints figures, asserts nothing about speed), in a one-node lab
//! with the real kubectl:
//!
//! 1. `kubectl exec web -- true`, wall time per run (kubectl's own start-up included, as a user
//!    sees it), p50/p99 over `PODPATH_BENCH_EXECS` runs (default 40), over WebSockets (kubectl's
//!    default) and SPDY.
//! 2. Port-forward throughput: a pod (`--image=debian` running the node's /usr/bin/python3)
//!    sends 1 GiB over one TCP connection; read through `kubectl port-forward` (client → API
//!    server over TLS → node agent → the pod's loopback) against straight from the node's
//!    namespace to the pod IP, same pod, same run; the ratio, and the CPU-seconds per GiB of
//!    kubectl, the API server, the node agent and the whole machine (who burns the CPU).
//!
//! Run: `cargo build --release --workspace --bins && sudo cargo bench -p podpath-e2e --bench streaming`
//! With `PODPATH_FIGURES=book/perf/figures.tsv` its figures are appended to the book's
//! performance data (`testkit::figures`).

#[path = "support/mod.rs"]
mod support;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::cpu_seconds;

use podpath_e2e::{free_port, Lab};

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p podpath-e2e --bench streaming");

const BULK: u64 = 1 << 30;

/// A pod that sends as many zero bytes as a client asks for (the count as a decimal line).
const SENDER: &str = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9000))
s.listen(8)
buf = bytes(1 << 16)
while True:
    c, _ = s.accept()
    line = c.makefile().readline().strip()
    n = int(line) if line.isdigit() else 0  # probes connect and say nothing
    while n > 0:
        k = min(n, len(buf))
        c.sendall(buf[:k])
        n -= k
    c.close()
"#;

/// CPU time the whole machine has used so far (every core, user + system + interrupts), from
/// /proc/stat.
fn machine_cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let cpu = stat.lines().next().unwrap_or("");
    // cpu user nice system idle iowait irq softirq steal guest …: the first eight but idle and
    // iowait (guest time is already in user).
    let f: Vec<f64> = cpu.split_whitespace().skip(1).take(8).filter_map(|v| v.parse().ok()).collect();
    let busy: f64 = f.iter().enumerate().filter(|(i, _)| *i != 3 && *i != 4).map(|(_, v)| v).sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    busy / hz
}

/// Who burns the CPU while `f` moves `BULK` bytes: CPU-seconds per GiB of each named process
/// and of the whole machine.
fn cpu_per_gib<T>(pids: &[(&'static str, u32)], f: impl FnOnce() -> T) -> (T, Vec<(&'static str, f64)>, f64) {
    let gib = BULK as f64 / (1u64 << 30) as f64;
    let before: Vec<f64> = pids.iter().map(|(_, p)| cpu_seconds(*p)).collect();
    let machine = machine_cpu_seconds();
    let out = f();
    let machine = (machine_cpu_seconds() - machine) / gib;
    let each = pids.iter().zip(before).map(|((name, p), b)| (*name, (cpu_seconds(*p) - b) / gib)).collect();
    (out, each, machine)
}

fn breakdown(each: &[(&str, f64)], machine: f64) -> String {
    let named: f64 = each.iter().map(|(_, c)| c).sum();
    let parts: Vec<String> = each.iter().map(|(n, c)| format!("{n} {c:.2}")).collect();
    format!("{}, the rest (sender, reader, kernel) {:.2}; machine {machine:.2}", parts.join(", "), machine - named)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn pull(addr: &str) -> f64 {
    let t = Instant::now();
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(e) if t.elapsed() > Duration::from_secs(10) => panic!("connect to {addr}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let t = Instant::now();
    writeln!(s, "{BULK}").unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0u64;
    while got < BULK {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "the stream ended after {got} bytes");
        got += n as u64;
    }
    (got as f64 / (1 << 20) as f64) / t.elapsed().as_secs_f64()
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("the streaming bench runs as root (it creates a lab)");
        return;
    }
    let lab = Lab::up("strbench", &["--nodes", "1"]).expect("podpath up");
    lab.kubectl(&["run", "web", "--image=podpath/echo", "--port=8080"]);
    lab.kubectl(&[
        "run",
        "sender",
        "--image=debian",
        "--port=9000",
        "--command",
        "--",
        "/usr/bin/python3",
        "-c",
        SENDER,
    ]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "pod/sender", "--timeout=60s"]);

    let runs: usize = std::env::var("PODPATH_BENCH_EXECS").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    for (how, spdy) in [("WebSocket", false), ("SPDY", true)] {
        let mut ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            let mut c = Command::new("kubectl");
            c.arg("--kubeconfig").arg(&lab.kubeconfig).args(["exec", "web", "--", "true"]);
            if spdy {
                c.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");
            }
            let t = Instant::now();
            let o = c.output().expect("kubectl");
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        ms.sort_by(|a, b| a.total_cmp(b));
        BENCH.record(
            &format!("kubectl exec web -- true ({how}), p50 of {runs}"),
            (percentile(&ms, 0.5) * 10.0).round() / 10.0,
            "ms",
            "",
        );
        println!(
            "exec round trip ({how}, kubectl exec -- true, {runs} runs): p50 {:.1} ms, p99 {:.1} ms",
            percentile(&ms, 0.5),
            percentile(&ms, 0.99)
        );
    }

    let pod_ip = lab.kubectl(&["get", "pod", "sender", "-o", "jsonpath={.status.podIP}"]);
    let direct_addr = format!("{pod_ip}:9000");
    let relays = [("API server", lab.pid("apiserver-lite") as u32), ("node agent", lab.pid("node-1") as u32)];
    let (direct, _, direct_cpu) = cpu_per_gib(&[], || lab.in_netns("node-1", move || pull(&direct_addr)));
    println!("direct: {direct:.0} MiB/s; CPU-s per GiB: machine {direct_cpu:.2}");
    for (how, spdy) in [("WebSocket tunnel", false), ("SPDY", true)] {
        let port = free_port();
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&lab.kubeconfig)
            .args(["port-forward", "--address", "127.0.0.1", "pod/sender", &format!("{port}:9000")])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if spdy {
            c.env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");
        }
        let mut pf = c.spawn().expect("kubectl port-forward");
        let mut out = pf.stdout.take().unwrap();
        let mut first = [0u8; 64];
        let _ = out.read(&mut first);
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let t = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let pids = [("kubectl", pf.id()), relays[0], relays[1]];
        let (through, each, machine) = cpu_per_gib(&pids, || pull(&format!("127.0.0.1:{port}")));
        let _ = pf.kill();
        let _ = pf.wait();
        BENCH.record(
            &format!("port-forward throughput ({how}) ÷ direct"),
            (through / direct * 100.0).round() / 100.0,
            "ratio",
            "≥ 0.5",
        );
        println!(
            "port-forward throughput ({how}): {through:.0} MiB/s vs direct {direct:.0} MiB/s = {:.2} of direct; \
             CPU-s per GiB: {}",
            through / direct,
            breakdown(&each, machine)
        );
    }
}
