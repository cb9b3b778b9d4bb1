//! RBAC as kube-apiserver's authorizer decides it (`rbac.authorization.k8s.io/v1`): who a request
//! is ([`UserInfo`]), what it asks ([`Attributes`]: a verb on a resource or on a URL path), and
//! whether a binding of the user, of one of its groups or of its ServiceAccount grants a rule that
//! covers it. Pure: the caller hands in the roles and bindings it read. Also the validation of
//! rules, role references and subjects, with the real texts, shared by the four kinds.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use serde_json::{json, Value};

use crate::validation::{self as v, Cause, FieldPath};

pub const GROUP: &str = "rbac.authorization.k8s.io";

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The lab's token: kubeadm's administrator.
    pub fn admin() -> UserInfo {
        UserInfo {
            name: "kubernetes-admin".into(),
            uid: String::new(),
            groups: vec!["kubeadm:cluster-admins".into(), "system:masters".into(), "system:authenticated".into()],
        }
    }

    /// A ServiceAccount, with the groups the real token authenticator gives it.
    pub fn service_account(namespace: &str, name: &str, uid: &str) -> UserInfo {
        UserInfo {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            uid: uid.into(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    /// `system:masters` skips authorization, as in kube-apiserver.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }

    /// `userInfo` of a review's status.
    pub fn to_json(&self) -> Value {
        let mut u = json!({"username": self.name, "groups": self.groups});
        if !self.uid.is_empty() {
            u["uid"] = json!(self.uid);
        }
        u
    }

    /// The ServiceAccount a user name stands for: (namespace, name).
    pub fn service_account_of(&self) -> Option<(&str, &str)> {
        self.name.strip_prefix("system:serviceaccount:")?.split_once(':')
    }
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attributes {
    Resource {
        verb: String,
        group: String,
        /// The plural (`pods`).
        resource: String,
        subresource: String,
        /// Empty: cluster scope (or every namespace).
        namespace: String,
        name: String,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

impl Attributes {
    /// A request on a resource: `verb` on `group`'s `resource[/subresource]` `name` in `namespace`.
    pub fn resource(
        verb: &str,
        group: &str,
        resource: &str,
        subresource: &str,
        namespace: &str,
        name: &str,
    ) -> Attributes {
        Attributes::Resource {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

/// The roles and bindings the decision reads.
#[derive(Debug, Default, Clone)]
pub struct Policy {
    pub roles: Vec<Role>,
    pub cluster_roles: Vec<ClusterRole>,
    pub role_bindings: Vec<RoleBinding>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
}

fn has(list: &Option<Vec<String>>, want: &str) -> bool {
    list.as_ref().is_some_and(|l| l.iter().any(|x| x == "*" || x == want))
}

/// Whether one rule covers the request (kube-apiserver's `RuleAllows`).
pub fn rule_allows(rule: &PolicyRule, attrs: &Attributes) -> bool {
    match attrs {
        Attributes::Resource { verb, group, resource, subresource, name, .. } => {
            if !rule.verbs.iter().any(|x| x == "*" || x == verb) || !has(&rule.api_groups, group) {
                return false;
            }
            let combined = if subresource.is_empty() { resource.clone() } else { format!("{resource}/{subresource}") };
            let resources = rule.resources.as_deref().unwrap_or_default();
            let resource_ok = resources.iter().any(|r| {
                r == "*"
                    || *r == combined
                    || (!subresource.is_empty() && r.strip_prefix("*/").is_some_and(|s| s == subresource))
            });
            let names = rule.resource_names.as_deref().unwrap_or_default();
            resource_ok && (names.is_empty() || names.iter().any(|n| n == name))
        }
        Attributes::NonResource { verb, path } => {
            rule.verbs.iter().any(|x| x == "*" || x == verb)
                && rule.non_resource_urls.as_deref().unwrap_or_default().iter().any(|u| {
                    u == "*" || u == path || u.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
                })
        }
    }
}

fn subject_matches(s: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match s.kind.as_str() {
        "User" => s.name == user.name,
        "Group" => user.groups.contains(&s.name),
        "ServiceAccount" => {
            let ns = s.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(binding_namespace);
            user.name == format!("system:serviceaccount:{ns}:{}", s.name)
        }
        _ => false,
    }
}

impl Policy {
    fn cluster_role(&self, name: &str) -> Option<&ClusterRole> {
        self.cluster_roles.iter().find(|r| r.metadata.name.as_deref() == Some(name))
    }

    fn role_rules(&self, role_ref: &RoleRef, namespace: &str) -> Vec<PolicyRule> {
        match role_ref.kind.as_str() {
            "ClusterRole" => self.cluster_role(&role_ref.name).and_then(|r| r.rules.clone()).unwrap_or_default(),
            "Role" => self
                .roles
                .iter()
                .find(|r| {
                    r.metadata.name.as_deref() == Some(role_ref.name.as_str())
                        && r.metadata.namespace.as_deref() == Some(namespace)
                })
                .and_then(|r| r.rules.clone())
                .unwrap_or_default(),
            _ => vec![],
        }
    }

    /// Every rule granted to `user` that applies in `namespace` (cluster-wide rules, and those of
    /// the namespace's RoleBindings; `namespace` empty: cluster-wide only), each with the binding
    /// that grants it (`ClusterRoleBinding "x" of ClusterRole "y"`).
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<(PolicyRule, String)> {
        let mut out = vec![];
        for b in &self.cluster_role_bindings {
            if b.subjects.iter().flatten().any(|s| subject_matches(s, user, "")) {
                let why = format!(
                    "ClusterRoleBinding \"{}\" of ClusterRole \"{}\"",
                    b.metadata.name.as_deref().unwrap_or(""),
                    b.role_ref.name
                );
                out.extend(self.role_rules(&b.role_ref, "").into_iter().map(|r| (r, why.clone())));
            }
        }
        if !namespace.is_empty() {
            for b in self.role_bindings.iter().filter(|b| b.metadata.namespace.as_deref() == Some(namespace)) {
                if b.subjects.iter().flatten().any(|s| subject_matches(s, user, namespace)) {
                    let why = format!(
                        "RoleBinding \"{}\" of {} \"{}\" to {}",
                        b.metadata.name.as_deref().unwrap_or(""),
                        b.role_ref.kind,
                        b.role_ref.name,
                        namespace
                    );
                    out.extend(self.role_rules(&b.role_ref, namespace).into_iter().map(|r| (r, why.clone())));
                }
            }
        }
        out
    }

    /// The decision: allowed, and why (the binding that allowed it), as kube-apiserver's RBAC
    /// authorizer words its reason (`RBAC: allowed by …`).
    pub fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> (bool, String) {
        if user.is_master() {
            return (true, String::new());
        }
        let namespace = match attrs {
            Attributes::Resource { namespace, .. } => namespace.as_str(),
            Attributes::NonResource { .. } => "",
        };
        match self.rules_for(user, namespace).into_iter().find(|(r, _)| rule_allows(r, attrs)) {
            Some((_, why)) => (true, format!("RBAC: allowed by {why}")),
            None => (false, String::new()),
        }
    }
}

/// The 403 message kube-apiserver writes for a denied request.
pub fn forbidden_message(user: &UserInfo, attrs: &Attributes, qualified: &str) -> String {
    match attrs {
        Attributes::Resource { verb, group, resource, subresource, namespace, name } => {
            let what = if name.is_empty() { qualified.to_string() } else { format!("{qualified} \"{name}\"") };
            let res = if subresource.is_empty() { resource.clone() } else { format!("{resource}/{subresource}") };
            let scope = if namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace \"{namespace}\"")
            };
            format!(
                "{what} is forbidden: User \"{}\" cannot {verb} resource \"{res}\" in API group \"{group}\" {scope}",
                user.name
            )
        }
        Attributes::NonResource { verb, path } => {
            format!("forbidden: User \"{}\" cannot {verb} path \"{path}\"", user.name)
        }
    }
}

/// The Table of a RoleBinding or ClusterRoleBinding: `NAME ROLE AGE`, the role as `Kind/name`.
pub fn binding_columns() -> Vec<crate::table::Column> {
    use crate::table::{col, AGE_COLUMN, NAME_COLUMN};
    vec![NAME_COLUMN, col("Role", "string", 0), AGE_COLUMN]
}

/// The cells of [`binding_columns`].
pub fn binding_cells(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    role_ref: &RoleRef,
    now: jiff::Timestamp,
) -> Vec<Value> {
    vec![
        json!(meta.name.clone().unwrap_or_default()),
        json!(format!("{}/{}", role_ref.kind, role_ref.name)),
        crate::table::age(meta.creation_timestamp.as_ref(), now),
    ]
}

/// A rule as a SelfSubjectRulesReview lists it.
pub fn rule_json(r: &PolicyRule) -> (bool, Value) {
    let non_resource = r.non_resource_urls.as_ref().is_some_and(|u| !u.is_empty());
    if non_resource {
        (true, json!({"verbs": r.verbs, "nonResourceURLs": r.non_resource_urls}))
    } else {
        let mut v = json!({"verbs": r.verbs, "apiGroups": r.api_groups.clone().unwrap_or_default(),
                           "resources": r.resources.clone().unwrap_or_default()});
        if let Some(n) = r.resource_names.as_ref().filter(|n| !n.is_empty()) {
            v["resourceNames"] = json!(n);
        }
        (false, v)
    }
}

// === validation ===

/// `rules[i]` of a Role (`namespaced`) or ClusterRole.
pub fn validate_rules(rules: &[PolicyRule], namespaced: bool, out: &mut Vec<Cause>) {
    for (i, r) in rules.iter().enumerate() {
        let path = FieldPath::root("rules").index(i);
        if r.verbs.is_empty() {
            out.push(v::required(&path.child("verbs"), "verbs must contain at least one value"));
        }
        let urls = r.non_resource_urls.as_deref().unwrap_or_default();
        if !urls.is_empty() {
            if namespaced {
                out.push(v::invalid(
                    &path.child("nonResourceURLs"),
                    urls,
                    "namespaced rules cannot apply to non-resource URLs",
                ));
            }
            if r.api_groups.as_ref().is_some_and(|g| !g.is_empty())
                || r.resources.as_ref().is_some_and(|g| !g.is_empty())
            {
                out.push(v::invalid(
                    &path.child("nonResourceURLs"),
                    urls,
                    "rules cannot apply to both regular resources and non-resource URLs",
                ));
            }
            continue;
        }
        if r.api_groups.as_ref().is_none_or(|g| g.is_empty()) {
            out.push(v::required(&path.child("apiGroups"), "resource rules must supply at least one api group"));
        }
        if r.resources.as_ref().is_none_or(|g| g.is_empty()) {
            out.push(v::required(&path.child("resources"), "resource rules must supply at least one resource"));
        }
    }
}

/// `roleRef` and `subjects` of a RoleBinding (`namespaced`) or ClusterRoleBinding; `old_ref`: the
/// stored binding's (it never changes).
pub fn validate_binding(
    role_ref: &RoleRef,
    subjects: &[Subject],
    namespaced: bool,
    old_ref: Option<&RoleRef>,
    out: &mut Vec<Cause>,
) {
    let path = FieldPath::root("roleRef");
    if role_ref.api_group != GROUP {
        out.push(v::not_supported(&path.child("apiGroup"), role_ref.api_group.as_str(), &[GROUP]));
    }
    let kinds: &[&str] = if namespaced { &["Role", "ClusterRole"] } else { &["ClusterRole"] };
    if !kinds.contains(&role_ref.kind.as_str()) {
        out.push(v::not_supported(&path.child("kind"), role_ref.kind.as_str(), kinds));
    }
    if role_ref.name.is_empty() {
        out.push(v::required(&path.child("name"), ""));
    } else {
        v::push_all(out, &path.child("name"), &role_ref.name, path_segment(&role_ref.name));
    }
    if old_ref.is_some_and(|o| o != role_ref) {
        let shown = format!(
            "rbac.RoleRef{{APIGroup:\"{}\", Kind:\"{}\", Name:\"{}\"}}",
            role_ref.api_group, role_ref.kind, role_ref.name
        );
        out.push(v::invalid(&path, shown.as_str(), "cannot change roleRef"));
    }
    for (i, s) in subjects.iter().enumerate() {
        let p = FieldPath::root("subjects").index(i);
        if s.name.is_empty() {
            out.push(v::required(&p.child("name"), ""));
        }
        match s.kind.as_str() {
            "ServiceAccount" => {
                if s.api_group.as_deref().is_some_and(|g| !g.is_empty()) {
                    out.push(v::not_supported(&p.child("apiGroup"), s.api_group.as_deref().unwrap_or(""), &[""]));
                }
                if !namespaced && s.namespace.as_deref().is_none_or(str::is_empty) {
                    out.push(v::required(&p.child("namespace"), ""));
                }
            }
            "User" | "Group" => {
                if s.api_group.as_deref() != Some(GROUP) {
                    out.push(v::not_supported(&p.child("apiGroup"), s.api_group.as_deref().unwrap_or(""), &[GROUP]));
                }
            }
            other => out.push(v::not_supported(&p.child("kind"), other, &["ServiceAccount", "User", "Group"])),
        }
    }
}

/// A name of a path segment (RBAC names): not `.` or `..`, no `/` or `%`.
pub fn path_segment(name: &str) -> Vec<String> {
    match name {
        "." | ".." => vec![format!("may not be '{name}'")],
        _ => ["/", "%"].iter().filter(|c| name.contains(*c)).map(|c| format!("may not contain '{c}'")).collect(),
    }
}

/// The ClusterRoles and ClusterRoleBindings kube-apiserver makes at start (its bootstrap policy,
/// the part a lab meets): `cluster-admin` for `system:masters`; `admin`, `edit` and `view` to
/// bind in a namespace (their rules written out: no aggregation controller runs); the basic
/// user's self reviews and discovery for every authenticated user.
pub fn bootstrap() -> (Vec<Value>, Vec<Value>) {
    let meta = |name: &str| {
        json!({"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
               "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
    };
    let read = ["get", "list", "watch"];
    let write = ["create", "delete", "deletecollection", "patch", "update"];
    let core_read = [
        "pods",
        "pods/log",
        "pods/status",
        "services",
        "services/status",
        "endpoints",
        "configmaps",
        "persistentvolumeclaims",
        "persistentvolumeclaims/status",
        "replicationcontrollers",
        "replicationcontrollers/scale",
        "replicationcontrollers/status",
        "serviceaccounts",
        "events",
        "bindings",
        "limitranges",
        "resourcequotas",
        "namespaces",
        "namespaces/status",
    ];
    let apps = [
        "deployments",
        "deployments/scale",
        "deployments/status",
        "replicasets",
        "replicasets/scale",
        "replicasets/status",
        "statefulsets",
        "statefulsets/scale",
        "statefulsets/status",
        "daemonsets",
        "daemonsets/status",
        "controllerrevisions",
    ];
    let view_rules = json!([
        {"apiGroups": [""], "resources": core_read, "verbs": read},
        {"apiGroups": ["apps"], "resources": apps, "verbs": read},
        {"apiGroups": ["batch"], "resources": ["jobs", "jobs/status", "cronjobs", "cronjobs/status"], "verbs": read},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
        {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingresses/status", "networkpolicies"], "verbs": read},
        {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": read},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": read},
    ]);
    let mut edit_rules = view_rules.as_array().cloned().unwrap_or_default();
    edit_rules.extend([
        json!({"apiGroups": [""], "resources": ["pods", "pods/attach", "pods/exec", "pods/portforward", "pods/proxy",
                "pods/eviction", "pods/ephemeralcontainers", "services", "services/proxy", "endpoints", "configmaps",
                "secrets", "persistentvolumeclaims", "replicationcontrollers", "replicationcontrollers/scale",
                "serviceaccounts", "events"], "verbs": write}),
        json!({"apiGroups": [""], "resources": ["secrets"], "verbs": read}),
        json!({"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}),
        json!({"apiGroups": ["apps"], "resources": apps, "verbs": write}),
        json!({"apiGroups": ["batch"], "resources": ["jobs", "cronjobs"], "verbs": write}),
        json!({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": write}),
        json!({"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "networkpolicies"], "verbs": write}),
        json!({"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": write}),
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": write}),
    ]);
    let mut admin_rules = edit_rules.clone();
    admin_rules.push(json!({"apiGroups": [GROUP], "resources": ["roles", "rolebindings"],
                            "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}));
    admin_rules.push(
        json!({"apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"], "verbs": ["create"]}),
    );
    let roles = vec![
        json!({"metadata": meta("cluster-admin"), "rules": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
        json!({"metadata": meta("admin"), "rules": admin_rules}),
        json!({"metadata": meta("edit"), "rules": edit_rules}),
        json!({"metadata": meta("view"), "rules": view_rules}),
        json!({"metadata": meta("system:basic-user"), "rules": [
            {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]}),
        json!({"metadata": meta("system:discovery"), "rules": [
            {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
                                 "/readyz", "/version", "/version/"], "verbs": ["get"]}]}),
        json!({"metadata": meta("system:public-info-viewer"), "rules": [
            {"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]}),
    ];
    let bind = |name: &str, group: &str| {
        json!({"metadata": meta(name),
               "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": name},
               "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": group}]})
    };
    let bindings = vec![
        bind("cluster-admin", "system:masters"),
        bind("system:basic-user", "system:authenticated"),
        bind("system:discovery", "system:authenticated"),
        bind("system:public-info-viewer", "system:authenticated"),
    ];
    (roles, bindings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        let (roles, bindings) = bootstrap();
        let mut p = Policy {
            cluster_roles: roles.into_iter().map(|r| serde_json::from_value(r).unwrap()).collect(),
            cluster_role_bindings: bindings.into_iter().map(|b| serde_json::from_value(b).unwrap()).collect(),
            ..Default::default()
        };
        p.roles.push(
            serde_json::from_value(json!({"metadata": {"name": "pod-reader", "namespace": "default"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                          {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["get"]}]}))
            .unwrap(),
        );
        p.role_bindings.push(
            serde_json::from_value(json!({"metadata": {"name": "read-pods", "namespace": "default"},
                "roleRef": {"apiGroup": GROUP, "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader"}]}))
            .unwrap(),
        );
        p.role_bindings.push(
            serde_json::from_value(json!({"metadata": {"name": "viewers", "namespace": "team"},
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "Group", "apiGroup": GROUP, "name": "system:serviceaccounts:default"}]}))
            .unwrap(),
        );
        p
    }

    fn res(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(verb, group, resource, sub, ns, name)
    }

    #[test]
    fn a_service_account_gets_what_its_bindings_grant_and_nothing_else() {
        let p = policy();
        let reader = UserInfo::service_account("default", "reader", "u1");
        let (ok, why) = p.authorize(&reader, &res("list", "", "pods", "", "default", ""));
        assert!(ok);
        assert_eq!(why, "RBAC: allowed by RoleBinding \"read-pods\" of Role \"pod-reader\" to default");
        assert!(!p.authorize(&reader, &res("delete", "", "pods", "", "default", "web")).0);
        assert!(!p.authorize(&reader, &res("list", "", "pods", "", "kube-system", "")).0, "another namespace");
        assert!(!p.authorize(&reader, &res("get", "", "pods", "log", "default", "web")).0, "a subresource is its own");
        assert!(p.authorize(&reader, &res("get", "", "configmaps", "", "default", "settings")).0);
        assert!(!p.authorize(&reader, &res("get", "", "configmaps", "", "default", "other")).0, "resourceNames");
        // Its namespace's group is bound to view in `team`.
        assert!(p.authorize(&reader, &res("list", "apps", "deployments", "", "team", "")).0);
        assert!(!p.authorize(&reader, &res("list", "", "secrets", "", "team", "")).0, "view reads no secrets");
        // Every authenticated user: discovery and its own reviews.
        assert!(p.authorize(&reader, &Attributes::NonResource { verb: "get".into(), path: "/apis/apps/v1".into() }).0);
        assert!(p.authorize(&reader, &res("create", "authorization.k8s.io", "selfsubjectaccessreviews", "", "", "")).0);
        assert!(!p.authorize(&reader, &Attributes::NonResource { verb: "get".into(), path: "/metrics".into() }).0);
        // The administrator is not even looked up.
        assert_eq!(
            p.authorize(&UserInfo::admin(), &res("delete", "", "nodes", "", "", "node-1")),
            (true, String::new())
        );
    }

    #[test]
    fn denials_read_as_kube_apiserver_writes_them() {
        let u = UserInfo::service_account("default", "reader", "");
        assert_eq!(
            forbidden_message(&u, &res("list", "", "services", "", "default", ""), "services"),
            "services is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"services\" in API group \"\" in the namespace \"default\""
        );
        assert_eq!(
            forbidden_message(&u, &res("create", "", "pods", "exec", "default", "web"), "pods"),
            "pods \"web\" is forbidden: User \"system:serviceaccount:default:reader\" cannot create resource \"pods/exec\" in API group \"\" in the namespace \"default\""
        );
        assert_eq!(
            forbidden_message(&u, &res("list", "", "nodes", "", "", ""), "nodes"),
            "nodes is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"nodes\" in API group \"\" at the cluster scope"
        );
        assert_eq!(
            forbidden_message(&u, &Attributes::NonResource { verb: "get".into(), path: "/metrics".into() }, ""),
            "forbidden: User \"system:serviceaccount:default:reader\" cannot get path \"/metrics\""
        );
    }

    #[test]
    fn rules_and_bindings_are_checked_with_the_real_texts() {
        let rules: Vec<PolicyRule> = serde_json::from_value(json!([
            {"verbs": [], "apiGroups": [""], "resources": ["pods"]},
            {"verbs": ["get"], "nonResourceURLs": ["/x"]},
            {"verbs": ["get"], "resources": ["pods"]}
        ]))
        .unwrap();
        let mut out = vec![];
        validate_rules(&rules, true, &mut out);
        let shown: Vec<String> = out.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            shown,
            [
                "rules[0].verbs: Required value: verbs must contain at least one value",
                "rules[1].nonResourceURLs: Invalid value: []string{\"/x\"}: namespaced rules cannot apply to non-resource URLs",
                "rules[2].apiGroups: Required value: resource rules must supply at least one api group",
            ]
        );
        let role_ref: RoleRef =
            serde_json::from_value(json!({"apiGroup": GROUP, "kind": "Role", "name": "r"})).unwrap();
        let subjects: Vec<Subject> =
            serde_json::from_value(json!([{"kind": "Robot", "name": "x"}, {"kind": "ServiceAccount", "name": "sa"}]))
                .unwrap();
        let mut out = vec![];
        validate_binding(&role_ref, &subjects, false, None, &mut out);
        let shown: Vec<String> = out.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            shown,
            [
                "roleRef.kind: Unsupported value: \"Role\": supported values: \"ClusterRole\"",
                "subjects[0].kind: Unsupported value: \"Robot\": supported values: \"ServiceAccount\", \"User\", \"Group\"",
                "subjects[1].namespace: Required value",
            ]
        );
        let other: RoleRef = serde_json::from_value(json!({"apiGroup": GROUP, "kind": "Role", "name": "s"})).unwrap();
        let mut out = vec![];
        validate_binding(&role_ref, &[], true, Some(&other), &mut out);
        assert!(out[0].to_string().ends_with("cannot change roleRef"), "{:?}", out);
    }
}
