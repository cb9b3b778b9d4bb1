//! What the controllers share to write: create-or-update of controller-owned objects, quiet
//! deletes, conditions and timestamps.

use std::collections::{BTreeMap, BTreeSet};

use api::Kind;
use serde_json::{json, Value};

use super::events::{EventType, Report};

use crate::error::ApiError;
use crate::registry::{DeleteOptions, Pending, Registry, Subresource, WriteOptions};

/// `(namespace, name)` of a stored object.
pub(crate) fn ns_name(obj: &Value) -> (String, String) {
    (
        obj["metadata"]["namespace"].as_str().unwrap_or("").to_string(),
        obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
    )
}

/// Controller writes that are committed, their flush asked for, but not yet known durable: a
/// run of writes (one pass's endpoints) waits once, for the last of them, instead of for each
/// in turn — which held a pass to one flush per write and, in a burst of Service creates, let
/// it fall behind the event log (then every pass read every Service again).
#[derive(Default)]
#[must_use = "the writes' durability is waited for with `wait`"]
pub(crate) struct Unsynced(u64);

impl Unsynced {
    fn add(&mut self, reg: &Registry, pending: &Pending) {
        if let Some(rv) = pending.rv() {
            reg.store.request_sync(rv);
            self.0 = self.0.max(rv);
        }
    }

    /// Waits until every write added is durable.
    pub(crate) async fn wait(self, reg: &Registry) -> Result<(), ApiError> {
        match self.0 {
            0 => Ok(()),
            rv => reg.store.sync(rv).await,
        }
    }
}

/// Creates or updates a controller-owned object when the `fields` (or labels) differ.
pub(crate) async fn upsert(
    reg: &Registry,
    kind: Kind,
    ns: &str,
    name: &str,
    desired: Value,
    fields: &[&str],
) -> Result<(), ApiError> {
    if let Some(p) = commit_upsert(reg, kind, ns, name, desired, fields).await? {
        reg.sync(p).await?;
    }
    Ok(())
}

/// [`upsert`], its durability left to `unsynced`.
pub(crate) async fn upsert_unsynced(
    reg: &Registry,
    kind: Kind,
    ns: &str,
    name: &str,
    desired: Value,
    fields: &[&str],
    unsynced: &mut Unsynced,
) -> Result<(), ApiError> {
    if let Some(p) = commit_upsert(reg, kind, ns, name, desired, fields).await? {
        unsynced.add(reg, &p);
    }
    Ok(())
}

/// The commit of [`upsert`]: the write, if any, not yet durable.
async fn commit_upsert(
    reg: &Registry,
    kind: Kind,
    ns: &str,
    name: &str,
    desired: Value,
    fields: &[&str],
) -> Result<Option<Pending>, ApiError> {
    let g = reg.store.lock().await;
    let pending = match reg.store.get(kind, ns, name)? {
        None => Some(reg.create_locked(&g, kind, Some(ns), desired, &WriteOptions::default())?),
        Some(old) => {
            let mut new = old.clone();
            let mut changed = old["metadata"].get("labels") != desired["metadata"].get("labels");
            new["metadata"]["labels"] = desired["metadata"]["labels"].clone();
            if let Some(o) = desired["metadata"].get("ownerReferences") {
                new["metadata"]["ownerReferences"] = o.clone();
            }
            for f in fields {
                let want = desired.get(*f);
                // Compare after defaulting (protocol etc.) by looking at what we would store.
                if normalized(old.get(*f)) != normalized(want) {
                    changed = true;
                }
                match want {
                    Some(v) => new[*f] = v.clone(),
                    None => {
                        new.as_object_mut().map(|o| o.remove(*f));
                    }
                }
            }
            if changed {
                Some(reg.update_locked(&g, kind, old, new, Subresource::Main, &WriteOptions::default())?)
            } else {
                None
            }
        }
    };
    drop(g);
    Ok(pending)
}

fn normalized(v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Array(a)) if a.is_empty() => Value::Null,
        Some(v) => v.clone(),
    }
}

pub(crate) async fn delete_quietly(reg: &Registry, kind: Kind, ns: &str, name: &str) -> Result<(), ApiError> {
    match reg.delete(kind, Some(ns), name, &DeleteOptions::default()).await {
        Ok(_) | Err(ApiError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// [`delete_quietly`], its durability left to `unsynced`.
pub(crate) async fn delete_quietly_unsynced(
    reg: &Registry,
    kind: Kind,
    ns: &str,
    name: &str,
    unsynced: &mut Unsynced,
) -> Result<(), ApiError> {
    let g = reg.store.lock().await;
    let Some(old) = reg.store.get(kind, ns, name)? else { return Ok(()) };
    let pending = reg.delete_locked(&g, kind, old, &DeleteOptions::default())?;
    drop(g);
    unsynced.add(reg, &pending);
    Ok(())
}

pub(crate) fn new_time() -> Value {
    let ts = jiff::Timestamp::now();
    json!(jiff::Timestamp::from_second(ts.as_second()).unwrap_or(ts).to_string())
}

/// Sets a condition in `status.conditions`, keeping lastTransitionTime when the status holds.
pub(crate) fn set_condition(obj: &mut Value, cond: Value) {
    if !obj["status"].is_object() {
        obj["status"] = json!({});
    }
    let list = obj["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    let mut found = false;
    for c in list {
        if c["type"] == cond["type"] {
            found = true;
            if c["status"] == cond["status"]
                && c.get("reason") == cond.get("reason")
                && c.get("message") == cond.get("message")
            {
                out.push(c);
            } else {
                out.push(cond.clone());
            }
        } else {
            out.push(c);
        }
    }
    if !found {
        out.push(cond);
    }
    obj["status"]["conditions"] = json!(out);
}

/// The controller reference of an object: (kind, uid) of its `controller: true` owner.
pub(crate) fn controller_of(meta: &Value) -> Option<(String, String)> {
    meta["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["controller"] == true)
        .map(|o| (o["kind"].as_str().unwrap_or("").to_string(), o["uid"].as_str().unwrap_or("").to_string()))
}

/// Whether an object is being deleted.
pub(crate) fn is_terminating(obj: &Value) -> bool {
    obj["metadata"].get("deletionTimestamp").is_some_and(|t| !t.is_null())
}

/// An RFC 3339 time field, if it is one.
pub(crate) fn time(v: &Value) -> Option<jiff::Timestamp> {
    v.as_str().and_then(|s| s.parse().ok())
}

/// A time as the API writes it (whole seconds).
pub(crate) fn stamp(t: jiff::Timestamp) -> Value {
    json!(jiff::Timestamp::from_second(t.as_second()).unwrap_or(t).to_string())
}

/// When a ready pod became ready (its Ready condition's last transition); None when not ready.
pub(crate) fn ready_since(p: &Value) -> Option<jiff::Timestamp> {
    p.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready" && c["status"] == "True"))
        .and_then(|c| time(&c["lastTransitionTime"]))
}

/// Groups `dependents` (of `kind`) by the UID of their controller of kind `owner_kind` among
/// `owners`; a dependent whose controller of that kind is gone is deleted — the garbage
/// collector's background cascading delete.
pub(crate) async fn owned_or_collected<'a>(
    reg: &Registry,
    kind: Kind,
    ns: &str,
    dependents: &'a [Value],
    owner_kind: &str,
    owners: &[Value],
) -> Result<BTreeMap<String, Vec<&'a Value>>, ApiError> {
    let uids: BTreeSet<&str> = owners.iter().filter_map(|o| o["metadata"]["uid"].as_str()).collect();
    let mut owned: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for d in dependents {
        let Some((k, uid)) = controller_of(&d["metadata"]) else { continue };
        if k != owner_kind {
            continue;
        }
        if uids.contains(uid.as_str()) {
            owned.entry(uid).or_default().push(d);
        } else if !is_terminating(d) {
            delete_quietly(reg, kind, ns, &ns_name(d).1).await?;
        }
    }
    Ok(owned)
}

/// Writes `status` as the object's status unless it is that already; a conflict or a gone
/// object is left to the next pass (which sees the new object).
pub(crate) async fn write_status(reg: &Registry, kind: Kind, obj: &Value, status: Value) -> Result<(), ApiError> {
    if obj.get("status") == Some(&status) {
        return Ok(());
    }
    let mut new = obj.clone();
    new["status"] = status;
    let (ns, name) = ns_name(obj);
    let ns = kind.info().namespaced.then_some(ns.as_str());
    match reg.update(kind, ns, &name, new, Subresource::Status, &WriteOptions::default()).await {
        Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The Events `component` reports about `object` (of `kind`): `report(type, reason, message)`.
pub(crate) fn reporter<'a>(
    component: &'static str,
    kind: Kind,
    object: &'a Value,
) -> impl Fn(EventType, &'a str, String) -> Report<'a> {
    move |type_, reason, message| Report {
        component,
        host: None,
        object,
        kind,
        field_path: None,
        type_,
        reason,
        message,
    }
}
