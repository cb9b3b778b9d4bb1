//! The agent's Node (registration, heartbeats) against an in-process apiserver-lite on
//! 127.0.0.1:0.

use std::time::Duration;

use api::k8s_openapi::api::core::v1 as core;
use node_agent::node::{self, NodeConfig};
use podpath_client::ApiClient;

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

fn cfg(name: &str) -> NodeConfig {
    NodeConfig {
        name: name.into(),
        internal_ips: vec!["192.168.56.11".parse().unwrap()],
        max_pods: 110,
        labels: Default::default(),
        kubelet_port: 0,
        external_ips: vec![],
        annotations: Default::default(),
    }
}

#[tokio::test]
async fn registers_heartbeats_and_reports_not_ready_on_stop() {
    let s = server().await;
    let client = ApiClient::connect(&s.grpc, None, None).await.unwrap();
    let desired = node::node_object(&cfg("node-1"), &node::host_facts());
    let n = node::register(&client, &desired).await.unwrap();
    assert_eq!(n.spec.unwrap().pod_cidr.as_deref(), Some("10.244.1.0/24"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let hb = tokio::spawn(node::run_heartbeats(client.clone(), desired.clone(), Duration::from_millis(100), async {
        let _ = stop_rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(350)).await;
    let stored: core::Node = serde_json::from_value(s.registry.get(api::Kind::Node, "", "node-1").unwrap()).unwrap();
    let ready = stored
        .status
        .as_ref()
        .unwrap()
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready.status, "True");
    assert!(ready.last_heartbeat_time.is_some());
    assert_eq!(api::kinds::node::node_ready_status(&stored), "Ready");
    // Re-registration keeps the pod CIDR.
    assert_eq!(
        node::register(&client, &desired).await.unwrap().spec.unwrap().pod_cidr.as_deref(),
        Some("10.244.1.0/24")
    );
    stop_tx.send(()).unwrap();
    hb.await.unwrap();
    let stored: core::Node = serde_json::from_value(s.registry.get(api::Kind::Node, "", "node-1").unwrap()).unwrap();
    assert_eq!(api::kinds::node::node_ready_status(&stored), "NotReady");
}
