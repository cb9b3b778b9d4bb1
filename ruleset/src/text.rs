//! The model's text form: `iptables-restore` input (printed) and `iptables-save` output or
//! restore input (parsed). One parser and one printer for the workspace.
//!
//! Printing follows kube-proxy: a word is quoted only when it holds a space (or a quote or
//! backslash, escaped), matches keep their order, addresses keep the form they were built with
//! (`10.96.0.1` or `10.96.0.1/32`), probabilities have 10 decimals. Parsing takes what
//! `iptables-save` prints too: quotes around any word, `/32` hosts, 11 decimals, matches in its
//! own order, and options of modules the model does not know (kept word for word).

use std::fmt::{self, Write};

use crate::error::{Result, RulesetError};
use crate::model::{Addr, ChainDecl, Command, MarkOp, Match, RecentOp, Rule, Ruleset, Table, Target};

// === printing ===

/// A word as a restore input carries it: quoted when it holds whitespace, a quote or a
/// backslash (kube-proxy's rule: `--comment "ns/svc cluster IP"`, `--comment ns/svc`).
pub fn quote(word: &str) -> String {
    if !word.is_empty() && !word.chars().any(|c| c.is_whitespace() || c == '"' || c == '\\') {
        return word.to_string();
    }
    let mut out = String::with_capacity(word.len() + 2);
    out.push('"');
    for c in word.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn neg(negated: bool) -> &'static str {
    if negated {
        "! "
    } else {
        ""
    }
}

fn write_match(out: &mut String, m: &Match) {
    // Writing into a String cannot fail.
    let _ = match m {
        Match::Comment(c) => write!(out, " -m comment --comment {}", quote(c)),
        Match::Module(name) => write!(out, " -m {name}"),
        Match::Protocol { proto, negated } => write!(out, " {}-p {proto}", neg(*negated)),
        Match::Source { addr, negated } => write!(out, " {}-s {addr}", neg(*negated)),
        Match::Destination { addr, negated } => write!(out, " {}-d {addr}", neg(*negated)),
        Match::InInterface { name, negated } => write!(out, " {}-i {name}", neg(*negated)),
        Match::OutInterface { name, negated } => write!(out, " {}-o {name}", neg(*negated)),
        Match::DestinationPort { port, negated } => write!(out, " {}--dport {port}", neg(*negated)),
        Match::SourcePort { port, negated } => write!(out, " {}--sport {port}", neg(*negated)),
        Match::TcpFlags { mask, set, negated } => write!(out, " {}--tcp-flags {mask} {set}", neg(*negated)),
        Match::AddrType { source, kind, negated } => {
            write!(out, " -m addrtype {}--{}-type {kind}", neg(*negated), if *source { "src" } else { "dst" })
        }
        Match::Mark { value, mask, negated } => write!(out, " -m mark {}--mark {value:#x}", neg(*negated))
            .and_then(|()| mask.map_or(Ok(()), |m| write!(out, "/{m:#x}"))),
        Match::ConnState { states, negated } => {
            write!(out, " -m conntrack {}--ctstate {}", neg(*negated), states.join(","))
        }
        Match::State { states } => write!(out, " -m state --state {}", states.join(",")),
        Match::Probability(p) => write!(out, " -m statistic --mode random --probability {p:.10}"),
        Match::Recent { name, op, extra } => {
            let _ = write!(out, " -m recent --name {name}");
            let _ = match op {
                RecentOp::Set => write!(out, " --set"),
                RecentOp::Check { seconds, reap } => write!(out, " --rcheck")
                    .and_then(|()| seconds.map_or(Ok(()), |s| write!(out, " --seconds {s}")))
                    .and_then(|()| if *reap { write!(out, " --reap") } else { Ok(()) }),
            };
            write_words(out, extra)
        }
        Match::PhysdevIsIn { negated } => write!(out, " -m physdev {}--physdev-is-in", neg(*negated)),
        Match::Tos(v) => write!(out, " -m tos --tos {v}"),
        Match::Other(words) => write_words(out, words),
    };
}

fn write_words(out: &mut String, words: &[String]) -> fmt::Result {
    for w in words {
        if w == "!" {
            out.push_str(" !");
        } else {
            write!(out, " {}", quote(w))?;
        }
    }
    Ok(())
}

fn write_target(out: &mut String, t: &Target) {
    let _ = match t {
        Target::Jump(c) => write!(out, " -j {c}"),
        Target::Goto(c) => write!(out, " -g {c}"),
        Target::Accept | Target::Drop | Target::Return | Target::Trace => write!(out, " -j {}", t.name()),
        Target::Reject { with } => {
            write!(out, " -j REJECT").and_then(|()| with.as_ref().map_or(Ok(()), |w| write!(out, " --reject-with {w}")))
        }
        Target::Mark(MarkOp::Or(b)) => write!(out, " -j MARK --or-mark {b:#x}"),
        Target::Mark(MarkOp::Xor(b)) => write!(out, " -j MARK --xor-mark {b:#x}"),
        Target::Mark(MarkOp::SetXmark(v, m)) => write!(out, " -j MARK --set-xmark {v:#x}/{m:#x}"),
        Target::Masquerade { random_fully } => {
            write!(out, " -j MASQUERADE{}", if *random_fully { " --random-fully" } else { "" })
        }
        Target::Dnat { to } => write!(out, " -j DNAT --to-destination {to}"),
        Target::Redirect { to_ports } => write!(out, " -j REDIRECT --to-ports {to_ports}"),
        Target::Other { name, args } => write!(out, " -j {name}").and_then(|()| write_words(out, args)),
    };
}

/// `CHAIN matches… target…` (what follows `-A`).
pub(crate) fn rule_spec(r: &Rule) -> String {
    let mut out = r.chain.clone();
    write_rule_body(&mut out, r);
    out
}

fn write_rule_body(out: &mut String, r: &Rule) {
    for m in &r.matches {
        write_match(out, m);
    }
    if let Some(t) = &r.target {
        write_target(out, t);
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Append(r) => write!(f, "-A {}", rule_spec(r)),
            Command::Insert { position, rule } => {
                let mut body = String::new();
                write_rule_body(&mut body, rule);
                write!(f, "-I {} {position}{body}", rule.chain)
            }
            Command::Delete(r) => write!(f, "-D {}", rule_spec(r)),
            Command::Flush(c) => write!(f, "-F {c}"),
            Command::DeleteChain(c) => write!(f, "-X {c}"),
        }
    }
}

impl fmt::Display for Table {
    /// One table of a restore input: `*name`, declarations, commands, `COMMIT`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "*{}", self.name)?;
        for c in &self.chains {
            writeln!(f, ":{} {} [0:0]", c.name, c.policy.as_deref().unwrap_or("-"))?;
        }
        for c in &self.commands {
            writeln!(f, "{c}")?;
        }
        writeln!(f, "COMMIT")
    }
}

impl fmt::Display for Ruleset {
    /// The whole `iptables-restore` input.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for t in &self.tables {
            write!(f, "{t}")?;
        }
        Ok(())
    }
}

// === parsing ===

/// Splits a line into words like iptables-restore does: double quotes group words, a backslash
/// inside quotes escapes the next character.
pub fn split_words(line: &str) -> Vec<String> {
    let mut out = vec![];
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        match ch {
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    cur.push(next);
                }
            }
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

/// Parses `iptables-save` output or a restore input (`#` comments and blank lines skipped).
pub fn parse(text: &str) -> Result<Ruleset> {
    let mut rs = Ruleset::default();
    let mut open = false;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        let err = |reason: String| RulesetError::Parse { line: n + 1, text: line.to_string(), reason };
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('*') {
            rs.tables.push(Table::new(name.trim()));
            open = true;
            continue;
        }
        if line == "COMMIT" {
            if !open {
                return Err(err("COMMIT without a table".into()));
            }
            open = false;
            continue;
        }
        let table = match rs.tables.last_mut() {
            Some(t) if open => t,
            _ => return Err(err("not inside a table (`*name` … `COMMIT`)".into())),
        };
        if let Some(decl) = line.strip_prefix(':') {
            let mut w = decl.split_whitespace();
            let name = w.next().ok_or_else(|| err("a chain declaration without a name".into()))?;
            let policy = w.next().filter(|p| *p != "-").map(str::to_string);
            table.chains.push(ChainDecl { name: name.to_string(), policy });
            continue;
        }
        let words = split_words(line);
        let cmd = command(&words).map_err(err)?;
        table.commands.push(cmd);
    }
    if open {
        return Err(RulesetError::Parse {
            line: text.lines().count(),
            text: String::new(),
            reason: "the input ends without COMMIT".into(),
        });
    }
    Ok(rs)
}

fn command(words: &[String]) -> std::result::Result<Command, String> {
    let op = words.first().map(String::as_str).unwrap_or("");
    let chain = || words.get(1).cloned().ok_or_else(|| format!("{op} without a chain"));
    Ok(match op {
        "-A" | "--append" => Command::Append(rule(&chain()?, &words[2..])?),
        "-D" | "--delete" => Command::Delete(rule(&chain()?, &words[2..])?),
        "-I" | "--insert" => {
            let (position, rest) = match words.get(2).and_then(|w| w.parse::<usize>().ok()) {
                Some(p) => (p.max(1), 3),
                None => (1, 2),
            };
            Command::Insert { position, rule: rule(&chain()?, words.get(rest..).unwrap_or_default())? }
        }
        "-F" | "--flush" => Command::Flush(chain()?),
        "-X" | "--delete-chain" => Command::DeleteChain(chain()?),
        other => return Err(format!("unsupported command {other:?}")),
    })
}

/// Parses one `-A CHAIN …` line (as `iptables-save` or a restore input writes it).
pub fn parse_rule_line(line: &str) -> Result<Rule> {
    let words = split_words(line);
    match command(&words) {
        Ok(Command::Append(r)) => Ok(r),
        Ok(_) => Err(RulesetError::Parse { line: 1, text: line.into(), reason: "not an -A line".into() }),
        Err(reason) => Err(RulesetError::Parse { line: 1, text: line.into(), reason }),
    }
}

/// Target names that are extensions of iptables, not chains (so `-j NAME` is not a jump).
const TARGET_EXTENSIONS: &[&str] = &[
    "SNAT",
    "LOG",
    "NOTRACK",
    "CT",
    "CONNMARK",
    "TCPMSS",
    "CHECKSUM",
    "NFLOG",
    "NFQUEUE",
    "QUEUE",
    "TOS",
    "DSCP",
    "TTL",
    "NETMAP",
    "TEE",
    "TPROXY",
    "SET",
    "AUDIT",
    "CLASSIFY",
    "SECMARK",
    "CONNSECMARK",
    "HMARK",
    "IDLETIMER",
    "LED",
    "RATEEST",
    "SYNPROXY",
    "ULOG",
    "MIRROR",
];

/// Reads the words of a rule (after `-A CHAIN`).
struct Words<'a> {
    w: &'a [String],
    i: usize,
}

impl<'a> Words<'a> {
    fn next(&mut self) -> Option<&'a str> {
        let w = self.w.get(self.i)?;
        self.i += 1;
        Some(w)
    }
    fn peek(&self) -> Option<&'a str> {
        self.w.get(self.i).map(String::as_str)
    }
    fn value(&mut self, flag: &str) -> std::result::Result<String, String> {
        self.next().map(str::to_string).ok_or_else(|| format!("{flag} without a value"))
    }
    /// A module's option: `--NAME`, possibly after `!`.
    fn at_option(&self) -> bool {
        match self.peek() {
            Some("!") => self.w.get(self.i + 1).is_some_and(|n| n.starts_with("--")),
            Some(w) => w.starts_with("--"),
            None => false,
        }
    }
    /// The words of unknown options: each `--flag` with the values after it.
    fn rest_of_module(&mut self, out: &mut Vec<String>) {
        while self.at_option() {
            out.push(self.next().unwrap_or_default().to_string());
            if out.last().is_some_and(|w| w == "!") {
                out.push(self.next().unwrap_or_default().to_string());
            }
            while self.peek().is_some_and(|w| !w.starts_with('-') && w != "!") {
                out.push(self.next().unwrap_or_default().to_string());
            }
        }
    }
}

fn addr(s: &str) -> std::result::Result<Addr, String> {
    if s.contains('/') {
        s.parse().map(Addr::Net).map_err(|_| format!("invalid address {s:?}"))
    } else {
        s.parse().map(Addr::Host).map_err(|_| format!("invalid address {s:?}"))
    }
}

fn number(s: &str) -> std::result::Result<u32, String> {
    let parsed = match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("invalid number {s:?}"))
}

fn value_mask(s: &str) -> std::result::Result<(u32, Option<u32>), String> {
    match s.split_once('/') {
        Some((v, m)) => Ok((number(v)?, Some(number(m)?))),
        None => Ok((number(s)?, None)),
    }
}

/// The rule of `chain` written as `words`.
pub(crate) fn rule(chain: &str, words: &[String]) -> std::result::Result<Rule, String> {
    let mut r = Rule::new(chain);
    let mut w = Words { w: words, i: 0 };
    let mut negated = false;
    while let Some(word) = w.next() {
        let m = match word {
            "!" => {
                negated = true;
                continue;
            }
            "-p" | "--protocol" => Match::Protocol { proto: w.value(word)?, negated },
            "-s" | "--source" => Match::Source { addr: addr(&w.value(word)?)?, negated },
            "-d" | "--destination" => Match::Destination { addr: addr(&w.value(word)?)?, negated },
            "-i" | "--in-interface" => Match::InInterface { name: w.value(word)?, negated },
            "-o" | "--out-interface" => Match::OutInterface { name: w.value(word)?, negated },
            "--dport" | "--destination-port" => Match::DestinationPort { port: w.value(word)?, negated },
            "--sport" | "--source-port" => Match::SourcePort { port: w.value(word)?, negated },
            "--tcp-flags" => Match::TcpFlags { mask: w.value(word)?, set: w.value(word)?, negated },
            "-m" | "--match" => {
                let name = w.value(word)?;
                module(&mut r, &mut w, &name)?;
                negated = false;
                continue;
            }
            "-j" | "--jump" => {
                r.target = Some(target(&w.value(word)?, &words[w.i..])?);
                break;
            }
            "-g" | "--goto" => {
                r.target = Some(Target::Goto(w.value(word)?));
                negated = false;
                continue;
            }
            other => {
                let mut words = vec![other.to_string()];
                if negated {
                    words.insert(0, "!".into());
                }
                while w.peek().is_some_and(|v| !v.starts_with('-') && v != "!") {
                    words.push(w.next().unwrap_or_default().to_string());
                }
                Match::Other(words)
            }
        };
        r.matches.push(m);
        negated = false;
    }
    Ok(r)
}

/// `-m NAME` and its options.
fn module(r: &mut Rule, w: &mut Words<'_>, name: &str) -> std::result::Result<(), String> {
    let mut negated = false;
    let mut other: Vec<String> = vec!["-m".into(), name.into()];
    let known = matches!(
        name,
        "comment" | "addrtype" | "mark" | "conntrack" | "state" | "statistic" | "recent" | "physdev" | "tos"
    );
    if !known {
        if matches!(name, "tcp" | "udp" | "sctp" | "udplite" | "icmp") {
            r.matches.push(Match::Module(name.into()));
            return Ok(());
        }
        w.rest_of_module(&mut other);
        r.matches.push(Match::Other(other));
        return Ok(());
    }
    let mut recent: Option<(String, Option<RecentOp>, Vec<String>)> =
        (name == "recent").then(|| (String::new(), None, vec![]));
    let mut statistic_random = false;
    while w.at_option() {
        let flag = w.next().unwrap_or_default();
        if flag == "!" {
            negated = true;
            continue;
        }
        let m = match (name, flag) {
            ("comment", "--comment") => Some(Match::Comment(w.value(flag)?)),
            ("addrtype", "--src-type" | "--dst-type") => {
                Some(Match::AddrType { source: flag == "--src-type", kind: w.value(flag)?, negated })
            }
            ("mark", "--mark") => {
                let (value, mask) = value_mask(&w.value(flag)?)?;
                Some(Match::Mark { value, mask, negated })
            }
            ("conntrack", "--ctstate") => {
                Some(Match::ConnState { states: w.value(flag)?.split(',').map(str::to_string).collect(), negated })
            }
            ("state", "--state") => {
                Some(Match::State { states: w.value(flag)?.split(',').map(str::to_string).collect() })
            }
            ("statistic", "--mode") => {
                statistic_random = w.value(flag)? == "random";
                None
            }
            ("statistic", "--probability") if statistic_random => {
                let v = w.value(flag)?;
                Some(Match::Probability(v.parse().map_err(|_| format!("invalid probability {v:?}"))?))
            }
            ("physdev", "--physdev-is-in") => Some(Match::PhysdevIsIn { negated }),
            ("tos", "--tos") => Some(Match::Tos(w.value(flag)?)),
            ("recent", _) => {
                let (rname, op, extra) = recent.as_mut().expect("set for recent");
                match flag {
                    "--name" => *rname = w.value(flag)?,
                    "--set" => *op = Some(RecentOp::Set),
                    "--rcheck" => *op = Some(RecentOp::Check { seconds: None, reap: false }),
                    "--seconds" => {
                        let s = w.value(flag)?;
                        let secs = s.parse().map_err(|_| format!("invalid --seconds {s:?}"))?;
                        match op {
                            Some(RecentOp::Check { seconds, .. }) => *seconds = Some(secs),
                            _ => extra.extend([flag.to_string(), s]),
                        }
                    }
                    "--reap" => match op {
                        Some(RecentOp::Check { reap, .. }) => *reap = true,
                        _ => extra.push(flag.into()),
                    },
                    _ => {
                        extra.push(flag.into());
                        while w.peek().is_some_and(|v| !v.starts_with('-') && v != "!") {
                            extra.push(w.next().unwrap_or_default().to_string());
                        }
                    }
                }
                None
            }
            _ => {
                // An option the model does not know: the whole module stays word for word.
                if negated {
                    other.push("!".into());
                }
                other.push(flag.into());
                while w.peek().is_some_and(|v| !v.starts_with('-') && v != "!") {
                    other.push(w.next().unwrap_or_default().to_string());
                }
                None
            }
        };
        if let Some(m) = m {
            r.matches.push(m);
        }
        negated = false;
    }
    if let Some((rname, op, extra)) = recent {
        match op {
            Some(op) => r.matches.push(Match::Recent { name: rname, op, extra }),
            None => {
                let mut words = vec!["-m".to_string(), "recent".into(), "--name".into(), rname];
                words.extend(extra);
                r.matches.push(Match::Other(words));
            }
        }
    }
    if other.len() > 2 {
        r.matches.push(Match::Other(other));
    }
    Ok(())
}

/// `-j NAME` with its options.
fn target(name: &str, args: &[String]) -> std::result::Result<Target, String> {
    let arg = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let only = |flags: &[&str]| args.iter().all(|a| flags.contains(&a.as_str()) || !a.starts_with("--"));
    let other = || Target::Other { name: name.to_string(), args: args.to_vec() };
    Ok(match name {
        "ACCEPT" | "DROP" | "RETURN" | "TRACE" if args.is_empty() => Target::named(name),
        "REJECT" if only(&["--reject-with"]) => Target::Reject { with: arg("--reject-with") },
        "MASQUERADE" if only(&["--random-fully"]) => {
            Target::Masquerade { random_fully: args.iter().any(|a| a == "--random-fully") }
        }
        "DNAT" if args.len() == 2 && args[0] == "--to-destination" => Target::Dnat { to: args[1].clone() },
        "REDIRECT" if args.len() == 2 && args[0] == "--to-ports" => Target::Redirect { to_ports: args[1].clone() },
        "MARK" if args.len() == 2 => match args[0].as_str() {
            "--or-mark" => Target::Mark(MarkOp::Or(number(&args[1])?)),
            "--xor-mark" => Target::Mark(MarkOp::Xor(number(&args[1])?)),
            "--set-xmark" => match value_mask(&args[1])? {
                (v, Some(m)) => Target::Mark(MarkOp::SetXmark(v, m)),
                (v, None) => Target::Mark(MarkOp::SetXmark(v, u32::MAX)),
            },
            _ => other(),
        },
        _ if !args.is_empty() || TARGET_EXTENSIONS.contains(&name) => other(),
        _ if ["ACCEPT", "DROP", "RETURN", "TRACE", "REJECT", "MASQUERADE", "DNAT", "REDIRECT", "MARK"]
            .contains(&name) =>
        {
            other()
        }
        chain => Target::Jump(chain.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBE_PROXY: &str = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-X - [0:0]\n:KUBE-SEP-A - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n\
        -A KUBE-SERVICES -m comment --comment \"ns/svc cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-X\n\
        -A KUBE-SVC-X -m comment --comment \"ns/svc cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ\n\
        -A KUBE-SVC-X -m comment --comment \"ns/svc -> 10.244.1.5:8080\" -m recent --name KUBE-SEP-A --rcheck --seconds 10800 --reap -j KUBE-SEP-A\n\
        -A KUBE-SVC-X -m comment --comment \"ns/svc -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-A\n\
        -A KUBE-SEP-A -m comment --comment ns/svc -m recent --name KUBE-SEP-A --set -m tcp -p tcp -j DNAT --to-destination 10.244.1.5:8080\n\
        -A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
        -A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n\
        -A KUBE-FW-X -m comment --comment \"other traffic to ns/svc will be dropped by KUBE-PROXY-FIREWALL\"\n\
        -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
        -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
        -A KUBE-PORTALS-CONTAINER -m comment --comment ns1/web -p tcp -m tcp --dport 80 -d 10.96.0.41/32 -m physdev ! --physdev-is-in -j REDIRECT --to-ports 40001\n\
        -A KUBE-NODEPORT-NON-LOCAL -m comment --comment ns1/web -p tcp -m tcp --dport 40001 -m state --state NEW -j ACCEPT\n\
        -I PREROUTING 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
        -D POSTROUTING -s 10.244.1.2/32 -m comment --comment \"name: \\\"podpath\\\" id: \\\"abc\\\"\" -j CNI-1\n\
        -F CNI-1\n-X KUBE-SEP-OLD\nCOMMIT\n";

    #[test]
    fn restore_text_round_trips_byte_for_byte() {
        let rs = parse(KUBE_PROXY).unwrap();
        assert_eq!(rs.to_string(), KUBE_PROXY);
        let nat = rs.table("nat").unwrap();
        let rules: Vec<&Rule> = nat.rules().collect();
        assert_eq!(rules[0].comment_text(), Some("ns/svc cluster IP"));
        assert_eq!(rules[0].jump_target(), Some("KUBE-SVC-X"));
        assert_eq!(rules[1].source(), Some((Addr::Net("10.244.0.0/16".parse().unwrap()), true)));
        assert_eq!(rules[3].probability(), Some(0.5));
        assert_eq!(rules[4].target, Some(Target::Dnat { to: "10.244.1.5:8080".into() }));
        assert_eq!(rules[7].target, None, "a rule without a target");
        match &nat.commands[13] {
            Command::Delete(r) => assert_eq!(r.comment_text(), Some("name: \"podpath\" id: \"abc\"")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn iptables_save_output_parses_into_the_same_matches() {
        // What the kernel lists for rules kube-proxy wrote (iptables-nft 1.8).
        let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-X - [0:0]\n\
            -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
            -A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"ns/svc cluster IP\" -m tcp --dport 80 -j KUBE-SVC-X\n\
            -A KUBE-SVC-X -m comment --comment \"ns/svc -> 10.244.1.5:8080\" -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A\n\
            -A KUBE-SVC-X -m comment --comment \"ns/svc -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A\n\
            -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
            -A PODPATH-TRACE -p tcp -m tcp --tcp-flags SYN,ACK SYN -m tos --tos 0x2d/0xfc -j TRACE\n\
            -A X -m limit --limit 5/sec ! --limit-burst 3 -j LOG --log-prefix \"a b\"\n\
            COMMIT\n";
        let rs = parse(saved).unwrap();
        let nat = rs.table("nat").unwrap();
        assert_eq!(nat.chains[0].policy.as_deref(), Some("ACCEPT"));
        let r: Vec<&Rule> = nat.rules().collect();
        assert_eq!(r[1].destination(), Some((Addr::Net("10.96.0.1/32".parse().unwrap()), false)));
        assert_eq!(r[1].protocol(), Some("tcp"));
        assert_eq!(r[1].destination_port(), Some("80"));
        assert_eq!(
            r[2].matches[1],
            Match::Recent {
                name: "KUBE-SEP-A".into(),
                op: RecentOp::Check { seconds: Some(10800), reap: true },
                extra: vec!["--mask".into(), "255.255.255.255".into(), "--rsource".into()]
            }
        );
        assert_eq!(r[3].probability(), Some(0.5));
        assert_eq!(r[4].target, Some(Target::Mark(MarkOp::SetXmark(0x4000, 0x4000))));
        assert_eq!(r[5].target, Some(Target::Trace));
        assert!(r[5].matches.contains(&Match::TcpFlags { mask: "SYN,ACK".into(), set: "SYN".into(), negated: false }));
        assert_eq!(
            r[6].matches,
            [Match::Other(["-m", "limit", "--limit", "5/sec", "!", "--limit-burst", "3"].map(String::from).to_vec())]
        );
        assert_eq!(
            r[6].target,
            Some(Target::Other { name: "LOG".into(), args: vec!["--log-prefix".into(), "a b".into()] })
        );
        assert_eq!(
            r[6].to_string(),
            "-A X -m limit --limit 5/sec ! --limit-burst 3 -j LOG --log-prefix \"a b\"",
            "unknown modules and targets print back as they came"
        );
    }

    #[test]
    fn bad_input_names_the_line() {
        let e = parse("*nat\n-A X -s not-an-ip -j ACCEPT\nCOMMIT\n").unwrap_err().to_string();
        assert_eq!(e, "line 2: -A X -s not-an-ip -j ACCEPT: invalid address \"not-an-ip\"");
        assert!(parse("*nat\n-A X -j ACCEPT\n").unwrap_err().to_string().contains("without COMMIT"));
        assert!(parse("-A X -j ACCEPT\n").unwrap_err().to_string().contains("not inside a table"));
        assert!(parse("*nat\n-Z X\nCOMMIT\n").unwrap_err().to_string().contains("unsupported command"));
        assert_eq!(
            split_words(r#"-m comment --comment "a \"b\" c" -j X"#),
            ["-m", "comment", "--comment", "a \"b\" c", "-j", "X"]
        );
        assert_eq!(quote("ns/svc"), "ns/svc");
        assert_eq!(quote("a \"b\""), "\"a \\\"b\\\"\"");
    }
}
