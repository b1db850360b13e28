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

/// The least time between two collections by one runtime thread ([`collect_when_idle`]).
const COLLECT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Gives back what the calling thread freed, as an async runtime's thread goes idle (its
/// runtime's `on_thread_park`). mimalloc keeps a thread's freed pages in that thread's heap
/// until the same thread allocates again or asks, and [`purge_freed_memory`]'s thread can
/// only ask for its own: a runtime thread that parked after the start's burst (the Python
/// runtime's 154 MB module read, hashed, validated and stored) kept several MiB of it. A
/// busy runtime parks thousands of times a second, so a thread asks at most once every
/// [`COLLECT_EVERY`]; an idle one still wakes for its timers and asks then.
pub fn collect_when_idle() {
    use std::cell::Cell;
    use std::time::Instant;
    thread_local!(static LAST: Cell<Option<Instant>> = const { Cell::new(None) });
    let now = Instant::now();
    let collect = LAST.with(|last| {
        let collect = due(last.get(), now);
        if collect {
            last.set(Some(now));
        }
        collect
    });
    if collect {
        // SAFETY: no arguments to uphold; it only frees what is already free.
        unsafe { libmimalloc_sys::mi_collect(false) };
    }
}

/// Whether a thread that last collected at `last` collects again at `now`.
fn due(last: Option<std::time::Instant>, now: std::time::Instant) -> bool {
    last.is_none_or(|at| now.saturating_duration_since(at) >= COLLECT_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_thread_collects_at_its_first_park_then_at_most_once_every_100_ms() {
        let start = Instant::now();
        assert!(due(None, start));
        assert!(!due(Some(start), start));
        assert!(!due(Some(start), start + Duration::from_millis(99)));
        assert!(due(Some(start), start + COLLECT_EVERY));
        assert!(due(Some(start), start + Duration::from_secs(5)));
    }
}
