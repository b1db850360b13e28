//! The crate graph is the architecture (docs/architecture.md, "Crates"): read from
//! `cargo metadata`, the domain core depends on no async runtime, transport, storage,
//! sandbox or cluster client, even through another crate, and each crate of the workspace
//! depends only on the layers below its own.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// What each crate of the workspace may depend on (normal and dev dependencies alike;
/// `toolgrid-testkit` is open to every crate's tests and to no crate's code).
const ALLOWED: &[(&str, &[&str])] = &[
    ("toolgrid-core", &[]),
    ("toolgrid-api", &["toolgrid-core"]),
    ("toolgrid-catalog", &["toolgrid-core", "toolgrid-api"]),
    ("toolgrid-proto", &["toolgrid-core"]),
    ("toolgrid-store", &["toolgrid-core"]),
    ("toolgrid-trace", &[]),
    ("toolgrid-sandbox", &["toolgrid-core", "toolgrid-trace"]),
    ("toolgrid-upstream", &["toolgrid-core"]),
    (
        "toolgrid-codegen",
        &["toolgrid-core", "toolgrid-api", "toolgrid-proto"],
    ),
    (
        "toolgrid-worker",
        &[
            "toolgrid-core",
            "toolgrid-proto",
            "toolgrid-sandbox",
            "toolgrid-upstream",
            "toolgrid-trace",
        ],
    ),
    (
        "toolgrid-control-plane",
        &[
            "toolgrid-core",
            "toolgrid-api",
            "toolgrid-catalog",
            "toolgrid-proto",
            "toolgrid-store",
            "toolgrid-sandbox",
            "toolgrid-upstream",
            "toolgrid-codegen",
            "toolgrid-trace",
        ],
    ),
    (
        "toolgrid-controller",
        &[
            "toolgrid-core",
            "toolgrid-api",
            "toolgrid-catalog",
            "toolgrid-proto",
            "toolgrid-store",
            "toolgrid-control-plane",
        ],
    ),
    (
        "toolgrid",
        &[
            "toolgrid-core",
            "toolgrid-api",
            "toolgrid-catalog",
            "toolgrid-proto",
            "toolgrid-store",
            "toolgrid-sandbox",
            "toolgrid-worker",
            "toolgrid-control-plane",
            "toolgrid-controller",
            "toolgrid-upstream",
            "toolgrid-codegen",
            "toolgrid-trace",
        ],
    ),
    ("toolgrid-testkit", &[]),
];

/// Crates the domain core must not reach by any path.
const NOT_IN_CORE: &[&str] = &[
    "tokio",
    "tonic",
    "prost",
    "sqlx",
    "rusqlite",
    "kube",
    "k8s-openapi",
    "wasmtime",
    "axum",
    "hyper",
    "reqwest",
];

struct Graph {
    /// Package id -> name.
    names: BTreeMap<String, String>,
    /// Package id -> (dependency id, kinds: "normal", "dev", "build").
    deps: BTreeMap<String, Vec<(String, Vec<String>)>>,
    members: Vec<String>,
}

fn metadata() -> Graph {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata is JSON");
    let names = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_string(),
                p["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let deps = metadata["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| {
            let deps = node["deps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let kinds = d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|k| k["kind"].as_str().unwrap_or("normal").to_string())
                        .collect();
                    (d["pkg"].as_str().unwrap().to_string(), kinds)
                })
                .collect();
            (node["id"].as_str().unwrap().to_string(), deps)
        })
        .collect();
    let members = metadata["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    Graph {
        names,
        deps,
        members,
    }
}

impl Graph {
    fn id(&self, name: &str) -> &str {
        self.members
            .iter()
            .find(|id| self.names[*id] == name)
            .unwrap_or_else(|| panic!("{name} is a workspace member"))
    }

    /// Every crate `id` reaches through normal dependencies (what its code can use).
    fn reach(&self, id: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![id.to_string()];
        while let Some(next) = todo.pop() {
            for (dep, kinds) in self.deps.get(&next).into_iter().flatten() {
                if kinds.iter().any(|k| k == "normal") && seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        seen.into_iter().map(|id| self.names[&id].clone()).collect()
    }
}

#[test]
fn the_domain_core_reaches_no_runtime_transport_storage_sandbox_or_cluster_crate() {
    let graph = metadata();
    let reached = graph.reach(graph.id("toolgrid-core"));
    let found: Vec<&&str> = NOT_IN_CORE
        .iter()
        .filter(|name| reached.contains(**name))
        .collect();
    assert!(found.is_empty(), "toolgrid-core reaches {found:?}");
    // The check can fail: the control plane reaches every one of them.
    let control_plane = graph.reach(graph.id("toolgrid-control-plane"));
    assert!(NOT_IN_CORE.iter().all(|name| control_plane.contains(*name)));
}

#[test]
fn every_crate_depends_only_on_the_layers_below_it() {
    let graph = metadata();
    let allowed: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let members: BTreeSet<&str> = graph
        .members
        .iter()
        .map(|id| graph.names[id].as_str())
        .collect();
    assert_eq!(
        members,
        allowed.keys().copied().collect::<BTreeSet<_>>(),
        "every workspace crate has its place in the floor plan"
    );
    for id in &graph.members {
        let name = graph.names[id].as_str();
        for (dep, kinds) in &graph.deps[id] {
            let dep = graph.names[dep].as_str();
            if !members.contains(dep) {
                continue;
            }
            let tests_only = kinds.iter().all(|k| k == "dev");
            let ok = allowed[name].contains(&dep) || (dep == "toolgrid-testkit" && tests_only);
            assert!(
                ok,
                "{name} depends on {dep} ({kinds:?}), a layer it may not use"
            );
        }
    }
}
