//! `podpath-workload` runs as two or three processes per pod (sandbox, a monitor per
//! container): linked as a position-dependent executable, its relocated read-only data stays
//! clean pages shared by all of them instead of ~190 KiB private to each (measured with the
//! images bench). The code is still compiled PIC; only the link changes.
fn main() {
    println!("cargo:rustc-link-arg-bin=podpath-workload=-no-pie");
}
