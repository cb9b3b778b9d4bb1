//! `podpath explain SERVICE` (pure): the rules each node holds for one Service, grouped by
//! chain, each with what it does in words, and the share of new connections each endpoint gets.
//! Works on `iptables-save` text of both proxy modes, so it explains exactly what is installed.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use podpath_ruleset::{Addr, Match, RecentOp, Rule, Target};
use serde::Serialize;

use crate::trace::steps::trim_float;

/// One rule, as installed, and what it does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleWords {
    pub rule: String,
    pub words: String,
}

/// The rules of one chain that concern the Service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Chain {
    pub table: String,
    pub chain: String,
    pub purpose: String,
    pub rules: Vec<RuleWords>,
    /// For a service chain: each endpoint's share of new connections, in rule order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<Share>,
}

/// An endpoint's share of the new connections a service chain picks for.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Share {
    pub endpoint: String,
    /// The rule's own probability (of what the rules before it left).
    pub rule_probability: f64,
    /// The endpoint's share of all new connections.
    pub share: f64,
}

impl Eq for Share {}

/// The rules of some nodes (those that hold exactly the same rules for the Service).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeGroup {
    pub nodes: Vec<String>,
    pub chains: Vec<Chain>,
    /// Userspace mode: the rules only redirect to node-agent's proxy socket, and the proxy
    /// picks the endpoint (see [`Explanation::endpoints`]).
    #[serde(rename = "endpointPickedByUserspaceProxy")]
    pub userspace: bool,
}

/// The ready endpoints of one Service port, from its EndpointSlices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PortEndpoints {
    /// `http (80/TCP)` or `80/TCP`.
    pub port: String,
    pub endpoints: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Explanation {
    /// `ns/name`.
    pub service: String,
    /// The Service as the API has it: type, addresses, ports.
    pub summary: Vec<String>,
    /// Seconds a client keeps its endpoint (sessionAffinity ClientIP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity_seconds: Option<u64>,
    pub endpoints: Vec<PortEndpoints>,
    pub groups: Vec<NodeGroup>,
}

/// Chains whose rules all belong to one Service (entered from the shared chains).
fn per_service_chain(chain: &str) -> bool {
    ["KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"].iter().any(|p| chain.starts_with(p))
}

/// Whether a comment concerns `service` (`ns/name`): `ns/name`, `ns/name:port`, anywhere in it.
fn mentions(comment: &str, service: &str) -> bool {
    comment.split(' ').any(|w| w == service || w.strip_prefix(service).is_some_and(|rest| rest.starts_with(':')))
}

/// A rule of `iptables-save` output: its line as the kernel lists it (what is shown) and the
/// rule in the model (what is read).
struct Saved<'a> {
    line: &'a str,
    rule: Rule,
}

/// The `-A` lines of a table's `iptables-save`, each parsed by the workspace's one parser.
fn saved(table: &str) -> Vec<Saved<'_>> {
    table
        .lines()
        .filter(|l| l.starts_with("-A "))
        .filter_map(|line| podpath_ruleset::text::parse_rule_line(line).ok().map(|rule| Saved { line, rule }))
        .collect()
}

/// The rules of a table that concern `service`: those whose comment names it, and every rule
/// of the per-Service chains they lead to. In `iptables-save` order.
fn select<'a>(rules: &'a [Saved<'a>], service: &str) -> Vec<&'a Saved<'a>> {
    let mut chains: BTreeSet<&str> = BTreeSet::new();
    let mut picked: BTreeSet<usize> = BTreeSet::new();
    for (i, r) in rules.iter().enumerate() {
        if r.rule.comment_text().is_some_and(|c| mentions(c, service)) {
            picked.insert(i);
        }
    }
    loop {
        let before = (picked.len(), chains.len());
        for &i in picked.clone().iter() {
            if let Some(t) = rules[i].rule.jump_target().filter(|t| per_service_chain(t)) {
                chains.insert(t);
            }
            // A per-Service chain named by a picked rule belongs to the Service entirely.
            let c = rules[i].rule.chain.as_str();
            if per_service_chain(c) {
                chains.insert(c);
            }
        }
        for (i, r) in rules.iter().enumerate() {
            if chains.contains(r.rule.chain.as_str()) {
                picked.insert(i);
            }
        }
        if (picked.len(), chains.len()) == before {
            break;
        }
    }
    picked.into_iter().map(|i| &rules[i]).collect()
}

fn walk_rank(chain: &str) -> usize {
    let ranks = [
        "KUBE-SERVICES",
        "KUBE-PORTALS-",
        "KUBE-NODEPORTS",
        "KUBE-NODEPORT-",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-PROXY-FIREWALL",
        "KUBE-FW-",
        "KUBE-EXT-",
        "KUBE-SVC-",
        "KUBE-SVL-",
        "KUBE-SEP-",
    ];
    ranks.iter().position(|r| chain.starts_with(r)).unwrap_or(ranks.len())
}

/// What a chain is for.
fn purpose(table: &str, chain: &str) -> String {
    let p = match chain {
        "KUBE-SERVICES" if table == "filter" => "refuses traffic to Service ports without endpoints",
        "KUBE-SERVICES" => "the entry for every packet to a Service address",
        "KUBE-NODEPORTS" if table == "filter" => "lets health-check NodePorts in",
        "KUBE-NODEPORTS" => "packets to this node's NodePorts",
        "KUBE-EXTERNAL-SERVICES" => "drops external traffic the Service cannot take here",
        "KUBE-PROXY-FIREWALL" => "drops traffic a load balancer's source ranges do not allow",
        "KUBE-PORTALS-CONTAINER" => "userspace mode: Service addresses, for traffic arriving at the node",
        "KUBE-PORTALS-HOST" => "userspace mode: Service addresses, for traffic the node sends",
        "KUBE-NODEPORT-CONTAINER" => "userspace mode: NodePorts, for traffic arriving at the node",
        "KUBE-NODEPORT-HOST" => "userspace mode: NodePorts, for traffic the node sends",
        "KUBE-NODEPORT-NON-LOCAL" => "userspace mode: lets NodePort traffic in",
        c if c.starts_with("KUBE-SVC-") => "one Service port: picks an endpoint for each new connection",
        c if c.starts_with("KUBE-SVL-") => "one Service port, node-local endpoints only (traffic policy Local)",
        c if c.starts_with("KUBE-EXT-") => {
            "external traffic (load balancer, external IP, NodePort) for one Service port"
        }
        c if c.starts_with("KUBE-FW-") => "the load balancer's allowed source ranges",
        c if c.starts_with("KUBE-SEP-") => "one endpoint: rewrites the destination to it",
        _ => "",
    };
    p.to_string()
}

fn with_pod(endpoint: &str, pods: &BTreeMap<IpAddr, String>) -> String {
    // `10.244.1.5:8080`, `[fd00:10:244:1::5]:8080`, or an address alone.
    let ip = endpoint
        .parse::<std::net::SocketAddr>()
        .map(|s| s.ip())
        .ok()
        .or_else(|| endpoint.split(':').next().and_then(|i| i.parse::<IpAddr>().ok()))
        .or_else(|| endpoint.parse::<IpAddr>().ok());
    match ip.and_then(|i| pods.get(&i)) {
        Some(p) => format!("{endpoint} (pod {p})"),
        None => endpoint.to_string(),
    }
}

/// An address as people read it (a `/32` or `/128` network is a host).
fn addr_text(a: &Addr) -> String {
    let t = a.to_string();
    if t.contains(':') {
        t.trim_end_matches("/128").to_string()
    } else {
        t.trim_end_matches("/32").to_string()
    }
}

/// `ip:port`, with the IPv6 address in brackets.
fn host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn is_local(rule: &Rule, source: bool) -> bool {
    rule.addr_type(source) == Some(("LOCAL", false))
}

/// `to 10.96.0.42:80/tcp` from a rule's destination match.
fn destination(rule: &Rule) -> String {
    let proto = rule.protocol().unwrap_or("tcp");
    let port = rule.destination_port().unwrap_or("*");
    match rule.destination() {
        Some((d, _)) => format!("{}/{proto}", host_port(&addr_text(&d), port)),
        None if rule.chain.contains("NODEPORT") => format!("NodePort {port}/{proto}"),
        None if is_local(rule, false) => format!("any address of this node, port {port}/{proto}"),
        None => format!("port {port}/{proto}"),
    }
}

/// The `--rcheck` of a session-affinity rule: its seconds.
fn affinity_check(rule: &Rule) -> Option<Option<u32>> {
    rule.matches.iter().find_map(|m| match m {
        Match::Recent { op: RecentOp::Check { seconds, .. }, .. } => Some(*seconds),
        _ => None,
    })
}

/// A rule in words.
pub fn describe(rule: &Rule, pods: &BTreeMap<IpAddr, String>) -> String {
    let comment = rule.comment_text().unwrap_or_default();
    let target = rule.target.as_ref().map(Target::name).unwrap_or("");
    let chain = rule.chain.as_str();
    let kind = ["cluster IP", "loadbalancer IP", "external IP"].into_iter().find(|k| comment.ends_with(k));
    let source = match rule.source() {
        Some((s, true)) => format!(" from outside {s}"),
        Some((s, false)) => format!(" from {s}"),
        None if is_local(rule, true) => " from this node itself".to_string(),
        None => String::new(),
    };
    match (target, &rule.target) {
        ("KUBE-MARK-MASQ", _) => match rule.source() {
            Some((s, false)) if chain.starts_with("KUBE-SEP-") => {
                let s = addr_text(&s);
                format!("the endpoint {s} reaching itself through the Service (hairpin): mark for masquerade")
            }
            Some((s, true)) => format!("from outside the pod network {s}: mark for masquerade (0x4000), the reply must come back through this node"),
            _ if is_local(rule, true) => "sent by this node: mark for masquerade".to_string(),
            _ => "mark for masquerade (0x4000): the pod will see this node as the client (externalTrafficPolicy: Cluster)".to_string(),
        },
        ("KUBE-MARK-DROP", _) => "mark for drop".to_string(),
        (_, Some(Target::Dnat { to })) if chain.starts_with("KUBE-PORTALS-") || chain.starts_with("KUBE-NODEPORT-") => {
            let port = to.rsplit(':').next().unwrap_or("?");
            format!("{}: to the userspace proxy's port {port} (DNAT to {to}, this node)", destination(rule))
        }
        (_, Some(Target::Dnat { to })) => {
            let set = rule.matches.iter().any(|m| matches!(m, Match::Recent { op: RecentOp::Set, .. }));
            let affinity = if set { "; remember the client for session affinity" } else { "" };
            format!("rewrite the destination to {}{affinity}", with_pod(to, pods))
        }
        (_, Some(Target::Redirect { to_ports })) => {
            format!("{}: redirect to the userspace proxy's port {to_ports} on this node", destination(rule))
        }
        ("REJECT", _) => format!("{}: reject ({comment})", destination(rule)),
        ("DROP", _) => format!("{}: drop ({comment})", destination(rule)),
        ("ACCEPT", _) => format!("{}: accept", destination(rule)),
        (t, _) if t.starts_with("KUBE-SEP-") => {
            let ep = comment.split(" -> ").nth(1).map(|e| with_pod(e, pods)).unwrap_or_else(|| t.to_string());
            if let Some(secs) = affinity_check(rule) {
                let secs = secs.map(|s| s.to_string()).unwrap_or_else(|| "?".into());
                format!("a client that used {ep} in the last {secs} s goes back to it (session affinity)")
            } else if let Some(p) = rule.probability() {
                format!("endpoint {ep} with probability {}", trim_float(p))
            } else {
                format!("endpoint {ep} (all that is left)")
            }
        }
        (t, _) if t.starts_with("KUBE-") => {
            let what = match kind {
                Some(k) => format!("to {} ({k})", destination(rule)),
                None if chain == "KUBE-NODEPORTS" => format!("to {}", destination(rule)),
                None if rule.destination().is_some() || rule.destination_port().is_some() => {
                    format!("to {}", destination(rule))
                }
                None if !source.is_empty() => source.trim_start().to_string(),
                None => "everything else".to_string(),
            };
            let what = if kind.is_some() || chain == "KUBE-NODEPORTS" { format!("{what}{source}") } else { what };
            format!("{what} → {t}")
        }
        ("", _) => format!("no verdict ({comment})"),
        (t, _) => format!("{} → {t}", destination(rule)),
    }
}

/// Each endpoint's share of new connections in a service chain: the rule's probability of what
/// the rules before it left over.
fn shares(rules: &[&Rule], pods: &BTreeMap<IpAddr, String>) -> Vec<Share> {
    let mut left = 1.0;
    let mut out = Vec::new();
    for r in rules {
        let Some(t) = r.jump_target().filter(|t| t.starts_with("KUBE-SEP-")) else { continue };
        if affinity_check(r).is_some() {
            continue;
        }
        let p = r.probability().unwrap_or(1.0);
        let endpoint = r
            .comment_text()
            .and_then(|c| c.split(" -> ").nth(1).map(|e| with_pod(e, pods)))
            .unwrap_or_else(|| t.to_string());
        out.push(Share { endpoint, rule_probability: p, share: left * p });
        left *= 1.0 - p;
    }
    out
}

/// The chains of one node for the Service.
fn node_chains(saves: &[(&str, &str)], service: &str, pods: &BTreeMap<IpAddr, String>) -> Vec<Chain> {
    let mut chains: Vec<Chain> = Vec::new();
    for (table, save) in saves {
        let rules = saved(save);
        let picked = select(&rules, service);
        let mut order: Vec<&str> = Vec::new();
        for r in &picked {
            let c = r.rule.chain.as_str();
            if !order.contains(&c) {
                order.push(c);
            }
        }
        // In the order a packet meets them: entry chains, then per-Service chains down to the
        // endpoints (iptables-save lists chains in its own order).
        order.sort_by_key(|c| walk_rank(c));
        for c in order {
            let in_chain: Vec<&Saved> = picked.iter().copied().filter(|r| r.rule.chain == c).collect();
            let typed: Vec<&Rule> = in_chain.iter().map(|r| &r.rule).collect();
            let shares =
                if c.starts_with("KUBE-SVC-") || c.starts_with("KUBE-SVL-") { shares(&typed, pods) } else { vec![] };
            chains.push(Chain {
                table: table.to_string(),
                chain: c.to_string(),
                purpose: purpose(table, c),
                rules: in_chain
                    .iter()
                    .map(|r| RuleWords { rule: r.line.to_string(), words: describe(&r.rule, pods) })
                    .collect(),
                shares,
            });
        }
    }
    chains
}

/// The summary lines of a Service object.
fn summary(svc: &serde_json::Value) -> Vec<String> {
    let spec = &svc["spec"];
    let mut out = Vec::new();
    let kind = spec["type"].as_str().unwrap_or("ClusterIP");
    let mut head = format!("type {kind}, cluster IP {}", spec["clusterIP"].as_str().unwrap_or("None"));
    let lbs: Vec<&str> = svc["status"]["loadBalancer"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["ip"].as_str())
        .collect();
    if !lbs.is_empty() {
        head += &format!(", load balancer IP {}", lbs.join(", "));
    }
    let ext: Vec<&str> = spec["externalIPs"].as_array().into_iter().flatten().filter_map(|i| i.as_str()).collect();
    if !ext.is_empty() {
        head += &format!(", external IP {}", ext.join(", "));
    }
    if let Some(p) = spec["externalTrafficPolicy"].as_str() {
        head += &format!(", externalTrafficPolicy {p}");
    }
    if spec["sessionAffinity"] == "ClientIP" {
        head += ", sessionAffinity ClientIP";
    }
    out.push(head);
    for p in spec["ports"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().map(|n| format!("{n}: ")).unwrap_or_default();
        let np = p["nodePort"].as_u64().map(|n| format!(", nodePort {n}")).unwrap_or_default();
        out.push(format!(
            "port {name}{}/{} → targetPort {}{np}",
            p["port"],
            p["protocol"].as_str().unwrap_or("TCP"),
            p["targetPort"].as_str().map(str::to_string).unwrap_or_else(|| p["targetPort"].to_string()),
        ));
    }
    out
}

/// Each Service port's ready endpoints in its EndpointSlices (a slice port matches a Service
/// port by name, as both are unnamed for a single-port Service).
fn port_endpoints(
    svc: &serde_json::Value,
    slices: &[serde_json::Value],
    pods: &BTreeMap<IpAddr, String>,
) -> Vec<PortEndpoints> {
    let mut out = Vec::new();
    for p in svc["spec"]["ports"].as_array().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or("");
        let number = format!("{}/{}", p["port"], p["protocol"].as_str().unwrap_or("TCP"));
        let port = if name.is_empty() { number } else { format!("{name} ({number})") };
        let mut endpoints = Vec::new();
        for slice in slices {
            let Some(target) = slice["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|sp| sp["name"].as_str().unwrap_or("") == name)
                .and_then(|sp| sp["port"].as_u64())
            else {
                continue;
            };
            for e in slice["endpoints"].as_array().into_iter().flatten() {
                // Ready unless it says otherwise (the EndpointSlice API's rule).
                if e["conditions"]["ready"] == false {
                    continue;
                }
                for a in e["addresses"].as_array().into_iter().flatten().filter_map(|a| a.as_str()) {
                    endpoints.push(with_pod(&format!("{a}:{target}"), pods));
                }
            }
        }
        out.push(PortEndpoints { port, endpoints });
    }
    out
}

/// Explains the Service's rules on each node (`node → [(table, iptables-save -t table)]`),
/// with its endpoints from its EndpointSlices.
pub fn explain(
    svc: &serde_json::Value,
    slices: &[serde_json::Value],
    nodes: &BTreeMap<String, Vec<(String, String)>>,
    pods: &BTreeMap<IpAddr, String>,
) -> Explanation {
    let service = service_name(svc);
    let groups = group_nodes(nodes.iter().map(|(node, saves)| {
        let saves: Vec<(&str, &str)> = saves.iter().map(|(t, s)| (t.as_str(), s.as_str())).collect();
        (node, node_chains(&saves, &service, pods))
    }));
    assemble(svc, slices, pods, service, groups)
}

/// `ns/name` of a Service object.
fn service_name(svc: &serde_json::Value) -> String {
    format!(
        "{}/{}",
        svc["metadata"]["namespace"].as_str().unwrap_or("default"),
        svc["metadata"]["name"].as_str().unwrap_or("")
    )
}

/// Nodes with the same chains for the Service, grouped (in node order).
fn group_nodes<'a>(per_node: impl Iterator<Item = (&'a String, Vec<Chain>)>) -> Vec<NodeGroup> {
    let mut groups: Vec<NodeGroup> = Vec::new();
    for (node, chains) in per_node {
        match groups.iter_mut().find(|g| g.chains == chains) {
            Some(g) => g.nodes.push(node.clone()),
            None => {
                let userspace = chains.iter().any(|c| c.rules.iter().any(|r| r.rule.contains(" --to-ports ")));
                groups.push(NodeGroup { nodes: vec![node.clone()], chains, userspace })
            }
        }
    }
    groups
}

/// The explanation of one Service from its node groups.
fn assemble(
    svc: &serde_json::Value,
    slices: &[serde_json::Value],
    pods: &BTreeMap<IpAddr, String>,
    service: String,
    groups: Vec<NodeGroup>,
) -> Explanation {
    let affinity_seconds = (svc["spec"]["sessionAffinity"] == "ClientIP")
        .then(|| svc["spec"]["sessionAffinityConfig"]["clientIP"]["timeoutSeconds"].as_u64().unwrap_or(10800));
    Explanation {
        service,
        summary: summary(svc),
        affinity_seconds,
        endpoints: port_endpoints(svc, slices, pods),
        groups,
    }
}

/// In nftables mode: the table `ip kube-proxy` of each node (`nft list table`, read back with
/// `podpath_ruleset::nft::Listing`), the Service's map elements and its chains, each in words.
pub fn explain_nft(
    svc: &serde_json::Value,
    slices: &[serde_json::Value],
    nodes: &BTreeMap<String, podpath_ruleset::nft::Listing>,
    pods: &BTreeMap<IpAddr, String>,
) -> Explanation {
    let service = service_name(svc);
    let groups = group_nodes(nodes.iter().map(|(node, listing)| (node, nft_chains(svc, listing, &service, pods))));
    assemble(svc, slices, pods, service, groups)
}

/// What a map or set of the table is for.
fn nft_map_purpose(name: &str) -> &'static str {
    match name {
        "cluster-ips" => "every ClusterIP (traffic to other ports of one is rejected)",
        "service-ips" => {
            "ClusterIP, external and LoadBalancer IP traffic: address . protocol . port → the chain that handles it"
        }
        "service-nodeports" => "NodePort traffic to this node's addresses (@nodeport-ips): protocol . port → the chain",
        "no-endpoint-services" => "addresses of Services without (local) endpoints: rejected or dropped",
        "no-endpoint-nodeports" => "NodePorts of Services without (local) endpoints: rejected or dropped",
        "firewall-ips" => "LoadBalancer IPs with loadBalancerSourceRanges: checked before anything else",
        "endpoints" => {
            "every Service's endpoints, keyed address . protocol . port . index (the shared-maps layout, podpath's own: \
             kube-proxy writes a DNAT rule per Service port instead, so an endpoint change here is map elements only)"
        }
        _ => "",
    }
}

/// What a per-Service chain is for, by its prefix.
fn nft_chain_purpose(chain: &str) -> &'static str {
    let prefix = chain.split('-').next().unwrap_or("");
    match prefix {
        "service" => "picks one of the Service port's endpoints (cluster policy)",
        "local" => "picks one of this node's endpoints (traffic policy Local)",
        "external" => "traffic from outside the cluster (NodePort, external and LoadBalancer IPs): masquerade, then a policy chain",
        "firewall" => "loadBalancerSourceRanges: other sources are dropped",
        "endpoint" => "one endpoint (per-endpoint chain: affinity, or the v1.34 layout)",
        _ => "",
    }
}

/// `10.244.1.5 . 8080` → `10.244.1.5:8080 (pod default/web-x)` (IPv6 in brackets).
fn nft_endpoint(pair: &str, pods: &BTreeMap<IpAddr, String>) -> String {
    let addr = match pair.trim().split_once(" . ") {
        Some((host, port)) => host_port(host.trim(), port.trim()),
        None => pair.trim().to_string(),
    };
    with_pod(&addr, pods)
}

/// One element of a map in words.
fn nft_element_words(map: &str, element: &str, svc: &serde_json::Value) -> String {
    let (key, value) = element.split_once(" : ").unwrap_or((element, ""));
    let key = key.split(" comment ").next().unwrap_or(key);
    let fields: Vec<&str> = key.split(" . ").collect();
    let spec = &svc["spec"];
    let what = |ip: &str| -> &'static str {
        if spec["clusterIP"] == ip || spec["clusterIPs"].as_array().is_some_and(|a| a.iter().any(|x| x == ip)) {
            "the cluster IP"
        } else if spec["externalIPs"].as_array().is_some_and(|a| a.iter().any(|x| x == ip)) {
            "an external IP"
        } else {
            "the LoadBalancer IP"
        }
    };
    let dest = match fields.as_slice() {
        [ip, proto, port] => format!("{ip}:{port}/{proto} ({})", what(ip)),
        [proto, port] => format!("NodePort {port}/{proto}"),
        [ip] => format!("{ip} ({})", what(ip)),
        _ => key.to_string(),
    };
    match (map, value) {
        ("cluster-ips", _) => format!("{dest} is an active ClusterIP"),
        (_, "goto reject-chain") => format!("{dest}: rejected — the Service has no endpoints"),
        (_, "drop") => format!("{dest}: dropped — no endpoint on this node and the traffic policy is Local"),
        (_, v) => match v.strip_prefix("goto ") {
            Some(chain) => format!("{dest} goes to {chain}"),
            None => format!("{dest}: {v}"),
        },
    }
}

/// One listed rule of a per-Service chain in words.
fn nft_rule_words(rule: &str, pods: &BTreeMap<IpAddr, String>) -> String {
    let comment = rule.split(" comment \"").nth(1).map(|c| c.trim_end_matches('"'));
    if let Some(rest) = rule.strip_suffix(" map @endpoints") {
        let n = rest.rsplit("numgen random mod ").next().unwrap_or("?");
        let proto = rest.split(" . ").nth(2).and_then(|p| p.split(' ').next()).unwrap_or("?");
        return format!(
            "{proto}: DNAT to the map endpoints element keyed by the packet's own address . protocol . port and a \
             random index (numgen random mod {n}): one of {n} endpoints"
        );
    }
    if let Some(rest) = rule.split(" dnat ip to numgen random mod ").nth(1) {
        let n = rest.split(' ').next().unwrap_or("?");
        let body = rest.split("map { ").nth(1).unwrap_or("").trim_end_matches(" }");
        let eps: Vec<String> =
            body.split(", ").filter_map(|e| e.split_once(" : ")).map(|(_, ep)| nft_endpoint(ep, pods)).collect();
        return format!("DNAT to one of {n} endpoints, picked at random (numgen random mod {n}): {}", eps.join(", "));
    }
    if let Some(rest) = rule.strip_prefix("numgen random mod ") {
        let n = rest.split(' ').next().unwrap_or("?");
        return format!("picks one of {n} endpoint chains at random (numgen random mod {n})");
    }
    if let Some(to) = rule.split(" dnat to ").nth(1) {
        return format!("DNAT to {}", with_pod(to.split(' ').next().unwrap_or(to), pods));
    }
    if rule.starts_with("update @affinity-") {
        return "remembers the client's address (ClientIP affinity)".into();
    }
    if let Some(rest) = rule.strip_prefix("ip saddr @affinity-") {
        let to = rest.split("goto ").nth(1).unwrap_or("?");
        return format!("a client seen within the affinity time goes back to {to}");
    }
    if let Some(rest) = rule.strip_prefix("ip saddr != ") {
        return format!("drops sources outside loadBalancerSourceRanges ({})", rest.trim_end_matches(" drop"));
    }
    match comment {
        Some("masquerade") => return "marks the packet for masquerade (the node's address becomes its source)".into(),
        Some("masquerade local traffic") => return "traffic from this node is marked for masquerade".into(),
        Some("short-circuit local traffic") => {
            return format!("traffic from this node goes to {} (cluster policy)", goto_of(rule));
        }
        Some("short-circuit pod traffic") => {
            return format!("traffic from pods skips the Local policy: {}", goto_of(rule));
        }
        _ => {}
    }
    if rule.ends_with("jump mark-for-masquerade") {
        return if rule.starts_with("ip daddr ") {
            "traffic to the cluster IP from outside the pod network is marked for masquerade".into()
        } else if rule.starts_with("ip saddr ") {
            "hairpin: the endpoint reaching itself is marked for masquerade".into()
        } else {
            "marks the packet for masquerade".into()
        };
    }
    if let Some(to) = rule.strip_prefix("goto ") {
        return format!("goes on to {to}");
    }
    rule.to_string()
}

fn goto_of(rule: &str) -> &str {
    rule.split("goto ").nth(1).and_then(|r| r.split(' ').next()).unwrap_or("?")
}

/// The Service's map elements and chains in one node's table.
fn nft_chains(
    svc: &serde_json::Value,
    listing: &podpath_ruleset::nft::Listing,
    service: &str,
    pods: &BTreeMap<IpAddr, String>,
) -> Vec<Chain> {
    let marker = format!("-{service}/");
    let ips: Vec<String> = ["clusterIP"].iter().filter_map(|k| svc["spec"][k].as_str().map(str::to_string)).collect();
    let mut out = vec![];
    for map in [
        "firewall-ips",
        "service-ips",
        "service-nodeports",
        "no-endpoint-services",
        "no-endpoint-nodeports",
        "cluster-ips",
    ] {
        let Some(elements) = listing.sets.get(map) else { continue };
        let mine: Vec<&String> = elements
            .iter()
            .filter(|e| {
                e.contains(&marker)
                    || e.contains(&format!("comment \"{service}\""))
                    || e.contains(&format!("comment \"{service}:"))
                    || (map == "cluster-ips" && ips.iter().any(|ip| *e == ip))
            })
            .collect();
        if mine.is_empty() {
            continue;
        }
        out.push(Chain {
            table: "ip kube-proxy".into(),
            chain: format!("map {map}"),
            purpose: nft_map_purpose(map).into(),
            rules: mine
                .iter()
                .map(|e| RuleWords { rule: e.to_string(), words: nft_element_words(map, e, svc) })
                .collect(),
            shares: vec![],
        });
    }
    // shared-maps: the Service's addresses (its elements' keys) lead to its endpoints in the
    // shared map and to the shared DNAT chains of its endpoint count.
    let mut frontends: Vec<String> = vec![];
    let mut shared_chains: BTreeSet<String> = BTreeSet::new();
    for c in &out {
        for r in &c.rules {
            let (key, value) = r.rule.split_once(" : ").unwrap_or((&r.rule, ""));
            let key = key.split(" comment ").next().unwrap_or(key);
            let Some(chain) = value.strip_prefix("goto ").filter(|v| v.starts_with("lb-")) else { continue };
            shared_chains.insert(chain.to_string());
            if let Some(n) = chain.strip_prefix("lb-ext-") {
                shared_chains.insert(format!("lb-{n}"));
            }
            match c.chain.as_str() {
                "map service-nodeports" => {
                    for node_ip in listing.sets.get("nodeport-ips").into_iter().flatten() {
                        frontends.push(format!("{node_ip} . {key}"));
                    }
                }
                _ => frontends.push(key.to_string()),
            }
        }
    }
    // New connections to the cluster IP (or the first address) pick each endpoint 1 in N.
    let mut shared_shares = vec![];
    if let Some(elements) = listing.sets.get("endpoints") {
        let mine: Vec<&String> =
            elements.iter().filter(|e| frontends.iter().any(|f| e.starts_with(&format!("{f} . ")))).collect();
        let first =
            frontends.iter().find(|f| ips.iter().any(|ip| f.starts_with(&format!("{ip} . ")))).or(frontends.first());
        if let Some(f) = first {
            let of_first: Vec<&&String> = mine.iter().filter(|e| e.starts_with(&format!("{f} . "))).collect();
            for e in &of_first {
                let endpoint = e.split(" : ").nth(1).unwrap_or("").replace(" . ", ":");
                let p = 1.0 / of_first.len() as f64;
                shared_shares.push(Share { endpoint: with_pod(&endpoint, pods), rule_probability: p, share: p });
            }
        }
        if !mine.is_empty() {
            let rules: Vec<RuleWords> = mine
                .iter()
                .map(|e| {
                    let (key, value) = e.split_once(" : ").unwrap_or((e, ""));
                    let words = match key.split(" . ").collect::<Vec<_>>().as_slice() {
                        [ip, proto, port, index] => {
                            format!("{ip}:{port}/{proto} endpoint {index} is {}", nft_endpoint(value, pods))
                        }
                        _ => e.to_string(),
                    };
                    RuleWords { rule: e.to_string(), words }
                })
                .collect();
            out.push(Chain {
                table: "ip kube-proxy".into(),
                chain: "map endpoints".into(),
                purpose: nft_map_purpose("endpoints").into(),
                rules,
                shares: vec![],
            });
        }
    }
    for name in shared_chains.iter().rev() {
        let Some(rules) = listing.chains.get(name) else { continue };
        let n = name.rsplit('-').next().unwrap_or("?");
        let purpose = if name.starts_with("lb-ext-") {
            format!("traffic from outside the cluster to a Service port with {n} endpoints: masquerade, then lb-{n} (shared by every such Service port)")
        } else {
            format!("the DNAT of every Service port with {n} endpoints (shared by all of them)")
        };
        out.push(Chain {
            table: "ip kube-proxy".into(),
            chain: name.clone(),
            purpose,
            rules: rules.iter().map(|r| RuleWords { rule: r.clone(), words: nft_rule_words(r, pods) }).collect(),
            shares: if name.starts_with("lb-ext-") { vec![] } else { shared_shares.clone() },
        });
    }
    // The Service's chains in the order a packet meets them.
    let rank = |c: &str| match c.split('-').next().unwrap_or("") {
        "firewall" => 0,
        "external" => 1,
        "service" => 2,
        "local" => 3,
        _ => 4,
    };
    let mut chains: Vec<(&String, &Vec<String>)> = listing.chains.iter().filter(|(c, _)| c.contains(&marker)).collect();
    chains.sort_by_key(|(c, _)| (rank(c), c.to_string()));
    for (name, rules) in chains {
        let mut shares = vec![];
        for r in rules {
            if let Some(rest) = r.split("numgen random mod ").nth(1) {
                let n: usize = rest.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(1);
                let body = rest.split("map { ").nth(1).or_else(|| rest.split("vmap { ").nth(1)).unwrap_or("");
                for e in body.trim_end_matches(" }").split(", ").filter_map(|e| e.split_once(" : ")).map(|(_, v)| v) {
                    let endpoint = match e.strip_prefix("goto ") {
                        Some(chain) => chain.rsplit("__").next().unwrap_or(chain).replace('/', ":"),
                        None => e.replace(" . ", ":"),
                    };
                    let p = 1.0 / n as f64;
                    shares.push(Share { endpoint: with_pod(&endpoint, pods), rule_probability: p, share: p });
                }
            }
        }
        out.push(Chain {
            table: "ip kube-proxy".into(),
            chain: name.clone(),
            purpose: nft_chain_purpose(name).into(),
            rules: rules.iter().map(|r| RuleWords { rule: r.clone(), words: nft_rule_words(r, pods) }).collect(),
            shares,
        });
    }
    out
}

/// The explanation as text: per group of nodes, each chain with its purpose, each rule in
/// words with the rule itself under it, and the endpoints' shares.
pub fn text(e: &Explanation) -> String {
    let mut out = format!("Service {}\n", e.service);
    for s in &e.summary {
        out += &format!("  {s}\n");
    }
    for g in &e.groups {
        let same = if g.nodes.len() > 1 { " (the same rules on each)" } else { "" };
        out += &format!("\n{}{same}\n", g.nodes.join(", "));
        if g.chains.is_empty() {
            out += "  no rules for this Service\n";
        }
        for c in &g.chains {
            out += &format!("  {} {}: {}\n", c.table, c.chain, c.purpose);
            for r in &c.rules {
                out += &format!("    {}\n      {}\n", r.words, r.rule);
            }
            if !c.shares.is_empty() {
                out += "    new connections:";
                for s in &c.shares {
                    out += &format!(" {} {:.1}%;", s.endpoint, s.share * 100.0);
                }
                out.pop();
                out += "\n";
            }
        }
        if g.userspace {
            out += "  endpoints: node-agent's userspace proxy on the node picks one for each new connection, not \
                    iptables: the next in turn (round robin), and the next again after a refused connect";
            if let Some(secs) = e.affinity_seconds {
                out += &format!("; a client keeps its endpoint for {secs} s (ClientIP affinity)");
            }
            out += "\n";
            for p in &e.endpoints {
                let list = if p.endpoints.is_empty() { "none ready".to_string() } else { p.endpoints.join(", ") };
                out += &format!("    port {}: {list}\n", p.port);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOLDEN: &str = include_str!("../../kube-proxy/src/testdata/golden.rules");
    const USERSPACE: &str = include_str!("../../kube-proxy/src/testdata/userspace.rules");

    fn tables(save: &str) -> Vec<(String, String)> {
        // Split an iptables-save of several tables into (table, its text).
        let mut out: Vec<(String, String)> = Vec::new();
        for line in save.lines() {
            if let Some(t) = line.strip_prefix('*') {
                out.push((t.to_string(), String::new()));
            } else if let Some(last) = out.last_mut() {
                last.1 += line;
                last.1.push('\n');
            }
        }
        out
    }

    fn svc(ns: &str, name: &str) -> serde_json::Value {
        serde_json::json!({"metadata": {"namespace": ns, "name": name}, "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.41", "ports": [{"name": "p80", "port": 80, "targetPort": 8080}]}})
    }

    #[test]
    fn a_service_port_with_two_endpoints_in_words_with_their_shares() {
        let mut pods = BTreeMap::new();
        pods.insert("10.244.1.5".parse().unwrap(), "ns1/web-1".to_string());
        let nodes: BTreeMap<String, Vec<(String, String)>> =
            [("node-1".to_string(), tables(GOLDEN)), ("node-2".to_string(), tables(GOLDEN))].into();
        let e = explain(&svc("ns1", "svc1"), &[], &nodes, &pods);
        assert_eq!(e.groups.len(), 1, "the same rules on both nodes");
        assert_eq!(e.groups[0].nodes, ["node-1", "node-2"]);
        let names: Vec<&str> = e.groups[0].chains.iter().map(|c| c.chain.as_str()).collect();
        assert_eq!(
            names,
            ["KUBE-SERVICES", "KUBE-SVC-XPGD46QRK7WJZT7O", "KUBE-SEP-4DLQR6XP64U3IHTN", "KUBE-SEP-FTQDUIX2Y5S6ID6R"]
        );
        let words: Vec<&str> =
            e.groups[0].chains.iter().flat_map(|c| c.rules.iter().map(|r| r.words.as_str())).collect();
        assert_eq!(
            words,
            [
                "to 10.96.0.41:80/tcp (cluster IP) → KUBE-SVC-XPGD46QRK7WJZT7O",
                "from outside the pod network 10.244.0.0/16: mark for masquerade (0x4000), the reply must come back through this node",
                "endpoint 10.244.1.5:8080 (pod ns1/web-1) with probability 0.5",
                "endpoint 10.244.2.5:8080 (all that is left)",
                "the endpoint 10.244.1.5 reaching itself through the Service (hairpin): mark for masquerade",
                "rewrite the destination to 10.244.1.5:8080 (pod ns1/web-1)",
                "the endpoint 10.244.2.5 reaching itself through the Service (hairpin): mark for masquerade",
                "rewrite the destination to 10.244.2.5:8080",
            ]
        );
        let shares: Vec<f64> = e.groups[0].chains[1].shares.iter().map(|s| s.share).collect();
        assert_eq!(shares, [0.5, 0.5]);
        let text = text(&e);
        assert!(text.contains("node-1, node-2 (the same rules on each)"), "{text}");
        assert!(
            text.contains("new connections: 10.244.1.5:8080 (pod ns1/web-1) 50.0%; 10.244.2.5:8080 50.0%"),
            "{text}"
        );
    }

    #[test]
    fn three_endpoints_share_a_third_each_and_other_services_stay_out() {
        let nodes: BTreeMap<String, Vec<(String, String)>> = [("node-1".to_string(), tables(GOLDEN))].into();
        let e = explain(&svc("ns5", "svc5"), &[], &nodes, &BTreeMap::new());
        let chains = &e.groups[0].chains;
        let svc = chains.iter().find(|c| c.chain.starts_with("KUBE-SVC-")).unwrap();
        assert_eq!(svc.shares.len(), 3);
        assert!(svc.shares.iter().all(|s| (s.share - 1.0 / 3.0).abs() < 1e-6), "{:?}", svc.shares);
        // Its firewall chain and the filter rule that drops what the source ranges refuse.
        assert!(chains.iter().any(|c| c.chain.starts_with("KUBE-FW-")));
        let fw = chains.iter().find(|c| c.table == "filter" && c.chain == "KUBE-PROXY-FIREWALL").unwrap();
        assert!(
            fw.rules[0].words.starts_with("198.51.100.8:80/tcp: drop (ns5/svc5:p80 traffic not accepted"),
            "{fw:?}"
        );
        let all: String = chains.iter().flat_map(|c| c.rules.iter().map(|r| r.rule.clone())).collect();
        assert!(!all.contains("ns1/svc1") && !all.contains("ns2/svc2"), "{all}");
    }

    #[test]
    fn nodes_with_different_rules_are_shown_apart_and_userspace_rules_are_explained() {
        let nodes: BTreeMap<String, Vec<(String, String)>> =
            [("node-1".to_string(), tables(GOLDEN)), ("node-2".to_string(), tables(USERSPACE))].into();
        let any = USERSPACE.lines().find(|l| l.contains("REDIRECT --to-ports")).expect("a REDIRECT in the fixture");
        let any = podpath_ruleset::text::parse_rule_line(any).unwrap();
        let spn = any.comment_text().unwrap();
        let (ns, rest) = spn.split_once('/').unwrap();
        let name = rest.split(':').next().unwrap();
        // Two slices; a not-ready endpoint and a port of another name are left out.
        let slices = [
            serde_json::json!({"ports": [{"name": "p80", "port": 8080}], "endpoints": [
                {"addresses": ["10.244.1.5"], "conditions": {"ready": true}},
                {"addresses": ["10.244.2.9"], "conditions": {"ready": false}}]}),
            serde_json::json!({"ports": [{"name": "other", "port": 9999}], "endpoints": [{"addresses": ["10.244.3.3"]}]}),
            serde_json::json!({"ports": [{"name": "p80", "port": 8080}], "endpoints": [{"addresses": ["10.244.2.5"]}]}),
        ];
        let pods = BTreeMap::from([("10.244.1.5".parse().unwrap(), "ns1/web-1".to_string())]);
        let mut service = svc(ns, name);
        service["spec"]["sessionAffinity"] = "ClientIP".into();
        let e = explain(&service, &slices, &nodes, &pods);
        assert!(e.groups.iter().all(|g| g.nodes.len() == 1), "{e:?}");
        let user = e.groups.iter().find(|g| g.nodes == ["node-2"]).unwrap();
        let words: Vec<&str> = user.chains.iter().flat_map(|c| c.rules.iter().map(|r| r.words.as_str())).collect();
        assert!(words.iter().any(|w| w.contains(": redirect to the userspace proxy's port ")), "{words:?}");
        assert!(user.chains.iter().any(|c| c.purpose.starts_with("userspace mode: ")));
        // Who picks the endpoint: the proxy (node-2), iptables (node-1).
        assert!(user.userspace);
        assert!(!e.groups.iter().find(|g| g.nodes == ["node-1"]).unwrap().userspace);
        assert_eq!(
            e.endpoints,
            [PortEndpoints {
                port: "p80 (80/TCP)".into(),
                endpoints: vec!["10.244.1.5:8080 (pod ns1/web-1)".into(), "10.244.2.5:8080".into()]
            }]
        );
        let text = text(&e);
        let picks = text.split("\nnode-2\n").nth(1).expect("node-2's part");
        assert!(
            picks.contains("  endpoints: node-agent's userspace proxy on the node picks one for each new connection, not iptables: the next in turn (round robin), and the next again after a refused connect; a client keeps its endpoint for 10800 s (ClientIP affinity)\n    port p80 (80/TCP): 10.244.1.5:8080 (pod ns1/web-1), 10.244.2.5:8080\n"),
            "{text}"
        );
        assert!(!text.split("\nnode-2\n").next().unwrap().contains("userspace proxy on the node picks"), "{text}");
    }

    #[test]
    fn nftables_elements_and_chains_in_words() {
        let svc: serde_json::Value = serde_json::json!({
            "metadata": {"namespace": "demo", "name": "web"},
            "spec": {"type": "LoadBalancer", "clusterIP": "10.96.12.34", "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}]}
        });
        let listing = podpath_ruleset::nft::Listing::parse(
            "table ip kube-proxy {\n\
             \tset cluster-ips {\n\t\ttype ipv4_addr\n\t\telements = { 10.96.0.1, 10.96.12.34 }\n\t}\n\
             \tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\
             \t\telements = { 203.0.113.10 . tcp . 80 : goto external-AXK6CI2C-demo/web/tcp/http,\n\
             \t\t\t     10.96.12.34 . tcp . 80 : goto service-AXK6CI2C-demo/web/tcp/http,\n\
             \t\t\t     10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https }\n\t}\n\
             \tchain service-AXK6CI2C-demo/web/tcp/http {\n\
             \t\tmeta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.7 . 8080 }\n\t}\n\
             \tchain external-AXK6CI2C-demo/web/tcp/http {\n\
             \t\tmeta mark set meta mark | 0x00004000 comment \"masquerade\"\n\
             \t\tgoto service-AXK6CI2C-demo/web/tcp/http\n\t}\n}\n",
        );
        let pods = BTreeMap::from([("10.244.1.5".parse().unwrap(), "demo/web-a".to_string())]);
        let e = explain_nft(&svc, &[], &BTreeMap::from([("node-1".to_string(), listing)]), &pods);
        let t = text(&e);
        for want in [
            "ip kube-proxy map service-ips:",
            "10.96.12.34:80/tcp (the cluster IP) goes to service-AXK6CI2C-demo/web/tcp/http",
            "203.0.113.10:80/tcp (the LoadBalancer IP) goes to external-AXK6CI2C-demo/web/tcp/http",
            "10.96.12.34 (the cluster IP) is an active ClusterIP",
            "ip kube-proxy external-AXK6CI2C-demo/web/tcp/http: traffic from outside the cluster",
            "marks the packet for masquerade",
            "goes on to service-AXK6CI2C-demo/web/tcp/http",
            "DNAT to one of 2 endpoints, picked at random (numgen random mod 2): 10.244.1.5:8080 (pod demo/web-a), 10.244.2.7:8080",
            "new connections: 10.244.1.5:8080 (pod demo/web-a) 50.0%; 10.244.2.7:8080 50.0%",
        ] {
            assert!(t.contains(want), "missing {want:?} in\n{t}");
        }
        assert!(!t.contains("kubernetes"), "another Service's elements stay out:\n{t}");
        // External before service chain: the order a packet meets them.
        assert!(t.find("external-AXK6CI2C").unwrap() < t.find("ip kube-proxy service-AXK6CI2C").unwrap());
    }
}
