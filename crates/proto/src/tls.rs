//! TLS in the control plane's clients (the CLI and workers: `https://` endpoints, trusting
//! `--tls-ca` or, without it, the system's roots). The servers' side is the control
//! plane's (`toolgrid_control_plane::platform::tls`).

use std::path::{Path, PathBuf};
use tokio_rustls::rustls;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// The environment variable clients read the CA file from (as `--tls-ca`).
pub const TLS_CA_ENV: &str = "TOOLGRID_TLS_CA";
/// The environment variable a worker reads the CA certificate itself (PEM) from: how the
/// controller hands its worker pods the CA (a certificate is public; no Secret needed).
pub const TLS_CA_PEM_ENV: &str = "TOOLGRID_TLS_CA_PEM";

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

/// Reads a PEM file, naming it when it cannot.
pub fn read_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
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
            (Some(path), _) => Ok(Trust::Ca(read_pem(path)?)),
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
