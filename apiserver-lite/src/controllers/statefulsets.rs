//! The StatefulSet controller, as kube-controller-manager's: pods `<set>-<ordinal>` with a
//! stable hostname and the governing Service as their subdomain (so
//! `<set>-0.<service>.<ns>.svc.cluster.local` names the pod), created in order and each only
//! once the one before is Running and Ready (`OrderedReady`), or all at once (`Parallel`);
//! removed from the highest ordinal down; a changed template rolled out from the highest
//! ordinal down to `partition`, one pod at a time, each only when every pod is ready
//! (`OnDelete`: only pods deleted by hand are replaced); the status and the Events.
//! [`plan_statefulset`] decides (pure); [`sync_namespace`] reads and writes.
//!
//! Each pod's claims (`<template>-<pod>`, from `volumeClaimTemplates`) are made before the pod
//! and kept after it, unless `persistentVolumeClaimRetentionPolicy` says `Delete`: `whenScaled`
//! removes the claims of pods scaled away, `whenDeleted` those of a deleted set (the claims
//! carry the set as owner, as upstream marks them). [`plan_claims`] decides those.
//!
//! Its templates are kept as ControllerRevisions ([`super::revisions`]: `kubectl rollout
//! history|undo sts`); a pod below `partition` made again gets its current revision's template;
//! `minReadySeconds` counts a pod available (and lets the rollout go on) only that long after it
//! became ready. `rollingUpdate.maxUnavailable` (an alpha feature upstream, off by default) is
//! not read: one pod at a time, as a default cluster does.

use std::collections::{BTreeMap, BTreeSet};

use api::Kind;
use serde_json::{json, Value};

use super::events::{record, EventType};
use super::revisions;
use super::workloads::template_hash;
use super::write::{
    controller_of, delete_quietly, is_terminating, ns_name, owned_or_collected, reporter, write_status,
};
use crate::error::ApiError;
use crate::registry::{Registry, WriteOptions};

pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// What a StatefulSet needs done.
#[derive(Debug, Default, PartialEq)]
pub struct SetPlan {
    pub create: Vec<Value>,
    pub delete: Vec<String>,
    pub status: Value,
    /// When a pod becomes available (`minReadySeconds`): look again then.
    pub wake_at: Option<jiff::Timestamp>,
}

fn running_and_ready(p: &Value) -> bool {
    p.pointer("/status/phase").and_then(Value::as_str) == Some("Running")
        && p.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn ended(p: &Value) -> bool {
    matches!(p.pointer("/status/phase").and_then(Value::as_str), Some("Succeeded" | "Failed"))
}

/// The ordinal of a pod of set `name` (`web-3` → 3).
fn ordinal(set: &str, pod: &str) -> Option<i64> {
    let n = pod.strip_prefix(set)?.strip_prefix('-')?;
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0')))
        .then(|| n.parse().ok())
        .flatten()
}

/// The revision name of the set's current template (`web-<hash>`).
pub fn revision(sts: &Value) -> String {
    format!("{}-{}", sts["metadata"]["name"].as_str().unwrap_or(""), template_hash(&sts["spec"]["template"]))
}

/// Pod `ordinal` of set `sts`.
pub fn pod_for(sts: &Value, ordinal: i64) -> Value {
    pod_of_revision(sts, ordinal, &sts["spec"]["template"], &revision(sts))
}

/// Pod `ordinal` of set `sts` made from `template`, revision `rev` (an older one's, for pods
/// below the partition).
fn pod_of_revision(sts: &Value, ordinal: i64, template: &Value, rev: &str) -> Value {
    let set = sts["metadata"]["name"].as_str().unwrap_or("");
    let name = format!("{set}-{ordinal}");
    let mut meta = template["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    if let Some(m) = meta.as_object_mut() {
        m.remove("generateName");
        m.remove("creationTimestamp");
    }
    meta["name"] = json!(name);
    meta["labels"][POD_NAME_LABEL] = json!(name);
    meta["labels"][POD_INDEX_LABEL] = json!(ordinal.to_string());
    meta["labels"][REVISION_LABEL] = json!(rev);
    meta["ownerReferences"] = json!([{
        "apiVersion": "apps/v1", "kind": "StatefulSet", "name": set, "uid": sts["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    }]);
    let mut spec = template["spec"].clone();
    spec["hostname"] = json!(name);
    if let Some(service) = sts["spec"]["serviceName"].as_str().filter(|s| !s.is_empty()) {
        spec["subdomain"] = json!(service);
    }
    // Each claim template becomes the pod's volume of the same name, on its own claim.
    for t in sts["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten() {
        let Some(claim) = t["metadata"]["name"].as_str() else { continue };
        let mut volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
        volumes.retain(|v| v["name"] != claim);
        volumes.push(json!({"name": claim, "persistentVolumeClaim": {"claimName": format!("{claim}-{name}")}}));
        spec["volumes"] = json!(volumes);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// What StatefulSet `sts` needs done, given its pods. Pure.
pub fn plan_statefulset(sts: &Value, pods: &[&Value]) -> SetPlan {
    plan_statefulset_with(sts, pods, None, jiff::Timestamp::UNIX_EPOCH)
}

/// [`plan_statefulset`], with the template of the set's current revision (from its
/// ControllerRevision): a pod below the partition that must be made again is made from it, as
/// upstream restores it. Pure.
pub fn plan_statefulset_with(
    sts: &Value,
    pods: &[&Value],
    current_template: Option<&Value>,
    now: jiff::Timestamp,
) -> SetPlan {
    let set = sts["metadata"]["name"].as_str().unwrap_or("");
    let replicas = sts["spec"]["replicas"].as_i64().unwrap_or(1).max(0);
    let parallel = sts["spec"]["podManagementPolicy"] == "Parallel";
    let on_delete = sts["spec"]["updateStrategy"]["type"] == "OnDelete";
    let partition = sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"].as_i64().unwrap_or(0);
    let update_revision = revision(sts);
    let current_revision = sts["status"]["currentRevision"].as_str().unwrap_or("").to_string();
    // Below the partition, a pod made again keeps the current revision (not OnDelete's).
    let make = |i: i64| match current_template {
        Some(t)
            if !on_delete && i < partition && !current_revision.is_empty() && current_revision != update_revision =>
        {
            pod_of_revision(sts, i, t, &current_revision)
        }
        _ => pod_for(sts, i),
    };
    let mut plan = SetPlan::default();
    let mut by_ordinal: BTreeMap<i64, &Value> = BTreeMap::new();
    for p in pods {
        if let Some(i) = ordinal(set, &ns_name(p).1) {
            by_ordinal.insert(i, p);
        }
    }
    let rev_of = |p: &Value| p["metadata"]["labels"][REVISION_LABEL].as_str().unwrap_or("").to_string();

    // Pods that ended are replaced (a stateful pod is restarted under its name).
    let mut blocked = false;
    for (&i, p) in &by_ordinal {
        if i < replicas && ended(p) && !is_terminating(p) {
            plan.delete.push(ns_name(p).1);
            blocked |= !parallel;
        }
    }
    // Scale up: the missing ordinals in order; OrderedReady waits for each to be ready.
    if !blocked {
        for i in 0..replicas {
            match by_ordinal.get(&i) {
                None => {
                    plan.create.push(make(i));
                    if !parallel {
                        blocked = true;
                        break;
                    }
                }
                Some(p) if !parallel && (!running_and_ready(p) || is_terminating(p)) => {
                    blocked = true;
                    break;
                }
                Some(_) => {}
            }
        }
    }
    // Scale down: the highest ordinals first; OrderedReady one at a time, once the rest are ready.
    let condemned: Vec<(&i64, &&Value)> = by_ordinal.iter().filter(|(i, _)| **i >= replicas).rev().collect();
    if !blocked {
        if parallel {
            plan.delete.extend(condemned.iter().filter(|(_, p)| !is_terminating(p)).map(|(_, p)| ns_name(p).1));
        } else if let Some((_, p)) = condemned.first() {
            if !is_terminating(p) {
                plan.delete.push(ns_name(p).1);
            }
            blocked = true;
        }
    } else {
        blocked = true;
    }
    // The rolling update: once every pod is there and ready, the highest outdated ordinal at
    // or above the partition goes (it is recreated from the new template).
    // Available: ready for `minReadySeconds` (a rolling update waits for every pod to be).
    let min_ready = jiff::SignedDuration::from_secs(sts["spec"]["minReadySeconds"].as_i64().unwrap_or(0).max(0));
    let mut wake: Option<jiff::Timestamp> = None;
    let mut available = |p: &Value| {
        if !running_and_ready(p) {
            return false;
        }
        if min_ready.is_zero() {
            return true;
        }
        match super::write::ready_since(p) {
            Some(t) if t + min_ready <= now => true,
            Some(t) => {
                let at = t + min_ready;
                wake = Some(wake.map_or(at, |w: jiff::Timestamp| w.min(at)));
                false
            }
            None => false,
        }
    };
    let all_ready = (0..replicas).all(|i| by_ordinal.get(&i).is_some_and(|p| !is_terminating(p) && available(p)));
    if !on_delete && !blocked && all_ready && condemned.is_empty() {
        if let Some((_, p)) =
            by_ordinal.iter().rfind(|(i, p)| **i < replicas && **i >= partition && rev_of(p) != update_revision)
        {
            plan.delete.push(ns_name(p).1);
        }
    }

    let live: Vec<&Value> = by_ordinal.values().filter(|p| !is_terminating(p)).copied().collect();
    let ready = live.iter().filter(|p| running_and_ready(p)).count();
    let available_count = live.iter().filter(|p| available(p)).count();
    let updated = live.iter().filter(|p| rev_of(p) == update_revision).count();
    // The current revision: the update's once every replica has it, else the oldest in use.
    let old_status = &sts["status"];
    let current_revision = if updated as i64 >= replicas && ready as i64 >= replicas {
        update_revision.clone()
    } else {
        old_status["currentRevision"].as_str().map(String::from).unwrap_or_else(|| update_revision.clone())
    };
    let current = live.iter().filter(|p| rev_of(p) == current_revision).count();
    plan.status = json!({
        "observedGeneration": sts["metadata"]["generation"].as_i64().unwrap_or(1),
        "replicas": live.len(),
        "readyReplicas": ready,
        "availableReplicas": available_count,
        "currentReplicas": current,
        "updatedReplicas": updated,
        "currentRevision": current_revision,
        "updateRevision": update_revision,
        "collisionCount": 0,
    });
    plan.wake_at = wake;
    plan
}

/// The claims a set's pods need: those of the pods about to be made that do not exist yet
/// (created first), and, for `whenScaled: Delete`, those of ordinals scaled away whose pod is
/// gone. Pure.
pub fn plan_claims(
    sts: &Value,
    creating: &[Value],
    pods: &[&Value],
    claims: &BTreeSet<String>,
) -> (Vec<Value>, Vec<String>) {
    let set = sts["metadata"]["name"].as_str().unwrap_or("");
    let templates: Vec<&Value> = sts["spec"]["volumeClaimTemplates"].as_array().into_iter().flatten().collect();
    let policy = &sts["spec"]["persistentVolumeClaimRetentionPolicy"];
    let mut create = vec![];
    for pod in creating {
        let pod_name = ns_name(pod).1;
        for t in &templates {
            let Some(template) = t["metadata"]["name"].as_str() else { continue };
            let name = format!("{template}-{pod_name}");
            if claims.contains(&name) {
                continue;
            }
            let mut meta = t["metadata"].clone();
            meta["name"] = json!(name);
            for k in ["namespace", "generateName", "creationTimestamp", "resourceVersion", "uid"] {
                meta.as_object_mut().map(|m| m.remove(k));
            }
            // The set's selector labels, as upstream gives its claims.
            for (k, v) in sts["spec"]["selector"]["matchLabels"].as_object().into_iter().flatten() {
                meta["labels"][k] = v.clone();
            }
            if policy["whenDeleted"] == "Delete" {
                meta["ownerReferences"] = json!([{
                    "apiVersion": "apps/v1", "kind": "StatefulSet", "name": set, "uid": sts["metadata"]["uid"],
                    "controller": true, "blockOwnerDeletion": true,
                }]);
            }
            create.push(
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": t["spec"]}),
            );
        }
    }
    let mut delete = vec![];
    if policy["whenScaled"] == "Delete" {
        let replicas = sts["spec"]["replicas"].as_i64().unwrap_or(1).max(0);
        let live: BTreeSet<i64> = pods.iter().filter_map(|p| ordinal(set, &ns_name(p).1)).collect();
        for claim in claims {
            for t in &templates {
                let Some(template) = t["metadata"]["name"].as_str() else { continue };
                let ord =
                    claim.strip_prefix(template).and_then(|r| r.strip_prefix('-')).and_then(|pod| ordinal(set, pod));
                if ord.is_some_and(|i| i >= replicas && !live.contains(&i)) {
                    delete.push(claim.clone());
                }
            }
        }
    }
    (create, delete)
}

/// Brings the StatefulSets of namespace `ns` one step closer to what they ask for; returns
/// when one must be looked at again (a pod becoming available), if any.
pub async fn sync_namespace(reg: &Registry, ns: &str) -> Result<Option<jiff::Timestamp>, ApiError> {
    let (sets, _) = reg.store.list(Kind::StatefulSet, Some(ns))?;
    let (pods, _) = reg.store.list(Kind::Pod, Some(ns))?;
    let (claims, _) = reg.store.list(Kind::PersistentVolumeClaim, Some(ns))?;
    let (revisions, _) = reg.store.list(Kind::ControllerRevision, Some(ns))?;
    owned_or_collected(reg, Kind::ControllerRevision, ns, &revisions, "StatefulSet", &sets).await?;
    let uids: BTreeSet<&str> = sets.iter().filter_map(|s| s["metadata"]["uid"].as_str()).collect();
    // `whenDeleted: Delete`: the claims of a gone set go with it.
    for c in &claims {
        if let Some((kind, uid)) = controller_of(&c["metadata"]) {
            if kind == "StatefulSet" && !uids.contains(uid.as_str()) && !is_terminating(c) {
                delete_quietly(reg, Kind::PersistentVolumeClaim, ns, &ns_name(c).1).await?;
            }
        }
    }
    let claim_names: BTreeSet<String> = claims.iter().filter(|c| !is_terminating(c)).map(|c| ns_name(c).1).collect();
    let now = jiff::Timestamp::now();
    let mut wake: Option<jiff::Timestamp> = None;
    let owned = owned_or_collected(reg, Kind::Pod, ns, &pods, "StatefulSet", &sets).await?;
    for sts in sets.iter().filter(|s| !is_terminating(s)) {
        let uid = sts["metadata"]["uid"].as_str().unwrap_or("");
        let mine = owned.get(uid).cloned().unwrap_or_default();
        // The current revision's template, for pods below the partition made again.
        let current_template = sts["status"]["currentRevision"].as_str().and_then(|cur| {
            revisions.iter().find(|r| ns_name(r).1 == cur).map(|r| {
                let mut t = r["data"]["spec"]["template"].clone();
                t.as_object_mut().map(|o| o.remove("$patch"));
                t
            })
        });
        let plan = plan_statefulset_with(sts, &mine, current_template.as_ref(), now);
        if let Some(w) = plan.wake_at {
            wake = Some(wake.map_or(w, |x: jiff::Timestamp| x.min(w)));
        }
        let in_use: BTreeSet<String> =
            mine.iter().filter_map(|p| p["metadata"]["labels"][REVISION_LABEL].as_str().map(String::from)).collect();
        let hash = template_hash(&sts["spec"]["template"]);
        revisions::sync(reg, sts, "StatefulSet", &revision(sts), &hash, &revisions, &in_use).await?;
        let (new_claims, gone_claims) = plan_claims(sts, &plan.create, &mine, &claim_names);
        let set = ns_name(sts).1;
        let report = reporter("statefulset-controller", Kind::StatefulSet, sts);
        let mut claims_failed = false;
        for claim in new_claims {
            let name = ns_name(&claim).1;
            let pod = name.rsplit_once(&format!("-{set}-")).map(|(_, o)| format!("{set}-{o}")).unwrap_or_default();
            match reg.create(Kind::PersistentVolumeClaim, Some(ns), claim, &WriteOptions::default()).await {
                Ok(_) | Err(ApiError::AlreadyExists { .. }) => {
                    let message = format!("create Claim {name} Pod {pod} in StatefulSet {set} success");
                    record(reg, report(EventType::Normal, "SuccessfulCreate", message)).await;
                }
                Err(e) => {
                    claims_failed = true;
                    let message = format!("create Claim {name} for Pod {pod} in StatefulSet {set} failed error: {e}");
                    record(reg, report(EventType::Warning, "FailedCreate", message)).await;
                }
            }
        }
        for name in gone_claims {
            delete_quietly(reg, Kind::PersistentVolumeClaim, ns, &name).await?;
        }
        // A pod is made only once its claims are.
        for pod in plan.create.into_iter().filter(|_| !claims_failed) {
            let name = ns_name(&pod).1;
            match reg.create(Kind::Pod, Some(ns), pod, &WriteOptions::default()).await {
                Ok(_) => {
                    let message = format!("create Pod {name} in StatefulSet {set} successful");
                    record(reg, report(EventType::Normal, "SuccessfulCreate", message)).await;
                }
                // The old pod of that name is still being deleted: the next pass makes it.
                Err(ApiError::AlreadyExists { .. }) => {}
                Err(e) => {
                    let message = format!("create Pod {name} in StatefulSet {set} failed error: {e}");
                    record(reg, report(EventType::Warning, "FailedCreate", message)).await;
                }
            }
        }
        for name in &plan.delete {
            delete_quietly(reg, Kind::Pod, ns, name).await?;
            let message = format!("delete Pod {name} in StatefulSet {set} successful");
            record(reg, report(EventType::Normal, "SuccessfulDelete", message)).await;
        }
        write_status(reg, Kind::StatefulSet, sts, plan.status).await?;
    }
    Ok(wake)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sts(replicas: i64, extra: Value) -> Value {
        let mut s = json!({"metadata": {"namespace": "default", "name": "web", "uid": "s1", "generation": 3},
            "spec": {"replicas": replicas, "serviceName": "nginx", "selector": {"matchLabels": {"app": "nginx"}},
                     "template": {"metadata": {"labels": {"app": "nginx"}},
                                  "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}},
                     "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}},
            "status": {}});
        if let (Some(o), Some(e)) = (s["spec"].as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                o.insert(k.clone(), v.clone());
            }
        }
        s
    }

    fn pod(name: &str, rev: &str, ready: bool) -> Value {
        json!({"metadata": {"namespace": "default", "name": name, "labels": {REVISION_LABEL: rev}},
               "status": {"phase": "Running",
                          "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    fn names(v: &[Value]) -> Vec<String> {
        v.iter().map(|p| p["metadata"]["name"].as_str().unwrap().to_string()).collect()
    }

    #[test]
    fn ordered_ready_pods_come_one_at_a_time_with_stable_names_and_go_in_reverse() {
        let s = sts(3, json!({}));
        let rev = revision(&s);
        let plan = plan_statefulset(&s, &[]);
        assert_eq!(names(&plan.create), ["web-0"]);
        let p0 = &plan.create[0];
        assert_eq!((p0["spec"]["hostname"].as_str(), p0["spec"]["subdomain"].as_str()), (Some("web-0"), Some("nginx")));
        assert_eq!(p0["metadata"]["labels"][POD_NAME_LABEL], "web-0");
        assert_eq!(p0["metadata"]["labels"][POD_INDEX_LABEL], "0");
        // web-0 not ready yet: nothing more.
        let w0 = pod("web-0", &rev, false);
        assert!(plan_statefulset(&s, &[&w0]).create.is_empty());
        let w0 = pod("web-0", &rev, true);
        assert_eq!(names(&plan_statefulset(&s, &[&w0]).create), ["web-1"]);
        // Scale down from 3 to 1: web-2 first, then web-1.
        let (w1, w2) = (pod("web-1", &rev, true), pod("web-2", &rev, true));
        let one = sts(1, json!({}));
        assert_eq!(plan_statefulset(&one, &[&w0, &w1, &w2]).delete, ["web-2"]);
        assert_eq!(plan_statefulset(&one, &[&w0, &w1]).delete, ["web-1"]);
        let plan = plan_statefulset(&s, &[&w0, &w1, &w2]);
        assert_eq!(
            (plan.status["readyReplicas"].as_i64(), plan.status["updatedReplicas"].as_i64()),
            (Some(3), Some(3))
        );
        assert_eq!(plan.status["currentRevision"], plan.status["updateRevision"]);
        // Parallel: all at once.
        let par = sts(3, json!({"podManagementPolicy": "Parallel"}));
        assert_eq!(names(&plan_statefulset(&par, &[]).create), ["web-0", "web-1", "web-2"]);
    }

    #[test]
    fn a_new_template_rolls_from_the_highest_ordinal_down_to_the_partition() {
        let old = sts(3, json!({}));
        let old_rev = revision(&old);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
        new["status"]["currentRevision"] = json!(old_rev);
        let new_rev = revision(&new);
        let (w0, w1, w2) = (pod("web-0", &old_rev, true), pod("web-1", &old_rev, true), pod("web-2", &old_rev, true));
        assert_eq!(plan_statefulset(&new, &[&w0, &w1, &w2]).delete, ["web-2"]);
        // web-2 recreated, not ready yet: wait.
        let n2 = pod("web-2", &new_rev, false);
        assert!(plan_statefulset(&new, &[&w0, &w1, &n2]).delete.is_empty());
        let n2 = pod("web-2", &new_rev, true);
        let plan = plan_statefulset(&new, &[&w0, &w1, &n2]);
        assert_eq!(plan.delete, ["web-1"]);
        assert_eq!(plan.status["currentRevision"], json!(old_rev));
        assert_eq!(plan.status["updatedReplicas"], 1);
        // A partition of 2 keeps web-0 and web-1 on the old template.
        let mut part = new.clone();
        part["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(2);
        assert!(plan_statefulset(&part, &[&w0, &w1, &n2]).delete.is_empty());
        // Claim templates become the pods' volumes, one claim per pod.
        let claims = sts(1, json!({"volumeClaimTemplates": [{"metadata": {"name": "www"}}]}));
        let p = &plan_statefulset(&claims, &[]).create[0];
        assert_eq!(
            p["spec"]["volumes"][0],
            json!({"name": "www", "persistentVolumeClaim": {"claimName": "www-web-0"}})
        );
        assert_eq!(ordinal("web", "web-10"), Some(10));
        assert_eq!(ordinal("web", "web-01"), None);
        assert_eq!(ordinal("web", "webby-1"), None);
    }

    #[test]
    fn claims_come_before_their_pods_and_go_as_the_retention_policy_says() {
        let templates = json!({"volumeClaimTemplates": [{"metadata": {"name": "www"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]});
        let s = sts(2, templates.clone());
        let plan = plan_statefulset(&s, &[]);
        let (create, delete) = plan_claims(&s, &plan.create, &[], &BTreeSet::new());
        assert_eq!(names(&create), ["www-web-0"]);
        assert_eq!(create[0]["metadata"]["labels"]["app"], "nginx", "the selector's labels");
        assert!(create[0]["metadata"].get("ownerReferences").is_none(), "Retain: the claim outlives the set");
        assert!(delete.is_empty());
        let have: BTreeSet<String> = ["www-web-0".to_string()].into();
        assert!(plan_claims(&s, &plan.create, &[], &have).0.is_empty(), "made already");
        // whenScaled: Delete, scaled from 2 to 1: web-1's claim goes once web-1 is gone.
        let mut scaled = sts(1, templates);
        scaled["spec"]["persistentVolumeClaimRetentionPolicy"] =
            json!({"whenDeleted": "Delete", "whenScaled": "Delete"});
        let have: BTreeSet<String> = ["www-web-0".to_string(), "www-web-1".to_string()].into();
        let rev = revision(&scaled);
        let (w0, w1) = (pod("web-0", &rev, true), pod("web-1", &rev, true));
        assert!(plan_claims(&scaled, &[], &[&w0, &w1], &have).1.is_empty(), "web-1 still there");
        assert_eq!(plan_claims(&scaled, &[], &[&w0], &have).1, ["www-web-1"]);
        let (create, _) = plan_claims(&scaled, &[pod_for(&scaled, 0)], &[], &BTreeSet::new());
        assert_eq!(create[0]["metadata"]["ownerReferences"][0]["kind"], "StatefulSet", "whenDeleted: Delete");
    }

    #[test]
    fn a_pod_below_the_partition_made_again_keeps_its_revision() {
        let old = sts(3, json!({}));
        let old_rev = revision(&old);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
        new["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(2);
        new["status"]["currentRevision"] = json!(old_rev);
        let new_rev = revision(&new);
        // web-1 was deleted by hand; web-2 runs the new template already.
        let (w0, w2) = (pod("web-0", &old_rev, true), pod("web-2", &new_rev, true));
        let plan = plan_statefulset_with(&new, &[&w0, &w2], Some(&old["spec"]["template"]), jiff::Timestamp::now());
        assert_eq!(names(&plan.create), ["web-1"]);
        assert_eq!(plan.create[0]["metadata"]["labels"][REVISION_LABEL], json!(old_rev));
        assert_eq!(plan.create[0]["spec"]["containers"][0]["image"], "nginx");
        // Without the partition it gets the new one.
        let mut all = new.clone();
        all["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
        let plan = plan_statefulset_with(&all, &[&w0, &w2], Some(&old["spec"]["template"]), jiff::Timestamp::now());
        assert_eq!(plan.create[0]["metadata"]["labels"][REVISION_LABEL], json!(new_rev));
    }

    #[test]
    fn min_ready_seconds_holds_the_rollout_until_every_pod_is_available() {
        let mut old = sts(2, json!({}));
        old["spec"]["minReadySeconds"] = json!(30);
        let old_rev = revision(&old);
        let mut new = old.clone();
        new["spec"]["template"]["spec"]["containers"][0]["image"] = json!("nginx:2");
        let ready_at = |name: &str| {
            let mut p = pod(name, &old_rev, true);
            p["status"]["conditions"][0]["lastTransitionTime"] = json!("2026-11-27T03:00:00Z");
            p
        };
        let (w0, w1) = (ready_at("web-0"), ready_at("web-1"));
        let early: jiff::Timestamp = "2026-11-27T03:00:10Z".parse().unwrap();
        let plan = plan_statefulset_with(&new, &[&w0, &w1], None, early);
        assert!(plan.delete.is_empty(), "not available yet");
        assert_eq!(plan.status["availableReplicas"], 0);
        assert_eq!(plan.status["readyReplicas"], 2);
        assert_eq!(plan.wake_at, Some("2026-11-27T03:00:30Z".parse().unwrap()));
        let later: jiff::Timestamp = "2026-11-27T03:00:31Z".parse().unwrap();
        let plan = plan_statefulset_with(&new, &[&w0, &w1], None, later);
        assert_eq!(plan.delete, ["web-1"]);
        assert_eq!(plan.status["availableReplicas"], 2);
    }
}
