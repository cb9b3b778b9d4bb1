//! The CNI specification (1.1.0; 0.3.0–1.0.0 answered in their own format), as types: what a
//! runtime and a plugin agree on, with no I/O. The plugins (`podpath-cni`) and the kubelet's
//! CNI runtime (`podpath-kubelet`) share it, as runtimes and plugins share the spec's `libcni`
//! types.
//!
//! - [`env`](mod@env): the `CNI_*` environment and the commands, parsed and checked;
//! - [`version`]: versions and which commands they allow;
//! - [`types`]: results in every version's JSON shape;
//! - [`error`]: the spec's error JSON and codes (100+ are podpath's own).
//!
//! What it is not: a plugin or a runtime; it executes nothing.

pub mod env;
pub mod error;
pub mod types;
pub mod version;
