//! Keeping the server's resident memory near what it uses. glibc's malloc returns freed memory
//! to the kernel only from the top of a heap; after a controller pass over 10,000 objects
//! (lists of JSON values, freed at once) it held on to well over a hundred MiB that nothing
//! used. A thread of the binary's asks it every few seconds to give free pages back
//! (`malloc_trim`). Other C libraries: nothing to do.

/// Starts the trimming thread (`every`: the pause between trims). For the binary: tests and
/// benchmarks that embed the server need none.
pub fn spawn_trimmer(every: std::time::Duration) {
    let spawned = std::thread::Builder::new().name("malloc-trim".into()).spawn(move || loop {
        std::thread::sleep(every);
        trim();
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the memory trimming thread; RSS may stay high after large lists");
    }
}

#[allow(unsafe_code)] // the one C call glibc offers for this; see CONVENTIONS.md
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only takes the allocator's own locks; it is safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
