//! core/v1 ServiceAccounts: every namespace has a `default` one (apiserver-lite's service-account
//! controller keeps it there, as kube-controller-manager does), pods run as one
//! (`spec.serviceAccountName` defaults to `default`); validation and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::ServiceAccount;

/// The ServiceAccount every namespace has.
pub const DEFAULT: &str = "default";

impl ApiObject for ServiceAccount {
    const KIND: Kind = Kind::ServiceAccount;
    const INFO: KindInfo =
        KindInfo { short_names: &["sa"], ..KindInfo::core("ServiceAccount", "serviceaccounts", "serviceaccount") };

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        for (field, names) in [
            ("secrets", self.secrets.iter().flatten().map(|s| s.name.clone().unwrap_or_default()).collect::<Vec<_>>()),
            ("imagePullSecrets", self.image_pull_secrets.iter().flatten().map(|s| s.name.clone()).collect()),
        ] {
            for (i, name) in names.iter().enumerate().filter(|(_, n)| !n.is_empty()) {
                let path = FieldPath::root(field).index(i).child("name");
                v::push_all(&mut out, &path, name, v::dns1123_subdomain(name));
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Secrets", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(self.secrets.as_ref().map_or(0, |s| s.len())),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_secrets_are_checked_and_kubectls_cells() {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "default"},
            "imagePullSecrets": [{"name": "Bad_Name"}]}))
        .unwrap();
        let causes = sa.validate(None);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "imagePullSecrets[0].name");
        assert_eq!(sa.cells(Timestamp::now())[..2], [json!("default"), json!(0)]);
    }
}
