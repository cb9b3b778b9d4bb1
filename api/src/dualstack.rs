//! Dual-stack Services (pure): how `clusterIP`, `clusterIPs`, `ipFamilies` and
//! `ipFamilyPolicy` are kept in step, defaulted from the cluster's ranges and checked, in the
//! order and with the words of kube-apiserver's Service storage (`normalizeClusterIPs`,
//! `patchAllocatedValues`, `initIPFamilyFields`, `ValidateServiceClusterIPsRelatedFields`,
//! and the upgrade/downgrade checks of `ValidateServiceUpdate`).

use k8s_openapi::api::core::v1::ServiceSpec;

use crate::alloc::{IpFamily, Ranges};
use crate::validation::{self as v, Cause, FieldPath, ShowValue};

pub const SINGLE_STACK: &str = "SingleStack";
pub const PREFER_DUAL_STACK: &str = "PreferDualStack";
pub const REQUIRE_DUAL_STACK: &str = "RequireDualStack";
pub const POLICIES: [&str; 3] = [PREFER_DUAL_STACK, REQUIRE_DUAL_STACK, SINGLE_STACK];
const FAMILIES: [&str; 2] = ["IPv4", "IPv6"];

/// A Go slice of a named string type as field errors print it (`[]core.IPFamily{"IPv4"}`).
pub struct GoSlice<'a>(pub &'static str, pub &'a [String]);

impl ShowValue for GoSlice<'_> {
    fn show(&self) -> String {
        let items: Vec<String> = self.1.iter().map(|s| format!("{s:?}")).collect();
        format!("[]{}{{{}}}", self.0, items.join(", "))
    }
}

fn families_value(f: &[String]) -> GoSlice<'_> {
    GoSlice("core.IPFamily", f)
}

/// A nil pointer prints as `null` in a field error.
fn policy_value(p: &Option<String>) -> String {
    match p {
        Some(p) => format!("{p:?}"),
        None => "null".into(),
    }
}

struct Raw(String);
impl ShowValue for Raw {
    fn show(&self) -> String {
        self.0.clone()
    }
}

fn policy_invalid(policy: &Option<String>, detail: &str) -> Cause {
    v::invalid(&FieldPath::root("spec").child("ipFamilyPolicy"), &Raw(policy_value(policy)), detail)
}

fn ips(spec: &ServiceSpec) -> &[String] {
    spec.cluster_ips.as_deref().unwrap_or_default()
}

fn fams(spec: &ServiceSpec) -> &[String] {
    spec.ip_families.as_deref().unwrap_or_default()
}

fn cluster_ip(spec: &ServiceSpec) -> &str {
    spec.cluster_ip.as_deref().unwrap_or_default()
}

fn is_external_name(spec: &ServiceSpec) -> bool {
    spec.type_.as_deref() == Some("ExternalName")
}

/// `clusterIPs == ["None"]`.
pub fn is_headless(spec: &ServiceSpec) -> bool {
    ips(spec) == ["None"]
}

fn has_selector(spec: &ServiceSpec) -> bool {
    spec.selector.as_ref().is_some_and(|s| !s.is_empty())
}

fn is_v6(ip: &str) -> bool {
    IpFamily::of_str(ip) == Some(IpFamily::V6)
}

/// What a client meant by `clusterIP` and `clusterIPs` when it set one of them
/// (`normalizeClusterIPs`): old clients know only the singular field.
pub fn normalize_cluster_ips(new: &mut ServiceSpec, old: Option<&ServiceSpec>) {
    let Some(old) = old else {
        if !cluster_ip(new).is_empty() && ips(new).is_empty() {
            new.cluster_ips = Some(vec![cluster_ip(new).to_string()]);
        }
        return;
    };
    // An old client patched something else and left the plural field out.
    if !ips(old).is_empty() && ips(new).is_empty() && cluster_ip(old) == cluster_ip(new) {
        new.cluster_ips = old.cluster_ips.clone();
    }
    if cluster_ip(old) != cluster_ip(new) {
        let same = ips(old) == ips(new);
        if !cluster_ip(old).is_empty() && cluster_ip(new).is_empty() {
            if same {
                new.cluster_ips = None;
            }
        } else if same {
            new.cluster_ips = Some(vec![cluster_ip(new).to_string()]);
        }
    }
}

/// Keeps the addresses an update leaves out (`patchAllocatedValues`): a PUT of a manifest
/// without `clusterIP` keeps the Service's address.
pub fn patch_allocated(new: &mut ServiceSpec, old: &ServiceSpec) {
    if is_external_name(old) || is_external_name(new) {
        return;
    }
    if cluster_ip(new).is_empty() {
        new.cluster_ip = old.cluster_ip.clone();
    }
    if ips(new).is_empty() && !ips(old).is_empty() {
        new.cluster_ips = old.cluster_ips.clone();
    }
}

/// `ValidateServiceClusterIPsRelatedFields`: the fields on their own, before any default.
pub fn related_fields(spec: &ServiceSpec) -> Vec<Cause> {
    let mut out = Vec::new();
    if is_external_name(spec) {
        return out;
    }
    let spec_path = FieldPath::root("spec");
    let ips_path = spec_path.child("clusterIPs");
    let fams_path = spec_path.child("ipFamilies");
    let ips = ips(spec);
    if !cluster_ip(spec).is_empty() {
        if ips.is_empty() {
            out.push(v::required(&ips_path, ""));
        } else if ips[0] != cluster_ip(spec) {
            out.push(v::invalid(&ips_path, ips, "first value must match `clusterIP`"));
        }
    } else if !ips.is_empty() {
        out.push(v::invalid(&ips_path, ips, "must be empty when `clusterIP` is not specified"));
    }
    let mut seen = Vec::new();
    for (i, fam) in fams(spec).iter().enumerate() {
        if !FAMILIES.contains(&fam.as_str()) {
            out.push(v::not_supported(&fams_path.index(i), fam.as_str(), &FAMILIES));
        }
        if seen.contains(&fam) {
            out.push(v::duplicate(&fams_path.index(i), fam.as_str()));
        }
        seen.push(fam);
    }
    if let Some(p) = spec.ip_family_policy.as_deref() {
        if !POLICIES.contains(&p) {
            out.push(v::not_supported(&spec_path.child("ipFamilyPolicy"), p, &POLICIES));
        }
    }
    let mut bad_ips = false;
    for (i, ip) in ips.iter().enumerate() {
        if i == 0 && ip == "None" {
            if ips.len() > 1 {
                bad_ips = true;
                out.push(v::invalid(&ips_path, ips, "'None' must be the first and only value"));
            }
            continue;
        }
        if v::valid_ip(ip).is_none() {
            bad_ips = true;
            out.push(v::invalid(&ips_path.index(i), ip.as_str(), v::IP_MSG));
        }
    }
    if ips.len() > 2 {
        out.push(v::invalid(&ips_path, ips, "may only hold up to 2 values"));
    }
    if bad_ips {
        return out;
    }
    if ips.len() > 1 && is_v6(&ips[0]) == is_v6(&ips[1]) {
        out.push(v::invalid(&ips_path, ips, "may specify no more than one IP for each IP family"));
    }
    if !is_headless(spec) {
        for (i, (ip, fam)) in ips.iter().zip(fams(spec)).enumerate() {
            if fam == "IPv4" && is_v6(ip) {
                out.push(v::invalid(
                    &ips_path.index(i),
                    ip.as_str(),
                    &format!("expected an IPv4 value as indicated by `ipFamilies[{i}]`"),
                ));
            }
            if fam == "IPv6" && !is_v6(ip) {
                out.push(v::invalid(
                    &ips_path.index(i),
                    ip.as_str(),
                    &format!("expected an IPv6 value as indicated by `ipFamilies[{i}]`"),
                ));
            }
        }
    }
    out
}

/// An update that leaves a PreferDualStack Service's addresses as they are: nothing to
/// default or allocate, whatever the cluster's families are now.
pub fn unchanged_prefer_dual_stack(new: &ServiceSpec, old: Option<&ServiceSpec>) -> bool {
    let Some(old) = old else { return false };
    let Some(policy) = new.ip_family_policy.as_deref() else { return false };
    let ty = new.type_.as_deref().unwrap_or("ClusterIP");
    old.type_.as_deref().unwrap_or("ClusterIP") == ty
        && ["ClusterIP", "NodePort", "LoadBalancer"].contains(&ty)
        && policy == PREFER_DUAL_STACK
        && old.ip_family_policy.as_deref().is_none_or(|p| p == PREFER_DUAL_STACK)
        && ips(old) == ips(new)
        && fams(old) == fams(new)
}

/// `initIPFamilyFields`: defaults `ipFamilyPolicy` and `ipFamilies` from the cluster's
/// Service ranges and the user's input, and refuses what the cluster cannot give.
pub fn init_families(spec: &mut ServiceSpec, old: Option<&ServiceSpec>, ranges: &Ranges) -> Result<(), Vec<Cause>> {
    if is_external_name(spec) || unchanged_prefer_dual_stack(spec, old) {
        return Ok(());
    }
    let headless_selectorless = cluster_ip(spec) == "None" && !has_selector(spec);
    if spec.ip_family_policy.is_none() {
        spec.ip_family_policy = Some(match old.and_then(|o| o.ip_family_policy.clone()) {
            Some(p) => p,
            None if headless_selectorless => REQUIRE_DUAL_STACK.into(),
            None => SINGLE_STACK.into(),
        });
    }
    let loose = related_fields(spec);
    if !loose.is_empty() {
        return Err(loose);
    }
    let mut el = Vec::new();
    let single = spec.ip_family_policy.as_deref() == Some(SINGLE_STACK);
    if let Some(old) = old {
        if single {
            // Setting SingleStack with unchanged addresses is clear intent to release the second.
            if ips(old) == ips(spec) && ips(spec).len() > 1 {
                spec.cluster_ips.as_mut().expect("non-empty").truncate(1);
            }
            if fams(old) == fams(spec) && fams(spec).len() > 1 {
                spec.ip_families.as_mut().expect("non-empty").truncate(1);
            }
        } else {
            if !ips(spec).is_empty() && ips(spec).len() < ips(old).len() {
                el.push(policy_invalid(
                    &spec.ip_family_policy,
                    "must be 'SingleStack' to release the secondary cluster IP",
                ));
            }
            if !fams(spec).is_empty() && fams(spec).len() < fams(old).len() {
                el.push(policy_invalid(
                    &spec.ip_family_policy,
                    "must be 'SingleStack' to release the secondary IP family",
                ));
            }
        }
    }
    if single {
        if ips(spec).len() == 2 {
            el.push(policy_invalid(
                &spec.ip_family_policy,
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple cluster IPs are specified",
            ));
        }
        if fams(spec).len() == 2 {
            el.push(policy_invalid(
                &spec.ip_family_policy,
                "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified",
            ));
        }
    }
    // Families follow from addresses the user gave.
    let configured = ranges.service_families();
    let all_ips = ips(spec).to_vec();
    for (i, ip) in all_ips.iter().enumerate() {
        if ip == "None" {
            break;
        }
        let fam = IpFamily::of_str(ip).unwrap_or(IpFamily::V4);
        if i >= fams(spec).len() {
            if configured.contains(&fam) {
                spec.ip_families.get_or_insert_with(Vec::new).push(fam.as_str().into());
            } else {
                el.push(v::invalid(
                    &FieldPath::root("spec").child("clusterIPs").index(i),
                    all_ips.as_slice(),
                    &format!("{} is not configured on this cluster", fam.as_str()),
                ));
            }
        }
    }
    if !el.is_empty() {
        return Err(el);
    }
    let add_other = |spec: &mut ServiceSpec| {
        let first = IpFamily::parse(&fams(spec)[0]).unwrap_or(IpFamily::V4);
        spec.ip_families.get_or_insert_with(Vec::new).push(first.other().as_str().into());
    };
    if headless_selectorless {
        // The one case where a single-stack cluster gives two families.
        if fams(spec).is_empty() {
            spec.ip_families = Some(vec![ranges.primary_family().as_str().into()]);
        }
        if fams(spec).len() < 2 && spec.ip_family_policy.as_deref() != Some(SINGLE_STACK) {
            add_other(spec);
        }
        return Ok(());
    }
    if spec.ip_family_policy.as_deref() == Some(REQUIRE_DUAL_STACK) && configured.len() < 2 {
        el.push(policy_invalid(&spec.ip_family_policy, "this cluster is not configured for dual-stack services"));
    }
    for (i, fam) in fams(spec).iter().enumerate() {
        if IpFamily::parse(fam).is_none_or(|f| !configured.contains(&f)) {
            el.push(v::invalid(
                &FieldPath::root("spec").child("ipFamilies").index(i),
                fam.as_str(),
                "not configured on this cluster",
            ));
        }
    }
    if !el.is_empty() {
        return Err(el);
    }
    if fams(spec).is_empty() {
        spec.ip_families = Some(vec![ranges.primary_family().as_str().into()]);
    }
    if spec.ip_family_policy.as_deref() != Some(SINGLE_STACK) && fams(spec).len() == 1 && configured.len() == 2 {
        add_other(spec);
    }
    Ok(())
}

/// The upgrade and downgrade checks of `ValidateServiceUpdate`, on the defaulted fields.
pub fn validate_upgrade_downgrade(new: &ServiceSpec, old: &ServiceSpec) -> Vec<Cause> {
    let mut out = Vec::new();
    if is_external_name(new) || is_external_name(old) {
        return out;
    }
    let spec_path = FieldPath::root("spec");
    let ips_path = spec_path.child("clusterIPs");
    let fams_path = spec_path.child("ipFamilies");
    let (new_headless, old_headless) = (is_headless(new), is_headless(old));
    let (nips, oips) = (ips(new), ips(old));
    if !(old_headless && new_headless) {
        if oips.len() == nips.len() {
            for (i, ip) in oips.iter().enumerate() {
                if *ip != nips[i] {
                    out.push(v::invalid(&ips_path.index(i), nips, "may not change once set"));
                }
            }
        } else if oips.len() > nips.len() {
            if nips.is_empty() {
                out.push(v::invalid(&ips_path.index(0), nips, "primary clusterIP can not be unset"));
            }
            if !oips.is_empty() && !nips.is_empty() && nips[0] != oips[0] {
                out.push(v::invalid(&ips_path.index(0), nips, "may not change once set"));
            }
            if nips.len() == 1 && new.ip_family_policy.as_deref() != Some(SINGLE_STACK) {
                out.push(policy_invalid(
                    &new.ip_family_policy,
                    "must be set to 'SingleStack' when releasing the secondary clusterIP",
                ));
            }
        } else if !oips.is_empty() && nips[0] != oips[0] {
            out.push(v::invalid(&ips_path.index(0), nips, "may not change once set"));
        }
    }
    if new_headless != old_headless || new_headless {
        return out;
    }
    let (nf, of) = (fams(new), fams(old));
    if of.len() == nf.len() {
        for (i, fam) in of.iter().enumerate() {
            if *fam != nf[i] {
                // kube-apiserver names index 0 whichever entry differs.
                out.push(v::invalid(&fams_path.index(0), &families_value(nf), "may not change once set"));
            }
        }
    } else if of.len() > nf.len() {
        if nips.is_empty() {
            out.push(v::invalid(&fams_path.index(0), &families_value(nf), "primary ipFamily can not be unset"));
        }
        if !nf.is_empty() && nf[0] != of[0] {
            out.push(v::invalid(&fams_path.index(0), nips, "may not change once set"));
        }
        if nf.len() == 1 && new.ip_family_policy.as_deref() != Some(SINGLE_STACK) {
            out.push(policy_invalid(
                &new.ip_family_policy,
                "must be set to 'SingleStack' when releasing the secondary ipFamily",
            ));
        }
    } else if !of.is_empty() && !nf.is_empty() && nf[0] != of[0] {
        out.push(v::invalid(&fams_path.index(0), nips, "may not change once set"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dual() -> Ranges {
        Ranges {
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap(), "fd00:10:96::/112".parse().unwrap()],
            ..Ranges::default()
        }
    }

    fn spec(v: serde_json::Value) -> ServiceSpec {
        serde_json::from_value(v).unwrap()
    }

    fn texts(c: Vec<Cause>) -> Vec<String> {
        c.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn defaults_follow_the_cluster_and_the_policy() {
        let single = Ranges::default();
        let mut s = spec(serde_json::json!({"selector": {"a": "b"}}));
        init_families(&mut s, None, &single).unwrap();
        assert_eq!((s.ip_family_policy.as_deref(), fams(&s)), (Some("SingleStack"), &["IPv4".to_string()][..]));

        let mut s = spec(serde_json::json!({"ipFamilyPolicy": "PreferDualStack"}));
        init_families(&mut s, None, &single).unwrap();
        assert_eq!(fams(&s), ["IPv4"]);
        let mut s = spec(serde_json::json!({"ipFamilyPolicy": "PreferDualStack"}));
        init_families(&mut s, None, &dual()).unwrap();
        assert_eq!(fams(&s), ["IPv4", "IPv6"]);
        let mut s = spec(serde_json::json!({"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6"]}));
        init_families(&mut s, None, &dual()).unwrap();
        assert_eq!(fams(&s), ["IPv6", "IPv4"]);

        // Headless without a selector is dual even on a single-stack cluster.
        let mut s = spec(serde_json::json!({"clusterIP": "None", "clusterIPs": ["None"]}));
        init_families(&mut s, None, &single).unwrap();
        assert_eq!(
            (s.ip_family_policy.as_deref(), fams(&s)),
            (Some("RequireDualStack"), &["IPv4".into(), "IPv6".into()][..])
        );

        // A family inferred from the address asked for.
        let mut s = spec(serde_json::json!({"clusterIP": "fd00:10:96::5", "clusterIPs": ["fd00:10:96::5"]}));
        init_families(&mut s, None, &dual()).unwrap();
        assert_eq!(fams(&s), ["IPv6"]);
    }

    #[test]
    fn refusals_are_worded_as_kube_apiserver_words_them() {
        let single = Ranges::default();
        let mut s = spec(serde_json::json!({"ipFamilyPolicy": "RequireDualStack"}));
        assert_eq!(
            texts(init_families(&mut s, None, &single).unwrap_err()),
            ["spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services"]
        );
        let mut s = spec(serde_json::json!({"clusterIP": "fd00:10:96::5", "clusterIPs": ["fd00:10:96::5"]}));
        assert_eq!(
            texts(init_families(&mut s, None, &single).unwrap_err()),
            ["spec.clusterIPs[0]: Invalid value: []string{\"fd00:10:96::5\"}: IPv6 is not configured on this cluster"]
        );
        let mut s = spec(serde_json::json!({"ipFamilies": ["IPv6"]}));
        assert_eq!(
            texts(init_families(&mut s, None, &single).unwrap_err()),
            ["spec.ipFamilies[0]: Invalid value: \"IPv6\": not configured on this cluster"]
        );
        let mut s = spec(serde_json::json!({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"]}));
        assert_eq!(
            texts(init_families(&mut s, None, &dual()).unwrap_err()),
            ["spec.ipFamilyPolicy: Invalid value: \"SingleStack\": must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified"]
        );
        let s = spec(serde_json::json!({"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "10.96.0.6"]}));
        assert_eq!(
            texts(related_fields(&s)),
            ["spec.clusterIPs: Invalid value: []string{\"10.96.0.5\", \"10.96.0.6\"}: may specify no more than one IP for each IP family"]
        );
        let s =
            spec(serde_json::json!({"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"], "ipFamilies": ["IPv6"]}));
        assert_eq!(
            texts(related_fields(&s)),
            ["spec.clusterIPs[0]: Invalid value: \"10.96.0.5\": expected an IPv6 value as indicated by `ipFamilies[0]`"]
        );
    }

    #[test]
    fn updates_keep_order_and_release_only_when_single_stack_is_asked() {
        let old = spec(serde_json::json!({
            "clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5", "fd00:10:96::5"],
            "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "RequireDualStack"}));
        let mut new = old.clone();
        new.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        new.cluster_ips = None;
        new.cluster_ip = None;
        patch_allocated(&mut new, &old);
        normalize_cluster_ips(&mut new, Some(&old));
        assert_eq!(
            texts(init_families(&mut new, Some(&old), &dual()).unwrap_err()),
            [
                "spec.clusterIPs[0]: Invalid value: \"10.96.0.5\": expected an IPv6 value as indicated by `ipFamilies[0]`",
                "spec.clusterIPs[1]: Invalid value: \"fd00:10:96::5\": expected an IPv4 value as indicated by `ipFamilies[1]`",
            ]
        );
        let mut new = old.clone();
        new.ip_family_policy = Some("SingleStack".into());
        init_families(&mut new, Some(&old), &dual()).unwrap();
        assert_eq!((ips(&new), fams(&new)), (&["10.96.0.5".to_string()][..], &["IPv4".to_string()][..]));
        assert!(validate_upgrade_downgrade(&new, &old).is_empty());

        let mut new = old.clone();
        new.ip_families = Some(vec!["IPv4".into()]);
        assert_eq!(
            texts(init_families(&mut new, Some(&old), &dual()).unwrap_err()),
            ["spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": must be 'SingleStack' to release the secondary IP family"]
        );
        let mut same_len = old.clone();
        same_len.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
        assert_eq!(
            texts(validate_upgrade_downgrade(&same_len, &old)),
            [
                "spec.ipFamilies[0]: Invalid value: []core.IPFamily{\"IPv6\", \"IPv4\"}: may not change once set",
                "spec.ipFamilies[0]: Invalid value: []core.IPFamily{\"IPv6\", \"IPv4\"}: may not change once set",
            ]
        );
    }
}
