//! Following a call to its end: its progress events in order, then its ended record. Every
//! streaming front door (gRPC `InvokeStream`, HTTP's event stream, MCP's `tools/call`) reads
//! a call through one [`Follow`] and converts what it yields to its own messages.

use super::Gateway;
use crate::scheduler::{CallUpdate, Progress};
use tokio::sync::watch;
use tokio::time::Instant;
use toolgrid_core::error::ApiError;
use toolgrid_store::CallRecord;

/// What a followed call did next.
#[derive(Debug)]
pub enum Step {
    /// Progress events not yet yielded, oldest first (never empty).
    Progress(Vec<Progress>),
    /// The call's record once it ended, or as the store has it when its news stopped (the
    /// channel closed, or the wait limit passed: then it may still be unfinished).
    Ended(Box<Result<CallRecord, ApiError>>),
}

/// A call being followed.
pub struct Follow {
    call_id: String,
    /// `None` once the call is known to have ended: the next step is the end.
    updates: Option<watch::Receiver<CallUpdate>>,
    ended: Option<CallRecord>,
    sent: usize,
    deadline: Instant,
    /// The subscription was taken after the record was read: the store is asked once,
    /// after subscribing, whether the call ended in between.
    recheck: bool,
}

impl Follow {
    /// Follows `record` (as admission answered it). `updates` is the subscription admission
    /// made before the call was queued, so its end cannot be missed; without one (an
    /// earlier call returned for the same key) a fresh subscription is taken, and the store
    /// is asked once its news stop.
    pub fn new(
        gateway: &Gateway,
        record: &CallRecord,
        updates: Option<watch::Receiver<CallUpdate>>,
    ) -> Self {
        let ended = record.state.is_terminal().then(|| record.clone());
        let recheck = ended.is_none() && updates.is_none();
        Follow {
            call_id: record.id.clone(),
            updates: match ended {
                Some(_) => None,
                None => Some(updates.unwrap_or_else(|| gateway.watch(&record.id))),
            },
            ended,
            sent: 0,
            deadline: Instant::now() + gateway.wait_limit(record),
            recheck,
        }
    }

    /// The next step. Cancel-safe: dropping the future loses no event (news is taken from
    /// the channel only when it is returned).
    pub async fn next(&mut self, gateway: &Gateway) -> Step {
        loop {
            let Some(updates) = self.updates.as_mut() else {
                return Step::Ended(Box::new(match self.ended.take() {
                    Some(record) => Ok(record),
                    None => gateway.record(&self.call_id).await,
                }));
            };
            let (news, finished) = {
                let update = updates.borrow_and_update();
                (
                    update.progress[self.sent.min(update.progress.len())..].to_vec(),
                    update.finished.clone(),
                )
            };
            if finished.is_some() {
                // The end comes after these events, without waiting for another change.
                self.ended = finished;
                self.updates = None;
            }
            if !news.is_empty() {
                self.sent += news.len();
                return Step::Progress(news);
            }
            if self.updates.is_none() {
                continue;
            }
            if self.recheck {
                let current = gateway.record(&self.call_id).await;
                self.recheck = false;
                if let Ok(current) = current
                    && current.state.is_terminal()
                {
                    self.ended = Some(current);
                    self.updates = None;
                }
                continue;
            }
            let Some(updates) = self.updates.as_mut() else {
                continue;
            };
            match tokio::time::timeout_at(self.deadline, updates.changed()).await {
                Ok(Ok(())) => {}
                // The call ended and its channel was dropped, or time ran out: the store says.
                _ => self.updates = None,
            }
        }
    }
}
