//! A bound on YAML nesting, found before parsing. libyaml's parser takes time that grows with
//! the square of the nesting depth (a 200 KB body nested 100,000 deep took 43 s and stalled
//! the server), and serde_yaml only refuses depths past its recursion limit after the whole
//! document has been parsed. This scan is linear and errs on the side of counting too deep.
//!
//! What it counts: flow collections (`[`, `{`) outside quoted scalars and comments, block
//! collections (a stack of indentation levels), and compact nested block entries on one line
//! (`- - - x`, `- a: - b`). Quoted scalars (with `''` and `\"` escapes) and comments are skipped.

/// The nesting depth of the first line of `text` that reaches deeper than `limit`, if any.
pub fn depth_beyond(text: &[u8], limit: usize) -> Option<usize> {
    let mut indents: Vec<usize> = Vec::new();
    let mut flow = 0usize;
    for line in text.split(|b| *b == b'\n') {
        let indent = line.iter().take_while(|b| **b == b' ').count();
        let rest = &line[indent..];
        let blank = rest.iter().all(|b| b.is_ascii_whitespace()) || rest.first() == Some(&b'#');
        if flow == 0 && !blank {
            while indents.last().is_some_and(|top| *top >= indent) {
                indents.pop();
            }
            indents.push(indent);
        }
        let (compact, max_flow) = scan_line(rest, &mut flow);
        let depth = indents.len() + compact + max_flow;
        if depth > limit {
            return Some(depth);
        }
    }
    None
}

/// Walks one line's content: the compact block entries that open a nested collection on this
/// line, the deepest flow nesting reached, and the flow depth carried to the next line.
fn scan_line(line: &[u8], flow: &mut usize) -> (usize, usize) {
    let mut compact = 0;
    let mut max_flow = *flow;
    let mut i = 0;
    // Before any scalar content a `- `, `? ` or `: ` opens a nested block collection.
    let mut at_entry = *flow == 0;
    while i < line.len() {
        let b = line[i];
        let next = line.get(i + 1).copied();
        let space_after = next.is_none_or(|n| n == b' ' || n == b'\t' || n == b'\r');
        match b {
            b'\'' | b'"' => {
                i = skip_quoted(line, i);
                at_entry = false;
                continue;
            }
            b'#' if i == 0 || line[i - 1] == b' ' || line[i - 1] == b'\t' => break,
            b'[' | b'{' => {
                *flow += 1;
                max_flow = max_flow.max(*flow);
            }
            b']' | b'}' => *flow = flow.saturating_sub(1),
            b'-' | b'?' if *flow == 0 && at_entry && space_after => compact += 1,
            b':' if *flow == 0 && space_after => {
                compact += 1;
                at_entry = true;
            }
            b' ' | b'\t' | b'\r' => {}
            _ => at_entry = false,
        }
        i += 1;
    }
    (compact, max_flow)
}

/// The index after the quoted scalar that starts at `start` (or the end of the line: a
/// multi-line quoted scalar's continuation lines are scanned as plain text, which can only
/// count too deep).
fn skip_quoted(line: &[u8], start: usize) -> usize {
    let quote = line[start];
    let mut i = start + 1;
    while i < line.len() {
        match line[i] {
            b'\\' if quote == b'"' => i += 2,
            c if c == quote => {
                if quote == b'\'' && line.get(i + 1) == Some(&b'\'') {
                    i += 2;
                } else {
                    return i + 1;
                }
            }
            _ => i += 1,
        }
    }
    line.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        (0..).find(|l| depth_beyond(text.as_bytes(), *l).is_none()).unwrap()
    }

    #[test]
    fn manifests_are_shallow_and_bombs_are_deep() {
        let svc = "apiVersion: v1\nkind: Service\nmetadata:\n  name: web # a comment: [[[\n  annotations:\n    a: '[[[{{{'\n    b: \"x\\\"[[\"\nspec:\n  ports:\n  - name: http\n    port: 80\n  selector: {app: web}\n";
        assert!(depth(svc) <= 6, "{}", depth(svc));
        assert!(depth_beyond(svc.as_bytes(), 10).is_none());
        let flow = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
        assert_eq!(depth_beyond(flow.as_bytes(), 1000), Some(5001));
        let compact = "- ".repeat(5000) + "x";
        assert!(depth_beyond(compact.as_bytes(), 1000).is_some());
        let block: String = (0..2000).map(|i| format!("{}k{i}:\n", " ".repeat(i))).collect();
        assert!(depth_beyond(block.as_bytes(), 1000).is_some());
        // Deep flow across lines is still counted.
        let lines = "a:\n".to_string() + &"[\n".repeat(1500);
        assert!(depth_beyond(lines.as_bytes(), 1000).is_some());
    }
}
