//! The declarations of a transaction in nf_tables messages' attributes: tables, chains, named
//! sets and maps (by `type` names or `typeof` expressions), and the anonymous sets a rule
//! declares ([`super::rule::Anon`]) with their elements. Each carries the user data nft writes
//! (comments, byte orders, `typeof` descriptions), because `nft list` reads its declarations
//! back from them. Pure.

use podpath_ruleset::nft::{Chain, Set};

use super::rule::{Anon, AnonKind, Field};
use super::{attr, attr_with, nested, strz};

const NFTA_TABLE_NAME: u16 = 1;
const NFTA_TABLE_FLAGS: u16 = 2;
const NFTA_TABLE_USERDATA: u16 = 6;
const NFTA_CHAIN_TABLE: u16 = 1;
const NFTA_CHAIN_NAME: u16 = 3;
const NFTA_CHAIN_HOOK: u16 = 4;
const NFTA_CHAIN_TYPE: u16 = 7;
const NFTA_CHAIN_USERDATA: u16 = 12;
const NFTA_HOOK_HOOKNUM: u16 = 1;
const NFTA_HOOK_PRIORITY: u16 = 2;
const NFTA_SET_TABLE: u16 = 1;
const NFTA_SET_NAME: u16 = 2;
const NFTA_SET_FLAGS: u16 = 3;
const NFTA_SET_KEY_TYPE: u16 = 4;
const NFTA_SET_KEY_LEN: u16 = 5;
const NFTA_SET_DATA_TYPE: u16 = 6;
const NFTA_SET_DATA_LEN: u16 = 7;
const NFTA_SET_DESC: u16 = 9;
const NFTA_SET_DESC_SIZE: u16 = 1;
const NFTA_SET_ID: u16 = 10;
const NFTA_SET_TIMEOUT: u16 = 11;
const NFTA_SET_USERDATA: u16 = 13;
const NFTA_SET_ELEM_LIST_TABLE: u16 = 1;
const NFTA_SET_ELEM_LIST_SET: u16 = 2;
const NFTA_SET_ELEM_LIST_ELEMENTS: u16 = 3;
const NFTA_SET_ELEM_LIST_SET_ID: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_SET_ELEM_KEY: u16 = 1;
const NFTA_SET_ELEM_DATA: u16 = 2;
const NFTA_SET_ELEM_FLAGS: u16 = 3;
const NFTA_DATA_VALUE: u16 = 1;

const SET_ANONYMOUS: u32 = 0x1;
const SET_CONSTANT: u32 = 0x2;
const SET_INTERVAL: u32 = 0x4;
const SET_MAP: u32 = 0x8;
const SET_TIMEOUT: u32 = 0x10;
const SET_EVAL: u32 = 0x20;
const SET_ELEM_INTERVAL_END: u32 = 1;
const DATA_VERDICT: u32 = 0xffff_ff00;

// nft's data type ids (a concatenation: each next id shifted in 6 bits at a time).
const TYPE_INTEGER: u32 = 4;
const TYPE_IPADDR: u32 = 7;
const TYPE_IP6ADDR: u32 = 8;
const TYPE_INET_PROTOCOL: u32 = 12;
const TYPE_INET_SERVICE: u32 = 13;
const TYPE_MARK: u32 = 19;
const TYPE_BITS: u32 = 6;

// libnftnl's user data records (type, length, value).
const UDATA_TABLE_COMMENT: u8 = 0;
const UDATA_CHAIN_COMMENT: u8 = 0;
const UDATA_SET_KEYBYTEORDER: u8 = 0;
const UDATA_SET_DATABYTEORDER: u8 = 1;
const UDATA_SET_MERGE_ELEMENTS: u8 = 2;
const UDATA_SET_KEY_TYPEOF: u8 = 3;
const UDATA_SET_DATA_TYPEOF: u8 = 4;
const UDATA_SET_DATA_INTERVAL: u8 = 6;
const UDATA_SET_COMMENT: u8 = 7;
const BYTEORDER_INVALID: u32 = 0;
const BYTEORDER_HOST: u32 = 1;
const BYTEORDER_BIG: u32 = 2;
// nft's expression kinds, as a `typeof` description names them.
const EXPR_VERDICT: u32 = 1;
const EXPR_PAYLOAD: u32 = 7;
const EXPR_META: u32 = 9;
const EXPR_CONCAT: u32 = 13;
const EXPR_NUMGEN: u32 = 23;

fn u32be(out: &mut Vec<u8>, kind: u16, v: u32) {
    attr(out, kind, &v.to_be_bytes());
}

/// One user data record; `None` past its one-byte length.
fn ud(out: &mut Vec<u8>, kind: u8, value: &[u8]) -> Option<()> {
    out.extend([kind, u8::try_from(value.len()).ok()?]);
    out.extend(value);
    Some(())
}

fn ud_u32(out: &mut Vec<u8>, kind: u8, v: u32) -> Option<()> {
    ud(out, kind, &v.to_ne_bytes())
}

fn ud_comment(out: &mut Vec<u8>, kind: u8, comment: &str) -> Option<()> {
    ud(out, kind, &strz(comment))
}

/// A comment as the one user data record of a rule or an element; `None` past 254 bytes.
pub(super) fn comment(kind: u8, text: &str) -> Option<Vec<u8>> {
    let mut out = vec![];
    ud_comment(&mut out, kind, text)?;
    Some(out)
}

/// `NEWTABLE`'s attributes.
pub(super) fn table(out: &mut Vec<u8>, name: &str, comment: Option<&str>) -> Option<()> {
    attr(out, NFTA_TABLE_NAME, &strz(name));
    u32be(out, NFTA_TABLE_FLAGS, 0);
    if let Some(c) = comment {
        let mut u = vec![];
        ud_comment(&mut u, UDATA_TABLE_COMMENT, c)?;
        attr(out, NFTA_TABLE_USERDATA, &u);
    }
    Some(())
}

fn hook_number(hook: &str) -> Option<u32> {
    Some(match hook {
        "prerouting" => 0,
        "input" => 1,
        "forward" => 2,
        "output" => 3,
        "postrouting" => 4,
        _ => return None,
    })
}

/// `NEWCHAIN`'s attributes (`DELCHAIN` and the rule flush name the chain alone).
pub(super) fn chain(out: &mut Vec<u8>, table: &str, c: &Chain) -> Option<()> {
    attr(out, NFTA_CHAIN_TABLE, &strz(table));
    attr(out, NFTA_CHAIN_NAME, &strz(&c.name));
    if let Some(h) = &c.hook {
        attr(out, NFTA_CHAIN_TYPE, &strz(h.kind));
        let num = hook_number(h.hook)?;
        nested(out, NFTA_CHAIN_HOOK, |n| {
            u32be(n, NFTA_HOOK_HOOKNUM, num);
            attr(n, NFTA_HOOK_PRIORITY, &h.priority.to_be_bytes());
        });
    }
    if let Some(comment) = &c.comment {
        let mut u = vec![];
        ud_comment(&mut u, UDATA_CHAIN_COMMENT, comment)?;
        attr(out, NFTA_CHAIN_USERDATA, &u);
    }
    Some(())
}

/// A `type` name's id, length and byte order.
fn type_name(name: &str) -> Option<(u32, u32, u32)> {
    Some(match name {
        "ipv4_addr" => (TYPE_IPADDR, 4, BYTEORDER_BIG),
        "ipv6_addr" => (TYPE_IP6ADDR, 16, BYTEORDER_BIG),
        "inet_proto" => (TYPE_INET_PROTOCOL, 1, BYTEORDER_HOST),
        "inet_service" => (TYPE_INET_SERVICE, 2, BYTEORDER_BIG),
        "mark" => (TYPE_MARK, 4, BYTEORDER_HOST),
        _ => return None,
    })
}

/// A key or value type: its id, length, byte order, and the `typeof` record nft keeps for it.
struct Type {
    id: u32,
    len: u32,
    byteorder: u32,
    typeof_record: Option<Vec<u8>>,
}

/// `ipv4_addr . inet_proto . inet_service`.
fn by_names(text: &str) -> Option<Type> {
    let parts: Vec<(u32, u32, u32)> = text.split(" . ").map(|p| type_name(p.trim())).collect::<Option<_>>()?;
    if let [(id, len, byteorder)] = parts[..] {
        return Some(Type { id, len, byteorder, typeof_record: None });
    }
    // A concatenation of named types: nft records only that it is one.
    let mut record = vec![];
    ud_u32(&mut record, 0, EXPR_CONCAT)?;
    ud(&mut record, 1, &[])?;
    Some(Type {
        id: parts.iter().fold(0, |acc, (id, _, _)| (acc << TYPE_BITS) | id),
        len: parts.iter().map(|(_, l, _)| l.next_multiple_of(4)).sum(),
        byteorder: BYTEORDER_INVALID,
        typeof_record: Some(record),
    })
}

/// One field's data type and `typeof` description (expression kind, then its details).
fn field_type(f: Field) -> Option<(u32, Vec<u8>)> {
    let mut d = vec![];
    let (id, kind) = match f {
        Field::IpSaddr | Field::IpDaddr => {
            // Protocol description 12 (ip), template 11 (saddr) or 12 (daddr).
            ud_u32(&mut d, 0, 12)?;
            ud_u32(&mut d, 1, if f == Field::IpSaddr { 11 } else { 12 })?;
            (TYPE_IPADDR, EXPR_PAYLOAD)
        }
        Field::Ip6Saddr | Field::Ip6Daddr => {
            // Protocol description 13 (ip6), template 8 (saddr) or 9 (daddr).
            ud_u32(&mut d, 0, 13)?;
            ud_u32(&mut d, 1, if f == Field::Ip6Saddr { 8 } else { 9 })?;
            (TYPE_IP6ADDR, EXPR_PAYLOAD)
        }
        Field::Dport(Some(6)) => {
            // Protocol description 8 (tcp), template 2 (dport).
            ud_u32(&mut d, 0, 8)?;
            ud_u32(&mut d, 1, 2)?;
            (TYPE_INET_SERVICE, EXPR_PAYLOAD)
        }
        Field::L4proto => {
            ud_u32(&mut d, 0, 16)?;
            (TYPE_INET_PROTOCOL, EXPR_META)
        }
        Field::Numgen(m) => {
            ud_u32(&mut d, 0, 1)?;
            ud_u32(&mut d, 1, m)?;
            ud_u32(&mut d, 2, 0)?;
            (TYPE_INTEGER, EXPR_NUMGEN)
        }
        Field::Dport(_) => return None,
    };
    let mut record = vec![];
    ud_u32(&mut record, 0, kind)?;
    ud(&mut record, 1, &d)?;
    Some((id, record))
}

/// `typeof ip daddr . meta l4proto . tcp dport . numgen random mod 1`: a concatenation of
/// expressions (one alone is not written by the layouts, and is refused).
fn by_expressions(text: &str) -> Option<Type> {
    let fields = super::rule::fields(text)?;
    if fields.len() < 2 {
        return None;
    }
    let mut inner = vec![];
    let (mut id, mut len) = (0, 0);
    for (i, f) in fields.iter().enumerate() {
        let (t, record) = field_type(*f)?;
        ud(&mut inner, u8::try_from(i).ok()?, &record)?;
        id = (id << TYPE_BITS) | t;
        len += (f.len() as u32).next_multiple_of(4);
    }
    let mut record = vec![];
    ud_u32(&mut record, 0, EXPR_CONCAT)?;
    ud(&mut record, 1, &inner)?;
    Some(Type { id, len, byteorder: BYTEORDER_INVALID, typeof_record: Some(record) })
}

/// `10800s` in milliseconds.
fn timeout_ms(text: &str) -> Option<u64> {
    text.strip_suffix('s')?.parse::<u64>().ok()?.checked_mul(1000)
}

/// `NEWSET`'s attributes for a named set or map; `None` for a type, flag or timeout this
/// layer does not write.
pub(super) fn set(out: &mut Vec<u8>, table: &str, s: &Set, id: u32) -> Option<()> {
    let parse = |text: &str| if s.by_expression { by_expressions(text) } else { by_names(text) };
    let key = parse(&s.key_type)?;
    let value = match s.value_type.as_deref() {
        None => None,
        Some("verdict") => Some(None),
        Some(v) => Some(Some(parse(v)?)),
    };
    let mut flags = if value.is_some() { SET_MAP } else { 0 };
    for f in &s.flags {
        flags |= match f.as_str() {
            "interval" => SET_INTERVAL,
            "timeout" => SET_TIMEOUT,
            "dynamic" => SET_EVAL,
            "constant" => SET_CONSTANT,
            _ => return None,
        };
    }
    attr(out, NFTA_SET_TABLE, &strz(table));
    attr(out, NFTA_SET_NAME, &strz(&s.name));
    u32be(out, NFTA_SET_FLAGS, flags);
    u32be(out, NFTA_SET_KEY_TYPE, key.id);
    u32be(out, NFTA_SET_KEY_LEN, key.len);
    match &value {
        Some(None) => {
            u32be(out, NFTA_SET_DATA_TYPE, DATA_VERDICT);
            u32be(out, NFTA_SET_DATA_LEN, 0);
        }
        Some(Some(v)) => {
            u32be(out, NFTA_SET_DATA_TYPE, v.id);
            u32be(out, NFTA_SET_DATA_LEN, v.len);
        }
        None => {}
    }
    u32be(out, NFTA_SET_ID, id);
    if let Some(t) = &s.timeout {
        attr(out, NFTA_SET_TIMEOUT, &timeout_ms(t)?.to_be_bytes());
    }
    let mut u = vec![];
    ud_u32(&mut u, UDATA_SET_KEYBYTEORDER, key.byteorder)?;
    if let Some(v) = &value {
        ud_u32(&mut u, UDATA_SET_DATABYTEORDER, v.as_ref().map_or(BYTEORDER_INVALID, |v| v.byteorder))?;
    }
    if let Some(r) = &key.typeof_record {
        ud(&mut u, UDATA_SET_KEY_TYPEOF, r)?;
    }
    if let Some(Some(Type { typeof_record: Some(r), .. })) = &value {
        if s.by_expression {
            ud(&mut u, UDATA_SET_DATA_TYPEOF, r)?;
        }
    }
    if value.is_some() {
        ud_u32(&mut u, UDATA_SET_DATA_INTERVAL, 0)?;
    }
    if let Some(c) = &s.comment {
        ud_comment(&mut u, UDATA_SET_COMMENT, c)?;
    }
    attr(out, NFTA_SET_USERDATA, &u);
    Some(())
}

/// An anonymous set's elements, as nft lists them for the kernel: an interval set as its
/// boundaries (the start of each range, the end of each flagged `end`, and an `end` at 0.0.0.0
/// when the first range starts later).
fn anon_elements(a: &Anon) -> Vec<u8> {
    let mut list = vec![];
    let key = |e: &mut Vec<u8>, bytes: &[u8]| nested(e, NFTA_SET_ELEM_KEY, |k| attr(k, NFTA_DATA_VALUE, bytes));
    match &a.kind {
        AnonKind::Verdicts(entries) => {
            for (k, v) in entries {
                nested(&mut list, NFTA_LIST_ELEM, |e| {
                    key(e, &k.to_ne_bytes());
                    nested(e, NFTA_SET_ELEM_DATA, |d| v.write(d));
                });
            }
        }
        AnonKind::AddressPorts(entries) => {
            for (k, addr, port) in entries {
                nested(&mut list, NFTA_LIST_ELEM, |e| {
                    key(e, &k.to_ne_bytes());
                    nested(e, NFTA_SET_ELEM_DATA, |d| {
                        attr_with(d, NFTA_DATA_VALUE, |v| {
                            match addr {
                                std::net::IpAddr::V4(a) => v.extend(a.octets()),
                                std::net::IpAddr::V6(a) => v.extend(a.octets()),
                            }
                            v.extend(port.to_be_bytes());
                            v.extend([0, 0]);
                        })
                    });
                });
            }
        }
        AnonKind::Addresses { field, ranges, interval } => {
            let (width, last) = address_width(*field);
            let boundary = |list: &mut Vec<u8>, at: u128, end: bool| {
                nested(list, NFTA_LIST_ELEM, |e| {
                    if end {
                        u32be(e, NFTA_SET_ELEM_FLAGS, SET_ELEM_INTERVAL_END);
                    }
                    key(e, &at.to_be_bytes()[16 - width..]);
                });
            };
            if *interval && ranges.first().is_some_and(|r| r.0 > 0) {
                boundary(&mut list, 0, true);
            }
            for &(first, end) in ranges {
                boundary(&mut list, first, false);
                // A range that reaches the family's last address has no end element.
                if *interval && end < last {
                    boundary(&mut list, end + 1, true);
                }
            }
        }
    }
    list
}

/// An address field's length in bytes and the family's last address as a number.
fn address_width(f: Field) -> (usize, u128) {
    if f.is_v6() {
        (16, u128::MAX)
    } else {
        (4, u128::from(u32::MAX))
    }
}

/// The number of elements [`anon_elements`] writes.
fn anon_size(a: &Anon) -> u32 {
    match &a.kind {
        AnonKind::Verdicts(v) => v.len() as u32,
        AnonKind::AddressPorts(v) => v.len() as u32,
        AnonKind::Addresses { ranges, interval: false, .. } => ranges.len() as u32,
        AnonKind::Addresses { field, ranges, interval: true } => {
            let lead = u32::from(ranges.first().is_some_and(|r| r.0 > 0));
            let last = address_width(*field).1;
            let ends = ranges.iter().filter(|r| r.1 < last).count() as u32;
            lead + ranges.len() as u32 + ends
        }
    }
}

/// `NEWSET`'s attributes for an anonymous set, and then its `NEWSETELEM`'s.
pub(super) fn anon(table: &str, a: &Anon) -> Option<(Vec<u8>, Vec<u8>)> {
    let mut out = vec![];
    attr(&mut out, NFTA_SET_TABLE, &strz(table));
    attr(&mut out, NFTA_SET_NAME, &strz(&a.name));
    let mut u = vec![];
    match &a.kind {
        AnonKind::Verdicts(_) | AnonKind::AddressPorts(_) => {
            let verdicts = matches!(a.kind, AnonKind::Verdicts(_));
            u32be(&mut out, NFTA_SET_FLAGS, SET_ANONYMOUS | SET_CONSTANT | SET_MAP);
            u32be(&mut out, NFTA_SET_KEY_TYPE, TYPE_INTEGER);
            u32be(&mut out, NFTA_SET_KEY_LEN, 4);
            match &a.kind {
                AnonKind::AddressPorts(entries) if entries.first().is_some_and(|e| e.1.is_ipv6()) => {
                    u32be(&mut out, NFTA_SET_DATA_TYPE, (TYPE_IP6ADDR << TYPE_BITS) | TYPE_INET_SERVICE);
                    u32be(&mut out, NFTA_SET_DATA_LEN, 20);
                }
                AnonKind::AddressPorts(_) => {
                    u32be(&mut out, NFTA_SET_DATA_TYPE, (TYPE_IPADDR << TYPE_BITS) | TYPE_INET_SERVICE);
                    u32be(&mut out, NFTA_SET_DATA_LEN, 8);
                }
                _ => {
                    u32be(&mut out, NFTA_SET_DATA_TYPE, DATA_VERDICT);
                    u32be(&mut out, NFTA_SET_DATA_LEN, 0);
                }
            }
            ud_u32(&mut u, UDATA_SET_KEYBYTEORDER, BYTEORDER_HOST)?;
            ud_u32(&mut u, UDATA_SET_DATABYTEORDER, BYTEORDER_INVALID)?;
            if verdicts {
                let mut record = vec![];
                ud_u32(&mut record, 0, EXPR_VERDICT)?;
                ud(&mut record, 1, &[])?;
                ud(&mut u, UDATA_SET_DATA_TYPEOF, &record)?;
            }
            ud_u32(&mut u, UDATA_SET_DATA_INTERVAL, 0)?;
        }
        AnonKind::Addresses { field, interval, .. } => {
            let flags = SET_ANONYMOUS | SET_CONSTANT | if *interval { SET_INTERVAL } else { 0 };
            u32be(&mut out, NFTA_SET_FLAGS, flags);
            let (width, _) = address_width(*field);
            u32be(&mut out, NFTA_SET_KEY_TYPE, if field.is_v6() { TYPE_IP6ADDR } else { TYPE_IPADDR });
            u32be(&mut out, NFTA_SET_KEY_LEN, width as u32);
            ud_u32(&mut u, UDATA_SET_KEYBYTEORDER, BYTEORDER_BIG)?;
            if *interval {
                ud_u32(&mut u, UDATA_SET_MERGE_ELEMENTS, 1)?;
            }
            ud(&mut u, UDATA_SET_KEY_TYPEOF, &field_type(*field)?.1)?;
        }
    }
    u32be(&mut out, NFTA_SET_ID, a.id);
    nested(&mut out, NFTA_SET_DESC, |d| u32be(d, NFTA_SET_DESC_SIZE, anon_size(a)));
    attr(&mut out, NFTA_SET_USERDATA, &u);

    let mut elems = vec![];
    attr(&mut elems, NFTA_SET_ELEM_LIST_TABLE, &strz(table));
    attr(&mut elems, NFTA_SET_ELEM_LIST_SET, &strz(&a.name));
    u32be(&mut elems, NFTA_SET_ELEM_LIST_SET_ID, a.id);
    attr(&mut elems, NFTA_SET_ELEM_LIST_ELEMENTS | super::NLA_F_NESTED, &anon_elements(a));
    Some((out, elems))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The user data of a set's NEWSET (the last attribute).
    fn userdata(s: &Set) -> Vec<u8> {
        let mut out = vec![];
        set(&mut out, "t", s, 1).unwrap();
        let mut rest = &out[..];
        let mut last = vec![];
        while rest.len() >= 4 {
            let len = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
            last = rest[4..len].to_vec();
            rest = &rest[len.next_multiple_of(4).min(rest.len())..];
        }
        last
    }

    #[test]
    fn set_user_data_is_what_nft_writes() {
        // Bytes read from `nft -f` (1.0.6) with strace, for the layouts' declarations.
        let m = Set::map("m1", "ipv4_addr . inet_proto . inet_service", "verdict");
        assert_eq!(userdata(&m), [0, 4, 0, 0, 0, 0, 1, 4, 0, 0, 0, 0, 3, 8, 0, 4, 13, 0, 0, 0, 1, 0, 6, 4, 0, 0, 0, 0]);
        assert_eq!(userdata(&Set::plain("s", "ipv4_addr")), [0, 4, 2, 0, 0, 0]);
        let e = Set::map_of(
            "endpoints",
            "ip daddr . meta l4proto . tcp dport . numgen random mod 1",
            "ip daddr . tcp dport",
        );
        let want: &[u8] = b"\x00\x04\x00\x00\x00\x00\x01\x04\x00\x00\x00\x00\x03\x60\x00\x04\x0d\x00\x00\x00\x01\x58\x00\x14\x00\x04\x07\x00\x00\x00\x01\x0c\x00\x04\x0c\x00\x00\x00\x01\x04\x0c\x00\x00\x00\x01\x0e\x00\x04\x09\x00\x00\x00\x01\x06\x00\x04\x10\x00\x00\x00\x02\x14\x00\x04\x07\x00\x00\x00\x01\x0c\x00\x04\x08\x00\x00\x00\x01\x04\x02\x00\x00\x00\x03\x1a\x00\x04\x17\x00\x00\x00\x01\x12\x00\x04\x01\x00\x00\x00\x01\x04\x01\x00\x00\x00\x02\x04\x00\x00\x00\x00\x04\x34\x00\x04\x0d\x00\x00\x00\x01\x2c\x00\x14\x00\x04\x07\x00\x00\x00\x01\x0c\x00\x04\x0c\x00\x00\x00\x01\x04\x0c\x00\x00\x00\x01\x14\x00\x04\x07\x00\x00\x00\x01\x0c\x00\x04\x08\x00\x00\x00\x01\x04\x02\x00\x00\x00\x06\x04\x00\x00\x00\x00";
        assert_eq!(userdata(&e), want);
    }

    #[test]
    fn interval_sets_list_their_boundaries() {
        let a = Anon {
            id: 3,
            name: "__set%d".into(),
            kind: AnonKind::Addresses {
                field: Field::IpSaddr,
                ranges: vec![(0x0a00_0000, 0x0aff_ffff), (0xffff_ff00, 0xffff_ffff)],
                interval: true,
            },
        };
        // 0.0.0.0 end, 10.0.0.0, 11.0.0.0 end, 255.255.255.0 (reaching the last address: no end).
        assert_eq!(anon_size(&a), 4);
        let (_, elements) = anon("t", &a).unwrap();
        assert!(elements.windows(4).any(|w| w == [0x0b, 0, 0, 0]), "11.0.0.0 as an end");
        // IPv6: 16-byte boundaries, `::` as the leading end.
        let six = Anon {
            id: 4,
            name: "__set%d".into(),
            kind: AnonKind::Addresses {
                field: Field::Ip6Saddr,
                ranges: vec![(0xfd00_u128 << 112, (0xfd00_u128 << 112) | ((1 << 72) - 1))],
                interval: true,
            },
        };
        assert_eq!(anon_size(&six), 3);
        let (_, elements) = anon("t", &six).unwrap();
        let end: [u8; 16] = ((0xfd00_u128 << 112) + (1 << 72)).to_be_bytes();
        assert!(elements.windows(16).any(|w| w == end), "fd00:0:0:100:: as the end");
    }

    #[test]
    fn unknown_types_and_flags_are_refused() {
        assert!(set(&mut vec![], "t", &Set::plain("s", "ether_addr"), 1).is_none());
        let mut s = Set::plain("s", "ipv4_addr");
        s.flags = vec!["bogus".into()];
        assert!(set(&mut vec![], "t", &s, 1).is_none());
    }
}
