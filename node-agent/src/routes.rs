//! The host-gw pod network between nodes: a route to every other node's pod CIDR via that
//! node's InternalIP. The wanted set is a pure function of the Node list; [`RouteTable`] applies
//! the difference. The agent's routes carry their own routing protocol number, so it recognises
//! exactly its own routes after a restart (no duplicates, stale ones removed) and never touches
//! anybody else's.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1 as core;
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteProtocol};
use rtnetlink::RouteMessageBuilder;

use crate::error::{AgentError, Result};

/// `proto` of the agent's routes (shows as `proto 77` in `ip route`; unassigned in iproute2's rt_protos).
pub const ROUTE_PROTOCOL: u8 = 77;

/// A route to another node's pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRoute {
    pub cidr: IpNet,
    pub via: IpAddr,
}

impl std::fmt::Display for PodRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} via {}", self.cidr, self.via)
    }
}

/// The routes this node needs: every other node's pod CIDRs via its InternalIP (same family).
pub fn desired_routes(nodes: &[core::Node], me: &str) -> BTreeSet<PodRoute> {
    let mut out = BTreeSet::new();
    for n in nodes {
        if n.metadata.name.as_deref() == Some(me) {
            continue;
        }
        let addrs: Vec<IpAddr> = n
            .status
            .iter()
            .flat_map(|s| s.addresses.iter().flatten())
            .filter(|a| a.type_ == "InternalIP")
            .filter_map(|a| a.address.parse().ok())
            .collect();
        let spec = n.spec.as_ref();
        let mut cidrs: Vec<&String> = spec.and_then(|s| s.pod_cidrs.as_ref()).into_iter().flatten().collect();
        if cidrs.is_empty() {
            cidrs.extend(spec.and_then(|s| s.pod_cidr.as_ref()));
        }
        for cidr in cidrs.into_iter().filter_map(|c| c.parse::<IpNet>().ok()) {
            if let Some(via) = addrs.iter().find(|a| a.is_ipv4() == cidr.addr().is_ipv4()) {
                out.insert(PodRoute { cidr: cidr.trunc(), via: *via });
            }
        }
    }
    out
}

/// What to change to get from `have` to `want`.
pub fn route_changes(have: &BTreeSet<PodRoute>, want: &BTreeSet<PodRoute>) -> (Vec<PodRoute>, Vec<PodRoute>) {
    let add = want.difference(have).copied().collect();
    let del = have.difference(want).copied().collect();
    (add, del)
}

/// The node's routing table, as far as the agent's own routes go.
pub trait RouteTable: Send + Sync + 'static {
    /// The routes carrying [`ROUTE_PROTOCOL`].
    fn list(&self) -> impl Future<Output = Result<BTreeSet<PodRoute>>> + Send;
    fn add(&self, r: PodRoute) -> impl Future<Output = Result<()>> + Send;
    fn del(&self, r: PodRoute) -> impl Future<Output = Result<()>> + Send;
    /// Turns on IP forwarding in the agent's network namespace.
    fn enable_forwarding(&self) -> Result<()>;
}

/// Applies the difference; returns how many routes were added and removed.
pub async fn sync_routes<T: RouteTable>(table: &T, want: &BTreeSet<PodRoute>) -> Result<(usize, usize)> {
    let have = table.list().await?;
    let (add, del) = route_changes(&have, want);
    for r in &del {
        table.del(*r).await?;
        tracing::info!(route = %r, "removed pod route");
    }
    for r in &add {
        table.add(*r).await?;
        tracing::info!(route = %r, "added pod route");
    }
    Ok((add.len(), del.len()))
}

/// The kernel's routing table (main table) through netlink.
pub struct NetlinkRoutes {
    handle: rtnetlink::Handle,
}

impl NetlinkRoutes {
    /// Opens a netlink connection (in the agent's network namespace).
    pub fn new() -> Result<NetlinkRoutes> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| AgentError::io("open a netlink socket", e))?;
        tokio::spawn(conn);
        Ok(NetlinkRoutes { handle })
    }
}

fn net_err(what: String, e: impl std::error::Error + Send + Sync + 'static) -> AgentError {
    AgentError::System { what, source: Box::new(e) }
}

fn message(r: PodRoute) -> Result<rtnetlink::packet_route::route::RouteMessage> {
    fn bad(r: PodRoute) -> impl Fn(&dyn std::fmt::Display) -> AgentError {
        move |e| AgentError::Config(format!("invalid route {r}: {e}"))
    }
    Ok(RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(r.cidr.addr(), r.cidr.prefix_len())
        .map_err(|e| bad(r)(&e))?
        .gateway(r.via)
        .map_err(|e| bad(r)(&e))?
        .protocol(RouteProtocol::from(ROUTE_PROTOCOL))
        .build())
}

impl RouteTable for NetlinkRoutes {
    async fn list(&self) -> Result<BTreeSet<PodRoute>> {
        let mut out = BTreeSet::new();
        for query in [RouteMessageBuilder::<Ipv4Addr>::new().build(), RouteMessageBuilder::<Ipv6Addr>::new().build()] {
            let mut s = self.handle.route().get(query).execute();
            while let Some(m) = s.try_next().await.map_err(|e| net_err("list routes".into(), e))? {
                if u8::from(m.header.protocol) != ROUTE_PROTOCOL {
                    continue;
                }
                let (mut dst, mut via) = (None, None);
                for a in &m.attributes {
                    match a {
                        RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = Some(IpAddr::from(*ip)),
                        RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = Some(IpAddr::from(*ip)),
                        RouteAttribute::Gateway(RouteAddress::Inet(ip)) => via = Some(IpAddr::from(*ip)),
                        RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => via = Some(IpAddr::from(*ip)),
                        _ => {}
                    }
                }
                if let (Some(dst), Some(via)) = (dst, via) {
                    if let Ok(cidr) = IpNet::new(dst, m.header.destination_prefix_length) {
                        out.insert(PodRoute { cidr, via });
                    }
                }
            }
        }
        Ok(out)
    }

    async fn add(&self, r: PodRoute) -> Result<()> {
        // `replace`: a route for the CIDR left by someone else's restart is taken over.
        self.handle.route().add(message(r)?).replace().execute().await.map_err(|e| net_err(format!("add route {r}"), e))
    }

    async fn del(&self, r: PodRoute) -> Result<()> {
        match self.handle.route().del(message(r)?).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(m)) if m.raw_code() == -libc_esrch() => Ok(()),
            Err(e) => Err(net_err(format!("delete route {r}"), e)),
        }
    }

    fn enable_forwarding(&self) -> Result<()> {
        for path in ["/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"] {
            if std::fs::read_to_string(path).map(|v| v.trim() == "1").unwrap_or(false) {
                continue;
            }
            if let Err(e) = std::fs::write(path, "1") {
                // IPv6 may be disabled in the namespace; IPv4 forwarding is required.
                if path.contains("ipv4") {
                    return Err(AgentError::io(format!("write {path}"), e));
                }
            }
        }
        Ok(())
    }
}

/// ESRCH: "No such process", netlink's answer when deleting a route that is not there.
const fn libc_esrch() -> i32 {
    3
}

/// The routes' metrics on the node's page: syncs done and routes held.
#[derive(Clone)]
pub struct RouteMetrics {
    syncs: prometheus_client::metrics::counter::Counter,
    routes: prometheus_client::metrics::gauge::Gauge,
}

impl RouteMetrics {
    /// Registers them in the node's `podpath_node` sub-registry.
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> RouteMetrics {
        let m = RouteMetrics { syncs: Default::default(), routes: Default::default() };
        registry.register("route_syncs", "Route synchronisations with the Node list", m.syncs.clone());
        registry.register("pod_routes", "Routes to other nodes' pod CIDRs", m.routes.clone());
        m
    }

    /// A sync that left `routes` routes.
    pub fn synced(&self, routes: usize) {
        self.syncs.inc();
        self.routes.set(routes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeSpec, NodeStatus};

    fn node(name: &str, ip: &str, cidr: Option<&str>) -> core::Node {
        core::Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(NodeSpec { pod_cidr: cidr.map(Into::into), ..Default::default() }),
            status: Some(NodeStatus {
                addresses: Some(vec![
                    NodeAddress { type_: "Hostname".into(), address: name.into() },
                    NodeAddress { type_: "InternalIP".into(), address: ip.into() },
                ]),
                ..Default::default()
            }),
        }
    }

    fn r(cidr: &str, via: &str) -> PodRoute {
        PodRoute { cidr: cidr.parse().unwrap(), via: via.parse().unwrap() }
    }

    #[test]
    fn a_route_per_other_node_with_a_cidr() {
        let nodes = vec![
            node("node-1", "192.168.56.11", Some("10.244.1.0/24")),
            node("node-2", "192.168.56.12", Some("10.244.2.0/24")),
            node("node-3", "192.168.56.13", None),
        ];
        let want = desired_routes(&nodes, "node-1");
        assert_eq!(want, BTreeSet::from([r("10.244.2.0/24", "192.168.56.12")]));
    }

    #[test]
    fn changes_add_missing_and_remove_stale_only() {
        let have = BTreeSet::from([r("10.244.2.0/24", "192.168.56.12"), r("10.244.9.0/24", "192.168.56.19")]);
        let want = BTreeSet::from([r("10.244.2.0/24", "192.168.56.12"), r("10.244.3.0/24", "192.168.56.13")]);
        let (add, del) = route_changes(&have, &want);
        assert_eq!(add, vec![r("10.244.3.0/24", "192.168.56.13")]);
        assert_eq!(del, vec![r("10.244.9.0/24", "192.168.56.19")]);
        assert_eq!(route_changes(&want, &want), (vec![], vec![]));
    }

    #[test]
    fn a_node_moving_changes_the_next_hop() {
        let have = BTreeSet::from([r("10.244.2.0/24", "192.168.56.12")]);
        let want = desired_routes(&[node("node-2", "192.168.56.22", Some("10.244.2.0/24"))], "node-1");
        let (add, del) = route_changes(&have, &want);
        assert_eq!((add.len(), del.len()), (1, 1));
    }
}
