//! `pods/NAME/log`: the API server checks the request as the real one does (container, state,
//! options), then proxies it to the pod's node agent (kubelet's `/containerLogs`), dialling
//! from the lab's control-plane namespace when it has one, and streams the answer back.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use api::Kind;
use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue};
use podpath_client::http as client;
use serde_json::Value;

use crate::error::ApiError;
use crate::rest::{query_bool, RestState};

/// Where to send a log request: the node agent's address and the path with its options. Pure:
/// the pod and its node in, the target or the real server's 400 out.
pub fn plan(pod: &Value, node: Option<&Value>, q: &BTreeMap<String, String>) -> Result<(SocketAddr, String), ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let container = container_of(pod, q.get("container").map(String::as_str))?;
    if query_bool(q, "previous") {
        return Err(ApiError::BadRequest(format!(
            "previous terminated container \"{container}\" in pod \"{name}\" not found"
        )));
    }
    if query_bool(q, "timestamps") || q.contains_key("sinceSeconds") || q.contains_key("sinceTime") {
        return Err(ApiError::BadRequest(
            "podpath's runtime keeps no time per log line: timestamps, sinceSeconds and sinceTime are not supported"
                .into(),
        ));
    }
    let status = pod
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .and_then(|s| s.iter().find(|c| c["name"] == container.as_str()));
    let started = status.is_some_and(|s| s["state"].get("running").is_some() || s["state"].get("terminated").is_some());
    if !started {
        let reason = status
            .and_then(|s| s.pointer("/state/waiting/reason"))
            .and_then(Value::as_str)
            .unwrap_or("ContainerCreating");
        return Err(ApiError::BadRequest(format!(
            "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
        )));
    }
    let addr = kubelet_addr(pod, node)?;
    let mut query = Vec::new();
    if query_bool(q, "follow") {
        query.push("follow=true".to_string());
    }
    for key in ["tailLines", "limitBytes"] {
        if let Some(v) = q.get(key) {
            let n: i64 = v.parse().map_err(|_| ApiError::BadRequest(format!("invalid {key}: {v}")))?;
            if n < 0 {
                return Err(ApiError::InvalidOptions {
                    kind: "PodLogOptions",
                    causes: vec![api::validation::invalid(
                        &api::FieldPath::root(key),
                        &n,
                        "must be greater than or equal to 0",
                    )],
                });
            }
            query.push(format!("{key}={n}"));
        }
    }
    let mut path = format!("/containerLogs/{ns}/{name}/{container}");
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    Ok((addr, path))
}

/// The container a request names, or the pod's only one; the real server's 400s otherwise. Pure.
pub fn container_of(pod: &Value, requested: Option<&str>) -> Result<String, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c) => Ok(c.to_string()),
        Some(c) => Err(ApiError::BadRequest(format!("container {c} is not valid for pod {name}"))),
        None if containers.len() == 1 => Ok(containers[0].to_string()),
        None => Err(ApiError::BadRequest(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            containers.join(" ")
        ))),
    }
}

/// The address of the kubelet API of the pod's node (its InternalIP and published port). Pure.
pub fn kubelet_addr(pod: &Value, node: Option<&Value>) -> Result<SocketAddr, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let node_name = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("");
    if node_name.is_empty() {
        return Err(ApiError::BadRequest(format!("pod {name} does not have a host assigned")));
    }
    let node =
        node.ok_or_else(|| ApiError::BadRequest(format!("pod {name}'s node {node_name:?} is not registered")))?;
    let ip = node
        .pointer("/status/addresses")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str())
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| ApiError::BadRequest(format!("node {node_name} has no InternalIP")))?;
    let port = node
        .pointer("/status/daemonEndpoints/kubeletEndpoint/Port")
        .and_then(Value::as_u64)
        .filter(|p| *p > 0 && *p <= 65535)
        .ok_or_else(|| ApiError::BadRequest(format!("the node agent of {node_name} serves no kubelet API")))?;
    Ok(SocketAddr::new(ip, port as u16))
}

/// A TCP connection to `addr`, made inside `netns` when given (setns moves only the thread
/// that connects, a short-lived one).
pub(crate) async fn dial(addr: SocketAddr, netns: Option<PathBuf>) -> std::io::Result<tokio::net::TcpStream> {
    let Some(ns) = netns else { return tokio::net::TcpStream::connect(addr).await };
    let stream = tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
            let f = std::fs::File::open(&ns)?;
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
        .join()
        .map_err(|_| std::io::Error::other("the dialling thread panicked"))?
    })
    .await
    .map_err(std::io::Error::other)??;
    tokio::net::TcpStream::from_std(stream)
}

/// Serves `GET pods/NAME/log`.
pub async fn handle(st: &RestState, ns: &str, name: &str, q: &BTreeMap<String, String>) -> Result<Response, ApiError> {
    let pod = st.registry.get(Kind::Pod, ns, name)?;
    let node_name = pod.pointer("/spec/nodeName").and_then(Value::as_str).unwrap_or("").to_string();
    let node = if node_name.is_empty() { None } else { st.registry.get(Kind::Node, "", &node_name).ok() };
    let (addr, path) = plan(&pod, node.as_ref(), q)?;
    let unreachable =
        |e: String| ApiError::internal(format!("cannot reach the node agent of {node_name} at {addr}: {e}"));
    let stream = tokio::time::timeout(Duration::from_secs(10), dial(addr, st.kubelet_netns.clone()))
        .await
        .map_err(|_| unreachable("timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let mut conn = client::Conn::over(addr, stream).await.map_err(|e| unreachable(e.to_string()))?;
    let auth = st.token.as_ref().map(|t| format!("Bearer {t}"));
    let mut headers = vec![];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let req = client::Request { headers: &headers, ..client::Request::get(&path) };
    let resp = conn.stream(&req).await.map_err(|e| unreachable(e.to_string()))?;
    if resp.status() != 200 {
        let code = resp.status().as_u16();
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.map(|b| b.to_bytes()).unwrap_or_default();
        let text = String::from_utf8_lossy(&body).trim().to_string();
        return Err(match code {
            404 => ApiError::BadRequest(format!("the node agent of {node_name} has no such container: {text}")),
            _ => ApiError::internal(format!("the node agent of {node_name} answered {code}: {text}")),
        });
    }
    // The connection lives as long as the body streams (its task ends with it).
    let mut r = Response::new(Body::new(resp.into_body()));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(containers: &[&str], running: bool) -> Value {
        let statuses: Vec<Value> = containers
            .iter()
            .map(|c| {
                if running {
                    json!({"name": c, "state": {"running": {}}})
                } else {
                    json!({"name": c, "state": {"waiting": {"reason": "ContainerCreating"}}})
                }
            })
            .collect();
        json!({"metadata": {"name": "web", "namespace": "default"},
               "spec": {"nodeName": "node-1", "containers": containers.iter().map(|c| json!({"name": c})).collect::<Vec<_>>()},
               "status": {"containerStatuses": statuses}})
    }

    fn node() -> Value {
        json!({"status": {"addresses": [{"type": "InternalIP", "address": "192.168.56.11"}],
                          "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}}}})
    }

    fn q(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn requests_go_to_the_pods_node_with_kubelets_options() {
        let (addr, path) =
            plan(&pod(&["c"], true), Some(&node()), &q(&[("follow", "true"), ("tailLines", "5")])).unwrap();
        assert_eq!(addr.to_string(), "192.168.56.11:10250");
        assert_eq!(path, "/containerLogs/default/web/c?follow=true&tailLines=5");
    }

    #[test]
    fn bad_requests_get_the_real_servers_messages() {
        let msg = |p: &Value, q: &BTreeMap<String, String>| plan(p, Some(&node()), q).unwrap_err().to_string();
        assert_eq!(
            msg(&pod(&["a", "b"], true), &q(&[])),
            "a container name must be specified for pod web, choose one of: [a b]"
        );
        assert_eq!(msg(&pod(&["a"], true), &q(&[("container", "x")])), "container x is not valid for pod web");
        assert_eq!(
            msg(&pod(&["a"], false), &q(&[])),
            "container \"a\" in pod \"web\" is waiting to start: ContainerCreating"
        );
        assert!(msg(&pod(&["a"], true), &q(&[("previous", "true")])).contains("previous terminated container \"a\""));
        assert!(msg(&pod(&["a"], true), &q(&[("tailLines", "-1")])).contains("must be greater than or equal to 0"));
    }
}
