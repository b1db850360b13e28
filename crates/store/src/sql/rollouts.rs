//! Canary rollouts: where each binding's rollout is (one row per binding, changed only by
//! compare-and-set, so replicas judging at once agree), and what each release's ended
//! calls were, the figures a step is judged on.

use super::SqlStore;
use super::conn::{Conn, Query, Row, query};
use super::writer::Write;
use crate::{Rollouts, StoreError};
use async_trait::async_trait;
use std::collections::BTreeMap;
use toolgrid_core::call::CallError;
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::rollout::{Phase, Progress, Record, Tally};

fn record_from_row(row: &Row) -> Result<Record, StoreError> {
    let phase: String = row.try_get("phase")?;
    let count = |column: &str| -> Result<u64, StoreError> {
        let n: i64 = row.try_get(column)?;
        Ok(u64::try_from(n).unwrap_or(0))
    };
    Ok(Record {
        binding: ObjectKey::new(
            row.try_get::<String>("namespace")?,
            row.try_get::<String>("binding")?,
        ),
        canary: row.try_get("canary")?,
        progress: Progress {
            phase: Phase::parse(&phase)
                .ok_or_else(|| StoreError::Corrupt(format!("rollout phase {phase:?}")))?,
            step: usize::try_from(row.try_get::<i64>("step")?).unwrap_or(0),
            step_started_ms: row.try_get("step_started_ms")?,
            message: row.try_get("message")?,
            stable: Tally {
                calls: count("stable_calls")?,
                errors: count("stable_errors")?,
            },
            canary: Tally {
                calls: count("canary_calls")?,
                errors: count("canary_errors")?,
            },
        },
    })
}

fn as_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Binds a record's columns as `$1` to `$11` (namespace, binding, canary, phase, step,
/// step start, message, the stable and canary calls and errors).
fn bind_record<'q>(query: Query<'q>, n: &'q Record) -> Query<'q> {
    let p = &n.progress;
    query
        .bind(n.binding.namespace.as_str())
        .bind(n.binding.name.as_str())
        .bind(n.canary.as_str())
        .bind(p.phase.as_str())
        .bind(i64::try_from(p.step).unwrap_or(0))
        .bind(p.step_started_ms)
        .bind(p.message.as_str())
        .bind(as_i64(p.stable.calls))
        .bind(as_i64(p.stable.errors))
        .bind(as_i64(p.canary.calls))
        .bind(as_i64(p.canary.errors))
}

/// Stores `next` when the row is still `expected` (none: no row yet).
struct PutRollout {
    expected: Option<Record>,
    next: Record,
}

#[async_trait]
impl Write for PutRollout {
    type Output = bool;

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<bool, StoreError> {
        let n = &self.next;
        let done = match &self.expected {
            None => {
                bind_record(
                    query(
                        "INSERT INTO rollouts (namespace, binding, canary, phase, step, step_started_ms, \
                         message, stable_calls, stable_errors, canary_calls, canary_errors) \
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
                         ON CONFLICT (namespace, binding) DO NOTHING",
                    ),
                    n,
                )
                .execute(&mut *conn)
                .await?
            }
            Some(e) => {
                bind_record(
                    query(
                        "UPDATE rollouts SET canary = $3, phase = $4, step = $5, step_started_ms = $6, \
                         message = $7, stable_calls = $8, stable_errors = $9, canary_calls = $10, \
                         canary_errors = $11 WHERE namespace = $1 AND binding = $2 AND canary = $12 \
                         AND phase = $13 AND step = $14 AND step_started_ms = $15",
                    ),
                    n,
                )
                .bind(e.canary.as_str())
                .bind(e.progress.phase.as_str())
                .bind(i64::try_from(e.progress.step).unwrap_or(0))
                .bind(e.progress.step_started_ms)
                .execute(&mut *conn)
                .await?
            }
        };
        Ok(done == 1)
    }
}

#[async_trait]
impl Rollouts for SqlStore {
    async fn rollouts(&self) -> Result<Vec<Record>, StoreError> {
        let rows = query(
            "SELECT namespace, binding, canary, phase, step, step_started_ms, message, \
             stable_calls, stable_errors, canary_calls, canary_errors FROM rollouts",
        )
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        rows.iter().map(record_from_row).collect()
    }

    async fn put_rollout(
        &self,
        expected: Option<&Record>,
        next: &Record,
    ) -> Result<bool, StoreError> {
        self.write(PutRollout {
            expected: expected.cloned(),
            next: next.clone(),
        })
        .await
    }

    async fn release_tallies(
        &self,
        namespace: &str,
        tool: &str,
        since_ms: i64,
    ) -> Result<BTreeMap<String, Tally>, StoreError> {
        let mut tallies: BTreeMap<String, Tally> = BTreeMap::new();
        let ended = query(
            "SELECT release, COUNT(*) AS n FROM calls WHERE namespace = $1 AND tool = $2 \
             AND finished_at_ms >= $3 AND error_json IS NULL GROUP BY release",
        )
        .bind(namespace)
        .bind(tool)
        .bind(since_ms)
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        for row in &ended {
            let n: i64 = row.try_get("n")?;
            tallies.entry(row.try_get("release")?).or_default().calls +=
                u64::try_from(n).unwrap_or(0);
        }
        // The failures one by one: which of them the release is to blame for is the
        // domain's rule, over the error's kind.
        let failed = query(
            "SELECT release, error_json FROM calls WHERE namespace = $1 AND tool = $2 \
             AND finished_at_ms >= $3 AND error_json IS NOT NULL",
        )
        .bind(namespace)
        .bind(tool)
        .bind(since_ms)
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        for row in &failed {
            let text: String = row.try_get("error_json")?;
            let error: CallError = serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("a call's error: {e}")))?;
            tallies
                .entry(row.try_get("release")?)
                .or_default()
                .add(Some(error.kind));
        }
        Ok(tallies)
    }
}
