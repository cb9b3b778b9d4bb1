//! Pod ↔ proto (containers, probes, container states).

use k8s_openapi::api::core::v1 as core;

use super::meta::*;
use super::{proto_err, ProtoConvert};
use crate::proto as pb;
use crate::Error;

fn probe(p: &core::Probe) -> pb::Probe {
    let handler = if let Some(t) = &p.tcp_socket {
        Some(pb::probe::Handler::TcpSocketPort(int_or_string(&t.port)))
    } else if let Some(h) = &p.http_get {
        Some(pb::probe::Handler::HttpGet(pb::HttpGet {
            port: Some(int_or_string(&h.port)),
            path: h.path.clone(),
            scheme: h.scheme.clone(),
            host: h.host.clone(),
        }))
    } else {
        p.exec.as_ref().map(|e| pb::probe::Handler::Exec(pb::ExecCommand { command: list(&e.command) }))
    };
    pb::Probe {
        handler,
        initial_delay_seconds: p.initial_delay_seconds,
        period_seconds: p.period_seconds,
        timeout_seconds: p.timeout_seconds,
        success_threshold: p.success_threshold,
        failure_threshold: p.failure_threshold,
    }
}

fn probe_back(p: &pb::Probe) -> Result<core::Probe, Error> {
    let mut out = core::Probe {
        initial_delay_seconds: p.initial_delay_seconds,
        period_seconds: p.period_seconds,
        timeout_seconds: p.timeout_seconds,
        success_threshold: p.success_threshold,
        failure_threshold: p.failure_threshold,
        ..Default::default()
    };
    match &p.handler {
        Some(pb::probe::Handler::TcpSocketPort(port)) => {
            out.tcp_socket = Some(core::TCPSocketAction { port: int_or_string_back(port)?, host: None })
        }
        Some(pb::probe::Handler::HttpGet(h)) => {
            out.http_get = Some(core::HTTPGetAction {
                port: int_or_string_back(h.port.as_ref().ok_or_else(|| proto_err("httpGet", "port is required"))?)?,
                path: h.path.clone(),
                scheme: h.scheme.clone(),
                host: h.host.clone(),
                http_headers: None,
            })
        }
        Some(pb::probe::Handler::Exec(e)) => out.exec = Some(core::ExecAction { command: opt_list(&e.command) }),
        None => {}
    }
    Ok(out)
}

fn container(c: &core::Container) -> pb::Container {
    pb::Container {
        name: c.name.clone(),
        image: c.image.clone(),
        command: list(&c.command),
        args: list(&c.args),
        ports: c
            .ports
            .iter()
            .flatten()
            .map(|p| pb::ContainerPort {
                name: p.name.clone(),
                container_port: p.container_port,
                protocol: p.protocol.clone(),
                host_port: p.host_port,
                host_ip: p.host_ip.clone(),
            })
            .collect(),
        env: c.env.iter().flatten().map(|e| pb::EnvVar { name: e.name.clone(), value: e.value.clone() }).collect(),
        readiness_probe: c.readiness_probe.as_ref().map(probe),
        liveness_probe: c.liveness_probe.as_ref().map(probe),
        image_pull_policy: c.image_pull_policy.clone(),
        working_dir: c.working_dir.clone(),
        termination_message_path: c.termination_message_path.clone(),
        termination_message_policy: c.termination_message_policy.clone(),
    }
}

fn container_back(c: &pb::Container) -> Result<core::Container, Error> {
    Ok(core::Container {
        name: c.name.clone(),
        image: c.image.clone(),
        command: opt_list(&c.command),
        args: opt_list(&c.args),
        ports: opt_list(
            &c.ports
                .iter()
                .map(|p| core::ContainerPort {
                    name: p.name.clone(),
                    container_port: p.container_port,
                    protocol: p.protocol.clone(),
                    host_port: p.host_port,
                    host_ip: p.host_ip.clone(),
                })
                .collect::<Vec<_>>(),
        ),
        env: opt_list(
            &c.env
                .iter()
                .map(|e| core::EnvVar { name: e.name.clone(), value: e.value.clone(), value_from: None })
                .collect::<Vec<_>>(),
        ),
        readiness_probe: c.readiness_probe.as_ref().map(probe_back).transpose()?,
        liveness_probe: c.liveness_probe.as_ref().map(probe_back).transpose()?,
        image_pull_policy: c.image_pull_policy.clone(),
        working_dir: c.working_dir.clone(),
        termination_message_path: c.termination_message_path.clone(),
        termination_message_policy: c.termination_message_policy.clone(),
        ..Default::default()
    })
}

fn container_state(s: &core::ContainerState) -> pb::ContainerState {
    use pb::container_state as cs;
    let state = if let Some(w) = &s.waiting {
        Some(cs::State::Waiting(cs::Waiting { reason: w.reason.clone(), message: w.message.clone() }))
    } else if let Some(r) = &s.running {
        Some(cs::State::Running(cs::Running { started_at: opt_time(&r.started_at) }))
    } else {
        s.terminated.as_ref().map(|t| {
            cs::State::Terminated(cs::Terminated {
                exit_code: t.exit_code,
                signal: t.signal,
                reason: t.reason.clone(),
                message: t.message.clone(),
                started_at: opt_time(&t.started_at),
                finished_at: opt_time(&t.finished_at),
                container_id: t.container_id.clone(),
            })
        })
    };
    pb::ContainerState { state }
}

fn container_state_back(s: &pb::ContainerState) -> Result<core::ContainerState, Error> {
    use pb::container_state as cs;
    let mut out = core::ContainerState::default();
    match &s.state {
        Some(cs::State::Waiting(w)) => {
            out.waiting = Some(core::ContainerStateWaiting { reason: w.reason.clone(), message: w.message.clone() })
        }
        Some(cs::State::Running(r)) => {
            out.running = Some(core::ContainerStateRunning { started_at: time_opt(&r.started_at)? })
        }
        Some(cs::State::Terminated(t)) => {
            out.terminated = Some(core::ContainerStateTerminated {
                exit_code: t.exit_code,
                signal: t.signal,
                reason: t.reason.clone(),
                message: t.message.clone(),
                started_at: time_opt(&t.started_at)?,
                finished_at: time_opt(&t.finished_at)?,
                container_id: t.container_id.clone(),
            })
        }
        None => {}
    }
    Ok(out)
}

impl ProtoConvert for core::Pod {
    type Proto = pb::Pod;
    extra_accessors!();

    fn to_typed(&self) -> pb::Pod {
        let spec = self.spec.as_ref().map(|s| pb::PodSpec {
            containers: s.containers.iter().map(container).collect(),
            node_name: s.node_name.clone(),
            restart_policy: s.restart_policy.clone(),
            termination_grace_period_seconds: s.termination_grace_period_seconds,
            dns_policy: s.dns_policy.clone(),
            host_network: s.host_network,
            scheduler_name: s.scheduler_name.clone(),
            service_account_name: s.service_account_name.clone(),
            enable_service_links: s.enable_service_links,
            priority: s.priority,
            preemption_policy: s.preemption_policy.clone(),
            hostname: s.hostname.clone(),
            subdomain: s.subdomain.clone(),
        });
        let status = self.status.as_ref().map(|s| pb::PodStatus {
            phase: s.phase.clone(),
            conditions: conditions(&s.conditions),
            host_ip: s.host_ip.clone(),
            host_ips: s.host_ips.iter().flatten().map(|h| h.ip.clone()).collect(),
            pod_ip: s.pod_ip.clone(),
            pod_ips: s.pod_ips.iter().flatten().map(|p| p.ip.clone()).collect(),
            start_time: opt_time(&s.start_time),
            container_statuses: s
                .container_statuses
                .iter()
                .flatten()
                .map(|c| pb::ContainerStatus {
                    name: c.name.clone(),
                    ready: c.ready,
                    restart_count: c.restart_count,
                    image: c.image.clone(),
                    image_id: c.image_id.clone(),
                    container_id: c.container_id.clone(),
                    started: c.started,
                    state: c.state.as_ref().map(container_state),
                    last_state: c.last_state.as_ref().map(container_state),
                })
                .collect(),
            qos_class: s.qos_class.clone(),
            reason: s.reason.clone(),
            message: s.message.clone(),
            nominated_node_name: s.nominated_node_name.clone(),
        });
        pb::Pod { metadata: Some(object_meta(&self.metadata)), spec, status, extra_json: String::new() }
    }

    fn from_typed(p: &pb::Pod) -> Result<Self, Error> {
        let spec = p
            .spec
            .as_ref()
            .map(|s| -> Result<core::PodSpec, Error> {
                Ok(core::PodSpec {
                    containers: s.containers.iter().map(container_back).collect::<Result<_, _>>()?,
                    node_name: s.node_name.clone(),
                    restart_policy: s.restart_policy.clone(),
                    termination_grace_period_seconds: s.termination_grace_period_seconds,
                    dns_policy: s.dns_policy.clone(),
                    host_network: s.host_network,
                    scheduler_name: s.scheduler_name.clone(),
                    service_account_name: s.service_account_name.clone(),
                    enable_service_links: s.enable_service_links,
                    priority: s.priority,
                    preemption_policy: s.preemption_policy.clone(),
                    hostname: s.hostname.clone(),
                    subdomain: s.subdomain.clone(),
                    ..Default::default()
                })
            })
            .transpose()?;
        let status = p
            .status
            .as_ref()
            .map(|s| -> Result<core::PodStatus, Error> {
                Ok(core::PodStatus {
                    phase: s.phase.clone(),
                    conditions: conditions_back(&s.conditions)?,
                    host_ip: s.host_ip.clone(),
                    host_ips: opt_list(
                        &s.host_ips.iter().map(|ip| core::HostIP { ip: ip.clone() }).collect::<Vec<_>>(),
                    ),
                    pod_ip: s.pod_ip.clone(),
                    pod_ips: opt_list(&s.pod_ips.iter().map(|ip| core::PodIP { ip: ip.clone() }).collect::<Vec<_>>()),
                    start_time: time_opt(&s.start_time)?,
                    container_statuses: opt_list(
                        &s.container_statuses
                            .iter()
                            .map(|c| {
                                Ok(core::ContainerStatus {
                                    name: c.name.clone(),
                                    ready: c.ready,
                                    restart_count: c.restart_count,
                                    image: c.image.clone(),
                                    image_id: c.image_id.clone(),
                                    container_id: c.container_id.clone(),
                                    started: c.started,
                                    state: c.state.as_ref().map(container_state_back).transpose()?,
                                    last_state: c.last_state.as_ref().map(container_state_back).transpose()?,
                                    ..Default::default()
                                })
                            })
                            .collect::<Result<Vec<_>, Error>>()?,
                    ),
                    qos_class: s.qos_class.clone(),
                    reason: s.reason.clone(),
                    message: s.message.clone(),
                    nominated_node_name: s.nominated_node_name.clone(),
                    ..Default::default()
                })
            })
            .transpose()?;
        Ok(core::Pod { metadata: object_meta_back(&p.metadata)?, spec, status })
    }
}
