//! networking.k8s.io/v1 NetworkPolicies: defaults, validation and the Table as the real API
//! server has them (`pkg/apis/networking/validation`: label selectors, peers, ports with names
//! and `endPort`, ipBlock with `except`, policyTypes).

use jiff::Timestamp;
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::networking::v1::NetworkPolicy;

const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];
const POLICY_TYPES: [&str; 2] = ["Ingress", "Egress"];

impl ApiObject for NetworkPolicy {
    const KIND: Kind = Kind::NetworkPolicy;
    const INFO: KindInfo = KindInfo {
        group: "networking.k8s.io",
        short_names: &["netpol"],
        has_generation: true,
        ..KindInfo::core("NetworkPolicy", "networkpolicies", "networkpolicy")
    };

    /// As `SetDefaults_NetworkPolicy`: ports without a protocol are TCP; without policyTypes a
    /// policy is for Ingress, and for Egress too when it has egress rules.
    fn apply_defaults(&mut self) {
        let Some(spec) = self.spec.as_mut() else { return };
        let rules = spec
            .ingress
            .iter_mut()
            .flatten()
            .flat_map(|r| r.ports.iter_mut().flatten())
            .chain(spec.egress.iter_mut().flatten().flat_map(|r| r.ports.iter_mut().flatten()));
        for p in rules {
            p.protocol.get_or_insert_with(|| "TCP".into());
        }
        if spec.policy_types.as_ref().is_none_or(Vec::is_empty) {
            let mut types = vec!["Ingress".to_string()];
            if spec.egress.as_ref().is_some_and(|e| !e.is_empty()) {
                types.push("Egress".into());
            }
            spec.policy_types = Some(types);
        }
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let spec = self.spec.clone().unwrap_or_default();
        let path = FieldPath::root("spec");
        if let Some(sel) = &spec.pod_selector {
            v::label_selector(sel, &path.child("podSelector"), &mut out);
        }
        for (i, rule) in spec.ingress.iter().flatten().enumerate() {
            let rp = path.child("ingress").index(i);
            for (j, p) in rule.ports.iter().flatten().enumerate() {
                port(p, &rp.child("ports").index(j), &mut out);
            }
            for (j, peer_) in rule.from.iter().flatten().enumerate() {
                peer(peer_, &rp.child("from").index(j), &mut out);
            }
        }
        for (i, rule) in spec.egress.iter().flatten().enumerate() {
            let rp = path.child("egress").index(i);
            for (j, p) in rule.ports.iter().flatten().enumerate() {
                port(p, &rp.child("ports").index(j), &mut out);
            }
            for (j, peer_) in rule.to.iter().flatten().enumerate() {
                peer(peer_, &rp.child("to").index(j), &mut out);
            }
        }
        let types = spec.policy_types.unwrap_or_default();
        if types.len() > POLICY_TYPES.len() {
            out.push(v::invalid(&path.child("policyTypes"), types.as_slice(), "may not specify more than two policyTypes"));
            return out;
        }
        for (i, t) in types.iter().enumerate() {
            if !POLICY_TYPES.contains(&t.as_str()) {
                out.push(v::not_supported(&path.child("policyTypes").index(i), t.as_str(), &POLICY_TYPES));
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Pod-Selector", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        // No selector, or an empty one, selects every pod of the namespace.
        let selector = crate::apps::format_selector(self.spec.as_ref().and_then(|s| s.pod_selector.as_ref()));
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(selector),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

/// `ValidateNetworkPolicyPort`.
fn port(p: &NetworkPolicyPort, path: &FieldPath, out: &mut Vec<Cause>) {
    if let Some(proto) = &p.protocol {
        if !PROTOCOLS.contains(&proto.as_str()) {
            out.push(v::not_supported(&path.child("protocol"), proto.as_str(), &PROTOCOLS));
        }
    }
    match (&p.port, p.end_port) {
        (Some(IntOrString::Int(n)), end) => {
            if !v::port_in_range(*n) {
                out.push(v::invalid(&path.child("port"), n, v::PORT_RANGE_MSG));
            }
            if let Some(end) = end {
                if end < *n {
                    out.push(v::invalid(&path.child("endPort"), n, "must be greater than or equal to `port`"));
                }
                if !v::port_in_range(end) {
                    out.push(v::invalid(&path.child("endPort"), &end, v::PORT_RANGE_MSG));
                }
            }
        }
        (Some(IntOrString::String(name)), end) => {
            if let Some(end) = end {
                out.push(v::invalid(&path.child("endPort"), &end, "may not be specified when `port` is non-numeric"));
            }
            v::push_all(out, &path.child("port"), name, v::iana_svc_name(name));
        }
        (None, Some(end)) => {
            out.push(v::invalid(&path.child("endPort"), &end, "may not be specified when `port` is not specified"))
        }
        (None, None) => {}
    }
}

/// `ValidateNetworkPolicyPeer`: at least one of the three; ipBlock alone.
fn peer(p: &NetworkPolicyPeer, path: &FieldPath, out: &mut Vec<Cause>) {
    let mut n = 0;
    if let Some(sel) = &p.pod_selector {
        n += 1;
        v::label_selector(sel, &path.child("podSelector"), out);
    }
    if let Some(sel) = &p.namespace_selector {
        n += 1;
        v::label_selector(sel, &path.child("namespaceSelector"), out);
    }
    if let Some(block) = &p.ip_block {
        n += 1;
        ip_block(block, &path.child("ipBlock"), out);
    }
    if n == 0 {
        out.push(v::required(path, "must specify a peer"));
    } else if n > 1 && p.ip_block.is_some() {
        out.push(v::forbidden(path, "may not specify both ipBlock and another peer"));
    }
}

/// `ValidateIPBlock`: a CIDR, and `except` entries strictly inside it.
fn ip_block(b: &IPBlock, path: &FieldPath, out: &mut Vec<Cause>) {
    if b.cidr.is_empty() {
        out.push(v::required(&path.child("cidr"), ""));
        return;
    }
    let Ok(cidr) = b.cidr.parse::<ipnet::IpNet>() else {
        out.push(v::invalid(&path.child("cidr"), b.cidr.as_str(), v::CIDR_MSG));
        return;
    };
    for (i, e) in b.except.iter().flatten().enumerate() {
        let ep = path.child("except").index(i);
        let Ok(except) = e.parse::<ipnet::IpNet>() else {
            out.push(v::invalid(&ep, e.as_str(), v::CIDR_MSG));
            continue;
        };
        if !cidr.contains(&except.network()) || cidr.prefix_len() >= except.prefix_len() {
            out.push(v::invalid(&ep, e.as_str(), "must be a strict subset of `cidr`"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(yaml: &str) -> NetworkPolicy {
        serde_yaml::from_str(&format!("metadata: {{name: p, namespace: default}}\nspec:\n{yaml}")).unwrap()
    }

    fn causes(p: &NetworkPolicy) -> Vec<String> {
        p.validate(None).iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn defaults_are_the_api_servers() {
        let mut p = policy("  podSelector: {}\n  egress: [{ports: [{port: 53}]}]\n  ingress: [{ports: [{port: 80}]}]");
        p.apply_defaults();
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types.as_deref(), Some(&["Ingress".to_string(), "Egress".to_string()][..]));
        assert_eq!(spec.egress.as_ref().unwrap()[0].ports.as_ref().unwrap()[0].protocol.as_deref(), Some("TCP"));
        let mut deny = policy("  podSelector: {matchLabels: {app: web}}");
        deny.apply_defaults();
        assert_eq!(deny.spec.unwrap().policy_types.unwrap(), ["Ingress"]);
        assert_eq!(causes(&p), Vec::<String>::new());
    }

    #[test]
    fn bad_policies_get_the_api_servers_causes() {
        let p = policy(
            r#"  podSelector: {matchExpressions: [{key: app, operator: In}]}
  policyTypes: [Ingress, Sideways]
  ingress:
  - from:
    - ipBlock: {cidr: 10.0.0.0/33}
    - ipBlock: {cidr: 10.0.0.0/16, except: [10.1.0.0/24, 10.0.0.0/16, nope]}
      podSelector: {}
    - {}
    ports:
    - {protocol: ICMP, port: 80}
    - {port: 81, endPort: 80}
    - {port: http, endPort: 90}
    - {endPort: 90}
    - {port: 70000}
  egress:
  - to: [{namespaceSelector: {matchLabels: {"bad key!": x}}}]
"#,
        );
        assert_eq!(
            causes(&p),
            [
                "spec.podSelector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
                "spec.ingress[0].ports[0].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "spec.ingress[0].ports[1].endPort: Invalid value: 81: must be greater than or equal to `port`",
                "spec.ingress[0].ports[2].endPort: Invalid value: 90: may not be specified when `port` is non-numeric",
                "spec.ingress[0].ports[3].endPort: Invalid value: 90: may not be specified when `port` is not specified",
                "spec.ingress[0].ports[4].port: Invalid value: 70000: must be between 1 and 65535, inclusive",
                "spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"10.0.0.0/33\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                "spec.ingress[0].from[1].ipBlock.except[0]: Invalid value: \"10.1.0.0/24\": must be a strict subset of `cidr`",
                "spec.ingress[0].from[1].ipBlock.except[1]: Invalid value: \"10.0.0.0/16\": must be a strict subset of `cidr`",
                "spec.ingress[0].from[1].ipBlock.except[2]: Invalid value: \"nope\": must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)",
                "spec.ingress[0].from[1]: Forbidden: may not specify both ipBlock and another peer",
                "spec.ingress[0].from[2]: Required value: must specify a peer",
                "spec.egress[0].to[0].namespaceSelector.matchLabels: Invalid value: \"bad key!\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "spec.policyTypes[1]: Unsupported value: \"Sideways\": supported values: \"Ingress\", \"Egress\"",
            ]
        );
    }

    #[test]
    fn the_table_shows_the_pod_selector() {
        let p = policy("  podSelector: {matchLabels: {app: web}}");
        assert_eq!(p.cells(Timestamp::now())[..2], [json!("p"), json!("app=web")]);
        let all = policy("  podSelector: {}");
        assert_eq!(all.cells(Timestamp::now())[..2], [json!("p"), json!("<none>")]);
    }
}
