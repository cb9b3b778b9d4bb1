//! core/v1 Secrets: `stringData` folded into `data`, validation of keys and of TLS Secrets, and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::Secret;

impl ApiObject for Secret {
    const KIND: Kind = Kind::Secret;
    const INFO: KindInfo = KindInfo::core("Secret", "secrets", "secret");

    fn apply_defaults(&mut self) {
        self.type_.get_or_insert_with(|| "Opaque".into());
        // stringData is write-only: it lands in data, as the API server does.
        if let Some(strings) = self.string_data.take() {
            let data = self.data.get_or_insert_with(Default::default);
            for (k, v) in strings {
                data.insert(k, k8s_openapi::ByteString(v.into_bytes()));
            }
        }
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let data = self.data.clone().unwrap_or_default();
        for k in data.keys() {
            v::push_all(&mut out, &FieldPath::root("data").key(k), k, v::config_key(k));
        }
        if self.type_.as_deref() == Some("kubernetes.io/tls") {
            for key in ["tls.crt", "tls.key"] {
                if !data.contains_key(key) {
                    out.push(v::required(&FieldPath::root("data").key(key), ""));
                }
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Type", "string", 0), col("Data", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(self.type_.clone().unwrap_or_default()),
            json!(self.data.as_ref().map(|d| d.len()).unwrap_or(0).to_string()),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_secrets_need_a_certificate_and_a_key_and_string_data_lands_in_data() {
        let mut s: Secret = serde_json::from_value(json!({"metadata": {"name": "shop-tls"},
            "type": "kubernetes.io/tls", "stringData": {"tls.crt": "cert"}}))
        .unwrap();
        s.apply_defaults();
        assert_eq!(s.data.as_ref().unwrap()["tls.crt"].0, b"cert");
        assert!(s.string_data.is_none());
        let causes: Vec<String> = s.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["data[tls.key]: Required value"]);
        let mut opaque: Secret =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "data": {"a b": ""}})).unwrap();
        opaque.apply_defaults();
        assert_eq!(opaque.type_.as_deref(), Some("Opaque"));
        assert_eq!(opaque.validate(None).len(), 1);
        assert_eq!(opaque.cells(Timestamp::now())[1..3], [json!("Opaque"), json!("1")]);
    }
}
