//! What every podpath daemon that talks to the API server does at start and stop (the node
//! agent and lb-sim): read the bearer token, wait for SIGTERM or Ctrl-C.

use std::path::Path;

use crate::error::{AgentError, Result};

/// The token in `--token-file`, trimmed; None without the flag.
pub fn read_token(path: Option<&Path>) -> Result<Option<String>> {
    path.map(|p| {
        std::fs::read_to_string(p)
            .map(|t| t.trim().to_string())
            .map_err(|e| AgentError::Config(format!("cannot read --token-file {}: {e}", p.display())))
    })
    .transpose()
}

/// Resolves on SIGTERM or SIGINT.
pub async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
