//! The reconcile logic, shared by both resource sources: from everything declared (and the
//! artifacts found), decide what is live and the status of every resource. Plain functions
//! over plain data, so every decision is tested without a cluster.

use super::artifacts::{ArtifactOutcome, is_valid_digest, source_kind};
use super::interface::{CommandInterface, FieldError, is_kebab};
use super::manifest::{ResourceSet, Source, Sourced};
use super::snapshot::*;
use crate::api::conditions::{self, Desired, Reason};
use crate::api::{
    Agent, Kind, KindStatus, Middleware, Tool, ToolBinding, ToolBindingStatus, ToolRelease,
    ToolReleaseStatus, ToolStatus, WorkerPool, WorkerPoolStatus,
};
use crate::auth::SecretValue;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::core::object::HasSpec;
use serde_json::Value;
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

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
    pub wasm: &'a HashMap<ObjectKey, super::artifacts::WasmArtifact>,
    pub previous: &'a HashMap<ResourceId, PreviousState>,
    pub now: Timestamp,
    /// What exists for Agents to refer to (ServiceAccounts, Secrets and ConfigMaps with
    /// their data): from the cluster, or from the manifest directory
    /// ([`Identities::of_manifests`]). `None`: nothing is known, references are not
    /// checked, and agents get no token, config or secrets.
    pub identities: Option<&'a Identities>,
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

/// The first reference of an Agent to something missing (a ServiceAccount, Secret,
/// ConfigMap, or the token's key), as a condition reason and message.
fn missing_reference(agent: &Agent, identities: &Identities) -> Option<(Reason, String)> {
    let ns = agent.metadata.namespace.clone().unwrap_or_default();
    let key = |name: &str| ObjectKey::new(ns.clone(), name);
    let spec = &agent.spec;
    if let (Some(sa), Some(known)) = (&spec.service_account, &identities.service_accounts)
        && !known.contains(&key(sa))
    {
        return Some((
            Reason::MissingServiceAccount,
            format!("spec.serviceAccount: there is no ServiceAccount {ns}/{sa}"),
        ));
    }
    if let Some(secret) = &spec.token_secret_ref {
        match identities.secrets.get(&key(&secret.name)) {
            None => {
                return Some((
                    Reason::MissingSecret,
                    format!(
                        "spec.tokenSecretRef: there is no Secret {ns}/{}",
                        secret.name
                    ),
                ));
            }
            Some(data) if data.get(&secret.key).is_none_or(SecretValue::is_empty) => {
                return Some((
                    Reason::MissingSecretKey,
                    format!(
                        "spec.tokenSecretRef: Secret {ns}/{} has no (non-empty) key {:?}",
                        secret.name, secret.key
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    if let Some(secret) = &spec.secret_ref
        && !identities.secrets.contains_key(&key(&secret.name))
    {
        return Some((
            Reason::MissingSecret,
            format!("spec.secretRef: there is no Secret {ns}/{}", secret.name),
        ));
    }
    if let Some(config) = &spec.config_map_ref
        && !identities.config_maps.contains_key(&key(&config.name))
    {
        return Some((
            Reason::MissingConfigMap,
            format!(
                "spec.configMapRef: there is no ConfigMap {ns}/{}",
                config.name
            ),
        ));
    }
    None
}

/// An Agent that passed its checks, with what it refers to resolved.
fn resolved_agent(
    agent: &Agent,
    key: &ObjectKey,
    identities: Option<&Identities>,
) -> ResolvedAgent {
    let spec = &agent.spec;
    let at = |name: &str| ObjectKey::new(key.namespace.clone(), name);
    let token_digest = identities.and_then(|ids| {
        let reference = spec.token_secret_ref.as_ref()?;
        let value = ids.secrets.get(&at(&reference.name))?.get(&reference.key)?;
        Some(value.digest())
    });
    let config = identities
        .zip(spec.config_map_ref.as_ref())
        .and_then(|(ids, r)| ids.config_maps.get(&at(&r.name)).cloned())
        .unwrap_or_default();
    let secrets = identities
        .zip(spec.secret_ref.as_ref())
        .and_then(|(ids, r)| ids.secrets.get(&at(&r.name)).cloned())
        .unwrap_or_default();
    ResolvedAgent {
        key: key.clone(),
        spec: spec.clone(),
        token_digest,
        config,
        secrets,
    }
}

/// One declaration of a resource, before its checks.
struct Declared<'a, T> {
    id: ResourceId,
    object: &'a T,
    source: &'a Source,
    spec_hash: String,
    generation: i64,
}

fn hash_spec<T: serde::Serialize>(spec: &T) -> String {
    let bytes = serde_json::to_vec(spec).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..12])
}

/// A DNS-1123 subdomain, as Kubernetes names are.
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

struct Resolver<'a> {
    input: &'a ResolveInput<'a>,
    snapshot: Snapshot,
    /// Ids declared more than once, with every place.
    duplicates: BTreeMap<ResourceId, Vec<String>>,
}

impl<'a> Resolver<'a> {
    fn declared<T>(&mut self, kind: Kind, items: &'a [Sourced<T>]) -> Vec<Declared<'a, T>>
    where
        T: Resource + HasSpec,
        T::Spec: serde::Serialize,
    {
        let mut out = Vec::new();
        for item in items {
            let meta = item.object.meta();
            let id = ResourceId {
                kind,
                key: ObjectKey::new(
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                ),
            };
            if self.duplicates.contains_key(&id) {
                continue;
            }
            let spec_hash = hash_spec(item.object.spec());
            let generation =
                meta.generation
                    .unwrap_or_else(|| match self.input.previous.get(&id) {
                        Some(previous) if previous.spec_hash == spec_hash => previous.generation,
                        Some(previous) => previous.generation + 1,
                        None => 1,
                    });
            out.push(Declared {
                id,
                object: &item.object,
                source: &item.source,
                spec_hash,
                generation,
            });
        }
        out
    }

    /// Records a resource's state; `status` holds the kind's own status fields (the
    /// conditions and observedGeneration are filled in here).
    fn record(
        &mut self,
        declared: (&ResourceId, &Source, i64, &str),
        ready: Desired,
        mut status: KindStatus,
        columns: Vec<(String, String)>,
    ) {
        let (id, source, generation, spec_hash) = declared;
        let previous = self.input.previous.get(id);
        let mut conditions: Vec<Condition> = previous
            .and_then(|p| p.status.get("conditions"))
            .and_then(|c| serde_json::from_value(c.clone()).ok())
            .unwrap_or_default();
        conditions::apply_ready(&mut conditions, &ready, Some(generation), self.input.now);
        status.set_conditions(conditions, generation);
        self.snapshot.resources.insert(
            id.clone(),
            ResourceState {
                id: id.clone(),
                source: source.to_string(),
                generation,
                spec_hash: spec_hash.to_string(),
                ready,
                status: status.to_value(),
                columns,
            },
        );
    }

    fn record_declared<T>(
        &mut self,
        d: &Declared<'_, T>,
        ready: Desired,
        status: KindStatus,
        columns: Vec<(String, String)>,
    ) {
        self.record(
            (&d.id, d.source, d.generation, &d.spec_hash),
            ready,
            status,
            columns,
        );
    }

    fn invalid<T>(&mut self, d: &Declared<'_, T>, error: FieldError) {
        let message = format!("{error}{}", d.source.suffix());
        tracing::warn!(kind = %d.id.kind, resource = %d.id.key, "{message}");
        self.record_declared(
            d,
            Desired::not_ready(Reason::InvalidSpec, message),
            KindStatus::empty(d.id.kind),
            Vec::new(),
        );
    }

    fn find_duplicates(&mut self) {
        let set = self.input.set;
        let mut places: BTreeMap<ResourceId, Vec<String>> = BTreeMap::new();
        let mut note = |kind: Kind,
                        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
                        source: &Source| {
            let id = ResourceId {
                kind,
                key: ObjectKey::new(
                    meta.namespace.clone().unwrap_or_default(),
                    meta.name.clone().unwrap_or_default(),
                ),
            };
            places.entry(id).or_default().push(source.to_string());
        };
        for s in &set.tools {
            note(Kind::Tool, &s.object.metadata, &s.source);
        }
        for s in &set.releases {
            note(Kind::ToolRelease, &s.object.metadata, &s.source);
        }
        for s in &set.bindings {
            note(Kind::ToolBinding, &s.object.metadata, &s.source);
        }
        for s in &set.middleware {
            note(Kind::Middleware, &s.object.metadata, &s.source);
        }
        for s in &set.agents {
            note(Kind::Agent, &s.object.metadata, &s.source);
        }
        for s in &set.pools {
            note(Kind::WorkerPool, &s.object.metadata, &s.source);
        }
        for doc in &set.invalid {
            if let (Some(kind), Some(name)) = (doc.kind, &doc.name) {
                places
                    .entry(ResourceId {
                        kind,
                        key: ObjectKey::new(doc.namespace.clone(), name.clone()),
                    })
                    .or_default()
                    .push(doc.source.to_string());
            }
        }
        self.duplicates = places.into_iter().filter(|(_, p)| p.len() > 1).collect();
    }

    fn record_duplicates_and_invalid_documents(&mut self) {
        for (id, places) in self.duplicates.clone() {
            let message = format!(
                "{} {} is declared more than once: {}",
                id.kind,
                id.key,
                places.join(", ")
            );
            tracing::warn!("{message}");
            let previous_generation = self
                .input
                .previous
                .get(&id)
                .map(|p| p.generation)
                .unwrap_or(1);
            let source = Source {
                file: places[0].clone().into(),
                document: 0,
            };
            self.record(
                (&id, &source, previous_generation, ""),
                Desired::not_ready(Reason::DuplicateName, message),
                KindStatus::empty(id.kind),
                Vec::new(),
            );
            if let Some(state) = self.snapshot.resources.get_mut(&id) {
                state.source = places.join(", ");
            }
        }
        for doc in &self.input.set.invalid {
            match (doc.kind, &doc.name) {
                (Some(kind), Some(name)) => {
                    let id = ResourceId {
                        kind,
                        key: ObjectKey::new(doc.namespace.clone(), name.clone()),
                    };
                    if self.duplicates.contains_key(&id) {
                        continue;
                    }
                    tracing::warn!("{doc}");
                    let generation = self
                        .input
                        .previous
                        .get(&id)
                        .map(|p| p.generation)
                        .unwrap_or(1);
                    let message = if doc.field.is_empty() {
                        format!("{}{}", doc.message, doc.source.suffix())
                    } else {
                        format!("{}: {}{}", doc.field, doc.message, doc.source.suffix())
                    };
                    self.record(
                        (&id, &doc.source, generation, ""),
                        Desired::not_ready(Reason::InvalidSpec, message),
                        KindStatus::empty(id.kind),
                        Vec::new(),
                    );
                }
                _ => {
                    tracing::warn!("{doc}");
                    self.snapshot.problems.push(doc.to_string());
                }
            }
        }
    }

    fn pools(&mut self) {
        for d in self.declared(Kind::WorkerPool, &self.input.set.pools) {
            match check_pool(d.object) {
                Err(e) => self.invalid(&d, e),
                Ok((desired, slots)) => {
                    let columns = vec![
                        ("Desired".into(), desired.to_string()),
                        ("Slots".into(), slots.to_string()),
                    ];
                    let status = KindStatus::WorkerPool(WorkerPoolStatus {
                        desired_workers: desired,
                        ..WorkerPoolStatus::default()
                    });
                    self.record_declared(
                        &d,
                        Desired::ready(
                            Reason::Resolved,
                            format!("{desired} workers of {slots} slots"),
                        ),
                        status,
                        columns,
                    );
                    self.snapshot.pools.insert(
                        d.id.key.clone(),
                        ResolvedPool {
                            key: d.id.key.clone(),
                            spec: d.object.spec.clone(),
                            desired_workers: desired,
                            slots_per_worker: slots,
                        },
                    );
                }
            }
        }
    }

    fn tools(&mut self) -> BTreeMap<ObjectKey, (Declared<'a, Tool>, ResolvedTool)> {
        let mut valid = BTreeMap::new();
        for d in self.declared(Kind::Tool, &self.input.set.tools) {
            match check_tool(d.object, &d.id.key) {
                Err(e) => self.invalid(&d, e),
                Ok(tool) => {
                    valid.insert(d.id.key.clone(), (d, tool));
                }
            }
        }
        valid
    }

    fn releases(&mut self, tools: &BTreeMap<ObjectKey, (Declared<'a, Tool>, ResolvedTool)>) {
        let mut versions: BTreeMap<(String, String, semver::Version), ObjectKey> = BTreeMap::new();
        for d in self.declared(Kind::ToolRelease, &self.input.set.releases) {
            let spec = &d.object.spec;
            let ns = d.id.key.namespace.clone();
            let previous: ToolReleaseStatus = self
                .input
                .previous
                .get(&d.id)
                .and_then(|p| serde_json::from_value(p.status.clone()).ok())
                .unwrap_or_default();
            let previous_digest = previous.digest;
            let was_ready = conditions::is_ready(&previous.conditions);
            let mut status = ToolReleaseStatus::default();
            let mut columns = vec![
                ("Tool".into(), spec.tool.clone()),
                ("Version".into(), spec.version.clone()),
            ];
            let mut notes: Vec<String> = Vec::new();
            let outcome = (|| -> Result<ResolvedRelease, (Desired, Option<FieldError>)> {
                let spec_error =
                    |e: FieldError| (Desired::not_ready(Reason::InvalidSpec, ""), Some(e));
                if !is_dns_subdomain(&d.id.key.name) {
                    return Err(spec_error(FieldError::new(
                        "metadata.name",
                        "must be a DNS subdomain (lowercase letters, digits, - and .)",
                    )));
                }
                let version = semver::Version::parse(&spec.version).map_err(|e| {
                    spec_error(FieldError::new(
                        "spec.version",
                        format!("{:?} is not a semantic version: {e}", spec.version),
                    ))
                })?;
                source_kind(&spec.artifact)
                    .map_err(|m| spec_error(FieldError::new("spec.artifact", m)))?;
                if let Some(digest) = &spec.artifact.digest
                    && !is_valid_digest(digest)
                {
                    return Err(spec_error(FieldError::new(
                        "spec.artifact.digest",
                        format!("{digest:?} is not of the form sha256:<64 lowercase hex digits>"),
                    )));
                }
                let (limits, clamped) = release_limits(d.object).map_err(spec_error)?;
                notes = clamped;
                for (i, rule) in spec.network.iter().flat_map(|n| &n.egress).enumerate() {
                    if rule.host.trim().is_empty() {
                        return Err(spec_error(FieldError::new(
                            format!("spec.network.egress[{i}].host"),
                            "must not be empty",
                        )));
                    }
                }
                let tool_key = ObjectKey::new(ns.clone(), spec.tool.clone());
                if !tools.contains_key(&tool_key) {
                    let reason = if self.snapshot.resources.contains_key(&ResourceId {
                        kind: Kind::Tool,
                        key: tool_key.clone(),
                    }) {
                        (
                            Reason::ToolNotValid,
                            format!("spec.tool: Tool {tool_key} is not valid (see its status)"),
                        )
                    } else {
                        (
                            Reason::UnknownTool,
                            format!(
                                "spec.tool: there is no Tool {:?} in namespace {ns:?}",
                                spec.tool
                            ),
                        )
                    };
                    return Err((Desired::not_ready(reason.0, reason.1), None));
                }
                let (digest, size, kind) = match self.input.artifacts.get(&d.id.key) {
                    Some(ArtifactOutcome::Ready { digest, size, kind }) => {
                        (digest.clone(), *size, *kind)
                    }
                    Some(ArtifactOutcome::Failed { reason, message }) => {
                        return Err((Desired::not_ready(*reason, message.clone()), None));
                    }
                    None => {
                        return Err((
                            Desired::not_ready(
                                Reason::ArtifactPending,
                                "the artifact has not been loaded yet",
                            ),
                            None,
                        ));
                    }
                };
                let pool = spec
                    .pool
                    .clone()
                    .unwrap_or_else(|| DEFAULT_POOL.to_string());
                if !self
                    .snapshot
                    .pools
                    .contains_key(&ObjectKey::new(ns.clone(), pool.clone()))
                {
                    return Err((
                        Desired::not_ready(
                            Reason::UnknownPool,
                            format!(
                                "spec.pool: there is no valid WorkerPool {pool:?} in namespace {ns:?}"
                            ),
                        ),
                        None,
                    ));
                }
                if let Some(previous) = &previous_digest
                    && was_ready
                    && previous != &digest
                {
                    return Err((
                        Desired::not_ready(
                            Reason::ImmutableRelease,
                            format!(
                                "release {} was Ready with artifact {previous} and is immutable; its artifact is now {digest}: publish a new version instead",
                                d.id.key
                            ),
                        ),
                        None,
                    ));
                }
                let version_key = (ns.clone(), spec.tool.clone(), version.clone());
                if let Some(other) = versions.get(&version_key) {
                    return Err((
                        Desired::not_ready(
                            Reason::DuplicateVersion,
                            format!(
                                "version {version} of tool {:?} is also released by {}",
                                spec.tool, other.name
                            ),
                        ),
                        None,
                    ));
                }
                versions.insert(version_key, d.id.key.clone());
                Ok(ResolvedRelease {
                    key: d.id.key.clone(),
                    tool: spec.tool.clone(),
                    version,
                    digest,
                    size,
                    artifact_kind: kind,
                    pool,
                    limits,
                    network: spec.network.clone().unwrap_or_default(),
                })
            })();
            match outcome {
                Ok(release) => {
                    status.digest = Some(release.digest.clone());
                    status.size = Some(release.size);
                    status.artifact_kind = Some(release.artifact_kind.to_string());
                    columns.push(("Digest".into(), short_digest(&release.digest)));
                    let mut message = format!(
                        "{} {} of {} bytes",
                        release.artifact_kind, release.digest, release.size
                    );
                    for note in &notes {
                        message.push_str("; ");
                        message.push_str(note);
                    }
                    self.record_declared(
                        &d,
                        Desired::ready(Reason::ArtifactReady, message),
                        KindStatus::ToolRelease(status),
                        columns,
                    );
                    self.snapshot
                        .releases
                        .insert(d.id.key.clone(), Arc::new(release));
                }
                Err((_, Some(error))) => self.invalid(&d, error),
                Err((mut desired, None)) => {
                    if let Some(previous) = previous_digest {
                        status.digest = Some(previous);
                    }
                    if !d.source.is_cluster() {
                        desired.message = format!("{} ({})", desired.message, d.source);
                    }
                    tracing::warn!(resource = %d.id.key, reason = %desired.reason, "ToolRelease not ready: {}", desired.message);
                    self.record_declared(&d, desired, KindStatus::ToolRelease(status), columns);
                }
            }
        }
    }

    fn finish_tools(&mut self, tools: BTreeMap<ObjectKey, (Declared<'a, Tool>, ResolvedTool)>) {
        for (key, (d, mut tool)) in tools {
            let newest = self
                .snapshot
                .releases
                .values()
                .filter(|r| r.key.namespace == key.namespace && r.tool == key.name)
                .max_by(|a, b| a.version.cmp(&b.version));
            tool.release = newest.map(|r| r.key.clone());
            let mut status = ToolStatus::default();
            let commands = tool
                .commands
                .iter()
                .map(|c| c.name.clone())
                .collect::<Vec<_>>()
                .join(",");
            let mut columns = vec![
                ("Effect".into(), tool.effect.as_str().to_string()),
                ("Commands".into(), commands),
            ];
            let ready = match newest {
                Some(release) => {
                    status.release = Some(release.key.name.clone());
                    status.version = Some(release.version.to_string());
                    columns.push(("Release".into(), release.key.name.clone()));
                    Desired::ready(
                        Reason::Released,
                        format!(
                            "calls run release {} (version {})",
                            release.key.name, release.version
                        ),
                    )
                }
                None => {
                    columns.push(("Release".into(), "<none>".into()));
                    Desired::not_ready(
                        Reason::NoReadyRelease,
                        format!(
                            "no Ready ToolRelease of tool {:?} in namespace {:?}",
                            key.name, key.namespace
                        ),
                    )
                }
            };
            self.record_declared(&d, ready, KindStatus::Tool(status), columns);
            self.snapshot.tools.insert(key, Arc::new(tool));
        }
    }

    fn agents(&mut self) -> BTreeMap<ObjectKey, &'a Agent> {
        let mut valid = BTreeMap::new();
        for d in self.declared(Kind::Agent, &self.input.set.agents) {
            let missing = self
                .input
                .identities
                .and_then(|ids| missing_reference(d.object, ids));
            match (check_agent(d.object), missing) {
                (Err(e), _) => self.invalid(&d, e),
                (Ok(()), Some((reason, message))) => {
                    self.record_declared(
                        &d,
                        Desired::not_ready(reason, message),
                        KindStatus::empty(Kind::Agent),
                        Vec::new(),
                    );
                }
                (Ok(()), None) => {
                    let identity = d
                        .object
                        .spec
                        .service_account
                        .as_ref()
                        .map(|sa| format!("serviceAccount {sa}"))
                        .unwrap_or_else(|| "token".into());
                    self.record_declared(
                        &d,
                        Desired::ready(Reason::Resolved, format!("identity: {identity}")),
                        KindStatus::empty(Kind::Agent),
                        vec![("Identity".into(), identity)],
                    );
                    self.snapshot.agents.insert(
                        d.id.key.clone(),
                        Arc::new(resolved_agent(d.object, &d.id.key, self.input.identities)),
                    );
                    valid.insert(d.id.key.clone(), d.object);
                }
            }
        }
        valid
    }

    fn middleware(&mut self) -> BTreeMap<ObjectKey, &'a Middleware> {
        let mut valid = BTreeMap::new();
        for d in self.declared(Kind::Middleware, &self.input.set.middleware) {
            match check_middleware(d.object) {
                Err(e) => self.invalid(&d, e),
                Ok(step) => {
                    let columns = vec![
                        ("Step".into(), step.to_string()),
                        ("Enforce".into(), d.object.spec.enforce.to_string()),
                    ];
                    let compiled = match &d.object.spec.wasm {
                        Some(wasm) => {
                            self.wasm_step(&d.id.key, wasm)
                                .map_err(|(reason, message)| {
                                    (reason, format!("{message}{}", d.source.suffix()))
                                })
                        }
                        None => crate::middleware::compile(&d.object.spec).map_err(|e| {
                            (
                                Reason::InvalidExpression,
                                format!("spec.{step}.{e}{}", d.source.suffix()),
                            )
                        }),
                    };
                    let ready = match compiled {
                        Ok(compiled) => {
                            self.snapshot.middleware.insert(
                                d.id.key.clone(),
                                Arc::new(crate::middleware::ResolvedMiddleware {
                                    key: d.id.key.clone(),
                                    enforce: d.object.spec.enforce,
                                    step: compiled,
                                }),
                            );
                            Desired::ready(Reason::Resolved, format!("{step} step"))
                        }
                        Err((reason, message)) => {
                            tracing::warn!(kind = %d.id.kind, resource = %d.id.key, "{message}");
                            Desired::not_ready(reason, message)
                        }
                    };
                    self.record_declared(&d, ready, KindStatus::empty(Kind::Middleware), columns);
                    valid.insert(d.id.key.clone(), d.object);
                }
            }
        }
        valid
    }

    /// Why a binding in `ns` naming `listed` cannot run its chain: a Middleware it names
    /// is not Ready, or an `enforce: true` one of its namespace is not (fail closed).
    fn middleware_not_ready(&self, ns: &str, listed: &[String]) -> Option<(Reason, String)> {
        let not_ready = |name: &str| -> Option<String> {
            let key = ObjectKey::new(ns.to_string(), name.to_string());
            if self.snapshot.middleware.contains_key(&key) {
                return None;
            }
            let id = ResourceId {
                kind: Kind::Middleware,
                key,
            };
            Some(match self.snapshot.resources.get(&id) {
                Some(state) => {
                    format!("{} ({}: {})", name, state.ready.reason, state.ready.message)
                }
                None => format!("{name} (it is not Ready)"),
            })
        };
        let enforced = self
            .input
            .set
            .middleware
            .iter()
            .filter(|m| {
                m.object.spec.enforce
                    && m.object.metadata.namespace.as_deref().unwrap_or_default() == ns
            })
            .filter_map(|m| m.object.metadata.name.as_deref());
        for name in enforced {
            if let Some(why) = not_ready(name) {
                return Some((
                    Reason::MiddlewareNotReady,
                    format!(
                        "enforced Middleware {why} is not Ready, so no call through a binding of namespace {ns:?} may run"
                    ),
                ));
            }
        }
        listed.iter().find_map(|name| {
            not_ready(name).map(|why| {
                (
                    Reason::MiddlewareNotReady,
                    format!("spec.middleware: Middleware {why} is not Ready"),
                )
            })
        })
    }

    /// The binding's chain in order (the `Middleware` column): enforced Middleware of `ns`
    /// by name, then `listed`, each once.
    fn chain_column(&self, ns: &str, listed: &[String]) -> String {
        let names = match crate::middleware::chain::chain_in(&self.snapshot, ns, listed) {
            Ok(chain) => chain.links.iter().map(|l| l.name().to_string()).collect(),
            // Not Ready: what the chain would be, from the declarations.
            Err(_) => {
                let mut names: Vec<String> = self
                    .input
                    .set
                    .middleware
                    .iter()
                    .filter(|m| {
                        m.object.spec.enforce
                            && m.object.metadata.namespace.as_deref().unwrap_or_default() == ns
                    })
                    .filter_map(|m| m.object.metadata.name.clone())
                    .collect();
                names.sort();
                names.dedup();
                for name in listed {
                    if !names.contains(name) {
                        names.push(name.clone());
                    }
                }
                names
            }
        };
        if names.is_empty() {
            "<none>".to_string()
        } else {
            names.join(",")
        }
    }

    /// The step of a wasm Middleware `key`, or why it has none (a condition reason and
    /// message): its component is loading, missing, wrong, or its limits are.
    fn wasm_step(
        &self,
        key: &ObjectKey,
        spec: &crate::api::WasmStep,
    ) -> Result<crate::middleware::Step, (Reason, String)> {
        use super::artifacts::WasmArtifact;
        match self.input.wasm.get(key) {
            None => Err((
                Reason::ArtifactPending,
                "spec.wasm.artifact has not been loaded yet".into(),
            )),
            Some(WasmArtifact::Failed { reason, message }) => Err((*reason, message.clone())),
            Some(WasmArtifact::Ready { digest, bytes }) => {
                crate::middleware::compile_wasm(spec, digest, bytes.clone())
                    .map_err(|m| (Reason::InvalidSpec, m))
            }
        }
    }

    fn bindings(
        &mut self,
        agents: &BTreeMap<ObjectKey, &Agent>,
        middleware: &BTreeMap<ObjectKey, &Middleware>,
    ) {
        for d in self.declared(Kind::ToolBinding, &self.input.set.bindings) {
            let spec = &d.object.spec;
            let ns = d.id.key.namespace.clone();
            if let Err(e) = check_binding(d.object) {
                self.invalid(&d, e);
                self.keep_binding(&d, None);
                continue;
            }
            let mut columns = vec![
                ("Tool".into(), spec.tool.clone()),
                ("Agents".into(), spec.agents.join(",")),
                (
                    "Middleware".into(),
                    self.chain_column(&ns, &spec.middleware),
                ),
            ];
            let problem = spec
                .agents
                .iter()
                .find(|a| !agents.contains_key(&ObjectKey::new(ns.clone(), (*a).clone())))
                .map(|a| (Reason::UnknownAgent, format!("spec.agents: there is no valid Agent {a:?} in namespace {ns:?}")))
                .or_else(|| {
                    spec.middleware
                        .iter()
                        .find(|m| !middleware.contains_key(&ObjectKey::new(ns.clone(), (*m).clone())))
                        .map(|m| (Reason::UnknownMiddleware, format!("spec.middleware: there is no valid Middleware {m:?} in namespace {ns:?}")))
                })
                .or_else(|| self.middleware_not_ready(&ns, &spec.middleware))
                .or_else(|| {
                    (!self.snapshot.tools.contains_key(&ObjectKey::new(ns.clone(), spec.tool.clone())))
                        .then(|| (Reason::UnknownTool, format!("spec.tool: there is no valid Tool {:?} in namespace {ns:?}", spec.tool)))
                })
                .or_else(|| {
                    self.input
                        .identities
                        .and_then(|_| missing_binding_key(spec, &ns, &self.snapshot.agents))
                });
            let resolved = resolve_binding_release(d.object, &self.snapshot.releases);
            let mut status = ToolBindingStatus::default();
            let mut release = None;
            let ready = match (problem, resolved) {
                (Some((reason, message)), _) => Desired::not_ready(reason, message),
                (None, Err((reason, message))) => Desired::not_ready(reason, message),
                (None, Ok(key)) => {
                    status.resolved_release = Some(key.name.clone());
                    columns.push(("Release".into(), key.name.clone()));
                    release = Some(key.clone());
                    Desired::ready(Reason::Resolved, format!("calls run release {}", key.name))
                }
            };
            self.record_declared(&d, ready, KindStatus::ToolBinding(status), columns);
            self.keep_binding(&d, release);
        }
    }

    /// Each Ready Agent's `status.tools` (and `Tools` column): the tools it may call now.
    fn agent_tools(&mut self) {
        let agents: Vec<ObjectKey> = self.snapshot.agents.keys().cloned().collect();
        for key in agents {
            let tools: Vec<String> = super::access::explain(&self.snapshot, &key, None)
                .into_iter()
                .filter(|a| a.verdict.is_ok())
                .map(|a| a.tool)
                .collect();
            let id = ResourceId {
                kind: Kind::Agent,
                key,
            };
            if let Some(state) = self.snapshot.resources.get_mut(&id) {
                let column = if tools.is_empty() {
                    "<none>".to_string()
                } else {
                    tools.join(",")
                };
                if !tools.is_empty() {
                    state.status["tools"] = serde_json::json!(tools);
                }
                state.columns.push(("Tools".into(), column));
            }
        }
    }

    /// Keeps a binding, Ready or not, with its condition, for authorization and `why`.
    fn keep_binding(&mut self, d: &Declared<'_, ToolBinding>, release: Option<ObjectKey>) {
        let Some(state) = self.snapshot.resources.get(&d.id) else {
            return;
        };
        let binding = ResolvedBinding {
            key: d.id.key.clone(),
            spec: d.object.spec.clone(),
            release: release.filter(|_| state.ready.status),
            ready: state.ready.clone(),
        };
        self.snapshot
            .bindings
            .insert(d.id.key.clone(), Arc::new(binding));
    }
}

/// The first config or secret key a binding lists that one of its agents does not have:
/// a binding can only narrow what its agents have.
fn missing_binding_key(
    spec: &crate::api::ToolBindingSpec,
    ns: &str,
    agents: &BTreeMap<ObjectKey, Arc<ResolvedAgent>>,
) -> Option<(Reason, String)> {
    for name in &spec.agents {
        let agent = agents.get(&ObjectKey::new(ns, name.clone()))?;
        if let Some(key) = spec
            .config_keys_readable
            .iter()
            .find(|k| !agent.config.contains_key(*k))
        {
            let config_map = agent
                .spec
                .config_map_ref
                .as_ref()
                .map(|r| format!("its ConfigMap {ns}/{}", r.name))
                .unwrap_or_else(|| "no configMapRef".into());
            return Some((
                Reason::MissingConfigKey,
                format!(
                    "spec.configKeysReadable: agent {name:?} has no config key {key:?} ({config_map}); a binding can only narrow what the agent has"
                ),
            ));
        }
        if let Some((field, key)) = spec
            .secret_keys_readable
            .iter()
            .map(|k| ("secretKeysReadable", k))
            .chain(
                spec.secret_keys_revealable
                    .iter()
                    .map(|k| ("secretKeysRevealable", k)),
            )
            .find(|(_, k)| !agent.secrets.contains_key(*k))
        {
            let secret = agent
                .spec
                .secret_ref
                .as_ref()
                .map(|r| format!("its Secret {ns}/{}", r.name))
                .unwrap_or_else(|| "no secretRef".into());
            return Some((
                Reason::MissingSecretKey,
                format!(
                    "spec.{field}: agent {name:?} has no secret key {key:?} ({secret}); a binding can only narrow what the agent has"
                ),
            ));
        }
    }
    None
}

/// The release a binding resolves to: the one it names, or the newest Ready release in its
/// version range (all releases when it gives none).
pub fn resolve_binding_release<'r>(
    binding: &ToolBinding,
    releases: &'r BTreeMap<ObjectKey, Arc<ResolvedRelease>>,
) -> Result<&'r ObjectKey, (Reason, String)> {
    let ns = binding.metadata.namespace.clone().unwrap_or_default();
    let spec = &binding.spec;
    let candidates = releases
        .values()
        .filter(|r| r.key.namespace == ns && r.tool == spec.tool);
    let selector = spec.release.clone().unwrap_or(crate::api::ReleaseSelector {
        version: None,
        name: None,
    });
    if let Some(name) = &selector.name {
        return candidates
            .into_iter()
            .find(|r| &r.key.name == name)
            .map(|r| &r.key)
            .ok_or_else(|| {
                (
                    Reason::NoMatchingRelease,
                    format!(
                        "spec.release.name: no Ready ToolRelease {name:?} of tool {:?}",
                        spec.tool
                    ),
                )
            });
    }
    let range = match &selector.version {
        Some(v) => Some(semver::VersionReq::parse(v).map_err(|e| {
            (
                Reason::InvalidSpec,
                format!("spec.release.version: {v:?} is not a version range: {e}"),
            )
        })?),
        None => None,
    };
    candidates
        .filter(|r| range.as_ref().is_none_or(|req| req.matches(&r.version)))
        .max_by(|a, b| a.version.cmp(&b.version))
        .map(|r| &r.key)
        .ok_or_else(|| {
            (
                Reason::NoMatchingRelease,
                format!(
                    "no Ready ToolRelease of tool {:?} matches {}",
                    spec.tool,
                    selector.version.as_deref().unwrap_or("any version")
                ),
            )
        })
}

fn short_digest(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

/// Checks a Tool and compiles its commands.
pub fn check_tool(tool: &Tool, key: &ObjectKey) -> Result<ResolvedTool, FieldError> {
    if !is_kebab(&key.name) {
        return Err(FieldError::new(
            "metadata.name",
            format!(
                "{:?} is not a valid tool name (lowercase letters, digits and dashes, at most 63)",
                key.name
            ),
        ));
    }
    let spec = &tool.spec;
    if spec.commands.is_empty() {
        return Err(FieldError::new(
            "spec.commands",
            "a tool needs at least one command",
        ));
    }
    let mut commands: Vec<Arc<CommandInterface>> = Vec::new();
    for (i, command) in spec.commands.iter().enumerate() {
        let field = format!("spec.commands[{i}]");
        if commands.iter().any(|c| c.name == command.name) {
            return Err(FieldError::new(
                format!("{field}.name"),
                format!("command {:?} is declared twice", command.name),
            ));
        }
        commands.push(Arc::new(CommandInterface::compile(command, &field)?));
    }
    let timeout = spec.timeout.map(|t| t.get()).unwrap_or(DEFAULT_TIMEOUT);
    if timeout.is_zero() {
        return Err(FieldError::new("spec.timeout", "must be longer than zero"));
    }
    if let Some(max) = spec.max_timeout
        && max.get() < timeout
    {
        return Err(FieldError::new(
            "spec.maxTimeout",
            format!(
                "{max} is shorter than the timeout ({})",
                crate::api::units::GoDuration(timeout)
            ),
        ));
    }
    if let Some(retry) = &spec.retry
        && retry.attempts == 0
    {
        return Err(FieldError::new("spec.retry.attempts", "must be at least 1"));
    }
    Ok(ResolvedTool {
        key: key.clone(),
        spec: spec.clone(),
        effect: spec.effect,
        timeout,
        commands,
        release: None,
    })
}

/// The limits of a release with defaults applied, and a note for each value clamped to its
/// maximum (said in the Ready condition).
fn release_limits(release: &ToolRelease) -> Result<(Limits, Vec<String>), FieldError> {
    use crate::api::units::ByteSize;
    use crate::call::{
        DEFAULT_REQUEST_BYTES, DEFAULT_RESPONSE_BYTES, MAX_OUTPUT_BYTES, MAX_REQUEST_BYTES,
        MAX_RESPONSE_BYTES,
    };
    let limits = release.spec.limits.clone().unwrap_or_default();
    let memory = limits.memory.map(|m| m.bytes()).unwrap_or(DEFAULT_MEMORY);
    if !(64 * 1024..=MAX_MEMORY).contains(&memory) {
        return Err(FieldError::new(
            "spec.limits.memory",
            format!("must be between 64Ki and 4Gi (one wasm page at least), not {memory} bytes"),
        ));
    }
    let cpu_time = limits.cpu_time.map(|c| c.get()).unwrap_or(DEFAULT_CPU_TIME);
    if cpu_time.is_zero() {
        return Err(FieldError::new(
            "spec.limits.cpuTime",
            "must be longer than zero",
        ));
    }
    let mut notes = Vec::new();
    let mut bytes =
        |field: &str, value: Option<ByteSize>, default: u64, max: u64| -> Result<u64, FieldError> {
            let value = value.map(|v| v.bytes()).unwrap_or(default);
            if value == 0 {
                return Err(FieldError::new(
                    format!("spec.limits.{field}"),
                    "must be at least 1 byte",
                ));
            }
            if value > max {
                notes.push(format!(
                    "limits.{field} {} is above the maximum of {}: calls are limited to {}",
                    ByteSize(value),
                    ByteSize(max),
                    ByteSize(max)
                ));
                return Ok(max);
            }
            Ok(value)
        };
    let output_bytes = bytes(
        "outputBytes",
        limits.output_bytes,
        DEFAULT_OUTPUT,
        MAX_OUTPUT_BYTES,
    )?;
    let request_bytes = bytes(
        "requestBytes",
        limits.request_bytes,
        DEFAULT_REQUEST_BYTES,
        MAX_REQUEST_BYTES,
    )?;
    let response_bytes = bytes(
        "responseBytes",
        limits.response_bytes,
        DEFAULT_RESPONSE_BYTES,
        MAX_RESPONSE_BYTES,
    )?;
    Ok((
        Limits {
            memory_bytes: memory,
            cpu_time,
            output_bytes,
            instances: limits.instances.unwrap_or(0),
            request_bytes,
            response_bytes,
        },
        notes,
    ))
}

/// Checks a WorkerPool; returns the workers wanted and the slots of each.
pub fn check_pool(pool: &WorkerPool) -> Result<(u32, u32), FieldError> {
    let spec = &pool.spec;
    let slots = spec.slots();
    if slots == 0 || slots > 4096 {
        return Err(FieldError::new(
            "spec.slotsPerWorker",
            format!("must be between 1 and 4096, not {slots}"),
        ));
    }
    match (&spec.replicas, &spec.autoscale) {
        (Some(_), Some(_)) => Err(FieldError::new(
            "spec",
            "set replicas or autoscale, not both",
        )),
        (_, Some(a)) if a.min > a.max => Err(FieldError::new(
            "spec.autoscale",
            format!("min ({}) is above max ({})", a.min, a.max),
        )),
        (_, Some(a)) if a.max == 0 => {
            Err(FieldError::new("spec.autoscale.max", "must be at least 1"))
        }
        (_, Some(a)) => Ok((a.min, slots)),
        (Some(r), None) => Ok((*r, slots)),
        (None, None) => Ok((1, slots)),
    }
}

fn check_agent(agent: &Agent) -> Result<(), FieldError> {
    let spec = &agent.spec;
    if spec.service_account.is_none() && spec.token_secret_ref.is_none() {
        return Err(FieldError::new(
            "spec",
            "name an identity: serviceAccount or tokenSecretRef",
        ));
    }
    for (i, p) in spec.permissions.iter().enumerate() {
        if p.tools.is_empty() {
            return Err(FieldError::new(
                format!("spec.permissions[{i}].tools"),
                "list at least one tool (or \"*\")",
            ));
        }
    }
    Ok(())
}

fn check_middleware(middleware: &Middleware) -> Result<&'static str, FieldError> {
    let spec = &middleware.spec;
    let steps = spec.steps();
    let [step] = steps.as_slice() else {
        return Err(FieldError::new(
            "spec",
            format!(
                "set exactly one of policy, approval, redact, audit, rateLimit or wasm (found {})",
                if steps.is_empty() {
                    "none".to_string()
                } else {
                    steps.join(", ")
                }
            ),
        ));
    };
    if let Some(policy) = &spec.policy
        && policy.rules.is_empty()
        && policy.default == crate::api::PolicyDefault::Allow
    {
        return Err(FieldError::new(
            "spec.policy.rules",
            "give at least one rule (or default: deny)",
        ));
    }
    if let Some(rate) = &spec.rate_limit
        && (rate.requests == 0 || rate.per.get().is_zero())
    {
        return Err(FieldError::new(
            "spec.rateLimit",
            "requests and per must be above zero",
        ));
    }
    if let Some(redact) = &spec.redact {
        for (i, path) in redact.paths.iter().enumerate() {
            if !path.is_empty() && !path.starts_with('/') {
                return Err(FieldError::new(
                    format!("spec.redact.paths[{i}]"),
                    format!("{path:?} is not a JSON pointer (it starts with /)"),
                ));
            }
        }
        for (i, pattern) in redact.patterns.iter().enumerate() {
            if let Err(error) = crate::middleware::redact::compile_pattern(pattern) {
                return Err(FieldError::new(
                    format!("spec.redact.patterns[{i}]"),
                    format!("{pattern:?} is not a usable regular expression: {error}"),
                ));
            }
        }
    }
    Ok(step)
}

fn check_binding(binding: &ToolBinding) -> Result<(), FieldError> {
    let spec = &binding.spec;
    if spec.agents.is_empty() {
        return Err(FieldError::new("spec.agents", "bind at least one agent"));
    }
    if let Some(selector) = &spec.release {
        if selector.name.is_some() && selector.version.is_some() {
            return Err(FieldError::new(
                "spec.release",
                "give a version range or a name, not both",
            ));
        }
        if let Some(v) = &selector.version {
            semver::VersionReq::parse(v).map_err(|e| {
                FieldError::new(
                    "spec.release.version",
                    format!("{v:?} is not a version range: {e}"),
                )
            })?;
        }
    }
    Ok(())
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
    let agents = resolver.agents();
    let middleware = resolver.middleware();
    resolver.bindings(&agents, &middleware);
    resolver.agent_tools();
    resolver.snapshot
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::manifest::{ResourceSet, load_text};
    use std::path::Path;

    const BASE: &str = r#"
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {name: default}
spec: {replicas: 2, slotsPerWorker: 8}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {name: echo}
spec: {effect: read, commands: [{name: default}]}
"#;

    fn release(name: &str, tool: &str, version: &str) -> String {
        format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: {name}}}\nspec: {{tool: {tool}, version: \"{version}\", artifact: {{file: x.wasm}}}}\n"
        )
    }

    fn set_of(text: &str) -> ResourceSet {
        let mut set = ResourceSet::default();
        load_text(Path::new("m.yaml"), text, &mut set);
        set
    }

    fn ready_artifacts(set: &ResourceSet, digest: &str) -> HashMap<ObjectKey, ArtifactOutcome> {
        set.releases
            .iter()
            .map(|r| {
                (
                    ObjectKey::new("default", r.object.metadata.name.clone().unwrap()),
                    ArtifactOutcome::Ready {
                        digest: digest.into(),
                        size: 10,
                        kind: "module",
                    },
                )
            })
            .collect()
    }

    fn run(
        set: &ResourceSet,
        artifacts: &HashMap<ObjectKey, ArtifactOutcome>,
        previous: &HashMap<ResourceId, PreviousState>,
        at: &str,
    ) -> Snapshot {
        resolve(&ResolveInput {
            set,
            artifacts,
            wasm: &HashMap::new(),
            previous,
            now: at.parse().unwrap(),
            identities: None,
        })
    }

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:05:00Z";

    fn state<'s>(snapshot: &'s Snapshot, kind: Kind, name: &str) -> &'s ResourceState {
        snapshot
            .resources
            .get(&ResourceId {
                kind,
                key: ObjectKey::new("default", name),
            })
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    }

    #[test]
    fn the_newest_ready_release_serves_the_tool() {
        let text = format!(
            "{BASE}{}{}",
            release("echo-1.2.0", "echo", "1.2.0"),
            release("echo-1.10.0", "echo", "1.10.0")
        );
        let set = set_of(&text);
        let snapshot = run(
            &set,
            &ready_artifacts(&set, "sha256:a"),
            &HashMap::new(),
            T0,
        );
        let tool = snapshot.tool("default", "echo").unwrap();
        assert_eq!(tool.release.as_ref().unwrap().name, "echo-1.10.0");
        let status = &state(&snapshot, Kind::Tool, "echo").status;
        assert_eq!(status["release"], "echo-1.10.0");
        assert_eq!(status["observedGeneration"], 1);
        assert_eq!(status["conditions"][0]["type"], "Ready");
        assert_eq!(status["conditions"][0]["status"], "True");
        let release = state(&snapshot, Kind::ToolRelease, "echo-1.2.0");
        assert_eq!(release.status["digest"], "sha256:a");
        assert_eq!(snapshot.pools.values().next().unwrap().desired_workers, 2);
    }

    #[test]
    fn releases_say_why_they_are_not_ready() {
        let text = format!(
            "{BASE}{}{}{}{}{}",
            release("ghost-1.0.0", "ghost", "1.0.0"),
            release("echo-bad", "echo", "one"),
            release("echo-1.0.0", "echo", "1.0.0"),
            release("echo-again", "echo", "1.0.0"),
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {name: echo-2.0.0}\nspec: {tool: echo, version: 2.0.0, pool: gpu, artifact: {file: x.wasm}}\n",
        );
        let set = set_of(&text);
        let mut artifacts = ready_artifacts(&set, "sha256:a");
        artifacts.insert(
            ObjectKey::new("default", "echo-1.0.0"),
            ArtifactOutcome::Failed {
                reason: Reason::InvalidArtifact,
                message: "bad magic".into(),
            },
        );
        let snapshot = run(&set, &artifacts, &HashMap::new(), T0);
        let reason = |name: &str| state(&snapshot, Kind::ToolRelease, name).ready.reason;
        assert_eq!(reason("ghost-1.0.0"), Reason::UnknownTool);
        assert_eq!(reason("echo-bad"), Reason::InvalidSpec);
        assert!(
            state(&snapshot, Kind::ToolRelease, "echo-bad")
                .ready
                .message
                .contains("spec.version")
        );
        assert_eq!(reason("echo-1.0.0"), Reason::InvalidArtifact);
        assert_eq!(reason("echo-again"), Reason::ArtifactReady);
        assert_eq!(reason("echo-2.0.0"), Reason::UnknownPool);
        assert_eq!(
            snapshot
                .tool("default", "echo")
                .unwrap()
                .release
                .as_ref()
                .unwrap()
                .name,
            "echo-again"
        );
    }

    #[test]
    fn two_releases_of_one_version_conflict() {
        let text = format!(
            "{BASE}{}{}",
            release("a", "echo", "1.0.0"),
            release("b", "echo", "1.0.0")
        );
        let set = set_of(&text);
        let snapshot = run(
            &set,
            &ready_artifacts(&set, "sha256:a"),
            &HashMap::new(),
            T0,
        );
        assert_eq!(
            state(&snapshot, Kind::ToolRelease, "a").ready.reason,
            Reason::ArtifactReady
        );
        assert_eq!(
            state(&snapshot, Kind::ToolRelease, "b").ready.reason,
            Reason::DuplicateVersion
        );
    }

    #[test]
    fn a_ready_release_is_immutable() {
        let text = format!("{BASE}{}", release("echo-1.0.0", "echo", "1.0.0"));
        let set = set_of(&text);
        let first = run(
            &set,
            &ready_artifacts(&set, "sha256:a"),
            &HashMap::new(),
            T0,
        );
        let previous = previous_of(&first);
        let second = run(&set, &ready_artifacts(&set, "sha256:b"), &previous, T1);
        let release = state(&second, Kind::ToolRelease, "echo-1.0.0");
        assert_eq!(release.ready.reason, Reason::ImmutableRelease);
        assert_eq!(
            release.status["digest"], "sha256:a",
            "the status keeps the digest it was Ready with"
        );
        assert!(second.tool("default", "echo").unwrap().release.is_none());
    }

    #[test]
    fn generations_and_transition_times_follow_changes() {
        let text = format!("{BASE}{}", release("echo-1.0.0", "echo", "1.0.0"));
        let set = set_of(&text);
        let artifacts = ready_artifacts(&set, "sha256:a");
        let first = run(&set, &artifacts, &HashMap::new(), T0);
        let unchanged = run(&set, &artifacts, &previous_of(&first), T1);
        let tool = state(&unchanged, Kind::Tool, "echo");
        assert_eq!(tool.generation, 1);
        assert_eq!(
            tool.status["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:00:00Z"
        );

        let changed = set_of(&format!(
            "{}{}",
            BASE.replace("effect: read", "effect: write"),
            release("echo-1.0.0", "echo", "1.0.0")
        ));
        let third = run(&changed, &artifacts, &previous_of(&unchanged), T1);
        let tool = state(&third, Kind::Tool, "echo");
        assert_eq!(tool.generation, 2);
        assert_eq!(tool.status["observedGeneration"], 2);
        assert_eq!(tool.status["conditions"][0]["observedGeneration"], 2);
        assert_eq!(
            tool.status["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z",
            "still Ready"
        );

        // A tool losing its release transitions.
        let bare = set_of(BASE);
        let fourth = run(&bare, &HashMap::new(), &previous_of(&third), T1);
        let tool = state(&fourth, Kind::Tool, "echo");
        assert_eq!(tool.ready.reason, Reason::NoReadyRelease);
        assert_eq!(
            tool.status["conditions"][0]["lastTransitionTime"],
            "2026-01-01T00:05:00Z"
        );
    }

    #[test]
    fn a_name_declared_twice_serves_neither() {
        let mut set = set_of(BASE);
        load_text(Path::new("other.yaml"), BASE, &mut set);
        let snapshot = run(&set, &HashMap::new(), &HashMap::new(), T0);
        let tool = state(&snapshot, Kind::Tool, "echo");
        assert_eq!(tool.ready.reason, Reason::DuplicateName);
        assert!(tool.ready.message.contains("m.yaml") && tool.ready.message.contains("other.yaml"));
        assert!(snapshot.tool("default", "echo").is_none());
        assert!(snapshot.pools.is_empty());
    }

    #[test]
    fn pools_agents_middleware_and_bindings_are_validated() {
        let text = format!(
            r#"{BASE}{}
---
apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: both}}
spec: {{replicas: 1, autoscale: {{min: 1, max: 2}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: reporter}}
spec: {{serviceAccount: reporter, permissions: [{{tools: [echo]}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {{name: nobody}}
spec: {{permissions: []}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: two-steps}}
spec: {{audit: {{}}, rateLimit: {{requests: 1, per: 1s}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: audit}}
spec: {{audit: {{stdout: true}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: ok}}
spec: {{agents: [reporter], tool: echo, release: {{version: "^1.1"}}, middleware: [audit]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: too-new}}
spec: {{agents: [reporter], tool: echo, release: {{version: "^2"}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {{name: stranger}}
spec: {{agents: [nobody], tool: echo}}
"#,
            release("echo-1.2.0", "echo", "1.2.0")
        );
        let set = set_of(&text);
        assert!(set.invalid.is_empty(), "{:?}", set.invalid);
        let snapshot = run(
            &set,
            &ready_artifacts(&set, "sha256:a"),
            &HashMap::new(),
            T0,
        );
        let reason = |kind, name: &str| state(&snapshot, kind, name).ready.reason;
        assert_eq!(reason(Kind::WorkerPool, "both"), Reason::InvalidSpec);
        assert_eq!(reason(Kind::Agent, "reporter"), Reason::Resolved);
        assert_eq!(reason(Kind::Agent, "nobody"), Reason::InvalidSpec);
        assert_eq!(reason(Kind::Middleware, "two-steps"), Reason::InvalidSpec);
        assert_eq!(reason(Kind::Middleware, "audit"), Reason::Resolved);
        assert_eq!(reason(Kind::ToolBinding, "ok"), Reason::Resolved);
        assert_eq!(
            state(&snapshot, Kind::ToolBinding, "ok").status["resolvedRelease"],
            "echo-1.2.0"
        );
        assert_eq!(
            reason(Kind::ToolBinding, "too-new"),
            Reason::NoMatchingRelease
        );
        assert_eq!(reason(Kind::ToolBinding, "stranger"), Reason::UnknownAgent);
    }

    mod middleware {
        use super::*;

        const MIDDLEWARE: &str = r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Agent
metadata: {name: reporter}
spec: {serviceAccount: reporter, permissions: [{tools: [echo]}]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: limit}
spec: {rateLimit: {requests: 5, per: 1m}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: audit-all}
spec: {enforce: true, audit: {}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: approve-pushes}
spec: {approval: {when: 'call.command == "push"'}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: broken}
spec: {policy: {rules: [{action: allow}, {when: 'call.tool ==', action: deny}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: chained}
spec: {agents: [reporter], tool: echo, middleware: [limit, audit-all, approve-pushes, limit]}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: plain}
spec: {agents: [reporter], tool: echo}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolBinding
metadata: {name: uses-broken}
spec: {agents: [reporter], tool: echo, middleware: [broken]}
"#;

        fn resolve_text(text: &str) -> Snapshot {
            let set = set_of(text);
            assert!(set.invalid.is_empty(), "{:?}", set.invalid);
            run(
                &set,
                &ready_artifacts(&set, "sha256:a"),
                &HashMap::new(),
                T0,
            )
        }

        fn column(snapshot: &Snapshot, kind: Kind, name: &str, column: &str) -> String {
            state(snapshot, kind, name)
                .columns
                .iter()
                .find(|(c, _)| c == column)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        }

        #[test]
        fn a_middleware_that_does_not_compile_is_not_ready_and_not_in_the_snapshot() {
            let text = format!(
                "{BASE}{}{MIDDLEWARE}",
                release("echo-1.2.0", "echo", "1.2.0")
            );
            let snapshot = resolve_text(&text);
            let broken = state(&snapshot, Kind::Middleware, "broken");
            assert!(!broken.ready.status);
            assert_eq!(broken.ready.reason, Reason::InvalidExpression);
            assert!(
                broken
                    .ready
                    .message
                    .starts_with("spec.policy.rules[1].when: "),
                "{}",
                broken.ready.message
            );
            assert!(!snapshot.middleware.keys().any(|k| k.name == "broken"));
            for name in ["limit", "audit-all", "approve-pushes"] {
                assert_eq!(
                    state(&snapshot, Kind::Middleware, name).ready.reason,
                    Reason::Resolved,
                    "{name}"
                );
                assert!(snapshot.middleware.keys().any(|k| k.name == name), "{name}");
            }
            // The binding that names it is not Ready, naming it and why.
            let uses = state(&snapshot, Kind::ToolBinding, "uses-broken");
            assert_eq!(uses.ready.reason, Reason::MiddlewareNotReady);
            assert!(
                uses.ready.message.contains("broken"),
                "{}",
                uses.ready.message
            );
            assert!(
                uses.ready.message.contains("InvalidExpression"),
                "{}",
                uses.ready.message
            );
            // The others are Ready.
            assert_eq!(
                state(&snapshot, Kind::ToolBinding, "chained").ready.reason,
                Reason::Resolved
            );
            assert_eq!(
                state(&snapshot, Kind::ToolBinding, "plain").ready.reason,
                Reason::Resolved
            );
        }

        #[test]
        fn an_approval_when_that_does_not_compile_is_not_ready() {
            let text = format!(
                "{BASE}{}{}",
                release("echo-1.2.0", "echo", "1.2.0"),
                r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: approve}
spec: {approval: {when: 'call.command == '}}
"#
            );
            let snapshot = resolve_text(&text);
            let approve = state(&snapshot, Kind::Middleware, "approve");
            assert_eq!(approve.ready.reason, Reason::InvalidExpression);
            assert!(
                approve.ready.message.starts_with("spec.approval.when: "),
                "{}",
                approve.ready.message
            );
        }

        #[test]
        fn an_enforced_middleware_that_is_not_ready_fails_every_binding_closed() {
            let text = format!(
                "{BASE}{}{MIDDLEWARE}{}",
                release("echo-1.2.0", "echo", "1.2.0"),
                r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: guard}
spec: {enforce: true, policy: {rules: [{when: 'nope', action: deny}]}}
"#
            );
            let snapshot = resolve_text(&text);
            assert_eq!(
                state(&snapshot, Kind::Middleware, "guard").ready.reason,
                Reason::InvalidExpression
            );
            for name in ["chained", "plain", "uses-broken"] {
                let b = state(&snapshot, Kind::ToolBinding, name);
                assert_eq!(b.ready.reason, Reason::MiddlewareNotReady, "{name}");
                assert!(b.ready.message.contains("guard"), "{}", b.ready.message);
                let binding = snapshot
                    .bindings
                    .values()
                    .find(|b| b.key.name == name)
                    .unwrap();
                assert!(!binding.is_ready(), "{name}");
            }
        }

        #[test]
        fn an_enforced_middleware_with_an_invalid_spec_fails_closed_too() {
            let text = format!(
                "{BASE}{}{MIDDLEWARE}{}",
                release("echo-1.2.0", "echo", "1.2.0"),
                r#"
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {name: guard}
spec: {enforce: true, audit: {}, rateLimit: {requests: 1, per: 1s}}
"#
            );
            let snapshot = resolve_text(&text);
            let b = state(&snapshot, Kind::ToolBinding, "plain");
            assert_eq!(b.ready.reason, Reason::MiddlewareNotReady);
            assert!(
                b.ready.message.contains("InvalidSpec"),
                "{}",
                b.ready.message
            );
        }

        #[test]
        fn the_middleware_column_is_the_chain_in_order() {
            let text = format!(
                "{BASE}{}{MIDDLEWARE}",
                release("echo-1.2.0", "echo", "1.2.0")
            );
            let snapshot = resolve_text(&text);
            assert_eq!(
                column(&snapshot, Kind::ToolBinding, "chained", "Middleware"),
                "audit-all,limit,approve-pushes"
            );
            assert_eq!(
                column(&snapshot, Kind::ToolBinding, "plain", "Middleware"),
                "audit-all"
            );
            // Not Ready: what the chain would be.
            assert_eq!(
                column(&snapshot, Kind::ToolBinding, "uses-broken", "Middleware"),
                "audit-all,broken"
            );
            // The same order the gateway runs.
            let chained = snapshot
                .bindings
                .values()
                .find(|b| b.key.name == "chained")
                .unwrap();
            let chain = crate::middleware::chain_for(&snapshot, chained).unwrap();
            let names: Vec<&str> = chain.links.iter().map(|l| l.name()).collect();
            assert_eq!(names, ["audit-all", "limit", "approve-pushes"]);
        }
    }

    #[test]
    fn a_wasm_middleware_is_ready_only_with_its_component() {
        use crate::catalog::artifacts::WasmArtifact;
        let wasm = |name: &str, extra: &str| {
            format!(
                "---\napiVersion: toolgrid.dev/v1alpha1\nkind: Middleware\nmetadata: {{name: {name}}}\nspec: {{wasm: {{artifact: {{file: m.wasm}}{extra}}}}}\n"
            )
        };
        let text = format!(
            "{BASE}{}{}{}{}{}---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: through-bad}}\nspec: {{agents: [reporter], tool: echo, middleware: [bad]}}\n---\napiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: reporter}}\nspec: {{serviceAccount: reporter, permissions: [{{tools: [echo]}}]}}\n",
            release("echo-1.2.0", "echo", "1.2.0"),
            wasm("good", ", timeout: 200ms"),
            wasm("bad", ""),
            wasm("pending", ""),
            wasm("slow", ", timeout: 5m"),
        );
        let set = set_of(&text);
        assert!(set.invalid.is_empty(), "{:?}", set.invalid);
        let key = |name: &str| ObjectKey::new("default", name);
        let ready = WasmArtifact::Ready {
            digest: "sha256:c".into(),
            bytes: Arc::new(vec![0]),
        };
        let components: HashMap<ObjectKey, WasmArtifact> = [
            (key("good"), ready.clone()),
            (key("slow"), ready),
            (
                key("bad"),
                WasmArtifact::Failed {
                    reason: Reason::InvalidArtifact,
                    message: "spec.wasm.artifact: not a wasm middleware".into(),
                },
            ),
        ]
        .into();
        let snapshot = resolve(&ResolveInput {
            set: &set,
            artifacts: &ready_artifacts(&set, "sha256:a"),
            wasm: &components,
            previous: &HashMap::new(),
            now: T0.parse().unwrap(),
            identities: None,
        });
        let ready = |name: &str| state(&snapshot, Kind::Middleware, name).ready.clone();
        assert_eq!(ready("good").reason, Reason::Resolved);
        let Some(crate::middleware::Step::Wasm(module)) =
            snapshot.middleware.get(&key("good")).map(|m| &m.step)
        else {
            panic!("a wasm step")
        };
        assert_eq!(module.digest, "sha256:c");
        assert_eq!(module.timeout, Duration::from_millis(200));
        assert_eq!(ready("bad").reason, Reason::InvalidArtifact);
        assert!(ready("bad").message.contains("not a wasm middleware"));
        assert_eq!(ready("pending").reason, Reason::ArtifactPending);
        assert_eq!(ready("slow").reason, Reason::InvalidSpec);
        assert!(ready("slow").message.contains("spec.wasm.timeout"));
        for name in ["bad", "pending", "slow"] {
            assert!(!snapshot.middleware.contains_key(&key(name)), "{name}");
        }
        assert_eq!(
            state(&snapshot, Kind::ToolBinding, "through-bad")
                .ready
                .reason,
            Reason::MiddlewareNotReady
        );
    }
}
