//! The book's executable transcripts, read purely (the runner is `tests/book.rs`).
//!
//! A fenced block whose info string is `console` is a transcript: a line starting with `$ ` is
//! a command (a line ending in `\` continues it on the next; a here-document, `<<EOF` or
//! `<<'EOF'`, runs to its end line), every other line is the output shown for the command
//! before it. A page's transcripts run in order in one shell, so a
//! variable set in one block is there in the next. An HTML comment on the line before the
//! fence says more:
//!
//! - `<!-- output: stable -->`: the shown output is compared — each shown line must appear in
//!   what the command printed, in order, where `…` stands for any text within a line and a run
//!   of spaces for any run (kubectl's columns widen with their contents);
//! - `<!-- not run: REASON -->`: the block is shown only (a VM, an editor, a second terminal).
//!
//! Any other fence (`sh`, none, `yaml`…) is never run.

/// One command of a transcript and the output shown after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The command as typed, continuation lines joined with newlines (bash reads them back).
    pub command: String,
    /// The output lines shown; compared only when `stable`.
    pub shown: Vec<String>,
    pub stable: bool,
    /// The line of the page the command starts on (1-based), for messages.
    pub line: usize,
}

/// The steps of every transcript of a page that runs, in order.
pub fn steps(page: &str) -> Result<Vec<Step>, String> {
    let mut out: Vec<Step> = vec![];
    let mut lines = page.lines().enumerate().peekable();
    let mut marker: Option<String> = None;
    while let Some((i, line)) = lines.next() {
        let t = line.trim();
        if let Some(fence) = t.strip_prefix("```") {
            let info = fence.trim();
            let run = info == "console" && !marker.as_deref().is_some_and(|m| m.starts_with("not run:"));
            let stable = marker.as_deref() == Some("output: stable");
            if info == "console" && marker.as_deref().is_some_and(|m| m.starts_with("not run:") && m.len() <= 9) {
                return Err(format!("line {}: `not run:` needs a reason", i + 1));
            }
            marker = None;
            // The block's lines up to its closing fence.
            let mut body = vec![];
            let mut closed = false;
            for (j, l) in lines.by_ref() {
                if l.trim_start().starts_with("```") {
                    closed = true;
                    break;
                }
                body.push((j + 1, l));
            }
            if !closed {
                return Err(format!("line {}: the block is never closed", i + 1));
            }
            if !run {
                continue;
            }
            let (mut k, mut has_command) = (0, false);
            while k < body.len() {
                let (n, l) = body[k];
                let Some(first) = l.strip_prefix("$ ") else {
                    match out.last_mut() {
                        Some(step) if has_command => step.shown.push(l.to_string()),
                        _ => return Err(format!("line {n}: output before any command")),
                    }
                    k += 1;
                    continue;
                };
                has_command = true;
                let mut command = first.to_string();
                while command.ends_with('\\') && k + 1 < body.len() {
                    k += 1;
                    command.push('\n');
                    command.push_str(body[k].1);
                }
                if let Some(end) = heredoc_end(&command) {
                    loop {
                        k += 1;
                        let Some((_, l)) = body.get(k) else {
                            return Err(format!("line {n}: the here-document never reaches {end}"));
                        };
                        command.push('\n');
                        command.push_str(l);
                        if *l == end {
                            break;
                        }
                    }
                }
                out.push(Step { command, shown: vec![], stable, line: n });
                k += 1;
            }
            continue;
        }
        marker = t.strip_prefix("<!--").and_then(|m| m.strip_suffix("-->")).map(|m| m.trim().to_string());
    }
    Ok(out)
}

/// The end word of a here-document the command opens (`<<EOF`, `<<'EOF'`, `<<"EOF"`).
fn heredoc_end(command: &str) -> Option<String> {
    let at = command.find("<<")?;
    let rest = command[at + 2..].trim_start_matches('-').trim_start();
    let word: String =
        rest.trim_start_matches(['\'', '"']).chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
    (!word.is_empty()).then_some(word)
}

/// Whether `actual` shows every line of `shown` in order (`…` matches any text in a line).
/// `Err` names the first shown line not found.
pub fn matches(shown: &[String], actual: &str) -> Result<(), String> {
    let mut rest = actual.lines();
    'shown: for want in shown.iter().filter(|l| !l.trim().is_empty()) {
        for got in rest.by_ref() {
            if line_matches(&squeeze(want), &squeeze(got)) {
                continue 'shown;
            }
        }
        return Err(want.clone());
    }
    Ok(())
}

/// Runs of whitespace as one space, none at the ends.
fn squeeze(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn line_matches(want: &str, got: &str) -> bool {
    let parts: Vec<&str> = want.split('…').collect();
    if parts.len() == 1 {
        return want == got;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !got.starts_with(first) || got.len() < first.len() + last.len() || !got.ends_with(last) {
        return false;
    }
    let mut at = first.len();
    let end = got.len() - last.len();
    for p in &parts[1..parts.len() - 1] {
        match got[at..end].find(p) {
            Some(i) => at += i + p.len(),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transcripts_are_read_with_their_markers() {
        let page = "# A page\n\n```sh\nnot run\n```\n\n```console\n$ echo one\none\n$ a=1 \\\n  b=2\n```\n\n\
                    <!-- output: stable -->\n```console\n$ echo two\ntwo\n```\n\n<!-- not run: a VM -->\n```console\n\
                    $ vagrant up\n```\n";
        let s = steps(page).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(
            (s[0].command.as_str(), s[0].shown.clone(), s[0].stable, s[0].line),
            ("echo one", vec!["one".to_string()], false, 8)
        );
        assert_eq!(s[1].command, "a=1 \\\n  b=2");
        assert!(s[2].stable && s[2].shown == ["two"]);
        assert!(steps("```console\n$ x\n").is_err(), "an unclosed block");
        assert!(steps("```console\nout\n```\n").is_err(), "output before a command");
        assert!(steps("<!-- not run: -->\n```console\n$ x\n```\n").is_err(), "a reason is needed");
        let doc = steps("```console\n$ kubectl apply -f - <<'EOF'\nkind: X\nEOF\nshown\n```\n").unwrap();
        assert_eq!(
            (doc[0].command.as_str(), doc[0].shown.clone()),
            ("kubectl apply -f - <<'EOF'\nkind: X\nEOF", vec!["shown".to_string()])
        );
        assert!(steps("```console\n$ cat <<EOF\nno end\n```\n").is_err(), "an unended here-document");
    }

    #[test]
    fn shown_output_is_a_subsequence_with_ellipses() {
        let actual = "NAME   STATUS\nnode-1 Ready  1s\nnode-2 Ready  2s\nend\n";
        let shown = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(matches(&shown(&["node-1 Ready…", "node-2 …s"]), actual).is_ok());
        assert!(matches(&shown(&["node-2 Ready…", "node-1 Ready…"]), actual).is_err(), "order counts");
        assert_eq!(matches(&shown(&["node-3 Ready…"]), actual), Err("node-3 Ready…".into()));
        assert!(matches(&shown(&["…Ready…2s"]), actual).is_ok());
        assert!(matches(&shown(&["end"]), actual).is_ok());
        assert!(matches(&shown(&["en"]), actual).is_err(), "whole lines");
        assert!(matches(&shown(&["NAME STATUS", "node-1   Ready …"]), actual).is_ok(), "any run of spaces");
    }
}
