//! `toolgrid up`: the whole platform on one machine.

use anyhow::Context;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use toolgrid_api::Kind;
use toolgrid_api::conditions::Reason;
use toolgrid_api::units::GoDuration;
use toolgrid_control_plane::auth::JoinSecret;
use toolgrid_control_plane::auth::worker::JOIN_TOKEN_FILE;
use toolgrid_control_plane::platform::tls::ServerTls;
use toolgrid_control_plane::platform::{ControlPlane, Listeners, LocalPools, Security, retention};
use toolgrid_control_plane::scheduler::SchedulerConfig;
use toolgrid_control_plane::source::ManifestSource;
use toolgrid_store::{FaultyStore, Store};

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Directory of manifests (YAML, multi-document files too), watched for changes.
    #[arg(long, env = "TOOLGRID_MANIFESTS", default_value = "examples/manifests")]
    manifests: PathBuf,
    /// Directory of toolgrid's built-in tools (Tools and ToolReleases; none is bound until a
    /// ToolBinding or Agent opts in); a manifest of the same kind and name replaces one.
    /// Several directories are separated by commas; a later directory's resource replaces
    /// an earlier one's. The default serves `python`, and `code` with its `python`
    /// command, from builtins/python: they are Ready once the runtime is fetched
    /// (`builtins/fetch-python.sh`); `--builtins builtins/manifests` serves `code` for
    /// JavaScript alone.
    #[arg(
        long,
        env = "TOOLGRID_BUILTINS",
        value_delimiter = ',',
        default_value = "builtins/manifests,builtins/python"
    )]
    builtins: Vec<PathBuf>,
    /// Start without the built-in tools.
    #[arg(long)]
    no_builtins: bool,
    /// Directory of the embedded store and the compiled-code cache.
    #[arg(long, env = "TOOLGRID_DATA", default_value = ".toolgrid")]
    data: PathBuf,
    /// The local workers' compiled-code and release-file cache, instead of DATA/cache (share
    /// one across platforms so a large release compiles once).
    #[arg(long, env = "TOOLGRID_CACHE")]
    cache: Option<PathBuf>,
    /// gRPC address; HTTP listens on the next port (an ephemeral one when this port is 0).
    #[arg(long, env = "TOOLGRID_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// HTTP address, instead of the port after gRPC's.
    #[arg(long, env = "TOOLGRID_HTTP_LISTEN")]
    http_listen: Option<SocketAddr>,
    /// Store URL instead of `sqlite://DATA/toolgrid.db` (`postgres://...` also works).
    #[arg(long, env = "TOOLGRID_STORE")]
    store: Option<String>,
    #[command(flatten)]
    store_tuning: StoreTuningArgs,
    /// Start no worker processes; workers attach on their own (`toolgrid worker`).
    #[arg(long)]
    no_workers: bool,
    /// Threads of the control plane's async runtime. Default: half the machine's cores, at
    /// least one (its store's threads and its local workers share the machine), or
    /// `TOKIO_WORKER_THREADS` when set.
    #[arg(long, env = "TOOLGRID_RUNTIME_THREADS")]
    runtime_threads: Option<usize>,
    /// A worker silent this long loses its calls to another worker.
    #[arg(long, default_value = "2s")]
    lease: GoDuration,
    /// How often workers heartbeat.
    #[arg(long, default_value = "500ms")]
    heartbeat: GoDuration,
    /// How many calls of one agent may wait for a worker of one pool; more are refused
    /// `queue-full` (HTTP 429 with `Retry-After`) and not recorded.
    #[arg(long, env = "TOOLGRID_MAX_QUEUED_PER_AGENT", default_value_t = toolgrid_core::scheduler::DEFAULT_MAX_PER_AGENT, value_parser = clap::value_parser!(u32).range(1..))]
    max_queued_per_agent: u32,
    /// How long to wait for every pool's first worker and every ToolSource's first read
    /// before saying ready anyway.
    #[arg(long, default_value = "60s")]
    ready_timeout: GoDuration,
    /// Delete calls that ended longer ago than this (e.g. `7d`), with their oplogs and the
    /// artifacts nothing uses any more; checked at start and hourly. Default: keep all.
    #[arg(long, env = "TOOLGRID_RETAIN", value_parser = humantime::parse_duration)]
    retain: Option<Duration>,
    /// Serve gRPC and HTTP over TLS with this certificate chain (PEM); needs --tls-key.
    #[arg(long, env = "TOOLGRID_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "TOOLGRID_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The CA the local workers trust to reach this control plane over TLS (default: the
    /// certificate chain itself, for a self-signed certificate).
    #[arg(long, env = "TOOLGRID_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// A console session unused this long ends (the browser must log in again).
    #[arg(long, env = "TOOLGRID_CONSOLE_IDLE_TIMEOUT", default_value = "30m", value_parser = humantime::parse_duration)]
    console_idle_timeout: Duration,
    /// A console session ends this long after login, however busy.
    #[arg(long, env = "TOOLGRID_CONSOLE_SESSION_LIFETIME", default_value = "12h", value_parser = humantime::parse_duration)]
    console_session_lifetime: Duration,
    #[command(flatten)]
    mcp: McpArgs,
}

impl UpArgs {
    /// `--runtime-threads`, if given.
    pub fn runtime_threads(&self) -> Option<usize> {
        self.runtime_threads
    }
}

/// How the store is run (`toolgrid up`, `toolgrid controller`).
#[derive(clap::Args, Debug)]
pub struct StoreTuningArgs {
    /// How long the SQLite store's writer, out of writes after eight lone writes in a row,
    /// keeps looking for the next one (yielding its core to any thread that wants it, and
    /// sleeping once others have had it for a while) before it sleeps: a sleeping thread on
    /// an idle core is slow to wake on a virtual machine. At most this much CPU time per
    /// lone write; `0s` sleeps at once (under a CPU limit, the looking counts against the
    /// quota).
    #[arg(long, env = "TOOLGRID_STORE_IDLE_POLL", default_value_t = GoDuration(toolgrid_store::DEFAULT_IDLE_POLL), value_parser = store_idle_poll)]
    store_idle_poll: GoDuration,
}

/// The longest `--store-idle-poll`: the looking is for the next write of a busy platform;
/// longer only keeps a core busy.
const MAX_STORE_IDLE_POLL: Duration = Duration::from_millis(100);

fn store_idle_poll(value: &str) -> Result<GoDuration, String> {
    let poll: GoDuration = value.parse()?;
    if poll.get() > MAX_STORE_IDLE_POLL {
        return Err(format!(
            "{poll} is longer than the most, {}: longer only keeps a core busy",
            GoDuration(MAX_STORE_IDLE_POLL)
        ));
    }
    Ok(poll)
}

impl StoreTuningArgs {
    pub fn options(&self) -> toolgrid_store::OpenOptions {
        toolgrid_store::OpenOptions {
            idle_poll: self.store_idle_poll.get(),
            ..Default::default()
        }
    }
}

/// How `/mcp` presents itself, and the OAuth authorization server it trusts.
#[derive(clap::Args, Debug, Default)]
pub struct McpArgs {
    /// The URL clients reach this server at (e.g. `https://tools.example.com`), named by the
    /// MCP protected-resource metadata; by default the request's Host over HTTP.
    #[arg(long, env = "TOOLGRID_MCP_PUBLIC_URL")]
    mcp_public_url: Option<String>,
    /// A browser origin allowed to reach `/mcp` besides loopback ones (repeatable).
    #[arg(long = "mcp-allowed-origin")]
    mcp_allowed_origins: Vec<String>,
    /// An OAuth authorization server (its issuer URL) whose access tokens are accepted;
    /// needs --oauth-jwks.
    #[arg(long, env = "TOOLGRID_OAUTH_ISSUER", requires = "oauth_jwks")]
    oauth_issuer: Option<String>,
    /// The issuer's signing keys, a JWKS document (JSON file).
    #[arg(long, env = "TOOLGRID_OAUTH_JWKS", requires = "oauth_issuer")]
    oauth_jwks: Option<PathBuf>,
    /// The audience access tokens must name: this resource's identifier (default: the
    /// --mcp-public-url followed by /mcp).
    #[arg(long, env = "TOOLGRID_OAUTH_AUDIENCE")]
    oauth_audience: Option<String>,
    /// The namespace whose Agents the issuer's subjects are (`spec.oauthSubjects` of Agents
    /// elsewhere never match its tokens).
    #[arg(
        long,
        env = "TOOLGRID_OAUTH_NAMESPACE",
        default_value = "default",
        conflicts_with = "oauth_namespace_claim"
    )]
    oauth_namespace: String,
    /// Instead: the claim of each access token that names its namespace (for an issuer
    /// several tenants share); a token without it is refused.
    #[arg(long, env = "TOOLGRID_OAUTH_NAMESPACE_CLAIM")]
    oauth_namespace_claim: Option<String>,
}

impl McpArgs {
    pub fn config(&self) -> toolgrid_control_plane::gateway::mcp::McpConfig {
        toolgrid_control_plane::gateway::mcp::McpConfig {
            public_url: self.mcp_public_url.clone(),
            authorization_servers: self.oauth_issuer.iter().cloned().collect(),
            allowed_origins: self.mcp_allowed_origins.clone(),
        }
    }

    /// The OAuth issuer to trust, if one is configured.
    pub fn oauth(
        &self,
    ) -> anyhow::Result<Option<toolgrid_control_plane::auth::oauth::OAuthIssuer>> {
        let (Some(issuer), Some(jwks)) = (&self.oauth_issuer, &self.oauth_jwks) else {
            return Ok(None);
        };
        let audience = match (&self.oauth_audience, &self.mcp_public_url) {
            (Some(audience), _) => audience.clone(),
            (None, Some(url)) => format!("{}/mcp", url.trim_end_matches('/')),
            (None, None) => anyhow::bail!(
                "--oauth-issuer needs the resource's identifier: --oauth-audience or --mcp-public-url"
            ),
        };
        let text = std::fs::read_to_string(jwks)
            .with_context(|| format!("cannot read the JWKS {}", jwks.display()))?;
        let document: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("the JWKS {} is not JSON", jwks.display()))?;
        use toolgrid_control_plane::auth::oauth::{NamespaceTrust, OAuthIssuer, is_namespace_name};
        let trust = match &self.oauth_namespace_claim {
            Some(claim) => NamespaceTrust::Claim(claim.clone()),
            None if is_namespace_name(&self.oauth_namespace) => {
                NamespaceTrust::Namespace(self.oauth_namespace.clone())
            }
            None => anyhow::bail!(
                "--oauth-namespace {:?} is not a namespace name",
                self.oauth_namespace
            ),
        };
        let issuer = OAuthIssuer::new(issuer, &audience, &document)
            .map_err(|e| anyhow::anyhow!("{}: {e}", jwks.display()))?
            .with_trust(trust);
        Ok(Some(issuer))
    }
}

/// Writes the join token to `DATA/join-token`, readable by its owner only.
fn write_join_token(data: &Path, secret: &JoinSecret) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = data.join(JOIN_TOKEN_FILE);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // A file left by an older start keeps its mode on open: set it again.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(secret.expose().as_bytes())?;
    file.sync_all()?;
    Ok(path)
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    if !args.manifests.is_dir() {
        anyhow::bail!(
            "the manifest directory {} does not exist (pass --manifests DIR)",
            args.manifests.display()
        );
    }
    let manifests = args.manifests.canonicalize()?;
    std::fs::create_dir_all(&args.data)
        .with_context(|| format!("cannot create {}", args.data.display()))?;
    let data = args.data.canonicalize()?;
    let store_url = args
        .store
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", data.join("toolgrid.db").display()));
    let store = toolgrid_store::SqlStore::open_with(&store_url, args.store_tuning.options())
        .await
        .with_context(|| format!("cannot open the store at {store_url}"))?;
    // Its commits and syncs, at /metrics.
    toolgrid_control_plane::metrics::count_store_writes(store.write_counters());
    let store: Arc<dyn Store> = Arc::new(store);
    // For end-to-end fault tests: `TOOLGRID_FAULTS=complete:2,append:1` (see store::faulty).
    let store: Arc<dyn Store> = match std::env::var("TOOLGRID_FAULTS") {
        Ok(spec) if !spec.is_empty() => {
            let faulty = FaultyStore::from_spec(store, &spec).map_err(anyhow::Error::msg)?;
            tracing::warn!(faults = %spec, "the store fails on cue (TOOLGRID_FAULTS)");
            Arc::new(faulty)
        }
        _ => store,
    };
    let config = SchedulerConfig {
        heartbeat_interval: args.heartbeat.get(),
        lease: args.lease.get(),
        reattach_grace: (args.lease.get() * 2).max(Duration::from_secs(2)),
        max_queued_per_agent: args.max_queued_per_agent,
        ..SchedulerConfig::default()
    };
    let admin = admin_token(&data)?;
    let mut auth = toolgrid_control_plane::gateway::Authenticator::new().with_admin_token(&admin);
    if let Some(issuer) = args.mcp.oauth()? {
        auth = auth.with_oauth(issuer);
    }
    let control_plane = ControlPlane::start(store.clone(), config, auth).await?;
    control_plane
        .gateway
        .set_console_limits(toolgrid_core::auth::SessionLimits {
            idle: args.console_idle_timeout,
            lifetime: args.console_session_lifetime,
        });
    let tls = ServerTls::from_args(args.tls_cert.as_deref(), args.tls_key.as_deref())?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let listeners = Listeners::bind(args.listen, args.http_listen).await?;
    // The keys identity tokens for upstreams are signed with, published at
    // /.well-known/jwks.json; rotated at start and hourly. Tokens name the platform's
    // public URL as issuer (the HTTP port unless --mcp-public-url says otherwise).
    let identity = toolgrid_control_plane::identity::IdentityKeys::open(&data)
        .context("cannot load the identity signing keys")?;
    identity.spawn_rotation();
    let issuer_url = match &args.mcp.mcp_public_url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => format!("{scheme}://{}", listeners.http.local_addr()?),
    };
    control_plane.gateway.set_identity(identity, issuer_url);
    let source = ManifestSource::new(
        manifests.clone(),
        store.clone(),
        control_plane.catalog.clone(),
    )
    .with_issuer(control_plane.gateway.issuer())
    .with_rollouts(control_plane.gateway.rollouts());
    let source = source.with_builtins(builtins_dirs(&args));
    source.reload().await.context("cannot load the manifests")?;
    control_plane.gateway.set_source_refresher(source.clone());
    if let Some(retain) = args.retain {
        retention::spawn(store, control_plane.catalog.clone(), retain);
    }
    tokio::spawn({
        let source = source.clone();
        async move {
            if let Err(error) = source.watch().await {
                tracing::error!(%error, "cannot watch the manifest directory; changes need a restart");
            }
        }
    });

    // A new join secret every start: a worker that attached to an earlier start must
    // present the new one (workers reading `--join-token-file` pick it up by themselves).
    let join = JoinSecret::generate();
    let token_file = write_join_token(&data, &join)?;
    let join_token = join.expose().to_string();
    let security = Security {
        workers: Arc::new(join),
        tls,
        mcp: args.mcp.config(),
    };

    let (grpc, http, server) = control_plane.serve(listeners, security)?;

    let _pools = if args.no_workers {
        None
    } else {
        let exe = std::env::current_exe()?;
        let tls_ca = match (&args.tls_ca, &args.tls_cert) {
            (Some(ca), _) => Some(ca.canonicalize()?),
            (None, Some(cert)) => Some(cert.canonicalize()?),
            (None, None) => None,
        };
        let pools = LocalPools::new(
            exe,
            format!("{scheme}://{grpc}"),
            args.cache.clone().unwrap_or_else(|| data.join("cache")),
            join_token,
            tls_ca,
        )
        .with_attached({
            let scheduler = control_plane.scheduler.clone();
            Arc::new(move || {
                scheduler
                    .workers()
                    .into_iter()
                    .map(|w| w.id.as_str().to_string())
                    .collect()
            })
        });
        // SIGHUP: replace every local worker, one by one, each draining as it goes.
        let restart = pools.restart_handle();
        let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                tracing::info!("SIGHUP: restarting the local workers one by one");
                restart.notify_one();
            }
        });
        Some(tokio::spawn(pools.run(control_plane.catalog.clone())))
    };
    // The one hint, which names the file and never holds the secret itself.
    tracing::info!(
        "to attach another worker: toolgrid worker --control-plane {scheme}://{grpc} --join-token-file {} (on another machine, copy that file, or set TOOLGRID_JOIN_TOKEN to its contents)",
        token_file.display()
    );
    // ToolSources are read in the background once the HTTP port serves (an upstream may be
    // this very platform); their first reads, landed or failed, are waited for so that
    // "ready" means their tools are there.
    let ready_by = Instant::now() + args.ready_timeout.get();
    wait_for_source_reads(&control_plane, ready_by).await;
    if !args.no_workers {
        // External workers attach when they will; local ones are waited for.
        wait_for_workers(&control_plane, ready_by).await;
    }

    let snapshot = control_plane.catalog.current();
    let not_ready = snapshot
        .resources
        .values()
        .filter(|r| !r.ready.status)
        .count();
    println!(
        "toolgrid is ready: grpc={grpc} http={http} tools={} not-ready={not_ready} manifests={} data={}",
        snapshot.tools.len(),
        manifests.display(),
        data.display()
    );
    std::io::stdout().flush()?;

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
        _ = terminate.recv() => tracing::info!("terminated; stopping"),
        _ = server => tracing::error!("the servers stopped"),
    }
    Ok(())
}

/// The file under `--data` holding the admin token.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// The admin token of this data directory: created on first start (32 random bytes as hex,
/// mode 0600), the same on later starts.
pub fn admin_token(data: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let path = data.join(ADMIN_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.is_empty() {
                anyhow::bail!(
                    "{} is empty: delete it to make a new admin token",
                    path.display()
                );
            }
            let mode = std::fs::metadata(&path)?.permissions().mode();
            if mode & 0o077 != 0 {
                tracing::warn!(file = %path.display(), "the admin token is readable by others; making it 0600");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
            return Ok(token);
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read {}", path.display()));
        }
    }
    let mut bytes = [0u8; 32];
    rand::fill(&mut bytes);
    let token = hex::encode(bytes);
    let mut file = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(file) => file,
        // Another start made it meanwhile: use that one.
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            std::thread::sleep(Duration::from_millis(50));
            return admin_token(data);
        }
        Err(error) => {
            return Err(error).with_context(|| format!("cannot create {}", path.display()));
        }
    };
    file.write_all(format!("{token}\n").as_bytes())?;
    file.sync_all()?;
    tracing::info!(file = %path.display(), "created the admin token");
    Ok(token)
}

/// The built-in tools' directories, unless turned off; a missing one (say, a binary run
/// away from its repository) is said once and left out.
fn builtins_dirs(args: &UpArgs) -> Vec<PathBuf> {
    if args.no_builtins {
        return Vec::new();
    }
    args.builtins
        .iter()
        .filter(|dir| {
            let found = dir.is_dir();
            if !found {
                tracing::warn!(
                    "no built-in tools from {}: not a directory (--builtins DIR[,DIR], or --no-builtins)",
                    dir.display()
                );
            }
            found
        })
        .cloned()
        .collect()
}

/// Waits until no ToolSource waits for its first read, or until `deadline`.
async fn wait_for_source_reads(control_plane: &ControlPlane, deadline: Instant) {
    loop {
        let snapshot = control_plane.catalog.current();
        let pending: Vec<String> = snapshot
            .resources
            .values()
            .filter(|r| r.id.kind == Kind::ToolSource && r.ready.reason == Reason::SourcePending)
            .map(|r| r.id.key.to_string())
            .collect();
        if pending.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            tracing::warn!(sources = ?pending, "tool sources not read yet; their tools come when they are");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_for_workers(control_plane: &ControlPlane, deadline: Instant) {
    loop {
        let snapshot = control_plane.catalog.current();
        let workers = control_plane.scheduler.workers();
        let missing: Vec<String> = snapshot
            .pools
            .values()
            .filter(|p| p.desired_workers > 0)
            .map(|p| p.key.to_string())
            .filter(|pool| !workers.iter().any(|w| &w.pool == pool))
            .collect();
        if missing.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            tracing::warn!(pools = ?missing, "no worker attached yet; calls to these pools wait");
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_store_idle_poll_is_bounded() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            tuning: StoreTuningArgs,
        }
        let poll = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("toolgrid").chain(args.iter().copied()))
                .map(|cli| cli.tuning.options().idle_poll)
        };
        assert_eq!(poll(&[]).unwrap(), toolgrid_store::DEFAULT_IDLE_POLL);
        assert_eq!(poll(&["--store-idle-poll", "0s"]).unwrap(), Duration::ZERO);
        assert_eq!(
            poll(&["--store-idle-poll", "100ms"]).unwrap(),
            Duration::from_millis(100)
        );
        let refused = poll(&["--store-idle-poll", "1h"]).unwrap_err();
        assert_eq!(refused.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(
            refused.to_string().contains("longer than the most, 100ms"),
            "{refused}"
        );
    }

    #[test]
    fn the_admin_token_is_made_once_for_the_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let first = admin_token(dir.path()).unwrap();
        assert_eq!(first.len(), 64);
        assert!(first.chars().all(|c| c.is_ascii_hexdigit()));
        let path = dir.path().join(ADMIN_TOKEN_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            admin_token(dir.path()).unwrap(),
            first,
            "kept across starts"
        );
        // A file others can read is tightened, and still used.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(admin_token(dir.path()).unwrap(), first);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(&path, "\n").unwrap();
        assert!(
            admin_token(dir.path()).is_err(),
            "an empty token is refused"
        );
    }
}
