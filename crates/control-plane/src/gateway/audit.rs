//! The audit log's read side: operators list audit records (agents are refused).

use super::Gateway;
use toolgrid_core::auth::Principal;
use toolgrid_core::call::{AuditFilter, AuditRecord};
use toolgrid_core::error::{ApiError, ErrorKind};

impl Gateway {
    /// Audit records matching `filter`, newest first. Operators only: an agent gets
    /// `permission-denied` (the log names every agent's calls, refused ones included).
    pub async fn list_audit(
        &self,
        caller: &Principal,
        filter: AuditFilter,
    ) -> Result<Vec<AuditRecord>, ApiError> {
        if let Principal::Agent { agent } = caller {
            return Err(ApiError::new(
                ErrorKind::PermissionDenied,
                format!("agent {agent} may not read the audit log; it is for operators"),
            ));
        }
        Ok(self.store.list_audit(&filter).await?)
    }
}

/// A filter from the front doors' fields (empty: no bound).
pub fn audit_filter(
    namespace: &str,
    agent: &str,
    tool: &str,
    since_ms: Option<i64>,
    limit: u32,
) -> AuditFilter {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    AuditFilter {
        namespace: some(namespace),
        agent: some(agent),
        tool: some(tool),
        since_ms,
        limit,
    }
}
