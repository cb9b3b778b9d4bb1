//! kube-proxy: Services implemented on one node, in kube-proxy's three modes, with its rule
//! layouts, sync semantics, health and metrics. The node agent (`node-agent`) runs it beside
//! the kubelet, as `k3s agent` runs both in one process; it reads the API only through
//! `podpath_client`'s watch caches.
//!
//! - [`names`]: kube-proxy's chain names; [`model`]: what the proxy keeps of a Service and an
//!   EndpointSlice, and the endpoints it picks;
//! - the pure renderers into `podpath_ruleset`'s model: iptables mode ([`iptables`]), nftables
//!   mode ([`nftables`]: the v1.34/v1.36 layouts and the shared-maps one), userspace mode
//!   ([`userspace`]);
//! - the sync loops: [`sync`] (iptables), [`nft_sync`] (nftables, its transactions over
//!   netlink through `nfnl`), [`userspace`]; the change tracker ([`tracker`]);
//! - [`health`] and [`metrics`]: `:10256` (`/healthz`, `/livez`, `/metrics`);
//!   [`service_health`]: healthCheckNodePort servers; [`stall`]: a stall the lab can inject.
//!
//! The kernel is behind small traits (`podpath_ruleset::kernel::Kernel` for iptables,
//! [`nft_sync::NftKernel`] for nftables), so every renderer and sync loop is tested over fakes.
//! What it is not: an IPv6 proxy, an IPVS mode, or a reader of kube-proxy's config file.

mod error;
pub mod health;
pub mod iptables;
pub mod metrics;
pub mod model;
pub mod names;
pub mod nft_sync;
pub mod nftables;
pub mod service_health;
pub mod stall;
pub mod sync;
pub mod tracker;
pub mod userspace;

pub use error::{ProxyError, Result};
