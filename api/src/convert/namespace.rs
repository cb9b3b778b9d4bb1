//! Namespace ↔ proto.

use k8s_openapi::api::core::v1 as core;

use super::meta::*;
use super::ProtoConvert;
use crate::proto as pb;
use crate::Error;

impl ProtoConvert for core::Namespace {
    type Proto = pb::Namespace;
    extra_accessors!();

    fn to_typed(&self) -> pb::Namespace {
        pb::Namespace {
            metadata: Some(object_meta(&self.metadata)),
            finalizers: self.spec.as_ref().map(|s| list(&s.finalizers)).unwrap_or_default(),
            phase: self.status.as_ref().and_then(|s| s.phase.clone()),
            extra_json: String::new(),
        }
    }

    fn from_typed(p: &pb::Namespace) -> Result<Self, Error> {
        Ok(core::Namespace {
            metadata: object_meta_back(&p.metadata)?,
            spec: opt_list(&p.finalizers).map(|f| core::NamespaceSpec { finalizers: Some(f) }),
            status: p.phase.clone().map(|phase| core::NamespaceStatus { phase: Some(phase), conditions: None }),
        })
    }
}
