//! `node-agent`: makes this machine (or network namespace) a Node of a podpath lab: registers
//! it, runs the pods the scheduler gives it (sandbox + CNI + workload), routes the pod network
//! to the other nodes, proxies Services (iptables mode), and serves health and metrics.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::agent::{self, AgentConfig, ProxyMode};
use anyhow::{bail, Context, Result};
use clap::Parser;
use podpath_ruleset::Backend;

/// `--proxy-mode`: a mode, or no service proxy at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProxyModeArg {
    Iptables,
    Nftables,
    Userspace,
    None,
}

/// podpath node agent.
#[derive(Parser, Debug)]
#[command(name = "node-agent", version)]
struct Args {
    /// Name of this node.
    #[arg(long, required_unless_present_any = ["cleanup", "kill_pods"])]
    node_name: Option<String>,
    /// This node's address on the node network (its InternalIP); two, an IPv4 and an IPv6
    /// one separated by a comma, on a dual-stack node (the first is its primary family).
    #[arg(long, value_delimiter = ',', required_unless_present_any = ["cleanup", "kill_pods"])]
    node_ip: Vec<IpAddr>,
    /// The addresses clients outside the cluster reach this node at, published as its
    /// ExternalIPs (a cloud node's public address; the lab's: what its client reaches).
    #[arg(long, value_delimiter = ',')]
    node_external_ip: Vec<IpAddr>,
    #[command(flatten)]
    api: podpath_client::daemon::ApiFlags,
    /// Where the agent keeps pod records, the CNI cache, IPAM state and pod logs.
    #[arg(long, default_value = "/var/lib/podpath/node")]
    state_dir: PathBuf,
    /// CNI network configurations (the first in lexical order is used; a default for
    /// podpath-bridge + podpath-ipam with the node's pod CIDR is written when there is none).
    #[arg(long, default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Directories with CNI plugin binaries (colon-separated); default: this binary's directory,
    /// then /opt/cni/bin and /usr/lib/cni.
    #[arg(long)]
    cni_bin_dir: Option<String>,
    /// Health and metrics address (`/healthz`, `/livez`, `/metrics`); empty to disable.
    #[arg(long, default_value = "0.0.0.0:10256")]
    healthz_bind_address: String,
    /// kube-proxy's metrics server (`/proxyMode`, `/metrics`, `/healthz`), as kube-proxy's
    /// `--metrics-bind-address`; empty to disable.
    #[arg(long, default_value = "127.0.0.1:10249")]
    metrics_bind_address: String,
    /// Port of the kubelet API (container logs for `kubectl logs`) on `--node-ip`; 0 disables.
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
    /// Seconds between heartbeats.
    #[arg(long, default_value_t = 10)]
    heartbeat_seconds: u64,
    /// Seconds between full route resyncs (the health timeout is twice this).
    #[arg(long, default_value_t = 30)]
    sync_period_seconds: u64,
    /// First delay before restarting a crashed container, in seconds (doubles up to 300).
    #[arg(long, default_value_t = 10.0)]
    restart_backoff_seconds: f64,
    /// Pods this node accepts (its `pods` capacity).
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// A label of the Node (repeatable, KEY=VALUE).
    #[arg(long = "node-label")]
    node_labels: Vec<String>,
    /// Service proxy mode: `iptables` (kube-proxy's iptables mode), `nftables` (its nftables
    /// mode: the table `ip kube-proxy`), `userspace` (its old userspace mode: a proxy socket per
    /// service port) or `none`. Starting in one mode removes the others' rules.
    #[arg(long, value_enum, default_value_t = ProxyModeArg::Iptables)]
    proxy_mode: ProxyModeArg,
    /// The nftables mode's rule layout: `current` (kube-proxy v1.36+: one `numgen … map` DNAT
    /// rule per Service), `v1.34` (per-endpoint chains, `mark-for-masquerade`) or `shared-maps`
    /// (podpath's: plain Services are elements of shared maps, one DNAT rule per endpoint count).
    #[arg(long, default_value = "current")]
    nftables_layout: String,
    /// kube-proxy's `--iptables-localhost-nodeports`: NodePorts answer on 127.0.0.1 too
    /// (`route_localnet` in this node's namespace, martian localnet packets dropped by
    /// KUBE-FIREWALL); `false` excludes 127.0.0.0/8 from NodePorts. iptables mode only.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    iptables_localhost_nodeports: bool,
    /// The Service CIDRs (comma-separated): in nftables mode, traffic to an address in them
    /// that no Service holds is dropped, as kube-proxy does with the cluster's ServiceCIDRs.
    #[arg(long, value_delimiter = ',')]
    service_cluster_ip_range: Vec<String>,
    /// iptables backend (never both in one namespace).
    #[arg(long, value_enum, default_value_t = Backend::Nft)]
    iptables_backend: Backend,
    /// The pod network (one CIDR, or one per family separated by a comma): traffic to a
    /// ClusterIP from outside it is masqueraded.
    #[arg(long, value_delimiter = ',', default_value = "10.244.0.0/16")]
    cluster_cidr: Vec<String>,
    /// Lab knob: `false` leaves out the masquerade of external traffic (scenario 4 then breaks,
    /// which is the point of the exercise).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    masquerade: bool,
    /// Minimum seconds between two proxy syncs (kube-proxy's minSyncPeriod).
    #[arg(long, default_value_t = 0.0)]
    min_sync_seconds: f64,
    /// Remove every iptables chain and rule the proxy created in this namespace, then exit.
    #[arg(long)]
    cleanup: bool,
    /// SIGKILL every pod process recorded under --state-dir (sandboxes and workloads, each
    /// checked against its start time), wait until they are gone, then exit. Pods outlive their
    /// agent on purpose; this is how a lab or a test that goes away stops them.
    #[arg(long, conflicts_with = "cleanup")]
    kill_pods: bool,
    /// kubelet's `--cluster-dns`: the DNS server(s) of `ClusterFirst` pods, comma-separated
    /// (kubeadm: the tenth address of the service range). Empty: pods use the node's resolver.
    #[arg(long, value_delimiter = ',')]
    cluster_dns: Vec<std::net::IpAddr>,
    /// kubelet's `--cluster-domain`: the domain pods search in.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// kubelet's `--resolv-conf`: the node's resolver settings, which `Default` pods (the
    /// cluster DNS's own) get. Empty: /etc/resolv.conf, or systemd-resolved's upstream file
    /// when /etc/resolv.conf only names its 127.0.0.53 stub (as kubeadm picks it: a DNS pod
    /// forwarding to 127.0.0.53 would reach itself, CoreDNS's loop).
    #[arg(long, default_value = "")]
    resolv_conf: String,
    /// Enforce NetworkPolicies for this node's pods (nftables table `ip podpath-policy`, in
    /// every proxy mode); `false` leaves every pod unisolated, as a cluster without a policy
    /// implementation does.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    network_policy: bool,
    /// The lab's image store (shared by its nodes): with --image-service, containers of images
    /// run with an OCI runtime; without, every container is a process on the node.
    #[arg(long, requires = "image_service")]
    image_store: Option<PathBuf>,
    /// The lab's image service socket (`podpath-images`), which pulls into --image-store.
    #[arg(long, requires = "image_store")]
    image_service: Option<PathBuf>,
    /// The OCI runtime that runs containers of images.
    #[arg(long, default_value = "crun")]
    oci_runtime: PathBuf,
    /// busybox, alpine, debian and ubuntu images run the node's own programs instead of being
    /// pulled (labs without a registry; what podpath did before it ran images).
    #[arg(long)]
    host_programs: bool,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "PODPATH_LOG", default_value = "info")]
    log: String,
}

pub fn main() {
    podpath_client::memory::limit_arenas(1);
    if let Err(e) = run() {
        eprintln!("node-agent: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    podpath_client::daemon::init_logging(&args.log);
    let backend = args.iptables_backend;
    if args.kill_pods {
        let killed = kubelet::pods::kill_recorded_processes(&args.state_dir);
        println!("killed {killed} pod processes recorded in {}", args.state_dir.display());
        return Ok(());
    }
    if args.cleanup {
        let kernel = podpath_ruleset::kernel::IptablesKernel::new(backend);
        kube_proxy::userspace::cleanup(&kernel)?;
        kube_proxy::sync::cleanup(&kernel)?;
        let nft_removed = kube_proxy::nft_sync::cleanup_nftables();
        netpol::cleanup(netpol::nft_available(), Some(&kernel))?;
        println!(
            "removed the service proxy's iptables chains and rules ({} backend){}",
            backend.name(),
            if nft_removed { " and its nftables table ip kube-proxy" } else { "" }
        );
        return Ok(());
    }
    let layout: kube_proxy::nftables::Layout =
        args.nftables_layout.parse().map_err(|e: String| anyhow::anyhow!("--nftables-layout: {e}"))?;
    let mut service_cidrs = vec![];
    for c in &args.service_cluster_ip_range {
        service_cidrs.push(
            c.parse::<ipnet::IpNet>().with_context(|| format!("--service-cluster-ip-range {c:?} is not a CIDR"))?,
        );
    }
    let mode = match args.proxy_mode {
        ProxyModeArg::Iptables => Some(ProxyMode::Iptables),
        ProxyModeArg::Nftables => Some(ProxyMode::Nftables),
        ProxyModeArg::Userspace => Some(ProxyMode::Userspace),
        ProxyModeArg::None => None,
    };
    let proxy = match mode {
        Some(mode) => Some(agent::ProxyConfig {
            mode,
            backend,
            cluster_cidrs: args
                .cluster_cidr
                .iter()
                .map(|c| c.parse().with_context(|| format!("--cluster-cidr {c:?} is not a CIDR")))
                .collect::<Result<_>>()?,
            masquerade_external: args.masquerade,
            min_sync: Duration::from_secs_f64(args.min_sync_seconds.max(0.0)),
            nft: kube_proxy::nftables::NftConfig { layout, service_cidrs },
            localhost_nodeports: args.iptables_localhost_nodeports,
        }),
        None => None,
    };
    if args.heartbeat_seconds == 0 || args.sync_period_seconds == 0 {
        bail!("--heartbeat-seconds and --sync-period-seconds must be at least 1");
    }
    if !(args.restart_backoff_seconds > 0.0 && args.restart_backoff_seconds <= 300.0) {
        bail!("--restart-backoff-seconds must be in (0, 300]");
    }
    let token = args.api.token()?;
    let ca = args.api.ca()?;
    let mut labels = BTreeMap::new();
    for l in &args.node_labels {
        let (k, v) = l.split_once('=').with_context(|| format!("--node-label {l:?} is not KEY=VALUE"))?;
        labels.insert(k.to_string(), v.to_string());
    }
    let healthz_bind: Option<SocketAddr> = match args.healthz_bind_address.as_str() {
        "" => None,
        a => Some(a.parse().with_context(|| format!("--healthz-bind-address {a:?} is not IP:PORT"))?),
    };
    let metrics_bind: Option<SocketAddr> = match args.metrics_bind_address.as_str() {
        "" => None,
        a => Some(a.parse().with_context(|| format!("--metrics-bind-address {a:?} is not IP:PORT"))?),
    };
    let exe_dir = std::env::current_exe()?.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    let cni_bin_dirs = match &args.cni_bin_dir {
        Some(dirs) => std::env::split_paths(dirs).collect(),
        None => vec![exe_dir.clone(), "/opt/cni/bin".into(), "/usr/lib/cni".into()],
    };
    let api_args = args.api.to_args();
    let node_ips = args.node_ip.clone();
    match node_ips.as_slice() {
        [_] => {}
        [a, b] if a.is_ipv4() != b.is_ipv4() => {}
        _ => bail!("--node-ip: one address, or an IPv4 and an IPv6 address separated by a comma"),
    }
    let cfg = AgentConfig {
        node_name: args.node_name.unwrap_or_default(),
        node_ip: node_ips[0],
        node_ips: node_ips.clone(),
        node_external_ips: args.node_external_ip.clone(),
        apiserver: args.api.apiserver,
        token,
        ca,
        heartbeat: Duration::from_secs(args.heartbeat_seconds),
        max_pods: args.max_pods,
        labels,
        state_dir: args.state_dir.clone(),
        cni_conf_dir: args.cni_conf_dir,
        cni_bin_dirs,
        healthz_bind,
        metrics_bind,
        kubelet_port: args.kubelet_port,
        sync_period: Duration::from_secs(args.sync_period_seconds),
        backoff_base: Duration::from_secs_f64(args.restart_backoff_seconds),
        backoff_max: Duration::from_secs(300),
        workload_bin: kubelet::process::workload_binary()?,
        api_args,
        cluster_dns: args.cluster_dns.iter().map(|ip| ip.to_string()).collect(),
        resolv_conf: crate::agent::resolv_conf_path(&args.resolv_conf),
        cluster_domain: args.cluster_domain.trim_end_matches('.').to_string(),
        proxy,
        network_policy: args.network_policy,
        images: match (args.image_store, args.image_service) {
            (Some(store), Some(service)) => Some(kubelet::images::Images {
                store: image::Store::open(&store).map_err(|e| anyhow::anyhow!("--image-store: {e}"))?,
                service,
                runtime: args.oci_runtime,
                runtime_root: args.state_dir.join("crun"),
                host_programs: args.host_programs,
            }),
            _ => None,
        },
    };
    agent::run_until_signal(cfg)?;
    Ok(())
}
