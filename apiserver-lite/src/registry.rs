//! The registry: create, update, patch, delete, get and list for every kind, shared by REST,
//! gRPC and the in-server controllers. Each write is: take the writer lock → read → decode,
//! default, validate and allocate (pure functions from `api` plus the allocators) → one store
//! commit → release the lock → flush and fdatasync (shared with concurrent writers) → answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use api::alloc::Exhausted;
use api::k8s_openapi::api::core::v1::Node;
use api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use api::patch::PatchType;
use api::selector::{FieldSelector, LabelSelector};
use api::validation::{self as v, FieldPath};
use api::Codec;
use api::{ApiObject, DeleteContext, DeletePlan, Kind};
use serde_json::{json, Value};

use crate::alloc::{self, Allocators, Claiming, Claims, Ranges};
use crate::error::ApiError;
use crate::store::{Op, Store, WriteGuard};

/// How unknown fields in a body are treated (`fieldValidation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(s: Option<&str>) -> Result<Self, ApiError> {
        match s {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(ApiError::BadRequest(format!(
                "fieldValidation parameter unsupported: {other}; supported values: Ignore, Warn, Strict"
            ))),
        }
    }
}

/// Options of a write request.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions {
    pub field_validation: FieldValidation,
    pub dry_run: bool,
    /// Who writes, for `metadata.managedFields`; `None` (the controllers' own writes) leaves
    /// ownership as it was.
    pub field_manager: Option<String>,
    /// Server-side apply: take conflicting fields from their managers instead of failing.
    pub force: bool,
    /// Set by [`Registry::patch`] for server-side apply: the applied configuration.
    pub(crate) apply_config: Option<Value>,
    /// The version a custom object was written in (its schema applies); None: the storage one.
    pub served_version: Option<String>,
}

/// The main resource or its `/status` subresource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subresource {
    Main,
    Status,
    /// `…/scale` of Deployments and ReplicaSets: an autoscaling/v1 Scale view of `spec.replicas`.
    Scale,
    /// `pods/NAME/eviction`: a policy/v1 Eviction, which deletes the pod (`kubectl drain`).
    Eviction,
    /// `pods/NAME/log`: the container's log, from its node agent.
    Log,
    /// `pods/NAME/ephemeralcontainers`: only `spec.ephemeralContainers` changes (`kubectl debug`).
    EphemeralContainers,
}

/// Options of a delete request.
#[derive(Clone, Debug, Default)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    /// `dryRun=All`: everything a delete checks, nothing written; the answer is the object as
    /// the delete would leave it.
    pub dry_run: bool,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    /// `propagationPolicy: Orphan` (`kubectl delete --cascade=orphan`): dependents lose their
    /// owner reference to the deleted object in the same write, so nothing collects them.
    /// Background and Foreground both let the controllers collect dependents afterwards.
    pub orphan: bool,
}

/// The result of a write.
#[derive(Debug)]
pub struct Outcome {
    pub object: Value,
    /// `object`'s JSON as the store wrote it (None when nothing was written: a dry run).
    pub json: Option<bytes::Bytes>,
    pub created: bool,
    /// `Warning` headers for the client (unknown fields with fieldValidation=Warn).
    pub warnings: Vec<String>,
}

impl Outcome {
    fn of(w: Option<crate::store::Written>, created: bool, warnings: Vec<String>) -> Outcome {
        let (object, json) = w.map(|w| (w.object, Some(w.json))).unwrap_or_default();
        Outcome { object, json, created, warnings }
    }
}

pub struct Registry {
    pub store: Arc<Store>,
    alloc: Mutex<Allocators>,
    /// Which Event a repeated report goes into.
    pub(crate) events: crate::controllers::events::Correlator,
    /// What the kubelets' resource metrics say (metrics.k8s.io, the HPA controller).
    pub metrics: crate::resource_metrics::MetricsStore,
    /// The custom resources that established CRDs serve.
    pub crds: crate::crd::Crds,
    /// Creates admitted and waiting for the writer lock (see [`Registry::create`]).
    queued_creates: Mutex<Vec<Queued>>,
}

fn now() -> Time {
    // Kubernetes timestamps have second precision.
    let ts = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(ts.as_second()).unwrap_or(ts))
}

/// A timestamp as stored: RFC 3339 with second precision.
fn time_json(t: jiff::Timestamp) -> Value {
    serde_json::to_value(Time(jiff::Timestamp::from_second(t.as_second()).unwrap_or(t))).unwrap_or_default()
}

fn now_json() -> Value {
    serde_json::to_value(now()).unwrap_or_default()
}

/// One page of a list.
pub struct Page {
    pub items: Vec<Value>,
    /// The resourceVersion the page shows.
    pub rv: u64,
    /// The continue token of the next page, if there is one.
    pub next: Option<String>,
    /// How many objects the pages after this one hold (without selectors).
    pub remaining: Option<i64>,
}

/// A continue token as the real server writes one: URL-safe base64 of
/// `{"v":"meta.k8s.io/v1","rv":RV,"start":"KEY\u0000"}`.
fn encode_continue(rv: u64, last_key: &str) -> String {
    use base64::Engine;
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{last_key}\u{0}")});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// (resourceVersion, the last key served) of a continue token.
fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
    use base64::Engine;
    let bad = |why: &str| ApiError::BadRequest(format!("invalid continue token: continue key is not valid: {why}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|e| bad(&format!("illegal base64 data: {e}")))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|e| bad(&e.to_string()))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad(&format!(
            "server does not recognize this encoded version {:?}",
            v["v"].as_str().unwrap_or("")
        )));
    }
    let rv = v["rv"]
        .as_u64()
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let start = v["start"].as_str().unwrap_or("");
    let key = start.strip_suffix('\u{0}').unwrap_or(start);
    if key.is_empty() {
        return Err(bad("encoded start key empty"));
    }
    if key.split('/').any(|p| p == ".." || p == ".") || key.starts_with('/') {
        return Err(bad(key));
    }
    Ok((rv, key.to_string()))
}

/// The object's `metadata.finalizers`.
fn finalizers(obj: &Value) -> impl Iterator<Item = &str> {
    obj["metadata"]["finalizers"].as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn has_finalizers(obj: &Value) -> bool {
    finalizers(obj).next().is_some()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata").and_then(|m| m.get(field)).and_then(Value::as_str)
}

/// `namespace/name` of an object for messages and keys.
fn obj_ns(obj: &Value) -> String {
    meta_str(obj, "namespace").unwrap_or("").to_string()
}

impl Registry {
    pub fn open(store: Arc<Store>, ranges: Ranges) -> Result<Registry, ApiError> {
        let used = store.allocations()?;
        Ok(Registry {
            store,
            alloc: Mutex::new(Allocators::new(ranges, used)),
            events: Default::default(),
            metrics: Default::default(),
            crds: Default::default(),
            queued_creates: Default::default(),
        })
    }

    pub fn ranges(&self) -> Ranges {
        self.alloc.lock().map(|a| a.ranges.clone()).unwrap_or_default()
    }

    // === reads ===

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.store.get(kind, ns, name)?.ok_or_else(|| ApiError::not_found(kind, name))
    }

    pub fn list(
        &self,
        kind: Kind,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> Result<(Vec<Value>, u64), ApiError> {
        let (items, rv) = self.store.list(kind, ns)?;
        let items = items.into_iter().filter(|o| labels.matches(labels_of(o).as_ref()) && fields.matches(o)).collect();
        Ok((items, rv))
    }

    /// One page of a list (`limit`, `continue`), as the real server pages: a first page of the
    /// current objects; the pages after it of the objects as they were at the first page's
    /// resourceVersion (rebuilt by undoing the event log's later changes), in key order after
    /// the token's key. A token older than the event log is 410 Expired, as a compacted etcd
    /// answers. `limit` 0: the rest at once.
    pub fn list_page(
        &self,
        kind: Kind,
        ns: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
        limit: usize,
        token: Option<&str>,
    ) -> Result<Page, ApiError> {
        let key = |o: &Value| {
            let n = meta_str(o, "name").unwrap_or("");
            match kind.info().namespaced {
                true => format!("{}/{n}", obj_ns(o)),
                false => n.to_string(),
            }
        };
        // The first page of everything (what every `kubectl get` asks): the store's keys are in
        // the page's order already, so only the page's objects are parsed.
        if token.is_none() && labels.is_empty() && fields.is_empty() && limit > 0 {
            let (raw, rv) = self.store.list_raw(kind, ns)?;
            let more = raw.len() > limit;
            let items: Vec<Value> =
                raw.iter().take(limit).map(|b| crate::store::parse_object(b)).collect::<Result<_, _>>()?;
            let next = if more { items.last().map(|o| encode_continue(rv, &key(o))) } else { None };
            let remaining = if more { Some((raw.len() - limit) as i64) } else { None };
            return Ok(Page { items, rv, next, remaining });
        }
        let (items, current) = self.store.list(kind, ns)?;
        let key = |o: &Value| {
            let n = meta_str(o, "name").unwrap_or("");
            match kind.info().namespaced {
                true => format!("{}/{n}", obj_ns(o)),
                false => n.to_string(),
            }
        };
        let (rv, start, items) = match token {
            None => (current, String::new(), items),
            Some(t) => {
                let (rv, start) = decode_continue(t)?;
                if rv > current {
                    return Err(ApiError::BadRequest(format!(
                        "invalid continue token: continue key is not valid: resource version {rv} is in the future"
                    )));
                }
                let events = self.store.events_since(rv, current).map_err(|_| ApiError::ExpiredContinue)?;
                let mut at: BTreeMap<String, Value> = items.into_iter().map(|o| (key(&o), o)).collect();
                for ev in events.iter().rev().filter(|e| e.kind == kind) {
                    let obj = ev.object();
                    if ns.is_some_and(|n| obj_ns(&obj) != n) {
                        continue;
                    }
                    match (ev.type_, ev.prev()) {
                        (crate::store::EventType::Added, _) => {
                            at.remove(&key(&obj));
                        }
                        (_, Some(prev)) => {
                            at.insert(key(&prev), prev);
                        }
                        (crate::store::EventType::Deleted, None) => {
                            at.insert(key(&obj), obj);
                        }
                        // The state before a change is not known (events read back after a
                        // restart): no consistent page can be made.
                        (crate::store::EventType::Modified, None) => return Err(ApiError::ExpiredContinue),
                    }
                }
                (rv, start, at.into_values().collect())
            }
        };
        let mut matching: Vec<Value> = items
            .into_iter()
            .filter(|o| start.is_empty() || key(o) > start)
            .filter(|o| labels.matches(labels_of(o).as_ref()) && fields.matches(o))
            .collect();
        matching.sort_by_key(|o| key(o));
        let more = limit > 0 && matching.len() > limit;
        let remaining = if more { matching.len() - limit } else { 0 };
        if more {
            matching.truncate(limit);
        }
        let next = more.then(|| encode_continue(rv, &key(matching.last().expect("limit > 0"))));
        // The count is only known without selectors (the real server's rule too).
        let remaining = (more && labels.is_empty() && fields.is_empty()).then_some(remaining as i64);
        Ok(Page { items: matching, rv, next, remaining })
    }

    // === writes ===

    /// Creates an object. `ns` is the namespace of the URL (None for cluster-scoped kinds).
    pub async fn create(
        &self,
        kind: Kind,
        ns: Option<&str>,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        if opts.dry_run {
            // Nothing is committed: nothing to share with other creates.
            return self.create_serially(kind, ns, body, opts).await;
        }
        // Admission runs before the writer lock, as kube-apiserver admits before its storage's
        // transaction, so concurrent creates admit on both cores. The admitted create then
        // waits in a queue, and whichever create takes the lock next commits every one queued
        // in one batch: one log write for all of them instead of one each (see
        // `commit_queued`). A create whose admission failed, or went stale while it waited, is
        // done again under the lock from the request's body, as every create used to be.
        let Ok(prepared) = self.prepare_create(kind, ns, body.clone(), opts) else {
            return self.create_serially(kind, ns, body, opts).await;
        };
        let (done, mut outcome) = tokio::sync::oneshot::channel();
        self.queue().push(Queued { prepared, done });
        // Either another create's commit settles ours first (no need for the lock then), or
        // this one takes the lock and commits what is queued. Once it has the lock, ours is
        // settled: it was queued before, so the holder that took it out of the queue (an
        // earlier one, or this one just now) settled it before letting go.
        let settled = tokio::select! {
            biased;
            settled = &mut outcome => settled.ok().flatten(),
            g = self.store.lock() => {
                self.commit_queued(&g);
                outcome.try_recv().ok().flatten()
            }
        };
        let out = match settled {
            Some(pending) => pending,
            None => {
                let g = self.store.lock().await;
                self.create_locked(&g, kind, ns, body, opts)?
            }
        };
        self.finish(out).await
    }

    /// The queue of admitted creates. Nothing panics while holding it, and a poisoned one is
    /// still whole (pushes and takes only), so it is used as it is.
    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Queued>> {
        self.queued_creates.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A create done wholly under the writer lock.
    async fn create_serially(
        &self,
        kind: Kind,
        ns: Option<&str>,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        let g = self.store.lock().await;
        let out = self.create_locked(&g, kind, ns, body, opts)?;
        drop(g);
        self.finish(out).await
    }

    /// Commits every queued create that still holds (see [`Registry::still_admissible`]) in one
    /// batch, in the order they were queued, and settles each: `Some` committed, `None` to be
    /// done again under the lock (stale, or the batch failed: each then meets its own error).
    fn commit_queued(&self, g: &WriteGuard<'_>) {
        let queued = std::mem::take(&mut *self.queue());
        if queued.is_empty() {
            return;
        }
        let mut names = std::collections::HashSet::new();
        let mut claimed = std::collections::HashSet::new();
        let mut ops = Vec::new();
        let mut batch = Vec::new();
        for Queued { prepared: p, done } in queued {
            // Two queued creates of one name, or claiming one value: the first one wins.
            let fresh = p.claims.added.iter().all(|k| !claimed.contains(k))
                && self.still_admissible(&p).unwrap_or(false)
                && names.insert((p.kind, p.ns.clone(), p.name.clone()));
            if !fresh {
                let _ = done.send(None);
                continue;
            }
            claimed.extend(p.claims.added.iter().cloned());
            let PreparedCreate { kind, admitted, claims, .. } = p;
            let Admitted { object, warnings, before, after } = admitted;
            let (write, released, added) = write_ops(kind, None, object, &before, &after, &claims);
            ops.extend(write);
            batch.push((claims.owner, released, added, warnings, done));
        }
        if batch.is_empty() {
            return;
        }
        match self.store.commit(g, ops) {
            Ok((written, rv)) => {
                for ((owner, released, added, warnings, done), w) in batch.into_iter().zip(written) {
                    self.record_allocations(&owner, &released, &added);
                    let outcome = Outcome { object: w.object, json: Some(w.json), created: true, warnings };
                    let _ = done.send(Some(Pending { rv: Some(rv), outcome }));
                }
            }
            Err(_) => {
                for (.., done) in batch {
                    let _ = done.send(None);
                }
            }
        }
    }

    /// Replaces an object (PUT), or its status.
    pub async fn update(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        body: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        let g = self.store.lock().await;
        let old = self.store.get(kind, ns.unwrap_or(""), name)?.ok_or_else(|| ApiError::not_found(kind, name))?;
        check_body_identity(kind, ns, name, &body)?;
        let out = self.update_locked(&g, kind, old, body, sub, opts)?;
        drop(g);
        self.finish(out).await
    }

    /// Patches an object; server-side apply creates it when missing.
    #[allow(clippy::too_many_arguments)]
    pub async fn patch(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        ty: PatchType,
        patch: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Outcome, ApiError> {
        let g = self.store.lock().await;
        let applied;
        let opts = if ty == PatchType::Apply && sub == Subresource::Main {
            applied = WriteOptions { apply_config: Some(patch.clone()), ..opts.clone() };
            &applied
        } else {
            opts
        };
        let out = match self.store.get(kind, ns.unwrap_or(""), name)? {
            None if ty == PatchType::Apply && sub == Subresource::Main => {
                check_body_identity(kind, ns, name, &patch)?;
                let mut body = patch;
                ensure_object_shape(&mut body)?;
                body["metadata"]["name"] = json!(name);
                self.create_locked(&g, kind, ns, body, opts)?
            }
            None => return Err(ApiError::not_found(kind, name)),
            Some(old) => {
                let mut new = if ty == PatchType::Apply && sub == Subresource::Main {
                    check_body_identity(kind, ns, name, &patch)?;
                    let manager = opts.field_manager.as_deref().unwrap_or("");
                    let model = self.custom_model(kind);
                    let lists = lists_of(model.as_deref(), opts);
                    let (pruned, conflicts) = api::managed::prepare_apply(&old, &patch, manager, lists);
                    if !conflicts.is_empty() && !opts.force {
                        return Err(apply_conflict(&conflicts));
                    }
                    api::patch::merge_applied(&pruned, &patch, lists)?
                } else {
                    api::patch::apply_patch(ty, &old, &patch)?
                };
                ensure_object_shape(&mut new)?;
                if ty == PatchType::Apply {
                    // Apply bodies carry no resourceVersion precondition unless they say so.
                    if patch.pointer("/metadata/resourceVersion").is_none() {
                        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                    }
                }
                self.update_locked(&g, kind, old, new, sub, opts)?
            }
        };
        drop(g);
        self.finish(out).await
    }

    /// Deletes an object and returns it (graceful deletions return it with deletionTimestamp).
    pub async fn delete(
        &self,
        kind: Kind,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let g = self.store.lock().await;
        let old = self.store.get(kind, ns.unwrap_or(""), name)?.ok_or_else(|| ApiError::not_found(kind, name))?;
        if let Some(uid) = &opts.precondition_uid {
            if meta_str(&old, "uid") != Some(uid) {
                return Err(ApiError::Conflict { resource: kind.qualified_resource(), name: name.into(), kind });
            }
        }
        if let Some(rv) = &opts.precondition_rv {
            if meta_str(&old, "resourceVersion") != Some(rv) {
                return Err(ApiError::Conflict { resource: kind.qualified_resource(), name: name.into(), kind });
            }
        }
        let out = self.delete_locked(&g, kind, old, opts)?;
        drop(g);
        Ok(self.finish(out).await?.object)
    }

    /// Changes a workload's `spec.replicas` through its Scale: `change` gets the current Scale
    /// and returns the wanted one (a PUT body, or the current one patched). Returns the new Scale.
    pub async fn update_scale(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        change: impl FnOnce(&Value) -> Result<Value, ApiError>,
        opts: &WriteOptions,
    ) -> Result<Value, ApiError> {
        let g = self.store.lock().await;
        let old = self.store.get(kind, ns, name)?.ok_or_else(|| ApiError::not_found(kind, name))?;
        let custom = self.custom_scale(kind);
        let view = |o: &Value| match &custom {
            Some(paths) => crate::crd::scale_of(o, paths),
            None => scale_of(o),
        };
        let wanted = change(&view(&old))?;
        if let Some(rv) = wanted.pointer("/metadata/resourceVersion").and_then(Value::as_str).filter(|r| !r.is_empty())
        {
            if Some(rv) != meta_str(&old, "resourceVersion") {
                return Err(ApiError::Conflict { resource: kind.qualified_resource(), name: name.into(), kind });
            }
        }
        let replicas = match wanted.pointer("/spec/replicas") {
            None | Some(Value::Null) => 0,
            Some(n) => match n.as_i64().filter(|n| (0..=i64::from(i32::MAX)).contains(n)) {
                Some(n) => n,
                None => {
                    let path = FieldPath::root("spec").child("replicas");
                    let cause = v::invalid(&path, n.to_string().as_str(), "must be greater than or equal to 0");
                    return Err(ApiError::invalid(kind, name, vec![cause]));
                }
            },
        };
        let mut new = old.clone();
        match &custom {
            Some(paths) => crate::crd::set_path(&mut new, &paths.spec_replicas_path, json!(replicas)),
            None => new["spec"]["replicas"] = json!(replicas),
        }
        let out = self.update_locked(&g, kind, old, new, Subresource::Main, opts)?;
        drop(g);
        Ok(view(&self.finish(out).await?.object))
    }

    /// The scale subresource of a custom kind (its CRD's paths), if it is one.
    pub fn custom_scale(
        &self,
        kind: Kind,
    ) -> Option<api::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceSubresourceScale>
    {
        let Kind::Custom(c) = kind else { return None };
        self.crds.get(c)?.version(None)?.scale.clone()
    }

    /// Waits for durability of a committed write and returns its outcome.
    async fn finish(&self, out: Pending) -> Result<Outcome, ApiError> {
        if let Some(rv) = out.rv {
            self.store.sync(rv).await?;
        }
        Ok(out.outcome)
    }

    // === locked internals (also used by controllers) ===

    pub(crate) fn create_locked(
        &self,
        g: &WriteGuard<'_>,
        kind: Kind,
        ns: Option<&str>,
        body: Value,
        opts: &WriteOptions,
    ) -> Result<Pending, ApiError> {
        let p = self.prepare_create(kind, ns, body, opts)?;
        self.commit_write(g, p.kind, None, p.admitted, true, p.claims, opts)
    }

    /// Whether a create admitted without the writer lock may still be committed as it is: its
    /// name is still free, its namespace still takes new objects, and the values it claimed are
    /// still unowned. Call with the writer lock held (every commit takes it, so nothing of these
    /// changes until the commit).
    fn still_admissible(&self, p: &PreparedCreate) -> Result<bool, ApiError> {
        if self.store.contains(p.kind, &p.ns, &p.name)? {
            return Ok(false);
        }
        if p.kind.info().namespaced && self.check_namespace_accepts(&p.ns).is_err() {
            return Ok(false);
        }
        let table = self.alloc.lock().map_err(|_| ApiError::internal("allocator lock poisoned"))?;
        Ok(p.claims.added.iter().all(|k| table.owner_of(k).is_none_or(|o| o == p.claims.owner)))
    }

    /// Everything a create does before its commit: the object's name, uid and timestamps,
    /// admission (defaults, validation, allocations claimed against the table as it is now)
    /// and its managedFields. Needs no writer lock; [`Registry::still_admissible`] tells under
    /// the lock whether the outcome still holds.
    fn prepare_create(
        &self,
        kind: Kind,
        ns: Option<&str>,
        mut body: Value,
        opts: &WriteOptions,
    ) -> Result<PreparedCreate, ApiError> {
        ensure_object_shape(&mut body)?;
        check_type_meta(kind, &body)?;
        let info = kind.info();
        let ns = if info.namespaced {
            let url_ns = ns.unwrap_or("default");
            match meta_str(&body, "namespace") {
                Some(b) if !b.is_empty() && b != url_ns => {
                    return Err(ApiError::BadRequest(
                        "the namespace of the provided object does not match the namespace sent on the request".into(),
                    ))
                }
                _ => {}
            }
            body["metadata"]["namespace"] = json!(url_ns);
            self.check_namespace_accepts(url_ns)?;
            url_ns.to_string()
        } else {
            if let Some(m) = body["metadata"].as_object_mut() {
                m.remove("namespace");
            }
            String::new()
        };
        let name = match meta_str(&body, "name").filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None => match meta_str(&body, "generateName").filter(|n| !n.is_empty()) {
                Some(prefix) => {
                    let prefix = prefix.to_string();
                    loop {
                        let candidate = format!("{prefix}{}", random_suffix(5));
                        if self.store.get(kind, &ns, &candidate)?.is_none() {
                            break candidate;
                        }
                    }
                }
                None => {
                    let causes = vec![v::required(
                        &FieldPath::root("metadata").child("name"),
                        "name or generateName is required",
                    )];
                    return Err(ApiError::invalid(kind, "", causes));
                }
            },
        };
        body["metadata"]["name"] = json!(name);
        if self.store.get(kind, &ns, &name)?.is_some() {
            return Err(ApiError::AlreadyExists { resource: kind.qualified_resource(), name, kind });
        }
        let meta = body["metadata"].as_object_mut().expect("metadata is an object");
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), now_json());
        for k in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"] {
            meta.remove(k);
        }
        if kind.info().has_generation {
            meta.insert("generation".into(), json!(1));
        }
        self.admission_plugins(kind, &mut body)?;
        let owner = alloc::owner(kind, &ns, &name);
        let mut claims = Claims::new(owner.clone());
        let mut admitted = api::with_kind_type!(kind,
            T => self.admit::<T>(body, None, Subresource::Main, opts, &mut claims)?,
            custom c => self.admit_custom(c, body, None, Subresource::Main, opts)?);
        let model = self.custom_model(kind);
        set_managed_fields(kind, &mut admitted.object, None, Subresource::Main, opts, lists_of(model.as_deref(), opts));
        Ok(PreparedCreate { kind, ns, name, admitted, claims })
    }

    /// What kube-apiserver's default admission plugins add to a new object: a claim without
    /// a class gets the default StorageClass (DefaultStorageClass; the newest of several
    /// defaults), claims and volumes get the finalizer that keeps them while in use
    /// (StorageObjectInUseProtection).
    fn admission_plugins(&self, kind: Kind, body: &mut Value) -> Result<(), ApiError> {
        let protection = match kind {
            Kind::PersistentVolumeClaim => {
                if body.pointer("/spec/storageClassName").is_none_or(Value::is_null) {
                    let (classes, _) = self.store.list(Kind::StorageClass, None)?;
                    let default = crate::controllers::volumes::default_class(&classes);
                    if let (Some(class), Some(spec)) = (default, body.get_mut("spec").and_then(Value::as_object_mut)) {
                        spec.insert("storageClassName".into(), class["metadata"]["name"].clone());
                    }
                }
                api::kinds::persistentvolumeclaim::PROTECTION_FINALIZER
            }
            Kind::PersistentVolume => api::kinds::persistentvolume::PROTECTION_FINALIZER,
            _ => return Ok(()),
        };
        let mut list: Vec<Value> = body["metadata"]["finalizers"].as_array().cloned().unwrap_or_default();
        if !list.iter().any(|f| f == protection) {
            list.push(json!(protection));
        }
        body["metadata"]["finalizers"] = Value::Array(list);
        Ok(())
    }

    pub(crate) fn update_locked(
        &self,
        g: &WriteGuard<'_>,
        kind: Kind,
        old: Value,
        mut new: Value,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Pending, ApiError> {
        ensure_object_shape(&mut new)?;
        check_type_meta(kind, &new)?;
        let name = meta_str(&old, "name").unwrap_or("").to_string();
        if let Some(rv) = meta_str(&new, "resourceVersion").filter(|r| !r.is_empty()) {
            if Some(rv) != meta_str(&old, "resourceVersion") {
                return Err(ApiError::Conflict { resource: kind.qualified_resource(), name, kind });
            }
        }
        if sub == Subresource::Status {
            // Only .status changes through the status subresource.
            let status = new.get("status").cloned();
            new = old.clone();
            match status {
                Some(s) => new["status"] = s,
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        } else if kind.info().has_status {
            // ...and never through the main resource (keeps client-side apply from wiping it).
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(o) = new.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
        // A pod's ephemeral containers change only through their subresource, which changes
        // nothing else (the real pod strategy).
        if kind == Kind::Pod {
            let ephemeral = |o: &Value| o.pointer("/spec/ephemeralContainers").cloned();
            let (keep, take) = match sub {
                Subresource::EphemeralContainers => (old.clone(), ephemeral(&new)),
                _ => (new.clone(), ephemeral(&old)),
            };
            new = keep;
            match take {
                Some(e) => new["spec"]["ephemeralContainers"] = e,
                None => {
                    if let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) {
                        spec.remove("ephemeralContainers");
                    }
                }
            }
            if sub == Subresource::EphemeralContainers {
                if let Some(rv) = meta_str(&old, "resourceVersion") {
                    new["metadata"]["resourceVersion"] = json!(rv);
                }
            }
        }
        // Identity cannot change: a body (or a patch result) naming another object is the
        // client's mistake, answered as the real server answers it. Empty means "as stored".
        let old_ns = obj_ns(&old);
        check_body_identity(kind, Some(old_ns.as_str()).filter(|n| !n.is_empty()), &name, &new)?;
        if let (Some(n), Some(o)) = (meta_str(&new, "uid").filter(|u| !u.is_empty()), meta_str(&old, "uid")) {
            if n != o {
                let path = api::validation::FieldPath::root("metadata").child("uid");
                return Err(ApiError::invalid(
                    kind,
                    &name,
                    vec![api::validation::invalid(&path, n, "field is immutable")],
                ));
            }
        }
        // System fields stay as stored.
        for k in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old["metadata"].get(k) {
                Some(v) => new["metadata"][k] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(k);
                    }
                }
            }
        }
        if old["metadata"].get("deletionTimestamp").is_some() {
            let before: BTreeSet<&str> = finalizers(&old).collect();
            let added: Vec<&str> = finalizers(&new).filter(|f| !before.contains(f)).collect();
            if !added.is_empty() {
                let path = api::validation::FieldPath::root("metadata").child("finalizers");
                let message = format!(
                    "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    added.iter().map(|f| format!("{f:?}")).collect::<Vec<_>>().join(", ")
                );
                return Err(ApiError::invalid(kind, &name, vec![api::validation::forbidden(&path, &message)]));
            }
        }
        let owner = alloc::owner(kind, &obj_ns(&old), &name);
        let mut claims = Claims::new(owner);
        let mut admitted = api::with_kind_type!(kind,
            T => self.admit::<T>(new, Some(&old), sub, opts, &mut claims)?,
            custom c => self.admit_custom(c, new, Some(&old), sub, opts)?);
        let model = self.custom_model(kind);
        set_managed_fields(kind, &mut admitted.object, Some(&old), sub, opts, lists_of(model.as_deref(), opts));
        let object = &mut admitted.object;
        // No change: no write, no event, same resourceVersion (as the real server does).
        object["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if *object == old {
            let outcome = Outcome { object: admitted.object, json: None, created: false, warnings: admitted.warnings };
            return Ok(Pending { rv: None, outcome });
        }
        // Custom objects count a change of anything but metadata and status.
        let spec_changed = match kind {
            Kind::Custom(_) => {
                let body = |o: &Value| -> Value {
                    let mut o = o.clone();
                    if let Some(m) = o.as_object_mut() {
                        m.remove("metadata");
                        m.remove("status");
                    }
                    o
                };
                body(&old) != body(object)
            }
            _ => old.get("spec") != object.get("spec"),
        };
        if spec_changed {
            if let Some(gen) = old["metadata"]["generation"].as_i64() {
                object["metadata"]["generation"] = json!(gen + 1);
            }
        }
        // The last finalizer of an object whose deletion is due taken out: it goes now.
        if has_finalizers(&old)
            && !has_finalizers(object)
            && object["metadata"].get("deletionTimestamp").is_some()
            && object["metadata"]["deletionGracePeriodSeconds"].as_i64().unwrap_or(0) == 0
            && !opts.dry_run
        {
            let last = admitted.object;
            return self.finalize_delete(g, kind, last);
        }
        self.commit_write(g, kind, Some(old), admitted, false, claims, opts)
    }

    #[allow(clippy::too_many_arguments)]
    fn commit_write(
        &self,
        g: &WriteGuard<'_>,
        kind: Kind,
        old: Option<Value>,
        admitted: Admitted,
        created: bool,
        claims: Claims,
        opts: &WriteOptions,
    ) -> Result<Pending, ApiError> {
        let Admitted { object, warnings, before, after } = admitted;
        if opts.dry_run {
            return Ok(Pending { rv: None, outcome: Outcome { object, json: None, created, warnings } });
        }
        let (ops, released, added) = write_ops(kind, old, object, &before, &after, &claims);
        let (mut written, rv) = self.store.commit(g, ops)?;
        self.record_allocations(&claims.owner, &released, &added);
        Ok(Pending { rv: Some(rv), outcome: Outcome::of(written.pop(), created, warnings) })
    }

    /// Records in the allocation table what a committed write released and took.
    fn record_allocations(&self, owner: &str, released: &BTreeSet<String>, added: &BTreeSet<String>) {
        if let Ok(mut a) = self.alloc.lock() {
            a.apply(owner, released, added);
        }
    }

    pub(crate) fn delete_locked(
        &self,
        g: &WriteGuard<'_>,
        kind: Kind,
        old: Value,
        opts: &DeleteOptions,
    ) -> Result<Pending, ApiError> {
        let name = meta_str(&old, "name").unwrap_or("").to_string();
        let node_ready = |node: &str| self.node_is_ready(node).unwrap_or(false);
        let ctx = DeleteContext {
            grace_period_seconds: opts.grace_period_seconds,
            now: jiff::Timestamp::now(),
            node_ready: &node_ready,
        };
        // A stored object that does not decode any more can still be removed.
        let mut plan = api::with_kind_type!(kind,
            T => api::decode::<T>(&old).map(|o| o.deletion(&ctx)).unwrap_or(DeletePlan::Remove),
            custom _c => DeletePlan::Remove);
        // Finalizers hold an object that would go now: it is marked and stays until the last
        // one is taken out (the update that empties them removes it).
        if matches!(plan, DeletePlan::Remove) && has_finalizers(&old) {
            plan = if old["metadata"].get("deletionTimestamp").is_some()
                && old["metadata"]["deletionGracePeriodSeconds"].as_i64().unwrap_or(0) == 0
            {
                DeletePlan::AlreadyDeleting
            } else {
                let at = old["metadata"]["deletionTimestamp"].as_str().and_then(|t| t.parse().ok()).unwrap_or(ctx.now);
                DeletePlan::MarkDeleting { at, grace_seconds: Some(0), phase: None }
            };
        }
        let unwritten = |object: Value| Pending {
            rv: None,
            outcome: Outcome { object, json: None, created: false, warnings: vec![] },
        };
        match plan {
            DeletePlan::Forbidden(message) => {
                Err(ApiError::Forbidden { resource: kind.qualified_resource(), name, message })
            }
            DeletePlan::Remove | DeletePlan::AlreadyDeleting if opts.dry_run => Ok(unwritten(old)),
            DeletePlan::Remove => {
                let orphaned = if opts.orphan { self.orphan_dependents(&old)? } else { vec![] };
                self.finalize_delete_with(g, kind, old, orphaned)
            }
            DeletePlan::AlreadyDeleting => Ok(unwritten(old)),
            DeletePlan::MarkDeleting { at, grace_seconds, phase } => {
                let mut marked = old.clone();
                marked["metadata"]["deletionTimestamp"] = time_json(at);
                if let Some(grace) = grace_seconds {
                    marked["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                }
                if let Some(phase) = phase {
                    marked["status"]["phase"] = json!(phase);
                }
                if opts.dry_run {
                    return Ok(unwritten(marked));
                }
                self.put_raw(g, kind, Some(old), marked)
            }
        }
    }

    /// The writes that take `owner` out of its dependents' `ownerReferences` (dependents live
    /// in the owner's namespace; the kinds podpath's controllers own are checked).
    fn orphan_dependents(&self, owner: &Value) -> Result<Vec<Op>, ApiError> {
        let Some(uid) = meta_str(owner, "uid") else { return Ok(vec![]) };
        let ns = obj_ns(owner);
        let mut ops = Vec::new();
        for kind in [
            Kind::ReplicaSet,
            Kind::Pod,
            Kind::EndpointSlice,
            Kind::Job,
            Kind::ControllerRevision,
            Kind::PersistentVolumeClaim,
        ] {
            let (objs, _) = self.store.list(kind, if ns.is_empty() { None } else { Some(ns.as_str()) })?;
            for obj in objs {
                let Some(refs) = obj["metadata"]["ownerReferences"].as_array() else { continue };
                if !refs.iter().any(|r| r["uid"] == uid) {
                    continue;
                }
                let kept: Vec<Value> = refs.iter().filter(|r| r["uid"] != uid).cloned().collect();
                let mut new = obj.clone();
                match new["metadata"].as_object_mut() {
                    Some(m) if kept.is_empty() => {
                        m.remove("ownerReferences");
                    }
                    Some(m) => {
                        m.insert("ownerReferences".into(), Value::Array(kept));
                    }
                    None => continue,
                }
                ops.push(Op::Put { kind, object: new, prev: Some(Arc::new(obj)) });
            }
        }
        Ok(ops)
    }

    /// Removes an object now and releases what it held.
    pub(crate) fn finalize_delete(&self, g: &WriteGuard<'_>, kind: Kind, old: Value) -> Result<Pending, ApiError> {
        self.finalize_delete_with(g, kind, old, vec![])
    }

    /// Removes an object and, in the same commit, makes the `extra` writes.
    fn finalize_delete_with(
        &self,
        g: &WriteGuard<'_>,
        kind: Kind,
        old: Value,
        extra: Vec<Op>,
    ) -> Result<Pending, ApiError> {
        let name = meta_str(&old, "name").unwrap_or("").to_string();
        let ns = obj_ns(&old);
        let ranges = self.ranges();
        let released = api::with_kind_type!(kind,
            T => api::decode::<T>(&old).map(|o| o.allocations(&ranges)).unwrap_or_default(),
            custom _c => BTreeSet::new());
        let owner = alloc::owner(kind, &ns, &name);
        let mut ops: Vec<Op> = released.iter().map(|k| Op::Alloc { key: k.clone(), owner: None }).collect();
        ops.extend(extra);
        ops.push(Op::Delete { kind, object: old });
        let (mut written, rv) = self.store.commit(g, ops)?;
        if let Ok(mut a) = self.alloc.lock() {
            a.apply(&owner, &released, &BTreeSet::new());
        }
        Ok(Pending { rv: Some(rv), outcome: Outcome::of(written.pop(), false, vec![]) })
    }

    /// Writes an object as is (system updates: deletion marks, controller status).
    pub(crate) fn put_raw(
        &self,
        g: &WriteGuard<'_>,
        kind: Kind,
        old: Option<Value>,
        object: Value,
    ) -> Result<Pending, ApiError> {
        let created = old.is_none();
        let (mut written, rv) = self.store.commit(g, vec![Op::Put { kind, object, prev: old.map(Arc::new) }])?;
        Ok(Pending { rv: Some(rv), outcome: Outcome::of(written.pop(), created, vec![]) })
    }

    pub(crate) async fn sync(&self, p: Pending) -> Result<Value, ApiError> {
        Ok(self.finish(p).await?.object)
    }

    fn node_is_ready(&self, name: &str) -> Result<bool, ApiError> {
        Ok(match self.store.get(Kind::Node, "", name)? {
            Some(n) => Node::from_json(n).map(|n| api::kinds::node::node_ready_status(&n) == "Ready").unwrap_or(false),
            None => false,
        })
    }

    fn check_namespace_accepts(&self, ns: &str) -> Result<(), ApiError> {
        /// The one field read here: every create checks it, so the rest is skipped unparsed.
        #[derive(serde::Deserialize)]
        struct Namespace {
            #[serde(default)]
            metadata: Metadata,
        }
        #[derive(serde::Deserialize, Default)]
        struct Metadata {
            #[serde(rename = "deletionTimestamp")]
            deletion_timestamp: Option<serde::de::IgnoredAny>,
        }
        let read = |raw: &[u8]| {
            serde_json::from_slice::<Namespace>(raw).map_err(|e| ApiError::storage(format!("corrupt object: {e}")))
        };
        match self.store.get_raw(Kind::Namespace, "", ns)?.map(|raw| read(&raw)).transpose()? {
            None => Err(ApiError::not_found(Kind::Namespace, ns)),
            Some(n) if n.metadata.deletion_timestamp.is_some() => Err(ApiError::Forbidden {
                resource: "namespaces".into(),
                name: ns.into(),
                message: format!("unable to create new content in namespace {ns} because it is being terminated"),
            }),
            Some(_) => Ok(()),
        }
    }

    /// The served model of a custom kind (None for built-in kinds).
    fn custom_model(&self, kind: Kind) -> Option<std::sync::Arc<crate::crd::Model>> {
        match kind {
            Kind::Custom(c) => self.crds.get(c),
            _ => None,
        }
    }

    /// Admits a custom object by its CRD's schema (see [`crate::crd::admit`]).
    fn admit_custom(
        &self,
        kind: api::custom::CustomKind,
        body: Value,
        old: Option<&Value>,
        sub: Subresource,
        opts: &WriteOptions,
    ) -> Result<Admitted, ApiError> {
        let name = meta_str(&body, "name").unwrap_or("").to_string();
        let model = self.crds.get(kind).ok_or_else(|| ApiError::not_found(Kind::Custom(kind), &name))?;
        let out = crate::crd::admit(kind, &model, body, old, sub, opts)?;
        Ok(Admitted { object: out.object, warnings: out.warnings, before: BTreeSet::new(), after: BTreeSet::new() })
    }

    /// Decodes, defaults, validates and allocates.
    fn admit<T: ApiObject>(
        &self,
        body: Value,
        old: Option<&Value>,
        sub: Subresource,
        opts: &WriteOptions,
        claims: &mut Claims,
    ) -> Result<Admitted, ApiError> {
        let mut obj: T = api::decode(&body)?;
        let mut warnings = Vec::new();
        if opts.field_validation != FieldValidation::Ignore {
            let unknown = api::strict::unknown_fields(&body, &obj.to_json()?);
            if !unknown.is_empty() {
                if opts.field_validation == FieldValidation::Strict {
                    let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                    return Err(ApiError::BadRequest(format!(
                        "{kind} in version \"{v}\" cannot be handled as a {kind}: strict decoding error: {}",
                        list.join(", "),
                        kind = <T as ApiObject>::KIND.info().name,
                        v = <T as ApiObject>::KIND.info().version
                    )));
                }
                warnings.extend(unknown.iter().map(|f| format!("unknown field \"{f}\"")));
            }
        }
        let old_typed: Option<T> = old.map(api::decode).transpose()?;
        let info = <T as ApiObject>::KIND.info();
        if info.no_controller && old.is_none() && sub == Subresource::Main {
            warnings.push(format!(
                "podpath runs no controller for {}: this object is stored and served, nothing acts on it",
                info.plural
            ));
        }
        match &old_typed {
            None => obj.prepare_for_create(),
            Some(o) => obj.prepare_for_update(o),
        }
        obj.apply_defaults();
        let name = obj.metadata().name.clone().unwrap_or_default();
        let mut causes = obj.validate(old_typed.as_ref());
        let ranges = self.ranges();
        if causes.is_empty() && sub == Subresource::Main {
            let table = self.alloc.lock().map_err(|_| ApiError::internal("allocator lock poisoned"))?;
            let mut claiming = Claiming { table: &table, claims };
            obj.allocate(old_typed.as_ref(), &mut claiming, &mut causes)
                .map_err(|Exhausted(m)| ApiError::RangeFull(m))?;
        }
        if !causes.is_empty() {
            return Err(ApiError::invalid(<T as ApiObject>::KIND, &name, causes));
        }
        Ok(Admitted {
            object: api::encode(&obj),
            warnings,
            before: old_typed.map(|o| o.allocations(&ranges)).unwrap_or_default(),
            after: obj.allocations(&ranges),
        })
    }
}

/// An admitted object: what to store, the warnings for the client, and the allocations the
/// object held before the write and holds after it.
struct Admitted {
    object: Value,
    warnings: Vec<String>,
    before: BTreeSet<String>,
    after: BTreeSet<String>,
}

/// The store operations of a write (the allocations it releases and takes, then the object),
/// and those released and taken, for the allocation table once committed.
fn write_ops(
    kind: Kind,
    old: Option<Value>,
    object: Value,
    before: &BTreeSet<String>,
    after: &BTreeSet<String>,
    claims: &Claims,
) -> (Vec<Op>, BTreeSet<String>, BTreeSet<String>) {
    let released: BTreeSet<String> = before.difference(after).cloned().collect();
    let added: BTreeSet<String> = after.difference(before).cloned().collect();
    // Every value the object holds must have been claimed by this transaction or before.
    debug_assert!(added.iter().all(|k| claims.added.contains(k)), "unclaimed allocation in {added:?}");
    let mut ops: Vec<Op> = Vec::new();
    ops.extend(released.iter().map(|k| Op::Alloc { key: k.clone(), owner: None }));
    ops.extend(added.iter().map(|k| Op::Alloc { key: k.clone(), owner: Some(claims.owner.clone()) }));
    ops.push(Op::Put { kind, object, prev: old.map(Arc::new) });
    (ops, released, added)
}

/// A create admitted and ready to commit.
struct PreparedCreate {
    kind: Kind,
    ns: String,
    name: String,
    admitted: Admitted,
    claims: Claims,
}

/// A create waiting in the queue, and where its outcome goes (`None`: do it again under the lock).
struct Queued {
    prepared: PreparedCreate,
    done: tokio::sync::oneshot::Sender<Option<Pending>>,
}

/// A write that is committed but maybe not durable yet.
pub struct Pending {
    rv: Option<u64>,
    outcome: Outcome,
}

impl Pending {
    pub fn object(&self) -> &Value {
        &self.outcome.object
    }

    /// The resourceVersion the write must reach durability at; None when nothing was written.
    pub(crate) fn rv(&self) -> Option<u64> {
        self.rv
    }
}

/// Makes sure the body is an object with an object `metadata`, so later field access is safe.
fn ensure_object_shape(body: &mut Value) -> Result<(), ApiError> {
    let Some(obj) = body.as_object_mut() else {
        return Err(ApiError::BadRequest("the request body must be a JSON object".into()));
    };
    match obj.get("metadata") {
        None | Some(Value::Null) => {
            obj.insert("metadata".into(), json!({}));
        }
        Some(Value::Object(_)) => {}
        Some(_) => return Err(ApiError::BadRequest("metadata must be a JSON object".into())),
    }
    if let Some(st) = obj.get("status") {
        if !st.is_object() && !st.is_null() {
            return Err(ApiError::BadRequest("status must be a JSON object".into()));
        }
    }
    Ok(())
}

/// Rejects a body whose kind or apiVersion is not the URL's.
fn check_type_meta(kind: Kind, body: &Value) -> Result<(), ApiError> {
    if let Some(av) = body.get("apiVersion").and_then(Value::as_str) {
        if av != kind.api_version() {
            return Err(ApiError::BadRequest(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                kind.api_version()
            )));
        }
    }
    if let Some(k) = body.get("kind").and_then(Value::as_str) {
        if k != kind.info().name {
            return Err(ApiError::BadRequest(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                kind.info().name
            )));
        }
    }
    Ok(())
}

/// How a custom object's lists and maps merge in server-side apply: by the schema of the
/// version the client writes (built-in kinds: their own strategies).
fn lists_of<'a>(model: Option<&'a crate::crd::Model>, opts: &WriteOptions) -> api::patch::Lists<'a> {
    model
        .and_then(|m| m.version(opts.served_version.as_deref()))
        .and_then(|v| v.schema.as_ref())
        .map(api::patch::Lists::Schema)
        .unwrap_or_default()
}

/// Rejects a PUT/apply body whose name or namespace is not the URL's.
/// Writes `metadata.managedFields` of a written object: a manager's write moves ownership
/// ([`api::managed::after_write`]); the controllers' writes and subresource writes keep it.
fn set_managed_fields(
    kind: Kind,
    object: &mut Value,
    old: Option<&Value>,
    sub: Subresource,
    opts: &WriteOptions,
    lists: api::patch::Lists<'_>,
) {
    let manager = opts.field_manager.as_deref().filter(|_| sub == Subresource::Main);
    let entries = match manager {
        None => old.and_then(|o| o.pointer("/metadata/managedFields")).cloned(),
        Some(manager) => {
            let write = match &opts.apply_config {
                Some(config) => api::managed::Write::Apply { manager, config },
                None => api::managed::Write::Update { manager },
            };
            let now = now_json();
            let entries =
                api::managed::after_write(old, object, &write, &kind.api_version(), now.as_str().unwrap_or(""), lists);
            (!entries.is_empty()).then(|| api::managed::entries_json(&entries))
        }
    };
    if let Some(m) = object["metadata"].as_object_mut() {
        match entries {
            Some(e) => m.insert("managedFields".into(), e),
            None => m.remove("managedFields"),
        };
    }
}

/// The 409 of an apply that would change other managers' fields, worded as the real server's.
fn apply_conflict(conflicts: &[api::managed::Conflict]) -> ApiError {
    let who = |c: &api::managed::Conflict| format!("{:?} using {}", c.manager, c.api_version);
    let causes: Vec<api::Cause> = conflicts
        .iter()
        .map(|c| api::Cause {
            reason: "FieldManagerConflict".into(),
            message: format!("conflict with {}", who(c)),
            field: api::managed::display(&c.path),
        })
        .collect();
    let message = match conflicts {
        [c] => format!("conflict with {}: {}", who(c), api::managed::display(&c.path)),
        _ => {
            let mut by_manager: std::collections::BTreeMap<String, Vec<String>> = Default::default();
            for c in conflicts {
                by_manager.entry(who(c)).or_default().push(api::managed::display(&c.path));
            }
            let mut m = String::from("conflicts with");
            let single = by_manager.len() == 1;
            for (manager, paths) in by_manager {
                m.push_str(if single { " " } else { "\n" });
                m.push_str(&manager);
                m.push(':');
                for p in paths {
                    m.push_str(&format!("\n- {p}"));
                }
            }
            m
        }
    };
    ApiError::ApplyConflict { message, causes }
}

fn check_body_identity(kind: Kind, ns: Option<&str>, name: &str, body: &Value) -> Result<(), ApiError> {
    if let Some(n) = meta_str(body, "name").filter(|n| !n.is_empty()) {
        if n != name {
            return Err(ApiError::BadRequest(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
    }
    if kind.info().namespaced {
        if let (Some(b), Some(u)) = (meta_str(body, "namespace").filter(|n| !n.is_empty()), ns) {
            if b != u {
                return Err(ApiError::BadRequest(
                    "the namespace of the provided object does not match the namespace sent on the request".into(),
                ));
            }
        }
    }
    Ok(())
}

pub fn labels_of(obj: &Value) -> Option<std::collections::BTreeMap<String, String>> {
    obj.pointer("/metadata/labels").and_then(|l| serde_json::from_value(l.clone()).ok())
}

/// Five characters from the alphabet Kubernetes uses for generated names.
pub fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..n).map(|_| ALPHABET[fastrand::usize(0..ALPHABET.len())] as char).collect()
}

/// The autoscaling/v1 Scale of a Deployment or ReplicaSet object.
pub fn scale_of(obj: &Value) -> Value {
    let selector = <api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as api::Codec>::from_json(
        obj["spec"]["selector"].clone(),
    )
    .ok()
    .map(|s| api::apps::format_selector(Some(&s)))
    .filter(|s| s != "<none>")
    .unwrap_or_default();
    let status = json!({"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0), "selector": selector});
    scale(obj, obj["spec"]["replicas"].as_i64().unwrap_or(1), status)
}

/// An autoscaling/v1 Scale of `obj` with these replicas and status.
pub fn scale(obj: &Value, replicas: i64, status: Value) -> Value {
    let meta = &obj["metadata"];
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
            "resourceVersion": meta["resourceVersion"], "creationTimestamp": meta["creationTimestamp"],
        },
        "spec": {"replicas": replicas},
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, spec: Value) -> Value {
        json!({"metadata": {"name": name}, "spec": spec})
    }

    #[tokio::test]
    async fn a_create_admitted_before_the_lock_goes_stale_when_its_name_values_or_namespace_change() {
        let dir = tempfile::tempdir().unwrap();
        let reg = Registry::open(Arc::new(Store::open(dir.path()).unwrap()), Ranges::default()).unwrap();
        let opts = WriteOptions::default();
        let ns = json!({"metadata": {"name": "team"}, "spec": {"finalizers": ["kubernetes"]}});
        reg.create(Kind::Namespace, None, ns, &opts).await.unwrap();
        let prepare =
            |name: &str, spec: Value| reg.prepare_create(Kind::Service, Some("team"), service(name, spec), &opts);

        // Its name was taken.
        let p = prepare("a", json!({"ports": [{"port": 80}]})).unwrap();
        assert!(reg.still_admissible(&p).unwrap());
        reg.create(Kind::Service, Some("team"), service("a", json!({"ports": [{"port": 81}]})), &opts).await.unwrap();
        assert!(!reg.still_admissible(&p).unwrap());

        // A value it claimed was given to another object.
        let p = prepare("b", json!({"clusterIP": "10.96.3.3", "ports": [{"port": 80}]})).unwrap();
        assert!(reg.still_admissible(&p).unwrap());
        let other = service("c", json!({"clusterIP": "10.96.3.3", "ports": [{"port": 80}]}));
        reg.create(Kind::Service, Some("team"), other, &opts).await.unwrap();
        assert!(!reg.still_admissible(&p).unwrap());

        // Its namespace began terminating (the finalizer keeps it until its content is gone).
        let p = prepare("d", json!({"ports": [{"port": 80}]})).unwrap();
        assert!(reg.still_admissible(&p).unwrap());
        reg.delete(Kind::Namespace, None, "team", &DeleteOptions::default()).await.unwrap();
        assert!(!reg.still_admissible(&p).unwrap());
        // Done again under the lock, such a create meets the real server's error.
        let err = reg.create(Kind::Service, Some("team"), service("d", json!({"ports": [{"port": 80}]})), &opts).await;
        assert!(matches!(err, Err(ApiError::Forbidden { .. })), "{err:?}");
    }
}
