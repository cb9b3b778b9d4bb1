//! Root test of `hosts::NetnsSpawner`, which `podpath trace` starts its monitors with: a
//! program it starts runs in the namespace, and one given a parent-death signal gets it when
//! the spawner is dropped (the signal follows the thread that forked).

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use podpath_lab::hosts::NetnsSpawner;
use testkit::netns::{host_state, must, root_or_explain, Netns};

#[test]
fn a_spawned_program_runs_in_the_namespace_and_dies_with_the_spawner() {
    if !root_or_explain() {
        return;
    }
    let before = host_state();
    let ns = Netns::new("spawner");
    let spawner = NetnsSpawner::new(ns.path()).expect("enter the namespace");

    let mut readlink = Command::new("readlink");
    readlink.arg("/proc/self/ns/net").stdout(Stdio::piped());
    let out = spawner.spawn(readlink).expect("spawn").wait_with_output().expect("readlink");
    let inode = must(&["stat", "-L", "-c", "%i", &ns.path()]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!("net:[{}]", inode.trim()));

    let mut sleeper = Command::new("sleep");
    sleeper.arg("60");
    podpath_lab::hosts::die_with_parent(&mut sleeper);
    let mut child = spawner.spawn(sleeper).expect("spawn");
    // Still running while the spawner lives, also after this thread waited a little.
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().expect("try_wait").is_none(), "the program ended with its spawner alive");
    drop(spawner);
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the program outlived its spawner");
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
    let err = NetnsSpawner::new(path.clone()).err().expect("no such namespace");
    assert!(err.to_string().contains(&path), "{err}");
}
