//! `toolgrid bench catalog`: a manifest directory of N tools and releases; the time from
//! one tool's manifest changing to the change being callable (a call of the tool runs its
//! new release), p50/p99 over repeated changes, and the control plane's RSS; next to
//! the same with a catalog of one tool, measured in the same run.
//!
//! With `--source cluster` the catalog is N Tools and ToolReleases in a cluster, served by
//! `toolgrid controller`, and a change is a new ToolRelease: the run is
//! `tests/helm/catalog_bench.py` (it plays the Kubernetes API server with
//! `tests/helm/fakekube.py`), given this binary: run it from the repository.

use super::{Started, start_platform};
use crate::cli::sample::Sample;
use anyhow::Context;
use std::path::Path;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct CatalogArgs {
    /// Tools (each with one release) in the large catalog.
    #[arg(long, default_value_t = 1000)]
    tools: usize,
    /// Changes of one tool's release to time, one after another.
    #[arg(long, default_value_t = 20)]
    changes: usize,
    /// The artifact every release runs (a manifest directory's; the cluster's releases run
    /// examples/tools/semver/semver.wasm from a ConfigMap).
    #[arg(long, default_value = "examples/tools/semver/semver.wasm")]
    wasm: std::path::PathBuf,
    /// Where the catalog comes from: a manifest directory (`toolgrid up`) or the cluster
    /// (`toolgrid controller`, Tools and ToolReleases on a fake API server).
    #[arg(long, value_enum, default_value_t = Source::Directory)]
    source: Source,
    /// The script that runs `--source cluster`.
    #[arg(long, default_value = "tests/helm/catalog_bench.py")]
    script: std::path::PathBuf,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Directory,
    Cluster,
}

/// `--source cluster`: the script runs both catalogs and prints the table.
fn run_cluster(args: &CatalogArgs) -> anyhow::Result<()> {
    super::run_python_bench(
        &args.script,
        "catalog --source cluster",
        &[
            ("--tools", args.tools.to_string()),
            ("--changes", args.changes.to_string()),
        ],
    )
}

fn tool_manifest(name: &str, version: &str, wasm: &Path) -> String {
    format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {{name: {name}}}\n\
         spec:\n  effect: read\n  commands:\n    - name: compare\n      positional:\n        \
         - {{name: a, schema: {{type: string}}}}\n        - {{name: b, schema: {{type: string}}}}\n      \
         result: {{type: object}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: {name}-{version}}}\n\
         spec: {{tool: {name}, version: \"{version}\", artifact: {{file: {}}}}}\n",
        wasm.display()
    )
}

/// A manifest directory with `tools` tools and a pool.
fn lay_out(dir: &Path, tools: usize, wasm: &Path) -> anyhow::Result<()> {
    std::fs::write(
        dir.join("pool.yaml"),
        "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\n\
         spec: {replicas: 1, slotsPerWorker: 4}\n",
    )?;
    for i in 0..tools {
        let name = format!("t{i:04}");
        std::fs::write(
            dir.join(format!("{name}.yaml")),
            tool_manifest(&name, "1.0.0", wasm),
        )?;
    }
    Ok(())
}

/// Resident memory of a process, from /proc (Linux), in MiB.
pub(super) fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib / 1024.0)
}

/// The resident memory of a process once it has settled, in MiB: read every
/// [`SETTLE_EVERY`] until [`SETTLE_READINGS`] readings in a row lie within [`SETTLE_MIB`] of
/// one another, for at most [`SETTLE_WITHIN`] (then the last reading, and a line on stderr
/// that says so). A control plane just started holds its built-in runtimes' files for a
/// moment (with the Python runtime's 158 MB it held 466 MiB for about a second before its
/// RSS fell to 55–61), and what a burst freed goes back to the system only after the
/// allocator's purge delay: a reading taken then is not the process at rest.
pub(super) async fn settled_rss_mib(pid: u32) -> Option<f64> {
    let give_up = Instant::now() + SETTLE_WITHIN;
    let mut readings = Vec::new();
    loop {
        readings.push(rss_mib(pid)?);
        if settled(&readings) {
            return readings.last().copied();
        }
        if Instant::now() >= give_up {
            eprintln!(
                "bench: the memory of process {pid} did not settle within {}s (last readings {:?} MiB); the last is used",
                SETTLE_WITHIN.as_secs(),
                &readings[readings.len().saturating_sub(SETTLE_READINGS)..]
            );
            return readings.last().copied();
        }
        tokio::time::sleep(SETTLE_EVERY).await;
    }
}

/// How often [`settled_rss_mib`] reads.
const SETTLE_EVERY: Duration = Duration::from_millis(250);
/// Readings in a row that must agree: three seconds' worth, longer than the allocator takes
/// to give freed memory back (its purge delay of a second, then the purge thread's tick; a
/// start's peak stood for about a second before it went).
const SETTLE_READINGS: usize = 13;
/// How far they may lie apart.
const SETTLE_MIB: f64 = 1.0;
/// The longest [`settled_rss_mib`] waits.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);

/// Whether the last [`SETTLE_READINGS`] of `readings` lie within [`SETTLE_MIB`].
fn settled(readings: &[f64]) -> bool {
    if readings.len() < SETTLE_READINGS {
        return false;
    }
    let last = &readings[readings.len() - SETTLE_READINGS..];
    let (low, high) = last.iter().fold((f64::MAX, f64::MIN), |(low, high), r| {
        (low.min(*r), high.max(*r))
    });
    high - low <= SETTLE_MIB
}

/// A process's memory, in MiB: resident (RSS, which counts the pages of the toolgrid
/// binary it has run: shared with every toolgrid process on the machine), private
/// (anonymous: its own heap and stacks) and proportional (PSS: private plus its share of
/// the shared pages).
#[derive(Clone, Copy, Debug)]
pub(super) struct Memory {
    pub rss: f64,
    pub private: f64,
    pub pss: f64,
}

impl Memory {
    /// From /proc (Linux).
    pub(super) fn of(pid: u32) -> Option<Memory> {
        let kib = |text: &str, key: &str| -> Option<f64> {
            text.lines()
                .find_map(|l| l.strip_prefix(key))?
                .split_whitespace()
                .next()?
                .parse::<f64>()
                .ok()
                .map(|k| k / 1024.0)
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
        Some(Memory {
            rss: kib(&status, "VmRSS:")?,
            private: kib(&status, "RssAnon:")?,
            pss: kib(&rollup, "Pss:")?,
        })
    }

    fn cells(&self) -> String {
        format!("{:.1} / {:.1} / {:.1}", self.rss, self.private, self.pss)
    }
}

/// The release a call of tool `name` runs on now (None: the call failed). Calling the
/// tool is what "callable" means; listing every tool to find it would cost the control
/// plane more than the reload being timed, the more tools the more.
async fn release_of(client: &mut super::super::client::Client, name: &str) -> Option<String> {
    let call = client
        .invoke(toolgrid_proto::InvokeRequest {
            tool: name.into(),
            argv: vec!["compare".into(), "1.0.0".into(), "2.0.0".into()],
            ..Default::default()
        })
        .await
        .ok()?
        .into_inner();
    Some(call.release)
}

struct Measured {
    apply: Sample,
    rss_mib: Option<f64>,
    /// Once ready, before any call or change: the control plane's memory and its workers'.
    idle: Option<Memory>,
    idle_workers: Vec<Memory>,
    /// An idle `toolgrid-worker` attached beside them (None: not built beside this binary).
    idle_worker_alone: Option<Memory>,
    ready: Duration,
}

/// The binary a WorkerPool's pods run, when it was built beside this one (`cargo build
/// --release` builds both; `cargo run` only `toolgrid`).
fn worker_binary() -> Option<std::path::PathBuf> {
    let binary = std::env::current_exe()
        .ok()?
        .with_file_name(toolgrid_controller::deployment::WORKER_COMMAND);
    binary.is_file().then_some(binary)
}

/// The workers attached to the default pool, as the control plane counts them.
async fn attached(client: &mut super::super::client::Client) -> anyhow::Result<u64> {
    let rows = super::resource_rows(client, "pools").await?;
    let row = rows
        .iter()
        .find(|r| r.name == "default")
        .context("no pool")?;
    Ok(super::column(row, "Attached")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

/// A `toolgrid-worker` attached to `started` as a pod's worker would be, at rest (once
/// attached, its memory settled): what a worker pod holds, where no control plane shares
/// its binary's pages.
async fn idle_worker_alone(started: &Started, binary: &Path) -> anyhow::Result<Memory> {
    let mut client = started.client().await?;
    let before = attached(&mut client).await?;
    let cache = tempfile::tempdir()?;
    let mut child = std::process::Command::new(binary)
        .arg("--control-plane")
        .arg(format!("http://{}", started.grpc))
        .arg("--id")
        .arg("bench-worker-alone")
        .arg("--pool")
        .arg("default")
        .arg("--cache")
        .arg(cache.path())
        .arg("--join-token-file")
        .arg(started.data.path().join("join-token"))
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    let pid = child.id();
    let give_up = Instant::now() + Duration::from_secs(30);
    let memory = loop {
        match attached(&mut client).await {
            Ok(now) if now > before => {
                settled_rss_mib(pid).await;
                break Memory::of(pid).context("cannot read its memory");
            }
            Ok(_) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Ok(_) => {
                break Err(anyhow::anyhow!(
                    "{} did not attach within 30 s",
                    binary.display()
                ));
            }
            Err(error) => break Err(error),
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    memory
}

async fn measure(tools: usize, changes: usize, wasm: &Path) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir()?;
    lay_out(dir.path(), tools, wasm)?;
    let start = Instant::now();
    let started: Started = start_platform(dir.path())?;
    let ready = start.elapsed();
    let mut client = started.client().await?;
    // Idle: ready, its workers attached, nothing called yet, its start's memory given back
    // (settling takes three seconds at least).
    settled_rss_mib(started.child.id()).await;
    let idle = Memory::of(started.child.id());
    let idle_workers: Vec<Memory> = super::cpu::children(started.child.id())
        .into_iter()
        .filter_map(Memory::of)
        .collect();
    let idle_worker_alone = match worker_binary() {
        Some(binary) if tools == 1 => Some(idle_worker_alone(&started, &binary).await?),
        _ => None,
    };
    let target = format!("t{:04}", tools / 2);
    anyhow::ensure!(
        release_of(&mut client, &target).await.as_deref() == Some(&format!("{target}-1.0.0")),
        "tool {target} is not callable after start"
    );
    let mut latencies = Vec::with_capacity(changes);
    let wall = Instant::now();
    for change in 1..=changes {
        let version = format!("1.0.{change}");
        let wanted = format!("{target}-{version}");
        let written = Instant::now();
        std::fs::write(
            dir.path().join(format!("{target}.yaml")),
            tool_manifest(&target, &version, wasm),
        )?;
        loop {
            if release_of(&mut client, &target).await.as_deref() == Some(wanted.as_str()) {
                break;
            }
            anyhow::ensure!(
                written.elapsed() < Duration::from_secs(120),
                "the change to {wanted} was not applied within 120 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        latencies.push(written.elapsed());
    }
    let rss_mib = rss_mib(started.child.id());
    Ok(Measured {
        apply: Sample {
            latencies,
            wall: wall.elapsed(),
        },
        rss_mib,
        idle,
        idle_workers,
        idle_worker_alone,
        ready,
    })
}

pub async fn run(args: CatalogArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.tools >= 1 && args.changes >= 1,
        "--tools and --changes must be at least 1"
    );
    if args.source == Source::Cluster {
        return run_cluster(&args);
    }
    let wasm = args
        .wasm
        .canonicalize()
        .with_context(|| format!("cannot find {}", args.wasm.display()))?;
    let one = measure(1, args.changes, &wasm).await?;
    let many = measure(args.tools, args.changes, &wasm).await?;
    println!(
        "toolgrid bench catalog: {} changes of one tool's release in a manifest directory, {} cores",
        args.changes,
        crate::cli::runtime::cores()
    );
    println!("{}", super::header());
    println!(
        "{}",
        many.apply
            .row(&format!("apply to callable, {} tools", args.tools))
    );
    println!("{}", one.apply.row("baseline: apply to callable, 1 tool"));
    let rss = |m: &Measured| m.rss_mib.map_or("?".into(), |r| format!("{r:.1} MiB"));
    println!(
        "control plane RSS after the changes: {} with {} tools, {} with 1 (baseline); start to ready: {:.2} s and {:.2} s",
        rss(&many),
        args.tools,
        rss(&one),
        many.ready.as_secs_f64(),
        one.ready.as_secs_f64()
    );
    println!("idle memory (ready, nothing called) in MiB, RSS / private / PSS:");
    let memory = |m: Option<Memory>| m.map_or("?".into(), |m| m.cells());
    println!(
        "  control plane, 1 tool                    {}   (bar: RSS 32)",
        memory(one.idle)
    );
    println!(
        "  control plane, {:<5} tools              {}",
        args.tools,
        memory(many.idle)
    );
    for (i, worker) in one.idle_workers.iter().enumerate() {
        println!(
            "  worker {i}                                 {}   (bar: RSS 16)",
            worker.cells()
        );
    }
    match one.idle_worker_alone {
        Some(worker) => println!(
            "  toolgrid-worker, as a pod runs it        {}   (bar: RSS 16)",
            worker.cells()
        ),
        None => println!(
            "  toolgrid-worker, as a pod runs it        (not built beside this binary: cargo build --release)"
        ),
    }
    println!(
        "  (RSS counts the pages of its binary a process has run, which every process of that \
         binary on the machine shares; private is its own heap and stacks, PSS adds its share)"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_settled_once_three_seconds_of_readings_agree() {
        // Too few readings to tell.
        assert!(!settled(&[50.0; SETTLE_READINGS - 1]));
        assert!(settled(&[50.0; SETTLE_READINGS]));
        // A start's peak going back to the system: not until the last readings agree.
        // (What a control plane with the Python runtime read every 250 ms from its start.)
        let mut readings = vec![21.7, 151.1, 215.3, 315.3, 398.1, 520.2, 453.9];
        readings.extend([466.4; 5]);
        assert!(!settled(&readings));
        readings.extend([
            54.7, 58.6, 60.5, 61.1, 61.1, 61.1, 61.1, 61.2, 61.2, 61.2, 61.2,
        ]);
        assert!(!settled(&readings));
        readings.extend([61.2; 3]);
        assert!(!settled(&readings), "58.6 is still among the last readings");
        readings.push(61.2);
        assert!(settled(&readings));
        // Readings that wander by more than a MiB are not settled.
        let mut wandering = vec![60.0; SETTLE_READINGS];
        wandering[SETTLE_READINGS / 2] = 61.5;
        assert!(!settled(&wandering));
    }
}
