//! core/v1 ReplicationControllers, stored and served without a controller (kubectl's default
//! prune list names them): defaults (the selector and labels come from the template), validation
//! and the Table.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::apps::{default_template, validate_template, workload_cells, workload_columns, ALWAYS};
use crate::table::{self, col, Column};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::ReplicationController;

impl ApiObject for ReplicationController {
    const KIND: Kind = Kind::ReplicationController;
    const INFO: KindInfo = KindInfo {
        short_names: &["rc"],
        categories: &["all"],
        has_status: true,
        has_generation: true,
        no_controller: true,
        ..KindInfo::core("ReplicationController", "replicationcontrollers", "replicationcontroller")
    };

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        spec.min_ready_seconds.get_or_insert(0);
        let template_labels = spec.template.as_ref().and_then(|t| t.metadata.as_ref()).and_then(|m| m.labels.clone());
        if spec.selector.as_ref().is_none_or(|s| s.is_empty()) {
            spec.selector = template_labels.clone();
        }
        if self.metadata.labels.as_ref().is_none_or(|l| l.is_empty()) {
            self.metadata.labels = template_labels;
        }
        if let Some(t) = spec.template.as_mut() {
            default_template(t);
        }
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(Default::default());
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let path = FieldPath::root("spec");
        let spec = self.spec.clone().unwrap_or_default();
        if let Some(r) = spec.replicas.filter(|r| *r < 0) {
            out.push(v::invalid(&path.child("replicas"), &r, "must be greater than or equal to 0"));
        }
        let selector = spec.selector.clone().unwrap_or_default();
        if selector.is_empty() {
            out.push(v::required(&path.child("selector"), ""));
        } else {
            v::labels(&selector, &path.child("selector"), &mut out);
        }
        let selector = LabelSelector { match_labels: Some(selector), ..Default::default() };
        match &spec.template {
            Some(t) => validate_template(t, Some(&selector), ALWAYS, &path.child("template"), &mut out),
            None => out.push(v::required(&path.child("template"), "")),
        }
        out
    }

    fn columns() -> Vec<Column> {
        workload_columns([col("Desired", "integer", 0), col("Current", "integer", 0), col("Ready", "integer", 0)])
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let st = self.status.clone().unwrap_or_default();
        let counts = [json!(spec.replicas.unwrap_or(1)), json!(st.replicas), json!(st.ready_replicas.unwrap_or(0))];
        let selector = LabelSelector { match_labels: spec.selector.clone(), ..Default::default() };
        let mut cells = workload_cells(&self.metadata, counts, spec.template.as_ref(), &selector, now);
        // kubectl prints an RC's selector as its labels (`app=web`), as a LabelSelector prints.
        cells[7] = json!(table::format_labels(spec.selector.as_ref()));
        cells
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_selector_and_labels_default_to_the_templates() {
        let mut rc: ReplicationController = serde_json::from_value(json!({"metadata": {"name": "old"}, "spec": {
            "template": {"metadata": {"labels": {"app": "old"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .unwrap();
        rc.apply_defaults();
        assert_eq!(rc.validate(None), vec![]);
        assert_eq!(rc.spec.as_ref().unwrap().selector, Some([("app".to_string(), "old".to_string())].into()));
        assert_eq!(rc.metadata.labels, rc.spec.as_ref().unwrap().selector);
        assert_eq!(rc.cells(Timestamp::now())[7], json!("app=old"));
        rc.spec.as_mut().unwrap().selector = Some([("app".to_string(), "new".to_string())].into());
        let causes: Vec<String> = rc.validate(None).iter().map(|c| c.to_string()).collect();
        assert!(causes[0].contains("`selector` does not match template `labels`"), "{causes:?}");
    }
}
