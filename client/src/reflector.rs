//! A watched, locally cached set of API objects (an "informer").
//!
//! The protocol is apiserver-lite's gRPC Watch: with no resourceVersion it sends a snapshot
//! (ADDED…), then SYNCED, then live events; with one it resumes after it, or fails with
//! OUT_OF_RANGE when that version is too old. [`step`] is the pure state machine: snapshot
//! objects are buffered and swapped into the store whole on SYNCED, so readers never see a
//! half-listed world; a dropped stream resumes from the last version; an expired one relists.
//!
//! A reflector feeds any [`Sink`]: a [`Store`] of whole objects, or (with [`run_mapped`]) a
//! consumer that keeps only a projection of each object, as the DNS server does — at 10,000
//! Services, whole objects cost ten times what the answers need.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use api::convert::{from_proto, ProtoKind};
use api::proto as pb;
use api::proto::watch_event::Type;
use tokio::sync::watch;

use crate::grpc::ApiClient;

/// A kind a reflector can follow: every kind served over gRPC (`api::convert::ProtoKind`, the
/// one table of API kinds and proto kinds).
pub trait Watched: ProtoKind + Clone + Send + Sync + 'static {
    /// `namespace/name` (or `name` for cluster-scoped kinds).
    fn key(&self) -> String {
        let m = self.metadata();
        match m.namespace.as_deref() {
            Some(ns) if !ns.is_empty() => format!("{ns}/{}", m.name.clone().unwrap_or_default()),
            _ => m.name.clone().unwrap_or_default(),
        }
    }
}

impl<T: ProtoKind + Clone + Send + Sync + 'static> Watched for T {}

/// The name of a watched kind in log lines (`pods`).
fn plural<T: Watched>() -> &'static str {
    <T as api::ApiObject>::KIND.info().plural
}

/// Where a watch stands.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchState<U> {
    /// Nothing listed yet (or the list expired): the next watch asks for a snapshot.
    Empty,
    /// Receiving the snapshot.
    Listing(BTreeMap<String, U>),
    /// Live, after this resourceVersion.
    Watching(String),
}

/// What a step does to the store.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<U> {
    None,
    /// The snapshot is complete: it replaces the store's content.
    Replace(BTreeMap<String, U>),
    Apply(String, U),
    Delete(String),
}

/// One event's effect on an object known by its key (`namespace/name`). Pure: no I/O, no clock.
pub fn step<U>(
    state: WatchState<U>,
    event: Type,
    rv: String,
    object: Option<(String, U)>,
) -> (WatchState<U>, Change<U>) {
    match (state, event) {
        (WatchState::Empty, Type::Added) => {
            let mut buf = BTreeMap::new();
            if let Some((k, o)) = object {
                buf.insert(k, o);
            }
            (WatchState::Listing(buf), Change::None)
        }
        (WatchState::Empty, Type::Synced) => (WatchState::Watching(rv), Change::Replace(BTreeMap::new())),
        (WatchState::Listing(mut buf), Type::Added) => {
            if let Some((k, o)) = object {
                buf.insert(k, o);
            }
            (WatchState::Listing(buf), Change::None)
        }
        (WatchState::Listing(buf), Type::Synced) => (WatchState::Watching(rv), Change::Replace(buf)),
        (WatchState::Watching(_), Type::Added | Type::Modified) => match object {
            Some((k, o)) => (WatchState::Watching(rv), Change::Apply(k, o)),
            None => (WatchState::Watching(rv), Change::None),
        },
        (WatchState::Watching(_), Type::Deleted) => match object {
            Some((k, _)) => (WatchState::Watching(rv), Change::Delete(k)),
            None => (WatchState::Watching(rv), Change::None),
        },
        (WatchState::Watching(_), Type::Bookmark) => (WatchState::Watching(rv), Change::None),
        // Anything else (an event out of protocol order) keeps the state.
        (s, _) => (s, Change::None),
    }
}

/// Whatever a reflector feeds: it receives every change, in order.
pub trait Sink<U>: Send + Sync + 'static {
    fn apply(&self, change: Change<U>);
}

/// The cached objects (or their projections: [`run_mapped`]), shared by readers; `changes()` ticks after every applied change, and
/// [`Store::changed_since`] tells which keys changed, so a reader at 10,000 objects need not
/// compare them all after each one.
pub struct Store<T> {
    inner: RwLock<Inner<T>>,
    generation: watch::Sender<u64>,
    synced: watch::Sender<bool>,
}

/// How many changed keys the store remembers: a reader further behind starts over from `list`.
const LOG_LEN: usize = 65_536;

struct Inner<T> {
    objects: BTreeMap<String, T>,
    /// Bumped by every applied change.
    generation: u64,
    /// The keys of the last changes (at most `LOG_LEN`), each with its generation.
    log: std::collections::VecDeque<(u64, String)>,
    /// The generation of the last whole replacement: no key list reaches back past it.
    replaced: u64,
}

/// What changed after a generation.
#[derive(Debug, Clone, PartialEq)]
pub enum Changed {
    /// These keys (in order, maybe repeated).
    Keys(Vec<String>),
    /// More than the log holds, or the content was replaced whole: read everything again.
    All,
}

impl<T: Clone + Send + Sync + 'static> Store<T> {
    pub fn new() -> Arc<Store<T>> {
        Arc::new(Store {
            inner: RwLock::new(Inner { objects: BTreeMap::new(), generation: 0, log: Default::default(), replaced: 0 }),
            generation: watch::channel(0).0,
            synced: watch::channel(false).0,
        })
    }

    pub fn apply(&self, change: Change<T>) {
        let mut inner = self.inner.write().expect("store lock");
        let key = match change {
            Change::None => return,
            Change::Replace(all) => {
                inner.objects = all;
                self.synced.send_replace(true);
                None
            }
            Change::Apply(k, o) => {
                inner.objects.insert(k.clone(), o);
                Some(k)
            }
            Change::Delete(k) => {
                inner.objects.remove(&k);
                Some(k)
            }
        };
        inner.generation += 1;
        let g = inner.generation;
        match key {
            Some(k) => {
                if inner.log.len() == LOG_LEN {
                    inner.log.pop_front();
                }
                inner.log.push_back((g, k));
            }
            None => {
                inner.log.clear();
                inner.replaced = g;
            }
        }
        drop(inner);
        self.generation.send_replace(g);
    }

    pub fn list(&self) -> Vec<T> {
        self.inner.read().expect("store lock").objects.values().cloned().collect()
    }

    /// Every object with its key, in key order.
    pub fn entries(&self) -> Vec<(String, T)> {
        self.inner.read().expect("store lock").objects.iter().map(|(k, o)| (k.clone(), o.clone())).collect()
    }

    pub fn get(&self, key: &str) -> Option<T> {
        self.inner.read().expect("store lock").objects.get(key).cloned()
    }

    /// The generation now and what changed after `since` (a generation this store returned
    /// before; 0 before any).
    pub fn changed_since(&self, since: u64) -> (u64, Changed) {
        let inner = self.inner.read().expect("store lock");
        let now = inner.generation;
        let first_logged = inner.log.front().map(|(g, _)| *g).unwrap_or(now + 1);
        if since < inner.replaced || (since < now && first_logged > since + 1) {
            return (now, Changed::All);
        }
        let keys = inner.log.iter().filter(|(g, _)| *g > since).map(|(_, k)| k.clone()).collect();
        (now, Changed::Keys(keys))
    }

    /// Ticks after every change.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Waits until the first full list is in.
    pub async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }
}

impl<T: Clone + Send + Sync + 'static> Sink<T> for Store<T> {
    fn apply(&self, change: Change<T>) {
        Store::apply(self, change)
    }
}

/// A change of a whole object, keyed as the store keys it (for tests and benches that fill a
/// store by hand).
pub fn apply_object<T: Watched>(o: T) -> Change<T> {
    Change::Apply(o.key(), o)
}

/// What to watch.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub namespace: String,
    pub label_selector: String,
    pub field_selector: String,
}

/// Keeps `store` in sync with the API server, forever: reconnects with backoff, resumes from
/// the last version, relists when that version has expired.
pub async fn run<T: Watched>(client: ApiClient, filter: Filter, store: Arc<Store<T>>) {
    run_mapped(client, filter, store, |o: T| o).await
}

/// [`run`], feeding `sink` with `map` of each object instead of the object: only the
/// projection is kept, from the snapshot on.
pub async fn run_mapped<T: Watched, U: Send, S: Sink<U>>(
    client: ApiClient,
    filter: Filter,
    sink: Arc<S>,
    map: impl Fn(T) -> U + Send,
) {
    let request = pb::WatchRequest { kind: T::PROTO_KIND as i32, ..Default::default() };
    let decode = move |o: pb::watch_event::Object| -> Option<Result<(String, U), String>> {
        let p = T::from_event_object(o)?;
        Some(from_proto::<T>(&p).map(|o| (o.key(), map(o))).map_err(|e| e.to_string()))
    };
    run_request(client, filter, request, plural::<T>(), sink, decode).await
}

/// Keeps `store` in sync with the objects of a custom resource (`plural.group`, served by a
/// CRD), as JSON in its storage version, keyed `namespace/name` (or `name`).
pub async fn run_custom(client: ApiClient, resource: &str, filter: Filter, store: Arc<Store<serde_json::Value>>) {
    let request = pb::WatchRequest { resource: resource.to_string(), ..Default::default() };
    let decode = |o: pb::watch_event::Object| -> Option<Result<(String, serde_json::Value), String>> {
        let pb::watch_event::Object::ObjectJson(json) = o else { return None };
        Some(serde_json::from_str::<serde_json::Value>(&json).map_err(|e| e.to_string()).map(|v| (json_key(&v), v)))
    };
    run_request(client, filter, request, resource, store, decode).await
}

/// `namespace/name` (or `name`) of an object as JSON.
pub fn json_key(v: &serde_json::Value) -> String {
    let name = v["metadata"]["name"].as_str().unwrap_or("");
    match v["metadata"]["namespace"].as_str() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// The watch loop of every reflector: `request` (a kind or a resource) with the filter, each
/// event's object made a keyed `U` by `decode`. Only the state machine is generic; the
/// connection, the stream and its decoding are [`watch_loop`]'s, compiled once here rather than
/// in every crate and for every kind that follows one.
async fn run_request<U: Send, S: Sink<U>>(
    client: ApiClient,
    filter: Filter,
    request: pb::WatchRequest,
    what: &str,
    store: Arc<S>,
    decode: impl Fn(pb::watch_event::Object) -> Option<Result<(String, U), String>> + Send,
) {
    let mut state: Option<WatchState<U>> = Some(WatchState::Empty);
    let mut on = move |event: Option<pb::WatchEvent>| -> Option<String> {
        let Some(ev) = event else {
            state = Some(WatchState::Empty);
            return None;
        };
        let kind = Type::try_from(ev.r#type).unwrap_or(Type::Unspecified);
        let object = match ev.object.and_then(&decode) {
            Some(Ok(o)) => Some(o),
            Some(Err(e)) => {
                tracing::warn!(kind = what, error = %e, "skipping an object that does not decode");
                None
            }
            None => None,
        };
        let (next, change) = step(state.take().unwrap_or(WatchState::Empty), kind, ev.resource_version, object);
        let resume = match &next {
            WatchState::Watching(rv) => Some(rv.clone()),
            _ => None,
        };
        state = Some(next);
        store.apply(change);
        resume
    };
    watch_loop(client, filter, request, what, &mut on).await
}

/// What [`watch_loop`] calls with each event (and `None` to forget what was listed); it answers
/// the version to resume after, that of a live watch.
type OnEvent<'a> = dyn FnMut(Option<pb::WatchEvent>) -> Option<String> + Send + 'a;

/// Watches forever: reconnects with backoff, resumes after the last version `on` returned,
/// relists when there is none or it has expired. `on` gets every event, and `None` when what it
/// holds must be forgotten (a new snapshot follows). A boxed future made here: an `async fn`'s
/// body would be compiled again in each crate whose reflectors call it.
#[inline(never)]
fn watch_loop<'a>(
    client: ApiClient,
    filter: Filter,
    request: pb::WatchRequest,
    what: &'a str,
    on: &'a mut OnEvent<'a>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
    Box::pin(watch_forever(client, filter, request, what, on))
}

async fn watch_forever(client: ApiClient, filter: Filter, request: pb::WatchRequest, what: &str, on: &mut OnEvent<'_>) {
    let mut resume: Option<String> = None;
    let mut backoff = Duration::from_millis(200);
    loop {
        if resume.is_none() {
            on(None);
        }
        let req = pb::WatchRequest {
            namespace: filter.namespace.clone(),
            label_selector: filter.label_selector.clone(),
            field_selector: filter.field_selector.clone(),
            resource_version: resume.clone().unwrap_or_default(),
            ..request.clone()
        };
        let mut watch = client.watch.clone();
        match watch.watch(req).await {
            Ok(resp) => {
                let mut stream = resp.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(ev)) => {
                            backoff = Duration::from_millis(200);
                            resume = on(Some(ev));
                        }
                        Ok(None) => break,
                        Err(status) => {
                            if status.code() == tonic::Code::OutOfRange {
                                tracing::info!(kind = what, "watch version expired; relisting");
                                resume = None;
                            } else {
                                tracing::warn!(kind = what, error = %status, "watch failed; reconnecting");
                            }
                            break;
                        }
                    }
                }
            }
            Err(status) => {
                if status.code() == tonic::Code::OutOfRange {
                    resume = None;
                }
                // A custom resource whose CRD is not installed: quietly, until it is.
                if status.code() == tonic::Code::NotFound {
                    tracing::debug!(kind = what, error = %status, "not served; retrying in {backoff:?}");
                } else {
                    tracing::warn!(kind = what, error = %status, "cannot watch; retrying in {backoff:?}");
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::k8s_openapi::api::core::v1 as core;
    use serde_json::json;

    fn pod(name: &str) -> core::Pod {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}})).unwrap()
    }

    fn keyed(p: core::Pod) -> (String, core::Pod) {
        (p.key(), p)
    }

    #[test]
    fn readers_learn_which_keys_changed_or_that_they_must_list_again() {
        let store: Arc<Store<core::Pod>> = Store::new();
        assert_eq!(store.changed_since(0), (0, Changed::Keys(vec![])));
        store.apply(Change::Replace([keyed(pod("a"))].into()));
        // A reader from before the replacement reads everything.
        assert_eq!(store.changed_since(0), (1, Changed::All));
        store.apply(apply_object(pod("b")));
        store.apply(Change::Delete("default/a".into()));
        store.apply(Change::None);
        assert_eq!(store.changed_since(1), (3, Changed::Keys(vec!["default/b".into(), "default/a".into()])));
        assert_eq!(store.changed_since(2), (3, Changed::Keys(vec!["default/a".into()])));
        assert_eq!(store.changed_since(3), (3, Changed::Keys(vec![])));
        // The log holds LOG_LEN keys: a reader further behind starts over.
        for i in 0..LOG_LEN {
            store.apply(apply_object(pod(&format!("p{i}"))));
        }
        let now = 3 + LOG_LEN as u64;
        assert_eq!(store.changed_since(2), (now, Changed::All));
        match store.changed_since(3) {
            (n, Changed::Keys(k)) => assert_eq!((n, k.len()), (now, LOG_LEN)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn snapshot_is_swapped_in_whole_then_events_apply() {
        let s = WatchState::Empty;
        let (s, c) = step(s, Type::Added, "5".into(), Some(keyed(pod("a"))));
        assert_eq!(c, Change::None);
        let (s, c) = step(s, Type::Added, "6".into(), Some(keyed(pod("b"))));
        assert_eq!(c, Change::None);
        let (s, c) = step(s, Type::Synced, "6".into(), None);
        let Change::Replace(all) = c else { panic!("replace") };
        assert_eq!(all.keys().cloned().collect::<Vec<_>>(), vec!["default/a", "default/b"]);
        assert_eq!(s, WatchState::Watching("6".into()));
        let (s, c) = step(s, Type::Modified, "7".into(), Some(keyed(pod("a"))));
        assert_eq!(c, Change::Apply("default/a".into(), pod("a")));
        let (s, c) = step(s, Type::Deleted, "8".into(), Some(keyed(pod("b"))));
        assert_eq!(c, Change::Delete("default/b".into()));
        let (s, c) = step(s, Type::Bookmark, "9".into(), None);
        assert_eq!((s, c), (WatchState::Watching("9".into()), Change::None));
    }

    #[test]
    fn an_empty_snapshot_still_syncs_and_stray_events_are_ignored() {
        let (s, c) = step::<core::Pod>(WatchState::Empty, Type::Synced, "3".into(), None);
        assert_eq!((s, c), (WatchState::Watching("3".into()), Change::Replace(BTreeMap::new())));
        let (s, c) = step(WatchState::Empty, Type::Deleted, "4".into(), Some(keyed(pod("x"))));
        assert_eq!((s, c), (WatchState::Empty, Change::None));
    }

    #[tokio::test]
    async fn the_store_signals_changes_and_sync() {
        let store = Store::<core::Pod>::new();
        let mut changes = store.changes();
        store.apply(Change::Replace([("default/a".to_string(), pod("a"))].into()));
        store.wait_synced().await;
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        store.apply(Change::Delete("default/a".into()));
        assert!(changes.has_changed().unwrap());
        assert!(store.list().is_empty());
    }
}
