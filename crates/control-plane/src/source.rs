//! The manifest-directory source: load, resolve, persist bookkeeping, publish; and watch
//! the directory (and the artifacts it names) so changes apply without a restart.

use crate::artifacts::StoredArtifacts;
use crate::tool_sources::reader::{Request, SourceReader, Wanted};
use notify::{RecursiveMode, Watcher};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use toolgrid_api::Kind;
use toolgrid_api::ToolSourceStatus;
use toolgrid_catalog::artifacts::{load_local, load_local_middleware, local_fingerprint};
use toolgrid_catalog::manifest::{ParsedFiles, ResourceSet, load_dir_cached};
use toolgrid_catalog::resolve::tool_source::status_is_current;
use toolgrid_catalog::resolve::{
    PreviousState, ResolveInput, SourceRead, check_source, previous_of, resolve, spec_hash,
};
use toolgrid_catalog::{Catalog, Identities, ResourceId, Snapshot};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::source::SourceLimits;
use toolgrid_store::{ResourceChanges, ResourceRecord, ResourceRecordKey, Store};

/// How long the watcher waits for a burst of file events to settle.
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Feeds the catalog from a directory of manifests.
pub struct ManifestSource {
    dir: PathBuf,
    /// toolgrid's built-in tools, loaded under the manifests (which may replace them).
    builtins: Vec<PathBuf>,
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    stored: StoredArtifacts,
    /// Directories holding artifacts, watched beside the manifests.
    artifact_dirs: Mutex<BTreeSet<PathBuf>>,
    reloads: tokio::sync::Mutex<()>,
    /// Reads ToolSources' upstreams in the background.
    reader: Arc<SourceReader>,
    /// The refresh asked for each ToolSource (`toolgrid refresh`), by source.
    refreshes: Mutex<HashMap<ObjectKey, String>>,
    /// Mints the identity token an `auth: {type: identity}` source is listed with.
    issuer: crate::identity::IssuerCell,
    /// Where each binding's canary rollout is; a change resolves again.
    rollouts: Arc<crate::rollout::RolloutBook>,
    /// The outcome of each release's artifacts as last loaded, by release, with the
    /// fingerprint of its files then ([`local_fingerprint`]): a reload reads, hashes and
    /// validates only what changed.
    loaded: Mutex<LoadedCache>,
    /// The manifest files as last parsed: a reload reads and parses only what changed.
    parsed: Mutex<ParsedFiles>,
    /// The resources' records as last saved: a reload writes only those that changed.
    /// None before the first save and after a failed one (the next save is whole).
    saved: Mutex<Option<HashMap<ResourceRecordKey, ResourceRecord>>>,
}

/// Releases' artifacts as last loaded, valid while the store has purged nothing since.
#[derive(Default)]
struct LoadedCache {
    purges: u64,
    outcomes: HashMap<ObjectKey, (u64, toolgrid_catalog::artifacts::ArtifactOutcome)>,
}

impl ManifestSource {
    pub fn new(dir: PathBuf, store: Arc<dyn Store>, catalog: Arc<Catalog>) -> Arc<Self> {
        Arc::new(ManifestSource {
            dir,
            builtins: Vec::new(),
            store,
            catalog,
            stored: StoredArtifacts::default(),
            artifact_dirs: Mutex::default(),
            reloads: tokio::sync::Mutex::new(()),
            reader: SourceReader::new(SourceLimits::default()),
            refreshes: Mutex::default(),
            issuer: Default::default(),
            rollouts: Default::default(),
            loaded: Mutex::default(),
            parsed: Mutex::default(),
            saved: Mutex::default(),
        })
    }

    /// Serves the built-in tools declared under `dirs` too (`toolgrid up --builtins`): a
    /// manifest replaces a built-in of the same kind and name, and a later directory's
    /// built-in an earlier one's.
    pub fn with_builtins(mut self: Arc<Self>, dirs: Vec<PathBuf>) -> Arc<Self> {
        if let Some(source) = Arc::get_mut(&mut self) {
            source.builtins = dirs;
        }
        self
    }

    /// Lists `auth: {type: identity}` sources with tokens minted by `issuer`.
    pub fn with_issuer(mut self: Arc<Self>, issuer: crate::identity::IssuerCell) -> Arc<Self> {
        if let Some(source) = Arc::get_mut(&mut self) {
            source.issuer = issuer;
        }
        self
    }

    /// Resolves with the rollouts `book` holds, again whenever they move.
    pub fn with_rollouts(mut self: Arc<Self>, book: Arc<crate::rollout::RolloutBook>) -> Arc<Self> {
        if let Some(source) = Arc::get_mut(&mut self) {
            source.rollouts = book;
        }
        self
    }

    /// Asks for ToolSource `key` to be read again (its tools change only then): the read
    /// starts now, and the catalog publishes its outcome with `status.refreshed` set to the
    /// returned value.
    pub async fn request_refresh(&self, key: &ObjectKey) -> anyhow::Result<String> {
        let nonce = k8s_openapi::jiff::Timestamp::now().to_string();
        self.refreshes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone(), nonce.clone());
        self.reload().await?;
        Ok(nonce)
    }

    /// The reads of the set's ToolSources, starting those that are due.
    fn source_reads(
        &self,
        set: &ResourceSet,
        previous: &HashMap<ResourceId, PreviousState>,
        identities: &Identities,
    ) -> HashMap<ObjectKey, SourceRead> {
        let refreshes = self
            .refreshes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let requests = set
            .tool_sources
            .iter()
            .filter_map(|source| {
                let key = key_of(&source.object.metadata);
                let plan = check_source(&source.object, &key).ok()?;
                let spec_hash = spec_hash(&source.object.spec);
                let refresh = refreshes.get(&key).cloned();
                // What the store kept from the last run answers the same spec and refresh.
                let stored = previous
                    .get(&ResourceId {
                        kind: Kind::ToolSource,
                        key: key.clone(),
                    })
                    .filter(|p| p.spec_hash == spec_hash)
                    .and_then(|p| {
                        let status: ToolSourceStatus =
                            serde_json::from_value(p.status.clone()).ok()?;
                        status_is_current(&status, p.generation, refresh.as_deref())
                    });
                Some(Request {
                    key,
                    plan,
                    wanted: Wanted { spec_hash, refresh },
                    stored,
                    dir: Some(source.source.dir()),
                })
            })
            .collect();
        self.reader.reads(requests, identities, self.issuer.get())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Loads the directory, resolves it and publishes the result.
    pub async fn reload(&self) -> anyhow::Result<Arc<Snapshot>> {
        let _one_at_a_time = self.reloads.lock().await;
        let dir = self.dir.clone();
        let builtins = self.builtins.clone();
        let cached = {
            let mut cache = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            // A purge may have taken an artifact the cache says is stored.
            let purges = self.store.artifact_purges();
            if cache.purges != purges {
                cache.outcomes.clear();
                cache.purges = purges;
            }
            cache.outcomes.clone()
        };
        let mut parsed =
            std::mem::take(&mut *self.parsed.lock().unwrap_or_else(|e| e.into_inner()));
        let (set, loaded, wasm, parsed) =
            tokio::task::spawn_blocking(move || -> std::io::Result<_> {
                parsed.begin();
                let mut set = load_dir_cached(&dir, &mut parsed)?;
                // The manifests first, then the built-in directories from the last: a later
                // directory's resource replaces an earlier one's (builtins/python's `code`,
                // with Python, replaces builtins/manifests' JavaScript-only one).
                for dir in builtins.iter().rev() {
                    set = set.with_builtins(load_dir_cached(dir, &mut parsed)?);
                }
                let loaded: Vec<_> = set
                    .releases
                    .iter()
                    .enumerate()
                    .map(|(index, r)| {
                        let key = key_of(&r.object.metadata);
                        let fingerprint = local_fingerprint(r);
                        let load = match (fingerprint, cached.get(&key)) {
                            (Some(now), Some((then, outcome))) if now == *then => {
                                Load::Unchanged(outcome.clone())
                            }
                            _ => Load::Read { index, fingerprint },
                        };
                        (key, load)
                    })
                    .collect();
                let wasm: HashMap<_, _> = set
                    .middleware
                    .iter()
                    .filter_map(|m| {
                        let key = key_of(&m.object.metadata);
                        Some((key, load_local_middleware(m, &set.config_maps)?))
                    })
                    .collect();
                Ok((set, loaded, wasm, parsed))
            })
            .await??;
        *self.parsed.lock().unwrap_or_else(|e| e.into_inner()) = parsed;

        let set = Arc::new(set);
        let mut artifacts = HashMap::new();
        let mut outcomes = HashMap::new();
        for (key, load) in loaded {
            let outcome = match load {
                Load::Unchanged(outcome) => outcome,
                Load::Read { index, fingerprint } => {
                    // One release's files at a time, stored before the next are read: the
                    // built-in `python` and `code` name the same 158 MB of runtime files.
                    let of = set.clone();
                    let artifact = tokio::task::spawn_blocking(move || {
                        load_local(&of.releases[index], &of.config_maps)
                    })
                    .await?;
                    let outcome = self.stored.keep(&*self.store, artifact).await?;
                    if let Some(fingerprint) = fingerprint {
                        outcomes.insert(key.clone(), (fingerprint, outcome.clone()));
                    }
                    outcome
                }
            };
            artifacts.insert(key, outcome);
        }
        {
            let mut cache = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
            // Releases gone from the directory leave the cache; unchanged ones stay.
            cache.outcomes.retain(|key, _| artifacts.contains_key(key));
            cache.outcomes.extend(outcomes);
        }
        self.remember_artifact_dirs(&set);
        let current = self.catalog.current();
        let previous = if current.revision == 0 {
            self.stored_previous().await?
        } else {
            previous_of(&current)
        };
        let identities = toolgrid_catalog::Identities::of_manifests(&set);
        let source_reads = self.source_reads(&set, &previous, &identities);
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
        self.save_records(records_of(&snapshot)).await?;
        let published = self.catalog.publish(snapshot);
        tracing::info!(
            tools = published.tools.len(),
            releases = published.releases.len(),
            pools = published.pools.len(),
            not_ready = published
                .resources
                .values()
                .filter(|r| !r.ready.status)
                .count(),
            "manifests loaded from {}",
            self.dir.display()
        );
        Ok(published)
    }

    /// Saves the resources' records: the first time whole, then only what changed since
    /// the last save (a change to one tool writes the records of what it touched).
    async fn save_records(&self, records: Vec<ResourceRecord>) -> anyhow::Result<()> {
        let records: HashMap<ResourceRecordKey, ResourceRecord> =
            records.into_iter().map(|r| (r.key(), r)).collect();
        // Taken out: a save that fails leaves None, so the next one writes everything.
        let before = self.saved.lock().unwrap_or_else(|e| e.into_inner()).take();
        match &before {
            None => {
                let all = records.values().cloned().collect();
                self.store.save_resources(all).await?
            }
            Some(before) => {
                let changes = ResourceChanges::between(before, &records);
                self.store.update_resources(changes).await?
            }
        }
        *self.saved.lock().unwrap_or_else(|e| e.into_inner()) = Some(records);
        Ok(())
    }

    fn remember_artifact_dirs(&self, set: &ResourceSet) {
        let releases = set
            .releases
            .iter()
            .map(|r| (&r.object.spec.artifact, &r.source));
        let middleware = set.middleware.iter().filter_map(|m| {
            let wasm = m.object.spec.wasm.as_ref()?;
            Some((&wasm.artifact, &m.source))
        });
        let dirs: BTreeSet<PathBuf> = releases
            .chain(middleware)
            .filter_map(|(artifact, source)| {
                let file = artifact.file.as_ref()?;
                let path = source.dir().join(file);
                path.parent().map(Path::to_path_buf)
            })
            .collect();
        *self.artifact_dirs.lock().unwrap_or_else(|e| e.into_inner()) = dirs;
    }

    async fn stored_previous(&self) -> anyhow::Result<HashMap<ResourceId, PreviousState>> {
        let records = self.store.load_resources().await?;
        Ok(records
            .into_iter()
            .filter_map(|r| {
                let kind = Kind::parse(&r.kind)?;
                Some((
                    ResourceId {
                        kind,
                        key: ObjectKey::new(r.namespace, r.name),
                    },
                    PreviousState {
                        spec_hash: r.spec_hash,
                        generation: r.generation,
                        status: r.status,
                    },
                ))
            })
            .collect())
    }

    /// Reloads whenever a manifest or an artifact changes, until the task is dropped.
    pub async fn watch(self: Arc<Self>) -> anyhow::Result<()> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if let Ok(event) = event
                    && !matches!(event.kind, notify::EventKind::Access(_))
                {
                    let _ = tx.send(());
                }
            })?;
        watcher.watch(&self.dir, RecursiveMode::Recursive)?;
        let mut watched: BTreeSet<PathBuf> = BTreeSet::new();
        loop {
            // Artifact directories outside the manifest directory are watched too.
            let wanted = self
                .artifact_dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            for dir in wanted.difference(&watched) {
                if !dir.starts_with(&self.dir)
                    && let Err(error) = watcher.watch(dir, RecursiveMode::NonRecursive)
                {
                    tracing::debug!(dir = %dir.display(), %error, "cannot watch artifact directory");
                }
            }
            for dir in watched.difference(&wanted) {
                let _ = watcher.unwatch(dir);
            }
            watched = wanted;

            // A file changed, or a ToolSource's read landed.
            tokio::select! {
                event = rx.recv() => if event.is_none() {
                    return Ok(());
                },
                _ = self.reader.landed.notified() => {}
                _ = self.rollouts.changed.notified() => {}
            }
            // Let a burst of writes (an editor's save, a git checkout) settle.
            loop {
                match tokio::time::timeout(DEBOUNCE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return Ok(()),
                    Err(_) => break,
                }
            }
            if let Err(error) = self.reload().await {
                tracing::error!(%error, "cannot reload manifests");
            }
        }
    }
}

/// A release's artifacts in a reload: unchanged since the last (its outcome then), or read
/// and stored now (with the fingerprint of its files, when they are all local).
enum Load {
    /// Its files have not changed since they were stored: their outcome.
    Unchanged(toolgrid_catalog::artifacts::ArtifactOutcome),
    /// Read (the set's `index`th release) and stored; `fingerprint` of its files, if any.
    Read {
        index: usize,
        fingerprint: Option<u64>,
    },
}

fn records_of(snapshot: &Snapshot) -> Vec<ResourceRecord> {
    snapshot
        .resources
        .values()
        .map(|r| ResourceRecord {
            kind: r.id.kind.as_str().to_string(),
            namespace: r.id.key.namespace.clone(),
            name: r.id.key.name.clone(),
            spec_hash: r.spec_hash.clone(),
            generation: r.generation,
            status: r.status.clone(),
        })
        .collect()
}

#[async_trait::async_trait]
impl crate::gateway::SourceRefresher for ManifestSource {
    async fn request(&self, key: &ObjectKey) -> Result<String, String> {
        self.request_refresh(key)
            .await
            .map_err(|e| format!("{e:#}"))
    }
}

/// A resource's namespace and name (empty when absent: such a resource is refused as it
/// resolves).
fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}
