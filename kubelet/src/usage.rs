//! The kubelet's resource metrics (`GET /metrics/resource`, what metrics-server scrapes): each
//! running container's cumulative CPU time and working set, summed per pod and per node, in
//! the Prometheus text format under the kubelet's metric names. podpath runs no cgroup per
//! container, so a container is its process tree in `/proc`: every descendant of its monitor
//! (the monitor itself left out), CPU as user + system time including reaped children, memory
//! as resident set. The node is the sum of its pods. Reading `/proc` is [`ProcTable::read`];
//! the rest is pure.

use std::collections::{BTreeMap, HashMap};

/// One process as `/proc/PID/stat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: i32,
    pub ppid: i32,
    /// utime + stime + cutime + cstime, in clock ticks.
    pub cpu_ticks: u64,
    /// Resident pages.
    pub rss_pages: u64,
}

/// Parses `/proc/PID/stat` (the command, field 2, may hold spaces and parentheses).
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let pid: i32 = text.split_whitespace().next()?.parse().ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): field N is f[N - 3].
    let n = |i: usize| f.get(i - 3).and_then(|v| v.parse::<u64>().ok());
    Some(ProcStat {
        pid,
        ppid: f.get(4 - 3)?.parse().ok()?,
        cpu_ticks: n(14)? + n(15)? + n(16)? + n(17)?,
        rss_pages: n(24)?,
    })
}

/// Every process of the machine, by parent.
#[derive(Debug, Default, Clone)]
pub struct ProcTable {
    pub procs: HashMap<i32, ProcStat>,
    children: HashMap<i32, Vec<i32>>,
}

impl ProcTable {
    pub fn new(procs: impl IntoIterator<Item = ProcStat>) -> ProcTable {
        let mut t = ProcTable::default();
        for p in procs {
            t.children.entry(p.ppid).or_default().push(p.pid);
            t.procs.insert(p.pid, p);
        }
        t
    }

    /// Reads `/proc`.
    pub fn read() -> ProcTable {
        let Ok(dir) = std::fs::read_dir("/proc") else { return ProcTable::default() };
        ProcTable::new(dir.flatten().filter_map(|e| {
            let name = e.file_name();
            let pid = name.to_str()?.parse::<i32>().ok()?;
            parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
        }))
    }

    /// The descendants of `root` (not `root` itself).
    pub fn descendants(&self, root: i32) -> Vec<i32> {
        let mut out = vec![];
        let mut todo = vec![root];
        while let Some(p) = todo.pop() {
            for c in self.children.get(&p).into_iter().flatten() {
                // A loop in a racy read of /proc must not spin forever.
                if !out.contains(c) && *c != root {
                    out.push(*c);
                    todo.push(*c);
                }
            }
        }
        out
    }

    /// (CPU seconds, working set bytes) of `root`'s descendants.
    pub fn usage(&self, root: i32, ticks_per_second: u64, page_size: u64) -> (f64, u64) {
        let (mut ticks, mut pages) = (0u64, 0u64);
        for p in self.descendants(root) {
            if let Some(s) = self.procs.get(&p) {
                ticks += s.cpu_ticks;
                pages += s.rss_pages;
            }
        }
        (ticks as f64 / ticks_per_second.max(1) as f64, pages * page_size)
    }
}

/// One container's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    /// Unix seconds the container started.
    pub started: i64,
}

/// The text `/metrics/resource` answers, at `now_ms` (milliseconds, each sample's timestamp); the
/// node is its pods plus `agent` (the node agent's own CPU seconds and bytes: kubelet and
/// kube-proxy, as a real node's usage includes them).
pub fn render(containers: &[ContainerUsage], agent: (f64, u64), now_ms: i64) -> String {
    let mut out = String::new();
    let mut pods: BTreeMap<(&str, &str), (f64, u64)> = BTreeMap::new();
    let (mut node_cpu, mut node_mem) = agent;
    for c in containers {
        let p = pods.entry((&c.namespace, &c.pod)).or_default();
        p.0 += c.cpu_seconds;
        p.1 += c.memory_bytes;
        node_cpu += c.cpu_seconds;
        node_mem += c.memory_bytes;
    }
    let labels =
        |c: &ContainerUsage| format!("container=\"{}\",namespace=\"{}\",pod=\"{}\"", c.container, c.namespace, c.pod);
    out += "# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds\n# TYPE container_cpu_usage_seconds_total counter\n";
    for c in containers {
        out += &format!("container_cpu_usage_seconds_total{{{}}} {} {now_ms}\n", labels(c), c.cpu_seconds);
    }
    out += "# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes\n# TYPE container_memory_working_set_bytes gauge\n";
    for c in containers {
        out += &format!("container_memory_working_set_bytes{{{}}} {} {now_ms}\n", labels(c), c.memory_bytes);
    }
    out += "# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds\n# TYPE container_start_time_seconds gauge\n";
    for c in containers {
        out += &format!("container_start_time_seconds{{{}}} {} {now_ms}\n", labels(c), c.started);
    }
    out += "# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds\n# TYPE node_cpu_usage_seconds_total counter\n";
    out += &format!("node_cpu_usage_seconds_total {node_cpu} {now_ms}\n");
    out += "# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes\n# TYPE node_memory_working_set_bytes gauge\n";
    out += &format!("node_memory_working_set_bytes {node_mem} {now_ms}\n");
    out += "# HELP pod_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the pod in core-seconds\n# TYPE pod_cpu_usage_seconds_total counter\n";
    for ((ns, pod), (cpu, _)) in &pods {
        out += &format!("pod_cpu_usage_seconds_total{{namespace=\"{ns}\",pod=\"{pod}\"}} {cpu} {now_ms}\n");
    }
    out += "# HELP pod_memory_working_set_bytes [STABLE] Current working set of the pod in bytes\n# TYPE pod_memory_working_set_bytes gauge\n";
    for ((ns, pod), (_, mem)) in &pods {
        out += &format!("pod_memory_working_set_bytes{{namespace=\"{ns}\",pod=\"{pod}\"}} {mem} {now_ms}\n");
    }
    out += "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE scrape_error gauge\nscrape_error 0\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_spaces_and_parentheses_in_the_command() {
        let s = "4242 (my (odd) cmd) S 4000 4242 4242 0 -1 4194304 100 0 0 0 250 50 7 3 20 0 1 0 12345 10000000 321 18446744073709551615";
        assert_eq!(parse_stat(s), Some(ProcStat { pid: 4242, ppid: 4000, cpu_ticks: 310, rss_pages: 321 }));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_container_is_its_monitors_descendants() {
        let p = |pid, ppid, cpu, rss| ProcStat { pid, ppid, cpu_ticks: cpu, rss_pages: rss };
        // 10 the monitor; 11 the container; 12 and 13 its children; 20 another tree.
        let t = ProcTable::new([
            p(10, 1, 1000, 500),
            p(11, 10, 200, 100),
            p(12, 11, 100, 10),
            p(13, 12, 50, 5),
            p(20, 1, 7, 7),
        ]);
        let mut d = t.descendants(10);
        d.sort();
        assert_eq!(d, vec![11, 12, 13]);
        assert_eq!(t.usage(10, 100, 4096), (3.5, 115 * 4096));
        assert_eq!(t.usage(99, 100, 4096), (0.0, 0));
    }

    #[test]
    fn the_page_sums_pods_and_the_node_and_reads_back() {
        let c = |pod: &str, name: &str, cpu, mem| ContainerUsage {
            namespace: "default".into(),
            pod: pod.into(),
            container: name.into(),
            cpu_seconds: cpu,
            memory_bytes: mem,
            started: 1_700_000_000,
        };
        let page = render(
            &[c("web", "a", 1.5, 100), c("web", "b", 0.5, 50), c("db", "c", 2.0, 10)],
            (1.0, 1000),
            1_700_000_000_123,
        );
        let samples = api::prometheus::parse(&page);
        let get = |name: &str, pod: Option<&str>| {
            samples
                .iter()
                .find(|(n, l, _, _)| n == name && pod.is_none_or(|p| l.get("pod").map(String::as_str) == Some(p)))
                .map(|s| (s.2, s.3))
        };
        assert_eq!(get("pod_cpu_usage_seconds_total", Some("web")), Some((2.0, Some(1_700_000_000_123))));
        assert_eq!(get("pod_memory_working_set_bytes", Some("web")), Some((150.0, Some(1_700_000_000_123))));
        assert_eq!(get("node_cpu_usage_seconds_total", None).map(|s| s.0), Some(5.0));
        assert_eq!(get("node_memory_working_set_bytes", None).map(|s| s.0), Some(1160.0));
        let c = samples
            .iter()
            .find(|(n, l, _, _)| n == "container_cpu_usage_seconds_total" && l["container"] == "b")
            .unwrap();
        assert_eq!((c.1["namespace"].as_str(), c.1["pod"].as_str(), c.2), ("default", "web", 0.5));
    }
}
