//! The SQLite writer's syncs: on the writer's thread when nothing else waits, else on a
//! thread of their own.
//!
//! The writer commits a batch without a sync and answers the writes that asked to be
//! answered at their commit. When no other write is queued and no sync is under way, it
//! syncs the write-ahead log itself (`fdatasync`, what `synchronous=FULL` does inside the
//! commit) and answers the batch: a lone call pays no hand-off. Otherwise it hands the batch
//! to the syncer's thread and applies the next batch while that thread syncs. Each sync
//! answers every batch handed over before it started, in order: `fdatasync` makes every
//! frame written so far durable, so no batch is answered before one committed ahead of it
//! is durable.
//!
//! A failed sync is final. The kernel may have dropped the pages it could not write, so a
//! later sync could succeed with a hole in the log (and SQLite's recovery stops at the
//! first frame that does not check, losing everything after it): every write of the batch
//! and every later one fails with [`StoreError::NotDurable`] until the store is opened
//! again.

use super::job::Job;
use super::native::SyncFailed;
use crate::{StoreError, WriteCounters};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

/// Committed batches handed over and not yet synced, at most: the writer waits for room
/// (the syncer is behind by that many syncs).
const BEHIND: usize = 64;

/// The writer's end: syncs a committed batch or hands it over.
pub(super) struct Syncer {
    batches: mpsc::SyncSender<Vec<Box<dyn Job>>>,
    log: Arc<Log>,
}

/// The write-ahead log, shared by the writer's thread and the syncer's.
struct Log {
    path: PathBuf,
    /// Opened at the first sync: the writer's connection keeps the file in place.
    file: Mutex<Option<std::fs::File>>,
    failed: SyncFailed,
    /// Batches handed to the syncer's thread and not answered yet.
    handed: AtomicUsize,
    /// Counts each sync that succeeds.
    counters: WriteCounters,
}

impl Syncer {
    /// Starts the thread that syncs the log at `wal`, setting `failed` when a sync fails and
    /// counting in `counters` each that succeeds.
    pub(super) fn spawn(
        wal: PathBuf,
        failed: SyncFailed,
        counters: WriteCounters,
    ) -> std::io::Result<Syncer> {
        let (batches, rx) = mpsc::sync_channel(BEHIND);
        let log = Arc::new(Log {
            path: wal,
            file: Mutex::new(None),
            failed,
            handed: AtomicUsize::new(0),
            counters,
        });
        let thread_log = log.clone();
        std::thread::Builder::new()
            .name("store-sync".into())
            .spawn(move || run(rx, &thread_log))?;
        Ok(Syncer { batches, log })
    }

    /// Answers a committed batch once it is durable: synced here when `others_waiting` is
    /// false and the syncer's thread has nothing, else handed to that thread.
    pub(super) fn sync(&self, batch: Vec<Box<dyn Job>>, others_waiting: bool) {
        if !others_waiting && self.log.handed.load(Ordering::Acquire) == 0 {
            answer(batch, self.log.sync());
            return;
        }
        self.log.handed.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::SendError(batch)) = self.batches.send(batch) {
            // Never while the writer runs: the thread ends only when this handle is dropped.
            self.log.handed.fetch_sub(1, Ordering::AcqRel);
            for job in batch {
                job.fail(StoreError::Closed);
            }
        }
    }
}

fn run(batches: mpsc::Receiver<Vec<Box<dyn Job>>>, log: &Log) {
    while let Ok(mut jobs) = batches.recv() {
        // Everything committed so far goes in this sync.
        let mut count = 1;
        while let Ok(more) = batches.try_recv() {
            jobs.extend(more);
            count += 1;
        }
        answer(jobs, log.sync());
        log.handed.fetch_sub(count, Ordering::AcqRel);
    }
}

/// Answers `jobs` after their sync: durable, or [`StoreError::NotDurable`].
fn answer(jobs: Vec<Box<dyn Job>>, synced: Result<(), String>) {
    match synced {
        Ok(()) => {
            for job in jobs {
                job.answer();
            }
        }
        Err(why) => {
            for job in jobs {
                job.fail(StoreError::NotDurable(why.clone()));
            }
        }
    }
}

impl Log {
    /// `fdatasync` of the log, unless an earlier one failed; a failure is recorded. The
    /// earlier failure is looked for once this sync has its turn: a failed `fdatasync`
    /// reports its error once, so a sync that ran after it would succeed.
    fn sync(&self) -> Result<(), String> {
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(why) = self
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Err(why);
        }
        let synced = match &mut *file {
            Some(file) => file.sync_data(),
            None => {
                std::fs::File::open(&self.path).and_then(|opened| file.insert(opened).sync_data())
            }
        };
        if synced.is_ok() {
            self.counters.synced();
        }
        synced.map_err(|error| {
            let why = format!("fdatasync of {}: {error}", self.path.display());
            tracing::error!(%why, "store writer: a committed batch could not be synced");
            *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(why.clone());
            why
        })
    }
}
