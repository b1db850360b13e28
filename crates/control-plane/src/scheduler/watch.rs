//! Per-call notifications: progress while a call runs, and its final record.

use std::collections::HashMap;
use std::sync::Mutex;
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
}

/// Channels of the calls someone is waiting on.
#[derive(Default)]
pub struct CallWatch {
    channels: Mutex<HashMap<String, watch::Sender<CallUpdate>>>,
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
        let tx = self
            .channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&record.id);
        if let Some(tx) = tx {
            tx.send_modify(|u| u.finished = Some(record));
        }
    }

    /// Drops channels nobody listens to any more.
    pub fn prune(&self) {
        self.channels
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, tx| tx.receiver_count() > 0);
    }
}
