//! Health on `:10256` with kube-proxy's semantics (`/healthz`, `/livez`) and `/metrics`.
//!
//! The agent is unhealthy when a change it received has waited longer than the health timeout
//! (2 × sync period) to be applied. `/healthz` is also 503 while the Node is being deleted or
//! carries `ToBeDeletedByClusterAutoscaler` (so load balancers drain it); `/livez` ignores that.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use jiff::Timestamp;
use k8s_openapi::api::core::v1 as core;
use serde_json::json;

use crate::metrics::Metrics;

#[derive(Debug, Default)]
struct Times {
    last_updated: Option<Timestamp>,
    oldest_queued: Option<Instant>,
}

/// Shared health state: syncers report `queued` when a change arrives and `updated` when it has
/// been applied.
pub struct Health {
    times: Mutex<Times>,
    timeout: Duration,
    node_eligible: AtomicBool,
    pub metrics: Arc<Metrics>,
}

impl Health {
    pub fn new(timeout: Duration, metrics: Arc<Metrics>) -> Arc<Health> {
        Arc::new(Health { times: Mutex::default(), timeout, node_eligible: AtomicBool::new(true), metrics })
    }

    pub fn queued(&self) {
        let mut t = self.times.lock().expect("health lock");
        t.oldest_queued.get_or_insert_with(Instant::now);
        self.metrics.queued();
    }

    pub fn updated(&self) {
        let mut t = self.times.lock().expect("health lock");
        t.last_updated = Some(Timestamp::now());
        t.oldest_queued = None;
    }

    /// Follows the Node object: not eligible while deleted or marked for scale-down.
    pub fn observe_node(&self, node: Option<&core::Node>) {
        let eligible = node.is_some_and(|n| {
            n.metadata.deletion_timestamp.is_none()
                && !n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| ts.iter().any(|t| t.key == "ToBeDeletedByClusterAutoscaler"))
        });
        self.node_eligible.store(eligible, Ordering::Relaxed);
    }

    /// `(HTTP code, JSON body)` of `/healthz` (`livez == false`) or `/livez`.
    pub fn answer(&self, livez: bool, now: Instant) -> (u16, serde_json::Value) {
        let t = self.times.lock().expect("health lock");
        let healthy = t.oldest_queued.is_none_or(|q| now.duration_since(q) < self.timeout);
        let last = t.last_updated.map(|l| l.to_string()).unwrap_or_default();
        let current = Timestamp::now().to_string();
        let eligible = self.node_eligible.load(Ordering::Relaxed);
        let mut body = json!({
            "lastUpdated": last,
            "currentTime": current,
            "healthy": healthy,
            "status": {"IPv4": {"lastUpdated": last, "healthy": healthy}},
        });
        let ok = if livez {
            healthy
        } else {
            body["nodeEligible"] = json!(eligible);
            healthy && eligible
        };
        (if ok { 200 } else { 503 }, body)
    }
}

async fn respond(health: &Health, livez: bool) -> Response {
    let (code, body) = health.answer(livez, Instant::now());
    health.metrics.health_answer(livez, code);
    let mut r = (StatusCode::from_u16(code).expect("code"), body.to_string()).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    r
}

/// Serves `/healthz`, `/livez` and `/metrics` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route("/healthz", get(|State(h): State<Arc<Health>>| async move { respond(&h, false).await }))
        .route("/livez", get(|State(h): State<Arc<Health>>| async move { respond(&h, true).await }))
        .route(
            "/metrics",
            get(|State(h): State<Arc<Health>>| async move {
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], h.metrics.render())
            }),
        )
        .with_state(health);
    axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves kube-proxy's metrics server (its `--metrics-bind-address`, `127.0.0.1:10249`):
/// `/proxyMode` (the mode's name, as `curl localhost:10249/proxyMode` on a node shows it),
/// `/configz` (the proxy's configuration under `kubeproxy.config.k8s.io`, as kube-proxy's),
/// `/metrics` and `/healthz`, until `shutdown`.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    health: Arc<Health>,
    mode: &'static str,
    configz: serde_json::Value,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let configz = Arc::new(serde_json::json!({ "kubeproxy.config.k8s.io": configz }).to_string());
    let app = axum::Router::new()
        .route("/proxyMode", get(move || async move { mode }))
        .route(
            "/configz",
            get(move || {
                let c = configz.clone();
                async move { ([(header::CONTENT_TYPE, "application/json")], (*c).clone()) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/metrics",
            get(|State(h): State<Arc<Health>>| async move {
                ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], h.metrics.render())
            }),
        )
        .with_state(health);
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unhealthy_only_when_a_change_waits_too_long() {
        let h = Health::new(Duration::from_secs(60), Arc::new(Metrics::new()));
        let now = Instant::now();
        assert_eq!(h.answer(false, now).0, 200, "healthy before anything happened");
        h.queued();
        assert_eq!(h.answer(false, now + Duration::from_secs(59)).0, 200);
        assert_eq!(h.answer(false, now + Duration::from_secs(61)).0, 503);
        assert_eq!(h.answer(true, now + Duration::from_secs(61)).0, 503);
        h.updated();
        let (code, body) = h.answer(false, now + Duration::from_secs(61));
        assert_eq!(code, 200);
        assert_eq!(body["healthy"], true);
        assert!(body["lastUpdated"].as_str().is_some_and(|s| !s.is_empty()));
    }

    #[test]
    fn healthz_drains_a_node_being_deleted_livez_does_not() {
        let h = Health::new(Duration::from_secs(60), Arc::new(Metrics::new()));
        let mut node = core::Node::default();
        node.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()));
        h.observe_node(Some(&node));
        let (code, body) = h.answer(false, Instant::now());
        assert_eq!((code, &body["nodeEligible"]), (503, &json!(false)));
        assert_eq!(h.answer(true, Instant::now()).0, 200);
        assert!(h.answer(true, Instant::now()).1.get("nodeEligible").is_none());
        h.observe_node(Some(&core::Node::default()));
        assert_eq!(h.answer(false, Instant::now()).0, 200);
    }
}
