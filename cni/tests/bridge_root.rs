//! Root tests of podpath-bridge in network namespaces the tests create. The plugin runs inside a
//! "node" namespace (as the node agent will run it), containers are namespaces of their own,
//! and the host's own namespace must be identical before and after every test.
//!
//! Address plan: each test uses its own subnet 10.(200+k).(pid % 250).0/24 and bridge name, so
//! parallel tests never share anything.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{json, Value};
use testkit::netns::{host_state, root_or_explain, Netns as Ns};

static COUNTER: AtomicU32 = AtomicU32::new(0);

const REFERENCE: &str = "/usr/lib/cni";

struct Plugin {
    code: i32,
    out: Value,
}

fn bin_dir() -> String {
    Path::new(env!("CARGO_BIN_EXE_podpath-bridge")).parent().unwrap().display().to_string()
}

/// Runs a plugin inside `node` the way a runtime does.
fn cni(node: &Ns, plugin: &str, cmd: &str, id: &str, netns: Option<&str>, path: &str, conf: &Value) -> Plugin {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", &node.name, plugin])
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", path)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(n) = netns {
        c.env("CNI_NETNS", n);
    }
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let out = if o.stdout.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&o.stdout).unwrap_or(json!({"raw": String::from_utf8_lossy(&o.stdout)}))
    };
    Plugin { code: o.status.code().unwrap_or(-1), out }
}

fn ours() -> String {
    env!("CARGO_BIN_EXE_podpath-bridge").to_string()
}

struct Net {
    k: u32,
    data: tempfile::TempDir,
}

impl Net {
    fn new() -> Net {
        Net { k: COUNTER.fetch_add(1, Ordering::SeqCst) % 50, data: tempfile::tempdir().unwrap() }
    }
    fn subnet(&self) -> String {
        format!("10.{}.{}.0/24", 200 + self.k, std::process::id() % 250)
    }
    fn prefix(&self) -> String {
        format!("10.{}.{}", 200 + self.k, std::process::id() % 250)
    }
    fn conf(&self, plugin_type: &str, ipam_type: &str, version: &str) -> Value {
        json!({"cniVersion": version, "name": format!("ppt{}", self.k), "type": plugin_type,
               "bridge": format!("ppbr{}", self.k), "isGateway": true, "ipMasq": true,
               "ipam": {"type": ipam_type, "dataDir": self.data.path(), "ranges": [[{"subnet": self.subnet()}]],
                        "routes": [{"dst": "0.0.0.0/0"}]}})
    }
}

fn links(ns: &Ns) -> String {
    ns.run(&["ip", "-o", "link"]).1
}

#[test]
fn add_check_del_and_reachability() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    {
        let node = Ns::new("n");
        let (c1, c2) = (Ns::new("a"), Ns::new("b"));
        let net = Net::new();
        let conf = net.conf("podpath-bridge", "podpath-ipam", "1.1.0");
        let path = bin_dir();
        let a = cni(&node, &ours(), "ADD", "ctr-a", Some(&c1.path()), &path, &conf);
        assert_eq!(a.code, 0, "{}", a.out);
        let b = cni(&node, &ours(), "ADD", "ctr-b", Some(&c2.path()), &path, &conf);
        assert_eq!(b.code, 0, "{}", b.out);
        assert_eq!(a.out["cniVersion"], "1.1.0");
        assert_eq!(a.out["interfaces"][2]["sandbox"], c1.path());
        assert_eq!(a.out["ips"][0]["interface"], 2);
        assert_eq!(a.out["ips"][0]["gateway"], format!("{}.1", net.prefix()));
        let ip_b = b.out["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
        // pod -> gateway and pod -> pod over the bridge
        let (ok, out) = c1.run(&["ping", "-c1", "-W2", &format!("{}.1", net.prefix())]);
        assert!(ok, "pod to gateway: {out}");
        let (ok, out) = c1.run(&["ping", "-c1", "-W2", &ip_b]);
        assert!(ok, "pod to pod: {out}");
        // lo is up in the container
        assert!(c1.run(&["ip", "-o", "link", "show", "lo"]).1.contains("UP"));
        // NAT rules as the reference writes them
        let nat = node.run(&["iptables-save", "-t", "nat"]).1;
        assert!(
            nat.contains(&format!(
                "-A POSTROUTING -s {}",
                a.out["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap()
            )),
            "{nat}"
        );
        assert!(nat.contains("! -d 224.0.0.0/4"), "{nat}");
        // CHECK passes with the ADD result, fails when the interface is gone
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = a.out.clone();
        assert_eq!(cni(&node, &ours(), "CHECK", "ctr-a", Some(&c1.path()), &path, &with_prev).code, 0);
        // GC with only ctr-a valid: ctr-b's NAT chain and address go, ctr-a's stay.
        let mut gc =
            json!({"cniVersion": "1.1.0", "name": conf["name"], "type": "podpath-bridge", "ipam": conf["ipam"]});
        gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-a", "ifname": "eth0"}]);
        let g = cni(&node, &ours(), "GC", "", None, &path, &gc);
        assert_eq!(g.code, 0, "{}", g.out);
        let nat = node.run(&["iptables-save", "-t", "nat"]).1;
        assert!(!nat.contains("id: \\\"ctr-b\\\""), "{nat}");
        assert!(nat.contains("id: \\\"ctr-a\\\""), "{nat}");
        // CHECK notices a missing address.
        let addr_b = b.out["ips"][0]["address"].as_str().unwrap().to_string();
        c2.run(&["ip", "addr", "del", &addr_b, "dev", "eth0"]);
        let mut prev_b = conf.clone();
        prev_b["prevResult"] = b.out.clone();
        assert_eq!(cni(&node, &ours(), "CHECK", "ctr-b", Some(&c2.path()), &path, &prev_b).out["code"], 104);
        // ... and a missing route.
        let mut prev_a = conf.clone();
        prev_a["prevResult"] = a.out.clone();
        c1.run(&["ip", "route", "del", "default"]);
        assert_eq!(cni(&node, &ours(), "CHECK", "ctr-a", Some(&c1.path()), &path, &prev_a).out["code"], 104);
        c1.run(&["ip", "route", "add", "default", "via", &format!("{}.1", net.prefix())]);
        assert_eq!(cni(&node, &ours(), "CHECK", "ctr-a", Some(&c1.path()), &path, &prev_a).code, 0);
        // duplicate ADD
        let dup = cni(&node, &ours(), "ADD", "ctr-a", Some(&c1.path()), &path, &conf);
        assert_eq!(dup.out["code"], 101);
        // DEL twice; DEL after the netns is gone; DEL of something never added
        // (the first with prevResult, as libcni sends it: the NAT rules go in one restore)
        for del_conf in [&with_prev, &conf] {
            let d = cni(&node, &ours(), "DEL", "ctr-a", Some(&c1.path()), &path, del_conf);
            assert_eq!((d.code, &d.out), (0, &Value::Null));
            assert!(!node.run(&["iptables-save", "-t", "nat"]).1.contains(&format!(
                "-s {}/32",
                a.out["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap()
            )));
        }
        drop(c2);
        assert_eq!(cni(&node, &ours(), "DEL", "ctr-b", Some("/run/netns/gone-already"), &path, &conf).code, 0);
        assert_eq!(cni(&node, &ours(), "DEL", "ctr-never", None, &path, &conf).code, 0);
        assert!(!links(&node).contains("veth"), "no veth left: {}", links(&node));
        assert!(!node.run(&["iptables-save", "-t", "nat"]).1.contains("CNI-"), "no NAT chain left");
        assert!(!c1.run(&["ip", "-o", "link"]).1.contains("eth0"));
        let reserved = std::fs::read_dir(net.data.path().join(format!("ppt{}", net.k)))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok()))
            .count();
        assert_eq!(reserved, 0);
    }
    assert_eq!(host_state(), before, "the host namespace changed");
}

#[test]
fn failed_adds_leave_nothing_behind() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    {
        let node = Ns::new("n");
        let c = Ns::new("c");
        let net = Net::new();
        let path = bin_dir();
        // IPAM plugin not in CNI_PATH, or an IPAM config it refuses: nothing at all is created
        // in the node's namespace (not even the bridge).
        let mut conf = net.conf("podpath-bridge", "no-such-ipam", "1.0.0");
        let empty = links(&node);
        let r = cni(&node, &ours(), "ADD", "ctr-x", Some(&c.path()), &path, &conf);
        assert_eq!((r.code, r.out["code"].as_u64()), (1, Some(105)), "{}", r.out);
        let mut bad = net.conf("podpath-bridge", "podpath-ipam", "1.0.0");
        bad["ipam"]["ranges"] = json!([[{"subnet": net.subnet(), "gateway": "10.1.2.3"}]]);
        assert_eq!(cni(&node, &ours(), "ADD", "ctr-y", Some(&c.path()), &path, &bad).out["code"], 7);
        assert_eq!(links(&node), empty, "a failed ADD changed the node's links");
        assert!(!links(&c).contains("eth0"));
        // An exhausted pool: same.
        conf = net.conf("podpath-bridge", "podpath-ipam", "1.0.0");
        conf["ipam"]["ranges"] = json!([[{"subnet": net.subnet(), "rangeStart": format!("{}.2", net.prefix()), "rangeEnd": format!("{}.2", net.prefix())}]]);
        assert_eq!(cni(&node, &ours(), "ADD", "ctr-1", Some(&c.path()), &path, &conf).code, 0);
        let c2 = Ns::new("d");
        let r = cni(&node, &ours(), "ADD", "ctr-2", Some(&c2.path()), &path, &conf);
        assert_eq!(r.out["code"], 102, "{}", r.out);
        assert!(!links(&c2).contains("eth0"));
        assert_eq!(links(&node).matches("veth").count(), 1, "only ctr-1's veth: {}", links(&node));
        // STATUS says the pool is full.
        let s = cni(
            &node,
            &ours(),
            "STATUS",
            "",
            None,
            &path,
            &json!({"cniVersion": "1.1.0", "name": conf["name"], "type": "podpath-bridge", "ipam": conf["ipam"]}),
        );
        assert_eq!(s.out["code"], 50, "{}", s.out);
        // A netns that does not exist: nothing is created.
        let r = cni(&node, &ours(), "ADD", "ctr-3", Some("/run/netns/ppc-does-not-exist"), &path, &conf);
        assert_eq!(r.code, 1);
        // Bad input changes nothing either.
        let mut bad = conf.clone();
        bad["ipam"]["ranges"] = json!([[{"subnet": net.subnet(), "gateway": "10.1.2.3"}]]);
        assert_eq!(cni(&node, &ours(), "ADD", "ctr-4", Some(&c2.path()), &path, &bad).out["code"], 7);
        assert_eq!(cni(&node, &ours(), "DEL", "ctr-1", Some(&c.path()), &path, &conf).code, 0);
        assert!(!links(&node).contains("veth"));
    }
    assert_eq!(host_state(), before, "the host namespace changed");
}

#[test]
fn twenty_concurrent_adds() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    {
        let node = Ns::new("n");
        let net = Net::new();
        let conf = net.conf("podpath-bridge", "podpath-ipam", "1.0.0");
        let path = bin_dir();
        let containers: Vec<Ns> = (0..20).map(|_| Ns::new("c")).collect();
        let results: Vec<Plugin> = std::thread::scope(|s| {
            let hs: Vec<_> = containers
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let (node, conf, path) = (&node, &conf, &path);
                    s.spawn(move || cni(node, &ours(), "ADD", &format!("ctr-{i}"), Some(&c.path()), path, conf))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut ips: Vec<String> = results
            .iter()
            .map(|r| {
                assert_eq!(r.code, 0, "{}", r.out);
                r.out["ips"][0]["address"].as_str().unwrap().to_string()
            })
            .collect();
        ips.sort();
        ips.dedup();
        assert_eq!(ips.len(), 20);
        let last = ips.last().unwrap().split('/').next().unwrap().to_string();
        let (ok, out) = containers[0].run(&["ping", "-c1", "-W2", &last]);
        assert!(ok, "{out}");
        for (i, c) in containers.iter().enumerate() {
            assert_eq!(cni(&node, &ours(), "DEL", &format!("ctr-{i}"), Some(&c.path()), &path, &conf).code, 0);
        }
        assert!(!links(&node).contains("veth"));
    }
    assert_eq!(host_state(), before, "the host namespace changed");
}

/// Masks what is random by nature (MACs, veth names, the sandbox path).
fn mask(mut v: Value) -> Value {
    for i in v["interfaces"].as_array_mut().into_iter().flatten() {
        i["mac"] = json!("MAC");
        if i["name"].as_str().is_some_and(|n| n.starts_with("veth")) {
            i["name"] = json!("VETH");
        }
        if i.get("sandbox").is_some() {
            i["sandbox"] = json!("SANDBOX");
        }
    }
    v
}

fn nat_rules(node: &Ns) -> Vec<String> {
    let mut v: Vec<String> = node
        .run(&["iptables-save", "-t", "nat"])
        .1
        .lines()
        .filter(|l| l.contains("CNI-"))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn matches_the_reference_bridge_and_mixes_with_it() {
    if !root_or_explain() {
        return;
    }
    assert!(Path::new(&format!("{REFERENCE}/bridge")).exists(), "install containernetworking-plugins (.ci/run does)");
    let before = host_state();
    {
        let path = format!("{}:{REFERENCE}", bin_dir());
        // Same config, same container id, one node namespace each: identical results and state.
        let (node_o, node_r) = (Ns::new("o"), Ns::new("r"));
        let (c_o, c_r) = (Ns::new("co"), Ns::new("cr"));
        let net = Net::new();
        let mut conf_o = net.conf("podpath-bridge", "podpath-ipam", "1.0.0");
        let data_r = tempfile::tempdir().unwrap();
        let mut conf_r = net.conf("bridge", "host-local", "1.0.0");
        conf_r["ipam"]["dataDir"] = json!(data_r.path());
        conf_o["dns"] = json!({"nameservers": ["10.96.0.10"]});
        conf_r["dns"] = conf_o["dns"].clone();
        let o = cni(&node_o, &ours(), "ADD", "ctr-1", Some(&c_o.path()), &path, &conf_o);
        let r = cni(&node_r, &format!("{REFERENCE}/bridge"), "ADD", "ctr-1", Some(&c_r.path()), &path, &conf_r);
        assert_eq!((o.code, r.code), (0, 0), "ours {} reference {}", o.out, r.out);
        assert_eq!(mask(o.out.clone()), mask(r.out.clone()));
        assert_eq!(nat_rules(&node_o), nat_rules(&node_r), "NAT rules");
        let state = |c: &Ns| -> String {
            let addr = c.run(&["ip", "-4", "-o", "addr", "show", "eth0"]).1;
            let addr: Vec<&str> = addr.split_whitespace().filter(|w| w.contains('/')).collect();
            addr.join(" ") + "\n" + &c.run(&["ip", "route"]).1
        };
        assert_eq!(state(&c_o), state(&c_r), "container addresses and routes");
        assert_eq!(cni(&node_o, &ours(), "DEL", "ctr-1", Some(&c_o.path()), &path, &conf_o).code, 0);
        assert_eq!(
            cni(&node_r, &format!("{REFERENCE}/bridge"), "DEL", "ctr-1", Some(&c_r.path()), &path, &conf_r).code,
            0
        );

        // Cross combinations: ours + reference host-local, reference bridge + ours.
        let node = Ns::new("x");
        let (c1, c2) = (Ns::new("x1"), Ns::new("x2"));
        let net2 = Net::new();
        let ours_with_ref_ipam = net2.conf("podpath-bridge", "host-local", "1.0.0");
        let a = cni(&node, &ours(), "ADD", "mix-1", Some(&c1.path()), &path, &ours_with_ref_ipam);
        assert_eq!(a.code, 0, "{}", a.out);
        let ref_with_our_ipam = net2.conf("bridge", "podpath-ipam", "1.0.0");
        let b = cni(&node, &format!("{REFERENCE}/bridge"), "ADD", "mix-2", Some(&c2.path()), &path, &ref_with_our_ipam);
        assert_eq!(b.code, 0, "{}", b.out);
        // They share the bridge and the store format: distinct addresses, and they reach each other.
        assert_ne!(a.out["ips"][0]["address"], b.out["ips"][0]["address"]);
        let ip_b = b.out["ips"][0]["address"].as_str().unwrap().split('/').next().unwrap().to_string();
        let (ok, out) = c1.run(&["ping", "-c1", "-W2", &ip_b]);
        assert!(ok, "{out}");
        assert_eq!(cni(&node, &ours(), "DEL", "mix-1", Some(&c1.path()), &path, &ours_with_ref_ipam).code, 0);
        assert_eq!(
            cni(&node, &format!("{REFERENCE}/bridge"), "DEL", "mix-2", Some(&c2.path()), &path, &ref_with_our_ipam)
                .code,
            0
        );
    }
    assert_eq!(host_state(), before, "the host namespace changed");
}
