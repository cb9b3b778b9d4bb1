//! The agent's Prometheus metrics (served at `/metrics` on the health port).

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CniLabels {
    pub operation: String,
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: String,
}

/// Every metric of the agent.
pub struct Metrics {
    registry: Registry,
    running: Mutex<HashSet<String>>,
    pods_running: Gauge,
    cni_seconds: Family<CniLabels, Histogram>,
    sync_errors: Family<ErrorLabels, Counter>,
    route_syncs: Counter,
    healthz: Family<CodeLabels, Counter>,
    livez: Family<CodeLabels, Counter>,
    pods_routes: Gauge<i64, std::sync::atomic::AtomicI64>,
    rules_repaired: Family<ErrorLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let ours = registry.sub_registry_with_prefix("podpath_node");
        let pods_running = Gauge::default();
        ours.register("pods_running", "Pods with at least one running workload process", pods_running.clone());
        let cni_seconds = Family::<CniLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.002, 2.0, 12))
        });
        ours.register("cni_operation_duration_seconds", "Latency of CNI ADD and DEL of a pod", cni_seconds.clone());
        let sync_errors = Family::<ErrorLabels, Counter>::default();
        ours.register("sync_errors", "Errors while syncing pods, routes and status, by kind", sync_errors.clone());
        let route_syncs = Counter::default();
        ours.register("route_syncs", "Route synchronisations with the Node list", route_syncs.clone());
        let pods_routes = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        ours.register("pod_routes", "Routes to other nodes' pod CIDRs", pods_routes.clone());
        let rules_repaired = Family::<ErrorLabels, Counter>::default();
        ours.register(
            "proxy_rules_repaired",
            "Times the service proxy found its rules changed from outside and rewrote them, by mode",
            rules_repaired.clone(),
        );
        // kube-proxy's names, so dashboards and habits carry over.
        let healthz = Family::<CodeLabels, Counter>::default();
        let livez = Family::<CodeLabels, Counter>::default();
        registry.register("proxy_healthz", "/healthz answers by HTTP code", healthz.clone());
        registry.register("proxy_livez", "/livez answers by HTTP code", livez.clone());
        Metrics {
            registry,
            running: Mutex::new(HashSet::new()),
            pods_running,
            cni_seconds,
            sync_errors,
            route_syncs,
            healthz,
            livez,
            pods_routes,
            rules_repaired,
        }
    }

    /// The proxy found its rules changed from outside (`mode`: iptables, nftables).
    pub fn rules_repaired(&self, mode: &str) {
        self.rules_repaired.get_or_create(&ErrorLabels { kind: mode.into() }).inc();
    }

    pub fn observe_cni(&self, operation: podpath_cni::env::Command, took: Duration, ok: bool) {
        let labels =
            CniLabels { operation: operation.as_str().into(), result: if ok { "success" } else { "error" }.into() };
        self.cni_seconds.get_or_create(&labels).observe(took.as_secs_f64());
    }

    pub fn sync_error(&self, kind: &str) {
        self.sync_errors.get_or_create(&ErrorLabels { kind: kind.into() }).inc();
    }

    pub fn set_running(&self, pod: &str, running: bool) {
        let mut set = self.running.lock().expect("metrics lock");
        if running {
            set.insert(pod.to_string());
        } else {
            set.remove(pod);
        }
        self.pods_running.set(set.len() as i64);
    }

    pub fn route_sync(&self, routes: usize) {
        self.route_syncs.inc();
        self.pods_routes.set(routes as i64);
    }

    pub fn health_answer(&self, livez: bool, code: u16) {
        let f = if livez { &self.livez } else { &self.healthz };
        f.get_or_create(&CodeLabels { code: code.to_string() }).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}
