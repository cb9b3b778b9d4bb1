//! A container of an image as an OCI runtime bundle: the runtime spec (`config.json`) made,
//! purely, from the pod, the container and the image's config — what containerd's CRI plugin
//! writes for runc. The container joins its sandbox's network, UTS and IPC namespaces (and its
//! PID namespace with `shareProcessNamespace`) and gets mount and PID namespaces of its own; the pod's `/etc/resolv.conf`, `/etc/hosts` and
//! `/etc/hostname` are bind-mounted over the image's.

use std::path::{Path, PathBuf};

use image::ImageConfig;
use k8s_openapi::api::core::v1 as core;
use serde_json::{json, Value};

/// The process a container runs: Kubernetes' `command`/`args` over the image's
/// `Entrypoint`/`Cmd` (a `command` replaces both; `args` alone replace `Cmd`).
pub fn process_args(c: &core::Container, image: &ImageConfig) -> Vec<String> {
    let command = c.command.clone().unwrap_or_default();
    let args = c.args.clone().unwrap_or_default();
    match (command.is_empty(), args.is_empty()) {
        (false, _) => command.into_iter().chain(args).collect(),
        (true, false) => image.entrypoint.iter().cloned().chain(args).collect(),
        (true, true) => image.entrypoint.iter().chain(image.cmd.iter()).cloned().collect(),
    }
}

/// The container's environment: the image's, then the given variables (Service links, then the
/// container's `env`), a later one replacing an earlier of the same name, as the runtime merges.
pub fn process_env(image: &ImageConfig, hostname: &str, vars: &[(String, String)]) -> Vec<String> {
    let mut env: Vec<(String, String)> = vec![];
    let mut set = |k: &str, v: &str| match env.iter_mut().find(|(n, _)| n == k) {
        Some(slot) => slot.1 = v.to_string(),
        None => env.push((k.to_string(), v.to_string())),
    };
    set("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    for kv in &image.env {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        set(k, v);
    }
    set("HOSTNAME", hostname);
    for (k, v) in vars {
        set(k, v);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// A user as the image or the security context gives it: numbers, or names looked up in the
/// image's `/etc/passwd` and `/etc/group` (`lookup` reads a file of the image).
pub fn resolve_user(
    image_user: Option<&str>,
    sc: Option<&core::SecurityContext>,
    pod_sc: Option<&core::PodSecurityContext>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(u32, u32), String> {
    let find = |file: &str, name: &str| -> Option<(u32, u32)> {
        let text = lookup(file)?;
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name) && f.len() > 3)
                .then(|| (f[2].parse().ok(), f[3].parse().ok()))
                .and_then(|(a, b)| Some((a?, b.unwrap_or(0))))
        })
    };
    let (mut uid, mut gid) = (0u32, 0u32);
    if let Some(u) = image_user.filter(|u| !u.is_empty()) {
        let (user, group) = u.split_once(':').map_or((u, None), |(a, b)| (a, Some(b)));
        match user.parse::<u32>() {
            Ok(n) => {
                uid = n;
                // A numeric user's primary group is its passwd entry's, or 0.
                gid = lookup("/etc/passwd")
                    .and_then(|t| {
                        t.lines().find_map(|l| {
                            let f: Vec<&str> = l.split(':').collect();
                            (f.len() > 3 && f[2] == user).then(|| f[3].parse().ok()).flatten()
                        })
                    })
                    .unwrap_or(0);
            }
            Err(_) => {
                (uid, gid) = find("/etc/passwd", user)
                    .ok_or_else(|| format!("unable to find user {user}: no matching entries in passwd file"))?;
            }
        }
        if let Some(g) = group {
            gid = match g.parse::<u32>() {
                Ok(n) => n,
                Err(_) => find("/etc/group", g)
                    .map(|(id, _)| id)
                    .ok_or_else(|| format!("unable to find group {g}: no matching entries in group file"))?,
            };
        }
    }
    let run_as_user = sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user));
    let run_as_group = sc.and_then(|s| s.run_as_group).or(pod_sc.and_then(|s| s.run_as_group));
    if let Some(u) = run_as_user {
        uid = u32::try_from(u).map_err(|_| format!("runAsUser {u} is out of range"))?;
    }
    if let Some(g) = run_as_group {
        gid = u32::try_from(g).map_err(|_| format!("runAsGroup {g} is out of range"))?;
    }
    let non_root = sc.and_then(|s| s.run_as_non_root).or(pod_sc.and_then(|s| s.run_as_non_root)) == Some(true);
    if non_root && uid == 0 {
        return Err("container has runAsNonRoot and image will run as root".into());
    }
    Ok((uid, gid))
}

/// Docker's and containerd's default capabilities.
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// Every capability, for `privileged` (the kernel's list as of Linux 5.9).
const ALL_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The capability set: the defaults, `add`ed and `drop`ped (`ALL` works in both), or all.
pub fn capabilities(sc: Option<&core::SecurityContext>) -> Vec<String> {
    if sc.and_then(|s| s.privileged) == Some(true) {
        return ALL_CAPS.iter().map(|c| c.to_string()).collect();
    }
    let norm = |c: &String| {
        let u = c.to_ascii_uppercase();
        if u.starts_with("CAP_") {
            u
        } else {
            format!("CAP_{u}")
        }
    };
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let add: Vec<String> = caps.and_then(|c| c.add.as_ref()).map(|a| a.iter().map(norm).collect()).unwrap_or_default();
    let drop: Vec<String> =
        caps.and_then(|c| c.drop.as_ref()).map(|a| a.iter().map(norm).collect()).unwrap_or_default();
    let mut out: Vec<String> = if add.iter().any(|c| c == "CAP_ALL") {
        ALL_CAPS.iter().map(|c| c.to_string()).collect()
    } else {
        DEFAULT_CAPS.iter().map(|c| c.to_string()).chain(add).collect()
    };
    if drop.iter().any(|c| c == "CAP_ALL") {
        out.clear();
    }
    out.retain(|c| !drop.contains(c));
    out.dedup();
    out
}

/// A bind mount into the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    pub destination: String,
    pub read_only: bool,
}

/// What the runtime spec is made of.
pub struct SpecInput<'a> {
    pub pod: &'a core::Pod,
    pub container: &'a core::Container,
    pub image: &'a ImageConfig,
    /// The sandbox's PID: its namespaces are joined by path.
    pub sandbox_pid: i32,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub user: (u32, u32),
    pub cwd: String,
    /// The pod's files and volumes.
    pub binds: Vec<Bind>,
    /// A memory-backed `/dev/shm` size in bytes.
    pub shm_bytes: u64,
    /// RLIMIT_NOFILE (soft, hard): the node's own (crun, without it, tries to raise the limit
    /// past what it may).
    pub nofile: (u64, u64),
    /// An ephemeral container's target: the PID namespace (`/proc/PID/ns/pid`) it joins, so
    /// `kubectl debug --target` sees the target's processes.
    pub pid_namespace: Option<String>,
}

/// The OCI runtime spec (`config.json`) of a container.
pub fn runtime_spec(i: &SpecInput) -> Value {
    let sc = i.container.security_context.as_ref();
    let caps = capabilities(sc);
    let privileged = sc.and_then(|s| s.privileged) == Some(true);
    let ns = |kind: &str| json!({"type": kind, "path": format!("/proc/{}/ns/{}", i.sandbox_pid, if kind == "network" { "net" } else { kind })});
    // A PID namespace of the container's own, or with `shareProcessNamespace` the one the
    // sandbox made for its children (its first child, the pod's `pause`, is PID 1 there).
    let pid = match (&i.pid_namespace, i.pod.spec.as_ref().and_then(|s| s.share_process_namespace)) {
        (Some(path), _) => json!({"type": "pid", "path": path}),
        (None, Some(true)) => json!({"type": "pid", "path": format!("/proc/{}/ns/pid_for_children", i.sandbox_pid)}),
        _ => json!({"type": "pid"}),
    };
    let namespaces = vec![ns("network"), ns("uts"), ns("ipc"), json!({"type": "mount"}), pid];
    let mut mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm", "options": ["nosuid", "noexec", "nodev", "mode=1777", format!("size={}", i.shm_bytes)]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", if privileged { "rw" } else { "ro" }]}),
    ];
    for b in &i.binds {
        let mut options = vec!["rbind", "rprivate"];
        if b.read_only {
            options.push("ro");
        }
        mounts.push(json!({"destination": b.destination, "type": "bind", "source": b.source, "options": options}));
    }
    let read_only_root = sc.and_then(|s| s.read_only_root_filesystem) == Some(true);
    let mut linux = json!({
        "namespaces": namespaces,
        "maskedPaths": if privileged { json!([]) } else { json!([
            "/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list",
            "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap"
        ]) },
        "readonlyPaths": if privileged { json!([]) } else { json!([
            "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"
        ]) },
    });
    if let Some(sysctls) =
        i.pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.sysctls.as_ref())
    {
        linux["sysctl"] = sysctls
            .iter()
            .map(|s| (s.name.clone(), Value::String(s.value.clone())))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": i.user.0, "gid": i.user.1, "additionalGids": [i.user.1]},
            "args": i.args,
            "env": i.env,
            "cwd": i.cwd,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "soft": i.nofile.0, "hard": i.nofile.1}],
            "noNewPrivileges": sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        },
        "root": {"path": "rootfs", "readonly": read_only_root},
        "mounts": mounts,
        "linux": linux,
    })
}

/// The working directory: the container's, the image's, or `/`.
pub fn working_dir(c: &core::Container, image: &ImageConfig) -> String {
    c.working_dir.clone().filter(|w| !w.is_empty()).or_else(|| image.working_dir.clone()).unwrap_or_else(|| "/".into())
}

/// Reads a file of an image from its layers (the top one first), honouring whiteouts, without
/// following a symbolic link out of the layer: for `/etc/passwd` lookups before the container
/// exists.
pub fn read_image_file(layers_top_first: &[PathBuf], path: &str) -> Option<String> {
    let rel = Path::new(path.trim_start_matches('/'));
    for layer in layers_top_first {
        let p = layer.join(rel);
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() => return std::fs::read_to_string(&p).ok(),
            Ok(_) => return None, // a whiteout (a device), a link or a directory: not a plain file
            Err(_) => continue,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctr(yaml: &str) -> core::Container {
        serde_json::from_value(serde_json::from_str::<Value>(yaml).unwrap()).unwrap()
    }

    fn img(entrypoint: &[&str], cmd: &[&str]) -> ImageConfig {
        ImageConfig {
            entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            env: vec!["PATH=/img/bin".into(), "NGINX_VERSION=1.22".into()],
            ..Default::default()
        }
    }

    #[test]
    fn command_and_args_over_entrypoint_and_cmd() {
        let i = img(&["/docker-entrypoint.sh"], &["nginx", "-g", "daemon off;"]);
        let a = |c: &str| process_args(&ctr(c), &i);
        assert_eq!(a(r#"{"name":"c"}"#), ["/docker-entrypoint.sh", "nginx", "-g", "daemon off;"]);
        assert_eq!(a(r#"{"name":"c","args":["-v"]}"#), ["/docker-entrypoint.sh", "-v"]);
        assert_eq!(a(r#"{"name":"c","command":["sleep"]}"#), ["sleep"]);
        assert_eq!(a(r#"{"name":"c","command":["sleep"],"args":["9"]}"#), ["sleep", "9"]);
    }

    #[test]
    fn environment_image_first_then_links_then_env() {
        let env = process_env(
            &img(&[], &[]),
            "web-0",
            &[("KUBERNETES_SERVICE_HOST".into(), "10.96.0.1".into()), ("NGINX_VERSION".into(), "mine".into())],
        );
        assert_eq!(env, ["PATH=/img/bin", "NGINX_VERSION=mine", "HOSTNAME=web-0", "KUBERNETES_SERVICE_HOST=10.96.0.1"]);
    }

    #[test]
    fn users_by_number_or_name() {
        let files = |f: &str| match f {
            "/etc/passwd" => Some("root:x:0:0::/root:/bin/sh\nnginx:x:101:102::/:/bin/false\n".to_string()),
            "/etc/group" => Some("root:x:0:\nwww:x:33:\n".to_string()),
            _ => None,
        };
        assert_eq!(resolve_user(None, None, None, &files), Ok((0, 0)));
        assert_eq!(resolve_user(Some("nginx"), None, None, &files), Ok((101, 102)));
        assert_eq!(resolve_user(Some("101"), None, None, &files), Ok((101, 102)));
        assert_eq!(resolve_user(Some("1000:www"), None, None, &files), Ok((1000, 33)));
        assert!(resolve_user(Some("nobody"), None, None, &files).unwrap_err().contains("unable to find user nobody"));
        let sc: core::SecurityContext = serde_json::from_str(r#"{"runAsUser":5,"runAsGroup":6}"#).unwrap();
        assert_eq!(resolve_user(Some("nginx"), Some(&sc), None, &files), Ok((5, 6)));
        let nr: core::SecurityContext = serde_json::from_str(r#"{"runAsNonRoot":true}"#).unwrap();
        assert!(resolve_user(None, Some(&nr), None, &files).unwrap_err().contains("runAsNonRoot"));
    }

    #[test]
    fn capabilities_are_the_defaults_added_and_dropped() {
        assert_eq!(capabilities(None).len(), 14);
        let sc: core::SecurityContext =
            serde_json::from_str(r#"{"capabilities":{"add":["NET_ADMIN"],"drop":["KILL"]}}"#).unwrap();
        let c = capabilities(Some(&sc));
        assert!(c.contains(&"CAP_NET_ADMIN".to_string()) && !c.contains(&"CAP_KILL".to_string()));
        let none: core::SecurityContext =
            serde_json::from_str(r#"{"capabilities":{"drop":["ALL"],"add":["NET_BIND_SERVICE"]}}"#).unwrap();
        assert!(capabilities(Some(&none)).is_empty());
    }

    #[test]
    fn the_spec_joins_the_sandbox_and_parses_as_an_oci_runtime_spec() {
        let pod: core::Pod = serde_json::from_str(r#"{"metadata":{"name":"p"},"spec":{"containers":[]}}"#).unwrap();
        let c = ctr(r#"{"name":"c","securityContext":{"readOnlyRootFilesystem":true}}"#);
        let i = img(&["sh"], &[]);
        let spec = runtime_spec(&SpecInput {
            pod: &pod,
            container: &c,
            image: &i,
            sandbox_pid: 42,
            args: vec!["sh".into()],
            env: vec!["A=1".into()],
            user: (0, 0),
            cwd: "/".into(),
            binds: vec![Bind {
                source: "/x/resolv.conf".into(),
                destination: "/etc/resolv.conf".into(),
                read_only: false,
            }],
            shm_bytes: 64 << 20,
            nofile: (1024, 4096),
            pid_namespace: None,
        });
        assert_eq!(spec["linux"]["namespaces"][0], json!({"type": "network", "path": "/proc/42/ns/net"}));
        assert_eq!(spec["linux"]["namespaces"][4], json!({"type": "pid"}));
        assert_eq!(spec["root"]["readonly"], json!(true));
        assert_eq!(spec["mounts"][6]["destination"], json!("/etc/resolv.conf"));
        assert!(spec.get("hostname").is_none(), "the UTS namespace is the sandbox's: its hostname stays");
        // shareProcessNamespace: the PID namespace the sandbox made for its children.
        let shared: core::Pod =
            serde_json::from_str(r#"{"spec":{"shareProcessNamespace":true,"containers":[]}}"#).unwrap();
        let spec = runtime_spec(&SpecInput {
            pod: &shared,
            container: &c,
            image: &i,
            sandbox_pid: 42,
            args: vec!["sh".into()],
            env: vec![],
            user: (0, 0),
            cwd: "/".into(),
            binds: vec![],
            shm_bytes: 64 << 20,
            nofile: (1024, 4096),
            pid_namespace: None,
        });
        assert_eq!(spec["linux"]["namespaces"][4], json!({"type": "pid", "path": "/proc/42/ns/pid_for_children"}));
    }
}
