//! TLS on the control plane's ports (`--tls-cert`/`--tls-key`: gRPC through tonic, HTTP
//! through tokio-rustls) and in its clients (the CLI and workers: `https://` endpoints,
//! trusting `--tls-ca` or, without it, the system's roots).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};

/// The environment variable clients read the CA file from (as `--tls-ca`).
pub const TLS_CA_ENV: &str = "TOOLGRID_TLS_CA";
/// The environment variable a worker reads the CA certificate itself (PEM) from: how the
/// controller hands its worker pods the CA (a certificate is public; no Secret needed).
pub const TLS_CA_PEM_ENV: &str = "TOOLGRID_TLS_CA_PEM";

/// How long a client may take to finish its TLS handshake on the HTTP port.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("TLS: {0}")]
    Config(String),
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Installs ring as the process's TLS provider (the servers' rustls configs use the
/// process default); a second call changes nothing.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A server certificate chain and its key, loaded from PEM files.
#[derive(Clone)]
pub struct ServerTls {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    http: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls(..)")
    }
}

impl ServerTls {
    /// Loads `cert` (PEM, the chain, leaf first) and `key` (PEM, PKCS#8, PKCS#1 or SEC1),
    /// and checks that they go together.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        install_provider();
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| TlsError::Invalid {
                path: cert.to_path_buf(),
                message: format!("not a PEM certificate chain: {e}"),
            })?;
        if chain.is_empty() {
            return Err(TlsError::Invalid {
                path: cert.to_path_buf(),
                message: "holds no certificate".into(),
            });
        }
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Invalid {
            path: key.to_path_buf(),
            message: format!("not a PEM private key: {e}"),
        })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut http = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(|e| TlsError::Invalid {
                path: key.to_path_buf(),
                message: format!("does not go with {}: {e}", cert.display()),
            })?;
        http.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            cert_pem,
            key_pem,
            http: Arc::new(http),
        })
    }

    /// Loads the pair when both paths are given; one without the other is an error.
    pub fn from_args(cert: Option<&Path>, key: Option<&Path>) -> Result<Option<Self>, TlsError> {
        match (cert, key) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => ServerTls::load(cert, key).map(Some),
            _ => Err(TlsError::Config(
                "--tls-cert and --tls-key go together".into(),
            )),
        }
    }

    /// The gRPC server's TLS.
    pub fn grpc(&self) -> ServerTlsConfig {
        ServerTlsConfig::new().identity(Identity::from_pem(&self.cert_pem, &self.key_pem))
    }

    /// Serves `router` over TLS on `listener` until the listener fails.
    pub async fn serve_http(
        &self,
        listener: TcpListener,
        router: axum::Router,
    ) -> std::io::Result<()> {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let acceptor = tokio_rustls::TlsAcceptor::from(self.http.clone());
        loop {
            let (tcp, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait and go on.
                    tracing::warn!(%error, "cannot accept an HTTPS connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let stream =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(error)) => {
                            tracing::debug!(%error, "TLS handshake failed");
                            return;
                        }
                        Err(_) => return,
                    };
                let service = hyper_util::service::TowerToHyperService::new(router);
                if let Err(error) =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await
                {
                    tracing::debug!(%error, "HTTPS connection ended");
                }
            });
        }
    }
}

/// The URL of a control plane address given as `host:port` (plaintext) or a full URL.
pub fn endpoint_url(address: &str) -> String {
    if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

/// The certificates a client trusts for an `https://` control plane.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Trust {
    /// The system's roots.
    #[default]
    SystemRoots,
    /// This CA certificate (PEM) only.
    Ca(Vec<u8>),
}

impl Trust {
    /// The CA in a PEM file (`--tls-ca`), else the CA given inline, else the system roots.
    pub fn of(file: Option<&Path>, pem: Option<&str>) -> Result<Trust, TlsError> {
        match (file, pem.filter(|p| !p.trim().is_empty())) {
            (Some(path), _) => Ok(Trust::Ca(read(path)?)),
            (None, Some(pem)) => Ok(Trust::Ca(pem.as_bytes().to_vec())),
            (None, None) => Ok(Trust::SystemRoots),
        }
    }
}

/// An endpoint for `url`: `https://` trusts what `trust` says.
pub fn client_endpoint(url: &str, trust: &Trust) -> Result<Endpoint, TlsError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| TlsError::Config(format!("bad address {url:?}: {e}")))?;
    if !url.starts_with("https://") {
        return Ok(endpoint);
    }
    install_provider();
    let tls = match trust {
        Trust::Ca(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
        Trust::SystemRoots => ClientTlsConfig::new().with_native_roots(),
    };
    endpoint
        .tls_config(tls)
        .map_err(|e| TlsError::Config(e.to_string()))
}
