//! Root tests: real node agents in node namespaces on a shared bridge run real pods through
//! CNI. Every namespace is unique to the test and removed by guards; the host's own namespace
//! must be identical afterwards.

mod common;

use common::*;
use serde_json::json;
use testkit::netns::{host_state, root_or_explain};

fn pod_ip(p: &serde_json::Value) -> String {
    p["status"]["podIP"].as_str().unwrap_or_default().to_string()
}

/// `nsenter` into a pod's namespaces through its workload's PID.
fn in_pod(node: &Node, pid: i32, args: &[&str]) -> (bool, String) {
    let pid = pid.to_string();
    let mut full = vec!["nsenter", "-t", &pid, "-n", "-u", "--"];
    full.extend_from_slice(args);
    node.run(&full)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_nodes_network_probes_restarts_deletion_and_agent_restart() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let mut c = Cluster::started(2, &[]).await;

    c.create_pod(echo_pod("web-1", "node-1")).await;
    let mut web2 = echo_pod("web-2", "node-2");
    web2["spec"]["containers"][0]["readinessProbe"] =
        json!({"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 1});
    c.create_pod(web2).await;
    c.create_pod(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crash"},
        "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox",
            "command": ["sh", "-c", "echo starting; sleep 0.2; exit 3"]}]}
    }))
    .await;
    c.create_pod(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "noimage"},
        "spec": {"nodeName": "node-2", "containers": [{"name": "c", "image": "nginx"}]}
    }))
    .await;

    c.create_pod(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tls"},
        "spec": {"nodeName": "node-2", "containers": [{"name": "nginx", "image": "podpath/echo",
            "ports": [{"containerPort": 80}, {"containerPort": 443}],
            "args": ["--redirect-to-https=80", "--https-port=443"]}]}
    }))
    .await;
    c.wait_for(30, "web-1 and web-2 Running and Ready", |c| pod_ready(&c.pod("web-1")) && pod_ready(&c.pod("web-2")))
        .await;
    let p1 = c.pod("web-1").unwrap();
    let p2 = c.pod("web-2").unwrap();
    let (ip1, ip2) = (pod_ip(&p1), pod_ip(&p2));
    assert!(ip1.starts_with("10.244.1."), "web-1 got {ip1} (node-1 has 10.244.1.0/24)");
    assert!(ip2.starts_with("10.244.2."), "web-2 got {ip2}");
    assert_eq!(p1["status"]["hostIP"], node_ip(1));
    assert_eq!(p1["status"]["podIPs"][0]["ip"], ip1.as_str());
    let pid1 = container_pid(&p1);

    // The pod's own UTS namespace and the pod network across nodes, without NAT.
    let n1 = &c.nodes[0];
    assert_eq!(in_pod(n1, pid1, &["hostname"]).1.trim(), "web-1");
    let (ok, page) = in_pod(n1, pid1, &["curl", "-sS", "--max-time", "5", &format!("http://{ip2}:8080/hello")]);
    assert!(ok, "{page}");
    assert!(page.contains("pod: default/web-2") && page.contains("node: node-2"), "{page}");
    assert!(page.contains(&format!("client: {ip1}:")), "the pod saw a translated source: {page}");
    assert!(page.contains("GET /hello HTTP/1.1"), "{page}");
    let routes = n1.run(&["ip", "route", "show", "proto", "77"]).1;
    assert_eq!(routes.trim(), format!("10.244.2.0/24 via {} dev eth0", node_ip(2)));

    // The scenario-2 nginx behaviour: 301 to https on port 80, HTTPS (self-signed) on 443.
    c.wait_for(30, "tls Ready", |c| pod_ready(&c.pod("tls"))).await;
    let tls_ip = pod_ip(&c.pod("tls").unwrap());
    let (ok, head) = n1.run(&["curl", "-sS", "-i", "--max-time", "5", &format!("http://{tls_ip}/a?b")]);
    assert!(ok && head.starts_with("HTTP/1.1 301 Moved Permanently"), "{head}");
    assert!(head.to_lowercase().contains(&format!("location: https://{tls_ip}/a?b")), "{head}");
    let (ok, page) = n1.run(&["curl", "-sSk", "--max-time", "5", &format!("https://{tls_ip}/")]);
    assert!(
        ok && page.contains("pod: default/tls") && page.contains(&format!("server: https://{tls_ip}:443")),
        "{page}"
    );

    // A crashing program is restarted with back-off; an image with no program waits.
    c.wait_for(30, "crash restarted twice", |c| {
        c.pod("crash").is_some_and(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(2))
    })
    .await;
    let crash = c.pod("crash").unwrap();
    assert_eq!(crash["status"]["phase"], "Running");
    assert_eq!(crash["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"], 3);
    assert_eq!(crash["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"], "Error");
    c.wait_for(10, "noimage waiting with ErrImagePull", |c| {
        c.pod("noimage")
            .is_some_and(|p| p["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull")
    })
    .await;
    assert_eq!(c.pod("noimage").unwrap()["status"]["phase"], "Pending");

    // Health and metrics on :10256.
    let url = format!("http://{}:10256", node_ip(1));
    let (ok, health) = n1.run(&["curl", "-sS", "-i", "--max-time", "5", &format!("{url}/healthz")]);
    assert!(ok && health.starts_with("HTTP/1.1 200") && health.contains("\"nodeEligible\":true"), "{health}");
    // The gauge is set by the pod workers after they report status: wait for it, not race it.
    let metrics_url = format!("{url}/metrics");
    c.wait_for(10, "podpath_node_pods_running 2", |c| {
        c.nodes[0].run(&["curl", "-sS", "--max-time", "5", &metrics_url]).1.contains("podpath_node_pods_running 2")
    })
    .await;
    let metrics = n1.run(&["curl", "-sS", "--max-time", "5", &metrics_url]).1;
    assert!(metrics.contains("podpath_node_cni_operation_duration_seconds_count{operation=\"ADD\",result=\"success\"}"));

    // Agent restart: pods keep running, same PIDs and IPs; a pod deleted meanwhile is cleaned up.
    let crash_sandbox =
        c.nodes[0].records().iter().find(|r| r["name"] == "crash").unwrap()["sandbox"]["pid"].as_i64().unwrap();
    c.nodes[0].stop_agent();
    assert!(pid_alive(pid1), "web-1 must survive its agent");
    c.wait_for(10, "node-1 NotReady", |c| !c.node_ready("node-1")).await;
    c.delete_pod("crash").await;
    c.nodes[0].start_agent();
    c.wait_for(20, "node-1 Ready again", |c| c.node_ready("node-1")).await;
    c.wait_for(10, "the crash pod's sandbox removed", |_| !pid_alive(crash_sandbox as i32)).await;
    let again = c.pod("web-1").unwrap();
    assert_eq!(container_pid(&again), pid1, "web-1 was restarted");
    assert_eq!(pod_ip(&again), ip1);
    assert!(pid_alive(pid1));
    let n1 = &c.nodes[0];
    assert_eq!(n1.run(&["ip", "route", "show", "proto", "77"]).1.lines().count(), 1, "routes duplicated");
    let (ok, page) = in_pod(n1, pid1, &["curl", "-sS", "--max-time", "5", &format!("http://{ip2}:8080/")]);
    assert!(ok && page.contains("pod: default/web-2"), "{page}");
    c.wait_for(10, "only web-1's record left on node-1", |c| c.nodes[0].records().len() == 1).await;

    // Deletion: SIGTERM, CNI DEL (the veth goes), then the pod is removed from the API.
    let ports_before = c.nodes[1].run(&["ip", "-o", "link", "show", "master", "cni0"]).1.lines().count();
    let pid2 = container_pid(&p2);
    c.delete_pod("web-2").await;
    c.wait_for(15, "web-2 gone from the API", |c| c.pod("web-2").is_none()).await;
    assert!(!pid_alive(pid2), "web-2's process still runs");
    let ports_after = c.nodes[1].run(&["ip", "-o", "link", "show", "master", "cni0"]).1.lines().count();
    assert_eq!(ports_after, ports_before - 1, "web-2's veth is still on the bridge");
    assert!(c.nodes[1].records().iter().all(|r| r["name"] != "web-2"));

    drop(c);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// Debian's reference `bridge` + `host-local` plugins configured instead of podpath's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_network_works_with_the_reference_plugins() {
    if !root_or_explain() {
        return;
    }
    assert!(
        std::path::Path::new("/usr/lib/cni/bridge").exists(),
        "the reference plugins are missing: apt-get install containernetworking-plugins"
    );
    let before = host_state();
    let mut c = Cluster::new(2).await;
    for i in 0..2 {
        let n = &c.nodes[i];
        let conf = json!({
            "cniVersion": "1.0.0", "name": "ref",
            "plugins": [{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": format!("10.244.{}.0/24", i + 1)}]],
                         "routes": [{"dst": "0.0.0.0/0"}],
                         "dataDir": n.state.path().join("ipam").display().to_string()}}]
        });
        std::fs::write(n.conf.path().join("10-ref.conflist"), conf.to_string()).unwrap();
        // Pod CIDRs are assigned in registration order: node-1 first.
        c.nodes[i].start_agent();
        let name = c.nodes[i].name.clone();
        c.wait_for(20, "node Ready", |c| c.node_ready(&name)).await;
    }
    c.create_pod(echo_pod("a", "node-1")).await;
    c.create_pod(echo_pod("b", "node-2")).await;
    c.wait_for(30, "a and b Ready", |c| pod_ready(&c.pod("a")) && pod_ready(&c.pod("b"))).await;
    let (a, b) = (c.pod("a").unwrap(), c.pod("b").unwrap());
    assert!(pod_ip(&b).starts_with("10.244.2."), "{}", pod_ip(&b));
    let (ok, page) = in_pod(
        &c.nodes[0],
        container_pid(&a),
        &["curl", "-sS", "--max-time", "5", &format!("http://{}:8080/", pod_ip(&b))],
    );
    assert!(ok && page.contains("pod: default/b") && page.contains(&format!("client: {}:", pod_ip(&a))), "{page}");
    let cache = std::fs::read_dir(c.nodes[0].state.path().join("agent/cni/results")).unwrap().count();
    assert_eq!(cache, 1, "one cached result for pod a");
    c.delete_pod("a").await;
    c.wait_for(15, "a gone", |c| c.pod("a").is_none()).await;
    assert_eq!(std::fs::read_dir(c.nodes[0].state.path().join("agent/cni/results")).unwrap().count(), 0);
    drop(c);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// The iptables proxy on both nodes: a ClusterIP from a node and from a pod, a NodePort of the
/// other node, kube-proxy's rules in `iptables-save`, and `--cleanup`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_reach_pods_through_the_iptables_proxy() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let mut c = Cluster::started(2, &[]).await;
    c.create_pod(echo_pod("web-1", "node-1")).await;
    c.create_pod(echo_pod("web-2", "node-2")).await;
    c.registry
        .create(
            api::Kind::Service,
            Some("default"),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                   "spec": {"type": "NodePort", "selector": {"app": "web"},
                            "ports": [{"port": 80, "targetPort": 8080}]}}),
            &apiserver_lite::registry::WriteOptions::default(),
        )
        .await
        .unwrap();
    c.wait_for(30, "pods Ready", |c| pod_ready(&c.pod("web-1")) && pod_ready(&c.pod("web-2"))).await;
    let svc = c.get(api::Kind::Service, "default", "web").unwrap();
    let cip = svc["spec"]["clusterIP"].as_str().unwrap().to_string();
    let np = svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
    let n1 = &c.nodes[0];
    c.wait_for(20, "the ClusterIP rule on node-1", |c| {
        c.nodes[0].run(&["iptables-save", "-t", "nat"]).1.matches("default/web -> ").count() == 2
    })
    .await;
    let saved = n1.run(&["iptables-save", "-t", "nat"]).1;
    assert!(saved.contains("\"default/web cluster IP\""), "{saved}");
    assert!(
        saved.contains("-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"),
        "{saved}"
    );

    // From the node: both pods answer over the ClusterIP (1 in 2^19 to miss one by chance).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let (ok, page) = n1.run(&["curl", "-sS", "--max-time", "5", &format!("http://{cip}/")]);
        assert!(ok, "{page}");
        seen.insert(page.lines().next().unwrap_or_default().to_string());
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    // From a pod.
    let pid = container_pid(&c.pod("web-1").unwrap());
    let (ok, page) = in_pod(n1, pid, &["curl", "-sS", "--max-time", "5", &format!("http://{cip}/")]);
    assert!(ok && page.contains("pod: default/web-"), "{page}");
    // node-2's NodePort, from node-1.
    let (ok, page) = n1.run(&["curl", "-sS", "--max-time", "5", &format!("http://{}:{np}/", node_ip(2))]);
    assert!(ok && page.contains("pod: default/web-"), "{page}");

    // A restarted agent's full sync finds its jumps in `iptables-save` and adds none twice.
    c.nodes[0].stop_agent();
    c.nodes[0].start_agent();
    c.wait_for(20, "node-1's proxy synced again", |c| {
        c.nodes[0].log().matches("service proxy").count() == 2 && {
            let (ok, page) = c.nodes[0].run(&["curl", "-sS", "--max-time", "2", &format!("http://{cip}/")]);
            ok && page.contains("pod: default/web-")
        }
    })
    .await;
    let saved = c.nodes[0].run(&["iptables-save"]).1;
    for jump in ["-j KUBE-SERVICES", "-j KUBE-POSTROUTING", "-j KUBE-EXTERNAL-SERVICES", "-j KUBE-PROXY-FIREWALL"] {
        let from_builtin = saved
            .lines()
            .filter(|l| {
                l.ends_with(jump)
                    && ["-A INPUT ", "-A FORWARD ", "-A OUTPUT ", "-A PREROUTING ", "-A POSTROUTING "]
                        .iter()
                        .any(|p| l.starts_with(p))
            })
            .count();
        let expected = sync_jumps_to(jump);
        assert_eq!(from_builtin, expected, "{jump} jumps after a restart:\n{saved}");
    }

    // --cleanup removes everything the proxy made.
    c.nodes[0].stop_agent();
    let (ok, out) = c.nodes[0].run(&[env!("CARGO_BIN_EXE_node-agent"), "--cleanup"]);
    assert!(ok, "{out}");
    let left = c.nodes[0].run(&["iptables-save"]).1;
    assert!(!left.contains("KUBE-"), "{left}");
    drop(c);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// How many jumps from built-in chains kube-proxy installs to the chain `-j CHAIN` names.
fn sync_jumps_to(jump: &str) -> usize {
    kube_proxy::sync::JUMPS.iter().filter(|j| jump == format!("-j {}", j.to)).count()
}

async fn create_service(c: &Cluster, body: serde_json::Value) {
    c.registry
        .create(api::Kind::Service, Some("default"), body, &apiserver_lite::registry::WriteOptions::default())
        .await
        .unwrap();
}

/// externalTrafficPolicy: Local keeps the client's address and answers health checks per node;
/// scenario 4 (an external IP routed to a node without the pod) works with the masquerade and
/// hangs without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_traffic_policy_health_checks_and_the_masquerade_knob() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let mut c = Cluster::started(2, &[]).await;
    c.create_pod(echo_pod("web", "node-2")).await;
    create_service(
        &c,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "local"},
        "spec": {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "selector": {"app": "web"},
                 "ports": [{"port": 80, "targetPort": 8080}]}}),
    )
    .await;
    create_service(&c, json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext"},
        "spec": {"externalIPs": ["169.10.10.1"], "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}))
    .await;
    c.wait_for(30, "web Ready", |c| pod_ready(&c.pod("web"))).await;
    // node-2 has the pod (LB IP rule in nat); node-1 has none (the LB IP is dropped in filter).
    c.wait_for(20, "rules on both nodes", |c| {
        let nat = |i: usize| c.nodes[i].run(&["iptables-save", "-t", "nat"]).1;
        nat(0).contains("default/ext external IP") && nat(1).contains("default/local loadbalancer IP")
    })
    .await;
    let svc = c.get(api::Kind::Service, "default", "local").unwrap();
    let hc = svc["spec"]["healthCheckNodePort"].as_i64().unwrap();
    let lb = svc["status"]["loadBalancer"]["ingress"][0]["ip"].as_str().unwrap().to_string();
    let u = &c.underlay;

    // Health checks: 200 where the pod runs, 503 elsewhere.
    let (_, on2) = u.run(&["curl", "-sS", "-i", "--max-time", "5", &format!("http://{}:{hc}/", node_ip(2))]);
    assert!(on2.starts_with("HTTP/1.1 200") && on2.contains("\"localEndpoints\":1"), "{on2}");
    assert!(on2.to_lowercase().contains("x-load-balancing-endpoint-weight: 1"), "{on2}");
    let (_, on1) = u.run(&["curl", "-sS", "-i", "--max-time", "5", &format!("http://{}:{hc}/", node_ip(1))]);
    assert!(on1.starts_with("HTTP/1.1 503") && on1.contains("\"localEndpoints\":0"), "{on1}");

    // The LB IP routed to node-2 (passthrough): the pod sees the client's own address.
    u.ip(&["route", "add", &format!("{lb}/32"), "via", &node_ip(2)]);
    let (ok, page) = u.run(&["curl", "-sS", "--max-time", "5", &format!("http://{lb}/")]);
    assert!(ok && page.contains("client: 192.168.77.10:"), "{page}");

    // Scenario 4: the external IP routed to node-1, which has no pod of the Service.
    u.ip(&["route", "add", "169.10.10.1/32", "via", &node_ip(1)]);
    let (ok, page) = u.run(&["curl", "-sS", "--max-time", "5", "http://169.10.10.1/"]);
    assert!(ok && page.contains(&format!("client: {}:", node_ip(1))), "masqueraded by node-1: {page}");
    c.nodes[0].stop_agent();
    c.nodes[0].extra_args = vec!["--masquerade".into(), "false".into()];
    c.nodes[0].start_agent();
    c.wait_for(20, "node-1 without the external masquerade", |c| {
        let s = c.nodes[0].run(&["iptables-save", "-t", "nat"]).1;
        s.contains("default/ext external IP") && !s.contains("masquerade traffic for default/ext")
    })
    .await;
    let (ok, out) = u.run(&["curl", "-sS", "--max-time", "3", "http://169.10.10.1/"]);
    assert!(!ok, "without the masquerade the reply must not come back: {out}");
    drop(c);
    assert_eq!(host_state(), before, "the host namespace changed");
}
