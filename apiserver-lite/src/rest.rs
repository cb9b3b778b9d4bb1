//! The REST API that kubectl, the Python client and kube-rs speak
//! (see shared/reference/kubectl-surface.md): version, discovery (legacy and aggregated),
//! OpenAPI v3 for default validation, CRUD with Tables, patches, watches and status.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use api::patch::PatchType;
use api::selector::{FieldSelector, LabelSelector};
use api::Codec;
use api::{ApiObject, Kind};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::registry::{DeleteOptions, FieldValidation, Registry, Subresource, WriteOptions};
use crate::response::json_response;
use crate::watch::{WatchFilter, WatchItem, WatchSpec};

/// What the REST layer needs.
#[derive(Clone)]
pub struct RestState {
    pub registry: Arc<Registry>,
    /// Bearer token every request must carry (health endpoints excepted).
    pub token: Option<Arc<str>>,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    /// `host:port` that discovery advertises.
    pub advertise: String,
    /// The network namespace node agents are reached from (`pods/log`); None: this one.
    pub kubelet_netns: Option<std::path::PathBuf>,
    /// ServiceAccount tokens (TokenRequest, authentication); None: none are issued.
    pub tokens: Option<Arc<crate::auth::Tokens>>,
}

pub fn router(state: RestState) -> Router {
    Router::new().fallback(handle).with_state(state)
}

async fn handle(State(st): State<RestState>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        let mut r = Response::new(Body::from("ok"));
        r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        return r;
    }
    let query: BTreeMap<String, String> = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .filter(|(k, _)| !k.is_empty())
        .collect();
    // Authentication, impersonation, then RBAC on what the request asks.
    let now = jiff::Timestamp::now().as_second();
    let Some(mut user) =
        crate::auth::authenticate(&st.registry, st.token.as_deref(), st.tokens.as_deref(), req.headers(), now)
    else {
        return ApiError::Unauthorized.into_response();
    };
    if let Some((as_user, checks)) = crate::auth::impersonation(req.headers()) {
        for c in &checks {
            if let Err(e) = crate::auth::authorize(&st.registry, &user, c) {
                return e.into_response();
            }
        }
        user = as_user;
    }
    let attrs = crate::auth::attributes(req.method(), &path, &query);
    if let Err(e) = crate::auth::authorize(&st.registry, &user, &attrs) {
        return e.into_response();
    }
    let mut req = req;
    req.extensions_mut().insert(user);
    // Watches and followed logs stream for as long as the client reads.
    let is_watch = query_bool(&query, "watch")
        || (path.ends_with("/log") && query_bool(&query, "follow"))
        || path.rsplit('/').next().and_then(crate::streaming::Verb::from_subresource).is_some();
    // events.k8s.io/v1 (served by the core/v1 handlers) and autoscaling/v1 (by the v2 ones),
    // converted both ways.
    let converted = crate::events_v1::core_path(&path)
        .map(|p| (p, &crate::events_v1::EVENTS))
        .or_else(|| crate::autoscaling_v1::v2_path(&path).map(|p| (p, &crate::autoscaling_v1::HPA)));
    if let Some((stored, conv)) = converted {
        return match crate::events_v1::to_core_request(req, &stored, st.max_body_bytes, conv).await {
            Ok(req) => {
                let resp = Box::pin(handle(State(st), req)).await;
                crate::events_v1::to_v1_response(resp, is_watch, conv).await
            }
            Err(refused) => refused,
        };
    }
    let timeout = st.request_timeout;
    let fut = dispatch(st, req, path, query);
    if is_watch {
        return fut.await.unwrap_or_else(IntoResponse::into_response);
    }
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.unwrap_or_else(IntoResponse::into_response),
        Err(_) => json_response(
            StatusCode::GATEWAY_TIMEOUT,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "the request did not complete in time", "reason": "Timeout", "code": 504}),
        ),
    }
}

/// A parsed resource URL.
struct Target {
    kind: Kind,
    /// The version of the URL (a custom resource may be served in several).
    version: String,
    namespace: Option<String>,
    name: Option<String>,
    sub: Subresource,
}

async fn dispatch(
    st: RestState,
    req: Request,
    path: String,
    query: BTreeMap<String, String>,
) -> Result<Response, ApiError> {
    let method = req.method().clone();
    let headers = req.headers().clone();
    let user = req.extensions().get::<api::rbac::UserInfo>().cloned();
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let get_only = |r: Response| if method == Method::GET { Ok(r) } else { Err(ApiError::MethodNotAllowed) };
    match segs.as_slice() {
        ["version"] => return get_only(json_response(StatusCode::OK, &version())),
        ["api"] => {
            if wants_aggregated(&headers) {
                return get_only(aggregated(&st.registry, &headers, true));
            }
            return get_only(json_response(StatusCode::OK, &api_versions(&st.advertise)));
        }
        ["apis"] => {
            if wants_aggregated(&headers) {
                return get_only(aggregated(&st.registry, &headers, false));
            }
            return get_only(json_response(StatusCode::OK, &api_groups(&st.registry)));
        }
        ["api", "v1"] => return get_only(json_response(StatusCode::OK, &resource_list(&st.registry, "", "v1"))),
        ["apis", g, v]
            if groups(&st.registry).iter().chain(review_groups().iter()).any(|(gg, vv)| gg == g && vv == v) =>
        {
            return get_only(json_response(StatusCode::OK, &resource_list(&st.registry, g, v)))
        }
        ["apis", g, v, plural] if crate::review::REVIEWS.iter().any(|r| r.0 == *g && r.1 == *v && r.2 == *plural) => {
            if method != Method::POST {
                return Err(ApiError::MethodNotAllowed);
            }
            let plural = plural.to_string();
            let message = crate::review::REVIEWS
                .iter()
                .find(|r| r.2 == plural)
                .map(|r| format!("{}.{}.{}", r.0.split('.').next().unwrap_or(""), r.1, r.3))
                .unwrap_or_default();
            let body = read_body(req, st.max_body_bytes).await?;
            let protobuf = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|c| c.starts_with("application/vnd.kubernetes.protobuf"));
            let value = match (body.is_empty(), protobuf) {
                (true, _) => json!({}),
                // kubectl's typed clients send these as protobuf.
                (false, true) => api::protobuf::decode_message(&body, &message)?,
                (false, false) => parse_body(&body, &headers)?,
            };
            let user = user.unwrap_or_else(api::rbac::UserInfo::admin);
            let policy = if user.is_master() { Default::default() } else { crate::auth::policy(&st.registry)? };
            return Ok(json_response(StatusCode::CREATED, &crate::review::answer(&plural, &value, &user, &policy)?));
        }
        ["apis", crate::resource_metrics::GROUP, crate::resource_metrics::VERSION, rest @ ..] if !rest.is_empty() => {
            let v = crate::resource_metrics::serve(&st.registry, rest, &query)?;
            return get_only(json_response(StatusCode::OK, &v));
        }
        ["api", "v1", "namespaces", ns, "serviceaccounts", name, "token"] => {
            let (ns, name) = (ns.to_string(), name.to_string());
            let body = read_body(req, st.max_body_bytes).await?;
            return token_request(&st, &method, &headers, &ns, &name, body);
        }
        ["openapi", "v2"] => {
            if wants_protobuf_openapi(&headers) {
                static PB: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
                let body = PB.get_or_init(|| api::openapi_pb::encode_v2(&openapi_v2())).clone();
                let mut r = Response::new(Body::from(body));
                r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(api::openapi_pb::MEDIA_TYPE));
                return get_only(r);
            }
            accepts_json(&headers, "/openapi/v2")?;
            return get_only(json_response(StatusCode::OK, &openapi_v2()));
        }
        ["openapi", "v3"] => return get_only(json_response(StatusCode::OK, &openapi_index(&st.registry))),
        ["openapi", "v3", "api", "v1"] => {
            return get_only(json_response(StatusCode::OK, &openapi_doc(&st.registry, "", "v1")))
        }
        ["openapi", "v3", "apis", g, v] if groups(&st.registry).iter().any(|(gg, vv)| gg == g && vv == v) => {
            return get_only(json_response(StatusCode::OK, &openapi_doc(&st.registry, g, v)))
        }
        _ => {}
    }
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (g, v, rest),
        _ => return Err(ApiError::NoRoute),
    };
    if let ([], ["namespaces", ns, plural @ ("services" | "pods"), name, "proxy", ..]) = (group.as_bytes(), rest) {
        // Everything after `/proxy/` goes to the backend as it is (a trailing slash too).
        let marker = format!("/{plural}/{name}/proxy");
        let tail = path.split_once(marker.as_str()).map(|(_, t)| t.trim_start_matches('/')).unwrap_or("");
        let kind = if *plural == "services" { Kind::Service } else { Kind::Pod };
        let (ns, name, tail) = (ns.to_string(), name.to_string(), tail.to_string());
        let raw_query = req.uri().query().map(str::to_string);
        let body = read_body(req, st.max_body_bytes).await?;
        return crate::proxy::handle(&st, &method, kind, &ns, &name, &tail, raw_query.as_deref(), &headers, body).await;
    }
    if let ([], ["namespaces", ns, "pods", name, sub]) = (group.as_bytes(), rest) {
        if let Some(verb) = crate::streaming::Verb::from_subresource(sub) {
            if method != Method::GET && method != Method::POST {
                return Err(ApiError::MethodNotAllowed);
            }
            return crate::streaming::handle(&st, verb, ns, name, req).await;
        }
    }
    let target = parse_target(group, version, rest).ok_or(ApiError::NoRoute)?;
    let body = read_body(req, st.max_body_bytes).await?;
    handle_resource(&st, &method, &headers, &query, target, body).await
}

fn parse_target(group: &str, version: &str, rest: &[&str]) -> Option<Target> {
    let kind = |plural: &str| Kind::from_plural(group, version, plural);
    let sub = |s: &str| match s {
        "status" => Some(Subresource::Status),
        "log" if group.is_empty() && rest.get(2) == Some(&"pods") => Some(Subresource::Log),
        "ephemeralcontainers" if group.is_empty() && rest.get(2) == Some(&"pods") => {
            Some(Subresource::EphemeralContainers)
        }
        "eviction" if group.is_empty() && rest.get(2) == Some(&"pods") => Some(Subresource::Eviction),
        "scale" if matches!(Kind::from_plural(group, version, rest.get(2).copied().unwrap_or("")), Some(k) if k.has_scale()) => {
            Some(Subresource::Scale)
        }
        _ => None,
    };
    let t = |k: Kind, ns: Option<&str>, name: Option<&str>, s: Subresource| Target {
        kind: k,
        version: version.to_string(),
        namespace: ns.map(str::to_string),
        name: name.map(str::to_string),
        sub: s,
    };
    match rest {
        // The Namespace object itself.
        ["namespaces", name] if group.is_empty() => Some(t(Kind::Namespace, None, Some(name), Subresource::Main)),
        ["namespaces", name, s] if group.is_empty() && (*s == "status" || *s == "finalize") => {
            Some(t(Kind::Namespace, None, Some(name), Subresource::Status))
        }
        ["namespaces", ns, plural] => {
            kind(plural).filter(|k| k.info().namespaced).map(|k| t(k, Some(ns), None, Subresource::Main))
        }
        ["namespaces", ns, plural, name] => {
            kind(plural).filter(|k| k.info().namespaced).map(|k| t(k, Some(ns), Some(name), Subresource::Main))
        }
        ["namespaces", ns, plural, name, s] => {
            let k = kind(plural).filter(|k| k.info().namespaced && k.info().has_status)?;
            Some(t(k, Some(ns), Some(name), sub(s)?))
        }
        [plural] => kind(plural).map(|k| t(k, None, None, Subresource::Main)),
        [plural, name] => {
            kind(plural).filter(|k| !k.info().namespaced).map(|k| t(k, None, Some(name), Subresource::Main))
        }
        [plural, name, s] => {
            let k = kind(plural).filter(|k| !k.info().namespaced && k.info().has_status)?;
            Some(t(k, None, Some(name), sub(s)?))
        }
        _ => None,
    }
}

pub(crate) async fn read_body(req: Request, limit: usize) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(req.into_body(), limit);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::TooLarge(limit)),
        Err(e) => Err(ApiError::BadRequest(format!("cannot read the request body: {e}"))),
    }
}

/// How deep a YAML body may nest (found by a linear scan before parsing: libyaml's time grows
/// with the square of the depth). Real manifests nest a few dozen levels.
const MAX_YAML_DEPTH: usize = 1000;

/// Parses a request body: JSON, or YAML (server-side apply bodies may be YAML).
pub(crate) fn parse_body(body: &Bytes, headers: &HeaderMap) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest("the request body is empty".into()));
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    // kubectl's typed clients (create namespace, create service …) send protobuf.
    if ct.starts_with("application/vnd.kubernetes.protobuf") {
        return Ok(api::protobuf::decode_body(body)?);
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => Ok(v),
        Err(e) if ct.contains("yaml") => {
            if let Some(depth) = crate::yaml::depth_beyond(body, MAX_YAML_DEPTH) {
                return Err(ApiError::BadRequest(format!(
                    "the YAML request body is nested {depth} levels deep or more; the limit is {MAX_YAML_DEPTH}"
                )));
            }
            serde_yaml::from_slice::<Value>(body)
                .map_err(|ye| ApiError::BadRequest(format!("the request body is neither JSON ({e}) nor YAML ({ye})")))
        }
        Err(e) => Err(ApiError::BadRequest(format!("the request body is not valid JSON: {e}"))),
    }
}

fn wants_table(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.split(',').next().is_some_and(|first| first.contains("as=Table")))
}

fn selectors(kind: Kind, q: &BTreeMap<String, String>) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let ls = LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))?;
    let fs = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""), kind)?;
    Ok((ls, fs))
}

/// A boolean query parameter as the real server reads one: false when absent, empty, `0` or
/// `false` (any case), true otherwise (`watch=True` is a watch).
pub fn query_bool(q: &BTreeMap<String, String>, name: &str) -> bool {
    q.get(name).is_some_and(|v| !(v.is_empty() || v == "0" || v.eq_ignore_ascii_case("false")))
}

/// `dryRun`: absent, or `All` (the only stage there is); anything else makes the request's
/// options (`options_kind`: `CreateOptions`, `DeleteOptions`, …) invalid, and nothing is done.
fn dry_run(value: Option<&str>, options_kind: &'static str) -> Result<bool, ApiError> {
    match value {
        None => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(ApiError::InvalidOptions {
            kind: options_kind,
            causes: vec![api::Cause {
                reason: "FieldValueNotSupported".into(),
                field: "dryRun".into(),
                message: format!("Unsupported value: []string{{{other:?}}}: supported values: \"All\""),
            }],
        }),
    }
}

fn write_options(
    q: &BTreeMap<String, String>,
    headers: &HeaderMap,
    options_kind: &'static str,
) -> Result<WriteOptions, ApiError> {
    Ok(WriteOptions {
        field_validation: FieldValidation::parse(q.get("fieldValidation").map(String::as_str))?,
        dry_run: dry_run(q.get("dryRun").map(String::as_str), options_kind)?,
        field_manager: Some(field_manager(q, headers, options_kind)?),
        force: query_bool(q, "force"),
        ..Default::default()
    })
}

/// The writer's field manager: `fieldManager`, else the User-Agent up to its first `/` (as the
/// real server names managers of clients that do not say).
fn field_manager(
    q: &BTreeMap<String, String>,
    headers: &HeaderMap,
    options_kind: &'static str,
) -> Result<String, ApiError> {
    if let Some(m) = q.get("fieldManager") {
        if m.chars().count() > 128 || m.chars().any(|c| c.is_control()) {
            return Err(ApiError::InvalidOptions {
                kind: options_kind,
                causes: vec![api::validation::invalid(
                    &api::FieldPath::root("fieldManager"),
                    m.as_str(),
                    "must be at most 128 printable characters",
                )],
            });
        }
        return Ok(m.clone());
    }
    let agent = headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("unknown");
    Ok(agent.split('/').next().unwrap_or("unknown").chars().take(128).collect())
}

fn with_warnings(mut r: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - {:?}", w);
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

async fn handle_resource(
    st: &RestState,
    method: &Method,
    headers: &HeaderMap,
    q: &BTreeMap<String, String>,
    t: Target,
    body: Bytes,
) -> Result<Response, ApiError> {
    let reg = &st.registry;
    let kind = t.kind;
    let ns = t.namespace.as_deref();
    let view = View::new(reg, kind, &t.version)?;
    if let Kind::Custom(_) = kind {
        // Custom objects have no protobuf form: a protobuf body is refused, as the real server
        // refuses it, and a client that accepts nothing else gets 406.
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !body.is_empty() && ct.starts_with("application/vnd.kubernetes.protobuf") {
            return Err(ApiError::UnsupportedMediaType);
        }
        let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("*/*");
        let json_ok = accept
            .split(',')
            .map(|t| t.split(';').next().unwrap_or("").trim())
            .any(|t| matches!(t, "" | "*/*" | "application/*" | "application/json" | "application/yaml"));
        if !json_ok {
            return Err(ApiError::NotAcceptable(format!(
                "only the following media types are accepted: application/json, application/yaml; requested: {accept}"
            )));
        }
    }
    if t.sub == Subresource::Scale {
        return handle_scale(st, method, headers, q, &t, body).await;
    }
    if t.sub == Subresource::Log {
        if *method != Method::GET {
            return Err(ApiError::MethodNotAllowed);
        }
        return crate::logs::handle(st, ns.unwrap_or("default"), t.name.as_deref().unwrap_or(""), q).await;
    }
    if t.sub == Subresource::Eviction {
        return handle_eviction(st, method, headers, q, &t, body).await;
    }
    match (method.clone(), t.name.as_deref()) {
        (Method::GET, None) => {
            let (ls, fs) = selectors(kind, q)?;
            if query_bool(q, "watch") {
                return watch(st, view, t.namespace.clone(), q, ls, fs, wants_table(headers)).await;
            }
            let limit: usize = match q.get("limit").map(String::as_str) {
                None | Some("") => 0,
                // A negative limit is no limit, as the real server reads it.
                Some(l) => l
                    .parse::<i64>()
                    .map(|l| l.max(0) as usize)
                    .map_err(|_| ApiError::BadRequest(format!("limit: Invalid value: {l:?}: must be an integer")))?,
            };
            let token = q.get("continue").map(String::as_str).filter(|c| !c.is_empty());
            if limit > 0 || token.is_some() {
                let page = reg.list_page(kind, ns, &ls, &fs, limit, token)?;
                let mut meta = json!({"resourceVersion": page.rv.to_string()});
                if let Some(next) = &page.next {
                    meta["continue"] = json!(next);
                }
                if let Some(n) = page.remaining {
                    meta["remainingItemCount"] = json!(n);
                }
                let mut out = if wants_table(headers) {
                    let full = q.get("includeObject").is_some_and(|i| i == "Object");
                    view.table(&page.items, &page.rv.to_string(), full, true)
                } else {
                    let items: Vec<Value> = page.items.into_iter().map(|i| view.typed(i)).collect();
                    json!({"kind": kind.list_kind(), "apiVersion": view.api_version(), "items": items})
                };
                out["metadata"] = meta;
                return Ok(json_response(StatusCode::OK, &out));
            }
            if !wants_table(headers) && ls.is_empty() && fs.is_empty() && view.as_stored() {
                // The stored objects already carry kind and apiVersion: splice them in as they are.
                let (raw, rv) = reg.store.list_raw(kind, ns)?;
                let mut body = format!(
                    r#"{{"kind":"{}","apiVersion":"{}","metadata":{{"resourceVersion":"{rv}"}},"items":["#,
                    kind.list_kind(),
                    view.api_version()
                )
                .into_bytes();
                body.reserve(raw.iter().map(|r| r.len() + 1).sum());
                for (i, item) in raw.iter().enumerate() {
                    if i > 0 {
                        body.push(b',');
                    }
                    body.extend_from_slice(item);
                }
                body.extend_from_slice(b"]}\n");
                let mut r = Response::new(Body::from(body));
                r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                return Ok(r);
            }
            let (items, rv) = reg.list(kind, ns, &ls, &fs)?;
            if wants_table(headers) {
                let full = q.get("includeObject").is_some_and(|i| i == "Object");
                return Ok(json_response(StatusCode::OK, &view.table(&items, &rv.to_string(), full, true)));
            }
            let items: Vec<Value> = items.into_iter().map(|i| view.typed(i)).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": kind.list_kind(), "apiVersion": view.api_version(),
                        "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
            ))
        }
        (Method::GET, Some(name)) => {
            let obj = reg.get(kind, ns.unwrap_or(""), name)?;
            if wants_table(headers) {
                let full = q.get("includeObject").is_some_and(|i| i == "Object");
                let rv = obj["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
                return Ok(json_response(StatusCode::OK, &view.table(&[obj], &rv, full, true)));
            }
            Ok(json_response(StatusCode::OK, &view.typed(obj)))
        }
        (Method::POST, None) => {
            if kind.info().namespaced && ns.is_none() {
                return Err(ApiError::MethodNotAllowed);
            }
            let value = view.to_storage(parse_body(&body, headers)?)?;
            let opts =
                WriteOptions { served_version: Some(t.version.clone()), ..write_options(q, headers, "CreateOptions")? };
            let out = reg.create(kind, ns, value, &opts).await?;
            Ok(view.written(StatusCode::CREATED, out))
        }
        (Method::PUT, Some(name)) => {
            let value = view.to_storage(parse_body(&body, headers)?)?;
            let opts =
                WriteOptions { served_version: Some(t.version.clone()), ..write_options(q, headers, "UpdateOptions")? };
            let out = reg.update(kind, ns, name, value, t.sub, &opts).await?;
            Ok(view.written(StatusCode::OK, out))
        }
        (Method::PATCH, Some(name)) => {
            let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            let ty = PatchType::from_content_type(ct).ok_or(ApiError::UnsupportedMediaType)?;
            // Custom objects have no strategic merge information: the real server refuses it.
            if ty == PatchType::Strategic && matches!(kind, Kind::Custom(_)) {
                return Err(ApiError::UnsupportedMediaType);
            }
            if ty == PatchType::Apply && !q.contains_key("fieldManager") {
                return Err(ApiError::BadRequest("PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch".into()));
            }
            let mut value = parse_body(&body, headers)?;
            if ty == PatchType::Apply {
                value = view.to_storage(value)?;
            }
            let opts =
                WriteOptions { served_version: Some(t.version.clone()), ..write_options(q, headers, "PatchOptions")? };
            let out = reg.patch(kind, ns, name, ty, value, t.sub, &opts).await?;
            let code = if out.created { StatusCode::CREATED } else { StatusCode::OK };
            Ok(view.written(code, out))
        }
        (Method::DELETE, Some(name)) => {
            if t.sub != Subresource::Main {
                return Err(ApiError::MethodNotAllowed);
            }
            let opts = delete_options(&body, headers, q)?;
            let obj = reg.delete(kind, ns, name, &opts).await?;
            Ok(json_response(StatusCode::OK, &view.typed(obj)))
        }
        (Method::DELETE, None) => {
            let (ls, fs) = selectors(kind, q)?;
            let opts = delete_options(&body, headers, q)?;
            let (items, _) = reg.list(kind, ns, &ls, &fs)?;
            let mut deleted = Vec::new();
            for item in items {
                let name = item["metadata"]["name"].as_str().unwrap_or("").to_string();
                let item_ns = item["metadata"]["namespace"].as_str().map(str::to_string);
                match reg.delete(kind, item_ns.as_deref(), &name, &opts).await {
                    Ok(o) => deleted.push(view.typed(o)),
                    Err(ApiError::NotFound { .. }) | Err(ApiError::Forbidden { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            let rv = reg.store.current_rv().to_string();
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": kind.list_kind(), "apiVersion": view.api_version(),
                        "metadata": {"resourceVersion": rv}, "items": deleted}),
            ))
        }
        _ => Err(ApiError::MethodNotAllowed),
    }
}

/// `…/deployments/NAME/scale` (and replicasets): GET, PUT and PATCH of an autoscaling/v1 Scale,
/// which is what `kubectl scale` and autoscalers use.
async fn handle_scale(
    st: &RestState,
    method: &Method,
    headers: &HeaderMap,
    q: &BTreeMap<String, String>,
    t: &Target,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (ns, name) = (t.namespace.as_deref().unwrap_or(""), t.name.as_deref().unwrap_or(""));
    let reg = &st.registry;
    let scale = match *method {
        Method::GET => match reg.custom_scale(t.kind) {
            Some(paths) => crate::crd::scale_of(&reg.get(t.kind, ns, name)?, &paths),
            None => crate::registry::scale_of(&reg.get(t.kind, ns, name)?),
        },
        Method::PUT => {
            let wanted = parse_body(&body, headers)?;
            reg.update_scale(t.kind, ns, name, |_| Ok(wanted), &write_options(q, headers, "UpdateOptions")?).await?
        }
        Method::PATCH => {
            let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
            let ty = PatchType::from_content_type(ct).ok_or(ApiError::UnsupportedMediaType)?;
            let patch = parse_body(&body, headers)?;
            let change = |current: &Value| Ok(api::patch::apply_patch(ty, current, &patch)?);
            reg.update_scale(t.kind, ns, name, change, &write_options(q, headers, "PatchOptions")?).await?
        }
        _ => return Err(ApiError::MethodNotAllowed),
    };
    Ok(json_response(StatusCode::OK, &scale))
}

/// `POST serviceaccounts/NAME/token` (TokenRequest, `kubectl create token`): a signed token of the
/// ServiceAccount, valid `spec.expirationSeconds` (default 3600, at least 600) for
/// `spec.audiences` (default: the issuer), as kube-apiserver answers it.
fn token_request(
    st: &RestState,
    method: &Method,
    headers: &HeaderMap,
    ns: &str,
    name: &str,
    body: Bytes,
) -> Result<Response, ApiError> {
    if *method != Method::POST {
        return Err(ApiError::MethodNotAllowed);
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let req: Value = match (body.is_empty(), ct.starts_with("application/vnd.kubernetes.protobuf")) {
        (true, _) => json!({}),
        (false, true) => api::protobuf::decode_message(&body, "authentication.v1.TokenRequest")?,
        (false, false) => parse_body(&body, headers)?,
    };
    let sa = st
        .registry
        .store
        .get(Kind::ServiceAccount, ns, name)?
        .ok_or_else(|| ApiError::not_found(Kind::ServiceAccount, name))?;
    let Some(tokens) = &st.tokens else {
        return Err(ApiError::BadRequest("this server issues no ServiceAccount tokens".into()));
    };
    let seconds = req.pointer("/spec/expirationSeconds").and_then(Value::as_i64).unwrap_or(3600);
    let path = api::FieldPath::root("spec").child("expirationSeconds");
    if seconds < 600 {
        let cause = api::validation::invalid(&path, &seconds, "may not specify a duration less than 10 minutes");
        return Err(ApiError::InvalidRequest {
            group: "authentication.k8s.io",
            kind: "TokenRequest",
            name: name.into(),
            causes: vec![cause],
        });
    }
    if seconds > 1 << 32 {
        let cause = api::validation::invalid(&path, &seconds, "may not specify a duration larger than 2^32 seconds");
        return Err(ApiError::InvalidRequest {
            group: "authentication.k8s.io",
            kind: "TokenRequest",
            name: name.into(),
            causes: vec![cause],
        });
    }
    let audiences: Vec<String> = req
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
        .filter(|a: &Vec<String>| !a.is_empty())
        .unwrap_or_else(|| vec![crate::auth::ISSUER.to_string()]);
    let uid = sa.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    let now = jiff::Timestamp::now();
    let token = tokens.issue(ns, name, uid, &audiences, now.as_second(), seconds);
    let expires = jiff::Timestamp::from_second(now.as_second() + seconds).unwrap_or(now);
    let out = json!({
        "kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string()},
        "spec": {"audiences": audiences, "expirationSeconds": seconds, "boundObjectRef": req.pointer("/spec/boundObjectRef").cloned()},
        "status": {"token": token, "expirationTimestamp": expires.to_string()},
    });
    Ok(json_response(StatusCode::CREATED, &out))
}

/// `POST pods/NAME/eviction` with a policy/v1 Eviction (JSON or protobuf): the pod is deleted
/// with the Eviction's DeleteOptions, as the real server does when no PodDisruptionBudget
/// stands in the way (podpath serves none). Answers 201 with a success Status.
async fn handle_eviction(
    st: &RestState,
    method: &Method,
    headers: &HeaderMap,
    q: &BTreeMap<String, String>,
    t: &Target,
    body: Bytes,
) -> Result<Response, ApiError> {
    if *method != Method::POST {
        return Err(ApiError::MethodNotAllowed);
    }
    let (ns, name) = (t.namespace.as_deref().unwrap_or("default"), t.name.as_deref().unwrap_or(""));
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let eviction: Value = if ct.starts_with("application/vnd.kubernetes.protobuf") {
        api::protobuf::decode_message(&body, "policy.v1.Eviction")?
    } else {
        parse_body(&body, headers)?
    };
    if let Some(n) = eviction.pointer("/metadata/name").and_then(Value::as_str).filter(|n| !n.is_empty()) {
        if n != name {
            return Err(ApiError::BadRequest(format!(
                "name in URL does not match name in Eviction object: {name} != {n}"
            )));
        }
    }
    // The Eviction's deleteOptions, in the shape DELETE takes them.
    let options = eviction.get("deleteOptions").cloned().unwrap_or(json!({}));
    let mut opts = delete_options(&Bytes::from(options.to_string()), &HeaderMap::new(), q)?;
    opts.dry_run |= dry_run(q.get("dryRun").map(String::as_str), "CreateOptions")?;
    st.registry.delete(Kind::Pod, Some(ns), name, &opts).await?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}

fn delete_options(body: &Bytes, headers: &HeaderMap, q: &BTreeMap<String, String>) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions::default();
    let mut policy = None;
    if !body.is_empty() {
        // kubectl's typed clients (drain's pod deletions) send DeleteOptions as protobuf.
        let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let v: Value = if ct.starts_with("application/vnd.kubernetes.protobuf") {
            api::protobuf::decode_options(body, "DeleteOptions")?
        } else {
            serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("invalid DeleteOptions: {e}")))?
        };
        opts.grace_period_seconds = v.get("gracePeriodSeconds").and_then(Value::as_i64);
        opts.precondition_uid = v.pointer("/preconditions/uid").and_then(Value::as_str).map(str::to_string);
        opts.precondition_rv = v.pointer("/preconditions/resourceVersion").and_then(Value::as_str).map(str::to_string);
        // The body's `dryRun` is a list; kubectl sends `["All"]`.
        if let Some(list) = v.get("dryRun").and_then(Value::as_array) {
            for d in list {
                opts.dry_run |= dry_run(Some(d.as_str().unwrap_or("")), "DeleteOptions")?;
            }
        }
        policy = v.get("propagationPolicy").and_then(Value::as_str).map(str::to_string);
        if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            if policy.is_some() {
                return Err(ApiError::InvalidOptions {
                    kind: "DeleteOptions",
                    causes: vec![api::validation::invalid(
                        &api::FieldPath::root("propagationPolicy"),
                        policy.as_deref().unwrap_or(""),
                        "orphanDependents and deletionPropagation cannot be both set",
                    )],
                });
            }
            policy = Some("Orphan".into());
        }
    }
    if let Some(d) = q.get("dryRun") {
        opts.dry_run |= dry_run(Some(d), "DeleteOptions")?;
    }
    if let Some(g) = q.get("gracePeriodSeconds") {
        opts.grace_period_seconds =
            Some(g.parse().map_err(|_| ApiError::BadRequest(format!("invalid gracePeriodSeconds: {g}")))?);
    }
    if let Some(p) = q.get("propagationPolicy") {
        policy = Some(p.clone());
    }
    if q.get("orphanDependents").is_some_and(|o| o == "true") {
        policy = Some("Orphan".into());
    }
    match policy.as_deref() {
        None | Some("Background" | "Foreground") => {}
        Some("Orphan") => opts.orphan = true,
        Some(other) => {
            return Err(ApiError::InvalidOptions {
                kind: "DeleteOptions",
                causes: vec![api::validation::not_supported(
                    &api::FieldPath::root("propagationPolicy"),
                    other,
                    &["Foreground", "Background", "Orphan", "nil"],
                )],
            })
        }
    }
    Ok(opts)
}

/// How a request's objects are shown: a built-in kind as stored, a custom one in the version
/// of the URL, with its CRD's printer columns.
#[derive(Clone)]
struct View {
    kind: Kind,
    custom: Option<(api::custom::CustomKind, String, Arc<crate::crd::Model>)>,
}

impl View {
    fn new(reg: &Registry, kind: Kind, version: &str) -> Result<View, ApiError> {
        let custom = match kind {
            Kind::Custom(c) => {
                let model = reg.crds.get(c).ok_or(ApiError::NoRoute)?;
                Some((c, version.to_string(), model))
            }
            _ => None,
        };
        Ok(View { kind, custom })
    }

    fn typed(&self, obj: Value) -> Value {
        match &self.custom {
            Some((c, v, _)) => crate::crd::served_as(*c, v, obj),
            None => with_type_meta(self.kind, obj),
        }
    }

    /// The response to a write: the JSON the store wrote, as it is, when it is what
    /// [`View::typed`] would make of the object (a built-in kind whose type meta is stored as
    /// served), which saves serialising the object a second time; otherwise the typed object.
    /// With the write's `Warning` headers.
    fn written(&self, code: StatusCode, out: crate::registry::Outcome) -> Response {
        let as_stored = self.custom.is_none()
            && out.object.get("kind").and_then(Value::as_str) == Some(self.kind.info().name)
            && out.object.get("apiVersion").and_then(Value::as_str) == Some(self.kind.api_version().as_str());
        let response = match out.json {
            Some(json) if as_stored => {
                let mut bytes = Vec::with_capacity(json.len() + 1);
                bytes.extend_from_slice(&json);
                bytes.push(b'\n');
                crate::response::json_bytes_response(code, bytes)
            }
            _ => json_response(code, &self.typed(out.object)),
        };
        with_warnings(response, &out.warnings)
    }

    fn api_version(&self) -> String {
        match &self.custom {
            Some((c, v, _)) => format!("{}/{v}", c.info().group),
            None => self.kind.api_version(),
        }
    }

    /// Whether objects are served as they are stored (a list can be spliced from the store).
    fn as_stored(&self) -> bool {
        self.custom.as_ref().is_none_or(|(_, v, m)| *v == m.storage)
    }

    fn table(&self, items: &[Value], rv: &str, full: bool, headers: bool) -> Value {
        match &self.custom {
            Some((c, v, m)) => crate::crd::table(*c, m, v, items, rv, full, headers),
            None => to_table(self.kind, items, rv, full, headers),
        }
    }

    /// A body written in the URL's version, made the storage version's (conversion `None`).
    fn to_storage(&self, mut body: Value) -> Result<Value, ApiError> {
        if let Some((c, _, m)) = &self.custom {
            if let Some(av) = body.get("apiVersion").and_then(Value::as_str) {
                if av != self.api_version() {
                    return Err(ApiError::BadRequest(format!(
                        "the API version in the data ({av}) does not match the expected API version ({})",
                        self.api_version()
                    )));
                }
                body["apiVersion"] = json!(format!("{}/{}", c.info().group, m.storage));
            }
        }
        Ok(body)
    }
}

fn with_type_meta(kind: Kind, mut obj: Value) -> Value {
    if let Some(o) = obj.as_object_mut() {
        o.insert("kind".into(), json!(kind.info().name));
        o.insert("apiVersion".into(), json!(kind.api_version()));
    }
    obj
}

/// A Table of `items`, with the row object as PartialObjectMetadata or the full object.
pub fn to_table(kind: Kind, items: &[Value], rv: &str, full_objects: bool, headers: bool) -> Value {
    let now = jiff::Timestamp::now();
    api::with_kind_type!(kind, T => {
        let rows = items
            .iter()
            .map(|item| {
                let cells = match T::from_json(item.clone()) {
                    Ok(o) => o.cells(now),
                    Err(_) => vec![json!(item["metadata"]["name"])],
                };
                let object = if full_objects {
                    with_type_meta(kind, item.clone())
                } else {
                    api::table::partial_object_metadata(&item["metadata"])
                };
                (cells, object)
            })
            .collect();
        api::table::table(&T::columns(), rows, rv, headers)
    }, custom _c => {
        // Custom objects are shown by their CRD's columns (`View::table`); without the CRD
        // only their names are known.
        let rows = items.iter().map(|i| (vec![i["metadata"]["name"].clone()], api::table::partial_object_metadata(&i["metadata"]))).collect();
        api::table::table(&[api::table::NAME_COLUMN], rows, rv, headers)
    })
}

// === watch ===

#[allow(clippy::too_many_arguments)]
async fn watch(
    st: &RestState,
    view: View,
    ns: Option<String>,
    q: &BTreeMap<String, String>,
    labels: LabelSelector,
    fields: FieldSelector,
    table: bool,
) -> Result<Response, ApiError> {
    let requested: Option<u64> = match q.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(s) => Some(s.parse().map_err(|_| ApiError::BadRequest(format!("invalid resource version: {s}")))?),
    };
    let timeout = match q.get("timeoutSeconds") {
        // An int64 as the real server reads it; a deadline beyond a year is a year (a later
        // instant does not fit the clock's range).
        Some(t) => match t.parse::<i64>() {
            Ok(secs) => Duration::from_secs(secs.clamp(0, 365 * 24 * 3600) as u64),
            Err(_) => return Err(ApiError::BadRequest(format!("invalid timeoutSeconds: {t}"))),
        },
        // The real server picks 30–60 minutes when the client gives no timeout.
        None => Duration::from_secs(1800 + fastrand::u64(0..1800)),
    };
    let bookmarks = query_bool(q, "allowWatchBookmarks");
    let kind = view.kind;
    let spec = WatchSpec {
        filter: WatchFilter { kind, ns, labels, fields },
        from: requested,
        timeout,
        bookmark_every: bookmarks.then_some(Duration::from_secs(60)),
    };
    let mut items = crate::watch::start(st.registry.clone(), spec);
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        let mut headers_sent = false;
        while let Some(item) = items.recv().await {
            let line = match item {
                WatchItem::Event(t, obj) => {
                    let object = if table {
                        let rv = obj["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
                        let t = view.table(&[obj], &rv, false, !headers_sent);
                        headers_sent = true;
                        t
                    } else {
                        view.typed(obj)
                    };
                    json!({"type": t.as_str(), "object": object})
                }
                // A REST watch without resourceVersion has no end-of-snapshot marker.
                WatchItem::Synced(_) => continue,
                WatchItem::Bookmark(rv) => json!({"type": "BOOKMARK", "object": {"kind": kind.info().name,
                    "apiVersion": view.api_version(), "metadata": {"resourceVersion": rv.to_string()}}}),
                WatchItem::Expired { requested, current } => {
                    json!({"type": "ERROR", "object": ApiError::Expired { requested, current }.status()})
                }
            };
            let mut bytes = serde_json::to_vec(&line).unwrap_or_default();
            bytes.push(b'\n');
            if tx.send(Bytes::from(bytes)).await.is_err() {
                return;
            }
        }
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    let body = Body::from_stream(futures::StreamExt::map(stream, Ok::<Bytes, std::convert::Infallible>));
    let mut r = Response::new(body);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    Ok(r)
}

// === version, discovery, OpenAPI ===

pub fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": concat!("v1.32.0-podpath.", env!("CARGO_PKG_VERSION")),
        "gitCommit": "podpath", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.0", "compiler": "gc", "platform": format!("linux/{}", arch()),
    })
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The discovery facts of every served kind.
/// Every resource discovery and OpenAPI describe: the kinds, and events.k8s.io/v1 Events (the
/// core Events in another version).
fn served(reg: &Registry) -> Vec<&'static api::KindInfo> {
    // This server's custom resources (the kinds' table is the process's; a test process may
    // run several servers).
    let custom = reg.crds.all().into_iter().flat_map(|(c, _)| c.version_infos().iter().copied());
    builtin_served().chain(custom).collect()
}

/// The built-in kinds, and the resources served through conversions of them.
fn builtin_served() -> impl Iterator<Item = &'static api::KindInfo> {
    Kind::ALL
        .iter()
        .map(|k| k.info())
        .chain(std::iter::once(&crate::events_v1::INFO))
        .chain(std::iter::once(&crate::autoscaling_v1::INFO))
}

/// The non-core group versions served.
fn groups(reg: &Registry) -> Vec<(&'static str, &'static str)> {
    let mut gv: Vec<(&str, &str)> =
        served(reg).into_iter().filter(|k| !k.group.is_empty()).map(|k| (k.group, k.version)).collect();
    gv.sort();
    gv.dedup();
    gv
}

/// The non-core group versions of the built-in kinds.
fn builtin_groups() -> Vec<(&'static str, &'static str)> {
    let mut gv: Vec<(&str, &str)> =
        builtin_served().filter(|k| !k.group.is_empty()).map(|k| (k.group, k.version)).collect();
    gv.sort();
    gv.dedup();
    gv
}

/// Whether `version` is the one a group's clients should use: the stored kinds' version.
/// A group only custom resources serve prefers its highest version (`v1` over `v1beta1`), as
/// the real server orders CRD versions.
fn is_preferred(reg: &Registry, group: &str, version: &str) -> bool {
    if Kind::ALL.iter().any(|k| k.info().group == group) {
        return Kind::ALL.iter().any(|k| k.info().group == group && k.info().version == version);
    }
    let best = served(reg)
        .into_iter()
        .filter(|k| k.group == group)
        .map(|k| k.version)
        .min_by_key(|v| api::custom::version_priority(v));
    best == Some(version)
}

fn api_versions(advertise: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
           "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": advertise}]})
}

/// Resources that are read, not stored: metrics.k8s.io's (group, version, plural, kind, namespaced).
const METRICS: [(&str, &str, &str, &str, bool); 2] = [
    (crate::resource_metrics::GROUP, crate::resource_metrics::VERSION, "nodes", "NodeMetrics", false),
    (crate::resource_metrics::GROUP, crate::resource_metrics::VERSION, "pods", "PodMetrics", true),
];

/// The groups of [`crate::review::REVIEWS`] and [`METRICS`].
fn review_groups() -> Vec<(&'static str, &'static str)> {
    let mut gv: Vec<(&str, &str)> = crate::review::REVIEWS.iter().map(|r| (r.0, r.1)).collect();
    gv.extend(METRICS.iter().map(|m| (m.0, m.1)));
    gv.dedup();
    gv
}

fn api_groups(reg: &Registry) -> Value {
    let mut all = groups(reg);
    all.extend(review_groups());
    all.sort();
    all.dedup();
    let mut by_group: Vec<(&str, Vec<&str>)> = vec![];
    for (g, v) in all {
        match by_group.iter_mut().find(|(name, _)| *name == g) {
            Some((_, vs)) => vs.push(v),
            None => by_group.push((g, vec![v])),
        }
    }
    let groups: Vec<Value> = by_group
        .into_iter()
        .map(|(g, mut vs)| {
            vs.sort_by_key(|v| !is_preferred(reg, g, v));
            let versions: Vec<Value> =
                vs.iter().map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v})).collect();
            json!({"name": g, "preferredVersion": versions[0].clone(), "versions": versions})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_list(reg: &Registry, group: &str, version: &str) -> Value {
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let mut resources = Vec::new();
    for k in served(reg).into_iter().filter(|k| k.group == group && k.version == version) {
        let mut r = json!({"name": k.plural, "singularName": k.singular, "namespaced": k.namespaced, "kind": k.name,
                           "verbs": Kind::verbs()});
        if !k.short_names.is_empty() {
            r["shortNames"] = json!(k.short_names);
        }
        if !k.categories.is_empty() {
            r["categories"] = json!(k.categories);
        }
        resources.push(r);
        if k.has_status {
            resources
                .push(json!({"name": format!("{}/status", k.plural), "singularName": "", "namespaced": k.namespaced,
                                  "kind": k.name, "verbs": ["get", "patch", "update"]}));
        }
        if k.has_scale {
            resources.push(
                json!({"name": format!("{}/scale", k.plural), "singularName": "", "namespaced": k.namespaced,
                                  "group": "autoscaling", "version": "v1", "kind": "Scale",
                                  "verbs": ["get", "patch", "update"]}),
            );
        }
        if k.name == "ServiceAccount" {
            resources.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true,
                                  "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest",
                                  "verbs": ["create"]}));
        }
        // kubectl drain looks for this entry before it evicts instead of deleting.
        if k.name == "Pod" {
            resources.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
                                  "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
            resources.push(json!({"name": "pods/log", "singularName": "", "namespaced": true,
                                  "kind": "Pod", "verbs": ["get"]}));
            resources.push(json!({"name": "pods/ephemeralcontainers", "singularName": "", "namespaced": true,
                                  "kind": "Pod", "verbs": ["get", "patch", "update"]}));
            for sub in ["attach", "exec", "portforward"] {
                let kind = if sub == "portforward" { "PodPortForwardOptions" } else { "PodExecOptions" };
                let kind = if sub == "attach" { "PodAttachOptions" } else { kind };
                resources.push(json!({"name": format!("pods/{sub}"), "singularName": "", "namespaced": true,
                                      "kind": kind, "verbs": ["create", "get"]}));
            }
        }
        if k.name == "Pod" || k.name == "Service" {
            let options = if k.name == "Pod" { "PodProxyOptions" } else { "ServiceProxyOptions" };
            resources.push(json!({"name": format!("{}/proxy", k.plural), "singularName": "", "namespaced": true,
                                  "kind": options,
                                  "verbs": ["create", "delete", "get", "patch", "update"]}));
        }
    }
    for (_, _, plural, kind) in crate::review::REVIEWS.iter().filter(|r| r.0 == group && r.1 == version) {
        resources.push(json!({"name": plural, "singularName": kind.to_lowercase(), "namespaced": false,
                              "kind": kind, "verbs": ["create"]}));
    }
    for (_, _, plural, kind, namespaced) in METRICS.iter().filter(|r| r.0 == group && r.1 == version) {
        resources.push(json!({"name": plural, "singularName": "", "namespaced": namespaced,
                              "kind": kind, "verbs": ["get", "list"]}));
    }
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|a| a.contains("as=APIGroupDiscoveryList"))
}

/// Aggregated discovery (`apidiscovery.k8s.io` v2, or v2beta1 for kubectl 1.27/1.28).
fn aggregated(reg: &Registry, headers: &HeaderMap, core: bool) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let version = accept
        .split(',')
        .find(|part| part.contains("as=APIGroupDiscoveryList"))
        .map(|part| if part.contains("v=v2beta1") { "v2beta1" } else { "v2" })
        .unwrap_or("v2");
    let gvs: Vec<(&str, &str)> = if core {
        vec![("", "v1")]
    } else {
        let mut all = groups(reg);
        all.extend(review_groups());
        all.sort();
        all.dedup();
        all
    };
    let items: Vec<Value> = gvs
        .into_iter()
        .map(|(g, v)| {
            let reviews = crate::review::REVIEWS.iter().filter(|r| r.0 == g && r.1 == v).map(|(_, _, plural, kind)| {
                json!({"resource": plural, "responseKind": {"group": g, "version": v, "kind": kind},
                       "scope": "Cluster", "singularResource": kind.to_lowercase(), "verbs": ["create"]})
            });
            let metrics = METRICS.iter().filter(|r| r.0 == g && r.1 == v).map(|(_, _, plural, kind, namespaced)| {
                json!({"resource": plural, "responseKind": {"group": g, "version": v, "kind": kind},
                       "scope": if *namespaced { "Namespaced" } else { "Cluster" }, "singularResource": "",
                       "verbs": ["get", "list"]})
            });
            let reviews = reviews.chain(metrics);
            let resources: Vec<Value> = served(reg)
                .into_iter()
                .filter(|k| k.group == g && k.version == v)
                .map(|k| {
                    let rk = json!({"group": g, "version": v, "kind": k.name});
                    let mut r = json!({"resource": k.plural, "responseKind": rk,
                        "scope": if k.namespaced { "Namespaced" } else { "Cluster" },
                        "singularResource": k.singular, "verbs": Kind::verbs()});
                    if !k.short_names.is_empty() {
                        r["shortNames"] = json!(k.short_names);
                    }
                    if !k.categories.is_empty() {
                        r["categories"] = json!(k.categories);
                    }
                    let mut subresources = vec![];
                    if k.has_status {
                        subresources.push(json!({"subresource": "status", "responseKind": rk,
                                                 "verbs": ["get", "patch", "update"]}));
                    }
                    if k.has_scale {
                        subresources.push(json!({"subresource": "scale",
                            "responseKind": {"group": "autoscaling", "version": "v1", "kind": "Scale"},
                            "verbs": ["get", "patch", "update"]}));
                    }
                    if k.name == "ServiceAccount" {
                        subresources.push(json!({"subresource": "token",
                            "responseKind": {"group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest"},
                            "verbs": ["create"]}));
                    }
                    if k.name == "Pod" {
                        subresources.push(json!({"subresource": "eviction",
                            "responseKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
                            "verbs": ["create"]}));
                        subresources.push(json!({"subresource": "log",
                            "responseKind": {"group": "", "version": "v1", "kind": "Pod"}, "verbs": ["get"]}));
                        subresources.push(json!({"subresource": "ephemeralcontainers",
                            "responseKind": {"group": "", "version": "v1", "kind": "Pod"},
                            "verbs": ["get", "patch", "update"]}));
                        for (sub, kind) in [
                            ("attach", "PodAttachOptions"),
                            ("exec", "PodExecOptions"),
                            ("portforward", "PodPortForwardOptions"),
                        ] {
                            subresources.push(json!({"subresource": sub,
                                "responseKind": {"group": "", "version": "v1", "kind": kind},
                                "verbs": ["create", "get"]}));
                        }
                    }
                    if !subresources.is_empty() {
                        r["subresources"] = json!(subresources);
                    }
                    r
                })
                .chain(reviews)
                .collect();
            let mut meta = json!({"creationTimestamp": null});
            if !g.is_empty() {
                meta["name"] = json!(g);
            }
            json!({"metadata": meta, "versions": [{"version": v, "resources": resources, "freshness": "Current"}]})
        })
        .collect();
    // One item per group, its preferred version first (a group served in two versions).
    let mut merged: Vec<Value> = vec![];
    for item in items {
        let name = item["metadata"]["name"].clone();
        match merged.iter_mut().find(|m| m["metadata"]["name"] == name) {
            Some(m) => {
                if let (Some(vs), Some(more)) = (m["versions"].as_array_mut(), item["versions"].as_array()) {
                    vs.extend(more.iter().cloned());
                    vs.sort_by_key(|v| {
                        !is_preferred(reg, name.as_str().unwrap_or(""), v["version"].as_str().unwrap_or(""))
                    });
                }
            }
            None => merged.push(item),
        }
    }
    let body = json!({"kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{version}"),
                      "metadata": {}, "items": merged});
    let mut r = json_response(StatusCode::OK, &body);
    let ct = format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList");
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_str(&ct).expect("valid header"));
    r
}

/// Changes whenever the served kinds or a CRD's schema change, so kubectl's OpenAPI cache is
/// refreshed.
fn openapi_hash(reg: &Registry) -> String {
    let mut h: u64 = 1469598103934665603;
    for b in reg.crds.revision().to_le_bytes() {
        h = (h ^ b as u64).wrapping_mul(1099511628211);
    }
    for k in served(reg) {
        for b in format!("{}/{}/{}/{}", k.group, k.version, k.plural, env!("CARGO_PKG_VERSION")).bytes() {
            h = (h ^ b as u64).wrapping_mul(1099511628211);
        }
    }
    format!("{h:016X}")
}

fn openapi_index(reg: &Registry) -> Value {
    let hash = openapi_hash(reg);
    let mut paths = serde_json::Map::new();
    paths.insert("api/v1".into(), json!({"serverRelativeURL": format!("/openapi/v3/api/v1?hash={hash}")}));
    for (g, v) in groups(reg) {
        paths.insert(
            format!("apis/{g}/{v}"),
            json!({"serverRelativeURL": format!("/openapi/v3/apis/{g}/{v}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

/// The OpenAPI v3 document of a group/version: the kinds' real schemas (`kubectl explain`) and
/// one PATCH operation per kind with the `fieldValidation` parameter, which is what tells
/// kubectl to leave validation to the server. Built once per group/version.
fn openapi_doc(reg: &Registry, group: &str, version: &str) -> Value {
    type Docs = BTreeMap<String, (u64, Arc<Value>)>;
    static DOCS: std::sync::OnceLock<std::sync::Mutex<Docs>> = std::sync::OnceLock::new();
    let cache = DOCS.get_or_init(Default::default);
    let key = format!("{group}/{version}");
    // Built-in documents never change; those with custom kinds follow the CRDs' revision.
    let revision = reg.crds.revision();
    if let Some((rev, doc)) = cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
        if rev == revision || !served(reg).iter().any(|k| k.group == group && k.version == version && k.custom) {
            return (*doc).clone();
        }
    }
    let doc = build_openapi_doc(reg, group, version);
    if let Ok(mut c) = cache.lock() {
        c.insert(key, (revision, Arc::new(doc.clone())));
    }
    doc
}

/// The path of one object of a kind (`/api/v1/namespaces/{namespace}/services/{name}`).
fn object_path(k: &api::KindInfo) -> String {
    let prefix =
        if k.group.is_empty() { format!("/api/{}", k.version) } else { format!("/apis/{}/{}", k.group, k.version) };
    if k.namespaced {
        format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", k.plural)
    } else {
        format!("{prefix}/{}/{{name}}", k.plural)
    }
}

/// The OpenAPI v2 (Swagger 2.0) document, in JSON: every served kind's definition and its PATCH
/// operation. Built once.
fn openapi_v2() -> Value {
    static DOC: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    DOC.get_or_init(|| {
        // Built-in kinds only: kubectl reads custom kinds from OpenAPI v3 (a custom kind here
        // would make its apply choose a strategic merge patch, which custom kinds refuse).
        let mut gvs = vec![("", "v1")];
        gvs.extend(builtin_groups());
        let mut paths = serde_json::Map::new();
        for k in builtin_served() {
            let op = json!({
                "x-kubernetes-group-version-kind": {"group": k.group, "version": k.version, "kind": k.name},
                "consumes": ["application/json-patch+json", "application/merge-patch+json",
                             "application/strategic-merge-patch+json", "application/apply-patch+yaml"],
                "produces": ["application/json", "application/yaml"],
                "parameters": [{"name": "fieldValidation", "in": "query", "type": "string", "uniqueItems": true},
                               {"name": "fieldManager", "in": "query", "type": "string", "uniqueItems": true},
                               {"name": "body", "in": "body", "required": true, "schema": {"type": "object"}}],
                "responses": {"200": {"description": "OK"}}
            });
            paths.insert(object_path(k), json!({"patch": op}));
        }
        json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.32.0"},
               "paths": paths, "definitions": api::openapi::definitions_v2(&gvs)})
    })
    .clone()
}

/// Whether the client asks for the OpenAPI v2 document in gnostic's protobuf (kubectl does, to
/// validate a `kind: List`); JSON otherwise.
fn wants_protobuf_openapi(headers: &HeaderMap) -> bool {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    accept
        .split(',')
        .map(|t| t.split(';').next().unwrap_or("").trim())
        .any(|t| t == api::openapi_pb::MEDIA_TYPE || t == api::openapi_pb::MEDIA_TYPE_ASKED)
}

/// A client that accepts neither JSON nor the protobuf form gets 406, not bytes it cannot read.
fn accepts_json(headers: &HeaderMap, what: &str) -> Result<(), ApiError> {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("*/*");
    let ok = accept
        .split(',')
        .map(|t| t.split(';').next().unwrap_or("").trim())
        .any(|t| matches!(t, "" | "*/*" | "application/*" | "application/json"));
    if ok {
        Ok(())
    } else {
        Err(ApiError::NotAcceptable(format!(
            "{what} is served as application/json and {}; requested: {accept}",
            api::openapi_pb::MEDIA_TYPE
        )))
    }
}

fn build_openapi_doc(reg: &Registry, group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    for k in served(reg).into_iter().filter(|k| k.group == group && k.version == version) {
        let path = object_path(k);
        let mut content = json!({
            "application/apply-patch+yaml": {"schema": {}},
            "application/json-patch+json": {"schema": {}},
            "application/merge-patch+json": {"schema": {}}});
        // Custom kinds take no strategic merge patch (kubectl apply reads this to choose).
        if !k.custom {
            content["application/strategic-merge-patch+json"] = json!({"schema": {}});
        }
        let op = json!({
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": k.name},
            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                           {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}],
            "requestBody": {"content": content},
            "responses": {"200": {"description": "OK"}}
        });
        paths.insert(path, json!({"patch": op}));
    }
    let mut schemas = api::openapi::schemas(group, version);
    let models: Vec<(String, Arc<crate::crd::Model>)> = reg
        .crds
        .all()
        .into_iter()
        .filter(|(c, _)| c.info().group == group)
        .map(|(c, m)| (c.info().name.to_string(), m))
        .collect();
    let kinds: Vec<(
        &str,
        Option<&api::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps>,
    )> = models
        .iter()
        .filter_map(|(kind, m)| m.version(Some(version)).map(|v| (kind.as_str(), v.schema.as_ref())))
        .collect();
    if !kinds.is_empty() {
        schemas.extend(api::openapi::custom_schemas(group, version, &kinds));
    }
    json!({"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.32.0"},
           "paths": paths, "components": {"schemas": schemas}})
}
