//! core/v1 Endpoints (written by the endpoints controller): validation and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{first_three, validate_meta, validate_protocol, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::Endpoints;

impl ApiObject for Endpoints {
    const KIND: Kind = Kind::Endpoints;
    const INFO: KindInfo = KindInfo { short_names: &["ep"], ..KindInfo::core("Endpoints", "endpoints", "endpoints") };

    fn apply_defaults(&mut self) {
        for s in self.subsets.iter_mut().flatten() {
            for p in s.ports.iter_mut().flatten() {
                p.protocol.get_or_insert_with(|| "TCP".into());
            }
        }
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        for (i, s) in self.subsets.iter().flatten().enumerate() {
            let path = FieldPath::root("subsets").index(i);
            for (field, addrs) in [("addresses", &s.addresses), ("notReadyAddresses", &s.not_ready_addresses)] {
                for (j, a) in addrs.iter().flatten().enumerate() {
                    if v::valid_ip(&a.ip).is_none() {
                        out.push(v::invalid(&path.child(field).index(j).child("ip"), a.ip.as_str(), v::IP_MSG));
                    }
                }
            }
            let ports = s.ports.as_deref().unwrap_or_default();
            for (j, p) in ports.iter().enumerate() {
                let pp = path.child("ports").index(j);
                if !v::port_in_range(p.port) {
                    out.push(v::invalid(&pp.child("port"), &p.port, v::PORT_RANGE_MSG));
                }
                match p.name.as_deref() {
                    Some(n) if !n.is_empty() => v::push_all(&mut out, &pp.child("name"), n, v::dns1123_label(n)),
                    _ if ports.len() > 1 => out.push(v::required(&pp.child("name"), "")),
                    _ => {}
                }
                validate_protocol(p.protocol.as_deref(), &pp.child("protocol"), &mut out);
            }
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Endpoints", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let mut list = Vec::new();
        for s in self.subsets.iter().flatten() {
            let addrs: Vec<&str> = s.addresses.iter().flatten().map(|a| a.ip.as_str()).collect();
            match s.ports.as_ref().filter(|p| !p.is_empty()) {
                None => list.extend(addrs.iter().map(|a| a.to_string())),
                Some(ports) => {
                    for p in ports {
                        for a in &addrs {
                            let host = if a.contains(':') { format!("[{a}]") } else { a.to_string() };
                            list.push(format!("{host}:{}", p.port));
                        }
                    }
                }
            }
        }
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(first_three(&list, "<none>")),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}
