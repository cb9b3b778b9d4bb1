//! The kernel's trace events over netlink: what `xtables-monitor --trace` and `nft monitor
//! trace` read (`NFT_MSG_TRACE` messages to the `NFNLGRP_NFTRACE` group of a namespace), read
//! by the tracing process itself — no monitor program per host, which had to start, load the
//! ruleset's extensions and translate every rule it was told of while the trace waited.
//!
//! [`event`] is pure: one message into a [`TraceEvent`] (table, chain, rule handle, verdict,
//! and on a base chain's first event the packet's headers, devices and mark). [`Listener`]
//! is the I/O: a socket joined to the group that drains what is queued without blocking. A
//! rule hit carries its handle only; [`crate::Socket::rule_handles`] gives a chain's handles
//! in order, so a hit can be placed among the rules `iptables-save` prints.

use std::os::fd::{AsFd, BorrowedFd};

use super::{attr, attrs, io, message, messages, strz, NfnlError, Result, Socket, NFNL_SUBSYS_NFTABLES};

const NFT_MSG_NEWRULE: u16 = 6;
const NFT_MSG_GETRULE: u16 = 7;
const NFT_MSG_TRACE: u16 = 17;
const NFNLGRP_NFTRACE: u32 = 9;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NFTA_RULE_TABLE: u16 = 1;
const NFTA_RULE_CHAIN: u16 = 2;
const NFTA_RULE_HANDLE: u16 = 3;
const NFTA_TRACE_TABLE: u16 = 1;
const NFTA_TRACE_CHAIN: u16 = 2;
const NFTA_TRACE_RULE_HANDLE: u16 = 3;
const NFTA_TRACE_TYPE: u16 = 4;
const NFTA_TRACE_VERDICT: u16 = 5;
const NFTA_TRACE_ID: u16 = 6;
const NFTA_TRACE_NETWORK_HEADER: u16 = 8;
const NFTA_TRACE_TRANSPORT_HEADER: u16 = 9;
const NFTA_TRACE_IIF: u16 = 10;
const NFTA_TRACE_IIFTYPE: u16 = 11;
const NFTA_TRACE_OIF: u16 = 12;
const NFTA_TRACE_OIFTYPE: u16 = 13;
const NFTA_TRACE_MARK: u16 = 14;
const NFTA_TRACE_POLICY: u16 = 16;
const NFTA_VERDICT_CODE: u16 = 1;
const NFTA_VERDICT_CHAIN: u16 = 2;

/// What an event reports (`enum nft_trace_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// A rule matched (its verdict may be `continue`).
    Rule,
    /// The end of a chain entered by `jump`: back to the caller.
    Return,
    /// The end of a base chain: its policy decided.
    Policy,
    /// Another type (a newer kernel's), or none given.
    #[default]
    Unknown,
}

/// One trace event of one packet in one chain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TraceEvent {
    /// The kernel's id of the packet (the same through the hooks of one namespace).
    pub id: u32,
    /// The nfgenmsg family (`NFPROTO_IPV4` 2, `NFPROTO_IPV6` 10).
    pub family: u8,
    pub table: String,
    pub chain: String,
    pub kind: Kind,
    /// The rule's handle, for [`Kind::Rule`].
    pub handle: Option<u64>,
    /// The verdict code (`NF_ACCEPT` 1, `NF_DROP` 0, `NFT_CONTINUE` -1, `NFT_JUMP` -3…) and
    /// the chain of a jump or goto.
    pub verdict: Option<(i32, Option<String>)>,
    /// A base chain's policy, for [`Kind::Policy`].
    pub policy: Option<u32>,
    /// Devices (ifindex and `ARPHRD_*` type) and mark: on a base chain's first event only.
    pub iif: Option<(u32, u16)>,
    pub oif: Option<(u32, u16)>,
    pub mark: Option<u32>,
    /// The first bytes of the network and transport headers: on a base chain's first event
    /// only (one event per chain traversal carries the packet).
    pub network: Option<Vec<u8>>,
    pub transport: Option<Vec<u8>>,
}

fn be_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

fn be_u16(b: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(..2)?.try_into().ok()?))
}

fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

fn string(b: &[u8]) -> String {
    String::from_utf8_lossy(b.split(|c| *c == 0).next().unwrap_or_default()).into_owned()
}

/// A trace message's body (after the netlink header: nfgenmsg, then attributes) as an event;
/// None when it names no table or chain.
pub fn event(body: &[u8]) -> Option<TraceEvent> {
    let family = *body.first()?;
    let mut e = TraceEvent { family, ..Default::default() };
    let (mut iif, mut iif_type, mut oif, mut oif_type) = (None, 0, None, 0);
    for (kind, v) in attrs(body.get(4..)?) {
        match kind {
            NFTA_TRACE_TABLE => e.table = string(v),
            NFTA_TRACE_CHAIN => e.chain = string(v),
            NFTA_TRACE_RULE_HANDLE => e.handle = be_u64(v),
            NFTA_TRACE_TYPE => {
                e.kind = match be_u32(v)? {
                    1 => Kind::Policy,
                    2 => Kind::Return,
                    3 => Kind::Rule,
                    _ => Kind::Unknown,
                }
            }
            NFTA_TRACE_VERDICT => {
                let (mut code, mut chain) = (None, None);
                for (k, inner) in attrs(v) {
                    match k {
                        NFTA_VERDICT_CODE => code = be_u32(inner).map(|c| c as i32),
                        NFTA_VERDICT_CHAIN => chain = Some(string(inner)),
                        _ => {}
                    }
                }
                e.verdict = code.map(|c| (c, chain));
            }
            NFTA_TRACE_ID => e.id = be_u32(v)?,
            NFTA_TRACE_NETWORK_HEADER => e.network = Some(v.to_vec()),
            NFTA_TRACE_TRANSPORT_HEADER => e.transport = Some(v.to_vec()),
            NFTA_TRACE_IIF => iif = be_u32(v),
            NFTA_TRACE_IIFTYPE => iif_type = be_u16(v).unwrap_or(0),
            NFTA_TRACE_OIF => oif = be_u32(v),
            NFTA_TRACE_OIFTYPE => oif_type = be_u16(v).unwrap_or(0),
            NFTA_TRACE_MARK => e.mark = be_u32(v),
            NFTA_TRACE_POLICY => e.policy = be_u32(v),
            _ => {}
        }
    }
    e.iif = iif.map(|i| (i, iif_type));
    e.oif = oif.map(|i| (i, oif_type));
    (!e.table.is_empty() && !e.chain.is_empty()).then_some(e)
}

/// A netlink socket of the current network namespace joined to its trace group: it gets every
/// trace event of that namespace from the moment it is made (no subscription to wait for).
#[derive(Debug)]
pub struct Listener {
    sock: netlink_sys::Socket,
    buf: Vec<u8>,
}

impl Listener {
    /// Opens it in the current namespace; the receive buffer is made large (a trace's events
    /// are a few hundred messages; only traced packets make any).
    pub fn open() -> Result<Listener> {
        use nix::sys::socket::{setsockopt, sockopt};
        let mut sock =
            netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER).map_err(|e| io("trace socket", e))?;
        sock.bind_auto().map_err(|e| io("bind the trace socket", e))?;
        sock.add_membership(NFNLGRP_NFTRACE).map_err(|e| io("join the trace group", e))?;
        setsockopt(&sock, sockopt::RcvBufForce, &(4 << 20)).map_err(|e| io("trace socket buffer", e.into()))?;
        sock.set_non_blocking(true).map_err(|e| io("trace socket", e))?;
        Ok(Listener { sock, buf: vec![0u8; 64 * 1024] })
    }

    /// Appends every event queued now to `out`, without waiting; the number appended. Events
    /// the kernel dropped because the buffer was full are an error (the trace would be partial).
    pub fn read(&mut self, out: &mut Vec<TraceEvent>) -> Result<usize> {
        let before = out.len();
        loop {
            match self.sock.recv(&mut &mut self.buf[..], 0) {
                Ok(n) => {
                    let trace = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_TRACE;
                    out.extend(
                        messages(&self.buf[..n]).filter(|(k, _, _)| *k == trace).filter_map(|(_, _, b)| event(b)),
                    );
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(out.len() - before),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io("read trace events (some were lost if the buffer overflowed)", e)),
            }
        }
    }
}

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl Socket {
    /// The handles of the rules of `chain` in `table`, in the chain's order (the order
    /// `iptables-save` and `nft list` print them); an empty list when the chain has none or
    /// does not exist.
    pub fn rule_handles(&mut self, family: u8, table: &str, chain: &str) -> Result<Vec<u64>> {
        let seq = self.next_seq();
        let mut body = vec![];
        attr(&mut body, NFTA_RULE_TABLE, &strz(table));
        attr(&mut body, NFTA_RULE_CHAIN, &strz(chain));
        let mut msg = vec![];
        message(
            &mut msg,
            (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETRULE,
            NLM_F_REQUEST | NLM_F_DUMP,
            seq,
            family,
            0,
            &body,
        );
        self.sock.send(&msg, 0).map_err(|e| io("send", e))?;
        let what = || format!("rules of {table} {chain}");
        let mut handles = vec![];
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = self.sock.recv(&mut &mut buf[..], 0).map_err(|e| io(&what(), e))?;
            for (kind, msg_seq, body) in messages(&buf[..n]) {
                if msg_seq != seq {
                    continue;
                }
                match kind {
                    NLMSG_DONE => return Ok(handles),
                    NLMSG_ERROR if body.len() >= 4 => {
                        let code = i32::from_ne_bytes(body[..4].try_into().expect("4 bytes"));
                        return match -code {
                            0 => Ok(handles),
                            nix::libc::ENOENT => Ok(vec![]),
                            errno => Err(NfnlError { what: what(), source: std::io::Error::from_raw_os_error(errno) }),
                        };
                    }
                    k if k == (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE => {
                        let mut attributes = attrs(body.get(4..).unwrap_or_default());
                        // The kernel filters the dump by table and chain; checked anyway.
                        let (mut c, mut h) = (None, None);
                        for (k, v) in attributes.by_ref() {
                            match k {
                                NFTA_RULE_CHAIN => c = Some(string(v)),
                                NFTA_RULE_HANDLE => h = be_u64(v),
                                _ => {}
                            }
                        }
                        if let (Some(c), Some(h)) = (c, h) {
                            if c == chain {
                                handles.push(h);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nested;

    /// The body of a trace message as the kernel writes one: u32 and u64 in network order.
    fn body(family: u8, attrs_of: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut b = vec![family, 0, 0, 0];
        attrs_of(&mut b);
        b
    }

    #[test]
    fn a_rule_event_with_its_packet_reads_whole() {
        let b = body(2, |b| {
            attr(b, NFTA_TRACE_TABLE, &strz("nat"));
            attr(b, NFTA_TRACE_CHAIN, &strz("KUBE-SERVICES"));
            attr(b, NFTA_TRACE_RULE_HANDLE, &0x55u64.to_be_bytes());
            attr(b, NFTA_TRACE_TYPE, &3u32.to_be_bytes());
            nested(b, NFTA_TRACE_VERDICT, |v| {
                attr(v, NFTA_VERDICT_CODE, &(-3i32 as u32).to_be_bytes());
                attr(v, NFTA_VERDICT_CHAIN, &strz("KUBE-EXT-X"));
            });
            attr(b, NFTA_TRACE_ID, &0x6190c49cu32.to_be_bytes());
            attr(b, NFTA_TRACE_NETWORK_HEADER, &[0x45, 0xb4, 0, 60]);
            attr(b, NFTA_TRACE_TRANSPORT_HEADER, &[0xb1, 0xfd, 0, 80]);
            attr(b, NFTA_TRACE_IIF, &2u32.to_be_bytes());
            attr(b, NFTA_TRACE_IIFTYPE, &1u16.to_be_bytes());
            attr(b, NFTA_TRACE_MARK, &0x4000u32.to_be_bytes());
        });
        let e = event(&b).unwrap();
        assert_eq!((e.id, e.family, e.table.as_str(), e.chain.as_str()), (0x6190c49c, 2, "nat", "KUBE-SERVICES"));
        assert_eq!((e.kind, e.handle), (Kind::Rule, Some(0x55)));
        assert_eq!(e.verdict, Some((-3, Some("KUBE-EXT-X".into()))));
        assert_eq!((e.iif, e.oif, e.mark), (Some((2, 1)), None, Some(0x4000)));
        assert_eq!(e.network.as_deref(), Some(&[0x45, 0xb4, 0, 60][..]));
        assert_eq!(e.transport.as_deref(), Some(&[0xb1, 0xfd, 0, 80][..]));
    }

    #[test]
    fn a_policy_event_carries_the_policy_and_no_packet() {
        let b = body(10, |b| {
            attr(b, NFTA_TRACE_TABLE, &strz("filter"));
            attr(b, NFTA_TRACE_CHAIN, &strz("INPUT"));
            attr(b, NFTA_TRACE_TYPE, &1u32.to_be_bytes());
            attr(b, NFTA_TRACE_POLICY, &1u32.to_be_bytes());
            attr(b, NFTA_TRACE_ID, &7u32.to_be_bytes());
        });
        let e = event(&b).unwrap();
        assert_eq!((e.kind, e.policy, e.handle, e.network), (Kind::Policy, Some(1), None, None));
        assert_eq!(e.family, 10);
    }

    #[test]
    fn a_message_without_table_or_chain_or_cut_short_is_no_event() {
        assert_eq!(event(&body(2, |b| attr(b, NFTA_TRACE_CHAIN, &strz("INPUT")))), None);
        assert_eq!(event(&[2, 0]), None);
        let mut cut = body(2, |b| {
            attr(b, NFTA_TRACE_TABLE, &strz("filter"));
            attr(b, NFTA_TRACE_CHAIN, &strz("INPUT"));
        });
        let whole = event(&cut).unwrap();
        cut.extend([40, 0, 8, 0, 1]);
        assert_eq!(event(&cut), Some(whole), "a cut attribute at the end is left out");
    }
}
