//! The reconcile logic, shared by both resource sources: from everything declared (and the
//! artifacts found), decide what is live and the status of every resource. Plain functions
//! over plain data, so every decision is tested without a cluster.
//!
//! [`resolve`] takes the kinds in the order they depend on each other, each in its own
//! file: `pool.rs` (WorkerPools), `tool.rs` (Tools: checked, then given their newest Ready
//! release), `release.rs` (ToolReleases), `agent.rs` (Agents), `middleware.rs`, and
//! `binding.rs` (ToolBindings, which refer to all of them). `declared.rs` is what every
//! kind shares: a declaration's generation, recording its status, names declared twice
//! and documents that did not parse.

pub(crate) mod agent;
mod binding;
mod declared;
mod middleware;
mod pool;
mod release;
mod tool;
pub mod tool_source;

#[cfg(test)]
mod tests;

pub use binding::resolve_binding_release;
pub use pool::check_pool;
pub use tool::check_tool;
pub use tool_source::{SourceRead, check_source};

use crate::artifacts::{ArtifactOutcome, WasmArtifact};
use crate::manifest::ResourceSet;
use crate::snapshot::{ResourceId, Snapshot};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::secret::SecretValue;

/// Defaults for what a release or tool leaves unsaid.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_MEMORY: u64 = 64 << 20;
pub const DEFAULT_CPU_TIME: Duration = Duration::from_secs(10);
pub const DEFAULT_OUTPUT: u64 = 1 << 20;
pub const DEFAULT_POOL: &str = "default";
/// The largest memory a release may ask for (a worker's pool reserves this per memory).
pub const MAX_MEMORY: u64 = 4 << 30;

/// What the previous round decided about a resource.
#[derive(Clone, Debug, PartialEq)]
pub struct PreviousState {
    pub spec_hash: String,
    pub generation: i64,
    pub status: Value,
}

pub struct ResolveInput<'a> {
    pub set: &'a ResourceSet,
    /// The artifact of every release, by release.
    pub artifacts: &'a HashMap<ObjectKey, ArtifactOutcome>,
    /// The component of every wasm Middleware, by Middleware (loaded and checked like a
    /// release's artifact; one missing here is still loading).
    pub wasm: &'a HashMap<ObjectKey, WasmArtifact>,
    pub previous: &'a HashMap<ResourceId, PreviousState>,
    pub now: Timestamp,
    /// What exists for Agents to refer to (ServiceAccounts, Secrets and ConfigMaps with
    /// their data): from the cluster, or from the manifest directory
    /// ([`Identities::of_manifests`]). `None`: nothing is known, references are not
    /// checked, and agents get no token, config or secrets.
    pub identities: Option<&'a Identities>,
    /// What each ToolSource's upstream offered when the IO layer last read it (a source
    /// missing here has not been read yet).
    pub source_reads: &'a HashMap<ObjectKey, SourceRead>,
    /// Where each binding's rollout is, by binding (from the store; one missing here
    /// starts at its first step).
    pub rollouts: &'a HashMap<ObjectKey, toolgrid_core::rollout::Record>,
    /// The previous round's snapshot, if any: what depends only on a declaration that has
    /// not changed is taken from it instead of being worked out again (a Tool whose spec
    /// is the same keeps its compiled commands). The result is the same either way.
    pub reuse: Option<&'a Snapshot>,
}

/// ServiceAccounts, Secrets and ConfigMaps that exist, by namespace and name, with the data
/// agents use. The controller fills it from the API, `toolgrid up` from the directory.
#[derive(Clone, Debug, Default)]
pub struct Identities {
    /// `None` where ServiceAccounts are not known (a manifest directory): an Agent's
    /// `serviceAccount` is then not checked.
    pub service_accounts: Option<HashSet<ObjectKey>>,
    /// Every Secret with its keys and values (`data` decoded, `stringData` over it).
    pub secrets: HashMap<ObjectKey, BTreeMap<String, SecretValue>>,
    /// Every ConfigMap with its `data`.
    pub config_maps: HashMap<ObjectKey, BTreeMap<String, String>>,
}

impl Identities {
    /// The Secrets and ConfigMaps of a manifest directory (a name declared twice: the
    /// later document wins).
    pub fn of_manifests(set: &ResourceSet) -> Identities {
        let key = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            ObjectKey::new(
                meta.namespace.clone().unwrap_or_default(),
                meta.name.clone().unwrap_or_default(),
            )
        };
        Identities {
            service_accounts: None,
            secrets: set
                .secrets
                .iter()
                .map(|s| (key(&s.object.metadata), Identities::secret_data(&s.object)))
                .collect(),
            config_maps: set
                .config_maps
                .iter()
                .map(|c| (key(&c.object.metadata), Identities::config_data(&c.object)))
                .collect(),
        }
    }

    /// A Secret's keys and values: `data` (base64, decoded by serde), with `stringData`
    /// over it as the API server merges them.
    pub fn secret_data(secret: &Secret) -> BTreeMap<String, SecretValue> {
        let mut out: BTreeMap<String, SecretValue> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), SecretValue::new(v.0.clone())))
            .collect();
        for (k, v) in secret.string_data.iter().flatten() {
            out.insert(k.clone(), SecretValue::new(v.as_bytes().to_vec()));
        }
        out
    }

    /// A ConfigMap's `data`.
    pub fn config_data(config_map: &ConfigMap) -> BTreeMap<String, String> {
        config_map.data.clone().unwrap_or_default()
    }
}

/// One round of the reconcile: what it reads, and the snapshot it builds (each kind's
/// file adds its `impl` block).
struct Resolver<'a> {
    input: &'a ResolveInput<'a>,
    snapshot: Snapshot,
    /// Ids declared more than once, with every place.
    duplicates: BTreeMap<ResourceId, Vec<String>>,
}

/// Resolves everything declared into a snapshot.
pub fn resolve(input: &ResolveInput<'_>) -> Snapshot {
    let mut resolver = Resolver {
        input,
        snapshot: Snapshot::default(),
        duplicates: BTreeMap::new(),
    };
    resolver.find_duplicates();
    resolver.record_duplicates_and_invalid_documents();
    resolver.pools();
    let tools = resolver.tools();
    resolver.releases(&tools);
    resolver.finish_tools(tools);
    resolver.tool_sources();
    let agents = resolver.agents();
    let middleware = resolver.middleware();
    resolver.bindings(&agents, &middleware);
    resolver.agent_tools();
    resolver.snapshot
}

/// The hash a declaration's spec is known by (its generation moves when it changes).
pub fn spec_hash<T: serde::Serialize>(spec: &T) -> String {
    declared::hash_spec(spec)
}

/// The bookkeeping to carry into the next round.
pub fn previous_of(snapshot: &Snapshot) -> HashMap<ResourceId, PreviousState> {
    snapshot
        .resources
        .values()
        .map(|r| {
            (
                r.id.clone(),
                PreviousState {
                    spec_hash: r.spec_hash.clone(),
                    generation: r.generation,
                    status: r.status.clone(),
                },
            )
        })
        .collect()
}
