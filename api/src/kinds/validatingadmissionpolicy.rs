//! admissionregistration.k8s.io/v1 ValidatingAdmissionPolicies and their bindings: stored and
//! served (add-ons such as the Gateway API install them beside their CRDs), validated for their
//! shape; podpath evaluates no policy (a create says so in a warning).

use super::{meta_and_spec, ApiObject, Kind, KindInfo};
use crate::validation::{self as v, Cause, FieldPath};

pub use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy;

impl ApiObject for ValidatingAdmissionPolicy {
    const KIND: Kind = Kind::ValidatingAdmissionPolicy;
    const INFO: KindInfo = KindInfo {
        group: "admissionregistration.k8s.io",
        namespaced: false,
        categories: &["api-extensions"],
        has_status: true,
        has_generation: true,
        no_controller: true,
        ..KindInfo::core("ValidatingAdmissionPolicy", "validatingadmissionpolicies", "validatingadmissionpolicy")
    };

    fn validate(&self, _old: Option<&Self>) -> Vec<Cause> {
        let mut out = Vec::new();
        let Some(spec) = meta_and_spec(&self.metadata, v::dns1123_subdomain, self.spec.as_ref(), &mut out) else {
            return out;
        };
        let path = FieldPath::root("spec");
        if let Some(p) = spec.failure_policy.as_deref() {
            if p != "Fail" && p != "Ignore" {
                out.push(v::not_supported(&path.child("failurePolicy"), p, &["Fail", "Ignore"]));
            }
        }
        for (i, val) in spec.validations.iter().flatten().enumerate() {
            if val.expression.trim().is_empty() {
                out.push(v::required(&path.child("validations").index(i).child("expression"), "expression is not specified"));
            }
        }
        out
    }
}
