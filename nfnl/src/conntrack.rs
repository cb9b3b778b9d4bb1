//! One TCP connection's conntrack entry over ctnetlink (the same `NETLINK_NETFILTER` socket):
//! the exact tuple looked up in the kernel's table (one hash lookup, whatever the table's
//! size), as `conntrack -G` asks. `request` and `entry` are pure; `Socket::conntrack` sends.

use std::net::{IpAddr, SocketAddr};

use super::{attr, attrs, message, nested};

pub(super) const NFNL_SUBSYS_CTNETLINK: u16 = 1;
pub(super) const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const IPS_ASSURED: u32 = 1 << 2;
const IPPROTO_TCP: u8 = 6;

/// The TCP states as conntrack names them (the kernel's `tcp_conntrack` order).
const TCP_STATES: [&str; 10] = [
    "NONE",
    "SYN_SENT",
    "SYN_RECV",
    "ESTABLISHED",
    "FIN_WAIT",
    "CLOSE_WAIT",
    "LAST_ACK",
    "TIME_WAIT",
    "CLOSE",
    "SYN_SENT2",
];

/// A TCP connection's entry: its tuples as the first packet went and as the reply comes back
/// (they differ where the kernel translates it), its TCP state, whether it was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub orig: (SocketAddr, SocketAddr),
    pub reply: (SocketAddr, SocketAddr),
    /// As conntrack names it (`ESTABLISHED`…); empty when the kernel gave none.
    pub state: &'static str,
    /// `[ASSURED]`: traffic was seen both ways.
    pub assured: bool,
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The `IPCTNL_MSG_CT_GET` for the TCP connection `from → to`, numbered `seq`.
pub fn request((from, to): (SocketAddr, SocketAddr), seq: u32, flags: u16) -> Vec<u8> {
    let v6 = from.is_ipv6();
    let mut body = vec![];
    nested(&mut body, CTA_TUPLE_ORIG, |t| {
        nested(t, CTA_TUPLE_IP, |ip| {
            let (s, d) = if v6 { (CTA_IP_V6_SRC, CTA_IP_V6_DST) } else { (CTA_IP_V4_SRC, CTA_IP_V4_DST) };
            attr(ip, s, &octets(from.ip()));
            attr(ip, d, &octets(to.ip()));
        });
        nested(t, CTA_TUPLE_PROTO, |p| {
            attr(p, CTA_PROTO_NUM, &[IPPROTO_TCP]);
            attr(p, CTA_PROTO_SRC_PORT, &from.port().to_be_bytes());
            attr(p, CTA_PROTO_DST_PORT, &to.port().to_be_bytes());
        });
    });
    let mut msg = vec![];
    let family = if v6 { 10 } else { 2 };
    message(&mut msg, (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET, flags, seq, family, 0, &body);
    msg
}

fn find(body: &[u8], kind: u16) -> Option<&[u8]> {
    attrs(body).find(|(k, _)| *k == kind).map(|(_, v)| v)
}

/// A tuple attribute's addresses and ports.
fn tuple(value: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let ip = find(value, CTA_TUPLE_IP)?;
    let addr = |v4: u16, v6: u16| -> Option<IpAddr> {
        if let Some(b) = find(ip, v4) {
            return Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?));
        }
        Some(IpAddr::from(<[u8; 16]>::try_from(find(ip, v6)?).ok()?))
    };
    let (src, dst) = (addr(CTA_IP_V4_SRC, CTA_IP_V6_SRC)?, addr(CTA_IP_V4_DST, CTA_IP_V6_DST)?);
    let proto = find(value, CTA_TUPLE_PROTO)?;
    let port = |k: u16| -> Option<u16> { Some(u16::from_be_bytes(find(proto, k)?.try_into().ok()?)) };
    Some((SocketAddr::new(src, port(CTA_PROTO_SRC_PORT)?), SocketAddr::new(dst, port(CTA_PROTO_DST_PORT)?)))
}

/// The entry in an `IPCTNL_MSG_CT_NEW` message's body (after the netlink header).
pub fn entry(body: &[u8]) -> Option<Entry> {
    let top = body.get(4..)?;
    let orig = tuple(find(top, CTA_TUPLE_ORIG)?)?;
    let reply = tuple(find(top, CTA_TUPLE_REPLY)?)?;
    let status = find(top, CTA_STATUS).and_then(|s| s.try_into().ok()).map(u32::from_be_bytes).unwrap_or(0);
    let state = find(top, CTA_PROTOINFO)
        .and_then(|p| find(p, CTA_PROTOINFO_TCP))
        .and_then(|tcp| find(tcp, CTA_PROTOINFO_TCP_STATE)?.first().copied())
        .and_then(|s| TCP_STATES.get(usize::from(s)).copied())
        .unwrap_or("");
    Some(Entry { orig, reply, state, assured: status & IPS_ASSURED != 0 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as the kernel lays it out: the request's own tuple, the reply's, the status
    /// and the TCP state.
    fn answer(orig: (SocketAddr, SocketAddr), reply: (SocketAddr, SocketAddr), state: u8, status: u32) -> Vec<u8> {
        let mut body = request(orig, 1, 0)[16..].to_vec();
        let reply_orig = request(reply, 1, 0);
        let inner = find(&reply_orig[20..], CTA_TUPLE_ORIG).unwrap().to_vec();
        nested(&mut body, CTA_TUPLE_REPLY, |t| t.extend_from_slice(&inner));
        attr(&mut body, CTA_STATUS, &status.to_be_bytes());
        nested(&mut body, CTA_PROTOINFO, |p| {
            nested(p, CTA_PROTOINFO_TCP, |t| attr(t, CTA_PROTOINFO_TCP_STATE, &[state]))
        });
        body
    }

    #[test]
    fn a_dnatted_entry_reads_back_with_its_state() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        let orig = (sa("203.0.113.10:40000"), sa("198.51.100.1:80"));
        let reply = (sa("10.244.1.5:8080"), sa("192.168.56.11:9413"));
        let e = entry(&answer(orig, reply, 7, IPS_ASSURED | 0x8)).unwrap();
        assert_eq!(e, Entry { orig, reply, state: "TIME_WAIT", assured: true });
        let e = entry(&answer(orig, (orig.1, orig.0), 1, 0)).unwrap();
        assert_eq!((e.state, e.assured), ("SYN_SENT", false));
    }

    #[test]
    fn an_ipv6_request_names_its_family_and_addresses() {
        let conn = ("[2001:db8::1]:40000".parse().unwrap(), "[fd00:10:96::a]:80".parse().unwrap());
        let req = request(conn, 7, 0);
        assert_eq!(req[16], 10, "AF_INET6");
        assert_eq!(u32::from_ne_bytes(req[..4].try_into().unwrap()) as usize, req.len());
        let e = entry(&answer(conn, (conn.1, conn.0), 3, 0)).unwrap();
        assert_eq!((e.orig, e.state), (conn, "ESTABLISHED"));
    }

    #[test]
    fn a_short_or_foreign_answer_is_none() {
        assert!(entry(&[]).is_none());
        assert!(entry(&[2, 0, 0, 0, 8, 0, 1, 0]).is_none());
    }
}
