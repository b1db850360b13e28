//! Per-call notifications: progress while a call runs, and its final record.

use crate::metrics::{self, Stage};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use toolgrid_store::CallRecord;

/// A progress event of a running call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub stage: String,
    pub message: String,
    pub worker: String,
    pub epoch: u64,
}

/// Progress events one call keeps for its watchers, at most.
pub const MAX_PROGRESS: usize = 2048;

/// The latest news of a call.
#[derive(Clone, Debug, Default)]
pub struct CallUpdate {
    /// Progress events so far, oldest first.
    pub progress: Vec<Progress>,
    /// Set once the call has ended.
    pub finished: Option<CallRecord>,
    /// When its end was committed (for the `reply` stage).
    pub finished_at: Option<Instant>,
}

/// Calls whose stages are timed at once, at most: beyond, a call is not timed.
const MAX_TIMED: usize = 65_536;

/// When a call passed the stages the scheduler sees.
#[derive(Clone, Copy, Debug)]
struct Stamps {
    admitted: Instant,
    assigned: Option<Instant>,
}

/// Channels of the calls someone is waiting on.
#[derive(Default)]
pub struct CallWatch {
    channels: Mutex<HashMap<String, watch::Sender<CallUpdate>>>,
    stamps: Mutex<HashMap<String, Stamps>>,
}

impl CallWatch {
    /// Subscribes to a call. Subscribe before reading the call's state from the store, so
    /// an end between the two is not missed.
    pub fn subscribe(&self, call_id: &str) -> watch::Receiver<CallUpdate> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        channels
            .entry(call_id.to_string())
            .or_insert_with(|| watch::Sender::new(CallUpdate::default()))
            .subscribe()
    }

    /// Publishes a progress event. A call keeps at most [`MAX_PROGRESS`] events (a tool
    /// reports at most 1000 per run); later ones are dropped, so the events already
    /// published keep their positions.
    pub fn progress(&self, call_id: &str, progress: Progress) {
        let channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = channels.get(call_id) {
            tx.send_if_modified(|u| {
                if u.progress.len() >= MAX_PROGRESS {
                    return false;
                }
                u.progress.push(progress);
                true
            });
        }
    }

    /// Announces a call's end and forgets its channel.
    pub fn finish(&self, record: CallRecord) {
        self.stamps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&record.id);
        let tx = self
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&record.id);
        if let Some(tx) = tx {
            tx.send_modify(|u| {
                u.finished = Some(record);
                u.finished_at = Some(Instant::now());
            });
        }
    }

    /// A call's admission was committed now: its `dispatch` stage starts.
    pub fn admitted(&self, call_id: &str) {
        let mut stamps = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
        if stamps.len() < MAX_TIMED {
            stamps.insert(
                call_id.to_string(),
                Stamps {
                    admitted: Instant::now(),
                    assigned: None,
                },
            );
        }
    }

    /// A call's assignment is being sent now: its first ends the `dispatch` stage.
    pub fn assigned(&self, call_id: &str) {
        let mut stamps = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = stamps.get_mut(call_id)
            && s.assigned.is_none()
        {
            let now = Instant::now();
            s.assigned = Some(now);
            metrics::stage(Stage::Dispatch, now - s.admitted);
        }
    }

    /// A call's result arrived now, its run having taken `run`: the `worker_run` stage,
    /// and `worker_overhead`, the rest since the assignment was sent.
    pub fn result_received(&self, call_id: &str, run: Duration) {
        metrics::stage(Stage::WorkerRun, run);
        let stamps = self.stamps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(assigned) = stamps.get(call_id).and_then(|s| s.assigned) {
            metrics::stage(
                Stage::WorkerOverhead,
                assigned.elapsed().saturating_sub(run),
            );
        }
    }

    /// Drops channels nobody listens to any more, and the stamps of calls admitted
    /// longer ago than an hour that never ended here (failed over to another replica).
    pub fn prune(&self) {
        self.stamps
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, s| s.admitted.elapsed() < Duration::from_secs(3600));
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, tx| tx.receiver_count() > 0);
    }
}
