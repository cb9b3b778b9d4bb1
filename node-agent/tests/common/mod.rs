//! A small cluster for root tests and the benchmark: an "underlay" namespace with a bridge
//! (192.168.77.0/24) that holds the API server's gRPC socket (.10), and one namespace per node
//! (.11, .12, …) running a real `node-agent` process. apiserver-lite runs in this process; its
//! socket was created inside the underlay namespace, so agents reach it over the bridge.
//!
//! Teardown (drop): agents are stopped, then the pods' processes the agents started are killed
//! by PID from the agents' records (pods outlive their agent on purpose), then the namespaces
//! are deleted.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use apiserver_lite::registry::{Registry, WriteOptions};
use serde_json::Value;
use testkit::netns::{must, Netns, ProcGuard};

pub const API: &str = "192.168.77.10:6444";

pub fn node_ip(i: usize) -> String {
    format!("192.168.77.{}", 10 + i)
}

pub fn bin_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_node-agent")).parent().unwrap().to_path_buf()
}

pub struct Node {
    pub name: String,
    pub index: usize,
    pub ns: Netns,
    pub state: tempfile::TempDir,
    pub conf: tempfile::TempDir,
    pub agent: Option<ProcGuard>,
    pub extra_args: Vec<String>,
}

impl Node {
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.state.path().join("agent.log")).unwrap_or_default()
    }

    /// Starts (or restarts) the agent process.
    pub fn start_agent(&mut self) {
        let bins = bin_dir();
        assert!(
            bins.join("podpath-bridge").exists() && bins.join("podpath-ipam").exists(),
            "podpath-bridge/podpath-ipam are not in {}: build the workspace (cargo test --workspace builds them)",
            bins.display()
        );
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.state.path().join("agent.log")).unwrap();
        let ip = node_ip(self.index);
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns.name, env!("CARGO_BIN_EXE_node-agent")])
            .args(["--node-name", &self.name, "--node-ip", &ip, "--apiserver", API])
            .arg("--state-dir")
            .arg(self.state.path().join("agent"))
            .arg("--cni-conf-dir")
            .arg(self.conf.path())
            .arg("--cni-bin-dir")
            .arg(format!("{}:/usr/lib/cni", bins.display()))
            .args(["--healthz-bind-address", &format!("{ip}:10256")])
            .args(["--heartbeat-seconds", "1", "--restart-backoff-seconds", "0.5", "--sync-period-seconds", "5"])
            .args(&self.extra_args)
            .env("PODPATH_WORKLOAD", env!("CARGO_BIN_EXE_podpath-workload"))
            .env("PODPATH_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.agent = Some(ProcGuard(cmd.spawn().expect("start node-agent")));
    }

    pub fn stop_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.stop();
        }
    }

    /// Runs a command in this node's namespace.
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        self.ns.run(args)
    }

    /// The records the agent keeps for its pods.
    pub fn records(&self) -> Vec<Value> {
        let dir = self.state.path().join("agent/pods");
        let Ok(rd) = std::fs::read_dir(dir) else { return vec![] };
        rd.flatten().filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()).collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_agent();
        kubelet::pods::kill_recorded_processes(&self.state.path().join("agent"));
        if std::thread::panicking() {
            eprintln!("---- log of {} ----\n{}", self.name, self.log());
        }
    }
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    pub registry: Arc<Registry>,
    pub underlay: Netns,
    _server: apiserver_lite::Server,
    _data: tempfile::TempDir,
}

impl Cluster {
    /// The topology and the API server; agents are not started.
    pub async fn new(nodes: usize) -> Cluster {
        let underlay = Netns::new("ppu");
        underlay.ip(&["link", "add", "br0", "type", "bridge"]);
        underlay.ip(&["addr", "add", "192.168.77.10/24", "dev", "br0"]);
        underlay.ip(&["link", "set", "br0", "up"]);
        let mut list = vec![];
        for i in 1..=nodes {
            let ns = Netns::new("ppn");
            let port = format!("v{i}");
            must(&[
                "ip",
                "-n",
                &underlay.name,
                "link",
                "add",
                &port,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &ns.name,
            ]);
            underlay.ip(&["link", "set", &port, "master", "br0", "up"]);
            ns.ip(&["addr", "add", &format!("{}/24", node_ip(i)), "dev", "eth0"]);
            ns.ip(&["link", "set", "eth0", "up"]);
            // As in the lab (nodes route default via the gateway); a ClusterIP needs a route.
            ns.ip(&["route", "add", "default", "via", "192.168.77.10"]);
            list.push(Node {
                name: format!("node-{i}"),
                index: i,
                ns,
                state: tempfile::tempdir().unwrap(),
                conf: tempfile::tempdir().unwrap(),
                agent: None,
                extra_args: vec![],
            });
        }
        let data = tempfile::tempdir().unwrap();
        let cfg = apiserver_lite::Config::new(data.path().to_path_buf());
        let server = apiserver_lite::start(&cfg).await.unwrap();
        let listener = tokio::net::TcpListener::from_std(underlay.bind_tcp(API)).unwrap();
        tokio::spawn(apiserver_lite::grpc::serve_grpc(
            server.registry.clone(),
            None,
            3 << 20,
            None,
            listener,
            std::future::pending(),
        ));
        Cluster { nodes: list, registry: server.registry.clone(), underlay, _server: server, _data: data }
    }

    /// A cluster whose agents run (with `extra_args`) and whose nodes are all Ready.
    pub async fn started(nodes: usize, extra_args: &[&str]) -> Cluster {
        let mut c = Cluster::new(nodes).await;
        for n in &mut c.nodes {
            n.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
            n.start_agent();
        }
        c.wait_for(30, "every node Ready", |c| c.nodes.iter().all(|n| c.node_ready(&n.name))).await;
        c
    }

    pub fn get(&self, kind: api::Kind, ns: &str, name: &str) -> Option<Value> {
        self.registry.get(kind, ns, name).ok()
    }

    pub fn pod(&self, name: &str) -> Option<Value> {
        self.get(api::Kind::Pod, "default", name)
    }

    pub async fn create_pod(&self, body: Value) {
        self.registry.create(api::Kind::Pod, Some("default"), body, &WriteOptions::default()).await.unwrap();
    }

    pub async fn delete_pod(&self, name: &str) {
        self.registry
            .delete(api::Kind::Pod, Some("default"), name, &apiserver_lite::registry::DeleteOptions::default())
            .await
            .unwrap();
    }

    /// Waits until `f` holds (checked every 50 ms), or panics after `secs` with `what`.
    pub async fn wait_for(&self, secs: u64, what: &str, mut f: impl FnMut(&Cluster) -> bool) {
        let end = Instant::now() + Duration::from_secs(secs);
        while !f(self) {
            if Instant::now() > end {
                for n in &self.nodes {
                    eprintln!("---- log of {} ----\n{}", n.name, n.log());
                }
                panic!("timed out after {secs}s waiting for: {what}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn node_ready(&self, name: &str) -> bool {
        self.get(api::Kind::Node, "", name).is_some_and(|n| condition(&n, "Ready") == Some("True".into()))
    }
}

pub fn condition(obj: &Value, type_: &str) -> Option<String> {
    obj["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)?["status"].as_str().map(str::to_string)
}

pub fn pod_ready(p: &Option<Value>) -> bool {
    p.as_ref().is_some_and(|p| p["status"]["phase"] == "Running" && condition(p, "Ready").as_deref() == Some("True"))
}

/// The PID behind a container status (`podpath://PID`).
pub fn container_pid(p: &Value) -> i32 {
    p["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .and_then(|c| c.strip_prefix("podpath://"))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no container ID in {p}"))
}

pub fn echo_pod(name: &str, node: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "web", "image": "podpath/echo", "ports": [{"containerPort": 8080}]}]
        }
    })
}

pub fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists() && podpath_client::daemon::start_time(pid).is_some()
}
