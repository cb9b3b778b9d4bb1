//! What workloads (apps/v1, batch/v1, ReplicationControllers) share: label selectors (formatted
//! and matched), template and replica validation, surge arithmetic, and their Table columns.
//! The kinds themselves are in `kinds`; the Deployment and ReplicaSet controllers are in
//! apiserver-lite.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};

use crate::kinds::pod::{default_pod_spec, validate_pod_spec};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

/// The label carrying a ReplicaSet's pod-template hash (on the ReplicaSet, its selector and its pods).
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The annotation numbering a Deployment's ReplicaSets (`kubectl rollout history`).
pub const REVISION_ANNOTATION: &str = "deployment.kubernetes.io/revision";

/// `metav1.FormatLabelSelector`: `app=web,tier in (a,b)`, `<none>` for none.
pub fn format_selector(sel: Option<&LabelSelector>) -> String {
    let Some(sel) = sel else { return "<none>".into() };
    let mut parts: Vec<String> = sel.match_labels.iter().flatten().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            op => format!("{} {op} ({values})", e.key),
        });
    }
    if parts.is_empty() {
        "<none>".into()
    } else {
        parts.join(",")
    }
}

/// Whether `labels` satisfy `sel` (matchLabels and matchExpressions).
pub fn selector_matches(sel: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    let labels_ok = sel.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = sel.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

fn selector_is_empty(sel: &LabelSelector) -> bool {
    sel.match_labels.as_ref().is_none_or(BTreeMap::is_empty) && sel.match_expressions.as_ref().is_none_or(Vec::is_empty)
}

/// A workload's selector: required, not empty (`for_kind` ends the API server's message: its
/// `deployment`, `daemonset`, `statefulset`), valid labels and expressions.
pub(crate) fn validate_selector(sel: Option<&LabelSelector>, for_kind: &str, path: &FieldPath, out: &mut Vec<Cause>) {
    let Some(sel) = sel else {
        out.push(v::required(path, ""));
        return;
    };
    if selector_is_empty(sel) {
        out.push(v::invalid(path, &format_selector(Some(sel)), &format!("empty selector is invalid for {for_kind}")));
    }
    v::label_selector(sel, path, out);
}

/// The restart policy of long-running workloads' pods.
pub(crate) const ALWAYS: &[&str] = &["Always"];

/// The template of a workload: labels that match the selector, a valid pod spec whose restart
/// policy is one of `restart` (Always for long-running workloads, OnFailure or Never for Jobs).
pub(crate) fn validate_template(
    template: &PodTemplateSpec,
    selector: Option<&LabelSelector>,
    restart: &[&str],
    path: &FieldPath,
    out: &mut Vec<Cause>,
) {
    let meta = template.metadata.clone().unwrap_or_default();
    if let Some(labels) = &meta.labels {
        v::labels(labels, &path.child("metadata").child("labels"), out);
    }
    if let Some(sel) = selector.filter(|s| !selector_is_empty(s)) {
        if !selector_matches(sel, meta.labels.as_ref()) {
            let shown = table::format_labels(meta.labels.as_ref());
            out.push(v::invalid(
                &path.child("metadata").child("labels"),
                shown.as_str(),
                "`selector` does not match template `labels`",
            ));
        }
    }
    let spec_path = path.child("spec");
    match &template.spec {
        None => out.push(v::required(&spec_path, "")),
        Some(spec) => {
            validate_pod_spec(spec, &spec_path, out);
            if let Some(rp) = spec.restart_policy.as_deref().filter(|rp| !restart.contains(rp)) {
                out.push(v::not_supported(&spec_path.child("restartPolicy"), rp, restart));
            }
        }
    }
}

/// apps/v1 selectors are immutable.
pub(crate) fn selector_unchanged(
    old: Option<&LabelSelector>,
    new: &LabelSelector,
    spec: &FieldPath,
    out: &mut Vec<Cause>,
) {
    if old.is_some_and(|o| o != new) {
        out.push(v::invalid(&spec.child("selector"), format_selector(Some(new)).as_str(), "field is immutable"));
    }
}

pub(crate) fn default_template(template: &mut PodTemplateSpec) {
    default_pod_spec(template.spec.get_or_insert_with(Default::default));
}

/// What Deployments, ReplicaSets and StatefulSets check alike in their spec: replicas, the selector, and a
/// template that matches it.
pub(crate) fn validate_replicated(
    for_kind: &str,
    replicas: Option<i32>,
    selector: &LabelSelector,
    template: Option<&PodTemplateSpec>,
    spec: &FieldPath,
    out: &mut Vec<Cause>,
) {
    if let Some(r) = replicas.filter(|r| *r < 0) {
        out.push(v::invalid(&spec.child("replicas"), &r, "must be greater than or equal to 0"));
    }
    validate_selector(Some(selector), for_kind, &spec.child("selector"), out);
    match template {
        Some(t) => validate_template(t, Some(selector), ALWAYS, &spec.child("template"), out),
        None => out.push(v::required(&spec.child("template"), "")),
    }
}

/// An `IntOrString` that must be a non-negative number or a percentage; its value for `total`.
pub(crate) fn validate_int_or_percent(value: &IntOrString, path: &FieldPath, out: &mut Vec<Cause>) {
    match value {
        IntOrString::Int(n) if *n < 0 => out.push(v::invalid(path, n, "must be greater than or equal to 0")),
        IntOrString::Int(_) => {}
        IntOrString::String(s) => match s.strip_suffix('%').and_then(|n| n.parse::<i64>().ok()) {
            Some(p) if (0..=100).contains(&p) => {}
            Some(_) => out.push(v::invalid(path, s.as_str(), "must not be greater than 100%")),
            None => out.push(v::invalid(path, s.as_str(), "a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')")),
        },
    }
}

/// The absolute value of maxSurge/maxUnavailable for `total` replicas (percentages round up for
/// surge, down for unavailable, as the deployment controller does).
pub fn scaled_value(value: Option<&IntOrString>, total: i32, round_up: bool) -> i32 {
    match value {
        None => 0,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => {
            let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(0);
            let scaled = i64::from(total) * pct;
            (if round_up { (scaled + 99) / 100 } else { scaled / 100 }) as i32
        }
    }
}

pub(crate) fn is_zero(value: Option<&IntOrString>) -> bool {
    match value {
        None => true,
        Some(IntOrString::Int(n)) => *n == 0,
        Some(IntOrString::String(s)) => s.trim_end_matches('%').parse::<i64>().is_ok_and(|n| n == 0),
    }
}

/// kubectl's `-o wide` columns of the kinds with a pod template: containers, images, selector.
pub(crate) const WIDE_COLUMNS: [Column; 3] =
    [col("Containers", "string", 1), col("Images", "string", 1), col("Selector", "string", 1)];

/// The cells of [`WIDE_COLUMNS`]: the template's container names and images, and the selector.
pub(crate) fn wide_cells(template: Option<&PodTemplateSpec>, selector: Option<&LabelSelector>) -> [Value; 3] {
    let containers = template.and_then(|t| t.spec.as_ref()).map(|s| s.containers.as_slice()).unwrap_or_default();
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    let images: Vec<&str> = containers.iter().map(|c| c.image.as_deref().unwrap_or_default()).collect();
    [json!(names.join(",")), json!(images.join(",")), json!(format_selector(selector))]
}

/// A workload's table (Deployment, ReplicaSet, ReplicationController): name, its three replica
/// counts, age; with `-o wide` also its containers, images and selector.
pub(crate) fn workload_columns(counts: [Column; 3]) -> Vec<Column> {
    [NAME_COLUMN].into_iter().chain(counts).chain([AGE_COLUMN]).chain(WIDE_COLUMNS).collect()
}

/// Cells in the order of [`workload_columns`].
pub(crate) fn workload_cells(
    meta: &ObjectMeta,
    counts: [Value; 3],
    template: Option<&PodTemplateSpec>,
    selector: &LabelSelector,
    now: Timestamp,
) -> Vec<Value> {
    [json!(meta.name.clone().unwrap_or_default())]
        .into_iter()
        .chain(counts)
        .chain([table::age(meta.creation_timestamp.as_ref(), now)])
        .chain(wide_cells(template, Some(selector)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surge_rounds_up_and_unavailable_down() {
        let pct = IntOrString::String("25%".into());
        assert_eq!(scaled_value(Some(&pct), 3, true), 1);
        assert_eq!(scaled_value(Some(&pct), 3, false), 0);
        assert_eq!(scaled_value(Some(&IntOrString::Int(2)), 3, false), 2);
    }

    #[test]
    fn selectors_format_and_match() {
        let sel: LabelSelector = serde_json::from_value(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]
        }))
        .unwrap();
        assert_eq!(format_selector(Some(&sel)), "app=web,tier in (a,b)");
        let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(selector_matches(&sel, Some(&labels(&[("app", "web"), ("tier", "a")]))));
        assert!(!selector_matches(&sel, Some(&labels(&[("app", "web"), ("tier", "c")]))));
        assert!(!selector_matches(&sel, None));
    }
}
