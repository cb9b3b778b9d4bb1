//! The self-reviews kubectl's `auth` commands send: SelfSubjectReview (`kubectl auth whoami`),
//! SelfSubjectAccessReview (`kubectl auth can-i`) and SelfSubjectRulesReview (`kubectl auth
//! can-i --list`), answered for the request's user with the store's RBAC policy. [`answer`] is
//! pure.

use api::rbac::{Attributes, Policy, UserInfo};
use serde_json::{json, Value};

use crate::error::ApiError;

/// Resources that are requests, not stored objects: (group, version, plural, kind).
pub const REVIEWS: [(&str, &str, &str, &str); 3] = [
    ("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview"),
    ("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview"),
    ("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview"),
];

/// The review (of `plural`) filled in for `user`, as the real server writes it: who the user is,
/// whether it may do what the review asks (RBAC over `policy`), the rules it has in a namespace;
/// a malformed one the real 422.
pub fn answer(plural: &str, body: &Value, user: &UserInfo, policy: &Policy) -> Result<Value, ApiError> {
    let (group, version, _, kind) = REVIEWS.iter().find(|r| r.2 == plural).copied().ok_or(ApiError::NoRoute)?;
    let mut out = json!({"kind": kind, "apiVersion": format!("{group}/{version}"),
                         "metadata": {"creationTimestamp": null}});
    match plural {
        "selfsubjectreviews" => {
            out["status"] = json!({"userInfo": user.to_json()});
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
            let s =
                |v: Option<&Value>, k: &str| v.and_then(|v| v.get(k)).and_then(Value::as_str).unwrap_or("").to_string();
            let attrs = match resource {
                Some(_) => Attributes::resource(
                    &s(resource, "verb"),
                    &s(resource, "group"),
                    &s(resource, "resource"),
                    &s(resource, "subresource"),
                    &s(resource, "namespace"),
                    &s(resource, "name"),
                ),
                None => Attributes::NonResource { verb: s(non_resource, "verb"), path: s(non_resource, "path") },
            };
            let (allowed, reason) = policy.authorize(user, &attrs);
            out["spec"] = spec;
            out["status"] = json!({"allowed": allowed});
            if !reason.is_empty() {
                out["status"]["reason"] = json!(reason);
            }
        }
        _ => {
            let spec = body.get("spec").cloned().unwrap_or(json!({}));
            let namespace = spec.get("namespace").and_then(Value::as_str).unwrap_or("");
            let (mut resource_rules, mut non_resource_rules) = (vec![], vec![]);
            if user.is_master() {
                resource_rules.push(json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}));
                non_resource_rules.push(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
            } else {
                for (rule, _) in policy.rules_for(user, namespace) {
                    match api::rbac::rule_json(&rule) {
                        (true, r) => non_resource_rules.push(r),
                        (false, r) => resource_rules.push(r),
                    }
                }
            }
            out["spec"] = spec;
            out["status"] = json!({"resourceRules": resource_rules, "nonResourceRules": non_resource_rules,
                                   "incomplete": false});
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_admin_is_who_it_is_and_may_do_everything() {
        let (admin, none) = (UserInfo::admin(), Policy::default());
        let me = answer("selfsubjectreviews", &json!({}), &admin, &none).unwrap();
        assert_eq!(me["status"]["userInfo"]["username"], "kubernetes-admin");
        let ask =
            json!({"spec": {"resourceAttributes": {"verb": "create", "resource": "pods", "namespace": "default"}}});
        let yes = answer("selfsubjectaccessreviews", &ask, &admin, &none).unwrap();
        assert_eq!((yes["status"]["allowed"].as_bool(), &yes["spec"]), (Some(true), &ask["spec"]));
        assert!(answer("selfsubjectaccessreviews", &json!({"spec": {}}), &admin, &none).is_err());
        let rules =
            answer("selfsubjectrulesreviews", &json!({"spec": {"namespace": "default"}}), &admin, &none).unwrap();
        assert_eq!(rules["status"]["resourceRules"][0]["verbs"], json!(["*"]));
    }

    #[test]
    fn a_service_account_is_answered_from_its_bindings() {
        let (roles, bindings) = api::rbac::bootstrap();
        let policy = Policy {
            cluster_roles: roles.into_iter().map(|r| serde_json::from_value(r).unwrap()).collect(),
            cluster_role_bindings: bindings.into_iter().map(|b| serde_json::from_value(b).unwrap()).collect(),
            ..Default::default()
        };
        let bot = UserInfo::service_account("team", "bot", "u");
        let ask = json!({"spec": {"resourceAttributes": {"verb": "list", "resource": "pods", "namespace": "team"}}});
        let no = answer("selfsubjectaccessreviews", &ask, &bot, &policy).unwrap();
        assert_eq!(no["status"], json!({"allowed": false}));
        let ask = json!({"spec": {"nonResourceAttributes": {"verb": "get", "path": "/version"}}});
        let yes = answer("selfsubjectaccessreviews", &ask, &bot, &policy).unwrap();
        assert_eq!(yes["status"]["allowed"], json!(true));
        assert!(yes["status"]["reason"].as_str().unwrap().starts_with("RBAC: allowed by ClusterRoleBinding"));
        let rules = answer("selfsubjectrulesreviews", &json!({"spec": {"namespace": "team"}}), &bot, &policy).unwrap();
        assert!(rules["status"]["nonResourceRules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["nonResourceURLs"] == json!(["/healthz", "/livez", "/readyz", "/version", "/version/"])));
        let me = answer("selfsubjectreviews", &json!({}), &bot, &policy).unwrap();
        assert_eq!(me["status"]["userInfo"]["groups"][1], "system:serviceaccounts:team");
    }
}
