//! The endpoints controller: a Service's Endpoints and EndpointSlices from the pods its
//! selector matches, as kube-controller-manager writes them. The decision is pure
//! ([`plan_endpoints`]: a Service and its pods in, the objects to write out); `sync_endpoints`
//! reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use api::alloc::IpFamily;
use api::k8s_openapi::api::core::v1::{Pod, Service};
use api::kinds::pod::pod_is_ready;
use api::selector::{FieldSelector, LabelSelector};
use api::Codec;
use api::Kind;
use serde_json::{json, Value};

use super::write::{delete_quietly_unsynced, upsert_unsynced, Unsynced};
use crate::error::ApiError;
use crate::registry::{labels_of, Registry};

pub(crate) const MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
pub(crate) const SLICE_CONTROLLER: &str = "endpointslice-controller.k8s.io";
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A resolved port of a Service for one pod: (service port name, target port, protocol).
type PortKey = Vec<(String, i32, String)>;

/// Resolves the Service's target ports against a pod's container ports (named targetPorts).
fn resolve_ports(svc: &Service, pod: &Pod) -> PortKey {
    use api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let spec = svc.spec.clone().unwrap_or_default();
    let containers = pod.spec.as_ref().map(|s| s.containers.clone()).unwrap_or_default();
    let mut out = Vec::new();
    for p in spec.ports.iter().flatten() {
        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
        let target = match &p.target_port {
            Some(IntOrString::Int(n)) => Some(*n),
            None => Some(p.port),
            Some(IntOrString::String(name)) => containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|cp| {
                    cp.name.as_deref() == Some(name.as_str())
                        && cp.protocol.clone().unwrap_or_else(|| "TCP".into()) == proto
                })
                .map(|cp| cp.container_port),
        };
        if let Some(t) = target {
            out.push((p.name.clone().unwrap_or_default(), t, proto));
        }
    }
    out
}

/// What becomes of a Service's Endpoints object.
#[derive(Debug, Clone, PartialEq)]
pub enum EndpointsWrite {
    /// Written as given.
    Upsert(Value),
    /// Deleted: the Service is gone.
    Delete,
    /// Left alone: a Service without a selector, whose endpoints someone else writes.
    Leave,
}

/// The endpoints controller's decision for one Service: its Endpoints, and every EndpointSlice
/// it should have (the controller's slices not among them are deleted).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointsPlan {
    pub endpoints: EndpointsWrite,
    pub slices: Vec<Value>,
}

/// The Endpoints and EndpointSlices of Service `ns/name` (`svc`, None when it is gone) with the
/// pods its selector matches. Pure.
pub fn plan_endpoints(ns: &str, name: &str, svc: Option<&Service>, pods: &[Pod]) -> EndpointsPlan {
    let selector = svc.and_then(|s| s.spec.as_ref()).and_then(|s| s.selector.as_ref()).filter(|s| !s.is_empty());
    let (Some(svc), Some(_)) = (svc, selector) else {
        // No Service, or one without a selector: nothing of ours may remain.
        let endpoints = if svc.is_none() { EndpointsWrite::Delete } else { EndpointsWrite::Leave };
        return EndpointsPlan { endpoints, slices: vec![] };
    };
    let publish_not_ready = svc.spec.as_ref().and_then(|s| s.publish_not_ready_addresses).unwrap_or(false);
    let mut groups: BTreeMap<PortKey, Vec<Pod>> = BTreeMap::new();
    for pod in pods.iter().cloned() {
        let status = pod.status.clone().unwrap_or_default();
        let phase = status.phase.as_deref().unwrap_or("");
        if status.pod_ip.as_deref().unwrap_or("").is_empty() || phase == "Succeeded" || phase == "Failed" {
            continue;
        }
        groups.entry(resolve_ports(svc, &pod)).or_default().push(pod);
    }
    for pods in groups.values_mut() {
        pods.sort_by_key(|p| p.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default());
    }
    let svc_labels = svc.metadata.labels.clone().unwrap_or_default();
    let owner = json!([{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc.metadata.uid, "controller": true, "blockOwnerDeletion": true}]);
    let target_ref = |p: &Pod| json!({"kind": "Pod", "namespace": ns, "name": p.metadata.name, "uid": p.metadata.uid});
    let node_of = |p: &Pod| p.spec.as_ref().and_then(|s| s.node_name.clone());
    // The Service's families: its slices are per family (`addressType`), its Endpoints of
    // the primary one, as kube-controller-manager writes them.
    let families: Vec<IpFamily> = {
        let f: Vec<IpFamily> = svc
            .spec
            .as_ref()
            .and_then(|s| s.ip_families.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|f| IpFamily::parse(f))
            .collect();
        if f.is_empty() {
            vec![IpFamily::V4]
        } else {
            f
        }
    };
    let pod_ip_of = |p: &Pod, family: IpFamily| -> Option<String> {
        let status = p.status.as_ref()?;
        let listed = status.pod_ips.iter().flatten().map(|i| i.ip.clone());
        listed.chain(status.pod_ip.clone()).find(|ip| IpFamily::of_str(ip) == Some(family))
    };
    let primary = families[0];
    // kube-controller-manager names an endpoint by its pod's hostname only when the pod's
    // subdomain is this Service (a StatefulSet's governing Service): that is what DNS serves
    // as <hostname>.<service>.<ns>.svc.
    let hostname_of = |p: &Pod| {
        let spec = p.spec.as_ref()?;
        let h = spec.hostname.as_deref().filter(|h| !h.is_empty())?;
        (spec.subdomain.as_deref() == Some(name)).then(|| h.to_string())
    };

    // v1 Endpoints: ready pods in addresses, unready in notReadyAddresses, terminating left out.
    let mut subsets = Vec::new();
    for (ports, pods) in &groups {
        let mut ready = Vec::new();
        let mut not_ready = Vec::new();
        for p in pods.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
            let Some(ip) = pod_ip_of(p, primary) else { continue };
            let mut addr = json!({"ip": ip, "targetRef": target_ref(p)});
            if let Some(n) = node_of(p) {
                addr["nodeName"] = json!(n);
            }
            if let Some(h) = hostname_of(p) {
                addr["hostname"] = json!(h);
            }
            if pod_is_ready(p) || publish_not_ready {
                ready.push(addr);
            } else {
                not_ready.push(addr);
            }
        }
        if ready.is_empty() && not_ready.is_empty() {
            continue;
        }
        let mut subset = json!({
            "ports": ports.iter().map(|(n, port, proto)| {
                let mut p = json!({"port": port, "protocol": proto});
                if !n.is_empty() { p["name"] = json!(n); }
                p
            }).collect::<Vec<_>>()
        });
        if !ready.is_empty() {
            subset["addresses"] = json!(ready);
        }
        if !not_ready.is_empty() {
            subset["notReadyAddresses"] = json!(not_ready);
        }
        subsets.push(subset);
    }
    let mut endpoints = json!({"metadata": {"name": name, "namespace": ns, "labels": svc_labels}});
    if !subsets.is_empty() {
        endpoints["subsets"] = json!(subsets);
    }

    // EndpointSlices: one per distinct port mapping, every pod with its conditions.
    let mut slice_labels = svc_labels.clone();
    slice_labels.insert(SERVICE_NAME_LABEL.into(), name.into());
    slice_labels.insert(MANAGED_BY.into(), SLICE_CONTROLLER.into());
    let mut slices = Vec::new();
    let placeholder = groups.is_empty();
    let groups: Vec<(PortKey, Vec<Pod>)> =
        if placeholder { vec![(Vec::new(), Vec::new())] } else { groups.into_iter().collect() };
    for family in families {
        for (ports, pods) in &groups {
            let slice_name = slice_name(name, ports, family);
            let eps: Vec<Value> = pods
                .iter()
                .filter_map(|p| {
                    let ip = pod_ip_of(p, family)?;
                    let terminating = p.metadata.deletion_timestamp.is_some();
                    let ready = pod_is_ready(p);
                    let mut e = json!({
                        "addresses": [ip],
                        "conditions": {"ready": ready && !terminating, "serving": ready, "terminating": terminating},
                        "targetRef": target_ref(p),
                    });
                    if let Some(n) = node_of(p) {
                        e["nodeName"] = json!(n);
                    }
                    if let Some(h) = hostname_of(p) {
                        e["hostname"] = json!(h);
                    }
                    Some(e)
                })
                .collect();
            let mut slice = json!({
                "metadata": {"name": slice_name, "namespace": ns, "labels": slice_labels, "ownerReferences": owner},
                "addressType": family.as_str(),
                "endpoints": eps,
            });
            if !placeholder {
                slice["ports"] = json!(ports
                    .iter()
                    .map(|(n, port, proto)| json!({"name": n, "port": port, "protocol": proto}))
                    .collect::<Vec<_>>());
            }
            slices.push(slice);
        }
    }
    EndpointsPlan { endpoints: EndpointsWrite::Upsert(endpoints), slices }
}

/// Recomputes and writes the Endpoints and EndpointSlices of one Service; `unsynced` is left
/// to wait for their durability.
pub(crate) async fn sync_endpoints(
    reg: &Registry,
    ns: &str,
    name: &str,
    unsynced: &mut Unsynced,
) -> Result<(), ApiError> {
    let svc: Option<Service> = reg.store.get(Kind::Service, ns, name)?.map(Service::from_json).transpose()?;
    // Our slices are named `{service}-{hash}`: a key-range scan finds them without reading
    // every slice of the namespace (which made 10,000 Services quadratic).
    let slice_sel = LabelSelector::parse(&format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY}={SLICE_CONTROLLER}"))?;
    let existing_slices: Vec<Value> = reg
        .store
        .list_name_prefix(Kind::EndpointSlice, ns, &format!("{}-", slice_prefix(name)))?
        .into_iter()
        .filter(|s| slice_sel.matches(labels_of(s).as_ref()))
        .collect();
    let selector =
        svc.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.selector.clone()).filter(|s| !s.is_empty());
    let pods: Vec<Pod> = match (&svc, selector) {
        (Some(_), Some(selector)) => {
            let (pods, _) =
                reg.list(Kind::Pod, Some(ns), &LabelSelector::from_map(&selector), &FieldSelector::default())?;
            pods.into_iter().map(Pod::from_json).collect::<Result<_, _>>()?
        }
        _ => vec![],
    };
    let plan = plan_endpoints(ns, name, svc.as_ref(), &pods);
    // The slices first: they are what every node's proxy waits for (each is flushed as soon as
    // it is written); the Endpoints object is for older clients.
    let mut wanted = BTreeSet::new();
    for slice in plan.slices {
        let slice_name = slice["metadata"]["name"].as_str().unwrap_or("").to_string();
        let fields = ["endpoints", "ports", "addressType"];
        upsert_unsynced(reg, Kind::EndpointSlice, ns, &slice_name, slice, &fields, unsynced).await?;
        wanted.insert(slice_name);
    }
    for s in existing_slices {
        let n = s["metadata"]["name"].as_str().unwrap_or("");
        if !wanted.contains(n) {
            delete_quietly_unsynced(reg, Kind::EndpointSlice, ns, n, unsynced).await?;
        }
    }
    match plan.endpoints {
        EndpointsWrite::Upsert(endpoints) => {
            upsert_unsynced(reg, Kind::Endpoints, ns, name, endpoints, &["subsets"], unsynced).await?
        }
        EndpointsWrite::Delete => delete_quietly_unsynced(reg, Kind::Endpoints, ns, name, unsynced).await?,
        EndpointsWrite::Leave => {}
    }
    tracing::debug!(service = %format!("{ns}/{name}"), "endpoints synced");
    Ok(())
}

/// A stable slice name: the Service name and a short hash of its port mapping (and of its
/// family, for IPv6 slices).
fn slice_name(svc: &str, ports: &PortKey, family: IpFamily) -> String {
    let mut h: u32 = 2166136261;
    let tag = (family == IpFamily::V6).then(|| ("IPv6".to_string(), 0, String::new()));
    for (n, p, proto) in ports.iter().chain(tag.as_ref()) {
        for b in format!("{n}/{p}/{proto};").bytes() {
            h = (h ^ b as u32).wrapping_mul(16777619);
        }
    }
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5).map(|i| ALPHABET[((h >> (i * 5)) % ALPHABET.len() as u32) as usize] as char).collect();
    format!("{}-{suffix}", slice_prefix(svc))
}

/// The part of a slice name before its hash suffix.
fn slice_prefix(svc: &str) -> String {
    svc.chars().take(63 - 6).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(selector: Value) -> Service {
        serde_json::from_value(json!({"metadata": {"namespace": "default", "name": "web", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"selector": selector, "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]}}))
        .unwrap()
    }

    fn pod(name: &str, ip: &str, ready: bool, terminating: bool) -> Pod {
        let mut p = json!({"metadata": {"namespace": "default", "name": name, "uid": name},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i",
                "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]}]},
            "status": {"phase": "Running", "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}});
        if terminating {
            p["metadata"]["deletionTimestamp"] = json!("2026-11-24T00:00:00Z");
        }
        serde_json::from_value(p).unwrap()
    }

    #[test]
    fn a_pods_hostname_names_its_endpoint_only_under_its_subdomain_service() {
        let mut mine = pod("db-0", "10.244.1.2", true, false);
        let spec = mine.spec.as_mut().unwrap();
        spec.hostname = Some("db-0".into());
        spec.subdomain = Some("web".into());
        let mut other = pod("db-1", "10.244.1.3", true, false);
        let spec = other.spec.as_mut().unwrap();
        spec.hostname = Some("db-1".into());
        spec.subdomain = Some("elsewhere".into());
        let plan = plan_endpoints("default", "web", Some(&service(json!({"app": "web"}))), &[mine, other]);
        let eps = &plan.slices[0]["endpoints"];
        assert_eq!(eps[0]["hostname"], "db-0");
        assert!(eps[1].get("hostname").is_none(), "{eps}");
        let EndpointsWrite::Upsert(ep) = &plan.endpoints else { panic!("{:?}", plan.endpoints) };
        assert_eq!(ep["subsets"][0]["addresses"][0]["hostname"], "db-0");
        assert!(ep["subsets"][0]["addresses"][1].get("hostname").is_none());
    }

    #[test]
    fn ready_unready_and_terminating_pods_land_where_kube_controller_manager_puts_them() {
        let pods = [
            pod("a", "10.244.1.2", true, false),
            pod("b", "10.244.1.3", false, false),
            pod("c", "10.244.1.4", true, true),
            pod("pending", "", true, false),
        ];
        let plan = plan_endpoints("default", "web", Some(&service(json!({"app": "web"}))), &pods);
        let EndpointsWrite::Upsert(ep) = &plan.endpoints else { panic!("{:?}", plan.endpoints) };
        let subset = &ep["subsets"][0];
        assert_eq!(
            subset["ports"],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
            "named targetPort resolved"
        );
        assert_eq!(subset["addresses"][0]["ip"], "10.244.1.2");
        assert_eq!(subset["notReadyAddresses"][0]["ip"], "10.244.1.3");
        assert_eq!(
            subset["addresses"].as_array().unwrap().len() + subset["notReadyAddresses"].as_array().unwrap().len(),
            2,
            "terminating and IP-less pods are left out"
        );
        assert_eq!(plan.slices.len(), 1);
        let slice = &plan.slices[0];
        assert_eq!(slice["metadata"]["labels"][SERVICE_NAME_LABEL], "web");
        assert_eq!(slice["metadata"]["labels"][MANAGED_BY], SLICE_CONTROLLER);
        let conditions: Vec<&Value> = slice["endpoints"].as_array().unwrap().iter().map(|e| &e["conditions"]).collect();
        assert_eq!(
            conditions,
            [
                &json!({"ready": true, "serving": true, "terminating": false}),
                &json!({"ready": false, "serving": false, "terminating": false}),
                &json!({"ready": false, "serving": true, "terminating": true}),
            ]
        );
    }

    #[test]
    fn no_pods_leave_a_placeholder_slice_and_no_selector_or_no_service_writes_none() {
        let empty = plan_endpoints("default", "web", Some(&service(json!({"app": "web"}))), &[]);
        assert_eq!(empty.slices.len(), 1);
        assert!(empty.slices[0].get("ports").is_none() && empty.slices[0]["endpoints"] == json!([]));
        let EndpointsWrite::Upsert(ep) = &empty.endpoints else { panic!() };
        assert!(ep.get("subsets").is_none());
        let manual = plan_endpoints("default", "web", Some(&service(json!({}))), &[]);
        assert_eq!(manual, EndpointsPlan { endpoints: EndpointsWrite::Leave, slices: vec![] });
        let gone = plan_endpoints("default", "web", None, &[]);
        assert_eq!(gone, EndpointsPlan { endpoints: EndpointsWrite::Delete, slices: vec![] });
    }
}
