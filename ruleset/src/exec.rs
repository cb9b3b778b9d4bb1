//! The one place in the workspace that runs `iptables-save` and `iptables-restore` (and asks
//! `iptables` for a chain or its version): the node agent's proxies, the CNI plugin's
//! masquerade chains, the lab's trace rules and the benchmarks all go through [`Iptables`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Result, RulesetError};
use crate::model::{Rule, Ruleset};
use crate::text;

/// Which iptables implementation runs. Never both in one namespace: the kernel would evaluate
/// both rulesets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Backend {
    /// `iptables-nft` (nf_tables). The distributions' `iptables` is this one, so a user's
    /// `iptables-save` in a node shows these rules, and netfilter traces are read with
    /// `xtables-monitor --trace`.
    #[default]
    Nft,
    /// `iptables-legacy` (x_tables): every restore replaces the whole table, atomically.
    Legacy,
    /// Whatever `iptables` is on this system (the CNI plugin and the trace use it, as the
    /// reference plugins do).
    System,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Legacy => "legacy",
            Backend::System => "system",
        }
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Backend, String> {
        match s {
            "nft" => Ok(Backend::Nft),
            "legacy" => Ok(Backend::Legacy),
            other => Err(format!("iptables backend {other:?}: expected nft or legacy")),
        }
    }
}

/// IPv4 (`iptables`) or IPv6 (`ip6tables`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Family {
    #[default]
    V4,
    V6,
}

/// `iptables` of one backend and family, in the current network namespace or a named one
/// (`/run/netns/NAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Iptables {
    pub backend: Backend,
    pub family: Family,
    pub netns: Option<String>,
}

/// Finds a tool on PATH or in the usual sbin directories (a CNI plugin's PATH is the runtime's
/// choice and often lacks them).
fn tool_path(name: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .filter(|d| !d.is_empty())
        .chain(["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| PathBuf::from(name))
}

/// Runs `tool args…` (in the named namespace), with `stdin` on its input: Ok(stdout) or
/// Err(stderr) by its exit status; Err(RulesetError) only when it could not be started.
fn run_tool(
    tool: &str,
    netns: &Option<String>,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<std::result::Result<String, String>> {
    let run = || {
        let mut cmd = Command::new(tool_path(tool));
        cmd.args(args).stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let spawn_err = |source| RulesetError::Spawn { cmd: tool.to_string(), netns: netns.clone(), source };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let Some(text) = stdin {
            let mut input = child.stdin.take().expect("piped");
            // A tool that exits early closes its input; its status tells why.
            let _ = input.write_all(text.as_bytes());
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        Ok(if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        })
    };
    let Some(ns) = netns else { return run() };
    // Started from a helper thread inside the namespace (a child starts in its parent thread's
    // namespaces): one program start per call instead of two with `ip netns exec`, whose other
    // work (a mount namespace with the namespace's /sys) these tools do not need. Program starts
    // are most of what a `podpath trace` costs the machine.
    std::thread::scope(|s| {
        s.spawn(|| {
            match enter_netns(ns) {
                // As `ip netns exec` says it: the tool's failure, not the caller's.
                Err(e) => Ok(Err(format!("Cannot open network namespace \"{ns}\": {e}"))),
                Ok(()) => run(),
            }
        })
        .join()
        .unwrap_or_else(|_| Ok(Err(format!("the thread that runs {tool} in {ns} panicked"))))
    })
}

/// The line numbers an iptables-restore error names (`line 12`, `line: 12`), each with where
/// its digits stand in `stderr`.
fn line_refs(stderr: &str) -> Vec<(std::ops::Range<usize>, usize)> {
    let mut refs = vec![];
    for (i, _) in stderr.match_indices("line") {
        let after = i + 4;
        let tail = &stderr[after..];
        let sep = tail.len() - tail.trim_start_matches([':', ' ']).len();
        let digits = tail[sep..].len() - tail[sep..].trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let word = !stderr[..i].ends_with(|c: char| c.is_alphanumeric());
        if let (true, true, Ok(n)) = (word, sep > 0, tail[sep..sep + digits].parse()) {
            refs.push((after + sep..after + sep + digits, n));
        }
    }
    refs
}

/// The line of `input` an iptables-restore error points at.
fn failed_line(stderr: &str, input: &str) -> Option<String> {
    let (_, n) = line_refs(stderr).into_iter().next()?;
    input.lines().nth(n.checked_sub(1)?).map(str::to_string)
}

/// Enters network namespace `ns` (`/run/netns/NS`) on the calling thread; a child started
/// from the thread then belongs to it.
fn enter_netns(ns: &str) -> std::result::Result<(), String> {
    let f = std::fs::File::open(format!("/run/netns/{ns}")).map_err(|e| e.to_string())?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.desc().to_string())
}

impl Iptables {
    pub fn new(backend: Backend) -> Iptables {
        Iptables { backend, ..Default::default() }
    }

    /// The same tool for IPv6.
    pub fn v6(self) -> Iptables {
        Iptables { family: Family::V6, ..self }
    }

    /// The same tool, run in the named network namespace.
    pub fn in_netns(self, netns: &str) -> Iptables {
        Iptables { netns: Some(netns.to_string()), ..self }
    }

    /// `iptables`, `iptables-save` or `iptables-restore` (`suffix`: "", "-save", "-restore") of
    /// this backend and family.
    fn tool(&self, suffix: &str) -> String {
        let base = match self.family {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        };
        match self.backend {
            Backend::System => format!("{base}{suffix}"),
            b => format!("{base}-{}{suffix}", b.name()),
        }
    }

    /// Runs `tool args…` (in the namespace), with `stdin` on its input.
    fn run(&self, suffix: &str, args: &[&str], stdin: Option<&str>) -> Result<std::result::Result<String, String>> {
        run_tool(&self.tool(suffix), &self.netns, args, stdin)
    }

    fn failed(&self, cmd: String, stderr: String, input_line: Option<String>) -> RulesetError {
        RulesetError::Failed { cmd, netns: self.netns.clone(), stderr, input_line }
    }

    /// `iptables-save -t TABLE`, as text.
    pub fn save_text(&self, table: &str) -> Result<String> {
        self.run("-save", &["-t", table], None)?
            .map_err(|e| self.failed(format!("{} -t {table}", self.tool("-save")), e, None))
    }

    /// `iptables-save -t TABLE`, parsed.
    pub fn save(&self, table: &str) -> Result<Ruleset> {
        text::parse(&self.save_text(table)?)
    }

    /// The rules of one chain (`iptables -t TABLE -S CHAIN`), or None when the chain does not
    /// exist. Costs the same in a table of any size, unlike a whole save.
    pub fn list_chain(&self, table: &str, chain: &str) -> Result<Option<Vec<Rule>>> {
        match self.run("", &["-w", "5", "-t", table, "-S", chain], None)? {
            Ok(out) => {
                let mut rules = vec![];
                for line in out.lines().filter(|l| l.starts_with("-A ")) {
                    rules.push(text::parse_rule_line(line)?);
                }
                Ok(Some(rules))
            }
            // iptables-nft 1.8.9 calls a missing chain "incompatible"; the others say so plainly.
            Err(e)
                if ["No chain/target/match by that name", "does not exist", "is incompatible"]
                    .iter()
                    .any(|m| e.contains(m)) =>
            {
                Ok(None)
            }
            Err(e) => Err(self.failed(format!("{} -t {table} -S {chain}", self.tool("")), e, None)),
        }
    }

    /// `iptables-restore --noflush` of `rs`: every table is applied atomically at its COMMIT;
    /// chains it does not mention stay as they are. On failure the error quotes the input line
    /// iptables-restore rejected.
    pub fn restore(&self, rs: &Ruleset) -> Result<()> {
        let input = rs.to_string();
        match self.run("-restore", &["--noflush", "-w", "5"], Some(&input))? {
            Ok(_) => Ok(()),
            Err(e) => {
                let line = failed_line(&e, &input);
                Err(self.failed(self.tool("-restore"), e, line))
            }
        }
    }

    /// The `iptables --version` triple (`v1.8.9` → (1, 8, 9)).
    pub fn version(&self) -> Result<(u32, u32, u32)> {
        let out = self
            .run("", &["--version"], None)?
            .map_err(|e| self.failed(format!("{} --version", self.tool("")), e, None))?;
        let ver = out.split_whitespace().find(|w| w.starts_with('v')).unwrap_or("v0").trim_start_matches('v');
        let mut p = ver.split('.').map(|x| x.parse::<u32>().unwrap_or(0));
        Ok((p.next().unwrap_or(0), p.next().unwrap_or(0), p.next().unwrap_or(0)))
    }

    /// Whether `MASQUERADE --random-fully` is available (iptables ≥ 1.6.2).
    pub fn supports_random_fully(&self) -> bool {
        self.version().is_ok_and(|v| v >= (1, 6, 2))
    }
}

/// `nft`, in the current network namespace or a named one (`/run/netns/NAME`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Nft {
    pub netns: Option<String>,
}

impl Nft {
    pub fn in_netns(netns: &str) -> Nft {
        Nft { netns: Some(netns.to_string()) }
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<std::result::Result<String, String>> {
        run_tool("nft", &self.netns, args, stdin)
    }

    fn failed(&self, cmd: String, stderr: String) -> RulesetError {
        RulesetError::Failed { cmd, netns: self.netns.clone(), stderr, input_line: None }
    }

    /// `nft -f -` of one transaction: all of it or none. The error quotes the line nft
    /// rejected (`/dev/stdin:LINE:…`).
    pub fn apply(&self, tx: &crate::nft::Transaction) -> Result<()> {
        if tx.is_empty() {
            return Ok(());
        }
        let input = tx.text();
        match self.run(&["-f", "-"], Some(&input))? {
            Ok(_) => Ok(()),
            Err(e) => {
                let line = e
                    .split("/dev/stdin:")
                    .nth(1)
                    .and_then(|r| r.split(':').next())
                    .and_then(|n| n.parse::<usize>().ok())
                    .and_then(|n| input.lines().nth(n.checked_sub(1)?))
                    .map(str::to_string);
                Err(RulesetError::Failed {
                    cmd: "nft -f".into(),
                    netns: self.netns.clone(),
                    stderr: e,
                    input_line: line,
                })
            }
        }
    }

    /// `nft list table FAMILY NAME` (with `-j`, JSON); None when there is no such table.
    pub fn list_table(&self, family: crate::nft::NftFamily, name: &str, json: bool) -> Result<Option<String>> {
        let mut args = vec![];
        if json {
            args.push("-j");
        }
        args.extend(["list", "table", family.name(), name]);
        match self.run(&args, None)? {
            Ok(out) => Ok(Some(out)),
            Err(e) if e.contains("No such file or directory") => Ok(None),
            Err(e) => Err(self.failed(format!("nft list table {} {name}", family.name()), e)),
        }
    }

    /// Whether the table exists (`nft list tables FAMILY`).
    pub fn has_table(&self, family: crate::nft::NftFamily, table: &str) -> Result<bool> {
        let want = format!("table {} {table}", family.name());
        match self.run(&["list", "tables", family.name()], None)? {
            Ok(out) => Ok(out.lines().any(|l| l.trim() == want)),
            Err(e) => Err(self.failed(format!("nft list tables {}", family.name()), e)),
        }
    }

    /// The rules of one chain as `nft list chain` prints them (None: no such chain); costs
    /// the same at any table size.
    pub fn chain_rules(&self, family: crate::nft::NftFamily, table: &str, chain: &str) -> Result<Option<Vec<String>>> {
        match self.run(&["list", "chain", family.name(), table, chain], None)? {
            Ok(out) => {
                let lines: Vec<&str> = out.lines().map(str::trim).collect();
                let start = lines.iter().position(|l| l.starts_with("chain ")).map_or(0, |i| i + 1);
                Ok(Some(
                    lines[start..]
                        .iter()
                        .filter(|l| {
                            !l.is_empty() && **l != "}" && !l.starts_with("type ") && !l.starts_with("comment ")
                        })
                        .map(|l| l.to_string())
                        .collect(),
                ))
            }
            Err(e) if e.contains("No such file or directory") => Ok(None),
            Err(e) => Err(self.failed(format!("nft list chain {} {table} {chain}", family.name()), e)),
        }
    }

    /// `nft delete table FAMILY NAME`; nothing when there is none.
    pub fn delete_table(&self, family: crate::nft::NftFamily, name: &str) -> Result<()> {
        match self.run(&["delete", "table", family.name(), name], None)? {
            Ok(_) => Ok(()),
            Err(e) if e.contains("No such file or directory") => Ok(()),
            Err(e) => Err(self.failed(format!("nft delete table {} {name}", family.name()), e)),
        }
    }
}

/// Whether the *other* backend than `backend` holds `chain` in the nat table of this namespace
/// (a proxy started with the other backend before, and not cleaned up). Looked up without side
/// effects: legacy tables of a namespace are listed in `/proc/net/ip_tables_names` once they
/// exist, so the check itself loads no legacy table.
pub fn other_backend_holds(backend: Backend, chain: &str) -> bool {
    let declares = |t: Iptables| t.save("nat").is_ok_and(|rs| rs.tables.iter().any(|t| t.declares(chain)));
    match backend {
        Backend::Nft => {
            let names = std::fs::read_to_string("/proc/net/ip_tables_names").unwrap_or_default();
            names.lines().any(|t| t == "nat") && declares(Iptables::new(Backend::Legacy))
        }
        Backend::Legacy => declares(Iptables::new(Backend::Nft)),
        Backend::System => false,
    }
}

/// How long a [`RestoreSession`] keeps its process once nothing is restored: the syncs of a
/// burst (a Service, then its endpoints a few ms later; a rollout's pods) share one process; a
/// node at rest keeps none (each kept process is ~0.65 MiB of PSS: the lab's memory bench with
/// 5 s here measured two per node).
pub const SESSION_IDLE: Duration = Duration::from_secs(1);

/// A restore that has not finished in this long fails, and its process is ended.
const SESSION_TIMEOUT: Duration = Duration::from_secs(60);

/// A kept process not waiting for input this long after its start is given up.
const SESSION_START: Duration = Duration::from_secs(5);

/// One `iptables-nft-restore --noflush` kept running between restores, fed one input after
/// another on its standard input (it commits each table at its `COMMIT` as it reads it).
///
/// Why: a new iptables-nft-restore per sync is not only a program start. Before its commit it
/// asks the kernel, on one netlink socket each, which revision of every extension it loads
/// (comment, tcp, DNAT, …), and the close of each of those sockets, like the close of its main
/// socket after the commit, waits for nf_tables' pending destroy work — an RCU grace period
/// left by the last commit on the machine: 7–22 ms each with three nodes' proxies syncing at
/// once (`perf` of sched_switch: `netlink_release` → `nft_rcv_nl_event` → `__flush_work`). A
/// kept process has loaded its extensions and keeps its socket open.
///
/// A restore is done when the process, having read all of it, waits for more: `/proc/PID/stat`
/// says it sleeps and then `/proc/PID/syscall` shows a `read` of fd 0 (`waits_for_input`). One that fails
/// exits with its error, whose line numbers count from the session's first input; they are
/// given back counted from this input's. Only for an ELF `iptables-nft-restore` (a wrapper
/// script would read our input in another process) that is seen waiting for input after its
/// start; otherwise, and for the other backends, each restore runs its own process
/// ([`Iptables::restore`]).
#[derive(Debug)]
pub struct RestoreSession {
    ipt: Iptables,
    idle: Duration,
    /// Set when a started process was never seen waiting for input: restores run a process
    /// each.
    unusable: std::sync::atomic::AtomicBool,
    live: Arc<Mutex<Option<Live>>>,
}

#[derive(Debug)]
struct Live {
    child: Child,
    stdin: Option<ChildStdin>,
    stderr: ChildStderr,
    /// What the process wrote on stderr during the current restore.
    err: Vec<u8>,
    /// Lines of input given before the current restore.
    lines: usize,
    used: Instant,
}

impl Drop for Live {
    fn drop(&mut self) {
        // Its input closed, iptables-restore exits by itself (nothing is half applied: every
        // table was committed at its COMMIT).
        self.stdin.take();
        let _ = self.child.wait();
    }
}

impl RestoreSession {
    /// A session for `ipt` when it can keep one (iptables-nft with an ELF restore program);
    /// `None` otherwise.
    pub fn new(ipt: &Iptables) -> Option<RestoreSession> {
        let elf = |p: PathBuf| {
            let mut magic = [0u8; 4];
            std::fs::File::open(p).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
                && magic == *b"\x7fELF"
        };
        (ipt.backend == Backend::Nft && elf(tool_path(&ipt.tool("-restore")))).then(|| RestoreSession {
            ipt: ipt.clone(),
            idle: SESSION_IDLE,
            unusable: Default::default(),
            live: Arc::new(Mutex::new(None)),
        })
    }

    /// The same session ending its process after `idle` unused instead of [`SESSION_IDLE`].
    pub fn with_idle(mut self, idle: Duration) -> RestoreSession {
        self.idle = idle;
        self
    }

    /// Whether the session's process is running (for tests).
    pub fn is_running(&self) -> bool {
        self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner).is_some()
    }

    /// The same as [`Iptables::restore`] of `rs`: each table committed at its COMMIT, chains
    /// not mentioned left alone; on failure the error quotes the rejected line.
    pub fn restore(&self, rs: &Ruleset) -> Result<()> {
        let input = rs.to_string();
        let mut live = self.live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if live.is_none() {
            if self.unusable.load(std::sync::atomic::Ordering::Relaxed) {
                drop(live);
                return self.ipt.restore(rs);
            }
            match self.start()? {
                Some(l) => *live = Some(l),
                None => {
                    tracing::warn!(
                        "{} does not wait for its input where this proxy can see it; a process per restore from now on",
                        self.ipt.tool("-restore")
                    );
                    self.unusable.store(true, std::sync::atomic::Ordering::Relaxed);
                    drop(live);
                    return self.ipt.restore(rs);
                }
            }
            self.reap_when_idle();
        }
        let l = live.as_mut().expect("started above");
        match l.apply(&input) {
            Ok(()) => {
                l.lines += input.lines().count();
                l.used = Instant::now();
                Ok(())
            }
            Err(stderr) => {
                let stderr = renumber(&stderr, l.lines);
                // The process has exited (or was ended): the next restore starts another.
                let gone = live.take();
                drop(live);
                drop(gone);
                let line = failed_line(&stderr, &input);
                Err(RulesetError::Failed {
                    cmd: self.ipt.tool("-restore"),
                    netns: self.ipt.netns.clone(),
                    stderr,
                    input_line: line,
                })
            }
        }
    }

    /// Its process, started and waiting for input; None when it cannot be kept here.
    fn start(&self) -> Result<Option<Live>> {
        let tool = self.ipt.tool("-restore");
        let spawn = || {
            Command::new(tool_path(&tool))
                .args(["--noflush", "-w", "5"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
        };
        let spawned = match &self.ipt.netns {
            None => spawn(),
            Some(ns) => std::thread::scope(|s| {
                s.spawn(|| {
                    enter_netns(ns).map_err(|e| std::io::Error::other(format!("cannot enter {ns}: {e}")))?;
                    spawn()
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the thread that starts it panicked")))
            }),
        };
        let mut child = spawned.map_err(|source| RulesetError::Spawn {
            cmd: tool.clone(),
            netns: self.ipt.netns.clone(),
            source,
        })?;
        let (stdin, stderr) = (child.stdin.take().expect("piped"), child.stderr.take().expect("piped"));
        // Its warnings are read as they come, so that a full pipe never stops it.
        let nonblocking = nix::fcntl::fcntl(&stderr, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK));
        if let Err(e) = nonblocking {
            let _ = child.kill();
            let _ = child.wait();
            return Err(RulesetError::Spawn { cmd: tool, netns: self.ipt.netns.clone(), source: e.into() });
        }
        let mut live = Live { child, stdin: Some(stdin), stderr, err: vec![], lines: 0, used: Instant::now() };
        // It reads its input as soon as it has started: until it is seen waiting there, its
        // end of a restore could not be seen either (another kernel's numbering of `read`, a
        // /proc without `syscall`): then none is kept.
        let pid = live.child.id();
        while !waits_for_input(pid) {
            if live.used.elapsed() > SESSION_START || !matches!(live.child.try_wait(), Ok(None)) {
                let _ = live.child.kill();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        Ok(Some(live))
    }

    /// Ends the process once it has been idle for `idle` (a thread that lives as long as it).
    fn reap_when_idle(&self) {
        let (live, idle) = (Arc::downgrade(&self.live), self.idle);
        let reaper = move || loop {
            let Some(live) = live.upgrade() else { return };
            let mut g = live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let wait = match g.as_ref() {
                None => return,
                Some(l) => idle.saturating_sub(l.used.elapsed()),
            };
            if wait.is_zero() {
                let gone = g.take();
                drop(g);
                drop(gone);
                return;
            }
            drop(g);
            drop(live);
            std::thread::sleep(wait);
        };
        // Without the thread the process lives until the session is dropped: no error.
        let _ = std::thread::Builder::new().name("restore-idle".into()).spawn(reaper);
    }
}

impl Live {
    /// Gives `input` to the process and waits until it has taken all of it: Ok, or Err(its
    /// stderr) once it has exited (or was ended for not finishing).
    fn apply(&mut self, input: &str) -> std::result::Result<(), String> {
        self.err.clear();
        let pid = self.child.id();
        // A process that has exited closes its input; its exit is seen below.
        let wrote = self.stdin.as_mut().is_some_and(|s| s.write_all(input.as_bytes()).and_then(|_| s.flush()).is_ok());
        let started = Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            self.drain_stderr();
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.drain_stderr();
                    let text = String::from_utf8_lossy(&self.err).trim().to_string();
                    return Err(if text.is_empty() { format!("exited ({status})") } else { text });
                }
                Ok(None) => {}
                Err(e) => return Err(format!("cannot wait for it: {e}")),
            }
            if wrote && waits_for_input(pid) {
                return Ok(());
            }
            if started.elapsed() > SESSION_TIMEOUT {
                let _ = self.child.kill();
                return Err(format!("did not finish in {} s; ended", SESSION_TIMEOUT.as_secs()));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn drain_stderr(&mut self) {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = std::io::Read::read(&mut self.stderr, &mut buf) {
            // Bounded: only an error's first lines matter.
            if self.err.len() < 64 << 10 {
                self.err.extend_from_slice(&buf[..n]);
            }
        }
    }
}

/// Whether process `pid` sleeps in `read(0, …)`: `/proc/PID/syscall` starts with the call's
/// number (`SYS_read`: 0 on x86-64, 63 on aarch64) and its first argument (fd 0).
///
/// The sleep is read first, from `/proc/PID/stat`: a task our write has just woken but no CPU
/// has run yet (`TASK_WAKING`) still shows the `read` it was blocked in under `syscall` — a
/// restore seen done before it had read its input (once in CI) — while `stat` already says
/// `R`. Seen sleeping after our write, the task has run since; seen in `read(0)` after that,
/// it has taken all of the input (only a write of ours wakes it from there).
fn waits_for_input(pid: u32) -> bool {
    let sleeping = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('S')));
    sleeping
        && std::fs::read_to_string(format!("/proc/{pid}/syscall"))
            .is_ok_and(|s| s.strip_prefix(&format!("{} 0x0 ", libc::SYS_read)).is_some())
}

/// `stderr` with the line numbers it names (`line 12`, `line: 12`) counted after `offset`
/// earlier lines of input.
fn renumber(stderr: &str, offset: usize) -> String {
    let mut out = String::with_capacity(stderr.len());
    let mut from = 0;
    for (at, n) in line_refs(stderr).into_iter().filter(|(_, n)| offset > 0 && *n > offset) {
        out.push_str(&stderr[from..at.start]);
        out.push_str(&(n - offset).to_string());
        from = at.end;
    }
    out.push_str(&stderr[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_per_backend_family_and_namespace() {
        assert_eq!(Iptables::new(Backend::Nft).tool("-restore"), "iptables-nft-restore");
        assert_eq!(Iptables::new(Backend::Legacy).v6().tool("-save"), "ip6tables-legacy-save");
        assert_eq!(Iptables::new(Backend::System).tool(""), "iptables");
        assert_eq!("legacy".parse::<Backend>(), Ok(Backend::Legacy));
        assert!("both".parse::<Backend>().is_err());
    }

    #[test]
    fn a_restore_error_quotes_the_line_it_names() {
        let input = "*nat\n:X - [0:0]\n-A X -j NOPE\nCOMMIT\n";
        assert_eq!(failed_line("iptables-restore: line 3 failed", input).as_deref(), Some("-A X -j NOPE"));
        assert_eq!(
            failed_line("iptables-restore v1.8.9 (nf_tables): line 3: RULE_APPEND failed (No such file)", input)
                .as_deref(),
            Some("-A X -j NOPE")
        );
        assert_eq!(failed_line("something else", input), None);
        let nft = "iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist\nError occurred at line: 3\n";
        assert_eq!(failed_line(nft, input).as_deref(), Some("-A X -j NOPE"));
    }

    #[test]
    fn a_sessions_error_counts_lines_from_its_own_input() {
        let e = "iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist\nError occurred at line: 12\nTry `iptables-nft-restore -h'";
        assert_eq!(
            renumber(e, 9),
            "iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist\nError occurred at line: 3\nTry `iptables-nft-restore -h'"
        );
        assert_eq!(renumber("iptables-restore: line 14 failed", 10), "iptables-restore: line 4 failed");
        // Nothing else changes: no offset, numbers not after "line", a line before the offset.
        assert_eq!(renumber("iptables-restore: line 14 failed", 0), "iptables-restore: line 14 failed");
        assert_eq!(renumber("pipeline 30 of 40: line 2", 10), "pipeline 30 of 40: line 2");
    }
}
