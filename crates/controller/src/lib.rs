//! `toolgrid controller`: the control plane in a Kubernetes cluster. It watches the six
//! CRDs (and the ConfigMaps, Secrets and ServiceAccounts they refer to), feeds the same
//! catalog as `toolgrid up` through the same reconcile logic, writes every status through
//! the status subresource, owns the worker Deployments, and serves the same gRPC and HTTP
//! APIs and worker link. Replicas elect a leader with a Lease; only the leader works.

pub mod agent_data;
pub mod builtins;
pub mod checked;
pub mod deployment;
pub mod fetch;
pub mod health;
pub mod identity_secret;
pub mod leader;
#[cfg(test)]
mod mock;
pub mod owned_secret;
pub mod reconcile;
pub mod refresh;
pub mod review;
pub mod review_cache;
pub mod source;
pub mod status;
pub mod tls_secret;
pub mod wake;

use anyhow::Context as _;
use health::Readiness;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::Api;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use leader::{LeaderElector, LeaseSettings};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use toolgrid_control_plane::auth::{JoinSecret, TokenReviewer, WorkerAuthenticator};
use toolgrid_control_plane::platform::{ControlPlane, Listeners, Security};
use toolgrid_control_plane::scheduler::SchedulerConfig;

/// Everything `toolgrid controller` is told.
#[derive(Clone, Debug)]
pub struct Settings {
    pub listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub metrics_listen: SocketAddr,
    pub store_url: String,
    /// How the store at `store_url` is opened (the writer's idle poll).
    pub store_options: toolgrid_store::OpenOptions,
    /// Watch one namespace, or all.
    pub watch_namespace: Option<String>,
    pub worker_image: String,
    /// Where the workers it runs send their traces (OTLP/gRPC), as the controller does.
    pub otlp_endpoint: Option<String>,
    /// What worker pods dial.
    pub control_plane_address: String,
    pub worker_lease: Duration,
    pub heartbeat: Duration,
    /// How many calls of one agent may wait for a worker of one pool.
    pub max_queued_per_agent: u32,
    /// How long console sessions live (idle and in all).
    pub console_limits: toolgrid_core::auth::SessionLimits,
    pub pod_name: String,
    pub pod_namespace: String,
    pub lease_name: String,
    /// The leader lease's timing: (duration, renew deadline, renew period).
    pub leader_timing: (Duration, Duration, Duration),
    /// Delete calls that ended longer ago than this (retention); `None` keeps them all.
    pub retain: Option<Duration>,
    /// Directories of built-in tools served beside the cluster's resources (a later one's
    /// replacing an earlier one's), and the namespace they are served in.
    pub builtins: Vec<std::path::PathBuf>,
    pub builtins_namespace: String,
    /// TLS on the gRPC and HTTP ports, from certificate files.
    pub tls: Option<toolgrid_control_plane::platform::tls::ServerTls>,
    /// Without `tls`: serve with a CA and certificate the controller makes, keeps in this
    /// Secret of its namespace and rotates ([`tls_secret`]), for these names.
    pub self_signed: Option<SelfSigned>,
    /// The Secret of its namespace the controller keeps its identity signing keys in (made
    /// when missing, rotated; see [`identity_secret`]).
    pub identity_secret: String,
    /// The CA certificate (PEM) worker pods trust for an `https://` control plane.
    pub worker_tls_ca: Option<String>,
    /// A static operator token accepted besides the cluster's own subjects (never printed).
    pub admin_token: Option<toolgrid_core::secret::SecretValue>,
    /// How `/mcp` presents itself.
    pub mcp: toolgrid_control_plane::gateway::mcp::McpConfig,
    /// The OAuth authorization server whose access tokens are accepted.
    pub oauth: Option<toolgrid_control_plane::auth::oauth::OAuthIssuer>,
    /// Where ToolRelease and Middleware artifacts may be downloaded from.
    pub artifact_fetch: fetch::FetchPolicy,
}

/// Where `--tls-self-signed` keeps its CA, and what its certificate covers.
#[derive(Clone, Debug)]
pub struct SelfSigned {
    pub secret: String,
    pub names: Vec<String>,
}

/// Who may attach as a worker: a worker pod's projected ServiceAccount token (audience
/// `toolgrid-worker`), reviewed by the cluster, for the pool whose workers run as that
/// ServiceAccount ([`toolgrid_control_plane::auth::ServiceAccountWorkers`]); and, when the controller is given
/// `TOOLGRID_JOIN_TOKEN`, workers outside the cluster holding that join secret.
fn worker_authenticator(
    reviewer: Arc<dyn TokenReviewer>,
    catalog: Arc<toolgrid_catalog::Catalog>,
) -> Arc<dyn WorkerAuthenticator> {
    let join = std::env::var(toolgrid_control_plane::auth::worker::JOIN_TOKEN_ENV)
        .ok()
        .map(|token| token.trim().to_string())
        .filter(|token| !token.is_empty())
        .map(JoinSecret::new);
    Arc::new(toolgrid_control_plane::auth::worker::ClusterWorkers {
        join,
        accounts: toolgrid_control_plane::auth::ServiceAccountWorkers::new(reviewer, catalog),
    })
}

/// Runs the controller until it stops leading or is told to stop.
pub async fn run(settings: Settings) -> anyhow::Result<()> {
    let readiness = Arc::new(Readiness::default());
    let probes = tokio::net::TcpListener::bind(settings.metrics_listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen for probes and metrics on {}",
                settings.metrics_listen
            )
        })?;
    let probe_router = health::router(readiness.clone());
    tokio::spawn(async move {
        if let Err(error) = axum::serve(probes, probe_router).await {
            tracing::error!(%error, "the probe server stopped");
        }
    });

    let client = Client::try_default()
        .await
        .context("cannot reach the Kubernetes API")?;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "toolgrid-controller".into(),
            instance: Some(settings.pod_name.clone()),
        },
    );
    wait_for_crds(&client, &readiness, &recorder, &settings).await;

    let elector = Arc::new(LeaderElector::new(
        Api::namespaced(client.clone(), &settings.pod_namespace),
        LeaseSettings::standard(
            settings.lease_name.clone(),
            settings.pod_namespace.clone(),
            settings.pod_name.clone(),
        )
        .with_timing(
            settings.leader_timing.0,
            settings.leader_timing.1,
            settings.leader_timing.2,
        )
        .map_err(anyhow::Error::msg)?,
    ));
    let mut leading = elector.clone().run();
    tracing::info!(identity = %settings.pod_name, "campaigning for leadership");
    while !*leading.borrow_and_update() {
        leading.changed().await?;
    }
    readiness.set_leader(true);

    // From here on everything runs only while we lead: losing the lease (or failing to
    // renew it in time) stops it at once, during start-up too.
    let lost = async {
        while leading.changed().await.is_ok() {
            if !*leading.borrow() {
                return;
            }
        }
    };
    tokio::select! {
        led = lead(&settings, client, recorder, &readiness) => led?,
        _ = lost => {
            readiness.set_leader(false);
            anyhow::bail!("lost leadership; exiting so that only the new leader schedules");
        }
    }
    readiness.set_leader(false);
    match tokio::time::timeout(Duration::from_secs(5), elector.release()).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot release the lease; the next leader waits for it to expire")
        }
        Err(_) => tracing::warn!(
            "the lease API did not answer; the next leader waits for the lease to expire"
        ),
    }
    Ok(())
}

/// The platform's URL identity tokens name as issuer: `--mcp-public-url`, else the HTTP port
/// on the host workers reach the control plane at.
fn issuer_url(settings: &Settings) -> String {
    if let Some(url) = &settings.mcp.public_url {
        return url.trim_end_matches('/').to_string();
    }
    match url::Url::parse(&settings.control_plane_address) {
        Ok(url) => format!(
            "{}://{}:{}",
            url.scheme(),
            url.host_str().unwrap_or("localhost"),
            settings.http_listen.port()
        ),
        Err(_) => format!("http://localhost:{}", settings.http_listen.port()),
    }
}

/// The leader's work: the store, the catalog, the servers and the reconcilers, until told
/// to stop (Ok) or something stops (Err).
async fn lead(
    settings: &Settings,
    client: Client,
    recorder: Recorder,
    readiness: &Readiness,
) -> anyhow::Result<()> {
    let store = toolgrid_store::SqlStore::open_with(&settings.store_url, settings.store_options)
        .await
        .with_context(|| format!("cannot open the store at {}", settings.store_url))?;
    // Its commits and syncs, at /metrics.
    toolgrid_control_plane::metrics::count_store_writes(store.write_counters());
    let store: Arc<dyn toolgrid_store::Store> = Arc::new(store);
    // Who holds a caller's or a worker pod's token, and who may operate: the gateway
    // (callers, audience `toolgrid`) and the worker link (audience `toolgrid-worker`) ask it.
    let reviewer: Arc<dyn TokenReviewer> = token_reviewer(&client);
    let control_plane = ControlPlane::start(
        store.clone(),
        SchedulerConfig {
            heartbeat_interval: settings.heartbeat,
            lease: settings.worker_lease,
            reattach_grace: (settings.worker_lease * 2).max(Duration::from_secs(5)),
            max_queued_per_agent: settings.max_queued_per_agent,
            ..SchedulerConfig::default()
        },
        // Agent tokens, ServiceAccount tokens the cluster reviews, operators by RBAC, and the
        // optional static admin token.
        {
            let mut auth = toolgrid_control_plane::gateway::Authenticator::new()
                .with_reviewer(reviewer.clone(), settings.pod_namespace.clone());
            if let Some(issuer) = settings.oauth.clone() {
                auth = auth.with_oauth(issuer);
            }
            match &settings.admin_token {
                Some(token) => auth.with_admin_token(token.expose_str().unwrap_or_default()),
                None => auth,
            }
        },
    )
    .await?;
    control_plane
        .gateway
        .set_console_limits(settings.console_limits);
    // The keys identity tokens for upstreams are signed with (and the JWKS publishes), the
    // same for every replica and restart: kept in a Secret, rotated by the leader.
    {
        let api = Api::namespaced(client.clone(), &settings.pod_namespace);
        let keys =
            identity_secret::ensure(&api, &settings.identity_secret, owned_secret::unix_now())
                .await?;
        tracing::info!(secret = %settings.identity_secret, signing = %keys.current.kid, "identity signing keys loaded");
        let keys = toolgrid_control_plane::identity::IdentityKeys::in_memory(keys);
        control_plane
            .gateway
            .set_identity(keys.clone(), issuer_url(settings));
        tokio::spawn(identity_secret::rotate(
            api,
            settings.identity_secret.clone(),
            keys,
        ));
    }
    let builtins = if settings.builtins.is_empty() {
        None
    } else {
        let loaded = builtins::Builtins::load(&settings.builtins, &settings.builtins_namespace)?
            .put_in(store.as_ref())
            .await?;
        tracing::info!(tools = loaded.tools(), namespace = %settings.builtins_namespace, "built-in tools loaded");
        Some(Arc::new(loaded))
    };
    let source = source::ClusterSource::start(
        &client,
        settings.watch_namespace.as_deref(),
        &control_plane,
        settings.artifact_fetch.clone(),
        builtins,
    );
    control_plane
        .gateway
        .set_source_refresher(Arc::new(refresh::AnnotationRefresher {
            client: client.clone(),
        }));
    source.wait_synced().await?;
    let snapshot = source.resolve_once().await?;
    tracing::info!(
        tools = snapshot.tools.len(),
        releases = snapshot.releases.len(),
        pools = snapshot.pools.len(),
        "catalog synced"
    );
    if let Some(retain) = settings.retain {
        toolgrid_control_plane::platform::retention::spawn(
            store,
            control_plane.catalog.clone(),
            retain,
        );
    }
    let caches = source.caches.clone();
    tokio::spawn(source.clone().drive());

    let worker_ca = deployment::WorkerCa::new(settings.worker_tls_ca.clone());
    let tls = match &settings.self_signed {
        Some(self_signed) => {
            let api = Api::namespaced(client.clone(), &settings.pod_namespace);
            let bundle = tls_secret::ensure(
                &api,
                &self_signed.secret,
                &self_signed.names,
                owned_secret::unix_now(),
            )
            .await?;
            let tls = toolgrid_control_plane::platform::tls::ServerTls::from_bundle(&bundle)
                .map_err(tls_secret::TlsSecretError::from)?;
            tracing::info!(secret = %self_signed.secret, names = ?self_signed.names, ca = %bundle.ca.name, "serving with the controller's own CA");
            worker_ca.set(bundle.trust_pem());
            tokio::spawn(tls_secret::rotate(
                api,
                self_signed.secret.clone(),
                self_signed.names.clone(),
                tls.clone(),
                worker_ca.clone(),
                bundle,
            ));
            Some(tls)
        }
        None => settings.tls.clone(),
    };
    let listeners = Listeners::bind(settings.listen, Some(settings.http_listen)).await?;
    let security = Security {
        workers: worker_authenticator(reviewer.clone(), control_plane.catalog.clone()),
        tls,
        mcp: settings.mcp.clone(),
    };
    let (grpc, http, server) = control_plane.serve(listeners, security)?;
    tracing::info!(%grpc, %http, metrics = %settings.metrics_listen, "serving");
    readiness.set_synced(true);

    let context = Arc::new(reconcile::Context {
        client,
        catalog: control_plane.catalog.clone(),
        scheduler: control_plane.scheduler.clone(),
        recorder,
        workers: deployment::WorkerSettings {
            image: settings.worker_image.clone(),
            control_plane: settings.control_plane_address.clone(),
            tls_ca: worker_ca,
            otlp_endpoint: settings.otlp_endpoint.clone(),
        },
        namespace: settings.watch_namespace.clone(),
        service_accounts: caches.service_accounts.clone(),
    });
    let controllers = tokio::spawn(reconcile::run(context));

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted; stopping"),
        _ = terminate.recv() => tracing::info!("terminated; stopping"),
        _ = server => anyhow::bail!("the servers stopped"),
        _ = controllers => anyhow::bail!("the controllers stopped"),
    }
    Ok(())
}

/// The cluster's [`TokenReviewer`] (TokenReview and SubjectAccessReview through `client`,
/// answers kept briefly): see [`review::KubeReviewer`].
pub fn token_reviewer(client: &Client) -> Arc<dyn TokenReviewer> {
    Arc::new(review::KubeReviewer::new(client.clone()))
}

/// Waits (readiness 503, a log line and an event) until the six CRDs exist, instead of
/// crash-looping.
async fn wait_for_crds(
    client: &Client,
    readiness: &Readiness,
    recorder: &Recorder,
    settings: &Settings,
) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let names: Vec<String> = toolgrid_api::all_crds()
        .into_iter()
        .filter_map(|crd| crd.metadata.name)
        .collect();
    let mut told = false;
    loop {
        let mut missing = Vec::new();
        for name in &names {
            match api.get_opt(name).await {
                Ok(Some(_)) => {}
                Ok(None) => missing.push(name.clone()),
                Err(error) => {
                    tracing::warn!(%error, crd = %name, "cannot read the CRD");
                    missing.push(name.clone());
                }
            }
        }
        readiness.set_crds(missing.is_empty(), &missing);
        if missing.is_empty() {
            if told {
                tracing::info!("the CRDs are installed");
            }
            return;
        }
        if !told {
            tracing::warn!(missing = ?missing, "waiting for the toolgrid CRDs (install them with the chart or `kubectl apply -f crds/`)");
            let pod = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(settings.pod_name.clone()),
                namespace: Some(settings.pod_namespace.clone()),
                ..ObjectReference::default()
            };
            let event = KubeEvent {
                type_: EventType::Warning,
                reason: "MissingCRDs".into(),
                note: Some(format!("waiting for the CRDs: {}", missing.join(", "))),
                action: "WaitForCRDs".into(),
                secondary: None,
            };
            if let Err(error) = recorder.publish(&event, &pod).await {
                tracing::debug!(%error, "cannot publish the MissingCRDs event");
            }
            told = true;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
