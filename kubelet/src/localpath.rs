//! The node's side of the lab's provisioner (`podpath.dev/local-path`): the volumes it makes
//! are directories under this node's local-path root (published on the Node, see
//! [`ROOT_ANNOTATION`]); a pod's first mount makes the directory, and once a volume with
//! `reclaimPolicy: Delete` is released (its claim deleted) this node deletes the directory and
//! then the PersistentVolume, as local-path-provisioner's helper pod does on its node.
//!
//! [`to_reclaim`] decides (pure); [`run`] deletes.

use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use api::kinds::persistentvolume::PROVISIONED_BY_ANNOTATION;
use api::kinds::storageclass::LAB_PROVISIONER;
use k8s_openapi::api::core::v1 as core;
use podpath_client::reflector::Store;
use podpath_client::ApiClient;

/// On the Node: the directory its local-path volumes live under.
pub const ROOT_ANNOTATION: &str = "podpath.dev/local-path-root";

/// Where a node keeps its local-path volumes, under its state directory.
pub fn root(state_dir: &Path) -> PathBuf {
    state_dir.join("local-path")
}

/// Whether the volume is pinned to `node` by its required node affinity.
fn pinned_to(pv: &core::PersistentVolume, node: &str) -> bool {
    let terms = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| r.node_selector_terms.as_slice())
        .unwrap_or_default();
    terms.iter().any(|t| {
        t.match_expressions.iter().flatten().any(|e| {
            e.key == "kubernetes.io/hostname" && e.operator == "In" && e.values.iter().flatten().any(|v| v == node)
        })
    })
}

/// The released local-path volumes of `node` to delete: (volume name, uid, directory). Only a
/// directory directly under `root` named `pvc-…` is ever named, whatever the volume says.
pub fn to_reclaim(volumes: &[core::PersistentVolume], node: &str, root: &Path) -> Vec<(String, String, PathBuf)> {
    volumes
        .iter()
        .filter(|pv| {
            pv.metadata.annotations.as_ref().and_then(|a| a.get(PROVISIONED_BY_ANNOTATION)).map(String::as_str)
                == Some(LAB_PROVISIONER)
        })
        .filter(|pv| pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released"))
        .filter(|pv| pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete"))
        .filter(|pv| pinned_to(pv, node))
        .filter_map(|pv| {
            let path = PathBuf::from(&pv.spec.as_ref()?.host_path.as_ref()?.path);
            let inside = path.parent() == Some(root)
                && path.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
                && path.file_name()?.to_str()?.starts_with("pvc-");
            let name = pv.metadata.name.clone()?;
            inside.then(|| (name, pv.metadata.uid.clone().unwrap_or_default(), path))
        })
        .collect()
}

/// Deletes this node's released local-path volumes as they appear, until the process ends.
pub async fn run(client: ApiClient, volumes: Arc<Store<core::PersistentVolume>>, node: String, root: PathBuf) {
    let mut changes = volumes.changes();
    let mut retry = tokio::time::interval(Duration::from_secs(10));
    loop {
        for (name, uid, dir) in to_reclaim(&volumes.list(), &node, &root) {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(volume = %name, dir = %dir.display(), error = %e, "cannot delete a released volume's directory");
                    continue;
                }
            }
            let req = api::proto::DeleteRequest { name: name.clone(), precondition_uid: uid, ..Default::default() };
            match client.volumes.clone().delete(req).await {
                Ok(_) => tracing::info!(volume = %name, dir = %dir.display(), "released volume deleted"),
                Err(s) if s.code() == tonic::Code::NotFound => {}
                Err(s) => tracing::warn!(volume = %name, error = %s.message(), "cannot delete a released volume"),
            }
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            _ = retry.tick() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(name: &str, node: &str, path: &str, phase: &str, policy: &str) -> core::PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": format!("u-{name}"), "annotations": {PROVISIONED_BY_ANNOTATION: LAB_PROVISIONER}},
            "spec": {"hostPath": {"path": path}, "persistentVolumeReclaimPolicy": policy,
                     "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                         {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn only_this_nodes_released_volumes_under_its_root_are_deleted() {
        let root = Path::new("/lab/node-1/local-path");
        let vols = [
            pv("pvc-a", "node-1", "/lab/node-1/local-path/pvc-a_default_www-web-0", "Released", "Delete"),
            pv("pvc-b", "node-1", "/lab/node-1/local-path/pvc-b_default_x", "Bound", "Delete"),
            pv("pvc-c", "node-1", "/lab/node-1/local-path/pvc-c_default_x", "Released", "Retain"),
            pv("pvc-d", "node-2", "/lab/node-2/local-path/pvc-d_default_x", "Released", "Delete"),
            pv("pvc-e", "node-1", "/lab/node-1/local-path/../../etc", "Released", "Delete"),
            pv("pvc-f", "node-1", "/etc/pvc-f", "Released", "Delete"),
        ];
        let got = to_reclaim(&vols, "node-1", root);
        assert_eq!(got, [("pvc-a".to_string(), "u-pvc-a".to_string(), root.join("pvc-a_default_www-web-0"))]);
    }
}
