//! A queued write as the writer and its syncer see it: its output type erased, so that one
//! queue carries every kind of write (the writer's `Queued` implements it).

use super::conn::Conn;
use crate::StoreError;
use async_trait::async_trait;

/// A queued write, its output type erased so that one queue carries every kind of write.
#[async_trait]
pub(super) trait Job: Send + Sync {
    /// Applies the write in the batch's transaction and keeps its answer (a refusal too)
    /// until the batch commits; a database error is returned: it aborts the batch.
    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<(), sqlx::Error>;
    /// The batch committed (its writes are visible) and is not synced yet: a write queued
    /// with `SqlStore::write_applied` is answered now.
    fn applied(&self);
    /// The batch is durable: sends the answer the last [`apply`](Job::apply) kept, or says
    /// that the write answered early is durable.
    fn answer(self: Box<Self>);
    /// Sends `error` instead (to the early answer when it was not sent yet, else to the
    /// durable one).
    fn fail(self: Box<Self>, error: StoreError);
}
