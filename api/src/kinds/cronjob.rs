//! batch/v1 CronJobs (run by the API server's cronjob controller): defaults, validation of the
//! schedule, time zone, policy and job template, and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::job::{default_job_spec, validate_job_spec};
use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::apps::{wide_cells, WIDE_COLUMNS};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::batch::v1::CronJob;

/// What is wrong with a cron schedule, if anything (see [`crate::cron`]).
fn schedule_error(s: &str) -> Option<String> {
    crate::cron::Schedule::parse(s).err()
}

impl ApiObject for CronJob {
    const KIND: Kind = Kind::CronJob;
    const INFO: KindInfo = KindInfo {
        group: "batch",
        short_names: &["cj"],
        categories: &["all"],
        has_status: true,
        has_generation: true,
        ..KindInfo::core("CronJob", "cronjobs", "cronjob")
    };

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.concurrency_policy.get_or_insert_with(|| "Allow".into());
        spec.suspend.get_or_insert(false);
        spec.successful_jobs_history_limit.get_or_insert(3);
        spec.failed_jobs_history_limit.get_or_insert(1);
        if let Some(job) = spec.job_template.spec.as_mut() {
            default_job_spec(job);
        }
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(Default::default());
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        // A CronJob's name becomes part of its Jobs' names: at most 52 characters.
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        if let Some(name) = self.metadata.name.as_deref().filter(|n| n.len() > 52) {
            out.push(v::invalid(&FieldPath::root("metadata").child("name"), name, "must be no more than 52 characters"));
        }
        let path = FieldPath::root("spec");
        let Some(spec) = &self.spec else {
            out.push(v::required(&path, ""));
            return out;
        };
        if spec.schedule.is_empty() {
            out.push(v::required(&path.child("schedule"), ""));
        } else if let Some(e) = schedule_error(&spec.schedule) {
            out.push(v::invalid(&path.child("schedule"), spec.schedule.as_str(), &e));
        }
        const POLICIES: [&str; 3] = ["Allow", "Forbid", "Replace"];
        if let Some(p) = spec.concurrency_policy.as_deref().filter(|p| !POLICIES.contains(p)) {
            out.push(v::not_supported(&path.child("concurrencyPolicy"), p, &POLICIES));
        }
        let job = path.child("jobTemplate").child("spec");
        match &spec.job_template.spec {
            Some(js) => validate_job_spec(js, &job, &mut out),
            None => out.push(v::required(&job, "")),
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Schedule", "string", 0),
            col("Timezone", "string", 0),
            col("Suspend", "boolean", 0),
            col("Active", "integer", 0),
            col("Last Schedule", "string", 0),
            AGE_COLUMN,
        ]
        .into_iter()
        .chain(WIDE_COLUMNS)
        .collect()
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let st = self.status.clone().unwrap_or_default();
        let last = st.last_schedule_time.as_ref().map_or("<none>".to_string(), |t| {
            table::human_duration(now.duration_since(t.0).as_secs())
        });
        let job = spec.job_template.spec.clone().unwrap_or_default();
        let cells = [
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(spec.schedule),
            json!(spec.time_zone.unwrap_or_else(|| "<none>".into())),
            json!(spec.suspend.unwrap_or(false)),
            json!(st.active.map_or(0, |a| a.len())),
            json!(last),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ];
        cells.into_iter().chain(wide_cells(Some(&job.template), job.selector.as_ref())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_checked_as_cron_reads_them() {
        for ok in ["*/5 * * * *", "0 3 * * MON-FRI", "15,45 1-5 1 JAN *", "@hourly", "@every 5m"] {
            assert_eq!(schedule_error(ok), None, "{ok}");
        }
        assert_eq!(schedule_error("* * *").as_deref(), Some("expected exactly 5 fields, found 3: * * *"));
        assert_eq!(schedule_error("@sometimes").as_deref(), Some("unrecognized descriptor: @sometimes"));
        assert!(schedule_error("*/0 * * * *").is_some());
        let mut c: CronJob = serde_json::from_value(json!({"metadata": {"name": "tick"}, "spec": {"schedule": "x",
            "jobTemplate": {"spec": {"template": {"spec": {"restartPolicy": "OnFailure",
                "containers": [{"name": "c", "image": "i"}]}}}}}}))
        .unwrap();
        c.apply_defaults();
        let causes: Vec<String> = c.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["spec.schedule: Invalid value: \"x\": expected exactly 5 fields, found 1: x"]);
        assert_eq!(c.cells(Timestamp::now())[2..6], [json!("<none>"), json!(false), json!(0), json!("<none>")]);
    }
}
