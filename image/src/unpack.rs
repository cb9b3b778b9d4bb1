//! A layer (a tar stream, already decompressed) unpacked into a directory of its own, in the
//! form overlayfs stacks: whiteouts (`.wh.NAME`) become 0/0 character devices and opaque
//! directories (`.wh..wh..opq`) get `trusted.overlay.opaque=y`, as containerd's overlay
//! snapshotter lays layers out.
//!
//! Nothing is written outside the directory: a path with `..`, or one that goes through a
//! symbolic link the layer itself made, is refused (a layer's absolute symlinks are kept as
//! they are: they mean the container's root once the layers are its root); a hard link must
//! name a file of the same layer. Ownership, modes (setuid included), times and extended
//! attributes are the tar's. The number of bytes written is bounded.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// Why a layer could not be unpacked (the caller names the layer).
#[derive(Debug)]
pub enum UnpackError {
    /// The layer's content is unacceptable: the reason, for the pod's status.
    Refused(String),
    /// Reading the stream or writing the directory failed.
    Io(String, io::Error),
}

impl std::fmt::Display for UnpackError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnpackError::Refused(why) => f.write_str(why),
            UnpackError::Io(what, e) => write!(f, "cannot {what}: {e}"),
        }
    }
}

type Result<T> = std::result::Result<T, UnpackError>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> UnpackError {
    let what = what.into();
    move |e| UnpackError::Io(what, e)
}

/// What unpacking wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Unpacked {
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// The path of an entry inside the layer, or why it is refused: relative, without `..`
/// (a leading `/` or `./` is dropped, as tar does).
pub fn entry_path(raw: &Path) -> Result<PathBuf> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(UnpackError::Refused(format!("the path {} leaves the image", raw.display())))
            }
        }
    }
    Ok(out)
}

/// Refuses a path whose parent directories, inside `root`, include a symbolic link: following
/// it could write anywhere on the node.
fn check_parents(root: &Path, rel: &Path) -> Result<()> {
    let mut at = root.to_path_buf();
    let parents: Vec<_> = rel.parent().map(|p| p.components().collect()).unwrap_or_default();
    for c in parents {
        at.push(c);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(UnpackError::Refused(format!(
                    "the path {} goes through the symbolic link {}",
                    rel.display(),
                    at.strip_prefix(root).unwrap_or(&at).display()
                )))
            }
            Ok(m) if !m.is_dir() => {
                return Err(UnpackError::Refused(format!(
                    "the path {} goes through {}, which is not a directory",
                    rel.display(),
                    at.strip_prefix(root).unwrap_or(&at).display()
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::DirBuilder::new().mode(0o755).create(&at).map_err(io_err(format!("create {}", at.display())))?;
            }
            Err(e) => return Err(UnpackError::Io(format!("inspect {}", at.display()), e)),
        }
    }
    Ok(())
}

/// Removes whatever is at `path` (not following a symlink), so an entry replaces it.
fn clear(path: &Path, keep_dir: bool) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && keep_dir => Ok(()),
        Ok(m) if m.is_dir() => fs::remove_dir_all(path).map_err(io_err(format!("replace {}", path.display()))),
        Ok(_) => fs::remove_file(path).map_err(io_err(format!("replace {}", path.display()))),
        Err(_) => Ok(()),
    }
}

/// Unpacks the tar stream `input` into `dest` (an existing, empty directory), writing at most
/// `max_bytes` of file content.
pub fn unpack(input: impl Read, dest: &Path, max_bytes: u64) -> Result<Unpacked> {
    let mut archive = tar::Archive::new(input);
    let mut done = Unpacked::default();
    // Directory times are set last: writing into a directory changes its mtime.
    let mut dir_times: Vec<(PathBuf, i64)> = vec![];
    for entry in archive.entries().map_err(io_err("read the layer"))? {
        let mut entry = entry.map_err(io_err("read the layer"))?;
        let raw = entry.path().map_err(io_err("read an entry's path"))?.into_owned();
        let rel = entry_path(&raw)?;
        if rel.as_os_str().is_empty() {
            continue; // "./" itself
        }
        check_parents(dest, &rel)?;
        let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let path = dest.join(&rel);
        if name == ".wh..wh..opq" {
            // The directory hides everything below it in lower layers.
            let dir = path.parent().unwrap_or(dest);
            rustix::fs::lsetxattr(dir, "trusted.overlay.opaque", b"y", rustix::fs::XattrFlags::empty())
                .map_err(|e| UnpackError::Io(format!("mark {} opaque", dir.display()), e.into()))?;
            done.entries += 1;
            continue;
        }
        if let Some(hidden) = name.strip_prefix(".wh.") {
            let target = path.with_file_name(hidden);
            clear(&target, false)?;
            rustix::fs::mknodat(rustix::fs::CWD, &target, rustix::fs::FileType::CharacterDevice, 0o000.into(), 0)
                .map_err(|e| UnpackError::Io(format!("write the whiteout {}", target.display()), e.into()))?;
            done.entries += 1;
            continue;
        }
        let header = entry.header().clone();
        let mode = header.mode().map_err(io_err(format!("read the mode of {}", rel.display())))? & 0o7777;
        let kind = header.entry_type();
        clear(&path, kind.is_dir())?;
        match kind {
            tar::EntryType::Directory => {
                if !path.is_dir() {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&path)
                        .map_err(io_err(format!("create {}", path.display())))?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                let size = header.size().unwrap_or(0);
                if done.bytes.saturating_add(size) > max_bytes {
                    return Err(UnpackError::Refused(format!(
                        "the layer unpacks to more than the limit of {max_bytes} bytes"
                    )));
                }
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(io_err(format!("create {}", path.display())))?;
                done.bytes += io::copy(&mut (&mut entry).take(size), &mut f)
                    .map_err(io_err(format!("write {}", path.display())))?;
            }
            tar::EntryType::Symlink => {
                let target =
                    entry.link_name().map_err(io_err(format!("read the link of {}", rel.display())))?.ok_or_else(
                        || UnpackError::Refused(format!("the symbolic link {} has no target", rel.display())),
                    )?;
                symlink(&target, &path).map_err(io_err(format!("create the link {}", path.display())))?;
            }
            tar::EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(io_err(format!("read the link of {}", rel.display())))?
                    .ok_or_else(|| UnpackError::Refused(format!("the hard link {} has no target", rel.display())))?;
                let target_rel = entry_path(&target)?;
                check_parents(dest, &target_rel)?;
                let source = dest.join(&target_rel);
                match fs::symlink_metadata(&source) {
                    Ok(m) if !m.is_dir() => {}
                    _ => {
                        return Err(UnpackError::Refused(format!(
                            "the hard link {} names {}, which is not a file of this layer",
                            rel.display(),
                            target_rel.display()
                        )))
                    }
                }
                fs::hard_link(&source, &path).map_err(io_err(format!("link {}", path.display())))?;
                done.entries += 1;
                continue; // a hard link shares the target's metadata
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                let ft = match kind {
                    tar::EntryType::Char => rustix::fs::FileType::CharacterDevice,
                    tar::EntryType::Block => rustix::fs::FileType::BlockDevice,
                    _ => rustix::fs::FileType::Fifo,
                };
                let dev = rustix::fs::makedev(
                    header.device_major().ok().flatten().unwrap_or(0),
                    header.device_minor().ok().flatten().unwrap_or(0),
                );
                rustix::fs::mknodat(rustix::fs::CWD, &path, ft, (mode & 0o777).into(), dev)
                    .map_err(|e| UnpackError::Io(format!("create the device {}", path.display()), e.into()))?;
            }
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader | tar::EntryType::GNULongName => continue,
            other => {
                tracing::debug!(path = %rel.display(), "skipping a tar entry of type {other:?}");
                continue;
            }
        }
        // Extended attributes (file capabilities, say), from PAX records.
        if let Ok(Some(pax)) = entry.pax_extensions() {
            for ext in pax.flatten() {
                if let (Ok(key), value) = (ext.key(), ext.value_bytes()) {
                    if let Some(attr) = key.strip_prefix("SCHILY.xattr.") {
                        let _ = rustix::fs::lsetxattr(&path, attr, value, rustix::fs::XattrFlags::empty());
                    }
                }
            }
        }
        let uid = header.uid().unwrap_or(0) as u32;
        let gid = header.gid().unwrap_or(0) as u32;
        std::os::unix::fs::lchown(&path, Some(uid), Some(gid)).map_err(io_err(format!("chown {}", path.display())))?;
        if !kind.is_symlink() {
            // After chown, which clears setuid bits.
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(io_err(format!("chmod {}", path.display())))?;
        }
        let mtime = header.mtime().unwrap_or(0) as i64;
        if kind.is_dir() {
            dir_times.push((path, mtime));
        } else {
            set_mtime(&path, mtime);
        }
        done.entries += 1;
    }
    for (dir, mtime) in dir_times.iter().rev() {
        set_mtime(dir, *mtime);
    }
    Ok(done)
}

fn set_mtime(path: &Path, secs: i64) {
    let t = rustix::fs::Timespec { tv_sec: secs, tv_nsec: 0 };
    let times = rustix::fs::Timestamps { last_access: t, last_modification: t };
    let _ = rustix::fs::utimensat(rustix::fs::CWD, path, &times, rustix::fs::AtFlags::SYMLINK_NOFOLLOW);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tar with the given entries: (path, kind, content or link target).
    fn tar_of(entries: &[(&str, tar::EntryType, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
            h.set_uid(1000);
            h.set_gid(1000);
            h.set_mtime(1_700_000_000);
            // Paths are written raw, so `..` and absolute names reach the unpacker as a
            // hostile layer would send them.
            let name = h.as_old_mut().name.as_mut();
            name[..path.len()].copy_from_slice(path.as_bytes());
            match kind {
                tar::EntryType::Symlink | tar::EntryType::Link => {
                    h.set_link_name(data).unwrap();
                    h.set_size(0);
                    h.set_cksum();
                    b.append(&h, io::empty()).unwrap();
                }
                _ => {
                    h.set_size(data.len() as u64);
                    h.set_cksum();
                    b.append(&h, data.as_bytes()).unwrap();
                }
            }
        }
        b.into_inner().unwrap()
    }

    use tar::EntryType::{Directory as D, Link as H, Regular as F, Symlink as S};

    #[test]
    fn files_links_and_owners_are_the_tars() {
        let dir = tempfile::tempdir().unwrap();
        let t = tar_of(&[
            ("./etc/", D, ""),
            ("etc/os-release", F, "ID=test\n"),
            ("bin/busybox", F, "#!"),
            ("bin/sh", S, "busybox"),
            ("bin/ls", H, "bin/busybox"),
            ("etc/abs", S, "/etc/os-release"),
        ]);
        let n = unpack(&t[..], dir.path(), 1 << 20).unwrap();
        assert_eq!(n, Unpacked { entries: 6, bytes: 10 });
        let root = dir.path();
        assert_eq!(fs::read_to_string(root.join("etc/os-release")).unwrap(), "ID=test\n");
        assert_eq!(fs::read_link(root.join("bin/sh")).unwrap(), Path::new("busybox"));
        // An absolute symlink is content: it means the container's /etc/os-release.
        assert_eq!(fs::read_link(root.join("etc/abs")).unwrap(), Path::new("/etc/os-release"));
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(root.join("bin/ls")).unwrap();
        assert_eq!((m.nlink(), m.uid(), m.gid(), m.mode() & 0o7777), (2, 1000, 1000, 0o644));
        assert_eq!(fs::metadata(root.join("etc")).unwrap().mtime(), 1_700_000_000);
    }

    #[test]
    fn whiteouts_become_overlay_whiteouts() {
        let dir = tempfile::tempdir().unwrap();
        let t = tar_of(&[("etc/.wh.motd", F, ""), ("var/cache/.wh..wh..opq", F, ""), ("var/cache/new", F, "x")]);
        unpack(&t[..], dir.path(), 1 << 20).unwrap();
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let m = fs::symlink_metadata(dir.path().join("etc/motd")).unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), 0);
        assert!(!dir.path().join("etc/.wh.motd").exists());
        let mut buf = [0u8; 4];
        let n = rustix::fs::lgetxattr(dir.path().join("var/cache"), "trusted.overlay.opaque", &mut buf).unwrap();
        assert_eq!(&buf[..n], b"y");
    }

    #[test]
    fn paths_out_of_the_layer_are_refused_and_nothing_is_written_outside() {
        for (entries, why) in [
            (vec![("../escape", F, "x")], "leaves the image"),
            (vec![("a/../../escape", F, "x")], "leaves the image"),
            // A link the layer made, then a file through it: would land in the link's target.
            (vec![("evil", S, "/tmp"), ("evil/escape", F, "x")], "goes through the symbolic link evil"),
            (vec![("evil", S, "../.."), ("evil/escape", F, "x")], "goes through the symbolic link evil"),
            (vec![("h", H, "../../etc/passwd")], "leaves the image"),
            (vec![("h", H, "missing")], "not a file of this layer"),
        ] {
            let outer = tempfile::tempdir().unwrap();
            let dest = outer.path().join("a/b/layer");
            fs::create_dir_all(&dest).unwrap();
            let t = tar_of(&entries);
            match unpack(&t[..], &dest, 1 << 20) {
                Err(UnpackError::Refused(m)) => assert!(m.contains(why), "{m:?} should say {why:?}"),
                other => panic!("{entries:?}: {other:?}"),
            }
            assert!(!outer.path().join("escape").exists() && !outer.path().join("a/escape").exists());
            assert!(!Path::new("/tmp/escape").exists());
        }
    }

    #[test]
    fn a_layer_bigger_than_the_limit_stops() {
        let dir = tempfile::tempdir().unwrap();
        let t = tar_of(&[("a", F, "0123456789"), ("b", F, "0123456789")]);
        let e = unpack(&t[..], dir.path(), 15).unwrap_err();
        assert!(e.to_string().contains("more than the limit of 15 bytes"), "{e}");
    }

    #[test]
    fn a_later_entry_replaces_an_earlier_one() {
        let dir = tempfile::tempdir().unwrap();
        let t = tar_of(&[("x", S, "/etc/passwd"), ("x", F, "mine")]);
        unpack(&t[..], dir.path(), 1 << 20).unwrap();
        assert_eq!(fs::read_to_string(dir.path().join("x")).unwrap(), "mine");
    }
}
