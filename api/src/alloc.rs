//! What kinds allocate (pure interface): the ranges, the keys of allocated values, and the
//! [`Allocate`] trait a kind calls while it is admitted. apiserver-lite implements it over its
//! allocation table, which it writes in the same transaction as the object.

use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

use ipnet::Ipv4Net;

/// The ranges the server allocates from.
#[derive(Clone, Debug)]
pub struct Ranges {
    pub service_cidr: Ipv4Net,
    pub node_ports: RangeInclusive<u16>,
    pub lb_pool: Ipv4Net,
    pub cluster_cidr: Ipv4Net,
    /// Prefix length of each node's pod CIDR.
    pub node_cidr_prefix: u8,
}

impl Default for Ranges {
    fn default() -> Self {
        Ranges {
            service_cidr: "10.96.0.0/12".parse().expect("valid"),
            node_ports: 30000..=32767,
            lb_pool: "198.51.100.0/24".parse().expect("valid"),
            cluster_cidr: "10.244.0.0/16".parse().expect("valid"),
            node_cidr_prefix: 24,
        }
    }
}

/// Why an allocation failed.
#[derive(Debug, PartialEq, Eq)]
pub enum AllocError {
    /// The requested value is outside the range; carries the range's text.
    NotInRange(String),
    AlreadyAllocated,
    Full,
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
    /// A ClusterIP: `requested` exactly, or a free one.
    fn cluster_ip(&mut self, requested: Option<Ipv4Addr>) -> Result<Ipv4Addr, AllocError>;
    /// A NodePort: `requested` exactly, or a free one.
    fn node_port(&mut self, requested: Option<i32>) -> Result<i32, AllocError>;
    /// A LoadBalancer pool address: `requested` exactly, or the lowest free one.
    fn lb_ip(&mut self, requested: Option<Ipv4Addr>) -> Result<Ipv4Addr, AllocError>;
    /// A node's pod CIDR (node `…-N` gets subnet N when free).
    fn pod_cidr(&mut self, node_name: &str) -> Result<Ipv4Net, AllocError>;
    /// Claims a pod CIDR the node asks for; `AlreadyAllocated` when another owner holds it.
    fn claim_pod_cidr(&mut self, cidr: &str) -> Result<(), AllocError>;
}
