//! The resolved view that the gateway and scheduler read: what is live now, and the status
//! of every declared resource.

use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use toolgrid_api::conditions::Desired;
use toolgrid_api::{
    AgentSpec, Effect, Kind, NetworkPolicy, ToolBindingSpec, ToolSpec, WorkerPoolSpec,
};
use toolgrid_core::ids::ObjectKey;
use toolgrid_core::interface::CommandInterface;
use toolgrid_core::secret::SecretValue;

/// A resource of a kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceId {
    pub kind: Kind,
    pub key: ObjectKey,
}

/// A Tool that passed validation.
#[derive(Clone, Debug)]
pub struct ResolvedTool {
    pub key: ObjectKey,
    pub spec: ToolSpec,
    pub effect: Effect,
    pub timeout: Duration,
    /// Commands in declaration order.
    pub commands: Vec<Arc<CommandInterface>>,
    /// The newest Ready release, which new calls run.
    pub release: Option<ObjectKey>,
}

impl ResolvedTool {
    pub fn command(&self, name: &str) -> Option<&Arc<CommandInterface>> {
        self.commands.iter().find(|c| c.name == name)
    }
}

/// Limits of a release with defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpu_time: Duration,
    pub output_bytes: u64,
    /// Calls of the release running at once; 0 for no limit.
    pub instances: u32,
    pub request_bytes: u64,
    pub response_bytes: u64,
}

/// A Ready ToolRelease.
#[derive(Clone, Debug)]
pub struct ResolvedRelease {
    pub key: ObjectKey,
    pub tool: String,
    pub version: semver::Version,
    pub digest: String,
    pub size: u64,
    /// `module` or `component`.
    pub artifact_kind: &'static str,
    pub pool: String,
    pub limits: Limits,
    pub network: NetworkPolicy,
    /// An imported tool's "release" (a ToolSource's snapshot of it): its calls are this
    /// upstream request, made by a worker of `pool`, instead of a wasm run.
    pub upstream: Option<Arc<toolgrid_core::source::UpstreamCall>>,
    /// Read-only files every call sees beside the artifact (`spec.files`).
    pub files: Vec<toolgrid_core::artifact::FileRef>,
    /// Commands that run their own artifact (`spec.commands`), by name.
    pub commands: BTreeMap<String, CommandRelease>,
}

/// A command of a release that runs its own artifact, with its files and limits.
#[derive(Clone, Debug)]
pub struct CommandRelease {
    pub digest: String,
    pub size: u64,
    /// `module` or `component`.
    pub artifact_kind: &'static str,
    pub files: Vec<toolgrid_core::artifact::FileRef>,
    /// The release's limits with the command's in their place.
    pub limits: Limits,
}

/// What a call of one command of a release runs.
#[derive(Clone, Copy, Debug)]
pub struct RunOf<'a> {
    pub digest: &'a str,
    pub files: &'a [toolgrid_core::artifact::FileRef],
    pub limits: &'a Limits,
}

impl ResolvedRelease {
    /// What a call of `command` runs: the command's own artifact when the release gives it
    /// one, the release's otherwise.
    pub fn run_of(&self, command: &str) -> RunOf<'_> {
        match self.commands.get(command) {
            Some(own) => RunOf {
                digest: &own.digest,
                files: &own.files,
                limits: &own.limits,
            },
            None => RunOf {
                digest: &self.digest,
                files: &self.files,
                limits: &self.limits,
            },
        }
    }

    /// Every digest a call of the release may run or mount: its artifact and files, and
    /// its commands' (what retention keeps while the release exists).
    pub fn digests(&self) -> impl Iterator<Item = &str> {
        let own = std::iter::once(self.digest.as_str())
            .chain(self.files.iter().map(|f| f.digest.as_str()));
        let commands = self.commands.values().flat_map(|c| {
            std::iter::once(c.digest.as_str()).chain(c.files.iter().map(|f| f.digest.as_str()))
        });
        own.chain(commands)
    }
}

/// A valid WorkerPool.
#[derive(Clone, Debug)]
pub struct ResolvedPool {
    pub key: ObjectKey,
    pub spec: WorkerPoolSpec,
    /// Workers wanted now (replicas, or the autoscale minimum).
    pub desired_workers: u32,
    pub slots_per_worker: u32,
}

/// A Ready Agent, with what it refers to resolved.
#[derive(Clone, Debug)]
pub struct ResolvedAgent {
    pub key: ObjectKey,
    pub spec: AgentSpec,
    /// SHA-256 of the bearer token in its `tokenSecretRef` (the token itself is not kept).
    pub token_digest: Option<[u8; 32]>,
    /// Its ConfigMap's data (empty without `configMapRef`).
    pub config: BTreeMap<String, String>,
    /// Its Secret's keys and values (empty without `secretRef`); values never print.
    pub secrets: BTreeMap<String, SecretValue>,
}

/// A ToolBinding whose spec is valid, Ready or not (`why` explains the ones that are not).
#[derive(Clone, Debug)]
pub struct ResolvedBinding {
    pub key: ObjectKey,
    pub spec: ToolBindingSpec,
    /// The release calls through it run; `Some` exactly when it is Ready.
    pub release: Option<ObjectKey>,
    /// Its canary, when `spec.rollout` names a Ready release and the binding is Ready.
    pub rollout: Option<ResolvedRollout>,
    /// Its Ready condition as resolved.
    pub ready: Desired,
}

/// A binding's canary: its release, its plan and where it is.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedRollout {
    pub canary: ObjectKey,
    pub plan: toolgrid_core::rollout::Plan,
    pub progress: toolgrid_core::rollout::Progress,
}

impl ResolvedRollout {
    /// The canary's share of new calls now.
    pub fn weight(&self) -> toolgrid_core::rollout::Weight {
        self.progress.weight(&self.plan)
    }
}

impl ResolvedBinding {
    pub fn is_ready(&self) -> bool {
        self.ready.status && self.release.is_some()
    }

    /// Whether it names `agent` and `tool`, all three in its own namespace: a binding
    /// never reaches across a namespace, for the agent nor for the tool.
    pub fn binds(&self, agent: &ObjectKey, tool: &ObjectKey) -> bool {
        self.key.namespace == agent.namespace
            && self.key.namespace == tool.namespace
            && self.spec.tool == tool.name
            && self.spec.agents.iter().any(|a| a == &agent.name)
    }
}

/// What a user sees of one declared resource.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceState {
    pub id: ResourceId,
    /// Where it was declared.
    pub source: String,
    pub generation: i64,
    pub spec_hash: String,
    pub ready: Desired,
    /// The kind's status object (conditions, observedGeneration, and its own fields).
    pub status: Value,
    /// Kind-specific columns for `toolgrid get`.
    pub columns: Vec<(String, String)>,
}

/// The whole resolved catalog at one moment.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub tools: BTreeMap<ObjectKey, Arc<ResolvedTool>>,
    pub releases: BTreeMap<ObjectKey, Arc<ResolvedRelease>>,
    pub pools: BTreeMap<ObjectKey, ResolvedPool>,
    /// Ready Agents.
    pub agents: BTreeMap<ObjectKey, Arc<ResolvedAgent>>,
    /// Every ToolBinding with a valid spec, Ready or not.
    pub bindings: BTreeMap<ObjectKey, Arc<ResolvedBinding>>,
    /// Ready Middleware, compiled.
    pub middleware: BTreeMap<ObjectKey, Arc<toolgrid_core::middleware::ResolvedMiddleware>>,
    pub resources: BTreeMap<ResourceId, ResourceState>,
    /// The values of each Ready ToolSource's own Secret keys, by the reference they travel
    /// under (`toolsource-auth`, `toolsource-header-N`): what an imported tool's call carries
    /// to its worker; values never print.
    pub source_secrets: BTreeMap<ObjectKey, BTreeMap<String, SecretValue>>,
    /// Documents that could not be attributed to a resource (bad YAML, unknown kinds).
    pub problems: Vec<String>,
    /// Increases with every published snapshot.
    pub revision: u64,
}

impl Snapshot {
    pub fn tool(&self, namespace: &str, name: &str) -> Option<&Arc<ResolvedTool>> {
        self.tools.get(&ObjectKey::new(namespace, name))
    }

    pub fn release(&self, key: &ObjectKey) -> Option<&Arc<ResolvedRelease>> {
        self.releases.get(key)
    }

    /// The release with this digest, for artifact fetches.
    pub fn has_digest(&self, digest: &str) -> bool {
        self.releases.values().any(|r| r.digest == digest)
    }

    pub fn agent(&self, key: &ObjectKey) -> Option<&Arc<ResolvedAgent>> {
        self.agents.get(key)
    }

    /// The values of `keys` in the Secret of agent `namespace/agent` (its `secretRef`):
    /// what the scheduler hands a worker with a call whose access names these keys. Keys
    /// the Secret does not have (any more) are left out.
    pub fn secret_values<'k>(
        &self,
        namespace: &str,
        agent: &str,
        keys: impl IntoIterator<Item = &'k String>,
    ) -> BTreeMap<String, SecretValue> {
        let Some(agent) = self.agents.get(&ObjectKey::new(namespace, agent)) else {
            return BTreeMap::new();
        };
        keys.into_iter()
            .filter_map(|k| agent.secrets.get(k).map(|v| (k.clone(), v.clone())))
            .collect()
    }

    pub fn resources_of(&self, kind: Kind) -> impl Iterator<Item = &ResourceState> {
        self.resources.values().filter(move |r| r.id.kind == kind)
    }

    /// The resources of `kind` whose resolved state is not what it was in `previous` (new
    /// ones included; all of them without a previous snapshot): after a publish, the
    /// objects whose status may have to be written again. A change to one tool touches its
    /// own few resources, so a catalog of thousands is not looked at whole.
    pub fn changed_since<'a>(
        &'a self,
        previous: Option<&'a Snapshot>,
        kind: Kind,
    ) -> impl Iterator<Item = &'a ObjectKey> + 'a {
        self.resources_of(kind)
            .filter(move |state| {
                previous
                    .and_then(|p| p.resources.get(&state.id))
                    .is_none_or(|before| before != *state)
            })
            .map(|state| &state.id.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_api::conditions::Reason;

    fn state(kind: Kind, name: &str, ready: bool) -> ResourceState {
        let reason = if ready {
            Reason::Released
        } else {
            Reason::NoReadyRelease
        };
        ResourceState {
            id: ResourceId {
                kind,
                key: ObjectKey::new("default", name),
            },
            source: "cluster".into(),
            generation: 1,
            spec_hash: "h".into(),
            ready: Desired {
                type_: "Ready",
                status: ready,
                reason,
                message: String::new(),
            },
            status: serde_json::json!({"observedGeneration": 1}),
            columns: vec![],
        }
    }

    fn snapshot(states: Vec<ResourceState>) -> Snapshot {
        Snapshot {
            resources: states.into_iter().map(|s| (s.id.clone(), s)).collect(),
            ..Default::default()
        }
    }

    fn names<'a>(keys: impl Iterator<Item = &'a ObjectKey>) -> Vec<&'a str> {
        keys.map(|k| k.name.as_str()).collect()
    }

    #[test]
    fn only_the_resources_whose_state_moved_are_changed() {
        let before = snapshot(vec![
            state(Kind::Tool, "a", true),
            state(Kind::Tool, "b", true),
            state(Kind::ToolRelease, "a-1", true),
        ]);
        let after = snapshot(vec![
            state(Kind::Tool, "a", true),
            state(Kind::Tool, "b", false),
            state(Kind::Tool, "c", true),
            state(Kind::ToolRelease, "a-1", true),
        ]);
        // b's state moved and c is new; a is as it was, and a removed resource is not
        // listed (its object is gone with it).
        assert_eq!(
            names(after.changed_since(Some(&before), Kind::Tool)),
            ["b", "c"]
        );
        assert!(
            after
                .changed_since(Some(&before), Kind::ToolRelease)
                .next()
                .is_none()
        );
        // A status field alone counts too.
        let mut moved = state(Kind::ToolRelease, "a-1", true);
        moved.status = serde_json::json!({"observedGeneration": 2});
        let later = snapshot(vec![moved]);
        assert_eq!(
            names(later.changed_since(Some(&after), Kind::ToolRelease)),
            ["a-1"]
        );
    }

    #[test]
    fn without_a_previous_snapshot_every_resource_of_the_kind_is_changed() {
        let first = snapshot(vec![
            state(Kind::Tool, "a", true),
            state(Kind::ToolRelease, "a-1", true),
            state(Kind::Tool, "b", false),
        ]);
        assert_eq!(names(first.changed_since(None, Kind::Tool)), ["a", "b"]);
        assert_eq!(names(first.changed_since(None, Kind::ToolRelease)), ["a-1"]);
    }
}
