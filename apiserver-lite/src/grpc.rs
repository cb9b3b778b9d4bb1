//! The gRPC API (tonic, with server reflection): CRUD for Services and Pods, Node
//! registration and heartbeats, and watch streams. Node agents and lb-sim use it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use api::convert::{json_to_proto, proto_to_json, ProtoKind};
use api::k8s_openapi::api::core::v1 as core;
use api::proto as pb;
use api::selector::{FieldSelector, LabelSelector};
use api::Kind;
use futures::Stream;
use serde_json::{json, Value};
use tonic::{Request, Response, Status};

use crate::controllers::events::{self, try_record, Report};
use crate::error::ApiError;
use crate::registry::{DeleteOptions, Registry, Subresource, WriteOptions};
use crate::store::EventType;
use crate::watch::{WatchFilter, WatchItem, WatchSpec};

#[derive(Clone)]
pub struct Grpc {
    pub registry: Arc<Registry>,
}

/// How often a node's status is posted when nothing in it changed (the kubelet's
/// `nodeStatusReportFrequency`); its Lease is renewed at every heartbeat.
pub const NODE_STATUS_REPORT: Duration = Duration::from_secs(300);

fn decode_err(e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(e.to_string())
}

fn to_value<T: ProtoKind>(p: &T::Proto) -> Result<Value, Status> {
    proto_to_json::<T>(p).map_err(decode_err)
}

fn from_value<T: ProtoKind>(v: Value) -> Result<T::Proto, Status> {
    json_to_proto::<T>(v).map_err(|e| Status::internal(e.to_string()))
}

fn ns_of(v: &Value) -> String {
    v["metadata"]["namespace"].as_str().filter(|s| !s.is_empty()).unwrap_or("default").to_string()
}

fn name_of(v: &Value) -> Result<String, Status> {
    v["metadata"]["name"]
        .as_str()
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .ok_or_else(|| Status::invalid_argument("metadata.name is required"))
}

fn selectors(kind: Kind, labels: &str, fields: &str) -> Result<(LabelSelector, FieldSelector), Status> {
    Ok((LabelSelector::parse(labels).map_err(decode_err)?, FieldSelector::parse(fields, kind).map_err(decode_err)?))
}

impl Grpc {
    async fn create<T: ProtoKind>(&self, kind: Kind, p: &T::Proto) -> Result<T::Proto, Status> {
        let v = to_value::<T>(p)?;
        let ns = kind.info().namespaced.then(|| ns_of(&v));
        let out = self.registry.create(kind, ns.as_deref(), v, &WriteOptions::default()).await?;
        from_value::<T>(out.object)
    }

    async fn update<T: ProtoKind>(&self, kind: Kind, p: &T::Proto, sub: Subresource) -> Result<T::Proto, Status> {
        let v = to_value::<T>(p)?;
        let ns = kind.info().namespaced.then(|| ns_of(&v));
        let name = name_of(&v)?;
        let out = self.registry.update(kind, ns.as_deref(), &name, v, sub, &WriteOptions::default()).await?;
        from_value::<T>(out.object)
    }

    fn get<T: ProtoKind>(&self, kind: Kind, r: &pb::GetRequest) -> Result<T::Proto, Status> {
        let ns = if kind.info().namespaced {
            if r.namespace.is_empty() {
                "default"
            } else {
                &r.namespace
            }
        } else {
            ""
        };
        from_value::<T>(self.registry.get(kind, ns, &r.name)?)
    }

    fn list<T: ProtoKind>(&self, kind: Kind, r: &pb::ListRequest) -> Result<(Vec<T::Proto>, String), Status> {
        let (ls, fs) = selectors(kind, &r.label_selector, &r.field_selector)?;
        let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
        let (items, rv) = self.registry.list(kind, ns, &ls, &fs)?;
        Ok((items.into_iter().map(from_value::<T>).collect::<Result<_, _>>()?, rv.to_string()))
    }

    async fn delete<T: ProtoKind>(&self, kind: Kind, r: &pb::DeleteRequest) -> Result<T::Proto, Status> {
        let ns = if r.namespace.is_empty() { "default" } else { &r.namespace };
        let ns = kind.info().namespaced.then_some(ns);
        let opts = DeleteOptions {
            grace_period_seconds: r.grace_period_seconds,
            precondition_uid: (!r.precondition_uid.is_empty()).then(|| r.precondition_uid.clone()),
            precondition_rv: None,
            dry_run: false,
            orphan: false,
        };
        from_value::<T>(self.registry.delete(kind, ns, &r.name, &opts).await?)
    }
}

#[tonic::async_trait]
impl pb::services_server::Services for Grpc {
    async fn create(&self, r: Request<pb::Service>) -> Result<Response<pb::Service>, Status> {
        Ok(Response::new(Grpc::create::<core::Service>(self, Kind::Service, r.get_ref()).await?))
    }
    async fn get(&self, r: Request<pb::GetRequest>) -> Result<Response<pb::Service>, Status> {
        Ok(Response::new(Grpc::get::<core::Service>(self, Kind::Service, r.get_ref())?))
    }
    async fn list(&self, r: Request<pb::ListRequest>) -> Result<Response<pb::ServiceList>, Status> {
        let (items, resource_version) = Grpc::list::<core::Service>(self, Kind::Service, r.get_ref())?;
        Ok(Response::new(pb::ServiceList { resource_version, items }))
    }
    async fn update(&self, r: Request<pb::Service>) -> Result<Response<pb::Service>, Status> {
        Ok(Response::new(Grpc::update::<core::Service>(self, Kind::Service, r.get_ref(), Subresource::Main).await?))
    }
    async fn delete(&self, r: Request<pb::DeleteRequest>) -> Result<Response<pb::Service>, Status> {
        Ok(Response::new(Grpc::delete::<core::Service>(self, Kind::Service, r.get_ref()).await?))
    }
}

#[tonic::async_trait]
impl pb::pods_server::Pods for Grpc {
    async fn create(&self, r: Request<pb::Pod>) -> Result<Response<pb::Pod>, Status> {
        Ok(Response::new(Grpc::create::<core::Pod>(self, Kind::Pod, r.get_ref()).await?))
    }
    async fn get(&self, r: Request<pb::GetRequest>) -> Result<Response<pb::Pod>, Status> {
        Ok(Response::new(Grpc::get::<core::Pod>(self, Kind::Pod, r.get_ref())?))
    }
    async fn list(&self, r: Request<pb::ListRequest>) -> Result<Response<pb::PodList>, Status> {
        let (items, resource_version) = Grpc::list::<core::Pod>(self, Kind::Pod, r.get_ref())?;
        Ok(Response::new(pb::PodList { resource_version, items }))
    }
    async fn update(&self, r: Request<pb::Pod>) -> Result<Response<pb::Pod>, Status> {
        Ok(Response::new(Grpc::update::<core::Pod>(self, Kind::Pod, r.get_ref(), Subresource::Main).await?))
    }
    async fn update_status(&self, r: Request<pb::Pod>) -> Result<Response<pb::Pod>, Status> {
        Ok(Response::new(Grpc::update::<core::Pod>(self, Kind::Pod, r.get_ref(), Subresource::Status).await?))
    }
    async fn delete(&self, r: Request<pb::DeleteRequest>) -> Result<Response<pb::Pod>, Status> {
        Ok(Response::new(Grpc::delete::<core::Pod>(self, Kind::Pod, r.get_ref()).await?))
    }
}

#[tonic::async_trait]
impl pb::persistent_volumes_server::PersistentVolumes for Grpc {
    async fn delete(&self, r: Request<pb::DeleteRequest>) -> Result<Response<pb::PersistentVolume>, Status> {
        let req = r.get_ref();
        Ok(Response::new(Grpc::delete::<core::PersistentVolume>(self, Kind::PersistentVolume, req).await?))
    }
}

#[tonic::async_trait]
impl pb::nodes_server::Nodes for Grpc {
    /// Creates the Node, or updates its labels, addresses and status while keeping its pod CIDR.
    async fn register(&self, r: Request<pb::RegisterNodeRequest>) -> Result<Response<pb::Node>, Status> {
        let node = r.into_inner().node.ok_or_else(|| Status::invalid_argument("node is required"))?;
        let mut v = to_value::<core::Node>(&node)?;
        let name = name_of(&v)?;
        let reg = &self.registry;
        let out = match reg.store.get(Kind::Node, "", &name).map_err(Status::from)? {
            None => reg.create(Kind::Node, None, v, &WriteOptions::default()).await?.object,
            Some(old) => {
                let mut main = old.clone();
                main["metadata"]["labels"] = v["metadata"]["labels"].take();
                // The agent's own annotations are set; others' are kept.
                for (k, val) in v["metadata"]["annotations"].as_object().into_iter().flatten() {
                    main["metadata"]["annotations"][k] = val.clone();
                }
                if let Some(spec) = v.get("spec") {
                    for (k, val) in spec.as_object().into_iter().flatten() {
                        if k != "podCIDR" && k != "podCIDRs" {
                            main["spec"][k] = val.clone();
                        }
                    }
                }
                let updated = reg
                    .update(Kind::Node, None, &name, main, Subresource::Main, &WriteOptions::default())
                    .await?
                    .object;
                let mut with_status = updated.clone();
                with_status["status"] = v.get("status").cloned().unwrap_or(json!({}));
                reg.update(Kind::Node, None, &name, with_status, Subresource::Status, &WriteOptions::default())
                    .await?
                    .object
            }
        };
        Ok(Response::new(from_value::<core::Node>(out)?))
    }

    /// Renews the node's Lease, and posts its conditions (with a fresh lastHeartbeatTime) when
    /// one changed or the last post is [`NODE_STATUS_REPORT`] old — the kubelet's
    /// `nodeStatusReportFrequency`: the Lease is the heartbeat, the Node's status is not
    /// rewritten every few seconds.
    async fn heartbeat(&self, r: Request<pb::HeartbeatRequest>) -> Result<Response<pb::Node>, Status> {
        let req = r.into_inner();
        let reg = &self.registry;
        let old = reg.get(Kind::Node, "", &req.name)?;
        let now = jiff::Timestamp::now();
        let out = match crate::controllers::nodes::heartbeat_status(&old, &req.conditions, now, NODE_STATUS_REPORT) {
            Some(new) => {
                reg.update(Kind::Node, None, &req.name, new, Subresource::Status, &WriteOptions::default())
                    .await?
                    .object
            }
            None => old,
        };
        crate::controllers::nodes::renew_lease(reg, &out).await?;
        Ok(Response::new(from_value::<core::Node>(out)?))
    }

    async fn get(&self, r: Request<pb::GetRequest>) -> Result<Response<pb::Node>, Status> {
        Ok(Response::new(Grpc::get::<core::Node>(self, Kind::Node, r.get_ref())?))
    }

    async fn list(&self, r: Request<pb::ListRequest>) -> Result<Response<pb::NodeList>, Status> {
        let (items, resource_version) = Grpc::list::<core::Node>(self, Kind::Node, r.get_ref())?;
        Ok(Response::new(pb::NodeList { resource_version, items }))
    }
}

#[tonic::async_trait]
impl pb::events_server::Events for Grpc {
    /// Kubelet's and the load balancer's events: the server builds and aggregates the Event.
    async fn record(&self, r: Request<pb::EventReport>) -> Result<Response<pb::EventRecorded>, Status> {
        let e = r.into_inner();
        let kind = kind_of(e.kind)?;
        for (field, value) in [("name", &e.name), ("reason", &e.reason), ("component", &e.component)] {
            if value.is_empty() {
                return Err(Status::invalid_argument(format!("event about {kind} {:?}: {field} is required", e.name)));
            }
        }
        // events.k8s.io/v1 caps the note at 1 kB; a longer message is the reporter's bug.
        if e.message.len() > MAX_EVENT_MESSAGE {
            return Err(Status::invalid_argument(format!(
                "event {} about {kind} {}: message is {} bytes, at most {MAX_EVENT_MESSAGE} allowed",
                e.reason,
                e.name,
                e.message.len()
            )));
        }
        let mut meta = json!({"name": e.name, "uid": e.uid, "resourceVersion": e.resource_version});
        if kind.info().namespaced {
            meta["namespace"] = json!(if e.namespace.is_empty() { "default" } else { e.namespace.as_str() });
        }
        let object = json!({ "metadata": meta });
        let report = Report {
            component: &e.component,
            host: Some(e.host.as_str()).filter(|h| !h.is_empty()),
            object: &object,
            kind,
            field_path: Some(e.field_path.as_str()).filter(|f| !f.is_empty()),
            type_: if e.warning { events::EventType::Warning } else { events::EventType::Normal },
            reason: &e.reason,
            message: e.message.clone(),
        };
        let (name, count) = try_record(&self.registry, &report).await?;
        Ok(Response::new(pb::EventRecorded { name, count: i32::try_from(count).unwrap_or(i32::MAX) }))
    }
}

/// The longest event message accepted (events.k8s.io/v1's limit on `note`).
pub const MAX_EVENT_MESSAGE: usize = 1024;

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

fn kind_of(k: i32) -> Result<Kind, Status> {
    pb::Kind::try_from(k)
        .ok()
        .and_then(api::convert::kind_of)
        .ok_or_else(|| Status::invalid_argument("kind is required"))
}

/// The served custom resource `plural.group`.
fn custom_kind(reg: &Registry, resource: &str) -> Result<Kind, Status> {
    api::custom::CustomKind::by_resource(resource)
        .filter(|c| reg.crds.get(*c).is_some())
        .map(Kind::Custom)
        .ok_or_else(|| Status::not_found(format!("the server doesn't have a resource type {resource:?}")))
}

fn proto_object(kind: Kind, v: Value) -> Result<pb::watch_event::Object, Status> {
    if let Kind::Custom(_) = kind {
        return Ok(pb::watch_event::Object::ObjectJson(v.to_string()));
    }
    match api::convert::event_object(kind, v) {
        Some(o) => o.map_err(|e| Status::internal(e.to_string())),
        None => Err(Status::unimplemented(format!("{kind} objects are not watchable over gRPC"))),
    }
}

#[tonic::async_trait]
impl pb::watch_server::Watch for Grpc {
    type WatchStream = WatchStream;

    async fn watch(&self, r: Request<pb::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let req = r.into_inner();
        let kind = match req.resource.as_str() {
            "" => kind_of(req.kind)?,
            resource => custom_kind(&self.registry, resource)?,
        };
        let (labels, fields) = selectors(kind, &req.label_selector, &req.field_selector)?;
        let from = match req.resource_version.as_str() {
            "" => None,
            s => {
                Some(s.parse::<u64>().map_err(|_| Status::invalid_argument(format!("invalid resource_version: {s}")))?)
            }
        };
        let spec = WatchSpec {
            filter: WatchFilter { kind, ns: (!req.namespace.is_empty()).then_some(req.namespace), labels, fields },
            from,
            // Streams of node agents live as long as the agent; they reconnect with their RV.
            timeout: Duration::from_secs(365 * 24 * 3600),
            bookmark_every: Some(Duration::from_secs(30)),
        };
        let mut items = crate::watch::start(self.registry.clone(), spec);
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            while let Some(item) = items.recv().await {
                let ev = match item {
                    WatchItem::Event(t, obj) => {
                        let rv = obj["metadata"]["resourceVersion"].as_str().unwrap_or("").to_string();
                        let type_ = match t {
                            EventType::Added => pb::watch_event::Type::Added,
                            EventType::Modified => pb::watch_event::Type::Modified,
                            EventType::Deleted => pb::watch_event::Type::Deleted,
                        };
                        proto_object(kind, obj).map(|o| pb::WatchEvent {
                            r#type: type_ as i32,
                            resource_version: rv,
                            object: Some(o),
                        })
                    }
                    WatchItem::Synced(rv) => Ok(pb::WatchEvent {
                        r#type: pb::watch_event::Type::Synced as i32,
                        resource_version: rv.to_string(),
                        object: None,
                    }),
                    WatchItem::Bookmark(rv) => Ok(pb::WatchEvent {
                        r#type: pb::watch_event::Type::Bookmark as i32,
                        resource_version: rv.to_string(),
                        object: None,
                    }),
                    WatchItem::Expired { requested, current } => {
                        Err(Status::out_of_range(ApiError::Expired { requested, current }.to_string()))
                    }
                };
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }
}

/// A custom object's JSON, as a request carries it.
fn object_json(o: &pb::CustomObject) -> Result<Value, Status> {
    let v: Value = serde_json::from_str(&o.json).map_err(|e| Status::invalid_argument(format!("json: {e}")))?;
    if !v.is_object() {
        return Err(Status::invalid_argument("json: an object is required"));
    }
    Ok(v)
}

fn custom_reply(resource: &str, v: &Value) -> pb::CustomObject {
    pb::CustomObject { resource: resource.to_string(), json: v.to_string() }
}

/// The namespace of a custom object's request: its own, or none for a cluster-scoped kind.
fn custom_ns(kind: Kind, ns: &str) -> Option<String> {
    kind.info().namespaced.then(|| if ns.is_empty() { "default".to_string() } else { ns.to_string() })
}

impl Grpc {
    async fn custom_write(&self, r: &pb::CustomObject, sub: Option<Subresource>) -> Result<pb::CustomObject, Status> {
        let kind = custom_kind(&self.registry, &r.resource)?;
        let v = object_json(r)?;
        let ns = custom_ns(kind, v["metadata"]["namespace"].as_str().unwrap_or(""));
        let opts = WriteOptions::default();
        let out = match sub {
            None => self.registry.create(kind, ns.as_deref(), v, &opts).await?,
            Some(sub) => {
                let name = name_of(&v)?;
                self.registry.update(kind, ns.as_deref(), &name, v, sub, &opts).await?
            }
        };
        Ok(custom_reply(&r.resource, &out.object))
    }
}

#[tonic::async_trait]
impl pb::custom_objects_server::CustomObjects for Grpc {
    async fn create(&self, r: Request<pb::CustomObject>) -> Result<Response<pb::CustomObject>, Status> {
        Ok(Response::new(self.custom_write(r.get_ref(), None).await?))
    }

    async fn get(&self, r: Request<pb::CustomGetRequest>) -> Result<Response<pb::CustomObject>, Status> {
        let r = r.get_ref();
        let kind = custom_kind(&self.registry, &r.resource)?;
        let ns = custom_ns(kind, &r.namespace).unwrap_or_default();
        let v = self.registry.get(kind, &ns, &r.name)?;
        Ok(Response::new(custom_reply(&r.resource, &v)))
    }

    async fn list(&self, r: Request<pb::CustomListRequest>) -> Result<Response<pb::CustomObjectList>, Status> {
        let r = r.get_ref();
        let kind = custom_kind(&self.registry, &r.resource)?;
        let (labels, fields) = selectors(kind, &r.label_selector, &r.field_selector)?;
        let ns = (!r.namespace.is_empty()).then_some(r.namespace.as_str());
        let (items, rv) = self.registry.list(kind, ns, &labels, &fields)?;
        Ok(Response::new(pb::CustomObjectList {
            items_json: items.iter().map(Value::to_string).collect(),
            resource_version: rv.to_string(),
        }))
    }

    async fn update(&self, r: Request<pb::CustomObject>) -> Result<Response<pb::CustomObject>, Status> {
        Ok(Response::new(self.custom_write(r.get_ref(), Some(Subresource::Main)).await?))
    }

    async fn update_status(&self, r: Request<pb::CustomObject>) -> Result<Response<pb::CustomObject>, Status> {
        Ok(Response::new(self.custom_write(r.get_ref(), Some(Subresource::Status)).await?))
    }

    async fn delete(&self, r: Request<pb::CustomDeleteRequest>) -> Result<Response<pb::CustomObject>, Status> {
        let r = r.get_ref();
        let kind = custom_kind(&self.registry, &r.resource)?;
        let ns = custom_ns(kind, &r.namespace);
        let v = self.registry.delete(kind, ns.as_deref(), &r.name, &DeleteOptions::default()).await?;
        Ok(Response::new(custom_reply(&r.resource, &v)))
    }
}

/// The connections `listener` accepts, each with TCP_NODELAY. Watch events are small writes:
/// with Nagle's algorithm one waited for the peer's delayed ACK of the one before (40 ms), which
/// lb-sim's quiet connection met on every new Service. (tonic's `tcp_nodelay` applies only to
/// listeners it binds itself.)
fn without_nagle(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(listener), |tcp| {
        if let Ok(tcp) = &tcp {
            let _ = tcp.set_nodelay(true);
        }
        tcp
    })
}

/// Serves the gRPC API (with reflection) on `listener` until `shutdown` completes.
pub async fn serve_grpc(
    registry: Arc<Registry>,
    token: Option<Arc<str>>,
    max_message_bytes: usize,
    tls: Option<crate::tls::Identity>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ApiError> {
    use tonic::service::interceptor::InterceptedService;
    let svc = Grpc { registry };
    let check = TokenCheck(token);
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| ApiError::internal(format!("gRPC reflection: {e}")))?;
    let limit = max_message_bytes;
    let incoming = without_nagle(listener);
    let mut builder = tonic::transport::Server::builder();
    if let Some(id) = tls {
        let identity = tonic::transport::Identity::from_pem(&id.cert_pem, &id.key_pem);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| ApiError::internal(format!("gRPC TLS: {e}")))?;
    }
    builder
        // Watch streams of node agents stay open for as long as the agent runs.
        .timeout(Duration::from_secs(3600 * 24 * 365))
        // Reflection describes the API: for authenticated callers only.
        .add_service(InterceptedService::new(reflection, check.clone()))
        .add_service(InterceptedService::new(
            pb::services_server::ServicesServer::new(svc.clone()).max_decoding_message_size(limit),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            pb::pods_server::PodsServer::new(svc.clone()).max_decoding_message_size(limit),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            pb::nodes_server::NodesServer::new(svc.clone()).max_decoding_message_size(limit),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            pb::events_server::EventsServer::new(svc.clone()).max_decoding_message_size(limit),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            pb::persistent_volumes_server::PersistentVolumesServer::new(svc.clone()).max_decoding_message_size(limit),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            pb::custom_objects_server::CustomObjectsServer::new(svc.clone()).max_decoding_message_size(limit),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            pb::watch_server::WatchServer::new(svc).max_decoding_message_size(limit),
            check,
        ))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| ApiError::internal(format!("gRPC server: {e}")))
}

/// Checks the bearer token on every gRPC call.
#[derive(Clone)]
pub struct TokenCheck(pub Option<Arc<str>>);

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else { return Ok(req) };
        let ok = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| t.trim() == &**token);
        if ok {
            Ok(req)
        } else {
            Err(Status::unauthenticated("a valid bearer token is required"))
        }
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn served_connections_have_nagle_off() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = std::pin::pin!(super::without_nagle(listener));
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let served = tokio_stream::StreamExt::next(&mut incoming).await.unwrap().unwrap();
        assert!(served.nodelay().unwrap());
    }
}
