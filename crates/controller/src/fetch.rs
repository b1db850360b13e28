//! The controller's own downloads: the artifacts of ToolReleases and wasm Middleware named
//! by URL. Whoever may create a ToolRelease chooses the URL, so the controller treats it
//! like a tool's egress: on every hop (the URL and each redirect) the host must match the
//! operator's allowlist (`--artifact-hosts`, empty: any host), it is resolved, every address
//! it resolves to must be public ([`toolgrid_core::net`], unless the operator opted in with
//! `--artifact-allow-private`), and the connection goes to exactly those checked addresses,
//! so a DNS answer cannot change between the check and the connection. Proxy environment
//! variables are ignored; a proxy is used only when the operator names one
//! (`--artifact-proxy`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use toolgrid_api::conditions::Reason;
use toolgrid_catalog::artifacts::MAX_ARTIFACT_BYTES;
use toolgrid_core::net::first_restricted;

/// Redirects a URL fetch follows at most.
const MAX_REDIRECTS: usize = 5;
/// How long a whole download may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(120);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What the operator allows the controller to download from.
#[derive(Clone, Debug, Default)]
pub struct FetchPolicy {
    /// Host globs (`*` matches any run of characters, case-insensitive): a URL's host must
    /// match one. Empty: any host (that resolves to public addresses).
    pub allowed_hosts: Vec<String>,
    /// Download from loopback, private, link-local and other non-public addresses too.
    pub allow_private: bool,
    /// Send every download through this proxy (the proxy then resolves names; IP literals
    /// and names the controller can resolve are still checked).
    pub proxy: Option<url::Url>,
}

/// Why a download failed or was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("bad URL {url:?}: {reason}")]
    BadUrl { url: String, reason: String },
    #[error("{url}: only http and https are fetched")]
    Scheme { url: String },
    #[error("{url}: the host {host} is not in the controller's artifact hosts (--artifact-hosts)")]
    HostNotAllowed { url: String, host: String },
    #[error(
        "{url}: {host} is {ip} ({range}), not a public address; the controller does not \
         download from it (--artifact-allow-private)"
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
    #[error("GET {url}: {reason}")]
    Http { url: String, reason: String },
    #[error("the artifact is larger than {MAX_ARTIFACT_BYTES} bytes")]
    TooLarge,
    #[error("more than {MAX_REDIRECTS} redirects")]
    TooManyRedirects,
}

impl FetchError {
    /// The reason a release's (or middleware's) status gives for this failure.
    pub fn reason(&self) -> Reason {
        match self {
            FetchError::HostNotAllowed { .. } => Reason::ArtifactHostNotAllowed,
            FetchError::Restricted { .. } => Reason::ArtifactAddressRestricted,
            FetchError::BadUrl { .. } | FetchError::Scheme { .. } => Reason::InvalidArtifactSource,
            FetchError::Unresolved { .. }
            | FetchError::Http { .. }
            | FetchError::TooLarge
            | FetchError::TooManyRedirects => Reason::ArtifactNotFound,
        }
    }
}

/// `*` matches any run of characters (dots included); everything else itself, ignoring
/// case. `*.example.org` thus matches `a.example.org` and `a.b.example.org`, not
/// `example.org`.
pub fn glob_matches(pattern: &str, host: &str) -> bool {
    let pattern = pattern.trim().to_ascii_lowercase();
    let host = host.to_ascii_lowercase();
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = host.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole host.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The scheme, host and port of one hop, and whether the allowlist admits it.
fn target(url: &url::Url, policy: &FetchPolicy) -> Result<(String, u16), FetchError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(FetchError::Scheme {
            url: url.to_string(),
        });
    }
    let host = url
        .host_str()
        .ok_or_else(|| FetchError::BadUrl {
            url: url.to_string(),
            reason: "no host".into(),
        })?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = url
        .port_or_known_default()
        .ok_or_else(|| FetchError::BadUrl {
            url: url.to_string(),
            reason: "no port".into(),
        })?;
    if !policy.allowed_hosts.is_empty()
        && !policy.allowed_hosts.iter().any(|p| glob_matches(p, &host))
    {
        return Err(FetchError::HostNotAllowed {
            url: url.to_string(),
            host,
        });
    }
    Ok((host, port))
}

/// Refuses the hop if any address is not public (unless private ones are allowed).
pub fn check_addresses(
    url: &url::Url,
    host: &str,
    addrs: &[SocketAddr],
    allow_private: bool,
) -> Result<(), FetchError> {
    match first_restricted(addrs.iter().map(SocketAddr::ip)) {
        Some((ip, range)) if !allow_private => Err(FetchError::Restricted {
            url: url.to_string(),
            host: host.to_string(),
            ip,
            range,
        }),
        _ => Ok(()),
    }
}

/// A checked hop: the host, and the addresses to connect to (`None`: through the proxy).
async fn checked(
    url: &url::Url,
    policy: &FetchPolicy,
) -> Result<(String, Option<Vec<SocketAddr>>), FetchError> {
    let (host, port) = target(url, policy)?;
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => match tokio::net::lookup_host((host.as_str(), port))
            .await
            .map(|addrs| addrs.collect::<Vec<_>>())
        {
            Ok(addrs) => addrs,
            // Through a proxy, the proxy resolves (and must enforce its own egress).
            Err(_) if policy.proxy.is_some() => return Ok((host, None)),
            Err(error) => {
                return Err(FetchError::Unresolved {
                    url: url.to_string(),
                    host,
                    reason: error.to_string(),
                });
            }
        },
    };
    if addrs.is_empty() {
        return Err(FetchError::Unresolved {
            url: url.to_string(),
            host,
            reason: "no address".into(),
        });
    }
    check_addresses(url, &host, &addrs, policy.allow_private)?;
    Ok((host, Some(addrs)))
}

/// Downloads an artifact (the digest is checked by the caller), checking every hop.
pub async fn fetch(url: &str, policy: &FetchPolicy) -> Result<Vec<u8>, FetchError> {
    toolgrid_proto::tls::install_provider();
    let mut url = url::Url::parse(url).map_err(|e| FetchError::BadUrl {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    for _ in 0..=MAX_REDIRECTS {
        let (host, addrs) = checked(&url, policy).await?;
        let http = |reason: String| FetchError::Http {
            url: url.to_string(),
            reason,
        };
        let mut builder = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none());
        builder = match &policy.proxy {
            Some(proxy) => builder.proxy(
                reqwest::Proxy::all(proxy.clone()).map_err(|e| http(format!("proxy: {e}")))?,
            ),
            // Never HTTP_PROXY, HTTPS_PROXY, ALL_PROXY from the environment.
            None => builder.no_proxy(),
        };
        if let Some(addrs) = &addrs
            && host.parse::<IpAddr>().is_err()
        {
            builder = builder.resolve_to_addrs(&host, addrs);
        }
        let client = builder.build().map_err(|e| http(e.to_string()))?;
        let mut response = client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| http(e.to_string()))?;
        if response.status().is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| {
                    http(format!("answered {} without a Location", response.status()))
                })?;
            url = url.join(location).map_err(|e| FetchError::BadUrl {
                url: location.to_string(),
                reason: e.to_string(),
            })?;
            continue;
        }
        if !response.status().is_success() {
            return Err(http(format!("answered {}", response.status())));
        }
        if response
            .content_length()
            .is_some_and(|length| length > MAX_ARTIFACT_BYTES)
        {
            return Err(FetchError::TooLarge);
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| http(e.to_string()))? {
            bytes.extend_from_slice(&chunk);
            if bytes.len() as u64 > MAX_ARTIFACT_BYTES {
                return Err(FetchError::TooLarge);
            }
        }
        return Ok(bytes);
    }
    Err(FetchError::TooManyRedirects)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server on 127.0.0.1 that counts the connections it accepts and answers each with
    /// `response`.
    async fn witness(response: &'static str) -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = [0u8; 4096];
                    let _ = stream.read(&mut buffer).await;
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        (addr, count)
    }

    const WASM: &str = "HTTP/1.1 200 OK\r\ncontent-length: 4\r\nconnection: close\r\n\r\n\0asm";

    fn policy() -> FetchPolicy {
        FetchPolicy::default()
    }

    #[test]
    fn globs() {
        assert!(glob_matches("*", "anything.example"));
        assert!(glob_matches(
            "artifacts.example.org",
            "Artifacts.Example.org"
        ));
        assert!(!glob_matches(
            "artifacts.example.org",
            "artifacts.example.org.evil"
        ));
        assert!(!glob_matches(
            "artifacts.example.org",
            "xartifacts.example.org"
        ));
        assert!(glob_matches("*.example.org", "a.example.org"));
        assert!(glob_matches("*.example.org", "a.b.example.org"));
        assert!(!glob_matches("*.example.org", "example.org"));
        assert!(!glob_matches("*.example.org", "a.example.org.evil"));
        assert!(glob_matches("ghcr-*.example.org", "ghcr-eu.example.org"));
        assert!(!glob_matches("ghcr-*.example.org", "ghcr.example.org"));
        assert!(glob_matches("a*b*c", "abc"));
        assert!(!glob_matches("a*b*c", "acb"));
    }

    #[test]
    fn each_refusal_names_its_reason() {
        let url = "http://x/".to_string();
        assert_eq!(
            FetchError::HostNotAllowed {
                url: url.clone(),
                host: "x".into()
            }
            .reason(),
            Reason::ArtifactHostNotAllowed
        );
        assert_eq!(
            FetchError::Restricted {
                url: url.clone(),
                host: "x".into(),
                ip: "127.0.0.1".parse().unwrap(),
                range: "loopback"
            }
            .reason(),
            Reason::ArtifactAddressRestricted
        );
        assert_eq!(
            FetchError::Scheme { url }.reason(),
            Reason::InvalidArtifactSource
        );
        assert_eq!(FetchError::TooLarge.reason(), Reason::ArtifactNotFound);
    }

    #[tokio::test]
    async fn loopback_metadata_and_names_resolving_to_loopback_are_refused_without_a_request() {
        let (addr, count) = witness(WASM).await;
        let port = addr.port();
        for url in [
            format!("http://127.0.0.1:{port}/tool.wasm"),
            format!("http://localhost:{port}/tool.wasm"),
            format!("http://[::ffff:127.0.0.1]:{port}/tool.wasm"),
            format!("http://127.1:{port}/tool.wasm"),
            format!("http://2130706433:{port}/tool.wasm"),
        ] {
            let error = fetch(&url, &policy()).await.unwrap_err();
            assert!(
                matches!(error, FetchError::Restricted { .. }),
                "{url}: {error}"
            );
            assert_eq!(error.reason(), Reason::ArtifactAddressRestricted);
        }
        let error = fetch("http://169.254.169.254/latest/meta-data", &policy())
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                FetchError::Restricted {
                    range: "link-local",
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(
            count.load(Ordering::SeqCst),
            0,
            "no request reached 127.0.0.1"
        );
    }

    #[tokio::test]
    async fn a_host_outside_the_allowlist_is_refused_without_a_request() {
        let (addr, count) = witness(WASM).await;
        let policy = FetchPolicy {
            allowed_hosts: vec!["*.example.org".into()],
            allow_private: true,
            proxy: None,
        };
        let error = fetch(&format!("http://{addr}/tool.wasm"), &policy)
            .await
            .unwrap_err();
        assert!(
            matches!(error, FetchError::HostNotAllowed { .. }),
            "{error}"
        );
        assert_eq!(error.reason(), Reason::ArtifactHostNotAllowed);
        assert_eq!(count.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn the_opt_in_fetches_from_loopback_and_redirects_are_checked_again() {
        let (witness_addr, count) = witness(WASM).await;
        let redirect: &'static str = Box::leak(
            format!(
                "HTTP/1.1 302 Found\r\nlocation: http://localhost:{}/tool.wasm\r\n\
                 content-length: 0\r\nconnection: close\r\n\r\n",
                witness_addr.port()
            )
            .into_boxed_str(),
        );
        let (redirector, _) = witness(redirect).await;
        let open = FetchPolicy {
            allow_private: true,
            ..FetchPolicy::default()
        };
        assert_eq!(
            fetch(&format!("http://{witness_addr}/tool.wasm"), &open)
                .await
                .unwrap(),
            b"\0asm"
        );
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // The redirect leads to a host the allowlist does not name: not followed.
        let listed = FetchPolicy {
            allowed_hosts: vec!["127.0.0.1".into()],
            allow_private: true,
            proxy: None,
        };
        let error = fetch(&format!("http://{redirector}/start"), &listed)
            .await
            .unwrap_err();
        assert!(
            matches!(&error, FetchError::HostNotAllowed { host, .. } if host == "localhost"),
            "{error}"
        );
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "the redirect was not followed"
        );
        // Followed when the allowlist names it.
        let both = FetchPolicy {
            allowed_hosts: vec!["127.0.0.1".into(), "localhost".into()],
            allow_private: true,
            proxy: None,
        };
        assert_eq!(
            fetch(&format!("http://{redirector}/start"), &both)
                .await
                .unwrap(),
            b"\0asm"
        );
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_explicit_proxy_is_used() {
        let (proxy, count) = witness(WASM).await;
        let policy = FetchPolicy {
            proxy: Some(format!("http://{proxy}").parse().unwrap()),
            ..FetchPolicy::default()
        };
        // The proxy resolves a name the controller cannot.
        assert_eq!(
            fetch("http://artifacts.invalid/tool.wasm", &policy)
                .await
                .unwrap(),
            b"\0asm"
        );
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // An address the controller sees is still checked, proxy or not.
        let error = fetch("http://169.254.169.254/", &policy).await.unwrap_err();
        assert!(matches!(error, FetchError::Restricted { .. }), "{error}");
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// The environment's proxy variables are not used: run in a child process (setting the
    /// environment in this one would race other tests' reads of it) with every proxy
    /// variable pointing at a witness proxy.
    #[tokio::test]
    async fn proxy_environment_variables_are_not_used() {
        let (proxy, count) = witness(WASM).await;
        let proxy = format!("http://{proxy}");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args([
                "--exact",
                "fetch::tests::proxy_child",
                "--ignored",
                "--test-threads=1",
            ])
            .env("TOOLGRID_PROXY_CHILD", "1")
            .env_remove("NO_PROXY")
            .env_remove("no_proxy");
        for name in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            child.env(name, &proxy);
        }
        let output = tokio::task::spawn_blocking(move || child.output())
            .await
            .unwrap()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "the child ran: {stdout}");
        assert_eq!(count.load(Ordering::SeqCst), 0, "the proxy was not used");
    }

    #[tokio::test]
    #[ignore = "run by proxy_environment_variables_are_not_used"]
    async fn proxy_child() {
        assert!(std::env::var("TOOLGRID_PROXY_CHILD").is_ok());
        // Through the proxy these would succeed; directly, the name does not resolve and
        // the server answers itself.
        let error = fetch("http://artifacts.invalid/tool.wasm", &policy())
            .await
            .unwrap_err();
        assert!(matches!(error, FetchError::Unresolved { .. }), "{error}");
        let (direct, count) =
            witness("HTTP/1.1 200 OK\r\ncontent-length: 6\r\nconnection: close\r\n\r\ndirect")
                .await;
        let open = FetchPolicy {
            allow_private: true,
            ..FetchPolicy::default()
        };
        assert_eq!(
            fetch(
                &format!("http://localhost:{}/tool.wasm", direct.port()),
                &open
            )
            .await
            .unwrap(),
            b"direct"
        );
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }
}
