//! The client crate against an in-process apiserver-lite on 127.0.0.1:0: connecting to a late
//! server, and reflectors following pods, Ingresses and Secrets over gRPC watches.

use std::time::Duration;

use api::k8s_openapi::api::core::v1 as core;
use podpath_client::reflector::{self, Filter, Store};
use podpath_client::ApiClient;
use tokio::net::TcpListener;

struct Server {
    grpc: String,
    registry: std::sync::Arc<apiserver_lite::registry::Registry>,
    _dir: tempfile::TempDir,
}

async fn server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let (grpc, registry) = apiserver_lite::serve_grpc_on_loopback(dir.path().to_path_buf()).await.unwrap();
    Server { grpc, registry, _dir: dir }
}

#[tokio::test]
async fn the_reflector_follows_pods_of_its_node() {
    let s = server().await;
    let client = ApiClient::connect(&s.grpc, None, None).await.unwrap();
    let store = Store::<core::Pod>::new();
    let filter = Filter { field_selector: "spec.nodeName=node-1".into(), ..Default::default() };
    tokio::spawn(reflector::run(client.clone(), filter, store.clone()));
    store.wait_synced().await;
    assert!(store.list().is_empty());
    let mut changes = store.changes();
    let opts = apiserver_lite::registry::WriteOptions::default();
    // The nodes exist: the pod garbage collector removes pods bound to a node that does not.
    for node in ["node-1", "node-2"] {
        s.registry.create(api::Kind::Node, None, serde_json::json!({"metadata": {"name": node}}), &opts).await.unwrap();
    }
    for (name, node) in [("mine", "node-1"), ("theirs", "node-2")] {
        let pod = serde_json::json!({"metadata": {"name": name}, "spec": {"nodeName": node, "containers": [{"name": "c", "image": "podpath/echo"}]}});
        s.registry.create(api::Kind::Pod, Some("default"), pod, &opts).await.unwrap();
    }
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.get("default/mine").is_none() {
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the pod arrives");
    assert!(store.get("default/theirs").is_none(), "other nodes' pods are filtered out");
    s.registry
        .delete(
            api::Kind::Pod,
            Some("default"),
            "mine",
            &apiserver_lite::registry::DeleteOptions { grace_period_seconds: Some(0), ..Default::default() },
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.get("default/mine").is_some() {
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the deletion arrives");
}

#[tokio::test]
async fn connecting_waits_for_a_late_api_server_and_gives_up_after_its_patience() {
    // A port nothing listens on yet: reserved, then released.
    let addr = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let err = ApiClient::connect_patiently(&addr.to_string(), None, None, Some(Duration::from_millis(600))).await.err();
    assert!(err.is_some_and(|e| e.to_string().contains(&format!("cannot connect to the API server at {addr}"))));

    let dir = tempfile::tempdir().unwrap();
    let late = async {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let srv = apiserver_lite::start(&apiserver_lite::Config::new(dir.path().to_path_buf())).await.unwrap();
        let grpc = TcpListener::bind(addr).await.unwrap();
        tokio::spawn(apiserver_lite::grpc::serve_grpc(
            srv.registry.clone(),
            None,
            3 << 20,
            None,
            grpc,
            std::future::pending(),
        ));
    };
    let target = addr.to_string();
    let (client, ()) = tokio::join!(ApiClient::connect_patiently(&target, None, None, None), late);
    let mut nodes = client.unwrap().nodes;
    let listed = nodes.list(api::proto::ListRequest::default()).await;
    assert!(listed.is_ok(), "a working client once the server is up");
}

#[tokio::test]
async fn ingresses_and_tls_secrets_arrive_whole_over_grpc() {
    use api::k8s_openapi::api::networking::v1::Ingress;
    let s = server().await;
    let client = ApiClient::connect(&s.grpc, None, None).await.unwrap();
    let ingresses = Store::<Ingress>::new();
    let secrets = Store::<core::Secret>::new();
    tokio::spawn(reflector::run(client.clone(), Filter::default(), ingresses.clone()));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), secrets.clone()));
    let opts = apiserver_lite::registry::WriteOptions::default();
    let ing = serde_json::json!({"metadata": {"name": "shop"}, "spec": {
        "tls": [{"hosts": ["shop.example"], "secretName": "shop-tls"}],
        "rules": [{"host": "shop.example", "http": {"paths": [
            {"path": "/cart", "pathType": "Prefix", "backend": {"service": {"name": "cart", "port": {"number": 80}}}}]}}]}});
    s.registry.create(api::Kind::Ingress, Some("default"), ing, &opts).await.unwrap();
    let secret = serde_json::json!({"metadata": {"name": "shop-tls"}, "type": "kubernetes.io/tls",
        "data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5"}});
    s.registry.create(api::Kind::Secret, Some("default"), secret, &opts).await.unwrap();
    let mut changes = ingresses.changes();
    tokio::time::timeout(Duration::from_secs(5), async {
        while ingresses.get("default/shop").is_none() {
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the Ingress arrives");
    let got = ingresses.get("default/shop").unwrap();
    let spec = got.spec.as_ref().unwrap();
    assert_eq!(spec.rules.as_ref().unwrap()[0].http.as_ref().unwrap().paths[0].path.as_deref(), Some("/cart"));
    let ip = got.status.and_then(|s| s.load_balancer).and_then(|l| l.ingress).map(|i| i[0].ip.clone());
    assert_eq!(ip, Some(Some("198.51.100.1".to_string())), "the lab's class gets a pool address");
    let mut changes = secrets.changes();
    tokio::time::timeout(Duration::from_secs(5), async {
        while secrets.get("default/shop-tls").is_none() {
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the Secret arrives");
    let data = secrets.get("default/shop-tls").unwrap().data.unwrap();
    assert_eq!(data["tls.crt"].0, b"cert");
}

/// Over TLS the client trusts the lab CA it is given and nothing else: the right CA connects
/// and lists, another CA or plain HTTP does not.
#[tokio::test]
async fn tls_connections_verify_the_lab_ca() {
    let dir = tempfile::tempdir().unwrap();
    let id = apiserver_lite::tls::generated_identity(&dir.path().join("pki"), &["127.0.0.1".into()]).unwrap();
    let ca = std::fs::read_to_string(dir.path().join("pki/ca.crt")).unwrap();
    let other = tempfile::tempdir().unwrap();
    apiserver_lite::tls::generated_identity(other.path(), &[]).unwrap();
    let other_ca = std::fs::read_to_string(other.path().join("ca.crt")).unwrap();
    let srv = apiserver_lite::start(&apiserver_lite::Config::new(dir.path().join("data"))).await.unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap().to_string();
    tokio::spawn(apiserver_lite::grpc::serve_grpc(
        srv.registry.clone(),
        Some("s3cret".into()),
        3 << 20,
        Some(id),
        grpc,
        std::future::pending(),
    ));
    let mut c =
        ApiClient::connect_patiently(&addr, Some("s3cret"), Some(&ca), Some(Duration::from_secs(5))).await.unwrap();
    let nodes = c.nodes.list(api::proto::ListRequest::default()).await.unwrap().into_inner();
    assert!(nodes.items.is_empty());
    assert!(ApiClient::connect(&addr, Some("s3cret"), Some(&other_ca)).await.is_err(), "a CA that did not sign it");
    let plain = ApiClient::connect(&addr, Some("s3cret"), None).await;
    let refused = match plain {
        Err(_) => true,
        Ok(mut c) => c.nodes.list(api::proto::ListRequest::default()).await.is_err(),
    };
    assert!(refused, "plain HTTP/2 to a TLS server");
    let mut anonymous = ApiClient::connect(&addr, None, Some(&ca)).await.unwrap();
    let err = anonymous.nodes.list(api::proto::ListRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
}

/// A CRD's objects over gRPC, as JSON: written (validated by the CRD's schema), read, listed,
/// their status updated, deleted, and followed by a reflector.
#[tokio::test]
async fn custom_objects_over_grpc_as_json() {
    use api::proto as pb;
    let s = server().await;
    let crd = serde_json::json!({"metadata": {"name": "things.test.podpath.dev"},
        "spec": {"group": "test.podpath.dev", "scope": "Namespaced",
            "names": {"plural": "things", "kind": "Thing"},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer", "maximum": 5, "default": 1}}},
                    "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}}}]}});
    let opts = apiserver_lite::registry::WriteOptions::default();
    s.registry.create(api::Kind::CustomResourceDefinition, None, crd, &opts).await.unwrap();
    let client = ApiClient::connect(&s.grpc, None, None).await.unwrap();
    let resource = "things.test.podpath.dev";
    let thing = |size: i64| pb::CustomObject {
        resource: resource.into(),
        json: serde_json::json!({"apiVersion": "test.podpath.dev/v1", "kind": "Thing",
            "metadata": {"name": format!("t{size}"), "namespace": "default"}, "spec": {"size": size}})
        .to_string(),
    };
    // Served once the controller has established the CRD.
    let created = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match client.custom.clone().create(thing(2)).await {
                Ok(r) => break r.into_inner(),
                Err(e) if e.code() == tonic::Code::NotFound => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("the CRD is served");
    let v: serde_json::Value = serde_json::from_str(&created.json).unwrap();
    assert_eq!(v["spec"]["size"], 2);
    let err = client.custom.clone().create(thing(9)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("spec.size in body should be less than or equal to 5"), "{}", err.message());

    let store = Store::<serde_json::Value>::new();
    tokio::spawn(reflector::run_custom(client.clone(), resource, Filter::default(), store.clone()));
    store.wait_synced().await;
    assert!(store.get("default/t2").is_some());

    let mut with_status = v.clone();
    with_status["status"] = serde_json::json!({"ready": true});
    let req = pb::CustomObject { resource: resource.into(), json: with_status.to_string() };
    client.custom.clone().update_status(req).await.unwrap();
    let mut changes = store.changes();
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.get("default/t2").is_none_or(|t| t["status"]["ready"] != true) {
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the status change arrives");
    let list = client
        .custom
        .clone()
        .list(pb::CustomListRequest { resource: resource.into(), namespace: "default".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.items_json.len(), 1);
    let gone = pb::CustomDeleteRequest { resource: resource.into(), namespace: "default".into(), name: "t2".into() };
    client.custom.clone().delete(gone).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while store.get("default/t2").is_some() {
            changes.changed().await.unwrap();
        }
    })
    .await
    .expect("the deletion arrives");
    let missing =
        client.custom.clone().get(pb::CustomGetRequest { resource: "nothings.x.y".into(), ..Default::default() }).await;
    assert_eq!(missing.unwrap_err().code(), tonic::Code::NotFound);
}
