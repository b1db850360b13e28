//! `toolgrid bench`: measurements against a real platform, next to a baseline measured in
//! the same run, printed so runs can be compared (see BENCHMARKS.md).

mod catalog;
mod ha;
mod stages;
mod threads;
mod waiting;

use super::sample::Sample;
use anyhow::Context;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use toolgrid_proto as proto;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: Bench,
}

impl BenchArgs {
    /// Whether this is `bench calls`.
    pub fn is_calls(&self) -> bool {
        matches!(self.what, Bench::Calls(_))
    }
}

#[derive(clap::Subcommand, Debug)]
enum Bench {
    /// Call latency and throughput end to end, against wasmtime in-process.
    Calls(CallsArgs),
    /// Oplog commit latency and throughput, against a raw write + fdatasync loop.
    Oplog(OplogArgs),
    /// Time from SIGKILL of a worker to the call's completion on another one.
    Failover(super::failover::FailoverArgs),
    /// Start-up and a small call of each built-in runtime, against the same module run
    /// in-process with plain wasmtime.
    Builtins(BuiltinsArgs),
    /// The time from one tool's manifest changing to the change being callable, in a
    /// catalog of many tools, against a catalog of one; the control plane's RSS.
    Catalog(catalog::CatalogArgs),
    /// Many calls queued behind a busy worker slot: the control plane's RSS with them
    /// waiting, the slots they hold, and how fast and in what order they drain.
    Waiting(waiting::WaitingArgs),
    /// Two control-plane replicas on PostgreSQL, the leader killed with SIGKILL under load
    /// again and again: takeover time p50/p99, every call exactly once.
    Ha(ha::HaArgs),
}

#[derive(clap::Args, Debug)]
struct BuiltinsArgs {
    /// Calls of each case (after a warm-up), one at a time.
    #[arg(long, default_value_t = 200)]
    calls: usize,
    /// Manifests of the platform to start (the built-ins come from `builtins/manifests`).
    #[arg(long, default_value = "examples/manifests")]
    manifests: PathBuf,
    /// The built-in tools' directory (their artifacts, for the in-process baseline).
    #[arg(long, default_value = "builtins")]
    builtins: PathBuf,
}

#[derive(clap::Args, Debug)]
struct OplogArgs {
    /// How long each measurement runs.
    #[arg(long, default_value = "3s")]
    duration: toolgrid_api::units::GoDuration,
    /// Concurrent calls appending, one measurement each.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 64])]
    concurrency: Vec<usize>,
    /// Directory for the store and the baseline file (the disk being measured).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
}

#[derive(clap::Args, Debug)]
struct CallsArgs {
    /// Calls the concurrent clients make (after a warm-up), and each in-process baseline;
    /// the sequential run makes at most 1,000. 10,000 keeps sixteen clients busy for
    /// about a second and a half on two cores: runs of 2,000 (0.3 s) moved by a fifth from
    /// one to the next with the host's load.
    #[arg(long, default_value_t = 10_000)]
    calls: usize,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Manifests of the platform to start (its pools decide the workers).
    #[arg(long, default_value = "examples/manifests")]
    manifests: PathBuf,
    /// Measure an already running platform instead of starting one.
    #[arg(long)]
    endpoint: Option<String>,
    /// The tool and its arguments.
    #[arg(long, default_value = "semver")]
    tool: String,
    #[arg(long, num_args = 1.., default_values = ["compare", "1.0.0", "2.0.0"], allow_hyphen_values = true)]
    args: Vec<String>,
    /// The tool's artifact, for the in-process baseline.
    #[arg(long, default_value = "examples/tools/semver/semver.wasm")]
    wasm: PathBuf,
    /// Also print where a sequential call's time goes, stage by stage (p50/p99), from the
    /// platform's `toolgrid_call_stage_seconds` histograms.
    #[arg(long)]
    stages: bool,
    /// The platform's HTTP address (`host:port`) for `--stages` with `--endpoint`.
    #[arg(long)]
    http: Option<String>,
    /// Fail (exit 1) when the sequential p50 exceeds the in-process run's plus this many
    /// raw fdatasync p50s, all measured in this run (a ratio: the machine's speed cancels).
    #[arg(long)]
    max_fsyncs: Option<f64>,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        Bench::Calls(args) => calls(args).await,
        Bench::Oplog(args) => oplog(args).await,
        Bench::Failover(args) => super::failover::run(args).await,
        Bench::Builtins(args) => builtins(args).await,
        Bench::Catalog(args) => catalog::run(args).await,
        Bench::Waiting(args) => waiting::run(args).await,
        Bench::Ha(args) => ha::run(args),
    }
}

/// One measured call of a built-in: its tool, argv and artifact, and the read-only files
/// its release mounts (guest directory, name, file under the built-ins' directory).
struct BuiltinCase {
    label: &'static str,
    tool: &'static str,
    args: &'static [&'static str],
    wasm: &'static str,
    files: &'static [(&'static str, &'static str, &'static str)],
    /// At most this many calls of the case (a slow one), whatever `--calls` says.
    max_calls: usize,
}

const PYTHON_WASM: &str = "runtimes/python/python-snapshot.wasm";
const PYTHON_FILES: &[(&str, &str, &str)] = &[
    (
        "/usr/local/lib",
        "python315.zip",
        "runtimes/python/python-stdlib.zip",
    ),
    ("/", "run", "tools/python/run.py"),
];

const BUILTIN_CASES: &[BuiltinCase] = &[
    BuiltinCase {
        label: "js `1 + 1`",
        tool: "js",
        args: &["run", "--code", "1 + 1"],
        wasm: "tools/js/js.wasm",
        files: &[],
        max_calls: usize::MAX,
    },
    BuiltinCase {
        label: "js 10k squares as JSON",
        tool: "js",
        args: &[
            "run",
            "--code",
            "JSON.stringify(Array.from({length: 10000}, (_, i) => i * i)).length",
        ],
        wasm: "tools/js/js.wasm",
        files: &[],
        max_calls: usize::MAX,
    },
    BuiltinCase {
        label: "python `print(1)`",
        tool: "python",
        args: &["run", "--code", "print(1)"],
        wasm: PYTHON_WASM,
        files: PYTHON_FILES,
        max_calls: 50,
    },
    BuiltinCase {
        label: "python `import pandas`",
        tool: "python",
        args: &[
            "run",
            "--code",
            "import pandas as pd\npd.DataFrame({'a': [1, 2, 3]})['a'].sum()",
        ],
        wasm: PYTHON_WASM,
        files: PYTHON_FILES,
        max_calls: 10,
    },
];

async fn builtins(args: BuiltinsArgs) -> anyhow::Result<()> {
    // Compiled code is kept across runs: the python runtime takes minutes to compile.
    let cache = std::path::Path::new(".toolgrid/cache");
    let started = start_platform_with(&args.manifests, &[("TOOLGRID_CACHE", cache)])?;
    let clients = [started.client().await?];
    println!(
        "toolgrid bench builtins: {} sequential calls of each (fewer where it says), {} cores",
        args.calls,
        super::runtime::cores()
    );
    println!("{}", header());
    for case in BUILTIN_CASES {
        let calls = args.calls.min(case.max_calls);
        let request = proto::InvokeRequest {
            tool: case.tool.into(),
            argv: case.args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        };
        warm_up(&clients[0], &request).await?;
        run_clients(&clients, &request, 2).await?;
        let platform = run_clients(&clients, &request, calls).await?;
        let path = args.builtins.join(case.wasm);
        let wasm =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut argv = vec![case.tool.to_string()];
        argv.extend(case.args.iter().map(|a| a.to_string()));
        let files = baseline::Files::lay_out(&args.builtins, case.files)?;
        let baseline = baseline::Baseline::new(&wasm, argv, files, Some(cache))?;
        baseline.run_concurrent(2, 1).await?;
        let in_process = baseline.run_concurrent(calls, 1).await?;
        let instantiate = baseline.instantiate_only(calls).await?;
        println!(
            "{}",
            platform.row(&format!("{}: toolgrid, end to end", case.label))
        );
        println!(
            "{}",
            in_process.row(&format!("{}: wasmtime in-process", case.label))
        );
        println!(
            "{}",
            instantiate.row(&format!("{}: instantiate only", case.label))
        );
    }
    Ok(())
}

/// Calls until one succeeds: the first call of a release compiles it (minutes for the
/// python runtime), and a call that times out meanwhile is tried again.
async fn warm_up(
    client: &super::client::Client,
    request: &proto::InvokeRequest,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let call = client.clone().invoke(request.clone()).await?.into_inner();
        if call.state == proto::CallState::Succeeded as i32 {
            return Ok(());
        }
        let timed_out = call.error.as_ref().is_some_and(|e| e.kind == "timeout");
        if !timed_out || Instant::now() > deadline {
            anyhow::bail!("the warm-up call failed: {:?}", call.error);
        }
    }
}

/// Runs a benchmark written in Python (`script`, in the repository: it plays the
/// Kubernetes API server with `tests/helm/fakekube.py`), given this binary and `args`.
/// Its status 77 (it cannot run here: PyYAML missing, the reason on its stderr), the
/// tests' "skip", passes through.
fn run_python_bench(
    script: &std::path::Path,
    bench: &str,
    args: &[(&str, String)],
) -> anyhow::Result<()> {
    anyhow::ensure!(
        script.is_file(),
        "no {} here: run `toolgrid bench {bench}` from the repository",
        script.display()
    );
    let mut command = std::process::Command::new("python3");
    command
        .arg(script)
        .arg("--toolgrid")
        .arg(std::env::current_exe()?);
    for (flag, value) in args {
        command.arg(flag).arg(value);
    }
    let status = command.status().context("cannot run python3")?;
    if status.code() == Some(77) {
        std::process::exit(77);
    }
    anyhow::ensure!(status.success(), "the {bench} run failed ({status})");
    Ok(())
}

fn header() -> String {
    format!(
        "{:<44} {:>9} {:>9} {:>9} {:>11}",
        "", "p50 ms", "p99 ms", "mean ms", "calls/s"
    )
}

/// A platform started for the benchmark, stopped on drop.
struct Started {
    child: Child,
    grpc: String,
    http: String,
    /// The admin token of the started platform.
    token: String,
    data: tempfile::TempDir,
}

impl Started {
    /// A gRPC client of the started platform with its admin token.
    async fn client(&self) -> anyhow::Result<super::client::Client> {
        let credentials = super::client::Credentials::new(Some(&self.token), None)?;
        let channel = Channel::from_shared(format!("http://{}", self.grpc))?
            .connect()
            .await?;
        Ok(super::client::client_of(channel, credentials))
    }
}

/// The rows `toolgrid get KIND` shows, every namespace.
async fn resource_rows(
    client: &mut super::client::Client,
    kind: &str,
) -> anyhow::Result<Vec<proto::ResourceRow>> {
    Ok(client
        .list_resources(proto::ListResourcesRequest {
            kind: kind.into(),
            namespace: String::new(),
        })
        .await?
        .into_inner()
        .rows)
}

/// The value of `row`'s column `name`.
fn column<'a>(row: &'a proto::ResourceRow, name: &str) -> Option<&'a str> {
    row.columns
        .iter()
        .find(|c| c.name == name)
        .map(|c| c.value.as_str())
}

impl Drop for Started {
    /// Stops the platform as its user would, with SIGTERM: it stops its workers, which end
    /// without a broken link to report. Killed if it has not stopped within [`STOP`].
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// How long a started platform may take to stop after SIGTERM.
const STOP: Duration = Duration::from_secs(10);

/// Sends `child` SIGTERM and waits for it to exit, for at most [`STOP`]; then kills it.
fn stop(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id())
        // SAFETY: kill(2) with a plain signal to our own child, not yet waited for, so its
        // pid is still its own.
        && unsafe { libc::kill(pid, libc::SIGTERM) } == 0
    {
        let deadline = Instant::now() + STOP;
        while Instant::now() < deadline {
            match child.try_wait() {
                Ok(Some(_)) => return,
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => break,
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn start_platform(manifests: &std::path::Path) -> anyhow::Result<Started> {
    start_platform_with(manifests, &[])
}

fn start_platform_with(
    manifests: &std::path::Path,
    env: &[(&str, &std::path::Path)],
) -> anyhow::Result<Started> {
    start_platform_full(manifests, env, &[])
}

fn start_platform_with_args(manifests: &std::path::Path, args: &[&str]) -> anyhow::Result<Started> {
    start_platform_full(manifests, &[], args)
}

fn start_platform_full(
    manifests: &std::path::Path,
    env: &[(&str, &std::path::Path)],
    args: &[&str],
) -> anyhow::Result<Started> {
    let data = tempfile::tempdir()?;
    let mut child = Command::new(std::env::current_exe()?)
        .arg("up")
        .arg("--manifests")
        .arg(manifests)
        .arg("--data")
        .arg(data.path())
        .arg("--listen")
        .arg("127.0.0.1:0")
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start toolgrid up")?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let ready = loop {
        match lines.next() {
            Some(Ok(line)) if line.starts_with("toolgrid is ready:") => break line,
            Some(Ok(_)) => continue,
            _ => anyhow::bail!("toolgrid up exited before it was ready"),
        }
    };
    let grpc = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .context("no grpc= in the ready line")?
        .to_string();
    let http = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .context("no http= in the ready line")?
        .to_string();
    let token = super::up::admin_token(data.path())?;
    Ok(Started {
        child,
        grpc,
        http,
        token,
        data,
    })
}

async fn calls(args: CallsArgs) -> anyhow::Result<()> {
    let started = match &args.endpoint {
        Some(_) => None,
        None => Some(start_platform(&args.manifests)?),
    };
    let endpoint = args
        .endpoint
        .clone()
        .or_else(|| started.as_ref().map(|s| s.grpc.clone()))
        .unwrap_or_default();
    let url = if endpoint.contains("://") {
        endpoint.clone()
    } else {
        format!("http://{endpoint}")
    };
    let request = proto::InvokeRequest {
        tool: args.tool.clone(),
        argv: args.args.clone(),
        ..Default::default()
    };
    let token = match &started {
        Some(started) => Some(started.token.clone()),
        None => std::env::var("TOOLGRID_TOKEN")
            .ok()
            .or_else(super::client::default_token),
    };
    let credentials = super::client::Credentials::new(token.as_deref(), None)?;
    let mut clients = Vec::new();
    for _ in 0..args.concurrency.max(1) {
        let channel = Channel::from_shared(url.clone())?.connect().await?;
        clients.push(super::client::client_of(channel, credentials.clone()));
    }
    let workers = resource_rows(&mut clients[0].clone(), "pools")
        .await?
        .iter()
        .filter_map(|r| column(r, "Attached"))
        .collect::<Vec<_>>()
        .join("+");
    // Warm up: every worker compiles the release, every connection is open.
    let warmup = (args.concurrency * 4).max(32);
    run_clients(&clients, &request, warmup).await?;
    let http = args
        .http
        .clone()
        .or_else(|| started.as_ref().map(|s| s.http.clone()));
    // The platform's metrics between the runs: the stages' histograms, the store's syncs.
    let scrape = || async {
        match (&http, &token) {
            (Some(http), Some(token)) => stages::scrape(http, token).await.map(Some),
            (None, _) if args.stages => anyhow::bail!("--stages with --endpoint needs --http"),
            _ => Ok(None),
        }
    };
    let concurrent_before = scrape().await?;
    let cpu_before = started.as_ref().map(|s| cpu::of_tree(s.child.id()));
    let own_before = threads::own();
    let threads_before = started.as_ref().map(|s| threads::snapshot(s.child.id()));
    let platform = run_clients(&clients, &request, args.calls).await?;
    let threads_after = started.as_ref().map(|s| threads::snapshot(s.child.id()));
    let own_after = threads::own();
    let cpu_after = started.as_ref().map(|s| cpu::of_tree(s.child.id()));
    let concurrent_after = scrape().await?;
    let stages_before = scrape().await?;
    let platform_sequential = run_clients(&clients[..1], &request, args.calls.min(1000)).await?;
    let stages_after = scrape().await?;
    // The raw durable-write rate of the store's disk (the started platform's data
    // directory; the current directory for --endpoint), measured in this run.
    let raw_dir = started
        .as_ref()
        .map(|s| s.data.path().to_path_buf())
        .unwrap_or_else(|| PathBuf::from("."));
    let fdatasync = {
        let dir = tempfile::tempdir_in(&raw_dir)?;
        fdatasync_loop(&dir.path().join("raw.bin"), Duration::from_secs(2))?
    };

    let wasm = std::fs::read(&args.wasm)
        .with_context(|| format!("cannot read {}", args.wasm.display()))?;
    let mut argv = vec![args.tool.clone()];
    argv.extend(args.args.iter().cloned());
    let baseline = baseline::Baseline::new(&wasm, argv, baseline::Files::none(), None)?;
    // The in-process runs on a runtime of their own, a thread per core: the bench's own
    // runtime has one thread, for its clients.
    let in_process_runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (calls, concurrency) = (args.calls, args.concurrency);
    let measured = in_process_runtime
        .spawn(async move {
            baseline.run_concurrent(warmup, concurrency).await?;
            let in_process = baseline.run_concurrent(calls, concurrency).await?;
            let sequential = baseline.run_concurrent(calls, 1).await?;
            let instantiate = baseline.instantiate_only(calls).await?;
            anyhow::Ok((in_process, sequential, instantiate))
        })
        .await;
    in_process_runtime.shutdown_background();
    let (in_process, sequential, instantiate) = measured??;

    println!(
        "toolgrid bench calls: {} calls of `{} {}`, {} concurrent clients, {} workers, {} cores",
        args.calls,
        args.tool,
        args.args.join(" "),
        args.concurrency,
        if workers.is_empty() {
            "?".into()
        } else {
            workers
        },
        super::runtime::cores()
    );
    println!("{}", header());
    println!(
        "{}",
        platform.row(&format!(
            "toolgrid: gRPC Invoke, {} clients",
            args.concurrency
        ))
    );
    println!(
        "{}",
        platform_sequential.row("toolgrid: gRPC Invoke, 1 client")
    );
    println!(
        "{}",
        fdatasync.row("baseline: 4 KiB write + fdatasync, store disk")
    );
    println!(
        "{}",
        in_process.row(&format!(
            "baseline: wasmtime in-process, {} tasks",
            args.concurrency
        ))
    );
    println!(
        "{}",
        sequential.row("baseline: wasmtime in-process, 1 task")
    );
    println!(
        "{}",
        instantiate.row("baseline: wasmtime instantiate only, 1 task")
    );
    println!(
        "end-to-end p50 overhead over in-process run: {:.3} ms; throughput {:.0}% of in-process",
        platform_sequential.percentile(0.5) - sequential.percentile(0.5),
        100.0 * platform.rate() / in_process.rate()
    );
    // The bars of a durable call: throughput at least the disk's serial fdatasync rate,
    // and a sequential call within the in-process run plus three fsyncs and 0.3 ms.
    let latency_bar = sequential.percentile(0.5) + 3.0 * fdatasync.percentile(0.5) + 0.3;
    println!(
        "durable throughput: {:.2}x the raw fdatasync rate (bar: 1.00x); sequential p50 {:.3} ms against {:.3} ms (in-process + 3 fdatasync p50 + 0.3 ms)",
        platform.rate() / fdatasync.rate(),
        platform_sequential.percentile(0.5),
        latency_bar
    );
    for (what, before, after, sample) in [
        (
            "a sequential call's",
            &stages_before,
            &stages_after,
            &platform_sequential,
        ),
        (
            &*format!("a call's with {} clients", args.concurrency),
            &concurrent_before,
            &concurrent_after,
            &platform,
        ),
    ] {
        let (Some(before), Some(after), true) = (before, after, args.stages) else {
            continue;
        };
        let (before, after) = (stages::parse(before), stages::parse(after));
        println!(
            "where {what} time goes (the platform's toolgrid_call_stage_seconds, {} calls):",
            sample.latencies.len()
        );
        println!(
            "{:<44} {:>9} {:>9} {:>9} {:>11}",
            "stage", "p50 ms", "p99 ms", "mean ms", "calls"
        );
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
        let mut p50s = 0.0;
        for row in stages::table(&before, &after) {
            if !row.beside {
                p50s += row.p50.unwrap_or(0.0);
            }
            println!(
                "{:<44} {:>9} {:>9} {:>9} {:>11}",
                format!("  {}", row.stage),
                ms(row.p50),
                ms(row.p99),
                ms(row.mean),
                row.count
            );
        }
        println!(
            "  the stages' p50s but store_sync's (beside the dispatch and the run) add up to {p50s:.3} ms of the {:.3} ms end-to-end p50; the rest is the client and the transport",
            sample.percentile(0.5)
        );
    }
    // Group commit: how many calls shared a sync of the store (a call writes twice, its
    // admission and its end).
    let syncs = |before: &Option<String>, after: &Option<String>| {
        let count =
            |text: &Option<String>| stages::counter(text.as_deref()?, "toolgrid_store_syncs_total");
        Some(count(after)?.saturating_sub(count(before)?))
    };
    if let (Some(concurrent), Some(alone)) = (
        syncs(&concurrent_before, &concurrent_after),
        syncs(&stages_before, &stages_after),
    ) {
        let per_call = |syncs: u64, sample: &Sample| syncs as f64 / sample.latencies.len() as f64;
        println!(
            "the store's syncs: {:.2} a call with {} clients, {:.2} a call with 1 client (a call's admission and end, each durable before it goes on)",
            per_call(concurrent, &platform),
            args.concurrency,
            per_call(alone, &platform_sequential),
        );
    }
    if let (Some(Some(before)), Some(Some(after))) = (cpu_before, cpu_after) {
        let per_call = (after - before).as_secs_f64() * 1e3 / args.calls as f64;
        let busy = (after - before).as_secs_f64() / platform.wall.as_secs_f64();
        println!(
            "platform CPU (toolgrid up and its workers): {per_call:.3} ms per call, {busy:.2} cores busy during the {}-client run",
            args.concurrency
        );
        // The clients share the cores: what they take, the platform cannot have.
        let per_call = threads::total_ms(&threads::per_call(&own_before, &own_after, args.calls));
        if per_call > 0.0 {
            let busy = per_call * args.calls as f64 / 1e3 / platform.wall.as_secs_f64();
            println!(
                "the bench's own clients: {per_call:.3} ms per call, {busy:.2} cores busy beside it"
            );
        }
    }
    if let (Some(before), Some(after)) = (&threads_before, &threads_after) {
        // Nothing where /proc cannot tell.
        let lines = threads::lines(&threads::per_call(before, after, args.calls));
        if !lines.is_empty() {
            println!(
                "platform CPU per call by thread (ms, the {}-client run):",
                args.concurrency
            );
        }
        for line in lines {
            println!("  {line}");
        }
    }
    if let Some(fsyncs) = args.max_fsyncs {
        let bar = sequential.percentile(0.5) + fsyncs * fdatasync.percentile(0.5);
        let p50 = platform_sequential.percentile(0.5);
        anyhow::ensure!(
            p50 <= bar,
            "the sequential p50 {p50:.3} ms is over the guard's {bar:.3} ms (in-process p50 + {fsyncs} fdatasync p50s)"
        );
        println!(
            "guard: sequential p50 {p50:.3} ms within {bar:.3} ms (in-process + {fsyncs} fdatasync p50s)"
        );
    }
    Ok(())
}

/// CPU time of a process tree, from /proc (Linux).
mod cpu {
    use std::time::Duration;

    /// User and system CPU time of `pid` and its children, or `None` where /proc cannot
    /// tell.
    pub fn of_tree(pid: u32) -> Option<Duration> {
        let mut total = of(pid)?;
        for child in children(pid) {
            total += of(child).unwrap_or_default();
        }
        Some(total)
    }

    fn of(pid: u32) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
        let ticks: u64 =
            fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // In USER_HZ, which Linux fixes at 100 for /proc whatever the kernel's own tick.
        Some(Duration::from_millis(ticks * 10))
    }

    /// The child processes of `pid`.
    pub fn children(pid: u32) -> Vec<u32> {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        tasks
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|c| {
                c.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect::<Vec<u32>>()
            })
            .collect()
    }
}

async fn run_clients(
    clients: &[super::client::Client],
    request: &proto::InvokeRequest,
    calls: usize,
) -> anyhow::Result<Sample> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for client in clients {
        let (mut client, request, next) = (client.clone(), request.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < calls {
                let begin = Instant::now();
                let call = client.invoke(request.clone()).await?.into_inner();
                if call.state != proto::CallState::Succeeded as i32 {
                    anyhow::bail!("a benchmark call failed: {:?}", call.error);
                }
                latencies.push(begin.elapsed());
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut latencies = Vec::with_capacity(calls);
    for task in tasks {
        latencies.extend(task.await??);
    }
    Ok(Sample {
        latencies,
        wall: start.elapsed(),
    })
}

/// The same tool run with plain wasmtime and WASI, in this process: no store, no oplog,
/// no network.
mod baseline {
    use crate::cli::sample::Sample;
    use std::sync::Arc;
    use std::time::Instant;
    use wasmtime::{
        Config, Engine, InstanceAllocationStrategy, Linker, Module, PoolingAllocationConfig, Store,
    };
    use wasmtime_wasi::p1::WasiP1Ctx;
    use wasmtime_wasi::p2::pipe::MemoryOutputPipe;

    /// `wasm` compiled by `engine`, from `cache` when an earlier run left it there.
    fn compiled(engine: &Engine, wasm: &[u8], cache: &std::path::Path) -> anyhow::Result<Module> {
        use std::hash::{Hash as _, Hasher as _};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        let name = format!(
            "bench-{}-{:016x}.cwasm",
            toolgrid_core::artifact::digest_of(wasm).trim_start_matches("sha256:"),
            hasher.finish()
        );
        let path = cache.join(name);
        if let Ok(code) = std::fs::read(&path) {
            // SAFETY: written below by this same engine configuration (its compatibility
            // hash is in the name), under a name holding the source's digest.
            if let Ok(module) = unsafe { Module::deserialize(engine, &code) } {
                return Ok(module);
            }
        }
        let module = Module::new(engine, wasm).map_err(|e| anyhow::anyhow!("{e:#}"))?;
        if let Ok(code) = module.serialize() {
            let _ = std::fs::create_dir_all(cache);
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, code).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        Ok(module)
    }

    pub struct Baseline {
        engine: Engine,
        pre: wasmtime::InstancePre<WasiP1Ctx>,
        argv: Vec<String>,
        files: Files,
        /// A reactor (`run() -> i32`) rather than a command (`_start`).
        reactor: bool,
    }

    /// The read-only directories a release's files make (as the worker lays them out),
    /// removed on drop.
    pub struct Files {
        dirs: Vec<(String, std::path::PathBuf)>,
        _root: Option<tempfile::TempDir>,
    }

    impl Files {
        pub fn none() -> Self {
            Files {
                dirs: Vec::new(),
                _root: None,
            }
        }

        /// `files` (guest directory, name, file under `builtins`) as directories to preopen.
        pub fn lay_out(
            builtins: &std::path::Path,
            files: &[(&str, &str, &str)],
        ) -> anyhow::Result<Self> {
            if files.is_empty() {
                return Ok(Files::none());
            }
            let root = tempfile::tempdir()?;
            let mut dirs: Vec<(String, std::path::PathBuf)> = Vec::new();
            for (guest, name, source) in files {
                let dir = root.path().join(format!("{}", dirs.len()));
                std::fs::create_dir_all(&dir)?;
                let source = builtins.join(source);
                if std::fs::hard_link(&source, dir.join(name)).is_err() {
                    std::fs::copy(&source, dir.join(name))?;
                }
                dirs.push((guest.to_string(), dir));
            }
            Ok(Files {
                dirs,
                _root: Some(root),
            })
        }
    }

    impl Baseline {
        /// The module compiled (or loaded from `cache`, keyed by its digest and this
        /// engine), linked with WASI preview 1 and the `host.call` door a reactor imports.
        pub fn new(
            wasm: &[u8],
            argv: Vec<String>,
            files: Files,
            cache: Option<&std::path::Path>,
        ) -> anyhow::Result<Arc<Self>> {
            let mut config = Config::new();
            let mut pool = PoolingAllocationConfig::default();
            // As the worker's runtime: CPython's table and instance metadata are large.
            pool.table_elements(toolgrid_sandbox::runtime::MAX_TABLE_ELEMENTS)
                .max_core_instance_size(toolgrid_sandbox::runtime::MAX_CORE_INSTANCE_BYTES);
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            let engine = Engine::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))?;
            let module = match cache {
                Some(cache) => compiled(&engine, wasm, cache)?,
                None => Module::new(&engine, wasm).map_err(|e| anyhow::anyhow!("{e:#}"))?,
            };
            let mut linker: Linker<WasiP1Ctx> = Linker::new(&engine);
            wasmtime_wasi::p1::add_to_linker_async(&mut linker, |c| c)
                .map_err(|e| anyhow::anyhow!("{e:#}"))?;
            linker
                .func_wrap(
                    "host",
                    "call",
                    |_: wasmtime::Caller<'_, WasiP1Ctx>, _: i32, _: i32, _: i32, _: i32| -1i32,
                )
                .map_err(|e| anyhow::anyhow!("{e:#}"))?;
            let reactor = module.get_export("_start").is_none();
            let pre = linker
                .instantiate_pre(&module)
                .map_err(|e| anyhow::anyhow!("{e:#}"))?;
            Ok(Arc::new(Baseline {
                engine,
                pre,
                argv,
                files,
                reactor,
            }))
        }

        async fn once(&self, run: bool) -> anyhow::Result<()> {
            let mut builder = wasmtime_wasi::WasiCtxBuilder::new();
            builder
                .args(&self.argv)
                .stdout(MemoryOutputPipe::new(1 << 20));
            for (guest, dir) in &self.files.dirs {
                builder
                    .preopened_dir(dir, guest, wasmtime_wasi::FsPerms::ReadOnly)
                    .map_err(|e| anyhow::anyhow!("{e:#}"))?;
            }
            let mut store = Store::new(&self.engine, builder.build_p1());
            let instance = self
                .pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| anyhow::anyhow!("{e:#}"))?;
            if !run {
                return Ok(());
            }
            let ran = if self.reactor {
                let entry = instance
                    .get_typed_func::<(), i32>(&mut store, "run")
                    .map_err(|e| anyhow::anyhow!("{e:#}"))?;
                entry
                    .call_async(&mut store, ())
                    .await
                    .and_then(|code| match code {
                        0 => Ok(()),
                        code => Err(wasmtime_wasi::I32Exit(code).into()),
                    })
            } else {
                let start = instance
                    .get_typed_func::<(), ()>(&mut store, "_start")
                    .map_err(|e| anyhow::anyhow!("{e:#}"))?;
                start.call_async(&mut store, ()).await
            };
            if let Err(error) = ran
                && error
                    .downcast_ref::<wasmtime_wasi::I32Exit>()
                    .is_none_or(|e| e.0 != 0)
            {
                anyhow::bail!("the baseline run failed: {error:#}");
            }
            Ok(())
        }

        pub async fn run_concurrent(
            self: &Arc<Self>,
            calls: usize,
            tasks: usize,
        ) -> anyhow::Result<Sample> {
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let start = Instant::now();
            let mut handles = Vec::new();
            for _ in 0..tasks.max(1) {
                let (this, next) = (self.clone(), next.clone());
                handles.push(tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < calls {
                        let begin = Instant::now();
                        this.once(true).await?;
                        latencies.push(begin.elapsed());
                    }
                    Ok::<_, anyhow::Error>(latencies)
                }));
            }
            let mut latencies = Vec::new();
            for handle in handles {
                latencies.extend(handle.await??);
            }
            Ok(Sample {
                latencies,
                wall: start.elapsed(),
            })
        }

        pub async fn instantiate_only(&self, calls: usize) -> anyhow::Result<Sample> {
            let start = Instant::now();
            let mut latencies = Vec::with_capacity(calls);
            for _ in 0..calls {
                let begin = Instant::now();
                self.once(false).await?;
                latencies.push(begin.elapsed());
            }
            Ok(Sample {
                latencies,
                wall: start.elapsed(),
            })
        }
    }
}

/// Appends one small entry at a time from each of `concurrency` calls for `duration`.
async fn oplog(args: OplogArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)?;
    let dir = tempfile::tempdir_in(&args.dir)?;
    let duration = args.duration.get();
    let baseline = fdatasync_loop(&dir.path().join("raw.bin"), duration)?;
    println!(
        "toolgrid bench oplog: {:?} per row, store and baseline in {}",
        duration,
        args.dir
            .canonicalize()
            .unwrap_or(args.dir.clone())
            .display()
    );
    println!(
        "{:<44} {:>9} {:>9} {:>9} {:>11}",
        "", "p50 ms", "p99 ms", "mean ms", "commits/s"
    );
    println!(
        "{}",
        baseline.row("baseline: 4 KiB write + fdatasync, 1 writer")
    );
    for concurrency in &args.concurrency {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("store-{concurrency}.db")).display()
        );
        let store = toolgrid_store::open(&url).await?;
        let sample = append_loop(store, *concurrency, duration).await?;
        println!(
            "{}",
            sample.row(&format!("toolgrid oplog (SQLite), {concurrency} calls"))
        );
        if *concurrency == 1 {
            println!(
                "  one writer commits at {:.0}% of the raw fdatasync rate",
                100.0 * sample.rate() / baseline.rate()
            );
        }
    }
    if let Ok(url) = std::env::var("TOOLGRID_BENCH_POSTGRES_URL") {
        for concurrency in &args.concurrency {
            let store = toolgrid_store::open(&url).await?;
            let sample = append_loop(store, *concurrency, duration).await?;
            println!(
                "{}",
                sample.row(&format!("toolgrid oplog (PostgreSQL), {concurrency} calls"))
            );
        }
    }
    Ok(())
}

fn fdatasync_loop(path: &std::path::Path, duration: Duration) -> anyhow::Result<Sample> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)?;
    let block = vec![7u8; 4096];
    let start = Instant::now();
    let mut latencies = Vec::new();
    while start.elapsed() < duration {
        let begin = Instant::now();
        file.write_all(&block)?;
        file.sync_data()?;
        latencies.push(begin.elapsed());
    }
    Ok(Sample {
        latencies,
        wall: start.elapsed(),
    })
}

async fn append_loop(
    store: Arc<dyn toolgrid_store::Store>,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<Sample> {
    use toolgrid_core::call::{OplogEntry, WallClock};
    use toolgrid_store::{CallSpec, NewCall};
    let prefix = uuid::Uuid::now_v7().simple().to_string();
    for i in 0..concurrency {
        let id = format!("bench-{prefix}-{i}");
        store
            .create_call(NewCall {
                id: id.clone(),
                namespace: "bench".into(),
                tool: "bench".into(),
                command: "default".into(),
                release: "bench".into(),
                release_digest: "sha256:0".into(),
                args: serde_json::json!({}),
                spec: CallSpec::default(),
                stdin: Vec::new(),
                idempotency_key: None,
                request_hash: String::new(),
                started: toolgrid_core::call::CallStarted {
                    namespace: "bench".into(),
                    tool: "bench".into(),
                    command: "default".into(),
                    release: "bench".into(),
                    version: "0.0.0".into(),
                    digest: "sha256:0".into(),
                    args: serde_json::json!({}),
                    argv: Vec::new(),
                    stdin_bytes: 0,
                    idempotency_key: None,
                    dry_run: false,
                    middleware: Vec::new(),
                },
                assign_to: None,
                repeat_window_ms: None,
                dry_run_result: None,
            })
            .await?;
        store.assign_call(&id, "bench").await?;
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let store = store.clone();
        let id = format!("bench-{prefix}-{i}");
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while start.elapsed() < duration {
                let entry = OplogEntry::WallClock(WallClock { secs: n, nanos: 0 });
                let begin = Instant::now();
                store.append_oplog(&id, 1, n, vec![entry]).await?;
                latencies.push(begin.elapsed());
                n += 1;
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    Ok(Sample {
        latencies,
        wall: start.elapsed(),
    })
}
