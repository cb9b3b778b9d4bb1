//! The netlink layer's one error type.

/// A netlink call failed: what was being done, and the kernel's (or the socket's) answer.
#[derive(Debug, thiserror::Error)]
#[error("nf_tables netlink: {what}: {source}")]
pub struct NfnlError {
    pub what: String,
    #[source]
    pub source: std::io::Error,
}

pub type Result<T> = std::result::Result<T, NfnlError>;
