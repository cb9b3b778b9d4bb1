//! Runs the tests' registry by hand, with the offline busybox and nginx pushed as
//! `library/busybox:latest` and `library/nginx:latest`, until Ctrl-C: `cargo run -p podpath-testkit --example
//! test-registry`, then `podpath up --registry-mirror docker.io=http://ADDR`.

fn main() {
    let reg = podpath_testkit::registry::Registry::start(None);
    reg.push("library/busybox:latest", &podpath_testkit::registry::busybox(), None);
    reg.push("library/nginx:latest", &podpath_testkit::registry::nginx(), None);
    println!("{}", reg.addr);
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}
