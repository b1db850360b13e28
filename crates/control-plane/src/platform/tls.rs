//! TLS on the control plane's ports (`--tls-cert`/`--tls-key`): gRPC through tonic, HTTP
//! through tokio-rustls. Clients' TLS is `toolgrid_proto::tls`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use tonic::transport::{Identity, ServerTlsConfig};
use toolgrid_proto::tls::{TlsError, install_provider, read_pem};

/// How long a client may take to finish its TLS handshake on the HTTP port.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
        let cert_pem = read_pem(cert)?;
        let key_pem = read_pem(key)?;
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
            let (tcp, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait and go on.
                    tracing::warn!(%error, "cannot accept an HTTPS connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            // The client's address, as `axum::serve` records it over plain HTTP.
            let router = router
                .clone()
                .layer(axum::Extension(axum::extract::ConnectInfo(peer)));
            let acceptor = acceptor.clone();
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
