//! apiextensions.k8s.io/v1 CustomResourceDefinitions: defaults and validation as the
//! apiextensions server words them (names, versions, scope, printer columns, subresources and
//! structural schemas, see [`crate::schema`]), and what a CRD makes: the [`CustomFacts`] of its
//! resource and the [`CrdVersion`]s the API server serves.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinitionSpec, CustomResourceDefinitionStatus,
    CustomResourceDefinitionVersion, CustomResourceSubresourceScale, JSONSchemaProps,
};

use super::{validate_meta, ApiObject, DeleteContext, DeletePlan, Kind, KindInfo};
use crate::custom::CustomFacts;
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

/// The finalizer a CRD being deleted keeps until its objects are gone.
pub const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

impl ApiObject for CustomResourceDefinition {
    const KIND: Kind = Kind::CustomResourceDefinition;
    const INFO: KindInfo = KindInfo {
        group: "apiextensions.k8s.io",
        namespaced: false,
        short_names: &["crd", "crds"],
        categories: &["api-extensions"],
        has_status: true,
        has_generation: true,
        ..KindInfo::core("CustomResourceDefinition", "customresourcedefinitions", "customresourcedefinition")
    };

    fn apply_defaults(&mut self) {
        let names = &mut self.spec.names;
        if names.singular.as_deref().unwrap_or("").is_empty() {
            names.singular = Some(names.kind.to_lowercase());
        }
        if names.list_kind.as_deref().unwrap_or("").is_empty() && !names.kind.is_empty() {
            names.list_kind = Some(format!("{}List", names.kind));
        }
        if self.spec.conversion.is_none() {
            self.spec.conversion = Some(serde_json::from_value(serde_json::json!({"strategy": "None"})).unwrap_or_default());
        }
    }

    fn prepare_for_create(&mut self) {
        // The establishing controller fills in accepted names and conditions.
        self.status = Some(CustomResourceDefinitionStatus {
            accepted_names: Some(Default::default()),
            conditions: Some(vec![]),
            stored_versions: Some(storage_version(&self.spec).map(|v| vec![v.to_string()]).unwrap_or_default()),
        });
    }

    fn prepare_for_update(&mut self, old: &Self) {
        // A new storage version is recorded in storedVersions, as the real strategy does.
        let mut status = old.status.clone().unwrap_or_default();
        if let Some(v) = storage_version(&self.spec) {
            let stored = status.stored_versions.get_or_insert_with(Vec::new);
            if !stored.iter().any(|s| s == v) {
                stored.push(v.to_string());
            }
        }
        if self.status.is_none() {
            self.status = Some(status);
        } else if let Some(s) = self.status.as_mut() {
            if s.stored_versions.as_ref().is_none_or(|v| v.is_empty()) {
                s.stored_versions = status.stored_versions;
            }
        }
    }

    /// A CRD stays, terminating, until the controller has deleted its objects (the real
    /// server's `customresourcecleanup` finalizer).
    fn deletion(&self, ctx: &DeleteContext<'_>) -> DeletePlan {
        match self.metadata.deletion_timestamp {
            Some(_) => DeletePlan::AlreadyDeleting,
            None => DeletePlan::MarkDeleting { at: ctx.now, grace_seconds: Some(0), phase: None },
        }
    }

    fn validate(&self, old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        validate_meta(&self.metadata, v::dns1123_subdomain, &mut out);
        let spec = &self.spec;
        let name = self.metadata.name.clone().unwrap_or_default();
        if name != format!("{}.{}", spec.names.plural, spec.group) {
            out.push(v::invalid(
                &FieldPath::root("metadata").child("name"),
                name.as_str(),
                "must be spec.names.plural+\".\"+spec.group",
            ));
        }
        validate_spec(spec, &mut out);
        if let Some(old) = old {
            let path = FieldPath::root("spec");
            if old.spec.group != spec.group {
                out.push(v::invalid(&path.child("group"), spec.group.as_str(), "field is immutable"));
            }
            if old.spec.scope != spec.scope {
                out.push(v::invalid(&path.child("scope"), spec.scope.as_str(), "field is immutable"));
            }
            let stored = self.status.as_ref().and_then(|s| s.stored_versions.clone()).unwrap_or_default();
            for (i, sv) in stored.iter().enumerate() {
                if !spec.versions.iter().any(|v| &v.name == sv) {
                    out.push(v::invalid(
                        &FieldPath::root("status").child("storedVersions").index(i),
                        sv.as_str(),
                        &format!("missing from spec.versions; {sv} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {sv} and removes {sv} from status.storedVersions"),
                    ));
                }
            }
        }
        out
    }
}

fn validate_spec(spec: &CustomResourceDefinitionSpec, out: &mut Vec<Cause>) {
    let path = FieldPath::root("spec");
    if spec.group.is_empty() {
        out.push(v::required(&path.child("group"), ""));
    } else {
        let errs = v::dns1123_subdomain(&spec.group);
        if !errs.is_empty() {
            out.push(v::invalid(&path.child("group"), spec.group.as_str(), &errs.join(",")));
        } else if !spec.group.contains('.') {
            out.push(v::invalid(&path.child("group"), spec.group.as_str(), "should be a domain with at least one dot"));
        }
    }
    match spec.scope.as_str() {
        "Cluster" | "Namespaced" => {}
        "" => out.push(v::required(&path.child("scope"), "")),
        other => out.push(v::not_supported(&path.child("scope"), other, &["Cluster", "Namespaced"])),
    }
    let versions = path.child("versions");
    let shown = format!("[{} versions]", spec.versions.len());
    let mut names = std::collections::BTreeSet::new();
    let mut unique = true;
    let mut storage = 0;
    for (i, ver) in spec.versions.iter().enumerate() {
        let at = versions.index(i);
        if !names.insert(ver.name.as_str()) {
            unique = false;
        }
        if ver.storage {
            storage += 1;
        }
        let errs = v::dns1035_label(&ver.name);
        if !errs.is_empty() {
            out.push(v::invalid(&at.child("name"), ver.name.as_str(), &errs.join(",")));
        }
        validate_version(ver, &at, out);
    }
    if !unique {
        out.push(v::invalid(&versions, shown.as_str(), "must contain unique version names"));
    }
    if storage != 1 {
        out.push(v::invalid(&versions, shown.as_str(), "must have exactly one version marked as storage version"));
    }
    let names = &spec.names;
    let np = path.child("names");
    for (value, field) in [
        (names.plural.as_str(), "plural"),
        (names.singular.as_deref().unwrap_or(""), "singular"),
        (names.kind.as_str(), "kind"),
        (names.list_kind.as_deref().unwrap_or(""), "listKind"),
    ] {
        if value.is_empty() {
            out.push(v::required(&np.child(field), ""));
            continue;
        }
        let lower = value.to_lowercase();
        let errs = v::dns1035_label(if field == "kind" || field == "listKind" { &lower } else { value });
        if !errs.is_empty() {
            let detail = match field {
                "kind" | "listKind" => format!("may have mixed case, but should otherwise match: {}", errs.join(",")),
                _ => errs.join(","),
            };
            out.push(v::invalid(&np.child(field), value, &detail));
        }
    }
    if !names.kind.is_empty() && names.list_kind.as_deref() == Some(names.kind.as_str()) {
        out.push(v::invalid(&np.child("listKind"), names.kind.as_str(), "kind and listKind may not be the same"));
    }
    for (i, s) in names.short_names.iter().flatten().enumerate() {
        let errs = v::dns1035_label(s);
        if !errs.is_empty() {
            out.push(v::invalid(&np.child("shortNames").index(i), s.as_str(), &errs.join(",")));
        }
    }
    for (i, c) in names.categories.iter().flatten().enumerate() {
        let errs = v::dns1035_label(c);
        if !errs.is_empty() {
            out.push(v::invalid(&np.child("categories").index(i), c.as_str(), &errs.join(",")));
        }
    }
    if let Some(c) = &spec.conversion {
        match c.strategy.as_str() {
            "None" => {}
            "Webhook" => out.push(v::not_supported(&path.child("conversion").child("strategy"), "Webhook", &["None"])),
            other => out.push(v::not_supported(&path.child("conversion").child("strategy"), other, &["None", "Webhook"])),
        }
    }
    if spec.preserve_unknown_fields == Some(true) {
        out.push(v::invalid(
            &path.child("preserveUnknownFields"),
            "true",
            "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead",
        ));
    }
}

const COLUMN_TYPES: &[&str] = &["boolean", "date", "integer", "number", "string"];
const COLUMN_FORMATS: &[&str] = &["byte", "date", "date-time", "double", "float", "int32", "int64", "name", "password"];

fn validate_version(ver: &CustomResourceDefinitionVersion, at: &FieldPath, out: &mut Vec<Cause>) {
    let schema = ver.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
    let schema_path = at.child("schema").child("openAPIV3Schema");
    match schema {
        None if ver.served => out.push(v::required(&schema_path, "because otherwise all fields are pruned")),
        None => {}
        Some(s) => {
            out.extend(crate::schema::structural(s, &schema_path));
            #[cfg(feature = "cel")]
            crate::cel::check_rules(s, &schema_path, out);
            let has_status = ver.subresources.as_ref().is_some_and(|r| r.status.is_some());
            if has_status && s.type_.as_deref().is_some_and(|t| t != "object") {
                out.push(v::invalid(
                    &schema_path.child("type"),
                    s.type_.as_deref().unwrap_or(""),
                    "only \"object\" is allowed as the type at the root of the schema if the status subresource is enabled",
                ));
            }
            if s.nullable == Some(true) {
                out.push(v::forbidden(&schema_path.child("nullable"), "nullable cannot be true at the root"));
            }
        }
    }
    for (i, col) in ver.additional_printer_columns.iter().flatten().enumerate() {
        let cp = at.child("additionalPrinterColumns").index(i);
        if col.name.is_empty() {
            out.push(v::required(&cp.child("name"), ""));
        }
        let types = format!("must be one of {}", COLUMN_TYPES.join(","));
        if col.type_.is_empty() {
            out.push(v::required(&cp.child("type"), &types));
        } else if !COLUMN_TYPES.contains(&col.type_.as_str()) {
            out.push(v::invalid(&cp.child("type"), col.type_.as_str(), &types));
        }
        if let Some(f) = col.format.as_deref().filter(|f| !f.is_empty() && !COLUMN_FORMATS.contains(f)) {
            out.push(v::invalid(&cp.child("format"), f, &format!("must be one of {}", COLUMN_FORMATS.join(","))));
        }
        if col.json_path.is_empty() {
            out.push(v::required(&cp.child("JSONPath"), ""));
        } else if let Err(e) = crate::jsonpath::JsonPath::parse(&col.json_path) {
            out.push(v::invalid(&cp.child("JSONPath"), col.json_path.as_str(), &format!("is an invalid path: {e}")));
        }
    }
    if let Some(scale) = ver.subresources.as_ref().and_then(|r| r.scale.as_ref()) {
        let sp = at.child("subresources").child("scale");
        validate_scale(scale, &sp, out);
    }
}

fn validate_scale(scale: &CustomResourceSubresourceScale, sp: &FieldPath, out: &mut Vec<Cause>) {
    if scale.spec_replicas_path.is_empty() {
        out.push(v::required(&sp.child("specReplicasPath"), ""));
    } else if !scale.spec_replicas_path.starts_with(".spec.") {
        out.push(v::invalid(&sp.child("specReplicasPath"), scale.spec_replicas_path.as_str(), "should be a json path under .spec"));
    }
    if scale.status_replicas_path.is_empty() {
        out.push(v::required(&sp.child("statusReplicasPath"), ""));
    } else if !scale.status_replicas_path.starts_with(".status.") {
        out.push(v::invalid(
            &sp.child("statusReplicasPath"),
            scale.status_replicas_path.as_str(),
            "should be a json path under .status",
        ));
    }
    if let Some(l) = scale.label_selector_path.as_deref().filter(|l| !l.is_empty()) {
        if !l.starts_with(".spec.") && !l.starts_with(".status.") {
            out.push(v::invalid(&sp.child("labelSelectorPath"), l, "should be a json path under either .spec or .status"));
        }
    }
}

/// The name of the version marked `storage`.
pub fn storage_version(spec: &CustomResourceDefinitionSpec) -> Option<&str> {
    spec.versions.iter().find(|v| v.storage).map(|v| v.name.as_str())
}

/// One served version of a custom resource, as the API server needs it.
#[derive(Clone, Debug, Default)]
pub struct CrdVersion {
    pub name: String,
    pub schema: Option<JSONSchemaProps>,
    pub columns: Vec<CustomResourceColumnDefinition>,
    pub scale: Option<CustomResourceSubresourceScale>,
    pub has_status: bool,
    pub deprecated: bool,
    pub deprecation_warning: Option<String>,
    /// `selectableFields`, as field selectors name them (`spec.color`).
    pub selectable: Vec<String>,
}

/// The served versions of a CRD, in its order.
pub fn served_versions(crd: &CustomResourceDefinition) -> Vec<CrdVersion> {
    crd.spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| CrdVersion {
            name: v.name.clone(),
            schema: v.schema.as_ref().and_then(|s| s.open_api_v3_schema.clone()),
            columns: v.additional_printer_columns.clone().unwrap_or_default(),
            scale: v.subresources.as_ref().and_then(|s| s.scale.clone()),
            has_status: v.subresources.as_ref().is_some_and(|s| s.status.is_some()),
            deprecated: v.deprecated == Some(true),
            deprecation_warning: v.deprecation_warning.clone(),
            selectable: v
                .selectable_fields
                .iter()
                .flatten()
                .map(|f| f.json_path.trim_start_matches('.').to_string())
                .collect(),
        })
        .collect()
}

/// What the CRD's resource is (its storage version's facts).
pub fn facts(crd: &CustomResourceDefinition) -> CustomFacts {
    let spec = &crd.spec;
    let storage = spec.versions.iter().find(|v| v.storage);
    let sub = storage.and_then(|v| v.subresources.as_ref());
    CustomFacts {
        group: spec.group.clone(),
        version: storage.map(|v| v.name.clone()).unwrap_or_default(),
        kind: spec.names.kind.clone(),
        list_kind: spec.names.list_kind.clone().unwrap_or_else(|| format!("{}List", spec.names.kind)),
        plural: spec.names.plural.clone(),
        singular: spec.names.singular.clone().unwrap_or_else(|| spec.names.kind.to_lowercase()),
        namespaced: spec.scope == "Namespaced",
        short_names: spec.names.short_names.clone().unwrap_or_default(),
        categories: spec.names.categories.clone().unwrap_or_default(),
        has_status: sub.is_some_and(|s| s.status.is_some()),
        has_scale: sub.is_some_and(|s| s.scale.is_some()),
        served: spec.versions.iter().filter(|v| v.served).map(|v| v.name.clone()).collect(),
        selectable: storage
            .and_then(|v| v.selectable_fields.as_ref())
            .into_iter()
            .flatten()
            .map(|f| f.json_path.trim_start_matches('.').to_string())
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(v: serde_json::Value) -> CustomResourceDefinition {
        let mut c: CustomResourceDefinition = serde_json::from_value(v).unwrap();
        c.apply_defaults();
        c
    }

    fn crontabs() -> serde_json::Value {
        json!({"metadata": {"name": "crontabs.stable.example.com"},
            "spec": {"group": "stable.example.com", "scope": "Namespaced",
                "names": {"plural": "crontabs", "kind": "CronTab", "shortNames": ["ct"]},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object",
                        "properties": {"cronSpec": {"type": "string"}}}}}},
                    "additionalPrinterColumns": [{"name": "Spec", "type": "string", "jsonPath": ".spec.cronSpec"}]}]}})
    }

    fn causes(c: &CustomResourceDefinition) -> Vec<String> {
        c.validate(None).iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn a_good_crd_is_defaulted_and_makes_its_resource() {
        let c = crd(crontabs());
        assert_eq!(causes(&c), Vec::<String>::new());
        assert_eq!(c.spec.names.singular.as_deref(), Some("crontab"));
        assert_eq!(c.spec.names.list_kind.as_deref(), Some("CronTabList"));
        let f = facts(&c);
        assert_eq!((f.group.as_str(), f.version.as_str(), f.plural.as_str()), ("stable.example.com", "v1", "crontabs"));
        assert!(f.namespaced);
        assert_eq!(served_versions(&c)[0].columns[0].json_path, ".spec.cronSpec");
    }

    #[test]
    fn bad_crds_get_the_apiextensions_servers_texts() {
        let mut v = crontabs();
        v["metadata"]["name"] = json!("crontab.stable.example.com");
        v["spec"]["group"] = json!("example");
        v["spec"]["scope"] = json!("Global");
        v["spec"]["versions"][0]["storage"] = json!(false);
        v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] = json!({"properties": {}});
        v["spec"]["versions"][0]["additionalPrinterColumns"][0]["type"] = json!("text");
        let got = causes(&crd(v));
        assert_eq!(
            got,
            [
                "metadata.name: Invalid value: \"crontab.stable.example.com\": must be spec.names.plural+\".\"+spec.group",
                "spec.group: Invalid value: \"example\": should be a domain with at least one dot",
                "spec.scope: Unsupported value: \"Global\": supported values: \"Cluster\", \"Namespaced\"",
                "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
                "spec.versions[0].additionalPrinterColumns[0].type: Invalid value: \"text\": must be one of boolean,date,integer,number,string",
                "spec.versions: Invalid value: \"[1 versions]\": must have exactly one version marked as storage version",
            ]
        );
    }
}
