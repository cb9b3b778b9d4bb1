//! The API objects `podpath ui` draws, kept current by the REST API's list + watch (the lab's
//! API server is reached from the host on its REST port; its gRPC port is inside the lab).
//! One task per resource: list, then watch from the list's resourceVersion; an error, a closed
//! stream or `410 Gone` starts it over after a pause. Resources the API does not serve (the
//! Gateway API before its CRDs are applied) are tried again every few seconds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use podpath_client::http::{self, Conn};
use serde_json::Value;
use tokio::sync::watch;

use crate::state::ApiAccess;

/// The resources drawn, by their REST list path.
pub const RESOURCES: &[(&str, &str)] = &[
    ("nodes", "/api/v1/nodes"),
    ("pods", "/api/v1/pods"),
    ("services", "/api/v1/services"),
    ("endpointslices", "/apis/discovery.k8s.io/v1/endpointslices"),
    ("ingresses", "/apis/networking.k8s.io/v1/ingresses"),
    ("networkpolicies", "/apis/networking.k8s.io/v1/networkpolicies"),
    ("gateways", "/apis/gateway.networking.k8s.io/v1/gateways"),
    ("httproutes", "/apis/gateway.networking.k8s.io/v1/httproutes"),
];

/// The watched objects and the watches' health, shared with the server.
#[derive(Default)]
pub struct Shared {
    pub objects: Mutex<super::picture::Objects>,
    /// Resource → why its watch is down (absent while it runs).
    pub errors: Mutex<BTreeMap<String, String>>,
}

impl Shared {
    /// The first error of a core resource (those every lab serves), for the page's banner.
    pub fn api_error(&self) -> Option<String> {
        let errors = self.errors.lock().ok()?;
        RESOURCES.iter().take(4).find_map(|(r, _)| errors.get(*r).map(|e| format!("{r}: {e}")))
    }
}

/// What the picture never reads, dropped as objects arrive (a Pod's `managedFields` are often
/// most of it).
fn slim(mut o: Value) -> Value {
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("managedFields");
        m.remove("annotations");
    }
    o
}

fn key(o: &Value) -> String {
    let m = &o["metadata"];
    match m["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{}", m["name"].as_str().unwrap_or_default()),
        _ => m["name"].as_str().unwrap_or_default().to_string(),
    }
}

/// Watches one resource for as long as the task runs; `changed` is bumped on every change.
pub async fn run(
    api: Arc<ApiAccess>,
    resource: &'static str,
    path: &'static str,
    shared: Arc<Shared>,
    changed: watch::Sender<u64>,
) {
    loop {
        let pause = match once(&api, resource, path, &shared, &changed).await {
            Ok(()) => Duration::from_millis(200),
            Err((e, pause)) => {
                let mut errors = shared.errors.lock().expect("not poisoned");
                if errors.get(resource) != Some(&e) {
                    errors.insert(resource.to_string(), e);
                    drop(errors);
                    changed.send_modify(|v| *v += 1);
                }
                pause
            }
        };
        tokio::time::sleep(pause).await;
    }
}

/// One list + watch, until the stream ends (`Ok`) or fails (the error and the pause before the
/// next try).
async fn once(
    api: &ApiAccess,
    resource: &str,
    path: &str,
    shared: &Shared,
    changed: &watch::Sender<u64>,
) -> Result<(), (String, Duration)> {
    let fail = |e: String| (e, Duration::from_secs(1));
    let (tls, auth) = api.parts();
    let mut headers = vec![("Accept", "application/json")];
    if let Some(a) = auth {
        headers.push(("Authorization", a));
    }
    let mut conn = Conn::connect_via(api.addr, tls).await.map_err(|e| fail(e.to_string()))?;
    let list = conn
        .send(&http::Request { method: "GET", path, headers: &headers, body: b"" })
        .await
        .map_err(|e| fail(e.to_string()))?;
    if list.status == 404 {
        // Not served (yet): nothing to show; look again later.
        let mut objects = shared.objects.lock().expect("not poisoned");
        if objects.remove(resource).is_some() {
            changed.send_modify(|v| *v += 1);
        }
        return Err(("not served".into(), Duration::from_secs(3)));
    }
    if list.status != 200 {
        return Err(fail(format!("listing answered HTTP {}: {}", list.status, list.text().trim())));
    }
    let doc: Value = serde_json::from_slice(&list.body).map_err(|e| fail(format!("list is not JSON: {e}")))?;
    let rv = doc["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string();
    {
        let items: BTreeMap<String, Value> =
            doc["items"].as_array().into_iter().flatten().map(|o| (key(o), slim(o.clone()))).collect();
        shared.objects.lock().expect("not poisoned").insert(resource.to_string(), items);
        shared.errors.lock().expect("not poisoned").remove(resource);
        changed.send_modify(|v| *v += 1);
    }
    let watch_path = format!("{path}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=300");
    let resp = conn
        .stream(&http::Request { method: "GET", path: &watch_path, headers: &headers, body: b"" })
        .await
        .map_err(|e| fail(e.to_string()))?;
    if resp.status() != 200 {
        return Err(fail(format!("watching answered HTTP {}", resp.status())));
    }
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = vec![];
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail(format!("watch stream: {e}")))?;
        let Some(data) = frame.data_ref() else { continue };
        buf.extend_from_slice(data);
        // Bounded: one event is one object; a line beyond 64 MiB is not an event of this API.
        if buf.len() > 64 << 20 {
            return Err(fail("a watch event over 64 MiB".into()));
        }
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            if line.iter().all(|b| b.is_ascii_whitespace()) {
                continue;
            }
            let ev: Value = serde_json::from_slice(&line).map_err(|e| fail(format!("watch event is not JSON: {e}")))?;
            let object = &ev["object"];
            let mut objects = shared.objects.lock().expect("not poisoned");
            let items = objects.entry(resource.to_string()).or_default();
            match ev["type"].as_str() {
                Some("ADDED" | "MODIFIED") => {
                    items.insert(key(object), slim(object.clone()));
                }
                Some("DELETED") => {
                    items.remove(&key(object));
                }
                Some("BOOKMARK") => continue,
                // ERROR (410 Gone: the version is too old): list again at once.
                _ => {
                    return Err((
                        format!("watch ended: {}", object["message"].as_str().unwrap_or("error")),
                        Duration::ZERO,
                    ))
                }
            }
            drop(objects);
            changed.send_modify(|v| *v += 1);
        }
    }
    Ok(())
}
