//! The kubelet's metrics: pods running, CNI latency, and its errors in the node's shared
//! errors counter. They are registered in the registry the node agent serves on its health
//! port (`podpath_node_…`).

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

/// A counter by `kind`, the type of the node's shared errors counter.
pub type KindCounter = Family<[(&'static str, String); 1], Counter>;

/// The kubelet's handles into the node's registry.
pub struct Metrics {
    running: Mutex<HashSet<String>>,
    pods_running: Gauge,
    cni_seconds: Family<CniLabels, Histogram>,
    sync_errors: KindCounter,
}

impl Metrics {
    /// Registers the kubelet's metrics in `registry` (the node's `podpath_node` sub-registry);
    /// errors go to `sync_errors`, which the node's other components share.
    pub fn register(registry: &mut Registry, sync_errors: KindCounter) -> Metrics {
        let pods_running = Gauge::default();
        registry.register("pods_running", "Pods with at least one running workload process", pods_running.clone());
        let cni_seconds = Family::<CniLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.002, 2.0, 12))
        });
        registry.register("cni_operation_duration_seconds", "Latency of CNI ADD and DEL of a pod", cni_seconds.clone());
        Metrics { running: Mutex::new(HashSet::new()), pods_running, cni_seconds, sync_errors }
    }

    /// Metrics in a registry of their own (tests, tools).
    pub fn new() -> Metrics {
        Metrics::register(&mut Registry::default(), KindCounter::default())
    }

    pub fn observe_cni(&self, operation: podpath_cni_spec::env::Command, took: Duration, ok: bool) {
        let labels =
            CniLabels { operation: operation.as_str().into(), result: if ok { "success" } else { "error" }.into() };
        self.cni_seconds.get_or_create(&labels).observe(took.as_secs_f64());
    }

    pub fn sync_error(&self, kind: &str) {
        self.sync_errors.get_or_create(&[("kind", kind.into())]).inc();
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
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
