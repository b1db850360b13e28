//! `/health`, `/ready` and `/metrics` on the controller's metrics port.

use axum::http::StatusCode;
use axum::routing::get;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// What must hold before the controller takes traffic.
#[derive(Default)]
pub struct Readiness {
    crds: AtomicBool,
    synced: AtomicBool,
    leader: AtomicBool,
    waiting_for: Mutex<String>,
}

impl Readiness {
    pub fn set_crds(&self, present: bool, missing: &[String]) {
        self.crds.store(present, Ordering::SeqCst);
        *self.waiting_for.lock().unwrap_or_else(|e| e.into_inner()) = if missing.is_empty() {
            String::new()
        } else {
            format!("waiting for the CRDs: {}", missing.join(", "))
        };
    }

    pub fn set_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::SeqCst);
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.store(leader, Ordering::SeqCst);
    }

    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), String> {
        if !self.crds.load(Ordering::SeqCst) {
            let waiting = self
                .waiting_for
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            return Err(if waiting.is_empty() {
                "checking the CRDs".into()
            } else {
                waiting
            });
        }
        if !self.leader.load(Ordering::SeqCst) {
            return Err("standing by: another replica leads".into());
        }
        if !self.synced.load(Ordering::SeqCst) {
            return Err("syncing the catalog".into());
        }
        Ok(())
    }
}

/// The probe and metrics endpoints.
pub fn router(readiness: std::sync::Arc<Readiness>) -> axum::Router {
    axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/ready",
            get(move || {
                let readiness = readiness.clone();
                async move {
                    match readiness.check() {
                        Ok(()) => (StatusCode::OK, "ready".to_string()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(|| async { toolgrid_control_plane::metrics::global().encode() }),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_with_crds_leadership_and_a_synced_catalog() {
        let readiness = Readiness::default();
        readiness.set_crds(false, &["tools.toolgrid.dev".into()]);
        assert!(
            readiness
                .check()
                .unwrap_err()
                .contains("tools.toolgrid.dev")
        );
        readiness.set_crds(true, &[]);
        assert!(readiness.check().unwrap_err().contains("standing by"));
        readiness.set_leader(true);
        assert!(readiness.check().unwrap_err().contains("syncing"));
        readiness.set_synced(true);
        assert!(readiness.check().is_ok());
    }
}
