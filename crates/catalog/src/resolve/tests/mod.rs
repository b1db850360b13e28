//! The reconcile's tests, by kind (as the code is), with the fixtures they share: a base
//! of a pool and a tool, releases of it, and one round of [`resolve`] at a time.

mod agent;
mod binding;
mod declared;
mod middleware;
mod release;
mod tool;
mod tool_source;

use super::{PreviousState, ResolveInput, previous_of, resolve};
use crate::artifacts::ArtifactOutcome;
use crate::manifest::{ResourceSet, load_text};
use crate::snapshot::{ResourceId, ResourceState, Snapshot};
use std::collections::HashMap;
use std::path::Path;
use toolgrid_api::Kind;
use toolgrid_api::conditions::Reason;
use toolgrid_core::ids::ObjectKey;

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
                    files: Vec::new(),
                    commands: r
                        .object
                        .spec
                        .commands
                        .iter()
                        .map(|c| crate::artifacts::CommandRef {
                            name: c.name.clone(),
                            digest: c.artifact.digest.clone().unwrap_or_default(),
                            size: 20,
                            kind: "module",
                            files: Vec::new(),
                        })
                        .collect(),
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
    run_reusing(set, artifacts, previous, at, None)
}

/// One round with every release's artifact ready (`sha256:a`).
fn run_ready(
    set: &ResourceSet,
    previous: &HashMap<ResourceId, PreviousState>,
    at: &str,
) -> Snapshot {
    run(set, &ready_artifacts(set, "sha256:a"), previous, at)
}

/// One round, given the previous round's snapshot to reuse (`ResolveInput::reuse`).
fn run_reusing(
    set: &ResourceSet,
    artifacts: &HashMap<ObjectKey, ArtifactOutcome>,
    previous: &HashMap<ResourceId, PreviousState>,
    at: &str,
    reuse: Option<&Snapshot>,
) -> Snapshot {
    resolve(&ResolveInput {
        set,
        artifacts,
        wasm: &HashMap::new(),
        previous,
        now: at.parse().unwrap(),
        identities: None,
        source_reads: &Default::default(),
        rollouts: &Default::default(),
        reuse,
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
