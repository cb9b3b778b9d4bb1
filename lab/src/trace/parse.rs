//! Parsers (pure) for what the kernel tells a trace: `xtables-monitor --trace` output (the
//! iptables modes), `nft monitor trace` output (the nftables mode) and `conntrack -L` lines.

use std::net::{IpAddr, SocketAddr};

use podpath_ruleset::{Rule, Target};
use serde::Serialize;

/// One rule (or policy) a traced packet hit: `nat:KUBE-SVC-X:rule:0x2b:JUMP:KUBE-SEP-Y  -4 -t
/// nat -A KUBE-SVC-X …`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RuleHit {
    pub table: String,
    pub chain: String,
    /// `rule`, `policy` or `return`.
    pub kind: String,
    /// `ACCEPT`, `DROP`, `CONTINUE`, `JUMP:CHAIN`, `GOTO:CHAIN`, `RETURN`, or empty.
    pub verdict: String,
    /// The rule as `iptables-save` prints it (`-A CHAIN …`), for `rule` hits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The same rule in the ruleset model (the workspace's one parser of iptables rules).
    #[serde(skip)]
    pub parsed: Option<Rule>,
    /// The rule's handle in its nf_tables chain, where the reader was told it.
    #[serde(skip)]
    pub handle: Option<u64>,
}

impl RuleHit {
    /// The chain a `JUMP:`/`GOTO:` verdict enters.
    pub fn target_chain(&self) -> Option<&str> {
        self.verdict.strip_prefix("JUMP:").or_else(|| self.verdict.strip_prefix("GOTO:"))
    }
    /// The rule's `--comment`.
    pub fn comment(&self) -> Option<String> {
        self.parsed.as_ref()?.comment_text().map(str::to_string)
    }
    /// The rule's target (DNAT, REDIRECT, MASQUERADE…).
    pub fn target(&self) -> Option<&Target> {
        self.parsed.as_ref()?.target.as_ref()
    }
}

/// A packet at one hook of one namespace, with the rules it hit there.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Observation {
    /// The kernel's trace id (the same skb keeps it through the hooks of one namespace).
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iif: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oif: Option<String>,
    pub proto: String,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub flags: Vec<String>,
    pub ttl: u8,
    pub tos: u8,
    pub ip_id: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mark: Option<String>,
    pub hits: Vec<RuleHit>,
}

impl Observation {
    /// A packet not read yet: the parsers fill it in.
    pub(crate) fn new(id: String) -> Observation {
        Observation {
            id,
            iif: None,
            oif: None,
            proto: String::new(),
            src: SocketAddr::from(([0u8; 4], 0)),
            dst: SocketAddr::from(([0u8; 4], 0)),
            flags: vec![],
            ttl: 0,
            tos: 0,
            ip_id: 0,
            mark: None,
            hits: vec![],
        }
    }
    pub fn has_flag(&self, f: &str) -> bool {
        self.flags.iter().any(|x| x == f)
    }
    /// A connection's first packet (SYN without ACK).
    pub fn is_syn(&self) -> bool {
        self.has_flag("SYN") && !self.has_flag("ACK")
    }
    pub fn is_syn_ack(&self) -> bool {
        self.has_flag("SYN") && self.has_flag("ACK")
    }
    /// `table:CHAIN` of the hook (the first hit's base chain).
    pub fn hook(&self) -> Option<String> {
        self.hits.first().map(|h| format!("{}:{}", h.table, h.chain))
    }
    /// The last verdict that decided the packet's fate here (a DROP, or the last ACCEPT).
    pub fn final_hit(&self) -> Option<&RuleHit> {
        self.hits.iter().rev().find(|h| matches!(h.verdict.as_str(), "ACCEPT" | "DROP"))
    }
}

/// Parses `xtables-monitor --trace` output. Lines it does not know are skipped (the tool also
/// prints rule-set change events).
pub fn parse_monitor(text: &str) -> Vec<Observation> {
    let mut out: Vec<Observation> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix("PACKET: ") {
            if let Some(o) = parse_packet(rest) {
                out.push(o);
            }
        } else if let Some(rest) = line.strip_prefix("TRACE: ") {
            let mut parts = rest.splitn(3, ' ');
            let (_family, id, body) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let Some(o) = out.iter_mut().rev().find(|o| o.id == id) else { continue };
            if let Some(hit) = parse_hit(body) {
                o.hits.push(hit);
            }
        }
    }
    out
}

fn parse_packet(rest: &str) -> Option<Observation> {
    let mut words = rest.split_whitespace();
    let _family = words.next()?;
    let id = words.next()?.to_string();
    let mut o = Observation::new(id);
    let (mut src, mut dst, mut sport, mut dport) = (None, None, 0, 0);
    for w in words {
        match w.split_once('=') {
            Some(("IN", v)) if !v.is_empty() => o.iif = Some(v.into()),
            Some(("OUT", v)) if !v.is_empty() => o.oif = Some(v.into()),
            Some(("SRC", v)) => src = v.parse().ok(),
            Some(("DST", v)) => dst = v.parse().ok(),
            Some(("SPORT", v)) => sport = v.parse().unwrap_or(0),
            Some(("DPORT", v)) => dport = v.parse().unwrap_or(0),
            Some(("TTL", v)) => o.ttl = v.parse().unwrap_or(0),
            Some(("ID", v)) => o.ip_id = v.parse().unwrap_or(0),
            Some(("TOS", v)) => o.tos = u8::from_str_radix(v.trim_start_matches("0x"), 16).unwrap_or(0),
            Some(("MARK", v)) => o.mark = Some(v.into()),
            Some(("PROTO", v)) => o.proto = v.into(),
            Some(_) => {}
            None if w.chars().all(|c| c.is_ascii_uppercase()) && w != "DF" => o.flags.push(w.into()),
            None => {}
        }
    }
    if o.proto.is_empty() {
        // TCP prints its flags (`LOOPBACK` is the input device's, not a TCP flag).
        let tcp = o.flags.iter().any(|f| f != "LOOPBACK");
        o.proto = if tcp { "TCP" } else { "UDP" }.into();
    }
    o.src = SocketAddr::new(src?, sport);
    o.dst = SocketAddr::new(dst?, dport);
    Some(o)
}

fn parse_hit(body: &str) -> Option<RuleHit> {
    let (head, rule) = match body.split_once("  ") {
        Some((h, r)) => (h.trim(), Some(r.trim())),
        None => (body.trim(), None),
    };
    let mut f = head.splitn(5, ':');
    let table = f.next()?.to_string();
    let chain = f.next()?.to_string();
    let kind = f.next()?.to_string();
    let (verdict, rule, handle) = match kind.as_str() {
        "rule" => {
            let handle = f.next().and_then(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).ok());
            (f.next().unwrap_or("").to_string(), rule.map(save_form), handle)
        }
        _ => (f.next().unwrap_or("").to_string(), None, None),
    };
    let parsed = rule.as_deref().and_then(|r| podpath_ruleset::text::parse_rule_line(r).ok());
    Some(RuleHit { table, chain, kind, verdict, rule, parsed, handle })
}

/// `-4 -t nat -A CHAIN …` → `-A CHAIN …` (the form of `iptables-save`).
fn save_form(rule: &str) -> String {
    let r = rule.strip_prefix("-4 ").unwrap_or(rule);
    match r.strip_prefix("-t ") {
        Some(rest) => rest.split_once(' ').map(|(_, r)| r).unwrap_or(rest).to_string(),
        None => r.to_string(),
    }
}

/// Parses `nft monitor trace` output (one line per event: `trace id ID FAMILY TABLE CHAIN
/// packet: …` when a packet enters a base chain of a table, then `rule … (verdict …)`,
/// `policy …` and `verdict …` lines). Every `packet:` line is one observation, as every
/// `PACKET:` of xtables-monitor is; the rule hits keep nftables' rule text (`parsed` is None:
/// the words come from [`super::nft_steps`]). Lines it does not know are skipped.
pub fn parse_nft_monitor(text: &str) -> Vec<Observation> {
    let mut out: Vec<Observation> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("trace id ") else { continue };
        let mut parts = rest.splitn(5, ' ');
        let (Some(id), Some(_family), Some(table), Some(chain), Some(body)) =
            (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let body = body.trim_end();
        if let Some(packet) = body.strip_prefix("packet: ") {
            if let Some(o) = parse_nft_packet(id, packet) {
                out.push(o);
            }
            continue;
        }
        let Some(o) = out.iter_mut().rev().find(|o| o.id == id) else { continue };
        // `unknown rule handle 7 (verdict …)`: a rule added after the monitor started.
        let unknown = body.strip_prefix("unknown rule ").map(|r| format!("rule # {r}"));
        let body = unknown.as_deref().unwrap_or(body);
        let (kind, what) = body.split_once(' ').unwrap_or((body, ""));
        let hit = match kind {
            "rule" => {
                let (rule, verdict) = match what.rsplit_once(" (verdict ") {
                    Some((r, v)) => (r, v.trim_end_matches(')')),
                    None => (what, ""),
                };
                RuleHit {
                    table: table.into(),
                    chain: chain.into(),
                    kind: "rule".into(),
                    verdict: nft_verdict(verdict),
                    rule: Some(rule.to_string()),
                    parsed: None,
                    handle: handle_of(rule),
                }
            }
            "policy" | "verdict" => {
                // `policy accept meta mark 0x00004000`: the packet's mark as the chain left it.
                let mut words = what.split_whitespace();
                let verdict = nft_verdict(words.next().unwrap_or(""));
                let rest: Vec<&str> = words.collect();
                if let Some(i) = rest.windows(2).position(|w| w == ["meta", "mark"]) {
                    o.mark = rest.get(i + 2).map(|m| short_mark(m));
                }
                let kind = if kind == "policy" { "policy" } else { "return" };
                RuleHit {
                    table: table.into(),
                    chain: chain.into(),
                    kind: kind.into(),
                    verdict,
                    rule: None,
                    parsed: None,
                    handle: None,
                }
            }
            _ => continue,
        };
        o.hits.push(hit);
    }
    out
}

/// The handle `nft -a` prints after a rule (`… # handle 7`).
fn handle_of(text: &str) -> Option<u64> {
    text.rsplit_once("# handle ")?.1.trim().parse().ok()
}

/// `0x00004000` → `0x4000`, as xtables-monitor prints a mark.
fn short_mark(m: &str) -> String {
    format!("0x{:x}", u32::from_str_radix(m.trim_start_matches("0x"), 16).unwrap_or(0))
}

/// nftables' verdict words in xtables-monitor's terms: `jump services` → `JUMP:services`,
/// `accept` → `ACCEPT`.
fn nft_verdict(v: &str) -> String {
    match v.split_once(' ') {
        Some(("jump", c)) => format!("JUMP:{c}"),
        Some(("goto", c)) => format!("GOTO:{c}"),
        _ => v.to_ascii_uppercase(),
    }
}

/// The DSCP names nft prints for the classes it knows (`cs0`, `af21`, `ef`), as numbers.
fn dscp_value(name: &str) -> Option<u8> {
    if let Some(hex) = name.strip_prefix("0x") {
        return u8::from_str_radix(hex, 16).ok();
    }
    if let Some(n) = name.strip_prefix("cs") {
        return n.parse::<u8>().ok().filter(|n| *n < 8).map(|n| n << 3);
    }
    if let Some(n) = name.strip_prefix("af") {
        let (class, drop) = (n.get(0..1)?.parse::<u8>().ok()?, n.get(1..2)?.parse::<u8>().ok()?);
        return Some(class << 3 | drop << 1);
    }
    match name {
        "ef" => Some(46),
        "va" => Some(44),
        "le" => Some(1),
        _ => name.parse().ok(),
    }
}

/// The TCP flags by bit, as the monitors name them.
pub(crate) const TCP_FLAGS: [(u8, &str); 8] = [
    (0x01, "FIN"),
    (0x02, "SYN"),
    (0x04, "RST"),
    (0x08, "PSH"),
    (0x10, "ACK"),
    (0x20, "URG"),
    (0x40, "ECE"),
    (0x80, "CWR"),
];

/// `tcp flags == syn | ack` or `tcp flags == 0x12` → `["SYN", "ACK"]`.
fn tcp_flags(value: &str) -> Vec<String> {
    const NAMES: [(u8, &str); 8] = TCP_FLAGS;
    let bits = match value.strip_prefix("0x") {
        Some(hex) => u8::from_str_radix(hex, 16).unwrap_or(0),
        None => value
            .split('|')
            .map(|f| f.trim().to_ascii_uppercase())
            .filter_map(|f| NAMES.iter().find(|(_, n)| *n == f || (f == "ECN" && *n == "ECE")).map(|(b, _)| *b))
            .fold(0, |a, b| a | b),
    };
    NAMES.iter().filter(|(b, _)| bits & b != 0).map(|(_, n)| n.to_string()).collect()
}

fn parse_nft_packet(id: &str, packet: &str) -> Option<Observation> {
    let mut o = Observation::new(id.to_string());
    let (mut src, mut dst, mut sport, mut dport) = (None, None, 0, 0);
    let words: Vec<&str> = packet.split_whitespace().collect();
    let mut i = 0;
    while i < words.len() {
        let value = words.get(i + 1).copied().unwrap_or("");
        let next = words.get(i + 2).copied().unwrap_or("");
        match (words[i], value) {
            ("iif", v) => o.iif = Some(v.trim_matches('"').into()),
            ("oif", v) => o.oif = Some(v.trim_matches('"').into()),
            ("meta", "mark") => o.mark = Some(short_mark(next)),
            ("ip", "saddr") => src = next.parse().ok(),
            ("ip", "daddr") => dst = next.parse().ok(),
            ("ip", "dscp") => o.tos = (o.tos & 0x03) | dscp_value(next).unwrap_or(0) << 2,
            ("ip", "ttl") => o.ttl = next.parse().unwrap_or(0),
            ("ip", "id") => o.ip_id = next.parse().unwrap_or(0),
            ("ip6", "saddr") => src = next.parse().ok(),
            ("ip6", "daddr") => dst = next.parse().ok(),
            ("ip6", "dscp") => o.tos = (o.tos & 0x03) | dscp_value(next).unwrap_or(0) << 2,
            ("ip6", "hoplimit") => o.ttl = next.parse().unwrap_or(0),
            // The flow label is what stays the same of one packet across hooks, as the IPv4 id.
            ("ip6", "flowlabel") => o.ip_id = next.parse().unwrap_or(0),
            ("tcp" | "udp" | "sctp", "sport") => {
                o.proto = words[i].to_ascii_uppercase();
                sport = next.parse().unwrap_or(0);
            }
            ("tcp" | "udp" | "sctp", "dport") => dport = next.parse().unwrap_or(0),
            ("tcp", "flags") if next == "==" => {
                // The value runs to the next field (`syn | ack tcp window …`).
                let mut j = i + 3;
                let mut v = String::new();
                while let Some(w) = words.get(j) {
                    if !v.is_empty() && *w != "|" && !v.ends_with('|') {
                        break;
                    }
                    v.push_str(w);
                    j += 1;
                }
                o.flags = tcp_flags(&v);
                i = j;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        }
        // A field and its value: `iif "eth0"` takes two words, `ip saddr X` three.
        i += if matches!(words[i], "iif" | "oif") { 2 } else { 3 };
    }
    o.src = SocketAddr::new(src?, sport);
    o.dst = SocketAddr::new(dst?, dport);
    if o.proto.is_empty() {
        o.proto = "IP".into();
    }
    Some(o)
}

/// A connection-tracking entry: the original direction and the reply direction as the kernel
/// expects it (NAT shows as the difference).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CtEntry {
    pub proto: String,
    pub state: String,
    /// `[ASSURED]`: traffic was seen both ways (a connection that was answered).
    pub assured: bool,
    pub orig: (SocketAddr, SocketAddr),
    pub reply: (SocketAddr, SocketAddr),
}

impl CtEntry {
    /// Whether the kernel translates this flow (DNAT and/or SNAT).
    pub fn is_natted(&self) -> bool {
        self.orig != (self.reply.1, self.reply.0)
    }
}

/// Parses `conntrack -L` or `-G` output (tcp and udp entries; others are skipped).
pub fn parse_conntrack(text: &str) -> Vec<CtEntry> {
    text.lines().filter_map(parse_ct_line).collect()
}

fn parse_ct_line(line: &str) -> Option<CtEntry> {
    let mut words = line.split_whitespace();
    let proto = words.next()?.to_string();
    if proto != "tcp" && proto != "udp" {
        return None;
    }
    let mut state = String::new();
    let mut assured = false;
    let (mut ips, mut ports) = (Vec::new(), Vec::new());
    for w in words {
        match w.split_once('=') {
            Some(("src" | "dst", v)) => ips.push(v.parse::<IpAddr>().ok()?),
            Some(("sport" | "dport", v)) => ports.push(v.parse::<u16>().ok()?),
            None if w == "[ASSURED]" => assured = true,
            None if w.chars().all(|c| c.is_ascii_uppercase() || c == '_') && !w.is_empty() => state = w.into(),
            _ => {}
        }
    }
    if ips.len() < 4 || ports.len() < 4 {
        return None;
    }
    let sa = |i: usize| SocketAddr::new(ips[i], ports[i]);
    Some(CtEntry { proto, state, assured, orig: (sa(0), sa(1)), reply: (sa(2), sa(3)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: &str = r#"PACKET: 2 d1d55715 IN=eth0 MACSRC=8a:10:aa:c2:2f:88 MACDST=9a:ad:3b:c4:8e:76 MACPROTO=0800 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=63 ID=60600 DF SPORT=45678 DPORT=80 SYN 
 TRACE: 2 d1d55715 raw:PREROUTING:rule:0x2:CONTINUE  -4 -t raw -A PREROUTING -j PODPATH-TRACE
 TRACE: 2 d1d55715 raw:PREROUTING:policy:ACCEPT 
PACKET: 2 d1d55715 IN=eth0 MACSRC=8a:10:aa:c2:2f:88 MACDST=9a:ad:3b:c4:8e:76 MACPROTO=0800 SRC=203.0.113.10 DST=198.51.100.1 LEN=60 TOS=0xb4 TTL=63 ID=60600 DF SPORT=45678 DPORT=80 SYN 
 TRACE: 2 d1d55715 nat:PREROUTING:rule:0x15:JUMP:KUBE-SERVICES  -4 -t nat -A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
 TRACE: 2 d1d55715 nat:KUBE-SERVICES:rule:0x24:JUMP:KUBE-EXT-LOLE4ISW44XBNF3G  -4 -t nat -A KUBE-SERVICES -d 198.51.100.1/32 -p tcp -m comment --comment "default/web loadbalancer IP" -m tcp --dport 80 -j KUBE-EXT-LOLE4ISW44XBNF3G
 TRACE: 2 d1d55715 nat:KUBE-SEP-5Q3P56IRA2PP7VYF:rule:0x28:ACCEPT  -4 -t nat -A KUBE-SEP-5Q3P56IRA2PP7VYF -p tcp -m comment --comment "default/web" -m tcp -j DNAT --to-destination 10.244.2.2:8080
 TRACE: 2 d1d55715 nat:KUBE-SERVICES:return:
PACKET: 2 d1d55715 IN=eth0 OUT=cni0 MACSRC=8a:10:aa:c2:2f:88 MACDST=9a:ad:3b:c4:8e:76 MACPROTO=0800 SRC=203.0.113.10 DST=10.244.2.2 LEN=60 TOS=0xb4 TTL=62 ID=60600 DF SPORT=45678 DPORT=8080 SYN MARK=0x4000 
 TRACE: 2 d1d55715 filter:KUBE-FORWARD:rule:0x8:ACCEPT  -4 -t filter -A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" -m mark --mark 0x4000/0x4000 -j ACCEPT
PACKET: 2 a7ab5471 IN=eth0 SRC=198.51.100.1 DST=203.0.113.10 LEN=52 TOS=0x0 TTL=63 ID=0 DF SPORT=80 DPORT=45678 SYN ACK 
"#;

    #[test]
    fn monitor_output_becomes_observations_with_their_rule_hits() {
        let obs = parse_monitor(NODE);
        assert_eq!(obs.len(), 4);
        let nat = &obs[1];
        assert_eq!((nat.iif.as_deref(), nat.oif.as_deref()), (Some("eth0"), None));
        assert_eq!(nat.src, "203.0.113.10:45678".parse().unwrap());
        assert_eq!(nat.dst, "198.51.100.1:80".parse().unwrap());
        assert!(nat.is_syn() && !nat.is_syn_ack());
        assert_eq!((nat.ttl, nat.tos, nat.ip_id), (63, 0xb4, 60600));
        assert_eq!(nat.hook().as_deref(), Some("nat:PREROUTING"));
        assert_eq!(nat.hits.len(), 4);
        assert_eq!(nat.hits[1].target_chain(), Some("KUBE-EXT-LOLE4ISW44XBNF3G"));
        assert_eq!(nat.hits[1].comment().as_deref(), Some("default/web loadbalancer IP"));
        assert_eq!(
            nat.hits[2].rule.as_deref(),
            Some("-A KUBE-SEP-5Q3P56IRA2PP7VYF -p tcp -m comment --comment \"default/web\" -m tcp -j DNAT --to-destination 10.244.2.2:8080")
        );
        assert_eq!(nat.hits[3].kind, "return");
        assert_eq!(nat.final_hit().map(|h| h.chain.as_str()), Some("KUBE-SEP-5Q3P56IRA2PP7VYF"));
        let fwd = &obs[2];
        assert_eq!(fwd.oif.as_deref(), Some("cni0"));
        assert_eq!(fwd.mark.as_deref(), Some("0x4000"));
        assert!(obs[3].is_syn_ack() && obs[3].hits.is_empty());
    }

    #[test]
    fn conntrack_lines_give_both_directions() {
        let text = "tcp      6 119 TIME_WAIT src=203.0.113.10 dst=198.51.100.1 sport=45678 dport=80 src=10.244.2.2 dst=192.168.56.12 sport=8080 dport=21544 [ASSURED] mark=0 use=1\n\
                    udp      17 29 src=10.0.0.1 dst=10.0.0.2 sport=53 dport=53 [UNREPLIED] src=10.0.0.2 dst=10.0.0.1 sport=53 dport=53 mark=0 use=1\n\
                    icmp     1 29 src=10.0.0.1 dst=10.0.0.2 type=8 code=0 id=1 src=10.0.0.2 dst=10.0.0.1 type=0 code=0 id=1 mark=0 use=1\n\
                    conntrack v1.4.7 (conntrack-tools): 2 flow entries have been shown.\n";
        let ct = parse_conntrack(text);
        assert_eq!(ct.len(), 2);
        assert_eq!(ct[0].state, "TIME_WAIT");
        assert!(ct[0].assured && !ct[1].assured);
        assert_eq!(ct[0].reply.1, "192.168.56.12:21544".parse().unwrap());
        assert!(ct[0].is_natted());
        assert!(!ct[1].is_natted());
    }

    #[test]
    fn comments_quoted_or_not() {
        let comment_of = |rule: &str| parse_hit(&format!("nat:X:rule:0x1:JUMP:Y  -4 -t nat {rule}"))?.comment();
        assert_eq!(comment_of("-A X -m comment --comment \"a b\" -j Y").as_deref(), Some("a b"));
        assert_eq!(comment_of("-A X -m comment --comment ab -j Y").as_deref(), Some("ab"));
        assert_eq!(comment_of("-A X -j Y"), None);
    }

    /// What `nft -a monitor trace` printed on an IPv6 node of an iptables-mode lab (kube-proxy's
    /// ip6tables rules through iptables-nft).
    const NODE6: &str = "trace id 8c1131e9 ip6 podpath-trace prerouting packet: iif \"eth0\" ip6 saddr 2001:db8:113::10 ip6 daddr 2001:db8:100::1 ip6 dscp 0x2d ip6 ecn not-ect ip6 hoplimit 63 ip6 flowlabel 452502 ip6 nexthdr tcp ip6 length 40 tcp sport 41322 tcp dport 80 tcp flags == syn tcp window 64800 
trace id 8c1131e9 ip6 podpath-trace prerouting rule jump probe # handle 4 (verdict jump probe)
trace id 8c1131e9 ip6 nat PREROUTING packet: iif \"eth0\" ip6 saddr 2001:db8:113::10 ip6 daddr 2001:db8:100::1 ip6 dscp 0x2d ip6 ecn not-ect ip6 hoplimit 63 ip6 flowlabel 452502 ip6 length 40 tcp sport 41322 tcp dport 80 tcp flags == syn tcp window 64800 
trace id 8c1131e9 ip6 nat PREROUTING rule  counter packets 0 bytes 0 jump KUBE-SERVICES # handle 9 (verdict jump KUBE-SERVICES)
trace id 8c1131e9 ip6 nat KUBE-SERVICES rule ip6 daddr 2001:db8:100::1 tcp dport 80  counter packets 0 bytes 0 jump KUBE-EXT-AAA # handle 31 (verdict jump KUBE-EXT-AAA)
trace id 8c1131e9 ip6 nat KUBE-SEP-BBB rule meta l4proto tcp  counter packets 0 bytes 0 dnat to [fd00:10:244:1::3]:8080 # handle 40 (verdict accept)
";

    #[test]
    fn ipv6_packets_read_from_nft_monitor_trace() {
        let obs = parse_nft_monitor(NODE6);
        assert_eq!(obs.len(), 2);
        let o = &obs[1];
        assert_eq!(o.src, "[2001:db8:113::10]:41322".parse().unwrap());
        assert_eq!(o.dst, "[2001:db8:100::1]:80".parse().unwrap());
        assert_eq!((o.ttl, o.tos, o.ip_id, o.proto.as_str()), (63, 0xb4, 452502, "TCP"));
        assert!(o.is_syn());
        assert_eq!(o.hook().as_deref(), Some("nat:PREROUTING"));
    }
}
