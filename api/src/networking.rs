//! The lab's L7 load balancer and networking.k8s.io: its IngressClass, and which Ingresses it
//! serves (lb-sim serves the Ingresses of [`LAB_CLASS`]; the kinds are `kinds::ingress` and
//! `kinds::ingressclass`).

use k8s_openapi::api::networking::v1::Ingress;

/// The IngressClass of the lab's L7 load balancer (the default class).
pub const LAB_CLASS: &str = "podpath";
/// The controller named by [`LAB_CLASS`].
pub const LAB_CONTROLLER: &str = "podpath.dev/lb-sim";
/// The annotation that makes an IngressClass the default one.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

/// Whether the lab's L7 load balancer serves this Ingress: no class (the default) or the lab's.
pub fn is_lab_ingress(ing: &Ingress) -> bool {
    ing.spec.as_ref().and_then(|s| s.ingress_class_name.as_deref()).is_none_or(|c| c == LAB_CLASS)
}
