//! What both binaries do with their allocator, mimalloc (each declares it as its
//! `#[global_allocator]`: a library may not choose it for the tests that link this crate).

/// Gives freed memory back to the system in an idle process too: mimalloc returns what was
/// freed a second after (its purge delay), but only when the allocator next runs, which an
/// idle process may not do for long. A thread asks it to once a second.
pub fn purge_freed_memory() {
    let _ = std::thread::Builder::new()
        .name("allocator-purge".into())
        .spawn(|| {
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
                // SAFETY: no arguments to uphold; it only frees what is already free.
                unsafe { libmimalloc_sys::mi_collect(false) };
            }
        });
}
