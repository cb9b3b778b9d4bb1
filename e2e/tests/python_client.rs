//! Python clients from PyPI (in a virtualenv the test creates and caches under the target
//! directory) against a real apiserver-lite process over TLS: the official `kubernetes`
//! client, `kubernetes_asyncio` and kr8s.

use std::process::Command;

use podpath_e2e::clients::venv;
use podpath_e2e::{text, ApiServer, Lab};
use testkit::netns::root_or_explain;

#[test]
fn python_client_create_list_watch_delete() {
    let python = venv();
    let srv = ApiServer::start(&[]).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/client_check.py");
    let o = Command::new(python).arg(script).arg(&srv.kubeconfig).env("HOME", srv.dir.path()).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "python client failed:\n{out}\n{err}");
    assert!(out.contains("python client: ok"), "{out}");
}

/// A dual-stack API server (two Service ranges, as kube-apiserver's
/// `--service-cluster-ip-range=IPv4,IPv6`): the Python client creates a RequireDualStack
/// Service and reads both `clusterIPs`.
#[test]
fn python_client_reads_both_cluster_ips_of_a_dual_stack_service() {
    let python = venv();
    let srv = ApiServer::start(&["--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/112"]).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/dualstack_check.py");
    let o = Command::new(python).arg(script).arg(&srv.kubeconfig).env("HOME", srv.dir.path()).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "python client failed:\n{out}\n{err}");
    assert!(out.contains("python dual-stack: ok"), "{out}");
}

/// kubernetes_asyncio's watch (`watch=True`) and Deployment creates read by kubernetes_asyncio
/// and kr8s, both of which failed before.
#[test]
fn async_python_clients_watch_and_create_deployments() {
    let python = venv();
    let srv = ApiServer::start(&[]).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/async_check.py");
    let o = Command::new(python).arg(script).arg(&srv.kubeconfig).env("HOME", srv.dir.path()).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "async python clients failed:\n{out}\n{err}");
    assert!(out.contains("async clients: ok"), "{out}");
}

/// The official client's streaming calls (`stream()` exec over WebSockets, pod logs,
/// `portforward`) against a real lab. Root only.
#[test]
fn python_client_exec_logs_and_port_forward_in_a_lab() {
    if !root_or_explain() {
        return;
    }
    let python = venv();
    let lab = Lab::with_web_and_ticker("pystream").unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/stream_check.py");
    let home = tempfile::tempdir().unwrap();
    let o = Command::new(python).arg(script).arg(&lab.kubeconfig).env("HOME", home.path()).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "python streaming failed:\n{out}\n{err}");
    assert!(out.contains("python streaming: ok"), "{out}");
}
