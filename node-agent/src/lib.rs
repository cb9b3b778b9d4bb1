//! podpath's node agent: what one node runs, assembled in one process as `k3s agent` runs
//! kubelet and kube-proxy. Its own code is the assembly:
//!
//! - [`agent`]: the wiring — flags to each component's configuration, the watches, the health
//!   and metrics server, the order of start and stop;
//! - [`node`]: the Node the agent reports, registration and heartbeats;
//! - [`routes`]: host-gw routes to other nodes' pod CIDRs (as flannel's host-gw backend).
//!
//! The components are crates of their own: `kubelet` (pods, CNI, logs, exec, port-forward),
//! `kube_proxy` (Services in the iptables, nftables and userspace modes; health and metrics)
//! and `netpol` (NetworkPolicy). The gRPC client, the watch caches and the daemon helpers are
//! `podpath_client`'s.

pub mod agent;
pub mod cli;
pub mod error;
pub mod node;
pub mod routes;

pub use error::{AgentError, Result};
