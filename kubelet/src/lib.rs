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
//! - [`volumes`]: a pod's volumes (emptyDir, hostPath, configMap, secret, downwardAPI,
//!   projected), planned purely and written by an atomic writer;
//! - [`images`], [`oci`]: containers of images — pulled through the lab's image service, run
//!   by an OCI runtime (crun) from a bundle made purely from the pod and the image.
//!
//! Built-in images (`podpath/echo`, `podpath/dns`) and a container whose image is a node
//! program (`--host-programs`) are processes joined to the pod's namespaces, as before.

pub mod cni;
pub mod crilog;
pub mod echo;
mod error;
pub mod images;
pub mod localpath;
pub mod metrics;
pub mod oci;
pub mod pods;
pub mod podstatus;
pub mod process;
pub mod server;
pub mod stream;
pub mod tail;
pub mod usage;
pub mod volumes;
pub mod workload;

pub use error::{KubeletError, Result};
