//! The node agent's own API, kubelet's role on `:10250`: container logs for the API server's
//! `pods/log` (`GET /containerLogs/{namespace}/{pod}/{container}`, with `follow`, `previous`,
//! `tailLines`, `sinceSeconds`, `sinceTime`, `timestamps`, `limitBytes`, read from the CRI-format
//! files the containers' monitors write), and the streaming endpoints behind `pods/exec`, `pods/attach` and
//! `pods/portforward` (`/exec/…`, `/attach/…`, `/portForward/{namespace}/{pod}`, upgraded to a
//! WebSocket or SPDY; see [`crate::stream`]). The API server is the only caller: it presents the
//! lab's bearer token. Selecting what to send is pure ([`log_attempt`], [`crilog::Render`]); [`serve`] reads the files.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequestParts, Request};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use futures::StreamExt;
use serde::Deserialize;

use crate::crilog;
use crate::pods::load_records;
use crate::pods::PodsConfig;
use crate::pods::{ContainerRecord, PodRecord};
use crate::process::{ProcId, Processes};
use crate::stream::{self, exec::ExecOptions};

/// The options of a log request, as kubelet takes them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogOptions {
    #[serde(default)]
    pub follow: bool,
    #[serde(default)]
    pub previous: bool,
    #[serde(default)]
    pub timestamps: bool,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
    pub since_seconds: Option<i64>,
    pub since_time: Option<String>,
}

impl LogOptions {
    /// The earliest record to send, from `sinceTime` or `sinceSeconds` before `now`. Pure.
    pub fn since(&self, now: jiff::Timestamp) -> Result<Option<jiff::Timestamp>, String> {
        if let Some(t) = &self.since_time {
            return t.parse().map(Some).map_err(|e| format!("invalid sinceTime {t:?}: {e}"));
        }
        Ok(self.since_seconds.and_then(|s| now.checked_sub(jiff::SignedDuration::from_secs(s)).ok()))
    }
}

/// Which log file of a container a request reads (its attempt number), from the container's
/// record: the current or last run, or with `previous` the run before (kubelet's
/// `lastState.terminated`). Pure; kubelet's message when there is no such run.
pub fn log_attempt(c: &ContainerRecord, previous: bool, container: &str, pod: &str) -> Result<i32, String> {
    if !previous {
        return Ok(c.restart_count);
    }
    let attempt = match (c.process.is_some(), c.done) {
        (true, _) => c.restart_count - 1,
        (false, false) if c.last.is_some() => c.restart_count,
        _ => -1,
    };
    if attempt < 0 {
        return Err(format!("previous terminated container {container:?} in pod {pod:?} not found"));
    }
    Ok(attempt)
}

#[derive(Clone)]
struct Kubelet {
    pods: PodsConfig,
    token: Option<Arc<str>>,
}

fn error(code: StatusCode, message: String) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message).into_response()
}

/// A refusal: kubelet's status and plain-text message.
type Refused = (StatusCode, String);

impl Kubelet {
    /// The API server's bearer token, when the agent has one.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), Refused> {
        let Some(token) = &self.token else { return Ok(()) };
        let ok = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t.trim() == &**token);
        if ok {
            Ok(())
        } else {
            Err((StatusCode::UNAUTHORIZED, "Unauthorized".into()))
        }
    }

    /// The record of a pod on this node, or kubelet's 404.
    async fn pod(&self, ns: &str, pod: &str) -> Result<PodRecord, Refused> {
        let state_dir = self.pods.state_dir.clone();
        let records = tokio::task::spawn_blocking(move || load_records(&state_dir)).await.unwrap_or_default();
        records
            .into_iter()
            .find(|r| r.namespace == ns && r.name == pod)
            .ok_or_else(|| (StatusCode::NOT_FOUND, format!("pod does not exist: {ns}/{pod} is not on this node")))
    }

    /// The pod's record and its running container's process, or kubelet's `container not found`.
    async fn running(&self, ns: &str, pod: &str, container: &str) -> Result<(PodRecord, ProcId), Refused> {
        let rec = self.pod(ns, pod).await?;
        let procs = crate::process::LinuxProcesses::default();
        match rec.containers.get(container).and_then(|c| c.process).filter(|p| procs.alive(*p)) {
            Some(p) => Ok((rec, p)),
            None => Err((StatusCode::NOT_FOUND, format!("container not found ({container:?})"))),
        }
    }
}

impl Kubelet {
    /// What exec and attach check first: the token, the options, the running container.
    async fn stream_request(
        &self,
        headers: &HeaderMap,
        query: &str,
        ns: &str,
        pod: &str,
        container: &str,
    ) -> Result<(ExecOptions, PodRecord, ProcId), Refused> {
        self.authorize(headers)?;
        let opts = ExecOptions::parse(query).map_err(|e| (StatusCode::BAD_REQUEST, e))?;
        let (rec, p) = self.running(ns, pod, container).await?;
        Ok((opts, rec, p))
    }
}

/// An upgraded connection, with the subprotocol agreed.
enum Conn {
    Ws(Box<axum::extract::ws::WebSocket>, Option<String>),
    /// A WebSocket carrying kubectl's SPDY tunnel, framed by `stream::wstunnel`.
    Tunnel(hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>),
    Spdy(hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>, String),
}

/// The 101 of a WebSocket handshake for kubectl's SPDY tunnel, when `req` is one that asks
/// for it (the first of `ws_protocols` it offers) and is well formed; else None, and the
/// general WebSocket path answers (rejections included).
fn tunnel_handshake(req: &Request, ws_protocols: &[&str], offered: &[String]) -> Option<Response> {
    let chosen = ws_protocols.iter().find(|p| offered.iter().any(|o| o == *p))?;
    if *chosen != stream::channel::SPDY_TUNNEL || req.method() != axum::http::Method::GET {
        return None;
    }
    let h = req.headers();
    let has = |name: header::HeaderName, token: &str| {
        h.get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    };
    if !has(header::CONNECTION, "upgrade") || !has(header::SEC_WEBSOCKET_VERSION, "13") {
        return None;
    }
    let key = h.get(header::SEC_WEBSOCKET_KEY)?.to_str().ok()?.to_string();
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, stream::wstunnel::accept_key(&key))
        .header(header::SEC_WEBSOCKET_PROTOCOL, *chosen)
        .body(Body::empty())
        .ok()
}

/// Upgrades `req` to a WebSocket (offering `ws_protocols`) or to SPDY/3.1 (offering
/// `spdy_protocols` as `X-Stream-Protocol-Version`) and hands the connection to `handle`;
/// answers as kubelet does when neither fits.
async fn upgrade<F, Fut>(
    req: Request,
    ws_protocols: &'static [&'static str],
    spdy_protocols: &'static [&'static str],
    handle: F,
) -> Response
where
    F: FnOnce(Conn) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let upgrade_to = req.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    if upgrade_to.eq_ignore_ascii_case("websocket") {
        let offered = req
            .headers()
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>();
        let mut req = req;
        let upgradable = req.extensions().get::<hyper::upgrade::OnUpgrade>().is_some();
        if let Some(switching) = tunnel_handshake(&req, ws_protocols, &offered).filter(|_| upgradable) {
            let on = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                match on.await {
                    Ok(u) => handle(Conn::Tunnel(hyper_util::rt::TokioIo::new(u))).await,
                    Err(e) => tracing::debug!("WebSocket upgrade failed: {e}"),
                }
            });
            return switching;
        }
        let (mut parts, _) = req.into_parts();
        let ws = match axum::extract::ws::WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(ws) => ws.protocols(ws_protocols.iter().copied()),
            Err(e) => return e.into_response(),
        };
        let chosen = ws.selected_protocol().and_then(|p| p.to_str().ok()).map(str::to_string);
        if chosen.is_none() && !offered.is_empty() {
            return error(
                StatusCode::BAD_REQUEST,
                format!("requested protocol(s) are not supported: {offered:?}; supports {ws_protocols:?}"),
            );
        }
        return ws.on_upgrade(move |socket| handle(Conn::Ws(Box::new(socket), chosen)));
    }
    if upgrade_to.eq_ignore_ascii_case("SPDY/3.1") {
        let offered: Vec<String> = req
            .headers()
            .get_all("x-stream-protocol-version")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|p| p.trim().to_string())
            .collect();
        let Some(chosen) = offered.iter().find(|p| spdy_protocols.contains(&p.as_str())).cloned() else {
            return (
                StatusCode::FORBIDDEN,
                [("x-accepted-stream-protocol-versions", spdy_protocols.join(","))],
                format!(
                    "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {spdy_protocols:?}"
                ),
            )
                .into_response();
        };
        let mut req = req;
        let on = hyper::upgrade::on(&mut req);
        let protocol = chosen.clone();
        tokio::spawn(async move {
            match on.await {
                Ok(u) => handle(Conn::Spdy(hyper_util::rt::TokioIo::new(u), protocol)).await,
                Err(e) => tracing::debug!("SPDY upgrade failed: {e}"),
            }
        });
        return Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(header::CONNECTION, "Upgrade")
            .header(header::UPGRADE, "SPDY/3.1")
            .header("x-stream-protocol-version", chosen)
            .body(Body::empty())
            .unwrap_or_default();
    }
    error(StatusCode::BAD_REQUEST, "Upgrade request required".into())
}

/// Exec or attach over whichever protocol the client got.
async fn serve_exec<F, Fut>(conn: Conn, opts: ExecOptions, run: F)
where
    F: FnOnce(tokio::sync::mpsc::Receiver<stream::exec::Input>, tokio::sync::mpsc::Sender<stream::exec::Output>) -> Fut,
    Fut: std::future::Future<Output = stream::exec::Outcome>,
{
    match conn {
        Conn::Ws(ws, p) => stream::exec_ws(*ws, ws_proto(p.as_deref()), opts, run).await,
        // Not offered for exec and attach (the tunnel is port-forward's alone).
        Conn::Tunnel(_) => {}
        Conn::Spdy(io, p) => stream::exec_spdy(io, spdy_version(&p), opts, run).await,
    }
}

/// The channel protocol of a WebSocket subprotocol (none: `channel.k8s.io`).
fn ws_proto(name: Option<&str>) -> stream::channel::Proto {
    stream::channel::Proto::from_name(name).unwrap_or(stream::channel::Proto { version: 1, base64: false })
}

fn spdy_version(protocol: &str) -> u8 {
    stream::channel::Proto::from_name(Some(protocol)).map_or(1, |p| p.version)
}

async fn exec(
    State(k): State<Kubelet>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let (opts, rec, _) = match k
        .stream_request(req.headers(), req.uri().query().unwrap_or(""), &ns, &pod, &container)
        .await
    {
        Ok(o) if o.0.command.is_empty() => return error(StatusCode::BAD_REQUEST, "you must specify a command".into()),
        Ok(o) => o,
        Err((code, msg)) => return error(code, msg),
    };
    let pid_file = rec.containers.get(&container).and_then(|c| c.pid_file.clone());
    let target = stream::exec_target(k.pods.workload_bin.clone(), rec.sandbox.pid, pid_file, &pod, opts.tty);
    upgrade(req, stream::channel::EXEC_PROTOCOLS, stream::SPDY_EXEC_PROTOCOLS, move |conn| async move {
        let o = opts.clone();
        let run = move |i, out| async move { stream::exec::run(&target, &o, i, out).await };
        serve_exec(conn, opts, run).await
    })
    .await
}

async fn attach(
    State(k): State<Kubelet>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let (opts, rec, proc_id) =
        match k.stream_request(req.headers(), req.uri().query().unwrap_or(""), &ns, &pod, &container).await {
            Ok(o) => o,
            Err((code, msg)) => return error(code, msg),
        };
    let socket = k.pods.attach_socket(&rec.uid, &container).filter(|s| s.exists());
    let attempt = rec.containers.get(&container).map_or(0, |c| c.restart_count);
    let log = k.pods.log_path(&ns, &pod, &rec.uid, &container, attempt);
    upgrade(req, stream::channel::EXEC_PROTOCOLS, stream::SPDY_EXEC_PROTOCOLS, move |conn| async move {
        let run = move |i, out| async move {
            let alive = move || crate::process::LinuxProcesses::default().alive(proc_id);
            stream::console::attach(socket.as_deref(), &log, alive, i, out).await
        };
        serve_exec(conn, opts, run).await
    })
    .await
}

async fn port_forward(State(k): State<Kubelet>, Path((ns, pod)): Path<(String, String)>, req: Request) -> Response {
    if let Err((code, msg)) = k.authorize(req.headers()) {
        return error(code, msg);
    }
    let rec = match k.pod(&ns, &pod).await {
        Ok(r) => r,
        Err((code, msg)) => return error(code, msg),
    };
    let ports = match stream::portforward::parse_ports(req.uri().query().unwrap_or("")) {
        Ok(p) => p,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let target = stream::PodRef { name: format!("{ns}/{pod}"), uid: rec.uid.clone(), sandbox_pid: rec.sandbox.pid };
    // The connection's own socket, to splice the pod's bytes into once upgraded: only an
    // HTTP/1.1 connection is the upgraded stream's alone (an HTTP/2 one carries others).
    let socket = req
        .extensions()
        .get::<axum::extract::ConnectInfo<stream::zerocopy::Socket>>()
        .filter(|_| req.version() == axum::http::Version::HTTP_11)
        .map(|c| c.0.clone());
    upgrade(req, stream::channel::PORTFORWARD_PROTOCOLS, &[stream::SPDY_PORTFORWARD_PROTOCOL], move |conn| async move {
        let taken = |io| match &socket {
            Some(s) => stream::zerocopy::take_over(io, s),
            None => Err(io),
        };
        match conn {
            Conn::Tunnel(io) => match taken(io) {
                Ok((rd, wr)) => stream::portforward_spdy(stream::wstunnel::serve_split(rd, wr), target).await,
                Err(io) => stream::portforward_spdy(stream::wstunnel::serve(io), target).await,
            },
            Conn::Ws(ws, p) => stream::portforward_ws(*ws, ws_proto(p.as_deref()), ports, target).await,
            Conn::Spdy(io, _) => match taken(io) {
                Ok((rd, wr)) => {
                    let (rd, wr) = (stream::spdy::IoSource(rd), stream::spdy::IoSink(wr));
                    stream::portforward_spdy(stream::spdy::serve_on(rd, wr), target).await
                }
                Err(io) => stream::portforward_spdy(stream::spdy::serve(io), target).await,
            },
        }
    })
    .await
}

async fn container_logs(
    State(k): State<Kubelet>,
    Path((ns, pod, container)): Path<(String, String, String)>,
    Query(opts): Query<LogOptions>,
    headers: HeaderMap,
) -> Response {
    if let Err((code, msg)) = k.authorize(&headers) {
        return error(code, msg);
    }
    let rec = match k.pod(&ns, &pod).await {
        Ok(r) => r,
        Err((code, msg)) => return error(code, msg),
    };
    let Some(c) = rec.containers.get(&container) else {
        return error(StatusCode::NOT_FOUND, format!("container {container:?} is not in pod {ns}/{pod}"));
    };
    let attempt = match log_attempt(c, opts.previous, &container, &pod) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let since = match opts.since(jiff::Timestamp::now()) {
        Ok(s) => s,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let path = k.pods.log_path(&ns, &pod, &rec.uid, &container, attempt);
    let log = match tokio::fs::read(&path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && opts.previous => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("previous terminated container {container:?} in pod {pod:?} not found"),
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot read {}: {e}", path.display())),
    };
    let start = opts.tail_lines.filter(|n| *n >= 0).map_or(0, |n| crilog::tail_start(&log, n as usize));
    let limit = opts.limit_bytes.filter(|l| *l >= 0).map(|l| l as usize);
    let mut render = crilog::Render::new(since, opts.timestamps, limit);
    let first = render.feed(&log[start..]);
    let ok = [(header::CONTENT_TYPE, "text/plain")];
    // Follow only what is still being written: the container's current run.
    let writing = c.process.is_some() && attempt == c.restart_count;
    if !opts.follow || !writing || render.exhausted() {
        return (ok, first).into_response();
    }
    // Follow: what is written after, until the client goes (the body is dropped with it) or
    // this run of the container ends.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(16);
    let state_dir = k.pods.state_dir.clone();
    let (uid, name) = (rec.uid.clone(), container.clone());
    let still_running = move || {
        let record = state_dir.join("pods").join(format!("{uid}.json"));
        std::fs::read(record)
            .ok()
            .and_then(|b| serde_json::from_slice::<PodRecord>(&b).ok())
            .and_then(|r| r.containers.get(&name).cloned())
            .is_some_and(|c| c.process.is_some() && c.restart_count == attempt)
    };
    tokio::spawn(follow(path, log.len() as u64, render, still_running, tx));
    let stream = futures::stream::once(async move { Ok::<_, std::io::Error>(first) })
        .chain(tokio_stream::wrappers::ReceiverStream::new(rx));
    (ok, Body::from_stream(stream)).into_response()
}

/// Sends what is appended to `path` from `offset` on, rendered, polling every 200 ms, until
/// the receiver is gone, the byte limit is reached, or the run has ended and all it wrote is
/// sent.
async fn follow(
    path: PathBuf,
    mut offset: u64,
    mut render: crilog::Render,
    still_running: impl Fn() -> bool + Send + 'static,
    tx: tokio::sync::mpsc::Sender<Result<Vec<u8>, std::io::Error>>,
) {
    loop {
        if tx.is_closed() {
            return;
        }
        // Checked before reading, so the last lines of a run that just ended still go out.
        let running = still_running();
        if let Some(chunk) = crate::tail::appended(&path, &mut offset).await {
            let out = render.feed(&chunk);
            if !out.is_empty() && tx.send(Ok(out)).await.is_err() {
                return;
            }
            if render.exhausted() {
                return;
            }
        }
        if !running {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `GET /metrics/resource`: every running container's CPU and memory (see [`crate::usage`]).
async fn resource_metrics(State(k): State<Kubelet>, headers: HeaderMap) -> Response {
    if let Err((code, msg)) = k.authorize(&headers) {
        return error(code, msg);
    }
    let state_dir = k.pods.state_dir.clone();
    let page = tokio::task::spawn_blocking(move || {
        use nix::unistd::{sysconf, SysconfVar};
        let ticks = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as u64;
        let page = sysconf(SysconfVar::PAGE_SIZE).ok().flatten().unwrap_or(4096) as u64;
        let procs = crate::process::LinuxProcesses::default();
        let table = crate::usage::ProcTable::read();
        let mut containers = vec![];
        for rec in load_records(&state_dir) {
            for (name, c) in &rec.containers {
                let Some(p) = c.process.filter(|p| !c.done && procs.alive(*p)) else { continue };
                let (cpu_seconds, memory_bytes) = table.usage(p.pid, ticks, page);
                containers.push(crate::usage::ContainerUsage {
                    namespace: rec.namespace.clone(),
                    pod: rec.name.clone(),
                    container: name.clone(),
                    cpu_seconds,
                    memory_bytes,
                    started: c.started_at.map(|t| t.as_second()).unwrap_or(0),
                });
            }
        }
        let me = std::process::id() as i32;
        let agent =
            table.procs.get(&me).map_or((0.0, 0), |s| (s.cpu_ticks as f64 / ticks.max(1) as f64, s.rss_pages * page));
        crate::usage::render(&containers, agent, jiff::Timestamp::now().as_millisecond())
    })
    .await
    .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], page).into_response()
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
        .route("/exec/{ns}/{pod}/{container}", any(exec))
        .route("/attach/{ns}/{pod}/{container}", any(attach))
        .route("/portForward/{ns}/{pod}", any(port_forward))
        .route("/metrics/resource", get(resource_metrics))
        .with_state(Kubelet { pods, token });
    // Each connection's socket goes with its requests: port-forward splices into it.
    let app = app.into_make_service_with_connect_info::<stream::zerocopy::Socket>();
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubectl's tunnel gets its own 101 (RFC 6455's accept key, the subprotocol); any other
    /// WebSocket, or a malformed handshake, is left to the general path and its rejections.
    #[test]
    fn the_tunnels_handshake_is_answered_only_when_well_formed() {
        let req = |protocol: &str, version: &str, key: Option<&str>| {
            let mut b = axum::http::Request::builder()
                .method("GET")
                .uri("/portForward/default/web")
                .header(header::CONNECTION, "keep-alive, Upgrade")
                .header(header::UPGRADE, "websocket")
                .header(header::SEC_WEBSOCKET_VERSION, version)
                .header(header::SEC_WEBSOCKET_PROTOCOL, protocol);
            if let Some(k) = key {
                b = b.header(header::SEC_WEBSOCKET_KEY, k);
            }
            b.body(Body::empty()).unwrap()
        };
        let offered = |p: &str| p.split(',').map(|s| s.trim().to_string()).collect::<Vec<_>>();
        let protocols = stream::channel::PORTFORWARD_PROTOCOLS;
        let tunnel = "SPDY/3.1+portforward.k8s.io, v4.channel.k8s.io";
        let ok = tunnel_handshake(&req(tunnel, "13", Some("dGhlIHNhbXBsZSBub25jZQ==")), protocols, &offered(tunnel))
            .expect("a 101");
        assert_eq!(ok.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(ok.headers()[header::SEC_WEBSOCKET_ACCEPT], "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        assert_eq!(ok.headers()[header::SEC_WEBSOCKET_PROTOCOL], "SPDY/3.1+portforward.k8s.io");
        assert!(tunnel_handshake(
            &req("v4.channel.k8s.io", "13", Some("a2V5")),
            protocols,
            &offered("v4.channel.k8s.io")
        )
        .is_none());
        assert!(tunnel_handshake(&req(tunnel, "8", Some("a2V5")), protocols, &offered(tunnel)).is_none());
        assert!(tunnel_handshake(&req(tunnel, "13", None), protocols, &offered(tunnel)).is_none());
        assert!(tunnel_handshake(&req(tunnel, "13", Some("a2V5")), stream::channel::EXEC_PROTOCOLS, &offered(tunnel))
            .is_none());
    }

    #[test]
    fn since_from_seconds_or_a_time() {
        let now: jiff::Timestamp = "2026-11-25T10:00:00Z".parse().unwrap();
        let o = LogOptions { since_seconds: Some(30), ..Default::default() };
        assert_eq!(o.since(now).unwrap().unwrap().to_string(), "2026-11-25T09:59:30Z");
        let o = LogOptions { since_time: Some("2026-11-25T09:00:00.5Z".into()), ..Default::default() };
        assert_eq!(o.since(now).unwrap().unwrap().to_string(), "2026-11-25T09:00:00.5Z");
        assert!(LogOptions { since_time: Some("yesterday".into()), ..Default::default() }.since(now).is_err());
        assert_eq!(LogOptions::default().since(now).unwrap(), None);
    }

    #[test]
    fn which_run_a_log_request_reads() {
        let p = Some(ProcId { pid: 1, start_time: 1 });
        let last = Some(crate::podstatus::Terminated {
            exit_code: 1,
            signal: None,
            reason: "Error".into(),
            message: None,
            started_at: None,
            finished_at: jiff::Timestamp::UNIX_EPOCH,
            container_id: None,
        });
        let running_first = ContainerRecord { process: p, restart_count: 0, ..Default::default() };
        assert_eq!(log_attempt(&running_first, false, "c", "p"), Ok(0));
        assert_eq!(
            log_attempt(&running_first, true, "c", "p").unwrap_err(),
            "previous terminated container \"c\" in pod \"p\" not found"
        );
        let running_third = ContainerRecord { process: p, restart_count: 2, last: last.clone(), ..Default::default() };
        assert_eq!(log_attempt(&running_third, true, "c", "p"), Ok(1));
        // Crash-looping (waiting): both read the run that just ended, as kubelet's lastState.
        let waiting = ContainerRecord { process: None, restart_count: 2, last: last.clone(), ..Default::default() };
        assert_eq!(log_attempt(&waiting, false, "c", "p"), Ok(2));
        assert_eq!(log_attempt(&waiting, true, "c", "p"), Ok(2));
        let done = ContainerRecord { process: None, restart_count: 0, last, done: true, ..Default::default() };
        assert!(log_attempt(&done, true, "c", "p").is_err());
    }
}
