//! An acknowledged write is on disk, checked with the kernel rather than by reading our code:
//! apiserver-lite runs under strace, and between reading a create and answering it the server
//! must `fdatasync` (or `fsync`) its database's log file.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podpath_client::http;
use podpath_e2e::{bin, free_port, http_get};

#[test]
fn a_create_is_fdatasynced_before_it_is_acknowledged() {
    assert!(
        Command::new("strace").arg("-V").stdout(Stdio::null()).status().is_ok_and(|s| s.success()),
        "strace is required (apt-get install strace; .ci/run installs it)"
    );
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("strace.txt");
    let rest: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    // -f: every thread (the flusher is one); -s: enough of each buffer to see the request line.
    let mut child = Command::new("strace")
        .args(["-f", "-s", "48", "-e", "trace=openat,read,recvfrom,write,writev,sendto,fsync,fdatasync", "-o"])
        .arg(&trace)
        .arg(bin("apiserver-lite"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        // Plain HTTP, explicitly: the test reads the request and the answer in the syscalls.
        .args(["--listen", &rest.to_string(), "--grpc-listen", "off", "--insecure-http"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("strace runs");
    let guard = Guard { strace: &mut child, trace: trace.clone() };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(rest, "/readyz"), Ok((200, _))) {
        assert!(Instant::now() < deadline, "apiserver-lite under strace never became ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    let body = br#"{"metadata":{"name":"durable"},"data":{"a":"1"}}"#;
    let headers = [("Content-Type", "application/json")];
    let req = http::Request { method: "POST", path: "/api/v1/namespaces/default/configmaps", headers: &headers, body };
    let r = http::blocking(rest, &req, Duration::from_secs(10)).unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    drop(guard);

    let text = std::fs::read_to_string(&trace).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The descriptors of sled's log file (`…/data/db/db`), whoever opened them.
    let log_fds: Vec<String> = lines
        .iter()
        .filter(|l| l.contains("openat(") && l.contains("/data/db/db\""))
        .filter_map(|l| l.rsplit("= ").next())
        .filter(|fd| fd.chars().all(|c| c.is_ascii_digit()))
        .map(str::to_string)
        .collect();
    assert!(!log_fds.is_empty(), "no open of the database's log file in the trace");
    // The request arrives in pieces (hyper reads its first bytes apart): its first line.
    let request = lines.iter().position(|l| l.contains("\"POST /api/v1/")).expect("the request");
    let answer = lines.iter().position(|l| l.contains("HTTP/1.1 201")).expect("the answer");
    assert!(request < answer);
    let synced = lines[request..answer].iter().any(|l| {
        ["fdatasync(", "fsync("].iter().any(|call| {
            l.split_once(call).is_some_and(|(_, rest)| {
                let fd: String = rest.chars().take_while(char::is_ascii_digit).collect();
                log_fds.contains(&fd) && !rest.contains("= -1")
            })
        })
    });
    assert!(
        synced,
        "no fdatasync/fsync of the log file between the request and its 201:\n{}",
        lines[request..=answer].join("\n")
    );
}

/// Stops the traced server when the test ends, however it ends: the server by its PID (the first
/// in strace's output; strace 6.1 lets a tracee run on when strace itself is killed), then strace,
/// which exits with it.
struct Guard<'a> {
    strace: &'a mut std::process::Child,
    trace: std::path::PathBuf,
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let first = std::fs::read_to_string(&self.trace).unwrap_or_default();
        let pid = first.split_whitespace().next().and_then(|p| p.parse::<i32>().ok());
        if let Some(pid) = pid {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.strace.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.strace.kill();
        let _ = self.strace.wait();
    }
}

/// `kill -9` in the middle of concurrent writes, three times: after each restart every create
/// the server acknowledged is there with the ClusterIP and NodePort it was answered with, and no
/// two Services share a ClusterIP or a NodePort.
#[test]
fn acknowledged_writes_and_unique_allocations_survive_kill_9_under_concurrent_writers() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    const WRITERS: usize = 16;
    let mut srv = podpath_e2e::ApiServer::start(&[]).unwrap();
    // name → (clusterIP, nodePort) as acknowledged
    let acked: Mutex<BTreeMap<String, (String, i64)>> = Mutex::new(BTreeMap::new());
    let mut attempted = 0usize;
    for round in 0..3 {
        let stop = AtomicBool::new(false);
        let (rest, tls) = (srv.rest, srv.tls());
        let auth = format!("Bearer {}", srv.token.clone().unwrap_or_default());
        let tried = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for w in 0..WRITERS {
                let (stop, acked, tried, tls, auth) = (&stop, &acked, &tried, &tls, &auth);
                s.spawn(move || {
                    let mut i = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let name = format!("r{round}-w{w}-{i}");
                        i += 1;
                        tried.fetch_add(1, Ordering::Relaxed);
                        let body = format!(
                            r#"{{"metadata":{{"name":"{name}"}},"spec":{{"type":"NodePort","ports":[{{"port":80}}]}}}}"#
                        );
                        let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
                        let req = http::Request {
                            method: "POST",
                            path: "/api/v1/namespaces/default/services",
                            headers: &headers,
                            body: body.as_bytes(),
                        };
                        match http::blocking_via(rest, tls.as_ref(), &req, Duration::from_secs(5)) {
                            Ok(r) if r.status == 201 => {
                                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                                let ip = v["spec"]["clusterIP"].as_str().unwrap().to_string();
                                let port = v["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
                                acked.lock().unwrap().insert(name, (ip, port));
                            }
                            // The server died under us: this write was never acknowledged.
                            _ => std::thread::sleep(Duration::from_millis(20)),
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(700));
            srv.kill9_and_restart().unwrap();
            stop.store(true, Ordering::Relaxed);
        });
        attempted += tried.load(Ordering::Relaxed);
        let (code, body) = srv.http_get("/api/v1/namespaces/default/services").unwrap();
        assert_eq!(code, 200);
        let list: serde_json::Value = serde_json::from_str(&body).unwrap();
        let stored: BTreeMap<String, (String, i64)> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["metadata"]["name"] != "kubernetes")
            .map(|s| {
                let n = s["metadata"]["name"].as_str().unwrap().to_string();
                (
                    n,
                    (
                        s["spec"]["clusterIP"].as_str().unwrap().to_string(),
                        s["spec"]["ports"][0]["nodePort"].as_i64().unwrap(),
                    ),
                )
            })
            .collect();
        for (name, alloc) in acked.lock().unwrap().iter() {
            assert_eq!(stored.get(name), Some(alloc), "round {round}: acknowledged {name} lost or changed");
        }
        let ips: BTreeSet<&String> = stored.values().map(|(ip, _)| ip).collect();
        let ports: BTreeSet<i64> = stored.values().map(|(_, p)| *p).collect();
        assert_eq!((ips.len(), ports.len()), (stored.len(), stored.len()), "round {round}: an allocation is shared");
    }
    let acked = acked.lock().unwrap().len();
    assert!(acked > 3 * WRITERS, "too few writes acknowledged to mean anything: {acked}");
    println!("kill -9 under {WRITERS} writers, 3 rounds: {attempted} creates tried, {acked} acknowledged, all present");
}
