//! A node's rule hits in words, nftables mode (pure): the walk through the table
//! `ip kube-proxy` that mattered, naming the map element that sent the packet on (looked up in
//! the node's listing by the packet's own key and the verdict the trace printed), the `numgen`
//! element that chose the endpoint, the DNAT, masquerade or reject rule, and the Service and
//! endpoint behind them (kube-proxy's chain names carry `ns/svc/proto/port`).

use std::net::SocketAddr;

use podpath_ruleset::nft::Listing;

use super::model::{name_of, Objects, Step};
use super::parse::{Observation, RuleHit};

/// The table the nftables mode writes.
pub const TABLE: &str = "kube-proxy";

/// `service-SUSTUHLJ-default/web/tcp/http` → `default/web:http` (the form of the iptables
/// mode's comments); `endpoint-…-default/web/tcp/http__10.244.1.3/8080` → the same. None for
/// chains that belong to no Service.
pub(crate) fn service_of_chain(chain: &str) -> Option<String> {
    let (prefix, rest) = chain.split_once('-')?;
    if !matches!(prefix, "service" | "external" | "endpoint" | "firewall") {
        return None;
    }
    let (hash, base) = rest.split_once('-')?;
    if hash.len() != 8 {
        return None;
    }
    let base = base.split("__").next()?;
    let mut f = base.split('/');
    let (ns, svc, _proto, port) = (f.next()?, f.next()?, f.next()?, f.next().unwrap_or(""));
    Some(if port.is_empty() { format!("{ns}/{svc}") } else { format!("{ns}/{svc}:{port}") })
}

/// The named map a rule looks up (`… vmap @service-ips` → `service-ips`).
fn named_map(rule: &str) -> Option<&str> {
    let (_, rest) = rule.split_once("vmap @")?;
    rest.split_whitespace().next()
}

/// A trace verdict as a map value: `GOTO:x` → `goto x`.
fn map_value(verdict: &str) -> String {
    match verdict.split_once(':') {
        Some((kind, chain)) => format!("{} {chain}", kind.to_ascii_lowercase()),
        None => verdict.to_ascii_lowercase(),
    }
}

/// The element of `map` in the node's listing that gave this verdict to this packet: its value
/// is the verdict, and each field of its key is one of the packet's (destination, protocol,
/// port). The whole element as `nft list` prints it.
fn element_of(listing: Option<&Listing>, map: &str, o: &Observation, verdict: &str) -> Option<String> {
    let elements = listing?.sets.get(map)?;
    let value = format!(" : {}", map_value(verdict));
    let fields = [o.dst.ip().to_string(), o.proto.to_ascii_lowercase(), o.dst.port().to_string()];
    let candidates: Vec<&String> = elements.iter().filter(|e| e.ends_with(&value)).collect();
    let matches_packet = |e: &&&String| {
        let key = e.split(" comment ").next().unwrap_or(e).split(" : ").next().unwrap_or("");
        key.split(" . ").all(|k| fields.iter().any(|f| f == k))
    };
    candidates.iter().find(matches_packet).or(candidates.first()).map(|e| e.to_string())
}

/// The entries of an anonymous map in a rule (`numgen random mod 2 map { 0 : a . p, 1 : … }`).
fn anonymous_map(rule: &str) -> Vec<(String, String)> {
    let Some((_, body)) = rule.split_once("map { ") else { return vec![] };
    let body = body.split(" }").next().unwrap_or("");
    body.split(", ")
        .filter_map(|e| e.split_once(" : ").map(|(k, v)| (k.trim().to_string(), v.trim().to_string())))
        .collect()
}

/// `numgen random mod 2` → 2.
fn numgen_mod(rule: &str) -> Option<usize> {
    rule.split_once("numgen random mod ")?.1.split_whitespace().next()?.parse().ok()
}

/// What a DNAT rule translated to, and how the endpoint was chosen: the address the packet
/// carried next (`after`), found among the `numgen` map's entries; or the rule's one address.
fn dnat_choice(rule: &str, after: Option<SocketAddr>) -> (Option<SocketAddr>, String) {
    let entries = anonymous_map(rule);
    if !entries.is_empty() {
        let n = numgen_mod(rule).unwrap_or(entries.len());
        let chosen = after.and_then(|a| {
            let v = format!("{} . {}", a.ip(), a.port());
            entries.iter().find(|(_, e)| *e == v).map(|(k, e)| (a, format!("{k} : {e}")))
        });
        return match chosen {
            Some((a, e)) if n == 1 => (Some(a), format!(": numgen random mod 1, the only element {e}")),
            Some((a, e)) => (Some(a), format!(": numgen random mod {n} picked element {e} (each endpoint 1 in {n})")),
            None => (after, format!(": numgen random mod {n} over {} endpoints", entries.len())),
        };
    }
    // `dnat to 10.244.1.3:8080` (a per-endpoint chain).
    let to = rule
        .split_once("dnat to ")
        .or_else(|| rule.split_once("dnat ip to "))
        .and_then(|(_, r)| r.split_whitespace().next())
        .and_then(|a| a.parse::<SocketAddr>().ok());
    (to.or(after), String::new())
}

/// The walk, the masquerade note and the decisive steps of one packet through the table
/// `ip kube-proxy` at one hook. `after`: the packet's destination at the next hook (what a
/// DNAT made of it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn observation_steps(
    host: &str,
    o: &Observation,
    after: Option<SocketAddr>,
    listing: Option<&Listing>,
    objects: &Objects,
    masq_src: Option<SocketAddr>,
    stopped: &mut Option<String>,
    service: &mut Option<String>,
) -> Vec<Step> {
    let rules: Vec<&RuleHit> = o.hits.iter().filter(|h| h.kind == "rule").collect();
    let mut words: Vec<String> = Vec::new();
    let mut decisive: Vec<Step> = Vec::new();
    let mut relevant = false;
    // The last named-map element that sent the packet on (a reject says which Service).
    let mut last_element: Option<(String, String)> = None;
    // Why the older layout jumped to `mark-for-masquerade` (the jump's comment, or hairpin).
    let mut mark_reason: Option<String> = None;
    for (k, h) in rules.iter().enumerate() {
        let text = h.rule.clone().unwrap_or_default();
        if let Some(target) = h.target_chain() {
            // A jump into a chain that matched nothing there (the packet came back) is left out.
            if rules.get(k + 1).is_none_or(|n| n.chain != target) {
                continue;
            }
            if let Some(svc) = service_of_chain(target) {
                *service = Some(svc);
                relevant = true;
            }
            if target == "mark-for-masquerade" {
                mark_reason = comment_of(&text).or_else(|| {
                    (h.chain.starts_with("endpoint-") && text.starts_with("ip saddr "))
                        .then(|| "hairpin: the client is this endpoint".to_string())
                });
            }
            let how = if let Some(map) = named_map(&text) {
                let element = element_of(listing, map, o, &h.verdict);
                if let Some(c) = element.as_deref().and_then(comment_of) {
                    *service = Some(c);
                    relevant = true;
                }
                let shown = element.clone().unwrap_or_else(|| format!("? : {}", map_value(&h.verdict)));
                last_element = Some((map.to_string(), shown.clone()));
                format!(" (map {map} element {shown})")
            } else if text.contains("vmap { ") {
                let value = map_value(&h.verdict);
                let n = numgen_mod(&text).unwrap_or(0);
                match anonymous_map(&text).into_iter().find(|(_, v)| *v == value) {
                    Some((key, _)) if n > 1 => format!(" (numgen random mod {n} picked element {key}, 1 in {n})"),
                    Some((key, _)) => format!(" (numgen random mod {n}, the only element {key})"),
                    None => String::new(),
                }
            } else if let Some(set) = text.split_whitespace().find_map(|w| w.strip_prefix("@affinity-")) {
                format!(" (ClientIP affinity: the client is in set affinity-{set})")
            } else {
                String::new()
            };
            let line = format!("→ {target}{how}");
            if words.is_empty() {
                words.push(format!("{} {line}", h.chain));
            } else {
                words.push(line);
            }
            continue;
        }
        if text.contains("meta mark set meta mark | ") {
            let policy = service.as_deref().and_then(|s| objects.traffic_policy.get(s.split(':').next().unwrap_or(s)));
            let why = comment_of(&text).or(mark_reason.take());
            let note = match (policy, why) {
                (_, Some(c)) if c.starts_with("hairpin") => format!("; masquerade mark 0x4000 ({c})"),
                (_, Some(c)) if c != "masquerade" => format!("; masquerade mark 0x4000 (\"{c}\")"),
                (Some(p), _) => format!("; masquerade mark 0x4000 (externalTrafficPolicy: {p})"),
                (None, _) => "; masquerade mark 0x4000".to_string(),
            };
            match words.last_mut() {
                Some(last) => last.push_str(&note),
                None => words.push(format!("{}{note}", h.chain).replacen(';', ":", 1)),
            }
            relevant = true;
            continue;
        }
        match h.verdict.as_str() {
            // Before DNAT: the hairpin rule's `ct status dnat` is a match, not a translation.
            "ACCEPT" if text.contains("masquerade") => {
                relevant = true;
                let hairpin = text.contains("@hairpin-connections").then(|| {
                    // The element is the packet's own source . destination . protocol . port.
                    let key = format!(
                        "{} . {} . {} . {}",
                        o.src.ip(),
                        after.unwrap_or(o.dst).ip(),
                        o.proto.to_ascii_lowercase(),
                        after.unwrap_or(o.dst).port()
                    );
                    format!(" (set hairpin-connections element {key}: a pod reached itself through its Service)")
                });
                decisive.push(Step {
                    kind: "snat".into(),
                    text: format!(
                        "{} masquerade{}{}",
                        h.chain,
                        masq_src.map(|a| format!(" → source {a}")).unwrap_or_default(),
                        hairpin.unwrap_or_default()
                    ),
                    rule: Some(format!("{}: {text}", h.chain)),
                    object: service.as_ref().map(|s| format!("Service {s}")),
                });
            }
            "ACCEPT" if text.contains("dnat ") => {
                relevant = true;
                let (to, mut how) = dnat_choice(&text, after);
                // shared-maps: the endpoint is an element of a named map under the packet's
                // own address . protocol . port and the numgen index.
                if let (Some(map), Some(a)) = (text.split_once("map @").map(|(_, m)| m.trim()), to) {
                    let prefix = format!("{} . {} . {} . ", o.dst.ip(), o.proto.to_ascii_lowercase(), o.dst.port());
                    let value = format!(" : {} . {}", a.ip(), a.port());
                    let n = numgen_mod(&text).unwrap_or(0);
                    let element = listing
                        .and_then(|l| l.sets.get(map))
                        .and_then(|els| els.iter().find(|e| e.starts_with(&prefix) && e.ends_with(&value)));
                    if let Some(e) = element {
                        how = format!(": numgen random mod {n} picked map {map} element {e}");
                    }
                }
                let to_text = to.map(|a| a.to_string()).unwrap_or_else(|| "?".into());
                let who = to.and_then(|a| name_of(objects, a.ip())).map(|n| format!(" ({n})")).unwrap_or_default();
                decisive.push(Step {
                    kind: "dnat".into(),
                    text: format!("DNAT {to_text}{who}{how}"),
                    rule: Some(format!("{}: {text}", h.chain)),
                    object: service.as_ref().map(|s| format!("EndpointSlice endpoint of Service {s}")),
                });
            }
            "DROP" => {
                relevant = true;
                let why = match &last_element {
                    // The chain step names the element; the stop says what it means.
                    Some((map, _)) if map.starts_with("no-endpoint") => {
                        format!(" — {} has no ready endpoints", service_words(service))
                    }
                    Some((map, _)) if map == "firewall-ips" => {
                        format!(" — the source is outside {}'s loadBalancerSourceRanges", service_words(service))
                    }
                    _ => comment_of(&text).map(|c| format!(" — {c}")).unwrap_or_default(),
                };
                let verb = if text.contains("reject") { "rejected" } else { "dropped" };
                let line = format!("{} {verb}{why}", h.chain);
                *stopped = Some(format!("{host}: {line}"));
                decisive.push(Step {
                    kind: "stop".into(),
                    text: line,
                    rule: Some(format!("{}: {text}", h.chain)),
                    object: service.as_ref().map(|s| format!("Service {s}")),
                });
            }
            _ => {}
        }
    }
    let mut steps = Vec::new();
    super::steps::push_walk(&mut steps, relevant, &words, service, decisive);
    steps
}

/// A rule's or element's `comment "…"` (`10.111.98.83 . tcp . 80 comment "default/empty:http"
/// : goto …`).
fn comment_of(rule: &str) -> Option<String> {
    let (_, rest) = rule.split_once("comment \"")?;
    rest.split_once('"').map(|(c, _)| c.to_string())
}

fn service_words(service: &Option<String>) -> String {
    service.as_ref().map(|s| format!("Service {s}")).unwrap_or_else(|| "the Service".into())
}

/// Whether an observation is a packet in the table `ip kube-proxy`.
pub(crate) fn is_kube_proxy(o: &Observation) -> bool {
    o.hits.first().is_some_and(|h| h.table == TABLE)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::super::parse::parse_nft_monitor;
    use super::super::steps::node_steps;
    use super::*;

    // What `nft monitor trace` printed on node-1 of a 3-node lab for a request from the
    // external client to a LoadBalancer IP (ether fields cut), and for one from a pod to a
    // Service without endpoints.
    const LB: &str = r#"trace id 1464d003 ip podpath-trace probe packet: iif "eth0" ip saddr 203.0.113.10 ip daddr 198.51.100.1 ip dscp 0x2d ip ecn not-ect ip ttl 63 ip id 22001 ip length 60 tcp sport 52316 tcp dport 80 tcp flags == syn tcp window 64240 
trace id 1464d003 ip podpath-trace probe rule ip dscp 0x2d tcp flags syn / syn,ack meta nftrace set 1 (verdict continue)
trace id 1464d003 ip podpath-trace prerouting policy accept 
trace id 1464d003 ip kube-proxy filter-prerouting-pre-dnat packet: iif "eth0" ip saddr 203.0.113.10 ip daddr 198.51.100.1 ip dscp 0x2d ip ecn not-ect ip ttl 63 ip id 22001 ip length 60 tcp sport 52316 tcp dport 80 tcp flags == syn tcp window 64240 
trace id 1464d003 ip kube-proxy filter-prerouting-pre-dnat rule ct state new jump firewall-check (verdict jump firewall-check)
trace id 1464d003 ip kube-proxy filter-prerouting-pre-dnat policy accept 
trace id 1464d003 ip kube-proxy nat-prerouting packet: iif "eth0" ip saddr 203.0.113.10 ip daddr 198.51.100.1 ip dscp 0x2d ip ecn not-ect ip ttl 63 ip id 22001 ip length 60 tcp sport 52316 tcp dport 80 tcp flags == syn tcp window 64240 
trace id 1464d003 ip kube-proxy nat-prerouting rule jump services (verdict jump services)
trace id 1464d003 ip kube-proxy services rule ip daddr . meta l4proto . th dport vmap @service-ips (verdict goto external-SUSTUHLJ-default/web/tcp/http)
trace id 1464d003 ip kube-proxy external-SUSTUHLJ-default/web/tcp/http rule meta mark set meta mark | 0x00004000 comment "masquerade" (verdict continue)
trace id 1464d003 ip kube-proxy external-SUSTUHLJ-default/web/tcp/http rule goto service-SUSTUHLJ-default/web/tcp/http (verdict goto service-SUSTUHLJ-default/web/tcp/http)
trace id 1464d003 ip kube-proxy service-SUSTUHLJ-default/web/tcp/http rule meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.3 . 8080, 1 : 10.244.2.3 . 8080 } (verdict accept)
trace id 1464d003 ip kube-proxy filter-forward packet: iif "eth0" oif "cni0" ip saddr 203.0.113.10 ip daddr 10.244.2.3 ip dscp 0x2d ip ecn not-ect ip ttl 62 ip id 22001 ip length 60 tcp sport 52316 tcp dport 8080 tcp flags == syn tcp window 64240 
trace id 1464d003 ip kube-proxy filter-forward rule ct state new jump service-endpoints-check (verdict jump service-endpoints-check)
trace id 1464d003 ip kube-proxy filter-forward rule ct state new jump cluster-ips-check (verdict jump cluster-ips-check)
trace id 1464d003 ip kube-proxy filter-forward policy accept meta mark 0x00004000 
trace id 1464d003 ip kube-proxy nat-postrouting packet: iif "eth0" oif "cni0" ip saddr 203.0.113.10 ip daddr 10.244.2.3 ip dscp 0x2d ip ecn not-ect ip ttl 62 ip id 22001 ip length 60 tcp sport 52316 tcp dport 8080 tcp flags == syn tcp window 64240 
trace id 1464d003 ip kube-proxy nat-postrouting rule jump masquerading (verdict jump masquerading)
trace id 1464d003 ip kube-proxy masquerading rule meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random (verdict accept)
trace id 1f6b99d7 ip kube-proxy filter-prerouting-pre-dnat packet: iif "eth0" ip saddr 203.0.113.10 ip daddr 198.51.100.1 ip dscp 0x2d ip ecn not-ect ip ttl 63 ip id 22005 ip length 52 tcp sport 52316 tcp dport 80 tcp flags == 0x14 tcp window 63 
"#;
    const REJECT: &str = r#"trace id b69b47ed ip kube-proxy filter-forward packet: iif "cni0" oif "eth0" ip saddr 10.244.1.3 ip daddr 10.111.98.83 ip dscp 0x2d ip ecn not-ect ip ttl 63 ip id 62372 ip length 60 tcp sport 55438 tcp dport 80 tcp flags == syn tcp window 64240 
trace id b69b47ed ip kube-proxy filter-forward rule ct state new jump service-endpoints-check (verdict jump service-endpoints-check)
trace id b69b47ed ip kube-proxy service-endpoints-check rule ip daddr . meta l4proto . th dport vmap @no-endpoint-services (verdict goto reject-chain)
trace id b69b47ed ip kube-proxy reject-chain rule reject (verdict drop)
"#;
    const TABLE_TEXT: &str = "table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"
		elements = { 198.51.100.1 . tcp . 80 : goto external-SUSTUHLJ-default/web/tcp/http,
			     10.105.12.209 . tcp . 80 : goto service-SUSTUHLJ-default/web/tcp/http }
	}
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.111.98.83 . tcp . 80 comment \"default/empty:http\" : goto reject-chain }
	}
}
";

    fn objects() -> Objects {
        let mut o = Objects::default();
        o.pods.insert(Ipv4Addr::new(10, 244, 2, 3).into(), ("default/web-2".into(), "node-2".into()));
        o.traffic_policy.insert("default/web".into(), "Cluster".into());
        o.nft_tables.insert("node-1".into(), TABLE_TEXT.into());
        o
    }

    #[test]
    fn nft_monitor_output_becomes_observations() {
        let obs = parse_nft_monitor(LB);
        assert_eq!(obs.len(), 6, "one per packet line");
        let nat = &obs[2];
        assert_eq!(nat.hook().as_deref(), Some("kube-proxy:nat-prerouting"));
        assert_eq!((nat.iif.as_deref(), nat.oif.as_deref()), (Some("eth0"), None));
        assert_eq!((nat.src, nat.dst), ("203.0.113.10:52316".parse().unwrap(), "198.51.100.1:80".parse().unwrap()));
        assert!(nat.is_syn() && nat.proto == "TCP");
        assert_eq!((nat.ttl, nat.tos, nat.ip_id), (63, 0xb4, 22001));
        assert_eq!(nat.hits[1].target_chain(), Some("external-SUSTUHLJ-default/web/tcp/http"));
        assert_eq!(nat.hits[1].rule.as_deref(), Some("ip daddr . meta l4proto . th dport vmap @service-ips"));
        assert_eq!(nat.hits[4].verdict, "ACCEPT");
        assert_eq!(obs[3].oif.as_deref(), Some("cni0"));
        assert_eq!(obs[3].mark.as_deref(), Some("0x4000"), "from the policy line");
        assert_eq!(obs[3].hits.last().map(|h| h.kind.as_str()), Some("policy"));
        assert_eq!(obs[5].flags, ["RST", "ACK"], "0x14");
        assert!(!obs[5].is_syn());
        let named = parse_nft_monitor("trace id 1 ip t c packet: ip saddr 1.1.1.1 ip daddr 2.2.2.2 ip dscp af21 tcp sport 1 tcp dport 2 tcp flags == syn | ack tcp window 1\n");
        assert!(named[0].is_syn_ack());
        assert_eq!(named[0].tos, 18 << 2);
    }

    #[test]
    fn the_walk_names_the_map_element_the_numgen_choice_and_the_rules() {
        let obs = parse_nft_monitor(LB);
        let syn: Vec<&Observation> = obs.iter().filter(|o| o.is_syn()).collect();
        let masq = Some("192.168.56.11:27018".parse().unwrap());
        let mut stopped = None;
        let steps = node_steps("node-1", &syn, &objects(), masq, &mut stopped);
        let texts: Vec<&str> = steps.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "nat-prerouting → services\n→ external-SUSTUHLJ-default/web/tcp/http (map service-ips element 198.51.100.1 . tcp . 80 : goto external-SUSTUHLJ-default/web/tcp/http); masquerade mark 0x4000 (externalTrafficPolicy: Cluster)\n→ service-SUSTUHLJ-default/web/tcp/http",
                "DNAT 10.244.2.3:8080 (pod default/web-2): numgen random mod 2 picked element 1 : 10.244.2.3 . 8080 (each endpoint 1 in 2)",
                "nat-postrouting → masquerading",
                "masquerading masquerade → source 192.168.56.11:27018",
            ]
        );
        assert_eq!(steps[1].object.as_deref(), Some("EndpointSlice endpoint of Service default/web:http"));
        assert!(steps[1].rule.as_deref().is_some_and(
            |r| r.starts_with("service-SUSTUHLJ-default/web/tcp/http: meta l4proto tcp dnat ip to numgen")
        ));
        assert_eq!(steps[0].object.as_deref(), Some("Service default/web:http"));
        assert_eq!(stopped, None);
    }

    #[test]
    fn a_reject_names_the_no_endpoints_element_and_stops_there() {
        let obs = parse_nft_monitor(REJECT);
        let mut stopped = None;
        let steps = node_steps("node-1", &obs.iter().collect::<Vec<_>>(), &objects(), None, &mut stopped);
        assert_eq!(
            steps[0].text,
            "filter-forward → service-endpoints-check\n→ reject-chain (map no-endpoint-services element 10.111.98.83 . tcp . 80 comment \"default/empty:http\" : goto reject-chain)"
        );
        assert_eq!(steps[1].kind, "stop");
        assert_eq!(steps[1].text, "reject-chain rejected — Service default/empty:http has no ready endpoints");
        assert_eq!(
            stopped.as_deref(),
            Some("node-1: reject-chain rejected — Service default/empty:http has no ready endpoints")
        );
    }

    #[test]
    fn per_endpoint_chains_and_hairpin_of_the_older_layout() {
        let text = r#"trace id 9 ip kube-proxy nat-output packet: oif "cni0" ip saddr 10.244.1.3 ip daddr 10.105.12.209 ip dscp 0x2d ip ttl 64 ip id 1 tcp sport 4000 tcp dport 80 tcp flags == syn
trace id 9 ip kube-proxy nat-output rule jump services (verdict jump services)
trace id 9 ip kube-proxy services rule ip daddr . meta l4proto . th dport vmap @service-ips (verdict goto service-SUSTUHLJ-default/web/tcp/http)
trace id 9 ip kube-proxy service-SUSTUHLJ-default/web/tcp/http rule numgen random mod 2 vmap { 0 : goto endpoint-AAAAAAAA-default/web/tcp/http__10.244.1.3/8080, 1 : goto endpoint-BBBBBBBB-default/web/tcp/http__10.244.2.3/8080 } (verdict goto endpoint-AAAAAAAA-default/web/tcp/http__10.244.1.3/8080)
trace id 9 ip kube-proxy endpoint-AAAAAAAA-default/web/tcp/http__10.244.1.3/8080 rule ip saddr 10.244.1.3 jump mark-for-masquerade (verdict jump mark-for-masquerade)
trace id 9 ip kube-proxy mark-for-masquerade rule meta mark set meta mark | 0x00004000 (verdict continue)
trace id 9 ip kube-proxy endpoint-AAAAAAAA-default/web/tcp/http__10.244.1.3/8080 rule meta l4proto tcp dnat to 10.244.1.3:8080 (verdict accept)
"#;
        let obs = parse_nft_monitor(text);
        let mut stopped = None;
        let mut objects = objects();
        objects.pods.insert(Ipv4Addr::new(10, 244, 1, 3).into(), ("default/web-1".into(), "node-1".into()));
        let steps = node_steps("node-1", &obs.iter().collect::<Vec<_>>(), &objects, None, &mut stopped);
        let texts: Vec<&str> = steps.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "nat-output → services\n→ service-SUSTUHLJ-default/web/tcp/http (map service-ips element 10.105.12.209 . tcp . 80 : goto service-SUSTUHLJ-default/web/tcp/http)\n→ endpoint-AAAAAAAA-default/web/tcp/http__10.244.1.3/8080 (numgen random mod 2 picked element 0, 1 in 2)\n→ mark-for-masquerade; masquerade mark 0x4000 (hairpin: the client is this endpoint)",
                "DNAT 10.244.1.3:8080 (pod default/web-1)",
            ]
        );
    }

    /// The shared-maps layout, real output: a pod reaching itself through its Service's
    /// ClusterIP: the shared DNAT rule, the endpoints element it used, the hairpin masquerade.
    #[test]
    fn shared_maps_name_the_endpoints_element_and_the_hairpin_element() {
        let text = r#"trace id 39bc9611 ip kube-proxy nat-prerouting packet: iif "cni0" ether saddr da:39:02:57:af:a0 ether daddr 02:70:6a:92:0e:79 ip saddr 10.244.1.3 ip daddr 10.101.180.13 ip dscp 0x2d ip ecn not-ect ip ttl 64 ip id 26072 ip length 60 tcp sport 35372 tcp dport 80 tcp flags == syn tcp window 64240 
trace id 39bc9611 ip kube-proxy nat-prerouting rule jump services (verdict jump services)
trace id 39bc9611 ip kube-proxy services rule ip daddr . meta l4proto . th dport vmap @service-ips (verdict goto lb-2)
trace id 39bc9611 ip kube-proxy lb-2 rule dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 2 map @endpoints (verdict accept)
trace id 39bc9611 ip kube-proxy nat-postrouting packet: oif "cni0" @ll,0,112 0xda390257afa0da390257afa00800 ip saddr 10.244.1.3 ip daddr 10.244.1.3 ip dscp 0x2d ip ecn not-ect ip ttl 64 ip id 26072 ip length 60 tcp sport 35372 tcp dport 8080 tcp flags == syn tcp window 64240 
trace id 39bc9611 ip kube-proxy nat-postrouting rule jump masquerading (verdict jump masquerading)
trace id 39bc9611 ip kube-proxy masquerading rule ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random (verdict accept)
"#;
        let table = "table ip kube-proxy {
	map service-ips {
		elements = { 10.101.180.13 . tcp . 80 comment \"default/web:http\" : goto lb-2 }
	}
	map endpoints {
		elements = { 10.101.180.13 . tcp . 80 . 0 : 10.244.1.3 . 8080,
			     10.101.180.13 . tcp . 80 . 1 : 10.244.2.3 . 8080 }
	}
}
";
        let mut objects = objects();
        objects.nft_tables.insert("node-1".into(), table.into());
        objects.pods.insert(Ipv4Addr::new(10, 244, 1, 3).into(), ("default/web-1".into(), "node-1".into()));
        let obs = parse_nft_monitor(text);
        let mut stopped = None;
        let masq = Some("10.244.1.1:40000".parse().unwrap());
        let steps = node_steps("node-1", &obs.iter().collect::<Vec<_>>(), &objects, masq, &mut stopped);
        let texts: Vec<&str> = steps.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "nat-prerouting → services\n→ lb-2 (map service-ips element 10.101.180.13 . tcp . 80 comment \"default/web:http\" : goto lb-2)",
                "DNAT 10.244.1.3:8080 (pod default/web-1): numgen random mod 2 picked map endpoints element 10.101.180.13 . tcp . 80 . 0 : 10.244.1.3 . 8080",
                "nat-postrouting → masquerading",
                "masquerading masquerade → source 10.244.1.1:40000 (set hairpin-connections element 10.244.1.3 . 10.244.1.3 . tcp . 8080: a pod reached itself through its Service)",
            ]
        );
        assert_eq!(steps[1].object.as_deref(), Some("EndpointSlice endpoint of Service default/web:http"));
    }

    #[test]
    fn chain_names_lead_to_their_service_port() {
        assert_eq!(service_of_chain("service-SUSTUHLJ-default/web/tcp/http").as_deref(), Some("default/web:http"));
        assert_eq!(
            service_of_chain("endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80").as_deref(),
            Some("ns1/svc1:p80")
        );
        assert_eq!(service_of_chain("external-ABCDEFGH-default/sticky/tcp/").as_deref(), Some("default/sticky"));
        assert_eq!(service_of_chain("services"), None);
        assert_eq!(service_of_chain("reject-chain"), None);
        assert_eq!(service_of_chain("service-endpoints-check"), None);
    }
}
