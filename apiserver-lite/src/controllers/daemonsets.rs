//! The DaemonSet controller, as kube-controller-manager's: one pod per eligible node (its
//! template's `nodeSelector` and required node affinity match the node, and its taints are
//! tolerated — with the tolerations the controller adds to every daemon pod), placed through
//! the scheduler by a required node affinity on the node's name, as the real controller does;
//! pods on nodes no longer eligible deleted; a rolling update of a changed template within
//! `maxUnavailable` (`OnDelete`: only pods deleted by hand are replaced); the status
//! `kubectl rollout status` reads, and the Events. [`plan_daemonset`] decides (pure);
//! [`sync_namespace`] reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use api::k8s_openapi::api::core::v1::{Node, Toleration};
use api::Codec;
use api::Kind;
use jiff::Timestamp;
use serde_json::{json, Value};

use super::events::{record, EventType};
use super::revisions;
use super::taints::{taints_of, tolerations_of, untolerated, NO_EXECUTE, NO_SCHEDULE};
use super::workloads::template_hash;
use super::write::{delete_quietly, is_terminating, ns_name, owned_or_collected, ready_since, reporter, write_status};
use crate::error::ApiError;
use crate::registry::{Registry, WriteOptions};

/// The label naming the template revision a daemon pod was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// What a DaemonSet needs done.
#[derive(Debug, Default, PartialEq)]
pub struct DaemonPlan {
    pub create: Vec<Value>,
    pub delete: Vec<String>,
    pub status: Value,
    /// When a pod becomes available (`minReadySeconds`): look again then.
    pub wake_at: Option<Timestamp>,
}

/// The tolerations the controller adds to every daemon pod (a node's condition taints never
/// keep its daemons away).
fn daemon_tolerations() -> Vec<Value> {
    let mut out = vec![];
    for (key, effect) in [
        ("node.kubernetes.io/not-ready", NO_EXECUTE),
        ("node.kubernetes.io/unreachable", NO_EXECUTE),
        ("node.kubernetes.io/disk-pressure", NO_SCHEDULE),
        ("node.kubernetes.io/memory-pressure", NO_SCHEDULE),
        ("node.kubernetes.io/pid-pressure", NO_SCHEDULE),
        ("node.kubernetes.io/unschedulable", NO_SCHEDULE),
    ] {
        out.push(json!({"key": key, "operator": "Exists", "effect": effect}));
    }
    out
}

fn is_ready(p: &Value) -> bool {
    p.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

/// The node a daemon pod is for: its node, or the name its affinity requires.
fn target_node(p: &Value) -> Option<String> {
    if let Some(n) = p.pointer("/spec/nodeName").and_then(Value::as_str).filter(|n| !n.is_empty()) {
        return Some(n.to_string());
    }
    let terms =
        p.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")?;
    terms.as_array()?.iter().find_map(|t| {
        t["matchFields"].as_array()?.iter().find_map(|f| {
            (f["key"] == "metadata.name" && f["operator"] == "In").then(|| f["values"][0].as_str().map(String::from))?
        })
    })
}

/// Whether a daemon pod of `template` belongs on `node`.
fn eligible(template: &Value, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let selector_ok = template["spec"]["nodeSelector"]
        .as_object()
        .is_none_or(|sel| sel.iter().all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str()));
    let mut pod = json!({"spec": template["spec"].clone()});
    let mut tolerations = pod["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
    tolerations.extend(daemon_tolerations());
    pod["spec"]["tolerations"] = json!(tolerations);
    let tolerations: Vec<Toleration> = tolerations_of(&pod);
    selector_ok && untolerated(taints_of(node), &tolerations, &[NO_SCHEDULE, NO_EXECUTE]).is_none()
}

/// The daemon pod of `ds` for `node`.
pub fn pod_for(ds: &Value, node: &str, revision: &str) -> Value {
    let name = ds["metadata"]["name"].as_str().unwrap_or("");
    let template = &ds["spec"]["template"];
    let mut meta = template["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    if let Some(m) = meta.as_object_mut() {
        m.remove("name");
        m.remove("creationTimestamp");
    }
    meta["generateName"] = json!(format!("{name}-"));
    meta["labels"][REVISION_LABEL] = json!(revision);
    meta["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": ds["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    }]);
    let mut spec = template["spec"].clone();
    spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    });
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for t in daemon_tolerations() {
        if !tolerations.contains(&t) {
            tolerations.push(t);
        }
    }
    spec["tolerations"] = json!(tolerations);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// `maxUnavailable` as a count of `desired` (an int, or a percentage rounded up, at least 1).
fn max_unavailable(ds: &Value, desired: usize) -> usize {
    match &ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] {
        Value::Number(n) => n.as_u64().unwrap_or(1) as usize,
        Value::String(s) => match s.strip_suffix('%').and_then(|p| p.parse::<usize>().ok()) {
            Some(p) => (desired * p).div_ceil(100),
            None => 1,
        },
        _ => 1,
    }
    .max(1)
}

/// `maxSurge` as a count of `desired` (an int, or a percentage rounded up); 0 by default.
fn max_surge(ds: &Value, desired: usize) -> usize {
    match &ds["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] {
        Value::Number(n) => n.as_u64().unwrap_or(0) as usize,
        Value::String(s) => {
            s.strip_suffix('%').and_then(|p| p.parse::<usize>().ok()).map_or(0, |p| (desired * p).div_ceil(100))
        }
        _ => 0,
    }
}

/// What DaemonSet `ds` needs done, given its pods, the nodes and the time. Pure.
pub fn plan_daemonset(ds: &Value, pods: &[&Value], nodes: &[Node], now: Timestamp) -> DaemonPlan {
    let template = &ds["spec"]["template"];
    let revision = template_hash(template);
    let mut plan = DaemonPlan::default();
    let wanted: BTreeSet<String> =
        nodes.iter().filter(|n| eligible(template, n)).filter_map(|n| n.metadata.name.clone()).collect();
    let mut by_node: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    let mut terminating_on: BTreeSet<String> = BTreeSet::new();
    for p in pods {
        let Some(node) = target_node(p) else { continue };
        if is_terminating(p) {
            terminating_on.insert(node);
        } else if !matches!(p.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed")) {
            by_node.entry(node).or_default().push(p);
        } else {
            // A daemon pod that ended is replaced, as the real controller does.
            plan.delete.push(ns_name(p).1);
        }
    }
    let current = |p: &Value| p["metadata"]["labels"][REVISION_LABEL].as_str() == Some(revision.as_str());
    // Available: ready for `minReadySeconds`; a pod that will be is looked at again then.
    let min_ready = jiff::SignedDuration::from_secs(ds["spec"]["minReadySeconds"].as_i64().unwrap_or(0).max(0));
    let mut wake: Option<Timestamp> = None;
    let mut available = |p: &Value| match ready_since(p).filter(|_| is_ready(p)) {
        Some(since) if since + min_ready <= now => true,
        Some(since) => {
            let at = since + min_ready;
            wake = Some(wake.map_or(at, |w: Timestamp| w.min(at)));
            false
        }
        // Ready without a transition time: available once ready.
        None => is_ready(p) && min_ready.is_zero(),
    };
    let on_delete = ds["spec"]["updateStrategy"]["type"] == "OnDelete";
    let surge = if on_delete { 0 } else { max_surge(ds, wanted.len()) };
    let by_age = |sorted: &mut Vec<&Value>| {
        sorted.sort_by_key(|p| (!current(p), p["metadata"]["creationTimestamp"].as_str().unwrap_or("").to_string()));
    };
    let mut misscheduled = 0;
    // The pod that stands for each wanted node (its current one if there is one).
    let mut kept: Vec<(&String, &Value)> = vec![];
    let mut surging = 0;
    let mut old_only: Vec<(&String, &Value)> = vec![];
    for (node, list) in &by_node {
        if !wanted.contains(node) {
            misscheduled += 1;
            plan.delete.extend(list.iter().map(|p| ns_name(p).1));
            continue;
        }
        let mut sorted = list.clone();
        by_age(&mut sorted);
        let (new, old): (Vec<&Value>, Vec<&Value>) = sorted.iter().partition(|p| current(p));
        if surge > 0 && !new.is_empty() && !old.is_empty() {
            // Surging on this node: the old pod goes once the new one is available.
            plan.delete.extend(new.iter().skip(1).map(|p| ns_name(p).1));
            if available(new[0]) {
                plan.delete.extend(old.iter().map(|p| ns_name(p).1));
            } else {
                surging += 1;
            }
            kept.push((node, new[0]));
            continue;
        }
        // One pod per node: the newest of the current revision, or the oldest.
        plan.delete.extend(sorted.iter().skip(1).map(|p| ns_name(p).1));
        kept.push((node, sorted[0]));
        if !current(sorted[0]) {
            old_only.push((node, sorted[0]));
        }
    }
    for node in &wanted {
        if !by_node.contains_key(node) && !terminating_on.contains(node) {
            plan.create.push(pod_for(ds, node, &revision));
        }
    }
    let avail: BTreeSet<String> = kept.iter().filter(|(_, p)| available(p)).map(|(_, p)| ns_name(p).1).collect();
    // The rolling update of the nodes whose pod is of an old template, not-ready ones first.
    old_only.sort_by_key(|(n, p)| (avail.contains(&ns_name(p).1), (*n).clone()));
    if surge > 0 {
        // maxSurge: a new pod beside the old one (up to maxSurge nodes at a time; a node whose
        // old pod is not available gets its new one at once).
        let mut budget = surge.saturating_sub(surging);
        for (node, p) in old_only {
            if !avail.contains(&ns_name(p).1) {
                plan.create.push(pod_for(ds, node, &revision));
            } else if budget > 0 {
                budget -= 1;
                plan.create.push(pod_for(ds, node, &revision));
            }
        }
    } else if !on_delete {
        // maxUnavailable: old pods go while no more than that many wanted nodes lack an
        // available pod.
        let unavailable = wanted.len() - avail.len();
        let mut budget = max_unavailable(ds, wanted.len()).saturating_sub(unavailable);
        for (_, p) in old_only {
            if !avail.contains(&ns_name(p).1) {
                plan.delete.push(ns_name(p).1);
            } else if budget > 0 {
                budget -= 1;
                plan.delete.push(ns_name(p).1);
            }
        }
    }
    let ready = kept.iter().filter(|(_, p)| is_ready(p)).count();
    let updated = kept.iter().filter(|(_, p)| current(p)).count();
    plan.status = json!({
        "desiredNumberScheduled": wanted.len(),
        "currentNumberScheduled": kept.len(),
        "numberMisscheduled": misscheduled,
        "numberReady": ready,
        "updatedNumberScheduled": updated,
        "numberAvailable": avail.len(),
        "numberUnavailable": wanted.len() - avail.len(),
        "observedGeneration": ds["metadata"]["generation"].as_i64().unwrap_or(1),
    });
    if avail.len() == wanted.len() {
        plan.status.as_object_mut().map(|s| s.remove("numberUnavailable"));
    }
    if avail.is_empty() {
        plan.status.as_object_mut().map(|s| s.remove("numberAvailable"));
    }
    plan.delete.sort();
    plan.delete.dedup();
    plan.wake_at = wake;
    plan
}

/// Brings the DaemonSets of namespace `ns` one step closer to a ready pod per eligible node.
/// Returns when one of them must be looked at again (a pod becoming available), if sooner
/// than the next event.
pub async fn sync_namespace(reg: &Registry, ns: &str) -> Result<Option<Timestamp>, ApiError> {
    let (sets, _) = reg.store.list(Kind::DaemonSet, Some(ns))?;
    let (pods, _) = reg.store.list(Kind::Pod, Some(ns))?;
    let owned = owned_or_collected(reg, Kind::Pod, ns, &pods, "DaemonSet", &sets).await?;
    let (revisions, _) = reg.store.list(Kind::ControllerRevision, Some(ns))?;
    owned_or_collected(reg, Kind::ControllerRevision, ns, &revisions, "DaemonSet", &sets).await?;
    if sets.is_empty() {
        return Ok(None);
    }
    let now = Timestamp::now();
    let mut wake: Option<Timestamp> = None;
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let nodes: Vec<Node> = nodes.into_iter().filter_map(|n| Node::from_json(n).ok()).collect();
    for ds in sets.iter().filter(|d| !is_terminating(d)) {
        let uid = ds["metadata"]["uid"].as_str().unwrap_or("");
        let mine = owned.get(uid).cloned().unwrap_or_default();
        let plan = plan_daemonset(ds, &mine, &nodes, now);
        let set = ns_name(ds).1;
        let hash = template_hash(&ds["spec"]["template"]);
        let in_use: BTreeSet<String> = mine
            .iter()
            .filter_map(|p| p["metadata"]["labels"][REVISION_LABEL].as_str().map(|h| format!("{set}-{h}")))
            .collect();
        revisions::sync(reg, ds, "DaemonSet", &format!("{set}-{hash}"), &hash, &revisions, &in_use).await?;
        if let Some(w) = plan.wake_at {
            wake = Some(wake.map_or(w, |x| x.min(w)));
        }
        let report = reporter("daemonset-controller", Kind::DaemonSet, ds);
        for pod in plan.create {
            match reg.create(Kind::Pod, Some(ns), pod, &WriteOptions::default()).await {
                Ok(created) => {
                    let name = ns_name(&created.object).1;
                    record(reg, report(EventType::Normal, "SuccessfulCreate", format!("Created pod: {name}"))).await;
                }
                Err(e) => record(reg, report(EventType::Warning, "FailedCreate", format!("Error creating: {e}"))).await,
            }
        }
        for name in &plan.delete {
            delete_quietly(reg, Kind::Pod, ns, name).await?;
            record(reg, report(EventType::Normal, "SuccessfulDelete", format!("Deleted pod: {name}"))).await;
        }
        write_status(reg, Kind::DaemonSet, ds, plan.status).await?;
    }
    Ok(wake)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-11-26T12:10:00Z".parse().unwrap()
    }

    fn node(name: &str, labels: Value, taints: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap()
    }

    fn ds(template_spec: Value) -> Value {
        json!({"metadata": {"namespace": "kube-system", "name": "agent", "uid": "d1", "generation": 2},
               "spec": {"selector": {"matchLabels": {"app": "agent"}},
                        "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                        "template": {"metadata": {"labels": {"app": "agent"}}, "spec": template_spec}}})
    }

    fn pod_on(name: &str, node: &str, revision: &str, ready: bool) -> Value {
        json!({"metadata": {"namespace": "kube-system", "name": name, "labels": {REVISION_LABEL: revision},
                            "creationTimestamp": "2026-11-26T12:00:00Z"},
               "spec": {"nodeName": node},
               "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    #[test]
    fn one_pod_per_eligible_node_through_a_node_affinity() {
        let nodes = [
            node("node-1", json!({"role": "edge"}), json!([])),
            node("node-2", json!({"role": "edge"}), json!([{"key": "gpu", "effect": "NoSchedule"}])),
            node("node-3", json!({}), json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}])),
        ];
        let d = ds(json!({"containers": [{"name": "c", "image": "busybox"}]}));
        let plan = plan_daemonset(&d, &[], &nodes, now());
        // node-2's taint is not tolerated; node-3's condition taint is (daemons tolerate it).
        let targets: Vec<String> = plan.create.iter().filter_map(target_node).collect();
        assert_eq!(targets, ["node-1", "node-3"]);
        let p = &plan.create[0];
        assert_eq!(p["metadata"]["generateName"], "agent-");
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
        assert!(p["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/unreachable"));
        assert_eq!(plan.status["desiredNumberScheduled"], 2);
        // A node selector narrows it; a pod on a node no longer eligible goes.
        let picky = ds(json!({"nodeSelector": {"role": "edge"}, "containers": [{"name": "c", "image": "busybox"}]}));
        let rev = template_hash(&picky["spec"]["template"]);
        let stray = pod_on("agent-x", "node-3", &rev, true);
        let plan = plan_daemonset(&picky, &[&stray], &nodes, now());
        assert_eq!(plan.delete, ["agent-x"]);
        assert_eq!(plan.status["numberMisscheduled"], 1);
        assert_eq!(plan.create.iter().filter_map(target_node).collect::<Vec<_>>(), ["node-1"]);
    }

    #[test]
    fn a_changed_template_rolls_within_max_unavailable() {
        let nodes = [
            node("node-1", json!({}), json!([])),
            node("node-2", json!({}), json!([])),
            node("node-3", json!({}), json!([])),
        ];
        let d = ds(json!({"containers": [{"name": "c", "image": "busybox:2"}]}));
        let rev = template_hash(&d["spec"]["template"]);
        let (a, b, c) = (
            pod_on("a", "node-1", "old", true),
            pod_on("b", "node-2", "old", true),
            pod_on("c", "node-3", "old", true),
        );
        let plan = plan_daemonset(&d, &[&a, &b, &c], &nodes, now());
        assert_eq!(plan.delete.len(), 1, "one at a time: {:?}", plan.delete);
        assert!(plan.create.is_empty());
        assert_eq!(
            (plan.status["updatedNumberScheduled"].as_i64(), plan.status["numberReady"].as_i64()),
            (Some(0), Some(3))
        );
        // node-1's replaced pod is not ready yet: nothing more goes.
        let a2 = pod_on("a2", "node-1", &rev, false);
        let plan = plan_daemonset(&d, &[&a2, &b, &c], &nodes, now());
        assert!(plan.delete.is_empty());
        assert_eq!(plan.status["updatedNumberScheduled"], 1);
        // OnDelete: nothing is replaced by the controller.
        let mut od = d.clone();
        od["spec"]["updateStrategy"] = json!({"type": "OnDelete"});
        assert!(plan_daemonset(&od, &[&a, &b, &c], &nodes, now()).delete.is_empty());
        assert_eq!(
            max_unavailable(&json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxUnavailable": "50%"}}}}), 3),
            2
        );
    }

    #[test]
    fn max_surge_starts_the_new_pod_beside_the_old_and_min_ready_seconds_counts() {
        let nodes = [node("node-1", json!({}), json!([])), node("node-2", json!({}), json!([]))];
        let mut d = ds(json!({"containers": [{"name": "c", "image": "busybox:2"}]}));
        d["spec"]["updateStrategy"]["rollingUpdate"] = json!({"maxSurge": 1, "maxUnavailable": 0});
        d["spec"]["minReadySeconds"] = json!(30);
        let rev = template_hash(&d["spec"]["template"]);
        let ready_at = |mut p: Value, at: &str| {
            p["status"]["conditions"][0]["lastTransitionTime"] = json!(at);
            p
        };
        let a = ready_at(pod_on("a", "node-1", "old", true), "2026-11-26T12:00:00Z");
        let b = ready_at(pod_on("b", "node-2", "old", true), "2026-11-26T12:00:00Z");
        let plan = plan_daemonset(&d, &[&a, &b], &nodes, now());
        assert!(plan.delete.is_empty(), "nothing goes before its successor is available");
        assert_eq!(plan.create.iter().filter_map(target_node).collect::<Vec<_>>(), ["node-1"], "one node surges");
        // node-1's new pod ready 10 s ago: not available for 20 s more; nothing changes, a wake-up.
        let a2 = ready_at(pod_on("a2", "node-1", &rev, true), "2026-11-26T12:09:50Z");
        let plan = plan_daemonset(&d, &[&a, &a2, &b], &nodes, now());
        assert!(plan.delete.is_empty() && plan.create.is_empty(), "{plan:?}");
        assert_eq!(plan.wake_at, Some("2026-11-26T12:10:20Z".parse().unwrap()));
        assert_eq!(plan.status["numberAvailable"], 1);
        // 30 s after: available; the old pod on node-1 goes and node-2 surges.
        let later: Timestamp = "2026-11-26T12:10:21Z".parse().unwrap();
        let plan = plan_daemonset(&d, &[&a, &a2, &b], &nodes, later);
        assert_eq!(plan.delete, ["a"]);
        assert_eq!(plan.create.iter().filter_map(target_node).collect::<Vec<_>>(), ["node-2"]);
        assert_eq!(max_surge(&json!({"spec": {"updateStrategy": {"rollingUpdate": {"maxSurge": "10%"}}}}), 3), 1);
    }
}
