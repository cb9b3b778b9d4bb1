//! The real side effects of the pod workers: the API over gRPC ([`PodApi`] for the client crate's
//! `ApiClient`) and readiness checks over the network ([`NetProber`]).

use std::time::Duration;

use podpath_client::{http, ApiClient};

use super::{Check, PodApi, Prober};
use crate::error::{AgentError, Result};

/// The pod calls over gRPC.
impl PodApi for ApiClient {
    async fn update_status(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Result<()> {
        let mut pods = self.pods.clone();
        pods.update_status(api::convert::to_proto(pod))
            .await
            .map(|_| ())
            .map_err(|status| AgentError::Api { call: "Pods.UpdateStatus", status })
    }

    async fn delete(&self, namespace: &str, name: &str, uid: &str) -> Result<()> {
        let mut pods = self.pods.clone();
        let req = api::proto::DeleteRequest {
            namespace: namespace.to_string(),
            name: name.to_string(),
            grace_period_seconds: Some(0),
            precondition_uid: uid.to_string(),
        };
        match pods.delete(req).await {
            Ok(_) => Ok(()),
            // Already gone, or replaced by a new pod of the same name: nothing of ours to delete.
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::NotFound | tonic::Code::FailedPrecondition | tonic::Code::Aborted
                ) =>
            {
                Ok(())
            }
            Err(status) => Err(AgentError::Api { call: "Pods.Delete", status }),
        }
    }
}

/// Probes over the network from the node (like kubelet: TCP connect, or an HTTP GET whose
/// status is 200–399).
pub struct NetProber;

impl Prober for NetProber {
    async fn probe(&self, check: &Check, timeout: Duration) -> bool {
        match check {
            Check::Tcp(addr) => {
                tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await.is_ok_and(|r| r.is_ok())
            }
            Check::Http { addr, path, host, headers } => {
                let host = host.clone().unwrap_or_else(|| addr.to_string());
                let mut all: Vec<(&str, &str)> = vec![
                    ("Host", &host),
                    ("User-Agent", "kube-probe/1.33"),
                    ("Accept", "*/*"),
                    ("Connection", "close"),
                ];
                all.extend(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
                let req = http::Request { headers: &all, ..http::Request::get(path) };
                http::request(*addr, &req, timeout).await.is_ok_and(|r| (200..400).contains(&r.status))
            }
            Check::Exec { .. } => false,
        }
    }
}
