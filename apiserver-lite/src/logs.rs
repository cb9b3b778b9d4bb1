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
    let previous = query_bool(q, "previous");
    let query = log_query(q, previous)?;
    check_status(pod, &container, previous)?;
    let addr = kubelet_addr(pod, node)?;
    let mut path = format!("/containerLogs/{ns}/{name}/{container}");
    if !query.is_empty() {
        path = format!("{path}?{}", query.join("&"));
    }
    Ok((addr, path))
}

/// The options passed on to the node agent, checked as the real server checks PodLogOptions.
/// Pure.
fn log_query(q: &BTreeMap<String, String>, previous: bool) -> Result<Vec<String>, ApiError> {
    let mut query = Vec::new();
    for key in ["follow", "timestamps"] {
        if query_bool(q, key) {
            query.push(format!("{key}=true"));
        }
    }
    if previous {
        query.push("previous=true".into());
    }
    let mut causes = Vec::new();
    let mut number = |key: &str, min: i64, detail: &str| -> Result<Option<i64>, ApiError> {
        let Some(v) = q.get(key) else { return Ok(None) };
        let n: i64 = v.parse().map_err(|_| ApiError::BadRequest(format!("invalid {key}: {v}")))?;
        if n < min {
            causes.push(api::validation::invalid(&api::FieldPath::root(key), &n, detail));
        }
        Ok(Some(n))
    };
    let tail = number("tailLines", 0, "must be greater than or equal to 0")?;
    let limit = number("limitBytes", 1, "must be greater than 0")?;
    let since_seconds = number("sinceSeconds", 1, "must be greater than 0")?;
    let since_time = match q.get("sinceTime") {
        Some(t) => Some(t.parse::<jiff::Timestamp>().map_err(|_| {
            ApiError::BadRequest(format!(
                "parsing time {t:?} as \"2006-01-02T15:04:05Z07:00\": cannot parse {t:?} as an RFC 3339 time"
            ))
        })?),
        None => None,
    };
    if since_seconds.is_some() && since_time.is_some() {
        causes.push(api::validation::forbidden(
            &api::FieldPath::root(""),
            "at most one of `sinceTime` or `sinceSeconds` may be specified",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::InvalidOptions { kind: "PodLogOptions", causes });
    }
    for (key, v) in [("tailLines", tail), ("limitBytes", limit), ("sinceSeconds", since_seconds)] {
        if let Some(n) = v {
            query.push(format!("{key}={n}"));
        }
    }
    if let Some(t) = since_time {
        query.push(format!("sinceTime={t}"));
    }
    Ok(query)
}

/// Whether the container has logs to read, from its status, with kubelet's messages: a
/// running or terminated container has, so has one whose last run ended (crash-looping);
/// `previous` needs that last run. Pure.
fn check_status(pod: &Value, container: &str, previous: bool) -> Result<(), ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let status = ["/status/containerStatuses", "/status/ephemeralContainerStatuses"]
        .iter()
        .filter_map(|p| pod.pointer(p).and_then(Value::as_array))
        .flatten()
        .find(|c| c["name"] == container);
    let state = |k: &str| status.and_then(|s| s.pointer(&format!("/state/{k}")));
    let last_terminated = status.and_then(|s| s.pointer("/lastState/terminated")).is_some();
    if previous {
        if !last_terminated {
            return Err(ApiError::BadRequest(format!(
                "previous terminated container \"{container}\" in pod \"{name}\" not found"
            )));
        }
        return Ok(());
    }
    if state("running").is_some() || state("terminated").is_some() || last_terminated {
        return Ok(());
    }
    let reason = state("waiting").and_then(|w| w["reason"].as_str()).unwrap_or("ContainerCreating");
    let why = match reason {
        "ErrImagePull" => "image can't be pulled",
        "ImagePullBackOff" => "trying and failing to pull image",
        other => other,
    };
    Err(ApiError::BadRequest(format!("container \"{container}\" in pod \"{name}\" is waiting to start: {why}")))
}

/// The container a request names, or the pod's only one; the real server's 400s otherwise. Pure.
pub fn container_of(pod: &Value, requested: Option<&str>) -> Result<String, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let names = |list: &str| -> Vec<&str> {
        pod.pointer(list).and_then(Value::as_array).into_iter().flatten().filter_map(|c| c["name"].as_str()).collect()
    };
    let containers = names("/spec/containers");
    // Ephemeral containers (`kubectl debug`) have logs too, when named.
    let ephemeral = names("/spec/ephemeralContainers");
    match requested.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c) || ephemeral.contains(&c) => Ok(c.to_string()),
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
            400 => ApiError::BadRequest(text),
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
        assert!(msg(&pod(&["a"], true), &q(&[("limitBytes", "0")]))
            .contains("limitBytes: Invalid value: 0: must be greater than 0"));
        assert!(msg(&pod(&["a"], true), &q(&[("sinceSeconds", "0")])).contains("must be greater than 0"));
        assert!(msg(&pod(&["a"], true), &q(&[("sinceSeconds", "5"), ("sinceTime", "2026-11-25T10:00:00Z")]))
            .contains("at most one of `sinceTime` or `sinceSeconds` may be specified"));
        assert!(msg(&pod(&["a"], true), &q(&[("sinceTime", "noon")])).contains("parsing time \"noon\""));
        let mut pulling = pod(&["a"], false);
        pulling["status"]["containerStatuses"][0]["state"] = json!({"waiting": {"reason": "ErrImagePull"}});
        assert_eq!(msg(&pulling, &q(&[])), "container \"a\" in pod \"web\" is waiting to start: image can't be pulled");
    }

    #[test]
    fn time_options_and_previous_go_to_the_agent() {
        let mut crashing = pod(&["c"], false);
        crashing["status"]["containerStatuses"][0]["state"] = json!({"waiting": {"reason": "CrashLoopBackOff"}});
        crashing["status"]["containerStatuses"][0]["lastState"] = json!({"terminated": {"exitCode": 1}});
        let qs = q(&[("previous", "true"), ("timestamps", "true"), ("sinceTime", "2026-11-25T10:00:00.25+01:00")]);
        let (_, path) = plan(&crashing, Some(&node()), &qs).unwrap();
        assert_eq!(
            path,
            "/containerLogs/default/web/c?timestamps=true&previous=true&sinceTime=2026-11-25T09:00:00.25Z"
        );
        // A crash-looping container's last run has logs without `previous` too.
        let (_, path) = plan(&crashing, Some(&node()), &q(&[("sinceSeconds", "60")])).unwrap();
        assert_eq!(path, "/containerLogs/default/web/c?sinceSeconds=60");
    }
}
