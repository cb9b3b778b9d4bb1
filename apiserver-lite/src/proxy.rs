//! The `services/NAME[:PORT]/proxy/PATH` and `pods/NAME[:PORT]/proxy/PATH` subresources, as
//! kube-apiserver serves them (`kubectl get --raw …/proxy/`, `kubectl proxy` then a browser):
//! the request goes to a ready endpoint of the Service's port (or to the pod's address), from
//! the lab's control-plane namespace, and the answer comes back as it is. Plain HTTP to the
//! backend (an `https:` scheme prefix is refused with a clear message).
//!
//! [`service_target`] and [`pod_target`] decide where to (pure); [`handle`] forwards.

use std::net::SocketAddr;
use std::time::Duration;

use api::Kind;
use axum::body::{Body, Bytes};
use axum::response::Response;
use http::{HeaderMap, HeaderValue, Method};
use podpath_client::http as client;
use serde_json::Value;

use crate::error::ApiError;
use crate::rest::RestState;

/// `[scheme:]name[:port]` of a proxy path's object segment.
fn split_name(spec: &str) -> Result<(&str, &str), ApiError> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [n] => ("", *n, ""),
        [n, p] => ("", *n, *p),
        [s, n, p] => (*s, *n, *p),
        _ => return Err(ApiError::BadRequest(format!("invalid request {spec:?}"))),
    };
    match scheme {
        "" | "http" => Ok((name, port)),
        "https" => {
            Err(ApiError::BadRequest("podpath's API server proxies plain HTTP only: drop the https: prefix".into()))
        }
        other => Err(ApiError::BadRequest(format!("unsupported scheme {other:?}"))),
    }
}

/// Where a Service's proxy request goes: a ready address of its Endpoints for the port named
/// or numbered `port` (the unnamed, or only, port when empty). `pick` chooses among the ready
/// addresses (the real server picks at random). Pure.
pub fn service_target(svc: &Value, endpoints: Option<&Value>, port: &str, pick: usize) -> Result<SocketAddr, ApiError> {
    let name = svc["metadata"]["name"].as_str().unwrap_or("");
    let ports: Vec<&Value> = svc["spec"]["ports"].as_array().into_iter().flatten().collect();
    let wanted = ports
        .iter()
        .find(|p| {
            if port.is_empty() {
                ports.len() == 1 || p["name"].as_str().unwrap_or("").is_empty()
            } else {
                p["name"] == port || p["port"].as_i64().is_some_and(|n| n.to_string() == port)
            }
        })
        .ok_or_else(|| ApiError::ServiceUnavailable(format!("no service port {port:?} found for service {name:?}")))?;
    let port_name = wanted["name"].as_str().unwrap_or("");
    let mut ready: Vec<SocketAddr> = vec![];
    for subset in endpoints.and_then(|e| e["subsets"].as_array()).into_iter().flatten() {
        let Some(p) =
            subset["ports"].as_array().into_iter().flatten().find(|p| p["name"].as_str().unwrap_or("") == port_name)
        else {
            continue;
        };
        let Some(number) = p["port"].as_u64().and_then(|n| u16::try_from(n).ok()) else { continue };
        for a in subset["addresses"].as_array().into_iter().flatten() {
            if let Some(ip) = a["ip"].as_str().and_then(|i| i.parse().ok()) {
                ready.push(SocketAddr::new(ip, number));
            }
        }
    }
    if ready.is_empty() {
        return Err(ApiError::ServiceUnavailable(format!("no endpoints available for service {name:?}")));
    }
    Ok(ready[pick % ready.len()])
}

/// Where a pod's proxy request goes: its IP and `port` (80 when empty). Pure.
pub fn pod_target(pod: &Value, port: &str) -> Result<SocketAddr, ApiError> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let ip = pod["status"]["podIP"]
        .as_str()
        .and_then(|i| i.parse().ok())
        .ok_or_else(|| ApiError::ServiceUnavailable(format!("pod {name:?} has no IP address yet")))?;
    let number: u16 = if port.is_empty() {
        80
    } else if let Ok(n) = port.parse::<u16>() {
        n
    } else {
        // A container port's name.
        pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .find(|p| p["name"] == port)
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| ApiError::BadRequest(format!("invalid port {port:?} for pod {name:?}")))?
    };
    Ok(SocketAddr::new(ip, number))
}

/// Forwards one request to a Service's or pod's backend and returns its answer.
#[allow(clippy::too_many_arguments)]
pub async fn handle(
    st: &RestState,
    method: &Method,
    kind: Kind,
    ns: &str,
    spec: &str,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (name, port) = split_name(spec)?;
    let addr = match kind {
        Kind::Service => {
            let svc = st.registry.get(Kind::Service, ns, name)?;
            let endpoints = st.registry.store.get(Kind::Endpoints, ns, name)?;
            let pick = jiff::Timestamp::now().subsec_nanosecond().unsigned_abs() as usize;
            service_target(&svc, endpoints.as_ref(), port, pick)?
        }
        _ => pod_target(&st.registry.get(Kind::Pod, ns, name)?, port)?,
    };
    let target = match query {
        Some(q) if !q.is_empty() => format!("/{path}?{q}"),
        _ => format!("/{path}"),
    };
    let failed = |e: String| ApiError::ServiceUnavailable(format!("error trying to reach service: {e}"));
    let stream = tokio::time::timeout(Duration::from_secs(10), crate::logs::dial(addr, st.kubelet_netns.clone()))
        .await
        .map_err(|_| failed(format!("dial tcp {addr}: i/o timeout")))?
        .map_err(|e| failed(format!("dial tcp {addr}: {e}")))?;
    let mut conn = client::Conn::over(addr, stream).await.map_err(|e| failed(e.to_string()))?;
    // What the client said of the body; the rest (its token above all) stays here.
    let forwarded: Vec<(&str, &str)> = ["content-type", "accept", "user-agent"]
        .iter()
        .filter_map(|k| headers.get(*k).and_then(|v| v.to_str().ok()).map(|v| (*k, v)))
        .collect();
    let req = client::Request { method: method.as_str(), path: &target, headers: &forwarded, body: &body };
    let resp = tokio::time::timeout(Duration::from_secs(30), conn.stream(&req))
        .await
        .map_err(|_| failed("no answer within 30 s".into()))?
        .map_err(|e| failed(e.to_string()))?;
    let status = resp.status();
    let content_type = resp.headers().get(http::header::CONTENT_TYPE).cloned();
    let mut out = Response::new(Body::new(resp.into_body()));
    *out.status_mut() = status;
    if let Some(ct) = content_type {
        out.headers_mut().insert(http::header::CONTENT_TYPE, ct);
    } else {
        out.headers_mut().insert(http::header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_service_port_by_name_or_number_goes_to_a_ready_endpoint() {
        let svc = json!({"metadata": {"name": "web"}, "spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080}, {"name": "metrics", "port": 9100}]}});
        let eps = json!({"subsets": [{"addresses": [{"ip": "10.244.1.5"}, {"ip": "10.244.2.7"}],
                                      "ports": [{"name": "http", "port": 8080}, {"name": "metrics", "port": 9100}]}]});
        assert_eq!(service_target(&svc, Some(&eps), "http", 0).unwrap().to_string(), "10.244.1.5:8080");
        assert_eq!(service_target(&svc, Some(&eps), "80", 1).unwrap().to_string(), "10.244.2.7:8080");
        assert_eq!(service_target(&svc, Some(&eps), "metrics", 0).unwrap().to_string(), "10.244.1.5:9100");
        let e = service_target(&svc, Some(&eps), "nope", 0).unwrap_err();
        assert_eq!(e.to_string(), "no service port \"nope\" found for service \"web\"");
        let e = service_target(&svc, None, "http", 0).unwrap_err();
        assert_eq!(e.to_string(), "no endpoints available for service \"web\"");
        assert!(split_name("https:web:443").is_err());
        assert_eq!(split_name("http:web:80").unwrap(), ("web", "80"));
    }

    #[test]
    fn a_pod_port_by_number_or_container_port_name() {
        let pod = json!({"metadata": {"name": "p"}, "status": {"podIP": "10.244.1.9"},
            "spec": {"containers": [{"ports": [{"name": "web", "containerPort": 8080}]}]}});
        assert_eq!(pod_target(&pod, "").unwrap().to_string(), "10.244.1.9:80");
        assert_eq!(pod_target(&pod, "web").unwrap().to_string(), "10.244.1.9:8080");
        assert_eq!(pod_target(&pod, "9000").unwrap().to_string(), "10.244.1.9:9000");
        assert!(pod_target(&json!({"metadata": {"name": "p"}}), "").is_err());
    }
}
