//! `toolgrid bench`: measurements against a real platform, next to a baseline measured in
//! the same run.

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// What to measure: `calls`.
    what: String,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("unknown benchmark {:?}", args.what)
}
