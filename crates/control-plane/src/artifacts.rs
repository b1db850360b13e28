//! Release artifacts into the store: what a resource source does with the artifacts the
//! catalog checked (`toolgrid_catalog::artifacts`), so workers can fetch them by digest.

use std::collections::HashSet;
use std::sync::Mutex;
use toolgrid_catalog::artifacts::{ArtifactOutcome, LoadedArtifact};
use toolgrid_store::{Artifacts, StoreError};

/// Puts Ready artifacts in the store, once per digest: a resource source resolves again on
/// every change, and an artifact it already stored need not be written again. When
/// retention has deleted artifacts since ([`Artifacts::artifact_purges`]), every digest is
/// stored again once, in case it was one of them.
#[derive(Debug, Default)]
pub struct StoredArtifacts {
    digests: Mutex<Stored>,
}

#[derive(Debug, Default)]
struct Stored {
    /// The store's purge count when `digests` was last known to be complete.
    purges: u64,
    digests: HashSet<String>,
}

impl StoredArtifacts {
    /// Stores `loaded`'s bytes (and its files') when it is Ready and new, and returns its
    /// outcome. The bytes go to the store as they are, not copied.
    pub async fn keep(
        &self,
        store: &dyn Artifacts,
        loaded: LoadedArtifact,
    ) -> Result<ArtifactOutcome, StoreError> {
        let LoadedArtifact {
            outcome,
            bytes,
            file_bytes,
        } = loaded;
        if let ArtifactOutcome::Ready { digest, .. } = &outcome {
            if let Some(bytes) = bytes {
                self.put(store, digest, bytes).await?;
            }
            for (digest, bytes) in file_bytes {
                self.put(store, &digest, bytes).await?;
            }
        }
        Ok(outcome)
    }

    /// Puts `bytes` in the store under `digest` unless they are known to be there.
    async fn put(
        &self,
        store: &dyn Artifacts,
        digest: &str,
        bytes: Vec<u8>,
    ) -> Result<(), StoreError> {
        {
            let purges = store.artifact_purges();
            let known = {
                let mut stored = self.stored();
                if stored.purges != purges {
                    stored.digests.clear();
                    stored.purges = purges;
                }
                stored.digests.contains(digest)
            };
            if !known {
                store.put_artifact(digest, bytes).await?;
                self.stored().digests.insert(digest.to_string());
            }
        }
        Ok(())
    }

    fn stored(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.digests.lock().unwrap_or_else(|e| e.into_inner())
    }
}
