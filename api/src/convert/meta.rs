//! Helpers shared by every kind's conversion: metadata, conditions, references, times, lists.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;

use super::proto_err;
use crate::proto as pb;
use crate::Error;

pub(super) fn time_to_string(t: &meta::Time) -> String {
    serde_json::to_value(t).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

pub(super) fn time_from_string(s: &str) -> Result<meta::Time, Error> {
    serde_json::from_value(Value::String(s.to_string())).map_err(|e| proto_err("timestamp", e))
}

pub(super) fn opt_time(t: &Option<meta::Time>) -> Option<String> {
    t.as_ref().map(time_to_string)
}

pub(super) fn time_opt(s: &Option<String>) -> Result<Option<meta::Time>, Error> {
    s.as_deref().map(time_from_string).transpose()
}

pub(super) fn list<T: Clone>(v: &Option<Vec<T>>) -> Vec<T> {
    v.clone().unwrap_or_default()
}

pub(super) fn opt_list<T: Clone>(v: &[T]) -> Option<Vec<T>> {
    if v.is_empty() {
        None
    } else {
        Some(v.to_vec())
    }
}

pub(super) fn map(v: &Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    v.clone().unwrap_or_default()
}

pub(super) fn opt_map(v: &BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    if v.is_empty() {
        None
    } else {
        Some(v.clone())
    }
}

pub(super) fn int_or_string(v: &IntOrString) -> pb::IntOrString {
    pb::IntOrString {
        value: Some(match v {
            IntOrString::Int(i) => pb::int_or_string::Value::IntValue(*i),
            IntOrString::String(s) => pb::int_or_string::Value::StringValue(s.clone()),
        }),
    }
}

pub(super) fn int_or_string_back(v: &pb::IntOrString) -> Result<IntOrString, Error> {
    match &v.value {
        Some(pb::int_or_string::Value::IntValue(i)) => Ok(IntOrString::Int(*i)),
        Some(pb::int_or_string::Value::StringValue(s)) => Ok(IntOrString::String(s.clone())),
        None => Err(proto_err("IntOrString", "neither int nor string is set")),
    }
}

pub(super) fn object_meta(m: &meta::ObjectMeta) -> pb::ObjectMeta {
    pb::ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        generation: m.generation,
        creation_timestamp: opt_time(&m.creation_timestamp),
        deletion_timestamp: opt_time(&m.deletion_timestamp),
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: map(&m.labels),
        annotations: map(&m.annotations),
        finalizers: list(&m.finalizers),
        owner_references: m
            .owner_references
            .iter()
            .flatten()
            .map(|o| pb::OwnerReference {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
            .collect(),
        generate_name: m.generate_name.clone(),
    }
}

pub(super) fn object_meta_back(m: &Option<pb::ObjectMeta>) -> Result<meta::ObjectMeta, Error> {
    let m = m.clone().unwrap_or_default();
    Ok(meta::ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        creation_timestamp: time_opt(&m.creation_timestamp)?,
        deletion_timestamp: time_opt(&m.deletion_timestamp)?,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        labels: opt_map(&m.labels),
        annotations: opt_map(&m.annotations),
        finalizers: opt_list(&m.finalizers),
        owner_references: opt_list(
            &m.owner_references
                .iter()
                .map(|o| meta::OwnerReference {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                    controller: o.controller,
                    block_owner_deletion: o.block_owner_deletion,
                })
                .collect::<Vec<_>>(),
        ),
        generate_name: m.generate_name,
        ..Default::default()
    })
}

/// Conditions of every kind share one proto message.
pub(super) trait ConditionLike: Sized {
    fn to_pb(&self) -> pb::Condition;
    fn from_pb(c: &pb::Condition) -> Result<Self, Error>;
}

impl ConditionLike for core::NodeCondition {
    fn to_pb(&self) -> pb::Condition {
        pb::Condition {
            r#type: self.type_.clone(),
            status: self.status.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            last_transition_time: opt_time(&self.last_transition_time),
            last_heartbeat_time: opt_time(&self.last_heartbeat_time),
            last_probe_time: None,
        }
    }
    fn from_pb(c: &pb::Condition) -> Result<Self, Error> {
        Ok(core::NodeCondition {
            type_: c.r#type.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: time_opt(&c.last_transition_time)?,
            last_heartbeat_time: time_opt(&c.last_heartbeat_time)?,
        })
    }
}

impl ConditionLike for core::PodCondition {
    fn to_pb(&self) -> pb::Condition {
        pb::Condition {
            r#type: self.type_.clone(),
            status: self.status.clone(),
            reason: self.reason.clone(),
            message: self.message.clone(),
            last_transition_time: opt_time(&self.last_transition_time),
            last_heartbeat_time: None,
            last_probe_time: opt_time(&self.last_probe_time),
        }
    }
    fn from_pb(c: &pb::Condition) -> Result<Self, Error> {
        Ok(core::PodCondition {
            type_: c.r#type.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            last_transition_time: time_opt(&c.last_transition_time)?,
            last_probe_time: time_opt(&c.last_probe_time)?,
            ..Default::default()
        })
    }
}

impl ConditionLike for meta::Condition {
    fn to_pb(&self) -> pb::Condition {
        pb::Condition {
            r#type: self.type_.clone(),
            status: self.status.clone(),
            reason: Some(self.reason.clone()),
            message: Some(self.message.clone()),
            last_transition_time: Some(time_to_string(&self.last_transition_time)),
            last_heartbeat_time: None,
            last_probe_time: None,
        }
    }
    fn from_pb(c: &pb::Condition) -> Result<Self, Error> {
        Ok(meta::Condition {
            type_: c.r#type.clone(),
            status: c.status.clone(),
            reason: c.reason.clone().unwrap_or_default(),
            message: c.message.clone().unwrap_or_default(),
            last_transition_time: time_from_string(c.last_transition_time.as_deref().unwrap_or_default())?,
            observed_generation: None,
        })
    }
}

pub(super) fn conditions<C: ConditionLike>(v: &Option<Vec<C>>) -> Vec<pb::Condition> {
    v.iter().flatten().map(ConditionLike::to_pb).collect()
}

pub(super) fn conditions_back<C: ConditionLike + Clone>(v: &[pb::Condition]) -> Result<Option<Vec<C>>, Error> {
    Ok(opt_list(&v.iter().map(C::from_pb).collect::<Result<Vec<_>, _>>()?))
}

pub(super) fn object_ref(r: &core::ObjectReference) -> pb::ObjectReference {
    pb::ObjectReference {
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
        api_version: r.api_version.clone(),
        resource_version: r.resource_version.clone(),
        field_path: r.field_path.clone(),
    }
}

pub(super) fn object_ref_back(r: &pb::ObjectReference) -> core::ObjectReference {
    core::ObjectReference {
        kind: r.kind.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        uid: r.uid.clone(),
        api_version: r.api_version.clone(),
        resource_version: r.resource_version.clone(),
        field_path: r.field_path.clone(),
    }
}
