//! Containers of images on this node: the lab's image store (read here) and image service
//! (asked to pull), the OCI runtime, and which images still run the node's own programs.

use std::path::PathBuf;
use std::time::Duration;

use image::service::{call, Request};
use image::{Credential, ImageRecord, Store};

/// How this node runs images.
#[derive(Debug, Clone)]
pub struct Images {
    pub store: Store,
    /// The lab's image service socket.
    pub service: PathBuf,
    /// The OCI runtime (crun).
    pub runtime: PathBuf,
    /// The runtime's state directory (`--root`), this node's own.
    pub runtime_root: PathBuf,
    /// busybox, alpine, debian and ubuntu run the node's programs instead of being pulled
    /// (`podpath up --host-programs`: labs without a registry).
    pub host_programs: bool,
}

/// A pull that succeeded.
#[derive(Debug, Clone)]
pub struct PulledImage {
    pub record: ImageRecord,
    pub downloaded: u64,
    pub elapsed: Duration,
}

impl Images {
    /// Whether a container of `image` is an image container (not built in, not a node program).
    pub fn runs(&self, image: &str) -> bool {
        !(crate::pods::is_echo_image(image)
            || crate::pods::is_dns_image(image)
            || (self.host_programs && crate::pods::base_image_cmd(image).is_some()))
    }

    /// The stored image `image` names, if any.
    pub fn find(&self, image: &str) -> Option<ImageRecord> {
        self.store.find(image).ok().flatten().filter(|r| r.layers.iter().all(|l| self.store.has_layer(l)))
    }

    /// Asks the lab's image service to pull `image`; the error is the registry's, in
    /// containerd's words.
    pub async fn pull(&self, image: &str, credentials: Vec<Credential>) -> Result<PulledImage, String> {
        let req = Request::Pull { image: image.to_string(), credentials };
        let answer = call(&self.service, &req).await.map_err(|e| e.to_string())?;
        match (answer.image, answer.error) {
            (_, Some(e)) => Err(e),
            (Some(record), None) => Ok(PulledImage {
                record,
                downloaded: answer.downloaded,
                elapsed: Duration::from_millis(answer.elapsed_ms),
            }),
            (None, None) => Err("the image service answered nothing".into()),
        }
    }

    /// Deletes a container from the runtime once its monitor has ended (`crun delete --force`,
    /// as containerd does when it loses a shim): its state goes, and a process the monitor left
    /// behind (the monitor was killed) is killed with its PID namespace. An unknown ID is
    /// already deleted.
    pub async fn delete_container(&self, id: &str) {
        let mut cmd = tokio::process::Command::new(&self.runtime);
        cmd.arg("--cgroup-manager=disabled")
            .arg("--root")
            .arg(&self.runtime_root)
            .args(["delete", "--force", id])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        match tokio::time::timeout(Duration::from_secs(10), cmd.output()).await {
            Ok(Ok(o)) if o.status.success() => {}
            Ok(Ok(o)) => {
                let err = String::from_utf8_lossy(&o.stderr);
                if !err.contains("does not exist") {
                    tracing::warn!(container = id, "the runtime could not delete the container: {}", err.trim());
                }
            }
            Ok(Err(e)) => tracing::warn!(container = id, "cannot run {}: {e}", self.runtime.display()),
            Err(_) => tracing::warn!(container = id, "the runtime took over 10 s to delete the container"),
        }
    }

    /// Layer directories of an image, the top one first (overlayfs's `lowerdir` order).
    pub fn layer_dirs(&self, rec: &ImageRecord) -> Result<Vec<PathBuf>, String> {
        rec.layers.iter().rev().map(|l| self.store.layer_dir(l).map_err(|e| e.to_string())).collect()
    }
}
