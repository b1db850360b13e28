//! JSON-RPC 2.0 framing for MCP: reading one incoming message, and the error codes and
//! response shapes the server answers with.
//!
//! Invariant: whatever a peer sends, the answer is a JSON-RPC message (never a panic or
//! plain text): a body that is not JSON is a parse error (-32700), a batch or a value that
//! is not a request or notification is an invalid request (-32600).

use serde_json::{Map, Value, json};

use rmcp::model::ErrorCode;

/// Invalid JSON.
pub const PARSE_ERROR: i64 = ErrorCode::PARSE_ERROR.0 as i64;
/// Not a JSON-RPC request (a batch included: MCP has none since 2025-06-18).
pub const INVALID_REQUEST: i64 = ErrorCode::INVALID_REQUEST.0 as i64;
pub const METHOD_NOT_FOUND: i64 = ErrorCode::METHOD_NOT_FOUND.0 as i64;
/// Unknown tool, invalid arguments, a bad cursor, an unknown resource (2026-07-28).
pub const INVALID_PARAMS: i64 = ErrorCode::INVALID_PARAMS.0 as i64;
pub const INTERNAL_ERROR: i64 = ErrorCode::INTERNAL_ERROR.0 as i64;
/// A legacy session that does not exist, has expired, or is another caller's (the code the
/// TypeScript SDK's servers answer it with).
pub const SESSION_NOT_FOUND: i64 = -32001;
/// A resource that does not exist (2025-11-25 and earlier).
pub const RESOURCE_NOT_FOUND: i64 = ErrorCode::RESOURCE_NOT_FOUND.0 as i64;
/// HTTP headers that do not match the body, or a required one missing (2026-07-28).
pub const HEADER_MISMATCH: i64 = ErrorCode::HEADER_MISMATCH.0 as i64;
/// A protocol version this server does not speak (2026-07-28).
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = ErrorCode::UNSUPPORTED_PROTOCOL_VERSION.0 as i64;

/// A JSON-RPC request id (a string or a number).
pub type Id = Value;

/// One incoming JSON-RPC message.
#[derive(Clone, Debug, PartialEq)]
pub enum Incoming {
    Request {
        id: Id,
        method: String,
        params: Map<String, Value>,
    },
    Notification {
        method: String,
        params: Map<String, Value>,
    },
    /// A response to a request of ours: this server sends none, so it is acknowledged and
    /// ignored.
    Response,
}

impl Incoming {
    pub fn method(&self) -> Option<&str> {
        match self {
            Incoming::Request { method, .. } | Incoming::Notification { method, .. } => {
                Some(method)
            }
            Incoming::Response => None,
        }
    }

    pub fn params(&self) -> Option<&Map<String, Value>> {
        match self {
            Incoming::Request { params, .. } | Incoming::Notification { params, .. } => {
                Some(params)
            }
            Incoming::Response => None,
        }
    }
}

/// A JSON-RPC error, with the id of the request it answers (none when unknown).
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The error response to request `id` (`None`: an error about no request in
    /// particular, which carries no `id`).
    pub fn to_response(&self, id: Option<&Id>) -> Value {
        let mut error = json!({"code": self.code, "message": self.message});
        if let Some(data) = &self.data {
            error["data"] = data.clone();
        }
        let mut response = json!({"jsonrpc": "2.0", "error": error});
        if let Some(id) = id {
            response["id"] = id.clone();
        }
        response
    }
}

/// The success response to request `id`.
pub fn result(id: &Id, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A notification from the server.
pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// Reads one JSON-RPC message from a request body.
pub fn parse(body: &[u8]) -> Result<Incoming, RpcError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| RpcError::new(PARSE_ERROR, format!("Parse error: {e}")))?;
    let Value::Object(mut object) = value else {
        return Err(RpcError::new(
            INVALID_REQUEST,
            if value.is_array() {
                "Invalid Request: batches are not supported; send one message per POST"
            } else {
                "Invalid Request: a message is a JSON object"
            },
        ));
    };
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        return Err(RpcError::new(
            INVALID_REQUEST,
            "Invalid Request: jsonrpc must be \"2.0\"",
        ));
    }
    let params = match object.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(params)) => params,
        Some(_) => {
            return Err(RpcError::new(
                INVALID_REQUEST,
                "Invalid Request: params must be an object",
            ));
        }
    };
    let id = object.remove("id");
    if let Some(id) = &id
        && !(id.is_string() || id.is_i64() || id.is_u64())
    {
        return Err(RpcError::new(
            INVALID_REQUEST,
            "Invalid Request: id must be a string or an integer",
        ));
    }
    match (object.remove("method"), id) {
        (Some(Value::String(method)), Some(id)) => Ok(Incoming::Request { id, method, params }),
        (Some(Value::String(method)), None) => Ok(Incoming::Notification { method, params }),
        (None, Some(_)) if object.contains_key("result") || object.contains_key("error") => {
            Ok(Incoming::Response)
        }
        _ => Err(RpcError::new(
            INVALID_REQUEST,
            "Invalid Request: method must be a string",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_requests_and_notifications() {
        let request = parse(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).unwrap();
        assert_eq!(request.method(), Some("tools/list"));
        assert!(matches!(request, Incoming::Request { .. }));
        let note = parse(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
        assert!(matches!(note, Incoming::Notification { .. }));
        let response = parse(br#"{"jsonrpc":"2.0","id":1,"result":{}}"#).unwrap();
        assert_eq!(response, Incoming::Response);
    }

    #[test]
    fn refuses_what_is_not_one_message() {
        assert_eq!(parse(b"{nope").unwrap_err().code, PARSE_ERROR);
        assert_eq!(
            parse(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#)
                .unwrap_err()
                .code,
            INVALID_REQUEST
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#)
                .unwrap_err()
                .code,
            INVALID_REQUEST
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}"#)
                .unwrap_err()
                .code,
            INVALID_REQUEST
        );
        assert_eq!(
            parse(br#"{"jsonrpc":"2.0","id":{"a":1},"method":"x"}"#)
                .unwrap_err()
                .code,
            INVALID_REQUEST
        );
    }

    #[test]
    fn errors_carry_the_id_when_known() {
        let e = RpcError::new(INVALID_PARAMS, "bad");
        assert_eq!(e.to_response(Some(&json!(7)))["id"], json!(7));
        assert!(e.to_response(None).get("id").is_none());
    }
}
