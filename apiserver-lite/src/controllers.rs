//! Controllers that run inside the API server, as kube-controller-manager and kube-scheduler
//! would: endpoints (Endpoints + EndpointSlices), a scheduler, namespace lifecycle, node health,
//! pod garbage collection, and Deployments/ReplicaSets ([`crate::workloads`]). They follow the store's durable event log and also resync
//! periodically, so a missed event heals itself.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use api::k8s_openapi::api::core::v1::{Node, Pod, Service};
use api::selector::{FieldSelector, LabelSelector};
use api::Kind;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::registry::{labels_of, DeleteOptions, Registry, WriteOptions};

/// Timing of the controllers.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// A node whose heartbeat is older than this goes NotReady (`--node-monitor-grace-period`).
    pub node_monitor_grace: Duration,
    /// How often everything is reconciled regardless of events.
    pub resync: Duration,
    /// Extra time a gracefully deleted pod gets before it is removed forcibly.
    pub pod_gc_slack: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            node_monitor_grace: Duration::from_secs(40),
            resync: Duration::from_secs(30),
            pod_gc_slack: Duration::from_secs(30),
        }
    }
}

const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
const SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// Creates the namespaces that always exist and the `default/kubernetes` Service.
pub async fn bootstrap(reg: &Registry, apiserver_endpoint: Option<(String, u16)>) -> Result<(), ApiError> {
    for ns in crate::registry::PROTECTED_NAMESPACES {
        if reg.store.get(Kind::Namespace, "", ns)?.is_none() {
            reg.create(Kind::Namespace, None, json!({"metadata": {"name": ns}}), &WriteOptions::default()).await?;
        }
    }
    if reg.store.get(Kind::Service, "default", "kubernetes")?.is_none() {
        let first = reg.ranges().service_cidr.hosts().next().map(|ip| ip.to_string()).unwrap_or_default();
        let svc = json!({
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": first,
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}
        });
        reg.create(Kind::Service, Some("default"), svc, &WriteOptions::default()).await?;
    }
    // The lab's L7 load balancer, as the default IngressClass.
    if reg.store.get(Kind::IngressClass, "", api::networking::LAB_CLASS)?.is_none() {
        let class = json!({
            "metadata": {"name": api::networking::LAB_CLASS,
                         "annotations": {api::networking::DEFAULT_CLASS_ANNOTATION: "true"}},
            "spec": {"controller": api::networking::LAB_CONTROLLER},
        });
        reg.create(Kind::IngressClass, None, class, &WriteOptions::default()).await?;
    }
    // The apiserver's own endpoints, as the real apiserver maintains them (the Service has
    // no selector, so the endpoints controller leaves them alone).
    if let Some((ip, port)) = apiserver_endpoint {
        let subsets =
            json!([{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]);
        let endpoints = json!({"metadata": {"name": "kubernetes", "namespace": "default"}, "subsets": subsets});
        upsert(reg, Kind::Endpoints, "default", "kubernetes", endpoints, &["subsets"]).await?;
        let slice = json!({
            "metadata": {"name": "kubernetes", "namespace": "default",
                         "labels": {SERVICE_NAME_LABEL: "kubernetes", MANAGED_BY: "apiserver-lite"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        });
        upsert(reg, Kind::EndpointSlice, "default", "kubernetes", slice, &["endpoints", "ports", "addressType"])
            .await?;
    }
    Ok(())
}

/// Runs every controller until the process ends.
pub async fn run(reg: Arc<Registry>, cfg: ControllerConfig) {
    let mut durable = reg.store.subscribe();
    let mut seen = reg.store.durable_rv();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_resync = tokio::time::Instant::now();
    // First pass reconciles everything.
    let mut dirty = Dirty { all: true, ..Default::default() };
    loop {
        if let Err(e) = reconcile(&reg, &cfg, &mut dirty).await {
            tracing::warn!(error = %e, "controller pass failed; will retry");
            dirty.all = true;
        }
        tokio::select! {
            changed = durable.changed() => {
                if changed.is_err() {
                    return;
                }
                // Let a burst of writes settle into one pass.
                tokio::time::sleep(Duration::from_millis(20)).await;
                let upto = reg.store.durable_rv();
                match reg.store.events_since(seen, upto) {
                    Ok(events) => {
                        for ev in events {
                            if matches!(
                                ev.kind,
                                Kind::Service
                                    | Kind::Pod
                                    | Kind::Node
                                    | Kind::Namespace
                                    | Kind::Deployment
                                    | Kind::ReplicaSet
                            ) {
                                dirty.note(ev.kind, &ev.object(), ev.prev().as_ref());
                            }
                        }
                    }
                    Err(_) => dirty.all = true,
                }
                seen = upto;
            }
            _ = tick.tick() => {
                dirty.periodic = true;
                if last_resync.elapsed() >= cfg.resync {
                    last_resync = tokio::time::Instant::now();
                    dirty.all = true;
                }
            }
        }
    }
}

/// What needs reconciling.
#[derive(Default)]
struct Dirty {
    all: bool,
    periodic: bool,
    /// Namespaces whose Services need their endpoints recomputed (pods changed there).
    pod_namespaces: BTreeMap<String, Vec<Value>>,
    services: BTreeSet<(String, String)>,
    schedule: bool,
    namespaces: bool,
    /// Namespaces whose Deployments and ReplicaSets need a sync.
    workloads: BTreeSet<String>,
}

impl Dirty {
    fn note(&mut self, kind: Kind, obj: &Value, prev: Option<&Value>) {
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("").to_string();
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        match kind {
            Kind::Service => {
                self.services.insert((ns, name));
            }
            Kind::Deployment | Kind::ReplicaSet => {
                self.workloads.insert(ns);
            }
            Kind::Pod => {
                let owned = |o: &Value| o["metadata"]["ownerReferences"].as_array().is_some_and(|l| !l.is_empty());
                if owned(obj) || prev.is_some_and(owned) {
                    self.workloads.insert(ns.clone());
                }
                let entry = self.pod_namespaces.entry(ns).or_default();
                entry.push(obj.clone());
                if let Some(p) = prev {
                    entry.push(p.clone());
                }
                self.schedule = true;
            }
            Kind::Node => self.schedule = true,
            Kind::Namespace => self.namespaces = true,
            _ => {}
        }
    }
}

async fn reconcile(reg: &Registry, cfg: &ControllerConfig, dirty: &mut Dirty) -> Result<(), ApiError> {
    let all = std::mem::take(&mut dirty.all);
    let periodic = std::mem::take(&mut dirty.periodic);
    if all || periodic {
        node_health(reg, cfg).await?;
        pod_gc(reg, cfg).await?;
    }
    if all || periodic || std::mem::take(&mut dirty.namespaces) {
        namespace_lifecycle(reg).await?;
    }
    if all || periodic || std::mem::take(&mut dirty.schedule) {
        schedule(reg).await?;
    }
    let mut workloads = std::mem::take(&mut dirty.workloads);
    if all {
        for kind in [Kind::Deployment, Kind::ReplicaSet] {
            let (objs, _) = reg.store.list(kind, None)?;
            workloads.extend(objs.iter().map(|o| ns_name(o).0));
        }
    }
    for ns in &workloads {
        crate::workloads::sync_namespace(reg, ns).await?;
    }
    let mut services: BTreeSet<(String, String)> = std::mem::take(&mut dirty.services);
    let pod_namespaces = std::mem::take(&mut dirty.pod_namespaces);
    if all {
        let (svcs, _) = reg.store.list(Kind::Service, None)?;
        services.extend(svcs.iter().map(ns_name));
        // Slices whose Service is gone.
        let (slices, _) = reg.store.list(Kind::EndpointSlice, None)?;
        for s in &slices {
            if let Some(svc) = s
                .pointer(&format!("/metadata/labels/{}", SERVICE_NAME_LABEL.replace('/', "~1")))
                .and_then(Value::as_str)
            {
                services.insert((s["metadata"]["namespace"].as_str().unwrap_or("").into(), svc.into()));
            }
        }
    } else {
        for (ns, pods) in pod_namespaces {
            let (svcs, _) = reg.store.list(Kind::Service, Some(&ns))?;
            for svc in svcs {
                let Some(sel) = svc
                    .pointer("/spec/selector")
                    .and_then(|s| serde_json::from_value::<BTreeMap<String, String>>(s.clone()).ok())
                else {
                    continue;
                };
                let sel = LabelSelector::from_map(&sel);
                if pods.iter().any(|p| sel.matches(labels_of(p).as_ref())) {
                    services.insert(ns_name(&svc));
                }
            }
        }
    }
    for (ns, name) in services {
        sync_endpoints(reg, &ns, &name).await?;
    }
    Ok(())
}

fn ns_name(obj: &Value) -> (String, String) {
    (
        obj["metadata"]["namespace"].as_str().unwrap_or("").to_string(),
        obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

// === endpoints ===

/// A resolved port of a Service for one pod: (service port name, target port, protocol).
type PortKey = Vec<(String, i32, String)>;

pub(crate) fn pod_is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Resolves the Service's target ports against a pod's container ports (named targetPorts).
fn resolve_ports(svc: &Service, pod: &Pod) -> PortKey {
    use api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let spec = svc.spec.clone().unwrap_or_default();
    let containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
    let mut out = Vec::new();
    for p in spec.ports.iter().flatten() {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let target = match &p.target_port {
            Some(IntOrString::Int(n)) => Some(*n),
            None => Some(p.port),
            Some(IntOrString::String(name)) => containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|cp| {
                    cp.name.as_deref() == Some(name.as_str())
                        && cp.protocol.clone().unwrap_or_else(|| "TCP".into()) == proto
                })
                .map(|cp| cp.container_port),
        };
        if let Some(t) = target {
            out.push((p.name.clone().unwrap_or_default(), t, proto));
        }
    }
    out
}

/// Recomputes the Endpoints and EndpointSlices of one Service.
async fn sync_endpoints(reg: &Registry, ns: &str, name: &str) -> Result<(), ApiError> {
    let svc: Option<Service> = reg.store.get(Kind::Service, ns, name)?.map(serde_json::from_value).transpose()?;
    // Our slices are named `{service}-{hash}`: a key-range scan finds them without reading
    // every slice of the namespace (which made 10,000 Services quadratic).
    let slice_sel = LabelSelector::parse(&format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY}={SLICE_CONTROLLER}"))?;
    let existing_slices: Vec<Value> = reg
        .store
        .list_name_prefix(Kind::EndpointSlice, ns, &format!("{}-", slice_prefix(name)))?
        .into_iter()
        .filter(|s| slice_sel.matches(labels_of(s).as_ref()))
        .collect();
    let selector =
        svc.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.selector.clone()).filter(|s| !s.is_empty());
    let (Some(svc), Some(selector)) = (svc, selector) else {
        // No Service, or one without a selector: nothing of ours may remain.
        for s in existing_slices {
            delete_quietly(reg, Kind::EndpointSlice, ns, s["metadata"]["name"].as_str().unwrap_or("")).await?;
        }
        if reg.store.get(Kind::Service, ns, name)?.is_none() {
            delete_quietly(reg, Kind::Endpoints, ns, name).await?;
        }
        return Ok(());
    };
    let publish_not_ready = svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses).unwrap_or(false);
    let sel = LabelSelector::from_map(&selector);
    let (pods, _) = reg.list(Kind::Pod, Some(ns), &sel, &FieldSelector::default())?;
    let mut groups: BTreeMap<PortKey, Vec<Pod>> = BTreeMap::new();
    for p in pods {
        let pod: Pod = serde_json::from_value(p)?;
        let status = pod.status.clone().unwrap_or_default();
        let phase = status.phase.as_deref().unwrap_or("");
        if status.pod_ip.as_deref().unwrap_or("").is_empty() || phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        groups.entry(resolve_ports(&svc, &pod)).or_default().push(pod);
    }
    for pods in groups.values_mut() {
        pods.sort_by_key(|p| p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default());
    }
    let svc_labels = svc.metadata.labels.clone().unwrap_or_default();
    let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc.metadata.uid, "controller": true, "blockOwnerDeletion": true}]);
    let target_ref = |p: &Pod| json!({"kind": "Pod", "namespace": ns, "name": p.metadata.name, "uid": p.metadata.uid});
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    let pod_ip = |p: &Pod| p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default();

    // v1 Endpoints: ready pods in addresses, unready in notReadyAddresses, terminating left out.
    let mut subsets = Vec::new();
    for (ports, pods) in &groups {
        let mut ready = Vec::new();
        let mut not_ready = Vec::new();
        for p in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let mut addr = json!({"ip": pod_ip(p), "targetRef": target_ref(p)});
            if let Some(n) = node_of(p) {
                addr["nodeName"] = json!(n);
            }
            if pod_is_ready(p) || publish_not_ready {
                ready.push(addr);
            } else {
                not_ready.push(addr);
            }
        }
        if ready.is_empty() && not_ready.is_empty() {
            continue;
        }
        let mut subset = json!({
            "ports": ports.iter().map(|(n, port, proto)| {
                let mut p = json!({"port": port, "protocol": proto});
                if !n.is_empty() { p["name"] = json!(n); }
                p
            }).collect::<Vec<_>>()
        });
        if !ready.is_empty() {
            subset["addresses"] = json!(ready);
        }
        if !not_ready.is_empty() {
            subset["notReadyAddresses"] = json!(not_ready);
        }
        subsets.push(subset);
    }
    let mut endpoints = json!({"metadata": {"name": name, "namespace": ns, "labels": svc_labels}});
    if !subsets.is_empty() {
        endpoints["subsets"] = json!(subsets);
    }
    upsert(reg, Kind::Endpoints, ns, name, endpoints, &["subsets"]).await?;

    // EndpointSlices: one per distinct port mapping, every pod with its conditions.
    let mut slice_labels = svc_labels.clone();
    slice_labels.insert(SERVICE_NAME_LABEL.into(), name.into());
    slice_labels.insert(MANAGED_BY.into(), SLICE_CONTROLLER.into());
    let mut wanted = BTreeSet::new();
    let placeholder = groups.is_empty();
    let groups: Vec<(PortKey, Vec<Pod>)> =
        if placeholder { vec![(Vec::new(), Vec::new())] } else { groups.into_iter().collect() };
    for (ports, pods) in groups {
        let slice_name = slice_name(name, &ports);
        wanted.insert(slice_name.clone());
        let eps: Vec<Value> = pods
            .iter()
            .map(|p| {
                let terminating = p.metadata.deletion_timestamp.is_some();
                let ready = pod_is_ready(p);
                let mut e = json!({
                    "addresses": [pod_ip(p)],
                    "conditions": {"ready": ready && !terminating, "serving": ready, "terminating": terminating},
                    "targetRef": target_ref(p),
                });
                if let Some(n) = node_of(p) {
                    e["nodeName"] = json!(n);
                }
                e
            })
            .collect();
        let mut slice = json!({
            "metadata": {"name": slice_name, "namespace": ns, "labels": slice_labels, "ownerReferences": owner},
            "addressType": "IPv4",
            "endpoints": eps,
        });
        if !placeholder {
            slice["ports"] = json!(ports
                .iter()
                .map(|(n, port, proto)| json!({"name": n, "port": port, "protocol": proto}))
                .collect::<Vec<_>>());
        }
        upsert(reg, Kind::EndpointSlice, ns, &slice_name, slice, &["endpoints", "ports", "addressType"]).await?;
    }
    for s in existing_slices {
        let n = s["metadata"]["name"].as_str().unwrap_or("");
        if !wanted.contains(n) {
            delete_quietly(reg, Kind::EndpointSlice, ns, n).await?;
        }
    }
    Ok(())
}

/// A stable slice name: the Service name and a short hash of its port mapping.
fn slice_name(svc: &str, ports: &PortKey) -> String {
    let mut h: u32 = 2166136261;
    for (n, p, proto) in ports {
        for b in format!("{n}/{p}/{proto};").bytes() {
            h = (h ^ b as u32).wrapping_mul(16777619);
        }
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5).map(|i| ALPHABET[((h >> (i * 5)) % ALPHABET.len() as u32) as usize] as char).collect();
    format!("{}-{suffix}", slice_prefix(svc))
}

/// The part of a slice name before its hash suffix.
fn slice_prefix(svc: &str) -> String {
    svc.chars().take(63 - 6).collect()
}

/// Creates or updates a controller-owned object when the `fields` (or labels) differ.
async fn upsert(
    reg: &Registry,
    kind: Kind,
    ns: &str,
    name: &str,
    desired: Value,
    fields: &[&str],
) -> Result<(), ApiError> {
    let g = reg.store.lock().await;
    let pending = match reg.store.get(kind, ns, name)? {
        None => Some(reg.create_locked(&g, kind, Some(ns), desired, &WriteOptions::default())?),
        Some(old) => {
            let mut new = old.clone();
            let mut changed = old["metadata"].get("labels") != desired["metadata"].get("labels");
            new["metadata"]["labels"] = desired["metadata"]["labels"].clone();
            if let Some(o) = desired["metadata"].get("ownerReferences") {
                new["metadata"]["ownerReferences"] = o.clone();
            }
            for f in fields {
                let want = desired.get(*f);
                // Compare after defaulting (protocol etc.) by looking at what we would store.
                if normalized(old.get(*f)) != normalized(want) {
                    changed = true;
                }
                match want {
                    Some(v) => new[*f] = v.clone(),
                    None => {
                        new.as_object_mut().map(|o| o.remove(*f));
                    }
                }
            }
            if changed {
                Some(reg.update_locked(
                    &g,
                    kind,
                    old,
                    new,
                    crate::registry::Subresource::Main,
                    &WriteOptions::default(),
                )?)
            } else {
                None
            }
        }
    };
    drop(g);
    if let Some(p) = pending {
        reg.sync(p).await?;
    }
    Ok(())
}

fn normalized(v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Array(a)) if a.is_empty() => Value::Null,
        Some(v) => v.clone(),
    }
}

pub(crate) async fn delete_quietly(reg: &Registry, kind: Kind, ns: &str, name: &str) -> Result<(), ApiError> {
    match reg.delete(kind, Some(ns), name, &DeleteOptions::default()).await {
        Ok(_) | Err(ApiError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

// === scheduler ===

/// Binds pods without a node to the Ready node with the fewest pods.
async fn schedule(reg: &Registry) -> Result<(), ApiError> {
    let (pods, _) = reg.store.list(Kind::Pod, None)?;
    let pending: Vec<&Value> = pods
        .iter()
        .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("").is_empty())
        .filter(|p| p["metadata"].get("deletionTimestamp").is_none())
        .collect();
    if pending.is_empty() {
        return Ok(());
    }
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let total = nodes.len();
    // (pods on it, name, labels) of every node that takes new pods.
    let mut candidates: Vec<(usize, String, BTreeMap<String, String>)> = Vec::new();
    let mut not_ready = 0;
    for n in &nodes {
        let node: Node = serde_json::from_value(n.clone())?;
        let schedulable = !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        if api::objects::node_ready_status(&node) == "Ready" && schedulable {
            let name = node.metadata.name.clone().unwrap_or_default();
            let count = pods
                .iter()
                .filter(|p| p.pointer("/spec/nodeName").and_then(Value::as_str) == Some(name.as_str()))
                .filter(|p| !matches!(p.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed")))
                .count();
            candidates.push((count, name, node.metadata.labels.clone().unwrap_or_default()));
        } else {
            not_ready += 1;
        }
    }
    for p in pending {
        let (ns, name) = ns_name(p);
        candidates.sort();
        let g = reg.store.lock().await;
        let Some(old) = reg.store.get(Kind::Pod, &ns, &name)? else { continue };
        if !old.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("").is_empty() {
            continue;
        }
        let selector: BTreeMap<String, String> =
            serde_json::from_value(old.pointer("/spec/nodeSelector").cloned().unwrap_or(Value::Null))
                .unwrap_or_default();
        let mut new = old.clone();
        let fitting = candidates.iter_mut().find(|(_, _, labels)| node_selector_matches(&selector, labels));
        let condition = match fitting {
            Some((count, node, _)) => {
                new["spec"]["nodeName"] = json!(node);
                *count += 1;
                json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": new_time()})
            }
            None => json!({
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": unschedulable_message(total, not_ready, candidates.len()),
                "lastTransitionTime": new_time(),
            }),
        };
        set_condition(&mut new, condition);
        if new == old {
            continue;
        }
        let pending = reg.put_raw(&g, Kind::Pod, Some(old), new)?;
        drop(g);
        reg.sync(pending).await?;
    }
    Ok(())
}

/// A pod's `nodeSelector` fits a node when the node carries every label with the same value.
fn node_selector_matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The scheduler's reason, worded as kube-scheduler words it.
fn unschedulable_message(total: usize, not_ready: usize, ready_but_unfit: usize) -> String {
    let mut reasons = Vec::new();
    if ready_but_unfit > 0 {
        reasons.push(format!("{ready_but_unfit} node(s) didn't match Pod's node affinity/selector"));
    }
    if not_ready > 0 {
        reasons.push(format!("{not_ready} node(s) were not ready"));
    }
    if reasons.is_empty() {
        return "no nodes available to schedule pods".into();
    }
    format!("0/{total} nodes are available: {}.", reasons.join(", "))
}

pub(crate) fn new_time() -> Value {
    let ts = jiff::Timestamp::now();
    json!(jiff::Timestamp::from_second(ts.as_second()).unwrap_or(ts).to_string())
}

/// Sets a condition in `status.conditions`, keeping lastTransitionTime when the status holds.
fn set_condition(obj: &mut Value, cond: Value) {
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    let list = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    let mut found = false;
    for c in list {
        if c["type"] == cond["type"] {
            found = true;
            if c["status"] == cond["status"]
                && c.get("reason") == cond.get("reason")
                && c.get("message") == cond.get("message")
            {
                out.push(c);
            } else {
                out.push(cond.clone());
            }
        } else {
            out.push(c);
        }
    }
    if !found {
        out.push(cond);
    }
    obj["status"]["conditions"] = json!(out);
}

// === node health ===

fn parse_time(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str().and_then(|s| s.parse().ok())
}

/// Marks nodes NotReady (status Unknown) when their agent stops heart-beating, and their pods
/// not ready.
async fn node_health(reg: &Registry, cfg: &ControllerConfig) -> Result<(), ApiError> {
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let now = jiff::Timestamp::now();
    for n in nodes {
        let conds = n.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let Some(ready) = conds.iter().find(|c| c["type"] == "Ready") else { continue };
        if ready["status"] == "Unknown" {
            continue;
        }
        let Some(beat) = parse_time(&ready["lastHeartbeatTime"]) else { continue };
        let age = now.duration_since(beat);
        if age.as_secs_f64() < cfg.node_monitor_grace.as_secs_f64() {
            continue;
        }
        let (_, name) = ns_name(&n);
        tracing::info!(node = %name, "node stopped posting status; marking it NotReady");
        let g = reg.store.lock().await;
        let Some(old) = reg.store.get(Kind::Node, "", &name)? else { continue };
        let mut new = old.clone();
        let mut cond = json!({
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.", "lastTransitionTime": new_time(),
        });
        cond["lastHeartbeatTime"] = ready["lastHeartbeatTime"].clone();
        set_condition(&mut new, cond);
        let pending = reg.put_raw(&g, Kind::Node, Some(old), new)?;
        drop(g);
        reg.sync(pending).await?;
        // Its pods are no longer ready: the endpoints controller takes them out of Services.
        let fs = FieldSelector::parse(&format!("spec.nodeName={name}"), Kind::Pod)?;
        let (pods, _) = reg.list(Kind::Pod, None, &LabelSelector::default(), &fs)?;
        for p in pods {
            let (ns, pname) = ns_name(&p);
            let g = reg.store.lock().await;
            let Some(old) = reg.store.get(Kind::Pod, &ns, &pname)? else { continue };
            let mut new = old.clone();
            set_condition(
                &mut new,
                json!({"type": "Ready", "status": "False", "reason": "NodeNotReady", "lastTransitionTime": new_time()}),
            );
            if new != old {
                let pending = reg.put_raw(&g, Kind::Pod, Some(old), new)?;
                drop(g);
                reg.sync(pending).await?;
            }
        }
    }
    Ok(())
}

// === pod garbage collection ===

/// Removes gracefully deleted pods whose node will not finish them: the node is gone or not
/// Ready, or the grace period plus slack has passed.
async fn pod_gc(reg: &Registry, cfg: &ControllerConfig) -> Result<(), ApiError> {
    let (pods, _) = reg.store.list(Kind::Pod, None)?;
    let now = jiff::Timestamp::now();
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let ready: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| serde_json::from_value::<Node>(n.clone()).ok())
        .filter(|n| api::objects::node_ready_status(n) == "Ready")
        .filter_map(|n| n.metadata.name)
        .collect();
    let existing: BTreeSet<String> = nodes.iter().map(|n| ns_name(n).1).collect();
    for p in pods {
        let node = p.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
        let deleting = p["metadata"].get("deletionTimestamp").and_then(parse_time);
        let orphaned = !node.is_empty() && !existing.contains(node);
        let force = match deleting {
            Some(deadline) => {
                !ready.contains(node) || now.duration_since(deadline).as_secs_f64() > cfg.pod_gc_slack.as_secs_f64()
            }
            None => orphaned,
        };
        if force {
            let (ns, name) = ns_name(&p);
            tracing::info!(pod = %format!("{ns}/{name}"), node, "removing pod whose node will not finish it");
            let opts = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
            match reg.delete(Kind::Pod, Some(&ns), &name, &opts).await {
                Ok(_) | Err(ApiError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

// === namespace lifecycle ===

/// Empties terminating namespaces, then removes them.
async fn namespace_lifecycle(reg: &Registry) -> Result<(), ApiError> {
    let (namespaces, _) = reg.store.list(Kind::Namespace, None)?;
    for n in namespaces {
        if n["metadata"].get("deletionTimestamp").is_none() {
            continue;
        }
        let (_, ns) = ns_name(&n);
        let mut remaining = 0;
        for kind in Kind::ALL.into_iter().filter(|k| k.info().namespaced) {
            let (items, _) = reg.store.list(kind, Some(&ns))?;
            for item in items {
                remaining += 1;
                if item["metadata"].get("deletionTimestamp").is_some() {
                    continue;
                }
                let (_, name) = ns_name(&item);
                match reg.delete(kind, Some(&ns), &name, &DeleteOptions::default()).await {
                    Ok(_) | Err(ApiError::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if remaining == 0 {
            let g = reg.store.lock().await;
            if let Some(old) = reg.store.get(Kind::Namespace, "", &ns)? {
                let pending = reg.finalize_delete(&g, Kind::Namespace, old)?;
                drop(g);
                reg.sync(pending).await?;
            }
        }
    }
    Ok(())
}
