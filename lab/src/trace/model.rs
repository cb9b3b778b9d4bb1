//! What a trace is made of (pure data): the Kubernetes objects behind the addresses it meets,
//! and the hops and steps it shows.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

/// The Kubernetes side: who owns the addresses the trace meets.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    /// Pod IP → (`ns/name`, node).
    pub pods: BTreeMap<IpAddr, (String, String)>,
    /// Node IP → node name.
    pub nodes: BTreeMap<IpAddr, String>,
    /// ClusterIP → Service `ns/name`.
    pub cluster_ips: BTreeMap<IpAddr, String>,
    /// `ns/name` → externalTrafficPolicy.
    pub traffic_policy: BTreeMap<String, String>,
    /// Per host: `iptables-save -t nat` (for rule positions and probabilities).
    pub nat_rules: BTreeMap<String, String>,
    /// Per host, nftables mode: `nft list table ip kube-proxy` (for the map elements a rule
    /// looked up).
    pub nft_tables: BTreeMap<String, String>,
    /// Per (leg, host): `ip route get` of the address the request left that host for.
    pub routes: BTreeMap<(usize, String), String>,
    /// lb-sim's view of the probe's destination: (mode, chosen or all nodes in rotation).
    pub lb: Option<(String, Vec<String>)>,
    /// The L7 load balancer's routing table for the probe's destination
    /// (`HOST PATH (TYPE) → SERVICE:PORT (nodePort N)`, and the default backend).
    pub lb_routes: Vec<String>,
    /// A Gateway's decision for the probe: the listener, the route's rule, the filters, the
    /// backend chosen by weight and the endpoint (lines, in that order).
    pub gateway_decision: Vec<String>,
}

/// One line of a hop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// `route`, `nat`, `filter`, `deliver`, `stop`, `lb`.
    pub kind: String,
    pub text: String,
    /// The rule as iptables-save prints it, when a rule decided this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The Kubernetes object (or field) behind the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
}

pub(crate) fn step(kind: &str, text: impl Into<String>) -> Step {
    Step { kind: kind.into(), text: text.into(), rule: None, object: None }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub host: String,
    pub steps: Vec<Step>,
}

/// How the probe ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub answered: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub millis: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    pub from: String,
    pub src: String,
    pub dst: String,
    pub hops: Vec<Hop>,
    /// The pod that got the request, and the client address it saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_saw: Option<String>,
    pub outcome: Outcome,
    /// Where and why the request failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// `host: orig ⇄ reply` for every host that translated the flow.
    pub conntrack: Vec<String>,
    /// The reply's first packet, host by host.
    pub reply_path: Vec<String>,
    /// For a request by name: the lookup that came first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lookup: Option<super::dns::Lookup>,
}

pub(crate) fn name_of(objects: &Objects, ip: IpAddr) -> Option<String> {
    if let Some((pod, _)) = objects.pods.get(&ip) {
        return Some(format!("pod {pod}"));
    }
    objects.nodes.get(&ip).cloned()
}

/// `10.244.1.0/24 via 192.168.56.11 dev eth0` out of `ip route get` output, with the node it
/// leads to.
pub(crate) fn route_text(objects: &Objects, raw: &str) -> String {
    let line = raw.lines().next().unwrap_or("").trim();
    let via = line.split(" via ").nth(1).and_then(|r| r.split(' ').next()).and_then(|v| v.parse::<IpAddr>().ok());
    let dev = line.split(" dev ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("?");
    let dst = line.split(' ').next().unwrap_or("?");
    match via {
        Some(v) => match name_of(objects, v) {
            Some(n) => format!("route {dst} via {v} ({n}) dev {dev}"),
            None => format!("route {dst} via {v} dev {dev}"),
        },
        None => format!("route {dst} dev {dev} (directly connected)"),
    }
}
