//! Serves the L7 sites of [`crate::l7`]: an HTTP/1.1 reverse proxy on `VIP:80`, and on
//! `VIP:443` (TLS) for Ingresses with `tls`. Each request is routed, sent to
//! `node IP:nodePort` of a node in rotation (round-robin, the next node when one does not
//! accept), with `X-Forwarded-For: <client>, <LB IP>` and `X-Forwarded-Proto`, as GCLB does.
//! Requests it cannot place get a page that says why: 404 (no rule), 503 (no NodePort, no
//! healthy node), 502 (no node accepted).
//!
//! Every backend (a node in rotation × a NodePort an Ingress routes to) is health-checked over
//! HTTP (`GET /` each [`CHECK_EVERY`], healthy on an answer below 400, as GCLB checks an
//! Ingress backend): a Service with no ready pod, or a node with none for an
//! `externalTrafficPolicy: Local` Service, fails it, and requests skip that backend; when no
//! backend of a Service is healthy they get a 503 that says so at once.
//!
//! Upstream connections are kept and reused ([`Pool`], per node address, NodePort and client
//! TOS, so a traced request never rides another's connection): a new connection per request
//! cost half of the throughput. A node withdrawn from rotation is drained: no new request goes
//! to it, requests in flight finish, and its idle connections are closed.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::l7::{Certificate, Route, Site};
use crate::proxy::{ATTEMPTS, CONNECT_TIMEOUT};

type Body = BoxBody<Bytes, hyper::Error>;

/// What one site has answered.
#[derive(Debug, Default)]
pub struct SiteCounters {
    pub requests: AtomicU64,
    pub proxied: AtomicU64,
    pub not_found: AtomicU64,
    pub unavailable: AtomicU64,
    pub bad_gateway: AtomicU64,
}

/// A snapshot of [`SiteCounters`].
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SiteCounts {
    pub requests: u64,
    pub proxied: u64,
    pub not_found: u64,
    pub unavailable: u64,
    pub bad_gateway: u64,
}

impl SiteCounters {
    pub fn snapshot(&self) -> SiteCounts {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SiteCounts {
            requests: l(&self.requests),
            proxied: l(&self.proxied),
            not_found: l(&self.not_found),
            unavailable: l(&self.unavailable),
            bad_gateway: l(&self.bad_gateway),
        }
    }
}

/// What the request handlers read: the site, the nodes in rotation, the kept connections, the
/// backends' health.
struct Live {
    site: Site,
    nodes: Vec<IpAddr>,
    pool: Arc<Pool>,
    health: Arc<BackendHealth>,
}

/// How often each backend is checked.
pub const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The last check of each backend (node address, NodePort): healthy or why not. A backend not
/// checked yet counts as healthy (a new site serves at once).
#[derive(Default)]
pub struct BackendHealth {
    last: RwLock<HashMap<(IpAddr, u16), Result<(), String>>>,
}

impl BackendHealth {
    fn healthy(&self, node: IpAddr, port: u16) -> bool {
        self.last.read().expect("health lock").get(&(node, port)).is_none_or(Result::is_ok)
    }

    /// Every backend's last result, `node:port` → `healthy` or the failure.
    pub fn report(&self) -> BTreeMap<String, String> {
        self.last
            .read()
            .expect("health lock")
            .iter()
            .map(|((n, p), r)| {
                (SocketAddr::new(*n, *p).to_string(), r.clone().err().unwrap_or_else(|| "healthy".into()))
            })
            .collect()
    }
}

/// The NodePorts a site's routes send to.
fn node_ports(site: &Site) -> Vec<u16> {
    let mut ports: Vec<u16> = site
        .rules
        .iter()
        .flat_map(|r| r.paths.iter().map(|p| &p.target))
        .chain(site.default.iter())
        .filter_map(|t| t.node_port)
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Checks every backend of the site as it is now, forever.
async fn check_backends(live: Arc<RwLock<Arc<Live>>>) {
    loop {
        let current = live.read().expect("site lock").clone();
        let ports = node_ports(&current.site);
        let mut checks = tokio::task::JoinSet::new();
        for node in &current.nodes {
            for port in &ports {
                let addr = SocketAddr::new(*node, *port);
                checks.spawn(async move {
                    let get = podpath_client::http::Request::get("/");
                    let r = match podpath_client::http::request(addr, &get, CHECK_TIMEOUT).await {
                        Ok(resp) if resp.status < 400 => Ok(()),
                        Ok(resp) => Err(format!("HTTP {}", resp.status)),
                        Err(e) => Err(e.to_string()),
                    };
                    ((addr.ip(), addr.port()), r)
                });
            }
        }
        let results: Vec<((IpAddr, u16), Result<(), String>)> = checks.join_all().await;
        {
            let mut last = current.health.last.write().expect("health lock");
            for ((node, port), r) in &results {
                let was = last.get(&(*node, *port)).map(Result::is_ok);
                if was != Some(r.is_ok()) {
                    let backend = SocketAddr::new(*node, *port);
                    match r {
                        Ok(()) => tracing::info!(site = %current.site.vip, %backend, "backend healthy"),
                        Err(e) => tracing::info!(site = %current.site.vip, %backend, error = %e, "backend unhealthy"),
                    }
                }
            }
            *last = results.into_iter().collect();
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}

/// How long one check waits for an answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// One kept upstream connection's sending half.
type Upstream<B = Incoming> = hyper::client::conn::http1::SendRequest<B>;

/// Idle upstream HTTP/1.1 connections, keyed by upstream address and client TOS (requests
/// with bodies of type `B`).
pub struct Pool<B = Incoming> {
    idle: Mutex<HashMap<PoolKey, Vec<Upstream<B>>>>,
}

/// An upstream address and the client's TOS.
type PoolKey = (SocketAddr, u32);

impl<B> Default for Pool<B> {
    fn default() -> Self {
        Pool { idle: Mutex::new(HashMap::new()) }
    }
}

/// Idle connections kept per key (more are closed when they come back).
const IDLE_PER_KEY: usize = 64;

impl<B> Pool<B> {
    pub(crate) fn take(&self, key: (SocketAddr, u32)) -> Option<Upstream<B>> {
        let mut idle = self.idle.lock().expect("pool lock");
        let list = idle.get_mut(&key)?;
        while let Some(s) = list.pop() {
            if !s.is_closed() {
                return Some(s);
            }
        }
        None
    }

    pub(crate) fn put(&self, key: (SocketAddr, u32), s: Upstream<B>) {
        let mut idle = self.idle.lock().expect("pool lock");
        let list = idle.entry(key).or_default();
        if !s.is_closed() && list.len() < IDLE_PER_KEY {
            list.push(s);
        }
    }

    /// Closes the idle connections to nodes no longer in rotation (draining them).
    pub(crate) fn keep_only(&self, nodes: &[IpAddr]) {
        self.idle.lock().expect("pool lock").retain(|(addr, _), _| nodes.contains(&addr.ip()));
    }

    /// Idle connections now (status and tests).
    pub fn idle(&self) -> usize {
        self.idle.lock().expect("pool lock").values().map(Vec::len).sum()
    }
}

struct Running {
    live: Arc<RwLock<Arc<Live>>>,
    tasks: Vec<JoinHandle<()>>,
    tls: Option<Certificate>,
    counters: Arc<SiteCounters>,
    /// Why the site's certificate is not the one asked for, if it is not.
    tls_note: Option<String>,
}

/// The running sites, by address.
#[derive(Default)]
pub struct Sites {
    running: BTreeMap<IpAddr, Running>,
}

impl Sites {
    /// Makes the listeners match `sites`, sending to `nodes` (the nodes in rotation). A site
    /// that cannot be bound yet is reported and retried at the next call.
    pub async fn set(&mut self, sites: &[Site], nodes: &[IpAddr]) -> Vec<String> {
        let mut errors = Vec::new();
        self.running.retain(|vip, r| {
            let keep = sites.iter().any(|s| s.vip == *vip && s.tls == r.tls);
            if !keep {
                r.tasks.iter().for_each(JoinHandle::abort);
                tracing::info!(%vip, "stopped L7 site");
            }
            keep
        });
        for site in sites {
            if let Some(r) = self.running.get(&site.vip) {
                let (pool, health) = {
                    let l = r.live.read().expect("site lock");
                    (l.pool.clone(), l.health.clone())
                };
                pool.keep_only(nodes);
                *r.live.write().expect("site lock") =
                    Arc::new(Live { site: site.clone(), nodes: nodes.to_vec(), pool, health });
                continue;
            }
            let live = Arc::new(Live {
                site: site.clone(),
                nodes: nodes.to_vec(),
                pool: Arc::default(),
                health: Arc::default(),
            });
            match start(site, live).await {
                Ok(r) => {
                    tracing::info!(vip = %site.vip, ingress = %site.ingress, https = site.tls.is_some(), "L7 site listening");
                    self.running.insert(site.vip, r);
                }
                Err(e) => errors.push(e),
            }
        }
        errors
    }

    pub fn counts(&self, vip: &IpAddr) -> Option<SiteCounts> {
        self.running.get(vip).map(|r| r.counters.snapshot())
    }

    /// Every backend's last health check of a site (`node:port` → `healthy` or the failure).
    pub fn backend_health(&self, vip: &IpAddr) -> Option<BTreeMap<String, String>> {
        self.running.get(vip).map(|r| r.live.read().expect("site lock").health.report())
    }

    /// Idle upstream connections a site keeps.
    pub fn idle_connections(&self, vip: &IpAddr) -> Option<usize> {
        self.running.get(vip).map(|r| r.live.read().expect("site lock").pool.idle())
    }

    pub fn tls_note(&self, vip: &IpAddr) -> Option<String> {
        self.running.get(vip).and_then(|r| r.tls_note.clone())
    }

    pub fn stop_all(&mut self) {
        for r in self.running.values() {
            r.tasks.iter().for_each(JoinHandle::abort);
        }
        self.running.clear();
    }
}

async fn start(site: &Site, live: Arc<Live>) -> Result<Running, String> {
    let live = Arc::new(RwLock::new(live));
    let counters = Arc::new(SiteCounters::default());
    let http = TcpListener::bind((site.vip, 80)).await.map_err(|e| format!("cannot listen on {}:80: {e}", site.vip))?;
    let mut tasks = vec![
        tokio::spawn(serve(http, None, live.clone(), counters.clone())),
        tokio::spawn(check_backends(live.clone())),
    ];
    let mut tls_note = None;
    if let Some(cert) = &site.tls {
        let (acceptor, note) = tls_acceptor(cert)?;
        tls_note = note;
        let https = match TcpListener::bind((site.vip, 443)).await {
            Ok(l) => l,
            Err(e) => {
                tasks.iter().for_each(JoinHandle::abort);
                return Err(format!("cannot listen on {}:443: {e}", site.vip));
            }
        };
        tasks.push(tokio::spawn(serve(https, Some(acceptor), live.clone(), counters.clone())));
    }
    Ok(Running { live, tasks, tls: site.tls.clone(), counters, tls_note })
}

/// The TLS acceptor of a certificate; a Secret that does not parse falls back to a generated
/// certificate, with a note saying so.
fn tls_acceptor(cert: &Certificate) -> Result<(tokio_rustls::TlsAcceptor, Option<String>), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let (chain, key, note) = match cert {
        Certificate::Secret { secret, cert_pem, key_pem } => {
            let chain: Result<Vec<CertificateDer<'static>>, _> = CertificateDer::pem_slice_iter(cert_pem).collect();
            match (chain, PrivateKeyDer::from_pem_slice(key_pem)) {
                (Ok(chain), Ok(key)) if !chain.is_empty() => (chain, key, None),
                _ => {
                    let (c, k) = generated(&[])?;
                    (c, k, Some(format!("Secret {secret} holds no PEM certificate and key: serving a generated one")))
                }
            }
        }
        Certificate::Generated { names, missing } => {
            let (c, k) = generated(names)?;
            let note = missing.as_ref().map(|s| format!("Secret {s} not found: serving a generated certificate"));
            (c, k, note)
        }
    };
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("unusable certificate: {e}"))?;
    Ok((tokio_rustls::TlsAcceptor::from(Arc::new(config)), note))
}

type Generated = (Vec<rustls::pki_types::CertificateDer<'static>>, rustls::pki_types::PrivateKeyDer<'static>);

fn generated(names: &[String]) -> Result<Generated, String> {
    let mut names = names.to_vec();
    if names.is_empty() {
        names.push("localhost".into());
    }
    let cert = rcgen::generate_simple_self_signed(names).map_err(|e| format!("cannot make a certificate: {e}"))?;
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .map_err(|e| format!("bad generated key: {e}"))?;
    Ok((vec![cert.cert.der().clone()], key))
}

async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    live: Arc<RwLock<Arc<Live>>>,
    counters: Arc<SiteCounters>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((stream, peer)) = listener.accept().await else { continue };
        // A response's head and body can be separate small writes: not held for an ACK.
        let _ = stream.set_nodelay(true);
        let (live, counters, next, tls) = (live.clone(), counters.clone(), next.clone(), tls.clone());
        // Upstream connections keep the client's TOS (what lets a trace follow the request).
        let tos = podpath_client::relay::inbound_tos(&stream);
        tokio::spawn(async move {
            let https = tls.is_some();
            let svc = hyper::service::service_fn(move |req| {
                let current = live.read().expect("site lock").clone();
                handle(req, Client { peer, tos, https }, current, counters.clone(), next.clone())
            });
            let http = hyper::server::conn::http1::Builder::new();
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
                None => {
                    let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                }
            }
        });
    }
}

fn page(code: StatusCode, text: String) -> Response<Body> {
    let body = format!("{} {}\n\n{text}\n", code.as_u16(), code.canonical_reason().unwrap_or(""));
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|never| match never {}).boxed());
    *r.status_mut() = code;
    r.headers_mut().insert("content-type", HeaderValue::from_static("text/plain; charset=utf-8"));
    r.headers_mut().insert("via", HeaderValue::from_static("1.1 podpath-lb-sim"));
    r
}

/// The client connection a request came on.
#[derive(Clone, Copy)]
struct Client {
    peer: SocketAddr,
    tos: u32,
    https: bool,
}

async fn handle(
    mut req: Request<Incoming>,
    Client { peer, tos, https }: Client,
    live: Arc<Live>,
    counters: Arc<SiteCounters>,
    next: Arc<AtomicUsize>,
) -> Result<Response<Body>, Infallible> {
    counters.requests.fetch_add(1, Ordering::Relaxed);
    let host = req
        .headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().host().map(str::to_string))
        .unwrap_or_default();
    let path = req.uri().path().to_string();
    let site = &live.site;
    let target = match site.route(&host, &path) {
        Route::To(t) => t.clone(),
        Route::NotFound => {
            counters.not_found.fetch_add(1, Ordering::Relaxed);
            let text = format!(
                "No rule of Ingress {} matches host {host:?} and path {path:?}, and it has no default backend.",
                site.ingress
            );
            return Ok(page(StatusCode::NOT_FOUND, text));
        }
    };
    let Some(node_port) = target.node_port else {
        counters.unavailable.fetch_add(1, Ordering::Relaxed);
        let text = format!(
            "Service {} port {} has no NodePort: the load balancer reaches Services through their NodePorts \
             (type NodePort or LoadBalancer), or the Service does not exist.",
            target.service, target.port
        );
        return Ok(page(StatusCode::SERVICE_UNAVAILABLE, text));
    };
    if live.nodes.is_empty() {
        counters.unavailable.fetch_add(1, Ordering::Relaxed);
        let text = format!("No healthy node to send {} to (Ingress {}).", target.service, site.ingress);
        return Ok(page(StatusCode::SERVICE_UNAVAILABLE, text));
    }
    let nodes: Vec<IpAddr> = live.nodes.iter().copied().filter(|n| live.health.healthy(*n, node_port)).collect();
    if nodes.is_empty() {
        counters.unavailable.fetch_add(1, Ordering::Relaxed);
        let text = format!(
            "No healthy backend for {}: NodePort {node_port} failed its health check (GET /) on every node in \
             rotation; does the Service have ready pods?",
            target.service
        );
        return Ok(page(StatusCode::SERVICE_UNAVAILABLE, text));
    }
    // As GCLB: the client, then the load balancer's own address.
    let forwarded = match req.headers().get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prior) => format!("{prior}, {}, {}", peer.ip(), site.vip),
        None => format!("{}, {}", peer.ip(), site.vip),
    };
    // Hop-by-hop headers stay on the client's connection (RFC 9110 §7.6.1); upstream, every
    // request is HTTP/1.1 on a kept connection, whatever the client spoke.
    *req.version_mut() = hyper::Version::HTTP_11;
    let headers = req.headers_mut();
    let listed: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()))
        .collect();
    for h in listed.iter().map(String::as_str).chain(["connection", "keep-alive", "proxy-connection", "te", "upgrade"])
    {
        headers.remove(h);
    }
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(if https { "https" } else { "http" }));
    headers.insert("via", HeaderValue::from_static("1.1 podpath-lb-sim"));
    let start = next.fetch_add(1, Ordering::Relaxed);
    let mut last_error = String::new();
    for i in 0..ATTEMPTS.min(nodes.len()) {
        let node = nodes[(start + i) % nodes.len()];
        let addr = SocketAddr::new(node, node_port);
        // A kept connection first; one that closed before the request left hands it back.
        if let Some(mut sender) = live.pool.take((addr, tos)) {
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    counters.proxied.fetch_add(1, Ordering::Relaxed);
                    give_back(live.pool.clone(), (addr, tos), sender);
                    return Ok(resp.map(BodyExt::boxed));
                }
                Err(mut e) => match e.take_message() {
                    Some(r) => req = r,
                    None => {
                        counters.bad_gateway.fetch_add(1, Ordering::Relaxed);
                        let e = e.into_error();
                        return Ok(page(StatusCode::BAD_GATEWAY, format!("{} via {addr} failed: {e}", target.service)));
                    }
                },
            }
        }
        let stream =
            match tokio::time::timeout(CONNECT_TIMEOUT, podpath_client::relay::connect_with_tos(addr, tos)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    s
                }
                Ok(Err(e)) => {
                    last_error = format!("{addr}: {e}");
                    continue;
                }
                Err(_) => {
                    last_error = format!("{addr}: no answer in {} ms", CONNECT_TIMEOUT.as_millis());
                    continue;
                }
            };
        let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await {
            Ok(x) => x,
            Err(e) => {
                last_error = format!("{addr}: {e}");
                continue;
            }
        };
        tokio::spawn(conn);
        // The request body can be sent once: after a connection is made, failures are final.
        return Ok(match sender.send_request(req).await {
            Ok(resp) => {
                counters.proxied.fetch_add(1, Ordering::Relaxed);
                give_back(live.pool.clone(), (addr, tos), sender);
                resp.map(BodyExt::boxed)
            }
            Err(e) => {
                counters.bad_gateway.fetch_add(1, Ordering::Relaxed);
                page(StatusCode::BAD_GATEWAY, format!("{} via {addr} failed: {e}", target.service))
            }
        });
    }
    counters.bad_gateway.fetch_add(1, Ordering::Relaxed);
    let text =
        format!("No node accepted a connection to {} (NodePort {node_port}); last: {last_error}", target.service);
    Ok(page(StatusCode::BAD_GATEWAY, text))
}

/// Returns a connection to the pool once its response has been read to the end (HTTP/1.1
/// carries one exchange at a time); one the upstream closed is dropped.
pub(crate) fn give_back<B: Send + 'static>(pool: Arc<Pool<B>>, key: (SocketAddr, u32), mut sender: Upstream<B>) {
    tokio::spawn(async move {
        if sender.ready().await.is_ok() {
            pool.put(key, sender);
        }
    });
}
