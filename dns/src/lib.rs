//! podpath's cluster DNS: the `cluster.local` zone as CoreDNS's `kubernetes` plugin serves it,
//! built from the API's Services and EndpointSlices ([`records`], pure), answered over UDP and
//! TCP with hickory-server ([`server`]), kept current by watching the API ([`run`]), with CoreDNS's metrics, health and
//! readiness endpoints ([`metrics`]).
//!
//! It reads a Corefile ([`corefile`], pure) and runs the plugins a lab needs in CoreDNS's
//! order ([`pipeline`]): `errors`, `log`, `health`, `ready`, `prometheus`, `cache` ([`cache`]),
//! `kubernetes`, `forward` ([`forward`]), `loop`, `reload`, `loadbalance`. What it is not:
//! CoreDNS; other plugins are refused by name.

pub mod cache;
pub mod cli;
pub mod corefile;
pub mod error;
pub mod forward;
pub mod metrics;
pub mod pipeline;
pub mod records;
pub mod run;
pub mod server;
