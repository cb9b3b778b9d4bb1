//! The ruleset crate's errors.

/// Errors of the ruleset crate. Each names the line, command or namespace it concerns.
#[derive(Debug, thiserror::Error)]
pub enum RulesetError {
    /// Text that is not `iptables-save` output or restore input.
    #[error("line {line}: {text}: {reason}")]
    Parse { line: usize, text: String, reason: String },
    /// A command could not be started.
    #[error("cannot run {cmd}{}: {source}", in_netns(netns))]
    Spawn {
        cmd: String,
        netns: Option<String>,
        #[source]
        source: std::io::Error,
    },
    /// A command failed; for a restore, `input_line` is the line of the input it rejected.
    #[error("{cmd}{} failed: {stderr}{}", in_netns(netns), input_line.as_deref().map(|l| format!(" (input: {l})")).unwrap_or_default())]
    Failed { cmd: String, netns: Option<String>, stderr: String, input_line: Option<String> },
}

fn in_netns(netns: &Option<String>) -> String {
    netns.as_deref().map(|n| format!(" in {n}")).unwrap_or_default()
}

pub type Result<T> = std::result::Result<T, RulesetError>;
