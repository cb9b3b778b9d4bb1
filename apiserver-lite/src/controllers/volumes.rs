//! The volume controller, as kube-controller-manager's PersistentVolume controller and the
//! lab's provisioner (`podpath.dev/local-path`, kind's local-path-provisioner role) together:
//!
//! - a claim binds to the smallest Available volume that fits it (class, volume mode, access
//!   modes, capacity, selector, and for `WaitForFirstConsumer` the node the scheduler chose), or
//!   to the volume it names; both sides are written as the real controller writes them
//!   (`claimRef`, `volumeName`, the `bind-completed`/`bound-by-controller` annotations, phases);
//! - a claim without a volume whose class has the lab's provisioner gets one made for it —
//!   `pvc-<claim uid>`, a directory under the chosen node's local-path root (the node publishes
//!   it in [`LOCAL_PATH_ROOT_ANNOTATION`]), pinned to the node by node affinity — once the
//!   scheduler picked the node (`volume.kubernetes.io/selected-node`); other provisioners'
//!   claims are annotated and left to them (`ExternalProvisioning`);
//! - a volume whose claim is gone is `Released`; `Retain` keeps it so, `Delete` on a
//!   local-path volume is finished by the kubelet of its node (it deletes the directory, then
//!   the volume); a claim whose volume is gone is `Lost`;
//! - the protection finalizers go once nothing uses the object: a claim's when no pod that
//!   names it is left, a volume's when no claim is bound to it.
//!
//! [`plan_volumes`] decides (pure); [`sync`] reads and writes.

use std::collections::{BTreeMap, BTreeSet};

use api::k8s_openapi::api::core::v1::Node;
use api::k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use api::kinds::persistentvolume::{PROTECTION_FINALIZER as PV_PROTECTION, PROVISIONED_BY_ANNOTATION};
use api::kinds::persistentvolumeclaim::{
    PROTECTION_FINALIZER as PVC_PROTECTION, PROVISIONER_ANNOTATION, SELECTED_NODE_ANNOTATION,
};
use api::kinds::storageclass::{DEFAULT_CLASS_ANNOTATION, LAB_PROVISIONER};
use api::Codec;
use api::Kind;
use serde_json::{json, Value};

use super::events::{record, EventType, Report};
use super::scheduler::node_terms_match;
use super::write::{is_terminating, ns_name};
use crate::error::ApiError;
use crate::registry::{Registry, Subresource, WriteOptions};

/// On a node: the directory its kubelet keeps local-path volumes under.
pub const LOCAL_PATH_ROOT_ANNOTATION: &str = "podpath.dev/local-path-root";
const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
const BETA_PROVISIONER_ANNOTATION: &str = "volume.beta.kubernetes.io/storage-provisioner";
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// One write or Event the controller wants.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Create(Kind, Value),
    /// The object's metadata and spec as given (the status is left alone).
    Update(Kind, Value),
    /// The object's status as given.
    UpdateStatus(Kind, Value),
    /// An Event about a claim; `once`: said only the first time for this claim.
    Event {
        claim: Value,
        type_: EventType,
        reason: &'static str,
        message: String,
        component: &'static str,
        once: bool,
    },
}

/// What the controller reads.
#[derive(Debug, Default)]
pub struct World<'a> {
    pub classes: &'a [Value],
    pub volumes: &'a [Value],
    pub claims: &'a [Value],
    pub pods: &'a [Value],
    pub nodes: &'a [Node],
}

fn annotation<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj["metadata"]["annotations"].get(key).and_then(Value::as_str)
}

fn phase(obj: &Value) -> &str {
    obj["status"]["phase"].as_str().unwrap_or("")
}

fn quantity(v: &Value) -> i128 {
    v.as_str().and_then(api::quantity::milli).unwrap_or(0)
}

fn request(claim: &Value) -> i128 {
    quantity(&claim["spec"]["resources"]["requests"]["storage"])
}

fn class_of(obj: &Value) -> &str {
    obj["spec"]["storageClassName"].as_str().unwrap_or("")
}

fn volume_mode(obj: &Value) -> &str {
    obj["spec"]["volumeMode"].as_str().unwrap_or("Filesystem")
}

fn strings(v: &Value) -> BTreeSet<&str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).collect()
}

fn without_finalizer(obj: &Value, finalizer: &str) -> Value {
    let mut new = obj.clone();
    let kept: Vec<Value> =
        obj["metadata"]["finalizers"].as_array().into_iter().flatten().filter(|f| *f != finalizer).cloned().collect();
    new["metadata"]["finalizers"] = Value::Array(kept);
    new
}

fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    obj["metadata"]["finalizers"].as_array().is_some_and(|l| l.iter().any(|f| f == finalizer))
}

/// Whether the volume's `claimRef` names `claim` (the same object when the ref has a uid).
fn refers_to(volume: &Value, claim: &Value) -> bool {
    let r = &volume["spec"]["claimRef"];
    let (ns, name) = ns_name(claim);
    r["namespace"].as_str() == Some(ns.as_str())
        && r["name"].as_str() == Some(name.as_str())
        && r["uid"].as_str().is_none_or(|u| u.is_empty() || Some(u) == claim["metadata"]["uid"].as_str())
}

/// Whether an unbound volume can take the claim (the binder's matching).
fn fits(volume: &Value, claim: &Value, node: Option<&Node>) -> bool {
    let free = volume["spec"]["claimRef"].is_null() || refers_to(volume, claim);
    let claim_selector: Option<LabelSelector> = LabelSelector::from_json(claim["spec"]["selector"].clone()).ok();
    let labels: Option<BTreeMap<String, String>> = serde_json::from_value(volume["metadata"]["labels"].clone()).ok();
    free && !is_terminating(volume)
        && matches!(phase(volume), "Available" | "Pending" | "")
        && class_of(volume) == class_of(claim)
        && volume_mode(volume) == volume_mode(claim)
        && strings(&claim["spec"]["accessModes"]).is_subset(&strings(&volume["spec"]["accessModes"]))
        && quantity(&volume["spec"]["capacity"]["storage"]) >= request(claim)
        && claim_selector.is_none_or(|s| api::apps::selector_matches(&s, labels.as_ref()))
        && match (node, volume.pointer("/spec/nodeAffinity/required/nodeSelectorTerms")) {
            (Some(n), Some(terms)) => node_terms_match(terms, n),
            _ => true,
        }
}

/// The writes that bind `claim` and `volume` to each other, as the real controller writes them.
fn bind(claim: &Value, volume: &Value, out: &mut Vec<Action>) {
    let (ns, name) = ns_name(claim);
    let vol_name = ns_name(volume).1;
    if volume["spec"]["claimRef"]["uid"].as_str().is_none_or(|u| Some(u) != claim["metadata"]["uid"].as_str()) {
        let mut v = volume.clone();
        if v["spec"]["claimRef"].is_null() {
            v["metadata"]["annotations"][BOUND_BY_CONTROLLER] = json!("yes");
        }
        v["spec"]["claimRef"] = json!({
            "kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "apiVersion": "v1",
            "uid": claim["metadata"]["uid"], "resourceVersion": claim["metadata"]["resourceVersion"],
        });
        out.push(Action::Update(Kind::PersistentVolume, v));
    }
    if phase(volume) != "Bound" {
        out.push(Action::UpdateStatus(Kind::PersistentVolume, with_status(volume, json!({"phase": "Bound"}))));
    }
    if claim["spec"]["volumeName"].as_str() != Some(vol_name.as_str()) || annotation(claim, BIND_COMPLETED).is_none() {
        let mut c = claim.clone();
        if c["spec"]["volumeName"].as_str().is_none_or(str::is_empty) {
            c["metadata"]["annotations"][BOUND_BY_CONTROLLER] = json!("yes");
        }
        c["metadata"]["annotations"][BIND_COMPLETED] = json!("yes");
        c["spec"]["volumeName"] = json!(vol_name);
        out.push(Action::Update(Kind::PersistentVolumeClaim, c));
    }
    let status = json!({
        "phase": "Bound",
        "accessModes": volume["spec"]["accessModes"],
        "capacity": volume["spec"]["capacity"],
    });
    let mut current = claim["status"].clone();
    if let Some(o) = current.as_object_mut() {
        o.retain(|k, _| ["phase", "accessModes", "capacity"].contains(&k.as_str()));
    }
    if current != status {
        out.push(Action::UpdateStatus(Kind::PersistentVolumeClaim, with_status(claim, status)));
    }
}

fn with_status(obj: &Value, status: Value) -> Value {
    let mut new = obj.clone();
    new["status"] = status;
    new
}

/// The local-path volume made for `claim` on `node` under `root`, bound to the claim.
pub fn local_path_volume(claim: &Value, class: &Value, node: &str, root: &str) -> Value {
    let (ns, name) = ns_name(claim);
    let uid = claim["metadata"]["uid"].as_str().unwrap_or("");
    let path = format!("{}/pvc-{uid}_{ns}_{name}", root.trim_end_matches('/'));
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": format!("pvc-{uid}"), "annotations": {PROVISIONED_BY_ANNOTATION: LAB_PROVISIONER}},
        "spec": {
            "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
            "accessModes": claim["spec"]["accessModes"],
            "volumeMode": volume_mode(claim),
            "storageClassName": class["metadata"]["name"],
            "persistentVolumeReclaimPolicy": class["reclaimPolicy"].as_str().unwrap_or("Delete"),
            "hostPath": {"path": path, "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}]}]}},
            "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns, "name": name, "apiVersion": "v1",
                         "uid": uid, "resourceVersion": claim["metadata"]["resourceVersion"]},
        },
    })
}

/// Whether a pod that is not finished names the claim (it is in use until such a pod is gone).
fn in_use(claim: &Value, pods: &[Value]) -> bool {
    let (ns, name) = ns_name(claim);
    pods.iter().any(|p| {
        p["metadata"]["namespace"].as_str() == Some(ns.as_str())
            && !matches!(phase(p), "Succeeded" | "Failed")
            && p["spec"]["volumes"]
                .as_array()
                .is_some_and(|vs| vs.iter().any(|v| v["persistentVolumeClaim"]["claimName"].as_str() == Some(&name)))
    })
}

/// The default StorageClass (the newest of several).
pub(crate) fn default_class(classes: &[Value]) -> Option<&Value> {
    classes.iter().filter(|c| annotation(c, DEFAULT_CLASS_ANNOTATION) == Some("true")).max_by(|a, b| {
        let created = |c: &Value| c["metadata"]["creationTimestamp"].as_str().unwrap_or("").to_string();
        created(a).cmp(&created(b)).then_with(|| ns_name(b).1.cmp(&ns_name(a).1))
    })
}

/// What the volumes and claims need done. Pure.
pub fn plan_volumes(w: &World<'_>) -> Vec<Action> {
    let mut out = Vec::new();
    let volumes: BTreeMap<String, &Value> = w.volumes.iter().map(|v| (ns_name(v).1, v)).collect();
    let claims: BTreeMap<(String, String), &Value> = w.claims.iter().map(|c| (ns_name(c), c)).collect();
    let classes: BTreeMap<&str, &Value> =
        w.classes.iter().filter_map(|c| Some((c["metadata"]["name"].as_str()?, c))).collect();
    let nodes: BTreeMap<&str, &Node> = w.nodes.iter().filter_map(|n| Some((n.metadata.name.as_deref()?, n))).collect();
    let mut taken: BTreeSet<String> = BTreeSet::new();

    for v in w.volumes {
        let name = ns_name(v).1;
        let r = &v["spec"]["claimRef"];
        let claim = r["name"]
            .as_str()
            .and_then(|n| claims.get(&(r["namespace"].as_str().unwrap_or("").to_string(), n.to_string())).copied());
        let bound_claim = claim.filter(|c| refers_to(v, c));
        if is_terminating(v) && has_finalizer(v, PV_PROTECTION) {
            let held = bound_claim.is_some_and(|c| c["spec"]["volumeName"].as_str() == Some(name.as_str()));
            if !held {
                out.push(Action::Update(Kind::PersistentVolume, without_finalizer(v, PV_PROTECTION)));
            }
            continue;
        }
        if r.is_null() {
            if phase(v) != "Available" {
                out.push(Action::UpdateStatus(Kind::PersistentVolume, with_status(v, json!({"phase": "Available"}))));
            }
            continue;
        }
        taken.insert(name.clone());
        if bound_claim.is_some() || r["uid"].as_str().is_none_or(str::is_empty) {
            // Bound (or bound by an administrator, waiting for its claim): the claims' loop.
            continue;
        }
        // The claim it was bound to is gone.
        let delete = v["spec"]["persistentVolumeReclaimPolicy"] == "Delete";
        let ours = annotation(v, PROVISIONED_BY_ANNOTATION) == Some(LAB_PROVISIONER);
        match phase(v) {
            "Released" if delete && !ours => {
                let message = format!(
                    "error getting deleter volume plugin for volume \"{name}\": no deletable volume plugin matched"
                );
                out.push(Action::UpdateStatus(
                    Kind::PersistentVolume,
                    with_status(v, json!({"phase": "Failed", "message": message})),
                ));
            }
            "Released" | "Failed" => {}
            _ => out.push(Action::UpdateStatus(Kind::PersistentVolume, with_status(v, json!({"phase": "Released"})))),
        }
    }

    for c in w.claims {
        let (ns, name) = ns_name(c);
        let key = format!("{ns}/{name}");
        if is_terminating(c) && has_finalizer(c, PVC_PROTECTION) && !in_use(c, w.pods) {
            out.push(Action::Update(Kind::PersistentVolumeClaim, without_finalizer(c, PVC_PROTECTION)));
            continue;
        }
        let event = |type_, reason, message: String, once| Action::Event {
            claim: (*c).clone(),
            type_,
            reason,
            message,
            component: "persistentvolume-controller",
            once,
        };
        if let Some(vol_name) = c["spec"]["volumeName"].as_str().filter(|n| !n.is_empty()) {
            match volumes.get(vol_name) {
                Some(v) if refers_to(v, c) || v["spec"]["claimRef"].is_null() => bind(c, v, &mut out),
                Some(_) if phase(c) != "Bound" => out.push(event(
                    EventType::Warning,
                    "FailedBinding",
                    format!("volume \"{vol_name}\" already bound to a different claim."),
                    true,
                )),
                None if phase(c) == "Bound" => {
                    out.push(Action::UpdateStatus(
                        Kind::PersistentVolumeClaim,
                        with_status(c, json!({"phase": "Lost"})),
                    ));
                    out.push(event(
                        EventType::Warning,
                        "ClaimLost",
                        "Bound claim has lost its PersistentVolume. Data on the volume is lost!".into(),
                        true,
                    ));
                }
                _ => {}
            }
            continue;
        }
        if is_terminating(c) {
            continue;
        }
        // A claim without a class gets the default one once there is one.
        if c["spec"]["storageClassName"].is_null() {
            if let Some(d) = default_class(w.classes) {
                let mut new = c.clone();
                new["spec"]["storageClassName"] = d["metadata"]["name"].clone();
                out.push(Action::Update(Kind::PersistentVolumeClaim, new));
                continue;
            }
        }
        let class_name = class_of(c);
        let class = classes.get(class_name).copied();
        let delayed = class.is_some_and(|k| k["volumeBindingMode"] == "WaitForFirstConsumer");
        let selected = annotation(c, SELECTED_NODE_ANNOTATION);
        if delayed && selected.is_none() {
            out.push(event(
                EventType::Normal,
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding".into(),
                true,
            ));
            continue;
        }
        let node = selected.and_then(|n| nodes.get(n).copied());
        // A volume that is there already: the smallest that fits (one named for the claim first).
        let found = w
            .volumes
            .iter()
            .filter(|v| !taken.contains(&ns_name(v).1) || refers_to(v, c))
            .filter(|v| fits(v, c, if delayed { node } else { None }))
            .min_by_key(|v| (!refers_to(v, c), quantity(&v["spec"]["capacity"]["storage"]), ns_name(v).1));
        if let Some(v) = found {
            taken.insert(ns_name(v).1);
            bind(c, v, &mut out);
            continue;
        }
        let Some(class) = class else {
            let message = if class_name.is_empty() {
                "no persistent volumes available for this claim and no storage class is set".to_string()
            } else {
                format!("storageclass.storage.k8s.io \"{class_name}\" not found")
            };
            let type_ = if class_name.is_empty() { EventType::Normal } else { EventType::Warning };
            out.push(event(type_, "FailedBinding", message, true));
            continue;
        };
        let provisioner = class["provisioner"].as_str().unwrap_or("");
        if annotation(c, PROVISIONER_ANNOTATION) != Some(provisioner) {
            let mut new = c.clone();
            new["metadata"]["annotations"][PROVISIONER_ANNOTATION] = json!(provisioner);
            new["metadata"]["annotations"][BETA_PROVISIONER_ANNOTATION] = json!(provisioner);
            out.push(Action::Update(Kind::PersistentVolumeClaim, new));
        }
        if provisioner != LAB_PROVISIONER {
            let message = format!(
                "Waiting for a volume to be created either by the external provisioner '{provisioner}' or manually by the system administrator. If volume creation is delayed, please verify that the provisioner is running and correctly registered."
            );
            out.push(event(EventType::Normal, "ExternalProvisioning", message, true));
            continue;
        }
        let volume_name = format!("pvc-{}", c["metadata"]["uid"].as_str().unwrap_or(""));
        if volumes.contains_key(&volume_name) {
            continue; // made, not yet bound: the volume's loop sees it next.
        }
        let failed = |why: String| Action::Event {
            claim: (*c).clone(),
            type_: EventType::Warning,
            reason: "ProvisioningFailed",
            message: format!("failed to provision volume with StorageClass \"{class_name}\": {why}"),
            component: LAB_PROVISIONER,
            once: true,
        };
        let Some(node_name) = selected else {
            out.push(failed("configuration error, no node was specified".into()));
            continue;
        };
        let Some(root) = node.and_then(|n| n.metadata.annotations.as_ref()?.get(LOCAL_PATH_ROOT_ANNOTATION)) else {
            out.push(failed(format!(
                "node \"{node_name}\" has no local-path directory (its kubelet publishes none in {LOCAL_PATH_ROOT_ANNOTATION})"
            )));
            continue;
        };
        let said = |reason, message: String| Action::Event {
            claim: (*c).clone(),
            type_: EventType::Normal,
            reason,
            message,
            component: LAB_PROVISIONER,
            once: true,
        };
        out.push(said("Provisioning", format!("External provisioner is provisioning volume for claim \"{key}\"")));
        let volume = local_path_volume(c, class, node_name, root);
        out.push(Action::Create(Kind::PersistentVolume, volume.clone()));
        out.push(said("ProvisioningSucceeded", format!("Successfully provisioned volume {volume_name}")));
    }
    out
}

/// Brings volumes and claims one step closer to bound (and released ones to their end).
/// `said` keeps the once-only Events already recorded (claim uid and reason).
pub async fn sync(reg: &Registry, said: &mut BTreeSet<(String, &'static str)>) -> Result<(), ApiError> {
    let (claims, _) = reg.store.list(Kind::PersistentVolumeClaim, None)?;
    let (volumes, _) = reg.store.list(Kind::PersistentVolume, None)?;
    if claims.is_empty() && volumes.is_empty() {
        said.clear();
        return Ok(());
    }
    let (classes, _) = reg.store.list(Kind::StorageClass, None)?;
    let (pods, _) = reg.store.list(Kind::Pod, None)?;
    let (nodes, _) = reg.store.list(Kind::Node, None)?;
    let nodes: Vec<Node> = nodes.into_iter().filter_map(|n| Node::from_json(n).ok()).collect();
    let world = World { classes: &classes, volumes: &volumes, claims: &claims, pods: &pods, nodes: &nodes };
    let uids: BTreeSet<&str> = claims.iter().filter_map(|c| c["metadata"]["uid"].as_str()).collect();
    said.retain(|(uid, _)| uids.contains(uid.as_str()));
    for action in plan_volumes(&world) {
        match action {
            Action::Create(kind, obj) => match reg.create(kind, None, obj, &WriteOptions::default()).await {
                Ok(_) | Err(ApiError::AlreadyExists { .. }) => {}
                Err(e) => return Err(e),
            },
            Action::Update(kind, want) => write(reg, kind, &want, Subresource::Main).await?,
            Action::UpdateStatus(kind, want) => write(reg, kind, &want, Subresource::Status).await?,
            Action::Event { claim, type_, reason, message, component, once } => {
                let uid = claim["metadata"]["uid"].as_str().unwrap_or("").to_string();
                if once && !said.insert((uid, reason)) {
                    continue;
                }
                let report = Report {
                    component,
                    host: None,
                    object: &claim,
                    kind: Kind::PersistentVolumeClaim,
                    field_path: None,
                    type_,
                    reason,
                    message,
                };
                record(reg, report).await;
            }
        }
    }
    Ok(())
}

/// Writes the wanted metadata and spec (or status) over the stored object: a second write to
/// the same object in one pass reads what the first wrote. Conflicts and gone objects are left
/// to the next pass.
async fn write(reg: &Registry, kind: Kind, want: &Value, sub: Subresource) -> Result<(), ApiError> {
    let (ns, name) = ns_name(want);
    let ns = kind.info().namespaced.then_some(ns);
    let Some(mut new) = reg.store.get(kind, ns.as_deref().unwrap_or(""), &name)? else { return Ok(()) };
    if sub == Subresource::Status {
        new["status"] = want["status"].clone();
    } else {
        new["spec"] = want["spec"].clone();
        for k in ["annotations", "finalizers"] {
            new["metadata"][k] = want["metadata"][k].clone();
        }
    }
    match reg.update(kind, ns.as_deref(), &name, new, sub, &WriteOptions::default()).await {
        Ok(_) | Err(ApiError::Conflict { .. }) | Err(ApiError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(name: &str, class: Option<&str>, annotations: Value) -> Value {
        json!({"metadata": {"namespace": "default", "name": name, "uid": format!("u-{name}"), "resourceVersion": "7",
                            "annotations": annotations, "finalizers": [PVC_PROTECTION]},
               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                        "storageClassName": class, "volumeMode": "Filesystem"},
               "status": {"phase": "Pending"}})
    }

    fn class(name: &str, mode: &str, provisioner: &str) -> Value {
        json!({"metadata": {"name": name, "annotations": {DEFAULT_CLASS_ANNOTATION: "true"}},
               "provisioner": provisioner, "reclaimPolicy": "Delete", "volumeBindingMode": mode})
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": {HOSTNAME_LABEL: name},
            "annotations": {LOCAL_PATH_ROOT_ANNOTATION: format!("/lab/{name}/local-path")}}}))
        .unwrap()
    }

    fn events(actions: &[Action]) -> Vec<(&'static str, String)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Event { reason, message, .. } => Some((*reason, message.clone())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn wait_for_first_consumer_then_provision_on_the_chosen_node_and_bind() {
        let classes = [class("standard", "WaitForFirstConsumer", LAB_PROVISIONER)];
        let nodes = [node("node-1"), node("node-2")];
        let waiting = [claim("www-web-0", Some("standard"), json!({}))];
        let w = World { classes: &classes, claims: &waiting, nodes: &nodes, ..Default::default() };
        assert_eq!(
            events(&plan_volumes(&w)),
            [("WaitForFirstConsumer", "waiting for first consumer to be created before binding".to_string())]
        );
        // The scheduler chose node-2.
        let chosen = [claim("www-web-0", Some("standard"), json!({SELECTED_NODE_ANNOTATION: "node-2"}))];
        let w = World { classes: &classes, claims: &chosen, nodes: &nodes, ..Default::default() };
        let plan = plan_volumes(&w);
        let Some(Action::Create(Kind::PersistentVolume, pv)) = plan.iter().find(|a| matches!(a, Action::Create(..)))
        else {
            panic!("no volume made: {plan:?}")
        };
        assert_eq!(pv["metadata"]["name"], "pvc-u-www-web-0");
        assert_eq!(pv["spec"]["hostPath"]["path"], "/lab/node-2/local-path/pvc-u-www-web-0_default_www-web-0");
        assert_eq!(
            pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            json!(["node-2"])
        );
        assert_eq!(pv["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(events(&plan).iter().map(|e| e.0).collect::<Vec<_>>(), ["Provisioning", "ProvisioningSucceeded"]);
        // Next pass: the volume exists (Pending, claimRef with the uid): both are bound.
        let mut made = pv.clone();
        made["status"] = json!({"phase": "Pending"});
        let vols = [made];
        let w = World { classes: &classes, claims: &chosen, volumes: &vols, nodes: &nodes, ..Default::default() };
        let plan = plan_volumes(&w);
        let claim_update = plan
            .iter()
            .find_map(|a| match a {
                Action::Update(Kind::PersistentVolumeClaim, c) => Some(c),
                _ => None,
            })
            .expect("the claim names its volume");
        assert_eq!(claim_update["spec"]["volumeName"], "pvc-u-www-web-0");
        assert_eq!(claim_update["metadata"]["annotations"][BIND_COMPLETED], "yes");
        let statuses: Vec<(&Kind, &Value)> = plan
            .iter()
            .filter_map(|a| match a {
                Action::UpdateStatus(k, o) => Some((k, &o["status"]["phase"])),
                _ => None,
            })
            .collect();
        assert_eq!(
            statuses,
            [(&Kind::PersistentVolume, &json!("Bound")), (&Kind::PersistentVolumeClaim, &json!("Bound"))]
        );
    }

    #[test]
    fn static_volumes_bind_the_smallest_fit_and_are_released_when_the_claim_goes() {
        let pv = |name: &str, size: &str, modes: Value| {
            json!({"metadata": {"name": name, "finalizers": [PV_PROTECTION]},
                   "spec": {"capacity": {"storage": size}, "accessModes": modes, "hostPath": {"path": "/d"},
                            "persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Filesystem"},
                   "status": {"phase": "Available"}})
        };
        let vols = [
            pv("big", "10Gi", json!(["ReadWriteOnce"])),
            pv("small", "2Gi", json!(["ReadWriteOnce"])),
            pv("tiny", "500Mi", json!(["ReadWriteOnce"])),
            pv("ro", "1Gi", json!(["ReadOnlyMany"])),
        ];
        let claims = [claim("data", Some(""), json!({}))];
        let w = World { volumes: &vols, claims: &claims, ..Default::default() };
        let plan = plan_volumes(&w);
        let Some(Action::Update(Kind::PersistentVolume, bound)) = plan.first() else { panic!("{plan:?}") };
        assert_eq!(bound["metadata"]["name"], "small");
        assert_eq!(bound["spec"]["claimRef"]["uid"], "u-data");
        assert_eq!(bound["metadata"]["annotations"][BOUND_BY_CONTROLLER], "yes");
        // No fit and no class: said once, as the real controller says it.
        let huge = [json!({"metadata": {"namespace": "default", "name": "huge", "uid": "h"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Ti"}}, "storageClassName": ""}})];
        let w = World { volumes: &vols, claims: &huge, ..Default::default() };
        assert_eq!(
            events(&plan_volumes(&w)),
            [("FailedBinding", "no persistent volumes available for this claim and no storage class is set".into())]
        );
        // The claim is gone: Released, and the finalizer goes when the volume is deleted.
        let mut held = pv("small", "2Gi", json!(["ReadWriteOnce"]));
        held["spec"]["claimRef"] = json!({"namespace": "default", "name": "data", "uid": "u-data"});
        held["status"]["phase"] = json!("Bound");
        let vols = [held.clone()];
        let w = World { volumes: &vols, ..Default::default() };
        let plan = plan_volumes(&w);
        assert!(
            matches!(&plan[..], [Action::UpdateStatus(Kind::PersistentVolume, v)] if v["status"]["phase"] == "Released")
        );
        held["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let vols = [held];
        let w = World { volumes: &vols, ..Default::default() };
        let plan = plan_volumes(&w);
        assert!(
            matches!(&plan[..], [Action::Update(Kind::PersistentVolume, v)] if v["metadata"]["finalizers"] == json!([]))
        );
    }

    #[test]
    fn a_claim_in_use_keeps_its_finalizer_until_its_pods_are_gone() {
        let mut c = claim("data", Some("standard"), json!({}));
        c["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let pod = json!({"metadata": {"namespace": "default", "name": "p"}, "status": {"phase": "Running"},
                         "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}});
        let claims = [c];
        let pods = [pod.clone()];
        let w = World { claims: &claims, pods: &pods, ..Default::default() };
        assert!(plan_volumes(&w).is_empty(), "in use");
        let mut done = pod;
        done["status"]["phase"] = json!("Succeeded");
        let pods = [done];
        let w = World { claims: &claims, pods: &pods, ..Default::default() };
        assert!(
            matches!(&plan_volumes(&w)[..], [Action::Update(Kind::PersistentVolumeClaim, c)] if c["metadata"]["finalizers"] == json!([]))
        );
        // Another provisioner's class: annotated and left to it.
        let classes = [class("nfs", "Immediate", "example.com/nfs")];
        let claims = [claim("shared", Some("nfs"), json!({}))];
        let w = World { classes: &classes, claims: &claims, ..Default::default() };
        let plan = plan_volumes(&w);
        assert!(matches!(&plan[0], Action::Update(Kind::PersistentVolumeClaim, c)
            if c["metadata"]["annotations"][PROVISIONER_ANNOTATION] == "example.com/nfs"));
        assert_eq!(events(&plan)[0].0, "ExternalProvisioning");
    }
}
