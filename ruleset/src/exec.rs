//! The one place in the workspace that runs `iptables-save` and `iptables-restore` (and asks
//! `iptables` for a chain or its version): the node agent's proxies, the CNI plugin's
//! masquerade chains, the lab's trace rules and the benchmarks all go through [`Iptables`].

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
            let path = format!("/run/netns/{ns}");
            let entered = std::fs::File::open(&path).map_err(|e| e.to_string()).and_then(|f| {
                nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| e.desc().to_string())
            });
            match entered {
                // As `ip netns exec` says it: the tool's failure, not the caller's.
                Err(e) => Ok(Err(format!("Cannot open network namespace \"{ns}\": {e}"))),
                Ok(()) => run(),
            }
        })
        .join()
        .unwrap_or_else(|_| Ok(Err(format!("the thread that runs {tool} in {ns} panicked"))))
    })
}

/// The line `line N` of an iptables-restore error points at.
fn failed_line(stderr: &str, input: &str) -> Option<String> {
    let n: usize = stderr.split("line ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()?;
    input.lines().nth(n.checked_sub(1)?).map(str::to_string)
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
    }
}
