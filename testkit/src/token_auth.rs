//! A token server for the test registry, so that pulls go through the bearer-token flow real
//! registries use (Docker Hub, GHCR, Harbor): the distribution server answers 401 with
//! `WWW-Authenticate: Bearer realm=…,service=…,scope=…`, the client asks this server for a
//! token (anonymously, or with a login as HTTP Basic), and presents it. The distribution server
//! itself checks each token (its signature against this server's certificate, issuer,
//! audience, expiry and the access it grants), as it does in production.
//!
//! Tokens are JWTs signed with ES256 whose header carries the signing certificate (`x5c`);
//! anonymous requests get `pull` on the public repositories only, a login gets what it asks.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine;

/// The service name and issuer the registry is configured to trust.
pub const SERVICE: &str = "podpath-test-registry";
pub const ISSUER: &str = "podpath-test-tokens";

/// A running token server (a thread; it stops with the test process).
pub struct TokenServer {
    /// `http://127.0.0.1:PORT/token`.
    pub realm: String,
    /// The signing certificate (PEM), the registry's `rootcertbundle`.
    pub cert: PathBuf,
}

struct Policy {
    logins: Vec<(String, String)>,
    public: Vec<String>,
    key: ring::signature::EcdsaKeyPair,
    cert_der: Vec<u8>,
}

impl TokenServer {
    /// Starts a token server with these `logins` (user, password); repositories whose name
    /// starts with one of `public` may be pulled anonymously. The certificate goes in `dir`.
    pub fn start(dir: &Path, logins: &[(&str, &str)], public: &[&str]) -> TokenServer {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("token key");
        let cert = rcgen::CertificateParams::new(vec!["podpath-test-tokens".to_string()])
            .expect("certificate parameters")
            .self_signed(&key)
            .expect("token certificate");
        let path = dir.join("token-cert.pem");
        std::fs::write(&path, cert.pem()).expect("write the token certificate");
        let rng = ring::rand::SystemRandom::new();
        let signing = ring::signature::EcdsaKeyPair::from_pkcs8(
            &ring::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &key.serialize_der(),
            &rng,
        )
        .expect("signing key");
        let policy = Arc::new(Policy {
            logins: logins.iter().map(|(u, p)| (u.to_string(), p.to_string())).collect(),
            public: public.iter().map(|p| p.to_string()).collect(),
            key: signing,
            cert_der: cert.der().to_vec(),
        });
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the token server");
        let realm = format!("http://{}/token", listener.local_addr().expect("address"));
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let policy = policy.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &policy);
                });
            }
        });
        TokenServer { realm, cert: path }
    }

    /// The registry's `auth:` section for this server.
    pub fn registry_auth(&self) -> String {
        format!(
            "auth:\n  token:\n    realm: {}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
            self.realm,
            self.cert.display()
        )
    }
}

/// One request per connection: `GET /token?service=…&scope=…` with an optional Basic login.
fn serve(conn: TcpStream, policy: &Policy) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    let mut authorization = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("authorization") {
                authorization = Some(v.trim().to_string());
            }
        }
    }
    let target = request.split_whitespace().nth(1).unwrap_or("");
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let (status, body) = if path != "/token" {
        ("404 Not Found", r#"{"errors":[{"code":"NOT_FOUND"}]}"#.to_string())
    } else {
        match login(authorization.as_deref(), policy) {
            Err(()) => ("401 Unauthorized", r#"{"details":"incorrect username or password"}"#.to_string()),
            Ok(user) => ("200 OK", token_body(query, user.as_deref(), policy)),
        }
    };
    let mut out = conn;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    out.flush()
}

/// The user a Basic login names (None: anonymous); Err for a wrong login.
fn login(authorization: Option<&str>, policy: &Policy) -> Result<Option<String>, ()> {
    let Some(a) = authorization else { return Ok(None) };
    let b64 = a.strip_prefix("Basic ").ok_or(())?;
    let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).map_err(|_| ())?;
    let text = String::from_utf8(raw).map_err(|_| ())?;
    let (u, p) = text.split_once(':').ok_or(())?;
    policy.logins.iter().any(|(lu, lp)| lu == u && lp == p).then(|| Some(u.to_string())).ok_or(())
}

/// The token answer for the scopes asked: a login gets every action asked, anonymous `pull` on
/// public repositories, nothing else (the registry then refuses the request).
fn token_body(query: &str, user: Option<&str>, policy: &Policy) -> String {
    let mut access = vec![];
    for (k, v) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        if k != "scope" {
            continue;
        }
        let scope = percent_decode(v);
        let mut parts = scope.splitn(3, ':');
        let (Some(kind), Some(name), Some(actions)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let granted: Vec<&str> = actions
            .split(',')
            .filter(|a| user.is_some() || (*a == "pull" && policy.public.iter().any(|p| name.starts_with(p.as_str()))))
            .collect();
        access.push(serde_json::json!({"type": kind, "name": name, "actions": granted}));
    }
    let now = jiff::Timestamp::now().as_second();
    let claims = serde_json::json!({
        "iss": ISSUER, "sub": user.unwrap_or(""), "aud": SERVICE,
        "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}-{}", access.len()),
        "access": access,
    });
    let b64 = base64::engine::general_purpose::STANDARD;
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [b64.encode(&policy.cert_der)]});
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let input = format!("{}.{}", url.encode(header.to_string()), url.encode(claims.to_string()));
    let sig = policy.key.sign(&ring::rand::SystemRandom::new(), input.as_bytes()).expect("sign a token");
    let token = format!("{input}.{}", url.encode(sig.as_ref()));
    serde_json::json!({"token": token, "access_token": token, "expires_in": 300}).to_string()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 3;
                        continue;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
