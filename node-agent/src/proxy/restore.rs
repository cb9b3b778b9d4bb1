//! How a rendered `iptables-restore` input is written to the kernel (pure). The renderer's text is
//! what kube-proxy would write; this module decides how much of it to send and in how many
//! batches, because that is what the iptables backends are sensitive to
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

use std::collections::{BTreeMap, BTreeSet};

/// One chain of a restore input: declared (`:NAME - [0:0]`, which flushes it) with its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainBlock {
    pub name: String,
    pub rules: Vec<String>,
}

/// One table of a restore input.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableInput {
    pub name: String,
    pub chains: Vec<ChainBlock>,
    /// `-X NAME` lines (stale chains), in order.
    pub deletes: Vec<String>,
    /// Whole lines written after everything else of the table (`-I` of jumps from built-in
    /// chains, once their targets exist).
    pub inserts: Vec<String>,
}

/// Parses a restore input as the renderer writes it (every chain it fills is declared).
pub fn parse(text: &str) -> Vec<TableInput> {
    let mut tables: Vec<TableInput> = vec![];
    // Chain name → index in the current table (10,000 Services declare 110,000 chains).
    let mut index: std::collections::HashMap<String, usize> = Default::default();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix('*') {
            tables.push(TableInput { name: name.to_string(), ..Default::default() });
            index.clear();
            continue;
        }
        let Some(table) = tables.last_mut() else { continue };
        if let Some(decl) = line.strip_prefix(':') {
            let name = decl.split_whitespace().next().unwrap_or_default().to_string();
            index.insert(name.clone(), table.chains.len());
            table.chains.push(ChainBlock { name, rules: vec![] });
        } else if let Some(rest) = line.strip_prefix("-A ") {
            let chain = rest.split_whitespace().next().unwrap_or_default();
            if let Some(&i) = index.get(chain) {
                table.chains[i].rules.push(line.to_string());
            }
        } else if let Some(chain) = line.strip_prefix("-X ") {
            table.deletes.push(chain.trim().to_string());
        }
    }
    tables
}

/// What the kernel holds of our chains after the syncs so far: (table, chain) → rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied(BTreeMap<(String, String), Vec<String>>);

impl Applied {
    /// Records a successfully applied input.
    pub fn record(&mut self, tables: &[TableInput]) {
        for t in tables {
            for c in &t.chains {
                self.0.insert((t.name.clone(), c.name.clone()), c.rules.clone());
            }
            for d in &t.deletes {
                self.0.remove(&(t.name.clone(), d.clone()));
            }
        }
    }
    /// The chains of a table the kernel holds from us.
    pub fn chains(&self, table: &str) -> BTreeSet<String> {
        self.0.keys().filter(|(t, _)| t == table).map(|(_, c)| c.clone()).collect()
    }
    /// Forgets everything (after a failed sync: the next one is full).
    pub fn clear(&mut self) {
        self.0.clear();
    }
    fn holds(&self, table: &str, chain: &ChainBlock) -> bool {
        self.0.get(&(table.to_string(), chain.name.clone())) == Some(&chain.rules)
    }
}

/// Leaves out the chains whose rules the kernel already holds (for partial syncs; a full sync
/// writes everything, which is how it repairs a table someone changed).
pub fn minimize(tables: &[TableInput], applied: &Applied) -> Vec<TableInput> {
    tables
        .iter()
        .map(|t| TableInput {
            name: t.name.clone(),
            chains: t.chains.iter().filter(|c| !applied.holds(&t.name, c)).cloned().collect(),
            deletes: t.deletes.clone(),
            inserts: t.inserts.clone(),
        })
        .filter(|t| !t.chains.is_empty() || !t.deletes.is_empty() || !t.inserts.is_empty())
        .collect()
}

fn jump_targets(rule: &str) -> impl Iterator<Item = &str> {
    let words: Vec<&str> = rule.split_whitespace().collect();
    let targets: Vec<&str> = words.windows(2).filter(|w| w[0] == "-j" || w[0] == "-g").map(|w| w[1]).collect();
    targets.into_iter()
}

/// The chains of `t` with every chain after the chains (of this input) it jumps to.
fn dependency_order(t: &TableInput) -> Vec<&ChainBlock> {
    let by_name: BTreeMap<&str, &ChainBlock> = t.chains.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    let mut out = vec![];
    // Depth-first, callees first; our chains form a DAG (a cycle would only be written as is).
    fn visit<'a>(
        c: &'a ChainBlock,
        by_name: &BTreeMap<&str, &'a ChainBlock>,
        done: &mut BTreeSet<&'a str>,
        out: &mut Vec<&'a ChainBlock>,
    ) {
        if !done.insert(c.name.as_str()) {
            return;
        }
        for rule in &c.rules {
            for target in jump_targets(rule) {
                if let Some(callee) = by_name.get(target) {
                    visit(callee, by_name, done, out);
                }
            }
        }
        out.push(c);
    }
    for c in &t.chains {
        visit(c, &by_name, &mut done, &mut out);
    }
    out
}

fn write_batch(table: &str, chains: &[&ChainBlock], deletes: &[String], inserts: &[String]) -> String {
    let mut s = format!("*{table}\n");
    for c in chains {
        s.push_str(&format!(":{} - [0:0]\n", c.name));
    }
    for c in chains {
        for r in &c.rules {
            s.push_str(r);
            s.push('\n');
        }
    }
    for d in deletes {
        s.push_str(&format!("-X {d}\n"));
    }
    for line in inserts {
        s.push_str(line);
        s.push('\n');
    }
    s.push_str("COMMIT\n");
    s
}

/// The restore inputs to run in order. `max_lines: None` gives one input (one atomic restore);
/// otherwise batches of about `max_lines` lines, cut only between chains (a chain longer than
/// that is a batch of its own), callees before callers, `-X` and inserted lines in the last
/// batch of their table.
pub fn batches(tables: &[TableInput], max_lines: Option<usize>) -> Vec<String> {
    let Some(max) = max_lines else {
        let text: String = tables
            .iter()
            .map(|t| write_batch(&t.name, &t.chains.iter().collect::<Vec<_>>(), &t.deletes, &t.inserts))
            .collect();
        return if text.is_empty() { vec![] } else { vec![text] };
    };
    let mut out = vec![];
    for t in tables {
        // A stale chain is emptied in the batch that deletes it, after everything that jumped to
        // it was rewritten.
        let deleted: BTreeSet<&str> = t.deletes.iter().map(String::as_str).collect();
        let (stale, live): (Vec<&ChainBlock>, Vec<&ChainBlock>) =
            dependency_order(t).into_iter().partition(|c| deleted.contains(c.name.as_str()));
        let mut batch: Vec<&ChainBlock> = vec![];
        let mut lines = 0;
        for c in live {
            let size = c.rules.len() + 1;
            if !batch.is_empty() && lines + size > max {
                out.push(write_batch(&t.name, &batch, &[], &[]));
                batch.clear();
                lines = 0;
            }
            batch.push(c);
            lines += size;
        }
        if !stale.is_empty() && !batch.is_empty() && lines + stale.len() > max {
            out.push(write_batch(&t.name, &batch, &[], &[]));
            batch.clear();
        }
        batch.extend(stale);
        if !batch.is_empty() || !t.deletes.is_empty() || !t.inserts.is_empty() {
            out.push(write_batch(&t.name, &batch, &t.deletes, &t.inserts));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.9 -j REJECT\nCOMMIT\n\
        *nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-1 - [0:0]\n:KUBE-SEP-2 - [0:0]\n:KUBE-SEP-OLD - [0:0]\n\
        -A KUBE-SERVICES -d 10.96.0.1 -j KUBE-SVC-A\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n\
        -A KUBE-SVC-A -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-1\n-A KUBE-SVC-A -j KUBE-SEP-2\n\
        -A KUBE-SEP-1 -s 10.244.1.2 -j KUBE-MARK-MASQ\n-A KUBE-SEP-1 -j DNAT --to-destination 10.244.1.2:80\n\
        -A KUBE-SEP-2 -j DNAT --to-destination 10.244.2.2:80\n-X KUBE-SEP-OLD\nCOMMIT\n";

    #[test]
    fn one_batch_reproduces_the_input_grouped_by_chain() {
        let tables = parse(TEXT);
        assert_eq!(tables.len(), 2);
        assert_eq!(tables[1].chains.iter().map(|c| c.rules.len()).collect::<Vec<_>>(), vec![1, 1, 2, 2, 1, 0]);
        let out = batches(&tables, None);
        assert_eq!(out.len(), 1);
        assert_eq!(parse(&out[0]), tables, "re-parsing the batch gives the same chains");
    }

    #[test]
    fn batches_put_callees_first_cut_between_chains_and_delete_last() {
        let out = batches(&parse(TEXT), Some(3));
        let order: Vec<String> = out
            .iter()
            .flat_map(|b| b.lines().filter_map(|l| l.strip_prefix(':')).map(|l| l[..l.find(' ').unwrap()].to_string()))
            .collect();
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
        let last = out.last().unwrap();
        assert!(
            last.contains(":KUBE-SEP-OLD - [0:0]\n") && last.contains("-X KUBE-SEP-OLD\n"),
            "emptied where deleted"
        );
        assert!(out.iter().all(|b| b.ends_with("COMMIT\n")));
        // Every chain's declaration and rules are in the same batch.
        for b in &out {
            for t in parse(b) {
                for c in t.chains {
                    assert_eq!(c.rules.len(), b.lines().filter(|l| l.starts_with(&format!("-A {} ", c.name))).count());
                }
            }
        }
        let rejoined: Vec<TableInput> = out.iter().flat_map(|b| parse(b)).collect();
        let count =
            |ts: &[TableInput]| ts.iter().map(|t| t.chains.iter().map(|c| c.rules.len()).sum::<usize>()).sum::<usize>();
        assert_eq!(count(&rejoined), count(&parse(TEXT)), "no rule lost");
    }

    #[test]
    fn minimize_leaves_out_what_the_kernel_holds() {
        let tables = parse(TEXT);
        let mut applied = Applied::default();
        applied.record(&tables);
        let changed = TEXT.replace("10.244.2.2:80", "10.244.2.3:80").replace(":KUBE-SEP-OLD - [0:0]\n", "");
        let min = minimize(&parse(&changed), &applied);
        assert_eq!(min.len(), 1, "filter unchanged");
        assert_eq!(min[0].chains.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["KUBE-SEP-2"]);
        assert_eq!(min[0].deletes, ["KUBE-SEP-OLD"], "deletions are always written");
        applied.clear();
        assert_eq!(minimize(&tables, &applied), tables);
    }
}
