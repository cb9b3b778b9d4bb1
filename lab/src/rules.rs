//! `podpath rules [--watch]` (pure part): the service proxy's rules of a node as lines, and the
//! difference between two snapshots, with an endpoint's changed probability shown as one change
//! (`probability 0.5 → 0.3333`) rather than a removed and an added rule.

use std::collections::BTreeMap;

use podpath_ruleset::{Match, Rule};
use serde::Serialize;

/// The proxy's rules in `iptables-save` output of one table, prefixed with the table
/// (`nat -A KUBE-SVC-… …`): rules in KUBE-* chains and the jumps into them, as the kernel lists
/// them.
pub fn proxy_rules(table: &str, save: &str) -> Vec<String> {
    save.lines()
        .filter(|l| l.starts_with("-A "))
        .filter(|l| {
            podpath_ruleset::text::parse_rule_line(l)
                .is_ok_and(|r| r.chain.starts_with("KUBE-") || r.jump_target().is_some_and(|t| t.starts_with("KUBE-")))
        })
        .map(|l| format!("{table} {l}"))
        .collect()
}

/// One change between two snapshots of a node's rules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// `-` removed, `+` added, `~` the same rule with another probability.
    pub op: char,
    pub text: String,
}

/// A `table -A …` line as (table, the rule without its probability, the probability).
fn split_probability(line: &str) -> Option<(&str, Rule, Option<f64>)> {
    let (table, rule) = line.split_once(' ')?;
    let mut rule = podpath_ruleset::text::parse_rule_line(rule).ok()?;
    let p = rule.probability();
    rule.matches.retain(|m| !matches!(m, Match::Probability(_)));
    Some((table, rule, p))
}

fn short(p: Option<f64>) -> String {
    p.map(crate::trace::steps::trim_float).unwrap_or_else(|| "the rest".into())
}

/// The changes from `old` to `new` (each a node's rule lines), in the order of the new rules
/// (removed rules first). A rule whose only difference is its probability is one `~` change;
/// a rule that lost or gained its probability (the last endpoint) is one too.
pub fn diff(old: &[String], new: &[String]) -> Vec<Change> {
    let removed: Vec<&String> = old.iter().filter(|r| !new.contains(r)).collect();
    let added: Vec<&String> = new.iter().filter(|r| !old.contains(r)).collect();
    // Pairs: the same rule once its probability is set aside.
    let removed_keys: Vec<_> = removed.iter().map(|r| split_probability(r)).collect();
    let mut paired_old = vec![false; removed.len()];
    let mut changes: Vec<Change> = Vec::new();
    let mut adds: Vec<Change> = Vec::new();
    for a in &added {
        let key = split_probability(a);
        let pair = key.as_ref().and_then(|(table, rule, _)| {
            removed_keys
                .iter()
                .enumerate()
                .find(|(i, k)| !paired_old[*i] && k.as_ref().is_some_and(|(t, r, _)| t == table && r == rule))
        });
        match (pair, &key) {
            (Some((i, Some((_, _, from)))), Some((table, rule, to))) => {
                paired_old[i] = true;
                adds.push(Change {
                    op: '~',
                    text: format!("{table} {rule}: probability {} → {}", short(*from), short(*to)),
                });
            }
            _ => adds.push(Change { op: '+', text: a.to_string() }),
        }
    }
    for (i, r) in removed.iter().enumerate() {
        if !paired_old[i] {
            changes.push(Change { op: '-', text: r.to_string() });
        }
    }
    changes.extend(adds);
    changes
}

/// One report: what changed in the API and, per group of nodes with the same changes, the
/// rule changes.
pub fn report(when: &str, api_changes: &[String], per_node: &BTreeMap<String, Vec<Change>>) -> String {
    let mut out =
        format!("{when} {}\n", if api_changes.is_empty() { "rules changed".into() } else { api_changes.join("; ") });
    let mut groups: Vec<(Vec<&str>, &Vec<Change>)> = Vec::new();
    for (node, changes) in per_node {
        match groups.iter_mut().find(|(_, c)| *c == changes) {
            Some((nodes, _)) => nodes.push(node),
            None => groups.push((vec![node], changes)),
        }
    }
    for (nodes, changes) in groups {
        if changes.is_empty() {
            out += &format!("  {}: no rule changed\n", nodes.join(", "));
            continue;
        }
        out += &format!("  {}:\n", nodes.join(", "));
        for c in changes {
            out += &format!("    {} {}\n", c.op, c.text);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(s: &str) -> Vec<String> {
        proxy_rules("nat", s)
    }

    const TWO: &str = "-A KUBE-SERVICES -d 10.96.0.9/32 -p tcp -m comment --comment \"default/web cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAA\n\
        -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-B\n\
        -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.2.5:8080\" -j KUBE-SEP-C\n\
        -A POSTROUTING -o eth0 -j MASQUERADE\n";
    const THREE: &str = "-A KUBE-SERVICES -d 10.96.0.9/32 -p tcp -m comment --comment \"default/web cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAA\n\
        -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.1.5:8080\" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-B\n\
        -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.2.5:8080\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-C\n\
        -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.2.6:8080\" -j KUBE-SEP-D\n\
        -A KUBE-SEP-D -p tcp -m comment --comment \"default/web\" -m tcp -j DNAT --to-destination 10.244.2.6:8080\n";

    #[test]
    fn scaling_two_to_three_shows_the_probabilities_moving_and_the_new_endpoint() {
        let d = diff(&lines(TWO), &lines(THREE));
        let shown: Vec<String> = d.iter().map(|c| format!("{} {}", c.op, c.text)).collect();
        assert_eq!(
            shown,
            [
                "~ nat -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.1.5:8080\" -j KUBE-SEP-B: probability 0.5 → 0.3333",
                "~ nat -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.2.5:8080\" -j KUBE-SEP-C: probability the rest → 0.5",
                "+ nat -A KUBE-SVC-AAA -m comment --comment \"default/web -> 10.244.2.6:8080\" -j KUBE-SEP-D",
                "+ nat -A KUBE-SEP-D -p tcp -m comment --comment \"default/web\" -m tcp -j DNAT --to-destination 10.244.2.6:8080",
            ]
        );
        // And back: the removed endpoint's rules go, the probabilities return.
        let back = diff(&lines(THREE), &lines(TWO));
        assert_eq!(back.iter().filter(|c| c.op == '-').count(), 2);
        assert!(back.iter().any(|c| c.op == '~' && c.text.ends_with("probability 0.3333 → 0.5")));
        assert!(diff(&lines(TWO), &lines(TWO)).is_empty());
        assert!(!lines(TWO).iter().any(|l| l.contains("POSTROUTING -o eth0")), "only the proxy's rules");
    }

    #[test]
    fn nodes_with_the_same_changes_are_reported_together() {
        let d = diff(&lines(TWO), &lines(THREE));
        let per_node: BTreeMap<String, Vec<Change>> =
            [("node-1".into(), d.clone()), ("node-2".into(), d), ("node-3".into(), vec![])].into();
        let r = report("12:00:01", &["EndpointSlice default/web-x changed".into()], &per_node);
        assert!(r.starts_with("12:00:01 EndpointSlice default/web-x changed\n  node-1, node-2:\n    ~ "), "{r}");
        assert!(r.ends_with("  node-3: no rule changed\n"), "{r}");
    }
}
