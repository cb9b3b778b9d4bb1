//! The service proxy (kube-proxy's half of the node agent). Built so far: chain naming, the
//! Service/EndpointSlice model and the pure iptables-restore renderer; applying, sync loop and
//! userspace mode follow (issue 5).

pub mod iptables;
pub mod model;
pub mod names;
