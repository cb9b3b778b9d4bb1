//! `metrics.k8s.io/v1beta1`, as metrics-server serves it behind kube-apiserver: every few seconds
//! each node's kubelet API is scraped (`/metrics/resource`, the node agent's page of cumulative
//! CPU and working sets), and the last two scrapes give each node's, pod's and container's CPU
//! rate over their window; NodeMetrics and PodMetrics are answered from that ([`MetricsStore`],
//! pure apart from its lock), as `kubectl top` and the HorizontalPodAutoscaler read them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api::Kind;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::registry::Registry;

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
/// How often every kubelet is scraped (metrics-server's `--metric-resolution`, 15 s by default;
/// a lab wants to see a change sooner).
pub const RESOLUTION: Duration = Duration::from_secs(5);

/// One cumulative reading.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    memory: u64,
    at_ms: i64,
}

/// The last two readings of a node, pod or container.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Window {
    prev: Option<Sample>,
    last: Sample,
}

impl Window {
    fn push(old: Option<Window>, s: Sample) -> Window {
        match old {
            // A new sample only when time moved (a second scrape of the same page is not one).
            Some(w) if w.last.at_ms >= s.at_ms => w,
            Some(w) => Window { prev: Some(w.last), last: s },
            None => Window { prev: None, last: s },
        }
    }

    /// (nanocores, memory bytes, timestamp ms, window ms): None until two readings exist, or
    /// after a counter went backwards (a restarted container).
    fn usage(&self) -> Option<(u64, u64, i64, i64)> {
        let prev = self.prev?;
        let dt = self.last.at_ms - prev.at_ms;
        let dcpu = self.last.cpu_seconds - prev.cpu_seconds;
        if dt <= 0 || dcpu < 0.0 {
            return None;
        }
        Some(((dcpu / (dt as f64 / 1000.0) * 1e9) as u64, self.last.memory, self.last.at_ms, dt))
    }
}

#[derive(Debug, Default)]
struct State {
    nodes: HashMap<String, Window>,
    /// (namespace, pod) → container → window; with the node that reported the pod.
    pods: HashMap<(String, String), (String, BTreeMap<String, Window>)>,
}

/// What the scrapes gathered.
#[derive(Debug, Default)]
pub struct MetricsStore(Mutex<State>);

/// A pod's usage: (container, nanocores, bytes) with the timestamp and window.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUsage {
    pub containers: Vec<(String, u64, u64)>,
    pub at_ms: i64,
    pub window_ms: i64,
}

impl PodUsage {
    pub fn cpu_nanocores(&self) -> u64 {
        self.containers.iter().map(|c| c.1).sum()
    }
}

impl MetricsStore {
    /// One node's scraped page.
    pub fn record(&self, node: &str, page: &str) {
        let samples = api::prometheus::parse(page);
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen: Vec<(String, String)> = vec![];
        let mut containers: BTreeMap<(String, String, String), Sample> = BTreeMap::new();
        let (mut node_cpu, mut node_mem, mut node_at) = (None, None, 0);
        for (name, labels, value, ts) in &samples {
            let at = ts.unwrap_or_else(|| jiff::Timestamp::now().as_millisecond());
            match name.as_str() {
                "node_cpu_usage_seconds_total" => {
                    node_cpu = Some(*value);
                    node_at = at;
                }
                "node_memory_working_set_bytes" => node_mem = Some(*value as u64),
                "container_cpu_usage_seconds_total" | "container_memory_working_set_bytes" => {
                    let key = (
                        labels.get("namespace").cloned().unwrap_or_default(),
                        labels.get("pod").cloned().unwrap_or_default(),
                        labels.get("container").cloned().unwrap_or_default(),
                    );
                    let s = containers.entry(key).or_insert(Sample { cpu_seconds: 0.0, memory: 0, at_ms: at });
                    if name == "container_cpu_usage_seconds_total" {
                        s.cpu_seconds = *value;
                    } else {
                        s.memory = *value as u64;
                    }
                }
                _ => {}
            }
        }
        if let (Some(cpu), Some(mem)) = (node_cpu, node_mem) {
            let w = Window::push(st.nodes.get(node).copied(), Sample { cpu_seconds: cpu, memory: mem, at_ms: node_at });
            st.nodes.insert(node.to_string(), w);
        }
        for ((ns, pod, c), s) in containers {
            let key = (ns, pod);
            let entry = st.pods.entry(key.clone()).or_insert_with(|| (node.to_string(), BTreeMap::new()));
            if entry.0 != node {
                // The pod moved (same name, another node): start over.
                *entry = (node.to_string(), BTreeMap::new());
            }
            let w = Window::push(entry.1.get(&c).copied(), s);
            entry.1.insert(c, w);
            if !seen.contains(&key) {
                seen.push(key);
            }
        }
        // Pods this node no longer runs are gone.
        st.pods.retain(|k, (n, _)| n != node || seen.contains(k));
    }

    /// A node left the cluster.
    pub fn forget_node(&self, node: &str) {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        st.nodes.remove(node);
        st.pods.retain(|_, (n, _)| n != node);
    }

    /// Keeps only the nodes of `names` (the cluster's now): a deleted node's readings go.
    pub fn keep_nodes(&self, names: &[String]) {
        let gone: Vec<String> = {
            let st = self.0.lock().unwrap_or_else(|e| e.into_inner());
            st.nodes.keys().filter(|n| !names.contains(n)).cloned().collect()
        };
        for n in gone {
            self.forget_node(&n);
        }
    }

    /// A node's usage: (nanocores, bytes, timestamp ms, window ms).
    pub fn node(&self, name: &str) -> Option<(u64, u64, i64, i64)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).nodes.get(name)?.usage()
    }

    /// A pod's usage, once every container has two readings.
    pub fn pod(&self, ns: &str, name: &str) -> Option<PodUsage> {
        let st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (_, containers) = st.pods.get(&(ns.to_string(), name.to_string()))?;
        let mut out = PodUsage { containers: vec![], at_ms: 0, window_ms: 0 };
        for (c, w) in containers {
            let (cpu, mem, at, window) = w.usage()?;
            out.containers.push((c.clone(), cpu, mem));
            out.at_ms = out.at_ms.max(at);
            out.window_ms = out.window_ms.max(window);
        }
        (!out.containers.is_empty()).then_some(out)
    }
}

fn time(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms - ms.rem_euclid(1000)).map(|t| t.to_string()).unwrap_or_default()
}

fn window(ms: i64) -> String {
    let s = ms as f64 / 1000.0;
    if s.fract() == 0.0 {
        format!("{}s", s as i64)
    } else {
        format!("{}s", (s * 1000.0).round() / 1000.0)
    }
}

fn usage(cpu: u64, mem: u64) -> Value {
    json!({"cpu": format!("{cpu}n"), "memory": format!("{}Ki", mem / 1024)})
}

fn labels_match(obj: &Value, selector: Option<&str>) -> Result<bool, ApiError> {
    let Some(sel) = selector.filter(|s| !s.is_empty()) else { return Ok(true) };
    let parsed = api::selector::LabelSelector::parse(sel).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let labels: BTreeMap<String, String> = obj
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default();
    Ok(parsed.matches(Some(&labels)))
}

fn node_metrics(node: &Value, u: (u64, u64, i64, i64)) -> Value {
    json!({
        "metadata": {"name": node.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
                     "creationTimestamp": jiff::Timestamp::now().to_string(),
                     "labels": node.pointer("/metadata/labels").cloned().unwrap_or(json!({}))},
        "timestamp": time(u.2),
        "window": window(u.3),
        "usage": usage(u.0, u.1),
    })
}

fn pod_metrics(pod: &Value, u: &PodUsage) -> Value {
    json!({
        "metadata": {"name": pod.pointer("/metadata/name").cloned().unwrap_or(Value::Null),
                     "namespace": pod.pointer("/metadata/namespace").cloned().unwrap_or(Value::Null),
                     "creationTimestamp": jiff::Timestamp::now().to_string(),
                     "labels": pod.pointer("/metadata/labels").cloned().unwrap_or(json!({}))},
        "timestamp": time(u.at_ms),
        "window": window(u.window_ms),
        "containers": u.containers.iter().map(|(c, cpu, mem)| json!({"name": c, "usage": usage(*cpu, *mem)})).collect::<Vec<_>>(),
    })
}

/// `GET /apis/metrics.k8s.io/v1beta1/…`: `rest` is what follows the version.
pub fn serve(reg: &Registry, rest: &[&str], query: &BTreeMap<String, String>) -> Result<Value, ApiError> {
    let gv = format!("{GROUP}/{VERSION}");
    let sel = query.get("labelSelector").map(String::as_str);
    let list = |kind: &str, items: Vec<Value>| json!({"kind": format!("{kind}List"), "apiVersion": gv, "metadata": {}, "items": items});
    let one = |kind: &str, mut v: Value| {
        v["kind"] = json!(kind);
        v["apiVersion"] = json!(gv);
        v
    };
    let not_found =
        |resource: &str, name: String| ApiError::NotFound { resource: format!("{resource}.{GROUP}"), name, kind: None };
    let store = &reg.metrics;
    match rest {
        ["nodes"] => {
            let (nodes, _) = reg.store.list(Kind::Node, None)?;
            let mut items = vec![];
            for n in &nodes {
                let name = n.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
                if let (true, Some(u)) = (labels_match(n, sel)?, store.node(name)) {
                    items.push(node_metrics(n, u));
                }
            }
            Ok(list("NodeMetrics", items))
        }
        ["nodes", name] => {
            let n = reg.store.get(Kind::Node, "", name)?.ok_or_else(|| not_found("nodemetrics", name.to_string()))?;
            let u = store.node(name).ok_or_else(|| not_found("nodemetrics", name.to_string()))?;
            Ok(one("NodeMetrics", node_metrics(&n, u)))
        }
        ["pods"] | ["namespaces", _, "pods"] => {
            let ns = match rest {
                ["namespaces", ns, _] => Some(*ns),
                _ => None,
            };
            let (pods, _) = reg.store.list(Kind::Pod, ns)?;
            let mut items = vec![];
            for p in &pods {
                let (pns, name) = (
                    p.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or(""),
                    p.pointer("/metadata/name").and_then(Value::as_str).unwrap_or(""),
                );
                if let (true, Some(u)) = (labels_match(p, sel)?, store.pod(pns, name)) {
                    items.push(pod_metrics(p, &u));
                }
            }
            Ok(list("PodMetrics", items))
        }
        ["namespaces", ns, "pods", name] => {
            let key = format!("{ns}/{name}");
            let p = reg.store.get(Kind::Pod, ns, name)?.ok_or_else(|| not_found("podmetrics", key.clone()))?;
            let u = store.pod(ns, name).ok_or_else(|| not_found("podmetrics", key))?;
            Ok(one("PodMetrics", pod_metrics(&p, &u)))
        }
        _ => Err(ApiError::NoRoute),
    }
}

/// Scrapes every node's kubelet API every [`RESOLUTION`], until the process ends.
pub async fn scrape(reg: Arc<Registry>, token: Option<Arc<str>>, netns: Option<PathBuf>) {
    let mut tick = tokio::time::interval(RESOLUTION);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Ok((nodes, _)) = reg.store.list(Kind::Node, None) else { continue };
        let names: Vec<String> = nodes
            .iter()
            .filter_map(|n| n.pointer("/metadata/name").and_then(Value::as_str).map(str::to_string))
            .collect();
        reg.metrics.keep_nodes(&names);
        let mut tasks = tokio::task::JoinSet::new();
        for n in nodes {
            let name = n.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("").to_string();
            let fake_pod = json!({"metadata": {"name": ""}, "spec": {"nodeName": name}});
            let Ok(addr) = crate::logs::kubelet_addr(&fake_pod, Some(&n)) else { continue };
            let (token, netns) = (token.clone(), netns.clone());
            tasks.spawn(async move {
                let page = tokio::time::timeout(Duration::from_secs(4), fetch(addr, token, netns)).await;
                (name, page)
            });
        }
        while let Some(Ok((name, page))) = tasks.join_next().await {
            match page {
                Ok(Ok(text)) => reg.metrics.record(&name, &text),
                Ok(Err(e)) => tracing::debug!(node = %name, "cannot scrape the kubelet: {e}"),
                Err(_) => tracing::debug!(node = %name, "scraping the kubelet timed out"),
            }
        }
    }
}

async fn fetch(addr: std::net::SocketAddr, token: Option<Arc<str>>, netns: Option<PathBuf>) -> Result<String, String> {
    let stream = crate::logs::dial(addr, netns).await.map_err(|e| e.to_string())?;
    let mut conn = podpath_client::http::Conn::over(addr, stream).await.map_err(|e| e.to_string())?;
    let auth = token.as_ref().map(|t| format!("Bearer {t}"));
    let mut headers = vec![];
    if let Some(a) = &auth {
        headers.push(("Authorization", a.as_str()));
    }
    let req =
        podpath_client::http::Request { headers: &headers, ..podpath_client::http::Request::get("/metrics/resource") };
    let resp = conn.stream(&req).await.map_err(|e| e.to_string())?;
    if resp.status() != 200 {
        return Err(format!("answered {}", resp.status()));
    }
    let body = http_body_util::BodyExt::collect(resp.into_body()).await.map_err(|e| e.to_string())?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kubelet's page with one container (`default/web` `c`) and the node.
    fn page(cpu: f64, mem: u64, at: i64) -> String {
        format!(
            "# TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{{container=\"c\",namespace=\"default\",pod=\"web\"}} {cpu} {at}\n\
             container_memory_working_set_bytes{{container=\"c\",namespace=\"default\",pod=\"web\"}} {mem} {at}\n\
             node_cpu_usage_seconds_total {cpu} {at}\nnode_memory_working_set_bytes {mem} {at}\n"
        )
    }

    fn empty(at: i64) -> String {
        format!("node_cpu_usage_seconds_total 0 {at}\nnode_memory_working_set_bytes 0 {at}\n")
    }

    #[test]
    fn two_scrapes_give_a_rate_over_their_window() {
        let m = MetricsStore::default();
        m.record("node-1", &page(10.0, 4096 * 1024, 1_000_000));
        assert_eq!(m.node("node-1"), None, "one reading is no rate");
        assert_eq!(m.pod("default", "web"), None);
        m.record("node-1", &page(10.0, 4096 * 1024, 1_000_000));
        assert_eq!(m.node("node-1"), None, "the same page again is no new reading");
        m.record("node-1", &page(12.5, 8192 * 1024, 1_005_000));
        // 2.5 core-seconds in 5 s: half a core.
        assert_eq!(m.node("node-1"), Some((500_000_000, 8192 * 1024, 1_005_000, 5_000)));
        let p = m.pod("default", "web").unwrap();
        assert_eq!((p.cpu_nanocores(), p.window_ms), (500_000_000, 5_000));
        // A restart (the counter went back): no rate until the next reading.
        m.record("node-1", &page(0.5, 1024, 1_010_000));
        assert_eq!(m.pod("default", "web"), None);
        // A pod the node no longer reports is gone.
        m.record("node-1", &empty(1_015_000));
        assert!(m.0.lock().unwrap().pods.is_empty());
        m.record("node-2", &page(1.0, 1, 1_000_000));
        m.keep_nodes(&["node-2".to_string()]);
        assert!(m.0.lock().unwrap().nodes.keys().eq(["node-2"].iter().copied()));
        m.forget_node("node-1");
        assert_eq!(m.node("node-1"), None);
    }

    #[test]
    fn windows_and_quantities_as_metrics_server_writes_them() {
        assert_eq!(window(5_000), "5s");
        assert_eq!(window(15_500), "15.5s");
        assert_eq!(usage(1_500_000, 10 * 1024 * 1024), json!({"cpu": "1500000n", "memory": "10240Ki"}));
        assert_eq!(time(1_700_000_000_750), "2023-11-14T22:13:20Z");
    }
}
