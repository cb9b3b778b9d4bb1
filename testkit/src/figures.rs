//! Benchmark figures as data: a bench calls [`Bench::record`] for each figure it measures, and when
//! `PODPATH_FIGURES` names a file (the book's `book/perf/figures.tsv`), the figure is appended
//! to it as one tab-separated row — date, machine, bench, figure, value, unit, target — from
//! which the book's performance page is generated (`e2e/tests/book.rs`). Without the variable
//! nothing is written: a bench run stays a bench run.

use std::io::Write;

/// A bench, by the command that runs it (`cargo bench -p podpath-kube-proxy --bench proxy`):
/// `const BENCH: Bench = Bench("…");`, then `BENCH.record(…)` for each figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bench(pub &'static str);

impl Bench {
    /// Appends the figure (what it is with its conditions, its value and unit, and the target
    /// if the project set one, `≤ 1500`) to the file `PODPATH_FIGURES` names, if any; says so
    /// on stderr when it cannot, and never fails the bench.
    pub fn record(&self, figure: &str, value: f64, unit: &str, target: &str) {
        let Some(path) = std::env::var_os("PODPATH_FIGURES") else { return };
        let line = row(&today(), &machine(), self.0, figure, value, unit, target);
        let written = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .and_then(|mut file| file.write_all(line.as_bytes()));
        if let Err(e) = written {
            eprintln!("cannot append to {}: {e}", std::path::Path::new(&path).display());
        }
    }
}

/// The machine, as the performance page names it: cores, architecture and kernel.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let kernel = kernel.trim().split('-').next().unwrap_or_default().to_string();
    format!("{cores}-core {}, Linux {kernel}", std::env::consts::ARCH)
}

/// The row [`Bench::record`] writes (no tabs or line breaks inside a field).
pub fn row(date: &str, machine: &str, bench: &str, figure: &str, value: f64, unit: &str, target: &str) -> String {
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    format!(
        "{}\t{}\t{}\t{}\t{value}\t{}\t{}\n",
        clean(date),
        clean(machine),
        clean(bench),
        clean(figure),
        clean(unit),
        clean(target)
    )
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub fn today() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%d").to_string()
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
        assert_eq!(
            row("2026-11-26", "2-core x86_64, Linux 6.18", "b", "cold\tload\n10k", 725.0, "ms", "≤ 1500"),
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
