//! Processes of pods (sandboxes and workloads): the [`Processes`] trait and its Linux
//! implementation.
//!
//! A process is identified by its PID *and* its start time (field 22 of `/proc/PID/stat`), so a
//! restarted agent can adopt the processes it started before without mistaking a reused PID for
//! one of them, and never signals a stranger.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

use podpath_client::daemon::start_time;

use crate::error::{KubeletError, Result};

/// One process the agent started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProcId {
    pub pid: i32,
    pub start_time: u64,
}

/// What to start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcSpec {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// File that receives stdout and stderr (appended).
    pub log: Option<PathBuf>,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// It ended while another agent process was its parent: the status is lost.
    Unknown,
}

impl Exit {
    /// The exit code a container status shows (128 + signal, like a shell).
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
            Exit::Unknown => 137,
        }
    }
}

/// Signals the agent sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Kill,
}

/// Files a sandbox mounts over the node's in its own mount namespace, so the pod's processes
/// see the pod's resolver settings and hosts (kubelet's role; the node's files stay as they
/// are).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxFiles {
    pub resolv_conf: PathBuf,
    pub hosts: PathBuf,
}

/// Starting, watching and stopping processes.
pub trait Processes: Send + Sync + 'static {
    /// Starts the pod's sandbox holding new network, UTS and IPC namespaces (hostname set), and
    /// with `share_pid` a PID namespace for its containers (`shareProcessNamespace`); returns
    /// once they exist.
    fn start_sandbox(
        &self,
        hostname: &str,
        files: Option<SandboxFiles>,
        share_pid: bool,
        log: Option<PathBuf>,
    ) -> impl Future<Output = Result<ProcId>> + Send;
    /// Starts a workload process.
    fn spawn(&self, spec: &ProcSpec) -> impl Future<Output = Result<ProcId>> + Send;
    /// Whether the process is still the one we started.
    fn alive(&self, p: ProcId) -> bool;
    /// Sends a signal (nothing if the process is gone).
    fn signal(&self, p: ProcId, sig: Sig);
    /// Resolves when the process has ended.
    fn wait(&self, p: ProcId) -> impl Future<Output = Exit> + Send;
}

/// Shared implementations (a fake kept by a test as well as by the agent).
impl<T: Processes> Processes for std::sync::Arc<T> {
    fn start_sandbox(
        &self,
        hostname: &str,
        files: Option<SandboxFiles>,
        share_pid: bool,
        log: Option<PathBuf>,
    ) -> impl Future<Output = Result<ProcId>> + Send {
        (**self).start_sandbox(hostname, files, share_pid, log)
    }
    fn spawn(&self, spec: &ProcSpec) -> impl Future<Output = Result<ProcId>> + Send {
        (**self).spawn(spec)
    }
    fn alive(&self, p: ProcId) -> bool {
        (**self).alive(p)
    }
    fn signal(&self, p: ProcId, sig: Sig) {
        (**self).signal(p, sig)
    }
    fn wait(&self, p: ProcId) -> impl Future<Output = Exit> + Send {
        (**self).wait(p)
    }
}

/// The network namespace path of a sandbox, as CNI wants it.
pub fn netns_path(sandbox: ProcId) -> String {
    format!("/proc/{}/ns/net", sandbox.pid)
}

/// Real processes. Children of this agent are waited for (exit status known); processes adopted
/// from an earlier agent are polled through `/proc`.
#[derive(Default)]
pub struct LinuxProcesses {
    children: Mutex<HashMap<i32, tokio::process::Child>>,
}

fn command(spec: &ProcSpec) -> Result<tokio::process::Command> {
    let (prog, args) = spec.argv.split_first().ok_or_else(|| KubeletError::Config("empty command".into()))?;
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args).env_clear().stdin(Stdio::null());
    cmd.env(
        "PATH",
        std::env::var("PATH").unwrap_or_else(|_| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()),
    );
    for (k, v) in &spec.env {
        cmd.env(k, v);
    }
    match &spec.log {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| KubeletError::io(format!("create {}", dir.display()), e))?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| KubeletError::io(format!("open log {}", path.display()), e))?;
            let f2 = f.try_clone().map_err(|e| KubeletError::io("dup log file", e))?;
            cmd.stdout(f).stderr(f2);
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    Ok(cmd)
}

impl LinuxProcesses {
    fn track(&self, child: tokio::process::Child, what: &str) -> Result<ProcId> {
        let pid = child.id().ok_or_else(|| KubeletError::Process(format!("{what} exited at once")))? as i32;
        let start_time = start_time(pid).unwrap_or(0);
        self.children.lock().expect("children lock").insert(pid, child);
        Ok(ProcId { pid, start_time })
    }
}

impl Processes for LinuxProcesses {
    async fn start_sandbox(
        &self,
        hostname: &str,
        files: Option<SandboxFiles>,
        share_pid: bool,
        log: Option<PathBuf>,
    ) -> Result<ProcId> {
        let exe = workload_binary()?;
        let mut argv = vec![exe.display().to_string(), "sandbox".into(), "--hostname".into(), hostname.into()];
        if share_pid {
            argv.push("--share-pid".into());
        }
        if let Some(f) = files {
            argv.extend([
                "--resolv-conf".into(),
                f.resolv_conf.display().to_string(),
                "--hosts".into(),
                f.hosts.display().to_string(),
            ]);
        }
        let spec = ProcSpec { argv, env: vec![], log };
        let mut cmd = command(&spec)?;
        cmd.stdout(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| KubeletError::io(format!("start {}", exe.display()), e))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        let mut reader = tokio::io::BufReader::new(stdout);
        let read = tokio::time::timeout(Duration::from_secs(10), reader.read_line(&mut line));
        match read.await {
            Ok(Ok(_)) if line.trim() == "ready" => self.track(child, "sandbox"),
            _ => {
                let _ = child.start_kill();
                let status = child.wait().await.ok();
                Err(KubeletError::Process(format!(
                    "the sandbox for {hostname} did not start (exit {status:?}; see its log)"
                )))
            }
        }
    }

    async fn spawn(&self, spec: &ProcSpec) -> Result<ProcId> {
        let child = command(spec)?.spawn().map_err(|e| KubeletError::io(format!("start {}", spec.argv[0]), e))?;
        self.track(child, &spec.argv[0])
    }

    fn alive(&self, p: ProcId) -> bool {
        start_time(p.pid) == Some(p.start_time)
    }

    fn signal(&self, p: ProcId, sig: Sig) {
        if !self.alive(p) {
            return;
        }
        let s = match sig {
            Sig::Term => nix::sys::signal::Signal::SIGTERM,
            Sig::Kill => nix::sys::signal::Signal::SIGKILL,
        };
        // SIGTERM goes to the process (a container's monitor passes it on, so the container
        // may end cleanly); SIGKILL takes the whole tree, as a runtime kills a container's
        // cgroup, so no process of it outlives its monitor.
        let tree = match sig {
            Sig::Term => vec![],
            Sig::Kill => descendants(p.pid, &process_table()),
        };
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.pid), s);
        for pid in tree {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), s);
        }
    }

    async fn wait(&self, p: ProcId) -> Exit {
        let child = self.children.lock().expect("children lock").remove(&p.pid);
        match child {
            Some(mut child) => match child.wait().await {
                Ok(status) => {
                    use std::os::unix::process::ExitStatusExt;
                    match (status.code(), status.signal()) {
                        (Some(c), _) => Exit::Code(c),
                        (None, Some(s)) => Exit::Signal(s),
                        _ => Exit::Unknown,
                    }
                }
                Err(_) => Exit::Unknown,
            },
            None => {
                while self.alive(p) {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Exit::Unknown
            }
        }
    }
}

/// Every process's PID and parent PID, from `/proc`.
fn process_table() -> Vec<(i32, i32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // After the command name (which may hold spaces and parentheses): state, then ppid.
            let ppid = stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// The processes descending from `root` (children first found, then theirs), from (PID,
/// parent PID) pairs. Pure.
pub fn descendants(root: i32, table: &[(i32, i32)]) -> Vec<i32> {
    let mut out = vec![];
    let mut frontier = vec![root];
    while let Some(parent) = frontier.pop() {
        for &(pid, ppid) in table {
            if ppid == parent && pid != root && !out.contains(&pid) {
                out.push(pid);
                frontier.push(pid);
            }
        }
    }
    out
}

/// `podpath-workload`, found next to the running binary (or through `PODPATH_WORKLOAD`).
pub fn workload_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PODPATH_WORKLOAD") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| KubeletError::io("find the agent's own binary", e))?;
    let dir = exe.parent().ok_or_else(|| KubeletError::Config("the agent binary has no directory".into()))?;
    // Test binaries live one level down (target/debug/deps).
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join("podpath-workload");
        if p.exists() {
            return Ok(p);
        }
    }
    Err(KubeletError::Config(format!(
        "podpath-workload not found next to {} (set PODPATH_WORKLOAD to its path)",
        exe.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_tree_from_the_table() {
        let table = [(1, 0), (10, 1), (11, 10), (12, 11), (13, 10), (20, 1), (21, 20)];
        let mut d = descendants(10, &table);
        d.sort();
        assert_eq!(d, [11, 12, 13]);
        assert!(descendants(12, &table).is_empty());
    }

    #[tokio::test]
    async fn spawn_wait_and_signal_a_real_child() {
        let p = LinuxProcesses::default();
        let id = p
            .spawn(&ProcSpec { argv: vec!["sh".into(), "-c".into(), "exit 3".into()], env: vec![], log: None })
            .await
            .unwrap();
        assert_eq!(p.wait(id).await, Exit::Code(3));
        let id = p.spawn(&ProcSpec { argv: vec!["sleep".into(), "30".into()], env: vec![], log: None }).await.unwrap();
        assert!(p.alive(id));
        p.signal(id, Sig::Term);
        assert_eq!(p.wait(id).await, Exit::Signal(15));
        assert!(!p.alive(id));
        assert_eq!(Exit::Signal(15).code(), 143);
    }
}
