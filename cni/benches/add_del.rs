//! ADD+DEL of 100 containers with podpath-bridge + podpath-ipam and with the reference
//! bridge + host-local (`/usr/lib/cni`), side by side in one run (`cargo bench -p podpath-cni`,
//! as root). Each side gets its own node namespace, bridge and subnet; containers are
//! namespaces created before timing starts. Target: ours ≤ 0.5× the reference's time.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

const N: usize = 100;

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).status().map(|s| s.success()).unwrap_or(false)
}

struct Ns(String);
impl Ns {
    fn new(name: String) -> Ns {
        assert!(sh(&["ip", "netns", "add", &name]), "ip netns add {name} (run as root)");
        Ns(name)
    }
}
impl Drop for Ns {
    fn drop(&mut self) {
        sh(&["ip", "netns", "del", &self.0]);
    }
}

/// Runs a plugin from the current thread's network namespace (the node's), as a runtime does.
fn cni(plugin: &str, cmd: &str, id: &str, netns: &str, path: &str, conf: &[u8]) -> Vec<u8> {
    let mut child = Command::new(plugin)
        .env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", path)
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(conf).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{plugin} {cmd} {id}: {}", String::from_utf8_lossy(&o.stdout));
    o.stdout
}

/// Times ADD then DEL (with the ADD result as prevResult, as libcni sends it) of N containers,
/// from a thread inside a node namespace of its own; returns (add, del).
fn run(tag: &str, bridge_bin: &str, ipam: &str, path: &str, subnet: &str) -> (Duration, Duration) {
    let pid = std::process::id() % 10000;
    let node = Ns::new(format!("ppbench{tag}{pid}n"));
    let containers: Vec<Ns> = (0..N).map(|i| Ns::new(format!("ppbench{tag}{pid}c{i}"))).collect();
    let data = tempfile::tempdir().unwrap();
    let conf = json!({"cniVersion": "1.0.0", "name": format!("ppbench{tag}"), "type": "bridge", "bridge": format!("ppbb{tag}{pid}"),
                      "isGateway": true, "ipMasq": true,
                      "ipam": {"type": ipam, "dataDir": data.path(), "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}]}});
    let node_path = format!("/run/netns/{}", node.0);
    std::thread::scope(|s| {
        s.spawn(|| {
            // Only this thread enters the node namespace; its children inherit it.
            netns_rs::get_from_path(&node_path).unwrap().enter().unwrap();
            let bytes = conf.to_string();
            let t = Instant::now();
            let mut results = Vec::new();
            for (i, c) in containers.iter().enumerate() {
                results.push(cni(
                    bridge_bin,
                    "ADD",
                    &format!("ctr-{i}"),
                    &format!("/run/netns/{}", c.0),
                    path,
                    bytes.as_bytes(),
                ));
            }
            let add = t.elapsed();
            let t = Instant::now();
            for (i, (c, res)) in containers.iter().zip(&results).enumerate() {
                let mut del = conf.clone();
                del["prevResult"] = serde_json::from_slice(res).unwrap();
                cni(
                    bridge_bin,
                    "DEL",
                    &format!("ctr-{i}"),
                    &format!("/run/netns/{}", c.0),
                    path,
                    del.to_string().as_bytes(),
                );
            }
            (add, t.elapsed())
        })
        .join()
        .unwrap()
    })
}

fn main() {
    let exe = std::env::current_exe().unwrap();
    let bins = exe.parent().and_then(|p| p.parent()).unwrap();
    let ours = bins.join("podpath-bridge");
    assert!(ours.exists(), "{} is missing", ours.display());
    assert!(std::path::Path::new("/usr/lib/cni/bridge").exists(), "install containernetworking-plugins");
    let path = format!("{}:/usr/lib/cni", bins.display());
    println!(
        "CNI ADD+DEL of {N} containers (bridge + IPAM + ipMasq, cniVersion 1.0.0), {} cores",
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    );
    let (oa, od) = run("o", ours.to_str().unwrap(), "podpath-ipam", &path, "10.250.0.0/24");
    let (ra, rd) = run("r", "/usr/lib/cni/bridge", "host-local", &path, "10.251.0.0/24");
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "podpath-bridge + podpath-ipam: ADD {:.0} ms ({:.2} ms each), DEL {:.0} ms, total {:.0} ms",
        ms(oa),
        ms(oa) / N as f64,
        ms(od),
        ms(oa + od)
    );
    println!(
        "reference bridge + host-local: ADD {:.0} ms ({:.2} ms each), DEL {:.0} ms, total {:.0} ms",
        ms(ra),
        ms(ra) / N as f64,
        ms(rd),
        ms(ra + rd)
    );
    println!("ratio ours/reference: {:.2} (target <= 0.5)", ms(oa + od) / ms(ra + rd));
}
