//! Pulling an image from a registry into the store, with the `oci-client` distribution client:
//! the manifest (an index resolved to this host's platform), the config, then each layer not
//! yet stored — streamed to a file with its size bounded and its digest checked, then
//! decompressed (gzip, zstd or none) and unpacked. A layer two pulls need at once is fetched
//! once. Credentials are tried as kubelet tries them: each that names the registry, in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::Digest;

use crate::error::{ImageError, Result};
use crate::reference::{self, Registries};
use crate::store::{digest_hex, parse_config, ImageRecord, Store};
use crate::unpack;

/// Bounds on what a pull may take.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest layer blob accepted (as the registry declares and sends it).
    pub max_layer_bytes: u64,
    /// Most file content one layer may unpack to (a decompression bomb stops here).
    pub max_unpacked_bytes: u64,
    /// A registry silent this long fails the pull.
    pub read_timeout: Duration,
    pub connect_timeout: Duration,
    /// The store's bound on disk (see [`Store::free_space`]); an image whose layers alone
    /// exceed it is refused before any download.
    pub store_bytes: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_layer_bytes: 2 << 30,
            max_unpacked_bytes: 8 << 30,
            read_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            store_bytes: None,
        }
    }
}

/// A registry login (from an `imagePullSecret`'s `.dockerconfigjson`, or the CLI).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credential {
    /// The registry it is for, normalised (`docker.io`, `host:port`).
    pub registry: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential({}@{})", self.username, self.registry)
    }
}

/// The credentials of a `kubernetes.io/dockerconfigjson` Secret's `.dockerconfigjson` (or a
/// `kubernetes.io/dockercfg`'s `.dockercfg`): `auths` entries with `auth` (base64 of
/// `user:password`) or `username` and `password`.
pub fn docker_config_credentials(json: &[u8]) -> std::result::Result<Vec<Credential>, String> {
    use base64::Engine;
    let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| format!("not JSON: {e}"))?;
    let auths = v.get("auths").unwrap_or(&v).as_object().ok_or("no \"auths\" object")?;
    let mut out = vec![];
    for (key, entry) in auths {
        let (mut username, mut password) = (
            entry.get("username").and_then(|u| u.as_str()).unwrap_or("").to_string(),
            entry.get("password").and_then(|u| u.as_str()).unwrap_or("").to_string(),
        );
        if let Some(auth) = entry.get("auth").and_then(|a| a.as_str()).filter(|a| !a.is_empty()) {
            let raw = base64::engine::general_purpose::STANDARD
                .decode(auth)
                .map_err(|e| format!("the auth of {key:?} is not base64: {e}"))?;
            let text = String::from_utf8(raw).map_err(|_| format!("the auth of {key:?} is not text"))?;
            let (u, p) = text.split_once(':').ok_or(format!("the auth of {key:?} is not user:password"))?;
            (username, password) = (u.to_string(), p.to_string());
        }
        out.push(Credential { registry: reference::credential_registry(key), username, password });
    }
    Ok(out)
}

/// This host's platform as images name it: (`linux`, `amd64`|`arm64`|…, variant).
pub fn host_platform() -> (&'static str, &'static str, Option<&'static str>) {
    match std::env::consts::ARCH {
        "x86_64" => ("linux", "amd64", None),
        "aarch64" => ("linux", "arm64", Some("v8")),
        "arm" => ("linux", "arm", Some("v7")),
        "x86" => ("linux", "386", None),
        "powerpc64" => ("linux", "ppc64le", None),
        "s390x" => ("linux", "s390x", None),
        "riscv64" => ("linux", "riscv64", None),
        other => ("linux", other, None),
    }
}

fn host_platform_text() -> String {
    let (os, arch, variant) = host_platform();
    variant.map_or(format!("{os}/{arch}"), |v| format!("{os}/{arch}/{v}"))
}

/// Whether a config's `os/arch[/variant]` runs here (an arm64 image without variant is v8).
fn platform_matches(platform: &str) -> bool {
    let (os, arch, variant) = host_platform();
    let mut parts = platform.split('/');
    let (o, a, v) = (parts.next(), parts.next(), parts.next());
    o == Some(os) && a == Some(arch) && (v.is_none() || variant.is_none() || v == variant)
}

/// The entry of an index for this host (the variant is preferred when given), else the
/// platforms offered.
pub fn choose_platform(entries: &[ImageIndexEntry]) -> std::result::Result<String, String> {
    let text = |e: &ImageIndexEntry| {
        e.platform.as_ref().map(|p| {
            let base = format!("{}/{}", p.os, p.architecture);
            p.variant.as_ref().map_or(base.clone(), |v| format!("{base}/{v}"))
        })
    };
    let candidates: Vec<(&ImageIndexEntry, String)> = entries.iter().filter_map(|e| text(e).map(|t| (e, t))).collect();
    let (_, _, variant) = host_platform();
    let exact = candidates.iter().find(|(_, t)| platform_matches(t) && variant.is_none_or(|v| t.ends_with(v)));
    exact.or_else(|| candidates.iter().find(|(_, t)| platform_matches(t))).map(|(e, _)| e.digest.clone()).ok_or_else(
        || {
            let offered: Vec<String> = candidates.iter().map(|(_, t)| t.clone()).collect();
            if offered.is_empty() {
                "no platforms".to_string()
            } else {
                offered.join(", ")
            }
        },
    )
}

/// What a pull did.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub record: ImageRecord,
    /// Bytes downloaded (layers already stored cost nothing).
    pub downloaded: u64,
    pub elapsed: Duration,
}

/// Registry clients kept at most (one per registry and login).
const MAX_CLIENTS: usize = 64;

/// Pulls images into a store.
pub struct Puller {
    store: Store,
    registries: Registries,
    limits: Limits,
    clients: Mutex<HashMap<(String, String), Arc<Client>>>,
    layer_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// A registry's error, in the words containerd uses for it.
fn describe(image: &str, e: &oci_client::errors::OciDistributionError) -> String {
    use oci_client::errors::OciDistributionError as E;
    let text = e.to_string();
    match e {
        E::ImageManifestNotFoundError(_) => format!("{image}: not found"),
        E::AuthenticationFailure(m) => {
            format!("pull access denied, repository does not exist or may require authorization: {m}")
        }
        E::UnauthorizedError { .. } => {
            "pull access denied, repository does not exist or may require authorization: authorization failed".into()
        }
        E::RegistryError { envelope, .. } => {
            let codes: Vec<String> = envelope.errors.iter().map(|x| format!("{:?}", x.code)).collect();
            if codes.iter().any(|c| c.contains("ManifestUnknown") || c.contains("NameUnknown")) {
                format!("{image}: not found")
            } else if codes.iter().any(|c| c.contains("Unauthorized") || c.contains("Denied")) {
                format!("pull access denied, repository does not exist or may require authorization: {text}")
            } else {
                text
            }
        }
        E::RequestError(r) => {
            let mut msg = r.to_string();
            let mut src = std::error::Error::source(r);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            if r.is_timeout() {
                format!("the registry did not answer in time: {msg}")
            } else {
                msg
            }
        }
        _ => text,
    }
}

impl Puller {
    pub fn new(store: Store, registries: Registries, limits: Limits) -> Puller {
        // reqwest's rustls has no provider of its own here: the workspace's ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // Read the trusted roots now, not during the first pull.
        native_roots();
        Puller { store, registries, limits, clients: Mutex::default(), layer_locks: Mutex::default() }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn registries(&self) -> &Registries {
        &self.registries
    }

    /// One client per (registry, login): its token cache is for that login only, so a pod
    /// without the secret (or with a wrong one) never rides on another's token. `login` is a
    /// digest of the user and password ("" anonymous).
    fn client(&self, host: &str, login: &str) -> Arc<Client> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded: logins come from pods' secrets; past this many, clients start afresh.
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients
            .entry((host.to_string(), login.to_string()))
            .or_insert_with(|| {
                Arc::new(Client::new(ClientConfig {
                    protocol: ClientProtocol::HttpsExcept(self.registries.plain_http.clone()),
                    // Indexes are resolved here (choose_platform), so no entry is picked silently.
                    platform_resolver: None,
                    read_timeout: Some(self.limits.read_timeout),
                    connect_timeout: Some(self.limits.connect_timeout),
                    user_agent: concat!("podpath/", env!("CARGO_PKG_VERSION")),
                    tls_certs_only: native_roots().to_vec(),
                    ..ClientConfig::default()
                }))
            })
            .clone()
    }

    /// Pulls `image` (any reference form), trying `credentials` for its registry in order,
    /// then anonymously when none names it.
    pub async fn pull(&self, image: &str, credentials: &[Credential]) -> Result<Pulled> {
        let started = Instant::now();
        let reference = reference::parse(image)?;
        let name = reference.whole();
        let routed = self.registries.route(reference.clone());
        let host = routed.resolve_registry().to_string();
        let mut auths: Vec<(String, RegistryAuth)> = credentials
            .iter()
            .filter(|c| c.registry == reference.registry() || c.registry == host)
            .map(|c| {
                // The client (and the tokens it keeps) belongs to this exact login: a wrong
                // password never rides on a token the right one earned, nor spoils its client.
                let login = format!("{:x}", sha2::Sha256::digest(format!("{}\0{}", c.username, c.password)));
                (login, RegistryAuth::Basic(c.username.clone(), c.password.clone()))
            })
            .collect();
        if auths.is_empty() {
            auths.push((String::new(), RegistryAuth::Anonymous));
        }
        let mut last = None;
        for (login, auth) in auths {
            let client = self.client(&host, &login);
            match self.resolve(&client, &routed, &auth, &name).await {
                Ok(resolved) => {
                    let (record, downloaded) = self.fetch(&client, &routed, &name, resolved).await?;
                    return Ok(Pulled { record, downloaded, elapsed: started.elapsed() });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ImageError::Config("no credentials to try".into())))
    }

    /// The image manifest for this host, its digest and config.
    async fn resolve(
        &self,
        client: &Client,
        r: &Reference,
        auth: &RegistryAuth,
        name: &str,
    ) -> Result<(oci_client::manifest::OciImageManifest, String, Vec<u8>, String)> {
        let fail = |message: String| ImageError::Resolve { image: name.to_string(), message };
        let (manifest, digest) = client.pull_manifest(r, auth).await.map_err(|e| fail(describe(name, &e)))?;
        let (manifest, digest) = match manifest {
            OciManifest::Image(m) => (m, digest),
            OciManifest::ImageIndex(index) => {
                let chosen = choose_platform(&index.manifests).map_err(|offered| ImageError::Platform {
                    image: name.to_string(),
                    platform: host_platform_text(),
                    offered,
                })?;
                match client.pull_manifest(&r.clone_with_digest(chosen.clone()), auth).await {
                    Ok((OciManifest::Image(m), _)) => (m, chosen),
                    Ok(_) => return Err(fail(format!("{chosen}: an index inside an index"))),
                    Err(e) => return Err(fail(describe(name, &e))),
                }
            }
        };
        if manifest.config.size > 4 << 20 {
            return Err(fail(format!("the image config is {} bytes, more than 4 MiB", manifest.config.size)));
        }
        let mut config = Vec::new();
        client.pull_blob(r, &manifest.config, &mut config).await.map_err(|e| fail(describe(name, &e)))?;
        let (platform, _) = parse_config(&config).map_err(fail)?;
        if !platform_matches(&platform) {
            return Err(ImageError::Platform {
                image: name.to_string(),
                platform: host_platform_text(),
                offered: platform,
            });
        }
        Ok((manifest, digest, config, platform))
    }

    async fn fetch(
        &self,
        client: &Client,
        r: &Reference,
        name: &str,
        (manifest, digest, config, platform): (oci_client::manifest::OciImageManifest, String, Vec<u8>, String),
    ) -> Result<(ImageRecord, u64)> {
        let (_, run) =
            parse_config(&config).map_err(|m| ImageError::Resolve { image: name.to_string(), message: m })?;
        let declared: u64 = manifest.layers.iter().map(|l| l.size.max(0) as u64).sum();
        if let Some(limit) = self.limits.store_bytes.filter(|l| declared > *l) {
            return Err(ImageError::Resolve {
                image: name.to_string(),
                message: format!(
                    "its layers are {} bytes, more than the image store's limit of {limit} bytes (podpath up --image-store-limit)",
                    declared
                ),
            });
        }
        // The layers at once (each unpacks on a blocking thread as its download ends), as
        // containerd and skopeo fetch them.
        let fetched =
            futures::future::try_join_all(manifest.layers.iter().map(|layer| self.layer(client, r, name, layer)))
                .await?;
        let (downloaded, unpacked) = fetched.iter().fold((0, 0), |(d, u), (a, b)| (d + a, u + b));
        let id = format!("sha256:{:x}", sha2::Sha256::digest(config));
        let repo = name.split('@').next().unwrap_or(name);
        let repo = repo.rsplit_once(':').filter(|(_, t)| !t.contains('/')).map_or(repo, |(n, _)| n);
        let record = ImageRecord {
            id,
            names: vec![name.to_string()],
            repo_digests: vec![format!("{repo}@{digest}")],
            layers: manifest.layers.iter().map(|l| l.digest.clone()).collect(),
            config: run,
            platform,
            size: manifest.layers.iter().map(|l| l.size.max(0) as u64).sum(),
            unpacked,
            created: jiff::Timestamp::now(),
        };
        let store = self.store.clone();
        let rec = record.clone();
        tokio::task::spawn_blocking(move || store.put(rec))
            .await
            .map_err(|e| ImageError::Config(format!("storing {name}: {e}")))??;
        if let Some(limit) = self.limits.store_bytes {
            let (store, id) = (self.store.clone(), record.id.clone());
            match tokio::task::spawn_blocking(move || store.free_space(limit, &[id.as_str()])).await {
                Ok(Ok(f)) => {
                    for r in &f.removed {
                        tracing::info!(image = %r.id, names = ?r.names, "image garbage collection: removed, unused, to keep the store within {limit} bytes");
                    }
                    if f.usage > limit {
                        tracing::warn!(
                            "the image store holds {} bytes, over its limit of {limit}: the images left are in use",
                            f.usage
                        );
                    }
                }
                Ok(Err(e)) => tracing::warn!("image garbage collection: {e}"),
                Err(e) => tracing::warn!("image garbage collection: {e}"),
            }
        }
        Ok((record, downloaded))
    }

    /// Makes sure one layer is unpacked in the store; returns (bytes downloaded, unpacked).
    async fn layer(&self, client: &Client, r: &Reference, name: &str, desc: &OciDescriptor) -> Result<(u64, u64)> {
        let fail = |reason: String| ImageError::Layer { image: name.to_string(), digest: desc.digest.clone(), reason };
        digest_hex(&desc.digest).map_err(|e| fail(e.to_string()))?;
        let lock = {
            let mut locks = self.layer_locks.lock().unwrap_or_else(|e| e.into_inner());
            locks.entry(desc.digest.clone()).or_default().clone()
        };
        let _held = lock.lock().await;
        if self.store.has_layer(&desc.digest) {
            return Ok((0, 0));
        }
        let declared = u64::try_from(desc.size).map_err(|_| fail(format!("its size {} is negative", desc.size)))?;
        if declared > self.limits.max_layer_bytes {
            return Err(fail(format!(
                "it is {declared} bytes, more than the limit of {} bytes",
                self.limits.max_layer_bytes
            )));
        }
        let compression = match desc.media_type.as_str() {
            "application/vnd.oci.image.layer.v1.tar" | "application/vnd.docker.image.rootfs.diff.tar" => {
                Compression::None
            }
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Compression::Gzip,
            "application/vnd.oci.image.layer.v1.tar+zstd" => Compression::Zstd,
            other => return Err(fail(format!("unsupported layer media type {other:?}"))),
        };
        let tmp = self.store.temp_dir()?;
        let dir = tmp.path().join("rootfs");
        let mut stream = client.pull_blob_stream(r, desc).await.map_err(|e| fail(describe(name, &e)))?;
        // Unpacked while it downloads, on a blocking thread fed through a bounded channel; the
        // layer is only committed once its size and digest are checked (until then it is a
        // temporary directory nothing uses).
        let (tx, rx) = std::sync::mpsc::sync_channel::<bytes::Bytes>(64);
        let max = self.limits.max_unpacked_bytes;
        let out = dir.clone();
        let unpacker =
            tokio::task::spawn_blocking(move || unpack_reader(ChannelReader::new(rx), &out, compression, max));
        let mut hasher = sha2::Sha256::new();
        let mut got: u64 = 0;
        let mut failed = None;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    let timeout = e.kind() == std::io::ErrorKind::TimedOut || e.to_string().contains("timed out");
                    failed = Some(fail(if timeout {
                        format!("the registry stopped sending: {e}")
                    } else if e.to_string().contains("digest") {
                        // The client checks the digest as the stream ends.
                        format!("digest mismatch: {e}")
                    } else {
                        e.to_string()
                    }));
                    break;
                }
            };
            got += chunk.len() as u64;
            if got > declared {
                failed = Some(fail(format!("the registry sent more than the {declared} bytes the manifest declares")));
                break;
            }
            hasher.update(&chunk);
            if tx.send(chunk).is_err() {
                break; // the unpacker stopped: its error says why
            }
        }
        drop(tx);
        let unpacked = unpacker.await.map_err(|e| fail(e.to_string()))?;
        if let Some(e) = failed {
            return Err(e);
        }
        let unpacked = unpacked.map_err(fail)?;
        if got != declared {
            return Err(fail(format!("the registry sent {got} bytes, the manifest declares {declared}")));
        }
        let actual = format!("sha256:{:x}", hasher.finalize());
        if actual != desc.digest {
            return Err(fail(format!("digest mismatch: the content is {actual}")));
        }
        self.store.commit_layer(&desc.digest, &dir)?;
        Ok((got, unpacked))
    }
}

/// How a layer blob is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

/// Reads the chunks a channel brings, in order, until its sender is dropped.
struct ChannelReader {
    rx: std::sync::mpsc::Receiver<bytes::Bytes>,
    current: bytes::Bytes,
}

impl ChannelReader {
    fn new(rx: std::sync::mpsc::Receiver<bytes::Bytes>) -> ChannelReader {
        ChannelReader { rx, current: bytes::Bytes::new() }
    }
}

impl std::io::Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.recv() {
                Ok(c) => self.current = c,
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// Unpacks a layer blob file into `dir` (created); returns the bytes of file content.
pub fn unpack_file(
    blob: &std::path::Path,
    dir: &std::path::Path,
    c: Compression,
    max: u64,
) -> std::result::Result<u64, String> {
    let f = std::fs::File::open(blob).map_err(|e| format!("cannot read the blob: {e}"))?;
    unpack_reader(f, dir, c, max)
}

/// Unpacks a layer blob read from `input` into `dir` (created); returns the bytes of file
/// content. The rest of the input is read to its end, so a writer feeding it never blocks.
/// A compressed blob is decompressed on a thread of its own, ahead of the files being written
/// (decompression is a pull's critical path: one stream, one core).
pub fn unpack_reader(
    input: impl std::io::Read + Send + 'static,
    dir: &std::path::Path,
    c: Compression,
    max: u64,
) -> std::result::Result<u64, String> {
    let mut f = std::io::BufReader::with_capacity(1 << 16, input);
    if let Err(e) = std::fs::create_dir(dir) {
        let _ = std::io::copy(&mut f, &mut std::io::sink());
        return Err(format!("cannot create {}: {e}", dir.display()));
    }
    if c == Compression::None {
        let done = unpack::unpack(&mut f, dir, max);
        let _ = std::io::copy(&mut f, &mut std::io::sink());
        return Ok(done.map_err(|e| e.to_string())?.bytes);
    }
    let (tx, rx) = std::sync::mpsc::sync_channel::<bytes::Bytes>(8);
    let decoder = std::thread::Builder::new()
        .name("layer-decompress".into())
        .spawn(move || decompress(f, c, tx))
        .map_err(|e| format!("cannot start decompressing: {e}"))?;
    let mut plain = ChannelReader::new(rx);
    let done = unpack::unpack(&mut plain, dir, max);
    // Drain what is left (tar padding, or everything after an error) so the decoder ends.
    let _ = std::io::copy(&mut plain, &mut std::io::sink());
    drop(plain);
    let decoded = decoder.join().map_err(|_| "the decompressor failed".to_string())?;
    // A broken stream explains a short tar better than the tar's own error does.
    decoded?;
    Ok(done.map_err(|e| e.to_string())?.bytes)
}

/// Decompresses `input` into chunks sent to `tx` until its end (or until the receiver goes);
/// then reads the input to its end, so its feeder never blocks.
fn decompress(
    mut input: impl std::io::BufRead,
    c: Compression,
    tx: std::sync::mpsc::SyncSender<bytes::Bytes>,
) -> std::result::Result<(), String> {
    use std::io::Read;
    let copy = |r: &mut dyn Read| -> std::result::Result<(), String> {
        loop {
            let mut buf = vec![0u8; 128 << 10];
            let mut n = 0;
            while n < buf.len() {
                match r.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(format!("cannot decompress the layer: {e}")),
                }
            }
            if n == 0 {
                return Ok(());
            }
            buf.truncate(n);
            if tx.send(bytes::Bytes::from(buf)).is_err() {
                return Ok(()); // the unpacker stopped: its error says why
            }
        }
    };
    let r = match c {
        Compression::None => copy(&mut input),
        Compression::Gzip => copy(&mut flate2::bufread::MultiGzDecoder::new(&mut input)),
        Compression::Zstd => match ruzstd::decoding::StreamingDecoder::new(&mut input) {
            Ok(mut z) => copy(&mut z),
            Err(e) => Err(format!("not a zstd stream: {e}")),
        },
    };
    drop(tx);
    let _ = std::io::copy(&mut input, &mut std::io::sink());
    r
}

/// The host's trusted roots, read once per process: each client would otherwise read and
/// parse the whole of /etc/ssl/certs again (milliseconds per registry and login). Empty when
/// none are found: the client then falls back to its own lookup.
fn native_roots() -> &'static [oci_client::client::Certificate] {
    static ROOTS: std::sync::OnceLock<Vec<oci_client::client::Certificate>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        for e in &found.errors {
            tracing::debug!("trusted roots: {e}");
        }
        found
            .certs
            .into_iter()
            .map(|c| oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Der,
                data: c.as_ref().to_vec(),
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_secrets_give_their_logins() {
        let json = br#"{"auths":{"https://index.docker.io/v1/":{"auth":"dTpwOng="},"reg.example:5000":{"username":"a","password":"b"}}}"#;
        let mut c = docker_config_credentials(json).unwrap();
        c.sort_by(|a, b| a.registry.cmp(&b.registry));
        assert_eq!((c[0].registry.as_str(), c[0].username.as_str(), c[0].password.as_str()), ("docker.io", "u", "p:x"));
        assert_eq!((c[1].registry.as_str(), c[1].username.as_str()), ("reg.example:5000", "a"));
        assert!(format!("{:?}", c[0]).find("p:x").is_none(), "a password is never printed");
        assert!(docker_config_credentials(b"{\"auths\":{\"x\":{\"auth\":\"***\"}}}").is_err());
    }

    fn entry(arch: &str, variant: Option<&str>, digest: &str) -> ImageIndexEntry {
        serde_json::from_value(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": 1,
            "platform": {"os": "linux", "architecture": arch, "variant": variant}
        }))
        .unwrap()
    }

    #[test]
    fn an_index_gives_this_hosts_platform_or_says_what_it_offers() {
        let (_, arch, _) = host_platform();
        let other = if arch == "amd64" { "arm64" } else { "amd64" };
        let idx = vec![entry(other, None, "sha256:o"), entry(arch, None, "sha256:h"), entry("s390x", None, "sha256:s")];
        assert_eq!(choose_platform(&idx).unwrap(), "sha256:h");
        let err = choose_platform(&[entry(other, None, "sha256:o"), entry("s390x", None, "sha256:s")]).unwrap_err();
        assert_eq!(err, format!("linux/{other}, linux/s390x"));
        assert!(platform_matches(&host_platform_text()));
        assert!(!platform_matches(&format!("linux/{other}")));
    }
}
