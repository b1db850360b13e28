//! One kube-rs Controller a kind. The shared reconcile logic has already decided every
//! status (the catalog snapshot); a controller writes it through the status subresource with
//! server-side apply, emits events on Ready transitions, and does its kind's own work:
//! a WorkerPool's Deployment, a ToolRelease's finalizer while calls are in flight.

use super::deployment::{
    DELETION_COST, POOL_LABEL, WorkerSettings, deletion_costs, deployment_name, desired_deployment,
    desired_service_account, desired_workers,
};
use super::status::{
    LivePool, MANAGER, pool_status, ready_transition, status_change, status_json, status_patch,
};
use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, ListParams, PartialObjectMeta, Patch, PatchParams};
use kube::core::object::HasStatus;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::Store as Cache;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Predicate, WatchStreamExt, predicates, watcher};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_stream::wrappers::WatchStream;
use toolgrid_api::{
    Agent, Kind, Middleware, Tool, ToolBinding, ToolRelease, ToolSource, WorkerPool,
};
use toolgrid_catalog::{Catalog, ResourceId, ResourceState, Snapshot};
use toolgrid_control_plane::metrics::{self, KindLabel};
use toolgrid_control_plane::scheduler::Scheduler;
use toolgrid_core::ids::ObjectKey;

/// Keeps a ToolRelease until its calls have ended.
pub const RELEASE_FINALIZER: &str = "toolgrid.dev/calls-in-flight";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    #[error("{0} calls of the release have not ended yet")]
    CallsInFlight(usize),
    #[error("cannot serialize: {0}")]
    Serde(#[from] serde_json::Error),
}

/// What every reconcile needs.
pub struct Context {
    pub client: Client,
    pub catalog: Arc<Catalog>,
    pub scheduler: Arc<Scheduler>,
    pub recorder: Recorder,
    pub workers: WorkerSettings,
    pub namespace: Option<String>,
    /// The ServiceAccounts that exist (the source's metadata watch): a pool's worker
    /// account is made only when missing.
    pub service_accounts: Cache<PartialObjectMeta<ServiceAccount>>,
}

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

fn kind_of<K: Resource<DynamicType = ()>>() -> Kind {
    Kind::parse(&K::kind(&())).unwrap_or(Kind::Tool)
}

/// The resolved state of an object, once the catalog has caught up with it.
fn resolved<K: Resource<DynamicType = ()>>(ctx: &Context, object: &K) -> Option<ResourceState> {
    let id = ResourceId {
        kind: kind_of::<K>(),
        key: key_of(object),
    };
    ctx.catalog.current().resources.get(&id).cloned()
}

/// Writes `desired` as the object's status when it differs, and tells of a Ready change.
async fn write_status<K>(ctx: &Context, object: &K, desired: &Value) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + HasStatus
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
    K::Status: Serialize,
{
    let current = status_json(object);
    let Some(status) = status_change(&current, desired) else {
        return Ok(());
    };
    let key = key_of(object);
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let patch = status_patch(
        &K::api_version(&()),
        &K::kind(&()),
        &key.namespace,
        &key.name,
        &status,
    );
    api.patch_status(
        &key.name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    if let Some((ready, reason, message)) = ready_transition(&current, desired) {
        let event = KubeEvent {
            type_: if ready {
                EventType::Normal
            } else {
                EventType::Warning
            },
            reason,
            note: Some(truncate_bytes(&message, 1024)),
            action: if ready {
                "BecameReady".into()
            } else {
                "BecameNotReady".into()
            },
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(%error, resource = %key, "cannot publish an event");
        }
    }
    if let Some((reason, message)) = super::status::rolled_back(&current, desired) {
        let event = KubeEvent {
            type_: EventType::Warning,
            reason,
            note: Some(truncate_bytes(&message, 1024)),
            action: "RolledBack".into(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(%error, resource = %key, "cannot publish an event");
        }
    }
    Ok(())
}

/// Tools, bindings, middleware and agents: the resolved status is all there is.
pub(crate) async fn reconcile_resolved<K>(
    object: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + HasStatus
        + Serialize
        + DeserializeOwned
        + Clone
        + Debug,
    K::Status: Serialize,
{
    let Some(state) = resolved(&ctx, &*object) else {
        // The catalog has not resolved this object yet; it will trigger us when it has.
        return Ok(Action::requeue(Duration::from_secs(2)));
    };
    write_status(&ctx, &*object, &state.status).await?;
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Releases carry a finalizer, so one with calls in flight outlives its deletion until they
/// end.
pub(crate) async fn reconcile_release(
    release: Arc<ToolRelease>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let key = key_of(&*release);
    let api: Api<ToolRelease> = Api::namespaced(ctx.client.clone(), &key.namespace);
    finalizer(&api, RELEASE_FINALIZER, release, |event| async {
        match event {
            FinalizerEvent::Apply(release) => reconcile_resolved(release, ctx.clone()).await,
            FinalizerEvent::Cleanup(release) => {
                let key = key_of(&*release);
                match ctx.scheduler.calls_of_release(&key.namespace, &key.name) {
                    0 => Ok(Action::await_change()),
                    running => Err(Error::CallsInFlight(running)),
                }
            }
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// A pool's worker ServiceAccount (made when missing), its Deployment (created or updated
/// with server-side apply) and live status.
pub(crate) async fn reconcile_pool(
    pool: Arc<WorkerPool>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let Some(state) = resolved(&ctx, &*pool) else {
        return Ok(Action::requeue(Duration::from_secs(2)));
    };
    if !state.ready.status {
        // An invalid pool keeps whatever it had; the status says why.
        write_status(&ctx, &*pool, &state.status).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    let key = key_of(&*pool);
    let mut live = LivePool::observe(
        &key.to_string(),
        &ctx.scheduler.workers(),
        &ctx.scheduler.queued(),
        ctx.scheduler.reattaching(),
    );
    let account = ObjectKey::new(
        key.namespace.clone(),
        pool.spec.service_account_name(&key.name),
    );
    let exists = ctx
        .service_accounts
        .state()
        .iter()
        .any(|sa| key_of(&**sa) == account);
    if let Some(service_account) = desired_service_account(&pool, exists) {
        let accounts: Api<ServiceAccount> = Api::namespaced(ctx.client.clone(), &key.namespace);
        accounts
            .patch(
                &account.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&service_account),
            )
            .await?;
    }
    let desired = desired_workers(&pool, live.busy, live.queued);
    let before = pool.status.as_ref().map_or(0, |s| s.desired_workers);
    if desired < before {
        // Scale-in: the least busy workers go first (each drains on its SIGTERM).
        mark_deletion_costs(&ctx, &key).await;
    }
    let deployment = desired_deployment(&pool, &ctx.workers, desired);
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let applied = deployments
        .patch(
            &deployment_name(&key.name),
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&deployment),
        )
        .await?;
    let ready = applied
        .status
        .and_then(|s| s.ready_replicas)
        .and_then(|r| u32::try_from(r).ok())
        .unwrap_or_default();
    let current = status_json(&*pool);
    live.desired = desired;
    live.ready = ready;
    let status = pool_status(&state, &current, live, k8s_openapi::jiff::Timestamp::now());
    write_status(&ctx, &*pool, &status).await?;
    // Live counts change without any watch event: look again soon.
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// Annotates each worker pod of pool `key` with its deletion cost (the calls its worker
/// holds), so the Deployment's scale-in removes the least busy first. Best effort: a
/// failure is logged, and the scale-in goes on.
async fn mark_deletion_costs(ctx: &Context, key: &ObjectKey) {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let listed = match pods
        .list(&ListParams::default().labels(&format!("{POOL_LABEL}={}", key.name)))
        .await
    {
        Ok(listed) => listed,
        Err(error) => {
            tracing::warn!(pool = %key, %error, "cannot list the pool's pods to rank them for scale-in");
            return;
        }
    };
    let named: Vec<(String, Option<String>)> = listed
        .items
        .iter()
        .filter_map(|pod| {
            let name = pod.metadata.name.clone()?;
            let cost = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(DELETION_COST))
                .cloned();
            Some((name, cost))
        })
        .collect();
    for (name, cost) in deletion_costs(&named, &ctx.scheduler.workers()) {
        let patch = serde_json::json!({"metadata": {"annotations": {DELETION_COST: cost}}});
        if let Err(error) = pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!(pool = %key, pod = %name, %error, "cannot set the pod's deletion cost");
        }
    }
}

fn error_policy<K: Resource<DynamicType = ()>>(
    object: Arc<K>,
    error: &Error,
    _ctx: Arc<Context>,
) -> Action {
    let kind = K::kind(&()).to_string();
    if is_finalizer_race(error) {
        // Another writer changed the object between our read and the finalizer patch;
        // the watch brings the new version, so this is not a failure worth counting.
        tracing::debug!(%kind, resource = %key_of(&*object), %error, "finalizer patch raced");
        return Action::requeue(Duration::from_millis(500));
    }
    metrics::global()
        .reconcile_errors
        .get_or_create(&KindLabel { kind: kind.clone() })
        .inc();
    match error {
        Error::Finalizer(inner)
            if matches!(
                **inner,
                kube::runtime::finalizer::Error::CleanupFailed(Error::CallsInFlight(_))
            ) =>
        {
            tracing::info!(resource = %key_of(&*object), "{error}; waiting before deleting");
        }
        _ => tracing::warn!(%kind, resource = %key_of(&*object), %error, "reconcile failed"),
    }
    Action::requeue(Duration::from_secs(5))
}

/// Whether adding or removing the finalizer lost a race with another writer (the JSON
/// patch's test of the finalizer list failed).
fn is_finalizer_race(error: &Error) -> bool {
    use kube::runtime::finalizer::Error as FinalizerError;
    let Error::Finalizer(inner) = error else {
        return false;
    };
    matches!(
        &**inner,
        FinalizerError::AddFinalizer(kube::Error::Api(status))
            | FinalizerError::RemoveFinalizer(kube::Error::Api(status))
            if status.code == 409 || status.code == 422
    )
}

/// Cuts `text` to at most `max` bytes on a character boundary: the Events API limits
/// a note to 1 KiB.
fn truncate_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Times a reconcile for the metrics.
async fn timed<K, F, Fut>(object: Arc<K>, ctx: Arc<Context>, reconcile: F) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()>,
    F: FnOnce(Arc<K>, Arc<Context>) -> Fut,
    Fut: std::future::Future<Output = Result<Action, Error>>,
{
    let started = Instant::now();
    let result = reconcile(object, ctx).await;
    metrics::global()
        .reconcile_duration
        .get_or_create(&KindLabel {
            kind: K::kind(&()).to_string(),
        })
        .observe(started.elapsed().as_secs_f64());
    result
}

/// The objects of kind `K` in a cache of the controller's own, and the changes that
/// reconcile them: spec (generation) and finalizer changes; the controller's own status
/// writes change neither. The cache is written before each change is passed on, so a
/// reconcile never reads an object older than the change that triggered it. (With the
/// catalog source's caches, kept by watches of their own, a ToolRelease's reconcile after
/// its finalizer was added often read it without the finalizer, and the finalizer helper's
/// patch failed on the race and was retried: 230 of 300 releases at a start.)
#[allow(clippy::type_complexity)]
fn watched<K>(
    ctx: &Context,
) -> (
    Cache<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<K> = super::source::api(&ctx.client, ctx.namespace.as_deref());
    let (cache, writer) = reflector::store();
    let stream = watcher(api, watcher::Config::default().any_semantic())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            predicates::generation.combine(predicates::finalizers),
            Default::default(),
        );
    (cache, stream)
}

fn snapshots(ctx: &Context) -> impl futures::Stream<Item = ()> + Send + 'static {
    WatchStream::new(ctx.catalog.subscribe()).map(|_| ())
}

/// The objects of kind `K` whose resolved state each published snapshot changed (every one
/// at the first): reconciling only those keeps a change to one tool from reconciling, and
/// comparing the status of, every object of a catalog of thousands.
fn changed<K>(ctx: &Context) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + 'static,
{
    let kind = kind_of::<K>();
    let mut previous: Option<Arc<Snapshot>> = None;
    WatchStream::new(ctx.catalog.subscribe()).flat_map(move |snapshot| {
        let refs: Vec<ObjectRef<K>> = snapshot
            .changed_since(previous.as_deref(), kind)
            .map(|key| ObjectRef::new(&key.name).within(&key.namespace))
            .collect();
        previous = Some(snapshot);
        futures::stream::iter(refs)
    })
}

async fn drain<S: futures::Stream + Unpin>(mut stream: S) {
    while stream.next().await.is_some() {}
}

/// Runs the controllers until the process ends, each on a watch and cache of its own
/// ([`watched`]), reconciling what a change of its kind or a published snapshot moved
/// ([`changed`]).
pub async fn run(ctx: Arc<Context>) {
    macro_rules! resolved_controller {
        ($kind:ty) => {{
            let (cache, changes) = watched::<$kind>(&ctx);
            let stream = Controller::for_stream(changes, cache)
                .reconcile_on(changed::<$kind>(&ctx))
                .run(
                    |object, ctx| timed(object, ctx, reconcile_resolved::<$kind>),
                    error_policy::<$kind>,
                    ctx.clone(),
                );
            drain(Box::pin(stream))
        }};
    }
    let tools = resolved_controller!(Tool);
    let bindings = resolved_controller!(ToolBinding);
    let middleware = resolved_controller!(Middleware);
    let agents = resolved_controller!(Agent);
    let sources = resolved_controller!(ToolSource);
    let (release_cache, release_changes) = watched::<ToolRelease>(&ctx);
    let releases = drain(Box::pin(
        Controller::for_stream(release_changes, release_cache)
            .reconcile_on(changed::<ToolRelease>(&ctx))
            .run(
                |object, ctx| timed(object, ctx, reconcile_release),
                error_policy::<ToolRelease>,
                ctx.clone(),
            ),
    ));
    let deployments: Api<Deployment> = super::source::api(&ctx.client, ctx.namespace.as_deref());
    let (pools_cache, pool_changes) = watched::<WorkerPool>(&ctx);
    let pools = drain(Box::pin(
        Controller::for_stream(pool_changes, pools_cache)
            .owns(
                deployments,
                watcher::Config::default().labels("app.kubernetes.io/name=toolgrid-worker"),
            )
            .reconcile_all_on(snapshots(&ctx))
            .run(
                |object, ctx| timed(object, ctx, reconcile_pool),
                error_policy::<WorkerPool>,
                ctx.clone(),
            ),
    ));
    tokio::join!(
        tools, bindings, middleware, agents, sources, releases, pools
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;
    use kube::runtime::finalizer::Error as FinalizerError;

    #[test]
    fn event_notes_fit_the_api_limit_on_a_char_boundary() {
        assert_eq!(truncate_bytes("short", 1024), "short");
        let long = "é".repeat(600); // 1200 bytes
        let cut = truncate_bytes(&long, 1024);
        assert_eq!(cut.len(), 1024);
        let odd = format!("a{long}");
        let cut = truncate_bytes(&odd, 1024);
        assert_eq!(cut.len(), 1023, "never splits a character");
        assert!(odd.starts_with(&cut));
    }

    #[test]
    fn only_finalizer_patch_conflicts_count_as_races() {
        let api = |code| {
            kube::Error::Api(
                Status::failure("patch failed", "Invalid")
                    .with_code(code)
                    .boxed(),
            )
        };
        let finalizer = |e| Error::Finalizer(Box::new(e));
        assert!(is_finalizer_race(&finalizer(FinalizerError::AddFinalizer(
            api(422)
        ))));
        assert!(is_finalizer_race(&finalizer(
            FinalizerError::RemoveFinalizer(api(409))
        )));
        assert!(!is_finalizer_race(&finalizer(
            FinalizerError::AddFinalizer(api(403))
        )));
        assert!(!is_finalizer_race(&finalizer(
            FinalizerError::UnnamedObject
        )));
        assert!(!is_finalizer_race(&Error::Kube(api(422))));
    }
}
