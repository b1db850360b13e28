//! The catalog: the resolved view of every resource ([`Snapshot`]), made by one pure
//! reconcile ([`resolve`]) from what a resource source read (a manifest directory in
//! `toolgrid up`, the Kubernetes API in the controller), and what an agent may call in it
//! ([`access`], the model-facing tools in [`model_tools`] and [`model_formats`]).

pub mod access;
pub mod artifacts;
mod json_schema;
pub mod manifest;
pub mod middleware;
pub mod model_formats;
pub mod model_tools;
pub mod pool_health;
pub mod resolve;
pub mod snapshot;
pub mod sources;

pub use resolve::Identities;

pub use snapshot::{
    Limits, ResolvedAgent, ResolvedBinding, ResolvedPool, ResolvedRelease, ResolvedRollout,
    ResolvedTool, ResourceId, ResourceState, Snapshot,
};

use std::sync::Arc;
use tokio::sync::watch;

/// Holds the current snapshot and tells subscribers when it changes.
pub struct Catalog {
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            tx: watch::Sender::new(Arc::new(Snapshot::default())),
        }
    }
}

impl Catalog {
    pub fn new() -> Arc<Self> {
        Arc::new(Catalog::default())
    }

    pub fn current(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }

    /// Publishes a new snapshot (its revision is set here).
    pub fn publish(&self, mut snapshot: Snapshot) -> Arc<Snapshot> {
        snapshot.revision = self.tx.borrow().revision + 1;
        let snapshot = Arc::new(snapshot);
        self.tx.send_replace(snapshot.clone());
        snapshot
    }
}
