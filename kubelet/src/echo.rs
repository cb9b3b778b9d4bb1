//! The built-in `podpath/echo` workload: an HTTP server that tells the caller where its request
//! landed (pod, node, pod IP) and what it looked like on arrival (client address, request line,
//! headers). Plain text for curl, JSON when asked (`Accept: application/json` or `?format=json`).
//! Optional per-port behaviours reproduce the usual nginx set-up of scenario 2: a port that
//! answers `301 Moved Permanently` to https, and a port that serves HTTPS with a self-signed
//! certificate.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;

/// Who this server is: taken from the environment the node agent gives every workload.
#[derive(Debug, Clone, Default)]
pub struct Identity {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_ip: String,
    pub node_name: String,
    /// An extra line the pod's args can set (`--message`), to tell versions apart.
    pub message: Option<String>,
}

impl Identity {
    /// Reads `POD_NAME`, `POD_NAMESPACE`, `POD_IP` and `NODE_NAME`.
    pub fn from_env() -> Identity {
        let var = |k: &str| std::env::var(k).unwrap_or_default();
        Identity {
            pod_name: var("POD_NAME"),
            pod_namespace: var("POD_NAMESPACE"),
            pod_ip: var("POD_IP"),
            node_name: var("NODE_NAME"),
            message: None,
        }
    }
}

/// What one listening port does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PortMode {
    Echo,
    /// Answers every request with a redirect to the same URL over https.
    RedirectToHttps,
    /// Echo over TLS.
    Https,
    /// gRPC over cleartext HTTP/2: the standard health service (`grpc.health.v1.Health/Check`
    /// answers SERVING), the pod's name in the `x-pod` response header.
    Grpc,
}

/// The echo server's options, parsed from the container's `args`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EchoOptions {
    pub ports: Vec<(u16, PortMode)>,
    pub message: Option<String>,
    /// UDP container ports: each datagram is answered with `NAMESPACE/POD` (what the
    /// upstream suite's serve-hostname answers, so probes can tell who replied).
    pub udp_ports: Vec<u16>,
    /// Print a line per HTTP request to stdout (`kubectl logs` shows them), as nginx's access
    /// log does: who asked what, and the answer's status.
    pub access_log: bool,
}

/// Usage text of the echo image's args (shown in the pod's log when they are wrong).
pub const ECHO_USAGE: &str = "podpath/echo args: [--https-port PORT]... [--redirect-to-https PORT]... [--grpc-port PORT]... [--message TEXT] [--access-log]
  every TCP containerPort (default 8080) answers with the echo page, every UDP one with
  NAMESPACE/POD to each datagram;
  --https-port PORT        serve HTTPS (self-signed certificate) on PORT
  --redirect-to-https PORT answer on PORT with 301 Moved Permanently to https://<host><uri>
  --grpc-port PORT         serve gRPC (grpc.health.v1.Health/Check) over cleartext HTTP/2 on PORT
  --message TEXT           add a line to every answer (e.g. the version of a Deployment)
  --access-log             print a line per HTTP request to stdout (kubectl logs shows it)";

/// Combines the pod's container ports with the image's args. Ports named in the args take the
/// mode they ask for; the other container ports echo.
pub fn parse_options(container_ports: &[u16], args: &[String]) -> Result<EchoOptions, String> {
    let mut ports: Vec<(u16, PortMode)> = container_ports.iter().map(|p| (*p, PortMode::Echo)).collect();
    let mut message = None;
    let mut access_log = false;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| it.next().cloned()).ok_or(format!("{flag} needs a value"));
        match flag {
            "--https-port" | "--redirect-to-https" | "--grpc-port" => {
                let v = value()?;
                let port: u16 = v.parse().ok().filter(|p| *p > 0).ok_or(format!("{flag}: {v:?} is not a port"))?;
                let mode = match flag {
                    "--https-port" => PortMode::Https,
                    "--grpc-port" => PortMode::Grpc,
                    _ => PortMode::RedirectToHttps,
                };
                ports.retain(|(p, _)| *p != port);
                ports.push((port, mode));
            }
            "--message" => message = Some(value()?),
            "--access-log" if inline.is_none() => access_log = true,
            other => return Err(format!("unknown argument {other:?}\n{ECHO_USAGE}")),
        }
    }
    if ports.is_empty() {
        ports.push((8080, PortMode::Echo));
    }
    ports.sort();
    Ok(EchoOptions { ports, message, udp_ports: vec![], access_log })
}

/// Serves every port until the process is stopped.
pub async fn serve(identity: Identity, options: EchoOptions) -> std::io::Result<()> {
    let identity = Arc::new(Identity { message: options.message.clone(), ..identity });
    let tls = if options.ports.iter().any(|(_, m)| *m == PortMode::Https) {
        Some(tls_acceptor(&identity).map_err(std::io::Error::other)?)
    } else {
        None
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (port, mode) in &options.ports {
        let listener = bind_any(*port, |a| async move { TcpListener::bind(a).await })
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on port {port}: {e}")))?;
        eprintln!("podpath/echo: {mode:?} on port {port}");
        tasks.spawn(accept_loop(listener, *mode, identity.clone(), tls.clone(), options.access_log));
    }
    for port in &options.udp_ports {
        let socket = bind_any(*port, |a| async move { tokio::net::UdpSocket::bind(a).await })
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on UDP port {port}: {e}")))?;
        eprintln!("podpath/echo: UDP on port {port}");
        let who = format!("{}/{}\n", identity.pod_namespace, identity.pod_name);
        tasks.spawn(async move {
            let mut buf = [0u8; 2048];
            loop {
                let (_, from) = socket.recv_from(&mut buf).await?;
                // A reply that cannot be sent (the sender is gone) is no reason to stop.
                let _ = socket.send_to(who.as_bytes(), from).await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(std::io::Error::other)??;
    }
    Ok(())
}

fn canonical(a: std::net::SocketAddr) -> std::net::SocketAddr {
    std::net::SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Binds every address of the pod, both families (`[::]`, or `0.0.0.0` where IPv6 is off).
async fn bind_any<T, F: std::future::Future<Output = std::io::Result<T>>>(
    port: u16,
    bind: impl Fn(std::net::SocketAddr) -> F,
) -> std::io::Result<T> {
    podpath_client::daemon::bind_any(std::net::SocketAddr::from(([0, 0, 0, 0], port)), bind).await.map_err(|(_, e)| e)
}

async fn accept_loop(
    listener: TcpListener,
    mode: PortMode,
    identity: Arc<Identity>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    access_log: bool,
) -> std::io::Result<()> {
    loop {
        let (stream, client) = listener.accept().await?;
        let server = stream.local_addr()?;
        // IPv4 peers of the dual-stack socket as themselves (not `::ffff:a.b.c.d`).
        let (client, server) = (canonical(client), canonical(server));
        let _ = stream.set_nodelay(true);
        let identity = identity.clone();
        let tls = tls.clone();
        if mode == PortMode::Grpc {
            let who = format!("{}/{}", identity.pod_namespace, identity.pod_name);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let answer = grpc_answer(req.uri().path(), &who);
                    async move { Ok::<_, Infallible>(answer) }
                });
                let h2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
                let _ = h2.serve_connection(TokioIo::new(stream), svc).await;
            });
            continue;
        }
        tokio::spawn(async move {
            let scheme = if mode == PortMode::Https { "https" } else { "http" };
            let svc = hyper::service::service_fn(move |req| {
                let page = answer(&req, mode, &identity, client, server, scheme);
                if access_log {
                    println!("{}", access_line(&req, client, page.status()));
                }
                async move { Ok::<_, Infallible>(page) }
            });
            let http = hyper::server::conn::http1::Builder::new();
            match (mode, tls) {
                (PortMode::Https, Some(tls)) => {
                    if let Ok(stream) = tls.accept(stream).await {
                        let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
                _ => {
                    let _ = http.serve_connection(TokioIo::new(stream), svc).await;
                }
            }
        });
    }
}

/// One access-log line: `10.244.0.1:40312 "GET /path HTTP/1.1" 200 host=web.example`.
fn access_line<B>(req: &Request<B>, client: SocketAddr, status: StatusCode) -> String {
    let host = req.headers().get(hyper::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("-");
    format!(
        "{client} \"{} {} {}\" {} host={host}",
        req.method(),
        req.uri(),
        version_text(req.version()),
        status.as_u16()
    )
}

type GrpcBody = http_body_util::StreamBody<
    futures::stream::Iter<std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, Infallible>>>,
>;

/// The answer to one gRPC call: the health service's Check says SERVING (the message
/// `status: 1`, length-prefixed); any other method is UNIMPLEMENTED (status 12), as a gRPC
/// server answers it. The status travels in the trailers.
pub fn grpc_answer(path: &str, who: &str) -> Response<GrpcBody> {
    let (message, status, text): (Option<&[u8]>, &str, &str) = match path {
        "/grpc.health.v1.Health/Check" => (Some(&[0x08, 0x01]), "0", ""),
        _ => (None, "12", "unknown method"),
    };
    let mut frames = Vec::new();
    if let Some(m) = message {
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(m.len() as u32).to_be_bytes());
        framed.extend_from_slice(m);
        frames.push(Ok(hyper::body::Frame::data(Bytes::from(framed))));
    }
    let mut trailers = hyper::HeaderMap::new();
    trailers.insert("grpc-status", hyper::header::HeaderValue::from_static(if status == "0" { "0" } else { "12" }));
    if !text.is_empty() {
        trailers.insert("grpc-message", hyper::header::HeaderValue::from_static("unknown method"));
    }
    frames.push(Ok(hyper::body::Frame::trailers(trailers)));
    let mut r = Response::new(http_body_util::StreamBody::new(futures::stream::iter(frames)));
    r.headers_mut().insert("content-type", hyper::header::HeaderValue::from_static("application/grpc"));
    if let Ok(v) = hyper::header::HeaderValue::from_str(who) {
        r.headers_mut().insert("x-pod", v);
    }
    r
}

fn tls_acceptor(identity: &Identity) -> Result<tokio_rustls::TlsAcceptor, String> {
    let mut names = vec!["localhost".to_string()];
    for n in [&identity.pod_name, &identity.pod_ip] {
        if !n.is_empty() {
            names.push(n.clone());
        }
    }
    let cert = rcgen::generate_simple_self_signed(names).map_err(|e| format!("cannot make a certificate: {e}"))?;
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der())
        .map_err(|e| format!("bad generated key: {e}"))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .map_err(|e| e.to_string())?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

fn version_text(v: hyper::Version) -> &'static str {
    match v {
        hyper::Version::HTTP_09 => "HTTP/0.9",
        hyper::Version::HTTP_10 => "HTTP/1.0",
        hyper::Version::HTTP_2 => "HTTP/2.0",
        _ => "HTTP/1.1",
    }
}

/// Builds the answer to one request (pure: everything it needs is in its arguments).
pub fn answer(
    req: &Request<Incoming>,
    mode: PortMode,
    identity: &Identity,
    client: SocketAddr,
    server: SocketAddr,
    scheme: &str,
) -> Response<Full<Bytes>> {
    let head = RequestHead {
        method: req.method().as_str().to_string(),
        uri: req.uri().to_string(),
        version: version_text(req.version()).to_string(),
        headers: req
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect(),
    };
    render(&head, mode, identity, client, server, scheme)
}

/// The parts of a request the echo page shows.
#[derive(Debug, Clone)]
pub struct RequestHead {
    pub method: String,
    pub uri: String,
    pub version: String,
    pub headers: Vec<(String, String)>,
}

/// Renders the page for a request head (separate from hyper so it is unit-testable).
pub fn render(
    head: &RequestHead,
    mode: PortMode,
    identity: &Identity,
    client: SocketAddr,
    server: SocketAddr,
    scheme: &str,
) -> Response<Full<Bytes>> {
    let header = |name: &str| head.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str());
    if mode == PortMode::RedirectToHttps {
        // Same as nginx's `return 301 https://$host$request_uri;`: the port is dropped.
        let host = header("host").unwrap_or(&identity.pod_ip);
        let host = match host.strip_prefix('[') {
            Some(v6) => format!("[{}]", v6.split(']').next().unwrap_or_default()),
            None => host.split(':').next().unwrap_or_default().to_string(),
        };
        let location = format!("https://{host}{}", path_of(&head.uri));
        let body = format!(
            "<html>\r\n<head><title>301 Moved Permanently</title></head>\r\n<body>\r\n<center><h1>301 Moved Permanently</h1></center>\r\n<hr><center>podpath/echo ({}/{})</center>\r\n</body>\r\n</html>\r\n",
            identity.pod_namespace, identity.pod_name
        );
        return Response::builder()
            .status(StatusCode::MOVED_PERMANENTLY)
            .header("location", location)
            .header("content-type", "text/html")
            .body(Full::new(Bytes::from(body)))
            .expect("valid response");
    }
    let wants_json = header("accept").is_some_and(|a| a.contains("application/json"))
        || head.uri.split_once('?').is_some_and(|(_, q)| q.split('&').any(|kv| kv == "format=json"));
    let (body, content_type) = if wants_json {
        let v = json!({
            "pod": {"name": identity.pod_name, "namespace": identity.pod_namespace, "ip": identity.pod_ip},
            "node": identity.node_name,
            "message": identity.message,
            "client": {"ip": client.ip().to_string(), "port": client.port()},
            "server": {"ip": server.ip().to_string(), "port": server.port(), "scheme": scheme},
            "request": {
                "method": head.method, "uri": head.uri, "version": head.version,
                "headers": head.headers.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
            },
        });
        (format!("{v:#}\n"), "application/json")
    } else {
        let mut s = String::new();
        if let Some(m) = &identity.message {
            s.push_str(&format!("{m}\n"));
        }
        s.push_str(&format!("pod: {}/{}\n", identity.pod_namespace, identity.pod_name));
        s.push_str(&format!("pod IP: {}\n", identity.pod_ip));
        s.push_str(&format!("node: {}\n", identity.node_name));
        s.push_str(&format!("client: {client}\n"));
        s.push_str(&format!("server: {scheme}://{server}\n\n"));
        s.push_str(&format!("{} {} {}\n", head.method, head.uri, head.version));
        for (k, v) in &head.headers {
            s.push_str(&format!("{k}: {v}\n"));
        }
        (s, "text/plain; charset=utf-8")
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", content_type)
        .header("x-podpath-pod", format!("{}/{}", identity.pod_namespace, identity.pod_name))
        .body(Full::new(Bytes::from(body)))
        .expect("valid response")
}

/// The path and query of a request target (absolute-form targets keep only their path).
fn path_of(uri: &str) -> &str {
    match uri.find("://") {
        Some(i) => uri[i + 3..].find('/').map_or("/", |j| &uri[i + 3 + j..]),
        None => uri,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn who() -> Identity {
        Identity {
            pod_name: "web".into(),
            pod_namespace: "default".into(),
            pod_ip: "10.244.1.2".into(),
            node_name: "node-1".into(),
            message: None,
        }
    }

    fn head(uri: &str, headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: "GET".into(),
            uri: uri.into(),
            version: "HTTP/1.1".into(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    async fn body(r: Response<Full<Bytes>>) -> String {
        String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
    }

    const CLIENT: &str = "192.168.56.12:41234";
    const SERVER: &str = "10.244.1.2:8080";

    #[tokio::test]
    async fn plain_text_shows_pod_node_client_and_request() {
        let r = render(
            &head("/a?b=1", &[("host", "198.51.100.7"), ("user-agent", "curl/8")]),
            PortMode::Echo,
            &who(),
            CLIENT.parse().unwrap(),
            SERVER.parse().unwrap(),
            "http",
        );
        assert_eq!(r.status(), 200);
        let text = body(r).await;
        assert_eq!(
            text,
            "pod: default/web\npod IP: 10.244.1.2\nnode: node-1\nclient: 192.168.56.12:41234\n\
             server: http://10.244.1.2:8080\n\nGET /a?b=1 HTTP/1.1\nhost: 198.51.100.7\nuser-agent: curl/8\n"
        );
    }

    #[tokio::test]
    async fn json_on_request() {
        for (uri, hdrs) in [("/", vec![("accept", "application/json")]), ("/x?format=json", vec![])] {
            let r = render(
                &head(uri, &hdrs),
                PortMode::Echo,
                &who(),
                CLIENT.parse().unwrap(),
                SERVER.parse().unwrap(),
                "http",
            );
            assert_eq!(r.headers()["content-type"], "application/json");
            let v: serde_json::Value = serde_json::from_str(&body(r).await).unwrap();
            assert_eq!(v["client"]["ip"], "192.168.56.12");
            assert_eq!(v["pod"]["name"], "web");
            assert_eq!(v["request"]["uri"], uri);
        }
    }

    #[tokio::test]
    async fn redirect_port_drops_the_port_like_nginx() {
        let r = render(
            &head("/path?q", &[("host", "198.51.100.7:30080")]),
            PortMode::RedirectToHttps,
            &who(),
            CLIENT.parse().unwrap(),
            SERVER.parse().unwrap(),
            "http",
        );
        assert_eq!(r.status(), 301);
        assert_eq!(r.headers()["location"], "https://198.51.100.7/path?q");
        assert!(body(r).await.contains("301 Moved Permanently"));
    }

    #[test]
    fn options_from_ports_and_args() {
        let o =
            parse_options(&[80, 443], &["--redirect-to-https=80".into(), "--https-port".into(), "443".into()]).unwrap();
        assert_eq!(o.ports, vec![(80, PortMode::RedirectToHttps), (443, PortMode::Https)]);
        assert_eq!(parse_options(&[], &[]).unwrap().ports, vec![(8080, PortMode::Echo)]);
        let e = parse_options(&[80], &["--bogus".into()]).unwrap_err();
        assert!(e.starts_with("unknown argument \"--bogus\""), "{e}");
        assert!(parse_options(&[80], &["--https-port=0".into()]).is_err());
        assert_eq!(parse_options(&[80], &["--message=v2".into()]).unwrap().message.as_deref(), Some("v2"));
        assert_eq!(parse_options(&[9000], &["--grpc-port=9000".into()]).unwrap().ports, vec![(9000, PortMode::Grpc)]);
        assert!(parse_options(&[80], &["--access-log".into()]).unwrap().access_log);
        assert!(!parse_options(&[80], &[]).unwrap().access_log);
        let req = Request::builder().uri("/shadow?x=1").header("host", "web.example").body(()).unwrap();
        assert_eq!(
            access_line(&req, "10.244.0.1:40312".parse().unwrap(), StatusCode::OK),
            "10.244.0.1:40312 \"GET /shadow?x=1 HTTP/1.1\" 200 host=web.example"
        );
    }

    #[tokio::test]
    async fn the_grpc_health_check_says_serving_in_a_framed_message_and_trailers() {
        use http_body_util::BodyExt;
        let r = grpc_answer("/grpc.health.v1.Health/Check", "default/grpc-1");
        assert_eq!(r.headers()["content-type"], "application/grpc");
        assert_eq!(r.headers()["x-pod"], "default/grpc-1");
        let collected = r.into_body().collect().await.unwrap();
        assert_eq!(collected.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(collected.to_bytes().as_ref(), [0, 0, 0, 0, 2, 0x08, 0x01]);
        let other = grpc_answer("/x.Y/Z", "p").into_body().collect().await.unwrap();
        assert_eq!(other.trailers().unwrap()["grpc-status"], "12");
    }
}
