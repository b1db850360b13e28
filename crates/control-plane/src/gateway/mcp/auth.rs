//! `/mcp` as an OAuth 2.0 protected resource: the RFC 9728 metadata document, the `401`
//! that points to it, and the `Origin` check against DNS rebinding.
//!
//! Invariants: the metadata is open (it is how a client learns where to get a token); every
//! other `/mcp` request carries a bearer token [`crate::gateway::Gateway::authenticate`]
//! accepts (an agent's own toolgrid token, or an access token from a configured
//! authorization server, see [`super::super::authn`]), else it is answered `401` with
//! `WWW-Authenticate: Bearer resource_metadata="..."`; a request with an `Origin` that is
//! neither loopback nor configured is answered `403` before anything else is looked at.

use super::McpConfig;
use axum::http::HeaderMap;
use serde_json::{Value, json};

/// Where the protected-resource metadata is served (also at this path + `/mcp`).
pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
/// The MCP endpoint's path.
pub const MCP_PATH: &str = "/mcp";

/// The origin (`scheme://host[:port]`) this server is reached at: the configured public
/// URL's, else the request's `Host` over plain HTTP.
pub fn base_url(config: &McpConfig, headers: &HeaderMap) -> String {
    if let Some(url) = &config.public_url {
        return url.trim_end_matches('/').to_string();
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or("localhost");
    format!("http://{host}")
}

/// The resource identifier: the MCP endpoint's absolute URL.
pub fn resource_url(config: &McpConfig, headers: &HeaderMap) -> String {
    format!("{}{MCP_PATH}", base_url(config, headers))
}

/// The metadata document's absolute URL, as the `401` names it.
pub fn metadata_url(config: &McpConfig, headers: &HeaderMap) -> String {
    format!("{}{METADATA_PATH}{MCP_PATH}", base_url(config, headers))
}

/// The RFC 9728 protected-resource metadata.
pub fn metadata(config: &McpConfig, headers: &HeaderMap) -> Value {
    json!({
        "resource": resource_url(config, headers),
        "authorization_servers": config.authorization_servers,
        "bearer_methods_supported": ["header"],
        "resource_name": "toolgrid",
        "resource_documentation": "docs/mcp.md",
    })
}

/// The `WWW-Authenticate` value of a `401`.
pub fn challenge(config: &McpConfig, headers: &HeaderMap, had_token: bool) -> String {
    let mut value = format!(
        "Bearer resource_metadata=\"{}\"",
        metadata_url(config, headers)
    );
    if had_token {
        value.push_str(", error=\"invalid_token\"");
    }
    value
}

/// Whether a request's `Origin` may reach the server: none (not a browser), a loopback
/// origin, or one configured.
pub fn origin_allowed(config: &McpConfig, origin: Option<&str>) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    if config
        .allowed_origins
        .iter()
        .any(|o| o.trim_end_matches('/') == origin)
    {
        return true;
    }
    let Ok(url) = url::Url::parse(origin) else {
        return false;
    };
    matches!(url.scheme(), "http" | "https")
        && match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_or_configured_origins_pass() {
        let mut config = McpConfig::default();
        assert!(origin_allowed(&config, None));
        assert!(origin_allowed(&config, Some("http://127.0.0.1:8080")));
        assert!(origin_allowed(&config, Some("http://localhost:3000")));
        assert!(origin_allowed(&config, Some("http://[::1]:3000")));
        assert!(!origin_allowed(&config, Some("http://evil.example.com")));
        assert!(!origin_allowed(&config, Some("null")));
        config.allowed_origins = vec!["https://app.example.com".into()];
        assert!(origin_allowed(&config, Some("https://app.example.com")));
    }

    #[test]
    fn the_challenge_names_the_metadata() {
        let mut headers = HeaderMap::new();
        headers.insert("host", "127.0.0.1:9000".parse().unwrap());
        let config = McpConfig::default();
        assert_eq!(
            challenge(&config, &headers, false),
            "Bearer resource_metadata=\"http://127.0.0.1:9000/.well-known/oauth-protected-resource/mcp\""
        );
        assert_eq!(
            metadata(&config, &headers)["resource"],
            "http://127.0.0.1:9000/mcp"
        );
    }
}
