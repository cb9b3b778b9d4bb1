//! apiserver-lite benchmark (`cargo bench -p apiserver-lite`). Runs the real binary on
//! loopback with a fresh data directory and prints:
//! 1. Service creates/s through REST acknowledged after the store's flush and fdatasync, 64 clients;
//! 2. RSS of the server holding 10,000 Services (and after listing them all);
//! 3. latency from a write to its event reaching each of 10 concurrent watchers (p50/p99/max);
//! 4. the floor under (1): the disk alone, `fdatasync` after an append of one group commit's
//!    size, in a directory on the same file system, before the server starts.
//!
//! Targets from the issue: ≥ 1,000 creates/s, p99 ≤ 10 ms, RSS ≤ 100 MiB.
//! Set `BENCH_SERVICES` / `BENCH_WATCH_WRITES` for a shorter run. With
//! `PODPATH_FIGURES=book/perf/figures.tsv` its figures are appended to the book's performance
//! data (`testkit::figures`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use podpath_client::http;
use tokio::sync::Mutex;

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p apiserver-lite");

fn server_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("bench path");
    let dir = exe.parent().and_then(|p| p.parent()).expect("target dir");
    let bin = dir.join("apiserver-lite");
    assert!(bin.exists(), "{} is missing: cargo bench builds it", bin.display());
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Server {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let child = spawn_on(&dir.path().join("data"), addr);
    wait_ready(addr);
    Server { child, addr, _dir: dir }
}

fn spawn_on(data_dir: &std::path::Path, addr: SocketAddr) -> std::process::Child {
    Command::new(server_binary())
        .arg("--data-dir")
        .arg(data_dir)
        // Plain HTTP, explicitly: this measures the server, not TLS.
        .args(["--listen", &addr.to_string(), "--grpc-listen", "off", "--log", "info", "--insecure-http"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn wait_ready(addr: SocketAddr) {
    for _ in 0..2400 {
        if std::net::TcpStream::connect(addr).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// A kept-alive connection sending JSON requests.
struct Conn(http::Conn);

impl Conn {
    async fn open(addr: SocketAddr) -> Conn {
        Conn(http::Conn::connect(addr).await.unwrap())
    }

    async fn request(&mut self, method: &str, path: &str, body: &str) -> (u16, Vec<u8>) {
        self.request_ct(method, path, body, "application/json").await
    }

    async fn request_ct(&mut self, method: &str, path: &str, body: &str, ct: &str) -> (u16, Vec<u8>) {
        let headers = [("Content-Type", ct), ("Accept", "application/json")];
        let r = self.0.send(&http::Request { method, path, headers: &headers, body: body.as_bytes() }).await.unwrap();
        (r.status, r.body.to_vec())
    }
}

fn service(name: &str) -> String {
    format!(
        r#"{{"metadata":{{"name":"{name}"}},"spec":{{"selector":{{"app":"{name}"}},"ports":[{{"name":"http","port":80,"targetPort":8080}}]}}}}"#
    )
}

const SVCS: &str = "/api/v1/namespaces/default/services";

/// Creates `total` Services from `clients` connections: the wall time and each create's time
/// to its 201 (ms).
async fn create_many(addr: SocketAddr, total: usize, clients: usize) -> (Duration, Vec<f64>) {
    let next = Arc::new(Mutex::new(0usize));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await;
            let mut acks = Vec::new();
            loop {
                let i = {
                    let mut n = next.lock().await;
                    if *n >= total {
                        return acks;
                    }
                    *n += 1;
                    *n - 1
                };
                let t0 = Instant::now();
                let (code, body) = c.request("POST", SVCS, &service(&format!("svc-{i}"))).await;
                assert_eq!(code, 201, "create {i} after {:?}: {}", t0.elapsed(), String::from_utf8_lossy(&body));
                acks.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
        }));
    }
    let mut acks = Vec::with_capacity(total);
    for t in tasks {
        acks.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed();
    acks.sort_by(|a, b| a.total_cmp(b));
    (elapsed, acks)
}

/// Opens a watch and records when each ADDED Service name arrives.
async fn watcher(addr: SocketAddr, rv: String, expect: usize) -> Vec<(String, Instant)> {
    let mut conn = http::Conn::connect(addr).await.unwrap();
    let path = format!("{SVCS}?watch=true&resourceVersion={rv}");
    let headers = [("Accept", "application/json")];
    let mut body =
        conn.stream(&http::Request { headers: &headers, ..http::Request::get(&path) }).await.unwrap().into_body();
    let mut seen = Vec::new();
    let mut pending = Vec::new();
    while seen.len() < expect {
        let Some(frame) = body.frame().await else { break };
        let Ok(data) = frame.unwrap().into_data() else { continue };
        let now = Instant::now();
        pending.extend_from_slice(&data);
        while let Some(i) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
            if v["type"] == "ADDED" {
                seen.push((v["object"]["metadata"]["name"].as_str().unwrap_or("").to_string(), now));
            }
        }
    }
    seen
}

/// The disk alone: `rounds` appends of `bytes` to a fresh file, each followed by `fdatasync`,
/// as the store's flusher does once per group commit; each `fdatasync`'s time (ms), sorted.
/// A create's 201 waits for at least one of them, and for the one under way when it came.
fn fdatasync_alone(bytes: usize, rounds: usize) -> Vec<f64> {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let mut f = std::fs::File::create(dir.path().join("log")).unwrap();
    let block = vec![0x5au8; bytes];
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            f.write_all(&block).unwrap();
            let t = Instant::now();
            f.sync_data().unwrap();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(|a, b| a.total_cmp(b));
    times
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

#[tokio::main]
async fn main() {
    let total: usize = std::env::var("BENCH_SERVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let writes: usize = std::env::var("BENCH_WATCH_WRITES").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    // First, on a quiet machine: what the disk alone takes per flush, for a small and a large
    // group commit's worth of log.
    for bytes in [4 << 10, 64 << 10] {
        let t = fdatasync_alone(bytes, 500);
        println!(
            "the disk alone: fdatasync after a {} KiB append, 500 times: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            bytes >> 10,
            percentile(&t, 0.5),
            percentile(&t, 0.99),
            t[t.len() - 1]
        );
        if bytes == 64 << 10 {
            BENCH.record(
                "the disk alone: fdatasync after a 64 KiB append, p99",
                (percentile(&t, 0.99) * 100.0).round() / 100.0,
                "ms",
                "",
            );
        }
    }
    let server = start_server();
    let addr = server.addr;
    let pid = server.child.id();
    println!("apiserver-lite benchmark: {total} Services, 10 watchers x {writes} writes, {} cores", num_cpus());
    println!("RSS at start: {:.1} MiB", rss_mib(pid));

    let (elapsed, acks) = create_many(addr, total, 64).await;
    println!(
        "creates: {total} Services in {:.2}s = {:.0} creates/s (64 clients, each acknowledged after flush + fdatasync); \
         each create's 201 in p50 {:.2} ms, p99 {:.2} ms",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        percentile(&acks, 0.5),
        percentile(&acks, 0.99)
    );
    BENCH.record(
        "REST creates, 64 clients: p99 of each create's 201",
        (percentile(&acks, 0.99) * 100.0).round() / 100.0,
        "ms",
        "≤ 20",
    );
    BENCH.record(
        &format!(
            "REST creates/s, each fdatasynced (64 clients, {} Services)",
            testkit::figures::thousands(total as u64)
        ),
        (total as f64 / elapsed.as_secs_f64()).round(),
        "creates/s",
        "≥ 5000",
    );
    println!("RSS right after the creates ({} Services stored): {:.1} MiB", total + 1, rss_mib(pid));
    // Steady state: the endpoints controller has written Endpoints (and slices) for every one.
    let mut c = Conn::open(addr).await;
    let t = Instant::now();
    loop {
        let (_, body) = c.request("GET", "/api/v1/namespaces/default/endpoints", "").await;
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        if v["items"].as_array().map_or(0, |a| a.len()) > total {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(300), "the endpoints controller did not catch up");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "endpoints controller caught up {:.1}s after the last create (Endpoints + EndpointSlice per Service)",
        t.elapsed().as_secs_f64()
    );
    println!(
        "RSS with {} Services, {} Endpoints and {} EndpointSlices: {:.1} MiB",
        total + 1,
        total + 1,
        total + 1,
        rss_mib(pid)
    );
    // Idle: what the server holds, once transient allocations are given back.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let idle = rss_mib(pid);
    println!("RSS idle with them (7 s later): {idle:.1} MiB");
    BENCH.record(
        &format!(
            "server RSS idle with {} Services, their Endpoints and EndpointSlices",
            testkit::figures::thousands(total as u64)
        ),
        idle,
        "MiB",
        "",
    );
    let t = Instant::now();
    let (code, body) = c.request("GET", SVCS, "").await;
    assert_eq!(code, 200);
    println!(
        "list of all Services: {:.1} MiB JSON in {} ms; RSS after: {:.1} MiB",
        body.len() as f64 / 1048576.0,
        t.elapsed().as_millis(),
        rss_mib(pid)
    );
    // What every `kubectl get` asks: the first page of 500 (the list is taken from a consistent
    // snapshot and sorted before it is cut).
    let t = Instant::now();
    let (code, page) = c.request("GET", &format!("{SVCS}?limit=500"), "").await;
    assert_eq!(code, 200);
    let paged = t.elapsed().as_secs_f64() * 1000.0;
    println!(
        "first page of 500 Services (kubectl get's limit): {:.1} KiB in {paged:.1} ms",
        page.len() as f64 / 1024.0
    );
    BENCH.record(
        &format!("first page of 500 of {} Services (kubectl get's list)", testkit::figures::thousands(total as u64)),
        (paged * 10.0).round() / 10.0,
        "ms",
        "",
    );
    let rv = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();

    let watchers: Vec<_> = (0..10).map(|_| tokio::spawn(watcher(addr, rv.clone(), writes))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut sent = std::collections::HashMap::new();
    let mut acks = Vec::new();
    for i in 0..writes {
        let name = format!("w-{i}");
        let t0 = Instant::now();
        sent.insert(name.clone(), t0);
        let (code, _) = c.request("POST", SVCS, &service(&name)).await;
        assert_eq!(code, 201);
        acks.push(t0.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    acks.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "create acknowledged (fdatasynced) in: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&acks, 0.5),
        percentile(&acks, 0.99)
    );
    BENCH.record("create acknowledged, p99", percentile(&acks, 0.99), "ms", "≤ 20");
    let mut lat = Vec::new();
    for w in watchers {
        for (name, at) in tokio::time::timeout(Duration::from_secs(60), w).await.expect("watchers finish").unwrap() {
            if let Some(s) = sent.get(&name) {
                lat.push(at.duration_since(*s).as_secs_f64() * 1000.0);
            }
        }
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "write -> event at 10 watchers: {} samples, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (from sending the create)",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(f64::NAN)
    );
    BENCH.record("write → event at 10 watchers, p99", percentile(&lat, 0.99), "ms", "");
    println!("RSS at end: {:.1} MiB", rss_mib(pid));
    tokio::time::sleep(Duration::from_secs(7)).await;
    println!("RSS idle at end (7 s later): {:.1} MiB", rss_mib(pid));

    // The data directory beside the live data: after the creates, and after 600 updates of a
    // 500 KB ConfigMap (the pattern that once grew the directory without bound).
    let bytes = live_bytes(&mut c).await;
    let data_dir = server._dir.path().join("data");
    let mib = |b: u64| b as f64 / 1048576.0;
    let dir = dir_bytes(&data_dir);
    println!("data directory {:.1} MiB for {:.1} MiB of live objects (as JSON)", mib(dir), mib(bytes as u64));
    let big = "x".repeat(500 * 1024);
    let (code, _) = c
        .request(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            &format!("{{\"metadata\":{{\"name\":\"big\"}},\"data\":{{\"k\":\"{big}\"}}}}"),
        )
        .await;
    assert_eq!(code, 201);
    for i in 0..600 {
        let body = format!("{{\"data\":{{\"k\":\"{big}{i}\"}}}}");
        let (code, _) = c
            .request_ct("PATCH", "/api/v1/namespaces/default/configmaps/big", &body, "application/merge-patch+json")
            .await;
        assert_eq!(code, 200);
    }
    let bytes = live_bytes(&mut c).await;
    let dir = dir_bytes(&data_dir);
    println!(
        "after 600 updates of a 500 KB ConfigMap: data directory {:.1} MiB for {:.1} MiB of live objects",
        mib(dir),
        mib(bytes as u64)
    );
    // A restart: a database far larger than what it holds is compacted as it opens.
    let mut server = server;
    let _ = server.child.kill();
    let _ = server.child.wait();
    let restarted = Instant::now();
    server.child = spawn_on(&data_dir, server.addr);
    // Serving again: the ConfigMap answers (a bare connect may come before the store is open).
    loop {
        assert!(restarted.elapsed() < Duration::from_secs(300), "the server did not come back");
        if let Ok(mut conn) = http::Conn::connect(server.addr).await {
            let headers = [("Accept", "application/json")];
            let req = http::Request {
                method: "GET",
                path: "/api/v1/namespaces/default/configmaps/big",
                headers: &headers,
                body: b"",
            };
            if conn.send(&req).await.is_ok_and(|r| r.status == 200) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reopened = dir_bytes(&data_dir);
    println!(
        "after a restart ({:.1} s to serve again): data directory {:.1} MiB",
        restarted.elapsed().as_secs_f64(),
        mib(reopened)
    );
    BENCH.record(
        &format!(
            "data directory after the same and a restart (compacted as it opens; live data {:.0} MiB)",
            mib(bytes as u64)
        ),
        (mib(reopened) * 10.0).round() / 10.0,
        "MiB",
        "",
    );
    BENCH.record(
        &format!(
            "data directory after {} Services and 600 updates of a 500 KB ConfigMap (live data {:.0} MiB)",
            testkit::figures::thousands(total as u64),
            mib(bytes as u64)
        ),
        (mib(dir) * 10.0).round() / 10.0,
        "MiB",
        "",
    );
}

/// The bytes of every object the bench made, as the server lists them in JSON.
async fn live_bytes(c: &mut Conn) -> usize {
    let mut bytes = 0;
    for path in
        [SVCS, "/api/v1/namespaces/default/endpoints", "/apis/discovery.k8s.io/v1/endpointslices", "/api/v1/configmaps"]
    {
        bytes += c.request("GET", path, "").await.1.len();
    }
    bytes
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}
