//! One content-addressed image store per lab, shared by its nodes (they are processes of one
//! host): each layer unpacked once into `layers/<hex>/` (named by its blob digest, renamed
//! into place only when complete, so a half-unpacked layer is never used), one record per
//! image in `images/<hex>.json` (named by its config digest, the image ID), and `leases/`
//! naming the layers that running containers stack, which removal keeps.
//!
//! Writers (the image service, `podpath image load|rm`) take `lock` (flock) for the records;
//! readers (the kubelets) read records without it, as each is replaced by a rename.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::error::{ImageError, Result};

/// What a container is made of, from the image's config (`config` in the OCI image config).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub entrypoint: Vec<String>,
    #[serde(default)]
    pub cmd: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub exposed_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
}

/// The OCI image config's fields that matter here (Docker's and OCI's names are the same).
#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    #[serde(default)]
    variant: Option<String>,
    #[serde(default)]
    config: Option<RawRunConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawRunConfig {
    user: Option<String>,
    env: Option<Vec<String>>,
    entrypoint: Option<Vec<String>>,
    cmd: Option<Vec<String>>,
    working_dir: Option<String>,
    exposed_ports: Option<serde_json::Map<String, serde_json::Value>>,
    stop_signal: Option<String>,
}

/// An image config blob, parsed: its platform (`linux/amd64`, `linux/arm64/v8`) and run config.
pub fn parse_config(raw: &[u8]) -> std::result::Result<(String, ImageConfig), String> {
    let c: RawConfig = serde_json::from_slice(raw).map_err(|e| format!("the image config is not valid: {e}"))?;
    if c.os.is_empty() || c.architecture.is_empty() {
        return Err("the image config names no os and architecture".into());
    }
    let mut platform = format!("{}/{}", c.os, c.architecture);
    if let Some(v) = c.variant.filter(|v| !v.is_empty()) {
        platform = format!("{platform}/{v}");
    }
    let r = c.config.unwrap_or(RawRunConfig {
        user: None,
        env: None,
        entrypoint: None,
        cmd: None,
        working_dir: None,
        exposed_ports: None,
        stop_signal: None,
    });
    Ok((
        platform,
        ImageConfig {
            user: r.user.filter(|u| !u.is_empty()),
            env: r.env.unwrap_or_default(),
            entrypoint: r.entrypoint.unwrap_or_default(),
            cmd: r.cmd.unwrap_or_default(),
            working_dir: r.working_dir.filter(|w| !w.is_empty()),
            exposed_ports: r.exposed_ports.map(|m| m.keys().cloned().collect()).unwrap_or_default(),
            stop_signal: r.stop_signal.filter(|s| !s.is_empty()),
        },
    ))
}

/// One stored image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRecord {
    /// The config's digest (`sha256:…`), the image ID.
    pub id: String,
    /// Normalised names (`docker.io/library/nginx:latest`).
    pub names: Vec<String>,
    /// `NAME@sha256:MANIFEST` for the names pulled from a registry.
    #[serde(default)]
    pub repo_digests: Vec<String>,
    /// Layer blob digests, the bottom layer first.
    pub layers: Vec<String>,
    pub config: ImageConfig,
    /// `os/arch[/variant]`.
    pub platform: String,
    /// Bytes of the layers as stored (compressed, as the registry served them).
    pub size: u64,
    /// Bytes of file content unpacked.
    pub unpacked: u64,
    pub created: Timestamp,
}

/// The hex part of a `sha256:` digest, or an error naming it (it becomes a path).
pub fn digest_hex(digest: &str) -> Result<&str> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) => Ok(h),
        _ => Err(ImageError::Config(format!("{digest:?} is not a sha256 digest"))),
    }
}

/// What [`Store::remove`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    Untagged(String),
    Deleted(Box<ImageRecord>),
}

/// What [`Store::free_space`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freed {
    /// The images removed, least recently used first.
    pub removed: Vec<ImageRecord>,
    /// The store's bytes on disk after.
    pub usage: u64,
}

/// A lab's image store.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// The store's write lock, held while it lives.
pub struct Locked(#[allow(dead_code)] nix::fcntl::Flock<fs::File>);

impl Store {
    /// Opens (creating) the store at `root`.
    pub fn open(root: impl Into<PathBuf>) -> Result<Store> {
        let root = root.into();
        for d in ["layers", "images", "leases", "tmp"] {
            let p = root.join(d);
            fs::create_dir_all(&p).map_err(|e| ImageError::io(format!("create {}", p.display()), e))?;
        }
        Ok(Store { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Takes the write lock (blocks while another writer holds it).
    pub fn lock(&self) -> Result<Locked> {
        let p = self.root.join("lock");
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .map_err(|e| ImageError::io(format!("open {}", p.display()), e))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map(Locked)
            .map_err(|(_, e)| ImageError::io(format!("lock {}", p.display()), e.into()))
    }

    /// Where a layer is (or will be) unpacked.
    pub fn layer_dir(&self, digest: &str) -> Result<PathBuf> {
        Ok(self.root.join("layers").join(digest_hex(digest)?))
    }

    pub fn has_layer(&self, digest: &str) -> bool {
        self.layer_dir(digest).is_ok_and(|d| d.is_dir())
    }

    /// A fresh directory under the store (same file system, so it can be renamed into place).
    pub fn temp_dir(&self) -> Result<tempfile::TempDir> {
        tempfile::Builder::new()
            .prefix("pull-")
            .tempdir_in(self.root.join("tmp"))
            .map_err(|e| ImageError::io(format!("create a directory in {}", self.root.join("tmp").display()), e))
    }

    /// Moves a complete unpacked layer into place (a concurrent writer's copy wins: same content).
    pub fn commit_layer(&self, digest: &str, dir: &Path) -> Result<()> {
        let dest = self.layer_dir(digest)?;
        match fs::rename(dir, &dest) {
            Ok(()) => Ok(()),
            Err(_) if dest.is_dir() => {
                let _ = fs::remove_dir_all(dir);
                Ok(())
            }
            Err(e) => Err(ImageError::io(format!("move the layer into {}", dest.display()), e)),
        }
    }

    /// Every stored image (unreadable records are skipped with a warning).
    pub fn list(&self) -> Result<Vec<ImageRecord>> {
        let dir = self.root.join("images");
        let entries = fs::read_dir(&dir).map_err(|e| ImageError::io(format!("read {}", dir.display()), e))?;
        let mut out = vec![];
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            match fs::read(&p)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
            {
                Ok(r) => out.push(r),
                Err(e) => tracing::warn!(path = %p.display(), "skipping an unreadable image record: {e}"),
            }
        }
        out.sort_by(|a: &ImageRecord, b| a.names.first().cmp(&b.names.first()).then(a.id.cmp(&b.id)));
        Ok(out)
    }

    /// The image a name (normalised here), a repo digest or an ID (or a prefix of one of at
    /// least 4 hex digits) designates.
    pub fn find(&self, image: &str) -> Result<Option<ImageRecord>> {
        let name = crate::reference::normalise(image).ok();
        let id = image.strip_prefix("sha256:").unwrap_or(image);
        let by_id = id.len() >= 4 && id.bytes().all(|b| b.is_ascii_hexdigit());
        Ok(self.list()?.into_iter().find(|r| {
            name.as_ref().is_some_and(|n| r.names.contains(n) || r.repo_digests.contains(n))
                || (by_id && r.id.trim_start_matches("sha256:").starts_with(id))
        }))
    }

    fn record_path(&self, id: &str) -> Result<PathBuf> {
        Ok(self.root.join("images").join(format!("{}.json", digest_hex(id)?)))
    }

    fn write_record(&self, r: &ImageRecord) -> Result<()> {
        let p = self.record_path(&r.id)?;
        let tmp = p.with_extension("json.tmp");
        let body = serde_json::to_vec_pretty(r).map_err(|e| ImageError::Config(e.to_string()))?;
        // Not fsynced, as the layers are not: the store is a cache of registries. A record a
        // crash left unreadable is skipped by `list`, and the image is pulled again.
        fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(&body))
            .and_then(|_| fs::rename(&tmp, &p))
            .map_err(|e| ImageError::io(format!("write {}", p.display()), e))
    }

    /// Stores an image's record (its layers already in place). Its names move to it from any
    /// other image, as a tag moves; an image left without names or digests is removed.
    pub fn put(&self, mut rec: ImageRecord) -> Result<()> {
        let _lock = self.lock()?;
        for mut other in self.list()? {
            if other.id == rec.id {
                for n in other.names {
                    if !rec.names.contains(&n) {
                        rec.names.push(n);
                    }
                }
                for d in other.repo_digests {
                    if !rec.repo_digests.contains(&d) {
                        rec.repo_digests.push(d);
                    }
                }
                continue;
            }
            let before = other.names.len();
            other.names.retain(|n| !rec.names.contains(n));
            if other.names.len() != before {
                if other.names.is_empty() {
                    let _ = fs::remove_file(self.record_path(&other.id)?);
                } else {
                    self.write_record(&other)?;
                }
            }
        }
        rec.names.sort();
        rec.repo_digests.sort();
        self.write_record(&rec)
    }

    /// Removes a name of an image (`Untagged`, when the image has others) or the image (by its
    /// last name or its ID) and the layers nothing else uses (`Deleted`), as `docker rmi` does.
    pub fn remove(&self, image: &str) -> Result<Option<Removed>> {
        let _lock = self.lock()?;
        let Some(mut rec) = self.find(image)? else { return Ok(None) };
        if let Ok(name) = crate::reference::normalise(image) {
            if rec.names.contains(&name) && rec.names.len() > 1 {
                rec.names.retain(|n| *n != name);
                self.write_record(&rec)?;
                return Ok(Some(Removed::Untagged(name)));
            }
        }
        fs::remove_file(self.record_path(&rec.id)?)
            .map_err(|e| ImageError::io(format!("remove image {}", rec.id), e))?;
        let _ = fs::remove_file(self.root.join("used").join(digest_hex(&rec.id)?));
        self.gc_layers_locked()?;
        Ok(Some(Removed::Deleted(Box::new(rec))))
    }

    /// Layers used by a record or a lease.
    fn used_layers(&self) -> Result<BTreeSet<String>> {
        let mut used: BTreeSet<String> = self
            .list()?
            .into_iter()
            .flat_map(|r| r.layers)
            .filter_map(|d| digest_hex(&d).ok().map(String::from))
            .collect();
        if let Ok(leases) = fs::read_dir(self.root.join("leases")) {
            for l in leases.flatten() {
                if let Ok(body) = fs::read(l.path()) {
                    if let Ok(layers) = serde_json::from_slice::<Vec<String>>(&body) {
                        used.extend(layers.iter().filter_map(|d| digest_hex(d).ok().map(String::from)));
                    }
                }
            }
        }
        Ok(used)
    }

    fn gc_layers_locked(&self) -> Result<u64> {
        let used = self.used_layers()?;
        let mut removed = 0;
        let dir = self.root.join("layers");
        for e in fs::read_dir(&dir).map_err(|e| ImageError::io(format!("read {}", dir.display()), e))?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !used.contains(&name) {
                fs::remove_dir_all(e.path())
                    .map_err(|err| ImageError::io(format!("remove layer sha256:{name}"), err))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Names the layers a container stacks, so removing its image keeps them until it is gone.
    pub fn lease(&self, container: &str, layers: &[String]) -> Result<()> {
        let p = self.root.join("leases").join(format!("{container}.json"));
        let body = serde_json::to_vec(layers).map_err(|e| ImageError::Config(e.to_string()))?;
        fs::write(&p, body).map_err(|e| ImageError::io(format!("write {}", p.display()), e))
    }

    /// Drops a container's lease (its layers may then be removed with their image).
    pub fn release(&self, container: &str) {
        let _ = fs::remove_file(self.root.join("leases").join(format!("{container}.json")));
    }

    /// Records the store's bound on disk (`None`: unbounded), for the CLI to show and apply.
    pub fn set_limit(&self, limit: Option<u64>) -> Result<()> {
        let p = self.root.join("limit");
        let r = match limit {
            Some(l) => fs::write(&p, format!("{l}\n")),
            None => {
                fs::remove_file(&p).or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
            }
        };
        r.map_err(|e| ImageError::io(format!("write {}", p.display()), e))
    }

    /// The store's bound on disk, as its image service was started with.
    pub fn limit(&self) -> Option<u64> {
        fs::read_to_string(self.root.join("limit")).ok().and_then(|t| t.trim().parse().ok())
    }

    /// Notes that a container started from image `id` now (the order in which
    /// [`Store::free_space`] removes images: least recently used first, as kubelet's image GC).
    pub fn mark_used(&self, id: &str) -> Result<()> {
        let dir = self.root.join("used");
        let p = dir.join(digest_hex(id)?);
        fs::create_dir_all(&dir)
            .and_then(|_| fs::File::create(&p))
            .map(drop)
            .map_err(|e| ImageError::io(format!("write {}", p.display()), e))
    }

    /// When image `rec` was last used by a container, or pulled.
    pub fn last_used(&self, rec: &ImageRecord) -> Timestamp {
        let used = digest_hex(&rec.id)
            .ok()
            .and_then(|h| fs::metadata(self.root.join("used").join(h)).ok())
            .and_then(|m| m.modified().ok())
            .and_then(|t| Timestamp::try_from(t).ok());
        used.map_or(rec.created, |u| u.max(rec.created))
    }

    /// The layer lists that running containers stack (each lease names its image's layers).
    fn leases(&self) -> Vec<Vec<String>> {
        let Ok(dir) = fs::read_dir(self.root.join("leases")) else { return vec![] };
        dir.flatten()
            .filter_map(|l| fs::read(l.path()).ok())
            .filter_map(|b| serde_json::from_slice::<Vec<String>>(&b).ok())
            .collect()
    }

    /// Keeps the store within `limit` bytes as kubelet's image garbage collection keeps a
    /// disk: once over it, removes images no container uses, least recently used first and
    /// never those of `keep`, until the store is at 80% of the limit (or nothing more may go).
    pub fn free_space(&self, limit: u64, keep: &[&str]) -> Result<Freed> {
        let mut usage = self.disk_usage();
        let mut freed = Freed { removed: vec![], usage };
        if usage <= limit {
            return Ok(freed);
        }
        let _lock = self.lock()?;
        let leases = self.leases();
        let mut candidates: Vec<(Timestamp, ImageRecord)> = self
            .list()?
            .into_iter()
            .filter(|r| !keep.contains(&r.id.as_str()) && !leases.contains(&r.layers))
            .map(|r| (self.last_used(&r), r))
            .collect();
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.id.cmp(&b.1.id)));
        let target = limit / 5 * 4;
        for (_, rec) in candidates {
            if usage <= target {
                break;
            }
            fs::remove_file(self.record_path(&rec.id)?)
                .map_err(|e| ImageError::io(format!("remove image {}", rec.id), e))?;
            if let Ok(h) = digest_hex(&rec.id) {
                let _ = fs::remove_file(self.root.join("used").join(h));
            }
            self.gc_layers_locked()?;
            usage = self.disk_usage();
            freed.removed.push(rec);
        }
        freed.usage = usage;
        Ok(freed)
    }

    /// Bytes the store takes on disk (unpacked layers and records).
    pub fn disk_usage(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(m) = fs::symlink_metadata(p) else { return 0 };
            if m.is_dir() {
                fs::read_dir(p).map(|d| d.flatten().map(|e| walk(&e.path())).sum()).unwrap_or(0)
            } else {
                use std::os::unix::fs::MetadataExt;
                m.blocks() * 512
            }
        }
        walk(&self.root)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: char, names: &[&str], layers: &[char]) -> ImageRecord {
        ImageRecord {
            id: format!("sha256:{}", id.to_string().repeat(64)),
            names: names.iter().map(|n| n.to_string()).collect(),
            repo_digests: vec![],
            layers: layers.iter().map(|l| format!("sha256:{}", l.to_string().repeat(64))).collect(),
            config: ImageConfig::default(),
            platform: "linux/amd64".into(),
            size: 1,
            unpacked: 1,
            created: Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_tag_moves_and_unused_layers_go_with_their_image() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        for l in ['1', '2', '3'] {
            fs::create_dir(s.layer_dir(&format!("sha256:{}", l.to_string().repeat(64))).unwrap()).unwrap();
        }
        s.put(rec('a', &["docker.io/library/web:1"], &['1', '2'])).unwrap();
        s.put(rec('b', &["docker.io/library/web:1", "docker.io/library/web:2"], &['1', '3'])).unwrap();
        // The tag moved to b; a had no other name and is gone.
        assert_eq!(s.list().unwrap().len(), 1);
        assert_eq!(s.find("web:1").unwrap().unwrap().id, format!("sha256:{}", "b".repeat(64)));
        assert_eq!(s.find("bbbb").unwrap().unwrap().names.len(), 2);
        assert!(s.find("web:3").unwrap().is_none());
        // A lease keeps layer 3 while its container runs.
        s.lease("ctr-1", &[format!("sha256:{}", "3".repeat(64))]).unwrap();
        assert_eq!(s.remove("web:2").unwrap(), Some(Removed::Untagged("docker.io/library/web:2".into())));
        assert!(matches!(s.remove("web:1").unwrap(), Some(Removed::Deleted(_))));
        let left: Vec<_> = fs::read_dir(dir.path().join("layers")).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("3".repeat(64))]);
        s.release("ctr-1");
        assert!(s.remove("web:2").unwrap().is_none());
    }

    #[test]
    fn over_its_limit_the_store_removes_unused_images_least_recently_used_first() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        // Four images of one 64 KiB layer each.
        for (i, l) in ['1', '2', '3', '4'].into_iter().enumerate() {
            let d = s.layer_dir(&format!("sha256:{}", l.to_string().repeat(64))).unwrap();
            fs::create_dir(&d).unwrap();
            fs::write(d.join("blob"), vec![7u8; 64 << 10]).unwrap();
            let mut r = rec(['a', 'b', 'c', 'd'][i], &[&format!("docker.io/library/img:{i}")], &[l]);
            r.created = Timestamp::UNIX_EPOCH + jiff::SignedDuration::from_secs(i as i64);
            s.put(r).unwrap();
        }
        let id = |c: char| format!("sha256:{}", c.to_string().repeat(64));
        let total = s.disk_usage();
        // Within the limit: nothing goes.
        assert!(s.free_space(total, &[]).unwrap().removed.is_empty());
        // a (oldest) is in use by a container, b was used just now, d was just pulled (kept):
        // c goes first, then b; a and d stay.
        s.lease("pod-ctr", &[format!("sha256:{}", "1".repeat(64))]).unwrap();
        s.mark_used(&id('b')).unwrap();
        let limit = total / 2;
        let freed = s.free_space(limit, &[&id('d')]).unwrap();
        let gone: Vec<&str> = freed.removed.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(gone, [id('c').as_str(), id('b').as_str()]);
        let left: Vec<String> = s.list().unwrap().into_iter().map(|r| r.id).collect();
        assert_eq!(left.len(), 2);
        assert!(left.contains(&id('a')) && left.contains(&id('d')));
        assert_eq!(freed.usage, s.disk_usage());
        // Nothing more may go: over the limit, the rest in use or kept.
        assert!(s.free_space(1, &[&id('d')]).unwrap().removed.is_empty());
        // The limit is the store's own setting.
        assert_eq!(s.limit(), None);
        s.set_limit(Some(10 << 30)).unwrap();
        assert_eq!(s.limit(), Some(10 << 30));
        s.set_limit(None).unwrap();
        assert_eq!(s.limit(), None);
    }

    #[test]
    fn configs_give_the_platform_and_run_settings() {
        let raw = br#"{"architecture":"arm64","os":"linux","variant":"v8","config":{"Env":["PATH=/bin"],"Entrypoint":["/docker-entrypoint.sh"],"Cmd":["nginx","-g","daemon off;"],"WorkingDir":"","ExposedPorts":{"80/tcp":{}},"StopSignal":"SIGQUIT"}}"#;
        let (platform, c) = parse_config(raw).unwrap();
        assert_eq!(platform, "linux/arm64/v8");
        assert_eq!(c.entrypoint, ["/docker-entrypoint.sh"]);
        assert_eq!(c.cmd.len(), 3);
        assert_eq!((c.working_dir, c.stop_signal.as_deref()), (None, Some("SIGQUIT")));
        assert_eq!(c.exposed_ports, ["80/tcp"]);
        assert!(parse_config(b"[]").is_err() && parse_config(b"{}").is_err());
        assert!(digest_hex("sha256:../../etc").is_err());
    }
}
