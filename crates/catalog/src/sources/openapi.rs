//! An OpenAPI document's operations as imported tools: each operation (a path and a method)
//! with an `operationId` becomes a tool of that name whose `default` command takes the
//! operation's parameters and JSON request body as options and whose result is the JSON
//! schema of its first 2xx response; its effect is its method's ([`HttpMethod::effect`]),
//! overridable per tool.
//!
//! Tools come in the order of the document's paths, each path's methods in a fixed order
//! (GET, PUT, POST, DELETE, OPTIONS, HEAD, PATCH, TRACE).
//!
//! The document is JSON or YAML, OpenAPI 3.0 (read with `openapiv3`) or 3.1 (with `oas3`).
//! The typed model gives the operations, their parameters, bodies and responses; schemas are
//! taken as written in the document (the typed models drop keywords they do not know) with
//! every local `$ref` inlined, since an option's schema must stand alone. What cannot be
//! called as one JSON request (a cookie parameter, a form or binary body, a cyclic or
//! unresolvable schema) is left out with its reason ([`LeftOut`]); what cannot be read at
//! all is an [`OpenApiError`].

use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use toolgrid_core::source::{
    HttpBody, HttpMethod, HttpOperation, HttpParameter, ImportedTool, LeftOut, LeftOutReason,
    ParameterLocation, SourceLimits, SourceSnapshot, ToolFilter, UpstreamTarget, cut_text,
    schema_bytes, valid_imported_name,
};
use toolgrid_core::spec::{Command, Effect, OptionArg};

/// Documents larger than this are refused unread.
pub const MAX_DOCUMENT_BYTES: usize = 16 * 1024 * 1024;

/// How many `$ref`s may lead from a parameter, request body, response or path item to the
/// object itself.
const MAX_REF_HOPS: usize = 8;

/// How many schema `$ref`s may be open at once while one schema is inlined.
const MAX_REF_DEPTH: usize = 32;

/// How deeply an inlined schema may nest.
const MAX_NESTING: usize = 128;

/// How many JSON values all of a document's schemas may add up to, inlined: the work one
/// document can cause is bounded, however many operations fan out to large schemas.
const MAX_DOCUMENT_VALUES: usize = 64 * 1024 * 1024;

/// The option a request body is passed in.
const BODY_OPTION: &str = "body";

/// Why an OpenAPI document cannot be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenApiError {
    /// Larger than [`MAX_DOCUMENT_BYTES`].
    #[error("the document is {size} bytes, over the limit of {max}")]
    TooLarge { size: usize, max: usize },
    /// JSON or YAML, but not an object with an `openapi` (or `swagger`) field.
    #[error("not an OpenAPI document: no `openapi` field")]
    NotOpenApi,
    /// An OpenAPI (or Swagger) version other than 3.0 and 3.1.
    #[error("OpenAPI {version} is not supported (3.0 and 3.1 are)")]
    UnsupportedVersion { version: String },
    /// Not JSON or YAML, or not a valid document of its version.
    #[error("invalid OpenAPI document: {message}")]
    Invalid { message: String },
}

/// The tools an OpenAPI document offers, named by `operationId`, as `source`'s snapshot:
/// those `filter` admits, at most `limits.max_tools` of them, each with the effect
/// `overrides` gives its `operationId` or else its method's. The rest are in `left_out`.
pub fn read_openapi(
    document: &[u8],
    source: &str,
    filter: &ToolFilter,
    overrides: &BTreeMap<String, Effect>,
    limits: &SourceLimits,
) -> Result<SourceSnapshot, OpenApiError> {
    let parsed = parse(document)?;
    let mut snapshot = SourceSnapshot {
        tools: Vec::new(),
        left_out: parsed.unreadable.clone(),
        era: None,
    };
    let mut seen = BTreeSet::new();
    let values_left = Cell::new(MAX_DOCUMENT_VALUES);
    for operation in &parsed.operations {
        let Some(id) = operation.id.as_deref() else {
            snapshot.left_out.push(LeftOut {
                name: format!("{} {}", operation.method.as_str(), operation.path),
                reason: LeftOutReason::NoOperationId,
                message: "the operation has no operationId".into(),
            });
            continue;
        };
        let left = |reason, message: String| LeftOut {
            name: id.to_string(),
            reason,
            message,
        };
        if !valid_imported_name(source, id) {
            snapshot.left_out.push(left(
                LeftOutReason::InvalidName,
                format!(
                    "`{id}` is not a tool name (letters, digits, `-` and `_`, at most 64 \
                     characters with the source's name)"
                ),
            ));
            continue;
        }
        if !seen.insert(id) {
            snapshot.left_out.push(left(
                LeftOutReason::InvalidName,
                format!("another operation already has the operationId `{id}`"),
            ));
            continue;
        }
        if !filter.admits(id) {
            snapshot.left_out.push(left(
                LeftOutReason::NotAllowed,
                "not admitted by the source's allow and deny lists".into(),
            ));
            continue;
        }
        if snapshot.tools.len() >= limits.max_tools {
            snapshot.left_out.push(left(
                LeftOutReason::TooLarge,
                format!("beyond the source's limit of {} tools", limits.max_tools),
            ));
            continue;
        }
        let effect = overrides
            .get(id)
            .copied()
            .unwrap_or(operation.method.effect());
        let schemas = Schemas {
            raw: &parsed.raw,
            legacy: parsed.legacy,
            max_bytes: limits.max_schema_bytes,
            values_left: &values_left,
        };
        match import(&schemas, operation, id, effect, limits) {
            Err(problem) => snapshot.left_out.push(problem.left_out(id)),
            Ok(tool) => match super::callable(tool) {
                Ok(tool) => snapshot.tools.push(tool),
                Err(left_out) => snapshot.left_out.push(left_out),
            },
        }
    }
    Ok(super::bound(snapshot, limits))
}

/// A document read: its JSON (schemas are taken from here) and its operations.
struct Parsed {
    raw: Value,
    /// OpenAPI 3.0, whose schemas say `nullable` and boolean `exclusiveMaximum`.
    legacy: bool,
    operations: Vec<Operation>,
    /// Path items that cannot be read (an unresolvable `$ref`), named by path.
    unreadable: Vec<LeftOut>,
}

/// An operation of either version, each schema as a JSON pointer into [`Parsed::raw`].
struct Operation {
    method: HttpMethod,
    path: String,
    id: Option<String>,
    summary: Option<String>,
    description: Option<String>,
    /// The path item's parameters, then the operation's.
    parameters: Result<Vec<Parameter>, Problem>,
    body: Result<Option<Body>, Problem>,
    /// Where the first 2xx response's JSON schema is, if it has JSON content.
    result: Result<Option<String>, Problem>,
}

#[derive(Clone)]
struct Parameter {
    name: String,
    location: ParameterLocation,
    required: bool,
    description: String,
    schema_at: Option<String>,
}

struct Body {
    content_type: String,
    required: bool,
    description: String,
    schema_at: String,
}

/// Why one operation is left out.
#[derive(Clone, Debug)]
struct Problem {
    reason: LeftOutReason,
    message: String,
}

impl Problem {
    fn schema(message: impl Into<String>) -> Problem {
        Problem {
            reason: LeftOutReason::UnsupportedSchema,
            message: message.into(),
        }
    }

    fn request(message: impl Into<String>) -> Problem {
        Problem {
            reason: LeftOutReason::UnsupportedRequest,
            message: message.into(),
        }
    }

    fn too_large(message: impl Into<String>) -> Problem {
        Problem {
            reason: LeftOutReason::TooLarge,
            message: message.into(),
        }
    }

    fn left_out(self, name: &str) -> LeftOut {
        LeftOut {
            name: name.to_string(),
            reason: self.reason,
            message: self.message,
        }
    }
}

/// Reads `document` as JSON (else YAML), finds its version and its operations.
fn parse(document: &[u8]) -> Result<Parsed, OpenApiError> {
    if document.len() > MAX_DOCUMENT_BYTES {
        return Err(OpenApiError::TooLarge {
            size: document.len(),
            max: MAX_DOCUMENT_BYTES,
        });
    }
    let (raw, json) = match serde_json::from_slice::<Value>(document) {
        Ok(raw) => (raw, true),
        Err(json_error) => match serde_yaml::from_slice::<Value>(document) {
            Ok(raw) => (raw, false),
            Err(yaml_error) => {
                let looks_json = document.trim_ascii_start().first() == Some(&b'{');
                return Err(OpenApiError::Invalid {
                    message: if looks_json {
                        format!("not JSON: {json_error}")
                    } else {
                        format!("neither JSON nor YAML: {yaml_error}")
                    },
                });
            }
        },
    };
    let version = match (raw.get("openapi"), raw.get("swagger")) {
        (Some(Value::String(version)), _) => version.clone(),
        (Some(other), _) => {
            return Err(OpenApiError::Invalid {
                message: format!("`openapi` must be a version string, not {other}"),
            });
        }
        (None, Some(swagger)) => {
            return Err(OpenApiError::UnsupportedVersion {
                version: swagger
                    .as_str()
                    .map_or_else(|| swagger.to_string(), str::to_string),
            });
        }
        (None, None) => return Err(OpenApiError::NotOpenApi),
    };
    let mut unreadable = Vec::new();
    let operations = if is_version(&version, "3.0") {
        v30::operations(
            &typed::<openapiv3::OpenAPI>(document, json)?,
            &raw,
            &mut unreadable,
        )
    } else if is_version(&version, "3.1") {
        v31::operations(&typed::<oas3::Spec>(document, json)?, &raw, &mut unreadable)
    } else {
        return Err(OpenApiError::UnsupportedVersion { version });
    };
    Ok(Parsed {
        legacy: is_version(&version, "3.0"),
        raw,
        operations,
        unreadable,
    })
}

/// Whether `version` is `minor` or one of its patch versions (`3.0`, `3.0.3`).
fn is_version(version: &str, minor: &str) -> bool {
    version
        .strip_prefix(minor)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The document as its version's typed model.
fn typed<T: DeserializeOwned>(document: &[u8], json: bool) -> Result<T, OpenApiError> {
    let parsed = if json {
        serde_json::from_slice(document).map_err(|e| e.to_string())
    } else {
        serde_yaml::from_slice(document).map_err(|e| e.to_string())
    };
    parsed.map_err(|message| OpenApiError::Invalid { message })
}

/// The method named `name` as a path item's field.
fn method_of(name: &str) -> Option<HttpMethod> {
    Some(match name {
        "get" => HttpMethod::Get,
        "head" => HttpMethod::Head,
        "put" => HttpMethod::Put,
        "delete" => HttpMethod::Delete,
        "post" => HttpMethod::Post,
        "patch" => HttpMethod::Patch,
        "options" => HttpMethod::Options,
        "trace" => HttpMethod::Trace,
        _ => return None,
    })
}

/// `key` as one JSON pointer segment.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON pointer a local `$ref` (`#/components/...`) names.
fn ref_pointer(reference: &str) -> Result<&str, Problem> {
    reference
        .strip_prefix('#')
        .filter(|pointer| pointer.is_empty() || pointer.starts_with('/'))
        .ok_or_else(|| Problem::schema(format!("`{reference}` is not a local $ref")))
}

/// The object `reference` leads to (through at most [`MAX_REF_HOPS`] more `$ref`s), as a
/// `T`, and where it is.
fn follow<T: DeserializeOwned>(raw: &Value, reference: &str) -> Result<(T, String), Problem> {
    let mut reference = reference.to_string();
    for _ in 0..MAX_REF_HOPS {
        let at = ref_pointer(&reference)?.to_string();
        let target = raw
            .pointer(&at)
            .ok_or_else(|| Problem::schema(format!("`{reference}` leads nowhere")))?;
        if let Some(next) = target.get("$ref").and_then(Value::as_str) {
            reference = next.to_string();
            continue;
        }
        let item = serde_json::from_value(target.clone())
            .map_err(|e| Problem::schema(format!("`{reference}`: {e}")))?;
        return Ok((item, at));
    }
    Err(Problem::schema(format!(
        "more than {MAX_REF_HOPS} $refs in a row from `{reference}`"
    )))
}

/// Whether `content_type` is JSON: `application/json` or a `+json` type.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// The request body of content `types` (at `at`): its JSON media type, or why it has none.
fn body_of<'a>(
    types: impl IntoIterator<Item = &'a String>,
    at: &str,
    required: bool,
    description: Option<&str>,
) -> Result<Option<Body>, Problem> {
    let types: Vec<&String> = types.into_iter().collect();
    if types.is_empty() {
        return Ok(None);
    }
    let Some(json) = types.iter().find(|t| is_json(t)) else {
        let listed: Vec<&str> = types.iter().map(|t| t.as_str()).collect();
        return Err(Problem::request(format!(
            "the request body is not JSON ({})",
            listed.join(", ")
        )));
    };
    Ok(Some(Body {
        content_type: json.to_string(),
        required,
        description: description.unwrap_or_default().to_string(),
        schema_at: format!("{at}/content/{}/schema", escape(json)),
    }))
}

/// Where the schema of a response's JSON content (`types`, at `at`) is, if it has any.
fn result_of<'a>(types: impl IntoIterator<Item = &'a String>, at: &str) -> Option<String> {
    types
        .into_iter()
        .find(|t| is_json(t))
        .map(|json| format!("{at}/content/{}/schema", escape(json)))
}

/// Where the schema of a parameter given by `content` (at `at`) is: its JSON media type's.
fn parameter_content<'a>(
    types: impl IntoIterator<Item = &'a String>,
    at: &str,
    name: &str,
) -> Result<Option<String>, Problem> {
    result_of(types, at)
        .map(Some)
        .ok_or_else(|| Problem::request(format!("parameter `{name}` has no JSON content")))
}

/// The 2xx status of a response key (`200`, `2XX`) as a rank: codes first, lowest first,
/// then the range.
fn success_rank(status: &str) -> Option<u16> {
    if status.eq_ignore_ascii_case("2xx") {
        return Some(300);
    }
    status
        .parse::<u16>()
        .ok()
        .filter(|code| (200..300).contains(code))
}

/// OpenAPI 3.0, read with `openapiv3`.
mod v30 {
    use super::*;
    use openapiv3::{
        OpenAPI, Operation as Op, Parameter as Param, ParameterSchemaOrContent, PathItem,
        ReferenceOr,
    };

    /// `item` itself (at `at`), or what its `$ref` leads to.
    fn located<T: Clone + DeserializeOwned>(
        raw: &Value,
        item: &ReferenceOr<T>,
        at: String,
    ) -> Result<(T, String), Problem> {
        match item {
            ReferenceOr::Item(item) => Ok((item.clone(), at)),
            ReferenceOr::Reference { reference } => follow(raw, reference),
        }
    }

    /// The document's operations; a path item that cannot be read goes to `unreadable`.
    pub(super) fn operations(
        spec: &OpenAPI,
        raw: &Value,
        unreadable: &mut Vec<LeftOut>,
    ) -> Vec<Operation> {
        let mut operations = Vec::new();
        for (path, item) in &spec.paths.paths {
            let at = format!("/paths/{}", escape(path));
            let (item, at) = match located::<PathItem>(raw, item, at) {
                Ok(found) => found,
                Err(problem) => {
                    unreadable.push(problem.left_out(path));
                    continue;
                }
            };
            let shared = parameters(raw, &item.parameters, &format!("{at}/parameters"));
            for (name, op) in item.iter() {
                let Some(method) = method_of(name) else {
                    continue;
                };
                operations.push(operation(
                    raw,
                    method,
                    path,
                    op,
                    &format!("{at}/{name}"),
                    &shared,
                ));
            }
        }
        operations
    }

    fn operation(
        raw: &Value,
        method: HttpMethod,
        path: &str,
        op: &Op,
        at: &str,
        shared: &Result<Vec<Parameter>, Problem>,
    ) -> Operation {
        let own = parameters(raw, &op.parameters, &format!("{at}/parameters"));
        let parameters = match (shared, own) {
            (Ok(shared), Ok(own)) => Ok(merge(shared, own)),
            (Err(problem), _) => Err(problem.clone()),
            (_, Err(problem)) => Err(problem),
        };
        let body = match &op.request_body {
            None => Ok(None),
            Some(body) => located(raw, body, format!("{at}/requestBody")).and_then(|(b, at)| {
                body_of(b.content.keys(), &at, b.required, b.description.as_deref())
            }),
        };
        Operation {
            method,
            path: path.to_string(),
            id: op.operation_id.clone(),
            summary: op.summary.clone(),
            description: op.description.clone(),
            parameters,
            body,
            result: result(raw, op, at),
        }
    }

    fn parameters(
        raw: &Value,
        list: &[ReferenceOr<Param>],
        at: &str,
    ) -> Result<Vec<Parameter>, Problem> {
        let mut out = Vec::new();
        for (i, item) in list.iter().enumerate() {
            let (param, at) = located(raw, item, format!("{at}/{i}"))?;
            let (data, location) = match &param {
                Param::Query { parameter_data, .. } => (parameter_data, ParameterLocation::Query),
                Param::Header { parameter_data, .. } => (parameter_data, ParameterLocation::Header),
                Param::Path { parameter_data, .. } => (parameter_data, ParameterLocation::Path),
                Param::Cookie { parameter_data, .. } => (parameter_data, ParameterLocation::Cookie),
            };
            let schema_at = match &data.format {
                ParameterSchemaOrContent::Schema(_) => Some(format!("{at}/schema")),
                ParameterSchemaOrContent::Content(content) => {
                    parameter_content(content.keys(), &at, &data.name)?
                }
            };
            out.push(Parameter {
                name: data.name.clone(),
                location,
                required: data.required,
                description: data.description.clone().unwrap_or_default(),
                schema_at,
            });
        }
        Ok(out)
    }

    fn result(raw: &Value, op: &Op, at: &str) -> Result<Option<String>, Problem> {
        let first = op
            .responses
            .responses
            .iter()
            .filter_map(|(status, response)| {
                success_rank(&status.to_string()).map(|rank| (rank, status, response))
            })
            .min_by_key(|(rank, _, _)| *rank);
        let Some((_, status, response)) = first else {
            return Ok(None);
        };
        // the key as written: a range may be `2XX` or `2xx`
        let responses = format!("{at}/responses");
        let key = raw
            .pointer(&responses)
            .and_then(Value::as_object)
            .and_then(|all| {
                all.keys()
                    .find(|k| k.eq_ignore_ascii_case(&status.to_string()))
                    .cloned()
            })
            .unwrap_or_else(|| status.to_string());
        let (response, at) = located(raw, response, format!("{responses}/{}", escape(&key)))?;
        Ok(result_of(response.content.keys(), &at))
    }
}

/// OpenAPI 3.1, read with `oas3`.
mod v31 {
    use super::*;
    use oas3::Spec;
    use oas3::spec::{
        ObjectOrReference, Operation as Op, Parameter as Param, ParameterIn, PathItem,
    };

    /// `item` itself (at `at`), or what its `$ref` leads to.
    fn located<T: Clone + DeserializeOwned>(
        raw: &Value,
        item: &ObjectOrReference<T>,
        at: String,
    ) -> Result<(T, String), Problem> {
        match item {
            ObjectOrReference::Object(item) => Ok((item.clone(), at)),
            ObjectOrReference::Ref { ref_path, .. } => follow(raw, ref_path),
        }
    }

    /// The document's operations; a path item that cannot be read goes to `unreadable`.
    pub(super) fn operations(
        spec: &Spec,
        raw: &Value,
        unreadable: &mut Vec<LeftOut>,
    ) -> Vec<Operation> {
        let mut operations = Vec::new();
        for (path, item) in spec.paths.iter().flatten() {
            let at = format!("/paths/{}", escape(path));
            let (item, at) = match &item.reference {
                None => (item.clone(), at),
                Some(reference) => match follow::<PathItem>(raw, reference) {
                    Ok(found) => found,
                    Err(problem) => {
                        unreadable.push(problem.left_out(path));
                        continue;
                    }
                },
            };
            let shared = parameters(raw, &item.parameters, &format!("{at}/parameters"));
            let methods = [
                ("get", &item.get),
                ("put", &item.put),
                ("post", &item.post),
                ("delete", &item.delete),
                ("options", &item.options),
                ("head", &item.head),
                ("patch", &item.patch),
                ("trace", &item.trace),
            ];
            for (name, op) in methods {
                let (Some(op), Some(method)) = (op, method_of(name)) else {
                    continue;
                };
                operations.push(operation(
                    raw,
                    method,
                    path,
                    op,
                    &format!("{at}/{name}"),
                    &shared,
                ));
            }
        }
        operations
    }

    fn operation(
        raw: &Value,
        method: HttpMethod,
        path: &str,
        op: &Op,
        at: &str,
        shared: &Result<Vec<Parameter>, Problem>,
    ) -> Operation {
        let own = parameters(raw, &op.parameters, &format!("{at}/parameters"));
        let parameters = match (shared, own) {
            (Ok(shared), Ok(own)) => Ok(merge(shared, own)),
            (Err(problem), _) => Err(problem.clone()),
            (_, Err(problem)) => Err(problem),
        };
        let body = match &op.request_body {
            None => Ok(None),
            Some(body) => located(raw, body, format!("{at}/requestBody")).and_then(|(b, at)| {
                body_of(
                    b.content.keys(),
                    &at,
                    b.required.unwrap_or(false),
                    b.description.as_deref(),
                )
            }),
        };
        Operation {
            method,
            path: path.to_string(),
            id: op.operation_id.clone(),
            summary: op.summary.clone(),
            description: op.description.clone(),
            parameters,
            body,
            result: result(raw, op, at),
        }
    }

    fn parameters(
        raw: &Value,
        list: &[ObjectOrReference<Param>],
        at: &str,
    ) -> Result<Vec<Parameter>, Problem> {
        let mut out = Vec::new();
        for (i, item) in list.iter().enumerate() {
            let (param, at) = located(raw, item, format!("{at}/{i}"))?;
            let location = match param.location {
                ParameterIn::Query => ParameterLocation::Query,
                ParameterIn::Header => ParameterLocation::Header,
                ParameterIn::Path => ParameterLocation::Path,
                ParameterIn::Cookie => ParameterLocation::Cookie,
            };
            let schema_at = match &param.content {
                Some(content) => parameter_content(content.keys(), &at, &param.name)?,
                None => param.schema.as_ref().map(|_| format!("{at}/schema")),
            };
            out.push(Parameter {
                name: param.name.clone(),
                location,
                required: param.required.unwrap_or(false),
                description: param.description.clone().unwrap_or_default(),
                schema_at,
            });
        }
        Ok(out)
    }

    fn result(raw: &Value, op: &Op, at: &str) -> Result<Option<String>, Problem> {
        let first = op
            .responses
            .iter()
            .flatten()
            .filter_map(|(status, response)| {
                success_rank(status).map(|rank| (rank, status, response))
            })
            .min_by_key(|(rank, _, _)| *rank);
        let Some((_, status, response)) = first else {
            return Ok(None);
        };
        let (response, at) = located(raw, response, format!("{at}/responses/{}", escape(status)))?;
        Ok(result_of(response.content.keys(), &at))
    }
}

/// The path item's parameters with the operation's: one of the same name and location
/// replaces the path item's.
fn merge(shared: &[Parameter], own: Vec<Parameter>) -> Vec<Parameter> {
    let mut merged: Vec<Parameter> = shared
        .iter()
        .filter(|p| {
            !own.iter()
                .any(|o| o.name == p.name && o.location == p.location)
        })
        .cloned()
        .collect();
    merged.extend(own);
    merged
}

fn location_name(location: ParameterLocation) -> &'static str {
    match location {
        ParameterLocation::Path => "path",
        ParameterLocation::Query => "query",
        ParameterLocation::Header => "header",
        ParameterLocation::Cookie => "cookie",
    }
}

/// Whether a header parameter is one OpenAPI says to ignore (the request's own
/// `Accept`, `Content-Type` and `Authorization`).
fn ignored_header(parameter: &Parameter) -> bool {
    parameter.location == ParameterLocation::Header
        && ["accept", "content-type", "authorization"]
            .iter()
            .any(|h| parameter.name.eq_ignore_ascii_case(h))
}

/// One operation as the tool `id`, or why it cannot be one.
fn import(
    schemas: &Schemas,
    operation: &Operation,
    id: &str,
    effect: Effect,
    limits: &SourceLimits,
) -> Result<ImportedTool, Problem> {
    let parameters: Vec<&Parameter> = operation
        .parameters
        .as_ref()
        .map_err(Problem::clone)?
        .iter()
        .filter(|p| !ignored_header(p))
        .collect();
    if let Some(cookie) = parameters
        .iter()
        .find(|p| p.location == ParameterLocation::Cookie)
    {
        return Err(Problem::request(format!(
            "cookie parameter `{}`",
            cookie.name
        )));
    }
    let body = operation.body.as_ref().map_err(Problem::clone)?.as_ref();
    let Request {
        options,
        parameters,
        body,
    } = request(schemas, &parameters, body)?;
    let input_bytes: usize = options
        .iter()
        .filter_map(|o| o.schema.as_ref())
        .map(schema_bytes)
        .fold(0, usize::saturating_add);
    within_limit("the input schema", input_bytes, limits)?;
    let result = match operation.result.as_ref().map_err(Problem::clone)? {
        Some(at) => schemas.at(at)?,
        None => None,
    };
    if let Some(result) = &result {
        within_limit("the result schema", schema_bytes(result), limits)?;
    }
    Ok(ImportedTool {
        name: id.to_string(),
        description: description(operation, limits.max_description_bytes),
        effect,
        command: Command {
            name: "default".into(),
            description: String::new(),
            positional: Vec::new(),
            options,
            flags: Vec::new(),
            stdin: None,
            result,
            errors: Vec::new(),
            dry_run_result: None,
            allow_repeat: false,
        },
        target: UpstreamTarget::Http(HttpOperation {
            method: operation.method,
            path: operation.path.clone(),
            parameters,
            body,
        }),
    })
}

/// Whether a schema of `bytes` fits `limits`.
fn within_limit(what: &str, bytes: usize, limits: &SourceLimits) -> Result<(), Problem> {
    if bytes > limits.max_schema_bytes {
        return Err(Problem::too_large(format!(
            "{what} is {bytes} bytes, over the limit of {}",
            limits.max_schema_bytes
        )));
    }
    Ok(())
}

/// An operation's inputs as options, and where each goes in the request.
struct Request {
    /// Each parameter's, then the body's.
    options: Vec<OptionArg>,
    parameters: Vec<HttpParameter>,
    body: Option<HttpBody>,
}

/// The request of an operation with `parameters` and `body`.
fn request(
    schemas: &Schemas,
    parameters: &[&Parameter],
    body: Option<&Body>,
) -> Result<Request, Problem> {
    let names = option_names(parameters, body.is_some())?;
    let mut options = Vec::new();
    let mut http_parameters = Vec::new();
    for (parameter, option) in parameters.iter().zip(names) {
        let required = parameter.required || parameter.location == ParameterLocation::Path;
        let schema = match &parameter.schema_at {
            Some(at) => schemas.at(at)?,
            None => None,
        };
        options.push(OptionArg {
            name: option.clone(),
            short: None,
            description: parameter.description.clone(),
            schema,
            default: None,
            required,
        });
        http_parameters.push(HttpParameter {
            name: parameter.name.clone(),
            option,
            location: parameter.location,
            required,
        });
    }
    let http_body = match body {
        None => None,
        Some(body) => {
            options.push(OptionArg {
                name: BODY_OPTION.into(),
                short: None,
                description: body.description.clone(),
                schema: Some(schemas.at(&body.schema_at)?.unwrap_or_else(|| json!({}))),
                default: None,
                required: body.required,
            });
            Some(HttpBody {
                option: BODY_OPTION.into(),
                content_type: body.content_type.clone(),
                required: body.required,
            })
        }
    };
    Ok(Request {
        options,
        parameters: http_parameters,
        body: http_body,
    })
}

/// The operation's summary and description, cut to `max` bytes.
fn description(operation: &Operation, max: usize) -> String {
    let parts: Vec<&str> = [&operation.summary, &operation.description]
        .into_iter()
        .flatten()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .collect();
    cut_text(&parts.join("\n\n"), max).to_string()
}

/// Each parameter's option: its name, or `<name>-<location>` when an earlier parameter (or
/// the request body, `body`) has it.
fn option_names(parameters: &[&Parameter], body: bool) -> Result<Vec<String>, Problem> {
    let mut taken = BTreeSet::new();
    if body {
        taken.insert(BODY_OPTION.to_string());
    }
    let mut names = Vec::new();
    for parameter in parameters {
        let name = if taken.contains(&parameter.name) {
            format!("{}-{}", parameter.name, location_name(parameter.location))
        } else {
            parameter.name.clone()
        };
        if !toolgrid_core::source::valid_argument_name(&name) {
            return Err(Problem::request(format!(
                "the parameter `{}` cannot be an option name (letters, digits, '-' and '_')",
                cut_text(&parameter.name, 64)
            )));
        }
        if !taken.insert(name.clone()) {
            return Err(Problem::request(format!(
                "parameters `{}` collide as option `{name}`",
                parameter.name
            )));
        }
        names.push(name);
    }
    Ok(names)
}

/// Reads schemas out of the document with their `$ref`s inlined.
struct Schemas<'a> {
    raw: &'a Value,
    legacy: bool,
    max_bytes: usize,
    /// What is left of [`MAX_DOCUMENT_VALUES`].
    values_left: &'a Cell<usize>,
}

impl Schemas<'_> {
    /// The schema at the JSON pointer `at`, standing alone, if there is one.
    fn at(&self, at: &str) -> Result<Option<Value>, Problem> {
        let Some(schema) = self.raw.pointer(at) else {
            return Ok(None);
        };
        let allowed = self.max_bytes.min(self.values_left.get());
        let mut inliner = Inliner {
            raw: self.raw,
            legacy: self.legacy,
            budget: allowed,
            max_bytes: self.max_bytes,
            open: Vec::new(),
        };
        let inlined = inliner.inline(schema, 0);
        self.values_left
            .set(self.values_left.get() - (allowed - inliner.budget));
        match inlined {
            Err(problem)
                if problem.reason == LeftOutReason::TooLarge && allowed < self.max_bytes =>
            {
                Err(Problem::too_large(format!(
                    "the document's schemas add up to more than {MAX_DOCUMENT_VALUES} values \
                     inlined"
                )))
            }
            inlined => inlined.map(Some),
        }
    }
}

/// One schema's inlining: the `$ref`s open (to find cycles) and a budget of values (each
/// serializes to at least a byte, so a schema that would outgrow the size limit stops early
/// however its `$ref`s fan out).
struct Inliner<'a> {
    raw: &'a Value,
    legacy: bool,
    budget: usize,
    max_bytes: usize,
    open: Vec<String>,
}

/// Keywords whose values are data, not schemas: copied as they are.
const DATA_KEYWORDS: [&str; 5] = ["enum", "const", "default", "example", "examples"];

impl Inliner<'_> {
    fn inline(&mut self, value: &Value, depth: usize) -> Result<Value, Problem> {
        if depth > MAX_NESTING {
            return Err(Problem::schema(format!(
                "a schema nests more than {MAX_NESTING} deep"
            )));
        }
        self.budget = self.budget.checked_sub(1).ok_or_else(|| {
            Problem::too_large(format!(
                "a schema is larger than {} bytes with its $refs inlined",
                self.max_bytes
            ))
        })?;
        match value {
            Value::Array(items) => items
                .iter()
                .map(|item| self.inline(item, depth + 1))
                .collect::<Result<Vec<_>, _>>()
                .map(Value::Array),
            Value::Object(object) => {
                if let Some(Value::String(reference)) = object.get("$ref") {
                    return self.reference(reference, object, depth);
                }
                let mut out = Map::new();
                for (key, value) in object {
                    let value = if DATA_KEYWORDS.contains(&key.as_str()) {
                        value.clone()
                    } else {
                        self.inline(value, depth + 1)?
                    };
                    out.insert(key.clone(), value);
                }
                if self.legacy {
                    modernize(&mut out);
                }
                Ok(Value::Object(out))
            }
            other => Ok(other.clone()),
        }
    }

    /// The schema `reference` names, inlined, with the `$ref` object's other keywords
    /// (a 3.1 `description` beside a `$ref`) over it.
    fn reference(
        &mut self,
        reference: &str,
        object: &Map<String, Value>,
        depth: usize,
    ) -> Result<Value, Problem> {
        if self.open.iter().any(|open| open == reference) {
            return Err(Problem::schema(format!(
                "the schema `{reference}` contains itself"
            )));
        }
        if self.open.len() >= MAX_REF_DEPTH {
            return Err(Problem::schema(format!(
                "more than {MAX_REF_DEPTH} nested $refs"
            )));
        }
        let target = self
            .raw
            .pointer(ref_pointer(reference)?)
            .ok_or_else(|| Problem::schema(format!("`{reference}` leads nowhere")))?;
        self.open.push(reference.to_string());
        let resolved = self.inline(target, depth + 1);
        self.open.pop();
        let resolved = resolved?;
        let mut siblings = Map::new();
        for (key, value) in object.iter().filter(|(key, _)| *key != "$ref") {
            let value = if DATA_KEYWORDS.contains(&key.as_str()) {
                value.clone()
            } else {
                self.inline(value, depth + 1)?
            };
            siblings.insert(key.clone(), value);
        }
        if siblings.is_empty() {
            return Ok(resolved);
        }
        Ok(match resolved {
            Value::Object(mut resolved) => {
                resolved.extend(siblings);
                Value::Object(resolved)
            }
            other => {
                siblings.insert("allOf".into(), json!([other]));
                Value::Object(siblings)
            }
        })
    }
}

/// A 3.0 schema object in JSON Schema's terms: `nullable: true` as a `null` type, boolean
/// `exclusiveMaximum` / `exclusiveMinimum` as the bound itself.
fn modernize(schema: &mut Map<String, Value>) {
    match schema.get("nullable") {
        Some(Value::Bool(true)) => {
            if let Some(Value::String(kind)) = schema.get("type").cloned() {
                schema.insert("type".into(), json!([kind, "null"]));
                if let Some(Value::Array(values)) = schema.get_mut("enum")
                    && !values.contains(&Value::Null)
                {
                    values.push(Value::Null);
                }
                schema.remove("nullable");
            }
        }
        Some(Value::Bool(false)) => {
            schema.remove("nullable");
        }
        _ => {}
    }
    for (flag, bound) in [
        ("exclusiveMaximum", "maximum"),
        ("exclusiveMinimum", "minimum"),
    ] {
        match schema.get(flag) {
            Some(Value::Bool(true)) => match schema.remove(bound) {
                Some(bound) => {
                    schema.insert(flag.into(), bound);
                }
                None => {
                    schema.remove(flag);
                }
            },
            Some(Value::Bool(false)) => {
                schema.remove(flag);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(document: &str) -> SourceSnapshot {
        read_openapi(
            document.as_bytes(),
            "shop",
            &ToolFilter::default(),
            &BTreeMap::new(),
            &SourceLimits::default(),
        )
        .expect("reads")
    }

    const YAML_30: &str = "
openapi: 3.0.3
info: {title: t, version: '1'}
paths:
  /pets/{id}:
    get:
      operationId: getPet
      parameters:
        - {name: id, in: path, schema: {type: integer, minimum: 0, exclusiveMinimum: true}}
      responses:
        200:
          description: ok
          content:
            application/json:
              schema: {type: object, nullable: true}
";

    #[test]
    fn the_version_picks_the_model() {
        assert!(parse(YAML_30.as_bytes()).expect("3.0").legacy);
        // oas3 reads 3.1, where `exclusiveMinimum` is a number, never a boolean
        let v31 = YAML_30.replace("3.0.3", "3.1.0");
        assert!(matches!(
            parse(v31.as_bytes()).err(),
            Some(OpenApiError::Invalid { .. })
        ));
        let v31 = v31.replace("exclusiveMinimum: true", "exclusiveMinimum: 0");
        assert!(!parse(v31.as_bytes()).expect("3.1").legacy);
        // 3.1 schemas are JSON Schema already: nothing is rewritten
        let tool = &read(&v31).tools[0];
        assert_eq!(
            tool.command.options[0].schema,
            Some(json!({"type": "integer", "minimum": 0, "exclusiveMinimum": 0}))
        );
        assert_eq!(
            tool.command.result,
            Some(json!({"type": "object", "nullable": true}))
        );
    }

    #[test]
    fn yaml_with_numeric_status_keys_reads() {
        let snapshot = read(YAML_30);
        let tool = &snapshot.tools[0];
        assert_eq!(tool.name, "getPet");
        // 3.0's boolean exclusiveMinimum and nullable in JSON Schema's terms
        assert_eq!(
            tool.command.options[0].schema,
            Some(json!({"type": "integer", "exclusiveMinimum": 0}))
        );
        assert_eq!(
            tool.command.result,
            Some(json!({"type": ["object", "null"]}))
        );
    }

    #[test]
    fn a_document_has_a_budget_for_all_its_schemas() {
        let raw = json!({"s": {"type": "object", "properties": {"a": {"type": "string"}}}});
        let values_left = Cell::new(8);
        let schemas = Schemas {
            raw: &raw,
            legacy: false,
            max_bytes: 1000,
            values_left: &values_left,
        };
        assert_eq!(schemas.at("/s").expect("fits").as_ref(), raw.get("s"));
        assert_eq!(values_left.get(), 3);
        let problem = schemas.at("/s").expect_err("over the document's budget");
        assert_eq!(problem.reason, LeftOutReason::TooLarge);
        assert!(problem.message.contains("document"), "{}", problem.message);
        assert_eq!(schemas.at("/missing").expect("none"), None);
    }

    #[test]
    fn helpers() {
        assert!(is_version("3.0.3", "3.0"));
        assert!(is_version("3.0", "3.0"));
        assert!(!is_version("3.01", "3.0"));
        assert!(is_json("application/json; charset=utf-8"));
        assert!(is_json("application/vnd.api+json"));
        assert!(!is_json("application/xml"));
        assert!(!is_json("text/plain+json-ish"));
        assert_eq!(escape("/pet/{id}~x"), "~1pet~1{id}~0x");
        assert_eq!(success_rank("201"), Some(201));
        assert_eq!(success_rank("2xx"), Some(300));
        assert_eq!(success_rank("404"), None);
        assert_eq!(success_rank("default"), None);
        assert!(ref_pointer("other.yaml#/a").is_err());
        assert_eq!(
            ref_pointer("#/components/schemas/A").ok(),
            Some("/components/schemas/A")
        );
    }
}
