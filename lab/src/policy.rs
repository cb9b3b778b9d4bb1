//! NetworkPolicies in a lab: `podpath explain networkpolicy` ([`explain`]: which pods a policy
//! isolates, what each rule admits, resolved to pods and ports, and the rules each node wrote
//! for it) and `podpath policy matrix`: every pod of the chosen namespaces probes every other on the chosen
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
    /// The node the pod runs on.
    pub node: String,
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
    pods_with(&api, namespaces, |ns, name, _| crate::hosts::pod_pid(st, &api, ns, name))
}

/// The pods of a Vagrant lab to probe (each container's process read on its node VM).
pub fn pods_vagrant(v: &crate::vagrant::VagrantLab, namespaces: &[String]) -> Result<Vec<Probed>> {
    pods_with(&v.api()?, namespaces, |_, _, pod| crate::vagrant::container_process(v, pod))
}

/// [`pods`], each pod's process found by `pid_of(namespace, name, pod)`.
fn pods_with(
    api: &ApiAccess,
    namespaces: &[String],
    pid_of: impl Fn(&str, &str, &serde_json::Value) -> Result<String>,
) -> Result<Vec<Probed>> {
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
        let pid = pid_of(ns, name, p)?
            .parse()
            .map_err(|_| LabError::NotReady(format!("pod {ns}/{name} has no process yet")))?;
        let node = p["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
        out.push(Probed { id: format!("{ns}/{name}"), ip, pid, node });
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

/// [`probe_all`] on a Vagrant lab: per source pod, one `podpath trace-helper connect` in its
/// network namespace on its node (over SSH), every target at once.
pub fn probe_all_vagrant(
    v: &crate::vagrant::VagrantLab,
    pods: &[Probed],
    ports: &[u16],
    protocols: &[Protocol],
    timeout: Duration,
) -> Result<Matrix> {
    let mut targets = vec![];
    for to in pods {
        for proto in protocols {
            for port in ports {
                targets.push((to.id.clone(), *proto, SocketAddr::new(to.ip, *port)));
            }
        }
    }
    let results: Vec<Result<Vec<bool>>> = std::thread::scope(|s| {
        let jobs: Vec<_> = pods
            .iter()
            .map(|from| {
                let targets = &targets;
                s.spawn(move || -> Result<Vec<bool>> {
                    let pid = from.pid.to_string();
                    let timeout_ms = timeout.as_millis().to_string();
                    let mut argv = vec![
                        "nsenter",
                        "-t",
                        &pid,
                        "-n",
                        "--",
                        "podpath",
                        "trace-helper",
                        "connect",
                        "--timeout-ms",
                        &timeout_ms,
                    ];
                    let wanted: Vec<String> =
                        targets.iter().map(|(_, proto, addr)| format!("{proto}/{addr}")).collect();
                    argv.extend(wanted.iter().map(String::as_str));
                    let out = v.run(&from.node, &argv)?;
                    let got = parse_connect(&out);
                    Ok(wanted.iter().map(|w| got.get(w).copied().unwrap_or(false)).collect())
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap_or_else(|_| Err(LabError::NotReady("a probe thread panicked".into()))))
            .collect()
    });
    let mut m = Matrix { pods: pods.iter().map(|p| p.id.clone()).collect(), ..Default::default() };
    for (from, oks) in pods.iter().zip(results) {
        for ((to, proto, addr), ok) in targets.iter().zip(oks?) {
            let table = format!("{proto}/{}", addr.port());
            m.results.entry(table).or_default().entry(from.id.clone()).or_default().insert(to.clone(), ok);
        }
    }
    Ok(m)
}

/// `podpath trace-helper connect`'s targets (`tcp/10.244.1.4:80`), probed at once from the
/// current namespace: one line each, `TARGET ok|no`.
pub fn connect_lines(targets: &[String], timeout: Duration) -> Result<String> {
    let mut jobs = vec![];
    for t in targets {
        let (proto, addr) = t
            .split_once('/')
            .ok_or_else(|| LabError::Usage(format!("{t:?}: give PROTOCOL/ADDRESS:PORT (tcp/10.244.1.4:80)")))?;
        let proto: Protocol = proto.parse()?;
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| LabError::Usage(format!("{t:?}: give PROTOCOL/ADDRESS:PORT (tcp/10.244.1.4:80)")))?;
        jobs.push((t.clone(), std::thread::spawn(move || probe(addr, proto, timeout))));
    }
    let mut out = String::new();
    for (t, j) in jobs {
        let ok = j.join().map_err(|_| LabError::NotReady("a probe thread panicked".into()))?;
        out.push_str(&format!("{t} {}\n", if ok { "ok" } else { "no" }));
    }
    Ok(out)
}

/// [`connect_lines`]' output: target → connected.
fn parse_connect(out: &str) -> BTreeMap<String, bool> {
    out.lines().filter_map(|l| l.split_once(' ')).map(|(t, r)| (t.to_string(), r == "ok")).collect()
}

/// One probe from the current network namespace.
pub fn probe(addr: SocketAddr, proto: Protocol, timeout: Duration) -> bool {
    match proto {
        Protocol::Tcp => TcpStream::connect_timeout(&addr, timeout).is_ok(),
        Protocol::Udp => {
            let any: std::net::IpAddr =
                if addr.is_ipv6() { std::net::Ipv6Addr::UNSPECIFIED.into() } else { [0, 0, 0, 0].into() };
            let Ok(s) = UdpSocket::bind((any, 0)) else { return false };
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

/// A policy explained (`podpath explain networkpolicy`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct PolicyExplanation {
    pub policy: String,
    pub policy_types: Vec<String>,
    /// `NS/NAME (IP, NODE)` of every pod it selects.
    pub selected: Vec<String>,
    /// One entry per rule: `ingress[0]: from … ; ports …`.
    pub rules: Vec<String>,
    /// Per node, the rules the node agent wrote for this policy.
    pub nodes: BTreeMap<String, Vec<String>>,
    pub notes: Vec<String>,
}

/// Explains `policy` over the pods of the lab (`world`: each pod with its node) and each node's
/// policy rules as text (`iptables-save -t filter` or `nft list table ip podpath-policy`).
/// Pure.
pub fn explain_policy(
    policy: &api::k8s_openapi::api::networking::v1::NetworkPolicy,
    world: &[(api::netpol::Pod, String)],
    dumps: &BTreeMap<String, String>,
) -> PolicyExplanation {
    use api::k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use api::netpol::{self, Direction, End};
    let ns = policy.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let key = format!("{ns}/{}", policy.metadata.name.clone().unwrap_or_default());
    let types = netpol::types(policy);
    let selected: Vec<&(api::netpol::Pod, String)> =
        world.iter().filter(|(p, _)| netpol::selects_pod(policy, p)).collect();
    let mut rules = vec![];
    for d in [Direction::Ingress, Direction::Egress] {
        let word = if d == Direction::Ingress { "from" } else { "to" };
        for (i, (peers, ports)) in netpol::rules(policy, d).iter().enumerate() {
            let peers_text = match peers.as_deref() {
                None | Some([]) => vec![format!("{word} anywhere")],
                Some(list) => list
                    .iter()
                    .enumerate()
                    .map(|(j, peer)| {
                        if let Some(b) = &peer.ip_block {
                            let except = b.except.clone().unwrap_or_default();
                            let except = if except.is_empty() {
                                String::new()
                            } else {
                                format!(" except {}", except.join(", "))
                            };
                            return format!("{word}[{j}]: ipBlock {}{except}", b.cidr);
                        }
                        let pods: Vec<String> = world
                            .iter()
                            .filter(|(o, _)| netpol::peer_matches(peer, &ns, &End::Pod(o)))
                            .map(|(o, _)| format!("{}/{}", o.namespace, o.name))
                            .collect();
                        let list = if pods.is_empty() { "no pod now".to_string() } else { pods.join(", ") };
                        format!("{word}[{j}]: {list}")
                    })
                    .collect(),
            };
            let ports_text = match ports.as_deref() {
                None | Some([]) => vec!["every port and protocol".to_string()],
                Some(list) => list
                    .iter()
                    .enumerate()
                    .map(|(k, p)| {
                        let proto = p.protocol.clone().unwrap_or_else(|| "TCP".into());
                        match &p.port {
                            None => format!("ports[{k}]: every {proto} port"),
                            Some(IntOrString::Int(n)) => match p.end_port {
                                Some(e) => format!("ports[{k}]: {proto} {n}-{e}"),
                                None => format!("ports[{k}]: {proto} {n}"),
                            },
                            Some(IntOrString::String(name)) => {
                                format!("ports[{k}]: {proto} port named {name:?} (its number on each destination pod)")
                            }
                        }
                    })
                    .collect(),
            };
            rules.push(format!(
                "{}[{i}]: {}; {}",
                d.name().to_lowercase(),
                peers_text.join("; "),
                ports_text.join("; ")
            ));
        }
    }
    let mut notes = vec![];
    for d in &types {
        let n = netpol::rules(policy, *d).len();
        if n == 0 {
            notes.push(format!(
                "no {} rule: the selected pods take no {} traffic but what another policy allows (deny by default)",
                d.name().to_lowercase(),
                d.name().to_lowercase()
            ));
        }
    }
    if selected.is_empty() {
        notes.push("it selects no pod now: it changes nothing until a pod matches its podSelector".into());
    }
    notes.push(
        "isolation is per pod and direction; several policies selecting a pod add up (a connection needs one rule \
         of any of them); a connection also needs the other end's egress or ingress"
            .into(),
    );
    // The lines of each node's rules that concern this policy: its rule comments, and the
    // drops of the pods it isolates.
    let mut nodes = BTreeMap::new();
    for (node, dump) in dumps {
        let needle = format!("{key} ");
        let lines: Vec<String> = dump
            .lines()
            .map(str::trim)
            .filter(|l| {
                l.contains(&needle)
                    || l.contains(&format!("isolated by {key}"))
                    || l.contains(&format!("{key})"))
                    || l.contains(&format!("{key},"))
            })
            .map(str::to_string)
            .collect();
        if !lines.is_empty() {
            nodes.insert(node.clone(), lines);
        }
    }
    PolicyExplanation {
        policy: key,
        policy_types: types.iter().map(|d| d.name().to_string()).collect(),
        selected: selected.iter().map(|(p, node)| format!("{}/{} ({}, {node})", p.namespace, p.name, p.ip)).collect(),
        rules,
        nodes,
        notes,
    }
}

/// The explanation as text.
pub fn explain_text(e: &PolicyExplanation) -> String {
    let mut out = format!("NetworkPolicy {} (policyTypes: {})\n", e.policy, e.policy_types.join(", "));
    out +=
        &format!("  selects: {}\n", if e.selected.is_empty() { "no pod".to_string() } else { e.selected.join(", ") });
    for r in &e.rules {
        out += &format!("  {r}\n");
    }
    for (node, lines) in &e.nodes {
        out += &format!("{node}:\n");
        for l in lines {
            out += &format!("  {l}\n");
        }
    }
    for n in &e.notes {
        out += &format!("note: {n}\n");
    }
    out
}

/// Reads what [`explain_policy`] needs from the lab (the API, every node's rules).
pub fn explain(st: &LabState, target: &str) -> Result<PolicyExplanation> {
    let plan = crate::plan::Plan::with_family(&st.name, st.nodes, st.ip_family);
    let nodes: Vec<String> = plan.nodes.iter().map(|n| n.name.clone()).collect();
    explain_with(&ApiAccess::of(st)?, target, &nodes, |node| {
        let netns = plan.netns_of(node).expect("planned");
        if st.proxy_mode == crate::ProxyMode::Nftables {
            podpath_ruleset::Nft::in_netns(netns)
                .list_table(podpath_ruleset::nft::NftFamily::Ip, "podpath-policy", false)
                .ok()
                .flatten()
                .unwrap_or_default()
        } else {
            podpath_ruleset::Iptables::new(podpath_ruleset::Backend::System)
                .in_netns(netns)
                .save_text("filter")
                .unwrap_or_default()
        }
    })
}

/// [`explain`] on the Vagrant lab: each node VM's policy rules read over SSH (the table `ip
/// podpath-policy` on a node in nftables mode, its iptables filter table otherwise).
pub fn explain_vagrant(v: &crate::vagrant::VagrantLab, target: &str) -> Result<PolicyExplanation> {
    explain_with(&v.api()?, target, &v.nodes(), |node| {
        v.run(node, &["nft", "list", "table", "ip", "podpath-policy"])
            .or_else(|_| v.run(node, &["iptables-save", "-t", "filter"]))
            .unwrap_or_default()
    })
}

/// The explanation from the API's objects and each of `nodes`' rules as `dump` reads them.
fn explain_with(
    api: &ApiAccess,
    target: &str,
    nodes: &[String],
    dump: impl Fn(&str) -> String,
) -> Result<PolicyExplanation> {
    let (ns, name) = target.split_once('/').unwrap_or(("default", target));
    let get = |path: &str| -> Result<serde_json::Value> {
        let (code, body) = api.get(path)?;
        match code {
            200 => serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("{path}: not JSON: {e}"))),
            404 => Err(LabError::Usage(format!("networkpolicy {ns}/{name} not found"))),
            c => Err(LabError::NotReady(format!("{path} answered HTTP {c}"))),
        }
    };
    let policy = <api::k8s_openapi::api::networking::v1::NetworkPolicy as api::Codec>::from_json(get(&format!(
        "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}"
    ))?)
    .map_err(|e| LabError::NotReady(format!("networkpolicy {ns}/{name}: {e}")))?;
    let labels = |v: &serde_json::Value| -> BTreeMap<String, String> {
        serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default()
    };
    let nss: BTreeMap<String, BTreeMap<String, String>> = get("/api/v1/namespaces")?["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| (n["metadata"]["name"].as_str().unwrap_or_default().to_string(), labels(n)))
        .collect();
    let mut world = vec![];
    for p in get("/api/v1/pods")?["items"].as_array().into_iter().flatten() {
        if p["spec"]["hostNetwork"].as_bool() == Some(true) {
            continue;
        }
        let Some(ip) = p["status"]["podIP"].as_str().and_then(|i| i.parse().ok()) else { continue };
        let pns = p["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        let named_ports = p["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .filter_map(|cp| {
                Some((
                    cp["name"].as_str()?.to_string(),
                    u16::try_from(cp["containerPort"].as_u64()?).ok()?,
                    cp["protocol"].as_str().unwrap_or("TCP").to_string(),
                ))
            })
            .collect();
        world.push((
            api::netpol::Pod {
                name: p["metadata"]["name"].as_str().unwrap_or_default().to_string(),
                labels: labels(p),
                namespace_labels: nss.get(&pns).cloned().unwrap_or_default(),
                namespace: pns,
                ip,
                named_ports,
            },
            p["spec"]["nodeName"].as_str().unwrap_or("?").to_string(),
        ));
    }
    let dumps: BTreeMap<String, String> = nodes.iter().map(|n| (n.clone(), dump(n))).collect();
    Ok(explain_policy(&policy, &world, &dumps))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, ip: &str, labels: &[(&str, &str)]) -> (api::netpol::Pod, String) {
        (
            api::netpol::Pod {
                namespace: ns.into(),
                name: name.into(),
                labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                namespace_labels: [("ns".to_string(), ns.to_string())].into(),
                ip: ip.parse().unwrap(),
                named_ports: vec![],
            },
            "node-1".into(),
        )
    }

    #[test]
    fn a_policy_is_explained_with_the_pods_it_selects_and_admits_and_its_rules_on_each_node() {
        let policy: api::k8s_openapi::api::networking::v1::NetworkPolicy = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "x"},
            "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}},
                                           {"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.1.0.0/16"]}}],
                                  "ports": [{"port": 80, "protocol": "TCP"}, {"port": "http", "protocol": "TCP"}]}]}
        }))
        .unwrap();
        let world = [
            pod("x", "web", "10.244.1.2", &[("app", "web")]),
            pod("x", "db", "10.244.1.3", &[]),
            pod("y", "a", "10.244.2.2", &[]),
        ];
        let dumps: BTreeMap<String, String> = [(
            "node-1".to_string(),
            "-A PODPATH-ING-X -s 10.244.2.2/32 -p tcp -m tcp --dport 80 -m comment --comment \"x/web ingress[0] from[0] ports[0]\" -j ACCEPT
             -A PODPATH-ING-X -m comment --comment \"no policy allows this ingress (isolated by x/web)\" -j DROP
             -A PODPATH-ING-Y -m comment --comment \"x/webby ingress[0]\" -j ACCEPT
"
                .to_string(),
        )]
        .into();
        let e = explain_policy(&policy, &world, &dumps);
        assert_eq!(e.selected, ["x/web (10.244.1.2, node-1)"]);
        assert_eq!(
            e.rules,
            ["ingress[0]: from[0]: y/a; from[1]: ipBlock 10.0.0.0/8 except 10.1.0.0/16; ports[0]: TCP 80; ports[1]: TCP port named \"http\" (its number on each destination pod)"]
        );
        assert_eq!(e.nodes["node-1"].len(), 2, "{:?}", e.nodes);
        let text = explain_text(&e);
        assert!(text.starts_with("NetworkPolicy x/web (policyTypes: Ingress)\n  selects: x/web"), "{text}");
    }

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
