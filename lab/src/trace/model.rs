//! From what the kernel observed to a trace people can read (pure): which hosts the probe's
//! packets crossed and in what order, the rules that decided each step, the conntrack entries
//! of the flow, and the Kubernetes objects behind each rule.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddrV4};

use podpath_ruleset::{Match, RecentOp, Rule, Target};
use serde::Serialize;

use super::parse::{CtEntry, Observation, RuleHit};

/// What was observed, per host (`client`, `gateway`, `node-N`).
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub from: String,
    /// The probe's own address and the address it connected to.
    pub src: Option<SocketAddrV4>,
    pub dst: Option<SocketAddrV4>,
    pub packets: BTreeMap<String, Vec<Observation>>,
    pub conntrack: BTreeMap<String, Vec<CtEntry>>,
}

/// The flow's tuples: forward (request) and backward (reply) direction, across every NAT on
/// the way (the closure over the hosts' conntrack entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tuples {
    pub forward: BTreeSet<(SocketAddrV4, SocketAddrV4)>,
    pub backward: BTreeSet<(SocketAddrV4, SocketAddrV4)>,
}

fn rev(t: (SocketAddrV4, SocketAddrV4)) -> (SocketAddrV4, SocketAddrV4) {
    (t.1, t.0)
}

/// The flow's tuples, starting from the probe's (src, dst).
pub fn tuples(start: (SocketAddrV4, SocketAddrV4), conntrack: &BTreeMap<String, Vec<CtEntry>>) -> Tuples {
    let mut t = Tuples::default();
    t.forward.insert(start);
    t.backward.insert(rev(start));
    loop {
        let before = (t.forward.len(), t.backward.len());
        for e in conntrack.values().flatten() {
            if t.forward.contains(&e.orig) || t.forward.contains(&rev(e.reply)) {
                t.forward.insert(e.orig);
                t.forward.insert(rev(e.reply));
                // Between the hooks: destination translated (PREROUTING), source not yet
                // (POSTROUTING); the reply likewise the other way round.
                t.forward.insert((e.orig.0, e.reply.0));
                t.backward.insert(e.reply);
                t.backward.insert(rev(e.orig));
                t.backward.insert((e.reply.0, e.orig.0));
            }
        }
        if (t.forward.len(), t.backward.len()) == before {
            return t;
        }
    }
}

/// The DSCP the probe's packets carry (0x2d, TOS byte 0xb4): the request's first packet is
/// recognised by it on every host, also after NAT changed its addresses and ports, and relays
/// keep it on the connections they open for the request (`podpath_client::relay`).
pub const PROBE_TOS: u32 = 0xb4;

/// The hosts the request's first packet crossed, in order: the sender first, then by the TTL
/// the packet arrived with (every router on the way takes one off).
pub fn request_path(observed: &Observed, t: &Tuples) -> Vec<String> {
    path_of(observed, |o| o.is_syn() && t.forward.contains(&(o.src, o.dst)))
}

/// One TCP connection carrying the request: the probe's own, or one a relay opened for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leg {
    /// The connection's first tuple (as its sender made it).
    pub start: (SocketAddrV4, SocketAddrV4),
    pub tuples: Tuples,
    /// The hosts its first packet crossed (the sender first, when traced).
    pub path: Vec<String>,
}

impl Leg {
    fn new(start: (SocketAddrV4, SocketAddrV4), observed: &Observed) -> Leg {
        let tuples = tuples(start, &observed.conntrack);
        let path = request_path(observed, &tuples);
        Leg { start, tuples, path }
    }
}

/// A process that accepted a leg and opened its own connection onward: the userspace proxy on
/// a node, lb-sim's NodePort or L7 load balancer on the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay {
    pub host: String,
    /// The address it accepted the connection on (after any REDIRECT).
    pub accepted_on: SocketAddrV4,
    /// Its connections for the request, in order, with how each went (`connected`, `refused
    /// (reset from …)`, `no answer`); the last one is the one the request went on.
    pub attempts: Vec<(Leg, String)>,
}

/// The request's connections end to end: `legs[i]` reaches `relays[i]`, which opened `legs[i+1]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Flow {
    pub legs: Vec<Leg>,
    pub relays: Vec<Relay>,
}

/// How a relay's connection went: a reset back to the relay host means refused; a conntrack
/// entry that saw both directions, connected. Conntrack forgets a refused connection at once.
fn attempt_result(observed: &Observed, host: &str, leg: &Leg) -> String {
    let reset = observed
        .packets
        .get(host)
        .into_iter()
        .flatten()
        .find(|o| o.has_flag("RST") && leg.tuples.backward.contains(&(o.src, o.dst)));
    if let Some(r) = reset {
        return format!("refused (reset from {})", r.src);
    }
    let entry = observed.conntrack.get(host).into_iter().flatten().find(|e| e.orig == leg.start);
    match entry {
        Some(e) if e.assured || e.state == "ESTABLISHED" => "connected".into(),
        Some(e) if e.state == "SYN_SENT" => "no answer".into(),
        Some(e) => format!("not answered ({})", e.state),
        // Namespaces without NAT rules track no connections (the gateway).
        None => "no conntrack entry".into(),
    }
}

/// Follows the request through relays: where a leg ends on a host that then opened connections
/// with the probe's DSCP, those are the relay's attempts, and the last one carries the request on.
pub fn follow(observed: &Observed) -> Flow {
    let (Some(src), Some(dst)) = (observed.src, observed.dst) else { return Flow::default() };
    let mut flow = Flow { legs: vec![Leg::new((src, dst), observed)], relays: vec![] };
    let mut known: BTreeSet<(SocketAddrV4, SocketAddrV4)> = flow.legs[0].tuples.forward.clone();
    // Bounded: the lab has at most two relays on a path (gateway, then a node).
    for _ in 0..4 {
        let leg = flow.legs.last().expect("one leg at least");
        let Some(host) = leg.path.last().cloned() else { break };
        let obs = observed.packets.get(&host).map(Vec::as_slice).unwrap_or_default();
        // Where it was delivered: the destination after this host's NAT (a REDIRECT to a proxy
        // port), else the last destination seen.
        let translated = observed
            .conntrack
            .get(&host)
            .into_iter()
            .flatten()
            .find(|e| leg.tuples.forward.contains(&e.orig))
            .map(|e| e.reply.0);
        let seen = obs
            .iter()
            .filter(|o| o.is_syn() && leg.tuples.forward.contains(&(o.src, o.dst)))
            .map(|o| o.dst)
            .next_back();
        let Some(accepted_on) = translated.or(seen) else { break };
        let mut starts: Vec<(SocketAddrV4, SocketAddrV4)> = Vec::new();
        for o in obs {
            let opened_here = o.is_syn() && o.iif.is_none() && u32::from(o.tos) & 0xfc == PROBE_TOS;
            if opened_here && !known.contains(&(o.src, o.dst)) && !starts.contains(&(o.src, o.dst)) {
                starts.push((o.src, o.dst));
            }
        }
        if starts.is_empty() {
            break;
        }
        let attempts: Vec<(Leg, String)> = starts
            .iter()
            .map(|s| {
                let leg = Leg::new(*s, observed);
                known.extend(leg.tuples.forward.iter().copied());
                let result = attempt_result(observed, &host, &leg);
                (leg, result)
            })
            .collect();
        flow.legs.push(attempts.last().expect("non-empty").0.clone());
        flow.relays.push(Relay { host, accepted_on, attempts });
    }
    flow
}

/// The hosts the reply's first packet (SYN-ACK) crossed, in order.
pub fn reply_path(observed: &Observed, t: &Tuples) -> Vec<String> {
    path_of(observed, |o| o.is_syn_ack() && t.backward.contains(&(o.src, o.dst)))
}

fn path_of(observed: &Observed, wanted: impl Fn(&Observation) -> bool) -> Vec<String> {
    let mut hosts: Vec<(bool, u8, String)> = observed
        .packets
        .iter()
        .filter_map(|(host, obs)| {
            let mine: Vec<&Observation> = obs.iter().filter(|o| wanted(o)).collect();
            let ttl = mine.iter().map(|o| o.ttl).max()?;
            // A packet made here (no input interface) comes before every packet received.
            let sent_here = mine.iter().any(|o| o.iif.is_none());
            Some((!sent_here, u8::MAX - ttl, host.clone()))
        })
        .collect();
    hosts.sort();
    hosts.into_iter().map(|(_, _, h)| h).collect()
}

/// The route lookups that explain where each host sent the request: ((leg, host), `ip route
/// get` arguments), with the packet's addresses as it left the host (after any DNAT) and the
/// interface it came in on, so the kernel answers for exactly this packet. A leg's last host
/// before a relay delivered it locally: no lookup there.
pub fn route_queries(observed: &Observed, flow: &Flow) -> Vec<((usize, String), Vec<String>)> {
    let mut out = Vec::new();
    for (k, leg) in flow.legs.iter().enumerate() {
        let relayed = k < flow.relays.len();
        for (i, host) in leg.path.iter().enumerate() {
            if relayed && i + 1 == leg.path.len() {
                continue;
            }
            if let Some(args) = route_query(observed, &leg.tuples, host) {
                out.push(((k, host.clone()), args));
            }
        }
    }
    out
}

fn route_query(observed: &Observed, t: &Tuples, host: &str) -> Option<Vec<String>> {
    let obs: Vec<&Observation> =
        observed.packets[host].iter().filter(|o| o.is_syn() && t.forward.contains(&(o.src, o.dst))).collect();
    let (Some(first), Some(last)) = (obs.first(), obs.last()) else { return None };
    let mut args = vec![last.dst.ip().to_string()];
    if let Some(iif) = &first.iif {
        args.extend(["from".into(), first.src.ip().to_string(), "iif".into(), iif.clone()]);
    }
    args.extend([
        "ipproto".into(),
        "tcp".into(),
        "sport".into(),
        first.src.port().to_string(),
        "dport".into(),
        last.dst.port().to_string(),
    ]);
    Some(args)
}

/// The Kubernetes side: who owns the addresses the trace meets.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    /// Pod IP → (`ns/name`, node).
    pub pods: BTreeMap<Ipv4Addr, (String, String)>,
    /// Node IP → node name.
    pub nodes: BTreeMap<Ipv4Addr, String>,
    /// `ns/name` → externalTrafficPolicy.
    pub traffic_policy: BTreeMap<String, String>,
    /// Per host: `iptables-save -t nat` (for rule positions and probabilities).
    pub nat_rules: BTreeMap<String, String>,
    /// Per (leg, host): `ip route get` of the address the request left that host for.
    pub routes: BTreeMap<(usize, String), String>,
    /// lb-sim's view of the probe's destination: (mode, chosen or all nodes in rotation).
    pub lb: Option<(String, Vec<String>)>,
    /// The L7 load balancer's routing table for the probe's destination
    /// (`HOST PATH (TYPE) → SERVICE:PORT (nodePort N)`, and the default backend).
    pub lb_routes: Vec<String>,
}

/// One line of a hop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    /// `route`, `nat`, `filter`, `deliver`, `stop`, `lb`.
    pub kind: String,
    pub text: String,
    /// The rule as iptables-save prints it, when a rule decided this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The Kubernetes object (or field) behind the step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
}

fn step(kind: &str, text: impl Into<String>) -> Step {
    Step { kind: kind.into(), text: text.into(), rule: None, object: None }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub host: String,
    pub steps: Vec<Step>,
}

/// How the probe ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub answered: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    pub millis: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The whole trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Trace {
    pub from: String,
    pub src: String,
    pub dst: String,
    pub hops: Vec<Hop>,
    /// The pod that got the request, and the client address it saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_saw: Option<String>,
    pub outcome: Outcome,
    /// Where and why the request failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// `host: orig ⇄ reply` for every host that translated the flow.
    pub conntrack: Vec<String>,
    /// The reply's first packet, host by host.
    pub reply_path: Vec<String>,
}

fn name_of(objects: &Objects, ip: Ipv4Addr) -> Option<String> {
    if let Some((pod, _)) = objects.pods.get(&ip) {
        return Some(format!("pod {pod}"));
    }
    objects.nodes.get(&ip).cloned()
}

/// `10.244.1.0/24 via 192.168.56.11 dev eth0` out of `ip route get` output, with the node it
/// leads to.
fn route_text(objects: &Objects, raw: &str) -> String {
    let line = raw.lines().next().unwrap_or("").trim();
    let via = line.split(" via ").nth(1).and_then(|r| r.split(' ').next()).and_then(|v| v.parse::<Ipv4Addr>().ok());
    let dev = line.split(" dev ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("?");
    let dst = line.split(' ').next().unwrap_or("?");
    match via {
        Some(v) => match name_of(objects, v) {
            Some(n) => format!("route {dst} via {v} ({n}) dev {dev}"),
            None => format!("route {dst} via {v} dev {dev}"),
        },
        None => format!("route {dst} dev {dev} (directly connected)"),
    }
}

/// The rules of `iptables-save` output (its `-A` lines; the workspace's one parser).
fn saved_rules(save: &str) -> Vec<Rule> {
    save.lines()
        .filter(|l| l.starts_with("-A "))
        .filter_map(|l| podpath_ruleset::text::parse_rule_line(l).ok())
        .collect()
}

/// A session-affinity check (`-m recent --rcheck`): not one of the endpoint choices.
fn is_affinity_check(r: &Rule) -> bool {
    r.matches.iter().any(|m| matches!(m, Match::Recent { op: RecentOp::Check { .. }, .. }))
}

/// The position of a KUBE-SVC jump among its chain's endpoint jumps and its probability:
/// `rule 2 of 3 (probability 0.5)`.
fn svc_choice(nat_rules: Option<&String>, hit: &RuleHit) -> Option<String> {
    let rule = hit.parsed.as_ref()?;
    let saved = saved_rules(nat_rules?);
    let jumps: Vec<&Rule> = saved
        .iter()
        .filter(|r| r.chain == hit.chain && !is_affinity_check(r))
        .filter(|r| r.jump_target().is_some_and(|t| t.starts_with("KUBE-SEP-")))
        .collect();
    let target = hit.target_chain()?;
    let i = jumps.iter().position(|r| r.jump_target() == Some(target))?;
    let p = match rule.probability() {
        Some(p) => format!("probability {}", trim_float(p)),
        None if jumps.len() == 1 => "the only endpoint".to_string(),
        None => "the rest".to_string(),
    };
    Some(format!("rule {} of {} ({p})", i + 1, jumps.len()))
}

/// A probability as people read it: at most 4 decimals, no trailing zeros (0.33333333349 →
/// 0.3333, 0.50000000000 → 0.5).
pub(crate) fn trim_float(p: f64) -> String {
    let s = format!("{p:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Words for a node's nat/filter rule hits on the request's first packet. A walk through the
/// chains is shown only when it concerned a Service or changed the packet; generic hops
/// (`kubernetes service portals` that matched nothing) would only hide what mattered.
fn node_steps(
    host: &str,
    obs: &[&Observation],
    objects: &Objects,
    masq_src: Option<SocketAddrV4>,
    stopped: &mut Option<String>,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let nat = objects.nat_rules.get(host);
    let mut service: Option<String> = None;
    for o in obs {
        let Some(hook) = o.hook() else { continue };
        if hook.starts_with("raw:") {
            continue;
        }
        let mut words: Vec<String> = Vec::new();
        let mut decisive: Vec<Step> = Vec::new();
        let mut relevant = false;
        for (k, h) in o.hits.iter().enumerate() {
            if h.kind != "rule" {
                continue;
            }
            // A jump into a chain that matched nothing there and returned is left out.
            let next_rule = o.hits[k + 1..].iter().find(|n| n.kind == "rule");
            if h.target_chain().is_some_and(|t| next_rule.is_none_or(|n| n.chain != t))
                && h.target_chain() != Some("KUBE-MARK-MASQ")
            {
                continue;
            }
            let comment = h.comment();
            if let Some(svc) = comment.as_deref().and_then(service_of) {
                service = Some(svc);
                relevant = true;
            }
            let specific =
                comment.as_deref().filter(|c| !c.starts_with("kubernetes ") && !c.starts_with("masquerade traffic"));
            match (h.table.as_str(), h.target_chain()) {
                ("nat", Some("KUBE-MARK-MASQ")) => {
                    let policy =
                        service.as_deref().and_then(|s| objects.traffic_policy.get(s.split(':').next().unwrap_or(s)));
                    let note = match policy {
                        Some(p) => format!("; masquerade mark (externalTrafficPolicy: {p})"),
                        None => "; masquerade mark (KUBE-MARK-MASQ 0x4000)".to_string(),
                    };
                    append(&mut words, &note);
                }
                ("nat", Some(t)) if t.starts_with("KUBE-SEP-") => {
                    append(&mut words, &format!(" {} → {t}", svc_choice(nat, h).unwrap_or_default()));
                }
                (_, Some(t)) => {
                    let c = specific.map(|c| format!(" \"{c}\"")).unwrap_or_default();
                    if words.is_empty() {
                        words.push(format!("{} {} → {t}{c}", h.table, h.chain));
                    } else {
                        words.push(format!("→ {t}{c}"));
                    }
                }
                ("nat", None) if h.verdict == "ACCEPT" => {
                    if let Some(Target::Dnat { to }) = h.target() {
                        relevant = true;
                        let ip = to.split(':').next().and_then(|i| i.parse::<Ipv4Addr>().ok());
                        let who = ip.and_then(|i| name_of(objects, i)).map(|n| format!(" ({n})")).unwrap_or_default();
                        decisive.push(Step {
                            kind: "dnat".into(),
                            text: format!("DNAT {to}{who}"),
                            rule: h.rule.clone(),
                            object: service.as_ref().map(|s| format!("EndpointSlice endpoint of Service {s}")),
                        });
                    } else if let Some(Target::Redirect { to_ports: port }) = h.target() {
                        relevant = true;
                        decisive.push(Step {
                            kind: "dnat".into(),
                            text: format!("REDIRECT to proxy port {port} (the userspace proxy's socket on this node)"),
                            rule: h.rule.clone(),
                            object: service.as_ref().map(|s| format!("Service {s}")),
                        });
                    } else if matches!(h.target(), Some(Target::Masquerade { .. })) {
                        relevant = true;
                        decisive.push(Step {
                            kind: "snat".into(),
                            text: format!(
                                "POSTROUTING MASQUERADE{}",
                                masq_src.map(|a| format!(" → source {a}")).unwrap_or_default()
                            ),
                            rule: h.rule.clone(),
                            object: service.as_ref().map(|s| format!("Service {s}")),
                        });
                    }
                }
                ("filter", None) if h.verdict == "DROP" => {
                    relevant = true;
                    let c = comment.clone().unwrap_or_else(|| "dropped".into());
                    let text = format!("{} {}: {c}", h.table, h.chain);
                    *stopped = Some(format!("{host}: {text}"));
                    decisive.push(Step {
                        kind: "stop".into(),
                        text,
                        rule: h.rule.clone(),
                        object: service.as_ref().map(|s| format!("Service {s}")),
                    });
                }
                _ => {}
            }
        }
        if relevant && !words.is_empty() {
            steps.push(Step {
                kind: "chain".into(),
                text: words.join("\n"),
                rule: None,
                object: service.as_ref().map(|s| format!("Service {s}")),
            });
        }
        steps.extend(decisive);
    }
    steps
}

/// Adds to the walk's current line (a chain's annotations stay on the chain's line).
fn append(words: &mut Vec<String>, more: &str) {
    match words.last_mut() {
        Some(last) => last.push_str(more),
        None => words.push(more.trim_start_matches("; ").trim().to_string()),
    }
}

/// `default/web:http loadbalancer IP` → `default/web:http`; `default/web -> 10.0.0.1:80` →
/// `default/web`.
fn service_of(comment: &str) -> Option<String> {
    let first = comment.split(' ').next()?;
    (first.contains('/') && !first.starts_with("kubernetes")).then(|| first.to_string())
}

/// Assembles the trace.
pub fn assemble(observed: &Observed, objects: &Objects, outcome: Outcome) -> Trace {
    let (src, dst) = (observed.src.expect("probe source"), observed.dst.expect("probe destination"));
    let flow = follow(observed);
    let mut stopped = None;
    let mut hops: Vec<Hop> = Vec::new();
    let mut pod = None;
    let mut pod_saw = None;
    for (k, leg) in flow.legs.iter().enumerate() {
        let t = &leg.tuples;
        let relay = flow.relays.get(k);
        for host in &leg.path {
            let obs: Vec<&Observation> =
                observed.packets[host].iter().filter(|o| o.is_syn() && t.forward.contains(&(o.src, o.dst))).collect();
            let mut steps = Vec::new();
            if host.starts_with("node-") {
                // The source this host gave the flow, if it masqueraded it.
                let masq_src = observed.conntrack.get(host).and_then(|cts| {
                    cts.iter()
                        .find(|e| t.forward.contains(&e.orig) && e.reply.1.ip() != e.orig.0.ip())
                        .map(|e| e.reply.1)
                });
                steps.extend(node_steps(host, &obs, objects, masq_src, &mut stopped));
            }
            let next = leg.path.iter().skip_while(|h| *h != host).nth(1);
            let stopped_here = steps.iter().any(|s| s.kind == "stop");
            match (host.as_str(), objects.lb.as_ref(), next) {
                // The gateway's choice among nodes is observed: the node that received the packet.
                ("gateway", Some((mode, nodes)), Some(next)) if k == 0 => {
                    let dst = obs.last().map(|o| o.dst.ip().to_string()).unwrap_or_default();
                    steps.push(Step {
                        kind: "lb".into(),
                        text: format!("route {dst} → {next} ({mode}{})", also_in_rotation(nodes, next)),
                        rule: None,
                        object: None,
                    });
                }
                _ => {
                    let route = objects.routes.get(&(k, host.clone()));
                    if let Some(r) = route.filter(|_| !stopped_here) {
                        steps.push(step("route", route_text(objects, r)));
                    }
                }
            }
            // Delivered to a pod on this host's bridge? Seen as the packet's output interface
            // where a hook after routing traced it, else told by the route lookup.
            let bridged = obs
                .iter()
                .rev()
                .find_map(|o| o.oif.clone().filter(|i| i == "cni0" || i.starts_with("veth")).map(|i| (i, o)))
                .or_else(|| {
                    let route = objects.routes.get(&(k, host.clone()))?;
                    let dev = route.lines().next()?.split(" dev ").nth(1)?.split(' ').next()?.to_string();
                    let last = obs.last()?;
                    (dev == "cni0" && objects.pods.contains_key(last.dst.ip())).then_some((dev, last))
                });
            if let Some((dev, o)) = bridged {
                let who = objects.pods.get(o.dst.ip()).map(|(p, _)| p.clone());
                // The source the pod sees: this host's conntrack entry for the packet as delivered,
                // or the packet's own source when this host did not translate it.
                let seen = observed.conntrack.get(host).and_then(|cts| {
                    cts.iter().find(|e| e.reply.0 == o.dst && t.forward.contains(&e.orig)).map(|e| e.reply.1)
                });
                steps.push(step(
                    "deliver",
                    format!("bridge {dev} → pod {} ({})", who.clone().unwrap_or_else(|| "?".into()), o.dst),
                ));
                pod = who;
                pod_saw = seen.or(Some(o.src)).map(|s| s.to_string());
            }
            // A relay's own connection starts on the host that accepted the previous one.
            match hops.last_mut() {
                Some(last) if k > 0 && last.host == *host && leg.path.first() == Some(host) => last.steps.extend(steps),
                _ => hops.push(Hop { host: host.clone(), steps }),
            }
        }
        if let (Some(relay), Some(last)) = (relay, hops.last_mut()) {
            last.steps.push(relay_step(relay, objects, outcome.answered));
        }
    }
    let t = &flow.legs[0].tuples;
    let reply = reply_path(observed, t);
    // Conntrack of every host that translated the flow, leg by leg.
    let mut conntrack = Vec::new();
    for leg in &flow.legs {
        for host in &leg.path {
            for e in observed.conntrack.get(host).into_iter().flatten() {
                if leg.tuples.forward.contains(&e.orig) && e.is_natted() {
                    let line = format!("{host}: {}→{} ⇄ {}→{}", e.orig.0, e.orig.1, e.reply.0, e.reply.1);
                    if !conntrack.contains(&line) {
                        conntrack.push(line);
                    }
                }
            }
        }
    }
    if !outcome.answered && stopped.is_none() {
        let last_leg = flow.legs.last().expect("one leg at least");
        stopped = Some(explain_failure(observed, t, &last_leg.path, &reply, objects));
    }
    Trace {
        from: observed.from.clone(),
        src: src.to_string(),
        dst: dst.to_string(),
        hops,
        pod,
        pod_saw,
        outcome,
        stopped,
        conntrack,
        reply_path: reply,
    }
}

fn also_in_rotation(nodes: &[String], chosen: &str) -> String {
    let others: Vec<&str> = nodes.iter().filter(|n| *n != chosen).map(String::as_str).collect();
    if others.is_empty() {
        String::new()
    } else {
        format!("; {} also in rotation", others.join(", "))
    }
}

/// What a relay did: who accepted the connection, and the connections it opened for it.
fn relay_step(relay: &Relay, objects: &Objects, answered: bool) -> Step {
    let (who, object) = if relay.host == "gateway" {
        let mode = objects.lb.as_ref().map(|(m, _)| m.clone()).unwrap_or_else(|| "load balancer".into());
        (format!("lb-sim ({mode})"), None)
    } else {
        // The userspace proxy's port leads back to its Service through the REDIRECT rule.
        let port = relay.accepted_on.port();
        let service = objects.nat_rules.get(&relay.host).and_then(|save| {
            saved_rules(save)
                .into_iter()
                .find(|r| match &r.target {
                    Some(Target::Redirect { to_ports }) => to_ports.parse() == Ok(port),
                    Some(Target::Dnat { to }) => to.parse::<SocketAddrV4>().is_ok_and(|a| a.port() == port),
                    _ => false,
                })
                .and_then(|r| r.comment_text().map(str::to_string))
        });
        let text = match &service {
            Some(s) => format!("node-agent's userspace proxy for {s}"),
            None => "node-agent's userspace proxy".to_string(),
        };
        (text, service.as_deref().and_then(service_of).map(|s| format!("Service {s}")))
    };
    let mut lines = vec![format!("{who} accepted on {}", relay.accepted_on)];
    let many = relay.attempts.len() > 1;
    for (i, (leg, result)) in relay.attempts.iter().enumerate() {
        let to = leg.start.1;
        let name = name_of(objects, *to.ip()).map(|n| format!(" ({n})")).unwrap_or_default();
        let nth = if many { format!("attempt {}", i + 1) } else { "connection".to_string() };
        // The connection the answer came back on was made, whatever conntrack kept of it.
        let result = if answered && i + 1 == relay.attempts.len() { "connected" } else { result.as_str() };
        let mut line = format!("{nth}: {} → {to}{name} {result}", leg.start.0);
        if relay.host == "gateway" && i + 1 == relay.attempts.len() {
            if let (Some((_, nodes)), Some(node)) = (&objects.lb, objects.nodes.get(to.ip())) {
                line += &also_in_rotation(nodes, node);
            }
        }
        lines.push(line);
    }
    // The L7 load balancer's routing decision: the rule that leads to the NodePort it used.
    let mut object = object;
    if let Some((leg, _)) = relay.attempts.last().filter(|_| relay.host == "gateway") {
        let tag = format!("(nodePort {})", leg.start.1.port());
        if let Some(rule) = objects.lb_routes.iter().find(|r| r.contains(&tag)) {
            lines.insert(1, format!("Ingress rule {rule}"));
            object = rule.split("→ ").nth(1).and_then(|s| s.split(' ').next()).map(|s| format!("Service {s}"));
        }
    }
    Step { kind: "relay".into(), text: lines.join("\n"), rule: None, object }
}

/// Why a request that got no answer stopped, from where its packets were last seen.
fn explain_failure(observed: &Observed, t: &Tuples, path: &[String], reply: &[String], objects: &Objects) -> String {
    let Some(last) = path.last() else {
        return format!("the request never left {}", observed.from);
    };
    // A reply that reached the sender from an address it did not send to is dropped there.
    if reply.last() == Some(&observed.from) {
        let expected = (observed.dst.expect("dst"), observed.src.expect("src"));
        if let Some(o) = observed.packets[&observed.from]
            .iter()
            .find(|o| o.is_syn_ack() && t.backward.contains(&(o.src, o.dst)) && (o.src, o.dst) != expected)
        {
            let who = name_of(objects, *o.src.ip()).map(|n| format!(" ({n})")).unwrap_or_default();
            return format!(
                "the reply reached {} from {}{who} instead of {}: it belongs to no connection there and is dropped (no masquerade on the node that forwarded the request; reply path: {})",
                observed.from,
                o.src,
                expected.0,
                reply.join(" → ")
            );
        }
    }
    if reply.is_empty() {
        return format!("the request was last seen on {last}; no reply came back");
    }
    format!("the reply was last seen on {} (reply path: {})", reply.last().expect("non-empty"), reply.join(" → "))
}

#[cfg(test)]
mod tests {
    use super::super::parse::{parse_conntrack, parse_monitor};
    use super::*;

    const CLIENT: &str = "PACKET: 2 a1 OUT=eth0 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=64 ID=7 DF SPORT=40000 DPORT=80 SYN \n TRACE: 2 a1 raw:OUTPUT:policy:ACCEPT \n";
    const GATEWAY: &str = "PACKET: 2 b1 IN=eth1 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=64 ID=7 DF SPORT=40000 DPORT=80 SYN \n TRACE: 2 b1 raw:PREROUTING:policy:ACCEPT \n";
    // node-3 takes it from the gateway, DNATs to a pod on node-1 and masquerades.
    const NODE3: &str = r#"PACKET: 2 c1 IN=eth0 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=63 ID=7 DF SPORT=40000 DPORT=80 SYN 
 TRACE: 2 c1 nat:PREROUTING:rule:0x1:JUMP:KUBE-SERVICES  -4 -t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
 TRACE: 2 c1 nat:KUBE-SERVICES:rule:0x2:JUMP:KUBE-EXT-AAA  -4 -t nat -A KUBE-SERVICES -d 198.51.100.1/32 -p tcp -m comment --comment "default/web:http loadbalancer IP" -m tcp --dport 80 -j KUBE-EXT-AAA
 TRACE: 2 c1 nat:KUBE-EXT-AAA:rule:0x3:JUMP:KUBE-MARK-MASQ  -4 -t nat -A KUBE-EXT-AAA -m comment --comment "masquerade traffic for default/web:http external destinations" -j KUBE-MARK-MASQ
 TRACE: 2 c1 nat:KUBE-MARK-MASQ:rule:0x4:CONTINUE  -4 -t nat -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
 TRACE: 2 c1 nat:KUBE-EXT-AAA:rule:0x5:JUMP:KUBE-SVC-AAA  -4 -t nat -A KUBE-EXT-AAA -j KUBE-SVC-AAA
 TRACE: 2 c1 nat:KUBE-SVC-AAA:rule:0x6:JUMP:KUBE-SEP-BBB  -4 -t nat -A KUBE-SVC-AAA -m comment --comment "default/web:http -> 10.244.1.5:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BBB
 TRACE: 2 c1 nat:KUBE-SEP-BBB:rule:0x7:ACCEPT  -4 -t nat -A KUBE-SEP-BBB -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.1.5:8080
PACKET: 2 c1 IN=eth0 OUT=eth0 SRC=203.0.113.10 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=62 ID=7 DF SPORT=40000 DPORT=8080 SYN MARK=0x4000 
 TRACE: 2 c1 filter:FORWARD:rule:0x8:JUMP:KUBE-PROXY-FIREWALL  -4 -t filter -A FORWARD -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
 TRACE: 2 c1 filter:FORWARD:rule:0x9:JUMP:KUBE-FORWARD  -4 -t filter -A FORWARD -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
 TRACE: 2 c1 filter:KUBE-FORWARD:rule:0xa:ACCEPT  -4 -t filter -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
PACKET: 2 c1 IN=eth0 OUT=eth0 SRC=203.0.113.10 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=62 ID=7 DF SPORT=40000 DPORT=8080 SYN MARK=0x4000 
 TRACE: 2 c1 nat:POSTROUTING:rule:0xb:JUMP:KUBE-POSTROUTING  -4 -t nat -A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
 TRACE: 2 c1 nat:KUBE-POSTROUTING:rule:0xc:ACCEPT  -4 -t nat -A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
PACKET: 2 c2 IN=eth0 SRC=10.0.0.1 DST=10.0.0.2 LEN=60 TOS=0x0 TTL=64 ID=9 DF SPORT=1 DPORT=2 SYN 
"#;
    const NODE1: &str = "PACKET: 2 d1 IN=eth0 OUT=cni0 SRC=192.168.56.13 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=61 ID=7 DF SPORT=5555 DPORT=8080 SYN \n TRACE: 2 d1 filter:FORWARD:policy:ACCEPT \n";
    const NAT3: &str = "-A KUBE-SVC-AAA -m comment --comment \"default/web:http -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-BBB\n-A KUBE-SVC-AAA -m comment --comment \"default/web:http -> 10.244.2.6:8080\" -j KUBE-SEP-CCC\n";

    fn observed(client_extra: &str) -> Observed {
        let mut o = Observed {
            from: "client".into(),
            src: Some("203.0.113.10:40000".parse().unwrap()),
            dst: Some("198.51.100.1:80".parse().unwrap()),
            ..Default::default()
        };
        for (h, text) in [
            ("client", format!("{CLIENT}{client_extra}")),
            ("gateway", GATEWAY.into()),
            ("node-3", NODE3.into()),
            ("node-1", NODE1.into()),
            ("node-2", String::new()),
        ] {
            o.packets.insert(h.into(), parse_monitor(&text));
        }
        o.conntrack.insert("node-3".into(), parse_conntrack("tcp 6 119 TIME_WAIT src=203.0.113.10 dst=198.51.100.1 sport=40000 dport=80 src=10.244.1.5 dst=192.168.56.13 sport=8080 dport=5555 [ASSURED] mark=0 use=1\n"));
        o.conntrack.insert("node-1".into(), parse_conntrack("tcp 6 119 TIME_WAIT src=192.168.56.13 dst=10.244.1.5 sport=5555 dport=8080 src=10.244.1.5 dst=192.168.56.13 sport=8080 dport=5555 [ASSURED] mark=0 use=1\n"));
        o
    }

    fn objects() -> Objects {
        let mut o = Objects::default();
        o.pods.insert("10.244.1.5".parse().unwrap(), ("default/web-1".into(), "node-1".into()));
        for i in 1..=3u8 {
            o.nodes.insert(Ipv4Addr::new(192, 168, 56, 10 + i), format!("node-{i}"));
        }
        o.traffic_policy.insert("default/web".into(), "Cluster".into());
        o.nat_rules.insert("node-3".into(), NAT3.into());
        o.routes.insert(
            (0, "client".into()),
            "198.51.100.1 via 203.0.113.1 dev eth0 src 203.0.113.10 uid 0\n    cache\n".into(),
        );
        o.routes.insert((0, "node-3".into()), "10.244.1.5 from 203.0.113.10 via 192.168.56.11 dev eth0\n".into());
        o.routes.insert((0, "node-1".into()), "10.244.1.5 from 192.168.56.13 dev cni0\n".into());
        o.lb = Some(("passthrough LB of default/web".into(), vec!["node-1".into(), "node-2".into(), "node-3".into()]));
        o
    }

    fn ok() -> Outcome {
        Outcome { answered: true, status: Some(200), millis: 1.5, error: None }
    }

    #[test]
    fn the_flow_is_followed_across_nat_and_hops_come_in_ttl_order() {
        let o = observed("");
        let t = tuples((o.src.unwrap(), o.dst.unwrap()), &o.conntrack);
        let fwd = |a: &str, b: &str| (a.parse().unwrap(), b.parse().unwrap());
        assert!(t.forward.contains(&fwd("203.0.113.10:40000", "10.244.1.5:8080")), "DNAT done, SNAT not yet");
        assert!(t.forward.contains(&fwd("192.168.56.13:5555", "10.244.1.5:8080")), "after masquerade");
        assert!(t.backward.contains(&fwd("10.244.1.5:8080", "192.168.56.13:5555")));
        assert_eq!(request_path(&o, &t), ["client", "gateway", "node-3", "node-1"]);
        let flow = follow(&o);
        assert_eq!((flow.legs.len(), flow.relays.len()), (1, 0), "no relay on this path");
        let q = route_queries(&o, &flow);
        assert_eq!(q[2].1.join(" "), "10.244.1.5 from 203.0.113.10 iif eth0 ipproto tcp sport 40000 dport 8080");
        assert_eq!(q[0].1.join(" "), "198.51.100.1 ipproto tcp sport 40000 dport 80");
    }

    #[test]
    fn each_hop_says_what_decided_it_and_which_object_caused_it() {
        let trace = assemble(&observed(""), &objects(), ok());
        let texts: Vec<Vec<String>> =
            trace.hops.iter().map(|h| h.steps.iter().map(|s| s.text.clone()).collect()).collect();
        assert_eq!(
            trace.hops.iter().map(|h| h.host.as_str()).collect::<Vec<_>>(),
            ["client", "gateway", "node-3", "node-1"]
        );
        assert_eq!(texts[0], ["route 198.51.100.1 via 203.0.113.1 dev eth0"]);
        assert_eq!(
            texts[1],
            ["route 198.51.100.1 → node-3 (passthrough LB of default/web; node-1, node-2 also in rotation)"]
        );
        assert_eq!(
            texts[2],
            [
                "nat PREROUTING → KUBE-SERVICES\n→ KUBE-EXT-AAA \"default/web:http loadbalancer IP\"; masquerade mark (externalTrafficPolicy: Cluster)\n→ KUBE-SVC-AAA rule 1 of 2 (probability 0.5) → KUBE-SEP-BBB",
                "DNAT 10.244.1.5:8080 (pod default/web-1)",
                "nat POSTROUTING → KUBE-POSTROUTING",
                "POSTROUTING MASQUERADE → source 192.168.56.13:5555",
                "route 10.244.1.5 via 192.168.56.11 (node-1) dev eth0",
            ]
        );
        assert_eq!(
            texts[3],
            ["route 10.244.1.5 dev cni0 (directly connected)", "bridge cni0 → pod default/web-1 (10.244.1.5:8080)"]
        );
        let dnat = &trace.hops[2].steps[1];
        assert_eq!(dnat.object.as_deref(), Some("EndpointSlice endpoint of Service default/web:http"));
        assert!(dnat.rule.as_deref().is_some_and(|r| r.ends_with("-j DNAT --to-destination 10.244.1.5:8080")));
        assert_eq!(trace.pod.as_deref(), Some("default/web-1"));
        assert_eq!(trace.pod_saw.as_deref(), Some("192.168.56.13:5555"));
        assert_eq!(
            trace.conntrack,
            ["node-3: 203.0.113.10:40000→198.51.100.1:80 ⇄ 10.244.1.5:8080→192.168.56.13:5555"]
        );
        assert_eq!(trace.stopped, None);
    }

    #[test]
    fn a_reply_from_the_wrong_address_is_where_an_unmasqueraded_request_stops() {
        // node-1 got the request unmasqueraded and answered the client straight from the pod.
        let mut o = observed("PACKET: 2 e1 IN=eth0 SRC=10.244.1.5 DST=203.0.113.10 LEN=60 TOS=0x0 TTL=62 ID=0 DF SPORT=8080 DPORT=40000 SYN ACK \n");
        o.conntrack.insert("node-3".into(), parse_conntrack("tcp 6 119 SYN_RECV src=203.0.113.10 dst=198.51.100.1 sport=40000 dport=80 src=10.244.1.5 dst=203.0.113.10 sport=8080 dport=40000 mark=0 use=1\n"));
        o.conntrack.insert("node-1".into(), parse_conntrack("tcp 6 119 SYN_RECV src=203.0.113.10 dst=10.244.1.5 sport=40000 dport=8080 src=10.244.1.5 dst=203.0.113.10 sport=8080 dport=40000 mark=0 use=1\n"));
        o.packets.insert("node-1".into(), parse_monitor("PACKET: 2 d1 IN=eth0 OUT=cni0 SRC=203.0.113.10 DST=10.244.1.5 LEN=60 TOS=0xb4 TTL=61 ID=7 DF SPORT=40000 DPORT=8080 SYN \nPACKET: 2 d2 IN=cni0 SRC=10.244.1.5 DST=203.0.113.10 LEN=60 TOS=0x0 TTL=64 ID=0 DF SPORT=8080 DPORT=40000 SYN ACK \n"));
        o.packets.insert("gateway".into(), parse_monitor(&format!("{GATEWAY}PACKET: 2 b2 IN=eth0 SRC=10.244.1.5 DST=203.0.113.10 LEN=60 TOS=0x0 TTL=63 ID=0 DF SPORT=8080 DPORT=40000 SYN ACK \n")));
        let out = Outcome { answered: false, status: None, millis: 3000.0, error: Some("timed out".into()) };
        let trace = assemble(&o, &objects(), out);
        assert_eq!(trace.reply_path, ["node-1", "gateway", "client"]);
        let stopped = trace.stopped.unwrap();
        assert!(
            stopped.starts_with(
                "the reply reached client from 10.244.1.5:8080 (pod default/web-1) instead of 198.51.100.1"
            ),
            "{stopped}"
        );
    }

    #[test]
    fn relays_are_followed_by_the_probes_dscp_with_every_attempt() {
        // lb-sim on the gateway proxies to node-2's NodePort; node-2's userspace proxy tries a
        // dead pod (reset), then a pod on node-1.
        let mut o = Observed {
            from: "client".into(),
            src: Some("203.0.113.10:40000".parse().unwrap()),
            dst: Some("198.51.100.1:80".parse().unwrap()),
            ..Default::default()
        };
        let gateway = format!("{GATEWAY}PACKET: 2 b2 OUT=eth0 SRC=192.168.56.2 DST=192.168.56.12 LEN=60 TOS=0xb4 TTL=64 ID=8 DF SPORT=5000 DPORT=30097 SYN \n");
        let node2 = r#"PACKET: 2 c1 IN=eth0 SRC=192.168.56.2 DST=192.168.56.12 LEN=60 TOS=0xb4 TTL=64 ID=8 DF SPORT=5000 DPORT=30097 SYN 
 TRACE: 2 c1 nat:PREROUTING:rule:0x1:JUMP:KUBE-NODEPORT-CONTAINER  -4 -t nat -A PREROUTING -m comment --comment "handle service NodePorts; NOTE: this must be the last rule in the chain" -j KUBE-NODEPORT-CONTAINER
 TRACE: 2 c1 nat:KUBE-NODEPORT-CONTAINER:rule:0x2:ACCEPT  -4 -t nat -A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment "default/cloud-nginx:http-server" -m tcp --dport 30097 -j REDIRECT --to-ports 37077
PACKET: 2 c2 OUT=cni0 SRC=10.244.2.1 DST=10.244.2.2 LEN=60 TOS=0xb4 TTL=64 ID=9 DF SPORT=6000 DPORT=80 SYN 
PACKET: 2 c3 IN=cni0 SRC=10.244.2.2 DST=10.244.2.1 LEN=40 TOS=0xb4 TTL=64 ID=0 DF SPORT=80 DPORT=6000 ACK RST 
PACKET: 2 c4 OUT=eth0 SRC=192.168.56.12 DST=10.244.1.2 LEN=60 TOS=0xb4 TTL=64 ID=10 DF SPORT=6001 DPORT=80 SYN 
"#;
        let node1 = "PACKET: 2 d1 IN=eth0 OUT=cni0 SRC=192.168.56.12 DST=10.244.1.2 LEN=60 TOS=0xb4 TTL=63 ID=10 DF SPORT=6001 DPORT=80 SYN \n";
        for (h, text) in [("client", CLIENT), ("gateway", &gateway), ("node-2", node2), ("node-1", node1)] {
            o.packets.insert(h.into(), parse_monitor(text));
        }
        o.conntrack.insert("node-2".into(), parse_conntrack("tcp 6 119 TIME_WAIT src=192.168.56.2 dst=192.168.56.12 sport=5000 dport=30097 src=192.168.56.12 dst=192.168.56.2 sport=37077 dport=5000 [ASSURED] mark=0 use=1\ntcp 6 119 TIME_WAIT src=192.168.56.12 dst=10.244.1.2 sport=6001 dport=80 src=10.244.1.2 dst=192.168.56.12 sport=80 dport=6001 [ASSURED] mark=0 use=1\n"));
        let flow = follow(&o);
        assert_eq!(flow.legs.len(), 3);
        assert_eq!(
            flow.legs.iter().map(|l| l.path.clone()).collect::<Vec<_>>(),
            [
                vec!["client".to_string(), "gateway".into()],
                vec!["gateway".into(), "node-2".into()],
                vec!["node-2".into(), "node-1".into()],
            ]
        );
        let results: Vec<&str> = flow.relays[1].attempts.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(results, ["refused (reset from 10.244.2.2:80)", "connected"]);
        assert_eq!(flow.relays[1].accepted_on, "192.168.56.12:37077".parse().unwrap());
        let q = route_queries(&o, &flow);
        let keys: Vec<(usize, &str)> = q.iter().map(|((k, h), _)| (*k, h.as_str())).collect();
        assert_eq!(
            keys,
            [(0, "client"), (1, "gateway"), (2, "node-2"), (2, "node-1")],
            "no lookup where a relay took over"
        );

        let mut objects = objects();
        objects.pods.insert("10.244.2.2".parse().unwrap(), ("default/cloud-nginx-dead".into(), "node-2".into()));
        objects.pods.insert("10.244.1.2".parse().unwrap(), ("default/cloud-nginx-1".into(), "node-1".into()));
        objects.nat_rules.insert("node-2".into(), "-A KUBE-NODEPORT-CONTAINER -p tcp -m comment --comment \"default/cloud-nginx:http-server\" -m tcp --dport 30097 -j REDIRECT --to-ports 37077\n".into());
        objects.lb = Some(("nodeport LB of default/cloud-nginx".into(), vec!["node-1".into(), "node-2".into()]));
        objects.routes.clear();
        let trace = assemble(&o, &objects, ok());
        assert_eq!(
            trace.hops.iter().map(|h| h.host.as_str()).collect::<Vec<_>>(),
            ["client", "gateway", "node-2", "node-1"]
        );
        let relay = |h: usize| trace.hops[h].steps.iter().find(|s| s.kind == "relay").unwrap().text.clone();
        assert_eq!(
            relay(1),
            "lb-sim (nodeport LB of default/cloud-nginx) accepted on 198.51.100.1:80\nconnection: 192.168.56.2:5000 → 192.168.56.12:30097 (node-2) connected; node-1 also in rotation"
        );
        assert_eq!(
            relay(2),
            "node-agent's userspace proxy for default/cloud-nginx:http-server accepted on 192.168.56.12:37077\n\
             attempt 1: 10.244.2.1:6000 → 10.244.2.2:80 (pod default/cloud-nginx-dead) refused (reset from 10.244.2.2:80)\n\
             attempt 2: 192.168.56.12:6001 → 10.244.1.2:80 (pod default/cloud-nginx-1) connected"
        );
        let redirect = trace.hops[2].steps.iter().find(|s| s.kind == "dnat").unwrap();
        assert_eq!(redirect.object.as_deref(), Some("Service default/cloud-nginx:http-server"));
        assert!(redirect.text.starts_with("REDIRECT to proxy port 37077"));
        assert_eq!(trace.pod.as_deref(), Some("default/cloud-nginx-1"));
        assert_eq!(trace.pod_saw.as_deref(), Some("192.168.56.12:6001"));
    }

    #[test]
    fn the_svg_draws_every_hop_in_order_with_the_path_and_the_decisive_rules() {
        let trace = assemble(&observed(""), &objects(), ok());
        let svg = super::super::render::svg(&trace);
        let doc = roxmltree::Document::parse(&svg).expect("well-formed XML");
        let root = doc.root_element();
        assert_eq!(root.tag_name().name(), "svg");
        assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"));
        let boxes: Vec<String> = root
            .children()
            .filter(|n| n.has_tag_name("g"))
            .map(|g| {
                g.descendants().find(|n| n.attribute("class") == Some("head")).unwrap().text().unwrap().to_string()
            })
            .collect();
        assert_eq!(boxes, ["1 client", "2 gateway", "3 node-3", "4 node-1", "5 pod"]);
        let arrows = root.children().filter(|n| n.has_tag_name("line") && n.attribute("marker-end").is_some()).count();
        assert_eq!(arrows, 4, "the path: one arrow between each pair of hops");
        let texts: Vec<(&str, &str)> = root
            .descendants()
            .filter(|n| n.has_tag_name("text"))
            .map(|n| (n.attribute("class").unwrap_or(""), n.text().unwrap_or("")))
            .collect();
        assert!(texts.contains(&("decisive", "DNAT 10.244.1.5:8080 (pod default/web-1)")), "{texts:?}");
        assert!(texts.iter().any(|(c, t)| *c == "rule" && t.contains("--to-destination 10.244.1.5:8080")), "{texts:?}");
        assert!(texts.contains(&("ok", "answered 200 in 1.5 ms")));
        assert!(texts.iter().any(|(_, t)| t.starts_with("conntrack on node-3: ")));
        // Every line fits its box.
        assert!(texts.iter().filter(|(c, _)| *c != "title" && *c != "step").all(|(_, t)| t.chars().count() <= 42));
    }
}
