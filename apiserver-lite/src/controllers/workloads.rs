//! The Deployment and ReplicaSet controllers, as kube-controller-manager runs them: a Deployment
//! owns one ReplicaSet per pod template (named `<deployment>-<template hash>`), rolls from the
//! old to the new within `maxSurge`/`maxUnavailable`, and keeps old ReplicaSets (scaled to 0) for
//! `revisionHistoryLimit`; a ReplicaSet keeps `replicas` pods (`<replicaset>-<5 random chars>`)
//! of its template. Dependents whose owner is gone are deleted (background cascading delete).
//!
//! Decisions are pure (`plan_*`); [`sync_namespace`] reads the objects and applies the plans.

use api::apps::{scaled_value, POD_TEMPLATE_HASH, REVISION_ANNOTATION};
use api::k8s_openapi::api::core::v1::Pod;
use api::kinds::pod::pod_is_ready;
use api::Codec;
use api::Kind;
use serde_json::{json, Value};

use super::events::{record, EventType, Report};
use super::write::{delete_quietly, is_terminating, new_time};
use crate::error::ApiError;
use crate::registry::{Registry, Subresource, WriteOptions};

fn owner_ref(kind: Kind, obj: &Value) -> Value {
    json!([{
        "apiVersion": kind.api_version(), "kind": kind.info().name,
        "name": obj["metadata"]["name"], "uid": obj["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    }])
}

fn name_of(obj: &Value) -> String {
    obj["metadata"]["name"].as_str().unwrap_or("").to_string()
}

/// The pod template without the hash label and without nulls (`kubectl rollout undo` sends
/// `creationTimestamp: null`): what two templates are compared by, as the controller compares
/// typed templates.
fn template_identity(template: &Value) -> Value {
    fn drop_nulls(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.retain(|_, x| !x.is_null());
                m.values_mut().for_each(drop_nulls);
            }
            Value::Array(a) => a.iter_mut().for_each(drop_nulls),
            _ => {}
        }
    }
    let mut t = template.clone();
    if let Some(labels) = t.pointer_mut("/metadata/labels").and_then(Value::as_object_mut) {
        labels.remove(POD_TEMPLATE_HASH);
    }
    drop_nulls(&mut t);
    t
}

/// `pod-template-hash`: FNV-1a of the template, its decimal digits mapped onto the alphabet
/// Kubernetes uses for generated names (no vowels, so no words).
pub fn template_hash(template: &Value) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h: u32 = 0x811c_9dc5;
    for b in template_identity(template).to_string().bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h.to_string().bytes().map(|d| ALPHABET[usize::from(d) % ALPHABET.len()] as char).collect()
}

fn pod_ready(pod: &Value) -> bool {
    Pod::from_json(pod.clone()).ok().is_some_and(|p| pod_is_ready(&p))
}

fn replicas(obj: &Value) -> i64 {
    obj["spec"]["replicas"].as_i64().unwrap_or(1)
}

fn status_i64(obj: &Value, field: &str) -> i64 {
    obj["status"][field].as_i64().unwrap_or(0)
}

fn revision(rs: &Value) -> i64 {
    rs["metadata"]["annotations"][REVISION_ANNOTATION].as_str().and_then(|r| r.parse().ok()).unwrap_or(0)
}

// === ReplicaSet ===

/// What a ReplicaSet needs: pods to create, pods to delete, its status.
#[derive(Debug, PartialEq)]
pub struct ReplicaSetPlan {
    pub create: usize,
    pub delete: Vec<String>,
    pub status: Value,
}

/// Plans a ReplicaSet from the pods it controls (terminating ones count as gone). Surplus
/// pods go in the order the real controller picks: unscheduled, then not ready, then newest.
pub fn plan_replicaset(rs: &Value, owned: &[&Value]) -> ReplicaSetPlan {
    let want = replicas(rs).max(0) as usize;
    let mut active: Vec<&Value> = owned.iter().copied().filter(|p| !is_terminating(p)).collect();
    let mut delete = vec![];
    if active.len() > want {
        active.sort_by_key(|p| {
            let scheduled = p["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
            let created = p["metadata"]["creationTimestamp"].as_str().unwrap_or("").to_string();
            (scheduled, pod_ready(p), std::cmp::Reverse(created))
        });
        delete = active.iter().take(active.len() - want).map(|p| name_of(p)).collect();
        active.drain(..active.len() - want);
    }
    let ready = active.iter().filter(|p| pod_ready(p)).count();
    let status = json!({
        "replicas": active.len(),
        "fullyLabeledReplicas": active.len(),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": rs["metadata"]["generation"],
    });
    ReplicaSetPlan { create: want.saturating_sub(active.len()), delete, status }
}

/// A pod of a ReplicaSet: its template, a generated name, the ReplicaSet as controller.
pub fn pod_for(rs: &Value) -> Value {
    let template = &rs["spec"]["template"];
    let mut meta = template["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    meta["generateName"] = json!(format!("{}-", name_of(rs)));
    meta["ownerReferences"] = owner_ref(Kind::ReplicaSet, rs);
    if let Some(m) = meta.as_object_mut() {
        m.remove("name");
        m.remove("creationTimestamp");
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]})
}

// === Deployment ===

/// What a Deployment needs done to its ReplicaSets and itself.
#[derive(Debug, Default, PartialEq)]
pub struct DeploymentPlan {
    /// A new ReplicaSet for the current template.
    pub create: Option<Value>,
    /// (ReplicaSet, new `spec.replicas`).
    pub scale: Vec<(String, i64)>,
    /// Old ReplicaSets beyond `revisionHistoryLimit`.
    pub delete: Vec<String>,
    /// The Deployment's revision annotation.
    pub revision: String,
    /// An old ReplicaSet whose template is current again (`rollout undo`): it takes the next
    /// revision, so history lists each template once.
    pub revise: Option<String>,
    pub status: Value,
}

/// Plans one step of a Deployment from the ReplicaSets it controls (their status as the
/// ReplicaSet controller last wrote it). Called again after every change, it converges.
pub fn plan_deployment(d: &Value, owned: &[&Value]) -> DeploymentPlan {
    let want = replicas(d).max(0);
    let template = &d["spec"]["template"];
    let identity = template_identity(template);
    let new_rs = owned.iter().copied().find(|rs| template_identity(&rs["spec"]["template"]) == identity);
    let mut old: Vec<&Value> = owned.iter().copied().filter(|rs| Some(*rs) != new_rs).collect();
    old.sort_by_key(|rs| revision(rs));
    let recreate = d["spec"]["strategy"]["type"] == "Recreate";
    let ru = &d["spec"]["strategy"]["rollingUpdate"];
    let int_or_str = |v: &Value| serde_json::from_value(v.clone()).ok();
    let surge_v = int_or_str(&ru["maxSurge"]);
    let unavail_v = int_or_str(&ru["maxUnavailable"]);
    let mut max_surge = i64::from(scaled_value(surge_v.as_ref(), want as i32, true));
    let mut max_unavailable = i64::from(scaled_value(unavail_v.as_ref(), want as i32, false));
    if recreate {
        (max_surge, max_unavailable) = (0, want);
    } else if max_surge == 0 && max_unavailable == 0 {
        max_unavailable = 1; // as the controller does when both round to 0
    }
    let old_total: i64 = old.iter().map(|rs| replicas(rs)).sum();
    let old_pods: i64 = old.iter().map(|rs| status_i64(rs, "replicas")).sum();
    let mut plan = DeploymentPlan::default();
    let max_revision = owned.iter().map(|rs| revision(rs)).max().unwrap_or(0);
    if d["spec"]["paused"] == true {
        return plan_paused(d, owned, new_rs, want, max_unavailable, max_revision);
    }

    // The new ReplicaSet: created, then scaled up as far as the surge allows.
    let (new_name, new_replicas, new_available) = match new_rs {
        Some(rs) => (name_of(rs), replicas(rs), status_i64(rs, "availableReplicas")),
        None => {
            let hash = template_hash(template);
            let name = format!("{}-{hash}", name_of(d));
            let initial = if recreate {
                if old_pods == 0 && old_total == 0 {
                    want
                } else {
                    0
                }
            } else {
                (want + max_surge - old_total).clamp(0, want)
            };
            let mut t = template.clone();
            t["metadata"]["labels"][POD_TEMPLATE_HASH] = json!(hash);
            let mut selector = d["spec"]["selector"].clone();
            selector["matchLabels"][POD_TEMPLATE_HASH] = json!(hash);
            let mut labels = t["metadata"]["labels"].clone();
            labels[POD_TEMPLATE_HASH] = json!(hash);
            plan.create = Some(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {
                    "name": name, "labels": labels,
                    "annotations": {REVISION_ANNOTATION: (max_revision + 1).to_string(),
                                    "deployment.kubernetes.io/desired-replicas": want.to_string(),
                                    "deployment.kubernetes.io/max-replicas": (want + max_surge).to_string()},
                    "ownerReferences": owner_ref(Kind::Deployment, d),
                },
                "spec": {"replicas": initial, "selector": selector, "template": t},
            }));
            (name, initial, 0)
        }
    };
    plan.revision = match new_rs {
        Some(rs) if revision(rs) < max_revision => {
            plan.revise = Some(name_of(rs));
            (max_revision + 1).to_string()
        }
        Some(rs) => revision(rs).to_string(),
        None => (max_revision + 1).to_string(),
    };
    if new_rs.is_some() {
        let target = if recreate {
            if old_pods == 0 && old_total == 0 {
                want
            } else {
                0
            }
        } else if new_replicas >= want {
            want // scaled down, or done
        } else {
            (want + max_surge - old_total).clamp(new_replicas, want)
        };
        if target != new_replicas {
            plan.scale.push((new_name.clone(), target));
        }
    }
    // Old ReplicaSets, oldest first: Recreate takes them to 0 at once; a rolling update first
    // drops their pods that serve nobody, then as many as availability allows.
    let mut targets: Vec<(String, i64, i64)> = old.iter().map(|rs| (name_of(rs), replicas(rs), replicas(rs))).collect();
    if recreate {
        targets.iter_mut().for_each(|t| t.2 = 0);
    } else if old_total > 0 {
        let min_available = want - max_unavailable;
        let new_unavailable = (new_replicas - new_available).max(0);
        let mut cleanup = old_total + new_replicas - min_available - new_unavailable;
        for (rs, t) in old.iter().zip(targets.iter_mut()) {
            let unhealthy = (replicas(rs) - status_i64(rs, "availableReplicas")).clamp(0, t.2);
            let down = unhealthy.min(cleanup.max(0));
            t.2 -= down;
            cleanup -= down;
        }
        let available: i64 = owned.iter().map(|rs| status_i64(rs, "availableReplicas")).sum();
        let mut budget = available - min_available;
        for t in targets.iter_mut() {
            let down = t.2.min(budget.max(0));
            t.2 -= down;
            budget -= down;
        }
    }
    plan.scale.extend(targets.into_iter().filter(|(_, from, to)| from != to).map(|(name, _, to)| (name, to)));
    // History: old ReplicaSets at zero beyond the limit, oldest first.
    let limit = d["spec"]["revisionHistoryLimit"].as_i64().unwrap_or(10).max(0) as usize;
    let idle: Vec<&&Value> = old.iter().filter(|rs| replicas(rs) == 0 && status_i64(rs, "replicas") == 0).collect();
    if idle.len() > limit {
        plan.delete = idle.iter().take(idle.len() - limit).map(|rs| name_of(rs)).collect();
    }
    plan.status = deployment_status(d, owned, new_rs, want, max_unavailable);
    plan
}

/// A paused Deployment rolls nothing out (no new ReplicaSet for a changed template, no old one
/// scaled down) but still follows `replicas`: the difference goes to the newest ReplicaSet that
/// has pods, as the controller's scaling of a paused rollout does when one ReplicaSet is active.
fn plan_paused(
    d: &Value,
    owned: &[&Value],
    new_rs: Option<&Value>,
    want: i64,
    max_unavailable: i64,
    max_revision: i64,
) -> DeploymentPlan {
    let mut plan = DeploymentPlan {
        revision: d["metadata"]["annotations"][REVISION_ANNOTATION]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| max_revision.to_string()),
        ..Default::default()
    };
    let total: i64 = owned.iter().map(|rs| replicas(rs)).sum();
    let target = new_rs
        .filter(|rs| replicas(rs) > 0)
        .or_else(|| owned.iter().copied().filter(|rs| replicas(rs) > 0).max_by_key(|rs| revision(rs)))
        .or(new_rs);
    if let Some(rs) = target {
        if total != want {
            plan.scale.push((name_of(rs), (replicas(rs) + want - total).max(0)));
        }
    }
    plan.status = deployment_status(d, owned, new_rs, want, max_unavailable);
    plan.status["conditions"][1] = json!({"type": "Progressing", "status": "Unknown", "reason": "DeploymentPaused", "message": "Deployment is paused"});
    plan
}

fn deployment_status(d: &Value, owned: &[&Value], new_rs: Option<&Value>, want: i64, max_unavailable: i64) -> Value {
    let sum = |f: &str| owned.iter().map(|rs| status_i64(rs, f)).sum::<i64>();
    let (total, ready, available) = (sum("replicas"), sum("readyReplicas"), sum("availableReplicas"));
    let updated = new_rs.map(|rs| status_i64(rs, "replicas")).unwrap_or(0);
    let new_name = new_rs.map(name_of).unwrap_or_default();
    let complete = new_rs.is_some() && updated == want && total == want && available >= want;
    let mut status = json!({
        "observedGeneration": d["metadata"]["generation"],
        "replicas": total,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": available,
    });
    if want - available > 0 {
        status["unavailableReplicas"] = json!(want - available);
    }
    let (avail_status, avail_reason, avail_msg) = if available >= want - max_unavailable {
        ("True", "MinimumReplicasAvailable", "Deployment has minimum availability.")
    } else {
        ("False", "MinimumReplicasUnavailable", "Deployment does not have minimum availability.")
    };
    let (prog_reason, prog_msg) = if complete {
        ("NewReplicaSetAvailable", format!("ReplicaSet \"{new_name}\" has successfully progressed."))
    } else {
        ("ReplicaSetUpdated", format!("ReplicaSet \"{new_name}\" is progressing."))
    };
    status["conditions"] = json!([
        {"type": "Available", "status": avail_status, "reason": avail_reason, "message": avail_msg},
        {"type": "Progressing", "status": "True", "reason": prog_reason, "message": prog_msg},
    ]);
    status
}

// === applying the plans ===

/// Conditions with times: a condition keeps its times while its status, reason and message hold.
fn with_condition_times(old: &Value, mut status: Value) -> Value {
    let now = new_time();
    if let Some(conds) = status["conditions"].as_array_mut() {
        for c in conds {
            let prev = old["status"]["conditions"].as_array().and_then(|l| l.iter().find(|p| p["type"] == c["type"]));
            match prev {
                Some(p) if p["status"] == c["status"] && p["reason"] == c["reason"] && p["message"] == c["message"] => {
                    c["lastUpdateTime"] = p["lastUpdateTime"].clone();
                    c["lastTransitionTime"] = p["lastTransitionTime"].clone();
                }
                Some(p) if p["status"] == c["status"] => {
                    c["lastUpdateTime"] = now.clone();
                    c["lastTransitionTime"] = p["lastTransitionTime"].clone();
                }
                _ => {
                    c["lastUpdateTime"] = now.clone();
                    c["lastTransitionTime"] = now.clone();
                }
            }
        }
    }
    status
}

async fn write_status(reg: &Registry, kind: Kind, obj: &Value, status: Value) -> Result<(), ApiError> {
    super::write::write_status(reg, kind, obj, with_condition_times(obj, status)).await
}

async fn set_replicas(reg: &Registry, ns: &str, name: &str, n: i64) -> Result<(), ApiError> {
    let change = |current: &Value| {
        let mut s = current.clone();
        s["spec"]["replicas"] = json!(n);
        Ok(s)
    };
    match reg.update_scale(Kind::ReplicaSet, ns, name, change, &WriteOptions::default()).await {
        Ok(_) | Err(ApiError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

async fn set_revision(reg: &Registry, ns: &str, name: &str, revision: &str) -> Result<(), ApiError> {
    let Some(rs) = reg.store.get(Kind::ReplicaSet, ns, name)? else { return Ok(()) };
    let mut new = rs.clone();
    new["metadata"]["annotations"][REVISION_ANNOTATION] = json!(revision);
    match reg.update(Kind::ReplicaSet, Some(ns), name, new, Subresource::Main, &WriteOptions::default()).await {
        Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Brings the Deployments, ReplicaSets and their pods of namespace `ns` one step closer to
/// what they ask for.
pub async fn sync_namespace(reg: &Registry, ns: &str) -> Result<(), ApiError> {
    let (deployments, _) = reg.store.list(Kind::Deployment, Some(ns))?;
    let (replicasets, _) = reg.store.list(Kind::ReplicaSet, Some(ns))?;
    let by_deployment =
        super::write::owned_or_collected(reg, Kind::ReplicaSet, ns, &replicasets, "Deployment", &deployments).await?;
    for d in deployments.iter().filter(|d| !is_terminating(d)) {
        let uid = d["metadata"]["uid"].as_str().unwrap_or("");
        let owned: Vec<&Value> = by_deployment.get(uid).cloned().unwrap_or_default();
        let plan = plan_deployment(d, &owned);
        let scaled = |name: &str, from: i64, to: i64| Report {
            component: "deployment-controller",
            host: None,
            object: d,
            kind: Kind::Deployment,
            field_path: None,
            type_: EventType::Normal,
            reason: "ScalingReplicaSet",
            message: format!("Scaled {} replica set {name} from {from} to {to}", if to > from { "up" } else { "down" }),
        };
        if let Some(rs) = plan.create {
            let (name, to) = (name_of(&rs), replicas(&rs));
            match reg.create(Kind::ReplicaSet, Some(ns), rs, &WriteOptions::default()).await {
                Ok(_) => {
                    if to > 0 {
                        record(reg, scaled(&name, 0, to)).await;
                    }
                }
                Err(ApiError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if let Some(name) = &plan.revise {
            set_revision(reg, ns, name, &plan.revision).await?;
        }
        for (name, n) in plan.scale {
            let from = owned.iter().find(|rs| name_of(rs) == name).map(|rs| replicas(rs)).unwrap_or(0);
            set_replicas(reg, ns, &name, n).await?;
            record(reg, scaled(&name, from, n)).await;
        }
        for name in plan.delete {
            delete_quietly(reg, Kind::ReplicaSet, ns, &name).await?;
        }
        if d["metadata"]["annotations"][REVISION_ANNOTATION].as_str() != Some(plan.revision.as_str()) {
            let mut new = d.clone();
            new["metadata"]["annotations"][REVISION_ANNOTATION] = json!(plan.revision);
            match reg
                .update(Kind::Deployment, Some(ns), &name_of(d), new, Subresource::Main, &WriteOptions::default())
                .await
            {
                Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        let current = reg.store.get(Kind::Deployment, ns, &name_of(d))?.unwrap_or_else(|| d.clone());
        write_status(reg, Kind::Deployment, &current, plan.status).await?;
    }

    let (replicasets, _) = reg.store.list(Kind::ReplicaSet, Some(ns))?;
    let (pods, _) = reg.store.list(Kind::Pod, Some(ns))?;
    let by_owner = super::write::owned_or_collected(reg, Kind::Pod, ns, &pods, "ReplicaSet", &replicasets).await?;
    for rs in replicasets.iter().filter(|rs| !is_terminating(rs)) {
        let uid = rs["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let owned = by_owner.get(&uid).cloned().unwrap_or_default();
        let plan = plan_replicaset(rs, &owned);
        let report = |reason: &'static str, message: String| Report {
            component: "replicaset-controller",
            host: None,
            object: rs,
            kind: Kind::ReplicaSet,
            field_path: None,
            type_: EventType::Normal,
            reason,
            message,
        };
        for _ in 0..plan.create {
            let pod = reg.create(Kind::Pod, Some(ns), pod_for(rs), &WriteOptions::default()).await?;
            record(reg, report("SuccessfulCreate", format!("Created pod: {}", name_of(&pod.object)))).await;
        }
        for name in &plan.delete {
            delete_quietly(reg, Kind::Pod, ns, name).await?;
            record(reg, report("SuccessfulDelete", format!("Deleted pod: {name}"))).await;
        }
        write_status(reg, Kind::ReplicaSet, rs, plan.status).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn deployment(replicas: i64, image: &str, strategy: Value) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "d-1", "generation": 1},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "strategy": strategy,
                "revisionHistoryLimit": 1,
                "template": {"metadata": {"labels": {"app": "web"}},
                             "spec": {"containers": [{"name": "echo", "image": image}]}},
            }
        })
    }

    fn rolling(surge: Value, unavailable: Value) -> Value {
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
    }

    /// Runs the Deployment controller against ReplicaSets whose pods start and become ready at
    /// once, checking the rollout bounds after every step; returns the ReplicaSets at rest.
    fn converge(d: &Value, mut rss: Vec<Value>, surge: i64, unavailable: i64) -> Vec<Value> {
        let want = replicas(d);
        let mut before: i64 = rss.iter().map(|r| status_i64(r, "availableReplicas")).sum();
        for step in 0..40 {
            let plan = plan_deployment(d, &rss.iter().collect::<Vec<_>>());
            if plan.create.is_none() && plan.scale.is_empty() && plan.delete.is_empty() {
                return rss;
            }
            if let Some(mut rs) = plan.create {
                rs["metadata"]["uid"] = json!(format!("rs-{step}"));
                rss.push(rs);
            }
            for (name, n) in plan.scale {
                let rs = rss.iter_mut().find(|r| name_of(r) == name).unwrap();
                rs["spec"]["replicas"] = json!(n);
            }
            rss.retain(|r| !plan.delete.contains(&name_of(r)));
            let total: i64 = rss.iter().map(replicas).sum();
            assert!(total <= want + surge, "step {step}: {total} pods > {want} + {surge}");
            // Scale-downs take effect now; new pods are counted only once they exist.
            let available: i64 = rss.iter().map(|r| replicas(r).min(status_i64(r, "availableReplicas").max(0))).sum();
            let floor = (want - unavailable).min(before);
            assert!(available >= floor, "step {step}: {available} available < {floor}");
            before = rss.iter().map(replicas).sum();
            for rs in &mut rss {
                let n = replicas(rs);
                rs["status"] = json!({"replicas": n, "readyReplicas": n, "availableReplicas": n});
            }
        }
        panic!("no convergence in 40 steps");
    }

    #[test]
    fn a_new_deployment_gets_one_replicaset_with_every_replica() {
        let d = deployment(3, "echo:v1", rolling(json!("25%"), json!("25%")));
        let rss = converge(&d, vec![], 1, 0);
        assert_eq!(rss.len(), 1);
        let rs = &rss[0];
        let hash = template_hash(&d["spec"]["template"]);
        assert_eq!(name_of(rs), format!("web-{hash}"));
        assert!(hash.len() >= 8 && hash.bytes().all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)), "{hash}");
        assert_eq!(replicas(rs), 3);
        assert_eq!(rs["spec"]["selector"]["matchLabels"][POD_TEMPLATE_HASH], json!(hash));
        assert_eq!(rs["spec"]["template"]["metadata"]["labels"][POD_TEMPLATE_HASH], json!(hash));
        assert_eq!(rs["metadata"]["ownerReferences"][0]["uid"], "d-1");
        assert_eq!(rs["metadata"]["annotations"][REVISION_ANNOTATION], "1");
        let status = plan_deployment(&d, &rss.iter().collect::<Vec<_>>()).status;
        assert_eq!(status["updatedReplicas"], 3);
        assert_eq!(status["availableReplicas"], 3);
        assert_eq!(status["conditions"][1]["reason"], "NewReplicaSetAvailable");
    }

    #[test]
    fn rolling_updates_stay_within_surge_and_unavailability() {
        for (replicas_, surge, unavailable, s, u) in [
            (4, json!("25%"), json!("25%"), 1, 1),
            (3, json!(1), json!(0), 1, 0),
            (3, json!(0), json!(1), 0, 1),
            (10, json!("50%"), json!("20%"), 5, 2),
        ] {
            let v1 = deployment(replicas_, "echo:v1", rolling(surge.clone(), unavailable.clone()));
            let at_v1 = converge(&v1, vec![], s, u);
            let v2 = deployment(replicas_, "echo:v2", rolling(surge, unavailable));
            let at_v2 = converge(&v2, at_v1, s, u);
            // The new ReplicaSet has everything; the old one is kept at 0 (history limit 1).
            assert_eq!(at_v2.len(), 2, "{replicas_}/{s}/{u}");
            let new = at_v2.iter().find(|r| r["spec"]["template"]["spec"]["containers"][0]["image"] == "echo:v2");
            assert_eq!(new.map(replicas), Some(replicas_));
            assert_eq!(new.map(revision), Some(2));
            assert_eq!(at_v2.iter().map(replicas).sum::<i64>(), replicas_);
        }
    }

    #[test]
    fn recreate_empties_the_old_replicaset_before_starting_the_new() {
        let v1 = deployment(2, "echo:v1", json!({"type": "Recreate"}));
        let at_v1 = converge(&v1, vec![], 0, 2);
        let v2 = deployment(2, "echo:v2", json!({"type": "Recreate"}));
        let plan = plan_deployment(&v2, &at_v1.iter().collect::<Vec<_>>());
        assert_eq!(plan.create.as_ref().map(replicas), Some(0), "new ReplicaSet waits");
        assert_eq!(plan.scale, vec![(name_of(&at_v1[0]), 0)]);
    }

    #[test]
    fn scaling_changes_only_the_current_replicaset() {
        let d = deployment(2, "echo:v1", rolling(json!("25%"), json!("25%")));
        let rss = converge(&d, vec![], 1, 0);
        let scaled = deployment(5, "echo:v1", rolling(json!("25%"), json!("25%")));
        let plan = plan_deployment(&scaled, &rss.iter().collect::<Vec<_>>());
        assert_eq!(plan.create, None);
        assert_eq!(plan.scale, vec![(name_of(&rss[0]), 5)]);
    }

    #[test]
    fn undo_reuses_the_old_replicaset_under_the_next_revision() {
        let v1 = deployment(2, "echo:v1", rolling(json!("25%"), json!("25%")));
        let at_v1 = converge(&v1, vec![], 1, 1);
        let v2 = deployment(2, "echo:v2", rolling(json!("25%"), json!("25%")));
        let mut at_v2 = converge(&v2, at_v1.clone(), 1, 1);
        // `rollout undo` writes v1's template back, with a null creationTimestamp.
        let mut undone = v1.clone();
        undone["spec"]["template"]["metadata"]["creationTimestamp"] = Value::Null;
        let plan = plan_deployment(&undone, &at_v2.iter().collect::<Vec<_>>());
        assert_eq!(plan.create, None, "no new ReplicaSet");
        assert_eq!((plan.revise.as_deref(), plan.revision.as_str()), (Some(name_of(&at_v1[0]).as_str()), "3"));
        for rs in at_v2.iter_mut().filter(|r| name_of(r) == name_of(&at_v1[0])) {
            rs["metadata"]["annotations"][REVISION_ANNOTATION] = json!("3");
        }
        let plan = plan_deployment(&undone, &at_v2.iter().collect::<Vec<_>>());
        assert_eq!((plan.revise, plan.revision.as_str()), (None, "3"), "settled");
    }

    #[test]
    fn a_paused_deployment_scales_but_does_not_roll_out() {
        let v1 = deployment(2, "echo:v1", rolling(json!("25%"), json!("25%")));
        let at_v1 = converge(&v1, vec![], 1, 1);
        let mut v2 = deployment(4, "echo:v2", rolling(json!("25%"), json!("25%")));
        v2["spec"]["paused"] = json!(true);
        let plan = plan_deployment(&v2, &at_v1.iter().collect::<Vec<_>>());
        assert_eq!(plan.create, None);
        assert_eq!(plan.scale, vec![(name_of(&at_v1[0]), 4)]);
        assert_eq!(plan.status["conditions"][1]["reason"], "DeploymentPaused");
    }

    #[test]
    fn history_beyond_the_limit_is_deleted() {
        let v1 = deployment(1, "echo:v1", rolling(json!(1), json!(0)));
        let rss = converge(&v1, vec![], 1, 0);
        let rss = converge(&deployment(1, "echo:v2", rolling(json!(1), json!(0))), rss, 1, 0);
        let rss = converge(&deployment(1, "echo:v3", rolling(json!(1), json!(0))), rss, 1, 0);
        let images: BTreeSet<String> =
            rss.iter().map(|r| r["spec"]["template"]["spec"]["containers"][0]["image"].to_string()).collect();
        assert_eq!(images, BTreeSet::from(["\"echo:v2\"".to_string(), "\"echo:v3\"".to_string()]));
    }

    fn pod(name: &str, node: Option<&str>, ready: bool, created: &str) -> Value {
        json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        })
    }

    #[test]
    fn a_replicaset_adds_missing_pods_and_removes_the_least_useful() {
        let rs = json!({"metadata": {"name": "web-abc", "uid": "rs-1", "generation": 3},
                        "spec": {"replicas": 2, "template": {"metadata": {"labels": {"app": "web"}},
                                 "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
        let plan = plan_replicaset(&rs, &[]);
        assert_eq!((plan.create, plan.delete.len()), (2, 0));
        let p = pod_for(&rs);
        assert_eq!(p["metadata"]["generateName"], "web-abc-");
        assert_eq!(p["metadata"]["labels"]["app"], "web");
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "ReplicaSet");

        let pods = [
            pod("a", Some("node-1"), true, "2026-01-01T00:00:00Z"),
            pod("b", Some("node-1"), true, "2026-01-01T00:00:05Z"),
            pod("c", None, false, "2026-01-01T00:00:01Z"),
            pod("d", Some("node-2"), false, "2026-01-01T00:00:02Z"),
        ];
        let plan = plan_replicaset(&rs, &pods.iter().collect::<Vec<_>>());
        assert_eq!(plan.create, 0);
        assert_eq!(plan.delete, ["c", "d"], "unscheduled first, then not ready");
        assert_eq!(plan.status["replicas"], 2);
        assert_eq!(plan.status["readyReplicas"], 2);
        assert_eq!(plan.status["observedGeneration"], 3);
        let mut terminating = pod("e", Some("node-1"), true, "2026-01-01T00:00:00Z");
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        let plan = plan_replicaset(&rs, &[&pods[0], &terminating]);
        assert_eq!(plan.create, 1, "a terminating pod does not count");
    }
}
