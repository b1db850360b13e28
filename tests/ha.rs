//! High availability: two control-plane replicas (`toolgrid controller`) on one PostgreSQL
//! database against the fake Kubernetes API server; the leader is killed with SIGKILL
//! twice while clients call; the standby takes over each time and every call finishes,
//! each step of each call reaching the witness under one idempotency key
//! (`toolgrid bench ha`, tests/helm/ha_bench.py, fails otherwise). Skips without
//! PostgreSQL or PyYAML, except under `CI=true`.

use crate::common;
use std::process::Command;

#[tokio::test]
async fn the_standby_takes_over_a_killed_leader_and_every_call_finishes_exactly_once() {
    let Some(url) = common::postgres::fresh_test_database().await else {
        return;
    };
    let Some(run) = common::run_python_check(
        Command::new(common::TOOLGRID)
            .args([
                "bench",
                "ha",
                "--kills",
                "2",
                "--clients",
                "3",
                "--postgres",
                &url,
            ])
            .current_dir(common::fixtures::repo())
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "info"),
    ) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "the HA run failed ({}):\n{stdout}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let takeover = stdout
        .lines()
        .find(|l| l.starts_with("takeover (SIGKILL to the standby ready)"))
        .unwrap_or_else(|| panic!("no takeover row in:\n{stdout}"));
    let figures: Vec<f64> = takeover
        .split_whitespace()
        .rev()
        .take(3)
        .map(|f| f.parse().expect("a figure"))
        .collect();
    // Not before the dead leader's Lease (3 s, renewed every 0.5 s when the API server
    // answers promptly) has lapsed, nor without end.
    assert!(
        figures.iter().all(|s| (1.0..60.0).contains(s)),
        "{takeover}"
    );
    assert!(
        stdout.contains("each under one key"),
        "the witness's line: {stdout}"
    );
}
