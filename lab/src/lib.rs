//! The all-in-one lab: `up` builds the topology ([`plan`]), starts `apiserver-lite` and one
//! `node-agent` per node, each in its namespace, and records what it started in
//! `<state-dir>/lab.json`; `down` undoes exactly that, also when the processes already died.

pub mod plan;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use plan::Plan;

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{0}")]
    Usage(String),
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{0}")]
    NotReady(String),
}

pub type Result<T> = std::result::Result<T, LabError>;

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let what = what.into();
    move |source| LabError::Io { what, source }
}

/// What `up` is asked for.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub name: String,
    pub nodes: usize,
    pub proxy_mode: String,
    pub state_dir: PathBuf,
    /// Where `apiserver-lite`, `node-agent`, `podpath-workload` and the CNI plugins are.
    pub bin_dir: PathBuf,
    /// Host port for kubectl (0: any free one).
    pub api_port: u16,
}

/// A process the lab started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Proc {
    pub component: String,
    pub pid: i32,
    /// `/proc/<pid>/stat` start time: a PID reused by another process is never signalled.
    pub start_time: u64,
}

/// `<state-dir>/lab.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LabState {
    pub name: String,
    pub nodes: usize,
    pub proxy_mode: String,
    pub api: String,
    pub namespaces: Vec<String>,
    pub procs: Vec<Proc>,
}

/// Default state directory of a lab.
pub fn default_state_dir(name: &str) -> PathBuf {
    PathBuf::from("/var/lib/podpath").join(name)
}

fn run(argv: &[String]) -> Result<String> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(io(format!("cannot run {}", argv[0])))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command { cmd: argv.join(" "), stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Checks that we can build a lab here: root, and the tools we drive.
pub fn preflight() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(LabError::Usage("podpath needs root to create network namespaces (run it with sudo)".into()));
    }
    for tool in ["ip", "iptables", "nsenter"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Err(LabError::Usage(format!(
                "`{tool}` is not installed (apt-get install iproute2 iptables util-linux)"
            )));
        }
    }
    Ok(())
}

fn state_file(dir: &Path) -> PathBuf {
    dir.join("lab.json")
}

pub fn load_state(dir: &Path) -> Result<Option<LabState>> {
    match std::fs::read(state_file(dir)) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| LabError::Usage(format!("{} is not a lab state file: {e}", state_file(dir).display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(format!("read {}", state_file(dir).display()))(e)),
    }
}

fn save_state(dir: &Path, st: &LabState) -> Result<()> {
    let tmp = dir.join("lab.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(st).expect("serializable")).map_err(io("write the lab state"))?;
    std::fs::rename(&tmp, state_file(dir)).map_err(io("write the lab state"))
}

fn spawn(component: &str, argv: &[String], log: &Path, env: &[(&str, &Path)]) -> Result<Proc> {
    use std::os::unix::process::CommandExt;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(io(format!("open {}", log.display())))?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(io("log file"))?)
        .stderr(file)
        // Its own process group: Ctrl-C on `podpath up` does not reach the lab.
        .process_group(0);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().map_err(io(format!("start {component}")))?;
    let pid = child.id() as i32;
    let start_time = node_agent::process::start_time(pid).unwrap_or(0);
    Ok(Proc { component: component.into(), pid, start_time })
}

/// Running, and the same process (a zombie whose parent is gone counts as dead).
fn alive(p: &Proc) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with('Z')))
        .unwrap_or(true);
    !zombie && node_agent::process::start_time(p.pid) == Some(p.start_time)
}

/// One HTTP/1.0 GET (no chunking): status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let status = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Ok((status, body))
}

fn ready_nodes(api: SocketAddr) -> Vec<String> {
    let Ok((200, body)) = http_get(api, "/api/v1/nodes") else { return vec![] };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&body) else { return vec![] };
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| {
            n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
        .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("pick a free port"))?;
    Ok(l.local_addr().map_err(io("pick a free port"))?.port())
}

pub fn kubeconfig_path(state_dir: &Path) -> PathBuf {
    state_dir.join("kubeconfig")
}

/// Builds the lab; on any failure removes what it made. `progress` gets one line per step.
pub fn up(opts: &UpOptions, progress: &mut dyn FnMut(&str)) -> Result<LabState> {
    plan::check_name(&opts.name).map_err(LabError::Usage)?;
    if opts.nodes == 0 || opts.nodes > plan::MAX_NODES {
        return Err(LabError::Usage(format!("--nodes {}: use 1 to {}", opts.nodes, plan::MAX_NODES)));
    }
    if !matches!(opts.proxy_mode.as_str(), "iptables" | "userspace") {
        return Err(LabError::Usage(format!("--proxy-mode {:?}: expected iptables or userspace", opts.proxy_mode)));
    }
    for bin in ["apiserver-lite", "node-agent", "podpath-workload", "podpath-bridge", "podpath-ipam"] {
        if !opts.bin_dir.join(bin).is_file() {
            return Err(LabError::Usage(format!(
                "{bin} is not in {} (build with `cargo build --release`)",
                opts.bin_dir.display()
            )));
        }
    }
    if let Some(st) = load_state(&opts.state_dir)? {
        let running = st.procs.iter().any(alive);
        return Err(LabError::Usage(format!(
            "a lab named {:?} already exists{} (state in {}); run `podpath down --name {}` first",
            st.name,
            if running { " and is running" } else { "" },
            opts.state_dir.display(),
            st.name
        )));
    }
    let p = Plan::new(&opts.name, opts.nodes);
    let taken: Vec<String> = run(&["ip".into(), "netns".into(), "list".into()])?
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|n| p.hosts.iter().any(|h| &h.netns == n))
        .collect();
    if !taken.is_empty() {
        return Err(LabError::Usage(format!(
            "namespaces of a lab named {:?} exist without its state ({}); run `podpath down --name {}`",
            opts.name,
            taken.join(", "),
            opts.name
        )));
    }
    std::fs::create_dir_all(opts.state_dir.join("logs")).map_err(io(format!("create {}", opts.state_dir.display())))?;
    let api_port = if opts.api_port == 0 { free_port()? } else { opts.api_port };
    let api: SocketAddr = ([127, 0, 0, 1], api_port).into();
    let mut st = LabState {
        name: opts.name.clone(),
        nodes: opts.nodes,
        proxy_mode: opts.proxy_mode.clone(),
        api: api.to_string(),
        namespaces: p.hosts.iter().map(|h| h.netns.clone()).collect(),
        procs: vec![],
    };
    save_state(&opts.state_dir, &st)?;
    match start(opts, &p, &mut st, api, progress) {
        Ok(()) => Ok(st),
        Err(e) => {
            progress("failed; removing what was made");
            let _ = down(&opts.state_dir, false);
            Err(e)
        }
    }
}

fn start(opts: &UpOptions, p: &Plan, st: &mut LabState, api: SocketAddr, progress: &mut dyn FnMut(&str)) -> Result<()> {
    let t0 = Instant::now();
    progress(&format!(
        "network: {} namespaces (client, gateway, control plane, {} nodes)",
        p.hosts.len(),
        p.nodes.len()
    ));
    for argv in p.commands() {
        run(&argv)?;
    }
    let bin = |b: &str| opts.bin_dir.join(b).display().to_string();
    let s = |x: &str| x.to_string();
    let logs = opts.state_dir.join("logs");
    let cp = p.netns_of("control-plane").expect("planned");
    progress(&format!("apiserver-lite: kubectl on {api}, node agents on {}:{}", plan::CONTROL_PLANE, plan::GRPC_PORT));
    let apiserver = vec![
        bin("apiserver-lite"),
        s("--data-dir"),
        opts.state_dir.join("apiserver").display().to_string(),
        s("--listen"),
        api.to_string(),
        s("--netns"),
        format!("/run/netns/{cp}"),
        s("--netns-listen"),
        format!("{}:{}", plan::CONTROL_PLANE, plan::API_PORT),
        s("--grpc-listen"),
        format!("{}:{}", plan::CONTROL_PLANE, plan::GRPC_PORT),
        s("--node-monitor-grace-period"),
        s("10s"),
    ];
    st.procs.push(spawn("apiserver-lite", &apiserver, &logs.join("apiserver-lite.log"), &[])?);
    save_state(&opts.state_dir, st)?;
    wait_until(Duration::from_secs(10), "apiserver-lite to answer", || {
        matches!(http_get(api, "/readyz"), Ok((200, _)))
    })
    .map_err(|e| with_log(e, &logs.join("apiserver-lite.log")))?;

    let workload = opts.bin_dir.join("podpath-workload");
    for n in &p.nodes {
        progress(&format!("{}: node-agent at {} ({} proxy)", n.name, n.ip, opts.proxy_mode));
        let dir = opts.state_dir.join("nodes").join(&n.name);
        std::fs::create_dir_all(dir.join("cni")).map_err(io(format!("create {}", dir.display())))?;
        let argv = vec![
            s("ip"),
            s("netns"),
            s("exec"),
            n.netns.clone(),
            bin("node-agent"),
            s("--node-name"),
            n.name.clone(),
            s("--node-ip"),
            n.ip.to_string(),
            s("--apiserver"),
            format!("{}:{}", plan::CONTROL_PLANE, plan::GRPC_PORT),
            s("--state-dir"),
            dir.join("agent").display().to_string(),
            s("--cni-conf-dir"),
            dir.join("cni").display().to_string(),
            s("--cni-bin-dir"),
            format!("{}:/opt/cni/bin:/usr/lib/cni", opts.bin_dir.display()),
            s("--healthz-bind-address"),
            format!("{}:10256", n.ip),
            s("--heartbeat-seconds"),
            s("2"),
            s("--restart-backoff-seconds"),
            s("1"),
            s("--proxy-mode"),
            opts.proxy_mode.clone(),
        ];
        st.procs.push(spawn(
            &n.name,
            &argv,
            &logs.join(format!("{}.log", n.name)),
            &[("PODPATH_WORKLOAD", &workload)],
        )?);
        save_state(&opts.state_dir, st)?;
    }
    let want: Vec<String> = p.nodes.iter().map(|n| n.name.clone()).collect();
    wait_until(Duration::from_secs(30), "every node to be Ready", || {
        let ready = ready_nodes(api);
        want.iter().all(|n| ready.contains(n))
    })
    .map_err(|e| {
        let dead: Vec<&str> = st.procs.iter().filter(|p| !alive(p)).map(|p| p.component.as_str()).collect();
        if dead.is_empty() {
            e
        } else {
            LabError::NotReady(format!("{e}; not running: {} (see `podpath logs`)", dead.join(", ")))
        }
    })?;
    std::fs::write(kubeconfig_path(&opts.state_dir), kubeconfig(&opts.name, api))
        .map_err(io("write the kubeconfig"))?;
    progress(&format!("ready: {} nodes in {:.1} s", p.nodes.len(), t0.elapsed().as_secs_f64()));
    Ok(())
}

fn with_log(e: LabError, log: &Path) -> LabError {
    let tail: String = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" | ");
    LabError::NotReady(format!("{e}; {}: {tail}", log.display()))
}

fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Result<()> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(LabError::NotReady(format!("timed out after {} s waiting for {what}", limit.as_secs())))
}

pub fn kubeconfig(name: &str, api: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: podpath-{name}\n  cluster:\n    server: http://{api}\n\
         users:\n- name: podpath-{name}\n  user: {{}}\ncontexts:\n- name: podpath-{name}\n  context:\n    \
         cluster: podpath-{name}\n    user: podpath-{name}\n    namespace: default\ncurrent-context: podpath-{name}\n"
    )
}

/// Stops every process of the lab (by PID, checking its start time), the pods' processes the
/// agents recorded, removes the lab's namespaces, and (unless `keep_data`) its state.
pub fn down(state_dir: &Path, keep_data: bool) -> Result<LabState> {
    let st = load_state(state_dir)?
        .ok_or_else(|| LabError::Usage(format!("no lab state in {} (nothing to take down)", state_dir.display())))?;
    // Agents first (they would restart pods), then the API server.
    for p in st.procs.iter().rev() {
        stop(p);
    }
    for n in 1..=st.nodes {
        let dir = state_dir.join("nodes").join(format!("node-{n}")).join("agent");
        node_agent::pods::kill_recorded_processes(&dir);
    }
    let existing = run(&["ip".into(), "netns".into(), "list".into()]).unwrap_or_default();
    for ns in &st.namespaces {
        if existing.lines().any(|l| l.split_whitespace().next() == Some(ns.as_str())) {
            run(&["ip".into(), "netns".into(), "del".into(), ns.clone()])?;
        }
    }
    if !keep_data {
        std::fs::remove_dir_all(state_dir).map_err(io(format!("remove {}", state_dir.display())))?;
    } else {
        let _ = std::fs::remove_file(state_file(state_dir));
    }
    Ok(st)
}

fn stop(p: &Proc) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if !alive(p) {
        return;
    }
    let _ = kill(Pid::from_raw(p.pid), Signal::SIGTERM);
    let t = Instant::now();
    while alive(p) && t.elapsed() < Duration::from_secs(5) {
        // Reap it if it is our child (it is not, after `up` exited; then /proc tells).
        let _ = nix::sys::wait::waitpid(Pid::from_raw(p.pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        std::thread::sleep(Duration::from_millis(20));
    }
    if alive(p) {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
}

/// The argv that runs `cmd` on a host of the lab: `client`, `gateway`, `control-plane`,
/// `node-N`, or `pod/NS/NAME` (its namespaces entered through its workload's PID).
pub fn exec_argv(st: &LabState, host: &str, cmd: &[String]) -> Result<Vec<String>> {
    let mut argv: Vec<String>;
    if let Some(rest) = host.strip_prefix("pod/") {
        let (ns, name) =
            rest.split_once('/').ok_or_else(|| LabError::Usage(format!("{host:?}: use pod/NAMESPACE/NAME")))?;
        let api: SocketAddr = st.api.parse().map_err(|_| LabError::Usage("bad API address in the state".into()))?;
        let (code, body) =
            http_get(api, &format!("/api/v1/namespaces/{ns}/pods/{name}")).map_err(io("ask the API server"))?;
        if code != 200 {
            return Err(LabError::Usage(format!("pod {ns}/{name} not found")));
        }
        let pod: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let pid = pod["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .and_then(|c| c.strip_prefix("podpath://"))
            .ok_or_else(|| LabError::Usage(format!("pod {ns}/{name} has no running container yet")))?
            .to_string();
        argv = ["nsenter", "-t", &pid, "-n", "-u", "--"].iter().map(|s| s.to_string()).collect();
    } else {
        let p = Plan::new(&st.name, st.nodes);
        let ns = p.netns_of(host).ok_or_else(|| {
            LabError::Usage(format!(
                "no host {host:?} in lab {:?}: client, gateway, control-plane, node-1…node-{}, pod/NS/NAME",
                st.name, st.nodes
            ))
        })?;
        argv = ["ip", "netns", "exec", ns].iter().map(|s| s.to_string()).collect();
    }
    argv.extend(cmd.iter().cloned());
    Ok(argv)
}

/// Per component: running or not.
pub fn status(st: &LabState) -> Vec<(String, i32, bool)> {
    st.procs.iter().map(|p| (p.component.clone(), p.pid, alive(p))).collect()
}

/// Ready nodes according to the API server.
pub fn nodes_ready(st: &LabState) -> Vec<String> {
    st.api.parse().map(ready_nodes).unwrap_or_default()
}
