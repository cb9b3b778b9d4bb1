//! The kubelet's one error type.

/// Errors of the kubelet: pods, their processes, CNI, the kubelet API. Each names what it
/// concerns.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The API server could not be reached, or the client is misconfigured.
    #[error(transparent)]
    Client(#[from] podpath_client::ClientError),
    /// The API server answered a call with an error.
    #[error("{call} failed: {status}")]
    Api { call: &'static str, status: tonic::Status },
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
        command: podpath_cni_spec::env::Command,
        plugin: String,
        container_id: String,
        code: u32,
        msg: String,
        details: Option<String>,
    },
}

impl KubeletError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> KubeletError {
        KubeletError::Io { what: what.into(), source }
    }
}

pub type Result<T> = std::result::Result<T, KubeletError>;
