//! The L7 load balancer (GCLB-style): every Ingress of the lab's class gets a site on its
//! address (from the LoadBalancer pool, written to its status by the API server): HTTP on :80,
//! HTTPS on :443 when the Ingress has `tls` (the certificate of its TLS Secret, or a generated
//! one). Requests are routed by host and path to the backend Service's NodePort on the nodes in
//! rotation (the instance-group model), with `X-Forwarded-For`/`X-Forwarded-Proto`.
//!
//! [`sites`] and [`Site::route`] are pure; [`crate::l7_proxy`] serves them.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1::{Ingress, IngressBackend};
use serde::Serialize;

/// How a path rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PathKind {
    Exact,
    /// `Prefix`, and `ImplementationSpecific`, which this implementation treats as Prefix.
    Prefix,
}

/// Where matching requests go: a Service port, and the NodePort it is reached on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    /// `namespace/name` of the Service.
    pub service: String,
    /// The Service port as the Ingress names it (`80` or `http`).
    pub port: String,
    /// `None`: the Service has no such port, or no NodePort for it (a ClusterIP Service).
    pub node_port: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathRule {
    pub path: String,
    pub kind: PathKind,
    pub target: Target,
}

/// The paths of one host (`""`: any host; `*.example`: one label under example).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostRule {
    pub host: String,
    pub paths: Vec<PathRule>,
}

/// PEM certificate chain and key of a site's HTTPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Certificate {
    /// From the Ingress's TLS Secret (`namespace/name`).
    Secret { secret: String, cert_pem: Vec<u8>, key_pem: Vec<u8> },
    /// Generated for these names, because the Secret is missing or incomplete.
    Generated { names: Vec<String>, missing: Option<String> },
}

/// One Ingress as served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub vip: IpAddr,
    /// `namespace/name` of the Ingress.
    pub ingress: String,
    pub rules: Vec<HostRule>,
    pub default: Option<Target>,
    pub tls: Option<Certificate>,
}

/// What routing a request gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route<'a> {
    To(&'a Target),
    NotFound,
}

fn host_matches(rule: &str, host: &str) -> bool {
    match rule.strip_prefix("*.") {
        Some(suffix) => {
            host.split_once('.').is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(suffix))
        }
        None => rule.eq_ignore_ascii_case(host),
    }
}

/// Prefix matching by path elements: `/foo` matches `/foo`, `/foo/` and `/foo/bar`, not `/foobar`.
fn prefix_matches(rule: &str, path: &str) -> bool {
    let rule = rule.trim_end_matches('/');
    rule.is_empty() || path == rule || path.strip_prefix(rule).is_some_and(|rest| rest.starts_with('/'))
}

impl Site {
    /// The target of a request, as Kubernetes defines Ingress matching: the rules of the most
    /// specific host (exact, then wildcard, then any host), within them an Exact path before the
    /// longest matching Prefix; otherwise the default backend.
    pub fn route(&self, host: &str, path: &str) -> Route<'_> {
        let host = host.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map(|(h, _)| h).unwrap_or(host);
        let path = if path.is_empty() { "/" } else { path };
        let tiers: [&dyn Fn(&HostRule) -> bool; 3] = [
            &|r: &HostRule| !r.host.is_empty() && !r.host.starts_with("*.") && host_matches(&r.host, host),
            &|r: &HostRule| r.host.starts_with("*.") && host_matches(&r.host, host),
            &|r: &HostRule| r.host.is_empty(),
        ];
        for tier in tiers {
            let paths: Vec<&PathRule> = self.rules.iter().filter(|r| tier(r)).flat_map(|r| &r.paths).collect();
            if let Some(p) = paths.iter().find(|p| p.kind == PathKind::Exact && p.path == path) {
                return Route::To(&p.target);
            }
            let best = paths
                .iter()
                .filter(|p| p.kind == PathKind::Prefix && prefix_matches(&p.path, path))
                .max_by_key(|p| p.path.trim_end_matches('/').len());
            if let Some(p) = best {
                return Route::To(&p.target);
            }
        }
        match &self.default {
            Some(t) => Route::To(t),
            None => Route::NotFound,
        }
    }
}

fn target(ns: &str, b: &IngressBackend, services: &BTreeMap<String, &core::Service>) -> Option<Target> {
    let svc = b.service.as_ref()?;
    let key = format!("{ns}/{}", svc.name);
    let port = svc.port.clone().unwrap_or_default();
    let shown = port.name.clone().filter(|n| !n.is_empty()).or(port.number.map(|n| n.to_string())).unwrap_or_default();
    let node_port = services.get(&key).and_then(|s| s.spec.as_ref()).and_then(|spec| {
        spec.ports.iter().flatten().find_map(|p| {
            let same = match (&port.name, port.number) {
                (Some(n), _) if !n.is_empty() => p.name.as_deref() == Some(n.as_str()),
                (_, Some(n)) => p.port == n,
                _ => false,
            };
            if same {
                p.node_port.and_then(|n| u16::try_from(n).ok())
            } else {
                None
            }
        })
    });
    Some(Target { service: key, port: shown, node_port })
}

/// The sites of the Ingresses the lab serves: of its class, with an address in their status.
pub fn sites(ingresses: &[Ingress], services: &[core::Service], secrets: &[core::Secret]) -> Vec<Site> {
    let services: BTreeMap<String, &core::Service> = services
        .iter()
        .map(|s| {
            let m = &s.metadata;
            (format!("{}/{}", m.namespace.as_deref().unwrap_or("default"), m.name.as_deref().unwrap_or("")), s)
        })
        .collect();
    let mut out = Vec::new();
    for ing in ingresses.iter().filter(|i| api::networking::is_lab_ingress(i)) {
        let ns = ing.metadata.namespace.as_deref().unwrap_or("default");
        let name = format!("{ns}/{}", ing.metadata.name.as_deref().unwrap_or(""));
        let Some(vip) = ing
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.as_ref())
            .and_then(|l| l.first())
            .and_then(|i| i.ip.as_deref())
            .and_then(|ip| ip.parse::<IpAddr>().ok())
        else {
            continue;
        };
        let spec = ing.spec.clone().unwrap_or_default();
        let rules = spec
            .rules
            .iter()
            .flatten()
            .map(|r| HostRule {
                host: r.host.clone().unwrap_or_default(),
                paths: r
                    .http
                    .iter()
                    .flat_map(|h| &h.paths)
                    .filter_map(|p| {
                        Some(PathRule {
                            path: p.path.clone().unwrap_or_else(|| "/".into()),
                            kind: if p.path_type == "Exact" { PathKind::Exact } else { PathKind::Prefix },
                            target: target(ns, &p.backend, &services)?,
                        })
                    })
                    .collect(),
            })
            .collect();
        let default = spec.default_backend.as_ref().and_then(|b| target(ns, b, &services));
        let tls = spec.tls.as_ref().filter(|t| !t.is_empty()).map(|entries| {
            let secret_name = entries.iter().find_map(|t| t.secret_name.clone().filter(|s| !s.is_empty()));
            let found = secret_name.as_ref().and_then(|s| {
                secrets.iter().find(|x| {
                    x.metadata.namespace.as_deref().unwrap_or("default") == ns && x.metadata.name.as_deref() == Some(s)
                })
            });
            let data = found.and_then(|s| s.data.as_ref());
            match data.and_then(|d| Some((d.get("tls.crt")?, d.get("tls.key")?))) {
                Some((crt, key)) => Certificate::Secret {
                    secret: format!("{ns}/{}", secret_name.clone().unwrap_or_default()),
                    cert_pem: crt.0.clone(),
                    key_pem: key.0.clone(),
                },
                None => {
                    let mut names: Vec<String> =
                        entries.iter().flat_map(|t| t.hosts.clone().unwrap_or_default()).collect();
                    names.push(vip.to_string());
                    Certificate::Generated { names, missing: secret_name.map(|s| format!("{ns}/{s}")) }
                }
            }
        });
        out.push(Site { vip, ingress: name, rules, default, tls });
    }
    out.sort_by_key(|s| s.vip);
    out.dedup_by(|a, b| a.vip == b.vip);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ingress(v: serde_json::Value) -> Ingress {
        serde_json::from_value(v).unwrap()
    }

    fn service(name: &str, ports: serde_json::Value) -> core::Service {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"type": "NodePort", "ports": ports}}),
        )
        .unwrap()
    }

    fn shop() -> Site {
        let ing = ingress(json!({
            "metadata": {"name": "shop", "namespace": "default"},
            "spec": {
                "defaultBackend": {"service": {"name": "web", "port": {"number": 80}}},
                "rules": [
                    {"host": "shop.example", "http": {"paths": [
                        {"path": "/cart", "pathType": "Prefix", "backend": {"service": {"name": "cart", "port": {"name": "http"}}}},
                        {"path": "/cart/checkout", "pathType": "Prefix", "backend": {"service": {"name": "pay", "port": {"number": 80}}}},
                        {"path": "/about", "pathType": "Exact", "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}},
                    {"host": "*.shop.example", "http": {"paths": [
                        {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "tenant", "port": {"number": 80}}}}]}},
                    {"http": {"paths": [
                        {"path": "/api", "pathType": "ImplementationSpecific", "backend": {"service": {"name": "api", "port": {"number": 80}}}}]}}
                ]
            },
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}
        }));
        let services = [
            service("web", json!([{"port": 80, "nodePort": 30080}])),
            service("cart", json!([{"name": "http", "port": 8080, "nodePort": 30081}])),
            service("pay", json!([{"port": 80, "nodePort": 30082}])),
        ];
        sites(&[ing], &services, &[]).remove(0)
    }

    fn to(site: &Site, host: &str, path: &str) -> String {
        match site.route(host, path) {
            Route::To(t) => format!("{}:{}", t.service, t.port),
            Route::NotFound => "404".into(),
        }
    }

    #[test]
    fn hosts_and_paths_route_as_kubernetes_defines_them() {
        let s = shop();
        assert_eq!(s.vip.to_string(), "198.51.100.7");
        assert_eq!(to(&s, "shop.example", "/cart"), "default/cart:http");
        assert_eq!(to(&s, "shop.example:80", "/cart/items/3"), "default/cart:http");
        assert_eq!(to(&s, "SHOP.example", "/cart/checkout/now"), "default/pay:80", "the longest prefix");
        assert_eq!(to(&s, "shop.example", "/cartoon"), "default/web:80", "prefixes match whole elements");
        assert_eq!(to(&s, "shop.example", "/about"), "default/web:80");
        assert_eq!(to(&s, "shop.example", "/about/team"), "default/web:80", "Exact is exact (default backend)");
        assert_eq!(to(&s, "eu.shop.example", "/x"), "default/tenant:80", "one wildcard label");
        assert_eq!(to(&s, "a.eu.shop.example", "/api/v1"), "default/api:80", "not two labels; any host then");
        assert_eq!(to(&s, "198.51.100.7", "/"), "default/web:80");
    }

    #[test]
    fn targets_resolve_node_ports_by_port_name_or_number() {
        let s = shop();
        let Route::To(cart) = s.route("shop.example", "/cart") else { panic!() };
        assert_eq!(cart.node_port, Some(30081));
        let Route::To(tenant) = s.route("x.shop.example", "/") else { panic!() };
        assert_eq!(tenant.node_port, None, "no such Service");
        let mut no_default = s.clone();
        no_default.default = None;
        assert_eq!(no_default.route("other.example", "/"), Route::NotFound);
    }

    #[test]
    fn only_the_labs_ingresses_with_an_address_are_served_and_tls_picks_its_certificate() {
        let base = |name: &str, class: Option<&str>, ip: Option<&str>, tls: serde_json::Value| {
            let mut v = json!({"metadata": {"name": name, "namespace": "default"},
                "spec": {"defaultBackend": {"service": {"name": "web", "port": {"number": 80}}}, "tls": tls}});
            if let Some(c) = class {
                v["spec"]["ingressClassName"] = json!(c);
            }
            if let Some(ip) = ip {
                v["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip}]}});
            }
            ingress(v)
        };
        let secret: core::Secret =
            serde_json::from_value(json!({"metadata": {"name": "shop-tls", "namespace": "default"},
            "type": "kubernetes.io/tls", "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}}))
            .unwrap();
        let list = [
            base("plain", None, Some("198.51.100.1"), json!([])),
            base("pending", None, None, json!([])),
            base("nginx", Some("nginx"), Some("198.51.100.2"), json!([])),
            base(
                "secure",
                Some("podpath"),
                Some("198.51.100.3"),
                json!([{"hosts": ["shop.example"], "secretName": "shop-tls"}]),
            ),
            base("selfsigned", None, Some("198.51.100.4"), json!([{"hosts": ["a.example"], "secretName": "gone"}])),
        ];
        let got = sites(&list, &[], &[secret]);
        let names: Vec<&str> = got.iter().map(|s| s.ingress.as_str()).collect();
        assert_eq!(names, ["default/plain", "default/secure", "default/selfsigned"]);
        assert_eq!(got[0].tls, None);
        assert!(matches!(&got[1].tls, Some(Certificate::Secret { cert_pem, .. }) if cert_pem == b"cert"));
        assert_eq!(
            got[2].tls,
            Some(Certificate::Generated {
                names: vec!["a.example".into(), "198.51.100.4".into()],
                missing: Some("default/gone".into())
            })
        );
    }
}
