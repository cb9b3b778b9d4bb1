//! apps/v1 ControllerRevisions: the template snapshots the DaemonSet and StatefulSet
//! controllers keep (what `kubectl rollout history` lists and `rollout undo` patches back);
//! validation (a revision number, immutable data) and the Table (`CONTROLLER` from the owner).

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::apps::v1::ControllerRevision;

impl ApiObject for ControllerRevision {
    const KIND: Kind = Kind::ControllerRevision;
    const INFO: KindInfo = KindInfo {
        group: "apps",
        ..KindInfo::core("ControllerRevision", "controllerrevisions", "controllerrevision")
    };

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        if self.revision < 0 {
            out.push(v::invalid(&FieldPath::root("revision"), &self.revision, "must be greater than or equal to 0"));
        }
        if old.is_some_and(|o| o.data != self.data) {
            out.push(v::forbidden(&FieldPath::root("data"), "field is immutable"));
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Controller", "string", 0), col("Revision", "integer", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let owner = self.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        let controller = owner.map_or(String::new(), |o| {
            let group = o.api_version.split_once('/').map(|(g, _)| format!(".{g}")).unwrap_or_default();
            format!("{}{group}/{}", o.kind.to_lowercase(), o.name)
        });
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(controller),
            json!(self.revision),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_revision_names_its_controller_and_keeps_its_data() {
        let rev: ControllerRevision = serde_json::from_value(json!({
            "metadata": {"name": "fluentd-7c9d8b", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet",
                "name": "fluentd", "uid": "u", "controller": true}]},
            "data": {"spec": {"template": {"$patch": "replace"}}}, "revision": 2}))
        .unwrap();
        assert_eq!(rev.validate(None), vec![]);
        assert_eq!(rev.cells(Timestamp::now())[1..3], [json!("daemonset.apps/fluentd"), json!(2)]);
        let mut changed = rev.clone();
        changed.data = Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(json!({})));
        changed.revision = 3;
        let causes: Vec<String> = changed.validate(Some(&rev)).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["data: Forbidden: field is immutable"]);
    }
}
