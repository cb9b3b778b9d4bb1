//! Runs the tests' registry by hand, with the offline busybox pushed as
//! `library/busybox:latest`, until Ctrl-C: `cargo run -p podpath-testkit --example
//! test-registry`, then `podpath up --registry-mirror docker.io=http://ADDR`.

fn main() {
    let reg = podpath_testkit::registry::Registry::start(None);
    reg.push("library/busybox:latest", &podpath_testkit::registry::busybox(), None);
    println!("{}", reg.addr);
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
