//! The Vagrantfile without VMs: its machines as Vagrant's own loader sees them
//! ([`load_machines`], through `vagrant/test/machines.rb`), a pure check of the topology they
//! form ([`check_topology`]), and [`NetnsVagrant`], a small `vagrant up` that makes every machine
//! a network namespace with a chroot of a Debian root filesystem and runs the Vagrantfile's own
//! provisioners in it: the same scripts, arguments, environment and uploads as on the VMs.
//!
//! Each machine also gets Vagrant's management network (`eth0`, 192.168.121.0/24, as
//! vagrant-libvirt's default) and, with [`NetnsVagrant::start_sshd`], an sshd on it: what `podpath
//! … --vagrant` reaches the machines through, with an SSH configuration like `vagrant ssh-config`'s.
//!
//! What this does not cover (the TCG `vagrant up` in `vagrant/test/libvirt-up.sh` does): systemd
//! units (the script falls back to background processes), Vagrant's guest network setup and its
//! `ssh-config`, provider settings, the guest kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// One machine of the Vagrantfile.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Machine {
    pub name: String,
    /// Whether a bare `vagrant up` brings it up (the builder only comes when named).
    #[serde(default = "yes")]
    pub autostart: bool,
    pub hostname: Option<String>,
    pub networks: Vec<Network>,
    pub synced_folders: Vec<SyncedFolder>,
    pub provisioners: Vec<Provisioner>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Network {
    pub ip: Option<String>,
    pub netmask: Option<String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SyncedFolder {
    pub guest: String,
    pub host: String,
    pub disabled: bool,
}

/// A provisioner step; `type` is `shell` or `file` (others are reported by the topology check).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Provisioner {
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub path: Option<PathBuf>,
    pub inline: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub source: Option<PathBuf>,
    pub destination: Option<String>,
}

fn yes() -> bool {
    true
}

/// The repository's root (where the Vagrantfile is).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Loads the machines of the Vagrantfile in `dir` with Vagrant's loader; `env` are settings
/// overrides (`LAB_NODES`, …). Needs Debian's `vagrant` package, no provider and no box.
pub fn load_machines(dir: &Path, env: &[(&str, &str)]) -> Result<Vec<Machine>> {
    load_machines_for(dir, env, &[])
}

/// [`load_machines`] as the Vagrantfile sees them for the command `vagrant ARGS` (its checks
/// and the files it makes for that command, e.g. the builder's source archive for `up builder`).
pub fn load_machines_for(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Result<Vec<Machine>> {
    let out = Command::new("ruby")
        .arg(dir.join("vagrant/test/machines.rb"))
        .arg(dir)
        .arg("--")
        .args(args)
        .envs(env.iter().copied())
        .env("VAGRANT_NO_PLUGINS", "1")
        .output()
        .context("run ruby (Debian's vagrant package brings it)")?;
    if !out.status.success() {
        bail!("vagrant/test/machines.rb: {}", String::from_utf8_lossy(&out.stderr));
    }
    serde_json::from_slice(&out.stdout).context("machines.rb printed no JSON")
}

/// A subnet of the address plan the machines' addresses must fall in.
#[derive(Debug, Clone, Copy)]
pub struct Subnet {
    pub network: Ipv4Addr,
    pub prefix: u8,
    /// Addresses no machine may take (e.g. the one the hypervisor gives the host).
    pub reserved: &'static [Ipv4Addr],
}

impl Subnet {
    fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
        u32::from(ip) & mask == u32::from(self.network)
    }
    fn is_edge(&self, ip: Ipv4Addr) -> bool {
        let host_bits = u32::MAX >> self.prefix;
        let h = u32::from(ip) & host_bits;
        h == 0 || h == host_bits
    }
}

/// Problems of the topology the machines form (empty: fine): every machine has a hostname and
/// every lab machine (one `vagrant up` starts) at least one private network; addresses are valid, unique, inside one of `subnets` with its mask,
/// neither network nor broadcast address nor reserved; a machine has at most one address per
/// subnet; every shell script and uploaded file exists; only shell and file provisioners.
pub fn check_topology(machines: &[Machine], subnets: &[Subnet]) -> Vec<String> {
    let mut problems = vec![];
    let mut owners: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
    let mut hostnames = BTreeSet::new();
    for m in machines {
        let name = m.name.as_str();
        match m.hostname.as_deref() {
            None | Some("") => problems.push(format!("{name}: no hostname")),
            Some(h) if !hostnames.insert(h) => problems.push(format!("{name}: hostname {h} is taken")),
            Some(_) => {}
        }
        if m.networks.is_empty() && m.autostart {
            problems.push(format!("{name}: no private network"));
        }
        let mut used_subnets = BTreeSet::new();
        for n in &m.networks {
            let Some(ip) = n.ip.as_deref() else {
                problems.push(format!("{name}: a private network without a static IP"));
                continue;
            };
            let Ok(addr) = ip.parse::<Ipv4Addr>() else {
                problems.push(format!("{name}: {ip:?} is not an IPv4 address"));
                continue;
            };
            let Some((i, subnet)) = subnets.iter().enumerate().find(|(_, s)| s.contains(addr)) else {
                problems.push(format!("{name}: {ip} is outside the lab's subnets"));
                continue;
            };
            let mask = Ipv4Addr::from(u32::MAX.checked_shl(32 - u32::from(subnet.prefix)).unwrap_or(0));
            if n.netmask.as_deref() != Some(mask.to_string().as_str()) {
                problems.push(format!("{name}: {ip} has netmask {:?}, the plan says {mask}", n.netmask));
            }
            if subnet.is_edge(addr) || subnet.reserved.contains(&addr) {
                problems.push(format!("{name}: {ip} is reserved in {}/{}", subnet.network, subnet.prefix));
            }
            if !used_subnets.insert(i) {
                problems.push(format!("{name}: two addresses in {}/{}", subnet.network, subnet.prefix));
            }
            if let Some(other) = owners.insert(addr, name) {
                problems.push(format!("{name}: {ip} is also {other}'s"));
            }
        }
        for p in &m.provisioners {
            let what = format!("{name}: {} provisioner {}", p.kind, p.name.as_deref().unwrap_or("(unnamed)"));
            match p.kind.as_str() {
                "shell" => match (&p.path, &p.inline) {
                    (Some(path), _) if !is_executable(path) => {
                        problems.push(format!("{what}: {} is missing or not executable", path.display()))
                    }
                    (None, None) => problems.push(format!("{what}: neither path nor inline")),
                    _ => {}
                },
                "file" => match (&p.source, &p.destination) {
                    (Some(src), Some(_)) if !src.is_file() => {
                        problems.push(format!("{what}: {} does not exist", src.display()))
                    }
                    (Some(_), Some(_)) => {}
                    _ => problems.push(format!("{what}: needs a source and a destination")),
                },
                other => problems.push(format!("{what}: the harness runs shell and file provisioners, not {other}")),
            }
        }
    }
    problems
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Builds (once; later calls reuse it) the Debian root filesystem the machines get, with
/// `vagrant/test/rootfs.sh`: a few minutes and the Debian archive the first time.
pub fn ensure_rootfs(dir: &Path) -> Result<PathBuf> {
    let status = Command::new(repo_root().join("vagrant/test/rootfs.sh")).arg(dir).status()?;
    if !status.success() {
        bail!("vagrant/test/rootfs.sh {} failed", dir.display());
    }
    Ok(dir.to_path_buf())
}

/// Runs a command; (success, stdout + stderr).
fn sh(argv: &[&str]) -> (bool, String) {
    match Command::new(argv[0]).args(&argv[1..]).output() {
        Ok(o) => {
            (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
        }
        Err(e) => (false, format!("cannot run {}: {e}", argv[0])),
    }
}

fn must(argv: &[&str]) -> Result<String> {
    match sh(argv) {
        (true, out) => Ok(out),
        (false, out) => bail!("{}: {out}", argv.join(" ")),
    }
}

/// A booted machine: its namespace and the root of its chroot.
#[derive(Debug)]
pub struct Booted {
    pub machine: Machine,
    pub netns: String,
    pub root: PathBuf,
}

/// The Vagrantfile's machines as namespaces + chroots (see the module doc). Dropping it stops the
/// services the provisioners started (by the PIDs in their pid files) and the pods of the node
/// agents, deletes the namespaces and unmounts the overlays: exactly what it made.
pub struct NetnsVagrant {
    /// Prefix of every namespace it made (unique per test).
    pub prefix: String,
    pub machines: Vec<Booted>,
    /// The "host" end of the node network (the address the hypervisor gives the host, e.g.
    /// 192.168.56.1), a namespace of its own: where kubectl runs as from the user's machine.
    pub host_netns: Option<String>,
    switch: String,
    namespaces: Vec<String>,
    mounts: Vec<PathBuf>,
    /// The machines' sshd processes ([`NetnsVagrant::start_sshd`]).
    sshd: std::sync::Mutex<Vec<std::process::Child>>,
    work: tempfile::TempDir,
}

/// The management network's address of the `k`-th machine (the host is .1).
fn management_ip(k: usize) -> String {
    format!("192.168.121.{}", 10 + k)
}

/// Commands run in a machine get this PATH and nothing else from the caller, like a fresh VM.
const GUEST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl NetnsVagrant {
    /// Creates the machines (no provisioning yet): a switch namespace with one bridge per /24,
    /// a namespace per machine with `eth1`, `eth2`… carrying its addresses (`eth0` is Vagrant's
    /// management NIC, which this harness has no need for), an overlay of `rootfs` with /proc and
    /// /dev, and, with `host_ip`, a host namespace on the bridge of that address's /24.
    pub fn create(machines: &[Machine], rootfs: &Path, prefix: &str, host_ip: Option<&str>) -> Result<NetnsVagrant> {
        let work = tempfile::Builder::new().prefix("podpath-vagrant-").tempdir()?;
        let mut lab = NetnsVagrant {
            prefix: prefix.to_string(),
            machines: vec![],
            host_netns: None,
            switch: format!("{prefix}-switch"),
            namespaces: vec![],
            mounts: vec![],
            sshd: Default::default(),
            work,
        };
        lab.add_netns(&lab.switch.clone())?;
        let mut bridges: BTreeMap<String, String> = BTreeMap::new();
        let mut links = 0;
        for m in machines {
            let netns = format!("{prefix}-{}", m.name);
            lab.add_netns(&netns)?;
            links += 1;
            lab.plug(&mut bridges, &netns, "eth0", &format!("p{links}"), &management_ip(lab.machines.len()))?;
            for (k, n) in m.networks.iter().enumerate() {
                let ip = n.ip.as_deref().context("a private network without an IP")?;
                links += 1;
                lab.plug(&mut bridges, &netns, &format!("eth{}", k + 1), &format!("p{links}"), ip)?;
            }
            let root = lab.work.path().join(&m.name);
            lab.mount_overlay(rootfs, &root)?;
            // The VM's own disk for podpath's state: pods' containers are overlays of image
            // layers, whose upper directory cannot be on the machine's overlay root.
            let disk = root.join("disk");
            let state = root.join("merged/var/lib/podpath");
            std::fs::create_dir_all(&disk)?;
            std::fs::create_dir_all(&state)?;
            must(&["mount", "--bind", &disk.to_string_lossy(), &state.to_string_lossy()])?;
            lab.mounts.push(state);
            let hostname = m.hostname.clone().unwrap_or_else(|| m.name.clone());
            std::fs::write(root.join("merged/etc/hostname"), format!("{hostname}\n"))?;
            lab.machines.push(Booted { machine: m.clone(), netns, root: root.join("merged") });
        }
        if let Some(ip) = host_ip {
            let netns = format!("{prefix}-host");
            lab.add_netns(&netns)?;
            lab.plug(&mut bridges, &netns, "eth1", "phost", ip)?;
            lab.plug(&mut bridges, &netns, "eth0", "pmgmt", "192.168.121.1")?;
            lab.host_netns = Some(netns);
        }
        Ok(lab)
    }

    fn add_netns(&mut self, name: &str) -> Result<()> {
        must(&["ip", "netns", "add", name])?;
        self.namespaces.push(name.to_string());
        must(&["ip", "-n", name, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// A veth from `netns` (as `dev`, with `ip`/24) to the bridge of that /24 in the switch
    /// namespace; the pair is made inside the switch namespace, never in the host's.
    fn plug(&self, bridges: &mut BTreeMap<String, String>, netns: &str, dev: &str, peer: &str, ip: &str) -> Result<()> {
        let subnet = ip.rsplit_once('.').map(|(net, _)| net.to_string()).context("IPv4 address")?;
        let n = bridges.len();
        let br = bridges.entry(subnet).or_insert_with(|| format!("br{n}")).clone();
        if must(&["ip", "-n", &self.switch, "-o", "link", "show"])?.lines().all(|l| !l.contains(&format!(": {br}:"))) {
            must(&["ip", "-n", &self.switch, "link", "add", &br, "type", "bridge"])?;
            must(&["ip", "-n", &self.switch, "link", "set", &br, "up"])?;
        }
        must(&["ip", "-n", &self.switch, "link", "add", peer, "type", "veth", "peer", "name", dev, "netns", netns])?;
        must(&["ip", "-n", &self.switch, "link", "set", peer, "master", &br, "up"])?;
        must(&["ip", "-n", netns, "addr", "add", &format!("{ip}/24"), "dev", dev])?;
        must(&["ip", "-n", netns, "link", "set", dev, "up"])?;
        Ok(())
    }

    fn mount_overlay(&mut self, rootfs: &Path, dir: &Path) -> Result<()> {
        let merged = dir.join("merged");
        self.overlay(rootfs, dir, &merged)?;
        must(&["mount", "-t", "proc", "proc", &merged.join("proc").to_string_lossy()])?;
        self.mounts.push(merged.join("proc"));
        must(&["mount", "--bind", "/dev", &merged.join("dev").to_string_lossy()])?;
        self.mounts.push(merged.join("dev"));
        // A VM has /sys: the pods' containers mount their cgroup view under it.
        must(&["mount", "--bind", "/sys", &merged.join("sys").to_string_lossy()])?;
        self.mounts.push(merged.join("sys"));
        Ok(())
    }

    /// An overlay of `lower` at `at`, its writable layer in `layer` (`upper`, `work`).
    fn overlay(&mut self, lower: &Path, layer: &Path, at: &Path) -> Result<()> {
        for d in [layer.join("upper"), layer.join("work"), at.to_path_buf()] {
            std::fs::create_dir_all(d)?;
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            layer.join("upper").display(),
            layer.join("work").display()
        );
        must(&["mount", "-t", "overlay", "overlay", "-o", &opts, &at.to_string_lossy()])?;
        self.mounts.push(at.to_path_buf());
        Ok(())
    }

    /// Shows the host's directory `lower` at `guest` inside machine `name`, through an overlay:
    /// the machine sees its contents and writes to its own layer, never to `lower` (how the
    /// builder's test gives a machine the host's toolchain and cargo caches).
    pub fn overlay_host_dir(&mut self, name: &str, lower: &Path, guest: &str) -> Result<()> {
        let at = self.machine(name).root.join(guest.trim_start_matches('/'));
        let layer = self.work.path().join(format!("{name}-layer-{}", self.mounts.len()));
        self.overlay(lower, &layer, &at)
    }

    pub fn machine(&self, name: &str) -> &Booted {
        self.machines.iter().find(|b| b.machine.name == name).unwrap_or_else(|| panic!("no machine {name}"))
    }

    /// Runs every provisioner of `name` in order, as `vagrant provision NAME` does; the combined
    /// output, or an error naming the step that failed.
    pub fn provision(&self, name: &str) -> Result<String> {
        self.provision_machine(&self.machine(name).machine)
    }

    /// Runs the provisioners of `m` on the machine of that name (`m` may differ from the
    /// Vagrantfile's, e.g. a changed setting).
    pub fn provision_machine(&self, m: &Machine) -> Result<String> {
        let name = m.name.as_str();
        let b = self.machine(name);
        let mut log = String::new();
        for (i, p) in m.provisioners.iter().enumerate() {
            let step = format!("{name}: provisioner {} ({})", p.name.as_deref().unwrap_or(&i.to_string()), p.kind);
            match p.kind.as_str() {
                "file" => {
                    let (src, dst) =
                        (p.source.as_ref().context("source")?, p.destination.as_ref().context("destination")?);
                    let to = b.root.join(dst.trim_start_matches('/'));
                    std::fs::create_dir_all(to.parent().context("destination directory")?)?;
                    std::fs::copy(src, &to).with_context(|| format!("{step}: upload {}", src.display()))?;
                }
                "shell" => {
                    // Vagrant uploads the script to /tmp/vagrant-shell and runs it with args and env.
                    let script = match (&p.path, &p.inline) {
                        (Some(path), _) => {
                            std::fs::read(path).with_context(|| format!("{step}: read {}", path.display()))?
                        }
                        (None, Some(inline)) => inline.clone().into_bytes(),
                        (None, None) => bail!("{step}: neither path nor inline"),
                    };
                    std::fs::write(b.root.join("tmp/vagrant-shell"), script)?;
                    let env: Vec<String> = p.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    let mut argv: Vec<&str> = vec!["env", "-i", "HOME=/root"];
                    let path_var = format!("PATH={GUEST_PATH}");
                    argv.push(&path_var);
                    argv.extend(env.iter().map(String::as_str));
                    argv.extend(["bash", "/tmp/vagrant-shell"]);
                    argv.extend(p.args.iter().map(String::as_str));
                    let (ok, out) = self.exec(name, &argv);
                    log += &out;
                    if !ok {
                        bail!("{step} failed:\n{out}");
                    }
                }
                other => bail!("{step}: unsupported provisioner type {other}"),
            }
        }
        Ok(log)
    }

    /// Runs `argv` on machine `name`: in its namespace, a UTS namespace carrying its hostname,
    /// chrooted into its filesystem. (success, stdout + stderr).
    pub fn exec(&self, name: &str, argv: &[&str]) -> (bool, String) {
        let b = self.machine(name);
        let hostname = b.machine.hostname.clone().unwrap_or_else(|| b.machine.name.clone());
        let root = b.root.to_string_lossy().into_owned();
        let mut full = vec!["ip", "netns", "exec", &b.netns, "unshare", "--uts", "--", "chroot", &root];
        full.extend(["/bin/sh", "-c", "hostname \"$0\" && exec \"$@\"", &hostname]);
        full.extend_from_slice(argv);
        sh(&full)
    }

    /// Starts an sshd on every machine's management address (root's key: a new one, made here)
    /// and returns the SSH configuration that reaches them by name, as `vagrant ssh-config`
    /// prints for VMs (its file; the key is next to it). For the host namespace.
    pub fn start_sshd(&self) -> Result<PathBuf> {
        let key = self.work.path().join("id_ed25519");
        must(&["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "podpath-harness", "-f", &key.to_string_lossy()])?;
        let public = std::fs::read_to_string(key.with_extension("pub"))?;
        let mut config = String::new();
        for (k, b) in self.machines.iter().enumerate() {
            use std::os::unix::fs::PermissionsExt;
            let ssh = b.root.join("root/.ssh");
            std::fs::create_dir_all(&ssh)?;
            std::fs::set_permissions(&ssh, std::fs::Permissions::from_mode(0o700))?;
            std::fs::write(ssh.join("authorized_keys"), &public)?;
            std::fs::create_dir_all(b.root.join("run/sshd"))?;
            if let (false, out) = self.exec(&b.machine.name, &["ssh-keygen", "-A"]) {
                bail!("host keys on {}: {out}", b.machine.name);
            }
            let ip = management_ip(k);
            let hostname = b.machine.hostname.clone().unwrap_or_else(|| b.machine.name.clone());
            let log = std::fs::File::create(self.work.path().join(format!("sshd-{}.log", b.machine.name)))?;
            let child = Command::new("ip")
                .args(["netns", "exec", &b.netns, "unshare", "--uts", "--", "chroot"])
                .arg(&b.root)
                .args(["/bin/sh", "-c", "hostname \"$0\" && exec /usr/sbin/sshd -D -e \"$@\"", &hostname])
                .args(["-o", &format!("ListenAddress={ip}"), "-o", "PermitRootLogin=prohibit-password"])
                .args(["-o", "UsePAM=no", "-o", "PidFile=none"])
                .env_clear()
                .env("PATH", GUEST_PATH)
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("start sshd")?;
            self.sshd.lock().expect("sshd list").push(child);
            config += &format!(
                "Host {}\n  HostName {ip}\n  User root\n  Port 22\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
                 StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n\n",
                b.machine.name,
                key.display()
            );
        }
        let file = self.work.path().join("ssh-config");
        std::fs::write(&file, config)?;
        // Until every sshd listens (ssh from the host namespace answers).
        let netns = self.host_netns.clone().context("start_sshd needs the host namespace")?;
        let t = Instant::now();
        for b in &self.machines {
            loop {
                let cfg = file.to_string_lossy();
                let (ok, out) = sh(&[
                    "ip",
                    "netns",
                    "exec",
                    &netns,
                    "ssh",
                    "-F",
                    &cfg,
                    "-o",
                    "BatchMode=yes",
                    &b.machine.name,
                    "true",
                ]);
                if ok {
                    break;
                }
                if t.elapsed() > Duration::from_secs(20) {
                    bail!("sshd on {} does not answer: {out}", b.machine.name);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(file)
    }

    /// Runs `argv` (host binaries, host filesystem) in the host namespace on the node network.
    pub fn host_exec(&self, argv: &[&str]) -> (bool, String) {
        let netns = self.host_netns.as_deref().expect("created with a host address");
        let mut full = vec!["ip", "netns", "exec", netns];
        full.extend_from_slice(argv);
        sh(&full)
    }

    /// The services the provisioners started: (machine, service, pid), from their pid files.
    pub fn services(&self) -> Vec<(String, String, i32)> {
        let mut out = vec![];
        for b in &self.machines {
            let Ok(dir) = std::fs::read_dir(b.root.join("run/podpath")) else { continue };
            for e in dir.flatten() {
                let file = e.file_name().to_string_lossy().into_owned();
                let Some(service) = file.strip_suffix(".pid") else { continue };
                if let Some(pid) = std::fs::read_to_string(e.path()).ok().and_then(|s| s.trim().parse().ok()) {
                    out.push((b.machine.name.clone(), service.to_string(), pid));
                }
            }
        }
        out.sort();
        out
    }

    /// PIDs of every process whose root directory is inside this harness's machines.
    pub fn processes_inside(&self) -> Vec<i32> {
        processes_rooted_in(self.work.path())
    }

    fn teardown(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        for mut c in self.sshd.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let services = self.services();
        for (_, _, pid) in &services {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) && services.iter().any(|(_, _, p)| alive(*p)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        for (_, _, pid) in services.iter().filter(|(_, _, p)| alive(*p)) {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        // The pods the node agents ran (sandboxes and workloads), as `podpath down` does.
        for b in &self.machines {
            crate::kill_pods(&b.root.join("var/lib/podpath/node"));
        }
        // What is left in the machines: the sessions of a multiplexed SSH connection outlive
        // their sshd (their client may keep the connection open for a while).
        let left = processes_rooted_in(self.work.path());
        for pid in &left {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) && left.iter().any(|p| alive(*p)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        for ns in self.namespaces.iter().rev() {
            let _ = sh(&["ip", "netns", "del", ns]);
        }
        for m in self.mounts.iter().rev() {
            let p = m.to_string_lossy();
            if !sh(&["umount", &p]).0 {
                let _ = sh(&["umount", "-l", &p]);
            }
        }
        self.mounts.clear();
        self.namespaces.clear();
    }
}

/// Whether process `pid` runs (a zombie has exited: it only waits for its parent).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

/// PIDs of live processes whose root directory is under `dir`.
pub fn processes_rooted_in(dir: &Path) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return vec![] };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()))
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r.starts_with(dir)) && alive(*pid))
        .collect()
}

impl Drop for NetnsVagrant {
    fn drop(&mut self) {
        self.teardown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: Subnet =
        Subnet { network: Ipv4Addr::new(192, 168, 56, 0), prefix: 24, reserved: &[Ipv4Addr::new(192, 168, 56, 1)] };
    const CLIENTS: Subnet = Subnet { network: Ipv4Addr::new(203, 0, 113, 0), prefix: 24, reserved: &[] };

    fn machine(name: &str, ips: &[&str]) -> Machine {
        Machine {
            name: name.into(),
            hostname: Some(name.into()),
            networks: ips
                .iter()
                .map(|ip| Network { ip: Some(ip.to_string()), netmask: Some("255.255.255.0".into()) })
                .collect(),
            synced_folders: vec![],
            provisioners: vec![],
            autostart: true,
        }
    }

    #[test]
    fn a_sound_topology_has_no_problems() {
        let ms = [machine("cp", &["192.168.56.10"]), machine("gw", &["192.168.56.2", "203.0.113.1"])];
        assert_eq!(check_topology(&ms, &[NODES, CLIENTS]), Vec::<String>::new());
    }

    #[test]
    fn every_kind_of_mistake_is_named() {
        let mut bad_mask = machine("m5", &["203.0.113.5"]);
        bad_mask.networks[0].netmask = None;
        let mut no_script = machine("m6", &["203.0.113.6"]);
        no_script.provisioners.push(Provisioner {
            name: Some("setup".into()),
            kind: "shell".into(),
            path: Some("/nonexistent/provision.sh".into()),
            inline: None,
            args: vec![],
            env: BTreeMap::new(),
            source: None,
            destination: None,
        });
        let mut no_binary = machine("m7", &["203.0.113.7"]);
        no_binary.provisioners.push(Provisioner {
            name: None,
            kind: "file".into(),
            path: None,
            inline: None,
            args: vec![],
            env: BTreeMap::new(),
            source: Some("/nonexistent/node-agent".into()),
            destination: Some("/tmp/x".into()),
        });
        let ms = [
            machine("m1", &["192.168.56.10"]),
            machine("m2", &["192.168.56.10"]),
            machine("m3", &["192.168.56.300", "10.0.0.1", "192.168.56.255"]),
            machine("m4", &["192.168.56.20", "192.168.56.21"]),
            bad_mask,
            no_script,
            no_binary,
            machine("m8", &["192.168.56.1"]),
        ];
        let problems = check_topology(&ms, &[NODES, CLIENTS]).join("\n");
        for want in [
            "m2: 192.168.56.10 is also m1's",
            "m3: \"192.168.56.300\" is not an IPv4 address",
            "m3: 10.0.0.1 is outside the lab's subnets",
            "m3: 192.168.56.255 is reserved",
            "m8: 192.168.56.1 is reserved",
            "m4: two addresses in 192.168.56.0/24",
            "m5: 203.0.113.5 has netmask None",
            "m6: shell provisioner setup: /nonexistent/provision.sh is missing",
            "m7: file provisioner (unnamed): /nonexistent/node-agent does not exist",
        ] {
            assert!(problems.contains(want), "{want:?} not in:\n{problems}");
        }
        assert_eq!(problems.lines().count(), 9, "{problems}");
    }
}
