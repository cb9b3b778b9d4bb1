//! nf_tables over netlink: an nftables transaction (`podpath_ruleset::nft`'s model: tables,
//! chains, rules as nft's text, sets and maps, elements) goes to the kernel as one batch on a
//! `NETLINK_NETFILTER` socket, without an `nft` process, which loads the whole table before it
//! writes anything (≈130 ms at 10,000 Services). kube-proxy's nftables mode
//! (`podpath-kube-proxy`) sends every transaction through it.
//!
//! What it is: [`encode`] is pure — the batch's bytes from the transaction and the declared
//! types of its sets: tables, chains and sets (`decl`'s forms, with the user data nft reads
//! back), rules compiled from their text into the expressions nft 1.0 makes of them (`rule`'s
//! forms), elements added and deleted. [`Socket`] is the only I/O: it sends a batch and waits
//! for its one acknowledgement, reads the ruleset's generation, asks whether a table exists.
//! Element keys and values are laid out as nftables lays out a concatenation: each field in
//! its own 4-byte-aligned register, addresses and ports in network order, `numgen` values in
//! host order; a verdict is a code and a chain name; a comment is nftables' user-data record.
//!
//! What it is not: a general nftables library. It writes the forms the proxy and the
//! NetworkPolicy printers use (the `ip` and `ip6` families) and nothing else; whatever it cannot
//! write makes [`encode`] give `None` (and [`unwritable`] says what), so the caller uses
//! `nft -f` — never a guess. It reads nothing back but acknowledgements, the generation, a
//! table's existence, one connection's conntrack entry ([`conntrack`], ctnetlink on the
//! same socket), a chain's rule handles and the kernel's trace events ([`trace`]): listing
//! rules stays `nft`'s (and `iptables-save`'s) job.
//!
//! Its proof is the kernel's: `tests/roundtrip.rs` loads tables both ways (this crate and
//! `nft -f`) in two network namespaces and compares `nft list` and `nft -j list`.

use std::net::{Ipv4Addr, Ipv6Addr};

use podpath_ruleset::nft::{fields_of, Element, NftFamily, NftTable, Op, Set, Transaction};

pub mod conntrack;
mod decl;
mod error;
mod rule;
pub mod trace;

pub use error::{NfnlError, Result};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
const NFT_MSG_GETTABLE: u16 = 1;
const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_NEWCHAIN: u16 = 3;
const NFT_MSG_DELCHAIN: u16 = 5;
const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_DELRULE: u16 = 8;
const NFT_MSG_NEWSET: u16 = 9;
const NFT_MSG_DELSET: u16 = 11;
const NFT_MSG_NEWSETELEM: u16 = 12;
const NFT_MSG_DELSETELEM: u16 = 14;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_RULE_USERDATA: u16 = 7;
const NFTNL_UDATA_RULE_COMMENT: u8 = 0;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const NLA_F_NESTED: u16 = 0x8000;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_USERDATA: u16 = 6;
const NFTA_DATA_VALUE: u16 = 1;
const NFTNL_UDATA_SET_ELEM_COMMENT: u8 = 0;

/// A table family's number in nfgenmsg.
fn family_number(f: NftFamily) -> u8 {
    match f {
        NftFamily::Ip => NFPROTO_IPV4,
        NftFamily::Ip6 => NFPROTO_IPV6,
    }
}

/// One field of a key or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Ipv4,
    Ipv6,
    Proto,
    Port,
    /// A 32-bit integer in host order (`numgen`, `mark`).
    HostU32,
}

/// The fields of a declared type (`ipv4_addr . inet_proto . inet_service`) or `typeof`
/// expression (`ip daddr . meta l4proto . tcp dport . numgen random mod 1`).
fn fields(declared: &str) -> Option<Vec<Field>> {
    declared
        .split(" . ")
        .map(|f| match f.trim() {
            "ipv4_addr" | "ip daddr" | "ip saddr" => Some(Field::Ipv4),
            "ipv6_addr" | "ip6 daddr" | "ip6 saddr" => Some(Field::Ipv6),
            "inet_proto" | "meta l4proto" => Some(Field::Proto),
            "inet_service" | "th dport" | "tcp dport" | "udp dport" | "sctp dport" => Some(Field::Port),
            "mark" => Some(Field::HostU32),
            f if f.starts_with("numgen ") => Some(Field::HostU32),
            _ => None,
        })
        .collect()
}

/// The bytes of `parts` (`10.96.0.10`, `udp`, `53`) as a concatenation of `fields`.
#[cfg(test)]
fn value<S: AsRef<str>>(fields: &[Field], parts: &[S]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(4 * fields.len());
    value_into(&mut out, fields, parts.iter().map(|p| p.as_ref()))?;
    Some(out)
}

/// [`value`], written at the end of `out`.
fn value_into<'a>(out: &mut Vec<u8>, fields: &[Field], parts: impl IntoIterator<Item = &'a str>) -> Option<()> {
    let mut parts = parts.into_iter();
    for f in fields {
        let p = parts.next()?.trim();
        match f {
            Field::Ipv4 => out.extend(p.parse::<Ipv4Addr>().ok()?.octets()),
            Field::Ipv6 => out.extend(p.parse::<Ipv6Addr>().ok()?.octets()),
            Field::Proto => {
                let n: u8 = match p {
                    "tcp" => 6,
                    "udp" => 17,
                    "sctp" => 132,
                    n => n.parse().ok()?,
                };
                out.extend([n, 0, 0, 0]);
            }
            Field::Port => {
                out.extend(p.parse::<u16>().ok()?.to_be_bytes());
                out.extend([0, 0]);
            }
            Field::HostU32 => out.extend(p.parse::<u32>().ok()?.to_ne_bytes()),
        }
    }
    // As many parts as fields: a key with a field too many is not this set's.
    parts.next().is_none().then_some(())
}

/// A netlink attribute: length, type, payload, padding to 4 bytes.
fn attr(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    out.extend(((4 + payload.len()) as u16).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(payload);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// An attribute whose payload `inner` writes in place (its length filled in after).
fn attr_with<T>(out: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let at = out.len();
    out.extend([0u8; 4]);
    let r = inner(out);
    let len = (out.len() - at) as u16;
    out[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    out[at + 2..at + 4].copy_from_slice(&kind.to_ne_bytes());
    out.resize(out.len().next_multiple_of(4), 0);
    r
}

fn nested<T>(out: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    attr_with(out, kind | NLA_F_NESTED, inner)
}

fn strz(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A map's value type: verdicts, or data of these fields.
enum ValueType {
    Verdict,
    Data(Vec<Field>),
}

/// A map value: a verdict (`goto CHAIN`, `drop`…) or data of the map's value type.
fn data(out: &mut Vec<u8>, value_type: &ValueType, text: &str) -> Option<()> {
    if let ValueType::Verdict = value_type {
        let v = rule::Verdict::of(text)?;
        nested(out, NFTA_SET_ELEM_DATA, |d| v.write(d));
        return Some(());
    }
    let ValueType::Data(fields) = value_type else { return None };
    nested(out, NFTA_SET_ELEM_DATA, |d| attr_with(d, NFTA_DATA_VALUE, |v| value_into(v, fields, fields_of(text))))
}

/// How a set's elements are written: its key fields and value type, read once per set.
struct Layout {
    key: Vec<Field>,
    value: Option<ValueType>,
}

impl Layout {
    /// None: a set this layer does not write (a type it does not know, or intervals, which
    /// are written as ranges).
    fn of(set: &Set) -> Option<Layout> {
        if set.flags.iter().any(|f| f == "interval") {
            return None;
        }
        let value = match set.value_type.as_deref() {
            None => None,
            Some("verdict") => Some(ValueType::Verdict),
            Some(v) => Some(ValueType::Data(fields(v)?)),
        };
        Some(Layout { key: fields(&set.key_type)?, value })
    }
}

/// One element in `NFTA_LIST_ELEM` form (a delete names the key only).
fn element(out: &mut Vec<u8>, layout: &Layout, e: &Element, with_value: bool) -> Option<()> {
    nested(out, NFTA_LIST_ELEM, |body| {
        nested(body, NFTA_SET_ELEM_KEY, |k| attr_with(k, NFTA_DATA_VALUE, |v| value_into(v, &layout.key, e.fields())))?;
        if with_value {
            if let (Some(vt), Some(v)) = (&layout.value, &e.value) {
                data(body, vt, v)?;
            }
            if let Some(c) = &e.comment {
                attr(body, NFTA_SET_ELEM_USERDATA, &decl::comment(NFTNL_UDATA_SET_ELEM_COMMENT, c)?);
            }
        }
        Some(())
    })
}

fn message(out: &mut Vec<u8>, kind: u16, flags: u16, seq: u32, family: u8, res_id: u16, body: &[u8]) {
    let len = 16 + 4 + body.len();
    out.extend((len as u32).to_ne_bytes());
    out.extend(kind.to_ne_bytes());
    out.extend(flags.to_ne_bytes());
    out.extend(seq.to_ne_bytes());
    out.extend(0u32.to_ne_bytes());
    out.extend([family, 0]);
    out.extend(res_id.to_be_bytes());
    out.extend(body);
}

/// Element bytes per message: one element more must still fit a 16-bit attribute length.
const MAX_LIST: usize = 60_000;

/// Whether this layer can write `set`'s elements.
pub fn encodable(set: &Set) -> bool {
    Layout::of(set).is_some()
}

/// A batch being built: begin, the messages (the last one asking for an acknowledgement:
/// the kernel reports every refused message anyway, and acknowledging 100,000 accepted ones
/// only fills the receive queue), end.
struct Batch<'a> {
    table: &'a str,
    family: u8,
    out: Vec<u8>,
    seq: u32,
    n: u32,
    /// Where the last message starts (its flags get `NLM_F_ACK`).
    last: usize,
}

impl<'a> Batch<'a> {
    fn new(table: &'a str, family: NftFamily, seq: u32) -> Self {
        let mut out = Vec::new();
        message(&mut out, NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, &[]);
        Batch { table, family: family_number(family), out, seq, n: 0, last: 0 }
    }

    fn message(&mut self, kind: u16, flags: u16, body: &[u8]) {
        self.n += 1;
        self.last = self.out.len();
        let seq = self.seq.wrapping_add(self.n);
        message(&mut self.out, (NFNL_SUBSYS_NFTABLES << 8) | kind, flags, seq, self.family, 0, body);
    }

    /// Adds (or deletes) `elements` of `set`, as many messages as their size needs.
    fn elements<'e>(
        &mut self,
        set: &Set,
        layout: &Layout,
        add: bool,
        elements: impl Iterator<Item = &'e Element>,
    ) -> Option<()> {
        let mut list = vec![];
        let mut rest = elements.peekable();
        while rest.peek().is_some() {
            list.clear();
            while list.len() < MAX_LIST {
                let Some(e) = rest.next() else { break };
                element(&mut list, layout, e, add)?;
            }
            let mut body = vec![];
            attr(&mut body, NFTA_SET_ELEM_LIST_TABLE, &strz(self.table));
            attr(&mut body, NFTA_SET_ELEM_LIST_SET, &strz(&set.name));
            attr(&mut body, NFTA_SET_ELEM_LIST_ELEMENTS | NLA_F_NESTED, &list);
            if add {
                self.message(NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE, &body);
            } else {
                self.message(NFT_MSG_DELSETELEM, NLM_F_REQUEST, &body);
            }
        }
        Some(())
    }

    /// A rule with the anonymous sets it declares before it.
    fn rule(&mut self, chain: &str, text: &str, ids: &mut rule::Ids) -> Option<()> {
        let r = rule::compile(text, ids)?;
        for a in &r.sets {
            let (set, elements) = decl::anon(self.table, a)?;
            self.message(NFT_MSG_NEWSET, NLM_F_REQUEST | NLM_F_CREATE, &set);
            self.message(NFT_MSG_NEWSETELEM, NLM_F_REQUEST | NLM_F_CREATE, &elements);
        }
        let mut body = vec![];
        attr(&mut body, NFTA_RULE_TABLE, &strz(self.table));
        attr(&mut body, NFTA_RULE_CHAIN, &strz(chain));
        attr(&mut body, NFTA_RULE_EXPRESSIONS | NLA_F_NESTED, &r.exprs);
        if let Some(c) = &r.comment {
            attr(&mut body, NFTA_RULE_USERDATA, &decl::comment(NFTNL_UDATA_RULE_COMMENT, c)?);
        }
        self.message(NFT_MSG_NEWRULE, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_APPEND, &body);
        Some(())
    }

    /// The bytes and the number of messages between begin and end.
    fn finish(mut self) -> (Vec<u8>, u32) {
        if self.n > 0 {
            let at = self.last + 6;
            let flags = u16::from_ne_bytes([self.out[at], self.out[at + 1]]) | NLM_F_ACK;
            self.out[at..at + 2].copy_from_slice(&flags.to_ne_bytes());
        }
        let end = self.seq.wrapping_add(self.n + 1);
        message(&mut self.out, NFNL_MSG_BATCH_END, NLM_F_REQUEST, end, 0, NFNL_SUBSYS_NFTABLES, &[]);
        (self.out, self.n)
    }
}

/// A copy of `table` without the elements [`encode_elements`] writes: what a load from
/// nothing sends before them (declarations, chains and rules; the elements, nearly all of a
/// shared-maps table, then go in one batch encoded from the table itself).
pub fn skeleton(table: &NftTable) -> NftTable {
    let mut out = NftTable::new(table.family, &table.name);
    out.comment.clone_from(&table.comment);
    out.chains.clone_from(&table.chains);
    for s in &table.sets {
        let mut copy = s.declaration();
        if !encodable(s) {
            copy.elements = s.elements.clone();
        }
        out.sets.push(copy);
    }
    out
}

/// The batch adding every element of `table`'s sets that this layer writes (numbered from
/// `seq + 1`); None when there are none.
pub fn encode_elements(table: &NftTable, seq: u32) -> Option<(Vec<u8>, u32)> {
    let mut batch = Batch::new(&table.name, table.family, seq);
    for s in &table.sets {
        if let Some(layout) = Layout::of(s) {
            batch.elements(s, &layout, true, s.elements.values())?;
        }
    }
    let (bytes, n) = batch.finish();
    (n > 0).then_some((bytes, n))
}

/// The batch for a whole transaction — table, chains, rules (with their anonymous sets), sets
/// and elements — given the declarations of the sets it names without declaring them; None
/// when it holds a rule, type or value this layer does not write (the caller then uses
/// `nft -f`). The messages are numbered from `seq + 1`; returns the bytes and their number.
pub fn encode(tx: &Transaction, sets: &[Set], seq: u32) -> Option<(Vec<u8>, u32)> {
    let mut decls: std::collections::HashMap<&str, &Set> = sets.iter().map(|s| (s.name.as_str(), s)).collect();
    for op in &tx.ops {
        if let Op::AddSet(s) = op {
            decls.insert(&s.name, s);
        }
    }
    let table = tx.table.as_str();
    let named = |body: &mut Vec<u8>, kind: u16, name: &str| {
        attr(body, 1, &strz(table));
        attr(body, kind, &strz(name));
    };
    let mut batch = Batch::new(table, tx.family, seq);
    // Set ids, numbered in the batch: named sets' and anonymous ones' (named after the batch).
    let mut ids = rule::Ids::tagged(format!("pp{:x}-", seq), tx.family == NftFamily::Ip6);
    let mut named_ids = 0u32;
    let mut i = 0;
    while i < tx.ops.len() {
        let mut body = vec![];
        match &tx.ops[i] {
            Op::AddTable => {
                decl::table(&mut body, table, tx.comment.as_deref())?;
                batch.message(NFT_MSG_NEWTABLE, NLM_F_REQUEST, &body);
            }
            Op::DeleteTable => {
                attr(&mut body, 1, &strz(table));
                batch.message(NFT_MSG_DELTABLE, NLM_F_REQUEST, &body);
            }
            Op::AddChain(c) => {
                decl::chain(&mut body, table, c)?;
                batch.message(NFT_MSG_NEWCHAIN, NLM_F_REQUEST | NLM_F_CREATE, &body);
            }
            Op::FlushChain(c) => {
                named(&mut body, NFTA_RULE_CHAIN, c);
                batch.message(NFT_MSG_DELRULE, NLM_F_REQUEST, &body);
            }
            Op::DeleteChain(c) => {
                named(&mut body, 3, c);
                batch.message(NFT_MSG_DELCHAIN, NLM_F_REQUEST, &body);
            }
            Op::AddRule { chain, rule } => batch.rule(chain, rule, &mut ids)?,
            Op::AddSet(s) => {
                // Named sets' ids from the top: never one of the anonymous ones'.
                named_ids += 1;
                decl::set(&mut body, table, s, u32::MAX - named_ids)?;
                batch.message(NFT_MSG_NEWSET, NLM_F_REQUEST | NLM_F_CREATE, &body);
            }
            Op::FlushSet(s, _) => {
                named(&mut body, NFTA_SET_ELEM_LIST_SET, s);
                batch.message(NFT_MSG_DELSETELEM, NLM_F_REQUEST, &body);
            }
            Op::DeleteSet(s, _) => {
                named(&mut body, 2, s);
                batch.message(NFT_MSG_DELSET, NLM_F_REQUEST, &body);
            }
            Op::AddElement { set: set_name, .. } | Op::DeleteElement { set: set_name, .. } => {
                let add = matches!(tx.ops[i], Op::AddElement { .. });
                let set = decls.get(set_name.as_str())?;
                let layout = Layout::of(set)?;
                // Consecutive commands on one set go in one message (or more, when long).
                let mut elements: Vec<&Element> = vec![];
                while let Some(op) = tx.ops.get(i) {
                    match op {
                        Op::AddElement { set, element } if add && set == set_name => elements.push(element),
                        Op::DeleteElement { set, element } if !add && set == set_name => elements.push(element),
                        _ => break,
                    }
                    i += 1;
                }
                batch.elements(set, &layout, add, elements.into_iter())?;
                continue;
            }
        }
        i += 1;
    }
    Some(batch.finish())
}

/// What of `table` this layer cannot write (rules by chain, sets by name), each a line; empty
/// when a load of the whole table goes over netlink. A caller's tests ask it of every table
/// the caller renders, so a new rule form shows up there rather than as a silent `nft -f`.
pub fn unwritable(table: &NftTable) -> Vec<String> {
    let mut out = vec![];
    for c in &table.chains {
        for r in &c.rules {
            if rule::compile(r, &mut rule::Ids::of_family(table.family == NftFamily::Ip6)).is_none() {
                out.push(format!("chain {}: {r}", c.name));
            }
        }
    }
    for s in &table.sets {
        if decl::set(&mut vec![], &table.name, s, 1).is_none() {
            out.push(format!("set {}", s.name));
        } else if !s.elements.is_empty() && !encodable(s) {
            out.push(format!("the elements of set {}", s.name));
        }
    }
    if out.is_empty() && encode(&Transaction::between(None, table).0, &[], 1).is_none() {
        out.push(format!("the load of table {}", table.name));
    }
    out
}

/// An nf_tables netlink socket kept open between syncs. Closing one after a transaction that
/// deleted elements waits for the kernel to release them (≈15 ms here, RCU grace periods):
/// that wait, not the transaction, was most of an endpoint change's cost.
#[derive(Debug)]
pub struct Socket {
    sock: netlink_sys::Socket,
    seq: u32,
}

fn io(what: &str, e: std::io::Error) -> NfnlError {
    NfnlError { what: what.to_string(), source: e }
}

impl Socket {
    /// A socket in the current network namespace.
    pub fn open() -> Result<Self> {
        use netlink_sys::{protocols::NETLINK_NETFILTER, SocketAddr};
        let mut sock = netlink_sys::Socket::new(NETLINK_NETFILTER).map_err(|e| io("socket", e))?;
        sock.bind_auto().map_err(|e| io("bind", e))?;
        sock.connect(&SocketAddr::new(0, 0)).map_err(|e| io("connect", e))?;
        // A random start: batches name their anonymous sets after their sequence number, and
        // those of an earlier socket (an agent before its restart) may still be in the table.
        Ok(Socket { sock, seq: fastrand::u32(..) })
    }

    /// A socket in the named network namespace (`/run/netns/NAME`), or the current one: it is
    /// opened by a thread that enters the namespace, and stays bound to it.
    pub fn open_in(netns: Option<&str>) -> Result<Self> {
        let Some(name) = netns else { return Socket::open() };
        let path = std::path::Path::new("/run/netns").join(name);
        std::thread::scope(|s| {
            s.spawn(|| {
                let f = std::fs::File::open(&path).map_err(|e| io(&format!("open {}", path.display()), e))?;
                nix::sched::setns(f, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|e| io(&format!("enter {}", path.display()), e.into()))?;
                Socket::open()
            })
            .join()
            .unwrap_or_else(|_| Err(io("open", std::io::Error::other("the opening thread panicked"))))
        })
    }

    /// Encodes `tx` ([`encode`]) and sends it; `Ok(false)` when it is not for this layer.
    /// After an error the socket may hold replies of the failed batch: drop it.
    pub fn apply(&mut self, tx: &Transaction, sets: &[Set]) -> Result<bool> {
        let seq = self.seq;
        let Some((batch, n)) = encode(tx, sets, seq) else { return Ok(false) };
        self.seq = seq.wrapping_add(n + 2);
        self.send(&batch, n, seq)?;
        Ok(true)
    }

    /// Adds every element of `table`'s sets that this layer writes, in one batch
    /// ([`encode_elements`]).
    pub fn add_elements(&mut self, table: &NftTable) -> Result<()> {
        let seq = self.seq;
        let Some((batch, n)) = encode_elements(table, seq) else { return Ok(()) };
        self.seq = seq.wrapping_add(n + 2);
        self.send(&batch, n, seq)
    }

    /// The nf_tables generation of this namespace: the kernel moves it with every transaction,
    /// anyone's, so an unchanged generation means an unchanged ruleset.
    pub fn generation(&mut self) -> Result<u32> {
        let seq = self.seq;
        self.seq = seq.wrapping_add(1);
        let mut msg = vec![];
        message(&mut msg, (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN, NLM_F_REQUEST, seq, 0, 0, &[]);
        self.sock.send(&msg, 0).map_err(|e| io("send", e))?;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = self.sock.recv(&mut &mut buf[..], 0).map_err(|e| io("receive", e))?;
            for (kind, msg_seq, body) in messages(&buf[..n]) {
                if msg_seq != seq {
                    continue;
                }
                if kind == NLMSG_ERROR && body.len() >= 4 {
                    let code = i32::from_ne_bytes(body[..4].try_into().expect("4 bytes"));
                    return Err(io("generation", std::io::Error::from_raw_os_error(-code)));
                }
                if kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
                    // After the 4-byte nfgenmsg, the attributes.
                    if let Some(id) = body.get(4..).and_then(gen_id) {
                        return Ok(id);
                    }
                }
            }
        }
    }

    /// Whether this namespace holds the table `name` of `family`.
    pub fn has_table(&mut self, family: NftFamily, name: &str) -> Result<bool> {
        let seq = self.next_seq();
        let mut body = vec![];
        attr(&mut body, 1, &strz(name));
        let mut msg = vec![];
        let kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE;
        message(&mut msg, kind, NLM_F_REQUEST | NLM_F_ACK, seq, family_number(family), 0, &body);
        let mut found = false;
        let code = self.ask(&msg, seq, |kind, _| found |= kind == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWTABLE)?;
        match code {
            0 => Ok(found),
            code if -code == nix::libc::ENOENT => Ok(false),
            code => Err(io(&format!("table {name}"), std::io::Error::from_raw_os_error(-code))),
        }
    }

    /// The conntrack entry of the TCP connection `from → to` (as its first packet went), as
    /// `conntrack -G` asks for it; None when there is none.
    pub fn conntrack(
        &mut self,
        conn: (std::net::SocketAddr, std::net::SocketAddr),
    ) -> Result<Option<conntrack::Entry>> {
        let seq = self.next_seq();
        let msg = conntrack::request(conn, seq, NLM_F_REQUEST | NLM_F_ACK);
        let mut found = None;
        let code = self.ask(&msg, seq, |kind, body| {
            if kind == (conntrack::NFNL_SUBSYS_CTNETLINK << 8) | conntrack::IPCTNL_MSG_CT_NEW {
                found = conntrack::entry(body);
            }
        })?;
        match code {
            0 => Ok(found),
            code if -code == nix::libc::ENOENT => Ok(None),
            code => Err(io(&format!("conntrack {} → {}", conn.0, conn.1), std::io::Error::from_raw_os_error(-code))),
        }
    }

    fn next_seq(&mut self) -> u32 {
        let seq = self.seq;
        self.seq = seq.wrapping_add(1);
        seq
    }

    /// Sends one request (asking for an acknowledgement), hands each answer of its sequence
    /// number to `each` (kind, body), and returns the acknowledgement's code (0, or `-errno`).
    fn ask(&mut self, msg: &[u8], seq: u32, mut each: impl FnMut(u16, &[u8])) -> Result<i32> {
        self.sock.send(msg, 0).map_err(|e| io("send", e))?;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = self.sock.recv(&mut &mut buf[..], 0).map_err(|e| io("receive", e))?;
            for (kind, msg_seq, body) in messages(&buf[..n]) {
                if msg_seq != seq {
                    continue;
                }
                if kind == NLMSG_ERROR && body.len() >= 4 {
                    return Ok(i32::from_ne_bytes(body[..4].try_into().expect("4 bytes")));
                }
                each(kind, body);
            }
        }
    }

    /// Sends a batch made by [`encode`] (`n` messages numbered from `seq + 1`) and waits for
    /// the last one's acknowledgement, or the first refusal: the kernel applies all of it or
    /// none, and reports each refused message before that acknowledgement.
    pub fn send(&mut self, batch: &[u8], n: u32, seq: u32) -> Result<()> {
        use nix::sys::socket::{setsockopt, sockopt};
        if n == 0 {
            return Ok(());
        }
        // A batch travels in one datagram: the send buffer sized to it (as nft does).
        let want_snd = batch.len() + 64 * 1024;
        if want_snd > 200 * 1024 {
            setsockopt(&self.sock, sockopt::SndBufForce, &want_snd).map_err(|e| io("send buffer", e.into()))?;
        }
        self.sock.send(batch, 0).map_err(|e| io("send", e))?;
        let mut buf = vec![0u8; 65536];
        loop {
            let got = self.sock.recv(&mut &mut buf[..], 0).map_err(|e| io("receive", e))?;
            for (kind, msg_seq, body) in messages(&buf[..got]) {
                // Replies to this batch only (an earlier, abandoned one may have left some);
                // a refusal of the whole batch names its begin message.
                let ours = msg_seq.wrapping_sub(seq);
                if kind != NLMSG_ERROR || body.len() < 4 || ours > n {
                    continue;
                }
                let code = i32::from_ne_bytes(body[..4].try_into().expect("4 bytes"));
                if code != 0 {
                    return Err(io(
                        &format!("message {ours} of {n} of the batch refused"),
                        std::io::Error::from_raw_os_error(-code),
                    ));
                }
                if ours == n {
                    return Ok(());
                }
            }
        }
    }
}

/// The netlink messages of one datagram: kind, sequence number and the bytes after the
/// 16-byte header (a message cut short ends the list).
fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, u32, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        let head = buf.get(at..at + 16)?;
        let len = u32::from_ne_bytes(head[0..4].try_into().expect("4 bytes")) as usize;
        let kind = u16::from_ne_bytes(head[4..6].try_into().expect("2 bytes"));
        let seq = u32::from_ne_bytes(head[8..12].try_into().expect("4 bytes"));
        let body = buf.get(at + 16..at.checked_add(len)?).filter(|_| len >= 16)?;
        at += len.next_multiple_of(4);
        Some((kind, seq, body))
    })
}

/// The attributes of a message body or a nested attribute: kind (without the nested flag)
/// and payload; one cut short ends the list.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u16::from_ne_bytes([*b.first()?, *b.get(1)?]) as usize;
        let kind = u16::from_ne_bytes([*b.get(2)?, *b.get(3)?]) & !NLA_F_NESTED;
        if len < 4 || len > b.len() {
            return None;
        }
        let payload = &b[4..len];
        b = &b[len.next_multiple_of(4).min(b.len())..];
        Some((kind, payload))
    })
}

/// `NFTA_GEN_ID` (big-endian) among a NEWGEN message's attributes.
fn gen_id(attributes: &[u8]) -> Option<u32> {
    let (_, id) = attrs(attributes).find(|(kind, _)| *kind == NFTA_GEN_ID)?;
    Some(u32::from_be_bytes(id.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_is_read_message_by_message_and_a_cut_one_ends_it() {
        let mut buf = vec![];
        message(&mut buf, NLMSG_ERROR, 0, 7, 0, 0, &[0; 16]);
        message(&mut buf, 0x0a0f, 0, 8, 0, 0, &[1, 2, 3, 4]);
        let cut = buf.len();
        message(&mut buf, 0x0a0f, 0, 9, 0, 0, &[0; 8]);
        let got: Vec<(u16, u32, usize)> = messages(&buf[..buf.len() - 2]).map(|(k, s, b)| (k, s, b.len())).collect();
        assert_eq!(got, [(NLMSG_ERROR, 7, 20), (0x0a0f, 8, 8)]);
        assert_eq!(messages(&buf[..cut]).count(), 2);
        assert_eq!(messages(&[]).count(), 0);
    }

    #[test]
    fn the_generation_is_read_from_its_attribute() {
        // NFTA_GEN_ID 0x01020304, then NFTA_GEN_PROC_PID.
        let mut attrs = vec![8, 0, 1, 0, 1, 2, 3, 4];
        attrs.extend([8, 0, 2, 0, 0, 0, 0, 9]);
        assert_eq!(gen_id(&attrs), Some(0x0102_0304));
        assert_eq!(gen_id(&attrs[8..]), None);
        assert_eq!(gen_id(&[200, 0, 1, 0]), None, "a length past the end");
    }

    #[test]
    fn keys_are_laid_out_as_nftables_lays_out_a_concatenation() {
        let f = fields("ip daddr . meta l4proto . tcp dport . numgen random mod 1").unwrap();
        let v = value(&f, &["10.96.0.10", "udp", "53", "1"]).unwrap();
        let mut want = vec![10, 96, 0, 10, 17, 0, 0, 0, 0, 53, 0, 0];
        want.extend(1u32.to_ne_bytes());
        assert_eq!(v, want);
        assert_eq!(
            value(&fields("inet_proto . inet_service").unwrap(), &["tcp", "30080"]).unwrap(),
            [6, 0, 0, 0, 0x75, 0x80, 0, 0]
        );
        assert_eq!(value(&f, &["10.96.0.10", "udp", "53"]), None, "a field short");
        assert_eq!(value(&f, &["10.96.0.10", "udp", "53", "1", "2"]), None, "a field too many");
        // An element's key, split into its fields.
        let e = Element::key(&["10.96.0.10", "udp", "53", "1"]);
        assert_eq!(value(&f, &e.fields().collect::<Vec<_>>()), Some(v));
        assert_eq!(fields("ether_addr"), None, "a type this layer does not know");
    }

    #[test]
    fn a_transaction_is_one_batch_acknowledged_once() {
        let mut set = Set::map("service-ips", "ipv4_addr . inet_proto . inet_service", "verdict");
        set.comment = None;
        let e = Element::key(&["10.96.0.10", "udp", "53"]).with_comment("kube-system/kube-dns:dns").to("goto lb-2");
        let mut tx = Transaction {
            family: podpath_ruleset::nft::NftFamily::Ip,
            table: "kube-proxy".into(),
            comment: None,
            ops: vec![
                Op::AddElement { set: "service-ips".into(), element: e.clone() },
                Op::DeleteElement { set: "service-ips".into(), element: e.clone() },
            ],
        };
        let (bytes, n) = encode(&tx, std::slice::from_ref(&set), 100).unwrap();
        assert_eq!(n, 2, "one message per run of adds or deletes");
        let seqs: Vec<u32> = messages(&bytes).map(|(_, seq, _)| seq).collect();
        assert_eq!(seqs, [100, 101, 102, 103], "begin, two element messages, end");
        // Only the last message asks for an acknowledgement.
        let acks: Vec<bool> = {
            let mut at = 0;
            let mut out = vec![];
            while at + 16 <= bytes.len() {
                let len = u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
                out.push(u16::from_ne_bytes([bytes[at + 6], bytes[at + 7]]) & NLM_F_ACK != 0);
                at += len;
            }
            out
        };
        assert_eq!(acks, [false, false, true, false]);
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("kube-proxy\0") && text.contains("service-ips\0") && text.contains("lb-2\0"));
        assert!(text.contains("kube-system/kube-dns:dns\0"));
        tx.ops.push(Op::FlushChain("services".into()));
        tx.ops.push(Op::AddRule {
            chain: "services".into(),
            rule: "ip daddr . meta l4proto . th dport vmap @service-ips".into(),
        });
        assert_eq!(encode(&tx, std::slice::from_ref(&set), 1).unwrap().1, 4, "chains and rules too");
        tx.ops.push(Op::AddRule { chain: "services".into(), rule: "counter".into() });
        assert!(encode(&tx, std::slice::from_ref(&set), 1).is_none(), "a rule it does not know: nft -f");
        let unknown = Transaction { ops: tx.ops[..1].to_vec(), ..tx.clone() };
        assert!(encode(&unknown, &[], 1).is_none(), "elements of a set it has no declaration of");
    }
}
