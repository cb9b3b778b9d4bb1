//! Root test of the userspace proxy mode: a real node agent in a node namespace, real pods, a
//! Service whose EndpointSlice also lists an endpoint nobody answers on. Every connection still
//! succeeds (the proxy retries the next endpoint), through the ClusterIP from the node and from a
//! pod and through the NodePort from another host; the portal and NodePort chains are in
//! `iptables-save`, and the agent holds the NodePort open.

mod common;

use common::*;
use serde_json::json;
use testkit::netns::{host_state, root_or_explain};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn userspace_proxy_retries_past_a_dead_endpoint() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let mut c = Cluster::started(1, &["--proxy-mode", "userspace"]).await;
    c.create_pod(echo_pod("web-1", "node-1")).await;
    c.create_pod(echo_pod("web-2", "node-1")).await;
    c.wait_for(30, "pods Ready", |c| pod_ready(&c.pod("web-1")) && pod_ready(&c.pod("web-2"))).await;
    let ip = |name: &str| c.pod(name).unwrap()["status"]["podIP"].as_str().unwrap().to_string();
    let (ip1, ip2) = (ip("web-1"), ip("web-2"));
    // In the node's pod CIDR, but no pod has it: connects to it time out.
    let dead = "10.244.1.250";
    let opts = apiserver_lite::registry::WriteOptions::default();
    // No selector: the EndpointSlice is ours to write.
    c.registry
        .create(
            api::Kind::Service,
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                   "spec": {"type": "NodePort", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
            &opts,
        )
        .await
        .unwrap();
    let endpoint = |ip: &str| json!({"addresses": [ip], "conditions": {"ready": true}, "nodeName": "node-1"});
    c.registry
        .create(
            api::Kind::EndpointSlice,
            Some("default"),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": "web-manual", "labels": {"kubernetes.io/service-name": "web"}},
                   "addressType": "IPv4",
                   "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                   "endpoints": [endpoint(&ip1), endpoint(&ip2), endpoint(dead)]}),
            &opts,
        )
        .await
        .unwrap();
    let svc = c.get(api::Kind::Service, "default", "web").unwrap();
    let cip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
    let np = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap().to_string();
    c.wait_for(20, "the portal rules on node-1", |c| {
        let saved = c.nodes[0].run(&["iptables-save", "-t", "nat"]).1;
        saved.contains(&format!("--dport {np} ")) && saved.contains(&cip)
    })
    .await;
    let n1 = &c.nodes[0];
    let saved = n1.run(&["iptables-save"]).1;
    for want in [
        "-A PREROUTING -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-CONTAINER",
        "-A OUTPUT -m comment --comment \"handle ClusterIPs; NOTE: this must be before the NodePort rules\" -j KUBE-PORTALS-HOST",
        "-m addrtype --dst-type LOCAL -m comment --comment \"handle service NodePorts; NOTE: this must be the last rule in the chain\" -j KUBE-NODEPORT-CONTAINER",
        "-A INPUT -m comment --comment \"Ensure that non-local NodePort traffic can flow\" -j KUBE-NODEPORT-NON-LOCAL",
    ] {
        assert!(saved.contains(want), "missing {want:?} in\n{saved}");
    }
    let portal = saved
        .lines()
        .find(|l| l.starts_with("-A KUBE-PORTALS-CONTAINER") && l.contains(&cip))
        .unwrap_or_else(|| panic!("no portal rule for {cip}:\n{saved}"));
    assert!(portal.contains("\"default/web:http\"") && portal.contains("-j REDIRECT --to-ports "), "{portal}");
    let proxy_port = portal.rsplit(' ').next().unwrap().to_string();
    assert!(
        saved.contains(&format!(
            "-A KUBE-NODEPORT-HOST -p tcp -m comment --comment \"default/web:http\" -m tcp --dport {np} -j DNAT --to-destination {}:{proxy_port}",
            node_ip(1)
        )),
        "{saved}"
    );
    assert!(!saved.contains("KUBE-SERVICES"), "no iptables-mode rules in userspace mode:\n{saved}");
    // The agent listens on the proxy port and holds the NodePort.
    let (_, listening) = n1.run(&["ss", "-Htlnp"]);
    for port in [&proxy_port, &np] {
        assert!(
            listening.lines().any(|l| l.contains(&format!(":{port} ")) && l.contains("node-agent")),
            "node-agent does not listen on {port}:\n{listening}"
        );
    }

    // Every connection is answered, by both live pods, though one endpoint in three is dead.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..12 {
        let (ok, page) = n1.run(&["curl", "-sS", "--max-time", "10", &format!("http://{cip}/")]);
        assert!(ok, "{page}\n{}", n1.log());
        seen.insert(page.lines().next().unwrap_or_default().to_string());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(n1.log().contains("trying the next endpoint"), "{}", n1.log());
    // From a pod (PREROUTING: REDIRECT to the proxy port).
    let pid = container_pid(&c.pod("web-1").unwrap()).to_string();
    let (ok, page) =
        n1.run(&["nsenter", "-t", &pid, "-n", "--", "curl", "-sS", "--max-time", "10", &format!("http://{cip}/")]);
    assert!(ok && page.contains("pod: default/web-"), "{page}");
    // The NodePort from another machine on the underlay.
    for _ in 0..3 {
        let (ok, page) = c.underlay.run(&["curl", "-sS", "--max-time", "10", &format!("http://{}:{np}/", node_ip(1))]);
        assert!(ok && page.contains("pod: default/web-"), "{page}");
    }

    c.nodes[0].stop_agent();
    let (ok, out) = c.nodes[0].run(&[env!("CARGO_BIN_EXE_node-agent"), "--cleanup"]);
    assert!(ok, "{out}");
    let left = c.nodes[0].run(&["iptables-save"]).1;
    assert!(!left.contains("KUBE-"), "{left}");
    drop(c);
    assert_eq!(host_state(), before, "the host namespace changed");
}
