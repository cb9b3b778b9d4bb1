//! `podpath-dns`: the lab's cluster DNS server (CoreDNS's role).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::corefile;
use crate::records::Config;
use crate::run::{run_until_signal, Options, Source};
use anyhow::{Context, Result};
use clap::Parser;

/// Serves the cluster zone (`<svc>.<ns>.svc.<domain>`, SRV, PTR, pods) from the API server, with
/// the CoreDNS plugins a lab needs, configured by a Corefile.
#[derive(Parser, Debug)]
#[command(name = "podpath-dns", version)]
struct Args {
    #[command(flatten)]
    api: podpath_client::daemon::ApiFlags,
    /// Where to answer, UDP and TCP (a Corefile's server blocks may name only this port).
    #[arg(long, default_value = "0.0.0.0:53")]
    listen: SocketAddr,
    /// The Corefile to run (CoreDNS's -conf), read again by its `reload` plugin.
    #[arg(long, value_name = "FILE", conflicts_with = "corefile_configmap")]
    conf: Option<PathBuf>,
    /// Run the Corefile held by this ConfigMap (key `Corefile`), watched through the API, as a
    /// CoreDNS pod runs the one its volume holds: `kube-system/coredns`.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    corefile_configmap: Option<String>,
    /// Without a Corefile: the cluster domain (kubelet's --cluster-domain).
    #[arg(long, default_value = "cluster.local", conflicts_with_all = ["conf", "corefile_configmap"])]
    cluster_domain: String,
    /// Without a Corefile: TTL of every answer, in seconds (kubeadm's Corefile sets 30).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(0..=3600),
          conflicts_with_all = ["conf", "corefile_configmap"])]
    ttl: u32,
    /// Without a Corefile: where `GET /metrics` answers (CoreDNS's port); empty: nowhere.
    #[arg(long, default_value = "0.0.0.0:9153", conflicts_with_all = ["conf", "corefile_configmap"])]
    metrics_listen: String,
    /// Without a Corefile: where `GET /health` answers; empty: nowhere.
    #[arg(long, default_value = "0.0.0.0:8080", conflicts_with_all = ["conf", "corefile_configmap"])]
    health_listen: String,
    /// Without a Corefile: where `GET /ready` answers, once the zone is built; empty: nowhere.
    #[arg(long, default_value = "0.0.0.0:8181", conflicts_with_all = ["conf", "corefile_configmap"])]
    ready_listen: String,
    /// Log filter (RUST_LOG syntax). hickory's line per query is off: the Corefile's `log`
    /// plugin prints queries, as CoreDNS's does.
    #[arg(long, env = "PODPATH_LOG", default_value = "info,hickory_server=warn")]
    log: String,
}

pub fn main() {
    podpath_client::memory::limit_arenas(1);
    if let Err(e) = start() {
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

fn start() -> Result<()> {
    let args = Args::parse();
    podpath_client::daemon::init_logging(&args.log);
    let source = if let Some(f) = args.conf.clone() {
        Source::File(f)
    } else if let Some(cm) = &args.corefile_configmap {
        let (namespace, name) = cm
            .split_once('/')
            .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
            .ok_or_else(|| anyhow::anyhow!("--corefile-configmap {cm:?} is not NAMESPACE/NAME"))?;
        Source::ConfigMap { namespace: namespace.into(), name: name.into() }
    } else {
        // Checked here so a bad flag is named, not a line of the Corefile made from it.
        let zone = Config::new(&args.cluster_domain, args.ttl).map_err(anyhow::Error::msg)?;
        Source::Builtin(corefile::builtin(
            None,
            &zone.domain.to_string(),
            args.ttl,
            addr("--health-listen", &args.health_listen)?,
            addr("--ready-listen", &args.ready_listen)?,
            addr("--metrics-listen", &args.metrics_listen)?,
        ))
    };
    let opts = Options {
        token: args.api.token()?,
        ca: args.api.ca()?,
        apiserver: args.api.apiserver,
        listen: args.listen,
        source,
    };
    run_until_signal(opts).context("podpath-dns")
}
