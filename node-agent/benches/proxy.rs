//! Service proxy benchmark (prints figures): rendering the whole ruleset for 1,000 Services with
//! 10 endpoints each, a partial render after one Service changed, and — as root, in a namespace
//! of its own — applying both with `iptables-restore --noflush`.
//!
//! Run: `sudo cargo bench -p node-agent --bench proxy`

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use node_agent::proxy::iptables::{render, render_partial, service_key, RenderConfig, ServiceState};
use node_agent::proxy::model::{Endpoint, ServicePort};

fn services(n: usize, eps: usize) -> Vec<ServiceState> {
    (0..n)
        .map(|i| ServiceState {
            port: ServicePort {
                cluster_ip: Some(format!("10.96.{}.{}", i / 250, i % 250 + 1).parse().unwrap()),
                node_port: Some(30000 + i as u16),
                ..ServicePort::new("bench", &format!("svc-{i}"), "http", "tcp", 80)
            },
            endpoints: (0..eps)
                .map(|j| Endpoint {
                    ip: format!("10.244.{}.{}", j + 1, i % 250 + 2).parse().unwrap(),
                    port: 8080,
                    node: Some(format!("node-{}", j % 3 + 1)),
                    ready: true,
                    serving: true,
                    terminating: false,
                })
                .collect(),
        })
        .collect()
}

fn restore(ns: &str, text: &str) -> f64 {
    let t = Instant::now();
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "iptables-restore", "--noflush"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("iptables-restore");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "iptables-restore failed");
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let cfg = RenderConfig {
        node_name: "node-1".into(),
        node_ips: vec!["192.168.56.11".parse().unwrap()],
        cluster_cidr: Some("10.244.0.0/16".parse().unwrap()),
        masquerade_external: true,
        random_fully: true,
    };
    let mut state = services(1000, 10);
    let t = Instant::now();
    let full = render(&cfg, &state, &BTreeSet::new());
    let full_ms = t.elapsed().as_secs_f64() * 1e3;
    state[500].endpoints.pop();
    let changed: BTreeSet<String> = [service_key(&state[500].port)].into();
    let t = Instant::now();
    let part = render_partial(&cfg, &state, &full.nat_chains, &changed);
    let part_ms = t.elapsed().as_secs_f64() * 1e3;
    println!("1,000 Services × 10 endpoints:");
    println!("  full render: {full_ms:.1} ms, {} lines, {} KiB", full.text.lines().count(), full.text.len() / 1024);
    println!("  partial render (1 Service changed): {part_ms:.1} ms, {} lines", part.text.lines().count());
    if !testkit::netns::root_or_explain() {
        return;
    }
    let ns = testkit::netns::Netns::new("ppb");
    let full_apply = restore(&ns.name, &full.text);
    let part_apply = restore(&ns.name, &part.text);
    let again = restore(&ns.name, &render(&cfg, &state, &part.nat_chains).text);
    println!(
        "  iptables-restore --noflush: full {full_apply:.0} ms, partial {part_apply:.0} ms, full again {again:.0} ms"
    );
}
