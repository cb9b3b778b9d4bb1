//! What kinds allocate (pure interface): the ranges, the keys of allocated values, and the
//! [`Allocate`] trait a kind calls while it is admitted. apiserver-lite implements it over its
//! allocation table, which it writes in the same transaction as the object.

use std::net::IpAddr;
use std::ops::RangeInclusive;

use ipnet::IpNet;

/// An IP family, as `ipFamilies` and EndpointSlices' `addressType` name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IpFamily {
    V4,
    V6,
}

impl IpFamily {
    /// The API's spelling: `IPv4` or `IPv6`.
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
    pub fn parse(s: &str) -> Option<IpFamily> {
        match s {
            "IPv4" => Some(IpFamily::V4),
            "IPv6" => Some(IpFamily::V6),
            _ => None,
        }
    }
    pub fn of(ip: &IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }
    /// The family of an address's text; `None` when it is not an address.
    pub fn of_str(ip: &str) -> Option<IpFamily> {
        ip.parse::<IpAddr>().ok().map(|a| IpFamily::of(&a))
    }
    pub fn of_net(net: &IpNet) -> IpFamily {
        match net {
            IpNet::V4(_) => IpFamily::V4,
            IpNet::V6(_) => IpFamily::V6,
        }
    }
    pub fn other(self) -> IpFamily {
        match self {
            IpFamily::V4 => IpFamily::V6,
            IpFamily::V6 => IpFamily::V4,
        }
    }
}

/// The ranges the server allocates from. Each list holds one range, or two of different
/// families (the first is the primary one, as in `--service-cluster-ip-range=A,B`).
#[derive(Clone, Debug)]
pub struct Ranges {
    pub service_cidrs: Vec<IpNet>,
    pub node_ports: RangeInclusive<u16>,
    pub lb_pools: Vec<IpNet>,
    pub cluster_cidrs: Vec<IpNet>,
    /// Prefix length of each node's IPv4 pod CIDR (`--node-cidr-mask-size-ipv4`).
    pub node_cidr_prefix: u8,
    /// Prefix length of each node's IPv6 pod CIDR (`--node-cidr-mask-size-ipv6`).
    pub node_cidr_prefix_v6: u8,
}

impl Default for Ranges {
    fn default() -> Self {
        Ranges {
            service_cidrs: vec!["10.96.0.0/12".parse().expect("valid")],
            node_ports: 30000..=32767,
            lb_pools: vec!["198.51.100.0/24".parse().expect("valid")],
            cluster_cidrs: vec!["10.244.0.0/16".parse().expect("valid")],
            node_cidr_prefix: 24,
            node_cidr_prefix_v6: 64,
        }
    }
}

fn of_family(nets: &[IpNet], family: IpFamily) -> Option<IpNet> {
    nets.iter().copied().find(|n| IpFamily::of_net(n) == family)
}

impl Ranges {
    /// The families Services get ClusterIPs of, primary first.
    pub fn service_families(&self) -> Vec<IpFamily> {
        self.service_cidrs.iter().map(IpFamily::of_net).collect()
    }
    /// The cluster's default family (`--service-cluster-ip-range`'s first).
    pub fn primary_family(&self) -> IpFamily {
        self.service_cidrs.first().map(IpFamily::of_net).unwrap_or(IpFamily::V4)
    }
    pub fn dual_stack(&self) -> bool {
        self.service_cidrs.len() > 1
    }
    pub fn service_cidr(&self, family: IpFamily) -> Option<IpNet> {
        of_family(&self.service_cidrs, family)
    }
    pub fn lb_pool(&self, family: IpFamily) -> Option<IpNet> {
        of_family(&self.lb_pools, family)
    }
    pub fn cluster_cidr(&self, family: IpFamily) -> Option<IpNet> {
        of_family(&self.cluster_cidrs, family)
    }
    /// The prefix length of one node's pod CIDR of `family`.
    pub fn node_prefix(&self, family: IpFamily) -> u8 {
        match family {
            IpFamily::V4 => self.node_cidr_prefix,
            IpFamily::V6 => self.node_cidr_prefix_v6,
        }
    }
    /// Whether `ip` is inside the Service range of its family.
    pub fn in_service_range(&self, ip: &str) -> bool {
        ip.parse::<IpAddr>().is_ok_and(|a| self.service_cidr(IpFamily::of(&a)).is_some_and(|n| n.contains(&a)))
    }
    /// Whether `ip` is inside the LoadBalancer pool of its family.
    pub fn in_lb_pool(&self, ip: &str) -> bool {
        ip.parse::<IpAddr>().is_ok_and(|a| self.lb_pool(IpFamily::of(&a)).is_some_and(|n| n.contains(&a)))
    }
    /// Whether the CIDR `cidr` lies inside the cluster CIDR of its family.
    pub fn in_cluster_cidr(&self, cidr: &str) -> bool {
        cidr.parse::<IpNet>().is_ok_and(|c| self.cluster_cidr(IpFamily::of_net(&c)).is_some_and(|n| n.contains(&c)))
    }
}

/// The first address after a range's network address: `default/kubernetes`'s ClusterIP.
pub fn first_address(net: &IpNet) -> IpAddr {
    match net {
        IpNet::V4(n) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(n.network()).wrapping_add(1))),
        IpNet::V6(n) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(n.network()).wrapping_add(1))),
    }
}

/// Checks a list of ranges given as one flag (`--service-cluster-ip-range=A[,B]`): one CIDR,
/// or two of different families, as kube-apiserver accepts them.
pub fn parse_dual_cidrs(flag: &str, text: &str) -> Result<Vec<IpNet>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let net: IpNet = part.parse().map_err(|_| format!("{flag}: {part:?} is not a CIDR"))?;
        if net.network() != net.addr() {
            return Err(format!("{flag}: {part} is not a network address (its network is {})", net.trunc()));
        }
        out.push(net);
    }
    match out.as_slice() {
        [] => Err(format!("{flag}: no CIDR given")),
        [_] => Ok(out),
        [a, b] if IpFamily::of_net(a) != IpFamily::of_net(b) => Ok(out),
        [_, _] => Err(format!("{flag}: {text} must be a dual-stack pair of one IPv4 and one IPv6 CIDR")),
        _ => Err(format!("{flag}: {text} may hold at most two CIDRs (one per IP family)")),
    }
}

/// Why an allocation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum AllocError {
    /// The requested value is outside the range; carries the range's text.
    NotInRange(String),
    AlreadyAllocated,
    Full,
    /// The cluster has no range of the family asked for.
    NotConfigured,
}

/// A range has nothing left: the request fails with an internal error (500), as the real
/// server's does; the message is the server's.
#[derive(Debug, PartialEq, Eq)]
pub struct Exhausted(pub String);

/// The key of one allocated value (`clusterip/10.96.0.10`, `nodeport/30080`, `lbip/…`,
/// `podcidr/…`).
pub type AllocKey = String;

pub fn cluster_ip_key(ip: &str) -> AllocKey {
    format!("clusterip/{ip}")
}
pub fn node_port_key(port: i32) -> AllocKey {
    format!("nodeport/{port}")
}
pub fn lb_ip_key(ip: &str) -> AllocKey {
    format!("lbip/{ip}")
}
pub fn pod_cidr_key(cidr: &str) -> AllocKey {
    format!("podcidr/{cidr}")
}

/// Allocation for one object being written: each value taken is claimed for it (and kept
/// only if the write commits).
pub trait Allocate {
    fn ranges(&self) -> &Ranges;
    /// A ClusterIP of `family`: `requested` exactly, or a free one.
    fn cluster_ip(&mut self, family: IpFamily, requested: Option<IpAddr>) -> Result<IpAddr, AllocError>;
    /// A NodePort: `requested` exactly, or a free one.
    fn node_port(&mut self, requested: Option<i32>) -> Result<i32, AllocError>;
    /// A LoadBalancer pool address of `family`: `requested` exactly, or the lowest free one.
    fn lb_ip(&mut self, family: IpFamily, requested: Option<IpAddr>) -> Result<IpAddr, AllocError>;
    /// A node's pod CIDR of `family` (node `…-N` gets subnet N when free).
    fn pod_cidr(&mut self, node_name: &str, family: IpFamily) -> Result<IpNet, AllocError>;
    /// Claims a pod CIDR the node asks for; `AlreadyAllocated` when another owner holds it.
    fn claim_pod_cidr(&mut self, cidr: &str) -> Result<(), AllocError>;
}
