//! `podpath`: all-in-one multi-node labs in network namespaces.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use podpath_lab as lab;
use podpath_lab::{LbMode, ProxyMode};

#[derive(Parser)]
#[command(name = "podpath", version, about = "Kubernetes service networking labs on one Linux host")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args)]
struct Which {
    /// The lab's name (two labs with different names run side by side).
    #[arg(long, env = "PODPATH_LAB", default_value = "lab", global = true)]
    name: String,
    /// Where the lab keeps its state (default /var/lib/podpath/NAME).
    #[arg(long, env = "PODPATH_STATE_DIR", global = true)]
    state_dir: Option<PathBuf>,
}

impl Which {
    fn dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| lab::default_state_dir(&self.name))
    }
    fn state(&self) -> Result<lab::LabState> {
        lab::load_state(&self.dir())?.with_context(|| {
            format!("no lab named {:?} (start one with `sudo podpath up --name {}`)", self.name, self.name)
        })
    }
}

/// `--vagrant[=DIR]`: the command acts on the Vagrant lab of the Vagrantfile in DIR (default:
/// here) instead of a namespace lab. The `=` is required, so `--vagrant` never takes the
/// command's next argument (a URL, a machine) for DIR.
#[derive(clap::Args)]
struct OnVagrant {
    /// Act on the Vagrant lab (VMs) of the Vagrantfile in DIR [default: .], over `vagrant
    /// ssh-config`'s SSH and the kubeconfig in DIR/.vagrant/podpath/.
    #[arg(long, value_name = "DIR", num_args = 0..=1, require_equals = true, default_missing_value = ".", global = true)]
    vagrant: Option<PathBuf>,
}

impl OnVagrant {
    fn lab(&self) -> Result<Option<lab::vagrant::VagrantLab>> {
        Ok(match &self.vagrant {
            Some(dir) => Some(lab::vagrant::VagrantLab::open(dir)?),
            None => None,
        })
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Build the lab: namespaces, API server, one node agent per node, the gateway's lb-sim;
    /// wait until every node is Ready and the cluster DNS answers on each.
    Up {
        #[command(flatten)]
        which: Which,
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Service proxy of the nodes.
        #[arg(long, value_enum, default_value_t = ProxyMode::Iptables)]
        proxy_mode: ProxyMode,
        /// With `--proxy-mode nftables`: kube-proxy's rule layout, `current` (v1.36+: one
        /// `numgen … map` DNAT rule per Service), `v1.34` (per-endpoint chains) or
        /// `shared-maps` (podpath's layout for scale: plain Services are map elements only).
        #[arg(long, default_value = "current", value_parser = ["current", "v1.36", "v1.34", "shared-maps"])]
        nftables_layout: String,
        /// How the gateway delivers LoadBalancer IPs.
        #[arg(long, value_enum, default_value_t = LbMode::Passthrough)]
        lb_mode: LbMode,
        /// `false`: the nodes do not masquerade external traffic they forward to pods on other
        /// nodes (requests through a node without the pod then time out: the lesson of the
        /// "networking 101" walkthrough).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        masquerade: bool,
        /// The cluster's IP families: `ipv4`, `ipv6` (Services, pods and nodes' InternalIPs
        /// IPv6 only) or `dual` (both, IPv4 primary), as kind's `ipFamily`.
        #[arg(long, value_enum, default_value_t = lab::family::IpFamilyMode::Ipv4)]
        ip_family: lab::family::IpFamilyMode,
        /// Host port for kubectl (default: a free one).
        #[arg(long, default_value_t = 0)]
        api_port: u16,
        /// REGISTRY=URL: pull REGISTRY's images from a mirror (repeatable), as containerd's
        /// hosts.toml does: `docker.io=http://10.0.0.5:5000` (http:// means plain HTTP).
        #[arg(long = "registry-mirror", env = "PODPATH_REGISTRY_MIRROR", value_delimiter = ',')]
        registry_mirrors: Vec<String>,
        /// HOST or HOST:PORT of a registry spoken to over plain HTTP (repeatable).
        #[arg(long = "plain-http-registry")]
        plain_http_registries: Vec<String>,
        /// busybox, alpine, debian and ubuntu images run the nodes' own programs instead of
        /// being pulled (for labs with no registry at hand; podpath's behaviour before images).
        #[arg(long)]
        host_programs: bool,
        /// The image store's bound on disk (`10Gi`, `500Mi`, `20G`; `0`: none). Past it after a
        /// pull or load, images no container uses are removed, least recently used first, down
        /// to 80% of it, as kubelet's image garbage collection keeps a disk.
        #[arg(long, env = "PODPATH_IMAGE_STORE_LIMIT", default_value = "10Gi", value_parser = lab::parse_size)]
        image_store_limit: u64,
    },
    /// Check this machine: root, the tools the lab runs, and the kernel features it needs
    /// (tried in a throwaway network namespace); say what to install. Exit 1 when not ready.
    Doctor,
    /// Install a cluster add-on through a running API server, as `kubeadm init phase addon`
    /// does (`podpath up` installs them itself; this is for clusters it did not start, such as
    /// the VM lab, whose control plane runs it). Existing objects are kept.
    Addon {
        #[command(subcommand)]
        addon: AddonCmd,
    },
    /// What `podpath trace --vagrant` runs on a lab machine (the probe, the monitors' sync
    /// datagrams); not for use by hand.
    #[command(hide = true)]
    TraceHelper {
        #[command(subcommand)]
        what: TraceHelperCmd,
    },
    /// Show the lab's processes and nodes.
    Status {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
    },
    /// Run a command on a host of the lab: client, gateway, control-plane, node-N or pod/NS/NAME.
    Exec {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        host: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// curl from the external client (extra curl options may follow the URL).
    Curl {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        url: String,
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        curl_args: Vec<String>,
    },
    /// Follow one real HTTP request through the lab, hop by hop and rule by rule: the kernel's
    /// trace of every rule its first packet hits on each host, each host's NAT of it
    /// (conntrack), the routes taken, and the Kubernetes objects behind them.
    Trace {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        // The help text reads as typed (a URL, brackets), not as rustdoc markup.
        #[allow(rustdoc::bare_urls, rustdoc::broken_intra_doc_links)]
        /// http://HOST[:PORT]/PATH or HOST:PORT: a LoadBalancer, external, cluster, node or pod
        /// IP, or (with --from pod/…) a name the pod's resolver looks up first, shown in the
        /// trace (http://web.default/).
        target: String,
        /// Where the request starts: client, gateway, node-N or pod/NAMESPACE/NAME.
        #[arg(long, default_value = "client")]
        from: String,
        /// text (coloured on a terminal), json, or svg (a picture of the hops; redirect it to a
        /// file and open that in a browser).
        #[arg(long, short, default_value = "text")]
        output: String,
        /// Give up on the request after this many seconds.
        #[arg(long, default_value_t = 3.0)]
        timeout: f64,
        /// The Host header to send instead of the URL's host (for routes an Ingress or a
        /// Gateway picks by hostname), as curl's `-H 'Host: NAME'`.
        #[arg(long, value_name = "NAME")]
        host: Option<String>,
    },
    /// Explain a Service's rules on every node, without sending anything: each chain the
    /// Service has, each rule in words, and the share of new connections each endpoint gets.
    /// `explain networkpolicy NAME`: the pods a policy isolates, what each of its rules
    /// admits (resolved to pods and ports) and the rules every node wrote for it.
    /// `explain gateway NAME`: a Gateway's conditions, listeners and attached routes, and the
    /// rules the lab's gateway serves for it (matches, filters, backends' weights, endpoints).
    Explain {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        /// `[service] NAME`, `networkpolicy NAME` or `gateway NAME` (NAME or NAMESPACE/NAME,
        /// namespace default).
        #[arg(num_args = 1..=2, required = true)]
        target: Vec<String>,
        /// text or json.
        #[arg(long, short, default_value = "text")]
        output: String,
    },
    /// Print the service proxy's rules of every node; with --watch, the rule changes on every
    /// node after each change of a Service or EndpointSlice (e.g. scaling 2 → 3 replicas moves
    /// the probabilities 1/2 → 1/3).
    Rules {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        /// Keep watching and print each change.
        #[arg(long)]
        watch: bool,
        /// With --watch: stop after this many reports.
        #[arg(long, requires = "watch")]
        count: Option<usize>,
    },
    /// Print a component's log: apiserver-lite, images, lb-sim or node-N.
    Logs {
        #[command(flatten)]
        which: Which,
        component: String,
    },
    /// `gateway-api install`: the Gateway API's standard kinds (GatewayClass, Gateway,
    /// HTTPRoute, GRPCRoute, ReferenceGrant) for a lab without the internet — podpath's own
    /// CRDs, whose schemas keep what the lab's gateway reads — and the GatewayClass `podpath`.
    /// With the internet, apply the released standard-install.yaml instead (it applies
    /// unchanged); `install` then only adds the GatewayClass.
    GatewayApi {
        #[command(flatten)]
        which: Which,
        /// `install`.
        action: String,
    },
    /// Print the path of the lab's kubeconfig.
    Kubeconfig {
        #[command(flatten)]
        which: Which,
    },
    /// `agent restart NODE`: stop a node's agent and start it again with the same command line;
    /// its pods keep running (as a kubelet's do) and the new agent adopts them.
    Agent {
        #[command(flatten)]
        which: Which,
        #[arg(value_parser = ["restart"])]
        action: String,
        /// node-1 … node-N.
        node: String,
    },
    /// `node add`: one more node joins the running lab (node-N+1, with its siblings' settings;
    /// DaemonSets put their pods on it, the scheduler places new pods there). `node stop NODE`:
    /// the node goes down as one losing power does (its agent killed without a word, its pods'
    /// processes killed: NotReady after the grace period, its pods then not ready); `node start
    /// NODE` brings it back (the agent recreates the pods); `node restart NODE` does both.
    Node {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        #[arg(value_parser = ["add", "stop", "start", "restart"])]
        action: String,
        /// node-1 … node-N (not with `add`: the new node is named for you).
        node: Option<String>,
    },
    /// Break the network of a node on purpose and watch the cluster cope: its uplink down, a
    /// blackhole route, packet loss, delay. `fault list` shows what is in force; `fault clear`
    /// (and `down`) undoes it.
    Fault {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        #[command(subcommand)]
        what: FaultCmd,
    },
    /// Watch the cluster cope: a line, with the time since the watch started, for every change
    /// of the nodes' readiness, the pods, the Services' ready endpoints, the load balancer's
    /// rotation, the agents' health and rule repairs, and the faults in force (Ctrl-C ends it).
    Watch {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        /// How often the lab is read.
        #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u64).range(50..=10_000))]
        interval_ms: u64,
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<f64>,
    },
    /// NetworkPolicy tools: `policy matrix` has every pod probe every other and prints who
    /// reaches whom, as the upstream netpol tests print it (rows from, columns to, `.` connected,
    /// `X` not).
    Policy {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        #[command(subcommand)]
        what: PolicyCmd,
    },
    /// The lab's images (one store shared by its nodes; on VMs, each node's own): list, pull,
    /// remove, load an archive.
    Image {
        #[command(flatten)]
        which: Which,
        #[command(flatten)]
        on: OnVagrant,
        /// Act on this image store instead of the lab's (a VM node's: /var/lib/podpath/images).
        #[arg(long, value_name = "DIR", requires = "socket", conflicts_with = "vagrant")]
        store: Option<PathBuf>,
        /// With --store: its image service's socket (pulls go through it).
        #[arg(long, value_name = "PATH", requires = "store")]
        socket: Option<PathBuf>,
        #[command(subcommand)]
        what: ImageCmd,
    },
    /// A live picture of the lab in a browser: hosts, nodes, pods and Services as the API and
    /// the lab have them, a request's path animated rule by rule, a Service's rules, the
    /// NetworkPolicy matrix, and faults at a click beside `watch`'s timeline. Prints a link with
    /// a one-time code (the page otherwise asks for the lab's token); Ctrl-C ends it.
    Ui {
        #[command(flatten)]
        which: Which,
        /// Where to listen (loopback by default; port 0: a free one).
        #[arg(long, default_value = "127.0.0.1:8765")]
        listen: std::net::SocketAddr,
    },
    /// Stop every process of the lab and remove its namespaces and state.
    Down {
        #[command(flatten)]
        which: Which,
        /// Keep the state directory (API data, logs).
        #[arg(long)]
        keep_data: bool,
        /// Remove the lab's image store too (kept by default: the next lab pulls nothing again).
        #[arg(long, conflicts_with = "keep_data")]
        purge_images: bool,
    },
}

#[derive(Subcommand)]
enum TraceHelperCmd {
    /// One sync datagram to the loopback's discard port with the probe's DSCP, from a source
    /// port not in --avoid; prints that port.
    Canary {
        #[arg(long, value_delimiter = ',')]
        avoid: Vec<u16>,
        #[arg(long)]
        v6: bool,
    },
    /// `podpath policy matrix --vagrant`'s probes from a pod's namespace: every target
    /// (tcp/ADDRESS:PORT, udp/…) at once; prints `TARGET ok|no` per line.
    Connect {
        #[arg(long)]
        timeout_ms: u64,
        targets: Vec<String>,
    },
    /// The probe: one HTTP request with the probe's DSCP from --port; prints the outcome as JSON.
    Probe {
        #[arg(long)]
        port: u16,
        #[arg(long)]
        dst: std::net::SocketAddr,
        #[arg(long)]
        path: String,
        #[arg(long)]
        host: String,
        #[arg(long)]
        timeout_ms: u64,
    },
}

#[derive(Subcommand)]
enum AddonCmd {
    /// The cluster DNS: the `kube-system/kube-dns` Service at --cluster-dns, the `coredns`
    /// ConfigMap and a Deployment of `podpath/dns` pods. Nodes' agents take the same address
    /// as `--cluster-dns`.
    Dns {
        /// The API server: https://HOST:PORT.
        #[arg(long)]
        server: String,
        /// The CA certificate (PEM) that signed the API server's certificate.
        #[arg(long)]
        certificate_authority: Option<PathBuf>,
        /// A file holding the bearer token the API server wants.
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The kube-dns Service's ClusterIP (kubeadm's: the tenth address of the Service range).
        #[arg(long, default_value = lab::dns::CLUSTER_DNS)]
        cluster_dns: std::net::IpAddr,
    },
}

#[derive(Subcommand)]
enum ImageCmd {
    /// List the stored images, and the disk the store takes.
    Ls,
    /// Pull an image into the lab's store (through its image service and mirrors).
    Pull { image: String },
    /// Remove images (the layers no other image or running container uses go too).
    Rm {
        #[arg(required = true)]
        images: Vec<String>,
    },
    /// Load the images of an archive: `docker save` (manifest.json) or an OCI layout
    /// (`skopeo copy … oci-archive:`), gzipped or not — no registry needed.
    Load { file: PathBuf },
}

#[derive(Subcommand)]
enum PolicyCmd {
    /// Probe every pod pair of the namespaces on the ports and protocols.
    Matrix {
        /// Namespaces (comma-separated; default: every namespace but kube-system).
        #[arg(long, value_delimiter = ',')]
        namespaces: Vec<String>,
        /// Ports (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "80")]
        ports: Vec<u16>,
        /// tcp and/or udp (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "tcp")]
        protocols: Vec<String>,
        /// How long a probe waits for a connection or an answer.
        #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(10..=10_000))]
        timeout_ms: u64,
        /// text or json.
        #[arg(long, short, default_value = "text")]
        output: String,
    },
}

#[derive(Subcommand)]
enum FaultCmd {
    /// Take a node's uplink (eth0) down, or bring it back up.
    Link {
        #[arg(value_parser = ["down", "up"])]
        state: String,
        /// node-1 … node-N.
        node: String,
    },
    /// Cut a node off from a CIDR (packets to it and from it are discarded).
    Blackhole { node: String, cidr: String },
    /// Drop PERCENT of the packets in and out of a node's uplink, at random (nftables).
    Loss {
        node: String,
        #[arg(value_parser = clap::value_parser!(u8).range(1..=100))]
        percent: u8,
    },
    /// Delay every packet out of a node's uplink (tc netem; refused where the kernel has none).
    Delay {
        node: String,
        #[arg(value_parser = clap::value_parser!(u32).range(1..=60_000))]
        ms: u32,
    },
    /// Stall a node's service proxy: it stops syncing rules (for SECONDS, or until `fault
    /// clear`) while the node and its pods keep running, as a hung kube-proxy does.
    Stall {
        #[arg(value_parser = ["proxy"])]
        what: String,
        /// node-1 … node-N.
        node: String,
        #[arg(value_parser = clap::value_parser!(u32).range(1..=86_400))]
        seconds: Option<u32>,
    },
    /// Flush a node's service proxy rules (iptables nat table, or the nftables table) and
    /// report when its agent rewrote them.
    FlushRules { node: String },
    /// Kill a pod's workload process (`kill pod NS/NAME`); its restart policy takes over.
    Kill {
        #[arg(value_parser = ["pod"])]
        kind: String,
        /// NAMESPACE/NAME.
        target: String,
    },
    /// The faults in force.
    List,
    /// Undo every fault (or a node's).
    Clear { node: Option<String> },
}

fn main() {
    // Run under the name of one of the lab's programs (a link in a lab's `bin/`), podpath is it.
    if let Some((_, main)) = std::env::args_os().next().and_then(|a| lab::multicall::program(&a.to_string_lossy())) {
        return main();
    }
    if let Err(e) = run() {
        eprintln!("podpath: {e:#}");
        std::process::exit(1);
    }
}

fn exec(argv: &[String]) -> Result<()> {
    let status = Command::new(&argv[0]).args(&argv[1..]).status().with_context(|| format!("cannot run {}", argv[0]))?;
    std::process::exit(status.code().unwrap_or(1));
}

/// `podpath status --vagrant`: each machine's components, the nodes' readiness from the API,
/// the gateway's load balancers.
fn vagrant_status(v: &lab::vagrant::VagrantLab) -> Result<()> {
    let api = v.api()?;
    let ready = lab::up::ready_nodes(&api);
    println!("Vagrant lab in {}: {} machines running, API {}", v.dir.display(), v.machines.len(), api.addr);
    println!("{:<16} {:<16} {:>8}  {:<8} NODE", "MACHINE", "COMPONENT", "PID", "STATE");
    for (m, services) in v.services() {
        let node = if !m.starts_with("node-") {
            ""
        } else if ready.contains(&m) {
            "Ready"
        } else {
            "NotReady"
        };
        match services {
            Ok(list) if list.is_empty() => println!("{m:<16} {:<16} {:>8}  {:<8} {node}", "-", "", ""),
            Ok(list) => {
                for s in list {
                    let state = if s.active { "running" } else { "dead" };
                    println!("{m:<16} {:<16} {:>8}  {state:<8} {node}", s.name, s.pid);
                }
            }
            Err(e) => println!("{m:<16} unreachable: {e}"),
        }
    }
    let lb = v
        .run("gateway", &["curl", "-sS", "--max-time", "3", &format!("http://{}/status", lab::state::LB_STATUS)])
        .map_err(anyhow::Error::from)
        .and_then(|body| serde_json::from_str::<serde_json::Value>(&body).context("lb-sim's status is not JSON"));
    match lb {
        Ok(doc) => print!("\n{}", lab::lb_table(&doc)),
        Err(e) => println!("\nload balancers: unknown ({e:#})"),
    }
    Ok(())
}

/// `podpath node stop|start|restart --vagrant`: the node's agent and its pods, as on the
/// namespace lab (the VM itself keeps running: `vagrant halt` stops it).
fn vagrant_node(v: &lab::vagrant::VagrantLab, action: &str, node: Option<String>) -> Result<()> {
    if action == "add" {
        bail!("on the Vagrant lab a node joins with `LAB_NODES=N vagrant up`");
    }
    let node = node.with_context(|| format!("`node {action}` needs a NODE (node-1 … node-N)"))?;
    if !node.starts_with("node-") {
        bail!("{node:?} is not a node (node-1 … node-N)");
    }
    v.machine(&node)?;
    if action != "start" {
        v.run(&node, &["sh", "-c", lab::vagrant::STOP_NODE_SCRIPT])?;
        println!("{node}: stopped (its agent and its pods' processes)");
    }
    if action != "stop" {
        let t = std::time::Instant::now();
        v.run(&node, &["sh", "-c", lab::vagrant::START_NODE_SCRIPT])?;
        let api = v.api()?;
        while !lab::up::ready_nodes(&api).contains(&node) {
            if t.elapsed() > Duration::from_secs(60) {
                bail!("{node}: its agent started, but the node is not Ready after 60 s (`podpath status --vagrant`)");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        println!("{node}: started; the node Ready {:.1} s later", t.elapsed().as_secs_f64());
    }
    Ok(())
}

/// `podpath fault …`, on a namespace lab or (with `vagrant`) on a Vagrant lab's VMs.
fn fault(which: &Which, vagrant: Option<lab::vagrant::VagrantLab>, what: FaultCmd) -> Result<()> {
    use lab::fault::{self, Request};
    // Where the lab records its faults.
    let dir = || -> Result<std::path::PathBuf> {
        Ok(match &vagrant {
            Some(v) => v.credentials.clone(),
            None => {
                which.state()?;
                which.dir()
            }
        })
    };
    let made = |node: &str, req: Request| -> Result<()> {
        let f = match &vagrant {
            Some(v) => fault::make_vagrant(v, node, &req)?,
            None => {
                lab::preflight()?;
                fault::make(&which.state()?, &which.dir(), node, &req)?
            }
        };
        let on = if vagrant.is_some() { " --vagrant" } else { "" };
        println!("{}: {} (undo with `podpath fault{on} clear {}`)", f.node, f.detail, f.node);
        Ok(())
    };
    match what {
        FaultCmd::Link { state, node } if state == "down" => made(&node, Request::LinkDown)?,
        FaultCmd::Link { node, .. } => {
            if vagrant.is_none() {
                lab::preflight()?;
            }
            fault::link_up(&dir()?, &node)?;
            match &vagrant {
                Some(v) => println!("{node}: {} (the lab's network) up", v.lab_nic(&node)?),
                None => println!("{node}: eth0 (the uplink) up"),
            }
        }
        FaultCmd::Blackhole { node, cidr } => {
            let c = cidr.parse().map_err(|_| anyhow::anyhow!("{cidr:?} is not a CIDR (e.g. 10.244.2.0/24)"))?;
            made(&node, Request::Blackhole(c))?
        }
        FaultCmd::Loss { node, percent } => made(&node, Request::Loss(percent))?,
        FaultCmd::Delay { node, ms } => made(&node, Request::Delay(ms))?,
        FaultCmd::Stall { node, seconds, .. } => made(&node, Request::stall_for(seconds))?,
        FaultCmd::FlushRules { node } => {
            let took = match &vagrant {
                Some(v) => fault::flush_rules_vagrant(v, &node)?,
                None => {
                    lab::preflight()?;
                    fault::flush_rules(&which.state()?, &node)?
                }
            };
            println!(
                "{node}: service proxy rules flushed; the node agent rewrote them {:.1} s later",
                took.as_secs_f64()
            );
        }
        FaultCmd::Kill { target, .. } => {
            let pid = match &vagrant {
                Some(v) => {
                    let (node, pid) = fault::kill_pod_vagrant(v, &target)?;
                    format!("{pid} on {node}")
                }
                None => {
                    lab::preflight()?;
                    fault::kill_pod(&which.state()?, &target)?.to_string()
                }
            };
            println!(
                "pod {target}: process {pid} killed (its restart policy decides what follows: `kubectl get pod -w`)"
            );
        }
        FaultCmd::List => {
            let faults = fault::list(&dir()?)?;
            if faults.is_empty() {
                println!("no faults");
            }
            for f in faults {
                println!("{:<8} {:<10} {}  (since {})", f.node, f.kind, f.detail, f.at);
            }
        }
        FaultCmd::Clear { node } => {
            if vagrant.is_none() {
                lab::preflight()?;
            }
            let cleared = fault::clear(&dir()?, |f| node.as_ref().is_none_or(|n| *n == f.node))?;
            for f in &cleared {
                println!("{}: cleared {}", f.node, f.detail);
            }
            if cleared.is_empty() {
                println!("no faults to clear");
            }
        }
    }
    Ok(())
}

fn run() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Up {
            which,
            nodes,
            proxy_mode,
            nftables_layout,
            lb_mode,
            masquerade,
            ip_family,
            api_port,
            registry_mirrors,
            plain_http_registries,
            host_programs,
            image_store_limit,
        } => {
            lab::preflight()?;
            let exe = std::env::current_exe()?;
            let dir = which.dir();
            let bin_dir = lab::multicall::install(&dir.join("bin"), &exe)?;
            let opts = lab::UpOptions {
                name: which.name.clone(),
                nodes,
                proxy_mode,
                nftables_layout,
                lb_mode,
                masquerade,
                ip_family,
                state_dir: dir.clone(),
                bin_dir,
                api_port,
                registry_mirrors,
                plain_http_registries,
                host_programs,
                image_store_limit,
            };
            lab::up(&opts, &mut |line| eprintln!("• {line}"))?;
            let kc = lab::kubeconfig_path(&dir);
            let mut f = String::new();
            if which.name != "lab" {
                f += &format!(" --name {}", which.name);
            }
            if let Some(d) = &which.state_dir {
                f += &format!(" --state-dir {}", d.display());
            }
            println!("\nlab {:?} is up. Try:", which.name);
            println!("  export KUBECONFIG={}", kc.display());
            println!("  kubectl run web --image=podpath/echo --port=8080 && kubectl expose pod web --type=LoadBalancer --port=80 --target-port=8080");
            println!("  sudo podpath curl{f} http://$(kubectl get svc web -o jsonpath='{{.status.loadBalancer.ingress[0].ip}}')/");
            println!("  sudo podpath status{f}");
            // The rules the node's proxy wrote, where this mode writes them.
            let rules = match opts.proxy_mode {
                lab::ProxyMode::Nftables => "nft list table ip kube-proxy",
                _ => "iptables-save -t nat",
            };
            println!("  sudo podpath exec{f} node-1 -- {rules}");
            println!("  sudo podpath trace{f} http://LB-IP/");
            println!("  sudo podpath down{f}");
        }
        Cmd::Doctor => {
            let (root, tools, kernel) = lab::doctor::gather();
            let (text, ready) = lab::doctor::report(&lab::doctor::checks(root, &tools, &kernel));
            print!("{text}");
            if !ready {
                std::process::exit(1);
            }
        }
        Cmd::Addon { addon: AddonCmd::Dns { server, certificate_authority, token_file, cluster_dns } } => {
            let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()));
            let ca = certificate_authority.as_ref().map(read).transpose()?;
            let token = token_file.as_ref().map(read).transpose()?;
            let access = lab::state::ApiAccess::to_server(&server, ca.as_deref(), token.as_deref())?;
            lab::up::cluster_dns_objects(&access, &cluster_dns.to_string(), &mut |m| println!("{m}"))?;
        }
        Cmd::TraceHelper { what: TraceHelperCmd::Connect { timeout_ms, targets } } => {
            print!("{}", lab::policy::connect_lines(&targets, Duration::from_millis(timeout_ms))?);
        }
        Cmd::TraceHelper { what: TraceHelperCmd::Canary { avoid, v6 } } => {
            let port = lab::trace::run::send_canary_here(v6, &avoid.into_iter().collect())
                .context("send the trace's sync datagram")?;
            println!("{port}");
        }
        Cmd::TraceHelper { what: TraceHelperCmd::Probe { port, dst, path, host, timeout_ms } } => {
            let (socket, bound) = lab::trace::run::probe_socket_here(dst.is_ipv6(), port)
                .with_context(|| format!("bind the probe to port {port}"))?;
            let req = lab::trace::run::Request {
                from: String::new(),
                target: lab::trace::run::Target::Addr(dst),
                path,
                host_header: host,
                timeout: Duration::from_millis(timeout_ms),
            };
            let (src, outcome) = lab::trace::run::probe(socket, bound, dst, &req);
            let mut doc = serde_json::to_value(&outcome)?;
            doc["src"] = src.to_string().into();
            println!("{doc}");
        }
        Cmd::Status { which, on } => {
            if let Some(v) = on.lab()? {
                return vagrant_status(&v);
            }
            let st = which.state()?;
            let ready = lab::nodes_ready(&st);
            println!(
                "lab {:?}: {} nodes, {} proxy, {} load balancers, API {}",
                st.name, st.nodes, st.proxy_mode, st.lb_mode, st.api
            );
            println!("{:<16} {:>8}  {:<8} NODE", "COMPONENT", "PID", "STATE");
            for (c, pid, alive) in lab::status(&st) {
                let node = if c.starts_with("node-") {
                    if ready.contains(&c) {
                        "Ready"
                    } else {
                        "NotReady"
                    }
                } else {
                    ""
                };
                println!("{c:<16} {pid:>8}  {:<8} {node}", if alive { "running" } else { "dead" });
            }
            match lab::lb_status(&st) {
                Ok(doc) => print!("\n{}", lab::lb_table(&doc)),
                Err(e) => println!("\nload balancers: unknown ({e})"),
            }
        }
        Cmd::Exec { which, on, host, cmd } => {
            if let Some(v) = on.lab()? {
                let (machine, argv) = match host.strip_prefix("pod/") {
                    Some(rest) => {
                        let (ns, name) =
                            rest.split_once('/').with_context(|| format!("{host:?}: use pod/NAMESPACE/NAME"))?;
                        lab::vagrant::pod_exec(&v, ns, name, &cmd)?
                    }
                    None => (host.clone(), cmd.clone()),
                };
                use std::io::IsTerminal;
                exec(&v.ssh_argv(&machine, &argv, std::io::stdin().is_terminal())?)?;
            }
            lab::preflight()?;
            exec(&lab::exec_argv(&which.state()?, &host, &cmd)?)?;
        }
        Cmd::Curl { which, on, url, curl_args } => {
            let mut cmd = vec!["curl".to_string(), "-sS".into(), "--max-time".into(), "10".into()];
            cmd.extend(curl_args);
            cmd.push(url);
            if let Some(v) = on.lab()? {
                exec(&v.ssh_argv("client", &cmd, false)?)?;
            }
            lab::preflight()?;
            exec(&lab::exec_argv(&which.state()?, "client", &cmd)?)?;
        }
        Cmd::Trace { which, on, target, from, output, timeout, host } => {
            let vagrant = on.lab()?;
            if vagrant.is_none() {
                lab::preflight()?;
            }
            if !matches!(output.as_str(), "text" | "json" | "svg") {
                bail!("--output {output:?}: use text, json or svg");
            }
            if !(timeout > 0.0 && timeout <= 60.0) {
                bail!("--timeout {timeout}: give 0 < seconds <= 60");
            }
            let (target, path, mut host_header) = lab::trace::run::parse_target(&target)?;
            if let Some(h) = host {
                if h.is_empty() || h.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    bail!("--host {h:?}: give a host name (and port), e.g. shop.example");
                }
                host_header = h;
            }
            let req =
                lab::trace::run::Request { from, target, path, host_header, timeout: Duration::from_secs_f64(timeout) };
            let t = match vagrant {
                Some(v) => lab::trace::run::trace_vagrant(std::sync::Arc::new(v), &req)?,
                None => lab::trace::run::trace_once_more_if_unheard(&which.state()?, &req)?,
            };
            match output.as_str() {
                "json" => print!("{}", lab::trace::render::json(&t)),
                "svg" => print!("{}", lab::trace::render::svg(&t)),
                _ => {
                    use std::io::IsTerminal;
                    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
                    print!("{}", lab::trace::render::text(&t, lab::trace::render::Style { colour }));
                }
            }
            if !t.outcome.answered {
                std::process::exit(2);
            }
        }
        Cmd::Policy { which, on, what: PolicyCmd::Matrix { namespaces, ports, protocols, timeout_ms, output } } => {
            if !matches!(output.as_str(), "text" | "json") {
                bail!("--output {output:?}: use text or json");
            }
            let protocols = protocols.iter().map(|p| p.parse()).collect::<lab::Result<Vec<lab::policy::Protocol>>>()?;
            let vagrant = on.lab()?;
            let pods = match &vagrant {
                Some(v) => lab::policy::pods_vagrant(v, &namespaces)?,
                None => lab::policy::pods(&which.state()?, &namespaces)?,
            };
            if pods.is_empty() {
                bail!(
                    "no running pods with a pod network address in {}",
                    if namespaces.is_empty() { "the lab".to_string() } else { namespaces.join(", ") }
                );
            }
            let timeout = Duration::from_millis(timeout_ms);
            let m = match &vagrant {
                Some(v) => lab::policy::probe_all_vagrant(v, &pods, &ports, &protocols, timeout)?,
                None => lab::policy::probe_all(&pods, &ports, &protocols, timeout)?,
            };
            match output.as_str() {
                "json" => println!("{}", serde_json::to_string_pretty(&m)?),
                _ => print!("{}", lab::policy::render(&m)),
            }
        }
        Cmd::Watch { which, on, interval_ms, seconds } => {
            use std::io::Write as _;
            let vagrant = on.lab()?;
            let (name, st) = match &vagrant {
                Some(v) => (format!("Vagrant lab in {}", v.dir.display()), None),
                None => {
                    let st = which.state()?;
                    (format!("lab {:?}", st.name), Some(st))
                }
            };
            let started = std::time::Instant::now();
            println!("watching {name} from {} (every {interval_ms} ms)", jiff::Zoned::now().strftime("%H:%M:%S%.3f"));
            let mut last = lab::watch::Snapshot::default();
            loop {
                let now = match (&vagrant, &st) {
                    (Some(v), _) => lab::watch::snapshot_vagrant(v)?,
                    (None, Some(st)) => lab::watch::snapshot(st, &which.dir())?,
                    (None, None) => unreachable!("read above"),
                };
                let at = started.elapsed().as_secs_f64();
                for line in lab::watch::diff(&last, &now) {
                    println!("{at:>9.3}s  {line}");
                }
                std::io::stdout().flush()?;
                last = now;
                if seconds.is_some_and(|s| at >= s) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(interval_ms));
            }
        }
        Cmd::Explain { which, on, target, output } => {
            let vagrant = on.lab()?;
            if !matches!(output.as_str(), "text" | "json") {
                bail!("--output {output:?}: use text or json");
            }
            let service = match target.as_slice() {
                [name] => name.clone(),
                [kind, name] if matches!(kind.as_str(), "service" | "services" | "svc") => name.clone(),
                [kind, name] if matches!(kind.as_str(), "networkpolicy" | "networkpolicies" | "netpol") => {
                    let e = match &vagrant {
                        Some(v) => lab::policy::explain_vagrant(v, name)?,
                        None => lab::policy::explain(&which.state()?, name)?,
                    };
                    match output.as_str() {
                        "json" => println!("{}", serde_json::to_string_pretty(&e)?),
                        _ => print!("{}", lab::policy::explain_text(&e)),
                    }
                    return Ok(());
                }
                [kind, name] if matches!(kind.as_str(), "gateway" | "gateways" | "gtw") => {
                    let e = match &vagrant {
                        Some(v) => lab::gateway::explain_vagrant(v, name)?,
                        None => lab::gateway::explain(&which.state()?, name)?,
                    };
                    match output.as_str() {
                        "json" => println!("{}", serde_json::to_string_pretty(&e)?),
                        _ => print!("{}", lab::gateway::text(&e)),
                    }
                    return Ok(());
                }
                [kind, _] => bail!("cannot explain {kind:?}: use service, networkpolicy or gateway"),
                _ => unreachable!("clap takes one or two"),
            };
            let e = match &vagrant {
                Some(v) => lab::inspect::explain_vagrant(v, &service)?,
                None => lab::explain(&which.state()?, &service)?,
            };
            match output.as_str() {
                "json" => println!("{}", serde_json::to_string_pretty(&e)?),
                _ => print!("{}", lab::explain::text(&e)),
            }
        }
        Cmd::Rules { which, on, watch, count } => {
            if let Some(v) = on.lab()? {
                if watch {
                    lab::inspect::watch_rules_vagrant(&v, count, &mut std::io::stdout())?;
                    return Ok(());
                }
                for (node, rules) in v.all_proxy_rules()? {
                    println!("{node} ({} rules)", rules.len());
                    for r in rules {
                        println!("  {r}");
                    }
                }
                return Ok(());
            }
            let st = which.state()?;
            if watch {
                lab::watch_rules(&st, count, &mut std::io::stdout())?;
            } else {
                for (node, rules) in lab::proxy_rules(&st)? {
                    println!("{node} ({} rules)", rules.len());
                    for r in rules {
                        println!("  {r}");
                    }
                }
            }
        }
        Cmd::Logs { which, component } => {
            let st = which.state()?;
            if !st.procs.iter().any(|p| p.component == component) {
                let names: Vec<&str> = st.procs.iter().map(|p| p.component.as_str()).collect();
                bail!("no component {component:?}: {}", names.join(", "));
            }
            let path = which.dir().join("logs").join(format!("{component}.log"));
            print!("{}", std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?);
        }
        Cmd::Image { which, on, store, socket, what } => match on.lab()? {
            Some(v) => image_vagrant(&v, what)?,
            None => {
                let dir = which.dir();
                let store = store.unwrap_or_else(|| lab::image_store(&dir));
                let socket = socket.unwrap_or_else(|| lab::image_socket(&dir));
                image_cmd(&store, &socket, what)?
            }
        },
        Cmd::GatewayApi { which, action } => {
            if action != "install" {
                bail!("gateway-api {action:?}: the one action is install");
            }
            for line in lab::gateway::install(&which.state()?)? {
                println!("{line}");
            }
        }
        Cmd::Kubeconfig { which } => {
            which.state()?;
            println!("{}", lab::kubeconfig_path(&which.dir()).display());
        }
        Cmd::Fault { which, on, what } => fault(&which, on.lab()?, what)?,
        Cmd::Ui { which, listen } => {
            lab::preflight()?;
            which.state()?;
            if !listen.ip().is_loopback() {
                eprintln!(
                    "podpath: warning: listening on {listen}, not loopback: anyone who can reach it may try the lab's token"
                );
            }
            lab::ui::serve(&which.dir(), listen, |addr, link| {
                println!("podpath ui for lab {:?} on http://{addr}/ — open (the code works once):", which.name);
                println!("  {link}");
                use std::io::Write as _;
                let _ = std::io::stdout().flush();
            })?;
        }
        Cmd::Node { which, on, action, node } => {
            if let Some(v) = on.lab()? {
                return vagrant_node(&v, &action, node);
            }
            lab::preflight()?;
            which.state()?;
            if action == "add" {
                if let Some(n) = node {
                    bail!("`node add` names the new node itself; drop {n:?}");
                }
                let (name, took) = lab::up::add_node(&which.dir())?;
                println!("{name}: joined; its agent registered and the node Ready {:.1} s later", took.as_secs_f64());
                return Ok(());
            }
            let node = node.with_context(|| format!("`node {action}` needs a NODE (node-1 … node-N)"))?;
            if action != "start" {
                lab::up::stop_node(&which.dir(), &node)?;
                println!("{node}: stopped (its agent and its pods' processes)");
            }
            if action != "stop" {
                let took = lab::up::start_node(&which.dir(), &node)?;
                println!("{node}: started; its agent healthy and the node Ready {:.1} s later", took.as_secs_f64());
            }
        }
        Cmd::Agent { which, node, .. } => {
            lab::preflight()?;
            which.state()?;
            let took = lab::up::restart_agent(&which.dir(), &node)?;
            println!("{node}: agent restarted; healthy and Ready {:.1} s after it was stopped", took.as_secs_f64());
        }
        Cmd::Down { which, keep_data, purge_images } => {
            lab::preflight()?;
            let st = lab::down(&which.dir(), keep_data)?;
            if purge_images {
                let store = lab::image_store(&which.dir());
                if store.exists() {
                    std::fs::remove_dir_all(&store)?;
                }
                let _ = std::fs::remove_dir(which.dir());
            }
            println!("lab {:?} is down (processes stopped, {} namespaces removed)", st.name, st.namespaces.len());
        }
    }
    Ok(())
}

/// Bytes as `12.3MB` (decimal, as `crictl images` and `docker images` print them).
fn human_size(b: u64) -> String {
    match b {
        b if b >= 1_000_000_000 => format!("{:.1}GB", b as f64 / 1e9),
        b if b >= 1_000_000 => format!("{:.1}MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.1}kB", b as f64 / 1e3),
        b => format!("{b}B"),
    }
}

/// A size as `--image-store-limit` takes it (`10Gi`, `500Mi`, or bytes).
fn quantity(b: u64) -> String {
    for (unit, m) in [("Ti", 1u64 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)] {
        if b >= m && b.is_multiple_of(m) {
            return format!("{}{unit}", b / m);
        }
    }
    b.to_string()
}

/// `podpath image --vagrant …`: the same command on every node VM, each node's answer under
/// its name; an error names the nodes it failed on.
fn image_vagrant(v: &lab::vagrant::VagrantLab, what: ImageCmd) -> Result<()> {
    let (args, file): (Vec<String>, Option<PathBuf>) = match what {
        ImageCmd::Ls => (vec!["ls".into()], None),
        ImageCmd::Pull { image } => (vec!["pull".into(), image], None),
        ImageCmd::Rm { images } => (std::iter::once("rm".to_string()).chain(images).collect(), None),
        ImageCmd::Load { file } => {
            // Checked here, before anything is copied to a VM.
            std::fs::metadata(&file).with_context(|| format!("cannot read {}", file.display()))?;
            (vec!["load".into(), "{}".into()], Some(file))
        }
    };
    let answers = lab::vagrant::image_on_nodes(v, &args, file.as_deref())?;
    let mut failed = vec![];
    for (node, answer) in &answers {
        println!("{node}:");
        let text = match answer {
            Ok(out) => out,
            Err(e) => {
                failed.push(format!("{node}: {e}"));
                e
            }
        };
        for line in text.lines() {
            println!("  {line}");
        }
    }
    if !failed.is_empty() {
        bail!("image {} failed on {}", args[0], failed.join("; "));
    }
    Ok(())
}

fn image_cmd(store_dir: &std::path::Path, socket: &std::path::Path, what: ImageCmd) -> Result<()> {
    let store = image::Store::open(store_dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    match what {
        ImageCmd::Ls => {
            let mut rows =
                vec![["IMAGE".to_string(), "TAG".into(), "IMAGE ID".into(), "PLATFORM".into(), "SIZE".into()]];
            for r in store.list().map_err(|e| anyhow::anyhow!("{e}"))? {
                let id: String = r.id.trim_start_matches("sha256:").chars().take(13).collect();
                let names = if r.names.is_empty() { vec!["<none>:<none>".to_string()] } else { r.names.clone() };
                for n in names {
                    let (repo, tag) = n.rsplit_once(':').filter(|(_, t)| !t.contains('/')).unwrap_or((&n, "<none>"));
                    rows.push([repo.to_string(), tag.to_string(), id.clone(), r.platform.clone(), human_size(r.size)]);
                }
            }
            let widths: Vec<usize> = (0..5).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
            for r in &rows {
                let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
                println!("{}", line.join("   ").trim_end());
            }
            let limit = store.limit().map(|l| format!(" (limit {})", quantity(l))).unwrap_or_default();
            println!("store: {} on disk{limit} in {}", human_size(store.disk_usage()), store.root().display());
        }
        ImageCmd::Pull { image } => {
            if !socket.exists() {
                bail!("the lab's image service is not running (no {}): is the lab up?", socket.display());
            }
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let req = image::service::Request::Pull { image: image.clone(), credentials: vec![] };
            let answer = rt.block_on(image::service::call(socket, &req)).map_err(|e| anyhow::anyhow!("{e}"))?;
            match (answer.image, answer.error) {
                (_, Some(e)) => bail!("{e}"),
                (Some(r), None) if answer.downloaded == 0 => println!("Image is up to date for {}", r.names.join(", ")),
                (Some(r), None) => println!(
                    "pulled {} ({}, {} downloaded in {:.2} s)",
                    r.names.join(", "),
                    r.id,
                    human_size(answer.downloaded),
                    answer.elapsed_ms as f64 / 1000.0
                ),
                (None, None) => bail!("the image service answered nothing"),
            }
        }
        ImageCmd::Rm { images } => {
            let mut missing = vec![];
            for i in &images {
                match store.remove(i).map_err(|e| anyhow::anyhow!("{e}"))? {
                    Some(image::Removed::Untagged(n)) => println!("Untagged: {n}"),
                    Some(image::Removed::Deleted(r)) => println!("Deleted: {}", r.id),
                    None => missing.push(i.clone()),
                }
            }
            if !missing.is_empty() {
                bail!("no such image: {}", missing.join(", "));
            }
        }
        ImageCmd::Load { file } => {
            let loaded = image::archive::load(&store, &file, 8 << 30).map_err(|e| anyhow::anyhow!("{e}"))?;
            for r in &loaded {
                let name = r.names.first().cloned().unwrap_or_else(|| r.id.clone());
                println!("Loaded image: {name} ({}, {})", r.platform, human_size(r.size));
            }
            // The store's bound holds for loads as for pulls.
            if let Some(limit) = store.limit() {
                let keep: Vec<&str> = loaded.iter().map(|r| r.id.as_str()).collect();
                let freed = store.free_space(limit, &keep).map_err(|e| anyhow::anyhow!("{e}"))?;
                for r in &freed.removed {
                    let name = r.names.first().cloned().unwrap_or_else(|| r.id.clone());
                    println!("Removed unused image: {name} (the store's limit is {})", quantity(limit));
                }
            }
        }
    }
    Ok(())
}
