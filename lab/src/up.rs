//! `podpath up` and `down`: the topology ([`crate::plan`]) built, `apiserver-lite`, one
//! `node-agent` per node and lb-sim started in their namespaces and recorded before they are
//! waited for, so `down` (and a failed `up`) stops exactly what was started, dead or alive.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::hosts::lb_status_in;
use crate::plan::{self, Plan};
use crate::state::{
    alive, kubeconfig, kubeconfig_path, load_state, save_state, state_file, ApiAccess, LabState, LbMode, Proc,
    ProxyMode, LB_STATUS,
};
use crate::{io, LabError, Result};

/// What `up` is asked for.
#[derive(Debug, Clone)]
pub struct UpOptions {
    pub name: String,
    pub nodes: usize,
    pub proxy_mode: ProxyMode,
    /// With `--proxy-mode nftables`: `current` (kube-proxy v1.36+), `v1.34` or `shared-maps`.
    pub nftables_layout: String,
    pub lb_mode: LbMode,
    /// `false` leaves out the nodes' masquerade of external traffic (the scenario-4 lesson).
    pub masquerade: bool,
    /// The cluster's IP families.
    pub ip_family: crate::family::IpFamilyMode,
    pub state_dir: PathBuf,
    /// Where `apiserver-lite`, `node-agent`, `podpath-workload` and the CNI plugins are: for
    /// `podpath up`, links to `podpath` itself (`multicall::install`).
    pub bin_dir: PathBuf,
    /// Host port for kubectl (0: any free one).
    pub api_port: u16,
    /// `REGISTRY=URL` mirrors for the lab's image service (`docker.io=http://10.0.0.5:5000`).
    pub registry_mirrors: Vec<String>,
    /// `HOST[:PORT]`s of registries spoken to over plain HTTP.
    pub plain_http_registries: Vec<String>,
    /// busybox, alpine, debian and ubuntu run the nodes' own programs instead of being pulled.
    pub host_programs: bool,
    /// The image store's bound on disk, bytes (0: none).
    pub image_store_limit: u64,
}

/// A size as Kubernetes quantities write it (`10Gi`, `500Mi`, `20G`, `1500k`, bytes), with an
/// optional trailing `B` (`10GiB`).
pub fn parse_size(text: &str) -> std::result::Result<u64, String> {
    let t = text.trim();
    let t = t.strip_suffix('B').unwrap_or(t);
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit {
        "" => 1,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return Err(format!("{text:?}: unknown unit {unit:?} (use Ki, Mi, Gi, Ti, k, M, G or T)")),
    };
    let n: u64 = num.parse().map_err(|_| format!("{text:?} is not a size (as 10Gi or 500Mi)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{text:?} is too large"))
}

/// The lab's image store: kept by `down` (a class pulls once), removed by `down --purge-images`.
pub fn image_store(state_dir: &Path) -> PathBuf {
    state_dir.join("images")
}

/// The lab's image service socket.
pub fn image_socket(state_dir: &Path) -> PathBuf {
    state_dir.join("images.sock")
}

pub(crate) fn run(argv: &[String]) -> Result<String> {
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

/// [`run`] with `input` on the command's standard input.
pub(crate) fn run_with_input(argv: &[String], input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io(format!("cannot run {}", argv[0])))?;
    let written = child.stdin.take().expect("piped").write_all(input.as_bytes());
    let out = child.wait_with_output().map_err(io(format!("cannot run {}", argv[0])))?;
    written.map_err(io(format!("write to {}", argv[0])))?;
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
                "`{tool}` is not installed (apt-get install iproute2 iptables util-linux; `sudo podpath doctor` checks all the lab needs)"
            )));
        }
    }
    Ok(())
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
    Ok(Proc {
        component: component.into(),
        pid,
        start_time,
        argv: argv.to_vec(),
        env: env.iter().map(|(k, v)| (k.to_string(), v.display().to_string())).collect(),
    })
}

/// Where the lab's binaries are; for a lab made before that was recorded, this program's
/// directory.
fn bin_dir(st: &LabState) -> Result<PathBuf> {
    match &st.bin_dir {
        Some(d) => Ok(d.clone()),
        None => Ok(std::env::current_exe()
            .map_err(io("find this program"))?
            .parent()
            .map(PathBuf::from)
            .unwrap_or_default()),
    }
}

/// The index of `node`'s agent among the lab's processes, and its state.
fn agent_of(state_dir: &Path, node: &str) -> Result<(LabState, usize)> {
    let st =
        load_state(state_dir)?.ok_or_else(|| LabError::Usage(format!("no lab state in {}", state_dir.display())))?;
    let i =
        st.procs.iter().position(|p| p.component == node && node.starts_with("node-")).ok_or_else(|| {
            LabError::Usage(format!("no node {node:?} in lab {:?}: node-1…node-{}", st.name, st.nodes))
        })?;
    if st.procs[i].argv.is_empty() {
        return Err(LabError::Usage(format!(
            "this lab was made before podpath recorded how its agents start: recreate it to restart {node}"
        )));
    }
    Ok((st, i))
}

/// `podpath node stop NODE`: the node goes down as a node losing power does — its agent killed
/// without a word (SIGKILL: it posts nothing, not even NotReady) and its pods' processes
/// killed. The API stops hearing from it (NotReady after the grace period, and its pods not
/// ready at that moment), the load balancer's health checks fail.
pub fn stop_node(state_dir: &Path, node: &str) -> Result<()> {
    let (st, i) = agent_of(state_dir, node)?;
    kill_now(&st.procs[i]);
    kill_pods(&bin_dir(&st)?, &state_dir.join("nodes").join(node).join("agent"))
}

/// `podpath node start NODE` (and the second half of `agent restart`): the node's agent started
/// again with its recorded command line; it adopts the pods still running and recreates those
/// whose sandboxes died, as a kubelet does after a reboot. Returns once the new agent is healthy
/// and the node Ready (30 s at most), with the time that took.
pub fn start_node(state_dir: &Path, node: &str) -> Result<Duration> {
    let (mut st, i) = agent_of(state_dir, node)?;
    if alive(&st.procs[i]) {
        return Err(LabError::Usage(format!("{node}'s agent is running (`podpath agent restart {node}` restarts it)")));
    }
    let t = Instant::now();
    let old = st.procs[i].clone();
    let env: Vec<(&str, &Path)> = old.env.iter().map(|(k, v)| (k.as_str(), Path::new(v.as_str()))).collect();
    let log = state_dir.join("logs").join(format!("{node}.log"));
    st.procs[i] = spawn(node, &old.argv, &log, &env)?;
    save_state(state_dir, &st)?;
    // The new agent answers its healthz (a node whose agent was away a short while never
    // stopped being Ready: the API marks it NotReady only after the grace period).
    let access = ApiAccess::of(&st)?;
    let ns = plan::netns_name(&st.name, node);
    let healthz = plan::agent_health_addr(node).ok_or_else(|| LabError::Usage(format!("no node {node:?}")))?;
    wait_until(Duration::from_secs(30), &format!("{node}'s new agent to be healthy and the node Ready"), || {
        crate::hosts::http_get_in(&ns, healthz, "/healthz").is_ok_and(|(code, _)| code == 200)
            && ready_nodes(&access).contains(&node.to_string())
    })?;
    Ok(t.elapsed())
}

/// `podpath agent restart NODE`: the agent stopped (SIGTERM; its pods keep running, as a
/// kubelet's do) and started again; returns the time until it is healthy and the node Ready.
pub fn restart_agent(state_dir: &Path, node: &str) -> Result<Duration> {
    let t = Instant::now();
    let (st, i) = agent_of(state_dir, node)?;
    stop(&st.procs[i]);
    start_node(state_dir, node)?;
    Ok(t.elapsed())
}

/// A fresh random bearer token in `path` (mode 0600).
fn write_token(path: &Path) -> Result<()> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut raw = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut raw)).map_err(io("read /dev/urandom"))?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(io(format!("write {}", path.display())))?;
    f.write_all(token.as_bytes()).map_err(io(format!("write {}", path.display())))
}

pub fn ready_nodes(api: &ApiAccess) -> Vec<String> {
    let Ok((200, body)) = api.get("/api/v1/nodes") else { return vec![] };
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

/// Builds the lab; on any failure removes what it made. `progress` gets one line per step.
pub fn up(opts: &UpOptions, progress: &mut dyn FnMut(&str)) -> Result<LabState> {
    plan::check_name(&opts.name).map_err(LabError::Usage)?;
    if opts.nodes == 0 || opts.nodes > plan::MAX_NODES {
        return Err(LabError::Usage(format!("--nodes {}: use 1 to {}", opts.nodes, plan::MAX_NODES)));
    }
    if opts.proxy_mode == ProxyMode::Nftables && !crate::doctor::on_path("nft") {
        return Err(LabError::Usage("--proxy-mode nftables needs the nft tool: apt-get install nftables".to_string()));
    }
    let mut registries = image::Registries::default();
    for m in &opts.registry_mirrors {
        registries.add_mirror(m).map_err(|e| LabError::Usage(e.to_string()))?;
    }
    if !crate::doctor::on_path("crun") {
        return Err(LabError::Usage(
            "containers of images run with crun, which is not installed: apt-get install crun".to_string(),
        ));
    }
    for (bin, _) in crate::multicall::PROGRAMS {
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
    let p = Plan::with_family(&opts.name, opts.nodes, opts.ip_family);
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
    // The lab's bearer token; the API server makes its CA in its cert directory.
    let token_file = opts.state_dir.join("token");
    write_token(&token_file)?;
    let mut st = LabState {
        name: opts.name.clone(),
        nodes: opts.nodes,
        proxy_mode: opts.proxy_mode,
        nftables_layout: (opts.proxy_mode == ProxyMode::Nftables).then(|| opts.nftables_layout.clone()),
        lb_mode: opts.lb_mode,
        ip_family: opts.ip_family,
        api: api.to_string(),
        ca_file: Some(opts.state_dir.join("apiserver").join("pki").join("ca.crt")),
        token_file: Some(token_file),
        namespaces: p.hosts.iter().map(|h| h.netns.clone()).collect(),
        procs: vec![],
        bin_dir: Some(opts.bin_dir.clone()),
        dir: opts.state_dir.clone(),
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
    let token_file = st.token_file.clone().expect("set by up").display().to_string();
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
    // The control plane as the cluster reaches it: over IPv6 in an IPv6 lab (its pods, the DNS
    // server's among them, have no IPv4 address), else over the IPv4 underlay.
    let cp_ip: std::net::IpAddr = if opts.ip_family == crate::family::IpFamilyMode::Ipv6 {
        crate::family::underlay6(plan::CONTROL_PLANE.octets()[3]).into()
    } else {
        plan::CONTROL_PLANE.into()
    };
    let grpc_addr = SocketAddr::new(cp_ip, plan::GRPC_PORT);
    progress(&format!("apiserver-lite: kubectl on {api}, node agents on {grpc_addr}"));
    let mut apiserver = vec![
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
        grpc_addr.to_string(),
        s("--node-monitor-grace-period"),
        s("10s"),
        s("--token-file"),
        token_file.clone(),
        s("--service-cluster-ip-range"),
        opts.ip_family.service_cidrs(),
        s("--cluster-cidr"),
        opts.ip_family.cluster_cidrs(),
        s("--lb-ip-pool"),
        opts.ip_family.lb_pools(),
    ];
    // Pods reach `kubernetes.default` (10.96.0.1, fd00:10:96::1) at the control plane's REST
    // address of the cluster's family, as a real API server advertises its own.
    let rest_cp = SocketAddr::new(cp_ip, plan::API_PORT).to_string();
    if cp_ip.is_ipv6() {
        apiserver.extend([s("--netns-listen"), rest_cp.clone()]);
    }
    apiserver.extend([s("--advertise-address"), rest_cp]);
    let log = logs.join("apiserver-lite.log");
    let listen_at = apiserver.iter().position(|a| a == "--listen").expect("built above") + 1;
    let mut api = api;
    for retry in 1.. {
        apiserver[listen_at] = api.to_string();
        st.api = api.to_string();
        let server = spawn("apiserver-lite", &apiserver, &log, &[])?;
        st.procs.push(server.clone());
        save_state(&opts.state_dir, st)?;
        // Over TLS with the CA the server made (once it has made it).
        let waited = wait_until(Duration::from_secs(10), "apiserver-lite to answer", || {
            !alive(&server) || ApiAccess::of(st).is_ok_and(|a| matches!(a.get("/readyz"), Ok((200, _))))
        });
        if waited.is_ok() && alive(&server) {
            break;
        }
        // The host port was free when it was picked; another program can take it before the
        // server binds it (then the server exits): another port, a few times.
        let taken = std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Address already in use"));
        if opts.api_port != 0 || !taken || retry == 3 || alive(&server) {
            let e = waited.err().unwrap_or_else(|| LabError::NotReady("apiserver-lite exited".into()));
            return Err(with_log(e, &log));
        }
        st.procs.pop();
        api = ([127, 0, 0, 1], free_port()?).into();
        progress(&format!("apiserver-lite: the port was taken meanwhile; kubectl on {api}"));
    }
    let access = ApiAccess::of(st)?;
    // The cluster DNS first: its pods are placed as soon as nodes register, so they are running
    // (and soon ready) by the time the nodes are.
    cluster_dns_objects(&access, opts.ip_family.cluster_dns(), progress)?;
    let ca_file = st.ca_file.clone().expect("set above").display().to_string();
    // How node agents and lb-sim reach the API: its gRPC address, TLS with the lab CA, the token.
    let api_client = [
        s("--apiserver"),
        grpc_addr.to_string(),
        s("--apiserver-ca-file"),
        ca_file.clone(),
        s("--token-file"),
        token_file.clone(),
    ];

    // The image service, in the host's namespace: registries and mirrors are reached from
    // there, as a node's containerd reaches them through the node's own network.
    let store = image_store(&opts.state_dir);
    let socket = image_socket(&opts.state_dir);
    let mut images = vec![
        bin("podpath-images"),
        s("--store"),
        store.display().to_string(),
        s("--socket"),
        socket.display().to_string(),
    ];
    for m in &opts.registry_mirrors {
        images.extend([s("--registry-mirror"), m.clone()]);
    }
    for r in &opts.plain_http_registries {
        images.extend([s("--plain-http-registry"), r.clone()]);
    }
    if opts.image_store_limit > 0 {
        // MiB, rounded up (a limit under 1 MiB is still a limit).
        images.extend([s("--store-limit-mib"), opts.image_store_limit.div_ceil(1 << 20).to_string()]);
    }
    progress(&format!("images: store in {}", store.display()));
    st.procs.push(spawn("images", &images, &logs.join("images.log"), &[])?);
    save_state(&opts.state_dir, st)?;
    wait_until(Duration::from_secs(10), "the image service to listen", || socket.exists())
        .map_err(|e| with_log(e, &logs.join("images.log")))?;

    let workload = opts.bin_dir.join("podpath-workload");
    for n in &p.nodes {
        progress(&format!("{}: node-agent at {} ({} proxy)", n.name, n.ip, opts.proxy_mode));
        let dir = opts.state_dir.join("nodes").join(&n.name);
        std::fs::create_dir_all(dir.join("cni")).map_err(io(format!("create {}", dir.display())))?;
        let mut argv = vec![
            s("ip"),
            s("netns"),
            s("exec"),
            n.netns.clone(),
            bin("node-agent"),
            s("--node-name"),
            n.name.clone(),
            s("--node-ip"),
            n.node_ips(opts.ip_family),
            // The lab's client reaches nodes at their node-network address, through the
            // gateway: that is their external address.
            s("--node-external-ip"),
            n.node_ips(opts.ip_family),
            s("--state-dir"),
            dir.join("agent").display().to_string(),
            s("--cni-conf-dir"),
            dir.join("cni").display().to_string(),
            s("--cni-bin-dir"),
            format!("{}:/opt/cni/bin:/usr/lib/cni", opts.bin_dir.display()),
            s("--healthz-bind-address"),
            // With IPv6, every address (lb-sim checks the node at its InternalIP).
            if opts.ip_family.has_v6() {
                format!("[::]:{}", plan::AGENT_HEALTH_PORT)
            } else {
                format!("{}:{}", n.ip, plan::AGENT_HEALTH_PORT)
            },
            s("--heartbeat-seconds"),
            s("2"),
            s("--restart-backoff-seconds"),
            s("1"),
            s("--proxy-mode"),
            opts.proxy_mode.to_string(),
            s("--nftables-layout"),
            opts.nftables_layout.clone(),
            s("--service-cluster-ip-range"),
            opts.ip_family.service_cidrs(),
            s("--cluster-cidr"),
            opts.ip_family.cluster_cidrs(),
            format!("--masquerade={}", opts.masquerade),
            s("--cluster-dns"),
            s(opts.ip_family.cluster_dns()),
            s("--cluster-domain"),
            s("cluster.local"),
            s("--node-label"),
            format!("topology.kubernetes.io/region={}", plan::REGION),
            s("--node-label"),
            format!(
                "topology.kubernetes.io/zone={}",
                plan::zone_of(n.name.strip_prefix("node-").and_then(|i| i.parse().ok()).unwrap_or(1))
            ),
        ];
        argv.extend([
            s("--image-store"),
            store.display().to_string(),
            s("--image-service"),
            socket.display().to_string(),
        ]);
        if opts.host_programs {
            argv.push(s("--host-programs"));
        }
        argv.extend(api_client.iter().cloned());
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
        let ready = ready_nodes(&access);
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
    control_plane_routes(&p.lab, &access)?;
    let gw = p.netns_of("gateway").expect("planned");
    progress(&format!("gateway: lb-sim ({} load balancers, health checks on :10256)", opts.lb_mode));
    let mut lb = vec![
        s("ip"),
        s("netns"),
        s("exec"),
        gw.to_string(),
        bin("lb-sim"),
        s("--mode"),
        opts.lb_mode.to_string(),
        s("--status-listen"),
        s(LB_STATUS),
    ];
    lb.extend(api_client.iter().cloned());
    st.procs.push(spawn("lb-sim", &lb, &logs.join("lb-sim.log"), &[])?);
    save_state(&opts.state_dir, st)?;
    let nodes = p.nodes.len();
    wait_until(Duration::from_secs(10), "lb-sim to see every node", || {
        lb_status_in(gw).is_ok_and(|s| s["nodes"].as_array().is_some_and(|n| n.len() == nodes))
    })
    .map_err(|e| with_log(e, &logs.join("lb-sim.log")))?;
    // The cluster DNS answers on every node before the lab is said to be ready: a pod made
    // right away must resolve its first name (a Service without ready endpoints is REJECTed,
    // and glibc gives up at once).
    progress("cluster DNS: waiting until it answers on every node");
    let dns_server: &'static str = opts.ip_family.cluster_dns();
    for n in &p.nodes {
        let ns = format!("/run/netns/{}", n.netns);
        wait_until(Duration::from_secs(30), &format!("the cluster DNS to answer on {}", n.name), || {
            crate::hosts::in_netns_thread(ns.clone(), || {
                crate::dns::cluster_dns_answers(
                    dns_server,
                    "kubernetes.default.svc.cluster.local",
                    Duration::from_millis(200),
                )
            })
            .unwrap_or(false)
        })?;
    }
    let ca_pem = std::fs::read_to_string(&ca_file).map_err(io(format!("read {ca_file}")))?;
    let token = std::fs::read_to_string(&token_file).map_err(io(format!("read {token_file}")))?;
    std::fs::write(kubeconfig_path(&opts.state_dir), kubeconfig(&opts.name, api, &ca_pem, token.trim()))
        .map_err(io("write the kubeconfig"))?;
    progress(&format!("ready: {} nodes in {:.1} s", p.nodes.len(), t0.elapsed().as_secs_f64()));
    Ok(())
}

/// The cluster DNS objects (kube-system/kube-dns Service at `cluster_dns`, the DNS Deployment);
/// `up` waits at its end until the DNS answers on every node. Also `podpath addon dns`, for a
/// cluster podpath did not start (the VM lab's control plane runs it).
pub fn cluster_dns_objects(access: &ApiAccess, cluster_dns: &str, progress: &mut dyn FnMut(&str)) -> Result<()> {
    progress(&format!("cluster DNS: kube-system/kube-dns at {cluster_dns} (podpath/dns pods)"));
    for (path, obj) in crate::dns::objects(cluster_dns) {
        let (code, body) = access.request("POST", path, &obj.to_string())?;
        if !(200..300).contains(&code) && code != 409 {
            return Err(LabError::NotReady(format!("cannot create the cluster DNS ({path}): {code} {body}")));
        }
    }
    Ok(())
}

/// Routes from the control plane to every node's pod CIDR (the API server reaches webhooks-free
/// pods for `port-forward`, `exec` and the DNS server's lookups).
fn control_plane_routes(lab: &str, access: &ApiAccess) -> Result<()> {
    let s = |x: &str| x.to_string();
    let cp = plan::netns_name(lab, "control-plane");
    let (_, body) = access.get("/api/v1/nodes")?;
    let nodes: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    for (cidr, via) in crate::dns::control_plane_routes(&nodes) {
        run(&[s("ip"), s("-n"), cp.clone(), s("route"), s("replace"), cidr, s("via"), via])?;
    }
    Ok(())
}

/// `podpath node add`: one more node joins the running lab, as a new machine joins a cluster —
/// its namespace on the underlay with the next address, its agent started with the same flags
/// as its siblings' (its own name, address, directories and zone), registered and Ready; the
/// other nodes and the load balancer learn of it from the API, the control plane gets a route
/// to its pods. Returns its name and the time until it was Ready.
pub fn add_node(state_dir: &Path) -> Result<(String, Duration)> {
    let t = Instant::now();
    let mut st =
        load_state(state_dir)?.ok_or_else(|| LabError::Usage(format!("no lab state in {}", state_dir.display())))?;
    let i = st.nodes + 1;
    if i > plan::MAX_NODES {
        return Err(LabError::Usage(format!("lab {:?} has {} nodes, the most a lab has", st.name, st.nodes)));
    }
    let sibling =
        st.procs.iter().find(|p| p.component.starts_with("node-") && !p.argv.is_empty()).cloned().ok_or_else(|| {
            LabError::Usage(format!("lab {:?} has no node whose agent's command line was recorded", st.name))
        })?;
    if !st.procs.iter().any(|p| p.component == "apiserver-lite" && alive(p)) {
        return Err(LabError::Usage(format!("lab {:?}'s API server is not running", st.name)));
    }
    let from_index: usize = sibling.component.strip_prefix("node-").and_then(|n| n.parse().ok()).unwrap_or(1);
    let from = Plan::with_family(&st.name, from_index, st.ip_family).nodes.pop().expect("planned");
    let added = Plan::one_node(&st.name, i, st.ip_family);
    let node = added.nodes[0].clone();
    if run(&["ip".into(), "netns".into(), "list".into()])?
        .lines()
        .any(|l| l.split_whitespace().next() == Some(&node.netns))
    {
        return Err(LabError::Usage(format!(
            "namespace {} exists already (left by another lab of this name?): `podpath down --name {}` first",
            node.netns, st.name
        )));
    }
    // Recorded first: `down` removes it whatever happens next.
    st.namespaces.push(node.netns.clone());
    st.nodes = i;
    save_state(state_dir, &st)?;
    for argv in added.commands() {
        run(&argv)?;
    }
    let dir = state_dir.join("nodes").join(&node.name);
    std::fs::create_dir_all(dir.join("cni")).map_err(io(format!("create {}", dir.display())))?;
    let argv = plan::agent_argv_for(&sibling.argv, &from, &node, &plan::zone_of(i));
    let env: Vec<(&str, &Path)> = sibling.env.iter().map(|(k, v)| (k.as_str(), Path::new(v.as_str()))).collect();
    let log = state_dir.join("logs").join(format!("{}.log", node.name));
    st.procs.push(spawn(&node.name, &argv, &log, &env)?);
    save_state(state_dir, &st)?;
    let access = ApiAccess::of(&st)?;
    wait_until(Duration::from_secs(30), &format!("{} to be Ready", node.name), || {
        ready_nodes(&access).contains(&node.name)
    })
    .map_err(|e| with_log(e, &log))?;
    control_plane_routes(&st.name, &access)?;
    Ok((node.name, t.elapsed()))
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
    let bin_dir = bin_dir(&st)?;
    let mut failed = None;
    for n in 1..=st.nodes {
        let dir = state_dir.join("nodes").join(format!("node-{n}")).join("agent");
        if let Err(e) = kill_pods(&bin_dir, &dir) {
            failed.get_or_insert(e);
        }
    }
    let existing = run(&["ip".into(), "netns".into(), "list".into()]).unwrap_or_default();
    let ours: Vec<String> = st
        .namespaces
        .iter()
        .filter(|ns| existing.lines().any(|l| l.split_whitespace().next() == Some(ns.as_str())))
        .cloned()
        .collect();
    stop_strays(&ours);
    for ns in &st.namespaces {
        if existing.lines().any(|l| l.split_whitespace().next() == Some(ns.as_str())) {
            run(&["ip".into(), "netns".into(), "del".into(), ns.clone()])?;
        }
    }
    // No trace can run on a lab that is gone; its lock file goes with it.
    let _ = std::fs::remove_file(crate::trace::run::lock_path(&st.name));
    let _ = std::fs::remove_dir_all(crate::trace::run::saves_dir(&st.name));
    if let Some(e) = failed {
        // The state stays, so a second `down` can finish the job.
        return Err(e);
    }
    if !keep_data {
        // Everything but the image store, which the next lab of this name uses again (a store
        // that holds no image goes too).
        let store = image_store(state_dir);
        let holds_images = std::fs::read_dir(store.join("images")).is_ok_and(|mut d| d.next().is_some());
        if !holds_images {
            let _ = std::fs::remove_dir_all(&store);
        }
        let entries = std::fs::read_dir(state_dir).map_err(io(format!("read {}", state_dir.display())))?;
        for e in entries.flatten() {
            let path = e.path();
            if path == image_store(state_dir) {
                continue;
            }
            let r = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            r.map_err(io(format!("remove {}", path.display())))?;
        }
        if !image_store(state_dir).exists() {
            let _ = std::fs::remove_dir(state_dir);
        }
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

/// SIGKILL, then waits (5 s at most) until the process is gone.
fn kill_now(p: &Proc) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if !alive(p) {
        return;
    }
    let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    let t = Instant::now();
    while alive(p) && t.elapsed() < Duration::from_secs(5) {
        let _ = nix::sys::wait::waitpid(Pid::from_raw(p.pid), Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Ends whatever still runs in the lab's namespaces once its recorded processes and pods are
/// gone — a node agent restarted by hand, a shell left from `podpath exec` — so that nothing
/// outlives `down` (a stray agent would write the state directory again). Found by namespace
/// (`ip netns pids`), which only the lab's own processes are in: SIGTERM, then SIGKILL after 3 s.
fn stop_strays(namespaces: &[String]) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let me = std::process::id() as i32;
    let strays = || -> Vec<Pid> {
        namespaces
            .iter()
            .flat_map(|ns| {
                run(&["ip".into(), "netns".into(), "pids".into(), ns.clone()])
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse::<i32>().ok())
                    .collect::<Vec<_>>()
            })
            .filter(|p| *p != me)
            .map(Pid::from_raw)
            .collect()
    };
    let first = strays();
    if first.is_empty() {
        return;
    }
    for p in &first {
        let _ = kill(*p, Signal::SIGTERM);
    }
    let t = Instant::now();
    let mut left = strays();
    while !left.is_empty() && t.elapsed() < Duration::from_secs(3) {
        for p in &left {
            let _ = nix::sys::wait::waitpid(*p, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
        std::thread::sleep(Duration::from_millis(50));
        left = strays();
    }
    for p in &left {
        let _ = kill(*p, Signal::SIGKILL);
    }
    let t = Instant::now();
    while !strays().is_empty() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Per component: running or not.
pub fn status(st: &LabState) -> Vec<(String, i32, bool)> {
    st.procs.iter().map(|p| (p.component.clone(), p.pid, alive(p))).collect()
}

#[cfg(test)]
mod size_tests {
    #[test]
    fn sizes_read_as_quantities() {
        for (t, want) in [
            ("10Gi", 10u64 << 30),
            ("10GiB", 10 << 30),
            ("500Mi", 500 << 20),
            ("20G", 20_000_000_000),
            ("1500k", 1_500_000),
            ("4096", 4096),
            ("0", 0),
        ] {
            assert_eq!(super::parse_size(t), Ok(want), "{t}");
        }
        for bad in ["", "ten", "10 Gi", "10Xi", "-1", "99999999999Ti"] {
            assert!(super::parse_size(bad).is_err(), "{bad}");
        }
    }
}
