//! How many write transactions a store has committed, and how many syncs made them durable:
//! with group commit, concurrent calls share both, and the ratio of calls to syncs is what
//! durability costs a call (exported as `toolgrid_store_commits_total` and
//! `toolgrid_store_syncs_total`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A store's counts of commits and syncs, shared by its writer and whoever reads them.
#[derive(Clone, Debug, Default)]
pub struct WriteCounters(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    commits: AtomicU64,
    syncs: AtomicU64,
}

impl WriteCounters {
    /// Write transactions committed so far.
    pub fn commits(&self) -> u64 {
        self.0.commits.load(Ordering::Relaxed)
    }

    /// Syncs that made committed transactions durable so far: on SQLite each `fdatasync` of
    /// the write-ahead log, which makes every batch committed before it durable; on
    /// PostgreSQL each commit, which the server syncs before it answers.
    pub fn syncs(&self) -> u64 {
        self.0.syncs.load(Ordering::Relaxed)
    }

    pub(crate) fn committed(&self) {
        self.0.commits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn synced(&self) {
        self.0.syncs.fetch_add(1, Ordering::Relaxed);
    }
}
