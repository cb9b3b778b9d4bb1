//! The node agent's errors.

/// Errors of the node agent's own parts (registration, heartbeats, routes, the wiring) and of
/// the components it runs. Each names what it concerns.
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
    /// A start-up task of the agent panicked or was cancelled.
    #[error("{0}")]
    Task(String),
    /// The kubelet failed (pods, CNI, its API).
    #[error(transparent)]
    Kubelet(#[from] kubelet::KubeletError),
    /// kube-proxy failed (its rules, a sync task).
    #[error(transparent)]
    Proxy(#[from] kube_proxy::ProxyError),
    /// The NetworkPolicy enforcer failed (its rules).
    #[error(transparent)]
    Netpol(#[from] netpol::NetpolError),
    /// A file, socket, route or sysctl of the node could not be made or changed; `what` says
    /// which, as a sentence.
    #[error("{what}: {source}")]
    System {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl AgentError {
    /// `cannot WHAT: the error`.
    pub fn io(what: impl std::fmt::Display, source: std::io::Error) -> AgentError {
        AgentError::System { what: format!("cannot {what}"), source: Box::new(source) }
    }
}

pub type Result<T> = std::result::Result<T, AgentError>;
