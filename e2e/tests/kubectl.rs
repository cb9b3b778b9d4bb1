//! The real kubectl (`/usr/bin/kubectl`, the dispatcher, which runs kubectl 1.32 because the
//! server reports minor 32) against a real apiserver-lite process.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use podpath_e2e::{text, wait_for, ApiServer};

const CONTOUR: &str = "apiVersion: v1
kind: Service
metadata:
  name: contour
spec:
  type: LoadBalancer
  selector:
    app: contour
  ports:
  - name: http
    port: 80
    targetPort: 8080
  - name: https
    port: 443
    targetPort: 8443
";

fn kubectl_available() -> bool {
    std::process::Command::new("kubectl").arg("version").arg("--client").output().is_ok_and(|o| o.status.success())
}

fn ok(srv: &ApiServer, args: &[&str]) -> String {
    srv.kubectl_ok(args)
}

fn fails(srv: &ApiServer, args: &[&str]) -> String {
    srv.kubectl_fails(args)
}

#[test]
fn kubectl_service_lifecycle() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let manifest = srv.dir.path().join("contour.yaml");
    std::fs::write(&manifest, CONTOUR).unwrap();
    let m = manifest.to_str().unwrap();

    // apply with default validation (needs OpenAPI v3 with fieldValidation)
    assert_eq!(ok(&srv, &["apply", "-f", m]), "service/contour created\n");

    // get: the real columns and cells
    let out = ok(&srv, &["get", "svc", "contour"]);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(row[0], "contour");
    assert_eq!(row[1], "LoadBalancer");
    assert!(row[2].starts_with("10."), "{row:?}");
    assert_eq!(row[3], "198.51.100.1");
    let ports: Vec<&str> = row[4].split(',').collect();
    assert!(ports[0].starts_with("80:3") && ports[0].ends_with("/TCP"), "{ports:?}");
    assert!(ports[1].starts_with("443:3") && ports[1].ends_with("/TCP"), "{ports:?}");

    let wide = ok(&srv, &["get", "svc", "-o", "wide"]);
    assert!(wide.lines().next().unwrap().ends_with("SELECTOR"), "{wide}");
    assert!(wide.contains("app=contour"));

    let yaml: serde_yaml::Value = serde_yaml::from_str(&ok(&srv, &["get", "svc", "contour", "-o", "yaml"])).unwrap();
    assert_eq!(yaml["spec"]["ports"][0]["protocol"].as_str(), Some("TCP"));
    assert_eq!(yaml["spec"]["ipFamilyPolicy"].as_str(), Some("SingleStack"));
    let json: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "svc", "-o", "json"])).unwrap();
    assert_eq!(json["kind"], "List");
    let node_ports: Vec<i64> =
        json["items"].as_array().unwrap().iter().find(|s| s["metadata"]["name"] == "contour").unwrap()["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["nodePort"].as_i64().unwrap())
            .collect();

    // explain reads the served OpenAPI v3 schemas (generated from the Kubernetes types).
    let explain = ok(&srv, &["explain", "service.spec.ports"]);
    assert!(explain.contains("FIELD: ports <[]ServicePort>") && explain.contains("nodePort\t<integer>"), "{explain}");
    assert!(explain.contains("The port on each node on which this service is exposed"), "{explain}");
    let explain = ok(&srv, &["explain", "deployment.spec.strategy.rollingUpdate"]);
    assert!(explain.contains("GROUP:      apps") && explain.contains("maxSurge"), "{explain}");

    // re-apply unchanged, then a changed manifest
    assert_eq!(ok(&srv, &["apply", "-f", m]), "service/contour unchanged\n");
    std::fs::write(&manifest, CONTOUR.replace("targetPort: 8443", "targetPort: 9443")).unwrap();
    assert_eq!(ok(&srv, &["apply", "-f", m]), "service/contour configured\n");
    let after: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "svc", "contour", "-o", "json"])).unwrap();
    assert_eq!(after["spec"]["ports"][1]["targetPort"], 9443);
    let kept: Vec<i64> =
        after["spec"]["ports"].as_array().unwrap().iter().map(|p| p["nodePort"].as_i64().unwrap()).collect();
    assert_eq!(kept, node_ports, "nodePorts stay stable across apply");

    assert_eq!(ok(&srv, &["label", "svc", "contour", "team=net"]), "service/contour labeled\n");
    assert!(ok(&srv, &["get", "svc", "-l", "team=net"]).contains("contour"));
    assert!(ok(&srv, &["get", "svc", "--show-labels"]).contains("team=net"));
    assert!(ok(&srv, &["get", "svc", "-A"]).lines().next().unwrap().starts_with("NAMESPACE"));
    assert!(ok(&srv, &["get", "svc", "--sort-by=.metadata.name"]).contains("kubernetes"));

    let describe = ok(&srv, &["describe", "svc", "contour"]);
    for want in [
        "Name:                     contour",
        "Type:                     LoadBalancer",
        "LoadBalancer Ingress:     198.51.100.1",
        "Endpoints:",
    ] {
        assert!(describe.contains(want), "describe lacks {want:?}:\n{describe}");
    }
    let describe = ok(&srv, &["describe", "svc", "kubernetes"]);
    assert!(describe.contains(&format!("Endpoints:                {}", srv.rest)), "{describe}");

    // errors, printed the way a real server's are
    let bad = srv.dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  type: NodePort\n  ports:\n  - port: 80\n    nodePort: 80\n").unwrap();
    let err = fails(&srv, &["apply", "-f", bad.to_str().unwrap()]);
    assert!(err.contains("The Service \"x\" is invalid: spec.ports[0].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-32767"), "{err}");
    let err = fails(&srv, &["create", "-f", m]);
    assert!(err.contains("Error from server (AlreadyExists): error when creating"), "{err}");
    assert!(err.contains("services \"contour\" already exists"), "{err}");
    let err = fails(&srv, &["get", "svc", "nope"]);
    assert_eq!(err.trim(), "Error from server (NotFound): services \"nope\" not found");

    // get -w prints live events; then delete
    let mut watch =
        srv.kubectl_cmd(&["get", "svc", "-w"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let wait_for = |seen: &mut Vec<String>, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while seen.len() < n && Instant::now() < deadline {
            if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
                seen.push(l);
            }
        }
    };
    wait_for(&mut seen, 3); // header + two rows of the initial list
    let other = srv.dir.path().join("web.yaml");
    std::fs::write(&other, "apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  ports:\n  - port: 80\n")
        .unwrap();
    ok(&srv, &["apply", "-f", other.to_str().unwrap()]);
    assert_eq!(ok(&srv, &["delete", "svc", "contour"]), "service \"contour\" deleted\n");
    wait_for(&mut seen, 5);
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen[3].starts_with("web "), "watch saw {seen:?}");
    assert!(seen[4].starts_with("contour "), "watch saw the deletion: {seen:?}");
    let err = fails(&srv, &["get", "svc", "contour"]);
    assert!(err.contains("NotFound"), "{err}");
    assert!(ok(&srv, &["api-resources"]).contains("endpointslices"));
    assert!(ok(&srv, &["get", "all"]).contains("service/web"));
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    assert!(kubectl_available(), "kubectl is required");
    let mut srv = ApiServer::start(&[]).unwrap();
    let manifest = srv.dir.path().join("contour.yaml");
    std::fs::write(&manifest, CONTOUR).unwrap();
    ok(&srv, &["apply", "-f", manifest.to_str().unwrap()]);
    let before: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "svc", "contour", "-o", "json"])).unwrap();
    // kubectl's create was acknowledged; SIGKILL gives the server no chance to flush.
    srv.kill9_and_restart().unwrap();
    let after: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "svc", "contour", "-o", "json"])).unwrap();
    assert_eq!(after["spec"], before["spec"]);
    assert_eq!(after["status"], before["status"]);
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    // The allocations came back too: the same nodePort is refused to another Service.
    let np = before["spec"]["ports"][0]["nodePort"].as_i64().unwrap();
    let clash = srv.dir.path().join("clash.yaml");
    std::fs::write(&clash, format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: clash\nspec:\n  type: NodePort\n  ports:\n  - port: 80\n    nodePort: {np}\n")).unwrap();
    let err = fails(&srv, &["apply", "-f", clash.to_str().unwrap()]);
    assert!(err.contains("provided port is already allocated"), "{err}");
}

#[test]
fn kubectl_pods_nodes_and_namespaces() {
    assert!(kubectl_available(), "kubectl is required");
    let srv = ApiServer::start(&[]).unwrap();
    ok(&srv, &["run", "web", "--image=podpath/echo", "--port=8080", "--labels", "app=web"]);
    let pods = ok(&srv, &["get", "pods", "-o", "wide"]);
    let header: Vec<&str> = pods.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED", "NODE", "READINESS", "GATES"]
    );
    assert!(pods.lines().nth(1).unwrap().starts_with("web    0/1     Pending"), "{pods}");
    ok(&srv, &["expose", "pod", "web", "--port=80", "--target-port=8080"]);
    assert!(ok(&srv, &["get", "svc", "web"]).contains("80/TCP"));
    let nodes = ok(&srv, &["get", "nodes"]);
    assert!(nodes.is_empty() || nodes.contains("NAME"), "{nodes}");
    // Typed-client commands send protobuf bodies.
    assert_eq!(ok(&srv, &["create", "namespace", "team-a"]), "namespace/team-a created\n");
    assert_eq!(
        ok(&srv, &["create", "service", "nodeport", "np", "--tcp=80:8080", "--node-port=30080"]),
        "service/np created\n"
    );
    let np: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "svc", "np", "-o", "json"])).unwrap();
    assert_eq!(np["spec"]["ports"][0]["nodePort"], 30080);
    assert_eq!(np["spec"]["ports"][0]["targetPort"], 8080);
    assert_eq!(np["spec"]["selector"]["app"], "np");
    let ns = ok(&srv, &["get", "ns"]);
    assert!(ns.contains("team-a") && ns.contains("Active"), "{ns}");
    assert_eq!(ok(&srv, &["delete", "namespace", "team-a", "--timeout=20s"]), "namespace \"team-a\" deleted\n");
    let err = fails(&srv, &["delete", "namespace", "default"]);
    assert!(err.contains("this namespace may not be deleted"), "{err}");
    assert_eq!(ok(&srv, &["delete", "pod", "web"]), "pod \"web\" deleted\n");
}

#[test]
fn kubectl_sees_a_node_agent_register_run_a_pod_and_stop() {
    assert!(kubectl_available(), "kubectl is required");
    if !testkit::netns::root_or_explain() {
        return;
    }
    let host_before = testkit::netns::host_state();
    let srv = ApiServer::start(&[]).unwrap();
    // The agent changes routes and sysctls of the namespace it runs in: give it its own, with a
    // relay to the API server on the host's loopback (no link, no route: just a socket).
    let ns = testkit::netns::Netns::new("ppe");
    let _relay = testkit::netns::Relay::start(&ns, "127.0.0.1:6444", srv.grpc);
    let state = tempfile::tempdir().unwrap();
    let agent = std::process::Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(podpath_e2e::bin("node-agent"))
        .args(["--node-name", "node-1", "--node-ip", "192.168.56.11", "--heartbeat-seconds", "1"])
        .args(["--apiserver", "127.0.0.1:6444", "--healthz-bind-address", "127.0.0.1:10256"])
        // TLS to the API, verified against the server's lab CA, with its token.
        .arg("--apiserver-ca-file")
        .arg(srv.data_dir.join("pki/ca.crt"))
        .arg("--token-file")
        .arg(srv.dir.path().join("token"))
        .arg("--state-dir")
        .arg(state.path().join("agent"))
        .arg("--cni-conf-dir")
        .arg(state.path().join("net.d"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(state.path().join("agent.log")).unwrap())
        .spawn()
        .unwrap();
    let mut agent = testkit::netns::ProcGuard(agent);
    struct Pods(std::path::PathBuf);
    impl Drop for Pods {
        fn drop(&mut self) {
            podpath_e2e::kill_pods(&self.0);
        }
    }
    let _pods = Pods(state.path().join("agent"));
    let wait_row = |args: &[&str], want: &dyn Fn(&[String]) -> bool| -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = ok(&srv, args);
            let row: Vec<String> =
                out.lines().nth(1).map(|l| l.split_whitespace().map(str::to_string).collect()).unwrap_or_default();
            if want(&row) || Instant::now() > deadline {
                return row;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let r = wait_row(&["get", "nodes", "-o", "wide"], &|r| r.get(1).map(String::as_str) == Some("Ready"));
    let log = || std::fs::read_to_string(state.path().join("agent.log")).unwrap_or_default();
    assert_eq!((r[0].as_str(), r[1].as_str()), ("node-1", "Ready"), "{r:?}\n{}", log());
    assert_eq!(r[5], "192.168.56.11", "INTERNAL-IP: {r:?}");
    let node: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "node", "node-1", "-o", "json"])).unwrap();
    assert_eq!(node["spec"]["podCIDR"], "10.244.1.0/24");

    // kubectl run → the scheduler picks node-1 → the agent runs it: Running, 1/1, an IP.
    ok(&srv, &["run", "web", "--image=podpath/echo", "--port=8080", "--labels", "app=web"]);
    let r = wait_row(&["get", "pods", "-o", "wide"], &|r| r.get(1).map(String::as_str) == Some("1/1"));
    assert_eq!((r[0].as_str(), r[1].as_str(), r[2].as_str()), ("web", "1/1", "Running"), "{r:?}\n{}", log());
    assert!(r[5].starts_with("10.244.1."), "IP: {r:?}");
    assert_eq!(r[6], "node-1", "NODE: {r:?}");
    let (_, page) = ns.run(&["curl", "-sS", "--max-time", "5", &format!("http://{}:8080/", r[5])]);
    assert!(page.contains("pod: default/web") && page.contains("node: node-1"), "{page}");
    ok(&srv, &["delete", "pod", "web", "--wait=true", "--timeout=20s"]);
    assert!(fails(&srv, &["get", "pod", "web"]).contains("NotFound"));

    // SIGTERM (by PID): the agent reports NotReady on its way out.
    agent.stop();
    let r = wait_row(&["get", "nodes", "-o", "wide"], &|_| true);
    assert_eq!(r[1], "NotReady", "{r:?}");
    drop(ns);
    assert_eq!(testkit::netns::host_state(), host_before, "the host namespace changed");
}

/// Plays kubelet for pods that have no node agent: marks new pods Running and Ready, and
/// finishes the deletion of terminating ones. Stops when `stop` is set.
fn fake_kubelet(srv: &ApiServer, stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let o = srv.kubectl(&["get", "pods", "-o", "json"]);
        let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        for (i, p) in list["items"].as_array().cloned().unwrap_or_default().iter().enumerate() {
            let name = p["metadata"]["name"].as_str().unwrap_or("");
            if p["metadata"].get("deletionTimestamp").is_some() {
                srv.kubectl(&["delete", "pod", name, "--grace-period=0", "--force", "--wait=false"]);
            } else if p["status"]["phase"] != "Running" {
                let status = serde_json::json!({"status": {"phase": "Running", "podIP": format!("10.244.9.{}", i + 2),
                    "conditions": [{"type": "Ready", "status": "True"}]}});
                srv.kubectl(&["patch", "pod", name, "--subresource=status", "--type=merge", "-p", &status.to_string()]);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn lines_of(out: &str) -> Vec<Vec<String>> {
    out.lines().map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
}

#[test]
fn kubectl_deployment_lifecycle() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| fake_kubelet(&srv, &stop));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| deployment_steps(&srv)));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    });
}

fn deployment_steps(srv: &ApiServer) {
    assert_eq!(
        ok(srv, &["create", "deployment", "web", "--image=podpath/echo:v1", "--replicas=3", "--port=8080"]),
        "deployment.apps/web created\n"
    );
    let out = ok(srv, &["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert!(out.ends_with("deployment \"web\" successfully rolled out\n"), "{out}");
    let rows = lines_of(&ok(srv, &["get", "deploy", "web", "-o", "wide"]));
    assert_eq!(rows[0], ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"]);
    assert_eq!(rows[1][..4], ["web", "3/3", "3", "3"]);
    assert_eq!(rows[1][5..], ["echo", "podpath/echo:v1", "app=web"]);
    let rows = lines_of(&ok(srv, &["get", "rs"]));
    assert_eq!(rows[0], ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    let rs1 = rows[1][0].clone();
    assert!(rs1.starts_with("web-") && rows[1][1..4] == ["3", "3", "3"], "{rows:?}");
    let pods = ok(srv, &["get", "pods", "-o", "name"]);
    assert_eq!(pods.lines().count(), 3, "{pods}");
    for p in pods.lines() {
        let suffix = p.strip_prefix(&format!("pod/{rs1}-")).unwrap_or_else(|| panic!("{p} is not {rs1}-xxxxx"));
        assert_eq!(suffix.len(), 5, "{p}");
    }
    let owner = ok(
        srv,
        &["get", "rs", &rs1, "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}"],
    );
    assert_eq!(owner, "Deployment/web");

    // describe tells the story in Events, as the real controllers write them.
    let describe = ok(srv, &["describe", "deployment", "web"]);
    assert!(
        describe.contains("Normal  ScalingReplicaSet  ")
            && describe.contains(&format!("deployment-controller  Scaled up replica set {rs1} from 0 to 3")),
        "{describe}"
    );
    let describe = ok(srv, &["describe", "rs", &rs1]);
    assert!(describe.contains("SuccessfulCreate") && describe.contains(&format!("Created pod: {rs1}-")), "{describe}");
    let events = ok(srv, &["get", "events"]);
    assert!(events.contains("replicaset/") && events.contains("deployment/web"), "{events}");

    // scale (the scale subresource, found through discovery)
    assert_eq!(ok(srv, &["scale", "deployment", "web", "--replicas=5"]), "deployment.apps/web scaled\n");
    ok(srv, &["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert_eq!(ok(srv, &["get", "pods", "-o", "name"]).lines().count(), 5);
    assert_eq!(ok(srv, &["get", "deploy", "web", "-o", "jsonpath={.status.availableReplicas}"]), "5");

    // a rolling update to a new image: a second ReplicaSet takes over, the first keeps 0
    assert_eq!(
        ok(srv, &["set", "image", "deployment/web", "echo=podpath/echo:v2"]),
        "deployment.apps/web image updated\n"
    );
    let out = ok(srv, &["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert!(out.ends_with("deployment \"web\" successfully rolled out\n"), "{out}");
    let rows = lines_of(&ok(srv, &["get", "rs", "--no-headers"]));
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        let want = if r[0] == rs1 { "0" } else { "5" };
        assert_eq!(r[1], want, "{rows:?}");
    }
    let images = ok(srv, &["get", "pods", "-o", "jsonpath={.items[*].spec.containers[0].image}"]);
    assert_eq!(images.split_whitespace().collect::<Vec<_>>(), ["podpath/echo:v2"; 5], "every pod runs v2");
    let history = ok(srv, &["rollout", "history", "deployment/web"]);
    assert!(history.contains("REVISION") && history.contains("\n1 ") && history.contains("\n2 "), "{history}");

    // rollout undo: back to revision 1 by reusing its ReplicaSet, which becomes revision 3
    // (history lists each template once)
    assert_eq!(ok(srv, &["rollout", "undo", "deployment/web"]), "deployment.apps/web rolled back\n");
    ok(srv, &["rollout", "status", "deployment/web", "--timeout=60s"]);
    let rows = lines_of(&ok(srv, &["get", "rs", "--no-headers"]));
    assert_eq!(rows.len(), 2, "no new ReplicaSet: {rows:?}");
    assert!(rows.iter().any(|r| r[0] == rs1 && r[1] == "5"), "{rows:?}");
    let history = ok(srv, &["rollout", "history", "deployment/web"]);
    assert!(!history.contains("\n1 ") && history.contains("\n2 ") && history.contains("\n3 "), "{history}");
    let images = ok(srv, &["get", "pods", "-o", "jsonpath={.items[*].spec.containers[0].image}"]);
    assert_eq!(images.split_whitespace().collect::<Vec<_>>(), ["podpath/echo:v1"; 5]);

    // rollout pause: a template change rolls nothing out (scaling still works) until resume
    assert_eq!(ok(srv, &["rollout", "pause", "deployment/web"]), "deployment.apps/web paused\n");
    ok(srv, &["set", "image", "deployment/web", "echo=podpath/echo:v3"]);
    ok(srv, &["scale", "deployment", "web", "--replicas=4"]);
    let reason = wait_until(
        srv,
        &["get", "deploy", "web", "-o", "jsonpath={.status.conditions[?(@.type==\"Progressing\")].reason}"],
        |r| r == "DeploymentPaused",
    );
    assert_eq!(reason, "DeploymentPaused");
    wait_until(srv, &["get", "pods", "-o", "name"], |o| o.lines().count() == 4);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(lines_of(&ok(srv, &["get", "rs", "--no-headers"])).len(), 2, "paused: no new ReplicaSet");
    let images = ok(srv, &["get", "pods", "-o", "jsonpath={.items[*].spec.containers[0].image}"]);
    assert_eq!(images.split_whitespace().collect::<Vec<_>>(), ["podpath/echo:v1"; 4]);
    assert_eq!(ok(srv, &["rollout", "resume", "deployment/web"]), "deployment.apps/web resumed\n");
    ok(srv, &["rollout", "status", "deployment/web", "--timeout=60s"]);
    assert_eq!(lines_of(&ok(srv, &["get", "rs", "--no-headers"])).len(), 3);
    wait_until(srv, &["get", "pods", "-o", "jsonpath={.items[*].spec.containers[0].image}"], |o| {
        o.split_whitespace().collect::<Vec<_>>() == ["podpath/echo:v3"; 4]
    });

    // expose: the Service selects the Deployment's pods
    assert_eq!(ok(srv, &["expose", "deployment", "web", "--port=80", "--target-port=8080"]), "service/web exposed\n");
    assert_eq!(ok(srv, &["get", "svc", "web", "-o", "jsonpath={.spec.selector}"]), r#"{"app":"web"}"#);
    let all = ok(srv, &["get", "all"]);
    assert!(all.contains("deployment.apps/web") && all.contains(&format!("replicaset.apps/{rs1}")), "{all}");

    // bad input: a Status with causes, nothing stored
    let err = fails(srv, &["scale", "deployment", "web", "--replicas=-1"]);
    assert!(err.contains("replicas"), "{err}");
    let manifest = srv.dir.path().join("bad.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: bad}\nspec:\n  selector: {matchLabels: {app: web2}}\n  template:\n    metadata: {labels: {app: other}}\n    spec: {containers: [{name: c, image: i}]}\n",
    )
    .unwrap();
    let err = fails(srv, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(
        err.contains("spec.template.metadata.labels: Invalid value")
            && err.contains("`selector` does not match template `labels`"),
        "{err}"
    );

    // delete: the ReplicaSets and pods go with it
    ok(srv, &["delete", "deployment", "web"]);
    let t = Instant::now();
    loop {
        let left = ok(srv, &["get", "rs,pods", "-o", "name"]);
        if left.trim().is_empty() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "dependents left: {left}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn kubectl_ingress_and_ingress_class() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let rows = lines_of(&ok(&srv, &["get", "ingressclass"]));
    assert_eq!(rows[0], ["NAME", "CONTROLLER", "PARAMETERS", "AGE"]);
    assert_eq!(rows[1][..3], ["podpath", "podpath.dev/lb-sim", "<none>"]);

    assert_eq!(
        ok(&srv, &["create", "ingress", "shop", "--rule=shop.example/cart*=cart:80", "--default-backend=web:80"]),
        "ingress.networking.k8s.io/shop created\n"
    );
    let rows = lines_of(&ok(&srv, &["get", "ing", "shop"]));
    assert_eq!(rows[0], ["NAME", "CLASS", "HOSTS", "ADDRESS", "PORTS", "AGE"]);
    assert_eq!(rows[1][..3], ["shop", "<none>", "shop.example"]);
    let address = rows[1][3].clone();
    assert!(address.starts_with("198.51.100."), "an address from the LoadBalancer pool: {rows:?}");
    assert_eq!(rows[1][4], "80");
    let rule = ok(&srv, &["get", "ing", "shop", "-o", "jsonpath={.spec.rules[0].http.paths[0].pathType} {.spec.rules[0].http.paths[0].path} {.spec.defaultBackend.service.name}"]);
    assert_eq!(rule, "Prefix /cart web");

    // Another class is somebody else's: no address from the lab.
    let manifest = srv.dir.path().join("other.yaml");
    std::fs::write(&manifest, "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: other}\nspec:\n  ingressClassName: nginx\n  defaultBackend: {service: {name: web, port: {number: 80}}}\n").unwrap();
    ok(&srv, &["apply", "-f", manifest.to_str().unwrap()]);
    assert_eq!(ok(&srv, &["get", "ing", "other", "-o", "jsonpath={.status.loadBalancer.ingress}"]), "");

    let bad = srv.dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: bad}\nspec:\n  rules:\n  - http:\n      paths:\n      - {path: cart, pathType: Prefix, backend: {service: {name: cart, port: {number: 80}}}}\n").unwrap();
    let err = fails(&srv, &["apply", "-f", bad.to_str().unwrap()]);
    assert!(
        err.contains("spec.rules[0].http.paths[0].path: Invalid value: \"cart\": must be an absolute path"),
        "{err}"
    );

    // Deleting the Ingress frees its address for the next one.
    ok(&srv, &["delete", "ingress", "shop"]);
    ok(&srv, &["create", "ingress", "again", "--default-backend=web:80"]);
    assert_eq!(ok(&srv, &["get", "ing", "again", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]), address);
}

/// `kubectl get svc,deploy -o yaml > all.yaml && kubectl apply -f all.yaml`: a `kind: List`,
/// which kubectl validates itself against the OpenAPI v2 document in protobuf; a List with an
/// unknown field is refused whole, with kubectl's own message, and nothing of it is applied.
#[test]
fn kubectl_applies_a_list_it_got_and_validates_it_first() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    ok(&srv, &["create", "deployment", "web", "--image=podpath/echo"]);
    ok(&srv, &["create", "service", "clusterip", "web", "--tcp=80:8080"]);
    // The controllers write the Deployment's status at once: its resourceVersion in the file
    // must be the last, or apply conflicts, as it would on any cluster.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let all = srv.dir.path().join("all.yaml");
    std::fs::write(&all, ok(&srv, &["get", "svc,deploy", "-o", "yaml"])).unwrap();
    let out = ok(&srv, &["apply", "-f", all.to_str().unwrap()]);
    assert!(out.contains("service/web configured\n") && out.contains("deployment.apps/web configured\n"), "{out}");
    let bad = srv.dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: first}\n  spec: {ports: [{port: 80}]}\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: second}\n  bogus: 1\n",
    )
    .unwrap();
    let err = fails(&srv, &["apply", "-f", bad.to_str().unwrap()]);
    assert!(
        err.contains("ValidationError(ConfigMap): unknown field \"bogus\" in io.k8s.api.core.v1.ConfigMap"),
        "{err}"
    );
    assert!(!fails(&srv, &["get", "service", "first"]).is_empty(), "nothing of the List was applied");
    // The same document answers `kubectl explain`'s v2 output.
    let explained = ok(&srv, &["explain", "--output=plaintext-openapiv2", "deployment.spec.replicas"]);
    assert!(explained.contains("FIELD:    replicas <integer>"), "{explained}");
}

#[test]
fn kubectl_secrets() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    // kubectl's typed create sends protobuf: the byte map must come through as base64 JSON.
    assert_eq!(
        ok(&srv, &["create", "secret", "generic", "app", "--from-literal=user=admin", "--from-literal=pass=s3cr3t"]),
        "secret/app created\n"
    );
    let rows = lines_of(&ok(&srv, &["get", "secret", "app"]));
    assert_eq!(rows[0], ["NAME", "TYPE", "DATA", "AGE"]);
    assert_eq!(rows[1][..3], ["app", "Opaque", "2"]);
    assert_eq!(ok(&srv, &["get", "secret", "app", "-o", "jsonpath={.data.user}"]), "YWRtaW4=");
    // stringData is folded into data.
    let manifest = srv.dir.path().join("s.yaml");
    std::fs::write(&manifest, "apiVersion: v1\nkind: Secret\nmetadata: {name: plain}\nstringData: {token: abc}\n")
        .unwrap();
    ok(&srv, &["apply", "-f", manifest.to_str().unwrap()]);
    assert_eq!(ok(&srv, &["get", "secret", "plain", "-o", "jsonpath={.data.token}"]), "YWJj");
    // A TLS Secret without its key is refused, and nothing is stored.
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: Secret\nmetadata: {name: half}\ntype: kubernetes.io/tls\ndata: {tls.crt: Y2VydA==}\n",
    )
    .unwrap();
    let err = fails(&srv, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(err.contains("data[tls.key]: Required value"), "{err}");
    assert!(fails(&srv, &["get", "secret", "half"]).contains("NotFound"));
}

/// ConfigMaps and ServiceAccounts, added as one file and one list entry each: kubectl's typed
/// `create` (protobuf bodies), `get` tables, `apply`, the `default` ServiceAccount of every
/// namespace (re-created when deleted), and an immutable ConfigMap refusing a change.
#[test]
fn configmaps_and_service_accounts() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    assert_eq!(
        ok(&srv, &["create", "configmap", "game", "--from-literal=lives=3", "--from-literal=level=7"]),
        "configmap/game created\n"
    );
    let out = ok(&srv, &["get", "cm", "game"]);
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows[0], ["NAME", "DATA", "AGE"]);
    assert_eq!(rows[1][..2], ["game", "2"]);
    let cm: serde_json::Value = serde_json::from_str(&ok(&srv, &["get", "configmap", "game", "-o", "json"])).unwrap();
    assert_eq!(cm["data"], serde_json::json!({"level": "7", "lives": "3"}));

    // Every namespace has its default ServiceAccount, new ones too, and a deleted one comes back.
    let wait_for = |args: &[&str], want: &dyn Fn(&str) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let o = srv.kubectl(args);
            let (out, _) = text(&o);
            if o.status.success() && want(&out) {
                return out;
            }
            assert!(Instant::now() < deadline, "kubectl {args:?} never gave what was wanted: {out}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let out = wait_for(&["get", "sa"], &|o| o.lines().any(|l| l.starts_with("default ")));
    assert_eq!(out.lines().next().unwrap().split_whitespace().collect::<Vec<_>>(), ["NAME", "SECRETS", "AGE"]);
    ok(&srv, &["create", "namespace", "shop"]);
    wait_for(&["get", "serviceaccount", "default", "-n", "shop"], &|_| true);
    assert_eq!(ok(&srv, &["create", "serviceaccount", "robot", "-n", "shop"]), "serviceaccount/robot created\n");
    ok(&srv, &["delete", "sa", "default", "-n", "shop"]);
    wait_for(&["get", "sa", "-n", "shop", "-o", "name"], &|o| o.contains("serviceaccount/default"));

    // An immutable ConfigMap refuses a change, with the API server's words.
    let manifest = srv.dir.path().join("frozen.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: frozen}\nimmutable: true\ndata: {a: \"1\"}\n",
    )
    .unwrap();
    let m = manifest.to_str().unwrap();
    assert_eq!(ok(&srv, &["apply", "-f", m]), "configmap/frozen created\n");
    std::fs::write(
        &manifest,
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: frozen}\nimmutable: true\ndata: {a: \"2\"}\n",
    )
    .unwrap();
    let err = fails(&srv, &["apply", "-f", m]);
    assert!(err.contains("data: Forbidden: field is immutable when `immutable` is set"), "{err}");
}

/// `kubectl apply --prune -l` with kubectl's default prune list: kubectl lists every kind of
/// that list (PVCs, PVs, ReplicationControllers, Jobs, CronJobs, DaemonSets, StatefulSets among
/// them), so all must be served; the kinds no podpath component acts on (volumes,
/// ReplicationControllers) say so when created.
#[test]
fn apply_prune_with_kubectls_default_list_and_the_kinds_it_needs() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let dir = srv.dir.path().join("manifests");
    std::fs::create_dir(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let cm = |name: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, labels: {{app: demo}}}}\ndata: {{a: \"1\"}}\n"
        )
    };
    std::fs::write(dir.join("one.yaml"), cm("one")).unwrap();
    std::fs::write(dir.join("two.yaml"), cm("two")).unwrap();
    let out = ok(&srv, &["apply", "-f", d, "-l", "app=demo", "--prune"]);
    assert_eq!(out, "configmap/one created\nconfigmap/two created\n");
    std::fs::remove_file(dir.join("two.yaml")).unwrap();
    let out = ok(&srv, &["apply", "-f", d, "-l", "app=demo", "--prune"]);
    assert_eq!(out, "configmap/one unchanged\nconfigmap/two pruned\n");
    assert_eq!(ok(&srv, &["get", "cm", "-l", "app=demo", "-o", "name"]), "configmap/one\n");

    // Each kind of the list is served: created, listed with kubectl's columns, deleted.
    let o = srv.kubectl(&["create", "job", "pi", "--image=busybox", "--", "echo", "hi"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert_eq!(out, "job.batch/pi created\n");
    assert!(!err.contains("Warning"), "Jobs have a controller: {err}");
    let o = srv.kubectl(&["create", "cronjob", "tick", "--image=busybox", "--schedule=*/5 * * * *", "--", "date"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(!err.contains("Warning"), "CronJobs have a controller: {err}");
    let err = fails(&srv, &["create", "cronjob", "bad", "--image=busybox", "--schedule=nope"]);
    assert!(err.contains("spec.schedule: Invalid value: \"nope\": expected exactly 5 fields, found 1: nope"), "{err}");
    std::fs::write(dir.join("kinds.yaml"), PRUNE_KINDS).unwrap();
    let o = srv.kubectl(&["apply", "-f", dir.join("kinds.yaml").to_str().unwrap()]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(err.contains("Warning: podpath runs no controller for replicationcontrollers"), "{err}");
    assert!(!err.contains("persistentvolumeclaims"), "claims have their controller: {err}");
    let headers = |what: &str| -> Vec<String> {
        let out = ok(&srv, &["get", what]);
        out.lines().next().unwrap_or("").split("  ").map(|h| h.trim().to_string()).filter(|h| !h.is_empty()).collect()
    };
    assert_eq!(headers("statefulsets"), ["NAME", "READY", "AGE"]);
    assert_eq!(
        headers("ds"),
        ["NAME", "DESIRED", "CURRENT", "READY", "UP-TO-DATE", "AVAILABLE", "NODE SELECTOR", "AGE"]
    );
    assert_eq!(headers("jobs"), ["NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"]);
    assert_eq!(headers("cj"), ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST SCHEDULE", "AGE"]);
    assert_eq!(headers("rc"), ["NAME", "DESIRED", "CURRENT", "READY", "AGE"]);
    assert_eq!(
        headers("pvc"),
        ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS MODES", "STORAGECLASS", "VOLUMEATTRIBUTESCLASS", "AGE"]
    );
    // The volume controller makes the unclaimed volume Available; the claim got the default
    // class, which waits for a pod.
    let pv = wait_for(Duration::from_secs(10), "pv1 Available", || {
        let pv = ok(&srv, &["get", "pv", "pv1", "--no-headers"]);
        if pv.split_whitespace().nth(4) == Some("Available") {
            Ok(pv)
        } else {
            Err(pv)
        }
    });
    assert_eq!(pv.split_whitespace().take(5).collect::<Vec<_>>(), ["pv1", "5Gi", "RWO", "Retain", "Available"]);
    let claim = ok(&srv, &["get", "pvc", "data", "--no-headers"]);
    assert_eq!(claim.split_whitespace().take(3).collect::<Vec<_>>(), ["data", "Pending", "standard"], "{claim}");
    assert_eq!(ok(&srv, &["scale", "sts", "db", "--replicas=3"]), "statefulset.apps/db scaled\n");
    assert_eq!(ok(&srv, &["get", "sts", "db", "-o", "jsonpath={.spec.replicas}"]), "3");
    ok(&srv, &["delete", "job,cronjob,sts,ds,rc,pvc", "--all"]);
    ok(&srv, &["delete", "pv", "pv1"]);
    assert_eq!(ok(&srv, &["get", "job,cronjob,sts,ds,rc,pvc,pv", "-o", "name"]), "");
}

const PRUNE_KINDS: &str = "apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  selector: {matchLabels: {app: db}}
  serviceName: db
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: c, image: x}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: x}]}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: pv1}
spec: {capacity: {storage: 5Gi}, accessModes: [ReadWriteOnce], hostPath: {path: /data}}
---
apiVersion: v1
kind: ReplicationController
metadata: {name: old}
spec:
  template:
    metadata: {labels: {app: old}}
    spec: {containers: [{name: c, image: x}]}
";

/// A Node that reports Ready (its heartbeat is fresh for the node monitor's 40 s grace).
fn ready_node(srv: &ApiServer, name: &str, labels: &str) {
    let manifest = srv.dir.path().join(format!("{name}.yaml"));
    std::fs::write(&manifest, format!("apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  labels: {labels}\n"))
        .unwrap();
    ok(srv, &["create", "-f", manifest.to_str().unwrap()]);
    let now = jiff::Timestamp::now().to_string();
    let status = serde_json::json!({"status": {"conditions": [
        {"type": "Ready", "status": "True", "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    ok(srv, &["patch", "node", name, "--subresource=status", "--type=merge", "-p", &status.to_string()]);
}

/// Waits until `f` holds for kubectl's output of `args`; returns that output.
fn wait_until(srv: &ApiServer, args: &[&str], f: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = ok(srv, args);
        if f(&out) {
            return out;
        }
        assert!(Instant::now() < deadline, "kubectl {args:?} never satisfied the test: {out}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Node operations with the real kubectl: `taint` (NoSchedule keeps pods away unless they
/// tolerate it, NoExecute evicts them), `drain` (cordon, then a protobuf Eviction per pod) and
/// `delete --cascade=orphan` (dependents stay, unowned).
#[test]
fn kubectl_taint_drain_and_orphaning_delete() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| fake_kubelet(&srv, &stop));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node_operation_steps(&srv)));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    });
}

fn node_operation_steps(srv: &ApiServer) {
    ready_node(srv, "node-1", "{disk: gpu}");
    ready_node(srv, "node-2", "{}");
    let nodes_of = |sel: &str| ok(srv, &["get", "pods", "-l", sel, "-o", "jsonpath={.items[*].spec.nodeName}"]);

    // NoSchedule: new pods go elsewhere; a pod that needs the node waits with the reason.
    assert_eq!(ok(srv, &["taint", "nodes", "node-1", "dedicated=gpu:NoSchedule"]), "node/node-1 tainted\n");
    ok(srv, &["create", "deployment", "web", "--image=podpath/echo", "--replicas=3"]);
    let placed = wait_until(srv, &["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"], |o| {
        o.split_whitespace().count() == 3
    });
    assert!(placed.split_whitespace().all(|n| n == "node-2"), "{placed}");
    let needs_gpu = |name: &str, tolerations: &str| {
        format!("{{\"apiVersion\": \"v1\", \"spec\": {{\"nodeSelector\": {{\"disk\": \"gpu\"}}, \"tolerations\": {tolerations}, \"containers\": [{{\"name\": \"{name}\", \"image\": \"podpath/echo\"}}]}}}}")
    };
    ok(
        srv,
        &[
            "run",
            "plain",
            "--image=podpath/echo",
            "--labels=role=plain",
            &format!("--overrides={}", needs_gpu("plain", "[]")),
        ],
    );
    let reason = wait_until(
        srv,
        &["get", "pod", "plain", "-o", "jsonpath={.status.conditions[?(@.type==\"PodScheduled\")].message}"],
        |o| !o.is_empty(),
    );
    assert_eq!(reason, "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.");
    let toleration = r#"[{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]"#;
    ok(
        srv,
        &[
            "run",
            "tolerant",
            "--image=podpath/echo",
            "--labels=role=tolerant",
            &format!("--overrides={}", needs_gpu("tolerant", toleration)),
        ],
    );
    assert_eq!(
        wait_until(srv, &["get", "pod", "tolerant", "-o", "jsonpath={.spec.nodeName}"], |o| !o.is_empty()),
        "node-1"
    );
    assert_eq!(ok(srv, &["taint", "nodes", "node-1", "dedicated=gpu:NoSchedule-"]), "node/node-1 untainted\n");
    assert_eq!(
        wait_until(srv, &["get", "pod", "plain", "-o", "jsonpath={.spec.nodeName}"], |o| !o.is_empty()),
        "node-1"
    );

    // NoExecute: the pods on node-2 are evicted and come back on node-1.
    ok(srv, &["taint", "nodes", "node-2", "maint=now:NoExecute"]);
    let taint: serde_json::Value =
        serde_json::from_str(&ok(srv, &["get", "node", "node-2", "-o", "jsonpath={.spec.taints[0]}"])).unwrap();
    assert!(taint["timeAdded"].is_string(), "NoExecute taints get timeAdded: {taint}");
    wait_until(srv, &["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"], |o| {
        o.split_whitespace().count() == 3 && o.split_whitespace().all(|n| n == "node-1")
    });
    ok(srv, &["taint", "nodes", "node-2", "maint-"]);

    // drain: cordon, delete every pod (protobuf DeleteOptions), the Deployment replaces them
    // on the other node.
    let o = srv.kubectl(&["drain", "node-1", "--ignore-daemonsets", "--force", "--timeout=30s"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.starts_with("node/node-1 cordoned\n") && out.ends_with("node/node-1 drained\n"), "{out}");
    // Through the eviction subresource (discovery offers pods/eviction), not plain deletes.
    assert!(out.contains("evicting pod default/") && out.contains(" evicted\n"), "{out}");
    assert_eq!(ok(srv, &["get", "node", "node-1", "-o", "jsonpath={.spec.unschedulable}"]), "true");
    wait_until(srv, &["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"], |o| {
        o.split_whitespace().count() == 3 && o.split_whitespace().all(|n| n == "node-2")
    });
    assert_eq!(nodes_of("role in (plain,tolerant)"), "", "bare pods are gone for good");
    assert_eq!(ok(srv, &["uncordon", "node-1"]), "node/node-1 uncordoned\n");

    // --cascade=orphan: the ReplicaSet and its pods stay, without the owner reference.
    let rs = ok(srv, &["get", "rs", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"]);
    assert_eq!(ok(srv, &["delete", "deployment", "web", "--cascade=orphan"]), "deployment.apps \"web\" deleted\n");
    std::thread::sleep(Duration::from_secs(2)); // a collector would have struck by now
    let left: serde_json::Value = serde_json::from_str(&ok(srv, &["get", "rs", &rs, "-o", "json"])).unwrap();
    assert!(left["metadata"].get("ownerReferences").is_none(), "{left}");
    assert_eq!(nodes_of("app=web").split_whitespace().count(), 3);
    let err = fails(srv, &["delete", "rs", &rs, "--cascade=sideways"]);
    assert!(err.contains("invalid cascade value"), "{err}");
    ok(srv, &["delete", "rs", &rs]);
    wait_until(srv, &["get", "pods", "-l", "app=web", "-o", "name"], str::is_empty);
}

/// What kubectl users hit when a server is careless: a server-side dry-run delete deletes
/// nothing, a JSON patch cannot rename an object, and `kubectl debug` adds an ephemeral
/// container through its subresource (a lab runs it: `e2e/tests/images.rs`).
#[test]
fn kubectl_dry_run_renames_and_debug_are_refused_cleanly() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    ok(&srv, &["run", "web", "--image=podpath/echo"]);
    assert_eq!(ok(&srv, &["delete", "pod", "web", "--dry-run=server"]), "pod \"web\" deleted (server dry run)\n");
    assert_eq!(ok(&srv, &["get", "pod", "web", "-o", "name"]), "pod/web\n", "a dry run deletes nothing");
    let err = fails(
        &srv,
        &["patch", "pod", "web", "--type=json", "-p", r#"[{"op":"replace","path":"/metadata/name","value":"x"}]"#],
    );
    assert!(err.contains("the name of the object (x) does not match the name on the URL (web)"), "{err}");
    let err = fails(
        &srv,
        &["patch", "pod", "web", "--type=json", "-p", r#"[{"op":"replace","path":"/metadata/uid","value":"u"}]"#],
    );
    assert!(err.contains("metadata.uid: Invalid value: \"u\": field is immutable"), "{err}");
    let o = srv.kubectl(&["debug", "web", "--image=busybox", "--profile=general", "--container=dbg"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert_eq!(
        ok(
            &srv,
            &[
                "get",
                "pod",
                "web",
                "-o",
                "jsonpath={.spec.ephemeralContainers[0].name} {.spec.ephemeralContainers[0].image}"
            ]
        ),
        "dbg busybox"
    );
    // Through the pod itself, ephemeral containers do not change (only their subresource does).
    ok(&srv, &["patch", "pod", "web", "--type=json", "-p", r#"[{"op":"remove","path":"/spec/ephemeralContainers"}]"#]);
    assert_eq!(ok(&srv, &["get", "pod", "web", "-o", "jsonpath={.spec.ephemeralContainers[0].name}"]), "dbg");
}

/// Server-side apply with managedFields, through the real kubectl: a changed port replaces the
/// one applied before (it used to fail as a duplicate name), a removed containerPort goes, a
/// field another manager changed is a 409 conflict naming it, and `--force-conflicts` takes it.
#[test]
fn kubectl_server_side_apply_tracks_field_managers() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let apply = |name: &str, yaml: String, extra: &[&str]| {
        let path = srv.dir.path().join(name);
        std::fs::write(&path, yaml).unwrap();
        let mut args = vec!["apply", "--server-side", "-f", path.to_str().unwrap()];
        args.extend(extra);
        srv.kubectl(&args)
    };
    let svc = |port: u16| {
        format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: web\nspec:\n  selector: {{app: web}}\n  ports:\n  - name: http\n    port: {port}\n    targetPort: 8080\n")
    };
    assert!(apply("svc.yaml", svc(80), &[]).status.success());
    let o = apply("svc.yaml", svc(8081), &[]);
    assert!(o.status.success(), "{:?}", text(&o));
    let ports: serde_json::Value =
        serde_json::from_str(&ok(&srv, &["get", "svc", "web", "-o", "jsonpath={.spec.ports}"])).unwrap();
    assert_eq!(ports, serde_json::json!([{"name": "http", "port": 8081, "protocol": "TCP", "targetPort": 8080}]));

    // Another manager changes a field the apply owns: re-applying conflicts, forcing takes it.
    ok(
        &srv,
        &[
            "patch",
            "svc",
            "web",
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/spec/ports/0/targetPort","value":9090}]"#,
        ],
    );
    let o = apply("svc.yaml", svc(8081), &[]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains(r#"Apply failed with 1 conflict: conflict with "kubectl-patch" using v1: .spec.ports[port=8081,protocol="TCP"].targetPort"#), "{err}");
    assert!(err.contains("--force-conflicts"), "kubectl recognised the conflict: {err}");
    assert_eq!(
        ok(&srv, &["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].targetPort}"]),
        "9090",
        "nothing applied"
    );
    assert!(apply("svc.yaml", svc(8081), &["--force-conflicts"]).status.success());
    assert_eq!(ok(&srv, &["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].targetPort}"]), "8080");
    let managers = ok(
        &srv,
        &["get", "svc", "web", "--show-managed-fields", "-o", "jsonpath={.metadata.managedFields[*].manager}"],
    );
    assert_eq!(managers, "kubectl", "the patcher's only field was taken");

    // A Deployment's containerPort removed from the manifest goes from the object.
    let dep = |ports: &str| {
        format!("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: d\nspec:\n  selector: {{matchLabels: {{app: d}}}}\n  template:\n    metadata: {{labels: {{app: d}}}}\n    spec:\n      containers:\n      - name: c\n        image: podpath/echo\n        ports: {ports}\n")
    };
    assert!(apply("d.yaml", dep("[{containerPort: 8080}, {containerPort: 9090}]"), &[]).status.success());
    assert!(apply("d.yaml", dep("[{containerPort: 8081}]"), &[]).status.success());
    assert_eq!(
        ok(&srv, &["get", "deploy", "d", "-o", "jsonpath={.spec.template.spec.containers[0].ports[*].containerPort}"]),
        "8081"
    );
}

#[test]
fn kubectl_network_policies_served_validated_and_described() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let manifest = srv.dir.path().join("netpol.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-allow}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {team: a}}
      podSelector: {matchLabels: {role: client}}
    - ipBlock: {cidr: 10.0.0.0/16, except: [10.0.1.0/24]}
    ports:
    - {port: http}
    - {port: 8000, endPort: 8080, protocol: UDP}
  egress:
  - to: [{namespaceSelector: {}}]
    ports: [{port: 53, protocol: UDP}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-all}
spec:
  podSelector: {}
",
    )
    .unwrap();
    let out = ok(&srv, &["apply", "-f", manifest.to_str().unwrap()]);
    assert!(out.contains("networkpolicy.networking.k8s.io/web-allow created"), "{out}");
    let rows = lines_of(&ok(&srv, &["get", "netpol"]));
    assert_eq!(rows[0], ["NAME", "POD-SELECTOR", "AGE"]);
    assert_eq!(
        (&rows[1][..2], &rows[2][..2]),
        (&["deny-all".to_string(), "<none>".into()][..], &["web-allow".to_string(), "app=web".into()][..])
    );
    // The server's defaults: policyTypes from the rules, TCP where no protocol is given.
    assert_eq!(
        ok(
            &srv,
            &[
                "get",
                "netpol",
                "web-allow",
                "-o",
                "jsonpath={.spec.policyTypes} {.spec.ingress[0].ports[0].protocol} {.metadata.generation}"
            ]
        ),
        r#"["Ingress","Egress"] TCP 1"#
    );
    assert_eq!(ok(&srv, &["get", "netpol", "deny-all", "-o", "jsonpath={.spec.policyTypes}"]), r#"["Ingress"]"#);
    // kubectl's own describer reads the served object (compared with spaces collapsed).
    let described =
        ok(&srv, &["describe", "networkpolicy", "web-allow"]).split_whitespace().collect::<Vec<_>>().join(" ");
    for want in [
        "Name: web-allow",
        "PodSelector: app=web",
        "Allowing ingress traffic:",
        "To Port: http/TCP",
        "To Port Range: 8000-8080/UDP",
        "NamespaceSelector: team=a",
        "PodSelector: role=client",
        "IPBlock:",
        "CIDR: 10.0.0.0/16",
        "Except: 10.0.1.0/24",
        "Allowing egress traffic:",
        "To Port: 53/UDP",
        "Policy Types: Ingress, Egress",
    ] {
        assert!(described.contains(want), "describe lacks {want:?}:\n{described}");
    }

    // Bad input: the real server's causes, nothing stored.
    let bad = srv.dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: bad}\nspec:\n  podSelector: {}\n  ingress:\n  - from: [{ipBlock: {cidr: 10.0.0.0/8, except: [192.168.0.0/16]}}]\n    ports: [{port: http, endPort: 90}]\n",
    )
    .unwrap();
    let err = fails(&srv, &["apply", "-f", bad.to_str().unwrap()]);
    assert!(err.contains("The NetworkPolicy \"bad\" is invalid"), "{err}");
    assert!(
        err.contains(
            "spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric"
        ),
        "{err}"
    );
    assert!(err.contains("spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: \"192.168.0.0/16\": must be a strict subset of `cidr`"), "{err}");
    assert!(fails(&srv, &["get", "netpol", "bad"]).contains("NotFound"));
    // An update that changes the spec moves the generation.
    ok(
        &srv,
        &["patch", "netpol", "deny-all", "--type=merge", "-p", r#"{"spec":{"policyTypes":["Ingress","Egress"]}}"#],
    );
    assert_eq!(ok(&srv, &["get", "netpol", "deny-all", "-o", "jsonpath={.metadata.generation}"]), "2");
}

/// `kubectl get --chunk-size=2` pages through 10 objects with the server's continue tokens and
/// prints them all, once each, under one header.
#[test]
fn kubectl_get_pages_with_chunk_size() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    ok(&srv, &["create", "namespace", "chunks"]);
    for i in 0..10 {
        ok(&srv, &["-n", "chunks", "create", "configmap", &format!("cm-{i}"), "--from-literal=i=1"]);
    }
    let o = srv.kubectl(&["-n", "chunks", "get", "configmaps", "--chunk-size=2", "-v=6"]);
    let (out, log) = text(&o);
    assert!(o.status.success(), "{log}");
    // Five requests: the first, then four with the token of the page before.
    let continued = log.lines().filter(|l| l.contains("limit=2") && l.contains("continue=")).count();
    assert_eq!(continued, 4, "{log}");
    let rows: Vec<&str> = out.lines().filter(|l| l.starts_with("cm-")).collect();
    assert_eq!(rows.len(), 10, "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("NAME")).count(), 1, "{out}");
    let names = ok(&srv, &["-n", "chunks", "get", "configmaps", "--chunk-size=3", "-o", "name"]);
    assert_eq!(names.lines().filter(|l| l.starts_with("configmap/cm-")).count(), 10, "{names}");
}

/// RBAC with the real kubectl: a ServiceAccount bound to a Role that reads pods gets a token
/// (`kubectl create token`) that lists pods and is refused everything else with
/// kube-apiserver's 403 text; `auth can-i --as` answers yes and no for it; `auth whoami` with
/// its token names it; a ClusterRoleBinding to `view` widens it; a deleted ServiceAccount's
/// token is refused; bad roles and bindings get the real validation texts.
#[test]
fn kubectl_rbac_roles_bindings_tokens_and_can_i() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    ok(&srv, &["create", "serviceaccount", "reader"]);
    assert_eq!(
        ok(&srv, &["create", "role", "pod-reader", "--verb=get,list,watch", "--resource=pods"]),
        "role.rbac.authorization.k8s.io/pod-reader created\n"
    );
    ok(&srv, &["create", "rolebinding", "read-pods", "--role=pod-reader", "--serviceaccount=default:reader"]);
    let rows = ok(&srv, &["get", "rolebinding", "read-pods"]);
    assert!(rows.starts_with("NAME        ROLE              AGE\nread-pods   Role/pod-reader   "), "{rows}");
    // The bootstrap policy is there, as on any cluster.
    let roles = ok(&srv, &["get", "clusterroles", "-o", "name"]);
    for r in ["cluster-admin", "admin", "edit", "view", "system:basic-user", "system:discovery"] {
        assert!(roles.contains(&format!("clusterrole.rbac.authorization.k8s.io/{r}\n")), "{roles}");
    }
    let token = ok(&srv, &["create", "token", "reader"]);
    assert!(token.starts_with("eyJ") && token.matches('.').count() == 2, "a JWT: {token}");
    let as_reader = |args: &[&str]| {
        let mut v = vec!["--token", token.trim()];
        v.extend_from_slice(args);
        srv.kubectl(&v)
    };
    let o = as_reader(&["get", "pods"]);
    assert!(o.status.success(), "{}", text(&o).1);
    let o = as_reader(&["get", "services"]);
    assert_eq!(
        text(&o).1,
        "Error from server (Forbidden): services is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"services\" in API group \"\" in the namespace \"default\"\n"
    );
    let o = as_reader(&["delete", "pod", "web"]);
    assert!(text(&o).1.contains(
        "pods \"web\" is forbidden: User \"system:serviceaccount:default:reader\" cannot delete resource \"pods\""
    ));
    let o = as_reader(&["get", "nodes"]);
    assert!(
        text(&o).1.contains("cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
        "{}",
        text(&o).1
    );
    let o = as_reader(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username} {.status.userInfo.groups}"]);
    assert_eq!(
        text(&o).0,
        "system:serviceaccount:default:reader [\"system:serviceaccounts\",\"system:serviceaccounts:default\",\"system:authenticated\"]"
    );
    // A ServiceAccount may not act as somebody else.
    let o = as_reader(&["get", "pods", "--as=kubernetes-admin"]);
    assert!(text(&o).1.contains("users \"kubernetes-admin\" is forbidden: User \"system:serviceaccount:default:reader\" cannot impersonate resource \"users\""));
    // can-i, as the administrator impersonating it, and with its own token.
    let sa = "--as=system:serviceaccount:default:reader";
    assert_eq!(ok(&srv, &["auth", "can-i", "list", "pods", sa]), "yes\n");
    assert_eq!(text(&srv.kubectl(&["auth", "can-i", "list", "services", sa])).0, "no\n");
    assert_eq!(text(&srv.kubectl(&["auth", "can-i", "watch", "pods", "-n", "kube-system", sa])).0, "no\n");
    let list = text(&as_reader(&["auth", "can-i", "--list"])).0;
    assert!(list.lines().any(|l| l.starts_with("pods ") && l.ends_with("[get list watch]")), "{list}");
    // view, cluster-wide: Deployments everywhere, still no Secrets.
    ok(&srv, &["create", "clusterrolebinding", "reader-view", "--clusterrole=view", "--serviceaccount=default:reader"]);
    assert_eq!(ok(&srv, &["auth", "can-i", "list", "deployments.apps", "-A", sa]), "yes\n");
    assert_eq!(text(&srv.kubectl(&["auth", "can-i", "get", "secrets", sa])).0, "no\n");
    // Bad input: the real validation texts.
    let bad = srv.dir.path().join("bad.yaml");
    std::fs::write(&bad, "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: bad}\nrules:\n- {apiGroups: [\"\"], resources: [pods], verbs: []}\n").unwrap();
    let e = fails(&srv, &["apply", "-f", bad.to_str().unwrap()]);
    assert!(e.contains("rules[0].verbs: Required value: verbs must contain at least one value"), "{e}");
    let e =
        fails(&srv, &["patch", "rolebinding", "read-pods", "--type=merge", "-p", "{\"roleRef\":{\"name\":\"other\"}}"]);
    assert!(e.contains("cannot change roleRef"), "{e}");
    let e = fails(&srv, &["create", "token", "reader", "--duration=1m"]);
    assert!(e.contains("TokenRequest.authentication.k8s.io \"reader\" is invalid: spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 10 minutes"), "{e}");
    // A token outlives nothing: the ServiceAccount gone, its token is refused.
    ok(&srv, &["delete", "serviceaccount", "reader"]);
    assert!(text(&as_reader(&["get", "pods"])).1.contains("Unauthorized"));
}

/// `kubectl auth whoami` and `auth can-i`: the lab's token is the cluster's administrator.
#[test]
fn kubectl_auth_whoami_and_can_i_answer_for_the_administrator() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let srv = ApiServer::start(&[]).unwrap();
    let me = ok(&srv, &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username} {.status.userInfo.groups}"]);
    assert!(me.starts_with("kubernetes-admin "), "{me}");
    assert_eq!(ok(&srv, &["auth", "can-i", "create", "pods"]), "yes\n");
    assert_eq!(ok(&srv, &["auth", "can-i", "delete", "nodes"]), "yes\n");
    assert_eq!(ok(&srv, &["auth", "can-i", "get", "/healthz"]), "yes\n");
    let list = ok(&srv, &["auth", "can-i", "--list"]);
    assert!(list.lines().any(|l| l.starts_with("*.*")), "{list}");
}

/// SIGTERM stops the server while a client's watch is still open (kubectl's `--watch` never
/// ends on its own, like a pod's DNS server's): the watch is cut after the grace period and the
/// server exits cleanly, rather than waiting for its clients to leave; what was written stays.
#[test]
fn sigterm_stops_the_server_with_a_watch_open() {
    assert!(kubectl_available(), "kubectl is required (it ships on the machine image as /usr/bin/kubectl)");
    let mut srv = ApiServer::start(&[]).unwrap();
    ok(&srv, &["create", "namespace", "watched"]);
    let mut watch = srv
        .kubectl_cmd(&["get", "namespaces", "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The list's rows come first, then the watch holds the connection.
    let seen: Vec<String> = lines
        .by_ref()
        .take_while(|l| l.as_ref().is_ok_and(|l| !l.starts_with("watched")))
        .map_while(Result::ok)
        .collect();
    assert!(seen.iter().any(|l| l.starts_with("NAME")), "{seen:?}");
    std::thread::sleep(Duration::from_millis(300));
    let status = srv.terminate(Duration::from_secs(4));
    let _ = watch.kill();
    let _ = watch.wait();
    let status = status.expect("the server still ran 4 s after SIGTERM");
    assert!(status.success(), "{status}");
    // Restarted on the same data, the namespace is there.
    srv.kill9_and_restart().unwrap();
    assert!(ok(&srv, &["get", "namespace", "watched", "-o", "name"]).contains("namespace/watched"));
}
