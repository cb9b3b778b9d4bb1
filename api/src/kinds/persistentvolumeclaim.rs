//! core/v1 PersistentVolumeClaims (bound and provisioned by apiserver-lite's volume
//! controller): defaults, validation of access modes and the storage request,
//! the immutable spec, the `Pending` phase, and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::persistentvolume::{access_modes, validate_access_modes};
use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::PersistentVolumeClaim;

/// Keeps a claim while a pod uses it (removed by the volume controller).
pub const PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";
/// On a claim: the node a WaitForFirstConsumer volume is to be provisioned on (the scheduler's).
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// On a claim: the provisioner that is to make its volume.
pub const PROVISIONER_ANNOTATION: &str = "volume.kubernetes.io/storage-provisioner";

impl ApiObject for PersistentVolumeClaim {
    const KIND: Kind = Kind::PersistentVolumeClaim;
    const INFO: KindInfo = KindInfo {
        short_names: &["pvc"],
        has_status: true,
        ..KindInfo::core("PersistentVolumeClaim", "persistentvolumeclaims", "persistentvolumeclaim")
    };

    fn apply_defaults(&mut self) {
        self.spec.get_or_insert_with(Default::default).volume_mode.get_or_insert_with(|| "Filesystem".into());
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let path = FieldPath::root("spec");
        let spec = self.spec.clone().unwrap_or_default();
        validate_access_modes(spec.access_modes.as_deref(), &path.child("accessModes"), &mut out);
        let storage = spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage"));
        if storage.is_none() {
            out.push(v::required(&FieldPath::root("spec").child("resources[storage]"), ""));
        }
        if let Some(m) = spec.volume_mode.as_deref().filter(|m| !["Filesystem", "Block"].contains(m)) {
            out.push(v::not_supported(&path.child("volumeMode"), m, &["Block", "Filesystem"]));
        }
        // After creation only the storage request may change (and a volume be named once).
        if let Some(old_spec) = old.and_then(|o| o.spec.as_ref()) {
            let mut a = old_spec.clone();
            let mut b = spec.clone();
            a.resources = None;
            b.resources = None;
            if a.volume_name.is_none() {
                a.volume_name = b.volume_name.clone();
            }
            if a != b {
                out.push(v::forbidden(
                    &path,
                    "spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims",
                ));
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Status", "string", 0),
            col("Volume", "string", 0),
            col("Capacity", "string", 0),
            col("Access Modes", "string", 0),
            col("StorageClass", "string", 0),
            col("VolumeAttributesClass", "string", 0),
            AGE_COLUMN,
            col("VolumeMode", "string", 1),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let st = self.status.clone().unwrap_or_default();
        let bound = st.phase.as_deref() == Some("Bound");
        let capacity = st.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone()).filter(|_| bound);
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(st.phase.unwrap_or_default()),
            json!(spec.volume_name.unwrap_or_default()),
            json!(capacity.unwrap_or_default()),
            json!(if bound { access_modes(st.access_modes.as_deref()) } else { String::new() }),
            json!(spec.storage_class_name.unwrap_or_else(|| "<unset>".into())),
            json!(spec.volume_attributes_class_name.unwrap_or_else(|| "<unset>".into())),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
            json!(spec.volume_mode.unwrap_or_else(|| "Filesystem".into())),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_needs_modes_and_storage_and_keeps_its_spec() {
        let mut c: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "data"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap();
        c.prepare_for_create();
        c.apply_defaults();
        assert_eq!(c.validate(None), vec![]);
        assert_eq!(c.cells(Timestamp::now())[1], json!("Pending"));
        let empty: PersistentVolumeClaim = serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {}})).unwrap();
        let causes: Vec<String> = empty.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            causes,
            ["spec.accessModes: Required value: at least 1 access mode is required", "spec.resources[storage]: Required value"]
        );
        let mut grown = c.clone();
        grown.spec.as_mut().unwrap().resources = serde_json::from_value(json!({"requests": {"storage": "2Gi"}})).unwrap();
        assert_eq!(grown.validate(Some(&c)), vec![]);
        grown.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
        assert_eq!(grown.validate(Some(&c)).len(), 1);
    }
}
