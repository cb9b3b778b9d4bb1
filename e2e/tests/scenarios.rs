//! The walkthroughs of docs/scenarios.md, end to end: a real `podpath up` lab (apiserver-lite,
//! node agents, lb-sim, each in its namespace), objects created with the real kubectl, requests
//! made with curl from the lab's external client. Root only (CI runs as root).
//!
//! Each test builds its own lab with a unique name; the `Lab` guard takes it down however the
//! test ends.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use podpath_client::http;
use podpath_e2e::{wait_for, Lab};
use testkit::netns::{host_state, root_or_explain};

/// The line of an `iptables-save` holding every fragment (iptables-save orders matches its own
/// way, so the test does not depend on the order).
fn rule<'a>(rules: &'a str, fragments: &[&str]) -> Option<&'a str> {
    rules.lines().find(|l| fragments.iter().all(|f| l.contains(f)))
}

fn must_rule<'a>(rules: &'a str, fragments: &[&str]) -> &'a str {
    rule(rules, fragments).unwrap_or_else(|| panic!("no rule with {fragments:?} in:\n{rules}"))
}

/// A field of the echo page (`pod: default/x` → `default/x`).
fn field<'a>(page: &'a str, name: &str) -> Option<&'a str> {
    page.lines().find_map(|l| l.strip_prefix(&format!("{name}: ")))
}

/// curls `url` from the client until it answers, returns the page.
fn curl_ok(lab: &Lab, url: &str, extra: &[&str]) -> String {
    wait_for(Duration::from_secs(30), &format!("{url} to answer"), || {
        let mut args = extra.to_vec();
        args.push(url);
        match lab.curl(&args) {
            (0, page) if !page.is_empty() => Ok(page),
            (code, out) => Err(format!("curl exit {code}: {out}")),
        }
    })
}

fn pod(name: &str, node: &str, labels: &str, args: &str, ports: &[u16]) -> String {
    let ports: Vec<String> = ports.iter().map(|p| format!("{{containerPort: {p}}}")).collect();
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{{labels}}}}}\nspec:\n  nodeName: {node}\n  containers:\n  - name: main\n    image: podpath/echo\n    args: [{args}]\n    ports: [{}]\n---\n",
        ports.join(", ")
    )
}

/// A Deployment of podpath/echo pods answering with `message` (the first line of the page).
/// `pod_spec` and `container` add fields to the template's pod spec and to its container (YAML
/// flow mappings, e.g. `nodeSelector: {…}`).
fn deployment(name: &str, replicas: u32, labels: &str, message: &str, pod_spec: &[&str], container: &[&str]) -> String {
    let pod_spec: String = pod_spec.iter().map(|f| format!("      {f}\n")).collect();
    let container: String = container.iter().map(|f| format!("        {f}\n")).collect();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector:\n    matchLabels: {{{labels}}}\n  template:\n    metadata:\n      labels: {{{labels}}}\n    spec:\n{pod_spec}      containers:\n      - name: main\n        image: podpath/echo\n        args: [--message, {message}]\n        ports: [{{containerPort: 8080}}]\n{container}---\n"
    )
}

/// Kept-alive HTTP/1.1 connections from the external client (sockets made by a thread inside
/// its namespace stay there), driven by a runtime of their own.
struct KeptAlive {
    rt: tokio::runtime::Runtime,
    conns: Vec<http::Conn>,
}

impl KeptAlive {
    fn open(lab: &Lab, to: &str, n: usize) -> KeptAlive {
        let ns = std::fs::File::open(format!("/run/netns/pp-{}-client", lab.name)).expect("client namespace");
        let to: std::net::SocketAddr = to.parse().expect("address");
        let sockets: Vec<std::net::TcpStream> = std::thread::spawn(move || {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("enter the client namespace");
            (0..n)
                .map(|_| std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).expect("connect"))
                .collect()
        })
        .join()
        .expect("client thread");
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let conns = rt.block_on(async {
            let mut conns = Vec::new();
            for s in sockets {
                s.set_nonblocking(true).expect("non-blocking socket");
                let s = tokio::net::TcpStream::from_std(s).expect("socket");
                conns.push(http::Conn::over(to, s).await.expect("HTTP connection"));
            }
            conns
        });
        KeptAlive { rt, conns }
    }

    /// One request on connection `i`: the body of a 200, or None if the connection broke.
    fn get(&mut self, i: usize) -> Option<String> {
        let headers = [("Host", "lb")];
        let req = http::Request { headers: &headers, ..http::Request::get("/") };
        let conn = &mut self.conns[i];
        let r = self
            .rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), conn.send(&req)).await })
            .ok()?
            .ok()?;
        (r.status == 200).then(|| r.text())
    }
}

/// Waits until the gateway's passthrough route does (`want`) or does not carry `node_ip`.
fn wait_rotation(lab: &Lab, node_ip: &str, want: bool, limit: Duration, what: &str) {
    wait_for(limit, what, || {
        let nh = lab.exec("gateway", &["ip", "nexthop", "show"]);
        if nh.contains(node_ip) == want {
            Ok(())
        } else {
            Err(nh)
        }
    });
}

fn wait_pods_ready(lab: &Lab, pods: &[&str]) {
    for p in pods {
        lab.kubectl(&["wait", "--for=condition=Ready", &format!("pod/{p}"), "--timeout=60s"]);
    }
}

#[test]
fn scenario_1_passthrough_load_balancer_contour() {
    scenario_1("iptables");
}

/// Scenario 1 again with kube-proxy's nftables mode on the nodes: the same requests succeed,
/// and the node's table `ip kube-proxy` holds the verdict-map elements and chains kube-proxy
/// writes for the Service.
#[test]
fn scenario_1_in_nftables_mode() {
    scenario_1("nftables");
}

fn scenario_1(mode: &str) {
    if !root_or_explain() {
        return;
    }
    let tag = if mode == "nftables" { "s1n" } else { "s1" };
    let lab = Lab::up(tag, &["--nodes", "3", "--proxy-mode", mode]).expect("podpath up");
    let mut yaml = pod("contour-1", "node-1", "app: contour", "\"--https-port\", \"8443\"", &[8080, 8443]);
    yaml += &pod("contour-2", "node-2", "app: contour", "\"--https-port\", \"8443\"", &[8080, 8443]);
    yaml += &pod("client", "node-3", "app: client", "", &[8080]);
    yaml += "apiVersion: v1\nkind: Service\nmetadata: {name: contour}\nspec:\n  type: LoadBalancer\n  selector: {app: contour}\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n  - {name: https, port: 443, targetPort: 8443}\n---\n";
    yaml += "apiVersion: v1\nkind: Service\nmetadata: {name: sticky}\nspec:\n  selector: {app: contour}\n  sessionAffinity: ClientIP\n  ports:\n  - {port: 80, targetPort: 8080}\n";
    lab.apply(&yaml);
    wait_pods_ready(&lab, &["contour-1", "contour-2", "client"]);

    // kubectl shows the allocated external IP and both nodePorts.
    let row = lab.kubectl(&["get", "svc", "contour", "--no-headers"]);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[1], "LoadBalancer", "{row}");
    assert!(cols[2].starts_with("10.9") || cols[2].starts_with("10.1"), "cluster IP from 10.96.0.0/12: {row}");
    let lb_ip = cols[3];
    assert!(lb_ip.starts_with("198.51.100."), "EXTERNAL-IP from the pool: {row}");
    let ports: Vec<&str> = cols[4].split(',').collect();
    assert_eq!(ports.len(), 2, "{row}");
    for (p, svc_port) in ports.iter().zip(["80", "443"]) {
        let (sp, rest) = p.split_once(':').expect("port:nodePort/TCP");
        let np: u16 = rest.strip_suffix("/TCP").and_then(|n| n.parse().ok()).expect("nodePort/TCP");
        assert!(sp == svc_port && (30000..=32767).contains(&np), "{row}");
    }

    // Through the gateway's passthrough route to a pod, over HTTP and HTTPS.
    let page = curl_ok(&lab, &format!("http://{lb_ip}/"), &[]);
    assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/contour-")), "{page}");
    let page = curl_ok(&lab, &format!("https://{lb_ip}/"), &["-k"]);
    assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/contour-")), "{page}");
    // Many connections: both pods answer, and more than one node received them (the gateway
    // spreads flows over its nexthop group by port).
    let (mut pods, mut via) = (BTreeSet::new(), BTreeSet::new());
    for _ in 0..24 {
        let page = curl_ok(&lab, &format!("http://{lb_ip}/"), &[]);
        pods.insert(field(&page, "pod").unwrap_or_default().to_string());
        via.insert(field(&page, "client").unwrap_or_default().rsplit_once(':').unwrap_or_default().0.to_string());
    }
    assert_eq!(pods.len(), 2, "both pods answer: {pods:?}");
    assert!(via.len() >= 2, "flows reach more than one node: {via:?}");
    let routes = lab.exec("gateway", &["ip", "route", "show", lb_ip]);
    assert!(routes.contains("nhid") && routes.contains("proto 78"), "{routes}");

    // node-3 runs neither pod: the packet arrives for the LB IP and port 80, nothing listens
    // there, the nat rules carry it to a pod.
    let listening = lab.exec("node-3", &["ss", "-ltnH"]);
    assert!(!listening.lines().any(|l| l.contains(":80 ") || l.contains(":443 ")), "{listening}");
    let np = lab.kubectl(&["get", "svc", "contour", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let pod_ips: Vec<String> = ["contour-1", "contour-2"]
        .iter()
        .map(|p| lab.kubectl(&["get", "pod", p, "-o", "jsonpath={.status.podIP}"]))
        .collect();
    if mode == "nftables" {
        nftables_rules_of_scenario_1(&lab, lb_ip, &np, &pod_ips);
    } else {
        let rules = lab.exec("node-3", &["iptables-save", "-t", "nat"]);
        let lb_rule = must_rule(
            &rules,
            &[&format!("-d {lb_ip}/32"), "\"default/contour:http loadbalancer IP\"", "--dport 80", "-j KUBE-EXT-"],
        );
        let ext = lb_rule.rsplit(' ').next().unwrap();
        must_rule(&rules, &[&format!("-A {ext} "), "-j KUBE-MARK-MASQ"]);
        let svc = &must_rule(&rules, &[&format!("-A {ext} "), "-j KUBE-SVC-"]).rsplit(' ').next().unwrap().to_string();
        for ip in &pod_ips {
            let sep_line = must_rule(&rules, &[&format!("-A {svc} "), "-j KUBE-SEP-", &format!("{ip}:8080")]);
            let sep = sep_line.rsplit(' ').next().unwrap();
            must_rule(&rules, &[&format!("-A {sep} "), "DNAT", &format!("--to-destination {ip}:8080")]);
            must_rule(&rules, &[&format!("-A {sep} "), &format!("-s {ip}/32"), "-j KUBE-MARK-MASQ"]);
        }
        must_rule(&rules, &["-A KUBE-NODEPORTS", "\"default/contour:http\"", &format!("--dport {np}")]);
    }

    // lb-sim's view: one frontend, routed, three healthy nodes.
    let status = lab.lb_status();
    let f = status["frontends"].as_array().unwrap().iter().find(|f| f["vip"] == lb_ip).expect("frontend");
    assert_eq!(f["delivery"], "route");
    assert_eq!(f["backends"].as_array().unwrap().iter().filter(|b| b["inRotation"] == true).count(), 3, "{f}");
    let (ok, table) = lab.run("status", &[]);
    assert!(ok && table.contains(lb_ip) && table.contains("node-3* healthy"), "{table}");

    // ClusterIP from a pod on another node, and ClientIP session affinity.
    let cip = lab.kubectl(&["get", "svc", "contour", "-o", "jsonpath={.spec.clusterIP}"]);
    let page = lab.exec("pod/default/client", &["curl", "-sS", "--max-time", "5", &format!("http://{cip}/")]);
    assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/contour-")), "{page}");
    let sticky = lab.kubectl(&["get", "svc", "sticky", "-o", "jsonpath={.spec.clusterIP}"]);
    let mut seen = BTreeSet::new();
    for _ in 0..10 {
        let page = lab.exec("pod/default/client", &["curl", "-sS", "--max-time", "5", &format!("http://{sticky}/")]);
        seen.insert(field(&page, "pod").unwrap_or_default().to_string());
    }
    assert_eq!(seen.len(), 1, "ClientIP affinity keeps one pod: {seen:?}");
}

#[test]
fn scenario_2_userspace_proxy_behind_a_nodeport_load_balancer() {
    if !root_or_explain() {
        return;
    }
    let lab =
        Lab::up("s2", &["--nodes", "2", "--proxy-mode", "userspace", "--lb-mode", "nodeport"]).expect("podpath up");
    let mut yaml = pod(
        "cloud-nginx-1",
        "node-1",
        "app: cloud-nginx",
        "\"--redirect-to-https\", \"80\", \"--https-port\", \"443\"",
        &[80, 443],
    );
    // Selected, Ready, but nothing listens on 80/443: the proxy must retry past it.
    yaml += &pod("cloud-nginx-dead", "node-2", "app: cloud-nginx", "", &[8080]);
    yaml += "apiVersion: v1\nkind: Service\nmetadata: {name: cloud-nginx}\nspec:\n  type: LoadBalancer\n  selector: {app: cloud-nginx}\n  ports:\n  - {name: http-server, port: 80, targetPort: 80}\n  - {name: https-server, port: 443, targetPort: 443}\n";
    lab.apply(&yaml);
    wait_pods_ready(&lab, &["cloud-nginx-1", "cloud-nginx-dead"]);
    let lb_ip = lab.lb_ip("cloud-nginx");
    let np = lab.kubectl(&["get", "svc", "cloud-nginx", "-o", "jsonpath={.spec.ports[0].nodePort}"]);

    // LB → NodePort → proxy port → pod: every request answered with the pod's 301.
    let fmt = "%{http_code} %{redirect_url}";
    let first = curl_ok(&lab, &format!("http://{lb_ip}/"), &["-o", "/dev/null", "-w", fmt]);
    assert_eq!(first, format!("301 https://{lb_ip}/"));
    for _ in 0..16 {
        let (code, out) = lab.curl(&["-o", "/dev/null", "-w", fmt, &format!("http://{lb_ip}/")]);
        assert_eq!((code, out.as_str()), (0, format!("301 https://{lb_ip}/").as_str()));
    }
    let page = curl_ok(&lab, &format!("https://{lb_ip}/"), &["-k"]);
    assert_eq!(field(&page, "pod"), Some("default/cloud-nginx-1"), "{page}");
    let logs = lab.run("logs", &["node-1"]).1 + &lab.run("logs", &["node-2"]).1;
    assert!(logs.contains("trying the next endpoint"), "the dead pod was tried and skipped");

    // Straight to a NodePort and to the proxy port of a node.
    let (code, out) = lab.curl(&["-o", "/dev/null", "-w", "%{http_code}", &format!("http://192.168.56.12:{np}/")]);
    assert_eq!((code, out.as_str()), (0, "301"));
    let rules = lab.exec("node-1", &["iptables-save", "-t", "nat"]);
    for chain in ["KUBE-PORTALS-CONTAINER", "KUBE-PORTALS-HOST", "KUBE-NODEPORT-CONTAINER", "KUBE-NODEPORT-HOST"] {
        assert!(rules.contains(&format!(":{chain} ")), "{chain} missing:\n{rules}");
    }
    let portal = must_rule(&rules, &["-A KUBE-PORTALS-CONTAINER", &format!("-d {lb_ip}/32"), "--dport 80", "REDIRECT"]);
    let proxy_port = portal.rsplit(' ').next().unwrap().to_string();
    must_rule(&rules, &["-A KUBE-NODEPORT-CONTAINER", &format!("--dport {np}"), &format!("--to-ports {proxy_port}")]);
    let (code, out) =
        lab.curl(&["-o", "/dev/null", "-w", "%{http_code}", &format!("http://192.168.56.11:{proxy_port}/")]);
    assert_eq!((code, out.as_str()), (0, "301"));
    // The agent holds the NodePort itself.
    let sockets = lab.exec("node-1", &["ss", "-ltnpH"]);
    assert!(
        sockets.lines().any(|l| l.contains(&format!(":{np} ")) && l.contains("node-agent")),
        "NodePort {np} not held by node-agent:\n{sockets}"
    );

    // The LB proxied the connections to node IP:nodePort of healthy nodes.
    let status = lab.lb_status();
    let f = status["frontends"].as_array().unwrap().iter().find(|f| f["vip"] == lb_ip).expect("frontend");
    assert_eq!(f["delivery"], "proxy");
    assert!(
        f["backends"][0]["target"].as_str().unwrap().ends_with(&format!(
            ":{np},{}",
            lab.kubectl(&["get", "svc", "cloud-nginx", "-o", "jsonpath={.spec.ports[1].nodePort}"])
        )),
        "{f}"
    );
    assert!(f["connections"][1].as_u64().unwrap() >= 17, "{f}");
    let addrs = lab.exec("gateway", &["ip", "-o", "addr", "show", "dev", "lo"]);
    assert!(addrs.contains(&format!("{lb_ip}/32")) && addrs.contains("lo:pplb"), "{addrs}");
}

/// Scenario 4: two Deployments (v1, v2) of `app=web-front-end`, `svc-test-1` selecting v2 with
/// an external IP routed to a node that runs none of its pods; then NodePort, then a node
/// failure behind a LoadBalancer.
#[test]
fn scenario_4_external_ip_node_port_selector_and_node_failure() {
    scenario_4("iptables", "current");
}

/// Scenario 4 with kube-proxy's nftables mode on the nodes.
#[test]
fn scenario_4_in_nftables_mode() {
    scenario_4("nftables", "current");
}

/// Scenario 4 with the nftables mode's shared-maps layout: the same requests and failures, the
/// Service held as map elements.
#[test]
fn scenario_4_in_nftables_mode_with_shared_maps() {
    scenario_4("nftables", "shared-maps");
}

fn scenario_4(mode: &str, layout: &str) {
    if !root_or_explain() {
        return;
    }
    let tag = match (mode, layout) {
        ("nftables", "shared-maps") => "s4s",
        ("nftables", _) => "s4n",
        _ => "s4",
    };
    let lab = Lab::up(tag, &["--nodes", "3", "--proxy-mode", mode, "--nftables-layout", layout]).expect("podpath up");
    // Both Deployments on node-1 only, so node-2 (where the external IP is routed) has no pod.
    let on_node_1 = "nodeSelector: {kubernetes.io/hostname: node-1}";
    let mut yaml = deployment("web-v1", 1, "app: web-front-end, version: v1", "v1", &[on_node_1], &[]);
    yaml += &deployment("web-v2", 2, "app: web-front-end, version: v2", "v2", &[on_node_1], &[]);
    yaml += "apiVersion: v1\nkind: Service\nmetadata:\n  name: svc-test-1\n  annotations: {podpath.dev/route-to-node: node-2}\nspec:\n  selector: {app: web-front-end, version: v2}\n  externalIPs: [169.10.10.1]\n  ports:\n  - {port: 80, targetPort: 8080}\n---\n";
    yaml += "apiVersion: v1\nkind: Service\nmetadata: {name: web-lb}\nspec:\n  type: LoadBalancer\n  selector: {app: web-front-end}\n  ports:\n  - {port: 80, targetPort: 8080}\n";
    lab.apply(&yaml);
    lab.kubectl(&["rollout", "status", "deployment/web-v1", "--timeout=60s"]);
    lab.kubectl(&["rollout", "status", "deployment/web-v2", "--timeout=60s"]);
    let nodes = lab.kubectl(&["get", "pods", "-l", "app=web-front-end", "-o", "jsonpath={.items[*].spec.nodeName}"]);
    assert_eq!(nodes, "node-1 node-1 node-1", "the nodeSelector keeps every pod on node-1");

    // The gateway routes the external IP to node-2, which runs none of the pods; node-2 DNATs
    // and masquerades, so the pod sees node-2 as its client.
    let route = wait_for(Duration::from_secs(10), "the external IP's route", || {
        let r = lab.exec("gateway", &["ip", "route", "get", "169.10.10.1"]);
        if r.contains("via 192.168.56.12") {
            Ok(r)
        } else {
            Err(r)
        }
    });
    assert!(route.contains("dev eth0"), "{route}");
    let page = curl_ok(&lab, "http://169.10.10.1/", &[]);
    assert!(page.contains("v2") && field(&page, "pod").is_some_and(|p| p.starts_with("default/web-v2-")), "{page}");
    assert!(field(&page, "client").is_some_and(|c| c.starts_with("192.168.56.12:")), "{page}");
    if layout == "shared-maps" {
        // Elements only: the external IP goes to the shared chain of two endpoints, which marks
        // for masquerade; both endpoints are elements of the shared map under its address.
        let table = lab.exec("node-2", &["nft", "list", "table", "ip", "kube-proxy"]);
        assert!(table.contains("169.10.10.1 . tcp . 80 comment \"default/svc-test-1\" : goto lb-ext-2"), "{table}");
        for i in 0..2 {
            assert!(table.contains(&format!("169.10.10.1 . tcp . 80 . {i} : 10.244.1.")), "endpoint {i}:\n{table}");
        }
        assert!(!table.contains("chain service-") || !table.contains("default/svc-test-1/"), "{table}");
        assert_eq!(
            nft_chain(&lab, "node-2", "lb-ext-2")[0],
            "meta mark set meta mark | 0x00004000 comment \"masquerade\""
        );
    } else if mode == "nftables" {
        let ext = nft_external_chain(&lab, "node-2", "169.10.10.1", "default/svc-test-1/tcp/");
        let rules = nft_chain(&lab, "node-2", &ext);
        assert_eq!(rules[0], "meta mark set meta mark | 0x00004000 comment \"masquerade\"", "{rules:?}");
    } else {
        let rules = lab.exec("node-2", &["iptables-save", "-t", "nat"]);
        let ext_rule = must_rule(&rules, &["-d 169.10.10.1/32", "\"default/svc-test-1 external IP\"", "--dport 80"]);
        let ext = ext_rule.rsplit(' ').next().unwrap();
        must_rule(&rules, &[&format!("-A {ext} "), "-j KUBE-MARK-MASQ"]);
        must_rule(&rules, &["-A KUBE-MARK-MASQ", "0x4000"]);
    }

    // NodePort with nodePort 30000: the same ClusterIP, and every node answers.
    let cip = lab.kubectl(&["get", "svc", "svc-test-1", "-o", "jsonpath={.spec.clusterIP}"]);
    lab.kubectl(&[
        "patch",
        "svc",
        "svc-test-1",
        "--type=merge",
        "-p",
        r#"{"spec":{"type":"NodePort","ports":[{"port":80,"targetPort":8080,"nodePort":30000}]}}"#,
    ]);
    assert_eq!(lab.kubectl(&["get", "svc", "svc-test-1", "-o", "jsonpath={.spec.clusterIP}"]), cip);
    for node in ["192.168.56.11", "192.168.56.12", "192.168.56.13"] {
        let page = curl_ok(&lab, &format!("http://{node}:30000/"), &[]);
        assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/web-v2-")), "{node}: {page}");
    }

    // The selector moves from v2 to v1: the traffic follows.
    lab.kubectl(&["patch", "svc", "svc-test-1", "--type=merge", "-p", r#"{"spec":{"selector":{"version":"v1"}}}"#]);
    wait_for(Duration::from_secs(15), "v1 to answer", || {
        let (_, page) = lab.curl(&["http://169.10.10.1/"]);
        if field(&page, "pod").is_some_and(|p| p.starts_with("default/web-v1-")) {
            Ok(())
        } else {
            Err(page)
        }
    });

    // A node whose agent dies fails its health check: the LB withdraws it, requests go on.
    // Connections in flight through healthy nodes must not notice.
    let lb_ip = lab.lb_ip("web-lb");
    curl_ok(&lab, &format!("http://{lb_ip}/"), &[]);
    let mut open = KeptAlive::open(&lab, &format!("{lb_ip}:80"), 24);
    let via: Vec<String> = (0..open.conns.len())
        .map(|i| {
            let page = open.get(i).expect("first request on a kept-alive connection");
            field(&page, "client").unwrap_or_default().rsplit_once(':').unwrap_or_default().0.to_string()
        })
        .collect();
    let pid = lab.pid("node-3");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .expect("kill node-3's agent");
    let t = Instant::now();
    wait_rotation(&lab, "192.168.56.13", false, Duration::from_secs(10), "node-3 to be withdrawn");
    eprintln!("node-3 withdrawn {:.2} s after its agent was killed", t.elapsed().as_secs_f64());
    let status = lab.lb_status();
    let f = status["frontends"].as_array().unwrap().iter().find(|f| f["vip"] == lb_ip.as_str()).expect("frontend");
    let n3 = f["backends"].as_array().unwrap().iter().find(|b| b["node"] == "node-3").expect("node-3");
    assert_eq!((n3["health"].as_str(), n3["inRotation"].as_bool()), (Some("unhealthy"), Some(false)), "{f}");
    let through_healthy: Vec<usize> = (0..open.conns.len()).filter(|i| via[*i] != "192.168.56.13").collect();
    assert!(!through_healthy.is_empty(), "no connection went through node-1 or node-2: {via:?}");
    for i in &through_healthy {
        let page = open.get(*i);
        assert!(page.is_some(), "connection {i} through {} broke when node-3 was withdrawn", via[*i]);
    }
    eprintln!(
        "{} of {} kept-alive connections went through healthy nodes; all survived node-3's withdrawal",
        through_healthy.len(),
        open.conns.len()
    );
    for _ in 0..12 {
        let (code, page) = lab.curl(&[&format!("http://{lb_ip}/")]);
        assert!(code == 0 && field(&page, "pod").is_some(), "exit {code}: {page}");
    }
    // `kubectl describe svc` tells the story: ensured by the service controller, node-3
    // withdrawn by the load balancer's checks.
    let describe = wait_for(Duration::from_secs(10), "the withdrawal event", || {
        let d = lab.kubectl(&["describe", "svc", "web-lb"]);
        if d.contains("NodeWithdrawn") {
            Ok(d)
        } else {
            Err(d)
        }
    });
    for want in [
        "Normal   EnsuringLoadBalancer",
        "service-controller  Ensuring load balancer",
        "Normal   EnsuredLoadBalancer",
        "service-controller  Ensured load balancer",
        &format!("lb-sim              Node node-3 withdrawn from load balancer {lb_ip}: health check http://192.168.56.13:10256/healthz failed"),
    ] {
        assert!(describe.contains(want), "describe lacks {want:?}:\n{describe}");
    }
}

#[test]
fn scenario_4_without_masquerade_the_request_through_another_node_hangs() {
    if !root_or_explain() {
        return;
    }
    scenario_4_without_masquerade("iptables");
}

/// The same lesson with kube-proxy's nftables mode: the external chain sets no masquerade mark.
#[test]
fn scenario_4_without_masquerade_in_nftables_mode() {
    scenario_4_without_masquerade("nftables");
}

fn scenario_4_without_masquerade(mode: &str) {
    if !root_or_explain() {
        return;
    }
    let tag = if mode == "nftables" { "s4mn" } else { "s4m" };
    let lab = Lab::up(tag, &["--nodes", "2", "--masquerade", "false", "--proxy-mode", mode]).expect("podpath up");
    let mut yaml = pod("web", "node-1", "app: web", "", &[8080]);
    yaml += "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations: {podpath.dev/route-to-node: node-1}\nspec:\n  selector: {app: web}\n  externalIPs: [169.10.10.1]\n  ports:\n  - {port: 80, targetPort: 8080}\n";
    lab.apply(&yaml);
    wait_pods_ready(&lab, &["web"]);
    // Routed to the pod's own node, the reply goes back the way it came: it works.
    let page = curl_ok(&lab, "http://169.10.10.1/", &[]);
    assert!(field(&page, "client").is_some_and(|c| c.starts_with("203.0.113.10:")), "the pod sees the client: {page}");
    // Routed to node-2: node-2 DNATs without masquerading, the pod answers the client straight
    // from its own IP, the client drops that, the connection never completes.
    lab.kubectl(&["annotate", "--overwrite", "svc", "web", "podpath.dev/route-to-node=node-2"]);
    wait_for(Duration::from_secs(10), "the route to move to node-2", || {
        let r = lab.exec("gateway", &["ip", "route", "get", "169.10.10.1"]);
        if r.contains("via 192.168.56.12") {
            Ok(())
        } else {
            Err(r)
        }
    });
    let (code, out) = lab.curl(&["--max-time", "3", "http://169.10.10.1/"]);
    assert_eq!(code, 28, "curl must time out (exit 28): {out}");
    if mode == "nftables" {
        let ext = nft_external_chain(&lab, "node-2", "169.10.10.1", "default/web/tcp/");
        let rules = nft_chain(&lab, "node-2", &ext);
        assert!(!rules.iter().any(|r| r.contains("meta mark")), "no masquerade mark: {rules:?}");
    } else {
        let rules = lab.exec("node-2", &["iptables-save", "-t", "nat"]);
        assert!(
            rule(&rules, &["\"default/web external IP\"", "-j KUBE-MARK-MASQ"]).is_none(),
            "no masquerade:\n{rules}"
        );
    }
}

/// The external chain an address's `service-ips` element leads to on `node` (nftables mode).
fn nft_external_chain(lab: &Lab, node: &str, ip: &str, base: &str) -> String {
    let table = lab.exec(node, &["nft", "list", "table", "ip", "kube-proxy"]);
    let listing = podpath_ruleset::nft::Listing::parse(&table);
    let prefix = format!("{ip} . tcp . 80 : goto external-");
    let el = listing.sets["service-ips"]
        .iter()
        .find(|e| e.starts_with(&prefix) && e.ends_with(base))
        .unwrap_or_else(|| panic!("no element {prefix}…{base} in\n{table}"));
    el.split("goto ").nth(1).unwrap().to_string()
}

/// The rules of one chain of the nftables table on `node`, as nft lists them.
fn nft_chain(lab: &Lab, node: &str, chain: &str) -> Vec<String> {
    let table = lab.exec(node, &["nft", "list", "table", "ip", "kube-proxy"]);
    podpath_ruleset::nft::Listing::parse(&table).chains.get(chain).cloned().unwrap_or_default()
}

#[test]
fn up_and_down_leave_the_host_unchanged_and_nothing_behind() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let lab = Lab::up("hd", &["--nodes", "2"]).expect("podpath up");
    lab.kubectl(&[
        "run",
        "web",
        "--image=podpath/echo",
        "--port=8080",
        "--overrides",
        r#"{"spec":{"nodeName":"node-2"}}"#,
    ]);
    lab.kubectl(&["expose", "pod", "web", "--type=LoadBalancer", "--port=80", "--target-port=8080"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    let lb_ip = lab.lb_ip("web");
    curl_ok(&lab, &format!("http://{lb_ip}/"), &[]);
    let workload: i32 = lab
        .kubectl(&["get", "pod", "web", "-o", "jsonpath={.status.containerStatuses[0].containerID}"])
        .trim_start_matches("podpath://")
        .parse()
        .expect("workload pid");
    let pids: Vec<i32> =
        ["apiserver-lite", "node-1", "node-2", "lb-sim"].iter().map(|c| lab.pid(c)).chain([workload]).collect();
    let (name, state) = (lab.name.clone(), lab.state.clone());
    // Something started by hand in a node, as a node agent restarted by hand: it writes the
    // state directory every 0.2 s. `down` ends it too, and the directory stays gone.
    let stray_dir = state.join("nodes").join("node-1").join("stray");
    struct Stray(std::process::Child);
    impl Drop for Stray {
        fn drop(&mut self) {
            // Whatever the test's outcome, the process it started ends (by its PID).
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut stray = Stray(
        std::process::Command::new("ip")
            .args(["netns", "exec", &format!("pp-{name}-node-1"), "sh", "-c"])
            .arg(format!("while :; do mkdir -p {}; sleep 0.2; done", stray_dir.display()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("a process in node-1"),
    );
    wait_for(Duration::from_secs(5), "the stray process to write", || {
        if stray_dir.exists() {
            Ok(())
        } else {
            Err("not yet".into())
        }
    });
    // Faults of every kind in force, and a NetworkPolicy's rules, when the lab goes down.
    for args in [
        &["stall", "proxy", "node-1"][..],
        &["loss", "node-2", "10"],
        &["blackhole", "node-1", "10.244.2.0/24"],
        &["link", "down", "node-2"],
    ] {
        let (ok, out) = lab.run("fault", args);
        assert!(ok, "fault {args:?}: {out}");
    }
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all}\n\
         spec: {podSelector: {}, policyTypes: [Ingress, Egress]}",
    );
    assert_eq!(lab.run("fault", &["list"]).1.lines().count(), 4, "{}", lab.run("fault", &["list"]).1);
    let (ok, out) = lab.run("down", &[]);
    assert!(ok, "{out}");
    let left = testkit::netns::must(&["ip", "netns", "list"]);
    assert!(!left.contains(&format!("pp-{name}-")), "namespaces left: {left}");
    for pid in pids {
        assert!(podpath_client::daemon::start_time(pid).is_none(), "process {pid} still runs");
    }
    let ended = wait_for(Duration::from_secs(2), "the stray process to end", || match stray.0.try_wait() {
        Ok(Some(status)) => Ok(status),
        other => Err(format!("{other:?}")),
    });
    assert!(!ended.success(), "ended by a signal: {ended:?}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(!state.exists(), "state left in {}", state.display());
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// Scenario 3: an Ingress behind the GCLB-style L7 load balancer. Two Deployments behind
/// NodePort Services; the Ingress sends `/cart` to one and everything else (default backend)
/// to the other; the client's requests go client → LB IP → node IP:nodePort → pod.
#[test]
fn scenario_3_ingress_through_the_l7_load_balancer() {
    scenario_3("iptables");
}

/// Scenario 3 with kube-proxy's nftables mode on the nodes: the L7 load balancer reaches the
/// NodePorts through the nftables table.
#[test]
fn scenario_3_in_nftables_mode() {
    scenario_3("nftables");
}

fn scenario_3(mode: &str) {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up(if mode == "nftables" { "sc3n" } else { "sc3" }, &["--nodes", "2", "--proxy-mode", mode])
        .expect("podpath up");
    lab.kubectl(&["create", "deployment", "web", "--image=podpath/echo", "--replicas=2", "--port=8080"]);
    lab.kubectl(&["create", "deployment", "cart", "--image=podpath/echo", "--replicas=1", "--port=8080"]);
    lab.kubectl(&["expose", "deployment", "web", "--type=NodePort", "--port=80", "--target-port=8080"]);
    lab.kubectl(&["expose", "deployment", "cart", "--type=NodePort", "--port=80", "--target-port=8080"]);
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    lab.kubectl(&["rollout", "status", "deployment/cart", "--timeout=60s"]);
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop}\nspec:\n  \
         defaultBackend: {service: {name: web, port: {number: 80}}}\n  \
         tls: [{hosts: [shop.example]}]\n  \
         rules:\n  - http:\n      paths:\n      - {path: /cart, pathType: Prefix, backend: {service: {name: cart, port: {number: 80}}}}\n",
    );
    let rows: Vec<String> =
        lab.kubectl(&["get", "ingress", "shop", "--no-headers"]).split_whitespace().map(str::to_string).collect();
    let vip = rows[3].clone();
    assert!(vip.starts_with("198.51.100."), "ADDRESS from the LB pool: {rows:?}");
    assert_eq!(rows[4], "80,", "PORTS with tls: {rows:?}");

    // The default backend, then the path rule, each through a node's NodePort.
    let page = curl_ok(&lab, &format!("http://{vip}/"), &[]);
    assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/web-")), "{page}");
    assert!(
        page.contains(&format!("x-forwarded-for: 203.0.113.10, {vip}")),
        "the pod sees the client and the LB: {page}"
    );
    assert!(page.contains("x-forwarded-proto: http\n"), "{page}");
    let client = field(&page, "client").unwrap_or_default();
    assert!(
        client.starts_with("10.244.") || client.starts_with("192.168.56."),
        "from a node, not the client: {client}"
    );
    let page = curl_ok(&lab, &format!("http://{vip}/cart/items"), &[]);
    assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/cart-")), "{page}");
    // HTTPS with the generated certificate (no Secret named).
    let page = curl_ok(&lab, &format!("https://{vip}/cart"), &["-k"]);
    assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/cart-")), "{page}");
    assert!(page.contains("x-forwarded-proto: https\n"), "{page}");
    // Concurrent requests spread over both web pods, through both nodes: the load balancer
    // keeps its upstream connections, and kube-proxy balances connections, not requests, so it
    // takes several connections at once to reach both pods (one client sending request after
    // request rides one kept connection per node).
    let url = format!("http://{vip}/");
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), 32).collect();
    let mut args = vec!["--parallel", "--parallel-immediate", "--parallel-max", "32"];
    args.extend(urls);
    let (_, pages) = lab.curl(&args);
    let pods: BTreeSet<String> = pages.lines().filter_map(|l| l.strip_prefix("pod: ")).map(str::to_string).collect();
    assert_eq!(pods.len(), 2, "{pods:?}");

    // The routing table in lb-sim's status.
    let status = lab.lb_status();
    let site = &status["ingresses"][0];
    assert_eq!(site["ingress"], "default/shop");
    assert_eq!(site["listeners"], "http+https");
    assert_eq!(site["certificate"], "generated");
    let rules = site["rules"].to_string();
    assert!(rules.contains("* /cart (Prefix) → default/cart:80 (nodePort 3"), "{rules}");
    assert_eq!(site["nodesInRotation"], serde_json::json!(["node-1", "node-2"]));

    // A TLS Secret signed by a CA of the test's own: once the Ingress names it, lb-sim serves
    // that certificate, which curl verifies against the CA (no -k).
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca_pem, crt_pem, key_pem) = ca_and_certificate("shop.example");
    for (file, pem) in [("ca.crt", &ca_pem), ("tls.crt", &crt_pem), ("tls.key", &key_pem)] {
        std::fs::write(dir.path().join(file), pem).expect("write PEM");
    }
    let path = |f: &str| dir.path().join(f).display().to_string();
    lab.kubectl(&[
        "create",
        "secret",
        "tls",
        "shop-tls",
        &format!("--cert={}", path("tls.crt")),
        &format!("--key={}", path("tls.key")),
    ]);
    lab.kubectl(&[
        "patch",
        "ingress",
        "shop",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/spec/tls/0/secretName","value":"shop-tls"}]"#,
    ]);
    wait_for(Duration::from_secs(10), "lb-sim to serve the Secret's certificate", || {
        let c = lab.lb_status()["ingresses"][0]["certificate"].clone();
        if c == "secret default/shop-tls" {
            Ok(())
        } else {
            Err(c.to_string())
        }
    });
    // curl runs in the client's namespace but reads files of the host's mount namespace.
    let resolve = format!("shop.example:443:{vip}");
    let page = curl_ok(&lab, "https://shop.example/cart", &["--cacert", &path("ca.crt"), "--resolve", &resolve]);
    assert!(field(&page, "pod").is_some_and(|p| p.starts_with("default/cart-")), "{page}");
    let (code, out) = lab.curl(&["--resolve", &resolve, "https://shop.example/cart"]);
    assert_eq!(code, 60, "without the CA the certificate is not trusted: {out}");

    // A Service without a NodePort: a clear 503; an Ingress without a default backend: 404.
    lab.kubectl(&["create", "service", "clusterip", "internal", "--tcp=80:8080"]);
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: strict}\nspec:\n  rules:\n  - host: strict.example\n    http:\n      paths:\n      - {path: /x, pathType: Exact, backend: {service: {name: internal, port: {number: 80}}}}\n",
    );
    let strict_vip = wait_for(Duration::from_secs(10), "the second Ingress's address", || {
        let ip = lab.kubectl(&["get", "ingress", "strict", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]);
        if ip.is_empty() {
            Err("none".into())
        } else {
            Ok(ip)
        }
    });
    let code = |args: &[&str]| {
        let mut a = vec!["-o", "/dev/null", "-w", "%{http_code}"];
        a.extend_from_slice(args);
        wait_for(Duration::from_secs(10), "an answer", || match lab.curl(&a) {
            (0, out) if out.trim() != "000" => Ok(out.trim().to_string()),
            (c, out) => Err(format!("curl {c}: {out}")),
        })
    };
    assert_eq!(code(&["-H", "Host: strict.example", &format!("http://{strict_vip}/y")]), "404");
    assert_eq!(code(&["-H", "Host: strict.example", &format!("http://{strict_vip}/x")]), "503");
    let (_, page) = lab.curl(&["-H", "Host: strict.example", &format!("http://{strict_vip}/x")]);
    assert!(page.contains("Service default/internal port 80 has no NodePort"), "{page}");
}

/// A CA and a certificate it signs for `host`: (CA PEM, certificate PEM, key PEM).
fn ca_and_certificate(host: &str) -> (String, String, String) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(rcgen::DnType::CommonName, "podpath test CA");
    ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
    let ca_key = rcgen::KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().expect("key");
    let cert =
        rcgen::CertificateParams::new(vec![host.to_string()]).expect("params").signed_by(&key, &issuer).expect("sign");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

/// Scenario 1's Service as kube-proxy's nftables mode (current layout) writes it on node-3:
/// the LB IP's element in `service-ips` leads to the external chain, which marks for
/// masquerade and goes to the service chain, whose one DNAT rule picks one of the two pods by
/// `numgen`; the nodePort's element in `service-nodeports`; the sticky Service's per-endpoint
/// chains with their affinity sets; and no KUBE- chain in iptables.
fn nftables_rules_of_scenario_1(lab: &Lab, lb_ip: &str, np: &str, pod_ips: &[String]) {
    let table = lab.exec("node-3", &["nft", "list", "table", "ip", "kube-proxy"]);
    let line = |fragments: &[&str]| -> String {
        table
            .lines()
            .map(str::trim)
            .find(|l| fragments.iter().all(|f| l.contains(f)))
            .unwrap_or_else(|| panic!("no line with {fragments:?} in\n{table}"))
            .to_string()
    };
    let ext = line(&[&format!("{lb_ip} . tcp . 80 : goto external-")]);
    let ext = ext.split("goto ").nth(1).unwrap().trim_end_matches(',').trim_end_matches(" }").to_string();
    assert!(ext.ends_with("-default/contour/tcp/http"), "{ext}");
    let svc = ext.replacen("external-", "service-", 1);
    let chain = |name: &str| -> Vec<String> {
        let start = table.find(&format!("chain {name} {{")).unwrap_or_else(|| panic!("no chain {name}\n{table}"));
        table[start..].lines().skip(1).map(str::trim).take_while(|l| *l != "}").map(str::to_string).collect()
    };
    assert_eq!(
        chain(&ext),
        ["meta mark set meta mark | 0x00004000 comment \"masquerade\"".to_string(), format!("goto {svc}")]
    );
    let dnat = chain(&svc).join("\n");
    assert!(dnat.starts_with("meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : "), "{dnat}");
    for ip in pod_ips {
        assert!(dnat.contains(&format!("{ip} . 8080")), "{ip} in {dnat}");
    }
    line(&[&format!("tcp . {np} : goto {ext}")]);
    line(&["update @affinity-", "-default/sticky/tcp/__"]);
    line(&["ip daddr @cluster-ips ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000"]);
    let ipt = lab.exec("node-3", &["iptables-save"]);
    assert!(!ipt.contains("KUBE-SERVICES"), "no iptables-mode rules beside the nftables table:\n{ipt}");
    // `podpath rules` lists the table rule by rule and element by element.
    let (ok, rules) = lab.run("rules", &[]);
    assert!(ok && rules.contains(&format!("nft element service-ips: {lb_ip} . tcp . 80 : goto {ext}")), "{rules}");
    assert!(
        rules.contains(&format!("nft chain {svc}: meta l4proto tcp dnat ip to numgen random mod 2 map")),
        "{rules}"
    );
    // `podpath explain` words each map element and rule of the Service.
    let (ok, words) = lab.run("explain", &["contour"]);
    assert!(ok, "{words}");
    for want in [
        format!("{lb_ip}:80/tcp (the LoadBalancer IP) goes to {ext}"),
        format!("NodePort {np}/tcp goes to {ext}"),
        "marks the packet for masquerade".to_string(),
        format!("goes on to {svc}"),
        "DNAT to one of 2 endpoints, picked at random (numgen random mod 2)".to_string(),
        "50.0%".to_string(),
    ] {
        assert!(words.contains(&want), "explain lacks {want:?}:\n{words}");
    }
    let (ok, sticky) = lab.run("explain", &["sticky"]);
    assert!(ok && sticky.contains("a client seen within the affinity time goes back to endpoint-"), "{sticky}");
    assert!(sticky.contains("remembers the client's address (ClientIP affinity)"), "{sticky}");
    // `podpath trace` follows the request through the table: the node names the service-ips
    // element of the LB IP, the Service chain, the numgen DNAT rule and the endpoint it chose.
    let (ok, out, err) = lab.run_apart("trace", &["--output", "json", &format!("http://{lb_ip}/")]);
    let t: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}{err}"));
    assert!(ok && t["outcome"]["status"] == 200, "{t:#}");
    let hop = t["hops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["steps"].as_array().unwrap().iter().any(|s| s["kind"] == "dnat"))
        .unwrap_or_else(|| panic!("no node DNATed the request: {t:#}"));
    assert!(hop["host"].as_str().unwrap().starts_with("node-"), "{hop:#}");
    let step = |kind: &str| hop["steps"].as_array().unwrap().iter().find(|s| s["kind"] == kind).unwrap().clone();
    let walk = step("chain")["text"].as_str().unwrap().to_string();
    assert!(walk.starts_with("nat-prerouting → services\n"), "{walk}");
    assert!(walk.contains(&format!("→ {ext} (map service-ips element {lb_ip} . tcp . 80 : goto {ext})")), "{walk}");
    assert!(walk.contains(&format!("→ {svc}")) && walk.contains("masquerade mark 0x4000"), "{walk}");
    let dnat = step("dnat");
    let chosen = t["pod"].as_str().expect("the pod that answered");
    let text = dnat["text"].as_str().unwrap();
    assert!(
        pod_ips
            .iter()
            .any(|ip| text.starts_with(&format!("DNAT {ip}:8080 (pod {chosen}): numgen random mod 2 picked element "))),
        "{text}"
    );
    assert!(
        dnat["rule"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{svc}: meta l4proto tcp dnat ip to numgen random mod 2 map {{ 0 : ")),
        "{dnat:#}"
    );
    assert_eq!(dnat["object"], "EndpointSlice endpoint of Service default/contour:http");
    assert!(step("snat")["text"].as_str().unwrap().starts_with("masquerading masquerade → source "), "{hop:#}");
    // Nothing of the trace stays behind.
    for h in ["client", "gateway", "node-1", "node-2", "node-3"] {
        let tables = lab.exec(h, &["nft", "list", "tables"]);
        assert!(!tables.contains("podpath-trace"), "trace table left on {h}: {tables}");
    }
}

/// The `-A KUBE-SVC-…` jumps of a Service in a node's nat table: each rule's probability to
/// 4 places ("" for the last, which takes what is left).
fn endpoint_probabilities(lab: &Lab, node: &str, comment: &str) -> Vec<String> {
    let rules = lab.exec(node, &["iptables-save", "-t", "nat"]);
    rules
        .lines()
        .filter(|l| l.starts_with("-A KUBE-SVC-") && l.contains(comment) && l.contains("-j KUBE-SEP-"))
        .map(|l| {
            // iptables-save prints the kernel's 32-bit fixed point back (0.33333333349).
            let p = l.split("--probability ").nth(1).and_then(|p| p.split(' ').next()?.parse::<f64>().ok());
            p.map(|p| format!("{p:.4}")).unwrap_or_default()
        })
        .collect()
}

/// Scaling a Deployment changes the endpoint probabilities in every node's rules; a rolling
/// update (with the usual preStop delay) keeps every request from the client answered.
#[test]
fn deployment_scaling_changes_probabilities_and_a_rolling_update_answers_every_request() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("dep", &["--nodes", "2"]).expect("podpath up");
    // preStop sleep: the pod keeps serving while every node drops it from its rules, which is
    // how Deployments roll without refused connections on real clusters too.
    let mut yaml = deployment("web", 2, "app: web", "v1", &[], &["lifecycle: {preStop: {sleep: {seconds: 2}}}"]);
    yaml += "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: LoadBalancer\n  selector: {app: web}\n  ports:\n  - {name: http, port: 80, targetPort: 8080}\n";
    lab.apply(&yaml);
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let comment = "\"default/web:http -> ";
    let expect = |want: &[&str]| {
        for node in ["node-1", "node-2"] {
            wait_for(Duration::from_secs(15), &format!("{node}'s rules to have probabilities {want:?}"), || {
                let got = endpoint_probabilities(&lab, node, comment);
                if got == want {
                    Ok(())
                } else {
                    Err(format!("{got:?}"))
                }
            });
        }
    };
    expect(&["0.5000", ""]);
    lab.kubectl(&["scale", "deployment/web", "--replicas=3"]);
    expect(&["0.3333", "0.5000", ""]);
    lab.kubectl(&["scale", "deployment/web", "--replicas=1"]);
    expect(&[""]);
    lab.kubectl(&["scale", "deployment/web", "--replicas=3"]);
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    expect(&["0.3333", "0.5000", ""]);

    // The rolling update: v1 → v2 while the client sends one request after another.
    let url = format!("http://{}/", lab.lb_ip("web"));
    curl_ok(&lab, &url, &[]);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (answers, failures) = std::thread::scope(|s| {
        let client = s.spawn(|| {
            let (mut answers, mut failures) = (Vec::new(), Vec::new());
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                match lab.curl(&["--max-time", "5", &url]) {
                    (0, page) if field(&page, "pod").is_some() => answers.push(page),
                    (code, out) => failures.push(format!("curl exit {code}: {out}")),
                }
            }
            (answers, failures)
        });
        lab.kubectl(&[
            "patch",
            "deployment/web",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/template/spec/containers/0/args","value":["--message","v2"]}]"#,
        ]);
        lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=90s"]);
        // Until the old pods have finished their preStop and gone.
        wait_for(Duration::from_secs(30), "only v2 pods", || {
            let pods = lab.kubectl(&["get", "pods", "-l", "app=web", "--no-headers"]);
            if pods.lines().count() == 3 {
                Ok(())
            } else {
                Err(pods)
            }
        });
        std::thread::sleep(Duration::from_millis(500));
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        client.join().expect("client thread")
    });
    let v1 = answers.iter().filter(|p| p.starts_with("v1\n")).count();
    let v2 = answers.iter().filter(|p| p.starts_with("v2\n")).count();
    eprintln!(
        "rolling update: {} requests answered ({v1} by v1, {v2} by v2), {} failed",
        answers.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "requests failed during the rolling update: {failures:?}");
    assert!(v1 > 0 && v2 > 0, "both versions answered: v1 {v1}, v2 {v2} of {}", answers.len());
    assert!(answers.last().is_some_and(|p| p.starts_with("v2\n")), "the last answer is v2: {:?}", answers.last());
    expect(&["0.3333", "0.5000", ""]);
}

/// Rules broken from outside come back within seconds, with a log line and a metric:
/// `iptables -t nat -F` (every chain emptied, none deleted: the canary survives), a rule
/// inserted before ours, one of ours deleted; in nftables mode `nft flush table`.
#[test]
fn rules_changed_from_outside_are_rewritten() {
    if !root_or_explain() {
        return;
    }
    for mode in ["iptables", "nftables"] {
        let lab = Lab::up(if mode == "iptables" { "rep" } else { "repn" }, &["--nodes", "1", "--proxy-mode", mode])
            .expect("podpath up");
        lab.kubectl(&["create", "deployment", "web", "--image=podpath/echo", "--port=8080"]);
        lab.kubectl(&["expose", "deployment", "web", "--type=NodePort", "--port=80", "--target-port=8080"]);
        lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
        let cip = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
        let url = format!("http://{cip}/");
        let answers = || {
            let (ok, _) = lab.run("exec", &["node-1", "--", "curl", "-sS", "--max-time", "1", &url]);
            ok
        };
        wait_for(
            Duration::from_secs(10),
            "the Service to answer",
            || if answers() { Ok(()) } else { Err("no".into()) },
        );
        // Localhost NodePorts: kube-proxy's iptables mode answers them by default
        // (route_localnet), its nftables mode never does.
        let np = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
        let local = format!("http://127.0.0.1:{np}/");
        let (ok, out) = lab.run("exec", &["node-1", "--", "curl", "-sS", "--max-time", "2", &local]);
        assert_eq!(ok, mode == "iptables", "{mode}: {local}: {out}");
        let breakages: Vec<Vec<&str>> = match mode {
            "iptables" => vec![
                vec!["iptables", "-t", "nat", "-F"],
                vec!["iptables", "-t", "nat", "-I", "KUBE-SERVICES", "1", "-j", "RETURN"],
                vec!["iptables", "-t", "nat", "-D", "KUBE-SERVICES", "1"],
            ],
            _ => vec![
                vec!["nft", "flush", "table", "ip", "kube-proxy"],
                vec!["nft", "insert", "rule", "ip", "kube-proxy", "services", "return"],
            ],
        };
        for (i, cmd) in breakages.iter().enumerate() {
            lab.exec("node-1", cmd);
            let t = std::time::Instant::now();
            // The repair is counted, then the Service answers (whichever rule was broken).
            let want = format!("podpath_node_proxy_rules_repaired_total{{kind=\"{mode}\"}} {}", i + 1);
            wait_for(Duration::from_secs(15), &format!("{mode}: the repair of {cmd:?} counted"), || {
                let metrics =
                    lab.exec("node-1", &["curl", "-sS", "--max-time", "2", "http://192.168.56.11:10256/metrics"]);
                if metrics.contains(&want) {
                    Ok(())
                } else {
                    Err(metrics)
                }
            });
            wait_for(Duration::from_secs(5), &format!("{mode}: the Service to answer again after {cmd:?}"), || {
                if answers() {
                    Ok(())
                } else {
                    Err("no answer".into())
                }
            });
            eprintln!("{mode}: {cmd:?} repaired in {:.1} s", t.elapsed().as_secs_f64());
        }
    }
}

/// `podpath fault`: a node's uplink taken down behind the passthrough load balancer (the LB
/// withdraws the node, requests keep being answered), a blackhole route, packet loss; `fault
/// list`, `fault clear` and bad input; `down` with faults in force leaves nothing.
#[test]
fn faults_a_link_down_behind_the_load_balancer_blackhole_and_loss() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let lab = Lab::up("flt", &["--nodes", "2"]).expect("podpath up");
    lab.web_pod_on_each_node_behind_a_load_balancer();
    // Local: each node serves only its own pod, so a node out of rotation takes its pod's
    // share with it (with Cluster, node-1 would still send half of the requests to node-2's
    // pod until node-2 is NotReady and its endpoint removed).
    lab.kubectl(&["patch", "svc", "web", "--type=merge", "-p", r#"{"spec":{"externalTrafficPolicy":"Local"}}"#]);
    let lb_ip = lab.lb_ip("web");
    let url = format!("http://{lb_ip}/");
    curl_ok(&lab, &url, &[]);

    // Bad input: one line, non-zero exit, nothing recorded.
    for (args, want) in [
        (vec!["loss", "node-9", "10"], "no node \"node-9\""),
        (vec!["blackhole", "node-1", "nope"], "\"nope\" is not a CIDR"),
        (vec!["link", "up", "node-1"], "was not taken down"),
    ] {
        let (ok, out) = lab.run("fault", &args);
        assert!(!ok && out.contains(want), "fault {args:?}: {out}");
    }
    assert_eq!(lab.run("fault", &["list"]).1.trim(), "no faults");

    // node-2's uplink down: the LB's health checks withdraw it; the client keeps being served.
    let (ok, out) = lab.run("fault", &["link", "down", "node-2"]);
    assert!(ok && out.contains("node-2: eth0 (the uplink) down"), "{out}");
    let t = Instant::now();
    wait_rotation(&lab, "192.168.56.12", false, Duration::from_secs(15), "node-2 to be withdrawn");
    eprintln!("node-2 withdrawn {:.2} s after its uplink went down", t.elapsed().as_secs_f64());
    for i in 0..20 {
        let (code, page) = lab.curl(&["--max-time", "2", &url]);
        assert_eq!(code, 0, "request {i} with node-2 withdrawn: {page}");
        assert_eq!(field(&page, "pod"), Some("default/web-1"), "{page}");
    }
    let (ok, again) = lab.run("fault", &["link", "down", "node-2"]);
    assert!(!ok && again.contains("already has a link-down fault"), "{again}");

    // A blackhole on node-1 to node-2's pod network, and loss on node-1: listed, then cleared.
    let (ok, out) = lab.run("fault", &["blackhole", "node-1", "10.244.2.0/24"]);
    assert!(ok, "{out}");
    let rules = lab.exec("node-1", &["ip", "rule", "show"]);
    assert!(rules.contains("90:\tfrom all to 10.244.2.0/24 blackhole"), "{rules}");
    let table = lab.exec("node-1", &["nft", "list", "table", "inet", "podpath-blackhole"]);
    assert!(table.contains("ip saddr 10.244.2.0/24 counter"), "{table}");
    let (ok, out) = lab.run("fault", &["loss", "node-1", "30"]);
    assert!(ok, "{out}");
    let table = lab.exec("node-1", &["nft", "list", "table", "inet", "podpath-faults"]);
    assert!(table.contains("numgen random mod 100 < 30"), "{table}");
    // Delay needs netem: made where the kernel has it, refused in one line where not.
    let (ok, out) = lab.run("fault", &["delay", "node-1", "100"]);
    if ok {
        let qdisc = lab.exec("node-1", &["tc", "qdisc", "show", "dev", "eth0"]);
        assert!(qdisc.contains("netem") && qdisc.contains("delay 100"), "{qdisc}");
    } else {
        assert!(out.contains("this kernel cannot delay packets: tc netem is not available"), "{out}");
    }
    let listed = lab.run("fault", &["list"]).1;
    for want in ["node-2   link-down", "node-1   blackhole", "node-1   loss"] {
        assert!(listed.contains(want), "{want:?} in:\n{listed}");
    }
    let (ok, out) = lab.run("fault", &["clear", "node-1"]);
    assert!(ok && out.contains("node-1: cleared packets to and from 10.244.2.0/24 discarded"), "{out}");
    assert!(!lab.exec("node-1", &["ip", "rule", "show"]).contains("blackhole"));
    let (ok, _) = lab.run("exec", &["node-1", "--", "nft", "list", "table", "inet", "podpath-blackhole"]);
    assert!(!ok, "the blackhole's table is gone");
    let (ok, _) = lab.run("exec", &["node-1", "--", "nft", "list", "table", "inet", "podpath-faults"]);
    assert!(!ok, "the loss table is gone");

    // node-2's uplink up again: back in rotation.
    let (ok, out) = lab.run("fault", &["link", "up", "node-2"]);
    assert!(ok, "{out}");
    let t = Instant::now();
    wait_rotation(&lab, "192.168.56.12", true, Duration::from_secs(15), "node-2 back in rotation");
    eprintln!("node-2 back {:.2} s after its uplink came up", t.elapsed().as_secs_f64());
    assert_eq!(lab.run("fault", &["list"]).1.trim(), "no faults");
    // The link took node-2's way back to the client with it (the LB's health checks come from
    // the same network and pass without it): restored with the link.
    let default = lab.exec("node-2", &["ip", "route", "show", "default"]);
    assert!(default.contains("via 192.168.56.2 dev eth0"), "node-2's default route: {default:?}");

    // One-shot faults the cluster repairs: rules flushed (the agent rewrites them), a pod's
    // process killed (restartPolicy Always: the agent starts it again).
    let (ok, out) = lab.run("fault", &["flush-rules", "node-1"]);
    assert!(ok && out.contains("node-1: service proxy rules flushed; the node agent rewrote them"), "{out}");
    curl_ok(&lab, &url, &[]);
    let (ok, out) = lab.run("fault", &["kill", "pod", "default/nope"]);
    assert!(!ok && out.contains("pod default/nope not found"), "{out}");
    let (ok, out) = lab.run("fault", &["kill", "pod", "default/web-1"]);
    assert!(ok && out.contains("pod default/web-1: process"), "{out}");
    wait_for(Duration::from_secs(30), "web-1 restarted and Ready", || {
        let s = lab.kubectl(&[
            "get",
            "pod",
            "web-1",
            "-o",
            "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].ready}",
        ]);
        if s == "1 true" {
            Ok(())
        } else {
            Err(s)
        }
    });
    curl_ok(&lab, &url, &[]);

    // node-2's agent restarted: a new agent process, the same pod process (adopted, not
    // restarted).
    let container = |pod: &str| {
        lab.kubectl(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.containerStatuses[0].containerID} {.status.containerStatuses[0].restartCount}",
        ])
    };
    let (agent, web2) = (lab.pid("node-2"), container("web-2"));
    let (ok, out) = lab.run("agent", &["restart", "node-7"]);
    assert!(!ok && out.contains("no node \"node-7\""), "{out}");
    let (ok, out) = lab.run("agent", &["restart", "node-2"]);
    assert!(ok && out.contains("node-2: agent restarted; healthy and Ready"), "{out}");
    assert_ne!(lab.pid("node-2"), agent, "a new agent");
    assert!(podpath_client::daemon::start_time(agent).is_none(), "the old agent is gone");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(container("web-2"), web2, "web-2's process kept running and was adopted");
    curl_ok(&lab, &url, &[]);

    // node-2 stopped as a node losing power: its agent killed without a word and web-2's
    // process gone, the LB withdraws it, node-1 serves; started again: the agent recreates web-2.
    let web2_pid: i32 = web2.split_whitespace().next().unwrap().trim_start_matches("podpath://").parse().unwrap();
    let (ok, out) = lab.run("node", &["stop", "node-2"]);
    assert!(ok && out.contains("node-2: stopped"), "{out}");
    assert!(podpath_client::daemon::start_time(web2_pid).is_none(), "web-2's process is gone");
    let (ok, out) = lab.run("node", &["start", "node-1"]);
    assert!(!ok && out.contains("node-1's agent is running"), "{out}");
    wait_rotation(&lab, "192.168.56.12", false, Duration::from_secs(15), "node-2 to be withdrawn after its stop");
    for i in 0..10 {
        let (code, page) = lab.curl(&["--max-time", "2", &url]);
        assert_eq!((code, field(&page, "pod")), (0, Some("default/web-1")), "request {i} with node-2 stopped: {page}");
    }
    // It said nothing (a power loss): NotReady as Unknown once the grace period (10 s in a
    // lab) passes, and in the same pass its pod not ready, with the controller's Events.
    wait_for(Duration::from_secs(30), "node-2 NotReady (Unknown)", || {
        let s =
            lab.kubectl(&["get", "node", "node-2", "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"]);
        if s == "Unknown" {
            Ok(())
        } else {
            Err(s)
        }
    });
    let ready = lab.kubectl(&[
        "get",
        "pod",
        "web-2",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} {.status.conditions[?(@.type==\"Ready\")].reason}",
    ]);
    assert_eq!(ready, "False NodeNotReady");
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=web-2",
        "-o",
        "custom-columns=R:.reason,M:.message",
        "--no-headers",
    ]);
    assert!(events.lines().any(|l| l.starts_with("NodeNotReady") && l.ends_with("Node is not ready")), "{events}");
    let (ok, out) = lab.run("node", &["start", "node-2"]);
    assert!(ok && out.contains("node-2: started"), "{out}");
    wait_for(Duration::from_secs(30), "web-2 recreated and Ready", || {
        let s = container("web-2");
        let ready = lab.kubectl(&["get", "pod", "web-2", "-o", "jsonpath={.status.containerStatuses[0].ready}"]);
        if !s.is_empty() && s != web2 && ready == "true" {
            Ok(())
        } else {
            Err(format!("{s} ready={ready}"))
        }
    });
    wait_rotation(&lab, "192.168.56.12", true, Duration::from_secs(15), "node-2 back in rotation after its start");
    curl_ok(&lab, &url, &[]);

    // Down with a fault in force: nothing of the lab remains.
    let (ok, out) = lab.run("fault", &["loss", "node-2", "5"]);
    assert!(ok, "{out}");
    let (name, state) = (lab.name.clone(), lab.state.clone());
    let (ok, out) = lab.run("down", &[]);
    assert!(ok, "{out}");
    assert!(!testkit::netns::must(&["ip", "netns", "list"]).contains(&format!("pp-{name}-")));
    assert!(!state.exists());
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// The lesson "the proxy stalled during a rollout": node-1's service proxy stops syncing, the
/// Service's only pod is replaced (a new address on node-2), and node-1 keeps sending to the
/// old address — requests from node-1's pod fail while node-2's succeed — until the stall is
/// cleared and node-1 catches up. `podpath watch` prints the timeline meanwhile.
#[test]
fn a_stalled_proxy_keeps_a_stale_endpoint_until_it_resumes_and_watch_tells_the_timeline() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("stall", &["--nodes", "2"]).expect("podpath up");
    lab.apply(&deployment("web", 1, "app: web", "v1", &["nodeSelector: {kubernetes.io/hostname: node-2}"], &[]));
    lab.apply(&pod("client-1", "node-1", "app: client", "", &[8080]));
    lab.apply(&pod("client-2", "node-2", "app: client", "", &[8080]));
    lab.kubectl(&["expose", "deployment", "web", "--port=80", "--target-port=8080"]);
    wait_pods_ready(&lab, &["client-1", "client-2"]);
    lab.kubectl(&["wait", "--for=condition=Available", "deployment/web", "--timeout=60s"]);
    let vip = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.clusterIP}"]);
    let url = format!("http://{vip}/");
    let answers = |from: &str| {
        let (ok, out) = lab.run("exec", &[&format!("pod/default/{from}"), "--", "curl", "-sS", "-m", "2", &url]);
        ok && out.contains("v1")
    };
    wait_for(Duration::from_secs(10), "the Service from node-1", || {
        if answers("client-1") {
            Ok(())
        } else {
            Err("no".into())
        }
    });

    // The timeline, read by the real command in the background (ended by PID).
    let log = lab.state.parent().unwrap().join("watch.log");
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let watch_guard = Kill(
        std::process::Command::new(podpath_e2e::bin("podpath"))
            .args(["watch", "--name", &lab.name, "--state-dir", lab.state.to_str().unwrap(), "--interval-ms", "100"])
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );

    let (ok, out) = lab.run("fault", &["stall", "proxy", "node-1"]);
    assert!(ok && out.contains("node-1: service proxy stalled until cleared"), "{out}");
    let old = lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].status.podIP}"]);
    lab.kubectl(&["delete", "pods", "-l", "app=web", "--wait=false"]);
    let new = wait_for(Duration::from_secs(60), "a new web pod, Ready, with another address", || {
        let pods: serde_json::Value =
            serde_json::from_str(&lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "json"]))
                .map_err(|e| e.to_string())?;
        let ready = pods["items"].as_array().into_iter().flatten().find(|p| {
            p["metadata"]["deletionTimestamp"].is_null()
                && p["status"]["podIP"].as_str().is_some_and(|ip| ip != old)
                && p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        });
        match ready {
            Some(p) => Ok(p["status"]["podIP"].as_str().unwrap().to_string()),
            None => Err("not yet".to_string()),
        }
    });
    // node-2 follows the rollout; node-1, stalled, still sends to the old address.
    wait_for(Duration::from_secs(10), "node-2 on the new pod", || {
        if answers("client-2") {
            Ok(())
        } else {
            Err("no".into())
        }
    });
    assert!(!answers("client-1"), "node-1's stalled proxy still DNATs to the gone pod {old}");
    let rules = lab.exec("node-1", &["iptables-save", "-t", "nat"]);
    assert!(rules.contains(&old) && !rules.contains(&new), "node-1 kept the old endpoint's rules:\n{rules}");

    let t = Instant::now();
    let (ok, out) = lab.run("fault", &["clear", "node-1"]);
    assert!(ok, "{out}");
    wait_for(
        Duration::from_secs(10),
        "node-1 caught up",
        || if answers("client-1") { Ok(()) } else { Err("no".into()) },
    );
    eprintln!("stall cleared → node-1 answering again in {:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(400));
    drop(watch_guard);
    let timeline = std::fs::read_to_string(&log).unwrap();
    eprintln!("{timeline}");
    for want in [
        "fault made: node-1 stall-proxy: service proxy stalled until cleared".to_string(),
        format!("-{old}"),
        format!("+{new}"),
        "fault cleared: node-1 stall-proxy".to_string(),
    ] {
        assert!(timeline.contains(&want), "{want:?} missing from the watch timeline:\n{timeline}");
    }
}

/// The lesson "a node partitioned from the API": node-2 can reach the other nodes and its pods
/// but not the API server. Its heartbeats stop, so after the grace period (10 s in the lab) it
/// is NotReady, its pod is not Ready and leaves the Service's endpoints, and node-1's rules stop
/// sending to it; node-2 itself hears nothing of that and keeps its rules, and its pod keeps
/// serving. Every request through the load balancer is answered throughout. Healed, node-2 and
/// its pod come back.
#[test]
fn a_node_partitioned_from_the_api_keeps_serving_while_the_others_drop_its_pods() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("part", &["--nodes", "2"]).expect("podpath up");
    lab.web_pod_on_each_node_behind_a_load_balancer();
    let url = format!("http://{}/", lab.lb_ip("web"));
    curl_ok(&lab, &url, &[]);
    let web2 = lab.kubectl(&["get", "pod", "web-2", "-o", "jsonpath={.status.podIP}"]);
    let ready = |node: &str| {
        lab.kubectl(&["get", "node", node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])
    };

    let t = Instant::now();
    let (ok, out) = lab.run("fault", &["blackhole", "node-2", "192.168.56.10/32"]);
    assert!(ok, "{out}");
    // Requests keep being answered while the cluster notices.
    let mut failed = 0;
    let mut sent = 0;
    let not_ready = wait_for(Duration::from_secs(40), "node-2 NotReady", || {
        sent += 1;
        if lab.curl(&["-m", "2", &url]).0 != 0 {
            failed += 1;
        }
        match ready("node-2").as_str() {
            "True" => Err("still Ready".into()),
            s => Ok(format!("{s} after {:?}", t.elapsed())),
        }
    });
    let gone = wait_for(Duration::from_secs(20), "web-2 out of the endpoints", || {
        let ready = lab.ready_endpoints("web");
        if ready.contains(&web2) {
            Err(format!("{ready:?}"))
        } else {
            Ok(t.elapsed())
        }
    });
    wait_for(Duration::from_secs(10), "node-1's rules without web-2", || {
        let rules = lab.exec("node-1", &["iptables-save", "-t", "nat"]);
        if rules.contains(&format!("{web2}:8080")) {
            Err("still there".into())
        } else {
            Ok(())
        }
    });
    // node-2 cannot hear it: its rules still hold its own pod, which still answers.
    let rules2 = lab.exec("node-2", &["iptables-save", "-t", "nat"]);
    assert!(rules2.contains(&format!("{web2}:8080")), "node-2 keeps its stale rules:\n{rules2}");
    let direct = lab.exec("node-2", &["curl", "-sS", "-m", "2", &format!("http://{web2}:8080/")]);
    assert!(direct.contains("pod: default/web-2"), "{direct}");
    for _ in 0..10 {
        sent += 1;
        if lab.curl(&["-m", "2", &url]).0 != 0 {
            failed += 1;
        }
    }
    eprintln!(
        "partition: node-2 {not_ready}; web-2 out of the endpoints after {gone:?}; {failed} of {sent} requests failed"
    );
    assert_eq!(failed, 0, "requests through the load balancer kept being answered");

    let t = Instant::now();
    let (ok, out) = lab.run("fault", &["clear", "node-2"]);
    assert!(ok, "{out}");
    // Back: node-2 Ready, and web-2 ready again (the agent says so once more after the node
    // controller had marked it not ready) and back among the Service's ready endpoints.
    wait_for(Duration::from_secs(30), "node-2 Ready and web-2 a ready endpoint again", || {
        let ready_eps = lab.ready_endpoints("web");
        if ready("node-2") == "True" && ready_eps.contains(&web2) {
            Ok(())
        } else {
            Err(format!("{ready_eps:?}"))
        }
    });
    eprintln!("healed: node-2 Ready with web-2 back in {:?}", t.elapsed());
}
