//! Durable storage on sled, with one global resourceVersion and a watch event log.
//!
//! Layout (one sled tree, so a `Batch` makes every write of a transaction atomic):
//! - `o/{Kind}/{namespace}/{name}` → object JSON
//! - `a/{allocator}/{value}`       → owner (`Kind/namespace/name`) of an allocated ClusterIP,
//!   NodePort, LoadBalancer IP or pod CIDR, written in the same batch as its owner
//! - `e/{rv:016x}`                 → watch event JSON (the last [`EVENT_LOG_CAPACITY`])
//! - `m/rv`                        → the last resourceVersion
//!
//! Writers serialise on [`Store::lock`] (read-modify-write must see its own reads unchanged);
//! `commit` applies the batch and appends the events, and [`Store::sync`] fsyncs before the
//! caller acknowledges. Concurrent writers share fsyncs (group commit). Watchers only ever see
//! events that are durable.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, RwLock};

use api::Kind;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{watch, Mutex, MutexGuard};

use crate::error::ApiError;

/// How many events are kept for resuming watches (in memory and on disk), by default.
pub const EVENT_LOG_CAPACITY: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    #[serde(rename = "ADDED")]
    Added,
    #[serde(rename = "MODIFIED")]
    Modified,
    #[serde(rename = "DELETED")]
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watchers see it.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub kind: Kind,
    pub type_: EventType,
    /// The object after the change (for DELETED: its last state, with the new resourceVersion).
    pub object: Arc<Value>,
    /// The object before the change, when known (selectors need it to turn a MODIFIED into an
    /// ADDED or DELETED for a watcher). Not kept across restarts.
    pub prev: Option<Arc<Value>>,
}

#[derive(Serialize, Deserialize)]
struct DiskEvent {
    kind: String,
    #[serde(rename = "type")]
    type_: EventType,
    object: Value,
}

/// One write of a transaction.
pub enum Op {
    Put { kind: Kind, object: Value, prev: Option<Arc<Value>> },
    Delete { kind: Kind, object: Value },
    /// Records (Some) or releases (None) an allocation.
    Alloc { key: String, owner: Option<String> },
}

/// The storage key of an object.
pub fn object_key(kind: Kind, ns: &str, name: &str) -> String {
    format!("o/{}/{}/{}", kind.info().name, ns, name)
}

fn ns_and_name(obj: &Value) -> (String, String) {
    let m = &obj["metadata"];
    (
        m["namespace"].as_str().unwrap_or("").to_string(),
        m["name"].as_str().unwrap_or("").to_string(),
    )
}

/// The durable store. Cheap to share behind an `Arc`.
pub struct Store {
    db: sled::Db,
    writer: Mutex<()>,
    /// Held for writing while a batch is applied, for reading while a list is taken, so a list
    /// is an exact snapshot at its resourceVersion.
    applied: RwLock<Applied>,
    durable: watch::Sender<u64>,
    capacity: usize,
}

struct Applied {
    rv: u64,
    log: VecDeque<Arc<StoredEvent>>,
}

/// Proof that the caller holds the writer lock.
pub struct WriteGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

impl Store {
    pub fn open(dir: &Path) -> Result<Store, ApiError> {
        Store::open_with(dir, EVENT_LOG_CAPACITY)
    }

    /// Opens the store keeping `capacity` events for watch resumption.
    pub fn open_with(dir: &Path, capacity: usize) -> Result<Store, ApiError> {
        std::fs::create_dir_all(dir).map_err(|e| ApiError::storage(format!("cannot create data dir {}: {e}", dir.display())))?;
        let db = sled::Config::new()
            .path(dir.join("db"))
            .cache_capacity(16 << 20)
            .flush_every_ms(Some(1000))
            .open()
            .map_err(|e| ApiError::storage(format!("cannot open database in {}: {e}", dir.display())))?;
        let rv = match db.get("m/rv")? {
            Some(b) => std::str::from_utf8(&b).ok().and_then(|s| s.parse().ok()).unwrap_or(0),
            None => 0,
        };
        let mut log = VecDeque::new();
        for item in db.scan_prefix("e/") {
            let (k, v) = item?;
            let rv = u64::from_str_radix(std::str::from_utf8(&k[2..]).unwrap_or("0"), 16).unwrap_or(0);
            let ev: DiskEvent = match serde_json::from_slice(&v) {
                Ok(ev) => ev,
                Err(_) => continue,
            };
            let Some(kind) = Kind::from_name(&ev.kind) else { continue };
            log.push_back(Arc::new(StoredEvent { rv, kind, type_: ev.type_, object: Arc::new(ev.object), prev: None }));
        }
        let (durable, _) = watch::channel(rv);
        Ok(Store { db, writer: Mutex::new(()), applied: RwLock::new(Applied { rv, log }), durable, capacity: capacity.max(1) })
    }

    /// Takes the writer lock. Hold it across read-modify-write.
    pub async fn lock(&self) -> WriteGuard<'_> {
        WriteGuard(self.writer.lock().await)
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Value>, ApiError> {
        match self.db.get(object_key(kind, ns, name))? {
            Some(b) => Ok(Some(serde_json::from_slice(&b).map_err(|e| ApiError::storage(format!("corrupt object: {e}")))?)),
            None => Ok(None),
        }
    }

    /// Every object of `kind` (in namespace `ns` when given) and the resourceVersion of the
    /// snapshot.
    pub fn list(&self, kind: Kind, ns: Option<&str>) -> Result<(Vec<Value>, u64), ApiError> {
        let prefix = match ns {
            Some(ns) => format!("o/{}/{}/", kind.info().name, ns),
            None => format!("o/{}/", kind.info().name),
        };
        let applied = self.applied.read().map_err(|_| ApiError::internal("store lock poisoned"))?;
        let mut out = Vec::new();
        for item in self.db.scan_prefix(prefix.as_bytes()) {
            let (_, v) = item?;
            out.push(serde_json::from_slice(&v).map_err(|e| ApiError::storage(format!("corrupt object: {e}")))?);
        }
        Ok((out, applied.rv))
    }

    /// Every recorded allocation (`a/...` key without the prefix → owner).
    pub fn allocations(&self) -> Result<BTreeMap<String, String>, ApiError> {
        let mut out = BTreeMap::new();
        for item in self.db.scan_prefix("a/") {
            let (k, v) = item?;
            out.insert(String::from_utf8_lossy(&k[2..]).into_owned(), String::from_utf8_lossy(&v).into_owned());
        }
        Ok(out)
    }

    /// The last applied resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.applied.read().map(|a| a.rv).unwrap_or(0)
    }

    /// Applies `ops` atomically: every Put/Delete gets the next resourceVersion (written into
    /// its `metadata.resourceVersion`). Returns the written objects and the last version.
    /// The caller must then [`Store::sync`] before acknowledging.
    pub fn commit(&self, _guard: &WriteGuard<'_>, ops: Vec<Op>) -> Result<(Vec<Value>, u64), ApiError> {
        let mut applied = self.applied.write().map_err(|_| ApiError::internal("store lock poisoned"))?;
        let mut rv = applied.rv;
        let mut batch = sled::Batch::default();
        let mut events = Vec::new();
        let mut written = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { key, owner } => match owner {
                    Some(o) => batch.insert(format!("a/{key}").as_bytes(), o.as_bytes()),
                    None => batch.remove(format!("a/{key}").as_bytes()),
                },
                Op::Put { kind, mut object, prev } => {
                    rv += 1;
                    object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                    let (ns, name) = ns_and_name(&object);
                    batch.insert(object_key(kind, &ns, &name).as_bytes(), serde_json::to_vec(&object)?);
                    let type_ = if prev.is_some() { EventType::Modified } else { EventType::Added };
                    events.push(StoredEvent { rv, kind, type_, object: Arc::new(object.clone()), prev });
                    written.push(object);
                }
                Op::Delete { kind, mut object } => {
                    rv += 1;
                    let prev = Arc::new(object.clone());
                    object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                    let (ns, name) = ns_and_name(&object);
                    batch.remove(object_key(kind, &ns, &name).as_bytes());
                    events.push(StoredEvent {
                        rv,
                        kind,
                        type_: EventType::Deleted,
                        object: Arc::new(object.clone()),
                        prev: Some(prev),
                    });
                    written.push(object);
                }
            }
        }
        for ev in &events {
            let disk = DiskEvent { kind: ev.kind.info().name.to_string(), type_: ev.type_, object: (*ev.object).clone() };
            batch.insert(format!("e/{:016x}", ev.rv).as_bytes(), serde_json::to_vec(&disk)?);
        }
        // Drop the oldest events beyond the log's capacity in the same batch.
        let overflow = (applied.log.len() + events.len()).saturating_sub(self.capacity);
        for old in applied.log.iter().take(overflow) {
            batch.remove(format!("e/{:016x}", old.rv).as_bytes());
        }
        batch.insert("m/rv", rv.to_string().as_bytes());
        self.db.apply_batch(batch)?;
        for _ in 0..overflow {
            applied.log.pop_front();
        }
        applied.log.extend(events.into_iter().map(Arc::new));
        applied.rv = rv;
        Ok((written, rv))
    }

    /// Makes everything up to `rv` durable, then lets watchers see it.
    pub async fn sync(&self, rv: u64) -> Result<(), ApiError> {
        if *self.durable.borrow() >= rv {
            return Ok(());
        }
        self.db.flush_async().await?;
        // One flush covers every batch applied before it, including other writers' ones.
        self.durable.send_if_modified(|d| {
            if rv > *d {
                *d = rv;
                true
            } else {
                false
            }
        });
        Ok(())
    }

    /// A receiver of the durable resourceVersion, for watchers.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.durable.subscribe()
    }

    pub fn durable_rv(&self) -> u64 {
        *self.durable.borrow()
    }

    /// Events with `after < rv <= upto`, or `Err(oldest)` when `after` is older than the log.
    pub fn events_since(&self, after: u64, upto: u64) -> Result<Vec<Arc<StoredEvent>>, u64> {
        let applied = match self.applied.read() {
            Ok(a) => a,
            Err(_) => return Err(0),
        };
        let oldest = applied.log.front().map(|e| e.rv).unwrap_or(applied.rv + 1);
        // Every version after `after` must still be in the log (or nothing happened since).
        if after + 1 < oldest && after < applied.rv {
            return Err(oldest);
        }
        Ok(applied.log.iter().filter(|e| e.rv > after && e.rv <= upto).cloned().collect())
    }

    /// Flushes and closes the database.
    pub fn flush(&self) -> Result<(), ApiError> {
        self.db.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {}})
    }

    #[tokio::test]
    async fn commit_assigns_versions_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let g = store.lock().await;
            let (objs, rv) = store
                .commit(
                    &g,
                    vec![
                        Op::Put { kind: Kind::Service, object: svc("a"), prev: None },
                        Op::Alloc { key: "clusterip/10.96.0.10".into(), owner: Some("Service/default/a".into()) },
                    ],
                )
                .unwrap();
            assert_eq!(rv, 1);
            assert_eq!(objs[0]["metadata"]["resourceVersion"], "1");
            store.commit(&g, vec![Op::Put { kind: Kind::Service, object: svc("b"), prev: None }]).unwrap();
            store.sync(2).await.unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.current_rv(), 2);
        let (list, rv) = store.list(Kind::Service, Some("default")).unwrap();
        assert_eq!((list.len(), rv), (2, 2));
        assert_eq!(store.allocations().unwrap()["clusterip/10.96.0.10"], "Service/default/a");
        assert_eq!(store.events_since(0, 2).unwrap().len(), 2);
    }

    #[tokio::test]
    async fn event_log_is_bounded_and_reports_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let g = store.lock().await;
        for i in 0..(EVENT_LOG_CAPACITY + 10) {
            store.commit(&g, vec![Op::Put { kind: Kind::Service, object: svc(&format!("s{i}")), prev: None }]).unwrap();
        }
        let last = store.current_rv();
        assert!(store.events_since(1, last).is_err());
        assert_eq!(store.events_since(last - 5, last).unwrap().len(), 5);
        assert!(store.events_since(last, last).unwrap().is_empty());
    }
}
