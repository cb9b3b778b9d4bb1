//! `podpath policy matrix`: every pod of the chosen namespaces probes every other on the chosen
//! ports and protocols from inside its own network namespace, and the answers are printed as
//! the upstream netpol suite (and Cyclonus) print a reachability matrix: rows from, columns to,
//! `.` connected, `X` not. A TCP probe succeeds when the connection is established; a UDP one
//! when the pod answers the datagram (podpath/echo answers every UDP container port).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use serde::Serialize;

use crate::hosts::in_netns_thread;
use crate::state::{ApiAccess, LabState};
use crate::{LabError, Result};

/// A probed pod: `namespace/name`, its address and the PID whose network namespace it is.
#[derive(Debug, Clone)]
pub struct Probed {
    pub id: String,
    pub ip: IpAddr,
    pub pid: u32,
}

/// `tcp` or `udp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
}

impl std::str::FromStr for Protocol {
    type Err = LabError;
    fn from_str(s: &str) -> Result<Protocol> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            other => Err(LabError::Usage(format!("protocol {other:?}: use tcp or udp (SCTP is not probed)"))),
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// One matrix per `protocol/port`: from → to → connected.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Matrix {
    pub pods: Vec<String>,
    pub results: BTreeMap<String, BTreeMap<String, BTreeMap<String, bool>>>,
}

/// The running pods of `namespaces` (all but kube-system when empty) that have an address on
/// the pod network, in namespace/name order.
pub fn pods(st: &LabState, namespaces: &[String]) -> Result<Vec<Probed>> {
    let api = ApiAccess::of(st)?;
    let (code, body) = api.get("/api/v1/pods")?;
    if code != 200 {
        return Err(LabError::NotReady(format!("listing pods answered HTTP {code}")));
    }
    let list: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("pod list is not JSON: {e}")))?;
    let mut out = vec![];
    for p in list["items"].as_array().into_iter().flatten() {
        let ns = p["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let wanted = if namespaces.is_empty() { ns != "kube-system" } else { namespaces.iter().any(|n| n == ns) };
        if !wanted || p["spec"]["hostNetwork"].as_bool() == Some(true) || p["status"]["phase"] != "Running" {
            continue;
        }
        let Some(ip) = p["status"]["podIP"].as_str().and_then(|i| i.parse().ok()) else { continue };
        let pid = crate::hosts::pod_pid(&api, ns, name)?
            .parse()
            .map_err(|_| LabError::NotReady(format!("pod {ns}/{name} has no process yet")))?;
        out.push(Probed { id: format!("{ns}/{name}"), ip, pid });
    }
    out.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// Probes every pair (a pod to itself included: it never leaves the pod, so it always
/// connects, as the upstream suite's `AllowLoopback` expects) on every port and protocol, all
/// at once, each probe waiting at most `timeout`.
pub fn probe_all(pods: &[Probed], ports: &[u16], protocols: &[Protocol], timeout: Duration) -> Result<Matrix> {
    let mut jobs = vec![];
    for from in pods {
        for to in pods {
            for proto in protocols {
                for port in ports {
                    let (ns, addr, proto, port) = (format!("/proc/{}/ns/net", from.pid), to.ip, *proto, *port);
                    let key = (format!("{proto}/{port}"), from.id.clone(), to.id.clone());
                    jobs.push((
                        key,
                        std::thread::spawn(move || {
                            in_netns_thread(ns, move || probe(SocketAddr::new(addr, port), proto, timeout))
                        }),
                    ));
                }
            }
        }
    }
    let mut m = Matrix { pods: pods.iter().map(|p| p.id.clone()).collect(), ..Default::default() };
    for ((table, from, to), job) in jobs {
        let ok = job.join().map_err(|_| LabError::NotReady("a probe thread panicked".into()))??;
        m.results.entry(table).or_default().entry(from).or_default().insert(to, ok);
    }
    Ok(m)
}

/// One probe from the current network namespace.
pub fn probe(addr: SocketAddr, proto: Protocol, timeout: Duration) -> bool {
    match proto {
        Protocol::Tcp => TcpStream::connect_timeout(&addr, timeout).is_ok(),
        Protocol::Udp => {
            let Ok(s) = UdpSocket::bind(("0.0.0.0", 0)) else { return false };
            let _ = s.set_read_timeout(Some(timeout));
            if s.connect(addr).is_err() || s.send(b"probe\n").is_err() {
                return false;
            }
            let mut buf = [0u8; 512];
            matches!(s.recv(&mut buf), Ok(n) if n > 0)
        }
    }
}

/// The matrices as text: one block per `protocol/port`.
pub fn render(m: &Matrix) -> String {
    let mut out = String::new();
    let width = m.pods.iter().map(String::len).max().unwrap_or(0).max(8);
    for (table, rows) in &m.results {
        out.push_str(&format!("{table:<width$}"));
        for p in &m.pods {
            out.push_str(&format!(" {p}"));
        }
        out.push('\n');
        for from in &m.pods {
            out.push_str(&format!("{from:<width$}"));
            for to in &m.pods {
                let mark = match rows.get(from).and_then(|r| r.get(to)) {
                    Some(true) => ".",
                    Some(false) => "X",
                    None => "?",
                };
                out.push_str(&format!(" {mark:<w$}", w = to.len()));
            }
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_print_as_the_upstream_suite_prints_them() {
        let mut m = Matrix { pods: vec!["x/a".into(), "x/b".into()], ..Default::default() };
        let t = m.results.entry("tcp/80".into()).or_default();
        t.entry("x/a".into()).or_default().extend([("x/a".to_string(), true), ("x/b".to_string(), false)]);
        t.entry("x/b".into()).or_default().extend([("x/a".to_string(), true), ("x/b".to_string(), true)]);
        assert_eq!(render(&m), "tcp/80   x/a x/b\nx/a      .   X  \nx/b      .   .  \n\n");
        assert!("sctp".parse::<Protocol>().is_err());
        assert_eq!("UDP".parse::<Protocol>().unwrap(), Protocol::Udp);
    }
}
