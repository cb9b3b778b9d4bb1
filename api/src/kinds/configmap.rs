//! core/v1 ConfigMaps: validation of keys and size, `immutable` ConfigMaps, and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::ConfigMap;

/// The most `data` and `binaryData` may hold together (the API server's 1 MiB).
pub const MAX_SIZE: usize = 1 << 20;

const IMMUTABLE: &str = "field is immutable when `immutable` is set";

impl ApiObject for ConfigMap {
    const KIND: Kind = Kind::ConfigMap;
    const INFO: KindInfo = KindInfo { short_names: &["cm"], ..KindInfo::core("ConfigMap", "configmaps", "configmap") };

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let data = self.data.clone().unwrap_or_default();
        let binary = self.binary_data.clone().unwrap_or_default();
        let mut size = 0;
        for (k, value) in &data {
            let path = FieldPath::root("data").key(k);
            v::push_all(&mut out, &path, k, v::config_key(k));
            if binary.contains_key(k) {
                out.push(v::invalid(&path, k.as_str(), "duplicate of key present in binaryData"));
            }
            size += value.len();
        }
        for (k, value) in &binary {
            v::push_all(&mut out, &FieldPath::root("binaryData").key(k), k, v::config_key(k));
            size += value.0.len();
        }
        if size > MAX_SIZE {
            out.push(v::too_long(&FieldPath::root(""), MAX_SIZE));
        }
        if let Some(old) = old.filter(|o| o.immutable == Some(true)) {
            if self.immutable != Some(true) {
                out.push(v::forbidden(&FieldPath::root("immutable"), IMMUTABLE));
            }
            if self.data != old.data {
                out.push(v::forbidden(&FieldPath::root("data"), IMMUTABLE));
            }
            if self.binary_data != old.binary_data {
                out.push(v::forbidden(&FieldPath::root("binaryData"), IMMUTABLE));
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Data", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let entries = self.data.as_ref().map_or(0, |d| d.len()) + self.binary_data.as_ref().map_or(0, |d| d.len());
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(entries),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(v: Value) -> ConfigMap {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn keys_size_and_immutability_are_checked_as_the_api_server_does() {
        let ok = cm(json!({"metadata": {"name": "game"}, "data": {"lives": "3", "game.properties": "a=b"}}));
        assert_eq!(ok.validate(None), vec![]);
        assert_eq!(ok.cells(Timestamp::now())[1], json!(2));
        let bad = cm(json!({"metadata": {"name": "x"}, "data": {"a b": "", "..": "", "k": ""}, "binaryData": {"k": ""}}));
        let causes: Vec<String> = bad.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            causes,
            [
                "data[..]: Invalid value: \"..\": must not be '..'",
                "data[a b]: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                "data[k]: Invalid value: \"k\": duplicate of key present in binaryData",
            ]
        );
        let big = cm(json!({"metadata": {"name": "big"}, "data": {"a": "x".repeat(MAX_SIZE + 1)}}));
        assert_eq!(big.validate(None)[0].to_string(), ": Too long: may not be more than 1048576 bytes");
        let frozen = cm(json!({"metadata": {"name": "f"}, "immutable": true, "data": {"a": "1"}}));
        let changed = cm(json!({"metadata": {"name": "f"}, "data": {"a": "2"}}));
        let causes: Vec<String> = changed.validate(Some(&frozen)).iter().map(|c| c.to_string()).collect();
        assert_eq!(
            causes,
            [
                "immutable: Forbidden: field is immutable when `immutable` is set",
                "data: Forbidden: field is immutable when `immutable` is set"
            ]
        );
    }
}
