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
    // With a limit per index, the Job-wide one is off unless set.
    spec.backoff_limit.get_or_insert(if spec.backoff_limit_per_index.is_some() { i32::MAX } else { 6 });
    let replacement = if spec.pod_failure_policy.is_some() { "Failed" } else { "TerminatingOrFailed" };
    spec.pod_replacement_policy.get_or_insert_with(|| replacement.into());
    for rule in spec.pod_failure_policy.iter_mut().flat_map(|p| p.rules.iter_mut()) {
        for pattern in rule.on_pod_conditions.iter_mut().flatten() {
            if pattern.status.is_empty() {
                pattern.status = "True".into();
            }
        }
    }
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
    let indexed = spec.completion_mode.as_deref() == Some("Indexed");
    if let Some(n) = spec.backoff_limit_per_index {
        if !indexed {
            out.push(v::forbidden(&path.child("backoffLimitPerIndex"), "requires indexed completion mode"));
        } else if n < 0 {
            out.push(v::invalid(&path.child("backoffLimitPerIndex"), &n, "must be greater than or equal to 0"));
        }
    }
    if let Some(n) = spec.max_failed_indexes {
        if spec.backoff_limit_per_index.is_none() {
            out.push(v::required(&path.child("backoffLimitPerIndex"), "when maxFailedIndexes is specified"));
        } else if n < 0 {
            out.push(v::invalid(&path.child("maxFailedIndexes"), &n, "must be greater than or equal to 0"));
        } else if spec.completions.is_some_and(|c| n > c) {
            out.push(v::invalid(&path.child("maxFailedIndexes"), &n, "must be less than or equal to completions"));
        }
    }
    const REPLACEMENT: [&str; 2] = ["Failed", "TerminatingOrFailed"];
    match spec.pod_replacement_policy.as_deref() {
        Some(p) if !REPLACEMENT.contains(&p) => {
            out.push(v::not_supported(&path.child("podReplacementPolicy"), p, &REPLACEMENT))
        }
        Some(p) if p != "Failed" && spec.pod_failure_policy.is_some() => {
            out.push(v::not_supported(&path.child("podReplacementPolicy"), p, &["Failed"]))
        }
        _ => {}
    }
    if let Some(policy) = &spec.pod_failure_policy {
        let restart = spec.template.spec.as_ref().and_then(|s| s.restart_policy.clone()).unwrap_or_default();
        if restart != "Never" {
            let at = path.child("template").child("spec").child("restartPolicy");
            out.push(v::invalid(&at, restart.as_str(), "only \"Never\" is supported when podFailurePolicy is specified"));
        }
        let rules_path = path.child("podFailurePolicy").child("rules");
        if policy.rules.len() > 20 {
            out.push(v::invalid(&rules_path, "", "must have at most 20 items"));
        }
        const ACTIONS: [&str; 4] = ["Count", "FailIndex", "FailJob", "Ignore"];
        for (i, rule) in policy.rules.iter().enumerate() {
            let at = rules_path.index(i);
            if !ACTIONS.contains(&rule.action.as_str()) {
                out.push(v::not_supported(&at.child("action"), rule.action.as_str(), &ACTIONS));
            } else if rule.action == "FailIndex" && spec.backoff_limit_per_index.is_none() {
                out.push(v::invalid(&at.child("action"), rule.action.as_str(), "requires the backoffLimitPerIndex to be set"));
            }
            match (&rule.on_exit_codes, &rule.on_pod_conditions) {
                (Some(_), Some(_)) => out.push(v::invalid(&at, "", "specifying both OnExitCodes and OnPodConditions is not supported")),
                (None, None) => out.push(v::invalid(&at, "", "specifying one of OnExitCodes and OnPodConditions is required")),
                _ => {}
            }
            if let Some(codes) = &rule.on_exit_codes {
                let op = at.child("onExitCodes").child("operator");
                if !["In", "NotIn"].contains(&codes.operator.as_str()) {
                    out.push(v::not_supported(&op, codes.operator.as_str(), &["In", "NotIn"]));
                }
                let values = at.child("onExitCodes").child("values");
                if codes.values.is_empty() {
                    out.push(v::required(&values, "at least one value is required"));
                }
                let mut seen = std::collections::BTreeSet::new();
                for (j, code) in codes.values.iter().enumerate() {
                    if !seen.insert(code) {
                        out.push(v::duplicate(&values.index(j), code));
                    }
                    if codes.operator == "In" && *code == 0 {
                        out.push(v::invalid(&values.index(j), code, "must not be 0 for the In operator"));
                    }
                }
            }
        }
    }
    if let Some(policy) = &spec.success_policy {
        let at = path.child("successPolicy");
        if !indexed {
            out.push(v::invalid(&at, "", "requires indexed completion mode"));
        }
        if policy.rules.is_empty() || policy.rules.len() > 20 {
            out.push(v::invalid(&at.child("rules"), "", "must have at least one rule and at most 20"));
        }
        for (i, rule) in policy.rules.iter().enumerate() {
            let r = at.child("rules").index(i);
            if rule.succeeded_indexes.is_none() && rule.succeeded_count.is_none() {
                out.push(v::required(&r, "at least one of succeededCount or succeededIndexes must be specified"));
            }
            if let Some(c) = rule.succeeded_count {
                if c < 0 {
                    out.push(v::invalid(&r.child("succeededCount"), &c, "must be greater than or equal to 0"));
                } else if spec.completions.is_some_and(|n| c > n) {
                    out.push(v::invalid(&r.child("succeededCount"), &c, "must be less than or equal to completions"));
                }
            }
            if let Some(ix) = &rule.succeeded_indexes {
                if parse_indexes(ix).is_none() {
                    out.push(v::invalid(&r.child("succeededIndexes"), ix.as_str(), "must be a list of indexes and ranges, e.g. 0-2,5"));
                }
            }
        }
    }
}

/// Indexes as `completedIndexes` and `succeededIndexes` write them (`0-2,5`); None when
/// malformed (or a range over 100,000 wide).
pub fn parse_indexes(text: &str) -> Option<std::collections::BTreeSet<i64>> {
    let mut out = std::collections::BTreeSet::new();
    for part in text.split(',').filter(|s| !s.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (i64, i64) = (a.parse().ok()?, b.parse().ok()?);
        if a < 0 || b < a || b - a > 100_000 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
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

    #[test]
    fn failure_and_success_policies_are_defaulted_and_checked() {
        let mut j = job(Some("Never"));
        let spec = j.spec.as_mut().unwrap();
        spec.completion_mode = Some("Indexed".into());
        spec.completions = Some(4);
        spec.backoff_limit_per_index = Some(1);
        spec.max_failed_indexes = Some(2);
        spec.pod_failure_policy = Some(serde_json::from_value(json!({"rules": [
            {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [42]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]})).unwrap());
        j.apply_defaults();
        assert_eq!(j.validate(None), vec![]);
        let spec = j.spec.clone().unwrap();
        assert_eq!(spec.backoff_limit, Some(i32::MAX), "off with a limit per index");
        assert_eq!(spec.pod_replacement_policy.as_deref(), Some("Failed"));
        assert_eq!(spec.pod_failure_policy.unwrap().rules[1].on_pod_conditions.as_ref().unwrap()[0].status, "True");
        let mut bad = job(Some("OnFailure"));
        let spec = bad.spec.as_mut().unwrap();
        spec.backoff_limit_per_index = Some(1);
        spec.pod_failure_policy = Some(serde_json::from_value(json!({"rules": [
            {"action": "FailIndex", "onExitCodes": {"operator": "In", "values": [0, 3, 3]}}]})).unwrap());
        spec.success_policy = Some(serde_json::from_value(json!({"rules": [{"succeededIndexes": "3-1"}]})).unwrap());
        bad.apply_defaults();
        let causes: Vec<String> = bad.validate(None).iter().map(|c| c.to_string()).collect();
        let want = [
            "spec.backoffLimitPerIndex: Forbidden: requires indexed completion mode",
            "spec.template.spec.restartPolicy: Invalid value: \"OnFailure\": only \"Never\" is supported when podFailurePolicy is specified",
            "spec.podFailurePolicy.rules[0].onExitCodes.values[0]: Invalid value: 0: must not be 0 for the In operator",
            "spec.podFailurePolicy.rules[0].onExitCodes.values[2]: Duplicate value: 3",
            "spec.successPolicy: Invalid value: \"\": requires indexed completion mode",
        ];
        for w in want {
            assert!(causes.iter().any(|c| c == w), "{w} in {causes:#?}");
        }
    }
}
