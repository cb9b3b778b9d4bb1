//! podpath-ipam: host-local-style address management (ADD, DEL, CHECK, STATUS, GC).
//!
//! Each operation reads its config (pure), then locks the store for the whole operation.

pub mod cli;
pub mod config;
pub mod store;

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::env::Invocation;
use crate::error::{code, CniError, Result};
use crate::types::{CniResult, IpConfig};
pub use config::{IpamConfig, Range};
pub use store::Store;

/// The next address after `ip` in a range set's order (ranges in order, wrapping around).
fn successor(set: &[Range], ip: IpAddr) -> IpAddr {
    let pos = set.iter().position(|r| r.contains(ip));
    match pos {
        Some(i) if ip < set[i].end => config::next_ip(ip).unwrap_or(set[i].start),
        Some(i) => set[(i + 1) % set.len()].start,
        None => set[0].start,
    }
}

fn set_size(set: &[Range]) -> u128 {
    let n = |ip: IpAddr| match ip {
        IpAddr::V4(v) => u32::from(v) as u128,
        IpAddr::V6(v) => u128::from(v),
    };
    set.iter().map(|r| n(r.end) - n(r.start) + 1).sum()
}

/// The next free address of a set, round-robin after the last one handed out (as host-local
/// does, so a released address is not reused straight away). Gateways are never handed out.
pub fn next_free(set: &[Range], last: Option<IpAddr>, taken: impl Fn(IpAddr) -> bool) -> Option<IpAddr> {
    let start = match last {
        Some(l) if set.iter().any(|r| r.contains(l)) => successor(set, l),
        _ => set[0].start,
    };
    let gateways: BTreeSet<IpAddr> = set.iter().map(|r| r.gateway).collect();
    let mut ip = start;
    let mut remaining = set_size(set);
    while remaining > 0 {
        if !gateways.contains(&ip) && !taken(ip) {
            return Some(ip);
        }
        ip = successor(set, ip);
        remaining -= 1;
    }
    None
}

fn range_text(set: &[Range]) -> String {
    set.iter().map(|r| format!("{}-{}", r.start, r.end)).collect::<Vec<_>>().join(",")
}

/// Addresses the runtime asks for: `CNI_ARGS IP=`, `args.cni.ips`, `runtimeConfig.ips`.
pub fn requested_ips(inv: &Invocation, netconf: &Value) -> Result<Vec<IpAddr>> {
    let mut texts: Vec<String> = Vec::new();
    if let Some(ips) = inv.arg("IP") {
        texts.extend(ips.split(',').map(str::to_string));
    }
    for ptr in ["/args/cni/ips", "/runtimeConfig/ips"] {
        for v in netconf.pointer(ptr).and_then(Value::as_array).into_iter().flatten() {
            texts.push(v.as_str().unwrap_or_default().to_string());
        }
    }
    texts
        .into_iter()
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            let t = t.trim();
            let addr = t.split('/').next().unwrap_or(t);
            addr.parse::<IpAddr>()
                .map_err(|_| CniError::new(code::INVALID_CONFIG, format!("invalid requested IP {t:?}")))
        })
        .collect()
}

/// ADD: one address from every range set (a requested one where it fits that set).
pub fn add(conf: &IpamConfig, inv: &Invocation, netconf: &Value) -> Result<CniResult> {
    let requested = requested_ips(inv, netconf)?;
    for ip in &requested {
        if !conf.range_sets.iter().flatten().any(|r| r.contains(*ip)) {
            return Err(CniError::new(
                code::ADDRESS_UNAVAILABLE,
                format!("requested IP {ip} is not in any range of network {}", conf.name),
            ));
        }
    }
    let store = Store::open_locked(&conf.store_dir())?;
    if !store.find(&inv.container_id, &inv.ifname)?.is_empty() {
        return Err(CniError::new(
            code::DUPLICATE_ATTACHMENT,
            format!(
                "container {} interface {} already has an address in network {}",
                inv.container_id, inv.ifname, conf.name
            ),
        ));
    }
    let mut ips = Vec::new();
    let mut reserved = Vec::new();
    let outcome = (|| -> Result<()> {
        for (i, set) in conf.range_sets.iter().enumerate() {
            let want = requested.iter().copied().find(|ip| set.iter().any(|r| r.contains(*ip)));
            let ip = match want {
                Some(ip) => {
                    if set.iter().any(|r| r.gateway == ip) {
                        return Err(CniError::new(
                            code::ADDRESS_UNAVAILABLE,
                            format!("requested IP {ip} is the gateway"),
                        ));
                    }
                    if !store.reserve(ip, &inv.container_id, &inv.ifname, i)? {
                        return Err(CniError::new(
                            code::ADDRESS_UNAVAILABLE,
                            format!("requested IP {ip} is already allocated"),
                        ));
                    }
                    ip
                }
                None => loop {
                    let ip = next_free(set, store.last_reserved(i), |ip| store.is_reserved(ip)).ok_or_else(|| {
                        CniError::new(
                            code::POOL_EXHAUSTED,
                            format!("no IP addresses available in range set {}", range_text(set)),
                        )
                    })?;
                    // Another host-local-compatible writer may race us even under the lock
                    // (an old store without flock): try the next one.
                    if store.reserve(ip, &inv.container_id, &inv.ifname, i)? {
                        break ip;
                    }
                },
            };
            reserved.push(ip);
            let range = set.iter().find(|r| r.contains(ip)).expect("allocated inside the set");
            ips.push(IpConfig {
                address: IpNet::new(ip, range.subnet.prefix_len()).expect("prefix fits"),
                gateway: Some(range.gateway),
                interface: None,
            });
        }
        Ok(())
    })();
    if let Err(e) = outcome {
        // Nothing of a failed ADD stays reserved.
        for ip in reserved {
            let _ = store.unreserve(ip);
        }
        return Err(e);
    }
    Ok(CniResult { interfaces: vec![], ips, routes: conf.routes.clone(), dns: Default::default() })
}

/// DEL: releases the attachment's addresses; succeeds when there are none.
pub fn del(conf: &IpamConfig, inv: &Invocation) -> Result<()> {
    let store = Store::open_locked(&conf.store_dir())?;
    store.release(&inv.container_id, &inv.ifname)?;
    Ok(())
}

/// CHECK: every address of `prevResult` inside our ranges is reserved for this attachment.
pub fn check(conf: &IpamConfig, inv: &Invocation, prev: &CniResult) -> Result<()> {
    let store = Store::open_locked(&conf.store_dir())?;
    let have = store.find(&inv.container_id, &inv.ifname)?;
    if have.is_empty() {
        return Err(CniError::new(
            code::CHECK_FAILED,
            format!("no address is reserved for container {} interface {}", inv.container_id, inv.ifname),
        ));
    }
    for ip in &prev.ips {
        let addr = ip.address.addr();
        if conf.range_sets.iter().flatten().any(|r| r.contains(addr)) && !have.contains(&addr) {
            return Err(CniError::new(
                code::CHECK_FAILED,
                format!("address {addr} of prevResult is not reserved for container {}", inv.container_id),
            ));
        }
    }
    Ok(())
}

/// STATUS: code 50 when a range set has no free address left.
pub fn status(conf: &IpamConfig) -> Result<()> {
    let store = Store::open_locked(&conf.store_dir())?;
    for (i, set) in conf.range_sets.iter().enumerate() {
        if next_free(set, store.last_reserved(i), |ip| store.is_reserved(ip)).is_none() {
            return Err(CniError::new(
                code::NOT_AVAILABLE,
                format!("no IP addresses available in range set {}", range_text(set)),
            ));
        }
    }
    Ok(())
}

/// The valid attachments of a GC request (`cni.dev/valid-attachments`, or the 1.1.0 tag's
/// `cni.dev/attachments`; libcni sends both).
pub fn valid_attachments(netconf: &Value) -> Result<BTreeSet<(String, String)>> {
    let list = netconf
        .get("cni.dev/valid-attachments")
        .or_else(|| netconf.get("cni.dev/attachments"))
        .ok_or_else(|| CniError::new(code::INVALID_CONFIG, "GC needs cni.dev/valid-attachments"))?;
    let items =
        list.as_array().ok_or_else(|| CniError::new(code::DECODE, "cni.dev/valid-attachments must be a list"))?;
    items
        .iter()
        .map(|a| {
            let id = a.get("containerID").and_then(Value::as_str);
            let ifname = a.get("ifname").and_then(Value::as_str);
            match (id, ifname) {
                (Some(i), Some(n)) => Ok((i.to_string(), n.to_string())),
                _ => Err(CniError::new(code::DECODE, format!("invalid attachment {a}: needs containerID and ifname"))),
            }
        })
        .collect()
}

/// GC: releases every reservation whose attachment is not in the valid list.
pub fn gc(conf: &IpamConfig, valid: &BTreeSet<(String, String)>) -> Result<Vec<IpAddr>> {
    let store = Store::open_locked(&conf.store_dir())?;
    let mut released = Vec::new();
    for (ip, id, ifname) in store.entries()? {
        let keep =
            valid.contains(&(id.clone(), ifname.clone())) || (ifname.is_empty() && valid.iter().any(|(i, _)| *i == id));
        if !keep {
            store.unreserve(ip)?;
            released.push(ip);
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Command;
    use serde_json::json;

    fn range(subnet: &str, start: &str, end: &str, gw: &str) -> Range {
        Range {
            subnet: subnet.parse().unwrap(),
            start: start.parse().unwrap(),
            end: end.parse().unwrap(),
            gateway: gw.parse().unwrap(),
        }
    }

    #[test]
    fn round_robin_skips_gateway_and_taken_and_wraps() {
        let set = vec![range("10.0.0.0/29", "10.0.0.1", "10.0.0.6", "10.0.0.1")];
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(next_free(&set, None, |_| false), Some(ip("10.0.0.2")));
        assert_eq!(next_free(&set, Some(ip("10.0.0.3")), |_| false), Some(ip("10.0.0.4")));
        assert_eq!(next_free(&set, Some(ip("10.0.0.6")), |_| false), Some(ip("10.0.0.2")));
        assert_eq!(next_free(&set, Some(ip("10.0.0.4")), |i| i != ip("10.0.0.3")), Some(ip("10.0.0.3")));
        assert_eq!(next_free(&set, None, |_| true), None);
        let two = vec![
            range("10.0.0.0/24", "10.0.0.10", "10.0.0.11", "10.0.0.1"),
            range("10.0.1.0/24", "10.0.1.10", "10.0.1.10", "10.0.1.1"),
        ];
        assert_eq!(next_free(&two, Some(ip("10.0.0.11")), |_| false), Some(ip("10.0.1.10")));
        assert_eq!(next_free(&two, Some(ip("10.0.1.10")), |_| false), Some(ip("10.0.0.10")));
    }

    fn inv(id: &str) -> Invocation {
        Invocation {
            command: Command::Add,
            container_id: id.into(),
            netns: None,
            ifname: "eth0".into(),
            args: vec![],
            path: vec![],
        }
    }

    #[test]
    fn add_del_check_status_gc_on_a_small_pool() {
        let dir = tempfile::tempdir().unwrap();
        let netconf = json!({"cniVersion": "1.1.0", "name": "lab", "ipam": {"type": "podpath-ipam", "dataDir": dir.path(),
                              "ranges": [[{"subnet": "10.9.0.0/29"}]], "routes": [{"dst": "0.0.0.0/0"}]}});
        let conf = IpamConfig::from_netconf(&netconf).unwrap();
        let a = add(&conf, &inv("a"), &netconf).unwrap();
        assert_eq!(a.ips[0].address.to_string(), "10.9.0.2/29");
        assert_eq!(
            a.to_json("1.1.0"),
            json!({"cniVersion": "1.1.0", "ips": [{"address": "10.9.0.2/29", "gateway": "10.9.0.1"}],
                                               "routes": [{"dst": "0.0.0.0/0"}], "dns": {}})
        );
        assert_eq!(add(&conf, &inv("a"), &netconf).unwrap_err().code, code::DUPLICATE_ATTACHMENT);
        check(&conf, &inv("a"), &a).unwrap();
        assert_eq!(check(&conf, &inv("zz"), &a).unwrap_err().code, code::CHECK_FAILED);
        for id in ["b", "c", "d", "e"] {
            add(&conf, &inv(id), &netconf).unwrap();
        }
        assert_eq!(status(&conf).unwrap_err().code, 50);
        assert_eq!(add(&conf, &inv("f"), &netconf).unwrap_err().code, code::POOL_EXHAUSTED);
        del(&conf, &inv("b")).unwrap();
        del(&conf, &inv("b")).unwrap();
        del(&conf, &inv("never")).unwrap();
        status(&conf).unwrap();
        let valid: BTreeSet<_> = [("a".to_string(), "eth0".to_string())].into();
        assert_eq!(gc(&conf, &valid).unwrap().len(), 3);
        let store = Store::open_locked(&conf.store_dir()).unwrap();
        assert_eq!(store.entries().unwrap().len(), 1);
    }

    #[test]
    fn requested_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let mut netconf = json!({"cniVersion": "1.0.0", "name": "lab", "ipam": {"type": "x", "dataDir": dir.path(), "subnet": "10.9.0.0/24"},
                                  "runtimeConfig": {"ips": ["10.9.0.50/24"]}});
        let conf = IpamConfig::from_netconf(&netconf).unwrap();
        assert_eq!(add(&conf, &inv("a"), &netconf).unwrap().ips[0].address.to_string(), "10.9.0.50/24");
        assert_eq!(add(&conf, &inv("b"), &netconf).unwrap_err().code, code::ADDRESS_UNAVAILABLE);
        netconf["runtimeConfig"]["ips"] = json!(["10.8.0.1"]);
        assert_eq!(add(&conf, &inv("c"), &netconf).unwrap_err().code, code::ADDRESS_UNAVAILABLE);
        let mut with_arg = inv("d");
        with_arg.args.push(("IP".into(), "10.9.0.60".into()));
        assert_eq!(add(&conf, &with_arg, &json!({})).unwrap().ips[0].address.to_string(), "10.9.0.60/24");
        assert_eq!(
            valid_attachments(&json!({"cni.dev/attachments": [{"containerID": "a", "ifname": "eth0"}]})).unwrap().len(),
            1
        );
    }

    #[test]
    fn concurrent_adds_get_distinct_addresses() {
        let dir = tempfile::tempdir().unwrap();
        let netconf = json!({"cniVersion": "1.0.0", "name": "lab", "ipam": {"type": "x", "dataDir": dir.path(), "subnet": "10.9.0.0/24"}});
        let conf = IpamConfig::from_netconf(&netconf).unwrap();
        let ips: Vec<IpAddr> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..20)
                .map(|i| {
                    let (conf, netconf) = (&conf, &netconf);
                    s.spawn(move || add(conf, &inv(&format!("c{i}")), netconf).unwrap().ips[0].address.addr())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let distinct: BTreeSet<_> = ips.iter().collect();
        assert_eq!(distinct.len(), 20);
    }
}
