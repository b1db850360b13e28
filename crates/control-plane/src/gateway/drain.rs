//! `toolgrid drain WORKER`: an operator stops a worker gracefully, as SIGTERM does. The
//! scheduler offers it no new call and tells it to drain; it finishes the calls it holds
//! within its grace period, gives up the rest to other workers and exits
//! (docs/rollout.md).

use super::Gateway;
use toolgrid_core::auth::Principal;
use toolgrid_core::error::{ApiError, ErrorKind};

impl Gateway {
    /// Drains `worker`; answers how many calls it held. Operators only
    /// (`permission-denied`); a worker not attached is `not-found`.
    pub fn drain_worker(&self, caller: &Principal, worker: &str) -> Result<u32, ApiError> {
        super::authz::operators_only(caller, "drain a worker")?;
        let busy = self.scheduler.drain(worker).ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                format!("no worker {worker:?} is attached"),
            )
        })?;
        tracing::info!(worker, busy, "worker draining on an operator's word");
        Ok(busy)
    }
}
