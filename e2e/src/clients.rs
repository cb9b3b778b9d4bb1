//! The real client libraries the tests drive podpath with, installed from their registries
//! under the target directory on first use and cached: the official Python `kubernetes` client
//! (with `kubernetes_asyncio` and kr8s) in a virtualenv, and `@kubernetes/client-node` with npm.
//! Shared by the client suites and the Vagrant lab's test.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::text;

/// The pinned clients: `kubernetes` as shared/reference/kubectl-surface.md was checked with,
/// and the async ones users reported failures with.
pub const PYTHON_CLIENTS: [&str; 3] = ["kubernetes==37.0.2", "kubernetes_asyncio==36.1.0", "kr8s==0.20.15"];

/// A virtualenv with the clients installed, shared by runs (created on first use; once per
/// test process, however many tests ask at once).
pub fn venv() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(make_venv).clone()
}

fn make_venv() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let dir = target.join("e2e-venv");
    let python = dir.join("bin/python");
    let marker = dir.join(".installed");
    let want = PYTHON_CLIENTS.join(" ");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return python;
    }
    let o = Command::new("python3").args(["-m", "venv", "--clear"]).arg(&dir).output().expect("python3 runs");
    assert!(o.status.success(), "python3 -m venv failed: {:?}", text(&o));
    let o = Command::new(&python)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check"])
        .args(PYTHON_CLIENTS)
        .output()
        .unwrap();
    assert!(o.status.success(), "pip install {want} failed: {:?}", text(&o));
    std::fs::write(&marker, &want).unwrap();
    python
}

/// 1.4: 2.x needs Node.js 22 (its HTTP stack uses zstd); Debian 13 ships Node.js 20.
pub const NODE_CLIENT: &str = "@kubernetes/client-node@1.4.0";

/// A directory with the client installed (on first use; later runs reuse it). The tests of
/// this file run at once: one installs while the others wait (two npm installs into one
/// directory trip over each other's files).
pub fn node_modules() -> PathBuf {
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().unwrap();
    let dir = exe.ancestors().nth(3).unwrap().join("e2e-node");
    let marker = dir.join(".installed");
    let entry = dir.join("node_modules/@kubernetes/client-node/dist/index.js");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(NODE_CLIENT) && entry.is_file() {
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
        .arg(NODE_CLIENT)
        .output()
        .expect("npm runs (.ci/run installs nodejs and npm)");
    assert!(o.status.success(), "npm install {NODE_CLIENT} failed: {:?}", text(&o));
    std::fs::write(&marker, NODE_CLIENT).unwrap();
    dir
}

/// Runs one of `tests/node/`'s scripts with the installed client (copied next to
/// `node_modules`, so that its `import` finds the client) against `kubeconfig`; asserts that it
/// succeeded and printed `ok_line`.
pub fn node_check(script: &str, kubeconfig: &Path, home: &Path, ok_line: &str) {
    node_check_with(script, kubeconfig, home, ok_line, &[])
}

/// [`node_check`] run through `wrapper` (e.g. `ip netns exec NS`: in another network namespace).
pub fn node_check_with(script: &str, kubeconfig: &Path, home: &Path, ok_line: &str, wrapper: &[&str]) {
    let dir = node_modules();
    let copy = dir.join(script);
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node").join(script), &copy).unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg("node");
            c
        }
        None => Command::new("node"),
    };
    let o = cmd.arg(&copy).arg(kubeconfig).env("HOME", home).output().unwrap();
    let (out, err) = text(&o);
    assert!(o.status.success(), "{script} failed:\n{out}\n{err}");
    assert!(out.contains(ok_line), "{out}");
}
