//! admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBindings: stored and served beside
//! their policies (see `validatingadmissionpolicy`), validated for their shape.

use super::{meta_and_spec, ApiObject, Kind, KindInfo};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding;

impl ApiObject for ValidatingAdmissionPolicyBinding {
    const KIND: Kind = Kind::ValidatingAdmissionPolicyBinding;
    const INFO: KindInfo = KindInfo {
        group: "admissionregistration.k8s.io",
        namespaced: false,
        categories: &["api-extensions"],
        has_generation: true,
        no_controller: true,
        ..KindInfo::core(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
            "validatingadmissionpolicybinding",
        )
    };

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        let Some(spec) = meta_and_spec(&self.metadata, v::dns1123_subdomain, self.spec.as_ref(), &mut out) else {
            return out;
        };
        let path = FieldPath::root("spec");
        if spec.policy_name.as_deref().unwrap_or("").is_empty() {
            out.push(v::required(&path.child("policyName"), ""));
        }
        let actions = spec.validation_actions.clone().unwrap_or_default();
        if actions.is_empty() {
            out.push(v::required(&path.child("validationActions"), "at least one validation action is required"));
        }
        for (i, a) in actions.iter().enumerate() {
            if !["Deny", "Warn", "Audit"].contains(&a.as_str()) {
                out.push(v::not_supported(&path.child("validationActions").index(i), a.as_str(), &["Audit", "Deny", "Warn"]));
            }
        }
        out
    }
}
