//! Canary rollouts, the IO around `toolgrid_core::rollout`: one task per control plane
//! judges every binding's canary each [`TICK`] on what the store says its calls did, and
//! stores the next step, a promotion or a rollback by compare-and-set (replicas judging
//! at once store one outcome). The [`RolloutBook`] holds where each rollout is; the
//! catalog resolves with it (the split admission follows, the binding's status and its
//! `Degraded` condition), again whenever it changes.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::Notify;
use toolgrid_catalog::{Catalog, ResolvedBinding, Snapshot};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::rollout::{Order, OrderError, Progress, Record, Tally, apply, judge};
use toolgrid_store::{Store, StoreError};

/// How often each rollout is judged.
pub const TICK: Duration = Duration::from_secs(1);

/// Where each binding's rollout is, as last read from (or stored to) the store.
#[derive(Default)]
pub struct RolloutBook {
    records: RwLock<HashMap<ObjectKey, Record>>,
    /// Woken when a rollout moved: the catalog resolves again.
    pub changed: Arc<Notify>,
}

impl RolloutBook {
    /// Every rollout, by binding.
    pub fn records(&self) -> HashMap<ObjectKey, Record> {
        self.records
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces what the book holds; whether anything changed.
    fn replace(&self, records: HashMap<ObjectKey, Record>) -> bool {
        let mut held = self.records.write().unwrap_or_else(|e| e.into_inner());
        if *held == records {
            return false;
        }
        *held = records;
        true
    }

    /// Reads every rollout from the store: a control plane does this before its catalog
    /// first resolves, so a canary rolled back before a restart takes no call after it.
    pub async fn load(&self, store: &dyn Store) -> Result<(), StoreError> {
        self.replace(by_binding(store.rollouts().await?));
        Ok(())
    }

    fn put(&self, record: Record) {
        self.records
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(record.binding.clone(), record);
    }
}

/// Judges every rollout each [`TICK`], until the task is dropped.
pub async fn run(store: Arc<dyn Store>, catalog: Arc<Catalog>, book: Arc<RolloutBook>) {
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match tick(&*store, &catalog.current(), &book, toolgrid_store::now_ms()).await {
            Ok(true) => book.changed.notify_one(),
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "rollouts not judged; retrying"),
        }
    }
}

/// One round: reads every rollout, starts those the catalog has no record of, judges the
/// rest. Whether any changed.
async fn tick(
    store: &dyn Store,
    snapshot: &Snapshot,
    book: &RolloutBook,
    now_ms: i64,
) -> Result<bool, StoreError> {
    // No binding has a canary: nothing to judge, nothing to read.
    if snapshot.bindings.values().all(|b| b.rollout.is_none()) {
        return Ok(false);
    }
    let stored = by_binding(store.rollouts().await?);
    let mut changed = book.replace(stored.clone());
    for binding in snapshot.bindings.values() {
        let (Some(rollout), Some(stable)) = (&binding.rollout, &binding.release) else {
            continue;
        };
        let earlier = stored.get(&binding.key);
        let Some(record) = stored_for(&stored, &binding.key, &rollout.canary.name) else {
            // A new canary (or the binding's first): it starts now.
            let record = fresh(&binding.key, &rollout.canary.name, Progress::start(now_ms));
            if store.put_rollout(earlier, &record).await? {
                tracing::info!(binding = %binding.key, canary = %record.canary, weight = record.progress.weight(&rollout.plan), "canary rollout started");
                book.put(record);
                changed = true;
            }
            continue;
        };
        let tallies = store
            .release_tallies(
                &binding.key.namespace,
                &binding.spec.tool,
                record.progress.step_started_ms,
            )
            .await?;
        let tally = |name: &str| tallies.get(name).copied().unwrap_or_default();
        let Some(progress) = judge(
            &rollout.plan,
            &record.progress,
            tally(&stable.name),
            tally(&record.canary),
            now_ms,
        ) else {
            continue;
        };
        let next = Record {
            progress,
            ..record.clone()
        };
        if store.put_rollout(Some(record), &next).await? {
            let weight = next.progress.weight(&rollout.plan);
            tracing::info!(binding = %binding.key, canary = %next.canary, phase = %next.progress.phase, weight, "{}", next.progress.message);
            book.put(next);
            changed = true;
        }
    }
    Ok(changed)
}

/// The stored record of `binding`'s rollout of `canary` (none for another canary).
fn stored_for<'r>(
    stored: &'r HashMap<ObjectKey, Record>,
    binding: &ObjectKey,
    canary: &str,
) -> Option<&'r Record> {
    stored.get(binding).filter(|r| r.canary == canary)
}

/// A record of `binding`'s rollout of `canary` the store does not have yet.
fn fresh(binding: &ObjectKey, canary: &str, progress: Progress) -> Record {
    Record {
        binding: binding.clone(),
        canary: canary.to_string(),
        progress,
    }
}

fn by_binding(records: Vec<Record>) -> HashMap<ObjectKey, Record> {
    records
        .into_iter()
        .map(|r| (r.binding.clone(), r))
        .collect()
}

/// A rollout as `toolgrid rollout status` shows it: where it is, and what each release
/// did since its step began.
pub struct Live {
    pub binding: ObjectKey,
    pub stable: String,
    pub record: Record,
    pub weight: u8,
    /// The step, from 1, of `steps`.
    pub step: u32,
    pub steps: Vec<u8>,
    pub stable_now: Tally,
    pub canary_now: Tally,
}

/// The bindings of `tool` in `namespace` with a canary.
fn rolled_out<'s>(
    snapshot: &'s Snapshot,
    namespace: &str,
    tool: &str,
) -> Vec<&'s Arc<ResolvedBinding>> {
    snapshot
        .bindings
        .values()
        .filter(|b| b.key.namespace == namespace && b.spec.tool == tool && b.rollout.is_some())
        .collect()
}

fn no_rollout(namespace: &str, tool: &str) -> ApiError {
    ApiError::new(
        ErrorKind::NotFound,
        format!("no binding of tool {tool:?} in namespace {namespace:?} has a Ready canary"),
    )
}

/// Where each rollout of `tool` is now.
pub async fn status(
    store: &dyn Store,
    snapshot: &Snapshot,
    namespace: &str,
    tool: &str,
) -> Result<Vec<Live>, ApiError> {
    let bindings = rolled_out(snapshot, namespace, tool);
    if bindings.is_empty() {
        return Err(no_rollout(namespace, tool));
    }
    let stored = by_binding(store.rollouts().await.map_err(ApiError::from)?);
    let mut out = Vec::new();
    for binding in bindings {
        let (Some(rollout), Some(stable)) = (&binding.rollout, &binding.release) else {
            continue;
        };
        let record = stored_for(&stored, &binding.key, &rollout.canary.name)
            .cloned()
            .unwrap_or_else(|| fresh(&binding.key, &rollout.canary.name, rollout.progress.clone()));
        let tallies = store
            .release_tallies(namespace, tool, record.progress.step_started_ms)
            .await
            .map_err(ApiError::from)?;
        out.push(Live {
            binding: binding.key.clone(),
            stable: stable.name.clone(),
            weight: record.progress.weight(&rollout.plan),
            step: record.progress.step_number(&rollout.plan),
            steps: rollout.plan.steps.clone(),
            stable_now: tallies.get(&stable.name).copied().unwrap_or_default(),
            canary_now: tallies.get(&record.canary).copied().unwrap_or_default(),
            record,
        });
    }
    Ok(out)
}

/// Carries out an operator's `order` on every rollout of `tool` (or the one of binding
/// `binding`); answers the rollouts as they are after it.
pub async fn order(
    store: &dyn Store,
    snapshot: &Snapshot,
    book: &RolloutBook,
    namespace: &str,
    tool: &str,
    binding: Option<&str>,
    order: Order,
) -> Result<Vec<Record>, ApiError> {
    let bindings: Vec<_> = rolled_out(snapshot, namespace, tool)
        .into_iter()
        .filter(|b| binding.is_none_or(|name| b.key.name == name))
        .collect();
    if bindings.is_empty() {
        return Err(no_rollout(namespace, tool));
    }
    let stored = by_binding(store.rollouts().await.map_err(ApiError::from)?);
    let now_ms = toolgrid_store::now_ms();
    let mut done = Vec::new();
    for binding in bindings {
        let Some(rollout) = &binding.rollout else {
            continue;
        };
        let earlier = stored.get(&binding.key);
        let current = stored_for(&stored, &binding.key, &rollout.canary.name)
            .cloned()
            .unwrap_or_else(|| fresh(&binding.key, &rollout.canary.name, Progress::start(now_ms)));
        let progress =
            apply(&rollout.plan, &current.progress, order, now_ms).map_err(|e| match e {
                OrderError::Ended(_) => ApiError::new(
                    ErrorKind::RolloutEnded,
                    format!(
                        "binding {}: {e}; change its rollout to start another",
                        binding.key
                    ),
                ),
            })?;
        let next = Record {
            progress,
            ..current
        };
        if !store
            .put_rollout(earlier, &next)
            .await
            .map_err(ApiError::from)?
        {
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                format!(
                    "binding {}: the rollout moved meanwhile; look again and retry",
                    binding.key
                ),
            ));
        }
        tracing::info!(binding = %binding.key, canary = %next.canary, phase = %next.progress.phase, weight = next.progress.weight(&rollout.plan), "{}", next.progress.message);
        book.put(next.clone());
        done.push(next);
    }
    book.changed.notify_one();
    Ok(done)
}
