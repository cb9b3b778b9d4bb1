//! lb-sim's errors.

/// Errors of lb-sim. Each names what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum LbError {
    /// Bad flags.
    #[error("{0}")]
    Config(String),
    /// The API client failed (connect, token).
    #[error(transparent)]
    Client(#[from] podpath_client::ClientError),
    /// An `ip` command failed; `what` says what it was changing.
    #[error("cannot {what}: {detail}")]
    Ip { what: String, detail: String },
    /// A socket or file operation failed.
    #[error("cannot {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl LbError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> LbError {
        LbError::Io { what: what.into(), source }
    }
}

pub type Result<T> = std::result::Result<T, LbError>;
