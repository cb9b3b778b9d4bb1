//! In-process tests of the gRPC API: a real server on 127.0.0.1:0 (REST and gRPC listeners),
//! driven with the generated tonic clients.

use std::time::Duration;

use api::proto as pb;
use api::proto::nodes_client::NodesClient;
use api::proto::services_client::ServicesClient;
use api::proto::watch_client::WatchClient;
use tokio::net::TcpListener;
use tonic::transport::Channel;

struct Running {
    grpc: String,
    rest: std::net::SocketAddr,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

async fn run(token: Option<&str>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = apiserver_lite::Config::new(dir.path().to_path_buf());
    cfg.token = token.map(str::to_string);
    let rest = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = grpc.local_addr().unwrap();
    let rest_addr = rest.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(apiserver_lite::serve(cfg, vec![rest], Some(grpc), async {
        let _ = rx.await;
    }));
    let url = format!("http://{addr}");
    for _ in 0..100 {
        if Channel::from_shared(url.clone()).unwrap().connect().await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Running { grpc: url, rest: rest_addr, _stop: tx, _dir: dir }
}

async fn channel(r: &Running) -> Channel {
    Channel::from_shared(r.grpc.clone()).unwrap().connect().await.unwrap()
}

fn web_service() -> pb::Service {
    pb::Service {
        metadata: Some(pb::ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            ..Default::default()
        }),
        spec: Some(pb::ServiceSpec {
            r#type: Some("NodePort".into()),
            ports: vec![pb::ServicePort { name: Some("http".into()), port: 80, ..Default::default() }],
            selector: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn service_crud_and_typed_errors() {
    let r = run(None).await;
    let mut svc = ServicesClient::new(channel(&r).await);
    let created = svc.create(web_service()).await.unwrap().into_inner();
    let spec = created.spec.clone().unwrap();
    assert!(spec.cluster_ip.unwrap().starts_with("10."));
    assert!(spec.ports[0].node_port.unwrap() >= 30000);
    assert_eq!(spec.ports[0].protocol.as_deref(), Some("TCP"));
    let err = svc.create(web_service()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    let got = svc.get(pb::GetRequest { namespace: "default".into(), name: "web".into() }).await.unwrap().into_inner();
    assert_eq!(got, created);
    let list =
        svc.list(pb::ListRequest { label_selector: String::new(), ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(list.items.len(), 2); // web and default/kubernetes
    let mut bad = web_service();
    bad.metadata.as_mut().unwrap().name = Some("bad".into());
    bad.spec.as_mut().unwrap().ports[0].node_port = Some(80);
    let err = svc.create(bad).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("spec.ports[0].nodePort: Invalid value: 80"), "{}", err.message());
    let mut upd = created.clone();
    upd.spec.as_mut().unwrap().ports[0].target_port =
        Some(pb::IntOrString { value: Some(pb::int_or_string::Value::IntValue(8080)) });
    let updated = svc.update(upd).await.unwrap().into_inner();
    assert_eq!(updated.spec.as_ref().unwrap().ports[0].node_port, spec.ports[0].node_port);
    let deleted = svc
        .delete(pb::DeleteRequest { namespace: "default".into(), name: "web".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.metadata.unwrap().name.as_deref(), Some("web"));
    let err = svc.get(pb::GetRequest { namespace: "default".into(), name: "web".into() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn watch_sends_snapshot_synced_then_events_and_resumes() {
    let r = run(None).await;
    let ch = channel(&r).await;
    let mut watch = WatchClient::new(ch.clone());
    let mut stream = watch
        .watch(pb::WatchRequest { kind: pb::Kind::Service as i32, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.r#type, pb::watch_event::Type::Added as i32);
    let synced = stream.message().await.unwrap().unwrap();
    assert_eq!(synced.r#type, pb::watch_event::Type::Synced as i32);
    let mut svc = ServicesClient::new(ch.clone());
    svc.create(web_service()).await.unwrap();
    let added = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(added.r#type, pb::watch_event::Type::Added as i32);
    let Some(pb::watch_event::Object::Service(s)) = added.object else { panic!("a Service") };
    assert_eq!(s.metadata.unwrap().name.as_deref(), Some("web"));
    // Resume from the synced version: the same ADDED arrives again, and nothing before it.
    let mut resumed = watch
        .watch(pb::WatchRequest {
            kind: pb::Kind::Service as i32,
            resource_version: synced.resource_version,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let again = tokio::time::timeout(Duration::from_secs(5), resumed.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(again.resource_version, added.resource_version);
    // Filters by namespace and selector.
    let mut filtered = watch
        .watch(pb::WatchRequest {
            kind: pb::Kind::Service as i32,
            label_selector: "app=none".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let only = filtered.message().await.unwrap().unwrap();
    assert_eq!(only.r#type, pb::watch_event::Type::Synced as i32);
    let err = watch.watch(pb::WatchRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn nodes_register_get_a_pod_cidr_and_heartbeat() {
    let r = run(None).await;
    let mut nodes = NodesClient::new(channel(&r).await);
    let node = pb::Node {
        metadata: Some(pb::ObjectMeta { name: Some("node-2".into()), ..Default::default() }),
        status: Some(pb::NodeStatus {
            addresses: vec![pb::NodeAddress { r#type: "InternalIP".into(), address: "192.168.56.12".into() }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let registered = nodes.register(pb::RegisterNodeRequest { node: Some(node.clone()) }).await.unwrap().into_inner();
    assert_eq!(registered.spec.as_ref().unwrap().pod_cidr.as_deref(), Some("10.244.2.0/24"));
    // Registering again keeps the CIDR.
    let again = nodes.register(pb::RegisterNodeRequest { node: Some(node) }).await.unwrap().into_inner();
    assert_eq!(again.spec.unwrap().pod_cidr.as_deref(), Some("10.244.2.0/24"));
    let beat = nodes
        .heartbeat(pb::HeartbeatRequest {
            name: "node-2".into(),
            conditions: vec![pb::Condition {
                r#type: "Ready".into(),
                status: "True".into(),
                reason: Some("KubeletReady".into()),
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let ready = &beat.status.unwrap().conditions[0];
    assert_eq!(ready.status, "True");
    assert!(ready.last_heartbeat_time.is_some());
    let err = nodes.heartbeat(pb::HeartbeatRequest { name: "nope".into(), conditions: vec![] }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    // Each heartbeat renews the node's Lease in kube-node-lease, as the kubelet's does.
    let lease = get_json(r.rest, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-2").await;
    assert_eq!(lease["spec"]["holderIdentity"], "node-2");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(lease["metadata"]["ownerReferences"][0]["kind"], "Node");
    let renewed = lease["spec"]["renewTime"].as_str().unwrap();
    assert_eq!(renewed.len(), "2026-11-27T02:40:00.123456Z".len(), "a MicroTime: {renewed}");
    // The next heartbeat with nothing changed renews the Lease only: the Node is not written
    // again (the kubelet posts an unchanged status every 5 minutes); a change is posted.
    let before = get_json(r.rest, "/api/v1/nodes/node-2").await;
    let beat = |status: &str| pb::HeartbeatRequest {
        name: "node-2".into(),
        conditions: vec![pb::Condition {
            r#type: "Ready".into(),
            status: status.into(),
            reason: Some("KubeletReady".into()),
            ..Default::default()
        }],
    };
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    nodes.heartbeat(beat("True")).await.unwrap();
    let after = get_json(r.rest, "/api/v1/nodes/node-2").await;
    assert_eq!(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"]);
    let lease = get_json(r.rest, "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/node-2").await;
    assert_ne!(lease["spec"]["renewTime"].as_str().unwrap(), renewed);
    let down = nodes.heartbeat(beat("False")).await.unwrap().into_inner();
    assert_eq!(down.status.unwrap().conditions[0].status, "False");
    let after = get_json(r.rest, "/api/v1/nodes/node-2").await;
    assert_ne!(after["metadata"]["resourceVersion"], before["metadata"]["resourceVersion"]);
    assert_eq!(after["status"]["conditions"][0]["status"], "False");
}

/// A GET over plain HTTP/1.0; the body as JSON.
async fn get_json(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[tokio::test]
async fn reflection_lists_the_services() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let r = run(None).await;
    let mut client = ServerReflectionClient::new(channel(&r).await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = client.server_reflection_info(futures::stream::iter(vec![req])).await.unwrap().into_inner();
    let msg = resp.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = msg.message_response else { panic!("list response") };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["podpath.v1.Services", "podpath.v1.Pods", "podpath.v1.Nodes", "podpath.v1.Watch"] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
}

#[tokio::test]
async fn token_is_required_when_configured() {
    let r = run(Some("s3cret")).await;
    let ch = channel(&r).await;
    let err = ServicesClient::new(ch.clone()).list(pb::ListRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut authed = ServicesClient::with_interceptor(ch, |mut req: tonic::Request<()>| {
        req.metadata_mut().insert("authorization", "Bearer s3cret".parse().unwrap());
        Ok(req)
    });
    assert!(authed.list(pb::ListRequest::default()).await.is_ok());
}

/// Sends raw bytes as the request message, to see what the server makes of garbage.
#[derive(Default)]
struct RawCodec;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, buf: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        buf.put_slice(&item);
        Ok(())
    }
}

/// Takes any answer as bytes (the test looks at status codes only).
struct RawDecoder;

impl tonic::codec::Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(buf.copy_to_bytes(buf.remaining()).to_vec()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// A message that does not decode is the caller's fault: INVALID_ARGUMENT, never INTERNAL, and
/// nothing is stored.
#[tokio::test]
async fn malformed_messages_are_invalid_arguments() {
    let r = run(None).await;
    let ch = channel(&r).await;
    let garbage: [&[u8]; 4] = [
        &[0xff, 0xff, 0xff],             // a truncated varint tag
        &[0x0a, 0x7f, 0x01],             // metadata claims 127 bytes, has 1
        &[0x0a, 0x02, 0x0a, 0x80],       // a field of metadata truncated
        &[0x12, 0x03, 0xff, 0xfe, 0xfd], // spec with invalid wire data
    ];
    for g in garbage {
        let mut client = tonic::client::Grpc::new(ch.clone());
        client.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static("/podpath.v1.Services/Create");
        let err = client.unary(tonic::Request::new(g.to_vec()), path, RawCodec).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{g:?}: {err:?}");
    }
    // Seeded random bytes at every unary method: never INTERNAL or UNKNOWN, never a hang.
    let mut rng = fastrand::Rng::with_seed(7);
    let methods = [
        "/podpath.v1.Services/Create",
        "/podpath.v1.Services/Get",
        "/podpath.v1.Services/List",
        "/podpath.v1.Services/Update",
        "/podpath.v1.Services/Delete",
        "/podpath.v1.Pods/Create",
        "/podpath.v1.Pods/UpdateStatus",
        "/podpath.v1.Pods/Delete",
        "/podpath.v1.Nodes/Register",
        "/podpath.v1.Nodes/Heartbeat",
    ];
    let mut codes = std::collections::BTreeMap::new();
    for _ in 0..600 {
        let method = methods[rng.usize(..methods.len())];
        let bytes: Vec<u8> = (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect();
        let mut client = tonic::client::Grpc::new(ch.clone());
        client.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_maybe_shared(method).unwrap();
        let call = client.unary(tonic::Request::new(bytes.clone()), path, RawCodec);
        let code = match tokio::time::timeout(Duration::from_secs(10), call).await.expect("an answer") {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        assert!(!matches!(code, tonic::Code::Internal | tonic::Code::Unknown), "{method} {bytes:?}: {code:?}");
        *codes.entry(format!("{code:?}")).or_insert(0) += 1;
    }
    println!("grpc fuzz: 600 calls: {codes:?}");
    let list = ServicesClient::new(ch).list(pb::ListRequest::default()).await.unwrap().into_inner();
    assert!(list.items.iter().all(|s| s.metadata.as_ref().and_then(|m| m.name.as_deref()) == Some("kubernetes")));
}

#[tokio::test]
async fn events_from_agents_are_built_aggregated_and_checked() {
    use api::proto::events_client::EventsClient;
    let r = run(None).await;
    let ch = channel(&r).await;
    let svc = ServicesClient::new(ch.clone()).create(web_service()).await.unwrap().into_inner();
    let meta = svc.metadata.unwrap();
    let mut events = EventsClient::new(ch);
    let report = pb::EventReport {
        kind: pb::Kind::Service.into(),
        namespace: "default".into(),
        name: "web".into(),
        uid: meta.uid.clone().unwrap(),
        resource_version: meta.resource_version.clone().unwrap(),
        field_path: String::new(),
        warning: false,
        reason: "EnsuredLoadBalancer".into(),
        message: "Ensured load balancer".into(),
        component: "service-controller".into(),
        host: String::new(),
    };
    let first = events.record(report.clone()).await.unwrap().into_inner();
    let again = events.record(report.clone()).await.unwrap().into_inner();
    assert_eq!((first.count, again.count), (1, 2), "a repeat is counted, not a new Event");
    assert_eq!(first.name, again.name);
    let kubelet = pb::EventReport {
        kind: pb::Kind::Pod.into(),
        name: "web-1".into(),
        field_path: "spec.containers{web}".into(),
        reason: "Started".into(),
        message: "Started container web".into(),
        component: "kubelet".into(),
        host: "node-1".into(),
        ..report.clone()
    };
    let started = events.record(kubelet).await.unwrap().into_inner();
    assert_ne!(started.name, first.name);
    // Bad reports are refused with the object named, and nothing is written.
    let long = pb::EventReport { message: "x".repeat(1025), ..report.clone() };
    let err = events.record(long).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("EnsuredLoadBalancer about Service web: message is 1025 bytes"),
        "{}",
        err.message()
    );
    let no_reason = pb::EventReport { reason: String::new(), ..report.clone() };
    let err = events.record(no_reason).await.unwrap_err();
    assert!(err.message().contains("reason is required"), "{}", err.message());
    let no_kind = pb::EventReport { kind: 0, ..report };
    assert_eq!(events.record(no_kind).await.unwrap_err().code(), tonic::Code::InvalidArgument);
}
