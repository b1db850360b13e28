//! Canary rollouts under steady load (docs/rollout.md). An agent calls `greet` through a
//! binding all along, and no call fails while the binding takes a canary at 10%, is
//! promoted by hand to 50% and 100%: the split each time is within a few percent of the
//! weight, a call tried again with its key keeps its release. Then a canary that fails 30%
//! of its calls is rolled back on its own (weight 0, `Degraded=True` with the figures),
//! the stable release keeps serving, and an order to the ended rollout is `rollout-ended`;
//! an agent may not look at rollouts (`permission-denied`). Last, a healthy canary steps
//! on and is promoted on its own, each step judged on its calls.

use crate::common;
use common::Platform;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use toolgrid_proto as proto;

const TOKEN: &str = "greeter-token";
const BATCH: usize = 300;

/// A WASI command that prints `{"ok":true}`; with `fail_low`, it exits 1 instead when its
/// last argument ends in 0, 1 or 2 (three calls in ten).
fn greet_wasm(fail_low: bool) -> Vec<u8> {
    let check = if fail_low {
        "(if (i32.lt_u (local.get $c) (i32.const 51)) (then (call $proc_exit (i32.const 1))))"
    } else {
        ""
    };
    wat::parse_str(format!(
        r#"(module
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "{{\"ok\":true}}")
  (func (export "_start")
    (local $c i32)
    (drop (call $args_sizes_get (i32.const 0) (i32.const 4)))
    (if (i32.gt_u (i32.load (i32.const 4)) (i32.const 16384)) (then (call $proc_exit (i32.const 2))))
    (drop (call $args_get (i32.const 1024) (i32.const 4096)))
    ;; the last argument's last character (the buffer ends in its NUL)
    (local.set $c (i32.load8_u (i32.sub (i32.add (i32.const 4096) (i32.load (i32.const 4))) (i32.const 2))))
    {check}
    (i32.store (i32.const 64) (i32.const 16))
    (i32.store (i32.const 68) (i32.const 11))
    (drop (call $fd_write (i32.const 1) (i32.const 64) (i32.const 1) (i32.const 72))))
)"#
    ))
    .expect("the greet module")
}

fn write_manifests(dir: &Path, rollout: &str) {
    std::fs::write(
        dir.join("binding.yaml"),
        format!(
            "apiVersion: toolgrid.dev/v1alpha1\nkind: ToolBinding\nmetadata: {{name: greeters}}\n\
             spec:\n  agents: [greeter]\n  tool: greet\n  release: {{name: greet-1.0.0}}\n{rollout}"
        ),
    )
    .unwrap();
}

fn base_manifests(dir: &Path) {
    for (name, fail) in [
        ("greet-1.0.0", false),
        ("greet-1.1.0", false),
        ("greet-1.2.0", true),
    ] {
        std::fs::write(dir.join(format!("{name}.wasm")), greet_wasm(fail)).unwrap();
    }
    let mut text = format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\n\
         spec: {{replicas: 2, slotsPerWorker: 16}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: greeter-token}}\nstringData: {{token: {TOKEN}}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: greeter}}\n\
         spec:\n  tokenSecretRef: {{name: greeter-token, key: token}}\n  permissions: [{{tools: [greet]}}]\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {{name: greet}}\n\
         spec:\n  effect: read\n  repeatWindow: 0s\n  commands:\n    - name: run\n      \
         options:\n        - {{name: n, schema: {{type: string}}, required: true}}\n      \
         result: {{type: object}}\n"
    );
    for version in ["1.0.0", "1.1.0", "1.2.0"] {
        text.push_str(&format!(
            "---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: greet-{version}}}\n\
             spec: {{tool: greet, version: {version}, artifact: {{file: greet-{version}.wasm}}}}\n"
        ));
    }
    std::fs::write(dir.join("greet.yaml"), text).unwrap();
}

async fn greet(platform: &Platform, key: &str, n: usize) -> Result<proto::Call, String> {
    let mut client = platform.client_with(Some(TOKEN), None).await;
    client
        .invoke(proto::InvokeRequest {
            tool: "greet".into(),
            argv: vec!["run".into(), "--n".into(), n.to_string()],
            idempotency_key: key.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
        .map_err(|s| format!("{s:?}"))
}

/// Calls `count` times with keys `prefix-i`, 16 at a time: how many ran each release.
async fn batch(platform: &Platform, prefix: &str, count: usize) -> BTreeMap<String, usize> {
    let mut by_release = BTreeMap::new();
    for chunk in (0..count).collect::<Vec<_>>().chunks(16) {
        let calls = chunk.iter().map(|&i| {
            let key = format!("{prefix}-{i}");
            async move { greet(platform, &key, 5).await }
        });
        for call in futures::future::join_all(calls).await {
            let call = call.expect("the call is answered");
            assert_eq!(
                call.state,
                proto::CallState::Succeeded as i32,
                "call {} on {} failed: {:?}",
                call.id,
                call.release,
                call.error
            );
            *by_release.entry(call.release).or_insert(0) += 1;
        }
    }
    by_release
}

/// The canary's share of a batch, in percent.
fn share(by_release: &BTreeMap<String, usize>, canary: &str) -> f64 {
    let total: usize = by_release.values().sum();
    *by_release.get(canary).unwrap_or(&0) as f64 * 100.0 / total as f64
}

async fn rollout_json(platform: &Platform, args: &[&str]) -> (i32, serde_json::Value, String) {
    let mut all = vec!["rollout"];
    all.extend_from_slice(args);
    let output = platform.cli(&all, None);
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let json = serde_json::from_str(&stdout).unwrap_or(serde_json::Value::Null);
    (output.status.code().unwrap_or(-1), json, stderr)
}

async fn binding_status(platform: &Platform) -> serde_json::Value {
    let row = platform
        .resource("bindings", "greeters")
        .await
        .expect("the binding");
    serde_json::from_str(&row.status_json).expect("status JSON")
}

/// `toolgrid rollout promote greet`: the canary at `weight` at once, and in the binding's
/// status soon after.
async fn promote_to(platform: &Platform, weight: u64) {
    let (code, json, stderr) = rollout_json(platform, &["promote", "greet", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json[0]["weight"], weight, "{json}");
    platform
        .eventually(
            &format!("the canary at {weight}%"),
            Duration::from_secs(30),
            || async { binding_status(platform).await["rollout"]["weight"] == weight },
        )
        .await;
}

/// The binding's `Degraded` condition.
fn degraded(status: &serde_json::Value) -> serde_json::Value {
    status["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Degraded"))
        .cloned()
        .unwrap_or_else(|| panic!("no Degraded condition in {status}"))
}

/// Calls all along, with new keys, until told to stop: how many, and every failure.
struct Load {
    stop: Arc<AtomicBool>,
    made: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Load {
    fn start(platform: Arc<Platform>, prefix: &'static str, n: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let made = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn({
            let (stop, made) = (stop.clone(), made.clone());
            async move {
                let mut failures = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let calls = (0..4).map(|j| {
                        let key = format!("{prefix}-{i}-{j}");
                        let platform = platform.clone();
                        async move { greet(&platform, &key, n).await }
                    });
                    for call in futures::future::join_all(calls).await {
                        made.fetch_add(1, Ordering::Relaxed);
                        match call {
                            Ok(call) if call.state == proto::CallState::Succeeded as i32 => {}
                            Ok(call) => failures
                                .push(format!("{} on {}: {:?}", call.id, call.release, call.error)),
                            Err(status) => failures.push(status),
                        }
                    }
                    i += 1;
                }
                failures
            }
        });
        Load { stop, made, task }
    }

    async fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let failures = self.task.await.expect("the load task");
        (self.made.load(Ordering::Relaxed), failures)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_takes_its_weight_steps_on_and_a_failing_one_is_rolled_back() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    base_manifests(&dir);
    write_manifests(&dir, "");
    let mut platform = Arc::new(Platform::start(root.path(), &dir, &[]));
    platform.ready("bindings", "greeters").await;

    // Steady load from here to the end of the manual rollout.
    let load = Load::start(platform.clone(), "load", 7);

    // Weight 0: no rollout, every call on the stable release.
    let before = batch(&platform, "zero", 64).await;
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        ["greet-1.0.0"],
        "{before:?}"
    );

    // 10%.
    write_manifests(
        &dir,
        "  rollout: {canary: greet-1.1.0, steps: [10, 50, 100], interval: 1h}\n",
    );
    platform
        .eventually("the canary at 10%", Duration::from_secs(30), || async {
            binding_status(&platform).await["rollout"]["weight"] == 10
        })
        .await;
    let ten = batch(&platform, "ten", BATCH).await;
    let observed = share(&ten, "greet-1.1.0");
    eprintln!("at 10%: {ten:?}");
    assert!((observed - 10.0).abs() <= 5.0, "at 10%: {ten:?}");
    // A call tried again with its key keeps its release.
    let first = greet(&platform, "ten-7", 5).await.unwrap();
    let again = greet(&platform, "ten-7", 5).await.unwrap();
    assert_eq!(
        (first.id.clone(), first.release.clone()),
        (again.id, again.release)
    );

    // An operator steps it to 50%.
    promote_to(&platform, 50).await;
    let half = batch(&platform, "half", BATCH).await;
    let observed = share(&half, "greet-1.1.0");
    eprintln!("at 50%: {half:?}");
    assert!((observed - 50.0).abs() <= 6.0, "at 50%: {half:?}");

    // ... and to 100%.
    promote_to(&platform, 100).await;
    let all = batch(&platform, "all", 64).await;
    assert_eq!(all.keys().collect::<Vec<_>>(), ["greet-1.1.0"], "{all:?}");

    let (made, failures) = load.stop().await;
    assert!(made > 0, "the load made calls");
    assert!(
        failures.is_empty(),
        "calls failed during the rollout: {failures:?}"
    );

    // An agent may not look at rollouts.
    let mut agent = platform.client_with(Some(TOKEN), None).await;
    let refused = agent
        .rollout(proto::RolloutRequest {
            tool: "greet".into(),
            ..Default::default()
        })
        .await
        .expect_err("an agent is refused");
    assert_eq!(
        refused
            .metadata()
            .get("toolgrid-error-kind")
            .and_then(|v| v.to_str().ok()),
        Some("permission-denied")
    );
    // An action the API does not know is named, not guessed.
    let mut admin = platform.client().await;
    let unknown = admin
        .rollout(proto::RolloutRequest {
            tool: "greet".into(),
            action: 99,
            ..Default::default()
        })
        .await
        .expect_err("an unknown action is refused");
    assert_eq!(
        unknown
            .metadata()
            .get("toolgrid-error-kind")
            .and_then(|v| v.to_str().ok()),
        Some("invalid-argument")
    );

    // A canary that fails 30% of its calls: rolled back on its own, quickly, under load
    // whose last digit spreads over 0-9.
    write_manifests(
        &dir,
        "  rollout: {canary: greet-1.2.0, steps: [50, 100], interval: 1h, minCalls: 20, maxErrorRateIncrease: 10}\n",
    );
    platform
        .eventually("the bad canary at 50%", Duration::from_secs(30), || async {
            let status = binding_status(&platform).await;
            status["rollout"]["canary"] == "greet-1.2.0" && status["rollout"]["weight"] == 50
        })
        .await;
    let stop = Arc::new(AtomicBool::new(false));
    let spread = tokio::spawn({
        let (platform, stop) = (platform.clone(), stop.clone());
        async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) && i < 2_000 {
                let _ = greet(&platform, &format!("spread-{i}"), i).await;
                i += 1;
            }
        }
    });
    platform
        .eventually(
            "the bad canary rolled back",
            Duration::from_secs(60),
            || async { binding_status(&platform).await["rollout"]["phase"] == "Aborted" },
        )
        .await;
    stop.store(true, Ordering::Relaxed);
    spread.await.unwrap();
    let status = binding_status(&platform).await;
    eprintln!("rolled back: {}", status["rollout"]);
    assert_eq!(status["rollout"]["weight"], 0, "{status}");
    let condition = degraded(&status);
    assert_eq!(condition["status"], "True", "{condition}");
    assert_eq!(condition["reason"], "CanaryRolledBack");
    assert!(
        condition["message"].as_str().unwrap().contains("errors in"),
        "the figures: {condition}"
    );
    assert!(
        status["rollout"]["canaryErrors"].as_u64().unwrap() > 0,
        "{status}"
    );
    // The stable release serves every new call.
    let after = batch(&platform, "after", 64).await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        ["greet-1.0.0"],
        "{after:?}"
    );
    // ... from the first call after a restart of the control plane (the rollback is
    // read from the store before the catalog first resolves).
    Arc::get_mut(&mut platform)
        .expect("no load holds the platform")
        .restart(libc::SIGKILL);
    let restarted = batch(&platform, "restarted", 64).await;
    assert_eq!(
        restarted.keys().collect::<Vec<_>>(),
        ["greet-1.0.0"],
        "{restarted:?}"
    );
    assert_eq!(
        binding_status(&platform).await["rollout"]["phase"],
        "Aborted"
    );
    // An order to a rollout that has ended.
    let (code, _, stderr) = rollout_json(&platform, &["promote", "greet"]).await;
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("rollout-ended"), "{stderr}");
    let (code, json, stderr) = rollout_json(&platform, &["status", "greet", "-o", "json"]).await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(json[0]["phase"], "Aborted", "{json}");
    // A tool with no rollout.
    let (code, _, stderr) = rollout_json(&platform, &["status", "nothing"]).await;
    assert_eq!(code, 4, "{stderr}");
    assert!(stderr.contains("not-found"), "{stderr}");

    // A healthy canary steps on and is promoted on its own, each step judged on its calls.
    write_manifests(
        &dir,
        "  rollout: {canary: greet-1.1.0, steps: [50, 100], interval: 1s, minCalls: 5}\n",
    );
    let load = Load::start(platform.clone(), "auto", 3);
    platform
        .eventually(
            "the canary promoted on its own",
            Duration::from_secs(60),
            || async {
                let status = binding_status(&platform).await;
                status["rollout"]["canary"] == "greet-1.1.0"
                    && status["rollout"]["phase"] == "Promoted"
            },
        )
        .await;
    let (made, failures) = load.stop().await;
    assert!(made > 0 && failures.is_empty(), "{failures:?}");
    let status = binding_status(&platform).await;
    assert!(
        status["rollout"]["message"]
            .as_str()
            .unwrap()
            .starts_with("promoted: the canary had 0 errors"),
        "{status}"
    );
    let condition = degraded(&status);
    assert_eq!(condition["status"], "False", "{condition}");
    let promoted = batch(&platform, "promoted", 32).await;
    assert_eq!(
        promoted.keys().collect::<Vec<_>>(),
        ["greet-1.1.0"],
        "{promoted:?}"
    );
}
