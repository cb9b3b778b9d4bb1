//! The four patch types kubectl and the client libraries send:
//! strategic merge patch (client-side apply, Python dict patches), JSON merge patch
//! (`kubectl label`, `patch --type=merge`), JSON patch, and server-side apply.
//!
//! Strategic merge is implemented here because no maintained Rust crate does it: lists are
//! merged by their Kubernetes merge keys and the `$patch`, `$setElementOrder`, `$retainKeys` and
//! `$deleteFromPrimitiveList` directives are honoured.

use std::borrow::Cow;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;
use serde_json::{Map, Value};

use crate::Error;

/// The patch content types the API accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Strategic,
    Merge,
    Json,
    Apply,
}

impl PatchType {
    /// Maps a request's Content-Type (parameters ignored) to a patch type.
    pub fn from_content_type(ct: &str) -> Option<PatchType> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

/// How a list field merges in a strategic merge patch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ListStrategy<'a> {
    /// Replaced whole (no patch strategy).
    Atomic,
    /// Merged element by element, matching on these keys.
    MergeBy(Cow<'a, [&'a str]>),
    /// A list of scalars merged as a set (`metadata.finalizers`).
    PrimitiveSet,
}

/// Where lists' and maps' merge strategies come from: the built-in kinds' (their Go types'
/// tags, as `list_strategy` lists them), or a custom resource's structural schema
/// (`x-kubernetes-list-type`, `x-kubernetes-list-map-keys`, `x-kubernetes-map-type`) — its
/// `metadata` keeps the built-in strategies.
#[derive(Clone, Copy, Debug, Default)]
pub enum Lists<'a> {
    #[default]
    BuiltIn,
    Schema(&'a JSONSchemaProps),
}

impl<'a> Lists<'a> {
    /// The schema of the field at `path` (field names and map keys, list items passed through).
    fn schema_at(root: &'a JSONSchemaProps, path: &[String]) -> Option<&'a JSONSchemaProps> {
        let mut s = root;
        for f in path {
            while s.type_.as_deref() == Some("array") {
                s = crate::schema::items(s)?;
            }
            s = match s.properties.as_ref().and_then(|p| p.get(f)) {
                Some(p) => p,
                None => match &s.additional_properties {
                    Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaPropsOrBool::Schema(a)) => a,
                    _ => return None,
                },
            };
        }
        Some(s)
    }

    pub(crate) fn strategy(&self, path: &[String], apply: bool) -> ListStrategy<'a> {
        match self {
            Lists::Schema(root) if path.first().is_some_and(|f| f != "metadata") => {
                let Some(s) = Self::schema_at(root, path) else { return ListStrategy::Atomic };
                match s.x_kubernetes_list_type.as_deref() {
                    Some("map") => {
                        let keys: Vec<&'a str> =
                            s.x_kubernetes_list_map_keys.iter().flatten().map(String::as_str).collect();
                        if keys.is_empty() {
                            ListStrategy::Atomic
                        } else {
                            ListStrategy::MergeBy(Cow::Owned(keys))
                        }
                    }
                    Some("set") => ListStrategy::PrimitiveSet,
                    _ => ListStrategy::Atomic,
                }
            }
            _ => list_strategy(path, apply),
        }
    }

    /// Whether the map at `path` is owned and replaced whole.
    pub(crate) fn atomic_map(&self, path: &[String]) -> bool {
        match self {
            Lists::Schema(root) if path.first().is_some_and(|f| f != "metadata") => {
                Self::schema_at(root, path).is_some_and(|s| s.x_kubernetes_map_type.as_deref() == Some("atomic"))
            }
            _ => path == ["spec", "selector"],
        }
    }
}

/// The merge strategy of the list at `path` (field names from the object root, no indices).
/// `apply` selects server-side apply's listMapKeys where they differ from patchMergeKey.
pub(crate) fn list_strategy<'a>(path: &[String], apply: bool) -> ListStrategy<'a> {
    let last = path.last().map(String::as_str).unwrap_or("");
    let parent = if path.len() >= 2 { path[path.len() - 2].as_str() } else { "" };
    let is_container_list = |p: &str| matches!(p, "containers" | "initContainers" | "ephemeralContainers");
    match last {
        "ports" if is_container_list(parent) => {
            if apply {
                ListStrategy::MergeBy(Cow::Borrowed(&["containerPort", "protocol"]))
            } else {
                ListStrategy::MergeBy(Cow::Borrowed(&["containerPort"]))
            }
        }
        // Service ports: `spec.ports` of a Service (not an EndpointSlice's top-level `ports`).
        "ports" if path.len() == 2 && parent == "spec" => {
            if apply {
                ListStrategy::MergeBy(Cow::Borrowed(&["port", "protocol"]))
            } else {
                ListStrategy::MergeBy(Cow::Borrowed(&["port"]))
            }
        }
        "containers" | "initContainers" | "ephemeralContainers" | "volumes" | "env" | "imagePullSecrets" => {
            ListStrategy::MergeBy(Cow::Borrowed(&["name"]))
        }
        "volumeMounts" => ListStrategy::MergeBy(Cow::Borrowed(&["mountPath"])),
        "volumeDevices" => ListStrategy::MergeBy(Cow::Borrowed(&["devicePath"])),
        "conditions" => ListStrategy::MergeBy(Cow::Borrowed(&["type"])),
        "addresses" if parent == "status" => ListStrategy::MergeBy(Cow::Borrowed(&["type"])),
        "ownerReferences" => ListStrategy::MergeBy(Cow::Borrowed(&["uid"])),
        "hostAliases" => ListStrategy::MergeBy(Cow::Borrowed(&["ip"])),
        "topologySpreadConstraints" => ListStrategy::MergeBy(Cow::Borrowed(&["topologyKey", "whenUnsatisfiable"])),
        "finalizers" if parent == "metadata" => ListStrategy::PrimitiveSet,
        _ => ListStrategy::Atomic,
    }
}

/// Applies a patch of type `ty` to `original`.
pub fn apply_patch(ty: PatchType, original: &Value, patch: &Value) -> Result<Value, Error> {
    match ty {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(Error::Patch("a merge patch must be a JSON object".into()));
            }
            let mut doc = original.clone();
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        PatchType::Json => {
            let ops: json_patch::Patch =
                serde_json::from_value(patch.clone()).map_err(|e| Error::Patch(format!("invalid JSON patch: {e}")))?;
            let mut doc = original.clone();
            json_patch::patch(&mut doc, &ops).map_err(|e| Error::Patch(e.to_string()))?;
            Ok(doc)
        }
        PatchType::Strategic => strategic_merge(original, patch, false),
        PatchType::Apply => merge_applied(original, patch, Lists::BuiltIn),
    }
}

/// Strategic merge of `patch` into `original`. With `apply`, lists merge by their listMapKeys and
/// directives are not allowed (server-side apply bodies are plain objects).
pub fn strategic_merge(original: &Value, patch: &Value, apply: bool) -> Result<Value, Error> {
    merge_with(original, patch, apply, Lists::BuiltIn)
}

/// Server-side apply's merge of a config into the live object, lists merged as `lists` says.
pub fn merge_applied(original: &Value, config: &Value, lists: Lists<'_>) -> Result<Value, Error> {
    merge_with(original, config, true, lists)
}

fn merge_with(original: &Value, patch: &Value, apply: bool, lists: Lists<'_>) -> Result<Value, Error> {
    let (Some(orig), Some(p)) = (original.as_object(), patch.as_object()) else {
        return Err(Error::Patch("a strategic merge patch must be a JSON object".into()));
    };
    let merged = merge_map(orig, p, &mut Vec::new(), apply, lists)?;
    Ok(merged.map(Value::Object).unwrap_or_else(|| Value::Object(Map::new())))
}

const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Merges one map. Returns `None` when the patch says `$patch: delete`.
fn merge_map(
    orig: &Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
    apply: bool,
    lists: Lists<'_>,
) -> Result<Option<Map<String, Value>>, Error> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("delete") => return Ok(None),
        Some("replace") => {
            let mut m = patch.clone();
            m.remove("$patch");
            return Ok(Some(m));
        }
        Some("merge") | None => {}
        Some(other) => return Err(Error::Patch(format!("unknown patch type: {other} in map"))),
    }
    let mut out = orig.clone();
    if let Some(retain) = patch.get("$retainKeys") {
        let keys: Vec<&str> = retain
            .as_array()
            .ok_or_else(|| Error::Patch("$retainKeys must be a list".into()))?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        out.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (key, pval) in patch {
        if key == "$patch" || key == "$retainKeys" || key.starts_with(SET_ORDER) || key.starts_with(DELETE_PRIMITIVE) {
            continue;
        }
        if pval.is_null() {
            out.remove(key);
            continue;
        }
        path.push(key.clone());
        let merged = match (out.get(key), pval) {
            (Some(Value::Object(o)), Value::Object(p)) if !(apply && lists.atomic_map(path)) => {
                merge_map(o, p, path, apply, lists)?.map(Value::Object)
            }
            (_, Value::Object(p)) => {
                // Nothing to merge into: the patch becomes the value, minus directives.
                merge_map(&Map::new(), p, path, apply, lists)?.map(Value::Object)
            }
            (orig_val, Value::Array(items)) => {
                let orig_items = orig_val.and_then(Value::as_array).cloned().unwrap_or_default();
                Some(Value::Array(merge_list(&orig_items, items, path, apply, lists)?))
            }
            (_, scalar) => Some(scalar.clone()),
        };
        path.pop();
        match merged {
            Some(v) => {
                out.insert(key.clone(), v);
            }
            None => {
                out.remove(key);
            }
        }
    }
    // Directives that refer to sibling lists run after the lists are merged.
    for (key, pval) in patch {
        if let Some(field) = key.strip_prefix(DELETE_PRIMITIVE) {
            let remove = pval.as_array().cloned().unwrap_or_default();
            if let Some(Value::Array(items)) = out.get_mut(field) {
                items.retain(|i| !remove.contains(i));
            }
        }
    }
    for (key, pval) in patch {
        if let Some(field) = key.strip_prefix(SET_ORDER) {
            let order = pval.as_array().cloned().unwrap_or_default();
            path.push(field.to_string());
            let strategy = lists.strategy(path, apply);
            path.pop();
            if let Some(Value::Array(items)) = out.get_mut(field) {
                reorder(items, &order, &strategy);
            }
        }
    }
    Ok(Some(out))
}

fn key_of(item: &Value, keys: &[&str]) -> Option<Vec<Value>> {
    let obj = item.as_object()?;
    let vals: Vec<Value> = keys.iter().map(|k| obj.get(*k).cloned().unwrap_or(Value::Null)).collect();
    // The first key is mandatory; later ones (protocol) default when absent.
    if vals[0].is_null() {
        return None;
    }
    Some(vals)
}

/// Whether `a` and `b` match on the merge keys, treating an absent `protocol` as TCP.
fn same_key(a: &[Value], b: &[Value], keys: &[&str]) -> bool {
    a.iter().zip(b).zip(keys).all(|((x, y), k)| {
        if *k == "protocol" {
            let norm = |v: &Value| v.as_str().unwrap_or("TCP").to_string();
            norm(x) == norm(y)
        } else {
            x == y
        }
    })
}

fn merge_list(
    orig: &[Value],
    patch: &[Value],
    path: &mut Vec<String>,
    apply: bool,
    lists: Lists<'_>,
) -> Result<Vec<Value>, Error> {
    match lists.strategy(path, apply) {
        ListStrategy::Atomic => Ok(patch.to_vec()),
        ListStrategy::PrimitiveSet => {
            let mut out = orig.to_vec();
            for p in patch {
                if !out.contains(p) {
                    out.push(p.clone());
                }
            }
            Ok(out)
        }
        ListStrategy::MergeBy(keys) => {
            if patch.iter().any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace")) {
                return Ok(patch
                    .iter()
                    .filter(|p| p.get("$patch").and_then(Value::as_str) != Some("replace"))
                    .cloned()
                    .collect());
            }
            let mut out: Vec<Value> = orig.to_vec();
            for p in patch {
                let keys: &[&str] = &keys;
                let Some(pkey) = key_of(p, keys) else {
                    return Err(Error::Patch(format!("map: {} does not contain declared merge key: {}", p, keys[0])));
                };
                let pos = out.iter().position(|o| key_of(o, keys).is_some_and(|ok| same_key(&ok, &pkey, keys)));
                let directive = p.get("$patch").and_then(Value::as_str);
                match (pos, directive) {
                    (Some(i), Some("delete")) => {
                        out.remove(i);
                    }
                    (None, Some("delete")) => {}
                    (Some(i), _) => {
                        let merged = match (out[i].as_object(), p.as_object()) {
                            (Some(o), Some(pm)) => merge_map(o, pm, path, apply, lists)?,
                            _ => None,
                        };
                        match merged {
                            Some(m) => out[i] = Value::Object(m),
                            None => {
                                out.remove(i);
                            }
                        }
                    }
                    (None, _) => {
                        if let Some(pm) = p.as_object() {
                            if let Some(m) = merge_map(&Map::new(), pm, path, apply, lists)? {
                                out.push(Value::Object(m));
                            }
                        }
                    }
                }
            }
            Ok(out)
        }
    }
}

/// Orders `items` like `order` (a list of key stubs, or scalars); items not named keep their
/// relative order after the named ones.
fn reorder(items: &mut Vec<Value>, order: &[Value], strategy: &ListStrategy) {
    let rank = |item: &Value| -> usize {
        order
            .iter()
            .position(|o| match strategy {
                ListStrategy::MergeBy(keys) => match (key_of(item, keys), key_of(o, &keys[..1])) {
                    (Some(a), Some(b)) => a[0] == b[0],
                    _ => false,
                },
                _ => o == item,
            })
            .unwrap_or(usize::MAX)
    };
    let mut ranked: Vec<(usize, usize, Value)> = items.drain(..).enumerate().map(|(i, v)| (rank(&v), i, v)).collect();
    ranked.sort_by_key(|(r, i, _)| (*r, *i));
    items.extend(ranked.into_iter().map(|(_, _, v)| v));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn svc() -> Value {
        json!({
            "metadata": {"name": "contour", "labels": {"app": "contour"}, "finalizers": ["a"]},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"},
                               {"name": "https", "port": 443, "targetPort": 8443, "nodePort": 30443, "protocol": "TCP"}],
                     "externalIPs": ["1.2.3.4"]}
        })
    }

    #[test]
    fn kubectl_changed_target_port_keeps_node_ports_and_order() {
        let patch = json!({"metadata": {"annotations": {"x": "y"}},
            "spec": {"$setElementOrder/ports": [{"port": 80}, {"port": 443}], "ports": [{"port": 443, "targetPort": 9443}]}});
        let out = strategic_merge(&svc(), &patch, false).unwrap();
        assert_eq!(out["spec"]["ports"][1]["targetPort"], 9443);
        assert_eq!(out["spec"]["ports"][1]["nodePort"], 30443);
        assert_eq!(out["spec"]["ports"][0]["port"], 80);
        assert_eq!(out["metadata"]["annotations"]["x"], "y");
        assert_eq!(out["spec"]["clusterIP"], "10.96.0.10");
    }

    #[test]
    fn kubectl_removed_port_and_added_label() {
        let patch = json!({"metadata": {"labels": {"team": "net"}},
            "spec": {"$setElementOrder/ports": [{"port": 80}], "ports": [{"$patch": "delete", "port": 443}]}});
        let out = strategic_merge(&svc(), &patch, false).unwrap();
        assert_eq!(out["spec"]["ports"].as_array().unwrap().len(), 1);
        assert_eq!(out["metadata"]["labels"], json!({"app": "contour", "team": "net"}));
    }

    #[test]
    fn set_element_order_reorders() {
        let patch = json!({"spec": {"$setElementOrder/ports": [{"port": 443}, {"port": 80}]}});
        let out = strategic_merge(&svc(), &patch, false).unwrap();
        assert_eq!(out["spec"]["ports"][0]["port"], 443);
        assert_eq!(out["spec"]["ports"][1]["port"], 80);
    }

    #[test]
    fn atomic_lists_are_replaced_and_null_deletes() {
        let patch = json!({"spec": {"externalIPs": ["5.6.7.8"], "clusterIP": null}});
        let out = strategic_merge(&svc(), &patch, false).unwrap();
        assert_eq!(out["spec"]["externalIPs"], json!(["5.6.7.8"]));
        assert!(out["spec"].get("clusterIP").is_none());
    }

    #[test]
    fn map_and_list_replace_directives() {
        let patch = json!({"metadata": {"labels": {"$patch": "replace", "only": "this"}},
                           "spec": {"ports": [{"$patch": "replace"}, {"port": 8080}]}});
        let out = strategic_merge(&svc(), &patch, false).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"only": "this"}));
        assert_eq!(out["spec"]["ports"], json!([{"port": 8080}]));
    }

    #[test]
    fn retain_keys_and_primitive_lists() {
        let patch = json!({"spec": {"$retainKeys": ["type", "ports"], "type": "ClusterIP"},
                           "metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]}});
        let out = strategic_merge(&svc(), &patch, false).unwrap();
        assert!(out["spec"].get("externalIPs").is_none());
        assert_eq!(out["spec"]["type"], "ClusterIP");
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn container_lists_merge_by_name_and_container_port() {
        let pod = json!({"spec": {"containers": [{"name": "a", "image": "x", "ports": [{"containerPort": 80}]}]}});
        let patch = json!({"spec": {"containers": [{"name": "a", "image": "y", "ports": [{"containerPort": 81}]},
                                                    {"name": "b", "image": "z"}]}});
        let out = strategic_merge(&pod, &patch, false).unwrap();
        assert_eq!(out["spec"]["containers"][0]["image"], "y");
        assert_eq!(out["spec"]["containers"][0]["ports"].as_array().unwrap().len(), 2);
        assert_eq!(out["spec"]["containers"][1]["name"], "b");
    }

    #[test]
    fn missing_merge_key_is_an_error() {
        let patch = json!({"spec": {"ports": [{"name": "x"}]}});
        assert!(strategic_merge(&svc(), &patch, false).is_err());
    }

    #[test]
    fn apply_merges_ports_by_port_and_protocol() {
        let patch = json!({"spec": {"ports": [{"port": 80, "protocol": "UDP", "name": "dns"}]}});
        let out = strategic_merge(&svc(), &patch, true).unwrap();
        assert_eq!(out["spec"]["ports"].as_array().unwrap().len(), 3);
        let patch = json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}]}});
        let out = strategic_merge(&svc(), &patch, true).unwrap();
        assert_eq!(out["spec"]["ports"][0]["targetPort"], 9090);
        assert_eq!(out["spec"]["ports"][0]["nodePort"], 30080);
    }

    #[test]
    fn merge_and_json_patch() {
        let out =
            apply_patch(PatchType::Merge, &svc(), &json!({"metadata": {"labels": {"app": null, "x": "1"}}})).unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"x": "1"}));
        let out = apply_patch(
            PatchType::Json,
            &svc(),
            &json!([{"op": "replace", "path": "/spec/ports/0/port", "value": 81}]),
        )
        .unwrap();
        assert_eq!(out["spec"]["ports"][0]["port"], 81);
        assert!(apply_patch(PatchType::Json, &svc(), &json!([{"op": "remove", "path": "/nope"}])).is_err());
        assert_eq!(PatchType::from_content_type("application/merge-patch+json; charset=utf-8"), Some(PatchType::Merge));
        assert_eq!(PatchType::from_content_type("text/plain"), None);
    }
}
