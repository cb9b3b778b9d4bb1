//! Keeping a daemon's resident memory near what it uses. glibc's malloc returns freed memory
//! to the kernel only from the top of a heap; after a controller pass over 10,000 objects
//! (lists of JSON values, freed at once) the API server held on to well over a hundred MiB
//! that nothing used, and so did the node agent after a cold load of 10,000 Services. The API
//! server's binary asks every few seconds ([`spawn_trimmer`]); the proxier after each full
//! sync ([`trim`]). Other C libraries: nothing to do.

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

/// Gives the heap's free pages back to the kernel now.
#[allow(unsafe_code)] // the one C call glibc offers for this; see CONVENTIONS.md
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only takes the allocator's own locks; it is safe from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Caps the heaps (glibc's arenas) this process's threads allocate from at `max`. glibc gives a
/// thread that meets contention an arena of its own, up to 8 per core, and each arena keeps what
/// its threads freed. The lab's mostly idle daemons (node agent, lb-sim, podpath-dns) take one
/// and kept 0.2–0.5 MiB less each; the API server, whose threads contend, one per core: its REST
/// creates/s stayed within their spread (4,596–5,589/s in 3 runs against 4,753–5,258/s with
/// glibc's 16), where one arena cut them to 3,717/s.
/// Figures: the lab bench's `memory` part and apiserver-lite's bench. Call first thing in
/// `main`, before any thread starts.
#[allow(unsafe_code)] // the C call glibc offers for this; see CONVENTIONS.md
pub fn limit_arenas(max: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a parameter of the allocator under its own lock.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, max.clamp(1, 64) as libc::c_int);
    }
}
