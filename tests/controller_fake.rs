//! `toolgrid controller` against a fake Kubernetes API server with real watches
//! (`tests/helm/controller_smoke.py`, on `tests/helm/fakekube.py`): the examples become
//! Ready, the pool's Deployment is made, a tool call runs on a worker, status goes only
//! through server-side apply to the status subresource, the ToolRelease finalizer holds and
//! lets go, invalid releases are refused, and SIGTERM gives the leader Lease up. When python3
//! or PyYAML is missing it skips with the reason, except under `CI=true`, where it fails
//! (`common::require`).

use crate::common;

use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn the_controller_reconciles_the_examples_against_a_fake_api_server() {
    let Some(run) = common::run_python_check(
        Command::new("python3")
            .arg(repo().join("tests/helm/controller_smoke.py"))
            .arg("--toolgrid")
            .arg(env!("CARGO_BIN_EXE_toolgrid"))
            .current_dir(repo())
            .env_remove("KUBECONFIG")
            // The controller takes this operator token, and the CLI calls with it.
            .env("TOOLGRID_ADMIN_TOKEN", "controller-smoke-admin")
            .env("TOOLGRID_TOKEN", "controller-smoke-admin"),
    ) else {
        return;
    };
    assert!(
        run.status.success(),
        "the controller smoke test failed ({}):\n{}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
}
