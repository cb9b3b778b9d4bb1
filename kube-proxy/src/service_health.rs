//! Per-service health checks on `healthCheckNodePort` (LoadBalancer Services with
//! `externalTrafficPolicy: Local`), as kube-proxy serves them: one HTTP listener per port, any
//! path, 200 when this node has a ready local endpoint and the proxy is healthy, else 503, with
//! kube-proxy's JSON body and `X-Load-Balancing-Endpoint-Weight` (reference/kube-proxy.md §1.7).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::iptables::ServiceState;
use crate::health::Health;

/// What one health-check port reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthTarget {
    pub namespace: String,
    pub name: String,
    pub local_endpoints: usize,
}

/// The health-check ports a snapshot asks for, with this node's ready endpoints of each.
pub fn wanted<'a>(states: impl IntoIterator<Item = &'a ServiceState>, node: &str) -> BTreeMap<u16, HealthTarget> {
    let mut out: BTreeMap<u16, HealthTarget> = BTreeMap::new();
    for s in states {
        let Some(port) = s.port.health_check_node_port else { continue };
        let local = s.endpoints.iter().filter(|e| e.ready && e.node.as_deref() == Some(node)).count();
        let entry = out.entry(port).or_insert(HealthTarget {
            namespace: s.port.id.namespace.clone(),
            name: s.port.id.name.clone(),
            local_endpoints: 0,
        });
        // Several ports of one Service share the check; endpoints are per pod, count them once.
        entry.local_endpoints = entry.local_endpoints.max(local);
    }
    out
}

/// The answer of one check (pure).
pub fn answer(target: &HealthTarget, proxy_healthy: bool) -> (u16, serde_json::Value) {
    let ok = target.local_endpoints > 0 && proxy_healthy;
    let body = json!({
        "service": {"namespace": target.namespace, "name": target.name},
        "localEndpoints": target.local_endpoints,
        "serviceProxyHealthy": proxy_healthy,
    });
    (if ok { 200 } else { 503 }, body)
}

type Targets = Arc<Mutex<HashMap<u16, HealthTarget>>>;

/// The running listeners.
pub struct HealthServers {
    bind: IpAddr,
    targets: Targets,
    servers: HashMap<u16, tokio::task::JoinHandle<()>>,
    health: Arc<Health>,
}

impl HealthServers {
    pub fn new(bind: IpAddr, health: Arc<Health>) -> HealthServers {
        HealthServers { bind, targets: Targets::default(), servers: HashMap::new(), health }
    }

    /// Opens listeners for new ports, closes those no longer wanted, updates the counts.
    pub async fn sync(&mut self, wanted: BTreeMap<u16, HealthTarget>) {
        {
            let mut t = self.targets.lock().expect("targets lock");
            t.clear();
            t.extend(wanted.iter().map(|(p, h)| (*p, h.clone())));
        }
        self.servers.retain(|port, task| {
            let keep = wanted.contains_key(port);
            if !keep {
                task.abort();
            }
            keep
        });
        for port in wanted.keys() {
            if self.servers.contains_key(port) {
                continue;
            }
            let addr = SocketAddr::new(self.bind, *port);
            let listener = match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(%addr, "cannot open the health check node port: {e}");
                    self.health.metrics.sync_error("healthcheck");
                    continue;
                }
            };
            let (targets, health, port) = (self.targets.clone(), self.health.clone(), *port);
            let app = axum::Router::new().fallback(move || {
                let (targets, health) = (targets.clone(), health.clone());
                async move { respond(&targets, &health, port) }
            });
            self.servers.insert(
                port,
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                }),
            );
        }
    }
}

impl Drop for HealthServers {
    fn drop(&mut self) {
        for task in self.servers.values() {
            task.abort();
        }
    }
}

fn respond(targets: &Targets, health: &Health, port: u16) -> Response {
    let Some(target) = targets.lock().expect("targets lock").get(&port).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let healthy = health.answer(true, Instant::now()).0 == 200;
    let (code, body) = answer(&target, healthy);
    let mut r = (StatusCode::from_u16(code).expect("code"), body.to_string()).into_response();
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    h.insert("x-load-balancing-endpoint-weight", HeaderValue::from(target.local_endpoints));
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, ServicePort};

    fn state(hc: Option<u16>, nodes: &[&str]) -> ServiceState {
        ServiceState {
            port: ServicePort {
                node_port: Some(30080),
                external_policy_local: true,
                health_check_node_port: hc,
                ..ServicePort::new("default", "contour", "http", "tcp", 80)
            },
            endpoints: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| Endpoint {
                    ip: format!("10.244.0.{}", i + 2).parse().unwrap(),
                    port: 8080,
                    node: Some((*n).into()),
                    ready: true,
                    serving: true,
                    terminating: false,
                })
                .collect(),
        }
    }

    #[test]
    fn counts_only_this_nodes_ready_endpoints() {
        let w = wanted(&[state(Some(32000), &["node-1", "node-2", "node-1"]), state(None, &["node-1"])], "node-1");
        assert_eq!(w.len(), 1);
        assert_eq!(w[&32000].local_endpoints, 2);
        let (code, body) = answer(&w[&32000], true);
        assert_eq!(code, 200);
        assert_eq!(
            body,
            json!({"service": {"namespace": "default", "name": "contour"}, "localEndpoints": 2, "serviceProxyHealthy": true})
        );
        assert_eq!(answer(&w[&32000], false).0, 503);
        let none = wanted(&[state(Some(32000), &["node-2"])], "node-1");
        assert_eq!(answer(&none[&32000], true).0, 503);
    }
}
