//! Who a request is and what it asks, as kube-apiserver's authentication and authorization see
//! it. The lab's token is the administrator (`kubernetes-admin` in `system:masters`); a
//! ServiceAccount token (a JWT signed with the server's ES256 key, as `kubectl create token`
//! gets one through the TokenRequest API) is that ServiceAccount while it exists; a caller
//! allowed to `impersonate` may act as another user (`kubectl --as`). The request's
//! [`Attributes`] are derived from its method and path ([`attributes`], pure), and RBAC decides
//! with the roles and bindings in the store.

use std::collections::BTreeMap;
use std::path::Path;

use api::rbac::{Attributes, Policy, UserInfo};
use api::Kind;
use base64::Engine;
use http::{HeaderMap, Method};
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, KeyPair};
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::registry::Registry;

/// The issuer written into tokens (kube-apiserver's default `--service-account-issuer`).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).ok()
}

/// The ServiceAccount token signer and verifier.
pub struct Tokens {
    key: EcdsaKeyPair,
    kid: String,
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub expires: i64,
}

impl Tokens {
    /// The key in `dir/sa.key` (PKCS#8), made on first start.
    pub fn load_or_create(dir: &Path) -> Result<Tokens, ApiError> {
        let path = dir.join("sa.key");
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let rng = SystemRandom::new();
        let der = match std::fs::read(&path) {
            Ok(d) => d,
            Err(_) => {
                let doc = EcdsaKeyPair::generate_pkcs8(alg, &rng)
                    .map_err(|_| ApiError::internal("cannot make the service account signing key"))?;
                std::fs::create_dir_all(dir)
                    .map_err(|e| ApiError::internal(format!("create {}: {e}", dir.display())))?;
                write_private(&path, doc.as_ref())?;
                doc.as_ref().to_vec()
            }
        };
        let key = EcdsaKeyPair::from_pkcs8(alg, &der, &rng)
            .map_err(|_| ApiError::internal(format!("{} is not an ECDSA P-256 key", path.display())))?;
        use sha2::Digest;
        let kid = b64(&sha2::Sha256::digest(key.public_key().as_ref())[..16]);
        Ok(Tokens { key, kid })
    }

    /// A signed token for a ServiceAccount, valid `seconds` from `now` (unix seconds).
    pub fn issue(&self, ns: &str, name: &str, uid: &str, audiences: &[String], now: i64, seconds: i64) -> String {
        let header = json!({"alg": "ES256", "kid": self.kid});
        let claims = json!({
            "aud": audiences,
            "exp": now + seconds,
            "iat": now,
            "iss": ISSUER,
            "jti": format!("{:016x}", fastrand::u64(..)),
            "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": name, "uid": uid}},
            "nbf": now,
            "sub": format!("system:serviceaccount:{ns}:{name}"),
        });
        let signing_input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
        let sig =
            self.key.sign(&SystemRandom::new(), signing_input.as_bytes()).map(|s| b64(s.as_ref())).unwrap_or_default();
        format!("{signing_input}.{sig}")
    }

    /// The claims of a token this server signed, unexpired at `now`.
    pub fn verify(&self, token: &str, now: i64) -> Option<Claims> {
        let mut parts = token.split('.');
        let (h, c, s) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let public =
            signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, self.key.public_key().as_ref());
        public.verify(format!("{h}.{c}").as_bytes(), &unb64(s)?).ok()?;
        let claims: Value = serde_json::from_slice(&unb64(c)?).ok()?;
        let expires = claims["exp"].as_i64()?;
        if expires <= now || claims["iss"] != ISSUER {
            return None;
        }
        let k = &claims["kubernetes.io"];
        Some(Claims {
            namespace: k["namespace"].as_str()?.to_string(),
            name: k["serviceaccount"]["name"].as_str()?.to_string(),
            uid: k["serviceaccount"]["uid"].as_str().unwrap_or("").to_string(),
            expires,
        })
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), ApiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| ApiError::internal(format!("write {}: {e}", path.display())))?;
    f.write_all(bytes).map_err(|e| ApiError::internal(format!("write {}: {e}", path.display())))
}

/// The bearer token of a request.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Authenticates a request: `None` is 401. Without an admin token (an `--insecure-http` test
/// server with no token), everybody is the administrator.
pub fn authenticate(
    reg: &Registry,
    admin_token: Option<&str>,
    tokens: Option<&Tokens>,
    headers: &HeaderMap,
    now: i64,
) -> Option<UserInfo> {
    let Some(admin) = admin_token else { return Some(UserInfo::admin()) };
    let presented = bearer(headers)?;
    if presented == admin {
        return Some(UserInfo::admin());
    }
    let claims = tokens?.verify(presented, now)?;
    // A token outlives nothing it names: its ServiceAccount must still be the same one.
    let sa = reg.store.get(Kind::ServiceAccount, &claims.namespace, &claims.name).ok()??;
    let uid = sa.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("");
    if !claims.uid.is_empty() && uid != claims.uid {
        return None;
    }
    Some(UserInfo::service_account(&claims.namespace, &claims.name, uid))
}

/// `Impersonate-User` / `Impersonate-Group` / `Impersonate-Uid`: the user the caller asks to act
/// as, and the checks that must pass first (`impersonate` on users, groups, serviceaccounts).
pub fn impersonation(headers: &HeaderMap) -> Option<(UserInfo, Vec<Attributes>)> {
    let user = headers.get("impersonate-user").and_then(|v| v.to_str().ok())?.to_string();
    let groups: Vec<String> =
        headers.get_all("impersonate-group").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect();
    let uid = headers.get("impersonate-uid").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let check = |resource: &str, namespace: &str, name: &str| {
        let group = if resource == "uids" { "authentication.k8s.io" } else { "" };
        Attributes::resource("impersonate", group, resource, "", namespace, name)
    };
    let mut checks = vec![];
    let mut info = match user.strip_prefix("system:serviceaccount:").and_then(|r| r.split_once(':')) {
        Some((ns, name)) => {
            checks.push(check("serviceaccounts", ns, name));
            UserInfo::service_account(ns, name, &uid)
        }
        None => {
            checks.push(check("users", "", &user));
            UserInfo { name: user.clone(), uid: uid.clone(), groups: vec![] }
        }
    };
    for g in &groups {
        checks.push(check("groups", "", g));
        if !info.groups.contains(g) {
            info.groups.push(g.clone());
        }
    }
    if !uid.is_empty() {
        checks.push(check("uids", "", &uid));
    }
    if !info.groups.iter().any(|g| g == "system:authenticated") && user != "system:anonymous" {
        info.groups.push("system:authenticated".into());
    }
    Some((info, checks))
}

/// What a request asks, from its method, path and query (kube-apiserver's request info).
pub fn attributes(method: &Method, path: &str, query: &BTreeMap<String, String>) -> Attributes {
    let segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    let (group, rest): (&str, &[&str]) = match segs.as_slice() {
        ["api", "v1", rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", g, _v, rest @ ..] if !rest.is_empty() => (g, rest),
        _ => {
            return Attributes::NonResource { verb: method.as_str().to_ascii_lowercase(), path: path.to_string() };
        }
    };
    // `namespaces/NS/PLURAL/…` is namespaced; `namespaces/NS[/SUB]` is the namespace itself
    // (whose namespace attribute is its own name, as kube-apiserver's request info has it).
    let (namespace, parts): (String, Vec<&str>) = match rest {
        ["namespaces", ns, plural, tail @ ..] if !matches!(*plural, "status" | "finalize") || !tail.is_empty() => {
            (ns.to_string(), std::iter::once(*plural).chain(tail.iter().copied()).collect())
        }
        ["namespaces", ns, tail @ ..] => (ns.to_string(), [&["namespaces", ns][..], tail].concat()),
        other => (String::new(), other.to_vec()),
    };
    let at = |i: usize| parts.get(i).copied().unwrap_or("");
    let (resource, name, subresource) = (at(0), at(1), at(2));
    let watch = query.get("watch").is_some_and(|v| v == "true" || v == "1");
    // A WebSocket upgrade (GET) to exec, attach or port-forward needs `create`, as POST does
    // (kube-apiserver's AuthorizePodWebsocketUpgradeCreatePermission).
    let connect = resource == "pods" && matches!(subresource, "exec" | "attach" | "portforward");
    let verb = match *method {
        Method::GET if connect => "create",
        Method::GET | Method::HEAD if watch => "watch",
        Method::GET | Method::HEAD if name.is_empty() => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if name.is_empty() => "deletecollection",
        Method::DELETE => "delete",
        _ => "",
    };
    Attributes::resource(verb, group, resource, subresource, &namespace, name)
}

/// The roles and bindings of the store.
pub fn policy(reg: &Registry) -> Result<Policy, ApiError> {
    fn all<T: api::Codec>(reg: &Registry, kind: Kind) -> Result<Vec<T>, ApiError> {
        let (objs, _) = reg.store.list(kind, None)?;
        Ok(objs.into_iter().filter_map(|o| T::from_json(o).ok()).collect())
    }
    Ok(Policy {
        roles: all(reg, Kind::Role)?,
        cluster_roles: all(reg, Kind::ClusterRole)?,
        role_bindings: all(reg, Kind::RoleBinding)?,
        cluster_role_bindings: all(reg, Kind::ClusterRoleBinding)?,
    })
}

/// Whether `user` may do `attrs`: Ok, or the 403 kube-apiserver answers.
pub fn authorize(reg: &Registry, user: &UserInfo, attrs: &Attributes) -> Result<(), ApiError> {
    if user.is_master() {
        return Ok(());
    }
    if policy(reg)?.authorize(user, attrs).0 {
        return Ok(());
    }
    let (qualified, name) = match attrs {
        Attributes::Resource { group, resource, name, .. } => {
            (if group.is_empty() { resource.clone() } else { format!("{resource}.{group}") }, name.clone())
        }
        Attributes::NonResource { .. } => (String::new(), String::new()),
    };
    Err(ApiError::Denied { message: api::rbac::forbidden_message(user, attrs, &qualified), resource: qualified, name })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: Method, path: &str, query: &[(&str, &str)]) -> Attributes {
        let q = query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        attributes(&method, path, &q)
    }

    fn res(verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str) -> Attributes {
        Attributes::resource(verb, group, resource, sub, ns, name)
    }

    #[test]
    fn requests_read_as_kube_apiservers_request_info() {
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/default/pods", &[]),
            res("list", "", "pods", "", "default", "")
        );
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/default/pods", &[("watch", "true")]),
            res("watch", "", "pods", "", "default", "")
        );
        assert_eq!(
            attrs(Method::POST, "/api/v1/namespaces/team/pods/web/exec", &[]),
            res("create", "", "pods", "exec", "team", "web")
        );
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/team/pods/web/exec", &[("command", "sh")]),
            res("create", "", "pods", "exec", "team", "web"),
            "a WebSocket exec"
        );
        assert_eq!(
            attrs(Method::PATCH, "/apis/apps/v1/namespaces/a/deployments/d/scale", &[]),
            res("patch", "apps", "deployments", "scale", "a", "d")
        );
        assert_eq!(attrs(Method::DELETE, "/api/v1/nodes/n1", &[]), res("delete", "", "nodes", "", "", "n1"));
        assert_eq!(
            attrs(Method::DELETE, "/api/v1/namespaces/x/configmaps", &[]),
            res("deletecollection", "", "configmaps", "", "x", "")
        );
        // The namespace itself, and its subresources.
        assert_eq!(
            attrs(Method::GET, "/api/v1/namespaces/team", &[]),
            res("get", "", "namespaces", "", "team", "team")
        );
        assert_eq!(attrs(Method::GET, "/api/v1/namespaces", &[]), res("list", "", "namespaces", "", "", ""));
        assert_eq!(
            attrs(Method::PUT, "/api/v1/namespaces/team/finalize", &[]),
            res("update", "", "namespaces", "finalize", "team", "team")
        );
        for p in ["/api", "/apis/apps/v1", "/version", "/openapi/v2"] {
            assert_eq!(attrs(Method::GET, p, &[]), Attributes::NonResource { verb: "get".into(), path: p.into() });
        }
    }

    #[test]
    fn tokens_verify_only_as_signed_and_until_they_expire() {
        let dir = tempfile::tempdir().unwrap();
        let t = Tokens::load_or_create(dir.path()).unwrap();
        let tok = t.issue("default", "reader", "u-1", &[ISSUER.into()], 1_000, 600);
        let c = t.verify(&tok, 1_500).unwrap();
        assert_eq!(
            (c.namespace.as_str(), c.name.as_str(), c.uid.as_str(), c.expires),
            ("default", "reader", "u-1", 1_600)
        );
        assert!(t.verify(&tok, 1_600).is_none(), "expired");
        // Another claim under the same signature.
        let parts: Vec<&str> = tok.split('.').collect();
        let forged = serde_json::to_vec(&json!({"exp": 9_999_999_999i64, "iss": ISSUER,
            "kubernetes.io": {"namespace": "kube-system", "serviceaccount": {"name": "admin", "uid": ""}}}))
        .unwrap();
        assert!(t.verify(&format!("{}.{}.{}", parts[0], b64(&forged), parts[2]), 1_500).is_none());
        assert!(t.verify("not.a.token", 1_500).is_none() && t.verify("", 1_500).is_none());
        // The key is kept: a restarted server accepts the tokens it issued.
        let again = Tokens::load_or_create(dir.path()).unwrap();
        assert!(again.verify(&tok, 1_500).is_some());
        assert_eq!(std::fs::metadata(dir.path().join("sa.key")).unwrap().permissions().mode() & 0o777, 0o600);
    }

    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn impersonation_asks_for_the_right_permissions() {
        let mut h = HeaderMap::new();
        h.insert("impersonate-user", "system:serviceaccount:team:bot".parse().unwrap());
        h.append("impersonate-group", "devs".parse().unwrap());
        let (who, checks) = impersonation(&h).unwrap();
        assert_eq!(who.name, "system:serviceaccount:team:bot");
        assert!(
            who.groups.contains(&"devs".to_string()) && who.groups.contains(&"system:serviceaccounts:team".to_string())
        );
        assert_eq!(
            checks,
            vec![
                res("impersonate", "", "serviceaccounts", "", "team", "bot"),
                res("impersonate", "", "groups", "", "", "devs")
            ]
        );
        assert!(impersonation(&HeaderMap::new()).is_none());
    }
}
