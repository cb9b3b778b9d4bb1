//! Pulls from a real registry (Debian's docker-registry on loopback) into a store: platforms,
//! compressions, mirrors, and each bad input a clear error with nothing left behind. Root: the
//! layers are unpacked with their owners and whiteouts.

use std::time::Duration;

use image::{ImageError, Limits, Puller, Registries, Store};
use testkit::registry::{busybox, host_arch, Registry};

fn puller(reg: &Registry, store: &std::path::Path, limits: Limits) -> Puller {
    let mut r = Registries::default();
    r.plain_http.push(reg.addr.clone());
    r.add_mirror(&format!("docker.io=http://{}", reg.addr)).unwrap();
    Puller::new(Store::open(store).unwrap(), r, limits)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Nothing half-made: no temporary directory left, every layer directory complete.
fn assert_clean(store: &std::path::Path) {
    let tmp: Vec<_> = std::fs::read_dir(store.join("tmp")).unwrap().flatten().collect();
    assert!(tmp.is_empty(), "temporary files left: {tmp:?}");
}

#[test]
fn an_image_is_pulled_once_through_the_mirror_and_unpacked() {
    let reg = Registry::start(None);
    reg.push("library/busybox:latest", &busybox(), None);
    let dir = tempfile::tempdir().unwrap();
    let p = puller(&reg, dir.path(), Limits::default());
    let pulled = rt().block_on(p.pull("busybox", &[])).unwrap();
    let rec = &pulled.record;
    assert_eq!(rec.names, ["docker.io/library/busybox:latest"]);
    assert!(rec.repo_digests[0].starts_with("docker.io/library/busybox@sha256:"), "{:?}", rec.repo_digests);
    assert_eq!(rec.config.cmd, ["sh"]);
    assert_eq!(rec.platform, format!("linux/{}", host_arch()));
    assert!(pulled.downloaded > 100_000, "busybox is ~1 MB: {}", pulled.downloaded);
    let layer = p.store().layer_dir(&rec.layers[0]).unwrap();
    assert!(std::fs::read_to_string(layer.join("etc/os-release")).unwrap().contains("podpath-busybox"));
    assert_eq!(std::fs::read_link(layer.join("bin/sh")).unwrap(), std::path::Path::new("busybox"));
    // Again: the manifest is checked, no layer is downloaded.
    let again = rt().block_on(p.pull("docker.io/library/busybox:latest", &[])).unwrap();
    assert_eq!((again.downloaded, again.record.id.clone()), (0, rec.id.clone()));
    assert_eq!(p.store().find("busybox").unwrap().unwrap().id, rec.id);
    assert_clean(dir.path());
}

#[test]
fn an_index_gives_this_hosts_platform_and_zstd_layers_unpack() {
    let reg = Registry::start(None);
    let other = if host_arch() == "amd64" { "arm64" } else { "amd64" };
    let mut theirs = busybox();
    theirs.architecture = other.into();
    theirs.cmd = vec!["theirs".into()];
    let mut ours = busybox();
    ours.zstd = true;
    ours.cmd = vec!["ours".into()];
    reg.push_index("multi:1", &[theirs, ours]);
    let dir = tempfile::tempdir().unwrap();
    let p = puller(&reg, dir.path(), Limits::default());
    let rec = rt().block_on(p.pull(&format!("{}/multi:1", reg.addr), &[])).unwrap().record;
    assert_eq!(rec.config.cmd, ["ours"]);
    assert!(p.store().layer_dir(&rec.layers[0]).unwrap().join("bin/busybox").is_file());

    let mut only_other = busybox();
    only_other.architecture = other.into();
    reg.push_index("foreign:1", &[only_other]);
    let e = rt().block_on(p.pull(&format!("{}/foreign:1", reg.addr), &[])).unwrap_err();
    assert!(matches!(e, ImageError::Platform { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains("no match for platform in manifest") && text.contains(&format!("linux/{other}")), "{text}");
    assert_clean(dir.path());
}

#[test]
fn bad_images_and_registries_are_clear_errors_with_nothing_left() {
    let reg = Registry::start(None);
    let img = busybox();
    reg.push("library/busybox:corrupt", &img, None);
    let layer = Registry::layer_digests(&img).remove(0);
    reg.corrupt(&layer);
    let dir = tempfile::tempdir().unwrap();
    let p = puller(&reg, dir.path(), Limits::default());
    let e = rt().block_on(p.pull("busybox:corrupt", &[])).unwrap_err().to_string();
    assert!(e.contains(&format!("failed to extract layer {layer}")) && e.contains("digest mismatch"), "{e}");
    assert!(!p.store().has_layer(&layer));

    let e = rt().block_on(p.pull("busybox:nope", &[])).unwrap_err().to_string();
    assert_eq!(
        e,
        "failed to pull and unpack image \"docker.io/library/busybox:nope\": failed to resolve reference \
         \"docker.io/library/busybox:nope\": docker.io/library/busybox:nope: not found"
    );

    // A layer beyond the limit is refused before it is downloaded.
    reg.push("library/busybox:big", &busybox(), None);
    let small = puller(&reg, dir.path(), Limits { max_layer_bytes: 1000, ..Limits::default() });
    let e = rt().block_on(small.pull("busybox:big", &[])).unwrap_err().to_string();
    assert!(e.contains("more than the limit of 1000 bytes"), "{e}");

    let e = rt().block_on(p.pull("Busybox", &[])).unwrap_err().to_string();
    assert!(e.starts_with("Failed to apply default image tag \"Busybox\""), "{e}");
    assert!(p.store().list().unwrap().is_empty());
    assert_clean(dir.path());
}

#[test]
fn a_registry_that_hangs_fails_the_pull_in_time() {
    // Accepts connections and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let held = std::thread::spawn(move || {
        let mut conns = vec![];
        for c in silent.incoming().take(4) {
            conns.push(c);
        }
        std::thread::sleep(Duration::from_secs(5));
    });
    let dir = tempfile::tempdir().unwrap();
    let mut r = Registries::default();
    r.plain_http.push(addr.clone());
    let p = Puller::new(
        Store::open(dir.path()).unwrap(),
        r,
        Limits { read_timeout: Duration::from_millis(500), ..Limits::default() },
    );
    let t = std::time::Instant::now();
    let e = rt().block_on(p.pull(&format!("{addr}/x:1"), &[])).unwrap_err().to_string();
    assert!(t.elapsed() < Duration::from_secs(4), "took {:?}", t.elapsed());
    assert!(e.contains("failed to resolve reference") && e.contains("did not answer in time"), "{e}");
    drop(held);
}

#[test]
fn archives_of_docker_save_and_oci_layouts_load_without_a_registry() {
    let reg = Registry::start(None);
    reg.push("library/busybox:latest", &busybox(), None);
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("store")).unwrap();
    for (i, (form, name, want)) in [
        ("docker-archive", "example.com/docker/bb:1", "example.com/docker/bb:1"),
        ("oci-archive", "example.com/oci/bb:2", "example.com/oci/bb:2"),
        ("docker-archive", "bb:3", "docker.io/library/bb:3"),
    ]
    .into_iter()
    .enumerate()
    {
        let file = dir.path().join(format!("{form}-{i}.tar"));
        let out = std::process::Command::new("skopeo")
            .args(["copy", "--src-tls-verify=false"])
            .arg(format!("docker://{}/library/busybox:latest", reg.addr))
            .arg(format!("{form}:{}:{name}", file.display()))
            .output()
            .expect("skopeo is installed (apt-get install skopeo)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let loaded = image::archive::load(&store, &file, 1 << 30).unwrap();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].names, [want]);
        let layer = store.layer_dir(&loaded[0].layers[0]).unwrap();
        assert!(layer.join("bin/busybox").is_file(), "{form}");
        assert_eq!(store.find(want).unwrap().unwrap().config.cmd, ["sh"]);
    }
    // Not an archive, and an archive whose member leaves it.
    let junk = dir.path().join("junk.tar");
    std::fs::write(&junk, b"not a tar at all, not even close to one.........").unwrap();
    assert!(image::archive::load(&store, &junk, 1 << 30).is_err());
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_mode(0o644);
    h.as_old_mut().name[..9].copy_from_slice(b"../escape");
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let evil = dir.path().join("evil.tar");
    std::fs::write(&evil, b.into_inner().unwrap()).unwrap();
    let e = image::archive::load(&store, &evil, 1 << 30).unwrap_err().to_string();
    assert!(e.contains("leaves the image"), "{e}");
    assert!(!dir.path().join("store/tmp/escape").exists() && !dir.path().join("escape").exists());
}

/// An image of one layer holding `bytes` bytes of incompressible data (distinct per `seed`).
fn blob_image(seed: u8, bytes: usize) -> testkit::registry::TestImage {
    // A simple xorshift stream: gzip cannot shrink it, so the layer is `bytes` on the wire too.
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(seed);
    let data = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    testkit::registry::TestImage {
        layers: vec![vec![testkit::registry::Entry::File { path: "blob".into(), mode: 0o644, data }]],
        cmd: vec![format!("blob-{seed}")],
        entrypoint: vec![],
        env: vec![],
        user: None,
        working_dir: None,
        architecture: host_arch().into(),
        zstd: false,
    }
}

#[test]
fn the_store_keeps_within_its_limit_and_refuses_an_image_larger_than_it() {
    let reg = Registry::start(None);
    for seed in 1..=3u8 {
        reg.push(&format!("library/blob{seed}:latest"), &blob_image(seed, 3 << 20), None);
    }
    reg.push("library/huge:latest", &blob_image(9, 9 << 20), None);
    let dir = tempfile::tempdir().unwrap();
    let limits = Limits { store_bytes: Some(8 << 20), ..Limits::default() };
    let p = puller(&reg, dir.path(), limits);
    let rt = rt();
    // Larger than the whole store: refused before a byte of it is downloaded.
    let err = rt.block_on(p.pull("huge", &[])).unwrap_err().to_string();
    assert!(err.contains("more than the image store's limit of 8388608 bytes"), "{err}");
    assert!(p.store().list().unwrap().is_empty());
    // Two fit (6 MiB); the third takes the store past 8 MiB: the least recently used goes.
    let first = rt.block_on(p.pull("blob1", &[])).unwrap().record;
    let second = rt.block_on(p.pull("blob2", &[])).unwrap().record;
    p.store().mark_used(&first.id).unwrap();
    // blob2 runs in a container: kept even though blob1 was used later.
    p.store().lease("pod-ctr", &second.layers).unwrap();
    let third = rt.block_on(p.pull("blob3", &[])).unwrap().record;
    let left: Vec<String> = p.store().list().unwrap().into_iter().map(|r| r.id).collect();
    assert!(!left.contains(&first.id) && left.contains(&second.id) && left.contains(&third.id), "{left:?}");
    assert!(p.store().disk_usage() <= 8 << 20, "{}", p.store().disk_usage());
    assert!(!p.store().has_layer(&first.layers[0]));
    assert_clean(dir.path());
}

#[test]
fn bearer_tokens_are_fetched_anonymously_for_public_images_and_with_the_login_for_private_ones() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = testkit::token_auth::TokenServer::start(dir.path(), &[("ci", "s3cret")], &["library/"]);
    let reg = Registry::start_with_tokens(&tokens);
    reg.push("library/busybox:latest", &busybox(), Some(("ci", "s3cret")));
    reg.push("team/private:1", &blob_image(5, 64 << 10), Some(("ci", "s3cret")));
    let store = tempfile::tempdir().unwrap();
    let p = puller(&reg, store.path(), Limits::default());
    let rt = rt();
    // A public image: the client gets an anonymous token, as from Docker Hub.
    let pulled = rt.block_on(p.pull("busybox", &[])).unwrap();
    assert_eq!(pulled.record.names, ["docker.io/library/busybox:latest"]);
    // A private one: refused without a login, or with a wrong one; pulled with the right one.
    let private = format!("{}/team/private:1", reg.addr);
    let err = rt.block_on(p.pull(&private, &[])).unwrap_err().to_string();
    assert!(err.contains("pull access denied, repository does not exist or may require authorization"), "{err}");
    let right = image::Credential { registry: reg.addr.clone(), username: "ci".into(), password: "s3cret".into() };
    let wrong = image::Credential { registry: reg.addr.clone(), username: "ci".into(), password: "nope".into() };
    let err = rt.block_on(p.pull(&private, std::slice::from_ref(&wrong))).unwrap_err().to_string();
    assert!(err.contains("pull access denied"), "{err}");
    // The right login after a wrong one, then the wrong one again: it does not ride on the
    // token the right one earned.
    let pulled = rt.block_on(p.pull(&private, &[right])).unwrap();
    assert_eq!(pulled.record.config.cmd, ["blob-5"]);
    p.store().remove(&private).unwrap();
    let err = rt.block_on(p.pull(&private, &[wrong])).unwrap_err().to_string();
    assert!(err.contains("pull access denied"), "{err}");
    assert_clean(store.path());
}
