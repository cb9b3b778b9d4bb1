//! What survives an agent restart: a JSON record per pod in `<state-dir>/pods/` (sandbox and
//! workload PIDs with their start times, IPs, restart counts), which a restarted agent adopts.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::PodsConfig;
use crate::cni;
use crate::error::{KubeletError, Result};
use crate::podstatus::Terminated;
use crate::process::{ProcId, Processes, Sig};

/// What survives an agent restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodRecord {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub sandbox: ProcId,
    pub pod_ips: Vec<IpAddr>,
    pub start_time: Timestamp,
    pub containers: BTreeMap<String, ContainerRecord>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub process: Option<ProcId>,
    pub started_at: Option<Timestamp>,
    pub restart_count: i32,
    pub last: Option<Terminated>,
    /// Finished for good (its restart policy does not restart it).
    pub done: bool,
    /// A container of an image: its runtime's PID file (how exec and exec probes enter it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid_file: Option<std::path::PathBuf>,
    /// A container of an image: its ID for the runtime (`crun://ID` in the status).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_id: Option<String>,
}

/// Reads every pod record under an agent's state directory (unreadable ones are reported and
/// skipped).
pub fn load_records(state_dir: &Path) -> Vec<PodRecord> {
    let Ok(dir) = std::fs::read_dir(state_dir.join("pods")) else { return vec![] };
    let mut out = vec![];
    for e in dir.flatten() {
        let p = e.path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        match std::fs::read(&p)
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
        {
            Ok(r) => out.push(r),
            Err(e) => tracing::warn!(path = %p.display(), "ignoring an unreadable pod record: {e}"),
        }
    }
    out
}

/// SIGKILLs every process recorded under an agent's state directory (sandboxes and workloads,
/// each checked against its start time). Pods outlive their agent on purpose; this is how a lab
/// or a test that is going away stops them. Returns how many processes were signalled.
pub fn kill_recorded_processes(state_dir: &Path) -> usize {
    let procs = crate::process::LinuxProcesses::default();
    let mut killed = Vec::new();
    for r in load_records(state_dir) {
        for p in r.containers.values().filter_map(|c| c.process).chain([r.sandbox]) {
            if procs.alive(p) {
                procs.signal(p, Sig::Kill);
                killed.push(p);
            }
        }
    }
    // SIGKILL is asynchronous: wait (briefly) until they have exited, so the caller can remove
    // their namespaces and files knowing nothing uses them.
    let t = std::time::Instant::now();
    while killed.iter().any(|p| procs.alive(*p)) && t.elapsed() < std::time::Duration::from_secs(2) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    killed.len()
}

pub(super) fn save_record(cfg: &PodsConfig, r: &PodRecord) -> Result<()> {
    let dir = cfg.records_dir();
    std::fs::create_dir_all(&dir).map_err(|e| KubeletError::io(format!("create {}", dir.display()), e))?;
    cni::write_atomic(&cfg.record_path(&r.uid), &serde_json::to_vec_pretty(r).expect("json"))
}
