//! discovery.k8s.io/v1 EndpointSlices (written by the endpoints controller): validation and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{first_three, validate_meta, validate_protocol, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::discovery::v1::EndpointSlice;

impl ApiObject for EndpointSlice {
    const KIND: Kind = Kind::EndpointSlice;
    const INFO: KindInfo = KindInfo {
        group: "discovery.k8s.io",
        ..KindInfo::core("EndpointSlice", "endpointslices", "endpointslice")
    };

    fn apply_defaults(&mut self) {
        for p in self.ports.iter_mut().flatten() {
            p.protocol.get_or_insert_with(|| "TCP".into());
        }
    }

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        const TYPES: [&str; 3] = ["FQDN", "IPv4", "IPv6"];
        let at = self.address_type.as_str();
        if !TYPES.contains(&at) {
            out.push(v::not_supported(&FieldPath::root("addressType"), at, &TYPES));
        }
        for (i, e) in self.endpoints.iter().enumerate() {
            let path = FieldPath::root("endpoints").index(i).child("addresses");
            if e.addresses.is_empty() || e.addresses.len() > 100 {
                out.push(v::required(&path, "must contain at least 1 and at most 100 addresses"));
            }
            for (j, a) in e.addresses.iter().enumerate() {
                let ok = match at {
                    "IPv4" => v::valid_ip(a).is_some_and(|ip| ip.is_ipv4()),
                    "IPv6" => v::valid_ip(a).is_some_and(|ip| ip.is_ipv6()),
                    _ => v::dns1123_subdomain(a).is_empty(),
                };
                if !ok {
                    out.push(v::invalid(&path.index(j), a.as_str(), &format!("must be a valid {at} address")));
                }
            }
        }
        for (i, p) in self.ports.iter().flatten().enumerate() {
            let path = FieldPath::root("ports").index(i);
            if let Some(port) = p.port {
                if !v::port_in_range(port) {
                    out.push(v::invalid(&path.child("port"), &port, v::PORT_RANGE_MSG));
                }
            }
            if let Some(n) = p.name.as_deref().filter(|n| !n.is_empty()) {
                v::push_all(&mut out, &path.child("name"), n, v::dns1123_label(n));
            }
            validate_protocol(p.protocol.as_deref(), &path.child("protocol"), &mut out);
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("AddressType", "string", 0),
            col("Ports", "string", 0),
            col("Endpoints", "string", 0),
            AGE_COLUMN,
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let ports = match self.ports.as_ref().filter(|p| !p.is_empty()) {
            None => "<unset>".to_string(),
            Some(ps) => ps
                .iter()
                .map(|p| p.port.map(|n| n.to_string()).unwrap_or_else(|| "<unset>".into()))
                .collect::<Vec<_>>()
                .join(","),
        };
        let addrs: Vec<String> = self.endpoints.iter().flat_map(|e| e.addresses.iter().cloned()).collect();
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(self.address_type),
            json!(ports),
            json!(first_three(&addrs, "<unset>")),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}
