//! Prometheus metrics of a control plane: reconciles, calls, queues, workers and the
//! store's commits and syncs. One registry per process, served at `/metrics` (the
//! controller's metrics port, or the HTTP API of `toolgrid up`).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use toolgrid_store::WriteCounters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub tool: String,
    /// `succeeded`, or the error kind.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// `caller` (the Tools and Workspaces APIs, HTTP) or `worker` (the worker link).
    pub door: String,
    /// The error kind (`unauthenticated`, `permission-denied`, `worker-id-in-use`, ...).
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

/// Where a call's time goes, stage by stage (`toolgrid bench calls --stages` reads them).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Stage {
    /// The caller's token checked (the Tools API's layer).
    Authenticate,
    /// Admission and the middleware chain, up to the store write.
    Admit,
    /// The admission's commit (with the assignment when a slot was free), up to its
    /// being visible; a call that waits for a slot or an approval, up to its being durable.
    StoreCommit,
    /// A call with a slot: its admission's sync, which runs beside the dispatch, the run
    /// and the link (its caller hears of the call only after it).
    StoreSync,
    /// From that commit to the assignment sent to the worker.
    Dispatch,
    /// The run on the worker, as the worker timed it.
    WorkerRun,
    /// From the assignment sent to its result received, less the run: the link both
    /// ways and the worker's own work around the run (fetching, instantiating).
    WorkerOverhead,
    /// From the result received to its commit.
    Completion,
    /// From the commit to the caller's answer being handed to the transport.
    Reply,
}

impl Stage {
    /// Whether the stage runs beside others of a call rather than after them (the
    /// admission's sync, beside the dispatch and the run): it is no part of their sum.
    pub fn runs_beside(self) -> bool {
        self == Stage::StoreSync
    }

    pub const ALL: [Stage; 9] = [
        Stage::Authenticate,
        Stage::Admit,
        Stage::StoreCommit,
        Stage::StoreSync,
        Stage::Dispatch,
        Stage::WorkerRun,
        Stage::WorkerOverhead,
        Stage::Completion,
        Stage::Reply,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Authenticate => "authenticate",
            Stage::Admit => "admit",
            Stage::StoreCommit => "store_commit",
            Stage::StoreSync => "store_sync",
            Stage::Dispatch => "dispatch",
            Stage::WorkerRun => "worker_run",
            Stage::WorkerOverhead => "worker_overhead",
            Stage::Completion => "completion",
            Stage::Reply => "reply",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: String,
}

/// Buckets fine enough to read a p50 within a few percent: 10 µs growing by a fifth,
/// up to about 3.5 s.
fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 1.2, 70))
}

/// Every metric this process exports.
pub struct Metrics {
    registry: Registry,
    pub reconcile_duration: Family<KindLabel, Histogram>,
    pub reconcile_errors: Family<KindLabel, Counter>,
    pub calls: Family<CallLabels, Counter>,
    pub queue_depth: Family<PoolLabel, Gauge>,
    pub workers: Family<PoolLabel, Gauge>,
    pub busy_slots: Family<PoolLabel, Gauge>,
    pub failovers: Counter,
    pub refusals: Family<RefusalLabels, Counter>,
    pub call_stages: Family<StageLabel, Histogram>,
    /// Each stage's series of `call_stages`, looked up at its first observation: a call
    /// observes several stages, and the family's lookup builds a label each time.
    stage_series: [OnceLock<Histogram>; Stage::ALL.len()],
    store_writes: Arc<StoreWrites>,
}

/// The serving store's commits and syncs ([`count_store_writes`]), read at each scrape as
/// `toolgrid_store_commits_total` and `toolgrid_store_syncs_total`: calls over syncs is how
/// many calls share what durability costs.
#[derive(Debug, Default)]
struct StoreWrites(RwLock<Option<WriteCounters>>);

impl Collector for StoreWrites {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters = self.0.read().unwrap_or_else(PoisonError::into_inner);
        let Some(counters) = counters.as_ref() else {
            return Ok(());
        };
        for (name, help, value) in [
            (
                "store_commits",
                "Write transactions the store has committed (concurrent writes share one)",
                counters.commits(),
            ),
            (
                "store_syncs",
                "Syncs that made the store's commits durable (on SQLite one fdatasync of its log makes every commit before it durable)",
                counters.syncs(),
            ),
        ] {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    fn new() -> Self {
        let mut registry = Registry::with_prefix("toolgrid");
        let reconcile_duration = Family::<KindLabel, Histogram>::new_with_constructor(
            reconcile_histogram as fn() -> Histogram,
        );
        let reconcile_errors = Family::<KindLabel, Counter>::default();
        let calls = Family::<CallLabels, Counter>::default();
        let queue_depth = Family::<PoolLabel, Gauge>::default();
        let workers = Family::<PoolLabel, Gauge>::default();
        let busy_slots = Family::<PoolLabel, Gauge>::default();
        let failovers = Counter::default();
        let refusals = Family::<RefusalLabels, Counter>::default();
        let call_stages = Family::<StageLabel, Histogram>::new_with_constructor(
            stage_histogram as fn() -> Histogram,
        );
        registry.register(
            "call_stage_seconds",
            "Time a call spends in each stage of its way (authenticate, admit, store_commit, dispatch, worker_run, worker_overhead, completion, reply)",
            call_stages.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent reconciling one resource",
            reconcile_duration.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed",
            reconcile_errors.clone(),
        );
        registry.register(
            "calls",
            "Calls that ended, by tool and outcome",
            calls.clone(),
        );
        registry.register(
            "queue_depth",
            "Calls waiting for a worker slot",
            queue_depth.clone(),
        );
        registry.register("workers", "Workers attached", workers.clone());
        registry.register(
            "busy_slots",
            "Worker slots running a call",
            busy_slots.clone(),
        );
        registry.register(
            "failovers",
            "Calls taken from a lost worker to run elsewhere",
            failovers.clone(),
        );
        registry.register(
            "refusals",
            "Requests refused by authentication or authorization, by door and kind",
            refusals.clone(),
        );
        let store_writes = Arc::new(StoreWrites::default());
        registry.register_collector(Box::new(store_writes.clone()));
        Metrics {
            registry,
            reconcile_duration,
            reconcile_errors,
            calls,
            queue_depth,
            workers,
            busy_slots,
            failovers,
            refusals,
            call_stages,
            stage_series: Default::default(),
            store_writes,
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::new)
}

/// Counts an ended call.
pub fn call_ended(tool: &str, outcome: &str) {
    global()
        .calls
        .get_or_create(&CallLabels {
            tool: tool.to_string(),
            outcome: outcome.to_string(),
        })
        .inc();
}

/// Records the time one call spent in `stage`.
pub fn stage(stage: Stage, elapsed: std::time::Duration) {
    let metrics = global();
    metrics.stage_series[stage as usize]
        .get_or_init(|| {
            metrics
                .call_stages
                .get_or_create(&StageLabel {
                    stage: stage.as_str().to_string(),
                })
                .clone()
        })
        .observe(elapsed.as_secs_f64());
}

/// Exports the commits and syncs of the store this process serves from (the last one
/// given).
pub fn count_store_writes(counters: WriteCounters) {
    *global()
        .store_writes
        .0
        .write()
        .unwrap_or_else(PoisonError::into_inner) = Some(counters);
}

/// Counts a refused request: `door` is `caller` or `worker`.
pub fn refused(door: &str, kind: &str) {
    global()
        .refusals
        .get_or_create(&RefusalLabels {
            door: door.to_string(),
            kind: kind.to_string(),
        })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exported_in_text_format() {
        call_ended("semver", "succeeded");
        global()
            .reconcile_duration
            .get_or_create(&KindLabel {
                kind: "Tool".into(),
            })
            .observe(0.01);
        let text = global().encode();
        assert!(
            text.contains("toolgrid_calls_total{tool=\"semver\",outcome=\"succeeded\"}"),
            "{text}"
        );
        assert!(
            text.contains("toolgrid_reconcile_duration_seconds_bucket"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    /// The value of the series `name` (labels and all) as exported, if it is.
    fn exported(name: &str) -> Option<u64> {
        let prefix = format!("{name} ");
        global().encode().lines().find_map(|line| {
            line.strip_prefix(prefix.as_str())
                .map(|n| n.parse().unwrap())
        })
    }

    #[tokio::test]
    async fn the_serving_stores_commits_and_syncs_are_exported_as_they_grow() {
        use toolgrid_store::Artifacts;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = toolgrid_store::SqlStore::open(&url).await.unwrap();
        count_store_writes(store.write_counters());
        let before = (
            exported("toolgrid_store_commits_total").unwrap(),
            exported("toolgrid_store_syncs_total").unwrap(),
        );
        store.put_artifact("sha256:a", vec![1, 2, 3]).await.unwrap();
        // One write on its own: one commit, one sync.
        assert_eq!(exported("toolgrid_store_commits_total"), Some(before.0 + 1));
        assert_eq!(exported("toolgrid_store_syncs_total"), Some(before.1 + 1));
    }

    /// The observations of `stage` so far, as exported.
    fn stage_count(stage: Stage) -> u64 {
        exported(&format!(
            "toolgrid_call_stage_seconds_count{{stage=\"{}\"}}",
            stage.as_str()
        ))
        .unwrap_or(0)
    }

    #[test]
    fn each_stage_is_observed_under_its_own_label() {
        for (i, stage) in Stage::ALL.into_iter().enumerate() {
            assert_eq!(
                stage as usize, i,
                "{stage:?}'s place in its array of series"
            );
        }
        // Other tests of this process may observe stages too: counts only grow.
        let before = Stage::ALL.map(stage_count);
        stage(Stage::WorkerOverhead, std::time::Duration::from_millis(2));
        stage(Stage::WorkerOverhead, std::time::Duration::from_millis(3));
        stage(Stage::Reply, std::time::Duration::from_millis(1));
        let after = Stage::ALL.map(stage_count);
        assert!(
            after[Stage::WorkerOverhead as usize] >= before[Stage::WorkerOverhead as usize] + 2
        );
        assert!(after[Stage::Reply as usize] > before[Stage::Reply as usize]);
    }
}
