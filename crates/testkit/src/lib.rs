//! Test-only helpers shared by the workspace's test suites (a dev-dependency, never a
//! dependency): the rule for a prerequisite the machine may lack ([`require`], [`under_ci`])
//! and the test PostgreSQL server ([`postgres`]).

pub mod mcp_upstream;
pub mod postgres;

/// Whether CI runs these tests (`CI=true`, as CI services set it): then nothing may skip.
pub fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The one rule for a test that needs something the machine may lack: true when `present`.
/// When it is missing, under CI (`CI=true`) the test fails naming `what`; on a developer's
/// machine it prints why it skips and returns false (the caller returns). Only the real-cluster
/// test (`tests/k8s_e2e.rs`) skips without asking here.
#[track_caller]
pub fn require(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    if under_ci() {
        panic!("{what}: missing, and under CI=true a test must not skip (see .ci/run)");
    }
    eprintln!("skipping: {what} (under CI=true this is a failure)");
    false
}
