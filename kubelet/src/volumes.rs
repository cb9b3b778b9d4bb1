//! A pod's volumes, as kubelet's volume plugins make them: `emptyDir` (disk, or `medium:
//! Memory` on a tmpfs), `hostPath`, and the projected kinds — `configMap`, `secret`,
//! `downwardAPI`, `projected` (with the ServiceAccount token) — written by an atomic writer
//! (files in a timestamped directory, `..data` pointing at it, each file a link through
//! `..data`), so an update is one rename and a container sees all of it or none of it.
//!
//! [`plan`] decides, purely, what each volume holds from the pod and the objects it names;
//! [`write_files`] writes the files volumes; the kubelet makes the rest under the pod's volume
//! directory.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1 as core;

/// What a volume is on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Volume {
    /// A directory of the pod's (emptyDir on disk).
    Dir,
    /// A tmpfs of this many bytes at most (emptyDir with `medium: Memory`).
    Tmpfs(Option<u64>),
    /// A path of the node (hostPath); `create`: make it as a directory if missing.
    Host { path: PathBuf, create: bool, must_be: Option<&'static str> },
    /// Files written by the atomic writer: relative path → (content, mode).
    Files(BTreeMap<String, (Vec<u8>, u32)>),
    /// A claim's volume made by the lab's provisioner: a directory of the node, made
    /// world-writable when missing (as local-path-provisioner makes them).
    Claimed(PathBuf),
}

/// The objects a pod's volumes read.
pub trait Objects {
    fn secret(&self, namespace: &str, name: &str) -> Option<core::Secret>;
    fn config_map(&self, namespace: &str, name: &str) -> Option<core::ConfigMap>;
    /// The token written for `serviceAccountToken` projections.
    fn token(&self) -> Option<String>;
    fn claim(&self, _namespace: &str, _name: &str) -> Option<core::PersistentVolumeClaim> {
        None
    }
    fn volume(&self, _name: &str) -> Option<core::PersistentVolume> {
        None
    }
}

/// What a claim's bound volume is on this node, as kubelet's volume manager finds it: the
/// claim must exist and be bound, its volume a `hostPath` or `local` one (the kinds a node
/// provides by itself).
fn claimed(ns: &str, claim: &str, objects: &dyn Objects) -> Result<Volume, String> {
    let c = objects.claim(ns, claim).ok_or_else(|| format!("persistentvolumeclaim {claim:?} not found"))?;
    let bound = c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let name = c.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|n| !n.is_empty() && bound);
    let name = name.ok_or_else(|| format!("PersistentVolumeClaim {claim:?} is not bound"))?;
    let pv = objects.volume(&name).ok_or_else(|| format!("persistentvolume {name:?} not found"))?;
    let spec = pv.spec.unwrap_or_default();
    let ours =
        pv.metadata.annotations.as_ref().and_then(|a| a.get(api::kinds::persistentvolume::PROVISIONED_BY_ANNOTATION))
            == Some(&api::kinds::storageclass::LAB_PROVISIONER.to_string());
    if let Some(h) = spec.host_path {
        if ours {
            return Ok(Volume::Claimed(PathBuf::from(h.path)));
        }
        let t = h.type_.as_deref().unwrap_or("");
        return Ok(Volume::Host {
            path: PathBuf::from(&h.path),
            create: t == "DirectoryOrCreate",
            must_be: match t {
                "Directory" => Some("directory"),
                "File" => Some("file"),
                _ => None,
            },
        });
    }
    if let Some(l) = spec.local {
        return Ok(Volume::Host { path: PathBuf::from(l.path), create: false, must_be: Some("directory") });
    }
    Err(format!("volume {name:?} is of a type podpath's kubelet does not provide (hostPath and local are)"))
}

/// A relative path that stays inside its directory (for `items[].path` and `subPath`).
pub fn safe_relative(p: &str) -> Result<PathBuf, String> {
    let path = Path::new(p);
    if p.is_empty() || path.is_absolute() {
        return Err(format!("{p:?} must be a relative path"));
    }
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::CurDir => {}
            _ => return Err(format!("{p:?} must not contain '..'")),
        }
    }
    Ok(out)
}

fn mode_of(item: Option<i32>, default: Option<i32>) -> u32 {
    item.or(default).unwrap_or(0o644) as u32 & 0o7777
}

type Files = BTreeMap<String, (Vec<u8>, u32)>;

/// The files of a key-value source: every key, or the `items` (a missing key is an error
/// unless `optional`).
fn keyed(
    what: &str,
    data: &BTreeMap<String, Vec<u8>>,
    items: Option<&Vec<core::KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
    out: &mut Files,
) -> Result<(), String> {
    match items {
        None => {
            for (k, v) in data {
                out.insert(k.clone(), (v.clone(), mode_of(None, default_mode)));
            }
        }
        Some(items) => {
            for i in items {
                match data.get(&i.key) {
                    Some(v) => {
                        let path = safe_relative(&i.path)?;
                        out.insert(path.display().to_string(), (v.clone(), mode_of(i.mode, default_mode)));
                    }
                    None if optional => {}
                    None => {
                        return Err(format!("configmap references non-existent config key: {}", i.key)
                            .replace("configmap", what))
                    }
                }
            }
        }
    }
    Ok(())
}

/// A Secret's or ConfigMap's files (None: the object does not exist).
#[allow(clippy::too_many_arguments)]
fn project(
    kind: &str,
    name: &str,
    data: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&Vec<core::KeyToPath>>,
    default_mode: Option<i32>,
    optional: Option<bool>,
    out: &mut Files,
) -> Result<(), String> {
    let optional = optional == Some(true);
    match data {
        Some(d) => keyed(kind, &d, items, default_mode, optional, out),
        None if optional => Ok(()),
        None => Err(format!("{kind} {name:?} not found")),
    }
}

pub(crate) fn secret_data(s: &core::Secret) -> BTreeMap<String, Vec<u8>> {
    let mut d: BTreeMap<String, Vec<u8>> = s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    for (k, v) in s.string_data.iter().flatten() {
        d.insert(k.clone(), v.clone().into_bytes());
    }
    d
}

pub(crate) fn config_map_data(c: &core::ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut d: BTreeMap<String, Vec<u8>> =
        c.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone().into_bytes())).collect();
    for (k, v) in c.binary_data.iter().flatten() {
        d.insert(k.clone(), v.0.clone());
    }
    d
}

/// A downward API field of the pod, as text.
pub fn field(pod: &core::Pod, path: &str) -> Result<String, String> {
    let m = &pod.metadata;
    let map = |m: &Option<BTreeMap<String, String>>| {
        m.iter().flatten().map(|(k, v)| format!("{k}={v:?}")).collect::<Vec<_>>().join("\n")
    };
    let in_map = |m: &Option<BTreeMap<String, String>>, key: &str| {
        m.as_ref().and_then(|m| m.get(key)).cloned().unwrap_or_default()
    };
    Ok(match path {
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_else(|| "default".into()),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        "metadata.labels" => map(&m.labels),
        "metadata.annotations" => map(&m.annotations),
        "spec.nodeName" => pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => {
            pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into())
        }
        "status.podIP" => pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap_or_default(),
        "status.hostIP" => pod.status.as_ref().and_then(|s| s.host_ip.clone()).unwrap_or_default(),
        p => {
            if let Some(k) = p.strip_prefix("metadata.labels['").and_then(|k| k.strip_suffix("']")) {
                in_map(&m.labels, k)
            } else if let Some(k) = p.strip_prefix("metadata.annotations['").and_then(|k| k.strip_suffix("']")) {
                in_map(&m.annotations, k)
            } else {
                return Err(format!("unsupported fieldPath {p:?}"));
            }
        }
    })
}

fn downward(
    pod: &core::Pod,
    items: &[core::DownwardAPIVolumeFile],
    default_mode: Option<i32>,
    out: &mut Files,
) -> Result<(), String> {
    for i in items {
        let path = safe_relative(&i.path)?;
        let value = match (&i.field_ref, &i.resource_field_ref) {
            (Some(f), _) => field(pod, &f.field_path)?,
            // No resource accounting here: limits read as the node's (none), requests as 0.
            (None, Some(r)) if r.resource.starts_with("limits.") => "0".into(),
            (None, Some(_)) => "0".into(),
            (None, None) => return Err(format!("downwardAPI item {:?} has no fieldRef", i.path)),
        };
        out.insert(path.display().to_string(), (value.into_bytes(), mode_of(i.mode, default_mode)));
    }
    Ok(())
}

/// What each of the pod's volumes holds, by name; an error names the volume and says why, in
/// kubelet's words (`MountVolume.SetUp failed for volume "certs" : secret "nginxsecret" not found`).
pub fn plan(pod: &core::Pod, objects: &dyn Objects) -> Result<BTreeMap<String, Volume>, String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut out = BTreeMap::new();
    for v in pod.spec.as_ref().and_then(|s| s.volumes.as_ref()).into_iter().flatten() {
        let fail = |why: String| format!("MountVolume.SetUp failed for volume {:?} : {why}", v.name);
        let vol = if let Some(e) = &v.empty_dir {
            if e.medium.as_deref() == Some("Memory") {
                Volume::Tmpfs(e.size_limit.as_ref().and_then(|q| quantity_bytes(&q.0)))
            } else {
                Volume::Dir
            }
        } else if let Some(h) = &v.host_path {
            let t = h.type_.as_deref().unwrap_or("");
            Volume::Host {
                path: PathBuf::from(&h.path),
                create: t == "DirectoryOrCreate",
                must_be: match t {
                    "Directory" => Some("directory"),
                    "File" => Some("file"),
                    "Socket" => Some("socket"),
                    _ => None,
                },
            }
        } else if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let mut files = Files::new();
            let data = objects.secret(&ns, &name).map(|o| secret_data(&o));
            project("secret", &name, data, s.items.as_ref(), s.default_mode, s.optional, &mut files).map_err(&fail)?;
            Volume::Files(files)
        } else if let Some(c) = &v.config_map {
            let mut files = Files::new();
            let data = objects.config_map(&ns, &c.name).map(|o| config_map_data(&o));
            project("configmap", &c.name, data, c.items.as_ref(), c.default_mode, c.optional, &mut files)
                .map_err(&fail)?;
            Volume::Files(files)
        } else if let Some(d) = &v.downward_api {
            let mut files = Files::new();
            downward(pod, d.items.as_deref().unwrap_or_default(), d.default_mode, &mut files).map_err(&fail)?;
            Volume::Files(files)
        } else if let Some(p) = &v.projected {
            let mut files = Files::new();
            for src in p.sources.iter().flatten() {
                if let Some(s) = &src.secret {
                    let data = objects.secret(&ns, &s.name).map(|o| secret_data(&o));
                    project("secret", &s.name, data, s.items.as_ref(), p.default_mode, s.optional, &mut files)
                        .map_err(&fail)?;
                }
                if let Some(c) = &src.config_map {
                    let data = objects.config_map(&ns, &c.name).map(|o| config_map_data(&o));
                    project("configmap", &c.name, data, c.items.as_ref(), p.default_mode, c.optional, &mut files)
                        .map_err(&fail)?;
                }
                if let Some(d) = &src.downward_api {
                    downward(pod, d.items.as_deref().unwrap_or_default(), p.default_mode, &mut files).map_err(&fail)?;
                }
                if let Some(t) = &src.service_account_token {
                    let token = objects.token().ok_or_else(|| fail("no service account token to project".into()))?;
                    let path = safe_relative(&t.path).map_err(&fail)?;
                    files.insert(
                        path.display().to_string(),
                        (token.into_bytes(), mode_of(None, p.default_mode.or(Some(0o600)))),
                    );
                }
            }
            Volume::Files(files)
        } else if let Some(c) = &v.persistent_volume_claim {
            claimed(&ns, &c.claim_name, objects).map_err(&fail)?
        } else {
            // Other kinds (CSI, NFS…) are not provided by this node.
            return Err(fail("this volume type is not supported by podpath's kubelet".into()));
        };
        out.insert(v.name.clone(), vol);
    }
    Ok(out)
}

/// A Kubernetes quantity in bytes (`64Mi`, `1G`, `500k`, plain bytes).
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: f64 = num.parse().ok()?;
    let mult: f64 = match unit {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        _ => return None,
    };
    Some((n * mult) as u64)
}

/// Writes `files` into `dir` as kubelet's atomic writer does; returns whether anything
/// changed. The new content goes into a fresh `..<time>` directory, `..data` is switched to it
/// with one rename, the top-level links (`key -> ..data/key`) are made for new keys and removed
/// for gone ones, then the old directory goes.
pub fn write_files(dir: &Path, files: &Files) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let data = dir.join("..data");
    let current = std::fs::read_link(&data).ok();
    if let Some(cur) = &current {
        let same = {
            let mut found = BTreeMap::new();
            collect(&dir.join(cur), Path::new(""), &mut found)?;
            found.len() == files.len()
                && files.iter().all(|(k, (v, m))| found.get(k).is_some_and(|(fv, fm)| fv == v && fm == m))
        };
        if same {
            return Ok(false);
        }
    }
    let stamp = format!("..{}", jiff::Timestamp::now().strftime("%Y_%m_%d_%H_%M_%S.%f"));
    let new = dir.join(&stamp);
    std::fs::create_dir(&new)?;
    for (rel, (content, mode)) in files {
        let p = new.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, content)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode))?;
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, &data)?;
    // Top-level names: `a` for `a` and `a/b` alike.
    let tops: std::collections::BTreeSet<String> =
        files.keys().map(|k| k.split('/').next().unwrap_or(k).to_string()).collect();
    for t in &tops {
        let link = dir.join(t);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(t), &link)?;
        }
    }
    for e in std::fs::read_dir(dir)?.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if !n.starts_with("..") && !tops.contains(&n) {
            let _ = std::fs::remove_file(e.path());
        }
    }
    if let Some(cur) = current {
        let _ = std::fs::remove_dir_all(dir.join(cur));
    }
    Ok(true)
}

fn collect(dir: &Path, rel: &Path, out: &mut BTreeMap<String, (Vec<u8>, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir)?.flatten() {
        let r = rel.join(e.file_name());
        let m = e.metadata()?;
        if m.is_dir() {
            collect(&e.path(), &r, out)?;
        } else {
            out.insert(r.display().to_string(), (std::fs::read(e.path())?, m.permissions().mode() & 0o7777));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    struct Objs;
    impl Objects for Objs {
        fn secret(&self, ns: &str, name: &str) -> Option<core::Secret> {
            (ns == "default" && name == "nginxsecret").then(|| core::Secret {
                data: Some(BTreeMap::from([
                    ("tls.crt".to_string(), ByteString(b"CERT".to_vec())),
                    ("tls.key".to_string(), ByteString(b"KEY".to_vec())),
                ])),
                ..Default::default()
            })
        }
        fn config_map(&self, _: &str, name: &str) -> Option<core::ConfigMap> {
            (name == "nginxconfigmap").then(|| core::ConfigMap {
                data: Some(BTreeMap::from([("default.conf".to_string(), "server {}".to_string())])),
                ..Default::default()
            })
        }
        fn token(&self) -> Option<String> {
            Some("TOKEN".into())
        }
    }

    fn pod(volumes: serde_json::Value) -> core::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1", "labels": {"app": "web"}},
            "spec": {"containers": [], "volumes": volumes, "nodeName": "node-1"}
        }))
        .unwrap()
    }

    #[test]
    fn each_kind_of_volume_holds_what_kubelet_puts_there() {
        let p = pod(serde_json::json!([
            {"name": "scratch", "emptyDir": {}},
            {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
            {"name": "secret-volume", "secret": {"secretName": "nginxsecret", "defaultMode": 0o400}},
            {"name": "configmap-volume", "configMap": {"name": "nginxconfigmap", "items": [{"key": "default.conf", "path": "conf.d/default.conf"}]}},
            {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}, {"path": "node", "fieldRef": {"fieldPath": "spec.nodeName"}}]}},
            {"name": "sa", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}, {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
            {"name": "host", "hostPath": {"path": "/var/log", "type": "Directory"}},
        ]));
        let v = plan(&p, &Objs).unwrap();
        assert_eq!(v["scratch"], Volume::Dir);
        assert_eq!(v["ram"], Volume::Tmpfs(Some(64 << 20)));
        let Volume::Files(s) = &v["secret-volume"] else { panic!() };
        assert_eq!(s["tls.crt"], (b"CERT".to_vec(), 0o400));
        let Volume::Files(c) = &v["configmap-volume"] else { panic!() };
        assert_eq!(c["conf.d/default.conf"], (b"server {}".to_vec(), 0o644));
        let Volume::Files(d) = &v["info"] else { panic!() };
        assert_eq!((d["labels"].0.as_slice(), d["node"].0.as_slice()), (&b"app=\"web\""[..], &b"node-1"[..]));
        let Volume::Files(sa) = &v["sa"] else { panic!() };
        assert_eq!((sa["token"].clone(), sa["namespace"].0.clone()), ((b"TOKEN".to_vec(), 0o600), b"default".to_vec()));
        assert_eq!(v["host"], Volume::Host { path: "/var/log".into(), create: false, must_be: Some("directory") });
    }

    #[test]
    fn missing_objects_and_bad_paths_say_why() {
        let e =
            plan(&pod(serde_json::json!([{"name": "certs", "secret": {"secretName": "nope"}}])), &Objs).unwrap_err();
        assert_eq!(e, "MountVolume.SetUp failed for volume \"certs\" : secret \"nope\" not found");
        assert!(plan(
            &pod(serde_json::json!([{"name": "c", "secret": {"secretName": "nope", "optional": true}}])),
            &Objs
        )
        .is_ok());
        let e = plan(&pod(serde_json::json!([{"name": "c", "configMap": {"name": "nginxconfigmap", "items": [{"key": "x", "path": "y"}]}}])), &Objs)
            .unwrap_err();
        assert!(e.contains("configmap references non-existent config key: x"), "{e}");
        let e = plan(&pod(serde_json::json!([{"name": "c", "configMap": {"name": "nginxconfigmap", "items": [{"key": "default.conf", "path": "../../etc/x"}]}}])), &Objs)
            .unwrap_err();
        assert!(e.contains("must not contain '..'"), "{e}");
        assert!(safe_relative("/abs").is_err() && safe_relative("a/./b").is_ok());
    }

    #[test]
    fn the_atomic_writer_swaps_data_in_one_rename() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("vol");
        let mut files =
            Files::from([("a".to_string(), (b"1".to_vec(), 0o644)), ("sub/b".to_string(), (b"2".to_vec(), 0o600))]);
        assert!(write_files(&d, &files).unwrap());
        assert_eq!(std::fs::read(d.join("a")).unwrap(), b"1");
        assert_eq!(std::fs::read(d.join("sub/b")).unwrap(), b"2");
        assert_eq!(std::fs::read_link(d.join("a")).unwrap(), Path::new("..data/a"));
        assert!(!write_files(&d, &files).unwrap(), "the same content is not written again");
        files.remove("sub/b");
        files.insert("a".into(), (b"changed".to_vec(), 0o644));
        assert!(write_files(&d, &files).unwrap());
        assert_eq!(std::fs::read(d.join("a")).unwrap(), b"changed");
        assert!(!d.join("sub").exists(), "a gone key's link goes");
        let stamps = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("..2"))
            .count();
        assert_eq!(stamps, 1, "the old data directory is removed");
    }
}
