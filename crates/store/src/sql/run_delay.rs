//! How long the calling thread has waited, runnable, for a core while other threads ran
//! on it: the kernel's `run_delay` (`/proc/thread-self/schedstat`, its second field).
//!
//! The writer, looking for its next write, yields its core between looks; a yield that
//! returns late either ran other threads meanwhile or lost the core to something the guest
//! does not schedule (the hypervisor running another machine's vCPU, or the whole process
//! stopped). Only the first says that this machine's threads want the core. The thread's
//! run delay grows only while it is runnable and waits on its core's run queue, that is
//! while others run there instead, so it is what the look measures; the time a yield took
//! is only the fallback where the kernel does not tell (not Linux, or a kernel built
//! without scheduler statistics).

use std::cell::OnceCell;
use std::fs::File;
use std::time::Duration;

thread_local! {
    /// This thread's own `schedstat`, opened on first use (`thread-self` resolves to the
    /// thread that opens it), or `None` where it cannot be read.
    static SCHEDSTAT: OnceCell<Option<File>> = const { OnceCell::new() };
}

/// The calling thread's run delay so far, if the kernel tells it.
fn run_delay() -> Option<Duration> {
    SCHEDSTAT.with(|schedstat| {
        let file = schedstat
            .get_or_init(|| File::open("/proc/thread-self/schedstat").ok())
            .as_ref()?;
        read_run_delay(file)
    })
}

#[cfg(unix)]
fn read_run_delay(file: &File) -> Option<Duration> {
    use std::os::unix::fs::FileExt;
    // Three decimal numbers: time on a core, run delay and time slices.
    let mut buf = [0u8; 96];
    let read = file.read_at(&mut buf, 0).ok()?;
    parse(buf.get(..read)?)
}

#[cfg(not(unix))]
fn read_run_delay(_: &File) -> Option<Duration> {
    None
}

/// The run delay, in nanoseconds, of a `schedstat` line.
fn parse(line: &[u8]) -> Option<Duration> {
    let line = std::str::from_utf8(line).ok()?;
    let nanos = line.split_ascii_whitespace().nth(1)?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// The calling thread's run delay, read once and compared with each later reading.
pub(super) struct RunDelay(Option<Duration>);

impl RunDelay {
    /// Reads the calling thread's run delay now.
    pub(super) fn now() -> Self {
        RunDelay(run_delay())
    }

    /// How long other threads had this thread's core, while it wanted it, since the last
    /// reading (and reads again). Where the kernel does not tell, `took`: the time of the
    /// late yield that asks.
    pub(super) fn given_since(&mut self, took: Duration) -> Duration {
        let now = run_delay();
        let given = match (self.0, now) {
            (Some(before), Some(now)) => now.saturating_sub(before),
            _ => took,
        };
        self.0 = now;
        given
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_run_delay_is_the_second_number_of_the_line() {
        assert_eq!(
            parse(b"108882713 1426753 5\n"),
            Some(Duration::from_nanos(1_426_753))
        );
        assert_eq!(parse(b"108882713\n"), None);
        assert_eq!(parse(b"108882713 -3 5\n"), None);
        assert_eq!(parse(b"\xff\xfe 1 2"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_thread_that_yields_to_a_busy_thread_on_its_core_waits_for_it() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier};
        // Both threads on one core: the yield has another thread to run.
        // SAFETY: a zeroed cpu_set_t is the empty set; sched_setaffinity gets a whole set
        // for the calling thread (pid 0).
        let pin = || unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        let stop = Arc::new(AtomicBool::new(false));
        let started = Arc::new(Barrier::new(2));
        let spinner = {
            let (stop, started) = (stop.clone(), started.clone());
            std::thread::spawn(move || {
                assert_eq!(pin(), 0);
                started.wait();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        assert_eq!(pin(), 0);
        started.wait();
        let mut delay = RunDelay::now();
        assert!(delay.0.is_some(), "this kernel tells no run delay");
        let mut given = Duration::ZERO;
        for _ in 0..20 {
            std::thread::yield_now();
            given += delay.given_since(Duration::ZERO);
        }
        stop.store(true, Ordering::Relaxed);
        spinner.join().unwrap();
        // Each yield ran the spinner for a time slice (milliseconds); the fallback's
        // `took` was zero, so only a real reading adds up.
        assert!(given >= Duration::from_millis(1), "gave {given:?}");
    }
}
