//! `apiserver-lite`: binds the listeners, installs the signal handler and runs the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;

/// A Kubernetes-compatible API server for podpath labs: REST for kubectl and client libraries,
/// gRPC for podpath's node agents and load balancers, state in sled.
#[derive(Parser, Debug)]
#[command(name = "apiserver-lite", version)]
struct Args {
    /// Directory for the database (created if missing).
    #[arg(long, default_value = "/var/lib/podpath/apiserver")]
    data_dir: PathBuf,
    /// REST listen address; repeat to listen on several (e.g. host and lab namespace).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: Vec<SocketAddr>,
    /// gRPC listen address ("off" disables gRPC).
    #[arg(long, default_value = "127.0.0.1:6444")]
    grpc_listen: String,
    /// A network namespace (e.g. /run/netns/NAME) in which `--grpc-listen` and every
    /// `--netns-listen` are bound: one process serves kubectl on the host and the node agents
    /// inside a lab (a socket stays in the namespace it was created in).
    #[arg(long)]
    netns: Option<PathBuf>,
    /// REST listen address inside `--netns` (repeatable).
    #[arg(long, requires = "netns")]
    netns_listen: Vec<SocketAddr>,
    /// Address published as the `default/kubernetes` endpoint and in discovery.
    #[arg(long)]
    advertise_address: Option<SocketAddr>,
    /// ClusterIP range: one CIDR, or an IPv4 and an IPv6 CIDR separated by a comma for a
    /// dual-stack cluster (the first is the default family).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cluster_ip_range: String,
    /// NodePort range, `low-high`.
    #[arg(long, default_value = "30000-32767")]
    service_node_port_range: String,
    /// Pools of LoadBalancer ingress IPs: one CIDR, or one per family separated by a comma.
    #[arg(long, default_value = "198.51.100.0/24")]
    lb_ip_pool: String,
    /// Pod network: one CIDR, or one per family separated by a comma; each node gets one
    /// subnet of each.
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// Prefix length of each node's IPv4 pod CIDR.
    #[arg(long, alias = "node-cidr-mask-size-ipv4", default_value_t = 24)]
    node_cidr_mask_size: u8,
    /// Prefix length of each node's IPv6 pod CIDR.
    #[arg(long, default_value_t = 64)]
    node_cidr_mask_size_ipv6: u8,
    /// How long Events are kept after their last occurrence.
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    event_ttl: Duration,
    /// Seconds without a heartbeat before a node goes NotReady.
    #[arg(long, default_value = "40s", value_parser = parse_duration)]
    node_monitor_grace_period: Duration,
    /// File holding a bearer token every client must present (REST and gRPC).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Serve plain HTTP (REST and gRPC) instead of TLS: for a trusted loopback only.
    #[arg(long)]
    insecure_http: bool,
    /// Serving certificate (PEM); with `--tls-private-key-file`. Without them the server makes
    /// a lab CA and a certificate for its names and addresses in `--cert-dir`.
    #[arg(long, requires = "tls_private_key_file", conflicts_with = "insecure_http")]
    tls_cert_file: Option<PathBuf>,
    /// The serving certificate's private key (PEM).
    #[arg(long, requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Where the generated CA (`ca.crt`, for clients) and serving certificate go
    /// [default: DATA_DIR/pki].
    #[arg(long)]
    cert_dir: Option<PathBuf>,
    /// Largest accepted request body, in bytes.
    #[arg(long, default_value_t = 3 << 20)]
    max_request_bytes: usize,
    /// Events kept for resuming watches (older resourceVersions get 410 Expired).
    #[arg(long, default_value_t = crate::store::EVENT_LOG_CAPACITY)]
    event_log_capacity: usize,
    /// Log filter (RUST_LOG syntax).
    #[arg(long, env = "PODPATH_LOG", default_value = "info")]
    log: String,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.find(|c: char| !c.is_ascii_digit()).map(|i| s.split_at(i)).unwrap_or((s, "s"));
    let n: u64 = num.parse().map_err(|_| format!("invalid duration: {s}"))?;
    match unit {
        "s" | "" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n.saturating_mul(60))),
        "h" => Ok(Duration::from_secs(n.saturating_mul(3600))),
        _ => Err(format!("invalid duration unit in {s} (use ms, s, m or h)")),
    }
}

/// The ranges of the flags, checked as kube-apiserver and kube-controller-manager check them.
fn ranges_of(args: &Args) -> anyhow::Result<crate::alloc::Ranges> {
    use api::alloc::{parse_dual_cidrs, IpFamily};
    let service_cidrs =
        parse_dual_cidrs("--service-cluster-ip-range", &args.service_cluster_ip_range).map_err(anyhow::Error::msg)?;
    for net in &service_cidrs {
        // kube-apiserver's limit: at most 2^20 addresses (a /12 or a /108).
        let (bits, min) = if IpFamily::of_net(net) == IpFamily::V4 { (32, 12) } else { (128, 108) };
        if net.prefix_len() < min {
            bail!("specified --service-cluster-ip-range {net} is too large; for {bits}-bit addresses, the mask must be >= {min}");
        }
    }
    let lb_pools = parse_dual_cidrs("--lb-ip-pool", &args.lb_ip_pool).map_err(anyhow::Error::msg)?;
    let cluster_cidrs = parse_dual_cidrs("--cluster-cidr", &args.cluster_cidr).map_err(anyhow::Error::msg)?;
    for net in &cluster_cidrs {
        let (mask, flag, max) = match IpFamily::of_net(net) {
            IpFamily::V4 => (args.node_cidr_mask_size, "--node-cidr-mask-size", 30),
            IpFamily::V6 => (args.node_cidr_mask_size_ipv6, "--node-cidr-mask-size-ipv6", 126),
        };
        if mask < net.prefix_len() || mask > max || mask - net.prefix_len() > 16 {
            bail!("{flag} {mask} does not fit --cluster-cidr {net} (at most 16 bits longer than it)");
        }
    }
    Ok(crate::alloc::Ranges {
        service_cidrs,
        node_ports: parse_port_range(&args.service_node_port_range)?,
        lb_pools,
        cluster_cidrs,
        node_cidr_prefix: args.node_cidr_mask_size,
        node_cidr_prefix_v6: args.node_cidr_mask_size_ipv6,
    })
}

fn parse_port_range(s: &str) -> Result<std::ops::RangeInclusive<u16>> {
    let (lo, hi) = s.split_once('-').context("--service-node-port-range must look like 30000-32767")?;
    let (lo, hi): (u16, u16) = (lo.trim().parse()?, hi.trim().parse()?);
    if lo == 0 || lo > hi {
        bail!("--service-node-port-range {s}: the low end must be between 1 and the high end");
    }
    Ok(lo..=hi)
}

pub fn main() {
    podpath_client::memory::limit_arenas(std::thread::available_parallelism().map_or(1, |n| n.get()));
    podpath_client::memory::spawn_trimmer(std::time::Duration::from_secs(5));
    if let Err(e) = run() {
        eprintln!("apiserver-lite: {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let args = Args::parse();
    podpath_client::daemon::init_logging(&args.log);
    let token = match &args.token_file {
        Some(p) => {
            let t = std::fs::read_to_string(p).with_context(|| format!("cannot read --token-file {}", p.display()))?;
            let t = t.trim().to_string();
            if t.is_empty() {
                bail!("--token-file {} is empty", p.display());
            }
            Some(t)
        }
        None => None,
    };
    let ranges = ranges_of(&args)?;
    let mut cfg = crate::Config::new(args.data_dir.clone());
    cfg.ranges = ranges;
    cfg.controllers.node_monitor_grace = args.node_monitor_grace_period;
    cfg.controllers.event_ttl = args.event_ttl;
    // Node agents listen in the lab's network, reached from the control plane's namespace.
    cfg.kubelet_netns = args.netns.clone();
    cfg.token = token;
    cfg.max_body_bytes = args.max_request_bytes;
    cfg.advertise = args.advertise_address;
    cfg.event_log_capacity = args.event_log_capacity;
    cfg.tls = if args.insecure_http {
        None
    } else if let (Some(c), Some(k)) = (&args.tls_cert_file, &args.tls_private_key_file) {
        Some(crate::tls::identity_from_files(c, k)?)
    } else {
        // Every address the API is reached on goes in the certificate.
        let mut hosts: Vec<String> = args.listen.iter().chain(&args.netns_listen).map(|a| a.ip().to_string()).collect();
        hosts.extend(args.advertise_address.map(|a| a.ip().to_string()));
        if let Ok(a) = args.grpc_listen.parse::<SocketAddr>() {
            hosts.push(a.ip().to_string());
        }
        // `kubernetes.default`'s ClusterIPs, reached by pods.
        hosts.extend(cfg.ranges.service_cidrs.iter().map(|n| api::alloc::first_address(n).to_string()));
        hosts.retain(|h| h != "0.0.0.0");
        let dir = args.cert_dir.clone().unwrap_or_else(|| args.data_dir.join("pki"));
        Some(crate::tls::generated_identity(&dir, &hosts)?)
    };
    let mut rest = Vec::new();
    for addr in &args.listen {
        rest.push(bind(*addr)?);
    }
    for addr in &args.netns_listen {
        let ns = args.netns.as_deref().expect("clap requires --netns");
        rest.push(bind_in_netns(ns, *addr)?);
    }
    let grpc = match args.grpc_listen.as_str() {
        "off" | "" => None,
        a => {
            let addr: SocketAddr = a.parse().with_context(|| format!("invalid --grpc-listen {a}"))?;
            Some(match &args.netns {
                Some(ns) => bind_in_netns(ns, addr)?,
                None => bind(addr)?,
            })
        }
    };
    let scheme = if cfg.tls.is_some() { "https" } else { "http" };
    tracing::info!(rest = ?args.listen, grpc = %args.grpc_listen, scheme, data_dir = %args.data_dir.display(), "apiserver-lite starting");
    crate::serve_until_signal(cfg, rest, grpc)?;
    Ok(())
}

/// A non-blocking TCP listener on `addr` (the runtime takes it over).
fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Binds a TCP listener inside the network namespace at `ns`, from a short-lived thread (setns
/// moves only the calling thread, so the process itself stays where it is).
fn bind_in_netns(ns: &std::path::Path, addr: SocketAddr) -> Result<std::net::TcpListener> {
    let ns = ns.to_path_buf();
    std::thread::spawn(move || -> Result<std::net::TcpListener> {
        let f = std::fs::File::open(&ns).with_context(|| format!("cannot open --netns {}", ns.display()))?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
            .with_context(|| format!("cannot enter the network namespace {}", ns.display()))?;
        let l = std::net::TcpListener::bind(addr)
            .with_context(|| format!("cannot listen on {addr} in {}", ns.display()))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the bind thread panicked"))?
}
