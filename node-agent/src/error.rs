//! The node agent's errors.

/// Errors of the node agent library. Each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The API server could not be reached, or the client is misconfigured.
    #[error(transparent)]
    Client(#[from] podpath_client::ClientError),
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
    /// Bad configuration (flags, token file…).
    #[error("{0}")]
    Config(String),
    /// A file or system call failed.
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A pod's process could not be started or controlled.
    #[error("{0}")]
    Process(String),
    /// A CNI plugin failed (its error code and message, as the spec defines them).
    #[error("CNI {command} of {plugin} for {container_id} failed: {msg}{}", details.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    Cni {
        command: podpath_cni::env::Command,
        plugin: String,
        container_id: String,
        code: u32,
        msg: String,
        details: Option<String>,
    },
    /// A route or sysctl of the node could not be changed.
    #[error("{what}: {source}")]
    Network {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl AgentError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> AgentError {
        AgentError::Io { what: what.into(), source }
    }
}

pub type Result<T> = std::result::Result<T, AgentError>;
