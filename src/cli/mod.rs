//! The `toolgrid` command line: the platform (`up`, `worker`) and the client side.

mod audit;
mod bench;
pub mod client;
mod componentize;
mod controller;
pub mod exit;
mod failover;
mod help;
mod rollout;
mod runtime;
mod sample;
mod schema;
mod table;
pub(crate) mod up;
mod worker;
mod workspace;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Runs typed WebAssembly tools for AI agents, each call in a fresh sandbox, every side
/// effect in a durable oplog.
#[derive(Parser, Debug)]
#[command(name = "toolgrid", version, about, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Run the whole platform on this machine: control plane on an embedded SQLite store,
    /// manifests from a directory (watched), and local worker processes.
    Up(Box<up::UpArgs>),
    /// Run one sandbox worker attached to a control plane.
    Worker(worker::WorkerArgs),
    /// Run the control plane in a Kubernetes cluster: watch the CRDs, write status, own the
    /// worker Deployments, leader-elected.
    Controller(Box<controller::ControllerArgs>),
    /// Call a tool: `toolgrid call TOOL [COMMAND] [ARGS...] [--stdin FILE|-]
    /// [--idempotency-key K] [--endpoint ADDR]`. Prints the result as JSON.
    Call(client::CallArgs),
    /// List what is live: tools, releases, pools, calls, bindings, agents, middleware,
    /// sources.
    Get(client::GetArgs),
    /// Read a ToolSource's upstream again (its tools change only then, or on a new
    /// generation) and print what was added, removed and changed.
    Refresh(client::RefreshArgs),
    /// Drain a worker: it takes no new call, finishes those it holds within its grace
    /// period, gives up the rest to other workers and exits.
    Drain(client::DrainArgs),
    /// A tool's canary rollouts: `status`, `promote [--full]` (the next step, or all at
    /// once), `abort` (roll back).
    Rollout(rollout::RolloutArgs),
    /// Recent calls (same as `get calls`); `calls ID [--wait]` for one,
    /// `--awaiting-approval` for those waiting for a decision.
    Calls(client::CallsArgs),
    /// Print a call's oplog.
    Oplog(client::OplogArgs),
    /// Read an agent's workspace: `ls AGENT [PATH]`, `cat AGENT PATH`, `history AGENT`,
    /// `diff AGENT V1 V2` (`-n NAMESPACE`, `-v V` for an older version).
    Workspace(workspace::WorkspaceArgs),
    /// Which tools an agent may call and, for each it may not, why: no binding, binding
    /// not Ready (and its reason), permission, release range.
    Why(client::WhyArgs),
    /// Approve a call waiting for approval.
    Approve(client::DecisionArgs),
    /// Deny a call waiting for approval.
    Deny(client::DecisionArgs),
    /// Cancel a call not yet ended: it stops at once and ends `cancelled` (or
    /// `outcome-unknown` when a write of it may have been applied). Not rollback.
    Cancel(client::CancelArgs),
    /// The audit log, newest first: one record per call, refused ones included
    /// (`--agent A`, `--tool T`, `--since 10m|RFC3339`, `-n NS`, `-o json|table`).
    Audit(audit::AuditArgs),
    /// Print the CustomResourceDefinitions of every kind as one YAML stream.
    Crds {
        /// As the Helm chart's `templates/crds.yaml` (kept on uninstall, optional).
        #[arg(long)]
        helm: bool,
    },
    /// The tools the caller may call as a model API's tool definitions:
    /// `--format openai|anthropic|json-schema [--as AGENT] [TOOL...]` (docs/clients.md).
    Schema(schema::SchemaArgs),
    /// Generate code from tool definitions: `gen client --lang python|typescript
    /// [TOOL...] -o DIR` writes a typed client per tool (docs/clients.md).
    Gen(schema::GenArgs),
    /// Measure the platform (see BENCHMARKS.md).
    Bench(bench::BenchArgs),
    /// Wrap a WASI preview 1 module into a preview 2 component (`wasi:cli/run`).
    Componentize(componentize::ComponentizeArgs),
}

pub fn main() -> ExitCode {
    quiet_error_backtraces();
    let cli = Cli::parse();
    let server = matches!(
        cli.command,
        Commands::Up(_) | Commands::Worker(_) | Commands::Controller(_)
    );
    let otlp = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok();
    let otlp = match &cli.command {
        Commands::Controller(args) => args.otlp_endpoint().or(otlp),
        _ => otlp,
    };
    let service = match &cli.command {
        Commands::Worker(_) => "toolgrid-worker",
        Commands::Controller(_) => "toolgrid-controller",
        _ => "toolgrid",
    };
    let (given, shares_machine) = match &cli.command {
        Commands::Up(args) => (args.runtime_threads(), true),
        Commands::Worker(args) => (args.runtime_threads(), false),
        // The bench's clients stand for callers on other machines: one thread, so that they
        // take as little as they can of the cores the platform they measure runs on (the
        // in-process baselines have a runtime of their own).
        Commands::Bench(args) if args.is_calls() => (Some(1), false),
        _ => (None, false),
    };
    let process = Process {
        threads: given,
        shares_machine,
        log_level: if server { "info" } else { "warn" },
        service,
        otlp: otlp.as_deref(),
    };
    process.run(async move {
        match cli.command {
            Commands::Up(args) => report(up::run(*args).await),
            Commands::Worker(args) => report(worker::run(args).await),
            Commands::Controller(args) => report(controller::run(*args).await),
            Commands::Call(args) => client::call(args).await,
            Commands::Get(args) => client::get(args).await,
            Commands::Refresh(args) => client::refresh(args).await,
            Commands::Drain(args) => client::drain(args).await,
            Commands::Rollout(args) => rollout::run(args).await,
            Commands::Calls(args) => client::calls(args).await,
            Commands::Oplog(args) => client::oplog(args).await,
            Commands::Workspace(args) => workspace::run(args).await,
            Commands::Why(args) => client::why(args).await,
            Commands::Approve(args) => client::decide(args, true).await,
            Commands::Deny(args) => client::decide(args, false).await,
            Commands::Cancel(args) => client::cancel(args).await,
            Commands::Audit(args) => audit::run(args).await,
            Commands::Crds { helm } => match if helm {
                toolgrid_api::crds_helm_yaml()
            } else {
                toolgrid_api::crds_yaml()
            } {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(error) => report(Err(error.into())),
            },
            Commands::Schema(args) => schema::schema(args).await,
            Commands::Gen(args) => schema::generate(args).await,
            Commands::Bench(args) => report(bench::run(args).await),
            Commands::Componentize(args) => report(componentize::run(args)),
        }
    })
}

/// The `toolgrid-worker` binary: `toolgrid worker` alone, with the same arguments. It links
/// only what a worker runs (wasmtime, the worker link), so a worker pod maps and loads less
/// than half of what the `toolgrid` binary is; `toolgrid up` still starts `toolgrid
/// worker`, whose pages its control plane already has.
pub fn worker_main() -> ExitCode {
    quiet_error_backtraces();
    let args = worker::WorkerCommand::parse().args;
    let otlp = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok();
    let process = Process {
        threads: args.runtime_threads(),
        shares_machine: false,
        log_level: "info",
        service: "toolgrid-worker",
        otlp: otlp.as_deref(),
    };
    process.run(async move { report(worker::run(args).await) })
}

/// A guest's exit reaches the worker as an error value: with RUST_BACKTRACE=1 (set for
/// panics' sake) every one captured a backtrace of the host's stack, about 25 µs a call.
/// Errors capture one only when RUST_LIB_BACKTRACE asks; panics still honour RUST_BACKTRACE.
fn quiet_error_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: called first in the process's main, before any thread starts.
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
}

/// How a command's process runs: its async runtime and its telemetry.
struct Process<'a> {
    /// `--runtime-threads`, if given.
    threads: Option<usize>,
    /// Whether other processes of the platform share this machine's cores (`up`).
    shares_machine: bool,
    log_level: &'a str,
    service: &'a str,
    otlp: Option<&'a str>,
}

impl Process<'_> {
    fn run(self, command: impl Future<Output = ExitCode>) -> ExitCode {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(threads) = runtime::threads(
            self.threads,
            self.shares_machine,
            runtime::cores(),
            std::env::var_os("TOKIO_WORKER_THREADS").is_some(),
        ) {
            builder.worker_threads(threads);
        }
        builder.on_thread_park(crate::allocator::collect_when_idle);
        let runtime = match builder.enable_all().build() {
            Ok(runtime) => runtime,
            Err(error) => {
                eprintln!("toolgrid: cannot start the async runtime: {error}");
                return ExitCode::from(exit::INTERNAL);
            }
        };
        // The OTLP exporter's gRPC channel runs on the runtime: set up inside it, flushed
        // (the guard dropped) before it stops.
        let telemetry = {
            let _runtime = runtime.enter();
            crate::telemetry::init(self.log_level, self.service, self.otlp)
        };
        let code = runtime.block_on(command);
        {
            let _runtime = runtime.enter();
            drop(telemetry);
        }
        code
    }
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("toolgrid: {error:#}");
            ExitCode::from(exit::INTERNAL)
        }
    }
}
