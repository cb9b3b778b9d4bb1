//! Node lifecycle, as kube-controller-manager runs it: nodes whose agent stopped heart-beating
//! turn NotReady (and their pods not Ready), and gracefully deleted pods whose node will not
//! finish them are removed.

use std::collections::BTreeSet;
use std::time::Duration;

use api::k8s_openapi::api::core::v1::Node;
use api::kinds::node::node_ready_status;
use api::selector::{FieldSelector, LabelSelector};
use api::Codec;
use api::Kind;
use serde_json::{json, Value};

use super::events::{record, EventType, Report};
use super::write::{new_time, ns_name, set_condition};
use crate::error::ApiError;
use crate::registry::{DeleteOptions, Registry};

fn parse_time(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str().and_then(|s| s.parse().ok())
}

/// The node's status after a heartbeat that reports `conditions` at `now`, or None when it need not be written: no condition changed and the last
/// post (the Ready condition's lastHeartbeatTime) is younger than `report`. Pure.
pub fn heartbeat_status(
    node: &Value,
    conditions: &[api::proto::Condition],
    now: jiff::Timestamp,
    report: Duration,
) -> Option<Value> {
    let stamp = json!(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string());
    let old: Vec<Value> = node.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut conds = old.clone();
    let mut changed = false;
    for api::proto::Condition { r#type: type_, status, reason, message, .. } in conditions {
        let prev = conds.iter().position(|x| x["type"] == type_.as_str());
        let same = |c: &Value| {
            c["status"] == status.as_str()
                && c["reason"].as_str() == reason.as_deref()
                && c["message"].as_str() == message.as_deref()
        };
        changed |= !prev.is_some_and(|i| same(&conds[i]));
        let transition = match prev {
            Some(i) if conds[i]["status"] == status.as_str() => conds[i]["lastTransitionTime"].clone(),
            _ => stamp.clone(),
        };
        let cond = json!({"type": type_, "status": status, "reason": reason, "message": message,
                          "lastHeartbeatTime": stamp, "lastTransitionTime": transition});
        match prev {
            Some(i) => conds[i] = cond,
            None => conds.push(cond),
        }
    }
    let posted = old.iter().find(|c| c["type"] == "Ready").and_then(|c| parse_time(&c["lastHeartbeatTime"]));
    let due = posted.is_none_or(|t| now.duration_since(t).as_secs_f64() >= report.as_secs_f64());
    if !changed && !due {
        return None;
    }
    let mut new = node.clone();
    if !new["status"].is_object() {
        new["status"] = json!({});
    }
    new["status"]["conditions"] = json!(conds);
    Some(new)
}

/// Marks nodes NotReady (status Unknown) when their agent stops heart-beating — neither its
/// Lease renewed nor its status posted within `grace`, as kube-controller-manager judges
/// them; and, as soon as a node's Ready condition is not True (False, as an agent that stops
/// posts it, or Unknown), marks its pods not ready with a `NodeNotReady` Event each (the
/// endpoints controller then takes them out of Services), and the node's change with one
/// Event on the node.
pub(crate) async fn node_health(reg: &Registry, grace: Duration) -> Result<(), ApiError> {
    use api::kinds::lease::NODE_LEASE_NAMESPACE as NS;
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let (leases, _) = reg.store.list(Kind::Lease, Some(NS))?;
    let renewed: std::collections::BTreeMap<String, jiff::Timestamp> =
        leases.iter().filter_map(|l| Some((ns_name(l).1, parse_time(&l["spec"]["renewTime"])?))).collect();
    let now = jiff::Timestamp::now();
    for n in nodes {
        let conds = n.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
        let Some(ready) = conds.iter().find(|c| c["type"] == "Ready") else { continue };
        let (_, name) = ns_name(&n);
        let last = parse_time(&ready["lastHeartbeatTime"]).into_iter().chain(renewed.get(&name).copied()).max();
        let stale = last.is_some_and(|beat| now.duration_since(beat).as_secs_f64() >= grace.as_secs_f64());
        let node = if ready["status"] != "Unknown" && stale {
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
            let pending = reg.put_raw(&g, Kind::Node, Some(old), new.clone())?;
            drop(g);
            reg.sync(pending).await?;
            new
        } else if ready["status"] == "True" {
            continue;
        } else {
            n
        };
        mark_pods_not_ready(reg, &node, &name).await?;
    }
    Ok(())
}

/// Sets Ready=False on the pods of a node that is not ready (those still Ready), with
/// kube-controller-manager's Events: `NodeNotReady` "Node is not ready" on each pod, and once
/// per change "Node NAME status is now: NodeNotReady" on the node.
async fn mark_pods_not_ready(reg: &Registry, node: &Value, name: &str) -> Result<(), ApiError> {
    let fs = FieldSelector::parse(&format!("spec.nodeName={name}"), Kind::Pod)?;
    let (pods, _) = reg.list(Kind::Pod, None, &LabelSelector::default(), &fs)?;
    let mut marked = 0;
    for p in pods {
        let ready = p
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
        if !ready {
            continue;
        }
        let (ns, pname) = ns_name(&p);
        let g = reg.store.lock().await;
        let Some(old) = reg.store.get(Kind::Pod, &ns, &pname)? else { continue };
        let mut new = old.clone();
        set_condition(
            &mut new,
            json!({"type": "Ready", "status": "False", "reason": "NodeNotReady", "lastTransitionTime": new_time()}),
        );
        if new == old {
            continue;
        }
        let pending = reg.put_raw(&g, Kind::Pod, Some(old), new.clone())?;
        drop(g);
        reg.sync(pending).await?;
        marked += 1;
        let report = Report {
            component: "node-controller",
            host: None,
            object: &new,
            kind: Kind::Pod,
            field_path: None,
            type_: EventType::Warning,
            reason: "NodeNotReady",
            message: "Node is not ready".into(),
        };
        record(reg, report).await;
    }
    if marked > 0 {
        tracing::info!(node = %name, pods = marked, "node is not ready; its pods are marked not ready");
        let report = Report {
            component: "node-controller",
            host: None,
            object: node,
            kind: Kind::Node,
            field_path: None,
            type_: EventType::Normal,
            reason: "NodeNotReady",
            message: format!("Node {name} status is now: NodeNotReady"),
        };
        record(reg, report).await;
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
        .filter_map(|n| Node::from_json(n.clone()).ok())
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
/// How long a node's Lease lasts unrenewed (the kubelet's `nodeLeaseDurationSeconds`).
pub const NODE_LEASE_SECONDS: i32 = 40;

/// The time as a MicroTime (`2026-11-27T02:40:00.123456Z`).
fn micro_time(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// Renews node `name`'s Lease in `kube-node-lease` (made at its first heartbeat, owned by the
/// Node so it goes with it), as the kubelet renews it: what `kubectl describe node` shows.
pub async fn renew_lease(reg: &Registry, node: &Value) -> Result<(), ApiError> {
    use crate::registry::{Subresource, WriteOptions};
    use api::kinds::lease::NODE_LEASE_NAMESPACE as NS;
    let (_, name) = ns_name(node);
    let now = micro_time(jiff::Timestamp::now());
    let opts = WriteOptions::default();
    match reg.store.get(Kind::Lease, NS, &name)? {
        Some(mut lease) => {
            lease["spec"]["renewTime"] = json!(now);
            lease["spec"]["holderIdentity"] = json!(name);
            match reg.update(Kind::Lease, Some(NS), &name, lease, Subresource::Main, &opts).await {
                Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }
        None => {
            let lease = json!({
                "metadata": {"name": name, "namespace": NS, "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": NODE_LEASE_SECONDS, "renewTime": now},
            });
            match reg.create(Kind::Lease, Some(NS), lease, &opts).await {
                Ok(_) | Err(ApiError::AlreadyExists { .. }) | Err(ApiError::NotFound { .. }) => Ok(()),
                // The namespace is being made again (deleted by hand): the next heartbeat.
                Err(ApiError::Forbidden { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        }
    }
}

/// Deletes the Leases of nodes that are gone (the garbage collector's work for their owner
/// references).
pub(crate) async fn collect_leases(reg: &Registry) -> Result<(), ApiError> {
    use api::kinds::lease::NODE_LEASE_NAMESPACE as NS;
    let (leases, _) = reg.store.list(Kind::Lease, Some(NS))?;
    if leases.is_empty() {
        return Ok(());
    }
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let uids: BTreeSet<&str> = nodes.iter().filter_map(|n| n["metadata"]["uid"].as_str()).collect();
    for l in &leases {
        let owner = l["metadata"]["ownerReferences"].as_array().and_then(|o| o.iter().find(|r| r["kind"] == "Node"));
        if owner.is_some_and(|o| !o["uid"].as_str().is_some_and(|u| uids.contains(u))) {
            super::write::delete_quietly(reg, Kind::Lease, NS, &ns_name(l).1).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str, reason: Option<&str>) -> api::proto::Condition {
        api::proto::Condition {
            r#type: type_.into(),
            status: status.into(),
            reason: reason.map(Into::into),
            ..Default::default()
        }
    }

    fn ready(status: &str, reason: &str) -> Vec<api::proto::Condition> {
        vec![condition("Ready", status, Some(reason))]
    }

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    const REPORT: Duration = Duration::from_secs(300);

    #[test]
    fn a_heartbeat_posts_the_status_only_when_it_changed_or_is_due() {
        let node = json!({"metadata": {"name": "n1"}});
        // The first report: nothing posted before.
        let first = heartbeat_status(&node, &ready("True", "KubeletReady"), at("2026-12-07T10:00:00.4Z"), REPORT)
            .expect("the first report is written");
        let c = &first["status"]["conditions"][0];
        assert_eq!(c["lastHeartbeatTime"], "2026-12-07T10:00:00Z");
        assert_eq!(c["lastTransitionTime"], "2026-12-07T10:00:00Z");
        // The same conditions 2 s and 4 min later: the Lease alone is the heartbeat.
        assert_eq!(heartbeat_status(&first, &ready("True", "KubeletReady"), at("2026-12-07T10:00:02Z"), REPORT), None);
        assert_eq!(heartbeat_status(&first, &ready("True", "KubeletReady"), at("2026-12-07T10:04:59Z"), REPORT), None);
        // Five minutes after the last post: posted again, its transition time kept.
        let due = heartbeat_status(&first, &ready("True", "KubeletReady"), at("2026-12-07T10:05:00Z"), REPORT).unwrap();
        let c = &due["status"]["conditions"][0];
        assert_eq!(
            (&c["lastHeartbeatTime"], &c["lastTransitionTime"]),
            (&json!("2026-12-07T10:05:00Z"), &json!("2026-12-07T10:00:00Z"))
        );
        // A change is posted at once: a new status moves the transition time, a new reason not.
        let down =
            heartbeat_status(&first, &ready("False", "KubeletNotReady"), at("2026-12-07T10:00:02Z"), REPORT).unwrap();
        assert_eq!(down["status"]["conditions"][0]["lastTransitionTime"], "2026-12-07T10:00:02Z");
        let reason = heartbeat_status(&first, &ready("True", "Other"), at("2026-12-07T10:00:02Z"), REPORT).unwrap();
        assert_eq!(reason["status"]["conditions"][0]["lastTransitionTime"], "2026-12-07T10:00:00Z");
        // After the node monitor's Unknown, the next heartbeat is a change.
        let mut unknown = first.clone();
        unknown["status"]["conditions"][0]["status"] = json!("Unknown");
        assert!(
            heartbeat_status(&unknown, &ready("True", "KubeletReady"), at("2026-12-07T10:00:30Z"), REPORT).is_some()
        );
        // A condition not reported before is a change too; the others stay.
        let two = vec![condition("Ready", "True", Some("KubeletReady")), condition("DiskPressure", "False", None)];
        let more = heartbeat_status(&first, &two, at("2026-12-07T10:00:02Z"), REPORT).unwrap();
        assert_eq!(more["status"]["conditions"].as_array().unwrap().len(), 2);
    }
}
