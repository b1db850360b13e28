//! `toolgrid bench ha`: two control-plane replicas on one PostgreSQL store, the leader
//! killed with SIGKILL under load, again and again; the takeover time of each kill as
//! p50/p99, and a witness's check that every call finished exactly once.
//!
//! The run is `tests/helm/ha_bench.py` (it plays the Kubernetes API server with
//! `tests/helm/fakekube.py`, the Service with a TCP proxy to the ready replica, and the
//! witness), given this binary: run it from the repository.

use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct HaArgs {
    /// The PostgreSQL database both replicas share (a database of its own is best; the
    /// run's calls use idempotency keys of their own).
    #[arg(long, env = "TOOLGRID_BENCH_POSTGRES_URL")]
    postgres: String,
    /// SIGKILLs of the leader.
    #[arg(long, default_value_t = 20)]
    kills: u32,
    /// Clients calling in a loop meanwhile.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// The leader Lease's duration (`--leader-lease` of both replicas).
    #[arg(long, default_value = "3s")]
    leader_lease: String,
    /// `--leader-renew-deadline` of both replicas.
    #[arg(long, default_value = "2s")]
    leader_renew_deadline: String,
    /// `--leader-renew-every` of both replicas.
    #[arg(long, default_value = "500ms")]
    leader_renew_every: String,
    /// The script that runs it.
    #[arg(long, default_value = "tests/helm/ha_bench.py")]
    script: PathBuf,
}

pub fn run(args: HaArgs) -> anyhow::Result<()> {
    super::run_python_bench(
        &args.script,
        "ha",
        &[
            ("--postgres", args.postgres.clone()),
            ("--kills", args.kills.to_string()),
            ("--clients", args.clients.to_string()),
            ("--leader-lease", args.leader_lease.clone()),
            (
                "--leader-renew-deadline",
                args.leader_renew_deadline.clone(),
            ),
            ("--leader-renew-every", args.leader_renew_every.clone()),
        ],
    )
}
