//! The lab's topology as data (pure): namespaces, links, addresses, routes and sysctls, from the
//! address plan of docs/architecture.md. `apply` turns it into `ip` commands in one place.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::family::{self, IpFamilyMode};

/// One host of the lab (a network namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// What users type: `client`, `gateway`, `control-plane`, `node-1`, … (`underlay` is
    /// internal: the bridge).
    pub role: String,
    /// The namespace: `pp-<lab>-<role>`.
    pub netns: String,
}

/// A veth pair: `a_if` in `a`, `b_if` in `b` (names are per namespace, so short and fixed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub a: String,
    pub a_if: String,
    pub b: String,
    pub b_if: String,
    /// Enslave `a_if` to this bridge in `a`.
    pub a_bridge: Option<String>,
}

/// An address on an interface of a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    pub netns: String,
    pub dev: String,
    pub cidr: String,
}

/// A default route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultRoute {
    pub netns: String,
    pub via: IpAddr,
}

/// The whole topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub lab: String,
    /// The cluster's families (the lab's wiring is IPv4 in every mode).
    pub family: IpFamilyMode,
    pub hosts: Vec<Host>,
    pub links: Vec<Link>,
    pub addrs: Vec<Addr>,
    pub routes: Vec<DefaultRoute>,
    /// Namespaces that forward packets (gateway, nodes).
    pub forwarding: Vec<String>,
    pub nodes: Vec<NodeSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub name: String,
    pub netns: String,
    /// Its address on the IPv4 underlay (always there: the lab's wiring).
    pub ip: Ipv4Addr,
    /// Its IPv6 underlay address, in an IPv6 or dual-stack lab.
    pub ip6: Option<Ipv6Addr>,
}

impl NodeSpec {
    /// Its InternalIPs (`--node-ip`), primary family first.
    pub fn node_ips(&self, family: IpFamilyMode) -> String {
        family.node_ips(self.ip)
    }
}

pub const UNDERLAY_PREFIX: [u8; 3] = [192, 168, 56];
pub const GATEWAY_UNDERLAY: Ipv4Addr = Ipv4Addr::new(192, 168, 56, 2);
pub const CONTROL_PLANE: Ipv4Addr = Ipv4Addr::new(192, 168, 56, 10);
pub const GATEWAY_EXTERNAL: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
pub const API_PORT: u16 = 6443;
pub const GRPC_PORT: u16 = 6444;
/// Nodes get .11 … .(10+N): at most 200 keeps them below .211 and inside the /24.
pub const MAX_NODES: usize = 200;

/// The zone node-`i` (1-based) is in: the lab is a cloud region of three zones, the nodes
/// dealt over them in turn (`topology.kubernetes.io/zone`, which the scheduler spreads over).
pub fn zone_of(i: usize) -> String {
    format!("zone-{}", ['a', 'b', 'c'][(i.max(1) - 1) % 3])
}

/// The region every node of a lab is in (`topology.kubernetes.io/region`).
pub const REGION: &str = "lab";

/// `pp-<lab>-<role>`.
pub fn netns_name(lab: &str, role: &str) -> String {
    format!("pp-{lab}-{role}")
}

/// Where `node` (node-1 … node-N)'s agent serves /healthz and /metrics.
pub fn agent_health_addr(node: &str) -> Option<std::net::SocketAddr> {
    let i: usize = node.strip_prefix("node-")?.parse().ok()?;
    Some(std::net::SocketAddr::from((node_ip(i), AGENT_HEALTH_PORT)))
}

/// The agents' health and metrics port (kube-proxy's healthz port).
pub const AGENT_HEALTH_PORT: u16 = 10256;

pub fn node_ip(i: usize) -> Ipv4Addr {
    let [a, b, c] = UNDERLAY_PREFIX;
    Ipv4Addr::new(a, b, c, 10 + i as u8)
}

/// Lab names go into namespace names, state paths and chain-free identifiers: keep them short
/// and plain.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 20
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!("lab name {name:?}: use 1–20 lowercase letters, digits or '-'"))
    }
}

impl Plan {
    /// An IPv4 lab's plan.
    pub fn new(lab: &str, nodes: usize) -> Plan {
        Plan::with_family(lab, nodes, IpFamilyMode::Ipv4)
    }

    /// The plan of a lab of `family`: IPv6 addresses on every host beside the IPv4 ones when
    /// the cluster has IPv6 (`nodad`: a lab's addresses are unique by plan, and usable at once).
    pub fn with_family(lab: &str, nodes: usize, family: IpFamilyMode) -> Plan {
        let ns = |role: &str| netns_name(lab, role);
        let mut hosts = vec![];
        for role in ["underlay", "gateway", "client", "control-plane"] {
            hosts.push(Host { role: role.into(), netns: ns(role) });
        }
        let mut node_specs = vec![];
        for i in 1..=nodes {
            let name = format!("node-{i}");
            hosts.push(Host { role: name.clone(), netns: ns(&name) });
            let ip = node_ip(i);
            let ip6 = family.has_v6().then(|| family::underlay6(ip.octets()[3]));
            node_specs.push(NodeSpec { name: name.clone(), netns: ns(&name), ip, ip6 });
        }
        let ul = ns("underlay");
        let on_bridge = |port: &str, host: &str| Link {
            a: ul.clone(),
            a_if: port.into(),
            b: ns(host),
            b_if: "eth0".into(),
            a_bridge: Some("br0".into()),
        };
        let mut links = vec![on_bridge("gw", "gateway"), on_bridge("cp", "control-plane")];
        for n in &node_specs {
            links.push(on_bridge(&format!("n{}", &n.name[5..]), &n.name));
        }
        // The client's only link is to the gateway: it reaches nodes and LB IPs through it.
        links.push(Link {
            a: ns("gateway"),
            a_if: "eth1".into(),
            b: ns("client"),
            b_if: "eth0".into(),
            a_bridge: None,
        });
        let mut addrs = vec![
            Addr { netns: ns("gateway"), dev: "eth0".into(), cidr: format!("{GATEWAY_UNDERLAY}/24") },
            Addr { netns: ns("gateway"), dev: "eth1".into(), cidr: format!("{GATEWAY_EXTERNAL}/24") },
            Addr { netns: ns("client"), dev: "eth0".into(), cidr: format!("{CLIENT}/24") },
            Addr { netns: ns("control-plane"), dev: "eth0".into(), cidr: format!("{CONTROL_PLANE}/24") },
        ];
        let mut routes = vec![
            DefaultRoute { netns: ns("client"), via: GATEWAY_EXTERNAL.into() },
            DefaultRoute { netns: ns("control-plane"), via: GATEWAY_UNDERLAY.into() },
        ];
        for n in &node_specs {
            addrs.push(Addr { netns: n.netns.clone(), dev: "eth0".into(), cidr: format!("{}/24", n.ip) });
            routes.push(DefaultRoute { netns: n.netns.clone(), via: GATEWAY_UNDERLAY.into() });
        }
        if family.has_v6() {
            let gw6 = family::underlay6(GATEWAY_UNDERLAY.octets()[3]);
            let gw6_ext = family::external6(GATEWAY_EXTERNAL.octets()[3]);
            let v6 = |netns: String, dev: &str, ip: Ipv6Addr| Addr { netns, dev: dev.into(), cidr: format!("{ip}/64") };
            addrs.push(v6(ns("gateway"), "eth0", gw6));
            addrs.push(v6(ns("gateway"), "eth1", gw6_ext));
            addrs.push(v6(ns("client"), "eth0", family::external6(CLIENT.octets()[3])));
            addrs.push(v6(ns("control-plane"), "eth0", family::underlay6(CONTROL_PLANE.octets()[3])));
            routes.push(DefaultRoute { netns: ns("client"), via: gw6_ext.into() });
            routes.push(DefaultRoute { netns: ns("control-plane"), via: gw6.into() });
            for n in &node_specs {
                addrs.push(v6(n.netns.clone(), "eth0", n.ip6.expect("planned with IPv6")));
                routes.push(DefaultRoute { netns: n.netns.clone(), via: gw6.into() });
            }
        }
        let mut forwarding = vec![ns("gateway")];
        forwarding.extend(node_specs.iter().map(|n| n.netns.clone()));
        Plan { lab: lab.into(), family, hosts, links, addrs, routes, forwarding, nodes: node_specs }
    }

    /// The part of a lab's plan that node-`i` (1-based) adds to it: its namespace, its link to
    /// the underlay bridge, its address, route and forwarding (`podpath node add`).
    pub fn one_node(lab: &str, i: usize, family: IpFamilyMode) -> Plan {
        let full = Plan::with_family(lab, i, family);
        let node = full.nodes.last().cloned().expect("i ≥ 1");
        let only = |netns: &str| netns == node.netns;
        Plan {
            lab: lab.into(),
            family,
            hosts: full.hosts.into_iter().filter(|h| only(&h.netns)).collect(),
            links: full.links.into_iter().filter(|l| only(&l.b)).collect(),
            addrs: full.addrs.into_iter().filter(|a| only(&a.netns)).collect(),
            routes: full.routes.into_iter().filter(|r| only(&r.netns)).collect(),
            forwarding: full.forwarding.into_iter().filter(|n| only(n)).collect(),
            nodes: vec![node],
        }
    }

    /// The namespace of a host as users name it.
    pub fn netns_of(&self, role: &str) -> Option<&str> {
        self.hosts.iter().find(|h| h.role == role && h.role != "underlay").map(|h| h.netns.as_str())
    }

    /// The commands that build it, in order (each an argv).
    pub fn commands(&self) -> Vec<Vec<String>> {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let mut out = vec![];
        for h in &self.hosts {
            out.push(v(&["ip", "netns", "add", &h.netns]));
            out.push(v(&["ip", "-n", &h.netns, "link", "set", "lo", "up"]));
        }
        let ul = netns_name(&self.lab, "underlay");
        // The bridge comes with the underlay (a node added later joins the one there is).
        if self.hosts.iter().any(|h| h.netns == ul) {
            out.push(v(&["ip", "-n", &ul, "link", "add", "br0", "type", "bridge"]));
            out.push(v(&["ip", "-n", &ul, "link", "set", "br0", "up"]));
        }
        for l in &self.links {
            out.push(v(&[
                "ip", "-n", &l.a, "link", "add", &l.a_if, "type", "veth", "peer", "name", &l.b_if, "netns", &l.b,
            ]));
            if let Some(br) = &l.a_bridge {
                out.push(v(&["ip", "-n", &l.a, "link", "set", &l.a_if, "master", br]));
            }
            out.push(v(&["ip", "-n", &l.a, "link", "set", &l.a_if, "up"]));
            out.push(v(&["ip", "-n", &l.b, "link", "set", &l.b_if, "up"]));
        }
        for a in &self.addrs {
            let mut argv = v(&["ip", "-n", &a.netns, "addr", "add", &a.cidr, "dev", &a.dev]);
            if a.cidr.contains(':') {
                argv.push("nodad".into());
            }
            out.push(argv);
        }
        for r in &self.routes {
            let via = r.via.to_string();
            if r.via.is_ipv6() {
                out.push(v(&["ip", "-6", "-n", &r.netns, "route", "add", "default", "via", &via]));
            } else {
                out.push(v(&["ip", "-n", &r.netns, "route", "add", "default", "via", &via]));
            }
        }
        for ns in &self.forwarding {
            out.push(v(&["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"]));
            if self.family.has_v6() {
                out.push(v(&["ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]));
            }
        }
        out
    }
}

/// The command line of a new node's agent, made from a sibling's (`from`, as recorded when the
/// lab was made): every lab-wide flag kept, the node's own values (name, address, namespace,
/// state and CNI directories, health address, zone) set for `node`. Pure.
pub fn agent_argv_for(template: &[String], from: &NodeSpec, node: &NodeSpec, zone: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(template.len());
    let mut i = 0;
    while i < template.len() {
        let arg = &template[i];
        let value = template.get(i + 1);
        let swapped = |v: &String| v.replace(&format!("/{}/", from.name), &format!("/{}/", node.name));
        match (arg.as_str(), value) {
            ("--node-name", Some(_)) => out.extend([arg.clone(), node.name.clone()]),
            ("--node-ip" | "--node-external-ip", Some(_)) => out.extend([arg.clone(), node.ip.to_string()]),
            ("--healthz-bind-address", Some(_)) => {
                out.extend([arg.clone(), format!("{}:{}", node.ip, AGENT_HEALTH_PORT)])
            }
            ("--state-dir" | "--cni-conf-dir", Some(v)) => out.extend([arg.clone(), swapped(v)]),
            ("--node-label", Some(v)) if v.starts_with("topology.kubernetes.io/zone=") => {
                out.extend([arg.clone(), format!("topology.kubernetes.io/zone={zone}")])
            }
            (a, _) if a == from.netns => {
                out.push(node.netns.clone());
                i += 1;
                continue;
            }
            _ => {
                out.push(arg.clone());
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn three_nodes_follow_the_address_plan() {
        let p = Plan::new("lab", 3);
        let roles: Vec<&str> = p.hosts.iter().map(|h| h.role.as_str()).collect();
        assert_eq!(roles, ["underlay", "gateway", "client", "control-plane", "node-1", "node-2", "node-3"]);
        assert!(p.hosts.iter().all(|h| h.netns.starts_with("pp-lab-")), "every name carries the lab's");
        assert_eq!(p.nodes[1].ip, Ipv4Addr::new(192, 168, 56, 12));
        let ips: Vec<&str> = p.addrs.iter().map(|a| a.cidr.as_str()).collect();
        let unique: BTreeSet<&&str> = ips.iter().collect();
        assert_eq!(unique.len(), ips.len(), "unique addresses: {ips:?}");
        assert!(
            ips.contains(&"203.0.113.10/24") && ips.contains(&"192.168.56.2/24") && ips.contains(&"192.168.56.13/24")
        );
        // The client is linked only to the gateway.
        let client = netns_name("lab", "client");
        let client_links: Vec<&Link> = p.links.iter().filter(|l| l.a == client || l.b == client).collect();
        assert_eq!(client_links.len(), 1);
        assert_eq!(client_links[0].a, netns_name("lab", "gateway"));
        for l in &p.links {
            assert!(l.a_if.len() <= 15 && l.b_if.len() <= 15);
        }
        assert_eq!(p.netns_of("node-2"), Some("pp-lab-node-2"));
        assert_eq!(p.netns_of("underlay"), None, "internal");
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("lab").is_ok() && check_name("a-2").is_ok());
        for bad in ["", "Lab", "a b", "-x", "a/b", "averyveryverylongname1"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_node_added_later_joins_the_bridge_with_the_next_address_and_a_siblings_flags() {
        let p = Plan::one_node("lab", 4, IpFamilyMode::Ipv4);
        let cmds: Vec<String> = p.commands().iter().map(|c| c.join(" ")).collect();
        assert!(!cmds.iter().any(|c| c.contains("type bridge")), "the bridge exists: {cmds:?}");
        assert!(cmds.contains(&"ip netns add pp-lab-node-4".to_string()));
        assert!(cmds.contains(&"ip -n pp-lab-underlay link set n4 master br0".to_string()));
        assert!(cmds.contains(&"ip -n pp-lab-node-4 addr add 192.168.56.14/24 dev eth0".to_string()));
        assert!(cmds.contains(&"ip -n pp-lab-node-4 route add default via 192.168.56.2".to_string()));
        let full = Plan::new("lab", 1);
        let from = &full.nodes[0];
        let s = |x: &str| x.to_string();
        let template = [
            s("ip"),
            s("netns"),
            s("exec"),
            s("pp-lab-node-1"),
            s("/b/node-agent"),
            s("--node-name"),
            s("node-1"),
            s("--node-ip"),
            s("192.168.56.11"),
            s("--node-external-ip"),
            s("192.168.56.11"),
            s("--state-dir"),
            s("/var/lib/podpath/lab/nodes/node-1/agent"),
            s("--cni-conf-dir"),
            s("/var/lib/podpath/lab/nodes/node-1/cni"),
            s("--healthz-bind-address"),
            s("192.168.56.11:10256"),
            s("--proxy-mode"),
            s("nftables"),
            s("--masquerade=false"),
            s("--node-label"),
            s("topology.kubernetes.io/region=lab"),
            s("--node-label"),
            s("topology.kubernetes.io/zone=zone-a"),
        ];
        let argv = agent_argv_for(&template, from, &p.nodes[0], &zone_of(4)).join(" ");
        assert_eq!(
            argv,
            "ip netns exec pp-lab-node-4 /b/node-agent --node-name node-4 --node-ip 192.168.56.14 --node-external-ip 192.168.56.14 --state-dir /var/lib/podpath/lab/nodes/node-4/agent --cni-conf-dir /var/lib/podpath/lab/nodes/node-4/cni --healthz-bind-address 192.168.56.14:10256 --proxy-mode nftables --masquerade=false --node-label topology.kubernetes.io/region=lab --node-label topology.kubernetes.io/zone=zone-a"
        );
    }
}
