//! The real side effects of the pod workers: the API over gRPC ([`PodApi`] for the client crate's
//! `ApiClient`) and readiness checks over the network ([`NetProber`]).

use std::time::Duration;

use podpath_client::ApiClient;

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
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let attempt = async {
            match check {
                Check::Tcp(addr) => tokio::net::TcpStream::connect(addr).await.is_ok(),
                Check::Http { addr, path, host, headers } => {
                    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else { return false };
                    let mut req = format!(
                        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: kube-probe/1.33\r\nAccept: */*\r\nConnection: close\r\n",
                        host.clone().unwrap_or_else(|| addr.to_string())
                    );
                    for (k, v) in headers {
                        req.push_str(&format!("{k}: {v}\r\n"));
                    }
                    req.push_str("\r\n");
                    if s.write_all(req.as_bytes()).await.is_err() {
                        return false;
                    }
                    let mut buf = [0u8; 32];
                    let mut n = 0;
                    while n < 12 {
                        match s.read(&mut buf[n..]).await {
                            Ok(0) | Err(_) => break,
                            Ok(k) => n += k,
                        }
                    }
                    let line = String::from_utf8_lossy(&buf[..n]);
                    line.split_whitespace()
                        .nth(1)
                        .and_then(|c| c.parse::<u16>().ok())
                        .is_some_and(|c| (200..400).contains(&c))
                }
                Check::Exec { .. } => false,
            }
        };
        tokio::time::timeout(timeout, attempt).await.unwrap_or(false)
    }
}
