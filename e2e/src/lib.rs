//! Harness for podpath's end-to-end tests: real processes, real clients.
//!
//! [`ApiServer`] starts the `apiserver-lite` binary on free loopback ports with a private data
//! directory, kubeconfig and kubectl cache directory, and stops it (by PID) when dropped.
//! Binaries are found next to the test executable (`target/<profile>/`), or in
//! `PODPATH_BIN_DIR`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The path of a workspace binary.
pub fn bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("PODPATH_BIN_DIR") {
        return Path::new(&dir).join(name);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(p.exists(), "{} is not built: run `cargo build --workspace --bins` first", p.display());
    p
}

/// A free TCP port on 127.0.0.1 (bound and released; a race with other processes is possible
/// but unlikely, and start-up retries once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A running `apiserver-lite` process.
pub struct ApiServer {
    child: Child,
    pub rest: SocketAddr,
    pub grpc: SocketAddr,
    pub dir: tempfile::TempDir,
    pub data_dir: PathBuf,
    pub kubeconfig: PathBuf,
    extra_args: Vec<String>,
}

impl ApiServer {
    pub fn start(extra_args: &[&str]) -> Result<ApiServer> {
        let dir = tempfile::Builder::new().prefix("podpath-e2e-").tempdir()?;
        let data_dir = dir.path().join("data");
        let extra: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let (child, rest, grpc) = spawn(&data_dir, &extra, dir.path())?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_text(rest))?;
        Ok(ApiServer { child, rest, grpc, dir, data_dir, kubeconfig, extra_args: extra })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL (no chance to flush) and starts it again on the same
    /// data directory and ports.
    pub fn kill9_and_restart(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        let mut args = self.extra_args.clone();
        args.extend(["--listen".into(), self.rest.to_string(), "--grpc-listen".into(), self.grpc.to_string()]);
        let (child, ()) = spawn_on(&self.data_dir, &args, self.dir.path(), self.rest)?;
        self.child = child;
        Ok(())
    }

    /// Runs kubectl against this server with a private cache directory.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("kubectl runs")
    }

    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(self.dir.path().join("kube-cache"));
        c.args(args);
        c.env("HOME", self.dir.path());
        c
    }

    /// GET over plain HTTP/1.1; returns the status code and body.
    pub fn http_get(&self, path: &str) -> Result<(u16, String)> {
        http_get(self.rest, path)
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(data_dir: &Path, extra: &[String], log_dir: &Path) -> Result<(Child, SocketAddr, SocketAddr)> {
    let mut last = None;
    for _ in 0..3 {
        let rest: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let mut args = extra.to_vec();
        args.extend(["--listen".into(), rest.to_string(), "--grpc-listen".into(), grpc.to_string()]);
        match spawn_on(data_dir, &args, log_dir, rest) {
            Ok(child) => return Ok((child.0, rest, grpc)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried"))
}

fn spawn_on(data_dir: &Path, args: &[String], log_dir: &Path, rest: SocketAddr) -> Result<(Child, ())> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log_dir.join("apiserver.log"))?;
    let mut child = Command::new(bin("apiserver-lite"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting apiserver-lite")?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            let log = std::fs::read_to_string(log_dir.join("apiserver.log")).unwrap_or_default();
            bail!("apiserver-lite exited with {status}: {log}");
        }
        if matches!(http_get(rest, "/readyz"), Ok((200, _))) {
            return Ok((child, ()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    bail!("apiserver-lite did not become ready on {rest}")
}

pub fn kubeconfig_text(rest: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: http://{rest}\nusers:\n- name: lab\n  user: {{}}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\n    namespace: default\ncurrent-context: lab\n"
    )
}

/// A minimal HTTP/1.1 GET (keeps the harness free of an HTTP client dependency).
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/json\r\nConnection: close\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let code = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("HTTP status line")?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((code, body))
}

/// stdout and stderr of a command, for assertion messages.
pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}
