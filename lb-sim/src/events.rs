//! What the load balancer reports as Events, found by comparing what it programmed last time
//! with what it programs now. Pure: [`observe`] takes a snapshot, [`diff`] says what to report.
//!
//! - a LoadBalancer Service whose frontends are new or changed: `EnsuringLoadBalancer` then
//!   `EnsuredLoadBalancer` once the routes and listeners are in place, or
//!   `SyncLoadBalancerFailed` (retried, and reported again, until it works) — the service
//!   controller's reasons and messages;
//! - its set of candidate nodes changed: `UpdatedLoadBalancer`, "Updated load balancer with new
//!   hosts" (the service controller's);
//! - a node withdrawn after failed health checks, or restored: `NodeWithdrawn` /
//!   `NodeRestored`. A cloud load balancer keeps these to itself; lb-sim reports them (as
//!   `lb-sim`) so `kubectl describe svc` shows the timeline of a failure;
//! - an Ingress of the lab's class, new or changed: `Sync`, "Scheduled for sync" (as
//!   ingress-nginx reports it).

use std::collections::{BTreeMap, BTreeSet};

use crate::health::HealthState;
use crate::model::{Check, Frontend, VipKind};

/// The object an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Object {
    Service,
    Ingress,
}

/// Who reports: the service controller's events, or lb-sim's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reporter {
    ServiceController,
    LbSim,
}

impl Reporter {
    pub fn component(self) -> &'static str {
        match self {
            Reporter::ServiceController => "service-controller",
            Reporter::LbSim => "lb-sim",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub object: Object,
    /// `namespace/name`.
    pub key: String,
    pub reporter: Reporter,
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// One LoadBalancer Service as programmed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LbSeen {
    /// Addresses and ports: a change means the load balancer is ensured again.
    signature: String,
    /// Candidate nodes.
    hosts: BTreeSet<String>,
    /// Nodes whose checks said healthy / unhealthy (nodes not checked yet are in neither).
    healthy: BTreeSet<String>,
    unhealthy: BTreeMap<String, String>,
    /// Some VIP of it, for messages.
    vip: String,
}

/// What was programmed: LoadBalancer Services and Ingress sites (by resourceVersion).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    lbs: BTreeMap<String, LbSeen>,
    sites: BTreeMap<String, String>,
}

/// A snapshot of what is programmed now. `sites` are `(namespace/name, resourceVersion)` of the
/// Ingresses served.
pub fn observe(frontends: &[Frontend], health: &BTreeMap<Check, HealthState>, sites: &[(String, String)]) -> Seen {
    let mut lbs: BTreeMap<String, LbSeen> = BTreeMap::new();
    for f in frontends.iter().filter(|f| f.kind == VipKind::LoadBalancer) {
        let lb = lbs.entry(f.service.clone()).or_default();
        let ports: Vec<String> =
            f.ports.iter().map(|p| format!("{}/{}:{:?}", p.port, p.protocol, p.node_port)).collect();
        if !lb.signature.is_empty() {
            lb.signature.push(' ');
        }
        lb.signature.push_str(&format!("{}[{}]{:?}{:?}", f.vip, ports.join(","), f.delivery, f.pinned));
        if lb.vip.is_empty() {
            lb.vip = f.vip.to_string();
        }
        for b in &f.backends {
            lb.hosts.insert(b.node.clone());
            match health.get(&b.check) {
                Some(h) if h.checked && h.healthy => {
                    lb.healthy.insert(b.node.clone());
                }
                Some(h) if h.checked => {
                    let why = h.last_error.clone().unwrap_or_else(|| "failed".into());
                    lb.unhealthy.insert(b.node.clone(), format!("health check {} failed: {why}", b.check));
                }
                _ => {}
            }
        }
    }
    Seen { lbs, sites: sites.iter().cloned().collect() }
}

/// The events between `prev` and `now`, and what counts as seen afterwards. `error` is the
/// first error applying `now` (routes, listeners): a new or changed load balancer is then
/// reported failed and stays unseen, so the retry that works reports it ensured.
pub fn diff(prev: &Seen, now: &Seen, error: Option<&str>) -> (Vec<Event>, Seen) {
    let mut out = Vec::new();
    let mut kept = Seen { lbs: BTreeMap::new(), sites: now.sites.clone() };
    let ev = |key: &str, reporter, warning, reason, message: String| Event {
        object: Object::Service,
        key: key.to_string(),
        reporter,
        warning,
        reason,
        message,
    };
    for (key, lb) in &now.lbs {
        let before = prev.lbs.get(key);
        if before.is_none_or(|b| b.signature != lb.signature) {
            out.push(ev(
                key,
                Reporter::ServiceController,
                false,
                "EnsuringLoadBalancer",
                "Ensuring load balancer".into(),
            ));
            match error {
                Some(e) => {
                    out.push(ev(
                        key,
                        Reporter::ServiceController,
                        true,
                        "SyncLoadBalancerFailed",
                        format!("Error syncing load balancer: failed to ensure load balancer: {e}"),
                    ));
                    if let Some(b) = before {
                        kept.lbs.insert(key.clone(), b.clone());
                    }
                    continue;
                }
                None => out.push(ev(
                    key,
                    Reporter::ServiceController,
                    false,
                    "EnsuredLoadBalancer",
                    "Ensured load balancer".into(),
                )),
            }
        } else if let Some(b) = before {
            if b.hosts != lb.hosts {
                out.push(ev(
                    key,
                    Reporter::ServiceController,
                    false,
                    "UpdatedLoadBalancer",
                    "Updated load balancer with new hosts".into(),
                ));
            }
        }
        if let Some(b) = before {
            for (node, why) in &lb.unhealthy {
                if b.healthy.contains(node) {
                    let msg = format!("Node {node} withdrawn from load balancer {}: {why}", lb.vip);
                    out.push(ev(key, Reporter::LbSim, true, "NodeWithdrawn", msg));
                }
            }
            for node in &lb.healthy {
                if b.unhealthy.contains_key(node) {
                    let msg = format!("Node {node} restored to load balancer {}: health check passes", lb.vip);
                    out.push(ev(key, Reporter::LbSim, false, "NodeRestored", msg));
                }
            }
        }
        kept.lbs.insert(key.clone(), lb.clone());
    }
    for (key, rv) in &now.sites {
        if prev.sites.get(key) != Some(rv) {
            out.push(Event {
                object: Object::Ingress,
                key: key.clone(),
                reporter: Reporter::LbSim,
                warning: false,
                reason: "Sync",
                message: "Scheduled for sync".into(),
            });
        }
    }
    (out, kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Backend, Delivery, PortMap};

    fn check(n: u8) -> Check {
        Check { ip: format!("192.168.56.{n}").parse().unwrap(), port: 10256, path: "/healthz".into() }
    }

    fn fe(nodes: &[u8], port: u16) -> Frontend {
        Frontend {
            vip: "192.168.200.10".parse().unwrap(),
            service: "default/web".into(),
            kind: VipKind::LoadBalancer,
            delivery: Delivery::Route,
            ports: vec![PortMap { name: "http".into(), protocol: "TCP".into(), port, node_port: Some(30080) }],
            pinned: None,
            backends: nodes
                .iter()
                .map(|n| Backend { node: format!("node-{n}"), ip: check(*n).ip, check: check(*n) })
                .collect(),
        }
    }

    fn health(states: &[(u8, Option<bool>)]) -> BTreeMap<Check, HealthState> {
        states
            .iter()
            .filter_map(|(n, h)| {
                let h = (*h)?;
                let mut s = HealthState::default();
                s.observe(if h { Ok(()) } else { Err("connection refused".into()) });
                Some((check(*n), s))
            })
            .collect()
    }

    fn reasons(evs: &[Event]) -> Vec<&str> {
        evs.iter().map(|e| e.reason).collect()
    }

    #[test]
    fn a_new_load_balancer_is_ensured_once_and_a_failure_is_reported_until_it_works() {
        let now = observe(&[fe(&[11, 12], 80)], &health(&[]), &[]);
        let (evs, seen) = diff(&Seen::default(), &now, Some("listen on 192.168.200.10:80: address in use"));
        assert_eq!(reasons(&evs), ["EnsuringLoadBalancer", "SyncLoadBalancerFailed"]);
        assert!(evs[1].warning && evs[1].message.ends_with("address in use"), "{:?}", evs[1]);
        let (evs, seen) = diff(&seen, &now, None);
        assert_eq!(reasons(&evs), ["EnsuringLoadBalancer", "EnsuredLoadBalancer"]);
        assert_eq!(evs[1].reporter.component(), "service-controller");
        assert!(diff(&seen, &now, None).0.is_empty(), "nothing changed, nothing said");
        // A new port: ensured again. A node gone: updated hosts.
        let (evs, seen) = diff(&seen, &observe(&[fe(&[11, 12], 8080)], &health(&[]), &[]), None);
        assert_eq!(reasons(&evs), ["EnsuringLoadBalancer", "EnsuredLoadBalancer"]);
        let (evs, _) = diff(&seen, &observe(&[fe(&[11], 8080)], &health(&[]), &[]), None);
        assert_eq!(reasons(&evs), ["UpdatedLoadBalancer"]);
        assert_eq!(evs[0].message, "Updated load balancer with new hosts");
    }

    #[test]
    fn withdrawal_and_restoration_are_reported_on_known_transitions_only() {
        let f = [fe(&[11, 12], 80)];
        let (_, seen) = diff(&Seen::default(), &observe(&f, &health(&[(11, None), (12, None)]), &[]), None);
        // First results: no event (nothing was in rotation before).
        let (evs, seen) = diff(&seen, &observe(&f, &health(&[(11, Some(true)), (12, Some(false))]), &[]), None);
        assert!(evs.is_empty(), "{evs:?}");
        let (evs, seen) = diff(&seen, &observe(&f, &health(&[(11, Some(false)), (12, Some(true))]), &[]), None);
        assert_eq!(reasons(&evs), ["NodeWithdrawn", "NodeRestored"]);
        assert_eq!(
            evs[0].message,
            "Node node-11 withdrawn from load balancer 192.168.200.10: health check \
             http://192.168.56.11:10256/healthz failed: connection refused"
        );
        assert!(evs[0].warning && !evs[1].warning);
        assert_eq!(evs[1].reporter.component(), "lb-sim");
        assert!(diff(&seen, &observe(&f, &health(&[(11, Some(false)), (12, Some(true))]), &[]), None).0.is_empty());
    }

    #[test]
    fn an_ingress_is_synced_when_new_or_changed() {
        let a = observe(&[], &BTreeMap::new(), &[("default/site".into(), "5".into())]);
        let (evs, seen) = diff(&Seen::default(), &a, None);
        assert_eq!(
            (evs[0].object, evs[0].reason, evs[0].message.as_str()),
            (Object::Ingress, "Sync", "Scheduled for sync")
        );
        assert!(diff(&seen, &a, None).0.is_empty());
        let b = observe(&[], &BTreeMap::new(), &[("default/site".into(), "6".into())]);
        assert_eq!(diff(&seen, &b, None).0.len(), 1);
    }
}
