//! What a container runs and how it is checked, decided from its spec: the workload's argv and
//! environment ([`launch`]), its readiness checks, and its preStop handler.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1 as core;
use tokio::time::Instant;

use super::{is_dns_image, is_echo_image, uid, Check, PodsConfig};
use crate::process::{ProcId, ProcSpec};

/// How a container's process is started, or why it cannot be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launch {
    Run(ProcSpec),
    /// Kubernetes-style waiting reason and message (no program to run).
    Cannot {
        reason: String,
        message: String,
    },
    /// The program does not exist: a start error (exit 128), retried with back-off.
    StartError(String),
}

/// Whether `name` is an executable file (a path, or found in `PATH`).
pub fn find_program(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let ok = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if name.contains('/') {
        return ok(Path::new(name));
    }
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| ok(&d.join(name))))
}

/// The environment of a workload: the pod's identity (podpath/echo reads it), the Service
/// variables, and the container's `env` (plain values and the common `fieldRef`s).
pub fn workload_env(
    pod: &core::Pod,
    c: &core::Container,
    pod_ip: &str,
    node: &str,
    host_ip: &str,
    services: &[(String, String)],
) -> Vec<(String, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let hostname = pod.spec.as_ref().and_then(|s| s.hostname.clone()).filter(|h| !h.is_empty());
    let mut env = vec![
        ("HOSTNAME".to_string(), hostname.unwrap_or_else(|| name.clone())),
        ("POD_NAME".to_string(), name.clone()),
        ("POD_NAMESPACE".to_string(), ns.clone()),
        ("POD_IP".to_string(), pod_ip.to_string()),
        ("NODE_NAME".to_string(), node.to_string()),
    ];
    // Process pods read no Secrets or ConfigMaps (no objects: such variables are empty).
    let own = container_env(pod, c, pod_ip, node, host_ip, services, None).unwrap_or_default();
    for (k, v) in services.iter().cloned().chain(own) {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    }
    env
}

/// A key of a Secret or ConfigMap, as kubelet reads it for `env` (`None`: optional and
/// missing); a missing one not optional is an error in kubelet's words.
fn object_key(
    objects: &dyn crate::volumes::Objects,
    ns: &str,
    secret: bool,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, String> {
    // The same key-value view the volumes read (`data` and `stringData`, `binaryData`).
    let text = |d: std::collections::BTreeMap<String, Vec<u8>>| {
        d.into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let (kind, data) = if secret {
        ("Secret", objects.secret(ns, name).map(|s| text(crate::volumes::secret_data(&s))))
    } else {
        ("ConfigMap", objects.config_map(ns, name).map(|c| text(crate::volumes::config_map_data(&c))))
    };
    match data {
        None if optional => Ok(None),
        None => Err(format!("{} {name:?} not found", kind.to_ascii_lowercase())),
        Some(d) => match d.get(key) {
            Some(v) => Ok(Some(v.clone())),
            None if optional => Ok(None),
            None => Err(format!("couldn't find key {key} in {kind} {ns}/{name}")),
        },
    }
}

/// A container's environment from the pod: `envFrom` (every key of a ConfigMap or Secret,
/// with its `prefix`), then `env` in order — plain values with `$(VAR)` references to the
/// variables before them and to `base`, the common `fieldRef`s, and `secretKeyRef` /
/// `configMapKeyRef` (read through `objects`; without them, empty). An error is kubelet's
/// `CreateContainerConfigError` message.
pub fn container_env(
    pod: &core::Pod,
    c: &core::Container,
    pod_ip: &str,
    node: &str,
    host_ip: &str,
    base: &[(String, String)],
    objects: Option<&dyn crate::volumes::Objects>,
) -> Result<Vec<(String, String)>, String> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let mut env: Vec<(String, String)> = vec![];
    let set = |env: &mut Vec<(String, String)>, k: String, v: String| {
        env.retain(|(n, _)| *n != k);
        env.push((k, v));
    };
    if let Some(objects) = objects {
        for from in c.env_from.iter().flatten() {
            let prefix = from.prefix.clone().unwrap_or_default();
            let (secret, obj, optional) = match (&from.secret_ref, &from.config_map_ref) {
                (Some(s), _) => (true, s.name.clone(), s.optional == Some(true)),
                (None, Some(cm)) => (false, cm.name.clone(), cm.optional == Some(true)),
                _ => continue,
            };
            let data: Option<Vec<(String, String)>> = if secret {
                objects.secret(&ns, &obj).map(|s| {
                    s.data
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                        .collect()
                })
            } else {
                objects.config_map(&ns, &obj).map(|cm| cm.data.unwrap_or_default().into_iter().collect())
            };
            match data {
                Some(kv) => {
                    for (k, v) in kv {
                        set(&mut env, format!("{prefix}{k}"), v);
                    }
                }
                None if optional => {}
                None => return Err(format!("{} {obj:?} not found", if secret { "secret" } else { "configmap" })),
            }
        }
    }
    for e in c.env.iter().flatten() {
        let from = e.value_from.as_ref();
        let value = if let Some(v) = &e.value {
            let lookup =
                |k: &str| env.iter().rev().chain(base.iter().rev()).find(|(n, _)| n == k).map(|(_, v)| v.clone());
            super::envvars::expand(v, &lookup)
        } else if let Some(f) = from.and_then(|f| f.field_ref.as_ref()) {
            match f.field_path.as_str() {
                "metadata.name" => name.clone(),
                "metadata.namespace" => ns.clone(),
                "metadata.uid" => uid(pod),
                "spec.nodeName" => node.to_string(),
                "status.podIP" => pod_ip.to_string(),
                "status.hostIP" => host_ip.to_string(),
                other => crate::volumes::field(pod, other).unwrap_or_default(),
            }
        } else if let (Some(r), Some(objects)) = (from.and_then(|f| f.secret_key_ref.as_ref()), objects) {
            match object_key(objects, &ns, true, &r.name, &r.key, r.optional == Some(true))? {
                Some(v) => v,
                None => continue,
            }
        } else if let (Some(r), Some(objects)) = (from.and_then(|f| f.config_map_key_ref.as_ref()), objects) {
            match object_key(objects, &ns, false, &r.name, &r.key, r.optional == Some(true))? {
                Some(v) => v,
                None => continue,
            }
        } else {
            String::new()
        };
        set(&mut env, e.name.clone(), value);
    }
    Ok(env)
}

/// A container's (command, args) as the runtime would make them of the image: for the base
/// images without an entrypoint, the args alone are the command line, else the image's CMD.
pub fn command_line(image: &str, command: Vec<String>, args: Vec<String>) -> (Vec<String>, Vec<String>) {
    match (command.is_empty(), super::base_image_cmd(image)) {
        (true, Some(cmd)) if args.is_empty() => (vec![cmd.to_string()], vec![]),
        (true, Some(_)) => (args, vec![]),
        _ => (command, args),
    }
}

/// Decides how to run a container (pure apart from looking the program up in `PATH`): the
/// program joined to the sandbox (a command, or the built-in `podpath/echo`), under its monitor
/// (`podpath-workload monitor`, the role of conmon): it writes the container's output to the
/// log of this `attempt` (0 first, then the restart count) in the CRI format, and holds the
/// container's stdin and terminal for `kubectl attach` when the container asks for them.
pub fn launch(
    cfg: &PodsConfig,
    pod: &core::Pod,
    c: &core::Container,
    sandbox: ProcId,
    pod_ip: &str,
    attempt: i32,
    services: &[(String, String)],
) -> Launch {
    let image = c.image.clone().unwrap_or_default();
    let (command, args) =
        command_line(&image, c.command.clone().unwrap_or_default(), c.args.clone().unwrap_or_default());
    let bin = cfg.workload_bin.display().to_string();
    let tty = c.tty == Some(true);
    let inner = if !command.is_empty() {
        if !find_program(&command[0]) {
            return Launch::StartError(format!(
                "failed to start the container process: exec: {:?}: executable file not found in $PATH",
                command[0]
            ));
        }
        let mut argv = vec![bin.clone(), "join".into(), "--sandbox".into(), sandbox.pid.to_string()];
        if tty {
            argv.push("--tty".into());
        }
        argv.push("--".into());
        argv.extend(command);
        argv.extend(args);
        argv
    } else if is_dns_image(&image) {
        // podpath-dns sits next to podpath-workload; it reaches the API as the agent does.
        let dns = cfg.workload_bin.with_file_name("podpath-dns");
        let mut argv = vec![bin.clone(), "join".into(), "--sandbox".into(), sandbox.pid.to_string(), "--".into()];
        argv.push(dns.display().to_string());
        argv.extend(cfg.api_args.iter().cloned());
        argv.extend(args);
        argv
    } else if is_echo_image(&image) {
        let mut argv = vec![bin.clone(), "echo".into(), "--sandbox".into(), sandbox.pid.to_string()];
        for p in c.ports.iter().flatten() {
            match p.protocol.as_deref().unwrap_or("TCP") {
                "TCP" => argv.push("--port".into()),
                "UDP" => argv.push("--udp-port".into()),
                _ => continue,
            }
            argv.push(p.container_port.to_string());
        }
        argv.push("--".into());
        argv.extend(args);
        argv
    } else {
        return Launch::Cannot {
            reason: "ErrImagePull".into(),
            message: format!(
                "podpath runs no container images: {image:?} is not built in. Use image podpath/echo \
                 (or podpath/dns, the cluster DNS server), busybox, alpine, debian or ubuntu (their \
                 command lines run the node's programs), or give the container a command (a program \
                 on the node) to run in the pod's namespaces"
            ),
        };
    };
    let env = workload_env(pod, c, pod_ip, &cfg.node_name, &cfg.node_ip.to_string(), services);
    Launch::Run(monitor_spec(cfg, pod, c, Some(sandbox), attempt, inner, env, None))
}

/// What the monitor of an image's container needs beyond a process's: the runtime's PID file
/// (the runtime starts the container and exits; the monitor adopts and waits for the
/// container's process) and the image's `StopSignal`.
pub struct ImageProcess<'a> {
    pub pid_file: &'a Path,
    pub stop_signal: Option<&'a str>,
}

/// A container's process under its monitor (`podpath-workload monitor`, conmon's role): it
/// writes the output of `inner` to the log of this `attempt` in the CRI format, and holds the
/// container's stdin and terminal for `kubectl attach` when the container asks for them. With
/// a sandbox, the monitor joins its namespaces first.
#[allow(clippy::too_many_arguments)]
pub fn monitor_spec(
    cfg: &PodsConfig,
    pod: &core::Pod,
    c: &core::Container,
    sandbox: Option<ProcId>,
    attempt: i32,
    inner: Vec<String>,
    env: Vec<(String, String)>,
    image: Option<ImageProcess<'_>>,
) -> ProcSpec {
    let bin = cfg.workload_bin.display().to_string();
    let (stdin, tty) = (c.stdin == Some(true), c.tty == Some(true));
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let log = cfg.log_path(&ns, &name, &uid(pod), &c.name, attempt);
    let mut argv = vec![bin, "monitor".into()];
    if let Some(sandbox) = sandbox {
        argv.extend(["--sandbox".to_string(), sandbox.pid.to_string()]);
    }
    argv.extend(["--log".to_string(), log.display().to_string()]);
    if let Some(img) = &image {
        argv.extend(["--adopt".to_string(), img.pid_file.display().to_string()]);
        if let Some(sig) = img.stop_signal {
            argv.extend(["--stop-signal".to_string(), sig.to_string()]);
        }
    }
    if stdin || tty {
        // stdin or a terminal: the monitor's socket is how `kubectl attach` reaches them.
        match cfg.attach_socket(&uid(pod), &c.name) {
            Some(socket) => {
                argv.push("--console".into());
                argv.push(socket.display().to_string());
                if stdin {
                    argv.push("--stdin".into());
                }
                if tty {
                    argv.push("--tty".into());
                }
                if c.stdin_once == Some(true) {
                    argv.push("--stdin-once".into());
                }
            }
            None => {
                tracing::warn!(pod = %name, container = %c.name, "the state directory is too deep for a console socket: kubectl attach will show output only")
            }
        }
    }
    argv.push("--".into());
    argv.extend(inner);
    // The monitor writes the log itself; its own messages (it could not start) go beside it.
    ProcSpec { argv, env, log: Some(log.with_file_name("monitor.log")) }
}

/// Readiness checking of one container.
#[derive(Debug, Clone)]
pub(super) struct Readiness {
    pub(super) checks: Vec<Check>,
    pub(super) explicit: bool,
    pub(super) initial_delay: Duration,
    pub(super) period: Duration,
    pub(super) timeout: Duration,
    pub(super) success_threshold: u32,
    pub(super) failure_threshold: u32,
    pub(super) successes: u32,
    pub(super) failures: u32,
    pub(super) next: Option<Instant>,
}

/// While no explicit probe exists, "ready" means the container ports accept connections; this
/// is how often that is tried until it first succeeds.
pub(super) const DEFAULT_PROBE_RETRY: Duration = Duration::from_millis(50);
const DEFAULT_PROBE_PERIOD: Duration = Duration::from_secs(10);

fn port_of(port: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString, c: &core::Container) -> Option<u16> {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    match port {
        IntOrString::Int(p) => u16::try_from(*p).ok(),
        IntOrString::String(name) => c
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// A container's `lifecycle.preStop` handler.
#[derive(Debug, Clone, PartialEq)]
pub enum PreStop {
    Sleep(Duration),
    Check(Check),
}

/// The preStop handler of a container (sleep, exec in the container, or an HTTP GET to the
/// pod), if it has one. tcpSocket handlers are deprecated and, as in kubelet, do nothing.
pub fn pre_stop(c: &core::Container, pod_ip: Option<IpAddr>, join: &[String]) -> Option<PreStop> {
    let h = c.lifecycle.as_ref()?.pre_stop.as_ref()?;
    if let Some(s) = &h.sleep {
        return Some(PreStop::Sleep(Duration::from_secs(s.seconds.max(0) as u64)));
    }
    if let Some(e) = &h.exec {
        return Some(PreStop::Check(exec_check(join, e)));
    }
    http_check(h.http_get.as_ref()?, c, pod_ip?).map(PreStop::Check)
}

/// How a command enters a container: `podpath-workload join` into the container of an image
/// (its PID file), or into the sandbox for a process container; the command follows `--`.
pub fn join_prefix(workload_bin: &Path, sandbox: ProcId, pid_file: Option<&Path>) -> Vec<String> {
    let mut argv = vec![workload_bin.display().to_string(), "join".into()];
    match pid_file {
        Some(f) => argv.extend(["--pid-file".to_string(), f.display().to_string()]),
        None => argv.extend(["--sandbox".to_string(), sandbox.pid.to_string()]),
    }
    argv.push("--".into());
    argv
}

/// An exec action as a check: the command runs inside the container.
fn exec_check(join: &[String], e: &core::ExecAction) -> Check {
    let mut argv = join.to_vec();
    argv.extend(e.command.iter().flatten().cloned());
    Check::Exec { argv }
}

/// An httpGet action as a check: to `host` or the pod's IP; a `Host` header becomes the host.
fn http_check(g: &core::HTTPGetAction, c: &core::Container, pod_ip: IpAddr) -> Option<Check> {
    let port = port_of(&g.port, c)?;
    let addr = SocketAddr::new(g.host.as_deref().and_then(|h| h.parse().ok()).unwrap_or(pod_ip), port);
    let headers: Vec<(String, String)> =
        g.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect();
    let host = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("host")).map(|(_, v)| v.clone());
    Some(Check::Http {
        addr,
        path: g.path.clone().unwrap_or_else(|| "/".into()),
        host,
        headers: headers.into_iter().filter(|(k, _)| !k.eq_ignore_ascii_case("host")).collect(),
    })
}

pub(super) fn readiness(c: &core::Container, pod_ip: Option<IpAddr>, join: &[String]) -> Readiness {
    let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(0) as u64);
    let mut r = Readiness {
        checks: vec![],
        explicit: false,
        initial_delay: Duration::ZERO,
        period: DEFAULT_PROBE_PERIOD,
        timeout: Duration::from_secs(1),
        success_threshold: 1,
        failure_threshold: 3,
        successes: 0,
        failures: 0,
        next: None,
    };
    let Some(ip) = pod_ip else { return r };
    match &c.readiness_probe {
        Some(p) => {
            r.explicit = true;
            r.initial_delay = secs(p.initial_delay_seconds, 0);
            r.period = secs(p.period_seconds, 10).max(Duration::from_secs(1));
            r.timeout = secs(p.timeout_seconds, 1).max(Duration::from_secs(1));
            r.success_threshold = p.success_threshold.unwrap_or(1).max(1) as u32;
            r.failure_threshold = p.failure_threshold.unwrap_or(3).max(1) as u32;
            if let Some(t) = &p.tcp_socket {
                if let Some(port) = port_of(&t.port, c) {
                    r.checks.push(Check::Tcp(SocketAddr::new(ip, port)));
                }
            } else if let Some(h) = &p.http_get {
                r.checks.extend(http_check(h, c, ip));
            } else if let Some(e) = &p.exec {
                r.checks.push(exec_check(join, e));
            }
        }
        None => {
            for p in c.ports.iter().flatten().filter(|p| p.protocol.as_deref().unwrap_or("TCP") == "TCP") {
                if let Ok(port) = u16::try_from(p.container_port) {
                    r.checks.push(Check::Tcp(SocketAddr::new(ip, port)));
                }
            }
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::{command_line, container_env};
    use k8s_openapi::api::core::v1 as core;

    struct Objs;
    impl crate::volumes::Objects for Objs {
        fn secret(&self, _: &str, name: &str) -> Option<core::Secret> {
            (name == "db")
                .then(|| serde_json::from_value(serde_json::json!({"data": {"password": "czNjcmV0"}})).unwrap())
        }
        fn config_map(&self, _: &str, name: &str) -> Option<core::ConfigMap> {
            (name == "cfg")
                .then(|| serde_json::from_value(serde_json::json!({"data": {"MODE": "fast", "LEVEL": "3"}})).unwrap())
        }
        fn token(&self) -> Option<String> {
            None
        }
    }

    #[test]
    fn env_from_objects_fields_and_references_in_order() {
        let pod: core::Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "web"}}}),
        )
        .unwrap();
        let c: core::Container = serde_json::from_value(serde_json::json!({"name": "c",
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}],
        "env": [
            {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "MODE"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "URL", "value": "http://$(SVC_HOST):80/$(MODE)"},
            {"name": "GONE", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": true}}},
        ]}))
        .unwrap();
        let base = vec![("SVC_HOST".to_string(), "10.96.0.7".to_string())];
        let env = container_env(&pod, &c, "10.244.1.2", "node-1", "192.168.56.11", &base, Some(&Objs)).unwrap();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("CFG_MODE"), Some("fast"));
        assert_eq!(get("CFG_LEVEL"), Some("3"));
        assert_eq!(get("PASSWORD"), Some("s3cret"));
        assert_eq!(get("APP"), Some("web"));
        assert_eq!(get("URL"), Some("http://10.96.0.7:80/fast"));
        assert_eq!(get("GONE"), None);
        let bad: core::Container = serde_json::from_value(serde_json::json!({"name": "c",
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "user"}}}]}))
        .unwrap();
        let e = container_env(&pod, &bad, "", "", "", &[], Some(&Objs)).unwrap_err();
        assert_eq!(e, "couldn't find key user in Secret ns/db");
        let bad: core::Container = serde_json::from_value(serde_json::json!({"name": "c",
            "envFrom": [{"secretRef": {"name": "missing"}}]}))
        .unwrap();
        assert_eq!(
            container_env(&pod, &bad, "", "", "", &[], Some(&Objs)).unwrap_err(),
            "secret \"missing\" not found"
        );
    }

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn base_images_without_an_entrypoint_run_their_args_or_their_shell() {
        // `kubectl run x --image=busybox -- sleep 3600`: args only.
        assert_eq!(command_line("busybox:1.36", vec![], v(&["sleep", "3600"])), (v(&["sleep", "3600"]), vec![]));
        assert_eq!(command_line("docker.io/library/alpine", vec![], vec![]), (v(&["/bin/sh"]), vec![]));
        assert_eq!(command_line("ubuntu:24.04", vec![], vec![]), (v(&["bash"]), vec![]));
        // A command keeps its args; other images are left as they are (and refused later).
        assert_eq!(command_line("busybox", v(&["sh", "-c"]), v(&["true"])), (v(&["sh", "-c"]), v(&["true"])));
        assert_eq!(command_line("nginx", vec![], v(&["-g"])), (vec![], v(&["-g"])));
        assert_eq!(command_line("podpath/echo", vec![], v(&["--x"])), (vec![], v(&["--x"])));
    }
}
