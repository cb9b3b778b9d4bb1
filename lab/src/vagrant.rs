//! The lab's tools on the Vagrant lab (`podpath … --vagrant [DIR]`): the same cluster on VMs,
//! reached as `vagrant ssh` reaches them — over SSH with the configuration `vagrant ssh-config`
//! prints, commands run with `sudo` — and its API with the kubeconfig the Vagrantfile made
//! (`.vagrant/podpath/`). What runs where follows `vagrant/provision.sh`: the components are
//! systemd units `podpath-*` (or, on a machine without systemd, processes with pid files in
//! `/run/podpath/`), the lab's NIC is the one with the machine's 192.168.56.x address (the
//! first NIC is Vagrant's management network, which SSH uses, so a fault on the lab's NIC
//! never cuts the tool off its machine).
//!
//! The parsers and the remote scripts are pure; [`VagrantLab::run`] is the one place commands
//! leave this machine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::state::ApiAccess;
use crate::{io, LabError, Result};

/// Where the Vagrantfile keeps the lab's credentials for the checkout in `dir`: Vagrant's data
/// directory (`VAGRANT_DOTFILE_PATH`, default `.vagrant`) + `podpath`.
pub fn credentials_dir(dir: &Path) -> PathBuf {
    let dot = std::env::var_os("VAGRANT_DOTFILE_PATH").map(PathBuf::from).unwrap_or_else(|| ".vagrant".into());
    dir.join(dot).join("podpath")
}

/// The `Host` names of an SSH configuration, in order (`vagrant ssh-config` prints one block
/// per running machine).
pub fn ssh_hosts(config: &str) -> Vec<String> {
    config
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let (key, rest) = l.split_once(char::is_whitespace)?;
            key.eq_ignore_ascii_case("host").then(|| rest.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        })
        .flatten()
        .filter(|h| !h.contains(['*', '?']))
        .collect()
}

/// The lab machine the Vagrantfile defines besides the lab's own: it compiles podpath for hosts
/// that cannot, and is never part of the cluster (`vagrant up builder`).
pub const BUILDER: &str = "builder";

/// The lab's running machines in `vagrant status --machine-readable` output
/// (`TIME,NAME,state,running` lines), in its order; the builder is not one of them. Pure.
pub fn running_machines(status: &str) -> Vec<String> {
    status
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.trim().splitn(4, ',').collect();
            (f.len() == 4 && f[2] == "state" && f[3] == "running" && f[1] != BUILDER).then(|| f[1].to_string())
        })
        .collect()
}

/// `arg` quoted for a POSIX shell (what sshd hands the remote command to).
pub fn shell_quote(arg: &str) -> String {
    if !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=@,+%".contains(&b)) {
        return arg.to_string();
    }
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// The remote command line that runs `argv` as root (`sudo -n`: never a password prompt).
pub fn remote_command(argv: &[String]) -> String {
    let mut out = String::from("sudo -n --");
    for a in argv {
        out.push(' ');
        out.push_str(&shell_quote(a));
    }
    out
}

/// Prints `UNIT MAINPID STATE` for each `podpath-*` component of a machine, from systemd or
/// from the pid files `provision.sh` writes where there is none.
pub const SERVICES_SCRIPT: &str = r#"if [ -d /run/systemd/system ]; then
  for u in $(systemctl list-units --plain --no-legend --all 'podpath-*.service' | awk '{print $1}'); do
    echo "$u $(systemctl show -p MainPID --value "$u") $(systemctl is-active "$u")"
  done
else
  for f in /run/podpath/*.pid; do
    [ -e "$f" ] || continue
    p=$(cat "$f")
    if kill -0 "$p" 2>/dev/null; then s=active; else s=inactive; fi
    echo "podpath-$(basename "$f" .pid).service $p $s"
  done
fi"#;

/// One component of a machine, from [`SERVICES_SCRIPT`]'s output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// `apiserver-lite`, `node-agent`, `lb-sim`.
    pub name: String,
    pub pid: u32,
    pub active: bool,
}

/// Parses [`SERVICES_SCRIPT`]'s output; `podpath-net` (a oneshot that sets sysctls and routes,
/// no process) is left out.
pub fn parse_services(out: &str) -> Vec<Service> {
    out.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?.strip_prefix("podpath-")?.strip_suffix(".service")?.to_string();
            let pid = f.next()?.parse().ok()?;
            let active = f.next()? == "active";
            (name != "net").then_some(Service { name, pid, active })
        })
        .collect()
}

/// The node agent's `--state-dir` on a VM (`vagrant/provision.sh`).
pub const AGENT_STATE_DIR: &str = "/var/lib/podpath/node";

/// `node stop` on a VM node, as on the namespace lab: the agent stops (systemd, or the process
/// of its pid file), then its pods' processes (`node-agent --kill-pods`, as `podpath down`).
pub const STOP_NODE_SCRIPT: &str = r#"if [ -d /run/systemd/system ]; then
  systemctl stop podpath-node-agent
elif [ -f /run/podpath/node-agent.pid ]; then
  p=$(cat /run/podpath/node-agent.pid)
  kill "$p" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
fi
/usr/local/bin/node-agent --kill-pods --state-dir /var/lib/podpath/node"#;

/// `node start` on a VM node: the agent again, with the command line provisioning gave it.
pub const START_NODE_SCRIPT: &str = r#"if [ -d /run/systemd/system ]; then
  systemctl start podpath-node-agent
else
  p=$(cat /run/podpath/node-agent.pid 2>/dev/null || true)
  if [ -z "$p" ] || ! kill -0 "$p" 2>/dev/null; then
    eval "setsid $(cat /etc/podpath/node-agent.cmdline) >>/var/log/podpath/node-agent.log 2>&1 </dev/null &"
    echo $! >/run/podpath/node-agent.pid
  fi
fi"#;

/// Prints the name of the interface that carries `ip` (the lab's NIC of a machine).
pub fn nic_script(ip: &str) -> String {
    format!("ip -o -4 addr show | awk -v ip={} '$4 ~ \"^\"ip\"/\" {{print $2; exit}}' | grep .", shell_quote(ip))
}

/// The lab's address of a machine (the Vagrantfile's plan: node-N is 192.168.56.(10+N)).
pub fn lab_ip(machine: &str) -> Option<String> {
    match machine {
        "control-plane" => Some("192.168.56.10".into()),
        "gateway" => Some("192.168.56.2".into()),
        "client" => Some("203.0.113.10".into()),
        m => {
            let n: u8 = m.strip_prefix("node-")?.parse().ok()?;
            (1..=9).contains(&n).then(|| format!("192.168.56.{}", 10 + n))
        }
    }
}

/// A running Vagrant lab, as the tools reach it.
pub struct VagrantLab {
    pub dir: PathBuf,
    pub credentials: PathBuf,
    ssh_config: PathBuf,
    /// The machines `vagrant ssh-config` knows (running ones), in its order.
    pub machines: Vec<String>,
}

impl VagrantLab {
    /// The lab of the Vagrantfile in `dir`. The SSH configuration comes from `vagrant
    /// ssh-config` there (or the file in `PODPATH_VAGRANT_SSH_CONFIG`, for machines that are
    /// not Vagrant's: the project's namespace harness).
    pub fn open(dir: &Path) -> Result<VagrantLab> {
        if !dir.join("Vagrantfile").is_file() {
            return Err(LabError::Usage(format!(
                "no Vagrantfile in {}: --vagrant takes the directory of podpath's Vagrantfile",
                dir.display()
            )));
        }
        let credentials = credentials_dir(dir);
        if !credentials.join("kubeconfig").is_file() {
            return Err(LabError::Usage(format!(
                "no Vagrant lab in {}: {} is missing (run `vagrant up` there first)",
                dir.display(),
                credentials.join("kubeconfig").display()
            )));
        }
        let ssh_config = match std::env::var_os("PODPATH_VAGRANT_SSH_CONFIG") {
            Some(f) => PathBuf::from(f),
            None => {
                // The running machines only: `vagrant ssh-config` fails as a whole on any other
                // (the builder, never brought up by `vagrant up`; a halted node).
                let status = Command::new("vagrant")
                    .args(["status", "--machine-readable"])
                    .current_dir(dir)
                    .output()
                    .map_err(io("run `vagrant status` (is Vagrant installed?)"))?;
                let running = running_machines(&String::from_utf8_lossy(&status.stdout));
                if running.is_empty() {
                    return Err(LabError::NotReady(format!(
                        "no machine of the Vagrant lab in {} is running (`vagrant status`; `vagrant up` starts them)",
                        dir.display()
                    )));
                }
                let out = Command::new("vagrant")
                    .arg("ssh-config")
                    .args(&running)
                    .current_dir(dir)
                    .output()
                    .map_err(io("run `vagrant ssh-config` (is Vagrant installed?)"))?;
                if !out.status.success() {
                    let err = String::from_utf8_lossy(&out.stderr);
                    let first = err.lines().find(|l| !l.trim().is_empty()).unwrap_or("no output");
                    return Err(LabError::NotReady(format!(
                        "`vagrant ssh-config` in {} failed (are the machines up? `vagrant status`): {first}",
                        dir.display()
                    )));
                }
                let f = credentials.join("ssh-config");
                std::fs::write(&f, &out.stdout).map_err(io(format!("write {}", f.display())))?;
                f
            }
        };
        let text = std::fs::read_to_string(&ssh_config).map_err(io(format!("read {}", ssh_config.display())))?;
        let machines: Vec<String> = ssh_hosts(&text).into_iter().filter(|m| m != BUILDER).collect();
        if machines.is_empty() {
            return Err(LabError::NotReady(format!("no machine in {}", ssh_config.display())));
        }
        Ok(VagrantLab { dir: dir.to_path_buf(), credentials, ssh_config, machines })
    }

    /// The API with the lab's kubeconfig: its server, the lab CA and the token.
    pub fn api(&self) -> Result<ApiAccess> {
        let read = |f: &str| {
            let p = self.credentials.join(f);
            std::fs::read_to_string(&p).map_err(io(format!("read {}", p.display())))
        };
        let kubeconfig = read("kubeconfig")?;
        let server = kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .ok_or_else(|| LabError::Usage(format!("no server in {}/kubeconfig", self.credentials.display())))?;
        ApiAccess::to_server(server.trim(), Some(&read("ca.crt")?), Some(&read("token")?))
    }

    /// Checks that `machine` is one of the lab's running machines.
    pub fn machine<'a>(&self, machine: &'a str) -> Result<&'a str> {
        if self.machines.iter().any(|m| m == machine) {
            Ok(machine)
        } else {
            Err(LabError::Usage(format!(
                "no running machine {machine:?} in the Vagrant lab in {} (running: {})",
                self.dir.display(),
                self.machines.join(", ")
            )))
        }
    }

    /// The argv that runs `cmd` as root on `machine` over SSH (`-t`: with a terminal, for an
    /// interactive command).
    pub fn ssh_argv(&self, machine: &str, cmd: &[String], tty: bool) -> Result<Vec<String>> {
        let machine = self.machine(machine)?;
        let mut argv: Vec<String> = ["ssh", "-F"].map(String::from).to_vec();
        argv.push(self.ssh_config.display().to_string());
        for o in ["BatchMode=yes", "ConnectTimeout=10", "LogLevel=ERROR"] {
            argv.extend(["-o".to_string(), o.to_string()]);
        }
        // One connection per machine, shared by the many short commands of a trace or a
        // status (a new SSH handshake each would cost tens of milliseconds); it closes 30 s
        // after its last use. %C hashes user, host and port: a short socket path.
        let socket = std::env::temp_dir().join("podpath-ssh-%C");
        for o in
            ["ControlMaster=auto".to_string(), format!("ControlPath={}", socket.display()), "ControlPersist=30s".into()]
        {
            argv.extend(["-o".to_string(), o]);
        }
        if tty {
            argv.push("-t".into());
        }
        argv.extend([machine.to_string(), "--".into(), remote_command(cmd)]);
        Ok(argv)
    }

    /// Runs `cmd` as root on `machine`: its output, or an error naming both with the stderr.
    pub fn run(&self, machine: &str, cmd: &[&str]) -> Result<String> {
        let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        let argv = self.ssh_argv(machine, &cmd, false)?;
        let out = Command::new(&argv[0]).args(&argv[1..]).output().map_err(io("run ssh"))?;
        if !out.status.success() {
            return Err(LabError::Command {
                cmd: format!("{machine}: {}", cmd.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `cmd` as root on `machine` with `input` on its standard input: its output.
    pub fn run_input(&self, machine: &str, cmd: &[&str], input: &[u8]) -> Result<String> {
        use std::io::Write;
        let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        let argv = self.ssh_argv(machine, &cmd, false)?;
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(io("run ssh"))?;
        let written = child.stdin.take().map(|mut s| s.write_all(input));
        let out = child.wait_with_output().map_err(io("run ssh"))?;
        if !out.status.success() || matches!(written, Some(Err(_))) {
            return Err(LabError::Command {
                cmd: format!("{machine}: {}", cmd.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `cmd` as root on `machine` with the file `input` on its standard input (streamed,
    /// not read into memory): its output.
    pub fn run_file_input(&self, machine: &str, cmd: &[&str], input: &Path) -> Result<String> {
        let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
        let argv = self.ssh_argv(machine, &cmd, false)?;
        let file = std::fs::File::open(input).map_err(io(format!("open {}", input.display())))?;
        let out = Command::new(&argv[0]).args(&argv[1..]).stdin(file).output().map_err(io("run ssh"))?;
        if !out.status.success() {
            return Err(LabError::Command {
                cmd: format!("{machine}: {}", cmd.join(" ")),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The components of every machine, in the machines' order.
    pub fn services(&self) -> Vec<(String, Result<Vec<Service>>)> {
        std::thread::scope(|s| {
            let jobs: Vec<_> = self
                .machines
                .iter()
                .map(|m| {
                    (
                        m.clone(),
                        s.spawn(move || self.run(m, &["sh", "-c", SERVICES_SCRIPT]).map(|o| parse_services(&o))),
                    )
                })
                .collect();
            jobs.into_iter()
                .map(|(m, j)| {
                    (m, j.join().unwrap_or_else(|_| Err(LabError::NotReady("a helper thread panicked".into()))))
                })
                .collect()
        })
    }

    /// The lab's NIC of `machine` (the interface with its 192.168.56.x address).
    pub fn lab_nic(&self, machine: &str) -> Result<String> {
        let ip = lab_ip(machine).ok_or_else(|| LabError::Usage(format!("{machine:?} is not a machine of the lab")))?;
        Ok(self.run(machine, &["sh", "-c", &nic_script(&ip)])?.trim().to_string())
    }

    /// The node's proxy rules, as `podpath rules` shows them on the namespace lab: the
    /// iptables mode's `nat` and `filter` chains, or the table `ip kube-proxy` when the node
    /// has one (the nftables mode).
    pub fn proxy_rules(&self, node: &str) -> Result<Vec<String>> {
        if let Ok(text) = self.run(node, &["nft", "list", "table", "ip", "kube-proxy"]) {
            return Ok(podpath_ruleset::nft::Listing::parse(&text)
                .lines()
                .into_iter()
                .map(|l| format!("nft {l}"))
                .collect());
        }
        let mut out = vec![];
        for table in ["nat", "filter"] {
            let save = self.run(node, &["iptables-save", "-t", table])?;
            out.extend(crate::rules::proxy_rules(table, &save));
        }
        Ok(out)
    }

    /// [`VagrantLab::proxy_rules`] of every node, read in parallel.
    pub fn all_proxy_rules(&self) -> Result<BTreeMap<String, Vec<String>>> {
        self.per_node(|node| self.proxy_rules(node))
    }

    /// Whether the nodes run kube-proxy's nftables mode (the first node has its table).
    pub fn nftables(&self) -> Result<bool> {
        let first =
            self.nodes().into_iter().next().ok_or_else(|| LabError::NotReady("no node machine is running".into()))?;
        Ok(self.node_nftables(&first))
    }

    /// Whether `node` runs kube-proxy's nftables mode (it has the mode's table; each node is
    /// provisioned with its own setting).
    pub fn node_nftables(&self, node: &str) -> bool {
        self.run(node, &["nft", "list", "table", "ip", "kube-proxy"]).is_ok()
    }

    /// Every node's `iptables-save` (`ip6tables-save` with `v6`) of `tables`, read in parallel.
    pub fn node_tables(&self, tables: &[&str], v6: bool) -> Result<crate::inspect::NodeTables> {
        let tool = if v6 { "ip6tables-save" } else { "iptables-save" };
        self.per_node(|node| {
            tables.iter().map(|t| self.run(node, &[tool, "-t", t]).map(|save| (t.to_string(), save))).collect()
        })
    }

    /// Every node's table `ip kube-proxy` (`ip6` with `v6`), read in parallel.
    pub fn nft_listings(&self, v6: bool) -> Result<BTreeMap<String, podpath_ruleset::nft::Listing>> {
        let family = if v6 { "ip6" } else { "ip" };
        self.per_node(|node| {
            // No table yet (a node that has not synced): an empty listing, as on namespace labs.
            let text = self.run(node, &["nft", "list", "table", family, "kube-proxy"]).unwrap_or_default();
            Ok(podpath_ruleset::nft::Listing::parse(&text))
        })
    }

    /// `f` on every node at once: node → its result.
    pub fn per_node<T: Send>(&self, f: impl Fn(&str) -> Result<T> + Sync) -> Result<BTreeMap<String, T>> {
        let f = &f;
        std::thread::scope(|s| {
            let jobs: Vec<_> = self.nodes().into_iter().map(|n| s.spawn(move || f(&n).map(|t| (n, t)))).collect();
            jobs.into_iter()
                .map(|j| j.join().unwrap_or_else(|_| Err(LabError::NotReady("a helper thread panicked".into()))))
                .collect()
        })
    }

    /// The nodes among the running machines.
    pub fn nodes(&self) -> Vec<String> {
        self.machines.iter().filter(|m| m.starts_with("node-")).cloned().collect()
    }
}

/// A VM node's image store and its image service's socket (vagrant/provision.sh).
pub const NODE_IMAGE_STORE: &str = "/var/lib/podpath/images";
pub const NODE_IMAGE_SOCKET: &str = "/run/podpath/images.sock";

/// `podpath image ARGS…` on every node VM at once (each node has its own store, as each
/// kubelet's containerd has), with the host's file `input` copied to the VM for it (`load`'s
/// archive: ARGS name it as `{}`). Each node's output or error, by node.
pub fn image_on_nodes(
    v: &VagrantLab,
    args: &[String],
    input: Option<&Path>,
) -> Result<BTreeMap<String, std::result::Result<String, String>>> {
    let mut cmd = vec![
        "podpath".to_string(),
        "image".into(),
        "--store".into(),
        NODE_IMAGE_STORE.into(),
        "--socket".into(),
        NODE_IMAGE_SOCKET.into(),
    ];
    cmd.extend(args.iter().cloned());
    v.per_node(|node| {
        let out = match input {
            // The archive goes to a file of its own on the VM, removed whatever happens.
            Some(file) => {
                let line: Vec<String> =
                    cmd.iter().map(|a| if a == "{}" { "\"$f\"".to_string() } else { shell_quote(a) }).collect();
                let script = format!("f=$(mktemp) && trap 'rm -f \"$f\"' EXIT && cat >\"$f\" && {}", line.join(" "));
                v.run_file_input(node, &["sh", "-c", &script], file)
            }
            None => v.run(node, &cmd.iter().map(String::as_str).collect::<Vec<_>>()),
        };
        Ok(out.map_err(|e| match e {
            LabError::Command { stderr, .. } => stderr,
            other => other.to_string(),
        }))
    })
}

/// Where a VM node's agent keeps its pod records (`--state-dir` in vagrant/provision.sh).
pub const NODE_POD_RECORDS: &str = "/var/lib/podpath/node/pods";

/// The process of a pod's first container on its VM node (its namespaces are the pod's): the
/// process itself, or a container of an image's init process, read from the node's files.
pub fn container_process(v: &VagrantLab, pod: &serde_json::Value) -> Result<String> {
    let node = pod["spec"]["nodeName"].as_str().unwrap_or_default();
    crate::hosts::container_process(pod, Path::new(NODE_POD_RECORDS), |p| {
        v.run(node, &["cat", &p.display().to_string()]).ok()
    })
}

/// A pod's node and its first container's process.
pub fn pod_process(v: &VagrantLab, ns: &str, name: &str) -> Result<(String, String)> {
    let pod = crate::hosts::get_pod(&v.api()?, ns, name)?;
    let node = pod["spec"]["nodeName"].as_str().unwrap_or_default().to_string();
    Ok((node, container_process(v, &pod)?))
}

/// The argv that enters a pod on its node: `nsenter` into the namespaces of the pod's first
/// container's process.
pub fn pod_exec(v: &VagrantLab, ns: &str, name: &str, cmd: &[String]) -> Result<(String, Vec<String>)> {
    let (node, pid) = pod_process(v, ns, name)?;
    let mut argv: Vec<String> = ["nsenter", "-t", &pid, "-n", "-u", "-m", "-r", "--"].map(String::from).to_vec();
    argv.extend(cmd.iter().cloned());
    Ok((node, argv))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_are_the_hosts_of_vagrants_ssh_config() {
        let cfg = "Host control-plane\n  HostName 192.168.121.10\n  User vagrant\n  Port 22\n\nHost node-1\n  HostName 192.168.121.11\nHost *\n  LogLevel ERROR\n";
        assert_eq!(ssh_hosts(cfg), ["control-plane", "node-1"]);
    }

    #[test]
    fn the_running_machines_are_read_from_vagrant_status_without_the_builder() {
        let status = "1764300000,control-plane,metadata,provider,libvirt\n\
                      1764300000,control-plane,state,running\n\
                      1764300000,control-plane,state-human-short,running\n\
                      1764300000,node-1,state,shutoff\n\
                      1764300000,node-2,state,running\n\
                      1764300000,builder,state,running\n\
                      1764300000,client,state,not_created\n\
                      1764300000,,ui,info,Current machine states:\n";
        assert_eq!(running_machines(status), ["control-plane", "node-2"]);
        assert!(running_machines("").is_empty());
    }

    #[test]
    fn remote_commands_are_quoted_for_the_remote_shell() {
        let argv: Vec<String> =
            ["curl", "-sS", "http://198.51.100.1/", "a b", "it's", "$(id)", ""].map(String::from).to_vec();
        assert_eq!(remote_command(&argv), r#"sudo -n -- curl -sS http://198.51.100.1/ 'a b' 'it'\''s' '$(id)' ''"#);
        // The shell gives back exactly the arguments.
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!("printf '%s\\n' {}", &remote_command(&argv)[11..]))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), argv.join("\n") + "\n");
    }

    #[test]
    fn services_come_from_systemd_or_pid_files_and_the_oneshot_is_left_out() {
        let out = "podpath-net.service 0 active\npodpath-node-agent.service 812 active\npodpath-lb-sim.service 0 inactive\nnoise\n";
        assert_eq!(
            parse_services(out),
            [
                Service { name: "node-agent".into(), pid: 812, active: true },
                Service { name: "lb-sim".into(), pid: 0, active: false }
            ]
        );
        assert_eq!(lab_ip("node-3").as_deref(), Some("192.168.56.13"));
        assert_eq!(lab_ip("node-10"), None);
        assert_eq!(lab_ip("gateway").as_deref(), Some("192.168.56.2"));
    }

    #[test]
    fn a_directory_without_a_vagrant_lab_is_named() {
        let d = tempfile::tempdir().unwrap();
        let e = VagrantLab::open(d.path()).err().unwrap().to_string();
        assert!(e.contains("no Vagrantfile in"), "{e}");
        std::fs::write(d.path().join("Vagrantfile"), "").unwrap();
        let e = VagrantLab::open(d.path()).err().unwrap().to_string();
        assert!(e.contains("no Vagrant lab in") && e.contains("vagrant up"), "{e}");
    }
}
