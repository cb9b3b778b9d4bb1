//! `lb-sim`: the lab's gateway between the "internet" client and the nodes, and its cloud-style
//! load balancers (passthrough routes or NodePort proxies) with health checks.

use std::net::SocketAddr;

use crate::model::Mode;
use crate::run::{self, Config};
use anyhow::{Context, Result};
use clap::Parser;

/// podpath's simulated gateway and load balancers.
#[derive(Parser, Debug)]
#[command(name = "lb-sim", version)]
struct Args {
    #[command(flatten)]
    api: podpath_client::daemon::ApiFlags,
    /// `passthrough`: route LoadBalancer IPs and externalIPs to healthy nodes, packets
    /// unchanged (GKE/MetalLB style). `nodeport`: proxy `LB IP:port` to `node IP:nodePort` of
    /// healthy nodes (classic cloud LB); externalIPs are still routed.
    #[arg(long, value_enum, default_value_t = Mode::Passthrough)]
    mode: Mode,
    /// Address of the JSON status endpoint (`GET /status`); empty to disable.
    #[arg(long, default_value = "127.0.0.1:9900")]
    status_listen: String,
    /// kube-proxy's health port on the nodes (checked for `externalTrafficPolicy: Cluster`).
    #[arg(long, default_value_t = 10256)]
    node_health_port: u16,
    /// Remove lb-sim's routes and addresses from this namespace, then exit.
    #[arg(long)]
    cleanup: bool,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "PODPATH_LOG", default_value = "info")]
    log: String,
}

pub fn main() {
    podpath_client::memory::limit_arenas(1);
    if let Err(e) = start() {
        eprintln!("lb-sim: {e:#}");
        std::process::exit(1);
    }
}

fn start() -> Result<()> {
    let args = Args::parse();
    podpath_client::daemon::init_logging(&args.log);
    if args.cleanup {
        let n = crate::routing::cleanup()?;
        println!("removed lb-sim's routes, nexthops and addresses ({n} changes)");
        return Ok(());
    }
    let mode = args.mode;
    let status_listen: Option<SocketAddr> = match args.status_listen.as_str() {
        "" => None,
        a => Some(a.parse().with_context(|| format!("--status-listen {a:?} is not IP:PORT"))?),
    };
    let token = args.api.token()?;
    let ca = args.api.ca()?;
    let cfg = Config {
        apiserver: args.api.apiserver,
        token,
        ca,
        mode,
        status_listen,
        node_health_port: args.node_health_port,
    };
    run::run_gateway(cfg)?;
    Ok(())
}
