//! Node lifecycle, as kube-controller-manager runs it: nodes whose agent stopped heart-beating
//! turn NotReady (and their pods not Ready), and gracefully deleted pods whose node will not
//! finish them are removed.

use std::collections::BTreeSet;
use std::time::Duration;

use api::k8s_openapi::api::core::v1::Node;
use api::kinds::node::node_ready_status;
use api::selector::{FieldSelector, LabelSelector};
use api::Kind;
use serde_json::{json, Value};

use super::write::{new_time, ns_name, set_condition};
use crate::error::ApiError;
use crate::registry::{DeleteOptions, Registry};

fn parse_time(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str().and_then(|s| s.parse().ok())
}

/// Marks nodes NotReady (status Unknown) when their agent stops heart-beating, and their pods
/// not ready.
pub(crate) async fn node_health(reg: &Registry, grace: Duration) -> Result<(), ApiError> {
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let now = jiff::Timestamp::now();
    for n in nodes {
        let conds = n.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let Some(ready) = conds.iter().find(|c| c["type"] == "Ready") else { continue };
        if ready["status"] == "Unknown" {
            continue;
        }
        let Some(beat) = parse_time(&ready["lastHeartbeatTime"]) else { continue };
        let age = now.duration_since(beat);
        if age.as_secs_f64() < grace.as_secs_f64() {
            continue;
        }
        let (_, name) = ns_name(&n);
        tracing::info!(node = %name, "node stopped posting status; marking it NotReady");
        let g = reg.store.lock().await;
        let Some(old) = reg.store.get(Kind::Node, "", &name)? else { continue };
        let mut new = old.clone();
        let mut cond = json!({
            "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
            "message": "Kubelet stopped posting node status.", "lastTransitionTime": new_time(),
        });
        cond["lastHeartbeatTime"] = ready["lastHeartbeatTime"].clone();
        set_condition(&mut new, cond);
        let pending = reg.put_raw(&g, Kind::Node, Some(old), new)?;
        drop(g);
        reg.sync(pending).await?;
        // Its pods are no longer ready: the endpoints controller takes them out of Services.
        let fs = FieldSelector::parse(&format!("spec.nodeName={name}"), Kind::Pod)?;
        let (pods, _) = reg.list(Kind::Pod, None, &LabelSelector::default(), &fs)?;
        for p in pods {
            let (ns, pname) = ns_name(&p);
            let g = reg.store.lock().await;
            let Some(old) = reg.store.get(Kind::Pod, &ns, &pname)? else { continue };
            let mut new = old.clone();
            set_condition(
                &mut new,
                json!({"type": "Ready", "status": "False", "reason": "NodeNotReady", "lastTransitionTime": new_time()}),
            );
            if new != old {
                let pending = reg.put_raw(&g, Kind::Pod, Some(old), new)?;
                drop(g);
                reg.sync(pending).await?;
            }
        }
    }
    Ok(())
}

/// Removes gracefully deleted pods whose node will not finish them: the node is gone or not
/// Ready, or the grace period plus slack has passed.
pub(crate) async fn pod_gc(reg: &Registry, slack: Duration) -> Result<(), ApiError> {
    let (pods, _) = reg.store.list(Kind::Pod, None)?;
    let now = jiff::Timestamp::now();
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let ready: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| serde_json::from_value::<Node>(n.clone()).ok())
        .filter(|n| node_ready_status(n) == "Ready")
        .filter_map(|n| n.metadata.name)
        .collect();
    let existing: BTreeSet<String> = nodes.iter().map(|n| ns_name(n).1).collect();
    for p in pods {
        let node = p.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
        let deleting = p["metadata"].get("deletionTimestamp").and_then(parse_time);
        let orphaned = !node.is_empty() && !existing.contains(node);
        let force = match deleting {
            Some(deadline) => !ready.contains(node) || now.duration_since(deadline).as_secs_f64() > slack.as_secs_f64(),
            None => orphaned,
        };
        if force {
            let (ns, name) = ns_name(&p);
            tracing::info!(pod = %format!("{ns}/{name}"), node, "removing pod whose node will not finish it");
            let opts = DeleteOptions { grace_period_seconds: Some(0), ..Default::default() };
            match reg.delete(Kind::Pod, Some(&ns), &name, &opts).await {
                Ok(_) | Err(ApiError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}
