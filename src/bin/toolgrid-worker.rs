//! The `toolgrid-worker` binary: `toolgrid worker` alone ([`toolgrid::cli::worker_main`]),
//! what a WorkerPool's pods run. It links only what a worker runs, so a worker maps and
//! loads far less of its binary than of `toolgrid` (BENCHMARKS.md).

/// mimalloc, as in `toolgrid` (src/main.rs).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    toolgrid::allocator::purge_freed_memory();
    toolgrid::cli::worker_main()
}
