//! The gRPC client of the API server (with the bearer token when the server wants one).

use std::time::Duration;

use api::proto::custom_objects_client::CustomObjectsClient;
use api::proto::events_client::EventsClient;
use api::proto::nodes_client::NodesClient;
use api::proto::persistent_volumes_client::PersistentVolumesClient;
use api::proto::pods_client::PodsClient;
use api::proto::services_client::ServicesClient;
use api::proto::watch_client::WatchClient;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::error::{ClientError, Result};

/// Adds `authorization: Bearer …` to every call when a token is configured.
#[derive(Clone)]
pub struct Auth(Option<MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Auth>;

/// Clients for the services the agent uses, sharing one connection.
#[derive(Clone)]
pub struct ApiClient {
    pub nodes: NodesClient<Svc>,
    pub pods: PodsClient<Svc>,
    pub watch: WatchClient<Svc>,
    pub events: EventsClient<Svc>,
    pub volumes: PersistentVolumesClient<Svc>,
    /// Objects of custom resources (CRDs), as JSON.
    pub custom: CustomObjectsClient<Svc>,
    pub services: ServicesClient<Svc>,
}

impl ApiClient {
    /// Connects to `addr` (`host:port`); the connection is re-established lazily after failures.
    /// With `ca_pem` the connection is TLS and the server's certificate must be the API's
    /// (`kubernetes` among its names) signed by that CA; without, plain HTTP/2.
    pub async fn connect(addr: &str, token: Option<&str>, ca_pem: Option<&str>) -> Result<ApiClient> {
        let scheme = if ca_pem.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| ClientError::Config(format!("invalid --apiserver {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30));
        if let Some(ca) = ca_pem {
            let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)).domain_name("kubernetes");
            endpoint = endpoint.tls_config(tls).map_err(|e| ClientError::Config(format!("TLS to {addr}: {e}")))?;
        }
        let channel =
            endpoint.connect().await.map_err(|source| ClientError::Connect { addr: addr.to_string(), source })?;
        let auth = Auth(
            token
                .map(|t| format!("Bearer {t}").parse())
                .transpose()
                .map_err(|_| ClientError::Config("the token contains characters a header cannot carry".into()))?,
        );
        Ok(ApiClient {
            nodes: NodesClient::with_interceptor(channel.clone(), auth.clone()),
            pods: PodsClient::with_interceptor(channel.clone(), auth.clone()),
            watch: WatchClient::with_interceptor(channel.clone(), auth.clone()),
            events: EventsClient::with_interceptor(channel.clone(), auth.clone()),
            volumes: PersistentVolumesClient::with_interceptor(channel.clone(), auth.clone()),
            custom: CustomObjectsClient::with_interceptor(channel.clone(), auth.clone()),
            services: ServicesClient::with_interceptor(channel, auth),
        })
    }

    /// [`ApiClient::connect`], retried every 500 ms for up to `patience` (`None`: until it
    /// works): components may start before the API server, e.g. VMs booting in parallel.
    pub async fn connect_patiently(
        addr: &str,
        token: Option<&str>,
        ca_pem: Option<&str>,
        patience: Option<Duration>,
    ) -> Result<ApiClient> {
        let deadline = patience.map(|p| tokio::time::Instant::now() + p);
        for attempt in 0u64.. {
            match ApiClient::connect(addr, token, ca_pem).await {
                Ok(c) => return Ok(c),
                Err(e) if deadline.is_none_or(|d| tokio::time::Instant::now() < d) => {
                    // Once, then every 10 s: a log line per attempt would bury everything else.
                    if attempt % 20 == 0 {
                        tracing::warn!(error = %e, "API server not reachable yet; retrying");
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the attempts never run out")
    }
}
