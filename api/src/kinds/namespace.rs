//! core/v1 Namespaces: the `kubernetes.io/metadata.name` label, deletion in two steps (Terminating, then the namespace controller), and the Table.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, DeleteContext, DeletePlan, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause};

pub use k8s_openapi::api::core::v1::Namespace;

/// Namespaces that exist from the start and may not be deleted.
pub const PROTECTED_NAMESPACES: [&str; 3] = ["default", "kube-system", "kube-public"];

impl ApiObject for Namespace {
    const KIND: Kind = Kind::Namespace;
    const INFO: KindInfo = KindInfo {
        namespaced: false,
        short_names: &["ns"],
        has_status: true,
        field_selectors: &["status.phase"],
        ..KindInfo::core("Namespace", "namespaces", "namespace")
    };

    fn apply_defaults(&mut self) {
        if let Some(name) = self.metadata.name.clone() {
            self.metadata.labels.get_or_insert_with(BTreeMap::new).insert("kubernetes.io/metadata.name".into(), name);
        }
    }

    fn prepare_for_create(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.finalizers = Some(vec!["kubernetes".into()]);
        self.status =
            Some(k8s_openapi::api::core::v1::NamespaceStatus { phase: Some("Active".into()), conditions: None });
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_label, &mut out);
        out
    }

    /// The namespaces that always exist may not go; the others turn Terminating, and the
    /// namespace controller deletes their contents, then them.
    fn deletion(&self, ctx: &DeleteContext<'_>) -> DeletePlan {
        let name = self.metadata.name.as_deref().unwrap_or("");
        if PROTECTED_NAMESPACES.contains(&name) {
            return DeletePlan::Forbidden("this namespace may not be deleted".into());
        }
        if self.metadata.deletion_timestamp.is_some() {
            return DeletePlan::AlreadyDeleting;
        }
        DeletePlan::MarkDeleting { at: ctx.now, grace_seconds: None, phase: Some("Terminating") }
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Status", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let phase = self.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(phase),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}
