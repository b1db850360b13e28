//! Assembly of a control plane: store, catalog, scheduler, gateway, and the gRPC and HTTP
//! servers. `toolgrid up` adds a manifest directory and local worker processes; the cluster
//! controller adds the Kubernetes source.

pub mod ca;
mod local_pools;
mod one_write;
pub mod retention;
pub mod tls;

pub use local_pools::LocalPools;

use crate::auth::WorkerAuthenticator;
use crate::gateway::{AuthenticatedTools, Authenticator, Gateway, ToolsService};
use crate::scheduler::{CallWatch, Scheduler, SchedulerConfig, WorkerLinkService};
use futures::TryStreamExt;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use toolgrid_catalog::Catalog;
use toolgrid_proto::tools_server::ToolsServer;
use toolgrid_proto::worker_link_server::WorkerLinkServer;
use toolgrid_store::Store;

/// The parts of a running control plane.
pub struct ControlPlane {
    pub store: Arc<dyn Store>,
    pub catalog: Arc<Catalog>,
    pub scheduler: Arc<Scheduler>,
    pub gateway: Arc<Gateway>,
}

/// How a control plane's ports are secured.
#[derive(Clone)]
pub struct Security {
    /// Who may attach as a worker (the join secret of `toolgrid up`; ServiceAccount tokens
    /// in a cluster).
    pub workers: Arc<dyn WorkerAuthenticator>,
    /// TLS on both ports (gRPC and HTTP), or plaintext.
    pub tls: Option<tls::ServerTls>,
    /// How `/mcp` presents itself (public URL, OAuth authorization servers, origins).
    pub mcp: crate::gateway::mcp::McpConfig,
}

/// Where a control plane listens.
pub struct Listeners {
    pub grpc: TcpListener,
    pub http: TcpListener,
}

impl Listeners {
    /// Binds gRPC on `grpc` and HTTP on `http`, or on the port after gRPC's (an ephemeral
    /// port when gRPC's is 0).
    pub async fn bind(grpc: SocketAddr, http: Option<SocketAddr>) -> std::io::Result<Self> {
        let grpc_listener = TcpListener::bind(grpc).await?;
        let bound = grpc_listener.local_addr()?;
        let http = http.unwrap_or_else(|| {
            let port = if grpc.port() == 0 {
                0
            } else {
                bound.port().saturating_add(1)
            };
            SocketAddr::new(bound.ip(), port)
        });
        let http = TcpListener::bind(http).await?;
        Ok(Listeners {
            grpc: grpc_listener,
            http,
        })
    }
}

/// Secret values as the catalog holds them now (from the manifest directory's Secrets, or
/// the Secrets Agents name in a cluster): what the scheduler puts in an assignment.
struct CatalogSecrets {
    catalog: Arc<Catalog>,
    issuer: crate::identity::IssuerCell,
}

impl crate::scheduler::SecretSource for CatalogSecrets {
    fn values(
        &self,
        namespace: &str,
        agent: &str,
        keys: &[String],
    ) -> Result<
        std::collections::BTreeMap<String, toolgrid_core::secret::SecretValue>,
        crate::scheduler::SecretError,
    > {
        Ok(self.catalog.current().secret_values(namespace, agent, keys))
    }

    fn source_values(
        &self,
        namespace: &str,
        source: &str,
    ) -> Vec<toolgrid_core::secret::SecretValue> {
        self.catalog
            .current()
            .source_secrets
            .get(&toolgrid_core::ids::ObjectKey::new(namespace, source))
            .map(|values| values.values().cloned().collect())
            .unwrap_or_default()
    }

    fn upstream_credentials(
        &self,
        call: &crate::scheduler::UpstreamCredentialsFor<'_>,
    ) -> Result<
        std::collections::BTreeMap<String, toolgrid_core::secret::SecretValue>,
        crate::scheduler::SecretError,
    > {
        let snapshot = self.catalog.current();
        let key = toolgrid_core::ids::ObjectKey::new(call.namespace, call.upstream.source.clone());
        let mut values = snapshot
            .source_secrets
            .get(&key)
            .cloned()
            .unwrap_or_default();
        if call.upstream.identity {
            let issuer =
                self.issuer
                    .get()
                    .ok_or_else(|| crate::scheduler::SecretError::Upstream {
                        source_name: call.upstream.source.clone(),
                        reason: "this control plane has no identity signing keys".into(),
                    })?;
            let token = issuer.mint_now(
                &call.upstream.endpoint,
                call.namespace,
                call.agent.unwrap_or("operator"),
                call.tool,
                call.call_id,
            );
            values.insert(
                toolgrid_core::source::IDENTITY_SECRET.to_string(),
                toolgrid_core::secret::SecretValue::new(token.into_bytes()),
            );
        }
        Ok(values)
    }
}

/// How often the approval timer looks for lapsed waits.
pub const APPROVAL_TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the approval timer reads every waiting call from the store even when no
/// deadline it knows of has come.
pub const APPROVAL_RESCAN: std::time::Duration = std::time::Duration::from_secs(30);

/// Applies lapsed approval timeouts every [`APPROVAL_TICK`] (see
/// [`Gateway::apply_approval_timeouts`]). Its only state is the store's, so it survives a
/// restart: a wait that lapsed while no control plane ran is applied at the first tick.
async fn approval_timer(gateway: Arc<Gateway>) {
    let mut ticks = tokio::time::interval(APPROVAL_TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_scan = tokio::time::Instant::now();
    loop {
        ticks.tick().await;
        let rescan = last_scan.elapsed() >= APPROVAL_RESCAN;
        if rescan {
            last_scan = tokio::time::Instant::now();
        }
        if let Err(error) = gateway
            .apply_approval_timeouts(toolgrid_store::now_ms(), rescan)
            .await
        {
            tracing::warn!(error = %error.message, "approval timeouts not applied; retrying");
        }
    }
}

impl ControlPlane {
    /// Wires the parts together over an open store and recovers unfinished calls; callers
    /// are authenticated by `auth`.
    pub async fn start(
        store: Arc<dyn Store>,
        config: SchedulerConfig,
        auth: Authenticator,
    ) -> anyhow::Result<Self> {
        let catalog = Catalog::new();
        let calls = Arc::new(CallWatch::default());
        let scheduler = Scheduler::new(store.clone(), calls.clone(), config);
        scheduler.recover().await?;
        tokio::spawn(scheduler.clone().run());
        let gateway = Gateway::new(
            catalog.clone(),
            store.clone(),
            scheduler.clone(),
            calls,
            auth,
        );
        scheduler.set_secret_source(Arc::new(CatalogSecrets {
            catalog: catalog.clone(),
            issuer: gateway.issuer(),
        }));
        // Programs' tool calls (code mode) are admitted by the gateway, as their caller.
        let nested: Arc<dyn crate::scheduler::NestedCaller> = gateway.clone();
        scheduler.set_nested_caller(Arc::downgrade(&nested));
        tokio::spawn(approval_timer(gateway.clone()));
        gateway.rollouts().load(&*store).await?;
        tokio::spawn(crate::rollout::run(
            store.clone(),
            catalog.clone(),
            gateway.rollouts(),
        ));
        retention::spawn_session_purge(store.clone());
        Ok(ControlPlane {
            store,
            catalog,
            scheduler,
            gateway,
        })
    }

    /// Serves gRPC (Tools and WorkerLink) and HTTP until the process ends, both over TLS
    /// when `security.tls` is set.
    pub fn serve(
        &self,
        listeners: Listeners,
        security: Security,
    ) -> anyhow::Result<(SocketAddr, SocketAddr, JoinHandle<()>)> {
        let grpc_addr = listeners.grpc.local_addr()?;
        let http_addr = listeners.http.local_addr()?;
        if security.tls.is_none() {
            for (port, addr) in [("gRPC", grpc_addr), ("HTTP", http_addr)] {
                if tls::plaintext_exposed(addr) {
                    tracing::warn!(
                        %addr,
                        "serving {port} without TLS on a non-loopback address: tokens and \
                         results cross the network in plaintext (give --tls-cert/--tls-key)"
                    );
                }
            }
        }
        // Every Tools RPC is authenticated before it reaches the service. (The worker link
        // authenticates workers on its own.)
        let tools = AuthenticatedTools::new(
            ToolsServer::new(ToolsService::new(self.gateway.clone()))
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20),
            self.gateway.clone(),
        );
        // Workspace reads too; the service checks whose workspace it is.
        let workspaces = AuthenticatedTools::new(
            toolgrid_proto::workspaces_server::WorkspacesServer::new(
                crate::gateway::workspaces::WorkspacesService::new(self.store.clone()),
            )
            .max_encoding_message_size(64 << 20),
            self.gateway.clone(),
        );
        let link = WorkerLinkServer::new(WorkerLinkService::new(
            self.scheduler.clone(),
            self.store.clone(),
            security.workers.clone(),
        ))
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20);
        let builder = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
            .add_service(tools)
            .add_service(workspaces)
            .add_service(link);
        let grpc: std::pin::Pin<
            Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>,
        > = match &security.tls {
            // TLS handshakes here, with the certificate current at each one (see
            // `tls::ServerTls::replace`).
            // Each connection as `OneWrite`: a unary response leaves in one write.
            Some(tls) => Box::pin(
                builder.serve_with_incoming(
                    tls.grpc_incoming(listeners.grpc)
                        .map_ok(one_write::OneWrite::new),
                ),
            ),
            None => {
                // Small request/response frames must not wait for Nagle's algorithm.
                let incoming = tonic::transport::server::TcpIncoming::from(listeners.grpc)
                    .with_nodelay(Some(true));
                Box::pin(builder.serve_with_incoming(incoming.map_ok(one_write::OneWrite::new)))
            }
        };
        // Workers can attach from now on: the re-attach grace of recovered calls starts here,
        // not when the store was opened (the catalog may have taken a while to sync).
        self.scheduler.listening();
        let catalog = self.catalog.clone();
        let ready: Arc<dyn Fn() -> bool + Send + Sync> =
            Arc::new(move || catalog.current().revision > 0);
        let router = crate::gateway::router_with(self.gateway.clone(), ready, security.mcp.clone());
        let http: std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>> =
            match security.tls {
                Some(tls) => {
                    // The console marks its session cookie Secure on an HTTPS port.
                    let router = router.layer(axum::Extension(crate::gateway::console::Tls));
                    Box::pin(async move { tls.serve_http(listeners.http, router).await })
                }
                None => Box::pin(async move {
                    // Client addresses for the per-address limits (see `gateway::authn`).
                    let service = router.into_make_service_with_connect_info::<SocketAddr>();
                    axum::serve(listeners.http, service).await
                }),
            };
        let handle = tokio::spawn(async move {
            tokio::select! {
                result = grpc => if let Err(error) = result { tracing::error!(%error, "gRPC server stopped") },
                result = http => if let Err(error) = result { tracing::error!(%error, "HTTP server stopped") },
            }
        });
        Ok((grpc_addr, http_addr, handle))
    }
}
