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
    if let Some(l) = &t.lookup {
        for (i, (line, kind)) in super::dns::lines(l).into_iter().enumerate() {
            let lead = if i == 0 { style.bold(&format!("{:<13}", "0 DNS")) } else { pad.clone() };
            let line = match kind {
                "stop" => style.dim(&line),
                "answer" => style.green(&line),
                _ => line,
            };
            out += &format!("{lead}{line}\n");
        }
    }
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

/// Escapes text for XML.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Breaks a line into pieces of at most `width` characters, at spaces where it can.
fn wrap(line: &str, width: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in line.split(' ') {
        let mut word = word.to_string();
        while word.chars().count() > width {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            out.push(head);
        }
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            out.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(&word);
    }
    if !cur.is_empty() || out.is_empty() {
        out.push(cur);
    }
    out
}

/// A line inside a host's box: its text and its class (how it is drawn).
struct Line {
    text: String,
    class: &'static str,
}

const BOX_W: usize = 300;
const GAP: usize = 56;
const LINE_H: usize = 15;
const CHARS: usize = 42;

/// The trace as a picture: one box per host from left to right (client, gateway, nodes, pod),
/// the request's path drawn as arrows between them, and in each box what happened there, the
/// decisive rule highlighted with its iptables text. Self-contained SVG (opens in a browser).
pub fn svg(t: &Trace) -> String {
    let mut columns: Vec<(String, &'static str, Vec<Line>)> = Vec::new();
    if let Some(l) = &t.lookup {
        let mut lines = Vec::new();
        for (text, kind) in super::dns::lines(l) {
            let class = match kind {
                "stop" => "rule",
                "answer" => "decisive",
                _ => "step",
            };
            lines.extend(wrap(&text, CHARS).into_iter().map(|text| Line { text, class }));
        }
        columns.push(("DNS".to_string(), "client", lines));
    }
    for hop in &t.hops {
        let mut lines = Vec::new();
        for s in &hop.steps {
            let class = match s.kind.as_str() {
                "dnat" | "snat" | "lb" | "relay" | "deliver" => "decisive",
                "stop" => "stop",
                _ => "step",
            };
            for l in s.text.lines() {
                lines.extend(wrap(l, CHARS).into_iter().map(|text| Line { text, class }));
            }
            if let (Some(rule), true) = (&s.rule, matches!(s.kind.as_str(), "dnat" | "snat" | "stop")) {
                lines.extend(wrap(rule, CHARS).into_iter().map(|text| Line { text, class: "rule" }));
            }
            if let Some(o) = s.object.as_ref().filter(|_| class != "step") {
                lines.extend(wrap(&format!("⟵ {o}"), CHARS).into_iter().map(|text| Line { text, class: "object" }));
            }
        }
        let role = match hop.host.as_str() {
            "client" => "client",
            "gateway" => "gateway",
            _ => "node",
        };
        columns.push((hop.host.clone(), role, lines));
    }
    if let Some(pod) = &t.pod {
        let mut lines = vec![Line { text: pod.clone(), class: "decisive" }];
        if let Some(code) = t.outcome.status.filter(|_| t.outcome.answered) {
            lines.push(Line { text: format!("answered {code} in {:.1} ms", t.outcome.millis), class: "ok" });
        }
        if let Some(saw) = &t.pod_saw {
            lines.push(Line { text: format!("saw client {saw}"), class: "step" });
        }
        columns.push(("pod".into(), "pod", lines));
    }
    let n = columns.len().max(1);
    let body_lines = columns.iter().map(|c| c.2.len()).max().unwrap_or(0);
    let box_h = 44 + body_lines * LINE_H + 10;
    let (top, left) = (70, 20);
    let mut footer: Vec<(String, &'static str)> = Vec::new();
    if !t.outcome.answered {
        let err = t.outcome.error.clone().unwrap_or_default();
        footer.push((format!("no answer after {:.0} ms: {err}", t.outcome.millis), "stop"));
    }
    if let Some(s) = &t.stopped {
        footer.extend(wrap(&format!("stopped: {s}"), 150).into_iter().map(|l| (l, "stop")));
    }
    for c in &t.conntrack {
        footer.push((format!("conntrack on {c}"), "step"));
    }
    let width = left * 2 + n * BOX_W + (n - 1) * GAP;
    let height = top + box_h + 30 + footer.len() * (LINE_H + 2) + 10;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"ui-monospace, Menlo, Consolas, monospace\" font-size=\"11\">\n\
         <title>podpath trace: {}</title>\n\
         <style>\n\
         .step {{ fill: #333; }} .decisive {{ fill: #0b4f8a; font-weight: bold; }} .rule {{ fill: #777; font-size: 10px; }}\n\
         .object {{ fill: #7a4a00; font-style: italic; }} .stop {{ fill: #c00; font-weight: bold; }} .ok {{ fill: #17803d; font-weight: bold; }}\n\
         .head {{ font-size: 14px; font-weight: bold; fill: #fff; }} .title {{ font-size: 15px; font-weight: bold; fill: #222; }}\n\
         </style>\n\
         <defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"8\" markerHeight=\"8\" orient=\"auto\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#0b4f8a\"/></marker></defs>\n\
         <rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n\
         <text x=\"{left}\" y=\"30\" class=\"title\">{}</text>\n\
         <text x=\"{left}\" y=\"50\" class=\"step\">from {} — one real connection, observed by the kernel's netfilter trace</text>\n",
        xml(&format!("{} → {}", t.src, t.dst)),
        xml(&format!("{} {} → {}", t.from, t.src, t.dst)),
        xml(&t.from),
    );
    for (i, (host, role, lines)) in columns.iter().enumerate() {
        let x = left + i * (BOX_W + GAP);
        let colour = match *role {
            "client" => "#555",
            "gateway" => "#6a3d9a",
            "pod" => "#c25e00",
            _ => "#1f6f3f",
        };
        let stopped = lines.iter().any(|l| l.class == "stop");
        let border = if stopped { "#c00" } else { colour };
        out += &format!(
            "<g id=\"hop-{}\">\n<rect x=\"{x}\" y=\"{top}\" width=\"{BOX_W}\" height=\"{box_h}\" rx=\"8\" fill=\"#fafafa\" stroke=\"{border}\" stroke-width=\"{}\"/>\n\
             <rect x=\"{x}\" y=\"{top}\" width=\"{BOX_W}\" height=\"28\" rx=\"8\" fill=\"{colour}\"/>\n\
             <text x=\"{}\" y=\"{}\" class=\"head\">{}</text>\n",
            i + 1,
            if stopped { "3" } else { "1.5" },
            x + 10,
            top + 19,
            xml(&format!("{} {host}", i + 1)),
        );
        for (j, l) in lines.iter().enumerate() {
            out += &format!(
                "<text x=\"{}\" y=\"{}\" class=\"{}\">{}</text>\n",
                x + 10,
                top + 46 + j * LINE_H,
                l.class,
                xml(&l.text)
            );
        }
        out += "</g>\n";
        if i + 1 < columns.len() {
            let y = top + 14;
            out += &format!(
                "<line x1=\"{}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#0b4f8a\" stroke-width=\"2.5\" marker-end=\"url(#arrow)\"/>\n",
                x + BOX_W + 4,
                x + BOX_W + GAP - 4
            );
        }
    }
    for (k, (line, class)) in footer.iter().enumerate() {
        out += &format!(
            "<text x=\"{left}\" y=\"{}\" class=\"{class}\">{}</text>\n",
            top + box_h + 28 + k * (LINE_H + 2),
            xml(line)
        );
    }
    out += "</svg>\n";
    out
}
