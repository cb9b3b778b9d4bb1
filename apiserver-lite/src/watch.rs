//! The watch loop shared by REST and gRPC: an optional snapshot, then every durable event after
//! a resourceVersion that passes the watcher's filter, bookmarks, and expiry when the event
//! log no longer reaches back far enough.

use std::sync::Arc;
use std::time::Duration;

use api::selector::{FieldSelector, LabelSelector};
use api::Kind;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::registry::{labels_of, Registry};
use crate::store::{EventType, StoredEvent};

/// One thing a watcher receives.
#[derive(Debug)]
pub enum WatchItem {
    /// An added, modified or deleted object (as this watcher's selectors see it).
    Event(EventType, Value),
    /// The snapshot sent for a watch without a resourceVersion is complete.
    Synced(u64),
    /// No change up to this version.
    Bookmark(u64),
    /// The requested version is older than the event log: relist (HTTP 410).
    Expired { requested: u64, current: u64 },
}

/// Which events a watch delivers, and as what.
pub struct WatchFilter {
    pub kind: Kind,
    pub ns: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl WatchFilter {
    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.ns {
            if obj["metadata"]["namespace"].as_str() != Some(ns.as_str()) {
                return false;
            }
        }
        self.labels.matches(labels_of(obj).as_ref()) && self.fields.matches(obj)
    }

    /// The event type and object to send for `ev`, if any. An object that starts or stops
    /// matching the selectors is ADDED or DELETED for this watcher, as the real server does.
    pub fn apply(&self, ev: &StoredEvent) -> Option<(EventType, Value)> {
        if ev.kind != self.kind {
            return None;
        }
        let object = ev.object();
        let now = self.matches(&object);
        match ev.type_ {
            EventType::Added | EventType::Deleted => now.then_some((ev.type_, object)),
            EventType::Modified => {
                let before = ev.prev().map(|p| self.matches(&p));
                match (before, now) {
                    (Some(false), true) => Some((EventType::Added, object)),
                    (Some(true), false) => Some((EventType::Deleted, object)),
                    (_, true) => Some((EventType::Modified, object)),
                    _ => None,
                }
            }
        }
    }
}

/// How a watch runs.
pub struct WatchSpec {
    pub filter: WatchFilter,
    /// None: send a snapshot (ADDED for every object) first, then `Synced`.
    pub from: Option<u64>,
    pub timeout: Duration,
    /// Send a bookmark this often when nothing else is sent.
    pub bookmark_every: Option<Duration>,
}

/// Starts a watch; it ends when the receiver is dropped or the timeout passes.
pub fn start(registry: Arc<Registry>, spec: WatchSpec) -> mpsc::Receiver<WatchItem> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let store = registry.store.clone();
        let filter = &spec.filter;
        let mut durable = store.subscribe();
        let deadline = tokio::time::Instant::now() + spec.timeout;
        let mut cursor = match spec.from {
            Some(rv) => rv,
            None => {
                let Ok((items, rv)) = registry.list(filter.kind, filter.ns.as_deref(), &filter.labels, &filter.fields)
                else {
                    return;
                };
                for item in items {
                    if tx.send(WatchItem::Event(EventType::Added, item)).await.is_err() {
                        return;
                    }
                }
                if tx.send(WatchItem::Synced(rv)).await.is_err() {
                    return;
                }
                rv
            }
        };
        let mut bookmark = tokio::time::interval(spec.bookmark_every.unwrap_or(Duration::from_secs(3600)));
        bookmark.tick().await;
        loop {
            let upto = *durable.borrow_and_update();
            if upto > cursor {
                match store.events_since(cursor, upto) {
                    Ok(events) => {
                        for ev in events {
                            if let Some((t, obj)) = filter.apply(&ev) {
                                if tx.send(WatchItem::Event(t, obj)).await.is_err() {
                                    return;
                                }
                            }
                        }
                        cursor = upto;
                    }
                    Err(_) => {
                        let _ = tx.send(WatchItem::Expired { requested: cursor, current: upto }).await;
                        return;
                    }
                }
            }
            tokio::select! {
                changed = durable.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep_until(deadline) => return,
                _ = bookmark.tick(), if spec.bookmark_every.is_some() => {
                    if tx.send(WatchItem::Bookmark(cursor)).await.is_err() { return; }
                }
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(type_: EventType, labels: Value, prev: Option<Value>) -> StoredEvent {
        StoredEvent {
            rv: 1,
            kind: Kind::Pod,
            type_,
            object: serde_json::to_vec(&json!({"metadata": {"name": "p", "namespace": "default", "labels": labels}}))
                .unwrap()
                .into(),
            prev: prev.map(|p| {
                serde_json::to_vec(&json!({"metadata": {"name": "p", "namespace": "default", "labels": p}}))
                    .unwrap()
                    .into()
            }),
        }
    }

    #[test]
    fn selector_transitions_become_added_and_deleted() {
        let f = WatchFilter {
            kind: Kind::Pod,
            ns: Some("default".into()),
            labels: LabelSelector::parse("app=web").unwrap(),
            fields: FieldSelector::default(),
        };
        let web = json!({"app": "web"});
        let db = json!({"app": "db"});
        assert_eq!(f.apply(&ev(EventType::Modified, web.clone(), Some(db.clone()))).unwrap().0, EventType::Added);
        assert_eq!(f.apply(&ev(EventType::Modified, db.clone(), Some(web.clone()))).unwrap().0, EventType::Deleted);
        assert_eq!(f.apply(&ev(EventType::Modified, web.clone(), Some(web.clone()))).unwrap().0, EventType::Modified);
        assert_eq!(f.apply(&ev(EventType::Modified, web.clone(), None)).unwrap().0, EventType::Modified);
        assert!(f.apply(&ev(EventType::Modified, db.clone(), Some(db.clone()))).is_none());
        assert!(f.apply(&ev(EventType::Added, db, None)).is_none());
        assert_eq!(f.apply(&ev(EventType::Deleted, web, None)).unwrap().0, EventType::Deleted);
    }
}
