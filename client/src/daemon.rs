//! What every podpath daemon does at start and stop (the node agent, lb-sim): read the bearer
//! token, wait for SIGTERM or Ctrl-C; and how podpath knows its processes (the agent its pods',
//! the lab its components): by PID *and* start time, so a reused PID is never mistaken for one.

use std::path::{Path, PathBuf};

use crate::error::{ClientError, Result};

/// How a daemon reaches the API server: the flags the node agent, lb-sim and podpath-dns take.
#[derive(clap::Args, Debug, Clone)]
pub struct ApiFlags {
    /// gRPC address of apiserver-lite.
    #[arg(long, default_value = "127.0.0.1:6444")]
    pub apiserver: String,
    /// File with the bearer token the API server wants.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The API server's CA certificate (PEM; the lab's is `STATE/apiserver/pki/ca.crt`): the
    /// connection is TLS and verified. Without it, plain HTTP (an `--insecure-http` server).
    #[arg(long)]
    pub apiserver_ca_file: Option<PathBuf>,
}

impl ApiFlags {
    pub fn token(&self) -> Result<Option<String>> {
        read_token(self.token_file.as_deref())
    }

    pub fn ca(&self) -> Result<Option<String>> {
        read_ca(self.apiserver_ca_file.as_deref())
    }

    /// The same flags as arguments, for a process started with the same access.
    pub fn to_args(&self) -> Vec<String> {
        let mut out = vec!["--apiserver".to_string(), self.apiserver.clone()];
        if let Some(t) = &self.token_file {
            out.extend(["--token-file".to_string(), t.display().to_string()]);
        }
        if let Some(c) = &self.apiserver_ca_file {
            out.extend(["--apiserver-ca-file".to_string(), c.display().to_string()]);
        }
        out
    }
}

/// The token in `--token-file`, trimmed; None without the flag.
pub fn read_token(path: Option<&Path>) -> Result<Option<String>> {
    path.map(|p| {
        std::fs::read_to_string(p)
            .map(|t| t.trim().to_string())
            .map_err(|e| ClientError::Config(format!("cannot read --token-file {}: {e}", p.display())))
    })
    .transpose()
}

/// The API server's CA certificate from `--apiserver-ca-file` (PEM); None without the flag
/// (plain HTTP to an `--insecure-http` server).
pub fn read_ca(path: Option<&Path>) -> Result<Option<String>> {
    path.map(|p| {
        let pem = std::fs::read_to_string(p)
            .map_err(|e| ClientError::Config(format!("cannot read --apiserver-ca-file {}: {e}", p.display())))?;
        if !pem.contains("-----BEGIN CERTIFICATE-----") {
            return Err(ClientError::Config(format!("--apiserver-ca-file {}: no PEM certificate in it", p.display())));
        }
        Ok(pem)
    })
    .transpose()
}

/// Runs `main` to its end on a tokio runtime of its own: `workers` worker threads, or the
/// calling thread alone when 0. What a daemon's library calls from the one plain function its
/// binary runs, so the program is compiled in the library (CONVENTIONS.md, Workspace).
pub fn block_on<F: std::future::Future>(workers: usize, main: F) -> std::io::Result<F::Output> {
    let mut builder = match workers {
        0 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    Ok(builder.enable_all().build()?.block_on(main))
}

/// Resolves on SIGTERM or SIGINT.
pub async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

/// Logs to stderr through `tracing`, filtered by `filter` (RUST_LOG syntax: every daemon's
/// `--log`), without module paths.
pub fn init_logging(filter: &str) {
    // Colours only on a terminal: a pod's log (a file) gets plain text.
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// A process's start time (field 22 of `/proc/PID/stat`, in clock ticks since boot); None when
/// it does not exist or has exited (a zombie).
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); a zombie has exited already.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(22 - 3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self_and_of_nobody() {
        let me = std::process::id() as i32;
        assert!(start_time(me).unwrap() > 0);
        assert_eq!(start_time(me), start_time(me));
        assert_eq!(start_time(i32::MAX), None);
    }
}

/// Where a server asked to listen on `0.0.0.0:P` binds, in order: `[::]:P` first — one socket
/// that takes both families (Linux's default `bindv6only=0`), so a pod of an IPv6 or
/// dual-stack lab is reached on every address it has — then `0.0.0.0:P` where IPv6 is off.
/// Any other address is bound as given.
pub fn listen_candidates(addr: std::net::SocketAddr) -> Vec<std::net::SocketAddr> {
    if addr.ip() == std::net::IpAddr::from([0, 0, 0, 0]) {
        vec![std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, addr.port())), addr]
    } else {
        vec![addr]
    }
}

/// Binds `addr` with `bind`, trying [`listen_candidates`] in order: the first that binds, or
/// the last error (with the address it concerns).
pub async fn bind_any<T, F: std::future::Future<Output = std::io::Result<T>>>(
    addr: std::net::SocketAddr,
    bind: impl Fn(std::net::SocketAddr) -> F,
) -> std::result::Result<T, (std::net::SocketAddr, std::io::Error)> {
    let mut last = None;
    for a in listen_candidates(addr) {
        match bind(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = Some((a, e)),
        }
    }
    Err(last.expect("at least one candidate"))
}

#[cfg(test)]
mod listen_tests {
    #[test]
    fn the_ipv4_wildcard_tries_the_dual_stack_socket_first() {
        let c = super::listen_candidates("0.0.0.0:53".parse().unwrap());
        assert_eq!(c, ["[::]:53".parse().unwrap(), "0.0.0.0:53".parse().unwrap()]);
        assert_eq!(super::listen_candidates("127.0.0.1:53".parse().unwrap()).len(), 1);
    }
}
