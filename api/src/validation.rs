//! Field errors ("causes") and the name, label and address validators that the Kubernetes API
//! server applies. Messages follow apimachinery's wording so that kubectl prints what users
//! know from a real cluster.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

/// A path to a field, printed the way apimachinery prints it: `spec.ports[0].nodePort`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldPath(String);

impl FieldPath {
    pub fn root(name: &str) -> Self {
        FieldPath(name.to_string())
    }
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() {
            FieldPath(name.to_string())
        } else {
            FieldPath(format!("{}.{}", self.0, name))
        }
    }
    pub fn index(&self, i: usize) -> Self {
        FieldPath(format!("{}[{}]", self.0, i))
    }
    pub fn key(&self, k: &str) -> Self {
        FieldPath(format!("{}[{}]", self.0, k))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One entry of `Status.details.causes`, as kubectl expects it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    pub reason: String,
    pub field: String,
    pub message: String,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Renders a value the way Go's `%#v`-ish field errors show it: strings quoted, numbers bare.
pub trait ShowValue {
    fn show(&self) -> String;
}
impl ShowValue for str {
    fn show(&self) -> String {
        format!("{:?}", self)
    }
}
impl ShowValue for String {
    fn show(&self) -> String {
        format!("{:?}", self)
    }
}
impl ShowValue for i32 {
    fn show(&self) -> String {
        self.to_string()
    }
}
impl ShowValue for i64 {
    fn show(&self) -> String {
        self.to_string()
    }
}
impl ShowValue for [String] {
    fn show(&self) -> String {
        let items: Vec<String> = self.iter().map(|s| format!("{:?}", s)).collect();
        format!("[]string{{{}}}", items.join(", "))
    }
}

pub fn invalid(path: &FieldPath, value: &(impl ShowValue + ?Sized), detail: &str) -> Cause {
    Cause {
        reason: "FieldValueInvalid".into(),
        field: path.to_string(),
        message: if detail.is_empty() {
            format!("Invalid value: {}", value.show())
        } else {
            format!("Invalid value: {}: {}", value.show(), detail)
        },
    }
}

pub fn required(path: &FieldPath, detail: &str) -> Cause {
    Cause {
        reason: "FieldValueRequired".into(),
        field: path.to_string(),
        message: if detail.is_empty() { "Required value".into() } else { format!("Required value: {detail}") },
    }
}

pub fn forbidden(path: &FieldPath, detail: &str) -> Cause {
    Cause { reason: "FieldValueForbidden".into(), field: path.to_string(), message: format!("Forbidden: {detail}") }
}

pub fn duplicate(path: &FieldPath, value: &(impl ShowValue + ?Sized)) -> Cause {
    Cause {
        reason: "FieldValueDuplicate".into(),
        field: path.to_string(),
        message: format!("Duplicate value: {}", value.show()),
    }
}

pub fn not_supported(path: &FieldPath, value: &(impl ShowValue + ?Sized), supported: &[&str]) -> Cause {
    let list: Vec<String> = supported.iter().map(|s| format!("{:?}", s)).collect();
    Cause {
        reason: "FieldValueNotSupported".into(),
        field: path.to_string(),
        message: format!("Unsupported value: {}: supported values: {}", value.show(), list.join(", ")),
    }
}

pub fn too_long(path: &FieldPath, max: usize) -> Cause {
    Cause {
        reason: "FieldValueTooLong".into(),
        field: path.to_string(),
        message: format!("Too long: may not be more than {max} bytes"),
    }
}

// === names ===

const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

fn is_label_char(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'
}

fn dns1123_label_shape(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty() && b.iter().all(|&c| is_label_char(c)) && b[0] != b'-' && b[b.len() - 1] != b'-'
}

/// Problems with `s` as an RFC 1123 label (pod container names, namespaces, port names).
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !dns1123_label_shape(s) {
        errs.push(DNS1123_LABEL_MSG.to_string());
    }
    errs
}

/// Problems with `s` as an RFC 1123 subdomain (pod and node names).
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_string());
    }
    if s.is_empty() || !s.split('.').all(dns1123_label_shape) {
        errs.push(DNS1123_SUBDOMAIN_MSG.to_string());
    }
    errs
}

/// Problems with `s` as a name that only has to fit in a URL path segment (embedded objects'
/// names in custom resources).
pub fn path_segment_name(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    ["/", "%"].iter().filter(|c| s.contains(*c)).map(|c| format!("may not contain '{c}'")).collect()
}

/// Problems with `s` as a DNS-1035 label (Service names: they become DNS names and env vars).
pub fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !dns1123_label_shape(s) || !s.as_bytes()[0].is_ascii_lowercase() {
        errs.push(DNS1035_LABEL_MSG.to_string());
    }
    errs
}

/// Problems with `s` as an IANA service name (named container ports, named targetPorts).
pub fn iana_svc_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 15 {
        errs.push("must be no more than 15 characters".to_string());
    }
    if !s.bytes().all(is_label_char) {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".to_string());
    }
    if s.contains("--") {
        errs.push("must not contain consecutive hyphens".to_string());
    }
    if !s.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".to_string());
    }
    if s.starts_with('-') || s.ends_with('-') {
        errs.push("must not begin or end with a hyphen".to_string());
    }
    errs
}

fn qualified_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'.')
}

/// Problems with `s` as a qualified name (label and annotation keys: `[prefix/]name`).
pub fn qualified_name(s: &str) -> Vec<String> {
    const MSG: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    let mut errs = Vec::new();
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    if let Some(p) = prefix {
        if p.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else {
            for e in dns1123_subdomain(p) {
                errs.push(format!("prefix part {e}"));
            }
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_string());
    } else if !qualified_name_part(name) {
        errs.push(MSG.to_string());
    }
    errs
}

/// Problems with `s` as a label value (may be empty).
pub fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !s.is_empty() && !qualified_name_part(s) {
        errs.push("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string());
    }
    errs
}

/// Validates a label map (`metadata.labels`, `spec.selector`).
pub fn labels(map: &BTreeMap<String, String>, path: &FieldPath, out: &mut Vec<Cause>) {
    for (k, v) in map {
        for e in qualified_name(k) {
            out.push(invalid(path, k.as_str(), &e));
        }
        for e in label_value(v) {
            out.push(invalid(&path.key(k), v.as_str(), &e));
        }
    }
}

/// Validates annotations: qualified-name keys and a total size limit of 256 KiB.
pub fn annotations(map: &BTreeMap<String, String>, path: &FieldPath, out: &mut Vec<Cause>) {
    let mut total = 0usize;
    for (k, v) in map {
        for e in qualified_name(&k.to_lowercase()) {
            out.push(invalid(path, k.as_str(), &e));
        }
        total += k.len() + v.len();
    }
    if total > 256 * 1024 {
        out.push(too_long(path, 256 * 1024));
    }
}

/// The rule for the keys of Secrets and ConfigMaps (the API server's `IsConfigMapKey`).
pub fn config_key(k: &str) -> Vec<String> {
    let mut out = Vec::new();
    if k.len() > 253 {
        out.push("must be no more than 253 characters".to_string());
    }
    if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        out.push("a valid config key must consist of alphanumeric characters, '-', '_' or '.'".to_string());
    }
    match k {
        "." => out.push("must not be '.'".to_string()),
        ".." => out.push("must not be '..'".to_string()),
        _ if k.starts_with("..") => out.push("must not start with '..'".to_string()),
        _ => {}
    }
    out
}

/// `ValidateLabelSelector`: valid matchLabels, and each expression with an operator the server
/// knows, values as that operator requires them, a valid key and valid values.
pub fn label_selector(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    path: &FieldPath,
    out: &mut Vec<Cause>,
) {
    if let Some(labels) = &sel.match_labels {
        self::labels(labels, &path.child("matchLabels"), out);
    }
    for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
        let ep = path.child("matchExpressions").index(i);
        let has_values = e.values.as_ref().is_some_and(|v| !v.is_empty());
        match e.operator.as_str() {
            "In" | "NotIn" if !has_values => {
                out.push(required(&ep.child("values"), "must be specified when `operator` is 'In' or 'NotIn'"))
            }
            "Exists" | "DoesNotExist" if has_values => out.push(forbidden(
                &ep.child("values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => out.push(invalid(&ep.child("operator"), other, "not a valid selector operator")),
        }
        push_all(out, &ep.child("key"), &e.key, qualified_name(&e.key));
        for (j, value) in e.values.iter().flatten().enumerate() {
            push_all(out, &ep.child("values").index(j), value, label_value(value));
        }
    }
}

/// Pushes one `Invalid value` cause per message in `errs`.
pub fn push_all(out: &mut Vec<Cause>, path: &FieldPath, value: &str, errs: Vec<String>) {
    for e in errs {
        out.push(invalid(path, value, &e));
    }
}

pub fn port_in_range(p: i32) -> bool {
    (1..=65535).contains(&p)
}

pub const PORT_RANGE_MSG: &str = "must be between 1 and 65535, inclusive";

/// An IP address in canonical form, the way Kubernetes accepts them (no leading zeros, no zone).
pub fn valid_ip(s: &str) -> Option<IpAddr> {
    let ip: IpAddr = s.parse().ok()?;
    (ip.to_string() == s).then_some(ip)
}

pub const IP_MSG: &str = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)";
pub const CIDR_MSG: &str = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)";

pub fn valid_cidr(s: &str) -> bool {
    s.parse::<ipnet::IpNet>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(dns1035_label("contour").is_empty());
        assert!(!dns1035_label("1abc").is_empty());
        assert!(dns1123_label("1abc").is_empty());
        assert!(!dns1123_label("Abc").is_empty());
        assert!(!dns1123_label("abc-").is_empty());
        assert!(dns1123_subdomain("web-1.example").is_empty());
        assert!(!dns1123_subdomain("web..1").is_empty());
        assert_eq!(dns1035_label(&"a".repeat(64)).len(), 1);
        assert!(iana_svc_name("http").is_empty());
        assert!(!iana_svc_name("8080").is_empty());
        assert!(!iana_svc_name("a--b").is_empty());
        assert!(!iana_svc_name("abcdefghijklmnop").is_empty());
    }

    #[test]
    fn label_keys_and_values() {
        assert!(qualified_name("app").is_empty());
        assert!(qualified_name("kubernetes.io/service-name").is_empty());
        assert!(!qualified_name("/app").is_empty());
        assert!(!qualified_name("Bad_/x").is_empty());
        assert!(!qualified_name("-app").is_empty());
        assert!(label_value("").is_empty());
        assert!(label_value("v1.2_x").is_empty());
        assert!(!label_value("v1 2").is_empty());
    }

    #[test]
    fn ips() {
        assert!(valid_ip("10.96.0.1").is_some());
        assert!(valid_ip("010.96.0.1").is_none());
        assert!(valid_ip("foo").is_none());
        assert!(valid_cidr("10.0.0.0/8"));
        assert!(!valid_cidr("10.0.0.0"));
    }

    #[test]
    fn cause_text() {
        let c = invalid(&FieldPath::root("spec").child("ports").index(0).child("nodePort"), &80, "x");
        assert_eq!(c.to_string(), "spec.ports[0].nodePort: Invalid value: 80: x");
        let c = not_supported(&FieldPath::root("spec").child("type"), "Foo", &["ClusterIP", "NodePort"]);
        assert_eq!(c.message, "Unsupported value: \"Foo\": supported values: \"ClusterIP\", \"NodePort\"");
    }
}
