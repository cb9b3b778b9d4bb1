//! OpenAPI v3 documents of the served kinds, with the real schemas: generated from
//! k8s-openapi's types (their JSON Schemas carry the Kubernetes field descriptions), so
//! `kubectl explain` and client-side tooling read what they read from a real server. Pure.

use serde_json::{json, Map, Value};

use crate::Kind;

/// `components.schemas` for the kinds of one group/version: every schema the kinds reach,
/// named as the real server names them (`io.k8s.api.core.v1.ServiceSpec`), each kind's own
/// schema marked with its `x-kubernetes-group-version-kind`.
pub fn schemas(group: &str, version: &str) -> Map<String, Value> {
    let settings = schemars::generate::SchemaSettings::openapi3();
    let mut generator = settings.into_generator();
    let kinds: Vec<Kind> =
        Kind::ALL.iter().copied().filter(|k| k.info().group == group && k.info().version == version).collect();
    let mut names: Vec<(String, &'static str)> = Vec::new();
    for k in &kinds {
        let name = with_kind_type!(*k, T => {
            generator.subschema_for::<T>();
            <T as schemars::JsonSchema>::schema_name().into_owned()
        }, custom _c => continue);
        names.push((name, k.info().name));
    }
    // events.k8s.io/v1 serves the core Events in another version (no kind of its own).
    if (group, version) == ("events.k8s.io", "v1") {
        type EventV1 = k8s_openapi::api::events::v1::Event;
        generator.subschema_for::<EventV1>();
        names.push((<EventV1 as schemars::JsonSchema>::schema_name().into_owned(), "Event"));
    }
    // autoscaling/v1 serves the v2 HorizontalPodAutoscalers converted.
    if (group, version) == ("autoscaling", "v1") {
        type HpaV1 = k8s_openapi::api::autoscaling::v1::HorizontalPodAutoscaler;
        generator.subschema_for::<HpaV1>();
        names.push((<HpaV1 as schemars::JsonSchema>::schema_name().into_owned(), "HorizontalPodAutoscaler"));
    }
    let mut defs: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    for (name, kind) in &names {
        if let Some(Value::Object(schema)) = defs.get_mut(name) {
            schema.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "version": version, "kind": kind}]),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        mark_lists(&mut defs, name, &mut Vec::new(), &mut seen);
    }
    defs
}

/// The name the real server gives a custom kind's schema: the group reversed, the version and
/// the kind (`com.example.stable.v1.CronTab`).
pub fn custom_schema_name(group: &str, version: &str, kind: &str) -> String {
    let reversed: Vec<&str> = group.split('.').rev().collect();
    format!("{}.{version}.{kind}", reversed.join("."))
}

/// `components.schemas` for custom kinds of one group/version: each kind's CRD schema with
/// `apiVersion`, `kind` and `metadata` (ObjectMeta, whose schemas come along), marked with its
/// `x-kubernetes-group-version-kind`, as the apiextensions server publishes them.
pub fn custom_schemas(
    group: &str,
    version: &str,
    kinds: &[(&str, Option<&k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps>)],
) -> Map<String, Value> {
    type ObjectMeta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let mut generator = schemars::generate::SchemaSettings::openapi3().into_generator();
    generator.subschema_for::<ObjectMeta>();
    let meta_name = <ObjectMeta as schemars::JsonSchema>::schema_name().into_owned();
    let mut defs: Map<String, Value> = generator.take_definitions(true).into_iter().collect();
    for (kind, schema) in kinds {
        let mut s = schema.and_then(|s| serde_json::to_value(s).ok()).unwrap_or_else(|| json!({"type": "object"}));
        if let Some(obj) = s.as_object_mut() {
            let props = obj.entry("properties").or_insert_with(|| json!({}));
            props["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
            props["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
            props["metadata"] = json!({"allOf": [{"$ref": format!("{REF_PREFIX}{meta_name}")}],
                "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"});
            obj.insert(
                "x-kubernetes-group-version-kind".into(),
                json!([{"group": group, "version": version, "kind": kind}]),
            );
        }
        defs.insert(custom_schema_name(group, version, kind), s);
    }
    defs
}

const REF_PREFIX: &str = "#/components/schemas/";

/// The `definitions` of an OpenAPI v2 (Swagger 2.0) document for the given group/versions: the
/// same schemas as v3 (they use nothing v2 lacks), their references rewritten to
/// `#/definitions/`.
pub fn definitions_v2(group_versions: &[(&str, &str)]) -> Map<String, Value> {
    let mut defs = Map::new();
    for (g, v) in group_versions {
        for (name, mut schema) in schemas(g, v) {
            rewrite_refs(&mut schema);
            // Shared schemas (ObjectMeta …) are the same in every group: the first one stays.
            defs.entry(name).or_insert(schema);
        }
    }
    defs
}

fn rewrite_refs(v: &mut Value) {
    match v {
        Value::Object(m) => {
            // OpenAPI v2 writes a property's reference with its description beside it (v3 needs
            // `allOf: [{$ref}]` for that); kubectl's v2 reader follows only a plain `$ref`.
            let single_ref = match m.get("allOf") {
                Some(Value::Array(all)) if all.len() == 1 => all[0].get("$ref").cloned(),
                _ => None,
            };
            if let Some(r) = single_ref {
                m.remove("allOf");
                m.insert("$ref".into(), r);
            }
            for (k, val) in m.iter_mut() {
                match (k.as_str(), val) {
                    ("$ref", Value::String(r)) => {
                        if let Some(name) = r.strip_prefix(REF_PREFIX) {
                            *r = format!("#/definitions/{name}");
                        }
                    }
                    (_, val) => rewrite_refs(val),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// The definition a property schema refers to (`$ref`, or `allOf: [{$ref}]` when the property
/// adds a description).
fn ref_of(prop: &Value) -> Option<String> {
    prop.get("$ref")
        .or_else(|| prop.pointer("/allOf/0/$ref"))
        .and_then(Value::as_str)
        .and_then(|r| r.strip_prefix(REF_PREFIX))
        .map(str::to_string)
}

/// Adds the list extensions the real schemas carry (`x-kubernetes-patch-merge-key`,
/// `x-kubernetes-patch-strategy`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`) to
/// every list reachable from definition `name` at field path `path`, from the one list-key
/// table strategic merge and server-side apply use: kubectl computes client-side apply patches
/// from them (without, a re-applied manifest with a list of ports is "configured", not
/// "unchanged").
fn mark_lists(
    defs: &mut Map<String, Value>,
    name: &str,
    path: &mut Vec<String>,
    seen: &mut std::collections::BTreeSet<(String, Vec<String>)>,
) {
    use crate::patch::{list_strategy, ListStrategy};
    // A definition that reaches itself (JSONSchemaProps) is walked once per path, not once
    // per way round its cycle (which grows exponentially with the depth).
    let cyclic = path.len() > 1 && seen.iter().any(|(n, p)| n == name && path.starts_with(p) && p.len() < path.len());
    if cyclic || path.len() > 16 || !seen.insert((name.to_string(), path.clone())) {
        return;
    }
    let Some(props) = defs.get(name).and_then(|d| d.get("properties")).and_then(Value::as_object).cloned() else {
        return;
    };
    for (field, prop) in props {
        path.push(field.clone());
        if prop.get("type").and_then(Value::as_str) == Some("array") {
            let ext = match (list_strategy(path, false), list_strategy(path, true)) {
                (ListStrategy::MergeBy(merge), ListStrategy::MergeBy(keys)) => json!({
                    "x-kubernetes-patch-strategy": "merge", "x-kubernetes-patch-merge-key": merge[0],
                    "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": keys,
                }),
                (ListStrategy::PrimitiveSet, _) => {
                    json!({"x-kubernetes-patch-strategy": "merge", "x-kubernetes-list-type": "set"})
                }
                _ => json!({"x-kubernetes-list-type": "atomic"}),
            };
            if let Some(Value::Object(p)) =
                defs.get_mut(name).and_then(|d| d.get_mut("properties")).and_then(|p| p.get_mut(&field))
            {
                p.extend(ext.as_object().cloned().unwrap_or_default());
            }
            if let Some(item) = prop.get("items").and_then(ref_of) {
                mark_lists(defs, &item, path, seen);
            }
        } else if let Some(target) = ref_of(&prop) {
            mark_lists(defs, &target, path, seen);
        }
        path.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recursive_schema_is_walked_once_round_its_cycle() {
        // JSONSchemaProps refers to itself through a dozen fields: the walk must not follow
        // every way round (this took forever before).
        let defs = schemas("apiextensions.k8s.io", "v1");
        assert!(
            defs.contains_key("io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps"),
            "{:?}",
            defs.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn core_v1_has_the_service_schema_with_descriptions_and_refs_that_resolve() {
        let defs = schemas("", "v1");
        let svc = &defs["io.k8s.api.core.v1.Service"];
        assert_eq!(svc["x-kubernetes-group-version-kind"][0]["kind"], "Service");
        let spec_ref = svc.pointer("/properties/spec/$ref").or_else(|| svc.pointer("/properties/spec/allOf/0/$ref"));
        assert_eq!(
            spec_ref.and_then(Value::as_str),
            Some("#/components/schemas/io.k8s.api.core.v1.ServiceSpec"),
            "{svc}"
        );
        let port = &defs["io.k8s.api.core.v1.ServicePort"];
        assert!(port["properties"]["nodePort"]["description"].as_str().unwrap().contains("NodePort"));
        let ports = &defs["io.k8s.api.core.v1.ServiceSpec"]["properties"]["ports"];
        assert_eq!(ports["x-kubernetes-patch-merge-key"], "port");
        assert_eq!(ports["x-kubernetes-list-map-keys"], json!(["port", "protocol"]));
        let containers = &defs["io.k8s.api.core.v1.PodSpec"]["properties"]["containers"];
        assert_eq!(containers["x-kubernetes-patch-merge-key"], "name");
        let container_ports = &defs["io.k8s.api.core.v1.Container"]["properties"]["ports"];
        assert_eq!(container_ports["x-kubernetes-list-map-keys"], json!(["containerPort", "protocol"]));
        let finalizers = &defs["io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"]["properties"]["finalizers"];
        assert_eq!(finalizers["x-kubernetes-list-type"], "set");
        // Every reference names a schema of the document.
        let text = serde_json::to_string(&defs).unwrap();
        for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(defs.contains_key(name), "dangling $ref {name}");
        }
    }

    #[test]
    fn v2_definitions_cover_every_group_and_refer_within_themselves() {
        let defs = definitions_v2(&[("", "v1"), ("apps", "v1"), ("networking.k8s.io", "v1"), ("events.k8s.io", "v1")]);
        for name in [
            "io.k8s.api.core.v1.Service",
            "io.k8s.api.apps.v1.Deployment",
            "io.k8s.api.networking.v1.Ingress",
            "io.k8s.api.events.v1.Event",
        ] {
            assert!(defs[name]["x-kubernetes-group-version-kind"].is_array(), "{name}");
        }
        let text = serde_json::to_string(&defs).unwrap();
        assert!(!text.contains("#/components/"), "a v3 reference is left");
        for r in text.split("\"$ref\":\"#/definitions/").skip(1) {
            let name = &r[..r.find('"').unwrap()];
            assert!(defs.contains_key(name), "dangling $ref {name}");
        }
    }
}
