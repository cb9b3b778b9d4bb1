//! The scheduler: binds each pod without a node to the Ready, schedulable node with the fewest
//! pods that its `nodeSelector` fits, or marks it Unschedulable with kube-scheduler's reason.
//! The decision is pure ([`plan_schedule`]: pods and nodes in, bindings out); [`schedule`]
//! reads and writes.

use std::collections::BTreeMap;

use api::k8s_openapi::api::core::v1::Node;
use api::kinds::node::node_ready_status;
use api::Kind;
use serde_json::{json, Value};

use super::write::{new_time, ns_name, set_condition};
use crate::error::ApiError;
use crate::registry::Registry;

/// What the scheduler decided for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Bind(String),
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

/// The scheduler's reason, worded as kube-scheduler words it.
fn unschedulable_message(total: usize, not_ready: usize, ready_but_unfit: usize) -> String {
    let mut reasons = Vec::new();
    if ready_but_unfit > 0 {
        reasons.push(format!("{ready_but_unfit} node(s) didn't match Pod's node affinity/selector"));
    }
    if not_ready > 0 {
        reasons.push(format!("{not_ready} node(s) were not ready"));
    }
    if reasons.is_empty() {
        return "no nodes available to schedule pods".into();
    }
    format!("0/{total} nodes are available: {}.", reasons.join(", "))
}

fn bound_node(pod: &Value) -> &str {
    pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("")
}

/// Decisions for every pod (of `pods`) that has no node and is not being deleted, in order:
/// the fewest-pods Ready node its selector fits (counting the pods placed before it). Pure.
pub fn plan_schedule(pods: &[Value], nodes: &[Node]) -> Vec<Binding> {
    let pending: Vec<&Value> = pods
        .iter()
        .filter(|p| bound_node(p).is_empty())
        .filter(|p| p["metadata"].get("deletionTimestamp").is_none())
        .collect();
    if pending.is_empty() {
        return vec![];
    }
    // (pods on it, name, labels) of every node that takes new pods.
    let mut candidates: Vec<(usize, String, BTreeMap<String, String>)> = Vec::new();
    let mut not_ready = 0;
    for node in nodes {
        let schedulable = !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        if node_ready_status(node) == "Ready" && schedulable {
            let name = node.metadata.name.clone().unwrap_or_default();
            let count = pods
                .iter()
                .filter(|p| bound_node(p) == name)
                .filter(|p| !matches!(p.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed")))
                .count();
            candidates.push((count, name, node.metadata.labels.clone().unwrap_or_default()));
        } else {
            not_ready += 1;
        }
    }
    let mut out = Vec::new();
    for p in pending {
        let (namespace, name) = ns_name(p);
        candidates.sort();
        let selector: BTreeMap<String, String> =
            serde_json::from_value(p.pointer("/spec/nodeSelector").cloned().unwrap_or(Value::Null)).unwrap_or_default();
        let fitting = candidates.iter_mut().find(|(_, _, labels)| node_selector_matches(&selector, labels));
        let decision = match fitting {
            Some((count, node, _)) => {
                *count += 1;
                Decision::Bind(node.clone())
            }
            None => Decision::Unschedulable(unschedulable_message(nodes.len(), not_ready, candidates.len())),
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
    let nodes: Vec<Node> = nodes.into_iter().map(serde_json::from_value).collect::<Result<_, _>>()?;
    for b in plan_schedule(&pods, &nodes) {
        let g = reg.store.lock().await;
        let Some(old) = reg.store.get(Kind::Pod, &b.namespace, &b.name)? else { continue };
        if !bound_node(&old).is_empty() {
            continue;
        }
        let mut new = old.clone();
        let condition = match b.decision {
            Decision::Bind(node) => {
                new["spec"]["nodeName"] = json!(node);
                json!({"type": "PodScheduled", "status": "True", "lastTransitionTime": new_time()})
            }
            Decision::Unschedulable(message) => json!({
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": message, "lastTransitionTime": new_time(),
            }),
        };
        set_condition(&mut new, condition);
        if new == old {
            continue;
        }
        let pending = reg.put_raw(&g, Kind::Pod, Some(old), new)?;
        drop(g);
        reg.sync(pending).await?;
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
                        "0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 node(s) were not ready.".into()
                    )
                ),
            ]
        );
        assert!(plan_schedule(&pods[..1], &nodes).is_empty(), "nothing pending, nothing to do");
        let none = plan_schedule(&pods[1..2], &[]);
        assert_eq!(none[0].decision, Decision::Unschedulable("no nodes available to schedule pods".into()));
    }
}
