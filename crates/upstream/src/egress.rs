//! Checked egress to an upstream: a URL a ToolSource names is treated like a tool's egress.
//! Only `https` unless the source allows plain `http`; no credentials in the URL (they
//! belong in a Secret); the host is resolved, every address must be public
//! ([`toolgrid_core::net`]) unless the source allows private ones, and the connection goes
//! to exactly the checked addresses, so a DNS answer cannot change between the check and
//! the connection. No proxy from the environment, no redirects followed.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use toolgrid_core::net::first_restricted;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a source allows beyond the safe default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Plain `http://` URLs too (default: `https` only).
    pub allow_http: bool,
    /// Loopback, private, link-local and other non-public addresses too.
    pub allow_private: bool,
}

/// Why an upstream URL is refused or cannot be reached.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EgressError {
    #[error("bad URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{url}: only https is allowed (the source may allow http)")]
    Scheme { url: String },
    #[error("{url}: credentials do not belong in the URL; give them as a Secret")]
    Credentials { url: String },
    #[error(
        "{url}: {host} is {ip} ({range}), not a public address (the source may allow private \
         addresses)"
    )]
    Restricted {
        url: String,
        host: String,
        ip: IpAddr,
        range: &'static str,
    },
    #[error("{url}: cannot resolve {host}: {reason}")]
    Unresolved {
        url: String,
        host: String,
        reason: String,
    },
    #[error("cannot build an HTTP client: {0}")]
    Client(String),
}

/// `url` parsed and checked against `policy` (scheme, credentials), without resolving.
pub fn parse(url: &str, policy: EgressPolicy) -> Result<url::Url, EgressError> {
    let parsed = url::Url::parse(url).map_err(|e| EgressError::BadUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    match parsed.scheme() {
        "https" => {}
        "http" if policy.allow_http => {}
        _ => {
            return Err(EgressError::Scheme {
                url: url.to_string(),
            });
        }
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(EgressError::Credentials {
            url: redacted(&parsed),
        });
    }
    if parsed.host_str().is_none() {
        return Err(EgressError::BadUrl {
            url: url.to_string(),
            reason: "no host".into(),
        });
    }
    Ok(parsed)
}

/// `url` without its user information, for messages.
fn redacted(url: &url::Url) -> String {
    let mut shown = url.clone();
    let _ = shown.set_username("");
    let _ = shown.set_password(None);
    shown.to_string()
}

/// Refuses `addrs` if any is not public (unless `allow_private`).
pub fn check_addresses(
    url: &url::Url,
    host: &str,
    addrs: &[SocketAddr],
    allow_private: bool,
) -> Result<(), EgressError> {
    match first_restricted(addrs.iter().map(SocketAddr::ip)) {
        Some((ip, range)) if !allow_private => Err(EgressError::Restricted {
            url: url.to_string(),
            host: host.to_string(),
            ip,
            range,
        }),
        _ => Ok(()),
    }
}

/// An HTTP client that reaches `url`'s host only at its checked addresses, with no proxy
/// and no redirects, each request within `timeout`.
pub async fn client_for(
    url: &url::Url,
    policy: EgressPolicy,
    timeout: Duration,
) -> Result<reqwest::Client, EgressError> {
    install_provider();
    let host = url
        .host_str()
        .unwrap_or_default()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = url.port_or_known_default().unwrap_or(443);
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map(|addrs| addrs.collect())
            .map_err(|e| EgressError::Unresolved {
                url: url.to_string(),
                host: host.clone(),
                reason: e.to_string(),
            })?,
    };
    if addrs.is_empty() {
        return Err(EgressError::Unresolved {
            url: url.to_string(),
            host,
            reason: "no address".into(),
        });
    }
    check_addresses(url, &host, &addrs, policy.allow_private)?;
    let mut builder = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(CONNECT_TIMEOUT.min(timeout))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy();
    if host.parse::<IpAddr>().is_err() {
        builder = builder.resolve_to_addrs(&host, &addrs);
    }
    builder
        .build()
        .map_err(|e| EgressError::Client(e.to_string()))
}

/// rustls's process-wide crypto provider (reqwest is built without one).
fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_only_and_no_credentials_by_default() {
        let safe = EgressPolicy::default();
        assert!(parse("https://mcp.example.com/mcp", safe).is_ok());
        assert!(matches!(
            parse("http://mcp.example.com/mcp", safe),
            Err(EgressError::Scheme { .. })
        ));
        let http = EgressPolicy {
            allow_http: true,
            ..safe
        };
        assert!(parse("http://mcp.example.com/mcp", http).is_ok());
        assert!(matches!(
            parse("file:///etc/passwd", http),
            Err(EgressError::Scheme { .. })
        ));
        let refused = parse("https://user:hunter2@mcp.example.com/mcp", safe).unwrap_err();
        assert!(matches!(refused, EgressError::Credentials { .. }));
        assert!(
            !refused.to_string().contains("hunter2"),
            "the message shows no credential: {refused}"
        );
    }

    #[tokio::test]
    async fn private_addresses_are_refused_unless_allowed() {
        let url = parse("https://127.0.0.1:9/mcp", EgressPolicy::default()).unwrap();
        let refused = client_for(&url, EgressPolicy::default(), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, EgressError::Restricted { range, .. } if range.contains("oopback")),
            "{refused}"
        );
        let allowed = EgressPolicy {
            allow_private: true,
            ..EgressPolicy::default()
        };
        assert!(
            client_for(&url, allowed, Duration::from_secs(1))
                .await
                .is_ok()
        );
        let metadata = parse("https://169.254.169.254/latest", EgressPolicy::default()).unwrap();
        assert!(matches!(
            client_for(&metadata, EgressPolicy::default(), Duration::from_secs(1)).await,
            Err(EgressError::Restricted { .. })
        ));
    }
}
