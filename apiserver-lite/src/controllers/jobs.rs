//! The Job controller, as kube-controller-manager's: pods made from the template until
//! `completions` succeed (`parallelism` at a time; `Indexed` jobs one pod per index), failures
//! counted against `backoffLimit` with the real back-off before a replacement (10 s, doubling,
//! 6 min at most), `activeDeadlineSeconds`, `suspend`, the conditions (`SuccessCriteriaMet`
//! and `Complete`, `FailureTarget` and `Failed`) with their reasons, the Events, and
//! `ttlSecondsAfterFinished`; `podFailurePolicy` (a failed pod's exit codes or conditions fail
//! the Job, fail its index, are ignored or counted), `backoffLimitPerIndex` and
//! `maxFailedIndexes` (`failedIndexes`), `successPolicy`, `podReplacementPolicy`, and under
//! `restartPolicy: OnFailure` the containers' restarts counted against `backoffLimit`. [`plan_job`] decides (pure: the Job, its pods and the time in, a
//! plan out); [`sync_namespace`] reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use api::Kind;
use jiff::Timestamp;
use serde_json::{json, Value};

use super::events::{record, EventType};
use super::write::{delete_quietly, ns_name, owned_or_collected, reporter, stamp, time, write_status};
use crate::error::ApiError;
use crate::registry::{Registry, WriteOptions};

/// The annotation (and label) carrying an Indexed Job's pod index.
pub const INDEX_ANNOTATION: &str = "batch.kubernetes.io/job-completion-index";

/// What a Job needs done.
#[derive(Debug, Default, PartialEq)]
pub struct JobPlan {
    /// Pods to create.
    pub create: Vec<Value>,
    /// Pods to delete (the active pods of a Job that finished, failed or is suspended).
    pub delete: Vec<String>,
    /// The Job's status.
    pub status: Value,
    /// Events on the Job: (type, reason, message).
    pub events: Vec<(EventType, &'static str, String)>,
    /// `ttlSecondsAfterFinished` has passed: the Job (and its pods) go.
    pub expired: bool,
    /// When to look again (a back-off or deadline ends), if sooner than the next event.
    pub wake_at: Option<Timestamp>,
}

fn phase(p: &Value) -> &str {
    p.pointer("/status/phase").and_then(Value::as_str).unwrap_or("")
}

fn index_of(p: &Value) -> Option<i64> {
    p.pointer("/metadata/annotations")?.get(INDEX_ANNOTATION)?.as_str()?.parse().ok()
}

fn has_condition(job: &Value, type_: &str) -> bool {
    job.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

/// When a pod ended: its containers' `finishedAt`, else its Ready condition's last transition.
fn finished_at(p: &Value) -> Option<Timestamp> {
    let from_containers = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| time(&c["state"]["terminated"]["finishedAt"]))
        .max();
    from_containers.or_else(|| {
        p.pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .and_then(|c| time(&c["lastTransitionTime"]))
    })
}

/// `0-2,4`: indexes as the status's `completedIndexes` writes them.
pub fn index_ranges(done: &BTreeSet<i64>) -> String {
    let mut out: Vec<String> = vec![];
    let mut it = done.iter().copied().peekable();
    while let Some(start) = it.next() {
        let mut end = start;
        while it.peek() == Some(&(end + 1)) {
            end = it.next().unwrap_or(end);
        }
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
    }
    out.join(",")
}

/// A pod of the Job (for `index` when Indexed), as the controller makes it.
pub fn pod_for(job: &Value, index: Option<i64>) -> Value {
    let name = job["metadata"]["name"].as_str().unwrap_or("");
    let uid = job["metadata"]["uid"].as_str().unwrap_or("");
    let template = &job["spec"]["template"];
    let mut meta = template["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    if let Some(m) = meta.as_object_mut() {
        m.remove("name");
        m.remove("creationTimestamp");
    }
    let mut labels = meta["labels"].as_object().cloned().unwrap_or_default();
    for (k, v) in [
        ("batch.kubernetes.io/controller-uid", uid),
        ("batch.kubernetes.io/job-name", name),
        ("controller-uid", uid),
        ("job-name", name),
    ] {
        labels.insert(k.into(), json!(v));
    }
    let mut spec = template["spec"].clone();
    match index {
        Some(i) => {
            labels.insert(INDEX_ANNOTATION.into(), json!(i.to_string()));
            meta["annotations"][INDEX_ANNOTATION] = json!(i.to_string());
            meta["generateName"] = json!(format!("{name}-{i}-"));
            if spec.get("hostname").is_none_or(Value::is_null) {
                spec["hostname"] = json!(format!("{name}-{i}"));
            }
            // Every container learns its index, as the real controller adds the variable.
            let var = json!({"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
                "fieldPath": format!("metadata.annotations['{INDEX_ANNOTATION}']")}}});
            for list in ["containers", "initContainers"] {
                for c in spec[list].as_array_mut().into_iter().flatten() {
                    let env = c["env"].as_array().cloned().unwrap_or_default();
                    if !env.iter().any(|e| e["name"] == "JOB_COMPLETION_INDEX") {
                        let mut env = env;
                        env.push(var.clone());
                        c["env"] = json!(env);
                    }
                }
            }
        }
        None => meta["generateName"] = json!(format!("{name}-")),
    }
    meta["labels"] = Value::Object(labels);
    meta["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
        "controller": true, "blockOwnerDeletion": true,
    }]);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// What a Job's `podFailurePolicy` makes of a failed pod: the first rule that matches, as
/// (action, rule index, the failure as the message describes it). None: no rule matches
/// (counted).
fn policy_verdict(job: &Value, pod: &Value) -> Option<(String, usize, String)> {
    let rules = job.pointer("/spec/podFailurePolicy/rules")?.as_array()?;
    let (ns, name) = ns_name(pod);
    let statuses: Vec<&Value> = ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| pod["status"][*k].as_array().into_iter().flatten())
        .collect();
    for (i, rule) in rules.iter().enumerate() {
        let action = rule["action"].as_str().unwrap_or("").to_string();
        if let Some(codes) = rule.get("onExitCodes").filter(|c| c.is_object()) {
            let values: Vec<i64> = codes["values"].as_array().into_iter().flatten().filter_map(Value::as_i64).collect();
            let only = codes["containerName"].as_str();
            let hit = statuses.iter().find_map(|c| {
                let code = c["state"]["terminated"]["exitCode"].as_i64().filter(|c| *c != 0)?;
                let container = c["name"].as_str().unwrap_or("");
                if only.is_some_and(|o| o != container) {
                    return None;
                }
                let matched = match codes["operator"].as_str() {
                    Some("In") => values.contains(&code),
                    Some("NotIn") => !values.contains(&code),
                    _ => false,
                };
                matched.then(|| format!("Container {container} for pod {ns}/{name} failed with exit code {code}"))
            });
            if let Some(what) = hit {
                return Some((action, i, what));
            }
        }
        for pattern in rule["onPodConditions"].as_array().into_iter().flatten() {
            let want = pattern["status"].as_str().unwrap_or("True");
            let found = pod["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == pattern["type"] && c["status"] == want);
            if found {
                let type_ = pattern["type"].as_str().unwrap_or("");
                return Some((action, i, format!("Pod {ns}/{name} has condition {type_}")));
            }
        }
    }
    None
}

/// The containers' restarts of the pods still running (`restartPolicy: OnFailure`: a failing
/// container restarts in its pod, and each restart counts against `backoffLimit`).
fn restarts(pods: &[&Value]) -> i64 {
    pods.iter()
        .flat_map(|p| {
            ["initContainerStatuses", "containerStatuses"]
                .into_iter()
                .flat_map(move |k| p["status"][k].as_array().into_iter().flatten())
        })
        .filter_map(|c| c["restartCount"].as_i64())
        .sum()
}

/// The back-off before replacing a failed pod: 10 s doubling per failure, 6 min at most.
fn backoff(failed: i64) -> jiff::SignedDuration {
    let steps = (failed - 1).clamp(0, 6) as u32;
    jiff::SignedDuration::from_secs((10i64 << steps).min(360))
}

fn condition(type_: &str, reason: &str, message: &str, now: Timestamp) -> Value {
    json!({"type": type_, "status": "True", "reason": reason, "message": message,
           "lastProbeTime": stamp(now), "lastTransitionTime": stamp(now)})
}

/// What Job `job` needs done, given its pods and the time. Pure.
pub fn plan_job(job: &Value, pods: &[&Value], now: Timestamp) -> JobPlan {
    let spec = &job["spec"];
    let old = &job["status"];
    let parallelism = spec["parallelism"].as_i64().unwrap_or(1).max(0);
    let completions = spec["completions"].as_i64();
    let backoff_limit = spec["backoffLimit"].as_i64().unwrap_or(6);
    let indexed = spec["completionMode"] == "Indexed";
    let suspended = spec["suspend"] == true;
    let mut plan = JobPlan::default();

    let terminating = pods.iter().filter(|p| p["metadata"].get("deletionTimestamp").is_some()).count() as i64;
    let ended = |p: &&&Value| matches!(phase(p), "Succeeded" | "Failed");
    let active: Vec<&Value> =
        pods.iter().filter(|p| !ended(p) && p["metadata"].get("deletionTimestamp").is_none()).copied().collect();
    let ready = active
        .iter()
        .filter(|p| {
            p.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .count();
    // Counts never go down: a finished pod deleted by hand still counted (the real controller
    // tracks them with finalizers).
    let succeeded_pods: Vec<&Value> = pods.iter().filter(|p| phase(p) == "Succeeded").copied().collect();
    let mut done_indexes: BTreeSet<i64> = BTreeSet::new();
    if indexed {
        let previous = old["completedIndexes"].as_str().unwrap_or("");
        for part in previous.split(',').filter(|s| !s.is_empty()) {
            let (a, b) = part.split_once('-').unwrap_or((part, part));
            if let (Ok(a), Ok(b)) = (a.parse::<i64>(), b.parse::<i64>()) {
                done_indexes.extend(a..=b.min(a + 100_000));
            }
        }
        done_indexes.extend(succeeded_pods.iter().filter_map(|p| index_of(p)));
        done_indexes.retain(|i| (0..completions.unwrap_or(0)).contains(i));
    }
    let succeeded = if indexed { done_indexes.len() as i64 } else { succeeded_pods.len() as i64 }
        .max(old["succeeded"].as_i64().unwrap_or(0));
    // Failed pods as the pod failure policy judges them: ignored ones do not count, a FailJob
    // match fails the Job, a FailIndex match fails the pod's index.
    let mut fail_job: Option<String> = None;
    let mut fail_index: BTreeSet<i64> = BTreeSet::new();
    let failed_pods: Vec<&Value> = pods
        .iter()
        .filter(|p| phase(p) == "Failed")
        .filter(|p| match policy_verdict(job, p) {
            Some((action, i, what)) => match action.as_str() {
                "Ignore" => false,
                "FailJob" => {
                    fail_job.get_or_insert(format!("{what} matching FailJob rule at index {i}"));
                    true
                }
                "FailIndex" => {
                    fail_index.extend(index_of(p));
                    true
                }
                _ => true,
            },
            None => true,
        })
        .copied()
        .collect();
    let failed = (failed_pods.len() as i64).max(old["failed"].as_i64().unwrap_or(0));
    // Per index: each index's failures against `backoffLimitPerIndex`.
    let per_index = spec["backoffLimitPerIndex"].as_i64().filter(|_| indexed);
    let mut index_failures: BTreeMap<i64, (i64, Option<Timestamp>)> = BTreeMap::new();
    for p in &failed_pods {
        if let Some(i) = index_of(p) {
            let e = index_failures.entry(i).or_default();
            e.0 += 1;
            e.1 = e.1.max(finished_at(p));
        }
    }
    let mut failed_indexes: BTreeSet<i64> =
        old["failedIndexes"].as_str().and_then(api::kinds::job::parse_indexes).unwrap_or_default();
    if let Some(limit) = per_index {
        failed_indexes.extend(index_failures.iter().filter(|(_, (n, _))| *n > limit).map(|(i, _)| *i));
        failed_indexes.extend(fail_index);
        failed_indexes.retain(|i| (0..completions.unwrap_or(0)).contains(i) && !done_indexes.contains(i));
    }

    let mut status = json!({
        "active": active.len(), "ready": ready, "terminating": terminating,
        "uncountedTerminatedPods": {},
    });
    if succeeded > 0 {
        status["succeeded"] = json!(succeeded);
    }
    if failed > 0 {
        status["failed"] = json!(failed);
    }
    if indexed && !done_indexes.is_empty() {
        status["completedIndexes"] = json!(index_ranges(&done_indexes));
    }
    if per_index.is_some() {
        status["failedIndexes"] = json!(index_ranges(&failed_indexes));
    }
    let mut conditions: Vec<Value> = old["conditions"].as_array().cloned().unwrap_or_default();
    let start = time(&old["startTime"]);
    for f in ["startTime", "completionTime"] {
        if !old[f].is_null() {
            status[f] = old[f].clone();
        }
    }

    // Already finished: only its leftovers and its time to live.
    let finished = has_condition(job, "Complete") || has_condition(job, "Failed");
    if finished {
        plan.delete = active.iter().map(|p| ns_name(p).1).collect();
        status["conditions"] = json!(conditions);
        let ended_at = time(&old["completionTime"]).or_else(|| {
            conditions
                .iter()
                .filter(|c| (c["type"] == "Complete" || c["type"] == "Failed") && c["status"] == "True")
                .filter_map(|c| time(&c["lastTransitionTime"]))
                .max()
        });
        if let (Some(ttl), Some(at)) = (spec["ttlSecondsAfterFinished"].as_i64(), ended_at) {
            let due = at + jiff::SignedDuration::from_secs(ttl);
            if now >= due {
                plan.expired = true;
            } else {
                plan.wake_at = Some(due);
            }
        }
        plan.status = status;
        return plan;
    }

    // Suspended: no pods run; the time spent suspended does not count towards the deadline.
    let was_suspended = has_condition(job, "Suspended");
    if suspended {
        plan.delete = active.iter().map(|p| ns_name(p).1).collect();
        if !was_suspended {
            conditions.retain(|c| c["type"] != "Suspended");
            conditions.push(condition("Suspended", "JobSuspended", "Job suspended", now));
            plan.events.push((EventType::Normal, "Suspended", "Job suspended".into()));
        }
        status["conditions"] = json!(conditions);
        status.as_object_mut().map(|s| s.remove("startTime"));
        plan.status = status;
        return plan;
    }
    if was_suspended {
        for c in conditions.iter_mut().filter(|c| c["type"] == "Suspended") {
            *c = json!({"type": "Suspended", "status": "False", "reason": "JobResumed", "message": "Job resumed",
                        "lastProbeTime": stamp(now), "lastTransitionTime": stamp(now)});
        }
        plan.events.push((EventType::Normal, "Resumed", "Job resumed".into()));
    }
    let start = match start {
        Some(s) if !was_suspended => s,
        _ => now,
    };
    status["startTime"] = stamp(start);

    let fail =
        |reason: &'static str, message: &str, mut conditions: Vec<Value>, mut status: Value, plan: &mut JobPlan| {
            conditions.push(condition("FailureTarget", reason, message, now));
            conditions.push(condition("Failed", reason, message, now));
            status["conditions"] = json!(conditions);
            plan.delete = active.iter().map(|p| ns_name(p).1).collect();
            plan.events.push((EventType::Warning, reason, message.to_string()));
            plan.status = status;
        };
    // Past its deadline, or out of retries: Failed, its running pods stopped.
    if let Some(deadline) = spec["activeDeadlineSeconds"].as_i64() {
        let due = start + jiff::SignedDuration::from_secs(deadline);
        if now >= due {
            fail("DeadlineExceeded", "Job was active longer than specified deadline", conditions, status, &mut plan);
            return plan;
        }
        plan.wake_at = Some(due);
    }
    if let Some(message) = fail_job {
        fail("PodFailurePolicy", &message, conditions, status, &mut plan);
        return plan;
    }
    let on_failure = spec["template"]["spec"]["restartPolicy"] == "OnFailure";
    let restarted = if on_failure { restarts(&active) } else { 0 };
    if failed + restarted > backoff_limit {
        fail("BackoffLimitExceeded", "Job has reached the specified backoff limit", conditions, status, &mut plan);
        return plan;
    }
    if let Some(max) = spec["maxFailedIndexes"].as_i64().filter(|_| per_index.is_some()) {
        if failed_indexes.len() as i64 > max {
            let message = "Job has exceeded the specified maximal number of failed indexes";
            fail("MaxFailedIndexesExceeded", message, conditions, status, &mut plan);
            return plan;
        }
    }
    // Every index ended, some failed: Failed.
    if per_index.is_some()
        && !failed_indexes.is_empty()
        && (done_indexes.len() + failed_indexes.len()) as i64 >= completions.unwrap_or(0)
    {
        fail("FailedIndexes", "Job has failed indexes", conditions, status, &mut plan);
        return plan;
    }
    // A success policy's rule met: done, the rest of the pods stopped.
    let matched_rule = spec["successPolicy"]["rules"].as_array().filter(|_| indexed).and_then(|rules| {
        rules.iter().position(|r| {
            let within: Option<BTreeSet<i64>> = r["succeededIndexes"].as_str().and_then(api::kinds::job::parse_indexes);
            let hits = match &within {
                Some(set) => set.intersection(&done_indexes).count() as i64,
                None => done_indexes.len() as i64,
            };
            match (&within, r["succeededCount"].as_i64()) {
                (Some(set), None) => !set.is_empty() && hits == set.len() as i64,
                (_, Some(c)) => hits >= c,
                (None, None) => false,
            }
        })
    });
    // Succeeded: the conditions with the reason, its time, the pods still running stopped.
    let succeed = |reason: &str, message: &str, mut conditions: Vec<Value>, mut status: Value, plan: &mut JobPlan| {
        conditions.push(condition("SuccessCriteriaMet", reason, message, now));
        conditions.push(condition("Complete", reason, message, now));
        status["conditions"] = json!(conditions);
        status["completionTime"] = stamp(now);
        plan.delete = active.iter().map(|p| ns_name(p).1).collect();
        plan.events.push((EventType::Normal, "Completed", "Job completed".into()));
        plan.status = status;
    };
    if let Some(i) = matched_rule {
        succeed("SuccessPolicy", &format!("Matched rules at index {i}"), conditions, status, &mut plan);
        return plan;
    }

    // Done: every completion (every index), or without completions one success and no pod left.
    let complete = match (indexed, completions) {
        (true, Some(c)) => done_indexes.len() as i64 >= c,
        (false, Some(c)) => succeeded >= c,
        (_, None) => succeeded > 0 && active.is_empty(),
    };
    if complete {
        let message = "Reached expected number of succeeded pods";
        succeed("CompletionsReached", message, conditions, status, &mut plan);
        return plan;
    }
    status["conditions"] = json!(conditions);

    // More pods, unless a failure's back-off still runs (per index with a limit per index).
    let wake = |until: Timestamp, plan: &mut JobPlan| {
        plan.wake_at = Some(plan.wake_at.map_or(until, |w| w.min(until)));
    };
    if per_index.is_none() {
        let last_failure = failed_pods.iter().filter_map(|p| finished_at(p)).max();
        let wait_until = last_failure.map(|t| t + backoff(failed));
        if let Some(until) = wait_until.filter(|u| now < *u) {
            wake(until, &mut plan);
            plan.status = status;
            return plan;
        }
    }
    // `podReplacementPolicy: Failed`: a pod being deleted still holds its place.
    let holding: Vec<&Value> = if spec["podReplacementPolicy"] == "Failed" {
        pods.iter().filter(|p| !ended(p)).copied().collect()
    } else {
        active.clone()
    };
    if indexed {
        let running: BTreeSet<i64> = holding.iter().filter_map(|p| index_of(p)).collect();
        let room = (parallelism - holding.len() as i64).max(0) as usize;
        let mut todo = vec![];
        for i in 0..completions.unwrap_or(0) {
            if done_indexes.contains(&i) || running.contains(&i) || failed_indexes.contains(&i) {
                continue;
            }
            if let Some((n, Some(at))) = index_failures.get(&i).filter(|_| per_index.is_some()) {
                let until = *at + backoff(*n);
                if now < until {
                    wake(until, &mut plan);
                    continue;
                }
            }
            todo.push(i);
        }
        plan.create = todo.into_iter().take(room).map(|i| pod_for(job, Some(i))).collect();
    } else {
        let wanted = match completions {
            Some(c) => parallelism.min(c - succeeded),
            None if succeeded > 0 => 0,
            None => parallelism,
        };
        let n = (wanted - holding.len() as i64).max(0);
        plan.create = (0..n).map(|_| pod_for(job, None)).collect();
    }
    plan.status = status;
    plan
}

/// Brings the Jobs of namespace `ns` and their pods one step closer to what they ask for;
/// returns the earliest time one of them must be looked at again (a back-off, a deadline, a
/// time to live), if any.
pub async fn sync_namespace(reg: &Registry, ns: &str) -> Result<Option<Timestamp>, ApiError> {
    let (jobs, _) = reg.store.list(Kind::Job, Some(ns))?;
    let (pods, _) = reg.store.list(Kind::Pod, Some(ns))?;
    let by_job = owned_or_collected(reg, Kind::Pod, ns, &pods, "Job", &jobs).await?;
    let now = Timestamp::now();
    let mut wake: Option<Timestamp> = None;
    for job in jobs.iter().filter(|j| j["metadata"].get("deletionTimestamp").is_none()) {
        let uid = job["metadata"]["uid"].as_str().unwrap_or("");
        let owned = by_job.get(uid).cloned().unwrap_or_default();
        let plan = plan_job(job, &owned, now);
        let name = ns_name(job).1;
        let report = reporter("job-controller", Kind::Job, job);
        if plan.expired {
            delete_quietly(reg, Kind::Job, ns, &name).await?;
            continue;
        }
        for pod in plan.create {
            match reg.create(Kind::Pod, Some(ns), pod, &WriteOptions::default()).await {
                Ok(created) => {
                    let pod_name = ns_name(&created.object).1;
                    record(reg, report(EventType::Normal, "SuccessfulCreate", format!("Created pod: {pod_name}")))
                        .await;
                }
                Err(e) => {
                    let message = format!("Error creating: {e}");
                    record(reg, report(EventType::Warning, "FailedCreate", message)).await;
                }
            }
        }
        for pod in &plan.delete {
            delete_quietly(reg, Kind::Pod, ns, pod).await?;
            record(reg, report(EventType::Normal, "SuccessfulDelete", format!("Deleted pod: {pod}"))).await;
        }
        for (type_, reason, message) in plan.events {
            record(reg, report(type_, reason, message)).await;
        }
        write_status(reg, Kind::Job, job, plan.status).await?;
        if let Some(w) = plan.wake_at {
            wake = Some(wake.map_or(w, |x| x.min(w)));
        }
    }
    Ok(wake)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(spec: Value) -> Value {
        let mut spec = spec;
        spec["template"] = json!({"metadata": {"labels": {"app": "pi"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}});
        json!({"metadata": {"namespace": "default", "name": "pi", "uid": "u1"}, "spec": spec, "status": {}})
    }

    fn pod(name: &str, phase: &str, index: Option<i64>) -> Value {
        let mut p = json!({"metadata": {"namespace": "default", "name": name}, "status": {"phase": phase}});
        if let Some(i) = index {
            p["metadata"]["annotations"] = json!({INDEX_ANNOTATION: i.to_string()});
        }
        p
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn pods_are_made_up_to_parallelism_until_completions_succeed() {
        let now = at("2026-11-26T12:00:00Z");
        let j = job(json!({"completions": 3, "parallelism": 2, "backoffLimit": 6}));
        let plan = plan_job(&j, &[], now);
        assert_eq!(plan.create.len(), 2);
        let p = &plan.create[0];
        assert_eq!(p["metadata"]["generateName"], "pi-");
        assert_eq!(p["metadata"]["labels"]["batch.kubernetes.io/job-name"], "pi");
        assert_eq!(p["metadata"]["labels"]["app"], "pi");
        assert_eq!(p["metadata"]["ownerReferences"][0]["kind"], "Job");
        assert_eq!(plan.status["startTime"], "2026-11-26T12:00:00Z");
        assert_eq!(plan.status["active"], 0);
        // Two succeeded, one to go: one more pod; then all three: Complete.
        let mut j = j;
        j["status"] = plan.status.clone();
        let (a, b) = (pod("pi-a", "Succeeded", None), pod("pi-b", "Succeeded", None));
        let plan = plan_job(&j, &[&a, &b], now);
        assert_eq!((plan.create.len(), plan.status["succeeded"].as_i64()), (1, Some(2)));
        let c = pod("pi-c", "Succeeded", None);
        let plan = plan_job(&j, &[&a, &b, &c], now);
        assert!(plan.create.is_empty());
        let types: Vec<&str> =
            plan.status["conditions"].as_array().unwrap().iter().map(|c| c["type"].as_str().unwrap()).collect();
        assert_eq!(types, ["SuccessCriteriaMet", "Complete"]);
        assert_eq!(plan.status["conditions"][1]["reason"], "CompletionsReached");
        assert_eq!(plan.status["completionTime"], "2026-11-26T12:00:00Z");
        assert_eq!(plan.events, [(EventType::Normal, "Completed", "Job completed".to_string())]);
        // Finished: nothing more, and the time to live runs out.
        let mut done = j.clone();
        done["spec"]["ttlSecondsAfterFinished"] = json!(60);
        done["status"] = plan.status.clone();
        let later = plan_job(&done, &[&a, &b, &c], now + jiff::SignedDuration::from_secs(30));
        assert!(!later.expired && later.create.is_empty() && later.events.is_empty());
        assert!(plan_job(&done, &[], now + jiff::SignedDuration::from_secs(60)).expired);
    }

    #[test]
    fn failures_back_off_then_exceed_the_limit_and_deadlines_fail_the_job() {
        let now = at("2026-11-26T12:00:00Z");
        let mut j = job(json!({"completions": 1, "parallelism": 1, "backoffLimit": 1}));
        j["status"]["startTime"] = json!("2026-11-26T11:59:00Z");
        let mut f1 = pod("pi-a", "Failed", None);
        f1["status"]["containerStatuses"] = json!([{"state": {"terminated": {"finishedAt": "2026-11-26T11:59:55Z"}}}]);
        // One failure: a replacement only after 10 s.
        let plan = plan_job(&j, &[&f1], now);
        assert!(plan.create.is_empty());
        assert_eq!(plan.wake_at, Some(at("2026-11-26T12:00:05Z")));
        let plan = plan_job(&j, &[&f1], at("2026-11-26T12:00:06Z"));
        assert_eq!(plan.create.len(), 1);
        // Two failures with backoffLimit 1: Failed, the running pod deleted.
        let f2 = pod("pi-b", "Failed", None);
        let running = pod("pi-c", "Running", None);
        let plan = plan_job(&j, &[&f1, &f2, &running], now);
        let last = &plan.status["conditions"][1];
        assert_eq!((last["type"].as_str(), last["reason"].as_str()), (Some("Failed"), Some("BackoffLimitExceeded")));
        assert_eq!(last["message"], "Job has reached the specified backoff limit");
        assert_eq!(plan.delete, ["pi-c"]);
        assert_eq!(plan.events[0].1, "BackoffLimitExceeded");
        // Past activeDeadlineSeconds.
        let mut j = job(json!({"completions": 1, "parallelism": 1, "activeDeadlineSeconds": 30}));
        j["status"]["startTime"] = json!("2026-11-26T11:59:00Z");
        let plan = plan_job(&j, &[&running], now);
        assert_eq!(plan.status["conditions"][1]["reason"], "DeadlineExceeded");
        assert_eq!(plan.status["conditions"][1]["message"], "Job was active longer than specified deadline");
        assert_eq!(plan.delete, ["pi-c"]);
    }

    #[test]
    fn indexed_jobs_run_one_pod_per_index_and_say_which_are_done() {
        let now = at("2026-11-26T12:00:00Z");
        let j = job(json!({"completions": 5, "parallelism": 2, "completionMode": "Indexed"}));
        let plan = plan_job(&j, &[], now);
        let idx: Vec<&str> =
            plan.create.iter().map(|p| p["metadata"]["annotations"][INDEX_ANNOTATION].as_str().unwrap()).collect();
        assert_eq!(idx, ["0", "1"]);
        let p = &plan.create[1];
        assert_eq!(
            (p["metadata"]["generateName"].as_str(), p["spec"]["hostname"].as_str()),
            (Some("pi-1-"), Some("pi-1"))
        );
        assert_eq!(p["spec"]["containers"][0]["env"][0]["name"], "JOB_COMPLETION_INDEX");
        let (d0, d1, r3) =
            (pod("a", "Succeeded", Some(0)), pod("b", "Succeeded", Some(1)), pod("c", "Running", Some(3)));
        let plan = plan_job(&j, &[&d0, &d1, &r3], now);
        let idx: Vec<&str> =
            plan.create.iter().map(|p| p["metadata"]["annotations"][INDEX_ANNOTATION].as_str().unwrap()).collect();
        assert_eq!(idx, ["2"]);
        assert_eq!(plan.status["completedIndexes"], "0-1");
        assert_eq!(index_ranges(&[0, 1, 2, 4, 6, 7].into_iter().collect()), "0-2,4,6-7");
    }

    #[test]
    fn a_suspended_job_runs_nothing_and_without_completions_one_success_ends_it() {
        let now = at("2026-11-26T12:00:00Z");
        let j = job(json!({"parallelism": 2, "suspend": true}));
        let running = pod("pi-a", "Running", None);
        let plan = plan_job(&j, &[&running], now);
        assert_eq!((plan.delete.clone(), plan.create.len()), (vec!["pi-a".to_string()], 0));
        assert_eq!(plan.status["conditions"][0]["type"], "Suspended");
        // A work queue (no completions): one success and nothing running is done.
        let j = job(json!({"parallelism": 2}));
        let ok = pod("pi-b", "Succeeded", None);
        assert!(plan_job(&j, &[&ok, &running], now).status["conditions"].as_array().unwrap().is_empty());
        let plan = plan_job(&j, &[&ok], now);
        assert_eq!(plan.status["conditions"][1]["type"], "Complete");
    }

    fn exited(name: &str, index: Option<i64>, code: i64) -> Value {
        let mut p = pod(name, "Failed", index);
        p["status"]["containerStatuses"] = json!([{"name": "main", "restartCount": 0,
            "state": {"terminated": {"exitCode": code, "finishedAt": "2026-11-26T11:00:00Z"}}}]);
        p
    }

    #[test]
    fn a_pod_failure_policy_fails_the_job_ignores_disruptions_or_counts() {
        let now = at("2026-11-26T12:00:00Z");
        // The documentation's example: exit code 42 fails the Job, a disruption is ignored.
        let j = job(json!({"completions": 2, "parallelism": 2, "backoffLimit": 6, "podReplacementPolicy": "Failed",
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [42]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}}));
        let mut evicted = pod("pi-e", "Failed", None);
        evicted["status"]["conditions"] = json!([{"type": "DisruptionTarget", "status": "True"}]);
        let plan = plan_job(&j, &[&evicted], now);
        assert_eq!(plan.create.len(), 2, "ignored: replaced at once, not counted");
        assert!(plan.status.get("failed").is_none(), "{}", plan.status);
        let other = exited("pi-o", None, 1);
        let plan = plan_job(&j, &[&evicted, &other], now);
        assert_eq!(plan.status["failed"], 1, "no rule matches exit code 1: counted");
        let running = pod("pi-r", "Running", None);
        let plan = plan_job(&j, &[&exited("pi-x", None, 42), &running], now);
        let last = &plan.status["conditions"][1];
        assert_eq!((last["type"].as_str(), last["reason"].as_str()), (Some("Failed"), Some("PodFailurePolicy")));
        assert_eq!(
            last["message"],
            "Container main for pod default/pi-x failed with exit code 42 matching FailJob rule at index 0"
        );
        assert_eq!(plan.delete, ["pi-r"]);
        // podReplacementPolicy Failed: a terminating pod still holds its place.
        let mut leaving = pod("pi-t", "Running", None);
        leaving["metadata"]["deletionTimestamp"] = json!("2026-11-26T11:59:59Z");
        assert_eq!(plan_job(&j, &[&leaving], now).create.len(), 1);
        let mut eager = j.clone();
        eager["spec"]["podReplacementPolicy"] = json!("TerminatingOrFailed");
        assert_eq!(plan_job(&eager, &[&leaving], now).create.len(), 2);
    }

    #[test]
    fn indexes_fail_on_their_own_and_a_success_policy_ends_the_job_early() {
        let now = at("2026-11-26T12:00:00Z");
        let j = job(json!({"completions": 4, "parallelism": 4, "completionMode": "Indexed",
            "backoffLimitPerIndex": 1, "backoffLimit": 2147483647,
            "podFailurePolicy": {"rules": [{"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}}]}}));
        // Index 0 failed once (exit 1): retried after its back-off; index 1 hit FailIndex.
        let (f0, f1) = (exited("a", Some(0), 1), exited("b", Some(1), 42));
        let (d2, d3) = (pod("c", "Succeeded", Some(2)), pod("d", "Succeeded", Some(3)));
        let plan = plan_job(&j, &[&f0, &f1, &d2, &d3], now);
        assert_eq!(plan.status["failedIndexes"], "1");
        let idx: Vec<&str> =
            plan.create.iter().map(|p| p["metadata"]["annotations"][INDEX_ANNOTATION].as_str().unwrap()).collect();
        assert_eq!(idx, ["0"], "index 0 again (its back-off is over), index 1 never");
        // Index 0 fails a second time: past its limit; every index ended, some failed.
        let f0b = exited("a2", Some(0), 1);
        let plan = plan_job(&j, &[&f0, &f0b, &f1, &d2, &d3], now);
        assert_eq!(plan.status["failedIndexes"], "0-1");
        assert_eq!(plan.status["conditions"][1]["reason"], "FailedIndexes");
        assert_eq!(plan.status["conditions"][1]["message"], "Job has failed indexes");
        let mut capped = j.clone();
        capped["spec"]["maxFailedIndexes"] = json!(1);
        let plan = plan_job(&capped, &[&f0, &f0b, &f1], now);
        assert_eq!(plan.status["conditions"][1]["reason"], "MaxFailedIndexesExceeded");
        // A success policy: index 0 and any one more is enough.
        let sp = job(json!({"completions": 5, "parallelism": 5, "completionMode": "Indexed",
            "successPolicy": {"rules": [{"succeededIndexes": "0-4", "succeededCount": 2}]}}));
        let (s0, r1) = (pod("s0", "Succeeded", Some(0)), pod("r1", "Running", Some(1)));
        assert!(plan_job(&sp, &[&s0, &r1], now).status["conditions"].as_array().unwrap().is_empty());
        let s3 = pod("s3", "Succeeded", Some(3));
        let plan = plan_job(&sp, &[&s0, &r1, &s3], now);
        let types: Vec<(&str, &str)> = plan.status["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["type"].as_str().unwrap(), c["reason"].as_str().unwrap()))
            .collect();
        assert_eq!(types, [("SuccessCriteriaMet", "SuccessPolicy"), ("Complete", "SuccessPolicy")]);
        assert_eq!(plan.status["conditions"][1]["message"], "Matched rules at index 0");
        assert_eq!(plan.delete, ["r1"]);
    }

    #[test]
    fn on_failure_restarts_count_against_the_backoff_limit() {
        let now = at("2026-11-26T12:00:00Z");
        let mut j = job(json!({"completions": 1, "parallelism": 1, "backoffLimit": 2}));
        j["spec"]["template"]["spec"]["restartPolicy"] = json!("OnFailure");
        let mut p = pod("pi-a", "Running", None);
        p["status"]["containerStatuses"] = json!([{"name": "c", "restartCount": 2}]);
        assert!(plan_job(&j, &[&p], now).status["conditions"].as_array().unwrap().is_empty());
        p["status"]["containerStatuses"][0]["restartCount"] = json!(3);
        let plan = plan_job(&j, &[&p], now);
        assert_eq!(plan.status["conditions"][1]["reason"], "BackoffLimitExceeded");
        assert_eq!(plan.delete, ["pi-a"]);
    }
}
