//! The client crate's errors.

/// Errors of the client crate. Each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API server could not be reached or refused the connection.
    #[error("cannot connect to the API server at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// Bad configuration (the address, the token file…).
    #[error("{0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, ClientError>;
