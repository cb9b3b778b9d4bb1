//! apps/v1 DaemonSets (run by the API server's daemonset controller): defaults, validation of
//! selector, template and update strategy, and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{meta_and_spec, ApiObject, Kind, KindInfo};
use crate::apps::{
    default_template, selector_unchanged, validate_selector, validate_template, workload_cells, ALWAYS, WIDE_COLUMNS,
};
use crate::table::{col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::apps::v1::DaemonSet;

impl ApiObject for DaemonSet {
    const KIND: Kind = Kind::DaemonSet;
    const INFO: KindInfo = KindInfo {
        group: "apps",
        short_names: &["ds"],
        categories: &["all"],
        has_status: true,
        has_generation: true,
        ..KindInfo::core("DaemonSet", "daemonsets", "daemonset")
    };

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.revision_history_limit.get_or_insert(10);
        let strategy = spec.update_strategy.get_or_insert_with(Default::default);
        if strategy.type_.get_or_insert_with(|| "RollingUpdate".into()) == "RollingUpdate" {
            use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
            let rolling = strategy.rolling_update.get_or_insert_with(Default::default);
            rolling.max_unavailable.get_or_insert(IntOrString::Int(1));
            rolling.max_surge.get_or_insert(IntOrString::Int(0));
        }
        default_template(&mut spec.template);
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(Default::default());
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        let path = FieldPath::root("spec");
        let Some(spec) = meta_and_spec(&self.metadata, v::dns1123_subdomain, self.spec.as_ref(), &mut out) else {
            return out;
        };
        validate_selector(Some(&spec.selector), "daemonset", &path.child("selector"), &mut out);
        validate_template(&spec.template, Some(&spec.selector), ALWAYS, &path.child("template"), &mut out);
        selector_unchanged(old.and_then(|o| o.spec.as_ref()).map(|s| &s.selector), &spec.selector, &path, &mut out);
        let strategy = spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref());
        if let Some(t) = strategy.filter(|t| !["RollingUpdate", "OnDelete"].contains(t)) {
            out.push(v::not_supported(&path.child("updateStrategy").child("type"), t, &["OnDelete", "RollingUpdate"]));
        }
        out
    }

    fn columns() -> Vec<Column> {
        let counts = ["Desired", "Current", "Ready", "Up-to-date", "Available"].map(|c| col(c, "integer", 0));
        [NAME_COLUMN].into_iter().chain(counts).chain([col("Node Selector", "string", 0), AGE_COLUMN]).chain(WIDE_COLUMNS).collect()
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let st = self.status.clone().unwrap_or_default();
        let node_selector = spec.template.spec.as_ref().and_then(|s| s.node_selector.as_ref());
        let node_selector = crate::table::format_labels(node_selector);
        // workload_cells gives name, counts, age and the wide columns; the node selector goes
        // before the age.
        let mut cells = workload_cells(
            &self.metadata,
            [json!(st.desired_number_scheduled), json!(st.current_number_scheduled), json!(st.number_ready)],
            Some(&spec.template),
            &spec.selector,
            now,
        );
        let more = [json!(st.updated_number_scheduled.unwrap_or(0)), json!(st.number_available.unwrap_or(0)), json!(node_selector)];
        cells.splice(4..4, more);
        cells
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validation_and_cells_in_kubectls_order() {
        let mut d: DaemonSet = serde_json::from_value(json!({"metadata": {"name": "agent"}, "spec": {
            "selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "a"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .unwrap();
        d.apply_defaults();
        assert_eq!(d.validate(None), vec![]);
        assert_eq!(DaemonSet::columns().len(), d.cells(Timestamp::now()).len());
        assert_eq!(d.cells(Timestamp::now())[6], json!("<none>"));
        d.spec.as_mut().unwrap().selector = Default::default();
        let causes: Vec<String> = d.validate(None).iter().map(|c| c.to_string()).collect();
        assert!(causes[0].ends_with("empty selector is invalid for daemonset"), "{causes:?}");
    }
}
