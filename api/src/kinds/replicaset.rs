//! apps/v1 ReplicaSets: defaults, validation and the Table; the controller is in apiserver-lite.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{meta_and_spec, ApiObject, Kind, KindInfo};
use crate::table::{col, Column};
use crate::validation::{self as v, Cause, FieldPath};
use crate::apps::{default_template, selector_unchanged, validate_replicated, workload_cells, workload_columns};

pub use k8s_openapi::api::apps::v1::ReplicaSet;

impl ApiObject for ReplicaSet {
    const KIND: Kind = Kind::ReplicaSet;
    const INFO: KindInfo = KindInfo {
        group: "apps",
        short_names: &["rs"],
        categories: &["all"],
        has_status: true,
        has_scale: true,
        has_generation: true,
        ..KindInfo::core("ReplicaSet", "replicasets", "replicaset")
    };

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.replicas.get_or_insert(1);
        if let Some(t) = spec.template.as_mut() {
            default_template(t);
        }
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
        validate_replicated("deployment", spec.replicas, &spec.selector, spec.template.as_ref(), &path, &mut out);
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
