//! The group-commit writer: one task owns the write connection and commits whatever writes
//! are queued in one transaction, so a burst of writes costs one commit (one fsync on
//! SQLite), not one each.
//!
//! Each kind of write is its own type implementing [`Write`]; [`SqlStore::write`] queues it
//! as a [`Job`] (the write, its answer once applied, and where to send that answer, its
//! output type erased) and waits for the answer, which is sent only after the commit.
//!
//! On PostgreSQL the writer is a task on sqlx's pool of one connection. On SQLite it is a
//! thread of its own with its own connection ([`NativeSqlite`]): a batch's statements are
//! direct calls into SQLite there, so applying a batch costs little beside its commit.

use super::conn::Conn;
use super::native::NativeSqlite;
use super::{RetryPolicy, SqlStore, retrying};
use crate::StoreError;
use async_trait::async_trait;
use sqlx::AnyPool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{mpsc, oneshot};

/// Most writes committed in one transaction.
const MAX_BATCH: usize = 256;

/// Writes queued for the writer at most, before a writer waits to queue one.
const QUEUE: usize = 4096;

/// One write operation, applied in the writer's transaction with the others of its batch.
#[async_trait]
pub(super) trait Write: Send + Sync + 'static {
    /// The write's answer.
    type Output: Send + 'static;

    /// Runs the write. With `again` the write may have committed in an earlier attempt
    /// whose outcome was unknown; the write then recognises its own commit instead of
    /// being applied twice (appends and completions always do). A database error aborts
    /// the batch; any other error is this write's own refusal and changes nothing.
    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<Self::Output, StoreError>;
}

/// A queued write, its output type erased so that one queue carries every kind of write.
#[async_trait]
pub(super) trait Job: Send + Sync {
    /// Applies the write in the batch's transaction and keeps its answer (a refusal too)
    /// until the batch commits; a database error is returned: it aborts the batch.
    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<(), sqlx::Error>;
    /// Sends the answer the last [`apply`](Job::apply) kept (after the commit).
    fn answer(self: Box<Self>);
    /// Sends `error` instead of an answer.
    fn fail(self: Box<Self>, error: StoreError);
}

/// A [`Write`] with its answer and its reply channel.
struct Queued<W: Write> {
    write: W,
    answer: Mutex<Option<Result<W::Output, StoreError>>>,
    reply: oneshot::Sender<Result<W::Output, StoreError>>,
}

#[async_trait]
impl<W: Write> Job for Queued<W> {
    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<(), sqlx::Error> {
        match self.write.apply(conn, again).await {
            Err(StoreError::Database(error)) => Err(error),
            answer => {
                *self.answer.lock().unwrap_or_else(PoisonError::into_inner) = Some(answer);
                Ok(())
            }
        }
    }

    fn answer(self: Box<Self>) {
        let answer = self
            .answer
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            // Never: a job is answered only after a commit of a batch that applied it.
            .unwrap_or_else(|| Err(StoreError::Corrupt("unexpected writer reply".into())));
        let _ = self.reply.send(answer);
    }

    fn fail(self: Box<Self>, error: StoreError) {
        let _ = self.reply.send(Err(error));
    }
}

impl SqlStore {
    /// Queues `write` for the writer and waits for its answer, sent once the batch that
    /// holds it has committed.
    pub(super) async fn write<W: Write>(&self, write: W) -> Result<W::Output, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job = Queued {
            write,
            answer: Mutex::new(None),
            reply,
        };
        self.writer
            .send(Box::new(job))
            .await
            .map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// Where the writer's transactions go.
pub(super) enum Sink {
    /// sqlx's pool of one connection (PostgreSQL).
    Pool(AnyPool),
    /// The writer's own SQLite connection, used on the writer's thread only (the lock is
    /// never contended; it lets a batch borrow the connection across a retry's awaits).
    Native(tokio::sync::Mutex<NativeSqlite>),
}

/// Starts the writer on `sink`; returns the queue of its jobs. A native SQLite sink gets a
/// thread of its own.
pub(super) fn spawn(
    sink: Sink,
    retry: RetryPolicy,
    commits: Arc<AtomicU64>,
) -> Result<mpsc::Sender<Box<dyn Job>>, StoreError> {
    let (jobs, rx) = mpsc::channel(QUEUE);
    match sink {
        Sink::Pool(_) => {
            tokio::spawn(run(sink, rx, retry, commits));
        }
        Sink::Native(_) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
            std::thread::Builder::new()
                .name("store-writer".into())
                .spawn(move || runtime.block_on(run(sink, rx, retry, commits)))
                .map_err(|e| StoreError::Database(sqlx::Error::Io(e)))?;
        }
    }
    Ok(jobs)
}

async fn run(
    sink: Sink,
    mut rx: mpsc::Receiver<Box<dyn Job>>,
    retry: RetryPolicy,
    commits: Arc<AtomicU64>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        // A retried batch may have committed already (the connection died during COMMIT):
        // every operation recognises its own earlier commit (see `Write::apply`).
        let result = retrying(retry, |tried| {
            commit_batch(&sink, &batch, tried > 0, &commits)
        })
        .await;
        match result {
            Ok(()) => {
                for job in batch {
                    job.answer();
                }
            }
            Err(error) if batch.len() == 1 => batch.remove(0).fail(error),
            // The database stayed unreachable: retrying each write alone would not help.
            Err(StoreError::Unavailable { attempts, last }) => {
                for job in batch {
                    job.fail(StoreError::Unavailable {
                        attempts,
                        last: last.clone(),
                    });
                }
            }
            // One bad write must not fail its neighbours: retry each on its own.
            Err(_) => {
                for job in batch {
                    let single = std::slice::from_ref(&job);
                    match retrying(retry, |_| commit_batch(&sink, single, true, &commits)).await {
                        Ok(()) => job.answer(),
                        Err(error) => job.fail(error),
                    }
                }
            }
        }
    }
}

/// Runs `jobs` in one transaction. A database error aborts the batch; refusals such as a
/// stale epoch are per job and change nothing. `again` says the batch (or a batch with
/// these jobs) was tried before and may have committed.
async fn commit_batch(
    sink: &Sink,
    jobs: &[Box<dyn Job>],
    again: bool,
    commits: &AtomicU64,
) -> Result<(), StoreError> {
    match sink {
        Sink::Pool(pool) => {
            let mut tx = pool.begin().await?;
            for job in jobs {
                job.apply(&mut *tx, again).await?;
            }
            tx.commit().await?;
        }
        Sink::Native(conn) => {
            let mut conn = conn.lock().await;
            conn.begin()?;
            let mut applied = Ok(());
            for job in jobs {
                applied = job.apply(&mut *conn, again).await.map_err(StoreError::from);
                if applied.is_err() {
                    break;
                }
            }
            if let Err(error) = applied.and_then(|()| conn.commit()) {
                conn.rollback();
                return Err(error);
            }
        }
    }
    commits.fetch_add(1, Ordering::Relaxed);
    Ok(())
}
