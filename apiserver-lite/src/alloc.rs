//! Allocators for ClusterIPs, NodePorts, LoadBalancer IPs and node pod CIDRs.
//!
//! The source of truth is the set of `a/...` keys in the store, written in the same batch as
//! the object that owns them, so a crash can neither leak nor double-assign a value. In memory
//! we keep that set (key → owner) and only change it after a successful commit.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use api::alloc::Allocate;
pub use api::alloc::{cluster_ip_key, lb_ip_key, node_port_key, pod_cidr_key, AllocError, Ranges};
use ipnet::Ipv4Net;

/// The owner string recorded with an allocation.
pub fn owner(kind: api::Kind, ns: &str, name: &str) -> String {
    format!("{}/{}/{}", kind.info().name, ns, name)
}

/// The allocation table. Only touched while the store's writer lock is held.
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

    /// Allocates a ClusterIP: `requested` exactly, or a free one starting from a random offset.
    pub fn cluster_ip(&self, requested: Option<Ipv4Addr>, claims: &mut Claims) -> Result<Ipv4Addr, AllocError> {
        let net = self.ranges.service_cidr;
        let pick = pick_ip(net, requested, |ip| self.free_for(&cluster_ip_key(&ip.to_string()), claims), true)?;
        claims.added.insert(cluster_ip_key(&pick.to_string()));
        Ok(pick)
    }

    /// Allocates a LoadBalancer IP from the pool: `requested` or the lowest free address, so
    /// labs get predictable addresses (198.51.100.1, .2, …).
    pub fn lb_ip(&self, requested: Option<Ipv4Addr>, claims: &mut Claims) -> Result<Ipv4Addr, AllocError> {
        let net = self.ranges.lb_pool;
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

    /// Allocates a node's pod CIDR. A node named `…-N` gets subnet N when it is free
    /// (node-1 → 10.244.1.0/24, as in the lab's address plan); otherwise the lowest free one.
    pub fn pod_cidr(&self, node_name: &str, claims: &mut Claims) -> Result<Ipv4Net, AllocError> {
        let net = self.ranges.cluster_cidr;
        let prefix = self.ranges.node_cidr_prefix.max(net.prefix_len());
        let subnets: Vec<Ipv4Net> = net.subnets(prefix).map_err(|_| AllocError::Full)?.collect();
        let preferred =
            node_name.rsplit('-').next().and_then(|n| n.parse::<usize>().ok()).filter(|n| *n > 0 && *n < subnets.len());
        let candidates = preferred.into_iter().chain(1..subnets.len()).chain(std::iter::once(0));
        for i in candidates {
            let s = subnets[i];
            if self.free_for(&pod_cidr_key(&s.to_string()), claims) {
                claims.added.insert(pod_cidr_key(&s.to_string()));
                return Ok(s);
            }
        }
        Err(AllocError::Full)
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
    fn cluster_ip(&mut self, requested: Option<Ipv4Addr>) -> Result<Ipv4Addr, AllocError> {
        self.table.cluster_ip(requested, self.claims)
    }
    fn node_port(&mut self, requested: Option<i32>) -> Result<i32, AllocError> {
        self.table.node_port(requested, self.claims)
    }
    fn lb_ip(&mut self, requested: Option<Ipv4Addr>) -> Result<Ipv4Addr, AllocError> {
        self.table.lb_ip(requested, self.claims)
    }
    fn pod_cidr(&mut self, node_name: &str) -> Result<Ipv4Net, AllocError> {
        self.table.pod_cidr(node_name, self.claims)
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

/// Picks an address of `net` (never the network or broadcast address).
fn pick_ip(
    net: Ipv4Net,
    requested: Option<Ipv4Addr>,
    free: impl Fn(Ipv4Addr) -> bool,
    random_start: bool,
) -> Result<Ipv4Addr, AllocError> {
    let base = u32::from(net.network());
    let size = 1u64 << (32 - net.prefix_len());
    if let Some(ip) = requested {
        let n = u32::from(ip);
        if !net.contains(&ip) || n == base || n as u64 == base as u64 + size - 1 {
            return Err(AllocError::NotInRange(net.to_string()));
        }
        return if free(ip) { Ok(ip) } else { Err(AllocError::AlreadyAllocated) };
    }
    if size < 3 {
        return Err(AllocError::Full);
    }
    let usable = (size - 2) as u32;
    let start = if random_start { fastrand::u32(0..usable) } else { 0 };
    for i in 0..usable {
        let ip = Ipv4Addr::from(base + 1 + (start + i) % usable);
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
                service_cidr: "10.96.0.0/29".parse().unwrap(),
                node_ports: 30000..=30002,
                lb_pool: "198.51.100.0/30".parse().unwrap(),
                cluster_cidr: "10.244.0.0/16".parse().unwrap(),
                node_cidr_prefix: 24,
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
            let ip = a.cluster_ip(None, &mut c).unwrap();
            assert!(seen.insert(ip));
            a.apply(&c.owner.clone(), &BTreeSet::new(), &c.added);
        }
        let mut c = Claims::new("x".into());
        assert_eq!(a.cluster_ip(None, &mut c), Err(AllocError::Full));
        assert_eq!(a.cluster_ip(Some("10.96.0.1".parse().unwrap()), &mut c), Err(AllocError::AlreadyAllocated));
        assert_eq!(
            a.cluster_ip(Some("10.0.0.1".parse().unwrap()), &mut c),
            Err(AllocError::NotInRange("10.96.0.0/29".into()))
        );
        assert_eq!(
            a.cluster_ip(Some("10.96.0.7".parse().unwrap()), &mut c),
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
        assert_eq!(a.lb_ip(None, &mut c).unwrap().to_string(), "198.51.100.1");
        assert_eq!(a.lb_ip(None, &mut c).unwrap().to_string(), "198.51.100.2");
        assert_eq!(a.lb_ip(None, &mut c), Err(AllocError::Full));
        let mut n = Claims::new("n".into());
        assert_eq!(a.pod_cidr("node-3", &mut n).unwrap().to_string(), "10.244.3.0/24");
        assert_eq!(a.pod_cidr("worker", &mut n).unwrap().to_string(), "10.244.1.0/24");
        assert_eq!(a.pod_cidr("node-3", &mut n).unwrap().to_string(), "10.244.2.0/24");
    }
}
