//! Root tests of `hosts::NetnsWorker`, the thread inside a host's namespace that `podpath
//! trace` sends every question for that host to, and starts its monitors with: a program it
//! starts runs in the namespace, and one given a parent-death signal gets it when the worker is
//! dropped (the signal follows the thread that forked); while `NetnsWorkers` run, jobs for
//! their namespaces go to them.

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podpath_lab::hosts::{in_netns_thread, NetnsWorker, NetnsWorkers, Pending};
use testkit::netns::{host_state, must, root_or_explain, Netns};

#[test]
fn a_spawned_program_runs_in_the_namespace_and_dies_with_the_worker() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("worker");
    let worker = NetnsWorker::new(ns.path()).expect("enter the namespace");

    let mut readlink = Command::new("readlink");
    readlink.arg("/proc/self/ns/net").stdout(Stdio::piped());
    let out = worker.spawn(readlink).expect("spawn").wait_with_output().expect("readlink");
    let inode = must(&["stat", "-L", "-c", "%i", &ns.path()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("net:[{}]", inode.trim()));

    let mut sleeper = Command::new("sleep");
    sleeper.arg("60");
    podpath_lab::hosts::die_with_parent(&mut sleeper);
    let mut child = worker.spawn(sleeper).expect("spawn");
    // Still running while the worker lives, also after this thread waited a little.
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().expect("try_wait").is_none(), "the program ended with its worker alive");
    drop(worker);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the program outlived its worker");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(9), "{status:?}");
    drop(ns);
    assert_eq!(host_state(), before, "the host namespace changed");
}

#[test]
fn a_missing_namespace_is_an_error_that_names_it() {
    if !root_or_explain() {
        return;
    }
    let path = format!("/run/netns/{}", testkit::netns::unique("missing"));
    let err = NetnsWorker::new(path.clone()).err().expect("no such namespace");
    assert!(err.to_string().contains(&path), "{err}");
}

/// While workers run, every job for their namespaces goes to them (the same thread each
/// time, inside the namespace; a job's own jobs for its namespace run at once, not queued
/// behind it); once they are dropped, each job gets a thread of its own again.
#[test]
fn jobs_for_a_namespace_go_to_its_worker_while_it_runs() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let (a, b) = (Netns::new("wka"), Netns::new("wkb"));
    let here = || {
        let ino = std::fs::metadata("/proc/thread-self/ns/net").map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        (std::thread::current().id(), ino.unwrap())
    };
    let ino = |p: &str| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let workers = NetnsWorkers::start([a.path(), b.path()]).expect("workers");
    let (t1, ns1) = in_netns_thread(a.path(), here).unwrap();
    let (t2, _) = in_netns_thread(a.path(), here).unwrap();
    let (t3, ns3) = in_netns_thread(b.path(), here).unwrap();
    assert_eq!((t1 == t2, t1 == t3), (true, false));
    assert_eq!((ns1, ns3), (ino(&a.path()), ino(&b.path())));
    let path = a.path();
    let (outer, inner) = in_netns_thread(a.path(), move || (here(), in_netns_thread(path, here).unwrap())).unwrap();
    assert_eq!(outer, inner, "a nested job for the same namespace runs at once, on the worker");
    // Several at once: one per worker, waited for together.
    let pending: Vec<Pending<u64>> =
        [a.path(), b.path()].iter().map(|p| NetnsWorkers::get(p).expect("running").start(move || here().1)).collect();
    let got: Vec<u64> = pending.into_iter().map(|p| p.wait().unwrap()).collect();
    assert_eq!(got, [ino(&a.path()), ino(&b.path())]);
    drop(workers);
    assert!(NetnsWorkers::get(&a.path()).is_none());
    let (t4, ns4) = in_netns_thread(a.path(), here).unwrap();
    assert!(t4 != t1 && ns4 == ino(&a.path()));
    drop((a, b));
    assert_eq!(host_state(), before, "the host namespace changed");
}
