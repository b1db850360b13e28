//! TLS on the control plane's ports (`--tls-cert`/`--tls-key`): gRPC through tonic, HTTP
//! through tokio-rustls. Clients' TLS is `toolgrid_proto::tls`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::rustls;
use toolgrid_proto::tls::{TlsError, install_provider, read_pem};

/// How long a client may take to finish its TLS handshake on the HTTP port.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether serving on `addr` without TLS exposes plaintext beyond this host: any address
/// but a loopback one (the unspecified `0.0.0.0`/`::` included).
pub fn plaintext_exposed(addr: std::net::SocketAddr) -> bool {
    !addr.ip().is_loopback()
}

/// The certificate a server presents, replaceable while it serves: every handshake takes the
/// one current then ([`ServerTls::replace`]), so a rotated certificate needs no restart and
/// cuts no connection.
#[derive(Debug)]
struct LiveCert(std::sync::RwLock<Arc<rustls::sign::CertifiedKey>>);

impl rustls::server::ResolvesServerCert for LiveCert {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.read().unwrap_or_else(|e| e.into_inner()).clone())
    }
}

/// A server certificate chain and its key (from PEM files, or made by the controller), for
/// both ports: gRPC (HTTP/2 only) and HTTP (HTTP/2 and HTTP/1.1).
#[derive(Clone)]
pub struct ServerTls {
    live: Arc<LiveCert>,
    http: Arc<rustls::ServerConfig>,
    grpc: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls(..)")
    }
}

/// `cert_pem` (the chain, leaf first) and `key_pem` as rustls holds them, checked to go
/// together (`cert` and `key` name them in errors).
fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert: &Path,
    key: &Path,
) -> Result<rustls::sign::CertifiedKey, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
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
    let private = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::Invalid {
        path: key.to_path_buf(),
        message: format!("not a PEM private key: {e}"),
    })?;
    rustls::sign::CertifiedKey::from_der(chain, private, &rustls::crypto::ring::default_provider())
        .map_err(|e| TlsError::Invalid {
            path: key.to_path_buf(),
            message: format!("does not go with {}: {e}", cert.display()),
        })
}

impl ServerTls {
    /// Loads `cert` (PEM, the chain, leaf first) and `key` (PEM, PKCS#8, PKCS#1 or SEC1),
    /// and checks that they go together.
    pub fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_pem = read_pem(cert)?;
        let key_pem = read_pem(key)?;
        ServerTls::from_pem(&cert_pem, &key_pem, cert, key)
    }

    /// The pair from PEM bytes (`cert` and `key` name them in errors).
    fn from_pem(
        cert_pem: &[u8],
        key_pem: &[u8],
        cert: &Path,
        key: &Path,
    ) -> Result<Self, TlsError> {
        install_provider();
        let live = Arc::new(LiveCert(std::sync::RwLock::new(Arc::new(certified_key(
            cert_pem, key_pem, cert, key,
        )?))));
        let config = |alpn: &[&[u8]]| -> Result<Arc<rustls::ServerConfig>, TlsError> {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Config(e.to_string()))?
                .with_no_client_auth()
                .with_cert_resolver(live.clone());
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(Arc::new(config))
        };
        Ok(ServerTls {
            http: config(&[b"h2", b"http/1.1"])?,
            grpc: config(&[b"h2"])?,
            live,
        })
    }

    /// Serves the certificate and key of `bundle` (made by the controller: see
    /// [`crate::platform::ca`]).
    pub fn from_bundle(bundle: &crate::platform::ca::Bundle) -> Result<Self, TlsError> {
        ServerTls::from_pem(
            bundle.cert_pem.as_bytes(),
            bundle.key_pem.expose(),
            Path::new("(generated certificate)"),
            Path::new("(generated key)"),
        )
    }

    /// Presents `cert_pem` and `key_pem` from the next handshake on (connections open
    /// keep theirs). A pair that does not go together is refused and the current one kept.
    pub fn replace(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<(), TlsError> {
        let key = certified_key(
            cert_pem,
            key_pem,
            Path::new("(new certificate)"),
            Path::new("(new key)"),
        )?;
        *self.live.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(key);
        Ok(())
    }

    /// Reloads `cert` and `key` every `every` when either file changed (cert-manager and
    /// the kubelet rewrite a mounted Secret when the certificate is renewed), until the
    /// returned task is aborted. A pair that does not load is logged and the current one
    /// kept.
    pub fn reload_files(
        &self,
        cert: std::path::PathBuf,
        key: std::path::PathBuf,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let tls = self.clone();
        tokio::spawn(async move {
            let stamp = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
            let mut seen = (stamp(&cert), stamp(&key));
            loop {
                tokio::time::sleep(every).await;
                let now = (stamp(&cert), stamp(&key));
                if now == seen {
                    continue;
                }
                seen = now;
                let loaded = read_pem(&cert).and_then(|c| read_pem(&key).map(|k| (c, k)));
                match loaded.and_then(|(c, k)| tls.replace(&c, &k)) {
                    Ok(()) => {
                        tracing::info!(cert = %cert.display(), "serving the renewed certificate")
                    }
                    Err(error) => {
                        tracing::warn!(%error, "the renewed certificate does not load; keeping the current one")
                    }
                }
            }
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

    /// TLS connections accepted on `listener` for the gRPC server, each handshake on its
    /// own task (a slow client holds up no one) within [`HANDSHAKE_TIMEOUT`].
    pub fn grpc_incoming(
        &self,
        listener: TcpListener,
    ) -> impl futures::Stream<
        Item = Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>, std::io::Error>,
    > + Send
    + 'static {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.grpc.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let tcp = match listener.accept().await {
                    Ok((tcp, _)) => tcp,
                    Err(error) => {
                        tracing::warn!(%error, "cannot accept a gRPC connection");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let accepted = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = accepted.send(Ok(stream)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
                        Err(_) => tracing::debug!("TLS handshake timed out"),
                    }
                });
                if tx.is_closed() {
                    return;
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_binds_are_not_exposed() {
        for addr in ["127.0.0.1:7070", "[::1]:7070", "127.0.0.2:1"] {
            assert!(!plaintext_exposed(addr.parse().unwrap()), "{addr}");
        }
        for addr in [
            "0.0.0.0:7070",
            "[::]:7070",
            "10.0.0.5:7071",
            "192.168.1.2:80",
        ] {
            assert!(plaintext_exposed(addr.parse().unwrap()), "{addr}");
        }
    }

    /// Whether a client trusting `trust_pem` completes a handshake with `addr` for `name`.
    async fn handshake(addr: std::net::SocketAddr, trust_pem: &str, name: &str) -> bool {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(trust_pem.as_bytes()) {
            roots.add(ca.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        connector
            .connect(ServerName::try_from(name.to_string()).unwrap(), tcp)
            .await
            .is_ok()
    }

    /// A replaced certificate is what the next handshake gets, on the same listener, with
    /// no restart; the old one is no longer presented.
    #[tokio::test]
    async fn a_replaced_certificate_serves_from_the_next_handshake() {
        use futures::StreamExt as _;
        let names = vec!["toolgrid.tg.svc".to_string(), "127.0.0.1".to_string()];
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let first = crate::platform::ca::Bundle::fresh(&names, now).unwrap();
        let second = crate::platform::ca::Bundle::fresh(&names, now).unwrap();
        let tls = ServerTls::from_bundle(&first).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut incoming = Box::pin(tls.grpc_incoming(listener));
        // Keep accepting (and holding) what the server side completes.
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(stream) = incoming.next().await {
                held.push(stream);
            }
        });
        assert!(handshake(addr, &first.trust_pem(), "toolgrid.tg.svc").await);
        assert!(!handshake(addr, &first.trust_pem(), "other.svc").await);
        assert!(!handshake(addr, &second.trust_pem(), "toolgrid.tg.svc").await);

        tls.replace(second.cert_pem.as_bytes(), second.key_pem.expose())
            .unwrap();
        assert!(handshake(addr, &second.trust_pem(), "127.0.0.1").await);
        assert!(!handshake(addr, &first.trust_pem(), "127.0.0.1").await);
        // A pair that does not go together is refused; the current one stays.
        assert!(matches!(
            tls.replace(first.cert_pem.as_bytes(), second.key_pem.expose()),
            Err(TlsError::Invalid { .. })
        ));
        assert!(handshake(addr, &second.trust_pem(), "127.0.0.1").await);
    }
}
