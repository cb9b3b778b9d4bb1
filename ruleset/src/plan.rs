//! How a rendered ruleset is written to the kernel (pure). The renderer's ruleset is what
//! kube-proxy would write; this module decides how much of it to send and in how many
//! restores, because that is what the iptables backends are sensitive to
//! (reference/restore-timings.md):
//! - partial syncs leave out every chain whose rules equal what the last sync applied (a
//!   one-endpoint change at 10,000 Services then writes a few chains, not the 20,000-rule
//!   `KUBE-SERVICES`/`KUBE-NODEPORTS`);
//! - with the nft backend, a large restore is split into batches at chain boundaries, ordered so
//!   that a chain is always complete before anything jumps to it and stale chains go last: every
//!   chain changes atomically and no rule ever points to a missing or half-written chain, but
//!   the table as a whole does not change in one step (iptables-nft's cost per batch grows
//!   faster than linearly with its size: 43,000 lines take 5 s in one batch and 1.3 s in 2,000-line
//!   batches; 470,000 do not finish in 20 minutes in one batch and take 16 s in batches).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::model::{ChainDecl, Command, Rule, Ruleset, Table};

/// A declared chain with the rules appended to it.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    decl: ChainDecl,
    rules: Vec<Rule>,
}

/// A table grouped by chain: its declared chains with their rules, and the other commands (`-X`,
/// `-I`, `-D`, `-F`, appends to chains it does not declare) in order.
#[derive(Debug, Clone, PartialEq)]
struct Grouped {
    name: String,
    blocks: Vec<Block>,
    rest: Vec<Command>,
}

fn group(t: &Table) -> Grouped {
    // Chain name → block (10,000 Services declare 110,000 chains).
    let index: HashMap<&str, usize> = t.chains.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
    let mut blocks: Vec<Block> = t.chains.iter().map(|c| Block { decl: c.clone(), rules: vec![] }).collect();
    let mut rest = vec![];
    for c in &t.commands {
        match c {
            Command::Append(r) if index.contains_key(r.chain.as_str()) => {
                blocks[index[r.chain.as_str()]].rules.push(r.clone())
            }
            other => rest.push(other.clone()),
        }
    }
    Grouped { name: t.name.clone(), blocks, rest }
}

fn table_of(name: &str, blocks: &[&Block], rest: &[Command]) -> Table {
    let mut t = Table::new(name);
    t.chains = blocks.iter().map(|b| b.decl.clone()).collect();
    t.commands = blocks.iter().flat_map(|b| b.rules.iter().cloned().map(Command::Append)).collect();
    t.commands.extend(rest.iter().cloned());
    t
}

fn deleted_chains(rest: &[Command]) -> BTreeSet<&str> {
    rest.iter()
        .filter_map(|c| match c {
            Command::DeleteChain(name) => Some(name.as_str()),
            _ => None,
        })
        .collect()
}

/// What the kernel holds of our chains after the syncs so far: (table, chain) → rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied(BTreeMap<(String, String), Vec<Rule>>);

impl Applied {
    /// Records a successfully applied input.
    pub fn record(&mut self, rs: &Ruleset) {
        for t in rs.tables.iter().map(group) {
            for b in &t.blocks {
                self.0.insert((t.name.clone(), b.decl.name.clone()), b.rules.clone());
            }
            for d in deleted_chains(&t.rest) {
                self.0.remove(&(t.name.clone(), d.to_string()));
            }
        }
    }
    /// The number of rules of ours the kernel holds in a table (kube-proxy's
    /// `sync_proxy_rules_iptables_total`).
    pub fn rule_count(&self, table: &str) -> usize {
        self.0.iter().filter(|((t, _), _)| t == table).map(|(_, rules)| rules.len()).sum()
    }
    /// The chains of a table the kernel holds from us.
    pub fn chains(&self, table: &str) -> BTreeSet<String> {
        self.0.keys().filter(|(t, _)| t == table).map(|(_, c)| c.clone()).collect()
    }
    /// What differs between the chains recorded here and the kernel's `saved` tables: a chain
    /// of ours missing, or holding another number of rules than we wrote (emptied by `-F`, a
    /// rule deleted or inserted). Counts, not texts: `iptables-save` prints some matches in
    /// another order than they were written, so a text comparison would see drift forever.
    pub fn drift(&self, saved: &[crate::Table]) -> Vec<String> {
        let mut out = vec![];
        for ((table, chain), rules) in &self.0 {
            let Some(t) = saved.iter().find(|t| &t.name == table) else {
                out.push(format!("table {table} is gone"));
                continue;
            };
            if !t.declares(chain) {
                out.push(format!("{table} chain {chain} is gone"));
                continue;
            }
            let held = t.rules().filter(|r| &r.chain == chain).count();
            if held != rules.len() {
                out.push(format!("{table} chain {chain} holds {held} rules where {} were written", rules.len()));
            }
        }
        out
    }

    /// Forgets everything (after a failed sync: the next one is full).
    pub fn clear(&mut self) {
        self.0.clear();
    }
    fn holds(&self, table: &str, b: &Block) -> bool {
        self.0.get(&(table.to_string(), b.decl.name.clone())) == Some(&b.rules)
    }
}

/// Leaves out the chains whose rules the kernel already holds (for partial syncs; a full sync
/// writes everything, which is how it repairs a table someone changed).
pub fn minimize(rs: &Ruleset, applied: &Applied) -> Ruleset {
    let tables = rs
        .tables
        .iter()
        .map(group)
        .map(|t| {
            let changed: Vec<&Block> = t.blocks.iter().filter(|b| !applied.holds(&t.name, b)).collect();
            table_of(&t.name, &changed, &t.rest)
        })
        .filter(|t| !t.chains.is_empty() || !t.commands.is_empty())
        .collect();
    Ruleset { tables }
}

/// The blocks of `t` with every chain after the chains (of this input) it jumps to.
fn dependency_order(t: &Grouped) -> Vec<&Block> {
    let by_name: BTreeMap<&str, &Block> = t.blocks.iter().map(|b| (b.decl.name.as_str(), b)).collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    let mut out = vec![];
    // Depth-first, callees first; our chains form a DAG (a cycle would only be written as is).
    fn visit<'a>(
        b: &'a Block,
        by_name: &BTreeMap<&str, &'a Block>,
        done: &mut BTreeSet<&'a str>,
        out: &mut Vec<&'a Block>,
    ) {
        if !done.insert(b.decl.name.as_str()) {
            return;
        }
        for rule in &b.rules {
            if let Some(callee) = rule.jump_target().and_then(|t| by_name.get(t)) {
                visit(callee, by_name, done, out);
            }
        }
        out.push(b);
    }
    for b in &t.blocks {
        visit(b, &by_name, &mut done, &mut out);
    }
    out
}

/// The restore inputs to run in order. `max_lines: None` gives one input (one atomic restore),
/// each table grouped by chain; otherwise batches of about `max_lines` lines, cut only between
/// chains (a chain longer than that is a batch of its own), callees before callers, `-X`, `-I`
/// and the other commands in the last batch of their table.
pub fn batches(rs: &Ruleset, max_lines: Option<usize>) -> Vec<Ruleset> {
    let grouped: Vec<Grouped> = rs.tables.iter().map(group).collect();
    let Some(max) = max_lines else {
        let tables: Vec<Table> =
            grouped.iter().map(|t| table_of(&t.name, &t.blocks.iter().collect::<Vec<_>>(), &t.rest)).collect();
        return if tables.is_empty() { vec![] } else { vec![Ruleset { tables }] };
    };
    let mut out = vec![];
    let one = |t: Table| Ruleset { tables: vec![t] };
    for t in &grouped {
        // A stale chain is emptied in the batch that deletes it, after everything that jumped to
        // it was rewritten.
        let deleted = deleted_chains(&t.rest);
        let (stale, live): (Vec<&Block>, Vec<&Block>) =
            dependency_order(t).into_iter().partition(|b| deleted.contains(b.decl.name.as_str()));
        let mut batch: Vec<&Block> = vec![];
        let mut lines = 0;
        for b in live {
            let size = b.rules.len() + 1;
            if !batch.is_empty() && lines + size > max {
                out.push(one(table_of(&t.name, &batch, &[])));
                batch.clear();
                lines = 0;
            }
            batch.push(b);
            lines += size;
        }
        if !stale.is_empty() && !batch.is_empty() && lines + stale.len() > max {
            out.push(one(table_of(&t.name, &batch, &[])));
            batch.clear();
        }
        batch.extend(stale);
        if !batch.is_empty() || !t.rest.is_empty() {
            out.push(one(table_of(&t.name, &batch, &t.rest)));
        }
    }
    // Batches of different tables that fit together go in one restore: a partial sync that
    // changes filter and nat runs one process, not two (each costs a fork, exec and a cache of
    // the kernel's rules).
    let lines = |r: &Ruleset| r.tables.iter().map(|t| t.chains.len() + t.commands.len()).sum::<usize>();
    let mut merged: Vec<Ruleset> = Vec::with_capacity(out.len());
    for r in out {
        match merged.last_mut() {
            Some(m)
                if lines(m) + lines(&r) <= max
                    && r.tables.iter().all(|t| m.tables.iter().all(|u| u.name != t.name)) =>
            {
                m.tables.extend(r.tables)
            }
            _ => merged.push(r),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse;

    const TEXT: &str = "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.9 -j REJECT\nCOMMIT\n\
        *nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-1 - [0:0]\n:KUBE-SEP-2 - [0:0]\n:KUBE-SEP-OLD - [0:0]\n\
        -A KUBE-SERVICES -d 10.96.0.1 -j KUBE-SVC-A\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
        -A KUBE-SVC-A -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-1\n-A KUBE-SVC-A -j KUBE-SEP-2\n\
        -A KUBE-SEP-1 -s 10.244.1.2 -j KUBE-MARK-MASQ\n-A KUBE-SEP-1 -j DNAT --to-destination 10.244.1.2:80\n\
        -A KUBE-SEP-2 -j DNAT --to-destination 10.244.2.2:80\n-X KUBE-SEP-OLD\nCOMMIT\n";

    fn rules_per_chain(t: &Table) -> Vec<usize> {
        t.chains.iter().map(|c| t.chain_rules(&c.name).count()).collect()
    }

    #[test]
    fn one_batch_reproduces_the_input_grouped_by_chain() {
        let rs = parse(TEXT).unwrap();
        assert_eq!(rules_per_chain(&rs.tables[1]), vec![1, 1, 2, 2, 1, 0]);
        let out = batches(&rs, None);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].to_string(), TEXT, "this input is grouped by chain already");
    }

    #[test]
    fn small_batches_of_different_tables_share_one_restore() {
        let rs = parse(TEXT).unwrap();
        // filter (2 lines) and nat (16) fit in 20 lines: one restore, the tables in order.
        let out = batches(&rs, Some(20));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tables.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["filter", "nat"]);
        let count = |rs: &Ruleset| rs.tables.iter().map(|t| t.rules().count()).sum::<usize>();
        assert_eq!(count(&out[0]), count(&rs));
        // Two batches of one table never merge, and a table that does not fit stays apart.
        let out = batches(&rs, Some(8));
        assert!(out.iter().all(|b| b.tables.len() == 1
            || b.tables.iter().map(|t| &t.name).collect::<BTreeSet<_>>().len() == b.tables.len()));
        assert!(out.len() >= 3, "{out:?}");
    }

    #[test]
    fn batches_put_callees_first_cut_between_chains_and_delete_last() {
        let out = batches(&parse(TEXT).unwrap(), Some(3));
        let order: Vec<String> =
            out.iter().flat_map(|b| b.tables.iter().flat_map(|t| t.chains.iter().map(|c| c.name.clone()))).collect();
        assert_eq!(
            order,
            [
                "KUBE-SERVICES",
                "KUBE-MARK-MASQ",
                "KUBE-SEP-1",
                "KUBE-SEP-2",
                "KUBE-SVC-A",
                "KUBE-SERVICES",
                "KUBE-SEP-OLD"
            ]
            .map(String::from)
        );
        let last = out.last().unwrap().to_string();
        assert!(
            last.contains(":KUBE-SEP-OLD - [0:0]\n") && last.contains("-X KUBE-SEP-OLD\n"),
            "emptied where deleted"
        );
        // Every chain's declaration and rules are in the same batch, and no rule is lost.
        let count = |rs: &Ruleset| rs.tables.iter().map(|t| t.rules().count()).sum::<usize>();
        for b in &out {
            for t in &b.tables {
                assert_eq!(t.rules().count(), t.chains.iter().map(|c| t.chain_rules(&c.name).count()).sum::<usize>());
            }
        }
        assert_eq!(out.iter().map(count).sum::<usize>(), count(&parse(TEXT).unwrap()));
    }

    #[test]
    fn minimize_leaves_out_what_the_kernel_holds() {
        let rs = parse(TEXT).unwrap();
        let mut applied = Applied::default();
        applied.record(&rs);
        let changed = TEXT.replace("10.244.2.2:80", "10.244.2.3:80").replace(":KUBE-SEP-OLD - [0:0]\n", "");
        let min = minimize(&parse(&changed).unwrap(), &applied);
        assert_eq!(min.tables.len(), 1, "filter unchanged");
        assert_eq!(min.tables[0].chains.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["KUBE-SEP-2"]);
        assert_eq!(
            min.tables[0].commands.last(),
            Some(&Command::DeleteChain("KUBE-SEP-OLD".into())),
            "deletions are always written"
        );
        applied.clear();
        assert_eq!(minimize(&rs, &applied), batches(&rs, None)[0]);
    }
}
