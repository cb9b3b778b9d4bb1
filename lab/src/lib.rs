//! The all-in-one lab: `up` builds the topology ([`plan`]), starts `apiserver-lite` and one
//! `node-agent` per node, each in its namespace, and records what it started in
//! `<state-dir>/lab.json`; `down` undoes exactly that, also when the processes already died.

pub mod explain;
pub mod plan;
pub mod rules;
pub mod trace;

use std::collections::BTreeMap;
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
    /// How lb-sim delivers LoadBalancer IPs: `passthrough` or `nodeport`.
    pub lb_mode: String,
    /// `false` leaves out the nodes' masquerade of external traffic (the scenario-4 lesson).
    pub masquerade: bool,
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
    #[serde(default = "default_lb_mode")]
    pub lb_mode: String,
    pub api: String,
    pub namespaces: Vec<String>,
    pub procs: Vec<Proc>,
    /// Where the lab's binaries are (`down` asks `node-agent` to stop the pods it recorded);
    /// absent in the state of labs made before it was recorded: this program's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bin_dir: Option<PathBuf>,
}

fn default_lb_mode() -> String {
    "passthrough".into()
}

/// Where lb-sim serves its status, inside the gateway's namespace.
pub const LB_STATUS: &str = "127.0.0.1:9900";

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
    let start_time = podpath_client::daemon::start_time(pid).unwrap_or(0);
    Ok(Proc { component: component.into(), pid, start_time })
}

/// Running, and the same process (a zombie whose parent is gone counts as dead).
fn alive(p: &Proc) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with('Z')))
        .unwrap_or(true);
    !zombie && podpath_client::daemon::start_time(p.pid) == Some(p.start_time)
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
    if !matches!(opts.lb_mode.as_str(), "passthrough" | "nodeport") {
        return Err(LabError::Usage(format!("--lb-mode {:?}: expected passthrough or nodeport", opts.lb_mode)));
    }
    for bin in ["apiserver-lite", "node-agent", "lb-sim", "podpath-workload", "podpath-bridge", "podpath-ipam"] {
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
        lb_mode: opts.lb_mode.clone(),
        api: api.to_string(),
        namespaces: p.hosts.iter().map(|h| h.netns.clone()).collect(),
        procs: vec![],
        bin_dir: Some(opts.bin_dir.clone()),
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
            format!("--masquerade={}", opts.masquerade),
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
    let gw = p.netns_of("gateway").expect("planned");
    progress(&format!("gateway: lb-sim ({} load balancers, health checks on :10256)", opts.lb_mode));
    let lb = vec![
        s("ip"),
        s("netns"),
        s("exec"),
        gw.to_string(),
        bin("lb-sim"),
        s("--apiserver"),
        format!("{}:{}", plan::CONTROL_PLANE, plan::GRPC_PORT),
        s("--mode"),
        opts.lb_mode.clone(),
        s("--status-listen"),
        s(LB_STATUS),
    ];
    st.procs.push(spawn("lb-sim", &lb, &logs.join("lb-sim.log"), &[])?);
    save_state(&opts.state_dir, st)?;
    let nodes = p.nodes.len();
    wait_until(Duration::from_secs(10), "lb-sim to see every node", || {
        lb_status_in(gw).is_ok_and(|s| s["nodes"].as_array().is_some_and(|n| n.len() == nodes))
    })
    .map_err(|e| with_log(e, &logs.join("lb-sim.log")))?;
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
    // Pods outlive their agent on purpose: the agent's binary stops what it recorded.
    let bin_dir = match &st.bin_dir {
        Some(d) => d.clone(),
        None => {
            std::env::current_exe().map_err(io("find this program"))?.parent().map(PathBuf::from).unwrap_or_default()
        }
    };
    let mut failed = None;
    for n in 1..=st.nodes {
        let dir = state_dir.join("nodes").join(format!("node-{n}")).join("agent");
        if let Err(e) = kill_pods(&bin_dir, &dir) {
            failed.get_or_insert(e);
        }
    }
    let existing = run(&["ip".into(), "netns".into(), "list".into()]).unwrap_or_default();
    for ns in &st.namespaces {
        if existing.lines().any(|l| l.split_whitespace().next() == Some(ns.as_str())) {
            run(&["ip".into(), "netns".into(), "del".into(), ns.clone()])?;
        }
    }
    if let Some(e) = failed {
        // The state stays, so a second `down` can finish the job.
        return Err(e);
    }
    if !keep_data {
        std::fs::remove_dir_all(state_dir).map_err(io(format!("remove {}", state_dir.display())))?;
    } else {
        let _ = std::fs::remove_file(state_file(state_dir));
    }
    Ok(st)
}

/// `node-agent --kill-pods` on one agent's state directory: SIGKILLs the pod processes it
/// recorded (each checked against its start time) and waits until they are gone.
pub fn kill_pods(bin_dir: &Path, agent_state_dir: &Path) -> Result<()> {
    if !agent_state_dir.exists() {
        return Ok(());
    }
    let agent = bin_dir.join("node-agent").display().to_string();
    run(&[agent, "--kill-pods".into(), "--state-dir".into(), agent_state_dir.display().to_string()]).map(|_| ())
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
        let pid = pod_pid(api_addr(st)?, ns, name)?;
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

/// One HTTP GET from inside a network namespace of the lab (a helper thread enters it; the
/// socket stays there).
pub fn http_get_in(netns: &str, addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let (ns, path) = (netns.to_string(), path.to_string());
    in_netns_thread(format!("/run/netns/{netns}"), move || {
        http_get(addr, &path).map_err(io(format!("GET http://{addr}{path} in {ns}")))
    })?
}

/// Runs `f` on a helper thread inside a network namespace (given by path: `/run/netns/NAME`
/// or `/proc/PID/ns/net`); sockets made there stay in that namespace.
pub fn in_netns_thread<T: Send + 'static>(ns_path: String, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    std::thread::spawn(move || -> Result<T> {
        let file = std::fs::File::open(&ns_path).map_err(io(format!("open namespace {ns_path}")))?;
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| io(format!("enter namespace {ns_path}"))(e.into()))?;
        Ok(f())
    })
    .join()
    .map_err(|_| LabError::NotReady("a helper thread inside a lab namespace panicked".into()))?
}

fn lb_status_in(gateway_netns: &str) -> Result<serde_json::Value> {
    let (code, body) = http_get_in(gateway_netns, LB_STATUS.parse().expect("constant"), "/status")?;
    if code != 200 {
        return Err(LabError::NotReady(format!("lb-sim status answered HTTP {code}")));
    }
    serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("lb-sim status is not JSON: {e}")))
}

/// The API server's address from the lab state.
pub(crate) fn api_addr(st: &LabState) -> Result<SocketAddr> {
    st.api.parse().map_err(|_| LabError::Usage(format!("bad API address {:?} in the lab state", st.api)))
}

/// The PID of a pod's first container (its namespaces are the pod's), from the API.
pub(crate) fn pod_pid(api: SocketAddr, ns: &str, name: &str) -> Result<String> {
    let (code, body) =
        http_get(api, &format!("/api/v1/namespaces/{ns}/pods/{name}")).map_err(io("ask the API server"))?;
    if code != 200 {
        return Err(LabError::Usage(format!("pod {ns}/{name} not found")));
    }
    let pod: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    pod["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("podpath://"))
        .map(str::to_string)
        .ok_or_else(|| LabError::Usage(format!("pod {ns}/{name} has no running container yet")))
}

/// Per node: each table's `iptables-save` text.
pub type NodeTables = BTreeMap<String, Vec<(String, String)>>;

/// `iptables-save` of `tables` on every node of the lab, read in parallel.
pub fn node_tables(st: &LabState, tables: &[&str]) -> Result<NodeTables> {
    let plan = Plan::new(&st.name, st.nodes);
    let nodes: Vec<(String, String)> =
        plan.nodes.iter().map(|n| (n.name.clone(), plan.netns_of(&n.name).expect("planned").to_string())).collect();
    type OneNode = (String, Vec<(String, String)>);
    let saves: Vec<Result<OneNode>> = std::thread::scope(|s| {
        let jobs: Vec<_> = nodes
            .iter()
            .map(|(node, netns)| {
                s.spawn(move || -> Result<OneNode> {
                    let mut out = Vec::new();
                    for table in tables {
                        let ipt = podpath_ruleset::Iptables::new(podpath_ruleset::Backend::System).in_netns(netns);
                        let save = ipt.save_text(table).map_err(|e| LabError::Command {
                            cmd: format!("iptables-save -t {table} in {netns}"),
                            stderr: e.to_string(),
                        })?;
                        out.push((table.to_string(), save));
                    }
                    Ok((node.clone(), out))
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(LabError::NotReady("a helper thread panicked".into()))))
            .collect()
    });
    saves.into_iter().collect()
}

/// Every node's proxy rules (nat and filter) as lines (`rules::proxy_rules`).
pub fn proxy_rules(st: &LabState) -> Result<BTreeMap<String, Vec<String>>> {
    Ok(node_tables(st, &["nat", "filter"])?
        .into_iter()
        .map(|(node, tables)| (node, tables.iter().flat_map(|(t, save)| rules::proxy_rules(t, save)).collect()))
        .collect())
}

/// `Kind ns/name` → resourceVersion of the objects the service proxy renders rules from.
fn proxy_inputs(api: SocketAddr) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (kind, path) in [("Service", "/api/v1/services"), ("EndpointSlice", "/apis/discovery.k8s.io/v1/endpointslices")]
    {
        let doc = trace::run::api_get(api, path);
        for item in doc["items"].as_array().into_iter().flatten() {
            let m = &item["metadata"];
            let key = format!("{kind} {}/{}", m["namespace"].as_str().unwrap_or(""), m["name"].as_str().unwrap_or(""));
            out.insert(key, m["resourceVersion"].as_str().unwrap_or("").to_string());
        }
    }
    out
}

/// What changed between two [`proxy_inputs`]: `Service default/web created`, …
fn input_changes(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in after {
        match before.get(k) {
            None => out.push(format!("{k} created")),
            Some(old) if old != v => out.push(format!("{k} changed")),
            _ => {}
        }
    }
    out.extend(before.keys().filter(|k| !after.contains_key(*k)).map(|k| format!("{k} deleted")));
    out
}

/// `podpath rules --watch`: after each change of a Service or EndpointSlice in the API, waits
/// for the nodes' rules to follow (they settle: unchanged for 300 ms, or 3 s pass) and writes
/// the rule changes of every node. Stops after `count` reports, if given.
pub fn watch_rules(st: &LabState, count: Option<usize>, out: &mut dyn Write) -> Result<()> {
    let api = api_addr(st)?;
    let mut rules = proxy_rules(st)?;
    let mut inputs = proxy_inputs(api);
    let sizes: Vec<String> = rules.iter().map(|(n, r)| format!("{n} {} rules", r.len())).collect();
    let w = |out: &mut dyn Write, s: &str| out.write_all(s.as_bytes()).and_then(|_| out.flush());
    w(out, &format!("watching the service proxy's rules ({}); Ctrl-C stops\n", sizes.join(", ")))
        .map_err(io("write".to_string()))?;
    let mut reports = 0;
    while count.is_none_or(|c| reports < c) {
        std::thread::sleep(Duration::from_millis(200));
        let now = proxy_inputs(api);
        if now == inputs {
            continue;
        }
        let changes = input_changes(&inputs, &now);
        inputs = now;
        let (deadline, mut last, mut settled_at) = (Instant::now() + Duration::from_secs(3), rules.clone(), None);
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            let current = proxy_rules(st)?;
            if current != last {
                last = current;
                settled_at = Some(Instant::now());
            } else if settled_at.is_some_and(|t: Instant| t.elapsed() >= Duration::from_millis(300)) {
                break;
            }
        }
        let per_node: BTreeMap<String, Vec<rules::Change>> = last
            .iter()
            .map(|(node, new)| (node.clone(), rules::diff(rules.get(node).map(Vec::as_slice).unwrap_or_default(), new)))
            .collect();
        let when = jiff::Zoned::now().strftime("%H:%M:%S").to_string();
        w(out, &rules::report(&when, &changes, &per_node)).map_err(io("write".to_string()))?;
        rules = last;
        reports += 1;
    }
    Ok(())
}

/// Explains a Service's rules on every node of the lab (`podpath explain`): the Service from
/// the API, `iptables-save` of the nat and filter tables of each node.
pub fn explain(st: &LabState, service: &str) -> Result<explain::Explanation> {
    let (ns, name) = service.split_once('/').unwrap_or(("default", service));
    if name.is_empty() || ns.is_empty() || name.contains('/') {
        return Err(LabError::Usage(format!("{service:?}: give a Service as NAME or NAMESPACE/NAME")));
    }
    let api = api_addr(st)?;
    let (code, body) = http_get(api, &format!("/api/v1/namespaces/{ns}/services/{name}"))
        .map_err(io("ask the API server".to_string()))?;
    match code {
        200 => {}
        404 => return Err(LabError::Usage(format!("service {ns}/{name} not found"))),
        c => return Err(LabError::NotReady(format!("the API server answered HTTP {c} for service {ns}/{name}"))),
    }
    let svc: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("service {ns}/{name}: {e}")))?;
    let pods = trace::run::pods_by_ip(api).into_iter().map(|(ip, (pod, _))| (ip, pod)).collect();
    let slices = trace::run::api_get(
        api,
        &format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{name}"),
    );
    let slices = slices["items"].as_array().cloned().unwrap_or_default();
    let saves = node_tables(st, &["nat", "filter"])?;
    Ok(explain::explain(&svc, &slices, &saves, &pods))
}

/// lb-sim's status document (`GET /status` in the gateway's namespace).
pub fn lb_status(st: &LabState) -> Result<serde_json::Value> {
    let p = Plan::new(&st.name, st.nodes);
    lb_status_in(p.netns_of("gateway").expect("planned"))
}

/// Ready nodes according to the API server.
pub fn nodes_ready(st: &LabState) -> Vec<String> {
    st.api.parse().map(ready_nodes).unwrap_or_default()
}

/// lb-sim's status as a table: one row per frontend, its backends with their health (`*`:
/// gets traffic).
pub fn lb_table(doc: &serde_json::Value) -> String {
    let mut rows = vec![["VIP", "SERVICE", "KIND", "VIA", "PORTS", "BACKENDS"].map(String::from).to_vec()];
    for f in doc["frontends"].as_array().into_iter().flatten() {
        let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
        let ports: Vec<&str> = f["ports"].as_array().into_iter().flatten().filter_map(|p| p.as_str()).collect();
        let backends: Vec<String> = f["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                let star = if b["inRotation"] == true { "*" } else { "" };
                format!("{}{star} {}", b["node"].as_str().unwrap_or_default(), b["health"].as_str().unwrap_or_default())
            })
            .collect();
        let mut via = s("delivery");
        if let Some(pin) = f["pinned"].as_str() {
            via = format!("{via} (pinned to {pin})");
        }
        rows.push(vec![s("vip"), s("service"), s("kind"), via, ports.join(","), backends.join(", ")]);
    }
    let widths: Vec<usize> = (0..6).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = format!("load balancers ({} mode):\n", doc["mode"].as_str().unwrap_or("?"));
    for r in &rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if rows.len() == 1 {
        out.push_str("(no LoadBalancer IPs or externalIPs yet)\n");
    }
    if let Some(e) = doc["error"].as_str() {
        out.push_str(&format!("last error: {e}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lb_table_shows_every_frontend_with_its_backends() {
        let doc = serde_json::json!({"mode": "passthrough", "nodes": [], "frontends": [
            {"vip": "198.51.100.1", "service": "default/contour", "kind": "LoadBalancer", "delivery": "route",
             "ports": ["http 80/TCP→30080", "https 443/TCP→30443"],
             "backends": [{"node": "node-1", "target": "192.168.56.11", "check": "", "health": "healthy", "inRotation": true},
                          {"node": "node-2", "target": "192.168.56.12", "check": "", "health": "unhealthy", "inRotation": false}]},
            {"vip": "169.10.10.1", "service": "default/svc-test-1", "kind": "ExternalIP", "delivery": "route",
             "pinned": "node-2", "ports": ["80/TCP"], "backends": []}]});
        let t = lb_table(&doc);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "load balancers (passthrough mode):");
        assert!(lines[1].starts_with("VIP "), "{t}");
        assert!(lines[2].contains("default/contour") && lines[2].contains("node-1* healthy, node-2 unhealthy"), "{t}");
        assert!(lines[3].contains("route (pinned to node-2)"), "{t}");
        assert_eq!(lines[1].find("SERVICE"), lines[2].find("default/contour"), "columns line up");
    }
}
