//! kube-proxy's userspace mode (Kubernetes ≤ 1.25; reference/kube-proxy.md §2): a real proxy
//! socket per service port, iptables rules that only redirect traffic to it, round-robin over
//! the endpoints with retries on a failed connect, ClientIP affinity kept in memory, and every
//! NodePort held open as a socket so nothing else on the node can take it.
//!
//! The rules are rendered purely ([`render`]) into the ruleset model and written with one
//! `iptables-restore` per sync (kube-proxy wrote them one by one with `iptables -C/-A`; the
//! resulting rules are the same).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use podpath_client::reflector::Store;
use podpath_ruleset::{plan, Addr, Match, Rule, Ruleset, Table, Target};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

use super::iptables::ServiceState;
use super::model::{categorize, ServiceKey, ServicePort, ServicePortName, ServiceView, SliceView};
use super::sync::{snapshot, CANARY};
use crate::error::{ProxyError, Result};
use crate::health::Health;
use podpath_ruleset::kernel::{missing_jumps, removal, Jump, Kernel};

pub const PORTALS_CONTAINER: &str = "KUBE-PORTALS-CONTAINER";
pub const PORTALS_HOST: &str = "KUBE-PORTALS-HOST";
pub const NODEPORT_CONTAINER: &str = "KUBE-NODEPORT-CONTAINER";
pub const NODEPORT_HOST: &str = "KUBE-NODEPORT-HOST";
pub const NODEPORT_NON_LOCAL: &str = "KUBE-NODEPORT-NON-LOCAL";

/// Dial timeouts of the successive endpoints tried for one connection (kube-proxy's
/// `EndpointDialTimeouts`).
pub const DIAL_TIMEOUTS: [Duration; 4] =
    [Duration::from_millis(250), Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];

/// How long a UDP client's "connection" lives without traffic (kube-proxy's `--udp-timeout`).
pub const UDP_IDLE_TIMEOUT: Duration = Duration::from_millis(250);

const PORTALS_COMMENT: &str = "handle ClusterIPs; NOTE: this must be before the NodePort rules";
const NODEPORTS_COMMENT: &str = "handle service NodePorts; NOTE: this must be the last rule in the chain";

/// Every jump the userspace mode installs, in kube-proxy's order.
pub const USERSPACE_JUMPS: &[Jump] = &[
    Jump {
        table: "nat",
        from: "OUTPUT",
        to: PORTALS_HOST,
        first: true,
        new_only: false,
        local_only: false,
        comment: PORTALS_COMMENT,
    },
    Jump {
        table: "nat",
        from: "PREROUTING",
        to: PORTALS_CONTAINER,
        first: true,
        new_only: false,
        local_only: false,
        comment: PORTALS_COMMENT,
    },
    Jump {
        table: "nat",
        from: "OUTPUT",
        to: NODEPORT_HOST,
        first: false,
        new_only: false,
        local_only: true,
        comment: NODEPORTS_COMMENT,
    },
    Jump {
        table: "nat",
        from: "PREROUTING",
        to: NODEPORT_CONTAINER,
        first: false,
        new_only: false,
        local_only: true,
        comment: NODEPORTS_COMMENT,
    },
    Jump {
        table: "filter",
        from: "INPUT",
        to: NODEPORT_NON_LOCAL,
        first: true,
        new_only: false,
        local_only: false,
        comment: "Ensure that non-local NodePort traffic can flow",
    },
];

/// Adds to `rs` the jumps into the userspace chains that the kernel's tables lack, and the
/// canaries.
pub fn add_jumps<K: Kernel + ?Sized>(k: &K, rs: &mut Ruleset) -> Result<()> {
    for name in ["nat", "filter"] {
        let saved = k.save(name, None)?;
        let t = rs.table_mut(name);
        t.commands.extend(missing_jumps(USERSPACE_JUMPS, name, &saved));
        t.declare(CANARY);
    }
    rs.table_mut("mangle").declare(CANARY);
    Ok(())
}

/// Removes the userspace mode's jumps and chains in one restore (when the iptables mode takes
/// over, and on `--cleanup`).
pub fn cleanup<K: Kernel + ?Sized>(k: &K) -> Result<()> {
    let saved = ["nat", "filter"].iter().map(|t| k.save(t, None)).collect::<podpath_ruleset::Result<Vec<Table>>>()?;
    let plan = removal(USERSPACE_JUMPS, &saved, |t, c| USERSPACE_JUMPS.iter().any(|j| j.table == t && j.to == c));
    if plan.tables.is_empty() {
        return Ok(());
    }
    Ok(k.restore(&plan)?)
}

/// A service port with the proxy port its socket listens on and whether this node holds its
/// NodePort.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Portal {
    pub port: ServicePort,
    pub proxy_port: u16,
    pub node_port_held: bool,
}

/// kube-proxy's `iptablesCommonPortalArgs`: `-m comment --comment SPN -p P -m P --dport PORT
/// [-d IP/32] [-m physdev ! --physdev-is-in] [-m addrtype --dst-type LOCAL]`.
fn portal(
    chain: &str,
    sp: &ServicePort,
    dest: Option<IpAddr>,
    port: u16,
    physdev_not_in: bool,
    dst_local: bool,
) -> Rule {
    let p = &sp.protocol;
    let mut r = Rule::new(chain)
        .comment(sp.spn().to_string())
        .with(Match::Protocol { proto: p.clone(), negated: false })
        .with(Match::Module(p.clone()))
        .dport(port);
    if let Some(ip) = dest {
        r = r.dst(Addr::Net(ipnet::IpNet::from(ip)));
    }
    if physdev_not_in {
        r = r.with(Match::PhysdevIsIn { negated: true });
    }
    if dst_local {
        r = r.dst_type("LOCAL");
    }
    r
}

/// Traffic arriving at the node: REDIRECT to the proxy port (the proxy listens on every address).
fn to_container(r: Rule, proxy_port: u16) -> Rule {
    r.target(Target::Redirect { to_ports: proxy_port.to_string() })
}

/// Traffic the node itself sends: DNAT to the node's address (REDIRECT to 127.0.0.1 broke the
/// replies).
fn to_host(r: Rule, node_ip: IpAddr, proxy_port: u16) -> Rule {
    r.target(Target::Dnat { to: SocketAddr::new(node_ip, proxy_port).to_string() })
}

/// The whole userspace ruleset (filter and nat) as one `iptables-restore --noflush` input.
pub fn render(node_ip: IpAddr, portals: &[Portal]) -> Ruleset {
    let mut filter = vec![];
    let mut container = vec![];
    let mut host = vec![];
    let mut np_container = vec![];
    let mut np_host = vec![];
    for Portal { port: sp, proxy_port, node_port_held } in portals {
        let pp = *proxy_port;
        if let Some(cip) = sp.cluster_ip {
            container.push(to_container(portal(PORTALS_CONTAINER, sp, Some(cip), sp.port, false, false), pp));
            host.push(to_host(portal(PORTALS_HOST, sp, Some(cip), sp.port, false, false), node_ip, pp));
        }
        for ip in &sp.external_ips {
            // From off the machine (not bridged from a local pod), and to a local address.
            container.push(to_container(portal(PORTALS_CONTAINER, sp, Some(*ip), sp.port, true, false), pp));
            container.push(to_container(portal(PORTALS_CONTAINER, sp, Some(*ip), sp.port, false, true), pp));
            host.push(to_host(portal(PORTALS_HOST, sp, Some(*ip), sp.port, false, true), node_ip, pp));
        }
        for ip in &sp.load_balancer_ips {
            container.push(to_container(portal(PORTALS_CONTAINER, sp, Some(*ip), sp.port, false, false), pp));
            host.push(to_host(portal(PORTALS_HOST, sp, Some(*ip), sp.port, false, false), node_ip, pp));
        }
        if let (Some(np), true) = (sp.node_port, *node_port_held) {
            np_container.push(to_container(portal(NODEPORT_CONTAINER, sp, None, np, false, false), pp));
            np_host.push(to_host(portal(NODEPORT_HOST, sp, None, np, false, false), node_ip, pp));
            let accept = portal(NODEPORT_NON_LOCAL, sp, None, pp, false, false);
            filter.push(accept.with(Match::State { states: vec!["NEW".into()] }).jump("ACCEPT"));
        }
    }
    let mut f = Table::new("filter");
    f.declare(NODEPORT_NON_LOCAL);
    filter.into_iter().for_each(|r| f.append(r));
    let mut nat = Table::new("nat");
    for c in [PORTALS_CONTAINER, PORTALS_HOST, NODEPORT_CONTAINER, NODEPORT_HOST] {
        nat.declare(c);
    }
    container.into_iter().chain(host).chain(np_container).chain(np_host).for_each(|r| nat.append(r));
    Ruleset { tables: vec![f, nat] }
}

/// Round-robin over a service port's endpoints with optional ClientIP affinity (kube-proxy's
/// `LoadBalancerRR`): the list is shuffled whenever it changes, then walked in order.
#[derive(Debug, Default)]
pub struct Balancer {
    endpoints: Vec<SocketAddr>,
    next: usize,
    affinity: Option<Duration>,
    sticky: HashMap<IpAddr, (SocketAddr, Instant)>,
}

impl Balancer {
    /// Sets the endpoints (in any order) and the affinity timeout; affinities to endpoints that
    /// are gone are dropped.
    pub fn update(&mut self, mut endpoints: Vec<SocketAddr>, affinity: Option<Duration>) {
        endpoints.sort();
        let mut current = self.endpoints.clone();
        current.sort();
        if current != endpoints {
            fastrand::shuffle(&mut endpoints);
            self.endpoints = endpoints;
            self.next = 0;
        }
        if affinity != self.affinity {
            self.sticky.clear();
            self.affinity = affinity;
        }
        let live = &self.endpoints;
        self.sticky.retain(|_, (ep, _)| live.contains(ep));
    }

    pub fn endpoints(&self) -> &[SocketAddr] {
        &self.endpoints
    }

    /// The endpoint for a new connection from `client`. `retry`: the previous pick failed to
    /// connect, so the client's affinity is reset and the next endpoint is taken.
    pub fn pick(&mut self, client: IpAddr, retry: bool, now: Instant) -> Option<SocketAddr> {
        if self.endpoints.is_empty() {
            return None;
        }
        if let Some(ttl) = self.affinity {
            if !retry {
                if let Some((ep, used)) = self.sticky.get_mut(&client) {
                    if now.duration_since(*used) < ttl {
                        *used = now;
                        return Some(*ep);
                    }
                }
            }
        }
        let ep = self.endpoints[self.next % self.endpoints.len()];
        self.next = (self.next + 1) % self.endpoints.len();
        if self.affinity.is_some() {
            self.sticky.insert(client, (ep, now));
        }
        Some(ep)
    }

    /// Drops affinities older than the timeout (each sync).
    pub fn expire(&mut self, now: Instant) {
        if let Some(ttl) = self.affinity {
            self.sticky.retain(|_, (_, used)| now.duration_since(*used) < ttl);
        }
    }
}

/// Connects to an endpoint for `client`, trying up to four with growing timeouts; the
/// connection keeps the client's TOS (see `podpath_client::relay`).
async fn dial(balancer: &Mutex<Balancer>, client: IpAddr, tos: u32, spn: &ServicePortName) -> Option<TcpStream> {
    for (i, timeout) in DIAL_TIMEOUTS.iter().enumerate() {
        let ep = balancer.lock().expect("balancer").pick(client, i > 0, Instant::now())?;
        match tokio::time::timeout(*timeout, podpath_client::relay::connect_with_tos(ep, tos)).await {
            Ok(Ok(s)) => return Some(s),
            Ok(Err(e)) => {
                tracing::info!(service = %spn, endpoint = %ep, "connect failed ({e}); trying the next endpoint")
            }
            Err(_) => tracing::info!(
                service = %spn,
                endpoint = %ep,
                "connect timed out after {} ms; trying the next endpoint",
                timeout.as_millis()
            ),
        }
    }
    None
}

async fn serve_tcp(listener: TcpListener, balancer: Arc<Mutex<Balancer>>, spn: ServicePortName) {
    loop {
        let Ok((mut inbound, client)) = listener.accept().await else { continue };
        let balancer = balancer.clone();
        let spn = spn.clone();
        tokio::spawn(async move {
            let tos = podpath_client::relay::inbound_tos(&inbound);
            let Some(mut outbound) = dial(&balancer, client.ip(), tos, &spn).await else {
                tracing::warn!(service = %spn, %client, "no endpoint accepted the connection; closing it");
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
        });
    }
}

/// UDP: one connected socket per client toward its endpoint, replies sent back from the proxy
/// socket, forgotten after [`UDP_IDLE_TIMEOUT`] without traffic (kube-proxy's `ClientCache`).
async fn serve_udp(socket: UdpSocket, balancer: Arc<Mutex<Balancer>>, spn: ServicePortName) {
    let socket = Arc::new(socket);
    let clients: Arc<Mutex<HashMap<SocketAddr, Arc<UdpSocket>>>> = Default::default();
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, client)) = socket.recv_from(&mut buf).await else { continue };
        let existing = clients.lock().expect("clients").get(&client).cloned();
        let upstream = match existing {
            Some(u) => u,
            None => {
                let Some(ep) = balancer.lock().expect("balancer").pick(client.ip(), false, Instant::now()) else {
                    continue;
                };
                let any: SocketAddr =
                    if ep.is_ipv4() { (Ipv4Addr::UNSPECIFIED, 0).into() } else { "[::]:0".parse().expect("addr") };
                let Ok(u) = UdpSocket::bind(any).await else { continue };
                if u.connect(ep).await.is_err() {
                    continue;
                }
                let u = Arc::new(u);
                clients.lock().expect("clients").insert(client, u.clone());
                let (socket, clients, u2, spn) = (socket.clone(), clients.clone(), u.clone(), spn.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(Ok(n)) = tokio::time::timeout(UDP_IDLE_TIMEOUT, u2.recv(&mut buf)).await {
                        if socket.send_to(&buf[..n], client).await.is_err() {
                            break;
                        }
                    }
                    tracing::debug!(service = %spn, %client, "UDP client idle; forgotten");
                    clients.lock().expect("clients").remove(&client);
                });
                u
            }
        };
        let _ = upstream.send(&buf[..n]).await;
    }
}

/// One service port's proxy socket and its serving task.
struct ProxySocket {
    proxy_port: u16,
    balancer: Arc<Mutex<Balancer>>,
    task: JoinHandle<()>,
}

impl Drop for ProxySocket {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A socket on every address of one family: `0.0.0.0`, or `[::]` IPv6-only (the IPv4 proxier
/// of a dual-stack node holds the same port numbers).
fn bind_any(v6: bool, port: u16, udp: bool) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let (domain, addr): (Domain, SocketAddr) = if v6 {
        (Domain::IPV6, (std::net::Ipv6Addr::UNSPECIFIED, port).into())
    } else {
        (Domain::IPV4, (Ipv4Addr::UNSPECIFIED, port).into())
    };
    let s = if udp {
        Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?
    } else {
        Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?
    };
    if v6 {
        s.set_only_v6(true)?;
    }
    if !udp {
        s.set_reuse_address(true)?;
    }
    s.bind(&addr.into())?;
    if !udp {
        s.listen(1024)?;
    }
    s.set_nonblocking(true)?;
    Ok(s)
}

async fn open_socket(sp: &ServicePort, v6: bool) -> std::io::Result<ProxySocket> {
    let balancer: Arc<Mutex<Balancer>> = Default::default();
    let (proxy_port, task) = match sp.protocol.as_str() {
        "udp" => {
            let s = UdpSocket::from_std(bind_any(v6, 0, true)?.into())?;
            (s.local_addr()?.port(), tokio::spawn(serve_udp(s, balancer.clone(), sp.spn().clone())))
        }
        _ => {
            let l = TcpListener::from_std(bind_any(v6, 0, false)?.into())?;
            (l.local_addr()?.port(), tokio::spawn(serve_tcp(l, balancer.clone(), sp.spn().clone())))
        }
    };
    Ok(ProxySocket { proxy_port, balancer, task })
}

/// The endpoints a userspace proxy uses: the ready ones (or, when none is ready, the serving
/// terminating ones). Traffic policies came after this mode; it ignores them, as it did.
fn endpoint_addrs(st: &ServiceState, node: &str) -> Vec<SocketAddr> {
    let (cluster, _) = categorize(&st.endpoints, node);
    cluster.iter().map(|e| SocketAddr::new(e.ip, e.port)).collect()
}

/// The userspace proxier's settings and inputs.
pub struct UserspaceProxier<K> {
    pub kernel: Arc<K>,
    pub node_name: String,
    pub node_ip: IpAddr,
    pub services: Arc<Store<ServiceView>>,
    pub slices: Arc<Store<SliceView>>,
    pub health: Arc<Health>,
    /// Full resync period (rules rewritten, jumps and canary checked).
    pub period: Duration,
}

/// Runs the userspace proxier until the stores' watches end; `synced` fires after the first
/// successful sync.
pub async fn run(p: UserspaceProxier<impl Kernel>, synced: Option<tokio::sync::oneshot::Sender<()>>) {
    let UserspaceProxier { kernel, node_name, node_ip, services, slices, health, period } = p;
    services.wait_synced().await;
    slices.wait_synced().await;
    let mut synced = synced;
    let mut sockets: BTreeMap<ServiceKey, ProxySocket> = BTreeMap::new();
    // NodePort → (owning service port, the held socket).
    let mut held: BTreeMap<(u16, String), (ServiceKey, HeldPort)> = BTreeMap::new();
    let mut svc_changes = services.changes();
    let mut slice_changes = slices.changes();
    let mut first = true;
    loop {
        super::stall::hold().await;
        let state = snapshot(&services.list(), &slices.list(), &node_name);
        let mut portals = vec![];
        let mut wanted_keys = std::collections::BTreeSet::new();
        let mut wanted_slots = std::collections::BTreeSet::new();
        for st in state.iter().filter(|st| matches!(st.port.protocol.as_str(), "tcp" | "udp")) {
            let key = st.port.key();
            wanted_keys.insert(key.clone());
            if !sockets.contains_key(&key) {
                match open_socket(&st.port, node_ip.is_ipv6()).await {
                    Ok(s) => {
                        tracing::info!(service = %st.port.spn(), protocol = %st.port.protocol, proxy_port = s.proxy_port, "proxy socket opened");
                        sockets.insert(key.clone(), s);
                    }
                    Err(e) => {
                        tracing::warn!(service = %st.port.spn(), "cannot open a proxy socket: {e}");
                        continue;
                    }
                }
            }
            let socket = &sockets[&key];
            let affinity = st.port.affinity_seconds.map(|s| Duration::from_secs(s.max(1) as u64));
            {
                let mut b = socket.balancer.lock().expect("balancer");
                b.update(endpoint_addrs(st, &node_name), affinity);
                b.expire(Instant::now());
            }
            let mut node_port_held = false;
            if let Some(np) = st.port.node_port {
                let slot = (np, st.port.protocol.clone());
                wanted_slots.insert((slot.clone(), key.clone()));
                match held.get(&slot) {
                    Some((owner, _)) if *owner == key => node_port_held = true,
                    Some((owner, _)) => {
                        tracing::warn!(service = %st.port.spn(), "NodePort {np} is already held for {owner}")
                    }
                    None => match HeldPort::claim(np, &st.port.protocol, node_ip.is_ipv6()) {
                        Ok(h) => {
                            held.insert(slot, (key.clone(), h));
                            node_port_held = true;
                        }
                        Err(e) => tracing::warn!(
                            service = %st.port.spn(),
                            "cannot hold NodePort {np} ({e}); its rules are left out until it is free"
                        ),
                    },
                }
            }
            portals.push(Portal { port: st.port.clone(), proxy_port: socket.proxy_port, node_port_held });
        }
        sockets.retain(|k, s| {
            let keep = wanted_keys.contains(k);
            if !keep {
                tracing::info!(service = %k, proxy_port = s.proxy_port, "proxy socket closed");
            }
            keep
        });
        // A NodePort is released when its Service goes, changes port, or stops being a NodePort.
        held.retain(|slot, (owner, _)| wanted_slots.contains(&(slot.clone(), owner.clone())));

        let mut rs = render(node_ip, &portals);
        let kernel2 = kernel.clone();
        let ensure = first;
        let started = std::time::Instant::now();
        let result = tokio::task::spawn_blocking(move || -> Result<()> {
            let k = &*kernel2;
            let canary_gone = !k.save("nat", Some(CANARY))?.declares(CANARY);
            if ensure {
                // Switching from the iptables mode: its rules would take the traffic first.
                super::sync::cleanup(k)?;
            }
            if ensure || canary_gone {
                add_jumps(k, &mut rs)?;
            }
            for batch in plan::batches(&rs, k.batch_lines()) {
                k.restore(&batch)?;
            }
            Ok(())
        })
        .await
        .unwrap_or_else(|e| Err(ProxyError::Task(format!("sync task failed: {e}"))));
        match result {
            Ok(()) => {
                health.updated();
                health.metrics.synced(first, started.elapsed());
                first = false;
                if let Some(tx) = synced.take() {
                    let _ = tx.send(());
                }
            }
            Err(e) => {
                tracing::warn!("userspace proxy rules sync failed (retrying): {e}");
                health.metrics.sync_error("iptables");
            }
        }
        tokio::select! {
            r = svc_changes.changed() => { if r.is_err() { return; } health.queued(); }
            r = slice_changes.changed() => { if r.is_err() { return; } health.queued(); }
            _ = tokio::time::sleep(if first { Duration::from_secs(1) } else { period }) => {}
        }
    }
}

/// A NodePort held open on every address (kube-proxy's `claimNodePort`): nothing else on the
/// node can bind it, and `ss -ltn` shows who owns it.
pub enum HeldPort {
    Tcp(std::net::TcpListener),
    Udp(std::net::UdpSocket),
}

impl HeldPort {
    /// Holds `port` on every address of the family (`v6`: IPv6 only).
    pub fn claim(port: u16, protocol: &str, v6: bool) -> std::io::Result<HeldPort> {
        Ok(match protocol {
            "udp" => HeldPort::Udp(bind_any(v6, port, true)?.into()),
            _ => HeldPort::Tcp(bind_any(v6, port, false)?.into()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// ClusterIP only; a LoadBalancer with an external IP and a held NodePort; a UDP NodePort
    /// whose port another service holds (no NodePort rules).
    fn portals() -> Vec<Portal> {
        let web = ServicePort {
            cluster_ip: Some("10.96.0.41".parse().unwrap()),
            ..ServicePort::new("ns1", "web", "", "tcp", 80)
        };
        let lb = ServicePort {
            cluster_ip: Some("10.96.0.42".parse().unwrap()),
            node_port: Some(30080),
            external_ips: vec!["169.10.10.1".parse().unwrap()],
            load_balancer_ips: vec!["198.51.100.7".parse().unwrap()],
            ..ServicePort::new("ns2", "contour", "http", "tcp", 80)
        };
        let dns = ServicePort {
            cluster_ip: Some("10.96.0.10".parse().unwrap()),
            node_port: Some(30053),
            ..ServicePort::new("kube-system", "dns", "dns", "udp", 53)
        };
        vec![
            Portal { port: web, proxy_port: 40001, node_port_held: false },
            Portal { port: lb, proxy_port: 40002, node_port_held: true },
            Portal { port: dns, proxy_port: 40003, node_port_held: false },
        ]
    }

    #[test]
    fn whole_userspace_ruleset_golden() {
        let rs = render("192.168.56.11".parse().unwrap(), &portals());
        let out = rs.to_string();
        let golden = include_str!("testdata/userspace.rules");
        if out != golden {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/proxy/testdata/userspace.rules.new");
            std::fs::write(path, &out).unwrap();
            panic!("the ruleset differs from testdata/userspace.rules; the new one is in {path}");
        }
        let chains = [PORTALS_CONTAINER, PORTALS_HOST, NODEPORT_CONTAINER, NODEPORT_HOST, NODEPORT_NON_LOCAL];
        assert_eq!(podpath_ruleset::lint::lint(&rs, &chains), Vec::<String>::new());
    }

    #[test]
    fn round_robin_visits_every_endpoint_in_turn() {
        let mut b = Balancer::default();
        let eps = vec![addr("10.244.1.2:80"), addr("10.244.2.2:80"), addr("10.244.3.2:80")];
        b.update(eps.clone(), None);
        let now = Instant::now();
        let client: IpAddr = "203.0.113.10".parse().unwrap();
        let picks: Vec<SocketAddr> = (0..6).map(|_| b.pick(client, false, now).unwrap()).collect();
        let mut first_round = picks[..3].to_vec();
        first_round.sort();
        assert_eq!(first_round, eps);
        assert_eq!(picks[..3], picks[3..], "the same order each round");
        // The same set in another order is no change (no reshuffle, the turn goes on).
        b.update(eps.iter().rev().cloned().collect(), None);
        assert_eq!(b.pick(client, false, now), Some(picks[0]));
        b.update(vec![], None);
        assert_eq!(b.pick(client, false, now), None);
    }

    #[test]
    fn client_ip_affinity_sticks_until_timeout_retry_or_endpoint_removal() {
        let mut b = Balancer::default();
        let eps = vec![addr("10.244.1.2:80"), addr("10.244.2.2:80")];
        b.update(eps.clone(), Some(Duration::from_secs(10)));
        let t0 = Instant::now();
        let a: IpAddr = "203.0.113.10".parse().unwrap();
        let other: IpAddr = "203.0.113.11".parse().unwrap();
        let first = b.pick(a, false, t0).unwrap();
        // A failed connect moves the client on to the next endpoint in turn.
        let moved = b.pick(a, true, t0).unwrap();
        assert_ne!(moved, first);
        for i in 0..5 {
            assert_eq!(b.pick(a, false, t0 + Duration::from_secs(i)), Some(moved));
            b.pick(other, false, t0);
        }
        // Idle past the timeout: a fresh round-robin pick (and expire() forgets it).
        b.expire(t0 + Duration::from_secs(60));
        assert!(b.sticky.is_empty());
        // The endpoint goes away: the affinity goes with it.
        let sticky = b.pick(a, false, t0).unwrap();
        b.update(eps.iter().filter(|e| **e != sticky).cloned().collect(), Some(Duration::from_secs(10)));
        assert_ne!(b.pick(a, false, t0), Some(sticky));
    }
}
