//! CRDs, as the apiextensions server's controllers run them: an accepted CRD's resource is
//! served at once and the CRD says so (`NamesAccepted`, `Established`, `acceptedNames`); a CRD
//! whose names another CRD of its group already uses is not served (`NamesAccepted` False);
//! a CRD being deleted shows `Terminating`, has its objects deleted, then goes.

use api::custom::CustomKind;
use api::kinds::customresourcedefinition::{self as crd, CustomResourceDefinition};
use api::{Codec, Kind};
use serde_json::{json, Value};

use super::write::ns_name;
use crate::crd::Model;
use crate::error::ApiError;
use crate::registry::{DeleteOptions, Registry};

/// What the establishing controller decides about one CRD. Pure.
#[derive(Debug, PartialEq)]
pub struct Verdict {
    /// The status conditions (type, status, reason, message).
    pub conditions: Vec<(&'static str, &'static str, &'static str, String)>,
    /// Whether its resource is served.
    pub serve: bool,
}

/// Decides a CRD's conditions given the other CRDs. Names conflict when another (older)
/// CRD of the same group uses the same kind, list kind, singular or a short name.
pub fn verdict(crd: &CustomResourceDefinition, others: &[CustomResourceDefinition]) -> Verdict {
    let me = crd::facts(crd);
    let mut conflict = None;
    for o in others.iter().filter(|o| o.spec.group == crd.spec.group && o.metadata.name != crd.metadata.name) {
        let f = crd::facts(o);
        if f.kind == me.kind {
            conflict = Some(format!("{:?} is already in use", me.kind));
        } else if f.list_kind == me.list_kind {
            conflict = Some(format!("{:?} is already in use", me.list_kind));
        } else if f.singular == me.singular || f.plural == me.singular {
            conflict = Some(format!("{:?} is already in use", me.singular));
        } else if let Some(s) = me.short_names.iter().find(|s| f.short_names.contains(s)) {
            conflict = Some(format!("{s:?} is already in use"));
        }
        if conflict.is_some() {
            break;
        }
    }
    let deleting = crd.metadata.deletion_timestamp.is_some();
    let mut conditions = Vec::new();
    let serve = match conflict {
        Some(why) => {
            conditions.push(("NamesAccepted", "False", "KindConflict", why));
            conditions.push(("Established", "False", "NotAccepted", "not all names are accepted".to_string()));
            false
        }
        None => {
            conditions.push(("NamesAccepted", "True", "NoConflicts", "no conflicts found".to_string()));
            conditions.push((
                "Established",
                "True",
                "InitialNamesAccepted",
                "the initial names have been accepted".to_string(),
            ));
            true
        }
    };
    if deleting {
        conditions.push((
            "Terminating",
            "True",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress".to_string(),
        ));
    }
    Verdict { conditions, serve }
}

/// The CRD's status as the verdict says, keeping each condition's transition time when its
/// status did not change.
fn status_of(old: &Value, crd: &CustomResourceDefinition, v: &Verdict, now: &str) -> Value {
    let previous = old["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let conditions: Vec<Value> = v
        .conditions
        .iter()
        .map(|(t, s, reason, message)| {
            let since = previous
                .iter()
                .find(|c| c["type"] == *t && c["status"] == *s)
                .and_then(|c| c["lastTransitionTime"].as_str().map(str::to_string))
                .unwrap_or_else(|| now.to_string());
            json!({"type": t, "status": s, "reason": reason, "message": message, "lastTransitionTime": since})
        })
        .collect();
    let names = &crd.spec.names;
    let accepted = if v.serve {
        json!({"plural": names.plural, "singular": names.singular, "kind": names.kind, "listKind": names.list_kind,
               "shortNames": names.short_names, "categories": names.categories})
    } else {
        old["status"]["acceptedNames"].clone()
    };
    let mut status = old["status"].clone();
    if !status.is_object() {
        status = json!({});
    }
    status["conditions"] = json!(conditions);
    status["acceptedNames"] = strip_nulls(accepted);
    status
}

fn strip_nulls(mut v: Value) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.retain(|_, x| !x.is_null());
    }
    v
}

/// Serves what every CRD defines, writes their conditions, and finishes deletions.
pub(crate) async fn sync(reg: &Registry) -> Result<(), ApiError> {
    let (stored, _) = reg.store.list(Kind::CustomResourceDefinition, None)?;
    let typed: Vec<(Value, CustomResourceDefinition)> = stored
        .into_iter()
        .filter_map(|v| CustomResourceDefinition::from_json(v.clone()).ok().map(|t| (v, t)))
        .collect();
    let all: Vec<CustomResourceDefinition> = typed.iter().map(|(_, t)| t.clone()).collect();
    let mut live = std::collections::BTreeSet::new();
    for (raw, c) in &typed {
        // Older CRDs keep their names: only those created before this one count.
        let older: Vec<CustomResourceDefinition> = all
            .iter()
            .filter(|o| {
                o.metadata.creation_timestamp <= c.metadata.creation_timestamp && o.metadata.name != c.metadata.name
            })
            .cloned()
            .collect();
        let v = verdict(c, &older);
        let facts = crd::facts(c);
        let resource = format!("{}.{}", facts.plural, facts.group);
        if v.serve {
            let kind = CustomKind::register(&facts);
            let model =
                Model { crd: resource.clone(), storage: facts.version.clone(), versions: crd::served_versions(c) };
            let changed =
                reg.crds.get(kind).is_none_or(|m| format!("{:?}", m.versions) != format!("{:?}", model.versions));
            if changed {
                reg.crds.set(kind, model);
            }
            live.insert(kind);
        }
        let now = api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap_or_default(),
        );
        let now = serde_json::to_value(now).unwrap_or_default();
        let status = status_of(raw, c, &v, now.as_str().unwrap_or(""));
        if raw["status"] != status {
            let g = reg.store.lock().await;
            if let Some(old) = reg.store.get(Kind::CustomResourceDefinition, "", &resource)? {
                let mut new = old.clone();
                new["status"] = status;
                let pending = reg.put_raw(&g, Kind::CustomResourceDefinition, Some(old), new)?;
                drop(g);
                reg.sync(pending).await?;
            }
        }
        if c.metadata.deletion_timestamp.is_some() {
            cleanup(reg, &resource).await?;
        }
    }
    // Resources whose CRD is gone (deleted, or refused now) stop being served.
    for (kind, _) in reg.crds.all() {
        if !live.contains(&kind) {
            reg.crds.remove(kind);
        }
    }
    Ok(())
}

/// Deletes a terminating CRD's objects, then the CRD once none is left.
async fn cleanup(reg: &Registry, resource: &str) -> Result<(), ApiError> {
    let kind = Kind::Custom(CustomKind::reserve(resource));
    let (items, _) = reg.store.list(kind, None)?;
    for item in &items {
        let (ns, name) = ns_name(item);
        let ns = Some(ns.as_str()).filter(|n| !n.is_empty());
        match reg.delete(kind, ns, &name, &DeleteOptions::default()).await {
            Ok(_) | Err(ApiError::NotFound { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    let (left, _) = reg.store.list(kind, None)?;
    if !left.is_empty() {
        return Ok(());
    }
    let g = reg.store.lock().await;
    if let Some(old) = reg.store.get(Kind::CustomResourceDefinition, "", resource)? {
        // Someone else's finalizers hold it still.
        let others = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f.as_str() != Some(crd::CLEANUP_FINALIZER)));
        if others {
            return Ok(());
        }
        let pending = reg.finalize_delete(&g, Kind::CustomResourceDefinition, old)?;
        drop(g);
        reg.sync(pending).await?;
    }
    if let Kind::Custom(c) = kind {
        reg.crds.remove(c);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(name: &str, kind: &str, short: &[&str]) -> CustomResourceDefinition {
        let plural = format!("{}s", kind.to_lowercase());
        serde_json::from_value(json!({"metadata": {"name": format!("{plural}.{name}")},
            "spec": {"group": name, "scope": "Namespaced",
                "names": {"plural": plural, "kind": kind, "singular": kind.to_lowercase(), "listKind": format!("{kind}List"),
                          "shortNames": short},
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object"}}}]}}))
        .unwrap()
    }

    #[test]
    fn a_crd_is_established_unless_its_names_are_taken() {
        let a = crd("a.example.com", "Widget", &["w"]);
        let v = verdict(&a, &[]);
        assert!(v.serve);
        assert_eq!(
            v.conditions[1],
            ("Established", "True", "InitialNamesAccepted", "the initial names have been accepted".to_string())
        );
        let mut b = crd("a.example.com", "Gadget", &["w"]);
        b.metadata.name = Some("gadgets.a.example.com".into());
        let v = verdict(&b, std::slice::from_ref(&a));
        assert!(!v.serve);
        assert_eq!(v.conditions[0], ("NamesAccepted", "False", "KindConflict", "\"w\" is already in use".to_string()));
        // Another group may use the same kind.
        assert!(verdict(&crd("b.example.com", "Widget", &["w"]), &[a]).serve);
    }
}
