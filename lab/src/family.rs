//! The lab's IP families (`podpath up --ip-family ipv4|ipv6|dual`), as data (pure): which
//! ranges the API server allocates from, which addresses the nodes publish, where the cluster
//! DNS is. IPv6 follows the same plan as IPv4 (docs/architecture.md): a ULA for the node
//! network, pods and Services (kind's fd00:10:244::/56 and fd00:10:96::/112), documentation
//! prefixes (2001:db8::/32) for the "internet" side and the LoadBalancer pool.
//!
//! The lab's own wiring (the control plane's gRPC and the node agents' health addresses on the
//! IPv4 underlay) stays IPv4 in every mode, as kind's IPv6 clusters keep an IPv4 Docker
//! network: only the cluster — Services, pods, nodes' InternalIPs, LoadBalancer addresses — is
//! single- or dual-stack.

use serde::{Deserialize, Serialize};

/// `--ip-family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IpFamilyMode {
    /// IPv4 only (the default).
    #[default]
    Ipv4,
    /// IPv6 only.
    Ipv6,
    /// Dual-stack, IPv4 primary (as kind's `dual`).
    Dual,
}

impl std::fmt::Display for IpFamilyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IpFamilyMode::Ipv4 => "ipv4",
            IpFamilyMode::Ipv6 => "ipv6",
            IpFamilyMode::Dual => "dual",
        })
    }
}

/// One family's part of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilyPlan {
    pub service_cidr: &'static str,
    pub cluster_cidr: &'static str,
    pub lb_pool: &'static str,
    /// kubeadm's cluster DNS address: the tenth of the Service range.
    pub cluster_dns: &'static str,
}

pub const V4: FamilyPlan = FamilyPlan {
    service_cidr: "10.96.0.0/12",
    cluster_cidr: "10.244.0.0/16",
    lb_pool: "198.51.100.0/24",
    cluster_dns: "10.96.0.10",
};

pub const V6: FamilyPlan = FamilyPlan {
    service_cidr: "fd00:10:96::/112",
    cluster_cidr: "fd00:10:244::/56",
    lb_pool: "2001:db8:100::/120",
    cluster_dns: "fd00:10:96::a",
};

/// The node network's IPv6 prefix (the IPv4 one is 192.168.56.0/24).
pub const UNDERLAY6: &str = "fd00:56::";
/// The "internet" side's IPv6 prefix (the IPv4 one is 203.0.113.0/24).
pub const EXTERNAL6: &str = "2001:db8:113::";

/// The IPv6 address of the underlay host whose IPv4 address ends in `.last` (the gateway .2,
/// the control plane .10, node-N .10+N): the same digits after `fd00:56::`.
pub fn underlay6(last: u8) -> std::net::Ipv6Addr {
    format!("{UNDERLAY6}{last}").parse().expect("a decimal number is valid hex")
}

/// The "internet" side's IPv6 address of the host whose IPv4 address ends in `.last`.
pub fn external6(last: u8) -> std::net::Ipv6Addr {
    format!("{EXTERNAL6}{last}").parse().expect("a decimal number is valid hex")
}

impl IpFamilyMode {
    /// The cluster's families' plans, primary first.
    pub fn plans(self) -> Vec<FamilyPlan> {
        match self {
            IpFamilyMode::Ipv4 => vec![V4],
            IpFamilyMode::Ipv6 => vec![V6],
            IpFamilyMode::Dual => vec![V4, V6],
        }
    }
    pub fn has_v4(self) -> bool {
        self != IpFamilyMode::Ipv6
    }
    pub fn has_v6(self) -> bool {
        self != IpFamilyMode::Ipv4
    }
    fn joined(self, f: impl Fn(&FamilyPlan) -> &'static str) -> String {
        self.plans().iter().map(f).collect::<Vec<_>>().join(",")
    }
    /// `--service-cluster-ip-range` of the API server (and the nodes').
    pub fn service_cidrs(self) -> String {
        self.joined(|p| p.service_cidr)
    }
    /// `--cluster-cidr` of the API server and the nodes.
    pub fn cluster_cidrs(self) -> String {
        self.joined(|p| p.cluster_cidr)
    }
    /// The API server's `--lb-ip-pool`.
    pub fn lb_pools(self) -> String {
        self.joined(|p| p.lb_pool)
    }
    /// The kube-dns Service's address, of the primary family (kubeadm's single-stack kube-dns).
    pub fn cluster_dns(self) -> &'static str {
        self.plans()[0].cluster_dns
    }
    /// A node's `--node-ip` (its InternalIPs, primary first) for underlay address `.last`.
    pub fn node_ips(self, v4: std::net::Ipv4Addr) -> String {
        let v6 = underlay6(v4.octets()[3]).to_string();
        match self {
            IpFamilyMode::Ipv4 => v4.to_string(),
            IpFamilyMode::Ipv6 => v6,
            IpFamilyMode::Dual => format!("{v4},{v6}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_of_each_mode() {
        assert_eq!(IpFamilyMode::Ipv4.service_cidrs(), "10.96.0.0/12");
        assert_eq!(IpFamilyMode::Dual.service_cidrs(), "10.96.0.0/12,fd00:10:96::/112");
        assert_eq!(IpFamilyMode::Ipv6.cluster_cidrs(), "fd00:10:244::/56");
        assert_eq!(IpFamilyMode::Dual.lb_pools(), "198.51.100.0/24,2001:db8:100::/120");
        assert_eq!(IpFamilyMode::Ipv6.cluster_dns(), "fd00:10:96::a");
        assert_eq!(IpFamilyMode::Dual.cluster_dns(), "10.96.0.10");
        let n1 = "192.168.56.11".parse().unwrap();
        assert_eq!(IpFamilyMode::Dual.node_ips(n1), "192.168.56.11,fd00:56::11");
        assert_eq!(IpFamilyMode::Ipv6.node_ips(n1), "fd00:56::11");
        assert_eq!(external6(10).to_string(), "2001:db8:113::10");
        // The tenth address of the IPv6 range is ::a, as kubeadm picks it.
        let net: ipnet::Ipv6Net = V6.service_cidr.parse().unwrap();
        assert_eq!(std::net::Ipv6Addr::from(u128::from(net.network()) + 10).to_string(), V6.cluster_dns);
    }
}
