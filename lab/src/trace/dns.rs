//! A trace of a request made by name: the lookup as the pod's resolver makes it. Pure: the
//! pod's `resolv.conf` read ([`ResolvConf::parse`]), the names tried in glibc's order
//! ([`candidates`]), and the words for each answer ([`describe`]); `run` sends the queries.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Serialize;

/// What a resolver takes from `/etc/resolv.conf`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResolvConf {
    pub nameservers: Vec<IpAddr>,
    pub search: Vec<String>,
    pub ndots: usize,
}

impl ResolvConf {
    /// glibc's reading: the last `search` (or `domain`) line wins, `options ndots:N` (default 1,
    /// at most 15), nameservers of both families in order.
    pub fn parse(text: &str) -> ResolvConf {
        let mut rc = ResolvConf { nameservers: vec![], search: vec![], ndots: 1 };
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or("");
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(ip) = words.next().and_then(|w| w.parse().ok()) {
                        rc.nameservers.push(ip);
                    }
                }
                Some("search" | "domain") => {
                    rc.search = words.map(|w| w.trim_end_matches('.').to_string()).filter(|w| !w.is_empty()).collect()
                }
                Some("options") => {
                    for o in words {
                        if let Some(n) = o.strip_prefix("ndots:").and_then(|n| n.parse::<usize>().ok()) {
                            rc.ndots = n.min(15);
                        }
                    }
                }
                _ => {}
            }
        }
        rc
    }
}

/// The fully qualified names a resolver tries for `name`, in order: a name ending in a dot is
/// tried as it is, alone; a name with at least `ndots` dots as it is first, then with each
/// search domain; any other name with each search domain first, then as it is.
pub fn candidates(name: &str, rc: &ResolvConf) -> Vec<String> {
    if let Some(absolute) = name.strip_suffix('.') {
        return vec![format!("{absolute}.")];
    }
    let searched = rc.search.iter().map(|d| format!("{name}.{d}."));
    let as_is = format!("{name}.");
    if name.matches('.').count() >= rc.ndots {
        std::iter::once(as_is).chain(searched).collect()
    } else {
        searched.chain(std::iter::once(as_is)).collect()
    }
}

/// One query the trace sent and what came back.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Query {
    /// The name asked.
    pub name: String,
    /// The record type asked: `A`, or `AAAA` in an IPv6-only lab.
    #[serde(rename = "type")]
    pub rtype: String,
    /// NOERROR, NXDOMAIN, REFUSED, … or `timeout`.
    pub rcode: String,
    /// The answer section, one record per line as a zone file writes it.
    pub answers: Vec<String>,
    pub millis: f64,
    /// The answer came truncated over UDP and was asked again over TCP.
    pub tcp: bool,
    /// Where the node's service proxy sent the query: the DNS pod that answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// The lookup before the connection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lookup {
    pub name: String,
    pub resolv: ResolvConf,
    pub queries: Vec<Query>,
    /// The address the request then went to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<IpAddr>,
    /// What owns that address (`ClusterIP of Service default/web`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// A response code as `dig` names it.
pub fn rcode_name(code: u16) -> String {
    match code {
        0 => "NOERROR".into(),
        1 => "FORMERR".into(),
        2 => "SERVFAIL".into(),
        3 => "NXDOMAIN".into(),
        4 => "NOTIMP".into(),
        5 => "REFUSED".into(),
        n => format!("RCODE{n}"),
    }
}

/// The first A or AAAA record's address of an answer, if there is one.
pub fn first_address(answers: &[String]) -> Option<IpAddr> {
    answers.iter().find_map(|r| {
        let w: Vec<&str> = r.split_whitespace().collect();
        (w.len() >= 5 && matches!(w[3], "A" | "AAAA")).then(|| w[4].parse().ok()).flatten()
    })
}

/// The Service or pod behind an address, from the API's cluster IPs and pod IPs.
pub fn describe(
    ip: IpAddr,
    cluster_ips: &BTreeMap<IpAddr, String>,
    pods: &BTreeMap<IpAddr, (String, String)>,
) -> Option<String> {
    if let Some(svc) = cluster_ips.get(&ip) {
        return Some(format!("ClusterIP of Service {svc}"));
    }
    pods.get(&ip).map(|(pod, node)| format!("pod {pod} on {node} (a headless Service's endpoint or a pod record)"))
}

/// The lookup in lines of text: how the resolver was set up, each query and its answer,
/// what the address is. Each line with its kind: `step`, `stop` (a failed query) or `answer`.
pub fn lines(l: &Lookup) -> Vec<(String, &'static str)> {
    let ns: Vec<String> = l.resolv.nameservers.iter().map(|n| n.to_string()).collect();
    let mut out = vec![(
        format!(
            "lookup {}: nameserver {}, search {}, ndots:{}",
            l.name,
            ns.join(" "),
            if l.resolv.search.is_empty() { "(none)".to_string() } else { l.resolv.search.join(" ") },
            l.resolv.ndots
        ),
        "step",
    )];
    for q in &l.queries {
        let via = q.answered_by.as_ref().map(|a| format!(", answered by {a}")).unwrap_or_default();
        let tcp = if q.tcp { ", truncated over UDP, asked again over TCP" } else { "" };
        let kind = if q.answers.is_empty() { "stop" } else { "answer" };
        out.push((format!("{}? {} → {} ({:.1} ms{tcp}{via})", q.rtype, q.name, q.rcode, q.millis), kind));
        for a in &q.answers {
            out.push((format!("  {a}"), "answer"));
        }
    }
    match (l.address, &l.owner) {
        (Some(ip), Some(owner)) => out.push((format!("{ip} is the {owner}"), "answer")),
        (Some(ip), None) => out.push((format!("{ip}: no Service or pod of the cluster has it"), "step")),
        (None, _) => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_conf() -> ResolvConf {
        ResolvConf::parse(
            "search team.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
        )
    }

    #[test]
    fn kubelets_resolv_conf_reads_back() {
        let rc = pod_conf();
        assert_eq!(rc.nameservers, ["10.96.0.10".parse::<IpAddr>().unwrap()]);
        assert_eq!(rc.search, ["team.svc.cluster.local", "svc.cluster.local", "cluster.local"]);
        assert_eq!(rc.ndots, 5);
        let host =
            ResolvConf::parse("# generated\ndomain lab.\nsearch a b\nnameserver fd00::1\nnameserver 1.1.1.1 ; x\n");
        assert_eq!((host.search, host.ndots), (vec!["a".to_string(), "b".to_string()], 1));
        // Both families, in order (an IPv6-only lab's pods have an IPv6 nameserver).
        assert_eq!(host.nameservers, ["fd00::1".parse::<IpAddr>().unwrap(), "1.1.1.1".parse().unwrap()]);
        assert_eq!(ResolvConf::parse("options ndots:40").ndots, 15);
    }

    #[test]
    fn ndots_decides_whether_the_search_list_comes_first() {
        let rc = pod_conf();
        assert_eq!(
            candidates("web", &rc),
            ["web.team.svc.cluster.local.", "web.svc.cluster.local.", "web.cluster.local.", "web."]
        );
        // Four dots are fewer than five: even the full name is searched first.
        assert_eq!(
            candidates("web.default.svc.cluster.local", &rc)[0],
            "web.default.svc.cluster.local.team.svc.cluster.local."
        );
        assert_eq!(candidates("web.default.svc.cluster.local", &rc).last().unwrap(), "web.default.svc.cluster.local.");
        // A trailing dot: that name only.
        assert_eq!(candidates("web.default.svc.cluster.local.", &rc), ["web.default.svc.cluster.local."]);
        let one = ResolvConf { ndots: 1, ..rc };
        assert_eq!(candidates("web.default", &one)[0], "web.default.");
    }

    #[test]
    fn answers_name_their_owner() {
        let answers = vec!["web.default.svc.cluster.local. 30 IN A 10.96.0.42".to_string()];
        let ip = first_address(&answers).unwrap();
        assert_eq!(ip, IpAddr::from([10, 96, 0, 42]));
        let svcs = BTreeMap::from([(ip, "default/web".to_string())]);
        let pods =
            BTreeMap::from([(IpAddr::from([10, 244, 1, 5]), ("default/db-0".to_string(), "node-1".to_string()))]);
        assert_eq!(describe(ip, &svcs, &pods).unwrap(), "ClusterIP of Service default/web");
        assert!(describe(IpAddr::from([10, 244, 1, 5]), &svcs, &pods)
            .unwrap()
            .starts_with("pod default/db-0 on node-1"));
        assert_eq!(first_address(&["x. 30 IN CNAME example.org.".to_string()]), None);
    }

    #[test]
    fn a_lookup_reads_as_the_resolver_went() {
        let q = |name: &str, rcode: &str, answers: &[&str]| Query {
            name: name.into(),
            rtype: "A".into(),
            rcode: rcode.into(),
            answers: answers.iter().map(|a| a.to_string()).collect(),
            millis: 1.25,
            tcp: false,
            answered_by: Some("pod kube-system/coredns-a 10.244.1.3:53 (the node's DNAT of 10.96.0.10:53)".into()),
        };
        let l = Lookup {
            name: "web.default".into(),
            resolv: pod_conf(),
            queries: vec![
                q("web.default.team.svc.cluster.local.", "NXDOMAIN", &[]),
                q("web.default.svc.cluster.local.", "NOERROR", &["web.default.svc.cluster.local. 30 IN A 10.96.0.42"]),
            ],
            address: Some(IpAddr::from([10, 96, 0, 42])),
            owner: Some("ClusterIP of Service default/web".into()),
        };
        let text: Vec<String> = lines(&l).into_iter().map(|(t, _)| t).collect();
        assert_eq!(
            text,
            [
                "lookup web.default: nameserver 10.96.0.10, search team.svc.cluster.local svc.cluster.local cluster.local, ndots:5",
                "A? web.default.team.svc.cluster.local. → NXDOMAIN (1.2 ms, answered by pod kube-system/coredns-a 10.244.1.3:53 (the node's DNAT of 10.96.0.10:53))",
                "A? web.default.svc.cluster.local. → NOERROR (1.2 ms, answered by pod kube-system/coredns-a 10.244.1.3:53 (the node's DNAT of 10.96.0.10:53))",
                "  web.default.svc.cluster.local. 30 IN A 10.96.0.42",
                "10.96.0.42 is the ClusterIP of Service default/web",
            ]
        );
    }
}
