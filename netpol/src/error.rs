//! The enforcer's one error type.

use podpath_ruleset::RulesetError;

/// Writing or reading the node's policy rules failed; `what` names the table or step.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct NetpolError {
    pub what: String,
    #[source]
    pub source: RulesetError,
}

/// An iptables save or restore through the shared kernel layer.
impl From<RulesetError> for NetpolError {
    fn from(source: RulesetError) -> Self {
        NetpolError { what: "iptables".into(), source }
    }
}

pub type Result<T> = std::result::Result<T, NetpolError>;
