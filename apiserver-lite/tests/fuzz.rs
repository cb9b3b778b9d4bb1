//! A seeded fuzz run of the REST API, as a test: valid bodies of every write path (JSON, YAML,
//! patches of each type, protobuf) mutated byte-wise and structurally, with random query
//! parameters, methods and paths, thrown at the router with the controllers running. Asserts:
//! no panic (a panicking handler fails the request with no response), no 5xx (none is
//! documented for client input), every answer within the request timeout, every error a
//! `Status`, and nothing stored that the server refused. The seed and case count can be changed
//! with PODPATH_FUZZ_SEED / PODPATH_FUZZ_CASES; the run prints both.

use std::collections::BTreeSet;
use std::time::Duration;

use apiserver_lite::rest::{router, RestState};
use apiserver_lite::{start, Config};
use axum::body::Body;
use http::Request;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

mod common;

const KINDS: [(&str, &str); 6] = [
    ("/api/v1/namespaces/default/services", "Service"),
    ("/api/v1/namespaces/default/pods", "Pod"),
    ("/api/v1/namespaces/default/configmaps", "ConfigMap"),
    ("/apis/apps/v1/namespaces/default/deployments", "Deployment"),
    ("/apis/networking.k8s.io/v1/namespaces/default/ingresses", "Ingress"),
    ("/api/v1/nodes", "Node"),
];

fn seed_object(kind: &str, name: &str) -> Value {
    match kind {
        "Service" => json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": {"app": "f"}},
            "spec": {"type": "NodePort", "selector": {"app": "f"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
        "Pod" => json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "podpath/echo", "ports": [{"containerPort": 8080}]}],
                     "terminationGracePeriodSeconds": 5}}),
        "ConfigMap" => json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "1"}}),
        "Deployment" => json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "f"}},
                     "template": {"metadata": {"labels": {"app": "f"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}}),
        "Ingress" => json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name},
            "spec": {"rules": [{"host": "a.example", "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "web", "port": {"number": 80}}}}]}}]}}),
        _ => {
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"podCIDR": "10.244.9.0/24"}})
        }
    }
}

/// Values that break parsers and validators.
const NASTY: [&str; 16] = [
    "",
    "-1",
    "0",
    "9223372036854775807",
    "18446744073709551616",
    "1e999",
    "true",
    "null",
    "[]",
    "{}",
    "\u{0}",
    "%",
    "All",
    "all",
    "a=b,c!=d",
    "\u{202e}x",
];

fn nasty_value(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(0..8) {
        0 => json!(null),
        1 => json!(rng.i64(..)),
        2 => json!(i64::MAX),
        3 => json!(-1),
        4 => json!(NASTY[rng.usize(..NASTY.len())]),
        5 => json!([1, "x", null, {}]),
        6 => json!({"$patch": "delete", "x": {"y": [1]}}),
        _ => json!("x".repeat(rng.usize(0..300))),
    }
}

/// A structural mutation: a random node of the object replaced, removed or retyped.
fn mutate_value(v: &mut Value, rng: &mut fastrand::Rng, depth: usize) {
    match v {
        Value::Object(m) if !m.is_empty() && (depth < 6 && rng.bool()) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = &keys[rng.usize(..keys.len())];
            match rng.u8(0..6) {
                0 => {
                    m.remove(k);
                }
                1 => {
                    m.insert(format!("{k}{}", rng.u8(..)), nasty_value(rng));
                }
                _ => mutate_value(m.get_mut(k).expect("key"), rng, depth + 1),
            }
        }
        Value::Array(a) if !a.is_empty() && rng.bool() => {
            let i = rng.usize(..a.len());
            match rng.u8(0..4) {
                0 => {
                    let dup = a[i].clone();
                    a.push(dup);
                }
                1 => {
                    a.remove(i);
                }
                _ => mutate_value(&mut a[i], rng, depth + 1),
            }
        }
        _ => *v = nasty_value(rng),
    }
}

/// A byte-level mutation of an encoded body.
fn mutate_bytes(mut b: Vec<u8>, rng: &mut fastrand::Rng) -> Vec<u8> {
    for _ in 0..rng.usize(1..4) {
        if b.is_empty() {
            break;
        }
        let i = rng.usize(..b.len());
        match rng.u8(0..5) {
            0 => b[i] = rng.u8(..),
            1 => b.truncate(i),
            2 => b.insert(i, b"{}[]\":,\\\n -#&*!|>'"[rng.usize(..18)]),
            3 => {
                let chunk = b[i..].to_vec();
                b.extend_from_slice(&chunk[..chunk.len().min(64)]);
            }
            _ => {
                b.remove(i);
            }
        }
    }
    b
}

/// A protobuf body of `kind` around `raw`.
fn protobuf_body(kind: &str, raw: &[u8]) -> Vec<u8> {
    let api_version = match kind {
        "Deployment" => "apps/v1",
        "Ingress" => "networking.k8s.io/v1",
        _ => "v1",
    };
    common::protobuf_envelope(api_version, kind, raw)
}

const QUERY_KEYS: [&str; 12] = [
    "dryRun",
    "fieldValidation",
    "fieldManager",
    "force",
    "watch",
    "timeoutSeconds",
    "labelSelector",
    "fieldSelector",
    "resourceVersion",
    "gracePeriodSeconds",
    "propagationPolicy",
    "limit",
];

fn query(rng: &mut fastrand::Rng) -> String {
    let mut q = Vec::new();
    for _ in 0..rng.usize(0..3) {
        let k = QUERY_KEYS[rng.usize(..QUERY_KEYS.len())];
        // A watch may run until its timeout: keep fuzzed watches short.
        if k == "watch" || k == "timeoutSeconds" {
            continue;
        }
        let v = NASTY[rng.usize(..NASTY.len())];
        q.push(format!("{k}={}", v.bytes().map(|b| format!("%{b:02X}")).collect::<String>()));
    }
    if q.is_empty() {
        String::new()
    } else {
        format!("?{}", q.join("&"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fuzzed_requests_never_panic_hang_500_or_store_refused_objects() {
    let seed: u64 = std::env::var("PODPATH_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x9e37_79b9);
    let cases: usize = std::env::var("PODPATH_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(5000);
    let mut rng = fastrand::Rng::with_seed(seed);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = Config::new(dir.path().to_path_buf());
    cfg.request_timeout = Duration::from_secs(5);
    let server = start(&cfg).await.unwrap();
    let app = router(RestState {
        registry: server.registry.clone(),
        token: None,
        max_body_bytes: 64 << 10,
        request_timeout: cfg.request_timeout,
        advertise: "127.0.0.1:6443".into(),
        kubelet_netns: None,
        tokens: Some(server.tokens.clone()),
    });
    let send = |method: &str, path: &str, ct: &str, body: Vec<u8>| {
        let app = app.clone();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", ct)
            .header("accept", "application/json")
            .body(Body::from(body))
            .unwrap();
        async move {
            let resp = tokio::time::timeout(Duration::from_secs(10), app.oneshot(req))
                .await
                .unwrap_or_else(|_| panic!("no answer within the request timeout"))
                .expect("infallible");
            let status = resp.status();
            let bytes = resp.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
            (status, bytes)
        }
    };
    // Names the server acknowledged writing (anything else found at the end was refused).
    let mut written: BTreeSet<(String, String)> = BTreeSet::new();
    let mut by_class = [0usize; 6];
    for i in 0..cases {
        let (base, kind) = KINDS[rng.usize(..KINDS.len())];
        let name = format!("f{}", rng.usize(0..40));
        let mut obj = seed_object(kind, &name);
        // One request in five goes unmutated, so objects exist for the patches and deletes.
        let clean = rng.u8(0..5) == 0;
        let structural = !clean && rng.u8(0..3) != 0;
        if structural {
            for _ in 0..rng.usize(1..4) {
                mutate_value(&mut obj, &mut rng, 0);
            }
        }
        let (method, path, ct) = match rng.u8(0..10) {
            0..=3 => ("POST", base.to_string(), "application/json"),
            4 => ("PUT", format!("{base}/{name}"), "application/json"),
            5 => ("PATCH", format!("{base}/{name}"), "application/merge-patch+json"),
            6 => ("PATCH", format!("{base}/{name}"), "application/strategic-merge-patch+json"),
            7 => ("PATCH", format!("{base}/{name}?fieldManager=fuzz"), "application/apply-patch+yaml"),
            8 => ("PATCH", format!("{base}/{name}"), "application/json-patch+json"),
            _ => ("DELETE", format!("{base}/{name}"), "application/json"),
        };
        let body_value = if ct == "application/json-patch+json" {
            let op = ["add", "replace", "remove", "move", "test"][rng.usize(..5)];
            let at =
                ["/metadata/name", "/spec", "/spec/ports/0", "/metadata/labels/x", "/status", "/-"][rng.usize(..6)];
            json!([{"op": op, "path": at, "from": "/spec", "value": nasty_value(&mut rng)}])
        } else {
            obj
        };
        let mut body = if ct.contains("yaml") && rng.bool() {
            serde_yaml::to_string(&body_value).unwrap().into_bytes()
        } else {
            serde_json::to_vec(&body_value).unwrap()
        };
        if !clean && (!structural || rng.u8(0..4) == 0) {
            body = mutate_bytes(body, &mut rng);
        }
        // One write in ten speaks protobuf, as kubectl's typed clients do: a real envelope
        // (TypeMeta of the kind) around a garbled message.
        let mut ct = ct;
        if method != "DELETE" && !clean && rng.u8(0..10) == 0 {
            ct = "application/vnd.kubernetes.protobuf";
            body = protobuf_body(kind, &mutate_bytes((0..rng.usize(0..200)).map(|_| rng.u8(..)).collect(), &mut rng));
        }
        let sep = if path.contains('?') { "&" } else { "?" };
        let q = query(&mut rng);
        let full = if q.is_empty() { path.clone() } else { format!("{path}{sep}{}", &q[1..]) };
        let (status, bytes) = send(method, &full, ct, body.clone()).await;
        by_class[(status.as_u16() / 100) as usize] += 1;
        assert!(
            !status.is_server_error(),
            "case {i} (seed {seed}): {method} {full} → {status}: {}\nbody: {}",
            String::from_utf8_lossy(&bytes),
            String::from_utf8_lossy(&body)
        );
        let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            if let Some(n) = v.pointer("/metadata/name").and_then(Value::as_str) {
                written.insert((kind.to_string(), n.to_string()));
            }
        } else {
            assert_eq!(v["kind"], "Status", "case {i}: every error is a Status: {v}");
        }
    }
    // Nothing refused was stored: every object is one the server said it wrote, or one it
    // made itself (bootstrap, controllers' ReplicaSets and pods are not among these kinds' names).
    for (base, kind) in KINDS {
        let (status, bytes) = send("GET", base, "", vec![]).await;
        assert!(status.is_success());
        let list: Value = serde_json::from_slice(&bytes).unwrap();
        for item in list["items"].as_array().unwrap() {
            let n = item["metadata"]["name"].as_str().unwrap_or("").to_string();
            let generated = item["metadata"].get("ownerReferences").is_some() || !n.starts_with('f');
            assert!(
                generated || written.contains(&(kind.to_string(), n.clone())),
                "{kind} {n} was stored but never acknowledged"
            );
        }
    }
    println!(
        "fuzz: seed {seed}, {cases} requests: {} 2xx, {} 4xx, {} 5xx; {} objects acknowledged",
        by_class[2],
        by_class[4],
        by_class[5],
        written.len()
    );
    server.stop().await.unwrap();
}
