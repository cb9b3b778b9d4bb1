//! core/v1 Nodes: validation, the pod CIDR a node gets, and the Table kubectl prints.

use std::collections::BTreeSet;

use jiff::Timestamp;
use serde_json::{json, Value};


use super::{validate_meta, ApiObject, Kind, KindInfo};
use crate::alloc::{pod_cidr_key, AllocKey, Allocate, Exhausted, IpFamily, Ranges};
use crate::table::{self, col, Column, AGE_COLUMN, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::core::v1::Node;

/// The node STATUS as kubectl prints it: `Ready` when the Ready condition is True, `NotReady`
/// when it is False or Unknown, `Unknown` when there is no Ready condition.
pub fn node_ready_status(node: &Node) -> &'static str {
    let cond =
        node.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match cond.map(|c| c.status.as_str()) {
        Some("True") => "Ready",
        Some(_) => "NotReady",
        None => "Unknown",
    }
}

/// Gives each NoExecute taint without `timeAdded` the time it had before (the same key and
/// effect) or now.
fn stamp_no_execute_taints(node: &mut Node, old: Option<&Node>) {
    let old_taints = old.and_then(|o| o.spec.as_ref()).and_then(|s| s.taints.as_deref()).unwrap_or(&[]);
    for t in node.spec.iter_mut().flat_map(|s| s.taints.iter_mut().flatten()) {
        if t.effect == "NoExecute" && t.time_added.is_none() {
            let before = old_taints.iter().find(|o| o.key == t.key && o.effect == t.effect).and_then(|o| o.time_added.clone());
            t.time_added = Some(before.unwrap_or(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now())));
        }
    }
}

impl ApiObject for Node {
    const KIND: Kind = Kind::Node;
    const INFO: KindInfo = KindInfo {
        namespaced: false,
        short_names: &["no"],
        has_status: true,
        field_selectors: &["spec.unschedulable"],
        ..KindInfo::core("Node", "nodes", "node")
    };

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let spec_path = FieldPath::root("spec");
        if let Some(spec) = &self.spec {
            if let Some(c) = spec.pod_cidr.as_deref().filter(|c| !c.is_empty()) {
                if !v::valid_cidr(c) {
                    out.push(v::invalid(&spec_path.child("podCIDR"), c, v::CIDR_MSG));
                }
            }
            for (i, c) in spec.pod_cidrs.iter().flatten().enumerate() {
                if !v::valid_cidr(c) {
                    out.push(v::invalid(&spec_path.child("podCIDRs").index(i), c.as_str(), v::CIDR_MSG));
                }
            }
            const EFFECTS: [&str; 3] = ["NoExecute", "NoSchedule", "PreferNoSchedule"];
            let mut seen = BTreeSet::new();
            for (i, t) in spec.taints.iter().flatten().enumerate() {
                let path = spec_path.child("taints").index(i);
                v::push_all(&mut out, &path.child("key"), &t.key, v::qualified_name(&t.key));
                if let Some(val) = t.value.as_deref().filter(|v| !v.is_empty()) {
                    v::push_all(&mut out, &path.child("value"), val, v::label_value(val));
                }
                if !EFFECTS.contains(&t.effect.as_str()) {
                    out.push(v::not_supported(&path.child("effect"), t.effect.as_str(), &EFFECTS));
                }
                if !seen.insert((t.key.as_str(), t.effect.as_str())) {
                    out.push(v::duplicate(&path, format!("{}:{}", t.key, t.effect).as_str()));
                }
            }
        }
        const ADDRESS_TYPES: [&str; 5] = ["ExternalDNS", "ExternalIP", "Hostname", "InternalDNS", "InternalIP"];
        let status = self.status.as_ref();
        for (i, a) in status.and_then(|s| s.addresses.as_ref()).into_iter().flatten().enumerate() {
            let path = FieldPath::root("status").child("addresses").index(i);
            if !ADDRESS_TYPES.contains(&a.type_.as_str()) {
                out.push(v::not_supported(&path.child("type"), a.type_.as_str(), &ADDRESS_TYPES));
            }
            if a.type_.ends_with("IP") && v::valid_ip(&a.address).is_none() {
                out.push(v::invalid(&path.child("address"), a.address.as_str(), v::IP_MSG));
            }
        }
        out
    }

    /// `timeAdded` is written for NoExecute taints (tolerationSeconds count from it).
    fn prepare_for_create(&mut self) {
        stamp_no_execute_taints(self, None);
    }

    fn prepare_for_update(&mut self, old: &Self) {
        stamp_no_execute_taints(self, Some(old));
    }

    /// The node's pod CIDRs, one per family of the cluster CIDRs (`--cluster-cidr=A[,B]`):
    /// assigned at registration (`node-N` gets subnet N), the ones it asks for when free,
    /// immutable afterwards.
    fn allocate(&mut self, old: Option<&Self>, alloc: &mut dyn Allocate, causes: &mut Vec<Cause>) -> Result<(), Exhausted> {
        let pod_cidrs = |n: &Self| -> Vec<String> {
            let spec = n.spec.as_ref();
            let list: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
            if list.is_empty() {
                spec.and_then(|s| s.pod_cidr.clone()).filter(|c| !c.is_empty()).into_iter().collect()
            } else {
                list
            }
        };
        let old_cidrs = old.map(pod_cidrs).unwrap_or_default();
        let requested = pod_cidrs(self);
        let name = self.metadata.name.clone().unwrap_or_default();
        let cidrs = if !old_cidrs.is_empty() {
            if !requested.is_empty() && requested != old_cidrs {
                causes.push(v::forbidden(
                    &FieldPath::root("spec").child("podCIDRs"),
                    "node updates may not change podCIDR except from \"\" to valid",
                ));
                return Ok(());
            }
            old_cidrs
        } else {
            let mut out = Vec::new();
            for (i, r) in requested.iter().enumerate() {
                if alloc.ranges().in_cluster_cidr(r) && alloc.claim_pod_cidr(r).is_err() {
                    causes.push(v::invalid(
                        &FieldPath::root("spec").child("podCIDRs").index(i),
                        r.as_str(),
                        "is already assigned to another node",
                    ));
                    return Ok(());
                }
                out.push(r.clone());
            }
            if out.is_empty() {
                let families: Vec<IpFamily> = alloc.ranges().cluster_cidrs.iter().map(IpFamily::of_net).collect();
                for family in families {
                    match alloc.pod_cidr(&name, family) {
                        Ok(c) => out.push(c.to_string()),
                        Err(_) => {
                            return Err(Exhausted(format!(
                                "Internal error occurred: failed to allocate a pod CIDR for node {name}: the cluster CIDR {} is full",
                                alloc.ranges().cluster_cidr(family).map(|c| c.to_string()).unwrap_or_default()
                            )))
                        }
                    }
                }
            }
            out
        };
        let spec = self.spec.get_or_insert_with(Default::default);
        spec.pod_cidr = cidrs.first().cloned();
        spec.pod_cidrs = Some(cidrs);
        Ok(())
    }

    /// Only CIDRs inside the cluster CIDRs are allocated; one outside them is the node's own
    /// business (the allocator never hands it out).
    fn allocations(&self, ranges: &Ranges) -> BTreeSet<AllocKey> {
        let spec = self.spec.as_ref();
        spec.and_then(|s| s.pod_cidrs.clone())
            .unwrap_or_default()
            .iter()
            .chain(spec.and_then(|s| s.pod_cidr.as_ref()))
            .filter(|c| ranges.in_cluster_cidr(c))
            .map(|c| pod_cidr_key(c))
            .collect()
    }

    fn columns() -> Vec<Column> {
        vec![
            NAME_COLUMN,
            col("Status", "string", 0),
            col("Roles", "string", 0),
            AGE_COLUMN,
            col("Version", "string", 0),
            col("Internal-IP", "string", 1),
            col("External-IP", "string", 1),
            col("OS-Image", "string", 1),
            col("Kernel-Version", "string", 1),
            col("Container-Runtime", "string", 1),
        ]
    }

    fn cells(&self, now: Timestamp) -> Vec<Value> {
        let mut status = node_ready_status(self).to_string();
        if self.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
            status.push_str(",SchedulingDisabled");
        }
        let mut roles: BTreeSet<String> = BTreeSet::new();
        for (k, v) in self.metadata.labels.iter().flatten() {
            if let Some(role) = k.strip_prefix("node-role.kubernetes.io/") {
                if !role.is_empty() {
                    roles.insert(role.to_string());
                }
            } else if k == "kubernetes.io/role" && !v.is_empty() {
                roles.insert(v.clone());
            }
        }
        let roles =
            if roles.is_empty() { "<none>".to_string() } else { roles.into_iter().collect::<Vec<_>>().join(",") };
        let st = self.status.clone().unwrap_or_default();
        let info = st.node_info.clone().unwrap_or_default();
        let addr = |t: &str| {
            st.addresses
                .iter()
                .flatten()
                .find(|a| a.type_ == t)
                .map(|a| a.address.clone())
                .unwrap_or_else(|| "<none>".into())
        };
        let or_unknown = |s: &str| if s.is_empty() { "<unknown>".to_string() } else { s.to_string() };
        vec![
            json!(self.metadata.name.clone().unwrap_or_default()),
            json!(status),
            json!(roles),
            table::age(self.metadata.creation_timestamp.as_ref(), now),
            json!(info.kubelet_version),
            json!(addr("InternalIP")),
            json!(addr("ExternalIP")),
            json!(or_unknown(&info.os_image)),
            json!(or_unknown(&info.kernel_version)),
            json!(or_unknown(&info.container_runtime_version)),
        ]
    }
}
