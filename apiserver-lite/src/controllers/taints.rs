//! Taints and tolerations: which taints of a node a pod does not tolerate (the scheduler's
//! TaintToleration filter) and which bound pods a `NoExecute` taint evicts (the taint-eviction
//! controller). The decisions are pure; `evict` reads and writes.

use api::k8s_openapi::api::core::v1::{Node, Taint, Toleration};
use api::Codec;
use api::Kind;
use serde_json::Value;

use super::events::{record, EventType, Report};
use super::write::ns_name;
use crate::error::ApiError;
use crate::registry::{DeleteOptions, Registry};

pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";
/// The taint a cordoned node stands for (the node lifecycle controller adds it in a real
/// cluster); a pod tolerating it may still be scheduled there, as DaemonSet pods are.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Whether one toleration tolerates one taint, as `Toleration.ToleratesTaint` decides: the
/// effect matches (or the toleration names none), and the key matches (`Exists` without a key
/// matches every key) with `Equal` also comparing values.
pub fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if t.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    let key = t.key.as_deref().unwrap_or("");
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        // An empty key with Equal is invalid in a real cluster; it tolerates nothing here.
        "Equal" | "" => !key.is_empty() && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or(""),
        _ => false,
    }
}

/// A pod's tolerations (none when absent or malformed).
pub fn tolerations_of(pod: &Value) -> Vec<Toleration> {
    pod.pointer("/spec/tolerations").and_then(|t| serde_json::from_value(t.clone()).ok()).unwrap_or_default()
}

/// The node's taints.
pub fn taints_of(node: &Node) -> &[Taint] {
    node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or(&[])
}

/// The first taint with one of `effects` that none of `tolerations` tolerates.
pub fn untolerated<'a>(taints: &'a [Taint], tolerations: &[Toleration], effects: &[&str]) -> Option<&'a Taint> {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

/// kube-scheduler's wording for a node filtered out by a taint.
pub fn untolerated_reason(taint: &Taint) -> String {
    format!("node(s) had untolerated taint {{{}: {}}}", taint.key, taint.value.as_deref().unwrap_or(""))
}

/// One eviction: the pod and the taint that evicts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub taint: String,
}

/// Pods bound to a node with a `NoExecute` taint they do not tolerate, or tolerate only for
/// `tolerationSeconds` that have run out since the taint's `timeAdded`. Pods already being
/// deleted are left alone. Pure (`now` is given).
pub fn plan_evictions(pods: &[Value], nodes: &[Node], now: jiff::Timestamp) -> Vec<Eviction> {
    let mut out = Vec::new();
    for node in nodes {
        let name = node.metadata.name.as_deref().unwrap_or("");
        let taints: Vec<&Taint> = taints_of(node).iter().filter(|t| t.effect == NO_EXECUTE).collect();
        if taints.is_empty() {
            continue;
        }
        for pod in pods {
            if pod.pointer("/spec/nodeName").and_then(Value::as_str) != Some(name)
                || pod["metadata"].get("deletionTimestamp").is_some()
            {
                continue;
            }
            let tolerations = tolerations_of(pod);
            let evicting = taints.iter().find(|taint| {
                let matching: Vec<&Toleration> = tolerations.iter().filter(|t| tolerates(t, taint)).collect();
                if matching.is_empty() {
                    return true;
                }
                // Tolerated for the shortest tolerationSeconds, counted from when the taint came.
                let Some(secs) = matching.iter().map(|t| t.toleration_seconds).collect::<Option<Vec<i64>>>() else {
                    return false; // one toleration without a limit tolerates it for ever
                };
                let Some(added) = taint.time_added.as_ref() else { return false };
                let limit = secs.into_iter().min().unwrap_or(0).max(0);
                now.duration_since(added.0).as_secs() >= limit
            });
            if let Some(taint) = evicting {
                let (namespace, pod_name) = ns_name(pod);
                out.push(Eviction {
                    namespace,
                    name: pod_name,
                    node: name.to_string(),
                    taint: format!("{}={}:{}", taint.key, taint.value.as_deref().unwrap_or(""), taint.effect),
                });
            }
        }
    }
    out
}

/// Deletes (gracefully, as the taint-eviction controller does) the pods `NoExecute` taints evict.
pub(crate) async fn evict(reg: &Registry) -> Result<(), ApiError> {
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let nodes: Vec<Node> = nodes.into_iter().filter_map(|n| Node::from_json(n).ok()).collect();
    if nodes.iter().all(|n| taints_of(n).iter().all(|t| t.effect != NO_EXECUTE)) {
        return Ok(());
    }
    let (pods, _) = reg.store.list(Kind::Pod, None)?;
    for e in plan_evictions(&pods, &nodes, jiff::Timestamp::now()) {
        tracing::info!(pod = %format!("{}/{}", e.namespace, e.name), node = %e.node, taint = %e.taint, "evicting pod: untolerated NoExecute taint");
        match reg.delete(Kind::Pod, Some(&e.namespace), &e.name, &DeleteOptions::default()).await {
            Ok(pod) => {
                let message = format!("Marking for deletion Pod {}/{}", e.namespace, e.name);
                let report = Report {
                    component: "taint-eviction-controller",
                    host: None,
                    object: &pod,
                    kind: Kind::Pod,
                    field_path: None,
                    type_: EventType::Normal,
                    reason: "TaintManagerEviction",
                    message,
                };
                record(reg, report).await;
            }
            Err(ApiError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taint(key: &str, value: &str, effect: &str) -> Taint {
        Taint { key: key.into(), value: Some(value.into()), effect: effect.into(), time_added: None }
    }

    fn toleration(v: Value) -> Toleration {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn tolerations_match_as_kubernetes_matches_them() {
        let gpu = taint("dedicated", "gpu", NO_SCHEDULE);
        let yes = [
            json!({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}),
            json!({"key": "dedicated", "value": "gpu"}),
            json!({"key": "dedicated", "operator": "Exists"}),
            json!({"operator": "Exists"}),
            json!({"operator": "Exists", "effect": "NoSchedule"}),
        ];
        for t in yes {
            assert!(tolerates(&toleration(t.clone()), &gpu), "{t}");
        }
        let no = [
            json!({"key": "dedicated", "value": "cpu"}),
            json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
            json!({"key": "other", "operator": "Exists"}),
            json!({"value": "gpu"}),
            json!({"key": "dedicated", "operator": "Gt", "value": "gpu"}),
        ];
        for t in no {
            assert!(!tolerates(&toleration(t.clone()), &gpu), "{t}");
        }
        let taints = [taint("a", "1", "PreferNoSchedule"), gpu.clone()];
        assert_eq!(untolerated(&taints, &[], &[NO_SCHEDULE, NO_EXECUTE]), Some(&gpu), "PreferNoSchedule never filters");
        assert_eq!(untolerated_reason(&gpu), "node(s) had untolerated taint {dedicated: gpu}");
    }

    #[test]
    fn no_execute_evicts_untolerated_pods_and_tolerated_ones_when_their_time_is_up() {
        let now = jiff::Timestamp::from_second(1_000_000).unwrap();
        let added = api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(1_000_000 - 60).unwrap(),
        );
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1"},
            "spec": {"taints": [{"key": "maint", "value": "now", "effect": "NoExecute"}]}}))
        .unwrap();
        let mut node_with_time = node.clone();
        node_with_time.spec.as_mut().unwrap().taints.as_mut().unwrap()[0].time_added = Some(added);
        let pod = |name: &str, node: &str, tolerations: Value| {
            json!({"metadata": {"namespace": "default", "name": name},
                   "spec": {"nodeName": node, "tolerations": tolerations, "containers": []}})
        };
        let pods = [
            pod("plain", "n1", json!(null)),
            pod("forever", "n1", json!([{"key": "maint", "operator": "Exists"}])),
            pod("short", "n1", json!([{"key": "maint", "operator": "Exists", "tolerationSeconds": 30}])),
            pod("long", "n1", json!([{"key": "maint", "operator": "Exists", "tolerationSeconds": 300}])),
            pod("elsewhere", "n2", json!(null)),
        ];
        let names =
            |nodes: &[Node]| -> Vec<String> { plan_evictions(&pods, nodes, now).into_iter().map(|e| e.name).collect() };
        assert_eq!(names(std::slice::from_ref(&node_with_time)), ["plain", "short"]);
        assert_eq!(names(&[node]), ["plain"], "without timeAdded a limited toleration holds");
        let mut deleting = pods[0].clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert!(plan_evictions(&[deleting], &[node_with_time], now).is_empty());
    }
}
