//! The gateway's own routing state: passthrough routes and the proxies' addresses.
//!
//! Each VIP is a route `VIP nhid G proto 78` to a **resilient** nexthop group `G` of the nodes
//! in rotation. Unlike a plain multipath route, a resilient group keeps every hash bucket where
//! it is when a member leaves (only the leaving node's buckets move) and gives a returning node
//! only buckets that have been idle, so connections to healthy nodes are never moved to a node
//! without their conntrack state. [`plan`] is pure: what the kernel holds ([`Observed`]) and
//! what is wanted in, `ip -batch` lines out; [`Ip`] is the one place that runs them.
//! Everything lb-sim owns carries `proto 78` (routes, nexthops) or the address label
//! `lo:pplb`, so it recognises its own state after a restart and never touches anything else.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::IpAddr;
use std::process::{Command, Stdio};

use ipnet::IpNet;
use serde_json::Value;

use crate::error::{LbError, Result};

/// `proto` of lb-sim's routes and nexthops (unassigned in iproute2's rt_protos; the node agent
/// uses 77).
pub const PROTO: u8 = 78;
/// The label of the proxies' IPv4 addresses on `lo`.
pub const ADDRESS_LABEL: &str = "lo:pplb";
/// The flags that mark the proxies' IPv6 addresses on `lo`: IPv6 addresses have no label (and
/// Debian 12's iproute2 no address `proto`), so lb-sim adds its own with both `nodad` and
/// `noprefixroute` — flags a /128 on `lo` has no other use for — and knows them by these.
pub const V6_FLAGS: &str = "nodad noprefixroute";
/// Group ids start here; node nexthops use ids below.
pub const FIRST_GROUP_ID: u32 = 0x10000;
/// Buckets per group: enough for an even spread over a lab's nodes.
pub const BUCKETS: u32 = 64;
/// Seconds a hash bucket must be idle before a returning node may take it over: short enough
/// that a node is back in use within seconds in a quiet lab, long enough not to move a
/// connection that is busy.
pub const IDLE_TIMER_SECONDS: u32 = 5;
/// The fields a flow's path is chosen by (`fib_multipath_hash_fields`): source and destination
/// address, protocol, source and destination port — not the IPv6 flow label.
pub const HASH_FIELDS: &str = "0x0037";

/// Makes this namespace choose a multipath route's nexthop by the flow's five-tuple, as a cloud
/// load balancer does: every lab client has the same address, so ports must count, and only the
/// custom policy (3) hashes the packet itself. The kernel's policy 1 takes the hash the sender's
/// socket stamped on the packet when there is one (it crosses a veth), and a TCP socket draws a
/// new one each time it retransmits a SYN: a retransmitted SYN would go to another node, split
/// one connection over two nodes' conntrack, and hang it. Returns what could not be set (a
/// kernel before 5.12 has no policy 3; then policy 1 is the fallback).
pub fn hash_by_five_tuple() -> Vec<String> {
    let mut problems = Vec::new();
    for family in ["ipv4", "ipv6"] {
        let dir = format!("/proc/sys/net/{family}");
        let custom = std::fs::write(format!("{dir}/fib_multipath_hash_fields"), HASH_FIELDS)
            .and_then(|()| std::fs::write(format!("{dir}/fib_multipath_hash_policy"), "3"));
        if let Err(e) = custom {
            problems.push(format!(
                "{family}: cannot hash multipath routes by the five-tuple ({e}); a retransmitted SYN may reach another node"
            ));
            if let Err(e) = std::fs::write(format!("{dir}/fib_multipath_hash_policy"), "1") {
                problems.push(format!(
                    "{family}: cannot hash multipath routes by port either ({e}); all of one client's flows take one node"
                ));
            }
        }
    }
    problems
}

/// What lb-sim owns in the kernel right now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// Node nexthops: id → gateway.
    pub nexthops: BTreeMap<u32, IpAddr>,
    /// Groups: id → member ids (sorted).
    pub groups: BTreeMap<u32, Vec<u32>>,
    /// Routes: destination → nexthop group id (None: a route of ours without one).
    pub routes: BTreeMap<IpAddr, Option<u32>>,
    /// IPv4 addresses with [`ADDRESS_LABEL`], IPv6 ones with [`V6_FLAGS`].
    pub addresses: BTreeSet<IpAddr>,
    /// Routes of ours to a subnet (not one address): subnet → the node it goes through.
    pub subnets: BTreeMap<IpNet, Option<IpAddr>>,
}

/// What lb-sim wants: VIP → node IPs, and the addresses the proxies listen on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    pub routes: BTreeMap<IpAddr, BTreeSet<IpAddr>>,
    pub addresses: BTreeSet<IpAddr>,
    /// Nodes' pod subnets, each through its node (the Gateways reach endpoints directly, as a
    /// cloud's container-native load balancer does).
    pub subnets: BTreeMap<IpNet, IpAddr>,
}

fn host_prefix(ip: &IpAddr) -> String {
    format!("{ip}/{}", if ip.is_ipv4() { 32 } else { 128 })
}

fn first_free(used: impl Fn(u32) -> bool, from: u32) -> u32 {
    (from..).find(|id| !used(*id)).expect("a free nexthop id")
}

/// The `ip -batch` lines that turn `have` into `want`. `devices` names the interface each node
/// IP is reached through (nexthops need one). Order: node nexthops, groups, routes, then
/// removals (routes before the groups they use, groups before their members).
pub fn plan(want: &Wanted, have: &Observed, devices: &BTreeMap<IpAddr, String>, idle_timer: u32) -> Vec<String> {
    plan_and_outcome(want, have, devices, idle_timer).0
}

/// [`plan`]'s lines, and what lb-sim owns in the kernel once they ran: the next sync starts
/// from it instead of listing the kernel again.
pub fn plan_and_outcome(
    want: &Wanted,
    have: &Observed,
    devices: &BTreeMap<IpAddr, String>,
    idle_timer: u32,
) -> (Vec<String>, Observed) {
    let mut after = Observed {
        addresses: want.addresses.clone(),
        subnets: want.subnets.iter().map(|(net, node)| (*net, Some(*node))).collect(),
        ..Observed::default()
    };
    let mut lines = Vec::new();
    let mut node_ids: BTreeMap<IpAddr, u32> = have.nexthops.iter().map(|(id, ip)| (*ip, *id)).collect();
    let needed: BTreeSet<IpAddr> = want.routes.values().flatten().copied().collect();
    for ip in &needed {
        if node_ids.contains_key(ip) {
            continue;
        }
        let id = first_free(|id| have.nexthops.contains_key(&id) || node_ids.values().any(|v| *v == id), 1);
        node_ids.insert(*ip, id);
        let dev = devices.get(ip).map(|d| format!(" dev {d}")).unwrap_or_default();
        lines.push(format!("nexthop replace id {id} via {ip}{dev} proto {PROTO}"));
    }
    let mut used_groups = BTreeSet::new();
    let mut new_groups = BTreeSet::new();
    for (vip, nodes) in &want.routes {
        let members: Vec<u32> = {
            let mut m: Vec<u32> = nodes.iter().map(|ip| node_ids[ip]).collect();
            m.sort_unstable();
            m
        };
        let current = have.routes.get(vip).copied().flatten().filter(|g| have.groups.contains_key(g));
        let group = current.unwrap_or_else(|| {
            let g = first_free(|id| have.groups.contains_key(&id) || new_groups.contains(&id), FIRST_GROUP_ID);
            new_groups.insert(g);
            g
        });
        used_groups.insert(group);
        after.routes.insert(*vip, Some(group));
        after.groups.insert(group, members.clone());
        if have.groups.get(&group) != Some(&members) {
            let list = members.iter().map(u32::to_string).collect::<Vec<_>>().join("/");
            lines.push(format!(
                "nexthop replace id {group} group {list} type resilient buckets {BUCKETS} idle_timer {idle_timer} proto {PROTO}"
            ));
        }
        if have.routes.get(vip) != Some(&Some(group)) {
            lines.push(format!("route replace {} nhid {group} proto {PROTO}", host_prefix(vip)));
        }
    }
    for (net, node) in &want.subnets {
        if have.subnets.get(net) != Some(&Some(*node)) {
            lines.push(format!("route replace {net} via {node} proto {PROTO}"));
        }
    }
    for net in have.subnets.keys().filter(|n| !want.subnets.contains_key(n)) {
        lines.push(format!("route del {net} proto {PROTO}"));
    }
    for ip in want.addresses.difference(&have.addresses) {
        if ip.is_ipv6() {
            lines.push(format!("address add {} dev lo {V6_FLAGS}", host_prefix(ip)));
        } else {
            lines.push(format!("address add {} dev lo label {ADDRESS_LABEL}", host_prefix(ip)));
        }
    }
    for vip in have.routes.keys().filter(|v| !want.routes.contains_key(v)) {
        lines.push(format!("route del {} proto {PROTO}", host_prefix(vip)));
    }
    for g in have.groups.keys().filter(|g| !used_groups.contains(g)) {
        lines.push(format!("nexthop del id {g}"));
    }
    for (id, ip) in &have.nexthops {
        if !needed.contains(ip) {
            lines.push(format!("nexthop del id {id}"));
        }
    }
    for ip in have.addresses.difference(&want.addresses) {
        if ip.is_ipv6() {
            lines.push(format!("address del {} dev lo", host_prefix(ip)));
        } else {
            lines.push(format!("address del {} dev lo label {ADDRESS_LABEL}", host_prefix(ip)));
        }
    }
    // Nexthops to a node still needed stay (even a second one to the same node); new ones join.
    after.nexthops = have.nexthops.iter().filter(|(_, ip)| needed.contains(ip)).map(|(id, ip)| (*id, *ip)).collect();
    after.nexthops.extend(node_ids.into_iter().filter(|(ip, _)| needed.contains(ip)).map(|(ip, id)| (id, ip)));
    (lines, after)
}

/// Reads `ip -j nexthop show proto 78`.
pub fn parse_nexthops(json: &str, into: &mut Observed) -> std::result::Result<(), String> {
    for nh in parse_array(json)? {
        let id = nh["id"].as_u64().and_then(|i| u32::try_from(i).ok()).ok_or("a nexthop without an id")?;
        if let Some(group) = nh["group"].as_array() {
            let mut members: Vec<u32> =
                group.iter().filter_map(|m| m["id"].as_u64().and_then(|i| u32::try_from(i).ok())).collect();
            members.sort_unstable();
            into.groups.insert(id, members);
        } else if let Some(gw) = nh["gateway"].as_str().and_then(|g| g.parse().ok()) {
            into.nexthops.insert(id, gw);
        }
    }
    Ok(())
}

/// Reads `ip -j route show proto 78` (IPv4 or IPv6).
pub fn parse_routes(json: &str, into: &mut Observed) -> std::result::Result<(), String> {
    for r in parse_array(json)? {
        let Some(dst) = r["dst"].as_str() else { continue };
        if let Ok(net) = dst.parse::<IpNet>() {
            if net.prefix_len() < net.max_prefix_len() {
                into.subnets.insert(net, r["gateway"].as_str().and_then(|g| g.parse().ok()));
                continue;
            }
        }
        let ip = dst.split('/').next().unwrap_or(dst);
        let Ok(ip) = ip.parse::<IpAddr>() else { continue };
        into.routes.insert(ip, r["nhid"].as_u64().and_then(|i| u32::try_from(i).ok()));
    }
    Ok(())
}

/// Reads `ip -j address show dev lo`: the addresses labelled [`ADDRESS_LABEL`] and the IPv6
/// ones with [`V6_FLAGS`].
pub fn parse_addresses(json: &str, into: &mut Observed) -> std::result::Result<(), String> {
    for link in parse_array(json)? {
        for a in link["addr_info"].as_array().into_iter().flatten() {
            let flagged = |f: &str| a[f].as_bool() == Some(true);
            let ours = a["label"].as_str() == Some(ADDRESS_LABEL)
                || (a["family"].as_str() == Some("inet6") && flagged("nodad") && flagged("noprefixroute"));
            if ours {
                if let Some(ip) = a["local"].as_str().and_then(|l| l.parse().ok()) {
                    into.addresses.insert(ip);
                }
            }
        }
    }
    Ok(())
}

fn parse_array(json: &str) -> std::result::Result<Vec<Value>, String> {
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    match serde_json::from_str(json) {
        Ok(Value::Array(a)) => Ok(a),
        Ok(_) => Err("not a JSON array".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The gateway's routing state, behind one small trait so the loop can be tested without root.
pub trait Ip: Send + Sync + 'static {
    fn observe(&self) -> Result<Observed>;
    /// The interface `ip` is reached through.
    fn device_for(&self, ip: IpAddr) -> Result<String>;
    fn apply(&self, lines: &[String]) -> Result<()>;
}

/// Runs iproute2's `ip` in the current network namespace, or in a named one (`ip -n`).
#[derive(Debug, Clone, Default)]
pub struct IpCommand {
    pub netns: Option<String>,
}

impl IpCommand {
    fn command(&self) -> Command {
        let mut c = Command::new("ip");
        if let Some(ns) = &self.netns {
            c.args(["-n", ns]);
        }
        c
    }

    fn run(&self, args: &[&str], what: &str) -> Result<String> {
        run_ip(self.command(), args, what)
    }
}

fn run_ip(mut cmd: Command, args: &[&str], what: &str) -> Result<String> {
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LbError::io(format!("run `ip` to {what} (is iproute2 installed?)"), e))?;
    if !out.status.success() {
        return Err(LbError::Ip { what: what.into(), detail: String::from_utf8_lossy(&out.stderr).trim().to_string() });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Ip for IpCommand {
    fn observe(&self) -> Result<Observed> {
        let mut o = Observed::default();
        fn bad(what: &'static str) -> impl Fn(String) -> LbError {
            move |detail| LbError::Ip { what: format!("read {what}"), detail }
        }
        // The four listings at once: each is a process of its own, and a new Service's route
        // waits for all of them (one after another they took most of the create → route time).
        let listings: [(&[&str], &str); 4] = [
            (&["-j", "nexthop", "show", "proto", "78"], "list nexthops"),
            (&["-4", "-j", "route", "show", "proto", "78"], "list routes"),
            (&["-6", "-j", "route", "show", "proto", "78"], "list routes"),
            (&["-j", "address", "show", "dev", "lo"], "list addresses"),
        ];
        let [nexthops, routes4, routes6, addresses] = std::thread::scope(|s| {
            listings.map(|(args, what)| s.spawn(move || self.run(args, what))).map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err(LbError::Ip { what: "list".into(), detail: "a thread panicked".into() }))
            })
        });
        parse_nexthops(&nexthops?, &mut o).map_err(bad("nexthops"))?;
        for routes in [routes4?, routes6?] {
            parse_routes(&routes, &mut o).map_err(bad("routes"))?;
        }
        parse_addresses(&addresses?, &mut o).map_err(bad("addresses"))?;
        Ok(o)
    }

    fn device_for(&self, ip: IpAddr) -> Result<String> {
        let out = self.run(&["-j", "route", "get", &ip.to_string()], &format!("find the route to node {ip}"))?;
        parse_array(&out)
            .ok()
            .and_then(|a| a.first().and_then(|r| r["dev"].as_str().map(str::to_string)))
            .ok_or_else(|| LbError::Ip { what: format!("find the route to node {ip}"), detail: out.trim().into() })
    }

    fn apply(&self, lines: &[String]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        let what = format!("apply {} route changes ({})", lines.len(), lines[0]);
        let mut child = self
            .command()
            .args(["-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| LbError::io("run `ip -batch` (is iproute2 installed?)", e))?;
        let mut input = lines.join("\n");
        input.push('\n');
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(input.as_bytes())
            .map_err(|e| LbError::io("write to `ip -batch`", e))?;
        let out = child.wait_with_output().map_err(|e| LbError::io("wait for `ip -batch`", e))?;
        if !out.status.success() {
            return Err(LbError::Ip { what, detail: String::from_utf8_lossy(&out.stderr).trim().to_string() });
        }
        Ok(())
    }
}

/// Removes every route, nexthop and address lb-sim made in this namespace (`lb-sim --cleanup`);
/// returns the number of changes. Not generic, so it is compiled here, not in the binary.
pub fn cleanup() -> Result<usize> {
    sync(&IpCommand::default(), &Wanted::default(), &mut None)
}

/// Brings the kernel to `want`; returns the number of lines applied. `known` is what the last
/// sync left in the kernel (None: read it, as lb-sim's loop has it done at each resync): lb-sim
/// alone writes what it owns, and reading it takes four `ip` processes, which a new Service's
/// route used to wait for. When lines planned from `known` fail (the kernel dropped a nexthop
/// with its device, say), the kernel is read and the sync tried once more; after a failure
/// `known` is None.
pub fn sync(ip: &impl Ip, want: &Wanted, known: &mut Option<Observed>) -> Result<usize> {
    if let Some(have) = known.take() {
        match sync_from(ip, want, have) {
            Ok((n, after)) => {
                *known = Some(after);
                return Ok(n);
            }
            Err(e) => tracing::info!(error = %e, "gateway routing: reading the kernel again after a failed change"),
        }
    }
    let (n, after) = sync_from(ip, want, ip.observe()?)?;
    *known = Some(after);
    Ok(n)
}

fn sync_from(ip: &impl Ip, want: &Wanted, have: Observed) -> Result<(usize, Observed)> {
    let reached: BTreeSet<IpAddr> = have.nexthops.values().copied().collect();
    let mut devices = BTreeMap::new();
    for node in want.routes.values().flatten().filter(|n| !reached.contains(n)) {
        if !devices.contains_key(node) {
            devices.insert(*node, ip.device_for(*node)?);
        }
    }
    let (lines, after) = plan_and_outcome(want, &have, &devices, IDLE_TIMER_SECONDS);
    ip.apply(&lines)?;
    for l in &lines {
        tracing::info!(change = %l, "gateway routing");
    }
    Ok((lines.len(), after))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn want(routes: &[(&str, &[&str])], addresses: &[&str]) -> Wanted {
        Wanted {
            routes: routes.iter().map(|(v, ns)| (ip(v), ns.iter().map(|n| ip(n)).collect())).collect(),
            addresses: addresses.iter().map(|a| ip(a)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn pod_subnets_go_through_their_nodes_and_are_read_back() {
        let mut w = want(&[], &[]);
        w.subnets.insert("10.244.1.0/24".parse().unwrap(), ip("192.168.56.11"));
        let lines = plan(&w, &Observed::default(), &devices(), IDLE_TIMER_SECONDS);
        assert_eq!(lines, ["route replace 10.244.1.0/24 via 192.168.56.11 proto 78"]);
        let mut have = Observed::default();
        let listing = r#"[{"dst":"10.244.1.0/24","gateway":"192.168.56.11","protocol":"78"},{"dst":"198.51.100.1","nhid":65536}]"#;
        parse_routes(listing, &mut have).unwrap();
        assert_eq!(have.subnets.get(&"10.244.1.0/24".parse().unwrap()), Some(&Some(ip("192.168.56.11"))));
        assert!(plan(&w, &Observed { routes: Default::default(), ..have.clone() }, &devices(), IDLE_TIMER_SECONDS)
            .is_empty());
        // Not wanted any more: removed.
        let lines =
            plan(&Wanted::default(), &Observed { routes: Default::default(), ..have }, &devices(), IDLE_TIMER_SECONDS);
        assert_eq!(lines, ["route del 10.244.1.0/24 proto 78"]);
    }

    fn devices() -> BTreeMap<IpAddr, String> {
        ["192.168.56.11", "192.168.56.12", "192.168.56.13"].iter().map(|n| (ip(n), "eth0".to_string())).collect()
    }

    /// Applies plan lines to an [`Observed`] the way the kernel would (enough for these tests).
    fn apply(o: &mut Observed, lines: &[String]) {
        for l in lines {
            let w: Vec<&str> = l.split_whitespace().collect();
            match (w[0], w[1]) {
                ("nexthop", "replace") if w[4] == "group" => {
                    let id = w[3].parse().unwrap();
                    let m = w[5].split('/').map(|x| x.parse().unwrap()).collect();
                    o.groups.insert(id, m);
                }
                ("nexthop", "replace") => {
                    o.nexthops.insert(w[3].parse().unwrap(), ip(w[5]));
                }
                ("nexthop", "del") => {
                    let id: u32 = w[3].parse().unwrap();
                    assert!(!o.groups.values().any(|m| m.contains(&id)), "{id} is still in a group");
                    assert!(!o.routes.values().any(|g| *g == Some(id)), "{id} is still routed");
                    o.groups.remove(&id);
                    o.nexthops.remove(&id);
                }
                ("route", "replace") if w[3] == "via" => {
                    o.subnets.insert(w[2].parse().unwrap(), Some(ip(w[4])));
                }
                ("route", "replace") => {
                    o.routes.insert(ip(w[2].split('/').next().unwrap()), Some(w[4].parse().unwrap()));
                }
                ("route", "del") if host(w[2]) => {
                    o.routes.remove(&ip(w[2].split('/').next().unwrap()));
                }
                ("route", "del") => {
                    o.subnets.remove(&w[2].parse().unwrap());
                }
                ("address", "add") => {
                    o.addresses.insert(ip(w[2].split('/').next().unwrap()));
                }
                ("address", "del") => {
                    o.addresses.remove(&ip(w[2].split('/').next().unwrap()));
                }
                _ => panic!("unexpected line {l}"),
            }
        }
    }

    /// A destination of one address (a VIP's route), not a subnet.
    fn host(dst: &str) -> bool {
        dst.ends_with("/32") || dst.ends_with("/128")
    }

    /// A kernel that holds what lb-sim owns the way [`apply`] says, counts its listings, and
    /// can fail the next change.
    #[derive(Default)]
    struct FakeIp {
        kernel: std::sync::Mutex<Observed>,
        listings: std::sync::atomic::AtomicUsize,
        fail_next: std::sync::atomic::AtomicBool,
    }

    impl Ip for FakeIp {
        fn observe(&self) -> Result<Observed> {
            self.listings.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(self.kernel.lock().unwrap().clone())
        }
        fn device_for(&self, _: IpAddr) -> Result<String> {
            Ok("eth0".into())
        }
        fn apply(&self, lines: &[String]) -> Result<()> {
            if self.fail_next.swap(false, std::sync::atomic::Ordering::SeqCst) {
                return Err(LbError::Ip { what: "apply".into(), detail: "Nexthop id does not exist".into() });
            }
            apply(&mut self.kernel.lock().unwrap(), lines);
            Ok(())
        }
    }

    #[test]
    fn a_plans_outcome_is_what_its_lines_leave_in_the_kernel() {
        let mut subnets = want(&[("198.51.100.1", &["192.168.56.11"])], &["203.0.113.5"]);
        subnets.subnets.insert("10.244.1.0/24".parse().unwrap(), ip("192.168.56.12"));
        let wants = [
            want(&[("198.51.100.1", &["192.168.56.11", "192.168.56.12"])], &[]),
            want(&[("198.51.100.1", &["192.168.56.11", "192.168.56.12", "192.168.56.13"])], &["203.0.113.5"]),
            want(
                &[
                    ("198.51.100.1", &["192.168.56.12"]),
                    ("198.51.100.2", &["192.168.56.13"]),
                    ("fd00::1", &["192.168.56.11"]),
                ],
                &["fd00::5"],
            ),
            subnets,
            want(&[("198.51.100.2", &["192.168.56.11"])], &[]),
            Wanted::default(),
        ];
        // From nothing, and from a kernel holding a stray route and a second nexthop to a node.
        let stray = Observed {
            nexthops: [(1, ip("192.168.56.11")), (7, ip("192.168.56.11"))].into(),
            routes: [(ip("198.51.100.9"), None)].into(),
            ..Observed::default()
        };
        for start in [Observed::default(), stray] {
            let mut kernel = start;
            for w in &wants {
                let (lines, outcome) = plan_and_outcome(w, &kernel, &devices(), 5);
                apply(&mut kernel, &lines);
                assert_eq!(outcome, kernel, "after {lines:?}");
                assert!(plan(w, &kernel, &devices(), 5).is_empty(), "the outcome is in line with {w:?}");
            }
        }
    }

    #[test]
    fn a_sync_starts_from_the_last_ones_outcome_and_reads_the_kernel_when_a_change_fails() {
        use std::sync::atomic::Ordering::SeqCst;
        let ip_ = FakeIp::default();
        let mut known = None;
        let one = want(&[("198.51.100.1", &["192.168.56.11"])], &[]);
        let two = want(&[("198.51.100.1", &["192.168.56.11"]), ("198.51.100.2", &["192.168.56.12"])], &[]);
        assert_eq!(sync(&ip_, &one, &mut known).unwrap(), 3);
        assert_eq!(ip_.listings.load(SeqCst), 1, "the first sync reads the kernel");
        assert_eq!(sync(&ip_, &two, &mut known).unwrap(), 3);
        assert_eq!(ip_.listings.load(SeqCst), 1, "the next one starts from what the first left");
        assert_eq!(known.as_ref(), Some(&*ip_.kernel.lock().unwrap()));
        // The kernel dropped node 1's nexthop (its device went down): the change planned from
        // what lb-sim believed fails, and the sync reads the kernel and makes it again.
        ip_.kernel.lock().unwrap().nexthops.remove(&1);
        ip_.kernel.lock().unwrap().groups.clear();
        ip_.kernel.lock().unwrap().routes.clear();
        ip_.fail_next.store(true, SeqCst);
        sync(&ip_, &one, &mut known).unwrap();
        assert_eq!(ip_.listings.load(SeqCst), 2);
        assert!(plan(&one, &ip_.kernel.lock().unwrap(), &devices(), 5).is_empty(), "back in line");
        assert_eq!(known.as_ref(), Some(&*ip_.kernel.lock().unwrap()));
        // A failure with the kernel just read: an error, and nothing believed.
        ip_.fail_next.store(true, SeqCst);
        let mut fresh = None;
        assert!(sync(&ip_, &two, &mut fresh).is_err());
        assert_eq!(fresh, None);
    }

    #[test]
    fn a_new_vip_gets_node_nexthops_a_resilient_group_and_a_route() {
        let w = want(&[("198.51.100.1", &["192.168.56.11", "192.168.56.12"])], &[]);
        let lines = plan(&w, &Observed::default(), &devices(), 5);
        assert_eq!(
            lines,
            vec![
                "nexthop replace id 1 via 192.168.56.11 dev eth0 proto 78",
                "nexthop replace id 2 via 192.168.56.12 dev eth0 proto 78",
                "nexthop replace id 65536 group 1/2 type resilient buckets 64 idle_timer 5 proto 78",
                "route replace 198.51.100.1/32 nhid 65536 proto 78",
            ]
        );
        let mut o = Observed::default();
        apply(&mut o, &lines);
        assert!(plan(&w, &o, &devices(), 5).is_empty(), "a second plan changes nothing");
    }

    #[test]
    fn withdrawing_a_node_replaces_the_same_group_and_keeps_the_route() {
        let mut o = Observed::default();
        let all = want(&[("198.51.100.1", &["192.168.56.11", "192.168.56.12", "192.168.56.13"])], &[]);
        let lines = plan(&all, &o, &devices(), 5);
        apply(&mut o, &lines);
        let two = want(&[("198.51.100.1", &["192.168.56.11", "192.168.56.13"])], &[]);
        let lines = plan(&two, &o, &devices(), 5);
        assert_eq!(
            lines,
            vec![
                "nexthop replace id 65536 group 1/3 type resilient buckets 64 idle_timer 5 proto 78",
                "nexthop del id 2",
            ]
        );
        apply(&mut o, &lines);
        // The node comes back: a new nexthop, the same group.
        let lines = plan(&all, &o, &devices(), 5);
        assert_eq!(lines[0], "nexthop replace id 2 via 192.168.56.12 dev eth0 proto 78");
        assert_eq!(lines[1], "nexthop replace id 65536 group 1/2/3 type resilient buckets 64 idle_timer 5 proto 78");
        assert_eq!(lines.len(), 2);
    }

    #[test]
    fn removals_come_after_everything_that_uses_them() {
        let mut o = Observed::default();
        let w = want(&[("198.51.100.1", &["192.168.56.11"]), ("169.10.10.1", &["192.168.56.12"])], &["198.51.100.2"]);
        let lines = plan(&w, &o, &devices(), 5);
        apply(&mut o, &lines);
        assert_eq!(o.addresses, [ip("198.51.100.2")].into());
        assert_eq!(o.groups.len(), 2);
        let lines = plan(&Wanted::default(), &o, &devices(), 5);
        apply(&mut o, &lines);
        assert_eq!(o, Observed::default());
        assert!(
            lines.iter().position(|l| l.starts_with("route del"))
                < lines.iter().position(|l| l.starts_with("nexthop del"))
        );
    }

    #[test]
    fn ipv6_proxy_addresses_are_known_by_their_flags() {
        let mut o = Observed::default();
        let w = want(&[], &["2001:db8:100::1", "198.51.100.2"]);
        let lines = plan(&w, &o, &devices(), 5);
        assert!(lines.contains(&"address add 2001:db8:100::1/128 dev lo nodad noprefixroute".to_string()), "{lines:?}");
        apply(&mut o, &lines);
        // Made once; the next sync has nothing to do.
        assert!(plan(&w, &o, &devices(), 5).is_empty());
        let mut read = Observed::default();
        parse_addresses(
            r#"[{"ifname":"lo","addr_info":[{"family":"inet6","local":"2001:db8:100::1","prefixlen":128,"scope":"global","nodad":true,"noprefixroute":true},
                {"family":"inet6","local":"::1","prefixlen":128,"scope":"host"}]}]"#,
            &mut read,
        )
        .unwrap();
        assert_eq!(read.addresses, [ip("2001:db8:100::1")].into());
        let lines = plan(&Wanted::default(), &read, &devices(), 5);
        assert_eq!(lines, ["address del 2001:db8:100::1/128 dev lo"]);
    }

    #[test]
    fn group_ids_do_not_collide_with_groups_the_kernel_holds() {
        let mut o = Observed::default();
        o.groups.insert(FIRST_GROUP_ID, vec![]);
        o.routes.insert(ip("198.51.100.9"), Some(FIRST_GROUP_ID));
        let w = want(&[("198.51.100.1", &["192.168.56.11"])], &[]);
        let lines = plan(&w, &o, &devices(), 5);
        assert!(lines.contains(&"route replace 198.51.100.1/32 nhid 65537 proto 78".to_string()), "{lines:?}");
    }

    #[test]
    fn parses_what_ip_prints() {
        let mut o = Observed::default();
        parse_nexthops(
            r#"[{"id":1,"gateway":"192.168.56.11","dev":"d0","scope":"link","protocol":"78","flags":[]},
                {"id":100,"group":[{"id":3},{"id":1}],"type":"resilient","protocol":"78","flags":[]}]"#,
            &mut o,
        )
        .unwrap();
        parse_routes(r#"[{"dst":"198.51.100.1","nhid":100,"flags":[]}]"#, &mut o).unwrap();
        parse_routes("", &mut o).unwrap();
        parse_addresses(
            r#"[{"ifname":"lo","addr_info":[{"family":"inet","local":"127.0.0.1","label":"lo"},
                {"family":"inet","local":"198.51.100.9","prefixlen":32,"label":"lo:pplb"}]}]"#,
            &mut o,
        )
        .unwrap();
        assert_eq!(o.nexthops, [(1, ip("192.168.56.11"))].into());
        assert_eq!(o.groups, [(100, vec![1, 3])].into());
        assert_eq!(o.routes, [(ip("198.51.100.1"), Some(100))].into());
        assert_eq!(o.addresses, [ip("198.51.100.9")].into());
        assert!(parse_routes("{", &mut o).is_err());
    }
}
