//! `toolgrid bench calls --stages` against a platform it starts: every stage of the
//! sequential run's calls is counted once per call, the CPU time per call is told by
//! thread, and the guard (`--max-fsyncs`) fails the run, naming its figures, when the
//! sequential p50 is over its bar; `bench waiting` drains queued calls in order.

use crate::common;
use std::process::Command;

fn bench(extra: &[&str]) -> std::process::Output {
    Command::new(common::TOOLGRID)
        .args([
            "bench",
            "calls",
            "--calls",
            "60",
            "--concurrency",
            "2",
            "--stages",
        ])
        .args(extra)
        .current_dir(common::fixtures::repo())
        .env("RUST_LOG", "error")
        .output()
        .expect("toolgrid bench")
}

#[test]
fn the_stage_breakdown_counts_each_call_once_per_stage_and_the_guard_fails_named() {
    let output = bench(&[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for stage in [
        "authenticate",
        "admit",
        "store_commit",
        "store_sync",
        "dispatch",
        "worker_run",
        "worker_overhead",
        "completion",
        "reply",
    ] {
        let row = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{stage} ")))
            .unwrap_or_else(|| panic!("no {stage} row in:\n{stdout}"));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cells.last(),
            Some(&"60"),
            "{stage}: each sequential call once: {row}"
        );
        let p50: f64 = cells[1].parse().expect("a p50");
        let p99: f64 = cells[2].parse().expect("a p99");
        assert!(p50 > 0.0 && p99 >= p50, "{row}");
    }
    assert!(
        stdout.contains(
            "the stages' p50s but store_sync's (beside the dispatch and the run) add up to"
        ),
        "{stdout}"
    );
    // The CPU time per call by thread: the control plane's store writer, the workers'
    // sandboxes.
    let line = |start: &str| {
        stdout
            .lines()
            .find(|l| l.trim_start().starts_with(start))
            .unwrap_or_else(|| panic!("no {start} line in:\n{stdout}"))
            .to_string()
    };
    assert!(
        line("control plane:").contains(" store-writer "),
        "{stdout}"
    );
    assert!(line("workers:").contains(" guest "), "{stdout}");
    // Beside it, what the bench's own clients took of the cores: some CPU, per call.
    let own = line("the bench's own clients:");
    let own_ms: f64 = own
        .split_whitespace()
        .nth(4)
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no ms per call in {own:?}"));
    assert!(own_ms > 0.0, "{own}");

    // A bar no platform meets (the in-process run alone): the guard fails, with the figures.
    let output = bench(&["--max-fsyncs", "0"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("is over the guard's") && stderr.contains("fdatasync p50s"),
        "{stderr}"
    );
}

/// `toolgrid bench catalog`: each change of one tool's release becomes callable (the bench
/// fails otherwise), timed in a catalog of many and of one, with the control plane's RSS.
#[test]
fn the_catalog_bench_applies_each_change_and_reports_rss() {
    let output = Command::new(common::TOOLGRID)
        .args(["bench", "catalog", "--tools", "30", "--changes", "3"])
        .current_dir(common::fixtures::repo())
        .env("RUST_LOG", "error")
        .output()
        .expect("toolgrid bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for row in [
        "apply to callable, 30 tools",
        "baseline: apply to callable, 1 tool",
        "control plane RSS after the changes:",
        "idle memory (ready, nothing called) in MiB, RSS / private / PSS:",
    ] {
        assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    }
    // Each process's figures are read from /proc: private memory is part of the RSS. The
    // `toolgrid-worker` built beside this binary attached as a pod's worker would.
    for label in [
        "  control plane, 1 tool",
        "  worker 0",
        "  toolgrid-worker, as a pod runs it",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} row in:\n{stdout}"));
        let figures: Vec<f64> = line[label.len()..]
            .split('(')
            .next()
            .unwrap()
            .split('/')
            .map(|f| f.trim().parse().expect("a figure"))
            .collect();
        assert_eq!(figures.len(), 3, "{line}");
        let (rss, private, pss) = (figures[0], figures[1], figures[2]);
        assert!(private > 0.0 && private < rss && pss <= rss, "{line}");
    }
}

/// `toolgrid bench catalog --source cluster`: Tools and ToolReleases on the fake Kubernetes
/// API server, served by `toolgrid controller`; each new ToolRelease of one tool becomes
/// what a call of it runs (the script fails otherwise), in a catalog of many and of one.
/// Skips without PyYAML, except under `CI=true`.
#[test]
fn the_cluster_catalog_bench_applies_each_new_release() {
    let Some(run) = common::run_python_check(
        Command::new(common::TOOLGRID)
            .args([
                "bench",
                "catalog",
                "--source",
                "cluster",
                "--tools",
                "30",
                "--changes",
                "3",
            ])
            .current_dir(common::fixtures::repo())
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "error"),
    ) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for row in [
        "changes of one tool's release in the cluster",
        "apply to callable, 30 tools",
        "baseline: apply to callable, 1 tool",
        "controller RSS after the changes:",
    ] {
        assert!(stdout.contains(row), "no {row:?} in:\n{stdout}");
    }
    // A change of one tool reconciles the few objects whose state it moved, not the
    // catalog's 60 Tools and ToolReleases (each snapshot reconciled all of them once).
    let reconciled: f64 = stdout
        .lines()
        .find_map(|l| l.split("objects reconciled: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no objects reconciled in:\n{stdout}"));
    assert!(
        (1.0..=10.0).contains(&reconciled),
        "{reconciled} objects reconciled per change:\n{stdout}"
    );
}

/// `toolgrid bench catalog` refuses an empty catalog or no changes, naming both flags.
#[test]
fn the_catalog_bench_refuses_nothing_to_measure() {
    let output = Command::new(common::TOOLGRID)
        .args(["bench", "catalog", "--tools", "0"])
        .output()
        .expect("toolgrid bench");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--tools and --changes must be at least 1"),
        "{stderr}"
    );
}

/// `toolgrid bench waiting`: calls queued behind a busy slot hold no slot (the pool shows
/// one busy, all the rest queued), and once the slot frees they all run, each once, in
/// admission order (the bench exits 1 otherwise, naming the first out of place).
#[test]
fn calls_waiting_for_a_busy_pool_hold_no_slot_and_drain_once_each_in_order() {
    let output = Command::new(common::TOOLGRID)
        .args(["bench", "waiting", "--calls", "150"])
        .current_dir(common::fixtures::repo())
        .env("RUST_LOG", "error")
        .output()
        .expect("toolgrid bench waiting");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let row = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} row in:\n{stdout}"))
            .to_string()
    };
    assert!(row("worker slots busy while they wait").contains("Queued=150"));
    assert!(row("drain through the one slot").contains("in admission order, each once"));
    let waiting = row("control plane RSS, 150 calls waiting");
    assert!(waiting.contains("KiB per waiting call"), "{waiting}");
}
