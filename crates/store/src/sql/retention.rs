//! Retention: deleting ended calls with their oplogs, in bounded batches, then the command
//! definitions and the artifacts no call uses.

use super::SqlStore;
use super::commands;
use super::conn::{Conn, built_query, query};
use super::rows::placeholders;
use super::writer::Write;
use crate::{Retention, RetentionReport, StoreError};
use async_trait::async_trait;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// Calls deleted per retention transaction.
const RETENTION_BATCH: i64 = 200;

/// Deletes up to `limit` calls that ended before `cutoff_ms`, and their oplogs: how many
/// calls and entries went.
struct PurgeCalls {
    cutoff_ms: i64,
    limit: i64,
}

#[async_trait]
impl Write for PurgeCalls {
    type Output = (u64, u64);

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(u64, u64), StoreError> {
        purge_calls(conn, self.cutoff_ms, self.limit).await
    }
}

/// Deletes the command definitions no call names any more: how many went.
struct PurgeCommands;

#[async_trait]
impl Write for PurgeCommands {
    type Output = u64;

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<u64, StoreError> {
        commands::purge_unused(conn).await
    }
}

/// Deletes artifacts stored before `cutoff_ms` that no call uses, except `keep`: their
/// digests.
struct PurgeArtifacts {
    cutoff_ms: i64,
    keep: HashSet<String>,
}

#[async_trait]
impl Write for PurgeArtifacts {
    type Output = Vec<String>;

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<Vec<String>, StoreError> {
        purge_artifacts(conn, self.cutoff_ms, &self.keep).await
    }
}

/// Deletes up to `limit` calls that ended before `cutoff_ms`, oldest first, with their
/// oplogs; returns how many calls and entries went.
async fn purge_calls(
    conn: &mut dyn Conn,
    cutoff_ms: i64,
    limit: i64,
) -> Result<(u64, u64), StoreError> {
    let ids: Vec<String> = query(
        "SELECT id FROM calls WHERE state IN ('succeeded', 'failed') AND finished_at_ms < $1 \
         ORDER BY finished_at_ms, id LIMIT $2",
    )
    .bind(cutoff_ms)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|row| row.try_get("id"))
    .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Ok((0, 0));
    }
    // Only numbered placeholders are formatted into the statements.
    let list = placeholders(1, ids.len());
    let mut entries = built_query(format!("DELETE FROM oplog WHERE call_id IN ({list})"));
    let mut calls = built_query(format!(
        "DELETE FROM calls WHERE id IN ({list}) AND state IN ('succeeded', 'failed')"
    ));
    for id in &ids {
        entries = entries.bind(id.as_str());
        calls = calls.bind(id.as_str());
    }
    let entries = entries.execute(&mut *conn).await?;
    let calls = calls.execute(&mut *conn).await?;
    Ok((calls, entries))
}

/// Deletes the artifacts last stored before `cutoff_ms` (`artifact_times`) that no call
/// uses (as its artifact, or, for a call not yet ended, as one of its release's files) and
/// that are not in `keep`; returns their digests.
async fn purge_artifacts(
    conn: &mut dyn Conn,
    cutoff_ms: i64,
    keep: &HashSet<String>,
) -> Result<Vec<String>, StoreError> {
    let unused: Vec<String> = query(
        "SELECT digest FROM artifact_times WHERE stored_at_ms < $1 \
         AND NOT EXISTS (SELECT 1 FROM calls WHERE calls.release_digest = artifact_times.digest) \
         AND NOT EXISTS (SELECT 1 FROM calls WHERE calls.finished_at_ms IS NULL \
             AND calls.spec_json LIKE '%\"' || artifact_times.digest || '\"%') \
         ORDER BY digest",
    )
    .bind(cutoff_ms)
    .fetch_all(&mut *conn)
    .await?
    .iter()
    .map(|row| row.try_get("digest"))
    .collect::<Result<_, _>>()?;
    let mut deleted = Vec::new();
    for digest in unused.into_iter().filter(|d| !keep.contains(d)) {
        query("DELETE FROM artifacts WHERE digest = $1")
            .bind(digest.as_str())
            .execute(&mut *conn)
            .await?;
        query("DELETE FROM artifact_times WHERE digest = $1")
            .bind(digest.as_str())
            .execute(&mut *conn)
            .await?;
        deleted.push(digest);
    }
    Ok(deleted)
}

#[async_trait]
impl Retention for SqlStore {
    async fn delete_finished_before(
        &self,
        cutoff_ms: i64,
        keep_artifacts: &HashSet<String>,
    ) -> Result<RetentionReport, StoreError> {
        let mut report = RetentionReport::default();
        // One bounded transaction per batch: other writes go between them.
        loop {
            let (calls, entries) = self
                .write(PurgeCalls {
                    cutoff_ms,
                    limit: RETENTION_BATCH,
                })
                .await?;
            report.calls += calls;
            report.oplog_entries += entries;
            if calls < RETENTION_BATCH as u64 {
                break;
            }
        }
        if report.calls > 0 {
            report.commands = self.write(PurgeCommands).await?;
        }
        let artifacts = self
            .write(PurgeArtifacts {
                cutoff_ms,
                keep: keep_artifacts.clone(),
            })
            .await?;
        if !artifacts.is_empty() {
            self.artifact_purges.fetch_add(1, Ordering::SeqCst);
        }
        report.artifacts = artifacts;
        Ok(report)
    }
}
