//! Events, as the real components write them, so `kubectl describe` and `kubectl get events`
//! tell what happened: one core/v1 Event per (component, object, type, reason, message),
//! aggregated the way client-go's recorder does it (a repeat bumps `count` and
//! `lastTimestamp` of the same Event), and a retention pass (`--event-ttl`, a count limit) so
//! they never grow without bound. [`event_for`] is pure; [`record`] and `expire` write.

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
    pub component: &'a str,
    /// The node the component runs on (kubelet's events), if any.
    pub host: Option<&'a str>,
    /// The object it is about (a stored object: kind, apiVersion and metadata are read from it).
    pub object: &'a Value,
    pub kind: Kind,
    /// The part of the object, e.g. `spec.containers{web}`.
    pub field_path: Option<&'a str>,
    pub type_: EventType,
    pub reason: &'a str,
    pub message: String,
}

/// What makes two reports the same Event (client-go's aggregation key: source, object, type,
/// reason, message).
fn event_key(r: &Report<'_>) -> String {
    let (ns, name) = ns_name(r.object);
    let uid = r.object["metadata"]["uid"].as_str().unwrap_or("");
    format!(
        "{}\0{}\0{}\0{ns}\0{name}\0{uid}\0{}\0{}\0{}\0{}",
        r.component,
        r.host.unwrap_or(""),
        r.kind.info().name,
        r.field_path.unwrap_or(""),
        r.type_.as_str(),
        r.reason,
        r.message
    )
}

/// A new Event's name, as client-go makes it: the object's name and the time in nanoseconds
/// (hex), so a namespace's Events list in the order they first happened.
fn event_name(object_name: &str, nanos: i128) -> String {
    // Names are at most 253 characters; the object's name is at most 253 too.
    let prefix: String = object_name.chars().take(253 - 17).collect();
    format!("{prefix}.{nanos:x}")
}

/// The Events of recent reports by aggregation key, so a repeat finds its Event: in memory and
/// bounded (client-go's correlator keeps 4096 the same way), the oldest forgotten first. After
/// a restart a repeat starts a new Event, as it does with a restarted component.
#[derive(Default)]
pub struct Correlator(
    std::sync::Mutex<(std::collections::HashMap<String, String>, std::collections::VecDeque<String>)>,
);

/// How many aggregation keys the correlator keeps.
const CORRELATOR_KEYS: usize = 4096;

impl Correlator {
    fn get(&self, key: &str) -> Option<String> {
        self.0.lock().expect("correlator lock").0.get(key).cloned()
    }

    fn put(&self, key: String, name: String) {
        let mut g = self.0.lock().expect("correlator lock");
        if g.0.insert(key.clone(), name).is_none() {
            g.1.push_back(key);
            while g.1.len() > CORRELATOR_KEYS {
                if let Some(old) = g.1.pop_front() {
                    g.0.remove(&old);
                }
            }
        }
    }
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

/// A new Event called `event_name` for a report, first seen `now`. Pure.
pub fn event_for(r: &Report<'_>, event_name: &str, now: &Value) -> Value {
    let (ns, name) = ns_name(r.object);
    let mut involved = json!({
        "kind": r.kind.info().name, "apiVersion": r.kind.api_version(), "name": name,
        "uid": r.object["metadata"]["uid"], "resourceVersion": r.object["metadata"]["resourceVersion"],
    });
    if !ns.is_empty() {
        involved["namespace"] = json!(ns);
    }
    if let Some(f) = r.field_path {
        involved["fieldPath"] = json!(f);
    }
    let mut source = json!({"component": r.component});
    if let Some(h) = r.host {
        source["host"] = json!(h);
    }
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name, "namespace": event_namespace(r)},
        "involvedObject": involved,
        "reason": r.reason, "message": r.message, "type": r.type_.as_str(),
        "source": source,
        "reportingComponent": r.component, "reportingInstance": r.host.unwrap_or("apiserver-lite"),
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

/// [`record`], for callers that report failures (the gRPC `Events.Record`): the Event's name and
/// count.
pub async fn try_record(reg: &Registry, r: &Report<'_>) -> Result<(String, i64), ApiError> {
    let ns = event_namespace(r);
    let key = event_key(r);
    let now = new_time();
    let g = reg.store.lock().await;
    let known = match reg.events.get(&key) {
        Some(name) => reg.store.get(Kind::Event, &ns, &name)?.map(|e| (name, e)),
        None => None,
    };
    let (name, pending) = match known {
        None => {
            let (_, object_name) = ns_name(r.object);
            let mut nanos = jiff::Timestamp::now().as_nanosecond();
            // Two reports in the same nanosecond about one object: the next name.
            while reg.store.get(Kind::Event, &ns, &event_name(&object_name, nanos))?.is_some() {
                nanos += 1;
            }
            let name = event_name(&object_name, nanos);
            let event = event_for(r, &name, &now);
            let pending = reg.create_locked(&g, Kind::Event, Some(&ns), event, &WriteOptions::default())?;
            reg.events.put(key, name.clone());
            (name, pending)
        }
        Some((name, old)) => {
            let mut new = old.clone();
            new["count"] = json!(old["count"].as_i64().unwrap_or(1).saturating_add(1));
            new["lastTimestamp"] = now;
            new["involvedObject"]["resourceVersion"] = r.object["metadata"]["resourceVersion"].clone();
            (name, reg.update_locked(&g, Kind::Event, old, new, Subresource::Main, &WriteOptions::default())?)
        }
    };
    drop(g);
    let stored = reg.sync(pending).await?;
    Ok((name, stored["count"].as_i64().unwrap_or(1)))
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
            host: None,
            object: &p,
            kind: Kind::Pod,
            field_path: None,
            type_: EventType::Normal,
            reason: "Scheduled",
            message: "Successfully assigned default/web to node-1".into(),
        };
        let e = event_for(&r, "web.1880a5b6c7d8e9f0", &json!("2026-11-24T00:00:00Z"));
        assert_eq!(
            e["involvedObject"],
            json!({"kind": "Pod", "apiVersion": "v1", "name": "web", "namespace": "default", "uid": "u-1", "resourceVersion": "7"})
        );
        assert_eq!((e["type"].as_str(), e["count"].as_i64()), (Some("Normal"), Some(1)));
        assert_eq!(e["metadata"], json!({"name": "web.1880a5b6c7d8e9f0", "namespace": "default"}));
        assert_eq!(e["source"]["component"], "default-scheduler");
        assert_eq!(event_name("web", 0x1880a5b6c7d8e9f0), "web.1880a5b6c7d8e9f0");
        assert_eq!(event_name(&"a".repeat(253), 1).len(), 253 - 17 + 2, "fits in a name");
        let other = Report { message: "Successfully assigned default/web to node-2".into(), ..r.clone() };
        assert_ne!(event_key(&other), event_key(&r), "another message is another event");
        let elsewhere = Report { host: Some("node-2"), ..r.clone() };
        assert_ne!(event_key(&elsewhere), event_key(&r), "another reporter is another event");
        let node = json!({"metadata": {"name": "node-1", "uid": "n"}});
        let on_node = Report { object: &node, kind: Kind::Node, ..r };
        assert_eq!(event_namespace(&on_node), "default");
        assert!(event_for(&on_node, "n", &json!("t"))["involvedObject"].get("namespace").is_none());
    }

    #[test]
    fn the_correlator_forgets_the_oldest_keys_first() {
        let c = Correlator::default();
        for i in 0..CORRELATOR_KEYS + 2 {
            c.put(format!("k{i}"), format!("e{i}"));
        }
        assert_eq!((c.get("k0"), c.get("k1")), (None, None));
        assert_eq!(c.get("k2").as_deref(), Some("e2"));
        assert_eq!(c.0.lock().unwrap().0.len(), CORRELATOR_KEYS);
    }
}
