//! `podpath image load FILE`: images from an archive into the store, without a registry
//! (`kind load docker-image`'s role, for offline classrooms). Both forms `docker save` and
//! `skopeo copy … docker-archive:`/`oci-archive:` write are read: `manifest.json` (Docker's:
//! config, tags, layer files) and an OCI image layout (`index.json`, `blobs/sha256/…`). The
//! archive is unpacked into the store's temporary directory first (its members are read in
//! any order), every blob's digest is checked, and layers are unpacked as pulled ones are.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::Digest;

use crate::error::{ImageError, Result};
use crate::pull::{choose_platform, unpack_file, Compression};
use crate::reference;
use crate::store::{parse_config, ImageRecord, Store};

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    layers: Vec<String>,
}

fn bad(path: &Path, reason: impl Into<String>) -> ImageError {
    ImageError::Archive { path: path.display().to_string(), reason: reason.into() }
}

/// A member of the unpacked archive, refusing names that leave it.
fn member(root: &Path, name: &str, archive: &Path) -> Result<PathBuf> {
    let rel = crate::unpack::entry_path(Path::new(name)).map_err(|e| bad(archive, e.to_string()))?;
    Ok(root.join(rel))
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(format!("sha256:{:x}", h.finalize()))
}

/// How a blob file is compressed, from its first bytes.
fn sniff(path: &Path) -> std::io::Result<Compression> {
    let mut head = [0u8; 4];
    let n = std::fs::File::open(path)?.read(&mut head)?;
    Ok(match &head[..n] {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd] => Compression::Zstd,
        _ => Compression::None,
    })
}

/// Loads every image of the archive at `path`; returns their records.
pub fn load(store: &Store, path: &Path, max_unpacked: u64) -> Result<Vec<ImageRecord>> {
    let tmp = store.temp_dir()?;
    let root = tmp.path().join("archive");
    std::fs::create_dir(&root).map_err(|e| ImageError::io(format!("create {}", root.display()), e))?;
    let file = std::fs::File::open(path).map_err(|e| ImageError::io(format!("open {}", path.display()), e))?;
    // The archive itself may be gzip-compressed (`docker save | gzip`).
    let mut head = [0u8; 2];
    let compressed =
        std::fs::File::open(path).and_then(|mut f| f.read(&mut head)).is_ok_and(|n| n == 2 && head == [0x1f, 0x8b]);
    let reader: Box<dyn Read> =
        if compressed { Box::new(flate2::read::MultiGzDecoder::new(file)) } else { Box::new(file) };
    crate::unpack::unpack(reader, &root, max_unpacked.saturating_mul(4))
        .map_err(|e| bad(path, format!("not a readable image archive: {e}")))?;
    let manifest = root.join("manifest.json");
    let records = if manifest.is_file() {
        let text = std::fs::read(&manifest).map_err(|e| ImageError::io("read manifest.json", e))?;
        let entries: Vec<DockerEntry> =
            serde_json::from_slice(&text).map_err(|e| bad(path, format!("manifest.json: {e}")))?;
        let mut out = vec![];
        for e in entries {
            let config = member(&root, &e.config, path)?;
            let layers = e.layers.iter().map(|l| member(&root, l, path)).collect::<Result<Vec<_>>>()?;
            let names = e.repo_tags.unwrap_or_default();
            out.push(import(store, path, &config, &layers, &names, max_unpacked)?);
        }
        out
    } else if root.join("index.json").is_file() {
        oci_layout(store, path, &root, max_unpacked)?
    } else {
        return Err(bad(path, "neither a `docker save` archive (manifest.json) nor an OCI layout (index.json)"));
    };
    if records.is_empty() {
        return Err(bad(path, "the archive holds no image"));
    }
    Ok(records)
}

fn oci_layout(store: &Store, path: &Path, root: &Path, max: u64) -> Result<Vec<ImageRecord>> {
    let blob = |digest: &str| -> Result<PathBuf> {
        let hex = crate::store::digest_hex(digest).map_err(|e| bad(path, e.to_string()))?;
        Ok(root.join("blobs/sha256").join(hex))
    };
    let read_json = |p: &Path| -> Result<serde_json::Value> {
        let b = std::fs::read(p).map_err(|e| ImageError::io(format!("read {}", p.display()), e))?;
        serde_json::from_slice(&b).map_err(|e| bad(path, format!("{}: {e}", p.display())))
    };
    let index = read_json(&root.join("index.json"))?;
    let mut out = vec![];
    for m in index["manifests"].as_array().cloned().unwrap_or_default() {
        let name = m["annotations"]["io.containerd.image.name"]
            .as_str()
            .or(m["annotations"]["org.opencontainers.image.ref.name"].as_str())
            .map(String::from);
        let mut manifest = read_json(&blob(m["digest"].as_str().unwrap_or(""))?)?;
        if manifest["manifests"].is_array() {
            // An index: this host's platform.
            let entries: Vec<oci_client::manifest::ImageIndexEntry> =
                serde_json::from_value(manifest["manifests"].clone())
                    .map_err(|e| bad(path, format!("an index: {e}")))?;
            let chosen = choose_platform(&entries).map_err(|offered| ImageError::Platform {
                image: name.clone().unwrap_or_else(|| path.display().to_string()),
                platform: "this host's".into(),
                offered,
            })?;
            manifest = read_json(&blob(&chosen)?)?;
        }
        let config = blob(manifest["config"]["digest"].as_str().unwrap_or(""))?;
        let layers = manifest["layers"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|l| blob(l["digest"].as_str().unwrap_or("")))
            .collect::<Result<Vec<_>>>()?;
        // A bare tag (`1.0`) names nothing by itself: the file's name stands in.
        let names: Vec<String> = name.into_iter().filter(|n| n.contains('/') || n.contains(':')).collect();
        out.push(import(store, path, &config, &layers, &names, max)?);
    }
    Ok(out)
}

/// Stores one image: its layers (by the digest of their files) and its record.
fn import(
    store: &Store,
    path: &Path,
    config: &Path,
    layers: &[PathBuf],
    names: &[String],
    max: u64,
) -> Result<ImageRecord> {
    let raw = std::fs::read(config).map_err(|e| ImageError::io(format!("read {}", config.display()), e))?;
    let (platform, run) = parse_config(&raw).map_err(|e| bad(path, e))?;
    let mut digests = vec![];
    let (mut size, mut unpacked) = (0u64, 0u64);
    for l in layers {
        let digest = sha256_file(l).map_err(|e| ImageError::io(format!("read {}", l.display()), e))?;
        // In an OCI layout a blob's name is its digest: a mismatch is a corrupt archive.
        if let Some(named) = l.file_name().and_then(|n| n.to_str()).filter(|n| n.len() == 64) {
            if l.parent().is_some_and(|p| p.ends_with("blobs/sha256")) && format!("sha256:{named}") != digest {
                return Err(bad(path, format!("blob {named} does not match its digest ({digest})")));
            }
        }
        size += std::fs::metadata(l).map(|m| m.len()).unwrap_or(0);
        if !store.has_layer(&digest) {
            let dir = store.temp_dir()?;
            let out = dir.path().join("rootfs");
            let c = sniff(l).map_err(|e| ImageError::io(format!("read {}", l.display()), e))?;
            unpacked += unpack_file(l, &out, c, max).map_err(|reason| ImageError::Layer {
                image: path.display().to_string(),
                digest: digest.clone(),
                reason,
            })?;
            store.commit_layer(&digest, &out)?;
        }
        digests.push(digest);
    }
    let names = names.iter().map(|n| reference::normalise(n)).collect::<Result<Vec<_>>>()?;
    let record = ImageRecord {
        id: format!("sha256:{:x}", sha2::Sha256::digest(&raw)),
        names,
        repo_digests: vec![],
        layers: digests,
        config: run,
        platform,
        size,
        unpacked,
        created: jiff::Timestamp::now(),
    };
    store.put(record.clone())?;
    Ok(record)
}
