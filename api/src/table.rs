//! Server-side printing: the `meta.k8s.io/v1` Table that kubectl renders for `get`.
//! Columns and cell formats follow the real API server's printers for each kind.

use jiff::Timestamp;
use serde::Serialize;
use serde_json::{json, Value};

/// One column definition of a Table.
#[derive(Clone, Debug, Serialize)]
pub struct Column {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    /// 0: always shown; 1: only with `-o wide`.
    pub priority: i32,
}

pub const fn col(name: &'static str, type_: &'static str, priority: i32) -> Column {
    Column { name, type_, format: "", description: "", priority }
}

pub const NAME_COLUMN: Column = Column {
    name: "Name",
    type_: "string",
    format: "name",
    description: "Name must be unique within a namespace.",
    priority: 0,
};

pub const AGE_COLUMN: Column = Column {
    name: "Age",
    type_: "string",
    format: "",
    description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
    priority: 0,
};

/// kubectl's `HumanDuration`: `45s`, `3m20s`, `5h2m`, `12d`, `2y30d`…
pub fn human_duration(d: i64) -> String {
    let secs = d.max(0);
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if days < 8 {
        let h = hours % 24;
        return if h == 0 { format!("{days}d") } else { format!("{days}d{h}h") };
    }
    if days < 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if years < 8 {
        let d = days % 365;
        return if d == 0 { format!("{years}y") } else { format!("{years}y{d}d") };
    }
    format!("{years}y")
}

/// The AGE cell for an object created at `created`.
pub fn age(created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>, now: Timestamp) -> Value {
    match created {
        Some(t) => Value::String(human_duration(now.duration_since(t.0).as_secs())),
        None => Value::String("<unknown>".into()),
    }
}

/// Builds a Table from column definitions and `(cells, row object)` pairs.
/// The row object must carry `kind`/`apiVersion` (PartialObjectMetadata or the full object).
pub fn table(columns: &[Column], rows: Vec<(Vec<Value>, Value)>, resource_version: &str, with_headers: bool) -> Value {
    let rows: Vec<Value> = rows.into_iter().map(|(cells, object)| json!({"cells": cells, "object": object})).collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "rows": rows,
    });
    // The real server sends column definitions only with the first watch event.
    t["columnDefinitions"] = if with_headers { serde_json::to_value(columns).unwrap_or_default() } else { json!([]) };
    t
}

/// A `PartialObjectMetadata` for a Table row.
pub fn partial_object_metadata(metadata: &Value) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": metadata})
}

/// Joins `k=v` pairs in key order, or `<none>` (labels.FormatLabels).
pub fn format_labels(map: Option<&std::collections::BTreeMap<String, String>>) -> String {
    match map {
        Some(m) if !m.is_empty() => m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","),
        _ => "<none>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_match_kubectl() {
        assert_eq!(human_duration(0), "0s");
        assert_eq!(human_duration(119), "119s");
        assert_eq!(human_duration(120), "2m");
        assert_eq!(human_duration(200), "3m20s");
        assert_eq!(human_duration(600), "10m");
        assert_eq!(human_duration(179 * 60), "179m");
        assert_eq!(human_duration(3 * 3600), "3h");
        assert_eq!(human_duration(5 * 3600 + 120), "5h2m");
        assert_eq!(human_duration(47 * 3600), "47h");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
        assert_eq!(human_duration(30 * 86400), "30d");
        assert_eq!(human_duration(3 * 365 * 86400 + 86400), "3y1d");
        assert_eq!(human_duration(9 * 365 * 86400), "9y");
        assert_eq!(human_duration(-5), "0s");
    }
}
