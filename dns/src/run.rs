//! The server process: the zone rebuilt from the API's Services and EndpointSlices (watched
//! through the client crate's reflectors) whenever they change, served on UDP and TCP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use podpath_client::grpc::ApiClient;
use podpath_client::reflector::{self, Filter, Store};

use crate::error::{DnsError, Result};
use crate::metrics::Metrics;
use crate::records::{Config, Zone};
use crate::server::{Handler, SharedZone};

/// Changes closer together than this are built into one zone.
const SETTLE: Duration = Duration::from_millis(20);
/// Under a burst of changes, the zone is rebuilt at most this often (each build is a whole
/// new zone: building one per event of a 10,000-Service burst only churns memory).
const MIN_INTERVAL: Duration = Duration::from_millis(250);

/// Where to listen and whom to ask.
pub struct Options {
    pub apiserver: String,
    pub token: Option<String>,
    pub ca: Option<String>,
    pub listen: SocketAddr,
    pub zone: Config,
    /// `GET /metrics` (CoreDNS: 9153).
    pub metrics: Option<SocketAddr>,
    /// `GET /health` (CoreDNS: 8080), answered while the process serves.
    pub health: Option<SocketAddr>,
    /// `GET /ready` (CoreDNS: 8181), answered once the zone is built from a full list.
    pub ready: Option<SocketAddr>,
}

/// Serves `path` on `addr` with `body` as its text.
async fn http(
    addr: SocketAddr,
    path: &'static str,
    body: impl Fn() -> String + Clone + Send + Sync + 'static,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| DnsError::Bind(addr, e))?;
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

/// Binds the sockets first (a wrong address fails at once), then serves until `shutdown`.
pub async fn run(opts: Options, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let udp = tokio::net::UdpSocket::bind(opts.listen).await.map_err(|e| DnsError::Bind(opts.listen, e))?;
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = opts.metrics {
        let (m, zone) = (metrics.clone(), opts.zone.domain.to_string());
        http(addr, "/metrics", move || m.render(&zone)).await?;
    }
    if let Some(addr) = opts.health {
        http(addr, "/health", || "OK".to_string()).await?;
    }
    let tcp = tokio::net::TcpListener::bind(opts.listen).await.map_err(|e| DnsError::Bind(opts.listen, e))?;
    let client = ApiClient::connect_patiently(&opts.apiserver, opts.token.as_deref(), opts.ca.as_deref(), None)
        .await
        .map_err(|e| DnsError::Api(e.to_string()))?;
    let services = Store::<Service>::new();
    let slices = Store::<EndpointSlice>::new();
    tokio::spawn(reflector::run(client.clone(), Filter::default(), services.clone()));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), slices.clone()));
    services.wait_synced().await;
    slices.wait_synced().await;
    let shared = SharedZone::new(Zone::build(opts.zone.clone(), &services.list(), &slices.list(), 1));
    tokio::spawn(follow(opts.zone.clone(), services, slices, shared.clone(), 1));
    if let Some(addr) = opts.ready {
        http(addr, "/ready", || "OK".to_string()).await?;
    }
    let mut server = hickory_server::Server::new(Handler { zone: shared, metrics });
    server.register_socket(udp);
    server.register_listener(tcp, Duration::from_secs(10), 64 << 10);
    tracing::info!(listen = %opts.listen, domain = %opts.zone.domain, "serving the cluster zone");
    tokio::select! {
        r = server.block_until_done() => r.map_err(|e| DnsError::Serve(e.to_string())),
        _ = shutdown => {
            let _ = server.shutdown_gracefully().await;
            Ok(())
        }
    }
}

/// Rebuilds the zone after every change of either store.
async fn follow(
    cfg: Config,
    services: Arc<Store<Service>>,
    slices: Arc<Store<EndpointSlice>>,
    shared: SharedZone,
    mut serial: u32,
) {
    let (mut a, mut b) = (services.changes(), slices.changes());
    let mut last = tokio::time::Instant::now() - MIN_INTERVAL;
    loop {
        tokio::select! {
            r = a.changed() => if r.is_err() { return },
            r = b.changed() => if r.is_err() { return },
        }
        tokio::time::sleep(SETTLE).await;
        tokio::time::sleep_until(last + MIN_INTERVAL).await;
        last = tokio::time::Instant::now();
        a.borrow_and_update();
        b.borrow_and_update();
        serial = serial.wrapping_add(1);
        shared.set(Zone::build(cfg.clone(), &services.list(), &slices.list(), serial));
    }
}
