//! The metrics page of the node's health port (`/metrics` on `:10256`): kube-proxy's own
//! (`proxy_healthz`, `proxy_livez`, `podpath_node_proxy_rules_repaired`), the errors counter
//! every component of the node reports into (`podpath_node_sync_errors`), and whatever the
//! other components of the node register beside them ([`Metrics::with`]).

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// A counter by one label (`kind`, or `code` for the health answers). A plain array label set,
/// so that other crates register and increment the same family without sharing a label type.
pub type KindCounter = Family<[(&'static str, String); 1], Counter>;

/// The prefix of the node's own metrics (kube-proxy's health counters keep kube-proxy's names).
pub const PREFIX: &str = "podpath_node";

/// The registry and kube-proxy's handles into it.
pub struct Metrics {
    registry: Registry,
    sync_errors: KindCounter,
    // By `code`.
    healthz: KindCounter,
    livez: KindCounter,
    rules_repaired: KindCounter,
    // kube-proxy's sync metrics, under its names.
    sync_duration: Histogram,
    full_sync_duration: Histogram,
    partial_sync_duration: Histogram,
    last_sync: Gauge<f64, AtomicU64>,
    last_queued: Gauge<f64, AtomicU64>,
    /// By `table`: the iptables rules the proxy owns.
    iptables_total: Family<[(&'static str, String); 1], Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// kube-proxy's metrics alone.
    pub fn new() -> Metrics {
        Metrics::with(|_, _| {})
    }

    /// kube-proxy's metrics, and what `others` registers in the same registry (given the
    /// `podpath_node` sub-registry and the shared errors counter): the node agent's kubelet and
    /// routes, so one page has them all.
    pub fn with(others: impl FnOnce(&mut Registry, &KindCounter)) -> Metrics {
        let mut registry = Registry::default();
        let ours = registry.sub_registry_with_prefix(PREFIX);
        let sync_errors = KindCounter::default();
        ours.register("sync_errors", "Errors while syncing pods, routes and status, by kind", sync_errors.clone());
        let rules_repaired = KindCounter::default();
        ours.register(
            "proxy_rules_repaired",
            "Times the service proxy found its rules changed from outside and rewrote them, by mode",
            rules_repaired.clone(),
        );
        others(ours, &sync_errors);
        // kube-proxy's names, so dashboards and habits carry over.
        let healthz = Family::default();
        let livez = Family::default();
        registry.register("proxy_healthz", "/healthz answers by HTTP code", healthz.clone());
        registry.register("proxy_livez", "/livez answers by HTTP code", livez.clone());
        // kube-proxy's buckets: 1 ms doubling, 15 of them.
        let histogram = || Histogram::new(exponential_buckets(0.001, 2.0, 15));
        let (sync_duration, full_sync_duration, partial_sync_duration) = (histogram(), histogram(), histogram());
        registry.register(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_full_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for full resyncs",
            full_sync_duration.clone(),
        );
        registry.register(
            "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds for partial resyncs",
            partial_sync_duration.clone(),
        );
        let (last_sync, last_queued) = (Gauge::<f64, AtomicU64>::default(), Gauge::<f64, AtomicU64>::default());
        registry.register(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            last_sync.clone(),
        );
        registry.register(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            last_queued.clone(),
        );
        let iptables_total = Family::default();
        registry.register(
            "kubeproxy_sync_proxy_rules_iptables_total",
            "Total number of iptables rules owned by kube-proxy",
            iptables_total.clone(),
        );
        Metrics {
            iptables_total,
            registry,
            sync_errors,
            healthz,
            livez,
            rules_repaired,
            sync_duration,
            full_sync_duration,
            partial_sync_duration,
            last_sync,
            last_queued,
        }
    }

    /// A sync of the proxy's rules finished (`full`: every Service rewritten), taking `took`.
    pub fn synced(&self, full: bool, took: Duration) {
        let s = took.as_secs_f64();
        self.sync_duration.observe(s);
        if full { &self.full_sync_duration } else { &self.partial_sync_duration }.observe(s);
        self.last_sync.set(jiff::Timestamp::now().as_millisecond() as f64 / 1000.0);
    }

    /// After an iptables sync: how many rules of the proxy's `table` the kernel holds.
    pub fn iptables_rules(&self, table: &str, count: usize) {
        self.iptables_total.get_or_create(&[("table", table.into())]).set(count as i64);
    }

    /// A change arrived that a sync will apply.
    pub fn queued(&self) {
        self.last_queued.set(jiff::Timestamp::now().as_millisecond() as f64 / 1000.0);
    }

    /// The proxy found its rules changed from outside (`mode`: iptables, nftables).
    pub fn rules_repaired(&self, mode: &str) {
        self.rules_repaired.get_or_create(&[("kind", mode.into())]).inc();
    }

    pub fn sync_error(&self, kind: &str) {
        self.sync_errors.get_or_create(&[("kind", kind.into())]).inc();
    }

    pub fn health_answer(&self, livez: bool, code: u16) {
        let f = if livez { &self.livez } else { &self.healthz };
        f.get_or_create(&[("code", code.to_string())]).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_page_holds_every_component_and_one_errors_counter() {
        let mut extra = None;
        let m = Metrics::with(|reg, errors| {
            let g = prometheus_client::metrics::gauge::Gauge::<i64>::default();
            reg.register("pods_running", "Pods", g.clone());
            g.set(2);
            errors.get_or_create(&[("kind", "sandbox".into())]).inc();
            extra = Some(g);
        });
        m.sync_error("iptables");
        m.rules_repaired("nftables");
        m.health_answer(false, 200);
        let page = m.render();
        for line in [
            "podpath_node_pods_running 2",
            "podpath_node_sync_errors_total{kind=\"sandbox\"} 1",
            "podpath_node_sync_errors_total{kind=\"iptables\"} 1",
            "podpath_node_proxy_rules_repaired_total{kind=\"nftables\"} 1",
            "proxy_healthz_total{code=\"200\"} 1",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} in\n{page}");
        }
    }

    #[test]
    fn syncs_are_timed_under_kube_proxys_names() {
        let m = Metrics::new();
        m.queued();
        m.synced(true, Duration::from_millis(3));
        m.synced(false, Duration::from_micros(500));
        let page = m.render();
        for line in [
            "kubeproxy_sync_proxy_rules_duration_seconds_count 2",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_count 1",
            "kubeproxy_sync_partial_proxy_rules_duration_seconds_bucket{le=\"0.001\"} 1",
            "kubeproxy_sync_full_proxy_rules_duration_seconds_bucket{le=\"0.004\"} 1",
        ] {
            assert!(page.lines().any(|l| l == line), "{line} in\n{page}");
        }
        let last = page.lines().find(|l| l.starts_with("kubeproxy_sync_proxy_rules_last_timestamp_seconds ")).unwrap();
        let secs: f64 = last.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(secs > 1.7e9, "{last}");
    }
}
