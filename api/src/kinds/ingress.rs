//! networking.k8s.io/v1 Ingresses: validation, the pool address an Ingress of the lab's class gets
//! (as a cloud's L7 load balancer would), and the Table. lb-sim serves them.

use std::collections::BTreeSet;

use k8s_openapi::api::networking::v1::{
    IngressBackend, IngressLoadBalancerIngress, IngressLoadBalancerStatus, IngressStatus,
};
use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};
use crate::alloc::{lb_ip_key, AllocKey, Allocate, Exhausted, IpFamily, Ranges};
use crate::networking::is_lab_ingress;

pub use k8s_openapi::api::networking::v1::Ingress;

const PATH_TYPES: [&str; 3] = ["Exact", "ImplementationSpecific", "Prefix"];

fn validate_backend(b: &IngressBackend, path: &FieldPath, out: &mut Vec<Cause>) {
    match (&b.service, &b.resource) {
        (Some(_), Some(_)) => out.push(v::invalid(path, "", "cannot set both resource and service backends")),
        (None, None) => out.push(v::invalid(path, "", "resource or service backend is required")),
        (None, Some(_)) => {}
        (Some(svc), None) => {
            let sp = path.child("service");
            if svc.name.is_empty() {
                out.push(v::required(&sp.child("name"), ""));
            } else {
                v::push_all(out, &sp.child("name"), &svc.name, v::dns1035_label(&svc.name));
            }
            let port = svc.port.clone().unwrap_or_default();
            let pp = sp.child("port");
            match (port.name.as_deref().filter(|n| !n.is_empty()), port.number.filter(|n| *n != 0)) {
                (Some(_), Some(_)) => out.push(v::invalid(&pp, "", "cannot set both port name & port number")),
                (None, None) => out.push(v::invalid(&pp, "", "port name or number is required")),
                (Some(name), None) => v::push_all(out, &pp.child("name"), name, v::iana_svc_name(name)),
                (None, Some(n)) => {
                    if !v::port_in_range(n) {
                        out.push(v::invalid(&pp.child("number"), &n, v::PORT_RANGE_MSG));
                    }
                }
            }
        }
    }
}

/// A rule's or a TLS entry's host: a DNS name (a leading `*.` wildcard allowed), not an IP.
fn validate_host(host: &str, path: &FieldPath, out: &mut Vec<Cause>) {
    if v::valid_ip(host).is_some() {
        out.push(v::invalid(path, host, "must be a DNS name, not an IP address"));
        return;
    }
    let name = host.strip_prefix("*.").unwrap_or(host);
    v::push_all(out, path, host, v::dns1123_subdomain(name));
}

/// The addresses in `status.loadBalancer.ingress`.
fn lb_ips(ing: &Ingress) -> impl Iterator<Item = &str> {
    let lb = ing.status.as_ref().and_then(|s| s.load_balancer.as_ref());
    lb.and_then(|l| l.ingress.as_ref()).into_iter().flatten().filter_map(|i| i.ip.as_deref())
}

impl ApiObject for Ingress {
    const KIND: Kind = Kind::Ingress;
    const INFO: KindInfo = KindInfo {
        group: "networking.k8s.io",
        short_names: &["ing"],
        has_status: true,
        ..KindInfo::core("Ingress", "ingresses", "ingress")
    };

    fn prepare_for_create(&mut self) {
        self.status = Some(k8s_openapi::api::networking::v1::IngressStatus {
            load_balancer: Some(Default::default()),
        });
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let path = FieldPath::root("spec");
        let spec = self.spec.clone().unwrap_or_default();
        let rules = spec.rules.clone().unwrap_or_default();
        if spec.default_backend.is_none() && rules.is_empty() {
            out.push(v::invalid(&path, "", "either `defaultBackend` or `rules` must be specified"));
        }
        if let Some(b) = &spec.default_backend {
            validate_backend(b, &path.child("defaultBackend"), &mut out);
        }
        if let Some(class) = spec.ingress_class_name.as_deref() {
            v::push_all(&mut out, &path.child("ingressClassName"), class, v::dns1123_subdomain(class));
        }
        for (i, rule) in rules.iter().enumerate() {
            let rp = path.child("rules").index(i);
            if let Some(host) = rule.host.as_deref().filter(|h| !h.is_empty()) {
                validate_host(host, &rp.child("host"), &mut out);
            }
            let Some(http) = &rule.http else { continue };
            let hp = rp.child("http").child("paths");
            if http.paths.is_empty() {
                out.push(v::required(&hp, ""));
            }
            for (j, p) in http.paths.iter().enumerate() {
                let pp = hp.index(j);
                match p.path_type.as_str() {
                    "" => out.push(v::required(&pp.child("pathType"), "pathType must be specified")),
                    t if !PATH_TYPES.contains(&t) => out.push(v::not_supported(&pp.child("pathType"), t, &PATH_TYPES)),
                    _ => {}
                }
                let value = p.path.clone().unwrap_or_default();
                if matches!(p.path_type.as_str(), "Exact" | "Prefix") && !value.starts_with('/') {
                    out.push(v::invalid(&pp.child("path"), value.as_str(), "must be an absolute path"));
                }
                validate_backend(&p.backend, &pp.child("backend"), &mut out);
            }
        }
        for (i, tls) in spec.tls.iter().flatten().enumerate() {
            for (j, host) in tls.hosts.iter().flatten().enumerate() {
                validate_host(host, &path.child("tls").index(i).child("hosts").index(j), &mut out);
            }
            if let Some(secret) = tls.secret_name.as_deref().filter(|s| !s.is_empty()) {
                let sp = path.child("tls").index(i).child("secretName");
                v::push_all(&mut out, &sp, secret, v::dns1123_subdomain(secret));
            }
        }
        out
    }

    /// An address from the LoadBalancer pool for an Ingress of the lab's class, as a cloud's L7
    /// load balancer gets one: written to `status.loadBalancer.ingress`, kept for its life. A
    /// full pool leaves the Ingress without an address, as a cloud would.
    fn allocate(&mut self, _old: Option<&Self>, alloc: &mut dyn Allocate, _causes: &mut Vec<Cause>) -> Result<(), Exhausted> {
        let lb = self.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        let has_ip = lb.and_then(|l| l.ingress.as_ref()).and_then(|i| i.first()).is_some_and(|i| i.ip.is_some());
        if has_ip || !is_lab_ingress(self) {
            return Ok(());
        }
        let family = alloc.ranges().lb_pools.first().map(IpFamily::of_net).unwrap_or(IpFamily::V4);
        if let Ok(ip) = alloc.lb_ip(family, None) {
            let ingress = IngressLoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() };
            let load_balancer = IngressLoadBalancerStatus { ingress: Some(vec![ingress]) };
            self.status = Some(IngressStatus { load_balancer: Some(load_balancer) });
        }
        Ok(())
    }

    fn allocations(&self, ranges: &Ranges) -> BTreeSet<AllocKey> {
        lb_ips(self).filter(|ip| ranges.in_lb_pool(ip)).map(lb_ip_key).collect()
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Class", "string", 0),
            col("Hosts", "string", 0),
            col("Address", "string", 0),
            col("Ports", "string", 0),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let hosts: Vec<String> =
            spec.rules.iter().flatten().filter_map(|r| r.host.clone()).filter(|h| !h.is_empty()).collect();
        let hosts = match hosts.len() {
            0 => "*".to_string(),
            1..=4 => hosts.join(","),
            n => format!("{} + {} more...", hosts[..4].join(","), n - 4),
        };
        let address: Vec<String> = self
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone()))
            .collect();
        let ports = if spec.tls.as_ref().is_some_and(|t| !t.is_empty()) { "80, 443" } else { "80" };
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(spec.ingress_class_name.clone().unwrap_or_else(|| "<none>".into())),
            json!(hosts),
            json!(address.join(",")),
            json!(ports),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ingress(yaml: &str) -> Ingress {
        serde_yaml::from_str(yaml).unwrap()
    }

    const WEB: &str = "
metadata: {name: web}
spec:
  defaultBackend: {service: {name: default-http, port: {number: 80}}}
  rules:
  - host: shop.example
    http:
      paths:
      - {path: /cart, pathType: Prefix, backend: {service: {name: cart, port: {number: 80}}}}
      - {path: /, pathType: Exact, backend: {service: {name: web, port: {name: http}}}}
";

    #[test]
    fn a_valid_ingress_has_no_causes_and_kubectls_cells() {
        let mut ing = ingress(WEB);
        assert_eq!(ing.validate(None), vec![]);
        ing.status = serde_json::from_value(json!({"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}})).unwrap();
        let cells = ing.cells(Timestamp::now());
        assert_eq!(
            cells[..5],
            [json!("web"), json!("<none>"), json!("shop.example"), json!("198.51.100.7"), json!("80")]
        );
        assert!(is_lab_ingress(&ing));
    }

    #[test]
    fn mistakes_are_named_as_the_api_server_names_them() {
        let cases = [
            ("spec: {}", "spec: Invalid value: \"\": either `defaultBackend` or `rules` must be specified"),
            (
                "spec: {rules: [{host: 10.0.0.1, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: a, port: {number: 80}}}}]}}]}",
                "spec.rules[0].host: Invalid value: \"10.0.0.1\": must be a DNS name, not an IP address",
            ),
            (
                "spec: {rules: [{http: {paths: [{path: cart, pathType: Prefix, backend: {service: {name: a, port: {number: 80}}}}]}}]}",
                "spec.rules[0].http.paths[0].path: Invalid value: \"cart\": must be an absolute path",
            ),
            (
                "spec: {rules: [{http: {paths: [{path: /, pathType: Regex, backend: {service: {name: a, port: {number: 80}}}}]}}]}",
                "spec.rules[0].http.paths[0].pathType: Unsupported value: \"Regex\": supported values: \"Exact\", \"ImplementationSpecific\", \"Prefix\"",
            ),
            (
                "spec: {defaultBackend: {service: {name: a, port: {name: http, number: 80}}}}",
                "spec.defaultBackend.service.port: Invalid value: \"\": cannot set both port name & port number",
            ),
            (
                "spec: {defaultBackend: {service: {name: a, port: {}}}}",
                "spec.defaultBackend.service.port: Invalid value: \"\": port name or number is required",
            ),
        ];
        for (yaml, want) in cases {
            let mut ing = ingress(&format!("metadata: {{name: x}}\n{yaml}"));
            ing.apply_defaults();
            let causes: Vec<String> = ing.validate(None).iter().map(|c| c.to_string()).collect();
            assert!(causes.iter().any(|c| c == want), "{yaml}: {causes:?}");
        }
    }

    #[test]
    fn other_classes_are_not_the_labs() {
        let ing = ingress("metadata: {name: x}\nspec: {ingressClassName: nginx, defaultBackend: {service: {name: a, port: {number: 80}}}}");
        assert!(!is_lab_ingress(&ing));
        let cells = ing.cells(Timestamp::now());
        assert_eq!(cells[1..3], [json!("nginx"), json!("*")]);
    }
}
