//! A real OCI registry for tests (Debian's `docker-registry`, the CNCF distribution server) on
//! the host's loopback at a free port, and images built offline to push into it: a busybox
//! from `busybox-static`, one with two platforms, one with a zstd layer, one with a layer that
//! lies about its digest. The registry process is stopped (by PID) and its storage removed when
//! the guard drops.

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{ImageIndexEntry, OciImageIndex, OciManifest, Platform};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

/// A running registry.
pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    child: Child,
    _dir: tempfile::TempDir,
}

/// A file of an image layer.
pub enum Entry {
    File { path: String, mode: u32, data: Vec<u8> },
    Dir { path: String },
    Link { path: String, target: String },
}

/// An image to push: layers (bottom first, each a list of entries) and its config.
pub struct TestImage {
    pub layers: Vec<Vec<Entry>>,
    pub cmd: Vec<String>,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    pub user: Option<String>,
    pub working_dir: Option<String>,
    pub architecture: String,
    /// zstd instead of gzip for every layer.
    pub zstd: bool,
}

/// This host's architecture as images name it.
pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The shared libraries a program of the host loads (`ldd`), by absolute path.
fn libraries_of(program: &str) -> Vec<String> {
    let out = Command::new("ldd").arg(program).output().expect("ldd");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')).map(String::from))
        .collect()
}

/// A busybox image made offline from the host's Debian `busybox` (`/bin/busybox`, dynamically
/// linked) and the glibc it loads — so names resolve through glibc's resolver as in a real
/// image — with every applet linked in `/bin`, glibc's `getent` and coreutils' `printenv` (the
/// tutorials use both), an `/etc/os-release` naming it, passwd and group files, and
/// `Cmd: ["sh"]` as the real busybox image has.
/// A directory entry for each level of `dir` (`a`, `a/b`, `a/b/c`), so the tar has owners and
/// modes for all of them.
fn dir_levels(dir: &str) -> Vec<Entry> {
    let mut at = String::new();
    let mut out = vec![];
    for part in dir.trim_start_matches('/').split('/').filter(|p| !p.is_empty()) {
        at = if at.is_empty() { part.to_string() } else { format!("{at}/{part}") };
        out.push(Entry::Dir { path: at.clone() });
    }
    out
}

pub fn busybox() -> TestImage {
    let bin = "/bin/busybox";
    assert!(Path::new(bin).is_file(), "busybox is installed (apt-get install busybox)");
    let file = |path: &str, mode: u32| Entry::File {
        path: path.trim_start_matches('/').to_string(),
        mode,
        data: std::fs::read(path).unwrap_or_else(|e| panic!("read {path}: {e}")),
    };
    let mut entries = vec![
        Entry::Dir { path: "bin".into() },
        file(bin, 0o755),
        Entry::Dir { path: "usr/bin".into() },
        file("/usr/bin/getent", 0o755),
        file("/usr/bin/printenv", 0o755),
        Entry::Dir { path: "etc".into() },
        Entry::File {
            path: "etc/os-release".into(),
            mode: 0o644,
            data: b"NAME=\"podpath test busybox\"\nID=podpath-busybox\n".to_vec(),
        },
        Entry::File {
            path: "etc/passwd".into(),
            mode: 0o644,
            data: b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n".to_vec(),
        },
        Entry::File { path: "etc/group".into(), mode: 0o644, data: b"root:x:0:\nnogroup:x:65534:\n".to_vec() },
        Entry::File { path: "etc/nsswitch.conf".into(), mode: 0o644, data: b"hosts: files dns\n".to_vec() },
        Entry::Dir { path: "tmp".into() },
        Entry::Dir { path: "root".into() },
    ];
    let mut libs: Vec<String> =
        ["/bin/busybox", "/usr/bin/getent", "/usr/bin/printenv"].iter().flat_map(|p| libraries_of(p)).collect();
    libs.sort();
    libs.dedup();
    let mut dirs: Vec<String> =
        libs.iter().filter_map(|l| Path::new(l).parent().map(|d| d.display().to_string())).collect();
    dirs.sort();
    dirs.dedup();
    for d in dirs {
        entries.extend(dir_levels(&d));
    }
    for l in &libs {
        // Through the host's links (merged /usr) to the file itself.
        let real = std::fs::canonicalize(l).unwrap_or_else(|_| l.into());
        entries.push(Entry::File {
            path: l.trim_start_matches('/').to_string(),
            mode: 0o755,
            data: std::fs::read(&real).unwrap_or_else(|e| panic!("read {l}: {e}")),
        });
    }
    let list = Command::new(bin).arg("--list").output().expect("busybox --list");
    for applet in
        String::from_utf8_lossy(&list.stdout).lines().map(str::trim).filter(|a| !a.is_empty() && *a != "busybox")
    {
        entries.push(Entry::Link { path: format!("bin/{applet}"), target: "busybox".into() });
    }
    TestImage {
        layers: vec![entries],
        cmd: vec!["sh".into()],
        entrypoint: vec![],
        env: vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()],
        user: None,
        working_dir: None,
        architecture: host_arch().into(),
        zstd: false,
    }
}

/// Debian packages the test images are made of, downloaded once (`apt-get download`) into
/// `target/test-debs` of the workspace (or `PODPATH_TEST_DEBS`); returns the directory each
/// package is unpacked in (`dpkg-deb -x`).
pub fn debian_packages(packages: &[&str]) -> PathBuf {
    let cache = std::env::var_os("PODPATH_TEST_DEBS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-debs"));
    std::fs::create_dir_all(&cache).expect("create the test packages' cache");
    let have = |p: &str| {
        std::fs::read_dir(&cache)
            .map(|d| d.flatten().any(|e| e.file_name().to_string_lossy().starts_with(&format!("{p}_"))))
            .unwrap_or(false)
    };
    let missing: Vec<&str> = packages.iter().copied().filter(|p| !have(p)).collect();
    if !missing.is_empty() {
        let out = Command::new("apt-get")
            .arg("download")
            .args(&missing)
            .current_dir(&cache)
            .output()
            .expect("apt-get (Debian) downloads the test images' packages");
        assert!(out.status.success(), "apt-get download {missing:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let root = cache.join(format!("unpacked-{}", packages.join("+")));
    if !root.is_dir() {
        let holder = tempfile::Builder::new().prefix("unpacking-").tempdir_in(&cache).expect("unpack dir");
        let tmp = holder.path().join("root");
        std::fs::create_dir_all(&tmp).expect("unpack dir");
        for p in packages {
            let deb = std::fs::read_dir(&cache)
                .unwrap()
                .flatten()
                .find(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.starts_with(&format!("{p}_")) && n.ends_with(".deb")
                })
                .unwrap_or_else(|| panic!("{p}'s .deb in {}", cache.display()))
                .path();
            let st = Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tmp).status().expect("dpkg-deb");
            assert!(st.success(), "dpkg-deb -x {}", deb.display());
        }
        // Another test may have unpacked them meanwhile: either copy is whole.
        let _ = std::fs::rename(&tmp, &root);
    }
    root
}

/// Every file, link and directory under `root`, as entries at the same paths.
fn tree(root: &Path, rel: &str, out: &mut Vec<Entry>) {
    let mut names: Vec<_> = std::fs::read_dir(root.join(rel)).expect("read dir").flatten().collect();
    names.sort_by_key(|e| e.file_name());
    for e in names {
        let path = if rel.is_empty() {
            e.file_name().to_string_lossy().into_owned()
        } else {
            format!("{rel}/{}", e.file_name().to_string_lossy())
        };
        let m = std::fs::symlink_metadata(e.path()).expect("stat");
        if m.file_type().is_symlink() {
            let target = std::fs::read_link(e.path()).expect("readlink").display().to_string();
            out.push(Entry::Link { path, target });
        } else if m.is_dir() {
            out.push(Entry::Dir { path: path.clone() });
            tree(root, &path, out);
        } else {
            use std::os::unix::fs::PermissionsExt;
            out.push(Entry::File {
                path,
                mode: m.permissions().mode() & 0o7777,
                data: std::fs::read(e.path()).expect("read"),
            });
        }
    }
}

/// An nginx image made offline from Debian's `nginx` and `nginx-common` packages, over the
/// busybox image (a shell, `cat`, `tar` for `kubectl cp`), laid out as the official image:
/// `/etc/nginx/conf.d/default.conf` serving `/usr/share/nginx/html` on port 80, logs to the
/// container's stdout and stderr, user `nginx` (101), `Cmd: nginx -g 'daemon off;'`. Three
/// layers: busybox; nginx; one that removes `/etc/motd` (a
/// whiteout) and names the image in `/etc/os-release`.
pub fn nginx() -> TestImage {
    let pkgs = debian_packages(&["nginx", "nginx-common"]);
    let mut base = busybox();
    base.layers[0].push(Entry::File { path: "etc/motd".into(), mode: 0o644, data: b"from the base layer\n".to_vec() });
    let mut layer = vec![];
    for dir in ["usr/sbin", "usr/share/nginx", "etc/nginx"] {
        layer.extend(dir_levels(dir));
    }
    layer.push(Entry::File {
        path: "usr/sbin/nginx".into(),
        mode: 0o755,
        data: std::fs::read(pkgs.join("usr/sbin/nginx")).expect("nginx binary"),
    });
    tree(&pkgs, "usr/share/nginx", &mut layer);
    for f in ["mime.types", "fastcgi_params", "scgi_params", "uwsgi_params"] {
        layer.push(Entry::File {
            path: format!("etc/nginx/{f}"),
            mode: 0o644,
            data: std::fs::read(pkgs.join("etc/nginx").join(f)).expect("nginx-common file"),
        });
    }
    layer.push(Entry::File {
        path: "etc/nginx/nginx.conf".into(),
        mode: 0o644,
        data: b"user nginx;\nworker_processes auto;\nerror_log /var/log/nginx/error.log notice;\npid /var/run/nginx.pid;\nevents { worker_connections 1024; }\nhttp {\n    include /etc/nginx/mime.types;\n    default_type application/octet-stream;\n    access_log /var/log/nginx/access.log;\n    sendfile on;\n    keepalive_timeout 65;\n    include /etc/nginx/conf.d/*.conf;\n}\n".to_vec(),
    });
    layer.push(Entry::Dir { path: "etc/nginx/conf.d".into() });
    layer.push(Entry::File {
        path: "etc/nginx/conf.d/default.conf".into(),
        mode: 0o644,
        data: b"server {\n    listen 80;\n    server_name localhost;\n    location / {\n        root /usr/share/nginx/html;\n        index index.html;\n    }\n}\n".to_vec(),
    });
    for d in ["var", "var/log", "var/log/nginx", "var/lib", "var/lib/nginx", "var/cache", "var/cache/nginx", "run"] {
        layer.push(Entry::Dir { path: d.into() });
    }
    layer.push(Entry::Link { path: "var/run".into(), target: "/run".into() });
    layer.push(Entry::Link { path: "var/log/nginx/access.log".into(), target: "/dev/stdout".into() });
    layer.push(Entry::Link { path: "var/log/nginx/error.log".into(), target: "/dev/stderr".into() });
    let mut libs: Vec<String> = libraries_of(&pkgs.join("usr/sbin/nginx").display().to_string());
    libs.sort();
    libs.dedup();
    for l in &libs {
        let real = std::fs::canonicalize(l).unwrap_or_else(|_| l.into());
        layer.push(Entry::File {
            path: l.trim_start_matches('/').to_string(),
            mode: 0o755,
            data: std::fs::read(&real).unwrap_or_else(|e| panic!("read {l}: {e}")),
        });
    }
    layer.push(Entry::File {
        path: "etc/passwd".into(),
        mode: 0o644,
        data: b"root:x:0:0:root:/root:/bin/sh\nnginx:x:101:101:nginx user:/nonexistent:/bin/false\nnobody:x:65534:65534:nobody:/home:/bin/false\n".to_vec(),
    });
    layer.push(Entry::File {
        path: "etc/group".into(),
        mode: 0o644,
        data: b"root:x:0:\nnginx:x:101:\nnogroup:x:65534:\n".to_vec(),
    });
    let top = vec![
        Entry::Dir { path: "etc".into() },
        Entry::File { path: "etc/.wh.motd".into(), mode: 0o644, data: vec![] },
        Entry::File {
            path: "etc/os-release".into(),
            mode: 0o644,
            data:
                b"PRETTY_NAME=\"podpath test nginx (Debian's nginx)\"\nNAME=\"podpath test nginx\"\nID=podpath-nginx\n"
                    .to_vec(),
        },
    ];
    TestImage {
        layers: vec![base.layers.remove(0), layer, top],
        cmd: vec!["nginx".into(), "-g".into(), "daemon off;".into()],
        entrypoint: vec![],
        env: base.env,
        user: None,
        working_dir: None,
        architecture: host_arch().into(),
        zstd: false,
    }
}

/// A tar of entries (root-owned, fixed times).
pub fn layer_tar(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            Entry::File { path, mode, data } => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, &data[..]).expect("tar file");
            }
            Entry::Dir { path } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, path, std::io::empty()).expect("tar dir");
            }
            Entry::Link { path, target } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, target).expect("tar link");
            }
        }
    }
    b.into_inner().expect("tar")
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).expect("gzip");
    e.finish().expect("gzip")
}

fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

impl TestImage {
    /// The compressed layers and config, as pushed.
    pub fn blobs(&self) -> (Vec<ImageLayer>, Config) {
        let mut layers = vec![];
        let mut diff_ids = vec![];
        for entries in &self.layers {
            let tar = layer_tar(entries);
            diff_ids.push(format!("sha256:{}", sha256_hex(&tar)));
            layers.push(if self.zstd {
                ImageLayer::new(zstd(&tar), "application/vnd.oci.image.layer.v1.tar+zstd".into(), None)
            } else {
                ImageLayer::oci_v1_gzip(gzip(&tar), None)
            });
        }
        let config = serde_json::json!({
            "architecture": self.architecture,
            "os": "linux",
            "config": {
                "Cmd": self.cmd, "Entrypoint": self.entrypoint, "Env": self.env,
                "User": self.user.clone().unwrap_or_default(), "WorkingDir": self.working_dir.clone().unwrap_or_default(),
            },
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        (layers, Config::oci_v1(serde_json::to_vec(&config).expect("config"), None))
    }
}

/// Hex SHA-256.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(data))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// An htpasswd file with one login (bcrypt, as the distribution server requires).
pub fn htpasswd(dir: &Path, user: &str, password: &str) -> PathBuf {
    let hash = bcrypt::hash(password, 4).expect("bcrypt");
    let path = dir.join("htpasswd");
    std::fs::write(&path, format!("{user}:{hash}\n")).expect("write htpasswd");
    path
}

/// A `docker-registry serve` configuration: storage in `root` (`storage` adds to that section),
/// listening on `addr`, then `auth` (an `auth:` section, or nothing).
fn config(root: &Path, addr: &str, storage: &str, auth: &str) -> String {
    format!(
        "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n{storage}http:\n  addr: {addr}\n{auth}",
        root.display()
    )
}

impl Registry {
    /// Starts a registry (storage in a fresh directory); waits until it answers `/v2/`.
    /// `htpasswd`: require HTTP Basic logins from this file.
    pub fn start(htpasswd: Option<&Path>) -> Registry {
        let auth = htpasswd
            .map(|p| format!("auth:\n  htpasswd:\n    realm: podpath-test\n    path: {}\n", p.display()))
            .unwrap_or_default();
        Registry::start_with_auth(&auth)
    }

    /// Starts a registry whose pulls and pushes need bearer tokens from `tokens`.
    pub fn start_with_tokens(tokens: &crate::token_auth::TokenServer) -> Registry {
        Registry::start_with_auth(&tokens.registry_auth())
    }

    /// Starts a registry with this `auth:` section of its configuration (empty: none).
    fn start_with_auth(auth: &str) -> Registry {
        let dir = tempfile::Builder::new().prefix("podpath-registry-").tempdir().expect("tempdir");
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let config = config(&dir.path().join("data"), &addr, "  delete:\n    enabled: true\n", auth);
        let cfg = dir.path().join("config.yml");
        std::fs::write(&cfg, config).expect("write registry config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("registry log");
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("docker-registry is installed (apt-get install docker-registry)");
        let reg = Registry { addr, child, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(&reg.addr).is_err() {
            assert!(Instant::now() < deadline, "the registry did not listen: {}", reg.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        reg
    }

    /// Serves the same storage (what was pushed so far and later) read-only at `addr` inside
    /// network namespace `netns`, for machines that cannot reach this host's loopback. Stopped
    /// (by PID) when the returned guard drops.
    pub fn serve_in_netns(&self, netns: &str, addr: &str) -> NetnsRegistry {
        let readonly = "  maintenance:\n    readonly:\n      enabled: true\n";
        let config = config(&self._dir.path().join("data"), addr, readonly, "");
        let cfg = self._dir.path().join(format!("config-{netns}.yml"));
        std::fs::write(&cfg, config).expect("write registry config");
        let log_path = self._dir.path().join(format!("registry-{netns}.log"));
        let log = std::fs::File::create(&log_path).expect("registry log");
        let child = Command::new("ip")
            .args(["netns", "exec", netns, "docker-registry", "serve"])
            .arg(&cfg)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("ip netns exec docker-registry");
        let served = NetnsRegistry { child, log: log_path };
        let deadline = Instant::now() + Duration::from_secs(15);
        let (ip, port) = addr.rsplit_once(':').expect("IP:PORT");
        let probe = format!("echo > /dev/tcp/{ip}/{port}");
        let listening = || {
            Command::new("ip")
                .args(["netns", "exec", netns, "bash", "-c", &probe])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        while !listening() {
            assert!(Instant::now() < deadline, "the registry did not listen in {netns}: {}", served.log());
            std::thread::sleep(Duration::from_millis(50));
        }
        served
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("registry.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> PathBuf {
        self._dir.path().to_path_buf()
    }

    fn client() -> Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::new(ClientConfig { protocol: ClientProtocol::Http, ..ClientConfig::default() })
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime")
    }

    /// Pushes `image` as `repo:tag` (for example `library/busybox:latest`); returns the
    /// manifest's digest.
    pub fn push(&self, repo_tag: &str, image: &TestImage, auth: Option<(&str, &str)>) -> String {
        let r: Reference = format!("{}/{repo_tag}", self.addr).parse().expect("reference");
        let (layers, config) = image.blobs();
        let auth = auth.map_or(RegistryAuth::Anonymous, |(u, p)| RegistryAuth::Basic(u.into(), p.into()));
        Self::runtime().block_on(async {
            let c = Self::client();
            c.push(&r, &layers, config, &auth, None).await.expect("push");
            let (_, digest) = c.pull_manifest(&r, &auth).await.expect("pull back the manifest");
            digest
        })
    }

    /// Pushes one image per architecture and an index of them as `repo:tag`.
    pub fn push_index(&self, repo_tag: &str, images: &[TestImage]) {
        let r: Reference = format!("{}/{repo_tag}", self.addr).parse().expect("reference");
        Self::runtime().block_on(async {
            let c = Self::client();
            let mut entries = vec![];
            for (i, img) in images.iter().enumerate() {
                let one: Reference = format!("{}/{}:part-{i}", self.addr, r.repository()).parse().expect("reference");
                let (layers, config) = img.blobs();
                c.push(&one, &layers, config, &RegistryAuth::Anonymous, None).await.expect("push a platform");
                let (manifest, digest) = c.pull_manifest(&one, &RegistryAuth::Anonymous).await.expect("manifest");
                let size = match manifest {
                    OciManifest::Image(m) => serde_json::to_vec(&m).map(|v| v.len()).unwrap_or(0),
                    _ => 0,
                };
                let raw = c
                    .pull_manifest_raw(&one, &RegistryAuth::Anonymous, &["application/vnd.oci.image.manifest.v1+json"])
                    .await
                    .map(|(b, _)| b.len())
                    .unwrap_or(size);
                entries.push(ImageIndexEntry {
                    media_type: "application/vnd.oci.image.manifest.v1+json".into(),
                    digest,
                    size: raw as i64,
                    platform: Some(Platform {
                        architecture: img.architecture.as_str().into(),
                        os: "linux".into(),
                        os_version: None,
                        os_features: None,
                        variant: None,
                        features: None,
                    }),
                    annotations: None,
                    artifact_type: None,
                });
            }
            let index = OciImageIndex {
                schema_version: 2,
                media_type: Some("application/vnd.oci.image.index.v1+json".into()),
                manifests: entries,
                artifact_type: None,
                annotations: None,
            };
            c.push_manifest_list(&r, &RegistryAuth::Anonymous, index).await.expect("push the index");
        });
    }

    /// Corrupts a stored blob in place (same size, other bytes): the registry serves it as it
    /// is, and only the puller's digest check can tell — a disk or proxy gone bad.
    pub fn corrupt(&self, digest: &str) {
        let hex = digest.trim_start_matches("sha256:");
        let path = self.dir().join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data");
        let mut data = std::fs::read(&path).expect("the blob is stored");
        let half = data.len() / 2;
        for b in data.iter_mut().skip(half).take(16) {
            *b ^= 0xff;
        }
        std::fs::write(&path, data).expect("rewrite the blob");
    }

    /// The digests of an image's layers as pushed.
    pub fn layer_digests(image: &TestImage) -> Vec<String> {
        image.blobs().0.iter().map(|l| l.sha256_digest()).collect()
    }
}

/// A registry's storage served inside a network namespace ([`Registry::serve_in_netns`]).
pub struct NetnsRegistry {
    child: Child,
    log: PathBuf,
}

impl NetnsRegistry {
    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NetnsRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
