//! Which era of MCP a request speaks, decided from the message itself, as the 2026-07-28
//! revision's dual-era rules say:
//!
//! - a request whose `_meta` names a protocol version (`io.modelcontextprotocol/protocolVersion`)
//!   is **modern** (2026-07-28): stateless, validated on its own (version supported, the
//!   `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers equal to the body);
//! - an `initialize` request opens a **legacy** session (2025-06-18, 2025-11-25);
//! - anything else must carry the `Mcp-Session-Id` of a legacy session.
//!
//! Pure: the transport handler feeds it headers and the message.

use super::jsonrpc::{self, Incoming, RpcError};
use base64::Engine as _;
use serde_json::{Value, json};

/// The current revision: no `initialize`, per-request `_meta`.
pub const MODERN: &str = "2026-07-28";
/// The handshake revisions served, newest first (an `initialize` asking for another gets
/// the newest).
pub const LEGACY: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

pub const HEADER_PROTOCOL_VERSION: &str = "mcp-protocol-version";
pub const HEADER_METHOD: &str = "mcp-method";
pub const HEADER_NAME: &str = "mcp-name";
pub const HEADER_SESSION: &str = "mcp-session-id";

/// Every version served, for `UnsupportedProtocolVersion`'s `supported` and
/// `server/discover`'s `supportedVersions`.
pub fn supported_versions() -> Vec<&'static str> {
    std::iter::once(MODERN).chain(LEGACY).collect()
}

/// The legacy version an `initialize` asking for `requested` gets.
pub fn negotiate_legacy(requested: Option<&str>) -> &'static str {
    LEGACY
        .iter()
        .find(|v| Some(**v) == requested)
        .copied()
        .unwrap_or(LEGACY[0])
}

/// What the headers of a POST say, as the era decision needs them.
#[derive(Clone, Debug, Default)]
pub struct Headers {
    pub protocol_version: Option<String>,
    pub method: Option<String>,
    pub name: Option<String>,
    pub session: Option<String>,
}

/// How a POST is to be served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Era {
    /// A self-contained 2026-07-28 request.
    Modern,
    /// `initialize`: open a legacy session.
    Initialize,
    /// A message in the legacy session the header names.
    Session(String),
}

/// A refused POST: the HTTP status and the JSON-RPC error.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    pub status: u16,
    pub error: RpcError,
}

impl Refusal {
    fn new(status: u16, code: i64, message: impl Into<String>) -> Self {
        Refusal {
            status,
            error: RpcError::new(code, message),
        }
    }
}

/// The protocol version a message's `_meta` names, if any.
pub fn meta_version(message: &Incoming) -> Option<&str> {
    message
        .params()?
        .get("_meta")?
        .get(META_PROTOCOL_VERSION)?
        .as_str()
}

/// The era of a POSTed message, or why it is refused.
pub fn classify(message: &Incoming, headers: &Headers) -> Result<Era, Refusal> {
    if let Some(version) = meta_version(message) {
        validate_modern(message, version, headers)?;
        return Ok(Era::Modern);
    }
    if message.method() == Some("initialize") {
        return Ok(Era::Initialize);
    }
    if let Some(session) = &headers.session {
        if let Some(version) = &headers.protocol_version
            && !LEGACY.contains(&version.as_str())
        {
            return Err(Refusal::new(
                400,
                jsonrpc::INVALID_REQUEST,
                format!("Bad Request: unsupported MCP-Protocol-Version {version:?} in a session"),
            ));
        }
        return Ok(Era::Session(session.clone()));
    }
    match headers.protocol_version.as_deref() {
        // A modern client that left `_meta` out.
        Some(MODERN) => Err(Refusal::new(
            400,
            jsonrpc::HEADER_MISMATCH,
            format!(
                "Header mismatch: MCP-Protocol-Version is {MODERN} but _meta has no {META_PROTOCOL_VERSION}"
            ),
        )),
        _ => Err(Refusal::new(
            400,
            jsonrpc::INVALID_REQUEST,
            "Bad Request: no Mcp-Session-Id: send initialize first, or a 2026-07-28 request with _meta",
        )),
    }
}

/// The checks a modern request passes: its version served, and its headers mirror its body.
fn validate_modern(message: &Incoming, version: &str, headers: &Headers) -> Result<(), Refusal> {
    if version != MODERN {
        let mut refusal = Refusal::new(
            400,
            jsonrpc::UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
        );
        refusal.error = refusal
            .error
            .with_data(json!({"supported": supported_versions(), "requested": version}));
        return Err(refusal);
    }
    let mismatch = |what: String| {
        Err(Refusal::new(
            400,
            jsonrpc::HEADER_MISMATCH,
            format!("Header mismatch: {what}"),
        ))
    };
    match headers.protocol_version.as_deref() {
        None => return mismatch("MCP-Protocol-Version header is missing".into()),
        Some(h) if h != version => {
            return mismatch(format!(
                "MCP-Protocol-Version header {h:?} does not match body value {version:?}"
            ));
        }
        Some(_) => {}
    }
    let method = message.method().unwrap_or_default();
    match headers.method.as_deref() {
        None => return mismatch("Mcp-Method header is missing".into()),
        Some(h) if h != method => {
            return mismatch(format!(
                "Mcp-Method header value {h:?} does not match body value {method:?}"
            ));
        }
        Some(_) => {}
    }
    let named = match method {
        "tools/call" | "prompts/get" => Some("name"),
        "resources/read" => Some("uri"),
        _ => None,
    };
    if let Some(field) = named {
        let body = message
            .params()
            .and_then(|p| p.get(field))
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some(raw) = headers.name.as_deref() else {
            return mismatch("Mcp-Name header is missing".into());
        };
        let Some(header) = decode_header_value(raw) else {
            return mismatch(format!("Mcp-Name header value {raw:?} is malformed"));
        };
        if header != body {
            return mismatch(format!(
                "Mcp-Name header value {header:?} does not match body value {body:?}"
            ));
        }
    }
    Ok(())
}

/// A header value with the `=?base64?...?=` sentinel decoded; `None` when malformed.
pub fn decode_header_value(raw: &str) -> Option<String> {
    match raw
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        None => Some(raw.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    fn request(method: &str, params: Value) -> Incoming {
        let Value::Object(params) = params else {
            panic!()
        };
        Incoming::Request {
            id: json!(1),
            method: method.into(),
            params,
        }
    }

    fn modern(method: &str, name: Option<&str>) -> (Incoming, Headers) {
        let mut params = Map::new();
        params.insert("_meta".into(), json!({META_PROTOCOL_VERSION: MODERN}));
        if let Some(name) = name {
            params.insert("name".into(), json!(name));
        }
        (
            request(method, Value::Object(params)),
            Headers {
                protocol_version: Some(MODERN.into()),
                method: Some(method.into()),
                name: name.map(String::from),
                session: None,
            },
        )
    }

    #[test]
    fn the_first_message_picks_the_era() {
        let (m, h) = modern("tools/list", None);
        assert_eq!(classify(&m, &h), Ok(Era::Modern));
        let init = request("initialize", json!({"protocolVersion": "2025-06-18"}));
        assert_eq!(classify(&init, &Headers::default()), Ok(Era::Initialize));
        let in_session = request("tools/list", json!({}));
        let headers = Headers {
            session: Some("s1".into()),
            ..Headers::default()
        };
        assert_eq!(
            classify(&in_session, &headers),
            Ok(Era::Session("s1".into()))
        );
        let bare = classify(&in_session, &Headers::default()).unwrap_err();
        assert_eq!(bare.error.code, jsonrpc::INVALID_REQUEST);
        assert_eq!(bare.status, 400);
    }

    #[test]
    fn modern_headers_must_mirror_the_body() {
        let (m, mut h) = modern("tools/call", Some("semver__compare"));
        assert_eq!(classify(&m, &h), Ok(Era::Modern));
        h.method = Some("tools/list".into());
        let refused = classify(&m, &h).unwrap_err();
        assert_eq!(refused.error.code, jsonrpc::HEADER_MISMATCH);
        assert_eq!(refused.status, 400);
        let (m, mut h) = modern("tools/call", Some("semver__compare"));
        h.name = Some("uuid".into());
        assert_eq!(
            classify(&m, &h).unwrap_err().error.code,
            jsonrpc::HEADER_MISMATCH
        );
        h.name = None;
        assert_eq!(
            classify(&m, &h).unwrap_err().error.code,
            jsonrpc::HEADER_MISMATCH
        );
        // The base64 sentinel is decoded before comparing.
        h.name = Some("=?base64?c2VtdmVyX19jb21wYXJl?=".into());
        assert_eq!(classify(&m, &h), Ok(Era::Modern));
        let (m, mut h) = modern("tools/list", None);
        h.protocol_version = None;
        assert_eq!(
            classify(&m, &h).unwrap_err().error.code,
            jsonrpc::HEADER_MISMATCH
        );
    }

    #[test]
    fn an_unknown_version_names_the_supported_ones() {
        let m = request(
            "tools/list",
            json!({"_meta": {META_PROTOCOL_VERSION: "1900-01-01"}}),
        );
        let refused = classify(&m, &Headers::default()).unwrap_err();
        assert_eq!(refused.error.code, jsonrpc::UNSUPPORTED_PROTOCOL_VERSION);
        let data = refused.error.data.unwrap();
        assert_eq!(data["requested"], "1900-01-01");
        assert_eq!(data["supported"][0], MODERN);
    }

    #[test]
    fn the_versions_are_the_sdks() {
        use rmcp::model::ProtocolVersion;
        assert_eq!(ProtocolVersion::V_2026_07_28.as_str(), MODERN);
        assert!(!ProtocolVersion::V_2026_07_28.has_initialize());
        assert_eq!(ProtocolVersion::LATEST_WITH_INITIALIZE.as_str(), LEGACY[0]);
        assert_eq!(ProtocolVersion::V_2025_06_18.as_str(), LEGACY[1]);
    }

    #[test]
    fn legacy_negotiation_falls_back_to_the_newest() {
        assert_eq!(negotiate_legacy(Some("2025-06-18")), "2025-06-18");
        assert_eq!(negotiate_legacy(Some("2024-11-05")), LEGACY[0]);
        assert_eq!(negotiate_legacy(None), LEGACY[0]);
    }
}
