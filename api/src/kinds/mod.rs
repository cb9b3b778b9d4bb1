//! The kinds podpath serves, one file each: what a kind is (its discovery facts, [`KindInfo`]) and
//! what it does on create, update and delete (defaults, validation, allocations, deletion, Table
//! cells), behind one trait, [`ApiObject`]. The registry calls the trait and never matches on
//! kinds.
//!
//! Adding a kind: a file here with `pub use` of its k8s-openapi type and its `impl ApiObject`,
//! and one entry in the list at the bottom of this file.

use std::collections::BTreeSet;
use std::fmt;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

use crate::alloc::{AllocKey, Allocate, Exhausted, Ranges};
use crate::table::{col, Column, NAME_COLUMN};
use crate::validation::{self as v, Cause, FieldPath};

/// Discovery facts about one kind, and the behaviour flags the generic code needs.
#[derive(Debug)]
pub struct KindInfo {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    /// The `kind` field of objects.
    pub name: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    /// Whether the kind has a `/status` subresource.
    pub has_status: bool,
    /// Whether the kind has a `/scale` subresource (autoscaling/v1 Scale of `spec.replicas`).
    pub has_scale: bool,
    /// Whether `metadata.generation` counts spec changes.
    pub has_generation: bool,
    /// Fields field selectors may use, besides `metadata.name` and `metadata.namespace`.
    pub field_selectors: &'static [&'static str],
    /// Stored and served, but no podpath component acts on it (kubectl's default prune list
    /// needs these kinds): a create answers with a warning that says so.
    pub no_controller: bool,
    /// Defined by a CRD (see [`crate::custom`]).
    pub custom: bool,
}

impl KindInfo {
    /// A kind of the core group with no subresource, no generation and no field selector.
    pub const fn core(name: &'static str, plural: &'static str, singular: &'static str) -> KindInfo {
        KindInfo {
            group: "",
            version: "v1",
            name,
            plural,
            singular,
            namespaced: true,
            short_names: &[],
            categories: &[],
            has_status: false,
            has_scale: false,
            has_generation: false,
            field_selectors: &[],
            no_controller: false,
            custom: false,
        }
    }
}

/// The verbs every kind serves.
const VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// What a delete finds out about the world (the registry asks the store).
pub struct DeleteContext<'a> {
    /// `gracePeriodSeconds` of the request.
    pub grace_period_seconds: Option<i64>,
    pub now: Timestamp,
    /// Whether the named node is Ready (its agent will finish a graceful pod deletion).
    pub node_ready: &'a dyn Fn(&str) -> bool,
}

/// What deleting an object does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletePlan {
    /// Removed now; what it held is released.
    Remove,
    /// Kept, marked as being deleted (someone else finishes the job): `deletionTimestamp` set to
    /// `at`, `deletionGracePeriodSeconds` to `grace_seconds`, `status.phase` to `phase`.
    MarkDeleting { at: Timestamp, grace_seconds: Option<i64>, phase: Option<&'static str> },
    /// Being deleted already: nothing to write.
    AlreadyDeleting,
    /// Refused, with the reason.
    Forbidden(String),
}

/// A type's JSON conversions, compiled once, in this crate. Through serde's generic functions
/// every crate that converts a kind compiles its own copy of that kind's (large) serde code,
/// since a release build shares no generic instances between crates: use these for the kinds
/// (`kinds!` implements them for each) and the few parts converted everywhere.
pub trait Codec: Sized {
    fn from_json(v: Value) -> Result<Self, serde_json::Error>;
    fn to_json(&self) -> Result<Value, serde_json::Error>;
}

macro_rules! codec {
    ($($t:ty),* $(,)?) => {
        $(impl Codec for $t {
            fn from_json(v: Value) -> Result<Self, serde_json::Error> {
                serde_json::from_value(v)
            }
            fn to_json(&self) -> Result<Value, serde_json::Error> {
                serde_json::to_value(self)
            }
        })*
    };
}

codec!(
    ObjectMeta,
    k8s_openapi::api::core::v1::PodTemplateSpec,
    k8s_openapi::api::core::v1::PodSpec,
    k8s_openapi::api::core::v1::Container,
    k8s_openapi::api::core::v1::EphemeralContainer,
    k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
);

/// What each kind apiserver-lite stores does. Pure: no clock (callers pass `now`), no I/O.
pub trait ApiObject:
    k8s_openapi::Metadata<Ty = ObjectMeta> + Serialize + DeserializeOwned + Codec + Clone + Send + Sync + 'static
{
    const KIND: Kind;
    const INFO: KindInfo;

    /// Fills in what the real API server defaults (visible in `-o yaml`).
    fn apply_defaults(&mut self) {}

    /// Resets what a client may not set on create (mostly status). Kinds with a status start
    /// with an empty one, as the real server answers a create (kr8s and the Python client read
    /// it at once).
    fn prepare_for_create(&mut self) {}

    /// Drops what an update leaves behind by accident (fields that belong to an old type).
    fn prepare_for_update(&mut self, _old: &Self) {}

    /// Validates the whole object; `old` is the stored object on updates.
    fn validate(&self, old: Option<&Self>) -> Vec<Cause>;

    /// Takes what the object needs from the server's ranges (ClusterIPs, NodePorts, pool
    /// addresses, pod CIDRs), once it is valid. A value that cannot be had is a cause; a range
    /// with nothing left is [`Exhausted`].
    fn allocate(
        &mut self,
        _old: Option<&Self>,
        _alloc: &mut dyn Allocate,
        _causes: &mut Vec<Cause>,
    ) -> Result<(), Exhausted> {
        Ok(())
    }

    /// Every allocation the object holds, derived from the object itself (what a write claims
    /// and a delete releases).
    fn allocations(&self, _ranges: &Ranges) -> BTreeSet<AllocKey> {
        BTreeSet::new()
    }

    /// What a delete does to this object.
    fn deletion(&self, _ctx: &DeleteContext<'_>) -> DeletePlan {
        DeletePlan::Remove
    }

    fn columns() -> Vec<Column> {
        vec![NAME_COLUMN, col("Created At", "date", 0)]
    }

    /// Cells in the order of [`ApiObject::columns`].
    fn cells(&self, _now: Timestamp) -> Vec<Value> {
        let created = self.metadata().creation_timestamp.as_ref().map(|t| t.0.to_string());
        vec![json!(self.metadata().name.clone().unwrap_or_default()), json!(created.unwrap_or_default())]
    }
}

// === shared by the kinds ===

/// Validates `metadata`: the name rule of the kind, labels and annotations.
pub(crate) fn validate_meta(meta: &ObjectMeta, name_rule: fn(&str) -> Vec<String>, out: &mut Vec<Cause>) {
    validate_meta_at(meta, name_rule, FieldPath::root("metadata"), out)
}

/// [`validate_meta`] of a `metadata` at `path` (an embedded object's).
pub(crate) fn validate_meta_at(
    meta: &ObjectMeta,
    name_rule: fn(&str) -> Vec<String>,
    path: FieldPath,
    out: &mut Vec<Cause>,
) {
    match meta.name.as_deref() {
        None | Some("") => out.push(v::required(&path.child("name"), "name or generateName is required")),
        Some(name) => v::push_all(out, &path.child("name"), name, name_rule(name)),
    }
    if let Some(ns) = meta.namespace.as_deref() {
        if !ns.is_empty() {
            v::push_all(out, &path.child("namespace"), ns, v::dns1123_label(ns));
        }
    }
    if let Some(labels) = &meta.labels {
        v::labels(labels, &path.child("labels"), out);
    }
    if let Some(annotations) = &meta.annotations {
        v::annotations(annotations, &path.child("annotations"), out);
    }
}

/// Validates the `metadata` of an object whose name is a DNS subdomain (custom objects').
pub fn validate_object_meta(meta: &ObjectMeta, out: &mut Vec<Cause>) {
    validate_meta(meta, v::dns1123_subdomain, out);
}

/// The start of validating a kind whose spec is required: the metadata, then the spec, or a
/// `spec: Required value` cause when there is none.
pub(crate) fn meta_and_spec<'a, S>(
    meta: &ObjectMeta,
    name_rule: fn(&str) -> Vec<String>,
    spec: Option<&'a S>,
    out: &mut Vec<Cause>,
) -> Option<&'a S> {
    validate_meta(meta, name_rule, out);
    if spec.is_none() {
        out.push(v::required(&FieldPath::root("spec"), ""));
    }
    spec
}

pub(crate) fn validate_protocol(p: Option<&str>, path: &FieldPath, out: &mut Vec<Cause>) {
    match p {
        None => out.push(v::required(path, "")),
        Some("TCP" | "UDP" | "SCTP") => {}
        Some(other) => out.push(v::not_supported(path, other, &["SCTP", "TCP", "UDP"])),
    }
}

/// A port that may be a number or an IANA service name (targetPort, probe ports).
pub(crate) fn validate_int_or_name(p: &IntOrString, path: &FieldPath, out: &mut Vec<Cause>) {
    match p {
        IntOrString::Int(n) => {
            if !v::port_in_range(*n) {
                out.push(v::invalid(path, n, v::PORT_RANGE_MSG));
            }
        }
        IntOrString::String(s) => v::push_all(out, path, s, v::iana_svc_name(s)),
    }
}

/// `a,b,c + N more...`, or `empty` when there is nothing.
pub(crate) fn first_three(list: &[String], empty: &str) -> String {
    if list.is_empty() {
        return empty.to_string();
    }
    let shown = list.iter().take(3).cloned().collect::<Vec<_>>().join(",");
    if list.len() > 3 {
        format!("{shown} + {} more...", list.len() - 3)
    } else {
        shown
    }
}

// === the list ===

/// The one list of served kinds: `Variant => module`, where `module` (a file of this directory)
/// has `pub use` of the type named like the variant. Generates [`Kind`], [`Kind::ALL`],
/// [`Kind::info`] and [`with_kind_type!`](crate::with_kind_type).
macro_rules! kinds {
    ($d:tt $($variant:ident => $module:ident),* $(,)?) => {
        $(pub mod $module;)*

        codec!($($module::$variant),*);

        /// A kind of object that apiserver-lite stores and serves.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Kind {
            $($variant,)*
            /// A kind a CustomResourceDefinition added (see [`crate::custom`]).
            Custom(crate::custom::CustomKind),
        }

        impl Kind {
            /// Every built-in kind, in the list's order (custom kinds are the registry's).
            pub const ALL: &'static [Kind] = &[$(Kind::$variant,)*];

            pub fn info(self) -> &'static KindInfo {
                match self {
                    $(Kind::$variant => &<$module::$variant as ApiObject>::INFO,)*
                    Kind::Custom(c) => c.info(),
                }
            }
        }

        /// Runs `$body` with `$t` bound to the Rust type of `$kind`, or `$custom` with `$c`
        /// bound to the [`CustomKind`](crate::custom::CustomKind) of a custom kind.
        #[macro_export]
        macro_rules! with_kind_type {
            ($d kind:expr, $d t:ident => $d body:expr, custom $d c:ident => $d custom:expr) => {
                match $d kind {
                    $($d crate::Kind::$variant => {
                        type $d t = $d crate::kinds::$module::$variant;
                        $d body
                    })*
                    $d crate::Kind::Custom($d c) => $d custom,
                }
            };
        }
    };
}

kinds! { $
    Namespace => namespace,
    Node => node,
    Service => service,
    Pod => pod,
    Endpoints => endpoints,
    EndpointSlice => endpointslice,
    Event => event,
    Deployment => deployment,
    ReplicaSet => replicaset,
    Ingress => ingress,
    IngressClass => ingressclass,
    NetworkPolicy => networkpolicy,
    Secret => secret,
    ConfigMap => configmap,
    ServiceAccount => serviceaccount,
    PersistentVolumeClaim => persistentvolumeclaim,
    PersistentVolume => persistentvolume,
    StorageClass => storageclass,
    ReplicationController => replicationcontroller,
    Job => job,
    CronJob => cronjob,
    DaemonSet => daemonset,
    StatefulSet => statefulset,
    ControllerRevision => controllerrevision,
    Lease => lease,
    Role => role,
    ClusterRole => clusterrole,
    RoleBinding => rolebinding,
    ClusterRoleBinding => clusterrolebinding,
    HorizontalPodAutoscaler => horizontalpodautoscaler,
    CustomResourceDefinition => customresourcedefinition,
    ValidatingAdmissionPolicy => validatingadmissionpolicy,
    ValidatingAdmissionPolicyBinding => validatingadmissionpolicybinding,
}

impl Kind {
    /// Finds a kind by the URL triple `/{group}/{version}/{plural}`: a built-in one, or a custom
    /// one served at that version.
    pub fn from_plural(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .iter()
            .copied()
            .find(|k| {
                let i = k.info();
                i.group == group && i.version == version && i.plural == plural
            })
            .or_else(|| crate::custom::CustomKind::served(group, version, plural).map(Kind::Custom))
    }

    /// Finds a built-in kind by its `kind` name (`Service`).
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.info().name == name)
    }

    /// The name the store keys objects of this kind by: the kind's name for a built-in kind,
    /// `plural.group` for a custom one (two groups may both define a `Gateway`).
    pub fn store_name(self) -> String {
        match self {
            Kind::Custom(c) => c.resource(),
            k => k.info().name.to_string(),
        }
    }

    /// The kind a store name names (see [`Kind::store_name`]); a custom resource not known
    /// yet is reserved (its CRD is loaded later).
    pub fn from_store_name(name: &str) -> Option<Kind> {
        match name.contains('.') {
            true => Some(Kind::Custom(crate::custom::CustomKind::reserve(name))),
            false => Kind::from_name(name),
        }
    }

    /// The `kind` of a list of this kind (`ServiceList`; a CRD's `listKind`).
    pub fn list_kind(self) -> String {
        match self {
            Kind::Custom(c) => c.list_kind().to_string(),
            k => format!("{}List", k.info().name),
        }
    }

    /// Whether the kind has a `/scale` subresource (autoscaling/v1 Scale).
    pub fn has_scale(self) -> bool {
        self.info().has_scale
    }

    pub fn api_version(self) -> String {
        let i = self.info();
        if i.group.is_empty() {
            i.version.to_string()
        } else {
            format!("{}/{}", i.group, i.version)
        }
    }

    /// The resource name used in error messages: `services`, `endpointslices.discovery.k8s.io`.
    pub fn qualified_resource(self) -> String {
        let i = self.info();
        if i.group.is_empty() {
            i.plural.to_string()
        } else {
            format!("{}.{}", i.plural, i.group)
        }
    }

    pub fn verbs() -> &'static [&'static str] {
        VERBS
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.info().name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup() {
        assert_eq!(Kind::from_plural("", "v1", "services"), Some(Kind::Service));
        assert_eq!(Kind::from_plural("discovery.k8s.io", "v1", "endpointslices"), Some(Kind::EndpointSlice));
        assert_eq!(Kind::from_plural("", "v1", "endpointslices"), None);
        assert_eq!(Kind::EndpointSlice.api_version(), "discovery.k8s.io/v1");
        assert_eq!(Kind::EndpointSlice.qualified_resource(), "endpointslices.discovery.k8s.io");
        for k in Kind::ALL {
            assert_eq!(Kind::from_name(k.info().name), Some(*k));
        }
    }
}
