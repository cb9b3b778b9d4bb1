//! The node agent's own API, kubelet's role on `:10250`: container logs for the API server's
//! `pods/log` (`GET /containerLogs/{namespace}/{pod}/{container}`, with `follow`, `tailLines`,
//! `limitBytes`). The API server is the only caller: it presents the lab's bearer token.
//! Selecting what to send is pure ([`select`]); [`serve`] reads the files.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt;
use serde::Deserialize;

use crate::pods::load_records;
use crate::pods::PodsConfig;

/// The options of a log request, as kubelet takes them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogOptions {
    #[serde(default)]
    pub follow: bool,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
}

/// What of a log file to send first: the last `tail_lines` lines (all when absent), then at
/// most `limit_bytes` of them. Pure.
pub fn select(log: &[u8], opts: &LogOptions) -> Vec<u8> {
    let mut start = 0;
    if let Some(n) = opts.tail_lines.filter(|n| *n >= 0) {
        // Count line ends from the back; a last line without its newline counts as a line.
        let body = log.strip_suffix(b"\n").unwrap_or(log);
        start = if n == 0 {
            log.len()
        } else {
            let mut seen = 0;
            body.iter()
                .enumerate()
                .rev()
                .find(|(_, b)| {
                    **b == b'\n' && {
                        seen += 1;
                        seen == n
                    }
                })
                .map_or(0, |(i, _)| i + 1)
        };
    }
    let mut out = log[start.min(log.len())..].to_vec();
    if let Some(limit) = opts.limit_bytes.filter(|l| *l >= 0) {
        out.truncate(limit as usize);
    }
    out
}

#[derive(Clone)]
struct Kubelet {
    pods: PodsConfig,
    token: Option<Arc<str>>,
}

fn error(code: StatusCode, message: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response()
}

async fn container_logs(
    State(k): State<Kubelet>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(opts): Query<LogOptions>,
    headers: HeaderMap,
) -> Response {
    if let Some(token) = &k.token {
        let ok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t.trim() == &**token);
        if !ok {
            return error(StatusCode::UNAUTHORIZED, "Unauthorized".into());
        }
    }
    let state_dir = k.pods.state_dir.clone();
    let records = tokio::task::spawn_blocking(move || load_records(&state_dir)).await.unwrap_or_default();
    let Some(rec) = records.iter().find(|r| r.namespace == ns && r.name == pod) else {
        return error(StatusCode::NOT_FOUND, format!("pod {ns}/{pod} is not running on this node"));
    };
    if !rec.containers.contains_key(&container) {
        return error(StatusCode::NOT_FOUND, format!("container {container:?} is not in pod {ns}/{pod}"));
    }
    let path = k.pods.log_path(&ns, &pod, &rec.uid, &container);
    let log = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read {}: {e}", path.display())),
    };
    let first = select(&log, &opts);
    let ok = [(header::CONTENT_TYPE, "text/plain")];
    if !opts.follow || opts.limit_bytes.is_some_and(|l| first.len() as i64 >= l) {
        return (ok, first).into_response();
    }
    // Follow: what is written after, until the client goes (the body is dropped with it) or
    // the pod's record goes.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    let records_dir = k.pods.state_dir.clone();
    let uid = rec.uid.clone();
    tokio::spawn(follow(
        path,
        log.len() as u64,
        records_dir,
        uid,
        opts.limit_bytes.map(|l| l as usize - first.len()),
        tx,
    ));
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
        .chain(tokio_stream::wrappers::ReceiverStream::new(rx));
    (ok, Body::from_stream(stream)).into_response()
}

/// Sends what is appended to `path` from `offset` on, polling every 200 ms, until the receiver
/// is gone, `budget` bytes are sent, or the pod is gone from this node.
async fn follow(
    path: PathBuf,
    mut offset: u64,
    state_dir: PathBuf,
    uid: String,
    mut budget: Option<usize>,
    tx: tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
) {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let record = state_dir.join("pods").join(format!("{uid}.json"));
    loop {
        if tx.is_closed() {
            return;
        }
        if let Ok(mut f) = tokio::fs::File::open(&path).await {
            let len = f.metadata().await.map(|m| m.len()).unwrap_or(offset);
            if len < offset {
                offset = 0; // truncated
            }
            if len > offset && f.seek(std::io::SeekFrom::Start(offset)).await.is_ok() {
                let mut chunk = Vec::new();
                if f.read_to_end(&mut chunk).await.is_ok() {
                    offset += chunk.len() as u64;
                    if let Some(b) = budget.as_mut() {
                        chunk.truncate(*b);
                        *b -= chunk.len();
                    }
                    if tx.send(Ok(chunk)).await.is_err() || budget == Some(0) {
                        return;
                    }
                }
            }
        }
        if !record.exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Serves the kubelet API on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    pods: PodsConfig,
    token: Option<Arc<str>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = axum::Router::new()
        .route("/containerLogs/{ns}/{pod}/{container}", get(container_logs))
        .with_state(Kubelet { pods, token });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(log: &str, tail: Option<i64>, limit: Option<i64>) -> String {
        let opts = LogOptions { follow: false, tail_lines: tail, limit_bytes: limit };
        String::from_utf8(select(log.as_bytes(), &opts)).unwrap()
    }

    #[test]
    fn tail_lines_and_limit_bytes_as_kubelet() {
        let log = "a\nb\nc\n";
        assert_eq!(sel(log, None, None), log);
        assert_eq!(sel(log, Some(2), None), "b\nc\n");
        assert_eq!(sel(log, Some(1), None), "c\n");
        assert_eq!(sel(log, Some(0), None), "");
        assert_eq!(sel(log, Some(10), None), log);
        assert_eq!(sel("a\nb\nc", Some(1), None), "c", "an unfinished last line counts");
        assert_eq!(sel(log, None, Some(3)), "a\nb");
        assert_eq!(sel(log, Some(2), Some(1)), "b");
        assert_eq!(sel("", Some(3), None), "");
    }
}
