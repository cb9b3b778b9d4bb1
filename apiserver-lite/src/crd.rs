//! Custom resources, as kube-apiserver's apiextensions server serves them: the established
//! CRDs' served versions (schemas, printer columns, subresources) kept for the registry and
//! REST ([`Crds`]), admission of custom objects (pruning, defaults, schema validation:
//! [`admit`]), and the Table of a custom object with the CRD's printer columns
//! ([`table`]). The establishing and cleanup controller is `controllers::crds`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use api::custom::CustomKind;
use api::kinds::customresourcedefinition::CrdVersion;
use api::validation::FieldPath;
use api::Kind;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::registry::{FieldValidation, Subresource, WriteOptions};

/// One established CRD, as served.
#[derive(Debug)]
pub struct Model {
    /// The CRD's name (`plural.group`).
    pub crd: String,
    pub storage: String,
    /// The served versions, in the CRD's order.
    pub versions: Vec<CrdVersion>,
}

impl Model {
    /// A served version, or the storage one when `version` is None.
    pub fn version(&self, version: Option<&str>) -> Option<&CrdVersion> {
        let want = version.unwrap_or(&self.storage);
        self.versions.iter().find(|v| v.name == want)
    }
}

/// The served custom resources. Changes bump a revision (OpenAPI documents and their hash
/// follow it).
#[derive(Default)]
pub struct Crds {
    models: RwLock<HashMap<CustomKind, Arc<Model>>>,
    revision: AtomicU64,
}

impl Crds {
    pub fn get(&self, kind: CustomKind) -> Option<Arc<Model>> {
        self.models.read().ok()?.get(&kind).cloned()
    }

    /// Serves (or re-serves) a custom resource with this model.
    pub fn set(&self, kind: CustomKind, model: Model) {
        if let Ok(mut m) = self.models.write() {
            m.insert(kind, Arc::new(model));
        }
        self.revision.fetch_add(1, Ordering::SeqCst);
    }

    pub fn remove(&self, kind: CustomKind) {
        if let Ok(mut m) = self.models.write() {
            m.remove(&kind);
        }
        kind.unserve();
        self.revision.fetch_add(1, Ordering::SeqCst);
    }

    pub fn revision(&self) -> u64 {
        self.revision.load(Ordering::SeqCst)
    }

    /// Every served custom resource with its model.
    pub fn all(&self) -> Vec<(CustomKind, Arc<Model>)> {
        self.models.read().map(|m| m.iter().map(|(k, v)| (*k, v.clone())).collect()).unwrap_or_default()
    }
}

/// What admission made of a custom object.
pub struct Admitted {
    pub object: Value,
    pub warnings: Vec<String>,
}

/// Admits a custom object: metadata checked, unknown fields pruned (a warning each, or the
/// whole write refused with `fieldValidation=Strict`), `default`s filled in, then the version's
/// schema checked. `body` is in the storage version already; `opts.served_version` names the
/// version the client wrote (its schema applies).
pub fn admit(
    kind: CustomKind,
    model: &Model,
    mut body: Value,
    old: Option<&Value>,
    sub: Subresource,
    opts: &WriteOptions,
) -> Result<Admitted, ApiError> {
    let info = kind.info();
    let name = body["metadata"]["name"].as_str().unwrap_or("").to_string();
    let Some(version) = model.version(opts.served_version.as_deref()) else {
        return Err(ApiError::not_found(Kind::Custom(kind), &name));
    };
    if old.is_none() && version.has_status && sub == Subresource::Main {
        // As the real strategy: a create does not set status when it has its own subresource.
        if let Some(o) = body.as_object_mut() {
            o.remove("status");
        }
    }
    let mut warnings = Vec::new();
    let mut causes = Vec::new();
    let meta = <api::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta as api::Codec>::from_json(
        body["metadata"].clone(),
    )
    .map_err(|e| {
        ApiError::BadRequest(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            info.name, version.name, info.name
        ))
    })?;
    api::kinds::validate_object_meta(&meta, &mut causes);
    if let Some(schema) = &version.schema {
        let dropped = api::schema::prune(&mut body, schema);
        if !dropped.is_empty() && opts.field_validation != FieldValidation::Ignore {
            let list: Vec<String> =
                dropped.iter().map(|d| format!("unknown field \"{}\"", d.trim_start_matches('.'))).collect();
            if opts.field_validation == FieldValidation::Strict {
                return Err(ApiError::BadRequest(format!("strict decoding error: {}", list.join(", "))));
            }
            warnings.extend(list);
        }
        api::schema::drop_nulls(&mut body, schema);
        api::schema::apply_defaults(&mut body, schema);
        api::schema::validate(&body, schema, &FieldPath::default(), &mut causes);
        // CEL rules do not run on an object with a blocking error (a wrong type, a missing or
        // unsupported value, too long, too many), as the real server does.
        const BLOCKING: &[&str] = &[
            "FieldValueNotSupported",
            "FieldValueRequired",
            "FieldValueTooLong",
            "FieldValueTooMany",
            "FieldValueTypeInvalid",
        ];
        if causes.iter().any(|c| BLOCKING.contains(&c.reason.as_str())) {
            causes.push(api::Cause {
                reason: "FieldValueInvalid".into(),
                field: "<nil>".into(),
                message: "Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation".into(),
            });
        } else {
            api::cel::validate(&body, old, schema, &FieldPath::default(), &mut causes);
        }
    }
    if version.deprecated && old.is_none() {
        warnings.push(
            version
                .deprecation_warning
                .clone()
                .unwrap_or_else(|| format!("{}/{} {} is deprecated", info.group, version.name, info.name)),
        );
    }
    if !causes.is_empty() {
        causes.sort_by(|a, b| a.field.cmp(&b.field));
        return Err(ApiError::invalid(Kind::Custom(kind), &name, causes));
    }
    if let Some(o) = body.as_object_mut() {
        o.insert("apiVersion".into(), json!(format!("{}/{}", info.group, model.storage)));
        o.insert("kind".into(), json!(info.name));
    }
    Ok(Admitted { object: body, warnings })
}

/// The fields of a `.a.b.c` path (what scale paths are).
fn fields(path: &str) -> Vec<&str> {
    path.trim_start_matches('.').split('.').filter(|f| !f.is_empty()).collect()
}

fn get_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    fields(path).into_iter().try_fold(obj, |v, f| v.get(f))
}

/// Sets the value at a `.a.b` path, making the objects on the way.
pub fn set_path(obj: &mut Value, path: &str, value: Value) {
    let fs = fields(path);
    let Some((last, parents)) = fs.split_last() else { return };
    let mut cur = obj;
    for f in parents {
        if !cur.get(*f).is_some_and(Value::is_object) {
            cur[*f] = json!({});
        }
        cur = &mut cur[*f];
    }
    cur[*last] = value;
}

/// The autoscaling/v1 Scale of a custom object, read at its CRD's scale paths.
pub fn scale_of(
    obj: &Value,
    paths: &api::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceSubresourceScale,
) -> Value {
    let selector =
        paths.label_selector_path.as_deref().and_then(|p| get_path(obj, p)).and_then(Value::as_str).unwrap_or("");
    let mut status =
        json!({"replicas": get_path(obj, &paths.status_replicas_path).and_then(Value::as_i64).unwrap_or(0)});
    if !selector.is_empty() {
        status["selector"] = json!(selector);
    }
    let replicas = get_path(obj, &paths.spec_replicas_path).and_then(Value::as_i64).unwrap_or(0);
    crate::registry::scale(obj, replicas, status)
}

/// `apiVersion` of an object as served at `version` (conversion `None`: only that changes).
pub fn served_as(kind: CustomKind, version: &str, mut obj: Value) -> Value {
    if let Some(o) = obj.as_object_mut() {
        o.insert("apiVersion".into(), json!(format!("{}/{version}", kind.info().group)));
        o.insert("kind".into(), json!(kind.info().name));
    }
    obj
}

/// The Table of custom objects: Name, the version's printer columns (Age when it has none),
/// as the apiextensions server converts them.
pub fn table(
    kind: CustomKind,
    model: &Model,
    version: &str,
    items: &[Value],
    rv: &str,
    full: bool,
    headers: bool,
) -> Value {
    let age = api::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceColumnDefinition {
        name: "Age".into(),
        type_: "date".into(),
        json_path: ".metadata.creationTimestamp".into(),
        ..Default::default()
    };
    let columns =
        model.version(Some(version)).map(|v| v.columns.clone()).filter(|c| !c.is_empty()).unwrap_or_else(|| vec![age]);
    let paths: Vec<Option<api::jsonpath::JsonPath>> =
        columns.iter().map(|c| api::jsonpath::JsonPath::parse(&c.json_path).ok()).collect();
    let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
        "priority": 0})];
    for c in &columns {
        let description = c
            .description
            .clone()
            .unwrap_or_else(|| format!("Custom resource definition column (in JSONPath format): {}", c.json_path));
        defs.push(json!({"name": c.name, "type": c.type_, "format": c.format.clone().unwrap_or_default(),
                         "description": description, "priority": c.priority.unwrap_or(0)}));
    }
    let now = jiff::Timestamp::now();
    let rows: Vec<Value> = items
        .iter()
        .map(|item| {
            let mut cells = vec![item["metadata"]["name"].clone()];
            for (c, p) in columns.iter().zip(&paths) {
                let first = p.as_ref().and_then(|p| p.find(item).into_iter().next());
                cells.push(match first {
                    None => Value::Null,
                    Some(val) => cell(&c.type_, val, now),
                });
            }
            let object = if full {
                served_as(kind, version, item.clone())
            } else {
                api::table::partial_object_metadata(&item["metadata"])
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    let mut t =
        json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv}, "rows": rows});
    if headers {
        t["columnDefinitions"] = json!(defs);
    }
    t
}

/// A cell of a printer column of type `ty`, as the real table convertor makes it.
fn cell(ty: &str, v: &Value, now: jiff::Timestamp) -> Value {
    match ty {
        "string" => json!(api::jsonpath::text(v)),
        "integer" => v.as_i64().or_else(|| v.as_f64().map(|f| f as i64)).map(Value::from).unwrap_or(Value::Null),
        "number" => v.as_f64().map(Value::from).unwrap_or(Value::Null),
        "boolean" => v.as_bool().map(Value::from).unwrap_or(Value::Null),
        "date" => match v.as_str().map(|s| s.parse::<jiff::Timestamp>()) {
            Some(Ok(t)) => json!(api::table::human_duration((now - t).get_seconds())),
            Some(Err(_)) => json!("<invalid>"),
            None => Value::Null,
        },
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::custom::CustomFacts;

    fn model() -> (CustomKind, Model) {
        let crd: api::kinds::customresourcedefinition::CustomResourceDefinition = serde_json::from_value(json!({
            "metadata": {"name": "widgets.test.podpath.dev"},
            "spec": {"group": "test.podpath.dev", "scope": "Namespaced",
                "names": {"plural": "widgets", "kind": "Widget", "singular": "widget", "listKind": "WidgetList"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Size", "type": "integer", "jsonPath": ".spec.size"},
                        {"name": "Ready", "type": "string", "jsonPath": ".status.conditions[?(@.type==\"Ready\")].status"}],
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                        "spec": {"type": "object", "properties": {"size": {"type": "integer", "default": 3, "maximum": 5}}},
                        "status": {"type": "object", "properties": {"conditions": {"type": "array",
                            "items": {"type": "object", "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}}}}}}}}]}}))
        .unwrap();
        let kind = CustomKind::register(&CustomFacts {
            group: "test.podpath.dev".into(),
            version: "v1".into(),
            kind: "Widget".into(),
            list_kind: "WidgetList".into(),
            plural: "widgets".into(),
            singular: "widget".into(),
            namespaced: true,
            has_status: true,
            served: vec!["v1".into()],
            ..Default::default()
        });
        let versions = api::kinds::customresourcedefinition::served_versions(&crd);
        (kind, Model { crd: "widgets.test.podpath.dev".into(), storage: "v1".into(), versions })
    }

    #[test]
    fn a_custom_object_is_pruned_defaulted_and_checked() {
        let (kind, model) = model();
        let body = json!({"apiVersion": "test.podpath.dev/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "default"}, "spec": {"colour": "red"}, "status": {"x": 1}});
        let out = admit(kind, &model, body.clone(), None, Subresource::Main, &WriteOptions::default()).unwrap();
        assert_eq!(out.object["spec"], json!({"size": 3}));
        assert!(out.object.get("status").is_none());
        assert_eq!(out.warnings, ["unknown field \"spec.colour\""]);
        let strict = WriteOptions { field_validation: FieldValidation::Strict, ..Default::default() };
        let err = admit(kind, &model, body, None, Subresource::Main, &strict).err().unwrap();
        assert_eq!(err.to_string(), "strict decoding error: unknown field \"spec.colour\"");
        let big = json!({"metadata": {"name": "w"}, "spec": {"size": 9}});
        let Err(ApiError::Invalid { causes, .. }) =
            admit(kind, &model, big, None, Subresource::Main, &WriteOptions::default())
        else {
            panic!("not invalid")
        };
        assert_eq!(
            causes[0].to_string(),
            "spec.size: Invalid value: 9: spec.size in body should be less than or equal to 5"
        );
    }

    #[test]
    fn the_table_has_the_printer_columns() {
        let (kind, model) = model();
        let item = json!({"metadata": {"name": "w"}, "spec": {"size": 4},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let t = table(kind, &model, "v1", &[item], "7", false, true);
        let names: Vec<&str> =
            t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Name", "Size", "Ready"]);
        assert_eq!(t["rows"][0]["cells"], json!(["w", 4, "True"]));
    }
}
