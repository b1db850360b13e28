//! Retention: a background task that deletes calls that ended longer ago than the
//! configured age, their oplogs, and artifacts nothing uses any more; and one that deletes
//! lapsed console sessions.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use toolgrid_catalog::Catalog;
use toolgrid_store::{ConsoleSessions, Retention, now_ms};

/// How often retention runs for an age of `retain`: hourly, or more often for short ages
/// (a quarter of the age, at least once a minute).
pub fn interval(retain: Duration) -> Duration {
    (retain / 4).clamp(Duration::from_secs(60), Duration::from_secs(3600))
}

/// Runs retention once now and then every [`interval`], keeping the artifacts of the
/// catalog's current releases. Call it once the catalog has loaded.
pub fn spawn(store: Arc<dyn Retention>, catalog: Arc<Catalog>, retain: Duration) -> JoinHandle<()> {
    let every = interval(retain);
    tracing::info!(retain = %humantime::format_duration(retain), every = %humantime::format_duration(every), "retention is on");
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            run_once(store.as_ref(), &catalog, retain).await;
        }
    })
}

/// One retention pass; failures are logged and the next pass tries again.
pub async fn run_once(store: &dyn Retention, catalog: &Catalog, retain: Duration) {
    let cutoff = now_ms().saturating_sub(i64::try_from(retain.as_millis()).unwrap_or(i64::MAX));
    let keep: HashSet<String> = catalog
        .current()
        .releases
        .values()
        .flat_map(|r| r.digests().map(str::to_string).collect::<Vec<_>>())
        .collect();
    match store.delete_finished_before(cutoff, &keep).await {
        Ok(report) => {
            if report.calls > 0 || !report.artifacts.is_empty() {
                tracing::info!(
                    calls = report.calls,
                    oplog_entries = report.oplog_entries,
                    command_definitions = report.commands,
                    artifacts = report.artifacts.len(),
                    "retention deleted old calls"
                );
            }
            // A release that came back while retention ran: its source stores the
            // artifact again on its next change (the purge count changed).
            let snapshot = catalog.current();
            for digest in report.artifacts.iter().filter(|d| snapshot.has_digest(d)) {
                tracing::warn!(%digest, "retention deleted the artifact of a release that just became current");
            }
        }
        Err(error) => tracing::error!(%error, "retention failed; it runs again later"),
    }
}

/// How often lapsed console sessions (idle, or past their expiry) are deleted. A lapsed
/// session is refused at once anyway; this only keeps its row from staying.
pub const SESSION_PURGE_EVERY: Duration = Duration::from_secs(60);

/// Deletes lapsed console sessions now and every [`SESSION_PURGE_EVERY`].
pub fn spawn_session_purge(store: Arc<dyn ConsoleSessions>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(SESSION_PURGE_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            match store.purge_console_sessions(now_ms()).await {
                Ok(0) => {}
                Ok(purged) => tracing::debug!(purged, "deleted lapsed console sessions"),
                Err(error) => tracing::warn!(%error, "cannot delete lapsed console sessions"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_hourly_or_more_often_for_short_ages() {
        assert_eq!(
            interval(Duration::from_secs(7 * 86400)),
            Duration::from_secs(3600)
        );
        assert_eq!(
            interval(Duration::from_secs(3600)),
            Duration::from_secs(900)
        );
        assert_eq!(interval(Duration::from_secs(10)), Duration::from_secs(60));
    }
}
