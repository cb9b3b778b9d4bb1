//! Harness for podpath's end-to-end tests: real processes, real clients.
//!
//! [`ApiServer`] starts the `apiserver-lite` binary on free loopback ports with a private data
//! directory, kubeconfig and kubectl cache directory, and stops it (by PID) when dropped.
//! Binaries are found next to the test executable (`target/<profile>/`), or in
//! `PODPATH_BIN_DIR`. [`Lab`] is a lab made by the real `podpath up`; [`vagrant`] runs the
//! Vagrantfile's machines and provisioners in namespaces; [`webdriver`] drives headless Chromium
//! for `podpath ui`'s tests.

pub mod book;
pub mod clients;
pub mod vagrant;
pub mod webdriver;

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use podpath_client::http;

/// The path of a workspace binary.
pub fn bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("PODPATH_BIN_DIR") {
        return Path::new(&dir).join(name);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(p.exists(), "{} is not built: run `cargo build --workspace --bins` first", p.display());
    p
}

/// Stops the pods a node agent recorded under `agent_state_dir` (`node-agent --kill-pods`):
/// pods outlive their agent, so a test that ends stops them this way. Failures are printed,
/// not raised (this runs in `Drop`).
pub fn kill_pods(agent_state_dir: &Path) {
    if !agent_state_dir.exists() {
        return;
    }
    match Command::new(bin("node-agent")).arg("--kill-pods").arg("--state-dir").arg(agent_state_dir).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!("node-agent --kill-pods: {}", String::from_utf8_lossy(&o.stderr).trim()),
        Err(e) => eprintln!("cannot run node-agent --kill-pods: {e}"),
    }
}

/// A free TCP port on 127.0.0.1 (bound and released; a race with other processes is possible
/// but unlikely, and start-up retries once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A running `apiserver-lite` process: over TLS with its generated lab CA and a bearer token,
/// as the server runs by default, unless started with `--insecure-http`.
pub struct ApiServer {
    child: Child,
    pub rest: SocketAddr,
    pub grpc: SocketAddr,
    pub dir: tempfile::TempDir,
    pub data_dir: PathBuf,
    pub kubeconfig: PathBuf,
    /// The CA's PEM (None: plain HTTP).
    pub ca_pem: Option<String>,
    pub token: Option<String>,
    extra_args: Vec<String>,
}

/// The bearer token the harness gives servers it starts over TLS.
const TOKEN: &str = "podpath-e2e-token";

impl ApiServer {
    pub fn start(extra_args: &[&str]) -> Result<ApiServer> {
        let dir = tempfile::Builder::new().prefix("podpath-e2e-").tempdir()?;
        let data_dir = dir.path().join("data");
        let mut extra: Vec<String> = extra_args.iter().map(|s| s.to_string()).collect();
        let tls = !extra.iter().any(|a| a == "--insecure-http");
        let token = tls.then(|| TOKEN.to_string());
        if tls {
            let token_file = dir.path().join("token");
            std::fs::write(&token_file, TOKEN)?;
            extra.extend(["--token-file".into(), token_file.display().to_string()]);
        }
        let (child, rest, grpc) = spawn(&data_dir, &extra, dir.path(), tls)?;
        let ca_pem = if tls { Some(std::fs::read_to_string(data_dir.join("pki/ca.crt"))?) } else { None };
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_text(rest, ca_pem.as_deref(), token.as_deref()))?;
        Ok(ApiServer { child, rest, grpc, dir, data_dir, kubeconfig, ca_pem, token, extra_args: extra })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL (no chance to flush) and starts it again on the same
    /// data directory and ports.
    pub fn kill9_and_restart(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        let mut args = self.extra_args.clone();
        args.extend(["--listen".into(), self.rest.to_string(), "--grpc-listen".into(), self.grpc.to_string()]);
        let (child, ()) = spawn_on(&self.data_dir, &args, self.dir.path(), self.rest, self.ca_pem.is_some())?;
        self.child = child;
        // The CA stays; the serving certificate is new, signed by it.
        Ok(())
    }

    /// Sends SIGTERM (by PID) and waits up to `limit` for the server to exit; its exit status,
    /// or None if it still runs (then the drop kills it).
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Runs kubectl against this server with a private cache directory.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_cmd(args).output().expect("kubectl runs")
    }

    /// kubectl that must succeed: its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        let (out, err) = text(&o);
        assert!(o.status.success(), "kubectl {args:?} failed: {out}{err}");
        out
    }

    /// kubectl that must fail: its stderr.
    pub fn kubectl_fails(&self, args: &[&str]) -> String {
        let o = self.kubectl(args);
        let (out, err) = text(&o);
        assert!(!o.status.success(), "kubectl {args:?} should fail: {out}");
        err
    }

    pub fn kubectl_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(self.dir.path().join("kube-cache"));
        c.args(args);
        c.env("HOME", self.dir.path());
        c
    }

    /// TLS settings for talking to this server (None: plain HTTP).
    pub fn tls(&self) -> Option<http::Tls> {
        self.ca_pem.as_deref().map(|ca| http::Tls::new(ca, "kubernetes").expect("the lab CA"))
    }

    /// One request with the token, over TLS unless the server is plain: status and body.
    pub fn request(&self, method: &str, path: &str, body: &[u8]) -> Result<http::Response> {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let mut headers = vec![("Accept", "application/json"), ("Content-Type", "application/json")];
        if let Some(a) = &auth {
            headers.push(("Authorization", a.as_str()));
        }
        let req = http::Request { method, path, headers: &headers, body };
        Ok(http::blocking_via(self.rest, self.tls().as_ref(), &req, Duration::from_secs(10))?)
    }

    /// GET with the token; returns the status code and body.
    pub fn http_get(&self, path: &str) -> Result<(u16, String)> {
        let r = self.request("GET", path, b"")?;
        Ok((r.status, r.text()))
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(data_dir: &Path, extra: &[String], log_dir: &Path, tls: bool) -> Result<(Child, SocketAddr, SocketAddr)> {
    let mut last = None;
    for _ in 0..3 {
        let rest: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let grpc: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let mut args = extra.to_vec();
        args.extend(["--listen".into(), rest.to_string(), "--grpc-listen".into(), grpc.to_string()]);
        match spawn_on(data_dir, &args, log_dir, rest, tls) {
            Ok(child) => return Ok((child.0, rest, grpc)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("tried"))
}

/// A child that is killed and reaped when dropped unless taken: a start that fails or panics
/// half way leaves no server behind.
struct Starting(Option<Child>);

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Whether the server at `rest` answers `/readyz` (over TLS with the CA in `data_dir`).
fn ready(rest: SocketAddr, data_dir: &Path, tls: bool) -> bool {
    if !tls {
        return matches!(http_get(rest, "/readyz"), Ok((200, _)));
    }
    let Ok(ca) = std::fs::read_to_string(data_dir.join("pki/ca.crt")) else { return false };
    let Ok(t) = http::Tls::new(&ca, "kubernetes") else { return false };
    http::blocking_via(rest, Some(&t), &http::Request::get("/readyz"), Duration::from_secs(5))
        .is_ok_and(|r| r.status == 200)
}

fn spawn_on(data_dir: &Path, args: &[String], log_dir: &Path, rest: SocketAddr, tls: bool) -> Result<(Child, ())> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log_dir.join("apiserver.log"))?;
    let child = Command::new(bin("apiserver-lite"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting apiserver-lite")?;
    let mut starting = Starting(Some(child));
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(status) = starting.0.as_mut().map(Child::try_wait).transpose()?.flatten() {
            let log = std::fs::read_to_string(log_dir.join("apiserver.log")).unwrap_or_default();
            bail!("apiserver-lite exited with {status}: {log}");
        }
        if ready(rest, data_dir, tls) {
            return Ok((starting.0.take().context("the child")?, ()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("apiserver-lite did not become ready on {rest}")
}

/// A kubeconfig for the server at `rest`: https with the CA's data and the token, or plain http.
pub fn kubeconfig_text(rest: SocketAddr, ca_pem: Option<&str>, token: Option<&str>) -> String {
    use base64::Engine;
    let (scheme, ca) = match ca_pem {
        Some(pem) => (
            "https",
            format!("\n    certificate-authority-data: {}", base64::engine::general_purpose::STANDARD.encode(pem)),
        ),
        None => ("http", String::new()),
    };
    let user = token.map(|t| format!("{{token: {t}}}")).unwrap_or_else(|| "{}".into());
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {scheme}://{rest}{ca}\nusers:\n- name: lab\n  user: {user}\ncontexts:\n- name: lab\n  context:\n    cluster: lab\n    user: lab\n    namespace: default\ncurrent-context: lab\n"
    )
}

/// One GET (JSON accepted): status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let headers = [("Accept", "application/json")];
    let req = http::Request { headers: &headers, ..http::Request::get(path) };
    let r = http::blocking(addr, &req, Duration::from_secs(10))?;
    Ok((r.status, r.text()))
}

/// stdout and stderr of a command, for assertion messages.
pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

static LAB_COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A lab made by the real `podpath up` (its own name and state directory), taken down by
/// `podpath down` when dropped, however the test ends.
pub struct Lab {
    pub name: String,
    pub state: PathBuf,
    pub kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

/// `podpath ARGS`: (success, stdout + stderr).
pub fn podpath(args: &[&str]) -> (bool, String) {
    let (ok, o, e) = podpath_apart(args);
    (ok, format!("{o}{e}"))
}

/// `podpath ARGS`: (success, stdout, stderr) apart — for output a program reads (`-o json`),
/// which notices on stderr (a trace's "tracing once more") are not part of.
pub fn podpath_apart(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin("podpath")).args(args).output().expect("run podpath");
    let (o, e) = text(&out);
    (out.status.success(), o, e)
}

impl Lab {
    /// `podpath up` with a name unique to this process and call (`tag` ≤ 8 characters).
    pub fn up(tag: &str, args: &[&str]) -> Result<Lab> {
        let n = LAB_COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("{tag}-{}{n}", std::process::id() % 100_000);
        let dir = tempfile::Builder::new().prefix("podpath-lab-").tempdir()?;
        let state = dir.path().join("state");
        let mut argv = vec!["up", "--name", &name, "--state-dir", state.to_str().context("utf-8 path")?];
        argv.extend_from_slice(args);
        // Without a registry to pull from, the base images run the node's programs, as the
        // tests written before podpath ran images expect.
        if !args.iter().any(|a| a.starts_with("--registry-mirror")) {
            argv.push("--host-programs");
        }
        let (ok, out) = podpath(&argv);
        let lab = Lab { kubeconfig: state.join("kubeconfig"), name, state, _dir: dir };
        if !ok {
            bail!("podpath up {args:?}: {out}");
        }
        Ok(lab)
    }

    /// Waits (60 s at most) until the cluster DNS pods `podpath up` creates are Ready.
    pub fn wait_for_cluster_dns(&self) {
        // `kubectl wait -l` fails at once while no pod matches: the Deployment's controller
        // may not have made them yet.
        wait_for(Duration::from_secs(30), "the cluster DNS pods to exist", || {
            let out = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["get", "pods", "-n", "kube-system", "-l", "k8s-app=kube-dns", "-o", "name"])
                .output()
                .map_err(|e| e.to_string())?;
            let names = String::from_utf8_lossy(&out.stdout).to_string();
            if out.status.success() && !names.trim().is_empty() {
                Ok(())
            } else {
                Err(format!("{names}{}", String::from_utf8_lossy(&out.stderr)))
            }
        });
        self.kubectl(&[
            "wait",
            "-n",
            "kube-system",
            "--for=condition=Ready",
            "pod",
            "-l",
            "k8s-app=kube-dns",
            "--timeout=60s",
        ]);
    }

    /// Runs `kubectl ARGS` until its stdout satisfies `ok` (a failing kubectl counts as not
    /// yet), at most `limit`; that stdout.
    pub fn kubectl_until(&self, limit: Duration, args: &[&str], ok: impl Fn(&str) -> bool) -> String {
        wait_for(limit, &format!("kubectl {}", args.join(" ")), || {
            let out = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .output()
                .map_err(|e| e.to_string())?;
            let (o, e) = text(&out);
            if out.status.success() && ok(&o) {
                Ok(o)
            } else {
                Err(format!("{o}{e}"))
            }
        })
    }

    /// `kubectl get pods -n kube-system -l k8s-app=kube-dns -o jsonpath=PATH` (the cluster DNS
    /// pods).
    pub fn cluster_dns_pods(&self, jsonpath: &str) -> String {
        self.kubectl(&[
            "get",
            "pods",
            "-n",
            "kube-system",
            "-l",
            "k8s-app=kube-dns",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])
    }

    /// `podpath CMD --name … --state-dir … REST`.
    pub fn run(&self, cmd: &str, rest: &[&str]) -> (bool, String) {
        let (ok, o, e) = self.run_apart(cmd, rest);
        (ok, format!("{o}{e}"))
    }

    /// [`Lab::run`] with stdout and stderr apart ([`podpath_apart`]).
    pub fn run_apart(&self, cmd: &str, rest: &[&str]) -> (bool, String, String) {
        let mut v = vec![cmd, "--name", &self.name, "--state-dir", self.state.to_str().expect("utf-8 path")];
        v.extend_from_slice(rest);
        podpath_apart(&v)
    }

    /// A command on a host of the lab (client, gateway, node-N, pod/NS/NAME); must succeed.
    pub fn exec(&self, host: &str, cmd: &[&str]) -> String {
        let mut v = vec![host, "--"];
        v.extend_from_slice(cmd);
        let (ok, out) = self.run("exec", &v);
        assert!(ok, "podpath exec {host} {cmd:?}: {out}");
        out
    }

    /// curl from the external client: (exit code, output). `-sS --max-time 10` are set.
    pub fn curl(&self, args: &[&str]) -> (i32, String) {
        let mut v = vec!["client", "--", "curl", "-sS", "--max-time", "10"];
        v.extend_from_slice(args);
        let out = Command::new(bin("podpath"))
            .args(["exec", "--name", &self.name, "--state-dir", self.state.to_str().expect("utf-8 path")])
            .args(&v)
            .output()
            .expect("run podpath");
        let (o, e) = text(&out);
        (out.status.code().unwrap_or(-1), format!("{o}{e}"))
    }

    /// Runs `f` on a thread inside the network namespace of a host of the lab (`node-1`, …).
    pub fn in_netns<T: Send + 'static>(&self, host: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/pp-{}-{host}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).expect("lab namespace");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .expect("netns thread")
    }

    /// Runs pod `name`: a program of the node that prints `tick N` every 200 ms.
    pub fn run_ticker(&self, name: &str) {
        let script = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done";
        self.kubectl(&["run", name, "--image=busybox", "--command", "--", "sh", "-c", script]);
    }

    /// A one-node lab with pods `web` (podpath/echo on 8080) and `ticker`, both Ready and the
    /// ticker's log a few lines long: what the client libraries' streaming tests work on.
    pub fn with_web_and_ticker(tag: &str) -> Result<Lab> {
        let lab = Lab::up(tag, &["--nodes", "1"])?;
        lab.kubectl(&["run", "web", "--image=podpath/echo", "--port=8080"]);
        lab.run_ticker("ticker");
        lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "pod/ticker", "--timeout=60s"]);
        std::thread::sleep(Duration::from_millis(600));
        Ok(lab)
    }

    /// kubectl against the lab; must succeed; stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out =
            Command::new("kubectl").arg("--kubeconfig").arg(&self.kubeconfig).args(args).output().expect("run kubectl");
        let (o, e) = text(&out);
        assert!(out.status.success(), "kubectl {args:?}: {e}");
        o
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> String {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child.stdin.take().expect("stdin").write_all(yaml.as_bytes()).expect("write yaml");
        let out = child.wait_with_output().expect("kubectl apply");
        let (o, e) = text(&out);
        assert!(out.status.success(), "kubectl apply: {e}\n{yaml}");
        o
    }

    /// Pods web-1 on node-1 and web-2 on node-2 (`app: web`, podpath/echo on 8080), Ready,
    /// behind the LoadBalancer Service `web` (80 → 8080).
    pub fn web_pod_on_each_node_behind_a_load_balancer(&self) {
        for (name, node) in [("web-1", "node-1"), ("web-2", "node-2")] {
            self.apply(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{app: web}}}}\nspec:\n  nodeName: {node}\n  \
                 containers:\n  - {{name: main, image: podpath/echo, ports: [{{containerPort: 8080}}]}}\n"
            ));
        }
        for name in ["web-1", "web-2"] {
            self.kubectl(&["wait", "--for=condition=Ready", &format!("pod/{name}"), "--timeout=60s"]);
        }
        self.kubectl(&[
            "expose",
            "pod",
            "web-1",
            "--name=web",
            "--selector=app=web",
            "--type=LoadBalancer",
            "--port=80",
            "--target-port=8080",
        ]);
    }

    /// The LoadBalancer IP of Service `service` (namespace default), once allocated (10 s at
    /// most).
    pub fn lb_ip(&self, service: &str) -> String {
        wait_for(Duration::from_secs(30), &format!("an LB IP for {service}"), || {
            let ip = self.kubectl(&["get", "svc", service, "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]);
            if ip.is_empty() {
                Err("none yet".into())
            } else {
                Ok(ip)
            }
        })
    }

    /// The addresses of the ready endpoints of Service `service` (namespace default), from its
    /// EndpointSlices.
    pub fn ready_endpoints(&self, service: &str) -> Vec<String> {
        let selector = format!("kubernetes.io/service-name={service}");
        let eps = self.kubectl(&["get", "endpointslices", "-l", &selector, "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&eps).unwrap_or_default();
        v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
            .filter(|e| e["conditions"]["ready"] != false)
            .flat_map(|e| e["addresses"].as_array().cloned().unwrap_or_default())
            .filter_map(|a| a.as_str().map(String::from))
            .collect()
    }

    /// lb-sim's status document.
    pub fn lb_status(&self) -> serde_json::Value {
        let out = self.exec("gateway", &["curl", "-sS", "--max-time", "5", "http://127.0.0.1:9900/status"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("lb-sim status is not JSON ({e}): {out}"))
    }

    /// The recorded PID of a component (`apiserver-lite`, `lb-sim`, `node-N`).
    pub fn pid(&self, component: &str) -> i32 {
        let st: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(self.state.join("lab.json")).expect("lab.json"))
                .expect("json");
        st["procs"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["component"] == component))
            .and_then(|p| p["pid"].as_i64())
            .unwrap_or_else(|| panic!("no component {component}")) as i32
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let (ok, out) = self.run("down", &[]);
        if !ok && !out.contains("no lab state") {
            eprintln!("podpath down {}: {out}", self.name);
        }
    }
}

/// Polls `f` every 100 ms until it returns `Some`, or fails after `limit` with the last value.
pub fn wait_for<T>(limit: Duration, what: &str, mut f: impl FnMut() -> std::result::Result<T, String>) -> T {
    let t = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if t.elapsed() >= limit => panic!("timed out after {limit:?} waiting for {what}; last: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A long-running command whose output lines are collected as they come (`podpath rules
/// --watch`, `podpath watch`): wait for what it prints, then [`LineWatch::stop`] it.
pub struct LineWatch {
    child: Child,
    seen: std::sync::Arc<std::sync::Mutex<String>>,
}

impl LineWatch {
    /// Starts `cmd` with its standard output collected.
    pub fn spawn(mut cmd: std::process::Command) -> LineWatch {
        let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().expect("start the watching command");
        let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (stdout, sink) = (child.stdout.take().expect("piped"), seen.clone());
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines().map_while(std::result::Result::ok) {
                sink.lock().unwrap_or_else(|e| e.into_inner()).push_str(&(line + "\n"));
            }
        });
        LineWatch { child, seen }
    }

    /// Waits at most `limit` until the output so far satisfies `done`; that output.
    pub fn wait_until(&self, limit: Duration, what: &str, done: impl Fn(&str) -> bool) -> String {
        wait_for(limit, what, || {
            let s = self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if done(&s) {
                Ok(s)
            } else {
                Err(s)
            }
        })
    }

    /// SIGTERM, as Ctrl-C would end it, and its exit.
    pub fn stop(mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Waits at most `limit` for a command (then kills it): a hang is a failure, never a stuck test.
pub fn wait_bounded(mut child: Child, limit: Duration) -> Output {
    let t = Instant::now();
    while child.try_wait().expect("wait for a child").is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("the command hung for {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("collect a child's output")
}

/// Starts a `kubectl port-forward` command of `ports` ports; returns it once it listens on all.
pub fn start_port_forward(mut cmd: Command, ports: usize) -> Child {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run kubectl port-forward");
    let mut out = child.stdout.take().expect("piped stdout");
    // "Forwarding from 127.0.0.1:P -> Q" once per port.
    let mut seen = String::new();
    let t = Instant::now();
    let mut buf = [0u8; 512];
    while seen.matches("Forwarding from").count() < ports {
        use std::io::Read;
        let n = out.read(&mut buf).unwrap_or(0);
        assert!(n > 0 && t.elapsed() < Duration::from_secs(20), "port-forward did not start: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    // kubectl goes on writing "Handling connection for …"; a closed pipe would kill it.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    child
}
