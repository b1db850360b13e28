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

/// A call's channel, and when it passed the stages the scheduler sees (for
/// `toolgrid_call_stage_seconds`).
struct Watched {
    tx: watch::Sender<CallUpdate>,
    admitted: Option<Instant>,
    assigned: Option<Instant>,
}

impl Watched {
    fn new() -> Self {
        Watched {
            tx: watch::Sender::new(CallUpdate::default()),
            admitted: None,
            assigned: None,
        }
    }
}

/// Channels of the calls someone is waiting on.
#[derive(Default)]
pub struct CallWatch {
    channels: Mutex<HashMap<String, Watched>>,
}

impl CallWatch {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Subscribes to a call. Subscribe before reading the call's state from the store, so
    /// an end between the two is not missed.
    pub fn subscribe(&self, call_id: &str) -> watch::Receiver<CallUpdate> {
        self.lock()
            .entry(call_id.to_string())
            .or_insert_with(Watched::new)
            .tx
            .subscribe()
    }

    /// Subscribes to a call whose admission was committed now: its `dispatch` stage
    /// starts.
    pub fn admitted(&self, call_id: &str) -> watch::Receiver<CallUpdate> {
        let mut channels = self.lock();
        let watched = channels
            .entry(call_id.to_string())
            .or_insert_with(Watched::new);
        watched.admitted = Some(Instant::now());
        watched.tx.subscribe()
    }

    /// Publishes a progress event. A call keeps at most [`MAX_PROGRESS`] events (a tool
    /// reports at most 1000 per run); later ones are dropped, so the events already
    /// published keep their positions.
    pub fn progress(&self, call_id: &str, progress: Progress) {
        if let Some(watched) = self.lock().get(call_id) {
            watched.tx.send_if_modified(|u| {
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
        let watched = self.lock().remove(&record.id);
        if let Some(watched) = watched {
            watched.tx.send_modify(|u| {
                u.finished = Some(record);
                u.finished_at = Some(Instant::now());
            });
        }
    }

    /// A call's assignment is being sent now: its first ends the `dispatch` stage.
    pub fn assigned(&self, call_id: &str) {
        if let Some(watched) = self.lock().get_mut(call_id)
            && watched.assigned.is_none()
        {
            let now = Instant::now();
            watched.assigned = Some(now);
            if let Some(admitted) = watched.admitted {
                metrics::stage(Stage::Dispatch, now - admitted);
            }
        }
    }

    /// A call's result arrived now, its run having taken `run`: the `worker_run` stage,
    /// and `worker_overhead`, the rest since the assignment was sent.
    pub fn result_received(&self, call_id: &str, run: Duration) {
        metrics::stage(Stage::WorkerRun, run);
        let assigned = self.lock().get(call_id).and_then(|w| w.assigned);
        if let Some(assigned) = assigned {
            metrics::stage(
                Stage::WorkerOverhead,
                assigned.elapsed().saturating_sub(run),
            );
        }
    }

    /// Drops channels nobody listens to any more.
    pub fn prune(&self) {
        self.lock().retain(|_, w| w.tx.receiver_count() > 0);
    }
}
