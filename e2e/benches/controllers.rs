//! Controllers benchmark (root; prints figures, asserts nothing about speed). A 3-node lab
//! pulling busybox from a registry on loopback; each figure the median of 3 runs:
//!
//! 1. A StatefulSet of 3 with a claim template (OrderedReady, each claim provisioned on its
//!    pod's node): apply → `kubectl rollout status` done.
//! 2. A DaemonSet: apply → a ready pod on every node; a template change → rolled out.
//! 3. A Job of 10 completions, 5 in parallel (each pod `true`): create → Complete.
//! 4. `podpath node add` → the new node Ready.
//!
//! Run: `cargo build --release --workspace --bins && sudo cargo bench -p podpath-e2e --bench controllers`
//! With `PODPATH_FIGURES=/abs/path/book/perf/figures.tsv` the figures are appended to the
//! book's data.

use std::time::{Duration, Instant};

use podpath_e2e::Lab;
use testkit::registry::{busybox, Registry};

const BENCH: testkit::figures::Bench = testkit::figures::Bench("cargo bench -p podpath-e2e --bench controllers");

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

fn report(figure: &str, runs: Vec<f64>) {
    let m = median(runs.clone());
    let shown: Vec<String> = runs.iter().map(|r| format!("{r:.2}")).collect();
    println!("{figure:<70} median {m:.2} s  ({} s)", shown.join(", "));
    BENCH.record(&format!("{figure}, median of {}", runs.len()), (m * 100.0).round() / 100.0, "s", "");
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let reg = Registry::start(None);
    reg.push("library/busybox:latest", &busybox(), None);
    let mirror = format!("--registry-mirror=docker.io=http://{}", reg.addr);
    let lab = Lab::up("bctl", &["--nodes", "3", &mirror]).expect("podpath up");
    // The image pulled once, so the figures are the controllers' and the kubelet's.
    lab.kubectl(&["run", "warm", "--image=busybox", "--restart=Never", "--", "true"]);
    lab.kubectl(&["wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/warm", "--timeout=60s"]);
    let runs = 3;

    let mut sts = vec![];
    for i in 0..runs {
        let yaml = format!(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: s{i}}}\nspec:\n  serviceName: s{i}\n  replicas: 3\n  selector: {{matchLabels: {{app: s{i}}}}}\n  template:\n    metadata: {{labels: {{app: s{i}}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{{name: c, image: busybox, command: [sleep, '3600'], volumeMounts: [{{name: data, mountPath: /data}}]}}]\n  volumeClaimTemplates:\n  - metadata: {{name: data}}\n    spec: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}\n"
        );
        sts.push(timed(|| {
            lab.apply(&yaml);
            lab.kubectl(&["rollout", "status", &format!("sts/s{i}"), "--timeout=120s"]);
        }));
        lab.kubectl(&["delete", "sts", &format!("s{i}"), "--wait=false"]);
    }
    report("StatefulSet of 3 with a claim each, apply → rolled out (3 nodes)", sts);

    let ds = |i: usize, v: &str| {
        format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: d{i}}}\nspec:\n  selector: {{matchLabels: {{app: d{i}}}}}\n  template:\n    metadata: {{labels: {{app: d{i}}}}}\n    spec:\n      terminationGracePeriodSeconds: 1\n      containers: [{{name: c, image: busybox, command: [sh, -c, 'echo {v}; exec sleep 3600']}}]\n"
        )
    };
    let (mut ds_up, mut ds_roll) = (vec![], vec![]);
    for i in 0..runs {
        ds_up.push(timed(|| {
            lab.apply(&ds(i, "v1"));
            lab.kubectl(&["rollout", "status", &format!("ds/d{i}"), "--timeout=120s"]);
        }));
        ds_roll.push(timed(|| {
            lab.apply(&ds(i, "v2"));
            lab.kubectl(&["rollout", "status", &format!("ds/d{i}"), "--timeout=120s"]);
        }));
        lab.kubectl(&["delete", "ds", &format!("d{i}"), "--wait=false"]);
    }
    report("DaemonSet, apply → a ready pod on each of 3 nodes", ds_up);
    report("DaemonSet, new template → rolled out on 3 nodes (maxUnavailable 1)", ds_roll);

    let mut jobs = vec![];
    for i in 0..runs {
        let yaml = format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j{i}}}\nspec:\n  completions: 10\n  parallelism: 5\n  template:\n    spec:\n      restartPolicy: Never\n      containers: [{{name: c, image: busybox, command: ['true']}}]\n"
        );
        jobs.push(timed(|| {
            lab.apply(&yaml);
            lab.kubectl(&["wait", "--for=condition=complete", &format!("job/j{i}"), "--timeout=120s"]);
        }));
        lab.kubectl(&["delete", "job", &format!("j{i}"), "--wait=false"]);
    }
    report("Job of 10 completions, 5 in parallel, create → Complete", jobs);

    let mut adds = vec![];
    for _ in 0..runs {
        adds.push(timed(|| {
            let (ok, out) = lab.run("node", &["add"]);
            assert!(ok, "{out}");
        }));
    }
    report("podpath node add → the node Ready", adds);
    std::thread::sleep(Duration::from_millis(100));
}
