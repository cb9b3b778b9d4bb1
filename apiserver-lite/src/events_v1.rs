//! `events.k8s.io/v1` Events: the same stored Events as core/v1, seen through the other
//! version, as the real server serves one resource in two groups. A request under
//! `/apis/events.k8s.io/v1/` is converted (body, field selector) and served by the core/v1
//! handlers; their answer (object, list, watch events, Table rows) is converted back.
//!
//! Field names differ, nothing else: `regarding`↔`involvedObject`, `note`↔`message`,
//! `reportingController`↔`reportingComponent`, `deprecatedSource`↔`source`,
//! `deprecatedFirstTimestamp`↔`firstTimestamp`, `deprecatedLastTimestamp`↔`lastTimestamp`,
//! `deprecatedCount`↔`count`. A create gets events.k8s.io/v1's own validation (eventTime,
//! reportingController, reportingInstance, action, reason required; note ≤ 1 kB).

use api::validation::{self as v, Cause, FieldPath};
use api::KindInfo;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::error::ApiError;

pub const GROUP: &str = "events.k8s.io";
pub const VERSION: &str = "v1";
const PREFIX: &str = "/apis/events.k8s.io/v1";

/// How discovery and OpenAPI describe the resource.
pub static INFO: KindInfo = KindInfo {
    group: GROUP,
    version: VERSION,
    short_names: &["ev"],
    field_selectors: &[
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    ],
    ..KindInfo::core("Event", "events", "event")
};

/// events.k8s.io/v1 field ↔ core/v1 field (top level of an Event).
const FIELDS: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// The core/v1 path for an events.k8s.io/v1 path, or None when `path` is not one of its
/// Event URLs.
pub fn core_path(path: &str) -> Option<String> {
    let rest = path.strip_prefix(PREFIX)?;
    let segs: Vec<&str> = rest.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let ok = matches!(
        segs.as_slice(),
        ["events"] | ["events", _] | ["namespaces", _, "events"] | ["namespaces", _, "events", _]
    );
    ok.then(|| format!("/api/v1{rest}"))
}

fn rename(obj: &mut serde_json::Map<String, Value>, to_core: bool) {
    for (v1, core) in FIELDS {
        let (from, to) = if to_core { (v1, core) } else { (core, v1) };
        if let Some(val) = obj.remove(*from) {
            obj.insert(to.to_string(), val);
        }
    }
}

/// Applies `one` to every object of `kind` in the stored version `stored` that a response
/// holds — the object itself, a list's items, a Table's rows, a watch event's object — giving
/// it and its list the served version `served`. Pure.
pub fn each_object(
    v: &mut Value,
    kind: &str,
    stored: &str,
    served: &str,
    one: fn(&mut serde_json::Map<String, Value>),
) {
    let Some(obj) = v.as_object_mut() else { return };
    let objects: Vec<&mut Value> = match obj.get("kind").and_then(Value::as_str) {
        Some(k) if k == kind => {
            if obj.get("apiVersion").and_then(Value::as_str) == Some(stored) {
                obj.insert("apiVersion".into(), json!(served));
                one(obj);
            }
            return;
        }
        Some(k) if k.strip_suffix("List") == Some(kind) => {
            obj.insert("apiVersion".into(), json!(served));
            let mut items: Vec<&mut Value> =
                obj.get_mut("items").and_then(Value::as_array_mut).into_iter().flatten().collect();
            for item in items.iter_mut() {
                item["apiVersion"] = json!(stored);
                item["kind"] = json!(kind);
            }
            items
        }
        Some("Table") => obj
            .get_mut("rows")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
            .filter_map(|row| row.get_mut("object"))
            .collect(),
        // A watch event: {type, object}.
        None if obj.contains_key("type") => obj.get_mut("object").into_iter().collect(),
        _ => vec![],
    };
    for o in objects {
        each_object(o, kind, stored, served, one);
    }
}

/// An Event, EventList, watch event or Table as events.k8s.io/v1 shows it. Pure.
pub fn to_v1(v: &mut Value) {
    each_object(v, "Event", "v1", &format!("{GROUP}/{VERSION}"), |o| rename(o, false));
}

/// A request body (an Event, or a merge/strategic patch of one) as core/v1 takes it. Pure.
pub fn to_core(v: &mut Value) {
    if let Some(obj) = v.as_object_mut() {
        if obj.get("apiVersion").and_then(Value::as_str) == Some(&format!("{GROUP}/{VERSION}")) {
            obj.insert("apiVersion".into(), json!("v1"));
        }
        rename(obj, true);
    }
}

/// A JSON patch (RFC 6902) whose paths name events.k8s.io/v1 fields, for core/v1. Pure.
pub fn json_patch_to_core(ops: &mut Value) {
    for op in ops.as_array_mut().into_iter().flatten() {
        for key in ["path", "from"] {
            let Some(p) = op.get(key).and_then(Value::as_str) else { continue };
            let first = p.trim_start_matches('/').split('/').next().unwrap_or("");
            if let Some((_, core)) = FIELDS.iter().find(|(v1, _)| *v1 == first) {
                op[key] = json!(format!("/{core}{}", &p[1 + first.len()..]));
            }
        }
    }
}

/// A field selector on events.k8s.io/v1 fields as one on core/v1 fields. Pure.
pub fn field_selector_to_core(sel: &str) -> String {
    sel.split(',')
        .map(|term| {
            let field_end = term.find(['=', '!']).unwrap_or(term.len());
            let (field, rest) = term.split_at(field_end);
            let field = field.trim();
            let (top, sub) = field.split_once('.').map_or((field, None), |(a, b)| (a, Some(b)));
            match FIELDS.iter().find(|(v1, _)| *v1 == top) {
                Some((_, core)) => match sub {
                    Some(s) => format!("{core}.{s}{rest}"),
                    None => format!("{core}{rest}"),
                },
                None => term.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// events.k8s.io/v1's checks of a new Event (the API server's `ValidateEventCreate` for this
/// version), on the body as the client sent it. Pure.
pub fn validate_create(ev: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    let root = FieldPath::root;
    let s = |f: &str| ev.get(f).and_then(Value::as_str).unwrap_or("");
    if ev.get("eventTime").is_none_or(Value::is_null) {
        out.push(v::required(&root("eventTime"), ""));
    }
    for f in ["reportingController", "reportingInstance", "action", "reason"] {
        if s(f).is_empty() {
            out.push(v::required(&root(f), ""));
        }
    }
    for f in ["reportingInstance", "action", "reason"] {
        if s(f).len() > 128 {
            out.push(v::too_long(&root(f), 128));
        }
    }
    if s("note").len() > 1024 {
        out.push(v::too_long(&root("note"), 1024));
    }
    if !matches!(s("type"), "Normal" | "Warning") {
        out.push(v::not_supported(&root("type"), s("type"), &["Normal", "Warning"]));
    }
    out
}

fn invalid(name: &str, causes: Vec<Cause>) -> Response {
    let message = format!(
        "Event.events.k8s.io {name:?} is invalid: {}",
        causes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    );
    let causes: Vec<Value> =
        causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect();
    crate::response::json_response(
        StatusCode::UNPROCESSABLE_ENTITY,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                "reason": "Invalid", "code": 422,
                "details": {"name": name, "group": GROUP, "kind": "Event", "causes": causes}}),
    )
}

/// How a resource served in a second version converts (this module's Events; autoscaling/v1's
/// HorizontalPodAutoscalers): the request and response functions below take one.
pub struct Conversion {
    /// A request body (an object, or a merge/strategic patch of one) into the stored version.
    pub to_storage: fn(&mut Value),
    /// A JSON patch's paths into the stored version.
    pub json_patch: fn(&mut Value),
    pub field_selector: fn(&str) -> String,
    /// A create's own validation in the served version: the refusal, if any.
    pub validate_create: fn(&Value) -> Option<Response>,
    /// An object, list, watch event or Table into the served version.
    pub to_served: fn(&mut Value),
    /// The protobuf message of a body in the served version, when clients send one.
    pub protobuf: Option<&'static str>,
}

fn validate_event(v: &Value) -> Option<Response> {
    let causes = validate_create(v);
    if causes.is_empty() {
        return None;
    }
    let name = v["metadata"]["name"].as_str().unwrap_or("").to_string();
    Some(invalid(&name, causes))
}

/// events.k8s.io/v1 ↔ core/v1.
pub static EVENTS: Conversion = Conversion {
    to_storage: to_core,
    json_patch: json_patch_to_core,
    field_selector: field_selector_to_core,
    validate_create: validate_event,
    to_served: to_v1,
    protobuf: None,
};

/// The stored version's request for one in the served version, or the response that refuses it.
pub async fn to_core_request(req: Request, core: &str, limit: usize, conv: &Conversion) -> Result<Request, Response> {
    let (mut parts, body) = req.into_parts();
    let mut query: Vec<(String, String)> =
        form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()).into_owned().collect();
    for (k, val) in &mut query {
        if k == "fieldSelector" {
            *val = (conv.field_selector)(val);
        }
    }
    let qs = form_urlencoded::Serializer::new(String::new()).extend_pairs(&query).finish();
    let uri = if qs.is_empty() { core.to_string() } else { format!("{core}?{qs}") };
    parts.uri = uri.parse().map_err(|_| ApiError::BadRequest(format!("bad path {core}")).into_response())?;
    // JSON only: the protobuf form of this version is not served (Tables stay Tables).
    if let Some(accept) = parts.headers.get(header::ACCEPT).and_then(|a| a.to_str().ok()) {
        if accept.contains("protobuf") {
            let json = if accept.contains("as=Table") {
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
            } else {
                "application/json"
            };
            parts.headers.insert(header::ACCEPT, HeaderValue::from_static(json));
        }
    }
    let has_body = matches!(parts.method, Method::POST | Method::PUT | Method::PATCH);
    if !has_body {
        return Ok(Request::from_parts(parts, body));
    }
    // The core handlers' own body reading and parsing (limit, JSON, YAML, protobuf).
    let bytes = crate::rest::read_body(Request::new(body), limit).await.map_err(IntoResponse::into_response)?;
    if bytes.is_empty() {
        return Ok(Request::from_parts(parts, Body::empty()));
    }
    let ct = parts.headers.get(header::CONTENT_TYPE).and_then(|c| c.to_str().ok()).unwrap_or("").to_string();
    let mut value = match conv.protobuf.filter(|_| ct.starts_with("application/vnd.kubernetes.protobuf")) {
        Some(message) => {
            api::protobuf::decode_message(&bytes, message).map_err(|e| ApiError::from(e).into_response())?
        }
        None => crate::rest::parse_body(&bytes, &parts.headers).map_err(IntoResponse::into_response)?,
    };
    if parts.method == Method::POST {
        if let Some(refused) = (conv.validate_create)(&value) {
            return Err(refused);
        }
    }
    if ct.starts_with("application/json-patch+json") {
        (conv.json_patch)(&mut value);
    } else {
        (conv.to_storage)(&mut value);
    }
    let out = serde_json::to_vec(&value).unwrap_or_default();
    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
    if ct.contains("yaml") {
        // The apply body is JSON now, which is YAML too.
        parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/apply-patch+yaml"));
    } else if ct.contains("protobuf") {
        parts.headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    Ok(Request::from_parts(parts, Body::from(out)))
}

/// The stored version's response in the served version: whole JSON bodies converted, watch
/// streams converted event by event (one JSON document per line).
pub async fn to_v1_response(resp: Response, streaming: bool, conv: &'static Conversion) -> Response {
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .is_some_and(|c| c.starts_with("application/json"));
    if !is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    if streaming {
        parts.headers.remove(header::CONTENT_LENGTH);
        let mut pending: Vec<u8> = Vec::new();
        let stream = body.into_data_stream().map(move |chunk| {
            let chunk = chunk?;
            pending.extend_from_slice(&chunk);
            let mut out = Vec::new();
            while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                out.extend(convert_line(&line, conv));
            }
            Ok::<Bytes, axum::Error>(Bytes::from(out))
        });
        return Response::from_parts(parts, Body::from_stream(stream));
    }
    let bytes = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => return ApiError::internal(format!("reading the events response: {e}")).into_response(),
    };
    let out = match serde_json::from_slice::<Value>(&bytes) {
        Ok(mut v) => {
            (conv.to_served)(&mut v);
            serde_json::to_vec(&v).unwrap_or_default()
        }
        Err(_) => bytes.to_vec(),
    };
    parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(out.len()));
    Response::from_parts(parts, Body::from(out))
}

fn convert_line(line: &[u8], conv: &Conversion) -> Vec<u8> {
    match serde_json::from_slice::<Value>(line) {
        Ok(mut v) => {
            (conv.to_served)(&mut v);
            let mut out = serde_json::to_vec(&v).unwrap_or_default();
            out.push(b'\n');
            out
        }
        Err(_) => line.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core_event() -> Value {
        json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "web.1", "namespace": "default"},
               "involvedObject": {"kind": "Pod", "name": "web", "fieldPath": "spec.containers{web}"},
               "reason": "Started", "message": "Started container web", "type": "Normal",
               "source": {"component": "kubelet", "host": "node-1"}, "reportingComponent": "kubelet",
               "reportingInstance": "node-1", "firstTimestamp": "2026-11-24T10:00:00Z",
               "lastTimestamp": "2026-11-24T10:00:05Z", "count": 2})
    }

    #[test]
    fn paths_map_to_core_only_for_events() {
        assert_eq!(
            core_path("/apis/events.k8s.io/v1/namespaces/default/events").as_deref(),
            Some("/api/v1/namespaces/default/events")
        );
        assert_eq!(core_path("/apis/events.k8s.io/v1/events").as_deref(), Some("/api/v1/events"));
        assert_eq!(
            core_path("/apis/events.k8s.io/v1/namespaces/d/events/x").as_deref(),
            Some("/api/v1/namespaces/d/events/x")
        );
        assert_eq!(core_path("/apis/events.k8s.io/v1"), None, "discovery is not an Event URL");
        assert_eq!(core_path("/apis/events.k8s.io/v1/namespaces/d/pods"), None);
    }

    #[test]
    fn an_event_round_trips_between_the_versions() {
        let mut e = core_event();
        to_v1(&mut e);
        assert_eq!(e["apiVersion"], "events.k8s.io/v1");
        assert_eq!(e["regarding"]["fieldPath"], "spec.containers{web}");
        assert_eq!(
            (e["note"].as_str(), e["reportingController"].as_str()),
            (Some("Started container web"), Some("kubelet"))
        );
        assert_eq!((e["deprecatedCount"].as_i64(), e["deprecatedSource"]["host"].as_str()), (Some(2), Some("node-1")));
        assert!(e.get("message").is_none() && e.get("involvedObject").is_none());
        to_core(&mut e);
        assert_eq!(e, core_event());
    }

    #[test]
    fn lists_watch_events_and_table_rows_are_converted() {
        let mut list = json!({"kind": "EventList", "apiVersion": "v1", "items": [core_event()]});
        to_v1(&mut list);
        assert_eq!(list["apiVersion"], "events.k8s.io/v1");
        assert_eq!(list["items"][0]["note"], "Started container web");
        let mut w = json!({"type": "ADDED", "object": core_event()});
        to_v1(&mut w);
        assert_eq!(w["object"]["regarding"]["name"], "web");
        let line =
            convert_line(format!("{}\n", json!({"type": "MODIFIED", "object": core_event()})).as_bytes(), &EVENTS);
        let back: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            (back["type"].as_str(), back["object"]["note"].as_str()),
            (Some("MODIFIED"), Some("Started container web"))
        );
        assert!(line.ends_with(b"\n"), "one event per line");
        let status = json!({"kind": "Status", "apiVersion": "v1", "message": "events \"x\" not found"});
        let mut s2 = status.clone();
        to_v1(&mut s2);
        assert_eq!(s2, status, "a Status is left alone");
    }

    #[test]
    fn selectors_and_json_patches_name_core_fields() {
        assert_eq!(
            field_selector_to_core("regarding.name=web,reportingController!=kubelet,type=Warning"),
            "involvedObject.name=web,reportingComponent!=kubelet,type=Warning"
        );
        let mut ops = json!([{"op": "replace", "path": "/note", "value": "x"}, {"op": "add", "path": "/regarding/fieldPath", "value": "y"}]);
        json_patch_to_core(&mut ops);
        assert_eq!(ops[0]["path"], "/message");
        assert_eq!(ops[1]["path"], "/involvedObject/fieldPath");
    }

    #[test]
    fn a_new_event_needs_what_events_k8s_io_v1_requires() {
        let fields = |e: &Value| validate_create(e).into_iter().map(|c| c.field).collect::<Vec<_>>();
        assert_eq!(
            fields(&json!({"type": "Normal"})),
            ["eventTime", "reportingController", "reportingInstance", "action", "reason"]
        );
        let ok = json!({"eventTime": "2026-11-24T10:00:00.000000Z", "reportingController": "example.com/x",
                        "reportingInstance": "x-1", "action": "Poke", "reason": "Poked", "type": "Warning", "note": "hi"});
        assert!(validate_create(&ok).is_empty());
        let mut long = ok.clone();
        long["note"] = json!("n".repeat(1025));
        long["type"] = json!("Odd");
        assert_eq!(fields(&long), ["note", "type"]);
    }
}
