//! The Vagrant lab without VMs: Vagrant validates the Vagrantfile under both providers, the
//! machines it defines follow the all-in-one lab's address plan, the scripts pass shellcheck,
//! and the Vagrantfile's own provisioners, run in namespaces with chroots of a Debian root
//! filesystem, bring up a lab whose LoadBalancer Service answers the client.
//!
//! Needs Debian's `vagrant` (with its Ruby), `shellcheck` and `debootstrap` packages; the
//! namespace test needs root and, the first time, the Debian archive (the root filesystem is
//! kept in `target/vagrant-rootfs`). The real `vagrant up` on VMs is `vagrant/test/libvirt-up.sh`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use podpath_e2e::vagrant::{self, check_topology, load_machines, repo_root, NetnsVagrant, Subnet};
use podpath_e2e::{bin, text, wait_for};
use testkit::registry::{busybox, Registry};

const NODE_NET: Subnet = Subnet {
    network: Ipv4Addr::new(192, 168, 56, 0),
    prefix: 24,
    // The hypervisor's address for the host on the host-only network.
    reserved: &[Ipv4Addr::new(192, 168, 56, 1)],
};
const CLIENT_NET: Subnet = Subnet {
    network: Ipv4Addr::new(203, 0, 113, 0),
    prefix: 24,
    // What the Vagrantfile gives the host on libvirt's client network.
    reserved: &[Ipv4Addr::new(203, 0, 113, 254)],
};

/// The directory of the workspace's binaries (the Vagrantfile's `bin_dir` in these tests).
fn bin_dir() -> String {
    bin("node-agent").parent().expect("bin dir").display().to_string()
}

/// `vagrant ARGS` in the repository with private Vagrant state; (success, output).
fn vagrant(args: &[&str], env: &[(&str, &str)], home: &Path) -> (bool, String) {
    let out = Command::new("vagrant")
        .args(args)
        .current_dir(repo_root())
        .env("VAGRANT_HOME", home.join("home"))
        .env("VAGRANT_DOTFILE_PATH", home.join("dotfile"))
        .env("VAGRANT_CHECKPOINT_DISABLE", "1")
        .env_remove("VAGRANT_DEFAULT_PROVIDER")
        .envs(env.iter().copied())
        .output()
        .expect("run vagrant (apt-get install vagrant)");
    let (o, e) = text(&out);
    (out.status.success(), format!("{o}{e}"))
}

#[test]
fn vagrantfile_validates_under_both_providers_and_refuses_bad_settings() {
    let home = tempfile::tempdir().unwrap();
    let dir = bin_dir();
    let bins = [("LAB_BIN_DIR", dir.as_str())];
    let (ok, out) = vagrant(&["validate", "-p"], &bins, home.path());
    assert!(ok && out.contains("validated successfully"), "{out}");
    // With the builder's source archive made (`vagrant up builder` makes it), its upload is one
    // of the provisioners validated too.
    let dotfile = home.path().join("dotfile");
    let with_archive = [("LAB_BIN_DIR", dir.as_str()), ("VAGRANT_DOTFILE_PATH", dotfile.to_str().unwrap())];
    vagrant::load_machines_for(&repo_root(), &with_archive, &["up", "builder"]).unwrap();
    assert!(dotfile.join("podpath/source.tar.gz").is_file());
    // The provider blocks are only checked for the active provider: libvirt (Debian's
    // vagrant-libvirt), then VirtualBox through a stand-in VBoxManage.
    let (ok, out) = vagrant(&["validate"], &bins, home.path());
    assert!(ok, "libvirt: {out}");
    let stub = home.path().join("stub");
    std::fs::create_dir_all(&stub).unwrap();
    std::fs::write(stub.join("VBoxManage"), "#!/bin/sh\necho 7.0.14r161095\n").unwrap();
    std::fs::set_permissions(stub.join("VBoxManage"), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", stub.display(), std::env::var("PATH").unwrap_or_default());
    let (ok, out) = vagrant(
        &["validate"],
        &[("LAB_BIN_DIR", &dir), ("PATH", &path), ("VAGRANT_DEFAULT_PROVIDER", "virtualbox")],
        home.path(),
    );
    assert!(ok, "virtualbox: {out}");

    let (ok, out) = vagrant(&["status", "--machine-readable"], &[("LAB_NODES", "1")], home.path());
    assert!(ok, "{out}");
    let states: Vec<&str> = out.lines().filter(|l| l.contains(",state,")).filter_map(|l| l.split(',').nth(1)).collect();
    assert_eq!(states, ["control-plane", "node-1", "gateway", "client", "builder"]);

    // Bad settings: one line that names the setting, and nothing created.
    for (env, want) in [
        (("LAB_NODES", "12"), "podpath: nodes is \"12\": expected a whole number from 1 to 9"),
        (("LAB_PROXY_MODE", "ipvs"), "podpath: proxy_mode is \"ipvs\": expected iptables, nftables or userspace"),
        (("LAB_LB_MODE", "l7"), "podpath: lb_mode is \"l7\": expected passthrough or nodeport"),
        (
            ("LAB_NFTABLES_LAYOUT", "flat"),
            "podpath: nftables_layout is \"flat\": expected current, v1.36, v1.34, shared-maps",
        ),
        (("LAB_MEMORY", "lots"), "podpath: memory of control-plane is \"lots\""),
        (("LAB_LIBVIRT_DRIVER", "xen"), "podpath: libvirt_driver is \"xen\": expected kvm or qemu"),
        (
            ("LAB_REGISTRY_MIRRORS", "docker.io=http://10.0.0.5:5000 10.0.0.5:5000"),
            "podpath: registry_mirrors has \"10.0.0.5:5000\": expected REGISTRY=URL, e.g. docker.io=http://",
        ),
        (("LAB_HOST_PROGRAMS", "yes"), "podpath: host_programs is \"yes\": expected true or false"),
        (("LAB_BOOT_TIMEOUT", "5"), "podpath: boot_timeout is \"5\": expected a whole number from 10 to 7200"),
    ] {
        let (ok, out) = vagrant(&["validate", "-p"], &[env], home.path());
        assert!(!ok && out.contains(want), "{env:?}: {out}");
    }
    // A machine that never boots (or stops while booting), through the hooks Vagrant applies
    // around `up`: one podpath line naming it and the way on, instead of Vagrant's screenful.
    let out = Command::new("ruby")
        .arg(repo_root().join("vagrant/test/boot-watch.rb"))
        .arg(repo_root())
        .env("VAGRANT_HOME", home.path().join("home"))
        .env("VAGRANT_DOTFILE_PATH", home.path().join("dotfile"))
        .env("VAGRANT_CHECKPOINT_DISABLE", "1")
        .output()
        .unwrap();
    let (out, err) = text(&out);
    let out = out + &err;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "timeout: PodpathLab::Failure: podpath: node-2 did not boot within 42 s (boot_timeout; a slow or busy \
             host needs more). The machines that came up are kept: `vagrant up` again goes on from here; `vagrant \
             destroy -f node-2` starts that machine afresh",
            "stopped: PodpathLab::Failure: podpath: node-2 stopped while booting (its console log says why). The \
             machines that came up are kept: `vagrant up` again goes on from here; `vagrant destroy -f node-2` \
             starts that machine afresh",
            "booted: booted=true",
        ],
        "{out}"
    );
    let settings = home.path().join("settings.yaml");
    std::fs::write(&settings, "nodes: 2\nbox: ''\n").unwrap();
    let (ok, out) = vagrant(&["validate", "-p"], &[("LAB_SETTINGS", settings.to_str().unwrap())], home.path());
    assert!(!ok && out.contains("podpath: proxy_mode is nil"), "{out}");
    let fresh = tempfile::tempdir().unwrap();
    let (ok, out) = vagrant(&["up", "--no-provision"], &[("LAB_BIN_DIR", "/nonexistent")], fresh.path());
    assert!(!ok && out.contains("missing in /nonexistent: run `cargo build --release` first"), "{out}");
    // Binaries the box cannot run: one line naming the file, what it is and what to build.
    let bad = home.path().join("bad-bins");
    std::fs::create_dir_all(&bad).unwrap();
    for b in [
        "apiserver-lite",
        "podpath",
        "node-agent",
        "podpath-workload",
        "podpath-dns",
        "podpath-bridge",
        "podpath-ipam",
        "podpath-images",
        "lb-sim",
    ] {
        std::fs::copy(bin(b), bad.join(b)).unwrap();
    }
    let bad_dir = bad.to_str().unwrap();
    let (ok, out) =
        vagrant(&["up", "--no-provision"], &[("LAB_BIN_DIR", bad_dir), ("LAB_BOX_ARCH", "arm64")], fresh.path());
    assert!(!ok && out.contains("is built for x86-64, but the box debian/bookworm64 is arm64 (box_arch)"), "{out}");
    assert!(out.contains("--target aarch64-unknown-linux-gnu"), "{out}");
    std::fs::write(bad.join("lb-sim"), b"\xcf\xfa\xed\xfe\x07\x00\x00\x01 a Mach-O binary").unwrap();
    let (ok, out) = vagrant(&["up", "--no-provision"], &[("LAB_BIN_DIR", bad_dir)], fresh.path());
    assert!(!ok && out.contains("lb-sim is not a Linux binary (built on macOS or Windows?)"), "{out}");
    // A provider that cannot run here: one line before anything is made.
    let (ok, out) =
        vagrant(&["up", "--provider=libvirt"], &[("LAB_BIN_DIR", &dir), ("VAGRANT_NO_PLUGINS", "1")], fresh.path());
    assert!(!ok && out.contains("podpath: the libvirt provider needs the vagrant-libvirt plugin"), "{out}");
    assert_eq!(out.trim().lines().count(), 1, "{out}");
    let (ok, out) =
        vagrant(&["up", "--provider", "virtualbox"], &[("LAB_BIN_DIR", &dir), ("PATH", "/usr/bin:/bin")], fresh.path());
    assert!(!ok && out.contains("podpath: the virtualbox provider needs VirtualBox: no VBoxManage"), "{out}");
    let (ok, out) = vagrant(&["validate", "-p"], &[("LAB_BOX_ARCH", "riscv")], home.path());
    assert!(!ok && out.contains("podpath: box_arch is \"riscv\": expected amd64 or arm64"), "{out}");
    let (_, ids) = testkit::netns::sh(&["find", &fresh.path().to_string_lossy(), "-name", "id"]);
    assert!(ids.trim().is_empty(), "no machine created: {ids}");
}

/// (machine name → its addresses) of the all-in-one lab's plan.
fn all_in_one_addresses(nodes: usize) -> BTreeMap<String, BTreeSet<String>> {
    let plan = podpath_lab::plan::Plan::new("x", nodes);
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for h in plan.hosts.iter().filter(|h| h.role != "underlay") {
        let ips = plan.addrs.iter().filter(|a| a.netns == h.netns).map(|a| a.cidr.trim_end_matches("/24").to_string());
        out.entry(h.role.clone()).or_default().extend(ips);
    }
    out
}

#[test]
fn machines_follow_the_all_in_one_address_plan() {
    let dir = bin_dir();
    let dot = tempfile::tempdir().unwrap();
    let dotfile = dot.path().to_str().unwrap();
    for nodes in [1, 3, 9] {
        let n = nodes.to_string();
        let all =
            load_machines(&repo_root(), &[("LAB_NODES", &n), ("LAB_BIN_DIR", &dir), ("VAGRANT_DOTFILE_PATH", dotfile)])
                .unwrap();
        let problems = check_topology(&all, &[NODE_NET, CLIENT_NET]);
        assert!(problems.is_empty(), "{nodes} nodes:\n{}", problems.join("\n"));
        // The builder comes only when named, and is not part of the lab.
        let builder = all.iter().find(|m| m.name == "builder").expect("a builder machine");
        assert!(!builder.autostart && builder.networks.is_empty(), "{builder:?}");
        let machines: Vec<_> = all.into_iter().filter(|m| m.autostart).collect();
        let problems = check_topology(&machines, &[NODE_NET, CLIENT_NET]);
        assert!(problems.is_empty(), "{nodes} nodes:\n{}", problems.join("\n"));
        let vagrant: BTreeMap<String, BTreeSet<String>> = machines
            .iter()
            .map(|m| (m.name.clone(), m.networks.iter().filter_map(|n| n.ip.clone()).collect()))
            .collect();
        assert_eq!(vagrant, all_in_one_addresses(nodes), "{nodes} nodes: same names and addresses as `podpath up`");
        // Each role gets exactly the binaries it runs and the credentials it needs (the CA's
        // key only on the control plane), and then its provisioning script.
        for m in &machines {
            let uploads: Vec<String> = m
                .provisioners
                .iter()
                .filter_map(|p| p.source.as_ref())
                .filter_map(|s| s.file_name().map(|f| f.to_string_lossy().into_owned()))
                .collect();
            let want: &[&str] = match m.name.as_str() {
                "control-plane" => &["apiserver-lite", "podpath", "ca.crt", "ca.key", "token"],
                "gateway" => &["lb-sim", "podpath", "ca.crt", "token"],
                "client" => &["podpath"],
                _ => &[
                    "node-agent",
                    "podpath-workload",
                    "podpath-dns",
                    "podpath-bridge",
                    "podpath-ipam",
                    "podpath-images",
                    "podpath",
                    "ca.crt",
                    "token",
                ],
            };
            assert_eq!(uploads, want, "{}", m.name);
            let last = m.provisioners.last().expect("a provisioner");
            assert_eq!(last.kind, "shell");
            assert!(last.path.as_ref().is_some_and(|p| p.ends_with("vagrant/provision.sh")));
            assert_eq!(last.env["LAB_NAME"], m.name);
            assert!(m.synced_folders.iter().all(|f| f.disabled), "no synced folder needed: {:?}", m.synced_folders);
        }
    }
    // One set of credentials per Vagrant environment, kept across loads: the kubeconfig carries
    // the CA that the control plane gets.
    let creds = dot.path().join("podpath");
    let kc = std::fs::read_to_string(creds.join("kubeconfig")).unwrap();
    let ca = std::fs::read_to_string(creds.join("ca.crt")).unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&ca);
    assert!(kc.contains(&format!("certificate-authority-data: {b64}\n")), "{kc}");
    let token = std::fs::read_to_string(creds.join("token")).unwrap();
    assert!(token.trim().len() == 64 && kc.contains(&format!("token: {}\n", token.trim())), "{kc}");
    use std::os::unix::fs::PermissionsExt;
    for secret in ["ca.key", "token", "kubeconfig"] {
        let mode = std::fs::metadata(creds.join(secret)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{secret}");
    }
}

#[test]
fn scripts_pass_shellcheck() {
    let root = repo_root();
    let scripts = [
        "vagrant/provision.sh",
        "vagrant/build.sh",
        "vagrant/test/rootfs.sh",
        "vagrant/test/libvirt-up.sh",
        "vagrant/test/build-from-scratch.sh",
        "scripts/demo",
    ];
    let out = Command::new("shellcheck")
        .args(scripts.iter().map(|s| root.join(s)))
        .output()
        .expect("run shellcheck (apt-get install shellcheck)");
    let (o, e) = text(&out);
    assert!(out.status.success(), "shellcheck:\n{o}{e}");
    for s in scripts {
        let (ok, out) = testkit::netns::sh(&["bash", "-n", &root.join(s).to_string_lossy()]);
        assert!(ok, "{s}: {out}");
    }
}

fn field<'a>(page: &'a str, name: &str) -> Option<&'a str> {
    page.lines().find_map(|l| l.strip_prefix(&format!("{name}: ")))
}

#[test]
fn provisioners_bring_up_the_lab_in_namespaces() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    let _turn = MACHINES.lock().unwrap_or_else(|e| e.into_inner());
    let host_before = testkit::netns::host_state();
    let rootfs = vagrant::ensure_rootfs(&repo_root().join("target/vagrant-rootfs")).unwrap();
    let dir = bin_dir();
    // Vagrant's data directory of this run, where the Vagrantfile makes the lab's credentials.
    let dot = tempfile::tempdir().unwrap();
    let dotfile = dot.path().to_str().unwrap();
    // The node VMs pull images from a docker.io mirror on the host's end of Vagrant's management
    // network (a classroom's cache; these machines have no internet).
    let mirror = "docker.io=http://192.168.121.1:5000";
    let machines: Vec<_> = load_machines(
        &repo_root(),
        &[
            ("LAB_NODES", "2"),
            ("LAB_BIN_DIR", &dir),
            ("VAGRANT_DOTFILE_PATH", dotfile),
            ("LAB_REGISTRY_MIRRORS", mirror),
        ],
    )
    .unwrap()
    .into_iter()
    .filter(|m| m.autostart)
    .collect();
    let prefix = testkit::netns::unique("vg");
    let lab = NetnsVagrant::create(&machines, &rootfs, &prefix, Some("192.168.56.1")).unwrap();
    let registry = Registry::start(None);
    registry.push("library/busybox:latest", &busybox(), None);
    let _mirror = registry.serve_in_netns(lab.host_netns.as_deref().unwrap(), "192.168.121.1:5000");
    let t = std::time::Instant::now();
    for m in &machines {
        let out = lab.provision(&m.name).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(out.contains(&format!("podpath[{}]: {} ready", role(&m.name), m.name)), "{out}");
    }
    eprintln!("provisioned {} machines in {:.1} s", machines.len(), t.elapsed().as_secs_f64());

    // The lab's tools on the machines (`--vagrant`), over SSH as on VMs: the harness's sshd on
    // each machine's management NIC, an SSH configuration like `vagrant ssh-config`'s.
    let ssh_config = lab.start_sshd().unwrap_or_else(|e| panic!("{e:#}"));
    let podpath_bin = bin("podpath");
    let root = repo_root();
    let podpath = |args: &[&str]| -> (bool, String) {
        let cfg = format!("PODPATH_VAGRANT_SSH_CONFIG={}", ssh_config.display());
        let dot = format!("VAGRANT_DOTFILE_PATH={dotfile}");
        // `podpath COMMAND --vagrant=DIR ARGS…` (before a `--` that ends exec's options).
        let on = format!("--vagrant={}", root.display());
        let mut argv = vec!["env", &cfg, &dot, podpath_bin.to_str().unwrap(), args[0], &on];
        argv.extend_from_slice(&args[1..]);
        lab.host_exec(&argv)
    };

    // kubectl from the "host" end of the node network, with the kubeconfig the Vagrantfile made:
    // https with the lab CA's certificate, and the token.
    let kubeconfig = dot.path().join("podpath/kubeconfig");
    let kc = std::fs::read_to_string(&kubeconfig).unwrap();
    assert!(
        kc.contains("server: https://192.168.56.10:6443")
            && kc.contains("certificate-authority-data: ")
            && kc.contains("token: "),
        "{kc}"
    );
    let kubectl = |args: &[&str]| -> String {
        let mut argv = vec!["kubectl", "--kubeconfig", kubeconfig.to_str().unwrap()];
        argv.extend_from_slice(args);
        let (ok, out) = lab.host_exec(&argv);
        assert!(ok, "kubectl {args:?}: {out}");
        out
    };
    wait_for(Duration::from_secs(30), "both nodes Ready", || {
        let out = kubectl(&["get", "nodes", "--no-headers"]);
        let ready = out.lines().filter(|l| l.split_whitespace().nth(1) == Some("Ready")).count();
        if ready == 2 {
            Ok(())
        } else {
            Err(out)
        }
    });
    // The API wants the token (and serves a certificate only the lab CA vouches for).
    let api = "https://192.168.56.10:6443/api/v1/nodes";
    let (_, code) = lab.host_exec(&["curl", "-sk", "-o", "/dev/null", "-w", "%{http_code}", api]);
    assert_eq!(code, "401", "without the token");
    let (ok, out) = lab.host_exec(&["curl", "-sS", "-o", "/dev/null", api]);
    assert!(!ok && out.contains("certificate"), "the system's CAs do not vouch for the lab's: {out}");
    kubectl(&["apply", "-f", &repo_root().join("vagrant/test/echo.yaml").to_string_lossy()]);
    let lb_ip = wait_for(Duration::from_secs(30), "an EXTERNAL-IP", || {
        let ip = kubectl(&["get", "svc", "echo", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]);
        if ip.starts_with("198.51.100.") {
            Ok(ip)
        } else {
            Err(ip)
        }
    });
    let url = format!("http://{lb_ip}/");
    let curl = |url: &str| lab.exec("client", &["curl", "-sS", "--max-time", "5", url]);
    let page = wait_for(Duration::from_secs(30), "the LB IP to answer from the client", || match curl(&url) {
        (true, page) if field(&page, "pod").is_some() => Ok(page),
        (_, out) => Err(out),
    });
    assert_eq!(field(&page, "pod"), Some("default/echo"), "{page}");
    // Through the gateway onto node-2 (no pod there), kube-proxy NAT to node-1's pod.
    let via: BTreeSet<String> = (0..12)
        .filter_map(|_| curl(&url).1.lines().find_map(|l| l.strip_prefix("client: ").map(str::to_string)))
        .map(|c| c.rsplit_once(':').map(|(ip, _)| ip.to_string()).unwrap_or(c))
        .collect();
    assert_eq!(via, BTreeSet::from(["192.168.56.12".to_string()]), "masqueraded by node-2");
    let (ok, status) = lab.exec("gateway", &["curl", "-sS", "http://127.0.0.1:9900/status"]);
    assert!(ok, "{status}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["nodes"].as_array().map(Vec::len), Some(2), "{status}");
    let (_, routes) = lab.exec("gateway", &["ip", "route", "show", &lb_ip]);
    assert!(routes.contains("nhid") && routes.contains("proto 78"), "gateway routes the LB IP to the nodes: {routes}");
    // The client's traffic to anywhere else stops at the gateway: nothing routes to an uplink.
    let (_, fwd) = lab.exec("gateway", &["iptables", "-S", "PODPATH-LAB-ONLY"]);
    assert!(fwd.contains("-j REJECT"), "{fwd}");
    let (ok, out) = lab.exec("client", &["curl", "-sS", "--max-time", "3", "http://192.0.2.1/"]);
    assert!(!ok, "{out}");

    // The cluster DNS (kube-system/kube-dns at 10.96.0.10, made by the control plane's
    // provisioner) answers a pod's resolver on a VM node, by short and full names.
    let yaml = |name: &str, text: &str| {
        let f = dot.path().join(name);
        std::fs::write(&f, text).unwrap();
        kubectl(&["apply", "-f", f.to_str().unwrap()]);
    };
    yaml(
        "probe.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: probe}\nspec:\n  nodeName: node-2\n  containers:\n  \
         - {name: c, image: busybox, command: [sleep, '3600']}\n",
    );
    kubectl(&["wait", "--for=condition=Ready", "pod/probe", "--timeout=30s"]);
    let svc_ip = kubectl(&["get", "svc", "echo", "-o", "jsonpath={.spec.clusterIP}"]);
    // The probe is a container of the busybox image node-2 pulled: the image's files, not the
    // VM's, and the Service variables of the Services made before it.
    let os = kubectl(&["exec", "probe", "--", "cat", "/etc/os-release"]);
    assert!(os.contains("podpath test busybox"), "the image's root file system: {os}");
    let env = kubectl(&["exec", "probe", "--", "printenv", "ECHO_SERVICE_HOST", "KUBERNETES_SERVICE_HOST"]);
    assert_eq!(env.split_whitespace().collect::<Vec<_>>(), [svc_ip.as_str(), "10.96.0.1"], "{env}");
    // Each node VM has its own store: node-2 pulled busybox, node-1 nothing yet. `image pull
    // --vagrant` pulls on every node; `image load --vagrant` copies an archive to each.
    let (ok, out) = podpath(&["image", "ls"]);
    let (n1, n2) = out.split_once("node-2:").unwrap_or_else(|| panic!("{out}"));
    assert!(ok && !n1.contains("busybox") && n2.contains("docker.io/library/busybox   latest"), "{out}");
    assert!(n2.contains("in /var/lib/podpath/images"), "{out}");
    let (ok, out) = podpath(&["image", "pull", "busybox"]);
    let (n1, n2) = out.split_once("node-2:").unwrap_or_else(|| panic!("{out}"));
    assert!(ok && n1.contains("  pulled docker.io/library/busybox:latest"), "{out}");
    assert!(n2.contains("  Image is up to date for docker.io/library/busybox:latest"), "{out}");
    let archive = dot.path().join("bb.tar");
    let copied = Command::new("skopeo")
        .args(["copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{}/library/busybox:latest", registry.addr))
        .arg(format!("docker-archive:{}:example.com/tools/bb:1", archive.display()))
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", String::from_utf8_lossy(&copied.stderr));
    let (ok, out) = podpath(&["image", "load", archive.to_str().unwrap()]);
    assert_eq!(out.matches("Loaded image: example.com/tools/bb:1").count(), 2, "{out}");
    assert!(ok, "{out}");
    kubectl(&[
        "run",
        "loaded",
        "--image=example.com/tools/bb:1",
        "--image-pull-policy=Never",
        "--overrides={\"spec\":{\"nodeName\":\"node-1\"}}",
        "--command",
        "--",
        "sleep",
        "3600",
    ]);
    kubectl(&["wait", "--for=condition=Ready", "pod/loaded", "--timeout=30s"]);
    let os = kubectl(&["exec", "loaded", "--", "cat", "/etc/os-release"]);
    assert!(os.contains("podpath test busybox"), "{os}");
    kubectl(&["delete", "pod", "loaded", "--wait=false"]);
    let (ok, out) = podpath(&["image", "rm", "nosuch:1"]);
    assert!(!ok && out.contains("image rm failed on node-1: ") && out.contains("no such image: nosuch:1"), "{out}");
    let (ok, out) = podpath(&["image", "load", "/nonexistent.tar"]);
    assert!(!ok && out.contains("cannot read /nonexistent.tar"), "{out}");
    let resolv = kubectl(&["exec", "probe", "--", "cat", "/etc/resolv.conf"]);
    assert!(
        resolv.contains("nameserver 10.96.0.10") && resolv.contains("search default.svc.cluster.local"),
        "{resolv}"
    );
    // A command in the probe pod (kubectl exec; its output whether it failed or not).
    let in_probe = |cmd: &[&str]| {
        let mut argv = vec!["kubectl", "--kubeconfig", kubeconfig.to_str().unwrap(), "exec", "probe", "--"];
        argv.extend_from_slice(cmd);
        lab.host_exec(&argv)
    };
    for name in ["echo", "echo.default.svc.cluster.local"] {
        let out = wait_for(Duration::from_secs(60), &format!("{name} resolved in a pod on node-2"), || {
            let (ok, out) = in_probe(&["getent", "hosts", name]);
            if ok && out.starts_with(&format!("{svc_ip} ")) {
                Ok(out)
            } else {
                Err(out)
            }
        });
        assert!(out.contains("echo.default.svc.cluster.local"), "{out}");
    }
    let dns_nodes = kubectl(&[
        "get",
        "pods",
        "-n",
        "kube-system",
        "-l",
        "k8s-app=kube-dns",
        "-o",
        "jsonpath={.items[*].spec.nodeName}",
    ]);
    assert!(dns_nodes.split_whitespace().all(|n| n.starts_with("node-")), "DNS pods on the VM nodes: {dns_nodes}");

    // NetworkPolicy: the echo pod admits only pods labelled role=allowed; the probe (on node-2)
    // is refused until it has the label.
    let echo_ip = kubectl(&["get", "pod", "echo", "-o", "jsonpath={.status.podIP}"]);
    let echo_url = format!("http://{echo_ip}:8080/");
    // busybox's wget (the image has no curl), under `timeout`: Debian's busybox wget crashes
    // when its own -T runs out.
    let from_probe = |url: &str| in_probe(&["timeout", "2", "wget", "-q", "-O", "-", url]);
    let (ok, page) = from_probe(&echo_url);
    assert!(ok && field(&page, "pod") == Some("default/echo"), "open before the policy: {page}");
    yaml(
        "policy.yaml",
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: echo-ingress}\nspec:\n  \
         podSelector: {matchLabels: {app: echo}}\n  policyTypes: [Ingress]\n  ingress:\n  \
         - from: [{podSelector: {matchLabels: {role: allowed}}}]\n",
    );
    wait_for(Duration::from_secs(20), "the policy to refuse the probe", || match from_probe(&echo_url) {
        (false, out) => Ok(out),
        (true, out) => Err(out),
    });
    // The same from `podpath policy matrix --vagrant`: every pod pair probed from the pods'
    // namespaces on their VMs.
    let matrix = |want: bool| {
        let (ok, out) = podpath(&["policy", "matrix", "--ports", "8080", "--output", "json"]);
        assert!(ok, "{out}");
        let m: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
        assert_eq!(m["results"]["tcp/8080"]["default/probe"]["default/echo"], want, "{m:#}");
        assert_eq!(m["results"]["tcp/8080"]["default/echo"]["default/echo"], true, "a pod reaches itself: {m:#}");
    };
    matrix(false);
    kubectl(&["label", "pod", "probe", "role=allowed"]);
    let page =
        wait_for(Duration::from_secs(20), "the policy to admit the labelled probe", || match from_probe(&echo_url) {
            (true, page) if field(&page, "pod") == Some("default/echo") => Ok(page),
            (_, out) => Err(out),
        });
    assert!(field(&page, "client").is_some_and(|c| c.starts_with("10.244.2.")), "the probe's own address: {page}");
    matrix(true);
    // `explain networkpolicy --vagrant`: the pods it selects and admits, and the rules node-1's
    // agent wrote for it, read on the VM.
    let (ok, out) = podpath(&["explain", "networkpolicy", "echo-ingress"]);
    assert!(ok, "{out}");
    for want in [
        "NetworkPolicy default/echo-ingress (policyTypes: Ingress)",
        &format!("selects: default/echo ({echo_ip}, node-1)"),
        "ingress[0]: from[0]: default/probe",
        "default/echo-ingress ingress[0] from[0]",
    ] {
        assert!(out.contains(want), "{want:?} missing from:\n{out}");
    }
    assert!(out.contains("node-1:\n  "), "node-1's rules: {out}");
    // The Gateway explanation takes --vagrant too (this lab has no Gateway API CRDs).
    let (ok, out) = podpath(&["explain", "gateway", "web"]);
    assert!(!ok && out.contains("gateway default/web not found (are the Gateway API CRDs installed?"), "{out}");
    kubectl(&["delete", "networkpolicy", "echo-ingress"]);
    kubectl(&["delete", "pod", "probe", "--wait=false"]);

    // `podpath trace --vagrant` of the LoadBalancer request: client → gateway → node-2 (its
    // kube-proxy NAT) → node-1 → the pod, the same hops and the same kube-proxy rules as the
    // trace of the same request in a namespace lab with the same objects.
    let t0 = std::time::Instant::now();
    let (ok, out) = podpath(&["trace", "--output", "json", &url]);
    eprintln!("trace --vagrant (machines over SSH): {:.0} ms", t0.elapsed().as_secs_f64() * 1000.0);
    let on_vms: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    assert!(ok && on_vms["outcome"]["status"] == 200, "{on_vms:#}");
    let netns_lab = podpath_e2e::Lab::up("vgtrace", &["--nodes", "2"]).unwrap();
    netns_lab.kubectl(&["apply", "-f", &repo_root().join("vagrant/test/echo.yaml").to_string_lossy()]);
    netns_lab.kubectl_until(
        Duration::from_secs(30),
        &["get", "svc", "echo", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"],
        |ip| ip == lb_ip,
    );
    netns_lab.kubectl(&["wait", "--for=condition=Ready", "pod/echo", "--timeout=30s"]);
    let t0 = std::time::Instant::now();
    let (ok, out, err) = netns_lab.run_apart("trace", &["--output", "json", &url]);
    eprintln!("trace (namespaces): {:.0} ms", t0.elapsed().as_secs_f64() * 1000.0);
    let in_netns: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}{err}"));
    assert!(ok && in_netns["outcome"]["status"] == 200, "{in_netns:#}");
    // `podpath explain --vagrant`: the Service's rules on every node, as in the namespace lab.
    let (ok, vm_explained) = podpath(&["explain", "--output", "json", "echo"]);
    assert!(ok && vm_explained.contains("KUBE-SVC-"), "{vm_explained}");
    let (ok, ns_explained) = netns_lab.run("explain", &["--output", "json", "echo"]);
    assert!(ok, "{ns_explained}");
    // What each API server allocated at random: the ClusterIP and the NodePort.
    let allocated = |explained: &str, svc: &str| -> String {
        let ports: serde_json::Value = serde_json::from_str(svc).unwrap();
        let ip = ports["spec"]["clusterIP"].as_str().unwrap().to_string();
        let np = ports["spec"]["ports"][0]["nodePort"].to_string();
        blank_pod_specifics(explained).replace(&ip, "CLUSTER-IP").replace(&np, "NODE-PORT")
    };
    let vm_svc = kubectl(&["get", "svc", "echo", "-o", "json"]);
    let ns_svc = netns_lab.kubectl(&["get", "svc", "echo", "-o", "json"]);
    assert_eq!(
        allocated(&vm_explained, &vm_svc),
        allocated(&ns_explained, &ns_svc),
        "explain on VMs and in namespaces"
    );
    drop(netns_lab);
    let hosts = |t: &serde_json::Value| -> Vec<String> {
        t["hops"].as_array().unwrap().iter().map(|h| h["host"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(hosts(&on_vms), ["client", "gateway", "node-2", "node-1"].map(String::from), "{on_vms:#}");
    assert_eq!(on_vms["pod"], "default/echo", "{on_vms:#}");
    assert_eq!(hosts(&on_vms), hosts(&in_netns));
    // The nodes' rules as the trace names them; endpoint chains and pod addresses differ
    // between the two labs only by the pod's address.
    let sep = blank_pod_specifics;
    let node_rules = |t: &serde_json::Value| -> Vec<String> {
        t["hops"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["host"].as_str().unwrap().starts_with("node-"))
            .flat_map(|h| {
                let host = h["host"].as_str().unwrap().to_string();
                h["steps"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(move |s| s["rule"].as_str().map(|r| format!("{host}: {}", sep(r))))
            })
            .collect()
    };
    let vm_rules = node_rules(&on_vms);
    assert!(vm_rules.iter().any(|r| r.starts_with("node-2: -A KUBE-SEP-") && r.contains("-j DNAT")), "{vm_rules:#?}");
    assert_eq!(vm_rules, node_rules(&in_netns), "the same kube-proxy rules on VMs and in namespaces");
    // From a pod (the probe, a container of an image on node-2): the probe leaves its network
    // namespace on node-2, whose kube-proxy NAT sends it to the echo pod on node-1.
    let (ok, out) =
        podpath(&["trace", "--output", "json", "--from", "pod/default/probe", &format!("http://{svc_ip}/")]);
    let from_pod: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    assert!(ok && from_pod["outcome"]["status"] == 200, "{from_pod:#}");
    assert_eq!(hosts(&from_pod), ["node-2", "node-1"].map(String::from), "{from_pod:#}");
    assert!(
        node_rules(&from_pod).iter().any(|r| r.starts_with("node-2: -A KUBE-SEP-") && r.contains("-j DNAT")),
        "{from_pod:#}"
    );

    // Provisioning again changes nothing: the same service processes, one hosts block, one
    // FORWARD jump, and the Service still answers.
    let services = lab.services();
    assert_eq!(
        services.iter().map(|(m, s, _)| format!("{m}/{s}")).collect::<Vec<_>>(),
        [
            "control-plane/apiserver-lite",
            "gateway/lb-sim",
            "node-1/images",
            "node-1/node-agent",
            "node-2/images",
            "node-2/node-agent"
        ]
    );
    for m in &machines {
        lab.provision(&m.name).unwrap_or_else(|e| panic!("again: {e:#}"));
    }
    assert_eq!(lab.services(), services, "no restart without a change");
    let (_, hosts) = lab.exec("node-1", &["cat", "/etc/hosts"]);
    assert_eq!(hosts.matches("# podpath lab begin").count(), 1, "{hosts}");
    assert!(hosts.contains("192.168.56.12 node-2") && hosts.contains("203.0.113.10 client"), "{hosts}");
    let (_, forward) = lab.exec("gateway", &["iptables", "-S", "FORWARD"]);
    assert_eq!(forward.matches("PODPATH-LAB-ONLY").count(), 1, "{forward}");
    let (ok, page) = curl(&url);
    assert!(ok && field(&page, "pod") == Some("default/echo"), "{page}");

    // A changed setting restarts only what it concerns: node-1 goes to the nftables mode, which
    // replaces its iptables rules with the table `ip kube-proxy`, and its own requests to the
    // Service go through that table.
    let node1 = lab.machine("node-1").machine.clone();
    let mut changed = node1.clone();
    for p in &mut changed.provisioners {
        if let Some(v) = p.env.get_mut("LAB_PROXY_MODE") {
            *v = "nftables".into();
        }
    }
    let out = lab.provision_machine(&changed).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(out.contains("started node-agent"), "{out}");
    let after = lab.services();
    let pid =
        |svcs: &[(String, String, i32)], m: &str| svcs.iter().find(|s| s.0 == m && s.1 == "node-agent").map(|s| s.2);
    assert_ne!(pid(&after, "node-1"), pid(&services, "node-1"));
    assert_eq!(pid(&after, "node-2"), pid(&services, "node-2"));
    let table = wait_for(Duration::from_secs(15), "node-1's table ip kube-proxy with the LB IP", || {
        match lab.exec("node-1", &["nft", "list", "table", "ip", "kube-proxy"]) {
            (true, t) if t.contains(&format!("{lb_ip} . tcp . 80 : goto external-")) => Ok(t),
            (_, out) => Err(out),
        }
    });
    assert!(table.contains("numgen random mod 1 map"), "{table}");
    let (_, nat) = lab.exec("node-1", &["iptables-save", "-t", "nat"]);
    assert!(!nat.contains("KUBE-SERVICES"), "the iptables mode's rules are gone: {nat}");
    // The client reaches the Service through node-1's NodePort: its table's service-nodeports
    // element, DNAT to the pod, masquerade (the pod sees node-1).
    let node_port = kubectl(&["get", "svc", "echo", "-o", "jsonpath={.spec.ports[0].nodePort}"]);
    let page = wait_for(Duration::from_secs(20), "node-1's NodePort through its table", || {
        match curl(&format!("http://192.168.56.11:{node_port}/")) {
            (true, page) if field(&page, "pod") == Some("default/echo") => Ok(page),
            (_, out) => Err(out),
        }
    });
    assert!(field(&page, "client").is_some_and(|c| c.starts_with("10.244.1.1:")), "masqueraded by node-1: {page}");

    let (ok, status) = podpath(&["status"]);
    assert!(ok, "{status}");
    for want in ["control-plane    apiserver-lite", "gateway          lb-sim", "node-1           node-agent"] {
        assert!(status.contains(want), "{want}: {status}");
    }
    assert!(
        status.lines().any(|l| l.starts_with("node-2") && l.contains("running") && l.ends_with(" Ready")),
        "{status}"
    );
    assert!(status.contains(&lb_ip) && status.contains("default/echo"), "the gateway's load balancers: {status}");
    let (ok, page) = podpath(&["curl", &url]);
    assert!(ok && field(&page, "pod") == Some("default/echo"), "podpath curl --vagrant: {page}");
    // As typed in the checkout: a bare `--vagrant` (this directory) before the URL.
    let typed = format!(
        "cd {} && PODPATH_VAGRANT_SSH_CONFIG={} VAGRANT_DOTFILE_PATH={dotfile} {} curl --vagrant {url}",
        root.display(),
        ssh_config.display(),
        podpath_bin.display()
    );
    let (ok, page) = lab.host_exec(&["sh", "-c", &typed]);
    assert!(ok && field(&page, "pod") == Some("default/echo"), "{typed}: {page}");
    let (ok, out) = podpath(&["exec", "node-2", "--", "cat", "/etc/hostname"]);
    assert!(ok && out.trim() == "node-2", "{out}");
    let (ok, out) = podpath(&["exec", "pod/default/echo", "--", "hostname"]);
    assert!(ok && out.trim() == "echo", "a pod's own UTS namespace on node-1: {out}");
    // A container of an image: its process is read from node-2's records, its root is the image's.
    let (ok, out) = podpath(&["exec", "pod/default/probe", "--", "cat", "/etc/os-release"]);
    assert!(ok && out.contains("podpath test busybox"), "the probe's container on node-2: {out}");
    // node-1 is in the nftables mode now, node-2 in the iptables mode: both read.
    let (ok, rules) = podpath(&["rules"]);
    assert!(ok, "{rules}");
    let node = |n: &str| -> String {
        let start = rules.find(&format!("{n} (")).unwrap_or_else(|| panic!("{n} in {rules}"));
        rules[start..].lines().skip(1).take_while(|l| l.starts_with("  ")).collect::<Vec<_>>().join("\n")
    };
    assert!(node("node-1").contains("nft ") && node("node-1").contains(&lb_ip), "{rules}");
    assert!(node("node-2").contains("KUBE-SVC-") && node("node-2").contains(&lb_ip), "{rules}");
    // The lab NIC of node-2 down: lb-sim's health check fails and it takes node-2 out of the
    // rotation of a Service that is not pinned to a node; up again: back.
    kubectl(&[
        "expose",
        "pod",
        "echo",
        "--name",
        "echo-all",
        "--type",
        "LoadBalancer",
        "--port",
        "80",
        "--target-port",
        "8080",
    ]);
    let in_rotation = |node: &str| -> Option<bool> {
        let (_, status) = lab.exec("gateway", &["curl", "-sS", "http://127.0.0.1:9900/status"]);
        let doc: serde_json::Value = serde_json::from_str(&status).ok()?;
        let f = doc["frontends"].as_array()?.iter().find(|f| f["service"] == "default/echo-all")?;
        f["backends"].as_array()?.iter().find(|b| b["node"] == node).map(|b| b["inRotation"] == true)
    };
    wait_for(Duration::from_secs(20), "echo-all's frontend with node-2 in rotation", || match in_rotation("node-2") {
        Some(true) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let (ok, out) = podpath(&["fault", "link", "down", "node-2"]);
    assert!(ok && out.contains("node-2: eth1 (the lab's network) down"), "{out}");
    let (ok, out) = podpath(&["fault", "list"]);
    assert!(ok && out.contains("node-2") && out.contains("link-down"), "{out}");
    // `podpath watch --vagrant`: the timeline's starting state, read on the VMs.
    let (ok, out) = podpath(&["watch", "--seconds", "0.1"]);
    assert!(ok, "{out}");
    for want in [
        "fault made: node-2 link-down: eth1 (the lab's network) down",
        "node node-1: Ready=True",
        "node node-1: proxy /healthz 200",
        "endpoints default/echo: +10.244.1.",
    ] {
        assert!(out.contains(want), "{want}: {out}");
    }
    wait_for(Duration::from_secs(20), "lb-sim to take node-2 out of rotation", || match in_rotation("node-2") {
        Some(false) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    let (ok, out) = podpath(&["fault", "link", "up", "node-2"]);
    assert!(ok, "{out}");
    wait_for(Duration::from_secs(20), "node-2 back in rotation", || match in_rotation("node-2") {
        Some(true) => Ok(()),
        other => Err(format!("{other:?}")),
    });
    // node stop: the agent and its pods go; node start: back and Ready.
    let (ok, out) = podpath(&["node", "stop", "node-2"]);
    assert!(ok && out.contains("node-2: stopped"), "{out}");
    let (_, status) = podpath(&["status"]);
    assert!(status.lines().any(|l| l.starts_with("node-2") && l.contains(" dead ")), "{status}");
    let (ok, out) = podpath(&["node", "start", "node-2"]);
    assert!(ok && out.contains("node-2: started"), "{out}");
    // Bad input: one line each.
    let (ok, out) = podpath(&["exec", "node-7", "--", "true"]);
    assert!(!ok && out.contains("no running machine \"node-7\""), "{out}");
    let (ok, out) = podpath(&["fault", "loss", "client", "30"]);
    assert!(!ok && out.contains("\"client\" is not a node"), "{out}");
    // A blackhole on node-2 for node-1's pods: the LoadBalancer's requests (routed to node-2,
    // NATed to the pod on node-1) go nowhere until it is cleared.
    let answers = || {
        wait_for(Duration::from_secs(30), "the LB IP to answer", || match curl(&url) {
            (true, page) if field(&page, "pod") == Some("default/echo") => Ok(()),
            (_, out) => Err(out),
        })
    };
    answers();
    let (ok, out) = podpath(&["fault", "blackhole", "node-2", "10.244.1.0/24"]);
    assert!(ok && out.contains("packets to and from 10.244.1.0/24 discarded"), "{out}");
    let (ok, out) = curl(&url);
    assert!(!ok, "through the blackhole: {out}");
    let (ok, out) = podpath(&["fault", "clear", "node-2"]);
    assert!(ok && out.contains("node-2: cleared packets to and from 10.244.1.0/24"), "{out}");
    answers();
    // The node's rules flushed: its agent writes them again.
    let (ok, out) = podpath(&["fault", "flush-rules", "node-2"]);
    assert!(ok && out.contains("node-2: service proxy rules flushed; the node agent rewrote them"), "{out}");
    // The pod's process killed: its kubelet starts it again.
    let (ok, out) = podpath(&["fault", "kill", "pod", "default/echo"]);
    assert!(ok && out.contains("pod default/echo: process") && out.contains("on node-1 killed"), "{out}");
    wait_for(Duration::from_secs(30), "echo restarted", || {
        match kubectl(&["get", "pod", "echo", "-o", "jsonpath={.status.containerStatuses[0].restartCount}"]).as_str() {
            "0" => Err("not yet".into()),
            n => Ok(n.to_string()),
        }
    });

    // `podpath rules --watch --vagrant`: a new Service's rules appear on both nodes, named with
    // the API change that caused them.
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", lab.host_netns.as_deref().unwrap(), "env"])
        .arg(format!("PODPATH_VAGRANT_SSH_CONFIG={}", ssh_config.display()))
        .arg(format!("VAGRANT_DOTFILE_PATH={dotfile}"))
        .arg(&podpath_bin)
        .args(["rules", "--watch", &format!("--vagrant={}", root.display())]);
    let watch = podpath_e2e::LineWatch::spawn(cmd);
    watch.wait_until(Duration::from_secs(20), "the watch to start", |s| {
        s.starts_with("watching the service proxy's rules (node-1 ")
    });
    kubectl(&["create", "service", "clusterip", "watched", "--tcp=80:8080"]);
    let report = watch.wait_until(Duration::from_secs(30), "the new Service's rules in the watch", |s| {
        s.contains("Service default/watched created") && s.contains("default/watched:80-8080")
    });
    watch.stop();
    // No endpoints yet: node-2 (iptables) REJECTs it, node-1 (nftables) adds it to the map.
    assert!(
        report.contains("node-2:") && report.contains("watched:80-8080 has no endpoints\" -m tcp --dport 80 -j REJECT"),
        "{report}"
    );
    assert!(report.contains("+ nft element no-endpoint-services:"), "{report}");

    // The official Python and JavaScript clients with the generated kubeconfig (https, the lab
    // CA, the token) from the host's end of the node network: exec with stdin, a pod's log and
    // port-forward, to pods on a VM node (through apiserver-lite to that VM's kubelet).
    kubectl(&["run", "web", "--image=podpath/echo", "--port=8080", "--overrides={\"spec\":{\"nodeName\":\"node-1\"}}"]);
    let ticker = "i=0; while true; do echo tick $i; i=$((i+1)); sleep 0.2; done";
    kubectl(&["run", "ticker", "--image=busybox", "--command", "--", "sh", "-c", ticker]);
    kubectl(&["wait", "--for=condition=Ready", "pod/web", "pod/ticker", "--timeout=60s"]);
    std::thread::sleep(Duration::from_millis(600));
    let host_ns = lab.host_netns.clone().unwrap();
    let client_home = tempfile::tempdir().unwrap();
    let python = podpath_e2e::clients::venv();
    let (ok, out) = lab.host_exec(&[
        "env",
        &format!("HOME={}", client_home.path().display()),
        python.to_str().unwrap(),
        &repo_root().join("e2e/tests/python/stream_check.py").to_string_lossy(),
        kubeconfig.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("python streaming: ok"), "the Python client on the VM lab:\n{out}");
    podpath_e2e::clients::node_check_with(
        "stream_check.mjs",
        &kubeconfig,
        client_home.path(),
        "node streaming: ok",
        &["ip", "netns", "exec", &host_ns],
    );

    let work_pids = lab.processes_inside();
    assert!(work_pids.len() >= 6, "services and the pod's processes run in the chroots: {work_pids:?}");
    let prefix_ns = format!("{prefix}-");
    drop(lab);
    let (_, netns) = testkit::netns::sh(&["ip", "netns", "list"]);
    assert!(!netns.contains(&prefix_ns), "namespaces left: {netns}");
    let left: Vec<i32> = work_pids.into_iter().filter(|p| Path::new(&format!("/proc/{p}")).exists()).collect();
    assert!(left.iter().all(|p| !vagrant::alive(*p)), "processes left: {left:?}");
    assert_eq!(testkit::netns::host_state(), host_before, "the host namespace is unchanged");
}

fn role(machine: &str) -> &str {
    if machine.starts_with("node-") {
        "node"
    } else {
        machine
    }
}

/// A rule with what differs between two labs with the same objects blanked: the endpoint
/// chain's hash (of the pod's address) and pod addresses.
fn blank_pod_specifics(rule: &str) -> String {
    let mut out = String::new();
    let mut rest = rule;
    while let Some(i) = [rest.find("KUBE-SEP-"), rest.find("10.244.")].into_iter().flatten().min() {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        let (keep, skip) = if tail.starts_with("KUBE-SEP-") {
            ("KUBE-SEP-*", "KUBE-SEP-".len())
        } else {
            ("10.244.*", "10.244.".len())
        };
        out.push_str(keep);
        let after = &tail[skip..];
        let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '.')).unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The two tests that build machines from the root filesystem take turns: the first makes it
/// (debootstrap must not run twice at once), and the builder's compile would slow the other's
/// timed waits.
static MACHINES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The from-source path for hosts without Linux binaries: `vagrant up` refuses with one line
/// naming the builder; `vagrant up builder` uploads the checkout, whose provisioner compiles it
/// with the pinned toolchain; the trigger fetches the binaries; then `vagrant up` takes them
/// and a lab made of them answers. The builder here has no internet (as the lab's machines): it
/// sees the host's toolchain and cargo caches (at the host's paths) and a layer over the
/// workspace's target directory (dependencies compiled already; every podpath crate is compiled
/// from the uploaded source), in the `dev` profile (`build_profile`), so CI compiles in about a
/// minute. The from-nothing release build is `vagrant/test/build-from-scratch.sh`.
#[test]
fn the_builder_compiles_the_checkout_for_the_other_machines() {
    if !testkit::netns::root_or_explain() {
        return;
    }
    let _turn = MACHINES.lock().unwrap_or_else(|e| e.into_inner());
    let host_before = testkit::netns::host_state();
    let rootfs = vagrant::ensure_rootfs(&repo_root().join("target/vagrant-rootfs")).unwrap();
    let dot = tempfile::tempdir().unwrap();
    let dotfile = dot.path().to_str().unwrap();
    // A host that built nothing for the boxes.
    let no_bins = tempfile::tempdir().unwrap();
    let env = [
        ("LAB_NODES", "1"),
        ("LAB_BIN_DIR", no_bins.path().to_str().unwrap()),
        ("VAGRANT_DOTFILE_PATH", dotfile),
        ("LAB_BUILD_PROFILE", "dev"),
    ];
    let refused = vagrant::load_machines_for(&repo_root(), &env, &["up"]).unwrap_err().to_string();
    assert!(
        refused.contains("missing in")
            && refused
                .contains("or let a VM build them from this checkout: `vagrant up builder`, then `vagrant up` again"),
        "{refused}"
    );
    let refused = vagrant::load_machines_for(&repo_root(), &env, &["up", "builder", "node-1"]).unwrap_err().to_string();
    assert!(refused.contains("bring the builder up on its own first: `vagrant up builder`"), "{refused}");

    // `vagrant up builder`: the Vagrantfile archives the checkout for it (an option's value is
    // not taken for a machine's name).
    let machines =
        vagrant::load_machines_for(&repo_root(), &env, &["up", "builder", "--provision-with", "podpath-builder"])
            .unwrap();
    let archive = dot.path().join("podpath/source.tar.gz");
    let (ok, listing) = testkit::netns::sh(&["tar", "-tzf", archive.to_str().unwrap()]);
    assert!(ok, "{listing}");
    for want in ["Cargo.lock", "vagrant/rust-toolchain.toml", "lab/src/main.rs"] {
        assert!(listing.lines().any(|l| l == want), "{want} in the archive");
    }
    assert!(
        listing.lines().all(|l| !l.starts_with("target/") && !l.starts_with(".git/")),
        "no build output or git data in the archive"
    );
    let mut builder = machines.iter().find(|m| m.name == "builder").unwrap().clone();
    assert_eq!(builder.provisioners[0].source.as_deref(), Some(archive.as_path()));
    let home = |var: &str, default: &str| {
        std::env::var(var).unwrap_or_else(|_| format!("{}/{default}", std::env::var("HOME").unwrap_or("/root".into())))
    };
    let (rustup_home, cargo_home) = (home("RUSTUP_HOME", ".rustup"), home("CARGO_HOME", ".cargo"));
    // The host's toolchain and cargo home at the host's paths (cargo's fingerprints of the
    // compiled dependencies name the registry's sources by path).
    let script = builder.provisioners.iter_mut().find(|p| p.kind == "shell").unwrap();
    script.env.insert("RUSTUP_HOME".into(), rustup_home.clone());
    script.env.insert("CARGO_HOME".into(), cargo_home.clone());

    let prefix = testkit::netns::unique("vb");
    let mut lab = NetnsVagrant::create(std::slice::from_ref(&builder), &rootfs, &prefix, None).unwrap();
    lab.overlay_host_dir("builder", Path::new(&rustup_home), &rustup_home).unwrap();
    lab.overlay_host_dir("builder", Path::new(&cargo_home), &cargo_home).unwrap();
    lab.overlay_host_dir("builder", &repo_root().join("target"), "/var/lib/podpath-build/target").unwrap();
    // The pinned toolchain is this machine's (the one the project is tested with): in the
    // builder's layer it gets the pinned name, as rustup names a toolchain it installed.
    let pin = std::fs::read_to_string(repo_root().join("vagrant/rust-toolchain.toml")).unwrap();
    let pin = pin.lines().find_map(|l| l.strip_prefix("channel = \"")?.strip_suffix('"')).unwrap().to_string();
    let (_, rustc) = testkit::netns::sh(&["rustc", "--version"]);
    assert!(
        rustc.starts_with(&format!("rustc {pin} ")),
        "vagrant/rust-toolchain.toml pins {pin}, but this machine builds with {rustc}"
    );
    let toolchains = lab.machine("builder").root.join(rustup_home.trim_start_matches('/')).join("toolchains");
    let (_, triple) = testkit::netns::sh(&["rustc", "-vV"]);
    let triple = triple.lines().find_map(|l| l.strip_prefix("host: ")).unwrap().to_string();
    let pinned = toolchains.join(format!("{pin}-{triple}"));
    let is_dir = std::fs::symlink_metadata(&pinned).is_ok_and(|m| m.is_dir());
    if !is_dir {
        // (A link of the host's may point outside the machine's view: replaced.)
        let _ = std::fs::remove_file(&pinned);
        std::os::unix::fs::symlink(format!("stable-{triple}"), &pinned).unwrap();
    }

    // The trigger: the builder's binaries to the host, .vagrant/podpath/bin/<box_arch>/ (it
    // also runs after `vagrant up builder --no-provision`, when there is nothing yet).
    let built = dot.path().join("podpath/bin/amd64");
    let root = repo_root();
    let fetch = || {
        testkit::netns::sh(&[
            "ruby",
            &root.join("vagrant/test/fetch-built.rb").to_string_lossy(),
            &root.to_string_lossy(),
            &lab.machine("builder").root.to_string_lossy(),
            &built.to_string_lossy(),
        ])
    };
    let (ok, out) = fetch();
    assert!(ok && out.contains("the builder has built nothing yet") && !built.exists(), "{out}");
    let t = std::time::Instant::now();
    let out = lab.provision_machine(&builder).unwrap_or_else(|e| panic!("{e:#}"));
    eprintln!("builder: compiled in {:.0} s", t.elapsed().as_secs_f64());
    assert!(out.contains("podpath[builder]: built 9 binaries in"), "{out}");
    assert!(out.contains(&format!("compiling with rustc {pin} ")), "{out}");
    // A build that lacks a binary this checkout has (an older checkout's): nothing is fetched.
    let out_dir = lab.machine("builder").root.join("var/lib/podpath-build/out");
    std::fs::rename(out_dir.join("podpath-images"), out_dir.join("podpath-images.aside")).unwrap();
    let (ok, out) = fetch();
    assert!(ok && out.contains("the builder's last build has no podpath-images") && !built.exists(), "{out}");
    std::fs::rename(out_dir.join("podpath-images.aside"), out_dir.join("podpath-images")).unwrap();
    let (ok, out) = fetch();
    assert!(ok && out.contains("fetched to"), "{out}");
    let info = std::fs::read_to_string(built.join("BUILD-INFO")).unwrap();
    let (_, sum) = testkit::netns::sh(&["sha256sum", archive.to_str().unwrap()]);
    let sum = sum.split_whitespace().next().unwrap().to_string();
    assert!(info.contains(&format!("source: sha256 {sum}")) && info.contains("profile: dev"), "{info}");
    assert!(info.contains(&format!("toolchain: rustc {pin} ")), "{info}");
    drop(lab);

    // `vagrant up`: the lab takes the builder's binaries, and a lab made of them works.
    let machines: Vec<_> = load_machines(&repo_root(), &env).unwrap().into_iter().filter(|m| m.autostart).collect();
    for m in &machines {
        for p in m.provisioners.iter().filter(|p| p.kind == "file") {
            let src = p.source.as_ref().unwrap();
            assert!(
                src.starts_with(&built) || src.starts_with(dot.path().join("podpath")),
                "{}: {}",
                m.name,
                src.display()
            );
        }
    }
    let prefix = testkit::netns::unique("vb");
    let lab = NetnsVagrant::create(&machines, &rootfs, &prefix, Some("192.168.56.1")).unwrap();
    for m in &machines {
        let out = lab.provision(&m.name).unwrap_or_else(|e| panic!("{e:#}"));
        assert!(out.contains(&format!("podpath[{}]: {} ready", role(&m.name), m.name)), "{out}");
    }
    for (machine, b) in [("control-plane", "apiserver-lite"), ("node-1", "node-agent"), ("gateway", "lb-sim")] {
        let installed = lab.machine(machine).root.join("usr/local/bin").join(b);
        assert_eq!(std::fs::read(&installed).unwrap(), std::fs::read(built.join(b)).unwrap(), "{machine}: {b}");
        assert_ne!(std::fs::read(&installed).unwrap(), std::fs::read(bin(b)).unwrap(), "not the host's {b}");
    }
    let kubeconfig = dot.path().join("podpath/kubeconfig");
    let kubectl = |args: &[&str]| -> (bool, String) {
        let mut argv = vec!["kubectl", "--kubeconfig", kubeconfig.to_str().unwrap()];
        argv.extend_from_slice(args);
        lab.host_exec(&argv)
    };
    wait_for(Duration::from_secs(30), "node-1 Ready", || match kubectl(&["get", "nodes", "--no-headers"]) {
        (true, out) if out.lines().any(|l| l.split_whitespace().nth(1) == Some("Ready")) => Ok(()),
        (_, out) => Err(out),
    });
    let manifest = dot.path().join("echo.yaml");
    let yaml = std::fs::read_to_string(repo_root().join("vagrant/test/echo.yaml")).unwrap();
    // One node: the Service is not pinned to a second one.
    std::fs::write(&manifest, yaml.replace(", annotations: {podpath.dev/route-to-node: node-2}", "")).unwrap();
    let (ok, out) = kubectl(&["apply", "-f", manifest.to_str().unwrap()]);
    assert!(ok, "{out}");
    let lb_ip = wait_for(Duration::from_secs(30), "an EXTERNAL-IP", || {
        match kubectl(&["get", "svc", "echo", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}"]) {
            (true, ip) if ip.starts_with("198.51.100.") => Ok(ip),
            (_, out) => Err(out),
        }
    });
    let page = wait_for(Duration::from_secs(30), "the LB IP to answer from the client", || {
        match lab.exec("client", &["curl", "-sS", "--max-time", "5", &format!("http://{lb_ip}/")]) {
            (true, page) if field(&page, "pod").is_some() => Ok(page),
            (_, out) => Err(out),
        }
    });
    assert_eq!(field(&page, "pod"), Some("default/echo"), "{page}");
    drop(lab);
    assert_eq!(testkit::netns::host_state(), host_before, "the host namespace is unchanged");
}
