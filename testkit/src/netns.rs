//! Network namespaces for root tests. Every name carries the test process's PID and a counter,
//! so parallel tests never collide; guards remove exactly what they created.

use std::fs::File;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Runs a command; `(success, stdout + stderr)`.
pub fn sh(args: &[&str]) -> (bool, String) {
    match Command::new(args[0]).args(&args[1..]).output() {
        Ok(o) => {
            (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
        }
        Err(e) => (false, format!("cannot run {}: {e}", args[0])),
    }
}

/// Runs a command that must succeed; its stdout.
pub fn must(args: &[&str]) -> String {
    let (ok, out) = sh(args);
    assert!(ok, "{}: {out}", args.join(" "));
    out
}

/// Whether this process may create namespaces (CI runs as root). Prints why not.
pub fn root_or_explain() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipped: needs root to create network namespaces (CI runs as root)");
    }
    root
}

/// A short name unique to this process and call: `{tag}{pid}{n}`.
pub fn unique(tag: &str) -> String {
    format!("{tag}{}x{}", std::process::id() % 100_000, COUNTER.fetch_add(1, Ordering::SeqCst))
}

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = unique(tag);
        must(&["ip", "netns", "add", &name]);
        must(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        Netns { name }
    }

    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }

    /// Runs a command inside the namespace.
    pub fn run(&self, args: &[&str]) -> (bool, String) {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// `ip -n NAME …`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        must(&full)
    }

    /// Runs `f` on a thread inside the namespace (its sockets, and the processes it starts,
    /// belong there) and returns what it returned.
    pub fn in_thread<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = self.path();
        std::thread::spawn(move || {
            let ns = File::open(&path).expect("open netns");
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// A TCP listener created inside the namespace (a socket stays in the namespace it was
    /// created in, so a server in this process can serve clients of that namespace).
    pub fn bind_tcp(&self, addr: &str) -> std::net::TcpListener {
        let path = self.path();
        let addr = addr.to_string();
        std::thread::spawn(move || {
            let f = File::open(&path).expect("open netns");
            nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let l = std::net::TcpListener::bind(&addr).unwrap_or_else(|e| panic!("bind {addr} in {path}: {e}"));
            l.set_nonblocking(true).expect("nonblocking");
            l
        })
        .join()
        .expect("bind thread")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        sh(&["ip", "netns", "del", &self.name]);
    }
}

/// The host namespace's links, addresses, routes and iptables rules (without counters): tests
/// assert it is the same before and after.
pub fn host_state() -> String {
    let mut s = String::new();
    for args in [&["ip", "-o", "link"][..], &["ip", "-o", "addr"], &["ip", "route"], &["ip", "-6", "route"]] {
        s += &sh(args).1;
    }
    if let (true, rules) = sh(&["iptables-save"]) {
        s += &rules
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" [").next().unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
    }
    s
}

/// A child process killed (by PID) and reaped on drop.
pub struct ProcGuard(pub Child);

impl ProcGuard {
    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }
    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), nix::sys::signal::Signal::SIGTERM);
        let _ = self.0.wait();
    }
}

impl Drop for ProcGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Forwards TCP connections accepted inside a namespace to an address reachable from this
/// process's own namespace (e.g. a server on the host's 127.0.0.1), without any link or route:
/// the listening socket is simply created inside the namespace. Stops on drop.
pub struct Relay {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Relay {
    pub fn start(ns: &Netns, listen: &str, target: std::net::SocketAddr) -> Relay {
        use std::sync::atomic::AtomicBool;
        let listener = ns.bind_tcp(listen);
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((inside, _)) => {
                        let _ = inside.set_nonblocking(false);
                        let Ok(outside) = std::net::TcpStream::connect(target) else { continue };
                        let (mut a, mut b) = (inside.try_clone().expect("clone"), outside.try_clone().expect("clone"));
                        let (mut c, mut d) = (outside, inside);
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut a, &mut b);
                            let _ = b.shutdown(std::net::Shutdown::Write);
                        });
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut c, &mut d);
                            let _ = d.shutdown(std::net::Shutdown::Write);
                        });
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
        });
        Relay { stop }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
