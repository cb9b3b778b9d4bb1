//! podpath's node agent: the kubelet half (node registration and heartbeats, pods through CNI,
//! host-gw routes, health) and, later, the service proxy.
//!
//! - [`agent`]: everything assembled (what the binary runs);
//! - [`client`]: the gRPC client of apiserver-lite;
//! - [`reflector`]: watched, locally cached objects (list + watch, resume, relist);
//! - [`node`]: the Node the agent reports, registration and heartbeats;
//! - [`pods`]: pod workers (sandbox, CNI, workloads, probes, restarts, status, deletion);
//! - [`podstatus`]: the pod status, computed purely;
//! - [`process`], [`cni`], [`routes`]: side effects behind small traits;
//! - [`echo`]: the built-in `podpath/echo` workload;
//! - [`health`], [`metrics`]: `:10256`;
//! - [`daemon`]: token file and stop signal, shared with lb-sim;
//! - [`relay`]: outgoing relay connections that keep the inbound DSCP (also lb-sim's).

pub mod agent;
pub mod client;
pub mod cni;
pub mod daemon;
pub mod echo;
pub mod error;
pub mod health;
pub mod metrics;
pub mod node;
pub mod pods;
pub mod podstatus;
pub mod process;
pub mod proxy;
pub mod reflector;
pub mod relay;
pub mod routes;

pub use error::{AgentError, Result};
