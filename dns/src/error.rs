//! The crate's errors.

use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("cannot listen on {0}: {1}")]
    Bind(SocketAddr, #[source] std::io::Error),
    #[error("the API server: {0}")]
    Api(String),
    #[error("serving DNS: {0}")]
    Serve(String),
    #[error("{0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, DnsError>;
