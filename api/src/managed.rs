//! `metadata.managedFields`: which field manager owns which fields, as server-side apply tracks
//! them. Pure: objects in, field sets and entries out.
//!
//! A field set is a set of paths in the FieldsV1 vocabulary (`f:name` a map field, `k:{…}` a
//! list item by its merge keys, `v:…` a set member, `.` the list item itself). Maps recurse;
//! scalars, atomic lists and atomic maps (`spec.selector`) are leaves. Applying a config as
//! manager M: fields M applied before and omits now are removed unless another manager owns
//! them; fields whose value M changes while another manager owns them are conflicts (409),
//! unless forced, which takes them from the other manager. Any other write (create, update,
//! patch) gives its manager the fields it changed and takes them from the others.
//! No maintained Rust crate implements structured-merge-diff, hence this module.

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

use crate::patch::{ListStrategy, Lists};

/// One path of FieldsV1 tokens.
pub type FieldPath = Vec<String>;
/// A field set.
pub type FieldSet = BTreeSet<FieldPath>;

/// The fields of `metadata` that managers can own; the rest is the server's.
const OWNED_METADATA: [&str; 4] = ["labels", "annotations", "ownerReferences", "finalizers"];

/// The merge-key token of a list item (`k:{"port":80,"protocol":"TCP"}`), with the default
/// protocol filled in as the schema's defaulting does for key fields.
fn key_token(item: &Value, keys: &[&str]) -> Option<String> {
    let mut sorted: Vec<&str> = keys.to_vec();
    sorted.sort_unstable();
    let mut parts = Vec::new();
    for k in sorted {
        let v = match item.get(k) {
            Some(v) => v.clone(),
            None if k == "protocol" => json!("TCP"),
            None => continue,
        };
        parts.push(format!("{}:{}", json!(k), v));
    }
    (!parts.is_empty()).then(|| format!("k:{{{}}}", parts.join(",")))
}

/// The field set of an object (status and the server's metadata left out), lists and maps
/// split as `lists` says.
pub fn fields_of(obj: &Value, lists: Lists<'_>) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else { return out };
    for (k, v) in map {
        match k.as_str() {
            "apiVersion" | "kind" | "status" => {}
            "metadata" => {
                for f in OWNED_METADATA {
                    if let Some(child) = v.get(f) {
                        walk(
                            child,
                            &mut vec!["metadata".into(), f.into()],
                            &mut vec!["f:metadata".into(), format!("f:{f}")],
                            &mut out,
                            lists,
                        );
                    }
                }
            }
            _ => walk(v, &mut vec![k.clone()], &mut vec![format!("f:{k}")], &mut out, lists),
        }
    }
    out
}

fn walk(v: &Value, fields: &mut Vec<String>, tokens: &mut FieldPath, out: &mut FieldSet, lists: Lists<'_>) {
    match v {
        Value::Object(m) if !m.is_empty() && !lists.atomic_map(fields) => {
            for (k, child) in m {
                fields.push(k.clone());
                tokens.push(format!("f:{k}"));
                walk(child, fields, tokens, out, lists);
                tokens.pop();
                fields.pop();
            }
        }
        Value::Array(items) => match lists.strategy(fields, true) {
            ListStrategy::MergeBy(keys) => {
                for item in items {
                    let Some(token) = key_token(item, &keys) else { continue };
                    tokens.push(token);
                    tokens.push(".".into());
                    out.insert(tokens.clone());
                    tokens.pop();
                    if let Some(m) = item.as_object() {
                        for (k, child) in m {
                            fields.push(k.clone());
                            tokens.push(format!("f:{k}"));
                            walk(child, fields, tokens, out, lists);
                            tokens.pop();
                            fields.pop();
                        }
                    }
                    tokens.pop();
                }
            }
            ListStrategy::PrimitiveSet => {
                for item in items {
                    tokens.push(format!("v:{item}"));
                    out.insert(tokens.clone());
                    tokens.pop();
                }
            }
            ListStrategy::Atomic => {
                out.insert(tokens.clone());
            }
        },
        _ => {
            out.insert(tokens.clone());
        }
    }
}

/// The item of `list` that a `k:` token names.
fn find_item(list: &[Value], token: &str) -> Option<usize> {
    let want: Map<String, Value> = serde_json::from_str(token.strip_prefix("k:")?).ok()?;
    list.iter().position(|item| {
        want.iter().all(|(k, v)| match item.get(k) {
            Some(x) => x == v,
            None => k == "protocol" && v == "TCP",
        })
    })
}

/// One step into a JSON value: a map key or a list index.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The steps a path takes in `obj` (`.` is the list item itself: no step); None when a token
/// names nothing there.
fn steps<'p>(obj: &Value, path: &'p [String]) -> Option<Vec<Step<'p>>> {
    let mut cur = obj;
    let mut out = Vec::new();
    for t in path.iter().filter(|t| *t != ".") {
        let step = if let Some(f) = t.strip_prefix("f:") {
            Step::Key(f)
        } else if t.starts_with("k:") {
            Step::Index(find_item(cur.as_array()?, t)?)
        } else if let Some(v) = t.strip_prefix("v:") {
            let want: Value = serde_json::from_str(v).ok()?;
            Step::Index(cur.as_array()?.iter().position(|x| *x == want)?)
        } else {
            return None;
        };
        cur = match step {
            Step::Key(k) => cur.get(k)?,
            Step::Index(i) => cur.get(i)?,
        };
        out.push(step);
    }
    Some(out)
}

/// The value a path names in `obj` (for `.`, the list item).
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    steps(obj, path)?.into_iter().try_fold(obj, |cur, s| match s {
        Step::Key(k) => cur.get(k),
        Step::Index(i) => cur.get(i),
    })
}

fn value_at_mut<'a>(obj: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    steps(obj, path)?.into_iter().try_fold(obj, |cur, s| match s {
        Step::Key(k) => cur.get_mut(k),
        Step::Index(i) => cur.get_mut(i),
    })
}

/// Removes what a path names from `obj` (nothing when it is not there): a map field, or the
/// list item or set member the last token names.
fn remove_at(obj: &mut Value, path: &[String]) {
    let path = path.strip_suffix(&[".".to_string()]).unwrap_or(path);
    let Some((last, parent_path)) = path.split_last() else { return };
    let Some(steps) = steps(obj, path) else { return };
    let Some(parent) = value_at_mut(obj, parent_path) else { return };
    match (steps.last(), parent) {
        (Some(Step::Key(_)), Value::Object(m)) => {
            m.remove(last.strip_prefix("f:").unwrap_or(last));
        }
        (Some(Step::Index(i)), Value::Array(list)) => {
            list.remove(*i);
        }
        _ => {}
    }
}

/// A path as the API server prints it in a conflict: `.spec.ports[port=80,protocol="TCP"].name`.
pub fn display(path: &[String]) -> String {
    let mut s = String::new();
    for t in path {
        if let Some(f) = t.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = t.strip_prefix("k:") {
            let m: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = t.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

/// FieldsV1 JSON of a field set.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for t in path {
            let next = cur.entry(t.clone()).or_insert_with(|| Value::Object(Map::new()));
            cur = match next {
                Value::Object(m) => m,
                _ => unreachable!("FieldsV1 nodes are objects"),
            };
        }
    }
    Value::Object(root)
}

/// A field set from FieldsV1 JSON: every node without children is a path.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(v: &Value, path: &mut FieldPath, out: &mut FieldSet) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, child) in m {
                    path.push(k.clone());
                    go(child, path, out);
                    path.pop();
                }
            }
            _ if !path.is_empty() => {
                out.insert(path.clone());
            }
            _ => {}
        }
    }
    let mut out = FieldSet::new();
    go(v, &mut Vec::new(), &mut out);
    out
}

/// One `managedFields` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub fields: FieldSet,
}

/// The entries of an object's `metadata.managedFields` (malformed ones are dropped).
pub fn entries_of(obj: &Value) -> Vec<Entry> {
    let Some(list) = obj.pointer("/metadata/managedFields").and_then(Value::as_array) else { return vec![] };
    list.iter()
        .filter(|e| e.get("subresource").is_none())
        .filter_map(|e| {
            Some(Entry {
                manager: e.get("manager")?.as_str()?.to_string(),
                operation: e.get("operation")?.as_str()?.to_string(),
                api_version: e.get("apiVersion").and_then(Value::as_str).unwrap_or("").to_string(),
                time: e.get("time").and_then(Value::as_str).unwrap_or("").to_string(),
                fields: from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
            })
        })
        .collect()
}

/// The JSON of entries, as `metadata.managedFields` holds them.
pub fn entries_json(entries: &[Entry]) -> Value {
    Value::Array(
        entries
            .iter()
            .map(|e| {
                json!({"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                       "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.fields)})
            })
            .collect(),
    )
}

/// A field another manager owns that an apply would change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    pub api_version: String,
    pub path: FieldPath,
}

/// What an apply does to the live object before the config is merged into it: the live object
/// without the fields the manager gave up (that nobody else owns), and the conflicts. With
/// `force`, conflicts are not errors; the fields change hands afterwards ([`after_write`]).
pub fn prepare_apply(live: &Value, config: &Value, manager: &str, lists: Lists<'_>) -> (Value, Vec<Conflict>) {
    let entries = entries_of(live);
    let applied = fields_of(config, lists);
    let mut conflicts = Vec::new();
    for e in entries.iter().filter(|e| e.manager != manager) {
        for p in applied.intersection(&e.fields) {
            if p.last().is_some_and(|t| t == ".") {
                continue;
            }
            if value_at(config, p) != value_at(live, p) {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    api_version: e.api_version.clone(),
                    path: p.clone(),
                });
            }
        }
    }
    let before: FieldSet = entries
        .iter()
        .filter(|e| e.manager == manager && e.operation == "Apply")
        .flat_map(|e| e.fields.clone())
        .collect();
    let others: FieldSet = entries.iter().filter(|e| e.manager != manager).flat_map(|e| e.fields.clone()).collect();
    let mut pruned = live.clone();
    // Deepest first, so an item's fields go before the item.
    let mut gone: Vec<&FieldPath> = before.difference(&applied).filter(|p| !others.contains(*p)).collect();
    gone.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in gone {
        // An item stays while another manager owns a field inside it.
        if p.last().is_some_and(|t| t == ".") {
            let prefix = &p[..p.len() - 1];
            if others.iter().any(|o| o.starts_with(prefix)) {
                continue;
            }
        }
        remove_at(&mut pruned, p);
    }
    (pruned, conflicts)
}

/// How a write changes ownership.
#[derive(Clone, Debug)]
pub enum Write<'a> {
    /// Server-side apply of `config` by a manager.
    Apply { manager: &'a str, config: &'a Value },
    /// Any other write (create, update, patch) by a manager.
    Update { manager: &'a str },
}

/// The entries after a write took `old` (None for a create) to `new`. Fields that changed go to
/// the writer and leave the others; fields no longer in the object leave everyone; an entry
/// whose fields did not change keeps its time. `now` stamps changed entries.
pub fn after_write(
    old: Option<&Value>,
    new: &Value,
    write: &Write<'_>,
    api_version: &str,
    now: &str,
    lists: Lists<'_>,
) -> Vec<Entry> {
    let mut entries = old.map(entries_of).unwrap_or_default();
    let present = fields_of(new, lists);
    // Which present fields this write changed; `None` on a create, where every one did. The
    // sets below are built by moving paths, not copying them: a write of a large object spends
    // most of this function's time copying paths otherwise.
    let changed: Option<FieldSet> = old.map(|o| {
        present
            .iter()
            .filter(|p| {
                // A list item itself changes only by appearing; its fields change on their own.
                if p.last().is_some_and(|t| t == ".") {
                    value_at(o, p).is_none()
                } else {
                    value_at(o, p) != value_at(new, p)
                }
            })
            .cloned()
            .collect()
    });
    let is_changed = |p: &FieldPath| changed.as_ref().is_none_or(|c| c.contains(p));
    let (manager, operation, applied) = match write {
        Write::Apply { manager, config } => (*manager, "Apply", Some(fields_of(config, lists))),
        Write::Update { manager } => (*manager, "Update", None),
    };
    // An update's manager keeps what it had and takes what it changed (of what is present).
    let before: FieldSet = match applied {
        Some(_) => FieldSet::new(),
        None => entries
            .iter()
            .filter(|e| e.manager == manager && e.operation == "Update")
            .flat_map(|e| e.fields.iter().filter(|p| present.contains(*p)).cloned())
            .collect(),
    };
    let is_mine = |p: &FieldPath| match &applied {
        Some(fields) => fields.contains(p),
        None => before.contains(p) || is_changed(p),
    };
    for e in entries.iter_mut() {
        if e.manager == manager && e.operation == operation {
            continue;
        }
        e.fields.retain(|p| present.contains(p) && !(is_changed(p) && is_mine(p)));
    }
    let mine: FieldSet = match applied {
        Some(fields) => fields.into_iter().filter(|p| present.contains(p)).collect(),
        None => present.into_iter().filter(|p| before.contains(p) || is_changed(p)).collect(),
    };
    match entries.iter_mut().find(|e| e.manager == manager && e.operation == operation) {
        Some(e) => {
            if e.fields != mine || e.api_version != api_version {
                e.fields = mine;
                e.api_version = api_version.to_string();
                e.time = now.to_string();
            }
        }
        None => entries.push(Entry {
            manager: manager.to_string(),
            operation: operation.to_string(),
            api_version: api_version.to_string(),
            time: now.to_string(),
            fields: mine,
        }),
    }
    entries.retain(|e| !e.fields.is_empty());
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(port: i64, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "labels": {"app": "web"}},
               "spec": {"selector": {"app": "web"}, "ports": [{"name": name, "port": port, "targetPort": 8080}]}})
    }

    fn p(tokens: &[&str]) -> FieldPath {
        tokens.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn field_sets_use_the_fieldsv1_vocabulary() {
        let set = fields_of(&svc(80, "http"), Lists::BuiltIn);
        let item = r#"k:{"port":80,"protocol":"TCP"}"#;
        assert!(set.contains(&p(&["f:spec", "f:ports", item, "."])));
        assert!(set.contains(&p(&["f:spec", "f:ports", item, "f:targetPort"])));
        assert!(set.contains(&p(&["f:spec", "f:selector"])), "an atomic map is a leaf");
        assert!(set.contains(&p(&["f:metadata", "f:labels", "f:app"])));
        assert!(!set.iter().any(|p| p[0] == "f:metadata" && p[1] == "f:name"));
        assert_eq!(from_fields_v1(&to_fields_v1(&set)), set, "FieldsV1 round trip");
        assert_eq!(display(&p(&["f:spec", "f:ports", item, "f:name"])), r#".spec.ports[port=80,protocol="TCP"].name"#);
    }

    #[test]
    fn a_changed_port_replaces_the_item_the_manager_applied_before() {
        let v1 = svc(80, "http");
        let mut live = v1.clone();
        live["spec"]["ports"][0]["nodePort"] = json!(30080); // the server's, nobody's field
        let entries =
            after_write(None, &live, &Write::Apply { manager: "me", config: &v1 }, "v1", "t0", Lists::BuiltIn);
        live["metadata"]["managedFields"] = entries_json(&entries);
        let v2 = svc(8081, "http");
        let (pruned, conflicts) = prepare_apply(&live, &v2, "me", Lists::BuiltIn);
        assert!(conflicts.is_empty());
        assert_eq!(pruned["spec"]["ports"], json!([]), "the port-80 item goes, with its server fields");
        assert_eq!(pruned["metadata"]["labels"], json!({"app": "web"}), "still applied");
    }

    #[test]
    fn another_managers_changed_field_is_a_conflict_and_shared_values_are_not() {
        let v1 = svc(80, "http");
        let entries = after_write(None, &v1, &Write::Apply { manager: "me", config: &v1 }, "v1", "t0", Lists::BuiltIn);
        let mut live = v1.clone();
        live["metadata"]["managedFields"] = entries_json(&entries);
        // Someone else edits the target port.
        let mut edited = live.clone();
        edited["spec"]["ports"][0]["targetPort"] = json!(9090);
        let entries =
            after_write(Some(&live), &edited, &Write::Update { manager: "kubectl-edit" }, "v1", "t1", Lists::BuiltIn);
        edited["metadata"]["managedFields"] = entries_json(&entries);
        let editor = entries.iter().find(|e| e.manager == "kubectl-edit").unwrap();
        assert_eq!(editor.fields.len(), 1, "{:?}", editor.fields);
        let mine = entries.iter().find(|e| e.manager == "me").unwrap();
        assert!(!mine.fields.iter().any(|f| f.last().unwrap() == "f:targetPort"), "taken from me");
        // Re-applying 8080 conflicts; re-applying the same value does not.
        let (_, conflicts) = prepare_apply(&edited, &v1, "me", Lists::BuiltIn);
        assert_eq!(conflicts.len(), 1);
        assert_eq!(conflicts[0].manager, "kubectl-edit");
        assert_eq!(display(&conflicts[0].path), r#".spec.ports[port=80,protocol="TCP"].targetPort"#);
        let mut same = v1.clone();
        same["spec"]["ports"][0]["targetPort"] = json!(9090);
        assert!(prepare_apply(&edited, &same, "me", Lists::BuiltIn).1.is_empty());
        // Forced: the field changes hands, the editor's entry empties and goes.
        let mut forced = edited.clone();
        forced["spec"]["ports"][0]["targetPort"] = json!(8080);
        let entries = after_write(
            Some(&edited),
            &forced,
            &Write::Apply { manager: "me", config: &v1 },
            "v1",
            "t2",
            Lists::BuiltIn,
        );
        assert_eq!(entries.iter().map(|e| e.manager.as_str()).collect::<Vec<_>>(), ["me"]);
    }

    #[test]
    fn an_unchanged_write_keeps_the_entry_time() {
        let v1 = svc(80, "http");
        let entries = after_write(None, &v1, &Write::Apply { manager: "me", config: &v1 }, "v1", "t0", Lists::BuiltIn);
        let mut live = v1.clone();
        live["metadata"]["managedFields"] = entries_json(&entries);
        let again =
            after_write(Some(&live), &live, &Write::Apply { manager: "me", config: &v1 }, "v1", "t9", Lists::BuiltIn);
        assert_eq!(again, entries);
    }
}
