//! Images benchmark (root; prints figures, asserts nothing about speed):
//!
//! 1. Pod create → Ready for a cached image: p50/p99 over 50 pods of the (offline) nginx image,
//!    one after the other on a 1-node lab, against 50 pods of the built-in `podpath/echo` (the
//!    process pods that came before images) in the same run.
//! 2. First pull of the nginx image from a registry on loopback into an empty store (download,
//!    digest checks, unpacking) against `skopeo copy` of the same image into an OCI layout
//!    (download only): median of 11 each, and their ratio.
//! 3. The whole lab's memory (PSS of every process) with 3 nodes and 30 nginx pods.
//!
//! Run: `cargo build --release --workspace --bins && sudo cargo bench -p podpath-e2e --bench images`
//! Arguments: `-- ready|pull|memory` to run only some parts. With
//! `PODPATH_FIGURES=book/perf/figures.tsv` the figures are appended to the book's data.

use std::time::{Duration, Instant};

use podpath_e2e::Lab;
use testkit::registry::{busybox, nginx, Registry};

#[path = "support/mod.rs"]
mod support;
use support::{api, descendants, kib, wait_ready};

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p podpath-e2e --bench images");

fn registry() -> Registry {
    let reg = Registry::start(None);
    reg.push("library/busybox:latest", &busybox(), None);
    reg.push("library/nginx:latest", &nginx(), None);
    reg
}

fn lab(reg: &Registry, nodes: usize) -> Lab {
    let mirror = format!("--registry-mirror=docker.io=http://{}", reg.addr);
    Lab::up("bimg", &["--nodes", &nodes.to_string(), &mirror]).expect("podpath up")
}

fn pod(name: &str, image: &str, port: u16) -> String {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": image, "imagePullPolicy": "IfNotPresent",
                                 "ports": [{"containerPort": port}]}]}
    })
    .to_string()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Create → Ready of `n` pods of `image`, one at a time; sorted milliseconds.
fn create_to_ready(lab: &Lab, prefix: &str, image: &str, port: u16, n: usize) -> Vec<f64> {
    let a = api(lab);
    let mut ms = vec![];
    for i in 0..n {
        let name = format!("{prefix}-{i}");
        let t = Instant::now();
        let (code, body) = a.request("POST", "/api/v1/namespaces/default/pods", &pod(&name, image, port)).unwrap();
        assert_eq!(code, 201, "{body}");
        loop {
            let (_, body) = a.request("GET", &format!("/api/v1/namespaces/default/pods/{name}"), "").unwrap();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let ready = v["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            if ready {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "{name} not Ready: {body}");
            std::thread::sleep(Duration::from_millis(5));
        }
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    ms
}

fn bench_ready() {
    let reg = registry();
    let lab = lab(&reg, 1);
    let (ok, out) = lab.run("image", &["pull", "nginx"]);
    assert!(ok, "{out}");
    let echo = create_to_ready(&lab, "echo", "podpath/echo", 8080, 50);
    let nginx = create_to_ready(&lab, "nginx", "nginx", 80, 50);
    for (what, ms) in [("podpath/echo (a process pod)", &echo), ("nginx, cached (a container of an image)", &nginx)] {
        println!(
            "pod create → Ready, {what}, 50 pods one at a time, 1 node: p50 {:.0} ms, p99 {:.0} ms",
            percentile(ms, 0.5),
            percentile(ms, 0.99)
        );
    }
    BENCH.record("pod create → Ready, cached nginx image, p50 of 50", percentile(&nginx, 0.5).round(), "ms", "");
    BENCH.record("pod create → Ready, cached nginx image, p99 of 50", percentile(&nginx, 0.99).round(), "ms", "≤ 300");
    BENCH.record(
        "pod create → Ready, podpath/echo process pod, p99 of 50 (baseline)",
        percentile(&echo, 0.99).round(),
        "ms",
        "",
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn bench_pull() {
    let reg = registry();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut ours = vec![];
    let mut skopeo = vec![];
    let mut size = 0;
    for _ in 0..11 {
        let dir = tempfile::tempdir().unwrap();
        let mut r = image::Registries::default();
        r.plain_http.push(reg.addr.clone());
        let p = image::Puller::new(image::Store::open(dir.path().join("store")).unwrap(), r, image::Limits::default());
        // Earlier runs' files are written back first, not during the next measurement.
        nix::unistd::sync();
        let t = Instant::now();
        let pulled = rt.block_on(p.pull(&format!("{}/library/nginx:latest", reg.addr), &[])).unwrap();
        ours.push(t.elapsed().as_secs_f64());
        size = pulled.downloaded;
        nix::unistd::sync();
        let t = Instant::now();
        let out = std::process::Command::new("skopeo")
            .args(["copy", "--quiet", "--src-tls-verify=false"])
            .arg(format!("docker://{}/library/nginx:latest", reg.addr))
            .arg(format!("oci:{}:nginx", dir.path().join("oci").display()))
            .output()
            .expect("skopeo");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        skopeo.push(t.elapsed().as_secs_f64());
    }
    let (o, s) = (median(ours), median(skopeo));
    println!(
        "first pull of nginx ({:.1} MB compressed) from a registry on loopback: podpath {:.3} s (download + unpack), skopeo copy {:.3} s (download only), ratio {:.2}",
        size as f64 / 1e6,
        o,
        s,
        o / s
    );
    BENCH.record(
        "first pull of the nginx image vs skopeo copy (median of 11), ratio",
        (o / s * 100.0).round() / 100.0,
        "×",
        "≤ 1.2",
    );
}

/// Drops the page cache of the lab's programs: a just-linked binary sits in the page cache in
/// large folios that the kernel maps whole (its text counts in full in PSS), one read back
/// from disk only as far as it runs. Evicting first measures every run the same way, as after
/// a reboot; the bench says so.
fn evict_binaries() {
    let dir = podpath_e2e::bin("podpath").parent().expect("bin dir").to_path_buf();
    for name in
        ["apiserver-lite", "node-agent", "lb-sim", "podpath-workload", "podpath-images", "podpath-dns", "podpath"]
    {
        let Ok(f) = std::fs::File::open(dir.join(name)) else { continue };
        let _ = f.sync_data();
        let _ = nix::fcntl::posix_fadvise(&f, 0, 0, nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    }
}

fn bench_memory() {
    let reg = registry();
    evict_binaries();
    let lab = lab(&reg, 3);
    let a = api(&lab);
    for i in 0..30 {
        let (code, body) =
            a.request("POST", "/api/v1/namespaces/default/pods", &pod(&format!("web-{i}"), "nginx", 80)).unwrap();
        assert_eq!(code, 201, "{body}");
    }
    // The two cluster DNS pods count too: they are part of every lab.
    wait_ready(&a, 30, Duration::from_secs(120));
    std::thread::sleep(Duration::from_secs(3));
    let components = ["apiserver-lite", "images", "node-1", "node-2", "node-3", "lb-sim"];
    let roots: Vec<i32> = components.iter().map(|c| lab.pid(c)).collect();
    let all = descendants(&roots);
    let pss: u64 = all.iter().map(|p| kib(*p, "smaps_rollup", "Pss:")).sum();
    let comps: u64 = roots.iter().map(|p| kib(*p, "smaps_rollup", "Pss:")).sum();
    println!(
        "whole lab, 3 nodes + 30 nginx pods: PSS {:.1} MiB ({} processes; components alone {:.1} MiB; programs read from disk, not just linked)",
        pss as f64 / 1024.0,
        all.len(),
        comps as f64 / 1024.0
    );
    // Where it goes: PSS per kind of process (program, and the workload's subcommand).
    let mut by_kind = std::collections::BTreeMap::<String, (u64, usize)>::new();
    for p in &all {
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let args: Vec<String> = cmd.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        let prog = args.first().map(|a| a.rsplit('/').next().unwrap_or(a).to_string()).unwrap_or_default();
        let kind = match prog.as_str() {
            "podpath-workload" => format!("{prog} {}", args.get(1).map(String::as_str).unwrap_or("")),
            _ => prog,
        };
        let e = by_kind.entry(kind).or_default();
        e.0 += kib(*p, "smaps_rollup", "Pss:");
        e.1 += 1;
    }
    for (kind, (k, n)) in &by_kind {
        println!("  {:<32} {:>3} processes {:>8.1} MiB", kind, n, *k as f64 / 1024.0);
    }
    BENCH.record(
        "whole lab, 3 nodes + 30 nginx pods: PSS sum, programs read from disk",
        (pss as f64 / 1024.0 * 10.0).round() / 10.0,
        "MiB",
        "≤ 150",
    );
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let want = |part: &str| args.is_empty() || args.iter().any(|a| a == part);
    // The pull first: a lab's teardown leaves the kernel freeing its namespaces for a while
    // after (network namespace cleanup runs on a workqueue), which would slow a timing.
    if want("pull") {
        bench_pull();
    }
    if want("ready") {
        bench_ready();
    }
    if want("memory") {
        bench_memory();
    }
}
