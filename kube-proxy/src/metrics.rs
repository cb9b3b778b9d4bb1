//! The metrics page of the node's health port (`/metrics` on `:10256`): kube-proxy's own
//! (`proxy_healthz`, `proxy_livez`, `podpath_node_proxy_rules_repaired`), the errors counter
//! every component of the node reports into (`podpath_node_sync_errors`), and whatever the
//! other components of the node register beside them ([`Metrics::with`]).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

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
        Metrics { registry, sync_errors, healthz, livez, rules_repaired }
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
}
