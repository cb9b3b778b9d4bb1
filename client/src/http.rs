//! The workspace's one small HTTP/1.1 client, on hyper: a request on a fresh
//! connection ([`request`]), the same from synchronous code ([`blocking`]), and a
//! kept-alive connection for several requests ([`Conn`]). Health checks, probes, the lab's API
//! reads, the benchmarks' loads and the tests use it. Two probes keep sockets of their own:
//! `podpath trace`'s (it chooses the socket's TOS and port) and the lab benchmark's
//! availability probe (a connect timeout shorter than the response's).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// An HTTP exchange that did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("{method} {path} to {addr}: {message}")]
    Exchange { method: String, path: String, addr: SocketAddr, message: String },
    #[error("{method} {path} to {addr}: no answer within {timeout:?}")]
    Timeout { method: String, path: String, addr: SocketAddr, timeout: Duration },
    #[error("TLS to {addr}: {message}")]
    Tls { addr: SocketAddr, message: String },
    #[error("TLS settings: {0}")]
    TlsConfig(String),
}

/// TLS to a server whose certificate the given CA signed, checked for a server name (the API
/// server's certificate carries `kubernetes` whatever address it is reached on).
#[derive(Clone)]
pub struct Tls {
    connector: tokio_rustls::TlsConnector,
    server_name: rustls::pki_types::ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tls({:?})", self.server_name)
    }
}

impl Tls {
    /// Trusts the certificates in `ca_pem` only.
    pub fn new(ca_pem: &str, server_name: &str) -> Result<Tls, HttpError> {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| HttpError::TlsConfig(format!("CA certificate: {e}")))?;
            roots.add(cert).map_err(|e| HttpError::TlsConfig(format!("CA certificate: {e}")))?;
        }
        if roots.is_empty() {
            return Err(HttpError::TlsConfig("no CA certificate in the PEM".into()));
        }
        let mut config =
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| HttpError::TlsConfig(e.to_string()))?
                .with_root_certificates(roots)
                .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let server_name = rustls::pki_types::ServerName::try_from(server_name.to_string())
            .map_err(|e| HttpError::TlsConfig(format!("server name {server_name:?}: {e}")))?;
        Ok(Tls { connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)), server_name })
    }
}

/// A response: status and body (read whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Bytes,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One request: method, path, extra headers (a `Host` header replaces the default, the
/// address), and a body (sent with its length when not empty).
#[derive(Debug, Clone, Default)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    pub fn get(path: &'a str) -> Request<'a> {
        Request { method: "GET", path, ..Default::default() }
    }
}

/// A kept-alive HTTP/1.1 connection.
pub struct Conn {
    addr: SocketAddr,
    sender: SendRequest<Full<Bytes>>,
}

impl Conn {
    /// Connects to `addr`.
    pub async fn connect(addr: SocketAddr) -> Result<Conn, HttpError> {
        Self::connect_via(addr, None).await
    }

    /// Connects to `addr`, over TLS when `tls` is given.
    pub async fn connect_via(addr: SocketAddr, tls: Option<&Tls>) -> Result<Conn, HttpError> {
        let stream = TcpStream::connect(addr).await.map_err(|source| HttpError::Connect { addr, source })?;
        match tls {
            None => Self::over(addr, stream).await,
            Some(t) => {
                let _ = stream.set_nodelay(true);
                let s = t
                    .connector
                    .connect(t.server_name.clone(), stream)
                    .await
                    .map_err(|e| HttpError::Tls { addr, message: e.to_string() })?;
                Self::over_io(addr, s).await
            }
        }
    }

    /// Runs HTTP/1.1 over a connected stream (a socket set up by the caller).
    pub async fn over(addr: SocketAddr, stream: TcpStream) -> Result<Conn, HttpError> {
        let _ = stream.set_nodelay(true);
        Self::over_io(addr, stream).await
    }

    async fn over_io<I>(addr: SocketAddr, stream: I) -> Result<Conn, HttpError>
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| {
            HttpError::Exchange { method: "CONNECT".into(), path: String::new(), addr, message: e.to_string() }
        })?;
        // The connection task ends when the connection does (or the sender is dropped).
        tokio::spawn(conn);
        Ok(Conn { addr, sender })
    }

    /// Whether the peer closed the connection (or it failed).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    fn failed(&self, req: &Request<'_>, message: impl ToString) -> HttpError {
        HttpError::Exchange {
            method: req.method.into(),
            path: req.path.into(),
            addr: self.addr,
            message: message.to_string(),
        }
    }

    /// Sends a request and returns the response while its body is still coming (a watch
    /// stream): read it with [`http_body_util::BodyExt::frame`].
    pub async fn stream(&mut self, req: &Request<'_>) -> Result<hyper::Response<hyper::body::Incoming>, HttpError> {
        let mut builder = hyper::Request::builder().method(req.method).uri(req.path);
        if !req.headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            builder = builder.header(hyper::header::HOST, self.addr.to_string());
        }
        for (k, v) in req.headers {
            builder = builder.header(*k, *v);
        }
        let request = builder.body(Full::new(Bytes::copy_from_slice(req.body))).map_err(|e| self.failed(req, e))?;
        self.sender.ready().await.map_err(|e| self.failed(req, e))?;
        self.sender.send_request(request).await.map_err(|e| self.failed(req, e))
    }

    /// Sends one request and reads the whole response.
    pub async fn send(&mut self, req: &Request<'_>) -> Result<Response, HttpError> {
        let resp = self.stream(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map_err(|e| self.failed(req, e))?.to_bytes();
        Ok(Response { status, body })
    }
}

/// One request on a fresh connection (closed afterwards), within `timeout`.
pub async fn request(addr: SocketAddr, req: &Request<'_>, timeout: Duration) -> Result<Response, HttpError> {
    request_via(addr, None, req, timeout).await
}

/// [`request`], over TLS when `tls` is given.
pub async fn request_via(
    addr: SocketAddr,
    tls: Option<&Tls>,
    req: &Request<'_>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    let exchange = async {
        let mut conn = Conn::connect_via(addr, tls).await?;
        conn.send(req).await
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(HttpError::Timeout { method: req.method.into(), path: req.path.into(), addr, timeout }),
    }
}

/// One request from synchronous code (on a runtime of its own for the call). Called from a
/// thread that drives a runtime (a synchronous helper inside an async test), the call runs on
/// a scoped thread of its own, since a runtime cannot block inside another; a new thread
/// inherits its creator's network namespace, so the request leaves from the same one.
pub fn blocking(addr: SocketAddr, req: &Request<'_>, timeout: Duration) -> Result<Response, HttpError> {
    blocking_via(addr, None, req, timeout)
}

/// [`blocking`], over TLS when `tls` is given.
pub fn blocking_via(
    addr: SocketAddr,
    tls: Option<&Tls>,
    req: &Request<'_>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    let run = || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| HttpError::Connect { addr, source })?;
        rt.block_on(request_via(addr, tls, req, timeout))
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return run();
    }
    std::thread::scope(|s| s.spawn(run).join()).unwrap_or_else(|_| {
        Err(HttpError::Exchange {
            method: req.method.into(),
            path: req.path.into(),
            addr,
            message: "the request's thread panicked".into(),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synchronous helper called inside an async test (the e2e harness does this).
    #[tokio::test]
    async fn blocking_works_inside_a_runtime_too() {
        // This test's runtime is blocked by the call, so the server runs on a thread of its own.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async move {
                tx.send(server("inside").await).unwrap();
                std::future::pending::<()>().await
            })
        });
        let addr = rx.recv().unwrap();
        let r = blocking(addr, &Request::get("/"), Duration::from_secs(5)).unwrap();
        assert_eq!(r.status, 200);
        assert!(r.text().starts_with("inside "), "{}", r.text());
    }
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers each request on a connection with `body`, keeping it alive.
    async fn server(body: &'static str) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = String::new();
                    loop {
                        let Ok(n) = s.read(&mut buf).await else { return };
                        if n == 0 {
                            return;
                        }
                        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                        while let Some(end) = seen.find("\r\n\r\n") {
                            let head = seen[..end].to_string();
                            seen = seen[end + 4..].to_string();
                            let host = head.lines().find(|l| l.to_ascii_lowercase().starts_with("host:")).unwrap_or("");
                            let text = format!("{body} {}", host.trim());
                            let resp = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{text}", text.len());
                            if s.write_all(resp.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn one_request_a_kept_alive_connection_and_a_refused_one() {
        let addr = server("hello").await;
        let r = request(addr, &Request::get("/"), Duration::from_secs(5)).await.unwrap();
        assert_eq!((r.status, r.text()), (200, format!("hello host: {addr}")));
        let mut conn = Conn::connect(addr).await.unwrap();
        let headers = [("Host", "shop.example")];
        for _ in 0..3 {
            let r = conn.send(&Request { headers: &headers, ..Request::get("/cart") }).await.unwrap();
            assert_eq!(r.text(), "hello host: shop.example", "the caller's Host replaces the default");
        }
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let e = request(closed, &Request::get("/"), Duration::from_secs(5)).await.unwrap_err();
        assert!(e.to_string().starts_with(&format!("cannot connect to {closed}")), "{e}");
    }

    #[test]
    fn from_synchronous_code() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let addr = rt.block_on(server("sync"));
        let r = blocking(addr, &Request::get("/"), Duration::from_secs(5)).unwrap();
        assert_eq!(r.status, 200);
    }
}
