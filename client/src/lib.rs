//! What every podpath component that talks to the API server shares (the node agent, lb-sim,
//! the lab's CLI, the DNS server):
//!
//! - [`ApiClient`]: the gRPC client of apiserver-lite, with the bearer token;
//! - [`reflector`]: watched, locally cached objects (list + watch, resume, relist), for every
//!   kind served over gRPC (`api::convert::ProtoKind`);
//! - [`events`]: events reported from outside the API server (kubelet's, the load balancer's);
//! - [`daemon`]: token file, stop signal, and processes known by PID + start time;
//! - [`http`]: the workspace's one small HTTP/1.1 client (on hyper);
//! - [`relay`]: outgoing relay connections that keep the inbound DSCP (the userspace proxy's,
//!   lb-sim's), so `podpath trace` follows a request through them.
//!
//! What it is not: a general Kubernetes client. It speaks apiserver-lite's gRPC; kubectl and the
//! client libraries (kube-rs, the Python and JavaScript clients) use the REST API.

pub mod daemon;
pub mod error;
pub mod events;
pub mod grpc;
pub mod http;
pub mod memory;
pub mod reflector;
pub mod relay;

pub use error::{ClientError, Result};
pub use grpc::ApiClient;
