//! Reaching into a lab's hosts: a command run in a host's (or a pod's) namespaces, HTTP from
//! the host or from inside a namespace, lb-sim's status, the API's view of the nodes.

use std::net::SocketAddr;
use std::time::Duration;

use podpath_client::http;

use crate::plan::Plan;
use crate::state::{ApiAccess, LabState, LB_STATUS};
use crate::{io, LabError, Result};

/// One GET (JSON accepted) from here: status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let headers = [("Accept", "application/json")];
    let req = http::Request { headers: &headers, ..http::Request::get(path) };
    let r = http::blocking(addr, &req, Duration::from_secs(5))?;
    Ok((r.status, r.text()))
}

/// The argv that runs `cmd` on a host of the lab: `client`, `gateway`, `control-plane`,
/// `node-N`, or `pod/NS/NAME` (its network, UTS and mount namespaces entered through its
/// workload's PID, so the pod's own `/etc/resolv.conf` and `/etc/hosts` are the ones seen; its
/// root too, which differs from the mount namespace's own where the node is a chroot).
pub fn exec_argv(st: &LabState, host: &str, cmd: &[String]) -> Result<Vec<String>> {
    let mut argv: Vec<String>;
    if let Some(rest) = host.strip_prefix("pod/") {
        let (ns, name) =
            rest.split_once('/').ok_or_else(|| LabError::Usage(format!("{host:?}: use pod/NAMESPACE/NAME")))?;
        let pid = pod_pid(st, &ApiAccess::of(st)?, ns, name)?;
        argv = ["nsenter", "-t", &pid, "-n", "-u", "-m", "-r", "--"].iter().map(|s| s.to_string()).collect();
    } else {
        let p = Plan::with_family(&st.name, st.nodes, st.ip_family);
        let ns = p.netns_of(host).ok_or_else(|| {
            LabError::Usage(format!(
                "no host {host:?} in lab {:?}: client, gateway, control-plane, node-1…node-{}, pod/NS/NAME",
                st.name, st.nodes
            ))
        })?;
        argv = ["ip", "netns", "exec", ns].iter().map(|s| s.to_string()).collect();
    }
    argv.extend(cmd.iter().cloned());
    Ok(argv)
}

/// One HTTP GET from inside a network namespace of the lab (a helper thread enters it; the
/// socket stays there).
pub fn http_get_in(netns: &str, addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let (ns, path) = (netns.to_string(), path.to_string());
    in_netns_thread(format!("/run/netns/{netns}"), move || {
        http_get(addr, &path).map_err(|e| LabError::NotReady(format!("{e} (in {ns})")))
    })?
}

/// Runs `f` on a helper thread inside a network namespace (given by path: `/run/netns/NAME`
/// or `/proc/PID/ns/net`); sockets made there stay in that namespace. While a
/// [`NetnsWorkers`] holds a worker for that namespace, `f` runs on it (no thread started; on
/// the worker itself, at once).
pub fn in_netns_thread<T: Send + 'static>(ns_path: String, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    if WORKER_OF.with(|w| w.borrow().as_deref() == Some(ns_path.as_str())) {
        return Ok(f());
    }
    let worker = WORKERS.lock().unwrap_or_else(|e| e.into_inner()).get(&ns_path).cloned();
    if let Some(worker) = worker {
        return worker.run(f);
    }
    std::thread::spawn(move || -> Result<T> {
        enter_netns(&ns_path)?;
        Ok(f())
    })
    .join()
    .map_err(|_| LabError::NotReady("a helper thread inside a lab namespace panicked".into()))?
}

/// The workers [`in_netns_thread`] hands its jobs to, by namespace path.
static WORKERS: std::sync::Mutex<std::collections::BTreeMap<String, std::sync::Arc<NetnsWorker>>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

thread_local! {
    /// On a worker's thread, the namespace it is in.
    static WORKER_OF: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Workers for a set of namespaces, each its own thread inside one, serving every
/// [`in_netns_thread`] job for that namespace while this lives — for a task that asks the same
/// namespaces many things (a trace: its rules, sync datagrams, conntrack, routes, programs),
/// one thread per namespace instead of one per question. Dropped, they end (and with them any
/// program they started with a parent-death signal, see [`NetnsWorker`]). A job runs its own
/// namespace's jobs at once, but must not wait on another worker's job that waits on it.
pub struct NetnsWorkers {
    paths: Vec<String>,
}

impl NetnsWorkers {
    /// Starts one worker per path (`/run/netns/NAME`); a path that has one already keeps it.
    pub fn start(paths: impl IntoIterator<Item = String>) -> Result<NetnsWorkers> {
        let mut started = NetnsWorkers { paths: vec![] };
        for path in paths {
            if WORKERS.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&path) {
                continue;
            }
            let worker = std::sync::Arc::new(NetnsWorker::new(path.clone())?);
            WORKERS.lock().unwrap_or_else(|e| e.into_inner()).insert(path.clone(), worker);
            started.paths.push(path);
        }
        Ok(started)
    }

    /// The worker for `path`, if one is running.
    pub fn get(path: &str) -> Option<std::sync::Arc<NetnsWorker>> {
        WORKERS.lock().unwrap_or_else(|e| e.into_inner()).get(path).cloned()
    }
}

impl Drop for NetnsWorkers {
    fn drop(&mut self) {
        let mut gone = vec![];
        {
            let mut workers = WORKERS.lock().unwrap_or_else(|e| e.into_inner());
            for p in &self.paths {
                gone.extend(workers.remove(p));
            }
        }
        // Joined outside the lock: a job still running may ask for another worker.
        drop(gone);
    }
}

/// Moves the calling thread into the network namespace at `ns_path`.
fn enter_netns(ns_path: &str) -> Result<()> {
    let file = std::fs::File::open(ns_path).map_err(io(format!("open namespace {ns_path}")))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| io(format!("enter namespace {ns_path}"))(e.into()))
}

/// Makes the program `cmd` starts get SIGKILL when the thread that started it ends (or the
/// whole process, killed outright): the parent-death signal, set in the child before it execs
/// the program. It follows the thread that forked, not the process (see [`NetnsWorker`]).
#[allow(unsafe_code)] // `pre_exec`; see CONVENTIONS.md
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs in the forked child before exec and only calls prctl(2), which is
    // async-signal-safe; it allocates nothing and takes no lock (an error is a plain errno).
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
        });
    }
}

/// A thread inside a network namespace that runs jobs there, one at a time, for as long as it
/// lives. A program it starts runs without `ip netns exec` (one program start and one mount
/// namespace less): it inherits the namespace of the thread that forked it. Given a
/// parent-death signal ([`die_with_parent`]), the program gets it when this thread ends, since
/// that signal follows the thread that forked, not the process: so the thread lives until dropped.
pub struct NetnsWorker {
    ns_path: String,
    jobs: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

type Job = Box<dyn FnOnce() + Send>;

/// A job's result, to wait for: several workers' jobs run at once.
pub struct Pending<T> {
    answer: std::sync::mpsc::Receiver<T>,
    ns_path: String,
}

impl<T> Pending<T> {
    pub fn wait(self) -> Result<T> {
        self.answer
            .recv()
            .map_err(|_| LabError::NotReady(format!("the helper thread for {} ended or panicked", self.ns_path)))
    }
}

impl NetnsWorker {
    /// The thread, once inside `ns_path` (`/run/netns/NAME`).
    pub fn new(ns_path: String) -> Result<NetnsWorker> {
        let (jobs, inbox) = std::sync::mpsc::channel::<Job>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let path = ns_path.clone();
        let thread = std::thread::spawn(move || {
            let entered = enter_netns(&path);
            let ok = entered.is_ok();
            let _ = ready_tx.send(entered);
            if ok {
                WORKER_OF.with(|w| *w.borrow_mut() = Some(path));
                for job in inbox {
                    // A job that panics fails alone (its `Pending` says so); the worker goes on.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            }
        });
        let worker = NetnsWorker { ns_path, jobs: Some(jobs), thread: Some(thread) };
        match ready.recv() {
            Ok(Ok(())) => Ok(worker),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(LabError::NotReady(format!("the helper thread for {} ended", worker.ns_path))),
        }
    }

    /// Queues `f`; its result comes through the returned [`Pending`].
    pub fn start<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Pending<T> {
        let (reply, answer) = std::sync::mpsc::channel();
        if let Some(jobs) = &self.jobs {
            // A send fails only when the thread is gone; the answer's channel then says so.
            let _ = jobs.send(Box::new(move || {
                let _ = reply.send(f());
            }));
        }
        Pending { answer, ns_path: self.ns_path.clone() }
    }

    /// Runs `f` inside the namespace and returns what it returned.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
        self.start(f).wait()
    }

    /// Starts `cmd` inside the namespace.
    pub fn spawn(&self, mut cmd: std::process::Command) -> std::io::Result<std::process::Child> {
        self.run(move || cmd.spawn()).map_err(|e| std::io::Error::other(e.to_string()))?
    }
}

impl Drop for NetnsWorker {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub(crate) fn lb_status_in(gateway_netns: &str) -> Result<serde_json::Value> {
    let (code, body) = http_get_in(gateway_netns, LB_STATUS.parse().expect("constant"), "/status")?;
    if code != 200 {
        return Err(LabError::NotReady(format!("lb-sim status answered HTTP {code}")));
    }
    serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("lb-sim status is not JSON: {e}")))
}

/// The PID of a pod's first container (its namespaces are the pod's), from the API: the
/// process itself (`podpath://PID`), or for a container of an image (`crun://ID`) its init
/// process, from the node agent's record of the pod (as `crictl inspect` finds it).
pub fn pod_pid(st: &LabState, api: &ApiAccess, ns: &str, name: &str) -> Result<String> {
    let pod = get_pod(api, ns, name)?;
    let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    let records = st.dir.join("nodes").join(node).join("agent").join("pods");
    container_process(&pod, &records, |p| std::fs::read_to_string(p).ok())
}

/// A pod from the API, or "not found".
pub(crate) fn get_pod(api: &ApiAccess, ns: &str, name: &str) -> Result<serde_json::Value> {
    let (code, body) = api.get(&format!("/api/v1/namespaces/{ns}/pods/{name}"))?;
    if code != 200 {
        return Err(LabError::Usage(format!("pod {ns}/{name} not found")));
    }
    serde_json::from_str(&body).map_err(|e| LabError::NotReady(format!("pod {ns}/{name} is not JSON: {e}")))
}

/// [`pod_pid`]'s reading, wherever the node is: `records` is its agent's directory of pod
/// records and `read` reads a file on that node (the host's files for a namespace lab, SSH
/// for a VM).
pub(crate) fn container_process(
    pod: &serde_json::Value,
    records: &std::path::Path,
    read: impl Fn(&std::path::Path) -> Option<String>,
) -> Result<String> {
    let (ns, name) =
        (pod["metadata"]["namespace"].as_str().unwrap_or(""), pod["metadata"]["name"].as_str().unwrap_or(""));
    let none = || LabError::Usage(format!("pod {ns}/{name} has no running container yet"));
    let status = &pod["status"]["containerStatuses"][0];
    let id = status["containerID"].as_str().ok_or_else(none)?;
    if let Some(pid) = id.strip_prefix("podpath://") {
        return Ok(pid.to_string());
    }
    if !id.starts_with("crun://") || status["state"]["running"].is_null() {
        return Err(none());
    }
    let (node, uid) = (pod["spec"]["nodeName"].as_str().unwrap_or(""), pod["metadata"]["uid"].as_str().unwrap_or(""));
    let record = records.join(format!("{uid}.json"));
    let rec: serde_json::Value = read(&record)
        .and_then(|b| serde_json::from_str(&b).ok())
        .ok_or_else(|| LabError::NotReady(format!("no record of pod {ns}/{name} on {node} ({})", record.display())))?;
    let container = status["name"].as_str().unwrap_or("");
    let pid_file = rec["containers"][container]["pid_file"].as_str().ok_or_else(none)?;
    let pid = read(std::path::Path::new(pid_file)).and_then(|p| p.trim().parse::<u32>().ok()).ok_or_else(none)?;
    Ok(pid.to_string())
}

/// lb-sim's status document (`GET /status` in the gateway's namespace).
pub fn lb_status(st: &LabState) -> Result<serde_json::Value> {
    let p = Plan::with_family(&st.name, st.nodes, st.ip_family);
    lb_status_in(p.netns_of("gateway").expect("planned"))
}

/// Ready nodes according to the API server.
pub fn nodes_ready(st: &LabState) -> Vec<String> {
    ApiAccess::of(st).map(|a| crate::up::ready_nodes(&a)).unwrap_or_default()
}

/// lb-sim's status as a table: one row per frontend, its backends with their health (`*`:
/// gets traffic).
pub fn lb_table(doc: &serde_json::Value) -> String {
    let mut rows = vec![["VIP", "SERVICE", "KIND", "VIA", "PORTS", "BACKENDS"].map(String::from).to_vec()];
    for f in doc["frontends"].as_array().into_iter().flatten() {
        let s = |k: &str| f[k].as_str().unwrap_or_default().to_string();
        let ports: Vec<&str> = f["ports"].as_array().into_iter().flatten().filter_map(|p| p.as_str()).collect();
        let backends: Vec<String> = f["backends"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                let star = if b["inRotation"] == true { "*" } else { "" };
                format!("{}{star} {}", b["node"].as_str().unwrap_or_default(), b["health"].as_str().unwrap_or_default())
            })
            .collect();
        let mut via = s("delivery");
        if let Some(pin) = f["pinned"].as_str() {
            via = format!("{via} (pinned to {pin})");
        }
        rows.push(vec![s("vip"), s("service"), s("kind"), via, ports.join(","), backends.join(", ")]);
    }
    let widths: Vec<usize> = (0..6).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = format!("load balancers ({} mode):\n", doc["mode"].as_str().unwrap_or("?"));
    for r in &rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if rows.len() == 1 {
        out.push_str("(no LoadBalancer IPs or externalIPs yet)\n");
    }
    if let Some(e) = doc["error"].as_str() {
        out.push_str(&format!("last error: {e}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lb_table_shows_every_frontend_with_its_backends() {
        let doc = serde_json::json!({"mode": "passthrough", "nodes": [], "frontends": [
            {"vip": "198.51.100.1", "service": "default/contour", "kind": "LoadBalancer", "delivery": "route",
             "ports": ["http 80/TCP→30080", "https 443/TCP→30443"],
             "backends": [{"node": "node-1", "target": "192.168.56.11", "check": "", "health": "healthy", "inRotation": true},
                          {"node": "node-2", "target": "192.168.56.12", "check": "", "health": "unhealthy", "inRotation": false}]},
            {"vip": "169.10.10.1", "service": "default/svc-test-1", "kind": "ExternalIP", "delivery": "route",
             "pinned": "node-2", "ports": ["80/TCP"], "backends": []}]});
        let t = lb_table(&doc);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "load balancers (passthrough mode):");
        assert!(lines[1].starts_with("VIP "), "{t}");
        assert!(lines[2].contains("default/contour") && lines[2].contains("node-1* healthy, node-2 unhealthy"), "{t}");
        assert!(lines[3].contains("route (pinned to node-2)"), "{t}");
        assert_eq!(lines[1].find("SERVICE"), lines[2].find("default/contour"), "columns line up");
    }
}
