//! Conversions between the Kubernetes types (k8s-openapi) and the gRPC messages.
//!
//! The proto models the fields podpath's components use. Everything else travels in
//! `extra_json`: a JSON merge patch that turns the typed part back into the exact original, so
//! `from_proto(to_proto(x)) == x` for every object, modeled or not.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as api_networking;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::proto as pb;
use crate::Error;

/// A Kubernetes object that has a proto form.
pub trait ProtoConvert: Sized + Serialize + DeserializeOwned {
    type Proto: prost::Message + Default;
    /// The typed part only (no `extra_json`).
    fn to_typed(&self) -> Self::Proto;
    fn from_typed(p: &Self::Proto) -> Result<Self, Error>;
    fn extra(p: &Self::Proto) -> &str;
    fn set_extra(p: &mut Self::Proto, extra: String);
}

/// Converts an object to its proto form, losslessly.
pub fn to_proto<T: ProtoConvert>(obj: &T) -> T::Proto {
    let mut p = obj.to_typed();
    let back = T::from_typed(&p).map(|b| serde_json::to_value(&b).unwrap_or_default()).unwrap_or_default();
    let orig = serde_json::to_value(obj).unwrap_or_default();
    let diff = merge_diff(&back, &orig);
    if diff.as_object().is_none_or(|m| !m.is_empty()) {
        T::set_extra(&mut p, diff.to_string());
    }
    p
}

/// Converts a proto message back to the Kubernetes object.
pub fn from_proto<T: ProtoConvert>(p: &T::Proto) -> Result<T, Error> {
    let typed = T::from_typed(p)?;
    let extra = T::extra(p);
    if extra.is_empty() {
        return Ok(typed);
    }
    let patch: Value = serde_json::from_str(extra).map_err(|e| proto_err("extra_json", e))?;
    let mut doc = serde_json::to_value(&typed).map_err(|e| proto_err("object", e))?;
    json_patch::merge(&mut doc, &patch);
    serde_json::from_value(doc).map_err(|e| proto_err("object", e))
}

fn proto_err(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Proto { what, message: e.to_string() }
}

/// The JSON merge patch that turns `from` into `to`.
pub fn merge_diff(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut out = Map::new();
            for (k, tv) in t {
                match f.get(k) {
                    Some(fv) if fv == tv => {}
                    Some(fv @ Value::Object(_)) if tv.is_object() => {
                        out.insert(k.clone(), merge_diff(fv, tv));
                    }
                    _ => {
                        out.insert(k.clone(), tv.clone());
                    }
                }
            }
            for k in f.keys() {
                if !t.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        _ => to.clone(),
    }
}

// === small helpers ===

fn time_to_string(t: &meta::Time) -> String {
    serde_json::to_value(t).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

fn time_from_string(s: &str) -> Result<meta::Time, Error> {
    serde_json::from_value(Value::String(s.to_string())).map_err(|e| proto_err("timestamp", e))
}

fn opt_time(t: &Option<meta::Time>) -> Option<String> {
    t.as_ref().map(time_to_string)
}

fn time_opt(s: &Option<String>) -> Result<Option<meta::Time>, Error> {
    s.as_deref().map(time_from_string).transpose()
}

fn list<T: Clone>(v: &Option<Vec<T>>) -> Vec<T> {
    v.clone().unwrap_or_default()
}

fn opt_list<T: Clone>(v: &[T]) -> Option<Vec<T>> {
    if v.is_empty() {
        None
    } else {
        Some(v.to_vec())
    }
}

fn map(v: &Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    v.clone().unwrap_or_default()
}

fn opt_map(v: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    if v.is_empty() {
        None
    } else {
        Some(v.clone())
    }
}

fn int_or_string(v: &IntOrString) -> pb::IntOrString {
    pb::IntOrString {
        value: Some(match v {
            IntOrString::Int(i) => pb::int_or_string::Value::IntValue(*i),
            IntOrString::String(s) => pb::int_or_string::Value::StringValue(s.clone()),
        }),
    }
}

fn int_or_string_back(v: &pb::IntOrString) -> Result<IntOrString, Error> {
    match &v.value {
        Some(pb::int_or_string::Value::IntValue(i)) => Ok(IntOrString::Int(*i)),
        Some(pb::int_or_string::Value::StringValue(s)) => Ok(IntOrString::String(s.clone())),
        None => Err(proto_err("IntOrString", "neither int nor string is set")),
    }
}

fn object_meta(m: &meta::ObjectMeta) -> pb::ObjectMeta {
    pb::ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        generation: m.generation,
        creation_timestamp: opt_time(&m.creation_timestamp),
        deletion_timestamp: opt_time(&m.deletion_timestamp),
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: map(&m.labels),
        annotations: map(&m.annotations),
        finalizers: list(&m.finalizers),
        owner_references: m
            .owner_references
            .iter()
            .flatten()
            .map(|o| pb::OwnerReference {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
            .collect(),
        generate_name: m.generate_name.clone(),
    }
}

fn object_meta_back(m: &Option<pb::ObjectMeta>) -> Result<meta::ObjectMeta, Error> {
    let m = m.clone().unwrap_or_default();
    Ok(meta::ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        creation_timestamp: time_opt(&m.creation_timestamp)?,
        deletion_timestamp: time_opt(&m.deletion_timestamp)?,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: opt_map(&m.labels),
        annotations: opt_map(&m.annotations),
        finalizers: opt_list(&m.finalizers),
        owner_references: opt_list(
            &m.owner_references
                .iter()
                .map(|o| meta::OwnerReference {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                    controller: o.controller,
                    block_owner_deletion: o.block_owner_deletion,
                })
                .collect::<Vec<_>>(),
        ),
        generate_name: m.generate_name,
        ..Default::default()
    })
}

/// Conditions of every kind share one proto message.
trait ConditionLike: Sized {
    fn to_pb(&self) -> pb::Condition;
    fn from_pb(c: &pb::Condition) -> Result<Self, Error>;
}

impl ConditionLike for core::NodeCondition {
    fn to_pb(&self) -> pb::Condition {
        pb::Condition {
            r#type: self.type_.clone(),
            status: self.status.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            last_transition_time: opt_time(&self.last_transition_time),
            last_heartbeat_time: opt_time(&self.last_heartbeat_time),
            last_probe_time: None,
        }
    }
    fn from_pb(c: &pb::Condition) -> Result<Self, Error> {
        Ok(core::NodeCondition {
            type_: c.r#type.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: time_opt(&c.last_transition_time)?,
            last_heartbeat_time: time_opt(&c.last_heartbeat_time)?,
        })
    }
}

impl ConditionLike for core::PodCondition {
    fn to_pb(&self) -> pb::Condition {
        pb::Condition {
            r#type: self.type_.clone(),
            status: self.status.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            last_transition_time: opt_time(&self.last_transition_time),
            last_heartbeat_time: None,
            last_probe_time: opt_time(&self.last_probe_time),
        }
    }
    fn from_pb(c: &pb::Condition) -> Result<Self, Error> {
        Ok(core::PodCondition {
            type_: c.r#type.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: time_opt(&c.last_transition_time)?,
            last_probe_time: time_opt(&c.last_probe_time)?,
            ..Default::default()
        })
    }
}

impl ConditionLike for meta::Condition {
    fn to_pb(&self) -> pb::Condition {
        pb::Condition {
            r#type: self.type_.clone(),
            status: self.status.clone(),
            reason: Some(self.reason.clone()),
            message: Some(self.message.clone()),
            last_transition_time: Some(time_to_string(&self.last_transition_time)),
            last_heartbeat_time: None,
            last_probe_time: None,
        }
    }
    fn from_pb(c: &pb::Condition) -> Result<Self, Error> {
        Ok(meta::Condition {
            type_: c.r#type.clone(),
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            last_transition_time: time_from_string(c.last_transition_time.as_deref().unwrap_or_default())?,
            observed_generation: None,
        })
    }
}

fn conditions<C: ConditionLike>(v: &Option<Vec<C>>) -> Vec<pb::Condition> {
    v.iter().flatten().map(ConditionLike::to_pb).collect()
}

fn conditions_back<C: ConditionLike + Clone>(v: &[pb::Condition]) -> Result<Option<Vec<C>>, Error> {
    Ok(opt_list(&v.iter().map(C::from_pb).collect::<Result<Vec<_>, _>>()?))
}

fn object_ref(r: &core::ObjectReference) -> pb::ObjectReference {
    pb::ObjectReference {
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
        api_version: r.api_version.clone(),
        resource_version: r.resource_version.clone(),
        field_path: r.field_path.clone(),
    }
}

fn object_ref_back(r: &pb::ObjectReference) -> core::ObjectReference {
    core::ObjectReference {
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
        api_version: r.api_version.clone(),
        resource_version: r.resource_version.clone(),
        field_path: r.field_path.clone(),
    }
}

macro_rules! extra_accessors {
    () => {
        fn extra(p: &Self::Proto) -> &str {
            &p.extra_json
        }
        fn set_extra(p: &mut Self::Proto, extra: String) {
            p.extra_json = extra;
        }
    };
}

// === Service ===

impl ProtoConvert for core::Service {
    type Proto = pb::Service;
    extra_accessors!();

    fn to_typed(&self) -> pb::Service {
        let spec = self.spec.as_ref().map(|s| pb::ServiceSpec {
            r#type: s.type_.clone(),
            ports: s
                .ports
                .iter()
                .flatten()
                .map(|p| pb::ServicePort {
                    name: p.name.clone(),
                    protocol: p.protocol.clone(),
                    port: p.port,
                    target_port: p.target_port.as_ref().map(int_or_string),
                    node_port: p.node_port,
                    app_protocol: p.app_protocol.clone(),
                })
                .collect(),
            selector: map(&s.selector),
            cluster_ip: s.cluster_ip.clone(),
            cluster_ips: list(&s.cluster_ips),
            ip_families: list(&s.ip_families),
            ip_family_policy: s.ip_family_policy.clone(),
            external_ips: list(&s.external_ips),
            external_name: s.external_name.clone(),
            external_traffic_policy: s.external_traffic_policy.clone(),
            internal_traffic_policy: s.internal_traffic_policy.clone(),
            health_check_node_port: s.health_check_node_port,
            load_balancer_ip: s.load_balancer_ip.clone(),
            load_balancer_source_ranges: list(&s.load_balancer_source_ranges),
            load_balancer_class: s.load_balancer_class.clone(),
            allocate_load_balancer_node_ports: s.allocate_load_balancer_node_ports,
            session_affinity: s.session_affinity.clone(),
            session_affinity_timeout_seconds: s
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds),
            publish_not_ready_addresses: s.publish_not_ready_addresses,
        });
        let status = self.status.as_ref().map(|s| pb::ServiceStatus {
            load_balancer_ingress: s
                .load_balancer
                .as_ref()
                .and_then(|l| l.ingress.as_ref())
                .into_iter()
                .flatten()
                .map(|i| pb::LoadBalancerIngress {
                    ip: i.ip.clone(),
                    hostname: i.hostname.clone(),
                    ip_mode: i.ip_mode.clone(),
                })
                .collect(),
            conditions: conditions(&s.conditions),
        });
        pb::Service { metadata: Some(object_meta(&self.metadata)), spec, status, extra_json: String::new() }
    }

    fn from_typed(p: &pb::Service) -> Result<Self, Error> {
        let spec = p
            .spec
            .as_ref()
            .map(|s| -> Result<core::ServiceSpec, Error> {
                Ok(core::ServiceSpec {
                    type_: s.r#type.clone(),
                    ports: opt_list(
                        &s.ports
                            .iter()
                            .map(|p| {
                                Ok(core::ServicePort {
                                    name: p.name.clone(),
                                    protocol: p.protocol.clone(),
                                    port: p.port,
                                    target_port: p.target_port.as_ref().map(int_or_string_back).transpose()?,
                                    node_port: p.node_port,
                                    app_protocol: p.app_protocol.clone(),
                                })
                            })
                            .collect::<Result<Vec<_>, Error>>()?,
                    ),
                    selector: opt_map(&s.selector),
                    cluster_ip: s.cluster_ip.clone(),
                    cluster_ips: opt_list(&s.cluster_ips),
                    ip_families: opt_list(&s.ip_families),
                    ip_family_policy: s.ip_family_policy.clone(),
                    external_ips: opt_list(&s.external_ips),
                    external_name: s.external_name.clone(),
                    external_traffic_policy: s.external_traffic_policy.clone(),
                    internal_traffic_policy: s.internal_traffic_policy.clone(),
                    health_check_node_port: s.health_check_node_port,
                    load_balancer_ip: s.load_balancer_ip.clone(),
                    load_balancer_source_ranges: opt_list(&s.load_balancer_source_ranges),
                    load_balancer_class: s.load_balancer_class.clone(),
                    allocate_load_balancer_node_ports: s.allocate_load_balancer_node_ports,
                    session_affinity: s.session_affinity.clone(),
                    session_affinity_config: s.session_affinity_timeout_seconds.map(|t| core::SessionAffinityConfig {
                        client_ip: Some(core::ClientIPConfig { timeout_seconds: Some(t) }),
                    }),
                    publish_not_ready_addresses: s.publish_not_ready_addresses,
                    traffic_distribution: None,
                })
            })
            .transpose()?;
        let status = p
            .status
            .as_ref()
            .map(|s| -> Result<core::ServiceStatus, Error> {
                Ok(core::ServiceStatus {
                    load_balancer: Some(core::LoadBalancerStatus {
                        ingress: opt_list(
                            &s.load_balancer_ingress
                                .iter()
                                .map(|i| core::LoadBalancerIngress {
                                    ip: i.ip.clone(),
                                    hostname: i.hostname.clone(),
                                    ip_mode: i.ip_mode.clone(),
                                    ports: None,
                                })
                                .collect::<Vec<_>>(),
                        ),
                    }),
                    conditions: conditions_back(&s.conditions)?,
                })
            })
            .transpose()?;
        Ok(core::Service { metadata: object_meta_back(&p.metadata)?, spec, status })
    }
}

// === Pod ===

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

// === Node ===

fn quantities(
    m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, String> {
    m.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

fn quantities_back(
    m: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>> {
    if m.is_empty() {
        None
    } else {
        Some(
            m.iter()
                .map(|(k, v)| (k.clone(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone())))
                .collect(),
        )
    }
}

impl ProtoConvert for core::Node {
    type Proto = pb::Node;
    extra_accessors!();

    fn to_typed(&self) -> pb::Node {
        let spec = self.spec.as_ref().map(|s| pb::NodeSpec {
            pod_cidr: s.pod_cidr.clone(),
            pod_cidrs: list(&s.pod_cidrs),
            unschedulable: s.unschedulable,
            provider_id: s.provider_id.clone(),
            taints: s
                .taints
                .iter()
                .flatten()
                .map(|t| pb::Taint { key: t.key.clone(), value: t.value.clone(), effect: t.effect.clone() })
                .collect(),
        });
        let status = self.status.as_ref().map(|s| pb::NodeStatus {
            conditions: conditions(&s.conditions),
            addresses: s
                .addresses
                .iter()
                .flatten()
                .map(|a| pb::NodeAddress { r#type: a.type_.clone(), address: a.address.clone() })
                .collect(),
            capacity: quantities(&s.capacity),
            allocatable: quantities(&s.allocatable),
            node_info: s.node_info.as_ref().map(|i| pb::NodeSystemInfo {
                machine_id: i.machine_id.clone(),
                system_uuid: i.system_uuid.clone(),
                boot_id: i.boot_id.clone(),
                kernel_version: i.kernel_version.clone(),
                os_image: i.os_image.clone(),
                container_runtime_version: i.container_runtime_version.clone(),
                kubelet_version: i.kubelet_version.clone(),
                kube_proxy_version: i.kube_proxy_version.clone(),
                operating_system: i.operating_system.clone(),
                architecture: i.architecture.clone(),
            }),
            kubelet_endpoint_port: s
                .daemon_endpoints
                .as_ref()
                .and_then(|d| d.kubelet_endpoint.as_ref())
                .map(|k| k.port),
        });
        pb::Node { metadata: Some(object_meta(&self.metadata)), spec, status, extra_json: String::new() }
    }

    fn from_typed(p: &pb::Node) -> Result<Self, Error> {
        let spec = p.spec.as_ref().map(|s| core::NodeSpec {
            pod_cidr: s.pod_cidr.clone(),
            pod_cidrs: opt_list(&s.pod_cidrs),
            unschedulable: s.unschedulable,
            provider_id: s.provider_id.clone(),
            taints: opt_list(
                &s.taints
                    .iter()
                    .map(|t| core::Taint {
                        key: t.key.clone(),
                        value: t.value.clone(),
                        effect: t.effect.clone(),
                        time_added: None,
                    })
                    .collect::<Vec<_>>(),
            ),
            ..Default::default()
        });
        let status = p
            .status
            .as_ref()
            .map(|s| -> Result<core::NodeStatus, Error> {
                Ok(core::NodeStatus {
                    conditions: conditions_back(&s.conditions)?,
                    addresses: opt_list(
                        &s.addresses
                            .iter()
                            .map(|a| core::NodeAddress { type_: a.r#type.clone(), address: a.address.clone() })
                            .collect::<Vec<_>>(),
                    ),
                    capacity: quantities_back(&s.capacity),
                    allocatable: quantities_back(&s.allocatable),
                    node_info: s.node_info.as_ref().map(|i| core::NodeSystemInfo {
                        machine_id: i.machine_id.clone(),
                        system_uuid: i.system_uuid.clone(),
                        boot_id: i.boot_id.clone(),
                        kernel_version: i.kernel_version.clone(),
                        os_image: i.os_image.clone(),
                        container_runtime_version: i.container_runtime_version.clone(),
                        kubelet_version: i.kubelet_version.clone(),
                        kube_proxy_version: i.kube_proxy_version.clone(),
                        operating_system: i.operating_system.clone(),
                        architecture: i.architecture.clone(),
                        swap: None,
                    }),
                    daemon_endpoints: s.kubelet_endpoint_port.map(|port| core::NodeDaemonEndpoints {
                        kubelet_endpoint: Some(core::DaemonEndpoint { port }),
                    }),
                    ..Default::default()
                })
            })
            .transpose()?;
        Ok(core::Node { metadata: object_meta_back(&p.metadata)?, spec, status })
    }
}

// === Namespace ===

impl ProtoConvert for core::Namespace {
    type Proto = pb::Namespace;
    extra_accessors!();

    fn to_typed(&self) -> pb::Namespace {
        pb::Namespace {
            metadata: Some(object_meta(&self.metadata)),
            finalizers: self.spec.as_ref().map(|s| list(&s.finalizers)).unwrap_or_default(),
            phase: self.status.as_ref().and_then(|s| s.phase.clone()),
            extra_json: String::new(),
        }
    }

    fn from_typed(p: &pb::Namespace) -> Result<Self, Error> {
        Ok(core::Namespace {
            metadata: object_meta_back(&p.metadata)?,
            spec: opt_list(&p.finalizers).map(|f| core::NamespaceSpec { finalizers: Some(f) }),
            status: p.phase.clone().map(|phase| core::NamespaceStatus { phase: Some(phase), conditions: None }),
        })
    }
}

// === Ingress and Secret: metadata typed, the rest in extra_json ===

impl ProtoConvert for api_networking::Ingress {
    type Proto = pb::Ingress;
    extra_accessors!();

    fn to_typed(&self) -> pb::Ingress {
        pb::Ingress { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::Ingress) -> Result<Self, Error> {
        Ok(api_networking::Ingress { metadata: object_meta_back(&p.metadata)?, spec: None, status: None })
    }
}

impl ProtoConvert for core::Secret {
    type Proto = pb::Secret;
    extra_accessors!();

    fn to_typed(&self) -> pb::Secret {
        pb::Secret { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::Secret) -> Result<Self, Error> {
        Ok(core::Secret { metadata: object_meta_back(&p.metadata)?, ..Default::default() })
    }
}

// === Endpoints ===

fn endpoint_address(a: &core::EndpointAddress) -> pb::EndpointAddress {
    pb::EndpointAddress {
        ip: a.ip.clone(),
        hostname: a.hostname.clone(),
        node_name: a.node_name.clone(),
        target_ref: a.target_ref.as_ref().map(object_ref),
    }
}

fn endpoint_address_back(a: &pb::EndpointAddress) -> core::EndpointAddress {
    core::EndpointAddress {
        ip: a.ip.clone(),
        hostname: a.hostname.clone(),
        node_name: a.node_name.clone(),
        target_ref: a.target_ref.as_ref().map(object_ref_back),
    }
}

impl ProtoConvert for core::Endpoints {
    type Proto = pb::Endpoints;
    extra_accessors!();

    fn to_typed(&self) -> pb::Endpoints {
        pb::Endpoints {
            metadata: Some(object_meta(&self.metadata)),
            subsets: self
                .subsets
                .iter()
                .flatten()
                .map(|s| pb::EndpointSubset {
                    addresses: s.addresses.iter().flatten().map(endpoint_address).collect(),
                    not_ready_addresses: s.not_ready_addresses.iter().flatten().map(endpoint_address).collect(),
                    ports: s
                        .ports
                        .iter()
                        .flatten()
                        .map(|p| pb::EndpointPort {
                            name: p.name.clone(),
                            port: Some(p.port),
                            protocol: p.protocol.clone(),
                            app_protocol: p.app_protocol.clone(),
                        })
                        .collect(),
                })
                .collect(),
            extra_json: String::new(),
        }
    }

    fn from_typed(p: &pb::Endpoints) -> Result<Self, Error> {
        Ok(core::Endpoints {
            metadata: object_meta_back(&p.metadata)?,
            subsets: opt_list(
                &p.subsets
                    .iter()
                    .map(|s| core::EndpointSubset {
                        addresses: opt_list(&s.addresses.iter().map(endpoint_address_back).collect::<Vec<_>>()),
                        not_ready_addresses: opt_list(
                            &s.not_ready_addresses.iter().map(endpoint_address_back).collect::<Vec<_>>(),
                        ),
                        ports: opt_list(
                            &s.ports
                                .iter()
                                .map(|p| core::EndpointPort {
                                    name: p.name.clone(),
                                    port: p.port.unwrap_or_default(),
                                    protocol: p.protocol.clone(),
                                    app_protocol: p.app_protocol.clone(),
                                })
                                .collect::<Vec<_>>(),
                        ),
                    })
                    .collect::<Vec<_>>(),
            ),
        })
    }
}

// === EndpointSlice ===

impl ProtoConvert for discovery::EndpointSlice {
    type Proto = pb::EndpointSlice;
    extra_accessors!();

    fn to_typed(&self) -> pb::EndpointSlice {
        pb::EndpointSlice {
            metadata: Some(object_meta(&self.metadata)),
            address_type: self.address_type.clone(),
            endpoints: self
                .endpoints
                .iter()
                .map(|e| pb::Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: e.conditions.as_ref().map(|c| pb::EndpointConditions {
                        ready: c.ready,
                        serving: c.serving,
                        terminating: c.terminating,
                    }),
                    hostname: e.hostname.clone(),
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    target_ref: e.target_ref.as_ref().map(object_ref),
                })
                .collect(),
            ports: self
                .ports
                .iter()
                .flatten()
                .map(|p| pb::EndpointPort {
                    name: p.name.clone(),
                    port: p.port,
                    protocol: p.protocol.clone(),
                    app_protocol: p.app_protocol.clone(),
                })
                .collect(),
            extra_json: String::new(),
        }
    }

    fn from_typed(p: &pb::EndpointSlice) -> Result<Self, Error> {
        Ok(discovery::EndpointSlice {
            metadata: object_meta_back(&p.metadata)?,
            address_type: p.address_type.clone(),
            endpoints: p
                .endpoints
                .iter()
                .map(|e| discovery::Endpoint {
                    addresses: e.addresses.clone(),
                    conditions: e.conditions.as_ref().map(|c| discovery::EndpointConditions {
                        ready: c.ready,
                        serving: c.serving,
                        terminating: c.terminating,
                    }),
                    hostname: e.hostname.clone(),
                    node_name: e.node_name.clone(),
                    zone: e.zone.clone(),
                    target_ref: e.target_ref.as_ref().map(object_ref_back),
                    ..Default::default()
                })
                .collect(),
            ports: opt_list(
                &p.ports
                    .iter()
                    .map(|p| discovery::EndpointPort {
                        name: p.name.clone(),
                        port: p.port,
                        protocol: p.protocol.clone(),
                        app_protocol: p.app_protocol.clone(),
                    })
                    .collect::<Vec<_>>(),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip<T: ProtoConvert + PartialEq + std::fmt::Debug>(v: Value) -> T::Proto {
        let obj: T = serde_json::from_value(v).unwrap();
        let p = to_proto(&obj);
        let back: T = from_proto(&p).unwrap();
        assert_eq!(back, obj);
        // The bytes survive too.
        let bytes = prost::Message::encode_to_vec(&p);
        let decoded = <T::Proto as prost::Message>::decode(bytes.as_slice()).unwrap();
        assert_eq!(from_proto::<T>(&decoded).unwrap(), obj);
        p
    }

    #[test]
    fn service_round_trips_with_no_extra() {
        let p = round_trip::<core::Service>(json!({
            "metadata": {"name": "contour", "namespace": "default", "uid": "u1", "resourceVersion": "7",
                         "creationTimestamp": "2026-11-22T10:00:00Z", "labels": {"app": "contour"}},
            "spec": {"type": "LoadBalancer", "selector": {"app": "contour"}, "clusterIP": "10.96.0.10",
                     "clusterIPs": ["10.96.0.10"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"},
                               {"name": "https", "port": 443, "targetPort": "https", "nodePort": 30443, "protocol": "TCP"}],
                     "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
                     "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000, "internalTrafficPolicy": "Cluster",
                     "allocateLoadBalancerNodePorts": true, "loadBalancerSourceRanges": ["203.0.113.0/24"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}
        }));
        assert_eq!(p.extra_json, "");
    }

    #[test]
    fn unmodeled_fields_travel_in_extra() {
        let p = round_trip::<core::Service>(json!({
            "metadata": {"name": "x", "labels": {}, "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"trafficDistribution": "PreferClose", "ports": []}
        }));
        assert!(p.extra_json.contains("trafficDistribution"));
        assert!(p.extra_json.contains("managedFields"));
    }

    #[test]
    fn pod_node_namespace_endpoints_round_trip() {
        round_trip::<core::Pod>(json!({
            "metadata": {"name": "web", "namespace": "default", "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "1", "controller": true}]},
            "spec": {"nodeName": "node-1", "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "web", "image": "podpath/echo", "args": ["--x"], "env": [{"name": "A", "value": "b"}],
                                     "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                                     "readinessProbe": {"httpGet": {"port": "http", "path": "/"}, "periodSeconds": 1},
                                     "livenessProbe": {"tcpSocket": {"port": 8080}}}],
                     "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.244.1.2", "podIPs": [{"ip": "10.244.1.2"}],
                       "hostIP": "192.168.56.11", "startTime": "2026-11-22T10:00:00Z",
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T10:00:01Z"}],
                       "containerStatuses": [{"name": "web", "ready": true, "restartCount": 1, "image": "podpath/echo", "imageID": "",
                                              "state": {"running": {"startedAt": "2026-11-22T10:00:00Z"}},
                                              "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
        }));
        round_trip::<core::Node>(json!({
            "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.11"}],
                       "capacity": {"cpu": "2", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-22T10:00:00Z"}],
                       "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                                    "osImage": "Debian", "containerRuntimeVersion": "podpath://0.1", "kubeletVersion": "v1.32.0",
                                    "kubeProxyVersion": "v1.32.0", "operatingSystem": "linux", "architecture": "amd64"}}
        }));
        round_trip::<core::Namespace>(json!({
            "metadata": {"name": "default"}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}
        }));
        round_trip::<core::Endpoints>(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.244.1.2", "nodeName": "node-1", "targetRef": {"kind": "Pod", "name": "web"}}],
                         "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]
        }));
        round_trip::<discovery::EndpointSlice>(json!({
            "metadata": {"name": "web-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.2"], "conditions": {"ready": true, "serving": true, "terminating": false},
                           "nodeName": "node-1"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }));
    }
}
