//! The kubelet: the pods bound to one node, run as processes in their own network namespaces,
//! and everything kubelet answers for them. The node agent (`node-agent`) runs it beside
//! kube-proxy and assembles both; it reads and writes the API only through `podpath_client`.
//!
//! - [`pods`]: pod workers (sandbox, CNI, workloads, probes, restarts, status, deletion);
//! - [`podstatus`]: the pod status, computed purely;
//! - [`process`], [`cni`]: side effects behind small traits (processes by PID and start time;
//!   the CNI runtime calling plugins as the spec says);
//! - [`server`]: the kubelet API on the node IP (`containerLogs`, exec, attach, port-forward
//!   over [`stream`]'s WebSocket and SPDY protocols);
//! - [`crilog`], [`tail`]: container logs (the CRI format; following a growing file);
//! - [`workload`]: the `podpath-workload` program (sandbox, join, monitor, echo);
//! - [`echo`]: the built-in `podpath/echo` workload; [`metrics`]: pods running, CNI latency.
//!
//! What it is not: a container runtime. A pod is a process (the [`workload`] program) in the
//! pod's network namespace; images other than podpath's built-in ones are not pulled.

pub mod cni;
pub mod crilog;
pub mod echo;
mod error;
pub mod metrics;
pub mod pods;
pub mod podstatus;
pub mod process;
pub mod server;
pub mod stream;
pub mod tail;
pub mod workload;

pub use error::{KubeletError, Result};
