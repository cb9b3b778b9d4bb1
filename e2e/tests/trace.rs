//! `podpath trace` in real labs: the hops and the decisive rules of each walkthrough's request,
//! failed requests with where they stopped, and nothing left behind (also on Ctrl-C). Root only.

use std::time::{Duration, Instant};

use podpath_e2e::{bin, wait_for, Lab};
use testkit::netns::{host_state, root_or_explain};

fn trace_json(lab: &Lab, args: &[&str]) -> (bool, serde_json::Value) {
    try_trace_json(lab, args).unwrap_or_else(|e| panic!("{e}"))
}

/// [`trace_json`] for the polling loops: a trace that could not run (a trace monitor that was
/// not subscribed in time on a loaded machine says so in one line) is one more try, not the end.
fn try_trace_json(lab: &Lab, args: &[&str]) -> Result<(bool, serde_json::Value), String> {
    let mut a = vec!["--output", "json"];
    a.extend_from_slice(args);
    let (ok, out, err) = lab.run_apart("trace", &a);
    serde_json::from_str(&out).map(|v| (ok, v)).map_err(|e| format!("trace output is not JSON ({e}): {out}{err}"))
}

fn hosts(t: &serde_json::Value) -> Vec<String> {
    t["hops"].as_array().unwrap().iter().map(|h| h["host"].as_str().unwrap().to_string()).collect()
}

/// Every step text of a hop, joined.
fn steps_of(t: &serde_json::Value, host: &str) -> String {
    let hop = t["hops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host"] == host)
        .unwrap_or_else(|| panic!("no hop {host}: {t:#}"));
    hop["steps"].as_array().unwrap().iter().map(|s| s["text"].as_str().unwrap()).collect::<Vec<_>>().join("\n")
}

/// Whether a host holds a trace table (`nft list tables`), and that listing.
fn has_trace_table(lab: &Lab, host: &str) -> (bool, String) {
    let tables = lab.exec(host, &["nft", "list", "tables"]);
    (tables.contains("podpath-trace"), tables)
}

/// No trace table in any namespace of the lab, and TOS reflection off again.
fn assert_no_trace_rules(lab: &Lab) {
    for h in ["client", "gateway", "node-1", "node-2"] {
        let (left, tables) = has_trace_table(lab, h);
        assert!(!left, "trace table left on {h}:\n{tables}");
        assert_eq!(lab.exec(h, &["cat", "/proc/sys/net/ipv4/tcp_reflect_tos"]).trim(), "0", "{h}");
    }
}

/// The text of the first step of `kind` in a hop.
fn step_of(t: &serde_json::Value, host: &str, kind: &str) -> serde_json::Value {
    t["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["host"] == host)
        .flat_map(|h| h["steps"].as_array().unwrap())
        .find(|s| s["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} step on {host}: {t:#}"))
        .clone()
}

fn lb_ip(lab: &Lab, svc: &str) -> String {
    wait_for(Duration::from_secs(10), "an LB IP", || {
        let ip = lab.kubectl(&["get", "svc", svc, "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]);
        if ip.is_empty() {
            Err("none".into())
        } else {
            Ok(ip)
        }
    })
}

/// Scenario 1: client → gateway (passthrough) → a node's KUBE-EXT/SVC/SEP chains → pod; the
/// same Service explained, and its rules watched while it scales.
#[test]
fn trace_a_load_balancer_request_hop_by_hop_then_with_no_endpoints() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let lab = Lab::up("trc", &["--nodes", "2"]).expect("podpath up");
    lab.kubectl(&["create", "deployment", "web", "--image=podpath/echo", "--replicas=2", "--port=8080"]);
    lab.kubectl(&["expose", "deployment", "web", "--type=LoadBalancer", "--port=80", "--target-port=8080"]);
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let vip = lb_ip(&lab, "web");
    let url = format!("http://{vip}/");
    wait_for(Duration::from_secs(20), "the Service to answer", || match lab.curl(&[&url]) {
        (0, _) => Ok(()),
        (c, o) => Err(format!("{c}: {o}")),
    });
    let pod_ips = lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].status.podIP}"]);
    let t0 = Instant::now();
    let (ok, t) = trace_json(&lab, &[&url]);
    eprintln!("one trace took {:.0} ms", t0.elapsed().as_secs_f64() * 1000.0);
    assert!(ok, "{t:#}");
    let path = hosts(&t);
    assert_eq!(path[..2], ["client", "gateway"], "{t:#}");
    let entry = path[2].clone();
    assert!(entry.starts_with("node-"), "{path:?}");
    assert!(steps_of(&t, "client").starts_with(&format!("route {vip} via 203.0.113.1")));
    assert!(
        steps_of(&t, "gateway").starts_with(&format!("route {vip} → {entry} (passthrough LB of default/web")),
        "{t:#}"
    );
    let node = steps_of(&t, &entry);
    assert!(
        node.contains("\"default/web loadbalancer IP\"; masquerade mark (externalTrafficPolicy: Cluster)"),
        "{node}"
    );
    assert!(node.contains(" of 2 (") && node.contains("→ KUBE-SEP-"), "{node}");
    let pod_ip = t["pod"].as_str().map(|p| p.to_string()).expect("a pod got it");
    assert!(pod_ip.starts_with("default/web-"), "{t:#}");
    let dnat = t["hops"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["steps"].as_array().unwrap())
        .find(|s| s["kind"] == "dnat")
        .expect("a DNAT step");
    let to = dnat["text"].as_str().unwrap().split_whitespace().nth(1).unwrap().split(':').next().unwrap().to_string();
    assert!(pod_ips.split_whitespace().any(|p| p == to), "DNAT to a pod of the Service: {to} vs {pod_ips}");
    assert_eq!(dnat["object"], "EndpointSlice endpoint of Service default/web");
    assert!(node.contains("POSTROUTING MASQUERADE → source "), "{node}");
    assert_eq!(t["outcome"]["status"], 200);
    // The conntrack entry of the node that translated the flow, and what the pod saw.
    let ct = t["conntrack"][0].as_str().unwrap();
    assert!(
        ct.starts_with(&format!("{entry}: 203.0.113.10:")) && ct.contains(&format!("→{vip}:80 ⇄ {to}:8080→")),
        "{ct}"
    );
    let saw = t["pod_saw"].as_str().unwrap();
    assert!(
        saw.starts_with("192.168.56.") || saw.starts_with("10.244."),
        "the pod sees the node, not the client: {saw}"
    );
    assert_no_trace_rules(&lab);

    // Text output: numbered hops, the decisive rule under the DNAT.
    let (ok, text) = lab.run("trace", &[&url]);
    assert!(ok, "{text}");
    assert!(text.starts_with("client 203.0.113.10:"), "{text}");
    assert!(text.contains("2 gateway") && text.contains("-j DNAT --to-destination"), "{text}");
    assert!(text.contains("answered 200 in "), "{text}");
    // The picture: an SVG document with a box per hop.
    let (ok, svg) = lab.run("trace", &["-o", "svg", &url]);
    assert!(ok && svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""), "{svg}");
    assert!(svg.contains("<g id=\"hop-3\">") && svg.trim_end().ends_with("</svg>"), "{svg}");

    // explain: the same rules on both nodes, each endpoint half of the new connections.
    let (ok, text) = lab.run("explain", &["web"]);
    assert!(ok, "{text}");
    assert!(text.starts_with("Service default/web\n  type LoadBalancer, cluster IP 10."), "{text}");
    assert!(text.contains("\nnode-1, node-2 (the same rules on each)\n"), "{text}");
    assert!(text.contains(&format!("to {vip}:80/tcp (loadbalancer IP) → KUBE-EXT-")), "{text}");
    let shares = text.lines().find(|l| l.trim_start().starts_with("new connections: ")).expect("shares");
    assert_eq!(shares.matches(" 50.0%").count(), 2, "{shares}");
    let (ok, json) = lab.run("explain", &["-o", "json", "default/web"]);
    let e: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert!(ok && e["groups"][0]["chains"].as_array().unwrap().iter().any(|c| c["chain"] == "KUBE-SERVICES"));

    // rules --watch: scaling 2 → 3 moves the first endpoint's probability from 1/2 to 1/3
    // (once the DNS pods are Ready, so their EndpointSlice changes are over).
    lab.wait_for_cluster_dns();
    // Ready pods are not yet every node's rules: each proxy syncs the DNS slices on its own, and
    // one still syncing when the watch starts would show the DNS pods' rules in its report.
    let dns = lab.cluster_dns_pods("{.items[*].status.podIP}");
    for node in ["node-1", "node-2"] {
        wait_for(Duration::from_secs(15), &format!("{node}'s rules for every DNS pod"), || {
            let nat = lab.exec(node, &["iptables-save", "-t", "nat"]);
            match dns.split_whitespace().find(|ip| !nat.contains(&format!("--to-destination {ip}:53"))) {
                None => Ok(()),
                Some(ip) => Err(format!("no DNAT to {ip}:53 yet")),
            }
        });
    }
    let mut cmd = std::process::Command::new(bin("podpath"));
    cmd.args(["rules", "--watch", "--name", &lab.name, "--state-dir", lab.state.to_str().unwrap()]);
    let watch = podpath_e2e::LineWatch::spawn(cmd);
    watch.wait_until(Duration::from_secs(10), "the watch to start", |s| {
        s.starts_with("watching the service proxy's rules (node-1 ")
    });
    lab.kubectl(&["scale", "deployment/web", "--replicas=3"]);
    let report = watch
        .wait_until(Duration::from_secs(30), "the probabilities to move", |s| s.contains("probability 0.5 → 0.3333"));
    watch.stop();
    assert!(report.contains("EndpointSlice default/web-"), "{report}");
    assert!(report.contains("  node-1, node-2:\n"), "both nodes change alike: {report}");
    assert!(report.contains("+ nat -A KUBE-SVC-"), "the new endpoint's jump: {report}");
    assert!(report.contains("+ nat -A KUBE-SEP-") && report.contains("-j DNAT --to-destination 10.244."), "{report}");
    // The rules changed since the traces above (which kept their nodes' iptables-save text
    // between traces): the next trace reads the new ones.
    let (ok, t) = trace_json(&lab, &[&url]);
    assert!(ok, "{t:#}");
    let entry = hosts(&t)[2].clone();
    assert!(steps_of(&t, &entry).contains(" of 3 ("), "{t:#}");

    // No endpoints: REJECT on the node the gateway picked, and the trace says so.
    lab.kubectl(&["scale", "deployment/web", "--replicas=0"]);
    let (ok, t) = wait_for(Duration::from_secs(15), "the REJECT rule", || {
        let (ok, t) = try_trace_json(&lab, &[&url])?;
        if t["stopped"].as_str().is_some_and(|s| s.contains("has no endpoints")) {
            Ok((ok, t))
        } else {
            Err(format!("{t:#}"))
        }
    });
    assert!(!ok, "a failed request exits non-zero");
    let stop = t["hops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["steps"].as_array().unwrap().iter().any(|s| s["kind"] == "stop"));
    let stop = stop.unwrap_or_else(|| panic!("a hop with a stop step: {t:#}"));
    assert!(stop["host"].as_str().unwrap().starts_with("node-"), "{t:#}");
    let step = stop["steps"].as_array().unwrap().iter().find(|s| s["kind"] == "stop").unwrap();
    assert_eq!(step["text"], "filter KUBE-EXTERNAL-SERVICES: default/web has no endpoints");
    assert!(step["rule"].as_str().unwrap().ends_with("-j REJECT --reject-with icmp-port-unreachable"));
    assert!(t["outcome"]["error"].as_str().unwrap().contains("refused"), "{t:#}");
    assert_no_trace_rules(&lab);
    let (_, text) = lab.run("explain", &["web"]);
    assert!(text.contains("  filter KUBE-EXTERNAL-SERVICES: "), "{text}");
    assert!(text.contains(&format!("{vip}:80/tcp: reject (default/web has no endpoints)")), "{text}");
    drop(lab);
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// Scenario 4 without masquerade: the reply leaves the pod's node straight to the client,
/// which drops it; the trace shows the reply path and says so. Ctrl-C leaves nothing behind.
#[test]
fn trace_shows_where_an_unmasqueraded_request_stops_and_ctrl_c_cleans_up() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("trm", &["--nodes", "2", "--masquerade", "false"]).expect("podpath up");
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, labels: {app: web}}\nspec:\n  nodeName: node-1\n  containers:\n  - {name: main, image: podpath/echo, ports: [{containerPort: 8080}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  annotations: {podpath.dev/route-to-node: node-2}\nspec:\n  selector: {app: web}\n  externalIPs: [169.10.10.1]\n  ports:\n  - {port: 80, targetPort: 8080}\n",
    );
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    wait_for(Duration::from_secs(10), "the route to node-2", || {
        let r = lab.exec("gateway", &["ip", "route", "get", "169.10.10.1"]);
        if r.contains("via 192.168.56.12") {
            Ok(())
        } else {
            Err(r)
        }
    });
    let (ok, t) = wait_for(Duration::from_secs(15), "the DNAT on node-2", || {
        let (ok, t) = try_trace_json(&lab, &["--timeout", "1", "http://169.10.10.1/"])?;
        if t["hops"].as_array().is_some_and(|h| h.len() >= 4) {
            Ok((ok, t))
        } else {
            Err(format!("{t:#}"))
        }
    });
    assert!(!ok);
    assert_eq!(hosts(&t), ["client", "gateway", "node-2", "node-1"], "{t:#}");
    assert!(steps_of(&t, "node-2").contains("DNAT 10.244.1."), "{t:#}");
    assert!(!steps_of(&t, "node-2").contains("MASQUERADE"), "{t:#}");
    assert_eq!(t["reply_path"], serde_json::json!(["node-1", "gateway", "client"]), "{t:#}");
    let stopped = t["stopped"].as_str().unwrap();
    assert!(
        stopped.starts_with("the reply reached client from 10.244.1.")
            && stopped.contains("(pod default/web) instead of 169.10.10.1"),
        "{stopped}"
    );
    assert_no_trace_rules(&lab);

    // Ctrl-C while the probe waits: exit 130, rules and monitors gone.
    let child = std::process::Command::new(bin("podpath"))
        .args([
            "trace",
            "--name",
            &lab.name,
            "--state-dir",
            lab.state.to_str().unwrap(),
            "--timeout",
            "10",
            "http://169.10.10.1/",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run podpath trace");
    wait_for(Duration::from_secs(10), "the trace table", || match has_trace_table(&lab, "node-1") {
        (true, _) => Ok(()),
        (false, tables) => Err(tables),
    });
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trace rules removed"));
    assert_no_trace_rules(&lab);

    // Killed outright (no cleanup can run): its rules stay, and the next trace removes them
    // before it installs its own, and leaves none. In the iptables modes the trace listens to
    // the kernel itself: it starts no monitor program that could outlive it.
    let mut child = std::process::Command::new(bin("podpath"))
        .args(["trace", "--name", &lab.name, "--state-dir", lab.state.to_str().unwrap(), "--timeout", "10"])
        .arg("http://169.10.10.1/")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run podpath trace");
    let pid = child.id();
    let programs = || -> Vec<String> {
        // The trace's children, alive (not yet zombies), by name.
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|p| {
                let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
                (status.contains(&format!("\nPPid:\t{pid}\n")) && !status.contains("State:\tZ"))
                    .then(|| status.lines().next().unwrap_or_default().to_string())
            })
            .collect()
    };
    wait_for(Duration::from_secs(10), "the trace table", || match has_trace_table(&lab, "node-1") {
        (true, _) => Ok(()),
        (false, tables) => Err(tables),
    });
    let monitors: Vec<String> =
        programs().into_iter().filter(|p| p.contains("monitor") || p.ends_with("\tnft")).collect();
    assert!(monitors.is_empty(), "the trace started monitor programs: {monitors:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(has_trace_table(&lab, "node-1").0, "a killed trace leaves its table");
    let (_, t) = trace_json(&lab, &["--timeout", "1", "http://169.10.10.1/"]);
    assert_eq!(hosts(&t)[..2], ["client", "gateway"], "{t:#}");
    assert_no_trace_rules(&lab);
}

/// Scenario 2: lb-sim's NodePort proxy on the gateway, then a node's userspace proxy, which
/// retries past a pod that refuses; every connection of the request is followed.
#[test]
fn trace_follows_scenario_2_through_both_proxies_and_a_retry() {
    if !root_or_explain() {
        return;
    }
    let lab =
        Lab::up("tr2", &["--nodes", "2", "--proxy-mode", "userspace", "--lb-mode", "nodeport"]).expect("podpath up");
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: cloud-nginx-1, labels: {app: cloud-nginx}}\nspec:\n  nodeName: node-1\n  containers:\n  - {name: main, image: podpath/echo, args: [--redirect-to-https, \"80\", --https-port, \"443\"], ports: [{containerPort: 80}]}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: cloud-nginx-dead, labels: {app: cloud-nginx}}\nspec:\n  nodeName: node-2\n  containers:\n  - {name: main, image: podpath/echo, ports: [{containerPort: 8080}]}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: cloud-nginx}\nspec:\n  type: LoadBalancer\n  selector: {app: cloud-nginx}\n  ports:\n  - {name: http-server, port: 80, targetPort: 80}\n",
    );
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/cloud-nginx-1", "pod/cloud-nginx-dead", "--timeout=60s"]);
    let vip = lb_ip(&lab, "cloud-nginx");
    let np = lab.kubectl(&["get", "svc", "cloud-nginx", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let url = format!("http://{vip}/");
    wait_for(Duration::from_secs(20), "the Service to answer", || match lab.curl(&[&url]) {
        (0, _) => Ok(()),
        (c, o) => Err(format!("{c}: {o}")),
    });
    // Each node's proxy takes its endpoints in turn, so within a few requests through the same
    // node one tries the dead pod first.
    let mut retried = None;
    for _ in 0..8 {
        let (ok, t) = trace_json(&lab, &[&url]);
        assert!(ok, "{t:#}");
        assert_eq!(t["outcome"]["status"], 301, "{t:#}");
        assert_eq!(t["pod"], "default/cloud-nginx-1", "{t:#}");
        let path = hosts(&t);
        assert_eq!(path[..2], ["client", "gateway"], "{t:#}");
        let node = path[2].clone();
        let node_ip = if node == "node-1" { "192.168.56.11" } else { "192.168.56.12" };
        let lb = step_of(&t, "gateway", "relay")["text"].as_str().unwrap().to_string();
        assert!(lb.starts_with(&format!("lb-sim (nodeport LB of default/cloud-nginx) accepted on {vip}:80\n")), "{lb}");
        assert!(lb.contains(&format!(" → {node_ip}:{np} ({node}) connected")), "{lb}");
        let redirect = step_of(&t, &node, "dnat");
        assert!(redirect["text"].as_str().unwrap().starts_with("REDIRECT to proxy port "), "{t:#}");
        assert_eq!(redirect["object"], "Service default/cloud-nginx:http-server");
        assert!(redirect["rule"].as_str().unwrap().starts_with("-A KUBE-NODEPORT-CONTAINER"), "{t:#}");
        let proxy = step_of(&t, &node, "relay")["text"].as_str().unwrap().to_string();
        assert!(
            proxy.starts_with("node-agent's userspace proxy for default/cloud-nginx:http-server accepted on "),
            "{proxy}"
        );
        assert!(proxy.lines().last().unwrap().ends_with("(pod default/cloud-nginx-1) connected"), "{proxy}");
        if proxy.contains("attempt 1: ") {
            retried = Some(proxy);
            break;
        }
    }
    let retried = retried.expect("one of 8 requests tried the dead pod first");
    let lines: Vec<&str> = retried.lines().collect();
    assert!(
        lines[1].contains("(pod default/cloud-nginx-dead) refused (reset from 10.244.2.")
            && lines[2].starts_with("attempt 2: "),
        "{retried}"
    );
    assert_no_trace_rules(&lab);

    // explain: in userspace mode the rules only redirect; it says the proxy picks among both
    // Ready pods (the dead one too: it is Ready but listens on 8080, so port 80 refuses).
    let (ok, text) = lab.run("explain", &["cloud-nginx"]);
    assert!(ok, "{text}");
    assert!(text.contains("redirect to the userspace proxy's port "), "{text}");
    let picks = text.lines().skip_while(|l| !l.starts_with("  endpoints: node-agent's userspace proxy")).nth(1);
    let picks = picks.unwrap_or_else(|| panic!("who picks the endpoint: {text}"));
    assert!(
        picks.starts_with("    port http-server (80/TCP): ")
            && picks.contains("(pod default/cloud-nginx-1)")
            && picks.contains(":80 (pod default/cloud-nginx-dead)"),
        "{picks}"
    );
}

/// Scenario 3: the L7 load balancer ends the HTTP request and opens its own connection to a
/// node's NodePort, chosen by the Ingress rule; and a trace from inside a pod to a ClusterIP.
#[test]
fn trace_follows_scenario_3_through_the_l7_load_balancer_and_from_a_pod() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("tr3", &["--nodes", "2"]).expect("podpath up");
    for d in ["web", "cart"] {
        lab.kubectl(&["create", "deployment", d, "--image=podpath/echo", "--replicas=1", "--port=8080"]);
        lab.kubectl(&["expose", "deployment", d, "--type=NodePort", "--port=80", "--target-port=8080"]);
    }
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop}\nspec:\n  \
         defaultBackend: {service: {name: web, port: {number: 80}}}\n  \
         rules:\n  - http:\n      paths:\n      - {path: /cart, pathType: Prefix, backend: {service: {name: cart, port: {number: 80}}}}\n",
    );
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    lab.kubectl(&["rollout", "status", "deployment/cart", "--timeout=60s"]);
    let vip = wait_for(Duration::from_secs(10), "the Ingress address", || {
        match lab.kubectl(&["get", "ingress", "shop", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]) {
            ip if ip.is_empty() => Err("none".to_string()),
            ip => Ok(ip),
        }
    });
    let url = format!("http://{vip}/cart/items");
    wait_for(Duration::from_secs(20), "the Ingress to answer", || match lab.curl(&["-f", &url]) {
        (0, _) => Ok(()),
        (c, o) => Err(format!("{c}: {o}")),
    });
    let np = lab.kubectl(&["get", "svc", "cart", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let (ok, t) = trace_json(&lab, &[&url]);
    assert!(ok, "{t:#}");
    assert_eq!(t["outcome"]["status"], 200);
    let path = hosts(&t);
    assert_eq!(path[..2], ["client", "gateway"], "{t:#}");
    let node = path[2].clone();
    let lb = step_of(&t, "gateway", "relay");
    let text = lb["text"].as_str().unwrap();
    assert!(text.starts_with(&format!("lb-sim (L7 LB of Ingress default/shop) accepted on {vip}:80\n")), "{text}");
    assert!(text.contains(&format!("Ingress rule * /cart (Prefix) → default/cart:80 (nodePort {np})")), "{text}");
    assert!(text.contains(&format!(":{np} ({node}) connected")), "{text}");
    assert_eq!(lb["object"], "Service default/cart:80");
    // The node's NodePort rules DNAT to the cart pod.
    assert!(steps_of(&t, &node).contains("KUBE-NODEPORTS"), "{t:#}");
    assert_eq!(step_of(&t, &node, "dnat")["object"], "EndpointSlice endpoint of Service default/cart");
    assert!(t["pod"].as_str().unwrap().starts_with("default/cart-"), "{t:#}");

    // From the web pod to cart's ClusterIP: the pod's node is the first host traced.
    let web = lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"]);
    let web_node = lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].spec.nodeName}"]);
    let cip = lab.kubectl(&["get", "svc", "cart", "-o", "jsonpath={.spec.clusterIP}"]);
    let from = format!("pod/default/{web}");
    let (ok, t) = trace_json(&lab, &["--from", &from, &format!("{cip}:80")]);
    assert!(ok, "{t:#}");
    assert_eq!(t["from"], from.as_str());
    assert!(t["src"].as_str().unwrap().starts_with("10.244."), "{t:#}");
    assert_eq!(hosts(&t)[0], web_node, "{t:#}");
    assert!(steps_of(&t, &web_node).contains("\"default/cart cluster IP\""), "{t:#}");
    assert_eq!(step_of(&t, &web_node, "dnat")["object"], "EndpointSlice endpoint of Service default/cart");
    assert!(t["pod"].as_str().unwrap().starts_with("default/cart-"), "{t:#}");
    assert_no_trace_rules(&lab);
}

#[test]
fn trace_and_explain_refuse_bad_input_with_one_line() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("trb", &["--nodes", "1"]).expect("podpath up");
    for (args, want) in [
        (vec!["example.com"], "give http://HOST[:PORT]/PATH or HOST:PORT"),
        (vec!["http://web.default/"], "\"web.default\" is a name: trace a request by name --from pod/NAMESPACE/NAME"),
        (vec!["https://198.51.100.1/"], "trace speaks HTTP only"),
        (vec!["--from", "node-7", "10.96.0.1:80"], "--from \"node-7\": use client, gateway, node-1…node-1"),
        (vec!["--output", "png", "10.96.0.1:80"], "--output \"png\": use text, json or svg"),
    ] {
        let (ok, out) = lab.run("trace", &args);
        assert!(!ok, "{args:?}: {out}");
        assert!(out.contains(want) && out.trim().lines().count() == 1, "{args:?}: {out}");
    }
    for (args, want) in [
        (vec!["nosuch"], "service default/nosuch not found"),
        (vec!["a/b/c"], "give a Service as NAME or NAMESPACE/NAME"),
        (vec!["-o", "yaml", "web"], "--output \"yaml\": use text or json"),
    ] {
        let (ok, out) = lab.run("explain", &args);
        assert!(!ok && out.contains(want) && out.trim().lines().count() == 1, "{args:?}: {out}");
    }
    assert_no_trace_rules_1(&lab);
}

fn assert_no_trace_rules_1(lab: &Lab) {
    for h in ["client", "gateway", "node-1"] {
        assert!(!has_trace_table(lab, h).0, "trace table left on {h}");
    }
}
