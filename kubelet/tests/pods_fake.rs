//! The pod workers' logic with fake processes, CNI plugins, API and prober: no root, no
//! kernel, paused time (back-off delays pass instantly and exactly).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::k8s_openapi::api::core::v1 as core;
use kubelet::cni::{CniRuntime, Network, PluginExec};
use kubelet::metrics::Metrics;
use kubelet::pods::{self, Check, Deps, PodApi, PodRecord, PodsConfig, Prober};
use kubelet::process::{Exit, ProcId, ProcSpec, Processes, Sig};
use podpath_client::events::{Recorder, Report};
use podpath_client::reflector::{Change, Store, Watched};
use serde_json::{json, Value};
use tokio::sync::Notify;

#[derive(Default)]
struct FakeProcs {
    next: AtomicI32,
    state: Mutex<ProcState>,
    changed: Notify,
}

#[derive(Default)]
struct ProcState {
    spawned: Vec<(ProcId, ProcSpec)>,
    sandboxes: Vec<ProcId>,
    alive: HashSet<ProcId>,
    exits: HashMap<ProcId, Exit>,
    signals: Vec<(ProcId, Sig)>,
    /// Processes that ignore SIGTERM (need the grace period and SIGKILL).
    stubborn: HashSet<ProcId>,
}

impl FakeProcs {
    fn new_id(&self) -> ProcId {
        let pid = 1000 + self.next.fetch_add(1, Ordering::SeqCst);
        ProcId { pid, start_time: 7 }
    }
    fn exit(&self, p: ProcId, e: Exit) {
        let mut s = self.state.lock().unwrap();
        s.alive.remove(&p);
        s.exits.insert(p, e);
        drop(s);
        self.changed.notify_waiters();
    }
    fn spawned(&self) -> Vec<(ProcId, ProcSpec)> {
        self.state.lock().unwrap().spawned.clone()
    }
    fn signals(&self) -> Vec<(ProcId, Sig)> {
        self.state.lock().unwrap().signals.clone()
    }
}

impl Processes for FakeProcs {
    async fn start_sandbox(
        &self,
        _hostname: &str,
        _files: Option<kubelet::process::SandboxFiles>,
        _share_pid: bool,
        _log: Option<std::path::PathBuf>,
    ) -> kubelet::Result<ProcId> {
        let id = self.new_id();
        let mut s = self.state.lock().unwrap();
        s.sandboxes.push(id);
        s.alive.insert(id);
        Ok(id)
    }
    async fn spawn(&self, spec: &ProcSpec) -> kubelet::Result<ProcId> {
        let id = self.new_id();
        let mut s = self.state.lock().unwrap();
        s.spawned.push((id, spec.clone()));
        s.alive.insert(id);
        Ok(id)
    }
    fn alive(&self, p: ProcId) -> bool {
        self.state.lock().unwrap().alive.contains(&p)
    }
    fn signal(&self, p: ProcId, sig: Sig) {
        let stubborn = {
            let mut s = self.state.lock().unwrap();
            s.signals.push((p, sig));
            s.stubborn.contains(&p)
        };
        if self.alive(p) && (sig == Sig::Kill || !stubborn) {
            self.exit(p, Exit::Signal(if sig == Sig::Kill { 9 } else { 15 }));
        }
    }
    async fn wait(&self, p: ProcId) -> Exit {
        loop {
            let notified = self.changed.notified();
            if let Some(e) = self.state.lock().unwrap().exits.get(&p) {
                return *e;
            }
            notified.await;
        }
    }
}

#[derive(Default)]
struct FakeExec {
    calls: Mutex<Vec<(String, String, Value)>>,
    next_ip: AtomicI32,
}

impl FakeExec {
    fn calls(&self, command: &str) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().iter().filter(|c| c.0 == command).map(|c| (c.1.clone(), c.2.clone())).collect()
    }
}

impl PluginExec for FakeExec {
    async fn exec(
        &self,
        plugin: &Path,
        env: Vec<(&'static str, String)>,
        stdin: Vec<u8>,
    ) -> Result<Vec<u8>, (Option<i32>, Vec<u8>)> {
        let env: HashMap<_, _> = env.into_iter().collect();
        let conf: Value = serde_json::from_slice(&stdin).unwrap();
        let mut conf_env = conf.clone();
        conf_env["_env"] = json!(env);
        let cmd = env["CNI_COMMAND"].clone();
        self.calls.lock().unwrap().push((cmd.clone(), plugin.file_name().unwrap().to_string_lossy().into(), conf_env));
        match cmd.as_str() {
            // A chained plugin passes the result on.
            "ADD" if conf.get("prevResult").is_some() => Ok(serde_json::to_vec(&conf["prevResult"]).unwrap()),
            "ADD" => {
                let n = 2 + self.next_ip.fetch_add(1, Ordering::SeqCst);
                let result = json!({"cniVersion": "1.1.0", "interfaces": [{"name": "eth0"}],
                    "ips": [{"address": format!("10.244.1.{n}/24"), "gateway": "10.244.1.1", "interface": 0}]});
                Ok(serde_json::to_vec(&result).unwrap())
            }
            _ => Ok(vec![]),
        }
    }
}

#[derive(Default)]
struct FakeApi {
    statuses: Mutex<Vec<core::Pod>>,
    deleted: Mutex<Vec<(String, String, String)>>,
    changed: Notify,
}

impl FakeApi {
    fn last(&self, name: &str) -> Option<core::PodStatus> {
        self.statuses.lock().unwrap().iter().rev().find(|p| p.metadata.name.as_deref() == Some(name))?.status.clone()
    }
}

impl PodApi for FakeApi {
    async fn update_status(&self, pod: &core::Pod) -> kubelet::Result<()> {
        self.statuses.lock().unwrap().push(pod.clone());
        self.changed.notify_waiters();
        Ok(())
    }
    async fn delete(&self, namespace: &str, name: &str, uid: &str) -> kubelet::Result<()> {
        self.deleted.lock().unwrap().push((namespace.into(), name.into(), uid.into()));
        self.changed.notify_waiters();
        Ok(())
    }
}

struct FakeProber(AtomicBool);

impl Prober for FakeProber {
    async fn probe(&self, check: &Check, _timeout: Duration) -> Result<(), String> {
        match check {
            _ if self.0.load(Ordering::SeqCst) => Ok(()),
            Check::Tcp(addr) => Err(format!("dial tcp {addr}: connect: connection refused")),
            _ => Err("refused".into()),
        }
    }
}

type FakeDeps = Deps<Arc<FakeProcs>, Arc<FakeExec>, Arc<FakeApi>, Arc<FakeProber>>;

struct World {
    deps: Arc<FakeDeps>,
    procs: Arc<FakeProcs>,
    exec: Arc<FakeExec>,
    api: Arc<FakeApi>,
    prober: Arc<FakeProber>,
    store: Arc<Store<core::Pod>>,
    dir: tempfile::TempDir,
    events: Mutex<(tokio::sync::mpsc::Receiver<Report>, Vec<Report>)>,
}

fn network(dir: &Path) -> Network {
    let text =
        json!({"cniVersion": "1.1.0", "name": "podpath", "plugins": [{"type": "podpath-bridge"}, {"type": "portmap"}]});
    Network::parse(&dir.join("10-podpath.conflist"), &text.to_string()).unwrap()
}

fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let bins = dir.path().join("bin");
    std::fs::create_dir_all(&bins).unwrap();
    for p in ["podpath-bridge", "portmap"] {
        std::fs::write(bins.join(p), "").unwrap();
    }
    let (procs, exec, api) =
        (Arc::new(FakeProcs::default()), Arc::new(FakeExec::default()), Arc::new(FakeApi::default()));
    let prober = Arc::new(FakeProber(AtomicBool::new(true)));
    let (sink, events) = Recorder::channel(1000);
    let deps = Arc::new(Deps {
        cfg: PodsConfig {
            node_name: "node-1".into(),
            node_ip: "192.168.56.11".parse().unwrap(),
            node_ips: vec!["192.168.56.11".parse().unwrap()],
            state_dir: dir.path().join("state"),
            workload_bin: "/opt/podpath/podpath-workload".into(),
            api_args: vec!["--apiserver".into(), "192.168.56.10:6444".into()],
            cluster_dns: vec!["10.96.0.10".into()],
            cluster_domain: "cluster.local".into(),
            host_resolv: Default::default(),
            backoff_base: Duration::from_secs(10),
            backoff_max: Duration::from_secs(300),
            images: None,
            service_account_token: None,
        },
        procs: procs.clone(),
        cni: CniRuntime { exec: exec.clone(), bin_dirs: vec![bins], cache_dir: dir.path().join("state/cni/results") },
        network: network(dir.path()),
        api: api.clone(),
        prober: prober.clone(),
        metrics: Arc::new(Metrics::new()),
        events: sink,
        services: podpath_client::reflector::Store::new(),
        secrets: podpath_client::reflector::Store::new(),
        config_maps: podpath_client::reflector::Store::new(),
        claims: podpath_client::reflector::Store::new(),
        volumes: podpath_client::reflector::Store::new(),
    });
    World { deps, procs, exec, api, prober, store: Store::new(), dir, events: Mutex::new((events, Vec::new())) }
}

impl World {
    fn set_pods(&self, pods: Vec<core::Pod>) {
        self.store.apply(Change::Replace(pods.into_iter().map(|p| (p.key(), p)).collect::<BTreeMap<_, _>>()));
    }
    fn start(&self) {
        tokio::spawn(pods::run_pods(self.deps.clone(), self.store.clone(), None));
    }
    async fn until(&self, what: &str, f: impl Fn(&World) -> bool) {
        for _ in 0..6000 {
            if f(self) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("never happened: {what}");
    }
    /// Every event reported so far, as `container reason: message` (`-` without a container).
    fn events(&self) -> Vec<String> {
        let mut g = self.events.lock().unwrap();
        while let Ok(e) = g.0.try_recv() {
            g.1.push(e);
        }
        g.1.iter()
            .map(|e| {
                let kind = if e.warning { "Warning" } else { "Normal" };
                let container =
                    e.field_path.as_deref().and_then(|f| f.strip_prefix("spec.containers{")?.strip_suffix('}'));
                format!("{}/{} {} {kind} {}: {}", e.namespace, e.name, container.unwrap_or("-"), e.reason, e.message)
            })
            .collect()
    }
    fn records(&self) -> Vec<PodRecord> {
        pods::load_records(&self.deps.cfg.state_dir)
    }
}

fn pod(name: &str, container: Value) -> core::Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {"nodeName": "node-1", "terminationGracePeriodSeconds": 5, "containers": [container]}
    }))
    .unwrap()
}

fn echo() -> Value {
    json!({"name": "web", "image": "podpath/echo", "ports": [{"containerPort": 8080}]})
}

fn cs(s: &core::PodStatus) -> &core::ContainerStatus {
    &s.container_statuses.as_ref().unwrap()[0]
}

#[tokio::test(start_paused = true)]
async fn a_pod_gets_a_sandbox_network_workload_and_a_ready_status() {
    let w = world();
    w.set_pods(vec![pod("web", echo())]);
    w.start();
    w.until("Running and Ready", |w| {
        w.api.last("web").is_some_and(|s| s.phase.as_deref() == Some("Running") && cs(&s).ready)
    })
    .await;
    let s = w.api.last("web").unwrap();
    assert_eq!(s.pod_ip.as_deref(), Some("10.244.1.2"));
    assert_eq!(s.host_ip.as_deref(), Some("192.168.56.11"));
    // The chain ran in order, the second plugin got the first one's result, and CNI_ARGS are
    // those of a Kubernetes runtime.
    let adds = w.exec.calls("ADD");
    assert_eq!(adds.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["podpath-bridge", "portmap"]);
    assert!(adds[0].1.get("prevResult").is_none());
    assert_eq!(adds[1].1["prevResult"]["ips"][0]["address"], "10.244.1.2/24");
    assert_eq!(adds[0].1["name"], "podpath");
    assert_eq!(
        adds[0].1["_env"]["CNI_ARGS"],
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=uid-web"
    );
    assert_eq!(adds[0].1["_env"]["CNI_CONTAINERID"], "uid-web");
    assert_eq!(adds[0].1["_env"]["CNI_IFNAME"], "eth0");
    let sandbox = w.procs.state.lock().unwrap().sandboxes[0];
    assert_eq!(adds[0].1["_env"]["CNI_NETNS"], format!("/proc/{}/ns/net", sandbox.pid));
    // The workload is the built-in echo joined to the sandbox, with the pod's identity, under
    // its monitor writing the log of its first run.
    let (_, spec) = &w.procs.spawned()[0];
    let log = w.dir.path().join("state/logs/default_web_uid-web/web/0.log");
    assert_eq!(
        spec.argv,
        [
            "/opt/podpath/podpath-workload",
            "monitor",
            "--sandbox",
            &sandbox.pid.to_string(),
            "--log",
            log.to_str().unwrap(),
            "--",
            "/opt/podpath/podpath-workload",
            "echo",
            "--sandbox",
            &sandbox.pid.to_string(),
            "--port",
            "8080",
            "--"
        ]
    );
    assert!(spec.env.contains(&("POD_IP".into(), "10.244.1.2".into())));
    assert!(spec.env.contains(&("NODE_NAME".into(), "node-1".into())));
    // The pod's resolver and hosts files, which the sandbox mounts (kubelet's ClusterFirst).
    let etc = w.dir.path().join("state/etc/uid-web");
    assert_eq!(
        std::fs::read_to_string(etc.join("resolv.conf")).unwrap(),
        "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
    );
    assert!(std::fs::read_to_string(etc.join("hosts")).unwrap().ends_with("\n10.244.1.2\tweb\n"));
    // What a restarted agent needs is on disk: the record and the CNI cache.
    let recs = w.records();
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0].pod_ips, vec!["10.244.1.2".parse::<IpAddr>().unwrap()]);
    assert_eq!(std::fs::read_dir(w.dir.path().join("state/cni/results")).unwrap().count(), 1);
    // kubelet's events, in kubelet's words.
    assert_eq!(
        w.events(),
        [
            "default/web web Normal Pulled: Container image \"podpath/echo\" already present on machine",
            "default/web web Normal Created: Created container: web",
            "default/web web Normal Started: Started container web",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn not_ready_while_the_probe_fails() {
    let w = world();
    w.prober.0.store(false, Ordering::SeqCst);
    let mut c = echo();
    c["readinessProbe"] = json!({"tcpSocket": {"port": 8080}, "periodSeconds": 2});
    w.set_pods(vec![pod("web", c)]);
    w.start();
    w.until("Running", |w| w.api.last("web").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!cs(&w.api.last("web").unwrap()).ready);
    let unhealthy: Vec<String> = w.events().into_iter().filter(|e| e.contains("Unhealthy")).collect();
    assert!(unhealthy.len() >= 4, "one per failed probe: {unhealthy:?}");
    assert_eq!(
        unhealthy[0],
        "default/web web Warning Unhealthy: Readiness probe failed: dial tcp 10.244.1.2:8080: connect: connection refused"
    );
    w.prober.0.store(true, Ordering::SeqCst);
    w.until("Ready", |w| cs(&w.api.last("web").unwrap()).ready).await;
}

#[tokio::test(start_paused = true)]
async fn a_crashing_container_restarts_with_doubling_back_off() {
    let w = world();
    w.set_pods(vec![pod("crash", json!({"name": "c", "image": "busybox", "command": ["true"]}))]);
    w.start();
    let mut started = vec![];
    for n in 1..=3usize {
        w.until("spawned", |w| w.procs.spawned().len() == n).await;
        started.push(tokio::time::Instant::now());
        let (id, _) = w.procs.spawned()[n - 1].clone();
        w.procs.exit(id, Exit::Code(3));
    }
    let gaps: Vec<u64> = started.windows(2).map(|w| (w[1] - w[0]).as_secs()).collect();
    assert_eq!(gaps, [10, 20], "back-off 10 s then 20 s");
    // Each run logs to its own file, as kubelet's CONTAINER/N.log (`kubectl logs --previous`).
    let logs: Vec<String> = w.procs.spawned().iter().map(|(_, spec)| spec.argv[5].clone()).collect();
    assert!(logs[0].ends_with("/default_crash_uid-crash/c/0.log"), "{logs:?}");
    assert!(logs[1].ends_with("/c/1.log") && logs[2].ends_with("/c/2.log"), "{logs:?}");
    w.until("CrashLoopBackOff with restartCount 2", |w| {
        w.api.last("crash").is_some_and(|s| {
            let c = cs(&s);
            c.restart_count == 2
                && c.state.as_ref().unwrap().waiting.as_ref().and_then(|x| x.reason.as_deref())
                    == Some("CrashLoopBackOff")
        })
    })
    .await;
    let s = w.api.last("crash").unwrap();
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(cs(&s).last_state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 3);
    let backoff: Vec<String> = w.events().into_iter().filter(|e| e.contains("BackOff")).collect();
    assert_eq!(backoff.len(), 3, "one per crash: {backoff:?}");
    assert_eq!(
        backoff[0],
        "default/crash c Warning BackOff: Back-off restarting failed container c in pod crash_default(uid-crash)"
    );
}

#[tokio::test(start_paused = true)]
async fn restart_policy_never_and_an_image_without_a_program() {
    let w = world();
    let mut done = pod("job", json!({"name": "c", "image": "busybox", "command": ["true"]}));
    done.spec.as_mut().unwrap().restart_policy = Some("Never".into());
    w.set_pods(vec![done, pod("nginx", json!({"name": "c", "image": "nginx"}))]);
    w.start();
    w.until("job spawned", |w| !w.procs.spawned().is_empty()).await;
    let (id, _) = w.procs.spawned()[0].clone();
    w.procs.exit(id, Exit::Code(0));
    w.until("job Succeeded", |w| w.api.last("job").is_some_and(|s| s.phase.as_deref() == Some("Succeeded"))).await;
    w.until("nginx waiting", |w| w.api.last("nginx").is_some()).await;
    let s = w.api.last("nginx").unwrap();
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let waiting = cs(&s).state.clone().unwrap().waiting.unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ErrImagePull"));
    assert!(waiting.message.unwrap().contains("podpath/echo"));
    let failed: Vec<String> = w.events().into_iter().filter(|e| e.starts_with("default/nginx")).collect();
    assert!(
        failed[0].starts_with("default/nginx c Warning Failed: Failed to pull image \"nginx\": podpath runs no"),
        "{failed:?}"
    );
    assert_eq!(failed[1], "default/nginx c Warning Failed: Error: ErrImagePull");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(w.procs.spawned().len(), 1, "a Never pod is not restarted");
}

#[tokio::test(start_paused = true)]
async fn deletion_terminates_gracefully_then_releases_the_network_and_deletes() {
    let w = world();
    w.set_pods(vec![pod("web", echo())]);
    w.start();
    w.until("Running", |w| w.api.last("web").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
    let (workload, _) = w.procs.spawned()[0].clone();
    w.procs.state.lock().unwrap().stubborn.insert(workload);
    let mut deleting = w.store.list()[0].clone();
    deleting.metadata.deletion_timestamp =
        Some(api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
    deleting.metadata.deletion_grace_period_seconds = Some(3);
    let t0 = tokio::time::Instant::now();
    w.set_pods(vec![deleting]);
    w.until("deleted", |w| !w.api.deleted.lock().unwrap().is_empty()).await;
    assert_eq!(t0.elapsed().as_secs(), 3, "SIGKILL only after the grace period");
    let sigs: Vec<Sig> = w.procs.signals().iter().filter(|(p, _)| *p == workload).map(|(_, s)| *s).collect();
    assert_eq!(sigs, [Sig::Term, Sig::Kill]);
    assert!(w.events().contains(&"default/web web Normal Killing: Stopping container web".to_string()));
    // DEL ran in reverse order with the cached result, then the sandbox went.
    let dels = w.exec.calls("DEL");
    assert_eq!(dels.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["portmap", "podpath-bridge"]);
    assert_eq!(dels[1].1["prevResult"]["ips"][0]["address"], "10.244.1.2/24");
    let sandbox = w.procs.state.lock().unwrap().sandboxes[0];
    assert!(!w.procs.alive(sandbox));
    assert_eq!(w.api.deleted.lock().unwrap()[0], ("default".into(), "web".into(), "uid-web".into()));
    assert!(w.records().is_empty());
    assert_eq!(std::fs::read_dir(w.dir.path().join("state/cni/results")).unwrap().count(), 0);
}

/// Marks the only pod deleted with `grace` seconds, as the API server does.
fn delete_gracefully(w: &World, grace: i64) {
    let mut deleting = w.store.list()[0].clone();
    deleting.metadata.deletion_timestamp =
        Some(api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()));
    deleting.metadata.deletion_grace_period_seconds = Some(grace);
    w.set_pods(vec![deleting]);
}

#[tokio::test(start_paused = true)]
async fn pre_stop_runs_before_sigterm_and_within_the_grace_period() {
    // sleep: SIGTERM comes when the sleep ends.
    let w = world();
    let mut c = echo();
    c["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 2}}});
    w.set_pods(vec![pod("web", c)]);
    w.start();
    w.until("Running", |w| w.api.last("web").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
    let t0 = tokio::time::Instant::now();
    delete_gracefully(&w, 5);
    w.until("SIGTERM", |w| !w.procs.signals().is_empty()).await;
    assert_eq!(t0.elapsed().as_secs(), 2, "SIGTERM after the preStop sleep");
    w.until("deleted", |w| !w.api.deleted.lock().unwrap().is_empty()).await;

    // A sleep longer than the grace period is cut at the deadline; SIGKILL follows at once.
    let w = world();
    let mut c = echo();
    c["lifecycle"] = json!({"preStop": {"sleep": {"seconds": 60}}});
    w.set_pods(vec![pod("web", c)]);
    w.start();
    w.until("Running", |w| w.api.last("web").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
    let (workload, _) = w.procs.spawned()[0].clone();
    w.procs.state.lock().unwrap().stubborn.insert(workload);
    let t0 = tokio::time::Instant::now();
    delete_gracefully(&w, 3);
    w.until("deleted", |w| !w.api.deleted.lock().unwrap().is_empty()).await;
    assert_eq!(t0.elapsed().as_secs(), 3);
    let sigs: Vec<Sig> = w.procs.signals().iter().filter(|(p, _)| *p == workload).map(|(_, s)| *s).collect();
    assert_eq!(sigs, [Sig::Term, Sig::Kill]);

    // exec: the command runs in the pod's namespaces before SIGTERM.
    let w = world();
    let mut c = echo();
    c["lifecycle"] = json!({"preStop": {"exec": {"command": ["/bin/sh", "-c", "nginx -s quit"]}}});
    w.set_pods(vec![pod("web", c)]);
    w.start();
    w.until("Running", |w| w.api.last("web").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
    delete_gracefully(&w, 5);
    w.until("the hook spawned", |w| w.procs.spawned().len() == 2).await;
    let (hook, spec) = w.procs.spawned()[1].clone();
    let sandbox = w.procs.state.lock().unwrap().sandboxes[0];
    assert_eq!(
        spec.argv,
        [
            "/opt/podpath/podpath-workload",
            "join",
            "--sandbox",
            &sandbox.pid.to_string(),
            "--",
            "/bin/sh",
            "-c",
            "nginx -s quit"
        ]
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(w.procs.signals().is_empty(), "no SIGTERM while the hook runs");
    w.procs.exit(hook, Exit::Code(0));
    w.until("deleted", |w| !w.api.deleted.lock().unwrap().is_empty()).await;
    let (workload, _) = w.procs.spawned()[0].clone();
    let sigs: Vec<Sig> = w.procs.signals().iter().filter(|(p, _)| *p == workload).map(|(_, s)| *s).collect();
    assert_eq!(sigs, [Sig::Term]);
}

#[test]
fn pre_stop_handlers_from_the_spec() {
    let c: core::Container = serde_json::from_value(json!({"name": "web", "ports": [{"name": "http", "containerPort": 8080}],
        "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http", "httpHeaders": [{"name": "Host", "value": "web"}]}}}}))
    .unwrap();
    let sandbox = ProcId { pid: 42, start_time: 1 };
    let ip: IpAddr = "10.244.1.5".parse().unwrap();
    assert_eq!(
        pods::pre_stop(&c, Some(ip), &pods::join_prefix(Path::new("/w"), sandbox, None)),
        Some(pods::PreStop::Check(Check::Http {
            addr: "10.244.1.5:8080".parse().unwrap(),
            path: "/drain".into(),
            host: Some("web".into()),
            headers: vec![]
        }))
    );
    assert_eq!(
        pods::pre_stop(&core::Container::default(), Some(ip), &pods::join_prefix(Path::new("/w"), sandbox, None)),
        None
    );
}

/// A second agent on `w`'s node: its state directory, processes, CNI plugins and prober, with
/// `w2`'s API and events.
fn restarted_agent(w: &World, w2: &World) -> Arc<FakeDeps> {
    Arc::new(Deps {
        cfg: w.deps.cfg.clone(),
        procs: w.procs.clone(),
        cni: CniRuntime {
            exec: w.exec.clone(),
            bin_dirs: w.deps.cni.bin_dirs.clone(),
            cache_dir: w.deps.cni.cache_dir.clone(),
        },
        network: w.deps.network.clone(),
        api: w2.api.clone(),
        prober: w.prober.clone(),
        metrics: Arc::new(Metrics::new()),
        events: w2.deps.events.clone(),
        services: w.deps.services.clone(),
        secrets: w.deps.secrets.clone(),
        config_maps: w.deps.config_maps.clone(),
        claims: w.deps.claims.clone(),
        volumes: w.deps.volumes.clone(),
    })
}

#[tokio::test(start_paused = true)]
async fn a_restarted_agent_adopts_running_pods_and_cleans_up_deleted_ones() {
    // First agent: two pods.
    let w = world();
    w.set_pods(vec![pod("keep", echo()), pod("gone", echo())]);
    let handle = tokio::spawn(pods::run_pods(w.deps.clone(), w.store.clone(), None));
    w.until("both running", |w| {
        ["keep", "gone"].iter().all(|n| w.api.last(n).is_some_and(|s| s.phase.as_deref() == Some("Running")))
    })
    .await;
    handle.abort();
    let pids: Vec<ProcId> = w.procs.spawned().iter().map(|s| s.0).collect();
    let adds = w.exec.calls("ADD").len();

    // Second agent: same state directory and processes; "gone" was deleted meanwhile.
    let w2 = world();
    let deps2 = restarted_agent(&w, &w2);
    w2.set_pods(vec![pod("keep", echo())]);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(pods::run_pods(deps2, w2.store.clone(), Some(ready_tx)));
    ready_rx.await.unwrap();
    w2.until("keep reported Running", |w2| w2.api.last("keep").is_some_and(|s| s.phase.as_deref() == Some("Running")))
        .await;
    assert_eq!(w.procs.spawned().len(), 2, "nothing was started again");
    assert_eq!(w.exec.calls("ADD").len(), adds, "no new ADD");
    let gone = w.records().into_iter().find(|r| r.name == "gone");
    assert!(gone.is_none(), "the deleted pod's record is removed");
    let gone_workload = pids.iter().copied().find(|p| !w.procs.alive(*p)).expect("gone's workload was stopped");
    assert!(w.procs.signals().contains(&(gone_workload, Sig::Kill)));
    assert_eq!(w.exec.calls("DEL").len(), 2, "gone's attachment released (both plugins)");
    // GC tells the plugins which attachment stays valid.
    let gc = w.exec.calls("GC");
    assert_eq!(gc.len(), 4, "each agent sends GC to both plugins at start");
    assert_eq!(gc[2].1["cni.dev/valid-attachments"], json!([{"containerID": "uid-keep", "ifname": "eth0"}]));
    let keep = cs(&w2.api.last("keep").unwrap()).clone();
    assert_eq!(keep.restart_count, 0);
    assert!(keep.container_id.unwrap().starts_with("podpath://"));
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_recorded_before_it_was_attached_is_released_and_made_again() {
    // First agent: the pod runs; then its record is put back as it was between the sandbox's
    // start and CNI ADD (no address yet), as if the agent had stopped just then.
    let w = world();
    w.set_pods(vec![pod("keep", echo())]);
    let handle = tokio::spawn(pods::run_pods(w.deps.clone(), w.store.clone(), None));
    w.until("running", |w| w.api.last("keep").is_some_and(|s| s.phase.as_deref() == Some("Running"))).await;
    handle.abort();
    let path = w.deps.cfg.state_dir.join("pods").join("uid-keep.json");
    let mut rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let old_sandbox: ProcId = serde_json::from_value(rec["sandbox"].clone()).unwrap();
    rec["pod_ips"] = json!([]);
    rec["containers"] = json!({});
    std::fs::write(&path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let (spawned, adds, dels) = (w.procs.spawned().len(), w.exec.calls("ADD").len(), w.exec.calls("DEL").len());

    // Second agent: releases the unattached sandbox and makes the pod again.
    let w2 = world();
    let deps2 = restarted_agent(&w, &w2);
    w2.set_pods(vec![pod("keep", echo())]);
    tokio::spawn(pods::run_pods(deps2, w2.store.clone(), None));
    w2.until("keep Running again", |w2| w2.api.last("keep").is_some_and(|s| s.phase.as_deref() == Some("Running")))
        .await;
    assert!(!w.procs.alive(old_sandbox), "the unattached sandbox was stopped");
    assert!(w.exec.calls("DEL").len() > dels, "its attachment released");
    assert!(w.exec.calls("ADD").len() > adds, "a new ADD");
    assert!(w.procs.spawned().len() > spawned, "a new sandbox");
    let rec = w.records().into_iter().find(|r| r.name == "keep").unwrap();
    assert!(!rec.pod_ips.is_empty() && rec.sandbox != old_sandbox, "{rec:?}");
}
