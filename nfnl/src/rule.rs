//! A rule's text compiled to nf_tables expressions, as nft 1.0 compiles it, for the rule
//! shapes the proxier's layouts write (matches on addresses, prefixes, protocol, ports, marks,
//! conntrack state and status, `fib saddr type local`; lookups in named sets and verdict
//! maps; anonymous sets and maps; `numgen`; `mark set`, `dnat`, `masquerade`, `reject`,
//! `update @set`, verdicts and comments) and the trace table's (`ip dscp`, `ip6 dscp`,
//! `tcp flags & … == …`, `iifname`, `meta nftrace set 1`). Anything else gives `None`, and the transaction goes
//! to `nft -f` whole: this is not an nftables parser, and it never guesses.
//!
//! Same expressions as nft's, register for register (first field in register 1, the next ones
//! in the 32-bit registers after it; a `tcp dport` preceded by its `meta l4proto tcp`
//! dependency; a one-element anonymous set as a plain comparison; a byte-aligned prefix as a
//! shorter load): so `nft list` prints a table loaded this way exactly as one loaded by `nft -f`,
//! which the root test `nftables_netlink_root` checks. Pure.

use std::net::{IpAddr, SocketAddr};

use super::{attr, nested, strz};

const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG_2: u32 = 2;
/// The 32-bit register that overlaps the start of `REG_1`.
const REG32_00: u32 = 8;

const PAYLOAD_NETWORK: u32 = 1;
const PAYLOAD_TRANSPORT: u32 = 2;
const META_MARK: u32 = 3;
const META_L4PROTO: u32 = 16;
const META_NFTRACE: u32 = 12;
const META_IIFNAME: u32 = 6;
/// An interface name's bytes in a register (`IFNAMSIZ`).
const IFNAMSIZ: usize = 16;
const CT_STATE: u32 = 0;
const CT_STATUS: u32 = 2;
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
const LOOKUP_F_INV: u32 = 1;
const NAT_DNAT: u32 = 1;
const NFPROTO_IPV4: u32 = 2;
const NFPROTO_IPV6: u32 = 10;
const NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
const NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;
const NG_RANDOM: u32 = 1;
const FIB_RESULT_ADDRTYPE: u32 = 3;
const FIB_F_SADDR: u32 = 1;
const RTN_LOCAL: u32 = 2;
const DYNSET_OP_UPDATE: u32 = 1;

/// A verdict: its code (`NF_DROP`, `NFT_JUMP`…) and the chain it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Verdict {
    pub code: i32,
    pub chain: Option<String>,
}

impl Verdict {
    /// `goto CHAIN`, `drop`… as a whole text (a map element's value).
    pub fn of(text: &str) -> Option<Verdict> {
        let mut t = Tokens::new(text)?;
        let v = Verdict::parse(&mut t)?;
        t.peek().is_none().then_some(v)
    }

    fn parse(t: &mut Tokens) -> Option<Verdict> {
        let (code, chain) = match t.next()? {
            "drop" => (0, None),
            "accept" => (1, None),
            "continue" => (-1, None),
            "jump" => (-3, Some(t.name()?)),
            "goto" => (-4, Some(t.name()?)),
            "return" => (-5, None),
            _ => return None,
        };
        Some(Verdict { code, chain })
    }

    /// `NFTA_DATA_VERDICT` inside a data attribute being written.
    pub fn write(&self, d: &mut Vec<u8>) {
        nested(d, NFTA_DATA_VERDICT, |v| {
            attr(v, NFTA_VERDICT_CODE, &self.code.to_be_bytes());
            if let Some(c) = &self.chain {
                attr(v, NFTA_VERDICT_CHAIN, &strz(c));
            }
        });
    }
}

/// An anonymous set or map a rule declares: the batch adds it (and its elements) before the
/// rule, which names it by its batch-local id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Anon {
    pub id: u32,
    pub name: String,
    pub kind: AnonKind,
}

/// How a batch numbers and names the anonymous sets it declares. nft names them
/// `__set%d`/`__map%d` and the kernel numbers them, scanning every set of the table for the
/// first free number (a `sscanf` each: at 10,000 Services, ≈ 20 ms per set, and quadratic in a
/// cold load); a name of our own (a tag unique to the batch, and the set's id) is checked
/// against the others by a string comparison only. Anonymous sets are listed inline, by their
/// elements: the name shows nowhere.
#[derive(Debug, Default)]
pub(super) struct Ids {
    last: u32,
    /// None: nft's templates.
    tag: Option<String>,
    /// The table is `ip6`: what a family-less word means (`reject`'s ICMPv6 code).
    pub v6: bool,
}

impl Ids {
    pub fn tagged(tag: String, v6: bool) -> Ids {
        Ids { last: 0, tag: Some(tag), v6 }
    }
    /// nft's templates, in a table of `v6`'s family.
    pub fn of_family(v6: bool) -> Ids {
        Ids { v6, ..Default::default() }
    }
    fn next(&mut self, map: bool) -> (u32, String) {
        self.last += 1;
        let name = match &self.tag {
            Some(t) => format!("__{t}{:x}", self.last),
            None if map => "__map%d".to_string(),
            None => "__set%d".to_string(),
        };
        (self.last, name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum AnonKind {
    /// `numgen … vmap { 0 : goto a , … }`.
    Verdicts(Vec<(u32, Verdict)>),
    /// `numgen … map { 0 : 10.0.0.1 . 80 , … }` (addresses of one family).
    AddressPorts(Vec<(u32, IpAddr, u16)>),
    /// `ip saddr { … }` or `ip6 saddr { … }`: the field and the address ranges, first and
    /// last address of each (as numbers), sorted and merged; `interval` when one is a prefix
    /// shorter than a whole address.
    Addresses { field: Field, ranges: Vec<(u128, u128)>, interval: bool },
}

/// A compiled rule: its expressions (the payload of `NFTA_RULE_EXPRESSIONS`), the anonymous
/// sets they use, and its comment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Rule {
    pub exprs: Vec<u8>,
    pub sets: Vec<Anon>,
    pub comment: Option<String>,
}

/// The rule's tokens: words, `{`, `}`, `,`, `:` and quoted strings (quotes kept).
struct Tokens<'a> {
    list: Vec<&'a str>,
    at: usize,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a str) -> Option<Tokens<'a>> {
        let mut list = vec![];
        let mut rest = text.trim_start();
        while !rest.is_empty() {
            let end = if let Some(quoted) = rest.strip_prefix('"') {
                quoted.find('"')? + 2
            } else if rest.starts_with(['{', '}', ',']) {
                1
            } else {
                rest.find(|c: char| c.is_whitespace() || c == ',' || c == '{' || c == '}').unwrap_or(rest.len())
            };
            list.push(&rest[..end]);
            rest = rest[end..].trim_start();
        }
        Some(Tokens { list, at: 0 })
    }
    fn peek(&self) -> Option<&'a str> {
        self.list.get(self.at).copied()
    }
    /// The token after the next one.
    fn peek2(&self) -> Option<&'a str> {
        self.list.get(self.at + 1).copied()
    }
    #[allow(clippy::should_implement_trait)]
    fn next(&mut self) -> Option<&'a str> {
        let t = self.peek()?;
        self.at += 1;
        Some(t)
    }
    fn expect(&mut self, word: &str) -> Option<()> {
        (self.next()? == word).then_some(())
    }
    /// A chain or set name (not a keyword or punctuation).
    fn name(&mut self) -> Option<String> {
        let t = self.next()?;
        (t.chars().all(|c| c.is_ascii_graphic() && !matches!(c, '"' | '{' | '}' | ',' | '@' | ';')) && !t.is_empty())
            .then(|| t.to_string())
    }
}

/// One field of a match or a lookup key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Field {
    IpSaddr,
    IpDaddr,
    Ip6Saddr,
    Ip6Daddr,
    L4proto,
    /// `th dport` (None) or a protocol's own (`tcp dport`: the protocol number).
    Dport(Option<u8>),
    Numgen(u32),
}

impl Field {
    fn parse(t: &mut Tokens) -> Option<Field> {
        Some(match (t.next()?, t.next()?) {
            ("ip", "saddr") => Field::IpSaddr,
            ("ip", "daddr") => Field::IpDaddr,
            ("ip6", "saddr") => Field::Ip6Saddr,
            ("ip6", "daddr") => Field::Ip6Daddr,
            ("meta", "l4proto") => Field::L4proto,
            ("th", "dport") => Field::Dport(None),
            (p, "dport") => Field::Dport(Some(proto(p)?)),
            ("numgen", "random") => {
                t.expect("mod")?;
                Field::Numgen(t.next()?.parse().ok().filter(|n| *n > 0)?)
            }
            _ => return None,
        })
    }
    /// Bytes in a register (a concatenation rounds each up to 4).
    pub(super) fn len(self) -> usize {
        match self {
            Field::IpSaddr | Field::IpDaddr | Field::Numgen(_) => 4,
            Field::Ip6Saddr | Field::Ip6Daddr => 16,
            Field::L4proto => 1,
            Field::Dport(_) => 2,
        }
    }
    fn load(self, out: &mut Vec<u8>, dreg: u32) {
        match self {
            Field::IpSaddr | Field::IpDaddr | Field::Ip6Saddr | Field::Ip6Daddr => {
                let (offset, len) = self.address().expect("an address field");
                payload(out, dreg, PAYLOAD_NETWORK, offset, len)
            }
            Field::L4proto => meta_load(out, dreg, META_L4PROTO),
            Field::Dport(_) => payload(out, dreg, PAYLOAD_TRANSPORT, 2, 2),
            Field::Numgen(m) => expr(out, "numgen", |d| {
                u32attr(d, 1, dreg);
                u32attr(d, 2, m);
                u32attr(d, 3, NG_RANDOM);
                u32attr(d, 4, 0);
            }),
        }
    }
}

impl Field {
    /// An address field's offset in the network header and its length.
    pub(super) fn address(self) -> Option<(u32, u32)> {
        Some(match self {
            Field::IpSaddr => (12, 4),
            Field::IpDaddr => (16, 4),
            Field::Ip6Saddr => (8, 16),
            Field::Ip6Daddr => (24, 16),
            _ => return None,
        })
    }
    pub(super) fn is_v6(self) -> bool {
        matches!(self, Field::Ip6Saddr | Field::Ip6Daddr)
    }
}

fn proto(p: &str) -> Option<u8> {
    match p {
        "tcp" => Some(6),
        "udp" => Some(17),
        "sctp" => Some(132),
        n => n.parse().ok(),
    }
}

/// A concatenation's fields loaded as nft loads them: each protocol's `meta l4proto`
/// dependency first, then the first field in register 1 and each next one in the 32-bit
/// register at its offset.
fn load_concat(out: &mut Vec<u8>, fields: &[Field]) {
    for f in fields {
        if let Field::Dport(Some(p)) = f {
            meta_load(out, REG_1, META_L4PROTO);
            cmp(out, CMP_EQ, &[*p]);
        }
    }
    let mut offset = 0;
    for (i, f) in fields.iter().enumerate() {
        let reg = if i == 0 { REG_1 } else { REG32_00 + (offset / 4) as u32 };
        f.load(out, reg);
        offset += f.len().next_multiple_of(4);
    }
}

fn expr(out: &mut Vec<u8>, name: &str, body: impl FnOnce(&mut Vec<u8>)) {
    nested(out, NFTA_LIST_ELEM, |e| {
        attr(e, NFTA_EXPR_NAME, &strz(name));
        nested(e, NFTA_EXPR_DATA, body);
    });
}

fn u32attr(out: &mut Vec<u8>, kind: u16, v: u32) {
    attr(out, kind, &v.to_be_bytes());
}

fn value(out: &mut Vec<u8>, kind: u16, bytes: &[u8]) {
    nested(out, kind, |d| attr(d, NFTA_DATA_VALUE, bytes));
}

fn payload(out: &mut Vec<u8>, dreg: u32, base: u32, offset: u32, len: u32) {
    expr(out, "payload", |d| {
        u32attr(d, 1, dreg);
        u32attr(d, 2, base);
        u32attr(d, 3, offset);
        u32attr(d, 4, len);
    });
}

fn meta_load(out: &mut Vec<u8>, dreg: u32, key: u32) {
    expr(out, "meta", |d| {
        u32attr(d, 2, key);
        u32attr(d, 1, dreg);
    });
}

fn cmp(out: &mut Vec<u8>, op: u32, data: &[u8]) {
    expr(out, "cmp", |d| {
        u32attr(d, 1, REG_1);
        u32attr(d, 2, op);
        value(d, 3, data);
    });
}

/// `reg 1 = (reg 1 & mask) ^ xor`, as many bytes as the mask.
fn bitwise(out: &mut Vec<u8>, mask: &[u8], xor: &[u8]) {
    expr(out, "bitwise", |d| {
        u32attr(d, 1, REG_1);
        u32attr(d, 2, REG_1);
        u32attr(d, 3, mask.len() as u32);
        value(d, 4, mask);
        value(d, 5, xor);
    });
}

fn lookup(out: &mut Vec<u8>, set: &SetRef, dreg: Option<u32>, invert: bool) {
    expr(out, "lookup", |d| {
        u32attr(d, 2, REG_1);
        if let Some(r) = dreg {
            u32attr(d, 3, r);
        }
        attr(d, 1, &strz(set.name()));
        if let SetRef::Anon(id, _) = set {
            u32attr(d, 4, *id);
        }
        if invert {
            u32attr(d, 5, LOOKUP_F_INV);
        }
    });
}

fn immediate(out: &mut Vec<u8>, dreg: u32, data: &[u8]) {
    expr(out, "immediate", |d| {
        u32attr(d, 1, dreg);
        value(d, 2, data);
    });
}

fn verdict(out: &mut Vec<u8>, v: &Verdict) {
    expr(out, "immediate", |d| {
        u32attr(d, 1, REG_VERDICT);
        nested(d, 2, |data| v.write(data));
    });
}

fn dnat(out: &mut Vec<u8>, v6: bool, proto_reg: u32, flags: Option<u32>) {
    expr(out, "nat", |d| {
        u32attr(d, 1, NAT_DNAT);
        u32attr(d, 2, if v6 { NFPROTO_IPV6 } else { NFPROTO_IPV4 });
        u32attr(d, 3, REG_1);
        u32attr(d, 5, proto_reg);
        if let Some(f) = flags {
            u32attr(d, 7, f);
        }
    });
}

/// A named set, or an anonymous one by its batch id and name.
enum SetRef {
    Named(String),
    Anon(u32, String),
}

impl SetRef {
    fn name(&self) -> &str {
        match self {
            SetRef::Named(n) | SetRef::Anon(_, n) => n,
        }
    }
}

/// An address or a prefix (`a.b.c.d/n`, `fd00::/56`) of the family `v6` says: the first
/// address and the prefix length.
fn prefix(text: &str, v6: bool) -> Option<(IpAddr, u8)> {
    let (addr, len) = match text.split_once('/') {
        Some((a, l)) => (a.parse::<IpAddr>().ok()?, l.parse::<u8>().ok()?),
        None => {
            let a = text.parse::<IpAddr>().ok()?;
            (a, if a.is_ipv6() { 128 } else { 32 })
        }
    };
    let bits = if addr.is_ipv6() { 128 } else { 32 };
    if addr.is_ipv6() != v6 || len > bits {
        return None;
    }
    let (first, _) = range((addr, len));
    let first = if v6 { IpAddr::from(first.to_be_bytes()) } else { IpAddr::from((first as u32).to_be_bytes()) };
    Some((first, len))
}

/// An address as a number.
fn number_of(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// A prefix's first and last address, as numbers.
fn range((addr, len): (IpAddr, u8)) -> (u128, u128) {
    let bits: u32 = if addr.is_ipv6() { 128 } else { 32 };
    let host = bits - u32::from(len);
    let span = if host == 128 { u128::MAX } else { (1u128 << host) - 1 };
    let first = number_of(addr) & !span;
    (first, first | span)
}

/// The bytes of the network-order mask of a prefix of `len` bits in an address of `bytes`.
fn mask_bytes(len: u8, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| {
            let bits = (u32::from(len)).saturating_sub(8 * i as u32).min(8);
            if bits == 0 {
                0
            } else {
                0xffu8 << (8 - bits)
            }
        })
        .collect()
}

fn octets(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Compiles `text`; `ids` numbers the anonymous sets it declares (shared by a whole batch).
pub(super) fn compile(text: &str, ids: &mut Ids) -> Option<Rule> {
    let mut t = Tokens::new(text)?;
    let mut rule = Rule::default();
    let out = &mut rule.exprs;
    // Whether a `meta l4proto tcp` dependency was written already (by `tcp dport` or `tcp
    // flags`: nft writes it once per rule), and whether the rule names `meta l4proto` itself.
    let (mut l4_tcp, mut explicit_l4) = (false, false);
    while let Some(word) = t.peek() {
        match word {
            "comment" => {
                t.next();
                let q = t.next()?;
                rule.comment = Some(q.strip_prefix('"')?.strip_suffix('"')?.to_string());
            }
            "drop" | "accept" | "continue" | "jump" | "goto" | "return" => verdict(out, &Verdict::parse(&mut t)?),
            "ct" => {
                t.next();
                let (key, bits) = match (t.next()?, t.next()?) {
                    ("state", states) => (CT_STATE, ct_bits(states, ct_state)?),
                    ("status", statuses) => (CT_STATUS, ct_bits(statuses, ct_status)?),
                    _ => return None,
                };
                expr(out, "ct", |d| {
                    u32attr(d, 2, key);
                    u32attr(d, 1, REG_1);
                });
                bitwise(out, &bits.to_ne_bytes(), &[0; 4]);
                cmp(out, CMP_NEQ, &[0; 4]);
            }
            "mark" => {
                t.next();
                match t.next()? {
                    "and" => {
                        let mask = number(t.next()?)?;
                        let op = match t.next()? {
                            "==" => CMP_EQ,
                            "!=" => CMP_NEQ,
                            _ => return None,
                        };
                        let v = number(t.next()?)?;
                        meta_load(out, REG_1, META_MARK);
                        bitwise(out, &mask.to_ne_bytes(), &[0; 4]);
                        cmp(out, op, &v.to_ne_bytes());
                    }
                    "set" => {
                        t.expect("mark")?;
                        let (op, m) = (t.next()?, number(t.next()?)?);
                        let (mask, xor) = match op {
                            "or" => (!m, m),
                            "xor" => (u32::MAX, m),
                            _ => return None,
                        };
                        meta_load(out, REG_1, META_MARK);
                        bitwise(out, &mask.to_ne_bytes(), &xor.to_ne_bytes());
                        expr(out, "meta", |d| {
                            u32attr(d, 2, META_MARK);
                            u32attr(d, 3, REG_1);
                        });
                    }
                    _ => return None,
                }
            }
            "fib" => {
                t.next();
                for w in ["saddr", "type", "local"] {
                    t.expect(w)?;
                }
                expr(out, "fib", |d| {
                    u32attr(d, 1, REG_1);
                    u32attr(d, 2, FIB_RESULT_ADDRTYPE);
                    u32attr(d, 3, FIB_F_SADDR);
                });
                cmp(out, CMP_EQ, &RTN_LOCAL.to_ne_bytes());
            }
            "masquerade" => {
                t.next();
                let fully = t.peek() == Some("fully-random");
                if fully {
                    t.next();
                }
                expr(out, "masq", |d| {
                    if fully {
                        u32attr(d, 1, NAT_RANGE_PROTO_RANDOM_FULLY);
                    }
                });
            }
            "reject" => {
                t.next();
                // nft's default: ICMP port unreachable (code 3), ICMPv6's in `ip6` (code 4).
                let code = if ids.v6 { 4 } else { 3 };
                expr(out, "reject", |d| {
                    u32attr(d, 1, 0);
                    attr(d, 2, &[code]);
                });
            }
            "update" => {
                t.next();
                let set = t.next()?.strip_prefix('@')?.to_string();
                t.expect("{")?;
                let field = Field::parse(&mut t)?;
                t.expect("}")?;
                if field.address().is_none() || field.is_v6() != ids.v6 {
                    return None;
                }
                field.load(out, REG_1);
                expr(out, "dynset", |d| {
                    attr(d, 1, &strz(&set));
                    u32attr(d, 3, DYNSET_OP_UPDATE);
                    u32attr(d, 4, REG_1);
                });
            }
            "dnat" => {
                t.next();
                compile_dnat(&mut t, out, &mut rule.sets, ids)?;
            }
            "ip" | "ip6" if t.peek2() == Some("dscp") => {
                let v6 = t.next()? == "ip6";
                t.next();
                let dscp = number(t.next()?).filter(|d| *d < 64 && v6 == ids.v6)? as u8;
                dscp_match(out, dscp, v6);
            }
            "tcp" if t.peek2() == Some("flags") => {
                t.next();
                t.next();
                t.expect("&")?;
                let mask = tcp_flags(&mut t)?;
                t.expect("==")?;
                let set = tcp_flags(&mut t)?;
                // What nft makes of the dependency after an explicit `meta l4proto` is not
                // a form this layer writes.
                if explicit_l4 {
                    return None;
                }
                if !std::mem::replace(&mut l4_tcp, true) {
                    meta_load(out, REG_1, META_L4PROTO);
                    cmp(out, CMP_EQ, &[6]);
                }
                payload(out, REG_1, PAYLOAD_TRANSPORT, 13, 1);
                bitwise(out, &[mask], &[0]);
                cmp(out, CMP_EQ, &[set]);
            }
            "iifname" => {
                t.next();
                let negate = t.peek() == Some("!=");
                if negate {
                    t.next();
                }
                // A whole name (no wildcard), compared as nft compares it: all 16 bytes.
                let name = t.next()?.strip_prefix('"')?.strip_suffix('"')?;
                if name.is_empty() || name.len() >= IFNAMSIZ || name.contains(['*', '\\']) {
                    return None;
                }
                let mut bytes = [0u8; IFNAMSIZ];
                bytes[..name.len()].copy_from_slice(name.as_bytes());
                meta_load(out, REG_1, META_IIFNAME);
                cmp(out, if negate { CMP_NEQ } else { CMP_EQ }, &bytes);
            }
            "meta" if t.peek2() == Some("nftrace") => {
                for w in ["meta", "nftrace", "set", "1"] {
                    t.expect(w)?;
                }
                immediate(out, REG_1, &[1]);
                expr(out, "meta", |d| {
                    u32attr(d, 2, META_NFTRACE);
                    u32attr(d, 3, REG_1);
                });
            }
            "ip" | "ip6" | "meta" | "th" | "tcp" | "udp" | "sctp" | "numgen" => {
                let (first, second) = (t.peek(), t.peek2());
                if first == Some("tcp") && second == Some("dport") {
                    // Its dependency would be written a second time, which nft does not do.
                    if std::mem::replace(&mut l4_tcp, true) {
                        return None;
                    }
                }
                explicit_l4 |= first == Some("meta") && second == Some("l4proto");
                compile_match(&mut t, out, &mut rule.sets, ids)?;
            }
            _ => return None,
        }
    }
    Some(rule)
}

fn number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// `ip dscp N` (the DSCP bits of the TOS byte) or `ip6 dscp N` (across the first two bytes of
/// the header, after the version), masked and compared as nft does.
fn dscp_match(out: &mut Vec<u8>, dscp: u8, v6: bool) {
    if v6 {
        payload(out, REG_1, PAYLOAD_NETWORK, 0, 2);
        bitwise(out, &[0x0f, 0xc0], &[0, 0]);
        cmp(out, CMP_EQ, &[dscp >> 2, (dscp & 3) << 6]);
    } else {
        payload(out, REG_1, PAYLOAD_NETWORK, 1, 1);
        bitwise(out, &[0xfc], &[0]);
        cmp(out, CMP_EQ, &[dscp << 2]);
    }
}

/// TCP flags as `syn`, `(syn | ack)` or `syn | ack`: their bits.
fn tcp_flags(t: &mut Tokens) -> Option<u8> {
    let first = t.next()?;
    let parenthesized = first.starts_with('(');
    let mut word = first.strip_prefix('(').unwrap_or(first);
    let mut bits = 0u8;
    loop {
        let closes = parenthesized && word.ends_with(')');
        bits |= tcp_flag(word.strip_suffix(')').filter(|_| closes).unwrap_or(word))?;
        if closes {
            return Some(bits);
        }
        if t.peek() != Some("|") {
            return (!parenthesized).then_some(bits);
        }
        t.next();
        word = t.next()?;
    }
}

fn tcp_flag(name: &str) -> Option<u8> {
    Some(match name {
        "fin" => 0x01,
        "syn" => 0x02,
        "rst" => 0x04,
        "psh" => 0x08,
        "ack" => 0x10,
        "urg" => 0x20,
        "ecn" => 0x40,
        "cwr" => 0x80,
        _ => return None,
    })
}

fn ct_state(s: &str) -> Option<u32> {
    Some(match s {
        "invalid" => 1,
        "established" => 2,
        "related" => 4,
        "new" => 8,
        "untracked" => 64,
        _ => return None,
    })
}

fn ct_status(s: &str) -> Option<u32> {
    Some(match s {
        "expected" => 1,
        "seen-reply" => 2,
        "assured" => 4,
        "confirmed" => 8,
        "snat" => 16,
        "dnat" => 32,
        "dying" => 512,
        _ => return None,
    })
}

fn ct_bits(list: &str, bit: fn(&str) -> Option<u32>) -> Option<u32> {
    list.split(',').try_fold(0, |acc, s| Some(acc | bit(s)?))
}

/// `dnat to A:P` (`[A6]:P`), `dnat ip addr . port to numgen … map { … }`, `dnat ip to KEY
/// map @SET`, and the same with `ip6`.
fn compile_dnat(t: &mut Tokens, out: &mut Vec<u8>, sets: &mut Vec<Anon>, ids: &mut Ids) -> Option<()> {
    match t.next()? {
        "to" => {
            let to = t.next()?.parse::<SocketAddr>().ok()?;
            if to.is_ipv6() != ids.v6 {
                return None;
            }
            immediate(out, REG_1, &octets(to.ip()));
            immediate(out, REG_2, &to.port().to_be_bytes());
            dnat(out, ids.v6, REG_2, Some(NAT_RANGE_PROTO_SPECIFIED));
        }
        family @ ("ip" | "ip6") => {
            let v6 = family == "ip6";
            if v6 != ids.v6 {
                return None;
            }
            // The address in register 1, the port in the 32-bit register after it.
            let port_reg = REG32_00 + if v6 { 4 } else { 1 };
            match t.next()? {
                "addr" => {
                    for w in [".", "port", "to"] {
                        t.expect(w)?;
                    }
                    let Field::Numgen(m) = Field::parse(t)? else { return None };
                    t.expect("map")?;
                    t.expect("{")?;
                    let entries = braced(t, |t| {
                        let key: u32 = t.next()?.parse().ok()?;
                        t.expect(":")?;
                        let addr = t.next()?.parse::<IpAddr>().ok().filter(|a| a.is_ipv6() == v6)?;
                        t.expect(".")?;
                        Some((key, addr, t.next()?.parse::<u16>().ok()?))
                    })?;
                    numgen_map(out, sets, ids, m, AnonKind::AddressPorts(entries), REG_1);
                    dnat(out, v6, port_reg, None);
                }
                "to" => {
                    let fields = concat(t)?;
                    t.expect("map")?;
                    let set = t.next()?.strip_prefix('@')?.to_string();
                    load_concat(out, &fields);
                    lookup(out, &SetRef::Named(set), Some(REG_1), false);
                    dnat(out, v6, port_reg, None);
                }
                _ => return None,
            }
        }
        _ => return None,
    }
    Some(())
}

/// The fields of a `typeof` declaration (`ip daddr . meta l4proto . tcp dport`).
pub(super) fn fields(text: &str) -> Option<Vec<Field>> {
    let mut t = Tokens::new(text)?;
    let fields = concat(&mut t)?;
    t.peek().is_none().then_some(fields)
}

/// The items of a `{ a , b }` list whose `{` was read, through its `}`.
fn braced<T>(t: &mut Tokens, mut item: impl FnMut(&mut Tokens) -> Option<T>) -> Option<Vec<T>> {
    let mut items = vec![];
    loop {
        items.push(item(t)?);
        match t.next()? {
            "," => continue,
            "}" => return Some(items),
            _ => return None,
        }
    }
}

/// `numgen random mod m` looked up in an anonymous map of `kind`, the result in `dreg`.
fn numgen_map(out: &mut Vec<u8>, sets: &mut Vec<Anon>, ids: &mut Ids, m: u32, kind: AnonKind, dreg: u32) {
    Field::Numgen(m).load(out, REG_1);
    let (id, name) = ids.next(true);
    lookup(out, &SetRef::Anon(id, name.clone()), Some(dreg), false);
    sets.push(Anon { id, name, kind });
}

fn concat(t: &mut Tokens) -> Option<Vec<Field>> {
    let mut fields = vec![Field::parse(t)?];
    while t.peek() == Some(".") {
        t.next();
        fields.push(Field::parse(t)?);
    }
    Some(fields)
}

/// A match or lookup that starts with a field: `ip daddr 10.0.0.1`, `ip saddr != CIDR`,
/// `ip daddr @set`, `ip saddr != { … }`, `meta l4proto tcp`, `KEY vmap @map`,
/// `numgen random mod N vmap { … }`, `KEY @set`.
fn compile_match(t: &mut Tokens, out: &mut Vec<u8>, sets: &mut Vec<Anon>, ids: &mut Ids) -> Option<()> {
    let fields = concat(t)?;
    match t.peek()? {
        "vmap" => {
            t.next();
            if t.peek()? == "{" {
                let [Field::Numgen(m)] = fields[..] else { return None };
                t.next();
                let entries = braced(t, |t| {
                    let key: u32 = t.next()?.parse().ok()?;
                    t.expect(":")?;
                    Some((key, Verdict::parse(t)?))
                })?;
                numgen_map(out, sets, ids, m, AnonKind::Verdicts(entries), REG_VERDICT);
            } else {
                let set = t.next()?.strip_prefix('@')?.to_string();
                load_concat(out, &fields);
                lookup(out, &SetRef::Named(set), Some(REG_VERDICT), false);
            }
        }
        w if w.starts_with('@') => {
            t.next();
            load_concat(out, &fields);
            lookup(out, &SetRef::Named(w[1..].to_string()), None, false);
        }
        _ => {
            let [field] = fields[..] else { return None };
            let negate = t.peek() == Some("!=");
            if negate {
                t.next();
            }
            let op = if negate { CMP_NEQ } else { CMP_EQ };
            match field {
                Field::IpSaddr | Field::IpDaddr | Field::Ip6Saddr | Field::Ip6Daddr => {
                    let v6 = field.is_v6();
                    if v6 != ids.v6 {
                        return None;
                    }
                    if let Some(set) = t.peek().and_then(|w| w.strip_prefix('@')) {
                        t.next();
                        field.load(out, REG_1);
                        lookup(out, &SetRef::Named(set.to_string()), None, negate);
                        return Some(());
                    }
                    let prefixes = if t.peek() == Some("{") {
                        t.next();
                        braced(t, |t| prefix(t.next()?, v6))?
                    } else {
                        vec![prefix(t.next()?, v6)?]
                    };
                    let whole = if v6 { 128 } else { 32 };
                    if let [(addr, len)] = prefixes[..] {
                        // A one-element set is a comparison, as nft makes it.
                        address_match(out, field, addr, len, op);
                    } else {
                        let interval = prefixes.iter().any(|(_, l)| *l < whole);
                        let mut ranges: Vec<(u128, u128)> = prefixes.into_iter().map(range).collect();
                        ranges.sort();
                        let mut merged: Vec<(u128, u128)> = vec![];
                        for r in ranges {
                            match merged.last_mut() {
                                Some(last) if interval && r.0 <= last.1.saturating_add(1) => last.1 = last.1.max(r.1),
                                Some(last) if !interval && r == *last => {}
                                _ => merged.push(r),
                            }
                        }
                        field.load(out, REG_1);
                        let (id, name) = ids.next(false);
                        lookup(out, &SetRef::Anon(id, name.clone()), None, negate);
                        let kind = AnonKind::Addresses { field, ranges: merged, interval };
                        sets.push(Anon { id, name, kind });
                    }
                }
                Field::L4proto => {
                    let p = proto(t.next()?)?;
                    field.load(out, REG_1);
                    cmp(out, op, &[p]);
                }
                Field::Dport(p) => {
                    let port: u16 = t.next()?.parse().ok()?;
                    load_concat(out, &[Field::Dport(p)]);
                    cmp(out, op, &port.to_be_bytes());
                }
                Field::Numgen(_) => return None,
            }
        }
    }
    Some(())
}

/// An address or prefix compared as nft compares it: whole bytes loaded alone, other prefix
/// lengths masked.
fn address_match(out: &mut Vec<u8>, field: Field, addr: IpAddr, len: u8, op: u32) {
    let (offset, size) = field.address().expect("an address field");
    let o = octets(addr);
    if len.is_multiple_of(8) && len > 0 {
        let n = usize::from(len / 8);
        payload(out, REG_1, PAYLOAD_NETWORK, offset, n as u32);
        cmp(out, op, &o[..n]);
    } else {
        payload(out, REG_1, PAYLOAD_NETWORK, offset, size);
        bitwise(out, &mask_bytes(len, size as usize), &vec![0; size as usize]);
        cmp(out, op, &o);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expressions of a compiled rule as `name` list, for readable assertions.
    fn names(r: &Rule) -> Vec<String> {
        let mut out = vec![];
        let mut rest = &r.exprs[..];
        while rest.len() >= 4 {
            let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
            let body = &rest[4..len];
            // NFTA_EXPR_NAME is the first attribute.
            let nlen = u16::from_ne_bytes([body[0], body[1]]) as usize;
            out.push(String::from_utf8_lossy(&body[4..nlen - 1]).into_owned());
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        }
        out
    }

    fn c(text: &str) -> Rule {
        compile(text, &mut Ids::default()).unwrap_or_else(|| panic!("{text} should compile"))
    }

    #[test]
    fn the_proxier_rule_shapes_compile_to_nfts_expressions() {
        let cases: &[(&str, &[&str])] = &[
            ("ct state new jump firewall-check", &["ct", "bitwise", "cmp", "immediate"]),
            ("ip daddr . meta l4proto . th dport vmap @service-ips", &["payload", "meta", "payload", "lookup"]),
            (
                "ip daddr @cluster-ips ip saddr != 10.244.0.0/16 mark set mark or 0x00004000 comment \"x\"",
                &["payload", "lookup", "payload", "cmp", "meta", "bitwise", "meta"],
            ),
            ("mark and 0x00004000 != 0 mark set mark xor 0x00004000 masquerade fully-random", &[
                "meta", "bitwise", "cmp", "meta", "bitwise", "meta", "masq",
            ]),
            ("numgen random mod 2 vmap { 0 : goto a , 1 : goto b }", &["numgen", "lookup"]),
            ("meta l4proto tcp dnat to 10.0.0.1:80", &["meta", "cmp", "immediate", "immediate", "nat"]),
            ("meta l4proto udp dnat ip addr . port to numgen random mod 2 map { 0 : 10.0.0.1 . 80 , 1 : 10.0.0.2 . 81 }", &[
                "meta", "cmp", "numgen", "lookup", "nat",
            ]),
            ("dnat ip to ip daddr . meta l4proto . tcp dport . numgen random mod 3 map @endpoints", &[
                "meta", "cmp", "payload", "meta", "payload", "numgen", "lookup", "nat",
            ]),
            ("ip saddr != { 10.0.0.0/8, 192.168.1.0/24 } drop", &["payload", "lookup", "immediate"]),
            ("ip daddr { 10.96.0.0/12 } drop", &["payload", "bitwise", "cmp", "immediate"]),
            ("fib saddr type local goto x comment \"short-circuit local traffic\"", &["fib", "cmp", "immediate"]),
            ("update @aff { ip saddr }", &["payload", "dynset"]),
            ("reject", &["reject"]),
        ];
        for (text, want) in cases {
            assert_eq!(names(&c(text)), *want, "{text}");
        }
        assert_eq!(
            c("fib saddr type local goto x comment \"short-circuit local traffic\"").comment.as_deref(),
            Some("short-circuit local traffic")
        );
    }

    #[test]
    fn anonymous_sets_are_numbered_merged_and_kept_with_the_rule() {
        let mut ids = Ids::tagged("t1-".into(), false);
        compile("ip saddr != { 10.0.0.1, 10.0.0.2 } drop", &mut ids).unwrap();
        let r = compile("ip saddr != { 10.1.0.0/16, 10.0.0.0/8, 192.168.1.0/24 } drop", &mut ids).unwrap();
        assert_eq!(
            r.sets,
            [Anon {
                id: 2,
                name: "__t1-2".into(),
                kind: AnonKind::Addresses {
                    field: Field::IpSaddr,
                    ranges: vec![(0x0a00_0000, 0x0aff_ffff), (0xc0a8_0100, 0xc0a8_01ff)],
                    interval: true
                }
            }]
        );
        let r = compile("numgen random mod 2 vmap { 0 : goto a , 1 : drop }", &mut ids).unwrap();
        let AnonKind::Verdicts(v) = &r.sets[0].kind else { panic!() };
        assert_eq!(v[1], (1, Verdict { code: 0, chain: None }));
    }

    #[test]
    fn a_prefix_compares_whole_bytes_alone_and_masks_the_rest() {
        assert_eq!(names(&c("ip saddr 10.0.0.0/8 goto x")), ["payload", "cmp", "immediate"]);
        assert_eq!(names(&c("ip saddr 10.240.0.0/12 goto x")), ["payload", "bitwise", "cmp", "immediate"]);
        assert_eq!(prefix("10.250.1.1/12", false), Some(("10.240.0.0".parse().unwrap(), 12)), "host bits cleared");
        assert_eq!(prefix("fd00:10:244:1::5/56", true), Some(("fd00:10:244::".parse().unwrap(), 56)));
        assert_eq!(prefix("fd00::1", false), None, "the table's family only");
        assert_eq!(mask_bytes(12, 4), [0xff, 0xf0, 0, 0]);
    }

    /// An `ip6` table's rules: 16-byte addresses (a concatenation's next field four 32-bit
    /// registers on), ICMPv6's reject code, the IPv6 NAT family; an `ip` word refused there.
    #[test]
    fn the_ip6_family_compiles_its_own_words() {
        let c6 = |text: &str| compile(text, &mut Ids::of_family(true));
        let cases: &[(&str, &[&str])] = &[
            ("ip6 daddr . meta l4proto . th dport vmap @service-ips", &["payload", "meta", "payload", "lookup"]),
            ("ip6 saddr fd00:10:244::/56 goto x", &["payload", "cmp", "immediate"]),
            ("ip6 daddr { fd00:10:96::/112 } drop", &["payload", "cmp", "immediate"]),
            ("ip6 daddr fd00:10:96::/108 drop", &["payload", "bitwise", "cmp", "immediate"]),
            ("ip6 saddr != { 2001:db8:113::/64, fd00:56::/64, 2001:db8:100::7 } drop", &["payload", "lookup", "immediate"]),
            ("meta l4proto tcp dnat to [fd00:10:244:1::7]:8080", &["meta", "cmp", "immediate", "immediate", "nat"]),
            ("meta l4proto tcp dnat ip6 addr . port to numgen random mod 2 map { 0 : fd00::1 . 80 , 1 : fd00::2 . 80 }",
             &["meta", "cmp", "numgen", "lookup", "nat"]),
            ("dnat ip6 to ip6 daddr . meta l4proto . tcp dport . numgen random mod 2 map @endpoints",
             &["meta", "cmp", "payload", "meta", "payload", "numgen", "lookup", "nat"]),
            ("update @aff { ip6 saddr }", &["payload", "dynset"]),
            ("reject", &["reject"]),
        ];
        for (text, want) in cases {
            assert_eq!(c6(text).map(|r| names(&r)).unwrap_or_default(), *want, "{text}");
        }
        // The port of `dnat ip6 … map` is read from the register after the 16-byte address.
        let r = c6("dnat ip6 to ip6 daddr . meta l4proto . tcp dport . numgen random mod 2 map @endpoints").unwrap();
        let port_reg = (REG32_00 + 4).to_be_bytes();
        assert!(r.exprs.windows(4).any(|w| w == port_reg));
        let reject = c6("reject").unwrap();
        assert!(reject.exprs.windows(5).any(|w| w == [5, 0, 2, 0, 4]), "ICMPv6 port unreachable");
        for v4_word in ["ip daddr 10.0.0.1 drop", "dnat ip to ip daddr . tcp dport map @m", "dnat to 10.0.0.1:80"] {
            assert!(c6(v4_word).is_none(), "{v4_word}");
        }
        assert!(compile("dnat to [fd00::1]:80", &mut Ids::default()).is_none());
    }

    /// `podpath trace`'s table: DSCP and TCP flag matches, `meta nftrace set 1`; the `meta
    /// l4proto tcp` dependency once per rule, as nft writes it.
    #[test]
    fn the_trace_tables_shapes_compile() {
        let cases: &[(&str, &[&str])] = &[
            (
                "ip dscp 0x2d tcp flags & (syn | ack) == syn meta nftrace set 1",
                &["payload", "bitwise", "cmp", "meta", "cmp", "payload", "bitwise", "cmp", "immediate", "meta"],
            ),
            (
                "tcp dport 41000 tcp flags & (syn | ack) == syn | ack meta nftrace set 1",
                &["meta", "cmp", "payload", "cmp", "payload", "bitwise", "cmp", "immediate", "meta"],
            ),
            (
                "ip dscp 0x2d udp dport 9 goto traced",
                &["payload", "bitwise", "cmp", "meta", "cmp", "payload", "cmp", "immediate"],
            ),
            ("iifname != \"lo\" jump probe", &["meta", "cmp", "immediate"]),
        ];
        for (text, want) in cases {
            assert_eq!(names(&c(text)), *want, "{text}");
        }
        // The DSCP 0x2d: 0xb4 in the IPv4 TOS byte; 0x0b, 0x40 across the IPv6 header's first
        // two bytes (cmp's data: a 4-byte attribute header, then the value).
        let has = |r: &Rule, bytes: &[u8]| r.exprs.windows(bytes.len()).any(|w| w == bytes);
        assert!(has(&c("ip dscp 0x2d"), &[5, 0, 1, 0, 0xb4]));
        let v6 = compile("ip6 dscp 0x2d", &mut Ids::of_family(true)).unwrap();
        assert!(has(&v6, &[6, 0, 1, 0, 0x0b, 0x40]) && has(&v6, &[6, 0, 1, 0, 0x0f, 0xc0]));
        assert!(has(&c("tcp flags & (syn | ack) == syn | ack"), &[5, 0, 1, 0, 0x12]));
        assert!(has(&c("tcp flags & rst == rst"), &[5, 0, 1, 0, 0x04]));
        // The name in all 16 bytes of the comparison.
        assert!(has(&c("iifname \"lo\""), &[20, 0, 1, 0, b'l', b'o', 0, 0]));
        for bad in [
            "ip dscp 64",
            "ip6 dscp 0x2d",
            "tcp flags & (syn | ack == syn",
            "tcp flags & syn) == syn",
            "tcp flags & bogus == syn",
            "tcp flags syn / syn,ack",
            "meta nftrace set 0",
            "tcp flags & syn == syn tcp dport 80",
            "meta l4proto tcp tcp flags & syn == syn",
            "iifname \"eth*\"",
            "iifname \"a-name-too-long-for-it\"",
            "iifname lo",
        ] {
            assert!(compile(bad, &mut Ids::default()).is_none(), "{bad}");
        }
    }

    #[test]
    fn what_it_does_not_know_is_refused_not_guessed() {
        for text in [
            "ip6 daddr ::1 drop",
            "ip daddr 10.0.0.0/33 drop",
            "counter",
            "ip daddr 10.0.0.300 drop",
            "mark set mark and 0x1",
            "comment \"unterminated",
            "jump",
            "ip saddr { 10.0.0.1, } drop",
            "numgen random mod 0 vmap { 0 : drop }",
            "ct state bogus drop",
        ] {
            assert!(compile(text, &mut Ids::default()).is_none(), "{text}");
        }
    }
}
