//! ControllerRevisions, as the DaemonSet and StatefulSet controllers keep them: one per pod
//! template the workload has had, named `<workload>-<hash>`, numbered in the order the
//! templates were current (going back to an old template renumbers its revision as the
//! newest, as upstream does), labelled like the template (so `kubectl rollout history` finds
//! them by the workload's selector), holding the patch that restores the template (what
//! `kubectl rollout undo` applies); at most `revisionHistoryLimit` (default 10) old ones are
//! kept besides those a pod still runs. [`plan_revisions`] decides (pure); [`sync`] writes.

use std::collections::BTreeSet;

use api::Kind;
use serde_json::{json, Value};

use super::write::{controller_of, delete_quietly, ns_name};
use crate::error::ApiError;
use crate::registry::{Registry, Subresource, WriteOptions};

/// The label of a revision with its hash.
const HASH_LABEL: &str = "controller-revision-hash";
const CHANGE_CAUSE: &str = "kubernetes.io/change-cause";

/// What a workload's revisions need.
#[derive(Debug, Default, PartialEq)]
pub struct RevisionPlan {
    pub create: Option<Value>,
    /// (revision name, its new number): the current template is an older revision's.
    pub renumber: Option<(String, i64)>,
    pub delete: Vec<String>,
}

/// The patch that puts `template` back (kubectl's rollback applies it as is).
pub fn data_of(template: &Value) -> Value {
    let mut t = template.clone();
    t["$patch"] = json!("replace");
    json!({"spec": {"template": t}})
}

/// The revisions `owner` (of kind `owner_kind`, at `apps/v1`) needs, given its current
/// revision's name and hash, the revisions it owns and the revision names its pods run. Pure.
pub fn plan_revisions(
    owner: &Value,
    owner_kind: &str,
    current: &str,
    hash: &str,
    owned: &[&Value],
    in_use: &BTreeSet<String>,
) -> RevisionPlan {
    let mut plan = RevisionPlan::default();
    let number = |r: &Value| r["revision"].as_i64().unwrap_or(0);
    let newest = owned.iter().map(|r| number(r)).max().unwrap_or(0);
    match owned.iter().find(|r| ns_name(r).1 == current) {
        Some(r) if number(r) < newest => plan.renumber = Some((current.to_string(), newest + 1)),
        Some(_) => {}
        None => {
            let template = &owner["spec"]["template"];
            let mut labels = template["metadata"]["labels"].as_object().cloned().unwrap_or_default();
            labels.insert(HASH_LABEL.into(), json!(hash));
            let mut meta = json!({
                "name": current,
                "namespace": owner["metadata"]["namespace"],
                "labels": labels,
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": owner_kind, "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true,
                }],
            });
            if let Some(cause) = owner["metadata"]["annotations"].get(CHANGE_CAUSE) {
                meta["annotations"] = json!({CHANGE_CAUSE: cause});
            }
            plan.create = Some(json!({
                "apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": meta,
                "data": data_of(template), "revision": newest + 1,
            }));
        }
    }
    let limit = owner["spec"]["revisionHistoryLimit"].as_i64().unwrap_or(10).max(0) as usize;
    let mut old: Vec<&&Value> =
        owned.iter().filter(|r| ns_name(r).1 != current && !in_use.contains(&ns_name(r).1)).collect();
    old.sort_by_key(|r| number(r));
    let excess = old.len().saturating_sub(limit);
    plan.delete = old.iter().take(excess).map(|r| ns_name(r).1).collect();
    plan
}

/// Brings `owner`'s revisions up to date (see [`plan_revisions`]); `revisions` are the
/// namespace's ControllerRevisions.
pub async fn sync(
    reg: &Registry,
    owner: &Value,
    owner_kind: &str,
    current: &str,
    hash: &str,
    revisions: &[Value],
    in_use: &BTreeSet<String>,
) -> Result<(), ApiError> {
    let uid = owner["metadata"]["uid"].as_str().unwrap_or("");
    let owned: Vec<&Value> = revisions
        .iter()
        .filter(|r| controller_of(&r["metadata"]).is_some_and(|(k, u)| k == owner_kind && u == uid))
        .collect();
    let plan = plan_revisions(owner, owner_kind, current, hash, &owned, in_use);
    let ns = ns_name(owner).0;
    if let Some(rev) = plan.create {
        match reg.create(Kind::ControllerRevision, Some(&ns), rev, &WriteOptions::default()).await {
            Ok(_) | Err(ApiError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if let Some((name, n)) = plan.renumber {
        if let Some(mut rev) = reg.store.get(Kind::ControllerRevision, &ns, &name)? {
            rev["revision"] = json!(n);
            let opts = WriteOptions::default();
            match reg.update(Kind::ControllerRevision, Some(&ns), &name, rev, Subresource::Main, &opts).await {
                Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for name in plan.delete {
        delete_quietly(reg, Kind::ControllerRevision, &ns, &name).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(name: &str, n: i64) -> Value {
        json!({"metadata": {"namespace": "default", "name": name}, "revision": n})
    }

    #[test]
    fn a_new_template_is_the_next_revision_and_an_old_one_is_renumbered() {
        let ds = json!({"metadata": {"namespace": "default", "name": "agent", "uid": "u",
                                     "annotations": {CHANGE_CAUSE: "kubectl set image"}},
                        "spec": {"revisionHistoryLimit": 1,
                                 "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": []}}}});
        let plan = plan_revisions(&ds, "DaemonSet", "agent-aaa", "aaa", &[], &BTreeSet::new());
        let made = plan.create.unwrap();
        assert_eq!(made["revision"], 1);
        assert_eq!(made["metadata"]["labels"], json!({"app": "agent", HASH_LABEL: "aaa"}));
        assert_eq!(made["metadata"]["annotations"][CHANGE_CAUSE], "kubectl set image");
        assert_eq!(made["data"]["spec"]["template"]["$patch"], "replace");
        // Back to revision 1's template after 2 and 3: renumbered 4; one old one kept beside
        // those in use.
        let (r1, r2, r3) = (rev("agent-aaa", 1), rev("agent-bbb", 2), rev("agent-ccc", 3));
        let plan = plan_revisions(&ds, "DaemonSet", "agent-aaa", "aaa", &[&r1, &r2, &r3], &BTreeSet::new());
        assert_eq!(plan.create, None);
        assert_eq!(plan.renumber, Some(("agent-aaa".to_string(), 4)));
        assert_eq!(plan.delete, ["agent-bbb"]);
        let in_use: BTreeSet<String> = ["agent-bbb".to_string()].into();
        let plan = plan_revisions(&ds, "DaemonSet", "agent-aaa", "aaa", &[&r1, &r2, &r3], &in_use);
        assert!(plan.delete.is_empty(), "a pod still runs agent-bbb");
    }
}
