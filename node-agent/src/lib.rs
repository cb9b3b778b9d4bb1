//! podpath's node agent: the kubelet half (node registration and heartbeats, pods through CNI,
//! host-gw routes, health, the kubelet API) and the service proxy ([`proxy`]).
//!
//! - [`agent`]: everything assembled (what the binary runs);
//! - [`node`]: the Node the agent reports, registration and heartbeats;
//! - [`pods`]: pod workers (sandbox, CNI, workloads, probes, restarts, status, deletion);
//! - [`podstatus`]: the pod status, computed purely;
//! - [`process`], [`cni`], [`routes`]: side effects behind small traits;
//! - [`policy`]: NetworkPolicy enforcement for this node's pods (nftables);
//! - [`echo`]: the built-in `podpath/echo` workload;
//! - [`health`], [`metrics`]: `:10256`;
//! - [`crilog`], [`tail`]: container logs (the CRI format; following a growing file);
//!
//! The gRPC client, the watch caches and the daemon helpers are `podpath_client`'s.

pub mod agent;
pub mod cni;
pub mod crilog;
pub mod echo;
pub mod error;
pub mod health;
pub mod kubelet;
pub mod metrics;
pub mod node;
pub mod pods;
pub mod podstatus;
pub mod policy;
pub mod process;
pub mod proxy;
pub mod routes;
pub mod stream;
pub mod tail;

pub use error::{AgentError, Result};
