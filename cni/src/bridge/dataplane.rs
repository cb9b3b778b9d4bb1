//! The bridge plugin's side effects, behind [`Dataplane`]: links and addresses through
//! rtnetlink (container-side work in a thread that entered the container's netns with
//! netns-rs), NAT through one `iptables-restore --noflush`, sysctls through /proc.
//! Everything here runs in the network namespace the plugin was started in (the node's) and in
//! `CNI_NETNS`; nothing else is touched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::Path;

use futures::TryStreamExt;
use ipnet::IpNet;
use podpath_ruleset::{Addr, Backend, Command as RuleCommand, Family, Iptables, Match, Rule, Ruleset, Table};
use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::RouteProtocol;
use rtnetlink::{Handle, LinkBridge, LinkBridgePort, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::error::{code, CniError, Result};
use crate::types::{IpConfig, Route};

/// How a container's port on the bridge behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortFlags {
    /// Frames may leave through the port they came in by (`hairpinMode`).
    pub hairpin: bool,
    /// The port reaches the bridge itself only, never another isolated port.
    pub isolated: bool,
}

/// A link as the result reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    pub mac: String,
}

/// Everything the bridge plugin does to the kernel.
pub trait Dataplane {
    /// Creates the bridge if missing, sets it up (and promiscuous when asked).
    fn ensure_bridge(&mut self, name: &str, mtu: Option<u32>, promisc: bool) -> Result<Link>;
    /// Whether `ifname` exists in the container's netns.
    fn container_link(&mut self, netns: &Path, ifname: &str) -> Result<Option<Link>>;
    /// Creates the veth pair: `host` enslaved to the bridge, the peer as `ifname` in `netns`.
    fn create_veth(
        &mut self,
        host: &str,
        netns: &Path,
        ifname: &str,
        mtu: Option<u32>,
        bridge: &Link,
        port: PortFlags,
    ) -> Result<(Link, Link)>;
    /// Makes the host route between the bridge's isolated ports: proxy ARP back out of the
    /// same interface (`proxy_arp_pvlan`) at once (`proxy_delay` 0), no ICMP redirects (the
    /// containers must keep sending to the gateway), and no br_netfilter shortcut that would
    /// switch DNATed packets between ports.
    fn route_between_ports(&mut self, bridge: &str) -> Result<()>;
    /// Addresses and routes on the container interface (a route without `gw` uses the gateway
    /// of the address of its family). IPv6 addresses skip duplicate address detection (the
    /// reference bridge's default, `enableDad: false`). With `isolated` (ports that may not
    /// reach each other), an IPv6 address gets no on-link prefix route, only its gateway is
    /// on-link: IPv6 has no `proxy_arp_pvlan`, so pods of the bridge reach each other through
    /// the gateway as IPv4 ones do.
    fn configure_container(
        &mut self,
        netns: &Path,
        ifname: &str,
        ips: &[IpConfig],
        routes: &[Route],
        isolated: bool,
    ) -> Result<()>;
    /// Puts a gateway address on the bridge (already present is fine).
    fn add_bridge_address(&mut self, bridge: &Link, addr: IpNet) -> Result<()>;
    fn enable_ip_forward(&mut self, v6: bool) -> Result<()>;
    /// Masquerades traffic from `ips` leaving `subnets`, in chain `chain`.
    fn setup_masq(&mut self, chain: &str, comment: &str, ips: &[IpConfig]) -> Result<()>;
    /// Removes the chain and the POSTROUTING jumps to it; missing is fine. `known` are the
    /// attachment's addresses when the caller has them (prevResult): then one restore that
    /// deletes exactly those rules is tried first.
    fn teardown_masq(&mut self, chain: &str, comment: &str, known: &[IpConfig]) -> Result<()>;
    /// Container ids of the NAT chains of network `network` (from the rules' comments).
    fn masq_attachments(&mut self, network: &str) -> Result<Vec<String>>;
    /// The addresses on `ifname` in the container's netns.
    fn container_addresses(&mut self, netns: &Path, ifname: &str) -> Result<Vec<IpNet>>;
    /// The routes in the container's netns (main table): (destination, gateway).
    fn container_routes(&mut self, netns: &Path) -> Result<Vec<(IpNet, Option<IpAddr>)>>;
    /// Deletes a link in the plugin's netns; missing is fine.
    fn delete_host_link(&mut self, name: &str) -> Result<()>;
    /// Deletes a link in the container's netns; a missing link or netns is fine.
    fn delete_container_link(&mut self, netns: &Path, ifname: &str) -> Result<()>;
}

fn internal(what: impl Into<String>, e: impl std::fmt::Display) -> CniError {
    CniError::new(code::INTERNAL, what).with_details(e.to_string())
}

/// The kernel's errno inside a netlink error, if any.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

const ENODEV: i32 = 19;
const EEXIST: i32 = 17;
const ENOENT: i32 = 2;

fn mac_of(msg: &LinkMessage) -> String {
    msg.attributes
        .iter()
        .find_map(|a| match a {
            LinkAttribute::Address(b) => Some(b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":")),
            _ => None,
        })
        .unwrap_or_default()
}

async fn get_link(handle: &Handle, name: &str) -> Result<Option<Link>> {
    let mut s = handle.link().get().match_name(name.to_string()).execute();
    match s.try_next().await {
        Ok(Some(m)) => Ok(Some(Link { index: m.header.index, name: name.to_string(), mac: mac_of(&m) })),
        Ok(None) => Ok(None),
        Err(e) if errno(&e) == Some(ENODEV) => Ok(None),
        Err(e) => Err(internal(format!("cannot look up link {name}"), e)),
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| internal("cannot start a runtime", e))
}

/// Runs `f` with a netlink handle inside the netns at `path` (in a thread of its own, so the
/// plugin's own thread never changes namespace).
fn in_netns<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce(Handle) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<T>>>> + Send + 'static,
) -> Result<T> {
    let ns =
        netns_rs::get_from_path(path).map_err(|e| internal(format!("failed to open netns {}", path.display()), e))?;
    std::thread::scope(|s| {
        s.spawn(move || -> Result<T> {
            ns.enter().map_err(|e| internal("failed to enter the container netns", e))?;
            let rt = runtime()?;
            rt.block_on(async move {
                let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| internal("cannot open netlink", e))?;
                tokio::spawn(conn);
                f(handle).await
            })
        })
        .join()
        .unwrap_or_else(|_| Err(CniError::new(code::INTERNAL, "the netns worker panicked")))
    })
}

/// A stable, locally administered unicast MAC for a bridge, derived from its name.
pub fn bridge_mac(name: &str) -> Vec<u8> {
    use sha2::Digest;
    let d = sha2::Sha512::digest(format!("podpath-bridge/{name}").as_bytes());
    vec![0x02, d[0], d[1], d[2], d[3], d[4]]
}

/// The real dataplane.
pub struct Netlink {
    rt: tokio::runtime::Runtime,
    handle: Handle,
}

impl Netlink {
    pub fn new() -> Result<Netlink> {
        let rt = runtime()?;
        let handle = rt.block_on(async {
            let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| internal("cannot open netlink", e))?;
            tokio::spawn(conn);
            Ok::<_, CniError>(handle)
        })?;
        Ok(Netlink { rt, handle })
    }
}

/// Routes carry the kernel's default protocol (`boot`), as the reference plugin's do.
fn route_message(dst: IpNet, gw: Option<IpAddr>, oif: u32) -> Result<rtnetlink::packet_route::route::RouteMessage> {
    fn bad(dst: IpNet, gw: Option<IpAddr>) -> impl Fn(&dyn std::fmt::Debug) -> CniError {
        move |e| CniError::new(code::INVALID_CONFIG, format!("invalid route {dst} via {gw:?}: {e:?}"))
    }
    let mut b = RouteMessageBuilder::<IpAddr>::new()
        .destination_prefix(dst.addr(), dst.prefix_len())
        .map_err(|e| bad(dst, gw)(&e))?
        .output_interface(oif)
        .protocol(RouteProtocol::Boot);
    if let Some(g) = gw {
        b = b.gateway(g).map_err(|e| bad(dst, gw)(&e))?;
    }
    Ok(b.build())
}

impl Dataplane for Netlink {
    fn ensure_bridge(&mut self, name: &str, mtu: Option<u32>, promisc: bool) -> Result<Link> {
        let h = self.handle.clone();
        let name = name.to_string();
        self.rt.block_on(async move {
            if get_link(&h, &name).await?.is_none() {
                // A pinned MAC: a bridge otherwise takes its lowest port's MAC (all zeros with
                // none), so it would change as containers come and go.
                let mut b = LinkBridge::new(&name).address(bridge_mac(&name));
                if let Some(m) = mtu {
                    b = b.mtu(m);
                }
                match h.link().add(b.build()).execute().await {
                    Ok(()) => {}
                    // Another ADD created it at the same time.
                    Err(e) if errno(&e) == Some(EEXIST) => {}
                    Err(e) => return Err(internal(format!("cannot create bridge {name}"), e)),
                }
            }
            let link = get_link(&h, &name)
                .await?
                .ok_or_else(|| CniError::new(code::INTERNAL, format!("bridge {name} vanished")))?;
            let msg = LinkUnspec::new_with_index(link.index).up().promiscuous(promisc).build();
            h.link().set(msg).execute().await.map_err(|e| internal(format!("cannot set bridge {name} up"), e))?;
            Ok(link)
        })
    }

    fn container_link(&mut self, netns: &Path, ifname: &str) -> Result<Option<Link>> {
        let ifname = ifname.to_string();
        in_netns(netns, move |h| Box::pin(async move { get_link(&h, &ifname).await }))
    }

    fn create_veth(
        &mut self,
        host: &str,
        netns: &Path,
        ifname: &str,
        mtu: Option<u32>,
        bridge: &Link,
        port: PortFlags,
    ) -> Result<(Link, Link)> {
        let ns_file =
            std::fs::File::open(netns).map_err(|e| internal(format!("failed to open netns {}", netns.display()), e))?;
        // The peer is created inside the container's netns under its final name: no move
        // between namespaces (each costs an RCU grace period, ~25 ms) and no rename. Its name
        // is checked there, so an eth0 of the node's own does not collide.
        let h = self.handle.clone();
        let (host_name, bridge_index, ifname_owned) = (host.to_string(), bridge.index, ifname.to_string());
        let fd = ns_file.as_raw_fd();
        let host_link = self.rt.block_on(async move {
            let mut peer = LinkUnspec::new_with_name(&ifname_owned).setns_by_fd(fd);
            let mut b = LinkVeth::new(&host_name, &ifname_owned);
            if let Some(m) = mtu {
                peer = peer.mtu(m);
                b = b.mtu(m);
            }
            let msg = b.set_info_data(InfoData::Veth(InfoVeth::Peer(peer.build()))).build();
            h.link().add(msg).execute().await.map_err(|e| internal(format!("cannot create veth {host_name}"), e))?;
            let link = get_link(&h, &host_name)
                .await?
                .ok_or_else(|| CniError::new(code::INTERNAL, "the host veth vanished"))?;
            h.link()
                .set(LinkUnspec::new_with_index(link.index).controller(bridge_index).up().build())
                .execute()
                .await
                .map_err(|e| internal(format!("cannot attach {host_name} to the bridge"), e))?;
            h.link()
                .set_port(LinkBridgePort::new(link.index).hairpin(port.hairpin).isolated(port.isolated).build())
                .execute()
                .await
                .map_err(|e| internal(format!("cannot set the bridge port flags of {host_name}"), e))?;
            Ok::<_, CniError>(link)
        })?;
        let ifname_owned = ifname.to_string();
        let container = in_netns(netns, move |h| {
            Box::pin(async move {
                if let Some(lo) = get_link(&h, "lo").await? {
                    h.link()
                        .set(LinkUnspec::new_with_index(lo.index).up().build())
                        .execute()
                        .await
                        .map_err(|e| internal("cannot set lo up", e))?;
                }
                let link = get_link(&h, &ifname_owned).await?.ok_or_else(|| {
                    CniError::new(code::INTERNAL, format!("{ifname_owned} is not in the container netns"))
                })?;
                h.link()
                    .set(LinkUnspec::new_with_index(link.index).up().build())
                    .execute()
                    .await
                    .map_err(|e| internal(format!("cannot set {ifname_owned} up"), e))?;
                Ok(link)
            })
        })?;
        drop(ns_file);
        Ok((host_link, container))
    }

    fn configure_container(
        &mut self,
        netns: &Path,
        ifname: &str,
        ips: &[IpConfig],
        routes: &[Route],
        isolated: bool,
    ) -> Result<()> {
        use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
        let (ifname, ips, routes) = (ifname.to_string(), ips.to_vec(), routes.to_vec());
        in_netns(netns, move |h| {
            Box::pin(async move {
                let link = get_link(&h, &ifname)
                    .await?
                    .ok_or_else(|| CniError::new(code::INTERNAL, format!("{ifname} is missing")))?;
                for ip in &ips {
                    let mut req = h.address().add(link.index, ip.address.addr(), ip.address.prefix_len());
                    if ip.address.addr().is_ipv6() {
                        let mut flags = AddressFlags::Nodad;
                        if isolated && ip.gateway.is_some() {
                            flags |= AddressFlags::Noprefixroute;
                        }
                        req.message_mut().attributes.push(AddressAttribute::Flags(flags));
                    }
                    req.execute()
                        .await
                        .map_err(|e| internal(format!("cannot add address {} to {ifname}", ip.address), e))?;
                    if let (true, true, Some(gw)) = (isolated, ip.address.addr().is_ipv6(), ip.gateway) {
                        let on_link = IpNet::new(gw, 128).expect("128 fits an IPv6 address");
                        h.route()
                            .add(route_message(on_link, None, link.index)?)
                            .execute()
                            .await
                            .map_err(|e| internal(format!("cannot add the on-link route to {gw}"), e))?;
                    }
                }
                for r in &routes {
                    let gw = r.effective_gw(&ips);
                    h.route()
                        .add(route_message(r.dst, gw, link.index)?)
                        .execute()
                        .await
                        .map_err(|e| internal(format!("cannot add route {} via {gw:?}", r.dst), e))?;
                }
                Ok(())
            })
        })
    }

    fn add_bridge_address(&mut self, bridge: &Link, addr: IpNet) -> Result<()> {
        let h = self.handle.clone();
        let index = bridge.index;
        self.rt.block_on(async move {
            use rtnetlink::packet_route::address::{AddressAttribute, AddressFlags};
            let mut req = h.address().add(index, addr.addr(), addr.prefix_len());
            if addr.addr().is_ipv6() {
                // Usable at once: a tentative gateway address would drop the first packets.
                req.message_mut().attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            match req.execute().await {
                Ok(()) => Ok(()),
                Err(e) if errno(&e) == Some(EEXIST) => Ok(()),
                Err(e) => Err(internal(format!("cannot add gateway address {addr} to the bridge"), e)),
            }
        })
    }

    fn enable_ip_forward(&mut self, v6: bool) -> Result<()> {
        let path = if v6 { "/proc/sys/net/ipv6/conf/all/forwarding" } else { "/proc/sys/net/ipv4/ip_forward" };
        std::fs::write(path, "1").map_err(|e| internal(format!("cannot write {path}"), e))
    }

    fn route_between_ports(&mut self, bridge: &str) -> Result<()> {
        // Redirects are sent when either `all` or the interface asks for them.
        for (path, value) in [
            (format!("/proc/sys/net/ipv4/conf/{bridge}/proxy_arp_pvlan"), "1"),
            (format!("/proc/sys/net/ipv4/neigh/{bridge}/proxy_delay"), "0"),
            (format!("/proc/sys/net/ipv4/conf/{bridge}/send_redirects"), "0"),
            ("/proc/sys/net/ipv4/conf/all/send_redirects".to_string(), "0"),
        ] {
            if std::fs::read_to_string(&path).is_ok_and(|v| v.trim() == value) {
                continue;
            }
            std::fs::write(&path, value).map_err(|e| internal(format!("cannot write {path}"), e))?;
        }
        // Where br_netfilter is loaded (a host-wide module; these switches are per namespace),
        // a packet DNATed to a container of the same bridge is switched, not routed ("bridged
        // DNAT"), and isolated ports drop it: a Service's ClusterIP would not reach a pod on
        // the caller's own node. Routed, it meets the same hooks at layer 3.
        for family in ["iptables", "ip6tables", "arptables"] {
            let path = format!("/proc/sys/net/bridge/bridge-nf-call-{family}");
            match std::fs::read_to_string(&path) {
                Ok(v) if v.trim() != "0" => {
                    std::fs::write(&path, "0").map_err(|e| internal(format!("cannot write {path}"), e))?
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn setup_masq(&mut self, chain: &str, comment: &str, ips: &[IpConfig]) -> Result<()> {
        for family in [Family::V4, Family::V6] {
            let mut nat = Table::new("nat");
            for ip in ips.iter().filter(|ip| family_of(ip.address.addr()) == family) {
                let multicast: IpNet = match family {
                    Family::V4 => "224.0.0.0/4".parse().expect("valid"),
                    Family::V6 => "ff00::/8".parse().expect("valid"),
                };
                nat.append(Rule::new(chain).dst(Addr::Net(ip.address.trunc())).comment(comment).jump("ACCEPT"));
                nat.append(
                    Rule::new(chain)
                        .with(Match::Destination { addr: Addr::Net(multicast), negated: true })
                        .comment(comment)
                        .jump("MASQUERADE"),
                );
                nat.append(Rule::new("POSTROUTING").src(host_net(ip.address.addr())).comment(comment).jump(chain));
            }
            if !nat.commands.is_empty() {
                nat.declare(chain);
                iptables(family).restore(&Ruleset { tables: vec![nat] }).map_err(restore_failed)?;
            }
        }
        Ok(())
    }

    fn teardown_masq(&mut self, chain: &str, comment: &str, known: &[IpConfig]) -> Result<()> {
        // The jumps, then the chain, in one restore.
        let removal = |jumps: Vec<Rule>| {
            let mut nat = Table::new("nat");
            nat.commands.extend(jumps.into_iter().map(RuleCommand::Delete));
            nat.commands.push(RuleCommand::Flush(chain.to_string()));
            nat.commands.push(RuleCommand::DeleteChain(chain.to_string()));
            Ruleset { tables: vec![nat] }
        };
        if !known.is_empty() {
            let fast = [Family::V4, Family::V6].into_iter().all(|family| {
                let jumps: Vec<Rule> = known
                    .iter()
                    .filter(|ip| family_of(ip.address.addr()) == family)
                    .map(|ip| Rule::new("POSTROUTING").src(host_net(ip.address.addr())).comment(comment).jump(chain))
                    .collect();
                jumps.is_empty() || iptables(family).restore(&removal(jumps)).is_ok()
            });
            if fast {
                return Ok(());
            }
        }
        // Without the addresses (or when the rules were not as recorded): find the jumps.
        for family in [Family::V4, Family::V6] {
            // No ip6tables (or no nat table for it): nothing of ours can be there.
            let Some(saved) = saved_nat(family) else { continue };
            if !saved.declares(chain) {
                continue;
            }
            let jumps = saved.chain_rules("POSTROUTING").filter(|r| r.jump_target() == Some(chain)).cloned().collect();
            iptables(family).restore(&removal(jumps)).map_err(restore_failed)?;
        }
        Ok(())
    }

    fn masq_attachments(&mut self, network: &str) -> Result<Vec<String>> {
        let prefix = format!("name: \"{network}\" id: \"");
        let mut ids = Vec::new();
        for family in [Family::V4, Family::V6] {
            let Some(saved) = saved_nat(family) else { continue };
            for r in saved.chain_rules("POSTROUTING") {
                let id = r.comment_text().and_then(|c| c.strip_prefix(&prefix)).and_then(|rest| rest.split('"').next());
                if let Some(id) = id.filter(|id| !ids.iter().any(|i| i == id)) {
                    ids.push(id.to_string());
                }
            }
        }
        Ok(ids)
    }

    fn container_addresses(&mut self, netns: &Path, ifname: &str) -> Result<Vec<IpNet>> {
        use rtnetlink::packet_route::address::AddressAttribute;
        let ifname = ifname.to_string();
        in_netns(netns, move |h| {
            Box::pin(async move {
                let Some(link) = get_link(&h, &ifname).await? else { return Ok(vec![]) };
                let mut s = h.address().get().set_link_index_filter(link.index).execute();
                let mut out = Vec::new();
                while let Some(m) =
                    s.try_next().await.map_err(|e| internal(format!("cannot list addresses of {ifname}"), e))?
                {
                    for a in &m.attributes {
                        if let AddressAttribute::Address(ip) = a {
                            if let Ok(net) = IpNet::new(*ip, m.header.prefix_len) {
                                out.push(net);
                            }
                        }
                    }
                }
                Ok(out)
            })
        })
    }

    fn container_routes(&mut self, netns: &Path) -> Result<Vec<(IpNet, Option<IpAddr>)>> {
        use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute};
        in_netns(netns, move |h| {
            Box::pin(async move {
                let mut out = Vec::new();
                for builder in
                    [RouteMessageBuilder::<Ipv4Addr>::new().build(), RouteMessageBuilder::<Ipv6Addr>::new().build()]
                {
                    let v4 = builder.header.address_family == rtnetlink::packet_route::AddressFamily::Inet;
                    let mut s = h.route().get(builder).execute();
                    while let Some(m) = s.try_next().await.map_err(|e| internal("cannot list routes", e))? {
                        let mut dst: IpAddr =
                            if v4 { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
                        let mut gw = None;
                        for a in &m.attributes {
                            match a {
                                RouteAttribute::Destination(RouteAddress::Inet(ip)) => dst = (*ip).into(),
                                RouteAttribute::Destination(RouteAddress::Inet6(ip)) => dst = (*ip).into(),
                                RouteAttribute::Gateway(RouteAddress::Inet(ip)) => gw = Some((*ip).into()),
                                RouteAttribute::Gateway(RouteAddress::Inet6(ip)) => gw = Some((*ip).into()),
                                _ => {}
                            }
                        }
                        if let Ok(net) = IpNet::new(dst, m.header.destination_prefix_length) {
                            out.push((net, gw));
                        }
                    }
                }
                Ok(out)
            })
        })
    }

    fn delete_host_link(&mut self, name: &str) -> Result<()> {
        let h = self.handle.clone();
        let name = name.to_string();
        self.rt.block_on(async move {
            let Some(link) = get_link(&h, &name).await? else { return Ok(()) };
            match h.link().del(link.index).execute().await {
                Ok(()) => Ok(()),
                Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ENOENT)) => Ok(()),
                Err(e) => Err(internal(format!("cannot delete {name}"), e)),
            }
        })
    }

    fn delete_container_link(&mut self, netns: &Path, ifname: &str) -> Result<()> {
        if !netns.exists() {
            return Ok(());
        }
        let ifname = ifname.to_string();
        let res = in_netns(netns, move |h| {
            Box::pin(async move {
                let Some(link) = get_link(&h, &ifname).await? else { return Ok(()) };
                match h.link().del(link.index).execute().await {
                    Ok(()) => Ok(()),
                    Err(e) if matches!(errno(&e), Some(ENODEV) | Some(ENOENT)) => Ok(()),
                    Err(e) => Err(internal(format!("cannot delete {ifname}"), e)),
                }
            })
        });
        match res {
            // A path that is not a netns (any more) has nothing of ours in it.
            Err(e) if e.msg.starts_with("failed to open netns") => Ok(()),
            other => other,
        }
    }
}

/// The system's iptables (or ip6tables), as the reference plugins use it.
fn iptables(family: Family) -> Iptables {
    Iptables { family, ..Iptables::new(Backend::System) }
}

/// The nat table of a family, as saved; None without that family's iptables.
fn saved_nat(family: Family) -> Option<Table> {
    iptables(family).save("nat").ok().and_then(|rs| rs.tables.into_iter().next())
}

fn family_of(ip: IpAddr) -> Family {
    if ip.is_ipv4() {
        Family::V4
    } else {
        Family::V6
    }
}

/// `10.244.1.2/32` (`…/128`): an address as its own network.
fn host_net(ip: IpAddr) -> Addr {
    Addr::Net(IpNet::from(ip))
}

/// A failed iptables-restore, with the input line it rejected.
fn restore_failed(e: podpath_ruleset::RulesetError) -> CniError {
    CniError::new(code::INTERNAL, "iptables-restore failed").with_details(e.to_string())
}
