//! What a new user does first in a cluster, in a real `podpath up` lab with the real kubectl:
//! read a pod's logs (`pods/log`, proxied by the API server to the node agent), and see in
//! `kubectl describe` what the scheduler did. Root only (CI runs as root).

use std::process::Command;
use std::time::Duration;

use podpath_e2e::{text, Lab};
use testkit::netns::root_or_explain;

#[test]
fn kubectl_logs_tail_limit_follow_and_errors() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("logs", &["--nodes", "1"]).unwrap();
    // A container that runs a program of the node in the pod's namespaces and prints a line
    // every 200 ms.
    lab.run_ticker("ticker");
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/ticker", "--timeout=60s"]);
    std::thread::sleep(Duration::from_millis(1500));
    let all = lab.kubectl(&["logs", "ticker"]);
    assert!(all.starts_with("tick 0\ntick 1\n"), "{all}");
    let tail = lab.kubectl(&["logs", "ticker", "--tail=2"]);
    assert_eq!(tail.lines().count(), 2, "{tail}");
    assert!(tail.lines().all(|l| l.starts_with("tick ")), "{tail}");
    assert_eq!(lab.kubectl(&["logs", "ticker", "--limit-bytes=9"]), "tick 0\nti");
    // The monitor keeps each line's time (CRI log format): --timestamps, --since, --since-time.
    let stamped = lab.kubectl(&["logs", "ticker", "--timestamps", "--tail=3"]);
    let lines: Vec<&str> = stamped.lines().collect();
    assert_eq!(lines.len(), 3, "{stamped}");
    let mut times = vec![];
    for l in &lines {
        let (t, rest) = l.split_once(' ').unwrap();
        times.push(t.parse::<jiff::Timestamp>().unwrap_or_else(|e| panic!("{t:?} is not RFC 3339: {e}")));
        assert!(rest.starts_with("tick "), "{l}");
    }
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{stamped}");
    let recent = lab.kubectl(&["logs", "ticker", "--since=1s"]);
    let everything = lab.kubectl(&["logs", "ticker"]);
    assert!(recent.lines().count() <= 7 && everything.lines().count() > recent.lines().count(), "{recent}");
    assert!(everything.contains(&recent), "the last second's lines are in the log:\n{recent}");
    // kubectl sends --since-time with whole seconds (metav1.Time): records from that second on.
    let from = jiff::Timestamp::from_second(times[1].as_second()).unwrap();
    let since_time = lab.kubectl(&["logs", "ticker", "--timestamps", &format!("--since-time={from}")]);
    assert!(since_time.contains(lines[1]) && since_time.contains(lines[2]), "{since_time}");
    for l in since_time.lines() {
        let t: jiff::Timestamp = l.split_once(' ').unwrap().0.parse().unwrap();
        assert!(t >= from, "{l} is before {from}");
    }
    let future = (jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3600)).to_string();
    assert_eq!(lab.kubectl(&["logs", "ticker", &format!("--since-time={future}")]), "");

    // -f streams what comes next until the client stops reading.
    let follow = Command::new("timeout")
        .args(["3", "kubectl", "--kubeconfig"])
        .arg(&lab.kubeconfig)
        .args(["logs", "-f", "ticker", "--tail=1"])
        .output()
        .unwrap();
    let (out, err) = text(&follow);
    assert_eq!(follow.status.code(), Some(124), "still streaming when timeout stopped it: {out}{err}");
    let n: Vec<u64> = out.lines().filter_map(|l| l.strip_prefix("tick ")?.parse().ok()).collect();
    assert!(n.len() >= 8, "about 15 lines in 3 s: {out}");
    assert!(n.windows(2).all(|w| w[1] == w[0] + 1), "in order, none lost: {n:?}");

    // The real server's refusals.
    let fails = |args: &[&str]| {
        let o = Command::new("kubectl").arg("--kubeconfig").arg(&lab.kubeconfig).args(args).output().unwrap();
        assert!(!o.status.success(), "kubectl {args:?} should fail");
        text(&o).1
    };
    let err = fails(&["logs", "ticker", "--previous"]);
    assert!(err.contains("previous terminated container \"ticker\" in pod \"ticker\" not found"), "{err}");
    let err = fails(&["logs", "ticker", "--since=1s", "--since-time=2026-01-01T00:00:00Z"]);
    assert!(err.contains("at most one of `sinceTime` or `sinceSeconds` may be specified"), "{err}");
    let err = fails(&["get", "--raw", "/api/v1/namespaces/default/pods/ticker/log?limitBytes=0"]);
    assert!(err.contains("must be greater than 0"), "{err}");
    let err = fails(&["logs", "nope"]);
    assert!(err.contains("pods \"nope\" not found"), "{err}");

    // describe shows what the scheduler and the node's agent (kubelet's role) did.
    let describe = lab.kubectl(&["describe", "pod", "ticker"]);
    for want in [
        "default-scheduler  Successfully assigned default/ticker to node-1",
        "Normal  Pulled ",
        "kubelet            Container image \"busybox\" already present on machine",
        "Normal  Created ",
        "kubelet            Created container: ticker",
        "Normal  Started ",
        "kubelet            Started container ticker",
    ] {
        assert!(describe.contains(want), "describe lacks {want:?}:\n{describe}");
    }
    // The same Events through events.k8s.io/v1, with that version's field names and schema.
    let v1 =
        lab.kubectl(&["get", "events.v1.events.k8s.io", "--field-selector", "regarding.name=ticker", "-o", "json"]);
    let v1: serde_json::Value = serde_json::from_str(&v1).unwrap();
    let started = v1["items"].as_array().unwrap().iter().find(|e| e["reason"] == "Started").expect("Started");
    assert_eq!(
        (started["apiVersion"].as_str(), started["note"].as_str()),
        (Some("events.k8s.io/v1"), Some("Started container ticker"))
    );
    assert_eq!(started["reportingController"], "kubelet");
    let explain = lab.kubectl(&["explain", "events.regarding", "--api-version=events.k8s.io/v1"]);
    assert!(explain.contains("GROUP:      events.k8s.io") && explain.contains("FIELD: regarding"), "{explain}");
    lab.kubectl(&["delete", "pod", "ticker", "--grace-period=1"]);
    // The events outlive the pod: its termination, then a crash loop and a failing probe.
    let events = lab.kubectl(&["get", "events", "--field-selector", "involvedObject.name=ticker", "-o", "json"]);
    let events: serde_json::Value = serde_json::from_str(&events).unwrap();
    let killing = events["items"].as_array().unwrap().iter().find(|e| e["reason"] == "Killing").expect("Killing");
    assert_eq!(killing["message"], "Stopping container ticker");
    assert_eq!(killing["involvedObject"]["fieldPath"], "spec.containers{ticker}");
    assert_eq!(
        (killing["source"]["component"].as_str(), killing["source"]["host"].as_str()),
        (Some("kubelet"), Some("node-1"))
    );

    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: crash}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'exit 3']\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: unready}\nspec:\n  containers:\n  - name: web\n    image: podpath/echo\n    ports: [{containerPort: 8080}]\n    readinessProbe: {httpGet: {path: /, port: 9999}, periodSeconds: 1}\n",
    );
    let crash = podpath_e2e::wait_for(Duration::from_secs(30), "BackOff and Unhealthy", || {
        let d = lab.kubectl(&["describe", "pod", "crash"]) + &lab.kubectl(&["describe", "pod", "unready"]);
        // A probe can time out while the machine is busy (CI once saw the first one exceed its
        // 1 s); the refused ones that follow are the point.
        if d.contains("Back-off restarting") && d.contains(":9999: connect: connection refused") {
            Ok(d)
        } else {
            Err(d)
        }
    });
    assert!(crash.contains("Back-off restarting failed container c in pod crash_default("), "{crash}");
    assert!(crash.contains("Readiness probe failed: Get \"http://10.244."), "{crash}");
    assert!(crash.contains(":9999/\": dial tcp 10.244."), "{crash}");
    assert!(crash.contains(":9999: connect: connection refused"), "{crash}");
    lab.kubectl(&["delete", "pod", "crash", "unready", "--grace-period=1"]);

    // Each run of a container has its own log; --previous reads the run before the current one,
    // stdout and stderr both.
    lab.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: runs}\nspec:\n  containers:\n  - name: c\n    image: busybox\n    command: [sh, -c, 'echo run $(date +%s%N); echo oops >&2; sleep 4; exit 1']\n",
    );
    podpath_e2e::wait_for(Duration::from_secs(40), "the second run", || {
        let s = lab.kubectl(&["get", "pod", "runs", "-o", "jsonpath={.status.containerStatuses[0].restartCount} {.status.containerStatuses[0].state.running.startedAt}"]);
        if s.starts_with("1 ") && s.len() > 2 {
            Ok(())
        } else {
            Err(s)
        }
    });
    let now = lab.kubectl(&["logs", "runs"]);
    let before = lab.kubectl(&["logs", "runs", "--previous"]);
    for log in [&now, &before] {
        assert!(log.starts_with("run ") && log.ends_with("\noops\n"), "{log}");
    }
    assert_ne!(now, before, "two runs, two logs");
    lab.kubectl(&["delete", "pod", "runs", "--grace-period=1"]);
}

/// `podpath doctor` on a machine that runs labs (CI's): every check passes, exit 0, and trying
/// the kernel features left the host as it was.
#[test]
fn podpath_doctor_says_ready_and_changes_nothing() {
    if !root_or_explain() {
        return;
    }
    let before = testkit::netns::host_state();
    let (ok, out) = podpath_e2e::podpath(&["doctor"]);
    assert!(ok, "{out}");
    for line in ["ok      kernel: veth pairs", "ok      kernel: iptables nat table", "ok      `iptables` on the PATH"] {
        assert!(out.contains(line), "{out}");
    }
    assert!(out.ends_with("ready: `sudo podpath up` can build a lab here\n"), "{out}");
    assert_eq!(testkit::netns::host_state(), before, "doctor changed the host's network namespace");
}

/// "Connecting Applications with Services" expects a 2-replica Deployment spread over a 2-node
/// lab: every time, across 20 scale-ups from zero (the pods of the scale-down still terminating
/// when the next come), with the lab's nodes in their zones.
#[test]
fn a_two_replica_deployment_is_spread_over_two_nodes_every_time() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("spread", &["--nodes", "2"]).expect("podpath up");
    // Each node's Lease, renewed with its heartbeats, as `describe node` shows it.
    let described = lab.kubectl(&["describe", "node", "node-1"]);
    assert!(described.contains("HolderIdentity:  node-1"), "{described}");
    assert!(!described.contains("RenewTime:       <unset>"), "{described}");
    // kube-proxy's metrics server on every node's loopback, as "Using Source IP" reads it.
    for node in ["node-1", "node-2"] {
        assert_eq!(lab.exec(node, &["curl", "-s", "localhost:10249/proxyMode"]), "iptables");
        let metrics = lab.exec(node, &["curl", "-s", "localhost:10249/metrics"]);
        assert!(metrics.contains("kubeproxy_sync_proxy_rules_duration_seconds_count"), "{metrics}");
        // The rules it owns, by table: the nat table's count is what iptables-save shows of
        // kube-proxy's chains (KUBE-*), give or take the jumps from the built-in chains.
        let nat: usize = metrics
            .lines()
            .find_map(|l| l.strip_prefix("kubeproxy_sync_proxy_rules_iptables_total{table=\"nat\"} "))
            .unwrap_or_else(|| panic!("{metrics}"))
            .parse()
            .unwrap();
        let saved = lab.exec(node, &["iptables-save", "-t", "nat"]);
        let ours = saved.lines().filter(|l| l.starts_with("-A KUBE-")).count();
        assert!(nat > 10 && nat.abs_diff(ours) <= 5, "metric {nat}, iptables-save {ours}");
        let configz: serde_json::Value =
            serde_json::from_str(&lab.exec(node, &["curl", "-s", "localhost:10249/configz"])).unwrap();
        let c = &configz["kubeproxy.config.k8s.io"];
        assert_eq!((c["mode"].as_str(), c["hostnameOverride"].as_str()), (Some("iptables"), Some(node)), "{configz}");
        assert_eq!(c["clusterCIDR"], "10.244.0.0/16");
    }
    let zones =
        lab.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.labels.topology\\.kubernetes\\.io/zone}"]);
    assert_eq!(zones, "zone-a zone-b");
    lab.kubectl(&["create", "deployment", "web", "--image=podpath/echo", "--replicas=0"]);
    for run in 0..20 {
        lab.kubectl(&["scale", "deployment", "web", "--replicas=2"]);
        let nodes = podpath_e2e::wait_for(Duration::from_secs(30), "both replicas scheduled", || {
            let out = lab.kubectl(&[
                "get",
                "pods",
                "-l",
                "app=web",
                "-o",
                "jsonpath={range .items[*]}{.metadata.deletionTimestamp}/{.spec.nodeName} {end}",
            ]);
            // The live pods' nodes (a terminating pod has its deletionTimestamp before the /).
            let live: Vec<&str> = out
                .split_whitespace()
                .filter(|e| e.starts_with('/'))
                .map(|e| &e[1..])
                .filter(|n| !n.is_empty())
                .collect();
            if live.len() == 2 {
                Ok(live.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            } else {
                Err(out)
            }
        });
        assert_ne!(nodes[0], nodes[1], "run {run}: both replicas on one node: {nodes:?}");
        lab.kubectl(&["scale", "deployment", "web", "--replicas=0"]);
    }
    // "Using Source IP", type=NodePort: each node's ExternalIP, curled from outside, answers;
    // with externalTrafficPolicy Cluster the pod sees a node's address as the client (SNAT).
    lab.kubectl(&["scale", "deployment", "web", "--replicas=1"]);
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    lab.kubectl(&[
        "expose",
        "deployment",
        "web",
        "--name=nodeport",
        "--port=80",
        "--target-port=8080",
        "--type=NodePort",
    ]);
    let port = lab.kubectl(&["get", "svc", "nodeport", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let externals = lab.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={.items[*].status.addresses[?(@.type==\"ExternalIP\")].address}",
    ]);
    assert_eq!(externals, "192.168.56.11 192.168.56.12");
    for node in externals.split_whitespace() {
        let page = podpath_e2e::wait_for(Duration::from_secs(20), "the NodePort from outside", || {
            let (code, out) = lab.curl(&["-s", "--max-time", "2", &format!("http://{node}:{port}/")]);
            if code == 0 && out.contains("client: ") {
                Ok(out)
            } else {
                Err(out)
            }
        });
        let client = page.lines().find(|l| l.starts_with("client: ")).unwrap_or("");
        assert!(client.starts_with("client: 192.168.56.") || client.starts_with("client: 10.244."), "{page}");
    }
    // The API server's proxy subresources: to a ready endpoint of the Service, to a pod.
    let page = lab.kubectl(&["get", "--raw", "/api/v1/namespaces/default/services/nodeport:80/proxy/hello?x=1"]);
    // kubectl asks for JSON, which the echo server then answers in.
    let v: serde_json::Value = serde_json::from_str(&page).unwrap_or_else(|e| panic!("{e}: {page}"));
    assert!(v["pod"]["name"].as_str().unwrap().starts_with("web-"), "{page}");
    assert!(page.contains("/hello?x=1"), "the path and query reach the pod: {page}");
    assert_eq!(v["client"]["ip"], "192.168.56.10", "from the control plane");
    let pod = lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"]);
    let page = lab.kubectl(&["get", "--raw", &format!("/api/v1/namespaces/default/pods/{pod}:8080/proxy/")]);
    assert!(page.contains(&format!("\"name\": \"{pod}\"")), "{page}");
    lab.kubectl(&["create", "service", "clusterip", "empty", "--tcp=80"]);
    let o = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .args(["get", "--raw", "/api/v1/namespaces/default/services/empty:80/proxy/"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("no endpoints available for service"), "{err}");
}

/// `kubectl top` and the HorizontalPodAutoscaler walkthrough's shape, in a lab: the nodes' and
/// pods' CPU and memory as the kubelets' resource metrics give them, then `kubectl autoscale`
/// (autoscaling/v1) of a Deployment whose pod burns a core against a 100m request: the HPA
/// (read as autoscaling/v2) scales it to its maximum and says why, in its status, conditions
/// and Events. The burners are deleted at once after (bounded: 2 pods, seconds).
#[test]
fn top_shows_usage_and_autoscale_scales_a_busy_deployment() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("hpa", &["--nodes", "1"]).expect("podpath up");
    lab.apply(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: burn}\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: burn}}\n  template:\n    metadata: {labels: {app: burn}}\n    spec:\n      containers:\n      - name: burn\n        image: podpath/echo\n        command: [sh, -c, 'while :; do :; done']\n        resources: {requests: {cpu: 100m}}\n",
    );
    // Two scrapes (5 s apart) before there is a rate.
    let nodes =
        lab.kubectl_until(Duration::from_secs(30), &["top", "nodes", "--no-headers"], |o| o.starts_with("node-1 "));
    let cols: Vec<&str> = nodes.split_whitespace().collect();
    assert!(cols[1].ends_with('m') && cols[3].ends_with("Mi"), "{nodes}");
    let pods = lab.kubectl_until(Duration::from_secs(30), &["top", "pods", "-l", "app=burn", "--no-headers"], |o| {
        o.starts_with("burn-")
    });
    let cpu: i64 = pods.split_whitespace().nth(1).unwrap().trim_end_matches('m').parse().unwrap();
    assert!(cpu > 300, "a busy loop uses most of a core: {pods}");
    let out = lab.kubectl(&["autoscale", "deployment", "burn", "--cpu-percent=50", "--min=1", "--max=2"]);
    assert_eq!(out, "horizontalpodautoscaler.autoscaling/burn autoscaled\n");
    let v1 = lab.kubectl(&[
        "get",
        "horizontalpodautoscalers.v1.autoscaling",
        "burn",
        "-o",
        "jsonpath={.apiVersion} {.spec.targetCPUUtilizationPercentage}",
    ]);
    assert_eq!(v1, "autoscaling/v1 50");
    let scaled = lab.kubectl_until(
        Duration::from_secs(40),
        &["get", "deployment", "burn", "-o", "jsonpath={.spec.replicas}"],
        |r| r == "2",
    );
    assert_eq!(scaled, "2");
    let hpa = lab.kubectl(&["get", "hpa", "burn", "--no-headers"]);
    assert!(hpa.contains("Deployment/burn") && hpa.contains("/50%"), "{hpa}");
    let conds = lab.kubectl(&["get", "hpa", "burn", "-o", "jsonpath={.apiVersion} {.status.conditions[*].reason}"]);
    assert!(conds.starts_with("autoscaling/v2 ") && conds.contains("ValidMetricFound"), "{conds}");
    let events = lab.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=SuccessfulRescale",
        "-o",
        "jsonpath={.items[*].message}",
    ]);
    assert!(
        events.contains("New size: 2; reason: cpu resource utilization (percentage of request) above target"),
        "{events}"
    );
    lab.kubectl(&["delete", "deployment", "burn", "--wait=false"]);
    // Bad input, from a v2 manifest: the real texts.
    let bad = "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata: {name: bad}\nspec:\n  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: burn}\n  minReplicas: 3\n  maxReplicas: 2\n";
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(bad.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = text(&o).1;
    assert!(
        err.contains("spec.maxReplicas: Invalid value: 2: must be greater than or equal to `minReplicas`"),
        "{err}"
    );
}
