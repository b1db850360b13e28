//! The `toolgrid` binary: every subcommand lives in [`toolgrid::cli`].

/// mimalloc rather than glibc's malloc: a call allocates on one thread and frees on another
/// (the store writer, the runtimes' workers, the guests' threads), where glibc's per-thread
/// arenas contend on their locks and consolidate their bins (a tenth of the platform's CPU
/// under load; BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    toolgrid::allocator::purge_freed_memory();
    toolgrid::cli::main()
}
