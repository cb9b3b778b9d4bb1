//! A CNI runtime (the part of a container runtime that calls plugins), following the CNI spec:
//! network configuration lists from `--cni-conf-dir` (or a default one written for this node),
//! plugin chains executed in order for ADD and in reverse for DEL with the cached result as
//! `prevResult`, a result cache in libcni's layout, and GC of attachments no pod owns.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use podpath_cni_spec::env::Command;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::error::{KubeletError, Result};

/// The file name of the configuration the agent writes when the directory has none.
pub const DEFAULT_CONFLIST: &str = "10-podpath.conflist";

/// A network configuration list.
#[derive(Debug, Clone, PartialEq)]
pub struct Network {
    pub name: String,
    pub cni_version: String,
    pub plugins: Vec<Value>,
    /// Where it was loaded from (for messages).
    pub source: PathBuf,
}

impl Network {
    /// Parses a `.conflist`, or a single-plugin `.conf` (turned into a list of one).
    pub fn parse(source: &Path, text: &str) -> Result<Network> {
        let bad = |why: String| KubeletError::Config(format!("CNI configuration {}: {why}", source.display()));
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let name = v["name"].as_str().filter(|n| !n.is_empty()).ok_or_else(|| bad("no \"name\"".into()))?;
        let version = v["cniVersion"].as_str().unwrap_or("0.3.0");
        let plugins = match v.get("plugins") {
            Some(Value::Array(list)) => list.clone(),
            Some(_) => return Err(bad("\"plugins\" is not a list".into())),
            None if v.get("type").is_some() => {
                let mut single = v.clone();
                if let Some(o) = single.as_object_mut() {
                    o.remove("name");
                    o.remove("cniVersion");
                }
                vec![single]
            }
            None => return Err(bad("neither \"plugins\" nor \"type\"".into())),
        };
        if plugins.is_empty() {
            return Err(bad("\"plugins\" is empty".into()));
        }
        for p in &plugins {
            if p["type"].as_str().is_none_or(|t| t.is_empty() || t.contains('/')) {
                return Err(bad(format!("plugin without a valid \"type\": {p}")));
            }
        }
        Ok(Network { name: name.to_string(), cni_version: version.to_string(), plugins, source: source.to_path_buf() })
    }

    /// The configuration one plugin of the chain receives on stdin.
    pub fn plugin_config(&self, index: usize, prev_result: Option<&Value>) -> Value {
        let mut conf = self.plugins[index].clone();
        conf["name"] = json!(self.name);
        conf["cniVersion"] = json!(self.cni_version);
        if let Some(prev) = prev_result {
            conf["prevResult"] = prev.clone();
        }
        conf
    }

    fn as_conflist(&self) -> Value {
        json!({"cniVersion": self.cni_version, "name": self.name, "plugins": self.plugins})
    }
}

/// The configuration written for a node when `--cni-conf-dir` has none: podpath's bridge and
/// IPAM plugins on `cni0` with the node's pod CIDRs (a range set per family, as host-local's
/// `ranges`), no masquerade (pod-to-pod traffic between
/// nodes keeps its source address), same-node pod traffic routed through the node (so the
/// NetworkPolicy filter in its forward hook sees every pod's packets), IPAM state in the agent's state directory (nodes of one
/// host must not share it).
pub fn default_network_config(pod_cidrs: &[String], ipam_dir: &Path) -> Value {
    let ranges: Vec<Value> = pod_cidrs.iter().map(|c| json!([{"subnet": c}])).collect();
    let routes: Vec<Value> = pod_cidrs
        .iter()
        .map(|c| if c.contains(':') { json!({"dst": "::/0"}) } else { json!({"dst": "0.0.0.0/0"}) })
        .collect();
    json!({
        "cniVersion": "1.1.0",
        "name": "podpath",
        "plugins": [{
            "type": "podpath-bridge",
            "bridge": "cni0",
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "routeSameBridge": true,
            "ipam": {
                "type": "podpath-ipam",
                "ranges": ranges,
                "routes": routes,
                "dataDir": ipam_dir.display().to_string(),
            }
        }]
    })
}

/// Loads the first configuration of `dir` in lexical order (`.conflist`, `.conf`, `.json`), as
/// kubelet and containerd do; `None` when there is none.
pub fn load_network(dir: &Path) -> Result<Option<Network>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(KubeletError::io(format!("read {}", dir.display()), e)),
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("conflist" | "conf" | "json")))
        .collect();
    files.sort();
    match files.first() {
        None => Ok(None),
        Some(f) => {
            let text = std::fs::read_to_string(f).map_err(|e| KubeletError::io(format!("read {}", f.display()), e))?;
            Network::parse(f, &text).map(Some)
        }
    }
}

/// Loads the directory's configuration, writing the default one first when there is none.
pub fn load_or_write_default(dir: &Path, pod_cidrs: &[String], ipam_dir: &Path) -> Result<Network> {
    if let Some(n) = load_network(dir)? {
        return Ok(n);
    }
    std::fs::create_dir_all(dir).map_err(|e| KubeletError::io(format!("create {}", dir.display()), e))?;
    let path = dir.join(DEFAULT_CONFLIST);
    let text = serde_json::to_string_pretty(&default_network_config(pod_cidrs, ipam_dir)).expect("json");
    write_atomic(&path, text.as_bytes())?;
    tracing::info!(path = %path.display(), ?pod_cidrs, "wrote the default CNI configuration");
    Network::parse(&path, &text)
}

/// Writes a file so readers never see half of it.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| KubeletError::io(format!("write {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| KubeletError::io(format!("rename {} to {}", tmp.display(), path.display()), e))
}

/// One pod's attachment to the network.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attachment {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub pod_namespace: String,
    pub pod_name: String,
}

impl Attachment {
    /// `CNI_ARGS` as kubelet's runtimes pass it.
    pub fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={}",
            self.pod_namespace, self.pod_name, self.container_id
        )
    }
}

/// Runs one plugin binary: `Ok(stdout)` on success, `Err((exit code, stdout))` on failure.
pub trait PluginExec: Send + Sync + 'static {
    fn exec(
        &self,
        plugin: &Path,
        env: Vec<(&'static str, String)>,
        stdin: Vec<u8>,
    ) -> impl Future<Output = std::result::Result<Vec<u8>, (Option<i32>, Vec<u8>)>> + Send;
}

impl<T: PluginExec> PluginExec for std::sync::Arc<T> {
    fn exec(
        &self,
        plugin: &Path,
        env: Vec<(&'static str, String)>,
        stdin: Vec<u8>,
    ) -> impl Future<Output = std::result::Result<Vec<u8>, (Option<i32>, Vec<u8>)>> + Send {
        (**self).exec(plugin, env, stdin)
    }
}

/// Executes plugins as processes.
pub struct RealExec;

impl PluginExec for RealExec {
    async fn exec(
        &self,
        plugin: &Path,
        env: Vec<(&'static str, String)>,
        stdin: Vec<u8>,
    ) -> std::result::Result<Vec<u8>, (Option<i32>, Vec<u8>)> {
        let mut cmd = tokio::process::Command::new(plugin);
        cmd.env_clear().stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit());
        if let Ok(path) = std::env::var("PATH") {
            cmd.env("PATH", path);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| (None, format!("cannot run: {e}").into_bytes()))?;
        let mut input = child.stdin.take().expect("piped stdin");
        let _ = input.write_all(&stdin).await;
        drop(input);
        let out = child.wait_with_output().await.map_err(|e| (None, e.to_string().into_bytes()))?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err((out.status.code(), out.stdout))
        }
    }
}

/// The CNI runtime of one node.
pub struct CniRuntime<E> {
    pub exec: E,
    pub bin_dirs: Vec<PathBuf>,
    pub cache_dir: PathBuf,
}

/// A cached ADD (libcni's `cniCacheV1` layout, so the files look familiar).
#[derive(Debug, Clone, PartialEq)]
pub struct Cached {
    pub attachment: Attachment,
    pub network: Network,
    pub result: Value,
}

impl<E: PluginExec> CniRuntime<E> {
    fn find_plugin(&self, command: Command, kind: &str, att: &Attachment) -> Result<PathBuf> {
        self.bin_dirs.iter().map(|d| d.join(kind)).find(|p| p.is_file()).ok_or_else(|| KubeletError::Cni {
            command,
            plugin: kind.to_string(),
            container_id: att.container_id.clone(),
            code: 0,
            msg: format!(
                "plugin {kind:?} not found in {}",
                self.bin_dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(":")
            ),
            details: None,
        })
    }

    async fn call(
        &self,
        command: Command,
        net: &Network,
        index: usize,
        att: &Attachment,
        prev: Option<&Value>,
    ) -> Result<Vec<u8>> {
        let kind = net.plugins[index]["type"].as_str().unwrap_or_default().to_string();
        let plugin = self.find_plugin(command, &kind, att)?;
        let path = std::env::join_paths(&self.bin_dirs).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
        let env = vec![
            ("CNI_COMMAND", command.to_string()),
            ("CNI_CONTAINERID", att.container_id.clone()),
            ("CNI_NETNS", att.netns.clone()),
            ("CNI_IFNAME", att.ifname.clone()),
            ("CNI_ARGS", att.cni_args()),
            ("CNI_PATH", path),
        ];
        let stdin = serde_json::to_vec(&net.plugin_config(index, prev)).expect("json");
        self.exec.exec(&plugin, env, stdin).await.map_err(|(status, stdout)| {
            let err: Value = serde_json::from_slice(&stdout).unwrap_or(Value::Null);
            KubeletError::Cni {
                command,
                plugin: kind.clone(),
                container_id: att.container_id.clone(),
                code: err["code"].as_u64().unwrap_or(0) as u32,
                msg: err["msg"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("exit {status:?}: {}", String::from_utf8_lossy(&stdout).trim())),
                details: err["details"].as_str().filter(|d| !d.is_empty()).map(str::to_string),
            }
        })
    }

    /// ADD through the whole chain; caches and returns the final result. On failure the chain is
    /// rolled back with DEL (best effort) so nothing stays half attached.
    pub async fn add(&self, net: &Network, att: &Attachment) -> Result<Value> {
        let mut prev: Option<Value> = None;
        for i in 0..net.plugins.len() {
            match self.call(Command::Add, net, i, att, prev.as_ref()).await {
                Ok(out) => {
                    let result: Value = serde_json::from_slice(&out).map_err(|e| KubeletError::Cni {
                        command: Command::Add,
                        plugin: net.plugins[i]["type"].as_str().unwrap_or_default().into(),
                        container_id: att.container_id.clone(),
                        code: 0,
                        msg: format!("the plugin printed no valid result: {e}"),
                        details: None,
                    })?;
                    prev = Some(result);
                }
                Err(e) => {
                    if let Err(undo) = self.del_chain(net, att, prev.as_ref()).await {
                        tracing::warn!(container = %att.container_id, "rolling back a failed ADD: {undo}");
                    }
                    return Err(e);
                }
            }
        }
        let result = prev.unwrap_or(Value::Null);
        self.write_cache(&Cached { attachment: att.clone(), network: net.clone(), result: result.clone() })?;
        Ok(result)
    }

    async fn del_chain(&self, net: &Network, att: &Attachment, prev: Option<&Value>) -> Result<()> {
        let mut first_error = None;
        for i in (0..net.plugins.len()).rev() {
            if let Err(e) = self.call(Command::Del, net, i, att, prev).await {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// DEL in reverse order with the cached configuration and result (the configuration in use
    /// at ADD time, even if the directory changed since); `net` is used when nothing is cached.
    /// The cache entry is removed only once every plugin succeeded, so a failed DEL is retried.
    pub async fn del(&self, net: &Network, att: &Attachment) -> Result<()> {
        let path = self.cache_path(&net.name, &att.container_id, &att.ifname);
        match Self::parse_cache(&path) {
            Some(c) => self.del_chain(&c.network, att, Some(&c.result)).await?,
            None => self.del_chain(net, att, None).await?,
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(KubeletError::io(format!("remove {}", path.display()), e))
            }
            _ => Ok(()),
        }
    }

    fn cache_path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        self.cache_dir.join(format!("{network}-{container_id}-{ifname}"))
    }

    fn write_cache(&self, c: &Cached) -> Result<()> {
        std::fs::create_dir_all(&self.cache_dir)
            .map_err(|e| KubeletError::io(format!("create {}", self.cache_dir.display()), e))?;
        let v = json!({
            "kind": "cniCacheV1",
            "containerId": c.attachment.container_id,
            "ifName": c.attachment.ifname,
            "networkName": c.network.name,
            "netns": c.attachment.netns,
            "cniArgs": [["K8S_POD_NAMESPACE", c.attachment.pod_namespace], ["K8S_POD_NAME", c.attachment.pod_name]],
            "config": c.network.as_conflist(),
            "result": c.result,
        });
        write_atomic(
            &self.cache_path(&c.network.name, &c.attachment.container_id, &c.attachment.ifname),
            serde_json::to_string_pretty(&v).expect("json").as_bytes(),
        )
    }

    fn parse_cache(path: &Path) -> Option<Cached> {
        let v: Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        let arg = |k: &str| {
            v["cniArgs"].as_array()?.iter().find(|p| p[0] == k).and_then(|p| p[1].as_str()).map(str::to_string)
        };
        Some(Cached {
            attachment: Attachment {
                container_id: v["containerId"].as_str()?.to_string(),
                netns: v["netns"].as_str().unwrap_or_default().to_string(),
                ifname: v["ifName"].as_str()?.to_string(),
                pod_namespace: arg("K8S_POD_NAMESPACE").unwrap_or_default(),
                pod_name: arg("K8S_POD_NAME").unwrap_or_default(),
            },
            network: Network::parse(path, &v["config"].to_string()).ok()?,
            result: v["result"].clone(),
        })
    }

    /// The cached ADD of one attachment.
    pub fn read_cache(&self, network: &str, container_id: &str, ifname: &str) -> Option<Cached> {
        Self::parse_cache(&self.cache_path(network, container_id, ifname))
    }

    /// Every cached ADD.
    pub fn cached(&self) -> Vec<Cached> {
        let Ok(dir) = std::fs::read_dir(&self.cache_dir) else { return vec![] };
        let mut out: Vec<Cached> = dir.filter_map(|e| Self::parse_cache(&e.ok()?.path())).collect();
        out.sort_by(|a, b| a.attachment.container_id.cmp(&b.attachment.container_id));
        out
    }

    /// GC: DEL every cached attachment whose container is not in `keep`, then (CNI ≥ 1.1) send
    /// the plugins `GC` with the attachments that remain valid.
    pub async fn gc(&self, net: &Network, keep: &BTreeSet<String>) -> Result<()> {
        let mut valid = vec![];
        for c in self.cached() {
            if keep.contains(&c.attachment.container_id) {
                valid.push(json!({"containerID": c.attachment.container_id, "ifname": c.attachment.ifname}));
                continue;
            }
            tracing::info!(container = %c.attachment.container_id, pod = %format!("{}/{}", c.attachment.pod_namespace, c.attachment.pod_name), "CNI GC: releasing a stale attachment");
            // The sandbox is gone, so the netns is empty: plugins release host-side state only.
            let att = Attachment { netns: String::new(), ..c.attachment.clone() };
            self.del(&c.network, &att).await?;
        }
        if version_at_least(&net.cni_version, (1, 1, 0)) {
            let att = Attachment::default();
            for i in 0..net.plugins.len() {
                let mut gc_net = net.clone();
                gc_net.plugins[i]["cni.dev/valid-attachments"] = json!(valid);
                if let Err(e) = self.call(Command::Gc, &gc_net, i, &att, None).await {
                    tracing::warn!("CNI GC of {}: {e}", net.plugins[i]["type"]);
                }
            }
        }
        Ok(())
    }
}

fn version_at_least(v: &str, min: (u32, u32, u32)) -> bool {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let t = (parts.next().unwrap_or(0), parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    t >= min
}

/// The pod's addresses in a CNI result (any version ≥ 0.3.0), in order.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    let mut out = vec![];
    for ip in result["ips"].as_array().into_iter().flatten() {
        if let Some(addr) = ip["address"].as_str().and_then(|a| a.split('/').next()).and_then(|a| a.parse().ok()) {
            if !out.contains(&addr) {
                out.push(addr);
            }
        }
    }
    out
}
