//! Running a command in a pod for `kubectl exec` (kubelet and the container runtime's part):
//! the options from the request ([`ExecOptions::parse`]), the process inside the pod's
//! namespaces with pipes or a pseudo terminal ([`run`]), and the final `Status` ([`status`]).
//! Transports (WebSocket, SPDY) only move [`Input`] and [`Output`] between the client and here.

use std::os::fd::{AsFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

/// What an exec or attach request asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecOptions {
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

fn truthy(v: &str) -> bool {
    matches!(v, "1" | "true" | "True" | "TRUE")
}

impl ExecOptions {
    /// From the query string (`command` repeated, one word each). Kubelet's rules: at least one
    /// stream, and with a TTY stderr is merged into stdout. Pure.
    pub fn parse(query: &str) -> Result<ExecOptions, String> {
        let mut o = ExecOptions::default();
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match &*k {
                "command" => o.command.push(v.into_owned()),
                "stdin" | "input" => o.stdin = truthy(&v),
                "stdout" | "output" => o.stdout = truthy(&v),
                "stderr" | "error" => o.stderr = truthy(&v),
                "tty" => o.tty = truthy(&v),
                _ => {}
            }
        }
        if !(o.stdin || o.stdout || o.stderr) {
            return Err("you must specify at least 1 of stdin, stdout, stderr".into());
        }
        if o.tty {
            o.stderr = false;
        }
        Ok(o)
    }
}

/// From the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    Stdin(Bytes),
    /// The client's stdin reached its end.
    StdinClosed,
    Resize {
        width: u16,
        height: u16,
    },
}

/// To the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Exited(i32),
    /// It could not run (kubelet reports these as internal errors).
    Failed(String),
}

/// The final `Status` kubelet writes on the error stream for `command`'s outcome. Pure.
pub fn status(command: &[String], outcome: &Outcome) -> Value {
    match outcome {
        Outcome::Exited(0) => json!({"metadata": {}, "status": "Success"}),
        Outcome::Exited(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!(
                "command terminated with non-zero exit code: error executing command [{}], exit code {code}",
                command.join(" ")
            ),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        Outcome::Failed(e) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("Internal error occurred: error executing command in container: {e}"),
            "reason": "InternalError",
            "details": {"causes": [{"message": format!("error executing command in container: {e}")}]},
            "code": 500,
        }),
    }
}

/// The same outcome as the text older protocols (`channel.k8s.io` … v3) carry; empty on success.
pub fn status_text(command: &[String], outcome: &Outcome) -> String {
    match status(command, outcome).get("message") {
        Some(Value::String(m)) => m.clone(),
        _ => String::new(),
    }
}

/// Where the command runs.
#[derive(Debug, Clone)]
pub struct Target {
    /// `podpath-workload`, which enters the sandbox's namespaces and execs the command.
    pub workload_bin: PathBuf,
    pub sandbox_pid: i32,
    /// A container of an image: its runtime's PID file (the command runs in the container,
    /// with the container's environment).
    pub pid_file: Option<PathBuf>,
    pub env: Vec<(String, String)>,
}

/// Kills the command's whole process group (it leads its own session) when dropped, so a
/// client that goes away mid-stream leaves nothing running on the node.
struct GroupGuard(Option<i32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A pseudo terminal's master side: the descriptor (for window sizes) and two non-blocking
/// duplicates tokio reads and writes like pipe ends (epoll treats a pty master alike).
pub(crate) struct Pty {
    pub(crate) master: OwnedFd,
    pub(crate) rd: tokio::net::unix::pipe::Receiver,
    pub(crate) wr: tokio::net::unix::pipe::Sender,
}

impl Pty {
    /// A new pair: the master and the slave.
    pub(crate) fn open() -> std::io::Result<(Pty, OwnedFd)> {
        use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
        let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
        grantpt(&master)?;
        unlockpt(&master)?;
        let name = ptsname(&master, Vec::new())?;
        let slave = rustix::fs::open(
            name.as_c_str(),
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        rustix::fs::fcntl_setfl(&master, rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::RDWR)?;
        let rd = tokio::net::unix::pipe::Receiver::from_owned_fd_unchecked(master.try_clone()?)?;
        let wr = tokio::net::unix::pipe::Sender::from_owned_fd_unchecked(master.try_clone()?)?;
        Ok((Pty { master, rd, wr }, slave))
    }
}

/// A terminal's slave side as a command's stdin, stdout and stderr.
pub(crate) fn slave_stdio(slave: OwnedFd) -> std::io::Result<[Stdio; 3]> {
    let dup = |fd: &OwnedFd| fd.as_fd().try_clone_to_owned().map(Stdio::from);
    Ok([dup(&slave)?, dup(&slave)?, Stdio::from(slave)])
}

pub(crate) fn resize(master: &OwnedFd, width: u16, height: u16) {
    let ws = rustix::termios::Winsize { ws_row: height, ws_col: width, ws_xpixel: 0, ws_ypixel: 0 };
    let _ = rustix::termios::tcsetwinsize(master, ws);
}

/// Runs `opts.command` in the pod until it exits, moving input and output. Returns early (and
/// kills the command's process group) when `input` closes, which transports do when the client
/// goes away; dropping the future does the same.
pub async fn run(
    target: &Target,
    opts: &ExecOptions,
    mut input: mpsc::Receiver<Input>,
    out: mpsc::Sender<Output>,
) -> Outcome {
    let Some(program) = opts.command.first() else {
        return Outcome::Failed("no command given".into());
    };
    if target.pid_file.is_none() && !crate::pods::find_program(program) {
        return Outcome::Failed(format!(
            "failed to exec in container: failed to start exec: exec: {program:?}: executable file not found in $PATH"
        ));
    }
    let mut cmd = tokio::process::Command::new(&target.workload_bin);
    match &target.pid_file {
        Some(f) => cmd.arg("join").arg("--pid-file").arg(f),
        None => cmd.arg("join").arg("--sandbox").arg(target.sandbox_pid.to_string()),
    };
    if opts.tty {
        cmd.arg("--tty");
    }
    cmd.arg("--").args(&opts.command).env_clear().envs(target.env.iter().cloned()).kill_on_drop(true);
    let pty = if opts.tty {
        let (pty, slave) = match Pty::open().and_then(|(pty, slave)| Ok((pty, slave_stdio(slave)?))) {
            Ok(p) => p,
            Err(e) => return Outcome::Failed(format!("cannot allocate a terminal: {e}")),
        };
        let [i, o, e] = slave;
        cmd.stdin(i).stdout(o).stderr(e);
        resize(&pty.master, 80, 24);
        Some(pty)
    } else {
        cmd.stdin(if opts.stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(if opts.stdout { Stdio::piped() } else { Stdio::null() })
            .stderr(if opts.stderr { Stdio::piped() } else { Stdio::null() });
        None
    };
    // kubectl sends the client's terminal size as soon as the stream is open: the command
    // starts at that size (a command that reads it at once, `stty size`, would otherwise race
    // the resize); whatever else arrives meanwhile is kept for it.
    let mut early = vec![];
    if let Some(pty) = &pty {
        let wait = tokio::time::sleep(FIRST_SIZE);
        tokio::pin!(wait);
        loop {
            tokio::select! {
                i = input.recv() => match i {
                    Some(Input::Resize { width, height }) => {
                        resize(&pty.master, width, height);
                        break;
                    }
                    Some(other) => early.push(other),
                    None => return Outcome::Failed("the client went away".into()),
                },
                _ = &mut wait => break,
            }
        }
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Outcome::Failed(format!("cannot start {}: {e}", target.workload_bin.display())),
    };
    // The slave ends are the child's now: keeping them open here would hide its exit.
    drop(cmd);
    let _group = GroupGuard(child.id().map(|p| p as i32));
    match pty {
        Some(pty) => run_tty(&mut child, pty, opts, early, input, out).await,
        None => run_pipes(&mut child, input, out).await,
    }
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, out: mpsc::Sender<Output>, wrap: fn(Bytes) -> Output) {
    let mut buf = vec![0u8; 32 << 10];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 || out.send(wrap(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
            return;
        }
    }
}

/// How long a TTY command waits for the client's terminal size before it starts at 80×24.
const FIRST_SIZE: Duration = Duration::from_millis(300);

/// How long output is still drained after the command exits (a background child can hold the
/// pipes open for ever).
const DRAIN: Duration = Duration::from_secs(2);

async fn run_pipes(
    child: &mut tokio::process::Child,
    mut input: mpsc::Receiver<Input>,
    out: mpsc::Sender<Output>,
) -> Outcome {
    let mut readers = tokio::task::JoinSet::new();
    if let Some(o) = child.stdout.take() {
        readers.spawn(pump(o, out.clone(), Output::Stdout));
    }
    if let Some(e) = child.stderr.take() {
        readers.spawn(pump(e, out.clone(), Output::Stderr));
    }
    drop(out);
    let mut stdin = child.stdin.take();
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            msg = input.recv() => match msg {
                Some(Input::Stdin(b)) => {
                    if let Some(w) = stdin.as_mut() {
                        if w.write_all(&b).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Some(Input::StdinClosed) => stdin = None,
                Some(Input::Resize { .. }) => {}
                None => return Outcome::Failed("the client went away".into()),
            },
        }
    };
    drop(stdin);
    let _ = tokio::time::timeout(DRAIN, async { while readers.join_next().await.is_some() {} }).await;
    readers.abort_all();
    exit_outcome(status)
}

fn exit_outcome(status: std::io::Result<std::process::ExitStatus>) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(s) => Outcome::Exited(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))),
        Err(e) => Outcome::Failed(format!("cannot wait for the command: {e}")),
    }
}

async fn run_tty(
    child: &mut tokio::process::Child,
    pty: Pty,
    opts: &ExecOptions,
    early: Vec<Input>,
    mut input: mpsc::Receiver<Input>,
    out: mpsc::Sender<Output>,
) -> Outcome {
    let Pty { master, mut rd, mut wr } = pty;
    for i in early {
        match i {
            Input::Stdin(b) if opts.stdin => {
                let _ = wr.write_all(&b).await;
            }
            Input::Resize { width, height } => resize(&master, width, height),
            _ => {}
        }
    }
    let reader = {
        let out = out.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 32 << 10];
            // EIO once the last slave descriptor closes: the command (and its children) ended.
            while let Ok(n) = rd.read(&mut buf).await {
                if n == 0 || out.send(Output::Stdout(Bytes::copy_from_slice(&buf[..n]))).await.is_err() {
                    return;
                }
            }
        })
    };
    drop(out);
    let status = loop {
        tokio::select! {
            st = child.wait() => break st,
            msg = input.recv() => match msg {
                Some(Input::Stdin(b)) if opts.stdin => {
                    let _ = wr.write_all(&b).await;
                }
                Some(Input::Resize { width, height }) => resize(&master, width, height),
                Some(_) => {}
                None => {
                    reader.abort();
                    return Outcome::Failed("the client went away".into());
                }
            },
        }
    };
    let abort = reader.abort_handle();
    let _ = tokio::time::timeout(DRAIN, reader).await;
    abort.abort();
    exit_outcome(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_as_kubelet_reads_them() {
        let o = ExecOptions::parse("command=sh&command=-c&command=echo+a%26b&stdout=true&stderr=1").unwrap();
        assert_eq!(o.command, ["sh", "-c", "echo a&b"]);
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        let t = ExecOptions::parse("command=sh&stdin=true&stdout=true&stderr=true&tty=true").unwrap();
        assert!(t.tty && !t.stderr, "a TTY merges stderr into stdout");
        assert_eq!(
            ExecOptions::parse("command=true").unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
    }

    #[test]
    fn statuses_as_kubelet_writes_them() {
        let cmd = vec!["sh".to_string(), "-c".into(), "exit 3".into()];
        assert_eq!(status(&cmd, &Outcome::Exited(0)), json!({"metadata": {}, "status": "Success"}));
        let s = status(&cmd, &Outcome::Exited(3));
        assert_eq!(s["reason"], "NonZeroExitCode");
        assert_eq!(s["details"]["causes"][0], json!({"reason": "ExitCode", "message": "3"}));
        assert_eq!(
            s["message"],
            "command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3"
        );
        assert_eq!(status(&cmd, &Outcome::Failed("x".into()))["code"], 500);
        assert_eq!(status_text(&cmd, &Outcome::Exited(0)), "");
    }
}
