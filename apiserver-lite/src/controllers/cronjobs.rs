//! The CronJob controller, as kube-controller-manager's (its second version): at each
//! scheduled time (in `spec.timeZone`, UTC without one) a Job `<cronjob>-<minutes since the
//! epoch>` from `jobTemplate`, unless suspended; of the times missed, only the latest starts,
//! and not at all if it is older than `startingDeadlineSeconds`; `concurrencyPolicy` Allow, Forbid (a time is not
//! started while a Job runs) or Replace (the running Job goes); finished Jobs beyond
//! `successfulJobsHistoryLimit`/`failedJobsHistoryLimit` deleted, oldest first; `status.active`,
//! `lastScheduleTime`, `lastSuccessfulTime`; the Events. [`plan_cronjob`] decides (pure);
//! [`sync_namespace`] reads and writes.

use std::collections::BTreeSet;

use api::cron::Schedule;
use api::Kind;
use jiff::tz::TimeZone;
use jiff::Timestamp;
use serde_json::{json, Value};

use super::events::{record, EventType};
use super::write::{delete_quietly, ns_name, owned_or_collected, reporter, stamp, time, write_status};
use crate::error::ApiError;
use crate::registry::{Registry, WriteOptions};

/// The annotation a scheduled Job carries: the time it was scheduled for.
pub const SCHEDULED_ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// What a CronJob needs done.
#[derive(Debug, Default, PartialEq)]
pub struct CronPlan {
    /// A Job to create (its scheduled time's).
    pub create: Option<Value>,
    /// Jobs to delete: replaced (Replace) or past the history limits.
    pub delete: Vec<String>,
    pub status: Value,
    pub events: Vec<(EventType, &'static str, String)>,
    /// The next scheduled time.
    pub wake_at: Option<Timestamp>,
}

/// `Complete` or `Failed`, once the Job has finished.
fn finished(job: &Value) -> Option<&'static str> {
    let conds = job.pointer("/status/conditions").and_then(Value::as_array)?;
    ["Complete", "Failed"].into_iter().find(|t| conds.iter().any(|c| c["type"] == *t && c["status"] == "True"))
}

/// The schedule's time zone, or the reason it is unknown.
pub fn zone(cj: &Value) -> Result<TimeZone, String> {
    match cj["spec"]["timeZone"].as_str().filter(|z| !z.is_empty()) {
        None => Ok(TimeZone::UTC),
        Some(z) => TimeZone::get(z).map_err(|e| format!("invalid timeZone: {z:?}: {e}")),
    }
}

/// The Job of `cj` for scheduled time `at`.
pub fn job_for(cj: &Value, at: Timestamp, tz: &TimeZone) -> Value {
    let name = cj["metadata"]["name"].as_str().unwrap_or("");
    let template = &cj["spec"]["jobTemplate"];
    let mut meta = template["metadata"].clone();
    if !meta.is_object() {
        meta = json!({});
    }
    if let Some(m) = meta.as_object_mut() {
        m.remove("creationTimestamp");
    }
    meta["name"] = json!(format!("{name}-{}", at.as_second() / 60));
    meta["annotations"][SCHEDULED_ANNOTATION] =
        json!(at.to_zoned(tz.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string());
    meta["ownerReferences"] = json!([{
        "apiVersion": "batch/v1", "kind": "CronJob", "name": name, "uid": cj["metadata"]["uid"],
        "controller": true, "blockOwnerDeletion": true,
    }]);
    json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": template["spec"]})
}

/// What CronJob `cj` needs done, given its Jobs and the time. Pure.
pub fn plan_cronjob(cj: &Value, jobs: &[&Value], now: Timestamp) -> CronPlan {
    let spec = &cj["spec"];
    let mut plan = CronPlan::default();
    let mut status = cj["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    let name_of = |j: &Value| ns_name(j).1;
    let started = |j: &Value| time(&j["status"]["startTime"]).or_else(|| time(&j["metadata"]["creationTimestamp"]));

    // Finished Jobs leave `active` (once, with an Event); a success sets lastSuccessfulTime.
    let was_active: BTreeSet<String> = status["active"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str().map(String::from))
        .collect();
    let mut active = vec![];
    for j in jobs {
        match finished(j) {
            None if j["metadata"].get("deletionTimestamp").is_none() => active.push(*j),
            None => {}
            Some(how) => {
                if was_active.contains(&name_of(j)) {
                    plan.events.push((
                        EventType::Normal,
                        "SawCompletedJob",
                        format!("Saw completed job: {}, condition: {how}", name_of(j)),
                    ));
                }
                if how == "Complete" {
                    if let Some(t) = time(&j["status"]["completionTime"]) {
                        if time(&status["lastSuccessfulTime"]).is_none_or(|l| t > l) {
                            status["lastSuccessfulTime"] = stamp(t);
                        }
                    }
                }
            }
        }
    }
    // History: the newest finished Jobs of each kind kept.
    for (kind, limit) in [
        ("Complete", spec["successfulJobsHistoryLimit"].as_i64().unwrap_or(3)),
        ("Failed", spec["failedJobsHistoryLimit"].as_i64().unwrap_or(1)),
    ] {
        let mut done: Vec<&&Value> = jobs.iter().filter(|j| finished(j) == Some(kind)).collect();
        done.sort_by_key(|j| (started(j), name_of(j)));
        let excess = done.len().saturating_sub(limit.max(0) as usize);
        for j in done.into_iter().take(excess) {
            plan.delete.push(name_of(j));
            plan.events.push((EventType::Normal, "SuccessfulDelete", format!("Deleted job {}", name_of(j))));
        }
    }

    let refs = |list: &[&Value]| -> Value {
        json!(list
            .iter()
            .map(|j| json!({"apiVersion": "batch/v1", "kind": "Job", "namespace": j["metadata"]["namespace"],
                            "name": j["metadata"]["name"], "uid": j["metadata"]["uid"],
                            "resourceVersion": j["metadata"]["resourceVersion"]}))
            .collect::<Vec<_>>())
    };
    let finish = |mut status: Value, active: &[&Value], mut plan: CronPlan| {
        if active.is_empty() {
            status.as_object_mut().map(|s| s.remove("active"));
        } else {
            status["active"] = refs(active);
        }
        plan.status = status;
        plan
    };

    let tz = match zone(cj) {
        Ok(tz) => tz,
        Err(e) => {
            plan.events.push((EventType::Warning, "UnknownTimeZone", e));
            return finish(status, &active, plan);
        }
    };
    let schedule = match Schedule::parse(spec["schedule"].as_str().unwrap_or("")) {
        Ok(s) => s,
        Err(e) => {
            plan.events.push((EventType::Warning, "InvalidSchedule", format!("invalid schedule: {e}")));
            return finish(status, &active, plan);
        }
    };
    plan.wake_at = schedule.next_after(now, &tz);
    if spec["suspend"] == true {
        return finish(status, &active, plan);
    }
    // The most recent scheduled time not yet started, since the last one (or the creation).
    let mut earliest =
        time(&status["lastScheduleTime"]).or_else(|| time(&cj["metadata"]["creationTimestamp"])).unwrap_or(now);
    let deadline = spec["startingDeadlineSeconds"].as_i64();
    if let Some(d) = deadline {
        earliest = earliest.max(now - jiff::SignedDuration::from_secs(d));
    }
    let mut due = None;
    let mut t = earliest;
    for _ in 0..100_000 {
        match schedule.next_after(t, &tz) {
            Some(n) if n <= now => {
                due = Some(n);
                t = n;
            }
            _ => break,
        }
    }
    // Times before the starting deadline's window were never candidates (as the real
    // controller looks for them only from `now - startingDeadlineSeconds`).
    let Some(at) = due else { return finish(status, &active, plan) };
    match spec["concurrencyPolicy"].as_str().unwrap_or("Allow") {
        "Forbid" if !active.is_empty() => {
            plan.events.push((
                EventType::Normal,
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            ));
            return finish(status, &active, plan);
        }
        "Replace" => {
            for j in active.drain(..) {
                plan.delete.push(name_of(j));
                plan.events.push((EventType::Normal, "SuccessfulDelete", format!("Deleted job {}", name_of(j))));
            }
        }
        _ => {}
    }
    plan.create = Some(job_for(cj, at, &tz));
    status["lastScheduleTime"] = stamp(at);
    finish(status, &active, plan)
}

/// Runs the CronJobs of namespace `ns` due now; returns the earliest next scheduled time.
pub async fn sync_namespace(reg: &Registry, ns: &str) -> Result<Option<Timestamp>, ApiError> {
    let (cronjobs, _) = reg.store.list(Kind::CronJob, Some(ns))?;
    let (jobs, _) = reg.store.list(Kind::Job, Some(ns))?;
    let owned = owned_or_collected(reg, Kind::Job, ns, &jobs, "CronJob", &cronjobs).await?;
    let now = Timestamp::now();
    let mut wake: Option<Timestamp> = None;
    for cj in cronjobs.iter().filter(|c| c["metadata"].get("deletionTimestamp").is_none()) {
        let uid = cj["metadata"]["uid"].as_str().unwrap_or("");
        let mine = owned.get(uid).cloned().unwrap_or_default();
        let mut plan = plan_cronjob(cj, &mine, now);
        let report = reporter("cronjob-controller", Kind::CronJob, cj);
        for name in &plan.delete {
            delete_quietly(reg, Kind::Job, ns, name).await?;
        }
        if let Some(job) = plan.create.take() {
            let name = ns_name(&job).1;
            match reg.create(Kind::Job, Some(ns), job, &WriteOptions::default()).await {
                Ok(created) => {
                    let mut active = plan.status["active"].as_array().cloned().unwrap_or_default();
                    active.push(json!({"apiVersion": "batch/v1", "kind": "Job", "namespace": ns, "name": name,
                        "uid": created.object["metadata"]["uid"],
                        "resourceVersion": created.object["metadata"]["resourceVersion"]}));
                    plan.status["active"] = json!(active);
                    record(reg, report(EventType::Normal, "SuccessfulCreate", format!("Created job {name}"))).await;
                }
                // Made already (a pass that did not get to write the status).
                Err(ApiError::AlreadyExists { .. }) => {}
                Err(e) => {
                    record(reg, report(EventType::Warning, "FailedCreate", format!("Error creating job: {e}"))).await;
                    plan.status = cj["status"].clone();
                }
            }
        }
        for (type_, reason, message) in plan.events {
            record(reg, report(type_, reason, message)).await;
        }
        write_status(reg, Kind::CronJob, cj, plan.status).await?;
        if let Some(w) = plan.wake_at {
            wake = Some(wake.map_or(w, |x| x.min(w)));
        }
    }
    Ok(wake)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cj(spec: Value) -> Value {
        let mut spec = spec;
        spec["jobTemplate"] = json!({"spec": {"template": {"spec": {"restartPolicy": "OnFailure",
            "containers": [{"name": "c", "image": "busybox"}]}}}});
        json!({"metadata": {"namespace": "default", "name": "tick", "uid": "c1",
                            "creationTimestamp": "2026-11-26T12:00:30Z"}, "spec": spec, "status": {}})
    }

    fn job(name: &str, how: Option<&str>, start: &str) -> Value {
        let mut j = json!({"metadata": {"namespace": "default", "name": name, "uid": format!("u-{name}")},
                           "status": {"startTime": start}});
        if let Some(h) = how {
            j["status"]["conditions"] = json!([{"type": h, "status": "True"}]);
            j["status"]["completionTime"] = json!(start);
        }
        j
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_due_time_makes_its_job_once_and_the_next_time_is_known() {
        let c = cj(json!({"schedule": "*/5 * * * *"}));
        // Before the first time (12:05): nothing, wake at 12:05.
        let plan = plan_cronjob(&c, &[], at("2026-11-26T12:04:00Z"));
        assert!(plan.create.is_none());
        assert_eq!(plan.wake_at, Some(at("2026-11-26T12:05:00Z")));
        let plan = plan_cronjob(&c, &[], at("2026-11-26T12:05:02Z"));
        let j = plan.create.unwrap();
        assert_eq!(j["metadata"]["name"], format!("tick-{}", at("2026-11-26T12:05:00Z").as_second() / 60));
        assert_eq!(j["metadata"]["annotations"][SCHEDULED_ANNOTATION], "2026-11-26T12:05:00+00:00");
        assert_eq!(j["metadata"]["ownerReferences"][0]["kind"], "CronJob");
        assert_eq!(j["spec"]["template"]["spec"]["restartPolicy"], "OnFailure");
        assert_eq!(plan.status["lastScheduleTime"], "2026-11-26T12:05:00Z");
        // Scheduled already: nothing more until 12:10.
        let mut c2 = c.clone();
        c2["status"] = plan.status.clone();
        assert!(plan_cronjob(&c2, &[], at("2026-11-26T12:09:00Z")).create.is_none());
        // Several missed: only the most recent starts.
        let plan = plan_cronjob(&c2, &[], at("2026-11-26T12:31:00Z"));
        assert_eq!(plan.status["lastScheduleTime"], "2026-11-26T12:30:00Z");
    }

    #[test]
    fn concurrency_deadlines_suspension_and_history() {
        let now = at("2026-11-26T12:10:05Z");
        let running = job("tick-1", None, "2026-11-26T12:05:00Z");
        let forbid = cj(json!({"schedule": "*/5 * * * *", "concurrencyPolicy": "Forbid"}));
        let plan = plan_cronjob(&forbid, &[&running], now);
        assert!(plan.create.is_none());
        assert_eq!(plan.events[0].1, "JobAlreadyActive");
        assert_eq!(plan.status["active"][0]["name"], "tick-1");
        let replace = cj(json!({"schedule": "*/5 * * * *", "concurrencyPolicy": "Replace"}));
        let plan = plan_cronjob(&replace, &[&running], now);
        assert!(plan.create.is_some());
        assert_eq!(plan.delete, ["tick-1"]);
        // A time missed by more than the starting deadline is skipped, with an Event.
        let late = cj(json!({"schedule": "0 * * * *", "startingDeadlineSeconds": 30}));
        let plan = plan_cronjob(&late, &[], at("2026-11-26T13:02:00Z"));
        assert!(plan.create.is_none());
        assert!(plan.events.is_empty(), "13:00 is past the window [13:01:30, 13:02]: not even seen");
        let plan = plan_cronjob(&late, &[], at("2026-11-26T13:00:20Z"));
        assert!(plan.create.is_some());
        // Suspended: nothing.
        let suspended = cj(json!({"schedule": "*/5 * * * *", "suspend": true}));
        assert!(plan_cronjob(&suspended, &[], now).create.is_none());
        // History: 3 successes kept of 4, 1 failure of 2; a finished active Job is seen.
        let mut c = cj(json!({"schedule": "0 0 1 1 *", "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1}));
        c["status"]["active"] = json!([{"name": "ok-4"}]);
        let jobs = [
            job("ok-1", Some("Complete"), "2026-11-26T01:00:00Z"),
            job("ok-2", Some("Complete"), "2026-11-26T02:00:00Z"),
            job("ok-3", Some("Complete"), "2026-11-26T03:00:00Z"),
            job("ok-4", Some("Complete"), "2026-11-26T04:00:00Z"),
            job("bad-1", Some("Failed"), "2026-11-26T01:30:00Z"),
            job("bad-2", Some("Failed"), "2026-11-26T02:30:00Z"),
        ];
        let refs: Vec<&Value> = jobs.iter().collect();
        let plan = plan_cronjob(&c, &refs, now);
        assert_eq!(plan.delete, ["ok-1", "bad-1"]);
        assert!(plan.events.iter().any(|e| e.2 == "Saw completed job: ok-4, condition: Complete"));
        assert_eq!(plan.status["lastSuccessfulTime"], "2026-11-26T04:00:00Z");
        assert!(plan.status.get("active").is_none());
        // An unknown time zone is said, not guessed.
        let zoned = cj(json!({"schedule": "*/5 * * * *", "timeZone": "Mars/Olympus_Mons"}));
        let plan = plan_cronjob(&zoned, &[], now);
        assert!(plan.create.is_none() && plan.events[0].1 == "UnknownTimeZone", "{:?}", plan.events);
    }
}
