//! Events, as the real components write them, so `kubectl describe` and `kubectl get events`
//! tell what happened: one core/v1 Event per (component, object, type, reason, message),
//! aggregated the way client-go's recorder does it (a repeat bumps `count` and
//! `lastTimestamp` of the same Event), and a retention pass (`--event-ttl`, a count limit) so
//! they never grow without bound. [`event_for`] is pure; [`record`] and [`expire`] write.

use api::Kind;
use serde_json::{json, Value};

use super::write::{new_time, ns_name};
use crate::error::ApiError;
use crate::registry::{DeleteOptions, Registry, Subresource, WriteOptions};

/// `Normal` or `Warning`, the two event types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// One thing a component reports about an object.
#[derive(Clone, Debug)]
pub struct Report<'a> {
    /// The component, as the real one names itself (`default-scheduler`, `deployment-controller` …).
    pub component: &'static str,
    /// The object it is about (a stored object: kind, apiVersion and metadata are read from it).
    pub object: &'a Value,
    pub kind: Kind,
    pub type_: EventType,
    pub reason: &'static str,
    pub message: String,
}

/// The Event's name: the object's name and a hash of what makes events the same, so a repeat
/// finds the Event it aggregates into.
fn event_name(r: &Report<'_>) -> String {
    let (ns, name) = ns_name(r.object);
    let uid = r.object["metadata"]["uid"].as_str().unwrap_or("");
    let key = format!(
        "{}\0{}\0{ns}\0{name}\0{uid}\0{}\0{}\0{}",
        r.component,
        r.kind.info().name,
        r.type_.as_str(),
        r.reason,
        r.message
    );
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    // Names are at most 253 characters; the object's name is at most 253 too.
    let prefix: String = name.chars().take(253 - 17).collect();
    format!("{prefix}.{h:016x}")
}

/// The namespace an object's events live in (cluster-scoped objects: `default`, as kubelet and
/// the node controller put node events).
fn event_namespace(r: &Report<'_>) -> String {
    let (ns, _) = ns_name(r.object);
    if ns.is_empty() {
        "default".into()
    } else {
        ns
    }
}

/// A new Event for a report, first seen `now`. Pure.
pub fn event_for(r: &Report<'_>, now: &Value) -> Value {
    let (ns, name) = ns_name(r.object);
    let mut involved = json!({
        "kind": r.kind.info().name, "apiVersion": r.kind.api_version(), "name": name,
        "uid": r.object["metadata"]["uid"], "resourceVersion": r.object["metadata"]["resourceVersion"],
    });
    if !ns.is_empty() {
        involved["namespace"] = json!(ns);
    }
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(r), "namespace": event_namespace(r)},
        "involvedObject": involved,
        "reason": r.reason, "message": r.message, "type": r.type_.as_str(),
        "source": {"component": r.component},
        "reportingComponent": r.component, "reportingInstance": "apiserver-lite",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    })
}

/// Writes a report: a new Event, or one more of the same (count + 1, a new lastTimestamp).
/// Event writes never fail the controller that reports (they are logged).
pub async fn record(reg: &Registry, r: Report<'_>) {
    if let Err(e) = try_record(reg, &r).await {
        tracing::warn!(error = %e, reason = r.reason, "cannot record an event");
    }
}

async fn try_record(reg: &Registry, r: &Report<'_>) -> Result<(), ApiError> {
    let ns = event_namespace(r);
    let name = event_name(r);
    let now = new_time();
    let g = reg.store.lock().await;
    let pending = match reg.store.get(Kind::Event, &ns, &name)? {
        None => reg.create_locked(&g, Kind::Event, Some(&ns), event_for(r, &now), &WriteOptions::default())?,
        Some(old) => {
            let mut new = old.clone();
            new["count"] = json!(old["count"].as_i64().unwrap_or(1).saturating_add(1));
            new["lastTimestamp"] = now;
            new["involvedObject"]["resourceVersion"] = r.object["metadata"]["resourceVersion"].clone();
            reg.update_locked(&g, Kind::Event, old, new, Subresource::Main, &WriteOptions::default())?
        }
    };
    drop(g);
    reg.sync(pending).await?;
    Ok(())
}

/// Retention: Events whose last occurrence is older than `ttl` go (the API server's
/// `--event-ttl`, one hour by default), and beyond `max` Events the oldest go.
pub(crate) async fn expire(reg: &Registry, ttl: std::time::Duration, max: usize) -> Result<(), ApiError> {
    let (events, _) = reg.store.list(Kind::Event, None)?;
    let last = |e: &Value| {
        e["lastTimestamp"]
            .as_str()
            .or_else(|| e["metadata"]["creationTimestamp"].as_str())
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
    };
    let now = jiff::Timestamp::now();
    let mut by_age: Vec<(jiff::Timestamp, String, String)> =
        events.iter().map(|e| (last(e), ns_name(e).0, ns_name(e).1)).collect();
    by_age.sort();
    let surplus = by_age.len().saturating_sub(max);
    for (i, (t, ns, name)) in by_age.iter().enumerate() {
        let expired = now.duration_since(*t).as_secs_f64() > ttl.as_secs_f64();
        if i >= surplus && !expired {
            break; // sorted: every later one is younger
        }
        match reg.delete(Kind::Event, Some(ns), name, &DeleteOptions::default()).await {
            Ok(_) | Err(ApiError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({"metadata": {"name": "web", "namespace": "default", "uid": "u-1", "resourceVersion": "7"}})
    }

    #[test]
    fn an_event_names_its_object_and_repeats_share_a_name() {
        let p = pod();
        let r = Report {
            component: "default-scheduler",
            object: &p,
            kind: Kind::Pod,
            type_: EventType::Normal,
            reason: "Scheduled",
            message: "Successfully assigned default/web to node-1".into(),
        };
        let e = event_for(&r, &json!("2026-11-24T00:00:00Z"));
        assert_eq!(
            e["involvedObject"],
            json!({"kind": "Pod", "apiVersion": "v1", "name": "web", "namespace": "default", "uid": "u-1", "resourceVersion": "7"})
        );
        assert_eq!((e["type"].as_str(), e["count"].as_i64()), (Some("Normal"), Some(1)));
        assert_eq!(e["source"]["component"], "default-scheduler");
        let name = e["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("web.") && name.len() == 4 + 16, "{name}");
        assert_eq!(event_name(&r), name, "a repeat finds it");
        let other = Report { message: "Successfully assigned default/web to node-2".into(), ..r.clone() };
        assert_ne!(event_name(&other), name, "another message is another event");
        let node = json!({"metadata": {"name": "node-1", "uid": "n"}});
        let on_node = Report { object: &node, kind: Kind::Node, ..r };
        assert_eq!(event_namespace(&on_node), "default");
        assert!(event_for(&on_node, &json!("t"))["involvedObject"].get("namespace").is_none());
    }
}
