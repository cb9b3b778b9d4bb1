//! A trace for people (text, optionally coloured) and for tools (JSON).

use super::model::Trace;

/// ANSI styles, or nothing.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.colour {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
    fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
    fn red(&self, s: &str) -> String {
        self.paint("31;1", s)
    }
    fn green(&self, s: &str) -> String {
        self.paint("32", s)
    }
}

/// The trace as text: one numbered block per host, the decisive rule under each step that
/// one decided, then the pod, the outcome and the conntrack entries.
pub fn text(t: &Trace, style: Style) -> String {
    let mut out = format!("{} {} → {}\n", t.from, t.src, t.dst);
    let pad = " ".repeat(13);
    let mut n = 0;
    for hop in &t.hops {
        n += 1;
        let head = format!("{n:<2}{:<11}", hop.host);
        if hop.steps.is_empty() {
            out += &format!("{}{}\n", style.bold(&head), style.dim("(passed through)"));
        }
        for (i, s) in hop.steps.iter().enumerate() {
            let lead = if i == 0 { style.bold(&head) } else { pad.clone() };
            for (j, line) in s.text.lines().enumerate() {
                let lead = if j == 0 { lead.clone() } else { pad.clone() };
                let line = if s.kind == "stop" { style.red(&format!("✗ {line}")) } else { line.to_string() };
                out += &format!("{lead}{line}\n");
            }
            if matches!(s.kind.as_str(), "dnat" | "snat" | "stop") {
                if let Some(r) = &s.rule {
                    out += &format!("{pad}  {}\n", style.dim(r));
                }
            }
        }
    }
    if t.pod.is_some() {
        n += 1;
        let saw = t.pod_saw.as_ref().map(|s| format!("; saw client {s}")).unwrap_or_default();
        let what = match (t.outcome.answered, t.outcome.status) {
            (true, Some(code)) => style.green(&format!("answered {code} in {:.1} ms", t.outcome.millis)),
            _ => "got the request".to_string(),
        };
        out += &format!("{}{what}{saw}\n", style.bold(&format!("{n:<2}{:<11}", "pod")));
    } else if t.outcome.answered {
        out += &format!(
            "{}\n",
            style.green(&format!("answered {} in {:.1} ms", t.outcome.status.unwrap_or(0), t.outcome.millis))
        );
    }
    if !t.outcome.answered {
        let err = t.outcome.error.clone().unwrap_or_default();
        out += &format!("{}\n", style.red(&format!("no answer after {:.0} ms: {err}", t.outcome.millis)));
    }
    if let Some(s) = &t.stopped {
        out += &format!("{}\n", style.red(&format!("stopped: {s}")));
    }
    for c in &t.conntrack {
        out += &format!("conntrack on {c}\n");
    }
    out
}

/// The trace as JSON.
pub fn json(t: &Trace) -> String {
    serde_json::to_string_pretty(t).expect("a trace serialises") + "\n"
}
