//! lb-sim: the simulated world outside the cluster, run in the gateway's network namespace
//! (or on the gateway VM).
//!
//! - [`model`]: what the gateway should do, as a pure function of Services, Nodes and health:
//!   frontends (LoadBalancer IPs and externalIPs), their backends, and from those the routes
//!   (passthrough) and the NodePort proxies (nodeport mode);
//! - [`health`]: cloud-LB-style health checks of every node (`:10256/healthz`, or the
//!   Service's `healthCheckNodePort` for `externalTrafficPolicy: Local`);
//! - [`routing`]: the gateway's routes as resilient nexthop groups (a withdrawn node moves only
//!   its own flows), planned purely against what the kernel holds, applied with `ip -batch`;
//! - [`proxy`]: the nodeport-mode TCP load balancer (`LB IP:port` → `node IP:nodePort`);
//! - [`gateway`]: the Gateway API (GatewayClass `podpath`): the controller and its proxy;
//! - [`status`]: the JSON status endpoint;
//! - [`run`]: everything assembled.
//!
//! What it is not: a cloud API. It watches Services and Nodes and plays the load balancers a
//! cloud would give them, in the lab's gateway (IPv4).

pub mod cli;
pub mod error;
pub mod events;
pub mod gateway;
pub mod health;
pub mod l7;
pub mod l7_proxy;
pub mod model;
pub mod proxy;
pub mod routing;
pub mod run;
pub mod status;

pub use error::{LbError, Result};
