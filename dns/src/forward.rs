//! CoreDNS's `forward` plugin: a query the cluster zone does not answer goes to an upstream
//! resolver as a new query of the same name, type and class, over UDP (TCP when the answer is
//! truncated, or always with `force_tcp`); upstreams in the order of the policy, one that
//! failed `max_fails` times in a row skipped while another is up; 2 s per try and 5 s in all,
//! as CoreDNS, then the error (the caller answers SERVFAIL).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::corefile::{Forward, Policy};

/// Per try (CoreDNS's read timeout).
const TRY: Duration = Duration::from_secs(2);
/// For the whole query (CoreDNS's default).
const DEADLINE: Duration = Duration::from_secs(5);

/// One `forward` directive with its upstreams resolved.
pub struct Forwarder {
    pub cfg: Forward,
    pub upstreams: Vec<SocketAddr>,
    fails: Vec<AtomicU32>,
    next: AtomicUsize,
    inflight: AtomicUsize,
}

/// Why a forward gave no answer.
#[derive(Debug, Clone, PartialEq)]
pub enum ForwardError {
    /// `max_concurrent` queries already waiting (CoreDNS answers REFUSED).
    TooMany,
    /// The last try's error (`read udp …: i/o timeout`, as CoreDNS's errors plugin prints it).
    Failed(String),
}

impl Forwarder {
    pub fn new(cfg: Forward, upstreams: Vec<SocketAddr>) -> Forwarder {
        let fails = upstreams.iter().map(|_| AtomicU32::new(0)).collect();
        Forwarder { cfg, upstreams, fails, next: AtomicUsize::new(0), inflight: AtomicUsize::new(0) }
    }

    /// The order to try the upstreams in: the policy's, healthy ones first.
    fn order(&self) -> Vec<usize> {
        let n = self.upstreams.len();
        let start = match self.cfg.policy {
            Policy::Sequential => 0,
            Policy::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n.max(1),
            Policy::Random => random() % n.max(1),
        };
        let mut order: Vec<usize> = (0..n).map(|i| (start + i) % n).collect();
        if self.cfg.max_fails > 0 {
            // Stable: the policy's order among the healthy, then among the down.
            order.sort_by_key(|i| self.fails[*i].load(Ordering::Relaxed) >= self.cfg.max_fails);
        }
        order
    }

    /// Asks the upstreams for `query`; the upstream's reply.
    pub async fn forward(&self, query: &Query, recursion_desired: bool) -> Result<(Message, SocketAddr), ForwardError> {
        if self.cfg.max_concurrent > 0 {
            if self.inflight.fetch_add(1, Ordering::AcqRel) >= self.cfg.max_concurrent {
                self.inflight.fetch_sub(1, Ordering::AcqRel);
                return Err(ForwardError::TooMany);
            }
        } else {
            self.inflight.fetch_add(1, Ordering::AcqRel);
        }
        let r = self.tries(query, recursion_desired).await;
        self.inflight.fetch_sub(1, Ordering::AcqRel);
        r
    }

    async fn tries(&self, query: &Query, rd: bool) -> Result<(Message, SocketAddr), ForwardError> {
        if self.upstreams.is_empty() {
            return Err(ForwardError::Failed("no upstream (the resolv.conf names no nameserver)".into()));
        }
        let started = Instant::now();
        let mut last = String::new();
        // Round the upstreams until the deadline, as CoreDNS does; three rounds at most, so
        // upstreams that refuse at once give SERVFAIL at once rather than a busy loop.
        'outer: for _ in 0..3 {
            for i in self.order() {
                let left = DEADLINE.saturating_sub(started.elapsed());
                if left.is_zero() {
                    break 'outer;
                }
                let to = self.upstreams[i];
                match exchange(to, query, rd, self.cfg.force_tcp, self.cfg.prefer_udp, TRY.min(left)).await {
                    Ok(m) => {
                        self.fails[i].store(0, Ordering::Relaxed);
                        return Ok((m, to));
                    }
                    Err(e) => {
                        self.fails[i].fetch_add(1, Ordering::Relaxed);
                        last = e;
                    }
                }
            }
        }
        Err(ForwardError::Failed(last))
    }
}

/// A cheap random number (no crate for one pick per query).
fn random() -> usize {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    h.finish() as usize
}

/// The query as sent upstream: a new id, the client's question and RD bit, EDNS with room
/// for a large answer.
fn upstream_query(query: &Query, rd: bool) -> (u16, Vec<u8>) {
    let id = (random() & 0xffff) as u16;
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = rd;
    m.add_query(query.clone());
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    m.set_edns(edns);
    (id, m.to_vec().unwrap_or_default())
}

async fn exchange(
    to: SocketAddr,
    query: &Query,
    rd: bool,
    force_tcp: bool,
    prefer_udp: bool,
    timeout: Duration,
) -> Result<Message, String> {
    let (id, bytes) = upstream_query(query, rd);
    if !force_tcp {
        let m = tokio::time::timeout(timeout, udp(to, id, &bytes))
            .await
            .map_err(|_| format!("read udp {to}: i/o timeout"))??;
        if !m.metadata.truncation || prefer_udp {
            return Ok(m);
        }
    }
    tokio::time::timeout(timeout, tcp(to, id, &bytes)).await.map_err(|_| format!("read tcp {to}: i/o timeout"))?
}

async fn udp(to: SocketAddr, id: u16, bytes: &[u8]) -> Result<Message, String> {
    let local: SocketAddr = if to.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let s = tokio::net::UdpSocket::bind(local).await.map_err(|e| format!("dial udp {to}: {e}"))?;
    s.connect(to).await.map_err(|e| format!("dial udp {to}: {e}"))?;
    s.send(bytes).await.map_err(|e| format!("write udp {to}: {e}"))?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = s.recv(&mut buf).await.map_err(|e| format!("read udp {to}: {e}"))?;
        // Anything but the answer to this id is ignored (a late answer to an earlier try).
        if let Ok(m) = Message::from_vec(&buf[..n]) {
            if m.metadata.id == id && m.metadata.message_type == MessageType::Response {
                return Ok(m);
            }
        }
    }
}

async fn tcp(to: SocketAddr, id: u16, bytes: &[u8]) -> Result<Message, String> {
    let mut s = tokio::net::TcpStream::connect(to).await.map_err(|e| format!("dial tcp {to}: {e}"))?;
    let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(bytes);
    s.write_all(&framed).await.map_err(|e| format!("write tcp {to}: {e}"))?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.map_err(|e| format!("read tcp {to}: {e}"))?;
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.map_err(|e| format!("read tcp {to}: {e}"))?;
    let m = Message::from_vec(&buf).map_err(|e| format!("read tcp {to}: {e}"))?;
    if m.metadata.id != id {
        return Err(format!("read tcp {to}: answer to another query (id {})", m.metadata.id));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::corefile::{Forward, Policy};
    use hickory_proto::rr::Name;

    fn fwd(policy: Policy, n: usize) -> Forwarder {
        let cfg = Forward {
            from: Name::root(),
            to: vec![],
            except: vec![],
            force_tcp: false,
            prefer_udp: false,
            policy,
            max_fails: 2,
            max_concurrent: 1,
        };
        Forwarder::new(cfg, (0..n).map(|i| SocketAddr::from(([10, 0, 0, i as u8], 53))).collect())
    }

    #[test]
    fn policies_order_the_upstreams_and_skip_the_down_ones() {
        let f = fwd(Policy::Sequential, 3);
        assert_eq!(f.order(), vec![0, 1, 2]);
        f.fails[0].store(2, Ordering::Relaxed);
        assert_eq!(f.order(), vec![1, 2, 0]);
        let rr = fwd(Policy::RoundRobin, 3);
        assert_eq!((rr.order()[0], rr.order()[0], rr.order()[0], rr.order()[0]), (0, 1, 2, 0));
        let r = fwd(Policy::Random, 3);
        let mut o = r.order();
        o.sort();
        assert_eq!(o, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn max_concurrent_refuses_the_query_over_the_limit() {
        let f = fwd(Policy::Sequential, 1);
        f.inflight.store(1, Ordering::Relaxed);
        let q = Query::query(Name::from_ascii("example.com.").unwrap(), hickory_proto::rr::RecordType::A);
        assert_eq!(f.forward(&q, true).await.unwrap_err(), ForwardError::TooMany);
        assert_eq!(f.inflight.load(Ordering::Relaxed), 1);
    }
}
