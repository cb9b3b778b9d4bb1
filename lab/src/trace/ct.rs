//! A hop's conntrack entry for one TCP connection, asked over ctnetlink by the trace itself in
//! a namespace lab (no `conntrack -G` program start per connection): the exact tuple looked up
//! in the kernel's table (one hash lookup, whatever the table's size), read into the same
//! [`CtEntry`] the tool's text is parsed into (a Vagrant lab's answers).
//!
//! The message is built and read here (`request`, `entry`: pure); `get` is the only I/O.

use std::net::{IpAddr, SocketAddr};

use super::parse::CtEntry;

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLA_F_NESTED: u16 = 0x8000;
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

fn attr(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    let len = 4 + value.len();
    out.extend_from_slice(&(len as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    out.resize(out.len().next_multiple_of(4), 0);
}

fn nested(out: &mut Vec<u8>, kind: u16, body: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = vec![];
    body(&mut inner);
    attr(out, kind | NLA_F_NESTED, &inner);
}

fn octets(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The `IPCTNL_MSG_CT_GET` for the TCP connection `from → to`, numbered `seq`.
pub fn request((from, to): (SocketAddr, SocketAddr), seq: u32) -> Vec<u8> {
    let v6 = from.is_ipv6();
    let mut body = vec![if v6 { 10 } else { 2 }, 0, 0, 0]; // nfgenmsg: family, version, res_id
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
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&((NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_GET).to_ne_bytes());
    msg.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// The attributes of a message body: (kind without flags, value).
fn attrs(mut b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = vec![];
    while b.len() >= 4 {
        let len = u16::from_ne_bytes([b[0], b[1]]) as usize;
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff;
        if len < 4 || len > b.len() {
            break;
        }
        out.push((kind, &b[4..len]));
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    out
}

fn find<'a>(list: &[(u16, &'a [u8])], kind: u16) -> Option<&'a [u8]> {
    list.iter().find(|(k, _)| *k == kind).map(|(_, v)| *v)
}

/// A tuple attribute's addresses and ports.
fn tuple(value: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let parts = attrs(value);
    let ip = attrs(find(&parts, CTA_TUPLE_IP)?);
    let addr = |v4: u16, v6: u16| -> Option<IpAddr> {
        if let Some(b) = find(&ip, v4) {
            return Some(IpAddr::from(<[u8; 4]>::try_from(b).ok()?));
        }
        Some(IpAddr::from(<[u8; 16]>::try_from(find(&ip, v6)?).ok()?))
    };
    let (src, dst) = (addr(CTA_IP_V4_SRC, CTA_IP_V6_SRC)?, addr(CTA_IP_V4_DST, CTA_IP_V6_DST)?);
    let proto = attrs(find(&parts, CTA_TUPLE_PROTO)?);
    let port = |k: u16| -> Option<u16> { Some(u16::from_be_bytes(find(&proto, k)?.try_into().ok()?)) };
    Some((SocketAddr::new(src, port(CTA_PROTO_SRC_PORT)?), SocketAddr::new(dst, port(CTA_PROTO_DST_PORT)?)))
}

/// The entry in an `IPCTNL_MSG_CT_NEW` answer's body (after its netlink header).
pub fn entry(body: &[u8]) -> Option<CtEntry> {
    let top = attrs(body.get(4..)?);
    let orig = tuple(find(&top, CTA_TUPLE_ORIG)?)?;
    let reply = tuple(find(&top, CTA_TUPLE_REPLY)?)?;
    let status = find(&top, CTA_STATUS).and_then(|s| s.try_into().ok()).map(u32::from_be_bytes).unwrap_or(0);
    let state = find(&top, CTA_PROTOINFO)
        .and_then(|p| find(&attrs(p), CTA_PROTOINFO_TCP).map(attrs))
        .and_then(|tcp| find(&tcp, CTA_PROTOINFO_TCP_STATE).and_then(|s| s.first().copied()))
        .and_then(|s| TCP_STATES.get(usize::from(s)))
        .map_or_else(String::new, |s| s.to_string());
    Some(CtEntry { proto: "tcp".into(), state, assured: status & IPS_ASSURED != 0, orig, reply })
}

/// The same question as a `conntrack -G` command line (a Vagrant lab's machines are asked so).
pub fn tool_argv((from, to): (SocketAddr, SocketAddr)) -> Vec<String> {
    let mut argv: Vec<String> = ["conntrack", "-G", "-p", "tcp"].map(String::from).to_vec();
    for (flag, value) in [
        ("--orig-src", from.ip().to_string()),
        ("--orig-dst", to.ip().to_string()),
        ("--orig-port-src", from.port().to_string()),
        ("--orig-port-dst", to.port().to_string()),
    ] {
        argv.push(flag.into());
        argv.push(value);
    }
    argv
}

/// The conntrack entry of the TCP connection `from → to` (as its first packet went) in the
/// calling thread's network namespace; None when there is none.
pub fn get(conn: (SocketAddr, SocketAddr)) -> Option<CtEntry> {
    let mut sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER).ok()?;
    sock.bind_auto().ok()?;
    sock.connect(&netlink_sys::SocketAddr::new(0, 0)).ok()?;
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    sock.send(&request(conn, seq), 0).ok()?;
    let mut rx = vec![0u8; 8192];
    // The answer is one message: the entry, or an error (ENOENT: no such connection).
    let n = sock.recv(&mut &mut rx[..], 0).ok()?;
    let buf = &rx[..n];
    let len = u32::from_ne_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let kind = u16::from_ne_bytes(buf.get(4..6)?.try_into().ok()?);
    let got = u32::from_ne_bytes(buf.get(8..12)?.try_into().ok()?);
    if got != seq || kind == NLMSG_ERROR || kind != (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW {
        return None;
    }
    entry(buf.get(16..len.min(buf.len()))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer as the kernel lays it out, built with the request's own encoder.
    fn answer(orig: (SocketAddr, SocketAddr), reply: (SocketAddr, SocketAddr), state: u8, status: u32) -> Vec<u8> {
        let req = request(orig, 1);
        let mut body = req[16..].to_vec();
        let reply_tuple = request(reply, 1)[20..].to_vec();
        // The reply tuple: the same nesting under CTA_TUPLE_REPLY.
        let inner = attrs(&reply_tuple)[0].1.to_vec();
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
        assert_eq!((e.orig, e.reply, e.state.as_str(), e.assured), (orig, reply, "TIME_WAIT", true));
        assert!(e.is_natted());
        let e = entry(&answer(orig, (orig.1, orig.0), 1, 0)).unwrap();
        assert_eq!((e.state.as_str(), e.assured, e.is_natted()), ("SYN_SENT", false, false));
    }

    #[test]
    fn an_ipv6_request_names_its_family_and_addresses() {
        let conn = ("[2001:db8::1]:40000".parse().unwrap(), "[fd00:10:96::a]:80".parse().unwrap());
        let req = request(conn, 7);
        assert_eq!(req[16], 10, "AF_INET6");
        assert_eq!(u32::from_ne_bytes(req[..4].try_into().unwrap()) as usize, req.len());
        let e = entry(&answer(conn, (conn.1, conn.0), 3, 0)).unwrap();
        assert_eq!((e.orig, e.state.as_str()), (conn, "ESTABLISHED"));
    }

    #[test]
    fn a_short_or_foreign_answer_is_none() {
        assert!(entry(&[]).is_none());
        assert!(entry(&[2, 0, 0, 0, 8, 0, 1, 0]).is_none());
    }
}
