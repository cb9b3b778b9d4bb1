//! rbac.authorization.k8s.io/v1 ClusterRoleBindings: validation with the real texts (the role reference,
//! which never changes, and the subjects; [`crate::rbac`]), and the Table kubectl shows
//! (`NAME ROLE AGE`, the role as `Kind/name`).

use jiff::Timestamp;
use serde_json::Value;

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::Column;
use crate::validation::Cause;

pub use k8s_openapi::api::rbac::v1::ClusterRoleBinding;

impl ApiObject for ClusterRoleBinding {
    const KIND: Kind = Kind::ClusterRoleBinding;
    const INFO: KindInfo = KindInfo {
        group: crate::rbac::GROUP,
        namespaced: false,
        ..KindInfo::core("ClusterRoleBinding", "clusterrolebindings", "clusterrolebinding")
    };

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, crate::rbac::path_segment, &mut out);
        let subjects = self.subjects.clone().unwrap_or_default();
        crate::rbac::validate_binding(&self.role_ref, &subjects, false, old.map(|o| &o.role_ref), &mut out);
        out
    }

    fn columns() -> Vec<Column> {
        crate::rbac::binding_columns()
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        crate::rbac::binding_cells(&self.metadata, &self.role_ref, now)
    }
}
