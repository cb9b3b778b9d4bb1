//! storage.k8s.io/v1 StorageClasses: the defaults (`reclaimPolicy: Delete`,
//! `volumeBindingMode: Immediate`), validation with the real texts (the provisioner, the
//! reclaim policy, the binding mode, the fields that never change), and the Table, whose name
//! cell marks the default class as kubectl shows it (`standard (default)`).

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::storage::v1::StorageClass;

/// The annotation that makes a StorageClass the one claims without a class get.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";
/// The provisioner of the lab's StorageClass: directories on the node the pod runs on, as
/// local-path-provisioner makes them (kind's default class).
pub const LAB_PROVISIONER: &str = "podpath.dev/local-path";
/// The lab's default StorageClass (kind's name for its own).
pub const LAB_CLASS: &str = "standard";

/// Whether `class` is marked as the default one.
pub fn is_default(class: &StorageClass) -> bool {
    class.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION)).is_some_and(|v| v == "true")
}

impl ApiObject for StorageClass {
    const KIND: Kind = Kind::StorageClass;
    const INFO: KindInfo = KindInfo {
        group: "storage.k8s.io",
        namespaced: false,
        short_names: &["sc"],
        ..KindInfo::core("StorageClass", "storageclasses", "storageclass")
    };

    fn apply_defaults(&mut self) {
        self.reclaim_policy.get_or_insert_with(|| "Delete".into());
        self.volume_binding_mode.get_or_insert_with(|| "Immediate".into());
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let provisioner = FieldPath::root("provisioner");
        if self.provisioner.is_empty() {
            out.push(v::required(&provisioner, ""));
        } else {
            // A qualified name, checked lowercased (as the real validation does).
            v::push_all(&mut out, &provisioner, &self.provisioner, v::qualified_name(&self.provisioner.to_lowercase()));
        }
        if self.parameters.as_ref().is_some_and(|p| p.len() > 512) {
            out.push(v::invalid(&FieldPath::root("parameters"), "", "must have at most 512 parameters"));
        }
        const POLICIES: [&str; 2] = ["Delete", "Retain"];
        if let Some(p) = self.reclaim_policy.as_deref().filter(|p| !POLICIES.contains(p)) {
            out.push(v::not_supported(&FieldPath::root("reclaimPolicy"), p, &POLICIES));
        }
        const MODES: [&str; 2] = ["Immediate", "WaitForFirstConsumer"];
        match self.volume_binding_mode.as_deref() {
            None => out.push(v::required(&FieldPath::root("volumeBindingMode"), "")),
            Some(m) if !MODES.contains(&m) => out.push(v::not_supported(&FieldPath::root("volumeBindingMode"), m, &MODES)),
            Some(_) => {}
        }
        if let Some(old) = old {
            if old.parameters != self.parameters {
                out.push(v::forbidden(&FieldPath::root("parameters"), "updates to parameters are forbidden."));
            }
            if old.provisioner != self.provisioner {
                out.push(v::forbidden(&provisioner, "updates to provisioner are forbidden."));
            }
            if old.reclaim_policy != self.reclaim_policy {
                out.push(v::forbidden(&FieldPath::root("reclaimPolicy"), "updates to reclaimPolicy are forbidden."));
            }
            if old.volume_binding_mode != self.volume_binding_mode {
                let mode = self.volume_binding_mode.clone().unwrap_or_default();
                out.push(v::invalid(&FieldPath::root("volumeBindingMode"), mode.as_str(), "field is immutable"));
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Provisioner", "string", 0),
            col("ReclaimPolicy", "string", 0),
            col("VolumeBindingMode", "string", 0),
            col("AllowVolumeExpansion", "string", 0),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let name = self.metadata.name.clone().unwrap_or_default();
        vec![
            json!(if is_default(self) { format!("{name} (default)") } else { name }),
            json!(self.provisioner),
            json!(self.reclaim_policy.clone().unwrap_or_default()),
            json!(self.volume_binding_mode.clone().unwrap_or_default()),
            json!(self.allow_volume_expansion.unwrap_or(false).to_string()),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_class_is_defaulted_validated_and_keeps_what_it_provisions_with() {
        let mut sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": "standard", "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
            "provisioner": LAB_PROVISIONER}))
        .unwrap();
        sc.apply_defaults();
        assert_eq!(sc.validate(None), vec![]);
        assert_eq!(
            sc.cells(Timestamp::now())[..5],
            [json!("standard (default)"), json!(LAB_PROVISIONER), json!("Delete"), json!("Immediate"), json!("false")]
        );
        let bad: StorageClass = serde_json::from_value(json!({"metadata": {"name": "x"}, "provisioner": "",
            "reclaimPolicy": "Recycle", "volumeBindingMode": "Later"}))
        .unwrap();
        let causes: Vec<String> = bad.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes[0], "provisioner: Required value");
        assert!(causes[1].starts_with("reclaimPolicy: Unsupported value: \"Recycle\""), "{causes:?}");
        assert!(causes[2].starts_with("volumeBindingMode: Unsupported value: \"Later\""), "{causes:?}");
        let mut changed = sc.clone();
        changed.provisioner = "example.com/nfs".into();
        changed.volume_binding_mode = Some("WaitForFirstConsumer".into());
        let causes: Vec<String> = changed.validate(Some(&sc)).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            causes,
            [
                "provisioner: Forbidden: updates to provisioner are forbidden.",
                "volumeBindingMode: Invalid value: \"WaitForFirstConsumer\": field is immutable"
            ]
        );
    }
}
