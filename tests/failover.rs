//! Exactly-once calls under fire: workers and the control plane are killed (SIGKILL) or
//! paused (SIGSTOP) mid-call, against real processes, with an independent witness (an HTTP
//! server on loopback) that records every request with its idempotency key.

use crate::common;

use common::witness::{Seen, Witness};
use common::{Platform, WorkerProcess, error_kind, fixtures};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use toolgrid_proto as proto;

fn fixture(name: &str) -> PathBuf {
    fixtures::repo().join(format!("tests/fixtures/tools/{name}/{name}.wasm"))
}

/// A Tool like the `effects` fixtures (`run --base --run --steps --work`, and for
/// effects-http `--concurrency`) and its release.
fn effects_tool(name: &str, wasm: &str, effect: &str, port: u16, egress: &str) -> String {
    let egress = if egress.is_empty() {
        format!("[{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]")
    } else {
        egress.to_string()
    };
    let concurrency = if wasm == "effects-http" {
        "\n        - {name: concurrency, schema: {type: integer, minimum: 1, maximum: 2}, default: 1}"
    } else {
        ""
    };
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec:
  effect: {effect}
  timeout: 60s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: steps, schema: {{type: integer, minimum: 1}}, default: 5}}
        - {{name: work, schema: {{type: integer, minimum: 0}}, default: 2000000}}{concurrency}
      result: {{type: object, required: [run]}}
      errors:
        - {{name: request-failed, exitCode: 3}}
        - {{name: egress-denied, exitCode: 4}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: {name}-1.0.0}}
spec:
  tool: {name}
  version: 1.0.0
  artifact: {{file: {}}}
  network: {{egress: {egress}}}
"#,
        fixture(wasm).display()
    )
}

fn divergent_tool(port: u16) -> String {
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: divergent}}
spec:
  effect: write
  timeout: 60s
  commands:
    - name: run
      options:
        - {{name: base, schema: {{type: string}}, required: true}}
        - {{name: run, schema: {{type: string}}, required: true}}
        - {{name: work, schema: {{type: integer, minimum: 0}}, default: 2000000}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: divergent-1.0.0}}
spec:
  tool: divergent
  version: 1.0.0
  artifact: {{file: {}}}
  network: {{egress: [{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}]}}
"#,
        fixture("divergent").display()
    )
}

const POOL: &str = "apiVersion: toolgrid.dev/v1alpha1\nkind: WorkerPool\nmetadata: {name: default}\nspec: {replicas: 2, slotsPerWorker: 4}\n";

/// The platform's manifests: a pool and the HTTP tools, allowed to reach the witness.
fn manifests(root: &Path, witness: &Witness) -> PathBuf {
    let dir = root.join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let port = witness.addr.port();
    let mut text = POOL.to_string();
    text += &effects_tool("write-p1", "effects", "write", port, "");
    text += &effects_tool("idempotent-p1", "effects", "idempotent", port, "");
    text += &effects_tool("idempotent-p2", "effects-http", "idempotent", port, "");
    text += &effects_tool("write-p2", "effects-http", "write", port, "");
    text += &divergent_tool(port);
    std::fs::write(dir.join("tools.yaml"), text).unwrap();
    dir
}

/// A small deterministic generator, so a failing run can be repeated from its seed.
struct Lcg(u64);

impl Lcg {
    fn from_time() -> Lcg {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        eprintln!("random seed: {seed}");
        Lcg(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

fn request(tool: &str, run: &str, base: &str, steps: u32, work: u64) -> proto::InvokeRequest {
    proto::InvokeRequest {
        tool: tool.into(),
        command: "run".into(),
        args_json: serde_json::json!({"base": base, "run": run, "steps": steps, "work": work})
            .to_string(),
        idempotency_key: format!("key-{run}"),
        ..Default::default()
    }
}

/// News of a streamed call.
enum News {
    Accepted(String),
    Running(String),
    Done(Box<proto::Call>),
    Broken,
}

/// Starts a call over `InvokeStream`, forwarding its news.
async fn start_call(
    platform: &Platform,
    request: proto::InvokeRequest,
) -> tokio::sync::mpsc::UnboundedReceiver<News> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut client = platform.client().await;
    tokio::spawn(async move {
        let mut stream = match client.invoke_stream(request).await {
            Ok(response) => response.into_inner(),
            Err(_) => {
                let _ = tx.send(News::Broken);
                return;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(event)) => match event.event {
                    Some(proto::invoke_event::Event::Progress(p)) if p.stage == "accepted" => {
                        let _ = tx.send(News::Accepted(p.call_id));
                    }
                    Some(proto::invoke_event::Event::Progress(p)) if p.stage == "running" => {
                        let _ = tx.send(News::Running(p.worker));
                    }
                    Some(proto::invoke_event::Event::Call(call)) => {
                        let _ = tx.send(News::Done(Box::new(call)));
                        return;
                    }
                    _ => {}
                },
                _ => {
                    let _ = tx.send(News::Broken);
                    return;
                }
            }
        }
    });
    rx
}

/// The id of a streamed call, once it is accepted.
async fn accepted(news: &mut tokio::sync::mpsc::UnboundedReceiver<News>) -> String {
    loop {
        match news.recv().await {
            Some(News::Accepted(id)) => return id,
            Some(_) => {}
            None => panic!("the call was not accepted"),
        }
    }
}

/// Waits until the witness has seen an effect of `run`.
async fn first_effect(witness: &Witness, run: &str) {
    assert!(
        witness
            .wait_for(Duration::from_secs(30), |seen| seen
                .iter()
                .any(|s| s.body.contains(run)))
            .await,
        "no effect of {run} reached the witness"
    );
}

/// Follows a streamed call to its end (asking the store if the stream breaks).
async fn wait_done(
    news: &mut tokio::sync::mpsc::UnboundedReceiver<News>,
    platform: &Platform,
    call_id: &str,
) -> proto::Call {
    loop {
        match tokio::time::timeout(Duration::from_secs(60), news.recv())
            .await
            .expect("the call ends")
        {
            Some(News::Done(call)) => return *call,
            Some(News::Broken) | None => return get_call(platform, call_id).await,
            _ => {}
        }
    }
}

/// The call once it has ended.
async fn get_call(platform: &Platform, id: &str) -> proto::Call {
    fetch_call(platform, id, true).await
}

async fn fetch_call(platform: &Platform, id: &str, wait: bool) -> proto::Call {
    let mut client = platform.client().await;
    client
        .get_call(proto::GetCallRequest {
            id: id.into(),
            wait,
            ..Default::default()
        })
        .await
        .expect("get call")
        .into_inner()
}

fn payload(entry: &proto::OplogRecord) -> Value {
    serde_json::from_str(&entry.payload_json).unwrap()
}

/// Has the witness ask the control plane (GetOplog, which reads the store), as each request
/// arrives and before it is answered, whether that request's `http-request` entry with its
/// key is already durable: a worker that sent first and committed after fails
/// [`Ledger::check`]. While the control plane restarts the probe asks again.
fn probe_commit_before_send(witness: &Witness, platform: &Platform) {
    let endpoint = format!("http://{}", platform.grpc);
    let token = platform.admin_token();
    witness.set_probe(move |seen| {
        let endpoint = endpoint.clone();
        let token = token.clone();
        async move {
            let key = seen.key.clone().ok_or("no Idempotency-Key")?;
            let (call_id, seq) = key
                .strip_prefix("toolgrid-")
                .and_then(|rest| rest.rsplit_once('-'))
                .ok_or_else(|| format!("{key} is not a toolgrid key"))?;
            let seq: u64 = seq.parse().map_err(|_| format!("{key}: no number"))?;
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let asked = async {
                    let channel = tonic::transport::Channel::from_shared(endpoint.clone())
                        .map_err(|e| e.to_string())?
                        .connect()
                        .await
                        .map_err(|e| e.to_string())?;
                    let credentials =
                        toolgrid::cli::client::Credentials::new(Some(&token), None)
                            .map_err(|e| e.to_string())?;
                    let mut client = toolgrid::cli::client::client_of(channel, credentials);
                    toolgrid::cli::client::oplog_of(&mut client, call_id)
                        .await
                        .map(|r| r.entries)
                        .map_err(|e| e.to_string())
                }
                .await;
                match asked {
                    Ok(entries) => {
                        let durable = entries.iter().filter(|e| e.kind == "http-request").any(|e| {
                            let p = payload(e);
                            p["seq"].as_u64() == Some(seq) && p["idempotencyKey"] == key.as_str()
                        });
                        return if durable {
                            Ok(())
                        } else {
                            Err(format!(
                                "its http-request entry was not in the durable oplog of {call_id} when it arrived"
                            ))
                        };
                    }
                    Err(why) if Instant::now() > deadline => {
                        return Err(format!("could not read the oplog of {call_id}: {why}"));
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        }
    });
}

/// The checks every test makes of what the witness saw against the oplogs.
struct Ledger {
    /// Oplog of every call, by id.
    oplogs: HashMap<String, Vec<proto::OplogRecord>>,
    /// Tool of every call, by id.
    tools: HashMap<String, String>,
}

impl Ledger {
    fn new() -> Ledger {
        Ledger {
            oplogs: HashMap::new(),
            tools: HashMap::new(),
        }
    }

    async fn add(&mut self, platform: &Platform, call: &proto::Call) {
        self.oplogs
            .insert(call.id.clone(), platform.oplog(&call.id).await);
        self.tools.insert(call.id.clone(), call.tool.clone());
    }

    /// No effect was applied twice without the same key; the oplog knows every request the
    /// witness saw, and knew it durably when the request arrived (the probe); a write tool's
    /// POST was never sent twice.
    fn check(&self, seen: &[Seen]) {
        for request in seen {
            match &request.probe {
                Some(Ok(())) => {}
                Some(Err(why)) => panic!(
                    "commit before send: {} {} ({:?}): {why}",
                    request.method, request.path, request.key
                ),
                None => panic!(
                    "{} {} arrived without the commit-before-send probe",
                    request.method, request.path
                ),
            }
        }
        // An effect is a POST with its body (each names its run and step).
        let mut keys_by_effect: BTreeMap<(String, String, String), Vec<String>> = BTreeMap::new();
        for request in seen {
            let key = request
                .key
                .clone()
                .expect("every request carries an Idempotency-Key");
            if request.method == "POST" {
                keys_by_effect
                    .entry((
                        request.method.clone(),
                        request.path.clone(),
                        request.body.clone(),
                    ))
                    .or_default()
                    .push(key.clone());
            }
            // toolgrid-<call id>-<n>
            let rest = key.strip_prefix("toolgrid-").expect("a toolgrid key");
            let (call_id, seq) = rest.rsplit_once('-').unwrap();
            let oplog = self
                .oplogs
                .get(call_id)
                .unwrap_or_else(|| panic!("the witness saw {key} of an unknown call"));
            let started = oplog
                .iter()
                .filter(|e| e.kind == "http-request")
                .map(payload)
                .find(|p| {
                    p["seq"].as_u64() == seq.parse().ok() && p["method"] == request.method.as_str()
                });
            let started = started.unwrap_or_else(|| {
                panic!(
                    "the witness saw {} {} with {key}, which the oplog does not know",
                    request.method, request.path
                )
            });
            assert!(
                started["url"].as_str().unwrap().ends_with(&request.path),
                "{started} vs {}",
                request.path
            );
        }
        for ((method, path, body), keys) in &keys_by_effect {
            let first = &keys[0];
            assert!(
                keys.iter().all(|k| k == first),
                "{method} {path} {body} was applied with different keys: {keys:?}"
            );
        }
        for request in seen.iter().filter(|r| r.method == "POST") {
            let key = request.key.clone().unwrap();
            let call_id = key
                .strip_prefix("toolgrid-")
                .unwrap()
                .rsplit_once('-')
                .unwrap()
                .0;
            if self
                .tools
                .get(call_id)
                .is_some_and(|t| t.starts_with("write"))
            {
                let times = seen
                    .iter()
                    .filter(|r| r.key.as_deref() == Some(key.as_str()))
                    .count();
                assert_eq!(
                    times, 1,
                    "a write tool's POST {key} reached the witness {times} times"
                );
            }
        }
    }
}

/// An ended call is either complete (every step's POST reached the witness) or ended
/// `outcome-unknown` exactly where the rules say: a write tool with a POST whose start was
/// committed and whose outcome was not.
fn check_outcome(
    call: &proto::Call,
    oplog: &[proto::OplogRecord],
    seen: &[Seen],
    run: &str,
    steps: u32,
) {
    if call.state == proto::CallState::Succeeded as i32 {
        let result: Value = serde_json::from_str(&call.result_json).unwrap();
        assert_eq!(result["run"], run);
        for step in 1..=steps {
            let body = format!("{{\"run\":\"{run}\",\"step\":{step}}}");
            assert!(
                seen.iter().any(|s| s.method == "POST" && s.body == body),
                "call {} succeeded but step {step} never reached the witness",
                call.id
            );
        }
        return;
    }
    let error = call.error.clone().unwrap_or_default();
    assert_eq!(
        error.kind, "outcome-unknown",
        "call {} ({}) failed: {error:?}",
        call.id, call.tool
    );
    assert!(
        call.tool.starts_with("write"),
        "an idempotent tool never ends outcome-unknown"
    );
    assert!(error.message.contains("POST"), "{}", error.message);
    // The request it names was started under an earlier epoch and never finished.
    let seq: u64 = error
        .message
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("names the request");
    let started = oplog
        .iter()
        .any(|e| e.kind == "http-request" && payload(e)["seq"] == seq);
    let finished = oplog.iter().any(|e| {
        matches!(
            e.kind.as_str(),
            "http-response" | "http-error" | "http-denied"
        ) && payload(e)["seq"] == seq
    });
    assert!(
        started && !finished,
        "request {seq} of {} must be started and unfinished",
        call.id
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_killed_at_random_points_never_apply_an_effect_twice() {
    let witness = Witness::start().await;
    witness.set_delay(Duration::from_millis(15));
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    probe_commit_before_send(&witness, &platform);
    let mut workers: Vec<WorkerProcess> = (0..3)
        .map(|i| WorkerProcess::start(&platform, &format!("w{i}"), 4, root.path()))
        .collect();
    let mut rng = Lcg::from_time();
    let tools = ["write-p1", "idempotent-p2", "idempotent-p1", "write-p2"];
    let steps = 4;
    let mut ledger = Ledger::new();
    let mut outcomes = Vec::new();
    let mut kills = 0;
    let mut attempt = 0;
    while kills < 20 {
        attempt += 1;
        assert!(
            attempt <= 60,
            "could not land 20 kills mid-call in 60 calls"
        );
        let tool = tools[attempt % tools.len()];
        let run = format!("r{attempt}");
        let loop_start = Instant::now();
        let mut news = start_call(
            &platform,
            request(tool, &run, &witness.base(), steps, 2_000_000),
        )
        .await;
        let mut call_id = String::new();
        let worker = loop {
            match tokio::time::timeout(Duration::from_secs(30), news.recv())
                .await
                .expect("news of the call")
            {
                Some(News::Accepted(id)) => call_id = id,
                Some(News::Running(worker)) => break worker,
                Some(News::Done(call)) => panic!("the call ended before it ran: {call:?}"),
                _ => panic!("the call stream broke"),
            }
        };
        if std::env::var("TIMELINE").is_ok() {
            eprintln!("running after {:?}", loop_start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(rng.below(180))).await;
        let index = workers
            .iter()
            .position(|w| w.id == worker)
            .expect("a worker of ours");
        let was_running = fetch_call(&platform, &call_id, false).await;
        workers[index].signal(libc::SIGKILL);
        let kill_at = toolgrid_store::now_ms();
        workers[index].kill();
        if was_running.finished_at_ms == 0 {
            kills += 1;
        }
        workers[index] = WorkerProcess::start(&platform, &worker, 4, root.path());
        if std::env::var("TIMELINE").is_ok() {
            eprintln!("killed and restarted after {:?}", loop_start.elapsed());
        }
        let call = wait_done(&mut news, &platform, &call_id).await;
        assert_ne!(call.state, proto::CallState::Running as i32);
        ledger.add(&platform, &call).await;
        if std::env::var("TIMELINE").is_ok() {
            eprintln!("done after {:?}", loop_start.elapsed());
            let t0 = ledger.oplogs[&call.id][0].recorded_at_ms;
            let line: Vec<String> = ledger.oplogs[&call.id]
                .iter()
                .map(|e| format!("{}@{}", e.kind, e.recorded_at_ms - t0))
                .collect();
            eprintln!(
                "{} {:?} kill@{}: {}",
                call.tool,
                call.state,
                kill_at - t0,
                line.join(" ")
            );
        }
        outcomes.push((call, run));
    }
    let seen = witness.seen();
    for (call, run) in &outcomes {
        check_outcome(call, &ledger.oplogs[&call.id], &seen, run, steps);
    }
    ledger.check(&seen);

    // Failed-over calls show each assignment, the fence, the replay and who finished.
    let moved: Vec<&proto::Call> = outcomes
        .iter()
        .map(|(c, _)| c)
        .filter(|c| {
            ledger.oplogs[&c.id]
                .iter()
                .filter(|e| e.kind == "assigned")
                .count()
                > 1
        })
        .collect();
    assert!(
        moved.len() >= 10,
        "most killed calls moved to another worker ({} did)",
        moved.len()
    );
    for call in moved {
        let oplog = &ledger.oplogs[&call.id];
        let kinds: Vec<&str> = oplog.iter().map(|e| e.kind.as_str()).collect();
        assert!(kinds.contains(&"fenced"), "{kinds:?}");
        assert!(kinds.contains(&"replay"), "{kinds:?}");
        let last_assigned = oplog.iter().rev().find(|e| e.kind == "assigned").unwrap();
        let outcome = oplog.last().unwrap();
        assert_eq!(outcome.kind, "outcome");
        assert_eq!(
            payload(outcome)["worker"],
            payload(last_assigned)["worker"],
            "the outcome names the finishing worker"
        );
        assert_eq!(outcome.epoch, last_assigned.epoch);
        let epochs: Vec<u64> = oplog.iter().map(|e| e.epoch).collect();
        assert!(
            epochs.windows(2).all(|w| w[0] <= w[1]),
            "epochs only grow: {epochs:?}"
        );
    }
    let unknown = outcomes
        .iter()
        .filter(|(c, _)| c.state == proto::CallState::Failed as i32)
        .count();
    eprintln!(
        "{kills} kills mid-call over {} calls; {unknown} ended outcome-unknown",
        outcomes.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_worker_loses_its_call_and_is_fenced_when_it_wakes() {
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    probe_commit_before_send(&witness, &platform);
    let workers: Vec<WorkerProcess> = (0..2)
        .map(|i| WorkerProcess::start(&platform, &format!("p{i}"), 4, root.path()))
        .collect();
    let steps = 8;
    let mut news = start_call(
        &platform,
        request(
            "idempotent-p1",
            "paused",
            &witness.base(),
            steps,
            40_000_000,
        ),
    )
    .await;
    let mut call_id = String::new();
    let worker = loop {
        match news.recv().await {
            Some(News::Accepted(id)) => call_id = id,
            Some(News::Running(worker)) => break worker,
            _ => panic!("the call did not start"),
        }
    };
    let paused = workers.iter().find(|w| w.id == worker).unwrap();
    first_effect(&witness, "paused").await;
    paused.signal(libc::SIGSTOP);

    // The lease lapses and the call finishes on the other worker.
    let call = wait_done(&mut news, &platform, &call_id).await;
    assert_eq!(
        call.state,
        proto::CallState::Succeeded as i32,
        "{:?}",
        call.error
    );
    assert_ne!(call.worker, worker, "another worker finished it");
    let oplog = platform.oplog(&call.id).await;
    let fenced = oplog
        .iter()
        .find(|e| e.kind == "fenced")
        .expect("the paused worker was fenced");
    assert!(
        payload(fenced)["reason"]
            .as_str()
            .unwrap()
            .contains("lease"),
        "{}",
        fenced.payload_json
    );

    // It wakes up: its next commit is refused and nothing more leaves it.
    let woke = Instant::now();
    paused.signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let late: Vec<Seen> = witness
        .seen()
        .into_iter()
        .filter(|s| s.at > woke && s.attempt.as_deref() == Some("1"))
        .collect();
    assert!(
        late.is_empty(),
        "the fenced worker still reached the witness: {late:?}"
    );
    let logs = paused.logs();
    assert!(
        logs.contains("abandon"),
        "the paused worker abandons the call:\n{logs}"
    );
    let mut ledger = Ledger::new();
    ledger.add(&platform, &call).await;
    ledger.check(&witness.seen());
    check_outcome(&call, &oplog, &witness.seen(), "paused", steps);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_control_plane_killed_mid_call_loses_no_accepted_call() {
    let witness = Witness::start().await;
    witness.set_delay(Duration::from_millis(20));
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let mut platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    probe_commit_before_send(&witness, &platform);
    let workers: Vec<WorkerProcess> = (0..2)
        .map(|i| WorkerProcess::start(&platform, &format!("c{i}"), 4, root.path()))
        .collect();
    let tools = [
        "idempotent-p1",
        "idempotent-p2",
        "write-p1",
        "write-p2",
        "idempotent-p1",
        "idempotent-p2",
    ];
    let steps = 6;
    let mut accepted = Vec::new();
    let mut streams = Vec::new();
    for (i, tool) in tools.iter().enumerate() {
        let run = format!("cp{i}");
        let mut news = start_call(
            &platform,
            request(tool, &run, &witness.base(), steps, 8_000_000),
        )
        .await;
        match news.recv().await {
            Some(News::Accepted(id)) => accepted.push((id, run, tool.to_string())),
            _ => panic!("call {i} was not accepted"),
        }
        streams.push(news);
    }
    // Let them get going, then kill the control plane under them and start it again.
    assert!(
        witness
            .wait_for(Duration::from_secs(30), |seen| seen.len() >= 6)
            .await
    );
    platform.restart(libc::SIGKILL);

    let mut ledger = Ledger::new();
    let mut client = platform.client().await;
    for (id, run, tool) in &accepted {
        let call = get_call(&platform, id).await;
        assert!(
            call.state == proto::CallState::Succeeded as i32
                || call.state == proto::CallState::Failed as i32,
            "{call:?}"
        );
        if tool.starts_with("idempotent") {
            assert_eq!(
                call.state,
                proto::CallState::Succeeded as i32,
                "{tool}: {:?}",
                call.error
            );
        }
        // The caller can find it again by its idempotency key, too.
        let by_key = client
            .get_call(proto::GetCallRequest {
                idempotency_key: format!("key-{run}"),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(&by_key.id, id);
        ledger.add(&platform, &call).await;
        check_outcome(&call, &ledger.oplogs[id], &witness.seen(), run, steps);
    }
    ledger.check(&witness.seen());
    // The workers outlived the control plane and attached to the new one.
    for worker in &workers {
        let attached = worker.logs().matches("attached to").count();
        assert!(
            attached >= 2,
            "worker {} re-attached:\n{}",
            worker.id,
            worker.logs()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_survive_a_restart_of_toolgrid_up_with_its_own_workers() {
    let witness = Witness::start().await;
    witness.set_delay(Duration::from_millis(20));
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let mut platform = Platform::start(root.path(), &manifests, &["--lease", "1s"]);
    probe_commit_before_send(&witness, &platform);
    let steps = 6;
    let mut accepted = Vec::new();
    for i in 0..3 {
        let run = format!("own{i}");
        let mut news = start_call(
            &platform,
            request("idempotent-p1", &run, &witness.base(), steps, 8_000_000),
        )
        .await;
        match news.recv().await {
            Some(News::Accepted(id)) => accepted.push((id, run)),
            _ => panic!("not accepted"),
        }
    }
    assert!(
        witness
            .wait_for(Duration::from_secs(30), |seen| seen.len() >= 3)
            .await
    );
    platform.restart(libc::SIGKILL);
    let mut ledger = Ledger::new();
    for (id, run) in &accepted {
        let call = get_call(&platform, id).await;
        assert_eq!(
            call.state,
            proto::CallState::Succeeded as i32,
            "{:?}",
            call.error
        );
        ledger.add(&platform, &call).await;
        check_outcome(&call, &ledger.oplogs[id], &witness.seen(), run, steps);
    }
    ledger.check(&witness.seen());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn egress_refuses_denied_hosts_private_addresses_and_names_of_loopback() {
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let port = witness.addr.port();
    let dir = root.path().join("manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let rules = format!(
        "[{{host: 127.0.0.1, ports: [{port}], allowPrivate: true}}, {{host: localhost, ports: [{port}]}}, {{host: 10.20.30.40, ports: [80]}}]"
    );
    let text = format!(
        "{POOL}{}",
        effects_tool("fenced-in", "effects", "read", port, &rules)
    );
    std::fs::write(dir.join("tools.yaml"), text).unwrap();
    let platform = Platform::start(root.path(), &dir, &[]);

    let ok = platform
        .invoke(request("fenced-in", "allowed", &witness.base(), 1, 0))
        .await
        .unwrap();
    assert_eq!(
        ok.state,
        proto::CallState::Succeeded as i32,
        "{:?}",
        ok.error
    );
    for (base, why) in [
        (format!("http://localhost:{port}"), "loopback"),
        ("http://10.20.30.40".to_string(), "private"),
        (format!("http://elsewhere.invalid:{port}"), "not allowed"),
    ] {
        let mut req = request("fenced-in", "denied", &base, 1, 0);
        req.idempotency_key.clear();
        let call = platform.invoke(req).await.unwrap();
        let error = call.error.clone().unwrap();
        assert_eq!(
            (error.kind.as_str(), error.name.as_str()),
            ("tool-error", "egress-denied"),
            "{base}: {error:?}"
        );
        let oplog = platform.oplog(&call.id).await;
        let denied = oplog
            .iter()
            .find(|e| e.kind == "http-denied")
            .unwrap_or_else(|| panic!("{base}: no http-denied entry"));
        assert!(
            payload(denied)["message"].as_str().unwrap().contains(why),
            "{base}: {}",
            denied.payload_json
        );
    }
    let seen = witness.seen();
    assert!(
        seen.iter()
            .all(|s| s.body.contains("allowed") || s.path.contains("allowed")),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tool_that_depends_on_something_outside_the_oplog_is_caught() {
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    probe_commit_before_send(&witness, &platform);
    let mut workers: Vec<WorkerProcess> = (0..2)
        .map(|i| WorkerProcess::start(&platform, &format!("d{i}"), 4, root.path()))
        .collect();
    let req = proto::InvokeRequest {
        tool: "divergent".into(),
        command: "run".into(),
        args_json:
            serde_json::json!({"base": witness.base(), "run": "div", "work": 100_000_000u64})
                .to_string(),
        ..Default::default()
    };
    let mut news = start_call(&platform, req).await;
    let mut call_id = String::new();
    let worker = loop {
        match news.recv().await {
            Some(News::Accepted(id)) => call_id = id,
            Some(News::Running(worker)) => break worker,
            _ => panic!("the call did not start"),
        }
    };
    // Once its first request is out, the worker dies during the computation after it.
    assert!(
        witness
            .wait_for(Duration::from_secs(30), |seen| seen
                .iter()
                .any(|s| s.path == "/first"))
            .await
    );
    let index = workers.iter().position(|w| w.id == worker).unwrap();
    workers[index].kill();
    let call = wait_done(&mut news, &platform, &call_id).await;
    let error = call.error.clone().expect("the replay diverged");
    assert_eq!(error.kind, "replay-divergence", "{error:?}");
    assert!(
        error.message.contains("/first") && error.message.contains("/retry-2"),
        "{}",
        error.message
    );
    let paths: Vec<String> = witness.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(
        paths,
        ["/first"],
        "the diverging request never left the sandbox"
    );
    witness.assert_probes_passed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_corrupted_oplog_entry_ends_the_replay_as_a_divergence_naming_it() {
    use sqlx::Connection as _;
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    let mut workers: Vec<WorkerProcess> = (0..2)
        .map(|i| WorkerProcess::start(&platform, &format!("c{i}"), 4, root.path()))
        .collect();
    let mut news = start_call(
        &platform,
        request("idempotent-p1", "corrupt", &witness.base(), 8, 40_000_000),
    )
    .await;
    let mut call_id = String::new();
    let worker = loop {
        match news.recv().await {
            Some(News::Accepted(id)) => call_id = id,
            Some(News::Running(worker)) => break worker,
            _ => panic!("the call did not start"),
        }
    };
    // Its first response is durable: the oplog has an http-response entry.
    platform
        .eventually("a recorded response", Duration::from_secs(30), || {
            let (platform, id) = (&platform, call_id.clone());
            async move {
                platform
                    .oplog(&id)
                    .await
                    .iter()
                    .any(|e| e.kind == "http-response")
            }
        })
        .await;
    // Edit the store as a bad disk or a careless operator would: a status that is a string.
    let url = format!("sqlite://{}", platform.data.join("toolgrid.db").display());
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let seq: i64 = sqlx::query_scalar(
        "SELECT MIN(seq) FROM oplog WHERE call_id = $1 AND kind = 'http-response'",
    )
    .bind(&call_id)
    .fetch_one(&mut db)
    .await
    .unwrap();
    sqlx::query("UPDATE oplog SET payload = '{\"seq\": 1, \"status\": \"ok\", \"headers\": [], \"bodyBase64\": \"\"}' WHERE call_id = $1 AND seq = $2")
        .bind(&call_id)
        .bind(seq)
        .execute(&mut db)
        .await
        .unwrap();
    db.close().await.unwrap();
    // Its worker dies: the call moves, and its replay reads the corrupted entry.
    workers.iter_mut().find(|w| w.id == worker).unwrap().kill();
    let call = wait_done(&mut news, &platform, &call_id).await;
    assert_eq!(error_kind(&call), "replay-divergence", "{:?}", call.error);
    let message = call
        .error
        .as_ref()
        .map(|e| e.message.clone())
        .unwrap_or_default();
    assert!(
        message.contains(&format!("oplog entry {seq} (http-response)")),
        "the error names the entry: {message}"
    );
}

/// The operator's report: the SQLite file locked by another process for longer than the
/// store's busy timeout in the middle of a call. The call must not stay `running`: it ends
/// once the lock is gone, and no effect is applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_locked_mid_call_leaves_no_call_behind() {
    use sqlx::Connection as _;
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    probe_commit_before_send(&witness, &platform);
    let _workers: Vec<WorkerProcess> = (0..2)
        .map(|i| WorkerProcess::start(&platform, &format!("l{i}"), 4, root.path()))
        .collect();
    let steps = 6;
    let mut news = start_call(
        &platform,
        request(
            "idempotent-p1",
            "locked",
            &witness.base(),
            steps,
            40_000_000,
        ),
    )
    .await;
    let call_id = accepted(&mut news).await;
    first_effect(&witness, "locked").await;
    // Another process takes the database: every write of the control plane waits, then
    // fails, for longer than its busy timeout (10 s).
    let url = format!("sqlite://{}", platform.data.join("toolgrid.db").display());
    let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("PRAGMA busy_timeout = 30000")
        .execute(&mut db)
        .await
        .unwrap();
    sqlx::query("BEGIN EXCLUSIVE")
        .execute(&mut db)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(14)).await;
    sqlx::query("COMMIT").execute(&mut db).await.unwrap();
    db.close().await.unwrap();

    let call = wait_done(&mut news, &platform, &call_id).await;
    succeeded_exactly_once(&platform, &witness, &call, "locked", steps).await;
}

/// Store writes that fail on cue (`TOOLGRID_FAULTS`, a `FaultyStore` around the real one):
/// a failed or unacknowledged append, a completion that fails, and one that commits but
/// reports failure (its outcome unknown). Each call ends exactly once, succeeded, with one
/// outcome in its oplog, and no effect applied twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn store_writes_that_fail_on_cue_leave_no_call_behind() {
    let cases = [
        ("append:1", "write-p1"),
        ("append:after=1", "idempotent-p1"),
        ("complete:2", "write-p1"),
        ("complete:after=1", "write-p2"),
        ("append:2,complete:1", "idempotent-p2"),
    ];
    for (faults, tool) in cases {
        let witness = Witness::start().await;
        let root = tempfile::tempdir().unwrap();
        let manifests = manifests(root.path(), &witness);
        let platform =
            Platform::start_with_env(root.path(), &manifests, &[], &[("TOOLGRID_FAULTS", faults)]);
        probe_commit_before_send(&witness, &platform);
        let run = format!("faults-{}", faults.replace([':', '=', ','], "-"));
        let steps = 3;
        let mut news =
            start_call(&platform, request(tool, &run, &witness.base(), steps, 1000)).await;
        let call_id = accepted(&mut news).await;
        let call = wait_done(&mut news, &platform, &call_id).await;
        succeeded_exactly_once(&platform, &witness, &call, &run, steps).await;
        assert!(
            platform.logs().contains("injected"),
            "{faults}: the fault was injected:\n{}",
            platform.logs()
        );
    }
}

/// An admission answered at its commit whose sync then fails (`TOOLGRID_FAULTS=sync:1`):
/// its caller is told `unavailable` and given no call, though the call, committed and
/// handed to its worker, runs; the retry under the same key finds that call, and every
/// effect reached the witness once, committed before it left.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admission_whose_sync_fails_is_refused_and_its_retry_finds_the_call() {
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start_with_env(
        root.path(),
        &manifests,
        &[],
        &[("TOOLGRID_FAULTS", "sync:1")],
    );
    probe_commit_before_send(&witness, &platform);
    let (run, steps) = ("sync-fails", 3);
    let mut client = platform.client().await;
    let refused = client
        .invoke(request("write-p1", run, &witness.base(), steps, 1000))
        .await
        .expect_err("no call is answered before its admission is durable");
    let error = proto::status::error_of(&refused);
    assert_eq!(
        error.kind,
        toolgrid_core::error::ErrorKind::Unavailable,
        "{refused:?}"
    );
    assert!(
        error.message.contains("could not be made durable"),
        "{refused:?}"
    );

    let call = client
        .invoke(request("write-p1", run, &witness.base(), steps, 1000))
        .await
        .expect("the retry")
        .into_inner();
    assert!(call.deduplicated, "the retry finds the call: {call:?}");
    let call = get_call(&platform, &call.id).await;
    succeeded_exactly_once(&platform, &witness, &call, run, steps).await;
}

/// `call` succeeded with one outcome in its oplog, and the witness saw each of its effects
/// once, committed before it left (the ledger and [`check_outcome`]).
async fn succeeded_exactly_once(
    platform: &Platform,
    witness: &Witness,
    call: &proto::Call,
    run: &str,
    steps: u32,
) {
    assert_eq!(
        call.state,
        proto::CallState::Succeeded as i32,
        "{run}: {:?}\n{}",
        call.error,
        platform.logs()
    );
    let oplog = platform.oplog(&call.id).await;
    assert_eq!(
        oplog.iter().filter(|e| e.kind == "outcome").count(),
        1,
        "{run}: one outcome: {oplog:?}"
    );
    let mut ledger = Ledger::new();
    ledger.add(platform, call).await;
    ledger.check(&witness.seen());
    check_outcome(call, &oplog, &witness.seen(), run, steps);
}

/// The cluster store's server restarts in the middle of a call (connections cut, writes
/// refused while it comes back): the call still ends exactly once, every effect once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restart_mid_call_leaves_no_call_behind() {
    let Some(url) = common::postgres::fresh_test_database().await else {
        return;
    };
    let witness = Witness::start().await;
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--store", &url]);
    probe_commit_before_send(&witness, &platform);
    let steps = 6;
    let mut news = start_call(
        &platform,
        request(
            "idempotent-p2",
            "pg-restart",
            &witness.base(),
            steps,
            30_000_000,
        ),
    )
    .await;
    let call_id = accepted(&mut news).await;
    first_effect(&witness, "pg-restart").await;
    let restarted = common::postgres::restart_postgres();
    if !common::require(
        "a PostgreSQL server this test can restart (root, .ci/start-postgres's)",
        restarted.is_some(),
    ) {
        return;
    }
    restarted.unwrap_or(Ok(())).expect("restart PostgreSQL");
    // The restart happened mid-call, not after it.
    assert!(
        !witness
            .seen()
            .iter()
            .any(|s| s.body.contains(&format!("\"step\":{steps}"))),
        "the call had finished before the restart"
    );

    let call = wait_done(&mut news, &platform, &call_id).await;
    succeeded_exactly_once(&platform, &witness, &call, "pg-restart", steps).await;
}

/// The body of lane `lane` of step `step` of an effects-http `--concurrency 2` run.
fn lane_body(run: &str, step: u32, lane: &str) -> String {
    format!("{{\"run\":\"{run}\",\"step\":{step},\"lane\":\"{lane}\"}}")
}

/// The step of the newest pair (both lanes' POSTs) of `run` the witness saw from attempt
/// `min_attempt` or later.
fn newest_pair(seen: &[Seen], run: &str, steps: u32, min_attempt: u32) -> u32 {
    let from = |s: &Seen| {
        s.attempt
            .as_deref()
            .and_then(|a| a.parse::<u32>().ok())
            .is_some_and(|a| a >= min_attempt)
    };
    (1..=steps)
        .rev()
        .find(|&step| {
            ["a", "b"].iter().all(|lane| {
                let body = lane_body(run, step, lane);
                seen.iter()
                    .any(|s| s.method == "POST" && s.body == body && from(s))
            })
        })
        .unwrap_or(0)
}

/// Two concurrent `wasi:http` requests per step (effects-http `--concurrency 2`): they are
/// numbered in the guest's issue order (lane a before lane b, whatever the order they
/// finish in), so a replay after a kill matches them again. Rounds of calls run at once;
/// all workers are SIGKILLed twice a round, each time once every unfinished call has a new
/// pair of requests durable (the witness saw both, and the probe checked their starts were
/// committed); the calls move and replay. Until at least 50 replays happened: none may
/// diverge, and no effect is applied twice under different keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_requests_replayed_after_kills_never_diverge() {
    use sha2::Digest as _;
    let witness = Witness::start().await;
    witness.set_delay(Duration::from_millis(10));
    let root = tempfile::tempdir().unwrap();
    let manifests = manifests(root.path(), &witness);
    let platform = Platform::start(root.path(), &manifests, &["--no-workers", "--lease", "1s"]);
    probe_commit_before_send(&witness, &platform);
    let ids = ["q0", "q1", "q2"];
    let mut workers: Vec<WorkerProcess> = ids
        .iter()
        .map(|id| WorkerProcess::start(&platform, id, 4, root.path()))
        .collect();
    let (steps, work, per_round, kills_per_round) = (12u32, 2_000_000u64, 6, 2);
    let began = Instant::now();
    let mut ledger = Ledger::new();
    let mut outcomes: Vec<(proto::Call, String)> = Vec::new();
    let mut replays = 0;
    let mut round = 0;
    while replays < 50 {
        round += 1;
        assert!(
            round <= 15,
            "only {replays} replays in {} rounds",
            round - 1
        );
        // (run, news, call id, ended)
        let mut calls = Vec::new();
        for i in 0..per_round {
            let run = format!("q{round}-{i}");
            let request = proto::InvokeRequest {
                tool: "idempotent-p2".into(),
                command: "run".into(),
                args_json: serde_json::json!({
                    "base": witness.base(), "run": run, "steps": steps, "work": work,
                    "concurrency": 2,
                })
                .to_string(),
                idempotency_key: format!("key-{run}"),
                ..Default::default()
            };
            let mut news = start_call(&platform, request).await;
            let id = loop {
                match tokio::time::timeout(Duration::from_secs(30), news.recv())
                    .await
                    .expect("news of the call")
                {
                    Some(News::Accepted(id)) => break id,
                    Some(News::Done(call)) => panic!("the call ended at once: {call:?}"),
                    Some(_) => {}
                    None => panic!("the call stream broke"),
                }
            };
            calls.push((run, news, id, None::<proto::Call>));
        }
        // The step of the newest pair of each call when its worker was last killed.
        let mut killed_after: HashMap<String, u32> = HashMap::new();
        for kill in 1..=kills_per_round {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let seen = witness.seen();
                let mut ready = true;
                for (run, news, _, ended) in calls.iter_mut() {
                    while let Ok(event) = news.try_recv() {
                        if let News::Done(call) = event {
                            *ended = Some(*call);
                        }
                    }
                    let before = killed_after.get(run.as_str()).copied().unwrap_or(0);
                    if ended.is_none() && newest_pair(&seen, run, steps, kill) <= before {
                        ready = false;
                    }
                }
                if ready {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the calls made no new pair of requests before kill {kill}"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let seen = witness.seen();
            for worker in workers.iter_mut() {
                worker.signal(libc::SIGKILL);
                worker.kill();
            }
            for (run, _, _, _) in &calls {
                killed_after.insert(run.clone(), newest_pair(&seen, run, steps, kill));
            }
            for (i, id) in ids.iter().enumerate() {
                workers[i] = WorkerProcess::start(&platform, id, 4, root.path());
            }
        }
        for (run, mut news, id, ended) in calls {
            let call = match ended {
                Some(call) => call,
                None => wait_done(&mut news, &platform, &id).await,
            };
            assert_eq!(
                call.state,
                proto::CallState::Succeeded as i32,
                "{run} ({id}) did not succeed: {:?}",
                call.error
            );
            ledger.add(&platform, &call).await;
            let oplog = &ledger.oplogs[&call.id];
            let mut replayed = 0;
            for entry in oplog.iter().filter(|e| e.kind == "replay") {
                let entries = payload(entry)["entries"].as_u64().unwrap_or_default();
                // At least the clock reading and the first pair of requests.
                assert!(entries >= 3, "{run}: a replay of {entries} entries");
                replayed += 1;
            }
            let assigned = oplog.iter().filter(|e| e.kind == "assigned").count();
            assert!(
                assigned == 1 || replayed >= 1,
                "{run}: assigned {assigned} times, never replayed"
            );
            replays += replayed;
            outcomes.push((call, run));
        }
        eprintln!(
            "round {round}: {replays} replays after {:?}",
            began.elapsed()
        );
    }

    let seen = witness.seen();
    ledger.check(&seen);
    let sha = |body: &str| hex::encode(sha2::Sha256::digest(body.as_bytes()));
    for (call, run) in &outcomes {
        let result: Value = serde_json::from_str(&call.result_json).unwrap();
        assert_eq!(result["run"], run.as_str());
        assert_eq!(result["concurrency"], 2);
        assert_eq!(
            result["postStatuses"].as_array().map(Vec::len),
            Some(2 * steps as usize),
            "{result}"
        );
        // Numbered in issue order: per step, lane a, lane b, then the GET.
        for entry in ledger.oplogs[&call.id]
            .iter()
            .filter(|e| e.kind == "http-request")
        {
            let request = payload(entry);
            let seq = request["seq"].as_u64().unwrap();
            let step = (seq - 1) / 3 + 1;
            let expected = match seq % 3 {
                1 => ("POST", sha(&lane_body(run, step as u32, "a"))),
                2 => ("POST", sha(&lane_body(run, step as u32, "b"))),
                _ => ("GET", sha("")),
            };
            assert_eq!(
                (
                    request["method"].as_str().unwrap(),
                    request["bodySha256"].as_str().unwrap()
                ),
                (expected.0, expected.1.as_str()),
                "{run}: request {seq} is not the one issued {seq}th: {request}"
            );
        }
        for step in 1..=steps {
            for lane in ["a", "b"] {
                let body = lane_body(run, step, lane);
                assert!(
                    seen.iter().any(|s| s.method == "POST" && s.body == body),
                    "{run}: step {step} lane {lane} never reached the witness"
                );
            }
        }
    }
    eprintln!(
        "{replays} replays over {} calls in {round} rounds, {:?}",
        outcomes.len(),
        began.elapsed()
    );
}
