//! `toolgrid bench waiting`: many calls queued for a busy pool. One worker with one slot
//! runs a call that sleeps; N calls are admitted behind it, one after another. Reported:
//! the control plane's RSS before and with the N waiting (and per waiting call), the slots
//! they hold (none: the one busy slot is the sleeper's), the admission rate, and, once the
//! sleeper is cancelled, how fast the N drain and whether they ran in admission order (a
//! witness on loopback records each call's request). Exits 1 when any call is lost, runs
//! twice or runs out of order.

use super::{Started, start_platform_with_args};
use anyhow::Context;
use axum::extract::{Query, State};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use toolgrid_proto as proto;

#[derive(clap::Args, Debug)]
pub struct WaitingArgs {
    /// Calls queued behind the busy slot.
    #[arg(long, default_value_t = 10_000)]
    calls: usize,
    /// The tool every call runs: `slow` (one request to the witness per call).
    #[arg(long, default_value = "tests/fixtures/tools/slow/slow.wasm")]
    wasm: std::path::PathBuf,
}

/// The `run` of every request the witness saw, in arrival order.
#[derive(Clone, Default)]
struct Arrivals(Arc<Mutex<Vec<String>>>);

impl Arrivals {
    fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

async fn step(
    State(arrivals): State<Arrivals>,
    Query(query): Query<HashMap<String, String>>,
) -> &'static str {
    if let Some(run) = query.get("run") {
        arrivals
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(run.clone());
    }
    "ok"
}

fn lay_out(dir: &Path, wasm: &Path, witness_port: u16) -> anyhow::Result<()> {
    std::fs::write(
        dir.join("tool.yaml"),
        format!(
            "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {{name: default}}\n\
             spec: {{replicas: 1, slotsPerWorker: 1}}\n---\n\
             apiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {{name: slow}}\n\
             spec:\n  effect: read\n  timeout: 30m\n  repeatWindow: 0s\n  commands:\n    - name: run\n      \
             options:\n        - {{name: base, schema: {{type: string}}, required: true}}\n        \
             - {{name: run, schema: {{type: string}}, required: true}}\n        \
             - {{name: steps, schema: {{type: integer}}}}\n        \
             - {{name: sleep-ms, schema: {{type: integer}}}}\n      result: {{type: object}}\n\
             ---\napiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: slow-1.0.0}}\n\
             spec:\n  tool: slow\n  version: 1.0.0\n  artifact: {{file: {}}}\n  \
             network: {{egress: [{{host: 127.0.0.1, ports: [{witness_port}], allowPrivate: true}}]}}\n",
            std::fs::canonicalize(wasm)
                .with_context(|| format!("no tool at {}", wasm.display()))?
                .display(),
        ),
    )?;
    Ok(())
}

fn request(base: &str, run: &str, sleep_ms: u64) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: "slow".into(),
        argv: [
            "run",
            "--base",
            base,
            "--run",
            run,
            "--steps",
            "1",
            "--sleep-ms",
            &sleep_ms.to_string(),
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    }
}

/// Admits a call and returns its id once it is accepted (queued or running), leaving it
/// to go on; with `until_assigned`, only once a worker holds it.
async fn admit(
    client: &mut crate::cli::client::Client,
    request: proto::InvokeRequest,
    until_assigned: bool,
) -> anyhow::Result<String> {
    let mut stream = client.invoke_stream(request).await?.into_inner();
    let mut id = None;
    while let Some(event) = stream.message().await? {
        match event.event {
            Some(proto::invoke_event::Event::Progress(p)) => {
                id.get_or_insert(p.call_id);
                if !until_assigned || p.stage == "assigned" {
                    break;
                }
            }
            Some(proto::invoke_event::Event::Call(call)) => {
                anyhow::bail!("call {} ended before it waited: {:?}", call.id, call.state)
            }
            None => {}
        }
    }
    id.context("the stream ended before the call was accepted")
}

/// The pool's live columns (Busy, Queued).
async fn pool_columns(client: &mut crate::cli::client::Client) -> anyhow::Result<(String, String)> {
    let rows = super::resource_rows(client, "pools").await?;
    let row = rows
        .iter()
        .find(|r| r.name == "default")
        .context("no pool")?;
    let value = |name| super::column(row, name).unwrap_or_default().to_string();
    Ok((value("Busy"), value("Queued")))
}

pub async fn run(args: WaitingArgs) -> anyhow::Result<()> {
    let arrivals = Arrivals::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let witness = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/step", axum::routing::get(step))
        .with_state(arrivals.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let base = format!("http://{witness}");

    let dir = tempfile::tempdir()?;
    lay_out(dir.path(), &args.wasm, witness.port())?;
    // Every call is the operator's: one lane, as deep as the run needs.
    let lane = (args.calls + 16).to_string();
    let started: Started =
        start_platform_with_args(dir.path(), &["--max-queued-per-agent", &lane])?;
    let mut client = started.client().await?;
    let ready_by = Instant::now() + Duration::from_secs(120);
    loop {
        let warm = client.invoke(request(&base, "warm", 0)).await;
        match warm.map(|r| r.into_inner()) {
            Ok(call) if call.state == proto::CallState::Succeeded as i32 => break,
            _ if Instant::now() < ready_by => tokio::time::sleep(Duration::from_millis(250)).await,
            Ok(call) => anyhow::bail!("the warm-up call did not succeed: {call:?}"),
            Err(status) => anyhow::bail!("the warm-up call failed: {status}"),
        }
    }
    let cp = started.child.id();
    // At rest: the start's peak (the built-in runtimes' files) given back.
    let idle_mib = super::catalog::settled_rss_mib(cp)
        .await
        .context("no RSS of the control plane")?;

    // The one slot: a call that sleeps until it is cancelled.
    let sleeper = admit(&mut client, request(&base, "sleeper", 600_000), true).await?;
    let admitting = Instant::now();
    let mut ids = Vec::with_capacity(args.calls);
    for i in 0..args.calls {
        ids.push(admit(&mut client, request(&base, &format!("q{i}"), 0), false).await?);
    }
    let admitted_in = admitting.elapsed();
    let waiting_mib = super::catalog::settled_rss_mib(cp)
        .await
        .context("no RSS of the control plane")?;
    let (busy, queued) = pool_columns(&mut client).await?;
    anyhow::ensure!(
        busy == "1" && queued == args.calls.to_string(),
        "with {} calls waiting the pool shows Busy={busy} Queued={queued} (want 1 and {})",
        args.calls,
        args.calls
    );
    let sleeper_ran = arrivals.seen().iter().any(|r| r == "sleeper");
    anyhow::ensure!(!sleeper_ran, "the sleeper finished early");

    // Free the slot: the N drain through it, one at a time.
    client
        .cancel(proto::CancelRequest {
            call_id: sleeper.clone(),
        })
        .await?;
    let draining = Instant::now();
    let limit = Duration::from_secs(120) + Duration::from_millis(100) * args.calls as u32;
    let ran = loop {
        let ran: Vec<String> = arrivals
            .seen()
            .into_iter()
            .filter(|r| r.starts_with('q'))
            .collect();
        if ran.len() >= args.calls {
            break ran;
        }
        anyhow::ensure!(
            draining.elapsed() < limit,
            "only {} of {} waiting calls ran within {limit:?}",
            ran.len(),
            args.calls
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let drained_in = draining.elapsed();
    let expected: Vec<String> = (0..args.calls).map(|i| format!("q{i}")).collect();
    if ran != expected {
        let first = ran
            .iter()
            .zip(&expected)
            .position(|(a, b)| a != b)
            .unwrap_or(ran.len().min(expected.len()));
        anyhow::bail!(
            "the waiting calls did not run in admission order (or one ran twice): the \
             {first}th to run was {:?}, not {:?}",
            ran.get(first),
            expected.get(first)
        );
    }
    let last = client
        .get_call(proto::GetCallRequest {
            id: ids.last().cloned().unwrap_or_default(),
            wait: true,
            ..Default::default()
        })
        .await?
        .into_inner();
    anyhow::ensure!(
        last.state == proto::CallState::Succeeded as i32,
        "the last waiting call did not succeed: {last:?}"
    );

    let n = args.calls as f64;
    let grown = (waiting_mib - idle_mib).max(0.0);
    println!(
        "{} calls queued behind one busy slot (1 worker x 1 slot), admitted one at a time",
        args.calls
    );
    println!(
        "{:<52} {:>10.1} MiB",
        "control plane RSS, idle (baseline)", idle_mib
    );
    println!(
        "{:<52} {:>10.1} MiB  (+{grown:.1} MiB, {:.1} KiB per waiting call; bar +100 MiB)",
        format!("control plane RSS, {} calls waiting", args.calls),
        waiting_mib,
        grown * 1024.0 / n
    );
    println!(
        "{:<52} {:>10}      (the sleeper's; Queued={queued})",
        "worker slots busy while they wait", busy
    );
    println!(
        "{:<52} {:>10.0} calls/s",
        "admission, one at a time",
        n / admitted_in.as_secs_f64()
    );
    println!(
        "{:<52} {:>10.0} calls/s  ({:.1} s, in admission order, each once)",
        "drain through the one slot",
        n / drained_in.as_secs_f64(),
        drained_in.as_secs_f64()
    );
    Ok(())
}
