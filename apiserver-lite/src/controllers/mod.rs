//! Controllers that run inside the API server, as kube-controller-manager and kube-scheduler
//! would, one module each: [`endpoints`] (Endpoints + EndpointSlices), [`scheduler`], [`nodes`]
//! (node health, pod garbage collection), [`namespaces`] (lifecycle, default ServiceAccounts),
//! [`load_balancers`] (pending LoadBalancer Services get freed addresses) and [`workloads`]
//! (Deployments, ReplicaSets), [`statefulsets`], [`daemonsets`] (both keeping
//! [`revisions`]), [`jobs`], [`cronjobs`], [`volumes`] (claims bound and provisioned). The
//! endpoints controller, the scheduler and the
//! workload controllers decide purely (`plan_*`: objects in, a plan out); their `sync` functions
//! read and write. All follow the store's durable event log and also resync periodically, so a
//! missed event heals itself.

pub mod crds;
pub mod cronjobs;
pub mod daemonsets;
pub mod endpoints;
pub mod events;
pub mod hpa;
pub mod jobs;
pub mod load_balancers;
pub mod namespaces;
pub mod nodes;
pub mod revisions;
pub mod scheduler;
pub mod statefulsets;
pub mod taints;
pub mod volumes;
pub mod workloads;
mod write;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use api::selector::LabelSelector;
use api::Kind;
use serde_json::{json, Value};

use endpoints::{sync_endpoints, MANAGED_BY, SERVICE_NAME_LABEL};
use write::{ns_name, upsert};

use crate::error::ApiError;
use crate::registry::{labels_of, Registry, WriteOptions};
use crate::store::EventType;

/// Timing of the controllers.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// A node whose heartbeat is older than this goes NotReady (`--node-monitor-grace-period`).
    pub node_monitor_grace: Duration,
    /// How often everything is reconciled regardless of events.
    pub resync: Duration,
    /// Extra time a gracefully deleted pod gets before it is removed forcibly.
    pub pod_gc_slack: Duration,
    /// Events whose last occurrence is older go (`--event-ttl`).
    pub event_ttl: Duration,
    /// At most this many Events are kept; the oldest go first.
    pub max_events: usize,
    /// The API server's own address for `default/kubernetes` (its endpoints), if it has one.
    pub advertise: Option<(String, u16)>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            node_monitor_grace: Duration::from_secs(40),
            resync: Duration::from_secs(30),
            pod_gc_slack: Duration::from_secs(30),
            event_ttl: Duration::from_secs(3600),
            max_events: 10_000,
            advertise: None,
        }
    }
}

/// Creates the namespaces that always exist and the `default/kubernetes` Service.
pub async fn bootstrap(reg: &Registry, apiserver_endpoint: Option<(String, u16)>) -> Result<(), ApiError> {
    for ns in api::kinds::namespace::PROTECTED_NAMESPACES {
        if reg.store.get(Kind::Namespace, "", ns)?.is_none() {
            reg.create(Kind::Namespace, None, json!({"metadata": {"name": ns}}), &WriteOptions::default()).await?;
        }
    }
    kubernetes_service(reg, apiserver_endpoint).await?;
    // The CRDs' resources are served before the first request.
    crds::sync(reg).await?;
    // RBAC's bootstrap policy, made when missing (kube-apiserver's reconciliation adds, never
    // removes what an administrator changed).
    let (roles, bindings) = api::rbac::bootstrap();
    for (kind, objs) in [(Kind::ClusterRole, roles), (Kind::ClusterRoleBinding, bindings)] {
        for o in objs {
            let name = o.pointer("/metadata/name").and_then(serde_json::Value::as_str).unwrap_or("").to_string();
            if reg.store.get(kind, "", &name)?.is_none() {
                reg.create(kind, None, o, &WriteOptions::default()).await?;
            }
        }
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
    // The lab's provisioner, as the default StorageClass (kind's `standard`).
    if reg.store.get(Kind::StorageClass, "", api::kinds::storageclass::LAB_CLASS)?.is_none() {
        let class = json!({
            "metadata": {"name": api::kinds::storageclass::LAB_CLASS,
                         "annotations": {api::kinds::storageclass::DEFAULT_CLASS_ANNOTATION: "true"}},
            "provisioner": api::kinds::storageclass::LAB_PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "WaitForFirstConsumer",
        });
        reg.create(Kind::StorageClass, None, class, &WriteOptions::default()).await?;
    }
    Ok(())
}

/// `default/kubernetes` and its endpoints, as the real API server keeps them: made at start
/// and made again (within a resync) whenever deleted.
pub async fn kubernetes_service(reg: &Registry, apiserver_endpoint: Option<(String, u16)>) -> Result<(), ApiError> {
    // The nodes' Leases' namespace, made again if deleted (as the system namespaces controller does).
    let leases = api::kinds::lease::NODE_LEASE_NAMESPACE;
    if reg.store.get(Kind::Namespace, "", leases)?.is_none() {
        let ns = json!({"metadata": {"name": leases}});
        match reg.create(Kind::Namespace, None, ns, &WriteOptions::default()).await {
            Ok(_) | Err(ApiError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if reg.store.get(Kind::Service, "default", "kubernetes")?.is_none() {
        // The first address of the primary range (.1, or ::1 in IPv6).
        let first =
            reg.ranges().service_cidrs.first().map(|n| api::alloc::first_address(n).to_string()).unwrap_or_default();
        let svc = json!({
            "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
            "spec": {"type": "ClusterIP", "clusterIP": first,
                     "ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 6443}]}
        });
        reg.create(Kind::Service, Some("default"), svc, &WriteOptions::default()).await?;
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
            "addressType": api::alloc::IpFamily::of_str(&ip).unwrap_or(api::alloc::IpFamily::V4).as_str(),
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true, "serving": true, "terminating": false}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        });
        upsert(reg, Kind::EndpointSlice, "default", "kubernetes", slice, &["endpoints", "ports", "addressType"])
            .await?;
    }
    Ok(())
}

/// The shortest time between the starts of two controller passes (CONVENTIONS.md: why 5 ms).
const SETTLE: Duration = Duration::from_millis(5);

/// Runs every controller until the process ends.
pub async fn run(reg: Arc<Registry>, cfg: ControllerConfig) {
    let mut durable = reg.store.subscribe();
    let mut seen = reg.store.durable_rv();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_resync = tokio::time::Instant::now();
    // First pass reconciles everything.
    let mut dirty = Dirty { all: true, ..Default::default() };
    // The start of the last pass a write started; a pass the tick started holds no write back.
    let mut last_pass = tokio::time::Instant::now();
    let mut by_tick = false;
    loop {
        if !by_tick {
            last_pass = tokio::time::Instant::now();
        }
        if let Err(e) = reconcile(&reg, &cfg, &mut dirty).await {
            tracing::warn!(error = %e, "controller pass failed; will retry");
            dirty.all = true;
        }
        // Until there is something to do: a write of a kind a controller follows, or the tick.
        // Other writes (Events, Leases, the slices a pass wrote) start no pass, so they do not
        // hold the next Service's endpoints back by a SETTLE.
        loop {
            tokio::select! {
                changed = durable.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if !note_events(&reg, &mut seen, &mut dirty) {
                        continue;
                    }
                    // At most one pass per SETTLE: a lone write (a Service created) is acted on
                    // at once, while a burst arriving during or right after a pass is gathered
                    // into the next one, as kube-proxy's minSyncPeriod batches.
                    let wait = SETTLE.saturating_sub(last_pass.elapsed());
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                        note_events(&reg, &mut seen, &mut dirty);
                    }
                    by_tick = false;
                    break;
                }
                _ = tick.tick() => {
                    by_tick = true;
                    dirty.periodic = true;
                    if last_resync.elapsed() >= cfg.resync {
                        last_resync = tokio::time::Instant::now();
                        dirty.all = true;
                    }
                    break;
                }
            }
        }
    }
}

/// Notes in `dirty` the durable writes since `seen` of the kinds the controllers follow (all of
/// them dirty when the event log no longer reaches back that far); whether there were any.
fn note_events(reg: &Registry, seen: &mut u64, dirty: &mut Dirty) -> bool {
    let upto = reg.store.durable_rv();
    let mut any = false;
    match reg.store.events_since(*seen, upto) {
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
                        | Kind::Job
                        | Kind::CronJob
                        | Kind::DaemonSet
                        | Kind::StatefulSet
                        | Kind::ServiceAccount
                        | Kind::PersistentVolumeClaim
                        | Kind::PersistentVolume
                        | Kind::StorageClass
                        | Kind::CustomResourceDefinition
                ) {
                    dirty.note(ev.kind, ev.type_, &ev.object(), ev.prev().as_ref());
                    any = true;
                }
            }
        }
        Err(_) => {
            dirty.all = true;
            any = true;
        }
    }
    *seen = upto;
    any
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
    /// Namespaces may lack their default ServiceAccount.
    service_accounts: bool,
    /// Namespaces whose Deployments, ReplicaSets and Jobs need a sync.
    workloads: BTreeSet<String>,
    /// A node changed: every DaemonSet needs a look.
    daemonsets: bool,
    /// Namespaces with a Job, CronJob or DaemonSet to look at again at a time (a back-off, a
    /// deadline, a TTL, a schedule, a pod becoming available).
    job_wakes: BTreeMap<String, jiff::Timestamp>,
    /// A Service changed: a load-balancer address may have been freed.
    load_balancers: bool,
    /// Claims, volumes or what they depend on (classes, pods, nodes) changed.
    volumes: bool,
    /// A CRD changed.
    crds: bool,
    /// The volume controller's once-only Events already recorded (claim uid, reason).
    volume_events: BTreeSet<(String, &'static str)>,
}

impl Dirty {
    fn note(&mut self, kind: Kind, type_: EventType, obj: &Value, prev: Option<&Value>) {
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("").to_string();
        let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
        match kind {
            Kind::CustomResourceDefinition => self.crds = true,
            Kind::Service => {
                self.services.insert((ns, name));
                // Only then can a pending one get an address (the retry lists every Service).
                if frees_address(type_, obj, prev) {
                    self.load_balancers = true;
                }
            }
            Kind::Deployment | Kind::ReplicaSet | Kind::Job | Kind::CronJob | Kind::DaemonSet | Kind::StatefulSet => {
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
                self.volumes = true;
            }
            Kind::PersistentVolumeClaim | Kind::PersistentVolume | Kind::StorageClass => {
                self.volumes = true;
                // A claim bound (or a node chosen for it) lets its pods be scheduled.
                self.schedule = true;
            }
            Kind::Node => {
                self.schedule = true;
                self.volumes = true;
                // A node that joins (or whose labels or taints change) may want daemons.
                self.daemonsets = true;
            }
            Kind::Namespace => {
                self.namespaces = true;
                self.service_accounts = true;
            }
            Kind::ServiceAccount => self.service_accounts = true,
            _ => {}
        }
    }
}

/// Whether a write of a Service let go of a load-balancer address: it was deleted holding one,
/// or an address it held is no longer in its status (its type changed, say). Unknown: yes.
fn frees_address(type_: EventType, obj: &Value, prev: Option<&Value>) -> bool {
    fn ips(v: &Value) -> BTreeSet<&str> {
        v["status"]["loadBalancer"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["ip"].as_str())
            .collect()
    }
    match (type_, prev) {
        (EventType::Added, _) => false,
        (EventType::Deleted, _) => !ips(obj).is_empty(),
        (EventType::Modified, Some(prev)) => !ips(prev).is_subset(&ips(obj)),
        (EventType::Modified, None) => true,
    }
}

async fn reconcile(reg: &Registry, cfg: &ControllerConfig, dirty: &mut Dirty) -> Result<(), ApiError> {
    let all = std::mem::take(&mut dirty.all);
    let periodic = std::mem::take(&mut dirty.periodic);
    // Endpoints first: every node's proxy (and the first request to a new Service) waits for
    // them, while nothing below needs them (a pod any of it makes is a write of its own, seen in
    // the next pass). Written last, a new Service's slices waited for the tick's work too.
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
    // A failure here (retried by a full pass) does not keep the rest of this pass from running.
    let mut endpoints = Ok(());
    let mut unsynced = write::Unsynced::default();
    for (ns, name) in services {
        if let Err(e) = sync_endpoints(reg, &ns, &name, &mut unsynced).await {
            endpoints = Err(e);
            break;
        }
    }
    // Each write was flushed as it went; the pass goes on once they all are durable.
    if let Err(e) = unsynced.wait(reg).await {
        endpoints = endpoints.and(Err(e));
    }
    if all || std::mem::take(&mut dirty.crds) {
        crds::sync(reg).await?;
    }
    if all || periodic {
        nodes::node_health(reg, cfg.node_monitor_grace).await?;
        nodes::pod_gc(reg, cfg.pod_gc_slack).await?;
        nodes::collect_leases(reg).await?;
    }
    if all {
        events::expire(reg, cfg.event_ttl, cfg.max_events).await?;
    }
    if all || periodic {
        // The HPAs, every PERIOD_SECONDS.
        static HISTORY: std::sync::LazyLock<hpa::History> = std::sync::LazyLock::new(Default::default);
        static LAST: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
        let now = jiff::Timestamp::now().as_second();
        if now - LAST.load(std::sync::atomic::Ordering::Relaxed) >= hpa::PERIOD_SECONDS {
            LAST.store(now, std::sync::atomic::Ordering::Relaxed);
            hpa::sync(reg, &HISTORY).await?;
        }
    }
    if all || periodic || std::mem::take(&mut dirty.namespaces) {
        namespaces::namespace_lifecycle(reg).await?;
    }
    if all || std::mem::take(&mut dirty.service_accounts) {
        namespaces::service_accounts(reg).await?;
    }
    if all || periodic || std::mem::take(&mut dirty.schedule) {
        scheduler::schedule(reg).await?;
        taints::evict(reg).await?;
    }
    if all || std::mem::take(&mut dirty.volumes) {
        volumes::sync(reg, &mut dirty.volume_events).await?;
    }
    if all || dirty.services.contains(&("default".to_string(), "kubernetes".to_string())) {
        kubernetes_service(reg, cfg.advertise.clone()).await?;
    }
    if all || std::mem::take(&mut dirty.load_balancers) {
        load_balancers::retry_pending(reg).await?;
    }
    let mut workloads = std::mem::take(&mut dirty.workloads);
    if all {
        for kind in [Kind::Deployment, Kind::ReplicaSet, Kind::Job, Kind::CronJob, Kind::DaemonSet, Kind::StatefulSet] {
            let (objs, _) = reg.store.list(kind, None)?;
            workloads.extend(objs.iter().map(|o| ns_name(o).0));
        }
    }
    if std::mem::take(&mut dirty.daemonsets) {
        let (sets, _) = reg.store.list(Kind::DaemonSet, None)?;
        workloads.extend(sets.iter().map(|o| ns_name(o).0));
    }
    let now = jiff::Timestamp::now();
    let due: Vec<String> = dirty.job_wakes.iter().filter(|(_, t)| **t <= now).map(|(ns, _)| ns.clone()).collect();
    for ns in due {
        dirty.job_wakes.remove(&ns);
        workloads.insert(ns);
    }
    for ns in &workloads {
        workloads::sync_namespace(reg, ns).await?;
        let ds_wake = daemonsets::sync_namespace(reg, ns).await?;
        let sts_wake = statefulsets::sync_namespace(reg, ns).await?;
        let cron_wake = cronjobs::sync_namespace(reg, ns).await?;
        let job_wake = jobs::sync_namespace(reg, ns).await?;
        match [ds_wake, sts_wake, cron_wake, job_wake].into_iter().flatten().min() {
            Some(t) => {
                dirty.job_wakes.insert(ns.clone(), t);
            }
            None => {
                dirty.job_wakes.remove(ns);
            }
        }
    }
    endpoints
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lb(ips: &[&str]) -> Value {
        let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        json!({"spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {"ingress": ingress}}})
    }

    #[test]
    fn only_a_service_letting_go_of_an_address_wakes_the_pending_ones() {
        let (held, none) = (lb(&["198.51.100.1"]), lb(&[]));
        assert!(!frees_address(EventType::Added, &held, None), "a new Service frees nothing");
        assert!(frees_address(EventType::Deleted, &held, None));
        assert!(!frees_address(EventType::Deleted, &none, None), "it held nothing");
        assert!(frees_address(EventType::Modified, &none, Some(&held)), "its type changed, say");
        assert!(!frees_address(EventType::Modified, &held, Some(&none)), "it got one");
        assert!(!frees_address(EventType::Modified, &held, Some(&held)));
        assert!(frees_address(EventType::Modified, &lb(&["198.51.100.2"]), Some(&held)), "it changed address");
        assert!(frees_address(EventType::Modified, &held, None), "not known: look");
    }
}
