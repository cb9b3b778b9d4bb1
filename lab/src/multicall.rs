//! `podpath` is also every program of the lab (a multi-call binary, like busybox or k3s): run
//! under the name of one of them, it is that program. `podpath up` makes a `bin/` directory in
//! the lab's state directory with a symbolic link per program to its own executable and starts
//! the lab's processes through those links, so each shows under its own name in `ps` and
//! `pgrep`, and the kubelet finds the CNI plugins there by name as CNI runtimes do.
//!
//! Why one binary: the lab runs some 100 processes (components, and per pod a sandbox, a
//! monitor and a workload). Programs built separately each carry their own copy of the code
//! they share (tokio, hyper, rustls, serde, the API types), and each copy's pages are resident
//! for itself; in one binary, one copy's pages are shared by every process that runs it. The
//! lab's memory bench measured 99.8 MiB PSS with separate binaries and 79.4–81.6 MiB with one.

use std::path::{Path, PathBuf};

use crate::{io, Result};

/// The programs `podpath` also is, by the name it is run under, and their `main`s. The same
/// programs are built on their own too (`cargo build --release --bins`), for use without the lab.
pub const PROGRAMS: [(&str, fn()); 8] = [
    ("apiserver-lite", apiserver_lite::cli::main),
    ("node-agent", node_agent::cli::main),
    ("lb-sim", lb_sim::cli::main),
    ("podpath-dns", podpath_dns::cli::main),
    ("podpath-images", image::cli::main),
    ("podpath-workload", kubelet::workload::main),
    ("podpath-bridge", podpath_cni::bridge::cli::main),
    ("podpath-ipam", podpath_cni::ipam::cli::main),
];

/// The program to run for `argv0` (a path or a name, as `execve` was given it), if it names one
/// of [`PROGRAMS`], with its name; `None` for `podpath` itself.
pub fn program(argv0: &str) -> Option<(&'static str, fn())> {
    let name = argv0.rsplit('/').next().unwrap_or(argv0);
    PROGRAMS.iter().find(|(n, _)| *n == name).copied()
}

/// Makes `dir` hold a symbolic link per program, each to `exe`. A link already there is replaced
/// (a lab made again after `podpath` was rebuilt elsewhere); each is renamed into place, so a
/// process started meanwhile finds the old link or the new one, never none.
pub fn install(dir: &Path, exe: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    for (name, _) in PROGRAMS {
        let link = dir.join(name);
        let tmp = dir.join(format!(".{name}.new"));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(exe, &tmp).map_err(io(format!("link {} to {}", tmp.display(), exe.display())))?;
        std::fs::rename(&tmp, &link).map_err(io(format!("rename {} to {}", tmp.display(), link.display())))?;
    }
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_chosen_by_the_base_name_it_runs_under() {
        let name = |argv0| program(argv0).map(|(n, _)| n);
        assert_eq!(name("/tmp/lab/bin/node-agent"), Some("node-agent"));
        assert_eq!(name("podpath-ipam"), Some("podpath-ipam"));
        assert!(program("podpath").is_none());
        assert!(program("/usr/local/bin/podpath").is_none());
        // Only the base name counts: a directory named like a program does not make one.
        assert!(program("/opt/node-agent/podpath").is_none());
        assert!(program("").is_none());
    }

    #[test]
    fn install_links_every_program_and_replaces_stale_links() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("bin");
        let exe = tmp.path().join("podpath");
        std::fs::write(&exe, b"").unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink("/nonexistent/old-podpath", dir.join("lb-sim")).unwrap();
        install(&dir, &exe).unwrap();
        for (name, _) in PROGRAMS {
            assert_eq!(std::fs::read_link(dir.join(name)).unwrap(), exe, "{name}");
        }
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left.len(), PROGRAMS.len(), "no temporary links left: {left:?}");
        // Twice is the same as once.
        install(&dir, &exe).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), PROGRAMS.len());
    }
}
