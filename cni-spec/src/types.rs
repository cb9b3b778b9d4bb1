//! CNI result types and their JSON in every supported version's format.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{json, Map, Value};

use crate::error::{code, CniError, Result};
use crate::version;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Interface {
    pub name: String,
    pub mac: String,
    /// The netns path, for interfaces inside the container.
    pub sandbox: Option<String>,
    pub mtu: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpConfig {
    pub address: IpNet,
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` (absent in IPAM results).
    pub interface: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNet,
    pub gw: Option<IpAddr>,
}

impl Route {
    /// The gateway the route uses: its own `gw`, or else the gateway of the address of the same
    /// family (the spec's rule for routes without `gw`).
    pub fn effective_gw(&self, ips: &[IpConfig]) -> Option<IpAddr> {
        self.gw.or_else(|| {
            ips.iter().find(|ip| ip.address.addr().is_ipv4() == self.dst.addr().is_ipv4()).and_then(|ip| ip.gateway)
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dns {
    pub nameservers: Vec<String>,
    pub domain: Option<String>,
    pub search: Vec<String>,
    pub options: Vec<String>,
}

/// An ADD result (also the `prevResult` of DEL and CHECK).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CniResult {
    pub interfaces: Vec<Interface>,
    pub ips: Vec<IpConfig>,
    pub routes: Vec<Route>,
    pub dns: Dns,
}

fn decode_err(what: &str, e: impl std::fmt::Display) -> CniError {
    CniError::new(code::DECODE, format!("invalid {what} in result: {e}"))
}

impl Dns {
    pub fn from_json(v: Option<&Value>) -> Dns {
        let list = |k: &str| -> Vec<String> {
            v.and_then(|d| d.get(k))
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        Dns {
            nameservers: list("nameservers"),
            domain: v.and_then(|d| d.get("domain")).and_then(Value::as_str).map(str::to_string),
            search: list("search"),
            options: list("options"),
        }
    }

    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        if !self.nameservers.is_empty() {
            m.insert("nameservers".into(), json!(self.nameservers));
        }
        if let Some(d) = &self.domain {
            m.insert("domain".into(), json!(d));
        }
        if !self.search.is_empty() {
            m.insert("search".into(), json!(self.search));
        }
        if !self.options.is_empty() {
            m.insert("options".into(), json!(self.options));
        }
        Value::Object(m)
    }
}

impl CniResult {
    /// Parses a result of any supported version (0.3.x/0.4.0 `ips[].version` is ignored).
    pub fn from_json(v: &Value) -> Result<CniResult> {
        let mut r = CniResult::default();
        for i in v.get("interfaces").and_then(Value::as_array).into_iter().flatten() {
            r.interfaces.push(Interface {
                name: i.get("name").and_then(Value::as_str).unwrap_or_default().to_string(),
                mac: i.get("mac").and_then(Value::as_str).unwrap_or_default().to_string(),
                sandbox: i.get("sandbox").and_then(Value::as_str).map(str::to_string),
                mtu: i.get("mtu").and_then(Value::as_u64).map(|m| m as u32),
            });
        }
        for ip in v.get("ips").and_then(Value::as_array).into_iter().flatten() {
            let address =
                ip.get("address").and_then(Value::as_str).ok_or_else(|| decode_err("ips[].address", "missing"))?;
            r.ips.push(IpConfig {
                address: address.parse().map_err(|e| decode_err("ips[].address", e))?,
                gateway: ip
                    .get("gateway")
                    .and_then(Value::as_str)
                    .map(|g| g.parse())
                    .transpose()
                    .map_err(|e| decode_err("ips[].gateway", e))?,
                interface: ip.get("interface").and_then(Value::as_u64).map(|i| i as usize),
            });
        }
        for rt in v.get("routes").and_then(Value::as_array).into_iter().flatten() {
            let dst = rt.get("dst").and_then(Value::as_str).ok_or_else(|| decode_err("routes[].dst", "missing"))?;
            r.routes.push(Route {
                dst: dst.parse().map_err(|e| decode_err("routes[].dst", e))?,
                gw: rt
                    .get("gw")
                    .and_then(Value::as_str)
                    .map(|g| g.parse())
                    .transpose()
                    .map_err(|e| decode_err("routes[].gw", e))?,
            });
        }
        r.dns = Dns::from_json(v.get("dns"));
        Ok(r)
    }

    /// The result in the format of `cni_version`. `interfaces` is left out when empty (IPAM
    /// results are abbreviated).
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut out = json!({"cniVersion": cni_version});
        if !self.interfaces.is_empty() {
            let ifs: Vec<Value> = self
                .interfaces
                .iter()
                .map(|i| {
                    let mut v = json!({"name": i.name, "mac": i.mac});
                    if let Some(s) = &i.sandbox {
                        v["sandbox"] = json!(s);
                    }
                    if let (Some(m), true) = (i.mtu, version::is_1_1(cni_version)) {
                        v["mtu"] = json!(m);
                    }
                    v
                })
                .collect();
            out["interfaces"] = json!(ifs);
        }
        let ips: Vec<Value> = self
            .ips
            .iter()
            .map(|ip| {
                let mut v = json!({"address": ip.address.to_string()});
                if version::has_ip_version(cni_version) {
                    v["version"] = json!(if ip.address.addr().is_ipv4() { "4" } else { "6" });
                }
                if let Some(i) = ip.interface {
                    v["interface"] = json!(i);
                }
                if let Some(g) = ip.gateway {
                    v["gateway"] = json!(g.to_string());
                }
                v
            })
            .collect();
        out["ips"] = json!(ips);
        if !self.routes.is_empty() {
            let routes: Vec<Value> = self
                .routes
                .iter()
                .map(|r| {
                    let mut v = json!({"dst": r.dst.to_string()});
                    if let Some(g) = r.gw {
                        v["gw"] = json!(g.to_string());
                    }
                    v
                })
                .collect();
            out["routes"] = json!(routes);
        }
        out["dns"] = self.dns.to_json();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CniResult {
        CniResult {
            interfaces: vec![Interface {
                name: "eth0".into(),
                mac: "0a:00:00:00:00:01".into(),
                sandbox: Some("/run/netns/x".into()),
                mtu: Some(1500),
            }],
            ips: vec![IpConfig {
                address: "10.244.1.2/24".parse().unwrap(),
                gateway: Some("10.244.1.1".parse().unwrap()),
                interface: Some(0),
            }],
            routes: vec![Route { dst: "0.0.0.0/0".parse().unwrap(), gw: None }],
            dns: Dns { nameservers: vec!["10.96.0.10".into()], ..Default::default() },
        }
    }

    #[test]
    fn formats_per_version_and_round_trips() {
        let r = sample();
        let v11 = r.to_json("1.1.0");
        assert_eq!(v11["interfaces"][0]["mtu"], 1500);
        assert!(v11["ips"][0].get("version").is_none());
        let v10 = r.to_json("1.0.0");
        assert!(v10["interfaces"][0].get("mtu").is_none());
        let v04 = r.to_json("0.4.0");
        assert_eq!(v04["ips"][0]["version"], "4");
        for v in [&v11, &v10, &v04] {
            let back = CniResult::from_json(v).unwrap();
            assert_eq!(back.ips, r.ips);
            assert_eq!(back.routes, r.routes);
        }
        let ipam = CniResult { interfaces: vec![], ..sample() }.to_json("1.0.0");
        assert!(ipam.get("interfaces").is_none());
        assert!(CniResult::from_json(&json!({"ips": [{"address": "nope"}]})).is_err());
    }
}
