//! One pod's worker, in phases: [`Worker::adopt`] (the processes an earlier agent left, or a new
//! start), [`Worker::step`] (sandbox, containers, probes, status report) until the pod is
//! deleted, and [`Worker::terminate`] (preStop, SIGTERM, grace period, SIGKILL, CNI DEL, the
//! final delete).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::container::{Ctr, ExitMsg};
use super::launch::{join_prefix, pre_stop, readiness, PreStop};
use super::record::{save_record, PodRecord};
use super::{dnsconf, key, uid, Deps, PodApi, PodsConfig, Prober, POD_IFNAME};
use podpath_cni_spec::env::Command;

use crate::cni::{self, Attachment, PluginExec};
use crate::error::{KubeletError, Result};
use crate::podstatus::{self, PodView, Terminated};
use crate::process::{netns_path, Exit, ProcId, Processes, SandboxFiles, Sig};

/// The longest grace period the agent waits out (int64 seconds are valid in the API; a deadline
/// past the clock's range cannot be computed): a year.
const MAX_GRACE_SECONDS: i64 = 365 * 24 * 3600;

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
        let log = self.cfg.pod_log_dir(&ns, &name, &uid(pod)).join("sandbox.log");
        // The pod's resolver and hosts files, mounted by the sandbox in its own mount
        // namespace; `hosts` gets the pod's IPs after CNI, rewritten in place (same inode, so
        // the mount shows it).
        let etc = self.cfg.pod_etc_dir(&uid(pod));
        let files = SandboxFiles { resolv_conf: etc.join("resolv.conf"), hosts: etc.join("hosts") };
        let resolv = dnsconf::resolv_conf(pod, &self.cfg.cluster_dns, &self.cfg.cluster_domain, &self.cfg.host_resolv);
        let write = |path: &std::path::Path, text: &str| {
            std::fs::create_dir_all(&etc)
                .and_then(|_| std::fs::write(path, text))
                .map_err(|e| KubeletError::io(format!("write {}", path.display()), e))
        };
        write(&files.resolv_conf, &resolv)?;
        write(&files.hosts, &dnsconf::hosts_file(pod, &[], &self.cfg.cluster_domain))?;
        let share_pid = pod.spec.as_ref().and_then(|s| s.share_process_namespace) == Some(true);
        // The pod's hostname: `spec.hostname` when set (an Indexed Job's pods, a StatefulSet's),
        // else its name — at most 63 characters, as kubelet cuts it.
        let hostname = pod.spec.as_ref().and_then(|s| s.hostname.clone()).filter(|h| !h.is_empty());
        let hostname = hostname.unwrap_or_else(|| name.clone());
        let hostname: String = hostname.chars().take(63).collect();
        let hostname = hostname.trim_end_matches(['-', '.']).to_string();
        let sandbox = self.procs.start_sandbox(&hostname, Some(files.clone()), share_pid, Some(log)).await?;
        // Recorded at once, not attached yet (no address): whatever stops the node now (`down`,
        // `--kill-pods`) finds the sandbox; a restarted agent releases such a record and
        // starts over.
        let mut rec = PodRecord {
            uid: uid(pod),
            namespace: ns.clone(),
            name: name.clone(),
            sandbox,
            pod_ips: vec![],
            start_time: Timestamp::now(),
            containers: BTreeMap::new(),
        };
        if let Err(e) = save_record(&self.cfg, &rec) {
            self.procs.signal(sandbox, Sig::Kill);
            self.procs.wait(sandbox).await;
            return Err(e);
        }
        let att = self.attachment(&ns, &name, &uid(pod), Some(sandbox));
        let started = std::time::Instant::now();
        let result = self.cni.add(&self.network, &att).await;
        self.metrics.observe_cni(Command::Add, started.elapsed(), result.is_ok());
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                self.procs.signal(sandbox, Sig::Kill);
                self.procs.wait(sandbox).await;
                let _ = std::fs::remove_file(self.cfg.record_path(&rec.uid));
                return Err(e);
            }
        };
        let pod_ips = cni::result_ips(&result);
        let ips: Vec<String> = pod_ips.iter().map(|i| i.to_string()).collect();
        write(&files.hosts, &dnsconf::hosts_file(pod, &ips, &self.cfg.cluster_domain))?;
        rec.pod_ips = pod_ips;
        rec.start_time = Timestamp::now();
        save_record(&self.cfg, &rec)?;
        Ok(rec)
    }

    /// Removes a pod's network attachment, sandbox, record and logs (processes already gone).
    async fn release(&self, rec: &PodRecord) -> Result<()> {
        let sandbox = self.procs.alive(rec.sandbox).then_some(rec.sandbox);
        let att = self.attachment(&rec.namespace, &rec.name, &rec.uid, sandbox);
        let started = std::time::Instant::now();
        let r = self.cni.del(&self.network, &att).await;
        self.metrics.observe_cni(Command::Del, started.elapsed(), r.is_ok());
        r?;
        self.procs.signal(rec.sandbox, Sig::Kill);
        self.procs.wait(rec.sandbox).await;
        let _ = std::fs::remove_dir_all(
            self.cfg.state_dir.join("logs").join(format!("{}_{}_{}", rec.namespace, rec.name, rec.uid)),
        );
        let _ = std::fs::remove_dir_all(self.cfg.pod_etc_dir(&rec.uid));
        // A container may outlive a monitor that was killed (found at start-up): the runtime
        // kills it before its bundle goes.
        if let Some(images) = &self.cfg.images {
            for c in rec.containers.values() {
                if let Some(id) = &c.runtime_id {
                    images.delete_container(id).await;
                }
            }
        }
        // Containers' bundles (writable layers) and the leases on their images' layers; the
        // volumes (a memory-backed one unmounted first).
        let _ = std::fs::remove_dir_all(self.cfg.pod_containers_dir(&rec.uid));
        let volumes = self.cfg.pod_volumes_dir(&rec.uid);
        if let Ok(entries) = std::fs::read_dir(&volumes) {
            for e in entries.flatten() {
                let _ = nix::mount::umount2(&e.path(), nix::mount::MntFlags::MNT_DETACH);
            }
        }
        let _ = std::fs::remove_dir_all(&volumes);
        if let Some(images) = &self.cfg.images {
            for name in rec.containers.keys() {
                images.store.release(&format!("{}-{name}", rec.uid));
            }
        }
        match std::fs::remove_file(self.cfg.record_path(&rec.uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(KubeletError::io("remove a pod record", e)),
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
}

/// Sends a container's exit once its process ends; an image container is deleted from the
/// runtime first, so nothing of it runs when the exit is handled (a restart binds its ports).
pub(super) fn watch_exit<P: Processes, E: PluginExec, A: PodApi, Q: Prober>(
    deps: &Arc<Deps<P, E, A, Q>>,
    name: String,
    p: ProcId,
    runtime_id: Option<String>,
    tx: mpsc::UnboundedSender<ExitMsg>,
) {
    let deps = deps.clone();
    tokio::spawn(async move {
        let exit = deps.procs.wait(p).await;
        if let (Some(id), Some(images)) = (runtime_id, &deps.cfg.images) {
            images.delete_container(&id).await;
        }
        let _ = tx.send((name, p, exit));
    });
}

fn view_of(cfg: &PodsConfig, rec: Option<&PodRecord>, ctrs: &[Ctr]) -> PodView {
    PodView {
        sandbox_ready: rec.is_some(),
        pod_ips: rec.map(|r| r.pod_ips.clone()).unwrap_or_default(),
        host_ips: if cfg.node_ips.is_empty() { vec![cfg.node_ip] } else { cfg.node_ips.clone() },
        start_time: rec.map(|r| r.start_time).unwrap_or_else(Timestamp::now),
        containers: ctrs.iter().map(Ctr::view).collect(),
    }
}

/// The pod's ephemeral containers, as containers.
fn ephemeral_specs(pod: &core::Pod) -> Vec<core::Container> {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_ref())
        .map(|es| es.iter().map(super::container::ephemeral_as_container).collect())
        .unwrap_or_default()
}

/// The PID namespace of the container `target` of the pod (its process, from the runtime's PID
/// file when it is an image's), for an ephemeral container that names it.
fn target_pid_ns(ctrs: &[Ctr], target: &str) -> Option<String> {
    let t = ctrs.iter().find(|c| c.spec.name == target && !c.ephemeral)?;
    let pid = match &t.rec.pid_file {
        Some(f) => std::fs::read_to_string(f).ok()?.trim().parse::<i32>().ok()?,
        None => t.rec.process?.pid,
    };
    Some(format!("/proc/{pid}/ns/pid"))
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
    let Some(pod) = pod_rx.borrow_and_update().clone() else { return };
    let mut w = Worker::adopt(deps, pod, record).await;
    while !deleting(&pod_rx.borrow()) {
        w.step().await;
        if !w.wait(&mut pod_rx).await {
            break;
        }
    }
    let current = pod_rx.borrow().clone();
    w.terminate(current).await;
}

/// One pod as its worker runs it.
struct Worker<P, E, A, Q> {
    deps: Arc<Deps<P, E, A, Q>>,
    /// The pod as last seen, with the status this worker last reported.
    pod: core::Pod,
    pod_key: String,
    /// The sandbox and what is recorded of it (None until it exists).
    rec: Option<PodRecord>,
    ctrs: Vec<Ctr>,
    exit_tx: mpsc::UnboundedSender<ExitMsg>,
    exit_rx: mpsc::UnboundedReceiver<ExitMsg>,
    last_status: Option<core::PodStatus>,
    status_retry: Option<Instant>,
    sandbox_retry: Option<Instant>,
    sandbox_backoff: Duration,
}

impl<P: Processes, E: PluginExec, A: PodApi, Q: Prober> Worker<P, E, A, Q> {
    /// Takes over what an earlier agent left: a live sandbox and the containers still running
    /// (the others ended while the agent was away, and restart as their policy says); a dead
    /// sandbox is released and made anew.
    async fn adopt(deps: Arc<Deps<P, E, A, Q>>, pod: core::Pod, record: Option<PodRecord>) -> Self {
        let pod_key = key(&pod);
        let terminal = matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"));
        let rec: Option<PodRecord> = match record {
            Some(r) if deps.procs.alive(r.sandbox) && !r.pod_ips.is_empty() => Some(r),
            Some(r) => {
                // The sandbox died while the agent was away (e.g. a reboot), or the agent
                // stopped before it was attached: release and redo.
                tracing::warn!(pod = %pod_key, "sandbox {} is gone or was never attached; recreating the pod's sandbox", r.sandbox.pid);
                if let Err(e) = deps.teardown_record(&r).await {
                    tracing::warn!(pod = %pod_key, "cleaning up the old sandbox: {e}");
                }
                None
            }
            None => None,
        };
        let mut specs: Vec<(core::Container, bool)> =
            pod.spec.as_ref().map(|s| s.containers.iter().map(|c| (c.clone(), false)).collect()).unwrap_or_default();
        specs.extend(ephemeral_specs(&pod).into_iter().map(|c| (c, true)));
        let mut ctrs: Vec<Ctr> = specs
            .into_iter()
            .map(|(spec, ephemeral)| {
                let crec = rec.as_ref().and_then(|r| r.containers.get(&spec.name).cloned()).unwrap_or_default();
                Ctr::new(spec, crec, deps.cfg.backoff_base, ephemeral)
            })
            .collect();
        let (exit_tx, exit_rx) = mpsc::unbounded_channel::<ExitMsg>();
        if let Some(r) = &rec {
            for c in &mut ctrs {
                match c.rec.process {
                    Some(p) if deps.procs.alive(p) => {
                        let join = join_prefix(&deps.cfg.workload_bin, r.sandbox, c.rec.pid_file.as_deref());
                        c.readiness = readiness(&c.spec, r.pod_ips.first().copied(), &join);
                        c.readiness.next = Some(Instant::now());
                        watch_exit(&deps, c.spec.name.clone(), p, c.rec.runtime_id.clone(), exit_tx.clone());
                    }
                    Some(p) => {
                        if let (Some(id), Some(images)) = (&c.rec.runtime_id, &deps.cfg.images) {
                            images.delete_container(id).await;
                        }
                        c.rec.last = Some(Terminated {
                            exit_code: Exit::Unknown.code(),
                            signal: None,
                            reason: "Unknown".into(),
                            message: Some("the container ended while the node agent was not running".into()),
                            started_at: c.rec.started_at,
                            finished_at: Timestamp::now(),
                            container_id: Some(match &c.rec.runtime_id {
                                Some(id) => format!("crun://{id}"),
                                None => format!("podpath://{}", p.pid),
                            }),
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
        let sandbox_retry = if rec.is_none() && !terminal { Some(Instant::now()) } else { None };
        Worker {
            deps,
            pod,
            pod_key,
            rec,
            ctrs,
            exit_tx,
            exit_rx,
            last_status: None,
            status_retry: None,
            sandbox_retry,
            sandbox_backoff: Duration::from_millis(500),
        }
    }

    /// What is due now: the sandbox (with back-off), containers to start, probes, and the
    /// status report when it changed.
    async fn step(&mut self) {
        if self.rec.is_none() && self.sandbox_retry.is_some_and(|t| t <= Instant::now()) {
            self.create_sandbox().await;
        }
        let Worker { deps, pod, rec, ctrs, exit_tx, .. } = self;
        if let Some(r) = rec.as_mut() {
            let now = Instant::now();
            // An ephemeral container with a target joins the target's PID namespace.
            let targets: Vec<(usize, Option<String>)> = ctrs
                .iter()
                .enumerate()
                .filter(|(_, c)| c.ephemeral && c.rec.process.is_none() && c.pid_ns.is_none())
                .filter_map(|(i, c)| {
                    let e = pod.spec.as_ref()?.ephemeral_containers.as_ref()?.iter().find(|e| e.name == c.spec.name)?;
                    Some((i, target_pid_ns(ctrs, e.target_container_name.as_deref()?)))
                })
                .collect();
            for (i, ns) in targets {
                ctrs[i].pid_ns = ns;
            }
            for c in ctrs.iter_mut() {
                if c.rec.process.is_none() && c.next_start.is_some_and(|t| t <= now) {
                    deps.start_container(pod, r, c, exit_tx, deps).await;
                }
            }
            for c in ctrs.iter_mut() {
                deps.run_probes(pod, c).await;
            }
        }
        self.deps.metrics.set_running(&self.pod_key, self.ctrs.iter().any(|c| c.rec.process.is_some()));
        self.report_status().await;
    }

    async fn create_sandbox(&mut self) {
        match self.deps.create_sandbox(&self.pod).await {
            Ok(r) => {
                tracing::info!(pod = %self.pod_key, ip = ?r.pod_ips, sandbox = r.sandbox.pid, "pod network ready");
                self.rec = Some(r);
                self.sandbox_retry = None;
            }
            Err(e) => {
                tracing::warn!(pod = %self.pod_key, "cannot create the pod sandbox: {e}");
                self.deps.event(
                    &self.pod,
                    None,
                    true,
                    "FailedCreatePodSandBox",
                    format!("Failed to create pod sandbox: {e}"),
                );
                self.deps.metrics.sync_error("sandbox");
                for c in &mut self.ctrs {
                    c.waiting =
                        Some(("ContainerCreating".into(), Some(format!("failed to set up the pod network: {e}"))));
                }
                self.sandbox_retry = Some(Instant::now() + self.sandbox_backoff);
                self.sandbox_backoff = (self.sandbox_backoff * 2).min(Duration::from_secs(30));
            }
        }
    }

    /// Reports the pod's status when it changed (a failed report is retried after a second).
    async fn report_status(&mut self) {
        let view = view_of(&self.deps.cfg, self.rec.as_ref(), &self.ctrs);
        let status = podstatus::pod_status(&self.pod, &view, Timestamp::now());
        if self.last_status.as_ref() == Some(&status) || self.status_retry.is_some_and(|t| t > Instant::now()) {
            return;
        }
        let mut update = self.pod.clone();
        update.metadata.resource_version = None;
        update.status = Some(status.clone());
        match self.deps.api.update_status(&update).await {
            Ok(()) => {
                self.pod.status = Some(status.clone());
                self.last_status = Some(status);
                self.status_retry = None;
            }
            Err(e) => {
                tracing::warn!(pod = %self.pod_key, "status update failed: {e}");
                self.deps.metrics.sync_error("status");
                self.status_retry = Some(Instant::now() + Duration::from_secs(1));
            }
        }
    }

    /// The next moment something is due: a container start, a probe, a sandbox or status retry.
    fn next_deadline(&self) -> Option<Instant> {
        let probes = |c: &Ctr| c.readiness.next.filter(|_| c.rec.process.is_some() && !c.readiness.checks.is_empty());
        self.ctrs
            .iter()
            .flat_map(|c| [c.next_start, probes(c)])
            .chain([self.sandbox_retry.filter(|_| self.rec.is_none()), self.status_retry])
            .flatten()
            .min()
    }

    /// Waits for a change of the pod, a container's exit or the next deadline; false when the
    /// pod's channel is closed.
    async fn wait(&mut self, pod_rx: &mut watch::Receiver<Option<core::Pod>>) -> bool {
        let deadline = self.next_deadline();
        // A running pod of images with files volumes follows its Secrets and ConfigMaps.
        let follows = self.rec.is_some()
            && self.ctrs.iter().any(|c| c.rec.pid_file.is_some() && c.rec.process.is_some())
            && self.pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).is_some_and(|v| {
                v.iter().any(|v| {
                    v.secret.is_some() || v.config_map.is_some() || v.projected.is_some() || v.downward_api.is_some()
                })
            });
        let (mut secrets, mut config_maps) = (self.deps.secrets.changes(), self.deps.config_maps.changes());
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = pod_rx.changed() => {
                if changed.is_err() {
                    return false;
                }
                if let Some(p) = pod_rx.borrow_and_update().clone() {
                    // Someone else changed the pod's readiness (the node controller marks the
                    // pods of a node it lost not ready): say ours again, as kubelet's status
                    // manager reconciles, or the pod would stay not ready after the node is
                    // back.
                    if ready_condition(p.status.as_ref()) != ready_condition(self.last_status.as_ref()) {
                        self.last_status = None;
                    }
                    // Keep our view of the status (the API echoes it back).
                    let status = self.pod.status.take();
                    self.pod = p;
                    self.pod.status = status;
                    // New ephemeral containers (`kubectl debug`) start now.
                    for spec in ephemeral_specs(&self.pod) {
                        if self.rec.is_some() && !self.ctrs.iter().any(|c| c.spec.name == spec.name) {
                            let mut c = Ctr::new(spec, Default::default(), self.deps.cfg.backoff_base, true);
                            c.next_start = Some(Instant::now());
                            self.ctrs.push(c);
                        }
                    }
                }
            }
            Some((name, p, exit)) = self.exit_rx.recv() => self.exited(&name, p, exit),
            Ok(()) = secrets.changed(), if follows => self.deps.refresh_volumes(&self.pod),
            Ok(()) = config_maps.changed(), if follows => self.deps.refresh_volumes(&self.pod),
            _ = sleep => {}
        }
        true
    }

    /// A container's process ended: recorded, and restarted or not as its policy says.
    fn exited(&mut self, name: &str, p: ProcId, exit: Exit) {
        let Some(c) = self.ctrs.iter_mut().find(|c| c.spec.name == name && c.rec.process == Some(p)) else { return };
        let code = exit.code();
        let signal = match exit {
            Exit::Signal(s) => Some(s),
            _ => None,
        };
        tracing::info!(pod = %self.pod_key, container = %name, exit_code = code, "container exited");
        c.rec.last = Some(Terminated {
            exit_code: code,
            signal,
            reason: if exit == Exit::Unknown { "Unknown".into() } else { Terminated::reason_for(code).into() },
            message: None,
            started_at: c.rec.started_at,
            finished_at: Timestamp::now(),
            container_id: Some(match &c.rec.runtime_id {
                Some(id) => format!("crun://{id}"),
                None => format!("podpath://{}", p.pid),
            }),
        });
        self.deps.after_exit(&self.pod, c, code);
        if let Some(r) = self.rec.as_mut() {
            r.containers.insert(c.spec.name.clone(), c.rec.clone());
            if let Err(e) = save_record(&self.deps.cfg, r) {
                tracing::warn!(pod = %self.pod_key, "{e}");
            }
        }
    }

    /// Termination, as kubelet does it: preStop handlers, SIGTERM, the grace period, SIGKILL,
    /// then CNI DEL, the sandbox, the record, and (when the pod still exists) the final delete.
    /// `current` is the pod as the API has it now (None: gone already).
    async fn terminate(mut self, current: Option<core::Pod>) {
        let pod_exists = current.is_some();
        let grace = current.as_ref().and_then(|p| p.metadata.deletion_grace_period_seconds);
        let grace = grace
            .or_else(|| self.pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30)
            .clamp(0, MAX_GRACE_SECONDS) as u64;
        let deadline = Instant::now() + Duration::from_secs(grace);
        if pod_exists {
            self.run_pre_stop_hooks(deadline).await;
        }
        self.stop_processes(deadline).await;
        let (deps, pod_key) = (&self.deps, &self.pod_key);
        deps.metrics.set_running(pod_key, false);
        if let Some(r) = &self.rec {
            let mut delay = Duration::from_millis(200);
            while let Err(e) = deps.release(r).await {
                tracing::warn!(pod = %pod_key, "releasing the pod network failed (retrying): {e}");
                deps.metrics.sync_error("cni-del");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
        if pod_exists {
            let name = self.pod.metadata.name.clone().unwrap_or_default();
            let ns = self.pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
            if let Err(e) = deps.api.delete(&ns, &name, &uid(&self.pod)).await {
                tracing::warn!(pod = %pod_key, "final delete failed: {e}");
            }
        }
        tracing::info!(pod = %pod_key, "pod stopped and removed");
    }

    /// preStop handlers first, all containers at once, inside the grace period: this is what
    /// gives the Service's other nodes time to stop sending new connections here.
    async fn run_pre_stop_hooks(&self, deadline: Instant) {
        let Some(r) = self.rec.as_ref() else { return };
        let deps = &self.deps;
        let hooks: Vec<(String, PreStop)> = self
            .ctrs
            .iter()
            .filter(|c| c.rec.process.is_some_and(|p| deps.procs.alive(p)))
            .filter_map(|c| {
                let join = join_prefix(&deps.cfg.workload_bin, r.sandbox, c.rec.pid_file.as_deref());
                pre_stop(&c.spec, r.pod_ips.first().copied(), &join).map(|h| (c.spec.name.clone(), h))
            })
            .collect();
        let runs = hooks.iter().map(|(name, h)| deps.run_pre_stop(&self.pod_key, name, h, deadline));
        futures::future::join_all(runs).await;
    }

    /// SIGTERM to every process, SIGKILL to those still running at `deadline`; returns when all
    /// have exited.
    async fn stop_processes(&mut self, deadline: Instant) {
        let mut running: HashSet<ProcId> = self.ctrs.iter().filter_map(|c| c.rec.process).collect();
        for c in self.ctrs.iter().filter(|c| c.rec.process.is_some()) {
            self.deps.event(
                &self.pod,
                Some(&c.spec.name),
                false,
                "Killing",
                format!("Stopping container {}", c.spec.name),
            );
        }
        for p in &running {
            self.deps.procs.signal(*p, Sig::Term);
        }
        while !running.is_empty() {
            tokio::select! {
                Some((_, p, _)) = self.exit_rx.recv() => { running.remove(&p); }
                _ = tokio::time::sleep_until(deadline) => {
                    for p in &running {
                        self.deps.procs.signal(*p, Sig::Kill);
                    }
                    while !running.is_empty() {
                        match self.exit_rx.recv().await {
                            Some((_, p, _)) => { running.remove(&p); }
                            None => break,
                        }
                    }
                }
            }
        }
    }
}

/// The status of a pod status's Ready condition, if it has one.
fn ready_condition(status: Option<&core::PodStatus>) -> Option<String> {
    status?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready").map(|c| c.status.clone())
}
