//! podpath's node agent: the kubelet half (node registration and heartbeats; pods through CNI
//! come next) and, later, the service proxy.
//!
//! - [`client`]: the gRPC client of apiserver-lite;
//! - [`reflector`]: watched, locally cached objects (list + watch, resume, relist);
//! - [`node`]: the Node the agent reports, registration and heartbeats.

pub mod client;
pub mod error;
pub mod node;
pub mod reflector;

pub use error::{AgentError, Result};
