//! Network faults on a lab's nodes (`podpath fault`): a node's uplink down, a blackhole route,
//! random packet loss, added delay, a stalled service proxy. Each fault is a pair of command lists — how to make it, how
//! to undo it — planned by pure functions, run in the node's namespace, and recorded in the
//! lab's state directory (`faults.json`), so that `fault list` shows them and `fault clear`
//! undoes them; `podpath down` deletes the namespaces they live in.
//!
//! Packet loss uses nftables (`numgen random mod 100`) in a table of its own, `ip
//! podpath-faults`: the kernels podpath runs on often have no netem, which `tc` needs for
//! loss and delay.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::plan::Plan;
use crate::state::LabState;
use crate::up::run;
use crate::{io, LabError, Result};

/// One fault in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    /// `link-down`, `blackhole`, `loss`, `delay` or `stall-proxy`.
    pub kind: String,
    pub node: String,
    /// What it does, in words (`eth0 (the uplink) down`, `packets to and from 10.244.2.0/24 discarded …`).
    pub detail: String,
    /// When it was made (RFC 3339).
    pub at: String,
    /// The commands that undo it, in order.
    pub undo: Vec<Step>,
}

/// One command: its argv and, for `nft -f -`, its standard input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
}

/// What a user asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    LinkDown,
    Blackhole(ipnet::IpNet),
    Loss(u8),
    Delay(u32),
    /// The node agent's service proxy stops syncing until `until` (Unix seconds; None: until
    /// cleared).
    StallProxy {
        until: Option<f64>,
    },
}

impl Request {
    /// A proxy stall for `seconds` from now, or until cleared.
    pub fn stall_for(seconds: Option<u32>) -> Request {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
        Request::StallProxy { until: seconds.map(|s| now + f64::from(s)) }
    }
}

/// `fault link up NODE`: undoes `link down`; refused when the uplink was not taken down.
pub fn link_up(dir: &Path, node: &str) -> Result<()> {
    let cleared = clear(dir, |f| f.node == node && f.kind == "link-down")?;
    if cleared.is_empty() {
        return Err(LabError::Usage(format!("{node}'s uplink was not taken down by `podpath fault link down`")));
    }
    Ok(())
}

/// The nftables table that carries packet loss.
const LOSS_TABLE: &str = "podpath-faults";
/// The table of a blackhole fault's packets coming in (one blackhole per node).
const BLACKHOLE_TABLE: &str = "podpath-blackhole";

fn argv(parts: &[&str]) -> Step {
    Step { argv: parts.iter().map(|s| s.to_string()).collect(), input: None }
}

/// Where a node's fault commands run: in its namespace, from this machine (its uplink is
/// `eth0`), or on the node itself — a Vagrant lab's VM, the commands then sent over SSH — whose
/// link to the lab's network is `nic`.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    Netns(&'a str, &'a Uplink),
    OnNode { nic: &'a str },
}

/// What `podpath up` gave a node's uplink that the kernel takes away with the link: its IPv6
/// addresses (dropped when a link goes down) and its default routes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Uplink {
    /// CIDRs, as `podpath up` added them.
    pub v6_addresses: Vec<String>,
    /// Default routes' gateways.
    pub defaults: Vec<std::net::IpAddr>,
}

impl Uplink {
    /// The uplink (`eth0`) of namespace `ns` in the lab's plan. Pure.
    pub fn of(plan: &Plan, ns: &str) -> Uplink {
        Uplink {
            v6_addresses: plan
                .addrs
                .iter()
                .filter(|a| a.netns == ns && a.dev == "eth0" && a.cidr.contains(':'))
                .map(|a| a.cidr.clone())
                .collect(),
            defaults: plan.routes.iter().filter(|r| r.netns == ns).map(|r| r.via).collect(),
        }
    }
}

impl Place<'_> {
    /// `ip [PRE…] [-n NS] REST…`.
    fn ip(&self, pre: &[&str], rest: &[&str]) -> Step {
        let mut v = vec!["ip"];
        v.extend_from_slice(pre);
        if let Place::Netns(ns, _) = self {
            v.extend(["-n", ns]);
        }
        v.extend_from_slice(rest);
        argv(&v)
    }
    /// A command in the node's network namespace.
    fn exec(&self, rest: &[&str]) -> Step {
        let mut v = vec![];
        if let Place::Netns(ns, _) = self {
            v.extend(["ip", "netns", "exec", ns]);
        }
        v.extend_from_slice(rest);
        argv(&v)
    }
    fn nic(&self) -> &str {
        match self {
            Place::Netns(..) => "eth0",
            Place::OnNode { nic } => nic,
        }
    }
    /// The link in words.
    fn link(&self) -> String {
        match self {
            Place::Netns(..) => "eth0 (the uplink)".into(),
            Place::OnNode { nic } => format!("{nic} (the lab's network)"),
        }
    }
}

/// The commands that make `req` on the node at `place` whose agent keeps its state in
/// `agent_dir`, and the fault they make (without its time). Pure.
pub fn plan(place: Place, node: &str, agent_dir: &Path, req: &Request) -> (Vec<Step>, Fault) {
    let nic = place.nic();
    let fault = |kind: &str, detail: String, undo: Vec<Step>| Fault {
        kind: kind.into(),
        node: node.into(),
        detail,
        at: String::new(),
        undo,
    };
    match req {
        Request::LinkDown => {
            let mut undo = vec![place.ip(&[], &["link", "set", nic, "up"])];
            // A link going down takes its routes (and IPv6 addresses) with it. The lab's own
            // come back as a host's network configuration brings them back when its link
            // returns: on a VM from its provisioned script, as at boot; in a namespace lab
            // from the lab's plan. The agent puts back its routes to other nodes' pods itself.
            match place {
                Place::OnNode { .. } => {
                    undo.push(argv(&["sh", "-c", "if [ -x /etc/podpath/net-up ]; then /etc/podpath/net-up; fi"]))
                }
                Place::Netns(_, uplink) => {
                    for cidr in &uplink.v6_addresses {
                        undo.push(place.ip(&["-6"], &["addr", "replace", cidr, "dev", nic, "nodad"]));
                    }
                    for via in &uplink.defaults {
                        let fam = if via.is_ipv6() { "-6" } else { "-4" };
                        undo.push(place.ip(&[fam], &["route", "replace", "default", "via", &via.to_string()]));
                    }
                }
            }
            (
                vec![place.ip(&[], &["link", "set", nic, "down"])],
                fault("link-down", format!("{} down", place.link()), undo),
            )
        }
        Request::Blackhole(cidr) => {
            let c = cidr.to_string();
            let (fam, saddr) = if cidr.addr().is_ipv6() { ("-6", "ip6") } else { ("-4", "ip") };
            // Both ways, as a partition cuts a node off: out, a routing rule, not a route (the
            // node's own route to the CIDR — another node's pods — stays as it is, and the rule
            // is looked at first); in, nftables before conntrack, since a rule cannot come before
            // the local table's for packets to the node's own address. One way only, a TCP
            // stream from the CIDR kept delivering what its peer sent until the window filled.
            let rules = format!(
                "table inet {BLACKHOLE_TABLE} {{\n\
                 \tchain in {{ type filter hook prerouting priority -310; {saddr} saddr {c} counter drop comment \"podpath fault: blackhole {c}\"; }}\n\
                 }}\n"
            );
            (
                vec![
                    place.ip(&[fam], &["rule", "add", "to", &c, "blackhole", "pref", "90"]),
                    Step { input: Some(rules), ..place.exec(&["nft", "-f", "-"]) },
                ],
                fault(
                    "blackhole",
                    format!(
                        "packets to and from {c} discarded (ip rule before every route; in: nftables, table inet {BLACKHOLE_TABLE})"
                    ),
                    vec![
                        place.ip(&[fam], &["rule", "del", "to", &c, "blackhole", "pref", "90"]),
                        place.exec(&["nft", "delete", "table", "inet", BLACKHOLE_TABLE]),
                    ],
                ),
            )
        }
        Request::Loss(percent) => {
            // Both ways on the uplink, before conntrack and NAT (raw priority); 100% is every
            // packet (nft takes `numgen mod 100 <` up to 99 only).
            let pick = if *percent >= 100 { String::new() } else { format!("numgen random mod 100 < {percent} ") };
            let rules = format!(
                "table inet {LOSS_TABLE} {{\n\
                 \tchain in {{ type filter hook prerouting priority -310; iifname \"{nic}\" {pick}counter drop comment \"podpath fault: loss {percent}%\"; }}\n\
                 \tchain out {{ type filter hook output priority -310; oifname \"{nic}\" {pick}counter drop comment \"podpath fault: loss {percent}%\"; }}\n\
                 }}\n"
            );
            (
                vec![Step { input: Some(rules), ..place.exec(&["nft", "-f", "-"]) }],
                fault(
                    "loss",
                    format!(
                        "drops {percent}% of the packets in and out of {nic} (nftables numgen, table inet {LOSS_TABLE})"
                    ),
                    vec![place.exec(&["nft", "delete", "table", "inet", LOSS_TABLE])],
                ),
            )
        }
        Request::StallProxy { until } => {
            // The agent's control file (node_agent::proxy::stall): a time or `forever`.
            let file = agent_dir.join("faults").join("stall-proxy");
            let dir = agent_dir.join("faults");
            let (content, detail) = match until {
                Some(t) => (
                    format!("{t:.3}\n"),
                    format!(
                        "service proxy stalled until {} (no rule sync; the rules in the kernel stay)",
                        jiff::Timestamp::from_millisecond((t * 1000.0) as i64)
                            .map(|t| t.to_string())
                            .unwrap_or_else(|_| t.to_string())
                    ),
                ),
                None => (
                    "forever\n".to_string(),
                    "service proxy stalled until cleared (no rule sync; the rules in the kernel stay)".to_string(),
                ),
            };
            let path = file.display().to_string();
            (
                vec![
                    argv(&["mkdir", "-p", &dir.display().to_string()]),
                    Step { input: Some(content), ..argv(&["tee", &path]) },
                ],
                fault("stall-proxy", detail, vec![argv(&["rm", "-f", &path])]),
            )
        }
        Request::Delay(ms) => {
            let d = format!("{ms}ms");
            (
                vec![place.exec(&["tc", "qdisc", "add", "dev", nic, "root", "netem", "delay", &d])],
                fault(
                    "delay",
                    format!("delays every packet out of {nic} by {d} (tc netem)"),
                    vec![place.exec(&["tc", "qdisc", "del", "dev", nic, "root"])],
                ),
            )
        }
    }
}

fn faults_file(dir: &Path) -> PathBuf {
    dir.join("faults.json")
}

/// The faults in force (none when nothing was recorded).
pub fn list(dir: &Path) -> Result<Vec<Fault>> {
    match std::fs::read(faults_file(dir)) {
        Ok(b) => serde_json::from_slice(&b)
            .map_err(|e| LabError::Usage(format!("{}: not a fault list: {e}", faults_file(dir).display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(vec![]),
        Err(e) => Err(io(format!("read {}", faults_file(dir).display()))(e)),
    }
}

fn save(dir: &Path, faults: &[Fault]) -> Result<()> {
    let path = faults_file(dir);
    let tmp = path.with_extension("json.tmp");
    let body = serde_json::to_vec_pretty(faults).expect("faults serialize");
    std::fs::write(&tmp, body).map_err(io(format!("write {}", tmp.display())))?;
    std::fs::rename(&tmp, &path).map_err(io(format!("write {}", path.display())))
}

fn run_planned(steps: &[Step]) -> Result<()> {
    for s in steps {
        match &s.input {
            Some(input) => crate::up::run_with_input(&s.argv, input)?,
            None => run(&s.argv)?,
        };
    }
    Ok(())
}

/// Makes `req` on `node` and records it. One fault of a kind per node.
pub fn make(st: &LabState, dir: &Path, node: &str, req: &Request) -> Result<Fault> {
    let (ns, uplink) = node_netns(st, node)?;
    let (cmds, fault) = plan(Place::Netns(&ns, &uplink), node, &dir.join("nodes").join(node).join("agent"), req);
    record(dir, node, req, cmds, fault)
}

/// [`make`] on a node of a Vagrant lab: the commands run on the VM over SSH (its lab NIC is
/// the link), the fault recorded with the lab's credentials (`.vagrant/podpath/faults.json`).
pub fn make_vagrant(v: &crate::vagrant::VagrantLab, node: &str, req: &Request) -> Result<Fault> {
    vagrant_node(v, node)?;
    let nic = v.lab_nic(node)?;
    let (cmds, mut fault) = plan(Place::OnNode { nic: &nic }, node, Path::new(crate::vagrant::AGENT_STATE_DIR), req);
    let wrap = |s: Step| -> Result<Step> { Ok(Step { argv: v.ssh_argv(node, &s.argv, false)?, input: s.input }) };
    let cmds = cmds.into_iter().map(wrap).collect::<Result<Vec<_>>>()?;
    fault.undo = std::mem::take(&mut fault.undo).into_iter().map(wrap).collect::<Result<Vec<_>>>()?;
    record(&v.credentials, node, req, cmds, fault)
}

fn vagrant_node<'a>(v: &crate::vagrant::VagrantLab, node: &'a str) -> Result<&'a str> {
    if !node.starts_with("node-") {
        return Err(LabError::Usage(format!("{node:?} is not a node (node-1 … node-N)")));
    }
    v.machine(node)
}

/// Runs a planned fault and records it in `dir`'s `faults.json`. One fault of a kind per node.
fn record(dir: &Path, node: &str, req: &Request, cmds: Vec<Step>, mut fault: Fault) -> Result<Fault> {
    let mut faults = list(dir)?;
    if let Some(f) = faults.iter().find(|f| f.node == node && f.kind == fault.kind) {
        return Err(LabError::Usage(format!(
            "{node} already has a {} fault ({}, since {}): `podpath fault clear` first",
            f.kind, f.detail, f.at
        )));
    }
    run_planned(&cmds).map_err(|e| match (req, &e) {
        (Request::Delay(_), LabError::Command { stderr, .. })
            if stderr.contains("qdisc kind is unknown")
                || stderr.contains("netem")
                || stderr.contains("No such file") =>
        {
            LabError::Usage(format!(
                "this kernel cannot delay packets: tc netem is not available ({}); loss works without it",
                stderr.trim()
            ))
        }
        _ => e,
    })?;
    fault.at = jiff::Timestamp::now().to_string();
    faults.push(fault.clone());
    save(dir, &faults)?;
    Ok(fault)
}

/// Undoes the faults that `which` picks (all when it picks nothing) and forgets them; returns
/// what was cleared. A fault whose undo fails stays recorded.
pub fn clear(dir: &Path, which: impl Fn(&Fault) -> bool) -> Result<Vec<Fault>> {
    let faults = list(dir)?;
    let (gone, mut kept): (Vec<Fault>, Vec<Fault>) = faults.into_iter().partition(&which);
    let mut cleared = vec![];
    let mut failed = None;
    for f in gone {
        match run_planned(&f.undo) {
            Ok(()) => cleared.push(f),
            Err(e) => {
                failed.get_or_insert(e);
                kept.push(f);
            }
        }
    }
    save(dir, &kept)?;
    match failed {
        Some(e) => Err(e),
        None => Ok(cleared),
    }
}

/// One-shot faults: what the cluster repairs by itself.
///
/// `flush-rules NODE`: the node's service proxy rules flushed (`iptables -t nat -F`, or `nft
/// flush table ip kube-proxy` in nftables mode); waits (30 s at most) until the node agent
/// counts a repair, and returns how long that took.
pub fn flush_rules(st: &LabState, node: &str) -> Result<std::time::Duration> {
    let (ns, _) = node_netns(st, node)?;
    let metrics = crate::plan::agent_health_addr(node).ok_or_else(|| LabError::Usage(format!("no node {node:?}")))?;
    let kind = if st.proxy_mode == crate::ProxyMode::Nftables { "nftables" } else { "iptables" };
    let repaired = || -> Result<u64> {
        let (_, body) = crate::hosts::http_get_in(&ns, metrics, "/metrics")?;
        Ok(repairs(&body, kind))
    };
    let before = repaired()?;
    // The primary family's rules (an IPv6 lab's are the only ones).
    let v6 = st.ip_family == crate::family::IpFamilyMode::Ipv6;
    let flush = match kind {
        "nftables" => {
            ["ip", "netns", "exec", &ns, "nft", "flush", "table", if v6 { "ip6" } else { "ip" }, "kube-proxy"]
                .map(String::from)
                .to_vec()
        }
        _ => ["ip", "netns", "exec", &ns, if v6 { "ip6tables" } else { "iptables" }, "-t", "nat", "-F"]
            .map(String::from)
            .to_vec(),
    };
    run(&flush)?;
    await_repair(node, before, repaired, std::time::Duration::from_millis(50))
}

/// Waits (30 s at most) until `repaired` counts past `before`: the time the agent took.
fn await_repair(
    node: &str,
    before: u64,
    repaired: impl Fn() -> Result<u64>,
    poll: std::time::Duration,
) -> Result<std::time::Duration> {
    let t = std::time::Instant::now();
    while t.elapsed() < std::time::Duration::from_secs(30) {
        if repaired().is_ok_and(|n| n > before) {
            return Ok(t.elapsed());
        }
        std::thread::sleep(poll);
    }
    Err(LabError::NotReady(format!("{node}'s agent had not rewritten its rules 30 s after the flush")))
}

/// `podpath_node_proxy_rules_repaired_total{kind="…"}` in a metrics page (0 when absent).
fn repairs(metrics: &str, kind: &str) -> u64 {
    let name = format!("podpath_node_proxy_rules_repaired_total{{kind=\"{kind}\"}} ");
    metrics.lines().find_map(|l| l.strip_prefix(&name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// `kill pod NS/NAME`: SIGKILL to the pod's workload process (its restart policy decides what
/// follows); returns the PID killed.
pub fn kill_pod(st: &LabState, target: &str) -> Result<i32> {
    let (ns, name) =
        target.split_once('/').ok_or_else(|| LabError::Usage(format!("{target:?}: use NAMESPACE/NAME")))?;
    let pid: i32 = crate::hosts::pod_pid(st, &crate::state::ApiAccess::of(st)?, ns, name)?
        .parse()
        .map_err(|_| LabError::Usage(format!("pod {target} has no process id in its status")))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| LabError::Usage(format!("cannot kill pod {target}'s process {pid}: {e}")))?;
    Ok(pid)
}

/// [`flush_rules`] on a node of a Vagrant lab: the flush and the agent's metrics over SSH.
pub fn flush_rules_vagrant(v: &crate::vagrant::VagrantLab, node: &str) -> Result<std::time::Duration> {
    vagrant_node(v, node)?;
    let nftables = v.node_nftables(node);
    let kind = if nftables { "nftables" } else { "iptables" };
    let ip = crate::vagrant::lab_ip(node).ok_or_else(|| LabError::Usage(format!("no node {node:?}")))?;
    let url = format!("http://{ip}:{}/metrics", crate::plan::AGENT_HEALTH_PORT);
    let repaired = || -> Result<u64> { Ok(repairs(&v.run(node, &["curl", "-sS", "--max-time", "2", &url])?, kind)) };
    let before = repaired()?;
    if nftables {
        v.run(node, &["nft", "flush", "table", "ip", "kube-proxy"])?;
    } else {
        v.run(node, &["iptables", "-t", "nat", "-F"])?;
    }
    // (Each read is an SSH round trip: polled less often.)
    await_repair(node, before, repaired, std::time::Duration::from_millis(100))
}

/// [`kill_pod`] on a Vagrant lab: SIGKILL to the pod's process on its node, over SSH.
pub fn kill_pod_vagrant(v: &crate::vagrant::VagrantLab, target: &str) -> Result<(String, String)> {
    let (ns, name) =
        target.split_once('/').ok_or_else(|| LabError::Usage(format!("{target:?}: use NAMESPACE/NAME")))?;
    let (node, pid) = crate::vagrant::pod_process(v, ns, name)?;
    v.run(&node, &["kill", "-KILL", &pid])?;
    Ok((node, pid))
}

/// The namespace of `node` (node-1 … node-N) in this lab.
fn node_netns(st: &LabState, node: &str) -> Result<(String, Uplink)> {
    let p = Plan::with_family(&st.name, st.nodes, st.ip_family);
    match p.netns_of(node) {
        Some(ns) if node.starts_with("node-") => Ok((ns.to_string(), Uplink::of(&p, ns))),
        _ => Err(LabError::Usage(format!("no node {node:?} in lab {:?}: node-1…node-{}", st.name, st.nodes))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_has_its_undo() {
        // The link back up, and what the kernel took with it: a dual-stack node's IPv6 address
        // and both default routes, as `podpath up` made them.
        let lab = Plan::with_family("lab", 2, crate::family::IpFamilyMode::Dual);
        let uplink = Uplink::of(&lab, "pp-lab-node-2");
        let (make, f) = plan(
            Place::Netns("pp-lab-node-2", &uplink),
            "node-2",
            Path::new("/s/nodes/node-2/agent"),
            &Request::LinkDown,
        );
        assert_eq!(make, [argv(&["ip", "-n", "pp-lab-node-2", "link", "set", "eth0", "down"])]);
        let undo: Vec<String> = f.undo.iter().map(|s| s.argv.join(" ")).collect();
        assert_eq!(
            undo,
            [
                "ip -n pp-lab-node-2 link set eth0 up",
                "ip -6 -n pp-lab-node-2 addr replace fd00:56::12/64 dev eth0 nodad",
                "ip -4 -n pp-lab-node-2 route replace default via 192.168.56.2",
                "ip -6 -n pp-lab-node-2 route replace default via fd00:56::2",
            ]
        );
        let (make, f) = plan(
            Place::Netns("ns", &Uplink::default()),
            "node-1",
            Path::new("/a"),
            &Request::Blackhole("10.244.2.0/24".parse().unwrap()),
        );
        assert_eq!(make[0].argv[5..], ["add", "to", "10.244.2.0/24", "blackhole", "pref", "90"]);
        assert_eq!(make[1].argv, argv(&["ip", "netns", "exec", "ns", "nft", "-f", "-"]).argv);
        let rules = make[1].input.as_deref().unwrap();
        assert!(rules.contains("hook prerouting priority -310; ip saddr 10.244.2.0/24 counter drop"), "{rules}");
        assert_eq!(f.undo[0].argv[5..], ["del", "to", "10.244.2.0/24", "blackhole", "pref", "90"]);
        assert_eq!(f.undo[1].argv[4..], ["nft", "delete", "table", "inet", "podpath-blackhole"]);
        let (make, _) = plan(
            Place::Netns("ns", &Uplink::default()),
            "node-1",
            Path::new("/a"),
            &Request::Blackhole("fd00:10:244:2::/64".parse().unwrap()),
        );
        assert_eq!(make[0].argv[..2], ["ip", "-6"]);
        assert!(make[1].input.as_deref().unwrap().contains("ip6 saddr fd00:10:244:2::/64 counter drop"), "{make:?}");
        // 100% drops every packet: no numgen (nft takes `mod 100 <` up to 99).
        let (all, _) = plan(Place::Netns("ns", &Uplink::default()), "node-1", Path::new("/a"), &Request::Loss(100));
        let text = all[0].input.clone().unwrap();
        assert!(text.contains("iifname \"eth0\" counter drop") && !text.contains("numgen"), "{text}");
        let (make, f) = plan(Place::Netns("ns", &Uplink::default()), "node-1", Path::new("/a"), &Request::Loss(30));
        assert_eq!(make[0].argv, argv(&["ip", "netns", "exec", "ns", "nft", "-f", "-"]).argv);
        let rules = make[0].input.as_deref().unwrap();
        assert!(rules.contains("iifname \"eth0\" numgen random mod 100 < 30 counter drop"), "{rules}");
        assert_eq!(f.undo, [argv(&["ip", "netns", "exec", "ns", "nft", "delete", "table", "inet", "podpath-faults"])]);
        let (_, f) = plan(Place::Netns("ns", &Uplink::default()), "node-1", Path::new("/a"), &Request::Delay(100));
        assert_eq!(f.undo[0].argv[4..], ["tc", "qdisc", "del", "dev", "eth0", "root"]);
        let (make, f) = plan(
            Place::Netns("ns", &Uplink::default()),
            "node-1",
            Path::new("/a"),
            &Request::StallProxy { until: None },
        );
        assert_eq!(make[1].argv, ["tee", "/a/faults/stall-proxy"]);
        assert_eq!(make[1].input.as_deref(), Some("forever\n"));
        assert_eq!(f.undo, [argv(&["rm", "-f", "/a/faults/stall-proxy"])]);
        let (make, _) = plan(
            Place::Netns("ns", &Uplink::default()),
            "node-1",
            Path::new("/a"),
            &Request::StallProxy { until: Some(1_700_000_000.25) },
        );
        assert_eq!(make[1].input.as_deref(), Some("1700000000.250\n"));
    }

    #[test]
    fn on_a_vm_the_commands_are_the_nodes_own_on_its_lab_nic() {
        let on = Place::OnNode { nic: "eth1" };
        let (make, f) = plan(on, "node-2", Path::new("/var/lib/podpath/node"), &Request::LinkDown);
        assert_eq!(make, [argv(&["ip", "link", "set", "eth1", "down"])]);
        assert_eq!(f.undo[0], argv(&["ip", "link", "set", "eth1", "up"]));
        assert!(f.undo[1].argv.join(" ").contains("/etc/podpath/net-up"), "{:?}", f.undo);
        assert_eq!(f.detail, "eth1 (the lab's network) down");
        let (make, _) = plan(on, "node-1", Path::new("/a"), &Request::Blackhole("10.244.2.0/24".parse().unwrap()));
        assert_eq!(make[0], argv(&["ip", "-4", "rule", "add", "to", "10.244.2.0/24", "blackhole", "pref", "90"]));
        assert_eq!(make[1].argv, ["nft", "-f", "-"]);
        let (make, f) = plan(on, "node-1", Path::new("/a"), &Request::Loss(30));
        assert_eq!(make[0].argv, ["nft", "-f", "-"]);
        assert!(make[0].input.as_deref().is_some_and(|r| r.contains("iifname \"eth1\" numgen")), "{make:?}");
        assert_eq!(f.undo, [argv(&["nft", "delete", "table", "inet", "podpath-faults"])]);
        let (make, _) = plan(on, "node-1", Path::new("/var/lib/podpath/node"), &Request::StallProxy { until: None });
        assert_eq!(make[1].argv, ["tee", "/var/lib/podpath/node/faults/stall-proxy"]);
    }

    #[test]
    fn repairs_are_read_from_the_agents_metrics() {
        let page = "# TYPE podpath_node_proxy_rules_repaired_total counter\n\
                    podpath_node_proxy_rules_repaired_total{kind=\"iptables\"} 2\n\
                    podpath_node_proxy_rules_repaired_total{kind=\"nftables\"} 5\n";
        assert_eq!((repairs(page, "iptables"), repairs(page, "nftables"), repairs("", "iptables")), (2, 5, 0));
    }
}
