//! The IPAM store, in host-local's layout so both plugins can read each other's state:
//! `<dataDir>/<network>/<ip>` holds `<containerID>\r\n<ifname>`, `last_reserved_ip.<set>` the
//! last address handed out from a range set, and `lock` is flocked for the whole operation
//! (concurrent ADDs of different containers serialise on it).

use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::error::{code, CniError, Result};

/// An open, locked store. The lock is released when it is dropped.
pub struct Store {
    dir: PathBuf,
    _lock: File,
}

fn io(what: &str, path: &Path, e: std::io::Error) -> CniError {
    CniError::new(code::IO, format!("cannot {what} {}: {e}", path.display()))
}

impl Store {
    /// Opens (creating it if needed) and exclusively locks the store of one network.
    pub fn open_locked(dir: &Path) -> Result<Store> {
        fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
        let lock_path = dir.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| io("open", &lock_path, e))?;
        lock.lock().map_err(|e| io("lock", &lock_path, e))?;
        Ok(Store { dir: dir.to_path_buf(), _lock: lock })
    }

    fn ip_path(&self, ip: IpAddr) -> PathBuf {
        self.dir.join(ip.to_string())
    }

    pub fn is_reserved(&self, ip: IpAddr) -> bool {
        self.ip_path(ip).exists()
    }

    /// Reserves `ip` for an attachment; false when it is already taken.
    pub fn reserve(&self, ip: IpAddr, id: &str, ifname: &str, set: usize) -> Result<bool> {
        let path = self.ip_path(ip);
        let mut f = match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(io("create", &path, e)),
        };
        f.write_all(format!("{id}\r\n{ifname}").as_bytes()).map_err(|e| io("write", &path, e))?;
        let last = self.dir.join(format!("last_reserved_ip.{set}"));
        fs::write(&last, ip.to_string()).map_err(|e| io("write", &last, e))?;
        Ok(true)
    }

    /// Drops a reservation made by this operation (used when a later step fails).
    pub fn unreserve(&self, ip: IpAddr) -> Result<()> {
        let path = self.ip_path(ip);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io("remove", &path, e)),
        }
    }

    pub fn last_reserved(&self, set: usize) -> Option<IpAddr> {
        fs::read_to_string(self.dir.join(format!("last_reserved_ip.{set}"))).ok().and_then(|s| s.trim().parse().ok())
    }

    /// Every reservation: (address, container id, ifname). Old host-local files hold only the id.
    pub fn entries(&self) -> Result<Vec<(IpAddr, String, String)>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(|e| io("read", &self.dir, e))? {
            let entry = entry.map_err(|e| io("read", &self.dir, e))?;
            let Some(ip) = entry.file_name().to_str().and_then(|n| n.parse::<IpAddr>().ok()) else { continue };
            let content = match fs::read_to_string(entry.path()) {
                Ok(c) => c,
                // Released by someone else between listing and reading: not an entry any more.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(io("read", &entry.path(), e)),
            };
            let (id, ifname) = content.split_once("\r\n").unwrap_or((content.as_str(), ""));
            out.push((ip, id.trim().to_string(), ifname.trim().to_string()));
        }
        out.sort();
        Ok(out)
    }

    /// The addresses reserved for an attachment.
    pub fn find(&self, id: &str, ifname: &str) -> Result<Vec<IpAddr>> {
        Ok(self
            .entries()?
            .into_iter()
            .filter(|(_, i, n)| i == id && (n == ifname || n.is_empty()))
            .map(|(ip, _, _)| ip)
            .collect())
    }

    /// Releases every address of an attachment; returns them.
    pub fn release(&self, id: &str, ifname: &str) -> Result<Vec<IpAddr>> {
        let ips = self.find(id, ifname)?;
        for ip in &ips {
            self.unreserve(*ip)?;
        }
        Ok(ips)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_find_release_in_host_local_format() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open_locked(&dir.path().join("lab")).unwrap();
        let ip: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(s.reserve(ip, "ctr-a", "eth0", 0).unwrap());
        assert!(!s.reserve(ip, "ctr-b", "eth0", 0).unwrap());
        assert_eq!(fs::read_to_string(dir.path().join("lab/10.0.0.2")).unwrap(), "ctr-a\r\neth0");
        assert_eq!(s.last_reserved(0), Some(ip));
        assert_eq!(s.find("ctr-a", "eth0").unwrap(), vec![ip]);
        assert!(s.find("ctr-a", "eth1").unwrap().is_empty());
        assert_eq!(s.release("ctr-a", "eth0").unwrap(), vec![ip]);
        assert!(s.release("ctr-a", "eth0").unwrap().is_empty());
        // An old-format file (id only) still belongs to its container.
        fs::write(dir.path().join("lab/10.0.0.3"), "ctr-c").unwrap();
        assert_eq!(s.find("ctr-c", "eth0").unwrap().len(), 1);
    }
}
