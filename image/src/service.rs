//! The lab's image service: one process per lab, in the host's network namespace (where
//! registries and mirrors are reachable; the nodes' namespaces route nowhere outside the lab),
//! pulling into the lab's store for every node — containerd's image service, shared. Nodes
//! and the CLI ask it over a Unix socket in the lab's state directory, one JSON request and
//! one JSON answer per connection.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::error::{ImageError, Result};
use crate::pull::{Credential, Puller};
use crate::store::ImageRecord;

/// A request to the service.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum Request {
    Pull {
        image: String,
        #[serde(default)]
        credentials: Vec<Credential>,
    },
    Remove {
        image: String,
    },
}

/// The service's answer.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageRecord>,
    #[serde(default)]
    pub downloaded: u64,
    #[serde(default)]
    pub elapsed_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Largest request accepted (credentials included).
const MAX_REQUEST: u64 = 1 << 20;

/// The service as its binary runs it: on a runtime of its own (2 worker threads), serving
/// `listener` (non-blocking) until SIGTERM or SIGINT. A plain function, neither generic nor
/// async, so the whole service is compiled once, in this crate: a release build compiles async
/// code again in every crate that instantiates it, and the binary would compile all of [`serve`]
/// a second time.
pub fn serve_until_signal(
    listener: std::os::unix::net::UnixListener,
    puller: Puller,
    pull_deadline: Duration,
) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let listener = UnixListener::from_std(listener)?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = serve(listener, Arc::new(puller), pull_deadline) => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        Ok(())
    })
}

/// Serves requests until the listener fails; each connection in its own task, so a slow pull
/// never holds up another.
pub async fn serve(listener: UnixListener, puller: Arc<Puller>, pull_deadline: Duration) {
    loop {
        let Ok((conn, _)) = listener.accept().await else { return };
        let puller = puller.clone();
        tokio::spawn(async move {
            if let Err(e) = handle(conn, &puller, pull_deadline).await {
                tracing::debug!("image service connection: {e}");
            }
        });
    }
}

async fn handle(conn: UnixStream, puller: &Puller, deadline: Duration) -> std::io::Result<()> {
    use tokio::io::AsyncReadExt;
    let (rd, mut wr) = conn.into_split();
    let mut line = String::new();
    BufReader::new(rd.take(MAX_REQUEST)).read_line(&mut line).await?;
    let answer = match serde_json::from_str::<Request>(&line) {
        Err(e) => Answer { error: Some(format!("bad request: {e}")), ..Answer::default() },
        Ok(Request::Pull { image, credentials }) => {
            match tokio::time::timeout(deadline, puller.pull(&image, &credentials)).await {
                Ok(Ok(p)) => Answer {
                    image: Some(p.record),
                    downloaded: p.downloaded,
                    elapsed_ms: p.elapsed.as_millis() as u64,
                    error: None,
                },
                Ok(Err(e)) => Answer { error: Some(e.to_string()), ..Answer::default() },
                Err(_) => Answer {
                    error: Some(format!(
                        "failed to pull and unpack image {image:?}: the pull took more than {}s",
                        deadline.as_secs()
                    )),
                    ..Answer::default()
                },
            }
        }
        Ok(Request::Remove { image }) => {
            let store = puller.store().clone();
            match tokio::task::spawn_blocking(move || store.remove(&image)).await {
                Ok(Ok(Some(crate::Removed::Deleted(rec)))) => Answer { image: Some(*rec), ..Answer::default() },
                Ok(Ok(Some(crate::Removed::Untagged(_)))) => Answer::default(),
                Ok(Ok(None)) => Answer { error: Some("no such image".into()), ..Answer::default() },
                Ok(Err(e)) => Answer { error: Some(e.to_string()), ..Answer::default() },
                Err(e) => Answer { error: Some(e.to_string()), ..Answer::default() },
            }
        }
    };
    let mut body = serde_json::to_vec(&answer).unwrap_or_else(|_| b"{}".to_vec());
    body.push(b'\n');
    wr.write_all(&body).await?;
    wr.shutdown().await
}

/// Sends one request to the service at `socket` and reads its answer (the service's own errors
/// come back in [`Answer::error`]).
pub async fn call(socket: &Path, req: &Request) -> Result<Answer> {
    let fail = |e: std::io::Error| ImageError::Service(format!("{}: {e}", socket.display()));
    let conn = UnixStream::connect(socket).await.map_err(fail)?;
    let (rd, mut wr) = conn.into_split();
    let mut body = serde_json::to_vec(req).map_err(|e| ImageError::Service(e.to_string()))?;
    body.push(b'\n');
    wr.write_all(&body).await.map_err(fail)?;
    let mut line = String::new();
    BufReader::new(rd).read_line(&mut line).await.map_err(fail)?;
    serde_json::from_str(&line).map_err(|e| ImageError::Service(format!("a bad answer ({e}): {line:?}")))
}
