//! CoreDNS's `cache` plugin: answers kept by name, type and class for their TTL, capped by the
//! plugin's maximum and raised to its minimum; successes and denials (NXDOMAIN and NODATA) in
//! two bounded stores; a hit has its TTLs counted down. Errors (SERVFAIL, REFUSED) are not
//! kept. Pure but for the lock: time is passed in.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use crate::corefile::{self, CacheKind};

/// A response as the plugin chain builds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub code: ResponseCode,
    pub answers: Vec<Record>,
    pub authority: Vec<Record>,
    pub additional: Vec<Record>,
    pub authoritative: bool,
    pub recursion_available: bool,
}

impl Reply {
    pub fn error(code: ResponseCode) -> Reply {
        Reply {
            code,
            answers: vec![],
            authority: vec![],
            additional: vec![],
            authoritative: false,
            recursion_available: false,
        }
    }

    /// CoreDNS's classes (`log`'s `class`, the cache's stores).
    pub fn class(&self) -> &'static str {
        match self.code {
            ResponseCode::NoError if !self.answers.is_empty() => "success",
            ResponseCode::NoError | ResponseCode::NXDomain => "denial",
            _ => "error",
        }
    }
}

type Key = (Name, RecordType, DNSClass);

struct Entry {
    reply: Reply,
    stored: Instant,
    ttl: u32,
}

pub struct Cache {
    cfg: corefile::Cache,
    success: Mutex<HashMap<Key, Entry>>,
    denial: Mutex<HashMap<Key, Entry>>,
}

fn disabled(kind: &CacheKind, name: &Name) -> bool {
    kind.disabled.as_ref().is_some_and(|zs| zs.is_empty() || corefile::under(name, zs))
}

/// The TTL a reply is kept for: its smallest (for a denial, the SOA's minimum), within the
/// kind's bounds.
fn ttl_of(reply: &Reply, kind: &CacheKind) -> u32 {
    let t = if reply.class() == "success" {
        reply.answers.iter().map(|r| r.ttl).min().unwrap_or(0)
    } else {
        reply
            .authority
            .iter()
            .find_map(|r| match &r.data {
                RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            })
            .unwrap_or(kind.min_ttl)
    };
    t.clamp(kind.min_ttl.min(kind.max_ttl), kind.max_ttl)
}

impl Cache {
    pub fn new(cfg: corefile::Cache) -> Cache {
        Cache { cfg, success: Mutex::default(), denial: Mutex::default() }
    }

    fn covers(&self, name: &Name) -> bool {
        corefile::under(name, &self.cfg.zones)
    }

    /// A kept reply, its TTLs counted down (or kept with `keepttl`).
    pub fn get(&self, name: &Name, qtype: RecordType, class: DNSClass, now: Instant) -> Option<Reply> {
        if !self.covers(name) {
            return None;
        }
        let key = (name.to_lowercase(), qtype, class);
        for store in [&self.success, &self.denial] {
            let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
            let Some(e) = s.get(&key) else { continue };
            let age = now.saturating_duration_since(e.stored);
            if age >= Duration::from_secs(e.ttl as u64) {
                s.remove(&key);
                continue;
            }
            let mut r = e.reply.clone();
            if !self.cfg.keepttl {
                let left = e.ttl - age.as_secs() as u32;
                for rec in r.answers.iter_mut().chain(r.authority.iter_mut()).chain(r.additional.iter_mut()) {
                    rec.ttl = rec.ttl.min(left);
                }
            }
            return Some(r);
        }
        None
    }

    /// Keeps `reply` when its class is kept for `name`; the reply as sent, its TTLs no longer
    /// than the time it is kept (as CoreDNS's cache writes them).
    pub fn put(&self, name: &Name, qtype: RecordType, class: DNSClass, mut reply: Reply, now: Instant) -> Reply {
        if !self.covers(name) {
            return reply;
        }
        let (kind, store) = match reply.class() {
            "success" => (&self.cfg.success, &self.success),
            "denial" => (&self.cfg.denial, &self.denial),
            _ => return reply,
        };
        if disabled(kind, name) || kind.capacity == 0 {
            return reply;
        }
        let ttl = ttl_of(&reply, kind);
        if ttl == 0 {
            return reply;
        }
        if !self.cfg.keepttl {
            for rec in reply.answers.iter_mut().chain(reply.authority.iter_mut()).chain(reply.additional.iter_mut()) {
                rec.ttl = rec.ttl.min(ttl);
            }
        }
        let mut s = store.lock().unwrap_or_else(|e| e.into_inner());
        if s.len() >= kind.capacity {
            // Full: the expired go first, else any one (CoreDNS evicts at random too).
            s.retain(|_, e| now.saturating_duration_since(e.stored) < Duration::from_secs(e.ttl as u64));
            if s.len() >= kind.capacity {
                if let Some(k) = s.keys().next().cloned() {
                    s.remove(&k);
                }
            }
        }
        s.insert((name.to_lowercase(), qtype, class), Entry { reply: reply.clone(), stored: now, ttl });
        reply
    }

    /// (successes, denials) kept.
    pub fn len(&self) -> (usize, usize) {
        let n = |m: &Mutex<HashMap<Key, Entry>>| m.lock().unwrap_or_else(|e| e.into_inner()).len();
        (n(&self.success), n(&self.denial))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, SOA};

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn cfg(max: u32, capacity: usize, disable_success: Option<Vec<Name>>) -> corefile::Cache {
        let kind = |d| CacheKind { capacity, max_ttl: max, min_ttl: 5, disabled: d };
        corefile::Cache {
            zones: vec![Name::root()],
            success: kind(disable_success),
            denial: kind(None),
            keepttl: false,
        }
    }

    fn a(n: &str, ttl: u32) -> Reply {
        let mut r = Reply::error(ResponseCode::NoError);
        r.answers.push(Record::from_rdata(name(n), ttl, RData::A(A::new(192, 0, 2, 1))));
        r
    }

    #[test]
    fn answers_are_kept_for_their_ttl_capped_and_counted_down() {
        let c = Cache::new(cfg(30, 10, None));
        let t0 = Instant::now();
        let q = name("example.com.");
        c.put(&q, RecordType::A, DNSClass::IN, a("example.com.", 300), t0);
        let hit = c.get(&name("EXAMPLE.com."), RecordType::A, DNSClass::IN, t0 + Duration::from_secs(10)).unwrap();
        assert_eq!(hit.answers[0].ttl, 20, "capped at 30, 10 s gone");
        assert!(c.get(&q, RecordType::AAAA, DNSClass::IN, t0).is_none());
        assert!(c.get(&q, RecordType::A, DNSClass::IN, t0 + Duration::from_secs(30)).is_none());
        // A short TTL is raised to the minimum (5).
        c.put(&q, RecordType::A, DNSClass::IN, a("example.com.", 1), t0);
        assert!(c.get(&q, RecordType::A, DNSClass::IN, t0 + Duration::from_secs(4)).is_some());
    }

    #[test]
    fn denials_use_the_soa_minimum_and_errors_are_not_kept() {
        let c = Cache::new(cfg(3600, 10, None));
        let t0 = Instant::now();
        let mut nx = Reply::error(ResponseCode::NXDomain);
        let soa = SOA::new(name("ns."), name("h."), 1, 7200, 1800, 86400, 60);
        nx.authority.push(Record::from_rdata(name("com."), 900, RData::SOA(soa)));
        let q = name("nope.com.");
        c.put(&q, RecordType::A, DNSClass::IN, nx.clone(), t0);
        assert!(c.get(&q, RecordType::A, DNSClass::IN, t0 + Duration::from_secs(59)).is_some());
        assert!(c.get(&q, RecordType::A, DNSClass::IN, t0 + Duration::from_secs(60)).is_none());
        c.put(&q, RecordType::A, DNSClass::IN, Reply::error(ResponseCode::ServFail), t0);
        assert_eq!(c.len(), (0, 0));
    }

    #[test]
    fn disabled_zones_and_capacity() {
        let c = Cache::new(cfg(30, 2, Some(vec![name("cluster.local.")])));
        let t0 = Instant::now();
        c.put(
            &name("web.default.svc.cluster.local."),
            RecordType::A,
            DNSClass::IN,
            a("web.default.svc.cluster.local.", 30),
            t0,
        );
        assert_eq!(c.len(), (0, 0));
        for n in ["a.com.", "b.com.", "c.com."] {
            c.put(&name(n), RecordType::A, DNSClass::IN, a(n, 30), t0);
        }
        assert_eq!(c.len(), (2, 0));
    }
}
