//! `podpath` is also every program of the lab, and so runs as every one of its ~100 processes
//! (`multicall`): linked as a position-dependent executable, its relocated read-only data
//! (2.3 MiB) stays clean pages shared by all of them instead of being copied into each. The
//! code is still compiled PIC; only the link changes. The marker asks the workspace's linker
//! (`scripts/cc`) to link it statically as well, so no process has the dynamic loader's
//! private copies of the GOT and of libc's data (~100 KiB each).
fn main() {
    println!("cargo:rustc-link-arg-bin=podpath=-no-pie");
    println!("cargo:rustc-link-arg-bin=podpath=-Wl,-z,podpath-static");
}
