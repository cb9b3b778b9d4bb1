//! podpath's cluster DNS: the `cluster.local` zone as CoreDNS's `kubernetes` plugin serves it,
//! built from the API's Services and EndpointSlices ([`records`], pure), answered over UDP and
//! TCP with hickory-server ([`server`]), kept current by watching the API ([`run`]), with CoreDNS's metrics, health and
//! readiness endpoints ([`metrics`]).
//!
//! What it is not: CoreDNS. It answers the `kubernetes` plugin's records for the cluster domain
//! and refuses other names (no forwarding, no Corefile).

pub mod error;
pub mod metrics;
pub mod records;
pub mod run;
pub mod server;
