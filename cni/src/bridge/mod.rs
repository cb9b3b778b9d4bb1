//! podpath-bridge: the interface plugin (bridge + veth), delegating addresses to any IPAM
//! plugin. This module holds the pure parts: configuration and deterministic names.

pub mod cli;
pub mod config;
pub mod dataplane;
pub mod plugin;

pub use config::{host_veth_name, masq_chain, masq_comment, BridgeConfig};
