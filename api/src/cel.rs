//! CRDs' CEL validation rules (`x-kubernetes-validations`), as the apiextensions server runs
//! them: compiled when a CRD is written (a rule that does not compile makes the CRD invalid),
//! evaluated on every write of a custom object with `self` (and `oldSelf` on updates, where the
//! old value correlates: object fields, map values, items of `x-kubernetes-list-type: map`
//! lists by their keys), and reported with the real server's wording (`message`,
//! `messageExpression`, `reason`, `fieldPath`; `failed rule: …` otherwise).
//!
//! The language is the `cel` crate's, with the standard library, its string extension (`split`,
//! `substring`, …) and what the Kubernetes library adds that CRDs use (`isIP`, `isCIDR`,
//! `isURL`). Property names are escaped as Kubernetes escapes them (`__namespace__`,
//! `__dash__`, …). Not done: the static cost budget and type checking before a CRD is
//! accepted (cel-go's checker has no Rust counterpart); rules are only parsed then.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cel::{Context, Env, Program, Value as Cel};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{JSONSchemaProps as Schema, ValidationRule};
use serde_json::Value;

use crate::schema::items;
use crate::validation::{self as v, Cause, FieldPath};

fn env() -> &'static Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Env::stdlib();
        // The strings extension is cel-go's ext.Strings(), which Kubernetes enables too.
        let _ = env.add_extension(cel::extensions::strings);
        Arc::new(env)
    })
}

/// A compiled rule (or why it does not compile), kept by its text: the same CRD's rules are
/// evaluated on every write. Bounded: past the limit the cache starts again.
fn compile(source: &str) -> Result<Arc<Program>, String> {
    type Cache = HashMap<String, Result<Arc<Program>, String>>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    const LIMIT: usize = 4096;
    let cache = CACHE.get_or_init(Default::default);
    if let Some(hit) = cache.lock().ok().and_then(|c| c.get(source).cloned()) {
        return hit;
    }
    let compiled = env().compile(source).map(Arc::new).map_err(|e| e.to_string());
    if let Ok(mut c) = cache.lock() {
        if c.len() >= LIMIT {
            c.clear();
        }
        c.insert(source.to_string(), compiled.clone());
    }
    compiled
}

fn uses_old_self(p: &Program) -> bool {
    p.references().has_variable("oldSelf")
}

// === CRD validation ===

const REASONS: &[&str] = &["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"];

/// Why the rules of a schema (at `path`) make its CRD invalid: empty rules, bad messages,
/// reasons, and rules or message expressions that do not compile.
pub fn check_rules(schema: &Schema, path: &FieldPath, out: &mut Vec<Cause>) {
    for (i, rule) in schema.x_kubernetes_validations.iter().flatten().enumerate() {
        let at = path.child("x-kubernetes-validations").index(i);
        if rule.rule.trim().is_empty() {
            out.push(v::required(&at.child("rule"), "rule is not specified"));
            continue;
        }
        if let Some(m) = &rule.message {
            if m.trim().is_empty() {
                out.push(v::invalid(&at.child("message"), m.as_str(), "must be non-empty if specified"));
            } else if m.contains('\n') {
                out.push(v::invalid(&at.child("message"), m.as_str(), "must not contain line breaks"));
            }
        } else if rule.rule.contains('\n') {
            out.push(v::required(&at.child("message"), "message must be specified if rule contains line breaks"));
        }
        if let Some(r) = rule.reason.as_deref() {
            if !REASONS.contains(&r) {
                out.push(v::not_supported(&at.child("reason"), r, REASONS));
            }
        }
        if let Err(e) = compile(&rule.rule) {
            out.push(Cause {
                reason: "FieldValueInvalid".into(),
                field: at.child("rule").to_string(),
                message: format!("Invalid value: {:?}: compilation failed: {e}", rule.rule),
            });
        }
        if let Some(m) = rule.message_expression.as_deref().filter(|m| !m.trim().is_empty()) {
            if let Err(e) = compile(m) {
                out.push(Cause {
                    reason: "FieldValueInvalid".into(),
                    field: at.child("messageExpression").to_string(),
                    message: format!("Invalid value: {m:?}: messageExpression compilation failed: {e}"),
                });
            }
        }
    }
    for (name, p) in schema.properties.iter().flatten() {
        check_rules(p, &path.child("properties").key(name), out);
    }
    if let Some(i) = items(schema) {
        check_rules(i, &path.child("items"), out);
    }
    if let Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(a)) =
        &schema.additional_properties
    {
        check_rules(a, &path.child("additionalProperties"), out);
    }
}

// === evaluation ===

const RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A property name as CEL sees it (Kubernetes' escaping).
pub fn escape(name: &str) -> String {
    if RESERVED.contains(&name) {
        return format!("__{name}__");
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("__") {
            out.push_str("__underscores__");
            rest = r;
            continue;
        }
        let c = rest.chars().next().unwrap_or_default();
        match c {
            '.' => out.push_str("__dot__"),
            '-' => out.push_str("__dash__"),
            '/' => out.push_str("__slash__"),
            c => out.push(c),
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// A JSON value as CEL sees it: objects become maps with escaped keys, integers `int`.
fn to_cel(v: &Value) -> Cel {
    match v {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Cel::Int(i),
            None => Cel::Float(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Array(a) => Cel::List(Arc::new(a.iter().map(to_cel).collect())),
        Value::Object(m) => {
            let map: HashMap<String, Cel> = m.iter().map(|(k, v)| (escape(k), to_cel(v))).collect();
            Cel::from(map)
        }
    }
}

fn is_ip(s: Arc<String>) -> bool {
    !s.contains('%') && s.parse::<std::net::IpAddr>().is_ok()
}

fn is_cidr(s: Arc<String>) -> bool {
    crate::validation::valid_cidr(&s)
}

fn is_url(s: Arc<String>) -> bool {
    match s.split_once("://") {
        Some((scheme, rest)) => {
            !scheme.is_empty()
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && !rest.is_empty()
        }
        None => s.starts_with('/'),
    }
}

enum Outcome {
    Pass,
    Fail,
    Error(String),
}

fn run(program: &Program, self_: &Value, old: Option<&Value>) -> Outcome {
    let mut ctx = Context::with_env(env().clone());
    ctx.add_variable_from_value("self", to_cel(self_));
    if let Some(o) = old {
        ctx.add_variable_from_value("oldSelf", to_cel(o));
    }
    let _ = ctx.add_function("isIP", is_ip);
    let _ = ctx.add_function("isCIDR", is_cidr);
    let _ = ctx.add_function("isURL", is_url);
    match program.execute(&ctx) {
        Ok(Cel::Bool(true)) => Outcome::Pass,
        Ok(Cel::Bool(false)) => Outcome::Fail,
        Ok(other) => Outcome::Error(format!("rule did not evaluate to a bool: {other:?}")),
        Err(e) => Outcome::Error(e.to_string()),
    }
}

fn message_of(rule: &ValidationRule, self_: &Value, old: Option<&Value>) -> String {
    if let Some(expr) = rule.message_expression.as_deref().filter(|m| !m.trim().is_empty()) {
        if let Ok(p) = compile(expr) {
            let mut ctx = Context::with_env(env().clone());
            ctx.add_variable_from_value("self", to_cel(self_));
            if let Some(o) = old {
                ctx.add_variable_from_value("oldSelf", to_cel(o));
            }
            if let Ok(Cel::String(s)) = p.execute(&ctx) {
                if !s.trim().is_empty() && !s.contains('\n') {
                    return s.to_string();
                }
            }
        }
    }
    match &rule.message {
        Some(m) if !m.is_empty() => m.clone(),
        _ => format!("failed rule: {}", rule.rule.trim()),
    }
}

/// The value part of a cause: scalars are shown, objects and arrays are not (the real
/// server omits them).
fn failure(path: &FieldPath, value: &Value, schema: &Schema, detail: &str, reason: Option<&str>) -> Cause {
    let omit = matches!(schema.type_.as_deref(), Some("object" | "array")) || value.is_object() || value.is_array();
    let shown = |d: &str| -> String {
        match omit {
            true => format!("Invalid value: {d}"),
            false => format!("Invalid value: {}: {d}", crate::validation::ShowValue::show(value)),
        }
    };
    match reason {
        Some("FieldValueForbidden") => v::forbidden(path, detail),
        Some("FieldValueRequired") => v::required(path, detail),
        Some("FieldValueDuplicate") => Cause {
            reason: "FieldValueDuplicate".into(),
            field: path.to_string(),
            message: format!("Duplicate value: {}", value),
        },
        _ => Cause { reason: "FieldValueInvalid".into(), field: path.to_string(), message: shown(detail) },
    }
}

/// Evaluates every rule of `schema` and of the schemas under it on `value` (`old`: the stored
/// value at the same place, on updates).
pub fn validate(value: &Value, old: Option<&Value>, schema: &Schema, path: &FieldPath, out: &mut Vec<Cause>) {
    if value.is_null() {
        return;
    }
    for rule in schema.x_kubernetes_validations.iter().flatten() {
        let Ok(program) = compile(&rule.rule) else { continue };
        // Transition rules only run where there is an old value.
        let transition = uses_old_self(&program);
        if transition && old.is_none() && rule.optional_old_self != Some(true) {
            continue;
        }
        let at = match rule.field_path.as_deref().filter(|f| !f.is_empty()) {
            Some(f) => FieldPath::root(format!("{path}{f}").trim_start_matches('.')),
            None => path.clone(),
        };
        match run(&program, value, if transition { old } else { None }) {
            Outcome::Pass => {}
            Outcome::Fail => {
                let detail = message_of(rule, value, old);
                out.push(failure(&at, value, schema, &detail, rule.reason.as_deref()));
            }
            Outcome::Error(e) => {
                let omit = Value::String(schema.type_.clone().unwrap_or_default());
                out.push(v::invalid(&at, &omit, &format!("{e} evaluating rule: {}", rule.rule.trim())));
            }
        }
    }
    match value {
        Value::Object(map) => {
            for (k, child) in map {
                let sub = schema.properties.as_ref().and_then(|p| p.get(k)).or(match &schema.additional_properties {
                    Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(a)) => Some(&**a),
                    _ => None,
                });
                if let Some(sub) = sub {
                    validate(child, old.and_then(|o| o.get(k)), sub, &path.child(k), out);
                }
            }
        }
        Value::Array(list) => {
            let Some(item) = items(schema) else { return };
            let keys = schema.x_kubernetes_list_map_keys.as_deref().unwrap_or(&[]);
            let map_list = schema.x_kubernetes_list_type.as_deref() == Some("map") && !keys.is_empty();
            for (i, child) in list.iter().enumerate() {
                // Only items of map lists correlate with the old list (by their keys).
                let prev = match (map_list, old.and_then(Value::as_array)) {
                    (true, Some(olds)) => olds.iter().find(|o| keys.iter().all(|k| o.get(k) == child.get(k))),
                    _ => None,
                };
                validate(child, prev, item, &path.index(i), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema(v: Value) -> Schema {
        serde_json::from_value(v).unwrap()
    }

    fn causes(s: &Schema, v: Value, old: Option<Value>) -> Vec<String> {
        let mut out = Vec::new();
        validate(&v, old.as_ref(), s, &FieldPath::default(), &mut out);
        out.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn rules_of_the_kind_the_gateway_api_writes() {
        let s = schema(json!({"type": "object", "properties": {"spec": {"type": "object",
        "x-kubernetes-validations": [
            {"rule": "!(has(self.percent) && has(self.fraction))", "message": "only one of percent or fraction may be specified"},
            {"rule": "self.hostnames.all(h, !isIP(h))", "message": "hostnames must not be IPs"}],
        "properties": {
            "percent": {"type": "integer"}, "fraction": {"type": "object"},
            "hostnames": {"type": "array", "items": {"type": "string"}},
            "refs": {"type": "array", "items": {"type": "object", "properties": {"namespace": {"type": "string"}, "name": {"type": "string"}}},
                "x-kubernetes-validations": [{"rule": "self.all(p1, self.exists_one(p2, p1.name == p2.name && ((!has(p1.__namespace__) && !has(p2.__namespace__)) || (has(p1.__namespace__) && has(p2.__namespace__) && p1.__namespace__ == p2.__namespace__))))", "message": "refs must be unique"}]},
            "key": {"type": "string", "x-kubernetes-validations": [{"rule": "self.split('/')[0].size() < 5"}]},
            "mode": {"type": "string", "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "mode is immutable"}]},
            "timeout": {"type": "string", "x-kubernetes-validations": [{"rule": "duration(self) >= duration('1ms')", "message": "too short"}]},
        }}}}));
        assert_eq!(
            causes(
                &s,
                json!({"spec": {"percent": 1, "hostnames": ["a.example"], "key": "abc/def", "timeout": "10s",
            "refs": [{"name": "a"}, {"name": "a", "namespace": "x"}]}}),
                None
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            causes(
                &s,
                json!({"spec": {"percent": 1, "fraction": {}, "hostnames": ["10.0.0.1"], "key": "abcdef/x",
                "timeout": "0s", "refs": [{"name": "a"}, {"name": "a"}]}}),
                None
            ),
            [
                "spec: Invalid value: only one of percent or fraction may be specified",
                "spec: Invalid value: hostnames must not be IPs",
                "spec.key: Invalid value: \"abcdef/x\": failed rule: self.split('/')[0].size() < 5",
                "spec.refs: Invalid value: refs must be unique",
                "spec.timeout: Invalid value: \"0s\": too short",
            ]
        );
        // A transition rule runs only on updates.
        assert_eq!(causes(&s, json!({"spec": {"hostnames": [], "mode": "a"}}), None), Vec::<String>::new());
        assert_eq!(
            causes(
                &s,
                json!({"spec": {"hostnames": [], "mode": "b"}}),
                Some(json!({"spec": {"hostnames": [], "mode": "a"}}))
            ),
            ["spec.mode: Invalid value: \"b\": mode is immutable"]
        );
    }

    #[test]
    fn a_rule_that_does_not_compile_makes_the_crd_invalid() {
        let s = schema(
            json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.a ==", "message": "m"}, {"rule": ""}]}),
        );
        let mut out = Vec::new();
        check_rules(&s, &FieldPath::root("openAPIV3Schema"), &mut out);
        assert!(
            out[0].to_string().starts_with(
                "openAPIV3Schema.x-kubernetes-validations[0].rule: Invalid value: \"self.a ==\": compilation failed:"
            ),
            "{out:?}"
        );
        assert_eq!(
            out[1].to_string(),
            "openAPIV3Schema.x-kubernetes-validations[1].rule: Required value: rule is not specified"
        );
        assert_eq!(escape("namespace"), "__namespace__");
        assert_eq!(escape("a.b-c/d__e"), "a__dot__b__dash__c__slash__d__underscores__e");
    }
}
