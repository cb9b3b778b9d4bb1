//! The self-reviews kubectl's `auth` commands send: SelfSubjectReview (`kubectl auth whoami`),
//! SelfSubjectAccessReview (`kubectl auth can-i`) and SelfSubjectRulesReview (`kubectl auth
//! can-i --list`). podpath has one identity per lab — its bearer token, the cluster's
//! administrator (no RBAC is enforced yet) — so the answers are the administrator's: who it is,
//! and yes to everything. [`answer`] is pure.

use serde_json::{json, Value};

use crate::error::ApiError;

/// Resources that are requests, not stored objects: (group, version, plural, kind).
pub const REVIEWS: [(&str, &str, &str, &str); 3] = [
    ("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview"),
    ("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview"),
    ("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview"),
];

/// Who the lab's token is.
const USER: &str = "kubernetes-admin";
const GROUPS: [&str; 2] = ["system:masters", "system:authenticated"];

/// The review (of `plural`) filled in: its status as the real server writes it for a
/// cluster administrator; a malformed one the real 422.
pub fn answer(plural: &str, body: &Value) -> Result<Value, ApiError> {
    let (group, version, _, kind) = REVIEWS.iter().find(|r| r.2 == plural).copied().ok_or(ApiError::NoRoute)?;
    let mut out = json!({"kind": kind, "apiVersion": format!("{group}/{version}"),
                         "metadata": {"creationTimestamp": null}});
    match plural {
        "selfsubjectreviews" => {
            out["status"] = json!({"userInfo": {"username": USER, "groups": GROUPS}});
        }
        "selfsubjectaccessreviews" => {
            let spec = body.get("spec").cloned().unwrap_or(json!({}));
            let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
            let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
            if resource.is_some() == non_resource.is_some() {
                let path = api::FieldPath::root("spec").child("resourceAttributes");
                let cause = api::validation::invalid(
                    &path,
                    "",
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                );
                return Err(ApiError::InvalidOptions { kind: "SelfSubjectAccessReview", causes: vec![cause] });
            }
            out["spec"] = spec;
            out["status"] = json!({"allowed": true,
                "reason": "podpath: the lab's token is the cluster's administrator (RBAC is not enforced)"});
        }
        _ => {
            out["spec"] = body.get("spec").cloned().unwrap_or(json!({}));
            out["status"] = json!({
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                "incomplete": false,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_is_who_it_is_and_may_do_everything() {
        let me = answer("selfsubjectreviews", &json!({})).unwrap();
        assert_eq!(me["status"]["userInfo"]["username"], USER);
        let ask =
            json!({"spec": {"resourceAttributes": {"verb": "create", "resource": "pods", "namespace": "default"}}});
        let yes = answer("selfsubjectaccessreviews", &ask).unwrap();
        assert_eq!((yes["status"]["allowed"].as_bool(), &yes["spec"]), (Some(true), &ask["spec"]));
        assert!(answer("selfsubjectaccessreviews", &json!({"spec": {}})).is_err());
        let rules = answer("selfsubjectrulesreviews", &json!({"spec": {"namespace": "default"}})).unwrap();
        assert_eq!(rules["status"]["resourceRules"][0]["verbs"], json!(["*"]));
    }
}
