//! Root test of the `podpath` CLI: two labs side by side, a pod and a NodePort Service created
//! with the real kubectl, curled from each lab's external client through its gateway, `exec`
//! into a node and a pod, `status`, `down` — and the host namespace unchanged, nothing left.

use std::process::Command;

use podpath_e2e::Lab;
use testkit::netns::{host_state, root_or_explain};

#[test]
fn two_labs_side_by_side_serve_a_node_port_to_their_clients() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let a = Lab::up("a", &["--nodes", "2"]).expect("podpath up a");
    let b = Lab::up("b", &["--nodes", "1"]).expect("podpath up b");

    // The same name again is refused, and nothing of the running lab is touched.
    let (ok, out) = a.run("up", &[]);
    assert!(!ok && out.contains("already exists and is running"), "{out}");
    let (ok, out) = a.run("status", &[]);
    assert!(ok && out.matches("running").count() == 5 && out.matches(" Ready").count() == 2, "{out}");

    for lab in [&a, &b] {
        lab.kubectl(&["run", "web", "--image=podpath/echo", "--port=8080"]);
        lab.kubectl(&["expose", "pod", "web", "--type=NodePort", "--port=80", "--target-port=8080"]);
        lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    }
    let np = a.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    // Through the gateway to both nodes; node-2 forwards to the pod on node-1 with masquerade.
    for node in ["192.168.56.11", "192.168.56.12"] {
        let (ok, page) = a.run("curl", &[&format!("http://{node}:{np}/")]);
        assert!(ok && page.contains("pod: default/web"), "{page}");
    }
    let (ok, page) = b.run(
        "curl",
        &[&format!(
            "http://192.168.56.11:{}/",
            b.kubectl(&["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"])
        )],
    );
    assert!(ok && page.contains("pod: default/web"), "{page}");

    let (ok, rules) = a.run("exec", &["node-1", "--", "iptables-save", "-t", "nat"]);
    assert!(ok && rules.contains("-m comment --comment \"default/web\" -m tcp --dport"), "{rules}");
    let (ok, host) = a.run("exec", &["pod/default/web", "--", "hostname"]);
    assert!(ok && host.trim() == "web", "{host}");
    let (ok, log) = a.run("logs", &["node-1"]);
    assert!(ok && log.contains("registered"), "{log}");
    let (ok, err) = a.run("exec", &["node-9", "--", "true"]);
    assert!(!ok && err.contains("no host \"node-9\""), "{err}");

    let a_name = a.name.clone();
    drop(a);
    drop(b);
    let left =
        String::from_utf8_lossy(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).into_owned();
    assert!(!left.contains(&format!("pp-{a_name}-")), "{left}");
    assert_eq!(host_state(), before, "the host namespace changed");
}
