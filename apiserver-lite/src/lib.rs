//! apiserver-lite: a Kubernetes-compatible API server for podpath labs.
//!
//! - [`rest`]: the REST API kubectl, the Python client and kube-rs speak;
//! - [`grpc`]: the gRPC API node agents and lb-sim use;
//! - [`registry`]: create/update/patch/delete/get/list shared by both, with
//!   [`alloc`] (ClusterIPs, NodePorts, LB IPs, pod CIDRs);
//! - [`store`]: sled storage, the resourceVersion counter and the watch event log;
//! - [`watch`]: the watch loop; [`controllers`]: endpoints, scheduler, namespaces and service
//!   accounts, node health, Deployments and ReplicaSets.
//!
//! Start with [`serve`]: it takes already-bound listeners and a shutdown future.
//!
//! What it is not: kube-apiserver. It stores in sled, not etcd, serves the kinds `api` lists
//! and the custom resources of its CRDs (no aggregation, no admission webhooks), and runs the controllers above in its own process.

pub mod alloc;
pub mod auth;
pub mod autoscaling_v1;
pub mod cli;
pub mod controllers;
pub mod crd;
pub mod error;
pub mod events_v1;
pub mod grpc;
pub mod logs;
pub mod proxy;
pub mod registry;
pub mod resource_metrics;
pub mod response;
pub mod rest;
pub mod review;
pub mod store;
pub mod streaming;
pub mod tls;
pub mod watch;
pub mod yaml;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::net::TcpListener;

pub use error::ApiError;

/// Everything the server needs besides its listeners.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub ranges: alloc::Ranges,
    pub controllers: controllers::ControllerConfig,
    pub token: Option<String>,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    /// The address the `default/kubernetes` Endpoints and discovery advertise.
    pub advertise: Option<std::net::SocketAddr>,
    /// Events kept for resuming watches.
    pub event_log_capacity: usize,
    /// Serve REST and gRPC over TLS with this identity; `None` is plain HTTP (`--insecure-http`).
    pub tls: Option<tls::Identity>,
    /// The network namespace node agents are reached from (`pods/log`; the lab's control plane).
    pub kubelet_netns: Option<PathBuf>,
}

impl Config {
    pub fn new(data_dir: PathBuf) -> Self {
        Config {
            data_dir,
            ranges: alloc::Ranges::default(),
            controllers: controllers::ControllerConfig::default(),
            token: None,
            max_body_bytes: 3 << 20,
            request_timeout: Duration::from_secs(60),
            advertise: None,
            event_log_capacity: store::EVENT_LOG_CAPACITY,
            tls: None,
            kubelet_netns: None,
        }
    }
}

/// A running server's shared state, for tests and benchmarks.
pub struct Server {
    pub registry: Arc<registry::Registry>,
    /// The ServiceAccount token signer (`DATA_DIR/pki/sa.key`).
    pub tokens: Arc<auth::Tokens>,
    controllers: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops the controllers and flushes the store (the database closes when the last
    /// reference to the registry is dropped).
    pub async fn stop(self) -> Result<(), ApiError> {
        self.controllers.abort();
        let _ = self.controllers.await;
        self.registry.store.flush().await
    }
}

/// Opens the store, bootstraps default objects and starts the controllers.
pub async fn start(cfg: &Config) -> Result<Server, ApiError> {
    let store = Arc::new(store::Store::open_with(&cfg.data_dir, cfg.event_log_capacity)?);
    let registry = Arc::new(registry::Registry::open(store, cfg.ranges.clone())?);
    let endpoint = cfg.advertise.map(|a| (a.ip().to_string(), a.port()));
    controllers::bootstrap(&registry, endpoint.clone()).await?;
    let controllers_cfg = controllers::ControllerConfig { advertise: endpoint, ..cfg.controllers.clone() };
    let tokens = Arc::new(auth::Tokens::load_or_create(&cfg.data_dir.join("pki"))?);
    let controllers = tokio::spawn(controllers::run(registry.clone(), controllers_cfg));
    Ok(Server { registry, tokens, controllers })
}

/// A server in this process serving gRPC on a free port of 127.0.0.1 until the runtime ends:
/// what the tests of the components that talk to it over gRPC run against. Returns the
/// address and the registry (to write objects directly).
pub async fn serve_grpc_on_loopback(data_dir: PathBuf) -> Result<(String, Arc<registry::Registry>), ApiError> {
    let srv = start(&Config::new(data_dir)).await?;
    let listener = TcpListener::bind("127.0.0.1:0").await.map_err(|e| ApiError::internal(format!("bind: {e}")))?;
    let addr = listener.local_addr().map_err(|e| ApiError::internal(format!("bind: {e}")))?.to_string();
    let registry = srv.registry.clone();
    tokio::spawn(grpc::serve_grpc(srv.registry.clone(), None, 3 << 20, None, listener, std::future::pending()));
    Ok((addr, registry))
}

/// The server as its binary runs it: on a runtime of its own, REST on `rest` and gRPC on `grpc`
/// (non-blocking listeners) until SIGTERM or SIGINT. A plain function, neither generic nor
/// async, so the whole server is compiled once, in this crate: a release build compiles generic
/// and async code again in every crate that instantiates it, and the binary would compile all
/// of [`serve`] a second time.
pub fn serve_until_signal(
    cfg: Config,
    rest: Vec<std::net::TcpListener>,
    grpc: Option<std::net::TcpListener>,
) -> Result<(), ApiError> {
    // As `#[tokio::main]`: a worker thread per core.
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let served = podpath_client::daemon::block_on(workers, async {
        let listener = |l| TcpListener::from_std(l).map_err(|e| ApiError::internal(format!("listener: {e}")));
        let rest = rest.into_iter().map(listener).collect::<Result<Vec<_>, _>>()?;
        let grpc = grpc.map(listener).transpose()?;
        let shutdown = async {
            podpath_client::daemon::stop_signal().await;
            tracing::info!("shutting down");
        };
        serve(cfg, rest, grpc, shutdown).await
    });
    served.map_err(|e| ApiError::internal(format!("cannot start the async runtime: {e}")))?
}

/// Serves REST on every listener in `rest` and gRPC on `grpc` until `shutdown` completes.
pub async fn serve(
    cfg: Config,
    rest: Vec<TcpListener>,
    grpc: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    let mut cfg = cfg;
    if cfg.advertise.is_none() {
        cfg.advertise = rest.first().and_then(|l| l.local_addr().ok());
    }
    let server = start(&cfg).await?;
    let token: Option<Arc<str>> = cfg.token.as_deref().map(Arc::from);
    let advertise = cfg.advertise.map(|a| a.to_string()).unwrap_or_default();
    let state = rest::RestState {
        registry: server.registry.clone(),
        token: token.clone(),
        max_body_bytes: cfg.max_body_bytes,
        request_timeout: cfg.request_timeout,
        advertise,
        kubelet_netns: cfg.kubelet_netns.clone(),
        tokens: Some(server.tokens.clone()),
    };
    // metrics-server's role: the kubelets' resource metrics, scraped.
    tokio::spawn(resource_metrics::scrape(server.registry.clone(), token.clone(), cfg.kubelet_netns.clone()));
    let shutdown = shutdown.shared();
    let mut tasks = Vec::new();
    let tls_config = cfg.tls.as_ref().map(tls::server_config).transpose()?;
    for l in rest {
        let app = rest::router(state.clone());
        let sd = shutdown.clone();
        let served = match &tls_config {
            Some(c) => {
                let l = tls::TlsListener::new(l, c.clone())
                    .map_err(|e| ApiError::internal(format!("REST listener: {e}")))?;
                tokio::spawn(async move { axum::serve(l, app).with_graceful_shutdown(sd).await })
            }
            None => {
                // Watch events are small writes: without NODELAY, Nagle and delayed ACKs hold them back.
                let l = axum::serve::ListenerExt::tap_io(l, |tcp: &mut tokio::net::TcpStream| {
                    let _ = tcp.set_nodelay(true);
                });
                tokio::spawn(async move { axum::serve(l, app).with_graceful_shutdown(sd).await })
            }
        };
        tasks.push(tokio::spawn(async move {
            served
                .await
                .map_err(|e| ApiError::internal(format!("REST server task: {e}")))?
                .map_err(|e| ApiError::internal(format!("REST server: {e}")))
        }));
    }
    if let Some(l) = grpc {
        let (registry, sd, limit) = (server.registry.clone(), shutdown.clone(), cfg.max_body_bytes);
        tasks.push(tokio::spawn(grpc::serve_grpc(registry, token, limit, cfg.tls.clone(), l, sd)));
    }
    let drained = async {
        for t in tasks {
            t.await.map_err(|e| ApiError::internal(format!("server task: {e}")))??;
        }
        Ok(())
    };
    // Watches never end on their own (a pod's DNS server keeps one open for as long as it
    // runs): after the grace period they are cut, as kube-apiserver closes them on shutdown,
    // rather than the server waiting for its clients to leave.
    let grace = async {
        shutdown.await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
        tracing::info!(grace_ms = SHUTDOWN_GRACE.as_millis() as u64, "closing the connections still open");
    };
    let served = tokio::select! {
        r = drained => r,
        () = grace => Ok(()),
    };
    server.stop().await?;
    served
}

/// How long requests under way may finish after the shutdown signal before their connections
/// (open watches among them) are closed.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
