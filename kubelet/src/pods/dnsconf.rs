//! A pod's `/etc/resolv.conf` and `/etc/hosts`, as kubelet writes them (`pkg/kubelet/network/
//! dns`, `kubelet_pods.go`): the pod's `dnsPolicy` and `dnsConfig` with the node's own
//! resolver settings and the agent's `--cluster-dns`/`--cluster-domain`. Pure.

use k8s_openapi::api::core::v1 as core;

/// kubelet's limits (core validation): nameservers, search domains, search list length.
const MAX_NAMESERVERS: usize = 3;
const MAX_SEARCH: usize = 32;
const MAX_SEARCH_CHARS: usize = 2048;

/// The node's own resolver settings (its `/etc/resolv.conf`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostResolv {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// Reads a resolv.conf's `nameserver`, `search`/`domain` and `options` lines.
pub fn parse_resolv(text: &str) -> HostResolv {
    let mut r = HostResolv::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => r.nameservers.extend(f.next().map(str::to_string)),
            Some("search") | Some("domain") => r.searches = f.map(str::to_string).collect(),
            Some("options") => r.options.extend(f.map(str::to_string)),
            _ => {}
        }
    }
    r
}

/// The pod's resolv.conf. `cluster_dns` empty: `ClusterFirst` falls back to the node's
/// settings, as kubelet does without `--cluster-dns`.
pub fn resolv_conf(pod: &core::Pod, cluster_dns: &[String], cluster_domain: &str, host: &HostResolv) -> String {
    let spec = pod.spec.as_ref();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let policy = spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst");
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let cluster =
        !cluster_dns.is_empty() && (policy == "ClusterFirstWithHostNet" || (policy == "ClusterFirst" && !host_network));
    let (mut servers, mut searches, mut options): (Vec<String>, Vec<String>, Vec<String>) = match policy {
        "None" => (vec![], vec![], vec![]),
        _ if cluster => {
            let mut s =
                vec![format!("{ns}.svc.{cluster_domain}"), format!("svc.{cluster_domain}"), cluster_domain.to_string()];
            s.extend(host.searches.iter().cloned());
            (cluster_dns.to_vec(), s, vec!["ndots:5".into()])
        }
        _ => (host.nameservers.clone(), host.searches.clone(), host.options.clone()),
    };
    if let Some(c) = spec.and_then(|s| s.dns_config.as_ref()) {
        servers.extend(c.nameservers.iter().flatten().cloned());
        searches.extend(c.searches.iter().flatten().cloned());
        for o in c.options.iter().flatten() {
            let name = o.name.clone().unwrap_or_default();
            options.retain(|x| x.split(':').next() != Some(name.as_str()));
            options.push(match &o.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    }
    dedup(&mut servers);
    dedup(&mut searches);
    servers.truncate(MAX_NAMESERVERS);
    searches.truncate(MAX_SEARCH);
    while searches.iter().map(|s| s.len() + 1).sum::<usize>() > MAX_SEARCH_CHARS {
        searches.pop();
    }
    let mut out = String::new();
    if !searches.is_empty() {
        out.push_str(&format!("search {}\n", searches.join(" ")));
    }
    for s in &servers {
        out.push_str(&format!("nameserver {s}\n"));
    }
    if !options.is_empty() {
        out.push_str(&format!("options {}\n", options.join(" ")));
    }
    out
}

fn dedup(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(x.clone()));
}

/// The pod's `/etc/hosts`, kubelet's "Kubernetes-managed hosts file": localhost lines, the
/// pod's IPs with its hostname (and FQDN with `subdomain`), then `hostAliases`.
pub fn hosts_file(pod: &core::Pod, pod_ips: &[String], cluster_domain: &str) -> String {
    let spec = pod.spec.as_ref();
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or("");
    let hostname = spec.and_then(|s| s.hostname.as_deref()).filter(|h| !h.is_empty()).unwrap_or(name);
    let mut out = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    let names = match spec.and_then(|s| s.subdomain.as_deref()).filter(|s| !s.is_empty()) {
        Some(sub) => format!("{hostname}.{sub}.{ns}.svc.{cluster_domain}\t{hostname}"),
        None => hostname.to_string(),
    };
    for ip in pod_ips {
        out.push_str(&format!("{ip}\t{names}\n"));
    }
    let aliases = spec.and_then(|s| s.host_aliases.as_ref()).filter(|a| !a.is_empty());
    if let Some(aliases) = aliases {
        out.push_str("\n# Entries added by HostAliases.\n");
        for a in aliases {
            out.push_str(&format!(
                "{}\t{}\n",
                a.ip,
                a.hostnames.iter().flatten().cloned().collect::<Vec<_>>().join("\t")
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> core::Pod {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop"}, "spec": spec})).unwrap()
    }

    fn host() -> HostResolv {
        parse_resolv("# generated\nnameserver 192.168.1.1\nnameserver 192.168.1.2 ; second\nsearch corp.example\noptions edns0\n")
    }

    #[test]
    fn the_node_resolver_is_read() {
        let h = host();
        assert_eq!(h.nameservers, ["192.168.1.1", "192.168.1.2"]);
        assert_eq!(h.searches, ["corp.example"]);
        assert_eq!(h.options, ["edns0"]);
    }

    #[test]
    fn cluster_first_as_kubelet_writes_it() {
        let dns = vec!["10.96.0.10".to_string()];
        assert_eq!(
            resolv_conf(&pod(json!({"containers": []})), &dns, "cluster.local", &host()),
            "search shop.svc.cluster.local svc.cluster.local cluster.local corp.example\n\
             nameserver 10.96.0.10\noptions ndots:5\n"
        );
        // Without --cluster-dns, ClusterFirst is the node's resolver.
        assert_eq!(
            resolv_conf(&pod(json!({"containers": []})), &[], "cluster.local", &host()),
            "search corp.example\nnameserver 192.168.1.1\nnameserver 192.168.1.2\noptions edns0\n"
        );
    }

    #[test]
    fn default_none_and_dns_config() {
        let dns = vec!["10.96.0.10".to_string()];
        let default = pod(json!({"dnsPolicy": "Default", "containers": []}));
        assert!(resolv_conf(&default, &dns, "cluster.local", &host()).contains("nameserver 192.168.1.1\n"));
        let none = pod(json!({"dnsPolicy": "None", "containers": [], "dnsConfig": {
            "nameservers": ["1.1.1.1"], "searches": ["a.example"], "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}));
        assert_eq!(
            resolv_conf(&none, &dns, "cluster.local", &host()),
            "search a.example\nnameserver 1.1.1.1\noptions ndots:2 edns0\n"
        );
        // dnsConfig adds to ClusterFirst and overrides an option of the same name.
        let tuned = pod(json!({"containers": [], "dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}}));
        assert!(resolv_conf(&tuned, &dns, "cluster.local", &host()).ends_with("options ndots:1\n"));
        let many = pod(json!({"dnsPolicy": "None", "containers": [], "dnsConfig": {
            "nameservers": ["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"]}}));
        assert_eq!(resolv_conf(&many, &dns, "cluster.local", &host()).matches("nameserver").count(), 3);
    }

    #[test]
    fn hosts_with_hostname_subdomain_and_aliases() {
        let p = pod(json!({"hostname": "db-0", "subdomain": "db", "containers": [],
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}]}));
        let h = hosts_file(&p, &["10.244.1.5".into()], "cluster.local");
        assert!(h.starts_with("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n"));
        assert!(h.contains("10.244.1.5\tdb-0.db.shop.svc.cluster.local\tdb-0\n"), "{h}");
        assert!(h.ends_with("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"), "{h}");
        let plain = hosts_file(&pod(json!({"containers": []})), &["10.244.1.6".into()], "cluster.local");
        assert!(plain.ends_with("10.244.1.6\tweb\n"), "{plain}");
    }
}
