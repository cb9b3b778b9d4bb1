//! podpath's API model: the Kubernetes kinds apiserver-lite serves (JSON types from
//! `k8s-openapi`), their defaulting and validation, server-side Table printing, patch
//! semantics, selectors, and the gRPC proto with conversions. No I/O happens here.
//!
//! Start with [`kinds`]: one file per served kind, behind [`ApiObject`], and the one list that
//! makes [`Kind`]. [`alloc`] is what kinds allocate; [`convert`] their gRPC form.
//!
//! What it is not: a definition of the Kubernetes types (they are k8s-openapi's, re-exported),
//! or a client; kinds not listed in [`kinds`] are not served.

pub mod alloc;
pub mod apps;
#[cfg(feature = "cel")]
pub mod cel;
pub mod convert;
pub mod cron;
pub mod custom;
pub mod dualstack;
pub mod grpc_codec;
pub mod jsonpath;
#[macro_use]
pub mod kinds;
pub mod managed;
pub mod netpol;
pub mod networking;
pub mod openapi;
pub mod openapi_pb;
pub mod patch;
pub mod prometheus;
pub mod protobuf;
#[rustfmt::skip]
pub mod protobuf_schema;
pub mod quantity;
pub mod rbac;
pub mod schema;
pub mod selector;
pub mod strict;
pub mod table;
pub mod validation;

/// Code generated from `proto/podpath/v1/api.proto`.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("podpath.v1");

    /// The encoded file descriptor set, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("podpath_descriptor");
}

pub use kinds::{ApiObject, Codec, DeleteContext, DeletePlan, Kind, KindInfo};
pub use validation::{Cause, FieldPath};

pub use k8s_openapi;

/// Errors of the pure API layer. Each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A patch body that cannot be applied (bad JSON patch op, missing merge key…).
    #[error("{0}")]
    Patch(String),
    /// A label or field selector that does not parse.
    #[error("{0}")]
    Selector(String),
    /// A body that does not decode into the kind's type.
    #[error("{kind} in version \"{version}\" cannot be handled as a {kind}: {message}")]
    Decode { kind: &'static str, version: &'static str, message: String },
    /// A proto message that cannot become a Kubernetes object.
    #[error("invalid {what}: {message}")]
    Proto { what: &'static str, message: String },
}

/// Decodes a JSON body into the typed object of kind `T`.
pub fn decode<T: ApiObject>(value: &serde_json::Value) -> Result<T, Error> {
    T::from_json(value.clone()).map_err(|e| Error::Decode {
        kind: <T as ApiObject>::KIND.info().name,
        version: <T as ApiObject>::KIND.info().version,
        message: e.to_string(),
    })
}

/// Encodes a typed object, with `kind` and `apiVersion` set.
pub fn encode<T: ApiObject>(obj: &T) -> serde_json::Value {
    let mut v = obj.to_json().unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), <T as ApiObject>::KIND.info().name.into());
        o.insert("apiVersion".into(), <T as ApiObject>::KIND.api_version().into());
    }
    v
}
