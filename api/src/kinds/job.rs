//! batch/v1 Jobs (run by the API server's job controller): defaults, validation of counts and of
//! a template whose pods end (restartPolicy OnFailure or Never), and the Table.

use jiff::Timestamp;
use k8s_openapi::api::batch::v1::JobSpec;
use serde_json::{json, Value};

use super::{meta_and_spec, ApiObject, Kind, KindInfo};
use crate::apps::{default_template, validate_template, wide_cells, WIDE_COLUMNS};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::batch::v1::Job;

/// The restart policies of a Job's pods.
pub(crate) const ENDING: &[&str] = &["OnFailure", "Never"];

/// The API server's defaults of a Job spec (also a CronJob's job template).
pub(crate) fn default_job_spec(spec: &mut JobSpec) {
    if spec.completions.is_none() && spec.parallelism.is_none() {
        spec.completions = Some(1);
    }
    spec.parallelism.get_or_insert(1);
    spec.backoff_limit.get_or_insert(6);
    spec.completion_mode.get_or_insert_with(|| "NonIndexed".into());
    spec.suspend.get_or_insert(false);
    default_template(&mut spec.template);
}

/// Validates a Job spec at `path` (also a CronJob's job template).
pub(crate) fn validate_job_spec(spec: &JobSpec, path: &FieldPath, out: &mut Vec<Cause>) {
    for (field, value) in [("parallelism", spec.parallelism), ("completions", spec.completions), ("backoffLimit", spec.backoff_limit)] {
        if let Some(n) = value.filter(|n| *n < 0) {
            out.push(v::invalid(&path.child(field), &n, "must be greater than or equal to 0"));
        }
    }
    if let Some(n) = spec.active_deadline_seconds.filter(|n| *n <= 0) {
        out.push(v::invalid(&path.child("activeDeadlineSeconds"), &n, "must be greater than 0"));
    }
    if let Some(m) = spec.completion_mode.as_deref().filter(|m| !["NonIndexed", "Indexed"].contains(m)) {
        out.push(v::not_supported(&path.child("completionMode"), m, &["NonIndexed", "Indexed"]));
    }
    validate_template(&spec.template, spec.selector.as_ref(), ENDING, &path.child("template"), out);
}

impl ApiObject for Job {
    const KIND: Kind = Kind::Job;
    const INFO: KindInfo = KindInfo {
        group: "batch",
        categories: &["all"],
        has_status: true,
        has_generation: true,
        ..KindInfo::core("Job", "jobs", "job")
    };

    fn apply_defaults(&mut self) {
        default_job_spec(self.spec.get_or_insert_with(Default::default));
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(Default::default());
        // As the real server's generateSelector: unless `manualSelector`, the Job selects its
        // pods by its own UID (assigned before this runs), and its template carries the labels.
        let uid = self.metadata.uid.clone().unwrap_or_default();
        let name = self.metadata.name.clone().unwrap_or_default();
        let Some(spec) = self.spec.as_mut() else { return };
        if spec.manual_selector == Some(true) || spec.selector.is_some() || uid.is_empty() {
            return;
        }
        let labels = spec.template.metadata.get_or_insert_with(Default::default).labels.get_or_insert_with(Default::default);
        for (k, v) in [
            ("batch.kubernetes.io/controller-uid", &uid),
            ("batch.kubernetes.io/job-name", &name),
            ("controller-uid", &uid),
            ("job-name", &name),
        ] {
            labels.insert(k.to_string(), v.clone());
        }
        spec.selector = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
            match_labels: Some([("batch.kubernetes.io/controller-uid".to_string(), uid)].into()),
            ..Default::default()
        });
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        let path = FieldPath::root("spec");
        let Some(spec) = meta_and_spec(&self.metadata, v::dns1123_subdomain, self.spec.as_ref(), &mut out) else {
            return out;
        };
        validate_job_spec(spec, &path, &mut out);
        // A Job's pod template is immutable (the real server allows a few scheduling fields
        // while the Job is suspended; podpath does not).
        if old.and_then(|o| o.spec.as_ref()).is_some_and(|o| o.template != spec.template) {
            out.push(v::invalid(&path.child("template"), "", "field is immutable"));
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Status", "string", 0),
            col("Completions", "string", 0),
            col("Duration", "string", 0),
            AGE_COLUMN,
        ]
        .into_iter()
        .chain(WIDE_COLUMNS)
        .collect()
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let st = self.status.clone().unwrap_or_default();
        let completions = match spec.completions {
            Some(c) => format!("{}/{c}", st.succeeded.unwrap_or(0)),
            None => format!("{}/1 of {}", st.succeeded.unwrap_or(0), spec.parallelism.unwrap_or(1)),
        };
        let is = |t: &str| st.conditions.iter().flatten().any(|c| c.type_ == t && c.status == "True");
        let status = if is("Complete") {
            "Complete"
        } else if is("Failed") {
            "Failed"
        } else if spec.suspend == Some(true) {
            "Suspended"
        } else {
            "Running"
        };
        let duration = match (st.start_time.as_ref(), st.completion_time.as_ref()) {
            (None, _) => String::new(),
            (Some(s), Some(e)) => table::human_duration(e.0.duration_since(s.0).as_secs()),
            (Some(s), None) => table::human_duration(now.duration_since(s.0).as_secs()),
        };
        let name = json!(self.metadata.name.clone().unwrap_or_default());
        let age = table::age(self.metadata.creation_timestamp.as_ref(), now);
        [name, json!(status), json!(completions), json!(duration), age]
            .into_iter()
            .chain(wide_cells(Some(&spec.template), spec.selector.as_ref()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(restart: Option<&str>) -> Job {
        let mut spec = json!({"containers": [{"name": "c", "image": "i"}]});
        if let Some(r) = restart {
            spec["restartPolicy"] = json!(r);
        }
        serde_json::from_value(json!({"metadata": {"name": "pi"}, "spec": {"template": {"spec": spec}}})).unwrap()
    }

    #[test]
    fn a_jobs_pods_must_end_and_kubectls_cells() {
        let mut j = job(Some("Never"));
        j.apply_defaults();
        assert_eq!(j.validate(None), vec![]);
        let spec = j.spec.clone().unwrap();
        assert_eq!((spec.completions, spec.parallelism, spec.backoff_limit), (Some(1), Some(1), Some(6)));
        let cells = j.cells(Timestamp::now());
        assert_eq!((cells[1].clone(), cells[2].clone(), cells[3].clone()), (json!("Running"), json!("0/1"), json!("")));
        // Without a restart policy the pod template's default, Always, is refused.
        let mut j = job(None);
        j.apply_defaults();
        let causes: Vec<String> = j.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            causes,
            ["spec.template.spec.restartPolicy: Unsupported value: \"Always\": supported values: \"OnFailure\", \"Never\""]
        );
    }
}
