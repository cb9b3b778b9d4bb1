//! A CRD's OpenAPI v3 schema at work on custom objects, as the apiextensions server does it:
//! whether a schema is structural ([`structural`]), dropping fields it does not declare
//! ([`prune`]), filling in its `default`s ([`apply_defaults`]) and checking objects against it
//! ([`validate`]), each with the real server's error texts. Pure: values in, values and causes
//! out.
//!
//! Written here (no maintained Rust crate validates Kubernetes' dialect: its `x-kubernetes-*`
//! extensions, int-or-string, list types with map keys, and apimachinery's error wording).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSONSchemaProps as Schema, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use serde_json::{Map, Value};

use crate::validation::{self as v, Cause, FieldPath, ShowValue};

impl ShowValue for Value {
    fn show(&self) -> String {
        match self {
            Value::String(s) => format!("{s:?}"),
            other => other.to_string(),
        }
    }
}

/// The JSON type name of a value, as the validator names it.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn flag(b: Option<bool>) -> bool {
    b == Some(true)
}

/// The one schema of `items` (a list of schemas is refused by [`structural`]).
pub fn items(s: &Schema) -> Option<&Schema> {
    match &s.items {
        Some(JSONSchemaPropsOrArray::Schema(i)) => Some(i),
        Some(JSONSchemaPropsOrArray::Schemas(list)) => list.first(),
        None => None,
    }
}

/// The schema of `additionalProperties` when it is one (`true` or a schema keeps every key).
fn additional(s: &Schema) -> Option<Option<&Schema>> {
    match &s.additional_properties {
        Some(JSONSchemaPropsOrBool::Schema(a)) => Some(Some(a)),
        Some(JSONSchemaPropsOrBool::Bool(true)) => Some(None),
        _ => None,
    }
}

// === structural schemas ===

const TYPES: &[&str] = &["array", "boolean", "integer", "number", "object", "string"];

/// Why `schema` (the root of a version's `openAPIV3Schema`, at `path`) is not a structural
/// schema or uses what the apiextensions server refuses.
pub fn structural(schema: &Schema, path: &FieldPath) -> Vec<Cause> {
    let mut out = Vec::new();
    node(schema, path, Level::Root, &mut out);
    if schema.type_.as_deref().is_some_and(|t| t != "object") {
        out.push(v::invalid(&path.child("type"), schema.type_.as_deref().unwrap_or(""), "must be object at the root"));
    }
    if schema.additional_properties.is_some() && flag(schema.x_kubernetes_preserve_unknown_fields) {
        out.push(v::forbidden(&path.child("additionalProperties"), "must not be used at the root"));
    }
    if let Some(meta) = schema.properties.as_ref().and_then(|p| p.get("metadata")) {
        let extra = meta.properties.as_ref().is_some_and(|p| p.keys().any(|k| k != "name" && k != "generateName"));
        if extra || meta.type_.as_deref().is_some_and(|t| t != "object") {
            out.push(v::forbidden(
                &path.child("properties").key("metadata"),
                "must not specify anything other than name and generateName, but metadata is implicitly specified",
            ));
        }
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Level {
    Root,
    Field,
    Item,
}

fn node(s: &Schema, path: &FieldPath, level: Level, out: &mut Vec<Cause>) {
    let int_or_string = flag(s.x_kubernetes_int_or_string);
    let preserve = flag(s.x_kubernetes_preserve_unknown_fields);
    match s.type_.as_deref() {
        None | Some("") if !int_or_string && !preserve => {
            let why = match level {
                Level::Root => "must not be empty at the root",
                Level::Item => "must not be empty for specified array items",
                Level::Field => "must not be empty for specified object fields",
            };
            out.push(v::required(&path.child("type"), why));
        }
        Some(t) if !t.is_empty() && !TYPES.contains(&t) => {
            out.push(v::not_supported(&path.child("type"), t, TYPES));
        }
        _ => {}
    }
    if s.x_kubernetes_preserve_unknown_fields == Some(false) {
        out.push(v::invalid(&path.child("x-kubernetes-preserve-unknown-fields"), "false", "must be true or undefined"));
    }
    if int_or_string && preserve {
        out.push(v::invalid(
            &path.child("x-kubernetes-preserve-unknown-fields"),
            "true",
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if flag(s.x_kubernetes_embedded_resource) && s.type_.as_deref() != Some("object") {
        out.push(v::required(&path.child("type"), "must be object if x-kubernetes-embedded-resource is true"));
    }
    for (set, name, why) in [
        (s.id.is_some(), "id", "id is not supported"),
        (s.additional_items.is_some(), "additionalItems", "additionalItems is not supported"),
        (s.pattern_properties.is_some(), "patternProperties", "patternProperties is not supported"),
        (s.definitions.is_some(), "definitions", "definitions is not supported"),
        (s.dependencies.is_some(), "dependencies", "dependencies is not supported"),
        (s.ref_path.is_some(), "$ref", "$ref is not supported"),
        (
            flag(s.unique_items),
            "uniqueItems",
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ),
    ] {
        if set {
            out.push(v::forbidden(&path.child(name), why));
        }
    }
    if matches!(s.items, Some(JSONSchemaPropsOrArray::Schemas(_))) {
        out.push(v::forbidden(&path.child("items"), "items must be a schema object and not an array"));
    }
    if s.type_.as_deref() == Some("array") && s.items.is_none() {
        out.push(v::required(&path.child("items"), "must be specified"));
    }
    if s.properties.is_some() && matches!(s.additional_properties, Some(JSONSchemaPropsOrBool::Schema(_))) {
        out.push(v::forbidden(
            &path.child("additionalProperties"),
            "additionalProperties and properties are mutual exclusive",
        ));
    }
    if let Some(p) = &s.pattern {
        if let Err(e) = regex::Regex::new(p) {
            out.push(v::invalid(
                &path.child("pattern"),
                p.as_str(),
                &format!("must be a valid regular expression, but isn't: {e}"),
            ));
        }
    }
    list_type(s, path, out);
    for (name, p) in s.properties.iter().flatten() {
        let at = path.child("properties").key(name);
        if name == "metadata" && level != Level::Root && !flag(s.x_kubernetes_embedded_resource) {
            out.push(v::forbidden(&at, "must not be specified in a nested context"));
        }
        node(p, &at, Level::Field, out);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(a)) = &s.additional_properties {
        node(a, &path.child("additionalProperties"), Level::Field, out);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(i)) = &s.items {
        node(i, &path.child("items"), Level::Item, out);
    }
    for (name, list) in [("allOf", &s.all_of), ("anyOf", &s.any_of), ("oneOf", &s.one_of)] {
        for (i, sub) in list.iter().flatten().enumerate() {
            value_validation(sub, &path.child(name).index(i), out);
        }
    }
    if let Some(not) = &s.not {
        value_validation(not, &path.child("not"), out);
    }
}

/// Inside `allOf`, `anyOf`, `oneOf` and `not` only value validations may stand.
fn value_validation(s: &Schema, path: &FieldPath, out: &mut Vec<Cause>) {
    for (set, name, why) in [
        (s.type_.is_some(), "type", "must be empty to be structural"),
        (s.additional_properties.is_some(), "additionalProperties", "must be undefined to be structural"),
        (s.default.is_some(), "default", "must be undefined to be structural"),
        (s.title.is_some(), "title", "must be empty to be structural"),
        (s.description.is_some(), "description", "must be empty to be structural"),
        (flag(s.nullable), "nullable", "must be false to be structural"),
        (
            flag(s.x_kubernetes_preserve_unknown_fields),
            "x-kubernetes-preserve-unknown-fields",
            "must be false to be structural",
        ),
        (flag(s.x_kubernetes_embedded_resource), "x-kubernetes-embedded-resource", "must be false to be structural"),
        (flag(s.x_kubernetes_int_or_string), "x-kubernetes-int-or-string", "must be false to be structural"),
        (s.x_kubernetes_list_map_keys.is_some(), "x-kubernetes-list-map-keys", "must be empty to be structural"),
        (s.x_kubernetes_list_type.is_some(), "x-kubernetes-list-type", "must be undefined to be structural"),
        (s.x_kubernetes_map_type.is_some(), "x-kubernetes-map-type", "must be undefined to be structural"),
        (s.x_kubernetes_validations.is_some(), "x-kubernetes-validations", "must be empty to be structural"),
    ] {
        if set {
            out.push(v::forbidden(&path.child(name), why));
        }
    }
    for (name, p) in s.properties.iter().flatten() {
        value_validation(p, &path.child("properties").key(name), out);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(i)) = &s.items {
        value_validation(i, &path.child("items"), out);
    }
}

fn list_type(s: &Schema, path: &FieldPath, out: &mut Vec<Cause>) {
    if let Some(m) = s.x_kubernetes_map_type.as_deref() {
        if s.type_.as_deref() != Some("object") {
            out.push(v::required(&path.child("type"), "must be object if x-kubernetes-map-type is specified"));
        }
        if m != "atomic" && m != "granular" {
            out.push(v::not_supported(&path.child("x-kubernetes-map-type"), m, &["atomic", "granular"]));
        }
    }
    let keys = s.x_kubernetes_list_map_keys.as_deref().unwrap_or(&[]);
    if let Some(t) = s.x_kubernetes_list_type.as_deref() {
        if s.type_.as_deref() != Some("array") {
            out.push(v::required(&path.child("type"), "must be array if x-kubernetes-list-type is specified"));
        }
        if !["atomic", "set", "map"].contains(&t) {
            out.push(v::not_supported(&path.child("x-kubernetes-list-type"), t, &["atomic", "set", "map"]));
        }
        if t == "map" {
            if keys.is_empty() {
                out.push(v::required(
                    &path.child("x-kubernetes-list-map-keys"),
                    "must not be empty if x-kubernetes-list-type is map",
                ));
            }
            match items(s) {
                None => {
                    out.push(v::required(&path.child("items"), "must have a schema if x-kubernetes-list-type is map"))
                }
                Some(i) if i.type_.as_deref() != Some("object") => out.push(v::invalid(
                    &path.child("items").child("type"),
                    i.type_.as_deref().unwrap_or(""),
                    "must be object if parent array's x-kubernetes-list-type is map",
                )),
                Some(i) => {
                    let props = i.properties.as_ref();
                    if keys.iter().any(|k| props.is_none_or(|p| !p.contains_key(k))) {
                        out.push(v::invalid(
                            &path.child("x-kubernetes-list-map-keys"),
                            keys,
                            "entries must all be names of item properties",
                        ));
                    }
                    let unique: BTreeSet<&String> = keys.iter().collect();
                    if unique.len() != keys.len() {
                        out.push(v::invalid(
                            &path.child("x-kubernetes-list-map-keys"),
                            keys,
                            "must not contain duplicate entries",
                        ));
                    }
                    for k in keys {
                        let Some(p) = props.and_then(|p| p.get(k)) else { continue };
                        let required = i.required.as_ref().is_some_and(|r| r.contains(k));
                        if p.default.is_none() && !required {
                            out.push(v::required(
                                &path.child("items").child("properties").key(k).child("default"),
                                "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
                            ));
                        }
                    }
                }
            }
        }
    } else if !keys.is_empty() {
        out.push(v::required(
            &path.child("x-kubernetes-list-type"),
            "must be map if x-kubernetes-list-map-keys is non-empty",
        ));
    }
}

// === pruning ===

/// The fields of ObjectMeta that survive pruning of `metadata`.
const META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// Drops what `schema` does not declare from an object (at its root `apiVersion`, `kind` and
/// `metadata`'s own fields stay), and returns the paths dropped (`.spec.colour`), for
/// `fieldValidation` warnings and errors.
pub fn prune(object: &mut Value, schema: &Schema) -> Vec<String> {
    let mut dropped = Vec::new();
    prune_at(object, schema, "", true, &mut dropped);
    dropped
}

fn prune_at(value: &mut Value, s: &Schema, path: &str, root: bool, dropped: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let embedded = root || flag(s.x_kubernetes_embedded_resource);
            if embedded {
                if let Some(Value::Object(meta)) = map.get_mut("metadata") {
                    let unknown: Vec<String> =
                        meta.keys().filter(|k| !META_FIELDS.contains(&k.as_str())).cloned().collect();
                    for k in unknown {
                        meta.remove(&k);
                        dropped.push(format!("{path}.metadata.{k}"));
                    }
                }
            }
            let keep_all = flag(s.x_kubernetes_preserve_unknown_fields);
            let props = s.properties.as_ref();
            let extra = additional(s);
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                let at = format!("{path}.{k}");
                if embedded && (k == "apiVersion" || k == "kind" || k == "metadata") {
                    continue;
                }
                match props.and_then(|p| p.get(&k)) {
                    Some(child) => {
                        if let Some(v) = map.get_mut(&k) {
                            prune_at(v, child, &at, false, dropped);
                        }
                    }
                    None => match extra {
                        Some(Some(child)) => {
                            if let Some(v) = map.get_mut(&k) {
                                prune_at(v, child, &at, false, dropped);
                            }
                        }
                        Some(None) => {}
                        None if keep_all => {}
                        None => {
                            map.remove(&k);
                            dropped.push(at);
                        }
                    },
                }
            }
        }
        Value::Array(list) => {
            if let Some(i) = items(s) {
                for (n, item) in list.iter_mut().enumerate() {
                    prune_at(item, i, &format!("{path}[{n}]"), false, dropped);
                }
            }
        }
        _ => {}
    }
}

// === defaulting ===

/// Fills in the schema's `default`s where a field is missing (or null and not nullable), from
/// the outside in, as the real server does on every request and read.
pub fn apply_defaults(value: &mut Value, s: &Schema) {
    match value {
        Value::Object(map) => {
            for (k, p) in s.properties.iter().flatten() {
                let missing = match map.get(k) {
                    None => true,
                    Some(Value::Null) => !flag(p.nullable),
                    Some(_) => false,
                };
                if missing {
                    if let Some(d) = &p.default {
                        map.insert(k.clone(), d.0.clone());
                    }
                }
                if let Some(child) = map.get_mut(k) {
                    apply_defaults(child, p);
                }
            }
            if let Some(Some(a)) = additional(s) {
                for child in map.values_mut() {
                    apply_defaults(child, a);
                }
            }
        }
        Value::Array(list) => {
            if let Some(i) = items(s) {
                for item in list {
                    apply_defaults(item, i);
                }
            }
        }
        _ => {}
    }
}

/// Removes nulls the schema does not allow where it has no default for them (the real server
/// prunes them before validating).
pub fn drop_nulls(value: &mut Value, s: &Schema) {
    match value {
        Value::Object(map) => {
            for (k, p) in s.properties.iter().flatten() {
                if map.get(k).is_some_and(Value::is_null) && !flag(p.nullable) && p.default.is_none() {
                    map.remove(k);
                }
                if let Some(child) = map.get_mut(k) {
                    drop_nulls(child, p);
                }
            }
        }
        Value::Array(list) => {
            if let Some(i) = items(s) {
                for item in list {
                    drop_nulls(item, i);
                }
            }
        }
        _ => {}
    }
}

// === validation ===

/// Checks a custom object against its version's schema. `path` is where the value sits (the
/// root is the empty path; causes read `spec.replicas: Invalid value: …`).
pub fn validate(value: &Value, s: &Schema, path: &FieldPath, out: &mut Vec<Cause>) {
    let shown = if path.as_str().is_empty() { "body".to_string() } else { path.to_string() };
    if value.is_null() {
        if !flag(s.nullable) && (s.type_.is_some() || flag(s.x_kubernetes_int_or_string)) {
            let want =
                if flag(s.x_kubernetes_int_or_string) { "integer,string" } else { s.type_.as_deref().unwrap_or("") };
            out.push(type_invalid(path, "null", &format!("{shown} in body must be of type {want}: \"null\"")));
        }
        return;
    }
    let got = type_name(value);
    if flag(s.x_kubernetes_int_or_string) {
        if got != "integer" && got != "string" {
            out.push(type_invalid(path, got, &format!("{shown} in body must be of type integer,string: \"{got}\"")));
            return;
        }
    } else if let Some(want) = s.type_.as_deref().filter(|t| !t.is_empty()) {
        let fits = want == got || (want == "number" && got == "integer");
        if !fits {
            out.push(type_invalid(path, got, &format!("{shown} in body must be of type {want}: \"{got}\"")));
            return;
        }
    }
    if let Some(options) = &s.enum_ {
        if !options.iter().any(|o| o.0 == *value) {
            let list: Vec<String> = options.iter().map(|o| o.0.show()).collect();
            out.push(Cause {
                reason: "FieldValueNotSupported".into(),
                field: path.to_string(),
                message: format!("Unsupported value: {}: supported values: {}", value.show(), list.join(", ")),
            });
        }
    }
    match value {
        Value::String(text) => string(text, s, path, &shown, out),
        Value::Number(n) => number(value, n.as_f64().unwrap_or(0.0), s, path, &shown, out),
        Value::Array(list) => array(list, s, path, &shown, out),
        Value::Object(map) => object(map, s, path, &shown, out),
        _ => {}
    }
    for (i, sub) in s.all_of.iter().flatten().enumerate() {
        let _ = i;
        validate(value, sub, path, out);
    }
    if let Some(any) = s.any_of.as_ref().filter(|a| !a.is_empty()) {
        let passes = any.iter().any(|sub| {
            let mut tmp = Vec::new();
            validate(value, sub, path, &mut tmp);
            tmp.is_empty()
        });
        if !passes {
            out.push(v::invalid(path, value, &format!("{shown} in body must be of any of the specified schemas")));
        }
    }
    if let Some(one) = s.one_of.as_ref().filter(|a| !a.is_empty()) {
        let passing = one
            .iter()
            .filter(|sub| {
                let mut tmp = Vec::new();
                validate(value, sub, path, &mut tmp);
                tmp.is_empty()
            })
            .count();
        if passing != 1 {
            out.push(v::invalid(
                path,
                value,
                &format!("{shown} in body must validate one and only one schema (oneOf)"),
            ));
        }
    }
    if let Some(not) = &s.not {
        let mut tmp = Vec::new();
        validate(value, not, path, &mut tmp);
        if tmp.is_empty() {
            out.push(v::invalid(path, value, &format!("{shown} in body should not validate the schema (not)")));
        }
    }
}

/// A value of the wrong type (`FieldValueTypeInvalid`: it keeps CEL rules from running).
fn type_invalid(path: &FieldPath, got: &str, detail: &str) -> Cause {
    Cause { reason: "FieldValueTypeInvalid".into(), ..v::invalid(path, got, detail) }
}

fn string(text: &str, s: &Schema, path: &FieldPath, shown: &str, out: &mut Vec<Cause>) {
    let chars = text.chars().count() as i64;
    if let Some(max) = s.max_length.filter(|m| chars > *m) {
        out.push(Cause {
            reason: "FieldValueTooLong".into(),
            field: path.to_string(),
            message: format!("Too long: may not be more than {max} bytes"),
        });
    }
    if let Some(min) = s.min_length.filter(|m| chars < *m) {
        out.push(v::invalid(path, text, &format!("{shown} in body should be at least {min} chars long")));
    }
    if let Some(p) = &s.pattern {
        if regex::Regex::new(p).is_ok_and(|re| !re.is_match(text)) {
            out.push(v::invalid(path, text, &format!("{shown} in body should match '{p}'")));
        }
    }
    if let Some(f) = s.format.as_deref() {
        if !format_ok(f, text) {
            out.push(v::invalid(path, text, &format!("{shown} in body must be of type {f}: {text:?}")));
        }
    }
}

/// The formats the real server checks (others are documentation only).
fn format_ok(format: &str, text: &str) -> bool {
    match format {
        "ipv4" => text.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => text.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => crate::validation::valid_cidr(text),
        "date-time" | "datetime" => text.parse::<jiff::Timestamp>().is_ok(),
        "date" => text.parse::<jiff::civil::Date>().is_ok(),
        "uuid" => {
            let b = text.as_bytes();
            b.len() == 36
                && b.iter().enumerate().all(|(i, c)| match i {
                    8 | 13 | 18 | 23 => *c == b'-',
                    _ => c.is_ascii_hexdigit(),
                })
        }
        "hostname" => !text.is_empty() && crate::validation::dns1123_subdomain(&text.to_ascii_lowercase()).is_empty(),
        "byte" => {
            let t = text.trim_end_matches('=');
            t.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'+' || c == b'/')
        }
        _ => true,
    }
}

fn number(value: &Value, n: f64, s: &Schema, path: &FieldPath, shown: &str, out: &mut Vec<Cause>) {
    let show = |x: f64| if x.fract() == 0.0 && x.abs() < 1e15 { format!("{}", x as i64) } else { x.to_string() };
    if let Some(max) = s.maximum {
        let over = if flag(s.exclusive_maximum) { n >= max } else { n > max };
        if over {
            let how = if flag(s.exclusive_maximum) { "less than" } else { "less than or equal to" };
            out.push(v::invalid(path, value, &format!("{shown} in body should be {how} {}", show(max))));
        }
    }
    if let Some(min) = s.minimum {
        let under = if flag(s.exclusive_minimum) { n <= min } else { n < min };
        if under {
            let how = if flag(s.exclusive_minimum) { "greater than" } else { "greater than or equal to" };
            out.push(v::invalid(path, value, &format!("{shown} in body should be {how} {}", show(min))));
        }
    }
    if let Some(m) = s.multiple_of.filter(|m| *m > 0.0) {
        if (n / m).fract().abs() > 1e-9 {
            out.push(v::invalid(path, value, &format!("{shown} in body should be a multiple of {}", show(m))));
        }
    }
}

fn array(list: &[Value], s: &Schema, path: &FieldPath, shown: &str, out: &mut Vec<Cause>) {
    let n = list.len() as i64;
    if let Some(max) = s.max_items.filter(|m| n > *m) {
        out.push(Cause {
            reason: "FieldValueTooMany".into(),
            field: path.to_string(),
            message: format!("Too many: {n}: must have at most {max} items"),
        });
    }
    if let Some(min) = s.min_items.filter(|m| n < *m) {
        out.push(v::invalid(path, &n, &format!("{shown} in body should have at least {min} items")));
    }
    if let Some(i) = items(s) {
        for (k, item) in list.iter().enumerate() {
            validate(item, i, &path.index(k), out);
        }
    }
    match s.x_kubernetes_list_type.as_deref() {
        Some("set") => {
            let mut seen = Vec::new();
            for (k, item) in list.iter().enumerate() {
                if seen.contains(&item) {
                    out.push(v::duplicate(&path.index(k), item));
                }
                seen.push(item);
            }
        }
        Some("map") => {
            let keys = s.x_kubernetes_list_map_keys.as_deref().unwrap_or(&[]);
            let mut seen: Vec<BTreeMap<&str, &Value>> = Vec::new();
            for (k, item) in list.iter().enumerate() {
                let id: BTreeMap<&str, &Value> =
                    keys.iter().filter_map(|key| item.get(key).map(|v| (key.as_str(), v))).collect();
                if seen.contains(&id) {
                    let shown: Vec<String> = id.iter().map(|(k, v)| format!("{k:?}:{}", v.show())).collect();
                    out.push(Cause {
                        reason: "FieldValueDuplicate".into(),
                        field: path.index(k).to_string(),
                        message: format!("Duplicate value: map[string]interface {{}}{{{}}}", shown.join(", ")),
                    });
                }
                seen.push(id);
            }
        }
        _ => {}
    }
}

/// An object embedded with `x-kubernetes-embedded-resource` (not the resource's root): it
/// needs `apiVersion` and `kind`, as the apiextensions server checks them, and its metadata is
/// validated as an object's (a name being optional there).
fn embedded(map: &Map<String, Value>, path: &FieldPath, out: &mut Vec<Cause>) {
    for field in ["apiVersion", "kind"] {
        if !map.contains_key(field) {
            out.push(v::required(&path.child(field), "must not be empty"));
        }
    }
    if let Some(api_version) = map.get("apiVersion") {
        let at = path.child("apiVersion");
        match api_version.as_str() {
            None => out.push(v::invalid(&at, api_version, "must be a string")),
            Some("") => out.push(v::invalid(&at, "", "must not be empty")),
            Some(gv) if gv.matches('/').count() > 1 => {
                out.push(v::invalid(&at, gv, &format!("unexpected GroupVersion string: {gv}")))
            }
            Some(_) => {}
        }
    }
    if let Some(kind) = map.get("kind") {
        let at = path.child("kind");
        match kind.as_str() {
            None => out.push(v::invalid(&at, kind, "must be a string")),
            Some("") => out.push(v::invalid(&at, "", "must not be empty")),
            Some(k) => {
                let errs = v::dns1035_label(&k.to_ascii_lowercase());
                if !errs.is_empty() {
                    let detail = format!("may have mixed case, but should otherwise match: {}", errs.join(","));
                    out.push(v::invalid(&at, k, &detail));
                }
            }
        }
    }
    if let Some(meta) = map.get("metadata") {
        let at = path.child("metadata");
        match serde_json::from_value::<k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>(meta.clone()) {
            Err(e) => out.push(v::invalid(&at, meta, &e.to_string())),
            Ok(mut m) => {
                // The real server fills in a name to skip the "required" check.
                if m.name.as_deref().unwrap_or("").is_empty() {
                    m.name = Some("fakename".into());
                }
                crate::kinds::validate_meta_at(&m, v::path_segment_name, at, out);
            }
        }
    }
}

fn object(map: &Map<String, Value>, s: &Schema, path: &FieldPath, shown: &str, out: &mut Vec<Cause>) {
    if flag(s.x_kubernetes_embedded_resource) && !path.as_str().is_empty() {
        embedded(map, path, out);
    }
    let n = map.len() as i64;
    if let Some(max) = s.max_properties.filter(|m| n > *m) {
        out.push(Cause {
            reason: "FieldValueTooMany".into(),
            field: path.to_string(),
            message: format!("Too many: {n}: must have at most {max} items"),
        });
    }
    if let Some(min) = s.min_properties.filter(|m| n < *m) {
        out.push(v::invalid(path, &n, &format!("{shown} in body should have at least {min} properties")));
    }
    for r in s.required.iter().flatten() {
        if !map.contains_key(r) {
            out.push(v::required(&path.child(r), ""));
        }
    }
    let root = path.as_str().is_empty();
    for (k, value) in map {
        if root && (k == "metadata" || k == "apiVersion" || k == "kind") {
            continue;
        }
        if let Some(p) = s.properties.as_ref().and_then(|p| p.get(k)) {
            validate(value, p, &path.child(k), out);
        } else if let Some(Some(a)) = additional(s) {
            validate(value, a, &path.child(k), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> Schema {
        serde_json::from_value(v).unwrap()
    }

    fn crontab() -> Schema {
        schema(json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["cronSpec"], "properties": {
                "cronSpec": {"type": "string", "pattern": "^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$"},
                "image": {"type": "string", "maxLength": 20},
                "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                "port": {"x-kubernetes-int-or-string": true},
                "mode": {"type": "string", "enum": ["Fast", "Slow"]},
                "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                          "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            }},
            "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
        }}))
    }

    fn causes(obj: Value) -> Vec<String> {
        let mut out = Vec::new();
        validate(&obj, &crontab(), &FieldPath::default(), &mut out);
        out.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn objects_get_the_real_servers_errors() {
        assert_eq!(
            causes(json!({"spec": {"cronSpec": "* * * * */5", "replicas": 3, "port": "http"}})),
            Vec::<String>::new()
        );
        assert_eq!(
            causes(json!({"spec": {"cronSpec": "* * * *", "replicas": "3", "image": "a-very-long-image-name-indeed",
                                   "mode": "Medium", "port": 1.5}})),
            [
                "spec.cronSpec: Invalid value: \"* * * *\": spec.cronSpec in body should match '^(\\d+|\\*)(/\\d+)?(\\s+(\\d+|\\*)(/\\d+)?){4}$'",
                "spec.image: Too long: may not be more than 20 bytes",
                "spec.mode: Unsupported value: \"Medium\": supported values: \"Fast\", \"Slow\"",
                "spec.port: Invalid value: \"number\": spec.port in body must be of type integer,string: \"number\"",
                "spec.replicas: Invalid value: \"string\": spec.replicas in body must be of type integer: \"string\"",
            ]
        );
        assert_eq!(
            causes(
                json!({"spec": {"replicas": 11, "ports": [{"name": "a"}, {"name": "a", "port": 2}], "labels": {"x": 1}}})
            ),
            [
                "spec.cronSpec: Required value",
                "spec.labels.x: Invalid value: \"integer\": spec.labels.x in body must be of type string: \"integer\"",
                "spec.ports[1]: Duplicate value: map[string]interface {}{\"name\":\"a\"}",
                "spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10",
            ]
        );
    }

    /// `x-kubernetes-embedded-resource`: apiVersion and kind required and well formed, the
    /// embedded metadata validated (its name optional), as the apiextensions server does.
    #[test]
    fn embedded_objects_need_their_type_and_valid_metadata() {
        let s = schema(json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                         "x-kubernetes-preserve-unknown-fields": true}}}}}));
        let check = |obj: Value| {
            let mut out = Vec::new();
            validate(&obj, &s, &FieldPath::default(), &mut out);
            out.iter().map(|c| c.to_string()).collect::<Vec<_>>()
        };
        assert_eq!(
            check(
                json!({"spec": {"template": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"labels": {"a": "b"}}}}})
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            check(json!({"spec": {"template": {"metadata": {"name": "a/b"}}}})),
            [
                "spec.template.apiVersion: Required value: must not be empty",
                "spec.template.kind: Required value: must not be empty",
                "spec.template.metadata.name: Invalid value: \"a/b\": may not contain '/'",
            ]
        );
        assert_eq!(
            check(json!({"spec": {"template": {"apiVersion": "a/b/c", "kind": "Config_Map",
                                               "metadata": {"labels": {"-x": "y"}}}}})),
            [
                "spec.template.apiVersion: Invalid value: \"a/b/c\": unexpected GroupVersion string: a/b/c",
                "spec.template.kind: Invalid value: \"Config_Map\": may have mixed case, but should otherwise match: a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
                "spec.template.metadata.labels: Invalid value: \"-x\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ]
        );
    }

    #[test]
    fn pruning_keeps_what_the_schema_declares_and_defaults_fill_in() {
        let mut obj = json!({"apiVersion": "stable.example.com/v1", "kind": "CronTab",
            "metadata": {"name": "a", "colour": "red"},
            "spec": {"cronSpec": "* * * * *", "colour": "red", "free": {"any": {"thing": 1}}, "labels": {"k": "v"},
                     "ports": [{"name": "a", "extra": 1}]},
            "extra": true});
        let dropped = prune(&mut obj, &crontab());
        assert_eq!(dropped, [".metadata.colour", ".extra", ".spec.colour", ".spec.ports[0].extra"]);
        apply_defaults(&mut obj, &crontab());
        assert_eq!(obj["spec"]["replicas"], 1);
        assert_eq!(obj["spec"]["free"], json!({"any": {"thing": 1}}));
        assert_eq!(obj["metadata"], json!({"name": "a"}));
    }

    #[test]
    fn a_schema_must_be_structural() {
        let path = FieldPath::root("spec").child("versions").index(0).child("schema").child("openAPIV3Schema");
        assert_eq!(structural(&crontab(), &path), vec![]);
        let bad = schema(json!({"type": "object", "properties": {
            "spec": {"properties": {"a": {"type": "string"}}},
            "list": {"type": "array", "items": {"type": "object"}, "x-kubernetes-list-type": "map"},
            "any": {"type": "string", "anyOf": [{"type": "string"}]},
            "re": {"type": "string", "pattern": "(("}}}));
        let got: Vec<String> = structural(&bad, &path).iter().map(|c| c.to_string()).collect();
        let p = "spec.versions[0].schema.openAPIV3Schema.properties";
        assert!(
            got.contains(&format!("{p}[spec].type: Required value: must not be empty for specified object fields")),
            "{got:#?}"
        );
        assert!(got.contains(&format!("{p}[list].x-kubernetes-list-map-keys: Required value: must not be empty if x-kubernetes-list-type is map")), "{got:#?}");
        assert!(
            got.contains(&format!("{p}[any].anyOf[0].type: Forbidden: must be empty to be structural")),
            "{got:#?}"
        );
        assert!(
            got.iter().any(|c| c
                .starts_with(&format!("{p}[re].pattern: Invalid value: \"((\": must be a valid regular expression"))),
            "{got:#?}"
        );
    }
}
