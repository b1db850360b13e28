//! `toolgrid bench failover`: SIGKILL the worker of a running call, again and again, and
//! measure how long the call takes to finish on another worker beyond the tool's own work
//! there (its run, replay included, as the finishing worker reports it).

use super::sample::Sample;
use anyhow::Context;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use toolgrid_proto as proto;

#[derive(clap::Args, Debug)]
pub struct FailoverArgs {
    /// Calls to fail over (each with one SIGKILL mid-call).
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Steps of the tool (a POST, computation and a GET each).
    #[arg(long, default_value_t = 4)]
    steps: u32,
    /// Computation per step (rounds of mixing, about 2.5 ns each).
    #[arg(long, default_value_t = 8_000_000)]
    work: u64,
    /// How long the loopback server takes to answer each request.
    #[arg(long, default_value = "10ms")]
    server_delay: toolgrid_api::units::GoDuration,
    /// The tool: a WASI module taking `run --base --run --steps --work`.
    #[arg(long, default_value = "tests/fixtures/tools/effects/effects.wasm")]
    wasm: PathBuf,
}

struct Processes {
    up: Child,
    workers: Vec<(String, Child)>,
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, worker) in &mut self.workers {
            let _ = worker.kill();
            let _ = worker.wait();
        }
        let _ = self.up.kill();
        let _ = self.up.wait();
    }
}

fn spawn_worker(grpc: &str, id: &str, cache: &Path, token: &Path) -> anyhow::Result<Child> {
    Ok(Command::new(std::env::current_exe()?)
        .args([
            "worker",
            "--control-plane",
            &format!("http://{grpc}"),
            "--id",
            id,
            "--pool",
            "default",
            "--slots",
            "4",
        ])
        .arg("--cache")
        .arg(cache)
        .arg("--join-token-file")
        .arg(token)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

async fn serve_witness(delay: Duration) -> anyhow::Result<std::net::SocketAddr> {
    let app = axum::Router::new().fallback(move || async move {
        tokio::time::sleep(delay).await;
        "{\"ok\": true}"
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

fn manifest(wasm: &Path, port: u16) -> String {
    format!(
        r#"apiVersion: toolgrid.dev/v1alpha1
kind: WorkerPool
metadata: {{name: default}}
spec: {{replicas: 1, slotsPerWorker: 4}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: effects}}
spec:
  effect: idempotent
  timeout: 120s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: steps, schema: {{type: integer}}, default: 4}}
        - {{name: work, schema: {{type: integer}}, default: 0}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: effects-1.0.0}}
spec:
  tool: effects
  version: 1.0.0
  artifact: {{file: {}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
"#,
        wasm.display()
    )
}

pub async fn run(args: FailoverArgs) -> anyhow::Result<()> {
    let wasm = args
        .wasm
        .canonicalize()
        .with_context(|| format!("cannot find {}", args.wasm.display()))?;
    let witness = serve_witness(args.server_delay.get()).await?;
    let dir = tempfile::tempdir()?;
    let manifests = dir.path().join("manifests");
    std::fs::create_dir_all(&manifests)?;
    std::fs::write(
        manifests.join("effects.yaml"),
        manifest(&wasm, witness.port()),
    )?;
    let mut up = Command::new(std::env::current_exe()?)
        .arg("up")
        .arg("--manifests")
        .arg(&manifests)
        .arg("--data")
        .arg(dir.path().join("data"))
        .args(["--listen", "127.0.0.1:0", "--no-workers"])
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = up.stdout.take().context("no stdout")?;
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("toolgrid is ready:"))
        .context("toolgrid up exited before it was ready")?;
    let grpc = ready
        .split_whitespace()
        .find_map(|w| w.strip_prefix("grpc="))
        .context("no grpc= in the ready line")?
        .to_string();
    let cache = dir.path().join("cache");
    let join_token = dir
        .path()
        .join("data")
        .join(toolgrid_control_plane::auth::worker::JOIN_TOKEN_FILE);
    let mut processes = Processes {
        up,
        workers: Vec::new(),
    };
    for i in 0..args.workers.max(2) {
        let id = format!("bench-{i}");
        processes
            .workers
            .push((id.clone(), spawn_worker(&grpc, &id, &cache, &join_token)?));
    }
    let channel = Channel::from_shared(format!("http://{grpc}"))?
        .connect()
        .await?;
    let token = super::up::admin_token(&dir.path().join("data"))?;
    let mut client = super::client::client_of(
        channel,
        super::client::Credentials::new(Some(&token), None)?,
    );
    let request = |run: &str| proto::InvokeRequest {
        tool: "effects".into(),
        command: "run".into(),
        args_json: serde_json::json!({
            "base": format!("http://{witness}"), "run": run, "steps": args.steps, "work": args.work
        })
        .to_string(),
        ..Default::default()
    };
    // Warm up every worker (each compiles the release), then time clean runs.
    let mut clean = Vec::new();
    for i in 0..(args.workers * 3).max(6) {
        let begin = Instant::now();
        let call = client
            .invoke(request(&format!("warm-{i}")))
            .await?
            .into_inner();
        anyhow::ensure!(
            call.state == proto::CallState::Succeeded as i32,
            "a clean run failed: {:?}",
            call.error
        );
        clean.push(begin.elapsed());
    }
    let clean = Sample {
        wall: clean.iter().sum(),
        latencies: clean,
    };
    let window = Duration::from_secs_f64(clean.percentile(0.5) / 1000.0 * 0.8);

    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let mut overheads = Vec::new();
    let mut to_fence = Vec::new();
    let mut to_reassign = Vec::new();
    let mut attempts = 0;
    while overheads.len() < args.runs {
        attempts += 1;
        anyhow::ensure!(
            attempts <= args.runs * 4,
            "could not kill enough calls mid-run"
        );
        let mut stream = client
            .invoke_stream(request(&format!("kill-{attempts}")))
            .await?
            .into_inner();
        let mut call_id = String::new();
        let worker = loop {
            let event = stream.message().await?.context("the stream ended early")?;
            match event.event {
                Some(proto::invoke_event::Event::Progress(p)) if p.stage == "accepted" => {
                    call_id = p.call_id
                }
                Some(proto::invoke_event::Event::Progress(p)) if p.stage == "running" => {
                    break p.worker;
                }
                Some(proto::invoke_event::Event::Call(_)) => {
                    anyhow::bail!("the call ended before it ran")
                }
                _ => {}
            }
        };
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pause = window.mul_f64((seed >> 11) as f64 / (1u64 << 53) as f64);
        tokio::time::sleep(pause).await;
        let index = processes
            .workers
            .iter()
            .position(|(id, _)| *id == worker)
            .context("the call ran on an unknown worker")?;
        let killed_at = Instant::now();
        let killed_ms = toolgrid_store::now_ms();
        processes.workers[index].1.kill()?;
        let _ = processes.workers[index].1.wait();
        processes.workers[index].1 = spawn_worker(&grpc, &worker, &cache, &join_token)?;
        let call = loop {
            let event = stream.message().await?.context("the stream ended early")?;
            if let Some(proto::invoke_event::Event::Call(call)) = event.event {
                break call;
            }
        };
        let total = killed_at.elapsed();
        let oplog = super::client::oplog_of(&mut client, &call_id)
            .await?
            .entries;
        let assignments = oplog.iter().filter(|e| e.kind == "assigned").count();
        if assignments < 2 {
            continue; // It finished before the kill: not a failover.
        }
        anyhow::ensure!(
            call.state == proto::CallState::Succeeded as i32,
            "a failed-over call failed: {:?}",
            call.error
        );
        let outcome: serde_json::Value = serde_json::from_str(
            &oplog
                .last()
                .map(|e| e.payload_json.clone())
                .unwrap_or_default(),
        )?;
        let run = Duration::from_micros(outcome["runMicros"].as_u64().unwrap_or_default());
        overheads.push(total.saturating_sub(run));
        if let Some(fenced) = oplog.iter().find(|e| e.kind == "fenced") {
            to_fence.push(Duration::from_millis(
                (fenced.recorded_at_ms - killed_ms).max(0) as u64,
            ));
        }
        if let Some(assigned) = oplog.iter().rev().find(|e| e.kind == "assigned") {
            to_reassign.push(Duration::from_millis(
                (assigned.recorded_at_ms - killed_ms).max(0) as u64,
            ));
        }
    }
    let sample = |latencies: Vec<Duration>| Sample {
        wall: latencies.iter().sum(),
        latencies,
    };
    println!(
        "toolgrid bench failover: {} SIGKILLs of a call's worker ({} workers, effects: {} steps, {} rounds of work per step, server delay {})",
        args.runs, args.workers, args.steps, args.work, args.server_delay
    );
    println!("{:<52} {:>9} {:>9} {:>9}", "", "p50 ms", "p99 ms", "max ms");
    let row = |name: &str, s: &Sample| {
        let max = s
            .latencies
            .iter()
            .max()
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or_default();
        println!(
            "{name:<52} {:>9.1} {:>9.1} {:>9.1}",
            s.percentile(0.5),
            s.percentile(0.99),
            max
        );
    };
    row(
        "SIGKILL -> completion, minus the tool's own run",
        &sample(overheads),
    );
    row(
        "SIGKILL -> call fenced (store clock, ms)",
        &sample(to_fence),
    );
    row(
        "SIGKILL -> reassigned (store clock, ms)",
        &sample(to_reassign),
    );
    row("baseline: a whole clean call, no kill", &clean);
    Ok(())
}
