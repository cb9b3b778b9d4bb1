//! The `podpath-workload` program (its binary is the node agent's, a one-line `main` calling
//! [`main`]): what the kubelet runs for a pod, in place of a container runtime.
//!
//! - `sandbox --hostname NAME [--resolv-conf F --hosts F]`: the pod's sandbox (Kubernetes'
//!   "pause" process). It creates the pod's network and UTS namespaces (and, with the files, a
//!   mount namespace where they are mounted over /etc/resolv.conf and /etc/hosts), sets the hostname, brings `lo` up, prints `ready`, and
//!   then only holds the namespaces until it is stopped. CNI attaches the pod network to
//!   `/proc/<pid>/ns/net`; no bind mount is needed, so nothing leaks if the agent dies.
//! - `join --sandbox PID [--tty] -- CMD ARGS…`: enters the sandbox's namespaces and execs a
//!   program (with `--tty`, its terminal on stdin becomes the session's controlling terminal).
//! - `monitor [--sandbox PID] --log FILE [--console SOCKET [--stdin] [--tty] [--stdin-once]] -- ARGV…`: runs a
//!   container's process (a `join` or `echo`) with its output written to FILE in the CRI log
//!   format, and its stdin and terminal reachable for `kubectl attach` through SOCKET.
//! - `echo --sandbox PID [--port P]… [-- IMAGE-ARGS…]`: enters them and runs `podpath/echo`.
//!
//! Every mode starts its own session, so signals aimed at the agent's terminal or process group
//! never reach pods, and a restarted agent finds them still running.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;

use crate::echo;
use clap::{Parser, Subcommand};
use futures::TryStreamExt;
use nix::sched::CloneFlags;

#[derive(Parser, Debug)]
#[command(name = "podpath-workload", version, about = "Runs a pod's sandbox and workloads for podpath's node agent")]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Create the pod's network and UTS namespaces and hold them until stopped.
    Sandbox {
        #[arg(long)]
        hostname: String,
        /// The pod's resolv.conf, mounted over /etc/resolv.conf in a mount namespace of the pod.
        #[arg(long, requires = "hosts")]
        resolv_conf: Option<std::path::PathBuf>,
        /// The pod's hosts file, mounted over /etc/hosts likewise.
        #[arg(long, requires = "resolv_conf")]
        hosts: Option<std::path::PathBuf>,
        /// Also a PID namespace for the pod's containers (`shareProcessNamespace`): its first
        /// process, PID 1 there, is `podpath-workload pause`.
        #[arg(long)]
        share_pid: bool,
    },
    /// PID 1 of a pod's shared PID namespace (Kubernetes' pause): reaps the orphans that the
    /// containers leave, and dies with its sandbox (the PID given).
    #[command(hide = true)]
    Pause {
        sandbox: i32,
    },
    /// What a sandbox becomes once ready: holds its namespaces until stopped (it execs this).
    #[command(hide = true)]
    Hold,
    /// Enter a sandbox's namespaces (or a container's) and exec a program.
    Join {
        #[arg(long, required_unless_present = "pid_file", conflicts_with = "pid_file")]
        sandbox: Option<i32>,
        /// A container's PID file (its runtime's `--pid-file`): enter all its namespaces (mount,
        /// PID, IPC, UTS, network), its root, environment, working directory and user.
        #[arg(long)]
        pid_file: Option<std::path::PathBuf>,
        /// Make stdin (a terminal) the controlling terminal of the new session (`exec -t`).
        #[arg(long)]
        tty: bool,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    Monitor(MonitorArgs),
    /// Run a container of an image with the OCI runtime: in a mount namespace of its own, the
    /// image's layers are stacked with overlayfs on the bundle's `rootfs`, then the runtime
    /// starts the bundle's `config.json` detached (the container's stdio is this process's) and
    /// exits; the container's process is left to the monitor (`monitor --adopt`).
    Container {
        /// The OCI bundle (`config.json`, and `rootfs`, `upper`, `work` directories).
        #[arg(long)]
        bundle: std::path::PathBuf,
        /// A layer directory, the top one first (repeatable; none for an empty image).
        #[arg(long = "layer")]
        layers: Vec<std::path::PathBuf>,
        /// The OCI runtime (crun, runc).
        #[arg(long, default_value = "crun")]
        runtime: std::path::PathBuf,
        /// The runtime's state directory (`--root`).
        #[arg(long)]
        root: std::path::PathBuf,
        /// The container's ID for the runtime.
        #[arg(long)]
        id: String,
    },
    Echo(EchoArgs),
}

// `monitor`'s and `echo`'s arguments have parsers of their own (see `main`); their doc is
// also their line in the whole command's help.

/// Run a container's process, writing its output to a CRI-format log (conmon's role).
#[derive(Parser, Debug)]
#[command(name = "podpath-workload monitor")]
struct MonitorArgs {
    /// Enter this sandbox's namespaces first, so the monitor's namespaces are the pod's
    /// (what a container's PID leads to, as for any runtime).
    #[arg(long)]
    sandbox: Option<i32>,
    /// The container's log (appended).
    #[arg(long)]
    log: Option<std::path::PathBuf>,
    /// Hold the container's stdin/terminal for `kubectl attach` through this socket.
    #[arg(long)]
    console: Option<std::path::PathBuf>,
    /// With --console: the container reads stdin.
    #[arg(long, requires = "console")]
    stdin: bool,
    /// With --console: give the container a terminal.
    #[arg(long, requires = "console")]
    tty: bool,
    /// With --console: close the container's stdin when the first attached client closes its own.
    #[arg(long, requires = "console")]
    stdin_once: bool,
    /// The signal that stops the container (the image's `StopSignal`: `SIGQUIT`, `QUIT`,
    /// `3`): a SIGTERM to the monitor reaches the container as this one.
    #[arg(long, value_parser = parse_signal)]
    stop_signal: Option<nix::sys::signal::Signal>,
    /// The command is an OCI runtime that starts the container and exits (`container`):
    /// the container's process, named by this PID file, is then adopted (the monitor is
    /// a child subreaper) and waited for, as conmon does. The runtime stays no process.
    #[arg(long)]
    adopt: Option<std::path::PathBuf>,
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Enter a sandbox's namespaces and run the built-in podpath/echo server.
#[derive(Parser, Debug)]
#[command(name = "podpath-workload echo")]
struct EchoArgs {
    #[arg(long)]
    sandbox: i32,
    /// A container port (repeatable); default 8080.
    #[arg(long = "port")]
    ports: Vec<u16>,
    /// A UDP container port (repeatable).
    #[arg(long = "udp-port")]
    udp_ports: Vec<u16>,
    /// The container's args, interpreted by podpath/echo.
    #[arg(last = true)]
    args: Vec<String>,
}

/// A signal by name (`SIGQUIT`, `QUIT`, any case) or number, as an image's `StopSignal` gives it.
pub fn parse_signal(s: &str) -> Result<nix::sys::signal::Signal, String> {
    use std::str::FromStr;
    let bad = || format!("{s:?} is not a signal");
    if let Ok(n) = s.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n).map_err(|_| bad());
    }
    let up = s.to_ascii_uppercase();
    let name = if up.starts_with("SIG") { up } else { format!("SIG{up}") };
    nix::sys::signal::Signal::from_str(&name).map_err(|_| bad())
}

/// Parses the command line and runs the mode it names; exits the process.
pub fn main() {
    // The sandbox's holding mode is looked for before any parsing: it is what every pod keeps
    // running, so it starts nothing (no heap worth the name, a fresh small stack).
    if std::env::args_os().nth(1).is_some_and(|a| a == HOLD) && std::env::args_os().len() == 2 {
        hold();
    }
    // What every pod runs besides (a monitor, and its echo server) is parsed with a parser of
    // its mode alone: the whole command's parser dirtied 14–22 KiB more of the stack and 11 KiB
    // more of the heap, which a long-lived process keeps (per process, `smaps`).
    let mut argv = std::env::args_os();
    let mode = match argv.nth(1) {
        Some(m) if m == "monitor" => {
            Some(Mode::Monitor(MonitorArgs::parse_from(once("podpath-workload monitor", argv))))
        }
        Some(m) if m == "echo" => Some(Mode::Echo(EchoArgs::parse_from(once("podpath-workload echo", argv)))),
        _ => None,
    };
    let args = mode.map(|mode| Args { mode }).unwrap_or_else(Args::parse);
    fn once(name: &str, rest: std::env::ArgsOs) -> impl Iterator<Item = std::ffi::OsString> {
        std::iter::once(name.into()).chain(rest)
    }
    if let Err(e) = run(args) {
        eprintln!("podpath-workload: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    use crate::stream::console::DIE_WITH_PARENT;
    if let Ok(parent) = std::env::var(DIE_WITH_PARENT) {
        // Started by a monitor: die with it (and never pass the variable on).
        std::env::remove_var(DIE_WITH_PARENT);
        nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
            .map_err(|e| format!("cannot tie this process to its monitor: {e}"))?;
        if nix::unistd::getppid().as_raw().to_string() != parent {
            return Err("the monitor that started this process is gone".into());
        }
    }
    // Errors here only mean we already lead a session (e.g. started by setsid).
    let _ = nix::unistd::setsid();
    match args.mode {
        Mode::Sandbox { hostname, resolv_conf, hosts, share_pid } => {
            sandbox(&hostname, resolv_conf.zip(hosts), share_pid)
        }
        Mode::Pause { sandbox } => pause(sandbox),
        Mode::Hold => hold(),
        Mode::Monitor(MonitorArgs { sandbox, log, console, stdin, tty, stdin_once, stop_signal, adopt, command }) => {
            if let Some(pid) = sandbox {
                join(pid)?;
            }
            let opts = crate::stream::console::ConsoleOptions {
                log,
                socket: console,
                stdin,
                tty,
                stdin_once,
                stop_signal,
                adopt,
                argv: command,
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            let code = rt.block_on(crate::stream::console::run(opts))?;
            std::process::exit(code);
        }
        Mode::Join { sandbox: None, pid_file: Some(pid_file), tty, command } => {
            join_container(&pid_file, tty, &command)
        }
        Mode::Join { sandbox, pid_file: _, tty, command } => {
            join(sandbox.ok_or("--sandbox or --pid-file is required")?)?;
            if tty {
                rustix::process::ioctl_tiocsctty(std::io::stdin())
                    .map_err(|e| format!("cannot make the terminal the controlling one: {e}"))?;
            }
            let argv: Vec<CString> = command
                .iter()
                .map(|a| CString::new(a.as_str()).map_err(|_| format!("argument {a:?} contains a NUL byte")))
                .collect::<Result<_, _>>()?;
            let err = nix::unistd::execvp(&argv[0], &argv).unwrap_err();
            Err(format!("cannot run {:?}: {err}", command[0]))
        }
        Mode::Container { bundle, layers, runtime, root, id } => container(&bundle, &layers, &runtime, &root, &id),
        Mode::Echo(EchoArgs { sandbox, ports, udp_ports, args }) => {
            join(sandbox)?;
            let options = echo::EchoOptions { udp_ports, ..echo::parse_options(&ports, &args)? };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
            rt.block_on(echo::serve(echo::Identity::from_env(), options)).map_err(|e| e.to_string())
        }
    }
}

fn sandbox(
    hostname: &str,
    files: Option<(std::path::PathBuf, std::path::PathBuf)>,
    share_pid: bool,
) -> Result<(), String> {
    // IPC too: the pod's containers share it (they join it by path), apart from the node's.
    let mut flags = CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWUTS | CloneFlags::CLONE_NEWIPC;
    if files.is_some() {
        flags |= CloneFlags::CLONE_NEWNS;
    }
    nix::sched::unshare(flags).map_err(|e| format!("cannot create the pod's namespaces: {e}"))?;
    if let Some((resolv_conf, hosts)) = files {
        use nix::mount::{mount, MsFlags};
        // Private first, so nothing mounted here reaches the node's own mount namespace. Where
        // the root is no mount point (the node is a chroot), it cannot be made private: then
        // nothing is mounted and the pod sees the node's files, as the warning says.
        match mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>) {
            Ok(()) => {
                for (file, over) in [(resolv_conf, "/etc/resolv.conf"), (hosts, "/etc/hosts")] {
                    mount(Some(&file), over, None::<&str>, MsFlags::MS_BIND, None::<&str>)
                        .map_err(|e| format!("cannot mount {} over {over}: {e}", file.display()))?;
                }
            }
            Err(e) => eprintln!(
                "podpath-workload: the pod keeps the node's /etc/resolv.conf and /etc/hosts: cannot make \
                 its mounts private ({e}; is / a mount point here?)"
            ),
        }
    }
    nix::unistd::sethostname(hostname).map_err(|e| format!("cannot set hostname {hostname:?}: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(loopback_up())?;
    drop(rt);
    if share_pid {
        // The namespace is for our children: the first one is its PID 1 and holds it open.
        nix::sched::unshare(CloneFlags::CLONE_NEWPID)
            .map_err(|e| format!("cannot create the pod's PID namespace: {e}"))?;
        use std::os::unix::process::CommandExt;
        std::process::Command::new("/proc/self/exe")
            .arg0("podpath-workload")
            .args(["pause", &std::process::id().to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the pod's PID 1: {e}"))?;
    }
    let mut out = std::io::stdout();
    writeln!(out, "ready").and_then(|_| out.flush()).map_err(|e| format!("cannot report readiness: {e}"))?;
    // Hold the namespaces as a fresh image of this program: the set-up's heap, stack and
    // runtime go (about 200 KiB of each pod's memory); the namespaces stay, exec keeps them.
    let argv = [c"podpath-workload", c"hold"];
    let err = nix::unistd::execv(c"/proc/self/exe", &argv).unwrap_err();
    eprintln!("podpath-workload: cannot re-execute itself to hold the namespaces ({err}); holding them as is");
    hold()
}

/// PID 1 of a shared PID namespace: dies with the sandbox, reaps every child it inherits.
fn pause(sandbox: i32) -> Result<(), String> {
    use nix::sys::signal::{SigSet, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(|e| format!("cannot tie PID 1 to its sandbox: {e}"))?;
    // Our parent is outside the namespace (getppid says 0): the node's /proc still names it.
    if !std::path::Path::new(&format!("/proc/{sandbox}")).exists() {
        return Err(format!("sandbox {sandbox} is gone"));
    }
    // SIGCHLD is waited for, not handled: PID 1 gets no signal it has no handler for, and
    // the terminating ones from the node are SIGKILL (the kubelet's) anyway.
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    chld.thread_block().map_err(|e| format!("cannot block SIGCHLD: {e}"))?;
    loop {
        while let Ok(s) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if s == WaitStatus::StillAlive {
                break;
            }
        }
        let _ = chld.wait();
    }
}

/// The sandbox's last mode (`podpath-workload hold`, which it execs): only holds the process's
/// namespaces; SIGTERM/SIGKILL end it (default dispositions).
const HOLD: &str = "hold";

fn hold() -> ! {
    loop {
        nix::unistd::pause();
    }
}

async fn loopback_up() -> Result<(), String> {
    let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| format!("cannot open netlink: {e}"))?;
    tokio::spawn(conn);
    let mut links = handle.link().get().match_name("lo").execute();
    if let Some(lo) = links.try_next().await.map_err(|e| format!("cannot find lo: {e}"))? {
        handle
            .link()
            .set(rtnetlink::LinkUnspec::new_with_index(lo.header.index).up().build())
            .execute()
            .await
            .map_err(|e| format!("cannot set lo up: {e}"))?;
    }
    Ok(())
}

/// Moves this (still single-threaded) process into the sandbox's network, UTS and mount
/// namespaces (the last holds the pod's resolv.conf and hosts).
fn join(sandbox: i32) -> Result<(), String> {
    // Entering a mount namespace moves the root to the namespace's own; the sandbox's root
    // (which differs when the node itself is a chroot) is taken back after, as nsenter --root.
    let root_path = format!("/proc/{sandbox}/root");
    let root = File::open(&root_path).map_err(|e| format!("sandbox {sandbox} is gone ({root_path}: {e})"))?;
    for (ns, flag) in
        [("net", CloneFlags::CLONE_NEWNET), ("uts", CloneFlags::CLONE_NEWUTS), ("mnt", CloneFlags::CLONE_NEWNS)]
    {
        let path = format!("/proc/{sandbox}/ns/{ns}");
        let f = File::open(&path).map_err(|e| format!("sandbox {sandbox} is gone ({path}: {e})"))?;
        nix::sched::setns(&f, flag).map_err(|e| format!("cannot enter {path}: {e}"))?;
    }
    nix::unistd::fchdir(&root)
        .and_then(|_| nix::unistd::chroot("."))
        .and_then(|_| nix::unistd::chdir("/"))
        .map_err(|e| format!("cannot take the sandbox's root ({root_path}): {e}"))?;
    Ok(())
}

/// Mounts the container's root file system (in a mount namespace of this process, so nothing
/// is left mounted on the node when the container ends) and execs the OCI runtime on the bundle.
fn container(
    bundle: &std::path::Path,
    layers: &[std::path::PathBuf],
    runtime: &std::path::Path,
    root: &std::path::Path,
    id: &str,
) -> Result<(), String> {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("cannot create a mount namespace: {e}"))?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .map_err(|e| format!("cannot make the mounts private: {e}"))?;
    // crun reads the cgroup layout off /sys/fs/cgroup even with cgroups disabled, and refuses
    // two layouts it meets here: no cgroup file system at all (`ip netns exec`, which starts
    // the node agents, mounts a fresh /sys), and cgroup v1 beside a v2 hierarchy that has
    // controllers ("hybrid"). This namespace's view is made plain; the node's is untouched
    // (our mounts are private).
    use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, TMPFS_MAGIC};
    match statfs("/sys/fs/cgroup").map(|s| s.filesystem_type()) {
        Ok(t) if t == CGROUP2_SUPER_MAGIC => {}
        Ok(t) if t == TMPFS_MAGIC => {
            if std::path::Path::new("/sys/fs/cgroup/unified/cgroup.controllers").exists() {
                let _ = umount2("/sys/fs/cgroup/unified", MntFlags::MNT_DETACH);
            }
        }
        _ => {
            mount(
                Some("tmpfs"),
                "/sys/fs/cgroup",
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=755"),
            )
            .map_err(|e| format!("cannot mount a tmpfs on /sys/fs/cgroup for the runtime: {e}"))?;
        }
    }
    let dir = |name: &str| {
        let p = bundle.join(name);
        std::fs::create_dir_all(&p)
            .map(|_| p)
            .map_err(|e| format!("cannot create {}: {e}", bundle.join(name).display()))
    };
    let (rootfs, upper, work) = (dir("rootfs")?, dir("upper")?, dir("work")?);
    let lower = if layers.is_empty() {
        vec![dir("empty")?.display().to_string()]
    } else {
        layers.iter().map(|l| l.display().to_string()).collect()
    };
    let options = format!("lowerdir={},upperdir={},workdir={}", lower.join(":"), upper.display(), work.display());
    mount(Some("overlay"), &rootfs, Some("overlay"), MsFlags::empty(), Some(options.as_str()))
        .map_err(|e| format!("cannot mount the image's layers on {}: {e}", rootfs.display()))?;
    let argv: Vec<CString> = [
        runtime.display().to_string(),
        "--cgroup-manager=disabled".into(),
        "--root".into(),
        root.display().to_string(),
        "run".into(),
        "--detach".into(),
        "--bundle".into(),
        bundle.display().to_string(),
        "--pid-file".into(),
        bundle.join("pid").display().to_string(),
        id.to_string(),
    ]
    .into_iter()
    .map(|a| CString::new(a).map_err(|_| "a path contains a NUL byte".to_string()))
    .collect::<Result<_, _>>()?;
    let err = nix::unistd::execvp(&argv[0], &argv).unwrap_err();
    Err(format!("cannot run the OCI runtime {}: {err}", runtime.display()))
}

/// Runs a command inside a running container (`kubectl exec`, exec probes): its namespaces,
/// root, environment, working directory and user, as `crun exec` would; exits with its status.
fn join_container(pid_file: &std::path::Path, tty: bool, command: &[String]) -> Result<(), String> {
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let text = std::fs::read_to_string(pid_file)
        .map_err(|e| format!("the container is not running ({}: {e})", pid_file.display()))?;
    let pid: i32 = text.trim().parse().map_err(|_| format!("{} holds no PID", pid_file.display()))?;
    // The container's environment, working directory and user are its runtime spec's (next to
    // the PID file), as `crun exec` takes them: the process's own may have been rewritten (nginx
    // writes its title over its environment).
    let spec: serde_json::Value = pid_file
        .parent()
        .and_then(|b| std::fs::read(b.join("config.json")).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| format!("the container's runtime spec is missing next to {}", pid_file.display()))?;
    let process = &spec["process"];
    let env: Vec<(String, String)> = process["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|kv| kv.as_str()?.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect();
    let cwd = std::path::PathBuf::from(process["cwd"].as_str().unwrap_or("/"));
    let uid = process["user"]["uid"].as_u64().unwrap_or(0) as u32;
    let gid = process["user"]["gid"].as_u64().unwrap_or(0) as u32;
    let root = File::open(format!("/proc/{pid}/root")).map_err(|e| format!("the container is not running: {e}"))?;
    for (ns, flag) in [
        ("ipc", CloneFlags::CLONE_NEWIPC),
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("net", CloneFlags::CLONE_NEWNET),
        ("pid", CloneFlags::CLONE_NEWPID),
        ("mnt", CloneFlags::CLONE_NEWNS),
    ] {
        let path = format!("/proc/{pid}/ns/{ns}");
        let f = File::open(&path).map_err(|e| format!("the container is not running ({path}: {e})"))?;
        nix::sched::setns(&f, flag).map_err(|e| format!("cannot enter {path}: {e}"))?;
    }
    nix::unistd::fchdir(&root)
        .and_then(|_| nix::unistd::chroot("."))
        .map_err(|e| format!("cannot take the container's root: {e}"))?;
    if tty {
        rustix::process::ioctl_tiocsctty(std::io::stdin())
            .map_err(|e| format!("cannot make the terminal the controlling one: {e}"))?;
    }
    // A new PID namespace holds this process's children, not itself: the command is a child.
    let mut cmd = std::process::Command::new(&command[0]);
    cmd.args(&command[1..]).env_clear().envs(env).uid(uid).gid(gid);
    if let Some(term) = std::env::var_os("TERM") {
        cmd.env("TERM", term);
    }
    if std::path::Path::new(&cwd).is_dir() {
        cmd.current_dir(&cwd);
    } else {
        cmd.current_dir("/");
    }
    match cmd.status() {
        Ok(s) => std::process::exit(s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(9))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "OCI runtime exec failed: exec failed: unable to start container process: exec: {:?}: executable file not found in $PATH: unknown",
                command[0]
            );
            std::process::exit(127)
        }
        Err(e) => {
            eprintln!("OCI runtime exec failed: unable to start container process: {:?}: {e}", command[0]);
            std::process::exit(126)
        }
    }
}
