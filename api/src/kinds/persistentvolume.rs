//! core/v1 PersistentVolumes (cluster-scoped; bound by apiserver-lite's volume controller):
//! defaults, validation of capacity, access modes and the one
//! volume source, the `Pending` phase, and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::PersistentVolume;

/// Keeps a volume while a claim is bound to it (removed by the volume controller).
pub const PROTECTION_FINALIZER: &str = "kubernetes.io/pv-protection";
/// On a volume: the provisioner that made it (and deletes it, for `reclaimPolicy: Delete`).
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";

const MODES: [&str; 4] = ["ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"];

/// Access modes as kubectl shows them: `RWO,ROX`.
pub(crate) fn access_modes(modes: Option<&[String]>) -> String {
    let short = |m: &str| match m {
        "ReadWriteOnce" => "RWO",
        "ReadOnlyMany" => "ROX",
        "ReadWriteMany" => "RWX",
        "ReadWriteOncePod" => "RWOP",
        _ => "",
    };
    modes.unwrap_or_default().iter().map(|m| short(m)).filter(|s| !s.is_empty()).collect::<Vec<_>>().join(",")
}

/// At least one access mode, each a known one; ReadWriteOncePod alone.
pub(crate) fn validate_access_modes(modes: Option<&[String]>, path: &FieldPath, out: &mut Vec<Cause>) {
    let modes = modes.unwrap_or_default();
    if modes.is_empty() {
        out.push(v::required(path, "at least 1 access mode is required"));
    }
    for m in modes.iter().filter(|m| !MODES.contains(&m.as_str())) {
        out.push(v::not_supported(path, m.as_str(), &MODES));
    }
    if modes.len() > 1 && modes.iter().any(|m| m == "ReadWriteOncePod") {
        out.push(v::forbidden(path, "may not use ReadWriteOncePod with other access modes"));
    }
}

impl ApiObject for PersistentVolume {
    const KIND: Kind = Kind::PersistentVolume;
    const INFO: KindInfo = KindInfo {
        namespaced: false,
        short_names: &["pv"],
        has_status: true,
        ..KindInfo::core("PersistentVolume", "persistentvolumes", "persistentvolume")
    };

    fn apply_defaults(&mut self) {
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.persistent_volume_reclaim_policy.get_or_insert_with(|| "Retain".into());
        spec.volume_mode.get_or_insert_with(|| "Filesystem".into());
    }

    fn prepare_for_create(&mut self) {
        self.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        });
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let path = FieldPath::root("spec");
        let spec = self.spec.clone().unwrap_or_default();
        if spec.capacity.as_ref().and_then(|c| c.get("storage")).is_none() {
            out.push(v::required(&path.child("capacity"), ""));
        }
        validate_access_modes(spec.access_modes.as_deref(), &path.child("accessModes"), &mut out);
        // The volume sources are the spec's fields besides these; exactly one must be set.
        const NOT_SOURCES: [&str; 8] = [
            "accessModes",
            "capacity",
            "claimRef",
            "mountOptions",
            "nodeAffinity",
            "persistentVolumeReclaimPolicy",
            "storageClassName",
            "volumeMode",
        ];
        let fields = serde_json::to_value(&spec).unwrap_or_default();
        let sources = fields.as_object().map_or(0, |o| {
            o.keys().filter(|k| !NOT_SOURCES.contains(&k.as_str()) && k.as_str() != "volumeAttributesClassName").count()
        });
        match sources {
            0 => out.push(v::required(&path, "must specify a volume type")),
            1 => {}
            _ => out.push(v::forbidden(&path, "may not specify more than 1 volume type")),
        }
        const POLICIES: [&str; 3] = ["Delete", "Recycle", "Retain"];
        if let Some(p) = spec.persistent_volume_reclaim_policy.as_deref().filter(|p| !POLICIES.contains(p)) {
            out.push(v::not_supported(&path.child("persistentVolumeReclaimPolicy"), p, &POLICIES));
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Capacity", "string", 0),
            col("Access Modes", "string", 0),
            col("Reclaim Policy", "string", 0),
            col("Status", "string", 0),
            col("Claim", "string", 0),
            col("StorageClass", "string", 0),
            col("VolumeAttributesClass", "string", 0),
            col("Reason", "string", 0),
            AGE_COLUMN,
            col("VolumeMode", "string", 1),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let st = self.status.clone().unwrap_or_default();
        let claim = spec.claim_ref.as_ref().map_or(String::new(), |c| {
            format!("{}/{}", c.namespace.clone().unwrap_or_default(), c.name.clone().unwrap_or_default())
        });
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(spec.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone()).unwrap_or_default()),
            json!(access_modes(spec.access_modes.as_deref())),
            json!(spec.persistent_volume_reclaim_policy.unwrap_or_default()),
            json!(st.phase.unwrap_or_default()),
            json!(claim),
            json!(spec.storage_class_name.unwrap_or_default()),
            json!(spec.volume_attributes_class_name.unwrap_or_else(|| "<unset>".into())),
            json!(st.reason.unwrap_or_default()),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
            json!(spec.volume_mode.unwrap_or_else(|| "Filesystem".into())),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_needs_capacity_modes_and_one_source() {
        let mut pv: PersistentVolume = serde_json::from_value(json!({"metadata": {"name": "pv1"}, "spec": {
            "capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce", "ReadOnlyMany"], "hostPath": {"path": "/data"}}}))
        .unwrap();
        pv.prepare_for_create();
        pv.apply_defaults();
        assert_eq!(pv.validate(None), vec![]);
        assert_eq!(pv.cells(Timestamp::now())[1..5], [json!("5Gi"), json!("RWO,ROX"), json!("Retain"), json!("Pending")]);
        let none: PersistentVolume =
            serde_json::from_value(json!({"metadata": {"name": "pv2"}, "spec": {"accessModes": ["Sometimes"]}})).unwrap();
        let causes: Vec<String> = none.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes.len(), 3, "{causes:?}");
        assert_eq!(causes[0], "spec.capacity: Required value");
        assert!(causes[1].starts_with("spec.accessModes: Unsupported value: \"Sometimes\""));
        assert_eq!(causes[2], "spec: Required value: must specify a volume type");
    }
}
