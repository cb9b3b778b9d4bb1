//! The official Python `kubernetes` client (from PyPI, in a virtualenv the test creates and
//! caches under the target directory) against a real apiserver-lite process.

use std::path::PathBuf;
use std::process::Command;

use podpath_e2e::{text, ApiServer};

/// The pinned client version, the one shared/reference/kubectl-surface.md was checked with.
const CLIENT: &str = "kubernetes==37.0.2";

/// A virtualenv with the client installed, shared by runs (created on first use).
fn venv() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let dir = target.join("e2e-venv");
    let python = dir.join("bin/python");
    let marker = dir.join(".installed");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(CLIENT) {
        return python;
    }
    let o = Command::new("python3").args(["-m", "venv", "--clear"]).arg(&dir).output().expect("python3 runs");
    assert!(o.status.success(), "python3 -m venv failed: {:?}", text(&o));
    let o = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", CLIENT])
        .output()
        .unwrap();
    assert!(o.status.success(), "pip install {CLIENT} failed: {:?}", text(&o));
    std::fs::write(&marker, CLIENT).unwrap();
    python
}

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
