//! The node agent's errors.

/// Errors of the node agent library. Each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The API server could not be reached or refused the connection.
    #[error("cannot connect to the API server at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    /// The API server answered a call with an error.
    #[error("{call} failed: {status}")]
    Api { call: &'static str, status: tonic::Status },
    /// An object from the API server could not be converted.
    #[error("cannot decode {what} from the API server: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: api::Error,
    },
    /// A watch stream ended or failed (the reflector reconnects).
    #[error("watch of {kind} ended: {reason}")]
    WatchEnded { kind: &'static str, reason: String },
    /// Bad configuration (flags, token file…).
    #[error("{0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, AgentError>;
