//! A container's monitor (the role of conmon in CRI-O): `podpath-workload monitor` starts the
//! container's process with its output on pipes (or a terminal), writes that output to the
//! container's log in the CRI format ([`crate::crilog`]), passes SIGTERM on, and reports the
//! exit code. For a container that asked for `stdin` or `tty` it also holds the stdin and the
//! terminal and lets `kubectl attach` clients in through a Unix socket (`--console`). Because
//! the monitor, not the agent, holds all of this, a restarted agent finds the logs still
//! written and can attach again.
//!
//! The socket speaks small frames, `[kind][length u32 BE][payload]`: from the client stdin
//! (0), a resize (1, width and height as u16 BE) or the end of stdin (2); from the console
//! stdout (1) or stderr (2).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{broadcast, mpsc};

use super::exec::{resize, slave_stdio, Input, Outcome, Output, Pty};
use crate::crilog;

/// Set in the monitored process's environment to the monitor's PID: `podpath-workload` then
/// asks the kernel to kill it when the monitor dies, as a container dies with its runtime's
/// init — a monitor killed by hand (`podpath fault kill pod`) must not leave an orphan that
/// holds the pod's ports and makes every restart fail.
pub const DIE_WITH_PARENT: &str = "PODPATH_DIE_WITH_PARENT";

pub const TO_STDIN: u8 = 0;
pub const TO_RESIZE: u8 = 1;
pub const TO_STDIN_EOF: u8 = 2;
pub const FROM_STDOUT: u8 = 1;
pub const FROM_STDERR: u8 = 2;
const MAX_FRAME: usize = 1 << 20;

/// One frame. Pure.
pub fn frame(kind: u8, data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + data.len());
    f.push(kind);
    f.extend_from_slice(&(data.len() as u32).to_be_bytes());
    f.extend_from_slice(data);
    f
}

/// Splits the first whole frame off `buf`. Pure; `Err` for a frame over 1 MiB.
pub fn parse_frame(buf: &mut BytesMut) -> Result<Option<(u8, Bytes)>, String> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > MAX_FRAME {
        return Err(format!("a console frame of {len} bytes is over the limit"));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let kind = buf[0];
    buf.advance(5);
    Ok(Some((kind, buf.split_to(len).freeze())))
}

/// How the monitor runs its container.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    /// The container's log (CRI format, appended).
    pub log: Option<PathBuf>,
    /// Where `kubectl attach` reaches the container (containers with `stdin` or `tty`).
    pub socket: Option<PathBuf>,
    /// The container reads stdin (otherwise it gets /dev/null).
    pub stdin: bool,
    pub tty: bool,
    /// Close the container's stdin when the first attached client closes its own (`stdinOnce`).
    pub stdin_once: bool,
    /// What a SIGTERM to the monitor reaches the container as (the image's `StopSignal`).
    pub stop_signal: Option<nix::sys::signal::Signal>,
    /// The command starts the container and exits; the container's process, named by this PID
    /// file, is then adopted and waited for (see `podpath-workload monitor --adopt`).
    pub adopt: Option<PathBuf>,
    /// The container's process (a `join` that enters the sandbox and execs the command).
    pub argv: Vec<String>,
}

/// Copies one output of the container to the log, as CRI records, and to attached clients.
/// Each record batch is one append, so stdout's and stderr's records never interleave mid-line.
async fn pump_out<R: AsyncRead + Unpin>(
    mut r: R,
    kind: u8,
    mut log: Option<std::fs::File>,
    tx: Option<broadcast::Sender<(u8, Bytes)>>,
) {
    use std::io::Write;
    let stream = if kind == FROM_STDERR { crilog::Stream::Stderr } else { crilog::Stream::Stdout };
    let mut enc = crilog::Encoder::new(stream);
    // Not zeroed: a monitor beside every container touches only the pages its output fills.
    let mut buf: Vec<u8> = Vec::with_capacity(32 << 10);
    let mut records = Vec::new();
    loop {
        buf.clear();
        let n = r.read_buf(&mut buf).await.unwrap_or(0);
        records.clear();
        if n == 0 {
            enc.finish(jiff::Timestamp::now(), &mut records);
        } else {
            enc.push(jiff::Timestamp::now(), &buf[..n], &mut records);
            if let Some(tx) = &tx {
                let _ = tx.send((kind, Bytes::copy_from_slice(&buf[..n])));
            }
        }
        if let (Some(f), false) = (log.as_mut(), records.is_empty()) {
            if f.write_all(&records).is_err() {
                log = None; // a full disk loses log lines, never the container
            }
        }
        if n == 0 {
            return;
        }
    }
}

/// Runs the monitor until its container exits; returns the container's exit code.
pub async fn run(opts: ConsoleOptions) -> Result<i32, String> {
    let log = match &opts.log {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open the log {}: {e}", path.display()))?;
            Some(f)
        }
        None => None,
    };
    let clone_log = || log.as_ref().and_then(|f| f.try_clone().ok());
    let mut listener = None;
    let mut _socket = None;
    if let Some(socket) = &opts.socket {
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let _ = std::fs::remove_file(socket);
        listener = Some(UnixListener::bind(socket).map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?);
        _socket = Some(RemoveOnDrop(socket.clone()));
    }
    let (program, args) = opts.argv.split_first().ok_or("no command")?;
    if opts.adopt.is_some() {
        // The runtime's container process is reparented here when the runtime exits.
        nix::sys::prctl::set_child_subreaper(true).map_err(|e| format!("cannot become a subreaper: {e}"))?;
    }
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).kill_on_drop(true).env(DIE_WITH_PARENT, std::process::id().to_string());
    // Attached clients' copy of the output, only where one can attach: the channel's 256 slots
    // are made up front, and most containers have no console.
    let out_tx = listener.is_some().then(|| broadcast::channel::<(u8, Bytes)>(256).0);
    let (in_tx, mut in_rx) = mpsc::channel::<Input>(64);
    let mut pumps = tokio::task::JoinSet::new();
    let mut pty_parts = None;
    if opts.tty {
        let (pty, slave) = Pty::open().map_err(|e| format!("cannot allocate a terminal: {e}"))?;
        let [i, o, e] = slave_stdio(slave).map_err(|e| format!("cannot allocate a terminal: {e}"))?;
        cmd.stdin(i).stdout(o).stderr(e);
        resize(&pty.master, 80, 24);
        pty_parts = Some(pty);
    } else {
        cmd.stdin(if opts.stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    // A container starts with every signal at its default action, as runc gives it one. What
    // this monitor inherited as ignored (a background job's SIGINT and SIGQUIT, nohup's SIGHUP:
    // `podpath up &` in a script passes them to every agent and pod) would stay ignored across
    // exec, and nginx's stop signal, SIGQUIT, would do nothing; caught here instead, they are
    // reset to the default in the container (exec resets caught signals, not ignored ones).
    // The monitor itself goes on ignoring them: nothing reads these streams.
    let _caught: Vec<tokio::signal::unix::Signal> = [
        tokio::signal::unix::SignalKind::interrupt(),
        tokio::signal::unix::SignalKind::quit(),
        tokio::signal::unix::SignalKind::hangup(),
    ]
    .into_iter()
    .filter_map(|k| tokio::signal::unix::signal(k).ok())
    .collect();
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {program}: {e}"))?;
    drop(cmd);
    let child_pid = child.id().map(|p| p as i32);
    let mut stdin_pipe = child.stdin.take();
    let (master, mut pty_wr) = match pty_parts {
        Some(Pty { master, rd, wr }) => {
            pumps.spawn(pump_out(rd, FROM_STDOUT, clone_log(), out_tx.clone()));
            (Some(master), Some(wr))
        }
        None => {
            if let Some(o) = child.stdout.take() {
                pumps.spawn(pump_out(o, FROM_STDOUT, clone_log(), out_tx.clone()));
            }
            if let Some(e) = child.stderr.take() {
                pumps.spawn(pump_out(e, FROM_STDERR, clone_log(), out_tx.clone()));
            }
            (None, None)
        }
    };
    let accept = {
        let (out_tx, in_tx) = (out_tx.clone(), in_tx.clone());
        let stdin_once = opts.stdin_once;
        tokio::spawn(async move {
            let Some(listener) = listener else { return };
            let Some(out_tx) = out_tx else { return };
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve_client(conn, out_tx.subscribe(), in_tx.clone(), stdin_once));
            }
        })
    };
    drop(in_tx);
    let mut term =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    let stop = opts.stop_signal.unwrap_or(nix::sys::signal::Signal::SIGTERM);
    // With --adopt: the container's process once the runtime has started it and exited. Its
    // exit is noticed by SIGCHLD (it is our child), then reaped through its PID descriptor.
    let mut adopted: Option<Adopted> = None;
    let mut children =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).map_err(|e| e.to_string())?;
    let mut stop_asked = false;
    // Parsing the command line and starting up left freed memory below live data; a monitor
    // runs beside every container for its life, so it gives those pages back once.
    podpath_client::memory::trim();
    let code = loop {
        if let Some(a) = &adopted {
            if let Some(code) = a.reap() {
                break code;
            }
        }
        tokio::select! {
            st = child.wait(), if adopted.is_none() => {
                let st = st.map_err(|e| e.to_string())?;
                match &opts.adopt {
                    Some(pid_file) if st.success() => match adopt(pid_file) {
                        Ok(a) => {
                            if stop_asked {
                                a.signal(stop);
                            }
                            adopted = Some(a);
                        }
                        Err(e) => {
                            eprintln!("podpath-workload: {e}");
                            break 128;
                        }
                    },
                    _ => break exit_code(&st),
                }
            }
            _ = children.recv(), if adopted.is_some() => {}
            _ = term.recv() => {
                // The agent stops the container through its console: pass it on, as the
                // image's stop signal when it has one.
                stop_asked = true;
                match &adopted {
                    Some(a) => a.signal(stop),
                    None => {
                        if let Some(pid) = child_pid {
                            let pid = nix::unistd::Pid::from_raw(pid);
                            // The child leads its group when it is podpath-workload (every mode
                            // starts a session); any other child gets the signal itself.
                            if nix::sys::signal::killpg(pid, stop).is_err() {
                                let _ = nix::sys::signal::kill(pid, stop);
                            }
                        }
                    }
                }
            }
            Some(i) = in_rx.recv() => match i {
                Input::Stdin(b) => {
                    if let Some(w) = pty_wr.as_mut() {
                        let _ = w.write_all(&b).await;
                    } else if let Some(w) = stdin_pipe.as_mut() {
                        if w.write_all(&b).await.is_err() {
                            stdin_pipe = None;
                        }
                    }
                }
                Input::StdinClosed => stdin_pipe = None,
                Input::Resize { width, height } => {
                    if let Some(m) = &master {
                        resize(m, width, height);
                    }
                }
            },
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), async { while pumps.join_next().await.is_some() {} }).await;
    accept.abort();
    Ok(code)
}

/// A process's exit code as a container's: its status, or 128 + the signal that ended it.
fn exit_code(s: &std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))
}

/// The container's process, adopted from the runtime: its PID and a PID descriptor (signals
/// reach it and never a process that reused the number).
struct Adopted {
    pid: nix::unistd::Pid,
    fd: std::os::fd::OwnedFd,
}

/// The container's process named by the runtime's PID file. It becomes this monitor's child as
/// the runtime's processes exit (crun forks once more to detach: the container is a grandchild
/// until that fork exits too), since the monitor is a subreaper.
fn adopt(pid_file: &std::path::Path) -> Result<Adopted, String> {
    let text = std::fs::read_to_string(pid_file)
        .map_err(|e| format!("the runtime left no PID file {}: {e}", pid_file.display()))?;
    let pid = text
        .trim()
        .parse::<i32>()
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| format!("{} holds no PID: {text:?}", pid_file.display()))?;
    let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
        .map_err(|e| format!("the container's process {} is gone: {e}", pid.as_raw_nonzero()))?;
    Ok(Adopted { pid: nix::unistd::Pid::from_raw(pid.as_raw_nonzero().get()), fd })
}

impl Adopted {
    /// Reaps every exited child (the runtime's leftovers too); the container's exit code once
    /// it has exited, None while it runs.
    fn reap(&self) -> Option<i32> {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(p, code)) if p == self.pid => return Some(code),
                Ok(WaitStatus::Signaled(p, sig, _)) if p == self.pid => return Some(128 + sig as i32),
                Ok(WaitStatus::StillAlive) => return None,
                Ok(_) => continue,
                // No child left: the container ended before it was ours (its runtime reaped it).
                Err(_) => {
                    eprintln!("podpath-workload: the container's process ended before the runtime let it go");
                    return Some(128);
                }
            }
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(sig) = rustix::process::Signal::from_named_raw(sig as i32) {
            let _ = rustix::process::pidfd_send_signal(&self.fd, sig);
        }
    }
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn serve_client(
    conn: UnixStream,
    mut out: broadcast::Receiver<(u8, Bytes)>,
    input: mpsc::Sender<Input>,
    stdin_once: bool,
) {
    let (mut rd, mut wr) = conn.into_split();
    let writer = tokio::spawn(async move {
        loop {
            match out.recv().await {
                Ok((kind, data)) => {
                    if wr.write_all(&frame(kind, &data)).await.is_err() {
                        return;
                    }
                }
                // A slow client misses output rather than holding the container back.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    let mut buf = BytesMut::with_capacity(8 << 10);
    let mut closed_stdin = false;
    'read: while rd.read_buf(&mut buf).await.is_ok_and(|n| n > 0) {
        while let Ok(Some((kind, data))) = parse_frame(&mut buf) {
            let i = match kind {
                TO_STDIN => Input::Stdin(data),
                TO_RESIZE if data.len() == 4 => Input::Resize {
                    width: u16::from_be_bytes([data[0], data[1]]),
                    height: u16::from_be_bytes([data[2], data[3]]),
                },
                TO_STDIN_EOF => {
                    closed_stdin = true;
                    if !stdin_once {
                        continue;
                    }
                    Input::StdinClosed
                }
                _ => continue,
            };
            if input.send(i).await.is_err() {
                break 'read;
            }
        }
    }
    if stdin_once && !closed_stdin {
        let _ = input.send(Input::StdinClosed).await;
    }
    writer.abort();
}

/// `kubectl attach` on the node: through the container's console when it has one, otherwise
/// the container's output as it is written to its log (what attach shows of a container that
/// has no stdin). Ends when the container's output ends or the client goes.
pub async fn attach(
    socket: Option<&Path>,
    log: &Path,
    alive: impl Fn() -> bool,
    mut input: mpsc::Receiver<Input>,
    out: mpsc::Sender<Output>,
) -> Outcome {
    if let Some(conn) = match socket {
        Some(s) => UnixStream::connect(s).await.ok(),
        None => None,
    } {
        let (mut rd, mut wr) = conn.into_split();
        let mut buf = BytesMut::with_capacity(32 << 10);
        loop {
            tokio::select! {
                r = rd.read_buf(&mut buf) => {
                    if !r.is_ok_and(|n| n > 0) {
                        return Outcome::Exited(0);
                    }
                    while let Ok(Some((kind, data))) = parse_frame(&mut buf) {
                        let o = if kind == FROM_STDERR { Output::Stderr(data) } else { Output::Stdout(data) };
                        if out.send(o).await.is_err() {
                            return Outcome::Failed("the client went away".into());
                        }
                    }
                }
                i = input.recv() => {
                    let f = match i {
                        Some(Input::Stdin(b)) => frame(TO_STDIN, &b),
                        Some(Input::StdinClosed) => frame(TO_STDIN_EOF, &[]),
                        Some(Input::Resize { width, height }) => {
                            let mut p = width.to_be_bytes().to_vec();
                            p.extend_from_slice(&height.to_be_bytes());
                            frame(TO_RESIZE, &p)
                        }
                        None => return Outcome::Failed("the client went away".into()),
                    };
                    if wr.write_all(&f).await.is_err() {
                        return Outcome::Exited(0);
                    }
                }
            }
        }
    }
    // No console: follow the log from its current end.
    let mut offset = tokio::fs::metadata(log).await.map(|m| m.len()).unwrap_or(0);
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    let mut lines = crilog::Lines::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Some(chunk) = crate::tail::appended(log, &mut offset).await {
                    for line in lines.feed(&chunk) {
                        let Some(r) = crilog::parse(&line) else { continue };
                        let o = match r.stream {
                            crilog::Stream::Stdout => Output::Stdout(r.output().into()),
                            crilog::Stream::Stderr => Output::Stderr(r.output().into()),
                        };
                        if out.send(o).await.is_err() {
                            return Outcome::Failed("the client went away".into());
                        }
                    }
                }
                if !alive() {
                    return Outcome::Exited(0);
                }
            }
            i = input.recv() => if i.is_none() {
                return Outcome::Failed("the client went away".into());
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let mut b = BytesMut::new();
        b.extend_from_slice(&frame(TO_STDIN, b"ls\n"));
        b.extend_from_slice(&frame(TO_STDIN_EOF, b""));
        b.extend_from_slice(&frame(TO_STDIN, b"partial")[..4]);
        assert_eq!(parse_frame(&mut b).unwrap(), Some((TO_STDIN, Bytes::from_static(b"ls\n"))));
        assert_eq!(parse_frame(&mut b).unwrap(), Some((TO_STDIN_EOF, Bytes::new())));
        assert_eq!(parse_frame(&mut b).unwrap(), None);
        let mut huge = BytesMut::from(&[0u8, 0xff, 0xff, 0xff, 0xff][..]);
        assert!(parse_frame(&mut huge).is_err());
    }
}
