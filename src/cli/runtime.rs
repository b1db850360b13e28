//! How many threads each process's async runtime gets.
//!
//! tokio's default is one per core (or `TOKIO_WORKER_THREADS`), right for a process that
//! has its machine, or its pod's share of one, to itself. `toolgrid up` does not: the
//! control plane, the store's writer and syncer threads, and each local worker with its
//! guests' threads share the machine's cores, and a call passes between them about ten
//! times. On the two cores of BENCHMARKS.md a runtime thread per core in each process had
//! woken threads waiting for a core more than they ran, and `toolgrid bench calls` ran
//! faster with fewer (BENCHMARKS.md, "Fewer runtime threads where processes share a
//! machine").

/// A process's runtime threads, where they are not tokio's default: `--runtime-threads`
/// when given; for `toolgrid up` without it, half of the machine's `cores` (at least one),
/// unless `TOKIO_WORKER_THREADS` is set (`env_threads`), which tokio then follows.
pub fn threads(
    given: Option<usize>,
    shares_machine: bool,
    cores: usize,
    env_threads: bool,
) -> Option<usize> {
    match given {
        Some(threads) => Some(threads.max(1)),
        None if shares_machine && !env_threads => Some((cores / 2).max(1)),
        None => None,
    }
}

/// The machine's cores, as the runtime would count them.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_sharing_its_machine_takes_half_the_cores_unless_told() {
        // `toolgrid up`: half, at least one.
        assert_eq!(threads(None, true, 2, false), Some(1));
        assert_eq!(threads(None, true, 1, false), Some(1));
        assert_eq!(threads(None, true, 16, false), Some(8));
        // Told, by flag or by tokio's variable.
        assert_eq!(threads(Some(3), true, 2, false), Some(3));
        assert_eq!(threads(Some(0), false, 2, false), Some(1));
        assert_eq!(threads(None, true, 2, true), None);
        // A process with its machine (or pod) to itself keeps tokio's default.
        assert_eq!(threads(None, false, 16, false), None);
        assert_eq!(threads(Some(2), false, 16, false), Some(2));
    }
}
