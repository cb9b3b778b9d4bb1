//! The real `podpath-ipam` binary, run the way a runtime runs it (env + stdin, result on
//! stdout), and compared with Debian's reference `host-local` (`/usr/lib/cni`). No root needed:
//! IPAM only touches its store, which lives in a temporary `dataDir`.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};

const REFERENCE_HOST_LOCAL: &str = "/usr/lib/cni/host-local";

struct Run {
    code: i32,
    out: Value,
}

fn run(plugin: &str, cmd: &str, id: &str, conf: &Value, extra_env: &[(&str, &str)]) -> Run {
    let mut c = Command::new(plugin);
    c.env_clear()
        .env("CNI_COMMAND", cmd)
        .env("CNI_PATH", "/usr/lib/cni")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !id.is_empty() {
        c.env("CNI_CONTAINERID", id).env("CNI_NETNS", "/run/netns/none").env("CNI_IFNAME", "eth0");
    }
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let mut child = c.spawn().expect("plugin runs");
    child.stdin.take().unwrap().write_all(conf.to_string().as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    let out =
        if o.stdout.is_empty() { Value::Null } else { serde_json::from_slice(&o.stdout).expect("stdout is JSON") };
    Run { code: o.status.code().unwrap_or(-1), out }
}

fn ours() -> &'static str {
    env!("CARGO_BIN_EXE_podpath-ipam")
}

fn conf(version: &str, data_dir: &Path, subnet: &str) -> Value {
    json!({"cniVersion": version, "name": "ipamtest", "type": "podpath-bridge",
           "ipam": {"type": "podpath-ipam", "dataDir": data_dir, "ranges": [[{"subnet": subnet}]], "routes": [{"dst": "0.0.0.0/0"}]}})
}

#[test]
fn lifecycle_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.1.0", dir.path(), "10.77.0.0/29");
    let add = run(ours(), "ADD", "ctr-a", &c, &[]);
    assert_eq!(add.code, 0, "{}", add.out);
    assert_eq!(
        add.out,
        json!({"cniVersion": "1.1.0", "ips": [{"address": "10.77.0.2/29", "gateway": "10.77.0.1"}],
                               "routes": [{"dst": "0.0.0.0/0"}], "dns": {}})
    );
    // The store is host-local's format.
    assert_eq!(std::fs::read_to_string(dir.path().join("ipamtest/10.77.0.2")).unwrap(), "ctr-a\r\neth0");
    let dup = run(ours(), "ADD", "ctr-a", &c, &[]);
    assert_eq!((dup.code, dup.out["code"].as_u64()), (1, Some(101)));
    let mut with_prev = c.clone();
    with_prev["prevResult"] = add.out.clone();
    assert_eq!(run(ours(), "CHECK", "ctr-a", &with_prev, &[]).code, 0);
    assert_eq!(run(ours(), "CHECK", "ctr-a", &c, &[]).out["code"], 7, "CHECK without prevResult");
    for id in ["b", "c", "d", "e"] {
        assert_eq!(run(ours(), "ADD", id, &c, &[]).code, 0);
    }
    let status = run(ours(), "STATUS", "", &c, &[]);
    assert_eq!((status.code, status.out["code"].as_u64()), (1, Some(50)));
    let full = run(ours(), "ADD", "f", &c, &[]);
    assert_eq!(full.out["code"], 102);
    assert!(full.out["msg"].as_str().unwrap().contains("no IP addresses available in range set 10.77.0.1-10.77.0.6"));
    // DEL twice, and DEL of something never added, all succeed and print nothing.
    for id in ["b", "b", "never"] {
        let d = run(ours(), "DEL", id, &c, &[]);
        assert_eq!((d.code, &d.out), (0, &Value::Null));
    }
    assert_eq!(run(ours(), "STATUS", "", &c, &[]).code, 0);
    let mut gc = c.clone();
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "ctr-a", "ifname": "eth0"}]);
    assert_eq!(run(ours(), "GC", "", &gc, &[]).code, 0);
    let left: Vec<String> = std::fs::read_dir(dir.path().join("ipamtest"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
        .collect();
    assert_eq!(left, vec!["10.77.0.2"]);
    // Older versions get their own result format.
    let old = run(ours(), "ADD", "v04", &conf("0.4.0", dir.path(), "10.77.0.0/29"), &[]);
    assert_eq!(old.out["ips"][0]["version"], "4");
    assert_eq!(old.out["cniVersion"], "0.4.0");
}

#[test]
fn errors_have_distinct_codes_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.0.0", dir.path(), "10.78.0.0/24");
    // (config, extra env, command, expected code)
    type Case<'a> = (Value, Vec<(&'a str, &'a str)>, &'a str, u64);
    let cases: Vec<Case> = vec![
        (c.clone(), vec![("CNI_IFNAME", "a-very-long-ifname")], "ADD", 4),
        (c.clone(), vec![("CNI_ARGS", "FOO=bar")], "ADD", 4),
        (json!("not an object"), vec![], "ADD", 6),
        (json!({"cniVersion": "0.2.0", "name": "x"}), vec![], "ADD", 1),
        (
            json!({"cniVersion": "1.0.0", "name": "x", "ipam": {"type": "podpath-ipam", "dataDir": dir.path(),
                 "ranges": [[{"subnet": "10.78.0.0/24", "gateway": "10.79.0.1"}]]}}),
            vec![],
            "ADD",
            7,
        ),
        (
            json!({"cniVersion": "1.0.0", "name": "../escape", "ipam": {"type": "podpath-ipam", "subnet": "10.78.0.0/24"}}),
            vec![],
            "ADD",
            7,
        ),
        (c.clone(), vec![], "GC", 1),
        (c.clone(), vec![("CNI_ARGS", "IgnoreUnknown=1;IP=10.99.0.1")], "ADD", 103),
    ];
    for (conf, env, cmd, want) in cases {
        let r = run(ours(), cmd, "ctr-x", &conf, &env);
        assert_eq!((r.code, r.out["code"].as_u64()), (1, Some(want)), "{cmd} {conf} {env:?}: {}", r.out);
        assert!(r.out["msg"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // Every store directory a failed ADD may have created holds no reservation.
    let mut reserved = 0;
    for net in std::fs::read_dir(dir.path()).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(net.path()).into_iter().flatten().flatten() {
            if f.file_name().to_str().is_some_and(|n| n.parse::<std::net::IpAddr>().is_ok()) {
                reserved += 1;
            }
        }
    }
    assert_eq!(reserved, 0, "failed ADDs reserved nothing");
    let v = run(ours(), "VERSION", "", &json!({"cniVersion": "0.3.1"}), &[]);
    assert_eq!(
        v.out,
        json!({"cniVersion": "0.3.1", "supportedVersions": ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
}

#[test]
fn twenty_concurrent_adds_get_distinct_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let c = conf("1.0.0", dir.path(), "10.80.0.0/24");
    let results: Vec<Run> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..20)
            .map(|i| {
                let c = &c;
                s.spawn(move || run(ours(), "ADD", &format!("ctr-{i}"), c, &[]))
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
}

/// Same requests to ours and to the reference host-local (cniVersion 1.0.0, the newest the
/// Debian package speaks): identical results, identical store files, and each can read the
/// other's store.
#[test]
fn matches_the_reference_host_local() {
    assert!(
        Path::new(REFERENCE_HOST_LOCAL).exists(),
        "{REFERENCE_HOST_LOCAL} is missing: apt-get install containernetworking-plugins (.ci/run does)"
    );
    let ours_dir = tempfile::tempdir().unwrap();
    let ref_dir = tempfile::tempdir().unwrap();
    let mk = |d: &Path, t: &str| {
        json!({"cniVersion": "1.0.0", "name": "difftest", "type": "bridge",
               "ipam": {"type": t, "dataDir": d, "ranges": [[{"subnet": "10.81.0.0/29", "rangeStart": "10.81.0.3"}]],
                        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "192.168.0.0/16", "gw": "10.81.0.1"}]}})
    };
    let (co, cr) = (mk(ours_dir.path(), "podpath-ipam"), mk(ref_dir.path(), "host-local"));
    let script = [
        ("ADD", "a"),
        ("ADD", "b"),
        ("DEL", "a"),
        ("ADD", "c"),
        ("ADD", "d"),
        ("ADD", "e"),
        ("DEL", "never"),
        ("DEL", "b"),
        ("ADD", "f"),
    ];
    for (cmd, id) in script {
        let o = run(ours(), cmd, id, &co, &[]);
        let r = run(REFERENCE_HOST_LOCAL, cmd, id, &cr, &[]);
        assert_eq!(o.code, r.code, "{cmd} {id}: ours {} reference {}", o.out, r.out);
        if o.code == 0 {
            assert_eq!(o.out, r.out, "{cmd} {id}");
        }
    }
    let files = |d: &Path| -> Vec<(String, String)> {
        let mut v: Vec<_> = std::fs::read_dir(d.join("difftest"))
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != "lock")
            .map(|e| (e.file_name().into_string().unwrap(), std::fs::read_to_string(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(files(ours_dir.path()), files(ref_dir.path()));
    // The reference releases what ours reserved, and the other way round.
    assert_eq!(run(REFERENCE_HOST_LOCAL, "DEL", "c", &mk(ours_dir.path(), "host-local"), &[]).code, 0);
    assert_eq!(run(ours(), "DEL", "c", &mk(ref_dir.path(), "podpath-ipam"), &[]).code, 0);
    assert_eq!(files(ours_dir.path()), files(ref_dir.path()));
}
