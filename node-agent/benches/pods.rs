//! Pod start-up benchmark (root; prints figures, asserts nothing about speed):
//!
//! 1. 100 podpath/echo pods created through the API on a 3-node cluster (the scheduler places
//!    them): time from the first create until every pod is Running and Ready, then until all
//!    are deleted and gone.
//! 2. One node with 30 pods, idle for 5 s: the agent's resident memory.
//!
//! Run: `cargo build --release -p podpath-cni && cargo bench -p node-agent --bench pods`
//! (the CNI plugins must sit next to the agent binary).
//! With `PODPATH_FIGURES=book/perf/figures.tsv` its figures are appended to the book's
//! performance data (`testkit::figures`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;

fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn all_ready(c: &Cluster, names: &[String]) -> bool {
    names.iter().all(|n| pod_ready(&c.pod(n)))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    // 1. 100 pods over 3 nodes.
    let c = Cluster::started(3, &["--log", "warn"]).await;
    let names: Vec<String> = (0..100).map(|i| format!("bench-{i}")).collect();
    let t0 = Instant::now();
    for n in &names {
        let mut p = echo_pod(n, "");
        p["spec"].as_object_mut().unwrap().remove("nodeName");
        c.create_pod(p).await;
    }
    let created = t0.elapsed();
    c.wait_for(120, "100 pods Ready", |c| all_ready(c, &names)).await;
    let ready = t0.elapsed();
    let mut per_node = [0usize; 3];
    for n in &names {
        let node = c.pod(n).unwrap()["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
        if let Some(i) = node.strip_prefix("node-").and_then(|i| i.parse::<usize>().ok()) {
            per_node[i - 1] += 1;
        }
    }
    let t1 = Instant::now();
    for n in &names {
        c.delete_pod(n).await;
    }
    c.wait_for(120, "100 pods gone", |c| names.iter().all(|n| c.pod(n).is_none())).await;
    let gone = t1.elapsed();
    println!("100 pods on 3 nodes (placed {per_node:?}):");
    println!("  created through the API in {:.0} ms", created.as_secs_f64() * 1e3);
    println!("  create → all Running and Ready: {:.0} ms (target ≤ 3000 ms)", ready.as_secs_f64() * 1e3);
    println!("  delete → all gone (SIGTERM, CNI DEL, final delete): {:.0} ms", gone.as_secs_f64() * 1e3);
    let bench = testkit::figures::Bench("cargo bench -p node-agent --bench pods");
    let record = |figure: &str, value: f64, unit: &str, target: &str| bench.record(figure, value, unit, target);
    record("100 pods on 3 nodes: create → all Running and Ready", (ready.as_secs_f64() * 1e3).round(), "ms", "≤ 3000");
    record("100 pods on 3 nodes: delete → all gone", (gone.as_secs_f64() * 1e3).round(), "ms", "");
    drop(c);

    // 2. Idle agent with 30 pods.
    let c = Cluster::started(1, &["--log", "warn"]).await;
    let names: Vec<String> = (0..30).map(|i| format!("idle-{i}")).collect();
    for n in &names {
        c.create_pod(echo_pod(n, "node-1")).await;
    }
    c.wait_for(60, "30 pods Ready", |c| all_ready(c, &names)).await;
    let pid = c.nodes[0].agent.as_ref().unwrap().pid();
    let before = rss_kib(pid);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = rss_kib(pid);
    println!(
        "idle agent with 30 pods: RSS {:.1} MiB (after start-up {:.1} MiB; target ≤ 15 MiB)",
        idle as f64 / 1024.0,
        before as f64 / 1024.0
    );
    record("idle agent with 30 pods: RSS", (idle as f64 / 1024.0 * 10.0).round() / 10.0, "MiB", "≤ 15");
    drop(c);
}
