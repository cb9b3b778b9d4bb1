//! Container images for podpath's labs: what containerd's image service and content store do
//! for a node, for every node of a lab at once.
//!
//! - [`reference`](mod@reference): names as the runtimes normalise them, mirrors, plain-HTTP registries (pure);
//! - [`pull`]: pulls with the `oci-client` distribution client (platform, auth, limits);
//! - [`unpack`]: a layer's tar into overlayfs's form, refusing paths out of the layer;
//! - [`archive`]: `docker save` and OCI layout archives loaded without a registry;
//! - [`store`]: the lab's content-addressed store (layers, image records, leases);
//! - [`service`]: the lab's image service (the `podpath-images` program) and its client.

pub mod archive;
pub mod cli;
mod error;
pub mod pull;
pub mod reference;
pub mod service;
pub mod store;
pub mod unpack;

pub use error::{ImageError, Result};
pub use pull::{Credential, Limits, Pulled, Puller};
pub use reference::Registries;
pub use store::{ImageConfig, ImageRecord, Removed, Store};
