//! Label selectors (`app=web,tier!=db,env in (a,b),!legacy`) and field selectors
//! (`metadata.name=x,spec.nodeName=node-1`) with the semantics of apimachinery.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::{Error, Kind};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn check_key(key: &str, whole: &str) -> Result<String, Error> {
    let errs = crate::validation::qualified_name(key);
    if key.is_empty() || !errs.is_empty() {
        return Err(Error::Selector(format!(
            "unable to parse requirement: invalid label key \"{key}\" in \"{whole}\""
        )));
    }
    Ok(key.to_string())
}

fn check_value(v: &str, whole: &str) -> Result<String, Error> {
    if !crate::validation::label_value(v).is_empty() {
        return Err(Error::Selector(format!("invalid label value: \"{v}\" in \"{whole}\"")));
    }
    Ok(v.to_string())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top_level(s) {
            let part = part.trim();
            if part.is_empty() {
                return Err(Error::Selector(format!("found '', expected: identifier in \"{s}\"")));
            }
            if let Some(key) = part.strip_prefix('!') {
                reqs.push(Requirement::NotExists(check_key(key.trim(), s)?));
            } else if let Some((k, v)) = part.split_once("!=") {
                reqs.push(Requirement::NotEquals(check_key(k.trim(), s)?, check_value(v.trim(), s)?));
            } else if let Some((k, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                reqs.push(Requirement::Equals(check_key(k.trim(), s)?, check_value(v.trim(), s)?));
            } else if let Some((k, set, negated)) = parse_set(part) {
                let key = check_key(k, s)?;
                let values = set.split(',').map(|v| check_value(v.trim(), s)).collect::<Result<Vec<_>, _>>()?;
                reqs.push(if negated { Requirement::NotIn(key, values) } else { Requirement::In(key, values) });
            } else {
                reqs.push(Requirement::Exists(check_key(part, s)?));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Builds a selector that requires every pair of `labels` (a Service's `spec.selector`).
    pub fn from_map(labels: &BTreeMap<String, String>) -> Self {
        LabelSelector(labels.iter().map(|(k, v)| Requirement::Equals(k.clone(), v.clone())).collect())
    }

    pub fn matches(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k));
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v),
            Requirement::NotEquals(k, v) => get(k) != Some(v),
            Requirement::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            Requirement::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(x)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `key in (a,b)` / `key notin (a,b)` → (key, "a,b", negated).
fn parse_set(part: &str) -> Option<(&str, &str, bool)> {
    let open = part.find('(')?;
    let close = part.rfind(')')?;
    let head = part[..open].trim();
    let set = &part[open + 1..close];
    if let Some(k) = head.strip_suffix(" notin") {
        Some((k.trim(), set, true))
    } else {
        head.strip_suffix(" in").map(|k| (k.trim(), set, false))
    }
}

/// A parsed field selector: a list of `field=value` / `field!=value` terms.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, String, bool)>);

impl FieldSelector {
    pub fn parse(s: &str, kind: Kind) -> Result<Self, Error> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, value, negated) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
                (f, v, false)
            } else {
                return Err(Error::Selector(format!("invalid selector: '{s}'; can't understand '{part}'")));
            };
            let field = field.trim();
            if field != "metadata.name"
                && field != "metadata.namespace"
                && !kind.info().field_selectors.contains(&field)
            {
                return Err(Error::Selector(format!("field label not supported: {field}")));
            }
            terms.push((field.to_string(), value.trim().to_string(), negated));
        }
        Ok(FieldSelector(terms))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, want, negated)| {
            let mut cur = obj;
            for seg in field.split('.') {
                cur = cur.get(seg).unwrap_or(&Value::Null);
            }
            let have = match (field.as_str(), cur) {
                ("source", _) => obj.pointer("/source/component").and_then(Value::as_str).unwrap_or("").to_string(),
                (_, Value::String(s)) => s.clone(),
                (_, Value::Bool(b)) => b.to_string(),
                (_, Value::Number(n)) => n.to_string(),
                ("spec.unschedulable" | "spec.hostNetwork", Value::Null) => "false".into(),
                _ => String::new(),
            };
            (have == *want) != *negated
        })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn label_selectors() {
        let l = labels(&[("app", "web"), ("env", "prod")]);
        let cases = [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app=web,env=prod", true),
            ("env in (prod, dev)", true),
            ("env notin (prod)", false),
            ("tier notin (a)", true),
            ("app", true),
            ("!app", false),
            ("!tier", true),
            ("app in (web),!tier", true),
        ];
        for (sel, want) in cases {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(Some(&l)), want, "{sel}");
        }
        assert!(LabelSelector::parse("a b=c").is_err());
        assert!(LabelSelector::parse("app=web,").is_err());
        assert!(!LabelSelector::parse("app=web").unwrap().matches(None));
    }

    #[test]
    fn field_selectors() {
        let pod = json!({"metadata": {"name": "web", "namespace": "default"}, "spec": {"nodeName": "node-1"}});
        let sel = FieldSelector::parse("metadata.name=web,spec.nodeName=node-1", Kind::Pod).unwrap();
        assert!(sel.matches(&pod));
        assert!(!FieldSelector::parse("spec.nodeName!=node-1", Kind::Pod).unwrap().matches(&pod));
        assert!(FieldSelector::parse("spec.nodeName=", Kind::Pod).unwrap().matches(&json!({"spec": {}})));
        assert!(FieldSelector::parse("spec.nodeName=x", Kind::Service).is_err());
        let ev = json!({"involvedObject": {"kind": "Service", "name": "x", "uid": "u"}});
        assert!(FieldSelector::parse("involvedObject.name=x,involvedObject.kind=Service", Kind::Event)
            .unwrap()
            .matches(&ev));
    }
}
