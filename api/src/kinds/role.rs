//! rbac.authorization.k8s.io/v1 Roles: their rules validated with the real texts
//! ([`crate::rbac`]); the Table is the default one (`NAME CREATED AT`), as kubectl shows it.

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::validation::Cause;

pub use k8s_openapi::api::rbac::v1::Role;

impl ApiObject for Role {
    const KIND: Kind = Kind::Role;
    const INFO: KindInfo = KindInfo {
        group: crate::rbac::GROUP,
        namespaced: true,
        ..KindInfo::core("Role", "roles", "role")
    };

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, crate::rbac::path_segment, &mut out);
        crate::rbac::validate_rules(self.rules.as_deref().unwrap_or_default(), true, &mut out);
        out
    }
}
