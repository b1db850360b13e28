//! `toolgrid refresh SOURCE`: reading a ToolSource's upstream again on an operator's word.
//! The resource source is asked to read it ([`SourceRefresher`]: `toolgrid up`'s manifest
//! source reads at once; the controller sets the `toolgrid.dev/refresh` annotation and its
//! reconcile reads), and the answer waits for the catalog to publish the source with
//! `status.refreshed` equal to the request, then says what changed.

use super::Gateway;
use std::sync::Arc;
use std::time::Duration;
use toolgrid_api::{Kind, ToolSourceStatus};
use toolgrid_catalog::ResourceId;
use toolgrid_catalog::resolve::tool_source::{SnapshotDiff, diff_snapshots};
use toolgrid_core::auth::Principal;
use toolgrid_core::error::ApiError;
use toolgrid_core::error::ErrorKind;
use toolgrid_core::ids::ObjectKey;

/// How long a refresh waits for the source to be read.
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(90);

/// Asks the resource source for a ToolSource to be read again.
#[async_trait::async_trait]
pub trait SourceRefresher: Send + Sync {
    /// Starts the read of `key`; answers the value `status.refreshed` will hold once the
    /// read is published.
    async fn request(&self, key: &ObjectKey) -> Result<String, String>;
}

/// What a refresh found.
#[derive(Clone, Debug, PartialEq)]
pub struct RefreshReport {
    pub ready: bool,
    pub reason: String,
    pub message: String,
    pub diff: SnapshotDiff,
    pub tools: i64,
    pub refresh_error: Option<String>,
}

impl Gateway {
    /// Sets who reads ToolSources again (once).
    pub fn set_source_refresher(&self, refresher: Arc<dyn SourceRefresher>) {
        let _ = self.refresher.set(refresher);
    }

    /// Reads ToolSource `namespace/name` again and reports what changed. Operators only.
    pub async fn refresh_source(
        &self,
        caller: &Principal,
        namespace: &str,
        name: &str,
    ) -> Result<RefreshReport, ApiError> {
        super::authz::operators_only(caller, "refresh a tool source")?;
        let id = ResourceId {
            kind: Kind::ToolSource,
            key: ObjectKey::new(namespace, name),
        };
        let status_of = |snapshot: &toolgrid_catalog::Snapshot| {
            snapshot.resources.get(&id).map(|state| {
                let status: ToolSourceStatus =
                    serde_json::from_value(state.status.clone()).unwrap_or_default();
                (state.clone(), status)
            })
        };
        let Some((_, before)) = status_of(&self.catalog.current()) else {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("there is no ToolSource {namespace}/{name}"),
            ));
        };
        let Some(refresher) = self.refresher.get() else {
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                "this control plane cannot refresh tool sources",
            ));
        };
        let mut published = self.catalog.subscribe();
        let nonce = refresher
            .request(&id.key)
            .await
            .map_err(|e| ApiError::new(ErrorKind::Unavailable, e))?;
        let deadline = tokio::time::Instant::now() + REFRESH_TIMEOUT;
        loop {
            let current = published.borrow_and_update().clone();
            match status_of(&current) {
                None => {
                    return Err(ApiError::new(
                        ErrorKind::NotFound,
                        format!("ToolSource {namespace}/{name} was deleted"),
                    ));
                }
                Some((state, after)) if after.refreshed.as_deref() == Some(nonce.as_str()) => {
                    return Ok(RefreshReport {
                        ready: state.ready.status,
                        reason: state.ready.reason.as_str().to_string(),
                        message: state.ready.message.clone(),
                        diff: diff_snapshots(before.snapshot.as_ref(), after.snapshot.as_ref()),
                        tools: after.tool_count.unwrap_or(0),
                        refresh_error: after.refresh_error,
                    });
                }
                Some(_) => {}
            }
            match tokio::time::timeout_at(deadline, published.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(ApiError::new(
                        ErrorKind::Timeout,
                        format!(
                            "ToolSource {namespace}/{name} was not read within {}s",
                            REFRESH_TIMEOUT.as_secs()
                        ),
                    ));
                }
            }
        }
    }
}
