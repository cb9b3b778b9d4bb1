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
use crate::records::{Config, Zone};
use crate::server::{Handler, SharedZone};

/// Changes closer together than this are built into one zone.
const SETTLE: Duration = Duration::from_millis(20);

/// Where to listen and whom to ask.
pub struct Options {
    pub apiserver: String,
    pub token: Option<String>,
    pub ca: Option<String>,
    pub listen: SocketAddr,
    pub zone: Config,
}

/// Binds the sockets first (a wrong address fails at once), then serves until `shutdown`.
pub async fn run(opts: Options, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    let udp = tokio::net::UdpSocket::bind(opts.listen).await.map_err(|e| DnsError::Bind(opts.listen, e))?;
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
    let mut server = hickory_server::Server::new(Handler { zone: shared });
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
    loop {
        tokio::select! {
            r = a.changed() => if r.is_err() { return },
            r = b.changed() => if r.is_err() { return },
        }
        tokio::time::sleep(SETTLE).await;
        a.borrow_and_update();
        b.borrow_and_update();
        serial = serial.wrapping_add(1);
        shared.set(Zone::build(cfg.clone(), &services.list(), &slices.list(), serial));
    }
}
