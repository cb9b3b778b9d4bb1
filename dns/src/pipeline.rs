//! A loaded Corefile: per server block, its plugins ready to answer, run in CoreDNS's order —
//! `cache`, then `kubernetes` (the cluster zone; NXDOMAIN under a `fallthrough` zone goes on),
//! then `forward`; `loadbalance` shuffles address answers; `log` and `errors` lines are made
//! here as CoreDNS prints them ([`log_line`]). Building reads the resolv.conf files `forward`
//! names (through a function, so tests give their own); answering touches the network only
//! in `forward`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hickory_proto::op::{Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};

use crate::cache::{Cache, Reply};
use crate::corefile::{self, Corefile, CorefileError, Plugins, Pods, Upstream};
use crate::forward::{ForwardError, Forwarder};
use crate::records::Config;
use crate::server::SharedZone;

/// One server block, ready.
pub struct Block {
    pub zones: Vec<Name>,
    pub plugins: Plugins,
    forward: Option<Forwarder>,
    cache: Option<Cache>,
    rotate: AtomicUsize,
}

/// The `loop` plugin's probe: the name it asks for, and how often it came back.
pub struct LoopProbe {
    pub name: Name,
    pub seen: AtomicU32,
    /// Where the probe is sent (the server itself).
    pub target: SocketAddr,
}

/// A loaded Corefile.
pub struct Pipeline {
    pub text: String,
    pub corefile: Corefile,
    pub blocks: Vec<Block>,
    /// The `kubernetes` plugin's zone settings (the one block that has it).
    pub zone: Option<Config>,
    /// The first `reload` of the Corefile (CoreDNS reloads the whole file).
    pub reload: Option<(Duration, Duration)>,
    pub health: Option<SocketAddr>,
    /// `health { lameduck D }`: how long a stopping server keeps answering.
    pub lameduck: Duration,
    pub ready: Option<SocketAddr>,
    pub prometheus: Option<SocketAddr>,
    pub loop_probe: Option<LoopProbe>,
}

/// What answering a query gave: the reply, an error for the `errors` plugin, and whether the
/// `loop` plugin saw its probe come back too often (CoreDNS exits then).
pub struct Outcome {
    pub reply: Reply,
    pub error: Option<String>,
    pub looped: bool,
    /// The block that answered (None: no block serves the name).
    pub block: Option<usize>,
}

/// A random label, as the loop plugin's probe name has two.
fn random_label() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos());
    (h.finish() >> 1).to_string()
}

impl Pipeline {
    /// Loads `text`: parses it, checks it fits this server (one port, `listen`'s), resolves
    /// `forward`'s upstreams (`read` reads a resolv.conf).
    pub fn build(
        text: &str,
        file: &str,
        listen: SocketAddr,
        read: &dyn Fn(&str) -> std::io::Result<String>,
    ) -> Result<Pipeline, CorefileError> {
        let corefile = corefile::parse(text, file)?;
        let mut blocks = vec![];
        let mut zone = None;
        let (mut reload, mut health, mut ready, mut prometheus, mut loop_probe) = (None, None, None, None, None);
        let mut lameduck = Duration::ZERO;
        for s in &corefile.servers {
            if let Some(p) = s.port.filter(|p| *p != listen.port()) {
                return Err(CorefileError(format!(
                    "podpath-dns serves one port ({}, its --listen): the block for {} asks for {p}",
                    listen.port(),
                    s.zones.iter().map(|z| z.to_string()).collect::<Vec<_>>().join(" ")
                )));
            }
            let p = &s.plugins;
            if let Some(k) = &p.kubernetes {
                if zone.is_some() {
                    return Err(CorefileError(
                        "plugin/kubernetes: podpath-dns serves one cluster zone: the plugin is in two server blocks"
                            .into(),
                    ));
                }
                let domain = k.domain().expect("checked when parsed").to_string();
                let mut cfg = Config::new(&domain, k.ttl).map_err(CorefileError)?;
                cfg.pods = k.pods == Pods::Insecure;
                zone = Some(cfg);
            }
            let forward = match &p.forward {
                None => None,
                Some(f) => {
                    let mut ups = vec![];
                    for t in &f.to {
                        match t {
                            Upstream::Addr(a) => ups.push(*a),
                            Upstream::ResolvConf(path) => {
                                let text = read(path)
                                    .map_err(|e| CorefileError(format!("plugin/forward: cannot read {path}: {e}")))?;
                                ups.extend(corefile::resolv_nameservers(&text));
                            }
                        }
                    }
                    if ups.is_empty() {
                        return Err(CorefileError("plugin/forward: no nameservers found".into()));
                    }
                    Some(Forwarder::new(f.clone(), ups))
                }
            };
            reload = reload.or(p.reload);
            health = health.or(p.health.map(|h| h.0));
            lameduck = lameduck.max(p.health.map_or(Duration::ZERO, |h| h.1));
            ready = ready.or(p.ready);
            prometheus = prometheus.or(p.prometheus);
            if p.loop_detect && p.forward.is_some() && loop_probe.is_none() {
                let zone = s.zones.first().cloned().unwrap_or_else(Name::root);
                let apex = if zone.is_root() { String::new() } else { zone.to_string() };
                let name = Name::from_ascii(format!("{}.{}.{apex}", random_label(), random_label()))
                    .map_err(|e| CorefileError(format!("plugin/loop: {e}")))?;
                let ip = if listen.ip().is_unspecified() { [127, 0, 0, 1].into() } else { listen.ip() };
                loop_probe =
                    Some(LoopProbe { name, seen: AtomicU32::new(0), target: SocketAddr::new(ip, listen.port()) });
            }
            blocks.push(Block {
                zones: s.zones.clone(),
                plugins: p.clone(),
                forward,
                cache: p.cache.clone().map(Cache::new),
                rotate: AtomicUsize::new(0),
            });
        }
        Ok(Pipeline {
            text: text.to_string(),
            corefile,
            blocks,
            zone,
            reload,
            health,
            lameduck,
            ready,
            prometheus,
            loop_probe,
        })
    }

    /// The block serving `name`: the one with the most specific zone.
    pub fn block_for(&self, name: &Name) -> Option<usize> {
        let mut best: Option<(usize, u8)> = None;
        for (i, b) in self.blocks.iter().enumerate() {
            if let Some(z) = corefile::longest(name, &b.zones) {
                if best.is_none_or(|(_, n)| z.num_labels() > n) {
                    best = Some((i, z.num_labels()));
                }
            }
        }
        best.map(|(i, _)| i)
    }

    /// Answers one query through the plugins of its block.
    pub async fn resolve(&self, zone: &SharedZone, query: &Query, rd: bool) -> Outcome {
        self.resolve_at(zone, query, rd, 0).await
    }

    fn resolve_at<'a>(
        &'a self,
        zone: &'a SharedZone,
        query: &'a Query,
        rd: bool,
        depth: u8,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Outcome> + Send + 'a>> {
        Box::pin(self.resolve_once(zone, query, rd, depth))
    }

    async fn resolve_once(&self, zone: &SharedZone, query: &Query, rd: bool, depth: u8) -> Outcome {
        let name = query.name().to_lowercase();
        let mut looped = false;
        if let Some(p) = &self.loop_probe {
            if name == p.name.to_lowercase() {
                looped = p.seen.fetch_add(1, Ordering::Relaxed) + 1 > 2;
            }
        }
        let Some(bi) = self.block_for(&name) else {
            return Outcome { reply: Reply::error(ResponseCode::Refused), error: None, looped, block: None };
        };
        let block = &self.blocks[bi];
        let (qtype, class) = (query.query_type(), query.query_class());
        let now = Instant::now();
        if let Some(hit) = block.cache.as_ref().and_then(|c| c.get(&name, qtype, class, now)) {
            return Outcome { reply: block.balance(hit), error: None, looped, block: Some(bi) };
        }
        let (mut reply, error) = block.chain(zone, query, &name, rd).await;
        // An ExternalName's CNAME leads outside the cluster: its target is looked up too, as
        // CoreDNS's kubernetes plugin does through the server itself.
        if let Some(target) = external_target(&reply, qtype, block).filter(|_| depth < 4) {
            let q = Query::query(target, qtype);
            let more = self.resolve_at(zone, &q, rd, depth + 1).await.reply;
            if more.code == ResponseCode::NoError {
                reply.answers.extend(more.answers);
                reply.recursion_available |= more.recursion_available;
            }
        }
        if let Some(c) = &block.cache {
            reply = c.put(&name, qtype, class, reply, now);
        }
        Outcome { reply: block.balance(reply), error, looped, block: Some(bi) }
    }
}

/// The target of a lone CNAME answer that points outside the block's cluster zone.
fn external_target(reply: &Reply, qtype: RecordType, block: &Block) -> Option<Name> {
    if qtype == RecordType::CNAME || reply.code != ResponseCode::NoError || reply.answers.len() != 1 {
        return None;
    }
    let RData::CNAME(c) = &reply.answers[0].data else { return None };
    let k = block.plugins.kubernetes.as_ref()?;
    (!corefile::under(&c.0, &k.zones)).then(|| c.0.clone())
}

impl Block {
    /// `kubernetes`, then `forward`.
    async fn chain(&self, zone: &SharedZone, query: &Query, name: &Name, rd: bool) -> (Reply, Option<String>) {
        let (qtype, class) = (query.query_type(), query.query_class());
        if let Some(k) = &self.plugins.kubernetes {
            if class == DNSClass::IN && corefile::under(name, &k.zones) {
                let a = zone.read(|z| {
                    let a = z.answer(name, qtype);
                    // A reverse name that is not the cluster's: the plugin's NXDOMAIN.
                    if a.code == ResponseCode::Refused {
                        z.negative_answer(ResponseCode::NXDomain)
                    } else {
                        a
                    }
                });
                let through = a.code == ResponseCode::NXDomain
                    && k.fallthrough.as_ref().is_some_and(|zs| zs.is_empty() || corefile::under(name, zs));
                if !through {
                    return (
                        Reply {
                            code: a.code,
                            answers: a.answers,
                            authority: a.authority,
                            additional: a.additional,
                            authoritative: true,
                            recursion_available: false,
                        },
                        None,
                    );
                }
            }
        }
        if let Some(f) = &self.forward {
            if f.cfg.from.zone_of(name) && !corefile::under(name, &f.cfg.except) {
                return match f.forward(query, rd).await {
                    Ok((m, _)) => (
                        Reply {
                            code: m.metadata.response_code,
                            answers: m.answers,
                            authority: m.authorities,
                            additional: m.additionals,
                            authoritative: m.metadata.authoritative,
                            recursion_available: m.metadata.recursion_available,
                        },
                        None,
                    ),
                    Err(ForwardError::TooMany) => (
                        Reply::error(ResponseCode::Refused),
                        Some(format!("plugin/forward: concurrent queries exceeded maximum {}", f.cfg.max_concurrent)),
                    ),
                    Err(ForwardError::Failed(e)) => (Reply::error(ResponseCode::ServFail), Some(e)),
                };
            }
        }
        let last = if self.plugins.forward.is_some() {
            "forward"
        } else if self.plugins.kubernetes.is_some() {
            "kubernetes"
        } else {
            "server"
        };
        (Reply::error(ResponseCode::ServFail), Some(format!("plugin/{last}: no next plugin found")))
    }

    /// `loadbalance`: the address records of an answer rotated, a step per query.
    fn balance(&self, mut r: Reply) -> Reply {
        if !self.plugins.loadbalance {
            return r;
        }
        let addrs: Vec<usize> = (0..r.answers.len())
            .filter(|i| matches!(r.answers[*i].record_type(), RecordType::A | RecordType::AAAA | RecordType::MX))
            .collect();
        if addrs.len() > 1 {
            let k = self.rotate.fetch_add(1, Ordering::Relaxed) % addrs.len();
            let picked: Vec<_> = addrs.iter().map(|i| r.answers[*i].clone()).collect();
            for (j, i) in addrs.iter().enumerate() {
                r.answers[*i] = picked[(j + k) % picked.len()].clone();
            }
        }
        r
    }
}

/// Whether the block's `log` prints a reply for `name`.
pub fn logs(block: &Block, name: &Name, reply: &Reply) -> bool {
    let Some(l) = &block.plugins.log else { return false };
    (l.names.is_empty() || corefile::under(name, &l.names))
        && (l.classes.is_empty() || l.classes.iter().any(|c| c == reply.class()))
}

/// One query as the `log` plugin's default format prints it:
/// `[INFO] 10.244.1.5:48322 - 40422 "A IN web.default.svc.cluster.local. udp 58 false 512" NOERROR qr,aa,rd 106 0.000119s`.
#[allow(clippy::too_many_arguments)]
pub fn log_line(
    src: SocketAddr,
    id: u16,
    query: &Query,
    proto: &str,
    size: usize,
    dnssec_ok: bool,
    bufsize: u16,
    code: &str,
    flags: &str,
    rsize: usize,
    took: Duration,
) -> String {
    // An IPv4 client of the dual-stack socket as itself, as Go's net package shows it.
    let src = SocketAddr::new(src.ip().to_canonical(), src.port());
    let host = match src {
        SocketAddr::V4(a) => a.ip().to_string(),
        SocketAddr::V6(a) => format!("[{}]", a.ip()),
    };
    format!(
        "[INFO] {host}:{} - {id} \"{} {} {} {proto} {size} {dnssec_ok} {bufsize}\" {code} {flags} {rsize} {}s",
        src.port(),
        query.query_type(),
        query.query_class(),
        query.name(),
        took.as_secs_f64()
    )
}

/// The response's flags as CoreDNS's log prints them (`qr,aa,rd,ra`).
pub fn flags(authoritative: bool, truncated: bool, rd: bool, ra: bool) -> String {
    let mut f = vec!["qr"];
    for (on, s) in [(authoritative, "aa"), (truncated, "tc"), (rd, "rd"), (ra, "ra")] {
        if on {
            f.push(s);
        }
    }
    f.join(",")
}

/// The `errors` plugin's line: `[ERROR] plugin/errors: 2 example.com. A: read udp …: i/o timeout`.
pub fn error_line(code: ResponseCode, query: &Query, err: &str) -> String {
    format!("[ERROR] plugin/errors: {} {} {}: {err}", u16::from(code), query.name(), query.query_type())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Zone;

    fn no_files(p: &str) -> std::io::Result<String> {
        Err(std::io::Error::new(std::io::ErrorKind::NotFound, p.to_string()))
    }

    fn build(text: &str) -> Result<Pipeline, CorefileError> {
        Pipeline::build(text, "Corefile", "0.0.0.0:53".parse().unwrap(), &no_files)
    }

    fn q(n: &str, t: RecordType) -> Query {
        Query::query(Name::from_ascii(n).unwrap(), t)
    }

    fn zone() -> SharedZone {
        let svc = serde_json::from_value(serde_json::json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.20"}}))
        .unwrap();
        let ext = serde_json::from_value(serde_json::json!({"metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "example.org"}}))
        .unwrap();
        SharedZone::new(Zone::build(Config::new("cluster.local", 30).unwrap(), &[svc, ext], &[], 1))
    }

    #[tokio::test]
    async fn blocks_zones_fallthrough_and_pods() {
        let p = build(
            ".:53 {\n kubernetes cluster.local in-addr.arpa {\n  fallthrough in-addr.arpa\n  ttl 7\n }\n}\nexample.org:53 {\n errors\n}\n",
        )
        .unwrap();
        let z = zone();
        z.update(|zone| zone.set_config(p.zone.clone().unwrap()));
        let o = p.resolve(&z, &q("web.default.svc.cluster.local.", RecordType::A), true).await;
        assert_eq!((o.reply.code, o.reply.answers[0].ttl, o.block), (ResponseCode::NoError, 7, Some(0)));
        assert!(o.reply.authoritative);
        // pods disabled (the default): no pod names.
        let o = p.resolve(&z, &q("10-244-1-5.default.pod.cluster.local.", RecordType::A), true).await;
        assert_eq!(o.reply.code, ResponseCode::NXDomain);
        // Not the cluster's, no forward: SERVFAIL, and the errors plugin's reason.
        let o = p.resolve(&z, &q("example.com.", RecordType::A), true).await;
        assert_eq!(
            (o.reply.code, o.error.as_deref()),
            (ResponseCode::ServFail, Some("plugin/kubernetes: no next plugin found"))
        );
        // A reverse name that is not the cluster's falls through (to nothing here).
        let o = p.resolve(&z, &q("1.2.0.192.in-addr.arpa.", RecordType::PTR), true).await;
        assert_eq!(o.reply.code, ResponseCode::ServFail);
        // The more specific block serves its zone.
        assert_eq!(p.block_for(&Name::from_ascii("www.example.org.").unwrap()), Some(1));
        let only = build("cluster.local:53 {\n kubernetes\n}\n").unwrap();
        let o = only.resolve(&z, &q("example.com.", RecordType::A), true).await;
        assert_eq!((o.reply.code, o.block), (ResponseCode::Refused, None));
    }

    #[test]
    fn one_port_one_cluster_zone_and_readable_upstreams() {
        let e = build("cluster.local:5353 {\n kubernetes\n}\n").err().unwrap().0;
        assert!(e.contains("serves one port (53, its --listen): the block for cluster.local. asks for 5353"), "{e}");
        let e = build("a.local {\n kubernetes\n}\nb.local {\n kubernetes\n}\n").err().unwrap().0;
        assert!(e.contains("the plugin is in two server blocks"), "{e}");
        let e = build(". {\n forward . /etc/nothing.conf\n}\n").err().unwrap().0;
        assert!(e.starts_with("plugin/forward: cannot read /etc/nothing.conf"), "{e}");
        let read = |_: &str| Ok("nameserver 192.0.2.53\n".to_string());
        let p = Pipeline::build(
            ". {\n forward . /etc/resolv.conf\n loop\n}\n",
            "Corefile",
            "0.0.0.0:53".parse().unwrap(),
            &read,
        )
        .unwrap();
        assert_eq!(p.blocks[0].forward.as_ref().unwrap().upstreams, vec!["192.0.2.53:53".parse().unwrap()]);
        let probe = p.loop_probe.as_ref().unwrap();
        assert_eq!((probe.name.num_labels(), probe.target), (2, "127.0.0.1:53".parse().unwrap()));
    }

    #[tokio::test]
    async fn the_loop_probe_coming_back_a_third_time_is_a_loop() {
        // An upstream nobody listens on: the forward fails at once.
        let p = Pipeline::build(
            "cluster.local {\n kubernetes\n}\n. {\n forward . 127.0.0.1:9\n loop\n}\n",
            "Corefile",
            "0.0.0.0:53".parse().unwrap(),
            &no_files,
        )
        .unwrap();
        let probe = q(&p.loop_probe.as_ref().unwrap().name.to_string(), RecordType::HINFO);
        // The first two: the probe and one echo of it.
        for _ in 0..2 {
            p.loop_probe.as_ref().unwrap().seen.fetch_add(1, Ordering::Relaxed);
        }
        let z = zone();
        let o = tokio::time::timeout(Duration::from_secs(10), p.resolve(&z, &probe, true)).await.unwrap();
        assert!(o.looped);
    }

    #[test]
    fn log_lines_read_as_coredns_prints_them() {
        let line = log_line(
            "10.244.1.5:48322".parse().unwrap(),
            40422,
            &q("web.default.svc.cluster.local.", RecordType::A),
            "udp",
            58,
            false,
            512,
            "NOERROR",
            &flags(true, false, true, false),
            106,
            Duration::from_micros(119),
        );
        assert_eq!(
            line,
            "[INFO] 10.244.1.5:48322 - 40422 \"A IN web.default.svc.cluster.local. udp 58 false 512\" NOERROR qr,aa,rd 106 0.000119s"
        );
        assert_eq!(
            error_line(ResponseCode::ServFail, &q("example.com.", RecordType::A), "read udp 10.0.0.2:53: i/o timeout"),
            "[ERROR] plugin/errors: 2 example.com. A: read udp 10.0.0.2:53: i/o timeout"
        );
    }

    #[tokio::test]
    async fn loadbalance_rotates_and_external_names_are_followed_when_they_can_be() {
        let p = build("cluster.local {\n kubernetes\n loadbalance\n}\n").unwrap();
        let z = zone();
        // The CNAME alone: nothing serves example.org.
        let o = p.resolve(&z, &q("ext.default.svc.cluster.local.", RecordType::A), true).await;
        assert_eq!((o.reply.code, o.reply.answers.len()), (ResponseCode::NoError, 1));
        let b = &p.blocks[0];
        let mut r = Reply::error(ResponseCode::NoError);
        for i in 1..=3 {
            r.answers.push(hickory_proto::rr::Record::from_rdata(
                Name::root(),
                5,
                RData::A(hickory_proto::rr::rdata::A::new(10, 0, 0, i)),
            ));
        }
        let first = |r: &Reply| r.answers[0].data.to_string();
        assert_eq!(
            [first(&b.balance(r.clone())), first(&b.balance(r.clone())), first(&b.balance(r.clone()))],
            ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
        );
    }
}
