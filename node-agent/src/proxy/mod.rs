//! The service proxy (kube-proxy's half of the node agent): chain naming ([`names`]), the
//! Service/EndpointSlice model ([`model`]), the pure renderers into `podpath_ruleset`'s model
//! (iptables mode: [`iptables`]; nftables mode: [`nftables`], synced by [`nft_sync`]; userspace mode: [`userspace`]), the kernel behind one trait
//! ([`kernel`]), the Service/endpoint change tracker ([`tracker`]), the iptables proxier's sync
//! loop ([`sync`]), healthCheckNodePort servers ([`service_health`]) and a stall the lab can
//! inject ([`stall`]).

pub mod iptables;
pub mod kernel;
pub mod model;
pub mod names;
pub mod nfnl;
pub mod nft_sync;
pub mod nftables;
pub mod service_health;
pub mod stall;
pub mod sync;
pub mod tracker;
pub mod userspace;
