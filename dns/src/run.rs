//! The server process: the Corefile loaded (from flags, a file or a ConfigMap) and reloaded,
//! the zone kept current from the API's Services and EndpointSlices (watched through the
//! client crate's reflectors, each object reduced to what DNS needs as it arrives and applied
//! to the zone at once), served on UDP and TCP. Plugin messages go to stdout in CoreDNS's
//! words (`[INFO] Reloading`, the `log` and `errors` lines), the process's own to stderr.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use podpath_client::grpc::ApiClient;
use podpath_client::reflector::{self, Change, Filter, Sink, Store};
use tokio::sync::watch;

use crate::error::{DnsError, Result};
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::records::{Config, ServiceRecord, SliceRecord, Zone};
use crate::server::{Handler, SharedPipeline, SharedZone};

/// Where the Corefile comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A Corefile made from flags (no reload: it never changes).
    Builtin(String),
    /// A file (CoreDNS's `-conf`), read again by `reload`.
    File(PathBuf),
    /// The key `Corefile` of a ConfigMap, watched through the API: what kubelet would mount
    /// as `/etc/coredns/Corefile` for a CoreDNS pod.
    ConfigMap { namespace: String, name: String },
}

/// Where to listen and whom to ask.
pub struct Options {
    pub apiserver: String,
    pub token: Option<String>,
    pub ca: Option<String>,
    pub listen: SocketAddr,
    pub source: Source,
}

/// Serves `path` on `addr` with `body` as its text.
async fn http(
    addr: SocketAddr,
    path: &'static str,
    body: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> Result<()> {
    let listener = podpath_client::daemon::bind_any(addr, tokio::net::TcpListener::bind)
        .await
        .map_err(|(a, e)| DnsError::Bind(a, e))?;
    let app = axum::Router::new().route(
        path,
        axum::routing::get(move || {
            let body = body.clone();
            async move { body() }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(%addr, "{path} stopped: {e}");
        }
    });
    Ok(())
}

/// The hex SHA-512 of a Corefile, as the reload plugin prints it.
pub fn sha512(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha512::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the Corefile's current text from its source (None: not there yet).
struct Reader {
    source: Source,
    config_maps: Option<Arc<Store<ConfigMap>>>,
}

impl Reader {
    fn name(&self) -> &'static str {
        "Corefile"
    }

    fn read(&self) -> std::result::Result<Option<String>, String> {
        match &self.source {
            Source::Builtin(t) => Ok(Some(t.clone())),
            Source::File(p) => std::fs::read_to_string(p).map(Some).map_err(|e| format!("{}: {e}", p.display())),
            Source::ConfigMap { namespace, name } => {
                let Some(cm) = self.config_maps.as_ref().and_then(|s| s.get(&format!("{namespace}/{name}"))) else {
                    return Ok(None);
                };
                match cm.data.as_ref().and_then(|d| d.get("Corefile")) {
                    Some(t) => Ok(Some(t.clone())),
                    None => Err(format!("the ConfigMap {namespace}/{name} has no key \"Corefile\"")),
                }
            }
        }
    }
}

fn load(text: &str, file: &str, listen: SocketAddr) -> std::result::Result<Pipeline, crate::corefile::CorefileError> {
    Pipeline::build(text, file, listen, &|p| std::fs::read_to_string(p))
}

/// The server as its binary runs it, on a single-threaded runtime of its own, until SIGTERM or
/// SIGINT. A plain function, neither generic nor async, so the whole server is compiled once, in
/// this crate: a release build compiles generic and async code again in every crate that
/// instantiates it, and the binary would compile all of [`run`] a second time.
pub fn run_until_signal(opts: Options) -> Result<()> {
    podpath_client::daemon::block_on(0, run(opts, podpath_client::daemon::stop_signal()))
        .map_err(|e| DnsError::Serve(format!("cannot start the async runtime: {e}")))?
}

/// Binds the sockets first (a wrong address fails at once), then serves until `shutdown`.
pub async fn run(opts: Options, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    // `0.0.0.0` (a Corefile's `:53`) is every address of both families, as CoreDNS's `:53`.
    let (udp, tcp) = podpath_client::daemon::bind_any(opts.listen, |a| async move {
        Ok((tokio::net::UdpSocket::bind(a).await?, tokio::net::TcpListener::bind(a).await?))
    })
    .await
    .map_err(|(a, e)| DnsError::Bind(a, e))?;
    let connect = || async {
        ApiClient::connect_patiently(&opts.apiserver, opts.token.as_deref(), opts.ca.as_deref(), None)
            .await
            .map_err(|e| DnsError::Api(e.to_string()))
    };
    // A Corefile of a file or of flags is checked before the API is asked anything: a bad
    // one ends the process at once. One of a ConfigMap needs the API first.
    let (client, reader, text) = match &opts.source {
        Source::ConfigMap { namespace, name } => {
            let client = connect().await?;
            let store = Store::<ConfigMap>::new();
            let filter = Filter {
                namespace: namespace.clone(),
                field_selector: format!("metadata.name={name}"),
                ..Filter::default()
            };
            tokio::spawn(reflector::run(client.clone(), filter, store.clone()));
            store.wait_synced().await;
            let reader = Reader { source: opts.source.clone(), config_maps: Some(store) };
            // Wait for the ConfigMap, as a CoreDNS pod waits for its volume.
            let mut waited = false;
            let text = loop {
                match reader.read().map_err(DnsError::Config)? {
                    Some(t) => break t,
                    None => {
                        if !waited {
                            tracing::info!("waiting for the ConfigMap {namespace}/{name}");
                            waited = true;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            };
            (Some(client), reader, text)
        }
        _ => {
            let reader = Reader { source: opts.source.clone(), config_maps: None };
            let text = reader.read().map_err(DnsError::Config)?.unwrap_or_default();
            (None, reader, text)
        }
    };
    let pipeline = load(&text, reader.name(), opts.listen).map_err(|e| DnsError::Config(e.to_string()))?;
    let client = match client {
        Some(c) => c,
        None => connect().await?,
    };
    for b in &pipeline.corefile.servers {
        for z in &b.zones {
            println!("{z}:{}", b.port.unwrap_or(opts.listen.port()));
        }
    }
    println!("podpath-dns-{}", env!("CARGO_PKG_VERSION"));
    if pipeline.reload.is_some() {
        println!("[INFO] plugin/reload: Running configuration SHA512 = {}", sha512(&text));
    }
    let zone_cfg = pipeline.zone.clone().unwrap_or_else(|| Config::new("cluster.local", 5).expect("a valid domain"));
    let domain = zone_cfg.domain.to_string();
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = pipeline.prometheus {
        let (m, zone) = (metrics.clone(), domain.clone());
        http(addr, "/metrics", move || m.render(&zone)).await?;
    }
    if let Some(addr) = pipeline.health {
        http(addr, "/health", || "OK".to_string()).await?;
    }
    let (ready_addr, probe) = (pipeline.ready, pipeline.loop_probe.as_ref().map(|p| (p.name.clone(), p.target)));
    let lameduck = pipeline.lameduck;
    let shared = SharedZone::new(Zone::new(zone_cfg));
    let pipeline = SharedPipeline::new(pipeline);
    let services = Arc::new(Feed::new(shared.clone()));
    let slices = Arc::new(Feed::new(shared.clone()));
    tokio::spawn(reflector::run_mapped(client.clone(), Filter::default(), services.clone(), |s: Service| {
        ServiceRecord::of(&s)
    }));
    tokio::spawn(reflector::run_mapped(client.clone(), Filter::default(), slices.clone(), |s: EndpointSlice| {
        SliceRecord::of(&s)
    }));
    services.wait_synced().await;
    slices.wait_synced().await;
    if let Some(addr) = ready_addr {
        http(addr, "/ready", || "OK".to_string()).await?;
    }
    let mut server = hickory_server::Server::new(Handler { zone: shared.clone(), metrics, pipeline: pipeline.clone() });
    server.register_socket(udp);
    server.register_listener(tcp, Duration::from_secs(10), 64 << 10);
    tracing::info!(listen = %opts.listen, domain = %domain, "serving");
    if let Some(p) = probe {
        tokio::spawn(loop_probe(p.0, p.1));
    }
    if !matches!(opts.source, Source::Builtin(_)) {
        tokio::spawn(reload(reader, pipeline, shared, opts.listen));
    }
    tokio::select! {
        r = server.block_until_done() => r.map_err(|e| DnsError::Serve(e.to_string())),
        _ = shutdown => {
            if !lameduck.is_zero() {
                // The health plugin's lameduck: still answering while clients move on.
                println!("[INFO] plugin/health: Going into lameduck mode for {}s", lameduck.as_secs_f64());
                tokio::time::sleep(lameduck).await;
            }
            let _ = server.shutdown_gracefully().await;
            Ok(())
        }
    }
}

/// The `reload` plugin: every interval (± jitter) the Corefile is read again; a changed one is
/// loaded and swapped in, a broken one logged and the running one kept. Without `reload` in
/// the running Corefile nothing is reloaded, as in CoreDNS.
async fn reload(reader: Reader, pipeline: SharedPipeline, zone: SharedZone, listen: SocketAddr) {
    let mut failed: Option<String> = None;
    loop {
        let current = pipeline.get();
        let Some((interval, jitter)) = current.reload else { return };
        let j = jitter.as_millis() as u64;
        let spread = if j == 0 { 0 } else { u64::from(std::process::id()).wrapping_mul(7919) % (2 * j + 1) };
        let wait = (interval + Duration::from_millis(spread)).saturating_sub(jitter);
        tokio::time::sleep(wait).await;
        let text = match reader.read() {
            Ok(Some(t)) => t,
            Ok(None) => continue,
            Err(e) => {
                println!("[ERROR] plugin/reload: {e}");
                continue;
            }
        };
        if text == current.text || failed.as_deref() == Some(text.as_str()) {
            continue;
        }
        println!("[INFO] Reloading");
        match load(&text, reader.name(), listen) {
            Ok(p) => {
                let moved = (p.health, p.ready, p.prometheus) != (current.health, current.ready, current.prometheus);
                if moved {
                    println!(
                        "[WARNING] plugin/reload: podpath-dns binds health, ready and prometheus once: the new \
                         addresses take effect when the pod restarts"
                    );
                }
                if let Some(cfg) = p.zone.clone() {
                    zone.update(|z| z.set_config(cfg));
                }
                let probe = p.loop_probe.as_ref().map(|p| (p.name.clone(), p.target));
                pipeline.set(p);
                println!("[INFO] plugin/reload: Running configuration SHA512 = {}", sha512(&text));
                println!("[INFO] Reloading complete");
                failed = None;
                if let Some((name, target)) = probe {
                    tokio::spawn(loop_probe(name, target));
                }
            }
            Err(e) => {
                println!("[ERROR] Restart failed: {e}");
                println!(
                    "[ERROR] plugin/reload: Corefile changed but reload failed: starting with listener file descriptors: {e}"
                );
                failed = Some(text);
            }
        }
    }
}

/// The `loop` plugin's probe: `HINFO <random>.<random>.<zone>` sent to the server itself, once a
/// second until it is answered at all (even SERVFAIL: the forward ended somewhere) or 30 s; the
/// handler counts the probe's arrivals and exits on the third, which only a forward that
/// comes back to this server makes.
async fn loop_probe(name: hickory_proto::rr::Name, target: SocketAddr) {
    use hickory_proto::op::{Message, Query};
    let started = std::time::Instant::now();
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name, hickory_proto::rr::RecordType::HINFO));
    let Ok(bytes) = m.to_vec() else { return };
    while started.elapsed() < Duration::from_secs(30) {
        let Ok(s) = tokio::net::UdpSocket::bind(("127.0.0.1", 0)).await else { return };
        if s.send_to(&bytes, target).await.is_ok() {
            let mut buf = vec![0u8; 4096];
            if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(6), s.recv(&mut buf)).await {
                if Message::from_vec(&buf[..n]).is_ok() {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Applies one kind's changes to the zone as the reflector delivers them.
struct Feed<U> {
    zone: SharedZone,
    synced: watch::Sender<bool>,
    _kind: std::marker::PhantomData<fn(U)>,
}

impl<U> Feed<U> {
    fn new(zone: SharedZone) -> Feed<U> {
        Feed { zone, synced: watch::channel(false).0, _kind: std::marker::PhantomData }
    }

    /// Waits for the first full list (the readiness endpoint answers after it).
    async fn wait_synced(&self) {
        let _ = self.synced.subscribe().wait_for(|s| *s).await;
    }
}

impl Sink<ServiceRecord> for Feed<ServiceRecord> {
    fn apply(&self, change: Change<ServiceRecord>) {
        match change {
            Change::None => {}
            Change::Replace(all) => {
                self.zone.update(|z| z.replace_services(all));
                self.synced.send_replace(true);
            }
            Change::Apply(k, r) => self.zone.update(|z| z.set_service(k, r)),
            Change::Delete(k) => self.zone.update(|z| z.delete_service(&k)),
        }
    }
}

impl Sink<SliceRecord> for Feed<SliceRecord> {
    fn apply(&self, change: Change<SliceRecord>) {
        match change {
            Change::None => {}
            Change::Replace(all) => {
                self.zone.update(|z| z.replace_slices(all));
                self.synced.send_replace(true);
            }
            Change::Apply(k, r) => self.zone.update(|z| z.set_slice(k, r)),
            Change::Delete(k) => self.zone.update(|z| z.delete_slice(&k)),
        }
    }
}
