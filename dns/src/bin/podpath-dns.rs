//! `podpath-dns`: the lab's cluster DNS server (CoreDNS's role).

use std::net::SocketAddr;

use anyhow::{Context, Result};
use clap::Parser;
use podpath_client::daemon::stop_signal;
use podpath_dns::records::Config;
use podpath_dns::run::{run, Options};

/// Serves the cluster zone (`<svc>.<ns>.svc.<domain>`, SRV, PTR, pods) from the API server.
#[derive(Parser, Debug)]
#[command(name = "podpath-dns", version)]
struct Args {
    #[command(flatten)]
    api: podpath_client::daemon::ApiFlags,
    /// Where to answer, UDP and TCP.
    #[arg(long, default_value = "0.0.0.0:53")]
    listen: SocketAddr,
    /// The cluster domain (kubelet's --cluster-domain).
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// TTL of every answer, in seconds (kubeadm's Corefile sets 30).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=3600))]
    ttl: u32,
    /// Where `GET /metrics` answers (CoreDNS's port); empty: nowhere.
    #[arg(long, default_value = "0.0.0.0:9153")]
    metrics_listen: String,
    /// Where `GET /health` answers; empty: nowhere.
    #[arg(long, default_value = "0.0.0.0:8080")]
    health_listen: String,
    /// Where `GET /ready` answers, once the zone is built; empty: nowhere.
    #[arg(long, default_value = "0.0.0.0:8181")]
    ready_listen: String,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "PODPATH_LOG", default_value = "info")]
    log: String,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    if let Err(e) = start().await {
        eprintln!("podpath-dns: {e:#}");
        std::process::exit(1);
    }
}

/// An optional listen address: empty means none.
fn addr(flag: &str, v: &str) -> Result<Option<SocketAddr>> {
    if v.is_empty() {
        return Ok(None);
    }
    v.parse().map(Some).map_err(|_| anyhow::anyhow!("{flag} {v:?} is not an address:port"))
}

async fn start() -> Result<()> {
    let args = Args::parse();
    podpath_client::daemon::init_logging(&args.log);
    let zone = Config::new(&args.cluster_domain, args.ttl).map_err(anyhow::Error::msg)?;
    let opts = Options {
        token: args.api.token()?,
        ca: args.api.ca()?,
        apiserver: args.api.apiserver,
        listen: args.listen,
        zone,
        metrics: addr("--metrics-listen", &args.metrics_listen)?,
        health: addr("--health-listen", &args.health_listen)?,
        ready: addr("--ready-listen", &args.ready_listen)?,
    };
    run(opts, stop_signal()).await.context("podpath-dns")
}
