//! The Services every layout test renders: every feature the proxy has, one Service each.

#![allow(dead_code)]

use kube_proxy::iptables::{RenderConfig, ServiceState};
use kube_proxy::model::{Endpoint, ServicePort};

pub fn ep(ip: &str, port: u16, node: &str, ready: bool) -> Endpoint {
    Endpoint { ip: ip.parse().unwrap(), port, node: Some(node.into()), ready, serving: true, terminating: !ready }
}

/// Every feature the iptables mode has, one Service each.
pub fn services() -> Vec<ServiceState> {
    let sp = |name: &str, port_name: &str, proto: &str, port: u16, cip: &str| ServicePort {
        cluster_ip: Some(cip.parse().unwrap()),
        ..ServicePort::new("default", name, port_name, proto, port)
    };
    let mut lb = sp("lb", "http", "tcp", 80, "10.96.0.20");
    lb.node_port = Some(30080);
    lb.load_balancer_ips = vec!["198.51.100.7".parse().unwrap()];
    lb.external_ips = vec!["169.10.10.1".parse().unwrap()];
    lb.source_ranges = vec!["203.0.113.0/24".parse().unwrap(), "192.168.56.0/24".parse().unwrap()];
    let mut local = sp("local", "", "tcp", 80, "10.96.0.21");
    local.node_port = Some(30081);
    local.load_balancer_ips = vec!["198.51.100.8".parse().unwrap()];
    local.external_policy_local = true;
    local.health_check_node_port = Some(32000);
    let mut sticky = sp("sticky", "http", "tcp", 80, "10.96.0.22");
    sticky.affinity_seconds = Some(600);
    let mut internal = sp("internal", "dns", "udp", 53, "10.96.0.23");
    internal.internal_policy_local = true;
    vec![
        ServiceState {
            port: lb,
            endpoints: vec![ep("10.244.1.5", 8080, "node-1", true), ep("10.244.2.5", 8080, "node-2", true)],
        },
        ServiceState { port: local, endpoints: vec![ep("10.244.2.6", 8080, "node-2", true)] },
        ServiceState {
            port: sticky,
            endpoints: vec![ep("10.244.1.7", 8080, "node-1", true), ep("10.244.2.7", 8080, "node-2", true)],
        },
        ServiceState { port: internal, endpoints: vec![ep("10.244.2.8", 53, "node-2", true)] },
        ServiceState { port: sp("empty", "", "tcp", 80, "10.96.0.24"), endpoints: vec![] },
        ServiceState {
            port: sp("draining", "", "sctp", 9000, "10.96.0.25"),
            endpoints: vec![ep("10.244.1.9", 9000, "node-1", false)],
        },
        // Plain ones: the shared maps carry them in the shared-maps layout.
        ServiceState {
            port: ServicePort { node_port: Some(30082), ..sp("plain", "http", "tcp", 80, "10.96.0.26") },
            endpoints: vec![
                ep("10.244.1.10", 8080, "node-1", true),
                ep("10.244.2.10", 8080, "node-2", true),
                ep("10.244.3.10", 8080, "node-3", true),
            ],
        },
        ServiceState {
            port: sp("plain-dns", "dns", "udp", 53, "10.96.0.27"),
            endpoints: vec![ep("10.244.1.11", 53, "node-1", true)],
        },
    ]
}

pub fn cfg() -> RenderConfig {
    RenderConfig::new("node-1", "192.168.56.11".parse().unwrap())
}

/// The same Services for the IPv6 proxier: every address mapped to its IPv6 counterpart of the
/// lab's plan (10.96.0.X → fd00:10:96::X, 10.244.N.M → fd00:10:244:N::M, 198.51.100.X →
/// 2001:db8:100::X, …).
pub fn services_v6() -> Vec<ServiceState> {
    let ip = |a: std::net::IpAddr| -> std::net::IpAddr { v6(&a.to_string()).parse().unwrap() };
    let net = |n: ipnet::IpNet| -> ipnet::IpNet {
        match n.to_string().as_str() {
            "203.0.113.0/24" => "2001:db8:113::/64".parse().unwrap(),
            "192.168.56.0/24" => "fd00:56::/64".parse().unwrap(),
            other => panic!("no IPv6 counterpart for {other}"),
        }
    };
    services()
        .into_iter()
        .map(|mut s| {
            let p = &mut s.port;
            p.cluster_ip = p.cluster_ip.map(ip);
            p.load_balancer_ips = p.load_balancer_ips.iter().copied().map(ip).collect();
            p.external_ips = p.external_ips.iter().copied().map(ip).collect();
            p.source_ranges = p.source_ranges.iter().copied().map(net).collect();
            for e in &mut s.endpoints {
                e.ip = ip(e.ip);
            }
            s
        })
        .collect()
}

/// An IPv4 address of the fixtures as its IPv6 counterpart.
pub fn v6(a: &str) -> String {
    let o: Vec<&str> = a.split('.').collect();
    match o.as_slice() {
        ["10", "96", "0", x] => format!("fd00:10:96::{x}"),
        ["10", "244", n, m] => format!("fd00:10:244:{n}::{m}"),
        ["198", "51", "100", x] => format!("2001:db8:100::{x}"),
        ["169", "10", "10", x] => format!("2001:db8:169::{x}"),
        ["192", "168", "56", x] => format!("fd00:56::{x}"),
        _ => panic!("no IPv6 counterpart for {a}"),
    }
}

pub fn cfg_v6() -> RenderConfig {
    RenderConfig {
        cluster_cidr: Some("fd00:10:244::/56".parse().unwrap()),
        ..RenderConfig::new("node-1", "fd00:56::11".parse().unwrap())
    }
}
