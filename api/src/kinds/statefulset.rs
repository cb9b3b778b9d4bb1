//! apps/v1 StatefulSets (run by the API server's statefulset controller; their claim templates
//! are not provisioned yet): defaults, validation of replicas, selector and template, and the
//! Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{meta_and_spec, ApiObject, Kind, KindInfo};
use crate::apps::{default_template, selector_unchanged, validate_replicated, wide_cells, WIDE_COLUMNS};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::apps::v1::StatefulSet;

impl ApiObject for StatefulSet {
    const KIND: Kind = Kind::StatefulSet;
    const INFO: KindInfo = KindInfo {
        group: "apps",
        short_names: &["sts"],
        categories: &["all"],
        has_status: true,
        has_scale: true,
        has_generation: true,
        ..KindInfo::core("StatefulSet", "statefulsets", "statefulset")
    };

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        spec.pod_management_policy.get_or_insert_with(|| "OrderedReady".into());
        spec.revision_history_limit.get_or_insert(10);
        let strategy = spec.update_strategy.get_or_insert_with(Default::default);
        let kind = strategy.type_.get_or_insert_with(|| "RollingUpdate".into());
        if kind == "RollingUpdate" {
            strategy.rolling_update.get_or_insert_with(Default::default).partition.get_or_insert(0);
        }
        let retention = spec.persistent_volume_claim_retention_policy.get_or_insert_with(Default::default);
        retention.when_deleted.get_or_insert_with(|| "Retain".into());
        retention.when_scaled.get_or_insert_with(|| "Retain".into());
        default_template(&mut spec.template);
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(Default::default());
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        let path = FieldPath::root("spec");
        let Some(spec) = meta_and_spec(&self.metadata, v::dns1123_label, self.spec.as_ref(), &mut out) else {
            return out;
        };
        validate_replicated("statefulset", spec.replicas, &spec.selector, Some(&spec.template), &path, &mut out);
        selector_unchanged(old.and_then(|o| o.spec.as_ref()).map(|s| &s.selector), &spec.selector, &path, &mut out);
        if let Some(p) = spec.pod_management_policy.as_deref().filter(|p| !["OrderedReady", "Parallel"].contains(p)) {
            out.push(v::not_supported(&path.child("podManagementPolicy"), p, &["OrderedReady", "Parallel"]));
        }
        let strategy = spec.update_strategy.as_ref().and_then(|s| s.type_.as_deref());
        if let Some(t) = strategy.filter(|t| !["RollingUpdate", "OnDelete"].contains(t)) {
            out.push(v::not_supported(&path.child("updateStrategy").child("type"), t, &["OnDelete", "RollingUpdate"]));
        }
        out
    }

    fn columns() -> Vec<Column> {
        // kubectl shows no selector for StatefulSets, even with `-o wide`.
        [NAME_COLUMN, col("Ready", "string", 0), AGE_COLUMN].into_iter().chain(WIDE_COLUMNS.into_iter().take(2)).collect()
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let ready = self.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
        let cells = [
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(format!("{ready}/{}", spec.replicas.unwrap_or(1))),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ];
        cells.into_iter().chain(wide_cells(Some(&spec.template), None).into_iter().take(2)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validation_and_cells_as_the_api_server_and_kubectl() {
        let mut s: StatefulSet = serde_json::from_value(json!({"metadata": {"name": "db"}, "spec": {
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}))
        .unwrap();
        s.apply_defaults();
        assert_eq!(s.validate(None), vec![]);
        let spec = s.spec.clone().unwrap();
        assert_eq!((spec.replicas, spec.pod_management_policy.as_deref()), (Some(1), Some("OrderedReady")));
        assert_eq!(s.cells(Timestamp::now())[1], json!("0/1"));
        let mut bad = s.clone();
        let spec = bad.spec.as_mut().unwrap();
        spec.selector.match_labels = Some([("app".to_string(), "other".to_string())].into());
        spec.pod_management_policy = Some("Random".into());
        let causes: Vec<String> = bad.validate(Some(&s)).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes.len(), 3, "{causes:?}");
        assert!(causes[0].contains("`selector` does not match template `labels`"), "{causes:?}");
        assert!(causes.iter().any(|c| c.starts_with("spec.selector: Invalid value") && c.contains("immutable")));
        assert!(causes.iter().any(|c| c.starts_with("spec.podManagementPolicy: Unsupported value: \"Random\"")));
    }
}
