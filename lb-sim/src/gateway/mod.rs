//! The Gateway API on the lab's gateway: GatewayClass `podpath` (controller
//! `podpath.dev/gateway`), Gateways with HTTP and HTTPS listeners on an address from the
//! LoadBalancer pool, HTTPRoutes and GRPCRoutes with their matches, filters and weighted
//! backends, ReferenceGrants for references across namespaces.
//!
//! [`types`] decodes the objects; [`plan`] decides statuses, Services and sites purely;
//! [`route`] routes one request (pure).

pub mod controller;
pub mod plan;
pub mod proxy;
pub mod route;
pub mod types;

#[cfg(test)]
mod tests;
