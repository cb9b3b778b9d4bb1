//! Per-kind behaviour of the API objects: defaulting and validation as the real API server does
//! them, and the Table cells kubectl prints. All pure: no clock (callers pass `now`), no I/O.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    Container, Endpoints, Event, Namespace, Node, Pod, PodSpec, PodStatus, Probe, Service, ServiceStatus,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::kinds::Kind;
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

/// Behaviour shared by every kind apiserver-lite stores.
pub trait ApiObject:
    k8s_openapi::Metadata<Ty = ObjectMeta> + Serialize + DeserializeOwned + Clone + Send + Sync + 'static
{
    const KIND: Kind;

    /// Fills in what the real API server defaults (visible in `-o yaml`).
    fn apply_defaults(&mut self) {}

    /// Resets what a client may not set on create (mostly status).
    fn prepare_for_create(&mut self) {}

    /// Drops what an update leaves behind by accident (fields that belong to an old type).
    fn prepare_for_update(&mut self, _old: &Self) {}

    /// Validates the whole object; `old` is the stored object on updates.
    fn validate(&self, old: Option<&Self>) -> Vec<Cause>;

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Created At", "date", 0)]
    }

    /// Cells in the order of [`ApiObject::columns`].
    fn cells(&self, _now: Timestamp) -> Vec<Value> {
        let created = self.metadata().creation_timestamp.as_ref().map(|t| t.0.to_string());
        vec![json!(self.metadata().name.clone().unwrap_or_default()), json!(created.unwrap_or_default())]
    }
}

/// Validates `metadata`: the name rule of the kind, labels and annotations.
pub(crate) fn validate_meta(meta: &ObjectMeta, name_rule: fn(&str) -> Vec<String>, out: &mut Vec<Cause>) {
    let path = FieldPath::root("metadata");
    match meta.name.as_deref() {
        None | Some("") => out.push(v::required(&path.child("name"), "name or generateName is required")),
        Some(name) => v::push_all(out, &path.child("name"), name, name_rule(name)),
    }
    if let Some(ns) = meta.namespace.as_deref() {
        if !ns.is_empty() {
            v::push_all(out, &path.child("namespace"), ns, v::dns1123_label(ns));
        }
    }
    if let Some(labels) = &meta.labels {
        v::labels(labels, &path.child("labels"), out);
    }
    if let Some(annotations) = &meta.annotations {
        v::annotations(annotations, &path.child("annotations"), out);
    }
}

fn validate_protocol(p: Option<&str>, path: &FieldPath, out: &mut Vec<Cause>) {
    match p {
        None => out.push(v::required(path, "")),
        Some("TCP" | "UDP" | "SCTP") => {}
        Some(other) => out.push(v::not_supported(path, other, &["SCTP", "TCP", "UDP"])),
    }
}

/// A port that may be a number or an IANA service name (targetPort, probe ports).
fn validate_int_or_name(p: &IntOrString, path: &FieldPath, out: &mut Vec<Cause>) {
    match p {
        IntOrString::Int(n) => {
            if !v::port_in_range(*n) {
                out.push(v::invalid(path, n, v::PORT_RANGE_MSG));
            }
        }
        IntOrString::String(s) => v::push_all(out, path, s, v::iana_svc_name(s)),
    }
}

// === Service ===

pub const SERVICE_TYPES: [&str; 4] = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"];

/// `spec.type`, defaulted.
pub fn service_type(svc: &Service) -> &str {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()).unwrap_or("ClusterIP")
}

/// Whether the Service's type gets NodePorts allocated.
pub fn service_wants_node_ports(svc: &Service) -> bool {
    let spec = match &svc.spec {
        Some(s) => s,
        None => return false,
    };
    match spec.type_.as_deref() {
        Some("NodePort") => true,
        Some("LoadBalancer") => spec.allocate_load_balancer_node_ports.unwrap_or(true),
        _ => false,
    }
}

/// Whether the Service is headless (`clusterIP: None`).
pub fn service_is_headless(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

impl ApiObject for Service {
    const KIND: Kind = Kind::Service;

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        let ty = spec.type_.get_or_insert_with(|| "ClusterIP".into()).clone();
        let affinity = spec.session_affinity.get_or_insert_with(|| "None".into()).clone();
        if affinity == "ClientIP" {
            let cfg = spec.session_affinity_config.get_or_insert_with(Default::default);
            let cip = cfg.client_ip.get_or_insert_with(Default::default);
            cip.timeout_seconds.get_or_insert(10800);
        }
        for port in spec.ports.iter_mut().flatten() {
            port.protocol.get_or_insert_with(|| "TCP".into());
            let unset = match &port.target_port {
                None => true,
                Some(IntOrString::Int(0)) => true,
                Some(IntOrString::String(s)) => s.is_empty(),
                _ => false,
            };
            if unset {
                port.target_port = Some(IntOrString::Int(port.port));
            }
        }
        if ty == "NodePort" || ty == "LoadBalancer" {
            spec.external_traffic_policy.get_or_insert_with(|| "Cluster".into());
        }
        if ty == "LoadBalancer" {
            spec.allocate_load_balancer_node_ports.get_or_insert(true);
        }
        if ty != "ExternalName" {
            spec.internal_traffic_policy.get_or_insert_with(|| "Cluster".into());
        }
        let status = self.status.get_or_insert_with(ServiceStatus::default);
        status.load_balancer.get_or_insert_with(Default::default);
    }

    /// A type change drops the fields of the old type that the client did not change, as the
    /// real server does: a client-side apply patch from NodePort to ClusterIP still carries the
    /// old nodePorts.
    fn prepare_for_update(&mut self, old: &Self) {
        let new_ty = service_type(self).to_string();
        if new_ty == service_type(old) {
            return;
        }
        let old_spec = old.spec.clone().unwrap_or_default();
        let wants_node_ports = service_wants_node_ports(self);
        let Some(spec) = self.spec.as_mut() else { return };
        if !wants_node_ports {
            for p in spec.ports.iter_mut().flatten() {
                let same_as_old =
                    old_spec.ports.iter().flatten().any(|o| o.port == p.port && o.node_port == p.node_port);
                if same_as_old {
                    p.node_port = None;
                }
            }
        }
        if new_ty != "LoadBalancer" {
            if spec.health_check_node_port == old_spec.health_check_node_port {
                spec.health_check_node_port = None;
            }
            if spec.allocate_load_balancer_node_ports == old_spec.allocate_load_balancer_node_ports {
                spec.allocate_load_balancer_node_ports = None;
            }
            if spec.load_balancer_source_ranges == old_spec.load_balancer_source_ranges {
                spec.load_balancer_source_ranges = None;
            }
        }
        if new_ty != "NodePort"
            && new_ty != "LoadBalancer"
            && spec.external_traffic_policy == old_spec.external_traffic_policy
        {
            spec.external_traffic_policy = None;
        }
        if new_ty == "ExternalName" && spec.cluster_ip == old_spec.cluster_ip {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
        }
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(ServiceStatus { load_balancer: Some(Default::default()), ..Default::default() });
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1035_label, &mut out);
        let spec_path = FieldPath::root("spec");
        let Some(spec) = &self.spec else {
            out.push(v::required(&spec_path, ""));
            return out;
        };
        let ty = spec.type_.as_deref().unwrap_or("ClusterIP");
        if !SERVICE_TYPES.contains(&ty) {
            out.push(v::not_supported(&spec_path.child("type"), ty, &SERVICE_TYPES));
        }
        let ports = spec.ports.as_deref().unwrap_or_default();
        let headless = spec.cluster_ip.as_deref() == Some("None");
        let ports_path = spec_path.child("ports");
        if ty == "ExternalName" {
            match spec.external_name.as_deref() {
                None | Some("") => out.push(v::required(&spec_path.child("externalName"), "")),
                Some(n) => {
                    let n = n.strip_suffix('.').unwrap_or(n);
                    v::push_all(&mut out, &spec_path.child("externalName"), n, v::dns1123_subdomain(n));
                }
            }
        } else if ports.is_empty() && !headless {
            out.push(v::required(&ports_path, ""));
        }

        let mut names = BTreeSet::new();
        let mut keys = BTreeSet::new();
        let mut node_ports = BTreeSet::new();
        for (i, p) in ports.iter().enumerate() {
            let path = ports_path.index(i);
            match p.name.as_deref() {
                None | Some("") if ports.len() > 1 => out.push(v::required(&path.child("name"), "")),
                None | Some("") => {}
                Some(name) => {
                    v::push_all(&mut out, &path.child("name"), name, v::dns1123_label(name));
                    if !names.insert(name) {
                        out.push(v::duplicate(&path.child("name"), name));
                    }
                }
            }
            if !v::port_in_range(p.port) {
                out.push(v::invalid(&path.child("port"), &p.port, v::PORT_RANGE_MSG));
            }
            validate_protocol(p.protocol.as_deref(), &path.child("protocol"), &mut out);
            if let Some(tp) = &p.target_port {
                validate_int_or_name(tp, &path.child("targetPort"), &mut out);
            }
            let proto = p.protocol.clone().unwrap_or_default();
            if !keys.insert((p.port, proto.clone())) {
                out.push(v::duplicate(&path, format!("{{port: {}, protocol: {}}}", p.port, proto).as_str()));
            }
            if let Some(np) = p.node_port.filter(|n| *n != 0) {
                if ty == "ClusterIP" || ty == "ExternalName" {
                    out.push(v::forbidden(&path.child("nodePort"), &format!("may not be used when `type` is '{ty}'")));
                } else if !node_ports.insert((np, proto)) {
                    out.push(v::duplicate(&path.child("nodePort"), &np));
                }
            }
        }

        if let Some(ip) = spec.cluster_ip.as_deref() {
            if ip != "None" && !ip.is_empty() && v::valid_ip(ip).is_none() {
                out.push(v::invalid(&spec_path.child("clusterIPs").index(0), ip, v::IP_MSG));
            }
            if ip == "None" && (ty == "NodePort" || ty == "LoadBalancer") {
                out.push(v::invalid(
                    &spec_path.child("clusterIPs").index(0),
                    ip,
                    &format!("may not be set to 'None' for {ty} services"),
                ));
            }
        }
        if let (Some(ip), Some(ips)) = (spec.cluster_ip.as_deref(), spec.cluster_ips.as_ref()) {
            if !ip.is_empty() && ips.first().is_some_and(|first| first != ip) {
                out.push(v::invalid(
                    &spec_path.child("clusterIPs"),
                    ips.as_slice(),
                    "element [0] must match clusterIP",
                ));
            }
        }
        for (i, fam) in spec.ip_families.iter().flatten().enumerate() {
            if fam != "IPv4" {
                out.push(v::not_supported(&spec_path.child("ipFamilies").index(i), fam.as_str(), &["IPv4"]));
            }
        }
        if let Some(policy) = spec.ip_family_policy.as_deref() {
            const POLICIES: [&str; 3] = ["PreferDualStack", "RequireDualStack", "SingleStack"];
            if !POLICIES.contains(&policy) {
                out.push(v::not_supported(&spec_path.child("ipFamilyPolicy"), policy, &POLICIES));
            } else if policy == "RequireDualStack" {
                out.push(v::invalid(
                    &spec_path.child("ipFamilyPolicy"),
                    policy,
                    "this cluster is not configured for dual-stack services",
                ));
            }
        }

        for (i, ip) in spec.external_ips.iter().flatten().enumerate() {
            let path = spec_path.child("externalIPs").index(i);
            match v::valid_ip(ip) {
                None => out.push(v::invalid(&path, ip.as_str(), v::IP_MSG)),
                Some(addr) if addr.is_unspecified() || addr.is_loopback() || addr.is_multicast() => {
                    out.push(v::invalid(&path, ip.as_str(), "may not be unspecified, loopback or multicast"))
                }
                Some(_) => {}
            }
        }
        if let Some(ranges) = &spec.load_balancer_source_ranges {
            let path = spec_path.child("loadBalancerSourceRanges");
            if ty != "LoadBalancer" && !ranges.is_empty() {
                out.push(v::forbidden(&path, "may only be used when `type` is 'LoadBalancer'"));
            }
            for (i, r) in ranges.iter().enumerate() {
                if !v::valid_cidr(r.trim()) {
                    out.push(v::invalid(&path.index(i), r.as_str(), v::CIDR_MSG));
                }
            }
        }
        if let Some(ip) = spec.load_balancer_ip.as_deref() {
            if !ip.is_empty() && v::valid_ip(ip).is_none() {
                out.push(v::invalid(&spec_path.child("loadBalancerIP"), ip, v::IP_MSG));
            }
        }
        if spec.allocate_load_balancer_node_ports.is_some() && ty != "LoadBalancer" {
            out.push(v::forbidden(
                &spec_path.child("allocateLoadBalancerNodePorts"),
                "may only be used when `type` is 'LoadBalancer'",
            ));
        }

        match spec.session_affinity.as_deref() {
            Some("None") | None => {
                if spec.session_affinity_config.is_some() {
                    out.push(v::forbidden(
                        &spec_path.child("sessionAffinityConfig"),
                        "must not be set when session affinity is None",
                    ));
                }
            }
            Some("ClientIP") => {
                let t = spec
                    .session_affinity_config
                    .as_ref()
                    .and_then(|c| c.client_ip.as_ref())
                    .and_then(|c| c.timeout_seconds);
                if let Some(t) = t {
                    if !(1..=86400).contains(&t) {
                        out.push(v::invalid(
                            &spec_path.child("sessionAffinityConfig").child("clientIP").child("timeoutSeconds"),
                            &t,
                            "must be greater than 0 and less than 86400",
                        ));
                    }
                }
            }
            Some(other) => {
                out.push(v::not_supported(&spec_path.child("sessionAffinity"), other, &["ClientIP", "None"]))
            }
        }

        if let Some(p) = spec.external_traffic_policy.as_deref() {
            let path = spec_path.child("externalTrafficPolicy");
            if ty != "NodePort" && ty != "LoadBalancer" {
                out.push(v::invalid(&path, p, "may only be set when `type` is 'NodePort' or 'LoadBalancer'"));
            } else if p != "Cluster" && p != "Local" {
                out.push(v::not_supported(&path, p, &["Cluster", "Local"]));
            }
        }
        if let Some(p) = spec.internal_traffic_policy.as_deref() {
            if p != "Cluster" && p != "Local" {
                out.push(v::not_supported(&spec_path.child("internalTrafficPolicy"), p, &["Cluster", "Local"]));
            }
        }
        if let Some(hc) = spec.health_check_node_port.filter(|p| *p != 0) {
            let path = spec_path.child("healthCheckNodePort");
            if ty != "LoadBalancer" || spec.external_traffic_policy.as_deref() != Some("Local") {
                out.push(v::invalid(
                    &path,
                    &hc,
                    "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'",
                ));
            } else if !v::port_in_range(hc) {
                out.push(v::invalid(&path, &hc, v::PORT_RANGE_MSG));
            }
        }
        if let Some(sel) = &spec.selector {
            v::labels(sel, &spec_path.child("selector"), &mut out);
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Type", "string", 0),
            col("Cluster-IP", "string", 0),
            col("External-IP", "string", 0),
            col("Port(s)", "string", 0),
            AGE_COLUMN,
            col("Selector", "string", 1),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let ty = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
        let cluster_ip =
            spec.cluster_ips.as_ref().and_then(|ips| ips.first().cloned()).unwrap_or_else(|| "<none>".into());
        let external_ips = spec.external_ips.clone().unwrap_or_default();
        let external = match ty.as_str() {
            "ClusterIP" | "NodePort" => {
                if external_ips.is_empty() {
                    "<none>".to_string()
                } else {
                    external_ips.join(",")
                }
            }
            "LoadBalancer" => {
                let mut lb: Vec<String> = self
                    .status
                    .as_ref()
                    .and_then(|s| s.load_balancer.as_ref())
                    .and_then(|l| l.ingress.as_ref())
                    .map(|ing| ing.iter().filter_map(|i| i.ip.clone().or_else(|| i.hostname.clone())).collect())
                    .unwrap_or_default();
                lb.sort();
                lb.dedup();
                lb.extend(external_ips);
                if lb.is_empty() {
                    "<pending>".to_string()
                } else {
                    lb.join(",")
                }
            }
            "ExternalName" => spec.external_name.clone().unwrap_or_default(),
            _ => "<unknown>".to_string(),
        };
        let ports: Vec<String> = spec
            .ports
            .iter()
            .flatten()
            .map(|p| {
                let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                match p.node_port.filter(|n| *n > 0) {
                    Some(np) => format!("{}:{}/{}", p.port, np, proto),
                    None => format!("{}/{}", p.port, proto),
                }
            })
            .collect();
        let ports = if ports.is_empty() { "<none>".to_string() } else { ports.join(",") };
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(ty),
            json!(cluster_ip),
            json!(external),
            json!(ports),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
            json!(table::format_labels(spec.selector.as_ref())),
        ]
    }
}

// === Pod ===

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
        for k in ["activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds"] {
            o.remove(k);
        }
    }
    spec
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

impl ApiObject for Pod {
    const KIND: Kind = Kind::Pod;

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

// === Node ===

/// The node STATUS as kubectl prints it: `Ready` when the Ready condition is True, `NotReady`
/// when it is False or Unknown, `Unknown` when there is no Ready condition.
pub fn node_ready_status(node: &Node) -> &'static str {
    let cond =
        node.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match cond.map(|c| c.status.as_str()) {
        Some("True") => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }
}

impl ApiObject for Node {
    const KIND: Kind = Kind::Node;

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let spec_path = FieldPath::root("spec");
        if let Some(spec) = &self.spec {
            if let Some(c) = spec.pod_cidr.as_deref().filter(|c| !c.is_empty()) {
                if !v::valid_cidr(c) {
                    out.push(v::invalid(&spec_path.child("podCIDR"), c, v::CIDR_MSG));
                }
            }
            for (i, c) in spec.pod_cidrs.iter().flatten().enumerate() {
                if !v::valid_cidr(c) {
                    out.push(v::invalid(&spec_path.child("podCIDRs").index(i), c.as_str(), v::CIDR_MSG));
                }
            }
        }
        const ADDRESS_TYPES: [&str; 5] = ["ExternalDNS", "ExternalIP", "Hostname", "InternalDNS", "InternalIP"];
        let status = self.status.as_ref();
        for (i, a) in status.and_then(|s| s.addresses.as_ref()).into_iter().flatten().enumerate() {
            let path = FieldPath::root("status").child("addresses").index(i);
            if !ADDRESS_TYPES.contains(&a.type_.as_str()) {
                out.push(v::not_supported(&path.child("type"), a.type_.as_str(), &ADDRESS_TYPES));
            }
            if a.type_.ends_with("IP") && v::valid_ip(&a.address).is_none() {
                out.push(v::invalid(&path.child("address"), a.address.as_str(), v::IP_MSG));
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Status", "string", 0),
            col("Roles", "string", 0),
            AGE_COLUMN,
            col("Version", "string", 0),
            col("Internal-IP", "string", 1),
            col("External-IP", "string", 1),
            col("OS-Image", "string", 1),
            col("Kernel-Version", "string", 1),
            col("Container-Runtime", "string", 1),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let mut status = node_ready_status(self).to_string();
        if self.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
            status.push_str(",SchedulingDisabled");
        }
        let mut roles: BTreeSet<String> = BTreeSet::new();
        for (k, v) in self.metadata.labels.iter().flatten() {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == "kubernetes.io/role" && !v.is_empty() {
                roles.insert(v.clone());
            }
        }
        let roles =
            if roles.is_empty() { "<none>".to_string() } else { roles.into_iter().collect::<Vec<_>>().join(",") };
        let st = self.status.clone().unwrap_or_default();
        let info = st.node_info.clone().unwrap_or_default();
        let addr = |t: &str| {
            st.addresses
                .iter()
                .flatten()
                .find(|a| a.type_ == t)
                .map(|a| a.address.clone())
                .unwrap_or_else(|| "<none>".into())
        };
        let or_unknown = |s: &str| if s.is_empty() { "<unknown>".to_string() } else { s.to_string() };
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(status),
            json!(roles),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
            json!(info.kubelet_version),
            json!(addr("InternalIP")),
            json!(addr("ExternalIP")),
            json!(or_unknown(&info.os_image)),
            json!(or_unknown(&info.kernel_version)),
            json!(or_unknown(&info.container_runtime_version)),
        ]
    }
}

// === Namespace ===

impl ApiObject for Namespace {
    const KIND: Kind = Kind::Namespace;

    fn apply_defaults(&mut self) {
        if let Some(name) = self.metadata.name.clone() {
            self.metadata.labels.get_or_insert_with(BTreeMap::new).insert("kubernetes.io/metadata.name".into(), name);
        }
    }

    fn prepare_for_create(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.finalizers = Some(vec!["kubernetes".into()]);
        self.status =
            Some(k8s_openapi::api::core::v1::NamespaceStatus { phase: Some("Active".into()), conditions: None });
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_label, &mut out);
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Status", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let phase = self.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(phase),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

// === Endpoints ===

impl ApiObject for Endpoints {
    const KIND: Kind = Kind::Endpoints;

    fn apply_defaults(&mut self) {
        for s in self.subsets.iter_mut().flatten() {
            for p in s.ports.iter_mut().flatten() {
                p.protocol.get_or_insert_with(|| "TCP".into());
            }
        }
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        for (i, s) in self.subsets.iter().flatten().enumerate() {
            let path = FieldPath::root("subsets").index(i);
            for (field, addrs) in [("addresses", &s.addresses), ("notReadyAddresses", &s.not_ready_addresses)] {
                for (j, a) in addrs.iter().flatten().enumerate() {
                    if v::valid_ip(&a.ip).is_none() {
                        out.push(v::invalid(&path.child(field).index(j).child("ip"), a.ip.as_str(), v::IP_MSG));
                    }
                }
            }
            let ports = s.ports.as_deref().unwrap_or_default();
            for (j, p) in ports.iter().enumerate() {
                let pp = path.child("ports").index(j);
                if !v::port_in_range(p.port) {
                    out.push(v::invalid(&pp.child("port"), &p.port, v::PORT_RANGE_MSG));
                }
                match p.name.as_deref() {
                    Some(n) if !n.is_empty() => v::push_all(&mut out, &pp.child("name"), n, v::dns1123_label(n)),
                    _ if ports.len() > 1 => out.push(v::required(&pp.child("name"), "")),
                    _ => {}
                }
                validate_protocol(p.protocol.as_deref(), &pp.child("protocol"), &mut out);
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Endpoints", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let mut list = Vec::new();
        for s in self.subsets.iter().flatten() {
            let addrs: Vec<&str> = s.addresses.iter().flatten().map(|a| a.ip.as_str()).collect();
            match s.ports.as_ref().filter(|p| !p.is_empty()) {
                None => list.extend(addrs.iter().map(|a| a.to_string())),
                Some(ports) => {
                    for p in ports {
                        for a in &addrs {
                            let host = if a.contains(':') { format!("[{a}]") } else { a.to_string() };
                            list.push(format!("{host}:{}", p.port));
                        }
                    }
                }
            }
        }
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(first_three(&list, "<none>")),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

/// `a,b,c + N more...`, or `empty` when there is nothing.
fn first_three(list: &[String], empty: &str) -> String {
    if list.is_empty() {
        return empty.to_string();
    }
    let shown = list.iter().take(3).cloned().collect::<Vec<_>>().join(",");
    if list.len() > 3 {
        format!("{shown} + {} more...", list.len() - 3)
    } else {
        shown
    }
}

// === EndpointSlice ===

impl ApiObject for EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;

    fn apply_defaults(&mut self) {
        for p in self.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".into());
        }
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        const TYPES: [&str; 3] = ["FQDN", "IPv4", "IPv6"];
        let at = self.address_type.as_str();
        if !TYPES.contains(&at) {
            out.push(v::not_supported(&FieldPath::root("addressType"), at, &TYPES));
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            let path = FieldPath::root("endpoints").index(i).child("addresses");
            if e.addresses.is_empty() || e.addresses.len() > 100 {
                out.push(v::required(&path, "must contain at least 1 and at most 100 addresses"));
            }
            for (j, a) in e.addresses.iter().enumerate() {
                let ok = match at {
                    "IPv4" => v::valid_ip(a).is_some_and(|ip| ip.is_ipv4()),
                    "IPv6" => v::valid_ip(a).is_some_and(|ip| ip.is_ipv6()),
                    _ => v::dns1123_subdomain(a).is_empty(),
                };
                if !ok {
                    out.push(v::invalid(&path.index(j), a.as_str(), &format!("must be a valid {at} address")));
                }
            }
        }
        for (i, p) in self.ports.iter().flatten().enumerate() {
            let path = FieldPath::root("ports").index(i);
            if let Some(port) = p.port {
                if !v::port_in_range(port) {
                    out.push(v::invalid(&path.child("port"), &port, v::PORT_RANGE_MSG));
                }
            }
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                v::push_all(&mut out, &path.child("name"), n, v::dns1123_label(n));
            }
            validate_protocol(p.protocol.as_deref(), &path.child("protocol"), &mut out);
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("AddressType", "string", 0),
            col("Ports", "string", 0),
            col("Endpoints", "string", 0),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let ports = match self.ports.as_ref().filter(|p| !p.is_empty()) {
            None => "<unset>".to_string(),
            Some(ps) => ps
                .iter()
                .map(|p| p.port.map(|n| n.to_string()).unwrap_or_else(|| "<unset>".into()))
                .collect::<Vec<_>>()
                .join(","),
        };
        let addrs: Vec<String> = self.endpoints.iter().flat_map(|e| e.addresses.iter().cloned()).collect();
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(self.address_type),
            json!(ports),
            json!(first_three(&addrs, "<unset>")),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

// === Event ===

impl ApiObject for Event {
    const KIND: Kind = Kind::Event;

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let ns = self.metadata.namespace.as_deref().unwrap_or("");
        let obj_ns = self.involved_object.namespace.as_deref().unwrap_or("");
        if !obj_ns.is_empty() && obj_ns != ns {
            out.push(v::invalid(
                &FieldPath::root("involvedObject").child("namespace"),
                obj_ns,
                "does not match event.namespace",
            ));
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            col("Last Seen", "string", 0),
            col("Type", "string", 0),
            col("Reason", "string", 0),
            col("Object", "string", 0),
            col("Message", "string", 0),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let last = self.last_timestamp.as_ref().or(self.metadata.creation_timestamp.as_ref());
        let obj = format!(
            "{}/{}",
            self.involved_object.kind.clone().unwrap_or_default().to_lowercase(),
            self.involved_object.name.clone().unwrap_or_default()
        );
        vec![
            table::age(last, now),
            json!(self.type_.clone().unwrap_or_default()),
            json!(self.reason.clone().unwrap_or_default()),
            json!(obj),
            json!(self.message.clone().unwrap_or_default()),
        ]
    }
}

/// Runs `$body` with `$t` bound to the Rust type of `$kind`.
#[macro_export]
macro_rules! with_kind_type {
    ($kind:expr, $t:ident => $body:expr) => {
        match $kind {
            $crate::Kind::Service => {
                type $t = ::k8s_openapi::api::core::v1::Service;
                $body
            }
            $crate::Kind::Pod => {
                type $t = ::k8s_openapi::api::core::v1::Pod;
                $body
            }
            $crate::Kind::Node => {
                type $t = ::k8s_openapi::api::core::v1::Node;
                $body
            }
            $crate::Kind::Namespace => {
                type $t = ::k8s_openapi::api::core::v1::Namespace;
                $body
            }
            $crate::Kind::Endpoints => {
                type $t = ::k8s_openapi::api::core::v1::Endpoints;
                $body
            }
            $crate::Kind::EndpointSlice => {
                type $t = ::k8s_openapi::api::discovery::v1::EndpointSlice;
                $body
            }
            $crate::Kind::Event => {
                type $t = ::k8s_openapi::api::core::v1::Event;
                $body
            }
            $crate::Kind::Deployment => {
                type $t = ::k8s_openapi::api::apps::v1::Deployment;
                $body
            }
            $crate::Kind::ReplicaSet => {
                type $t = ::k8s_openapi::api::apps::v1::ReplicaSet;
                $body
            }
            $crate::Kind::Ingress => {
                type $t = ::k8s_openapi::api::networking::v1::Ingress;
                $body
            }
            $crate::Kind::IngressClass => {
                type $t = ::k8s_openapi::api::networking::v1::IngressClass;
                $body
            }
            $crate::Kind::Secret => {
                type $t = ::k8s_openapi::api::core::v1::Secret;
                $body
            }
        }
    };
}

// === Secret ===

impl ApiObject for k8s_openapi::api::core::v1::Secret {
    const KIND: Kind = Kind::Secret;

    fn apply_defaults(&mut self) {
        self.type_.get_or_insert_with(|| "Opaque".into());
        // stringData is write-only: it lands in data, as the API server does.
        if let Some(strings) = self.string_data.take() {
            let data = self.data.get_or_insert_with(Default::default);
            for (k, v) in strings {
                data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
            }
        }
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let data = self.data.clone().unwrap_or_default();
        for k in data.keys() {
            let ok = !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
            if !ok {
                out.push(v::invalid(
                    &FieldPath::root("data").key(k),
                    k.as_str(),
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
        }
        if self.type_.as_deref() == Some("kubernetes.io/tls") {
            for key in ["tls.crt", "tls.key"] {
                if !data.contains_key(key) {
                    out.push(v::required(&FieldPath::root("data").key(key), ""));
                }
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Type", "string", 0), col("Data", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(self.type_.clone().unwrap_or_default()),
            json!(self.data.as_ref().map(|d| d.len()).unwrap_or(0).to_string()),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;
    use k8s_openapi::api::core::v1::Secret;

    #[test]
    fn tls_secrets_need_a_certificate_and_a_key_and_string_data_lands_in_data() {
        let mut s: Secret = serde_json::from_value(json!({"metadata": {"name": "shop-tls"},
            "type": "kubernetes.io/tls", "stringData": {"tls.crt": "cert"}}))
        .unwrap();
        s.apply_defaults();
        assert_eq!(s.data.as_ref().unwrap()["tls.crt"].0, b"cert");
        assert!(s.string_data.is_none());
        let causes: Vec<String> = s.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["data[tls.key]: Required value"]);
        let mut opaque: Secret =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "data": {"a b": ""}})).unwrap();
        opaque.apply_defaults();
        assert_eq!(opaque.type_.as_deref(), Some("Opaque"));
        assert_eq!(opaque.validate(None).len(), 1);
        assert_eq!(opaque.cells(Timestamp::now())[1..3], [json!("Opaque"), json!("1")]);
    }
}
