//! What the proxy needs to know of Services and EndpointSlices, extracted purely (the same
//! information kube-proxy's `ServicePort` and `Endpoint` carry).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;

/// kube-proxy's `ServicePortName`: one port of one Service, by the Service's namespace and
/// name and the port's name (empty for a Service's only, unnamed port). Prints as
/// `namespace/name[:port]`, the form rule comments and chain-name hashes use.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port: String,
}

impl ServicePortName {
    pub fn new(namespace: &str, name: &str, port: &str) -> ServicePortName {
        ServicePortName { namespace: namespace.into(), name: name.into(), port: port.into() }
    }
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

/// Identifies a service port across syncs (what a partial sync compares, what the userspace
/// proxy keys its sockets by): the port and its protocol.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    pub name: ServicePortName,
    pub protocol: String,
}

/// The Services a sync wrote, for its debug line (timing breakdowns read it): each name once,
/// the first eight, then `+N`.
pub fn names_summary(names: impl IntoIterator<Item = String>) -> String {
    let names: std::collections::BTreeSet<String> = names.into_iter().collect();
    let mut out: Vec<String> = names.iter().take(8).cloned().collect();
    if names.len() > 8 {
        out.push(format!("+{}", names.len() - 8));
    }
    out.join(",")
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.protocol)
    }
}

/// The IP family one proxier handles: kube-proxy runs one per family of a dual-stack node,
/// each reading only its family's addresses of every Service and EndpointSlice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Family {
    #[default]
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv6() {
            Family::V6
        } else {
            Family::V4
        }
    }
    pub fn of_net(net: &IpNet) -> Family {
        Family::of(&net.addr())
    }
    /// As the API spells it (`ipFamilies`, an EndpointSlice's `addressType`).
    pub fn api_name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
    pub fn nft(self) -> podpath_ruleset::nft::NftFamily {
        match self {
            Family::V4 => podpath_ruleset::nft::NftFamily::Ip,
            Family::V6 => podpath_ruleset::nft::NftFamily::Ip6,
        }
    }
}

/// One port of one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    pub id: ServicePortName,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: String,
    pub cluster_ip: Option<IpAddr>,
    pub port: u16,
    pub node_port: Option<u16>,
    pub external_ips: Vec<IpAddr>,
    pub load_balancer_ips: Vec<IpAddr>,
    pub source_ranges: Vec<IpNet>,
    pub external_policy_local: bool,
    pub internal_policy_local: bool,
    pub health_check_node_port: Option<u16>,
    /// `sessionAffinity: ClientIP` timeout in seconds.
    pub affinity_seconds: Option<i32>,
}

impl ServicePort {
    /// A plain port (no ClusterIP yet, no external access, Cluster policies, no affinity); the
    /// other fields are public to set.
    pub fn new(namespace: &str, name: &str, port_name: &str, protocol: &str, port: u16) -> ServicePort {
        ServicePort {
            id: ServicePortName::new(namespace, name, port_name),
            protocol: protocol.to_ascii_lowercase(),
            cluster_ip: None,
            port,
            node_port: None,
            external_ips: vec![],
            load_balancer_ips: vec![],
            source_ranges: vec![],
            external_policy_local: false,
            internal_policy_local: false,
            health_check_node_port: None,
            affinity_seconds: None,
        }
    }

    /// The port's name (prints `namespace/name[:port]`).
    pub fn spn(&self) -> &ServicePortName {
        &self.id
    }
    pub fn key(&self) -> ServiceKey {
        ServiceKey { name: self.id.clone(), protocol: self.protocol.clone() }
    }
    /// Reachable from outside: a NodePort, external IPs or load-balancer IPs.
    pub fn externally_accessible(&self) -> bool {
        self.node_port.is_some() || !self.external_ips.is_empty() || !self.load_balancer_ips.is_empty()
    }
    /// kube-proxy's `UsesClusterEndpoints`: ETP=Local still needs them for short-circuits.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }
}

/// One endpoint of a service port.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Endpoint {
    pub ip: IpAddr,
    pub port: u16,
    /// Shared ([`node_name`]): a handful of names among thousands of endpoints.
    pub node: Option<Arc<str>>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl Endpoint {
    /// `ip:port` (`[ip]:port` for IPv6), as in chain names and comments.
    pub fn addr(&self) -> String {
        std::net::SocketAddr::new(self.ip, self.port).to_string()
    }
}

/// The IPv4 service ports of a Service ([`service_ports_of`]).
pub fn service_ports(svc: &core::Service) -> Vec<ServicePort> {
    service_ports_of(svc, Family::V4)
}

/// The service ports of a Service for the proxier of `family`: its ClusterIP of that family
/// and only that family's load-balancer and external IPs and source ranges. None for a
/// Service without a ClusterIP of the family, headless or ExternalName (the proxy does not
/// handle those).
pub fn service_ports_of(svc: &core::Service, family: Family) -> Vec<ServicePort> {
    let Some(spec) = &svc.spec else { return vec![] };
    if spec.type_.as_deref() == Some("ExternalName") {
        return vec![];
    }
    let of_family = |ip: &IpAddr| Family::of(ip) == family;
    let cluster_ip: Option<IpAddr> = spec
        .cluster_ips
        .iter()
        .flatten()
        .chain(spec.cluster_ip.iter())
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .find(of_family);
    if cluster_ip.is_none() {
        return vec![];
    }
    let lb_ips: Vec<IpAddr> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        // `ipMode: Proxy` addresses are not the node's business.
        .filter(|i| i.ip_mode.as_deref().is_none_or(|m| m == "VIP"))
        .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.parse().ok()))
        .filter(of_family)
        .collect();
    let is_lb = spec.type_.as_deref() == Some("LoadBalancer");
    let affinity = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .unwrap_or(10800)
    });
    let ns = svc.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = svc.metadata.name.clone().unwrap_or_default();
    let mut out = vec![];
    for p in spec.ports.iter().flatten() {
        let Ok(port) = u16::try_from(p.port) else { continue };
        out.push(ServicePort {
            id: ServicePortName::new(&ns, &name, p.name.as_deref().unwrap_or_default()),
            protocol: p.protocol.as_deref().unwrap_or("TCP").to_ascii_lowercase(),
            cluster_ip,
            port,
            node_port: p.node_port.and_then(|n| u16::try_from(n).ok()).filter(|n| *n > 0),
            external_ips: spec
                .external_ips
                .iter()
                .flatten()
                .filter_map(|ip| ip.parse().ok())
                .filter(of_family)
                .collect(),
            load_balancer_ips: if is_lb { lb_ips.clone() } else { vec![] },
            source_ranges: if is_lb {
                spec.load_balancer_source_ranges
                    .iter()
                    .flatten()
                    .filter_map(|r| r.trim().parse::<IpNet>().ok())
                    .filter(|r| Family::of_net(r) == family)
                    .collect()
            } else {
                vec![]
            },
            external_policy_local: spec.external_traffic_policy.as_deref() == Some("Local"),
            internal_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
            health_check_node_port: spec
                .health_check_node_port
                .and_then(|n| u16::try_from(n).ok())
                .filter(|n| *n > 0 && is_lb && spec.external_traffic_policy.as_deref() == Some("Local")),
            affinity_seconds: affinity,
        });
    }
    out
}

/// The endpoints of `sp` in the Service's EndpointSlices (matched by port name and protocol),
/// as kube-proxy lists them: one per `ip:port` — when an address is in several slices, the
/// copy on `node` wins (its topology is this node's) — ordered by the `ip:port` **string**
/// (so `10.1.1.11:80` comes before `10.1.1.1:80`), which decides which endpoint gets which
/// rule and probability.
pub fn endpoints<'a>(sp: &ServicePort, slices: impl IntoIterator<Item = &'a SliceView>, node: &str) -> Vec<Endpoint> {
    let mut out: BTreeMap<(IpAddr, u16), Endpoint> = BTreeMap::new();
    for s in slices {
        if s.service.as_ref().is_none_or(|(ns, name)| *ns != sp.id.namespace || *name != sp.id.name) {
            continue;
        }
        let Some(port) = s
            .ports
            .iter()
            .find(|p| p.name == sp.id.port && p.protocol.eq_ignore_ascii_case(&sp.protocol))
            .and_then(|p| p.port)
        else {
            continue;
        };
        for e in &s.endpoints {
            let ep = Endpoint {
                ip: e.ip,
                port,
                node: e.node.clone(),
                ready: e.ready,
                serving: e.serving,
                terminating: e.terminating,
            };
            let local = ep.node.as_deref() == Some(node);
            match out.get(&(e.ip, port)) {
                Some(_) if !local => {}
                _ => {
                    out.insert((e.ip, port), ep);
                }
            }
        }
    }
    let mut list: Vec<Endpoint> = out.into_values().collect();
    list.sort_by_cached_key(|e| e.addr());
    list
}

/// A node's name, one copy for every endpoint on it (at 10,000 Services × 10 endpoints, a
/// string each was ≈ 6 MiB of the agent). At most `MAX_NAMES` are kept: names beyond (a
/// cluster that size, or slices naming nodes at random) get a copy of their own.
pub fn node_name(name: &str) -> Arc<str> {
    const MAX_NAMES: usize = 4096;
    static NAMES: Mutex<BTreeSet<Arc<str>>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.get(name) {
        return n.clone();
    }
    let n: Arc<str> = Arc::from(name);
    if names.len() < MAX_NAMES {
        names.insert(n.clone());
    }
    n
}

/// What the proxy reads of a Service: its ports. The agent's watch cache keeps this, not the
/// object: at 10,000 Services × 10 endpoints, whole objects were most of the agent's memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceView {
    pub ports: Vec<ServicePort>,
}

impl ServiceView {
    /// The IPv4 view.
    pub fn of(svc: &core::Service) -> ServiceView {
        ServiceView { ports: service_ports(svc) }
    }
    /// The view of the proxier of `family`.
    pub fn of_family(svc: &core::Service, family: Family) -> ServiceView {
        ServiceView { ports: service_ports_of(svc, family) }
    }
}

/// What the proxy reads of an EndpointSlice (kept in the agent's cache instead of the object).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SliceView {
    /// Its Service: namespace and `kubernetes.io/service-name` (None: a slice of nobody's).
    pub service: Option<(String, String)>,
    pub ports: Vec<SlicePort>,
    /// One per address of each endpoint (unparseable addresses left out).
    pub endpoints: Vec<SliceEndpoint>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlicePort {
    pub name: String,
    /// As written (`TCP` when unset).
    pub protocol: String,
    /// None: unset or out of range (the port matches nothing).
    pub port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceEndpoint {
    pub ip: IpAddr,
    pub node: Option<Arc<str>>,
    pub ready: bool,
    pub serving: bool,
    pub terminating: bool,
}

impl SliceView {
    /// The view of the proxier of `family`: a slice of another `addressType` is nobody's
    /// (kube-proxy's endpoint cache reads only its family's slices).
    pub fn of_family(s: &discovery::EndpointSlice, family: Family) -> SliceView {
        if s.address_type != family.api_name() {
            return SliceView::default();
        }
        SliceView::of(s)
    }

    pub fn of(s: &discovery::EndpointSlice) -> SliceView {
        let service = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .map(|name| (s.metadata.namespace.clone().unwrap_or_else(|| "default".into()), name.clone()));
        let ports = s
            .ports
            .iter()
            .flatten()
            .map(|p| SlicePort {
                name: p.name.clone().unwrap_or_default(),
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                port: p.port.and_then(|p| u16::try_from(p).ok()),
            })
            .collect();
        let mut endpoints = vec![];
        for e in &s.endpoints {
            // As kube-proxy reads the conditions: unset ready is ready, unset serving is ready.
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            for a in &e.addresses {
                if let Ok(ip) = a.parse::<IpAddr>() {
                    let node = e.node_name.as_deref().map(node_name);
                    endpoints.push(SliceEndpoint { ip, node, ready, serving, terminating });
                }
            }
        }
        SliceView { service, ports, endpoints }
    }
}

/// A service port with its endpoints categorised for this node, as both kernel modes write
/// rules from it: what kube-proxy's `usesClusterEndpoints`, `hasInternalEndpoints`, … decide.
#[derive(Debug, Clone)]
pub struct Categorized<'a> {
    pub sp: &'a ServicePort,
    /// `ns/name:port`, as comments name it.
    pub spn: String,
    /// The endpoints the cluster policy picks from.
    pub cluster_eps: Vec<Endpoint>,
    /// The endpoints on this node the local policy picks from.
    pub local_eps: Vec<Endpoint>,
}

impl<'a> Categorized<'a> {
    pub fn new(sp: &'a ServicePort, endpoints: &[Endpoint], node: &str) -> Categorized<'a> {
        let (cluster_eps, local_eps) = categorize(endpoints, node);
        Categorized { sp, spn: sp.spn().to_string(), cluster_eps, local_eps }
    }
    pub fn has_endpoints(&self) -> bool {
        !self.cluster_eps.is_empty() || !self.local_eps.is_empty()
    }
    pub fn uses_cluster(&self) -> bool {
        !self.cluster_eps.is_empty() && self.sp.uses_cluster_endpoints()
    }
    pub fn uses_local(&self) -> bool {
        !self.local_eps.is_empty() && self.sp.uses_local_endpoints()
    }
    pub fn uses_ext(&self) -> bool {
        self.has_endpoints() && self.sp.externally_accessible()
    }
    pub fn uses_fw(&self) -> bool {
        self.uses_ext() && !self.sp.source_ranges.is_empty()
    }
    /// Endpoints for the internal traffic policy (cluster, or this node's with `Local`).
    pub fn has_internal(&self) -> bool {
        !(if self.sp.internal_policy_local { &self.local_eps } else { &self.cluster_eps }).is_empty()
    }
    /// Endpoints for the external traffic policy.
    pub fn has_external(&self) -> bool {
        !(if self.sp.external_policy_local { &self.local_eps } else { &self.cluster_eps }).is_empty()
    }
}

/// kube-proxy's endpoint categorisation: ready endpoints, or — when none is ready — the serving
/// and terminating ones; separately for the cluster and for this node.
pub fn categorize(eps: &[Endpoint], node: &str) -> (Vec<Endpoint>, Vec<Endpoint>) {
    let pick = |list: Vec<&Endpoint>| -> Vec<Endpoint> {
        let ready: Vec<Endpoint> = list.iter().filter(|e| e.ready).map(|e| (*e).clone()).collect();
        if !ready.is_empty() {
            return ready;
        }
        list.iter().filter(|e| e.serving && e.terminating).map(|e| (*e).clone()).collect()
    };
    let cluster = pick(eps.iter().collect());
    let local = pick(eps.iter().filter(|e| e.node.as_deref() == Some(node)).collect());
    (cluster, local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(name: &str, endpoints: serde_json::Value) -> discovery::EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "", "port": 80, "protocol": "TCP"}],
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    #[test]
    fn endpoints_sort_as_strings_and_the_local_copy_wins() {
        let sp = ServicePort::new("default", "web", "", "TCP", 80);
        let slices = [
            slice(
                "a",
                json!([
                    {"addresses": ["10.1.1.1"], "nodeName": "node-2"},
                    {"addresses": ["10.1.1.11"], "nodeName": "node-2"},
                    {"addresses": ["10.1.1.2"], "nodeName": "node-2"},
                ]),
            ),
            slice("b", json!([{"addresses": ["10.1.1.1"], "nodeName": "node-1", "conditions": {"ready": false}}])),
        ];
        let slices = slices.map(|s| SliceView::of(&s));
        let eps = endpoints(&sp, &slices, "node-1");
        let addrs: Vec<String> = eps.iter().map(Endpoint::addr).collect();
        assert_eq!(addrs, ["10.1.1.11:80", "10.1.1.1:80", "10.1.1.2:80"]);
        assert_eq!(eps[1].node.as_deref(), Some("node-1"), "the copy on this node");
        assert!(!eps[1].ready);
        // Seen from another node, the first copy stays.
        let eps = endpoints(&sp, &slices, "node-3");
        assert_eq!(eps[1].node.as_deref(), Some("node-2"));
    }
}
