//! apps/v1 Deployments and ReplicaSets: defaulting, validation and Table cells as the real API
//! server has them. The controllers that act on them are in apiserver-lite.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStrategy, ReplicaSet, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{json, Value};

use crate::kinds::Kind;
use crate::objects::{default_pod_spec, validate_meta, validate_pod_spec, ApiObject};
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

fn validate_selector(sel: Option<&LabelSelector>, path: &FieldPath, out: &mut Vec<Cause>) {
    let Some(sel) = sel else {
        out.push(v::required(path, ""));
        return;
    };
    if selector_is_empty(sel) {
        out.push(v::invalid(path, &format_selector(Some(sel)), "empty selector is invalid for deployment"));
    }
    if let Some(labels) = &sel.match_labels {
        v::labels(labels, &path.child("matchLabels"), out);
    }
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let ep = path.child("matchExpressions").index(i);
        const OPS: [&str; 4] = ["DoesNotExist", "Exists", "In", "NotIn"];
        if !OPS.contains(&e.operator.as_str()) {
            out.push(v::not_supported(&ep.child("operator"), e.operator.as_str(), &OPS));
        }
        let has_values = e.values.as_ref().is_some_and(|v| !v.is_empty());
        match e.operator.as_str() {
            "In" | "NotIn" if !has_values => {
                out.push(v::required(&ep.child("values"), "must be specified when `operator` is 'In' or 'NotIn'"))
            }
            "Exists" | "DoesNotExist" if has_values => out.push(v::forbidden(
                &ep.child("values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            _ => {}
        }
    }
}

/// The template of a workload: labels that match the selector, a valid pod spec whose restart
/// policy is Always.
fn validate_template(
    template: &PodTemplateSpec,
    selector: Option<&LabelSelector>,
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
            if let Some(rp) = spec.restart_policy.as_deref().filter(|rp| *rp != "Always") {
                out.push(v::not_supported(&spec_path.child("restartPolicy"), rp, &["Always"]));
            }
        }
    }
}

/// apps/v1 selectors are immutable.
fn selector_unchanged(old: Option<&LabelSelector>, new: &LabelSelector, spec: &FieldPath, out: &mut Vec<Cause>) {
    if old.is_some_and(|o| o != new) {
        out.push(v::invalid(&spec.child("selector"), format_selector(Some(new)).as_str(), "field is immutable"));
    }
}

fn default_template(template: &mut PodTemplateSpec) {
    default_pod_spec(template.spec.get_or_insert_with(Default::default));
}

/// What Deployments and ReplicaSets check alike in their spec: replicas, the selector, and a
/// template that matches it.
fn validate_replicated(
    replicas: Option<i32>,
    selector: &LabelSelector,
    template: Option<&PodTemplateSpec>,
    spec: &FieldPath,
    out: &mut Vec<Cause>,
) {
    if let Some(r) = replicas.filter(|r| *r < 0) {
        out.push(v::invalid(&spec.child("replicas"), &r, "must be greater than or equal to 0"));
    }
    validate_selector(Some(selector), &spec.child("selector"), out);
    match template {
        Some(t) => validate_template(t, Some(selector), &spec.child("template"), out),
        None => out.push(v::required(&spec.child("template"), "")),
    }
}

/// An `IntOrString` that must be a non-negative number or a percentage; its value for `total`.
fn validate_int_or_percent(value: &IntOrString, path: &FieldPath, out: &mut Vec<Cause>) {
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

fn is_zero(value: Option<&IntOrString>) -> bool {
    match value {
        None => true,
        Some(IntOrString::Int(n)) => *n == 0,
        Some(IntOrString::String(s)) => s.trim_end_matches('%').parse::<i64>().is_ok_and(|n| n == 0),
    }
}

/// The `-o wide` columns of workloads.
/// A workload's table (Deployment, ReplicaSet): name, its three replica counts, age; with
/// `-o wide` also its containers, images and selector.
fn workload_columns(counts: [Column; 3]) -> Vec<Column> {
    let wide = [col("Containers", "string", 1), col("Images", "string", 1), col("Selector", "string", 1)];
    [NAME_COLUMN].into_iter().chain(counts).chain([AGE_COLUMN]).chain(wide).collect()
}

/// Cells in the order of [`workload_columns`].
fn workload_cells(
    meta: &ObjectMeta,
    counts: [Value; 3],
    template: Option<&PodTemplateSpec>,
    selector: &LabelSelector,
    now: Timestamp,
) -> Vec<Value> {
    let containers = template.and_then(|t| t.spec.as_ref()).map(|s| s.containers.as_slice()).unwrap_or_default();
    let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
    let images: Vec<&str> = containers.iter().map(|c| c.image.as_deref().unwrap_or_default()).collect();
    [json!(meta.name.clone().unwrap_or_default())]
        .into_iter()
        .chain(counts)
        .chain([
            table::age(meta.creation_timestamp.as_ref(), now),
            json!(names.join(",")),
            json!(images.join(",")),
            json!(format_selector(Some(selector))),
        ])
        .collect()
}

// === Deployment ===

impl ApiObject for Deployment {
    const KIND: Kind = Kind::Deployment;

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        spec.revision_history_limit.get_or_insert(10);
        spec.progress_deadline_seconds.get_or_insert(600);
        let strategy = spec.strategy.get_or_insert_with(DeploymentStrategy::default);
        let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into()).clone();
        if kind == "RollingUpdate" {
            let ru = strategy.rolling_update.get_or_insert_with(RollingUpdateDeployment::default);
            ru.max_unavailable.get_or_insert(IntOrString::String("25%".into()));
            ru.max_surge.get_or_insert(IntOrString::String("25%".into()));
        }
        default_template(&mut spec.template);
    }

    fn prepare_for_create(&mut self) {
        self.status = None;
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let path = FieldPath::root("spec");
        let Some(spec) = &self.spec else {
            out.push(v::required(&path, ""));
            return out;
        };
        validate_replicated(spec.replicas, &spec.selector, Some(&spec.template), &path, &mut out);
        if let Some(strategy) = &spec.strategy {
            let sp = path.child("strategy");
            match strategy.type_.as_deref() {
                Some("Recreate") if strategy.rolling_update.is_some() => out.push(v::forbidden(
                    &sp.child("rollingUpdate"),
                    "may not be specified when strategy `type` is 'Recreate'",
                )),
                Some("Recreate") | None => {}
                Some("RollingUpdate") => {
                    if let Some(ru) = &strategy.rolling_update {
                        let rp = sp.child("rollingUpdate");
                        if let Some(s) = &ru.max_surge {
                            validate_int_or_percent(s, &rp.child("maxSurge"), &mut out);
                        }
                        if let Some(u) = &ru.max_unavailable {
                            validate_int_or_percent(u, &rp.child("maxUnavailable"), &mut out);
                        }
                        if is_zero(ru.max_surge.as_ref()) && is_zero(ru.max_unavailable.as_ref()) {
                            out.push(v::invalid(&rp.child("maxUnavailable"), &0, "may not be 0 when `maxSurge` is 0"));
                        }
                    }
                }
                Some(other) => out.push(v::not_supported(&sp.child("type"), other, &["Recreate", "RollingUpdate"])),
            }
        }
        if let Some(n) = spec.revision_history_limit.filter(|n| *n < 0) {
            out.push(v::invalid(&path.child("revisionHistoryLimit"), &n, "must be greater than or equal to 0"));
        }
        selector_unchanged(old.and_then(|o| o.spec.as_ref()).map(|s| &s.selector), &spec.selector, &path, &mut out);
        out
    }

    fn columns() -> Vec<Column> {
        workload_columns([col("Ready", "string", 0), col("Up-to-date", "integer", 0), col("Available", "integer", 0)])
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.clone().unwrap_or_default();
        let counts = [
            json!(format!("{}/{}", status.ready_replicas.unwrap_or(0), spec.replicas.unwrap_or(1))),
            json!(status.updated_replicas.unwrap_or(0)),
            json!(status.available_replicas.unwrap_or(0)),
        ];
        workload_cells(&self.metadata, counts, Some(&spec.template), &spec.selector, now)
    }
}

// === ReplicaSet ===

impl ApiObject for ReplicaSet {
    const KIND: Kind = Kind::ReplicaSet;

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        if let Some(t) = spec.template.as_mut() {
            default_template(t);
        }
    }

    fn prepare_for_create(&mut self) {
        self.status = None;
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let path = FieldPath::root("spec");
        let Some(spec) = &self.spec else {
            out.push(v::required(&path, ""));
            return out;
        };
        validate_replicated(spec.replicas, &spec.selector, spec.template.as_ref(), &path, &mut out);
        selector_unchanged(old.and_then(|o| o.spec.as_ref()).map(|s| &s.selector), &spec.selector, &path, &mut out);
        out
    }

    fn columns() -> Vec<Column> {
        workload_columns([col("Desired", "integer", 0), col("Current", "integer", 0), col("Ready", "integer", 0)])
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let status = self.status.clone().unwrap_or_default();
        let counts =
            [json!(spec.replicas.unwrap_or(1)), json!(status.replicas), json!(status.ready_replicas.unwrap_or(0))];
        workload_cells(&self.metadata, counts, spec.template.as_ref(), &spec.selector, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(yaml: &str) -> Deployment {
        let mut d: Deployment = serde_yaml::from_str(yaml).unwrap();
        d.apply_defaults();
        d
    }

    const WEB: &str = "
metadata: {name: web}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: echo, image: podpath/echo}]}
";

    #[test]
    fn defaults_are_the_api_servers() {
        let d = deployment(WEB);
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.revision_history_limit, Some(10));
        assert_eq!(spec.progress_deadline_seconds, Some(600));
        let s = spec.strategy.unwrap();
        assert_eq!(s.type_.as_deref(), Some("RollingUpdate"));
        let ru = s.rolling_update.unwrap();
        assert_eq!(ru.max_surge, Some(IntOrString::String("25%".into())));
        assert_eq!(ru.max_unavailable, Some(IntOrString::String("25%".into())));
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.restart_policy.as_deref(), Some("Always"));
        assert_eq!(pod.containers[0].image_pull_policy.as_deref(), Some("Always"));
    }

    #[test]
    fn a_valid_deployment_has_no_causes() {
        assert_eq!(deployment(WEB).validate(None), vec![]);
    }

    #[test]
    fn mistakes_are_named_as_the_api_server_names_them() {
        let cases = [
            ("replicas: -1", "spec.replicas: Invalid value: -1: must be greater than or equal to 0"),
            (
                "template: {metadata: {labels: {app: other}}, spec: {containers: [{name: a, image: b}]}}",
                "spec.template.metadata.labels: Invalid value: \"app=other\": `selector` does not match template `labels`",
            ),
            ("selector: {}", "spec.selector: Invalid value: \"<none>\": empty selector is invalid for deployment"),
            (
                "strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 0, maxUnavailable: 0}}",
                "spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: may not be 0 when `maxSurge` is 0",
            ),
            (
                "strategy: {type: Blue}",
                "spec.strategy.type: Unsupported value: \"Blue\": supported values: \"Recreate\", \"RollingUpdate\"",
            ),
            (
                "strategy: {type: RollingUpdate, rollingUpdate: {maxSurge: 120%}}",
                "spec.strategy.rollingUpdate.maxSurge: Invalid value: \"120%\": must not be greater than 100%",
            ),
            (
                "template: {metadata: {labels: {app: web}}, spec: {restartPolicy: Never, containers: [{name: a, image: b}]}}",
                "spec.template.spec.restartPolicy: Unsupported value: \"Never\": supported values: \"Always\"",
            ),
        ];
        for (patch, want) in cases {
            let mut base: serde_yaml::Value = serde_yaml::from_str(WEB).unwrap();
            let extra: serde_yaml::Mapping = serde_yaml::from_str(patch).unwrap();
            for (k, val) in extra {
                base["spec"][k] = val;
            }
            let mut d: Deployment = serde_yaml::from_value(base).unwrap();
            d.apply_defaults();
            let causes: Vec<String> = d.validate(None).iter().map(|c| c.to_string()).collect();
            assert!(causes.iter().any(|c| c == want), "{patch}: {causes:?}");
        }
    }

    #[test]
    fn the_selector_is_immutable() {
        let old = deployment(WEB);
        let mut new = old.clone();
        let spec = new.spec.as_mut().unwrap();
        spec.selector.match_labels.as_mut().unwrap().insert("tier".into(), "x".into());
        spec.template.metadata.as_mut().unwrap().labels.as_mut().unwrap().insert("tier".into(), "x".into());
        let causes: Vec<String> = new.validate(Some(&old)).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["spec.selector: Invalid value: \"app=web,tier=x\": field is immutable"]);
    }

    #[test]
    fn cells_follow_kubectl() {
        let mut d = deployment(WEB);
        d.spec.as_mut().unwrap().replicas = Some(3);
        d.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
            ready_replicas: Some(2),
            updated_replicas: Some(3),
            available_replicas: Some(2),
            ..Default::default()
        });
        let cells = d.cells(Timestamp::now());
        assert_eq!(cells[..4], [json!("web"), json!("2/3"), json!(3), json!(2)]);
        assert_eq!(cells[5..], [json!("echo"), json!("podpath/echo"), json!("app=web")]);
    }

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
