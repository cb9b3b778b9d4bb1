//! Random Service and endpoint churn over the proxier's caches (for the soak test and the
//! proxy bench): endpoints replaced, added, removed, turned unready; Services created, deleted
//! and switched between ClusterIP, NodePort, ClientIP affinity and `externalTrafficPolicy:
//! Local`. Seeded, so a failure can be replayed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kube_proxy::model::{ServiceView, SliceView};
use podpath_client::reflector::{Change, Store, Watched};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    ClusterIp,
    NodePort,
    Affinity,
    LocalNodePort,
}

/// One endpoint: its address and readiness.
type Ep = (String, bool);

pub struct Churn {
    rng: fastrand::Rng,
    pub services: Arc<Store<ServiceView>>,
    pub slices: Arc<Store<SliceView>>,
    /// Service number → its kind and endpoints.
    objects: BTreeMap<usize, (Kind, Vec<Ep>)>,
    next_service: usize,
    next_address: u32,
    /// The Service the last [`Churn::step`] changed.
    pub last_service: usize,
}

/// NodePorts only below this Service number (each gets 30000 + its number: no two alike).
const NODEPORTS: usize = 2000;

impl Churn {
    /// `n` Services of every kind with 1 to 10 endpoints each, in the caches.
    pub fn new(n: usize, seed: u64) -> Churn {
        let mut c = Churn {
            rng: fastrand::Rng::with_seed(seed),
            services: Store::new(),
            slices: Store::new(),
            objects: BTreeMap::new(),
            next_service: n,
            next_address: 0,
            last_service: 0,
        };
        for i in 0..n {
            let kind = c.kind(i);
            let eps = (0..c.rng.usize(1..=10)).map(|_| (c.address(), true)).collect();
            c.objects.insert(i, (kind, eps));
        }
        let (services, slices): (BTreeMap<_, _>, BTreeMap<_, _>) = c
            .objects
            .iter()
            .map(|(i, (kind, eps))| {
                let (s, e) = (service(*i, *kind), slice(*i, eps));
                ((s.key(), ServiceView::of(&s)), (e.key(), SliceView::of(&e)))
            })
            .unzip();
        c.services.apply(Change::Replace(services));
        c.slices.apply(Change::Replace(slices));
        c
    }

    fn kind(&mut self, i: usize) -> Kind {
        match (self.rng.u8(0..10), i < NODEPORTS) {
            (0..=5, _) | (6..=7, false) => Kind::ClusterIp,
            (6..=7, true) => Kind::NodePort,
            (8, _) => Kind::Affinity,
            (_, true) => Kind::LocalNodePort,
            (_, false) => Kind::Affinity,
        }
    }

    /// A pod address never used before.
    fn address(&mut self) -> String {
        let a = self.next_address;
        self.next_address += 1;
        // 10.112–10.211: outside the Service CIDR (10.96.0.0/12) and the pods' (10.244.0.0/16).
        format!("10.{}.{}.{}", 112 + (a >> 16) % 100, (a >> 8) & 255, a & 255)
    }

    fn put(&self, i: usize) {
        let (kind, eps) = &self.objects[&i];
        let (s, e) = (service(i, *kind), slice(i, eps));
        self.services.apply(Change::Apply(s.key(), ServiceView::of(&s)));
        self.slices.apply(Change::Apply(e.key(), SliceView::of(&e)));
    }

    /// Each Service's ClusterIP and the addresses of its ready endpoints: where a new
    /// connection to it may go.
    pub fn ready(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.objects
            .iter()
            .map(|(i, (_, eps))| (cluster_ip(*i), eps.iter().filter(|e| e.1).map(|e| e.0.clone()).collect()))
            .collect()
    }

    /// One random change to the caches; what it was.
    pub fn step(&mut self) -> &'static str {
        let keys: Vec<usize> = self.objects.keys().copied().collect();
        let i = keys[self.rng.usize(..keys.len())];
        self.last_service = i;
        let roll = self.rng.u8(0..100);
        let what = match roll {
            0..=39 => "endpoint replaced",
            40..=54 => "endpoint added",
            55..=69 => "endpoint removed",
            70..=79 => "readiness flipped",
            80..=86 => "service deleted",
            87..=93 => "service created",
            _ => "kind changed",
        };
        match what {
            "service deleted" if keys.len() > 1 => {
                self.objects.remove(&i);
                self.services.apply(Change::Delete(format!("bench/svc-{i}")));
                self.slices.apply(Change::Delete(format!("bench/svc-{i}-abc")));
                return what;
            }
            "service created" => {
                let i = self.next_service;
                self.next_service += 1;
                self.last_service = i;
                let kind = self.kind(i);
                let eps = (0..self.rng.usize(1..=10)).map(|_| (self.address(), true)).collect();
                self.objects.insert(i, (kind, eps));
                self.put(i);
                return what;
            }
            "kind changed" => {
                let kind = self.kind(i);
                self.objects.get_mut(&i).unwrap().0 = kind;
            }
            _ => {
                let fresh = self.address();
                let eps = &mut self.objects.get_mut(&i).unwrap().1;
                let j = if eps.is_empty() { 0 } else { self.rng.usize(..eps.len()) };
                match what {
                    "endpoint replaced" | "readiness flipped" if eps.is_empty() => eps.push((fresh, true)),
                    "endpoint replaced" => eps[j].0 = fresh,
                    "readiness flipped" => eps[j].1 = !eps[j].1,
                    "endpoint added" if eps.len() < 12 => eps.push((fresh, true)),
                    "endpoint removed" if !eps.is_empty() => {
                        eps.remove(j);
                    }
                    _ => {}
                }
            }
        }
        self.put(i);
        what
    }
}

fn cluster_ip(i: usize) -> String {
    format!("10.96.{}.{}", i / 250, i % 250 + 1)
}

/// Service `i` (`bench/svc-i`, ClusterIP 10.96.x.y, port http 80) of `kind`.
pub fn service(i: usize, kind: Kind) -> core::Service {
    let mut spec = serde_json::json!({"clusterIP": cluster_ip(i), "type": "ClusterIP",
                                      "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]});
    match kind {
        Kind::ClusterIp => {}
        Kind::NodePort | Kind::LocalNodePort => {
            spec["type"] = "NodePort".into();
            spec["ports"][0]["nodePort"] = (30000 + i).into();
            if kind == Kind::LocalNodePort {
                spec["externalTrafficPolicy"] = "Local".into();
            }
        }
        Kind::Affinity => {
            spec["sessionAffinity"] = "ClientIP".into();
            spec["sessionAffinityConfig"] = serde_json::json!({"clientIP": {"timeoutSeconds": 600}});
        }
    }
    serde_json::from_value(
        serde_json::json!({"metadata": {"name": format!("svc-{i}"), "namespace": "bench"}, "spec": spec}),
    )
    .unwrap()
}

/// Service `i`'s EndpointSlice (`bench/svc-i-abc`, port http 8080), endpoints on node-1…3 in turn.
pub fn slice(i: usize, eps: &[Ep]) -> discovery::EndpointSlice {
    let eps: Vec<serde_json::Value> = eps
        .iter()
        .enumerate()
        .map(|(j, (a, ready))| {
            serde_json::json!({"addresses": [a], "conditions": {"ready": ready}, "nodeName": format!("node-{}", j % 3 + 1)})
        })
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("svc-{i}-abc"), "namespace": "bench",
                     "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps
    }))
    .unwrap()
}

/// What a soak saw.
#[derive(Debug, Default)]
pub struct Soaked {
    pub batches: usize,
    pub changes: usize,
    /// Each partial sync's time, in ms.
    pub sync_ms: Vec<f64>,
    /// The first difference between the kernel and the model, with the batch it followed.
    pub difference: Option<String>,
    /// Connections made to the Services while they churned (with `packets`).
    pub connections: usize,
    /// Of those, the ones that reached an endpoint.
    pub answered: usize,
    /// Those neither answered nor refused within a second (a SYN lost), or reset once
    /// connected: after DNAT had chosen an endpoint.
    pub lost: usize,
    /// Connections that reached an address that was not a ready endpoint of the Service
    /// before or after the batch being applied, or were refused while it had endpoints both
    /// before and after (other than `raced`): a half-applied Service (the first few), with the
    /// syncs under way when the connection started and ended (`sync 2k+1`: batch k+1 being
    /// applied; `2k`: applied).
    pub half_applied: Vec<String>,
    /// Connections refused while the batch being applied rewrote their Service's rules, though
    /// it had endpoints before and after. The kernel commits a transaction atomically, but a
    /// packet that is evaluating a rule the transaction deletes when it commits can miss in
    /// that rule's anonymous map (its elements are already out of the new generation) and
    /// fall through. Plain `nft -f` shows it: flipping a chain between two rules `dnat ip addr
    /// . port to numgen random mod 2 map { … }` 2,672 times refused 8 of 229,719 connections
    /// meanwhile; between two `dnat to` rules without a map, 0 of 207,095 (kernel 6.18).
    /// Whether our side split a batch is checked apart: each partial sync is at most one
    /// transaction (the namespace's nf_tables generation moves by at most one).
    pub raced: usize,
    /// What each batch changed (`svc-N: what`), to read a half-applied connection against.
    pub batch_log: Vec<String>,
}

/// A prober thread's counts: connections, answered, lost, raced, and the half-applied ones seen.
type Probed = (usize, usize, usize, usize, Vec<String>);

/// The endpoints a connection may reach, whether it may be refused, and whether the batch
/// being applied rewrites the Service.
type Allowed = (BTreeSet<String>, bool, bool);

fn allowed_after(endpoints: BTreeSet<String>) -> Allowed {
    let none = endpoints.is_empty();
    (endpoints, none, false)
}

/// New TCP connections to the churning Services' ClusterIPs from inside the namespace, while
/// the batches are applied. Every endpoint address is local (a `local` route for
/// 10.112.0.0/16), one listener on 0.0.0.0:8080 answers each connection with the address it
/// was accepted on, which is where DNAT sent it; the ClusterIPs are local addresses with no
/// listener on port 80, so a connection that no rule DNATs is refused at once. A connection
/// lost on the way (no answer within a second, or reset once connected: about 1 in 10,000
/// here even with no change at all) is counted apart.
struct Prober {
    /// ClusterIP → the endpoints a connection may reach now (during a batch: before and after),
    /// and whether it may be refused (no endpoints before or after).
    allowed: Arc<Mutex<BTreeMap<String, Allowed>>>,
    /// The ClusterIPs the batch being applied changes (probed more often).
    focus: Arc<Mutex<Vec<String>>>,
    /// Odd while a batch is being applied, even between batches.
    sync: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Probed>>,
}

impl Prober {
    fn start(ready: BTreeMap<String, BTreeSet<String>>) -> Prober {
        use std::io::{BufRead, Read, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        for args in [
            "link set lo up",
            "addr add 10.244.0.1/32 dev lo",
            // ClusterIPs local too, from a pod's address (not masqueraded): a connection no
            // rule DNATs meets no listener on port 80 and is refused at once.
            "route add local 10.96.0.0/12 dev lo src 10.244.0.1",
            "route add local 10.112.0.0/16 dev lo",
        ] {
            let out = std::process::Command::new("ip").args(args.split(' ')).output().expect("run ip");
            assert!(out.status.success(), "ip {args}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let listener = std::net::TcpListener::bind("0.0.0.0:8080").expect("listen on 8080");
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let allowed: Arc<Mutex<BTreeMap<String, Allowed>>> =
            Arc::new(Mutex::new(ready.into_iter().map(|(c, e)| (c, allowed_after(e))).collect()));
        let focus: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(vec![]));
        let sync = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let server = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((mut c, _)) => {
                            // The address, then wait for the client to close first: the
                            // client's side keeps the TIME_WAIT, so no later connection that
                            // DNAT sends to this endpoint from a reused port meets an old one.
                            let local = c.local_addr().map(|a| a.ip().to_string()).unwrap_or_default();
                            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(1)));
                            let _ = c.write_all(format!("{local}\n").as_bytes());
                            let _ = c.read(&mut [0u8; 16]);
                        }
                        Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
                    }
                }
                (0, 0, 0, 0, vec![])
            })
        };
        let client = {
            let (stop, allowed, focus, sync) = (stop.clone(), allowed.clone(), focus.clone(), sync.clone());
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(5);
                let (mut connections, mut answered, mut lost, mut raced, mut bad) = (0, 0, 0, 0, vec![]);
                while !stop.load(Ordering::Relaxed) {
                    let pick = {
                        let focus = focus.lock().unwrap();
                        let allowed = allowed.lock().unwrap();
                        let live: Vec<&String> =
                            allowed.iter().filter(|(_, a)| !a.0.is_empty()).map(|(c, _)| c).collect();
                        if !focus.is_empty() && rng.bool() {
                            focus[rng.usize(..focus.len())].clone()
                        } else if live.is_empty() {
                            continue;
                        } else {
                            live[rng.usize(..live.len())].clone()
                        }
                    };
                    let now = |a: &Mutex<BTreeMap<String, Allowed>>| {
                        a.lock().unwrap().get(&pick).cloned().unwrap_or((BTreeSet::new(), true, false))
                    };
                    let sync_before = sync.load(Ordering::SeqCst);
                    let before = now(&allowed);
                    let addr: std::net::SocketAddr = format!("{pick}:80").parse().unwrap();
                    let t = std::time::Duration::from_secs(1);
                    // Refused: no rule sent the connection anywhere (or a reject). Anything that
                    // goes wrong once connected (a reset, about 1 in 10,000 here with no change at
                    // all) happened after DNAT chose an endpoint's listener: not a rule's doing.
                    let connected = std::net::TcpStream::connect_timeout(&addr, t);
                    let got = connected.as_ref().map_err(|e| e.kind()).map(|c| {
                        let _ = c.set_read_timeout(Some(t));
                        let mut line = String::new();
                        c.try_clone()
                            .and_then(|c| std::io::BufReader::new(c).read_line(&mut line))
                            .map(|_| line.trim().to_string())
                    });
                    drop(connected);
                    let after = now(&allowed);
                    let syncs = format!("syncs {sync_before}→{}", sync.load(Ordering::SeqCst));
                    connections += 1;
                    match got {
                        Ok(Ok(ep)) if before.0.contains(&ep) || after.0.contains(&ep) => answered += 1,
                        Ok(Ok(ep)) => {
                            bad.push(format!("{pick}:80 reached {ep}, allowed {before:?} / {after:?} ({syncs})"))
                        }
                        Ok(Err(_)) | Err(std::io::ErrorKind::TimedOut) => lost += 1,
                        // The kernel's commit race (see `Soaked::raced`).
                        Err(std::io::ErrorKind::ConnectionRefused)
                            if !before.1 && !after.1 && (before.2 || after.2) =>
                        {
                            raced += 1
                        }
                        Err(e) if !before.1 && !after.1 => {
                            bad.push(format!("{pick}:80 refused ({e}) with endpoints {before:?} / {after:?} ({syncs})"))
                        }
                        Err(_) => {}
                    }
                    bad.truncate(5);
                    std::thread::sleep(std::time::Duration::from_micros(500));
                }
                (connections, answered, lost, raced, bad)
            })
        };
        Prober { allowed, focus, sync, stop, threads: vec![server, client] }
    }

    /// While a batch is applied: old and new endpoints both allowed.
    fn batch(&self, before: &BTreeMap<String, BTreeSet<String>>, after: &BTreeMap<String, BTreeSet<String>>) {
        let changed: Vec<String> = before
            .keys()
            .chain(after.keys())
            .filter(|c| before.get(*c) != after.get(*c))
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        {
            let mut allowed = self.allowed.lock().unwrap();
            for c in &changed {
                let (b, a) = (before.get(c).cloned().unwrap_or_default(), after.get(c).cloned().unwrap_or_default());
                let may_refuse = b.is_empty() || a.is_empty();
                allowed.insert(c.clone(), (b.union(&a).cloned().collect(), may_refuse, true));
            }
        }
        // One lock at a time (the client takes `focus`, then `allowed`).
        *self.focus.lock().unwrap() = changed;
        self.sync.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// The batch is in the kernel: only the new endpoints.
    fn applied(&self, after: &BTreeMap<String, BTreeSet<String>>) {
        self.sync.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.focus.lock().unwrap().clear();
        *self.allowed.lock().unwrap() = after.iter().map(|(c, e)| (c.clone(), allowed_after(e.clone()))).collect();
    }

    fn finish(self, out: &mut Soaked) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads {
            let (connections, answered, lost, raced, bad) = t.join().expect("a prober thread");
            out.connections += connections;
            out.answered += answered;
            out.lost += lost;
            out.raced += raced;
            out.half_applied.extend(bad);
        }
    }
}

/// Syncs the caches into the current network namespace's kernel as the nftables proxier does
/// (a full sync, then a partial one per batch of `batch` random changes, stale chains deleted
/// after it) and, after every batch, compares the kernel's table (`nft list table`, element by
/// element and rule by rule) with the table rendered whole from the caches. Stops at the first
/// difference, after `max_batches` or at `until`. With `packets`, new connections to the
/// Services all the while ([`Prober`]; the namespace must be one of the test's own).
pub fn soak(
    churn: &mut Churn,
    layout: &str,
    batch: std::ops::RangeInclusive<usize>,
    max_batches: usize,
    until: std::time::Instant,
    packets: bool,
) -> Soaked {
    use kube_proxy::iptables::RenderConfig;
    use kube_proxy::nft_sync::{sync_changed, sync_full, NftKernel, NftablesKernel};
    use kube_proxy::nftables::{render, NftConfig, Shared, TABLE};
    use kube_proxy::tracker::{snapshot, Tracker};
    use podpath_ruleset::nft::{delete_chains, Listing, NftFamily};

    let cfg = RenderConfig::new("node-1", "192.168.56.11".parse().unwrap());
    let nft = NftConfig { layout: layout.parse().unwrap(), service_cidrs: vec!["10.96.0.0/12".parse().unwrap()] };
    let k = NftablesKernel::default();
    let mut tracker = Tracker::new("node-1");
    tracker.update(&churn.services, &churn.slices);
    let state = tracker.list();
    let (mut table, _) = sync_full(&k, &cfg, &nft, &state).expect("full sync");
    let mut shared = Shared::of(&cfg, &nft, &state);
    let mut out = Soaked::default();
    let mut ready = churn.ready();
    let prober = packets.then(|| Prober::start(ready.clone()));
    let mut rng = fastrand::Rng::with_seed(batch.start().wrapping_add(max_batches) as u64);
    while out.batches < max_batches && std::time::Instant::now() < until {
        let mut did = vec![];
        let mut log = vec![];
        for _ in 0..rng.usize(batch.clone()) {
            did.push(churn.step());
            log.push(format!("{} ({}): {}", churn.last_service, cluster_ip(churn.last_service), did.last().unwrap()));
        }
        out.batch_log.push(format!("batch {}: {}", out.batches + 1, log.join(", ")));
        out.changes += did.len();
        out.batches += 1;
        let next = churn.ready();
        if let Some(p) = &prober {
            p.batch(&ready, &next);
        }
        let t = std::time::Instant::now();
        let delta = tracker.update(&churn.services, &churn.slices);
        let generation = k.generation();
        let (stale, _) = sync_changed(&k, &cfg, &nft, &mut shared, &mut table, &delta.old, &delta.new)
            .unwrap_or_else(|e| panic!("partial sync after {did:?}: {e}"));
        out.sync_ms.push(t.elapsed().as_secs_f64() * 1e3);
        // One transaction at most (none when the batch's changes undo each other): no moment
        // in which the kernel holds part of the batch.
        if let (Some(g0), Some(g1)) = (generation, k.generation()) {
            if g1.wrapping_sub(g0) > 1 {
                out.difference = Some(format!("batch {} took {} transactions", out.batches, g1.wrapping_sub(g0)));
                break;
            }
        }
        if let Some(p) = &prober {
            p.applied(&next);
        }
        ready = next;
        // The proxier deletes flushed chains a second later; a chain that came back stays.
        let stale: Vec<String> = stale.into_iter().filter(|c| table.chain(c).is_none()).collect();
        if !stale.is_empty() {
            k.apply(&delete_chains(NftFamily::Ip, TABLE, &stale)).expect("stale chains deleted");
        }
        let listed = k.nft.list_table(NftFamily::Ip, TABLE, false).expect("nft list").expect("the table");
        let mut kernel = Listing::parse(&listed);
        // Affinity sets fill as clients connect (the prober's): runtime state, not rules.
        for (name, elements) in kernel.sets.iter_mut() {
            if name.starts_with("affinity-") {
                elements.clear();
            }
        }
        let model = Listing::of(&render(&cfg, &nft, &snapshot(&churn.services.list(), &churn.slices.list(), "node-1")));
        if kernel != model {
            out.difference = Some(describe(&kernel, &model, out.batches, &did));
            break;
        }
    }
    if let Some(p) = prober {
        p.finish(&mut out);
    }
    out
}

/// The chains and sets where `kernel` and `model` differ, briefly.
fn describe(
    kernel: &podpath_ruleset::nft::Listing,
    model: &podpath_ruleset::nft::Listing,
    batch: usize,
    did: &[&str],
) -> String {
    let mut out = format!("after batch {batch} ({did:?}):");
    let names: std::collections::BTreeSet<&String> = kernel.chains.keys().chain(model.chains.keys()).collect();
    for c in names.into_iter().filter(|c| kernel.chains.get(*c) != model.chains.get(*c)).take(5) {
        out +=
            &format!("\n  chain {c}: kernel {:?}\n           model  {:?}", kernel.chains.get(c), model.chains.get(c));
    }
    let names: std::collections::BTreeSet<&String> = kernel.sets.keys().chain(model.sets.keys()).collect();
    for s in names {
        let (a, b) = (kernel.sets.get(s).cloned().unwrap_or_default(), model.sets.get(s).cloned().unwrap_or_default());
        let extra: Vec<&String> = a.difference(&b).take(3).collect();
        let missing: Vec<&String> = b.difference(&a).take(3).collect();
        if !extra.is_empty() || !missing.is_empty() {
            out += &format!("\n  set {s}: only in the kernel {extra:?}; only in the model {missing:?}");
        }
    }
    out
}
