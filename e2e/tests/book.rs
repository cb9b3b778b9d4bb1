//! The book (`book/`): it builds with mdBook without a warning, its reference pages are the
//! binaries' own `--help` (regenerated and compared), and every guide's transcripts run as
//! written against a real lab, their stable output compared (`podpath_e2e::book` says how a
//! page marks them). A renamed flag, a changed message or a broken step fails here.
//!
//! `PODPATH_BLESS=1` rewrites the reference pages from the binaries instead of comparing.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podpath_e2e::{bin, book};

fn book_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../book")
}

/// Every page of the book, by path under `src/`.
fn pages() -> BTreeMap<String, String> {
    fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                out.insert(rel, included(&std::fs::read_to_string(&p).unwrap(), p.parent().unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    let src = book_dir().join("src");
    walk(&src, &src, &mut out);
    out
}

/// A page with its `{{#include FILE}}` lines replaced by the files, as mdBook does.
fn included(page: &str, dir: &Path) -> String {
    page.lines()
        .map(|l| match l.trim().strip_prefix("{{#include ").and_then(|r| r.strip_suffix("}}")) {
            Some(file) => std::fs::read_to_string(dir.join(file.trim()))
                .unwrap_or_else(|e| panic!("{}: {e}", dir.join(file).display())),
            None => format!("{l}\n"),
        })
        .collect()
}

#[test]
fn the_book_builds_without_warnings() {
    let out_dir = tempfile::tempdir().unwrap();
    let run = Command::new("mdbook").arg("build").arg(book_dir()).arg("-d").arg(out_dir.path()).output();
    let out = match run {
        Ok(o) => o,
        Err(e) => panic!("cannot run mdbook ({e}): scripts/test installs it (cargo install mdbook)"),
    };
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "mdbook build failed:\n{text}");
    assert!(!text.contains("WARN") && !text.contains("ERROR"), "mdbook warned:\n{text}");
    for page in ["index.html", "guides/trace-your-service.html", "reference/cli.html", "performance/index.html"] {
        assert!(out_dir.path().join(page).exists(), "{page} was not built");
    }
}

/// Every relative link of the book (and of the README into it) names a file that exists.
#[test]
fn the_book_links_to_files_that_exist() {
    let mut broken = vec![];
    let src = book_dir().join("src");
    let readme = book_dir().join("../README.md");
    let mut docs: Vec<(PathBuf, String)> =
        pages().into_iter().map(|(rel, text)| (src.join(rel).parent().unwrap().to_path_buf(), text)).collect();
    docs.push((book_dir().join(".."), std::fs::read_to_string(&readme).unwrap()));
    for (dir, text) in docs {
        for target in text.split("](").skip(1).filter_map(|rest| rest.split(')').next()) {
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            if !dir.join(target).exists() {
                broken.push(format!("{}: {target}", dir.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}

/// `BIN [PATH…] --help`, with the variables that clap would show as values removed.
fn help(binary: &str, path: &[String]) -> String {
    let out = Command::new(bin(binary))
        .args(path)
        .arg("--help")
        .env_remove("PODPATH_LAB")
        .env_remove("PODPATH_STATE_DIR")
        .env_remove("PODPATH_LOG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{binary} {path:?} --help failed");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists (clap's `Commands:` section, `help` aside).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// A binary's help, and its subcommands' helps, as markdown sections.
fn help_tree(binary: &str, path: Vec<String>, out: &mut String) {
    let text = help(binary, &path);
    let name = std::iter::once(binary.to_string()).chain(path.iter().cloned()).collect::<Vec<_>>().join(" ");
    let level = "#".repeat((path.len() + 2).min(4));
    out.push_str(&format!("{level} `{name}`\n\n```text\n{}\n```\n\n", text.trim_end()));
    for sub in subcommands(&text) {
        let mut p = path.clone();
        p.push(sub);
        help_tree(binary, p, out);
    }
}

fn generated_reference() -> Vec<(PathBuf, String)> {
    let head = "<!-- Generated from the binaries' --help by e2e/tests/book.rs; \
                PODPATH_BLESS=1 cargo test -p podpath-e2e --test book rewrites it. -->\n\n";
    let mut cli = format!(
        "{head}# The `podpath` command\n\nEvery command and flag of the lab's CLI, as `podpath … --help` \
         prints them. `--name` and `--state-dir` also come from `PODPATH_LAB` and `PODPATH_STATE_DIR`.\n\n"
    );
    help_tree("podpath", vec![], &mut cli);
    let mut components = format!(
        "{head}# The components' flags\n\nWhat `podpath up` starts, and what runs on the VMs, as each \
         program's `--help` prints it. The CNI plugins (`podpath-bridge`, `podpath-ipam`) take no flags: \
         they read the CNI environment and configuration, as the spec says ([CNI plugins](cni.md)).\n\n"
    );
    for b in ["apiserver-lite", "node-agent", "lb-sim", "podpath-dns", "podpath-workload"] {
        help_tree(b, vec![], &mut components);
    }
    let dir = book_dir().join("src/reference");
    vec![(dir.join("cli.md"), cli), (dir.join("flags.md"), components)]
}

#[test]
fn the_reference_pages_are_the_binaries_help() {
    let bless = std::env::var_os("PODPATH_BLESS").is_some();
    let mut stale = vec![];
    for (path, want) in generated_reference() {
        if bless {
            std::fs::write(&path, &want).unwrap();
            continue;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "{stale:?} differ from the binaries' --help: PODPATH_BLESS=1 cargo test -p podpath-e2e --test book"
    );
}

/// Takes the lab a page made down, however the page ended.
struct LabGuard {
    name: String,
    state: PathBuf,
}

impl Drop for LabGuard {
    fn drop(&mut self) {
        if self.state.exists() {
            let _ = Command::new(bin("podpath"))
                .args(["down", "--name", &self.name, "--state-dir"])
                .arg(&self.state)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The shell script for a page's steps: each step's output between markers, its exit code
/// after it; the first failing step ends the script.
fn script(steps: &[book::Step]) -> String {
    let mut s = String::from("set -o pipefail\nexec 2>&1\n");
    for (i, st) in steps.iter().enumerate() {
        s.push_str(&format!("printf '\\n@@STEP {i}\\n'\n{}\nrc=$?\nprintf '\\n@@RC {i} %d\\n' \"$rc\"\n", st.command));
        s.push_str("[ \"$rc\" -eq 0 ] || exit 90\n");
    }
    s
}

/// Each step's (exit code, output) from the script's output.
fn outputs(text: &str, n: usize) -> Vec<Option<(i32, String)>> {
    (0..n)
        .map(|i| {
            let start = text.find(&format!("\n@@STEP {i}\n"))? + format!("\n@@STEP {i}\n").len();
            let rc_marker = format!("\n@@RC {i} ");
            let end = text[start..].find(&rc_marker).map(|e| start + e);
            let out = text[start..end.unwrap_or(text.len())].to_string();
            let rc = end
                .and_then(|e| text[e + rc_marker.len()..].lines().next())
                .and_then(|c| c.trim().parse().ok())
                .unwrap_or(-1);
            Some((rc, out))
        })
        .collect()
}

static PAGE_COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Runs one page's steps in a shell of their own with a lab name and state directory unique
/// to this run; returns what failed.
fn run_page(page: &str, steps: &[book::Step], mirror: &str) -> Vec<String> {
    let n = PAGE_COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let name = format!("bk{}{n}", std::process::id() % 100_000);
    let dir = tempfile::Builder::new().prefix("podpath-book-").tempdir().unwrap();
    let state = dir.path().join("state");
    let _guard = LabGuard { name: name.clone(), state: state.clone() };
    let bin_dir = bin("podpath").parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let script_path = dir.path().join("page.sh");
    std::fs::write(&script_path, script(steps)).unwrap();
    let out_path = dir.path().join("out.txt");
    let mut child = Command::new("bash")
        .arg("--noprofile")
        .arg("--norc")
        .arg(&script_path)
        .current_dir(dir.path())
        .env("PATH", path)
        .env("PODPATH_LAB", &name)
        .env("PODPATH_STATE_DIR", &state)
        // A classroom's mirror: the pages' images come from a registry on loopback.
        .env("PODPATH_REGISTRY_MIRROR", mirror)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut timed_out = false;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // The page's own process group, by the PID this test started.
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGKILL);
            let _ = child.wait();
            timed_out = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let mut failures = vec![];
    for (st, got) in steps.iter().zip(outputs(&text, steps.len())) {
        let cmd = st.command.lines().next().unwrap_or_default();
        match got {
            None => {
                failures.push(format!(
                    "{page}:{}: `{cmd}` never ran{}",
                    st.line,
                    if timed_out { " (page timed out)" } else { "" }
                ));
                break;
            }
            Some((rc, out)) if rc != 0 => {
                failures.push(format!("{page}:{}: `{cmd}` exited {rc}:\n{out}", st.line));
                break;
            }
            Some((_, out)) if st.stable => {
                if let Err(line) = book::matches(&st.shown, &out) {
                    failures.push(format!("{page}:{}: `{cmd}` did not print {line:?}; it printed:\n{out}", st.line));
                }
            }
            Some(_) => {}
        }
    }
    if timed_out && failures.is_empty() {
        failures.push(format!("{page}: timed out after 600 s"));
    }
    failures
}

#[test]
fn the_guides_run_as_written() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    let before = testkit::netns::host_state();
    // What a class would have: a mirror of docker.io (here a registry on loopback holding the
    // offline busybox), given to every `podpath up` through PODPATH_REGISTRY_MIRROR.
    let registry = testkit::registry::Registry::start(None);
    registry.push("library/busybox:latest", &testkit::registry::busybox(), None);
    let mirror = format!("docker.io=http://{}", registry.addr);
    let mut ran = 0;
    let mut failures = vec![];
    // PODPATH_BOOK_PAGE=dns runs only the pages whose path holds it (while writing one).
    let only = std::env::var("PODPATH_BOOK_PAGE").ok();
    for (page, text) in pages() {
        let steps = book::steps(&text).unwrap_or_else(|e| panic!("{page}: {e}"));
        if steps.is_empty() || only.as_deref().is_some_and(|o| !page.contains(o)) {
            continue;
        }
        let started = Instant::now();
        let f = run_page(&page, &steps, &mirror);
        eprintln!("{page}: {} steps in {:.1} s, {} failed", steps.len(), started.elapsed().as_secs_f64(), f.len());
        failures.extend(f);
        ran += 1;
    }
    assert!(ran >= 3 || only.is_some(), "only {ran} pages have transcripts to run");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(testkit::netns::host_state(), before, "the host namespace changed");
}

/// One row of `book/perf/figures.tsv`.
struct Figure {
    date: String,
    machine: String,
    bench: String,
    figure: String,
    value: f64,
    unit: String,
    target: String,
}

fn figures() -> Vec<Figure> {
    let text = std::fs::read_to_string(book_dir().join("perf/figures.tsv")).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("date\tmachine\tbench\tfigure\tvalue\tunit\ttarget"), "figures.tsv header");
    lines
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let f: Vec<&str> = l.split('\t').collect();
            assert!(f.len() == 7, "figures.tsv line {}: 7 tab-separated fields, got {}", i + 2, f.len());
            let value =
                f[4].parse().unwrap_or_else(|_| panic!("figures.tsv line {}: {:?} is not a number", i + 2, f[4]));
            Figure {
                date: f[0].into(),
                machine: f[1].into(),
                bench: f[2].into(),
                figure: f[3].into(),
                value,
                unit: f[5].into(),
                target: f[6].into(),
            }
        })
        .collect()
}

/// A small line plot of a figure's runs in file order (dates under the first and last).
fn plot(runs: &[&Figure]) -> String {
    let (w, h, pad) = (240.0, 60.0, 6.0);
    let max = runs.iter().map(|f| f.value).fold(f64::MIN, f64::max);
    let min = runs.iter().map(|f| f.value).fold(f64::MAX, f64::min).min(0.0);
    let span = if max > min { max - min } else { 1.0 };
    let n = runs.len().max(2) - 1;
    let points: Vec<String> = runs
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let x = pad + (w - 2.0 * pad) * i as f64 / n as f64;
            let y = pad + (h - 2.0 * pad) * (1.0 - (f.value - min) / span);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    let dots: String = points
        .iter()
        .map(|p| {
            let (x, y) = p.split_once(',').unwrap();
            format!("<circle cx=\"{x}\" cy=\"{y}\" r=\"2.5\"/>")
        })
        .collect();
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{}\" role=\"img\" \
         aria-label=\"{} runs, {} to {}\"><polyline fill=\"none\" stroke=\"currentColor\" points=\"{}\"/>\
         <g fill=\"currentColor\">{dots}</g><text x=\"{pad}\" y=\"{}\" font-size=\"10\" fill=\"currentColor\">{}</text>\
         <text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\" fill=\"currentColor\">{}</text></svg>",
        h + 14.0,
        runs.len(),
        runs[0].date,
        runs[runs.len() - 1].date,
        points.join(" "),
        h + 11.0,
        runs[0].date,
        w - pad,
        h + 11.0,
        runs[runs.len() - 1].date,
    )
}

/// A figure as a reader wants it: thousands grouped, and at most 2 decimals (3 below 1), since
/// some benches record a raw measurement (17.366392 ms) and no run is that exact.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() >= 1000.0 {
        return testkit::figures::thousands(v as u64);
    }
    let text = if v.abs() >= 1.0 { format!("{v:.2}") } else { format!("{v:.3}") };
    let text = if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.') } else { &text };
    text.to_string()
}

#[test]
fn figures_are_rounded_for_the_reader() {
    assert_eq!(number(17.366392), "17.37");
    assert_eq!(number(58.78515625), "58.79");
    assert_eq!(number(3504.0), "3,504");
    assert_eq!(number(0.17), "0.17");
    assert_eq!(number(0.1234), "0.123");
    assert_eq!(number(62.0), "62");
    assert_eq!(number(26.5), "26.5");
}

/// `performance/index.md`: per bench, each figure's latest run (value, target, date, machine)
/// and a plot of every run when there are several.
fn performance_page() -> String {
    let all = figures();
    let mut out = String::from(
        "<!-- Generated from book/perf/figures.tsv by e2e/tests/book.rs; \
         PODPATH_BLESS=1 cargo test -p podpath-e2e --test book rewrites it. -->\n\n\
         # Current figures\n\nEvery figure the benchmarks measured, the latest run first, on the machine \
         named (all of them 2 cores; figures from a loaded machine are slower). The data, one run a line, \
         is `book/perf/figures.tsv`; a plot shows every recorded run of a figure in order. How each bench \
         runs and what it measures: [the walkthroughs and benchmarks](../guides/scenarios.md) and the \
         notes from [earlier runs](history.md).\n",
    );
    let mut benches: Vec<&str> = vec![];
    for f in &all {
        if !benches.contains(&f.bench.as_str()) {
            benches.push(&f.bench);
        }
    }
    for bench in benches {
        out.push_str(&format!(
            "\n## `{bench}`\n\n| figure | latest | target | date | machine | runs |\n|---|---|---|---|---|---|\n"
        ));
        let mut names: Vec<&str> = vec![];
        for f in all.iter().filter(|f| f.bench == bench) {
            if !names.contains(&f.figure.as_str()) {
                names.push(&f.figure);
            }
        }
        let mut plots = String::new();
        for name in names {
            let runs: Vec<&Figure> = all.iter().filter(|f| f.bench == bench && f.figure == name).collect();
            let last = runs[runs.len() - 1];
            let target =
                if last.target.is_empty() { "—".to_string() } else { format!("{} {}", last.target, last.unit) };
            out.push_str(&format!(
                "| {name} | {} {} | {target} | {} | {} | {} |\n",
                number(last.value),
                last.unit,
                last.date,
                last.machine,
                runs.len()
            ));
            if runs.len() > 1 {
                let values: Vec<String> = runs.iter().map(|f| number(f.value)).collect();
                plots.push_str(&format!(
                    "\n<figure>\n{}\n<figcaption>{name} ({}): {}</figcaption>\n</figure>\n",
                    plot(&runs),
                    last.unit,
                    values.join(", ")
                ));
            }
        }
        out.push_str(&plots);
    }
    out
}

#[test]
fn the_performance_page_is_the_figures_file() {
    let path = book_dir().join("src/performance/index.md");
    let want = performance_page();
    if std::env::var_os("PODPATH_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is not made from book/perf/figures.tsv: PODPATH_BLESS=1 cargo test -p podpath-e2e --test book",
        path.display()
    );
}
