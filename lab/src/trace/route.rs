//! A hop's route lookup: the question `ip route get` asks (where would this host send the
//! flow's packet), asked over rtnetlink by the trace itself in a namespace lab — no `ip`
//! program start per hop — and answered in `ip route get`'s words, which the trace's text and
//! a Vagrant lab's answers (`ip route get` over SSH) share.

use std::net::IpAddr;

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteType};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

/// One flow's route question on one host: its destination, and for a packet that arrived from
/// elsewhere its source and the interface it came in on (an input lookup, as forwarding does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteQuery {
    pub dst: IpAddr,
    pub from: Option<(IpAddr, String)>,
    pub sport: u16,
    pub dport: u16,
}

impl RouteQuery {
    /// The same question as `ip route get`'s arguments (TCP).
    pub fn argv(&self) -> Vec<String> {
        let mut args = vec![self.dst.to_string()];
        if let Some((src, iif)) = &self.from {
            args.extend(["from".into(), src.to_string(), "iif".into(), iif.clone()]);
        }
        args.extend(["ipproto", "tcp", "sport"].map(String::from));
        args.push(self.sport.to_string());
        args.push("dport".into());
        args.push(self.dport.to_string());
        args
    }

    /// Asked of the kernel of the calling thread's network namespace; None when it has no
    /// route (or the interface named is not there).
    pub fn ask(&self) -> Option<String> {
        let mut rt = Rtnl::open().ok()?;
        let iif = match &self.from {
            Some((_, name)) => Some(rt.index_of(name)?),
            None => None,
        };
        let mut q = RouteMessage::default();
        q.header.address_family = if self.dst.is_ipv6() { AddressFamily::Inet6 } else { AddressFamily::Inet };
        q.header.destination_prefix_length = if self.dst.is_ipv6() { 128 } else { 32 };
        q.attributes.push(RouteAttribute::Destination(self.dst.into()));
        if let (Some((src, _)), Some(index)) = (&self.from, iif) {
            q.header.source_prefix_length = if src.is_ipv6() { 128 } else { 32 };
            q.attributes.push(RouteAttribute::Source((*src).into()));
            q.attributes.push(RouteAttribute::Iif(index));
        }
        q.attributes.push(RouteAttribute::IpProto(6));
        q.attributes.push(RouteAttribute::Sport(self.sport));
        q.attributes.push(RouteAttribute::Dport(self.dport));
        let RouteNetlinkMessage::NewRoute(answer) = rt.ask(RouteNetlinkMessage::GetRoute(q))? else { return None };
        let oif = answer.attributes.iter().find_map(|a| match a {
            RouteAttribute::Oif(i) => Some(*i),
            _ => None,
        });
        let dev = match oif {
            Some(i) => Some(rt.name_of(i)?),
            None => None,
        };
        Some(words(&answer, dev.as_deref()))
    }
}

/// An answer in `ip route get`'s words: `[TYPE] DST [from SRC] [via GATEWAY] [dev DEV] [src
/// PREFSRC]` (the type only when it is not unicast, as `ip` prints it).
pub fn words(answer: &RouteMessage, dev: Option<&str>) -> String {
    let addr = |want: fn(&RouteAttribute) -> Option<&RouteAddress>| {
        answer.attributes.iter().find_map(want).and_then(|a| match a {
            RouteAddress::Inet(v4) => Some(IpAddr::from(*v4)),
            RouteAddress::Inet6(v6) => Some(IpAddr::from(*v6)),
            _ => None,
        })
    };
    let mut out = vec![];
    match answer.header.kind {
        RouteType::Unicast | RouteType::Unspec => {}
        RouteType::Local => out.push("local".to_string()),
        RouteType::Broadcast => out.push("broadcast".to_string()),
        RouteType::Unreachable => out.push("unreachable".to_string()),
        RouteType::BlackHole => out.push("blackhole".to_string()),
        RouteType::Prohibit => out.push("prohibit".to_string()),
        other => out.push(format!("{other:?}").to_lowercase()),
    }
    if let Some(dst) = addr(|a| if let RouteAttribute::Destination(d) = a { Some(d) } else { None }) {
        out.push(dst.to_string());
    }
    if let Some(src) = addr(|a| if let RouteAttribute::Source(s) = a { Some(s) } else { None }) {
        out.push(format!("from {src}"));
    }
    if let Some(gw) = addr(|a| if let RouteAttribute::Gateway(g) = a { Some(g) } else { None }) {
        out.push(format!("via {gw}"));
    }
    if let Some(dev) = dev {
        out.push(format!("dev {dev}"));
    }
    if let Some(src) = addr(|a| if let RouteAttribute::PrefSource(s) = a { Some(s) } else { None }) {
        out.push(format!("src {src}"));
    }
    out.join(" ") + "\n"
}

/// A route netlink socket: one request, its one answer.
pub(crate) struct Rtnl {
    sock: netlink_sys::Socket,
    seq: u32,
}

impl Rtnl {
    pub(crate) fn open() -> std::io::Result<Rtnl> {
        let mut sock = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_ROUTE)?;
        sock.bind_auto()?;
        sock.connect(&netlink_sys::SocketAddr::new(0, 0))?;
        Ok(Rtnl { sock, seq: 0 })
    }

    /// Sends `msg` and returns the answer to it (None: the kernel's error, or none).
    fn ask(&mut self, msg: RouteNetlinkMessage) -> Option<RouteNetlinkMessage> {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST;
        header.sequence_number = self.seq;
        let mut req = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        req.finalize();
        let mut buf = vec![0u8; req.buffer_len()];
        req.serialize(&mut buf);
        self.sock.send(&buf, 0).ok()?;
        let mut rx = vec![0u8; 16384];
        // Bounded: an answer is one message; anything else (not ours) is skipped a few times.
        for _ in 0..8 {
            let n = self.sock.recv(&mut &mut rx[..], 0).ok()?;
            let mut at = 0;
            while at < n {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[at..n]).ok()?;
                let len = msg.header.length as usize;
                if msg.header.sequence_number == self.seq {
                    return match msg.payload {
                        NetlinkPayload::InnerMessage(m) => Some(m),
                        _ => None,
                    };
                }
                if len == 0 {
                    break;
                }
                at += len.next_multiple_of(4);
            }
        }
        None
    }

    /// The index of the interface named `name`.
    fn index_of(&mut self, name: &str) -> Option<u32> {
        let mut q = LinkMessage::default();
        q.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.ask(RouteNetlinkMessage::GetLink(q))? {
            RouteNetlinkMessage::NewLink(l) => Some(l.header.index),
            _ => None,
        }
    }

    /// The name of the interface with index `index`.
    pub(crate) fn name_of(&mut self, index: u32) -> Option<String> {
        let mut q = LinkMessage::default();
        q.header.index = index;
        match self.ask(RouteNetlinkMessage::GetLink(q))? {
            RouteNetlinkMessage::NewLink(l) => l.attributes.into_iter().find_map(|a| match a {
                LinkAttribute::IfName(n) => Some(n),
                _ => None,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_reads_as_ip_route_get_prints_it() {
        let mut m = RouteMessage::default();
        m.header.kind = RouteType::Unicast;
        m.attributes = vec![
            RouteAttribute::Destination("10.244.1.5".parse::<IpAddr>().unwrap().into()),
            RouteAttribute::Source("203.0.113.10".parse::<IpAddr>().unwrap().into()),
            RouteAttribute::Gateway("192.168.56.11".parse::<IpAddr>().unwrap().into()),
            RouteAttribute::Oif(2),
        ];
        assert_eq!(words(&m, Some("eth0")), "10.244.1.5 from 203.0.113.10 via 192.168.56.11 dev eth0\n");
        m.header.kind = RouteType::Local;
        m.attributes = vec![
            RouteAttribute::Destination("127.0.0.1".parse::<IpAddr>().unwrap().into()),
            RouteAttribute::PrefSource("127.0.0.1".parse::<IpAddr>().unwrap().into()),
        ];
        assert_eq!(words(&m, Some("lo")), "local 127.0.0.1 dev lo src 127.0.0.1\n");
    }

    #[test]
    fn the_question_as_ip_route_get_arguments() {
        let q = RouteQuery {
            dst: "10.244.1.5".parse().unwrap(),
            from: Some(("203.0.113.10".parse().unwrap(), "eth0".into())),
            sport: 40000,
            dport: 8080,
        };
        assert_eq!(q.argv().join(" "), "10.244.1.5 from 203.0.113.10 iif eth0 ipproto tcp sport 40000 dport 8080");
    }
}
