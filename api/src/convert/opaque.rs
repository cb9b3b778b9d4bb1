//! Ingress, Secret, ConfigMap, NetworkPolicy, PersistentVolumeClaim and PersistentVolume:
//! metadata typed, the rest in `extra_json` (only
//! lb-sim and the node agents read them: L7 load balancing, volumes, policy enforcement).

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::networking::v1 as api_networking;

use super::meta::*;
use super::ProtoConvert;
use crate::proto as pb;
use crate::Error;

impl ProtoConvert for api_networking::Ingress {
    type Proto = pb::Ingress;
    extra_accessors!();

    fn to_typed(&self) -> pb::Ingress {
        pb::Ingress { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::Ingress) -> Result<Self, Error> {
        Ok(api_networking::Ingress { metadata: object_meta_back(&p.metadata)?, spec: None, status: None })
    }
}

impl ProtoConvert for core::Secret {
    type Proto = pb::Secret;
    extra_accessors!();

    fn to_typed(&self) -> pb::Secret {
        pb::Secret { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::Secret) -> Result<Self, Error> {
        Ok(core::Secret { metadata: object_meta_back(&p.metadata)?, ..Default::default() })
    }
}

impl ProtoConvert for core::ConfigMap {
    type Proto = pb::ConfigMap;
    extra_accessors!();

    fn to_typed(&self) -> pb::ConfigMap {
        pb::ConfigMap { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::ConfigMap) -> Result<Self, Error> {
        Ok(core::ConfigMap { metadata: object_meta_back(&p.metadata)?, ..Default::default() })
    }
}

impl ProtoConvert for api_networking::NetworkPolicy {
    type Proto = pb::NetworkPolicy;
    extra_accessors!();

    fn to_typed(&self) -> pb::NetworkPolicy {
        pb::NetworkPolicy { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::NetworkPolicy) -> Result<Self, Error> {
        Ok(api_networking::NetworkPolicy { metadata: object_meta_back(&p.metadata)?, spec: None })
    }
}

impl ProtoConvert for core::PersistentVolumeClaim {
    type Proto = pb::PersistentVolumeClaim;
    extra_accessors!();

    fn to_typed(&self) -> pb::PersistentVolumeClaim {
        pb::PersistentVolumeClaim { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::PersistentVolumeClaim) -> Result<Self, Error> {
        Ok(core::PersistentVolumeClaim { metadata: object_meta_back(&p.metadata)?, ..Default::default() })
    }
}

impl ProtoConvert for core::PersistentVolume {
    type Proto = pb::PersistentVolume;
    extra_accessors!();

    fn to_typed(&self) -> pb::PersistentVolume {
        pb::PersistentVolume { metadata: Some(object_meta(&self.metadata)), extra_json: String::new() }
    }

    fn from_typed(p: &pb::PersistentVolume) -> Result<Self, Error> {
        Ok(core::PersistentVolume { metadata: object_meta_back(&p.metadata)?, ..Default::default() })
    }
}
