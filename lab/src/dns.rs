//! The lab's cluster DNS, set up as kubeadm sets up CoreDNS: a `coredns` Deployment of the
//! built-in `podpath/dns` image in `kube-system` (labels `k8s-app: kube-dns`, ports 53/UDP,
//! 53/TCP, 9153/TCP, probes on `/health` :8080 and `/ready` :8181) behind the `kube-dns`
//! Service at the tenth address of the service range. Pure: the objects and the routes the
//! control plane needs so the DNS pods reach the API (the control plane runs no node agent,
//! so it learns each node's pod CIDR here, as a node's agent does for the others).

use serde_json::{json, Value};

/// The API server's Service range (its default, kubeadm's too).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";

/// kubeadm's cluster DNS address: the tenth address of the default service range 10.96.0.0/12.
pub const CLUSTER_DNS: &str = "10.96.0.10";

/// The lab's Corefile: kubeadm's, but for three lines. `cache` keeps no cluster names (a
/// Service made after a failed lookup answers at once, not 30 s later), `reload` looks every
/// 2 s (not 30 s ± 15 s) so an edit shows within seconds, and `health` has no lameduck (a DNS
/// pod stops at once).
pub const COREFILE: &str = ".:53 {
    errors
    health
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload 2s
    loadbalance
}
";

/// What to create, in order: (collection path, object). An existing one (409) is kept.
/// `cluster_dns`: the kube-dns Service's address (the tenth of the primary Service range).
pub fn objects(cluster_dns: &str) -> Vec<(&'static str, Value)> {
    let labels = json!({"k8s-app": "kube-dns"});
    vec![
        ("/api/v1/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})),
        (
            "/api/v1/namespaces/kube-system/configmaps",
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "coredns", "namespace": "kube-system"},
                "data": {"Corefile": COREFILE}
            }),
        ),
        (
            "/api/v1/namespaces/kube-system/services",
            json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kube-dns", "namespace": "kube-system",
                             "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
                "spec": {
                    "clusterIP": cluster_dns,
                    "selector": labels,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                        {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}
                    ]
                }
            }),
        ),
        (
            "/apis/apps/v1/namespaces/kube-system/deployments",
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "dnsPolicy": "Default",
                            "containers": [{
                                "name": "coredns",
                                "image": "podpath/dns",
                                // CoreDNS reads the ConfigMap through a volume; podpath-dns
                                // (a process, not a container) watches it through the API.
                                "args": ["--corefile-configmap=kube-system/coredns"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                    {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}
                                ],
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10},
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1}
                            }]
                        }
                    }
                }
            }),
        ),
    ]
}

/// `(pod CIDR, node InternalIP)` for every node of a `NodeList`: the routes the control plane
/// needs to answer pods.
pub fn control_plane_routes(nodes: &Value) -> Vec<(String, String)> {
    let mut out = vec![];
    for n in nodes["items"].as_array().into_iter().flatten() {
        let cidr = n.pointer("/spec/podCIDR").and_then(Value::as_str);
        let ip = n
            .pointer("/status/addresses")
            .and_then(Value::as_array)
            .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
            .and_then(|a| a["address"].as_str());
        if let (Some(c), Some(i)) = (cidr, ip) {
            out.push((c.to_string(), i.to_string()));
        }
    }
    out
}

/// A DNS query for `name`'s A record (id 0x5050, recursion desired), as a resolver sends it.
pub fn a_query(name: &str) -> Vec<u8> {
    query(name, 1)
}

/// A DNS query for `name`'s record of type `qtype` (1 A, 28 AAAA).
pub fn query(name: &str, qtype: u16) -> Vec<u8> {
    let mut q = vec![0x50, 0x50, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.push(0);
    q.extend_from_slice(&qtype.to_be_bytes());
    q.extend_from_slice(&[0, 1]);
    q
}

/// Whether `reply` answers the query [`a_query`] made: same id, NOERROR, one answer or more.
pub fn answered(reply: &[u8]) -> bool {
    reply.len() >= 12
        && reply[0..2] == [0x50, 0x50]
        && reply[3] & 0x0f == 0
        && u16::from_be_bytes([reply[6], reply[7]]) > 0
}

/// Asks the cluster DNS at `server` for `name` from the current network namespace; whether it
/// answered.
pub fn cluster_dns_answers(server: &str, name: &str, timeout: std::time::Duration) -> bool {
    let Ok(ip) = server.parse::<std::net::IpAddr>() else { return false };
    let any: std::net::IpAddr = if ip.is_ipv6() { std::net::Ipv6Addr::UNSPECIFIED.into() } else { [0, 0, 0, 0].into() };
    let Ok(s) = std::net::UdpSocket::bind((any, 0)) else { return false };
    let _ = s.set_read_timeout(Some(timeout));
    // The Services of an IPv6 cluster have AAAA records only.
    let qtype = if ip.is_ipv6() { 28 } else { 1 };
    if s.connect((ip, 53)).is_err() || s.send(&query(name, qtype)).is_err() {
        return false;
    }
    let mut buf = [0u8; 512];
    matches!(s.recv(&mut buf), Ok(n) if answered(&buf[..n]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadms_shape() {
        let o = objects(CLUSTER_DNS);
        let svc = &o[2].1;
        assert_eq!(svc["spec"]["clusterIP"], "10.96.0.10");
        let ports: Vec<String> = svc["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| format!("{}/{}", p["port"], p["protocol"].as_str().unwrap()))
            .collect();
        assert_eq!(ports, ["53/UDP", "53/TCP", "9153/TCP"]);
        let pod = &o[3].1["spec"]["template"];
        assert_eq!(pod["metadata"]["labels"], svc["spec"]["selector"]);
        assert_eq!(pod["spec"]["containers"][0]["image"], "podpath/dns");
        let corefile = o[1].1["data"]["Corefile"].as_str().unwrap();
        // The Corefile loads in podpath-dns, and the pod runs it from the ConfigMap.
        let c = podpath_dns::corefile::parse(corefile, "Corefile").unwrap();
        assert!(c.servers[0].plugins.forward.is_some() && c.servers[0].plugins.reload.is_some());
        assert_eq!(pod["spec"]["containers"][0]["args"][0], "--corefile-configmap=kube-system/coredns");
    }

    #[test]
    fn routes_to_every_nodes_pods() {
        let nodes = json!({"items": [
            {"spec": {"podCIDR": "10.244.1.0/24"}, "status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.11"}]}},
            {"spec": {}, "status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.12"}]}}
        ]});
        assert_eq!(control_plane_routes(&nodes), [("10.244.1.0/24".to_string(), "192.168.56.11".to_string())]);
    }

    #[test]
    fn an_a_query_and_its_answer() {
        let q = a_query("kubernetes.default.svc.cluster.local");
        assert_eq!(&q[12..23], b"\x0akubernetes");
        assert_eq!(&q[q.len() - 4..], [0, 1, 0, 1]);
        let mut reply = q.clone();
        reply[2] = 0x81;
        reply[3] = 0x80;
        assert!(!answered(&reply), "no answer record");
        reply[7] = 1;
        assert!(answered(&reply));
        reply[3] = 0x83;
        assert!(!answered(&reply), "NXDOMAIN");
    }
}
