//! Conversions between the Kubernetes types (k8s-openapi) and the gRPC messages.
//!
//! The proto models the fields podpath's components use. Everything else travels in
//! `extra_json`: a JSON merge patch that turns the typed part back into the exact original, so
//! `from_proto(to_proto(x)) == x` for every object, modeled or not.

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use k8s_openapi::api::networking::v1 as api_networking;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::proto as pb;
use crate::{ApiObject, Error, Kind};

/// A Kubernetes object that has a proto form.
pub trait ProtoConvert: Sized + Serialize + DeserializeOwned {
    type Proto: prost::Message + Default;
    /// The typed part only (no `extra_json`).
    fn to_typed(&self) -> Self::Proto;
    fn from_typed(p: &Self::Proto) -> Result<Self, Error>;
    fn extra(p: &Self::Proto) -> &str;
    fn set_extra(p: &mut Self::Proto, extra: String);
}

/// Converts an object to its proto form, losslessly.
pub fn to_proto<T: ProtoKind>(obj: &T) -> T::Proto {
    T::to_proto_of(obj)
}

/// Converts a proto message back to the Kubernetes object.
pub fn from_proto<T: ProtoKind>(p: &T::Proto) -> Result<T, Error> {
    T::from_proto_of(p)
}

/// A stored object (JSON) as its proto message, through the typed object.
pub fn json_to_proto<T: ProtoKind>(v: Value) -> Result<T::Proto, serde_json::Error> {
    T::json_to_proto_of(v)
}

/// A proto message as the object's JSON, through the typed object.
pub fn proto_to_json<T: ProtoKind>(p: &T::Proto) -> Result<Value, Error> {
    T::proto_to_json_of(p)
}

// The bodies of the four conversions, instantiated once per kind by `proto_kinds!` here.
fn to_proto_any<T: ProtoConvert>(obj: &T) -> T::Proto {
    let mut p = obj.to_typed();
    let back = T::from_typed(&p).map(|b| serde_json::to_value(&b).unwrap_or_default()).unwrap_or_default();
    let orig = serde_json::to_value(obj).unwrap_or_default();
    let diff = merge_diff(&back, &orig);
    if diff.as_object().is_none_or(|m| !m.is_empty()) {
        T::set_extra(&mut p, diff.to_string());
    }
    p
}

fn from_proto_any<T: ProtoConvert>(p: &T::Proto) -> Result<T, Error> {
    let typed = T::from_typed(p)?;
    let extra = T::extra(p);
    if extra.is_empty() {
        return Ok(typed);
    }
    let patch: Value = serde_json::from_str(extra).map_err(|e| proto_err("extra_json", e))?;
    let mut doc = serde_json::to_value(&typed).map_err(|e| proto_err("object", e))?;
    json_patch::merge(&mut doc, &patch);
    serde_json::from_value(doc).map_err(|e| proto_err("object", e))
}

fn json_to_proto_any<T: ProtoConvert>(v: Value) -> Result<T::Proto, serde_json::Error> {
    serde_json::from_value::<T>(v).map(|o| to_proto_any(&o))
}

fn proto_to_json_any<T: ProtoConvert>(p: &T::Proto) -> Result<Value, Error> {
    serde_json::to_value(from_proto_any::<T>(p)?).map_err(|e| proto_err("object", e))
}

/// `extra_json` accessors of a proto message (declared before the kind modules that use it).
macro_rules! extra_accessors {
    () => {
        fn extra(p: &Self::Proto) -> &str {
            &p.extra_json
        }
        fn set_extra(p: &mut Self::Proto, extra: String) {
            p.extra_json = extra;
        }
    };
}

mod endpoints;
mod meta;
mod namespace;
mod node;
mod opaque;
mod pod;
mod service;

// === the kinds served over gRPC ===

/// A kind that travels over podpath's gRPC API: its proto kind and its place in a watch event.
/// Implemented by `proto_kinds!`, the one table of API kinds ↔ proto kinds.
pub trait ProtoKind: ProtoConvert + ApiObject {
    const PROTO_KIND: pb::Kind;
    fn into_event_object(p: Self::Proto) -> pb::watch_event::Object;
    fn from_event_object(o: pb::watch_event::Object) -> Option<Self::Proto>;
    // The conversions of this kind, compiled in this crate alone: a generic function would be
    // compiled again in every crate that converts (a release build shares no generic
    // instances between crates), and a kind's serde code is large. Use the free functions.
    #[doc(hidden)]
    fn to_proto_of(obj: &Self) -> Self::Proto;
    #[doc(hidden)]
    fn from_proto_of(p: &Self::Proto) -> Result<Self, Error>;
    #[doc(hidden)]
    fn json_to_proto_of(v: Value) -> Result<Self::Proto, serde_json::Error>;
    #[doc(hidden)]
    fn proto_to_json_of(p: &Self::Proto) -> Result<Value, Error>;
}

/// The one table of kinds served over gRPC: API kind, proto kind and watch-event variant share
/// the name.
macro_rules! proto_kinds {
    ($($variant:ident: $t:ty),* $(,)?) => {
        $(
            impl ProtoKind for $t {
                const PROTO_KIND: pb::Kind = pb::Kind::$variant;
                fn into_event_object(p: Self::Proto) -> pb::watch_event::Object {
                    pb::watch_event::Object::$variant(p)
                }
                fn from_event_object(o: pb::watch_event::Object) -> Option<Self::Proto> {
                    match o {
                        pb::watch_event::Object::$variant(p) => Some(p),
                        _ => None,
                    }
                }
                fn to_proto_of(obj: &Self) -> Self::Proto {
                    to_proto_any(obj)
                }
                fn from_proto_of(p: &Self::Proto) -> Result<Self, Error> {
                    from_proto_any(p)
                }
                fn json_to_proto_of(v: Value) -> Result<Self::Proto, serde_json::Error> {
                    json_to_proto_any::<Self>(v)
                }
                fn proto_to_json_of(p: &Self::Proto) -> Result<Value, Error> {
                    proto_to_json_any::<Self>(p)
                }
            }
        )*

        /// The API kind of a proto kind (None for `KIND_UNSPECIFIED`).
        pub fn kind_of(proto: pb::Kind) -> Option<Kind> {
            match proto {
                $(pb::Kind::$variant => Some(Kind::$variant),)*
                _ => None,
            }
        }

        /// A stored object as a watch event's object; None for a kind not served over gRPC.
        pub fn event_object(kind: Kind, v: Value) -> Option<Result<pb::watch_event::Object, serde_json::Error>> {
            match kind {
                $(Kind::$variant => Some(json_to_proto::<$t>(v).map(<$t>::into_event_object)),)*
                _ => None,
            }
        }
    };
}

proto_kinds! {
    Service: core::Service,
    Pod: core::Pod,
    Node: core::Node,
    Namespace: core::Namespace,
    Endpoints: core::Endpoints,
    EndpointSlice: discovery::EndpointSlice,
    Ingress: api_networking::Ingress,
    Secret: core::Secret,
    NetworkPolicy: api_networking::NetworkPolicy,
    ConfigMap: core::ConfigMap,
    PersistentVolumeClaim: core::PersistentVolumeClaim,
    PersistentVolume: core::PersistentVolume,
}

fn proto_err(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Proto { what, message: e.to_string() }
}

/// The JSON merge patch that turns `from` into `to`.
pub fn merge_diff(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut out = Map::new();
            for (k, tv) in t {
                match f.get(k) {
                    Some(fv) if fv == tv => {}
                    Some(fv @ Value::Object(_)) if tv.is_object() => {
                        out.insert(k.clone(), merge_diff(fv, tv));
                    }
                    _ => {
                        out.insert(k.clone(), tv.clone());
                    }
                }
            }
            for k in f.keys() {
                if !t.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            Value::Object(out)
        }
        _ => to.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip<T: ProtoKind + PartialEq + std::fmt::Debug>(v: Value) -> T::Proto {
        let obj: T = serde_json::from_value(v).unwrap();
        let p = to_proto(&obj);
        let back: T = from_proto(&p).unwrap();
        assert_eq!(back, obj);
        // The bytes survive too.
        let bytes = prost::Message::encode_to_vec(&p);
        let decoded = <T::Proto as prost::Message>::decode(bytes.as_slice()).unwrap();
        assert_eq!(from_proto::<T>(&decoded).unwrap(), obj);
        p
    }

    #[test]
    fn service_round_trips_with_no_extra() {
        let p = round_trip::<core::Service>(json!({
            "metadata": {"name": "contour", "namespace": "default", "uid": "u1", "resourceVersion": "7",
                         "creationTimestamp": "2026-11-22T10:00:00Z", "labels": {"app": "contour"}},
            "spec": {"type": "LoadBalancer", "selector": {"app": "contour"}, "clusterIP": "10.96.0.10",
                     "clusterIPs": ["10.96.0.10"], "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30080, "protocol": "TCP"},
                               {"name": "https", "port": 443, "targetPort": "https", "nodePort": 30443, "protocol": "TCP"}],
                     "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
                     "externalTrafficPolicy": "Local", "healthCheckNodePort": 32000, "internalTrafficPolicy": "Cluster",
                     "allocateLoadBalancerNodePorts": true, "loadBalancerSourceRanges": ["203.0.113.0/24"]},
            "status": {"loadBalancer": {"ingress": [{"ip": "198.51.100.1"}]}}
        }));
        assert_eq!(p.extra_json, "");
    }

    #[test]
    fn unmodeled_fields_travel_in_extra() {
        let p = round_trip::<core::Service>(json!({
            "metadata": {"name": "x", "labels": {}, "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"trafficDistribution": "PreferClose", "ports": []}
        }));
        assert!(p.extra_json.contains("trafficDistribution"));
        assert!(p.extra_json.contains("managedFields"));
    }

    #[test]
    fn pod_node_namespace_endpoints_round_trip() {
        round_trip::<core::Pod>(json!({
            "metadata": {"name": "web", "namespace": "default", "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "1", "controller": true}]},
            "spec": {"nodeName": "node-1", "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
                     "containers": [{"name": "web", "image": "podpath/echo", "args": ["--x"], "env": [{"name": "A", "value": "b"}],
                                     "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
                                     "readinessProbe": {"httpGet": {"port": "http", "path": "/"}, "periodSeconds": 1},
                                     "livenessProbe": {"tcpSocket": {"port": 8080}}}],
                     "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"phase": "Running", "podIP": "10.244.1.2", "podIPs": [{"ip": "10.244.1.2"}],
                       "hostIP": "192.168.56.11", "startTime": "2026-11-22T10:00:00Z",
                       "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T10:00:01Z"}],
                       "containerStatuses": [{"name": "web", "ready": true, "restartCount": 1, "image": "podpath/echo", "imageID": "",
                                              "state": {"running": {"startedAt": "2026-11-22T10:00:00Z"}},
                                              "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
        }));
        round_trip::<core::Node>(json!({
            "metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}},
            "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.11"}],
                       "capacity": {"cpu": "2", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2026-11-22T10:00:00Z"}],
                       "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                                    "osImage": "Debian", "containerRuntimeVersion": "podpath://0.1", "kubeletVersion": "v1.32.0",
                                    "kubeProxyVersion": "v1.32.0", "operatingSystem": "linux", "architecture": "amd64"}}
        }));
        round_trip::<core::Namespace>(json!({
            "metadata": {"name": "default"}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}
        }));
        round_trip::<core::Endpoints>(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.244.1.2", "nodeName": "node-1", "targetRef": {"kind": "Pod", "name": "web"}}],
                         "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]
        }));
        round_trip::<discovery::EndpointSlice>(json!({
            "metadata": {"name": "web-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.2"], "conditions": {"ready": true, "serving": true, "terminating": false},
                           "nodeName": "node-1"}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]
        }));
        round_trip::<api_networking::NetworkPolicy>(json!({
            "metadata": {"name": "web", "namespace": "default", "generation": 1},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                  "ports": [{"port": "http", "protocol": "TCP"}, {"port": 81, "endPort": 90}]}]}
        }));
    }
}
