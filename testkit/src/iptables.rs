//! A fake iptables with `iptables-restore --noflush` semantics over `podpath_ruleset`'s model, and
//! a packet tracer over it.
//!
//! Restore: a table is applied atomically (or not at all; an input with a failing table changes
//! nothing); a declaration creates a chain or flushes an existing one; `-A`/`-I` need the chain
//! declared or existing, and at the end of the table every jump target must exist; `-D` needs
//! the rule; `-X` deletes a chain that is empty and that nothing references. Chains not
//! mentioned are left alone, exactly what partial syncs rely on.
//!
//! Tracer: follows a packet (source, destination, protocol, port, mark) from a chain through
//! the typed matches of the rules (`-s/-d/-p/--dport`, negation, `addrtype`, `mark`,
//! `statistic`, `recent`; `comment`, `conntrack`, `state` and the like test nothing here) and
//! their targets (`DNAT`, `REDIRECT`, `MARK`, `MASQUERADE`, `ACCEPT`, `DROP`, `REJECT`, `RETURN`,
//! jumps), and reports every rule that matched and the verdict.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};

use podpath_ruleset::{ChainDecl, Command, Match, RecentOp, Rule, Ruleset, Table, Target};

const BUILTIN: [(&str, &[&str]); 4] = [
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    ("mangle", &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"]),
    ("raw", &["PREROUTING", "OUTPUT"]),
];

/// One table of the fake: chains (by name) with their rules.
pub type Chains = BTreeMap<String, Vec<Rule>>;

/// The fake.
#[derive(Debug, Clone)]
pub struct FakeIptables {
    pub tables: BTreeMap<String, Chains>,
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

/// Applies one table's declarations and commands to a copy of its chains.
fn apply_table(current: &Chains, t: &Table) -> Result<Chains, String> {
    let mut chains = current.clone();
    let table = &t.name;
    for ChainDecl { name, .. } in &t.chains {
        if name.len() > 28 {
            return Err(format!("{table}: chain name {name} is longer than 28 characters"));
        }
        chains.insert(name.clone(), vec![]);
    }
    for c in &t.commands {
        let at = |m: String| format!("{table}: {m}: {c}");
        match c {
            Command::Append(r) => {
                chains.get_mut(&r.chain).ok_or_else(|| at(format!("no chain {}", r.chain)))?.push(r.clone());
            }
            Command::Insert { position, rule } => {
                let rules = chains.get_mut(&rule.chain).ok_or_else(|| at(format!("no chain {}", rule.chain)))?;
                let pos = position.max(&1) - 1;
                if pos > rules.len() {
                    return Err(at(format!("index {position} past the end of {}", rule.chain)));
                }
                rules.insert(pos, rule.clone());
            }
            Command::Delete(rule) => {
                let rules = chains.get_mut(&rule.chain).ok_or_else(|| at(format!("no chain {}", rule.chain)))?;
                let i = rules.iter().position(|r| r == rule).ok_or_else(|| at("no such rule".into()))?;
                rules.remove(i);
            }
            Command::Flush(chain) => chains.get_mut(chain).ok_or_else(|| at(format!("no chain {chain}")))?.clear(),
            Command::DeleteChain(chain) => {
                if is_builtin(table, chain) {
                    return Err(at("cannot delete a built-in chain".into()));
                }
                if chains.get(chain).is_none_or(|r| !r.is_empty()) {
                    return Err(at(format!("chain {chain} is missing or not empty")));
                }
                if chains.values().flatten().any(|r| r.jump_target() == Some(chain.as_str())) {
                    return Err(at(format!("chain {chain} is still referenced")));
                }
                chains.remove(chain);
            }
        }
    }
    for (chain, rules) in &chains {
        for target in rules.iter().filter_map(Rule::jump_target) {
            if !chains.contains_key(target) {
                return Err(format!("COMMIT of {table}: chain {chain} jumps to missing {target}"));
            }
        }
    }
    Ok(chains)
}

impl FakeIptables {
    /// `iptables-restore --noflush`.
    pub fn restore(&mut self, rs: &Ruleset) -> Result<(), String> {
        let mut staged = vec![];
        for t in &rs.tables {
            let current = self.tables.get(&t.name).ok_or_else(|| format!("no table {}", t.name))?;
            staged.push((t.name.clone(), apply_table(current, t)?));
        }
        for (t, chains) in staged {
            self.tables.insert(t, chains);
        }
        Ok(())
    }

    /// `iptables-restore --noflush` of text.
    pub fn restore_text(&mut self, text: &str) -> Result<(), String> {
        self.restore(&podpath_ruleset::parse(text).map_err(|e| e.to_string())?)
    }

    /// Chain names of a table.
    pub fn chains(&self, table: &str) -> BTreeSet<String> {
        self.tables.get(table).map(|t| t.keys().cloned().collect()).unwrap_or_default()
    }

    /// `iptables-save -t TABLE`: built-in chains with policy ACCEPT, then every rule.
    pub fn save(&self, table: &str) -> Table {
        let mut out = Table::new(table);
        let Some(t) = self.tables.get(table) else { return out };
        for chain in t.keys() {
            let policy = is_builtin(table, chain).then(|| "ACCEPT".to_string());
            out.chains.push(ChainDecl { name: chain.clone(), policy });
        }
        for rules in t.values() {
            rules.iter().cloned().for_each(|r| out.append(r));
        }
        out
    }

    /// `iptables -t TABLE -S CHAIN`: only that chain (absent when it does not exist).
    pub fn save_chain(&self, table: &str, chain: &str) -> Table {
        let mut out = Table::new(table);
        if let Some(rules) = self.tables.get(table).and_then(|t| t.get(chain)) {
            out.chains.push(ChainDecl { name: chain.to_string(), policy: None });
            rules.iter().cloned().for_each(|r| out.append(r));
        }
        out
    }

    /// Rules of a chain as text (what follows `-A CHAIN`).
    pub fn rules(&self, table: &str, chain: &str) -> Vec<String> {
        let body = |r: &Rule| r.spec()[r.chain.len()..].trim_start().to_string();
        self.tables.get(table).and_then(|t| t.get(chain)).map(|rs| rs.iter().map(body).collect()).unwrap_or_default()
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
    /// `REDIRECT --to-ports PORT`: to the node itself.
    Redirect(u16),
    Masquerade,
}

/// One matched rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub chain: String,
    /// The rule as written after `-A CHAIN`.
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

enum Outcome {
    Continue,
    Return,
    Final(Verdict),
}

/// `PORT` or `FIRST:LAST` contains `port`.
fn port_matches(spec: &str, port: u16) -> bool {
    match spec.split_once(':') {
        Some((a, b)) => a.parse().is_ok_and(|a: u16| a <= port) && b.parse().is_ok_and(|b: u16| port <= b),
        None => spec.parse() == Ok(port),
    }
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
            let spec = rule.spec();
            steps.push(Step { chain: chain.to_string(), rule: spec[chain.len()..].trim_start().to_string() });
            for m in &rule.matches {
                if let Match::Recent { name, op: RecentOp::Set, .. } = m {
                    self.recent.entry(name.clone()).or_default().insert(p.src);
                }
            }
            match &rule.target {
                None | Some(Target::Trace | Target::Other { .. }) => {}
                Some(Target::Accept) => return Outcome::Final(Verdict::Accept),
                Some(Target::Drop) => return Outcome::Final(Verdict::Drop),
                Some(Target::Reject { .. }) => return Outcome::Final(Verdict::Reject),
                Some(Target::Return) => return Outcome::Return,
                Some(Target::Masquerade { .. }) => return Outcome::Final(Verdict::Masquerade),
                Some(Target::Dnat { to }) => {
                    let to: SocketAddr = to.parse().expect("DNAT --to-destination ip:port");
                    p.dst = to.ip();
                    p.dport = to.port();
                    return Outcome::Final(Verdict::Dnat(to));
                }
                Some(Target::Redirect { to_ports }) => {
                    return Outcome::Final(Verdict::Redirect(to_ports.parse().expect("REDIRECT --to-ports PORT")))
                }
                Some(Target::Mark(op)) => p.mark = op.apply(p.mark),
                Some(Target::Jump(child) | Target::Goto(child)) => match self.walk(table, child, p, steps, depth + 1) {
                    Outcome::Final(v) => return Outcome::Final(v),
                    Outcome::Return | Outcome::Continue => {}
                },
            }
        }
        Outcome::Continue
    }

    fn matches(&mut self, rule: &Rule, p: &Packet) -> bool {
        rule.matches.iter().all(|m| match m {
            Match::Protocol { proto, negated } => (p.proto == *proto) != *negated,
            Match::Source { addr, negated } => addr.contains(p.src) != *negated,
            Match::Destination { addr, negated } => addr.contains(p.dst) != *negated,
            Match::DestinationPort { port, negated } => port_matches(port, p.dport) != *negated,
            Match::AddrType { source, kind, negated } => {
                let ip = if *source { p.src } else { p.dst };
                ((kind == "LOCAL") == self.local.contains(&ip)) != *negated
            }
            Match::Mark { value, mask, negated } => (p.mark & mask.unwrap_or(u32::MAX) == *value) != *negated,
            Match::Probability(prob) => (self.statistic)(*prob),
            Match::Recent { name, op: RecentOp::Check { .. }, .. } => {
                self.recent.get(name).is_some_and(|s| s.contains(&p.src))
            }
            // Every traced packet opens a connection: it is NEW, never ESTABLISHED or INVALID.
            Match::ConnState { states, negated } => states.iter().any(|s| s == "NEW") != *negated,
            // Nothing to test on this packet model: comments, modules, physdev, TOS, source
            // ports, flags, interfaces.
            _ => true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restore(f: &mut FakeIptables, text: &str) -> Result<(), String> {
        f.restore_text(text)
    }

    #[test]
    fn restore_is_atomic_and_noflush() {
        let mut f = FakeIptables::default();
        restore(&mut f, "*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j RETURN\n-A PREROUTING -j KUBE-A\nCOMMIT\n").unwrap();
        assert_eq!(f.rules("nat", "KUBE-A"), ["-j RETURN"]);
        // A failing section changes nothing.
        assert!(restore(&mut f, "*nat\n:KUBE-B - [0:0]\n-A KUBE-B -j KUBE-MISSING\nCOMMIT\n").is_err());
        assert!(!f.chains("nat").contains("KUBE-B"));
        // Not mentioned: untouched; declared again: flushed.
        restore(&mut f, "*nat\n:KUBE-C - [0:0]\nCOMMIT\n").unwrap();
        assert_eq!(f.rules("nat", "KUBE-A"), ["-j RETURN"]);
        restore(&mut f, "*nat\n:KUBE-A - [0:0]\nCOMMIT\n").unwrap();
        assert!(f.rules("nat", "KUBE-A").is_empty());
        // -X refuses a referenced chain.
        assert!(restore(&mut f, "*nat\n-X KUBE-A\nCOMMIT\n").is_err());
        restore(&mut f, "*nat\n:KUBE-C - [0:0]\n-X KUBE-C\nCOMMIT\n").unwrap();
        assert!(!f.chains("nat").contains("KUBE-C"));
        // -D removes the rule; a missing one fails.
        restore(&mut f, "*nat\n-D PREROUTING -j KUBE-A\nCOMMIT\n").unwrap();
        assert!(f.rules("nat", "PREROUTING").is_empty());
        assert!(restore(&mut f, "*nat\n-D PREROUTING -j KUBE-A\nCOMMIT\n").is_err());
    }

    #[test]
    fn tracer_follows_jumps_marks_and_dnat() {
        let mut f = FakeIptables::default();
        restore(
            &mut f,
            concat!(
                "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n:KUBE-SEP-A - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
                "-A PREROUTING -j KUBE-SERVICES\n",
                "-A KUBE-SERVICES -m comment --comment \"ns/svc cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-X\n",
                "-A KUBE-SVC-X -m tcp -p tcp -d 10.96.0.1 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n",
                "-A KUBE-SVC-X -j KUBE-SEP-A\n",
                "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n",
                "-A KUBE-SEP-A -m tcp -p tcp -j DNAT --to-destination 10.244.1.5:8080\n",
                "COMMIT\n"
            ),
        )
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
