//! A worker told to stop (SIGTERM: a pod deleted, a rolling update, scale-in) drains: the
//! control plane offers it no new call, the calls it holds finish on it (none replayed) when
//! they fit its grace period, and those that do not are given up to another worker at the
//! grace period's end and finish there exactly once (the witness: each step's request under
//! one idempotency key; one in flight at the hand-over may arrive twice under it). Then it exits 0. `toolgrid drain WORKER` does the same on an
//! operator's word (an agent is refused `permission-denied`).

use crate::common;
use common::witness::{Seen, Witness};
use common::{Platform, WorkerProcess, fixtures, result_of};
use std::time::Duration;
use toolgrid_proto as proto;

const VIEWER: &str = "viewer-token";

fn manifests(root: &std::path::Path, witness: &Witness) -> std::path::PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("slow.yaml"),
        format!(
            "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\n\
             spec: {{replicas: 1, slotsPerWorker: 8}}\n---\n\
             apiVersion: v1\nkind: Secret\nmetadata: {{name: viewer-token}}\nstringData: {{token: {VIEWER}}}\n---\n\
             apiVersion: toolgrid.dev/v1alpha1\nkind: Agent\nmetadata: {{name: viewer}}\n\
             spec:\n  tokenSecretRef: {{name: viewer-token, key: token}}\n  permissions: [{{tools: [\"*\"]}}]\n---\n{}",
            fixtures::slow_manifest(witness.addr.port())
        ),
    )
    .unwrap();
    dir
}

/// Starts `slow run` with `steps` requests `sleep_ms` apart on a task.
async fn start(
    platform: &Platform,
    base: &str,
    run: &str,
    steps: u32,
    sleep_ms: u32,
) -> tokio::task::JoinHandle<proto::Call> {
    let mut client = platform.client().await;
    let request = proto::InvokeRequest {
        tool: "slow".into(),
        argv: [
            "run",
            "--base",
            base,
            "--run",
            run,
            "--steps",
            &steps.to_string(),
            "--sleep-ms",
            &sleep_ms.to_string(),
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    };
    tokio::spawn(async move { client.invoke(request).await.expect("invoke").into_inner() })
}

/// Starts a call of `runs` each (`steps` requests `sleep_ms` apart) and waits until every
/// one has reached the witness (up to 30 s): they are running.
async fn start_running(
    platform: &Platform,
    witness: &Witness,
    runs: &[String],
    steps: u32,
    sleep_ms: u32,
) -> Vec<tokio::task::JoinHandle<proto::Call>> {
    let base = witness.base();
    let mut calls = Vec::new();
    for run in runs {
        calls.push(start(platform, &base, run, steps, sleep_ms).await);
    }
    let started = |seen: &[Seen]| runs.iter().all(|r| !requests_of(seen, r).is_empty());
    assert!(
        witness.wait_for(Duration::from_secs(30), started).await,
        "{}",
        platform.logs()
    );
    calls
}

fn requests_of<'s>(seen: &'s [Seen], run: &str) -> Vec<&'s Seen> {
    seen.iter()
        .filter(|s| {
            s.query
                .as_deref()
                .is_some_and(|q| q.contains(&format!("run={run}&")))
        })
        .collect()
}

/// Each of `runs` made `steps` requests, each once.
fn each_request_once(witness: &Witness, runs: &[String], steps: usize) {
    let seen = witness.seen();
    for run in runs {
        let mut keys: Vec<&str> = requests_of(&seen, run)
            .iter()
            .filter_map(|s| s.key.as_deref())
            .collect();
        assert_eq!(keys.len(), steps, "{run}: {keys:?}");
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), steps, "{run}: a request was made twice");
    }
}

/// Each of `runs` made each of its `steps` requests under one key: a request in flight
/// when its call moved may be sent again by the replay, with the same `Idempotency-Key`
/// (the upstream applies it once), never under another.
fn each_step_under_one_key(witness: &Witness, runs: &[String], steps: usize) {
    let seen = witness.seen();
    for run in runs {
        let requests = requests_of(&seen, run);
        for step in 1..=steps {
            let mut keys: Vec<&str> = requests
                .iter()
                .filter(|s| {
                    s.query
                        .as_deref()
                        .is_some_and(|q| q.split('&').any(|p| p == format!("n={step}")))
                })
                .filter_map(|s| s.key.as_deref())
                .collect();
            assert!(!keys.is_empty(), "{run}: step {step} was never requested");
            keys.sort();
            keys.dedup();
            assert_eq!(
                keys.len(),
                1,
                "{run}: step {step} under several keys: {keys:?}"
            );
        }
    }
}

async fn exits_zero(worker: &mut WorkerProcess, within: Duration) {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = worker.exited() {
            assert!(status.success(), "{status:?}\n{}", worker.logs());
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the worker did not exit after draining\n{}",
            worker.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_finishes_what_fits_its_grace_and_gives_up_the_rest() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &dir, &["--no-workers", "--lease", "2s"]);
    let base = witness.base();
    let mut w1 = WorkerProcess::start(&platform, "w1", 8, root.path());
    platform.ready("tools", "slow").await;
    let warm = start(&platform, &base, "warm", 1, 0).await.await.unwrap();
    assert_eq!(warm.worker, "w1", "{warm:?}");

    // Six calls run on w1, the only worker, when it is told to stop; each fits its grace.
    let runs: Vec<String> = (0..6).map(|i| format!("fit{i}")).collect();
    let calls = start_running(&platform, &witness, &runs, 3, 700).await;
    let mut w2 = WorkerProcess::start(&platform, "w2", 8, root.path());
    w1.signal(libc::SIGTERM);
    // New calls go to the other worker, not to the one stopping.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = start(&platform, &base, "after", 1, 0).await.await.unwrap();
    assert_eq!(after.state, proto::CallState::Succeeded as i32, "{after:?}");
    assert_eq!(after.worker, "w2", "{after:?}\n{}", w1.logs());
    for (run, call) in runs.iter().zip(calls) {
        let call = call.await.unwrap();
        assert_eq!(
            call.state,
            proto::CallState::Succeeded as i32,
            "{run}: {call:?}\n{}",
            w1.logs()
        );
        assert_eq!(result_of(&call)["run"], run.as_str());
        // Finished where it ran: never replayed.
        assert_eq!((call.worker.as_str(), call.epoch), ("w1", 1), "{run}");
    }
    each_request_once(&witness, &runs, 3);
    exits_zero(&mut w1, Duration::from_secs(10)).await;

    // A worker whose grace period (1 s) is shorter than its calls: they are given up at
    // its end, move to w2 at once, and finish there, each request made once.
    let mut w3 =
        WorkerProcess::start_with(&platform, "w3", 8, root.path(), &["--drain-grace", "1s"]);
    // w2 stops too (it holds nothing: it exits at once), so w3 alone is offered them.
    w2.signal(libc::SIGTERM);
    exits_zero(&mut w2, Duration::from_secs(10)).await;
    let long: Vec<String> = (0..2).map(|i| format!("long{i}")).collect();
    let calls = start_running(&platform, &witness, &long, 4, 1000).await;
    let mut w4 = WorkerProcess::start(&platform, "w4", 8, root.path());
    w3.signal(libc::SIGTERM);
    for (run, call) in long.iter().zip(calls) {
        let call = call.await.unwrap();
        assert_eq!(
            call.state,
            proto::CallState::Succeeded as i32,
            "{run}: {call:?}\n{}",
            w3.logs()
        );
        assert_eq!(result_of(&call)["run"], run.as_str());
        assert_eq!(
            call.worker, "w4",
            "{run}: moved on at the grace period's end"
        );
        assert!(call.epoch >= 2, "{run}: {call:?}");
    }
    // A request in flight at the grace period's end may be sent again by the replay, under
    // its key; every other step is not repeated.
    each_step_under_one_key(&witness, &long, 4);
    exits_zero(&mut w3, Duration::from_secs(10)).await;

    // `toolgrid drain WORKER` does the same on an operator's word; an agent may not, and a
    // worker that is not attached is not found.
    let kind = |status: tonic::Status| {
        status
            .metadata()
            .get("toolgrid-error-kind")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let mut agent = platform.client_with(Some(VIEWER), None).await;
    let refused = agent
        .drain_worker(proto::DrainWorkerRequest {
            worker: "w4".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(kind(refused), "permission-denied");
    let mut operator = platform.client().await;
    let missing = operator
        .drain_worker(proto::DrainWorkerRequest {
            worker: "nobody".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(kind(missing), "not-found");
    let drained = platform.cli(&["drain", "w4"], None);
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    assert!(String::from_utf8_lossy(&drained.stdout).contains("worker w4 is draining"));
    exits_zero(&mut w4, Duration::from_secs(10)).await;
}

/// The local workers of `toolgrid up` are replaced one by one on SIGHUP, and again when
/// their pool's settings change, while calls run: every call that was running finishes on
/// the worker it ran on (never replayed), calls made meanwhile go to the others, none
/// fails, every request is made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_local_workers_under_load_fails_and_replays_nothing() {
    let root = tempfile::tempdir().unwrap();
    let witness = Witness::start().await;
    let dir = manifests(root.path(), &witness);
    let file = dir.join("slow.yaml");
    let two = |slots: u32| {
        let text = std::fs::read_to_string(&file).unwrap();
        let pool = text
            .lines()
            .find(|l| l.starts_with("spec: {replicas:"))
            .unwrap()
            .to_string();
        std::fs::write(
            &file,
            text.replacen(
                &pool,
                &format!("spec: {{replicas: 2, slotsPerWorker: {slots}}}"),
                1,
            ),
        )
        .unwrap();
    };
    two(8);
    let platform = Platform::start(root.path(), &dir, &[]);
    let base = witness.base();
    platform.ready("tools", "slow").await;
    let warm = start(&platform, &base, "warm", 1, 0).await.await.unwrap();
    assert_eq!(warm.state, proto::CallState::Succeeded as i32, "{warm:?}");

    let mut replaced = 0;
    for (round, change) in ["sighup", "slots"].iter().enumerate() {
        // Calls that run when the roll starts, each fitting the grace period.
        let runs: Vec<String> = (0..6).map(|i| format!("{change}{i}")).collect();
        let calls = start_running(&platform, &witness, &runs, 3, 800).await;
        match *change {
            // SAFETY: a signal to the platform process this test started.
            "sighup" => unsafe {
                libc::kill(platform.pid() as i32, libc::SIGHUP);
            },
            _ => two(6),
        }
        // Calls made while the workers are replaced.
        let during: Vec<String> = (0..12).map(|i| format!("{change}-during{i}")).collect();
        let mut during_calls = Vec::new();
        for run in &during {
            during_calls.push(start(&platform, &base, run, 1, 0).await);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        for (run, call) in runs.iter().zip(calls) {
            let call = call.await.unwrap();
            assert_eq!(
                call.state,
                proto::CallState::Succeeded as i32,
                "{run}: {call:?}\n{}",
                platform.logs()
            );
            // Finished where it ran: never moved, never replayed.
            assert_eq!(call.epoch, 1, "{run}: {call:?}");
        }
        for (run, call) in during.iter().zip(during_calls) {
            let call = call.await.unwrap();
            assert_eq!(
                call.state,
                proto::CallState::Succeeded as i32,
                "{run}: {call:?}\n{}",
                platform.logs()
            );
        }
        each_request_once(&witness, &runs, 3);
        each_request_once(&witness, &during, 1);
        // Both workers were replaced, and each old one left by draining.
        replaced += 2;
        platform
            .eventually(
                &format!("round {round}: both workers replaced and gone"),
                Duration::from_secs(60),
                || async {
                    let logs = platform.logs();
                    logs.matches("worker replaced; the old one drains").count() >= replaced
                        && logs.matches("worker left").count() >= replaced
                },
            )
            .await;
    }
    let logs = platform.logs();
    assert!(!logs.contains("killing it"), "a worker was killed:\n{logs}");
    assert!(!logs.contains("restarting in"), "a worker died:\n{logs}");
}
