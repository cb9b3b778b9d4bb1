//! The resource kinds podpath serves, with the discovery facts kubectl needs about each
//! (plural, short names, scope, categories, subresources).

use std::fmt;

/// A kind of object that apiserver-lite stores and serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    Node,
    Service,
    Pod,
    Endpoints,
    EndpointSlice,
    Event,
    Deployment,
    ReplicaSet,
    Ingress,
    IngressClass,
    Secret,
}

/// Discovery facts about one kind.
#[derive(Debug)]
pub struct KindInfo {
    pub kind: Kind,
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
}

const VERBS: &[&str] = &["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

pub static KINDS: &[KindInfo] = &[
    KindInfo {
        kind: Kind::Namespace,
        group: "",
        version: "v1",
        name: "Namespace",
        plural: "namespaces",
        singular: "namespace",
        namespaced: false,
        short_names: &["ns"],
        categories: &[],
        has_status: true,
    },
    KindInfo {
        kind: Kind::Node,
        group: "",
        version: "v1",
        name: "Node",
        plural: "nodes",
        singular: "node",
        namespaced: false,
        short_names: &["no"],
        categories: &[],
        has_status: true,
    },
    KindInfo {
        kind: Kind::Service,
        group: "",
        version: "v1",
        name: "Service",
        plural: "services",
        singular: "service",
        namespaced: true,
        short_names: &["svc"],
        categories: &["all"],
        has_status: true,
    },
    KindInfo {
        kind: Kind::Pod,
        group: "",
        version: "v1",
        name: "Pod",
        plural: "pods",
        singular: "pod",
        namespaced: true,
        short_names: &["po"],
        categories: &["all"],
        has_status: true,
    },
    KindInfo {
        kind: Kind::Endpoints,
        group: "",
        version: "v1",
        name: "Endpoints",
        plural: "endpoints",
        singular: "endpoints",
        namespaced: true,
        short_names: &["ep"],
        categories: &[],
        has_status: false,
    },
    KindInfo {
        kind: Kind::EndpointSlice,
        group: "discovery.k8s.io",
        version: "v1",
        name: "EndpointSlice",
        plural: "endpointslices",
        singular: "endpointslice",
        namespaced: true,
        short_names: &[],
        categories: &[],
        has_status: false,
    },
    KindInfo {
        kind: Kind::Event,
        group: "",
        version: "v1",
        name: "Event",
        plural: "events",
        singular: "event",
        namespaced: true,
        short_names: &["ev"],
        categories: &[],
        has_status: false,
    },
    KindInfo {
        kind: Kind::Deployment,
        group: "apps",
        version: "v1",
        name: "Deployment",
        plural: "deployments",
        singular: "deployment",
        namespaced: true,
        short_names: &["deploy"],
        categories: &["all"],
        has_status: true,
    },
    KindInfo {
        kind: Kind::ReplicaSet,
        group: "apps",
        version: "v1",
        name: "ReplicaSet",
        plural: "replicasets",
        singular: "replicaset",
        namespaced: true,
        short_names: &["rs"],
        categories: &["all"],
        has_status: true,
    },
    KindInfo {
        kind: Kind::Ingress,
        group: "networking.k8s.io",
        version: "v1",
        name: "Ingress",
        plural: "ingresses",
        singular: "ingress",
        namespaced: true,
        short_names: &["ing"],
        categories: &[],
        has_status: true,
    },
    KindInfo {
        kind: Kind::IngressClass,
        group: "networking.k8s.io",
        version: "v1",
        name: "IngressClass",
        plural: "ingressclasses",
        singular: "ingressclass",
        namespaced: false,
        short_names: &[],
        categories: &[],
        has_status: false,
    },
    KindInfo {
        kind: Kind::Secret,
        group: "",
        version: "v1",
        name: "Secret",
        plural: "secrets",
        singular: "secret",
        namespaced: true,
        short_names: &[],
        categories: &[],
        has_status: false,
    },
];

impl Kind {
    pub const ALL: [Kind; 12] = [
        Kind::Namespace,
        Kind::Node,
        Kind::Service,
        Kind::Pod,
        Kind::Endpoints,
        Kind::EndpointSlice,
        Kind::Event,
        Kind::Deployment,
        Kind::ReplicaSet,
        Kind::Ingress,
        Kind::IngressClass,
        Kind::Secret,
    ];

    /// Whether the kind has a `/scale` subresource (autoscaling/v1 Scale).
    pub fn has_scale(self) -> bool {
        matches!(self, Kind::Deployment | Kind::ReplicaSet)
    }

    pub fn info(self) -> &'static KindInfo {
        KINDS.iter().find(|k| k.kind == self).expect("every kind is registered")
    }

    /// Finds a kind by the URL triple `/{group}/{version}/{plural}`.
    pub fn from_plural(group: &str, version: &str, plural: &str) -> Option<Kind> {
        KINDS.iter().find(|k| k.group == group && k.version == version && k.plural == plural).map(|k| k.kind)
    }

    /// Finds a kind by its `kind` name (`Service`).
    pub fn from_name(name: &str) -> Option<Kind> {
        KINDS.iter().find(|k| k.name == name).map(|k| k.kind)
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
            assert_eq!(k.info().kind, k);
        }
    }
}
