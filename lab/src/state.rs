//! What a lab is: `<state-dir>/lab.json` (its processes, each by PID and start time, its
//! namespaces, its API address), and the kubeconfig that reaches it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use podpath_client::http;

use crate::{io, LabError, Result};

/// A process the lab started.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Proc {
    pub component: String,
    pub pid: i32,
    /// `/proc/<pid>/stat` start time: a PID reused by another process is never signalled.
    pub start_time: u64,
    /// How it was started (command line, extra environment), so that it can be started again
    /// (`podpath agent restart`); empty in the state of labs made before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
}

/// `<state-dir>/lab.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LabState {
    pub name: String,
    pub nodes: usize,
    pub proxy_mode: ProxyMode,
    /// The nftables mode's layout (`current`, `v1.34` or `shared-maps`); absent for the other modes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nftables_layout: Option<String>,
    #[serde(default)]
    pub lb_mode: LbMode,
    /// The cluster's IP families (`--ip-family`); labs made before it are IPv4.
    #[serde(default)]
    pub ip_family: crate::family::IpFamilyMode,
    pub api: String,
    /// The API server's CA (TLS); absent for a lab made before the API spoke TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The bearer token every component presents to the API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    pub namespaces: Vec<String>,
    pub procs: Vec<Proc>,
    /// Where the lab's binaries are (`down` asks `node-agent` to stop the pods it recorded);
    /// absent in the state of labs made before it was recorded: this program's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bin_dir: Option<PathBuf>,
    /// The state directory it was read from (not stored: it is where the file is).
    #[serde(skip)]
    pub dir: PathBuf,
}

/// The nodes' service proxy (`node-agent --proxy-mode`). The lab keeps its own list of the
/// modes: it drives the components through their command lines, never links them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// kube-proxy's iptables mode (DNAT in the kernel).
    #[default]
    Iptables,
    /// kube-proxy's nftables mode (the table `ip kube-proxy`: verdict maps and sets).
    Nftables,
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
        Ok(b) => serde_json::from_slice::<LabState>(&b)
            .map(|mut st| {
                st.dir = dir.to_path_buf();
                Some(st)
            })
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

/// The lab's kubeconfig: https with the lab CA's certificate and the lab's bearer token.
pub fn kubeconfig(name: &str, api: SocketAddr, ca_pem: &str, token: &str) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: podpath-{name}\n  cluster:\n    server: https://{api}\n\
         \x20   certificate-authority-data: {ca}\nusers:\n- name: podpath-{name}\n  user:\n    token: {token}\n\
         contexts:\n- name: podpath-{name}\n  context:\n    cluster: podpath-{name}\n    user: podpath-{name}\n    \
         namespace: default\ncurrent-context: podpath-{name}\n"
    )
}

/// How the CLI reaches a lab's API: its address, TLS with the lab CA, the bearer token.
pub struct ApiAccess {
    pub addr: SocketAddr,
    tls: Option<http::Tls>,
    auth: Option<String>,
}

impl ApiAccess {
    /// From what the lab state records (a lab without a CA is reached over plain HTTP).
    pub fn of(st: &LabState) -> Result<ApiAccess> {
        let addr =
            st.api.parse().map_err(|_| LabError::Usage(format!("bad API address {:?} in the lab state", st.api)))?;
        let tls = match &st.ca_file {
            Some(f) => {
                let pem = std::fs::read_to_string(f).map_err(io(format!("read the lab CA {}", f.display())))?;
                Some(http::Tls::new(&pem, "kubernetes")?)
            }
            None => None,
        };
        let auth = match &st.token_file {
            Some(f) => Some(format!(
                "Bearer {}",
                std::fs::read_to_string(f).map_err(io(format!("read the lab token {}", f.display())))?.trim()
            )),
            None => None,
        };
        Ok(ApiAccess { addr, tls, auth })
    }

    /// From a server URL (`https://HOST:PORT`, or `http://` for an `--insecure-http` server),
    /// the CA certificate that signed its serving certificate (PEM) and a bearer token: for an
    /// API server podpath did not start itself (`podpath addon`).
    pub fn to_server(server: &str, ca_pem: Option<&str>, token: Option<&str>) -> Result<ApiAccess> {
        let bad =
            || LabError::Usage(format!("--server {server:?}: expected https://HOST:PORT (an IP address and a port)"));
        let (tls, rest) = match (server.strip_prefix("https://"), server.strip_prefix("http://")) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => return Err(bad()),
        };
        let addr: SocketAddr = rest.trim_end_matches('/').parse().map_err(|_| bad())?;
        let tls = match (tls, ca_pem) {
            (true, Some(pem)) => Some(http::Tls::new(pem, "kubernetes")?),
            (true, None) => {
                return Err(LabError::Usage(format!("--server {server}: https needs --certificate-authority")))
            }
            (false, _) => None,
        };
        Ok(ApiAccess { addr, tls, auth: token.map(|t| format!("Bearer {}", t.trim())) })
    }

    /// The TLS settings and `Authorization` header value, for a caller with its own connection
    /// (`podpath ui`'s watches).
    pub(crate) fn parts(&self) -> (Option<&http::Tls>, Option<&str>) {
        (self.tls.as_ref(), self.auth.as_deref())
    }

    /// One GET (JSON accepted): status and body.
    pub fn get(&self, path: &str) -> Result<(u16, String)> {
        self.request("GET", path, "")
    }

    /// One request with a JSON body (none when empty): status and body.
    pub fn request(&self, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
        let mut headers = vec![("Accept", "application/json"), ("Content-Type", "application/json")];
        if let Some(a) = &self.auth {
            headers.push(("Authorization", a.as_str()));
        }
        let req = http::Request { method, path, headers: &headers, body: body.as_bytes() };
        let r = http::blocking_via(self.addr, self.tls.as_ref(), &req, std::time::Duration::from_secs(5))?;
        Ok((r.status, r.text()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_url_is_an_address_a_scheme_and_what_https_needs() {
        let a = ApiAccess::to_server("http://192.168.56.10:6443/", None, Some("t0k\n")).unwrap();
        assert_eq!(a.addr.to_string(), "192.168.56.10:6443");
        let (tls, auth) = a.parts();
        assert!(tls.is_none());
        assert_eq!(auth, Some("Bearer t0k"));
        for (server, want) in [
            ("192.168.56.10:6443", "expected https://HOST:PORT"),
            ("https://control-plane:6443", "expected https://HOST:PORT"),
            ("https://192.168.56.10", "expected https://HOST:PORT"),
            ("https://192.168.56.10:6443", "https needs --certificate-authority"),
        ] {
            let e = ApiAccess::to_server(server, None, None).err().expect(server).to_string();
            assert!(e.contains(want) && e.contains(server), "{server}: {e}");
        }
        let e = ApiAccess::to_server("https://127.0.0.1:6443", Some("not a PEM"), None).err().expect("bad CA");
        assert!(!e.to_string().is_empty());
    }
}
