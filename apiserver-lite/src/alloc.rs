//! Allocators for ClusterIPs, NodePorts, LoadBalancer IPs and node pod CIDRs.
//!
//! The source of truth is the set of `a/...` keys in the store, written in the same batch as
//! the object that owns them, so a crash can neither leak nor double-assign a value. In memory
//! we keep that set (key → owner) and only change it after a successful commit.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use api::alloc::Allocate;
pub use api::alloc::{cluster_ip_key, lb_ip_key, node_port_key, pod_cidr_key, AllocError, IpFamily, Ranges};
use ipnet::IpNet;

/// The owner string recorded with an allocation.
pub fn owner(kind: api::Kind, ns: &str, name: &str) -> String {
    format!("{}/{}/{}", kind.info().name, ns, name)
}

/// The allocation table. Changed only while the store's writer lock is held; a create admitted
/// before it takes that lock claims against the table as it was and is checked again under it.
#[derive(Debug, Default)]
pub struct Allocators {
    pub ranges: Ranges,
    used: BTreeMap<String, String>,
}

/// Claims made by one transaction that is not committed yet.
#[derive(Debug, Default)]
pub struct Claims {
    pub owner: String,
    pub added: BTreeSet<String>,
}

impl Claims {
    pub fn new(owner: String) -> Self {
        Claims { owner, added: BTreeSet::new() }
    }
}

impl Allocators {
    pub fn new(ranges: Ranges, used: BTreeMap<String, String>) -> Self {
        Allocators { ranges, used }
    }

    fn free_for(&self, key: &str, claims: &Claims) -> bool {
        !claims.added.contains(key) && self.used.get(key).is_none_or(|o| *o == claims.owner)
    }

    /// Records the committed outcome of a transaction.
    pub fn apply(&mut self, owner: &str, released: &BTreeSet<String>, added: &BTreeSet<String>) {
        for k in released {
            if self.used.get(k).is_some_and(|o| o == owner) {
                self.used.remove(k);
            }
        }
        for k in added {
            self.used.insert(k.clone(), owner.to_string());
        }
    }

    pub fn owner_of(&self, key: &str) -> Option<&str> {
        self.used.get(key).map(String::as_str)
    }

    /// Allocates a ClusterIP of `family`: `requested` exactly, or a free one starting from a
    /// random offset.
    pub fn cluster_ip(
        &self,
        family: IpFamily,
        requested: Option<IpAddr>,
        claims: &mut Claims,
    ) -> Result<IpAddr, AllocError> {
        let net = self.ranges.service_cidr(family).ok_or(AllocError::NotConfigured)?;
        let pick = pick_ip(net, requested, |ip| self.free_for(&cluster_ip_key(&ip.to_string()), claims), true)?;
        claims.added.insert(cluster_ip_key(&pick.to_string()));
        Ok(pick)
    }

    /// Allocates a LoadBalancer IP of `family` from its pool: `requested` or the lowest free
    /// address, so labs get predictable addresses (198.51.100.1, .2, …).
    pub fn lb_ip(
        &self,
        family: IpFamily,
        requested: Option<IpAddr>,
        claims: &mut Claims,
    ) -> Result<IpAddr, AllocError> {
        let net = self.ranges.lb_pool(family).ok_or(AllocError::NotConfigured)?;
        let pick = pick_ip(net, requested, |ip| self.free_for(&lb_ip_key(&ip.to_string()), claims), false)?;
        claims.added.insert(lb_ip_key(&pick.to_string()));
        Ok(pick)
    }

    /// Allocates a NodePort: `requested` or a free one from a random offset.
    pub fn node_port(&self, requested: Option<i32>, claims: &mut Claims) -> Result<i32, AllocError> {
        let range = &self.ranges.node_ports;
        let (lo, hi) = (*range.start() as i32, *range.end() as i32);
        if let Some(p) = requested {
            if p < lo || p > hi {
                return Err(AllocError::NotInRange(format!("{lo}-{hi}")));
            }
            if !self.free_for(&node_port_key(p), claims) {
                return Err(AllocError::AlreadyAllocated);
            }
            claims.added.insert(node_port_key(p));
            return Ok(p);
        }
        let size = (hi - lo + 1) as u32;
        let start = fastrand::u32(0..size);
        for i in 0..size {
            let p = lo + ((start + i) % size) as i32;
            if self.free_for(&node_port_key(p), claims) {
                claims.added.insert(node_port_key(p));
                return Ok(p);
            }
        }
        Err(AllocError::Full)
    }

    /// Allocates a node's pod CIDR of `family`. A node named `…-N` gets subnet N when it is
    /// free (node-1 → 10.244.1.0/24 and fd00:10:244:1::/64, as in the lab's address plan);
    /// otherwise the lowest free one.
    pub fn pod_cidr(&self, node_name: &str, family: IpFamily, claims: &mut Claims) -> Result<IpNet, AllocError> {
        let net = self.ranges.cluster_cidr(family).ok_or(AllocError::NotConfigured)?;
        let prefix = self.ranges.node_prefix(family).max(net.prefix_len()).min(net.max_prefix_len());
        // The server refuses masks more than 16 bits apart, so the count stays small.
        let count = 1u64 << (prefix - net.prefix_len()).min(16);
        let preferred =
            node_name.rsplit('-').next().and_then(|n| n.parse::<u64>().ok()).filter(|n| *n > 0 && *n < count);
        let candidates = preferred.into_iter().chain(1..count).chain(std::iter::once(0));
        for i in candidates {
            let s = nth_subnet(net, prefix, i);
            if self.free_for(&pod_cidr_key(&s.to_string()), claims) {
                claims.added.insert(pod_cidr_key(&s.to_string()));
                return Ok(s);
            }
        }
        Err(AllocError::Full)
    }
}

/// The `i`th subnet of length `prefix` inside `net`.
fn nth_subnet(net: IpNet, prefix: u8, i: u64) -> IpNet {
    match net {
        IpNet::V4(n) => {
            let step = 1u64 << (32 - prefix);
            let base = u32::from(n.network()) as u64 + i * step;
            IpNet::new(IpAddr::V4(Ipv4Addr::from(base as u32)), prefix).expect("prefix within 32")
        }
        IpNet::V6(n) => {
            let step = 1u128 << (128 - prefix as u32);
            let base = u128::from(n.network()) + i as u128 * step;
            IpNet::new(IpAddr::V6(Ipv6Addr::from(base)), prefix).expect("prefix within 128")
        }
    }
}

/// One write's allocations, as a kind asks for them: the table (its lock held) and the claims
/// of the transaction.
pub struct Claiming<'a> {
    pub table: &'a Allocators,
    pub claims: &'a mut Claims,
}

impl Allocate for Claiming<'_> {
    fn ranges(&self) -> &Ranges {
        &self.table.ranges
    }
    fn cluster_ip(&mut self, family: IpFamily, requested: Option<IpAddr>) -> Result<IpAddr, AllocError> {
        self.table.cluster_ip(family, requested, self.claims)
    }
    fn node_port(&mut self, requested: Option<i32>) -> Result<i32, AllocError> {
        self.table.node_port(requested, self.claims)
    }
    fn lb_ip(&mut self, family: IpFamily, requested: Option<IpAddr>) -> Result<IpAddr, AllocError> {
        self.table.lb_ip(family, requested, self.claims)
    }
    fn pod_cidr(&mut self, node_name: &str, family: IpFamily) -> Result<IpNet, AllocError> {
        self.table.pod_cidr(node_name, family, self.claims)
    }
    fn claim_pod_cidr(&mut self, cidr: &str) -> Result<(), AllocError> {
        let key = pod_cidr_key(cidr);
        if self.table.owner_of(&key).is_some_and(|o| o != self.claims.owner) {
            return Err(AllocError::AlreadyAllocated);
        }
        self.claims.added.insert(key);
        Ok(())
    }
}

/// Picks an address of `net`: never the network address, nor an IPv4 network's broadcast
/// address (as kube-apiserver's allocator, which uses the last address of an IPv6 range).
fn pick_ip(
    net: IpNet,
    requested: Option<IpAddr>,
    free: impl Fn(IpAddr) -> bool,
    random_start: bool,
) -> Result<IpAddr, AllocError> {
    let (base, bits, v4) = match net {
        IpNet::V4(n) => (u32::from(n.network()) as u128, 32 - n.prefix_len() as u32, true),
        IpNet::V6(n) => (u128::from(n.network()), 128 - n.prefix_len() as u32, false),
    };
    // Ranges wider than 2^64 are refused at start; the scan is bounded anyway.
    let size: u128 = if bits >= 127 { u128::MAX } else { 1u128 << bits };
    let usable = size.saturating_sub(if v4 { 2 } else { 1 });
    let to_addr = |n: u128| if v4 { IpAddr::V4(Ipv4Addr::from(n as u32)) } else { IpAddr::V6(Ipv6Addr::from(n)) };
    if let Some(ip) = requested {
        let n = match ip {
            IpAddr::V4(a) if v4 => u32::from(a) as u128,
            IpAddr::V6(a) if !v4 => u128::from(a),
            _ => return Err(AllocError::NotInRange(net.to_string())),
        };
        if !net.contains(&ip) || n == base || (v4 && n == base + size - 1) {
            return Err(AllocError::NotInRange(net.to_string()));
        }
        return if free(ip) { Ok(ip) } else { Err(AllocError::AlreadyAllocated) };
    }
    if usable == 0 {
        return Err(AllocError::Full);
    }
    let start = if random_start { fastrand::u128(0..usable) } else { 0 };
    for i in 0..usable.min(1 << 24) {
        let ip = to_addr(base + 1 + (start + i) % usable);
        if free(ip) {
            return Ok(ip);
        }
    }
    Err(AllocError::Full)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Allocators {
        Allocators::new(
            Ranges {
                service_cidrs: vec!["10.96.0.0/29".parse().unwrap(), "fd00:10:96::/126".parse().unwrap()],
                node_ports: 30000..=30002,
                lb_pools: vec!["198.51.100.0/30".parse().unwrap(), "2001:db8:100::/126".parse().unwrap()],
                cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap(), "fd00:10:244::/56".parse().unwrap()],
                node_cidr_prefix: 24,
                node_cidr_prefix_v6: 64,
            },
            BTreeMap::new(),
        )
    }

    #[test]
    fn cluster_ips_are_distinct_until_full() {
        let mut a = small();
        let mut seen = BTreeSet::new();
        for i in 0..6 {
            let mut c = Claims::new(format!("svc{i}"));
            let ip = a.cluster_ip(IpFamily::V4, None, &mut c).unwrap();
            assert!(seen.insert(ip));
            a.apply(&c.owner.clone(), &BTreeSet::new(), &c.added);
        }
        let mut c = Claims::new("x".into());
        assert_eq!(a.cluster_ip(IpFamily::V4, None, &mut c), Err(AllocError::Full));
        assert_eq!(
            a.cluster_ip(IpFamily::V4, Some("10.96.0.1".parse().unwrap()), &mut c),
            Err(AllocError::AlreadyAllocated)
        );
        assert_eq!(
            a.cluster_ip(IpFamily::V4, Some("10.0.0.1".parse().unwrap()), &mut c),
            Err(AllocError::NotInRange("10.96.0.0/29".into()))
        );
        assert_eq!(
            a.cluster_ip(IpFamily::V4, Some("10.96.0.7".parse().unwrap()), &mut c),
            Err(AllocError::NotInRange("10.96.0.0/29".into()))
        );
    }

    #[test]
    fn node_ports_honour_requests_and_owners() {
        let mut a = small();
        let mut c = Claims::new("Service/default/a".into());
        assert_eq!(a.node_port(Some(30001), &mut c), Ok(30001));
        a.apply("Service/default/a", &BTreeSet::new(), &c.added);
        let mut other = Claims::new("Service/default/b".into());
        assert_eq!(a.node_port(Some(30001), &mut other), Err(AllocError::AlreadyAllocated));
        assert_eq!(a.node_port(Some(80), &mut other), Err(AllocError::NotInRange("30000-30002".into())));
        // The owner may keep its own port.
        let mut again = Claims::new("Service/default/a".into());
        assert_eq!(a.node_port(Some(30001), &mut again), Ok(30001));
        let p1 = a.node_port(None, &mut other).unwrap();
        let p2 = a.node_port(None, &mut other).unwrap();
        assert_ne!(p1, p2);
        assert_eq!(a.node_port(None, &mut other), Err(AllocError::Full));
    }

    #[test]
    fn lb_ips_are_lowest_first_and_pod_cidrs_follow_node_numbers() {
        let a = small();
        let mut c = Claims::new("s".into());
        assert_eq!(a.lb_ip(IpFamily::V4, None, &mut c).unwrap().to_string(), "198.51.100.1");
        assert_eq!(a.lb_ip(IpFamily::V4, None, &mut c).unwrap().to_string(), "198.51.100.2");
        assert_eq!(a.lb_ip(IpFamily::V4, None, &mut c), Err(AllocError::Full));
        let mut n = Claims::new("n".into());
        assert_eq!(a.pod_cidr("node-3", IpFamily::V4, &mut n).unwrap().to_string(), "10.244.3.0/24");
        assert_eq!(a.pod_cidr("worker", IpFamily::V4, &mut n).unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(a.pod_cidr("node-3", IpFamily::V4, &mut n).unwrap().to_string(), "10.244.2.0/24");
    }

    #[test]
    fn ipv6_ranges_use_their_last_address_and_number_node_subnets() {
        let a = small();
        let mut c = Claims::new("s".into());
        let mut got = BTreeSet::new();
        for _ in 0..3 {
            got.insert(a.cluster_ip(IpFamily::V6, None, &mut c).unwrap().to_string());
        }
        // ::0 is the subnet-router anycast address; IPv6 has no broadcast address.
        assert_eq!(got, BTreeSet::from(["fd00:10:96::1".into(), "fd00:10:96::2".into(), "fd00:10:96::3".into()]));
        assert_eq!(a.cluster_ip(IpFamily::V6, None, &mut c), Err(AllocError::Full));
        let v4: IpAddr = "10.96.0.2".parse().unwrap();
        assert_eq!(
            a.cluster_ip(IpFamily::V6, Some(v4), &mut c),
            Err(AllocError::NotInRange("fd00:10:96::/126".into()))
        );
        assert_eq!(a.lb_ip(IpFamily::V6, None, &mut c).unwrap().to_string(), "2001:db8:100::1");
        let mut n = Claims::new("n".into());
        assert_eq!(a.pod_cidr("node-3", IpFamily::V6, &mut n).unwrap().to_string(), "fd00:10:244:3::/64");
        assert_eq!(a.pod_cidr("node-12", IpFamily::V6, &mut n).unwrap().to_string(), "fd00:10:244:c::/64");
        let single = Allocators::new(Ranges::default(), BTreeMap::new());
        assert_eq!(single.cluster_ip(IpFamily::V6, None, &mut n), Err(AllocError::NotConfigured));
    }
}
