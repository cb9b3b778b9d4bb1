//! kube-proxy's structural checks of a restore input (its tests' `checkIPTablesRuleJumps`).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Command, Ruleset};

/// Problems of a restore input as kube-proxy's own tests define them: a rule that jumps to a
/// chain the input does not declare, or to a declared chain with no rules, and a declared chain
/// nothing jumps to. `entry` names the chains reached from built-in chains (their jumps are not
/// in the input) and chains allowed to be empty (kube-proxy always writes them).
pub fn lint(rs: &Ruleset, entry: &[&str]) -> Vec<String> {
    let mut problems = vec![];
    // (table, chain) → rules appended to it.
    let mut declared: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut jumps: Vec<(String, String, String)> = vec![];
    let mut deleted: BTreeSet<(String, String)> = BTreeSet::new();
    for t in &rs.tables {
        for c in &t.chains {
            declared.insert((t.name.clone(), c.name.clone()), 0);
        }
        for c in &t.commands {
            match c {
                Command::Append(r) => {
                    *declared.entry((t.name.clone(), r.chain.clone())).or_default() += 1;
                    if let Some(to) = r.jump_target() {
                        jumps.push((t.name.clone(), r.chain.clone(), to.to_string()));
                    }
                }
                Command::DeleteChain(chain) => {
                    deleted.insert((t.name.clone(), chain.clone()));
                }
                _ => {}
            }
        }
    }
    for (t, from, to) in &jumps {
        match declared.get(&(t.clone(), to.clone())) {
            None => problems.push(format!("{t}: {from} jumps to {to}, which is not declared")),
            Some(0) if !entry.contains(&to.as_str()) => {
                problems.push(format!("{t}: {from} jumps to {to}, which is empty"))
            }
            _ => {}
        }
    }
    for (t, c) in declared.keys() {
        let used = jumps.iter().any(|(jt, _, to)| jt == t && to == c);
        if !used && !entry.contains(&c.as_str()) && !deleted.contains(&(t.clone(), c.clone())) {
            problems.push(format!("{t}: chain {c} is declared but nothing jumps to it"));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::lint;
    use crate::text::parse;

    #[test]
    fn lint_finds_missing_empty_and_unused_chains() {
        let text =
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n:KUBE-SEP-EMPTY - [0:0]\n:KUBE-SEP-LOST - [0:0]\n\
                    :KUBE-SEP-OLD - [0:0]\n-A KUBE-SERVICES -j KUBE-SVC-A\n-A KUBE-SVC-A -j KUBE-SEP-EMPTY\n\
                    -A KUBE-SVC-A -j KUBE-SEP-MISSING\n-A KUBE-SEP-LOST -j DNAT --to-destination 10.0.0.1:80\n\
                    -X KUBE-SEP-OLD\nCOMMIT\n";
        let problems = lint(&parse(text).unwrap(), &["KUBE-SERVICES"]);
        assert_eq!(
            problems,
            [
                "nat: KUBE-SVC-A jumps to KUBE-SEP-EMPTY, which is empty",
                "nat: KUBE-SVC-A jumps to KUBE-SEP-MISSING, which is not declared",
                "nat: chain KUBE-SEP-LOST is declared but nothing jumps to it",
            ]
        );
    }
}
