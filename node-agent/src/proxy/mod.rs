//! The service proxy (kube-proxy's half of the node agent), iptables mode: chain naming, the
//! Service/EndpointSlice model, the pure iptables-restore renderer and the sync loop. Partial
//! syncs, UDP conntrack cleanup and the userspace mode follow.

pub mod iptables;
pub mod model;
pub mod names;
pub mod restore;
pub mod service_health;
pub mod sync;
pub mod userspace;
