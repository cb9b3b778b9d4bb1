//! Pods of this node: one worker per pod (like kubelet's pod workers) that creates the sandbox
//! and attaches it to the network through CNI, runs the containers' workloads, probes them,
//! restarts them with back-off, reports status, and tears everything down on deletion.
//!
//! - `worker`: one pod's life, in phases (adopt, run, terminate); its sandbox;
//! - `container`: one container's life inside it (start, exit and restart, probes, preStop);
//! - `launch`: what a container runs and how it is checked (pure but for a `PATH` lookup);
//! - `record`: what survives an agent restart;
//! - `net`: the real [`PodApi`] (gRPC) and [`Prober`] (the network).
//!
//! All kernel and API side effects go through [`Processes`], [`PluginExec`], [`PodApi`] and
//! [`Prober`], so the logic is unit-tested with fakes. What the agent must remember across a
//! restart (sandbox and workload PIDs, IPs, restart counts) is a JSON record per pod in
//! `<state-dir>/pods/`; a restarted agent adopts those processes instead of starting new ones.

mod container;
pub mod dnsconf;
pub mod envvars;
mod imagectr;
mod launch;
mod net;
mod record;
mod worker;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use podpath_client::events::{Recorder, Report};
use podpath_client::reflector::Store;
use tokio::sync::watch;

use crate::cni::{CniRuntime, Network, PluginExec};
use crate::error::Result;
use crate::metrics::Metrics;
use crate::process::Processes;

pub use launch::{find_program, join_prefix, launch, pre_stop, workload_env, Launch, PreStop};
pub use net::NetProber;
pub use record::{kill_recorded_processes, load_records, ContainerRecord, PodRecord};
pub use worker::pod_worker;

/// The interface name pods get.
pub const POD_IFNAME: &str = "eth0";

/// Whether an image is the built-in echo server.
pub fn is_echo_image(image: &str) -> bool {
    image_name(image) == "podpath/echo"
}

/// The built-in cluster DNS server (`podpath-dns`), CoreDNS's role.
pub fn is_dns_image(image: &str) -> bool {
    image_name(image) == "podpath/dns"
}

/// The default command of the base images that have no ENTRYPOINT (busybox, alpine, debian,
/// ubuntu): run on the node's programs, as their `CMD`. With `args` and no `command`, Docker
/// runs the args alone (no entrypoint to prepend), so `kubectl run x --image=busybox -- sleep
/// 3600` runs `sleep 3600` here as in a cluster.
pub fn base_image_cmd(image: &str) -> Option<&'static str> {
    match image_name(image).strip_prefix("library/").unwrap_or(image_name(image)) {
        "busybox" => Some("sh"),
        "alpine" => Some("/bin/sh"),
        "debian" | "ubuntu" => Some("bash"),
        _ => None,
    }
}

/// An image reference without registry prefix `docker.io/`, tag and digest.
fn image_name(image: &str) -> &str {
    let name = image.strip_prefix("docker.io/").unwrap_or(image);
    let name = name.split('@').next().unwrap_or(name);
    name.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')).map_or(name, |(n, _)| n)
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

/// Runs checks (the real one connects; tests fake it). A failure says why, in kubelet's words
/// (`HTTP probe failed with statuscode: 500`): it becomes the `Unhealthy` event's message.
pub trait Prober: Send + Sync + 'static {
    fn probe(&self, check: &Check, timeout: Duration) -> impl Future<Output = std::result::Result<(), String>> + Send;
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
    fn probe(&self, check: &Check, timeout: Duration) -> impl Future<Output = std::result::Result<(), String>> + Send {
        (**self).probe(check, timeout)
    }
}

/// Settings of the pod workers.
#[derive(Debug, Clone)]
pub struct PodsConfig {
    pub node_name: String,
    pub node_ip: IpAddr,
    /// Every InternalIP of the node (a pod's `status.hostIPs`), primary first.
    pub node_ips: Vec<IpAddr>,
    pub state_dir: PathBuf,
    /// `podpath-workload`.
    pub workload_bin: PathBuf,
    /// The API access flags a `podpath/dns` pod's server gets (the agent's own).
    pub api_args: Vec<String>,
    /// kubelet's `--cluster-dns` (empty: `ClusterFirst` pods use the node's resolver).
    pub cluster_dns: Vec<String>,
    /// kubelet's `--cluster-domain`.
    pub cluster_domain: String,
    /// The node's resolver settings (`Default` pods, and the search domains ClusterFirst adds).
    pub host_resolv: dnsconf::HostResolv,
    /// First restart delay of a crashed container (doubles up to `backoff_max`).
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Containers of images (None: every container is a process on the node, as before images).
    pub images: Option<crate::images::Images>,
    /// What `serviceAccountToken` projections write: the token the node's components use (the
    /// lab has one identity).
    pub service_account_token: Option<String>,
}

impl PodsConfig {
    fn records_dir(&self) -> PathBuf {
        self.state_dir.join("pods")
    }
    fn record_path(&self, uid: &str) -> PathBuf {
        self.records_dir().join(format!("{uid}.json"))
    }
    /// The Unix socket of a container's console (containers with `stdin` or `tty`), or None when
    /// the state directory is too deep for a socket path (108 bytes).
    pub fn attach_socket(&self, uid: &str, container: &str) -> Option<PathBuf> {
        use sha2::Digest;
        let hash = sha2::Sha256::digest(format!("{uid}/{container}").as_bytes());
        let name: String = hash.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let p = self.state_dir.join("attach").join(format!("{name}.sock"));
        (p.as_os_str().len() < 108).then_some(p)
    }
    /// Where a pod's `resolv.conf` and `hosts` are kept (mounted into its mount namespace).
    pub fn pod_etc_dir(&self, uid: &str) -> PathBuf {
        self.state_dir.join("etc").join(uid)
    }
    /// Where a pod's logs go (kubelet's `/var/log/pods/NS_NAME_UID`).
    pub fn pod_log_dir(&self, namespace: &str, name: &str, uid: &str) -> PathBuf {
        self.state_dir.join("logs").join(format!("{namespace}_{name}_{uid}"))
    }
    /// The log of a container's `attempt` (0, then its restart count), kubelet's
    /// `CONTAINER/N.log`.
    pub fn log_path(&self, namespace: &str, name: &str, uid: &str, container: &str, attempt: i32) -> PathBuf {
        self.pod_log_dir(namespace, name, uid).join(container).join(format!("{attempt}.log"))
    }
    /// Where a pod's volumes are (one directory each).
    pub fn pod_volumes_dir(&self, uid: &str) -> PathBuf {
        self.state_dir.join("volumes").join(uid)
    }
    /// Where a pod's container bundles are (one per container and attempt).
    pub fn pod_containers_dir(&self, uid: &str) -> PathBuf {
        self.state_dir.join("containers").join(uid)
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
    /// kubelet's events about the pods.
    pub events: Recorder,
    /// The cluster's Services, for the containers' Service variables.
    pub services: Arc<Store<envvars::ServiceLink>>,
    /// Secrets and ConfigMaps: volumes, and `imagePullSecrets`.
    pub secrets: Arc<Store<core::Secret>>,
    pub config_maps: Arc<Store<core::ConfigMap>>,
    /// Claims and volumes: the pods' persistentVolumeClaim volumes.
    pub claims: Arc<Store<core::PersistentVolumeClaim>>,
    pub volumes: Arc<Store<core::PersistentVolume>>,
}

impl<P, E, A, Q> Deps<P, E, A, Q> {
    /// Reports an event about `pod` (and one of its containers).
    fn event(&self, pod: &core::Pod, container: Option<&str>, warning: bool, reason: &'static str, message: String) {
        self.events.emit(Report {
            kind: api::proto::Kind::Pod,
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid(pod),
            resource_version: pod.metadata.resource_version.clone().unwrap_or_default(),
            field_path: container.map(|c| format!("spec.containers{{{c}}}")),
            warning,
            reason,
            message,
        });
    }
}

/// `namespace/name` of a pod, for logs.
fn key(pod: &core::Pod) -> String {
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or("default"), pod.metadata.name.as_deref().unwrap_or(""))
}

fn uid(pod: &core::Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
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
