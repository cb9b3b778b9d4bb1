//! A node's rule hits in words (pure): which chain walk mattered, which endpoint a Service chain
//! chose and with what probability, what NAT and filtering did, and the object behind each.

use std::net::{IpAddr, SocketAddr};

use podpath_ruleset::{Match, RecentOp, Rule, Target};

use super::model::{name_of, Objects, Step};
use super::nft_steps;
use super::parse::{Observation, RuleHit};

/// The rules of `iptables-save` output (its `-A` lines; the workspace's one parser).
pub(crate) fn saved_rules(save: &str) -> Vec<Rule> {
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
pub(crate) fn node_steps(
    host: &str,
    obs: &[&Observation],
    objects: &Objects,
    masq_src: Option<SocketAddr>,
    stopped: &mut Option<String>,
) -> Vec<Step> {
    let mut steps = Vec::new();
    let nat = objects.nat_rules.get(host);
    let mut service: Option<String> = None;
    let listing = objects.nft_tables.get(host).map(|t| podpath_ruleset::nft::Listing::parse(t));
    for (i, o) in obs.iter().enumerate() {
        let Some(hook) = o.hook() else { continue };
        if hook.starts_with("raw:") || hook.starts_with(&format!("{}:", super::run::NFT_TRACE_TABLE)) {
            continue;
        }
        if nft_steps::is_kube_proxy(o) {
            // The packet's destination at the next hook: what this one's DNAT made of it.
            let after = obs[i + 1..].iter().map(|n| n.dst).find(|d| *d != o.dst);
            steps.extend(nft_steps::observation_steps(
                host,
                o,
                after,
                listing.as_ref(),
                objects,
                masq_src,
                stopped,
                &mut service,
            ));
            continue;
        }
        let mut words: Vec<String> = Vec::new();
        let mut decisive: Vec<Step> = Vec::new();
        let mut relevant = false;
        let mut policy_of: Option<(String, String)> = None;
        for (k, h) in o.hits.iter().enumerate() {
            if h.kind != "rule" {
                continue;
            }
            if let Some(target) = policy_target(h) {
                policy_of = Some(target);
                continue;
            }
            if let Some((dir, pod)) = policy_of.as_ref().filter(|_| is_policy_chain(h)) {
                if let Some(step) = policy_step(host, o, h, dir, pod, objects, stopped) {
                    relevant = true;
                    decisive.push(step);
                }
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
                        let ip = dnat_ip(to);
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
        push_walk(&mut steps, relevant, &words, &service, decisive);
    }
    steps
}

/// Whether a hit is in a pod's NetworkPolicy chain (the iptables form's `PODPATH-ING-…` /
/// `PODPATH-EGR-…`, the nftables form's `ingress-NS/NAME` / `egress-NS/NAME`).
fn is_policy_chain(h: &RuleHit) -> bool {
    (h.table == "filter" && (h.chain.starts_with("PODPATH-ING-") || h.chain.starts_with("PODPATH-EGR-")))
        || (h.table == POLICY_TABLE && (h.chain.starts_with("ingress-") || h.chain.starts_with("egress-")))
}

/// The node agent's nftables table of NetworkPolicy rules.
const POLICY_TABLE: &str = "podpath-policy";

/// The direction (`ingress`, `egress`) and pod (`NS/NAME`) of a jump into a pod's policy chain.
fn policy_target(h: &RuleHit) -> Option<(String, String)> {
    let t = h.target_chain()?;
    if h.table == POLICY_TABLE {
        let (dir, pod) = t.split_once('-')?;
        return matches!(dir, "ingress" | "egress").then(|| (dir.to_string(), pod.to_string()));
    }
    if h.table == "filter" && (t.starts_with("PODPATH-ING-") || t.starts_with("PODPATH-EGR-")) {
        // The jump's comment: `Ingress of pod x/a`.
        let c = h.comment()?;
        let (dir, pod) = c.split_once(" of pod ")?;
        return Some((dir.to_ascii_lowercase(), pod.to_string()));
    }
    None
}

/// A rule's comment in either form (`-m comment --comment …`, nftables' `comment "…"`).
fn any_comment(h: &RuleHit) -> Option<String> {
    h.comment().or_else(|| {
        let rule = h.rule.as_deref()?;
        let start = rule.find("comment \"")? + "comment \"".len();
        Some(rule[start..].split('"').next()?.to_string())
    })
}

/// The verdict of a policy chain as a step: the rule that allowed the packet (its comment names
/// the policy, rule, peer and port), or the drop with the pod, the other end and the policies
/// that isolate the pod.
fn policy_step(
    host: &str,
    o: &Observation,
    h: &RuleHit,
    dir: &str,
    pod: &str,
    objects: &Objects,
    stopped: &mut Option<String>,
) -> Option<Step> {
    let comment = any_comment(h).unwrap_or_default();
    let (other, word) = if dir == "ingress" { (o.src, "from") } else { (o.dst, "to") };
    let other = match name_of(objects, other.ip()) {
        Some(n) => format!("{n} ({})", other.ip()),
        None => other.ip().to_string(),
    };
    match h.verdict.as_str() {
        "ACCEPT" | "RETURN" => {
            let policy = comment.split(' ').next().unwrap_or_default().to_string();
            Some(Step {
                kind: "policy".into(),
                text: if dir == "ingress" {
                    format!("NetworkPolicy allows ingress from {other} to pod {pod}: {comment}")
                } else {
                    format!("NetworkPolicy allows egress of pod {pod} to {other}: {comment}")
                },
                rule: h.rule.clone(),
                object: Some(format!("NetworkPolicy {policy}")),
            })
        }
        "DROP" => {
            let isolated = comment.split_once("(isolated by ").map(|(_, r)| r.trim_end_matches(')')).unwrap_or("?");
            let text =
                format!("dropped: no policy selecting pod {pod} allows {dir} {word} {other} (isolated by {isolated})");
            *stopped = Some(format!("{host}: {text}"));
            Some(Step {
                kind: "stop".into(),
                text,
                rule: h.rule.clone(),
                object: Some(format!("NetworkPolicy {isolated}")),
            })
        }
        _ => None,
    }
}

/// A hook's steps: the walk through its chains (when it concerned a Service or changed the
/// packet), then the rules that decided.
pub(crate) fn push_walk(
    steps: &mut Vec<Step>,
    relevant: bool,
    words: &[String],
    service: &Option<String>,
    decisive: Vec<Step>,
) {
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

/// Adds to the walk's current line (a chain's annotations stay on the chain's line).
fn append(words: &mut Vec<String>, more: &str) {
    match words.last_mut() {
        Some(last) => last.push_str(more),
        None => words.push(more.trim_start_matches("; ").trim().to_string()),
    }
}

/// `default/web:http loadbalancer IP` → `default/web:http`; `default/web -> 10.0.0.1:80` →
/// `default/web`.
pub(crate) fn service_of(comment: &str) -> Option<String> {
    let first = comment.split(' ').next()?;
    (first.contains('/') && !first.starts_with("kubernetes")).then(|| first.to_string())
}

/// The address of a DNAT target: `10.244.1.5:8080`, `[fd00:10:244:1::5]:8080`, or an address
/// alone.
fn dnat_ip(to: &str) -> Option<IpAddr> {
    to.parse::<SocketAddr>().map(|a| a.ip()).ok().or_else(|| to.trim_matches(['[', ']']).parse().ok())
}
