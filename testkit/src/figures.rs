//! Benchmark figures as data: a bench calls [`record`] for each figure it measures, and when
//! `PODPATH_FIGURES` names a file (the book's `book/perf/figures.tsv`), the figure is appended
//! to it as one tab-separated row — date, machine, bench, figure, value, unit, target — from
//! which the book's performance page is generated (`e2e/tests/book.rs`). Without the variable
//! nothing is written: a bench run stays a bench run.

use std::io::Write;

/// One figure of a bench run.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure<'a> {
    /// The command that measured it (`cargo bench -p podpath-kube-proxy --bench proxy`).
    pub bench: &'a str,
    /// What it is, with its conditions (`shared-maps cold load, 10,000 × 10`).
    pub figure: &'a str,
    pub value: f64,
    pub unit: &'a str,
    /// The target, if the project set one (`≤ 1500`).
    pub target: &'a str,
}

/// The machine, as the performance page names it: cores, architecture and kernel.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kernel = kernel.trim().split('-').next().unwrap_or_default().to_string();
    format!("{cores}-core {}, Linux {kernel}", std::env::consts::ARCH)
}

/// The row [`record`] writes (no tabs or line breaks inside a field).
pub fn row(date: &str, machine: &str, f: &Figure) -> String {
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        clean(date),
        clean(machine),
        clean(f.bench),
        clean(f.figure),
        f.value,
        clean(f.unit),
        clean(f.target)
    )
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%d").to_string()
}

/// Appends `f` to the file `PODPATH_FIGURES` names, if any; says so on stderr either way it
/// writes, and never fails the bench.
pub fn record(f: Figure) {
    let Some(path) = std::env::var_os("PODPATH_FIGURES") else { return };
    let line = row(&today(), &machine(), &f);
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(e) = written {
        eprintln!("cannot append to {}: {e}", std::path::Path::new(&path).display());
    }
}

/// `190449` → `190,449`: how the figures name sizes.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_seven_clean_fields() {
        let f = Figure { bench: "b", figure: "cold\tload\n10k", value: 725.0, unit: "ms", target: "≤ 1500" };
        assert_eq!(
            row("2026-11-26", "2-core x86_64, Linux 6.18", &f),
            "2026-11-26\t2-core x86_64, Linux 6.18\tb\tcold load 10k\t725\tms\t≤ 1500\n"
        );
        let d = today();
        assert!(d.len() == 10 && d.starts_with("20") && &d[4..5] == "-", "{d}");
        assert_eq!(
            (thousands(0), thousands(999), thousands(1000), thousands(190449)),
            ("0".into(), "999".into(), "1,000".into(), "190,449".into())
        );
    }
}
