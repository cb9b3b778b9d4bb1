//! The IPAM section of a network config, host-local compatible: `ranges` (a list of range sets,
//! each a list of ranges) or the flat `subnet`/`rangeStart`/`rangeEnd`/`gateway`, `routes`,
//! `dataDir`. Everything is validated before any state is touched.

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;
use serde_json::Value;

use crate::error::{code, CniError, Result};
use crate::types::Route;

/// Where host-local keeps its store; podpath-ipam uses the same layout and default.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/networks";

/// One allocatable range with its first/last address and gateway resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: IpAddr,
}

impl Range {
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.subnet.contains(&ip) && ip >= self.start && ip <= self.end
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    /// The network name (the store directory).
    pub name: String,
    pub range_sets: Vec<Vec<Range>>,
    pub routes: Vec<Route>,
    pub data_dir: PathBuf,
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg)
}

fn add(ip: IpAddr, n: i64) -> Option<IpAddr> {
    match ip {
        IpAddr::V4(v) => u32::from(v).checked_add_signed(n as i32).map(|x| IpAddr::V4(x.into())),
        IpAddr::V6(v) => u128::from(v).checked_add_signed(n as i128).map(|x| IpAddr::V6(x.into())),
    }
}

/// The next address (wrapping inside nothing: None past the end of the family).
pub fn next_ip(ip: IpAddr) -> Option<IpAddr> {
    add(ip, 1)
}

fn parse_ip(v: &Value, field: &str) -> Result<Option<IpAddr>> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => {
            s.parse().map(Some).map_err(|_| invalid(format!("invalid {field} {s:?}: not an IP address")))
        }
        Some(other) => Err(invalid(format!("invalid {field} {other}: not a string"))),
    }
}

fn parse_range(v: &Value) -> Result<Range> {
    let subnet_s = v.get("subnet").and_then(Value::as_str).ok_or_else(|| invalid("a range needs a subnet"))?;
    let subnet: IpNet = subnet_s.parse().map_err(|_| invalid(format!("invalid subnet {subnet_s:?}")))?;
    let subnet = subnet.trunc();
    let host_bits = subnet.max_prefix_len() - subnet.prefix_len();
    // A network, a gateway and at least one address to hand out.
    if host_bits < 2 {
        return Err(invalid(format!("network {subnet} is too small to allocate from")));
    }
    let first = add(subnet.network(), 1).expect("inside the family");
    let last =
        if subnet.network().is_ipv4() { add(subnet.broadcast(), -1).expect("inside") } else { subnet.broadcast() };
    let gateway = parse_ip(v, "gateway")?.unwrap_or(first);
    if !subnet.contains(&gateway) {
        return Err(invalid(format!("gateway {gateway} is outside the subnet {subnet}")));
    }
    let start = parse_ip(v, "rangeStart")?.unwrap_or(first);
    let end = parse_ip(v, "rangeEnd")?.unwrap_or(last);
    for (name, ip) in [("rangeStart", start), ("rangeEnd", end)] {
        if !subnet.contains(&ip) || ip < first || ip > last {
            return Err(invalid(format!("{name} {ip} is not a usable address of the subnet {subnet}")));
        }
    }
    if start > end {
        return Err(invalid(format!("rangeStart {start} is after rangeEnd {end}")));
    }
    Ok(Range { subnet, start, end, gateway })
}

/// A network name usable as a directory name.
fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
}

impl IpamConfig {
    /// Reads the IPAM settings from the whole request config.
    pub fn from_netconf(conf: &Value) -> Result<IpamConfig> {
        let name = conf.get("name").and_then(Value::as_str).unwrap_or("");
        if !valid_name(name) {
            return Err(invalid(format!("invalid network name {name:?}: must match ^[A-Za-z0-9][A-Za-z0-9_.-]*$")));
        }
        let ipam =
            conf.get("ipam").filter(|v| v.is_object()).ok_or_else(|| invalid("the config has no ipam section"))?;
        let mut range_sets = Vec::new();
        match ipam.get("ranges") {
            Some(Value::Array(sets)) => {
                for set in sets {
                    let ranges =
                        set.as_array().ok_or_else(|| invalid("ipam.ranges must be a list of lists of ranges"))?;
                    if ranges.is_empty() {
                        return Err(invalid("an ipam.ranges set is empty"));
                    }
                    range_sets.push(ranges.iter().map(parse_range).collect::<Result<Vec<_>>>()?);
                }
            }
            Some(_) => return Err(invalid("ipam.ranges must be a list of lists of ranges")),
            None if ipam.get("subnet").is_some() => range_sets.push(vec![parse_range(ipam)?]),
            None => {}
        }
        if range_sets.is_empty() {
            return Err(invalid("ipam needs ranges (or a subnet)"));
        }
        for set in &range_sets {
            let v4 = set[0].subnet.network().is_ipv4();
            if set.iter().any(|r| r.subnet.network().is_ipv4() != v4) {
                return Err(invalid("a range set mixes IPv4 and IPv6"));
            }
            for (i, a) in set.iter().enumerate() {
                for b in &set[i + 1..] {
                    if a.contains(b.start) || a.contains(b.end) || b.contains(a.start) {
                        return Err(invalid(format!("ranges {}-{} and {}-{} overlap", a.start, a.end, b.start, b.end)));
                    }
                }
            }
        }
        let mut routes = Vec::new();
        for r in ipam.get("routes").and_then(Value::as_array).into_iter().flatten() {
            let dst = r.get("dst").and_then(Value::as_str).ok_or_else(|| invalid("a route needs dst"))?;
            routes.push(Route {
                dst: dst.parse().map_err(|_| invalid(format!("invalid route dst {dst:?}")))?,
                gw: parse_ip(r, "gw")?,
            });
        }
        let data_dir =
            ipam.get("dataDir").and_then(Value::as_str).filter(|d| !d.is_empty()).unwrap_or(DEFAULT_DATA_DIR);
        Ok(IpamConfig { name: name.to_string(), range_sets, routes, data_dir: PathBuf::from(data_dir) })
    }

    /// The store directory of this network.
    pub fn store_dir(&self) -> PathBuf {
        self.data_dir.join(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn conf(ipam: Value) -> Value {
        json!({"cniVersion": "1.0.0", "name": "lab", "type": "podpath-bridge", "ipam": ipam})
    }

    #[test]
    fn defaults_like_host_local() {
        let c =
            IpamConfig::from_netconf(&conf(json!({"type": "podpath-ipam", "ranges": [[{"subnet": "10.244.1.0/24"}]],
                                                       "routes": [{"dst": "0.0.0.0/0"}]})))
            .unwrap();
        let r = &c.range_sets[0][0];
        assert_eq!(r.gateway.to_string(), "10.244.1.1");
        assert_eq!(r.start.to_string(), "10.244.1.1");
        assert_eq!(r.end.to_string(), "10.244.1.254");
        assert_eq!(c.store_dir(), PathBuf::from("/var/lib/cni/networks/lab"));
        let flat = IpamConfig::from_netconf(&conf(json!({"type": "x", "subnet": "10.0.0.0/30", "dataDir": "/tmp/d"})))
            .unwrap();
        assert_eq!(flat.range_sets[0][0].end.to_string(), "10.0.0.2");
        assert_eq!(flat.store_dir(), PathBuf::from("/tmp/d/lab"));
    }

    #[test]
    fn bad_configs_are_code_7() {
        let cases = [
            json!({"ranges": [[{"subnet": "10.0.0.0/24", "gateway": "10.0.1.1"}]]}),
            json!({"ranges": [[{"subnet": "10.0.0.0/31"}]]}),
            json!({"ranges": [[{"subnet": "nope"}]]}),
            json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeStart": "10.0.0.200", "rangeEnd": "10.0.0.100"}]]}),
            json!({"ranges": [[{"subnet": "10.0.0.0/24", "rangeEnd": "10.0.0.255"}]]}),
            json!({"ranges": [[{"subnet": "10.0.0.0/24"}, {"subnet": "10.0.0.0/25"}]]}),
            json!({"ranges": []}),
            json!({"ranges": [[]]}),
            json!({}),
        ];
        for c in cases {
            let err = IpamConfig::from_netconf(&conf(c.clone())).unwrap_err();
            assert_eq!(err.code, 7, "{c}: {err}");
        }
        let err = IpamConfig::from_netconf(&json!({"name": "../x", "ipam": {"subnet": "10.0.0.0/24"}})).unwrap_err();
        assert_eq!(err.code, 7);
    }
}
