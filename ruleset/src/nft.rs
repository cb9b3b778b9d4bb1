//! nftables: the model of one table (base and regular chains with their rules, sets and maps
//! with their elements), the `nft -f` transaction that moves the kernel from one model to the
//! next ([`Transaction::between`]: only what differs — whole chains rewritten when their rules
//! changed, elements added and deleted one by one), its text ([`Transaction::text`], the form
//! kube-proxy's knftables writes), and the form `nft list` prints a rule in ([`listed`]), so a
//! table loaded into a kernel and listed back can be compared with the model.
//!
//! Rules are text, as knftables keeps them: nftables' rule language is the interface, and a
//! typed copy of it would only be another thing to keep in step. Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// `ip` or `ip6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum NftFamily {
    #[default]
    Ip,
    Ip6,
}

impl NftFamily {
    pub fn name(self) -> &'static str {
        match self {
            NftFamily::Ip => "ip",
            NftFamily::Ip6 => "ip6",
        }
    }
}

/// The hook of a base chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// `filter` or `nat`.
    pub kind: &'static str,
    /// `prerouting`, `input`, `forward`, `output`, `postrouting`.
    pub hook: &'static str,
    pub priority: i32,
}

/// A chain: a base chain (with a hook) or a regular one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub name: String,
    pub hook: Option<Hook>,
    pub comment: Option<String>,
    pub rules: Vec<String>,
}

impl Chain {
    pub fn regular(name: impl Into<String>) -> Chain {
        Chain { name: name.into(), hook: None, comment: None, rules: vec![] }
    }
    pub fn base(name: impl Into<String>, kind: &'static str, hook: &'static str, priority: i32) -> Chain {
        Chain { name: name.into(), hook: Some(Hook { kind, hook, priority }), comment: None, rules: vec![] }
    }
    pub fn rule(mut self, r: impl Into<String>) -> Chain {
        self.rules.push(r.into());
        self
    }
    pub fn with_comment(mut self, c: impl Into<String>) -> Chain {
        self.comment = Some(c.into());
        self
    }

    /// The `{ … }` of its declaration (empty for a regular chain without comment).
    fn spec(&self) -> String {
        let mut parts = vec![];
        if let Some(h) = &self.hook {
            parts.push(format!("type {} hook {} priority {}", h.kind, h.hook, h.priority));
        }
        if let Some(c) = &self.comment {
            parts.push(format!("comment {}", quote(c)));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!(" {{ {} ; }}", parts.join(" ; "))
        }
    }
}

/// One element of a set or map.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Element {
    /// The key as nft writes it: its fields (`10.96.0.10`, `udp`, `53`) joined with ` . `. One
    /// string rather than one per field: a 10,000-Service table has ~190,000 elements, and their
    /// allocations were a large share of rendering it.
    key: String,
    pub comment: Option<String>,
    /// A map's value (`goto service-…`, `drop`).
    pub value: Option<String>,
}

/// The fields of a concatenation as nft writes it (`10.96.0.10 . udp . 53`: an element's key,
/// a map's data value). No field has a space (addresses, protocols, numbers), so the text splits
/// at spaces, leaving out the dots between: a byte search, where splitting at ` . ` took a
/// substring searcher per element.
pub fn fields_of(text: &str) -> impl Iterator<Item = &str> {
    text.split(' ').filter(|f| *f != ".")
}

/// What joins a key's fields, as nft writes it.
const FIELD_SEPARATOR: &str = " . ";

impl Element {
    pub fn key(fields: &[&str]) -> Element {
        let mut key = String::with_capacity(fields.iter().map(|f| f.len() + FIELD_SEPARATOR.len()).sum());
        for (i, f) in fields.iter().enumerate() {
            if i > 0 {
                key.push_str(FIELD_SEPARATOR);
            }
            key.push_str(f);
        }
        Element { key, comment: None, value: None }
    }
    /// An element whose key's fields are joined with ` . ` already (`10.96.0.10 . udp . 53`),
    /// as a caller that formats them in one go can do without a string per field.
    pub fn joined(key: String) -> Element {
        Element { key, comment: None, value: None }
    }
    pub fn to(mut self, value: impl Into<String>) -> Element {
        self.value = Some(value.into());
        self
    }
    pub fn with_comment(mut self, c: impl Into<String>) -> Element {
        self.comment = Some(c.into());
        self
    }
    /// The key as nft writes it (`10.96.0.10 . udp . 53`).
    pub fn key_text(&self) -> &str {
        &self.key
    }
    /// The key's fields, in order ([`fields_of`]).
    pub fn fields(&self) -> impl Iterator<Item = &str> {
        fields_of(&self.key)
    }
    fn text(&self) -> String {
        let mut s = self.key.clone();
        if let Some(c) = &self.comment {
            let _ = write!(s, " comment {}", quote(c));
        }
        if let Some(v) = &self.value {
            let _ = write!(s, " : {v}");
        }
        s
    }
}

/// A set (no value type) or a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set {
    pub name: String,
    /// `ipv4_addr . inet_proto . inet_service`.
    pub key_type: String,
    /// A map's value type (`verdict`).
    pub value_type: Option<String>,
    /// Key and value are expressions (`typeof ip daddr . numgen random mod 2`): for keys with a
    /// part that has no type name of its own, such as `numgen`.
    pub by_expression: bool,
    pub flags: Vec<String>,
    /// `10800s`.
    pub timeout: Option<String>,
    pub comment: Option<String>,
    pub elements: BTreeMap<String, Element>,
}

impl Set {
    pub fn plain(name: impl Into<String>, key_type: &str) -> Set {
        Set {
            name: name.into(),
            key_type: key_type.into(),
            value_type: None,
            by_expression: false,
            flags: vec![],
            timeout: None,
            comment: None,
            elements: BTreeMap::new(),
        }
    }
    pub fn map(name: impl Into<String>, key_type: &str, value_type: &str) -> Set {
        Set { value_type: Some(value_type.into()), ..Set::plain(name, key_type) }
    }
    /// A map declared by the expressions of its key and value (`typeof …`).
    pub fn map_of(name: impl Into<String>, key_expr: &str, value_expr: &str) -> Set {
        Set { by_expression: true, ..Set::map(name, key_expr, value_expr) }
    }
    pub fn with_comment(mut self, c: impl Into<String>) -> Set {
        self.comment = Some(c.into());
        self
    }
    pub fn is_map(&self) -> bool {
        self.value_type.is_some()
    }
    /// Adds (or replaces) an element, keyed by its key.
    pub fn insert(&mut self, e: Element) {
        self.elements.insert(e.key.clone(), e);
    }
    fn kind(&self) -> &'static str {
        if self.is_map() {
            "map"
        } else {
            "set"
        }
    }
    fn spec(&self) -> String {
        let kind = if self.by_expression { "typeof" } else { "type" };
        let mut parts = vec![match &self.value_type {
            Some(v) => format!("{kind} {} : {v}", self.key_type),
            None => format!("{kind} {}", self.key_type),
        }];
        if !self.flags.is_empty() {
            parts.push(format!("flags {}", self.flags.join(",")));
        }
        if let Some(t) = &self.timeout {
            parts.push(format!("timeout {t}"));
        }
        if let Some(c) = &self.comment {
            parts.push(format!("comment {}", quote(c)));
        }
        format!("{{ {} ; }}", parts.join(" ; "))
    }
    /// The declaration without elements (what decides whether a set must be re-created).
    /// The set as declared, without its elements.
    pub fn declaration(&self) -> Set {
        Set {
            name: self.name.clone(),
            key_type: self.key_type.clone(),
            value_type: self.value_type.clone(),
            by_expression: self.by_expression,
            flags: self.flags.clone(),
            timeout: self.timeout.clone(),
            comment: self.comment.clone(),
            elements: BTreeMap::new(),
        }
    }

    fn same_declaration(&self, other: &Set) -> bool {
        self.key_type == other.key_type
            && self.value_type == other.value_type
            && self.by_expression == other.by_expression
            && self.flags == other.flags
            && self.timeout == other.timeout
            && self.comment == other.comment
    }
}

/// One table: what a sync wants the kernel to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftTable {
    pub family: NftFamily,
    pub name: String,
    pub comment: Option<String>,
    /// In the order they are written (base chains first, as kube-proxy writes them).
    pub chains: Vec<Chain>,
    pub sets: Vec<Set>,
}

impl NftTable {
    pub fn new(family: NftFamily, name: &str) -> NftTable {
        NftTable { family, name: name.into(), comment: None, chains: vec![], sets: vec![] }
    }
    pub fn chain(&self, name: &str) -> Option<&Chain> {
        self.chains.iter().find(|c| c.name == name)
    }
    pub fn chain_mut(&mut self, name: &str) -> Option<&mut Chain> {
        self.chains.iter_mut().find(|c| c.name == name)
    }
    pub fn set(&self, name: &str) -> Option<&Set> {
        self.sets.iter().find(|s| s.name == name)
    }
    pub fn set_mut(&mut self, name: &str) -> Option<&mut Set> {
        self.sets.iter_mut().find(|s| s.name == name)
    }
    /// Adds a chain, or appends the rules of `c` to the chain of that name.
    pub fn add_chain(&mut self, c: Chain) {
        match self.chain_mut(&c.name) {
            Some(existing) => existing.rules.extend(c.rules),
            None => self.chains.push(c),
        }
    }
    /// Adds an element to set `set` (which must exist; otherwise nothing happens).
    pub fn add_element(&mut self, set: &str, e: Element) {
        if let Some(s) = self.set_mut(set) {
            s.insert(e);
        }
    }
    /// Adds an element to set `set` unless its key is there already (the first one stays).
    pub fn add_element_if_absent(&mut self, set: &str, e: Element) {
        if let Some(s) = self.set_mut(set) {
            s.elements.entry(e.key.clone()).or_insert(e);
        }
    }
    /// This table after a partial sync turned `before` (the part of it some Services held:
    /// their elements, chains and sets) into `after` — what the kernel holds then.
    pub fn replace_part(&mut self, before: &NftTable, after: &NftTable) {
        let after_sets: BTreeSet<&str> = after.sets.iter().map(|s| s.name.as_str()).collect();
        for s in &before.sets {
            if !after_sets.contains(s.name.as_str()) {
                self.sets.retain(|mine| mine.name != s.name);
            } else if let Some(mine) = self.set_mut(&s.name) {
                for k in s.elements.keys() {
                    mine.elements.remove(k);
                }
            }
        }
        for s in &after.sets {
            match self.set_mut(&s.name) {
                Some(mine) => mine.elements.extend(s.elements.iter().map(|(k, e)| (k.clone(), e.clone()))),
                None => self.sets.push(s.clone()),
            }
        }
        // A partial sync names a few chains among tens of thousands: comparing each with those
        // few costs less than hashing every name of the table.
        let names: Vec<&str> = before.chains.iter().chain(&after.chains).map(|c| c.name.as_str()).collect();
        if names.len() <= 32 {
            self.chains.retain(|c| !names.contains(&c.name.as_str()));
        } else {
            let names: std::collections::HashSet<&str> = names.into_iter().collect();
            self.chains.retain(|c| !names.contains(c.name.as_str()));
        }
        self.chains.extend(after.chains.iter().cloned());
    }

    /// The number of rules and elements: a size for logs and benchmarks.
    pub fn size(&self) -> (usize, usize) {
        (self.chains.iter().map(|c| c.rules.len()).sum(), self.sets.iter().map(|s| s.elements.len()).sum())
    }
}

fn quote(s: &str) -> String {
    // nft strings cannot hold a double quote; comments never need one.
    format!("\"{}\"", s.replace('"', "'"))
}

/// One command of a transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    AddTable,
    DeleteTable,
    AddChain(Chain),
    FlushChain(String),
    DeleteChain(String),
    AddRule {
        chain: String,
        rule: String,
    },
    AddSet(Set),
    /// A set's or map's name, and whether it is a map (`flush map`, `delete map`).
    FlushSet(String, bool),
    DeleteSet(String, bool),
    AddElement {
        set: String,
        element: Element,
    },
    DeleteElement {
        set: String,
        element: Element,
    },
}

/// One `nft -f` input for one table: applied atomically, all or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    pub family: NftFamily,
    pub table: String,
    pub comment: Option<String>,
    pub ops: Vec<Op>,
}

impl Transaction {
    pub fn new(t: &NftTable) -> Transaction {
        Transaction { family: t.family, table: t.name.clone(), comment: t.comment.clone(), ops: vec![] }
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// What turns `before` (what the kernel holds, as last written; `None`: unknown, so the
    /// table is replaced whole) into `after`, in one transaction: new chains declared and
    /// filled, changed ones flushed and filled; changed sets re-created; elements added
    /// and deleted one by one; chains `after` no longer has flushed only (returned: delete them
    /// in a later transaction, when no map element can still point at them — kube-proxy waits a
    /// second, since kernels before 6.2 notice late).
    pub fn between(before: Option<&NftTable>, after: &NftTable) -> (Transaction, Vec<String>) {
        let mut tx = Transaction::new(after);
        let mut stale = vec![];
        let full = before.is_none();
        if full {
            // Whatever the table holds (an earlier run's chains, elements, a hand edit) goes:
            // add (so the delete cannot fail), delete, and create it anew, all at once.
            tx.ops.extend([Op::AddTable, Op::DeleteTable, Op::AddTable]);
        }
        // Indexes, not scans: tables of 10,000 Services have 20,000 chains.
        let before_chains: std::collections::HashMap<&str, &Chain> =
            before.map(|b| b.chains.iter().map(|c| (c.name.as_str(), c)).collect()).unwrap_or_default();
        let before_sets: std::collections::HashMap<&str, &Set> =
            before.map(|b| b.sets.iter().map(|s| (s.name.as_str(), s)).collect()).unwrap_or_default();
        let after_chains: BTreeSet<&str> = after.chains.iter().map(|c| c.name.as_str()).collect();
        let after_sets: BTreeSet<&str> = after.sets.iter().map(|s| s.name.as_str()).collect();
        let old_chain = |name: &str| before_chains.get(name).copied();
        let old_set = |name: &str| before_sets.get(name).copied();
        // Sets first (rules refer to them), chains next (elements point at them).
        let mut recreated: BTreeSet<&str> = BTreeSet::new();
        for s in &after.sets {
            match old_set(&s.name) {
                Some(o) if o.same_declaration(s) => {}
                Some(_) => {
                    tx.ops.push(Op::DeleteSet(s.name.clone(), s.is_map()));
                    tx.ops.push(Op::AddSet(s.clone()));
                    recreated.insert(&s.name);
                }
                None => {
                    tx.ops.push(Op::AddSet(s.clone()));
                    recreated.insert(&s.name);
                }
            }
        }
        // Every chain a rule may jump to exists before the rules: declarations first.
        let changed: Vec<&Chain> = after.chains.iter().filter(|c| old_chain(&c.name) != Some(*c)).collect();
        for c in &changed {
            tx.ops.push(Op::AddChain((*c).clone()));
        }
        for c in &changed {
            if old_chain(&c.name).is_some() {
                tx.ops.push(Op::FlushChain(c.name.clone()));
            }
            for r in &c.rules {
                tx.ops.push(Op::AddRule { chain: c.name.clone(), rule: r.clone() });
            }
        }
        for s in &after.sets {
            let old = if recreated.contains(s.name.as_str()) { None } else { old_set(&s.name) };
            if let Some(o) = old {
                for (k, e) in &o.elements {
                    if s.elements.get(k) != Some(e) {
                        tx.ops.push(Op::DeleteElement { set: s.name.clone(), element: e.clone() });
                    }
                }
            }
            for (k, e) in &s.elements {
                if old.and_then(|o| o.elements.get(k)) != Some(e) {
                    tx.ops.push(Op::AddElement { set: s.name.clone(), element: e.clone() });
                }
            }
        }
        if let Some(b) = before {
            // Stale chains are flushed before the sets go: a rule of theirs may still name one
            // (a v1.34 endpoint chain's `update @affinity-…`), and the kernel refuses to
            // delete a set in use (EBUSY) until that rule's removal comes first.
            for c in b.chains.iter().filter(|c| !after_chains.contains(c.name.as_str())) {
                tx.ops.push(Op::FlushChain(c.name.clone()));
                stale.push(c.name.clone());
            }
            for s in b.sets.iter().filter(|s| !after_sets.contains(s.name.as_str())) {
                tx.ops.push(Op::DeleteSet(s.name.clone(), s.is_map()));
            }
        }
        (tx, stale)
    }

    /// The `nft -f` text, one command per line, as knftables writes it.
    pub fn text(&self) -> String {
        let (f, t) = (self.family.name(), &self.table);
        let mut out = String::new();
        for op in &self.ops {
            match op {
                Op::AddTable => match &self.comment {
                    Some(c) => writeln!(out, "add table {f} {t} {{ comment {} ; }}", quote(c)),
                    None => writeln!(out, "add table {f} {t}"),
                },
                Op::DeleteTable => writeln!(out, "delete table {f} {t}"),
                Op::AddChain(c) => writeln!(out, "add chain {f} {t} {}{}", c.name, c.spec()),
                Op::FlushChain(c) => writeln!(out, "flush chain {f} {t} {c}"),
                Op::DeleteChain(c) => writeln!(out, "delete chain {f} {t} {c}"),
                Op::AddRule { chain, rule } => writeln!(out, "add rule {f} {t} {chain} {rule}"),
                Op::AddSet(s) => writeln!(out, "add {} {f} {t} {} {}", s.kind(), s.name, s.spec()),
                Op::FlushSet(s, map) => writeln!(out, "flush {} {f} {t} {s}", if *map { "map" } else { "set" }),
                Op::DeleteSet(s, map) => writeln!(out, "delete {} {f} {t} {s}", if *map { "map" } else { "set" }),
                Op::AddElement { set, element } => {
                    writeln!(out, "add element {f} {t} {set} {{ {} }}", element.text())
                }
                Op::DeleteElement { set, element } => {
                    writeln!(out, "delete element {f} {t} {set} {{ {} }}", element.key_text())
                }
            }
            .expect("writing to a String");
        }
        out
    }

    /// The number of commands (a size for logs).
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

/// The transaction that deletes chains flushed by an earlier one.
pub fn delete_chains(family: NftFamily, table: &str, chains: &[String]) -> Transaction {
    Transaction {
        family,
        table: table.into(),
        comment: None,
        ops: chains.iter().map(|c| Op::DeleteChain(c.clone())).collect(),
    }
}

/// What `nft list table` printed, one table: chain → its rules, set or map → its elements
/// (`key [comment "…"] : value`), as the kernel lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listing {
    pub chains: BTreeMap<String, Vec<String>>,
    pub sets: BTreeMap<String, BTreeSet<String>>,
}

impl Listing {
    /// Reads `nft list table` output.
    pub fn parse(text: &str) -> Listing {
        let mut out = Listing::default();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let mut i = 0;
        let end = |i: usize| i >= lines.len() || lines[i] == "}";
        while i < lines.len() {
            let l = lines[i];
            if let Some(name) = l.strip_prefix("chain ").and_then(|r| r.strip_suffix(" {")) {
                let mut rules = vec![];
                i += 1;
                while !end(i) {
                    let r = lines[i];
                    if !(r.is_empty() || r.starts_with("type ") || r.starts_with("comment ")) {
                        rules.push(r.to_string());
                    }
                    i += 1;
                }
                out.chains.insert(name.trim_matches('"').to_string(), rules);
            } else if let Some(name) =
                l.strip_prefix("set ").or_else(|| l.strip_prefix("map ")).and_then(|r| r.strip_suffix(" {"))
            {
                let mut elements = BTreeSet::new();
                i += 1;
                while !end(i) {
                    if let Some(rest) = lines[i].strip_prefix("elements = { ") {
                        let mut body = rest.to_string();
                        while !body.ends_with('}') && i + 1 < lines.len() {
                            i += 1;
                            body.push(' ');
                            body.push_str(lines[i]);
                        }
                        let body = body.trim_end_matches('}').trim();
                        for e in body.split(", ").map(str::trim).filter(|e| !e.is_empty()) {
                            elements.insert(e.trim_end_matches(',').to_string());
                        }
                    }
                    i += 1;
                }
                out.sets.insert(name.trim_matches('"').to_string(), elements);
            }
            i += 1;
        }
        out
    }

    /// One line per rule and per element (`chain services: …`, `map service-ips: …`), for
    /// diffs.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![];
        for (name, rules) in &self.chains {
            out.extend(rules.iter().map(|r| format!("chain {name}: {r}")));
        }
        for (name, els) in &self.sets {
            out.extend(els.iter().map(|e| format!("element {name}: {e}")));
        }
        out
    }

    /// The model in the listing's terms: what `nft list table` prints after loading `t`.
    pub fn of(t: &NftTable) -> Listing {
        Listing {
            chains: t.chains.iter().map(|c| (c.name.clone(), c.rules.iter().map(|r| listed(r)).collect())).collect(),
            sets: t
                .sets
                .iter()
                .map(|s| {
                    let els = s
                        .elements
                        .values()
                        .map(|e| {
                            let mut t = e.key_text().to_string();
                            if let Some(c) = &e.comment {
                                t += &format!(" comment {}", quote(c));
                            }
                            if let Some(v) = &e.value {
                                t += &format!(" : {v}");
                            }
                            t
                        })
                        .collect();
                    (s.name.clone(), els)
                })
                .collect(),
        }
    }
}

/// A rule as `nft list` prints it back (nft 1.0): `mark set mark or X` becomes `meta mark set
/// meta mark | X`, marks print with eight hex digits, `dnat ip addr . port to` becomes `dnat
/// ip to`, a one-element anonymous set loses its braces, `{ a , b }` becomes `{ a, b }`.
pub fn listed(rule: &str) -> String {
    let mut s = format!(" {rule} ");
    for (from, to) in [
        (" mark set mark or ", " meta mark set meta mark | "),
        (" mark set mark xor ", " meta mark set meta mark ^ "),
        (" mark and ", " meta mark & "),
        (" dnat ip addr . port to ", " dnat ip to "),
        (" dnat ip6 addr . port to ", " dnat ip6 to "),
        (" , ", ", "),
    ] {
        s = s.replace(from, to);
    }
    // Hex numbers after a mark operator: eight digits.
    let mut out = String::new();
    let words: Vec<&str> = s.split(' ').collect();
    for (i, w) in words.iter().enumerate() {
        let after_mark_op = i > 0 && matches!(words[i - 1], "|" | "^" | "&" | "or" | "xor");
        let w = match w.strip_prefix("0x") {
            Some(hex) if after_mark_op && u32::from_str_radix(hex, 16).is_ok() => {
                format!("0x{:08x}", u32::from_str_radix(hex, 16).expect("checked"))
            }
            _ => w.to_string(),
        };
        if i > 0 {
            out.push(' ');
        }
        out.push_str(&w);
    }
    // `!= 0` after a mark test prints as `!= 0x00000000`.
    let out = out.replace(" != 0 ", " != 0x00000000 ").replace(" == 0 ", " == 0x00000000 ");
    // `{ x }` with one element and no map: braces go.
    let mut result = String::new();
    let mut rest = out.as_str();
    while let Some(open) = rest.find("{ ") {
        result.push_str(&rest[..open]);
        let tail = &rest[open + 2..];
        // `update @set { ip saddr }` keeps its braces: they are the element, not a set.
        let is_update = result.trim_end().rsplit(' ').next().is_some_and(|w| w.starts_with('@'));
        match tail.find(" }") {
            Some(close)
                if !is_update
                    && !tail[..close].contains(',')
                    && !tail[..close].contains(" : ")
                    && !tail[..close].contains('{') =>
            {
                result.push_str(&tail[..close]);
                rest = &tail[close + 2..];
            }
            // (A map's `key : value`, spaced: IPv6 addresses hold colons too.)
            Some(close) if !is_update && !tail[..close].contains(" : ") && !tail[..close].contains('{') => {
                // An anonymous set of addresses lists in address order.
                let mut items: Vec<&str> = tail[..close].split(", ").collect();
                items.sort_by_key(|i| {
                    let net =
                        i.parse::<ipnet::IpNet>().ok().or_else(|| i.parse::<std::net::IpAddr>().ok().map(Into::into));
                    (net.map(|n| (n.network(), n.prefix_len())), i.to_string())
                });
                result.push_str(&format!("{{ {} }}", items.join(", ")));
                rest = &tail[close + 2..];
            }
            _ => {
                result.push_str("{ ");
                rest = tail;
            }
        }
    }
    result.push_str(rest);
    result.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_elements_key_is_its_fields_joined_as_nft_writes_them() {
        let e = Element::key(&["10.96.0.10", "udp", "53"]);
        assert_eq!(e.key_text(), "10.96.0.10 . udp . 53");
        assert_eq!(e.fields().collect::<Vec<_>>(), ["10.96.0.10", "udp", "53"]);
        let v6 = Element::joined("fd00::a . tcp . 443 . 0".into());
        assert_eq!(v6.fields().collect::<Vec<_>>(), ["fd00::a", "tcp", "443", "0"]);
        assert_eq!(v6, Element::key(&["fd00::a", "tcp", "443", "0"]));
        assert_eq!(Element::key(&["10.0.0.1"]).fields().collect::<Vec<_>>(), ["10.0.0.1"]);
    }

    fn table() -> NftTable {
        let mut t = NftTable::new(NftFamily::Ip, "kube-proxy");
        t.comment = Some("rules for kube-proxy".into());
        t.sets.push(Set::plain("cluster-ips", "ipv4_addr").with_comment("Active ClusterIPs"));
        t.sets.push(
            Set::map("service-ips", "ipv4_addr . inet_proto . inet_service", "verdict")
                .with_comment("ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        );
        t.chains.push(Chain::base("nat-prerouting", "nat", "prerouting", -100).rule("jump services"));
        t.chains.push(Chain::regular("services").rule("ip daddr . meta l4proto . th dport vmap @service-ips"));
        t.chains.push(
            Chain::regular("service-AXK6CI2C-demo/web/tcp/http")
                .rule("meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.244.1.5 . 8080 }"),
        );
        t.add_element("cluster-ips", Element::key(&["10.96.12.34"]));
        t.add_element(
            "service-ips",
            Element::key(&["10.96.12.34", "tcp", "80"]).to("goto service-AXK6CI2C-demo/web/tcp/http"),
        );
        t
    }

    #[test]
    fn a_first_transaction_writes_everything_as_knftables_does() {
        let (tx, stale) = Transaction::between(None, &table());
        assert!(stale.is_empty());
        assert_eq!(
            tx.text(),
            "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
             delete table ip kube-proxy\n\
             add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
             add set ip kube-proxy cluster-ips { type ipv4_addr ; comment \"Active ClusterIPs\" ; }\n\
             add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\" ; }\n\
             add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }\n\
             add chain ip kube-proxy services\n\
             add chain ip kube-proxy service-AXK6CI2C-demo/web/tcp/http\n\
             add rule ip kube-proxy nat-prerouting jump services\n\
             add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
             add rule ip kube-proxy service-AXK6CI2C-demo/web/tcp/http meta l4proto tcp dnat ip addr . port to numgen random mod 1 map { 0 : 10.244.1.5 . 8080 }\n\
             add element ip kube-proxy cluster-ips { 10.96.12.34 }\n\
             add element ip kube-proxy service-ips { 10.96.12.34 . tcp . 80 : goto service-AXK6CI2C-demo/web/tcp/http }\n"
        );
    }

    #[test]
    fn a_later_transaction_touches_only_what_changed() {
        let before = table();
        let mut after = table();
        assert!(Transaction::between(Some(&before), &after).0.is_empty(), "nothing changed, nothing sent");
        // One endpoint more: its chain is rewritten; a new Service's elements added; the old
        // chain of a removed Service flushed, to be deleted later.
        after.chain_mut("service-AXK6CI2C-demo/web/tcp/http").unwrap().rules[0] =
            "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.2.7 . 8080 }".into();
        after.add_element("cluster-ips", Element::key(&["10.96.0.20"]));
        let mut gone = before.clone();
        gone.chains.push(Chain::regular("service-XXXXXXXX-demo/old/tcp/").rule("drop"));
        let (tx, stale) = Transaction::between(Some(&gone), &after);
        assert_eq!(stale, ["service-XXXXXXXX-demo/old/tcp/"]);
        assert_eq!(
            tx.text(),
            "add chain ip kube-proxy service-AXK6CI2C-demo/web/tcp/http\n\
             flush chain ip kube-proxy service-AXK6CI2C-demo/web/tcp/http\n\
             add rule ip kube-proxy service-AXK6CI2C-demo/web/tcp/http meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.2.7 . 8080 }\n\
             add element ip kube-proxy cluster-ips { 10.96.0.20 }\n\
             flush chain ip kube-proxy service-XXXXXXXX-demo/old/tcp/\n"
        );
        assert_eq!(
            delete_chains(NftFamily::Ip, "kube-proxy", &stale).text(),
            "delete chain ip kube-proxy service-XXXXXXXX-demo/old/tcp/\n"
        );
        // A map element whose verdict changed: deleted, then added.
        let mut moved = after.clone();
        moved.add_element("service-ips", Element::key(&["10.96.12.34", "tcp", "80"]).to("drop"));
        let (tx, _) = Transaction::between(Some(&after), &moved);
        assert_eq!(
            tx.text(),
            "delete element ip kube-proxy service-ips { 10.96.12.34 . tcp . 80 }\n\
             add element ip kube-proxy service-ips { 10.96.12.34 . tcp . 80 : drop }\n"
        );
    }

    #[test]
    fn rules_read_back_as_nft_lists_them() {
        assert_eq!(
            listed("ip daddr @cluster-ips ip saddr != 10.244.0.0/16 mark set mark or 0x00004000 comment \"masquerade clusterIP traffic from outside cluster\""),
            "ip daddr @cluster-ips ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000 comment \"masquerade clusterIP traffic from outside cluster\""
        );
        assert_eq!(
            listed("mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random"),
            "meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random"
        );
        assert_eq!(
            listed("meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.244.1.5 . 8080 , 1 : 10.244.2.7 . 8080 }"),
            "meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.7 . 8080 }"
        );
        assert_eq!(listed("ip saddr != { 203.0.113.0/25 } drop"), "ip saddr != 203.0.113.0/25 drop");
        assert_eq!(listed("update @affinity-x { ip saddr }"), "update @affinity-x { ip saddr }");
        assert_eq!(listed("mark and 0x4000 == 0 return"), "meta mark & 0x00004000 == 0x00000000 return");
        assert_eq!(
            listed("ip saddr != { 10.0.0.0/8, 1.2.3.0/24 } drop"),
            "ip saddr != { 1.2.3.0/24, 10.0.0.0/8 } drop"
        );
    }
}
