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

/// How long a certificate made by [`ServerTls::self_signed`] is valid (the CA for as long
/// as its serving certificate: both are made again at every start).
pub const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The serving certificate, its key and the CA certificate, all PEM.
fn make_self_signed(names: &[String]) -> Result<(String, String, String), rcgen::Error> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // An hour of slack for clocks behind ours.
    let not_before =
        rcgen::date_time_ymd(1970, 1, 1) + now.saturating_sub(Duration::from_secs(3600));
    let not_after = rcgen::date_time_ymd(1970, 1, 1) + now + SELF_SIGNED_VALIDITY;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "toolgrid controller CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(names.to_vec())?;
    leaf.distinguished_name.push(
        DnType::CommonName,
        names.first().map(String::as_str).unwrap_or("toolgrid"),
    );
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.not_before = not_before;
    leaf.not_after = not_after;
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem(), ca_cert.pem()))
}

/// Whether serving on `addr` without TLS exposes plaintext beyond this host: any address
/// but a loopback one (the unspecified `0.0.0.0`/`::` included).
pub fn plaintext_exposed(addr: std::net::SocketAddr) -> bool {
    !addr.ip().is_loopback()
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
        let cert_pem = read_pem(cert)?;
        let key_pem = read_pem(key)?;
        ServerTls::from_pem(cert_pem, key_pem, cert, key)
    }

    /// The pair from PEM bytes (`cert` and `key` name them in errors).
    fn from_pem(
        cert_pem: Vec<u8>,
        key_pem: Vec<u8>,
        cert: &Path,
        key: &Path,
    ) -> Result<Self, TlsError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        install_provider();
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

    /// A CA made now, in memory, and a serving certificate it signed for `names` (DNS names
    /// or IP addresses), valid for [`SELF_SIGNED_VALIDITY`]: what `toolgrid controller
    /// --tls-self-signed` serves with when no certificate is given. Returns the CA
    /// certificate (PEM) for clients to trust; its key is never written anywhere.
    pub fn self_signed(names: &[String]) -> Result<(Self, String), TlsError> {
        let (cert_pem, key_pem, ca_pem) =
            make_self_signed(names).map_err(|e| TlsError::Config(format!("rcgen: {e}")))?;
        let tls = ServerTls::from_pem(
            cert_pem.into_bytes(),
            key_pem.into_bytes(),
            Path::new("(generated certificate)"),
            Path::new("(generated key)"),
        )?;
        Ok((tls, ca_pem))
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

    /// The generated serving certificate verifies against the CA handed to clients, for
    /// the names asked for, and not for others.
    #[test]
    fn a_self_signed_certificate_verifies_against_its_ca() {
        use rustls::client::danger::ServerCertVerifier;
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
        let names = vec![
            "toolgrid.tg.svc".to_string(),
            "toolgrid".to_string(),
            "127.0.0.1".to_string(),
        ];
        let (tls, ca_pem) = ServerTls::self_signed(&names).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let leaf = CertificateDer::from_pem_slice(&tls.cert_pem).unwrap();
        let now = UnixTime::now();
        for name in ["toolgrid.tg.svc", "toolgrid", "127.0.0.1"] {
            verifier
                .verify_server_cert(&leaf, &[], &ServerName::try_from(name).unwrap(), &[], now)
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(
            verifier
                .verify_server_cert(
                    &leaf,
                    &[],
                    &ServerName::try_from("other.svc").unwrap(),
                    &[],
                    now
                )
                .is_err()
        );
        // Two starts make two different CAs: one's certificate does not verify with the other.
        let (other, _) = ServerTls::self_signed(&names).unwrap();
        assert_ne!(other.cert_pem, tls.cert_pem);
    }
}
