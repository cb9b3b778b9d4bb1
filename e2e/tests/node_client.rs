//! The official JavaScript client, `@kubernetes/client-node` from the npm registry (installed
//! by the test under the target directory, cached), against a real apiserver-lite process with
//! the kubeconfig users get: https, the lab CA, a bearer token. It refused podpath's plain-HTTP
//! kubeconfig before the API spoke TLS.

use std::path::{Path, PathBuf};
use std::process::Command;

use podpath_e2e::{text, ApiServer, Lab};
use testkit::netns::root_or_explain;

/// 1.4: 2.x needs Node.js 22 (its HTTP stack uses zstd); Debian 13 ships Node.js 20.
const CLIENT: &str = "@kubernetes/client-node@1.4.0";

/// A directory with the client installed (on first use; later runs reuse it). The tests of
/// this file run at once: one installs while the others wait (two npm installs into one
/// directory trip over each other's files).
fn modules() -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().unwrap();
    let dir = exe.ancestors().nth(3).unwrap().join("e2e-node");
    let marker = dir.join(".installed");
    let entry = dir.join("node_modules/@kubernetes/client-node/dist/index.js");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(CLIENT) && entry.is_file() {
        return dir;
    }
    // A half install (an interrupted or failed one) starts over.
    let _ = std::fs::remove_file(&marker);
    let _ = std::fs::remove_dir_all(dir.join("node_modules"));
    std::fs::create_dir_all(&dir).unwrap();
    // A package.json of its own: npm installs here, not in a parent project.
    std::fs::write(dir.join("package.json"), r#"{"name": "podpath-e2e-node", "private": true}"#).unwrap();
    let o = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix"])
        .arg(&dir)
        .arg(CLIENT)
        .output()
        .expect("npm runs (.ci/run installs nodejs and npm)");
    assert!(o.status.success(), "npm install {CLIENT} failed: {:?}", text(&o));
    std::fs::write(&marker, CLIENT).unwrap();
    dir
}

/// Runs one of `tests/node/`'s scripts with the installed client (copied next to
/// `node_modules`, so that its `import` finds the client) against `kubeconfig`; asserts that it
/// succeeded and printed `ok_line`.
fn run_check(script: &str, kubeconfig: &Path, home: &Path, ok_line: &str) {
    let dir = modules();
    let copy = dir.join(script);
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node").join(script), &copy).unwrap();
    let o = Command::new("node").arg(&copy).arg(kubeconfig).env("HOME", home).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{script} failed:\n{out}\n{err}");
    assert!(out.contains(ok_line), "{out}");
}

#[test]
fn node_client_over_tls_with_the_lab_ca() {
    // A short event log, so a continue token expires within the script.
    let srv = ApiServer::start(&["--event-log-capacity", "50"]).unwrap();
    run_check("client_check.mjs", &srv.kubeconfig, srv.dir.path(), "node client: ok");
}

/// A dual-stack API server (two Service ranges): the client creates a RequireDualStack
/// Service and reads both `clusterIPs`, downgrades it, and gets the real refusal of a
/// single-stack policy with two families.
#[test]
fn node_client_reads_both_cluster_ips_of_a_dual_stack_service() {
    let srv = ApiServer::start(&["--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/112"]).unwrap();
    run_check("dualstack_check.mjs", &srv.kubeconfig, srv.dir.path(), "node dual-stack: ok");
}

/// The client's Exec, pod log and PortForward against a real lab. Root only.
#[test]
fn node_client_exec_logs_and_port_forward_in_a_lab() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::with_web_and_ticker("jsstream").unwrap();
    let home = tempfile::tempdir().unwrap();
    run_check("stream_check.mjs", &lab.kubeconfig, home.path(), "node streaming: ok");
}
