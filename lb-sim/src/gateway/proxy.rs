//! Serves the Gateways' sites: on each `address:port` of a Gateway, HTTP/1.1 and HTTP/2
//! (cleartext with prior knowledge, as gRPC clients speak it, or TLS with ALPN on HTTPS
//! listeners, the certificate chosen by SNI among the listeners'), each request routed by
//! [`super::route`], its filters applied, and sent to an endpoint of the backend its weight
//! picks (HTTP/1.1 upstream; HTTP/2 for GRPCRoutes), with `X-Forwarded-For` and
//! `X-Forwarded-Proto`; RequestMirror filters send a copy to an endpoint of their backend and
//! drop its answer (the request's body is then read whole first, up to
//! [`MIRROR_BODY_LIMIT`]). Answers it makes itself say why: 404 (no route), 500 (the backend
//! is invalid, as the spec asks), 503 (no ready endpoint), 502 (no endpoint accepted), 504
//! (the rule's timeout passed), 413 (a mirrored request's body is too big to copy).

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, HOST};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::plan::{MirrorTo, RouteKind, Site};
use super::route;
use crate::proxy::CONNECT_TIMEOUT;

type Body = BoxBody<Bytes, hyper::Error>;

/// The biggest request body a mirrored request may have (it is held whole to be copied, as
/// Envoy's default buffer limit does).
pub const MIRROR_BODY_LIMIT: usize = 1 << 20;

/// How long a mirror's copy may take; its answer is dropped anyway.
const MIRROR_TIMEOUT: Duration = Duration::from_secs(10);

/// One routing decision of a Gateway: what a request matched and where it went.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Milliseconds since the epoch.
    pub at: u64,
    pub gateway: String,
    pub client: String,
    /// The client connection's TOS (a trace's probe has its own).
    pub tos: u32,
    pub host: String,
    pub path: String,
    pub listener: Option<String>,
    /// `HTTPRoute NS/NAME rule I: MATCH`.
    pub rule: Option<String>,
    pub filters: Vec<String>,
    /// `NS/NAME:PORT (weight W of T)`.
    pub backend: Option<String>,
    pub endpoint: Option<String>,
    pub status: u16,
}

/// A decision as the proxy notes it: indices into the site it was made on, put into words only
/// when read (formatting every request's would cost more than routing it).
struct Noted {
    at: std::time::SystemTime,
    site: Arc<Site>,
    client: SocketAddr,
    tos: u32,
    host: String,
    uri: hyper::Uri,
    /// (listener, rule, match) indices in `site`.
    matched: Option<(usize, usize, usize)>,
    /// The backend's index in the rule.
    backend: Option<usize>,
    endpoint: Option<SocketAddr>,
    status: u16,
}

impl Noted {
    fn new(site: Arc<Site>, client: SocketAddr, tos: u32) -> Noted {
        Noted {
            at: std::time::SystemTime::now(),
            site,
            client,
            tos,
            host: String::new(),
            uri: hyper::Uri::default(),
            matched: None,
            backend: None,
            endpoint: None,
            status: 0,
        }
    }

    fn words(&self) -> Decision {
        let site = &self.site;
        let mut d = Decision {
            at: self.at.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0),
            gateway: site.gateway.clone(),
            client: self.client.to_string(),
            tos: self.tos,
            host: self.host.clone(),
            path: self.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/").to_string(),
            endpoint: self.endpoint.map(|e| e.to_string()),
            status: self.status,
            ..Default::default()
        };
        let Some((li, ri, mi)) = self.matched else { return d };
        let Some(l) = site.listeners.get(li) else { return d };
        d.listener = Some(l.name.clone());
        let Some(rule) = l.rules.get(ri) else { return d };
        if let Some(m) = rule.matches.get(mi) {
            d.rule = Some(format!(
                "{} {} rule {}: {}",
                rule.kind.as_str(),
                rule.route,
                rule.index,
                route::describe_match(m)
            ));
        }
        let route_ns = rule.route.split('/').next().unwrap_or("");
        d.filters = route::applied(&rule.filters, route_ns);
        if let Some(b) = self.backend.and_then(|i| rule.backends.get(i)) {
            d.filters.extend(route::applied(&b.filters, route_ns));
            let total = route::total_weight(&rule.backends);
            d.backend = Some(format!("{}:{} (weight {} of {total})", b.service, b.port, b.weight));
        }
        d
    }
}

/// The last decisions of every Gateway site (a few dozen, for traces).
#[derive(Default)]
pub struct Decisions(std::sync::Mutex<std::collections::VecDeque<Noted>>);

const DECISIONS_KEPT: usize = 64;

impl Decisions {
    fn record(&self, d: Noted) {
        if let Ok(mut q) = self.0.lock() {
            if q.len() == DECISIONS_KEPT {
                q.pop_front();
            }
            q.push_back(d);
        }
    }

    pub fn recent(&self) -> Vec<Decision> {
        self.0.lock().map(|q| q.iter().map(Noted::words).collect()).unwrap_or_default()
    }
}

/// What a site has answered (the status page shows it).
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub proxied: AtomicU64,
    pub redirected: AtomicU64,
    pub not_found: AtomicU64,
    pub failed: AtomicU64,
}

struct Running {
    site: Arc<RwLock<Arc<Site>>>,
    task: JoinHandle<()>,
    certs: Vec<super::plan::Cert>,
    https: bool,
    counters: Arc<Counters>,
}

/// The running Gateway sites, by address and port.
#[derive(Default)]
pub struct GatewaySites {
    running: BTreeMap<(IpAddr, u16), Running>,
    pub decisions: Arc<Decisions>,
    pools: Arc<Pools>,
}

impl GatewaySites {
    /// Makes the listeners match `sites`; a site that cannot be bound is reported and retried
    /// at the next call.
    pub async fn set(&mut self, sites: &[Site]) -> Vec<String> {
        let mut errors = Vec::new();
        // Kept connections only to endpoints still in use.
        let endpoints: Vec<IpAddr> = sites
            .iter()
            .flat_map(|s| &s.listeners)
            .flat_map(|l| &l.rules)
            .flat_map(|r| &r.backends)
            .flat_map(|b| b.endpoints.iter().map(|e| e.ip()))
            .collect();
        self.pools.http1.keep_only(&endpoints);
        if let Ok(mut m) = self.pools.h2.lock() {
            m.retain(|(addr, _), s| endpoints.contains(&addr.ip()) && !s.is_closed());
        }
        self.running.retain(|key, r| {
            let keep = sites.iter().any(|s| (s.vip, s.port) == *key && s.https == r.https && s.certs == r.certs);
            if !keep {
                r.task.abort();
                tracing::info!(vip = %key.0, port = key.1, "stopped Gateway site");
            }
            keep
        });
        for site in sites {
            let key = (site.vip, site.port);
            if let Some(r) = self.running.get(&key) {
                *r.site.write().expect("site lock") = Arc::new(site.clone());
                continue;
            }
            let listener = match TcpListener::bind(key).await {
                Ok(l) => l,
                Err(e) => {
                    errors.push(format!("cannot listen on {}:{} (Gateway {}): {e}", site.vip, site.port, site.gateway));
                    continue;
                }
            };
            let acceptor = match site.https {
                true => match acceptor(site) {
                    Ok(a) => Some(a),
                    Err(e) => {
                        errors.push(format!("Gateway {} port {}: {e}", site.gateway, site.port));
                        continue;
                    }
                },
                false => None,
            };
            let shared = Arc::new(RwLock::new(Arc::new(site.clone())));
            let counters = Arc::new(Counters::default());
            let task = tokio::spawn(serve(
                listener,
                acceptor,
                shared.clone(),
                counters.clone(),
                self.decisions.clone(),
                self.pools.clone(),
            ));
            tracing::info!(gateway = %site.gateway, vip = %site.vip, port = site.port, https = site.https, "Gateway site listening");
            self.running
                .insert(key, Running { site: shared, task, certs: site.certs.clone(), https: site.https, counters });
        }
        errors
    }

    /// Requests answered on an address and port: (requests, proxied, redirected, not found, failed).
    pub fn counts(&self, vip: IpAddr, port: u16) -> Option<[u64; 5]> {
        self.running.get(&(vip, port)).map(|r| {
            let c = &r.counters;
            let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
            [l(&c.requests), l(&c.proxied), l(&c.redirected), l(&c.not_found), l(&c.failed)]
        })
    }

    pub fn stop_all(&mut self) {
        for r in self.running.values() {
            r.task.abort();
        }
        self.running.clear();
    }
}

/// Chooses a listener's certificate by the client's SNI: the listener hostname that matches
/// it best, else the first.
#[derive(Debug)]
struct BySni {
    certs: Vec<(Option<String>, Arc<rustls::sign::CertifiedKey>)>,
}

impl rustls::server::ResolvesServerCert for BySni {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<rustls::sign::CertifiedKey>> {
        let sni = hello.server_name().unwrap_or("");
        let best = self
            .certs
            .iter()
            .filter(|(h, _)| h.as_deref().is_none_or(|h| super::plan::host_matches(h, sni)))
            .max_by_key(|(h, _)| match h.as_deref() {
                None => 0,
                Some(h) if h.starts_with("*.") => 1,
                Some(_) => 2,
            });
        best.or(self.certs.first()).map(|(_, k)| k.clone())
    }
}

fn acceptor(site: &Site) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut certs = Vec::new();
    for c in &site.certs {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&c.cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("Secret {}: {e}", c.secret))?;
        let key = PrivateKeyDer::from_pem_slice(&c.key_pem).map_err(|e| format!("Secret {}: {e}", c.secret))?;
        let signer = provider.key_provider.load_private_key(key).map_err(|e| format!("Secret {}: {e}", c.secret))?;
        certs.push((c.hostname.clone(), Arc::new(rustls::sign::CertifiedKey::new(chain, signer))));
    }
    if certs.is_empty() {
        return Err("no usable certificate".into());
    }
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(BySni { certs }));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

async fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    site: Arc<RwLock<Arc<Site>>>,
    counters: Arc<Counters>,
    decisions: Arc<Decisions>,
    pools: Arc<Pools>,
) {
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let Ok((stream, peer)) = listener.accept().await else { continue };
        // Answers go out as soon as they are written (a response's head and body may be two
        // writes).
        let _ = stream.set_nodelay(true);
        let (site, counters, next, tls) = (site.clone(), counters.clone(), next.clone(), tls.clone());
        let decisions = decisions.clone();
        let pools = pools.clone();
        let tos = podpath_client::relay::inbound_tos(&stream);
        tokio::spawn(async move {
            let https = tls.is_some();
            let svc = hyper::service::service_fn(move |req| {
                let current = site.read().expect("site lock").clone();
                let (counters, next, decisions, pools) =
                    (counters.clone(), next.clone(), decisions.clone(), pools.clone());
                async move {
                    let mut noted = Noted::new(current.clone(), peer, tos);
                    let resp = handle(req, peer, tos, https, current, counters, next, pools, &mut noted).await;
                    if let Ok(r) = &resp {
                        noted.status = r.status().as_u16();
                    }
                    decisions.record(noted);
                    resp
                }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            match tls {
                Some(acceptor) => {
                    if let Ok(stream) = acceptor.accept(stream).await {
                        let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
                None => {
                    let _ = builder.serve_connection(TokioIo::new(stream), svc).await;
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
    r
}

/// A Go-style duration (`10s`, `1.5s`, `500ms`, `1m`) as the Gateway API writes timeouts.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = s.trim();
    if rest == "0" {
        return Some(total);
    }
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let value: f64 = rest[..num_end].parse().ok()?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let secs = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            _ => return None,
        };
        total += Duration::from_secs_f64(value * secs);
        rest = &rest[unit_end..];
    }
    Some(total)
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    tos: u32,
    https: bool,
    site: Arc<Site>,
    counters: Arc<Counters>,
    next: Arc<AtomicUsize>,
    pools: Arc<Pools>,
    noted: &mut Noted,
) -> Result<Response<Body>, Infallible> {
    counters.requests.fetch_add(1, Ordering::Relaxed);
    let (mut parts, body) = req.into_parts();
    let host_header = parts
        .headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    let host: &str =
        host_header.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map(|(h, _)| h).unwrap_or(&host_header);
    noted.host = host.to_string();
    let path = parts.uri.path();
    let query = parts.uri.query().unwrap_or("");
    let r = route::Request { host, method: parts.method.as_str(), path, query, headers: &parts.headers };
    noted.uri = parts.uri.clone();
    let Some(m) = route::route(&site, &r) else {
        counters.not_found.fetch_add(1, Ordering::Relaxed);
        let text = format!("No route of Gateway {} matches host {host:?} and path {path:?}.", site.gateway);
        return Ok(page(StatusCode::NOT_FOUND, text));
    };
    noted.matched = Some(m.at);
    let route_ns = m.rule.route.split('/').next().unwrap_or("");
    let mut fx = route::effects(&m.rule.filters, &m.matched.path, &r, https, site.port, route_ns);
    if let Some((code, location)) = &fx.redirect {
        counters.redirected.fetch_add(1, Ordering::Relaxed);
        let mut resp =
            page(StatusCode::from_u16(*code).unwrap_or(StatusCode::FOUND), format!("Redirected to {location}"));
        if let Ok(v) = HeaderValue::from_str(location) {
            resp.headers_mut().insert("location", v);
        }
        return Ok(resp);
    }
    let total = route::total_weight(&m.rule.backends);
    let roll = fastrand::u32(0..total.max(1));
    let picked = route::pick(&m.rule.backends, roll);
    noted.backend = picked.and_then(|b| m.rule.backends.iter().position(|x| std::ptr::eq(x, b)));
    let Some(backend) = picked else {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return Ok(page(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Rule {} of {} {} has no backend with a weight.", m.rule.index, m.rule.kind.as_str(), m.rule.route),
        ));
    };
    if let Some(problem) = &backend.problem {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return Ok(page(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{} {}: {problem}", m.rule.kind.as_str(), m.rule.route),
        ));
    }
    if backend.endpoints.is_empty() {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return Ok(page(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("Service {} port {} has no ready endpoint.", backend.service, backend.port),
        ));
    }
    // The backend's own filters come after the rule's.
    if !backend.filters.is_empty() {
        let backend_fx = route::effects(&backend.filters, &m.matched.path, &r, https, site.port, route_ns);
        fx.request_headers.extend(backend_fx.request_headers);
        fx.response_headers.extend(backend_fx.response_headers);
    }
    let grpc = m.rule.kind == RouteKind::Grpc;
    // The request's target: rewritten, else as it came (HTTP/2 takes :scheme and :authority
    // from an absolute URI, and has no Host header).
    let authority = fx.host.as_deref().unwrap_or(&host_header);
    let target = fx.path.as_deref().or_else(|| parts.uri.path_and_query().map(|p| p.as_str())).unwrap_or("/");
    let uri = if grpc { format!("http://{authority}{target}").parse() } else { target.parse() };
    let Ok(uri) = uri else {
        counters.failed.fetch_add(1, Ordering::Relaxed);
        return Ok(page(StatusCode::BAD_REQUEST, "the request cannot be forwarded".into()));
    };
    let headers = &mut parts.headers;
    let forwarded = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prior) => format!("{prior}, {}", peer.ip()),
        None => peer.ip().to_string(),
    };
    for hop in ["connection", "keep-alive", "proxy-connection", "upgrade", "transfer-encoding"] {
        headers.remove(hop);
    }
    if !grpc {
        headers.remove("te");
    }
    route::modify_headers(headers, &fx.request_headers);
    if let Ok(v) = HeaderValue::from_str(&forwarded) {
        headers.insert("x-forwarded-for", v);
    }
    headers.insert("x-forwarded-proto", HeaderValue::from_static(if https { "https" } else { "http" }));
    if grpc {
        headers.remove(HOST);
    } else if let Ok(v) = HeaderValue::from_str(authority) {
        headers.insert(HOST, v);
    }
    parts.uri = uri;
    parts.version = if grpc { hyper::Version::HTTP_2 } else { hyper::Version::HTTP_11 };
    // Which mirrors get this request (each by its percentage).
    let mirrored: Vec<&MirrorTo> = m
        .rule
        .mirrors
        .iter()
        .chain(&backend.mirrors)
        .filter(|mt| mt.percent >= 100.0 || fastrand::f64() * 100.0 < mt.percent)
        .collect();
    let (body, copy): (Body, Option<Bytes>) = if mirrored.is_empty() {
        (body.boxed(), None)
    } else {
        match Limited::new(body, MIRROR_BODY_LIMIT).collect().await {
            Ok(c) => {
                let bytes = c.to_bytes();
                (full(bytes.clone()), Some(bytes))
            }
            Err(e) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                let (code, text) = if e.is::<http_body_util::LengthLimitError>() {
                    (
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!(
                            "A mirrored request's body is held whole to be copied: at most {MIRROR_BODY_LIMIT} bytes."
                        ),
                    )
                } else {
                    (StatusCode::BAD_REQUEST, format!("the request's body could not be read: {e}"))
                };
                return Ok(page(code, text));
            }
        }
    };
    let upstream_req = Request::from_parts(parts, body);
    let timeout = m
        .rule
        .timeouts
        .as_ref()
        .and_then(|t| t.backend_request.as_deref().or(t.request.as_deref()))
        .and_then(parse_duration)
        .filter(|d| !d.is_zero());
    if let Some(bytes) = copy {
        for mt in mirrored {
            send_copy(&upstream_req, bytes.clone(), mt, tos, grpc, pools.clone());
        }
    }
    let start = next.fetch_add(1, Ordering::Relaxed);
    let endpoint = backend.endpoints[start % backend.endpoints.len()];
    noted.endpoint = Some(endpoint);
    let send = forward(upstream_req, endpoint, tos, grpc, &pools);
    let result = match timeout {
        Some(t) => match tokio::time::timeout(t, send).await {
            Ok(r) => r,
            Err(_) => {
                counters.failed.fetch_add(1, Ordering::Relaxed);
                return Ok(page(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!("{endpoint} ({}) did not answer within {t:?}", backend.service),
                ));
            }
        },
        None => send.await,
    };
    match result {
        Ok(mut resp) => {
            counters.proxied.fetch_add(1, Ordering::Relaxed);
            route::modify_headers(resp.headers_mut(), &fx.response_headers);
            Ok(resp.map(BodyExt::boxed))
        }
        Err(e) => {
            counters.failed.fetch_add(1, Ordering::Relaxed);
            Ok(page(StatusCode::BAD_GATEWAY, format!("{endpoint} ({}): {e}", backend.service)))
        }
    }
}

fn full(bytes: Bytes) -> Body {
    Full::new(bytes).map_err(|never| match never {}).boxed()
}

/// Sends a copy of `req` (its body `bytes`) to an endpoint of a mirror's backend, in the
/// background; the answer is read and dropped, failures only logged.
fn send_copy(req: &Request<Body>, bytes: Bytes, mt: &MirrorTo, tos: u32, grpc: bool, pools: Arc<Pools>) {
    let b = &mt.backend;
    if b.problem.is_some() || b.endpoints.is_empty() {
        tracing::debug!(service = %b.service, "mirror has no usable endpoint; copy not sent");
        return;
    }
    let endpoint = b.endpoints[fastrand::usize(..b.endpoints.len())];
    let mut copy = Request::new(full(bytes));
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    let service = b.service.clone();
    tokio::spawn(async move {
        match tokio::time::timeout(MIRROR_TIMEOUT, forward(copy, endpoint, tos, grpc, &pools)).await {
            // Read to the end, so that the connection can be kept.
            Ok(Ok(resp)) => {
                let _ = resp.into_body().collect().await;
            }
            Ok(Err(e)) => tracing::debug!(%service, %endpoint, "mirrored copy failed: {e}"),
            Err(_) => tracing::debug!(%service, %endpoint, "mirrored copy timed out"),
        }
    });
}

/// Kept upstream connections: HTTP/1.1 ones per endpoint and client TOS (one exchange at a
/// time each), HTTP/2 ones per endpoint and TOS (many streams on one).
#[derive(Default)]
pub struct Pools {
    http1: Arc<crate::l7_proxy::Pool<Body>>,
    h2: std::sync::Mutex<HashMap<(SocketAddr, u32), hyper::client::conn::http2::SendRequest<Body>>>,
}

/// Sends a request to one endpoint, on a kept connection when there is one (HTTP/2 with prior
/// knowledge for gRPC); a kept connection that closed before the request left hands it back.
async fn forward(
    mut req: Request<Body>,
    endpoint: SocketAddr,
    tos: u32,
    h2: bool,
    pools: &Pools,
) -> Result<Response<Incoming>, String> {
    let key = (endpoint, tos);
    if h2 {
        let kept = pools.h2.lock().ok().and_then(|m| m.get(&key).cloned()).filter(|s| !s.is_closed());
        if let Some(mut sender) = kept {
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(resp),
                Err(mut e) => match e.take_message() {
                    Some(r) => req = r,
                    None => return Err(e.into_error().to_string()),
                },
            }
        }
    } else if let Some(mut sender) = pools.http1.take(key) {
        match sender.try_send_request(req).await {
            Ok(resp) => {
                crate::l7_proxy::give_back(pools.http1.clone(), key, sender);
                return Ok(resp);
            }
            Err(mut e) => match e.take_message() {
                Some(r) => req = r,
                None => return Err(e.into_error().to_string()),
            },
        }
    }
    let stream =
        match tokio::time::timeout(CONNECT_TIMEOUT, podpath_client::relay::connect_with_tos(endpoint, tos)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                s
            }
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err(format!("no answer in {} ms", CONNECT_TIMEOUT.as_millis())),
        };
    if h2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        if let Ok(mut m) = pools.h2.lock() {
            m.retain(|_, s| !s.is_closed());
            m.insert(key, sender.clone());
        }
        sender.send_request(req).await.map_err(|e| e.to_string())
    } else {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        crate::l7_proxy::give_back(pools.http1.clone(), key, sender);
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::super::plan::{Backend, ListenerSite, Match, PathRule, Rule};
    use super::super::types::{HttpRouteFilter, Timeouts};
    use super::*;
    use tokio::sync::mpsc;

    /// A backend on loopback that answers `name PATH` after `delay`, and reports each request
    /// (method, path, body) it got.
    async fn backend(
        name: &'static str,
        delay: Duration,
    ) -> (SocketAddr, mpsc::UnboundedReceiver<(String, String, Bytes)>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { return };
                let tx = tx.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let (method, path) = (req.method().to_string(), req.uri().to_string());
                            let body = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
                            let _ = tx.send((method, path.clone(), body));
                            tokio::time::sleep(delay).await;
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!("{name} {path}")))))
                        }
                    });
                    let _ =
                        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
                });
            }
        });
        (addr, rx)
    }

    fn to(service: &str, endpoint: SocketAddr) -> Backend {
        Backend {
            service: service.into(),
            port: 80,
            weight: 1,
            endpoints: vec![endpoint],
            problem: None,
            filters: vec![],
            mirrors: vec![],
        }
    }

    fn rule(filters: serde_json::Value, backend: Backend, mirrors: Vec<MirrorTo>, timeouts: Option<Timeouts>) -> Rule {
        Rule {
            kind: RouteKind::Http,
            route: "app/r".into(),
            created: String::new(),
            index: 0,
            name: None,
            hostnames: vec![],
            matches: vec![Match {
                path: PathRule::Prefix("/api".into()),
                method: None,
                headers: vec![],
                query: vec![],
            }],
            filters: serde_json::from_value::<Vec<HttpRouteFilter>>(filters).unwrap(),
            backends: vec![backend],
            mirrors,
            timeouts,
        }
    }

    /// Serves one rule on a loopback port; returns the site's address.
    async fn serve_rule(sites: &mut GatewaySites, rule: Rule) -> SocketAddr {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let site = Site {
            gateway: "infra/gw".into(),
            vip: IpAddr::from([127, 0, 0, 1]),
            port,
            https: false,
            certs: vec![],
            listeners: vec![ListenerSite { name: "http".into(), hostname: None, https: false, rules: vec![rule] }],
        };
        assert_eq!(sites.set(std::slice::from_ref(&site)).await, Vec::<String>::new());
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    async fn send(addr: SocketAddr, method: &str, path: &str, body: Vec<u8>) -> (StatusCode, String) {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, "web.example")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status();
        let text = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&text).into_owned())
    }

    /// Upstream HTTPRouteRequestMirror: the backend answers, the mirror gets the same request
    /// (method, rewritten path, body) and its answer is not seen.
    #[tokio::test]
    async fn a_mirror_gets_a_copy_of_the_request() {
        let (main, mut main_rx) = backend("main", Duration::ZERO).await;
        let (shadow, mut shadow_rx) = backend("shadow", Duration::ZERO).await;
        let filters = serde_json::json!([
            {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2"}}},
            {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "shadow", "port": 80}}}]);
        let mirror = MirrorTo { backend: to("app/shadow", shadow), percent: 100.0 };
        let mut sites = GatewaySites::default();
        let addr = serve_rule(&mut sites, rule(filters, to("app/main", main), vec![mirror], None)).await;
        let (status, text) = send(addr, "POST", "/api/items?x=1", b"hello".to_vec()).await;
        assert_eq!((status, text.as_str()), (StatusCode::OK, "main /v2/items?x=1"));
        let got = main_rx.recv().await.unwrap();
        let copy = tokio::time::timeout(Duration::from_secs(5), shadow_rx.recv()).await.unwrap().unwrap();
        assert_eq!(copy, got);
        assert_eq!(copy, ("POST".to_string(), "/v2/items?x=1".to_string(), Bytes::from_static(b"hello")));
        let d = sites.decisions.recent().pop().unwrap();
        assert_eq!(d.filters, ["URLRewrite", "RequestMirror to app/shadow:80"]);
        // A body too big to hold for the copy is refused, and nothing is sent.
        let (status, text) = send(addr, "POST", "/api/big", vec![b'x'; MIRROR_BODY_LIMIT + 1]).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{text}");
        assert!(main_rx.try_recv().is_err() && shadow_rx.try_recv().is_err());
        sites.stop_all();
    }

    /// A mirror at 0 percent gets nothing; at 50 about half (HTTPRouteRequestPercentageMirror).
    #[tokio::test]
    async fn a_mirror_takes_its_percentage() {
        let (main, _main_rx) = backend("main", Duration::ZERO).await;
        let (never, mut never_rx) = backend("never", Duration::ZERO).await;
        let (half, mut half_rx) = backend("half", Duration::ZERO).await;
        let mirrors = vec![
            MirrorTo { backend: to("app/never", never), percent: 0.0 },
            MirrorTo { backend: to("app/half", half), percent: 50.0 },
        ];
        let mut sites = GatewaySites::default();
        let addr = serve_rule(&mut sites, rule(serde_json::json!([]), to("app/main", main), mirrors, None)).await;
        let n = 200;
        for i in 0..n {
            assert_eq!(send(addr, "GET", &format!("/api/{i}"), vec![]).await.0, StatusCode::OK);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut halves = 0;
        while half_rx.try_recv().is_ok() {
            halves += 1;
        }
        assert!(never_rx.try_recv().is_err());
        // Binomial(200, 0.5): 60..140 holds with overwhelming probability.
        assert!((60..=140).contains(&halves), "{halves} of {n}");
        sites.stop_all();
    }

    /// Upstream HTTPRouteTimeoutRequest / HTTPRouteTimeoutBackendRequest: an answer slower than
    /// the rule's timeout is a 504; a faster one passes.
    #[tokio::test]
    async fn a_slow_backend_past_the_rules_timeout_is_a_504() {
        let (slow, _rx) = backend("slow", Duration::from_millis(400)).await;
        let timeouts = Timeouts { request: Some("100ms".into()), backend_request: None };
        let mut sites = GatewaySites::default();
        let addr =
            serve_rule(&mut sites, rule(serde_json::json!([]), to("app/slow", slow), vec![], Some(timeouts))).await;
        let (status, text) = send(addr, "GET", "/api/x", vec![]).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{text}");
        assert!(text.contains("did not answer within 100ms"), "{text}");
        let timeouts = Timeouts { request: Some("2s".into()), backend_request: None };
        let addr =
            serve_rule(&mut sites, rule(serde_json::json!([]), to("app/slow", slow), vec![], Some(timeouts))).await;
        assert_eq!(send(addr, "GET", "/api/x", vec![]).await.0, StatusCode::OK);
        sites.stop_all();
    }

    #[test]
    fn durations_as_the_gateway_api_writes_them() {
        assert_eq!(parse_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(parse_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("0s"), Some(Duration::ZERO));
        assert_eq!(parse_duration("10x"), None);
    }
}
