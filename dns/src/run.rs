//! The server process: the zone kept current from the API's Services and EndpointSlices
//! (watched through the client crate's reflectors, each object reduced to what DNS needs as
//! it arrives and applied to the zone at once), served on UDP and TCP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use podpath_client::grpc::ApiClient;
use podpath_client::reflector::{self, Change, Filter, Sink};
use tokio::sync::watch;

use crate::error::{DnsError, Result};
use crate::metrics::Metrics;
use crate::records::{Config, ServiceRecord, SliceRecord, Zone};
use crate::server::{Handler, SharedZone};

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
    let shared = SharedZone::new(Zone::new(opts.zone.clone()));
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
