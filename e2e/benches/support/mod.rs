//! What the lab benchmarks share: the lab's API access and waiting for pods to be Ready.
//! Included by each bench with `#[path = "support/mod.rs"] mod support;`.
// Each bench uses a part of it.
#![allow(dead_code)]

use std::time::Duration;

use podpath_e2e::{wait_for, Lab};
use podpath_lab::state::ApiAccess;

/// The lab's REST access (its CA and token).
pub fn api(lab: &Lab) -> ApiAccess {
    let st = podpath_lab::state::load_state(&lab.state).expect("lab state").expect("a lab");
    ApiAccess::of(&st).expect("the lab's API access")
}

/// Waits until `n` pods of `default` are Ready (at most `limit`).
pub fn wait_ready(a: &ApiAccess, n: usize, limit: Duration) {
    wait_for(limit, "pods Ready", || {
        let (_, body) = a.request("GET", "/api/v1/namespaces/default/pods", "").map_err(|e| e.to_string())?;
        let v: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
        let ready = v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|p| {
                        p["status"]["conditions"]
                            .as_array()
                            .is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
                    })
                    .count()
            })
            .unwrap_or(0);
        if ready >= n {
            Ok(())
        } else {
            Err(format!("{ready}/{n} ready"))
        }
    });
}

/// `roots` and every process descending from them, from `/proc`.
pub fn descendants(roots: &[i32]) -> Vec<i32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some(i) = stat.rfind(')') else { continue };
        let ppid: i32 = stat[i + 1..].split_whitespace().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        parent.insert(pid, ppid);
    }
    let mut out: Vec<i32> = roots.to_vec();
    let mut changed = true;
    while changed {
        changed = false;
        for (pid, pp) in &parent {
            if out.contains(pp) && !out.contains(pid) {
                out.push(*pid);
                changed = true;
            }
        }
    }
    out
}

/// A `KEY: N kB` line of `/proc/PID/FILE`, in KiB (0 when absent).
pub fn kib(pid: i32, file: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// CPU time (user + system) a process has used so far, from /proc.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is the 3rd field overall.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    ticks / hz
}
