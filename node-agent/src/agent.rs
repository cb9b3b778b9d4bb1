//! The node agent assembled: registration and heartbeats, watches, the pod workers, host-gw
//! routes, and the health/metrics server. `main.rs` only parses flags and calls [`run`].

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use podpath_client::reflector::{self, Filter, Store};
use podpath_client::ApiClient;

use kube_proxy::health::{self, Health};
use kubelet::cni::{self, CniRuntime, RealExec};
use kubelet::pods::{self, Deps, NetProber, PodsConfig};
use kubelet::process::LinuxProcesses;

use crate::error::{AgentError, Result};
use crate::node::{self, NodeConfig};
use crate::routes::{self, NetlinkRoutes, RouteMetrics};

/// Everything the agent is configured with.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node_name: String,
    /// The primary InternalIP (`node_ips[0]`).
    pub node_ip: IpAddr,
    /// Every InternalIP, primary family first (two on a dual-stack node).
    pub node_ips: Vec<IpAddr>,
    /// Published as the Node's ExternalIPs.
    pub node_external_ips: Vec<IpAddr>,
    pub apiserver: String,
    pub token: Option<String>,
    /// The API server's CA (PEM): TLS to the API; None: plain HTTP.
    pub ca: Option<String>,
    pub heartbeat: Duration,
    pub max_pods: u32,
    pub labels: BTreeMap<String, String>,
    pub state_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
    pub cni_bin_dirs: Vec<PathBuf>,
    /// `None`: no health server.
    pub healthz_bind: Option<SocketAddr>,
    /// kube-proxy's metrics server (`/proxyMode`, `/metrics`, `/healthz`), if any.
    pub metrics_bind: Option<SocketAddr>,
    /// The kubelet API's port on the node IP (container logs for `pods/log`); 0: none.
    pub kubelet_port: u16,
    /// Full resync period of routes (health timeout is twice this).
    pub sync_period: Duration,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    pub workload_bin: PathBuf,
    /// How a pod of the built-in `podpath/dns` image reaches the API: the agent's own
    /// `--apiserver`, `--token-file` and `--apiserver-ca-file`.
    pub api_args: Vec<String>,
    /// kubelet's `--cluster-dns` and `--cluster-domain`.
    pub cluster_dns: Vec<String>,
    /// The node's resolv.conf (kubelet's `--resolv-conf`).
    pub resolv_conf: std::path::PathBuf,
    pub cluster_domain: String,
    /// `None`: no service proxy.
    pub proxy: Option<ProxyConfig>,
    /// Enforce NetworkPolicies for this node's pods.
    pub network_policy: bool,
    /// Containers of images (None: every container is a process on the node).
    pub images: Option<kubelet::images::Images>,
}

/// How Services are implemented on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProxyMode {
    /// kube-proxy's iptables mode (DNAT in the kernel).
    Iptables,
    /// kube-proxy's nftables mode (the table `ip kube-proxy`: verdict maps and sets).
    Nftables,
    /// kube-proxy's old userspace mode (a proxy socket per service port).
    Userspace,
}

/// The service proxy's settings.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub mode: ProxyMode,
    pub backend: podpath_ruleset::Backend,
    /// The pod network, one CIDR per family.
    pub cluster_cidrs: Vec<ipnet::IpNet>,
    pub masquerade_external: bool,
    pub min_sync: Duration,
    pub nft: kube_proxy::nftables::NftConfig,
    /// kube-proxy's `--iptables-localhost-nodeports` (iptables mode).
    pub localhost_nodeports: bool,
}

/// The agent as its binary runs it, on a runtime of its own (2 worker threads), until SIGTERM
/// or SIGINT; the pods keep running. A plain function, neither generic nor async, so the whole
/// agent is compiled once, in this crate: a release build compiles generic and async code again
/// in every crate that instantiates it, and the binary would compile all of [`run`] a second time.
pub fn run_until_signal(cfg: AgentConfig) -> Result<()> {
    let shutdown = async {
        podpath_client::daemon::stop_signal().await;
        tracing::info!("stopping: reporting NotReady (pods keep running)");
    };
    podpath_client::daemon::block_on(2, run(cfg, shutdown)).map_err(|e| AgentError::io("start the async runtime", e))?
}

/// Runs the agent until `shutdown`; then reports the node NotReady and returns. Pods keep
/// running: a restarted agent adopts them.
pub async fn run(cfg: AgentConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    std::fs::create_dir_all(&cfg.state_dir)
        .map_err(|e| AgentError::io(format!("create the state directory {}", cfg.state_dir.display()), e))?;
    // One registry for the node's metrics page: kube-proxy's, the kubelet's and the routes'.
    let (mut kubelet_metrics, mut route_metrics) = (None, None);
    let metrics = Arc::new(kube_proxy::metrics::Metrics::with(|registry, sync_errors| {
        kubelet_metrics = Some(Arc::new(kubelet::metrics::Metrics::register(registry, sync_errors.clone())));
        route_metrics = Some(RouteMetrics::register(registry));
    }));
    let (kubelet_metrics, route_metrics) = (kubelet_metrics.expect("registered"), route_metrics.expect("registered"));
    let health = Health::new(cfg.sync_period * 2, metrics);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    // Bind first: a port conflict is a start-up error, not a log line later.
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = cfg.healthz_bind {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| AgentError::io(format!("listen on {addr} (--healthz-bind-address)"), e))?;
        tracing::info!(%addr, "health and metrics on /healthz, /livez, /metrics");
        tasks.spawn(health::serve(listener, health.clone(), stopped()));
    }
    if let (Some(addr), Some(p)) = (cfg.metrics_bind, &cfg.proxy) {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| AgentError::io(format!("listen on {addr} (--metrics-bind-address)"), e))?;
        let mode = match p.mode {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Nftables => "nftables",
            ProxyMode::Userspace => "userspace",
        };
        tracing::info!(%addr, mode, "kube-proxy's metrics server: /proxyMode, /metrics, /healthz");
        let configz = proxy_configz(&cfg, p, mode);
        tasks.spawn(health::serve_metrics(listener, health.clone(), mode, configz, stopped()));
    }

    // Wait for the API server as long as it takes (as kubelet does), unless told to stop.
    tokio::pin!(shutdown);
    let client = tokio::select! {
        c = ApiClient::connect_patiently(&cfg.apiserver, cfg.token.as_deref(), cfg.ca.as_deref(), None) => c?,
        () = &mut shutdown => return Ok(()),
    };
    // The lab provisioner's volumes on this node live here; the Node says where.
    let local_path_root = kubelet::localpath::root(&cfg.state_dir);
    std::fs::create_dir_all(&local_path_root)
        .map_err(|e| AgentError::io(format!("create {}", local_path_root.display()), e))?;
    let local_path_root = local_path_root.canonicalize().unwrap_or(local_path_root);
    let node_cfg = NodeConfig {
        name: cfg.node_name.clone(),
        internal_ips: cfg.node_ips.clone(),
        external_ips: cfg.node_external_ips.clone(),
        max_pods: cfg.max_pods,
        labels: cfg.labels.clone(),
        kubelet_port: cfg.kubelet_port,
        annotations: [(kubelet::localpath::ROOT_ANNOTATION.to_string(), local_path_root.display().to_string())].into(),
    };
    let desired = node::node_object(&node_cfg, &node::host_facts());
    let registered = node::register(&client, &desired).await?;
    let spec = registered.spec.as_ref();
    let mut pod_cidrs: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if pod_cidrs.is_empty() {
        pod_cidrs.extend(spec.and_then(|s| s.pod_cidr.clone()).filter(|c| !c.is_empty()));
    }
    tracing::info!(node = %cfg.node_name, pod_cidrs = ?pod_cidrs, "registered");

    let network = match cni::load_network(&cfg.cni_conf_dir)? {
        Some(n) => n,
        None if pod_cidrs.is_empty() => {
            return Err(AgentError::Config(format!(
                "no CNI configuration in {} and the API server assigned no pod CIDR to write one",
                cfg.cni_conf_dir.display()
            )))
        }
        None => cni::load_or_write_default(&cfg.cni_conf_dir, &pod_cidrs, &cfg.state_dir.join("ipam"))?,
    };
    tracing::info!(network = %network.name, config = %network.source.display(), "CNI network");

    let pods_store: Arc<Store<core::Pod>> = Store::new();
    let nodes_store: Arc<Store<core::Node>> = Store::new();
    tokio::spawn(reflector::run(
        client.clone(),
        Filter { field_selector: format!("spec.nodeName={}", cfg.node_name), ..Default::default() },
        pods_store.clone(),
    ));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), nodes_store.clone()));

    let table = NetlinkRoutes::new()?;
    routes::RouteTable::enable_forwarding(&table)?;
    tokio::spawn(sync_routes_forever(
        table,
        nodes_store,
        cfg.node_name.clone(),
        cfg.sync_period,
        health.clone(),
        route_metrics,
    ));

    let pods_cfg = PodsConfig {
        node_name: cfg.node_name.clone(),
        node_ip: cfg.node_ip,
        node_ips: cfg.node_ips.clone(),
        state_dir: cfg.state_dir.clone(),
        workload_bin: cfg.workload_bin.clone(),
        api_args: cfg.api_args.clone(),
        cluster_dns: cfg.cluster_dns.clone(),
        cluster_domain: cfg.cluster_domain.clone(),
        host_resolv: kubelet::pods::dnsconf::parse_resolv(
            &std::fs::read_to_string(&cfg.resolv_conf).unwrap_or_default(),
        ),
        backoff_base: cfg.backoff_base,
        backoff_max: cfg.backoff_max,
        images: cfg.images.clone(),
        service_account_token: cfg.token.clone(),
    };
    if cfg.kubelet_port != 0 {
        let addr = SocketAddr::new(cfg.node_ip, cfg.kubelet_port);
        // Without it only `kubectl logs` is missing: a node IP that is not (yet) on a local
        // interface is no reason to refuse to run pods.
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "kubelet API (container logs)");
                let token = cfg.token.as_deref().map(Arc::from);
                tasks.spawn(kubelet::server::serve(listener, pods_cfg.clone(), token, stopped()));
            }
            Err(e) => {
                tracing::warn!(%addr, error = %e, "cannot serve the kubelet API; kubectl logs will not reach this node")
            }
        }
    }
    let events = podpath_client::events::Recorder::start(&client, "kubelet", Some(cfg.node_name.clone()));
    // What the kubelet reads of Services: their containers' Service variables.
    let services_for_env: Arc<Store<kubelet::pods::envvars::ServiceLink>> = Store::new();
    tokio::spawn(reflector::run_mapped(
        client.clone(),
        Filter::default(),
        services_for_env.clone(),
        |s: core::Service| kubelet::pods::envvars::ServiceLink::of(&s),
    ));
    // Secrets and ConfigMaps: the pods' volumes and imagePullSecrets.
    let (secrets, config_maps): (Arc<Store<core::Secret>>, Arc<Store<core::ConfigMap>>) = (Store::new(), Store::new());
    tokio::spawn(reflector::run(client.clone(), Filter::default(), secrets.clone()));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), config_maps.clone()));
    // Claims and volumes: the pods' persistentVolumeClaim volumes, and the node's released
    // local-path volumes to delete.
    let (claims, volumes): (Arc<Store<core::PersistentVolumeClaim>>, Arc<Store<core::PersistentVolume>>) =
        (Store::new(), Store::new());
    tokio::spawn(reflector::run(client.clone(), Filter::default(), claims.clone()));
    tokio::spawn(reflector::run(client.clone(), Filter::default(), volumes.clone()));
    tokio::spawn(kubelet::localpath::run(client.clone(), volumes.clone(), cfg.node_name.clone(), local_path_root));
    let deps = Arc::new(Deps {
        cfg: pods_cfg,
        procs: LinuxProcesses::default(),
        cni: CniRuntime {
            exec: RealExec,
            bin_dirs: cfg.cni_bin_dirs.clone(),
            cache_dir: cfg.state_dir.join("cni/results"),
        },
        network,
        api: client.clone(),
        prober: NetProber,
        metrics: kubelet_metrics,
        events,
        services: services_for_env,
        secrets,
        config_maps,
        claims,
        volumes,
    });
    tokio::spawn(pods::run_pods(deps, pods_store, None));

    if cfg.network_policy {
        use netpol::{Enforcer, IptablesPolicyKernel, NftPolicyKernel, PodView};
        // The proxy's rule language: nftables mode gets a table of its own, the iptables modes
        // (and no proxy) filter-table chains through the proxy's backend.
        let nft_mode = cfg.proxy.as_ref().is_some_and(|p| p.mode == ProxyMode::Nftables);
        let backend = cfg.proxy.as_ref().map(|p| p.backend).unwrap_or(podpath_ruleset::Backend::Nft);
        let ipt = Arc::new(podpath_ruleset::kernel::IptablesKernel::new(backend));
        // One enforcer per family of the node (each with its own table or ip(6)tables chains).
        let families: Vec<bool> = cfg.node_ips.iter().map(IpAddr::is_ipv6).collect();
        {
            // The other form's rules go first (a mode change since the last run).
            let ipt = ipt.clone();
            let v6 = families.contains(&true);
            tokio::task::spawn_blocking(move || {
                let ipt6 = ipt.v6();
                let other: Option<&dyn podpath_ruleset::kernel::Kernel> = if nft_mode { Some(&*ipt) } else { None };
                netpol::cleanup(!nft_mode && netpol::nft_available(), other)?;
                if nft_mode && v6 {
                    netpol::cleanup(false, Some(&ipt6))?;
                }
                Ok::<(), netpol::NetpolError>(())
            })
            .await
            .map_err(|e| AgentError::Task(e.to_string()))??;
        }
        if !nft_mode || netpol::nft_available() {
            let (all_pods, namespaces, policies) = (Store::new(), Store::new(), Store::new());
            tokio::spawn(reflector::run_mapped(client.clone(), Filter::default(), all_pods.clone(), |p: core::Pod| {
                PodView::of(&p)
            }));
            tokio::spawn(reflector::run_mapped(
                client.clone(),
                Filter::default(),
                namespaces.clone(),
                |n: core::Namespace| netpol::namespace_labels(&n),
            ));
            tokio::spawn(reflector::run(client.clone(), Filter::default(), policies.clone()));
            let period = cfg.sync_period;
            for v6 in families {
                let node_name = cfg.node_name.clone();
                let (pods, namespaces, policies) = (all_pods.clone(), namespaces.clone(), policies.clone());
                let family = if v6 { "ip6" } else { "ip" };
                if nft_mode {
                    tracing::info!("NetworkPolicy enforcement: nftables table {family} podpath-policy");
                    let kernel = Arc::new(NftPolicyKernel::for_family(v6));
                    let e = Enforcer { kernel, node_name, pods, namespaces, policies, period, v6 };
                    tokio::spawn(netpol::run(e, None));
                } else {
                    let tool = if v6 { "ip6tables" } else { "iptables" };
                    tracing::info!(
                        backend = backend.name(),
                        "NetworkPolicy enforcement: {tool} filter chains PODPATH-POLICY"
                    );
                    let kernel = if v6 { Arc::new(ipt.v6()) } else { ipt.clone() };
                    let kernel = Arc::new(IptablesPolicyKernel { kernel });
                    let e = Enforcer { kernel, node_name, pods, namespaces, policies, period, v6 };
                    tokio::spawn(netpol::run(e, None));
                }
            }
        } else {
            tracing::warn!("no `nft` command: NetworkPolicies are not enforced on this node");
        }
    }

    kube_proxy::stall::watch(&cfg.state_dir);
    if let Some(p) = &cfg.proxy {
        use kube_proxy::model::{Family, ServiceView, SliceView};
        use kube_proxy::{nft_sync, sync, userspace};
        use podpath_ruleset::kernel::IptablesKernel;
        let kernel = Arc::new(IptablesKernel::new(p.backend));
        // The other modes' rules go first: never two proxies' rules in one namespace.
        {
            let (kernel, mode) = (kernel.clone(), p.mode);
            let v6 = cfg.node_ips.iter().any(IpAddr::is_ipv6);
            tokio::task::spawn_blocking(move || -> Result<()> {
                if mode != ProxyMode::Nftables {
                    nft_sync::cleanup_nftables();
                }
                let v6_kernel = kernel.v6();
                let kernels: Vec<&IptablesKernel> = if v6 { vec![&*kernel, &v6_kernel] } else { vec![&*kernel] };
                for k in kernels {
                    if mode != ProxyMode::Iptables {
                        sync::cleanup(k)?;
                    }
                    if mode != ProxyMode::Userspace {
                        userspace::cleanup(k)?;
                    }
                }
                Ok(())
            })
            .await
            .map_err(|e| AgentError::Task(e.to_string()))??;
        }
        if podpath_ruleset::exec::other_backend_holds(p.backend, sync::CANARY) {
            return Err(AgentError::Config(format!(
                "this namespace holds service proxy rules of the other iptables backend; remove them with \
                 `node-agent --cleanup --iptables-backend {}` or start with that backend (never both: the kernel \
                 would apply both rulesets)",
                if p.backend == podpath_ruleset::Backend::Nft { "legacy" } else { "nft" }
            )));
        }
        if p.localhost_nodeports && p.mode == ProxyMode::Iptables && cfg.node_ips.iter().any(IpAddr::is_ipv4) {
            // As kube-proxy does: 127.0.0.1 reaches NodePorts only with route_localnet
            // (this node's network namespace only; KUBE-FIREWALL drops martians).
            if let Err(e) = std::fs::write("/proc/sys/net/ipv4/conf/all/route_localnet", "1") {
                tracing::warn!("cannot set route_localnet (localhost NodePorts will not answer): {e}");
            }
        }
        // One proxier per family of the node, as kube-proxy runs on a dual-stack node: each
        // reads its family's addresses only and writes its own rules (iptables or ip6tables,
        // table ip or ip6 kube-proxy). The first serves the health-check NodePorts, on `::`
        // when the node has IPv6 (a socket that takes both families).
        let health_bind: IpAddr = if cfg.node_ips.iter().any(IpAddr::is_ipv6) {
            IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED)
        } else {
            IpAddr::from([0, 0, 0, 0])
        };
        for (i, &node_ip) in cfg.node_ips.iter().enumerate() {
            let family = Family::of(&node_ip);
            let health_check_bind = (i == 0).then_some(health_bind);
            // The caches keep what the proxy reads of each object, not the object.
            let services: Arc<Store<ServiceView>> = Store::new();
            let slices: Arc<Store<SliceView>> = Store::new();
            tokio::spawn(reflector::run_mapped(
                client.clone(),
                Filter::default(),
                services.clone(),
                move |s: core::Service| ServiceView::of_family(&s, family),
            ));
            tokio::spawn(reflector::run_mapped(
                client.clone(),
                Filter::default(),
                slices.clone(),
                move |s: k8s_openapi::api::discovery::v1::EndpointSlice| SliceView::of_family(&s, family),
            ));
            // What both kernel modes render with; nftables mode never answers NodePorts on
            // 127.0.0.1 (kube-proxy's neither), and nft always has `masquerade fully-random`.
            let render = kube_proxy::iptables::RenderConfig {
                node_name: cfg.node_name.clone(),
                node_ips: vec![node_ip],
                cluster_cidr: p.cluster_cidrs.iter().copied().find(|c| Family::of_net(c) == family),
                masquerade_external: p.masquerade_external,
                random_fully: true,
                localhost_nodeports: false,
            };
            let kernel = if family == Family::V6 { Arc::new(kernel.v6()) } else { kernel.clone() };
            match p.mode {
                ProxyMode::Iptables => {
                    let render = kube_proxy::iptables::RenderConfig {
                        random_fully: kernel.ipt.supports_random_fully(),
                        localhost_nodeports: p.localhost_nodeports,
                        ..render
                    };
                    tracing::info!(
                        mode = "iptables",
                        family = family.api_name(),
                        backend = p.backend.name(),
                        masquerade_external = p.masquerade_external,
                        "service proxy"
                    );
                    let proxier = sync::Proxier {
                        kernel,
                        render,
                        services,
                        slices,
                        health: health.clone(),
                        period: cfg.sync_period,
                        min_interval: p.min_sync,
                        health_check_bind,
                    };
                    tokio::spawn(sync::run_proxier(proxier, None));
                }
                ProxyMode::Nftables => {
                    tracing::info!(mode = "nftables", family = family.api_name(), layout = ?p.nft.layout, masquerade_external = p.masquerade_external, "service proxy");
                    let proxier = nft_sync::NftProxier {
                        kernel: Arc::new(nft_sync::NftablesKernel::for_family(family.nft())),
                        render,
                        nft: p.nft.clone(),
                        services,
                        slices,
                        health: health.clone(),
                        period: cfg.sync_period,
                        min_interval: p.min_sync,
                        health_check_bind,
                    };
                    tokio::spawn(nft_sync::run_nft_proxier(proxier, None));
                }
                ProxyMode::Userspace => {
                    tracing::info!(
                        mode = "userspace",
                        family = family.api_name(),
                        backend = p.backend.name(),
                        "service proxy"
                    );
                    let proxier = userspace::UserspaceProxier {
                        kernel,
                        node_name: cfg.node_name.clone(),
                        node_ip,
                        services,
                        slices,
                        health: health.clone(),
                        period: cfg.sync_period,
                    };
                    tokio::spawn(userspace::run(proxier, None));
                }
            }
        }
    }

    node::run_heartbeats(client, desired, cfg.heartbeat, shutdown).await;
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Keeps the routes to other nodes' pod CIDRs equal to the Node list: on every change and every
/// `period` (which repairs routes someone removed).
async fn sync_routes_forever(
    table: NetlinkRoutes,
    nodes: Arc<Store<core::Node>>,
    me: String,
    period: Duration,
    health: Arc<Health>,
    metrics: RouteMetrics,
) {
    nodes.wait_synced().await;
    let mut changes = nodes.changes();
    loop {
        let list = nodes.list();
        health.observe_node(list.iter().find(|n| n.metadata.name.as_deref() == Some(me.as_str())));
        let want = routes::desired_routes(&list, &me);
        match routes::sync_routes(&table, &want).await {
            Ok(_) => {
                health.updated();
                metrics.synced(want.len());
            }
            Err(e) => {
                tracing::warn!("route sync failed: {e}");
                health.metrics.sync_error("routes");
            }
        }
        tokio::select! {
            r = changes.changed() => {
                if r.is_err() { return; }
                health.queued();
            }
            _ = tokio::time::sleep(period) => {}
        }
    }
}

/// kubelet's `--resolv-conf`, with kubeadm's choice when none is given: systemd-resolved's
/// upstream file when /etc/resolv.conf names only its loopback stub.
pub fn resolv_conf_path(flag: &str) -> std::path::PathBuf {
    if !flag.is_empty() {
        return flag.into();
    }
    let etc = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let upstream = std::path::Path::new("/run/systemd/resolve/resolv.conf");
    if only_stub(&etc) && upstream.exists() {
        return upstream.into();
    }
    "/etc/resolv.conf".into()
}

/// Whether a resolv.conf's nameservers are all systemd-resolved's stub (127.0.0.53).
fn only_stub(text: &str) -> bool {
    let ns = kubelet::pods::dnsconf::parse_resolv(text).nameservers;
    !ns.is_empty() && ns.iter().all(|n| n == "127.0.0.53")
}

#[cfg(test)]
mod resolv_tests {
    #[test]
    fn only_the_stub_sends_kubelet_to_the_upstream_file() {
        assert!(super::only_stub("nameserver 127.0.0.53\noptions edns0\n"));
        assert!(!super::only_stub("nameserver 10.0.0.2\n"));
        assert!(!super::only_stub(""));
        assert_eq!(super::resolv_conf_path("/tmp/r.conf"), std::path::PathBuf::from("/tmp/r.conf"));
    }
}

/// A Go duration as kube-proxy's configuration prints one (`1s`, `30s`, `500ms`).
fn go_duration(d: Duration) -> String {
    if d.subsec_millis() != 0 {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs())
    }
}

/// The proxy's settings as kube-proxy's `/configz` shows its KubeProxyConfiguration.
fn proxy_configz(cfg: &AgentConfig, p: &ProxyConfig, mode: &str) -> serde_json::Value {
    let per_mode = serde_json::json!({
        "masqueradeAll": false,
        "masqueradeBit": 14,
        "minSyncPeriod": go_duration(p.min_sync),
        "syncPeriod": go_duration(cfg.sync_period),
    });
    let mut iptables = per_mode.clone();
    iptables["localhostNodePorts"] = serde_json::json!(p.localhost_nodeports);
    serde_json::json!({
        "bindAddress": "0.0.0.0",
        "clusterCIDR": p.cluster_cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(","),
        "detectLocalMode": "ClusterCIDR",
        "healthzBindAddress": cfg.healthz_bind.map(|a| a.to_string()).unwrap_or_default(),
        "hostnameOverride": cfg.node_name,
        "iptables": iptables,
        "metricsBindAddress": cfg.metrics_bind.map(|a| a.to_string()).unwrap_or_default(),
        "mode": mode,
        "nftables": per_mode,
    })
}

#[cfg(test)]
mod configz_tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(go_duration(Duration::from_secs(30)), "30s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(go_duration(Duration::from_millis(100)), "100ms");
    }
}
