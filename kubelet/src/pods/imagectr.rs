//! Starting a container of an image: the pull as `imagePullPolicy` says (with kubelet's
//! Events, `ErrImagePull` then `ImagePullBackOff` while the back-off runs), then the OCI
//! bundle (the runtime spec made by [`crate::oci`]) and the monitor's command line running it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use tokio::time::Instant;

use super::container::Ctr;
use super::launch::{container_env, monitor_spec, ImageProcess, Launch};
use super::record::PodRecord;
use super::{envvars, uid, Deps, PodApi, Prober};
use crate::cni::PluginExec;
use crate::images::Images;
use crate::oci;
use crate::process::Processes;
use crate::volumes;

/// A `/dev/shm` as containerd gives one (64 MiB).
const SHM_BYTES: u64 = 64 << 20;

/// How long `ErrImagePull` shows before the back-off (`ImagePullBackOff`) does.
const ERR_IMAGE_PULL_SHOWN: Duration = Duration::from_secs(1);

/// The objects volumes read, from the node's caches.
struct Cached<'a> {
    secrets: &'a podpath_client::reflector::Store<core::Secret>,
    config_maps: &'a podpath_client::reflector::Store<core::ConfigMap>,
    claims: &'a podpath_client::reflector::Store<core::PersistentVolumeClaim>,
    volumes: &'a podpath_client::reflector::Store<core::PersistentVolume>,
    token: Option<String>,
}

impl volumes::Objects for Cached<'_> {
    fn secret(&self, namespace: &str, name: &str) -> Option<core::Secret> {
        self.secrets.get(&format!("{namespace}/{name}"))
    }
    fn config_map(&self, namespace: &str, name: &str) -> Option<core::ConfigMap> {
        self.config_maps.get(&format!("{namespace}/{name}"))
    }
    fn token(&self) -> Option<String> {
        self.token.clone()
    }
    fn claim(&self, namespace: &str, name: &str) -> Option<core::PersistentVolumeClaim> {
        self.claims.get(&format!("{namespace}/{name}"))
    }
    fn volume(&self, name: &str) -> Option<core::PersistentVolume> {
        self.volumes.get(name)
    }
}

/// Why a container's bundle could not be made.
pub(super) enum BundleError {
    /// A volume (kubelet's `FailedMount`; the pod stays `ContainerCreating`).
    Mount(String),
    /// The container's own settings (`CreateContainerConfigError`).
    Config(String),
}

impl From<String> for BundleError {
    fn from(why: String) -> BundleError {
        BundleError::Config(why)
    }
}

impl<P: Processes, E: PluginExec, A: PodApi, Q: Prober> Deps<P, E, A, Q> {
    fn objects(&self) -> Cached<'_> {
        Cached {
            secrets: &self.secrets,
            config_maps: &self.config_maps,
            claims: &self.claims,
            volumes: &self.volumes,
            token: self.cfg.service_account_token.clone(),
        }
    }

    /// Makes the pod's volumes (again: files volumes take their objects' current content);
    /// returns each volume's directory on the node.
    pub(super) fn setup_volumes(&self, pod: &core::Pod) -> Result<BTreeMap<String, PathBuf>, String> {
        let planned = volumes::plan(pod, &self.objects())?;
        let dir = self.cfg.pod_volumes_dir(&uid(pod));
        let mut out = BTreeMap::new();
        for (name, v) in planned {
            let path = dir.join(&name);
            let fail = |e: std::io::Error| format!("MountVolume.SetUp failed for volume {name:?} : {e}");
            let at = match v {
                volumes::Volume::Dir => {
                    std::fs::create_dir_all(&path).map_err(fail)?;
                    path
                }
                volumes::Volume::Tmpfs(size) => {
                    std::fs::create_dir_all(&path).map_err(fail)?;
                    if !is_mount_point(&path) {
                        let opts = size.map_or("mode=1777".to_string(), |b| format!("mode=1777,size={b}"));
                        nix::mount::mount(
                            Some("tmpfs"),
                            &path,
                            Some("tmpfs"),
                            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                            Some(opts.as_str()),
                        )
                        .map_err(|e| fail(e.into()))?;
                    }
                    path
                }
                volumes::Volume::Host { path: host, create, must_be } => {
                    if create {
                        std::fs::create_dir_all(&host).map_err(fail)?;
                    }
                    let m = std::fs::metadata(&host);
                    let ok = match (must_be, &m) {
                        (_, Err(_)) => false,
                        (Some("directory"), Ok(m)) => m.is_dir(),
                        (Some("file"), Ok(m)) => m.is_file(),
                        _ => true,
                    };
                    if !ok {
                        return Err(format!(
                            "MountVolume.SetUp failed for volume {name:?} : hostPath type check failed: {} is not a {}",
                            host.display(),
                            must_be.unwrap_or("path that exists")
                        ));
                    }
                    host
                }
                volumes::Volume::Files(files) => {
                    volumes::write_files(&path, &files).map_err(fail)?;
                    path
                }
                volumes::Volume::Claimed(dir) => {
                    if !dir.is_dir() {
                        use std::os::unix::fs::PermissionsExt;
                        std::fs::create_dir_all(&dir).map_err(fail)?;
                        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).map_err(fail)?;
                    }
                    dir
                }
            };
            out.insert(name, at);
        }
        Ok(out)
    }

    /// Writes the pod's files volumes again after a Secret or ConfigMap changed (containers see
    /// the new content through the `..data` switch, as with kubelet).
    pub(super) fn refresh_volumes(&self, pod: &core::Pod) {
        if let Err(e) = self.setup_volumes(pod) {
            tracing::debug!(pod = %super::key(pod), "volumes not refreshed: {e}");
        }
    }

    /// The registry logins of the pod's `imagePullSecrets` (a missing one is skipped, as kubelet
    /// does, with a warning Event).
    fn pull_credentials(&self, pod: &core::Pod) -> Vec<image::Credential> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut out = vec![];
        for r in pod.spec.as_ref().and_then(|s| s.image_pull_secrets.as_ref()).into_iter().flatten() {
            let Some(s) = self.secrets.get(&format!("{ns}/{}", r.name)) else {
                self.event(
                    pod,
                    None,
                    true,
                    "FailedToRetrieveImagePullSecret",
                    format!("Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.", r.name),
                );
                continue;
            };
            let data = s.data.unwrap_or_default();
            if let Some(json) = data.get(".dockerconfigjson").or_else(|| data.get(".dockercfg")) {
                match image::pull::docker_config_credentials(&json.0) {
                    Ok(c) => out.extend(c),
                    Err(e) => tracing::warn!(pod = %super::key(pod), secret = %r.name, "unusable pull secret: {e}"),
                }
            }
        }
        out
    }

    /// The Service variables of a pod's containers.
    pub(super) fn service_env(&self, pod: &core::Pod) -> Vec<(String, String)> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let links = pod.spec.as_ref().and_then(|s| s.enable_service_links).unwrap_or(true);
        envvars::service_env(ns, links, &self.services.list())
    }

    /// The image of `c`, stored or pulled, and how to run it; None while waiting (the
    /// container's `waiting` and `next_start` say why and until when).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn image_container(
        &self,
        pod: &core::Pod,
        rec: &PodRecord,
        c: &mut Ctr,
        images: &Images,
        pod_ip: &str,
        attempt: i32,
        services: &[(String, String)],
    ) -> Option<Launch> {
        let image = c.spec.image.clone().unwrap_or_default();
        let name = c.spec.name.clone();
        let now = Instant::now();
        if let Some(at) = c.pull_retry_at.filter(|at| *at > now) {
            let was = c.waiting.as_ref().map(|w| w.0.as_str()) == Some("ImagePullBackOff");
            let last = c.waiting.as_ref().and_then(|w| w.1.clone()).unwrap_or_default();
            if !was {
                self.event(pod, Some(&name), false, "BackOff", format!("Back-off pulling image {image:?}"));
                self.event(pod, Some(&name), true, "Failed", "Error: ImagePullBackOff".into());
                let why =
                    last.strip_prefix(&format!("Back-off pulling image {image:?}: ErrImagePull: ")).unwrap_or(&last);
                c.waiting = Some((
                    "ImagePullBackOff".into(),
                    Some(format!("Back-off pulling image {image:?}: ErrImagePull: {why}")),
                ));
            }
            c.next_start = Some(at);
            return None;
        }
        let policy = c.spec.image_pull_policy.clone().unwrap_or_else(|| "IfNotPresent".into());
        let present = images.find(&image);
        let record = match (policy.as_str(), present) {
            ("Never" | "IfNotPresent", Some(r)) => {
                self.event(
                    pod,
                    Some(&name),
                    false,
                    "Pulled",
                    format!("Container image {image:?} already present on machine"),
                );
                r
            }
            ("Never", None) => {
                let msg = format!("Container image {image:?} is not present with pull policy of Never");
                self.event(pod, Some(&name), true, "ErrImageNeverPull", msg.clone());
                c.waiting = Some(("ErrImageNeverPull".into(), Some(msg)));
                c.next_start = Some(now + self.cfg.backoff_max);
                return None;
            }
            _ => {
                self.event(pod, Some(&name), false, "Pulling", format!("Pulling image {image:?}"));
                let started = std::time::Instant::now();
                match images.pull(&image, self.pull_credentials(pod)).await {
                    Ok(p) => {
                        let waited = started.elapsed();
                        self.event(
                            pod,
                            Some(&name),
                            false,
                            "Pulled",
                            format!(
                                "Successfully pulled image {image:?} in {:.3}s ({:.3}s including waiting). Image size: {} bytes.",
                                p.elapsed.as_secs_f64(),
                                waited.as_secs_f64(),
                                p.record.size
                            ),
                        );
                        c.pull_backoff = self.cfg.backoff_base;
                        c.pull_retry_at = None;
                        p.record
                    }
                    Err(msg) => {
                        self.event(pod, Some(&name), true, "Failed", format!("Failed to pull image {image:?}: {msg}"));
                        self.event(pod, Some(&name), true, "Failed", "Error: ErrImagePull".into());
                        c.waiting = Some(("ErrImagePull".into(), Some(msg)));
                        c.pull_retry_at = Some(Instant::now() + c.pull_backoff);
                        c.next_start = Some(Instant::now() + ERR_IMAGE_PULL_SHOWN.min(c.pull_backoff));
                        c.pull_backoff = (c.pull_backoff * 2).min(self.cfg.backoff_max);
                        return None;
                    }
                }
            }
        };
        match self.bundle(pod, rec, c, images, &record, pod_ip, attempt, services) {
            Ok(l) => Some(l),
            Err(BundleError::Mount(msg)) => {
                self.event(pod, None, true, "FailedMount", msg.clone());
                c.waiting = Some(("ContainerCreating".into(), None));
                c.next_start = Some(Instant::now() + c.backoff);
                c.backoff = (c.backoff * 2).min(self.cfg.backoff_max);
                None
            }
            Err(BundleError::Config(msg)) => {
                self.event(pod, Some(&name), true, "Failed", format!("Error: {msg}"));
                c.waiting = Some(("CreateContainerConfigError".into(), Some(msg)));
                c.next_start = Some(Instant::now() + c.backoff);
                c.backoff = (c.backoff * 2).min(self.cfg.backoff_max);
                None
            }
        }
    }

    /// Writes the container's bundle for this attempt (the last attempt's goes: a restarted
    /// container starts from its image again) and returns the monitor's command line.
    #[allow(clippy::too_many_arguments)]
    fn bundle(
        &self,
        pod: &core::Pod,
        rec: &PodRecord,
        c: &mut Ctr,
        images: &Images,
        record: &image::ImageRecord,
        pod_ip: &str,
        attempt: i32,
        services: &[(String, String)],
    ) -> Result<Launch, BundleError> {
        let volumes = self.setup_volumes(pod).map_err(BundleError::Mount)?;
        let mounts = volume_binds(&c.spec, &volumes)?;
        let pod_uid = uid(pod);
        let layers = images.layer_dirs(record)?;
        let read = |f: &str| oci::read_image_file(&layers, f);
        let spec_pod = pod.spec.as_ref();
        let user = oci::resolve_user(
            record.config.user.as_deref(),
            c.spec.security_context.as_ref(),
            spec_pod.and_then(|s| s.security_context.as_ref()),
            &read,
        )?;
        let mut vars: Vec<(String, String)> = services.to_vec();
        let objects = self.objects();
        vars.extend(container_env(
            pod,
            &c.spec,
            pod_ip,
            &self.cfg.node_name,
            &self.cfg.node_ip.to_string(),
            services,
            Some(&objects),
        )?);
        let lookup = |k: &str| vars.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let args: Vec<String> =
            oci::process_args(&c.spec, &record.config).iter().map(|a| envvars::expand(a, &lookup)).collect();
        if args.is_empty() {
            return Err(BundleError::Config("no command specified".into()));
        }
        let hostname =
            spec_pod.and_then(|s| s.hostname.clone()).unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
        let env = oci::process_env(&record.config, &hostname, &vars);
        let etc = self.cfg.pod_etc_dir(&pod_uid);
        let hostname_file = etc.join("hostname");
        std::fs::write(&hostname_file, format!("{hostname}\n"))
            .map_err(|e| format!("cannot write {}: {e}", hostname_file.display()))?;
        let mut binds: Vec<oci::Bind> = ["resolv.conf", "hosts", "hostname"]
            .iter()
            .map(|f| oci::Bind { source: etc.join(f), destination: format!("/etc/{f}"), read_only: false })
            .collect();
        binds.extend(mounts);
        let spec = oci::runtime_spec(&oci::SpecInput {
            pod,
            container: &c.spec,
            image: &record.config,
            sandbox_pid: rec.sandbox.pid,
            args,
            env,
            user,
            cwd: oci::working_dir(&c.spec, &record.config),
            binds,
            shm_bytes: SHM_BYTES,
            nofile: {
                let l = rustix::process::getrlimit(rustix::process::Resource::Nofile);
                let hard = l.maximum.unwrap_or(1 << 20);
                (l.current.unwrap_or(hard).min(hard), hard)
            },
            pid_namespace: c.pid_ns.clone(),
        });
        let dir = self.cfg.pod_containers_dir(&pod_uid);
        let bundle = dir.join(format!("{}-{attempt}", c.spec.name));
        // Earlier attempts' bundles (their writable layers) go.
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.rsplit_once('-').is_some_and(|(ctr, _)| ctr == c.spec.name) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        std::fs::create_dir_all(&bundle).map_err(|e| format!("cannot create {}: {e}", bundle.display()))?;
        let body = serde_json::to_vec_pretty(&spec).map_err(|e| e.to_string())?;
        std::fs::write(bundle.join("config.json"), body)
            .map_err(|e| format!("cannot write the container's config: {e}"))?;
        // The runtime's ID: unique on the node, and short (it names sockets).
        let id = format!("{}-{}-{attempt}", &pod_uid[..pod_uid.len().min(13)], c.spec.name);
        images.store.lease(&format!("{pod_uid}-{}", c.spec.name), &record.layers).map_err(|e| e.to_string())?;
        // The image's last use orders the store's garbage collection (least recent goes first).
        if let Err(e) = images.store.mark_used(&record.id) {
            tracing::warn!(image = %record.id, "{e}");
        }
        let mut inner = vec![
            self.cfg.workload_bin.display().to_string(),
            "container".into(),
            "--bundle".into(),
            bundle.display().to_string(),
            "--runtime".into(),
            images.runtime.display().to_string(),
            "--root".into(),
            images.runtime_root.display().to_string(),
            "--id".into(),
            id.clone(),
        ];
        for l in &layers {
            inner.push("--layer".into());
            inner.push(l.display().to_string());
        }
        let pid_file = bundle.join("pid");
        let _ = std::fs::remove_file(&pid_file);
        // The image's StopSignal (nginx's is SIGQUIT: a graceful stop), when it names one.
        let stop_signal = record.config.stop_signal.as_deref().filter(|s| crate::workload::parse_signal(s).is_ok());
        let image = ImageProcess { pid_file: &pid_file, stop_signal };
        let spec = monitor_spec(&self.cfg, pod, &c.spec, None, attempt, inner, vec![], Some(image));
        c.rec.pid_file = Some(pid_file);
        c.rec.runtime_id = Some(id);
        Ok(Launch::Run(spec))
    }
}

/// Whether `p` is a mount point (its device differs from its parent's).
fn is_mount_point(p: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(p), p.parent().map(std::fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

/// The container's `volumeMounts` as bind mounts: the volume's directory, or a `subPath` of it
/// (made as a directory when missing, as kubelet does; never outside the volume).
pub(super) fn volume_binds(c: &core::Container, volumes: &BTreeMap<String, PathBuf>) -> Result<Vec<oci::Bind>, String> {
    let mut out = vec![];
    for m in c.volume_mounts.iter().flatten() {
        let dir = volumes.get(&m.name).ok_or_else(|| format!("volumeMount {:?} names no volume of the pod", m.name))?;
        let source = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            None => dir.clone(),
            Some(sub) => {
                let rel = volumes::safe_relative(sub).map_err(|e| format!("subPath {e}"))?;
                let p = dir.join(rel);
                if std::fs::symlink_metadata(&p).is_err() {
                    std::fs::create_dir_all(&p).map_err(|e| format!("cannot create subPath {sub:?}: {e}"))?;
                }
                p
            }
        };
        out.push(oci::Bind { source, destination: m.mount_path.clone(), read_only: m.read_only == Some(true) });
    }
    Ok(out)
}
