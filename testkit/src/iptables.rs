//! A fake iptables with `iptables-restore --noflush` semantics, and a packet tracer over it.
//!
//! Restore: a table section is applied atomically at `COMMIT` (or not at all); `:CHAIN` creates
//! a chain or flushes an existing one; `-A` needs the chain declared or existing and its jump
//! target to exist at commit; `-X` deletes a chain that nothing references any more. Chains not
//! mentioned are left alone, exactly what partial syncs rely on.
//!
//! Tracer: follows a packet (source, destination, protocol, port, mark) from a chain through
//! the rules the proxy writes (`-s/-d/-p/--dport`, `!`, `addrtype`, `mark`, `statistic`,
//! `recent`, `conntrack`, `comment`; targets `DNAT`, `MARK`, `MASQUERADE`, `ACCEPT`, `DROP`,
//! `REJECT`, `RETURN`, jumps) and reports every rule that matched and the verdict.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

const BUILTIN: [(&str, &[&str]); 4] = [
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    ("mangle", &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"]),
    ("raw", &["PREROUTING", "OUTPUT"]),
];

/// Splits a rule like a shell would (double quotes group words).
pub fn split_words(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for ch in line.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

/// One table: chains in order, rules as word lists.
pub type Table = BTreeMap<String, Vec<Vec<String>>>;

/// The fake.
#[derive(Debug, Clone)]
pub struct FakeIptables {
    pub tables: BTreeMap<String, Table>,
}

impl Default for FakeIptables {
    fn default() -> Self {
        let mut tables = BTreeMap::new();
        for (t, chains) in BUILTIN {
            tables.insert(t.to_string(), chains.iter().map(|c| (c.to_string(), vec![])).collect());
        }
        FakeIptables { tables }
    }
}

fn is_builtin(table: &str, chain: &str) -> bool {
    BUILTIN.iter().any(|(t, cs)| *t == table && cs.contains(&chain))
}

fn jump_target(rule: &[String]) -> Option<&str> {
    rule.iter().position(|w| w == "-j").and_then(|i| rule.get(i + 1)).map(String::as_str)
}

const TARGETS: [&str; 9] = ["ACCEPT", "DROP", "REJECT", "RETURN", "DNAT", "MARK", "MASQUERADE", "SNAT", "REDIRECT"];

impl FakeIptables {
    /// `iptables-restore --noflush`.
    pub fn restore(&mut self, text: &str) -> Result<(), String> {
        let mut pending: Option<(String, Table)> = None;
        let mut staged: Vec<(String, Table)> = vec![];
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            let at = |m: String| format!("line {}: {m}: {line}", n + 1);
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(t) = line.strip_prefix('*') {
                if pending.is_some() {
                    return Err(at("table started before COMMIT".into()));
                }
                let current = self.tables.get(t).cloned().ok_or_else(|| at(format!("no table {t}")))?;
                pending = Some((t.to_string(), current));
                continue;
            }
            let (table, chains) = pending.as_mut().ok_or_else(|| at("rule outside a table".into()))?;
            if line == "COMMIT" {
                for (chain, rules) in chains.iter() {
                    for r in rules {
                        if let Some(target) = jump_target(r) {
                            if !TARGETS.contains(&target) && !chains.contains_key(target) {
                                return Err(format!("COMMIT of {table}: chain {chain} jumps to missing {target}"));
                            }
                        }
                    }
                }
                staged.push(pending.take().expect("pending"));
                continue;
            }
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl.split_whitespace().next().ok_or_else(|| at("empty chain name".into()))?;
                if name.len() > 28 {
                    return Err(at("chain name longer than 28 characters".into()));
                }
                chains.insert(name.to_string(), vec![]);
                continue;
            }
            let words = split_words(line);
            match words.first().map(String::as_str) {
                Some("-A") => {
                    let chain = words.get(1).ok_or_else(|| at("-A without a chain".into()))?;
                    let rules = chains.get_mut(chain).ok_or_else(|| at(format!("no chain {chain}")))?;
                    rules.push(words[2..].to_vec());
                }
                Some("-I") => {
                    let chain = words.get(1).ok_or_else(|| at("-I without a chain".into()))?;
                    let (pos, rest) = match words.get(2).and_then(|w| w.parse::<usize>().ok()) {
                        Some(n) => (n.max(1) - 1, 3),
                        None => (0, 2),
                    };
                    let rules = chains.get_mut(chain).ok_or_else(|| at(format!("no chain {chain}")))?;
                    if pos > rules.len() {
                        return Err(at(format!("index {} past the end of {chain}", pos + 1)));
                    }
                    rules.insert(pos, words[rest..].to_vec());
                }
                Some("-X") => {
                    let chain = words.get(1).ok_or_else(|| at("-X without a chain".into()))?;
                    if is_builtin(table, chain) {
                        return Err(at("cannot delete a built-in chain".into()));
                    }
                    if chains.get(chain).is_none_or(|r| !r.is_empty()) {
                        return Err(at(format!("chain {chain} is missing or not empty")));
                    }
                    if chains.values().flatten().any(|r| jump_target(r) == Some(chain.as_str())) {
                        return Err(at(format!("chain {chain} is still referenced")));
                    }
                    chains.remove(chain);
                }
                _ => return Err(at("unsupported line".into())),
            }
        }
        if pending.is_some() {
            return Err("input ended without COMMIT".into());
        }
        for (t, chains) in staged {
            self.tables.insert(t, chains);
        }
        Ok(())
    }

    /// Chain names of a table.
    pub fn chains(&self, table: &str) -> BTreeSet<String> {
        self.tables.get(table).map(|t| t.keys().cloned().collect()).unwrap_or_default()
    }

    /// `iptables-save -t TABLE` (rules as they were written, words with spaces quoted).
    pub fn save(&self, table: &str) -> String {
        let Some(t) = self.tables.get(table) else { return String::new() };
        let mut out = format!("*{table}\n");
        for chain in t.keys() {
            let policy = if is_builtin(table, chain) { "ACCEPT" } else { "-" };
            out.push_str(&format!(":{chain} {policy} [0:0]\n"));
        }
        for (chain, rules) in t {
            for r in rules {
                let words: Vec<String> =
                    r.iter().map(|w| if w.contains(' ') { format!("\"{w}\"") } else { w.clone() }).collect();
                out.push_str(&format!("-A {chain} {}\n", words.join(" ")));
            }
        }
        out.push_str("COMMIT\n");
        out
    }

    /// Rules of a chain as text (`-A CHAIN …` without the prefix).
    pub fn rules(&self, table: &str, chain: &str) -> Vec<String> {
        self.tables
            .get(table)
            .and_then(|t| t.get(chain))
            .map(|rs| rs.iter().map(|r| r.join(" ")).collect())
            .unwrap_or_default()
    }

    /// `iptables -N` (idempotent).
    pub fn ensure_chain(&mut self, table: &str, chain: &str) {
        if let Some(t) = self.tables.get_mut(table) {
            t.entry(chain.to_string()).or_default();
        }
    }

    /// `iptables -C` then `-I 1`.
    pub fn ensure_rule_first(&mut self, table: &str, chain: &str, rule: &[&str]) -> Result<(), String> {
        let rule: Vec<String> = rule.iter().map(|s| s.to_string()).collect();
        let rules = self.tables.get_mut(table).and_then(|t| t.get_mut(chain)).ok_or(format!("no chain {chain}"))?;
        if !rules.contains(&rule) {
            rules.insert(0, rule);
        }
        Ok(())
    }

    /// `iptables -C` then `-A`.
    pub fn ensure_rule_last(&mut self, table: &str, chain: &str, rule: &[&str]) -> Result<(), String> {
        let rule: Vec<String> = rule.iter().map(|s| s.to_string()).collect();
        let rules = self.tables.get_mut(table).and_then(|t| t.get_mut(chain)).ok_or(format!("no chain {chain}"))?;
        if !rules.contains(&rule) {
            rules.push(rule);
        }
        Ok(())
    }

    /// `iptables -D` (every copy).
    pub fn delete_rule(&mut self, table: &str, chain: &str, rule: &[&str]) {
        let rule: Vec<String> = rule.iter().map(|s| s.to_string()).collect();
        if let Some(rules) = self.tables.get_mut(table).and_then(|t| t.get_mut(chain)) {
            rules.retain(|r| *r != rule);
        }
    }

    /// `iptables -F` + `-X`.
    pub fn delete_chain(&mut self, table: &str, chain: &str) {
        if let Some(t) = self.tables.get_mut(table) {
            t.remove(chain);
        }
    }
}

/// A packet as the tracer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: String,
    pub dport: u16,
    pub mark: u32,
}

/// How a traversal ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Fell off a built-in chain (policy ACCEPT) or `ACCEPT`.
    Accept,
    Drop,
    Reject,
    Dnat(SocketAddr),
    Masquerade,
}

/// One matched rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub chain: String,
    pub rule: String,
}

/// The result of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub steps: Vec<Step>,
    pub verdict: Verdict,
    pub packet: Packet,
}

impl Trace {
    /// The chains the packet went through, in order, without repeats.
    pub fn chains(&self) -> Vec<String> {
        let mut out: Vec<String> = vec![];
        for s in &self.steps {
            if out.last() != Some(&s.chain) {
                out.push(s.chain.clone());
            }
        }
        out
    }
}

/// Walks packets through a fake's rules.
pub struct Tracer<'a> {
    pub ipt: &'a FakeIptables,
    /// The node's own addresses (`addrtype LOCAL`).
    pub local: Vec<IpAddr>,
    /// Decides `-m statistic --probability P` (default: take the rule when P ≥ 1/2, so the
    /// first of two endpoints, the second of three…; tests pass their own).
    pub statistic: Box<dyn FnMut(f64) -> bool + 'a>,
    /// `-m recent` lists: name → source addresses.
    pub recent: HashMap<String, BTreeSet<IpAddr>>,
}

fn parse_net(s: &str) -> Option<(IpAddr, u8)> {
    match s.split_once('/') {
        Some((a, l)) => Some((a.parse().ok()?, l.parse().ok()?)),
        None => {
            let a: IpAddr = s.parse().ok()?;
            Some((a, if a.is_ipv4() { 32 } else { 128 }))
        }
    }
}

fn in_net(ip: IpAddr, net: &str) -> bool {
    let Some((base, len)) = parse_net(net) else { return false };
    match (ip, base) {
        (IpAddr::V4(a), IpAddr::V4(b)) => {
            let m = if len == 0 { 0 } else { u32::MAX << (32 - len as u32) };
            u32::from(a) & m == u32::from(b) & m
        }
        (IpAddr::V6(a), IpAddr::V6(b)) => {
            let m = if len == 0 { 0 } else { u128::MAX << (128 - len as u32) };
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

fn parse_u32(s: &str) -> u32 {
    s.strip_prefix("0x").map_or_else(|| s.parse().unwrap_or(0), |h| u32::from_str_radix(h, 16).unwrap_or(0))
}

enum Outcome {
    Continue,
    Return,
    Final(Verdict),
}

impl<'a> Tracer<'a> {
    pub fn new(ipt: &'a FakeIptables, local: Vec<IpAddr>) -> Tracer<'a> {
        Tracer { ipt, local, statistic: Box::new(|p| p >= 0.5), recent: HashMap::new() }
    }

    /// Traces `packet` from `chain` of `table`.
    pub fn trace(&mut self, table: &str, chain: &str, packet: Packet) -> Trace {
        let mut steps = vec![];
        let mut p = packet;
        let verdict = match self.walk(table, chain, &mut p, &mut steps, 0) {
            Outcome::Final(v) => v,
            _ => Verdict::Accept,
        };
        Trace { steps, verdict, packet: p }
    }

    fn walk(&mut self, table: &str, chain: &str, p: &mut Packet, steps: &mut Vec<Step>, depth: usize) -> Outcome {
        assert!(depth < 64, "jump loop at {chain}");
        let rules = self.ipt.tables.get(table).and_then(|t| t.get(chain)).cloned().unwrap_or_default();
        for rule in rules {
            if !self.matches(&rule, p) {
                continue;
            }
            steps.push(Step { chain: chain.to_string(), rule: rule.join(" ") });
            let opt = |name: &str| rule.iter().position(|w| w == name).and_then(|i| rule.get(i + 1)).cloned();
            match jump_target(&rule) {
                None => {}
                Some("ACCEPT") => return Outcome::Final(Verdict::Accept),
                Some("DROP") => return Outcome::Final(Verdict::Drop),
                Some("REJECT") => return Outcome::Final(Verdict::Reject),
                Some("RETURN") => return Outcome::Return,
                Some("MASQUERADE") => return Outcome::Final(Verdict::Masquerade),
                Some("DNAT") => {
                    let to: SocketAddr =
                        opt("--to-destination").and_then(|d| d.parse().ok()).expect("DNAT --to-destination ip:port");
                    if rule.iter().any(|w| w == "--set") {
                        if let Some(name) = opt("--name") {
                            self.recent.entry(name).or_default().insert(p.src);
                        }
                    }
                    p.dst = to.ip();
                    p.dport = to.port();
                    return Outcome::Final(Verdict::Dnat(to));
                }
                Some("MARK") => {
                    if let Some(m) = opt("--or-mark") {
                        p.mark |= parse_u32(&m);
                    } else if let Some(m) = opt("--xor-mark") {
                        p.mark ^= parse_u32(&m);
                    } else if let Some(m) = opt("--set-xmark") {
                        let (v, mask) =
                            m.split_once('/').map_or((parse_u32(&m), u32::MAX), |(v, k)| (parse_u32(v), parse_u32(k)));
                        p.mark = (p.mark & !mask) ^ v;
                    }
                }
                Some(child) => match self.walk(table, child, p, steps, depth + 1) {
                    Outcome::Final(v) => return Outcome::Final(v),
                    Outcome::Return | Outcome::Continue => {}
                },
            }
        }
        Outcome::Continue
    }

    fn matches(&mut self, rule: &[String], p: &Packet) -> bool {
        let mut i = 0;
        let mut negate = false;
        while i < rule.len() {
            let w = rule[i].as_str();
            let arg = rule.get(i + 1).map(String::as_str).unwrap_or("");
            let ok = match w {
                "!" => {
                    negate = true;
                    i += 1;
                    continue;
                }
                "-s" => in_net(p.src, arg),
                "-d" => in_net(p.dst, arg),
                "-p" => p.proto == arg,
                "--dport" => arg.parse::<u16>().ok() == Some(p.dport),
                "--dst-type" => (arg == "LOCAL") == self.local.contains(&p.dst),
                "--src-type" => (arg == "LOCAL") == self.local.contains(&p.src),
                "--mark" => {
                    let (v, m) =
                        arg.split_once('/').map_or((parse_u32(arg), u32::MAX), |(v, m)| (parse_u32(v), parse_u32(m)));
                    p.mark & m == v
                }
                "--probability" => (self.statistic)(arg.parse().unwrap_or(0.0)),
                "--rcheck" => {
                    let name = rule
                        .iter()
                        .position(|x| x == "--name")
                        .and_then(|j| rule.get(j + 1))
                        .cloned()
                        .unwrap_or_default();
                    self.recent.get(&name).is_some_and(|s| s.contains(&p.src))
                }
                "-j" => break,
                // Options without a packet test here (comment text, module names, conntrack NEW,
                // recent bookkeeping): skip them and their value.
                _ => {
                    i += if w.starts_with('-') && !matches!(w, "--reap" | "--set" | "--random-fully") { 2 } else { 1 };
                    continue;
                }
            };
            if ok == negate {
                return false;
            }
            negate = false;
            i += if matches!(w, "--rcheck") { 1 } else { 2 };
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_is_atomic_and_noflush() {
        let mut f = FakeIptables::default();
        f.restore("*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j RETURN\n-A PREROUTING -j KUBE-A\nCOMMIT\n").unwrap();
        assert_eq!(f.rules("nat", "KUBE-A"), ["-j RETURN"]);
        // A failing section changes nothing.
        assert!(f.restore("*nat\n:KUBE-B - [0:0]\n-A KUBE-B -j KUBE-MISSING\nCOMMIT\n").is_err());
        assert!(!f.chains("nat").contains("KUBE-B"));
        // Not mentioned: untouched; declared again: flushed.
        f.restore("*nat\n:KUBE-C - [0:0]\nCOMMIT\n").unwrap();
        assert_eq!(f.rules("nat", "KUBE-A"), ["-j RETURN"]);
        f.restore("*nat\n:KUBE-A - [0:0]\nCOMMIT\n").unwrap();
        assert!(f.rules("nat", "KUBE-A").is_empty());
        // -X refuses a referenced chain.
        assert!(f.restore("*nat\n-X KUBE-A\nCOMMIT\n").is_err());
        f.restore("*nat\n:KUBE-C - [0:0]\n-X KUBE-C\nCOMMIT\n").unwrap();
        assert!(!f.chains("nat").contains("KUBE-C"));
        assert_eq!(split_words(r#"-m comment --comment "a b" -j X"#), ["-m", "comment", "--comment", "a b", "-j", "X"]);
    }

    #[test]
    fn tracer_follows_jumps_marks_and_dnat() {
        let mut f = FakeIptables::default();
        f.restore(concat!(
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n:KUBE-SEP-A - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
            "-A PREROUTING -j KUBE-SERVICES\n",
            "-A KUBE-SERVICES -m comment --comment \"ns/svc cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-X\n",
            "-A KUBE-SVC-X -m tcp -p tcp -d 10.96.0.1 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n",
            "-A KUBE-SVC-X -j KUBE-SEP-A\n",
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n",
            "-A KUBE-SEP-A -m tcp -p tcp -j DNAT --to-destination 10.244.1.5:8080\n",
            "COMMIT\n"
        ))
        .unwrap();
        let mut t = Tracer::new(&f, vec![]);
        let pkt = |src: &str| Packet {
            src: src.parse().unwrap(),
            dst: "10.96.0.1".parse().unwrap(),
            proto: "tcp".into(),
            dport: 80,
            mark: 0,
        };
        let outside = t.trace("nat", "PREROUTING", pkt("192.168.56.1"));
        assert_eq!(outside.verdict, Verdict::Dnat("10.244.1.5:8080".parse().unwrap()));
        assert_eq!(outside.packet.mark, 0x4000);
        assert_eq!(
            outside.chains(),
            ["PREROUTING", "KUBE-SERVICES", "KUBE-SVC-X", "KUBE-MARK-MASQ", "KUBE-SVC-X", "KUBE-SEP-A"]
        );
        let pod = t.trace("nat", "PREROUTING", pkt("10.244.2.3"));
        assert_eq!(pod.packet.mark, 0, "pod traffic is not masqueraded");
    }
}

/// Problems of a restore input as kube-proxy's own tests define them: a rule that jumps to a
/// chain the input does not declare, or to a declared chain with no rules, and a declared chain
/// nothing jumps to. `entry` names the chains reached from built-in chains (their jumps are not
/// in the input) and chains allowed to be empty (kube-proxy always writes them).
pub fn lint(text: &str, entry: &[&str]) -> Vec<String> {
    let mut problems = vec![];
    let mut table = String::new();
    let mut declared: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut jumps: Vec<(String, String, String)> = vec![];
    let mut deleted: BTreeSet<(String, String)> = BTreeSet::new();
    for line in text.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
        } else if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or_default();
            declared.insert((table.clone(), name.to_string()), 0);
        } else if line.starts_with("-A ") {
            let words = split_words(line);
            let chain = words.get(1).cloned().unwrap_or_default();
            *declared.entry((table.clone(), chain.clone())).or_default() += 1;
            if let Some(target) = words.iter().position(|w| w == "-j").and_then(|i| words.get(i + 1)) {
                if !TARGETS.contains(&target.as_str()) {
                    jumps.push((table.clone(), chain, target.clone()));
                }
            }
        } else if let Some(chain) = line.strip_prefix("-X ") {
            deleted.insert((table.clone(), chain.trim().to_string()));
        }
    }
    for (t, from, to) in &jumps {
        match declared.get(&(t.clone(), to.clone())) {
            None => problems.push(format!("{t}: {from} jumps to {to}, which is not declared")),
            Some(0) if !entry.contains(&to.as_str()) => {
                problems.push(format!("{t}: {from} jumps to {to}, which is empty"))
            }
            _ => {}
        }
    }
    for (t, c) in declared.keys() {
        let used = jumps.iter().any(|(jt, _, to)| jt == t && to == c);
        if !used && !entry.contains(&c.as_str()) && !deleted.contains(&(t.clone(), c.clone())) {
            problems.push(format!("{t}: chain {c} is declared but nothing jumps to it"));
        }
    }
    problems
}

#[cfg(test)]
mod lint_tests {
    use super::lint;

    #[test]
    fn lint_finds_missing_empty_and_unused_chains() {
        let text =
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-EMPTY - [0:0]\n:KUBE-SEP-LOST - [0:0]\n\
                    :KUBE-SEP-OLD - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-A\n-A KUBE-SVC-A -j KUBE-SEP-EMPTY\n\
                    -A KUBE-SVC-A -j KUBE-SEP-MISSING\n-A KUBE-SEP-LOST -j DNAT --to-destination 10.0.0.1:80\n\
                    -X KUBE-SEP-OLD\nCOMMIT\n";
        let problems = lint(text, &["KUBE-SERVICES"]);
        assert_eq!(
            problems,
            [
                "nat: KUBE-SVC-A jumps to KUBE-SEP-EMPTY, which is empty",
                "nat: KUBE-SVC-A jumps to KUBE-SEP-MISSING, which is not declared",
                "nat: chain KUBE-SEP-LOST is declared but nothing jumps to it",
            ]
        );
    }
}
