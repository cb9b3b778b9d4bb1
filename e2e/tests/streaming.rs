//! `kubectl exec`, `cp`, `attach`, `run -it --rm` and `port-forward` in a real `podpath up` lab
//! with the real kubectl, over both protocols it speaks: WebSockets (its default) and SPDY (its
//! fallback, forced with KUBECTL_REMOTE_COMMAND_WEBSOCKETS / KUBECTL_PORT_FORWARD_WEBSOCKETS),
//! and what happens on bad input or when the client drops. Root only (CI runs as root).
//!
//! podpath's pods share the node's filesystem, so `kubectl cp` paths are host paths: the test
//! uses a temporary directory of its own.

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use podpath_e2e::{free_port, start_port_forward, text, wait_bounded, Lab};
use testkit::netns::root_or_explain;

/// kubectl against the lab, with the protocol chosen.
fn kubectl(lab: &Lab, spdy: bool, args: &[&str]) -> Command {
    let mut c = Command::new("kubectl");
    c.arg("--kubeconfig").arg(&lab.kubeconfig).args(args);
    if spdy {
        c.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false").env("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false");
    }
    c
}

fn run_with_stdin(mut c: Command, stdin: &str) -> Output {
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
    wait_bounded(child, Duration::from_secs(30))
}

fn output(mut c: Command) -> Output {
    wait_bounded(c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap(), Duration::from_secs(30))
}

/// A command under a pseudo terminal (`script`), as a user at a terminal runs it.
fn in_terminal(lab: &Lab, spdy: bool, line: &str, stdin: &str) -> Output {
    let mut c = Command::new("script");
    c.args(["-qec", line, "/dev/null"]).env("KUBECONFIG", &lab.kubeconfig);
    if spdy {
        c.env("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");
    }
    run_with_stdin(c, stdin)
}

fn curl(port: u16) -> (bool, String) {
    let o = Command::new("curl")
        .args(["-sS", "--max-time", "5"])
        .arg(format!("http://127.0.0.1:{port}/"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    (o.status.success(), format!("{out}{err}"))
}

/// Starts `kubectl port-forward TARGET` with `ports`, returns it once it listens.
fn port_forward(lab: &Lab, spdy: bool, target: &str, ports: &[String]) -> Child {
    let mut args = vec!["port-forward", "--address", "127.0.0.1", target];
    args.extend(ports.iter().map(String::as_str));
    start_port_forward(kubectl(lab, spdy, &args), ports.len())
}

fn stop(mut child: Child) -> String {
    let _ = child.kill();
    let o = child.wait_with_output().unwrap();
    text(&o).1
}

#[test]
fn kubectl_exec_cp_attach_and_run_over_websockets_and_spdy() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("stream", &["--nodes", "1"]).unwrap();
    lab.kubectl(&["run", "web", "--image=podpath/echo", "--port=8080"]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    let dir = tempfile::tempdir().unwrap();
    for spdy in [false, true] {
        let how = if spdy { "SPDY" } else { "WebSocket" };
        // Exit code, stdout and stderr apart.
        let o = output(kubectl(&lab, spdy, &["exec", "web", "--", "sh", "-c", "echo out; echo err >&2; exit 3"]));
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(3), "{how}: {out}{err}");
        assert_eq!(out, "out\n", "{how}");
        assert!(err.starts_with("err\n") && err.contains("command terminated with exit code 3"), "{how}: {err}");
        // It runs in the pod: its hostname and network namespace.
        let o = output(kubectl(&lab, spdy, &["exec", "web", "--", "hostname"]));
        assert_eq!(text(&o).0, "web\n", "{how}");
        // stdin, to its end (v5's close signal over WebSockets, a FIN over SPDY).
        let o = run_with_stdin(
            kubectl(&lab, spdy, &["exec", "-i", "web", "--", "sh", "-c", "wc -l; cat >/dev/null"]),
            "a\nb\nc\n",
        );
        assert_eq!(text(&o).0.trim(), "3", "{how}: {:?}", text(&o));
        // -it at a terminal: a TTY of the client's size; stdin typed at it.
        let o = in_terminal(
            &lab,
            spdy,
            "stty cols 91 rows 17; kubectl exec -it web -- sh -c 'tty; stty size; read l; echo got-$l; exit 4'",
            "typed\n",
        );
        let out = text(&o).0;
        assert!(out.contains("/dev/pts/"), "{how}: {out}");
        assert!(out.contains("17 91"), "{how}: the terminal's size: {out}");
        assert!(out.contains("got-typed"), "{how}: {out}");
        assert_eq!(o.status.code(), Some(4), "{how}: {out}");
        // cp both ways (tar over exec).
        let src = dir.path().join(format!("src-{how}.txt"));
        std::fs::write(&src, format!("payload over {how}\n").repeat(5000)).unwrap();
        let inside = dir.path().join(format!("in-pod-{how}.txt"));
        let o = output(kubectl(&lab, spdy, &["cp", src.to_str().unwrap(), &format!("web:{}", inside.display())]));
        assert!(o.status.success(), "{how}: cp to the pod: {:?}", text(&o));
        assert_eq!(std::fs::read(&inside).unwrap(), std::fs::read(&src).unwrap(), "{how}");
        let back = dir.path().join(format!("back-{how}.txt"));
        let o = output(kubectl(&lab, spdy, &["cp", &format!("web:{}", inside.display()), back.to_str().unwrap()]));
        assert!(o.status.success(), "{how}: cp from the pod: {:?}", text(&o));
        assert_eq!(std::fs::read(&back).unwrap(), std::fs::read(&src).unwrap(), "{how}");
    }

    // attach: to a container reading stdin (its console), then to one that only writes.
    lab.kubectl(&[
        "run",
        "reader",
        "--image=busybox",
        "--stdin",
        "--command",
        "--",
        "sh",
        "-c",
        "while read l; do echo \"got $l\"; done",
    ]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/reader", "--timeout=60s"]);
    let mut c = kubectl(&lab, false, &["attach", "-i", "reader"]);
    let mut child = c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for line in ["one", "two"] {
        writeln!(stdin, "{line}").unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(stdin);
    let o = wait_bounded(child, Duration::from_secs(20));
    let out = text(&o).0;
    assert!(out.contains("got one\ngot two\n"), "attach -i: {out} {}", text(&o).1);
    lab.run_ticker("ticker");
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/ticker", "--timeout=60s"]);
    let o = Command::new("timeout")
        .args(["2", "kubectl", "--kubeconfig"])
        .arg(&lab.kubeconfig)
        .args(["attach", "ticker"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(124), "attach streams until stopped: {:?}", text(&o));
    assert!(text(&o).0.matches("tick ").count() >= 4, "{:?}", text(&o));

    // The tutorial's first line: an interactive throwaway pod, deleted after.
    let o = in_terminal(
        &lab,
        false,
        "kubectl run -it --rm net-test --image=debian --restart=Never --command -- sh",
        "echo inside-$((6*7)); hostname\nexit 7\n",
    );
    let out = text(&o).0;
    assert!(out.contains("inside-42") && out.contains("net-test"), "{out}");
    assert!(out.contains("pod \"net-test\" deleted"), "{out}");
    assert_eq!(o.status.code(), Some(7), "{out}");
}

#[test]
fn kubectl_port_forward_to_a_pod_a_service_and_a_deployment() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("pfwd", &["--nodes", "2"]).unwrap();
    lab.kubectl(&["create", "deployment", "web", "--image=podpath/echo", "--port=8080"]);
    lab.kubectl(&["expose", "deployment", "web", "--port=80", "--target-port=8080"]);
    lab.kubectl(&["rollout", "status", "deployment/web", "--timeout=60s"]);
    let pod = lab.kubectl(&["get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"]);
    for spdy in [false, true] {
        let how = if spdy { "SPDY" } else { "WebSocket" };
        for target in [format!("pod/{pod}"), "svc/web".to_string(), "deploy/web".to_string()] {
            // A service port is mapped to its target port, as kubectl does.
            let remote = if target.starts_with("svc/") { "80" } else { "8080" };
            let a = free_port();
            let b = std::iter::repeat_with(free_port).find(|b| *b != a).unwrap();
            let pf = port_forward(&lab, spdy, &target, &[format!("{a}:{remote}"), format!("{b}:{remote}")]);
            for port in [a, b, a] {
                let (ok, out) = curl(port);
                if !(ok && out.contains("pod: default/web-")) {
                    panic!("{how} {target} via {port}: {out}\nkubectl: {}", stop(pf));
                }
            }
            stop(pf);
        }
        // A port nothing listens on: kubectl's usual error, and it ends instead of hanging.
        let p = free_port();
        let pf = port_forward(&lab, spdy, &format!("pod/{pod}"), &[format!("{p}:81")]);
        let (ok, _) = curl(p);
        assert!(!ok, "{how}: nothing listens on 81");
        let o = wait_bounded(pf, Duration::from_secs(20));
        let err = text(&o).1;
        assert!(
            err.contains("error forwarding port 81 to pod") && err.contains("connect: connection refused"),
            "{how}: {err}"
        );
    }
}

/// Processes on this machine whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

#[test]
fn streaming_refusals_and_dropped_clients_leave_nothing_behind() {
    if !root_or_explain() {
        return;
    }
    let lab = Lab::up("strbad", &["--nodes", "1"]).unwrap();
    lab.kubectl(&["run", "web", "--image=podpath/echo", "--port=8080"]);
    lab.kubectl(&["run", "done", "--image=busybox", "--restart=Never", "--command", "--", "true"]);
    lab.kubectl(&[
        "run",
        "nowhere",
        "--image=podpath/echo",
        "--overrides",
        r#"{"spec":{"nodeSelector":{"no":"such-node"}}}"#,
    ]);
    lab.kubectl(&["wait", "--for=condition=Ready", "pod/web", "--timeout=60s"]);
    lab.kubectl(&["wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/done", "--timeout=60s"]);
    let fails = |spdy: bool, args: &[&str]| {
        let o = output(kubectl(&lab, spdy, args));
        assert!(!o.status.success(), "kubectl {args:?} should fail");
        text(&o).1
    };
    for spdy in [false, true] {
        let err = fails(spdy, &["exec", "web", "-c", "nope", "--", "true"]);
        assert!(err.contains("container nope is not valid for pod web"), "{err}");
        let err = fails(spdy, &["exec", "web", "--", "no-such-program"]);
        assert!(err.contains("\"no-such-program\": executable file not found in $PATH"), "{err}");
        let err = fails(spdy, &["exec", "nowhere", "--", "true"]);
        assert!(err.contains("pod nowhere does not have a host assigned"), "{err}");
        let err = fails(spdy, &["exec", "done", "--", "true"]);
        assert!(err.contains("cannot exec into a container in a completed pod; current phase is Succeeded"), "{err}");
        let err = fails(spdy, &["exec", "ghost", "--", "true"]);
        assert!(err.contains("pods \"ghost\" not found"), "{err}");
    }

    // A client that goes away mid-command: the command's whole process group goes with it.
    for (i, spdy) in [false, true].into_iter().enumerate() {
        let marker = format!("{}.{}{}", 3000 + i, std::process::id(), i);
        let mut child =
            kubectl(&lab, spdy, &["exec", "web", "--", "sh", "-c", &format!("sleep {marker} & sleep {marker}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
        let t = Instant::now();
        while processes_with(&format!("sleep {marker}")).len() < 2 {
            assert!(t.elapsed() < Duration::from_secs(20), "the command never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let t = Instant::now();
        while !processes_with(&format!("sleep {marker}")).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "left running after the client went: {:?}",
                processes_with(&format!("sleep {marker}"))
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Nor does a dropped port-forward leave connections on the node.
    let p = free_port();
    let pf = port_forward(&lab, false, "pod/web", &[format!("{p}:8080")]);
    assert!(curl(p).0);
    stop(pf);
    let t = Instant::now();
    loop {
        let est = lab.exec("node-1", &["ss", "-Htn", "state", "established", "( sport = :10250 or dport = :8080 )"]);
        if est.trim().is_empty() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "connections left on the node: {est}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
