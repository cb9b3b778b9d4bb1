//! The part of kubectl's JSONPath that CRDs' `additionalPrinterColumns` use: fields (`.a.b`,
//! `['a.b']`), indexes and slices' first forms (`[0]`, `[-1]`), wildcards (`[*]`), recursive
//! descent is refused, and filters comparing a field with a literal
//! (`[?(@.type=="Ready")]`). Pure.
//!
//! Written here: the crates that exist implement RFC 9535 JSONPath, whose filter syntax and
//! results on missing keys differ from Kubernetes' template dialect.

use serde_json::Value;

/// One step of a path.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Field(String),
    Index(i64),
    All,
    /// `[?(@.a.b OP literal)]`; `None` literal: the field exists.
    Filter {
        field: Vec<String>,
        op: Op,
        literal: Option<Value>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Exists,
}

/// A parsed path.
#[derive(Clone, Debug, PartialEq)]
pub struct JsonPath(Vec<Step>);

impl JsonPath {
    /// Parses `.status.conditions[?(@.type=="Ready")].status` (braces around it are allowed).
    pub fn parse(text: &str) -> Result<JsonPath, String> {
        let t = text.trim();
        let t = t.strip_prefix('{').and_then(|t| t.strip_suffix('}')).unwrap_or(t).trim();
        let t = t.strip_prefix('$').unwrap_or(t);
        let b = t.as_bytes();
        let mut steps = Vec::new();
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'.' => {
                    if b.get(i + 1) == Some(&b'.') {
                        return Err("recursive descent is not supported".into());
                    }
                    let start = i + 1;
                    let mut end = start;
                    while end < b.len() && b[end] != b'.' && b[end] != b'[' {
                        end += 1;
                    }
                    let name = &t[start..end];
                    if name.is_empty() {
                        if end == b.len() && steps.is_empty() {
                            break; // `.` alone: the object itself
                        }
                        return Err(format!("unexpected end of field name at {start}"));
                    }
                    if name == "*" {
                        steps.push(Step::All);
                    } else {
                        steps.push(Step::Field(name.to_string()));
                    }
                    i = end;
                }
                b'[' => {
                    let close = matching_bracket(t, i).ok_or_else(|| format!("unclosed [ at {i}"))?;
                    let inner = t[i + 1..close].trim();
                    steps.push(bracket(inner)?);
                    i = close + 1;
                }
                c => return Err(format!("unexpected {:?} at {i}", c as char)),
            }
        }
        Ok(JsonPath(steps))
    }

    /// Every value the path reaches, in order (missing keys give nothing).
    pub fn find<'a>(&self, root: &'a Value) -> Vec<&'a Value> {
        let mut cur = vec![root];
        for step in &self.0 {
            let mut next = Vec::new();
            for v in cur {
                match step {
                    Step::Field(f) => {
                        if let Some(x) = v.get(f.as_str()) {
                            next.push(x);
                        }
                    }
                    Step::Index(n) => {
                        if let Some(list) = v.as_array() {
                            let at = if *n < 0 { list.len() as i64 + n } else { *n };
                            if let Some(x) = usize::try_from(at).ok().and_then(|a| list.get(a)) {
                                next.push(x);
                            }
                        }
                    }
                    Step::All => match v {
                        Value::Array(list) => next.extend(list.iter()),
                        Value::Object(map) => next.extend(map.values()),
                        _ => {}
                    },
                    Step::Filter { field, op, literal } => {
                        if let Some(list) = v.as_array() {
                            next.extend(list.iter().filter(|item| keep(item, field, *op, literal.as_ref())));
                        }
                    }
                }
            }
            cur = next;
        }
        cur
    }
}

fn matching_bracket(t: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    let mut quote: Option<char> = None;
    for (i, c) in t[open..].char_indices() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') => {
                depth -= 1;
                if depth == 0 {
                    return Some(open + i);
                }
            }
            _ => {}
        }
    }
    None
}

fn unquote(s: &str) -> Option<String> {
    let s = s.trim();
    for q in ['"', '\''] {
        if let Some(inner) = s.strip_prefix(q).and_then(|x| x.strip_suffix(q)) {
            return Some(inner.to_string());
        }
    }
    None
}

fn bracket(inner: &str) -> Result<Step, String> {
    if inner == "*" {
        return Ok(Step::All);
    }
    if let Some(name) = unquote(inner) {
        return Ok(Step::Field(name));
    }
    if let Ok(n) = inner.parse::<i64>() {
        return Ok(Step::Index(n));
    }
    let Some(expr) = inner.strip_prefix('?') else {
        return Err(format!("unsupported index [{inner}]"));
    };
    let expr = expr.trim();
    let expr = expr.strip_prefix('(').and_then(|e| e.strip_suffix(')')).unwrap_or(expr).trim();
    let ops = [("==", Op::Eq), ("!=", Op::Ne), ("<=", Op::Le), (">=", Op::Ge), ("<", Op::Lt), (">", Op::Gt)];
    let (lhs, op, rhs) = match ops.iter().find_map(|(s, op)| expr.split_once(s).map(|(l, r)| (l, *op, Some(r)))) {
        Some(x) => x,
        None => (expr, Op::Exists, None),
    };
    let lhs = lhs.trim();
    let field = lhs.strip_prefix("@").ok_or_else(|| format!("a filter must start with @: {lhs}"))?;
    let field: Vec<String> = field.split('.').filter(|s| !s.is_empty()).map(str::to_string).collect();
    let literal = match rhs.map(str::trim) {
        None => None,
        Some(r) => Some(match unquote(r) {
            Some(s) => Value::String(s),
            None => serde_json::from_str(r).map_err(|_| format!("unsupported filter value {r}"))?,
        }),
    };
    Ok(Step::Filter { field, op, literal })
}

fn keep(item: &Value, field: &[String], op: Op, literal: Option<&Value>) -> bool {
    let mut v = item;
    for f in field {
        match v.get(f.as_str()) {
            Some(x) => v = x,
            None => return false,
        }
    }
    let Some(lit) = literal else { return op == Op::Exists };
    let num = |x: &Value| x.as_f64();
    match op {
        Op::Eq => v == lit || (num(v).is_some() && num(v) == num(lit)),
        Op::Ne => !(v == lit || (num(v).is_some() && num(v) == num(lit))),
        Op::Exists => true,
        _ => match (num(v), num(lit)) {
            (Some(a), Some(b)) => match op {
                Op::Lt => a < b,
                Op::Le => a <= b,
                Op::Gt => a > b,
                _ => a >= b,
            },
            _ => false,
        },
    }
}

/// A value as kubectl's JSONPath prints it: strings as they are, everything else as JSON.
pub fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_paths_printer_columns_use() {
        let obj = json!({"spec": {"hostnames": ["a.example", "b.example"], "gatewayClassName": "podpath", "a.b": 1},
            "status": {"addresses": [{"value": "198.51.100.7"}, {"value": "2001:db8:100::7"}],
                       "conditions": [{"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "False"}]}});
        let get = |p: &str| -> Vec<Value> { JsonPath::parse(p).unwrap().find(&obj).into_iter().cloned().collect() };
        assert_eq!(get(".spec.gatewayClassName"), [json!("podpath")]);
        assert_eq!(get("{.status.addresses[*].value}"), [json!("198.51.100.7"), json!("2001:db8:100::7")]);
        assert_eq!(get(".status.conditions[?(@.type==\"Programmed\")].status"), [json!("False")]);
        assert_eq!(get(".status.conditions[?(@.type=='Accepted')].status"), [json!("True")]);
        assert_eq!(get(".status.addresses[-1].value"), [json!("2001:db8:100::7")]);
        assert_eq!(get(".spec['a.b']"), [json!(1)]);
        assert_eq!(get(".spec.missing"), Vec::<Value>::new());
        assert_eq!(text(&get(".spec.hostnames")[0]), "[\"a.example\",\"b.example\"]");
        assert!(JsonPath::parse("..spec").is_err());
        assert!(JsonPath::parse(".spec[").is_err());
    }
}
