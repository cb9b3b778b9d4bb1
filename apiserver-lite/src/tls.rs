//! TLS for the API server, as a real cluster serves: a lab CA (kept in the cert directory, so
//! kubeconfigs and agents that trust it keep working across restarts) and a serving certificate
//! for the API's names and addresses, signed by it at every start (the addresses may change).
//! Or a certificate and key the operator gives. The REST listeners hand out TLS streams whose
//! handshakes run concurrently ([`TlsListener`]); gRPC uses tonic's TLS with the same identity.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use crate::error::ApiError;

/// A certificate chain and its private key, PEM.
#[derive(Clone)]
pub struct Identity {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Identity { .. }") // never the key
    }
}

/// The files of a generated PKI in a cert directory.
pub const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const SERVING_CERT: &str = "apiserver.crt";
const SERVING_KEY: &str = "apiserver.key";

/// The names every serving certificate carries: what clients inside and outside the cluster
/// call the API (`kubernetes.default.svc` …). Agents verify against `kubernetes`.
pub const SERVICE_NAMES: [&str; 6] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "localhost",
    "127.0.0.1",
];

fn tls_err(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("TLS: {what}: {e}"))
}

/// The CA's parameters: the same every time, so a CA key read back signs as the CA.
fn ca_params() -> Result<CertificateParams, ApiError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(|e| tls_err("CA parameters", e))?;
    p.distinguished_name.push(DnType::CommonName, "podpath-ca");
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    p.not_before = rcgen::date_time_ymd(2020, 1, 1);
    p.not_after = rcgen::date_time_ymd(2100, 1, 1);
    Ok(p)
}

fn write_private(path: &Path, text: &str) -> Result<(), ApiError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| tls_err(&format!("write {}", tmp.display()), e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| tls_err(&format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path).map_err(|e| tls_err(&format!("write {}", path.display()), e))
}

/// The lab CA in `dir` (made on first use) and a fresh serving certificate for `hosts` (names
/// and IP addresses, besides [`SERVICE_NAMES`]). Returns the serving identity; the CA
/// certificate is `dir/ca.crt` for clients.
pub fn generated_identity(dir: &Path, hosts: &[String]) -> Result<Identity, ApiError> {
    std::fs::create_dir_all(dir).map_err(|e| tls_err(&format!("create {}", dir.display()), e))?;
    let (ca_cert, ca_key) = (dir.join(CA_CERT), dir.join(CA_KEY));
    let ca_key_pair = match std::fs::read_to_string(&ca_key) {
        Ok(pem) if ca_cert.exists() => {
            KeyPair::from_pem(&pem).map_err(|e| tls_err(&format!("read {}", ca_key.display()), e))?
        }
        _ => {
            let key = KeyPair::generate().map_err(|e| tls_err("CA key", e))?;
            let cert = ca_params()?.self_signed(&key).map_err(|e| tls_err("CA certificate", e))?;
            write_private(&ca_key, &key.serialize_pem())?;
            write_private(&ca_cert, &cert.pem())?;
            key
        }
    };
    let issuer = Issuer::new(ca_params()?, ca_key_pair);
    let mut names: Vec<String> = SERVICE_NAMES.iter().map(|s| s.to_string()).collect();
    for h in hosts {
        if !names.contains(h) {
            names.push(h.clone());
        }
    }
    let mut params = CertificateParams::new(names).map_err(|e| tls_err("serving certificate names", e))?;
    params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2100, 1, 1);
    let key = KeyPair::generate().map_err(|e| tls_err("serving key", e))?;
    let cert = params.signed_by(&key, &issuer).map_err(|e| tls_err("serving certificate", e))?;
    let id = Identity { cert_pem: cert.pem(), key_pem: key.serialize_pem() };
    write_private(&dir.join(SERVING_KEY), &id.key_pem)?;
    write_private(&dir.join(SERVING_CERT), &id.cert_pem)?;
    Ok(id)
}

/// An identity from PEM files the operator gives.
pub fn identity_from_files(cert: &PathBuf, key: &PathBuf) -> Result<Identity, ApiError> {
    let read = |p: &PathBuf| std::fs::read_to_string(p).map_err(|e| tls_err(&format!("read {}", p.display()), e));
    Ok(Identity { cert_pem: read(cert)?, key_pem: read(key)? })
}

/// A rustls server configuration for `id`, speaking HTTP/2 and HTTP/1.1 (kubectl uses h2).
pub fn server_config(id: &Identity) -> Result<Arc<rustls::ServerConfig>, ApiError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(id.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| tls_err("certificate PEM", e))?;
    let key = PrivateKeyDer::from_pem_slice(id.key_pem.as_bytes()).map_err(|e| tls_err("key PEM", e))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err("protocol versions", e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| tls_err("certificate and key", e))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A TCP listener whose connections come out TLS-terminated. Handshakes run in tasks of their
/// own, so a slow or silent client holds up nobody; failed handshakes are dropped.
pub struct TlsListener {
    local: SocketAddr,
    ready: tokio::sync::mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    _accept: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let (tx, ready) = tokio::sync::mpsc::channel(64);
        let accept = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of descriptors and the like: back off, as axum's own loop does.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                // Watch events are small writes: without NODELAY, Nagle holds them back.
                let _ = tcp.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    if let Ok(Ok(tls)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        let _ = tx.send((tls, peer)).await;
                    }
                });
            }
        });
        Ok(TlsListener { local, ready, _accept: accept })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self._accept.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept task never ends while the listener lives.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ca_is_kept_and_the_serving_certificate_renewed() {
        let dir = tempfile::tempdir().unwrap();
        let a = generated_identity(dir.path(), &["10.1.2.3".into()]).unwrap();
        let ca = std::fs::read_to_string(dir.path().join(CA_CERT)).unwrap();
        let b = generated_identity(dir.path(), &["10.1.2.4".into()]).unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join(CA_CERT)).unwrap(), ca, "one CA");
        assert_ne!(a.cert_pem, b.cert_pem);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(CA_KEY)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        server_config(&b).unwrap();
    }
}
