//! `podpath ui` in a real browser: headless Chromium (Debian's, over WebDriver) against a real
//! lab. The map shows the nodes and pods; a Service made with kubectl appears; its "curl"
//! traces and animates the same hops `podpath trace` gives; the NetworkPolicy matrix opens the
//! trace of a dropped pair; a node stopped from the map turns NotReady and the timeline shows
//! its pod leaving the endpoints; sign-in with a used code or a wrong token says so. A
//! screenshot of each state is kept in `target/ui-screenshots/`. Root only.

use std::io::BufRead as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use podpath_e2e::webdriver::{self, Browser};
use podpath_e2e::{bin, wait_for, Lab};
use serde_json::{json, Value};
use testkit::netns::{host_state, root_or_explain};

const LIMIT: Duration = Duration::from_secs(30);

/// `podpath ui` of a lab, ended by PID when dropped.
struct Ui {
    child: Child,
    link: String,
}

impl Ui {
    fn start(lab: &Lab) -> Ui {
        let mut child = Command::new(bin("podpath"))
            .args(["ui", "--name", &lab.name, "--state-dir", lab.state.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run podpath ui");
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("podpath ui prints its address").unwrap();
        assert!(first.starts_with(&format!("podpath ui for lab {:?} on http://127.0.0.1:", lab.name)), "{first}");
        let link = lines.next().expect("and a link").unwrap().trim().to_string();
        assert!(link.contains("/?code="), "{link}");
        Ui { child, link }
    }

    fn base(&self) -> String {
        self.link.split("/?code=").next().unwrap().to_string()
    }
}

impl Drop for Ui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn shots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ui-screenshots")
}

fn shot(b: &Browser, name: &str) {
    let path = shots().join(format!("{name}.png"));
    b.screenshot(&path).unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
    eprintln!("screenshot: {}", path.display());
}

/// A hop list with node names made alike: which node the load balancer picks is its choice.
fn shape(hops: &Value) -> Vec<(String, Vec<String>)> {
    hops.as_array()
        .unwrap()
        .iter()
        .map(|h| {
            let host = h["host"].as_str().unwrap();
            let host = if host.starts_with("node-") { "node-N".to_string() } else { host.to_string() };
            (host, h["steps"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap().to_string()).collect())
        })
        .collect()
}

#[test]
fn the_ui_shows_the_lab_traces_a_service_and_stops_a_node() {
    if !root_or_explain() {
        return;
    }
    if let Some(missing) = webdriver::available() {
        panic!("the browser test needs Chromium and its driver: {missing}");
    }
    let before = host_state();
    let lab = Lab::up("ui", &["--nodes", "2"]).expect("podpath up");
    for (name, node) in [("web-1", "node-1"), ("web-2", "node-2")] {
        lab.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: web}}}}\nspec:\n  nodeName: {node}\n  \
             containers:\n  - {{name: main, image: podpath/echo, ports: [{{containerPort: 8080}}]}}\n"
        ));
    }
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web-1", "pod/web-2", "--timeout=60s"]);
    let ui = Ui::start(&lab);
    let b = Browser::start(1600, 1200).expect("headless Chromium");

    // The link's code opens a session; the map shows both nodes Ready and the pods on them.
    b.goto(&ui.link).unwrap();
    b.wait(r#"#conn[data-state="live"]"#, LIMIT).unwrap();
    for n in ["node-1", "node-2"] {
        b.wait(&format!(r#"[data-node="{n}"][data-ready="True"]"#), LIMIT).unwrap();
    }
    b.wait(r#"[data-pod="default/web-1"][data-ready="true"]"#, LIMIT).unwrap();
    b.wait(r#"[data-pod="default/web-2"][data-ready="true"]"#, LIMIT).unwrap();
    assert_eq!(b.url().unwrap(), format!("{}/", ui.base()), "the code is dropped from the address bar");
    let desc = b.script("return document.getElementById('map-desc').textContent", json!([])).unwrap();
    assert!(desc.as_str().unwrap().contains("node-2 is Ready with pods default/web-2"), "{desc}");
    shot(&b, "1-topology");

    // A Service made with kubectl appears with its LB IP and both endpoints.
    lab.apply(
        "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  type: LoadBalancer\n  \
         externalTrafficPolicy: Local\n  selector: {app: web}\n  ports: [{port: 80, targetPort: 8080}]\n",
    );
    let vip = wait_for(LIMIT, "an LB IP", || {
        let ip = lab.kubectl(&["get", "svc", "web", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]);
        if ip.is_empty() {
            Err("none".into())
        } else {
            Ok(ip)
        }
    });
    b.wait_text(r#"tr[data-service="default/web"]"#, LIMIT, |t| {
        t.contains(&vip) && t.contains("(node-1)") && t.contains("(node-2)") && !t.contains("not ready")
    })
    .unwrap();
    b.wait(r#"g.svc[data-service="default/web"]"#, LIMIT).unwrap();
    shot(&b, "2-service");

    // "curl" traces from the client and animates hop by hop: the page lists exactly the hops
    // and steps of the trace the server ran, and they are those `podpath trace` gives.
    wait_for(LIMIT, "the Service to answer", || match lab.curl(&[&format!("http://{vip}/")]) {
        (0, _) => Ok(()),
        (c, o) => Err(format!("{c}: {o}")),
    });
    let curl = b.wait(r#"tr[data-service="default/web"] button.curl"#, LIMIT).unwrap();
    b.click(&curl).unwrap();
    b.wait(r#"#trace-result[data-state="animating"], #trace-result[data-state="done"]"#, LIMIT).unwrap();
    b.wait(r#"#map .trace-path"#, LIMIT).unwrap();
    shot(&b, "3-trace-animating");
    b.wait(r#"#trace-result[data-state="done"]"#, LIMIT).unwrap();
    let ran = b.script("return traces[traces.length - 1].result", json!([])).unwrap();
    let shown = b
        .script(
            "return [...document.querySelectorAll('#trace-result .hop:not(.lookup)')].map(h => ({host: h.dataset.host, \
             steps: [...h.querySelectorAll('.step')].map(s => ({kind: s.dataset.kind, \
             text: s.querySelector('.step-text').textContent, rule: (s.querySelector('code') || {}).textContent}))}))",
            json!([]),
        )
        .unwrap();
    let expected: Vec<Value> = ran["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            json!({"host": h["host"], "steps": h["steps"].as_array().unwrap().iter()
                .map(|s| json!({"kind": s["kind"], "text": s["text"], "rule": s["rule"]})).collect::<Vec<_>>()})
        })
        .collect();
    assert_eq!(shown, json!(expected), "the page lists the trace's hops and rules");
    assert!(ran["outcome"]["answered"].as_bool().unwrap(), "{ran:#}");
    let (ok, cli, err) = lab.run_apart("trace", &["--output", "json", &format!("http://{vip}/")]);
    assert!(ok, "{cli}{err}");
    let cli: Value = serde_json::from_str(&cli).unwrap();
    assert_eq!(shape(&ran["hops"]), shape(&cli["hops"]), "UI: {ran:#}\nCLI: {cli:#}");
    let outcome = b.text(&b.wait("#trace-result .outcome", LIMIT).unwrap()).unwrap();
    assert!(outcome.contains("answered HTTP 200") && outcome.contains("served by pod default/web-"), "{outcome}");
    shot(&b, "4-trace-done");

    // The rules view: the Service's chains on each node, in words and as installed.
    b.click(&b.wait(r#"tr[data-service="default/web"] button.rules"#, LIMIT).unwrap()).unwrap();
    let rules = b.wait_text(r#"#rules[data-state="done"]"#, LIMIT, |t| t.contains("KUBE-SVC-")).unwrap();
    assert!(rules.contains("node-1") && rules.contains("-j KUBE-SEP-"), "{rules}");
    shot(&b, "5-rules");

    // NetworkPolicy: web pods admit nothing; the matrix shows it, a cell opens that pair's trace.
    lab.apply(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: web-deny}\nspec:\n  \
         podSelector: {matchLabels: {app: web}}\n  policyTypes: [Ingress]\n",
    );
    b.click(&b.wait("#tab-policy", LIMIT).unwrap()).unwrap();
    b.wait_text("#policies", LIMIT, |t| t.contains("default/web-deny")).unwrap();
    let ports = b.wait("#matrix-ports", LIMIT).unwrap();
    b.fill(&ports, "8080").unwrap();
    b.fill(&b.wait("#matrix-namespaces", LIMIT).unwrap(), "default").unwrap();
    // The agents program the policy within moments; probe until the pair is refused.
    let cell = r#"#matrix button[data-from="default/web-1"][data-to="default/web-2"]"#;
    wait_for(LIMIT, "the matrix to show web-1 → web-2 refused", || {
        b.click(&b.wait("#matrix-run", LIMIT).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        b.wait(r#"#matrix[data-state="done"]"#, LIMIT).map_err(|e| e.to_string())?;
        let e = b.wait(cell, LIMIT).map_err(|e| e.to_string())?;
        match b.text(&e).map_err(|e| e.to_string())?.as_str() {
            "X" => Ok(()),
            other => Err(other.to_string()),
        }
    });
    shot(&b, "6-policy-matrix");
    b.click(&b.wait(cell, LIMIT).unwrap()).unwrap();
    b.wait(r#"#trace-result[data-state="done"]"#, LIMIT).unwrap();
    let dropped = b.text(&b.wait("#trace-result", LIMIT).unwrap()).unwrap();
    assert!(dropped.contains("no answer") && dropped.contains("NetworkPolicy"), "{dropped}");
    shot(&b, "7-policy-trace");
    lab.kubectl(&["delete", "networkpolicy", "web-deny"]);

    // The form: a name traced from a pod shows the lookup first, then the hops.
    b.click(&b.wait("#tab-map", LIMIT).unwrap()).unwrap();
    b.script(
        "const f = document.getElementById('trace-from'); f.value = 'pod/default/web-1'; \
         document.getElementById('trace-target').value = 'http://web.default/'",
        json!([]),
    )
    .unwrap();
    b.click(&b.wait("#trace-run", LIMIT).unwrap()).unwrap();
    b.wait(r#"#trace-result[data-state="done"]"#, LIMIT).unwrap();
    let lookup = b.text(&b.wait("#trace-result .hop.lookup", LIMIT).unwrap()).unwrap();
    assert!(lookup.contains("DNS lookup of web.default") && lookup.contains("NOERROR"), "{lookup}");
    let answered = b.text(&b.wait("#trace-result .outcome", LIMIT).unwrap()).unwrap();
    assert!(answered.contains("answered HTTP 200"), "{answered}");
    shot(&b, "7b-trace-by-name");

    // node-2 stopped from the map: NotReady on the map, web-2 leaves the endpoints in the timeline.
    let web2_ip = lab.kubectl(&["get", "pod", "web-2", "-o", "jsonpath={.status.podIP}"]);
    b.click(&b.wait("#tab-map", LIMIT).unwrap()).unwrap();
    b.click(&b.wait(r#"[data-node="node-2"]"#, LIMIT).unwrap()).unwrap();
    b.click(&b.wait(r#"#details button[data-action="node-stop"]"#, LIMIT).unwrap()).unwrap();
    b.wait_text("#action-result", LIMIT, |t| t.contains("node-2: stopped")).unwrap();
    b.wait(r#"[data-node="node-2"][data-ready="Unknown"]"#, Duration::from_secs(45)).unwrap();
    let timeline =
        b.wait_text("#timeline", LIMIT, |t| t.contains(&format!("endpoints default/web: -{web2_ip}"))).unwrap();
    assert!(timeline.contains("node node-2: Ready True (KubeletReady) → Unknown"), "{timeline}");
    b.wait(r#"[data-pod="default/web-2"][data-ready="false"]"#, LIMIT).unwrap();
    shot(&b, "8-node-stopped");
    // The Rules view follows the Service: back on it, node-1's rules without web-2 are marked
    // as changed (the SVC chain's one rule left lost its probability).
    b.click(&b.wait("#tab-rules", LIMIT).unwrap()).unwrap();
    let changed = b.wait_text(r#"#rules .rule.changed"#, LIMIT, |t| !t.is_empty()).unwrap();
    assert!(changed.contains("KUBE-SEP-"), "{changed}");
    shot(&b, "8b-rules-changed");
    b.click(&b.wait("#tab-map", LIMIT).unwrap()).unwrap();

    // A fault from the map: node-1's uplink down shows on its box and in the timeline; up again.
    b.click(&b.wait(r#"[data-node="node-1"]"#, LIMIT).unwrap()).unwrap();
    b.click(&b.wait(r#"#details button[data-action="link-down"]"#, LIMIT).unwrap()).unwrap();
    b.wait_text(r#"[data-node="node-1"] .fault"#, LIMIT, |t| t.contains("link-down: eth0 (the uplink) down")).unwrap();
    b.wait_text("#timeline", LIMIT, |t| t.contains("fault made: node-1 link-down")).unwrap();
    shot(&b, "8c-link-down");
    b.click(&b.wait(r#"#details button[data-action="link-up"]"#, LIMIT).unwrap()).unwrap();
    b.wait_text("#action-result", LIMIT, |t| t.contains("node-1: eth0 (the uplink) up")).unwrap();
    b.wait_text("#timeline", LIMIT, |t| t.contains("fault cleared: node-1 link-down")).unwrap();

    // Access: the used code and a wrong token are refused in words; the lab's token opens it.
    b.goto(&ui.link).unwrap();
    let msg = b.wait_text("#login-message", LIMIT, |t| !t.is_empty()).unwrap();
    assert!(msg.contains("wrong or was used already"), "{msg}");
    let api = podpath_client::http::blocking(
        ui.base().trim_start_matches("http://").parse().unwrap(),
        &podpath_client::http::Request::get("/api/picture"),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(api.status, 401, "the API without a session: {}", api.text());
    b.fill(&b.wait("#token", LIMIT).unwrap(), "not-the-token").unwrap();
    b.script("document.querySelector('form').submit()", json!([])).unwrap();
    let msg = b.wait_text("#login-message", LIMIT, |t| t.contains("not the lab's token")).unwrap();
    assert!(msg.contains("That is not the lab's token"), "{msg}");
    shot(&b, "9-wrong-token");
    let token = std::fs::read_to_string(lab.state.join("token")).expect("the lab's token");
    b.fill(&b.wait("#token", LIMIT).unwrap(), token.trim()).unwrap();
    b.script("document.querySelector('form').submit()", json!([])).unwrap();
    b.wait(r#"[data-node="node-1"][data-ready="True"]"#, LIMIT).unwrap();

    // The API server gone: the page says so (and keeps the last picture); then the lab taken
    // down under it: the page says that instead of showing a stale lab.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(lab.pid("apiserver-lite")), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    b.wait_text("#conn", LIMIT, |t| t.contains("API unreachable, retrying")).unwrap();
    assert!(!b.all(r#"[data-pod="default/web-1"]"#).unwrap().is_empty(), "the last picture stays");
    shot(&b, "10-api-lost");
    let (ok, out) = lab.run("down", &[]);
    assert!(ok, "{out}");
    b.wait_text("#conn", LIMIT, |t| t.contains("the lab is down")).unwrap();
    shot(&b, "11-lab-down");
    drop(b);
    drop(ui);
    drop(lab);
    assert_eq!(host_state(), before, "the host namespace changed");
}
