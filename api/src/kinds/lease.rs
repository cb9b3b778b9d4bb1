//! coordination.k8s.io/v1 Leases: what each node's agent renews in `kube-node-lease` with every
//! heartbeat (`kubectl describe node` shows it), and what leader election uses. Validation of
//! the durations and transitions with the real texts, and the Table.

use jiff::Timestamp;
use serde_json::{json, Value};

use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::coordination::v1::Lease;

/// The namespace of the nodes' Leases.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";

impl ApiObject for Lease {
    const KIND: Kind = Kind::Lease;
    const INFO: KindInfo =
        KindInfo { group: "coordination.k8s.io", ..KindInfo::core("Lease", "leases", "lease") };

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let spec = self.spec.clone().unwrap_or_default();
        let path = FieldPath::root("spec");
        if let Some(d) = spec.lease_duration_seconds.filter(|d| *d <= 0) {
            out.push(v::invalid(&path.child("leaseDurationSeconds"), &d, "must be greater than 0"));
        }
        if let Some(t) = spec.lease_transitions.filter(|t| *t < 0) {
            out.push(v::invalid(&path.child("leaseTransitions"), &t, "must be greater than or equal to 0"));
        }
        out
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Holder", "string", 0), AGE_COLUMN]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let holder = self.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(holder),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_has_a_positive_duration_and_shows_its_holder() {
        let lease: Lease = serde_json::from_value(json!({"metadata": {"name": "node-1", "namespace": NODE_LEASE_NAMESPACE},
            "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40, "renewTime": "2026-11-27T02:40:00.000000Z"}}))
        .unwrap();
        assert_eq!(lease.validate(None), vec![]);
        assert_eq!(lease.cells(Timestamp::now())[1], json!("node-1"));
        let bad: Lease =
            serde_json::from_value(json!({"metadata": {"name": "x"}, "spec": {"leaseDurationSeconds": 0}})).unwrap();
        let causes: Vec<String> = bad.validate(None).iter().map(|c| c.to_string()).collect();
        assert_eq!(causes, ["spec.leaseDurationSeconds: Invalid value: 0: must be greater than 0"]);
    }
}
