//! kube-proxy's chain names: `base32(sha256(input))[:16]` after a prefix, so a chain of a
//! Service has the same name on a podpath node as on a real one (reference/kube-proxy.md §1.3).

use sha2::{Digest, Sha256};

fn hash16(input: &str) -> String {
    let digest = Sha256::digest(input.as_bytes());
    data_encoding::BASE32.encode(&digest)[..16].to_string()
}

/// The 16 characters shared by a service port's `KUBE-SVC/SVL/EXT/FW` chains.
pub fn service_hash(spn: &str, protocol: &str) -> String {
    hash16(&format!("{spn}{}", protocol.to_ascii_lowercase()))
}

/// `KUBE-SEP-…` of one endpoint (`ip:port`, IPv6 as `[ip]:port`).
pub fn endpoint_chain(spn: &str, protocol: &str, endpoint: &str) -> String {
    format!("KUBE-SEP-{}", hash16(&format!("{spn}{}{endpoint}", protocol.to_ascii_lowercase())))
}

/// The prefixes of per-service nat chains (what stale-chain cleanup may delete).
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"];

pub fn is_service_chain(name: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ServicePortName;

    /// The values of kube-proxy's own golden tests.
    #[test]
    fn names_match_kube_proxy() {
        let spn = ServicePortName::new("ns1", "svc1", "p80").to_string();
        assert_eq!(format!("KUBE-SVC-{}", service_hash(&spn, "TCP")), "KUBE-SVC-XPGD46QRK7WJZT7O");
        assert_eq!(endpoint_chain(&spn, "tcp", "10.180.0.1:80"), "KUBE-SEP-SXIVWICOYRO3J4NJ");
        assert_eq!(service_hash("ns4/svc4:p80", "tcp"), "4SW47YFZTEDKD3PK");
        assert_eq!(service_hash("ns5/svc5:p80", "tcp"), "NUKIZ6OKUXPJNT4C");
        assert_eq!(ServicePortName::new("default", "web", "").to_string(), "default/web");
        assert!(is_service_chain("KUBE-FW-NUKIZ6OKUXPJNT4C") && !is_service_chain("KUBE-SERVICES"));
    }
}
