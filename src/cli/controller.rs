//! `toolgrid controller`: the control plane in a Kubernetes cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use toolgrid_api::units::GoDuration;
use toolgrid_controller::Settings;

#[derive(clap::Args, Debug)]
pub struct ControllerArgs {
    /// gRPC address: the Tools API for agents and the worker link for worker pods.
    #[arg(long, env = "TOOLGRID_LISTEN", default_value = "0.0.0.0:7070")]
    listen: SocketAddr,
    /// HTTP JSON API address.
    #[arg(long, env = "TOOLGRID_HTTP_LISTEN", default_value = "0.0.0.0:7071")]
    http_listen: SocketAddr,
    /// `/health`, `/ready` and `/metrics`.
    #[arg(long, env = "TOOLGRID_METRICS_LISTEN", default_value = "0.0.0.0:9090")]
    metrics_listen: SocketAddr,
    /// `sqlite://PATH` (on a volume) or `postgres://...`.
    #[arg(
        long,
        env = "TOOLGRID_STORE",
        default_value = "sqlite:///var/lib/toolgrid/toolgrid.db"
    )]
    store: String,
    #[command(flatten)]
    store_tuning: crate::cli::up::StoreTuningArgs,
    /// Watch only this namespace (default: all).
    #[arg(long, env = "TOOLGRID_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Directories of built-in tools (Tools and ToolReleases with their artifacts, as in
    /// the image's /usr/share/toolgrid/builtins/manifests) to serve beside the cluster's
    /// resources; comma-separated, a later one's replacing an earlier one's, and a cluster
    /// resource of the same kind and name replacing a built-in. None by default.
    #[arg(long, env = "TOOLGRID_BUILTINS", value_delimiter = ',')]
    builtins: Vec<PathBuf>,
    /// The namespace the built-ins are served in (default: the watched namespace, else the
    /// controller's own).
    #[arg(long, env = "TOOLGRID_BUILTINS_NAMESPACE")]
    builtins_namespace: Option<String>,
    /// Image of the worker pods (default: `TOOLGRID_IMAGE`, the controller's own).
    #[arg(long, env = "TOOLGRID_WORKER_IMAGE")]
    worker_image: Option<String>,
    /// What worker pods dial (default: `http(s)://toolgrid.<POD_NAMESPACE>.svc:7070`,
    /// `https` with TLS).
    #[arg(long, env = "TOOLGRID_CONTROL_PLANE_ADDRESS")]
    control_plane_address: Option<String>,
    /// OpenTelemetry traces over OTLP/gRPC to this endpoint.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// A worker silent this long loses its calls.
    #[arg(long, env = "TOOLGRID_WORKER_LEASE", default_value = "2s")]
    lease: GoDuration,
    /// How often workers heartbeat.
    #[arg(long, default_value = "500ms")]
    heartbeat: GoDuration,
    /// How many calls of one agent may wait for a worker of one pool; more are refused
    /// `queue-full` (HTTP 429 with `Retry-After`) and not recorded.
    #[arg(long, env = "TOOLGRID_MAX_QUEUED_PER_AGENT", default_value_t = toolgrid_core::scheduler::DEFAULT_MAX_PER_AGENT, value_parser = clap::value_parser!(u32).range(1..))]
    max_queued_per_agent: u32,
    /// This replica's identity in the leader election.
    #[arg(long, env = "POD_NAME")]
    pod_name: Option<String>,
    /// The namespace of the leader election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "toolgrid")]
    pod_namespace: String,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "toolgrid-controller")]
    lease_name: String,
    /// How long the leader's Lease holds without a renewal: a standby takes over after it.
    #[arg(long, env = "TOOLGRID_LEADER_LEASE", default_value = "15s")]
    leader_lease: GoDuration,
    /// The leader steps down after this long without a successful renewal (shorter than
    /// --leader-lease: the margin keeps two leaders from acting at once).
    #[arg(long, default_value = "10s")]
    leader_renew_deadline: GoDuration,
    /// How often the leader renews its Lease (and a standby tries to take it).
    #[arg(long, default_value = "2s")]
    leader_renew_every: GoDuration,
    /// Delete calls that ended longer ago than this (e.g. `7d`), with their oplogs and the
    /// artifacts no current release or remaining call uses; checked at start and hourly.
    /// Default: keep all.
    #[arg(long, env = "TOOLGRID_RETAIN", value_parser = humantime::parse_duration)]
    retain: Option<std::time::Duration>,
    /// Serve gRPC and HTTP over TLS with this certificate chain (PEM; the chart mounts
    /// `tls.secretName` and sets it); needs --tls-key.
    #[arg(long, env = "TOOLGRID_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// The certificate's private key (PEM).
    #[arg(long, env = "TOOLGRID_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Without --tls-cert: serve with a CA and certificate the controller makes for the host
    /// of --control-plane-address (and its shorter and `.cluster.local` forms), keeps in the
    /// Secret --tls-self-signed-secret of its namespace (every replica and restart serves
    /// the same chain) and rotates before they expire; workers get the CA. The chart sets
    /// this when TLS is on and cert-manager is absent.
    #[arg(
        long,
        env = "TOOLGRID_TLS_SELF_SIGNED",
        default_value_t = false,
        action = clap::ArgAction::Set,
        conflicts_with = "tls_cert"
    )]
    tls_self_signed: bool,
    /// The Secret (in the controller's namespace) that --tls-self-signed keeps its CA and
    /// certificate in; made when missing. A Secret of that name the controller did not make
    /// is never overwritten.
    #[arg(
        long,
        env = "TOOLGRID_TLS_SELF_SIGNED_SECRET",
        default_value = "toolgrid-self-signed-tls"
    )]
    tls_self_signed_secret: String,
    /// The Secret (in the controller's namespace) the controller keeps the Ed25519 keys it
    /// signs identity tokens for upstreams with (published at /.well-known/jwks.json) in;
    /// made when missing and rotated. A Secret of that name the controller did not make is
    /// never overwritten.
    #[arg(
        long,
        env = "TOOLGRID_IDENTITY_SECRET",
        default_value = "toolgrid-identity-keys"
    )]
    identity_secret: String,
    /// The CA certificate (PEM) worker pods trust to reach an `https://` control plane;
    /// handed to them inline (`TOOLGRID_TLS_CA_PEM`). Default: the system's roots.
    #[arg(long, env = "TOOLGRID_WORKER_TLS_CA")]
    worker_tls_ca: Option<std::path::PathBuf>,
    /// A static operator token (e.g. from a Secret), besides the subjects Kubernetes RBAC
    /// lets operate toolgrid. Optional.
    #[arg(long, env = "TOOLGRID_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Hosts artifact URLs (and their redirects) may name, as globs (`*` matches any
    /// characters: `*.example.org`), comma-separated; the chart sets it from
    /// `artifacts.allowedHosts`. Default: any host with public addresses.
    #[arg(long, env = "TOOLGRID_ARTIFACT_HOSTS", value_delimiter = ',')]
    artifact_hosts: Vec<String>,
    /// Download artifacts from loopback, private, link-local and other non-public addresses
    /// too (off: a ToolRelease's author could make the controller probe internal URLs).
    #[arg(long, env = "TOOLGRID_ARTIFACT_ALLOW_PRIVATE")]
    artifact_allow_private: bool,
    /// Download artifacts through this HTTP(S) proxy. The environment's HTTP_PROXY,
    /// HTTPS_PROXY and ALL_PROXY are never used for artifacts.
    #[arg(long, env = "TOOLGRID_ARTIFACT_PROXY")]
    artifact_proxy: Option<String>,
    /// A console session unused this long ends (the browser must log in again).
    #[arg(long, env = "TOOLGRID_CONSOLE_IDLE_TIMEOUT", default_value = "30m", value_parser = humantime::parse_duration)]
    console_idle_timeout: std::time::Duration,
    /// A console session ends this long after login, however busy.
    #[arg(long, env = "TOOLGRID_CONSOLE_SESSION_LIFETIME", default_value = "12h", value_parser = humantime::parse_duration)]
    console_session_lifetime: std::time::Duration,
    #[command(flatten)]
    mcp: crate::cli::up::McpArgs,
}

impl ControllerArgs {
    pub fn otlp_endpoint(&self) -> Option<String> {
        self.otlp_endpoint.clone().filter(|e| !e.is_empty())
    }
}

pub async fn run(args: ControllerArgs) -> anyhow::Result<()> {
    let pod_name = args
        .pod_name
        .clone()
        .unwrap_or_else(|| format!("toolgrid-controller-{}", std::process::id()));
    let image = args
        .worker_image
        .clone()
        .or_else(|| std::env::var("TOOLGRID_IMAGE").ok())
        .unwrap_or_else(|| format!("ghcr.io/toolgrid/toolgrid:{}", env!("CARGO_PKG_VERSION")));
    let control_plane_address = args.control_plane_address.clone().unwrap_or_else(|| {
        let scheme = if args.tls_cert.is_some() || args.tls_self_signed {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://toolgrid.{}.svc:7070", args.pod_namespace)
    });
    let tls = toolgrid_control_plane::platform::tls::ServerTls::from_args(
        args.tls_cert.as_deref(),
        args.tls_key.as_deref(),
    )?;
    let worker_tls_ca = match &args.worker_tls_ca {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?,
        ),
        None => None,
    };
    if let (Some(tls), Some(cert), Some(key)) = (&tls, &args.tls_cert, &args.tls_key) {
        // cert-manager renews into the mounted Secret; serve the renewal without a restart.
        tls.reload_files(
            cert.clone(),
            key.clone(),
            std::time::Duration::from_secs(60),
        );
    }
    let self_signed =
        (tls.is_none() && args.tls_self_signed).then(|| toolgrid_controller::SelfSigned {
            secret: args.tls_self_signed_secret.clone(),
            names: self_signed_names(&control_plane_address),
        });
    toolgrid_controller::run(Settings {
        listen: args.listen,
        http_listen: args.http_listen,
        metrics_listen: args.metrics_listen,
        store_url: args.store,
        store_options: args.store_tuning.options(),
        builtins_namespace: args
            .builtins_namespace
            .filter(|n| !n.is_empty())
            .or_else(|| args.watch_namespace.clone().filter(|n| !n.is_empty()))
            .unwrap_or_else(|| args.pod_namespace.clone()),
        builtins: args.builtins,
        watch_namespace: args.watch_namespace.filter(|n| !n.is_empty()),
        worker_image: image,
        otlp_endpoint: args.otlp_endpoint.clone().filter(|e| !e.is_empty()),
        control_plane_address,
        worker_lease: args.lease.get(),
        heartbeat: args.heartbeat.get(),
        max_queued_per_agent: args.max_queued_per_agent,
        console_limits: toolgrid_core::auth::SessionLimits {
            idle: args.console_idle_timeout,
            lifetime: args.console_session_lifetime,
        },
        pod_name,
        pod_namespace: args.pod_namespace,
        lease_name: args.lease_name,
        leader_timing: (
            args.leader_lease.get(),
            args.leader_renew_deadline.get(),
            args.leader_renew_every.get(),
        ),
        retain: args.retain,
        tls,
        self_signed,
        identity_secret: args.identity_secret,
        worker_tls_ca,
        admin_token: args
            .admin_token
            .clone()
            .filter(|t| !t.is_empty())
            .map(|t| toolgrid_core::secret::SecretValue::new(t.into_bytes())),
        mcp: args.mcp.config(),
        oauth: args.mcp.oauth()?,
        artifact_fetch: toolgrid_controller::fetch::FetchPolicy {
            allowed_hosts: args
                .artifact_hosts
                .iter()
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .collect(),
            allow_private: args.artifact_allow_private,
            proxy: match args.artifact_proxy.as_deref().filter(|p| !p.is_empty()) {
                Some(proxy) => Some(
                    proxy
                        .parse()
                        .map_err(|e| anyhow::anyhow!("--artifact-proxy {proxy:?}: {e}"))?,
                ),
                None => None,
            },
        },
    })
    .await
}

/// The names a self-made serving certificate covers: the control plane address's host and,
/// for a Service name `NAME.NAMESPACE.svc`, `NAME`, `NAME.NAMESPACE` and
/// `NAME.NAMESPACE.svc.cluster.local`.
fn self_signed_names(control_plane_address: &str) -> Vec<String> {
    let host = control_plane_address
        .split_once("://")
        .map_or(control_plane_address, |(_, rest)| rest)
        .split(['/', ':'])
        .next()
        .unwrap_or_default()
        .to_string();
    let mut names = vec![host.clone()];
    if let Some(service) = host.strip_suffix(".svc") {
        names.push(format!("{host}.cluster.local"));
        names.push(service.to_string());
        if let Some((name, _)) = service.split_once('.') {
            names.push(name.to_string());
        }
    }
    names.push("localhost".into());
    names.retain(|n| !n.is_empty());
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::self_signed_names;

    #[test]
    fn a_self_made_certificate_names_the_service_in_every_form() {
        assert_eq!(
            self_signed_names("https://toolgrid.tg.svc:7070"),
            [
                "toolgrid.tg.svc",
                "toolgrid.tg.svc.cluster.local",
                "toolgrid.tg",
                "toolgrid",
                "localhost"
            ]
        );
        assert_eq!(
            self_signed_names("https://cp.example.org"),
            ["cp.example.org", "localhost"]
        );
    }
}
