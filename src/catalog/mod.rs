//! The catalog: the resolved view of every resource, fed by a resource source (a manifest
//! directory here, the Kubernetes API in `controller`) through the same reconcile logic.

pub mod access;
pub mod artifacts;
pub mod interface;
pub mod manifest;
pub mod model_formats;
pub mod model_tools;
pub mod pool_health;
pub mod resolve;
pub mod snapshot;
mod source;
pub mod wasm;

pub use resolve::Identities;

pub use snapshot::{
    Limits, ObjectKey, ResolvedAgent, ResolvedBinding, ResolvedPool, ResolvedRelease, ResolvedTool,
    ResourceId, ResourceState, Snapshot,
};
pub use source::ManifestSource;

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
