//! The Kubernetes source of the catalog: reflectors of the six kinds and of the ConfigMaps,
//! Secrets and ServiceAccounts they refer to, resolved by the same reconcile logic as a
//! manifest directory ([`toolgrid_catalog::resolve`]) whenever something it reads changes
//! (not the controller's own status writes: [`crate::wake`]).

use crate::checked::{CheckKey, Checked};
use crate::fetch::{FetchPolicy, fetch};
use crate::status::status_json;
use crate::wake::{Stamps, Wake};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::api::{Api, PartialObjectMeta};
use kube::core::object::HasStatus;
use kube::runtime::reflector::{self, Store as Cache};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use toolgrid_api::conditions::Reason;
use toolgrid_api::{
    Agent, Kind, Middleware, REFRESH_ANNOTATION, Tool, ToolBinding, ToolRelease, ToolSource,
    WorkerPool,
};
use toolgrid_catalog::artifacts::{
    ArtifactOutcome, LoadedArtifact, LoadedFile, WasmArtifact, about_file, check_bytes, check_file,
    check_files, check_middleware_bytes, config_map_entry, config_map_key, source_kind,
};
use toolgrid_catalog::manifest::{ResourceSet, Source, Sourced};
use toolgrid_catalog::resolve::tool_source::status_is_current;
use toolgrid_catalog::resolve::{PreviousState, ResolveInput, SourceRead, check_source, resolve};
use toolgrid_catalog::{Catalog, Identities, ResourceId, Snapshot};
use toolgrid_control_plane::artifacts::StoredArtifacts;
use toolgrid_control_plane::tool_sources::reader::{Request, SourceReader, Wanted};
use toolgrid_core::artifact::FileRef;
use toolgrid_core::artifact::is_valid_digest;
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::source::SourceLimits;
use toolgrid_core::spec::{ArtifactSource, ReleaseFile};
use toolgrid_store::Store;

/// How long changes settle before the catalog is resolved again.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// How long a failed URL fetch is remembered before it is tried again.
const FETCH_RETRY: Duration = Duration::from_secs(60);

/// An API for a kind, in one namespace or all.
pub fn api<K>(client: &Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Caches of everything the catalog is resolved from.
#[derive(Clone)]
pub struct Caches {
    pub tools: Cache<Tool>,
    pub releases: Cache<ToolRelease>,
    pub bindings: Cache<ToolBinding>,
    pub middleware: Cache<Middleware>,
    pub agents: Cache<Agent>,
    pub pools: Cache<WorkerPool>,
    pub tool_sources: Cache<ToolSource>,
    pub config_maps: Cache<ConfigMap>,
    pub secrets: Cache<PartialObjectMeta<Secret>>,
    pub service_accounts: Cache<PartialObjectMeta<ServiceAccount>>,
}

/// Outcomes of URL fetches by (url, digest): a success (`ready`) is kept, a failure is
/// answered again only until [`FETCH_RETRY`] has passed since it was found.
struct FetchCache<T> {
    entries: Mutex<HashMap<(String, String), (T, std::time::Instant)>>,
    ready: fn(&T) -> bool,
}

impl<T: Clone> FetchCache<T> {
    fn new(ready: fn(&T) -> bool) -> Self {
        FetchCache {
            entries: Mutex::default(),
            ready,
        }
    }

    fn get(&self, key: &(String, String)) -> Option<T> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (known, at) = entries.get(key)?;
        ((self.ready)(known) || at.elapsed() < FETCH_RETRY).then(|| known.clone())
    }

    fn put(&self, key: (String, String), outcome: T) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, (outcome, std::time::Instant::now()));
    }
}

/// Feeds the catalog from the cluster.
pub struct ClusterSource {
    pub caches: Caches,
    /// The contents of the Secrets Agents name (the watch sees only their metadata).
    secret_contents: super::agent_data::SecretContents,
    catalog: Arc<Catalog>,
    store: Arc<dyn Store>,
    changed: Arc<Notify>,
    /// Outcomes of fetching artifacts from URLs, by (url, digest): a success is kept, a
    /// failure is tried again after [`FETCH_RETRY`]. Never by digest alone: another release
    /// naming the same digest at a wrong URL must not decide this one.
    fetched: FetchCache<ArtifactOutcome>,
    /// What became of each release file's URL and digest (`spec.files`), like `fetched`.
    fetched_files: FetchCache<Result<FileRef, (Reason, String)>>,
    /// The same for wasm Middleware components, kept with their bytes (the gateway runs
    /// them; they are not put in the store).
    fetched_wasm: FetchCache<WasmArtifact>,
    stored: StoredArtifacts,
    /// Outcomes of checking the artifacts kept in ConfigMaps ([`crate::checked`]).
    checked: Mutex<Checked>,
    /// Where artifacts may be downloaded from ([`crate::fetch`]).
    fetch_policy: FetchPolicy,
    /// Reads ToolSources' upstreams in the background; a read landing resolves again.
    reader: Arc<SourceReader>,
    /// Mints the token an `auth: {type: identity}` source is listed with.
    issuer: toolgrid_control_plane::identity::IssuerCell,
    /// The built-in tools served beside the cluster's resources (`--builtins`).
    builtins: Option<Arc<crate::builtins::Builtins>>,
    /// Where each binding's canary rollout is; a change resolves again.
    rollouts: Arc<toolgrid_control_plane::rollout::RolloutBook>,
}

/// A cache of kind `K` kept by a watch; the events `wake` names resolve the catalog again.
fn reflect<K>(api: Api<K>, changed: Arc<Notify>, wake: Wake) -> Cache<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default().any_semantic()).default_backoff(),
    );
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut stamps = Stamps::new(wake);
        while let Some(event) = stream.next().await {
            let wakes = match &event {
                Ok(event) => stamps.wakes(event),
                Err(error) => {
                    tracing::warn!(%error, "watch error");
                    true
                }
            };
            if wakes {
                changed.notify_one();
            }
        }
    });
    reader
}

fn key_of<K: Resource>(object: &K) -> ObjectKey {
    ObjectKey::new(
        object.meta().namespace.clone().unwrap_or_default(),
        object.meta().name.clone().unwrap_or_default(),
    )
}

fn sourced<K: Resource<DynamicType = ()> + Clone>(cache: &Cache<K>) -> Vec<Sourced<K>> {
    cache
        .state()
        .iter()
        .map(|object| {
            let key = key_of(&**object);
            Sourced {
                object: (**object).clone(),
                source: Source::cluster(&K::kind(&()), &key.namespace, &key.name),
            }
        })
        .collect()
}

/// What the cluster says each resource's status is now (conditions keep their times).
fn previous_of<K>(kind: Kind, cache: &Cache<K>, into: &mut HashMap<ResourceId, PreviousState>)
where
    K: Resource<DynamicType = ()> + HasStatus + Clone,
    K::Status: serde::Serialize,
{
    for object in cache.state() {
        let status = status_json(&*object);
        into.insert(
            ResourceId {
                kind,
                key: key_of(&*object),
            },
            PreviousState {
                spec_hash: String::new(),
                generation: object.meta().generation.unwrap_or(1),
                status,
            },
        );
    }
}

impl ClusterSource {
    /// Starts the watches (in `namespace`, or everywhere).
    pub fn start(
        client: &Client,
        namespace: Option<&str>,
        control_plane: &toolgrid_control_plane::platform::ControlPlane,
        fetch_policy: FetchPolicy,
        builtins: Option<Arc<crate::builtins::Builtins>>,
    ) -> Arc<Self> {
        let catalog = control_plane.catalog.clone();
        let store = control_plane.store.clone();
        let issuer = control_plane.gateway.issuer();
        let rollouts = control_plane.gateway.rollouts();
        let changed = Arc::new(Notify::new());
        // What of each kind's changes resolves again ([`crate::wake`]).
        let (input, any) = (Wake::InputChange, Wake::AnyChange);
        let caches = Caches {
            tools: reflect(api::<Tool>(client, namespace), changed.clone(), input),
            releases: reflect(
                api::<ToolRelease>(client, namespace),
                changed.clone(),
                input,
            ),
            bindings: reflect(
                api::<ToolBinding>(client, namespace),
                changed.clone(),
                input,
            ),
            middleware: reflect(api::<Middleware>(client, namespace), changed.clone(), input),
            agents: reflect(api::<Agent>(client, namespace), changed.clone(), input),
            pools: reflect(api::<WorkerPool>(client, namespace), changed.clone(), input),
            tool_sources: reflect(api::<ToolSource>(client, namespace), changed.clone(), any),
            config_maps: reflect(api::<ConfigMap>(client, namespace), changed.clone(), any),
            // Only names are needed: metadata-only watches.
            secrets: reflect(
                api::<PartialObjectMeta<Secret>>(client, namespace),
                changed.clone(),
                any,
            ),
            service_accounts: reflect(
                api::<PartialObjectMeta<ServiceAccount>>(client, namespace),
                changed.clone(),
                any,
            ),
        };
        Arc::new(ClusterSource {
            caches,
            secret_contents: super::agent_data::SecretContents::new(client.clone()),
            catalog,
            store,
            changed,
            fetched: FetchCache::new(|o| matches!(o, ArtifactOutcome::Ready { .. })),
            fetched_files: FetchCache::new(Result::is_ok),
            fetched_wasm: FetchCache::new(|w| matches!(w, WasmArtifact::Ready { .. })),
            stored: StoredArtifacts::default(),
            checked: Mutex::default(),
            fetch_policy,
            reader: SourceReader::new(SourceLimits::default()),
            issuer,
            builtins,
            rollouts,
        })
    }

    fn checked(&self) -> std::sync::MutexGuard<'_, Checked> {
        self.checked.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every cache has listed once.
    pub async fn wait_synced(&self) -> anyhow::Result<()> {
        let c = &self.caches;
        c.tools.wait_until_ready().await?;
        c.releases.wait_until_ready().await?;
        c.bindings.wait_until_ready().await?;
        c.middleware.wait_until_ready().await?;
        c.agents.wait_until_ready().await?;
        c.pools.wait_until_ready().await?;
        c.tool_sources.wait_until_ready().await?;
        c.config_maps.wait_until_ready().await?;
        c.secrets.wait_until_ready().await?;
        c.service_accounts.wait_until_ready().await?;
        Ok(())
    }

    /// Resolves again whenever something changed, until the task is dropped.
    pub async fn drive(self: Arc<Self>) {
        loop {
            if let Err(error) = self.resolve_once().await {
                tracing::error!(%error, "cannot resolve the catalog");
            }
            tokio::select! {
                _ = self.changed.notified() => {}
                _ = self.reader.landed.notified() => {}
                _ = self.rollouts.changed.notified() => {}
            }
            tokio::time::sleep(DEBOUNCE).await;
        }
    }

    /// Everything the cluster declares, as the shared reconcile logic takes it, with the
    /// built-ins under it.
    pub fn resource_set(&self) -> ResourceSet {
        let c = &self.caches;
        let set = ResourceSet {
            tools: sourced(&c.tools),
            releases: sourced(&c.releases),
            bindings: sourced(&c.bindings),
            middleware: sourced(&c.middleware),
            agents: sourced(&c.agents),
            pools: sourced(&c.pools),
            tool_sources: sourced(&c.tool_sources),
            config_maps: sourced(&c.config_maps),
            // Secrets reach the catalog through `identities`, as data.
            secrets: Vec::new(),
            invalid: Vec::new(),
            ignored: 0,
        };
        match &self.builtins {
            Some(builtins) => builtins.under(set),
            None => set,
        }
    }

    /// What Agents may refer to: every ServiceAccount, Secret and ConfigMap by name, with
    /// the contents of the Secrets and ConfigMaps Agents name ([`Self::agent_data`]).
    async fn identities(&self) -> Identities {
        let data = self.agent_data().await;
        let c = &self.caches;
        Identities {
            service_accounts: Some(
                c.service_accounts
                    .state()
                    .iter()
                    .map(|o| key_of(&**o))
                    .collect(),
            ),
            // The watch is metadata-only: every Secret is known by name; only those Agents
            // name were read, by name, for their keys and values.
            secrets: c
                .secrets
                .state()
                .iter()
                .map(|o| key_of(&**o))
                .map(|key| {
                    let values = data
                        .secrets
                        .get(&key)
                        .map(|keys| {
                            keys.iter()
                                .map(|(k, v)| {
                                    (
                                        k.clone(),
                                        toolgrid_core::secret::SecretValue::new(v.clone()),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default();
                    (key, values)
                })
                .collect(),
            config_maps: c
                .config_maps
                .state()
                .iter()
                .map(|o| (key_of(&**o), Identities::config_data(o)))
                .collect(),
        }
    }

    /// The contents of the Secrets and ConfigMaps Agents name
    /// ([`super::agent_data::agent_data`]): Secrets are read by name, again only when their
    /// resourceVersion changes.
    pub async fn agent_data(&self) -> super::agent_data::AgentData {
        let c = &self.caches;
        let agents: Vec<Arc<Agent>> = c.agents.state();
        let mut wanted = super::agent_data::references(agents.iter().map(|a| &**a));
        let sources = c.tool_sources.state();
        wanted.secrets.extend(super::agent_data::source_references(
            sources.iter().map(|s| &**s),
        ));
        let existing = c
            .secrets
            .state()
            .iter()
            .map(|o| {
                (
                    key_of(&**o),
                    o.metadata.resource_version.clone().unwrap_or_default(),
                )
            })
            .collect();
        let secrets = self
            .secret_contents
            .refresh(&wanted.secrets, &existing)
            .await;
        let config_maps = c.config_maps.state();
        super::agent_data::data_of(&wanted, &secrets, config_maps.iter().map(|c| &**c))
    }

    /// Loads every artifact, resolves, stores new artifacts and publishes the snapshot.
    pub async fn resolve_once(&self) -> anyhow::Result<Arc<Snapshot>> {
        let set = self.resource_set();
        self.checked().next_round();
        let mut artifacts = HashMap::new();
        for release in &set.releases {
            let builtin = (!release.source.is_cluster())
                .then(|| self.builtins.as_ref()?.artifact(&key_of(&release.object)))
                .flatten();
            let loaded = match builtin {
                Some(loaded) => loaded,
                None => self.load_artifact(release, &set).await,
            };
            let outcome = self.stored.keep(&*self.store, loaded).await?;
            artifacts.insert(key_of(&release.object), outcome);
        }
        let mut wasm = HashMap::new();
        for middleware in &set.middleware {
            if let Some(loaded) = self.load_wasm(middleware, &set).await {
                wasm.insert(key_of(&middleware.object), loaded);
            }
        }
        let c = &self.caches;
        let mut previous = HashMap::new();
        previous_of(Kind::Tool, &c.tools, &mut previous);
        previous_of(Kind::ToolRelease, &c.releases, &mut previous);
        previous_of(Kind::ToolBinding, &c.bindings, &mut previous);
        previous_of(Kind::Middleware, &c.middleware, &mut previous);
        previous_of(Kind::Agent, &c.agents, &mut previous);
        previous_of(Kind::WorkerPool, &c.pools, &mut previous);
        previous_of(Kind::ToolSource, &c.tool_sources, &mut previous);
        let identities = self.identities().await;
        let source_reads = self.source_reads(&identities);
        let current = self.catalog.current();
        let snapshot = resolve(&ResolveInput {
            set: &set,
            artifacts: &artifacts,
            wasm: &wasm,
            previous: &previous,
            now: k8s_openapi::jiff::Timestamp::now(),
            identities: Some(&identities),
            source_reads: &source_reads,
            rollouts: &self.rollouts.records(),
            reuse: Some(&*current),
        });
        Ok(self.catalog.publish(snapshot))
    }

    /// The reads of the ToolSources, starting those that are due: a source is read when its
    /// status holds no snapshot for its generation and its `toolgrid.dev/refresh`
    /// annotation, never otherwise (the status is where the snapshot lives).
    fn source_reads(&self, identities: &Identities) -> HashMap<ObjectKey, SourceRead> {
        let sources = self.caches.tool_sources.state();
        let requests = sources
            .iter()
            .filter_map(|source| {
                let key = key_of(&**source);
                let plan = check_source(source, &key).ok()?;
                let generation = source.metadata.generation.unwrap_or(1);
                let refresh = source
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(REFRESH_ANNOTATION))
                    .cloned();
                let stored = source
                    .status
                    .as_ref()
                    .and_then(|s| status_is_current(s, generation, refresh.as_deref()));
                Some(Request {
                    key,
                    plan,
                    wanted: Wanted {
                        spec_hash: generation.to_string(),
                        refresh,
                    },
                    stored,
                    dir: None,
                })
            })
            .collect();
        self.reader.reads(requests, identities, self.issuer.get())
    }

    /// The component of a wasm Middleware (`None`: not a wasm step): from a ConfigMap, or
    /// fetched from its URL (once per URL and digest; a failure is tried again after
    /// [`FETCH_RETRY`]), checked like a release's artifact.
    async fn load_wasm(
        &self,
        middleware: &Sourced<Middleware>,
        set: &ResourceSet,
    ) -> Option<WasmArtifact> {
        let artifact = &middleware.object.spec.wasm.as_ref()?.artifact;
        let failed = |reason: Reason, message: String| WasmArtifact::Failed { reason, message };
        let source = match source_kind(artifact) {
            Ok(source) => source,
            Err(message) => {
                return Some(failed(
                    Reason::InvalidArtifactSource,
                    message.replacen("spec.artifact", "spec.wasm.artifact", 1),
                ));
            }
        };
        let expected = artifact.digest.as_deref();
        if let Some(digest) = expected
            && !is_valid_digest(digest)
        {
            return Some(failed(
                Reason::InvalidDigest,
                format!(
                    "spec.wasm.artifact.digest {digest:?} is not of the form sha256:<64 lowercase hex digits>"
                ),
            ));
        }
        Some(match source {
            "configMap" => {
                let reference = artifact.config_map.as_ref()?;
                let namespace = middleware
                    .object
                    .metadata
                    .namespace
                    .clone()
                    .unwrap_or_default();
                match config_map_key(
                    &set.config_maps,
                    &namespace,
                    &reference.name,
                    &reference.key,
                ) {
                    Ok(bytes) => check_middleware_bytes(bytes, expected),
                    Err(message) => failed(
                        Reason::ArtifactNotFound,
                        message.replacen("spec.artifact", "spec.wasm.artifact", 1),
                    ),
                }
            }
            "url" => {
                let Some(digest) = expected else {
                    return Some(failed(
                        Reason::InvalidArtifactSource,
                        "spec.wasm.artifact.url requires spec.wasm.artifact.digest".into(),
                    ));
                };
                let url = artifact.url.clone().unwrap_or_default();
                let key = (url.clone(), digest.to_string());
                if let Some(known) = self.fetched_wasm.get(&key) {
                    return Some(known);
                }
                let loaded = match fetch(&url, &self.fetch_policy).await {
                    Ok(bytes) => check_middleware_bytes(bytes, Some(digest)),
                    Err(error) => {
                        failed(error.reason(), format!("spec.wasm.artifact.url: {error}"))
                    }
                };
                self.fetched_wasm.put(key, loaded.clone());
                loaded
            }
            _ => failed(
                Reason::UnsupportedSource,
                "spec.wasm.artifact.file is for manifest directories; in a cluster use configMap or url"
                    .into(),
            ),
        })
    }

    /// A release's artifact and its files (`spec.files`), and its commands' own artifacts
    /// and files (`spec.commands`), each from a ConfigMap or a URL.
    async fn load_artifact(
        &self,
        release: &Sourced<ToolRelease>,
        set: &ResourceSet,
    ) -> LoadedArtifact {
        let namespace = release
            .object
            .metadata
            .namespace
            .clone()
            .unwrap_or_default();
        let spec = &release.object.spec;
        let loaded = self
            .load_parts(&spec.artifact, &spec.files, &namespace, set)
            .await;
        if !matches!(loaded.outcome, ArtifactOutcome::Ready { .. }) {
            return loaded;
        }
        let mut commands = Vec::new();
        for (i, command) in spec.commands.iter().enumerate() {
            let parts = self
                .load_parts(&command.artifact, &command.files, &namespace, set)
                .await;
            commands.push(parts.into_command(i, &command.name));
        }
        loaded.with_commands(commands)
    }

    /// An artifact and its files, as a release's.
    async fn load_parts(
        &self,
        artifact: &ArtifactSource,
        files: &[ReleaseFile],
        namespace: &str,
        set: &ResourceSet,
    ) -> LoadedArtifact {
        let loaded = self.load_main(artifact, namespace, set).await;
        if !matches!(loaded.outcome, ArtifactOutcome::Ready { .. }) {
            return loaded;
        }
        if let Err((reason, message)) = check_files(files) {
            return LoadedArtifact::failed(reason, message);
        }
        let mut loaded_files = Vec::new();
        for (i, file) in files.iter().enumerate() {
            loaded_files.push(self.load_file(i, file, namespace, set).await);
        }
        loaded.with_files(loaded_files)
    }

    /// One of a release's files: from a ConfigMap, or fetched from its URL (once per URL
    /// and digest, as an artifact is).
    async fn load_file(
        &self,
        index: usize,
        file: &ReleaseFile,
        namespace: &str,
        set: &ResourceSet,
    ) -> Result<LoadedFile, (Reason, String)> {
        let source = source_kind(&file.artifact)
            .map_err(|m| about_file(index, (Reason::InvalidArtifactSource, m)))?;
        match source {
            "configMap" => {
                let reference = file.artifact.config_map.as_ref().ok_or_else(|| {
                    (
                        Reason::InvalidArtifactSource,
                        format!("spec.files[{index}].artifact.configMap is empty"),
                    )
                })?;
                let bytes =
                    config_map_key(&set.config_maps, namespace, &reference.name, &reference.key)
                        .map_err(|m| (Reason::ArtifactNotFound, m))?;
                check_file(index, file, bytes)
            }
            "url" => {
                let url = file.artifact.url.clone().unwrap_or_default();
                let key = (
                    url.clone(),
                    file.artifact.digest.clone().unwrap_or_default(),
                );
                if let Some(known) = self.fetched_files.get(&key) {
                    return known.map(|file| LoadedFile { file, bytes: None });
                }
                let loaded = match fetch(&url, &self.fetch_policy).await {
                    Ok(bytes) => check_file(index, file, bytes),
                    Err(error) => Err((
                        error.reason(),
                        format!("spec.files[{index}].artifact.url: {error}"),
                    )),
                };
                self.fetched_files.put(
                    key,
                    loaded
                        .as_ref()
                        .map(|l| l.file.clone())
                        .map_err(Clone::clone),
                );
                loaded
            }
            _ => Err((
                Reason::UnsupportedSource,
                format!(
                    "spec.files[{index}].artifact.file is for manifest directories; in a cluster use configMap or url"
                ),
            )),
        }
    }

    async fn load_main(
        &self,
        artifact: &ArtifactSource,
        namespace: &str,
        set: &ResourceSet,
    ) -> LoadedArtifact {
        let failed = LoadedArtifact::failed;
        let source = match source_kind(artifact) {
            Ok(source) => source,
            Err(message) => return failed(Reason::InvalidArtifactSource, message),
        };
        let expected = artifact.digest.as_deref();
        match source {
            "configMap" => {
                let Some(reference) = &artifact.config_map else {
                    return failed(
                        Reason::InvalidArtifactSource,
                        "spec.artifact.configMap is empty".into(),
                    );
                };
                let (config_map, bytes) = match config_map_entry(
                    &set.config_maps,
                    namespace,
                    &reference.name,
                    &reference.key,
                ) {
                    Ok(entry) => entry,
                    Err(message) => return failed(Reason::ArtifactNotFound, message),
                };
                // The bytes are what the ConfigMap's uid and resourceVersion say they are:
                // checked once for as long as the catalog uses them.
                let meta = &config_map.metadata;
                let key = meta.uid.clone().zip(meta.resource_version.clone()).map(
                    |(uid, resource_version)| CheckKey {
                        namespace: namespace.to_string(),
                        config_map: reference.name.clone(),
                        key: reference.key.clone(),
                        uid,
                        resource_version,
                        expected: expected.map(str::to_string),
                    },
                );
                let known = key.as_ref().and_then(|key| self.checked().get(key));
                if let Some(outcome) = known {
                    return LoadedArtifact {
                        outcome,
                        bytes: Some(bytes),
                        file_bytes: Vec::new(),
                    };
                }
                let loaded = check_bytes(bytes, expected);
                if let Some(key) = key {
                    self.checked().put(key, loaded.outcome.clone());
                }
                loaded
            }
            "url" => {
                let Some(digest) = expected else {
                    return failed(
                        Reason::InvalidArtifactSource,
                        "spec.artifact.url requires spec.artifact.digest".into(),
                    );
                };
                let url = artifact.url.clone().unwrap_or_default();
                let key = (url.clone(), digest.to_string());
                if let Some(outcome) = self.fetched.get(&key) {
                    return LoadedArtifact {
                        outcome,
                        bytes: None,
                        file_bytes: Vec::new(),
                    };
                }
                let loaded = match fetch(&url, &self.fetch_policy).await {
                    Ok(bytes) => check_bytes(bytes, Some(digest)),
                    Err(error) => failed(error.reason(), format!("spec.artifact.url: {error}")),
                };
                self.fetched.put(key, loaded.outcome.clone());
                loaded
            }
            _ => failed(
                Reason::UnsupportedSource,
                "spec.artifact.file is for manifest directories; in a cluster use configMap or url"
                    .into(),
            ),
        }
    }
}
