//! What a lab is: `<state-dir>/lab.json` (its processes, each by PID and start time, its
//! namespaces, its API address), and the kubeconfig that reaches it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{io, LabError, Result};

/// A process the lab started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Proc {
    pub component: String,
    pub pid: i32,
    /// `/proc/<pid>/stat` start time: a PID reused by another process is never signalled.
    pub start_time: u64,
}

/// `<state-dir>/lab.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LabState {
    pub name: String,
    pub nodes: usize,
    pub proxy_mode: ProxyMode,
    #[serde(default)]
    pub lb_mode: LbMode,
    pub api: String,
    pub namespaces: Vec<String>,
    pub procs: Vec<Proc>,
    /// Where the lab's binaries are (`down` asks `node-agent` to stop the pods it recorded);
    /// absent in the state of labs made before it was recorded: this program's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bin_dir: Option<PathBuf>,
}

/// The nodes' service proxy (`node-agent --proxy-mode`). The lab keeps its own list of the
/// modes: it drives the components through their command lines, never links them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// kube-proxy's iptables mode (DNAT in the kernel).
    #[default]
    Iptables,
    /// kube-proxy's old userspace mode (a proxy socket per service port).
    Userspace,
}

/// How the gateway delivers LoadBalancer IPs (`lb-sim --mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LbMode {
    /// Routed to a healthy node, the packet unchanged (GKE/MetalLB style).
    #[default]
    Passthrough,
    /// Proxied to `node IP:nodePort` of healthy nodes (classic cloud LB).
    Nodeport,
}

/// The word a mode has on command lines (`iptables`, `nodeport`).
pub fn flag_value(v: &impl clap::ValueEnum) -> String {
    v.to_possible_value().map(|p| p.get_name().to_string()).unwrap_or_default()
}

impl std::fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&flag_value(self))
    }
}

impl std::fmt::Display for LbMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&flag_value(self))
    }
}

/// Where lb-sim serves its status, inside the gateway's namespace.
pub const LB_STATUS: &str = "127.0.0.1:9900";

/// Default state directory of a lab.
pub fn default_state_dir(name: &str) -> PathBuf {
    PathBuf::from("/var/lib/podpath").join(name)
}

pub(crate) fn state_file(dir: &Path) -> PathBuf {
    dir.join("lab.json")
}

pub fn load_state(dir: &Path) -> Result<Option<LabState>> {
    match std::fs::read(state_file(dir)) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| LabError::Usage(format!("{} is not a lab state file: {e}", state_file(dir).display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(format!("read {}", state_file(dir).display()))(e)),
    }
}

pub(crate) fn save_state(dir: &Path, st: &LabState) -> Result<()> {
    let tmp = dir.join("lab.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(st).expect("serializable")).map_err(io("write the lab state"))?;
    std::fs::rename(&tmp, state_file(dir)).map_err(io("write the lab state"))
}

/// Running, and the same process (a zombie whose parent is gone counts as dead).
pub(crate) fn alive(p: &Proc) -> bool {
    let zombie = std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
        .ok()
        .and_then(|s| s.rfind(')').map(|i| s[i + 1..].trim_start().starts_with('Z')))
        .unwrap_or(true);
    !zombie && podpath_client::daemon::start_time(p.pid) == Some(p.start_time)
}

pub fn kubeconfig_path(state_dir: &Path) -> PathBuf {
    state_dir.join("kubeconfig")
}

pub fn kubeconfig(name: &str, api: SocketAddr) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: podpath-{name}\n  cluster:\n    server: http://{api}\n\
         users:\n- name: podpath-{name}\n  user: {{}}\ncontexts:\n- name: podpath-{name}\n  context:\n    \
         cluster: podpath-{name}\n    user: podpath-{name}\n    namespace: default\ncurrent-context: podpath-{name}\n"
    )
}

/// The API server's address from the lab state.
pub(crate) fn api_addr(st: &LabState) -> Result<SocketAddr> {
    st.api.parse().map_err(|_| LabError::Usage(format!("bad API address {:?} in the lab state", st.api)))
}
