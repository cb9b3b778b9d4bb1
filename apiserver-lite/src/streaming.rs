//! `pods/NAME/exec`, `pods/NAME/attach` and `pods/NAME/portforward`: the API server checks the
//! request as the real one does (pod, container, node), then passes the upgrade through to the
//! pod's node agent (kubelet's `/exec`, `/attach`, `/portForward`) and, once the agent has
//! switched protocols, splices the two connections. The WebSocket and SPDY protocols are
//! spoken only by the agent; this side moves bytes.

use std::net::SocketAddr;
use std::time::Duration;

use api::Kind;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{header, HeaderName, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::ApiError;
use crate::logs::{container_of, dial, kubelet_addr};
use crate::rest::RestState;

/// The streaming subresources of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Exec,
    Attach,
    PortForward,
}

impl Verb {
    pub fn from_subresource(s: &str) -> Option<Verb> {
        match s {
            "exec" => Some(Verb::Exec),
            "attach" => Some(Verb::Attach),
            "portforward" => Some(Verb::PortForward),
            _ => None,
        }
    }
}

/// Headers that make the upgrade, passed to the agent as the client sent them.
const UPGRADE_HEADERS: &[&str] = &[
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "x-stream-protocol-version",
];

/// Where to send the request: the node agent and the path with the client's query. Pure.
pub fn plan(verb: Verb, pod: &Value, node: Option<&Value>, query: &str) -> Result<(SocketAddr, String), ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let phase = pod.pointer("/status/phase").and_then(Value::as_str).unwrap_or("");
    let requested =
        form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "container").map(|(_, v)| v.into_owned());
    let path = match verb {
        Verb::PortForward => format!("/portForward/{ns}/{name}"),
        Verb::Exec | Verb::Attach => {
            let container = container_of(pod, requested.as_deref())?;
            if verb == Verb::Exec && !form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == "command") {
                return Err(ApiError::BadRequest("you must specify at least one command for the container".into()));
            }
            if matches!(phase, "Succeeded" | "Failed") {
                return Err(ApiError::BadRequest(format!(
                    "cannot {} a container in a completed pod; current phase is {phase}",
                    if verb == Verb::Exec { "exec into" } else { "attach to" }
                )));
            }
            let v = if verb == Verb::Exec { "exec" } else { "attach" };
            format!("/{v}/{ns}/{name}/{container}")
        }
    };
    let addr = kubelet_addr(pod, node)?;
    Ok((addr, if query.is_empty() { path } else { format!("{path}?{query}") }))
}

/// The request head sent to the agent. Pure.
pub fn request_head(
    method: &str,
    path: &str,
    addr: SocketAddr,
    headers: &http::HeaderMap,
    token: Option<&str>,
) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for name in UPGRADE_HEADERS {
        for v in headers.get_all(*name).iter().filter_map(|v| v.to_str().ok()) {
            head.push_str(&format!("{name}: {v}\r\n"));
        }
    }
    head.push_str("Content-Length: 0\r\n\r\n");
    head.into_bytes()
}

/// Reads a response head (and whatever followed it) from the agent.
async fn read_head(s: &mut tokio::net::TcpStream) -> std::io::Result<(u16, Vec<(String, String)>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    loop {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "closed before answering"));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let code = resp.code.unwrap_or(502);
                let hs = resp
                    .headers
                    .iter()
                    .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned()))
                    .collect();
                return Ok((code, hs, buf[len..].to_vec()));
            }
            Ok(httparse::Status::Partial) if buf.len() < 64 << 10 => continue,
            Ok(httparse::Status::Partial) => {
                return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "response head over 64 KiB"))
            }
            Err(e) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())),
        }
    }
}

/// Serves one of the streaming subresources of pod `ns/name`.
pub async fn handle(st: &RestState, verb: Verb, ns: &str, name: &str, mut req: Request) -> Result<Response, ApiError> {
    let pod = st.registry.get(Kind::Pod, ns, name)?;
    let node_name = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("").to_string();
    let node = if node_name.is_empty() { None } else { st.registry.get(Kind::Node, "", &node_name).ok() };
    let query = req.uri().query().unwrap_or("").to_string();
    let (addr, path) = plan(verb, &pod, node.as_ref(), &query)?;
    if req.headers().get(header::UPGRADE).is_none() {
        return Err(ApiError::BadRequest("Upgrade request required".into()));
    }
    let unreachable =
        |e: String| ApiError::internal(format!("cannot reach the node agent of {node_name} at {addr}: {e}"));
    let mut agent = tokio::time::timeout(Duration::from_secs(10), dial(addr, st.kubelet_netns.clone()))
        .await
        .map_err(|_| unreachable("timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let _ = agent.set_nodelay(true);
    let head = request_head(req.method().as_str(), &path, addr, req.headers(), st.token.as_deref());
    agent.write_all(&head).await.map_err(|e| unreachable(e.to_string()))?;
    let (code, headers, rest) = tokio::time::timeout(Duration::from_secs(30), read_head(&mut agent))
        .await
        .map_err(|_| unreachable("no answer to the upgrade in 30 s".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let mut resp = Response::builder().status(StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY));
    if code != 101 {
        // The agent's refusal, passed on as it is (kubectl shows it after "unable to upgrade
        // connection:"). Small bodies only.
        let mut body = rest;
        let len = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse::<usize>().ok());
        let want = len.unwrap_or(64 << 10).min(64 << 10);
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            let mut chunk = [0u8; 4096];
            while body.len() < want {
                match agent.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => body.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await;
        body.truncate(want);
        for (k, v) in headers.iter().filter(|(k, _)| k == "content-type" || k.starts_with("x-accepted")) {
            resp = resp.header(k.as_str(), v.as_str());
        }
        return resp.body(Body::from(body)).map_err(|e| ApiError::internal(e.to_string()));
    }
    for (k, v) in &headers {
        if let Ok(name) = HeaderName::from_bytes(k.as_bytes()) {
            resp = resp.header(name, v.as_str());
        }
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        let mut client = hyper_util::rt::TokioIo::new(upgraded);
        if !rest.is_empty() && client.write_all(&rest).await.is_err() {
            return;
        }
        // Ends when either side closes; both sockets are dropped with this task.
        let _ = tokio::io::copy_bidirectional_with_sizes(&mut client, &mut agent, 256 << 10, 256 << 10).await;
    });
    resp.body(Body::empty()).map_err(|e| ApiError::internal(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(phase: &str, node: &str) -> Value {
        json!({"metadata": {"name": "web", "namespace": "default"},
               "spec": {"nodeName": node, "containers": [{"name": "c"}]},
               "status": {"phase": phase}})
    }

    fn node() -> Value {
        json!({"status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.11"}],
                          "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}})
    }

    #[test]
    fn requests_go_to_the_agents_streaming_paths() {
        let q = "command=sh&command=-c&stdout=true";
        let (addr, path) = plan(Verb::Exec, &pod("Running", "n1"), Some(&node()), q).unwrap();
        assert_eq!(addr.to_string(), "192.168.56.11:10250");
        assert_eq!(path, format!("/exec/default/web/c?{q}"));
        let (_, path) = plan(Verb::PortForward, &pod("Running", "n1"), Some(&node()), "").unwrap();
        assert_eq!(path, "/portForward/default/web");
        let (_, path) = plan(Verb::Attach, &pod("Running", "n1"), Some(&node()), "container=c&stdout=1").unwrap();
        assert_eq!(path, "/attach/default/web/c?container=c&stdout=1");
    }

    #[test]
    fn bad_requests_get_the_real_servers_messages() {
        let err = |v, p: &Value, q: &str| plan(v, p, Some(&node()), q).unwrap_err().to_string();
        assert_eq!(
            err(Verb::Exec, &pod("Running", "n1"), "stdout=1"),
            "you must specify at least one command for the container"
        );
        assert_eq!(
            err(Verb::Exec, &pod("Running", "n1"), "command=x&container=nope"),
            "container nope is not valid for pod web"
        );
        assert_eq!(err(Verb::Exec, &pod("Pending", ""), "command=x"), "pod web does not have a host assigned");
        assert_eq!(
            err(Verb::Exec, &pod("Succeeded", "n1"), "command=x"),
            "cannot exec into a container in a completed pod; current phase is Succeeded"
        );
    }

    #[test]
    fn only_the_upgrade_headers_and_the_token_go_to_the_agent() {
        let mut h = http::HeaderMap::new();
        h.insert("upgrade", "websocket".parse().unwrap());
        h.insert("authorization", "Bearer user-token".parse().unwrap());
        h.append("x-stream-protocol-version", "v4.channel.k8s.io".parse().unwrap());
        h.append("x-stream-protocol-version", "v5.channel.k8s.io".parse().unwrap());
        let head =
            String::from_utf8(request_head("GET", "/exec/a/b/c", "10.0.0.1:10250".parse().unwrap(), &h, Some("lab")))
                .unwrap();
        assert!(head.starts_with("GET /exec/a/b/c HTTP/1.1\r\nHost: 10.0.0.1:10250\r\nAuthorization: Bearer lab\r\n"));
        assert!(!head.contains("user-token"));
        assert_eq!(head.matches("x-stream-protocol-version").count(), 2);
        assert!(head.ends_with("\r\n\r\n"));
    }
}
