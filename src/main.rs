//! The `toolgrid` binary: every subcommand lives in [`toolgrid::cli`].

/// mimalloc rather than glibc's malloc: a call allocates on one thread and frees on another
/// (the store writer, the runtimes' workers, the guests' threads), where glibc's per-thread
/// arenas contend on their locks and consolidate their bins (a tenth of the platform's CPU
/// under load; BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Gives freed memory back to the system in an idle process too: mimalloc returns what was
/// freed a second after (its purge delay), but only when the allocator next runs, which an
/// idle process may not do for long. A thread asks it to once a second.
fn purge_freed_memory() {
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

fn main() -> std::process::ExitCode {
    purge_freed_memory();
    toolgrid::cli::main()
}
