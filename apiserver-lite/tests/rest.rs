//! In-process tests of the REST API: the axum router driven with `oneshot`, over a real sled
//! store in a temporary directory, with the controllers running.
//!
//! Address plan: service CIDR 10.96.0.0/12 (small ranges where a test fills them), NodePorts
//! 30000–32767, LB pool 198.51.100.0/24, pod CIDR 10.244.0.0/16.

use std::time::Duration;

use apiserver_lite::rest::{router, RestState};
use apiserver_lite::{start, Config, Server};
use axum::body::Body;
use axum::Router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

mod common;
use common::protobuf_envelope;

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

struct Lab {
    app: Router,
    server: Option<Server>,
    cfg: Config,
    _dir: tempfile::TempDir,
}

fn config(dir: &std::path::Path) -> Config {
    let mut cfg = Config::new(dir.to_path_buf());
    cfg.controllers.node_monitor_grace = Duration::from_secs(2);
    cfg.controllers.pod_gc_slack = Duration::from_secs(1);
    cfg
}

async fn lab_with(f: impl FnOnce(&mut Config)) -> Lab {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    f(&mut cfg);
    let server = start(&cfg).await.unwrap();
    let app = app_for(&server, &cfg);
    Lab { app, server: Some(server), cfg, _dir: dir }
}

fn app_for(server: &Server, cfg: &Config) -> Router {
    router(RestState {
        registry: server.registry.clone(),
        token: cfg.token.as_deref().map(Into::into),
        max_body_bytes: cfg.max_body_bytes,
        request_timeout: cfg.request_timeout,
        advertise: "127.0.0.1:6443".into(),
        kubelet_netns: None,
        tokens: Some(server.tokens.clone()),
    })
}

async fn lab() -> Lab {
    lab_with(|_| {}).await
}

/// Stops the server and starts it again on the same data; the new server.
async fn restart(lab: &mut Lab) -> Server {
    let server = lab.server.take().unwrap();
    let cfg = lab.cfg.clone();
    drop(std::mem::replace(&mut lab.app, Router::new()));
    server.stop().await.unwrap();
    // The database is closed once the last handle is gone; give dropped tasks a moment.
    let mut reopened = None;
    for _ in 0..50 {
        match start(&cfg).await {
            Ok(s) => {
                reopened = Some(s);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let server = reopened.expect("store reopens after stop");
    lab.app = app_for(&server, &cfg);
    server
}

impl Lab {
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        content_type: &str,
        accept: &str,
    ) -> (StatusCode, Value) {
        let mut b = Request::builder().method(method).uri(path).header("accept", accept);
        if body.is_some() {
            b = b.header("content-type", content_type);
        }
        let req = b.body(body.map(|v| Body::from(v.to_string())).unwrap_or_else(Body::empty)).unwrap();
        let resp = self.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        assert!(
            resp.headers().get("content-type").unwrap().to_str().unwrap().starts_with("application/json"),
            "{method} {path}: every response is JSON"
        );
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call("GET", path, None, "", "application/json").await
    }
    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", path, Some(body), "application/json", "application/json").await
    }
    async fn patch(&self, path: &str, ct: &str, body: Value) -> (StatusCode, Value) {
        self.call("PATCH", path, Some(body), ct, "application/json").await
    }
    async fn put(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call("PUT", path, Some(body), "application/json", "application/json").await
    }
    async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call("DELETE", path, None, "", "application/json").await
    }

    /// Polls `path` until `pred` holds (controllers are asynchronous).
    async fn eventually(&self, path: &str, pred: impl Fn(StatusCode, &Value) -> bool) -> Value {
        for _ in 0..100 {
            let (s, v) = self.get(path).await;
            if pred(s, &v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("condition on {path} never held: {:?}", self.get(path).await);
    }
}

fn contour() -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "contour", "labels": {"app": "contour"}},
           "spec": {"type": "LoadBalancer", "selector": {"app": "contour"},
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "https", "port": 443, "targetPort": "https"}]}})
}

const SVCS: &str = "/api/v1/namespaces/default/services";

#[tokio::test]
async fn create_defaults_and_allocates_like_the_real_server() {
    let lab = lab().await;
    let (s, svc) = lab.post(SVCS, contour()).await;
    assert_eq!(s, StatusCode::CREATED, "{svc}");
    let spec = &svc["spec"];
    assert_eq!(spec["ports"][0]["protocol"], "TCP");
    assert_eq!(spec["ports"][0]["targetPort"], 8080);
    assert_eq!(spec["clusterIPs"][0], spec["clusterIP"]);
    assert_eq!(spec["ipFamilies"], json!(["IPv4"]));
    assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
    assert_eq!(spec["sessionAffinity"], "None");
    assert_eq!(spec["externalTrafficPolicy"], "Cluster");
    assert_eq!(spec["internalTrafficPolicy"], "Cluster");
    assert_eq!(spec["allocateLoadBalancerNodePorts"], true);
    let np = spec["ports"][0]["nodePort"].as_i64().unwrap();
    assert!((30000..=32767).contains(&np));
    assert_eq!(svc["status"]["loadBalancer"]["ingress"][0]["ip"], "198.51.100.1");
    let ip: std::net::Ipv4Addr = spec["clusterIP"].as_str().unwrap().parse().unwrap();
    assert!("10.96.0.0/12".parse::<ipnet::Ipv4Net>().unwrap().contains(&ip));
    assert_eq!(svc["kind"], "Service");
    assert_eq!(svc["apiVersion"], "v1");
    assert!(svc["metadata"]["uid"].is_string());

    let (s, kubernetes) = lab.get(&format!("{SVCS}/kubernetes")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(kubernetes["spec"]["clusterIP"], "10.96.0.1");

    let (s, list) = lab.get(SVCS).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(list["kind"], "ServiceList");
    assert!(list["metadata"]["resourceVersion"].is_string());
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn errors_are_statuses_kubectl_understands() {
    let lab = lab().await;
    let bad = json!({"metadata": {"name": "x"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}});
    let (s, st) = lab.post(SVCS, bad).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(st["reason"], "Invalid");
    assert_eq!(st["details"]["kind"], "Service");
    assert_eq!(st["details"]["name"], "x");
    assert_eq!(st["details"]["causes"][0]["field"], "spec.ports[0].nodePort");
    assert_eq!(
        st["details"]["causes"][0]["message"],
        "Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-32767"
    );

    let many = json!({"metadata": {"name": "Bad_Name"}, "spec": {"type": "Foo", "ports": [{"port": 0, "protocol": "ICMP"}],
                       "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}},
                       "externalIPs": ["nope"], "loadBalancerSourceRanges": ["10.0.0.0/8"]}});
    let (s, st) = lab.post(SVCS, many).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let fields: Vec<&str> =
        st["details"]["causes"].as_array().unwrap().iter().map(|c| c["field"].as_str().unwrap()).collect();
    for f in [
        "metadata.name",
        "spec.type",
        "spec.ports[0].port",
        "spec.ports[0].protocol",
        "spec.externalIPs[0]",
        "spec.loadBalancerSourceRanges",
        "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
    ] {
        assert!(fields.contains(&f), "{f} missing from {fields:?}");
    }

    lab.post(SVCS, contour()).await;
    let (s, st) = lab.post(SVCS, contour()).await;
    assert_eq!((s, st["reason"].as_str()), (StatusCode::CONFLICT, Some("AlreadyExists")));
    assert_eq!(st["message"], "services \"contour\" already exists");

    let (s, st) = lab.get(&format!("{SVCS}/nope")).await;
    assert_eq!((s, st["reason"].as_str()), (StatusCode::NOT_FOUND, Some("NotFound")));
    assert_eq!(st["details"]["kind"], "services");

    let (s, st) = lab
        .call(
            "POST",
            &format!("{SVCS}?fieldValidation=Strict"),
            Some(json!({"metadata": {"name": "y"}, "spec": {"portz": 1, "ports": [{"port": 80}]}})),
            "application/json",
            "application/json",
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(st["message"].as_str().unwrap().contains("strict decoding error: unknown field \"spec.portz\""), "{st}");

    // A stale resourceVersion on update is a 409 Conflict.
    let (_, cur) = lab.get(&format!("{SVCS}/contour")).await;
    let mut stale = cur.clone();
    stale["metadata"]["resourceVersion"] = json!("1");
    let (s, st) = lab.put(&format!("{SVCS}/contour"), stale).await;
    assert_eq!((s, st["reason"].as_str()), (StatusCode::CONFLICT, Some("Conflict")));

    let (s, _) = lab.patch(&format!("{SVCS}/contour"), "text/plain", json!({})).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (s, _) = lab.post("/api/v1/namespaces/nope/services", contour()).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = lab.get("/api/v1/nothing").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = lab.call("POST", SVCS, Some(json!("not an object")), "application/json", "application/json").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) = lab.call("POST", SVCS, None, "", "application/json").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn requested_cluster_ip_and_node_port_are_honoured_or_rejected() {
    let lab = lab().await;
    let svc = json!({"metadata": {"name": "a"}, "spec": {"type": "NodePort", "clusterIP": "10.96.5.5",
                     "ports": [{"port": 80, "nodePort": 30000}]}});
    let (s, a) = lab.post(SVCS, svc).await;
    assert_eq!(s, StatusCode::CREATED, "{a}");
    assert_eq!(a["spec"]["clusterIP"], "10.96.5.5");
    assert_eq!(a["spec"]["ports"][0]["nodePort"], 30000);
    let clash = json!({"metadata": {"name": "b"}, "spec": {"type": "NodePort", "clusterIP": "10.96.5.5",
                       "ports": [{"port": 80, "nodePort": 30000}]}});
    let (s, st) = lab.post(SVCS, clash).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let msgs: Vec<String> = st["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| format!("{}: {}", c["field"].as_str().unwrap(), c["message"].as_str().unwrap()))
        .collect();
    // As kube-apiserver: the ClusterIPs are allocated first, and their failure is the answer.
    assert_eq!(msgs, ["spec.clusterIPs: Invalid value: []string{\"10.96.5.5\"}: failed to allocate IP 10.96.5.5: provided IP is already allocated"]);
    let clash =
        json!({"metadata": {"name": "b"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30000}]}});
    let (s, st) = lab.post(SVCS, clash).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        st["details"]["causes"][0]["message"], "Invalid value: 30000: provided port is already allocated",
        "{st}"
    );
    let outside = json!({"metadata": {"name": "c"}, "spec": {"clusterIP": "10.0.0.1", "ports": [{"port": 80}]}});
    let (s, st) = lab.post(SVCS, outside).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(st["details"]["causes"][0]["message"].as_str().unwrap().contains("The range of valid IPs is 10.96.0.0/12"));
    // Nothing of the failed creates was kept: the values are still free for someone else.
    let ok =
        json!({"metadata": {"name": "d"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30001}]}});
    assert_eq!(lab.post(SVCS, ok).await.0, StatusCode::CREATED);
    // Headless keeps None.
    let (s, h) = lab
        .post(SVCS, json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None", "ports": [{"port": 80}]}}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(h["spec"]["clusterIPs"], json!(["None"]));
}

#[tokio::test]
async fn patches_keep_allocations_and_type_changes_release_them() {
    let lab = lab().await;
    let (_, created) = lab.post(SVCS, contour()).await;
    let url = format!("{SVCS}/contour");
    // Client-side apply's strategic merge patch (as observed from kubectl).
    let smp = json!({"metadata": {"labels": {"team": "net"}},
                     "spec": {"$setElementOrder/ports": [{"port": 80}, {"port": 443}], "ports": [{"port": 443, "targetPort": 9443}]}});
    let (s, patched) = lab.patch(&url, "application/strategic-merge-patch+json", smp).await;
    assert_eq!(s, StatusCode::OK, "{patched}");
    assert_eq!(patched["spec"]["ports"][1]["targetPort"], 9443);
    assert_eq!(patched["spec"]["ports"][1]["nodePort"], created["spec"]["ports"][1]["nodePort"]);
    assert_eq!(patched["spec"]["clusterIP"], created["spec"]["clusterIP"]);
    assert_eq!(patched["status"], created["status"]);
    assert_eq!(patched["metadata"]["generation"], 2);
    // Merge patch (kubectl label / annotate).
    let (_, labelled) = lab
        .patch(&url, "application/merge-patch+json", json!({"metadata": {"labels": {"team": null, "tier": "edge"}}}))
        .await;
    assert_eq!(labelled["metadata"]["labels"], json!({"app": "contour", "tier": "edge"}));
    // JSON patch.
    let (s, jp) = lab
        .patch(
            &url,
            "application/json-patch+json",
            json!([{"op": "add", "path": "/spec/externalIPs", "value": ["169.10.10.1"]}]),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(jp["spec"]["externalIPs"], json!(["169.10.10.1"]));
    // externalTrafficPolicy Local → Cluster: the health-check NodePort goes with it (as the
    // real server's dropTypeDependentFields), and comes back with Local.
    let (s, local) =
        lab.patch(&url, "application/merge-patch+json", json!({"spec": {"externalTrafficPolicy": "Local"}})).await;
    assert_eq!(s, StatusCode::OK, "{local}");
    assert!(local["spec"]["healthCheckNodePort"].as_u64().is_some_and(|p| p >= 30000), "{local}");
    let (s, cluster) =
        lab.patch(&url, "application/merge-patch+json", json!({"spec": {"externalTrafficPolicy": "Cluster"}})).await;
    assert_eq!(s, StatusCode::OK, "{cluster}");
    assert!(cluster["spec"].get("healthCheckNodePort").is_none(), "{cluster}");
    let (s, jp) = lab
        .patch(
            &url,
            "application/json-patch+json",
            json!([{"op": "replace", "path": "/spec/externalIPs", "value": ["169.10.10.1"]}]),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{jp}");
    // Unchanged update: same resourceVersion, no write.
    let (_, again) =
        lab.patch(&url, "application/merge-patch+json", json!({"metadata": {"labels": {"tier": "edge"}}})).await;
    assert_eq!(again["metadata"]["resourceVersion"], jp["metadata"]["resourceVersion"]);
    // LoadBalancer → ClusterIP: node ports, LB IP and LB-only fields go; the ClusterIP stays.
    let (s, cip) =
        lab.patch(&url, "application/strategic-merge-patch+json", json!({"spec": {"type": "ClusterIP"}})).await;
    assert_eq!(s, StatusCode::OK, "{cip}");
    assert!(cip["spec"]["ports"][0].get("nodePort").is_none());
    assert!(cip["spec"].get("allocateLoadBalancerNodePorts").is_none());
    assert!(cip["spec"].get("externalTrafficPolicy").is_none());
    assert_eq!(cip["status"]["loadBalancer"], json!({}));
    assert_eq!(cip["spec"]["clusterIP"], created["spec"]["clusterIP"]);
    // The released NodePort can be taken by another Service.
    let np = created["spec"]["ports"][0]["nodePort"].clone();
    let other =
        json!({"metadata": {"name": "other"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": np}]}});
    assert_eq!(lab.post(SVCS, other).await.0, StatusCode::CREATED);
    // Changing the ClusterIP is refused.
    let (s, st) = lab
        .patch(
            &url,
            "application/merge-patch+json",
            json!({"spec": {"clusterIP": "10.96.9.9", "clusterIPs": ["10.96.9.9"]}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(st["details"]["causes"][0]["message"].as_str().unwrap().contains("may not change once set"));
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let lab = lab().await;
    let url = format!("{SVCS}/contour?fieldManager=kubectl&force=false");
    let (s, created) = lab.patch(&url, "application/apply-patch+yaml", contour()).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    let mut changed = contour();
    changed["spec"]["ports"][0]["targetPort"] = json!(9090);
    let (s, updated) = lab.patch(&url, "application/apply-patch+yaml", changed).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(updated["spec"]["ports"][0]["targetPort"], 9090);
    assert_eq!(updated["spec"]["ports"][0]["nodePort"], created["spec"]["ports"][0]["nodePort"]);
    let (s, _) = lab.patch(&format!("{SVCS}/contour"), "application/apply-patch+yaml", contour()).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "apply needs a fieldManager");
    // A YAML body works too.
    let yaml = "apiVersion: v1\nkind: Service\nmetadata:\n  name: yml\nspec:\n  ports:\n  - port: 80\n";
    let req = Request::builder()
        .method("PATCH")
        .uri(format!("{SVCS}/yml?fieldManager=x"))
        .header("content-type", "application/apply-patch+yaml")
        .body(Body::from(yaml))
        .unwrap();
    assert_eq!(lab.app.clone().oneshot(req).await.unwrap().status(), StatusCode::CREATED);
}

#[tokio::test]
async fn status_subresource_is_separate_from_the_main_resource() {
    let lab = lab().await;
    let (_, created) = lab.post(SVCS, contour()).await;
    let url = format!("{SVCS}/contour");
    // A PUT to the main resource cannot change status.
    let mut body = created.clone();
    body["status"] = json!({"loadBalancer": {"ingress": [{"ip": "1.1.1.1"}]}});
    let (s, put) = lab.put(&url, body).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(put["status"], created["status"]);
    // The status subresource can, and changes nothing else.
    let (s, st) = lab
        .patch(&format!("{url}/status"), "application/merge-patch+json", json!({"status": {"conditions": [{"type": "X", "status": "True", "reason": "R", "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}, "spec": {"type": "ClusterIP"}}))
        .await;
    assert_eq!(s, StatusCode::OK, "{st}");
    assert_eq!(st["status"]["conditions"][0]["type"], "X");
    assert_eq!(st["spec"]["type"], "LoadBalancer");
}

#[tokio::test]
async fn tables_have_the_real_columns_and_cells() {
    let lab = lab().await;
    lab.post(SVCS, contour()).await;
    let (s, t) = lab.call("GET", &format!("{SVCS}/contour"), None, "", TABLE).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(t["kind"], "Table");
    let cols: Vec<&str> =
        t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(cols, vec!["Name", "Type", "Cluster-IP", "External-IP", "Port(s)", "Age", "Selector"]);
    let row = &t["rows"][0];
    assert_eq!(row["cells"][1], "LoadBalancer");
    assert_eq!(row["cells"][3], "198.51.100.1");
    let ports = row["cells"][4].as_str().unwrap();
    assert!(ports.starts_with("80:3") && ports.contains("/TCP,443:3"), "{ports}");
    assert_eq!(row["cells"][6], "app=contour");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    let (_, full) = lab.call("GET", &format!("{SVCS}?includeObject=Object"), None, "", TABLE).await;
    assert_eq!(full["rows"][0]["object"]["kind"], "Service");
    for path in [
        "/api/v1/nodes",
        "/api/v1/namespaces",
        "/api/v1/namespaces/default/pods",
        "/api/v1/namespaces/default/endpoints",
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
    ] {
        let (s, t) = lab.call("GET", path, None, "", TABLE).await;
        assert_eq!((s, t["kind"].as_str()), (StatusCode::OK, Some("Table")), "{path}");
    }
}

#[tokio::test]
async fn selectors_filter_lists() {
    let lab = lab().await;
    lab.post(SVCS, contour()).await;
    let (_, l) = lab.get(&format!("{SVCS}?labelSelector=app%3Dcontour")).await;
    assert_eq!(l["items"].as_array().unwrap().len(), 1);
    let (_, l) = lab.get(&format!("{SVCS}?labelSelector=app+in+(x,y)")).await;
    assert_eq!(l["items"].as_array().unwrap().len(), 0);
    let (_, l) = lab.get(&format!("{SVCS}?fieldSelector=metadata.name%3Dkubernetes")).await;
    assert_eq!(l["items"][0]["metadata"]["name"], "kubernetes");
    let (s, _) = lab.get(&format!("{SVCS}?fieldSelector=spec.bogus%3Dx")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (_, all) = lab.get("/api/v1/services").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 2);
}

/// Reads watch lines until `n` events arrived (or a timeout).
async fn watch_lines(lab: &Lab, path: &str, accept: &str, n: usize) -> Vec<Value> {
    let req = Request::builder().uri(path).header("accept", accept).body(Body::empty()).unwrap();
    let resp = lab.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        let frame = tokio::time::timeout_at(deadline, body.frame()).await;
        let Ok(Some(Ok(frame))) = frame else { break };
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
            while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                out.push(serde_json::from_slice(&line).unwrap());
            }
        }
    }
    out
}

#[tokio::test]
async fn watch_streams_events_from_a_resource_version() {
    let lab = lab().await;
    let (_, list) = lab.get(SVCS).await;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let path = format!("{SVCS}?watch=true&resourceVersion={rv}&timeoutSeconds=10");
    let lab_ref = &lab;
    let watcher = watch_lines(lab_ref, &path, "application/json", 3);
    let writer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lab_ref.post(SVCS, contour()).await;
        lab_ref
            .patch(
                &format!("{SVCS}/contour"),
                "application/merge-patch+json",
                json!({"metadata": {"labels": {"x": "y"}}}),
            )
            .await;
        lab_ref.delete(&format!("{SVCS}/contour")).await;
    };
    let (events, _) = tokio::join!(watcher, writer);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, vec!["ADDED", "MODIFIED", "DELETED"]);
    assert_eq!(events[0]["object"]["kind"], "Service");
    // Without a resourceVersion: synthetic ADDED for what exists.
    let events = watch_lines(&lab, &format!("{SVCS}?watch=true&timeoutSeconds=1"), "application/json", 1).await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "kubernetes");
    // Table-wrapped events: one row each, columns only on the first.
    let (_, list) = lab.get(SVCS).await;
    let rv = list["metadata"]["resourceVersion"].as_str().unwrap().to_string();
    let path = format!("{SVCS}?watch=true&resourceVersion={rv}");
    let watcher = watch_lines(lab_ref, &path, TABLE, 2);
    let writer = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        lab_ref.post(SVCS, contour()).await;
        lab_ref.delete(&format!("{SVCS}/contour")).await;
    };
    let (events, _) = tokio::join!(watcher, writer);
    assert_eq!(events[0]["object"]["kind"], "Table");
    assert_eq!(events[0]["object"]["rows"].as_array().unwrap().len(), 1);
    assert!(!events[0]["object"]["columnDefinitions"].as_array().unwrap().is_empty());
    assert!(events[1]["object"]["columnDefinitions"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_410_expired() {
    let lab = lab_with(|c| c.event_log_capacity = 8).await;
    for i in 0..12 {
        let (s, _) =
            lab.post(SVCS, json!({"metadata": {"name": format!("s{i}")}, "spec": {"ports": [{"port": 80}]}})).await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let events = watch_lines(&lab, &format!("{SVCS}?watch=true&resourceVersion=2"), "application/json", 1).await;
    assert_eq!(events[0]["type"], "ERROR");
    assert_eq!(events[0]["object"]["code"], 410);
    assert_eq!(events[0]["object"]["reason"], "Expired");
}

#[tokio::test]
async fn concurrent_creates_get_distinct_cluster_ips_and_node_ports() {
    let lab = lab().await;
    let creates = (0..200).map(|i| {
        let lab = &lab;
        async move {
            let svc = json!({"metadata": {"name": format!("svc-{i}")}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}});
            lab.post(SVCS, svc).await
        }
    });
    let results = futures::future::join_all(creates).await;
    let mut ips = std::collections::BTreeSet::new();
    let mut ports = std::collections::BTreeSet::new();
    for (s, svc) in results {
        assert_eq!(s, StatusCode::CREATED, "{svc}");
        ips.insert(svc["spec"]["clusterIP"].as_str().unwrap().to_string());
        ports.insert(svc["spec"]["ports"][0]["nodePort"].as_i64().unwrap());
    }
    assert_eq!((ips.len(), ports.len()), (200, 200));
}

/// Posts `bodies` to `path` at once, each from a task of its own (creates admitted on several
/// threads share commits, see `Registry::create`); the answers in the order of `bodies`.
async fn post_at_once(lab: &Lab, path: &str, bodies: Vec<Value>) -> Vec<(StatusCode, Value)> {
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|body| {
            let (app, path) = (lab.app.clone(), path.to_string());
            tokio::spawn(async move {
                let req = Request::builder()
                    .method("POST")
                    .uri(path)
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_string()))
                    .unwrap();
                let resp = app.oneshot(req).await.unwrap();
                let status = resp.status();
                let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                (status, serde_json::from_slice::<Value>(&bytes).unwrap())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_of_one_name_or_one_value_have_one_winner() {
    let lab = lab().await;
    let svc = |name: String, spec: Value| json!({"metadata": {"name": name}, "spec": spec});
    for round in 0..5 {
        // One name: one 201, every other create a 409 naming it.
        let name = format!("same-{round}");
        let bodies = (0..16).map(|i| svc(name.clone(), json!({"ports": [{"port": 80 + i}]}))).collect();
        let answers = post_at_once(&lab, SVCS, bodies).await;
        let created: Vec<_> = answers.iter().filter(|(s, _)| *s == StatusCode::CREATED).collect();
        assert_eq!(created.len(), 1, "{answers:?}");
        for (s, st) in answers.iter().filter(|(s, _)| *s != StatusCode::CREATED) {
            assert_eq!(*s, StatusCode::CONFLICT, "{st}");
            assert_eq!(st["message"], format!("services \"{name}\" already exists"));
        }
        let (_, stored) = lab.get(&format!("{SVCS}/{name}")).await;
        assert_eq!(stored["metadata"]["uid"], created[0].1["metadata"]["uid"]);

        // One requested ClusterIP: one 201, the others invalid, naming the address.
        let ip = format!("10.96.7.{}", 10 + round);
        let bodies = (0..16)
            .map(|i| svc(format!("ip-{round}-{i}"), json!({"clusterIP": ip, "ports": [{"port": 80}]})))
            .collect();
        let answers = post_at_once(&lab, SVCS, bodies).await;
        assert_eq!(answers.iter().filter(|(s, _)| *s == StatusCode::CREATED).count(), 1, "{answers:?}");
        for (s, st) in answers.iter().filter(|(s, _)| *s != StatusCode::CREATED) {
            assert_eq!(*s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
            assert!(st["message"].as_str().unwrap().contains("provided IP is already allocated"), "{st}");
        }

        // LoadBalancer IPs go lowest first, so concurrent creates all claim the same one at
        // admission: every create still gets an address of its own.
        let bodies = (0..16)
            .map(|i| svc(format!("lb-{round}-{i}"), json!({"type": "LoadBalancer", "ports": [{"port": 80}]})))
            .collect();
        let answers = post_at_once(&lab, SVCS, bodies).await;
        let mut ips = std::collections::BTreeSet::new();
        for (s, svc) in &answers {
            assert_eq!(*s, StatusCode::CREATED, "{svc}");
            ips.insert(svc["status"]["loadBalancer"]["ingress"][0]["ip"].as_str().unwrap().to_string());
        }
        assert_eq!(ips.len(), 16, "{ips:?}");
    }
    // Nothing but the winners was stored.
    let (_, list) = lab.get(SVCS).await;
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1 + 5 * (1 + 1 + 16), "the kubernetes Service and each round's winners");
}

#[tokio::test]
async fn full_ranges_answer_with_a_clear_error() {
    let lab = lab_with(|c| {
        c.ranges.service_cidrs = vec!["10.96.0.0/29".parse().unwrap()]; // 6 usable, .1 is default/kubernetes
        c.ranges.node_ports = 30000..=30001;
    })
    .await;
    for i in 0..5 {
        let (s, b) =
            lab.post(SVCS, json!({"metadata": {"name": format!("s{i}")}, "spec": {"ports": [{"port": 80}]}})).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
    }
    let (s, st) = lab.post(SVCS, json!({"metadata": {"name": "full"}, "spec": {"ports": [{"port": 80}]}})).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(st["message"], "Internal error occurred: failed to allocate a serviceIP: range is full");
    lab.delete(&format!("{SVCS}/s0")).await;
    let (s, st) = lab.post(SVCS, json!({"metadata": {"name": "np"}, "spec": {"type": "NodePort", "ports": [{"name": "a", "port": 80}, {"name": "b", "port": 81}, {"name": "c", "port": 82}]}})).await;
    assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(st["message"], "Internal error occurred: failed to allocate a nodePort: range is full");
    // The failed create left nothing behind: the ClusterIP freed by s0 is still available.
    let (s, _) = lab
        .post(SVCS, json!({"metadata": {"name": "fits"}, "spec": {"type": "NodePort", "ports": [{"port": 80}]}}))
        .await;
    assert_eq!(s, StatusCode::CREATED);
}

#[tokio::test]
async fn restart_keeps_objects_cluster_ips_and_node_ports() {
    let mut lab = lab().await;
    let (_, a) = lab.post(SVCS, contour()).await;
    let _server = restart(&mut lab).await;
    let (s, b) = lab.get(&format!("{SVCS}/contour")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["spec"], a["spec"]);
    assert_eq!(b["status"], a["status"]);
    // The allocations were restored: the same NodePort cannot be taken again.
    let np = a["spec"]["ports"][0]["nodePort"].clone();
    let clash =
        json!({"metadata": {"name": "x"}, "spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": np}]}});
    assert_eq!(lab.post(SVCS, clash).await.0, StatusCode::UNPROCESSABLE_ENTITY);
    let clash =
        json!({"metadata": {"name": "y"}, "spec": {"clusterIP": a["spec"]["clusterIP"], "ports": [{"port": 80}]}});
    assert_eq!(lab.post(SVCS, clash).await.0, StatusCode::UNPROCESSABLE_ENTITY);
}

fn ready_node(name: &str) -> Value {
    let now = jiff::Timestamp::now();
    let now = jiff::Timestamp::from_second(now.as_second()).unwrap().to_string();
    json!({"metadata": {"name": name}, "status": {
        "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "192.168.56.11"}],
        "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1", "osImage": "Debian",
                     "containerRuntimeVersion": "podpath://0.1", "kubeletVersion": "v1.32.0", "kubeProxyVersion": "v1.32.0",
                     "operatingSystem": "linux", "architecture": "amd64"}}})
}

#[tokio::test]
async fn nodes_get_pod_cidrs_pods_get_scheduled_and_endpoints_follow_ready_pods() {
    let lab = lab().await;
    let (s, n1) = lab.post("/api/v1/nodes", ready_node("node-1")).await;
    assert_eq!(s, StatusCode::CREATED, "{n1}");
    assert_eq!(n1["spec"]["podCIDR"], "10.244.1.0/24");
    let (_, n2) = lab.post("/api/v1/nodes", ready_node("node-2")).await;
    assert_eq!(n2["spec"]["podCIDR"], "10.244.2.0/24");
    lab.post(SVCS, contour()).await;
    for i in 0..2 {
        let pod = json!({"metadata": {"name": format!("contour-{i}"), "labels": {"app": "contour"}},
                         "spec": {"containers": [{"name": "c", "image": "podpath/echo",
                                  "ports": [{"name": "http", "containerPort": 8080}, {"name": "https", "containerPort": 8443}]}]}});
        let (s, p) = lab.post("/api/v1/namespaces/default/pods", pod).await;
        assert_eq!(s, StatusCode::CREATED, "{p}");
        assert_eq!(p["status"]["phase"], "Pending");
    }
    // The scheduler spreads the two pods over the two nodes.
    let mut nodes = std::collections::BTreeSet::new();
    for i in 0..2 {
        let p = lab
            .eventually(&format!("/api/v1/namespaces/default/pods/contour-{i}"), |_, v| {
                v["spec"]["nodeName"].is_string()
            })
            .await;
        nodes.insert(p["spec"]["nodeName"].as_str().unwrap().to_string());
    }
    assert_eq!(nodes.len(), 2);
    // A node agent reports one pod running and ready.
    let status = json!({"status": {"phase": "Running", "podIP": "10.244.1.5", "podIPs": [{"ip": "10.244.1.5"}],
                        "conditions": [{"type": "Ready", "status": "True"}]}});
    let (s, _) =
        lab.patch("/api/v1/namespaces/default/pods/contour-0/status", "application/merge-patch+json", status).await;
    assert_eq!(s, StatusCode::OK);
    let status = json!({"status": {"phase": "Running", "podIP": "10.244.2.7", "podIPs": [{"ip": "10.244.2.7"}],
                        "conditions": [{"type": "Ready", "status": "False"}]}});
    lab.patch("/api/v1/namespaces/default/pods/contour-1/status", "application/merge-patch+json", status).await;
    let ep = lab
        .eventually("/api/v1/namespaces/default/endpoints/contour", |s, v| {
            s == StatusCode::OK && v.pointer("/subsets/0/notReadyAddresses").is_some()
        })
        .await;
    assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], "10.244.1.5");
    assert_eq!(ep["subsets"][0]["notReadyAddresses"][0]["ip"], "10.244.2.7");
    // The named targetPort "https" resolved through the container port.
    let ports: Vec<i64> =
        ep["subsets"][0]["ports"].as_array().unwrap().iter().map(|p| p["port"].as_i64().unwrap()).collect();
    assert_eq!(ports, vec![8080, 8443]);
    // The slice is written after the Endpoints object: wait for it too.
    let slices = lab
        .eventually(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dcontour",
            |_, v| v.pointer("/items/0/endpoints").and_then(|e| e.as_array()).is_some_and(|e| e.len() == 2),
        )
        .await;
    let slice = &slices["items"][0];
    assert_eq!(slice["addressType"], "IPv4");
    assert_eq!(slice["endpoints"].as_array().unwrap().len(), 2);
    let ready: Vec<bool> =
        slice["endpoints"].as_array().unwrap().iter().map(|e| e["conditions"]["ready"].as_bool().unwrap()).collect();
    assert_eq!(ready, vec![true, false]);
    // Deleting the Service removes its endpoints.
    lab.delete(&format!("{SVCS}/contour")).await;
    lab.eventually("/api/v1/namespaces/default/endpoints/contour", |s, _| s == StatusCode::NOT_FOUND).await;
    lab.eventually(
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dcontour",
        |_, v| v["items"].as_array().is_some_and(|i| i.is_empty()),
    )
    .await;
}

#[tokio::test]
async fn the_scheduler_honours_node_selectors_and_says_why_a_pod_stays_pending() {
    let lab = lab().await;
    for name in ["node-1", "node-2"] {
        let mut node = ready_node(name);
        node["metadata"]["labels"] = json!({"kubernetes.io/hostname": name});
        lab.post("/api/v1/nodes", node).await;
    }
    let pod = |name: &str, selector: Value| {
        json!({"metadata": {"name": name}, "spec": {"nodeSelector": selector,
               "containers": [{"name": "c", "image": "podpath/echo"}]}})
    };
    // Three pods pinned to node-2: spreading would put one elsewhere, the selector must not.
    for i in 0..3 {
        lab.post(
            "/api/v1/namespaces/default/pods",
            pod(&format!("pinned-{i}"), json!({"kubernetes.io/hostname": "node-2"})),
        )
        .await;
    }
    for i in 0..3 {
        let p = lab
            .eventually(&format!("/api/v1/namespaces/default/pods/pinned-{i}"), |_, v| {
                v["spec"]["nodeName"].is_string()
            })
            .await;
        assert_eq!(p["spec"]["nodeName"], "node-2", "{p}");
    }
    lab.post("/api/v1/namespaces/default/pods", pod("nowhere", json!({"disk": "ssd"}))).await;
    let p = lab
        .eventually("/api/v1/namespaces/default/pods/nowhere", |_, v| {
            v.pointer("/status/conditions/0/reason").is_some()
        })
        .await;
    assert!(p["spec"]["nodeName"].is_null(), "{p}");
    assert_eq!(p["status"]["conditions"][0]["reason"], "Unschedulable");
    assert_eq!(
        p["status"]["conditions"][0]["message"],
        "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling."
    );
}

#[tokio::test]
async fn silent_nodes_go_not_ready_and_their_pods_are_removed_on_delete() {
    let lab = lab().await;
    lab.post("/api/v1/nodes", ready_node("node-1")).await;
    let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "podpath/echo"}]}});
    lab.post("/api/v1/namespaces/default/pods", pod).await;
    // While the node is Ready, delete is graceful: the node agent would finish it.
    let (s, p) = lab.delete("/api/v1/namespaces/default/pods/p").await;
    assert_eq!(s, StatusCode::OK);
    assert!(p["metadata"]["deletionTimestamp"].is_string());
    // No heartbeat: after the grace period the node is NotReady and the pod is removed.
    let n = lab
        .eventually("/api/v1/nodes/node-1", |_, v| {
            v["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "Unknown"))
        })
        .await;
    assert_eq!(n["status"]["conditions"][0]["reason"], "NodeStatusUnknown");
    lab.eventually("/api/v1/namespaces/default/pods/p", |s, _| s == StatusCode::NOT_FOUND).await;
    let (_, t) = lab.call("GET", "/api/v1/nodes/node-1", None, "", TABLE).await;
    assert_eq!(t["rows"][0]["cells"][1], "NotReady");
}

/// The kubelet posts its node's status every 5 minutes when nothing changed; its Lease is
/// the heartbeat. A node whose Lease is renewed stays Ready past the grace period; once the
/// renewals stop, it goes NotReady.
#[tokio::test]
async fn a_node_whose_lease_is_renewed_stays_ready_though_its_status_is_old() {
    let lab = lab().await;
    lab.post("/api/v1/nodes", ready_node("node-1")).await;
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let lease = |t: jiff::Timestamp| {
        json!({"metadata": {"name": "node-1", "namespace": "kube-node-lease"},
               "spec": {"holderIdentity": "node-1", "leaseDurationSeconds": 40,
                        "renewTime": t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}})
    };
    assert_eq!(lab.post(leases, lease(jiff::Timestamp::now())).await.0, StatusCode::CREATED);
    // Renewed every 500 ms for twice the grace (2 s): still Ready.
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (_, current) = lab.get(&format!("{leases}/node-1")).await;
        let mut next = lease(jiff::Timestamp::now());
        next["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
        assert_eq!(lab.put(&format!("{leases}/node-1"), next).await.0, StatusCode::OK);
    }
    let (_, n) = lab.get("/api/v1/nodes/node-1").await;
    assert_eq!(n["status"]["conditions"][0]["status"], "True", "{n}");
    // The renewals stop: NotReady after the grace.
    let n = lab.eventually("/api/v1/nodes/node-1", |_, v| v["status"]["conditions"][0]["status"] == "Unknown").await;
    assert_eq!(n["status"]["conditions"][0]["reason"], "NodeStatusUnknown");
}

#[tokio::test]
async fn a_node_that_reports_not_ready_has_its_pods_marked_not_ready_at_once_with_events() {
    let lab = lab().await;
    lab.post("/api/v1/nodes", ready_node("node-1")).await;
    let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "podpath/echo"}]}});
    lab.post("/api/v1/namespaces/default/pods", pod).await;
    let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    lab.patch("/api/v1/namespaces/default/pods/p/status", "application/merge-patch+json", status).await;
    // The agent says NotReady (as one that stops does), heart-beating: no grace period applies.
    let mut node = ready_node("node-1");
    node["status"]["conditions"][0]["status"] = json!("False");
    node["status"]["conditions"][0]["reason"] = json!("KubeletNotReady");
    let (s, n) = lab
        .patch("/api/v1/nodes/node-1/status", "application/merge-patch+json", json!({"status": node["status"]}))
        .await;
    assert_eq!(s, StatusCode::OK, "{n}");
    let p = lab
        .eventually("/api/v1/namespaces/default/pods/p", |_, v| {
            v["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "False"))
        })
        .await;
    let ready = p["status"]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Ready").unwrap().clone();
    assert_eq!(ready["reason"], "NodeNotReady", "{p}");
    let events = lab
        .eventually("/api/v1/namespaces/default/events", |_, v| {
            v["items"].as_array().is_some_and(|i| i.iter().filter(|e| e["reason"] == "NodeNotReady").count() == 2)
        })
        .await;
    let of = |kind: &str| {
        events["items"].as_array().unwrap().iter().find(|e| e["involvedObject"]["kind"] == kind).unwrap().clone()
    };
    assert_eq!(
        (of("Pod")["type"].as_str(), of("Pod")["message"].as_str()),
        (Some("Warning"), Some("Node is not ready"))
    );
    assert_eq!(of("Pod")["source"]["component"], "node-controller");
    assert_eq!(of("Node")["message"], "Node node-1 status is now: NodeNotReady");
    // The node itself stays as it said (False), not Unknown: it is heart-beating.
    let (_, n) = lab.get("/api/v1/nodes/node-1").await;
    assert_eq!(n["status"]["conditions"][0]["status"], "False");
}

#[tokio::test]
async fn a_job_makes_its_pods_completes_when_they_succeed_and_its_pods_go_with_it() {
    let lab = lab().await;
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "pi"},
        "spec": {"completions": 2, "parallelism": 2, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "pi", "image": "busybox", "command": ["true"]}]}}}});
    let (s, j) = lab.post("/apis/batch/v1/namespaces/default/jobs", job).await;
    assert_eq!(s, StatusCode::CREATED, "{j}");
    let pods = lab
        .eventually("/api/v1/namespaces/default/pods?labelSelector=job-name%3Dpi", |_, v| {
            v["items"].as_array().is_some_and(|i| i.len() == 2)
        })
        .await;
    let names: Vec<String> =
        pods["items"].as_array().unwrap().iter().map(|p| p["metadata"]["name"].as_str().unwrap().to_string()).collect();
    assert!(names.iter().all(|n| n.starts_with("pi-")), "{names:?}");
    let j = lab.eventually("/apis/batch/v1/namespaces/default/jobs/pi", |_, v| v["status"]["active"] == 2).await;
    assert!(j["status"]["startTime"].is_string(), "{j}");
    // The node agent reports both pods done.
    for n in &names {
        let status = json!({"status": {"phase": "Succeeded"}});
        lab.patch(&format!("/api/v1/namespaces/default/pods/{n}/status"), "application/merge-patch+json", status).await;
    }
    let j = lab
        .eventually("/apis/batch/v1/namespaces/default/jobs/pi", |_, v| {
            v["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Complete" && c["status"] == "True"))
        })
        .await;
    assert_eq!((j["status"]["succeeded"].as_i64(), j["status"]["active"].as_i64()), (Some(2), Some(0)), "{j}");
    assert!(j["status"]["completionTime"].is_string());
    let events = lab
        .eventually("/api/v1/namespaces/default/events", |_, v| {
            v["items"].as_array().is_some_and(|i| i.iter().any(|e| e["reason"] == "Completed"))
        })
        .await;
    let reasons: Vec<&str> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["involvedObject"]["kind"] == "Job")
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(reasons.contains(&"SuccessfulCreate") && reasons.contains(&"Completed"), "{reasons:?}");
    // Deleting the Job takes its pods (background cascade).
    lab.delete("/apis/batch/v1/namespaces/default/jobs/pi").await;
    lab.eventually("/api/v1/namespaces/default/pods?labelSelector=job-name%3Dpi", |_, v| {
        v["items"].as_array().is_some_and(|i| i.is_empty())
    })
    .await;
}

#[tokio::test]
async fn namespaces_are_protected_or_emptied_before_removal() {
    let lab = lab().await;
    let (s, st) = lab.delete("/api/v1/namespaces/default").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(st["message"], "namespaces \"default\" is forbidden: this namespace may not be deleted");
    assert_eq!(lab.post("/api/v1/namespaces", json!({"metadata": {"name": "team-a"}})).await.0, StatusCode::CREATED);
    let (s, _) = lab.post("/api/v1/namespaces/team-a/services", contour()).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, ns) = lab.delete("/api/v1/namespaces/team-a").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ns["status"]["phase"], "Terminating");
    lab.eventually("/api/v1/namespaces/team-a", |s, _| s == StatusCode::NOT_FOUND).await;
    let (_, l) = lab.get("/api/v1/namespaces/team-a/services").await;
    assert!(l["items"].as_array().unwrap().is_empty());
    let (s, st) = lab.post("/api/v1/namespaces", json!({"metadata": {"name": "Bad"}})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
}

#[tokio::test]
async fn discovery_version_and_openapi() {
    let lab = lab().await;
    let (_, v) = lab.get("/version").await;
    assert_eq!(v["minor"], "32");
    for f in
        ["major", "minor", "gitVersion", "gitCommit", "gitTreeState", "buildDate", "goVersion", "compiler", "platform"]
    {
        assert!(v[f].is_string(), "{f}");
    }
    let (_, api) = lab.get("/api").await;
    assert_eq!(api["versions"], json!(["v1"]));
    let (_, core) = lab.get("/api/v1").await;
    let svc = core["resources"].as_array().unwrap().iter().find(|r| r["name"] == "services").unwrap();
    assert_eq!(svc["shortNames"], json!(["svc"]));
    let (_, apis) = lab.get("/apis").await;
    let names: Vec<&str> = apis["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "admissionregistration.k8s.io",
            "apiextensions.k8s.io",
            "apps",
            "authentication.k8s.io",
            "authorization.k8s.io",
            "autoscaling",
            "batch",
            "coordination.k8s.io",
            "discovery.k8s.io",
            "events.k8s.io",
            "metrics.k8s.io",
            "networking.k8s.io",
            "rbac.authorization.k8s.io",
            "storage.k8s.io"
        ]
    );
    let autoscaling = apis["groups"].as_array().unwrap().iter().find(|g| g["name"] == "autoscaling").unwrap();
    assert_eq!(autoscaling["preferredVersion"]["version"], "v2");
    assert_eq!(
        autoscaling["versions"],
        json!([{"groupVersion": "autoscaling/v2", "version": "v2"},
                                              {"groupVersion": "autoscaling/v1", "version": "v1"}])
    );
    // kubectl scale finds the Scale kind of deployments/scale through discovery.
    let (_, apps) = lab.get("/apis/apps/v1").await;
    let scale = apps["resources"].as_array().unwrap().iter().find(|r| r["name"] == "deployments/scale").unwrap();
    assert_eq!(
        (&scale["group"], &scale["version"], &scale["kind"]),
        (&json!("autoscaling"), &json!("v1"), &json!("Scale"))
    );
    let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let req = Request::builder().uri("/api").header("accept", accept).body(Body::empty()).unwrap();
    let resp = lab.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let res = &body["items"][0]["versions"][0]["resources"];
    let svc = res.as_array().unwrap().iter().find(|r| r["resource"] == "services").unwrap();
    assert_eq!(svc["scope"], "Namespaced");
    assert_eq!(svc["responseKind"]["kind"], "Service");
    let (_, idx) = lab.get("/openapi/v3").await;
    let url = idx["paths"]["api/v1"]["serverRelativeURL"].as_str().unwrap().to_string();
    let (_, doc) = lab.get(&url).await;
    let op = &doc["paths"]["/api/v1/namespaces/{namespace}/services/{name}"]["patch"];
    assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "Service");
    assert!(op["parameters"].as_array().unwrap().iter().any(|p| p["name"] == "fieldValidation"));
    // OpenAPI v2, in JSON: the same schemas for every group.
    let (code, v2) = lab.get("/openapi/v2").await;
    assert_eq!(code, 200);
    assert_eq!(v2["swagger"], "2.0");
    let defs = &v2["definitions"];
    assert!(defs["io.k8s.api.core.v1.ServiceSpec"]["properties"]["ports"]["description"].is_string());
    assert_eq!(defs["io.k8s.api.apps.v1.Deployment"]["x-kubernetes-group-version-kind"][0]["kind"], "Deployment");
    assert!(v2["paths"]["/apis/networking.k8s.io/v1/namespaces/{namespace}/ingresses/{name}"]["patch"].is_object());
    // In protobuf, as kubectl asks for it: gnostic's Document, answered under the media type
    // kube-apiserver answers with (kubectl's own validation reads it: e2e/tests/kubectl.rs).
    let pb = "application/com.github.proto-openapi.spec.v2@v1.0+protobuf";
    let req = Request::builder().uri("/openapi/v2").header("accept", pb).body(Body::empty()).unwrap();
    let resp = lab.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/com.github.proto-openapi.spec.v2.v1.0+protobuf");
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..5], b"\x0a\x032.0", "field 1 (swagger) first");
    assert!(bytes.windows(b"io.k8s.api.apps.v1.Deployment".len()).any(|w| w == b"io.k8s.api.apps.v1.Deployment"));
    // Neither form acceptable: 406, not bytes the client cannot read.
    let req = Request::builder().uri("/openapi/v2").header("accept", "application/xml").body(Body::empty()).unwrap();
    let resp = lab.app.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 406);
    let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["reason"], "NotAcceptable");
    assert!(body["message"].as_str().unwrap().contains("application/json and application/com.github"), "{body}");
}

#[tokio::test]
async fn token_and_body_limits_are_enforced() {
    let lab = lab_with(|c| {
        c.token = Some("s3cret".into());
        c.max_body_bytes = 1024;
    })
    .await;
    let (s, st) = lab.get(SVCS).await;
    assert_eq!((s, st["reason"].as_str()), (StatusCode::UNAUTHORIZED, Some("Unauthorized")));
    let req = Request::builder().uri(SVCS).header("authorization", "Bearer s3cret").body(Body::empty()).unwrap();
    assert_eq!(lab.app.clone().oneshot(req).await.unwrap().status(), StatusCode::OK);
    let big =
        json!({"metadata": {"name": "x", "annotations": {"a": "b".repeat(4096)}}, "spec": {"ports": [{"port": 80}]}});
    let req = Request::builder()
        .method("POST")
        .uri(SVCS)
        .header("authorization", "Bearer s3cret")
        .header("content-type", "application/json")
        .body(Body::from(big.to_string()))
        .unwrap();
    assert_eq!(lab.app.clone().oneshot(req).await.unwrap().status(), StatusCode::PAYLOAD_TOO_LARGE);
    let req = Request::builder().uri("/healthz").body(Body::empty()).unwrap();
    assert_eq!(lab.app.clone().oneshot(req).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn garbage_never_panics_the_server() {
    let lab = lab().await;
    let junk = [
        json!(null),
        json!([]),
        json!({"metadata": 5}),
        json!({"metadata": {"name": 5}}),
        json!({"metadata": {"name": "x"}, "spec": {"ports": "nope"}}),
        json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": "80"}]}}),
        json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 99999999999i64}]}}),
        json!({"kind": "Pod", "metadata": {"name": "x"}}),
    ];
    for j in junk {
        let (s, st) = lab.post(SVCS, j.clone()).await;
        assert!(s.is_client_error(), "{j}: {s} {st}");
        assert_eq!(st["kind"], "Status");
        for patch_ct in
            ["application/merge-patch+json", "application/strategic-merge-patch+json", "application/json-patch+json"]
        {
            let (s, _) = lab.patch(&format!("{SVCS}/kubernetes"), patch_ct, j.clone()).await;
            assert!(s.is_client_error() || s == StatusCode::OK, "{patch_ct} {j}: {s}");
        }
    }
    for path in [
        "/api/v1/namespaces",
        "/api/v1/namespaces/default/services/a/b/c",
        "/apis/x/y/z",
        "/api/v1/namespaces/default/nodes",
    ] {
        let (s, _) = lab.call("PATCH", path, Some(json!({})), "application/merge-patch+json", "application/json").await;
        assert!(s.is_client_error(), "{path}: {s}");
    }
}

/// Options and edge values the real server refuses or survives: an unknown `dryRun` is 422 and
/// writes nothing, `dryRun=All` deletes nothing, boolean parameters read as the real server reads
/// them, and int64 extremes in a watch timeout or a pod's grace period do not panic.
#[tokio::test]
async fn dry_run_booleans_and_int64_extremes_as_the_real_server() {
    let lab = lab().await;
    let (s, st) = lab.post(&format!("{SVCS}?dryRun=all"), contour()).await;
    assert_eq!((s, st["reason"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("Invalid")), "{st}");
    assert_eq!(
        st["message"],
        "CreateOptions.meta.k8s.io \"\" is invalid: dryRun: Unsupported value: []string{\"all\"}: supported values: \"All\""
    );
    assert_eq!(st["details"]["kind"], "CreateOptions");
    assert_eq!(lab.get(&format!("{SVCS}/contour")).await.0, StatusCode::NOT_FOUND, "nothing stored");
    let (s, dry) = lab.post(&format!("{SVCS}?dryRun=All"), contour()).await;
    assert_eq!(s, StatusCode::CREATED, "{dry}");
    assert_eq!(lab.get(&format!("{SVCS}/contour")).await.0, StatusCode::NOT_FOUND, "a dry run stores nothing");

    let (s, _) = lab.post(SVCS, contour()).await;
    assert_eq!(s, StatusCode::CREATED);
    let (s, gone) = lab.delete(&format!("{SVCS}/contour?dryRun=All")).await;
    assert_eq!((s, gone["metadata"]["name"].as_str()), (StatusCode::OK, Some("contour")));
    let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "dryRun": ["All"]});
    let (s, _) =
        lab.call("DELETE", &format!("{SVCS}/contour"), Some(body), "application/json", "application/json").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(lab.get(&format!("{SVCS}/contour")).await.0, StatusCode::OK, "a dry-run delete deletes nothing");
    let (s, st) = lab.delete(&format!("{SVCS}/contour?dryRun=yes")).await;
    assert_eq!((s, st["details"]["kind"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("DeleteOptions")));
    assert_eq!(lab.get(&format!("{SVCS}/contour")).await.0, StatusCode::OK);

    // `watch=True` is a watch (kubernetes_asyncio sends it); `watch=false` a list.
    let lines = watch_lines(&lab, &format!("{SVCS}?watch=True"), "application/json", 2).await;
    assert!(lines.iter().all(|l| l["type"] == "ADDED"), "{lines:?}");
    let (s, list) = lab.get(&format!("{SVCS}?watch=false")).await;
    assert_eq!((s, list["kind"].as_str()), (StatusCode::OK, Some("ServiceList")));
    // int64 extremes: the largest timeout is a watch, past int64 a 400, never a panic.
    let lines =
        watch_lines(&lab, &format!("{SVCS}?watch=1&timeoutSeconds=9223372036854775807"), "application/json", 1).await;
    assert_eq!(lines.len(), 1);
    let (s, _) = lab.get(&format!("{SVCS}?watch=true&timeoutSeconds=18446744073709551615")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);

    // A pod on a Ready node with the largest grace period: marked for deletion, not a panic;
    // grace 0 then removes it.
    lab.post("/api/v1/nodes", ready_node("node-1")).await;
    let pod = json!({"metadata": {"name": "forever"}, "spec": {"nodeName": "node-1",
        "terminationGracePeriodSeconds": i64::MAX, "containers": [{"name": "c", "image": "podpath/echo"}]}});
    let (s, p) = lab.post("/api/v1/namespaces/default/pods", pod).await;
    assert_eq!(s, StatusCode::CREATED, "{p}");
    let (s, marked) = lab.delete("/api/v1/namespaces/default/pods/forever").await;
    assert_eq!(s, StatusCode::OK, "{marked}");
    assert!(marked["metadata"]["deletionTimestamp"].is_string(), "{marked}");
    let (s, _) = lab.delete("/api/v1/namespaces/default/pods/forever?gracePeriodSeconds=0").await;
    assert_eq!(s, StatusCode::OK);

    // A path the server does not serve: 404 with (empty) details, which kubectl reads.
    let (s, st) = lab.get("/api/v1/namespaces/default/pods/forever/nonsense").await;
    assert_eq!((s, &st["details"]), (StatusCode::NOT_FOUND, &json!({})), "{st}");
}

/// A YAML body nested far deeper than any manifest is refused before it is parsed (parsing
/// 100,000 levels took libyaml tens of seconds and stalled the server); ordinary YAML is served.
#[tokio::test]
async fn deeply_nested_yaml_is_refused_before_parsing() {
    let lab = lab().await;
    let bomb = format!("metadata: {{name: deep}}\ndata: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    for (method, path, ct) in [
        ("POST", "/api/v1/namespaces/default/configmaps".to_string(), "application/yaml"),
        (
            "PATCH",
            "/api/v1/namespaces/default/configmaps/deep?fieldManager=t".to_string(),
            "application/apply-patch+yaml",
        ),
    ] {
        let req = Request::builder()
            .method(method)
            .uri(&path)
            .header("content-type", ct)
            .header("accept", "application/json")
            .body(Body::from(bomb.clone()))
            .unwrap();
        let resp = lab.app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{method} {ct}");
        let body: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        assert!(body["message"].as_str().unwrap().contains("nested"), "{body}");
    }
    let manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: fine\ndata:\n  a: '1'\n";
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/namespaces/default/configmaps")
        .header("content-type", "application/yaml")
        .header("accept", "application/json")
        .body(Body::from(manifest))
        .unwrap();
    assert_eq!(lab.app.clone().oneshot(req).await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(lab.get("/api/v1/namespaces/default/configmaps/deep").await.0, StatusCode::NOT_FOUND);
}

/// LoadBalancer Services created while the pool is full get the first address that frees up,
/// oldest first, with no write to the Service itself (a cloud controller's queue).
#[tokio::test]
async fn pending_load_balancers_get_freed_addresses_oldest_first() {
    let lab = lab_with(|c| c.ranges.lb_pools = vec!["198.51.100.0/30".parse().unwrap()]).await; // .1 and .2
    let lb =
        |name: &str| json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]}});
    let ip = |v: &Value| v["status"]["loadBalancer"]["ingress"][0]["ip"].as_str().map(str::to_string);
    for name in ["a", "b"] {
        let (s, v) = lab.post(SVCS, lb(name)).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert!(ip(&v).is_some(), "{v}");
    }
    let (_, c) = lab.post(SVCS, lb("c")).await;
    assert_eq!(ip(&c), None, "the pool is full: c waits");
    // One second later, so creation times order them.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (_, d) = lab.post(SVCS, lb("d")).await;
    assert_eq!(ip(&d), None);
    let (_, a) = lab.get(&format!("{SVCS}/a")).await;
    let freed = ip(&a).unwrap();
    lab.delete(&format!("{SVCS}/a")).await;
    let c = lab.eventually(&format!("{SVCS}/c"), |_, v| ip(v).is_some()).await;
    assert_eq!(ip(&c), Some(freed), "the oldest pending Service gets the freed address");
    let (_, d) = lab.get(&format!("{SVCS}/d")).await;
    assert_eq!(ip(&d), None, "the younger one still waits");
    // A Service that stops being a LoadBalancer frees its address for d.
    let (_, b) = lab.get(&format!("{SVCS}/b")).await;
    let (s, v) =
        lab.patch(&format!("{SVCS}/b"), "application/merge-patch+json", json!({"spec": {"type": "ClusterIP"}})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let d = lab.eventually(&format!("{SVCS}/d"), |_, v| ip(v).is_some()).await;
    assert_eq!(ip(&d), ip(&b));
}

/// A created workload comes back with a status, empty as the real server's (clients such as kr8s
/// and the Python client read it at once).
#[tokio::test]
async fn created_workloads_carry_an_empty_status() {
    let lab = lab().await;
    let template =
        json!({"metadata": {"labels": {"app": "w"}}, "spec": {"containers": [{"name": "c", "image": "podpath/echo"}]}});
    let spec = json!({"replicas": 0, "selector": {"matchLabels": {"app": "w"}}, "template": template});
    let (s, d) = lab
        .post("/apis/apps/v1/namespaces/default/deployments", json!({"metadata": {"name": "w"}, "spec": spec}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{d}");
    assert_eq!(d["status"], json!({}));
    let (s, rs) = lab
        .post("/apis/apps/v1/namespaces/default/replicasets", json!({"metadata": {"name": "r"}, "spec": spec}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{rs}");
    assert_eq!(rs["status"], json!({"replicas": 0}));
}

/// A patch or update cannot rename, move or re-identify an object: the real server's 400s
/// (name, namespace) and 422 (uid), and the object stays as it was.
#[tokio::test]
async fn patches_cannot_change_an_objects_identity() {
    let lab = lab().await;
    let (s, created) = lab.post(SVCS, contour()).await;
    assert_eq!(s, StatusCode::CREATED);
    let path = format!("{SVCS}/contour");
    let jp = "application/json-patch+json";
    let (s, st) = lab.patch(&path, jp, json!([{"op": "replace", "path": "/metadata/name", "value": "other"}])).await;
    assert_eq!(
        (s, st["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some("the name of the object (other) does not match the name on the URL (contour)"))
    );
    let (s, st) =
        lab.patch(&path, jp, json!([{"op": "replace", "path": "/metadata/namespace", "value": "kube-system"}])).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{st}");
    assert_eq!(st["message"], "the namespace of the provided object does not match the namespace sent on the request");
    let (s, st) = lab.patch(&path, jp, json!([{"op": "replace", "path": "/metadata/uid", "value": "x-y-z"}])).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert_eq!(
        st["message"],
        "Service \"contour\" is invalid: metadata.uid: Invalid value: \"x-y-z\": field is immutable"
    );
    let (s, st) = lab.patch(&path, "application/merge-patch+json", json!({"metadata": {"name": "other"}})).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{st}");
    let mut renamed = created.clone();
    renamed["metadata"]["name"] = json!("other");
    assert_eq!(lab.put(&path, renamed).await.0, StatusCode::BAD_REQUEST);
    let (_, now) = lab.get(&path).await;
    assert_eq!(now["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"], "nothing was written");
    assert_eq!(lab.get(&format!("{SVCS}/other")).await.0, StatusCode::NOT_FOUND);
}

/// `propagationPolicy` as the real server reads it: a value it does not know is 422 and
/// deletes nothing; `orphanDependents` with a policy is refused.
#[tokio::test]
async fn delete_propagation_policy_is_validated() {
    let lab = lab().await;
    lab.post(SVCS, contour()).await;
    let path = format!("{SVCS}/contour");
    let (s, st) = lab.delete(&format!("{path}?propagationPolicy=Sideways")).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert_eq!(st["message"], "DeleteOptions.meta.k8s.io \"\" is invalid: propagationPolicy: Unsupported value: \"Sideways\": supported values: \"Foreground\", \"Background\", \"Orphan\", \"nil\"");
    let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "orphanDependents": true, "propagationPolicy": "Background"});
    let (s, _) = lab.call("DELETE", &path, Some(body), "application/json", "application/json").await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(lab.get(&path).await.0, StatusCode::OK, "nothing deleted");
    let body = json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"});
    let (s, _) = lab.call("DELETE", &path, Some(body), "application/json", "application/json").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(lab.get(&path).await.0, StatusCode::NOT_FOUND);
}

/// DeleteOptions and a pods/eviction Eviction sent as protobuf (kubectl's typed clients do):
/// the options are read (dryRun, gracePeriodSeconds) and the eviction deletes the pod.
#[tokio::test]
async fn protobuf_delete_options_and_evictions() {
    let lab = lab().await;
    lab.post("/api/v1/nodes", ready_node("node-1")).await;
    let pod =
        json!({"metadata": {"name": "p"}, "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "i"}]}});
    assert_eq!(lab.post("/api/v1/namespaces/default/pods", pod).await.0, StatusCode::CREATED);
    let send = |method: &str, path: &str, body: Vec<u8>| {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", "application/vnd.kubernetes.protobuf")
            .header("accept", "application/json")
            .body(Body::from(body))
            .unwrap();
        let app = lab.app.clone();
        async move {
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
        }
    };
    // DeleteOptions{dryRun: ["All"]}: field 5.
    let dry = protobuf_envelope("meta.k8s.io/v1", "DeleteOptions", &[0x2a, 0x03, b'A', b'l', b'l']);
    let (s, _) = send("DELETE", "/api/v1/namespaces/default/pods/p", dry).await;
    assert_eq!(s, StatusCode::OK);
    let (_, p) = lab.get("/api/v1/namespaces/default/pods/p").await;
    assert!(p["metadata"].get("deletionTimestamp").is_none(), "a dry run: {p}");
    // Eviction{deleteOptions{gracePeriodSeconds: 0}}: field 2 holding field 1 = 0.
    let eviction = protobuf_envelope("policy/v1", "Eviction", &[0x12, 0x02, 0x08, 0x00]);
    let (s, st) = send("POST", "/api/v1/namespaces/default/pods/p/eviction", eviction).await;
    assert_eq!((s, st["status"].as_str()), (StatusCode::CREATED, Some("Success")), "{st}");
    assert_eq!(lab.get("/api/v1/namespaces/default/pods/p").await.0, StatusCode::NOT_FOUND, "grace 0: gone");
    let (s, _) =
        send("POST", "/api/v1/namespaces/default/pods/p/eviction", protobuf_envelope("policy/v1", "Eviction", &[]))
            .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

/// The real server's size limits: annotations over 256 KiB in total are 422, a body over
/// `--max-request-bytes` (3 MiB by default) is 413; neither stores anything.
#[tokio::test]
async fn objects_and_bodies_over_the_limits_are_refused() {
    let lab = lab().await;
    let mut svc = contour();
    svc["metadata"]["annotations"] = json!({"a": "x".repeat(200 << 10), "b": "y".repeat(100 << 10)});
    let (s, st) = lab.post(SVCS, svc).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert_eq!(st["details"]["causes"][0]["field"], "metadata.annotations");
    assert!(
        st["message"].as_str().unwrap().contains("metadata.annotations: Too long: may not be more than 262144 bytes"),
        "{st}"
    );
    let mut huge = contour();
    huge["metadata"]["labels"] = json!({"x": "y"});
    huge["spec"]["externalIPs"] = json!(vec!["1.2.3.4"; 400_000]);
    let (s, st) = lab.post(SVCS, huge).await;
    assert_eq!((s, st["reason"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("RequestEntityTooLarge")));
    assert_eq!(lab.get(&format!("{SVCS}/contour")).await.0, StatusCode::NOT_FOUND);
}

/// Events as `kubectl describe` reads them: the scheduler's, the controllers', aggregated into
/// one Event with a count when repeated, found by involvedObject field selectors, and gone
/// after `--event-ttl`.
#[tokio::test]
async fn events_are_recorded_aggregated_and_expire() {
    use apiserver_lite::controllers::events::{record, EventType, Report};
    let lab = lab_with(|c| {
        c.controllers.event_ttl = Duration::from_secs(2);
        c.controllers.resync = Duration::from_secs(1);
    })
    .await;
    let pod = json!({"metadata": {"name": "lonely"}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
    let (_, created) = lab.post("/api/v1/namespaces/default/pods", pod).await;
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let selector = format!(
        "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Dlonely,involvedObject.namespace%3Ddefault,involvedObject.kind%3DPod,involvedObject.uid%3D{uid}"
    );
    let events = lab.eventually(&selector, |_, v| v["items"].as_array().is_some_and(|i| !i.is_empty())).await;
    let e = &events["items"][0];
    assert_eq!((e["type"].as_str(), e["reason"].as_str()), (Some("Warning"), Some("FailedScheduling")));
    assert_eq!(e["source"]["component"], "default-scheduler");
    // The same report again: one Event, count 2.
    let reg = lab.server.as_ref().unwrap().registry.clone();
    let (_, stored) = lab.get("/api/v1/namespaces/default/pods/lonely").await;
    for _ in 0..2 {
        let r = Report {
            component: "test",
            host: Some("node-1"),
            object: &stored,
            kind: api::Kind::Pod,
            field_path: Some("spec.containers{c}"),
            type_: EventType::Normal,
            reason: "Poked",
            message: "poked".into(),
        };
        record(&reg, r).await;
    }
    let (_, list) = lab.get("/api/v1/namespaces/default/events?fieldSelector=reason%3DPoked").await;
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["count"], 2);
    assert_eq!(
        (items[0]["source"]["host"].as_str(), items[0]["reportingInstance"].as_str()),
        (Some("node-1"), Some("node-1"))
    );
    assert_eq!(items[0]["involvedObject"]["fieldPath"], "spec.containers{c}");
    let name = items[0]["metadata"]["name"].as_str().unwrap();
    let nanos = i128::from_str_radix(name.strip_prefix("lonely.").unwrap(), 16).unwrap();
    let age = jiff::Timestamp::now().as_nanosecond() - nanos;
    assert!((0..60_000_000_000).contains(&age), "named by the time it was first seen, as client-go names: {name}");
    // Past the TTL (2 s) a resync removes them.
    lab.eventually("/api/v1/namespaces/default/events?fieldSelector=reason%3DPoked", |_, v| {
        v["items"].as_array().is_some_and(|i| i.is_empty())
    })
    .await;
}

#[tokio::test]
async fn events_k8s_io_v1_serves_the_same_events_in_its_own_fields() {
    let lab = lab().await;
    let core = json!({"metadata": {"name": "web.1"}, "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default"},
                      "reason": "Started", "message": "Started container web", "type": "Normal",
                      "source": {"component": "kubelet", "host": "node-1"}, "count": 3});
    let (code, _) = lab.post("/api/v1/namespaces/default/events", core).await;
    assert_eq!(code, 201);
    let (code, e) = lab.get("/apis/events.k8s.io/v1/namespaces/default/events/web.1").await;
    assert_eq!(code, 200, "{e}");
    assert_eq!(e["apiVersion"], "events.k8s.io/v1");
    assert_eq!((e["note"].as_str(), e["regarding"]["name"].as_str()), (Some("Started container web"), Some("web")));
    assert_eq!((e["deprecatedCount"].as_i64(), e["deprecatedSource"]["host"].as_str()), (Some(3), Some("node-1")));
    // Lists, with a field selector on the version's own field names.
    let (_, list) = lab.get("/apis/events.k8s.io/v1/events?fieldSelector=regarding.name%3Dweb").await;
    assert_eq!(list["apiVersion"], "events.k8s.io/v1");
    assert_eq!(list["items"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["items"][0]["note"], "Started container web");
    let (_, none) = lab.get("/apis/events.k8s.io/v1/events?fieldSelector=regarding.name%3Dother").await;
    assert!(none["items"].as_array().unwrap().is_empty());
    // A create gets this version's checks, with its own names in the Status.
    let (code, st) = lab
        .post(
            "/apis/events.k8s.io/v1/namespaces/default/events",
            json!({"metadata": {"name": "bad"}, "type": "Normal"}),
        )
        .await;
    assert_eq!(code, 422);
    assert_eq!(
        (st["details"]["group"].as_str(), st["details"]["kind"].as_str()),
        (Some("events.k8s.io"), Some("Event"))
    );
    assert!(
        st["message"]
            .as_str()
            .unwrap()
            .starts_with("Event.events.k8s.io \"bad\" is invalid: eventTime: Required value"),
        "{st}"
    );
    let v1 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "web.2"},
                    "eventTime": "2026-11-24T10:00:00.000000Z", "reportingController": "example.com/poker",
                    "reportingInstance": "poker-1", "action": "Poke", "reason": "Poked", "type": "Warning",
                    "note": "poked it", "regarding": {"kind": "Pod", "name": "web", "namespace": "default"}});
    let (code, created) = lab.post("/apis/events.k8s.io/v1/namespaces/default/events", v1).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["note"], "poked it");
    // … and is the same Event in core/v1.
    let (_, c) = lab.get("/api/v1/namespaces/default/events/web.2").await;
    assert_eq!(
        (c["message"].as_str(), c["reportingComponent"].as_str()),
        (Some("poked it"), Some("example.com/poker"))
    );
    assert_eq!(c["involvedObject"]["name"], "web");
    // A merge patch in this version's names.
    let (code, p) = lab
        .patch(
            "/apis/events.k8s.io/v1/namespaces/default/events/web.2",
            "application/merge-patch+json",
            json!({"note": "poked again"}),
        )
        .await;
    assert_eq!(code, 200, "{p}");
    assert_eq!(p["note"], "poked again");
    let (_, c) = lab.get("/api/v1/namespaces/default/events/web.2").await;
    assert_eq!(c["message"], "poked again");
    // Discovery and OpenAPI describe it.
    let (_, res) = lab.get("/apis/events.k8s.io/v1").await;
    assert_eq!(res["resources"][0]["name"], "events");
    let (_, doc) = lab.get("/openapi/v3/apis/events.k8s.io/v1").await;
    let schema = &doc["components"]["schemas"]["io.k8s.api.events.v1.Event"];
    assert_eq!(schema["x-kubernetes-group-version-kind"][0]["group"], "events.k8s.io");
    assert!(schema["properties"]["note"]["description"].is_string());
}

/// `metadata.finalizers` hold a deleted object: it is marked (deletionTimestamp, grace 0),
/// refuses new finalizers, and goes with the update that takes the last one out.
#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_the_last_is_removed() {
    let lab = lab().await;
    let path = "/api/v1/namespaces/default/configmaps/held";
    let cm =
        json!({"metadata": {"name": "held", "finalizers": ["example.com/a", "example.com/b"]}, "data": {"k": "v"}});
    assert_eq!(lab.post("/api/v1/namespaces/default/configmaps", cm).await.0, StatusCode::CREATED);
    let (s, marked) = lab.delete(path).await;
    assert_eq!(s, StatusCode::OK);
    assert!(marked["metadata"]["deletionTimestamp"].is_string(), "{marked}");
    assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 0);
    // A second delete changes nothing.
    let (_, again) = lab.delete(path).await;
    assert_eq!(again["metadata"]["resourceVersion"], marked["metadata"]["resourceVersion"]);
    let merge = "application/merge-patch+json";
    let (s, st) = lab.patch(path, merge, json!({"metadata": {"finalizers": ["example.com/a", "example.com/c"]}})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert!(st["message"].as_str().unwrap().contains("no new finalizers can be added if the object is being deleted, found new finalizers []string{\"example.com/c\"}"), "{st}");
    let (s, _) = lab.patch(path, merge, json!({"metadata": {"finalizers": ["example.com/b"]}})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(lab.get(path).await.0, StatusCode::OK, "one finalizer left");
    let (s, _) = lab.patch(path, merge, json!({"metadata": {"finalizers": null}})).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(lab.get(path).await.0, StatusCode::NOT_FOUND, "the last one out: gone");
}

/// The lab's default StorageClass and provisioner: a claim waits for its first pod, the
/// scheduler picks the pod's node, the volume is made there and bound, then the pod is bound;
/// deleting the claim while the pod runs keeps it (pvc-protection) until the pod goes, then
/// its volume is Released.
#[tokio::test]
async fn claims_wait_for_their_pod_then_get_a_volume_on_its_node() {
    let lab = lab().await;
    let (_, classes) = lab.get("/apis/storage.k8s.io/v1/storageclasses").await;
    assert_eq!(classes["items"][0]["metadata"]["name"], "standard");
    assert_eq!(classes["items"][0]["volumeBindingMode"], "WaitForFirstConsumer");
    let mut node = ready_node("node-1");
    node["metadata"]["labels"] = json!({"kubernetes.io/hostname": "node-1"});
    node["metadata"]["annotations"] = json!({"podpath.dev/local-path-root": "/var/lib/podpath/t/node-1/local-path"});
    lab.post("/api/v1/nodes", node).await;
    let claims = "/api/v1/namespaces/default/persistentvolumeclaims";
    let claim = json!({"metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
    let (s, c) = lab.post(claims, claim).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    assert_eq!(c["spec"]["storageClassName"], "standard", "the default class");
    assert_eq!(c["metadata"]["finalizers"], json!(["kubernetes.io/pvc-protection"]));
    let pod = json!({"metadata": {"name": "user"}, "spec": {"containers": [{"name": "c", "image": "i"}],
        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}});
    assert_eq!(lab.post("/api/v1/namespaces/default/pods", pod).await.0, StatusCode::CREATED);
    let bound = lab.eventually(&format!("{claims}/data"), |_, c| c["status"]["phase"] == "Bound").await;
    assert_eq!(bound["metadata"]["annotations"]["volume.kubernetes.io/selected-node"], "node-1");
    let pv_name = bound["spec"]["volumeName"].as_str().unwrap().to_string();
    assert_eq!(pv_name, format!("pvc-{}", bound["metadata"]["uid"].as_str().unwrap()));
    let pv_path = format!("/api/v1/persistentvolumes/{pv_name}");
    let (_, pv) = lab.get(&pv_path).await;
    assert_eq!(pv["status"]["phase"], "Bound");
    assert_eq!(pv["spec"]["claimRef"]["name"], "data");
    assert!(pv["spec"]["hostPath"]["path"].as_str().unwrap().starts_with("/var/lib/podpath/t/node-1/local-path/pvc-"));
    lab.eventually("/api/v1/namespaces/default/pods/user", |_, p| p["spec"]["nodeName"] == "node-1").await;
    // The Events are recorded just after the writes they tell of.
    lab.eventually("/api/v1/namespaces/default/events", |_, events| {
        let reasons: Vec<&str> =
            events["items"].as_array().into_iter().flatten().filter_map(|e| e["reason"].as_str()).collect();
        ["Provisioning", "ProvisioningSucceeded", "Scheduled"].iter().all(|r| reasons.contains(r))
    })
    .await;
    // Deleting the claim while the pod uses it: kept, Terminating.
    let (s, _) = lab.delete(&format!("{claims}/data")).await;
    assert_eq!(s, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, c) = lab.get(&format!("{claims}/data")).await;
    assert_eq!(s, StatusCode::OK, "in use: kept");
    assert!(c["metadata"]["deletionTimestamp"].is_string());
    // The pod goes (no kubelet here: forcibly), then the claim, then the volume is Released.
    lab.delete("/api/v1/namespaces/default/pods/user?gracePeriodSeconds=0").await;
    lab.eventually(&format!("{claims}/data"), |s, _| s == StatusCode::NOT_FOUND).await;
    lab.eventually(&pv_path, |_, v| v["status"]["phase"] == "Released").await;
    // A pod naming a claim that does not exist is unschedulable, as kube-scheduler says.
    let pod = json!({"metadata": {"name": "lost"}, "spec": {"containers": [{"name": "c", "image": "i"}],
        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "nope"}}]}});
    lab.post("/api/v1/namespaces/default/pods", pod).await;
    let p = lab
        .eventually("/api/v1/namespaces/default/pods/lost", |_, p| {
            p["status"]["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["reason"] == "Unschedulable"))
        })
        .await;
    let message = p["status"]["conditions"][0]["message"].as_str().unwrap();
    assert!(message.starts_with("0/1 nodes are available: persistentvolumeclaim \"nope\" not found."), "{message}");
}

/// `default/kubernetes` deleted comes back, with the first address of the range, as the real
/// server's reconciler makes it again.
#[tokio::test]
async fn the_kubernetes_service_comes_back_when_deleted() {
    let lab = lab().await;
    let path = format!("{SVCS}/kubernetes");
    let (_, before) = lab.get(&path).await;
    assert_eq!(lab.delete(&path).await.0, StatusCode::OK);
    let after =
        lab.eventually(&path, |s, v| s == StatusCode::OK && v["metadata"]["uid"] != before["metadata"]["uid"]).await;
    assert_eq!(after["spec"]["clusterIP"], before["spec"]["clusterIP"]);
    assert_eq!(after["spec"]["ports"][0]["port"], 443);
}

/// `limit`/`continue` as the real server pages: each page in key order with a token for the
/// next and the count left; the pages after the first show the list as it was at the first
/// (a create and a delete in between change nothing of them); a bad token is 400; a token
/// older than the event log 410 Expired.
#[tokio::test]
async fn lists_page_with_limit_and_continue_over_a_consistent_snapshot() {
    let lab = lab_with(|c| c.event_log_capacity = 64).await;
    lab.post("/api/v1/namespaces", json!({"metadata": {"name": "paging"}})).await;
    let cms = "/api/v1/namespaces/paging/configmaps";
    for i in 0..10 {
        let (s, _) =
            lab.post(cms, json!({"metadata": {"name": format!("cm-{i}")}, "data": {"i": i.to_string()}})).await;
        assert_eq!(s, StatusCode::CREATED);
    }
    let (s, first) = lab.get(&format!("{cms}?limit=4")).await;
    assert_eq!(s, StatusCode::OK, "{first}");
    let names = |l: &Value| -> Vec<String> {
        l["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(names(&first), ["cm-0", "cm-1", "cm-2", "cm-3"]);
    assert_eq!(first["metadata"]["remainingItemCount"], 6);
    let token = first["metadata"]["continue"].as_str().unwrap().to_string();
    // Changes after the first page.
    lab.post(cms, json!({"metadata": {"name": "cm-5a"}})).await;
    assert_eq!(lab.delete(&format!("{cms}/cm-7")).await.0, StatusCode::OK);
    let (_, second) = lab.get(&format!("{cms}?limit=4&continue={token}")).await;
    assert_eq!(names(&second), ["cm-4", "cm-5", "cm-6", "cm-7"], "as of the first page");
    assert_eq!(second["metadata"]["resourceVersion"], first["metadata"]["resourceVersion"]);
    let token = second["metadata"]["continue"].as_str().unwrap().to_string();
    let (_, last) = lab.get(&format!("{cms}?limit=4&continue={token}")).await;
    assert_eq!(names(&last), ["cm-8", "cm-9"]);
    assert!(last["metadata"].get("continue").is_none() && last["metadata"].get("remainingItemCount").is_none());
    // A new list sees the changes.
    let (_, now) = lab.get(&format!("{cms}?limit=100")).await;
    assert!(names(&now).contains(&"cm-5a".to_string()) && !names(&now).contains(&"cm-7".to_string()));
    // Tables page too (kubectl get --chunk-size).
    let (s, table) =
        lab.call("GET", &format!("{cms}?limit=2"), None, "", "application/json;as=Table;v=v1;g=meta.k8s.io").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(table["rows"].as_array().unwrap().len(), 2);
    assert!(table["metadata"]["continue"].is_string(), "{table}");
    // A token that is not one.
    let (s, st) = lab.get(&format!("{cms}?limit=2&continue=bm9wZQ")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{st}");
    assert!(st["message"].as_str().unwrap().starts_with("invalid continue token: continue key is not valid"), "{st}");
    // 100 writes later the first token's version has left the event log: 410 Expired.
    for i in 0..100 {
        lab.post(cms, json!({"metadata": {"name": format!("more-{i}")}})).await;
    }
    let (s, st) = lab.get(&format!("{cms}?limit=4&continue={}", first["metadata"]["continue"].as_str().unwrap())).await;
    assert_eq!(s, StatusCode::GONE, "{st}");
    assert_eq!(st["reason"], "Expired");
    assert!(st["message"].as_str().unwrap().starts_with("The provided continue parameter is too old"), "{st}");
}

fn dir_bytes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|d| {
            d.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// 600 updates of a 500 KB object (event log of 100) leave the data directory under 300 MB —
/// the live data is about 50 MB, the event log's copies — where sled's default segments left
/// 1.6 GB of blob files that never went away.
#[tokio::test]
async fn large_updates_keep_the_data_directory_bounded() {
    let lab = lab_with(|c| c.event_log_capacity = 100).await;
    let big = "x".repeat(500 * 1024);
    let path = "/api/v1/namespaces/default/configmaps";
    assert_eq!(lab.post(path, json!({"metadata": {"name": "big"}, "data": {"k": big}})).await.0, StatusCode::CREATED);
    let merge = "application/merge-patch+json";
    for i in 0..600 {
        let (s, _) = lab.patch(&format!("{path}/big"), merge, json!({"data": {"k": format!("{big}{i}")}})).await;
        assert_eq!(s, StatusCode::OK);
    }
    let size = dir_bytes(lab._dir.path());
    assert!(size < 300_000_000, "{size} bytes after 600 updates of 500 KB");
}

fn dual_stack(c: &mut Config) {
    c.ranges.service_cidrs = vec!["10.96.0.0/12".parse().unwrap(), "fd00:10:96::/112".parse().unwrap()];
    c.ranges.lb_pools = vec!["198.51.100.0/24".parse().unwrap(), "2001:db8:100::/120".parse().unwrap()];
    c.ranges.cluster_cidrs = vec!["10.244.0.0/16".parse().unwrap(), "fd00:10:244::/56".parse().unwrap()];
}

fn causes(st: &Value) -> Vec<String> {
    st["details"]["causes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| format!("{}: {}", c["field"].as_str().unwrap_or(""), c["message"].as_str().unwrap_or("")))
        .collect()
}

#[tokio::test]
async fn dual_stack_services_nodes_and_slices_as_a_dual_stack_cluster_keeps_them() {
    let lab = lab_with(dual_stack).await;
    // Nodes get a pod CIDR of each family, node-N subnet N.
    let (s, n1) = lab.post("/api/v1/nodes", ready_node("node-1")).await;
    assert_eq!(s, StatusCode::CREATED, "{n1}");
    assert_eq!(n1["spec"]["podCIDRs"], json!(["10.244.1.0/24", "fd00:10:244:1::/64"]));
    // A single-stack default, a dual-stack LoadBalancer with an address of each family.
    let (s, single) = lab.post(SVCS, json!({"metadata": {"name": "one"}, "spec": {"ports": [{"port": 80}]}})).await;
    assert_eq!(s, StatusCode::CREATED, "{single}");
    assert_eq!(single["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(single["spec"]["ipFamilyPolicy"], "SingleStack");
    let lb = json!({"metadata": {"name": "web"}, "spec": {"type": "LoadBalancer", "ipFamilyPolicy": "RequireDualStack",
                    "ipFamilies": ["IPv6", "IPv4"], "selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}});
    let (s, web) = lab.post(SVCS, lb).await;
    assert_eq!(s, StatusCode::CREATED, "{web}");
    let ips: Vec<String> =
        web["spec"]["clusterIPs"].as_array().unwrap().iter().map(|i| i.as_str().unwrap().to_string()).collect();
    assert_eq!(ips.len(), 2);
    assert!(ips[0].starts_with("fd00:10:96::") && ips[1].starts_with("10."), "{ips:?}");
    assert_eq!(web["spec"]["clusterIP"], ips[0]);
    let ingress: Vec<&str> = web["status"]["loadBalancer"]["ingress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["ip"].as_str().unwrap())
        .collect();
    assert_eq!(ingress, ["2001:db8:100::1", "198.51.100.1"]);
    // The family order may not change; a secondary address is released only by SingleStack.
    let url = format!("{SVCS}/web");
    let (s, st) =
        lab.patch(&url, "application/merge-patch+json", json!({"spec": {"ipFamilies": ["IPv4", "IPv6"]}})).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert_eq!(
        causes(&st),
        [
            format!(
                "spec.clusterIPs[0]: Invalid value: \"{}\": expected an IPv4 value as indicated by `ipFamilies[0]`",
                ips[0]
            ),
            format!(
                "spec.clusterIPs[1]: Invalid value: \"{}\": expected an IPv6 value as indicated by `ipFamilies[1]`",
                ips[1]
            ),
        ]
    );
    let (s, st) = lab
        .patch(
            &url,
            "application/merge-patch+json",
            json!({"spec": {"ipFamilyPolicy": "PreferDualStack", "ipFamilies": ["IPv6"]}}),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{st}");
    assert_eq!(
        causes(&st),
        ["spec.ipFamilyPolicy: Invalid value: \"PreferDualStack\": must be 'SingleStack' to release the secondary IP family"]
    );
    // Endpoints: a slice per family with the pods' addresses of that family.
    let pod = json!({"metadata": {"name": "web-0", "labels": {"app": "web"}},
                     "spec": {"containers": [{"name": "c", "image": "podpath/echo"}]}});
    assert_eq!(lab.post("/api/v1/namespaces/default/pods", pod).await.0, StatusCode::CREATED);
    let status = json!({"status": {"phase": "Running", "podIP": "10.244.1.5",
                        "podIPs": [{"ip": "10.244.1.5"}, {"ip": "fd00:10:244:1::5"}],
                        "conditions": [{"type": "Ready", "status": "True"}]}});
    lab.patch("/api/v1/namespaces/default/pods/web-0/status", "application/merge-patch+json", status).await;
    let slices = lab
        .eventually(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb",
            |_, v| {
                v["items"].as_array().is_some_and(|i| {
                    i.len() == 2 && i.iter().all(|s| s["endpoints"].as_array().is_some_and(|e| e.len() == 1))
                })
            },
        )
        .await;
    let mut by_type: Vec<(String, String)> = slices["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (s["addressType"].as_str().unwrap().into(), s["endpoints"][0]["addresses"][0].as_str().unwrap().into())
        })
        .collect();
    by_type.sort();
    assert_eq!(by_type, [("IPv4".into(), "10.244.1.5".into()), ("IPv6".into(), "fd00:10:244:1::5".into())]);
    // v1 Endpoints hold the primary family (IPv6 here).
    let ep = lab
        .eventually("/api/v1/namespaces/default/endpoints/web", |s, v| s == StatusCode::OK && v["subsets"].is_array())
        .await;
    assert_eq!(ep["subsets"][0]["addresses"][0]["ip"], "fd00:10:244:1::5");
    // Downgrade: SingleStack releases the IPv4 address, which another Service can then have.
    let (s, down) =
        lab.patch(&url, "application/merge-patch+json", json!({"spec": {"ipFamilyPolicy": "SingleStack"}})).await;
    assert_eq!(s, StatusCode::OK, "{down}");
    assert_eq!(down["spec"]["clusterIPs"], json!([ips[0]]));
    assert_eq!(down["spec"]["ipFamilies"], json!(["IPv6"]));
    let reuse = json!({"metadata": {"name": "reuse"}, "spec": {"clusterIP": ips[1], "ports": [{"port": 80}]}});
    let (s, r) = lab.post(SVCS, reuse).await;
    assert_eq!(s, StatusCode::CREATED, "{r}");
    // Upgrade again: a new secondary address is allocated.
    let (s, up) =
        lab.patch(&url, "application/merge-patch+json", json!({"spec": {"ipFamilyPolicy": "PreferDualStack"}})).await;
    assert_eq!(s, StatusCode::OK, "{up}");
    assert_eq!(up["spec"]["ipFamilies"], json!(["IPv6", "IPv4"]));
    assert_eq!(up["spec"]["clusterIPs"].as_array().unwrap().len(), 2);
    assert_ne!(up["spec"]["clusterIPs"][1], json!(ips[1]));
    // An IPv6 address outside the range.
    let outside = json!({"metadata": {"name": "out"}, "spec": {"clusterIP": "fd00:99::5", "ports": [{"port": 80}]}});
    let (s, st) = lab.post(SVCS, outside).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        causes(&st),
        ["spec.clusterIPs: Invalid value: []string{\"fd00:99::5\"}: failed to allocate IP fd00:99::5: the provided IP (fd00:99::5) is not in the valid range. The range of valid IPs is fd00:10:96::/112"]
    );
}

#[tokio::test]
async fn a_single_stack_cluster_refuses_dual_stack_as_kube_apiserver_does() {
    let lab = lab().await;
    let svc =
        json!({"metadata": {"name": "web"}, "spec": {"ipFamilyPolicy": "RequireDualStack", "ports": [{"port": 80}]}});
    let (s, st) = lab.post(SVCS, svc).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(st["message"], "Service \"web\" is invalid: spec.ipFamilyPolicy: Invalid value: \"RequireDualStack\": this cluster is not configured for dual-stack services");
    let svc = json!({"metadata": {"name": "web"}, "spec": {"clusterIP": "fd00:10:96::5", "ports": [{"port": 80}]}});
    let (s, st) = lab.post(SVCS, svc).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        causes(&st),
        ["spec.clusterIPs[0]: Invalid value: []string{\"fd00:10:96::5\"}: IPv6 is not configured on this cluster"]
    );
    // PreferDualStack falls back to one family.
    let svc =
        json!({"metadata": {"name": "web"}, "spec": {"ipFamilyPolicy": "PreferDualStack", "ports": [{"port": 80}]}});
    let (s, v) = lab.post(SVCS, svc).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    assert_eq!(v["spec"]["ipFamilies"], json!(["IPv4"]));
}

/// Custom resources over REST: served once established, in both versions (only `apiVersion`
/// differs), protobuf refused (415 for a body, 406 for an Accept of nothing else), strategic
/// merge refused, discovery and OpenAPI v3 with the CRD's kind (no strategic merge offered).
#[tokio::test]
async fn custom_resources_are_served_as_the_apiextensions_server_serves_them() {
    let lab = lab().await;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "things.test.podpath.dev"},
        "spec": {"group": "test.podpath.dev", "scope": "Namespaced", "names": {"plural": "things", "kind": "Thing"},
            "versions": [
                {"name": "v1", "served": true, "storage": true,
                 "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object",
                     "properties": {"size": {"type": "integer", "default": 1}}}}}}},
                {"name": "v1beta1", "served": true, "storage": false,
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
    let (s, _) = lab.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd).await;
    assert_eq!(s, StatusCode::CREATED);
    let path = "/apis/test.podpath.dev/v1/namespaces/default/things";
    lab.eventually(path, |s, _| s == StatusCode::OK).await;
    let (s, v) = lab
        .post(
            path,
            json!({"apiVersion": "test.podpath.dev/v1", "kind": "Thing", "metadata": {"name": "a"}, "spec": {}}),
        )
        .await;
    assert_eq!((s, v["spec"]["size"].clone()), (StatusCode::CREATED, json!(1)));
    let (s, v) = lab.get("/apis/test.podpath.dev/v1beta1/namespaces/default/things/a").await;
    assert_eq!((s, v["apiVersion"].as_str()), (StatusCode::OK, Some("test.podpath.dev/v1beta1")));
    let (s, v) = lab.get("/apis/test.podpath.dev/v1beta1/namespaces/default/things").await;
    assert_eq!(
        (s, v["kind"].as_str(), v["items"][0]["apiVersion"].as_str()),
        (StatusCode::OK, Some("ThingList"), Some("test.podpath.dev/v1beta1"))
    );
    // A body in another version than the URL's is refused.
    let (s, _) = lab
        .post(path, json!({"apiVersion": "test.podpath.dev/v1beta1", "kind": "Thing", "metadata": {"name": "b"}}))
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _) =
        lab.call("POST", path, Some(json!({})), "application/vnd.kubernetes.protobuf", "application/json").await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (s, _) = lab.call("GET", path, None, "", "application/vnd.kubernetes.protobuf").await;
    assert_eq!(s, StatusCode::NOT_ACCEPTABLE);
    let (s, _) =
        lab.patch(&format!("{path}/a"), "application/strategic-merge-patch+json", json!({"spec": {"size": 2}})).await;
    assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let (s, v) = lab.patch(&format!("{path}/a"), "application/merge-patch+json", json!({"spec": {"size": 2}})).await;
    assert_eq!((s, v["spec"]["size"].clone()), (StatusCode::OK, json!(2)));
    // Discovery: v1 preferred; the resource listed in both versions.
    let (_, groups) = lab.get("/apis").await;
    let g = groups["groups"].as_array().unwrap().iter().find(|g| g["name"] == "test.podpath.dev").unwrap().clone();
    assert_eq!(g["preferredVersion"]["version"], "v1");
    let (_, list) = lab.get("/apis/test.podpath.dev/v1beta1").await;
    assert_eq!(list["resources"][0]["name"], "things");
    // OpenAPI v3: the kind's schema, and a PATCH without strategic merge.
    let (_, doc) = lab.get("/openapi/v3/apis/test.podpath.dev/v1").await;
    assert_eq!(
        doc["components"]["schemas"]["dev.podpath.test.v1.Thing"]["x-kubernetes-group-version-kind"][0]["kind"],
        "Thing"
    );
    let op = &doc["paths"]["/apis/test.podpath.dev/v1/namespaces/{namespace}/things/{name}"]["patch"];
    assert!(op["requestBody"]["content"].get("application/merge-patch+json").is_some());
    assert!(op["requestBody"]["content"].get("application/strategic-merge-patch+json").is_none());
    // After a restart the resource is served at once, its objects kept.
    let mut lab = lab;
    let server = restart(&mut lab).await;
    let (s, v) = lab.get(&format!("{path}/a")).await;
    assert_eq!((s, v["spec"]["size"].clone()), (StatusCode::OK, json!(2)));
    lab.server = Some(server);
}

/// Server-side apply of custom objects merges lists and maps as the CRD's schema says: a
/// `list-type: map` by its keys (two managers' items side by side, a conflict named by key), a
/// `set` by value, a `map-type: atomic` map replaced whole.
#[tokio::test]
async fn server_side_apply_of_custom_objects_follows_the_schemas_list_types() {
    let lab = lab().await;
    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "carts.test.podpath.dev"},
        "spec": {"group": "test.podpath.dev", "scope": "Namespaced", "names": {"plural": "carts", "kind": "Cart"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "wheels": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                        "items": {"type": "object", "required": ["name"],
                            "properties": {"name": {"type": "string"}, "size": {"type": "integer"}}}},
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                    "notes": {"type": "array", "items": {"type": "string"}},
                    "selector": {"type": "object", "x-kubernetes-map-type": "atomic",
                        "additionalProperties": {"type": "string"}}}}}}}}]}});
    let (s, _) = lab.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd).await;
    assert_eq!(s, StatusCode::CREATED);
    let path = "/apis/test.podpath.dev/v1/namespaces/default/carts";
    lab.eventually(path, |s, _| s == StatusCode::OK).await;
    let lab = &lab;
    let apply = |manager: &'static str, spec: Value| {
        let body =
            json!({"apiVersion": "test.podpath.dev/v1", "kind": "Cart", "metadata": {"name": "c"}, "spec": spec});
        let url = format!("{path}/c?fieldManager={manager}");
        async move { lab.patch(&url, "application/apply-patch+yaml", body).await }
    };
    let (s, v) = apply(
        "alice",
        json!({"wheels": [{"name": "front", "size": 1}], "tags": ["x"], "notes": ["a"], "selector": {"app": "a"}}),
    )
    .await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    let (s, v) = apply("bob", json!({"wheels": [{"name": "back", "size": 2}], "tags": ["y"]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["wheels"], json!([{"name": "front", "size": 1}, {"name": "back", "size": 2}]));
    assert_eq!(v["spec"]["tags"], json!(["x", "y"]));
    let bob = v["metadata"]["managedFields"].as_array().unwrap().iter().find(|e| e["manager"] == "bob").unwrap();
    assert_eq!(bob["fieldsV1"]["f:spec"]["f:wheels"]["k:{\"name\":\"back\"}"]["f:size"], json!({}));
    assert_eq!(bob["fieldsV1"]["f:spec"]["f:tags"]["v:\"y\""], json!({}));
    // Another manager's item field, changed: a conflict naming the item by its key.
    let (s, v) = apply("bob", json!({"wheels": [{"name": "back", "size": 2}, {"name": "front", "size": 5}]})).await;
    assert_eq!(s, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["message"], "Apply failed with 1 conflict: conflict with \"alice\" using test.podpath.dev/v1: .spec.wheels[name=\"front\"].size");
    // An atomic list and an atomic map are replaced whole by their applier; bob's item stays.
    let (s, v) = apply(
        "alice",
        json!({"wheels": [{"name": "front", "size": 1}], "tags": ["x"], "notes": ["b"], "selector": {"tier": "t"}}),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["notes"], json!(["b"]));
    assert_eq!(v["spec"]["selector"], json!({"tier": "t"}));
    assert_eq!(v["spec"]["wheels"], json!([{"name": "front", "size": 1}, {"name": "back", "size": 2}]));
    // Alice gives up her item: it goes; bob's stays.
    let (s, v) = apply("alice", json!({"tags": ["x"]})).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spec"]["wheels"], json!([{"name": "back", "size": 2}]));
}

/// A write's response is the stored object's JSON as it is (not serialised again): byte for
/// byte what a GET of it answers, for a create, an update and a patch.
#[tokio::test]
async fn a_writes_response_is_the_object_a_get_answers() {
    let lab = lab().await;
    let raw = |method: &'static str, path: String, body: Option<(Value, &'static str)>| {
        let app = lab.app.clone();
        async move {
            let mut b = Request::builder().method(method).uri(path).header("accept", "application/json");
            if let Some((_, ct)) = &body {
                b = b.header("content-type", *ct);
            }
            let req = b.body(body.map(|(v, _)| Body::from(v.to_string())).unwrap_or_else(Body::empty)).unwrap();
            let resp = app.oneshot(req).await.unwrap();
            (resp.status(), resp.into_body().collect().await.unwrap().to_bytes())
        }
    };
    let one = format!("{SVCS}/contour");
    let (s, created) = raw("POST", SVCS.to_string(), Some((contour(), "application/json"))).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(created, raw("GET", one.clone(), None).await.1);
    assert!(created.ends_with(b"}\n"));
    let mut svc: Value = serde_json::from_slice(&created).unwrap();
    svc["metadata"]["labels"]["tier"] = json!("edge");
    let (s, updated) = raw("PUT", one.clone(), Some((svc, "application/json"))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(updated, raw("GET", one.clone(), None).await.1);
    let patch = json!({"metadata": {"annotations": {"a": "b"}}});
    let (s, patched) = raw("PATCH", one.clone(), Some((patch, "application/merge-patch+json"))).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(patched, raw("GET", one.clone(), None).await.1);
    let v: Value = serde_json::from_slice(&patched).unwrap();
    assert_eq!((v["kind"].as_str(), v["metadata"]["annotations"]["a"].as_str()), (Some("Service"), Some("b")));
}
