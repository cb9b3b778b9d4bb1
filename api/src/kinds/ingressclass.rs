//! networking.k8s.io/v1 IngressClasses: validation (an immutable controller) and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::networking::v1::IngressClass;

impl ApiObject for IngressClass {
    const KIND: Kind = Kind::IngressClass;
    const INFO: KindInfo = KindInfo {
        group: "networking.k8s.io",
        namespaced: false,
        ..KindInfo::core("IngressClass", "ingressclasses", "ingressclass")
    };

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let path = FieldPath::root("spec").child("controller");
        let controller = self.spec.as_ref().and_then(|s| s.controller.clone()).unwrap_or_default();
        if controller.is_empty() {
            out.push(v::required(&path, ""));
        } else if controller.len() > 250 {
            out.push(v::too_long(&path, 250));
        }
        let old_controller = old.and_then(|o| o.spec.as_ref()).and_then(|s| s.controller.clone());
        if old_controller.is_some_and(|o| o != controller) {
            out.push(v::invalid(&path, controller.as_str(), "field is immutable"));
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Controller", "string", 0), col("Parameters", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let spec = self.spec.clone().unwrap_or_default();
        let params = spec.parameters.map(|p| format!("{}/{}", p.kind, p.name)).unwrap_or_else(|| "<none>".into());
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(spec.controller.unwrap_or_default()),
            json!(params),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ingress_class_needs_a_controller_that_never_changes() {
        let class: IngressClass =
            serde_yaml::from_str("metadata: {name: podpath}\nspec: {controller: podpath.dev/lb-sim}").unwrap();
        assert_eq!(class.validate(None), vec![]);
        let mut other = class.clone();
        other.spec.as_mut().unwrap().controller = Some("x/y".into());
        let causes: Vec<String> = other.validate(Some(&class)).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["spec.controller: Invalid value: \"x/y\": field is immutable"]);
        assert_eq!(
            class.cells(Timestamp::now())[..3],
            [json!("podpath"), json!("podpath.dev/lb-sim"), json!("<none>")]
        );
    }
}
