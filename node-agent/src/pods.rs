//! Pods of this node: one worker per pod (like kubelet's pod workers) that creates the sandbox
//! and attaches it to the network through CNI, runs the containers' workloads, probes them,
//! restarts them with back-off, reports status, and tears everything down on deletion.
//!
//! All kernel and API side effects go through [`Processes`], [`PluginExec`], [`PodApi`] and
//! [`Prober`], so the logic is unit-tested with fakes. What the agent must remember across a
//! restart (sandbox and workload PIDs, IPs, restart counts) is a JSON record per pod in
//! `<state-dir>/pods/`; a restarted agent adopts those processes instead of starting new ones.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::cni::{self, Attachment, CniRuntime, Network, PluginExec};
use crate::error::{AgentError, Result};
use crate::metrics::Metrics;
use crate::podstatus::{self, ContainerState, ContainerView, PodView, Terminated};
use crate::process::{netns_path, Exit, ProcId, ProcSpec, Processes, Sig};
use podpath_client::reflector::Store;
use podpath_client::ApiClient;

/// The interface name pods get.
pub const POD_IFNAME: &str = "eth0";

/// Whether an image is the built-in echo server.
pub fn is_echo_image(image: &str) -> bool {
    let name = image.strip_prefix("docker.io/").unwrap_or(image);
    let name = name.split('@').next().unwrap_or(name);
    let name = name.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')).map_or(name, |(n, _)| n);
    name == "podpath/echo"
}

/// The API calls the pod workers make.
pub trait PodApi: Send + Sync + 'static {
    fn update_status(&self, pod: &core::Pod) -> impl Future<Output = Result<()>> + Send;
    /// Final deletion (grace period 0), only if the stored pod still has `uid`.
    fn delete(&self, namespace: &str, name: &str, uid: &str) -> impl Future<Output = Result<()>> + Send;
}

/// One readiness check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    Tcp(SocketAddr),
    Http { addr: SocketAddr, path: String, host: Option<String>, headers: Vec<(String, String)> },
    Exec { argv: Vec<String> },
}

/// Runs checks (the real one connects; tests fake it).
pub trait Prober: Send + Sync + 'static {
    fn probe(&self, check: &Check, timeout: Duration) -> impl Future<Output = bool> + Send;
}

/// The pod calls over gRPC.
impl PodApi for ApiClient {
    async fn update_status(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Result<()> {
        let mut pods = self.pods.clone();
        pods.update_status(api::convert::to_proto(pod))
            .await
            .map(|_| ())
            .map_err(|status| AgentError::Api { call: "Pods.UpdateStatus", status })
    }

    async fn delete(&self, namespace: &str, name: &str, uid: &str) -> Result<()> {
        let mut pods = self.pods.clone();
        let req = api::proto::DeleteRequest {
            namespace: namespace.to_string(),
            name: name.to_string(),
            grace_period_seconds: Some(0),
            precondition_uid: uid.to_string(),
        };
        match pods.delete(req).await {
            Ok(_) => Ok(()),
            // Already gone, or replaced by a new pod of the same name: nothing of ours to delete.
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::Aborted
                ) =>
            {
                Ok(())
            }
            Err(status) => Err(AgentError::Api { call: "Pods.Delete", status }),
        }
    }
}

impl<T: PodApi> PodApi for Arc<T> {
    fn update_status(&self, pod: &core::Pod) -> impl Future<Output = Result<()>> + Send {
        (**self).update_status(pod)
    }
    fn delete(&self, namespace: &str, name: &str, uid: &str) -> impl Future<Output = Result<()>> + Send {
        (**self).delete(namespace, name, uid)
    }
}

impl<T: Prober> Prober for Arc<T> {
    fn probe(&self, check: &Check, timeout: Duration) -> impl Future<Output = bool> + Send {
        (**self).probe(check, timeout)
    }
}

/// Settings of the pod workers.
#[derive(Debug, Clone)]
pub struct PodsConfig {
    pub node_name: String,
    pub node_ip: IpAddr,
    pub state_dir: PathBuf,
    /// `podpath-workload`.
    pub workload_bin: PathBuf,
    /// First restart delay of a crashed container (doubles up to `backoff_max`).
    pub backoff_base: Duration,
    pub backoff_max: Duration,
}

impl PodsConfig {
    fn records_dir(&self) -> PathBuf {
        self.state_dir.join("pods")
    }
    fn record_path(&self, uid: &str) -> PathBuf {
        self.records_dir().join(format!("{uid}.json"))
    }
    /// Where a pod's container logs go.
    pub fn log_path(&self, namespace: &str, name: &str, uid: &str, container: &str) -> PathBuf {
        self.state_dir.join("logs").join(format!("{namespace}_{name}_{uid}")).join(format!("{container}.log"))
    }
}

/// Everything the workers use.
pub struct Deps<P, E, A, Q> {
    pub cfg: PodsConfig,
    pub procs: P,
    pub cni: CniRuntime<E>,
    pub network: Network,
    pub api: A,
    pub prober: Q,
    pub metrics: Arc<Metrics>,
}

/// What survives an agent restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub sandbox: ProcId,
    pub pod_ips: Vec<IpAddr>,
    pub start_time: Timestamp,
    pub containers: BTreeMap<String, ContainerRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub process: Option<ProcId>,
    pub started_at: Option<Timestamp>,
    pub restart_count: i32,
    pub last: Option<Terminated>,
    /// Finished for good (its restart policy does not restart it).
    pub done: bool,
}

/// Reads every pod record under an agent's state directory (unreadable ones are reported and
/// skipped).
pub fn load_records(state_dir: &Path) -> Vec<PodRecord> {
    let Ok(dir) = std::fs::read_dir(state_dir.join("pods")) else { return vec![] };
    let mut out = vec![];
    for e in dir.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        match std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => out.push(r),
            Err(e) => tracing::warn!(path = %p.display(), "ignoring an unreadable pod record: {e}"),
        }
    }
    out
}

/// SIGKILLs every process recorded under an agent's state directory (sandboxes and workloads,
/// each checked against its start time). Pods outlive their agent on purpose; this is how a lab
/// or a test that is going away stops them. Returns how many processes were signalled.
pub fn kill_recorded_processes(state_dir: &Path) -> usize {
    let procs = crate::process::LinuxProcesses::default();
    let mut killed = Vec::new();
    for r in load_records(state_dir) {
        for p in r.containers.values().filter_map(|c| c.process).chain([r.sandbox]) {
            if procs.alive(p) {
                procs.signal(p, Sig::Kill);
                killed.push(p);
            }
        }
    }
    // SIGKILL is asynchronous: wait (briefly) until they have exited, so the caller can remove
    // their namespaces and files knowing nothing uses them.
    let t = std::time::Instant::now();
    while killed.iter().any(|p| procs.alive(*p)) && t.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    killed.len()
}

fn save_record(cfg: &PodsConfig, r: &PodRecord) -> Result<()> {
    let dir = cfg.records_dir();
    std::fs::create_dir_all(&dir).map_err(|e| AgentError::io(format!("create {}", dir.display()), e))?;
    cni::write_atomic(&cfg.record_path(&r.uid), &serde_json::to_vec_pretty(r).expect("json"))
}

fn key(pod: &core::Pod) -> String {
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or("default"), pod.metadata.name.as_deref().unwrap_or(""))
}

fn uid(pod: &core::Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// How a container's process is started, or why it cannot be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    Run(ProcSpec),
    /// Kubernetes-style waiting reason and message (no program to run).
    Cannot {
        reason: String,
        message: String,
    },
    /// The program does not exist: a start error (exit 128), retried with back-off.
    StartError(String),
}

fn find_program(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let ok = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if name.contains('/') {
        return ok(Path::new(name));
    }
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| ok(&d.join(name))))
}

/// The environment of a workload: the pod's identity (podpath/echo reads it) and the
/// container's `env` (plain values and the common `fieldRef`s).
pub fn workload_env(
    pod: &core::Pod,
    c: &core::Container,
    pod_ip: &str,
    node: &str,
    host_ip: &str,
) -> Vec<(String, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut env = vec![
        ("HOSTNAME".to_string(), name.clone()),
        ("POD_NAME".to_string(), name.clone()),
        ("POD_NAMESPACE".to_string(), ns.clone()),
        ("POD_IP".to_string(), pod_ip.to_string()),
        ("NODE_NAME".to_string(), node.to_string()),
    ];
    for e in c.env.iter().flatten() {
        let value = match (&e.value, e.value_from.as_ref().and_then(|v| v.field_ref.as_ref())) {
            (Some(v), _) => v.clone(),
            (None, Some(f)) => match f.field_path.as_str() {
                "metadata.name" => name.clone(),
                "metadata.namespace" => ns.clone(),
                "metadata.uid" => uid(pod),
                "spec.nodeName" => node.to_string(),
                "status.podIP" => pod_ip.to_string(),
                "status.hostIP" => host_ip.to_string(),
                _ => String::new(),
            },
            _ => String::new(),
        };
        env.retain(|(k, _)| *k != e.name);
        env.push((e.name.clone(), value));
    }
    env
}

/// Decides how to run a container (pure apart from looking the program up in `PATH`).
pub fn launch(cfg: &PodsConfig, pod: &core::Pod, c: &core::Container, sandbox: ProcId, pod_ip: &str) -> Launch {
    let image = c.image.clone().unwrap_or_default();
    let command: Vec<String> = c.command.clone().unwrap_or_default();
    let args: Vec<String> = c.args.clone().unwrap_or_default();
    let bin = cfg.workload_bin.display().to_string();
    let argv = if !command.is_empty() {
        if !find_program(&command[0]) {
            return Launch::StartError(format!(
                "failed to start the container process: exec: {:?}: executable file not found in $PATH",
                command[0]
            ));
        }
        let mut argv = vec![bin, "join".into(), "--sandbox".into(), sandbox.pid.to_string(), "--".into()];
        argv.extend(command);
        argv.extend(args);
        argv
    } else if is_echo_image(&image) {
        let mut argv = vec![bin, "echo".into(), "--sandbox".into(), sandbox.pid.to_string()];
        for p in c.ports.iter().flatten() {
            if p.protocol.as_deref().unwrap_or("TCP") == "TCP" {
                argv.push("--port".into());
                argv.push(p.container_port.to_string());
            }
        }
        argv.push("--".into());
        argv.extend(args);
        argv
    } else {
        return Launch::Cannot {
            reason: "ErrImagePull".into(),
            message: format!(
                "podpath runs no container images: {image:?} is not built in. Use image podpath/echo, \
                 or give the container a command (a program on the node) to run in the pod's namespaces"
            ),
        };
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    Launch::Run(ProcSpec {
        argv,
        env: workload_env(pod, c, pod_ip, &cfg.node_name, &cfg.node_ip.to_string()),
        log: Some(cfg.log_path(&ns, &name, &uid(pod), &c.name)),
    })
}

/// Readiness checking of one container.
#[derive(Debug, Clone)]
struct Readiness {
    checks: Vec<Check>,
    explicit: bool,
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
    successes: u32,
    failures: u32,
    next: Option<Instant>,
}

/// While no explicit probe exists, "ready" means the container ports accept connections; this
/// is how often that is tried until it first succeeds.
const DEFAULT_PROBE_RETRY: Duration = Duration::from_millis(50);
const DEFAULT_PROBE_PERIOD: Duration = Duration::from_secs(10);

fn port_of(port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString, c: &core::Container) -> Option<u16> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// A container's `lifecycle.preStop` handler.
#[derive(Debug, Clone, PartialEq)]
pub enum PreStop {
    Sleep(Duration),
    Check(Check),
}

/// The preStop handler of a container (sleep, exec in the pod's namespaces, or an HTTP GET to
/// the pod), if it has one. tcpSocket handlers are deprecated and, as in kubelet, do nothing.
pub fn pre_stop(c: &core::Container, pod_ip: Option<IpAddr>, sandbox: ProcId, workload_bin: &Path) -> Option<PreStop> {
    let h = c.lifecycle.as_ref()?.pre_stop.as_ref()?;
    if let Some(s) = &h.sleep {
        return Some(PreStop::Sleep(Duration::from_secs(s.seconds.max(0) as u64)));
    }
    if let Some(e) = &h.exec {
        return Some(PreStop::Check(exec_check(sandbox, workload_bin, e)));
    }
    http_check(h.http_get.as_ref()?, c, pod_ip?).map(PreStop::Check)
}

/// An exec action as a check: the command runs inside the pod's namespaces.
fn exec_check(sandbox: ProcId, workload_bin: &Path, e: &core::ExecAction) -> Check {
    let mut argv = vec![
        workload_bin.display().to_string(),
        "join".into(),
        "--sandbox".into(),
        sandbox.pid.to_string(),
        "--".into(),
    ];
    argv.extend(e.command.iter().flatten().cloned());
    Check::Exec { argv }
}

/// An httpGet action as a check: to `host` or the pod's IP; a `Host` header becomes the host.
fn http_check(g: &core::HTTPGetAction, c: &core::Container, pod_ip: IpAddr) -> Option<Check> {
    let port = port_of(&g.port, c)?;
    let addr = SocketAddr::new(g.host.as_deref().and_then(|h| h.parse().ok()).unwrap_or(pod_ip), port);
    let headers: Vec<(String, String)> =
        g.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect();
    let host = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("host")).map(|(_, v)| v.clone());
    Some(Check::Http {
        addr,
        path: g.path.clone().unwrap_or_else(|| "/".into()),
        host,
        headers: headers.into_iter().filter(|(k, _)| !k.eq_ignore_ascii_case("host")).collect(),
    })
}

fn readiness(c: &core::Container, pod_ip: Option<IpAddr>, sandbox: ProcId, workload_bin: &Path) -> Readiness {
    let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(0) as u64);
    let mut r = Readiness {
        checks: vec![],
        explicit: false,
        initial_delay: Duration::ZERO,
        period: DEFAULT_PROBE_PERIOD,
        timeout: Duration::from_secs(1),
        success_threshold: 1,
        failure_threshold: 3,
        successes: 0,
        failures: 0,
        next: None,
    };
    let Some(ip) = pod_ip else { return r };
    match &c.readiness_probe {
        Some(p) => {
            r.explicit = true;
            r.initial_delay = secs(p.initial_delay_seconds, 0);
            r.period = secs(p.period_seconds, 10).max(Duration::from_secs(1));
            r.timeout = secs(p.timeout_seconds, 1).max(Duration::from_secs(1));
            r.success_threshold = p.success_threshold.unwrap_or(1).max(1) as u32;
            r.failure_threshold = p.failure_threshold.unwrap_or(3).max(1) as u32;
            if let Some(t) = &p.tcp_socket {
                if let Some(port) = port_of(&t.port, c) {
                    r.checks.push(Check::Tcp(SocketAddr::new(ip, port)));
                }
            } else if let Some(h) = &p.http_get {
                r.checks.extend(http_check(h, c, ip));
            } else if let Some(e) = &p.exec {
                r.checks.push(exec_check(sandbox, workload_bin, e));
            }
        }
        None => {
            for p in c.ports.iter().flatten().filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP") {
                if let Ok(port) = u16::try_from(p.container_port) {
                    r.checks.push(Check::Tcp(SocketAddr::new(ip, port)));
                }
            }
        }
    }
    r
}

/// A container while its pod worker runs.
struct Ctr {
    spec: core::Container,
    rec: ContainerRecord,
    waiting: Option<(String, Option<String>)>,
    ready: bool,
    readiness: Readiness,
    next_start: Option<Instant>,
    backoff: Duration,
}

impl Ctr {
    fn view(&self) -> ContainerView {
        let state = match (&self.rec.process, &self.waiting) {
            (Some(_), _) => ContainerState::Running { started_at: self.rec.started_at.unwrap_or_else(Timestamp::now) },
            (None, Some((reason, message))) => {
                ContainerState::Waiting { reason: reason.clone(), message: message.clone() }
            }
            (None, None) if self.rec.done => ContainerState::Terminated(self.rec.last.clone().unwrap_or(Terminated {
                exit_code: 0,
                signal: None,
                reason: "Completed".into(),
                message: None,
                started_at: None,
                finished_at: Timestamp::now(),
                container_id: None,
            })),
            (None, None) => ContainerState::Waiting { reason: "ContainerCreating".into(), message: None },
        };
        let last_terminated = if self.rec.done { None } else { self.rec.last.clone() };
        ContainerView {
            name: self.spec.name.clone(),
            image: self.spec.image.clone().unwrap_or_default(),
            state,
            last_terminated,
            ready: self.ready && self.rec.process.is_some(),
            restart_count: self.rec.restart_count,
            container_id: self.rec.process.map(|p| format!("podpath://{}", p.pid)),
            will_restart: !self.rec.done,
        }
    }
}

fn restarts(policy: Option<&str>, exit_code: i32) -> bool {
    match policy.unwrap_or("Always") {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

type ExitMsg = (String, ProcId, Exit);

impl<P: Processes, E: PluginExec, A: PodApi, Q: Prober> Deps<P, E, A, Q> {
    fn attachment(&self, pod_ns: &str, pod_name: &str, pod_uid: &str, sandbox: Option<ProcId>) -> Attachment {
        Attachment {
            container_id: pod_uid.to_string(),
            netns: sandbox.map(netns_path).unwrap_or_default(),
            ifname: POD_IFNAME.into(),
            pod_namespace: pod_ns.to_string(),
            pod_name: pod_name.to_string(),
        }
    }

    /// Starts the sandbox and attaches it (CNI ADD); the sandbox is stopped again on failure.
    async fn create_sandbox(&self, pod: &core::Pod) -> Result<PodRecord> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let log = self.cfg.log_path(&ns, &name, &uid(pod), "sandbox");
        let sandbox = self.procs.start_sandbox(&name, Some(log)).await?;
        let att = self.attachment(&ns, &name, &uid(pod), Some(sandbox));
        let started = std::time::Instant::now();
        let result = self.cni.add(&self.network, &att).await;
        self.metrics.observe_cni("ADD", started.elapsed(), result.is_ok());
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                self.procs.signal(sandbox, Sig::Kill);
                self.procs.wait(sandbox).await;
                return Err(e);
            }
        };
        let rec = PodRecord {
            uid: uid(pod),
            namespace: ns,
            name,
            sandbox,
            pod_ips: cni::result_ips(&result),
            start_time: Timestamp::now(),
            containers: BTreeMap::new(),
        };
        save_record(&self.cfg, &rec)?;
        Ok(rec)
    }

    /// Removes a pod's network attachment, sandbox, record and logs (processes already gone).
    async fn release(&self, rec: &PodRecord) -> Result<()> {
        let sandbox = self.procs.alive(rec.sandbox).then_some(rec.sandbox);
        let att = self.attachment(&rec.namespace, &rec.name, &rec.uid, sandbox);
        let started = std::time::Instant::now();
        let r = self.cni.del(&self.network, &att).await;
        self.metrics.observe_cni("DEL", started.elapsed(), r.is_ok());
        r?;
        self.procs.signal(rec.sandbox, Sig::Kill);
        self.procs.wait(rec.sandbox).await;
        let _ = std::fs::remove_dir_all(
            self.cfg.state_dir.join("logs").join(format!("{}_{}_{}", rec.namespace, rec.name, rec.uid)),
        );
        match std::fs::remove_file(self.cfg.record_path(&rec.uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(AgentError::io("remove a pod record", e)),
            _ => Ok(()),
        }
    }

    /// Stops the processes of a record found at start-up whose pod no longer exists.
    pub async fn teardown_record(&self, rec: &PodRecord) -> Result<()> {
        for c in rec.containers.values() {
            if let Some(p) = c.process {
                self.procs.signal(p, Sig::Kill);
                self.procs.wait(p).await;
            }
        }
        self.release(rec).await
    }

    async fn start_container(
        &self,
        pod: &core::Pod,
        rec: &mut PodRecord,
        c: &mut Ctr,
        exits: &mpsc::UnboundedSender<ExitMsg>,
        deps: &Arc<Self>,
    ) {
        let ip = rec.pod_ips.first().map(|i| i.to_string()).unwrap_or_default();
        c.next_start = None;
        let first_start = c.rec.last.is_none() && c.rec.started_at.is_none();
        match launch(&self.cfg, pod, &c.spec, rec.sandbox, &ip) {
            Launch::Cannot { reason, message } => {
                c.waiting = Some((reason, Some(message)));
                // Like an image pull, look again later (the pod cannot change, but a record
                // of the attempt keeps the status honest).
                c.next_start = Some(Instant::now() + self.cfg.backoff_max);
            }
            Launch::StartError(message) => {
                let now = Timestamp::now();
                if !first_start {
                    c.rec.restart_count += 1;
                }
                c.rec.last = Some(Terminated {
                    exit_code: 128,
                    signal: None,
                    reason: "StartError".into(),
                    message: Some(message),
                    started_at: None,
                    finished_at: now,
                    container_id: None,
                });
                self.after_exit(pod, c, 128);
            }
            Launch::Run(spec) => match self.procs.spawn(&spec).await {
                Ok(p) => {
                    if !first_start {
                        c.rec.restart_count += 1;
                    }
                    c.rec.process = Some(p);
                    c.rec.started_at = Some(Timestamp::now());
                    c.waiting = None;
                    c.ready = false;
                    c.readiness = readiness(&c.spec, rec.pod_ips.first().copied(), rec.sandbox, &self.cfg.workload_bin);
                    c.readiness.next = Some(Instant::now() + c.readiness.initial_delay);
                    watch_exit(deps, c.spec.name.clone(), p, exits.clone());
                }
                Err(e) => {
                    tracing::warn!(pod = %key(pod), container = %c.spec.name, "cannot start: {e}");
                    self.metrics.sync_error("start");
                    c.waiting = Some(("CreateContainerError".into(), Some(e.to_string())));
                    c.next_start = Some(Instant::now() + c.backoff);
                    c.backoff = (c.backoff * 2).min(self.cfg.backoff_max);
                }
            },
        }
        rec.containers.insert(c.spec.name.clone(), c.rec.clone());
        if let Err(e) = save_record(&self.cfg, rec) {
            tracing::warn!(pod = %key(pod), "{e}");
        }
    }

    /// Restart decision after the container's process ended (its `last` is set).
    fn after_exit(&self, pod: &core::Pod, c: &mut Ctr, exit_code: i32) {
        c.ready = false;
        c.rec.process = None;
        let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
        if !restarts(policy, exit_code) {
            c.rec.done = true;
            c.waiting = None;
            return;
        }
        // A container that ran for a while starts its back-off over (kubelet: 10 minutes).
        let ran = c.rec.started_at.map(|s| Timestamp::now().duration_since(s).as_secs()).unwrap_or(0);
        if ran > 600 {
            c.backoff = self.cfg.backoff_base;
        }
        let delay = c.backoff;
        c.backoff = (c.backoff * 2).min(self.cfg.backoff_max);
        c.next_start = Some(Instant::now() + delay);
        c.waiting = Some((
            "CrashLoopBackOff".into(),
            Some(format!(
                "back-off {}s restarting failed container={} pod={}_{}({})",
                delay.as_secs(),
                c.spec.name,
                pod.metadata.name.as_deref().unwrap_or(""),
                pod.metadata.namespace.as_deref().unwrap_or("default"),
                uid(pod)
            )),
        ));
    }

    /// One probe or handler: exec runs in the pod's namespaces (killed at `timeout`); the others
    /// go to the prober.
    async fn run_check(&self, check: &Check, timeout: Duration) -> bool {
        match check {
            Check::Exec { argv } => {
                let spec = ProcSpec { argv: argv.clone(), env: vec![], log: None };
                match self.procs.spawn(&spec).await {
                    Ok(p) => match tokio::time::timeout(timeout, self.procs.wait(p)).await {
                        Ok(exit) => exit == Exit::Code(0),
                        Err(_) => {
                            self.procs.signal(p, Sig::Kill);
                            false
                        }
                    },
                    Err(_) => false,
                }
            }
            other => self.prober.probe(other, timeout).await,
        }
    }

    /// Runs a container's preStop handler, as kubelet does before SIGTERM, within `deadline`
    /// (the pod's grace period). Its outcome does not matter: termination goes on regardless.
    async fn run_pre_stop(&self, pod_key: &str, container: &str, hook: &PreStop, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let finished = match hook {
            PreStop::Sleep(d) => {
                tokio::time::sleep((*d).min(left)).await;
                *d <= left
            }
            PreStop::Check(check) => self.run_check(check, left).await,
        };
        if !finished {
            tracing::warn!(pod = %pod_key, container, "preStop hook failed or ran out of the grace period");
        }
    }

    async fn run_probes(&self, c: &mut Ctr) {
        let r = &mut c.readiness;
        let now = Instant::now();
        if c.rec.process.is_none() || r.next.is_none_or(|n| n > now) {
            return;
        }
        let mut ok = true;
        for check in &r.checks {
            if !self.run_check(check, r.timeout).await {
                ok = false;
                break;
            }
        }
        if ok {
            r.successes += 1;
            r.failures = 0;
            if r.successes >= r.success_threshold {
                c.ready = true;
            }
        } else {
            r.failures += 1;
            r.successes = 0;
            if r.failures >= r.failure_threshold || !c.ready {
                c.ready = false;
            }
        }
        r.next = Some(Instant::now() + if !r.explicit && !c.ready { DEFAULT_PROBE_RETRY } else { r.period });
    }
}

fn watch_exit<P: Processes, E: PluginExec, A: PodApi, Q: Prober>(
    deps: &Arc<Deps<P, E, A, Q>>,
    name: String,
    p: ProcId,
    tx: mpsc::UnboundedSender<ExitMsg>,
) {
    let deps = deps.clone();
    tokio::spawn(async move {
        let exit = deps.procs.wait(p).await;
        let _ = tx.send((name, p, exit));
    });
}

fn view_of(cfg: &PodsConfig, rec: Option<&PodRecord>, ctrs: &[Ctr]) -> PodView {
    PodView {
        sandbox_ready: rec.is_some(),
        pod_ips: rec.map(|r| r.pod_ips.clone()).unwrap_or_default(),
        host_ip: cfg.node_ip,
        start_time: rec.map(|r| r.start_time).unwrap_or_else(Timestamp::now),
        containers: ctrs.iter().map(Ctr::view).collect(),
    }
}

fn deleting(pod: &Option<core::Pod>) -> bool {
    pod.as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

/// The worker of one pod: runs it until it is deleted, then cleans up and deletes it for good.
pub async fn pod_worker<P: Processes, E: PluginExec, A: PodApi, Q: Prober>(
    deps: Arc<Deps<P, E, A, Q>>,
    mut pod_rx: watch::Receiver<Option<core::Pod>>,
    record: Option<PodRecord>,
) {
    let Some(mut pod) = pod_rx.borrow_and_update().clone() else { return };
    let cfg = &deps.cfg;
    let pod_key = key(&pod);
    let mut last_status: Option<core::PodStatus> = None;
    let mut status_retry: Option<Instant> = None;

    let terminal = matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
    let mut rec: Option<PodRecord> = match record {
        Some(r) if deps.procs.alive(r.sandbox) => Some(r),
        Some(r) => {
            // The sandbox died while the agent was away (e.g. a reboot): release and redo.
            tracing::warn!(pod = %pod_key, "sandbox {} is gone; recreating the pod's sandbox", r.sandbox.pid);
            if let Err(e) = deps.teardown_record(&r).await {
                tracing::warn!(pod = %pod_key, "cleaning up the old sandbox: {e}");
            }
            None
        }
        None => None,
    };
    let specs: Vec<core::Container> = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
    let mut ctrs: Vec<Ctr> = specs
        .into_iter()
        .map(|spec| {
            let crec = rec.as_ref().and_then(|r| r.containers.get(&spec.name).cloned()).unwrap_or_default();
            Ctr {
                spec,
                rec: crec,
                waiting: None,
                ready: false,
                readiness: readiness(
                    &core::Container::default(),
                    None,
                    ProcId { pid: 0, start_time: 0 },
                    &cfg.workload_bin,
                ),
                next_start: None,
                backoff: cfg.backoff_base,
            }
        })
        .collect();
    let (exit_tx, mut exit_rx) = mpsc::unbounded_channel::<ExitMsg>();

    // Adopt the processes that are still running; the others ended while the agent was away.
    if let Some(r) = &rec {
        for c in &mut ctrs {
            match c.rec.process {
                Some(p) if deps.procs.alive(p) => {
                    c.readiness = readiness(&c.spec, r.pod_ips.first().copied(), r.sandbox, &cfg.workload_bin);
                    c.readiness.next = Some(Instant::now());
                    watch_exit(&deps, c.spec.name.clone(), p, exit_tx.clone());
                }
                Some(p) => {
                    c.rec.last = Some(Terminated {
                        exit_code: Exit::Unknown.code(),
                        signal: None,
                        reason: "Unknown".into(),
                        message: Some("the container ended while the node agent was not running".into()),
                        started_at: c.rec.started_at,
                        finished_at: Timestamp::now(),
                        container_id: Some(format!("podpath://{}", p.pid)),
                    });
                    deps.after_exit(&pod, c, Exit::Unknown.code());
                    c.next_start = Some(Instant::now());
                }
                None if !c.rec.done => c.next_start = Some(Instant::now()),
                None => {}
            }
        }
    } else if !terminal {
        for c in &mut ctrs {
            c.next_start = Some(Instant::now());
        }
    }
    let mut sandbox_retry = if rec.is_none() && !terminal { Some(Instant::now()) } else { None };
    let mut sandbox_backoff = Duration::from_millis(500);

    'run: loop {
        if deleting(&pod_rx.borrow()) {
            break 'run;
        }
        // The sandbox first.
        if rec.is_none() && sandbox_retry.is_some_and(|t| t <= Instant::now()) {
            match deps.create_sandbox(&pod).await {
                Ok(r) => {
                    tracing::info!(pod = %pod_key, ip = ?r.pod_ips, sandbox = r.sandbox.pid, "pod network ready");
                    rec = Some(r);
                    sandbox_retry = None;
                }
                Err(e) => {
                    tracing::warn!(pod = %pod_key, "cannot create the pod sandbox: {e}");
                    deps.metrics.sync_error("sandbox");
                    for c in &mut ctrs {
                        c.waiting =
                            Some(("ContainerCreating".into(), Some(format!("failed to set up the pod network: {e}"))));
                    }
                    sandbox_retry = Some(Instant::now() + sandbox_backoff);
                    sandbox_backoff = (sandbox_backoff * 2).min(Duration::from_secs(30));
                }
            }
        }
        if let Some(r) = rec.as_mut() {
            let now = Instant::now();
            for c in &mut ctrs {
                if c.rec.process.is_none() && c.next_start.is_some_and(|t| t <= now) {
                    deps.start_container(&pod, r, c, &exit_tx, &deps).await;
                }
            }
            for c in &mut ctrs {
                deps.run_probes(c).await;
            }
        }
        deps.metrics.set_running(&pod_key, ctrs.iter().any(|c| c.rec.process.is_some()));

        // Report.
        let status = podstatus::pod_status(&pod, &view_of(cfg, rec.as_ref(), &ctrs), Timestamp::now());
        if last_status.as_ref() != Some(&status) && status_retry.is_none_or(|t| t <= Instant::now()) {
            let mut update = pod.clone();
            update.metadata.resource_version = None;
            update.status = Some(status.clone());
            match deps.api.update_status(&update).await {
                Ok(()) => {
                    pod.status = Some(status.clone());
                    last_status = Some(status);
                    status_retry = None;
                }
                Err(e) => {
                    tracing::warn!(pod = %pod_key, "status update failed: {e}");
                    deps.metrics.sync_error("status");
                    status_retry = Some(Instant::now() + Duration::from_secs(1));
                }
            }
        }

        let deadline = ctrs
            .iter()
            .flat_map(|c| {
                [c.next_start, c.readiness.next.filter(|_| c.rec.process.is_some() && !c.readiness.checks.is_empty())]
            })
            .chain([sandbox_retry.filter(|_| rec.is_none()), status_retry])
            .flatten()
            .min();
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = pod_rx.changed() => {
                if changed.is_err() {
                    break 'run;
                }
                if let Some(p) = pod_rx.borrow_and_update().clone() {
                    // Keep our view of the status (the API echoes it back).
                    let status = pod.status.take();
                    pod = p;
                    pod.status = status;
                }
            }
            Some((name, p, exit)) = exit_rx.recv() => {
                if let Some(c) = ctrs.iter_mut().find(|c| c.spec.name == name && c.rec.process == Some(p)) {
                    let code = exit.code();
                    let signal = match exit { Exit::Signal(s) => Some(s), _ => None };
                    tracing::info!(pod = %pod_key, container = %name, exit_code = code, "container exited");
                    c.rec.last = Some(Terminated {
                        exit_code: code,
                        signal,
                        reason: if exit == Exit::Unknown { "Unknown".into() } else { Terminated::reason_for(code).into() },
                        message: None,
                        started_at: c.rec.started_at,
                        finished_at: Timestamp::now(),
                        container_id: Some(format!("podpath://{}", p.pid)),
                    });
                    deps.after_exit(&pod, c, code);
                    if let Some(r) = rec.as_mut() {
                        r.containers.insert(c.spec.name.clone(), c.rec.clone());
                        if let Err(e) = save_record(cfg, r) {
                            tracing::warn!(pod = %pod_key, "{e}");
                        }
                    }
                }
            }
            _ = sleep => {}
        }
    }

    // Termination: SIGTERM, grace period, SIGKILL, CNI DEL, sandbox, record, final delete.
    let current = pod_rx.borrow().clone();
    let grace = current
        .as_ref()
        .and_then(|p| p.metadata.deletion_grace_period_seconds)
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30)
        .max(0) as u64;
    let mut running: HashSet<ProcId> = ctrs.iter().filter_map(|c| c.rec.process).collect();
    let deadline = Instant::now() + Duration::from_secs(grace);
    // preStop handlers first, all containers at once, inside the grace period: this is what
    // gives the Service's other nodes time to stop sending new connections here.
    if let Some(r) = rec.as_ref().filter(|_| current.is_some()) {
        let hooks = ctrs.iter().filter(|c| c.rec.process.is_some_and(|p| deps.procs.alive(p))).filter_map(|c| {
            pre_stop(&c.spec, r.pod_ips.first().copied(), r.sandbox, &cfg.workload_bin)
                .map(|h| (c.spec.name.clone(), h))
        });
        let hooks: Vec<(String, PreStop)> = hooks.collect();
        futures::future::join_all(hooks.iter().map(|(name, h)| deps.run_pre_stop(&pod_key, name, h, deadline))).await;
    }
    for p in &running {
        deps.procs.signal(*p, Sig::Term);
    }
    while !running.is_empty() {
        tokio::select! {
            Some((_, p, _)) = exit_rx.recv() => { running.remove(&p); }
            _ = tokio::time::sleep_until(deadline) => {
                for p in &running {
                    deps.procs.signal(*p, Sig::Kill);
                }
                while !running.is_empty() {
                    match exit_rx.recv().await {
                        Some((_, p, _)) => { running.remove(&p); }
                        None => break,
                    }
                }
            }
        }
    }
    deps.metrics.set_running(&pod_key, false);
    if let Some(r) = &rec {
        let mut delay = Duration::from_millis(200);
        loop {
            match deps.release(r).await {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(pod = %pod_key, "releasing the pod network failed (retrying): {e}");
                    deps.metrics.sync_error("cni-del");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        }
    }
    if current.is_some() {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        if let Err(e) = deps.api.delete(&ns, &name, &uid(&pod)).await {
            tracing::warn!(pod = %pod_key, "final delete failed: {e}");
        }
    }
    tracing::info!(pod = %pod_key, "pod stopped and removed");
}

/// Runs a worker per pod of this node, adopting what an earlier agent left running, tearing down
/// pods that were deleted while it was away and releasing stale network attachments (CNI GC).
pub async fn run_pods<P: Processes, E: PluginExec, A: PodApi, Q: Prober>(
    deps: Arc<Deps<P, E, A, Q>>,
    store: Arc<Store<core::Pod>>,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
) {
    store.wait_synced().await;
    let pods: HashMap<String, core::Pod> = store.list().into_iter().map(|p| (uid(&p), p)).collect();
    let mut records: HashMap<String, PodRecord> = HashMap::new();
    for r in load_records(&deps.cfg.state_dir) {
        if pods.contains_key(&r.uid) {
            records.insert(r.uid.clone(), r);
        } else {
            tracing::info!(pod = %format!("{}/{}", r.namespace, r.name), "pod was deleted while the agent was away; cleaning up");
            if let Err(e) = deps.teardown_record(&r).await {
                tracing::warn!("cleanup of {}: {e}", r.name);
            }
        }
    }
    let keep: BTreeSet<String> = records.keys().cloned().collect();
    if let Err(e) = deps.cni.gc(&deps.network, &keep).await {
        tracing::warn!("CNI GC: {e}");
        deps.metrics.sync_error("cni-gc");
    }
    if let Some(r) = ready {
        let _ = r.send(());
    }

    let mut workers: HashMap<String, watch::Sender<Option<core::Pod>>> = HashMap::new();
    let mut finished: HashSet<String> = HashSet::new();
    // Owned here, so stopping the manager stops every worker (as the agent's exit does).
    let mut tasks: tokio::task::JoinSet<String> = tokio::task::JoinSet::new();
    let mut changes = store.changes();
    loop {
        let pods: HashMap<String, core::Pod> = store.list().into_iter().map(|p| (uid(&p), p)).collect();
        for (id, pod) in &pods {
            if let Some(tx) = workers.get(id) {
                let pod = pod.clone();
                tx.send_if_modified(|old| {
                    let changed = old.as_ref().map(|o| &o.metadata) != Some(&pod.metadata);
                    *old = Some(pod);
                    changed
                });
            } else if !finished.contains(id) {
                let (tx, rx) = watch::channel(Some(pod.clone()));
                workers.insert(id.clone(), tx);
                let deps = deps.clone();
                let id = id.clone();
                let record = records.remove(&id);
                tasks.spawn(async move {
                    pod_worker(deps, rx, record).await;
                    id
                });
            }
        }
        for (id, tx) in &workers {
            if !pods.contains_key(id) {
                tx.send_replace(None);
            }
        }
        finished.retain(|id| pods.contains_key(id));
        tokio::select! {
            r = changes.changed() => if r.is_err() { return },
            Some(done) = tasks.join_next() => {
                match done {
                    Ok(id) => {
                        workers.remove(&id);
                        finished.insert(id);
                    }
                    Err(e) => tracing::error!("a pod worker failed: {e}"),
                }
            }
        }
    }
}

/// Probes over the network from the node (like kubelet: TCP connect, or an HTTP GET whose
/// status is 200–399).
pub struct NetProber;

impl Prober for NetProber {
    async fn probe(&self, check: &Check, timeout: Duration) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let attempt = async {
            match check {
                Check::Tcp(addr) => tokio::net::TcpStream::connect(addr).await.is_ok(),
                Check::Http { addr, path, host, headers } => {
                    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { return false };
                    let mut req = format!(
                        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n",
                        host.clone().unwrap_or_else(|| addr.to_string())
                    );
                    for (k, v) in headers {
                        req.push_str(&format!("{k}: {v}\r\n"));
                    }
                    req.push_str("\r\n");
                    if s.write_all(req.as_bytes()).await.is_err() {
                        return false;
                    }
                    let mut buf = [0u8; 32];
                    let mut n = 0;
                    while n < 12 {
                        match s.read(&mut buf[n..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k,
                        }
                    }
                    let line = String::from_utf8_lossy(&buf[..n]);
                    line.split_whitespace()
                        .nth(1)
                        .and_then(|c| c.parse::<u16>().ok())
                        .is_some_and(|c| (200..400).contains(&c))
                }
                Check::Exec { .. } => false,
            }
        };
        tokio::time::timeout(timeout, attempt).await.unwrap_or(false)
    }
}
