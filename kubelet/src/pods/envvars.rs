//! The Service environment variables kubelet gives every container (`enableServiceLinks`,
//! default true), and `$(VAR)` references in `env`, `command` and `args`. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

/// What kubelet reads of a Service for its variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceLink {
    pub namespace: String,
    pub name: String,
    pub cluster_ip: String,
    /// (name, port, protocol), in the Service's order.
    pub ports: Vec<(Option<String>, i32, String)>,
}

impl ServiceLink {
    /// A Service without a cluster IP (headless, ExternalName) keeps an empty one: it gets no
    /// variables.
    pub fn of(s: &core::Service) -> ServiceLink {
        let spec = s.spec.clone().unwrap_or_default();
        ServiceLink {
            namespace: s.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: s.metadata.name.clone().unwrap_or_default(),
            cluster_ip: spec.cluster_ip.clone().filter(|ip| ip != "None").unwrap_or_default(),
            ports: spec
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.clone().filter(|n| !n.is_empty()),
                        p.port,
                        p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    )
                })
                .collect(),
        }
    }
}

fn env_name(s: &str) -> String {
    s.to_ascii_uppercase().replace('-', "_")
}

/// The variables of the Services a pod in `namespace` sees: those of its namespace when
/// `links` is on, and always `default/kubernetes` (unless its own namespace has a Service of
/// that name), sorted by Service name as kubelet does.
pub fn service_env(namespace: &str, links: bool, services: &[ServiceLink]) -> Vec<(String, String)> {
    let mut chosen: BTreeMap<&str, &ServiceLink> = BTreeMap::new();
    let services: Vec<&ServiceLink> = services.iter().filter(|s| !s.cluster_ip.is_empty()).collect();
    for s in services.iter().copied() {
        if s.namespace == "default" && s.name == "kubernetes" {
            chosen.entry("kubernetes").or_insert(s);
        }
    }
    if links {
        for s in services.iter().copied().filter(|s| s.namespace == namespace) {
            chosen.insert(&s.name, s);
        }
    }
    let mut out = vec![];
    for s in chosen.values() {
        let name = env_name(&s.name);
        let host = if s.cluster_ip.contains(':') { format!("[{}]", s.cluster_ip) } else { s.cluster_ip.clone() };
        let Some((_, first, first_proto)) = s.ports.first() else { continue };
        out.push((format!("{name}_SERVICE_HOST"), s.cluster_ip.clone()));
        out.push((format!("{name}_SERVICE_PORT"), first.to_string()));
        for (pname, port, _) in &s.ports {
            if let Some(p) = pname {
                out.push((format!("{name}_SERVICE_PORT_{}", env_name(p)), port.to_string()));
            }
        }
        // The Docker link variables.
        out.push((format!("{name}_PORT"), format!("{}://{host}:{first}", first_proto.to_ascii_lowercase())));
        for (_, port, proto) in &s.ports {
            let prefix = format!("{name}_PORT_{port}_{}", proto.to_ascii_uppercase());
            let lower = proto.to_ascii_lowercase();
            out.push((prefix.clone(), format!("{lower}://{host}:{port}")));
            out.push((format!("{prefix}_PROTO"), lower));
            out.push((format!("{prefix}_PORT"), port.to_string()));
            out.push((format!("{prefix}_ADDR"), s.cluster_ip.clone()));
        }
    }
    out
}

/// Expands `$(NAME)` with the variables defined so far; `$$` is a literal `$`; an unknown
/// reference stays as written (Kubernetes' `expansion` package).
pub fn expand(input: &str, vars: &dyn Fn(&str) -> Option<String>) -> String {
    let b = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() {
            match b[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                    continue;
                }
                b'(' => {
                    if let Some(end) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + end];
                        match vars(name) {
                            Some(v) => out.push_str(&v),
                            None => out.push_str(&input[i..i + 3 + end]),
                        }
                        i += 3 + end;
                        continue;
                    }
                }
                _ => {}
            }
        }
        let ch = input[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, ip: &str, ports: &[(Option<&str>, i32, &str)]) -> ServiceLink {
        ServiceLink {
            namespace: ns.into(),
            name: name.into(),
            cluster_ip: ip.into(),
            ports: ports.iter().map(|(n, p, pr)| (n.map(String::from), *p, pr.to_string())).collect(),
        }
    }

    #[test]
    fn variables_as_kubelet_writes_them() {
        let services = [
            svc("default", "kubernetes", "10.96.0.1", &[(Some("https"), 443, "TCP")]),
            svc("default", "my-nginx", "10.96.12.7", &[(None, 80, "TCP")]),
            svc("other", "db", "10.96.3.3", &[(Some("pg"), 5432, "TCP")]),
            svc("default", "dns-x", "10.96.0.10", &[(Some("dns"), 53, "UDP"), (Some("dns-tcp"), 53, "TCP")]),
            svc("default", "headless", "", &[(None, 80, "TCP")]),
        ];
        let env: BTreeMap<String, String> = service_env("default", true, &services).into_iter().collect();
        for (k, v) in [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("KUBERNETES_SERVICE_PORT_HTTPS", "443"),
            ("KUBERNETES_PORT", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP", "tcp://10.96.0.1:443"),
            ("KUBERNETES_PORT_443_TCP_PROTO", "tcp"),
            ("KUBERNETES_PORT_443_TCP_PORT", "443"),
            ("KUBERNETES_PORT_443_TCP_ADDR", "10.96.0.1"),
            ("MY_NGINX_SERVICE_HOST", "10.96.12.7"),
            ("MY_NGINX_PORT", "tcp://10.96.12.7:80"),
            ("DNS_X_PORT", "udp://10.96.0.10:53"),
            ("DNS_X_SERVICE_PORT_DNS_TCP", "53"),
            ("DNS_X_PORT_53_UDP_PROTO", "udp"),
        ] {
            assert_eq!(env.get(k).map(String::as_str), Some(v), "{k}");
        }
        assert!(!env.contains_key("DB_SERVICE_HOST"), "other namespaces' Services are not linked");
        assert!(!env.contains_key("HEADLESS_SERVICE_HOST"), "headless Services have no variables");
        // Without links only the API server's.
        let env = service_env("other", false, &services);
        assert!(env.iter().all(|(k, _)| k.starts_with("KUBERNETES_")));
        assert_eq!(env.len(), 8);
    }

    #[test]
    fn references_expand_once_and_unknown_ones_stay() {
        let vars = |n: &str| (n == "A").then(|| "1".to_string());
        assert_eq!(expand("x$(A)y", &vars), "x1y");
        assert_eq!(expand("$(B) $$(A) $$ $", &vars), "$(B) $(A) $ $");
        assert_eq!(expand("$(A", &vars), "$(A");
        assert_eq!(expand("é$(A)", &vars), "é1");
    }
}
