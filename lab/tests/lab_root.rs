//! Root test of the `podpath` CLI: two labs side by side, a pod and a NodePort Service created
//! with the real kubectl, curled from each lab's external client through its gateway, `exec`
//! into a node and a pod, `status`, `down` — and the host namespace unchanged, nothing left.

use std::path::Path;
use std::process::Command;

use testkit::netns::{host_state, root_or_explain};

fn podpath(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_podpath")).args(args).output().expect("run podpath");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> String {
    let out = Command::new("kubectl").arg("--kubeconfig").arg(kubeconfig).args(args).output().expect("run kubectl");
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Takes a lab down when the test ends, however it ends.
struct Lab {
    name: String,
    state: String,
    _dir: tempfile::TempDir,
}

impl Lab {
    fn up(name: &str, nodes: &str) -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (ok, out) = podpath(&["up", "--name", name, "--state-dir", state.to_str().unwrap(), "--nodes", nodes]);
        assert!(ok, "podpath up: {out}");
        assert!(out.contains("ready: "), "{out}");
        Lab { name: name.into(), state: state.display().to_string(), _dir: dir }
    }
    fn args<'a>(&'a self, cmd: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec![cmd, "--name", &self.name, "--state-dir", &self.state];
        v.extend_from_slice(rest);
        v
    }
    fn run(&self, cmd: &str, rest: &[&str]) -> (bool, String) {
        podpath(&self.args(cmd, rest))
    }
    fn kubeconfig(&self) -> std::path::PathBuf {
        Path::new(&self.state).join("kubeconfig")
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let (ok, out) = self.run("down", &[]);
        if !ok && !out.contains("no lab state") {
            eprintln!("podpath down {}: {out}", self.name);
        }
    }
}

#[test]
fn two_labs_side_by_side_serve_a_node_port_to_their_clients() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let tag = std::process::id() % 100000;
    let a = Lab::up(&format!("a{tag}"), "2");
    let b = Lab::up(&format!("b{tag}"), "1");

    // The same name again is refused, and nothing of the running lab is touched.
    let (ok, out) = a.run("up", &[]);
    assert!(!ok && out.contains("already exists and is running"), "{out}");
    let (ok, out) = a.run("status", &[]);
    assert!(ok && out.matches("running").count() == 4 && out.matches(" Ready").count() == 2, "{out}");

    for lab in [&a, &b] {
        let kc = lab.kubeconfig();
        kubectl(&kc, &["run", "web", "--image=podpath/echo", "--port=8080"]);
        kubectl(&kc, &["expose", "pod", "web", "--type=NodePort", "--port=80", "--target-port=8080"]);
        kubectl(&kc, &["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    }
    let kc = a.kubeconfig();
    let np = kubectl(&kc, &["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    // Through the gateway to both nodes; node-2 forwards to the pod on node-1 with masquerade.
    for node in ["192.168.56.11", "192.168.56.12"] {
        let (ok, page) = a.run("curl", &[&format!("http://{node}:{np}/")]);
        assert!(ok && page.contains("pod: default/web"), "{page}");
    }
    let (ok, page) = b.run(
        "curl",
        &[&format!(
            "http://192.168.56.11:{}/",
            kubectl(&b.kubeconfig(), &["get", "svc", "web", "-o", "jsonpath={.spec.ports[0].nodePort}"])
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
