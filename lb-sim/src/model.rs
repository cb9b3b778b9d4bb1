//! What the gateway should do, as pure functions of Services, Nodes and health results.
//!
//! A *frontend* is one address the outside world reaches a Service on: a LoadBalancer ingress
//! IP or an externalIP. Its *backends* are the nodes, each with the health check a cloud LB
//! would use for it. From the frontends come the check targets, the gateway's routes
//! (passthrough: the packet goes to a node unchanged) and the NodePort proxies (nodeport mode:
//! the gateway terminates the connection and opens one to `node IP:nodePort`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1 as core;
use serde::Serialize;

/// Pins a Service's external routes to one node (scenario 4: a static route to a node that
/// runs none of the Service's pods).
pub const ROUTE_TO_NODE: &str = "podpath.dev/route-to-node";
/// Nodes with this label are never load-balancer backends (as with cloud providers).
pub const EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// How LoadBalancer IPs reach the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// GKE/MetalLB style: a route to a node, the packet unchanged.
    Passthrough,
    /// Classic cloud LB style: the LB connects to `node IP:nodePort`.
    Nodeport,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Passthrough => "passthrough",
            Mode::Nodeport => "nodeport",
        })
    }
}

/// Where a frontend address comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum VipKind {
    LoadBalancer,
    ExternalIP,
}

/// How the gateway delivers a frontend's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Delivery {
    /// Routed to a node, unchanged.
    Route,
    /// Proxied to `node IP:nodePort`.
    Proxy,
}

/// One HTTP health check: `GET http://ip:port/path`, healthy on 200.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Check {
    pub ip: IpAddr,
    pub port: u16,
    pub path: String,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", SocketAddr::new(self.ip, self.port), self.path)
    }
}

/// A node as the load balancer sees it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LbNode {
    pub name: String,
    /// The address its health is checked at (its IPv4 InternalIP when it has one).
    pub ip: IpAddr,
    /// Every InternalIP: a VIP is routed or proxied to the node's address of its own family.
    pub ips: Vec<IpAddr>,
}

/// A node behind a frontend, with its check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backend {
    pub node: String,
    pub ip: IpAddr,
    pub check: Check,
}

/// One service port of a frontend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMap {
    pub name: String,
    pub protocol: String,
    pub port: u16,
    pub node_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontend {
    pub vip: IpAddr,
    /// `namespace/name` of the Service.
    pub service: String,
    pub kind: VipKind,
    pub delivery: Delivery,
    pub ports: Vec<PortMap>,
    /// The node named by [`ROUTE_TO_NODE`], if any.
    pub pinned: Option<String>,
    pub backends: Vec<Backend>,
}

/// Each node's pod subnets, through the node's address of the subnet's family (what the
/// Gateways need to reach endpoints directly).
pub fn pod_subnets(nodes: &[core::Node], lb: &[LbNode]) -> BTreeMap<ipnet::IpNet, IpAddr> {
    let mut out = BTreeMap::new();
    for n in nodes {
        let Some(name) = n.metadata.name.as_deref() else { continue };
        let Some(node) = lb.iter().find(|l| l.name == name) else { continue };
        let spec = n.spec.clone().unwrap_or_default();
        let cidrs =
            spec.pod_cidrs.clone().filter(|c| !c.is_empty()).or(spec.pod_cidr.map(|c| vec![c])).unwrap_or_default();
        for c in cidrs {
            let Ok(net) = c.parse::<ipnet::IpNet>() else { continue };
            if let Some(via) = node.ips.iter().find(|ip| ip.is_ipv4() == net.addr().is_ipv4()) {
                out.insert(net, *via);
            }
        }
    }
    out
}

/// The nodes that can be backends: an InternalIP, and not excluded by label.
pub fn lb_nodes(nodes: &[core::Node]) -> Vec<LbNode> {
    let mut out: Vec<LbNode> = nodes
        .iter()
        .filter(|n| !n.metadata.labels.as_ref().is_some_and(|l| l.contains_key(EXCLUDE_FROM_LB)))
        .filter(|n| n.metadata.deletion_timestamp.is_none())
        .filter_map(|n| {
            let ips: Vec<IpAddr> = n
                .status
                .as_ref()?
                .addresses
                .as_ref()?
                .iter()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse::<IpAddr>().ok())
                .collect();
            let ip = ips.iter().copied().min_by_key(|ip| ip.is_ipv6())?;
            Some(LbNode { name: n.metadata.name.clone()?, ip, ips })
        })
        .collect();
    out.sort();
    out
}

/// Every frontend of every Service. `node_health_port` is kube-proxy's `:10256`.
pub fn frontends(services: &[core::Service], nodes: &[LbNode], mode: Mode, node_health_port: u16) -> Vec<Frontend> {
    let mut out = Vec::new();
    for svc in services {
        let Some(spec) = svc.spec.as_ref() else { continue };
        let service = format!(
            "{}/{}",
            svc.metadata.namespace.as_deref().unwrap_or("default"),
            svc.metadata.name.as_deref().unwrap_or_default()
        );
        let ports: Vec<PortMap> = spec
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                Some(PortMap {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port: u16::try_from(p.port).ok()?,
                    node_port: p.node_port.and_then(|n| u16::try_from(n).ok()),
                })
            })
            .collect();
        let pinned = svc.metadata.annotations.as_ref().and_then(|a| a.get(ROUTE_TO_NODE)).cloned();
        // A cloud LB checks kube-proxy's health for Cluster traffic; for Local it asks the
        // Service's own health port, which answers 200 only where there are local endpoints.
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let check_for = |n: &LbNode| match (local, spec.health_check_node_port.and_then(|p| u16::try_from(p).ok())) {
            (true, Some(port)) => Check { ip: n.ip, port, path: "/".into() },
            _ => Check { ip: n.ip, port: node_health_port, path: "/healthz".into() },
        };
        // A node is a backend of a VIP at its address of the VIP's family (IPv6 routes cannot
        // use an IPv4 nexthop); a node without one is no backend of that VIP.
        let backends_for = |vip: IpAddr| -> Vec<Backend> {
            nodes
                .iter()
                .filter(|n| pinned.as_ref().is_none_or(|p| *p == n.name))
                .filter_map(|n| {
                    let ip = n.ips.iter().copied().find(|a| a.is_ipv6() == vip.is_ipv6())?;
                    Some(Backend { node: n.name.clone(), ip, check: check_for(n) })
                })
                .collect()
        };
        let mut vips: Vec<(IpAddr, VipKind)> = Vec::new();
        if spec.type_.as_deref() == Some("LoadBalancer") {
            let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
            for i in ingress.into_iter().flatten() {
                if let Some(ip) = i.ip.as_deref().and_then(|ip| ip.parse().ok()) {
                    vips.push((ip, VipKind::LoadBalancer));
                }
            }
        }
        for ip in spec.external_ips.iter().flatten().filter_map(|ip| ip.parse().ok()) {
            vips.push((ip, VipKind::ExternalIP));
        }
        vips.sort();
        vips.dedup_by_key(|(ip, _)| *ip);
        for (vip, kind) in vips {
            // externalIPs are the gateway's routing in every mode; only LB IPs become proxies.
            let delivery =
                if mode == Mode::Nodeport && kind == VipKind::LoadBalancer { Delivery::Proxy } else { Delivery::Route };
            out.push(Frontend {
                vip,
                service: service.clone(),
                kind,
                delivery,
                ports: ports.clone(),
                pinned: pinned.clone(),
                backends: backends_for(vip),
            });
        }
    }
    out.sort_by(|a, b| (a.vip, &a.service).cmp(&(b.vip, &b.service)));
    out
}

/// The backends that get traffic: the healthy ones, or the pinned node whatever its health
/// (a pin is a static route, as in the walkthrough: it does not follow health checks).
pub fn in_rotation<'a>(f: &'a Frontend, healthy: &impl Fn(&Check) -> bool) -> Vec<&'a Backend> {
    f.backends.iter().filter(|b| f.pinned.is_some() || healthy(&b.check)).collect()
}

/// Every check the frontends need.
pub fn checks(frontends: &[Frontend]) -> BTreeSet<Check> {
    frontends.iter().flat_map(|f| f.backends.iter().map(|b| b.check.clone())).collect()
}

/// Passthrough routes: VIP → the node IPs to spread it over (VIPs with no node left out).
pub fn routes(frontends: &[Frontend], healthy: &impl Fn(&Check) -> bool) -> BTreeMap<IpAddr, BTreeSet<IpAddr>> {
    let mut out: BTreeMap<IpAddr, BTreeSet<IpAddr>> = BTreeMap::new();
    for f in frontends.iter().filter(|f| f.delivery == Delivery::Route) {
        let nodes: BTreeSet<IpAddr> = in_rotation(f, healthy).iter().map(|b| b.ip).collect();
        if !nodes.is_empty() {
            out.entry(f.vip).or_default().extend(nodes);
        }
    }
    out
}

/// NodePort proxies: `LB IP:port` → `node IP:nodePort` of the nodes in rotation (TCP ports
/// with a nodePort; an empty list means the listener refuses connections).
pub fn proxies(frontends: &[Frontend], healthy: &impl Fn(&Check) -> bool) -> BTreeMap<SocketAddr, Vec<SocketAddr>> {
    let mut out = BTreeMap::new();
    for f in frontends.iter().filter(|f| f.delivery == Delivery::Proxy) {
        let nodes = in_rotation(f, healthy);
        for p in f.ports.iter().filter(|p| p.protocol == "TCP") {
            let Some(node_port) = p.node_port else { continue };
            out.insert(
                SocketAddr::new(f.vip, p.port),
                nodes.iter().map(|b| SocketAddr::new(b.ip, node_port)).collect(),
            );
        }
    }
    out
}

/// The addresses the gateway must own itself (the proxies' VIPs).
pub fn local_addresses(frontends: &[Frontend]) -> BTreeSet<IpAddr> {
    frontends.iter().filter(|f| f.delivery == Delivery::Proxy).map(|f| f.vip).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nodes() -> Vec<LbNode> {
        (1..=3)
            .map(|i| {
                let ip: IpAddr = format!("192.168.56.1{i}").parse().unwrap();
                LbNode { name: format!("node-{i}"), ip, ips: vec![ip] }
            })
            .collect()
    }

    fn svc(v: serde_json::Value) -> core::Service {
        serde_json::from_value(v).unwrap()
    }

    fn contour() -> core::Service {
        svc(json!({
            "metadata": {"name": "contour", "namespace": "default"},
            "spec": {"type": "LoadBalancer", "externalIPs": ["169.10.10.1"], "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"},
                {"name": "https", "port": 443, "targetPort": 8443, "nodePort": 30443, "protocol": "TCP"}]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}
        }))
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn nodes_without_internal_ip_or_excluded_are_not_backends() {
        let ns: Vec<core::Node> = serde_json::from_value(json!([
            {"metadata": {"name": "b"}, "status": {"addresses": [{"type": "InternalIP", "address": "fd00::2"}, {"type": "InternalIP", "address": "10.0.0.2"}]}},
            {"metadata": {"name": "a"}, "status": {"addresses": [{"type": "Hostname", "address": "a"}]}},
            {"metadata": {"name": "c", "labels": {EXCLUDE_FROM_LB: ""}}, "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.3"}]}}
        ]))
        .unwrap();
        assert_eq!(
            lb_nodes(&ns),
            vec![LbNode { name: "b".into(), ip: ip("10.0.0.2"), ips: vec![ip("fd00::2"), ip("10.0.0.2")] }]
        );
    }

    #[test]
    fn passthrough_routes_every_vip_to_the_healthy_nodes() {
        let fs = frontends(&[contour()], &nodes(), Mode::Passthrough, 10256);
        assert_eq!(fs.len(), 2);
        assert_eq!((fs[0].vip, fs[0].kind, fs[0].delivery), (ip("169.10.10.1"), VipKind::ExternalIP, Delivery::Route));
        assert_eq!(
            (fs[1].vip, fs[1].kind, fs[1].delivery),
            (ip("198.51.100.1"), VipKind::LoadBalancer, Delivery::Route)
        );
        assert_eq!(fs[1].backends[0].check.to_string(), "http://192.168.56.11:10256/healthz");
        let down = ip("192.168.56.12");
        let healthy = |c: &Check| c.ip != down;
        let r = routes(&fs, &healthy);
        let want: BTreeSet<IpAddr> = [ip("192.168.56.11"), ip("192.168.56.13")].into();
        assert_eq!(r, [(ip("169.10.10.1"), want.clone()), (ip("198.51.100.1"), want)].into());
        assert!(proxies(&fs, &healthy).is_empty());
        assert!(local_addresses(&fs).is_empty());
        // Nobody healthy: no route at all (the gateway answers "unreachable").
        assert!(routes(&fs, &|_: &Check| false).is_empty());
    }

    #[test]
    fn a_dual_stack_service_is_routed_to_each_nodes_address_of_the_vips_family() {
        let dual: Vec<LbNode> = (1..=2)
            .map(|i| {
                let (v4, v6): (IpAddr, IpAddr) =
                    (format!("192.168.56.1{i}").parse().unwrap(), format!("fd00:56::1{i}").parse().unwrap());
                LbNode { name: format!("node-{i}"), ip: v4, ips: vec![v4, v6] }
            })
            .collect();
        let s6 = || {
            svc(json!({"metadata": {"name": "web", "namespace": "default"},
                "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "nodePort": 30080}]},
                "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}, {"ip": "2001:db8:100::1"}]}}}))
        };
        let fs = frontends(&[s6()], &dual, Mode::Passthrough, 10256);
        let r = routes(&fs, &|_: &Check| true);
        assert_eq!(r[&ip("2001:db8:100::1")], [ip("fd00:56::11"), ip("fd00:56::12")].into());
        assert_eq!(r[&ip("198.51.100.1")], [ip("192.168.56.11"), ip("192.168.56.12")].into());
        // One health check per node, whatever the VIP's family.
        assert_eq!(checks(&fs).len(), 2);
        // Proxied (NodePort mode): the IPv6 VIP to the nodes' IPv6 addresses.
        let p = proxies(&frontends(&[s6()], &dual, Mode::Nodeport, 10256), &|_: &Check| true);
        let want: Vec<SocketAddr> =
            vec!["[fd00:56::11]:30080".parse().unwrap(), "[fd00:56::12]:30080".parse().unwrap()];
        assert_eq!(p[&"[2001:db8:100::1]:80".parse().unwrap()], want);
    }

    #[test]
    fn nodeport_mode_proxies_lb_ips_and_still_routes_external_ips() {
        let fs = frontends(&[contour()], &nodes(), Mode::Nodeport, 10256);
        let healthy = |c: &Check| c.ip != ip("192.168.56.11");
        let p = proxies(&fs, &healthy);
        let to = |s: &[&str]| s.iter().map(|s| s.parse::<SocketAddr>().unwrap()).collect::<Vec<_>>();
        assert_eq!(
            p,
            [
                ("198.51.100.1:80".parse().unwrap(), to(&["192.168.56.12:30080", "192.168.56.13:30080"])),
                ("198.51.100.1:443".parse().unwrap(), to(&["192.168.56.12:30443", "192.168.56.13:30443"])),
            ]
            .into()
        );
        assert_eq!(local_addresses(&fs), [ip("198.51.100.1")].into());
        assert_eq!(routes(&fs, &healthy).keys().copied().collect::<Vec<_>>(), vec![ip("169.10.10.1")]);
    }

    #[test]
    fn a_pinned_service_routes_to_its_node_whatever_its_health() {
        let mut s = contour();
        s.metadata.annotations = Some([(ROUTE_TO_NODE.to_string(), "node-2".to_string())].into());
        let fs = frontends(&[s], &nodes(), Mode::Passthrough, 10256);
        let r = routes(&fs, &|_: &Check| false);
        assert_eq!(r[&ip("169.10.10.1")], [ip("192.168.56.12")].into());
        assert_eq!(fs[0].pinned.as_deref(), Some("node-2"));
    }

    #[test]
    fn local_traffic_policy_checks_the_health_check_node_port() {
        let mut s = contour();
        let spec = s.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(31999);
        let fs = frontends(&[s], &nodes(), Mode::Passthrough, 10256);
        assert_eq!(fs[0].backends[2].check.to_string(), "http://192.168.56.13:31999/");
        assert_eq!(checks(&fs).len(), 3);
        let only_n3 = |c: &Check| c.ip == ip("192.168.56.13");
        assert_eq!(routes(&fs, &only_n3)[&ip("198.51.100.1")], [ip("192.168.56.13")].into());
    }

    #[test]
    fn two_services_sharing_an_external_ip_share_one_route() {
        let mut other = contour();
        other.metadata.name = Some("other".into());
        other.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        other.metadata.annotations = Some([(ROUTE_TO_NODE.to_string(), "node-3".to_string())].into());
        let fs = frontends(&[contour(), other], &nodes(), Mode::Passthrough, 10256);
        let healthy = |c: &Check| c.ip == ip("192.168.56.11");
        let r = routes(&fs, &healthy);
        assert_eq!(r[&ip("169.10.10.1")], [ip("192.168.56.11"), ip("192.168.56.13")].into());
        assert_eq!(r[&ip("198.51.100.1")], [ip("192.168.56.11")].into());
    }
}
