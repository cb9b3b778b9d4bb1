//! The bridge plugin's configuration, validated before anything is touched (code 7 for a bad
//! network config), and the deterministic names it derives.

use serde_json::Value;
use sha2::{Digest, Sha512};

use crate::env::ifname_problem;
use crate::error::{code, CniError, Result};
use crate::types::Dns;

/// The bridge used when the config names none (as the reference plugin does).
pub const DEFAULT_BRIDGE: &str = "cni0";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    /// The network name.
    pub name: String,
    pub bridge: String,
    pub mtu: Option<u32>,
    pub is_gateway: bool,
    pub is_default_gateway: bool,
    pub force_address: bool,
    pub ip_masq: bool,
    pub hairpin_mode: bool,
    pub promisc_mode: bool,
    /// podpath's `routeSameBridge`: every port isolated (`bridge_slave isolated on`) and the
    /// gateway answering ARP for the whole subnet, so traffic between two containers of the
    /// bridge is routed by the host, where its filters (NetworkPolicy) see it, instead of
    /// switched past them.
    pub route_same_bridge: bool,
    /// The IPAM plugin to delegate to (any plugin found through CNI_PATH).
    pub ipam_type: String,
    pub dns: Dns,
}

fn invalid(msg: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg)
}

fn flag(conf: &Value, key: &str) -> Result<bool> {
    match conf.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(invalid(format!("{key} must be true or false, not {other}"))),
    }
}

impl BridgeConfig {
    pub fn from_netconf(conf: &Value) -> Result<BridgeConfig> {
        let name = conf.get("name").and_then(Value::as_str).unwrap_or("");
        let mut chars = name.chars();
        let name_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-');
        if !name_ok {
            return Err(invalid(format!("invalid network name {name:?}: must match ^[A-Za-z0-9][A-Za-z0-9_.-]*$")));
        }
        let bridge = match conf.get("bridge") {
            None | Some(Value::Null) => DEFAULT_BRIDGE.to_string(),
            Some(Value::String(b)) => b.clone(),
            Some(other) => return Err(invalid(format!("bridge must be a string, not {other}"))),
        };
        if let Some(problem) = ifname_problem(&bridge) {
            return Err(invalid(format!("invalid bridge name {bridge:?}: it {problem}")));
        }
        let mtu = match conf.get("mtu") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64() {
                Some(m) if (68..=65535).contains(&m) => Some(m as u32),
                _ => return Err(invalid(format!("invalid mtu {v}: must be between 68 and 65535"))),
            },
        };
        let is_default_gateway = flag(conf, "isDefaultGateway")?;
        // A default gateway is a gateway (as in the reference plugin).
        let is_gateway = flag(conf, "isGateway")? || is_default_gateway;
        let hairpin_mode = flag(conf, "hairpinMode")?;
        let promisc_mode = flag(conf, "promiscMode")?;
        if hairpin_mode && promisc_mode {
            return Err(invalid("cannot set hairpinMode and promiscMode at the same time"));
        }
        let route_same_bridge = flag(conf, "routeSameBridge")?;
        if route_same_bridge && !is_gateway {
            return Err(invalid("routeSameBridge needs isGateway: the gateway routes between the isolated ports"));
        }
        let ipam_type = conf.pointer("/ipam/type").and_then(Value::as_str).unwrap_or("");
        if ipam_type.is_empty() || ipam_type.contains('/') {
            return Err(invalid(format!(
                "invalid ipam.type {ipam_type:?}: the name of an IPAM plugin in CNI_PATH is required"
            )));
        }
        Ok(BridgeConfig {
            name: name.to_string(),
            bridge,
            mtu,
            is_gateway,
            is_default_gateway,
            force_address: flag(conf, "forceAddress")?,
            ip_masq: flag(conf, "ipMasq")?,
            hairpin_mode,
            promisc_mode,
            route_same_bridge,
            ipam_type: ipam_type.to_string(),
            dns: Dns::from_json(conf.get("dns")),
        })
    }
}

/// The NAT chain of one attachment: `CNI-` + 24 hex digits of sha512(network + container id),
/// the reference plugin's name, so DEL finds it even when the netns is gone.
pub fn masq_chain(network: &str, container_id: &str) -> String {
    let digest = Sha512::digest(format!("{network}{container_id}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("CNI-{}", &hex[..24])
}

/// The comment on every NAT rule of an attachment (the reference's format).
pub fn masq_comment(network: &str, container_id: &str) -> String {
    format!("name: {network:?} id: {container_id:?}")
}

/// The host end of an attachment's veth pair: `veth` + 8 hex digits derived from the container
/// id and interface, so DEL can find it without the netns (the reference picks a random name).
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let digest = Sha512::digest(format!("{container_id}/{ifname}").as_bytes());
    format!("veth{:02x}{:02x}{:02x}{:02x}", digest[0], digest[1], digest[2], digest[3])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chain_name_matches_the_reference() {
        // From shared/reference/cni.md §3.5: printf %s cnitest-r7q2ctr-r7q2-a | sha512sum
        assert_eq!(masq_chain("cnitest-r7q2", "ctr-r7q2-a"), "CNI-23763f9d7153273248682bf8");
        assert_eq!(masq_chain("a", "b").len(), 28);
        assert_eq!(masq_comment("net", "ctr"), "name: \"net\" id: \"ctr\"");
        let v = host_veth_name("ctr", "eth0");
        assert_eq!((v.len(), &v[..4]), (12, "veth"));
        assert_ne!(host_veth_name("ctr", "eth1"), v);
    }

    #[test]
    fn config_defaults_and_errors() {
        let base =
            json!({"cniVersion": "1.0.0", "name": "lab", "type": "podpath-bridge", "ipam": {"type": "podpath-ipam"}});
        let c = BridgeConfig::from_netconf(&base).unwrap();
        assert_eq!((c.bridge.as_str(), c.is_gateway, c.ip_masq), ("cni0", false, false));
        let mut dg = base.clone();
        dg["isDefaultGateway"] = json!(true);
        assert!(BridgeConfig::from_netconf(&dg).unwrap().is_gateway);
        let bad = [
            ("bridge", json!("a-bridge-name-too-long")),
            ("mtu", json!(10)),
            ("ipMasq", json!("yes")),
            ("ipam", json!({})),
            ("ipam", json!({"type": "../x"})),
            ("name", json!("")),
        ];
        for (k, v) in bad {
            let mut c = base.clone();
            c[k] = v.clone();
            assert_eq!(BridgeConfig::from_netconf(&c).unwrap_err().code, 7, "{k}={v}");
        }
        let mut both = base.clone();
        both["hairpinMode"] = json!(true);
        both["promiscMode"] = json!(true);
        assert_eq!(BridgeConfig::from_netconf(&both).unwrap_err().code, 7);
    }
}
