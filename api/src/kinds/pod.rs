//! core/v1 Pods: defaults and validation of pod specs (shared with the workload templates), graceful deletion, and the Table kubectl prints.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus, Probe};
use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_int_or_name, validate_meta, validate_protocol, ApiObject, DeleteContext, DeletePlan, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::Pod;

fn default_container(c: &mut Container) {
    c.termination_message_path.get_or_insert_with(|| "/dev/termination-log".into());
    c.termination_message_policy.get_or_insert_with(|| "File".into());
    if c.image_pull_policy.is_none() {
        let image = c.image.clone().unwrap_or_default();
        let last = image.rsplit('/').next().unwrap_or("");
        let tagged = last.contains(':') && !last.ends_with(":latest");
        c.image_pull_policy = Some(if tagged || image.contains('@') { "IfNotPresent" } else { "Always" }.into());
    }
    for p in c.ports.iter_mut().flatten() {
        p.protocol.get_or_insert_with(|| "TCP".into());
    }
    for probe in [&mut c.readiness_probe, &mut c.liveness_probe, &mut c.startup_probe].into_iter().flatten() {
        probe.timeout_seconds.get_or_insert(1);
        probe.period_seconds.get_or_insert(10);
        probe.success_threshold.get_or_insert(1);
        probe.failure_threshold.get_or_insert(3);
        if let Some(h) = probe.http_get.as_mut() {
            h.path.get_or_insert_with(|| "/".into());
            h.scheme.get_or_insert_with(|| "HTTP".into());
        }
    }
}

fn validate_probe(probe: &Probe, path: &FieldPath, out: &mut Vec<Cause>) {
    let mut handlers = 0;
    if let Some(t) = &probe.tcp_socket {
        handlers += 1;
        validate_int_or_name(&t.port, &path.child("tcpSocket").child("port"), out);
    }
    if let Some(h) = &probe.http_get {
        handlers += 1;
        validate_int_or_name(&h.port, &path.child("httpGet").child("port"), out);
    }
    if probe.exec.is_some() {
        handlers += 1;
    }
    if probe.grpc.is_some() {
        handlers += 1;
    }
    if handlers == 0 {
        out.push(v::required(path, "must specify a handler type"));
    } else if handlers > 1 {
        out.push(v::forbidden(path, "may not specify more than 1 handler type"));
    }
    for (name, val) in [("periodSeconds", probe.period_seconds), ("timeoutSeconds", probe.timeout_seconds)] {
        if let Some(n) = val.filter(|n| *n < 1) {
            out.push(v::invalid(&path.child(name), &n, "must be greater than or equal to 1"));
        }
    }
}

fn validate_containers(
    containers: &[Container],
    path: &FieldPath,
    port_names: &mut BTreeSet<String>,
    out: &mut Vec<Cause>,
) {
    let mut names = BTreeSet::new();
    for (i, c) in containers.iter().enumerate() {
        let cp = path.index(i);
        if c.name.is_empty() {
            out.push(v::required(&cp.child("name"), ""));
        } else {
            v::push_all(out, &cp.child("name"), &c.name, v::dns1123_label(&c.name));
            if !names.insert(c.name.clone()) {
                out.push(v::duplicate(&cp.child("name"), c.name.as_str()));
            }
        }
        if c.image.as_deref().unwrap_or("").trim().is_empty() {
            out.push(v::required(&cp.child("image"), ""));
        }
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let pp = cp.child("ports").index(j);
            if !v::port_in_range(p.container_port) {
                out.push(v::invalid(&pp.child("containerPort"), &p.container_port, v::PORT_RANGE_MSG));
            }
            if let Some(hp) = p.host_port.filter(|h| *h != 0) {
                if !v::port_in_range(hp) {
                    out.push(v::invalid(&pp.child("hostPort"), &hp, v::PORT_RANGE_MSG));
                }
            }
            if let Some(name) = p.name.as_deref().filter(|n| !n.is_empty()) {
                v::push_all(out, &pp.child("name"), name, v::iana_svc_name(name));
                if !port_names.insert(name.to_string()) {
                    out.push(v::duplicate(&pp.child("name"), name));
                }
            }
            validate_protocol(p.protocol.as_deref(), &pp.child("protocol"), out);
        }
        for (name, probe) in [
            ("readinessProbe", &c.readiness_probe),
            ("livenessProbe", &c.liveness_probe),
            ("startupProbe", &c.startup_probe),
        ] {
            if let Some(p) = probe {
                validate_probe(p, &cp.child(name), out);
            }
        }
        for (j, e) in c.env.iter().flatten().enumerate() {
            if e.name.is_empty() {
                out.push(v::required(&cp.child("env").index(j).child("name"), ""));
            }
        }
    }
}

/// The fields of a pod spec an update may change (the real server also allows a few more).
fn pod_spec_mutable_view(pod: &Pod) -> Value {
    let mut spec = serde_json::to_value(&pod.spec).unwrap_or_default();
    for list in ["containers", "initContainers"] {
        if let Some(cs) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs {
                c.as_object_mut().map(|o| o.remove("image"));
            }
        }
    }
    if let Some(o) = spec.as_object_mut() {
        // Ephemeral containers change through their own subresource, checked on their own.
        for k in ["activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "ephemeralContainers"] {
            o.remove(k);
        }
    }
    spec
}

/// Ephemeral containers (`kubectl debug`): only added, never changed or removed; each new one a
/// valid container of a unique name, without the fields an ephemeral container may not have,
/// its `targetContainerName` one of the pod's containers. The real texts.
fn validate_ephemeral(
    spec: &PodSpec,
    before: &[k8s_openapi::api::core::v1::EphemeralContainer],
    after: &[k8s_openapi::api::core::v1::EphemeralContainer],
    path: &FieldPath,
    out: &mut Vec<Cause>,
) {
    for b in before {
        match after.iter().find(|a| a.name == b.name) {
            None => out.push(v::forbidden(path, &format!("existing ephemeral containers \"{}\" may not be removed", b.name))),
            Some(a) if a != b => {
                let i = after.iter().position(|x| x.name == b.name).unwrap_or(0);
                out.push(v::forbidden(&path.index(i), &format!("existing ephemeral containers \"{}\" may not be changed", b.name)));
            }
            _ => {}
        }
    }
    let mut names: BTreeSet<String> = spec.containers.iter().map(|c| c.name.clone()).collect();
    names.extend(spec.init_containers.iter().flatten().map(|c| c.name.clone()));
    let mut claimed: BTreeSet<&str> = BTreeSet::new();
    for (i, e) in after.iter().enumerate() {
        // The first entry of an existing name is that container; any other is new.
        if before.iter().any(|b| b.name == e.name) && claimed.insert(e.name.as_str()) {
            names.insert(e.name.clone());
            continue;
        }
        let p = path.index(i);
        if e.name.is_empty() {
            out.push(v::required(&p.child("name"), ""));
        } else if !names.insert(e.name.clone()) {
            out.push(v::duplicate(&p.child("name"), e.name.as_str()));
        } else {
            v::push_all(out, &p.child("name"), &e.name, v::dns1123_label(&e.name));
        }
        if e.image.as_deref().is_none_or(str::is_empty) {
            out.push(v::required(&p.child("image"), ""));
        }
        if let Some(t) = e.target_container_name.as_deref() {
            if !spec.containers.iter().any(|c| c.name == t) {
                out.push(Cause {
                    reason: "FieldValueNotFound".into(),
                    field: p.child("targetContainerName").to_string(),
                    message: format!("Not found: {t:?}"),
                });
            }
        }
        let forbidden = [
            ("ports", e.ports.as_ref().is_some_and(|x| !x.is_empty())),
            ("livenessProbe", e.liveness_probe.is_some()),
            ("readinessProbe", e.readiness_probe.is_some()),
            ("startupProbe", e.startup_probe.is_some()),
            ("lifecycle", e.lifecycle.is_some()),
            ("resources", e.resources.as_ref().is_some_and(|r| r.limits.is_some() || r.requests.is_some())),
        ];
        for (field, set) in forbidden {
            if set {
                out.push(v::forbidden(&p.child(field), "cannot be set for an Ephemeral Container"));
            }
        }
    }
}

/// The API server's defaults for a pod spec (pods and the templates of workloads).
pub(crate) fn default_pod_spec(spec: &mut PodSpec) {
    spec.restart_policy.get_or_insert_with(|| "Always".into());
    spec.dns_policy.get_or_insert_with(|| "ClusterFirst".into());
    spec.scheduler_name.get_or_insert_with(|| "default-scheduler".into());
    spec.termination_grace_period_seconds.get_or_insert(30);
    spec.security_context.get_or_insert_with(Default::default);
    spec.enable_service_links.get_or_insert(true);
    spec.service_account_name.get_or_insert_with(|| "default".into());
    spec.priority.get_or_insert(0);
    spec.preemption_policy.get_or_insert_with(|| "PreemptLowerPriority".into());
    for c in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
        default_container(c);
    }
}

/// Validates a pod spec at `spec_path` (pods and the templates of workloads).
pub(crate) fn validate_pod_spec(spec: &PodSpec, spec_path: &FieldPath, out: &mut Vec<Cause>) {
    if spec.containers.is_empty() {
        out.push(v::required(&spec_path.child("containers"), ""));
    }
    let mut port_names = BTreeSet::new();
    validate_containers(&spec.containers, &spec_path.child("containers"), &mut port_names, out);
    if let Some(init) = &spec.init_containers {
        validate_containers(init, &spec_path.child("initContainers"), &mut port_names, out);
    }
    if let Some(rp) = spec.restart_policy.as_deref() {
        if !["Always", "OnFailure", "Never"].contains(&rp) {
            out.push(v::not_supported(&spec_path.child("restartPolicy"), rp, &["Always", "OnFailure", "Never"]));
        }
    }
    if let Some(dp) = spec.dns_policy.as_deref() {
        const DNS: [&str; 4] = ["ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"];
        if !DNS.contains(&dp) {
            out.push(v::not_supported(&spec_path.child("dnsPolicy"), dp, &DNS));
        }
    }
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        v::push_all(out, &spec_path.child("nodeName"), node, v::dns1123_subdomain(node));
    }
    if let Some(g) = spec.termination_grace_period_seconds.filter(|g| *g < 0) {
        out.push(v::invalid(&spec_path.child("terminationGracePeriodSeconds"), &g, "must be >= 0"));
    }
}

/// Whether the pod's Ready condition is True (what Services and workloads count).
pub fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

impl ApiObject for Pod {
    const KIND: Kind = Kind::Pod;
    const INFO: KindInfo = KindInfo {
        short_names: &["po"],
        categories: &["all"],
        has_status: true,
        has_generation: true,
        field_selectors: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ..KindInfo::core("Pod", "pods", "pod")
    };

    fn apply_defaults(&mut self) {
        default_pod_spec(self.spec.get_or_insert_with(Default::default));
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(PodStatus {
            phase: Some("Pending".into()),
            qos_class: Some("BestEffort".into()),
            ..Default::default()
        });
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let spec_path = FieldPath::root("spec");
        let Some(spec) = &self.spec else {
            out.push(v::required(&spec_path, ""));
            return out;
        };
        validate_pod_spec(spec, &spec_path, &mut out);
        let ephemeral = spec.ephemeral_containers.clone().unwrap_or_default();
        match old {
            None if !ephemeral.is_empty() => {
                out.push(v::forbidden(&spec_path.child("ephemeralContainers"), "cannot be set on create"));
            }
            None => {}
            Some(o) => {
                let before = o.spec.as_ref().and_then(|s| s.ephemeral_containers.clone()).unwrap_or_default();
                validate_ephemeral(spec, &before, &ephemeral, &spec_path.child("ephemeralContainers"), &mut out);
            }
        }
        if let Some(old) = old {
            let mut before = pod_spec_mutable_view(old);
            let after = pod_spec_mutable_view(self);
            // The scheduler's binding sets nodeName once; afterwards it is immutable.
            if old.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                if let (Some(b), Some(n)) = (before.as_object_mut(), after.get("nodeName")) {
                    b.insert("nodeName".into(), n.clone());
                }
            }
            if before != after {
                out.push(v::forbidden(&spec_path, "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"));
            }
        }
        out
    }

    /// A pod on a live node terminates gracefully: it is marked, its node agent stops the
    /// workload and then deletes the pod with grace period 0. Grace 0, a pod not (or no longer)
    /// running, or a node that is not Ready: removed now.
    fn deletion(&self, ctx: &DeleteContext<'_>) -> DeletePlan {
        let grace = ctx
            .grace_period_seconds
            .or_else(|| self.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
            .unwrap_or(30);
        let node = self.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("");
        let phase = self.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("");
        let terminal = phase == "Succeeded" || phase == "Failed";
        if grace <= 0 || node.is_empty() || terminal || !(ctx.node_ready)(node) {
            return DeletePlan::Remove;
        }
        if self.metadata.deletion_timestamp.is_some() {
            return DeletePlan::AlreadyDeleting;
        }
        // A grace period past the clock's range (int64 seconds are allowed) ends at its end.
        let at = ctx.now.checked_add(jiff::SignedDuration::from_secs(grace)).unwrap_or(Timestamp::MAX);
        DeletePlan::MarkDeleting { at, grace_seconds: Some(grace), phase: None }
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Ready", "string", 0),
            col("Status", "string", 0),
            col("Restarts", "string", 0),
            AGE_COLUMN,
            col("IP", "string", 1),
            col("Node", "string", 1),
            col("Nominated Node", "string", 1),
            col("Readiness Gates", "string", 1),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.clone().unwrap_or_default();
        let total = spec.containers.len();
        let statuses = status.container_statuses.clone().unwrap_or_default();
        let ready =
            statuses.iter().filter(|s| s.ready && s.state.as_ref().is_some_and(|st| st.running.is_some())).count();
        let mut reason = status.reason.clone().or_else(|| status.phase.clone()).unwrap_or_else(|| "Pending".into());
        let mut restarts = 0;
        let mut last_restart: Option<Timestamp> = None;
        for cs in &statuses {
            restarts += cs.restart_count;
            if let Some(t) =
                cs.last_state.as_ref().and_then(|l| l.terminated.as_ref()).and_then(|t| t.finished_at.as_ref())
            {
                if last_restart.is_none_or(|l| t.0 > l) {
                    last_restart = Some(t.0);
                }
            }
            if let Some(state) = &cs.state {
                if let Some(w) = state.waiting.as_ref().and_then(|w| w.reason.clone()).filter(|r| !r.is_empty()) {
                    reason = w;
                } else if let Some(t) = &state.terminated {
                    reason = match t.reason.clone().filter(|r| !r.is_empty()) {
                        Some(r) => r,
                        None if t.signal.unwrap_or(0) != 0 => format!("Signal:{}", t.signal.unwrap_or(0)),
                        None => format!("ExitCode:{}", t.exit_code),
                    };
                }
            }
        }
        let phase = status.phase.clone().unwrap_or_default();
        if self.metadata.deletion_timestamp.is_some() && phase != "Succeeded" && phase != "Failed" {
            reason = "Terminating".into();
        }
        let restarts = match last_restart {
            Some(t) => format!("{} ({} ago)", restarts, table::human_duration(now.duration_since(t).as_secs())),
            None => restarts.to_string(),
        };
        let ip = status
            .pod_ips
            .as_ref()
            .and_then(|ips| ips.first())
            .map(|i| i.ip.clone())
            .unwrap_or_else(|| "<none>".into());
        let gates = match spec.readiness_gates.as_ref().filter(|g| !g.is_empty()) {
            None => "<none>".to_string(),
            Some(gates) => {
                let conds = status.conditions.clone().unwrap_or_default();
                let ok = gates
                    .iter()
                    .filter(|g| conds.iter().any(|c| c.type_ == g.condition_type && c.status == "True"))
                    .count();
                format!("{}/{}", ok, gates.len())
            }
        };
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(format!("{ready}/{total}")),
            json!(reason),
            json!(restarts),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
            json!(ip),
            json!(spec.node_name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "<none>".into())),
            json!(status.nominated_node_name.clone().unwrap_or_else(|| "<none>".into())),
            json!(gates),
        ]
    }
}

#[cfg(test)]
mod ephemeral_tests {
    use super::*;

    fn pod(ephemeral: Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "web", "image": "nginx"}], "ephemeralContainers": ephemeral}}))
        .unwrap()
    }

    fn causes(new: &Pod, old: Option<&Pod>) -> Vec<String> {
        new.validate(old).iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn ephemeral_containers_are_only_added_and_checked_with_the_real_texts() {
        let none = pod(json!([]));
        let one = pod(json!([{"name": "dbg", "image": "busybox", "targetContainerName": "web"}]));
        assert_eq!(causes(&one, Some(&none)), Vec::<String>::new());
        assert_eq!(causes(&one, None), ["spec.ephemeralContainers: Forbidden: cannot be set on create"]);
        assert_eq!(causes(&none, Some(&one)), ["spec.ephemeralContainers: Forbidden: existing ephemeral containers \"dbg\" may not be removed"]);
        let changed = pod(json!([{"name": "dbg", "image": "alpine", "targetContainerName": "web"}]));
        assert_eq!(causes(&changed, Some(&one)), ["spec.ephemeralContainers[0]: Forbidden: existing ephemeral containers \"dbg\" may not be changed"]);
        let bad = pod(json!([{"name": "dbg", "image": "busybox", "targetContainerName": "web"},
            {"name": "web", "image": "busybox"},
            {"name": "x", "targetContainerName": "nope", "ports": [{"containerPort": 80}]}]));
        assert_eq!(
            causes(&bad, Some(&one)),
            [
                "spec.ephemeralContainers[1].name: Duplicate value: \"web\"",
                "spec.ephemeralContainers[2].image: Required value",
                "spec.ephemeralContainers[2].targetContainerName: Not found: \"nope\"",
                "spec.ephemeralContainers[2].ports: Forbidden: cannot be set for an Ephemeral Container",
            ]
        );
    }
}
