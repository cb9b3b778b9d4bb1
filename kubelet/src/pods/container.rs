//! One container's life inside its pod's worker: started (or why not), exited and restarted
//! with back-off as its restart policy says, probed for readiness, and its preStop handler.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::launch::{join_prefix, launch, readiness, Launch, PreStop, Readiness, DEFAULT_PROBE_RETRY};
use super::record::{save_record, ContainerRecord, PodRecord};
use super::worker::watch_exit;
use super::{key, uid, Check, Deps, PodApi, Prober};
use crate::cni::PluginExec;
use crate::podstatus::{ContainerState, ContainerView, Terminated};
use crate::process::{Exit, ProcId, ProcSpec, Processes, Sig};

/// A container while its pod worker runs.
pub(super) struct Ctr {
    pub(super) spec: core::Container,
    pub(super) rec: ContainerRecord,
    pub(super) waiting: Option<(String, Option<String>)>,
    pub(super) ready: bool,
    pub(super) readiness: Readiness,
    pub(super) next_start: Option<Instant>,
    pub(super) backoff: Duration,
    /// After a failed pull: no new pull before this (ImagePullBackOff meanwhile).
    pub(super) pull_retry_at: Option<Instant>,
    pub(super) pull_backoff: Duration,
    /// An ephemeral container (`kubectl debug`): never restarted, reported apart.
    pub(super) ephemeral: bool,
    /// Its target's PID namespace, found when it starts.
    pub(super) pid_ns: Option<String>,
}

impl Ctr {
    /// A container not started yet.
    pub(super) fn new(spec: core::Container, rec: ContainerRecord, backoff: Duration, ephemeral: bool) -> Ctr {
        Ctr {
            spec,
            rec,
            waiting: None,
            ready: false,
            readiness: readiness(&core::Container::default(), None, &[]),
            next_start: None,
            backoff,
            pull_retry_at: None,
            pull_backoff: backoff,
            ephemeral,
            pid_ns: None,
        }
    }
}

/// An ephemeral container as the container it runs as (the same fields, less its target).
pub(super) fn ephemeral_as_container(e: &core::EphemeralContainer) -> core::Container {
    use api::Codec;
    let mut v = e.to_json().unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.remove("targetContainerName");
    }
    core::Container::from_json(v).unwrap_or_else(|_| core::Container { name: e.name.clone(), ..Default::default() })
}

impl Ctr {
    pub(super) fn view(&self) -> ContainerView {
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
            // An ephemeral container is never ready (it has no probes and serves nothing).
            ready: self.ready && self.rec.process.is_some() && !self.ephemeral,
            restart_count: self.rec.restart_count,
            container_id: match (&self.rec.runtime_id, self.rec.process) {
                (Some(id), Some(_)) => Some(format!("crun://{id}")),
                (_, p) => p.map(|p| format!("podpath://{}", p.pid)),
            },
            will_restart: !self.rec.done,
            ephemeral: self.ephemeral,
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

pub(super) type ExitMsg = (String, ProcId, Exit);

impl<P: Processes, E: PluginExec, A: PodApi, Q: Prober> Deps<P, E, A, Q> {
    pub(super) async fn start_container(
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
        let attempt = if first_start { c.rec.restart_count } else { c.rec.restart_count + 1 };
        let services = self.service_env(pod);
        let image = c.spec.image.clone().unwrap_or_default();
        let planned = match &self.cfg.images {
            Some(images) if images.runs(&image) => {
                match self.image_container(pod, rec, c, images, &ip, attempt, &services).await {
                    Some(l) => l,
                    None => {
                        // Waiting (a pull, its back-off, a bad config): the record stays.
                        rec.containers.insert(c.spec.name.clone(), c.rec.clone());
                        return;
                    }
                }
            }
            _ => {
                c.rec.pid_file = None;
                c.rec.runtime_id = None;
                launch(&self.cfg, pod, &c.spec, rec.sandbox, &ip, attempt, &services)
            }
        };
        match planned {
            Launch::Cannot { reason, message } => {
                let image = c.spec.image.clone().unwrap_or_default();
                let name = Some(c.spec.name.as_str());
                self.event(pod, name, true, "Failed", format!("Failed to pull image {image:?}: {message}"));
                self.event(pod, name, true, "Failed", format!("Error: {reason}"));
                c.waiting = Some((reason, Some(message)));
                // Like an image pull, look again later (the pod cannot change, but a record
                // of the attempt keeps the status honest).
                c.next_start = Some(Instant::now() + self.cfg.backoff_max);
            }
            Launch::StartError(message) => {
                self.event(pod, Some(&c.spec.name), true, "Failed", format!("Error: {message}"));
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
                    let (name, image) = (c.spec.name.as_str(), c.spec.image.as_deref().unwrap_or(""));
                    if c.rec.runtime_id.is_none() {
                        // No image is pulled: the program is on the node, as a present image is.
                        self.event(
                            pod,
                            Some(name),
                            false,
                            "Pulled",
                            format!("Container image {image:?} already present on machine"),
                        );
                    }
                    self.event(pod, Some(name), false, "Created", format!("Created container: {name}"));
                    self.event(pod, Some(name), false, "Started", format!("Started container {name}"));
                    if !first_start {
                        c.rec.restart_count += 1;
                    }
                    c.rec.process = Some(p);
                    c.rec.started_at = Some(Timestamp::now());
                    // kubelet keeps the logs of this attempt and the one before (`--previous`).
                    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
                    let _ = std::fs::remove_file(self.cfg.log_path(ns, pod_name, &uid(pod), name, attempt - 2));
                    c.waiting = None;
                    c.ready = false;
                    let join = join_prefix(&self.cfg.workload_bin, rec.sandbox, c.rec.pid_file.as_deref());
                    c.readiness = readiness(&c.spec, rec.pod_ips.first().copied(), &join);
                    c.readiness.next = Some(Instant::now() + c.readiness.initial_delay);
                    watch_exit(deps, c.spec.name.clone(), p, c.rec.runtime_id.clone(), exits.clone());
                }
                Err(e) => {
                    tracing::warn!(pod = %key(pod), container = %c.spec.name, "cannot start: {e}");
                    self.event(pod, Some(&c.spec.name), true, "Failed", format!("Error: {e}"));
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
    pub(super) fn after_exit(&self, pod: &core::Pod, c: &mut Ctr, exit_code: i32) {
        c.ready = false;
        c.rec.process = None;
        let policy = pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
        if c.ephemeral || !restarts(policy, exit_code) {
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
        let pod_text = format!(
            "{}_{}({})",
            pod.metadata.name.as_deref().unwrap_or(""),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
            uid(pod)
        );
        self.event(
            pod,
            Some(&c.spec.name),
            true,
            "BackOff",
            format!("Back-off restarting failed container {} in pod {pod_text}", c.spec.name),
        );
        c.next_start = Some(Instant::now() + delay);
        c.waiting = Some((
            "CrashLoopBackOff".into(),
            Some(format!("back-off {}s restarting failed container={} pod={pod_text}", delay.as_secs(), c.spec.name)),
        ));
    }

    /// One probe or handler: exec runs in the pod's namespaces (killed at `timeout`); the others
    /// go to the prober. A failure says why.
    pub(super) async fn run_check(&self, check: &Check, timeout: Duration) -> Result<(), String> {
        match check {
            Check::Exec { argv } => {
                let spec = ProcSpec { argv: argv.clone(), env: vec![], log: None };
                // The argv is `podpath-workload join … -- COMMAND`: the user's command is after `--`.
                let command = argv.iter().position(|a| a == "--").map_or(&argv[..], |i| &argv[i + 1..]);
                match self.procs.spawn(&spec).await {
                    Ok(p) => match tokio::time::timeout(timeout, self.procs.wait(p)).await {
                        Ok(Exit::Code(0)) => Ok(()),
                        Ok(Exit::Code(n)) => Err(format!("command {command:?} exited with {n}")),
                        Ok(Exit::Signal(n)) => Err(format!("command {command:?} was killed by signal {n}")),
                        Ok(Exit::Unknown) => Err(format!("command {command:?} ended with an unknown status")),
                        Err(_) => {
                            self.procs.signal(p, Sig::Kill);
                            Err(format!("command {command:?} timed out"))
                        }
                    },
                    Err(e) => Err(format!("command {command:?} could not start: {e}")),
                }
            }
            other => self.prober.probe(other, timeout).await,
        }
    }

    /// Runs a container's preStop handler, as kubelet does before SIGTERM, within `deadline`
    /// (the pod's grace period). Its outcome does not matter: termination goes on regardless.
    pub(super) async fn run_pre_stop(&self, pod_key: &str, container: &str, hook: &PreStop, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        let finished = match hook {
            PreStop::Sleep(d) => {
                tokio::time::sleep((*d).min(left)).await;
                *d <= left
            }
            PreStop::Check(check) => self.run_check(check, left).await.is_ok(),
        };
        if !finished {
            tracing::warn!(pod = %pod_key, container, "preStop hook failed or ran out of the grace period");
        }
    }

    pub(super) async fn run_probes(&self, pod: &core::Pod, c: &mut Ctr) {
        let r = &mut c.readiness;
        let now = Instant::now();
        if c.rec.process.is_none() || r.next.is_none_or(|n| n > now) {
            return;
        }
        let mut failure = None;
        for check in &r.checks {
            if let Err(why) = self.run_check(check, r.timeout).await {
                failure = Some(why);
                break;
            }
        }
        // Only a probe the user wrote is reported: the implicit port check is podpath's own.
        if let (Some(why), true) = (&failure, r.explicit) {
            self.event(pod, Some(&c.spec.name), true, "Unhealthy", format!("Readiness probe failed: {why}"));
        }
        if failure.is_none() {
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
