//! `podpath ui`: the lab as a live picture in a browser. An axum server on loopback serves one
//! page (its HTML, script and style built into the binary: no CDN, nothing fetched at run
//! time) and a small JSON API behind it:
//!
//! - `GET /api/events`: server-sent events — `picture` (the whole [`picture::Picture`], again
//!   after every change of the API's watched objects or of the lab's last read) and `timeline`
//!   (`podpath watch`'s lines);
//! - `POST /api/trace`: `podpath trace`, its JSON; `GET /api/rules?service=NS/NAME`: `podpath
//!   explain`'s; `GET /api/matrix`: `podpath policy matrix`'s; `POST /api/action`: `podpath
//!   node`/`fault` actions.
//!
//! Access as Jupyter's: the start prints a link with a one-time code that opens a session
//! (an HttpOnly, SameSite=Strict cookie); without it, the page asks for the lab's token. Requests
//! must name the listening address as their `Host` (no DNS rebinding), and actions are JSON
//! POSTs (no cross-site form can send one).

pub mod picture;
mod watcher;

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};

use crate::state::{load_state, ApiAccess, LabState};
use crate::{LabError, Result};

const INDEX: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");

/// How often the lab itself (processes, faults, the load balancer, the agents' health) is read.
const LAB_READ: Duration = Duration::from_millis(250);
/// Timeline lines a page gets when it connects.
const TIMELINE_KEPT: usize = 500;

struct App {
    dir: PathBuf,
    listen: SocketAddr,
    lab_token: Option<String>,
    token_path: Option<PathBuf>,
    /// One-time codes not used yet.
    codes: Mutex<HashSet<String>>,
    sessions: Mutex<HashSet<String>>,
    cookie: String,
    picture: watch::Receiver<Arc<String>>,
    timeline: broadcast::Sender<Arc<String>>,
    history: Mutex<VecDeque<Arc<String>>>,
    /// One trace at a time: each installs trace rules on every host of the lab.
    tracing: tokio::sync::Mutex<()>,
}

/// 128 random bits as hex, from the kernel.
fn secret() -> Result<String> {
    let mut b = [0u8; 16];
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(crate::io("read /dev/urandom"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Equal, in a time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serves the UI of the lab in `dir` on `listen` until the process ends. `ready` gets the
/// address bound and the link (with its one-time code) once the server accepts connections.
pub fn serve(dir: &Path, listen: SocketAddr, ready: impl FnOnce(SocketAddr, &str)) -> Result<()> {
    let st = load_state(dir)?.ok_or_else(|| LabError::Usage(format!("no lab in {}", dir.display())))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(crate::io("start the UI's runtime"))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(crate::io(format!("listen on {listen} (is another `podpath ui` there?)")))?;
        let bound = listener.local_addr().map_err(crate::io("read the UI's address"))?;
        let lab_token = match &st.token_file {
            Some(f) => {
                Some(std::fs::read_to_string(f).map_err(crate::io(format!("read {}", f.display())))?.trim().to_string())
            }
            None => None,
        };
        let code = secret()?;
        let (picture_tx, picture_rx) = watch::channel(Arc::new(String::from("null")));
        let (timeline, _) = broadcast::channel(256);
        let app = Arc::new(App {
            dir: dir.to_path_buf(),
            listen: bound,
            lab_token,
            token_path: st.token_file.clone(),
            codes: Mutex::new([code.clone()].into()),
            sessions: Mutex::new(HashSet::new()),
            cookie: format!("podpath_ui_{}", bound.port()),
            picture: picture_rx,
            timeline,
            history: Mutex::new(VecDeque::new()),
            tracing: tokio::sync::Mutex::new(()),
        });
        start_feeds(&app, st, picture_tx)?;
        let router = Router::new()
            .route("/", get(index))
            .route("/login", post(login))
            .route("/app.js", get(|| async { ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], APP_JS) }))
            .route("/app.css", get(|| async { ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS) }))
            .route("/api/events", get(events))
            .route("/api/picture", get(picture_now))
            .route("/api/trace", post(trace))
            .route("/api/rules", get(rules))
            .route("/api/matrix", get(matrix))
            .route("/api/action", post(action))
            .with_state(app.clone());
        ready(bound, &format!("http://{bound}/?code={code}"));
        axum::serve(listener, router).await.map_err(crate::io("serve the UI"))
    })
}

/// The watches of the API and the lab reader, feeding the picture and the timeline.
fn start_feeds(app: &Arc<App>, st: LabState, picture_tx: watch::Sender<Arc<String>>) -> Result<()> {
    let api = Arc::new(ApiAccess::of(&st)?);
    let shared = Arc::new(watcher::Shared::default());
    let (changed_tx, mut changed_rx) = watch::channel(0u64);
    for (resource, path) in watcher::RESOURCES {
        tokio::spawn(watcher::run(api.clone(), resource, path, shared.clone(), changed_tx.clone()));
    }
    // The lab reader: a thread, as the lab's reads are blocking ones (namespaces, processes).
    let (view_tx, mut view_rx) = watch::channel((st.clone(), picture::LabView::default()));
    let (reader_app, reader_shared) = (app.clone(), shared.clone());
    std::thread::Builder::new()
        .name("ui-lab-reader".into())
        .spawn(move || read_lab(&reader_app, &reader_shared, st, view_tx))
        .map_err(crate::io("start the UI's lab reader"))?;
    tokio::spawn(async move {
        loop {
            // Several changes close together make one picture.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let (st, mut view) = view_rx.borrow_and_update().clone();
            changed_rx.borrow_and_update();
            view.api_error = view.api_error.or_else(|| shared.api_error());
            let json = {
                let objects = shared.objects.lock().expect("not poisoned");
                serde_json::to_string(&picture::build(&st, &objects, &view)).expect("a picture serialises")
            };
            picture_tx.send_if_modified(|p| {
                if **p != json {
                    *p = Arc::new(json);
                    true
                } else {
                    false
                }
            });
            tokio::select! {
                r = changed_rx.changed() => if r.is_err() { return },
                r = view_rx.changed() => if r.is_err() { return },
            }
        }
    });
    Ok(())
}

/// Reads the lab every [`LAB_READ`]: its state file (gone: the lab was taken down), processes,
/// and `podpath watch`'s snapshot — its API part from the watched objects, the rest from the
/// lab's hosts — whose differences are the timeline.
fn read_lab(
    app: &App,
    shared: &watcher::Shared,
    mut st: LabState,
    view_tx: watch::Sender<(LabState, picture::LabView)>,
) {
    let started = Instant::now();
    let mut last = crate::watch::Snapshot::default();
    let mut reads = 0u64;
    loop {
        let mut view = picture::LabView::default();
        match load_state(&app.dir) {
            Ok(Some(now)) => st = now,
            _ => view.lab_down = true,
        }
        if !view.lab_down {
            view.processes = crate::up::status(&st).into_iter().map(|(c, _, alive)| (c, alive)).collect();
            let mut snap = crate::watch::Snapshot::default();
            {
                let objects = shared.objects.lock().expect("not poisoned");
                let all = |r: &str| objects.get(r).into_iter().flat_map(|m| m.values());
                crate::watch::of_objects(&mut snap, all("nodes"), all("pods"), all("endpointslices"));
            }
            match crate::watch::of_lab(&mut snap, &st, &app.dir).map(|()| snap) {
                Ok(snap) => {
                    let at = started.elapsed().as_secs_f64();
                    for line in crate::watch::diff(&last, &snap) {
                        let entry = Arc::new(json!({"at": at, "line": line}).to_string());
                        let mut h = app.history.lock().expect("not poisoned");
                        if h.len() == TIMELINE_KEPT {
                            h.pop_front();
                        }
                        h.push_back(entry.clone());
                        drop(h);
                        let _ = app.timeline.send(entry);
                    }
                    last = snap.clone();
                    view.snapshot = Some(snap);
                }
                Err(e) => view.api_error = Some(e.to_string()),
            }
        }
        if view_tx.is_closed() {
            return;
        }
        // Only a read that differs rebuilds the picture.
        view_tx.send_if_modified(|last| {
            if last.0 == st && last.1 == view {
                false
            } else {
                *last = (st.clone(), view);
                true
            }
        });
        // Reads of the lab's hosts leave freed pages behind; give them back now and then.
        reads += 1;
        if reads.is_multiple_of(8) {
            podpath_client::memory::trim();
        }
        std::thread::sleep(LAB_READ);
    }
}

/// Refuses requests whose `Host` is not the address listened on (a page of another site
/// reaching it through DNS rebinding names its own host).
fn host_ok(app: &App, headers: &HeaderMap) -> bool {
    // Listening beyond loopback was asked for (and warned about): any name of the machine goes.
    if !app.listen.ip().is_loopback() {
        return true;
    }
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else { return false };
    let port = app.listen.port();
    host == app.listen.to_string() || host == format!("localhost:{port}") || host == format!("127.0.0.1:{port}")
}

fn session_of(app: &App, headers: &HeaderMap) -> bool {
    let cookies = headers.get_all(header::COOKIE).iter().filter_map(|c| c.to_str().ok()).collect::<Vec<_>>().join("; ");
    let prefix = format!("{}=", app.cookie);
    let sessions = app.sessions.lock().expect("not poisoned");
    cookies.split(';').map(str::trim).filter_map(|c| c.strip_prefix(&prefix)).any(|s| sessions.contains(s))
}

fn new_session(app: &App) -> Result<(String, String)> {
    let s = secret()?;
    app.sessions.lock().expect("not poisoned").insert(s.clone());
    Ok((s.clone(), format!("{}={s}; HttpOnly; SameSite=Strict; Path=/", app.cookie)))
}

fn login_page(app: &App, status: StatusCode, message: &str) -> Response {
    let esc = |t: &str| t.replace('&', "&amp;").replace('<', "&lt;");
    let where_ = app.token_path.as_ref().map(|p| format!("sudo cat {}", p.display())).unwrap_or_default();
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>podpath ui: sign in</title>\
         <link rel=\"stylesheet\" href=\"/app.css\"></head><body class=\"login\"><main>\
         <h1>podpath ui</h1><p id=\"login-message\" role=\"alert\">{}</p>\
         <form method=\"post\" action=\"/login\"><label for=\"token\">The lab's token \
         (<code>{}</code>)</label>\
         <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" required>\
         <button type=\"submit\">Open</button></form></main></body></html>",
        esc(message),
        esc(&where_)
    );
    (status, Html(body)).into_response()
}

fn misdirected() -> Response {
    (StatusCode::MISDIRECTED_REQUEST, "podpath ui answers only requests for the address it listens on\n")
        .into_response()
}

#[derive(Deserialize)]
struct IndexQuery {
    code: Option<String>,
}

async fn index(State(app): State<Arc<App>>, headers: HeaderMap, Query(q): Query<IndexQuery>) -> Response {
    if !host_ok(&app, &headers) {
        return misdirected();
    }
    if let Some(code) = q.code {
        let used = app.codes.lock().expect("not poisoned").remove(&code);
        if !used {
            return login_page(
                &app,
                StatusCode::UNAUTHORIZED,
                "This link's code is wrong or was used already (each works once). Give the lab's token, \
                 or start `podpath ui` again for a new link.",
            );
        }
        return match new_session(&app) {
            Ok((_, cookie)) => ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        };
    }
    if !session_of(&app, &headers) {
        return login_page(
            &app,
            StatusCode::UNAUTHORIZED,
            "Open the link `podpath ui` printed, or give the lab's token.",
        );
    }
    ([(header::CACHE_CONTROL, "no-store")], Html(INDEX)).into_response()
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(app): State<Arc<App>>, headers: HeaderMap, axum::Form(f): axum::Form<LoginForm>) -> Response {
    if !host_ok(&app, &headers) {
        return misdirected();
    }
    match &app.lab_token {
        Some(t) if same(t, f.token.trim()) => match new_session(&app) {
            Ok((_, cookie)) => ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
        Some(_) => login_page(&app, StatusCode::UNAUTHORIZED, "That is not the lab's token."),
        None => {
            login_page(&app, StatusCode::UNAUTHORIZED, "This lab has no token: open the link `podpath ui` printed.")
        }
    }
}

/// A refused or failed API request, answered as JSON: `{"error": "..."}`.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({"error": self.1}))).into_response()
    }
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    ApiError(status, message.to_string()).into_response()
}

/// The checks every `/api` request passes.
fn api_ok(app: &App, headers: &HeaderMap) -> Option<Response> {
    if !host_ok(app, headers) {
        return Some(misdirected());
    }
    if !session_of(app, headers) {
        return Some(error(StatusCode::UNAUTHORIZED, "not signed in: open the link `podpath ui` printed"));
    }
    None
}

async fn picture_now(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = api_ok(&app, &headers) {
        return r;
    }
    let json = app.picture.borrow().clone();
    ([(header::CONTENT_TYPE, "application/json")], (*json).clone()).into_response()
}

async fn events(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Some(r) = api_ok(&app, &headers) {
        return r;
    }
    use futures::StreamExt as _;
    let history: Vec<Arc<String>> = app.history.lock().expect("not poisoned").iter().cloned().collect();
    let mut pictures = app.picture.clone();
    pictures.mark_changed();
    let pictures = futures::stream::unfold(pictures, |mut rx| async move {
        rx.changed().await.ok()?;
        let p = rx.borrow_and_update().clone();
        Some((Event::default().event("picture").data(p.as_str()), rx))
    });
    let lines = tokio_stream::wrappers::BroadcastStream::new(app.timeline.subscribe())
        // A page too slow to take every line misses some rather than holding the rest back.
        .filter_map(|l| async move { l.ok() })
        .map(|l| Event::default().event("timeline").data(l.as_str()));
    let past = futures::stream::iter(history.into_iter().map(|l| Event::default().event("timeline").data(l.as_str())));
    let stream = futures::stream::select(pictures, past.chain(lines)).map(Ok::<_, std::convert::Infallible>);
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(5))).into_response()
}

fn current_state(app: &App) -> std::result::Result<LabState, ApiError> {
    match load_state(&app.dir) {
        Ok(Some(st)) => Ok(st),
        Ok(None) => Err(ApiError(
            StatusCode::GONE,
            "the lab is down (its state is gone); start it again with `podpath up`".into(),
        )),
        Err(e) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}

/// Runs blocking lab code off the runtime's threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> std::result::Result<T, ApiError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e @ LabError::Usage(_))) => Err(ApiError(StatusCode::BAD_REQUEST, e.to_string())),
        Ok(Err(e)) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(e) => Err(ApiError(StatusCode::INTERNAL_SERVER_ERROR, format!("the lab call failed: {e}"))),
    }
}

#[derive(Deserialize)]
struct TraceAsk {
    from: Option<String>,
    target: String,
    host: Option<String>,
    timeout: Option<f64>,
}

async fn trace(State(app): State<Arc<App>>, headers: HeaderMap, body: Option<Json<TraceAsk>>) -> Response {
    if let Some(r) = api_ok(&app, &headers) {
        return r;
    }
    let Some(Json(ask)) = body else {
        return error(StatusCode::BAD_REQUEST, "send JSON: {\"target\": \"http://IP/\", \"from\": \"client\"}");
    };
    let st = match current_state(&app) {
        Ok(st) => st,
        Err(r) => return r.into_response(),
    };
    let timeout = ask.timeout.unwrap_or(3.0);
    if !(timeout > 0.0 && timeout <= 60.0) {
        return error(StatusCode::BAD_REQUEST, format!("timeout {timeout}: give 0 < seconds <= 60"));
    }
    let Ok(_one) = app.tracing.try_lock() else {
        return error(StatusCode::CONFLICT, "a trace is running; try again when it ends");
    };
    let result = blocking(move || {
        let (target, path, mut host_header) = crate::trace::run::parse_target(&ask.target)?;
        if let Some(h) = ask.host.filter(|h| !h.is_empty()) {
            if h.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(LabError::Usage(format!("host {h:?}: give a host name (and port), e.g. shop.example")));
            }
            host_header = h;
        }
        let req = crate::trace::run::Request {
            from: ask.from.unwrap_or_else(|| "client".into()),
            target,
            path,
            host_header,
            timeout: Duration::from_secs_f64(timeout),
        };
        crate::trace::run::trace_once_more_if_unheard(&st, &req)
    })
    .await;
    match result {
        // `podpath trace --output json`'s document, and its `--output svg` picture beside it
        // for the page's export.
        Ok(t) => {
            let mut doc = serde_json::to_value(&t).expect("a trace serialises");
            doc["svg"] = json!(crate::trace::render::svg(&t));
            Json(doc).into_response()
        }
        Err(r) => r.into_response(),
    }
}

#[derive(Deserialize)]
struct RulesAsk {
    service: String,
}

async fn rules(State(app): State<Arc<App>>, headers: HeaderMap, Query(q): Query<RulesAsk>) -> Response {
    if let Some(r) = api_ok(&app, &headers) {
        return r;
    }
    let st = match current_state(&app) {
        Ok(st) => st,
        Err(r) => return r.into_response(),
    };
    match blocking(move || crate::explain(&st, &q.service)).await {
        Ok(e) => Json(e).into_response(),
        Err(r) => r.into_response(),
    }
}

#[derive(Deserialize)]
struct MatrixAsk {
    namespaces: Option<String>,
    ports: Option<String>,
    protocols: Option<String>,
}

fn list_of(v: &Option<String>) -> Vec<String> {
    v.as_deref().unwrap_or("").split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

async fn matrix(State(app): State<Arc<App>>, headers: HeaderMap, Query(q): Query<MatrixAsk>) -> Response {
    if let Some(r) = api_ok(&app, &headers) {
        return r;
    }
    let st = match current_state(&app) {
        Ok(st) => st,
        Err(r) => return r.into_response(),
    };
    let namespaces = list_of(&q.namespaces);
    let ports: std::result::Result<Vec<u16>, _> = {
        let p = list_of(&q.ports);
        if p.is_empty() {
            Ok(vec![80])
        } else {
            p.iter().map(|p| p.parse::<u16>()).collect()
        }
    };
    let Ok(ports) = ports else {
        return error(StatusCode::BAD_REQUEST, "ports: give port numbers, comma-separated (80,443)");
    };
    let protocols = {
        let p = list_of(&q.protocols);
        if p.is_empty() {
            vec!["tcp".to_string()]
        } else {
            p
        }
    };
    let result = blocking(move || {
        let protocols = protocols.iter().map(|p| p.parse()).collect::<Result<Vec<crate::policy::Protocol>>>()?;
        let pods = crate::policy::pods(&st, &namespaces)?;
        if pods.is_empty() {
            return Err(LabError::Usage("no running pods with a pod network address in these namespaces".into()));
        }
        let m = crate::policy::probe_all(&pods, &ports, &protocols, Duration::from_millis(500))?;
        let ips: serde_json::Map<String, Value> =
            pods.iter().map(|p| (p.id.clone(), json!(p.ip.to_string()))).collect();
        Ok(json!({"matrix": m, "ips": ips}))
    })
    .await;
    match result {
        Ok(v) => Json(v).into_response(),
        Err(r) => r.into_response(),
    }
}

#[derive(Deserialize)]
struct ActionAsk {
    /// `node-stop`, `node-start`, `link-down`, `link-up`, `loss`, `stall-proxy`, `flush-rules`,
    /// `kill-pod`, `clear`.
    action: String,
    node: Option<String>,
    pod: Option<String>,
    percent: Option<u8>,
    seconds: Option<u32>,
}

async fn action(State(app): State<Arc<App>>, headers: HeaderMap, body: Option<Json<ActionAsk>>) -> Response {
    if let Some(r) = api_ok(&app, &headers) {
        return r;
    }
    let Some(Json(ask)) = body else {
        return error(StatusCode::BAD_REQUEST, "send JSON: {\"action\": \"node-stop\", \"node\": \"node-2\"}");
    };
    let st = match current_state(&app) {
        Ok(st) => st,
        Err(r) => return r.into_response(),
    };
    let dir = app.dir.clone();
    let result = blocking(move || act(&st, &dir, ask)).await;
    match result {
        Ok(message) => Json(json!({"message": message})).into_response(),
        Err(r) => r.into_response(),
    }
}

/// Does what `podpath node`/`fault` would; returns the CLI's line for it.
fn act(st: &LabState, dir: &Path, ask: ActionAsk) -> Result<String> {
    use crate::fault::{self, Request};
    let node = || -> Result<String> {
        let n = ask.node.clone().ok_or_else(|| LabError::Usage(format!("{}: say which node", ask.action)))?;
        if !(1..=st.nodes).any(|i| n == format!("node-{i}")) {
            return Err(LabError::Usage(format!("no node {n:?} in this lab (node-1 … node-{})", st.nodes)));
        }
        Ok(n)
    };
    let made = |req: Request| -> Result<String> {
        let f = fault::make(st, dir, &node()?, &req)?;
        Ok(format!("{}: {}", f.node, f.detail))
    };
    match ask.action.as_str() {
        "node-stop" => {
            let n = node()?;
            crate::up::stop_node(dir, &n)?;
            Ok(format!("{n}: stopped (its agent and pods killed, as power lost)"))
        }
        "node-start" => {
            let n = node()?;
            let took = crate::up::start_node(dir, &n)?;
            Ok(format!("{n}: started; Ready {:.1} s later", took.as_secs_f64()))
        }
        "link-down" => made(Request::LinkDown),
        "link-up" => {
            let n = node()?;
            fault::link_up(dir, &n)?;
            Ok(format!("{n}: eth0 (the uplink) up"))
        }
        "loss" => made(Request::Loss(ask.percent.filter(|p| (1..=100).contains(p)).ok_or_else(|| {
            LabError::Usage("loss: give percent, 1 to 100".into())
        })?)),
        "stall-proxy" => made(Request::stall_for(ask.seconds)),
        "flush-rules" => {
            let n = node()?;
            let took = fault::flush_rules(st, &n)?;
            Ok(format!("{n}: service proxy rules flushed; the node agent rewrote them {:.1} s later", took.as_secs_f64()))
        }
        "kill-pod" => {
            let pod = ask.pod.clone().ok_or_else(|| LabError::Usage("kill-pod: say which pod (NS/NAME)".into()))?;
            let pid = fault::kill_pod(st, &pod)?;
            Ok(format!("pod {pod}: process {pid} killed"))
        }
        "clear" => {
            let only = ask.node.clone();
            let cleared = fault::clear(dir, |f| only.as_ref().is_none_or(|n| *n == f.node))?;
            Ok(if cleared.is_empty() {
                "no faults to clear".into()
            } else {
                cleared.iter().map(|f| format!("{}: cleared {}", f.node, f.detail)).collect::<Vec<_>>().join("; ")
            })
        }
        other => Err(LabError::Usage(format!(
            "no action {other:?}: node-stop, node-start, link-down, link-up, loss, stall-proxy, flush-rules, kill-pod, clear"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UI server on a lab whose API is unreachable (port 1): what is answered without one.
    fn server() -> (tempfile::TempDir, SocketAddr, String) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("token"), "sesame\n").unwrap();
        let st = json!({"name": "t", "nodes": 2, "proxy_mode": "iptables", "api": "127.0.0.1:1",
            "token_file": dir.path().join("token"), "namespaces": [], "procs": []});
        std::fs::write(dir.path().join("lab.json"), st.to_string()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = dir.path().to_path_buf();
        // The server runs until the test process ends.
        std::thread::spawn(move || {
            let r = serve(&path, "127.0.0.1:0".parse().unwrap(), |addr, link| {
                tx.send((addr, link.to_string())).unwrap();
            });
            panic!("the UI server ended: {r:?}");
        });
        let (addr, link) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        (dir, addr, link)
    }

    /// One HTTP/1.1 exchange on its own connection: status, headers (lower-case names), body.
    fn ask(
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, Vec<(String, String)>, String) {
        use std::io::{Read as _, Write as _};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            req += &format!("Host: {addr}\r\n");
        }
        for (k, v) in headers {
            req += &format!("{k}: {v}\r\n");
        }
        req += "\r\n";
        req += body;
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        // An event stream never ends: what came within the timeout is enough.
        let mut buf = [0u8; 65536];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => out.push_str(&String::from_utf8_lossy(&buf[..n])),
            }
            if out.contains("event: picture") {
                break;
            }
        }
        let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
        let mut lines = head.lines();
        let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        let headers =
            lines.filter_map(|l| l.split_once(": ")).map(|(k, v)| (k.to_ascii_lowercase(), v.to_string())).collect();
        (status, headers, body.to_string())
    }

    fn header<'a>(h: &'a [(String, String)], name: &str) -> &'a str {
        h.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).unwrap_or_default()
    }

    #[test]
    fn sign_in_by_code_once_or_by_token_and_the_api_refuses_strangers() {
        let (_dir, addr, link) = server();
        let code = link.split("code=").nth(1).unwrap().to_string();
        let (status, _, page) = ask(addr, "GET", "/", &[], "");
        assert_eq!(status, 401);
        assert!(page.contains("give the lab's token"), "{page}");
        let (status, _, page) = ask(addr, "GET", "/?code=0123", &[], "");
        assert_eq!(status, 401);
        assert!(page.contains("wrong or was used already"), "{page}");
        let (status, h, _) = ask(addr, "GET", &format!("/?code={code}"), &[], "");
        assert_eq!((status, header(&h, "location")), (303, "/"));
        let cookie = header(&h, "set-cookie").split(';').next().unwrap().to_string();
        assert!(header(&h, "set-cookie").contains("HttpOnly; SameSite=Strict"), "{h:?}");
        let (status, _, _) = ask(addr, "GET", &format!("/?code={code}"), &[], "");
        assert_eq!(status, 401, "a code works once");
        let (status, _, page) = ask(addr, "GET", "/", &[("Cookie", &cookie)], "");
        assert_eq!(status, 200);
        assert!(page.contains("<svg id=\"map\""), "{page}");

        // The API: a session needed; the picture says the lab's API is unreachable.
        let (status, _, body) = ask(addr, "GET", "/api/picture", &[], "");
        assert_eq!(status, 401);
        assert!(body.contains("not signed in"), "{body}");
        let started = Instant::now();
        let picture = loop {
            let (status, _, body) = ask(addr, "GET", "/api/picture", &[("Cookie", &cookie)], "");
            assert_eq!(status, 200);
            let p: Value = serde_json::from_str(&body).unwrap();
            if p["api_error"].is_string() || started.elapsed() > Duration::from_secs(10) {
                break p;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(picture["lab"]["name"], "t");
        assert!(picture["api_error"].as_str().unwrap_or_default().contains("127.0.0.1:1"), "{picture}");
        let (status, h, body) = ask(addr, "GET", "/api/events", &[("Cookie", &cookie)], "");
        assert_eq!((status, header(&h, "content-type")), (200, "text/event-stream"));
        assert!(body.contains("event: picture\ndata: {\"lab\":{\"name\":\"t\""), "{body}");

        // Bad requests are said in words.
        let json_body = [("Cookie", cookie.as_str()), ("Content-Type", "application/json")];
        let (status, _, body) = ask(addr, "POST", "/api/action", &json_body, r#"{"action": "explode"}"#);
        assert_eq!(status, 400);
        assert!(body.contains("no action \\\"explode\\\": node-stop"), "{body}");
        let (status, _, body) =
            ask(addr, "POST", "/api/action", &json_body, r#"{"action": "node-stop", "node": "node-9"}"#);
        assert_eq!(status, 400);
        assert!(body.contains("no node \\\"node-9\\\" in this lab (node-1 … node-2)"), "{body}");
        let (status, _, body) = ask(addr, "POST", "/api/trace", &[("Cookie", &cookie)], "");
        assert_eq!(status, 400);
        assert!(body.contains("send JSON"), "{body}");
        let (status, _, body) =
            ask(addr, "POST", "/api/trace", &json_body, r#"{"target": "http://10.96.0.1/", "timeout": 99}"#);
        assert_eq!(status, 400);
        assert!(body.contains("give 0 < seconds <= 60"), "{body}");

        // Another site's page reaching the loopback server by a name of its own is refused.
        let (status, _, _) = ask(addr, "GET", "/", &[("Host", &format!("evil.example:{}", addr.port()))], "");
        assert_eq!(status, 421);

        // The lab's token opens a session too; anything else is refused.
        let form = [("Content-Type", "application/x-www-form-urlencoded")];
        let (status, _, page) = ask(addr, "POST", "/login", &form, "token=nope");
        assert_eq!(status, 401);
        assert!(page.contains("That is not the lab's token."), "{page}");
        let (status, h, _) = ask(addr, "POST", "/login", &form, "token=sesame");
        assert_eq!(status, 303);
        let second = header(&h, "set-cookie").split(';').next().unwrap().to_string();
        assert_ne!(second, cookie);
        assert_eq!(ask(addr, "GET", "/api/picture", &[("Cookie", &second)], "").0, 200);
    }

    /// WCAG 2 contrast of two `#rrggbb` colours.
    fn contrast(a: &str, b: &str) -> f64 {
        let lum = |h: &str| {
            let c = |i: usize| {
                let v = f64::from(u8::from_str_radix(&h[1 + 2 * i..3 + 2 * i], 16).unwrap()) / 255.0;
                if v <= 0.03928 {
                    v / 12.92
                } else {
                    ((v + 0.055) / 1.055).powf(2.4)
                }
            };
            0.2126 * c(0) + 0.7152 * c(1) + 0.0722 * c(2)
        };
        let (x, y) = (lum(a), lum(b));
        (x.max(y) + 0.05) / (x.min(y) + 0.05)
    }

    /// The style sheet's promise: every text colour on every background it is drawn on keeps
    /// a contrast of at least 4.5:1 (WCAG AA for normal text).
    #[test]
    fn text_colours_keep_aa_contrast_on_their_backgrounds() {
        let root = APP_CSS.split(":root {").nth(1).unwrap().split('}').next().unwrap();
        let var = |name: &str| -> String {
            let at = root.find(&format!("--{name}:")).unwrap_or_else(|| panic!("no --{name}"));
            root[at..].split(':').nth(1).unwrap().split(';').next().unwrap().trim().to_string()
        };
        let literal = |sel: &str, prop: &str| -> String {
            let rule = APP_CSS.split(&format!("{sel} {{")).nth(1).unwrap_or_else(|| panic!("no rule {sel}"));
            let rule = rule.split('}').next().unwrap();
            let v = rule.split(&format!("{prop}:")).nth(1).unwrap().split(';').next().unwrap().trim().to_string();
            v
        };
        let texts = ["fg", "muted", "ok", "bad", "warn", "accent", "trace"].map(var);
        let backgrounds = [
            var("bg"),
            var("panel"),
            literal("svg .pod rect", "fill"),
            literal("svg .pod[data-ready=\"false\"] rect", "fill"),
            literal("svg .svc rect", "fill"),
        ];
        for t in &texts {
            for b in &backgrounds {
                assert!(contrast(t, b) >= 4.5, "{t} on {b}: {:.2}", contrast(t, b));
            }
        }
        // A changed rule: its own background.
        assert!(contrast(&var("fg"), &literal(".rule.changed", "background")) >= 4.5);
    }

    #[test]
    fn secrets_differ_and_compare_in_full() {
        let (a, b) = (secret().unwrap(), secret().unwrap());
        assert_eq!(a.len(), 32);
        assert_ne!(a, b);
        assert!(same(&a, &a.clone()));
        assert!(!same(&a, &b) && !same(&a, &a[..31]));
    }
}
