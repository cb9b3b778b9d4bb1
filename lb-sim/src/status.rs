//! The status document (`GET /status`): every frontend, its backends and their health, as JSON.
//! Built purely from the model and the health results; served by a tiny axum app.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::extract::State;
use axum::routing::get;
use axum::Json;
use serde::{Deserialize, Serialize};

use std::sync::atomic::Ordering;

use crate::health::HealthState;
use crate::model::{self, Check, Delivery, Frontend, LbNode, Mode};
use crate::proxy::Counters;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    pub mode: String,
    pub nodes: Vec<NodeStatus>,
    pub frontends: Vec<FrontendStatus>,
    /// The L7 load balancer's sites, one per Ingress of the lab's class.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingresses: Vec<SiteStatus>,
    /// The Gateways' sites, one per address and port.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<GatewaySiteStatus>,
    /// The Gateways' last routing decisions, newest last (what `podpath trace` shows).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateway_decisions: Vec<crate::gateway::proxy::Decision>,
    /// The last error applying routes or opening listeners (cleared by the next success).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One port of a Gateway's address: its listeners and their rules in words, and its counts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySiteStatus {
    pub gateway: String,
    pub vip: String,
    pub port: u16,
    pub https: bool,
    /// `listener NAME (HOSTNAME): KIND NS/NAME rule I: MATCH → BACKEND (weight W: ENDPOINTS), …`
    pub rules: Vec<String>,
    #[serde(default)]
    pub requests: BTreeMap<String, u64>,
}

/// The status of the Gateways' sites.
pub fn gateway_sites(
    sites: &[crate::gateway::plan::Site],
    counts: impl Fn(std::net::IpAddr, u16) -> Option<[u64; 5]>,
) -> Vec<GatewaySiteStatus> {
    sites
        .iter()
        .map(|s| {
            let c = counts(s.vip, s.port).unwrap_or_default();
            GatewaySiteStatus {
                gateway: s.gateway.clone(),
                vip: s.vip.to_string(),
                port: s.port,
                https: s.https,
                rules: s.listeners.iter().flat_map(crate::gateway::route::describe_listener).collect(),
                requests: ["total", "proxied", "redirected", "notFound", "failed"]
                    .iter()
                    .map(|k| k.to_string())
                    .zip(c)
                    .collect(),
            }
        })
        .collect()
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    pub name: String,
    pub ip: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FrontendStatus {
    pub vip: String,
    pub service: String,
    /// `LoadBalancer` or `ExternalIP`.
    pub kind: String,
    /// `route` (passthrough) or `proxy` (to the NodePort).
    pub delivery: String,
    /// `name port/PROTO→nodePort`.
    pub ports: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    pub backends: Vec<BackendStatus>,
    /// Proxied connections (nodeport mode): accepted, proxied, failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<[u64; 3]>,
    /// The proxy listeners behind `connections` (filled in when the document is served).
    #[serde(skip)]
    pub listeners: Vec<SocketAddr>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackendStatus {
    pub node: String,
    /// Where traffic goes: the node IP (route) or `node IP:nodePort,…` (proxy).
    pub target: String,
    pub check: String,
    /// `healthy`, `unhealthy` or `unknown` (not checked yet).
    pub health: String,
    pub in_rotation: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One L7 site: its routing table as served, and what it answered.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SiteStatus {
    pub vip: String,
    pub ingress: String,
    /// `http`, or `http+https`.
    pub listeners: String,
    /// `secret NAMESPACE/NAME` or `generated`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate_note: Option<String>,
    /// `HOST PATH (TYPE) → SERVICE:PORT (nodePort N)`, in match order within each host.
    pub rules: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_backend: Option<String>,
    pub nodes_in_rotation: Vec<String>,
    #[serde(default)]
    pub requests: BTreeMap<String, u64>,
}

fn target_text(t: &crate::l7::Target) -> String {
    let np = t.node_port.map(|n| format!("nodePort {n}")).unwrap_or_else(|| "no nodePort".into());
    format!("{}:{} ({np})", t.service, t.port)
}

/// The status of the L7 sites.
pub fn sites(
    sites: &[crate::l7::Site],
    in_rotation: &[String],
    counts: impl Fn(&std::net::IpAddr) -> Option<crate::l7_proxy::SiteCounts>,
    note: impl Fn(&std::net::IpAddr) -> Option<String>,
) -> Vec<SiteStatus> {
    use crate::l7::{Certificate, PathKind};
    sites
        .iter()
        .map(|s| {
            let rules = s
                .rules
                .iter()
                .flat_map(|r| {
                    let host = if r.host.is_empty() { "*".to_string() } else { r.host.clone() };
                    r.paths.iter().map(move |p| {
                        let kind = if p.kind == PathKind::Exact { "Exact" } else { "Prefix" };
                        format!("{host} {} ({kind}) → {}", p.path, target_text(&p.target))
                    })
                })
                .collect();
            let c = counts(&s.vip).unwrap_or_default();
            SiteStatus {
                vip: s.vip.to_string(),
                ingress: s.ingress.clone(),
                listeners: if s.tls.is_some() { "http+https" } else { "http" }.into(),
                certificate: s.tls.as_ref().map(|t| match t {
                    Certificate::Secret { secret, .. } => format!("secret {secret}"),
                    Certificate::Generated { .. } => "generated".into(),
                }),
                certificate_note: note(&s.vip),
                rules,
                default_backend: s.default.as_ref().map(target_text),
                nodes_in_rotation: in_rotation.to_vec(),
                requests: BTreeMap::from([
                    ("total".to_string(), c.requests),
                    ("proxied".to_string(), c.proxied),
                    ("notFound".to_string(), c.not_found),
                    ("unavailable".to_string(), c.unavailable),
                    ("badGateway".to_string(), c.bad_gateway),
                ]),
            }
        })
        .collect()
}

/// Builds the document. `counters` gives a proxy frontend's connection counters.
pub fn build(
    mode: Mode,
    nodes: &[LbNode],
    frontends: &[Frontend],
    health: &BTreeMap<Check, HealthState>,
    counters: impl Fn(&SocketAddr) -> Option<(u64, u64, u64)>,
) -> Status {
    let healthy = |c: &Check| health.get(c).is_some_and(|h| h.healthy);
    let frontends = frontends
        .iter()
        .map(|f| {
            let rotation: Vec<&str> = model::in_rotation(f, &healthy).iter().map(|b| b.node.as_str()).collect();
            let node_ports: Vec<String> = f.ports.iter().filter_map(|p| p.node_port).map(|n| n.to_string()).collect();
            let backends = f
                .backends
                .iter()
                .map(|b| {
                    let h = health.get(&b.check);
                    BackendStatus {
                        node: b.node.clone(),
                        target: match f.delivery {
                            Delivery::Route => b.ip.to_string(),
                            Delivery::Proxy => format!("{}:{}", b.ip, node_ports.join(",")),
                        },
                        check: b.check.to_string(),
                        health: match h {
                            Some(h) if h.checked && h.healthy => "healthy",
                            Some(h) if h.checked => "unhealthy",
                            _ => "unknown",
                        }
                        .to_string(),
                        in_rotation: rotation.contains(&b.node.as_str()),
                        last_error: h.and_then(|h| h.last_error.clone()),
                    }
                })
                .collect();
            let connections = (f.delivery == Delivery::Proxy)
                .then(|| {
                    f.ports
                        .iter()
                        .filter_map(|p| counters(&SocketAddr::new(f.vip, p.port)))
                        .fold([0u64; 3], |acc, (a, p, x)| [acc[0] + a, acc[1] + p, acc[2] + x])
                })
                .filter(|_| f.ports.iter().any(|p| counters(&SocketAddr::new(f.vip, p.port)).is_some()));
            FrontendStatus {
                vip: f.vip.to_string(),
                service: f.service.clone(),
                kind: format!("{:?}", f.kind),
                delivery: format!("{:?}", f.delivery).to_lowercase(),
                ports: f
                    .ports
                    .iter()
                    .map(|p| {
                        let np = p.node_port.map(|n| format!("→{n}")).unwrap_or_default();
                        let name = if p.name.is_empty() { String::new() } else { format!("{} ", p.name) };
                        format!("{name}{}/{}{np}", p.port, p.protocol)
                    })
                    .collect(),
                pinned: f.pinned.clone(),
                backends,
                connections,
                listeners: if f.delivery == Delivery::Proxy {
                    f.ports.iter().map(|p| SocketAddr::new(f.vip, p.port)).collect()
                } else {
                    Vec::new()
                },
            }
        })
        .collect();
    Status {
        mode: mode.to_string(),
        nodes: nodes.iter().map(|n| NodeStatus { name: n.name.clone(), ip: n.ip.to_string() }).collect(),
        frontends,
        ingresses: Vec::new(),
        gateways: Vec::new(),
        gateway_decisions: Vec::new(),
        error: None,
    }
}

/// What the status endpoint serves: the document of the last reconcile and the live
/// connection counters of the proxies.
#[derive(Default)]
pub struct Shared {
    pub doc: Status,
    pub counters: BTreeMap<SocketAddr, Arc<Counters>>,
    /// The Gateways' decisions, read when the document is served (a trace asks right after
    /// its request).
    pub decisions: Option<Arc<crate::gateway::proxy::Decisions>>,
}

/// Serves `GET /status` (and `/`) and `GET /healthz` on `listener`.
pub async fn serve(listener: tokio::net::TcpListener, status: Arc<RwLock<Shared>>) {
    async fn show(State(s): State<Arc<RwLock<Shared>>>) -> Json<Status> {
        let shared = s.read().expect("status lock");
        let mut doc = shared.doc.clone();
        for f in &mut doc.frontends {
            let live: Vec<&Arc<Counters>> = f.listeners.iter().filter_map(|a| shared.counters.get(a)).collect();
            if !live.is_empty() {
                let sum = |get: fn(&Counters) -> u64| live.iter().map(|c| get(c)).sum::<u64>();
                f.connections = Some([
                    sum(|c| c.accepted.load(Ordering::Relaxed)),
                    sum(|c| c.proxied.load(Ordering::Relaxed)),
                    sum(|c| c.failed.load(Ordering::Relaxed)),
                ]);
            }
        }
        if let Some(d) = &shared.decisions {
            doc.gateway_decisions = d.recent();
        }
        Json(doc)
    }
    let app = axum::Router::new()
        .route("/status", get(show))
        .route("/", get(show))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(status);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "status server stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Backend, PortMap, VipKind};

    #[test]
    fn the_document_shows_health_rotation_and_targets() {
        let ip = |s: &str| s.parse().unwrap();
        let check = |n: &str| Check { ip: ip(n), port: 10256, path: "/healthz".into() };
        let f = Frontend {
            vip: ip("198.51.100.1"),
            service: "default/contour".into(),
            kind: VipKind::LoadBalancer,
            delivery: Delivery::Proxy,
            ports: vec![PortMap { name: "http".into(), protocol: "TCP".into(), port: 80, node_port: Some(30080) }],
            pinned: None,
            backends: vec![
                Backend { node: "node-1".into(), ip: ip("192.168.56.11"), check: check("192.168.56.11") },
                Backend { node: "node-2".into(), ip: ip("192.168.56.12"), check: check("192.168.56.12") },
            ],
        };
        let mut health = BTreeMap::new();
        let mut up = HealthState::default();
        up.observe(Ok(()));
        let mut down = HealthState::default();
        down.observe(Err("connection refused".into()));
        health.insert(check("192.168.56.11"), up);
        health.insert(check("192.168.56.12"), down);
        let s = build(Mode::Nodeport, &[], &[f], &health, |_| Some((3, 2, 1)));
        let fs = &s.frontends[0];
        assert_eq!(fs.ports, vec!["http 80/TCP→30080"]);
        assert_eq!(fs.connections, Some([3, 2, 1]));
        assert_eq!(fs.backends[0].target, "192.168.56.11:30080");
        assert_eq!((fs.backends[0].health.as_str(), fs.backends[0].in_rotation), ("healthy", true));
        assert_eq!((fs.backends[1].health.as_str(), fs.backends[1].in_rotation), ("unhealthy", false));
        assert_eq!(fs.backends[1].last_error.as_deref(), Some("connection refused"));
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["frontends"][0]["backends"][0]["inRotation"], true);
        assert_eq!(json["mode"], "nodeport");
    }
}
