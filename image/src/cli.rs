//! `podpath-images`: the lab's image service (see [`crate::service`]). `podpath up` starts one
//! per lab in the host's network namespace; the lab's node agents and `podpath image` use it.

use std::path::PathBuf;
use std::time::Duration;

use crate::{Limits, Puller, Registries, Store};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "podpath-images",
    version,
    about = "Pulls container images into a podpath lab's image store, for all its nodes"
)]
struct Args {
    /// The lab's image store.
    #[arg(long)]
    store: PathBuf,
    /// The Unix socket to serve on (replaced if it exists).
    #[arg(long)]
    socket: PathBuf,
    /// REGISTRY=URL: pull REGISTRY's images from the mirror at URL (repeatable;
    /// `docker.io=http://10.0.0.5:5000`). An http:// URL is spoken to over plain HTTP.
    #[arg(long = "registry-mirror")]
    mirrors: Vec<String>,
    /// HOST or HOST:PORT of a registry spoken to over plain HTTP (repeatable).
    #[arg(long = "plain-http-registry")]
    plain_http: Vec<String>,
    /// Largest layer accepted, in MiB.
    #[arg(long, default_value_t = 2048)]
    max_layer_mib: u64,
    /// The store's bound on disk, in MiB (0: none). Over it after a pull, the images no
    /// container uses go, least recently used first, down to 80% of it (kubelet's image GC).
    #[arg(long, default_value_t = 0)]
    store_limit_mib: u64,
    /// A registry silent this long (seconds) fails the pull.
    #[arg(long, default_value_t = 30)]
    read_timeout: u64,
    /// A whole pull longer than this (seconds) fails.
    #[arg(long, default_value_t = 600)]
    pull_deadline: u64,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, default_value = "info")]
    log: String,
}

pub fn main() {
    let args = Args::parse();
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(&args.log)).with_target(false).init();
    if let Err(e) = run(args) {
        eprintln!("podpath-images: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let mut registries = Registries::default();
    for m in &args.mirrors {
        registries.add_mirror(m).map_err(|e| e.to_string())?;
    }
    registries.plain_http.extend(args.plain_http.iter().cloned());
    let store = Store::open(&args.store).map_err(|e| e.to_string())?;
    let store_bytes = (args.store_limit_mib > 0).then_some(args.store_limit_mib << 20);
    store.set_limit(store_bytes).map_err(|e| e.to_string())?;
    let limits = Limits {
        max_layer_bytes: args.max_layer_mib << 20,
        max_unpacked_bytes: (args.max_layer_mib << 20).saturating_mul(4),
        read_timeout: Duration::from_secs(args.read_timeout.max(1)),
        store_bytes,
        ..Limits::default()
    };
    let _ = std::fs::remove_file(&args.socket);
    let listener = std::os::unix::net::UnixListener::bind(&args.socket)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .map_err(|e| format!("cannot listen on {}: {e}", args.socket.display()))?;
    tracing::info!(store = %args.store.display(), socket = %args.socket.display(), "serving");
    let puller = Puller::new(store, registries, limits);
    crate::service::serve_until_signal(listener, puller, Duration::from_secs(args.pull_deadline.max(1)))
        .map_err(|e| format!("cannot serve on {}: {e}", args.socket.display()))?;
    let _ = std::fs::remove_file(&args.socket);
    Ok(())
}
