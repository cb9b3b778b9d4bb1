//! `podpath watch`: what the cluster does about a failure, as a timeline. Every interval the lab
//! is read ([`snapshot`]: nodes' Ready conditions, pods' phase/readiness/restarts, the ready
//! endpoints of every Service, the load balancer's rotation per VIP, each agent's `/healthz`
//! and repaired-rules counter, the faults in force) and the differences from the previous read
//! are printed with a timestamp ([`diff`], pure), so a node stopped behind the load balancer
//! reads as: fault → endpoints leave → node NotReady → LB withdraws it → … → back.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::plan::Plan;
use crate::state::{ApiAccess, LabState};
use crate::Result;

/// The lab as the timeline sees it at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Node → its Ready condition (`True`, `False`, `Unknown`) and reason.
    pub nodes: BTreeMap<String, String>,
    /// `NS/NAME` → `Running, ready` / `Pending` / …, with restarts.
    pub pods: BTreeMap<String, String>,
    /// `NS/SERVICE` → the addresses of its ready endpoints.
    pub endpoints: BTreeMap<String, BTreeSet<String>>,
    /// `VIP (NS/SERVICE)` → the nodes in rotation.
    pub rotation: BTreeMap<String, BTreeSet<String>>,
    /// Node → the agent's `/healthz` answer (`200`, `503`, `no answer`).
    pub healthz: BTreeMap<String, String>,
    /// Node → rules repaired so far (the agent's counter).
    pub repairs: BTreeMap<String, u64>,
    /// The faults in force, in words.
    pub faults: BTreeSet<String>,
}

/// The lines that tell what changed from `old` to `new` (pure). The first snapshot, against an
/// empty one, tells the starting state.
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<String> {
    let mut out = vec![];
    for (f, added) in set_changes(&old.faults, &new.faults) {
        out.push(format!("fault {}: {f}", if added { "made" } else { "cleared" }));
    }
    map_changes(&old.nodes, &new.nodes, &mut out, |n, was, now| match (was, now) {
        (None, Some(s)) => format!("node {n}: Ready={s}"),
        (Some(w), Some(s)) => format!("node {n}: Ready {w} → {s}"),
        (Some(_), None) => format!("node {n}: gone"),
        (None, None) => unreachable!(),
    });
    map_changes(&old.healthz, &new.healthz, &mut out, |n, was, now| match (was, now) {
        (None, Some(s)) => format!("node {n}: proxy /healthz {s}"),
        (Some(w), Some(s)) => format!("node {n}: proxy /healthz {w} → {s}"),
        _ => format!("node {n}: proxy /healthz gone"),
    });
    for (n, count) in &new.repairs {
        match old.repairs.get(n) {
            Some(before) if count > before => out.push(format!(
                "node {n}: service proxy rules rewritten after a change from outside ({} repairs)",
                count
            )),
            _ => {}
        }
    }
    map_changes(&old.pods, &new.pods, &mut out, |p, was, now| match (was, now) {
        (None, Some(s)) => format!("pod {p}: {s}"),
        (Some(w), Some(s)) => format!("pod {p}: {w} → {s}"),
        (Some(_), None) => format!("pod {p}: deleted"),
        (None, None) => unreachable!(),
    });
    let services: BTreeSet<&String> = old.endpoints.keys().chain(new.endpoints.keys()).collect();
    for s in services {
        let empty = BTreeSet::new();
        let (was, now) = (old.endpoints.get(s).unwrap_or(&empty), new.endpoints.get(s).unwrap_or(&empty));
        if was == now {
            continue;
        }
        let changes: Vec<String> = set_changes(was, now)
            .into_iter()
            .map(|(a, added)| format!("{}{a}", if added { "+" } else { "-" }))
            .collect();
        out.push(format!("endpoints {s}: {} (ready: {})", changes.join(" "), list(now)));
    }
    let vips: BTreeSet<&String> = old.rotation.keys().chain(new.rotation.keys()).collect();
    for v in vips {
        let empty = BTreeSet::new();
        let (was, now) = (old.rotation.get(v).unwrap_or(&empty), new.rotation.get(v).unwrap_or(&empty));
        for (node, added) in set_changes(was, now) {
            out.push(format!(
                "load balancer {v}: {node} {} (in rotation: {})",
                if added { "in rotation" } else { "withdrawn" },
                list(now)
            ));
        }
    }
    out
}

fn list(s: &BTreeSet<String>) -> String {
    if s.is_empty() {
        "none".into()
    } else {
        s.iter().cloned().collect::<Vec<_>>().join(", ")
    }
}

fn set_changes(old: &BTreeSet<String>, new: &BTreeSet<String>) -> Vec<(String, bool)> {
    let mut out: Vec<(String, bool)> = old.difference(new).map(|x| (x.clone(), false)).collect();
    out.extend(new.difference(old).map(|x| (x.clone(), true)));
    out
}

fn map_changes(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
    out: &mut Vec<String>,
    line: impl Fn(&str, Option<&String>, Option<&String>) -> String,
) {
    let keys: BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for k in keys {
        let (w, n) = (old.get(k), new.get(k));
        if w != n {
            out.push(line(k, w, n));
        }
    }
}

/// A pod's Ready condition is True.
pub fn pod_ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// A pod's restarts, its containers' together.
pub fn pod_restarts(p: &Value) -> u64 {
    p["status"]["containerStatuses"].as_array().into_iter().flatten().filter_map(|c| c["restartCount"].as_u64()).sum()
}

/// lb-sim's status (`/status`) as `VIP (NS/SERVICE)` → the nodes in rotation (pure).
pub fn rotation(status: &Value) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for f in status["frontends"].as_array().into_iter().flatten() {
        let key = format!("{} ({})", f["vip"].as_str().unwrap_or("?"), f["service"].as_str().unwrap_or("?"));
        let nodes = f["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["inRotation"].as_bool() == Some(true))
            .filter_map(|b| b["node"].as_str().map(String::from))
            .collect();
        out.insert(key, nodes);
    }
    out
}

/// Reads the lab now. What cannot be read (an agent that does not answer, lb-sim down) shows as
/// such rather than failing the whole read.
pub fn snapshot(st: &LabState, dir: &std::path::Path) -> Result<Snapshot> {
    let mut s = of_api(&ApiAccess::of(st)?);
    of_lab(&mut s, st, dir)?;
    Ok(s)
}

/// [`snapshot`] of a Vagrant lab: the API's part as on namespace labs, the lab's part read on
/// its VMs over SSH (in parallel), the faults from its record.
pub fn snapshot_vagrant(v: &crate::vagrant::VagrantLab) -> Result<Snapshot> {
    let mut s = of_api(&v.api()?);
    let nodes = v.nodes();
    std::thread::scope(|sc| {
        let gateway = sc.spawn(|| {
            v.run("gateway", &["curl", "-sS", "--max-time", "2", &format!("http://{}/status", crate::state::LB_STATUS)])
        });
        let agents: Vec<_> = nodes
            .iter()
            .map(|n| {
                sc.spawn(move || {
                    let ip = crate::vagrant::lab_ip(n).unwrap_or_default();
                    let base = format!("http://{ip}:{}", crate::plan::AGENT_HEALTH_PORT);
                    // The health code on the first line, the metrics after it.
                    let script = format!(
                        "curl -s -o /dev/null -m 2 -w '%{{http_code}}\\n' {base}/healthz; curl -s -m 2 {base}/metrics"
                    );
                    (n.clone(), v.run(n, &["sh", "-c", &script]))
                })
            })
            .collect();
        if let Ok(Ok(Ok(status))) = gateway.join().map(|r| r.map(|b| serde_json::from_str::<Value>(&b))) {
            s.rotation = rotation(&status);
        }
        for a in agents {
            let Ok((node, out)) = a.join() else { continue };
            let out = out.unwrap_or_default();
            let mut lines = out.lines();
            let code = lines.next().unwrap_or("000");
            s.healthz.insert(node.clone(), if code == "000" { "no answer".into() } else { code.to_string() });
            if code == "200" || code == "503" {
                s.repairs.insert(node, repaired_total(&lines.collect::<Vec<_>>().join("\n")));
            }
        }
    });
    for f in crate::fault::list(&v.credentials)? {
        s.faults.insert(format!("{} {}: {}", f.node, f.kind, f.detail));
    }
    Ok(s)
}

/// The rules an agent repaired so far, from its metrics page.
fn repaired_total(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("podpath_node_proxy_rules_repaired_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The API's part of a snapshot: nodes, pods and EndpointSlices listed, then [`of_objects`].
fn of_api(api: &ApiAccess) -> Snapshot {
    let get = |path: &str| -> Vec<Value> {
        match api.get(path) {
            Ok((200, body)) => serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v["items"].as_array().cloned())
                .unwrap_or_default(),
            _ => vec![],
        }
    };
    let (nodes, pods, slices) =
        (get("/api/v1/nodes"), get("/api/v1/pods"), get("/apis/discovery.k8s.io/v1/endpointslices"));
    let mut s = Snapshot::default();
    of_objects(&mut s, &nodes, &pods, &slices);
    s
}

/// The API's part of a snapshot (nodes' readiness, pods, Services' ready endpoints) from the
/// objects themselves (pure): `snapshot` lists them, `podpath ui` has them from its watches.
pub fn of_objects<'a>(
    s: &mut Snapshot,
    nodes: impl IntoIterator<Item = &'a Value>,
    pods: impl IntoIterator<Item = &'a Value>,
    slices: impl IntoIterator<Item = &'a Value>,
) {
    for n in nodes {
        let name = n["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let ready = n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Ready")
            .map(|c| {
                let reason = c["reason"].as_str().unwrap_or_default();
                format!(
                    "{}{}",
                    c["status"].as_str().unwrap_or("?"),
                    if reason.is_empty() { String::new() } else { format!(" ({reason})") }
                )
            })
            .unwrap_or_else(|| "?".into());
        s.nodes.insert(name, ready);
    }
    for p in pods {
        let id = format!(
            "{}/{}",
            p["metadata"]["namespace"].as_str().unwrap_or(""),
            p["metadata"]["name"].as_str().unwrap_or("")
        );
        let phase = p["status"]["phase"].as_str().unwrap_or("Pending");
        let (ready, restarts) = (pod_ready(p), pod_restarts(p));
        let deleting = p["metadata"]["deletionTimestamp"].is_string();
        let mut text = format!("{phase}{}", if ready { ", ready" } else { ", not ready" });
        if restarts > 0 {
            text.push_str(&format!(", {restarts} restarts"));
        }
        if deleting {
            text.push_str(", terminating");
        }
        if let Some(node) = p["spec"]["nodeName"].as_str() {
            text.push_str(&format!(" on {node}"));
        }
        s.pods.insert(id, text);
    }
    for sl in slices {
        let Some(svc) = sl["metadata"]["labels"]["kubernetes.io/service-name"].as_str() else { continue };
        let key = format!("{}/{svc}", sl["metadata"]["namespace"].as_str().unwrap_or(""));
        let entry = s.endpoints.entry(key).or_default();
        for e in sl["endpoints"].as_array().into_iter().flatten() {
            if e["conditions"]["ready"].as_bool() != Some(false) {
                entry.extend(
                    e["addresses"].as_array().into_iter().flatten().filter_map(|a| a.as_str().map(String::from)),
                );
            }
        }
    }
}

/// What only the lab knows, read from its hosts: the load balancer's rotation, the agents'
/// health and repairs, the faults in force.
pub fn of_lab(s: &mut Snapshot, st: &LabState, dir: &std::path::Path) -> Result<()> {
    let plan = Plan::with_family(&st.name, st.nodes, st.ip_family);
    if let Some(gw) = plan.netns_of("gateway") {
        if let Ok(status) = crate::hosts::lb_status_in(gw) {
            s.rotation = rotation(&status);
        }
    }
    for n in &plan.nodes {
        let (Some(ns), Some(addr)) = (plan.netns_of(&n.name), crate::plan::agent_health_addr(&n.name)) else {
            continue;
        };
        let health = match crate::hosts::http_get_in(ns, addr, "/healthz") {
            Ok((code, _)) => code.to_string(),
            Err(_) => "no answer".into(),
        };
        s.healthz.insert(n.name.clone(), health);
        if let Ok((200, body)) = crate::hosts::http_get_in(ns, addr, "/metrics") {
            s.repairs.insert(n.name.clone(), repaired_total(&body));
        }
    }
    for f in crate::fault::list(dir)? {
        s.faults.insert(format!("{} {}: {}", f.node, f.kind, f.detail));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_rotation_is_read_from_lb_sims_status() {
        let status = serde_json::json!({"frontends": [{"vip": "198.51.100.1", "service": "default/web", "backends": [
            {"node": "node-1", "health": "healthy", "inRotation": true},
            {"node": "node-2", "health": "unhealthy", "inRotation": false}]}]});
        assert_eq!(rotation(&status), BTreeMap::from([("198.51.100.1 (default/web)".to_string(), set(&["node-1"]))]));
    }

    #[test]
    fn a_node_failure_reads_as_a_timeline() {
        let mut a = Snapshot::default();
        a.nodes.insert("node-2".into(), "True (KubeletReady)".into());
        a.endpoints.insert("default/web".into(), set(&["10.244.1.3", "10.244.2.3"]));
        a.rotation.insert("198.51.100.1 (default/web)".into(), set(&["node-1", "node-2"]));
        a.healthz.insert("node-2".into(), "200".into());
        a.repairs.insert("node-1".into(), 0);
        let mut b = a.clone();
        b.faults.insert("node-2 link-down: eth0 (the uplink) down".into());
        b.nodes.insert("node-2".into(), "Unknown (NodeStatusUnknown)".into());
        b.endpoints.insert("default/web".into(), set(&["10.244.1.3"]));
        b.rotation.insert("198.51.100.1 (default/web)".into(), set(&["node-1"]));
        b.healthz.insert("node-2".into(), "no answer".into());
        b.repairs.insert("node-1".into(), 1);
        assert_eq!(
            diff(&a, &b),
            [
                "fault made: node-2 link-down: eth0 (the uplink) down",
                "node node-2: Ready True (KubeletReady) → Unknown (NodeStatusUnknown)",
                "node node-2: proxy /healthz 200 → no answer",
                "node node-1: service proxy rules rewritten after a change from outside (1 repairs)",
                "endpoints default/web: -10.244.2.3 (ready: 10.244.1.3)",
                "load balancer 198.51.100.1 (default/web): node-2 withdrawn (in rotation: node-1)",
            ]
        );
        assert!(diff(&b, &b).is_empty());
        let back = diff(&b, &a);
        assert!(
            back.contains(
                &"load balancer 198.51.100.1 (default/web): node-2 in rotation (in rotation: node-1, node-2)"
                    .to_string()
            ),
            "{back:?}"
        );
        assert!(back.contains(&"fault cleared: node-2 link-down: eth0 (the uplink) down".to_string()));
    }
}
