//! `toolgrid worker`: one sandbox worker process.

use std::path::PathBuf;
use toolgrid_api::units::{ByteSize, GoDuration};
use toolgrid_worker::{WorkerConfig, WorkerCredential};

/// The `toolgrid-worker` binary's command line: `toolgrid worker`'s arguments.
#[derive(clap::Parser, Debug)]
#[command(
    name = "toolgrid-worker",
    version,
    about = "One sandbox worker attached to a control plane (`toolgrid worker` in a binary of its own)"
)]
pub struct WorkerCommand {
    #[command(flatten)]
    pub args: WorkerArgs,
}

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The control plane's gRPC address.
    #[arg(
        long,
        env = "TOOLGRID_CONTROL_PLANE",
        default_value = "http://127.0.0.1:7070"
    )]
    control_plane: String,
    /// This worker's id (stable across restarts of the same worker).
    #[arg(long, env = "TOOLGRID_WORKER_ID")]
    id: Option<String>,
    /// The WorkerPool it serves, `namespace/name` or `name` (namespace `default`).
    #[arg(long, env = "TOOLGRID_POOL", default_value = "default")]
    pool: String,
    /// Calls run at once.
    #[arg(long, env = "TOOLGRID_SLOTS", default_value_t = 16)]
    slots: u32,
    /// Cache of compiled releases.
    #[arg(long, env = "TOOLGRID_CACHE", default_value = ".toolgrid/cache")]
    cache: PathBuf,
    /// Largest linear memory a call may have (the pooling allocator's reservation).
    #[arg(long, default_value = "4Gi")]
    max_memory: ByteSize,
    /// Use on-demand allocation instead of the pooling allocator.
    #[arg(long)]
    no_pooling: bool,
    /// Exit after the control plane has been unreachable this long.
    #[arg(long, default_value = "30s")]
    reconnect_timeout: GoDuration,
    /// On SIGTERM, how long the calls it holds may take to finish on it (it takes no new
    /// call meanwhile) before the rest are given up to another worker and it exits. Keep
    /// it under the pod's terminationGracePeriodSeconds.
    #[arg(long, env = "TOOLGRID_DRAIN_GRACE", default_value = "25s")]
    drain_grace: GoDuration,
    /// The token that lets this worker attach: the join token of `toolgrid up` (printed
    /// nowhere; read it from `DATA/join-token` on the control plane's machine). Prefer the
    /// environment variable or `--join-token-file`: arguments are visible to other users.
    #[arg(long, env = "TOOLGRID_JOIN_TOKEN", hide_env_values = true)]
    join_token: Option<String>,
    /// A file holding the token, read again at every attach (so a restarted `toolgrid up`
    /// on this machine, or a rotated ServiceAccount token in a cluster, is followed).
    #[arg(long, env = "TOOLGRID_JOIN_TOKEN_FILE", conflicts_with = "join_token")]
    join_token_file: Option<PathBuf>,
    /// CA certificate (PEM) to trust for an `https://` control plane, instead of the
    /// system's roots.
    #[arg(long, env = "TOOLGRID_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// The CA certificate itself (PEM), instead of a file (how the controller hands it to
    /// worker pods).
    #[arg(long, env = "TOOLGRID_TLS_CA_PEM", hide = true)]
    tls_ca_pem: Option<String>,
    /// Exit when this process stops being the parent (set by `toolgrid up`).
    #[arg(long, hide = true)]
    parent_pid: Option<u32>,
    /// A file holding the token this worker presents, read again on every (re)attach: the
    /// pod's projected ServiceAccount token (audience `toolgrid-worker`) in a cluster.
    #[arg(long, env = "TOOLGRID_WORKER_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Threads of the runtime that serves the worker link (calls run on a runtime of their
    /// own, a thread per core). Default: one per core, or `TOKIO_WORKER_THREADS`; `toolgrid
    /// up` gives its local workers one.
    #[arg(long)]
    runtime_threads: Option<usize>,
}

impl WorkerArgs {
    /// `--runtime-threads`, if given.
    pub fn runtime_threads(&self) -> Option<usize> {
        self.runtime_threads
    }
}

pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let pool = if args.pool.contains('/') {
        args.pool.clone()
    } else {
        format!("{}/{}", toolgrid_api::DEFAULT_NAMESPACE, args.pool)
    };
    let id = args
        .id
        .unwrap_or_else(|| format!("{}-{}", pool.replace('/', "-"), std::process::id()));
    let control_plane = toolgrid_proto::tls::endpoint_url(&args.control_plane);
    let credential = match (args.join_token, args.join_token_file, args.token_file) {
        (Some(token), _, _) => WorkerCredential::Token(token),
        (None, Some(path), _) | (None, None, Some(path)) => WorkerCredential::File(path),
        (None, None, None) => WorkerCredential::None,
    };
    let trust = toolgrid_proto::tls::Trust::of(args.tls_ca.as_deref(), args.tls_ca_pem.as_deref())?;
    toolgrid_worker::run(WorkerConfig {
        control_plane,
        worker_id: id,
        pool,
        slots: args.slots.max(1),
        cache_dir: args.cache,
        max_memory_bytes: args.max_memory.bytes(),
        pooling: !args.no_pooling,
        reconnect_timeout: args.reconnect_timeout.get(),
        parent_pid: args.parent_pid,
        credential,
        trust,
        drain_grace: args.drain_grace.get(),
    })
    .await
}
