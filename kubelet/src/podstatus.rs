//! A pod's status as the node reports it, computed purely from what the agent knows about the
//! pod's sandbox and containers (so every field is unit-tested without processes).

use std::net::IpAddr;

use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// What happened to a container, as far as the status goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerState {
    Waiting { reason: String, message: Option<String> },
    Running { started_at: Timestamp },
    Terminated(Terminated),
}

/// A finished run of a container (also what a pod record keeps of it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Terminated {
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub reason: String,
    pub message: Option<String>,
    pub started_at: Option<Timestamp>,
    pub finished_at: Timestamp,
    pub container_id: Option<String>,
}

impl Terminated {
    /// Kubernetes' reasons: `Completed` for exit 0, `Error` otherwise (`StartError` and friends
    /// are set by the caller).
    pub fn reason_for(exit_code: i32) -> &'static str {
        if exit_code == 0 {
            "Completed"
        } else {
            "Error"
        }
    }
}

/// One container as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    pub state: ContainerState,
    pub last_terminated: Option<Terminated>,
    pub ready: bool,
    pub restart_count: i32,
    /// `podpath://<pid>` of the running process.
    pub container_id: Option<String>,
    /// Whether it will be started again (restart policy and exit code allow it).
    pub will_restart: bool,
    /// An ephemeral container: in `ephemeralContainerStatuses`, not in the pod's readiness.
    pub ephemeral: bool,
}

/// The pod as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodView {
    pub sandbox_ready: bool,
    pub pod_ips: Vec<IpAddr>,
    /// The node's addresses, primary first (`hostIP`, `hostIPs`).
    pub host_ips: Vec<IpAddr>,
    pub start_time: Timestamp,
    pub containers: Vec<ContainerView>,
}

/// The image ID a status shows: the built-in image, or the host program behind a command.
pub fn image_id(image: &str) -> String {
    if crate::pods::is_echo_image(image) {
        "podpath.dev/builtin/echo".into()
    } else {
        format!("podpath.dev/host-program/{image}")
    }
}

fn time(t: Timestamp) -> Time {
    Time(t)
}

fn condition(
    type_: &str,
    ok: bool,
    previous: Option<&core::PodStatus>,
    now: Timestamp,
    reason: Option<&str>,
) -> core::PodCondition {
    let status = if ok { "True" } else { "False" };
    // The transition time stays until the status flips.
    let last = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(time(now));
    core::PodCondition {
        type_: type_.into(),
        status: status.into(),
        last_transition_time: Some(last),
        reason: reason.filter(|_| !ok).map(str::to_string),
        ..Default::default()
    }
}

fn state(s: &ContainerState) -> core::ContainerState {
    match s {
        ContainerState::Waiting { reason, message } => core::ContainerState {
            waiting: Some(core::ContainerStateWaiting { reason: Some(reason.clone()), message: message.clone() }),
            ..Default::default()
        },
        ContainerState::Running { started_at } => core::ContainerState {
            running: Some(core::ContainerStateRunning { started_at: Some(time(*started_at)) }),
            ..Default::default()
        },
        ContainerState::Terminated(t) => core::ContainerState { terminated: Some(terminated(t)), ..Default::default() },
    }
}

fn terminated(t: &Terminated) -> core::ContainerStateTerminated {
    core::ContainerStateTerminated {
        exit_code: t.exit_code,
        signal: t.signal,
        reason: Some(t.reason.clone()),
        message: t.message.clone(),
        started_at: t.started_at.map(time),
        finished_at: Some(time(t.finished_at)),
        container_id: t.container_id.clone(),
    }
}

/// The phase: Pending until every container has started once, Running while any runs or will
/// run again, then Succeeded or Failed.
pub fn phase(view: &PodView) -> &'static str {
    let cs = &view.containers;
    if !view.sandbox_ready && cs.iter().all(|c| !matches!(c.state, ContainerState::Running { .. })) {
        return "Pending";
    }
    let never_started =
        |c: &ContainerView| matches!(c.state, ContainerState::Waiting { .. }) && c.last_terminated.is_none();
    if cs.iter().any(never_started) {
        return "Pending";
    }
    if cs.iter().any(|c| matches!(c.state, ContainerState::Running { .. }) || c.will_restart) {
        return "Running";
    }
    let failed = cs.iter().any(|c| {
        let t = match &c.state {
            ContainerState::Terminated(t) => Some(t),
            _ => c.last_terminated.as_ref(),
        };
        t.is_some_and(|t| t.exit_code != 0)
    });
    if failed {
        "Failed"
    } else {
        "Succeeded"
    }
}

/// The full status to write for `pod`.
pub fn pod_status(pod: &core::Pod, view: &PodView, now: Timestamp) -> core::PodStatus {
    // Ephemeral containers have their own statuses and no say in the phase or readiness.
    let all = view;
    let regular =
        PodView { containers: all.containers.iter().filter(|c| !c.ephemeral).cloned().collect(), ..all.clone() };
    let view = &regular;
    let status_of = |c: &ContainerView| core::ContainerStatus {
        name: c.name.clone(),
        image: c.image.clone(),
        image_id: image_id(&c.image),
        container_id: c.container_id.clone(),
        ready: c.ready,
        started: Some(matches!(c.state, ContainerState::Running { .. })),
        restart_count: c.restart_count,
        state: Some(state(&c.state)),
        last_state: Some(
            c.last_terminated
                .as_ref()
                .map(|t| core::ContainerState { terminated: Some(terminated(t)), ..Default::default() })
                .unwrap_or_default(),
        ),
        ..Default::default()
    };
    let ephemeral: Vec<core::ContainerStatus> = all.containers.iter().filter(|c| c.ephemeral).map(status_of).collect();
    let previous = pod.status.as_ref();
    let phase = phase(view);
    let all_ready = !view.containers.is_empty() && view.containers.iter().all(|c| c.ready);
    let running = phase == "Running";
    let not_ready_reason =
        if phase == "Succeeded" || phase == "Failed" { "PodCompleted" } else { "ContainersNotReady" };
    let conditions = vec![
        condition("PodReadyToStartContainers", view.sandbox_ready, previous, now, None),
        condition("Initialized", true, previous, now, None),
        condition("Ready", all_ready && running, previous, now, Some(not_ready_reason)),
        condition("ContainersReady", all_ready && running, previous, now, Some(not_ready_reason)),
        condition("PodScheduled", true, previous, now, None),
    ];
    let ips: Vec<String> = view.pod_ips.iter().map(|i| i.to_string()).collect();
    core::PodStatus {
        phase: Some(phase.into()),
        conditions: Some(conditions),
        host_ip: view.host_ips.first().map(|ip| ip.to_string()),
        host_ips: Some(view.host_ips.iter().map(|ip| core::HostIP { ip: ip.to_string() }).collect()),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| core::PodIP { ip: ip.clone() }).collect()),
        start_time: Some(time(view.start_time)),
        qos_class: Some("BestEffort".into()),
        container_statuses: Some(view.containers.iter().map(status_of).collect()),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-11-22T10:00:00Z".parse().unwrap()
    }

    fn running(ready: bool) -> ContainerView {
        ContainerView {
            name: "web".into(),
            image: "podpath/echo".into(),
            state: ContainerState::Running { started_at: now() },
            last_terminated: None,
            ready,
            restart_count: 0,
            container_id: Some("podpath://42".into()),
            will_restart: true,
            ephemeral: false,
        }
    }

    fn view(cs: Vec<ContainerView>) -> PodView {
        PodView {
            sandbox_ready: true,
            pod_ips: vec!["10.244.1.2".parse().unwrap()],
            host_ips: vec!["192.168.56.11".parse().unwrap()],
            start_time: now(),
            containers: cs,
        }
    }

    fn cond<'a>(s: &'a core::PodStatus, t: &str) -> &'a core::PodCondition {
        s.conditions.as_ref().unwrap().iter().find(|c| c.type_ == t).unwrap()
    }

    #[test]
    fn an_ephemeral_container_is_reported_apart_and_does_not_make_the_pod_unready() {
        let done = ContainerView {
            name: "dbg".into(),
            state: ContainerState::Terminated(Terminated {
                exit_code: 0,
                signal: None,
                reason: "Completed".into(),
                message: None,
                started_at: None,
                finished_at: now(),
                container_id: None,
            }),
            ready: false,
            will_restart: false,
            ephemeral: true,
            ..running(false)
        };
        let s = pod_status(&core::Pod::default(), &view(vec![running(true), done]), now());
        assert_eq!(s.container_statuses.as_ref().unwrap().len(), 1);
        let e = &s.ephemeral_container_statuses.as_ref().unwrap()[0];
        assert_eq!(
            (e.name.as_str(), e.state.as_ref().unwrap().terminated.as_ref().unwrap().reason.as_deref()),
            ("dbg", Some("Completed"))
        );
        assert_eq!((s.phase.as_deref(), cond(&s, "Ready").status.as_str()), (Some("Running"), "True"));
    }

    #[test]
    fn running_and_ready() {
        let s = pod_status(&core::Pod::default(), &view(vec![running(true)]), now());
        assert_eq!(s.phase.as_deref(), Some("Running"));
        assert_eq!(s.pod_ip.as_deref(), Some("10.244.1.2"));
        assert_eq!(s.host_ip.as_deref(), Some("192.168.56.11"));
        assert_eq!(cond(&s, "Ready").status, "True");
        assert_eq!(cond(&s, "ContainersReady").status, "True");
        let c = &s.container_statuses.as_ref().unwrap()[0];
        assert!(c.ready && c.started == Some(true));
        assert_eq!(c.container_id.as_deref(), Some("podpath://42"));
        assert_eq!(c.image_id, "podpath.dev/builtin/echo");
    }

    #[test]
    fn not_ready_until_the_probe_passes_and_transition_time_is_kept() {
        let s1 = pod_status(&core::Pod::default(), &view(vec![running(false)]), now());
        assert_eq!(cond(&s1, "Ready").status, "False");
        assert_eq!(cond(&s1, "Ready").reason.as_deref(), Some("ContainersNotReady"));
        let pod = core::Pod { status: Some(s1.clone()), ..Default::default() };
        let later: Timestamp = "2026-11-22T10:00:05Z".parse().unwrap();
        let s2 = pod_status(&pod, &view(vec![running(false)]), later);
        assert_eq!(cond(&s2, "Ready").last_transition_time, cond(&s1, "Ready").last_transition_time);
        let s3 = pod_status(&pod, &view(vec![running(true)]), later);
        assert_eq!(cond(&s3, "Ready").last_transition_time, Some(Time(later)));
    }

    #[test]
    fn image_without_a_program_is_pending_with_a_reason() {
        let mut c = running(false);
        c.state = ContainerState::Waiting { reason: "ErrImagePull".into(), message: Some("no".into()) };
        c.container_id = None;
        let s = pod_status(&core::Pod::default(), &view(vec![c]), now());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        let w = s.container_statuses.unwrap()[0].state.clone().unwrap().waiting.unwrap();
        assert_eq!(w.reason.as_deref(), Some("ErrImagePull"));
    }

    #[test]
    fn crash_loop_is_running_and_finished_pods_succeed_or_fail() {
        let t = |code| Terminated {
            exit_code: code,
            signal: None,
            reason: Terminated::reason_for(code).into(),
            message: None,
            started_at: Some(now()),
            finished_at: now(),
            container_id: None,
        };
        let mut c = running(false);
        c.state = ContainerState::Waiting { reason: "CrashLoopBackOff".into(), message: None };
        c.last_terminated = Some(t(1));
        c.restart_count = 2;
        assert_eq!(phase(&view(vec![c.clone()])), "Running");
        c.will_restart = false;
        c.state = ContainerState::Terminated(t(0));
        assert_eq!(phase(&view(vec![c.clone()])), "Succeeded");
        c.state = ContainerState::Terminated(t(2));
        assert_eq!(phase(&view(vec![c.clone()])), "Failed");
        let s = pod_status(&core::Pod::default(), &view(vec![c]), now());
        assert_eq!(cond(&s, "Ready").reason.as_deref(), Some("PodCompleted"));
    }

    #[test]
    fn no_sandbox_yet_is_pending_without_ip() {
        let mut v = view(vec![]);
        v.sandbox_ready = false;
        v.pod_ips.clear();
        let s = pod_status(&core::Pod::default(), &v, now());
        assert_eq!(s.phase.as_deref(), Some("Pending"));
        assert_eq!(s.pod_ip, None);
        assert_eq!(cond(&s, "PodReadyToStartContainers").status, "False");
    }
}
