//! Strict field validation: find the fields of a request body that the typed object does not
//! know (`fieldValidation=Strict` rejects them, `Warn` reports them).

use serde_json::Value;

/// Paths of fields present in `input` but lost when it is decoded into the typed object and
/// encoded again (`typed`). Null values are ignored: clients send `"creationTimestamp": null`.
pub fn unknown_fields(input: &Value, typed: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(input, typed, "", &mut out);
    out
}

fn walk(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(i), Value::Object(t)) => {
            for (k, v) in i {
                if v.is_null() {
                    continue;
                }
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                match t.get(k) {
                    None => out.push(p),
                    Some(tv) => walk(v, tv, &p, out),
                }
            }
        }
        (Value::Array(i), Value::Array(t)) => {
            for (idx, (iv, tv)) in i.iter().zip(t).enumerate() {
                walk(iv, tv, &format!("{path}[{idx}]"), out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_unknown_fields_at_any_depth() {
        let input = json!({"metadata": {"name": "x", "creationTimestamp": null},
                           "spec": {"portz": 1, "ports": [{"port": 80, "bogus": true}]}});
        let typed = json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 80}]}});
        assert_eq!(unknown_fields(&input, &typed), vec!["spec.ports[0].bogus", "spec.portz"]);
    }
}
