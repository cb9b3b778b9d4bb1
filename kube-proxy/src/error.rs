//! kube-proxy's one error type.

use podpath_ruleset::RulesetError;

/// A proxier could not read or write the kernel's rules, or a sync task failed. Each names
/// what it concerns.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// `iptables-save`/`-restore` or `nft` failed; `what` names the mode or step.
    #[error("{what}: {source}")]
    Rules {
        what: String,
        #[source]
        source: RulesetError,
    },
    /// An nf_tables netlink batch was refused or the socket failed.
    #[error(transparent)]
    Netlink(#[from] nfnl::NfnlError),
    /// A sync task panicked or was cancelled.
    #[error("{0}")]
    Task(String),
}

/// An iptables save or restore through the shared kernel layer.
impl From<RulesetError> for ProxyError {
    fn from(source: RulesetError) -> Self {
        ProxyError::Rules { what: "iptables".into(), source }
    }
}

pub type Result<T> = std::result::Result<T, ProxyError>;
