//! The real side effects of the pod workers: the API over gRPC ([`PodApi`] for the client crate's
//! `ApiClient`) and readiness checks over the network ([`NetProber`]).

use std::time::Duration;

use podpath_client::{http, ApiClient};

use super::{Check, PodApi, Prober};
use crate::error::{KubeletError, Result};

/// The pod calls over gRPC.
impl PodApi for ApiClient {
    async fn update_status(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Result<()> {
        let mut pods = self.pods.clone();
        pods.update_status(api::convert::to_proto(pod))
            .await
            .map(|_| ())
            .map_err(|status| KubeletError::Api { call: "Pods.UpdateStatus", status })
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
            Err(status) => Err(KubeletError::Api { call: "Pods.Delete", status }),
        }
    }
}

/// Probes over the network from the node (like kubelet: TCP connect, or an HTTP GET whose
/// status is 200–399).
pub struct NetProber;

impl Prober for NetProber {
    async fn probe(&self, check: &Check, timeout: Duration) -> std::result::Result<(), String> {
        match check {
            Check::Tcp(addr) => match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("dial tcp {addr}: connect: {}", io_text(&e))),
                Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
            },
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
                match http::request(*addr, &req, timeout).await {
                    Ok(r) if (200..400).contains(&r.status) => Ok(()),
                    Ok(r) => Err(format!("HTTP probe failed with statuscode: {}", r.status)),
                    Err(e) => Err(format!("Get \"http://{addr}{path}\": {}", go_error(&e))),
                }
            }
            Check::Exec { argv } => Err(format!("exec probe {argv:?} is not run by the network prober")),
        }
    }
}

/// A failed HTTP exchange as Go's client words it (`dial tcp …: connect: connection refused`).
fn go_error(e: &http::HttpError) -> String {
    match e {
        http::HttpError::Connect { addr, source } => format!("dial tcp {addr}: connect: {}", io_text(source)),
        http::HttpError::Timeout { .. } => {
            "context deadline exceeded (Client.Timeout exceeded while awaiting headers)".into()
        }
        other => other.to_string(),
    }
}

/// An I/O error as Go prints a syscall error (`connection refused`), without Rust's
/// `(os error 111)` suffix.
fn io_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(i) => text[..i].to_lowercase(),
        None => text,
    }
}
