//! core/v1 Services: defaults, validation (the real server's messages), ClusterIP, NodePort and LoadBalancer-IP allocation, and the Table kubectl prints.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ServiceSpec, ServiceStatus};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_int_or_name, validate_meta, validate_protocol, ApiObject, Kind, KindInfo};
use crate::alloc::{cluster_ip_key, lb_ip_key, node_port_key, AllocError, AllocKey, Allocate, Exhausted, IpFamily, Ranges};
use crate::dualstack;
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::Service;

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
    const INFO: KindInfo = KindInfo {
        short_names: &["svc"],
        categories: &["all"],
        has_status: true,
        has_generation: true,
        field_selectors: &["spec.clusterIP", "spec.type"],
        ..KindInfo::core("Service", "services", "service")
    };

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
        if let (Some(spec), Some(old_spec)) = (self.spec.as_mut(), old.spec.as_ref()) {
            dualstack::patch_allocated(spec, old_spec);
            dualstack::normalize_cluster_ips(spec, Some(old_spec));
        }
        // As `dropTypeDependentFields`: a Service that no longer needs a health-check NodePort
        // (not LoadBalancer with `externalTrafficPolicy: Local` any more) loses the one it had,
        // unless the client changed it — also when only the policy changed.
        let needs_hc = |s: &Self| {
            service_type(s) == "LoadBalancer"
                && s.spec.as_ref().and_then(|sp| sp.external_traffic_policy.as_deref()) == Some("Local")
        };
        if needs_hc(old) && !needs_hc(self) {
            let old_hc = old.spec.as_ref().and_then(|s| s.health_check_node_port);
            if let Some(spec) = self.spec.as_mut().filter(|s| s.health_check_node_port == old_hc) {
                spec.health_check_node_port = None;
            }
        }
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
        if let Some(spec) = self.spec.as_mut() {
            dualstack::normalize_cluster_ips(spec, None);
        }
    }

    /// ClusterIP (kept once set, honoured when requested, allocated otherwise), NodePorts,
    /// healthCheckNodePort, and the LoadBalancer IP, written to `status.loadBalancer.ingress`
    /// as a cloud controller would.
    fn allocate(&mut self, old: Option<&Self>, alloc: &mut dyn Allocate, causes: &mut Vec<Cause>) -> Result<(), Exhausted> {
        let ty = service_type(self).to_string();
        let wants_node_ports = service_wants_node_ports(self);
        let old_spec_opt = old.and_then(|o| o.spec.clone());
        let old_spec = old_spec_opt.clone().unwrap_or_default();
        let spec_path = FieldPath::root("spec");
        let spec = self.spec.get_or_insert_with(Default::default);

        // ClusterIPs, one per family, as kube-apiserver's Service storage allocates them.
        if ty == "ExternalName" {
            spec.cluster_ip = None;
            spec.cluster_ips = None;
            spec.ip_families = None;
            spec.ip_family_policy = None;
        } else {
            if let Err(mut c) = dualstack::init_families(spec, old_spec_opt.as_ref(), alloc.ranges()) {
                causes.append(&mut c);
                return Ok(());
            }
            if let Some(old) = &old_spec_opt {
                let c = dualstack::validate_upgrade_downgrade(spec, old);
                if !c.is_empty() {
                    causes.extend(c);
                    return Ok(());
                }
            }
            allocate_cluster_ips(spec, old_spec_opt.as_ref(), alloc, causes)?;
            if !causes.is_empty() {
                return Ok(());
            }
        }
        // NodePorts.
        let old_ports = old_spec.ports.clone().unwrap_or_default();
        for (i, port) in spec.ports.iter_mut().flatten().enumerate() {
            let path = spec_path.child("ports").index(i).child("nodePort");
            let proto = port.protocol.clone().unwrap_or_else(|| "TCP".into());
            let old_np = old_ports
                .iter()
                .find(|p| p.port == port.port && p.protocol.clone().unwrap_or_else(|| "TCP".into()) == proto)
                .and_then(|p| p.node_port)
                .filter(|n| *n != 0);
            let requested = port.node_port.filter(|n| *n != 0);
            if !wants_node_ports && (requested.is_none() || ty != "LoadBalancer") {
                // Only a LoadBalancer without automatic NodePorts may still ask for one.
                port.node_port = None;
                continue;
            }
            let want = requested.or(old_np);
            let already_ours = want.is_some_and(|p| old_ports.iter().any(|o| o.node_port == Some(p)));
            if already_ours {
                port.node_port = want;
                continue;
            }
            match alloc.node_port(want) {
                Ok(p) => port.node_port = Some(p),
                Err(AllocError::NotInRange(r)) => causes.push(v::invalid(
                    &path,
                    &want.unwrap_or_default(),
                    &format!("provided port is not in the valid range. The range of valid ports is {r}"),
                )),
                Err(AllocError::AlreadyAllocated) => {
                    causes.push(v::invalid(&path, &want.unwrap_or_default(), "provided port is already allocated"))
                }
                Err(AllocError::Full | AllocError::NotConfigured) => {
                    return Err(Exhausted("Internal error occurred: failed to allocate a nodePort: range is full".into()))
                }
            }
        }

        // healthCheckNodePort for LoadBalancer + externalTrafficPolicy: Local.
        if ty == "LoadBalancer" && spec.external_traffic_policy.as_deref() == Some("Local") {
            let old_hc = old_spec.health_check_node_port.filter(|n| *n != 0);
            let want = spec.health_check_node_port.filter(|n| *n != 0).or(old_hc);
            if want.is_some() && want == old_hc {
                spec.health_check_node_port = want;
            } else {
                match alloc.node_port(want) {
                    Ok(p) => spec.health_check_node_port = Some(p),
                    Err(AllocError::Full | AllocError::NotConfigured) => {
                        return Err(Exhausted("Internal error occurred: failed to allocate a nodePort: range is full".into()))
                    }
                    Err(e) => causes.push(v::invalid(
                        &spec_path.child("healthCheckNodePort"),
                        &want.unwrap_or_default(),
                        if e == AllocError::AlreadyAllocated {
                            "provided port is already allocated"
                        } else {
                            "provided port is not in the valid range"
                        },
                    )),
                }
            }
        } else {
            spec.health_check_node_port = None;
        }
        // LoadBalancer IP, like a cloud controller: written to status.loadBalancer.ingress.
        let status = self.status.get_or_insert_with(Default::default);
        let lb = status.load_balancer.get_or_insert_with(Default::default);
        let spec = self.spec.as_ref().expect("spec was set above");
        if ty == "LoadBalancer" && spec.load_balancer_class.is_none() {
            let requested = spec.load_balancer_ip.clone().filter(|ip| !ip.is_empty());
            let requested_addr = requested.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok());
            let current: Vec<String> =
                lb.ingress.iter().flatten().filter_map(|i| i.ip.clone()).collect();
            // One address per family of the Service that has a pool, as a dual-stack cloud
            // gives them, in the order of `ipFamilies`.
            let families: Vec<IpFamily> =
                spec.ip_families.iter().flatten().filter_map(|f| IpFamily::parse(f)).collect();
            let mut ingress = Vec::new();
            for family in families {
                let req = requested_addr.filter(|a| IpFamily::of(a) == family);
                let kept = current.iter().find(|ip| IpFamily::of_str(ip) == Some(family)).cloned();
                let ip = match (kept, req) {
                    (Some(k), None) => Some(k),
                    (Some(k), Some(r)) if k == r.to_string() => Some(k),
                    (_, req) => {
                        let Some(pool) = alloc.ranges().lb_pool(family) else { continue };
                        match req {
                            // An address outside the pool is the user's own: publish it as is.
                            Some(r) if !pool.contains(&r) => Some(r.to_string()),
                            req => match alloc.lb_ip(family, req) {
                                Ok(ip) => Some(ip.to_string()),
                                Err(AllocError::AlreadyAllocated) => {
                                    causes.push(v::invalid(
                                        &spec_path.child("loadBalancerIP"),
                                        requested.as_deref().unwrap_or(""),
                                        "provided IP is already allocated",
                                    ));
                                    None
                                }
                                Err(AllocError::NotInRange(r)) => {
                                    causes.push(v::invalid(
                                        &spec_path.child("loadBalancerIP"),
                                        requested.as_deref().unwrap_or(""),
                                        &format!("may not be the network or broadcast address of the pool {r}"),
                                    ));
                                    None
                                }
                                // A full pool leaves the Service pending, as a cloud would.
                                Err(AllocError::Full | AllocError::NotConfigured) => None,
                            },
                        }
                    }
                };
                if let Some(ip) = ip {
                    ingress.push(k8s_openapi::api::core::v1::LoadBalancerIngress {
                        ip: Some(ip),
                        ip_mode: Some("VIP".into()),
                        ..Default::default()
                    });
                }
            }
            lb.ingress = (!ingress.is_empty()).then_some(ingress);
        } else {
            lb.ingress = None;
        }
        Ok(())
    }

    fn allocations(&self, ranges: &Ranges) -> BTreeSet<AllocKey> {
        let mut keys = BTreeSet::new();
        let spec = self.spec.clone().unwrap_or_default();
        for ip in spec.cluster_ips.iter().flatten().chain(spec.cluster_ip.iter()) {
            if ranges.in_service_range(ip) {
                keys.insert(cluster_ip_key(ip));
            }
        }
        for np in spec.ports.iter().flatten().filter_map(|p| p.node_port).filter(|n| *n != 0) {
            keys.insert(node_port_key(np));
        }
        if let Some(hc) = spec.health_check_node_port.filter(|n| *n != 0) {
            keys.insert(node_port_key(hc));
        }
        let status = self.status.as_ref().and_then(|s| s.load_balancer.as_ref());
        for ip in status.and_then(|l| l.ingress.as_ref()).into_iter().flatten().filter_map(|i| i.ip.as_deref()) {
            if ranges.in_lb_pool(ip) {
                keys.insert(lb_ip_key(ip));
            }
        }
        keys
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

        if spec.cluster_ip.as_deref() == Some("None") && (ty == "NodePort" || ty == "LoadBalancer") {
            out.push(v::invalid(
                &spec_path.child("clusterIPs").index(0),
                "None",
                &format!("may not be set to 'None' for {ty} services"),
            ));
        }
        // `clusterIPs`, `ipFamilies` and `ipFamilyPolicy` are checked with the cluster's
        // families when they are defaulted (`allocate`), as kube-apiserver checks them.

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

/// Allocates the ClusterIPs the defaulted families call for (`allocClusterIPs`,
/// `updateClusterIPs`): all of them on create or when leaving ExternalName, the secondary one
/// on an upgrade to dual-stack; nothing for headless Services. A release (a downgrade, a
/// delete) follows from the object's allocations.
fn allocate_cluster_ips(
    spec: &mut ServiceSpec,
    old: Option<&ServiceSpec>,
    alloc: &mut dyn Allocate,
    causes: &mut Vec<Cause>,
) -> Result<(), Exhausted> {
    if dualstack::unchanged_prefer_dual_stack(spec, old) || dualstack::is_headless(spec) {
        return Ok(());
    }
    let from_scratch = old.is_none_or(|o| o.type_.as_deref() == Some("ExternalName"));
    let families: Vec<IpFamily> = spec.ip_families.iter().flatten().filter_map(|f| IpFamily::parse(f)).collect();
    let mut ips = spec.cluster_ips.clone().unwrap_or_default();
    let todo: Vec<usize> = if from_scratch {
        (0..families.len()).collect()
    } else if old.is_some_and(|o| o.ip_families.as_ref().map_or(0, Vec::len) == 1) && families.len() == 2 {
        vec![1]
    } else {
        vec![]
    };
    while ips.len() < families.len() {
        ips.push(String::new()); // a marker: to be allocated
    }
    for i in todo {
        let family = families[i];
        let requested = Some(ips[i].clone()).filter(|ip| !ip.is_empty());
        let req_addr = requested.as_deref().and_then(|ip| ip.parse::<IpAddr>().ok());
        match alloc.cluster_ip(family, req_addr) {
            Ok(ip) => ips[i] = ip.to_string(),
            Err(AllocError::Full | AllocError::NotConfigured) => {
                return Err(Exhausted("Internal error occurred: failed to allocate a serviceIP: range is full".into()))
            }
            Err(e) => {
                let shown = requested.unwrap_or_default();
                let why = match e {
                    AllocError::NotInRange(r) => format!(
                        "the provided IP ({shown}) is not in the valid range. The range of valid IPs is {r}"
                    ),
                    _ => "provided IP is already allocated".to_string(),
                };
                causes.push(v::invalid(
                    &FieldPath::root("spec").child("clusterIPs"),
                    ips.as_slice(),
                    &format!("failed to allocate IP {shown}: {why}"),
                ));
                return Ok(());
            }
        }
    }
    if let Some(first) = ips.first() {
        spec.cluster_ip = Some(first.clone());
    }
    spec.cluster_ips = (!ips.is_empty()).then_some(ips);
    Ok(())
}
