//! What NetworkPolicies decide about one connection, and why: the semantics of
//! networking.k8s.io/v1 as the API documents them and the upstream `netpol` e2e suite tests
//! them, as a pure function. A pod is isolated for a direction when a policy of its namespace
//! selects it and lists that direction in `policyTypes`; an isolated pod takes only what some
//! rule of those policies allows (the union); a connection needs the source's egress and the
//! destination's ingress. Used to explain verdicts (`podpath trace`, `explain`) and to predict
//! probe matrices; the node agent's rules are rendered elsewhere.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::apps::selector_matches;

/// A pod as policies see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Its namespace's labels (namespaceSelector peers match these).
    pub namespace_labels: BTreeMap<String, String>,
    pub ip: IpAddr,
    /// Named container ports: name, port, protocol (`TCP`…).
    pub named_ports: Vec<(String, u16, String)>,
}

/// One end of a connection: a pod, or an address outside the pod network (a node, the
/// internet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End<'a> {
    Pod(&'a Pod),
    Address(IpAddr),
}

impl End<'_> {
    pub fn ip(&self) -> IpAddr {
        match self {
            End::Pod(p) => p.ip,
            End::Address(a) => *a,
        }
    }
    fn describe(&self) -> String {
        match self {
            End::Pod(p) => format!("pod {}/{}", p.namespace, p.name),
            End::Address(a) => a.to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    Ingress,
    Egress,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Ingress => "Ingress",
            Direction::Egress => "Egress",
        }
    }
}

/// The rule that let a connection through: `policy` (namespace/name), its `direction` rule
/// `rule`, the peer and port entries that matched (None: the rule has none, so all match).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub policy: String,
    pub direction: Direction,
    pub rule: usize,
    pub peer: Option<usize>,
    pub port: Option<usize>,
}

/// One direction's verdict for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// No policy selects the pod for this direction: everything is allowed.
    NotIsolated,
    /// Allowed by these rules (every one that matches).
    Allowed(Vec<Allowed>),
    /// Isolated by these policies, and no rule of theirs matches.
    Denied { policies: Vec<String> },
}

impl Verdict {
    pub fn allows(&self) -> bool {
        !matches!(self, Verdict::Denied { .. })
    }
}

/// Both directions of a connection from `src` to `dst` port `port`/`protocol`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// The source pod's egress (None: the source is not a pod).
    pub egress: Option<Verdict>,
    /// The destination pod's ingress (None: the destination is not a pod).
    pub ingress: Option<Verdict>,
}

impl Connection {
    pub fn allowed(&self) -> bool {
        self.egress.as_ref().is_none_or(Verdict::allows) && self.ingress.as_ref().is_none_or(Verdict::allows)
    }

    /// Why, in a sentence: the allowing rules, or which side dropped it.
    pub fn explain(&self, src: &End<'_>, dst: &End<'_>) -> String {
        let side = |v: &Option<Verdict>, d: Direction, subject: &End<'_>, other: &End<'_>| match v {
            Some(Verdict::Denied { policies }) => Some(format!(
                "dropped: no policy selecting {} allows {} {} {} (isolated by {})",
                subject.describe(),
                d.name().to_lowercase(),
                if d == Direction::Ingress { "from" } else { "to" },
                other.describe(),
                policies.join(", ")
            )),
            _ => None,
        };
        if let Some(s) =
            side(&self.egress, Direction::Egress, src, dst).or(side(&self.ingress, Direction::Ingress, dst, src))
        {
            return s;
        }
        let allowed: Vec<String> = [&self.egress, &self.ingress]
            .into_iter()
            .flatten()
            .filter_map(|v| match v {
                Verdict::Allowed(a) => Some(a.iter().map(describe_allowed)),
                _ => None,
            })
            .flatten()
            .collect();
        if allowed.is_empty() {
            "allowed: no policy isolates either end".into()
        } else {
            format!("allowed by {}", allowed.join("; "))
        }
    }
}

fn describe_allowed(a: &Allowed) -> String {
    let dir = a.direction.name().to_lowercase();
    let peer = a.peer.map(|p| format!(", peer {p}")).unwrap_or_default();
    let port = a.port.map(|p| format!(", port {p}")).unwrap_or_default();
    format!("NetworkPolicy {} {dir}[{}]{peer}{port}", a.policy, a.rule)
}

/// One rule of a direction: its peers (`from` or `to`) and ports.
pub type Rule = (Option<Vec<NetworkPolicyPeer>>, Option<Vec<NetworkPolicyPort>>);

/// A policy's rules for `direction`, in order.
pub fn rules(p: &NetworkPolicy, direction: Direction) -> Vec<Rule> {
    let spec = p.spec.clone().unwrap_or_default();
    match direction {
        Direction::Ingress => spec.ingress.unwrap_or_default().into_iter().map(|r| (r.from, r.ports)).collect(),
        Direction::Egress => spec.egress.unwrap_or_default().into_iter().map(|r| (r.to, r.ports)).collect(),
    }
}

/// The policyTypes of a policy, defaulted as the API server does when it has none.
pub fn types(p: &NetworkPolicy) -> Vec<Direction> {
    let spec = p.spec.clone().unwrap_or_default();
    match spec.policy_types {
        Some(t) if !t.is_empty() => t
            .iter()
            .filter_map(|t| match t.as_str() {
                "Ingress" => Some(Direction::Ingress),
                "Egress" => Some(Direction::Egress),
                _ => None,
            })
            .collect(),
        _ => {
            let mut d = vec![Direction::Ingress];
            if spec.egress.is_some_and(|e| !e.is_empty()) {
                d.push(Direction::Egress);
            }
            d
        }
    }
}

fn selects(sel: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    sel.is_none_or(|s| selector_matches(s, Some(labels)))
}

/// Whether `policy` selects `pod` (same namespace, podSelector matches).
pub fn selects_pod(policy: &NetworkPolicy, pod: &Pod) -> bool {
    policy.metadata.namespace.as_deref().unwrap_or("default") == pod.namespace
        && selects(policy.spec.as_ref().and_then(|s| s.pod_selector.as_ref()), &pod.labels)
}

/// Whether `peer` of a policy in namespace `ns` matches `other`.
pub fn peer_matches(peer: &NetworkPolicyPeer, ns: &str, other: &End<'_>) -> bool {
    if let Some(block) = &peer.ip_block {
        let ip = other.ip();
        let within = |c: &str| c.parse::<ipnet::IpNet>().is_ok_and(|n| n.contains(&ip));
        return within(&block.cidr) && !block.except.iter().flatten().any(|e| within(e));
    }
    let End::Pod(pod) = other else { return false };
    let ns_ok = match &peer.namespace_selector {
        Some(sel) => selector_matches(sel, Some(&pod.namespace_labels)),
        None => pod.namespace == ns,
    };
    ns_ok && selects(peer.pod_selector.as_ref(), &pod.labels)
}

/// Whether port entry `p` matches `port`/`protocol` on `target` (the destination: named ports
/// are its container ports).
fn port_matches(p: &NetworkPolicyPort, target: &End<'_>, port: u16, protocol: &str) -> bool {
    if !p.protocol.as_deref().unwrap_or("TCP").eq_ignore_ascii_case(protocol) {
        return false;
    }
    match &p.port {
        None => true,
        Some(IntOrString::Int(n)) => {
            let end = p.end_port.unwrap_or(*n);
            (*n..=end).contains(&i32::from(port))
        }
        Some(IntOrString::String(name)) => match target {
            End::Pod(pod) => pod
                .named_ports
                .iter()
                .any(|(n, pt, proto)| n == name && *pt == port && proto.eq_ignore_ascii_case(protocol)),
            End::Address(_) => false,
        },
    }
}

/// `subject`'s verdict for `direction` on a connection with `other` to port `port`/`protocol`
/// (on `subject` for ingress, on `other` for egress).
pub fn verdict(
    policies: &[NetworkPolicy],
    direction: Direction,
    subject: &Pod,
    other: &End<'_>,
    port: u16,
    protocol: &str,
) -> Verdict {
    let target = match direction {
        Direction::Ingress => End::Pod(subject),
        Direction::Egress => *other,
    };
    let mut isolating = vec![];
    let mut allowed = vec![];
    for p in policies.iter().filter(|p| selects_pod(p, subject) && types(p).contains(&direction)) {
        let ns = p.metadata.namespace.as_deref().unwrap_or("default");
        let key = format!("{ns}/{}", p.metadata.name.as_deref().unwrap_or(""));
        isolating.push(key.clone());
        for (i, (peers, ports)) in rules(p, direction).iter().enumerate() {
            let peer = match peers.as_deref() {
                None | Some([]) => Some(None),
                Some(list) => list.iter().position(|x| peer_matches(x, ns, other)).map(Some),
            };
            let port_ = match ports.as_deref() {
                None | Some([]) => Some(None),
                Some(list) => list.iter().position(|x| port_matches(x, &target, port, protocol)).map(Some),
            };
            if let (Some(peer), Some(port)) = (peer, port_) {
                allowed.push(Allowed { policy: key.clone(), direction, rule: i, peer, port });
            }
        }
    }
    if isolating.is_empty() {
        Verdict::NotIsolated
    } else if allowed.is_empty() {
        Verdict::Denied { policies: isolating }
    } else {
        Verdict::Allowed(allowed)
    }
}

/// Both verdicts for a connection from `src` to `dst`, port `port`/`protocol`.
pub fn connection(policies: &[NetworkPolicy], src: &End<'_>, dst: &End<'_>, port: u16, protocol: &str) -> Connection {
    Connection {
        egress: match src {
            End::Pod(p) => Some(verdict(policies, Direction::Egress, p, dst, port, protocol)),
            End::Address(_) => None,
        },
        ingress: match dst {
            End::Pod(p) => Some(verdict(policies, Direction::Ingress, p, src, port, protocol)),
            End::Address(_) => None,
        },
    }
}

/// The upstream netpol suite's world (its tests, the renderer's, the e2e's): namespaces x, y,
/// z (labels `ns` and `kubernetes.io/metadata.name`), pods a, b, c (label `pod`) in each,
/// serving 80 and 81 over TCP and UDP (named `serve-80-tcp` …); `ip(namespace index, pod
/// index)` places them.
pub fn suite_world(ip: impl Fn(usize, usize) -> IpAddr) -> Vec<Pod> {
    let mut out = vec![];
    for (i, ns) in ["x", "y", "z"].iter().enumerate() {
        for (j, pod) in ["a", "b", "c"].iter().enumerate() {
            let mut named = vec![];
            for port in [80u16, 81] {
                for proto in ["TCP", "UDP"] {
                    named.push((format!("serve-{port}-{}", proto.to_lowercase()), port, proto.to_string()));
                }
            }
            out.push(Pod {
                namespace: ns.to_string(),
                name: pod.to_string(),
                labels: [("pod".to_string(), pod.to_string())].into(),
                namespace_labels: [
                    ("ns".to_string(), ns.to_string()),
                    ("kubernetes.io/metadata.name".to_string(), ns.to_string()),
                ]
                .into(),
                ip: ip(i, j),
                named_ports: named,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> Vec<Pod> {
        suite_world(|i, j| format!("10.244.{}.{}", i + 1, j + 10).parse().unwrap())
    }

    fn policy(ns: &str, yaml: &str) -> NetworkPolicy {
        let mut p: NetworkPolicy =
            serde_yaml::from_str(&format!("metadata: {{name: p-{}, namespace: {ns}}}\nspec:\n{yaml}", yaml.len()))
                .unwrap();
        crate::ApiObject::apply_defaults(&mut p);
        p
    }

    /// The probe matrix as the upstream suite prints it: `.` allowed, `X` denied, rows from,
    /// columns to, in x/a … z/c order.
    fn matrix(policies: &[NetworkPolicy], port: u16, protocol: &str) -> Vec<String> {
        let w = world();
        w.iter()
            .map(|from| {
                w.iter()
                    .map(|to| {
                        if connection(policies, &End::Pod(from), &End::Pod(to), port, protocol).allowed() {
                            '.'
                        } else {
                            'X'
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn no_policy_allows_everything_and_deny_all_isolates_a_namespace() {
        assert!(matrix(&[], 80, "TCP").iter().all(|r| r == "........."));
        let deny = policy("x", "  podSelector: {}");
        // Nobody reaches x's pods; x's pods reach everyone (egress not isolated).
        let m = matrix(&[deny], 80, "TCP");
        assert_eq!(m, vec!["XXX......"; 9]);
    }

    #[test]
    fn ingress_from_a_namespace_and_from_pods_in_a_namespace() {
        let from_y = policy("x", "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}]}]");
        let m = matrix(&[from_y], 80, "TCP");
        // Column x/a only from y's pods.
        for (i, row) in m.iter().enumerate() {
            let want = if (3..6).contains(&i) { '.' } else { 'X' };
            assert_eq!(row.chars().next(), Some(want), "row {i}: {row}");
            assert_eq!(&row[1..], "........");
        }
        // Both selectors in one peer: pod b in namespace y only; as two peers: either.
        let and = policy("x", "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}, podSelector: {matchLabels: {pod: b}}}]}]");
        let col: String = matrix(&[and], 80, "TCP").iter().map(|r| r.chars().next().unwrap()).collect();
        assert_eq!(col, "XXXX.XXXX");
        let or = policy("x", "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{from: [{namespaceSelector: {matchLabels: {ns: y}}}, {podSelector: {matchLabels: {pod: b}}}]}]");
        let col: String = matrix(&[or], 80, "TCP").iter().map(|r| r.chars().next().unwrap()).collect();
        assert_eq!(col, "X.X...XXX", "y's pods, and b of the policy's own namespace");
    }

    #[test]
    fn ports_named_ranges_protocols_and_the_union_of_policies() {
        let named = policy(
            "x",
            "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{ports: [{port: serve-81-udp, protocol: UDP}]}]",
        );
        assert!(matrix(std::slice::from_ref(&named), 80, "TCP").iter().all(|r| r.starts_with('X')));
        assert!(matrix(std::slice::from_ref(&named), 81, "TCP").iter().all(|r| r.starts_with('X')));
        assert!(matrix(std::slice::from_ref(&named), 81, "UDP").iter().all(|r| r.starts_with('.')));
        let range =
            policy("x", "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{ports: [{port: 79, endPort: 80}]}]");
        assert!(matrix(std::slice::from_ref(&range), 80, "TCP").iter().all(|r| r.starts_with('.')));
        assert!(matrix(std::slice::from_ref(&range), 81, "TCP").iter().all(|r| r.starts_with('X')));
        // Union: another policy selecting the same pod adds 81.
        let also_81 = policy("x", "  podSelector: {matchLabels: {pod: a}}\n  ingress: [{ports: [{port: 81}]}]");
        assert!(matrix(&[range, also_81], 81, "TCP").iter().all(|r| r.starts_with('.')));
    }

    #[test]
    fn egress_ip_blocks_with_except_and_the_reasons() {
        let w = world();
        let (xa, ya, yb) = (&w[0], &w[3], &w[4]);
        // x/a may talk only to 10.244.2.0/24 except y/b's address, port 80.
        let p = policy(
            "x",
            "  podSelector: {matchLabels: {pod: a}}\n  policyTypes: [Egress]\n  egress: [{to: [{ipBlock: {cidr: 10.244.2.0/24, except: [10.244.2.11/32]}}], ports: [{port: 80}]}]",
        );
        let policies = [p];
        let c = connection(&policies, &End::Pod(xa), &End::Pod(ya), 80, "TCP");
        assert!(c.allowed());
        assert_eq!(
            c.explain(&End::Pod(xa), &End::Pod(ya)),
            format!(
                "allowed by NetworkPolicy x/{} egress[0], peer 0, port 0",
                policies[0].metadata.name.as_deref().unwrap()
            )
        );
        let c = connection(&policies, &End::Pod(xa), &End::Pod(yb), 80, "TCP");
        assert!(!c.allowed());
        assert!(
            c.explain(&End::Pod(xa), &End::Pod(yb))
                .starts_with("dropped: no policy selecting pod x/a allows egress to pod y/b"),
            "{}",
            c.explain(&End::Pod(xa), &End::Pod(yb))
        );
        assert!(!connection(&policies, &End::Pod(xa), &End::Pod(ya), 81, "TCP").allowed());
        // An address outside the pod network, and traffic from it.
        let outside = End::Address("203.0.113.9".parse().unwrap());
        assert!(!connection(&policies, &End::Pod(xa), &outside, 80, "TCP").allowed());
        assert!(connection(&policies, &outside, &End::Pod(xa), 80, "TCP").allowed(), "ingress not isolated");
        assert_eq!(
            connection(&[], &outside, &End::Pod(xa), 80, "TCP").explain(&outside, &End::Pod(xa)),
            "allowed: no policy isolates either end"
        );
    }

    #[test]
    fn a_policy_that_selects_no_pod_changes_nothing() {
        let none = policy("x", "  podSelector: {matchLabels: {pod: nobody}}");
        assert!(matrix(&[none], 80, "TCP").iter().all(|r| r == "........."));
        let other_ns = policy("y", "  podSelector: {matchLabels: {pod: a}}");
        let m = matrix(&[other_ns], 80, "TCP");
        assert!(m.iter().all(|r| r == "...X....."), "{m:?}");
    }
}
