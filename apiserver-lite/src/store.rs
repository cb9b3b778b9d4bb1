//! Durable storage on sled, with one global resourceVersion and a watch event log.
//!
//! Layout (one sled tree, so a `Batch` makes every write of a transaction atomic):
//! - `o/{Kind}/{namespace}/{name}` → object JSON
//! - `a/{allocator}/{value}`       → owner (`Kind/namespace/name`) of an allocated ClusterIP,
//!   NodePort, LoadBalancer IP or pod CIDR, written in the same batch as its owner
//! - `e/{rv:016x}`                 → watch event JSON (the last [`EVENT_LOG_CAPACITY`], at most
//!   [`EVENT_LOG_MAX_BYTES`] of objects in memory)
//! - `m/rv`                        → the last resourceVersion
//!
//! Writers serialise on [`Store::lock`] (read-modify-write must see its own reads unchanged);
//! `commit` applies the batch and appends the events, and [`Store::sync`] waits until the write
//! is on disk before the caller acknowledges: sled flushes its log (with `sync_file_range`, which
//! neither writes the file's size nor empties the disk's cache), then the flusher `fdatasync`s
//! the log file, as etcd fsyncs its WAL. One flusher thread does every flush (group commit):
//! concurrent sled flushes can deadlock with `apply_batch` (each flush holds sled's read lock
//! while waiting for buffers that another, blocked flush must write). While several writers
//! wait on each flush, flushes are at least [`GROUP_COMMIT_WINDOW`] apart (fewer, larger
//! ones); a lone writer's flush starts at once. Watchers only ever see durable events.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex as StdMutex, RwLock};

use api::Kind;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{watch, Mutex, MutexGuard};

use crate::error::ApiError;

/// sled's segment size for new databases (see `open_with_limits`).
const BIG_SEGMENTS: usize = 8 << 20;
/// sled 0.34's default, which databases made before keep.
const SLED_DEFAULT_SEGMENTS: usize = 512 << 10;

/// How many events are kept for resuming watches (in memory and on disk), by default.
pub const EVENT_LOG_CAPACITY: usize = 4096;

/// How long after one flush the next may start while writes keep coming (see `run_flusher`).
pub const GROUP_COMMIT_WINDOW: std::time::Duration = std::time::Duration::from_millis(2);

/// The most the event log holds in memory, in bytes of the objects it keeps (after and before
/// each change). Past it the oldest events go, whatever their count: 4,096 copies of a large
/// object would otherwise take gigabytes. A watch that resumes from an event that went gets
/// 410 Expired and relists, as from a compacted etcd.
pub const EVENT_LOG_MAX_BYTES: usize = 64 << 20;

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

/// One change, as watchers see it. Objects are kept serialized: the log holds thousands of
/// them, and a parsed `Value` costs several times its JSON size.
#[derive(Debug)]
pub struct StoredEvent {
    pub rv: u64,
    pub kind: Kind,
    pub type_: EventType,
    /// The object after the change (for DELETED: its last state, with the new resourceVersion).
    pub object: bytes::Bytes,
    /// The object before the change, when known (selectors need it to turn a MODIFIED into an
    /// ADDED or DELETED for a watcher). Not kept across restarts.
    pub prev: Option<bytes::Bytes>,
}

impl StoredEvent {
    /// The bytes the event keeps in memory.
    fn size(&self) -> usize {
        self.object.len() + self.prev.as_ref().map_or(0, |p| p.len())
    }

    pub fn object(&self) -> Value {
        serde_json::from_slice(&self.object).unwrap_or_default()
    }
    pub fn prev(&self) -> Option<Value> {
        self.prev.as_ref().map(|p| serde_json::from_slice(p).unwrap_or_default())
    }
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
    Put {
        kind: Kind,
        object: Value,
        prev: Option<Arc<Value>>,
    },
    Delete {
        kind: Kind,
        object: Value,
    },
    /// Records (Some) or releases (None) an allocation.
    Alloc {
        key: String,
        owner: Option<String>,
    },
}

pub(crate) fn parse_object(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::storage(format!("corrupt object: {e}")))
}

/// The storage key of an object.
pub fn object_key(kind: Kind, ns: &str, name: &str) -> String {
    format!("o/{}/{}/{}", kind.store_name(), ns, name)
}

fn ns_and_name(obj: &Value) -> (String, String) {
    let m = &obj["metadata"];
    (m["namespace"].as_str().unwrap_or("").to_string(), m["name"].as_str().unwrap_or("").to_string())
}

/// The durable store. Cheap to share behind an `Arc`.
pub struct Store {
    db: sled::Db,
    writer: Mutex<()>,
    /// Held for writing while a batch is applied, for reading while a list is taken, so a list
    /// is an exact snapshot at its resourceVersion.
    applied: RwLock<Applied>,
    /// The last applied resourceVersion, for the flusher thread.
    applied_rv: Arc<std::sync::atomic::AtomicU64>,
    durable: Arc<watch::Sender<u64>>,
    capacity: usize,
    max_bytes: usize,
    flusher: Arc<FlushSignal>,
    flusher_thread: Option<std::thread::JoinHandle<()>>,
}

/// Wakes the flusher thread.
#[derive(Default)]
struct FlushSignal {
    state: StdMutex<FlushState>,
    cond: Condvar,
}

#[derive(Default)]
struct FlushState {
    /// Writers waiting on a flush that asked for one since the flusher last looked.
    waiting: usize,
    /// A flush was asked for by a writer that does not wait on it (see `Store::request_sync`).
    wanted: bool,
    closing: bool,
}

impl FlushSignal {
    fn request(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.waiting += 1;
            self.cond.notify_one();
        }
    }

    /// Asks for a flush without counting as a waiting writer: no reason to hold it for more.
    fn want(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.wanted = true;
            self.cond.notify_one();
        }
    }

    fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.closing = true;
            self.cond.notify_one();
        }
    }

    /// Waits for a request: how many writers wait on it (maybe none); None when closing.
    fn wait(&self) -> Option<usize> {
        let Ok(mut s) = self.state.lock() else { return None };
        while s.waiting == 0 && !s.wanted && !s.closing {
            s = match self.cond.wait(s) {
                Ok(s) => s,
                Err(_) => return None,
            };
        }
        if s.closing {
            return None;
        }
        s.wanted = false;
        Some(std::mem::take(&mut s.waiting))
    }
}

/// How long the flusher waits before a flush, `since` the last one ended, with `waiting`
/// writers asking now and `last_batch` at the last flush. Pure.
fn linger(since: std::time::Duration, waiting: usize, last_batch: usize) -> Option<std::time::Duration> {
    (since < GROUP_COMMIT_WINDOW && (waiting >= 2 || last_batch >= 2)).then(|| GROUP_COMMIT_WINDOW - since)
}

/// The flusher thread: flushes whatever was applied, then publishes it as durable.
fn run_flusher(
    db: sled::Db,
    log_file: std::fs::File,
    signal: Arc<FlushSignal>,
    durable: Arc<watch::Sender<u64>>,
    applied_rv: Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::Ordering;
    let mut last_flush: Option<(std::time::Instant, usize)> = None;
    while let Some(waiting) = signal.wait() {
        // Group commit: while several writers wait on each flush (this one's or the last one's),
        // a flush starts no sooner than the window after the last, so it covers more writes —
        // far fewer flushes, each waking every waiter. One writer alone (a controller, a
        // `kubectl apply` writing objects one after another) is never held back: every one of
        // its writes would wait out the window.
        if let Some(pause) = last_flush.and_then(|(at, last)| linger(at.elapsed(), waiting, last)) {
            std::thread::sleep(pause);
        }
        // Everything applied before this read is covered by the flush below.
        let target = applied_rv.load(Ordering::SeqCst);
        loop {
            match db.flush().map_err(|e| e.to_string()).and_then(|_| log_file.sync_data().map_err(|e| e.to_string())) {
                Ok(()) => break,
                Err(e) => {
                    tracing::error!(error = %e, "flushing the database failed; retrying");
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            }
        }
        last_flush = Some((std::time::Instant::now(), waiting));
        durable.send_if_modified(|d| {
            if target > *d {
                *d = target;
                true
            } else {
                false
            }
        });
    }
}

impl Drop for Store {
    /// Stops the flusher (it flushes nothing more) so the database closes with the store.
    fn drop(&mut self) {
        self.flusher.close();
        if let Some(t) = self.flusher_thread.take() {
            let _ = t.join();
        }
    }
}

struct Applied {
    rv: u64,
    log: VecDeque<Arc<StoredEvent>>,
    /// The sum of the log's event sizes.
    log_bytes: usize,
}

/// An object as a commit wrote it, and its JSON as stored (and sent to watchers).
#[derive(Debug)]
pub struct Written {
    pub object: Value,
    pub json: bytes::Bytes,
}

/// Proof that the caller holds the writer lock.
pub struct WriteGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

impl Store {
    pub fn open(dir: &Path) -> Result<Store, ApiError> {
        Store::open_with(dir, EVENT_LOG_CAPACITY)
    }

    /// Opens the store keeping `capacity` events for watch resumption.
    pub fn open_with(dir: &Path, capacity: usize) -> Result<Store, ApiError> {
        Self::open_with_limits(dir, capacity, EVENT_LOG_MAX_BYTES)
    }

    /// Opens the store keeping at most `capacity` events and `max_bytes` of their objects.
    pub fn open_with_limits(dir: &Path, capacity: usize, max_bytes: usize) -> Result<Store, ApiError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ApiError::storage(format!("cannot create data dir {}: {e}", dir.display())))?;
        let open = |segment: usize| {
            let config = sled::Config::new()
                .path(dir.join("db"))
                // Small: reads are cheap from the OS page cache, and sled grows well beyond this anyway.
                .cache_capacity(4 << 20)
                .segment_size(segment)
                // Our flusher thread is the only one that flushes (see the module docs).
                .flush_every_ms(None);
            open_sled(config)
        };
        // 8 MiB segments keep objects up to a few MiB (and their events) inside segments, which
        // sled's cleaner reclaims; at its default 512 KiB they go to blob files that 0.34 never
        // removes (600 updates of a 500 KB object: 1.6 GB of blobs, against 121 MB).
        // sled refuses to change a database's segment size: one made with the default is
        // copied once into a new one (its live data only, which also drops its old blobs).
        recover_migration(dir)?;
        let mut db = match open(BIG_SEGMENTS) {
            Err(sled::Error::Unsupported(why)) if why.contains("io buffer size") => {
                migrate(dir, SLED_DEFAULT_SEGMENTS)?;
                open(BIG_SEGMENTS)
            }
            other => other,
        }
        .map_err(|e| ApiError::storage(format!("cannot open database in {}: {e}", dir.display())))?;
        // sled's cleaner leaves a churned database several times its live data (600 updates of
        // a 500 KB object: 470 MB for 18 MB); on open, one far larger than what it holds is
        // copied into a fresh one, live keys only.
        let on_disk = dir_bytes(&dir.join("db"));
        if on_disk > COMPACT_ABOVE {
            let live: u64 = db.iter().filter_map(|kv| kv.ok()).map(|(k, v)| (k.len() + v.len()) as u64).sum();
            if on_disk > COMPACT_RATIO * live {
                tracing::info!(on_disk, live, "compacting the database (copying its live keys into a fresh one)");
                drop(db);
                migrate(dir, BIG_SEGMENTS)?;
                db = open(BIG_SEGMENTS)
                    .map_err(|e| ApiError::storage(format!("cannot open database in {}: {e}", dir.display())))?;
            }
        }
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
            let Some(kind) = Kind::from_store_name(&ev.kind) else { continue };
            let object = bytes::Bytes::from(serde_json::to_vec(&ev.object)?);
            log.push_back(Arc::new(StoredEvent { rv, kind, type_: ev.type_, object, prev: None }));
        }
        let (durable, _) = watch::channel(rv);
        let durable = Arc::new(durable);
        let flusher = Arc::new(FlushSignal::default());
        let applied_rv = Arc::new(std::sync::atomic::AtomicU64::new(rv));
        // sled 0.34 keeps its log in `<path>/db`; syncing any descriptor of it syncs the file.
        let log_path = dir.join("db").join("db");
        let log_file = std::fs::File::open(&log_path)
            .map_err(|e| ApiError::storage(format!("cannot open {} to sync it: {e}", log_path.display())))?;
        let flusher_thread = {
            let (db, flusher, durable, applied_rv) = (db.clone(), flusher.clone(), durable.clone(), applied_rv.clone());
            std::thread::Builder::new()
                .name("store-flusher".into())
                .spawn(move || run_flusher(db, log_file, flusher, durable, applied_rv))
                .map_err(|e| ApiError::storage(format!("cannot start the flusher thread: {e}")))?
        };
        Ok(Store {
            db,
            writer: Mutex::new(()),
            applied: RwLock::new(Applied { rv, log_bytes: log.iter().map(|e| e.size()).sum(), log }),
            applied_rv,
            durable,
            capacity: capacity.max(1),
            max_bytes,
            flusher,
            flusher_thread: Some(flusher_thread),
        })
    }

    /// Takes the writer lock. Hold it across read-modify-write.
    pub async fn lock(&self) -> WriteGuard<'_> {
        WriteGuard(self.writer.lock().await)
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<Value>, ApiError> {
        match self.db.get(object_key(kind, ns, name))? {
            Some(b) => {
                Ok(Some(serde_json::from_slice(&b).map_err(|e| ApiError::storage(format!("corrupt object: {e}")))?))
            }
            None => Ok(None),
        }
    }

    /// An object's stored JSON, unparsed.
    pub fn get_raw(&self, kind: Kind, ns: &str, name: &str) -> Result<Option<sled::IVec>, ApiError> {
        Ok(self.db.get(object_key(kind, ns, name))?)
    }

    /// Whether an object is stored (without reading it).
    pub fn contains(&self, kind: Kind, ns: &str, name: &str) -> Result<bool, ApiError> {
        Ok(self.db.contains_key(object_key(kind, ns, name))?)
    }

    /// Every object of `kind` (in namespace `ns` when given) and the resourceVersion of the
    /// snapshot.
    pub fn list(&self, kind: Kind, ns: Option<&str>) -> Result<(Vec<Value>, u64), ApiError> {
        let (raw, rv) = self.list_raw(kind, ns)?;
        Ok((raw.iter().map(|b| parse_object(b)).collect::<Result<_, _>>()?, rv))
    }

    /// Like [`Store::list`], but the stored JSON bytes, unparsed (plain lists need no parsing).
    pub fn list_raw(&self, kind: Kind, ns: Option<&str>) -> Result<(Vec<sled::IVec>, u64), ApiError> {
        let prefix = match ns {
            Some(ns) => format!("o/{}/{}/", kind.store_name(), ns),
            None => format!("o/{}/", kind.store_name()),
        };
        let applied = self.applied.read().map_err(|_| ApiError::internal("store lock poisoned"))?;
        let mut out = Vec::new();
        for item in self.db.scan_prefix(prefix.as_bytes()) {
            out.push(item?.1);
        }
        Ok((out, applied.rv))
    }

    /// Objects of `kind` in `ns` whose name starts with `name_prefix` (a key-range scan).
    pub fn list_name_prefix(&self, kind: Kind, ns: &str, name_prefix: &str) -> Result<Vec<Value>, ApiError> {
        let prefix = format!("o/{}/{}/{}", kind.store_name(), ns, name_prefix);
        let mut out = Vec::new();
        for item in self.db.scan_prefix(prefix.as_bytes()) {
            out.push(parse_object(&item?.1)?);
        }
        Ok(out)
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
    pub fn commit(&self, _guard: &WriteGuard<'_>, ops: Vec<Op>) -> Result<(Vec<Written>, u64), ApiError> {
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
                    let bytes = bytes::Bytes::from(serde_json::to_vec(&object)?);
                    batch.insert(object_key(kind, &ns, &name).as_bytes(), &bytes[..]);
                    let type_ = if prev.is_some() { EventType::Modified } else { EventType::Added };
                    let prev = prev.map(|p| serde_json::to_vec(&*p).map(bytes::Bytes::from)).transpose()?;
                    events.push(StoredEvent { rv, kind, type_, object: bytes.clone(), prev });
                    written.push(Written { object, json: bytes });
                }
                Op::Delete { kind, mut object } => {
                    rv += 1;
                    let prev = bytes::Bytes::from(serde_json::to_vec(&object)?);
                    object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                    let (ns, name) = ns_and_name(&object);
                    batch.remove(object_key(kind, &ns, &name).as_bytes());
                    let bytes = bytes::Bytes::from(serde_json::to_vec(&object)?);
                    events.push(StoredEvent {
                        rv,
                        kind,
                        type_: EventType::Deleted,
                        object: bytes.clone(),
                        prev: Some(prev),
                    });
                    written.push(Written { object, json: bytes });
                }
            }
        }
        for ev in &events {
            // {"kind":…,"type":…,"object":<the stored bytes>}, without re-serialising the object.
            let mut disk =
                format!(r#"{{"kind":"{}","type":"{}","object":"#, ev.kind.store_name(), ev.type_.as_str()).into_bytes();
            disk.extend_from_slice(&ev.object);
            disk.push(b'}');
            batch.insert(format!("e/{:016x}", ev.rv).as_bytes(), disk);
        }
        // Drop the oldest events beyond the log's capacity, in count and in bytes, in the same
        // batch (the new events stay, even when they alone are over the limit).
        let mut overflow = (applied.log.len() + events.len()).saturating_sub(self.capacity).min(applied.log.len());
        let mut bytes = applied.log_bytes + events.iter().map(StoredEvent::size).sum::<usize>()
            - applied.log.iter().take(overflow).map(|e| e.size()).sum::<usize>();
        while bytes > self.max_bytes && overflow < applied.log.len() {
            bytes -= applied.log[overflow].size();
            overflow += 1;
        }
        for old in applied.log.iter().take(overflow) {
            batch.remove(format!("e/{:016x}", old.rv).as_bytes());
        }
        batch.insert("m/rv", rv.to_string().as_bytes());
        self.db.apply_batch(batch)?;
        for _ in 0..overflow {
            applied.log.pop_front();
        }
        applied.log_bytes = bytes;
        applied.log.extend(events.into_iter().map(Arc::new));
        applied.rv = rv;
        self.applied_rv.store(rv, std::sync::atomic::Ordering::SeqCst);
        Ok((written, rv))
    }

    /// Waits until everything up to `rv` is durable (and visible to watchers).
    pub async fn sync(&self, rv: u64) -> Result<(), ApiError> {
        let mut rx = self.durable.subscribe();
        if *rx.borrow_and_update() >= rv {
            return Ok(());
        }
        self.flusher.request();
        loop {
            rx.changed().await.map_err(|_| ApiError::storage("the store is closed"))?;
            if *rx.borrow_and_update() >= rv {
                return Ok(());
            }
        }
    }

    /// Asks the flusher to make everything up to `rv` durable, without waiting for it: for a
    /// writer with more to write first, which waits once, for the last, with [`Store::sync`].
    pub fn request_sync(&self, rv: u64) {
        if *self.durable.borrow() < rv {
            self.flusher.want();
        }
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

    /// Makes every applied write durable (through the flusher, like every other flush).
    pub async fn flush(&self) -> Result<(), ApiError> {
        self.sync(self.current_rv()).await
    }
}

/// Where a migration writes the new database, and where the old one waits for removal.
const MIGRATING: &str = "db.migrating";
const RETIRED: &str = "db.old";

/// Finishes or undoes a migration a crash interrupted: a complete new database (renamed only
/// after it was written and flushed) takes the place of a missing one; leftovers go.
fn recover_migration(dir: &Path) -> Result<(), ApiError> {
    let (db, new, old) = (dir.join("db"), dir.join(MIGRATING), dir.join(RETIRED));
    let io = |what: &str, e: std::io::Error| ApiError::storage(format!("{what} in {}: {e}", dir.display()));
    if !db.exists() && new.join("complete").exists() {
        std::fs::rename(&new, &db).map_err(|e| io("cannot finish the database migration", e))?;
    }
    for leftover in [new, old] {
        if leftover.exists() {
            std::fs::remove_dir_all(&leftover).map_err(|e| io("cannot remove a migration's leftover", e))?;
        }
    }
    Ok(())
}

/// A database is compacted on open when it takes more than this on disk (the unit tests' churn,
/// bounded in time, leaves less garbage than a lab's: they use a lower bar) …
const COMPACT_ABOVE: u64 = if cfg!(test) { 16 << 20 } else { 64 << 20 };
/// … and more than this many times the bytes of its keys and values.
const COMPACT_RATIO: u64 = 4;

/// The bytes of the files under `p`.
fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Opens a sled database, waiting a little while another handle of it is still closing: sled
/// 0.34 releases its file lock only when its background writer drops its last reference, which
/// can be just after the handle itself was dropped (a store closed and opened again at once).
fn open_sled(config: sled::Config) -> sled::Result<sled::Db> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match config.open() {
            // sled reports it as an `Other` error with the lock's own error in its text.
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

/// Copies the database (of `from_segments`) into a fresh one of [`BIG_SEGMENTS`] (sled's export
/// and import: the live keys only), then swaps them: the migration of an old database, and
/// the compaction of a churned one.
fn migrate(dir: &Path, from_segments: usize) -> Result<(), ApiError> {
    let (db_path, new_path, old_path) = (dir.join("db"), dir.join(MIGRATING), dir.join(RETIRED));
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        ApiError::storage(format!("cannot migrate the database in {} ({what}): {e}", dir.display()))
    };
    tracing::info!(dir = %dir.display(), "copying the database's live keys into a fresh one");
    {
        let old = sled::Config::new().path(&db_path).segment_size(from_segments);
        let old = open_sled(old).map_err(|e| fail("open the old one", &e))?;
        let new = sled::Config::new().path(&new_path).segment_size(BIG_SEGMENTS);
        let new = open_sled(new).map_err(|e| fail("make the new one", &e))?;
        new.import(old.export());
        new.flush().map_err(|e| fail("flush the new one", &e))?;
    }
    std::fs::write(new_path.join("complete"), b"").map_err(|e| fail("mark the new one complete", &e))?;
    std::fs::rename(&db_path, &old_path).map_err(|e| fail("retire the old one", &e))?;
    std::fs::rename(&new_path, &db_path).map_err(|e| fail("put the new one in place", &e))?;
    let _ = std::fs::remove_file(db_path.join("complete"));
    std::fs::remove_dir_all(&old_path).map_err(|e| fail("remove the old one", &e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_flush_waits_out_the_window_only_when_writers_share_it() {
        let ms = std::time::Duration::from_millis;
        // One writer after another (a controller): never held back.
        assert_eq!(linger(ms(0), 1, 1), None);
        // Several waiting, now or at the last flush: the rest of the window.
        assert_eq!(linger(ms(0), 5, 1), Some(GROUP_COMMIT_WINDOW));
        assert_eq!(linger(GROUP_COMMIT_WINDOW / 2, 1, 7), Some(GROUP_COMMIT_WINDOW / 2));
        // The window is over: at once.
        assert_eq!(linger(GROUP_COMMIT_WINDOW, 64, 64), None);
    }

    #[test]
    fn the_flush_signal_counts_requests_and_ends_on_close() {
        let signal = FlushSignal::default();
        for _ in 0..3 {
            signal.request();
        }
        assert_eq!(signal.wait(), Some(3));
        signal.request();
        assert_eq!(signal.wait(), Some(1));
        signal.close();
        assert_eq!(signal.wait(), None);
    }

    #[test]
    fn a_flush_wanted_without_a_waiter_wakes_the_flusher_counting_no_writer() {
        let signal = FlushSignal::default();
        signal.want();
        signal.want();
        assert_eq!(signal.wait(), Some(0), "a flush, and nobody to group it for");
        signal.want();
        signal.request();
        assert_eq!(signal.wait(), Some(1));
        // Taken once: the next wait blocks until another request (close ends it here).
        signal.close();
        assert_eq!(signal.wait(), None);
    }

    #[tokio::test]
    async fn a_database_of_sleds_default_segments_is_copied_into_big_ones_once() {
        let dir = tempfile::tempdir().unwrap();
        // An old database: 512 KiB segments, one object and one overwritten 200 times (its old
        // versions in blobs).
        {
            let db =
                sled::Config::new().path(dir.path().join("db")).segment_size(SLED_DEFAULT_SEGMENTS).open().unwrap();
            let big = vec![b'x'; 300 * 1024];
            for i in 0..200u32 {
                let mut v = big.clone();
                v.extend_from_slice(&i.to_be_bytes());
                db.insert("o/big", v).unwrap();
            }
            db.insert("m/rv", b"7".to_vec()).unwrap();
            db.flush().unwrap();
        }
        let before = dir_bytes(dir.path());
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.current_rv(), 7, "the data came along");
        drop(store);
        assert!(!dir.path().join(MIGRATING).exists() && !dir.path().join(RETIRED).exists());
        let after = dir_bytes(dir.path());
        assert!(after < before / 4, "{before} bytes before, {after} after");
        // It opens with 8 MiB segments now (the default would be refused).
        let again = sled::Config::new().path(dir.path().join("db")).segment_size(BIG_SEGMENTS).open();
        assert!(again.is_ok());
    }

    #[tokio::test]
    async fn a_churned_database_is_compacted_on_open() {
        let dir = tempfile::tempdir().unwrap();
        // 400 overwrites of a 500 KB value, as a busy object's updates leave them.
        {
            let db = sled::Config::new().path(dir.path().join("db")).segment_size(BIG_SEGMENTS).open().unwrap();
            for i in 0..400u32 {
                let mut v = vec![b'y'; 500 * 1024];
                v.extend_from_slice(&i.to_be_bytes());
                db.insert("o/ConfigMap/default/big", v).unwrap();
                if i % 50 == 0 {
                    db.flush().unwrap();
                }
            }
            db.insert("m/rv", b"400".to_vec()).unwrap();
            db.flush().unwrap();
        }
        let before = dir_bytes(dir.path());
        assert!(before > COMPACT_ABOVE, "sled kept {before} bytes of garbage, less than the threshold");
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.current_rv(), 400);
        drop(store);
        let after = dir_bytes(dir.path());
        assert!(after < 32 << 20, "{before} bytes before, {after} after (live: about 500 KB)");
    }

    #[test]
    fn an_interrupted_migration_is_finished_or_undone() {
        let dir = tempfile::tempdir().unwrap();
        // Crashed between the two renames: the complete new one takes the old one's place.
        std::fs::create_dir_all(dir.path().join(MIGRATING)).unwrap();
        std::fs::write(dir.path().join(MIGRATING).join("complete"), b"").unwrap();
        std::fs::create_dir_all(dir.path().join(RETIRED)).unwrap();
        recover_migration(dir.path()).unwrap();
        assert!(dir.path().join("db").exists() && !dir.path().join(RETIRED).exists());
        // Crashed while copying: the half-made new one goes, the old one stays.
        std::fs::create_dir_all(dir.path().join(MIGRATING)).unwrap();
        recover_migration(dir.path()).unwrap();
        assert!(dir.path().join("db").exists() && !dir.path().join(MIGRATING).exists());
    }

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
            assert_eq!(objs[0].object["metadata"]["resourceVersion"], "1");
            assert_eq!(objs[0].json, serde_json::to_vec(&objs[0].object).unwrap());
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

    /// A run of writes asks for its flush as it goes and waits once: each is made durable
    /// (and so seen by watchers) without anyone waiting on it.
    #[tokio::test]
    async fn a_requested_sync_makes_writes_durable_with_nobody_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut durable = store.subscribe();
        let g = store.lock().await;
        let (_, rv) = store.commit(&g, vec![Op::Put { kind: Kind::Service, object: svc("a"), prev: None }]).unwrap();
        drop(g);
        store.request_sync(rv);
        tokio::time::timeout(std::time::Duration::from_secs(10), durable.wait_for(|d| *d >= rv))
            .await
            .expect("the flusher made the write durable unasked by a waiter")
            .unwrap();
        // Already durable: asking again wakes nothing, and waiting returns at once.
        store.request_sync(rv);
        store.sync(rv).await.unwrap();
        assert_eq!(store.durable_rv(), rv);
    }

    /// Many writers committing and syncing while others read: concurrent sled flushes used to
    /// deadlock against apply_batch here.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_commits_and_syncs_make_progress() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let work = async {
            let tasks: Vec<_> = (0..32)
                .map(|t| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        for i in 0..60 {
                            let rv = {
                                let g = store.lock().await;
                                let obj = svc(&format!("s-{t}-{i}"));
                                store
                                    .commit(&g, vec![Op::Put { kind: Kind::Service, object: obj, prev: None }])
                                    .unwrap()
                                    .1
                            };
                            store.get(Kind::Service, "default", &format!("s-{t}-{}", i / 2)).unwrap();
                            store.sync(rv).await.unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(60), work).await.expect("no deadlock");
        assert_eq!(store.durable_rv(), 32 * 60);
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

    #[tokio::test]
    async fn event_log_is_bounded_in_bytes_too() {
        let dir = tempfile::tempdir().unwrap();
        let limit = 1 << 20;
        let store = Store::open_with_limits(dir.path(), EVENT_LOG_CAPACITY, limit).unwrap();
        let g = store.lock().await;
        // 100 versions of a 32 KiB object: far below the count limit, far above the byte limit.
        let mut big = svc("big");
        big["metadata"]["annotations"] = json!({"a": "x".repeat(32 << 10)});
        let mut prev = None;
        for i in 0..100 {
            big["metadata"]["labels"] = json!({"v": i.to_string()});
            let (w, _) = store
                .commit(&g, vec![Op::Put { kind: Kind::Service, object: big.clone(), prev: prev.clone() }])
                .unwrap();
            prev = w.into_iter().next().map(|w| Arc::new(w.object));
        }
        let applied = store.applied.read().unwrap();
        assert!(applied.log_bytes <= limit, "{}", applied.log_bytes);
        assert_eq!(applied.log_bytes, applied.log.iter().map(|e| e.size()).sum::<usize>());
        // Each event keeps the object and its previous version: 64 KiB.
        assert!((10..=16).contains(&applied.log.len()), "{}", applied.log.len());
        let last = applied.rv;
        drop(applied);
        assert!(store.events_since(last - 50, last).is_err(), "resuming from a dropped event is 410");
        assert_eq!(store.events_since(last - 3, last).unwrap().len(), 3);
    }
}
