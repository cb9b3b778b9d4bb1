//! The model: a [`Ruleset`] is tables; a [`Table`] declares chains and holds the commands that
//! follow, in order; a [`Rule`] is its chain, typed [`Match`]es and a [`Target`].
//!
//! Matches are kept in the order they were written, because iptables evaluates them in that
//! order and because kube-proxy's rule text (which the renderer reproduces byte for byte) puts
//! them in an order of its own (`-m tcp -p tcp -d IP --dport P`); `iptables-save` prints another
//! (`-d IP/32 -p tcp -m tcp --dport P`). Both parse into the same kinds of matches, so a
//! reader asks a rule for its comment, probability or DNAT destination instead of searching
//! its text.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// Tables, each applied atomically (`*name` … `COMMIT`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ruleset {
    pub tables: Vec<Table>,
}

/// One table: the chains it declares and the commands that follow, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// `filter`, `nat`, `mangle`, `raw`.
    pub name: String,
    /// Declared chains (`:NAME POLICY [0:0]`): a restore creates them, or flushes them when they
    /// exist.
    pub chains: Vec<ChainDecl>,
    pub commands: Vec<Command>,
}

/// A chain declaration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainDecl {
    pub name: String,
    /// The policy of a built-in chain (`ACCEPT`); `None` prints `-` (a chain of our own).
    pub policy: Option<String>,
}

/// A line of a table after its declarations.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `-A CHAIN …`
    Append(Rule),
    /// `-I CHAIN POSITION …` (1-based).
    Insert { position: usize, rule: Rule },
    /// `-D CHAIN …` (the first rule equal to this one).
    Delete(Rule),
    /// `-F CHAIN`
    Flush(String),
    /// `-X CHAIN`
    DeleteChain(String),
}

/// One rule: the chain it belongs to, what it matches, what it does.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub chain: String,
    pub matches: Vec<Match>,
    /// None: the rule only counts (kube-proxy's "other traffic … will be dropped" marker).
    pub target: Option<Target>,
}

/// An address match: a host (`10.96.0.1`, as kube-proxy writes it) or a network
/// (`10.244.0.0/16`; `iptables-save` prints hosts as `/32` networks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Addr {
    Host(IpAddr),
    Net(IpNet),
}

impl Addr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        match self {
            Addr::Host(h) => *h == ip,
            Addr::Net(n) => n.contains(&ip),
        }
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Addr::Host(ip) => write!(f, "{ip}"),
            Addr::Net(n) => write!(f, "{n}"),
        }
    }
}

/// `-m recent`: remember a source address in a list, or check it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecentOp {
    /// `--set`
    Set,
    /// `--rcheck [--seconds S] [--reap]`
    Check { seconds: Option<u32>, reap: bool },
}

/// What a rule matches on. Each variant is written as one piece of iptables syntax (with its
/// `-m MODULE` where it has one), except the protocol modules (`-m tcp`), whose options
/// (`--dport`, `--tcp-flags`) are matches of their own: kube-proxy writes `-m tcp -p tcp -d IP
/// --dport P`, with the destination between them.
#[derive(Debug, Clone, PartialEq)]
pub enum Match {
    /// `-m comment --comment TEXT`
    Comment(String),
    /// `-m NAME` of a protocol module (`tcp`, `udp`, `sctp`), whose options follow separately.
    Module(String),
    /// `[!] -p PROTO`
    Protocol { proto: String, negated: bool },
    /// `[!] -s ADDR`
    Source { addr: Addr, negated: bool },
    /// `[!] -d ADDR`
    Destination { addr: Addr, negated: bool },
    /// `[!] -i IFACE`
    InInterface { name: String, negated: bool },
    /// `[!] -o IFACE`
    OutInterface { name: String, negated: bool },
    /// `[!] --dport PORT[:PORT]`
    DestinationPort { port: String, negated: bool },
    /// `[!] --sport PORT[:PORT]`
    SourcePort { port: String, negated: bool },
    /// `[!] --tcp-flags MASK SET`
    TcpFlags { mask: String, set: String, negated: bool },
    /// `-m addrtype [!] --src-type|--dst-type TYPE`
    AddrType { source: bool, kind: String, negated: bool },
    /// `-m mark [!] --mark VALUE[/MASK]`
    Mark { value: u32, mask: Option<u32>, negated: bool },
    /// `-m conntrack [!] --ctstate STATE,…`
    ConnState { states: Vec<String>, negated: bool },
    /// `-m state --state STATE,…` (the old module; kube-proxy's userspace mode used it)
    State { states: Vec<String> },
    /// `-m statistic --mode random --probability P` (written with 10 decimals, as kube-proxy's
    /// `%0.10f`)
    Probability(f64),
    /// `-m recent --name NAME (--set | --rcheck [--seconds S] [--reap])`; `extra` keeps what
    /// `iptables-save` adds (`--mask … --rsource`).
    Recent { name: String, op: RecentOp, extra: Vec<String> },
    /// `-m physdev [!] --physdev-is-in`
    PhysdevIsIn { negated: bool },
    /// `-m tos --tos VALUE/MASK`
    Tos(String),
    /// Anything else, word for word (a module and its options, an unknown flag).
    Other(Vec<String>),
}

/// The MARK target's operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkOp {
    /// `--or-mark BITS`
    Or(u32),
    /// `--xor-mark BITS`
    Xor(u32),
    /// `--set-xmark VALUE/MASK` (how `iptables-save` prints the other two)
    SetXmark(u32, u32),
}

impl MarkOp {
    /// The mark after this operation.
    pub fn apply(self, mark: u32) -> u32 {
        match self {
            MarkOp::Or(b) => mark | b,
            MarkOp::Xor(b) => mark ^ b,
            MarkOp::SetXmark(v, m) => (mark & !m) ^ v,
        }
    }
}

/// What a matching rule does.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// `-j CHAIN`: a chain of the same table.
    Jump(String),
    /// `-g CHAIN`
    Goto(String),
    Accept,
    Drop,
    Return,
    /// `-j REJECT [--reject-with TYPE]`
    Reject {
        with: Option<String>,
    },
    Mark(MarkOp),
    /// `-j MASQUERADE [--random-fully]`
    Masquerade {
        random_fully: bool,
    },
    /// `-j DNAT --to-destination ADDR[:PORT]`
    Dnat {
        to: String,
    },
    /// `-j REDIRECT --to-ports PORT`
    Redirect {
        to_ports: String,
    },
    /// `-j TRACE`
    Trace,
    /// Any other target with its options, word for word.
    Other {
        name: String,
        args: Vec<String>,
    },
}

impl Target {
    /// The target's name as `-j` takes it (`ACCEPT`, `DNAT`, `KUBE-SVC-…`).
    pub fn name(&self) -> &str {
        match self {
            Target::Jump(c) | Target::Goto(c) => c,
            Target::Accept => "ACCEPT",
            Target::Drop => "DROP",
            Target::Return => "RETURN",
            Target::Reject { .. } => "REJECT",
            Target::Mark(_) => "MARK",
            Target::Masquerade { .. } => "MASQUERADE",
            Target::Dnat { .. } => "DNAT",
            Target::Redirect { .. } => "REDIRECT",
            Target::Trace => "TRACE",
            Target::Other { name, .. } => name,
        }
    }

    /// A target by `-j` name: a built-in one, or a jump to a chain.
    pub fn named(name: &str) -> Target {
        match name {
            "ACCEPT" => Target::Accept,
            "DROP" => Target::Drop,
            "RETURN" => Target::Return,
            "REJECT" => Target::Reject { with: None },
            "MASQUERADE" => Target::Masquerade { random_fully: false },
            "TRACE" => Target::Trace,
            chain => Target::Jump(chain.to_string()),
        }
    }
}

// === impl Rule ===

/// Builders (in the order the matches are written) and accessors.
impl Rule {
    /// A rule of `chain` that matches everything and does nothing yet.
    pub fn new(chain: impl Into<String>) -> Rule {
        Rule { chain: chain.into(), matches: vec![], target: None }
    }

    pub fn with(mut self, m: Match) -> Rule {
        self.matches.push(m);
        self
    }

    pub fn comment(self, text: impl Into<String>) -> Rule {
        self.with(Match::Comment(text.into()))
    }

    /// `-m PROTO -p PROTO`: kube-proxy's iptables mode's order.
    pub fn proto(self, proto: &str) -> Rule {
        self.with(Match::Module(proto.into())).with(Match::Protocol { proto: proto.into(), negated: false })
    }

    pub fn src(self, addr: Addr) -> Rule {
        self.with(Match::Source { addr, negated: false })
    }

    pub fn not_src(self, addr: Addr) -> Rule {
        self.with(Match::Source { addr, negated: true })
    }

    pub fn dst(self, addr: Addr) -> Rule {
        self.with(Match::Destination { addr, negated: false })
    }

    pub fn dport(self, port: u16) -> Rule {
        self.with(Match::DestinationPort { port: port.to_string(), negated: false })
    }

    pub fn src_type(self, kind: &str) -> Rule {
        self.with(Match::AddrType { source: true, kind: kind.into(), negated: false })
    }

    pub fn dst_type(self, kind: &str) -> Rule {
        self.with(Match::AddrType { source: false, kind: kind.into(), negated: false })
    }

    pub fn ct_state(self, states: &[&str]) -> Rule {
        self.with(Match::ConnState { states: states.iter().map(|s| s.to_string()).collect(), negated: false })
    }

    pub fn target(mut self, t: Target) -> Rule {
        self.target = Some(t);
        self
    }

    /// `-j NAME` (a built-in target by name, or a chain).
    pub fn jump(self, name: &str) -> Rule {
        self.target(Target::named(name))
    }

    /// The comment, if the rule has one.
    pub fn comment_text(&self) -> Option<&str> {
        self.matches.iter().find_map(|m| match m {
            Match::Comment(c) => Some(c.as_str()),
            _ => None,
        })
    }

    /// The chain a `-j`/`-g` to a chain leads to.
    pub fn jump_target(&self) -> Option<&str> {
        match &self.target {
            Some(Target::Jump(c) | Target::Goto(c)) => Some(c),
            _ => None,
        }
    }

    /// `-m statistic --probability P`.
    pub fn probability(&self) -> Option<f64> {
        self.matches.iter().find_map(|m| match m {
            Match::Probability(p) => Some(*p),
            _ => None,
        })
    }

    /// The (first) destination match.
    pub fn destination(&self) -> Option<(Addr, bool)> {
        self.matches.iter().find_map(|m| match m {
            Match::Destination { addr, negated } => Some((*addr, *negated)),
            _ => None,
        })
    }

    /// The (first) source match.
    pub fn source(&self) -> Option<(Addr, bool)> {
        self.matches.iter().find_map(|m| match m {
            Match::Source { addr, negated } => Some((*addr, *negated)),
            _ => None,
        })
    }

    /// The `-p` protocol.
    pub fn protocol(&self) -> Option<&str> {
        self.matches.iter().find_map(|m| match m {
            Match::Protocol { proto, negated: false } => Some(proto.as_str()),
            _ => None,
        })
    }

    /// The `--dport`.
    pub fn destination_port(&self) -> Option<&str> {
        self.matches.iter().find_map(|m| match m {
            Match::DestinationPort { port, negated: false } => Some(port.as_str()),
            _ => None,
        })
    }

    /// `-m addrtype --dst-type` (or `--src-type` when `source`), with its negation.
    pub fn addr_type(&self, source: bool) -> Option<(&str, bool)> {
        self.matches.iter().find_map(|m| match m {
            Match::AddrType { source: s, kind, negated } if *s == source => Some((kind.as_str(), *negated)),
            _ => None,
        })
    }

    /// The rule as `iptables-save` lists it after `-A`: `CHAIN matches… target…`.
    pub fn spec(&self) -> String {
        crate::text::rule_spec(self)
    }
}

impl fmt::Display for Rule {
    /// `-A CHAIN …`, the way a restore input writes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "-A {}", self.spec())
    }
}

// === impl Table ===

impl Table {
    pub fn new(name: impl Into<String>) -> Table {
        Table { name: name.into(), chains: vec![], commands: vec![] }
    }

    /// Declares a chain of our own (`:NAME - [0:0]`).
    pub fn declare(&mut self, chain: impl Into<String>) {
        self.chains.push(ChainDecl { name: chain.into(), policy: None });
    }

    pub fn append(&mut self, rule: Rule) {
        self.commands.push(Command::Append(rule));
    }

    pub fn declares(&self, chain: &str) -> bool {
        self.chains.iter().any(|c| c.name == chain)
    }

    /// The appended rules, in order.
    pub fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.commands.iter().filter_map(|c| match c {
            Command::Append(r) => Some(r),
            _ => None,
        })
    }

    /// The appended rules of one chain, in order.
    pub fn chain_rules<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a Rule> + 'a {
        self.rules().filter(move |r| r.chain == chain)
    }
}

impl Ruleset {
    /// The table named `name`, if there is one.
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The table named `name`, added (empty) when missing.
    pub fn table_mut(&mut self, name: &str) -> &mut Table {
        match self.tables.iter().position(|t| t.name == name) {
            Some(i) => &mut self.tables[i],
            None => {
                self.tables.push(Table::new(name));
                self.tables.last_mut().expect("just pushed")
            }
        }
    }
}
