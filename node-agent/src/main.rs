//! `node-agent`: registers this machine (or network namespace) as a Node of a podpath lab and
//! keeps it Ready with heartbeats. Running pods through CNI and the service proxy are being
//! added (issues 4 and 5); this binary does what is built so far and says so at start.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use node_agent::client::ApiClient;
use node_agent::node;

/// podpath node agent.
#[derive(Parser, Debug)]
#[command(name = "node-agent", version)]
struct Args {
    /// Name of this node.
    #[arg(long)]
    node_name: String,
    /// This node's address on the node network (its InternalIP).
    #[arg(long)]
    node_ip: IpAddr,
    /// gRPC address of apiserver-lite.
    #[arg(long, default_value = "127.0.0.1:6444")]
    apiserver: String,
    /// File with the bearer token the API server wants.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 10)]
    heartbeat_seconds: u64,
    /// Pods this node accepts (its `pods` capacity).
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "PODPATH_LOG", default_value = "info")]
    log: String,
}

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        eprintln!("node-agent: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(&args.log)).with_target(false).init();
    if args.heartbeat_seconds == 0 {
        bail!("--heartbeat-seconds must be at least 1");
    }
    let token = match &args.token_file {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read --token-file {}", p.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let client = ApiClient::connect(&args.apiserver, token.as_deref()).await?;
    let cfg = node::NodeConfig {
        name: args.node_name.clone(),
        internal_ip: args.node_ip,
        max_pods: args.max_pods,
        labels: Default::default(),
    };
    let desired = node::node_object(&cfg, &node::host_facts());
    let registered = node::register(&client, &desired).await?;
    let cidr = registered.spec.as_ref().and_then(|s| s.pod_cidr.clone()).unwrap_or_default();
    tracing::info!(node = %args.node_name, pod_cidr = %cidr, "registered");
    tracing::warn!(
        "this node-agent registers and heartbeats only: running pods and the service proxy are not built yet"
    );
    let shutdown = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("signal handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        tracing::info!("stopping: reporting NotReady");
    };
    node::run_heartbeats(client, desired, Duration::from_secs(args.heartbeat_seconds), shutdown).await;
    Ok(())
}
