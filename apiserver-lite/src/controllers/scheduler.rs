//! The scheduler: binds each pod without a node to a Ready, schedulable node that its
//! `nodeSelector` and tolerations fit — the one with the fewest pods of the same controller
//! (spreading replicas, as kube-scheduler's default topology spread does), then the fewest
//! pods — or marks it Unschedulable with kube-scheduler's reason.
//! The decision is pure ([`plan_schedule`]: pods and nodes in, bindings out); `schedule`
//! reads and writes.

use std::collections::BTreeMap;

use api::k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use api::kinds::node::node_ready_status;
use api::Codec;
use api::Kind;
use serde_json::{json, Value};

use super::events::{record, EventType, Report};
use super::taints::{
    taints_of, tolerates, tolerations_of, untolerated, untolerated_reason, NO_EXECUTE, NO_SCHEDULE, UNSCHEDULABLE_TAINT,
};
use super::write::{new_time, ns_name, set_condition};
use crate::error::ApiError;
use crate::registry::Registry;

/// What the scheduler decided for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Bind(String),
    /// The pod goes to this node once the volumes of these claims (WaitForFirstConsumer,
    /// unbound) are made there: the claims get the node as `selected-node`, the pod waits.
    SelectNode(String, Vec<String>),
    /// No node fits; kube-scheduler's message.
    Unschedulable(String),
}

/// One pending pod's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub namespace: String,
    pub name: String,
    pub decision: Decision,
}

/// A pod's `nodeSelector` fits a node when the node carries every label with the same value.
fn node_selector_matches(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Why a node does not take a pod, in kube-scheduler's words (the first filter that fails).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Unfit {
    NotReady,
    Cordoned,
    Taint(String),
    Selector,
    /// NodeResourcesFit: each resource short (`Insufficient cpu`, `Too many pods`).
    Resources(Vec<String>),
    /// VolumeBinding: a bound volume's node affinity excludes the node.
    VolumeAffinity,
    /// VolumeBinding: a claim waits for its volume on another node.
    VolumeElsewhere,
}

impl Unfit {
    fn reason(&self) -> String {
        match self {
            Unfit::NotReady => "node(s) were not ready".into(),
            Unfit::Cordoned => "node(s) were unschedulable".into(),
            Unfit::Taint(r) => r.clone(),
            Unfit::Selector => "node(s) didn't match Pod's node affinity/selector".into(),
            Unfit::Resources(r) => r.join(", "),
            Unfit::VolumeAffinity => "node(s) had volume node affinity conflict".into(),
            Unfit::VolumeElsewhere => "node(s) didn't find available persistent volumes to bind".into(),
        }
    }

    /// The reasons as kube-scheduler counts them (one per short resource).
    fn reasons(&self) -> Vec<String> {
        match self {
            Unfit::Resources(r) => r.clone(),
            u => vec![u.reason()],
        }
    }
}

/// The scheduler's message as kube-scheduler builds it: a count per reason, the reasons sorted
/// as strings, then the preemption verdict (preemption never helps here: no priorities).
fn unschedulable_message(total: usize, unfit: &[Unfit]) -> String {
    if total == 0 {
        return "no nodes available to schedule pods".into();
    }
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for u in unfit {
        for r in u.reasons() {
            *counts.entry(r).or_default() += 1;
        }
    }
    let mut reasons: Vec<String> = counts.into_iter().map(|(r, n)| format!("{n} {r}")).collect();
    reasons.sort();
    // Preemption could free resources (but finds no pod of lower priority: there are none);
    // it cannot fix a taint or a selector.
    let victims = unfit.iter().filter(|u| matches!(u, Unfit::Resources(_))).count();
    let mut preemption = vec![];
    if victims > 0 {
        preemption.push(format!("{victims} No preemption victims found for incoming pod"));
    }
    if total - victims > 0 {
        preemption.push(format!("{} Preemption is not helpful for scheduling", total - victims));
    }
    format!(
        "0/{total} nodes are available: {}. preemption: 0/{total} nodes are available: {}.",
        reasons.join(", "),
        preemption.join(", ")
    )
}

fn bound_node(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("")
}

/// Whether `node` takes `pod`, filters in kube-scheduler's order: readiness, cordon (unless the
/// pod tolerates the unschedulable taint), NoSchedule/NoExecute taints, `nodeSelector`.
fn fit(pod: &Value, node: &Node, tolerations: &[Toleration]) -> Result<(), Unfit> {
    if node_ready_status(node) != "Ready" {
        return Err(Unfit::NotReady);
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
        let cordon = Taint { key: UNSCHEDULABLE_TAINT.into(), effect: NO_SCHEDULE.into(), ..Default::default() };
        if !tolerations.iter().any(|t| tolerates(t, &cordon)) {
            return Err(Unfit::Cordoned);
        }
    }
    if let Some(t) = untolerated(taints_of(node), tolerations, &[NO_SCHEDULE, NO_EXECUTE]) {
        return Err(Unfit::Taint(untolerated_reason(t)));
    }
    let selector: BTreeMap<String, String> =
        serde_json::from_value(pod.pointer("/spec/nodeSelector").cloned().unwrap_or(Value::Null)).unwrap_or_default();
    let labels = node.metadata.labels.clone().unwrap_or_default();
    if !node_selector_matches(&selector, &labels) || !required_affinity_matches(pod, node) {
        return Err(Unfit::Selector);
    }
    Ok(())
}

/// The pod's required node affinity (`requiredDuringSchedulingIgnoredDuringExecution`): some
/// term whose every expression (on the node's labels) and field (`metadata.name`) holds. No
/// affinity: any node.
fn required_affinity_matches(pod: &Value, node: &Node) -> bool {
    match pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms") {
        Some(terms) => node_terms_match(terms, node),
        None => true,
    }
}

/// Whether some of the `nodeSelectorTerms` holds on `node`: every expression (on its labels)
/// and field (`metadata.name`) of the term. Not a list: none holds.
pub(crate) fn node_terms_match(terms: &Value, node: &Node) -> bool {
    let Some(terms) = terms.as_array() else {
        return false;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.clone().unwrap_or_default();
    let holds = |r: &Value, value: Option<&str>| {
        let values: Vec<&str> = r["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let num = |v: Option<&str>| v.and_then(|v| v.parse::<i64>().ok());
        match r["operator"].as_str().unwrap_or("") {
            "In" => value.is_some_and(|v| values.contains(&v)),
            "NotIn" => !value.is_some_and(|v| values.contains(&v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            "Gt" => matches!((num(value), num(values.first().copied())), (Some(a), Some(b)) if a > b),
            "Lt" => matches!((num(value), num(values.first().copied())), (Some(a), Some(b)) if a < b),
            _ => false,
        }
    };
    terms.iter().any(|t| {
        let exprs = t["matchExpressions"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        let fields = t["matchFields"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        (!exprs.is_empty() || !fields.is_empty())
            && exprs.iter().all(|r| holds(r, r["key"].as_str().and_then(|k| labels.get(k)).map(String::as_str)))
            && fields.iter().all(|r| holds(r, (r["key"] == "metadata.name").then_some(name.as_str())))
    })
}

/// NodeResourcesFit: whether the node's allocatable holds the pod's requests beside what its
/// pods already request (and one more pod); the short resources in kube-scheduler's words.
fn resources_fit(
    requests: &BTreeMap<String, i128>,
    used: Option<&BTreeMap<String, i128>>,
    pods_on_node: usize,
    node: &Node,
) -> Result<(), Unfit> {
    let alloc = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let mut short = vec![];
    let have = |res: &str| alloc.and_then(|a| a.get(res)).and_then(|q| api::quantity::milli(&q.0));
    if let Some(max_pods) = have("pods") {
        if (pods_on_node as i128 + 1) * 1000 > max_pods {
            short.push("Too many pods".to_string());
        }
    }
    for (res, want) in requests.iter().filter(|(_, w)| **w > 0) {
        let in_use = used.and_then(|u| u.get(res)).copied().unwrap_or(0);
        if have(res).is_none_or(|cap| in_use + want > cap) {
            short.push(format!("Insufficient {res}"));
        }
    }
    if short.is_empty() {
        Ok(())
    } else {
        Err(Unfit::Resources(short))
    }
}

/// The zone label the scheduler spreads replicas over (after nodes).
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Whether a placed pod counts on its node: not being deleted (a terminating pod is on its way
/// out, as kube-scheduler's snapshot treats it for spreading) and not finished.
fn counts(p: &Value) -> bool {
    p["metadata"].get("deletionTimestamp").is_none()
        && !matches!(p.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"))
}

/// The group a pod is spread with: the pods of its controller (a ReplicaSet's, a
/// StatefulSet's …), as kube-scheduler's default topology spreading groups the pods a
/// controller selects. None for a pod without a controller.
fn spread_group(p: &Value) -> Option<String> {
    let owners = p.pointer("/metadata/ownerReferences")?.as_array()?;
    let owner = owners.iter().find(|o| o["controller"] == true)?;
    let (ns, _) = ns_name(p);
    Some(format!("{ns}/{}", owner["uid"].as_str().or(owner["name"].as_str())?))
}

/// Decisions for every pod (of `pods`) that has no node and is not being deleted, in order:
/// of the nodes that take it, the one with the fewest pods of its spread group, then the one
/// whose zone has the fewest of them, then the fewest pods (counting the pods placed before it; terminating and finished pods do not
/// count). Pure.
pub fn plan_schedule(pods: &[Value], nodes: &[Node]) -> Vec<Binding> {
    plan_schedule_with(pods, nodes, &Claims::default())
}

/// What the scheduler knows of claims and volumes (its VolumeBinding plugin).
#[derive(Debug, Default)]
pub struct Claims {
    /// `namespace/name` → the claim.
    pub claims: BTreeMap<String, Value>,
    /// Volume name → the volume.
    pub volumes: BTreeMap<String, Value>,
    /// The StorageClasses that delay binding (`WaitForFirstConsumer`).
    pub delayed_classes: std::collections::BTreeSet<String>,
}

/// What a pod's claims ask of its node.
enum ClaimNeeds {
    /// The pod cannot be placed at all (kube-scheduler's PreFilter failures).
    Blocked(String),
    Fits {
        /// The bound volumes' `nodeSelectorTerms`.
        affinities: Vec<Value>,
        /// Unbound delayed claims: name, and the node already chosen for it.
        delayed: Vec<(String, Option<String>)>,
    },
}

fn claim_needs(pod: &Value, c: &Claims) -> ClaimNeeds {
    let (ns, _) = ns_name(pod);
    let mut affinities = vec![];
    let mut delayed = vec![];
    let mut immediate_unbound = false;
    for v in pod.pointer("/spec/volumes").and_then(Value::as_array).into_iter().flatten() {
        let Some(name) = v["persistentVolumeClaim"]["claimName"].as_str() else { continue };
        let Some(claim) = c.claims.get(&format!("{ns}/{name}")) else {
            return ClaimNeeds::Blocked(format!("persistentvolumeclaim \"{name}\" not found"));
        };
        if claim["metadata"].get("deletionTimestamp").is_some() {
            return ClaimNeeds::Blocked(format!("persistentvolumeclaim \"{name}\" is being deleted"));
        }
        let volume = claim["spec"]["volumeName"].as_str().filter(|v| !v.is_empty());
        match volume.and_then(|v| c.volumes.get(v)) {
            Some(pv) if claim.pointer("/status/phase").and_then(Value::as_str) == Some("Bound") => {
                if let Some(terms) = pv.pointer("/spec/nodeAffinity/required/nodeSelectorTerms") {
                    affinities.push(terms.clone());
                }
            }
            _ => {
                let class = claim["spec"]["storageClassName"].as_str().unwrap_or("");
                if c.delayed_classes.contains(class) {
                    let selected = claim
                        .pointer(&format!(
                            "/metadata/annotations/{}",
                            api::kinds::persistentvolumeclaim::SELECTED_NODE_ANNOTATION.replace('/', "~1")
                        ))
                        .and_then(Value::as_str)
                        .map(String::from);
                    delayed.push((name.to_string(), selected));
                } else {
                    immediate_unbound = true;
                }
            }
        }
    }
    if immediate_unbound {
        return ClaimNeeds::Blocked("pod has unbound immediate PersistentVolumeClaims".into());
    }
    ClaimNeeds::Fits { affinities, delayed }
}

/// [`plan_schedule`] with the claims and volumes the pods use. Pure.
pub fn plan_schedule_with(pods: &[Value], nodes: &[Node], claims: &Claims) -> Vec<Binding> {
    let pending: Vec<&Value> = pods
        .iter()
        .filter(|p| bound_node(p).is_empty())
        .filter(|p| p["metadata"].get("deletionTimestamp").is_none())
        .collect();
    if pending.is_empty() {
        return vec![];
    }
    // Pods on each node, in all and per spread group; per spread group in each zone.
    let zone_of: BTreeMap<String, String> = nodes
        .iter()
        .filter_map(|n| {
            let zone = n.metadata.labels.as_ref()?.get(ZONE_LABEL)?.clone();
            Some((n.metadata.name.clone()?, zone))
        })
        .collect();
    let mut load: BTreeMap<String, usize> = BTreeMap::new();
    let mut group_load: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut zone_load: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut used: BTreeMap<String, BTreeMap<String, i128>> = BTreeMap::new();
    for p in pods.iter().filter(|p| !bound_node(p).is_empty() && counts(p)) {
        *load.entry(bound_node(p).to_string()).or_default() += 1;
        let u = used.entry(bound_node(p).to_string()).or_default();
        for (k, v) in api::quantity::pod_requests(p) {
            *u.entry(k).or_default() += v;
        }
        if let Some(g) = spread_group(p) {
            if let Some(z) = zone_of.get(bound_node(p)) {
                *zone_load.entry((g.clone(), z.clone())).or_default() += 1;
            }
            *group_load.entry((g, bound_node(p).to_string())).or_default() += 1;
        }
    }
    let mut out = Vec::new();
    for p in pending {
        let (namespace, name) = ns_name(p);
        let tolerations = tolerations_of(p);
        let group = spread_group(p);
        let requests = api::quantity::pod_requests(p);
        let (affinities, delayed) = match claim_needs(p, claims) {
            ClaimNeeds::Blocked(why) => {
                let total = nodes.len();
                let message = format!(
                    "0/{total} nodes are available: {why}. preemption: 0/{total} nodes are available: {total} Preemption is not helpful for scheduling."
                );
                out.push(Binding { namespace, name, decision: Decision::Unschedulable(message) });
                continue;
            }
            ClaimNeeds::Fits { affinities, delayed } => (affinities, delayed),
        };
        let mut unfit = Vec::new();
        let mut best: Option<(usize, usize, usize, String)> = None;
        for node in nodes {
            let node_name = node.metadata.name.clone().unwrap_or_default();
            let fits = fit(p, node, &tolerations)
                .and_then(|()| {
                    resources_fit(&requests, used.get(&node_name), load.get(&node_name).copied().unwrap_or(0), node)
                })
                .and_then(|()| {
                    if !affinities.iter().all(|t| node_terms_match(t, node)) {
                        Err(Unfit::VolumeAffinity)
                    } else if delayed.iter().any(|(_, sel)| sel.as_ref().is_some_and(|s| *s != node_name)) {
                        Err(Unfit::VolumeElsewhere)
                    } else {
                        Ok(())
                    }
                });
            match fits {
                Ok(()) => {
                    let same = group
                        .as_ref()
                        .and_then(|g| group_load.get(&(g.clone(), node_name.clone())))
                        .copied()
                        .unwrap_or(0);
                    let in_zone = match (&group, zone_of.get(&node_name)) {
                        (Some(g), Some(z)) => zone_load.get(&(g.clone(), z.clone())).copied().unwrap_or(0),
                        _ => 0,
                    };
                    let candidate = (same, in_zone, load.get(&node_name).copied().unwrap_or(0), node_name);
                    if best.as_ref().is_none_or(|b| candidate < *b) {
                        best = Some(candidate);
                    }
                }
                Err(u) => unfit.push(u),
            }
        }
        let decision = match best {
            Some((_, _, _, node)) => {
                *load.entry(node.clone()).or_default() += 1;
                let u = used.entry(node.clone()).or_default();
                for (k, v) in &requests {
                    *u.entry(k.clone()).or_default() += v;
                }
                if let Some(g) = &group {
                    *group_load.entry((g.clone(), node.clone())).or_default() += 1;
                    if let Some(z) = zone_of.get(&node) {
                        *zone_load.entry((g.clone(), z.clone())).or_default() += 1;
                    }
                }
                // Claims whose volume is yet to be made there: choose the node for them first.
                let to_select: Vec<String> =
                    delayed.iter().filter(|(_, sel)| sel.is_none()).map(|(c, _)| c.clone()).collect();
                if delayed.is_empty() {
                    Decision::Bind(node)
                } else {
                    Decision::SelectNode(node, to_select)
                }
            }
            None => Decision::Unschedulable(unschedulable_message(nodes.len(), &unfit)),
        };
        out.push(Binding { namespace, name, decision });
    }
    out
}

/// Binds pending pods (or marks them Unschedulable), each in its own write; a pod bound
/// meanwhile is left as it is.
pub(crate) async fn schedule(reg: &Registry) -> Result<(), ApiError> {
    let (pods, _) = reg.store.list(Kind::Pod, None)?;
    if pods.iter().all(|p| !bound_node(p).is_empty()) {
        return Ok(());
    }
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let nodes: Vec<Node> = nodes.into_iter().map(Node::from_json).collect::<Result<_, _>>()?;
    let claims = claims_of(reg)?;
    for b in plan_schedule_with(&pods, &nodes, &claims) {
        if let Decision::SelectNode(node, names) = &b.decision {
            select_node(reg, &b.namespace, node, names).await?;
            continue;
        }
        let g = reg.store.lock().await;
        let Some(old) = reg.store.get(Kind::Pod, &b.namespace, &b.name)? else { continue };
        if !bound_node(&old).is_empty() {
            continue;
        }
        let mut new = old.clone();
        let (condition, event) = match b.decision {
            Decision::Bind(node) => {
                let message = format!("Successfully assigned {}/{} to {node}", b.namespace, b.name);
                new["spec"]["nodeName"] = json!(node);
                (
                    json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": new_time()}),
                    (EventType::Normal, "Scheduled", message),
                )
            }
            Decision::SelectNode(..) => continue,
            Decision::Unschedulable(message) => (
                json!({
                    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                    "message": message, "lastTransitionTime": new_time(),
                }),
                (EventType::Warning, "FailedScheduling", message),
            ),
        };
        set_condition(&mut new, condition);
        if new == old {
            continue;
        }
        let pending = reg.put_raw(&g, Kind::Pod, Some(old), new)?;
        drop(g);
        let pod = reg.sync(pending).await?;
        let (type_, reason, message) = event;
        record(
            reg,
            Report {
                component: "default-scheduler",
                host: None,
                object: &pod,
                kind: Kind::Pod,
                field_path: None,
                type_,
                reason,
                message,
            },
        )
        .await;
    }
    Ok(())
}

/// The claims, volumes and delaying classes, for the VolumeBinding filter.
fn claims_of(reg: &Registry) -> Result<Claims, ApiError> {
    let (claims, _) = reg.store.list(Kind::PersistentVolumeClaim, None)?;
    if claims.is_empty() {
        return Ok(Claims::default());
    }
    let (volumes, _) = reg.store.list(Kind::PersistentVolume, None)?;
    let (classes, _) = reg.store.list(Kind::StorageClass, None)?;
    Ok(Claims {
        claims: claims.into_iter().map(|c| (format!("{}/{}", ns_name(&c).0, ns_name(&c).1), c)).collect(),
        volumes: volumes.into_iter().map(|v| (ns_name(&v).1, v)).collect(),
        delayed_classes: classes
            .iter()
            .filter(|c| c["volumeBindingMode"] == "WaitForFirstConsumer")
            .filter_map(|c| c["metadata"]["name"].as_str().map(String::from))
            .collect(),
    })
}

/// Marks each claim with the node its volume is to be made on (`volume.kubernetes.io/selected-node`).
async fn select_node(reg: &Registry, ns: &str, node: &str, claims: &[String]) -> Result<(), ApiError> {
    use crate::registry::{Subresource, WriteOptions};
    for name in claims {
        let Some(mut claim) = reg.store.get(Kind::PersistentVolumeClaim, ns, name)? else { continue };
        claim["metadata"]["annotations"][api::kinds::persistentvolumeclaim::SELECTED_NODE_ANNOTATION] = json!(node);
        match reg
            .update(Kind::PersistentVolumeClaim, Some(ns), name, claim, Subresource::Main, &WriteOptions::default())
            .await
        {
            Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ready: bool, labels: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
        .unwrap()
    }

    fn pod(name: &str, node: &str, selector: Value) -> Value {
        json!({"metadata": {"namespace": "default", "name": name},
               "spec": {"nodeName": node, "nodeSelector": selector, "containers": []}})
    }

    #[test]
    fn pods_go_to_the_least_loaded_fitting_ready_node() {
        let nodes = [
            node("node-1", true, json!({})),
            node("node-2", true, json!({"disk": "ssd"})),
            node("node-3", false, json!({})),
        ];
        let pods = [
            pod("running", "node-1", json!(null)),
            pod("a", "", json!(null)),
            pod("b", "", json!(null)),
            pod("ssd", "", json!({"disk": "ssd"})),
            pod("gpu", "", json!({"gpu": "yes"})),
        ];
        let plan = plan_schedule(&pods, &nodes);
        let decisions: Vec<(&str, &Decision)> = plan.iter().map(|b| (b.name.as_str(), &b.decision)).collect();
        assert_eq!(
            decisions,
            [
                ("a", &Decision::Bind("node-2".into())),
                ("b", &Decision::Bind("node-1".into())),
                ("ssd", &Decision::Bind("node-2".into())),
                (
                    "gpu",
                    &Decision::Unschedulable(
                        "0/3 nodes are available: 1 node(s) were not ready, 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.".into()
                    )
                ),
            ]
        );
        assert!(plan_schedule(&pods[..1], &nodes).is_empty(), "nothing pending, nothing to do");
        let none = plan_schedule(&pods[1..2], &[]);
        assert_eq!(none[0].decision, Decision::Unschedulable("no nodes available to schedule pods".into()));
    }

    #[test]
    fn replicas_spread_over_nodes_and_terminating_pods_do_not_count() {
        let nodes = [node("node-1", true, json!({})), node("node-2", true, json!({}))];
        let replica = |name: &str, node: &str, rs: &str| {
            let mut p = pod(name, node, json!(null));
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": format!("uid-{rs}"), "controller": true}]);
            p
        };
        // node-1 carries more pods in all (cluster DNS, others); node-2 carries two terminating
        // pods and one finished: they count for nothing.
        let mut gone = replica("old-1", "node-2", "web-old");
        gone["metadata"]["deletionTimestamp"] = json!("2026-11-26T00:00:00Z");
        let mut gone2 = gone.clone();
        gone2["metadata"]["name"] = json!("old-2");
        let mut done = pod("job-1", "node-2", json!(null));
        done["status"] = json!({"phase": "Succeeded"});
        let mut pods = vec![pod("dns", "node-1", json!(null)), gone, gone2, done];
        pods.push(replica("web-a", "", "web"));
        pods.push(replica("web-b", "", "web"));
        let plan = plan_schedule(&pods, &nodes);
        let placed: Vec<&Decision> = plan.iter().map(|b| &b.decision).collect();
        assert_eq!(placed, [&Decision::Bind("node-2".into()), &Decision::Bind("node-1".into())]);
        // With a replica already on node-2, the next goes to node-1 even though node-1 holds
        // more pods in all: its group has none there.
        let mut pods = vec![pod("dns", "node-1", json!(null)), pod("x", "node-1", json!(null))];
        pods.push(replica("web-a", "node-2", "web"));
        pods.push(replica("web-c", "", "web"));
        let plan = plan_schedule(&pods, &nodes);
        assert_eq!(plan[0].decision, Decision::Bind("node-1".into()));
    }

    #[test]
    fn requests_count_against_allocatable_and_say_what_is_short() {
        let sized = |name: &str, cpu: &str, pods: &str| {
            let mut n = node(name, true, json!({}));
            let mut status = n.status.clone().unwrap_or_default();
            status.allocatable = Some(
                [("cpu", cpu), ("memory", "1Gi"), ("pods", pods)]
                    .into_iter()
                    .map(|(k, v)| {
                        (k.to_string(), api::k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.into()))
                    })
                    .collect(),
            );
            n.status = Some(status);
            n
        };
        let nodes = [sized("node-1", "2", "110"), sized("node-2", "1", "1")];
        let asking = |name: &str, node: &str, cpu: &str| {
            let mut p = pod(name, node, json!(null));
            p["spec"]["containers"] =
                json!([{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}}}]);
            p
        };
        // node-2 holds one pod at most and has 1 cpu, 0.1 in use; node-1 has 1.5 of its 2 in
        // use. kube-scheduler sorts the counted reasons as strings.
        let pods = [asking("big", "node-1", "1500m"), asking("one", "node-2", "100m"), asking("new", "", "1")];
        let plan = plan_schedule(&pods, &nodes);
        assert_eq!(
            plan[0].decision,
            Decision::Unschedulable(
                "0/2 nodes are available: 1 Too many pods, 2 Insufficient cpu. preemption: 0/2 nodes are available: 2 No preemption victims found for incoming pod.".into()
            )
        );
        let small = [asking("big", "node-1", "1500m"), asking("new", "", "500m")];
        assert_eq!(plan_schedule(&small, &nodes)[0].decision, Decision::Bind("node-2".into()));
        let mut two = vec![asking("big", "node-1", "1500m")];
        two.push(asking("a", "", "400m"));
        two.push(asking("b", "", "400m"));
        let plan = plan_schedule(&two, &nodes);
        // a takes node-2 (fewer pods); b does not fit there any more (1 pod at most): node-1.
        assert_eq!(
            (plan[0].decision.clone(), plan[1].decision.clone()),
            (Decision::Bind("node-2".into()), Decision::Bind("node-1".into()))
        );
    }

    #[test]
    fn replicas_spread_over_zones_after_nodes() {
        // Four nodes in three zones: node-4 shares zone a with node-1.
        let nodes = [
            node("node-1", true, json!({ZONE_LABEL: "zone-a"})),
            node("node-2", true, json!({ZONE_LABEL: "zone-b"})),
            node("node-3", true, json!({ZONE_LABEL: "zone-c"})),
            node("node-4", true, json!({ZONE_LABEL: "zone-a"})),
        ];
        let replica = |name: &str| {
            let mut p = pod(name, "", json!(null));
            p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "u-web", "controller": true}]);
            p
        };
        let pods: Vec<Value> = ["a", "b", "c", "d"].iter().map(|n| replica(n)).collect();
        let placed: Vec<String> = plan_schedule(&pods, &nodes)
            .into_iter()
            .map(|b| match b.decision {
                Decision::Bind(n) => n,
                d => panic!("{d:?}"),
            })
            .collect();
        // One per zone before zone a gets a second (node-4 comes last, though as empty as any).
        assert_eq!(placed, ["node-1", "node-2", "node-3", "node-4"]);
        let mut skewed = pods.clone();
        skewed[0]["spec"]["nodeName"] = json!("node-1");
        let next = plan_schedule(&skewed, &nodes);
        assert_eq!(next[0].decision, Decision::Bind("node-2".into()), "zone a already has one: not node-4");
    }

    #[test]
    fn required_node_affinity_picks_nodes_by_name_and_labels() {
        let nodes = [node("node-1", true, json!({"zone": "a"})), node("node-2", true, json!({"zone": "b"}))];
        let with = |name: &str, term: Value| {
            let mut p = pod(name, "", json!(null));
            p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}});
            p
        };
        let pods = [
            with("by-name", json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]})),
            with("by-label", json!({"matchExpressions": [{"key": "zone", "operator": "NotIn", "values": ["b"]}]})),
            with("nowhere", json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]})),
        ];
        let plan = plan_schedule(&pods, &nodes);
        assert_eq!(plan[0].decision, Decision::Bind("node-2".into()));
        assert_eq!(plan[1].decision, Decision::Bind("node-1".into()));
        assert!(
            matches!(&plan[2].decision, Decision::Unschedulable(m) if m.contains("2 node(s) didn't match Pod's node affinity/selector"))
        );
    }

    #[test]
    fn taints_and_cordons_keep_pods_away_unless_tolerated() {
        let mut tainted = node("gpu-1", true, json!({}));
        tainted.spec = Some(
            serde_json::from_value(json!({"taints": [
            {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
            {"key": "slow", "effect": "PreferNoSchedule"}]}))
            .unwrap(),
        );
        let mut cordoned = node("node-2", true, json!({}));
        cordoned.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let nodes = [tainted, cordoned];
        let mut plain = pod("plain", "", json!(null));
        let mut gpu = pod("gpu", "", json!(null));
        gpu["spec"]["tolerations"] =
            json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]);
        let mut daemon = pod("daemon", "", json!(null));
        daemon["spec"]["tolerations"] =
            json!([{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}]);
        plain["spec"]["tolerations"] = json!([{"key": "dedicated", "value": "cpu"}]);
        let plan = plan_schedule(&[plain, gpu, daemon], &nodes);
        assert_eq!(
            plan[0].decision,
            Decision::Unschedulable("0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) were unschedulable. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.".into())
        );
        assert_eq!(plan[1].decision, Decision::Bind("gpu-1".into()));
        assert_eq!(plan[2].decision, Decision::Bind("node-2".into()), "tolerating the cordon taint");
    }

    #[test]
    fn claims_pick_the_node_of_their_volume_or_have_one_chosen() {
        let nodes = [
            node("node-1", true, json!({"kubernetes.io/hostname": "node-1"})),
            node("node-2", true, json!({"kubernetes.io/hostname": "node-2"})),
        ];
        let with_claim = |name: &str, claim: &str| {
            let mut p = pod(name, "", json!(null));
            p["spec"]["volumes"] = json!([{"name": "www", "persistentVolumeClaim": {"claimName": claim}}]);
            p
        };
        let claim = |name: &str, class: &str, extra: Value| {
            let mut c = json!({"metadata": {"namespace": "default", "name": name, "annotations": {}},
                               "spec": {"storageClassName": class}, "status": {"phase": "Pending"}});
            if let (Some(o), Some(e)) = (c.as_object_mut(), extra.as_object()) {
                for (k, v) in e {
                    o.insert(k.clone(), v.clone());
                }
            }
            c
        };
        let mut claims = Claims::default();
        claims.delayed_classes.insert("standard".into());
        claims.claims.insert("default/new".into(), claim("new", "standard", json!({})));
        claims.claims.insert("default/fast".into(), claim("fast", "fast", json!({})));
        let mut chosen = claim("chosen", "standard", json!({}));
        chosen["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] = json!("node-2");
        claims.claims.insert("default/chosen".into(), chosen);
        let bound = claim(
            "bound",
            "standard",
            json!({"spec": {"storageClassName": "standard", "volumeName": "pv-1"}, "status": {"phase": "Bound"}}),
        );
        claims.claims.insert("default/bound".into(), bound);
        claims.volumes.insert(
            "pv-1".into(),
            json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1"]}]}]}}}}),
        );
        let pods = [
            with_claim("a", "new"),
            with_claim("b", "chosen"),
            with_claim("c", "bound"),
            with_claim("d", "missing"),
            with_claim("e", "fast"),
        ];
        let plan = plan_schedule_with(&pods, &nodes, &claims);
        assert_eq!(plan[0].decision, Decision::SelectNode("node-1".into(), vec!["new".into()]));
        assert_eq!(plan[1].decision, Decision::SelectNode("node-2".into(), vec![]), "waits for its volume there");
        assert_eq!(plan[2].decision, Decision::Bind("node-1".into()), "where its volume is");
        assert_eq!(
            plan[3].decision,
            Decision::Unschedulable("0/2 nodes are available: persistentvolumeclaim \"missing\" not found. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.".into())
        );
        assert_eq!(
            plan[4].decision,
            Decision::Unschedulable("0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.".into())
        );
        // The volume's node is down: its affinity rules the other out.
        let one_down = [nodes[0].clone(), node("node-1", false, json!({"kubernetes.io/hostname": "node-1"}))];
        let plan = plan_schedule_with(&pods[2..3], &one_down[1..], &claims);
        assert!(
            matches!(&plan[0].decision, Decision::Unschedulable(m) if m.contains("1 node(s) were not ready")),
            "{plan:?}"
        );
        let plan = plan_schedule_with(&pods[2..3], &[nodes[1].clone()], &claims);
        assert!(
            matches!(&plan[0].decision, Decision::Unschedulable(m) if m.contains("1 node(s) had volume node affinity conflict")),
            "{plan:?}"
        );
    }
}
