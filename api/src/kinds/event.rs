//! core/v1 Events: validation and the Table of `kubectl get events`.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::Event;

impl ApiObject for Event {
    const KIND: Kind = Kind::Event;
    const INFO: KindInfo = KindInfo {
        short_names: &["ev"],
        field_selectors: &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ..KindInfo::core("Event", "events", "event")
    };

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let ns = self.metadata.namespace.as_deref().unwrap_or("");
        let obj_ns = self.involved_object.namespace.as_deref().unwrap_or("");
        if !obj_ns.is_empty() && obj_ns != ns {
            out.push(v::invalid(
                &FieldPath::root("involvedObject").child("namespace"),
                obj_ns,
                "does not match event.namespace",
            ));
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            col("Last Seen", "string", 0),
            col("Type", "string", 0),
            col("Reason", "string", 0),
            col("Object", "string", 0),
            col("Message", "string", 0),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let last = self.last_timestamp.as_ref().or(self.metadata.creation_timestamp.as_ref());
        let obj = format!(
            "{}/{}",
            self.involved_object.kind.clone().unwrap_or_default().to_lowercase(),
            self.involved_object.name.clone().unwrap_or_default()
        );
        vec![
            table::age(last, now),
            json!(self.type_.clone().unwrap_or_default()),
            json!(self.reason.clone().unwrap_or_default()),
            json!(obj),
            json!(self.message.clone().unwrap_or_default()),
        ]
    }
}
