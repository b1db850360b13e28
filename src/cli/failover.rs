//! `toolgrid bench failover`: SIGKILL the worker of a running call, again and again, and
//! measure how long the call takes to finish elsewhere beyond the tool's own work.

#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    /// Calls to fail over.
    #[arg(long, default_value_t = 20)]
    runs: usize,
}

pub async fn run(args: FailoverArgs) -> anyhow::Result<()> {
    anyhow::bail!("failover benchmark of {} runs: not built yet", args.runs)
}
