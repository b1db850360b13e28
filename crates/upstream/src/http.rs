//! An imported OpenAPI operation's call as one HTTP request: the call's arguments placed
//! where the operation says ([`HttpOperation`]): path parameters percent-encoded into the
//! path template, query parameters in the query string, header parameters as headers, the
//! body as JSON. Building the request is a pure function ([`build_request`]); sending it is
//! the worker's, through checked egress, with the call's idempotency key.

use serde_json::{Map, Value};
use toolgrid_core::source::{HttpMethod, HttpOperation, ParameterLocation};

/// The request a call makes.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamRequest {
    pub method: HttpMethod,
    pub url: url::Url,
    /// Header parameters (the source's own headers and the idempotency key are added when
    /// it is sent).
    pub headers: Vec<(String, String)>,
    /// The JSON body and its content type.
    pub body: Option<(String, Vec<u8>)>,
}

/// Why a call's arguments do not make a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("the source's base URL {0:?} is not a URL")]
    BaseUrl(String),
    #[error("the required argument {0:?} is missing")]
    Missing(String),
    #[error("the argument {name:?} cannot go in a {location}: {reason}")]
    Unplaceable {
        name: String,
        location: &'static str,
        reason: String,
    },
}

/// Characters a path segment keeps as they are (RFC 3986 unreserved); every other byte is
/// percent-encoded, `/` included, so an argument cannot step into another path.
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// A scalar argument as text (strings as they are, numbers and booleans as JSON writes
/// them); arrays and objects cannot go in a path or a header.
fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The request `operation` makes under `base_url` with `args` (the call's arguments by
/// option name).
pub fn build_request(
    operation: &HttpOperation,
    base_url: &str,
    args: &Map<String, Value>,
) -> Result<UpstreamRequest, RequestError> {
    let mut path = operation.path.clone();
    let mut query: Vec<(String, String)> = Vec::new();
    let mut headers = Vec::new();
    for parameter in &operation.parameters {
        let value = match args.get(&parameter.option) {
            Some(Value::Null) | None if parameter.required => {
                return Err(RequestError::Missing(parameter.option.clone()));
            }
            Some(Value::Null) | None => continue,
            Some(value) => value,
        };
        let unplaceable = |location: &'static str, reason: &str| RequestError::Unplaceable {
            name: parameter.option.clone(),
            location,
            reason: reason.into(),
        };
        match parameter.location {
            ParameterLocation::Path => {
                let text = scalar(value).ok_or_else(|| unplaceable("path", "not a scalar"))?;
                let encoded = percent_encoding::utf8_percent_encode(&text, PATH_SEGMENT);
                path = path.replace(&format!("{{{}}}", parameter.name), &encoded.to_string());
            }
            ParameterLocation::Query => match value {
                // An array repeats the parameter (OpenAPI's default `form`, `explode`).
                Value::Array(items) => {
                    for item in items {
                        let text = scalar(item)
                            .ok_or_else(|| unplaceable("query", "an array of non-scalars"))?;
                        query.push((parameter.name.clone(), text));
                    }
                }
                other => query.push((
                    parameter.name.clone(),
                    scalar(other).ok_or_else(|| unplaceable("query", "an object"))?,
                )),
            },
            ParameterLocation::Header => {
                let text = scalar(value).ok_or_else(|| unplaceable("header", "not a scalar"))?;
                if text.chars().any(|c| c.is_control()) {
                    return Err(unplaceable("header", "it holds control characters"));
                }
                headers.push((parameter.name.clone(), text));
            }
            ParameterLocation::Cookie => {
                return Err(unplaceable("cookie", "cookies are not sent"));
            }
        }
    }
    let base = base_url.trim_end_matches('/');
    let mut url = url::Url::parse(&format!("{base}{path}"))
        .map_err(|_| RequestError::BaseUrl(base_url.to_string()))?;
    if !query.is_empty() {
        url.query_pairs_mut().extend_pairs(query);
    }
    let body = match &operation.body {
        Some(body) => match args.get(&body.option) {
            Some(Value::Null) | None if body.required => {
                return Err(RequestError::Missing(body.option.clone()));
            }
            Some(Value::Null) | None => None,
            Some(value) => Some((
                body.content_type.clone(),
                serde_json::to_vec(value).unwrap_or_default(),
            )),
        },
        None => None,
    };
    Ok(UpstreamRequest {
        method: operation.method,
        url,
        headers,
        body,
    })
}

/// Why a document could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    Egress(#[from] crate::egress::EgressError),
    #[error("GET {url}: {message}")]
    Transport { url: String, message: String },
    #[error("GET {url}: timed out")]
    Timeout { url: String },
    #[error("GET {url}: the server answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("GET {url}: larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
}

/// The body of `GET url` (an OpenAPI document), through checked egress, at most `limit`
/// bytes, within `timeout`.
pub async fn fetch_document(
    url: &str,
    egress: crate::egress::EgressPolicy,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Vec<u8>, FetchError> {
    let parsed = crate::egress::parse(url, egress)?;
    let client = crate::egress::client_for(&parsed, egress, timeout).await?;
    let shown = parsed.to_string();
    let failed = |e: reqwest::Error| {
        if e.is_timeout() {
            FetchError::Timeout { url: shown.clone() }
        } else {
            FetchError::Transport {
                url: shown.clone(),
                message: e.without_url().to_string(),
            }
        }
    };
    let mut response = client
        .get(parsed.clone())
        .header(
            "accept",
            "application/json, application/yaml;q=0.9, */*;q=0.5",
        )
        .send()
        .await
        .map_err(failed)?;
    if !response.status().is_success() {
        return Err(FetchError::Status {
            url: shown,
            status: response.status().as_u16(),
        });
    }
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(FetchError::TooLarge { url: shown, limit });
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(failed)? {
        bytes.extend_from_slice(&chunk);
        if bytes.len() > limit {
            return Err(FetchError::TooLarge { url: shown, limit });
        }
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolgrid_core::source::{HttpBody, HttpParameter};

    fn operation() -> HttpOperation {
        let parameter = |name: &str, location, required| HttpParameter {
            name: name.into(),
            option: name.into(),
            location,
            required,
        };
        HttpOperation {
            method: HttpMethod::Put,
            path: "/stores/{storeId}/pets/{petId}".into(),
            parameters: vec![
                parameter("storeId", ParameterLocation::Path, true),
                parameter("petId", ParameterLocation::Path, true),
                parameter("tags", ParameterLocation::Query, false),
                parameter("dryRun", ParameterLocation::Query, false),
                parameter("X-Request-Tag", ParameterLocation::Header, false),
            ],
            body: Some(HttpBody {
                option: "body".into(),
                content_type: "application/json".into(),
                required: true,
            }),
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn arguments_go_where_the_operation_says() {
        let request = build_request(
            &operation(),
            "https://api.example.com/v2/",
            &args(json!({
                "storeId": 7,
                "petId": "rex/../admin?x=1",
                "tags": ["a", "b c"],
                "dryRun": true,
                "X-Request-Tag": "t-1",
                "body": {"name": "Rex"}
            })),
        )
        .unwrap();
        assert_eq!(request.method, HttpMethod::Put);
        assert_eq!(
            request.url.as_str(),
            "https://api.example.com/v2/stores/7/pets/rex%2F..%2Fadmin%3Fx%3D1?tags=a&tags=b+c&dryRun=true"
        );
        assert_eq!(request.headers, [("X-Request-Tag".into(), "t-1".into())]);
        assert_eq!(
            request.body,
            Some(("application/json".into(), br#"{"name":"Rex"}"#.to_vec()))
        );
    }

    #[test]
    fn missing_and_misplaced_arguments_are_named() {
        let base = "https://api.example.com";
        assert_eq!(
            build_request(&operation(), base, &args(json!({"storeId": 1, "body": {}}))),
            Err(RequestError::Missing("petId".into()))
        );
        assert_eq!(
            build_request(&operation(), base, &args(json!({"storeId": 1, "petId": 2}))),
            Err(RequestError::Missing("body".into()))
        );
        assert!(matches!(
            build_request(
                &operation(),
                base,
                &args(json!({"storeId": {"x": 1}, "petId": 2, "body": {}}))
            ),
            Err(RequestError::Unplaceable {
                location: "path",
                ..
            })
        ));
        assert!(matches!(
            build_request(
                &operation(),
                base,
                &args(
                    json!({"storeId": 1, "petId": 2, "body": {}, "X-Request-Tag": "a\r\nInjected: 1"})
                )
            ),
            Err(RequestError::Unplaceable {
                location: "header",
                ..
            })
        ));
        assert_eq!(
            build_request(
                &operation(),
                "not a url",
                &args(json!({"storeId": 1, "petId": 2, "body": {}}))
            ),
            Err(RequestError::BaseUrl("not a url".into()))
        );
    }
}
