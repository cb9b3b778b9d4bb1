//! The side effects of a trace, in one place: trace rules in every host of the lab, the
//! kernel's trace monitor in each, the probe connection, conntrack, routes and the API.
//! Everything installed is removed on every way out, Ctrl-C included.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hickory_proto::rr::RecordType;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use podpath_ruleset::exec::Nft;
use podpath_ruleset::nft::{Chain as NftChain, NftFamily, NftTable, Op as NftOp, Transaction as NftTransaction};
use podpath_ruleset::{Backend, Iptables};

use super::dns::{candidates, describe, first_address, Lookup, Query, ResolvConf};
use super::flow::{self, Observed};
use super::model::{Objects, Outcome, Trace};
use super::parse;
use crate::plan::Plan;
use crate::state::ApiAccess;
use crate::{in_netns_thread, io, LabError, LabState, Result};

pub use super::flow::PROBE_TOS;
/// The trace table (`ip podpath-trace`, or `ip6`) in every traced host.
pub const NFT_TRACE_TABLE: &str = "podpath-trace";
/// Where the monitor-sync datagrams go (discard port; nothing listens).
const CANARY_PORT: u16 = 9;

/// What to trace.
#[derive(Debug, Clone)]
pub struct Request {
    /// `client` (default), `gateway`, `node-N` or `pod/NS/NAME`.
    pub from: String,
    pub target: Target,
    pub path: String,
    pub host_header: String,
    pub timeout: Duration,
}

/// Where the request goes: an address, or a name the source pod's resolver looks up first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Addr(SocketAddr),
    Name { name: String, port: u16 },
}

/// Parses `http://HOST[:PORT][/PATH]` or `HOST:PORT`, HOST an IPv4 address, an IPv6 address
/// in brackets (`[fd00:10:96::a]:80`) or a DNS name.
pub fn parse_target(target: &str) -> Result<(Target, String, String)> {
    let usage = || {
        LabError::Usage(format!(
            "{target:?}: give http://HOST[:PORT]/PATH or HOST:PORT (HOST an address of the lab — LB, external, cluster or pod IP, an IPv6 one in brackets — or, from a pod, a name such as web.default)"
        ))
    };
    let (rest, default_port) = match target.strip_prefix("http://") {
        Some(r) => (r, 80),
        None if target.starts_with("https://") => {
            return Err(LabError::Usage(format!(
                "{target:?}: trace speaks HTTP only; use http://IP:443/ to trace the connection"
            )))
        }
        None => (target, 0),
    };
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].to_string()),
        None => (rest, "/".to_string()),
    };
    // `[v6]` or `[v6]:port`; else `host` or `host:port`.
    let (host, port) = match hostport.strip_prefix('[') {
        Some(inner) => {
            let (addr, after) = inner.split_once(']').ok_or_else(usage)?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse::<u16>().map_err(|_| usage())?,
                None if after.is_empty() && default_port != 0 => default_port,
                None => return Err(usage()),
            };
            let ip = addr.parse::<Ipv6Addr>().map_err(|_| usage())?;
            return Ok((Target::Addr(SocketAddr::new(ip.into(), port)), path, hostport.to_string()));
        }
        None => match hostport.rsplit_once(':') {
            Some((h, _)) if h.contains(':') => return Err(usage()),
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| usage())?),
            None if default_port != 0 => (hostport, default_port),
            None => return Err(usage()),
        },
    };
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok((Target::Addr(SocketAddr::new(ip.into(), port)), path, hostport.to_string()));
    }
    let valid = !host.is_empty()
        && host.len() <= 253
        && host.trim_end_matches('.').split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
                && !l.starts_with('-')
        });
    if !valid || host.parse::<std::net::IpAddr>().is_ok() {
        return Err(usage());
    }
    Ok((Target::Name { name: host.to_string(), port }, path, hostport.to_string()))
}

/// One query (`rtype` A or AAAA) over UDP from the current thread's namespace (again over TCP
/// when the answer comes truncated): (response code, answer records, whether TCP was used,
/// local port).
fn ask(server: IpAddr, qname: &str, rtype: RecordType) -> (String, Vec<String>, bool, u16) {
    use hickory_proto::op::{Message, Query as DnsQuery};
    use hickory_proto::rr::Name;
    use std::io::{Read, Write};
    let Ok(name) = Name::from_ascii(qname) else { return ("bad name".into(), vec![], false, 0) };
    let mut m = Message::query();
    m.metadata.id = std::process::id() as u16 ^ 0x5a5a;
    m.metadata.recursion_desired = true;
    m.add_query(DnsQuery::query(name, rtype));
    let Ok(wire) = m.to_vec() else { return ("bad name".into(), vec![], false, 0) };
    let dst = SocketAddr::from((server, 53));
    let any: SocketAddr = if server.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse().expect("an address");
    let udp = match std::net::UdpSocket::bind(any) {
        Ok(u) => u,
        Err(e) => return (format!("socket: {e}"), vec![], false, 0),
    };
    let port = udp.local_addr().map(|a| a.port()).unwrap_or(0);
    let _ = udp.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = [0u8; 4096];
    // glibc's resolver tries twice (`attempts:2`) before it gives up on a server.
    let mut reply = None;
    for _ in 0..2 {
        if udp.send_to(&wire, dst).is_err() {
            continue;
        }
        if let Ok(n) = udp.recv(&mut buf) {
            reply = Message::from_vec(&buf[..n]).ok();
            break;
        }
    }
    let Some(mut reply) = reply else { return ("timeout".into(), vec![], false, port) };
    let mut tcp = false;
    if reply.metadata.truncation {
        tcp = true;
        let over_tcp = (|| -> std::io::Result<Message> {
            let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(2))?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(&(wire.len() as u16).to_be_bytes())?;
            s.write_all(&wire)?;
            let mut len = [0u8; 2];
            s.read_exact(&mut len)?;
            let mut body = vec![0u8; u16::from_be_bytes(len) as usize];
            s.read_exact(&mut body)?;
            Message::from_vec(&body).map_err(|e| std::io::Error::other(e.to_string()))
        })();
        match over_tcp {
            Ok(m) => reply = m,
            Err(e) => return (format!("truncated, then TCP failed: {e}"), vec![], true, port),
        }
    }
    let code = crate::trace::dns::rcode_name(u16::from(reply.metadata.response_code));
    (code, reply.answers.iter().map(|r| r.to_string()).collect(), tcp, port)
}

/// The lookup a pod's resolver makes for `name`: its `/etc/resolv.conf` (as the pod sees it,
/// through its mount namespace), each candidate name asked in turn from the pod's network
/// namespace until one has an address, and for each query the DNS pod the node's service proxy
/// sent it to (the node's conntrack entry of the query).
fn lookup(st: &LabState, api: &ApiAccess, objects: &Objects, from: &str, name: &str) -> Result<Lookup> {
    let Some(rest) = from.strip_prefix("pod/") else {
        return Err(LabError::Usage(format!(
            "{name:?} is a name: trace a request by name --from pod/NAMESPACE/NAME (resolved as that pod resolves it), or give an IP"
        )));
    };
    let (ns, pod) = rest.split_once('/').ok_or_else(|| LabError::Usage(format!("{from:?}: use pod/NAMESPACE/NAME")))?;
    let pid = crate::hosts::pod_pid(st, api, ns, pod)?;
    let conf = std::fs::read_to_string(format!("/proc/{pid}/root/etc/resolv.conf"))
        .map_err(io(format!("read pod {ns}/{pod}'s /etc/resolv.conf")))?;
    let resolv = ResolvConf::parse(&conf);
    let server = *resolv
        .nameservers
        .first()
        .ok_or_else(|| LabError::NotReady(format!("pod {ns}/{pod}'s /etc/resolv.conf names no nameserver")))?;
    let plan = Plan::with_family(&st.name, st.nodes, st.ip_family);
    // The family of the lab's primary: what a client of an IPv6-only lab asks for is AAAA.
    let rtype = if !st.ip_family.has_v4() { RecordType::AAAA } else { RecordType::A };
    let pods = &objects.pods;
    let node = pods.values().find(|(p, _)| *p == format!("{ns}/{pod}")).map(|(_, node)| node.clone());
    let dns_service = objects.cluster_ips.get(&server).map(|s| format!("Service {s} ")).unwrap_or_default();
    let node_ns = node.as_deref().and_then(|n| plan.netns_of(n)).map(str::to_string);
    let mut queries = vec![];
    let mut address = None;
    for qname in candidates(name, &resolv) {
        let t = Instant::now();
        let q = qname.clone();
        let (rcode, answers, tcp, port) =
            crate::hosts::in_netns_thread(format!("/proc/{pid}/ns/net"), move || ask(server, &q, rtype))?;
        let millis = t.elapsed().as_secs_f64() * 1000.0;
        // The node's NAT of the query: its reply comes from the DNS pod that answered.
        let answered_by = node_ns.as_deref().and_then(|node_ns| {
            let family = if server.is_ipv6() { "ipv6" } else { "ipv4" };
            let port = port.to_string();
            let ct = in_ns(node_ns, &["conntrack", "-L", "-f", family, "-p", "udp", "--orig-port-src", &port]).ok()?;
            let e = parse::parse_conntrack(&ct).into_iter().find(|e| e.orig.1.ip() == server)?;
            let backend = e.reply.0;
            let who = pods.get(&backend.ip()).map(|(p, _)| format!("pod {p} ")).unwrap_or_default();
            let node = node.as_deref().unwrap_or("the node");
            Some(format!("{who}{backend} ({node}'s DNAT of {dns_service}{server}:53)"))
        });
        let found = first_address(&answers);
        queries.push(Query { name: qname, rtype: rtype.to_string(), rcode, answers, millis, tcp, answered_by });
        if found.is_some() {
            address = found;
            break;
        }
    }
    Ok(Lookup { name: name.to_string(), resolv, queries, address, owner: None })
}

fn cmd_output(argv: &[&str]) -> Result<String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Io { what: format!("cannot run {}", argv[0]), source: e })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command { cmd: argv.join(" "), stderr: String::from_utf8_lossy(&out.stderr).trim().to_string() })
    }
}

/// Runs a command in a lab namespace; its standard output. Started from a thread inside the
/// namespace rather than through `ip netns exec`: one program start instead of two, and program
/// starts are most of what a trace costs the machine.
pub(crate) fn in_ns(netns: &str, argv: &[&str]) -> Result<String> {
    let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    crate::hosts::in_netns_thread(format!("/run/netns/{netns}"), move || {
        cmd_output(&argv.iter().map(String::as_str).collect::<Vec<_>>())
    })?
}

/// Where a trace's hosts are: network namespaces of this machine (a host is its namespace's
/// name), or the machines of a Vagrant lab (a host is the machine's name), reached over SSH,
/// where the `podpath` binary sends the probe and the sync datagrams (`podpath trace-helper`).
/// Every side effect of a trace on a host goes through one of these methods.
#[derive(Clone, Default)]
pub enum Site {
    #[default]
    Netns,
    Vagrant(Arc<crate::vagrant::VagrantLab>),
}

impl Site {
    /// A command on a host; its standard output.
    fn run(&self, host: &str, argv: &[&str]) -> Result<String> {
        match self {
            Site::Netns => in_ns(host, argv),
            Site::Vagrant(v) => v.run(host, argv),
        }
    }

    /// `iptables-save -t TABLE` (or ip6tables') on a host.
    fn save_text(&self, host: &str, v6: bool, table: &str) -> Result<String> {
        match self {
            Site::Netns => if v6 { ip6tables(host) } else { iptables(host) }.save_text(table).map_err(|e| {
                LabError::Command { cmd: format!("iptables-save -t {table} in {host}"), stderr: e.to_string() }
            }),
            Site::Vagrant(v) => v.run(host, &[if v6 { "ip6tables-save" } else { "iptables-save" }, "-t", table]),
        }
    }

    /// A whole nftables table loaded on a host: in a namespace lab over netlink from this
    /// process (no `nft` program, which reads the host's whole ruleset first), on a VM by `nft -f`.
    fn nft_load(&self, host: &str, table: &NftTable) -> Result<()> {
        let (tx, _) = NftTransaction::between(None, table);
        if let Site::Netns = self {
            match netlink_apply(host, &tx) {
                Ok(true) => return Ok(()),
                // A form the netlink layer does not write goes to `nft -f` whole.
                Ok(false) => {}
                Err(e) => {
                    return Err(LabError::Command {
                        cmd: format!("load table {} in {host}", table.name),
                        stderr: e.to_string(),
                    })
                }
            }
        }
        self.nft_apply(host, &tx)
    }

    /// `nft -f -` of a transaction's text on a host.
    fn nft_apply(&self, host: &str, tx: &podpath_ruleset::nft::Transaction) -> Result<()> {
        match self {
            Site::Netns => Nft::in_netns(host)
                .apply(tx)
                .map_err(|e| LabError::Command { cmd: format!("nft -f in {host}"), stderr: e.to_string() }),
            Site::Vagrant(v) => v.run_input(host, &["nft", "-f", "-"], tx.text().as_bytes()).map(|_| ()),
        }
    }

    /// A table deleted on a host (over netlink in a namespace lab); whether it is gone (also
    /// when there was none).
    fn nft_delete_table(&self, host: &str, family: NftFamily, table: &str) -> bool {
        match self {
            Site::Netns => {
                let tx = NftTransaction { family, table: table.into(), comment: None, ops: vec![NftOp::DeleteTable] };
                match netlink_apply(host, &tx) {
                    Ok(sent) => sent,
                    Err(e) => e.source.raw_os_error() == Some(nix::libc::ENOENT),
                }
            }
            Site::Vagrant(v) => v.run(host, &["nft", "delete", "table", nft_family(family), table]).is_ok(),
        }
    }

    /// `nft list table` on a host (None: there is no such table).
    fn nft_list_table(&self, host: &str, family: NftFamily, table: &str) -> Option<String> {
        match self {
            Site::Netns => Nft::in_netns(host).list_table(family, table, false).ok().flatten(),
            Site::Vagrant(v) => v.run(host, &["nft", "list", "table", nft_family(family), table]).ok(),
        }
    }

    /// The command that runs a monitor on a host, its lines on standard output; it ends with
    /// the trace (also one killed before its cleanup).
    fn monitor_command(&self, host: &str, monitor: &[&str]) -> Result<Command> {
        let mut c = match self {
            Site::Netns => {
                // The parent-death signal set before the monitor execs (no `setpriv` program
                // start). Started by the host's `NetnsWorker`, a thread inside the host's
                // namespace that lives as long as the trace: the signal follows the thread
                // that forked.
                let mut c = Command::new(monitor[0]);
                c.args(&monitor[1..]);
                crate::hosts::die_with_parent(&mut c);
                c.stdin(Stdio::null());
                c
            }
            Site::Vagrant(v) => {
                // Remotely, the monitor goes when the connection does: the shell waits on its
                // standard input, which ends with the SSH session, then kills it.
                let script = format!("{} & m=$!; read _; kill $m", monitor.join(" "));
                let argv = v.ssh_argv(host, &["sh".into(), "-c".into(), script], false)?;
                let mut c = Command::new(&argv[0]);
                c.args(&argv[1..]);
                crate::hosts::die_with_parent(&mut c);
                c.stdin(Stdio::piped());
                c
            }
        };
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        Ok(c)
    }
}

/// An nftables transaction sent over netlink in the namespace `netns`; `Ok(false)` when it holds
/// a form the netlink layer does not write.
fn netlink_apply(netns: &str, tx: &NftTransaction) -> nfnl::Result<bool> {
    let tx = tx.clone();
    in_netns_thread(format!("/run/netns/{netns}"), move || with_nfnl(|s| s.apply(&tx, &[]))).unwrap_or_else(|e| {
        Err(nfnl::NfnlError { what: format!("enter {netns}"), source: std::io::Error::other(e.to_string()) })
    })
}

thread_local! {
    /// This thread's nf_tables socket (a namespace worker's, for the trace's life).
    static NFNL: std::cell::RefCell<Option<nfnl::Socket>> = const { std::cell::RefCell::new(None) };
}

/// A namespace lab host's nf_tables generation (None on a Vagrant lab, or when it cannot be read).
fn generation_of(site: &Site, ns: &str) -> Option<u32> {
    match site {
        Site::Netns => in_netns_thread(format!("/run/netns/{ns}"), || with_nfnl(|s| s.generation())).ok()?.ok(),
        Site::Vagrant(_) => None,
    }
}

/// `f` with this thread's nf_tables socket, opened in its namespace on first use and kept
/// (dropped after an error, which may leave replies in it). Kept because closing one is slow
/// after a commit: the kernel first waits for the committed transaction's release (an RCU
/// grace period, 6–25 ms measured here), and a trace commits twice per host.
pub(super) fn with_nfnl<T>(f: impl FnOnce(&mut nfnl::Socket) -> nfnl::Result<T>) -> nfnl::Result<T> {
    NFNL.with(|cell| {
        let mut slot = cell.borrow_mut();
        let socket = match slot.as_mut() {
            Some(s) => s,
            None => slot.insert(nfnl::Socket::open()?),
        };
        let r = f(socket);
        if r.is_err() {
            *slot = None;
        }
        r
    })
}

fn nft_family(f: NftFamily) -> &'static str {
    if f == NftFamily::Ip6 {
        "ip6"
    } else {
        "ip"
    }
}

/// The trace table (`ip podpath-trace`, or `ip6 podpath-trace` for an IPv6 request): the probe's
/// SYN, recognised by its DSCP on every host (also after NAT changed its addresses); SYN-ACKs to
/// the probe's port (the reply, wherever it was not translated); resets with the DSCP (a
/// kernel's reset copies the TOS of the SYN it refuses: a relay's failed attempt); and the
/// monitor-sync datagram get `meta nftrace`, before conntrack and NAT (priority -350). The
/// kernel then reports every rule of every table of that family they meet: `nft monitor trace`
/// prints them all (`ip kube-proxy` included), xtables-monitor the iptables-nft ones in
/// iptables' words. Nothing else is traced, so other traffic costs the monitors nothing. The
/// DSCP is in the traffic class for IPv6.
///
/// xtables-monitor puts every rule it is told of in iptables' words and exits at one it cannot
/// (a DSCP match), so no such rule may be reported: a rule is reported only once the packet is
/// traced, so the matches `goto` a chain that sets the trace flag alone; and a packet looped
/// back to this host, traced already at `output`, does not meet them again at `prerouting`.
pub fn nft_trace_table(probe_port: u16, family: NftFamily) -> NftTable {
    let dscp = PROBE_TOS >> 2;
    let ip = if family == NftFamily::Ip6 { "ip6" } else { "ip" };
    let mut t = NftTable::new(family, NFT_TRACE_TABLE);
    t.comment = Some("podpath trace: the probe's packets, for the trace monitors".into());
    t.add_chain(NftChain::base("prerouting", "filter", "prerouting", -350).rule("iifname != \"lo\" jump probe"));
    t.add_chain(NftChain::base("output", "filter", "output", -350).rule("jump probe"));
    t.add_chain(
        NftChain::regular("probe")
            .rule(format!("{ip} dscp 0x{dscp:x} tcp flags & (syn | ack) == syn goto traced"))
            .rule(format!("tcp dport {probe_port} tcp flags & (syn | ack) == syn | ack goto traced"))
            .rule(format!("{ip} dscp 0x{dscp:x} tcp flags & rst == rst goto traced"))
            .rule(format!("{ip} dscp 0x{dscp:x} udp dport {CANARY_PORT} goto traced")),
    );
    t.add_chain(NftChain::regular("traced").rule("meta nftrace set 1"));
    t
}

/// How a lab's hosts' traces are read (every host gets the trace table), by proxy mode and the
/// request's family. The iptables modes (`Xtables`, `Ip6tables`): in a namespace lab by the
/// trace itself (its own listeners, each rule as `iptables-save` prints it); on a Vagrant lab (IPv4
/// only) by xtables-monitor, the rules in iptables' words. The nftables mode: `nft monitor
/// trace`, the rules in nft's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracer {
    Xtables,
    Nft,
    Ip6tables,
    Nft6,
}

impl Tracer {
    fn of(nftables: bool, v6: bool) -> Tracer {
        match (nftables, v6) {
            (false, false) => Tracer::Xtables,
            (true, false) => Tracer::Nft,
            (false, true) => Tracer::Ip6tables,
            (true, true) => Tracer::Nft6,
        }
    }
    fn v6(self) -> bool {
        matches!(self, Tracer::Ip6tables | Tracer::Nft6)
    }
    /// The rules of the proxy mode are nftables' own (not iptables-nft's).
    fn nft_rules(self) -> bool {
        matches!(self, Tracer::Nft | Tracer::Nft6)
    }
    fn family(self) -> NftFamily {
        if self.v6() {
            NftFamily::Ip6
        } else {
            NftFamily::Ip
        }
    }
    fn monitor(self) -> &'static [&'static str] {
        match self {
            Tracer::Xtables => &["xtables-monitor", "--trace"],
            Tracer::Nft | Tracer::Nft6 => &["nft", "monitor", "trace"],
            // Not run: the iptables modes' IPv6 traces are a namespace lab's, read by HostReader.
            Tracer::Ip6tables => &["nft", "-a", "monitor", "trace"],
        }
    }
    fn parse(self, text: &str) -> Vec<parse::Observation> {
        match self {
            Tracer::Xtables => parse::parse_monitor(text),
            _ => parse::parse_nft_monitor(text),
        }
    }
    /// Removes what [`Tracer::install`] wrote (its table, in one transaction); when that fails,
    /// tries both families ([`remove_rules_on`]).
    fn uninstall(self, site: &Site, ns: &str) {
        if !site.nft_delete_table(ns, self.family(), NFT_TRACE_TABLE) {
            remove_rules_on(site, ns);
        }
    }

    /// Installs the trace table in a host.
    fn install(self, site: &Site, ns: &str, probe_port: u16) -> Result<()> {
        site.nft_load(ns, &nft_trace_table(probe_port, self.family()))
    }
}

/// `iptables` in a lab namespace (the system's, as the lab's nodes use it).
fn iptables(netns: &str) -> Iptables {
    Iptables::new(Backend::System).in_netns(netns)
}

/// `ip6tables` in a lab namespace.
fn ip6tables(netns: &str) -> Iptables {
    Iptables::new(Backend::System).v6().in_netns(netns)
}

/// Removes the trace tables of both families from a host (also the left-overs of a trace that
/// was killed); quiet when there is nothing to remove.
fn remove_rules_on(site: &Site, host: &str) {
    for family in [NftFamily::Ip, NftFamily::Ip6] {
        site.nft_delete_table(host, family, NFT_TRACE_TABLE);
    }
}

/// The per-namespace switch that lets an accepted socket know its SYN's TOS, so relays (the
/// userspace proxy, lb-sim's NodePort and L7 load balancers) give their own connection the
/// probe's DSCP (`podpath_client::relay`).
const REFLECT_TOS: &str = "/proc/sys/net/ipv4/tcp_reflect_tos";

/// Sets `tcp_reflect_tos` in a namespace; returns the value it had (None: no such switch in
/// this kernel, so relays are not followed).
fn set_reflect_tos(site: &Site, ns: &str, value: &str) -> Option<String> {
    if let Site::Vagrant(v) = site {
        let script = format!("cat {REFLECT_TOS} && echo {value} > {REFLECT_TOS}");
        return v.run(ns, &["sh", "-c", &script]).ok().map(|old| old.trim().to_string());
    }
    let value = value.to_string();
    in_netns_thread(format!("/run/netns/{ns}"), move || {
        let old = std::fs::read_to_string(REFLECT_TOS).ok()?;
        std::fs::write(REFLECT_TOS, value).ok()?;
        Some(old.trim().to_string())
    })
    .ok()
    .flatten()
}

/// What a trace has installed and started; `cleanup` undoes it (idempotent).
#[derive(Default)]
pub struct Installed {
    site: Site,
    namespaces: Vec<String>,
    /// The trace table installed (its family by the tracer): removed in one transaction per
    /// host; unknown, each host's tables of both families are removed.
    rules: Option<Tracer>,
    monitors: Vec<Child>,
    /// Namespaces whose `tcp_reflect_tos` the trace changed, with the value to put back.
    reflect_tos: Vec<(String, String)>,
}

/// Runs `f(i)` for every host `i` of `hosts` (namespace names, or a Vagrant lab's machines) at
/// once — in a namespace lab on each host's worker (`NetnsWorkers`, no thread started), else
/// on a thread of its own — and returns what each returned in order (None: it panicked).
fn each_host<T: Send + 'static>(
    site: &Site,
    hosts: &[String],
    f: impl Fn(usize) -> T + Send + Sync + 'static,
) -> Vec<Option<T>> {
    enum Running<T> {
        Worker(crate::hosts::Pending<T>),
        Thread(std::thread::JoinHandle<T>),
    }
    let f = Arc::new(f);
    let running: Vec<Running<T>> = hosts
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            let f = f.clone();
            let worker = match site {
                Site::Netns => crate::hosts::NetnsWorkers::get(&format!("/run/netns/{ns}")),
                Site::Vagrant(_) => None,
            };
            match worker {
                Some(w) => Running::Worker(w.start(move || f(i))),
                None => Running::Thread(std::thread::spawn(move || f(i))),
            }
        })
        .collect();
    running
        .into_iter()
        .map(|r| match r {
            Running::Worker(p) => p.wait().ok(),
            Running::Thread(t) => t.join().ok(),
        })
        .collect()
}

impl Installed {
    pub fn cleanup(&mut self) {
        for m in &mut self.monitors {
            let _ = m.kill();
            let _ = m.wait();
        }
        self.monitors.clear();
        let namespaces: Vec<String> = self.namespaces.drain(..).collect();
        let reflect: Vec<(String, String)> = self.reflect_tos.drain(..).collect();
        let rules = self.rules.take();
        // Every host at once: its switch put back, its rules removed.
        let (site, names) = (self.site.clone(), namespaces.clone());
        each_host(&self.site, &namespaces, move |i| {
            let ns = &names[i];
            if let Some((_, old)) = reflect.iter().find(|(n, _)| n == ns) {
                set_reflect_tos(&site, ns, old);
            }
            match rules {
                Some(tracer) => tracer.uninstall(&site, ns),
                None => remove_rules_on(&site, ns),
            }
        });
    }
}

/// Removes everything when dropped, and on SIGINT/SIGTERM (a thread waits for them; the
/// signals are blocked everywhere else).
pub struct Guard(Arc<Mutex<Installed>>);

impl Guard {
    pub fn new() -> Guard {
        let installed = Arc::new(Mutex::new(Installed::default()));
        let mut set = nix::sys::signal::SigSet::empty();
        set.add(nix::sys::signal::Signal::SIGINT);
        set.add(nix::sys::signal::Signal::SIGTERM);
        if set.thread_block().is_ok() {
            let shared = installed.clone();
            std::thread::spawn(move || {
                if let Ok(sig) = set.wait() {
                    shared.lock().unwrap_or_else(|e| e.into_inner()).cleanup();
                    eprintln!("podpath: trace interrupted ({sig}); trace rules removed");
                    std::process::exit(130);
                }
            });
        }
        Guard(installed)
    }
    fn with<T>(&self, f: impl FnOnce(&mut Installed) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Default for Guard {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.with(|i| i.cleanup());
    }
}

/// Sends one sync datagram from a namespace (to the loopback address of the traced family),
/// from a source port not in `taken`; returns that port (it tells this datagram from every
/// earlier one).
fn send_canary(site: &Site, host: &str, v6: bool, taken: &BTreeSet<u16>) -> Result<u16> {
    if let Site::Vagrant(v) = site {
        let avoid = taken.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let mut argv = vec!["podpath", "trace-helper", "canary"];
        if !avoid.is_empty() {
            argv.extend(["--avoid", &avoid]);
        }
        if v6 {
            argv.push("--v6");
        }
        let out = v.run(host, &argv)?;
        return out
            .trim()
            .parse()
            .map_err(|_| LabError::NotReady(format!("{host}: podpath trace-helper canary printed {out:?}")));
    }
    let taken = taken.clone();
    in_netns_thread(format!("/run/netns/{host}"), move || send_canary_here(v6, &taken))?
        .map_err(|e| LabError::Io { what: "send the trace's sync datagram".into(), source: e })
}

/// `send_canary` from this process's own namespace (`podpath trace-helper canary` on a VM).
pub fn send_canary_here(v6: bool, taken: &BTreeSet<u16>) -> std::io::Result<u16> {
    {
        let lo: IpAddr = if v6 { Ipv6Addr::LOCALHOST.into() } else { Ipv4Addr::LOCALHOST.into() };
        // An ephemeral port is random; a few tries find one this monitor has not seen yet.
        for _ in 0..16 {
            let s =
                socket2::Socket::new(socket2::Domain::for_address(SocketAddr::new(lo, 0)), socket2::Type::DGRAM, None)?;
            if v6 {
                s.set_tclass_v6(PROBE_TOS)?;
            } else {
                s.set_tos_v4(PROBE_TOS)?;
            }
            s.bind(&SocketAddr::new(lo, 0).into())?;
            let port = s.local_addr()?.as_socket().map(|a| a.port()).unwrap_or(0);
            if taken.contains(&port) {
                continue;
            }
            s.send_to(b"podpath-trace", &SocketAddr::new(lo, CANARY_PORT).into())?;
            return Ok(port);
        }
        Err(std::io::Error::other("no fresh source port for the sync datagram"))
    }
}

/// The source ports of the sync datagrams a monitor printed. One datagram shows once per hook
/// it crosses (output, then input over loopback), so datagrams are told apart by port, not
/// counted by line.
fn canary_ports(tracer: Tracer, text: &str) -> BTreeSet<u16> {
    tracer.parse(text).iter().filter(|o| is_canary(o)).map(|o| o.src.port()).collect()
}

/// Whether an observed packet is one of the trace's sync datagrams.
fn is_canary(o: &parse::Observation) -> bool {
    o.proto == "UDP" && o.dst.port() == CANARY_PORT && o.dst.ip().is_loopback()
}

fn monitor_text(output: &Mutex<String>) -> String {
    output.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A silent monitor's error with the last line each monitor printed on stderr (say, why one
/// exited), where any did.
fn with_what_monitors_said(e: LabError, hosts: &[(String, String)], errors: &[Arc<Mutex<String>>]) -> LabError {
    let LabError::NotReady(m) = e else { return e };
    let said: Vec<String> = hosts
        .iter()
        .zip(errors)
        .filter_map(|((h, _), said)| {
            let s = said.lock().unwrap_or_else(|e| e.into_inner()).clone();
            (!s.is_empty()).then(|| format!("the monitor on {h} said {s:?}"))
        })
        .collect();
    if said.is_empty() {
        LabError::NotReady(m)
    } else {
        LabError::NotReady(format!("{m}; {}", said.join("; ")))
    }
}

fn monitors_silent(behind: &[&str]) -> LabError {
    LabError::NotReady(format!(
        "the kernel's trace monitor saw nothing on {} (does this kernel support nf_tables tracing, and is iptables the nft variant?)",
        behind.join(", ")
    ))
}

/// Waits until every monitor is subscribed: it printed a sync datagram. A monitor not
/// subscribed yet misses one, so they are repeated. The wait is long: on a loaded 2-core
/// machine an `nft monitor` once took over 5 s to start; only a kernel without tracing waits
/// it out. A monitor that exited, or that is still silent halfway through the wait, is started
/// again (`restart`, by index): CI once saw one stay silent for the whole wait.
fn monitors_subscribed(
    site: &Site,
    tracer: Tracer,
    hosts: &[(String, String)],
    outputs: &[Arc<Mutex<String>>],
    exited: impl FnMut(usize) -> bool,
    restart: impl FnMut(usize) -> Result<()>,
) -> Result<()> {
    let send = |i: usize| send_canary(site, &hosts[i].1, tracer.v6(), &BTreeSet::new()).map(|_| ());
    let names: Vec<&str> = hosts.iter().map(|(h, _)| h.as_str()).collect();
    wait_subscribed(tracer, &names, outputs, Duration::from_secs(15), send, exited, restart)
}

/// [`monitors_subscribed`]'s loop, its side effects passed in: `send` a sync datagram into
/// host i, whether monitor i has `exited`, `restart` monitor i.
fn wait_subscribed(
    tracer: Tracer,
    names: &[&str],
    outputs: &[Arc<Mutex<String>>],
    wait: Duration,
    mut send: impl FnMut(usize) -> Result<()>,
    mut exited: impl FnMut(usize) -> bool,
    mut restart: impl FnMut(usize) -> Result<()>,
) -> Result<()> {
    let started = Instant::now();
    let (deadline, halfway) = (started + wait, started + wait / 2);
    let mut restarted_halfway = false;
    let mut restarts = vec![0u32; names.len()];
    let mut sent_at = Instant::now() - Duration::from_secs(1);
    loop {
        let behind: Vec<usize> =
            (0..names.len()).filter(|&i| canary_ports(tracer, &monitor_text(&outputs[i])).is_empty()).collect();
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(monitors_silent(&behind.iter().map(|&i| names[i]).collect::<Vec<_>>()));
        }
        for &i in &behind {
            if restarts[i] < 3 && exited(i) {
                restarts[i] += 1;
                restart(i)?;
            }
        }
        if !restarted_halfway && Instant::now() > halfway {
            restarted_halfway = true;
            for &i in &behind {
                restart(i)?;
            }
        }
        if sent_at.elapsed() > Duration::from_millis(20) {
            for &i in &behind {
                send(i)?;
            }
            sent_at = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until every monitor has delivered everything the kernel reported before now: a
/// fresh sync datagram, sent after the probe, has come out of each (events of one namespace
/// reach its monitor in order).
fn monitors_drained(
    site: &Site,
    tracer: Tracer,
    hosts: &[(String, String)],
    outputs: &[Arc<Mutex<String>>],
) -> Result<()> {
    let mut awaited = Vec::new();
    for ((_, ns), out) in hosts.iter().zip(outputs) {
        awaited.push(send_canary(site, ns, tracer.v6(), &canary_ports(tracer, &monitor_text(out)))?);
    }
    // As long as the subscription wait: a monitor on a loaded machine can lag seconds behind
    // (CI once saw more than 5 s); a healthy one answers in milliseconds.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let behind: Vec<&str> = hosts
            .iter()
            .zip(outputs)
            .zip(&awaited)
            .filter(|((_, o), port)| !canary_ports(tracer, &monitor_text(o)).contains(port))
            .map(|(((h, _), _), _)| h.as_str())
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(monitors_silent(&behind));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A namespace's own ears for a trace (namespace labs, iptables modes): a socket on the
/// kernel's trace group and one to name its interfaces, opened inside the namespace, so they
/// stay in it (a chain's rule handles are asked on its worker's nf_tables socket). No monitor
/// program: it had to start, load iptables' extensions and ask the kernel for each rule it was
/// told of, most of a trace's CPU on the hosts.
struct HostReader {
    listener: nfnl::trace::Listener,
    rtnl: super::route::Rtnl,
    events: Vec<nfnl::trace::TraceEvent>,
}

impl HostReader {
    /// One per host, each opened inside its namespace, all at once.
    fn open_all(site: &Site, hosts: &[(String, String)]) -> Result<Vec<HostReader>> {
        let names: Vec<String> = hosts.iter().map(|(_, ns)| ns.clone()).collect();
        let each = names.clone();
        let opened = each_host(site, &names, move |i| {
            let ns = &each[i];
            in_netns_thread(format!("/run/netns/{ns}"), || -> std::io::Result<HostReader> {
                let listener = nfnl::trace::Listener::open().map_err(|e| e.source)?;
                let rtnl = super::route::Rtnl::open()?;
                Ok(HostReader { listener, rtnl, events: vec![] })
            })?
            .map_err(|e| LabError::Io { what: format!("listen to the kernel's trace in {ns}"), source: e })
        });
        opened
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(LabError::NotReady("a listener job panicked".into()))))
            .collect()
    }

    /// Reads what is queued. Bounded: a trace's packets make a few hundred events; far more
    /// means something else marks packets for tracing in that namespace.
    fn read(&mut self, host: &str) -> Result<()> {
        const MAX_EVENTS: usize = 100_000;
        self.listener.read(&mut self.events).map_err(|e| LabError::Io {
            what: format!("read the kernel's trace events on {host} ({})", e.what),
            source: e.source,
        })?;
        if self.events.len() > MAX_EVENTS {
            return Err(LabError::NotReady(format!(
                "{host}: more than {MAX_EVENTS} trace events during one trace: something else sets `meta nftrace` (or `-j TRACE`) there"
            )));
        }
        Ok(())
    }

    /// The source ports of the sync datagrams heard so far.
    fn canaries(&self) -> BTreeSet<u16> {
        self.events.iter().filter_map(|e| super::events::loopback_datagram_to(e, CANARY_PORT)).collect()
    }

    /// What was heard, as observations (interfaces named by their namespace).
    fn observations(&mut self) -> Vec<parse::Observation> {
        let rtnl = &mut self.rtnl;
        super::events::observations(&self.events, |i| rtnl.name_of(i))
    }
}

/// [`monitors_drained`] for the trace's own listeners: a fresh sync datagram per host, then
/// every host's events read until that datagram's are among them (a namespace's events come in
/// order).
fn readers_drained(site: &Site, tracer: Tracer, hosts: &[(String, String)], readers: &mut [HostReader]) -> Result<()> {
    let mut awaited = Vec::new();
    for ((h, ns), r) in hosts.iter().zip(readers.iter_mut()) {
        r.read(h)?;
        awaited.push(send_canary(site, ns, tracer.v6(), &r.canaries())?);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut behind = vec![];
        for (((h, _), r), port) in hosts.iter().zip(readers.iter_mut()).zip(&awaited) {
            r.read(h)?;
            if !r.canaries().contains(port) {
                behind.push(h.as_str());
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(monitors_silent(&behind));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Each hit of a host's observations given its rule as `iptables-save` prints it (see
/// [`super::events::place`]): one `iptables-save` (or `ip6tables-save`) of every table — or
/// the one kept from an earlier trace, when nothing but traces changed the namespace's rules
/// since (`generations`, [`SaveCache`]) — and the handles of each chain hit. Returns the save by
/// table (the traced nodes' NAT rules come from it too) and, when the text is known to be the
/// ruleset at the current generation, what to keep once the trace's table is gone.
/// Hosts whose packets met no iptables rule (only the trace's own table) are not asked (their
/// kept text, if still good, is kept for the generation after the trace).
fn place_hits(
    cache: &SaveCache,
    ns: &str,
    v6: bool,
    generations: Option<InstallGenerations>,
    obs: &mut [parse::Observation],
) -> (BTreeMap<String, String>, Option<Keep>) {
    const TABLES: [&str; 5] = ["raw", "mangle", "nat", "filter", "security"];
    // The sync datagrams' hits are never shown: their chains need no listing.
    let chains: Vec<(String, String)> = super::events::chains_hit(obs, &TABLES, is_canary)
        .into_iter()
        .map(|(t, c)| (t.to_string(), c.to_string()))
        .collect();
    let path = format!("/run/netns/{ns}");
    let generation = || generation_of(&Site::Netns, ns);
    let now = generation();
    // Kept text is good when the trace's install was the only change since it was kept.
    let unchanged = generations.filter(|g| g.after == g.before.wrapping_add(1) && now == Some(g.after));
    if chains.is_empty() {
        // Still good after this trace, if it was before: its generation moves on.
        let still = unchanged.filter(|g| cache.generation(ns, v6) == Some(g.before));
        return (BTreeMap::new(), still.map(|g| Keep { generation: g.after, text: None }));
    }
    let kept = unchanged.and_then(|g| cache.get(ns, v6, g.before));
    let (text, keep) = match (kept, now) {
        (Some(text), Some(generation)) => (text, Some(Keep { generation, text: None })),
        _ => {
            let text = in_ns(ns, &[if v6 { "ip6tables-save" } else { "iptables-save" }]).unwrap_or_default();
            let still = now.filter(|g| generation() == Some(*g) && !text.is_empty());
            (text.clone(), still.map(|generation| Keep { generation, text: Some(text) }))
        }
    };
    let saves = super::events::split_save(&text);
    let family = if v6 { 10 } else { 2 };
    let mut handles = BTreeMap::new();
    for (table, chain) in chains {
        let listed = in_netns_thread(path.clone(), {
            let (table, chain) = (table.clone(), chain.clone());
            move || with_nfnl(|s| s.rule_handles(family, &table, &chain))
        });
        if let Ok(Ok(list)) = listed {
            handles.insert((table, chain), list);
        }
    }
    super::events::place(obs, &handles, &saves);
    (saves, keep)
}

/// A host's save to keep: the generation it is the ruleset of, and its text (None: the kept text,
/// unchanged).
#[derive(Debug, Default)]
struct Keep {
    generation: u32,
    text: Option<String>,
}

/// A host's nf_tables generation just before and just after the trace installed its table.
#[derive(Debug, Clone, Copy)]
struct InstallGenerations {
    before: u32,
    after: u32,
}

/// `iptables-save` text kept between traces, per namespace and family, with the nf_tables
/// generation it is the ruleset of: a namespace's generation moves with every change of its
/// rules (anyone's), so a trace that finds the generation it kept (its own table's install
/// and removal aside, each counted) lists nothing again — `iptables-save` was a fifth of a
/// trace's CPU. Kept only when the save was read with the generation standing still and the
/// trace's removal was the one change after it.
struct SaveCache {
    dir: std::path::PathBuf,
}

impl SaveCache {
    fn of(lab: &str) -> SaveCache {
        SaveCache { dir: std::env::temp_dir().join(format!("podpath-trace-{lab}.saves")) }
    }

    /// The text's file, and its generation's beside it (`.generation`).
    fn files(&self, ns: &str, v6: bool) -> (std::path::PathBuf, std::path::PathBuf) {
        let family = if v6 { "ip6" } else { "ip" };
        (self.dir.join(format!("{ns}.{family}")), self.dir.join(format!("{ns}.{family}.generation")))
    }

    /// The generation of the text kept for `ns`.
    fn generation(&self, ns: &str, v6: bool) -> Option<u32> {
        std::fs::read_to_string(self.files(ns, v6).1).ok()?.trim().parse().ok()
    }

    /// The text kept for `ns` at `generation`, if that is what was kept.
    fn get(&self, ns: &str, v6: bool, generation: u32) -> Option<String> {
        (self.generation(ns, v6)? == generation).then(|| std::fs::read_to_string(self.files(ns, v6).0).ok()).flatten()
    }

    /// Keeps `text` (None: the text kept already) for `ns` at `generation`: the text first, then
    /// its generation (each written whole and renamed into place). Between the two, the old
    /// generation names the new text, but it is older than the namespace's, so it is never
    /// asked for again.
    fn put(&self, ns: &str, v6: bool, generation: u32, text: Option<&str>) {
        let (text_file, generation_file) = self.files(ns, v6);
        let write = |file: &std::path::Path, content: &str| -> std::io::Result<()> {
            let tmp = file.with_extension("new");
            std::fs::write(&tmp, content).and_then(|_| std::fs::rename(&tmp, file)).inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })
        };
        let _ = std::fs::create_dir_all(&self.dir)
            .and_then(|_| text.map_or(Ok(()), |t| write(&text_file, t)))
            .and_then(|_| write(&generation_file, &generation.to_string()));
    }
}

/// Where a lab's kept saves are (`podpath down` removes them).
pub(crate) fn saves_dir(lab: &str) -> std::path::PathBuf {
    SaveCache::of(lab).dir
}

/// The probe's socket, made and bound inside the source's namespace (a socket stays in the
/// namespace it was made in) for the destination's family, so its port is known before the
/// trace rules go in. The DSCP rides in the TOS byte (IPv4) or the traffic class (IPv6).
fn probe_socket(ns_path: &str, v6: bool) -> Result<(socket2::Socket, SocketAddr)> {
    in_netns_thread(ns_path.to_string(), move || probe_socket_here(v6, 0))?
        .map_err(|e| LabError::Io { what: "make the probe's socket".into(), source: e })
}

/// `probe_socket` in this process's own namespace, bound to `port` (0: any).
pub fn probe_socket_here(v6: bool, port: u16) -> std::io::Result<(socket2::Socket, SocketAddr)> {
    {
        let (domain, any) = if v6 {
            (socket2::Domain::IPV6, SocketAddr::from((Ipv6Addr::UNSPECIFIED, port)))
        } else {
            (socket2::Domain::IPV4, SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
        };
        let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
        if v6 {
            s.set_only_v6(true)?;
            s.set_tclass_v6(PROBE_TOS)?;
        } else {
            s.set_tos_v4(PROBE_TOS)?;
        }
        s.bind(&any.into())?;
        let local = s.local_addr()?.as_socket().ok_or_else(|| std::io::Error::other("not an IP socket"))?;
        Ok((s, local))
    }
}

/// The probe: one HTTP request on the prepared socket; returns the source address it had.
pub fn probe(s: socket2::Socket, bound: SocketAddr, dst: SocketAddr, req: &Request) -> (SocketAddr, Outcome) {
    let t = Instant::now();
    let connected = s.connect_timeout(&dst.into(), req.timeout);
    // The source address is chosen at connect time (the port was fixed by bind).
    let local = s.local_addr().ok().and_then(|a| a.as_socket()).filter(|a| !a.ip().is_unspecified());
    let local = local.unwrap_or(bound);
    if let Err(e) = connected {
        return (local, failed(t, e.to_string()));
    }
    let mut stream: std::net::TcpStream = s.into();
    let _ = stream.set_read_timeout(Some(req.timeout));
    let sent = write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: podpath-trace\r\nConnection: close\r\n\r\n",
        req.path, req.host_header
    );
    if let Err(e) = sent {
        return (local, failed(t, e.to_string()));
    }
    let mut buf = Vec::new();
    let read = stream.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse::<u16>().ok());
    match (read, status) {
        (_, Some(code)) => (
            local,
            Outcome { answered: true, status: Some(code), millis: t.elapsed().as_secs_f64() * 1000.0, error: None },
        ),
        (Err(e), None) => (local, failed(t, e.to_string())),
        (Ok(_), None) => (local, failed(t, "the connection closed without an HTTP answer".into())),
    }
}

fn failed(t: Instant, error: String) -> Outcome {
    Outcome { answered: false, status: None, millis: t.elapsed().as_secs_f64() * 1000.0, error: Some(error) }
}

/// The network namespace (as a path) of a host of the lab or of a pod.
fn ns_path_of(st: &LabState, plan: &Plan, api: &ApiAccess, host: &str) -> Result<String> {
    if let Some(rest) = host.strip_prefix("pod/") {
        let (ns, name) =
            rest.split_once('/').ok_or_else(|| LabError::Usage(format!("{host:?}: use pod/NAMESPACE/NAME")))?;
        let pid = crate::hosts::pod_pid(st, api, ns, name)?;
        return Ok(format!("/proc/{pid}/ns/net"));
    }
    let ns = plan.netns_of(host).ok_or_else(|| {
        LabError::Usage(format!(
            "--from {host:?}: use client, gateway, node-1…node-{}, or pod/NAMESPACE/NAME",
            st.nodes
        ))
    })?;
    Ok(format!("/run/netns/{ns}"))
}

/// A JSON document from the API (Null when it is not there).
pub(crate) fn api_get(api: &ApiAccess, path: &str) -> serde_json::Value {
    match api.get(path) {
        Ok((200, body)) => serde_json::from_str(&body).unwrap_or_default(),
        _ => serde_json::Value::Null,
    }
}

/// Every pod address (both families of a dual-stack pod) → (`ns/name`, node), from the API.
pub(crate) fn pods_by_ip(api: &ApiAccess) -> BTreeMap<IpAddr, (String, String)> {
    let mut pods = BTreeMap::new();
    for p in api_get(api, "/api/v1/pods")["items"].as_array().into_iter().flatten() {
        let name = format!(
            "{}/{}",
            p["metadata"]["namespace"].as_str().unwrap_or(""),
            p["metadata"]["name"].as_str().unwrap_or("")
        );
        let node = p["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        let listed = p["status"]["podIPs"].as_array().into_iter().flatten().filter_map(|i| i["ip"].as_str());
        for ip in listed.chain(p["status"]["podIP"].as_str()).filter_map(|i| i.parse().ok()) {
            pods.insert(ip, (name.clone(), node.clone()));
        }
    }
    pods
}

fn api_objects(api: &ApiAccess) -> Objects {
    let get = |path: &str| api_get(api, path);
    let mut o = Objects { pods: pods_by_ip(api), ..Default::default() };
    for s in get("/api/v1/services")["items"].as_array().into_iter().flatten() {
        let name = format!(
            "{}/{}",
            s["metadata"]["namespace"].as_str().unwrap_or(""),
            s["metadata"]["name"].as_str().unwrap_or("")
        );
        let ips = s["spec"]["clusterIPs"].as_array().into_iter().flatten().filter_map(|i| i.as_str());
        for ip in ips.chain(s["spec"]["clusterIP"].as_str()).filter_map(|i| i.parse().ok()) {
            o.cluster_ips.insert(ip, name.clone());
        }
        if let Some(p) = s["spec"]["externalTrafficPolicy"].as_str() {
            o.traffic_policy.insert(name, p.to_string());
        }
    }
    o
}

/// lb-sim's view of a VIP: (what balances it, the nodes in rotation); a Service's frontend
/// (passthrough or nodeport mode) or an Ingress site (L7).
fn lb_view(doc: &serde_json::Value, vip: &str) -> Option<(String, Vec<String>)> {
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect()
    };
    if let Some(f) = doc["frontends"].as_array().into_iter().flatten().find(|f| f["vip"] == vip) {
        let rotation: Vec<String> = f["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|b| b["inRotation"] == true)
            .filter_map(|b| b["node"].as_str().map(str::to_string))
            .collect();
        let mode = format!("{} LB of {}", doc["mode"].as_str().unwrap_or("?"), f["service"].as_str().unwrap_or("?"));
        return Some((mode, rotation));
    }
    if let Some(g) = doc["gateways"].as_array().into_iter().flatten().find(|s| s["vip"] == vip) {
        return Some((format!("Gateway {}", g["gateway"].as_str().unwrap_or("?")), vec![]));
    }
    let site = doc["ingresses"].as_array().into_iter().flatten().find(|s| s["vip"] == vip)?;
    Some((format!("L7 LB of Ingress {}", site["ingress"].as_str().unwrap_or("?")), strings(&site["nodesInRotation"])))
}

/// A Gateway's last decision for a request of the probe (its TOS) to `vip`, in lines.
pub fn gateway_decision(doc: &serde_json::Value, vip: &str) -> Vec<String> {
    let Some(d) =
        doc["gatewayDecisions"].as_array().into_iter().flatten().rev().find(|d| {
            d["tos"].as_u64().is_some_and(|t| t as u32 & 0xfc == PROBE_TOS) && doc_has_gateway_vip(doc, d, vip)
        })
    else {
        return vec![];
    };
    let s = |k: &str| d[k].as_str().map(str::to_string);
    let mut out = vec![format!(
        "Gateway {} listener {} took {} {}",
        s("gateway").unwrap_or_default(),
        s("listener").unwrap_or_else(|| "(none)".into()),
        s("host").unwrap_or_default(),
        s("path").unwrap_or_default()
    )];
    match s("rule") {
        Some(r) => out.push(format!("matched {r}")),
        None => out.push("no route matched: 404".into()),
    }
    let filters: Vec<String> =
        d["filters"].as_array().into_iter().flatten().filter_map(|f| f.as_str().map(str::to_string)).collect();
    if !filters.is_empty() {
        out.push(format!("filters applied: {}", filters.join(", ")));
    }
    if let Some(b) = s("backend") {
        let ep = s("endpoint").map(|e| format!(" → endpoint {e}")).unwrap_or_default();
        out.push(format!("backend {b}{ep}"));
    }
    out
}

fn doc_has_gateway_vip(doc: &serde_json::Value, d: &serde_json::Value, vip: &str) -> bool {
    doc["gateways"].as_array().into_iter().flatten().any(|g| g["vip"] == vip && g["gateway"] == d["gateway"])
}

/// The file a trace of lab `name` holds locked (`down` removes it with the lab).
pub(crate) fn lock_path(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("podpath-trace-{name}.lock"))
}

/// [`trace`], tried once more from the start when its monitor heard nothing of its host for 15 s
/// (seen a few times in CI runs, a cause not found yet; the failed try put the hosts back).
pub fn trace_once_more_if_unheard(st: &LabState, req: &Request) -> Result<Trace> {
    match trace(st, req) {
        Err(LabError::NotReady(m)) if m.contains("trace monitor saw nothing") => {
            eprintln!("podpath: {m}; tracing once more");
            trace(st, req)
        }
        other => other,
    }
}

/// Traces one request through the lab; a request by name, the lookup first.
pub fn trace(st: &LabState, req: &Request) -> Result<Trace> {
    let plan = Plan::with_family(&st.name, st.nodes, st.ip_family);
    let api = crate::state::ApiAccess::of(st)?;
    let api = &api;
    let src_ns = ns_path_of(st, &plan, api, &req.from)?;
    let (dst, lookup) = match &req.target {
        Target::Addr(a) => (*a, None),
        Target::Name { name, port } => {
            let objects = api_objects(api);
            let mut l = lookup(st, api, &objects, &req.from, name)?;
            l.owner = l.address.and_then(|ip| describe(ip, &objects.cluster_ips, &objects.pods));
            match l.address {
                Some(ip) => (SocketAddr::new(ip, *port), Some(l)),
                None => return Ok(unresolved(req, l)),
            }
        }
    };
    let has = if dst.is_ipv6() { st.ip_family.has_v6() } else { st.ip_family.has_v4() };
    if !has {
        let family = if dst.is_ipv6() { "IPv6" } else { "IPv4" };
        return Err(LabError::Usage(format!(
            "{dst}: lab {} has no {family} (it was made with --ip-family {})",
            st.name, st.ip_family
        )));
    }
    let mut hosts: Vec<(String, String)> = vec![("client".into(), String::new()), ("gateway".into(), String::new())];
    hosts.extend(plan.nodes.iter().map(|n| (n.name.clone(), String::new())));
    for (h, ns) in &mut hosts {
        *ns = plan.netns_of(h).expect("planned host").to_string();
    }
    let mut nodes: Vec<(IpAddr, String)> = vec![];
    for n in &plan.nodes {
        nodes.push((n.ip.into(), n.name.clone()));
        if let Some(ip6) = n.ip6 {
            nodes.push((ip6.into(), n.name.clone()));
        }
    }
    let lab = Lab {
        site: Site::Netns,
        name: st.name.clone(),
        nftables: st.proxy_mode == crate::ProxyMode::Nftables,
        hosts,
        nodes,
        api,
        lb_status: Box::new(|| crate::lb_status(st)),
    };
    let mut t = trace_in(&lab, Source::Netns(src_ns), req, dst)?;
    t.lookup = lookup;
    Ok(t)
}

/// `podpath trace --vagrant`: the same trace on the machines of a Vagrant lab, each host's
/// monitor and rules over SSH, the probe sent by `podpath trace-helper probe` on the source
/// machine or in a pod's network namespace on its node (a request to an address: names are
/// looked up from pods, on namespace labs only).
pub fn trace_vagrant(v: Arc<crate::vagrant::VagrantLab>, req: &Request) -> Result<Trace> {
    let api = v.api()?;
    let dst = match &req.target {
        Target::Addr(a) if a.is_ipv4() => *a,
        Target::Addr(a) => return Err(LabError::Usage(format!("{a}: the Vagrant lab is IPv4 only"))),
        Target::Name { name, .. } => {
            return Err(LabError::Usage(format!(
                "{name}: on the Vagrant lab, trace an address (names are looked up from pods on namespace labs only, so far)"
            )))
        }
    };
    // From a pod: its node's machine, the probe sent from the pod's network namespace there.
    let (from, pod) = match req.from.strip_prefix("pod/") {
        Some(rest) => {
            let (ns, name) = rest
                .split_once('/')
                .ok_or_else(|| LabError::Usage(format!("{:?}: use pod/NAMESPACE/NAME", req.from)))?;
            let (node, pid) = crate::vagrant::pod_process(&v, ns, name)?;
            (v.machine(&node)?.to_string(), Some(pid))
        }
        None => (v.machine(&req.from)?.to_string(), None),
    };
    let mut names = vec!["client".to_string(), "gateway".to_string()];
    names.extend(v.nodes());
    for n in &names {
        v.machine(n)?;
    }
    let nodes: Vec<(IpAddr, String)> = v
        .nodes()
        .into_iter()
        .filter_map(|n| crate::vagrant::lab_ip(&n).and_then(|ip| ip.parse().ok()).map(|ip| (ip, n)))
        .collect();
    let nftables = v.nftables()?;
    let lb = v.clone();
    let lab = Lab {
        site: Site::Vagrant(v),
        name: "vagrant".into(),
        nftables,
        hosts: names.iter().map(|n| (n.clone(), n.clone())).collect(),
        nodes,
        api: &api,
        lb_status: Box::new(move || {
            let body = lb.run(
                "gateway",
                &["curl", "-sS", "--max-time", "3", &format!("http://{}/status", crate::state::LB_STATUS)],
            )?;
            serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("lb-sim status is not JSON: {e}")))
        }),
    };
    trace_in(&lab, Source::Machine { machine: from, pod }, req, dst)
}

/// What a trace needs of its lab, of either kind.
struct Lab<'a> {
    site: Site,
    /// Names the lock file: one trace per lab at a time.
    name: String,
    /// The nodes run the nftables mode.
    nftables: bool,
    /// (host, where it is: a namespace or a machine): the client, the gateway, the nodes.
    hosts: Vec<(String, String)>,
    /// Each node's addresses.
    nodes: Vec<(IpAddr, String)>,
    api: &'a ApiAccess,
    lb_status: Box<dyn Fn() -> Result<serde_json::Value> + 'a>,
}

/// Where the probe leaves from: a namespace (its path), or a machine of a Vagrant lab (in the
/// network namespace of the pod process `pod` there, if given).
enum Source {
    Netns(String),
    Machine { machine: String, pod: Option<String> },
}

/// The probe of a trace on a Vagrant lab's machine: `podpath trace-helper probe` there, bound
/// to `port`; (source address, outcome) from what it prints.
fn probe_on(
    v: &crate::vagrant::VagrantLab,
    machine: &str,
    pod: Option<&str>,
    port: u16,
    dst: SocketAddr,
    req: &Request,
) -> (SocketAddr, Outcome) {
    let t = Instant::now();
    let timeout = req.timeout.as_millis().to_string();
    let (port_s, dst_s) = (port.to_string(), dst.to_string());
    let mut argv = match pod {
        Some(pid) => vec!["nsenter", "-t", pid, "-n", "--"],
        None => vec![],
    };
    argv.extend([
        "podpath",
        "trace-helper",
        "probe",
        "--port",
        &port_s,
        "--dst",
        &dst_s,
        "--path",
        &req.path,
        "--host",
        &req.host_header,
        "--timeout-ms",
        &timeout,
    ]);
    let bound = SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port);
    match v.run(machine, &argv).map(|out| serde_json::from_str::<serde_json::Value>(&out)) {
        Ok(Ok(doc)) => {
            let src = doc["src"].as_str().and_then(|s| s.parse().ok()).unwrap_or(bound);
            let outcome = Outcome {
                answered: doc["answered"] == true,
                status: doc["status"].as_u64().map(|c| c as u16),
                millis: doc["millis"].as_f64().unwrap_or_default(),
                error: doc["error"].as_str().map(str::to_string),
            };
            (src, outcome)
        }
        Ok(Err(e)) => (bound, failed(t, format!("podpath trace-helper probe on {machine}: {e}"))),
        Err(e) => (bound, failed(t, e.to_string())),
    }
}

/// A trace once the destination is known: rules and monitors in every host, the probe, the
/// read back; everything put back on every way out.
fn trace_in(lab: &Lab, source: Source, req: &Request, dst: SocketAddr) -> Result<Trace> {
    let site = &lab.site;
    let tracer = Tracer::of(lab.nftables, dst.is_ipv6());
    let hosts = &lab.hosts;
    // One trace per lab at a time: the probe's DSCP is the same for every trace. The lock file
    // also says whether a trace's rules may be left in the hosts (`installed`: one was killed
    // before its cleanup); only then does a trace look for left-overs before installing.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(lock_path(&lab.name))
        .map_err(|e| LabError::Io { what: "open the trace lock".into(), source: e })?;
    let mut lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| LabError::Io { what: "lock the lab for tracing".into(), source: e.into() })?;
    // A killed trace's rules and switches: `tcp_reflect_tos` back to what it recorded (the
    // kernel's default, 0, where it recorded nothing).
    let left_overs = marked_installed(&mut lock).map_err(io("read the trace lock"))?;

    // The probe's socket (and so its port) first: the trace rules name the port.
    let (socket, bound) = match &source {
        Source::Netns(path) => {
            let (s, b) = probe_socket(path, dst.is_ipv6())?;
            (Some(s), b)
        }
        // An ephemeral port, free on the machine unless it is that busy.
        Source::Machine { .. } => {
            let nanos =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
            (None, SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 32768 + (nanos % 28000) as u16))
        }
    };
    let guard = Guard::new();
    // One thread inside each host's namespace for the trace's life: every question to a host
    // (its rules, sync datagrams, conntrack, routes, programs, monitors) goes to it, instead
    // of a thread started per question. Started after `guard`, so they block the signals it
    // waits for (a thread that did not would die of Ctrl-C before the cleanup).
    let _workers = match site {
        Site::Netns => Some(crate::hosts::NetnsWorkers::start(hosts.iter().map(|(_, ns)| format!("/run/netns/{ns}")))?),
        Site::Vagrant(_) => None,
    };
    guard.with(|i| {
        i.site = site.clone();
        i.namespaces.extend(hosts.iter().map(|(_, ns)| ns.clone()));
        i.rules = Some(tracer);
    });
    mark_installed(&mut lock, Some(&[])).map_err(io("write the trace lock"))?;
    // A monitor per host, its lines collected into `out` (monitor i is `guard`'s monitors[i]),
    // started first: they start up while the rules go in (xtables-monitor asks for each rule it
    // prints; `nft monitor` prints the trace table's own rules, added after it started, by
    // handle, and those hooks are not shown).
    // In a namespace lab's iptables modes the trace listens itself (`HostReader`), from before
    // its rules go in: no monitor to start or wait for.
    let mut readers = match (site, tracer.nft_rules()) {
        (Site::Netns, false) => Some(HostReader::open_all(site, hosts)?),
        _ => None,
    };
    let monitored = if readers.is_some() { &hosts[..0] } else { &hosts[..] };
    // In a namespace lab, the host's worker starts its monitor there; the workers end with this
    // function, and their monitors with them.
    let errors: Vec<Arc<Mutex<String>>> = monitored.iter().map(|_| Arc::default()).collect();
    let spawn_monitor = |i: usize, out: &Arc<Mutex<String>>| -> Result<Child> {
        let cmd = site.monitor_command(&hosts[i].1, tracer.monitor())?;
        let mut child = match site {
            Site::Netns => {
                let path = format!("/run/netns/{}", hosts[i].1);
                let worker = crate::hosts::NetnsWorkers::get(&path)
                    .ok_or_else(|| LabError::NotReady(format!("no helper thread inside {path}")))?;
                worker.spawn(cmd)
            }
            Site::Vagrant(_) => {
                let mut cmd = cmd;
                cmd.spawn()
            }
        }
        .map_err(|e| LabError::Io { what: format!("cannot run {}", tracer.monitor().join(" ")), source: e })?;
        let (stdout, sink) = (child.stdout.take().expect("piped"), out.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                s.push_str(&line);
                s.push('\n');
            }
        });
        // What a monitor says on stderr (why it exited, say), its last line kept for the
        // error when it stays silent.
        let (stderr, said) = (child.stderr.take().expect("piped"), errors[i].clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                if !line.trim().is_empty() {
                    *said.lock().unwrap_or_else(|e| e.into_inner()) = line.chars().take(300).collect();
                }
            }
        });
        Ok(child)
    };
    let mut outputs = Vec::new();
    for i in 0..monitored.len() {
        let out = Arc::new(Mutex::new(String::new()));
        let child = spawn_monitor(i, &out)?;
        guard.with(|i| i.monitors.push(child));
        outputs.push(out);
    }
    // Per host at once: the trace rules, and `tcp_reflect_tos` on (its old value kept).
    let names: Vec<String> = hosts.iter().map(|(_, ns)| ns.clone()).collect();
    let (each, site_, port) = (names.clone(), site.clone(), bound.port());
    let left_overs_ = left_overs.clone();
    // In a namespace lab, the host's nf_tables generation around the install too (SaveCache).
    type Done = (Result<()>, Option<String>, Option<InstallGenerations>);
    let installed: Vec<Done> = each_host(site, &names, move |i| {
        let ns = &each[i];
        let left = left_overs_
            .as_ref()
            .map(|l| l.iter().find(|(n, _)| n == ns).map(|(_, old)| old.clone()).unwrap_or_else(|| "0".into()));
        if let Some(old) = left {
            remove_rules_on(&site_, ns);
            set_reflect_tos(&site_, ns, &old);
        }
        let before = generation_of(&site_, ns);
        let done = tracer.install(&site_, ns, port);
        let after = generation_of(&site_, ns);
        let generations = before.zip(after).map(|(before, after)| InstallGenerations { before, after });
        (done, set_reflect_tos(&site_, ns, "1"), generations)
    })
    .into_iter()
    .map(|r| r.unwrap_or_else(|| (Err(LabError::NotReady("install job panicked".into())), None, None)))
    .collect();
    let mut results = vec![];
    let mut olds = vec![];
    let mut generations = vec![];
    for ((_, ns), (done, old, g)) in hosts.iter().zip(installed) {
        generations.push(g);
        if let Some(old) = old {
            guard.with(|i| i.reflect_tos.push((ns.clone(), old.clone())));
            olds.push((ns.clone(), old));
        }
        results.push(done);
    }
    mark_installed(&mut lock, Some(&olds)).map_err(io("write the trace lock"))?;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    monitors_subscribed(
        site,
        tracer,
        monitored,
        &outputs,
        |i| guard.with(|g| !matches!(g.monitors[i].try_wait(), Ok(None))),
        |i| {
            // The old one stopped by its PID first; its reader thread ends with its pipe.
            guard.with(|g| {
                let _ = g.monitors[i].kill();
                let _ = g.monitors[i].wait();
            });
            let child = spawn_monitor(i, &outputs[i])?;
            guard.with(|g| g.monitors[i] = child);
            Ok(())
        },
    )
    .map_err(|e| with_what_monitors_said(e, monitored, &errors))?;
    let (src, outcome) = match (&source, socket) {
        (Source::Netns(_), Some(socket)) => probe(socket, bound, dst, req),
        (Source::Machine { machine, pod }, _) => match site {
            Site::Vagrant(v) => probe_on(v, machine, pod.as_deref(), bound.port(), dst, req),
            Site::Netns => unreachable!("a machine is a Vagrant lab's"),
        },
        (Source::Netns(_), None) => unreachable!("made above"),
    };
    // A short wait lets a lost request's retransmits and a late reply be seen too.
    if !outcome.answered {
        std::thread::sleep(Duration::from_millis(200));
    }
    // What the kernel reported up to the drain; then the hosts are put back (monitors
    // stopped, rules removed) while the rest is read.
    let heard = match &mut readers {
        Some(readers) => {
            readers_drained(site, tracer, hosts, readers)?;
            Heard::Readers(std::mem::take(readers))
        }
        None => {
            monitors_drained(site, tracer, hosts, &outputs).map_err(|e| with_what_monitors_said(e, hosts, &errors))?;
            Heard::Monitors(outputs.iter().map(|o| monitor_text(o)).collect())
        }
    };
    let cache = Arc::new(SaveCache::of(&lab.name));
    let mut heard = hits(site, tracer, hosts, heard, &cache, generations);
    let fresh = std::mem::take(&mut heard.fresh);
    std::thread::scope(|s| -> Result<Trace> {
        let cleaning = s.spawn(|| guard.with(|i| i.cleanup()));
        let t = read_back(lab, tracer, heard, req, src, dst, outcome);
        let _ = cleaning.join();
        // A save is kept when the trace's removal was the one change after it.
        let (site_, v6) = (site.clone(), tracer.v6());
        let names: Vec<String> = fresh.iter().map(|(ns, _)| ns.clone()).collect();
        let fresh = Arc::new(fresh);
        each_host(site, &names, move |i| {
            let (ns, keep) = &fresh[i];
            let removed = keep.generation.wrapping_add(1);
            if generation_of(&site_, ns) == Some(removed) {
                cache.put(ns, v6, removed, keep.text.as_deref());
            }
        });
        t
    })
    .and_then(|t| {
        drop(guard);
        mark_installed(&mut lock, None).map_err(io("write the trace lock"))?;
        Ok(t)
    })
}

/// What the lock file says of the last trace: None when it cleaned up after itself; else its
/// rules may still be in the hosts, and the `tcp_reflect_tos` values it found (namespace, value).
fn marked_installed(lock: &mut std::fs::File) -> std::io::Result<Option<Vec<(String, String)>>> {
    use std::io::Seek;
    let mut text = String::new();
    lock.seek(std::io::SeekFrom::Start(0))?;
    lock.read_to_string(&mut text)?;
    let mut lines = text.lines();
    if lines.next() != Some("installed") {
        return Ok(None);
    }
    Ok(Some(lines.filter_map(|l| l.split_once(' ')).map(|(ns, v)| (ns.to_string(), v.to_string())).collect()))
}

/// Records in the lock file that the trace's rules are installed (with the `tcp_reflect_tos`
/// values to put back), or (None) that they are no longer.
fn mark_installed(lock: &mut std::fs::File, installed: Option<&[(String, String)]>) -> std::io::Result<()> {
    use std::io::Seek;
    lock.set_len(0)?;
    lock.seek(std::io::SeekFrom::Start(0))?;
    if let Some(olds) = installed {
        let mut text = String::from("installed\n");
        for (ns, v) in olds {
            text.push_str(&format!("{ns} {v}\n"));
        }
        lock.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// What the kernel told a trace, per host in `Lab::hosts` order: monitor programs' output, or
/// the trace's own listeners.
enum Heard {
    Monitors(Vec<String>),
    Readers(Vec<HostReader>),
}

/// Each host's observations (host → packets) and, from the trace's own listeners, each hit's
/// rule as `iptables-save` prints it (before the trace's table is removed: a change of a
/// namespace's ruleset while `iptables-save` reads it makes it read it again).
struct Hits {
    packets: BTreeMap<String, Vec<parse::Observation>>,
    /// Host → its tables as `iptables-save` printed them while the hits were placed.
    saved: BTreeMap<String, BTreeMap<String, String>>,
    /// The listeners, closed last: closing a netfilter socket waits until the kernel has
    /// released the transactions committed before it (an RCU grace period), and the cleanup
    /// commits right after this; by the end of the trace it mostly has.
    listening: Option<Arc<Vec<Mutex<HostReader>>>>,
    /// (namespace, what to keep of its save) where the save is known good.
    fresh: Vec<(String, Keep)>,
}

/// [`Hits`] from what was heard (the listeners' hits placed on each host's worker, all at once).
fn hits(
    site: &Site,
    tracer: Tracer,
    hosts: &[(String, String)],
    heard: Heard,
    cache: &Arc<SaveCache>,
    generations: Vec<Option<InstallGenerations>>,
) -> Hits {
    let mut out = Hits { packets: BTreeMap::new(), saved: BTreeMap::new(), listening: None, fresh: vec![] };
    match heard {
        Heard::Monitors(texts) => {
            for ((h, _), text) in hosts.iter().zip(&texts) {
                out.packets.insert(h.clone(), tracer.parse(text));
            }
        }
        Heard::Readers(readers) => {
            let names: Vec<String> = hosts.iter().map(|(_, ns)| ns.clone()).collect();
            let readers: Arc<Vec<Mutex<HostReader>>> = Arc::new(readers.into_iter().map(Mutex::new).collect());
            out.listening = Some(readers.clone());
            let (each, cache) = (names.clone(), cache.clone());
            let placed = each_host(site, &names, move |i| {
                let mut r = readers[i].lock().unwrap_or_else(|e| e.into_inner());
                let mut obs = r.observations();
                let (saves, fresh) = place_hits(&cache, &each[i], tracer.v6(), generations[i], &mut obs);
                (obs, saves, fresh)
            });
            for ((h, ns), (obs, saves, fresh)) in hosts.iter().zip(placed.into_iter().map(Option::unwrap_or_default)) {
                out.packets.insert(h.clone(), obs);
                out.saved.insert(h.clone(), saves);
                out.fresh.extend(fresh.map(|f| (ns.clone(), f)));
            }
        }
    }
    out
}

/// After the probe: the hosts' conntrack, routes, rules and the API's objects, read while the
/// trace's own rules are being removed; the trace assembled from them.
fn read_back(
    lab: &Lab,
    tracer: Tracer,
    heard: Hits,
    req: &Request,
    src: SocketAddr,
    dst: SocketAddr,
    outcome: Outcome,
) -> Result<Trace> {
    let (site, hosts) = (&lab.site, &lab.hosts);
    let Hits { packets, saved, listening: _listening, .. } = heard;
    let mut observed =
        Observed { from: req.from.clone(), src: Some(src), dst: Some(dst), packets, ..Default::default() };
    // Each host's conntrack asked about the flow's connections only, and only hosts the probe
    // crossed. A lookup of the exact tuple (`-G`: one hash lookup in the kernel), not a listing
    // with filters: `-L` copies the whole table out and filters it in the tool, and a node under
    // load holds hundreds of thousands of entries (12 % of the CPU of a lab serving 23,000
    // connections a second went to the traces' listings). The family follows the addresses.
    let queries: Vec<(&str, &str, (SocketAddr, SocketAddr))> = hosts
        .iter()
        .flat_map(|(h, ns)| {
            flow::conntrack_queries(&observed.packets[h]).into_iter().map(move |t| (h.as_str(), ns.as_str(), t))
        })
        .collect();
    let asked: Vec<String> = queries.iter().map(|(_, ns, _)| ns.to_string()).collect();
    let (each, tuples, site_) = (asked.clone(), queries.iter().map(|q| q.2).collect::<Vec<_>>(), site.clone());
    let answers: Vec<Vec<parse::CtEntry>> = each_host(site, &asked, move |i| {
        let (ns, (from, to)) = (&each[i], tuples[i]);
        if let Site::Netns = site_ {
            // Over ctnetlink from a socket in the host's namespace: no program start.
            return super::ct::get(ns, (from, to)).into_iter().collect();
        }
        let argv = super::ct::tool_argv((from, to));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        parse::parse_conntrack(&site_.run(ns, &argv).unwrap_or_default())
    })
    .into_iter()
    .map(Option::unwrap_or_default)
    .collect();
    for (h, _) in hosts {
        let entries = queries
            .iter()
            .zip(&answers)
            .filter(|((host, _, _), _)| host == h)
            .flat_map(|(_, found)| found.iter().cloned())
            .collect();
        observed.conntrack.insert(h.clone(), entries);
    }
    let mut objects = api_objects(lab.api);
    for (ip, name) in &lab.nodes {
        objects.nodes.insert(*ip, name.clone());
    }
    let flow = flow::follow(&observed);
    let queries = flow::route_queries(&observed, &flow);
    let asked: Vec<String> = queries
        .iter()
        .map(|((_, host), _)| hosts.iter().find(|(h, _)| h == host).expect("traced host").1.clone())
        .collect();
    let (each, questions, site_) =
        (asked.clone(), queries.iter().map(|q| q.1.clone()).collect::<Vec<_>>(), site.clone());
    let answers: Vec<Option<String>> = each_host(site, &asked, move |i| match &site_ {
        // Over rtnetlink from the host's namespace: no `ip` start.
        Site::Netns => {
            let q = questions[i].clone();
            crate::in_netns_thread(format!("/run/netns/{}", each[i]), move || q.ask()).ok().flatten()
        }
        Site::Vagrant(_) => {
            let mut argv = vec!["ip".to_string(), "route".into(), "get".into()];
            argv.extend(questions[i].argv());
            site_.run(&each[i], &argv.iter().map(String::as_str).collect::<Vec<_>>()).ok()
        }
    })
    .into_iter()
    .map(Option::flatten)
    .collect();
    for ((key, _), route) in queries.into_iter().zip(answers) {
        if let Some(r) = route {
            objects.routes.insert(key, r);
        }
    }
    let traced_nodes: BTreeSet<&String> =
        flow.legs.iter().flat_map(|l| &l.path).filter(|h| h.starts_with("node-")).collect();
    // Per traced node: the NAT rules (iptables-save, unless saved already while the hits were
    // placed; or the kube-proxy table).
    let traced: Vec<&String> = traced_nodes.into_iter().collect();
    let asked: Vec<String> =
        traced.iter().map(|host| hosts.iter().find(|(h, _)| h == *host).expect("traced host").1.clone()).collect();
    let nats: Vec<Option<String>> =
        traced.iter().map(|host| saved.get(*host).and_then(|tables| tables.get("nat")).cloned()).collect();
    let (each, site_) = (asked.clone(), site.clone());
    let texts = each_host(site, &asked, move |i| {
        let ns = &each[i];
        match (tracer, nats[i].clone()) {
            (Tracer::Xtables | Tracer::Ip6tables, Some(nat)) => nat,
            (Tracer::Xtables, None) => site_.save_text(ns, false, "nat").unwrap_or_default(),
            (Tracer::Ip6tables, None) => site_.save_text(ns, true, "nat").unwrap_or_default(),
            (Tracer::Nft | Tracer::Nft6, _) => {
                site_.nft_list_table(ns, tracer.family(), super::nft_steps::TABLE).unwrap_or_default()
            }
        }
    });
    let rules = traced.into_iter().zip(texts).filter_map(|(host, text)| Some((host.clone(), text?)));
    for (host, text) in rules {
        if tracer.nft_rules() {
            objects.nft_tables.insert(host, text);
        } else {
            objects.nat_rules.insert(host, text);
        }
    }
    if flow.legs.iter().any(|l| l.path.iter().any(|h| h == "gateway")) {
        if let Ok(doc) = (lab.lb_status)() {
            let vip = dst.ip().to_string();
            objects.lb = lb_view(&doc, &vip);
            objects.gateway_decision = gateway_decision(&doc, &vip);
            if let Some(site) = doc["ingresses"].as_array().into_iter().flatten().find(|s| s["vip"] == vip.as_str()) {
                objects.lb_routes = site["rules"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|r| r.as_str().map(str::to_string))
                    .chain(site["defaultBackend"].as_str().map(|d| format!("default backend → {d}")))
                    .collect();
            }
        }
    }
    Ok(super::assemble::assemble(&observed, &objects, outcome))
}

/// The trace of a request whose name did not resolve: the lookup, and no connection.
fn unresolved(req: &Request, l: Lookup) -> Trace {
    let last = l.queries.last().map(|q| q.rcode.clone()).unwrap_or_default();
    let millis = l.queries.iter().map(|q| q.millis).sum();
    let error = format!("{} did not resolve (last answer: {last})", l.name);
    Trace {
        from: req.from.clone(),
        src: String::new(),
        dst: l.name.clone(),
        hops: vec![],
        pod: None,
        pod_saw: None,
        outcome: Outcome { answered: false, status: None, millis, error: Some(error.clone()) },
        stopped: Some(format!("the lookup: {error}; no connection was made")),
        conntrack: vec![],
        reply_path: vec![],
        lookup: Some(l),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_of_both_families_and_names() {
        let addr = |t: &str| match parse_target(t).unwrap() {
            (Target::Addr(a), path, host) => (a.to_string(), path, host),
            (t, ..) => panic!("{t:?}"),
        };
        assert_eq!(addr("http://198.51.100.1/x"), ("198.51.100.1:80".into(), "/x".into(), "198.51.100.1".into()));
        assert_eq!(
            addr("http://[2001:db8:100::1]/"),
            ("[2001:db8:100::1]:80".into(), "/".into(), "[2001:db8:100::1]".into())
        );
        assert_eq!(addr("[fd00:10:96::a]:53").0, "[fd00:10:96::a]:53");
        assert_eq!(addr("http://[fd00::5]:8080/p").0, "[fd00::5]:8080");
        assert_eq!(
            parse_target("http://web.default:8080/").unwrap().0,
            Target::Name { name: "web.default".into(), port: 8080 }
        );
        // An IPv6 address must be in brackets (its colons are not a port), and well formed.
        for bad in
            ["http://fd00::5/", "fd00::5:80", "[fd00::5]", "http://[fd00::zz]/", "http://[fd00::5/", "[10.0.0.1]:80"]
        {
            let e = parse_target(bad).unwrap_err().to_string();
            assert!(e.contains("an IPv6 one in brackets"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_ipv6_trace_table_matches_the_traffic_class() {
        let t = nft_trace_table(41000, NftFamily::Ip6);
        let text = NftTransaction::between(None, &t).0.text();
        assert!(text.contains("table ip6 podpath-trace"), "{text}");
        assert!(text.contains("ip6 dscp 0x2d tcp flags & (syn | ack) == syn goto traced"), "{text}");
        assert!(text.contains("ip6 dscp 0x2d udp dport 9 goto traced"), "{text}");
        assert!(!text.contains("ip dscp"), "{text}");
    }

    /// Both families' tables go over netlink from the trace itself (no `nft` process).
    #[test]
    fn the_trace_tables_are_written_over_netlink() {
        for family in [NftFamily::Ip, NftFamily::Ip6] {
            assert_eq!(nfnl::unwritable(&nft_trace_table(41000, family)), Vec::<String>::new(), "{family:?}");
        }
    }

    #[test]
    fn a_sync_datagram_seen_at_several_hooks_counts_once_by_its_port() {
        // What xtables-monitor prints for one datagram to 127.0.0.1:9 (output, then input).
        let one = "PACKET: 2 c86dc4fa OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=29 TOS=0xb4 TTL=64 ID=21857 DF SPORT=53410 DPORT=9 \n \
             TRACE: 2 c86dc4fa raw:OUTPUT:policy:ACCEPT \n\
             PACKET: 2 b8fb2e7c IN=lo LOOPBACK SRC=127.0.0.1 DST=127.0.0.1 LEN=29 TOS=0xb4 TTL=64 ID=21857 DF SPORT=53410 DPORT=9 \n \
             TRACE: 2 b8fb2e7c raw:PREROUTING:policy:ACCEPT \n";
        assert_eq!(canary_ports(Tracer::Xtables, one), BTreeSet::from([53410]));
        let probe = "PACKET: 2 0a0b0c0d IN=eth0 SRC=203.0.113.10 DST=10.0.0.1 LEN=60 TOS=0xb4 TTL=63 ID=1 DF SPORT=41000 DPORT=80 SYN \n";
        let second = one.replace("53410", "53411");
        assert_eq!(canary_ports(Tracer::Xtables, &format!("{one}{probe}{second}")), BTreeSet::from([53410, 53411]));
        assert!(canary_ports(Tracer::Xtables, probe).is_empty());
    }

    /// A monitor's last stderr line is appended to the silent-monitor error; with none said, the
    /// error is unchanged.
    #[test]
    fn a_silent_monitors_error_carries_what_it_said() {
        let hosts = [("client".to_string(), "ns-c".to_string()), ("node-1".to_string(), "ns-1".to_string())];
        let said: Vec<Arc<Mutex<String>>> =
            vec![Arc::default(), Arc::new(Mutex::new("Parsing nftables rule failed".into()))];
        let e = with_what_monitors_said(monitors_silent(&["node-1"]), &hosts, &said);
        assert_eq!(
            e.to_string().split("; ").last(),
            Some("the monitor on node-1 said \"Parsing nftables rule failed\""),
            "{e}"
        );
        assert!(e.to_string().contains("trace monitor saw nothing on node-1"), "the retry still recognises it: {e}");
        let quiet = with_what_monitors_said(monitors_silent(&["node-1"]), &hosts, &[Arc::default(), Arc::default()]);
        assert_eq!(quiet.to_string(), monitors_silent(&["node-1"]).to_string());
    }

    /// Three monitors: one hears the first datagram, one has exited (restarted, then hears),
    /// one stays deaf until it is restarted halfway through the wait; a fourth run with a monitor
    /// that never hears ends with the host named.
    #[test]
    fn silent_or_exited_monitors_are_started_again() {
        let heard = |port: u16| {
            format!("PACKET: 2 c86dc4fa OUT=lo SRC=127.0.0.1 DST=127.0.0.1 LEN=29 TOS=0xb4 TTL=64 ID=1 DF SPORT={port} DPORT=9 \n")
        };
        let outputs: Vec<Arc<Mutex<String>>> = (0..3).map(|_| Arc::default()).collect();
        let alive = Mutex::new(vec![true, false, true]);
        let restarted = Mutex::new(vec![0, 0, 0]);
        let r = wait_subscribed(
            Tracer::Xtables,
            &["a", "b", "c"],
            &outputs,
            Duration::from_millis(400),
            |i| {
                // A monitor hears only while it is running; c only after its restart.
                let running = alive.lock().unwrap()[i];
                if running && (i != 2 || restarted.lock().unwrap()[2] > 0) {
                    outputs[i].lock().unwrap().push_str(&heard(40000 + i as u16));
                }
                Ok(())
            },
            |i| !alive.lock().unwrap()[i],
            |i| {
                alive.lock().unwrap()[i] = true;
                restarted.lock().unwrap()[i] += 1;
                Ok(())
            },
        );
        assert!(r.is_ok(), "{r:?}");
        let n = restarted.lock().unwrap().clone();
        assert_eq!((n[0], n[1] >= 1, n[2]), (0, true, 1), "restarts {n:?}");
        let deaf: Vec<Arc<Mutex<String>>> = vec![Arc::default()];
        let e = wait_subscribed(
            Tracer::Xtables,
            &["node-1"],
            &deaf,
            Duration::from_millis(100),
            |_| Ok(()),
            |_| false,
            |_| Ok(()),
        )
        .unwrap_err();
        assert!(e.to_string().contains("saw nothing on node-1"), "{e}");
    }
}
