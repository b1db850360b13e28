//! A tool's progress reports, and the idle deadline they restart.
//!
//! A guest reports progress through `toolgrid.progress` (preview 1) or
//! `toolgrid:tool/progress.report` (components). Each report is:
//! - **bounded**: the message is cut to [`MAX_MESSAGE_BYTES`] (at a character boundary; bytes
//!   that are not UTF-8 become U+FFFD), and a call reports at most [`MAX_EVENTS`] events;
//!   past that, a report is dropped (the guest gets code 1) and neither recorded, streamed
//!   nor counted as progress. Both caps count the same way live and in a replay, so a
//!   replay drops exactly what the live run dropped;
//! - **redacted**: secret values of the call are replaced by their references, and their
//!   encodings (hex, base64, percent-encoding) by `[secret]` (see
//!   [`crate::secrets::CallSecrets::scrub_output`]);
//! - **recorded** as a `progress` oplog entry, buffered like clock readings and committed
//!   with the next commit (before the next outgoing request, or with the result);
//! - **streamed** to the control plane as a `WorkerProgress` with stage `progress`, once,
//!   when it happens live. A replay answers a recorded report from the oplog (no event is
//!   streamed again); one that differs from the recorded message is a replay divergence.
//!   A report streamed and not yet committed when its worker died is reported again by the
//!   replay (callers may see it twice; the oplog has it once);
//! - **progress**: it restarts the run's idle timer ([`IdleTimer`]), up to the hard cap.

use super::http::OplogSink;
use super::recorder::{HostLog, Replayed};
use super::secrets::CallSecrets;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use toolgrid_core::call::{EntryKind, IdleDeadline, OplogEntry, ProgressReport};

/// Longest progress message kept, in bytes.
pub const MAX_MESSAGE_BYTES: usize = ProgressReport::MAX_BYTES;
/// Most progress events one call reports; later reports are dropped.
pub const MAX_EVENTS: u32 = 1000;

/// What became of one report (the guest's return code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reported {
    /// Recorded and streamed (live), or answered from the oplog (replay): code 0.
    Accepted,
    /// Over the per-call cap: dropped, code 1.
    Dropped,
    /// The replay diverged, or the call is being stopped: the guest is stopped.
    Stopped,
}

/// The message of a report as kept: at most [`MAX_MESSAGE_BYTES`], valid UTF-8.
pub fn bounded_message(bytes: &[u8]) -> String {
    ProgressReport::bounded(bytes)
}

/// The idle timer of one run: its deadline, moved by each progress event.
pub struct IdleTimer {
    start: Instant,
    /// `None`: progress does not move the deadline (no idle timeout was given).
    rule: Option<IdleDeadline>,
    /// Milliseconds after `start`.
    deadline_ms: AtomicI64,
}

impl IdleTimer {
    /// A timer that fires `first` from now; each progress event moves it to `idle` after
    /// the event, never past `hard` from now. `idle` zero: progress does not move it.
    pub fn new(first: Duration, idle: Duration, hard: Duration) -> Self {
        let hard = hard.max(first);
        let rule = (!idle.is_zero()).then_some(IdleDeadline {
            timeout_ms: idle.as_millis() as u64,
            max_ms: hard.as_millis() as u64,
            started_ms: 0,
        });
        IdleTimer {
            start: Instant::now(),
            rule,
            deadline_ms: AtomicI64::new(first.as_millis() as i64),
        }
    }

    /// A progress event happened now.
    pub fn touch(&self) {
        let Some(rule) = self.rule else { return };
        let now = self.start.elapsed().as_millis() as i64;
        let _ = self
            .deadline_ms
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |current| {
                Some(rule.extend(current, now))
            });
    }

    /// When the timer fires, as it stands.
    pub fn deadline(&self) -> Instant {
        let ms = self.deadline_ms.load(Ordering::SeqCst).max(0) as u64;
        self.start + Duration::from_millis(ms)
    }

    /// Milliseconds the run may last as it stands (for messages).
    pub fn allowed_ms(&self) -> u64 {
        self.deadline_ms.load(Ordering::SeqCst).max(0) as u64
    }

    /// Runs `future` until it ends or the timer fires (re-armed whenever progress moved
    /// it); `Err(())` when it fired.
    pub async fn run<F: std::future::Future>(&self, future: F) -> Result<F::Output, ()> {
        tokio::pin!(future);
        loop {
            let at = self.deadline();
            tokio::select! {
                out = &mut future => return Ok(out),
                _ = tokio::time::sleep_until(at.into()) => {
                    if self.deadline() <= Instant::now() {
                        return Err(());
                    }
                }
            }
        }
    }
}

/// The progress reports of one run.
pub struct CallProgress {
    log: Arc<HostLog>,
    sink: Arc<dyn OplogSink>,
    secrets: Arc<CallSecrets>,
    timer: Arc<IdleTimer>,
    reports: AtomicU32,
}

impl CallProgress {
    pub fn new(
        log: Arc<HostLog>,
        sink: Arc<dyn OplogSink>,
        secrets: Arc<CallSecrets>,
        timer: Arc<IdleTimer>,
    ) -> Self {
        CallProgress {
            log,
            sink,
            secrets,
            timer,
            reports: AtomicU32::new(0),
        }
    }

    /// Handles one report of `bytes` (the guest's message, already copied out of its
    /// memory, at most a few times [`MAX_MESSAGE_BYTES`]).
    pub async fn report(&self, bytes: &[u8]) -> Reported {
        if self.log.aborted().is_some() {
            return Reported::Stopped;
        }
        if self.reports.fetch_add(1, Ordering::SeqCst) >= MAX_EVENTS {
            return Reported::Dropped;
        }
        // Scrubbed before it is cut, so that a cut cannot leave part of a value unmatched.
        let message = bounded_message(&self.secrets.scrub_output(bytes));
        match self.log.replay_next(EntryKind::Progress) {
            Replayed::Recorded(OplogEntry::Progress(recorded)) if recorded.message == message => {
                Reported::Accepted
            }
            Replayed::Recorded(_) => {
                self.log.diverge(format!(
                    "the tool reported progress {message:?}, not what the oplog recorded"
                ));
                Reported::Stopped
            }
            Replayed::Diverged => Reported::Stopped,
            Replayed::Live => {
                self.log.record(OplogEntry::Progress(ProgressReport {
                    message: message.clone(),
                }));
                self.timer.touch();
                self.sink.progress(message).await;
                Reported::Accepted
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::MemorySink;

    fn reporter(replay: Vec<OplogEntry>) -> (CallProgress, Arc<HostLog>) {
        let log = HostLog::new(replay);
        let timer = Arc::new(IdleTimer::new(
            Duration::from_secs(1),
            Duration::from_secs(1),
            Duration::from_secs(10),
        ));
        let secrets = Arc::new(CallSecrets::new(
            [(
                "token".to_string(),
                toolgrid_core::secret::SecretValue::new("s3cr3t"),
            )]
            .into(),
        ));
        let sink = Arc::new(MemorySink::default());
        (CallProgress::new(log.clone(), sink, secrets, timer), log)
    }

    #[test]
    fn messages_are_cut_at_a_character_boundary_and_made_utf8() {
        assert_eq!(bounded_message(b"step 1"), "step 1");
        let long = "é".repeat(MAX_MESSAGE_BYTES);
        let cut = bounded_message(long.as_bytes());
        assert!(cut.len() <= MAX_MESSAGE_BYTES && cut.len() >= MAX_MESSAGE_BYTES - 1);
        assert!(cut.chars().all(|c| c == 'é'));
        assert_eq!(bounded_message(b"a\xffb"), "a\u{fffd}b");
    }

    #[tokio::test]
    async fn reports_are_recorded_redacted_and_capped() {
        let (progress, log) = reporter(Vec::new());
        assert_eq!(progress.report(b"using s3cr3t").await, Reported::Accepted);
        let recorded = log.take_pending();
        assert_eq!(
            recorded,
            [OplogEntry::Progress(ProgressReport {
                message: "using ${secret:token}".into()
            })]
        );
        for _ in 1..MAX_EVENTS {
            assert_eq!(progress.report(b"x").await, Reported::Accepted);
        }
        assert_eq!(progress.report(b"x").await, Reported::Dropped);
        assert_eq!(log.take_pending().len() as u32, MAX_EVENTS - 1);
    }

    #[tokio::test]
    async fn a_replay_answers_recorded_reports_and_diverges_on_another() {
        let recorded = OplogEntry::Progress(ProgressReport {
            message: "step 1".into(),
        });
        let (progress, log) = reporter(vec![recorded.clone()]);
        assert_eq!(progress.report(b"step 1").await, Reported::Accepted);
        assert!(
            log.take_pending().is_empty(),
            "replayed, not recorded again"
        );
        assert_eq!(progress.report(b"step 2").await, Reported::Accepted);
        assert_eq!(log.take_pending().len(), 1);

        let (progress, log) = reporter(vec![recorded]);
        assert_eq!(progress.report(b"other").await, Reported::Stopped);
        assert!(log.divergence().is_some());
    }

    #[test]
    fn progress_moves_the_timer_up_to_its_hard_cap() {
        let timer = IdleTimer::new(
            Duration::from_millis(100),
            Duration::from_millis(100),
            Duration::from_millis(250),
        );
        assert_eq!(timer.allowed_ms(), 100);
        timer.touch();
        assert!((100..=250).contains(&timer.allowed_ms()));
        // Past the hard cap, progress gives no more time.
        std::thread::sleep(Duration::from_millis(300));
        timer.touch();
        assert_eq!(timer.allowed_ms(), 250);
        // Without an idle timeout, progress moves nothing.
        let fixed = IdleTimer::new(Duration::from_millis(100), Duration::ZERO, Duration::ZERO);
        fixed.touch();
        assert_eq!(fixed.allowed_ms(), 100);
    }
}
