//! What the service proxies and the NetworkPolicy enforcer ask of the kernel's iptables
//! tables, behind one small trait: save a table, restore a ruleset, clear conntrack entries.
//! [`IptablesKernel`] does it with [`Iptables`] (the workspace's one runner of
//! iptables-save/-restore) and `conntrack`; tests use fakes (`testkit::iptables`).
//!
//! Also here, pure: the jumps from built-in chains into a mode's chains ([`Jump`]), which a
//! sync adds where `iptables-save` lacks them and a cleanup removes, both in one restore.

use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::exec::RestoreSession;
use crate::{Backend, Command as RuleCommand, Iptables, Result, Rule, Ruleset, Table};

/// The kernel's side of a proxy.
pub trait Kernel: Send + Sync + 'static {
    /// The rules of `table` as the kernel holds them (`iptables-save -t TABLE`); with `chain`,
    /// only that chain (absent from the table when it does not exist), which costs the same in
    /// a table of any size.
    fn save(&self, table: &str, chain: Option<&str>) -> Result<Table>;
    /// `iptables-restore --noflush` of one input: each table changes atomically.
    fn restore(&self, rs: &Ruleset) -> Result<()>;
    /// Deletes conntrack entries: `conntrack -D` with each argument list ("no entries" is no
    /// error).
    fn clear_conntrack(&self, deletes: &[Vec<String>]);
    /// Largest restore input (in lines) worth sending at once; `None`: any size (see
    /// `podpath_ruleset::plan`).
    fn batch_lines(&self) -> Option<usize> {
        None
    }
}

/// iptables-nft restore batch size: 2,000-line batches took 1.3 s for 1,000 Services × 10
/// endpoints where one 47,000-line restore took 5 s (benches/proxy.rs); smaller batches add
/// process starts without gaining more.
pub const NFT_BATCH_LINES: usize = 2000;

/// The real kernel: one iptables backend in the current network namespace. Restores go
/// through one kept `iptables-nft-restore` where the backend allows ([`RestoreSession`]: why).
#[derive(Debug, Clone)]
pub struct IptablesKernel {
    pub ipt: Iptables,
    session: Option<Arc<RestoreSession>>,
}

impl IptablesKernel {
    pub fn new(backend: Backend) -> IptablesKernel {
        Self::of(Iptables::new(backend))
    }

    fn of(ipt: Iptables) -> IptablesKernel {
        let session = RestoreSession::new(&ipt).map(Arc::new);
        IptablesKernel { ipt, session }
    }

    /// The same backend for IPv6 (`ip6tables`): a dual-stack node's second proxier and enforcer.
    pub fn v6(&self) -> IptablesKernel {
        Self::of(self.ipt.clone().v6())
    }
}

impl Kernel for IptablesKernel {
    fn save(&self, table: &str, chain: Option<&str>) -> Result<Table> {
        match chain {
            None => {
                let rs = self.ipt.save(table)?;
                Ok(rs.tables.into_iter().find(|t| t.name == table).unwrap_or_else(|| Table::new(table)))
            }
            Some(c) => {
                let mut t = Table::new(table);
                if let Some(rules) = self.ipt.list_chain(table, c)? {
                    t.declare(c);
                    rules.into_iter().for_each(|r| t.append(r));
                }
                Ok(t)
            }
        }
    }

    fn restore(&self, rs: &Ruleset) -> Result<()> {
        match &self.session {
            Some(s) => s.restore(rs),
            None => self.ipt.restore(rs),
        }
    }

    fn clear_conntrack(&self, deletes: &[Vec<String>]) {
        conntrack_delete(deletes)
    }

    fn batch_lines(&self) -> Option<usize> {
        match self.ipt.backend {
            Backend::Nft => Some(NFT_BATCH_LINES),
            Backend::Legacy | Backend::System => None,
        }
    }
}

/// `conntrack -D` with each argument list, in the current namespace ("no entries" is no error).
pub fn conntrack_delete(deletes: &[Vec<String>]) {
    for args in deletes {
        let status = Command::new("conntrack").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status();
        if let Err(e) = status {
            tracing::warn!("cannot run conntrack to clear stale UDP flows ({e}); install the conntrack package");
            return;
        }
    }
}

/// Shared implementations (a fake kept by a test as well as by the proxier).
impl<K: Kernel> Kernel for std::sync::Arc<K> {
    fn save(&self, table: &str, chain: Option<&str>) -> Result<Table> {
        (**self).save(table, chain)
    }
    fn restore(&self, rs: &Ruleset) -> Result<()> {
        (**self).restore(rs)
    }
    fn clear_conntrack(&self, deletes: &[Vec<String>]) {
        (**self).clear_conntrack(deletes)
    }
    fn batch_lines(&self) -> Option<usize> {
        (**self).batch_lines()
    }
}

/// A jump from a built-in chain into one of a mode's chains (kube-proxy's `iptablesJumpChains`,
/// the userspace mode's `iptablesInit`): `[-m conntrack --ctstate NEW] [-m addrtype --dst-type
/// LOCAL] -m comment --comment COMMENT -j TO`, first or last in `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jump {
    pub table: &'static str,
    pub from: &'static str,
    pub to: &'static str,
    /// Inserted first (`-I FROM 1`) or appended.
    pub first: bool,
    /// Only new connections (`-m conntrack --ctstate NEW`).
    pub new_only: bool,
    /// Only to local addresses (`-m addrtype --dst-type LOCAL`).
    pub local_only: bool,
    pub comment: &'static str,
}

impl Jump {
    pub fn rule(&self) -> Rule {
        let mut r = Rule::new(self.from);
        if self.new_only {
            r = r.ct_state(&["NEW"]);
        }
        if self.local_only {
            r = r.dst_type("LOCAL");
        }
        // kubelet's jumps carry no comment.
        if !self.comment.is_empty() {
            r = r.comment(self.comment);
        }
        r.jump(self.to)
    }
}

/// The commands that add the jumps of `table` that `saved` (the kernel's table) lacks.
pub fn missing_jumps(jumps: &[Jump], table: &str, saved: &Table) -> Vec<RuleCommand> {
    jumps
        .iter()
        .filter(|j| j.table == table)
        .filter(|j| !saved.rules().any(|r| *r == j.rule()))
        .map(|j| match j.first {
            true => RuleCommand::Insert { position: 1, rule: j.rule() },
            false => RuleCommand::Append(j.rule()),
        })
        .collect()
}

/// One restore that removes every copy of `jumps` found in `saved` (the kernel's tables) and
/// then the chains `ours` picks, emptied and deleted (declaring a chain flushes it, so chains
/// that jump to each other go at once). Empty when there is nothing to remove.
pub fn removal(jumps: &[Jump], saved: &[Table], ours: impl Fn(&str, &str) -> bool) -> Ruleset {
    let mut rs = Ruleset::default();
    for t in saved {
        let mut out = Table::new(&t.name);
        for j in jumps.iter().filter(|j| j.table == t.name) {
            let rule = j.rule();
            for _ in t.rules().filter(|r| **r == rule) {
                out.commands.push(RuleCommand::Delete(rule.clone()));
            }
        }
        for c in t.chains.iter().filter(|c| c.policy.is_none() && ours(&t.name, &c.name)) {
            out.declare(c.name.clone());
            out.commands.push(RuleCommand::DeleteChain(c.name.clone()));
        }
        if !out.commands.is_empty() {
            rs.tables.push(out);
        }
    }
    rs
}
