//! The Streamable HTTP transport of `/mcp`: POST (one JSON-RPC message), GET (a legacy
//! session's stream of server notifications), DELETE (ends a legacy session), and the
//! open protected-resource metadata.
//!
//! Each POST is checked in order: `Origin` (403), bearer token (401), body size (413),
//! JSON-RPC framing (400), era and headers ([`super::era`]), then served. A `tools/call`
//! answers with an SSE stream: progress notifications, then the result. Closing that stream
//! cancels the call in the 2026-07-28 era; in a legacy session `notifications/cancelled`
//! does (a closed stream there is only a lost connection, as the 2025 revisions say).

use super::era::{self, Era, Headers};
use super::jsonrpc::{self, Id, Incoming, RpcError};
use super::sessions::{Sessions, request_key};
use super::tools as mcp_tools;
use super::{MAX_BODY_BYTES, MAX_STREAMS_PER_CALLER, McpConfig, NAMESPACE_HEADER, auth};
use crate::gateway::authn::{ACT_AS, AUTHORIZATION};
use crate::gateway::follow::{Follow, Step};
use crate::gateway::http_error::HttpError;
use crate::gateway::http_error::before_body;
use crate::gateway::{Gateway, Invocation, caller_name, results};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::hash::{Hash as _, Hasher as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use toolgrid_catalog::model_tools::{ModelTool, split_input, split_model_name};
use toolgrid_core::auth::Principal;
use toolgrid_core::call::TOOL_PROGRESS;
use toolgrid_core::error::{ApiError, ErrorKind};

/// How often an idle SSE stream carries a comment (so a closed one is noticed).
const KEEP_ALIVE: Duration = Duration::from_secs(1);
/// `ttlMs` of cacheable 2026-07-28 results: lists change with the catalog, so not long.
const TTL_MS: u64 = 5_000;

struct Mcp {
    gateway: Arc<Gateway>,
    config: McpConfig,
    sessions: Sessions,
    streams: Mutex<HashMap<String, usize>>,
}

/// One open SSE stream of a caller; dropping it frees the slot.
struct StreamSlot {
    mcp: Arc<Mcp>,
    caller: String,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut streams = self.mcp.streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = streams.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                streams.remove(&self.caller);
            }
        }
    }
}

impl Mcp {
    fn stream_slot(self: &Arc<Self>, caller: &Principal) -> Option<StreamSlot> {
        let name = caller_name(caller);
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let n = streams.entry(name.clone()).or_default();
        if *n >= MAX_STREAMS_PER_CALLER {
            return None;
        }
        *n += 1;
        Some(StreamSlot {
            mcp: self.clone(),
            caller: name,
        })
    }

    /// A fingerprint of what `caller` may call (for `notifications/tools/list_changed`).
    fn fingerprint(&self, caller: &Principal, namespace: &str) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        for tool in self.gateway.model_tools(caller, namespace) {
            mcp_tools::tool_json(&tool).to_string().hash(&mut hasher);
        }
        hasher.finish()
    }
}

pub fn routes(gateway: Arc<Gateway>, config: McpConfig) -> axum::Router {
    let mcp = Arc::new(Mcp {
        gateway: gateway.clone(),
        config,
        sessions: Sessions::default(),
        streams: Mutex::new(HashMap::new()),
    });
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(announce_changes(mcp.clone()));
    }
    axum::Router::new()
        .route(
            auth::MCP_PATH,
            get(get_stream).post(post).delete(delete_session),
        )
        .route(auth::METADATA_PATH, get(metadata))
        .route(
            &format!("{}{}", auth::METADATA_PATH, auth::MCP_PATH),
            get(metadata),
        )
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(mcp)
}

/// Sends `notifications/tools/list_changed` on the GET stream of each legacy session whose
/// owner's callable tools changed with a new catalog snapshot.
async fn announce_changes(mcp: Arc<Mcp>) {
    let mut snapshots = mcp.gateway.catalog.subscribe();
    while snapshots.changed().await.is_ok() {
        let streams = mcp.sessions.changed(|owner| mcp.fingerprint(owner, ""));
        for stream in streams {
            let _ = stream.try_send(jsonrpc::notification(
                "notifications/tools/list_changed",
                json!({}),
            ));
        }
    }
}

async fn metadata(State(mcp): State<Arc<Mcp>>, headers: HeaderMap) -> Response {
    axum::Json(auth::metadata(&mcp.config, &headers)).into_response()
}

/// A JSON-RPC error as an HTTP response.
fn rpc_error(status: u16, error: &RpcError, id: Option<&Id>) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(error.to_response(id))).into_response()
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// A header's values joined with `, ` (as HTTP combines repeated fields), so a repeated
/// MCP header can never pass for the body's value.
fn combined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .iter()
        .map(|v| v.to_str().unwrap_or("\u{fffd}"))
        .collect();
    (!values.is_empty()).then(|| values.join(", "))
}

#[derive(Deserialize, Default)]
struct McpQuery {
    #[serde(default)]
    namespace: String,
}

/// The checks before any message is read: the `Origin`, then the bearer token.
async fn admit_request(
    mcp: &Mcp,
    headers: &HeaderMap,
    peer: Option<std::net::IpAddr>,
) -> Result<Principal, Response> {
    let origin = header_str(headers, header::ORIGIN.as_str());
    if !auth::origin_allowed(&mcp.config, origin.as_deref()) {
        let error = RpcError::new(
            jsonrpc::INVALID_REQUEST,
            format!(
                "Forbidden: Origin {:?} is not allowed",
                origin.unwrap_or_default()
            ),
        );
        return Err(rpc_error(403, &error, None));
    }
    let authorization = header_str(headers, AUTHORIZATION);
    let act_as = header_str(headers, ACT_AS);
    match mcp
        .gateway
        .authenticate(authorization.as_deref(), act_as.as_deref(), peer)
        .await
    {
        Ok(principal) => Ok(principal),
        Err(error) => {
            let mut response = HttpError(error.clone()).into_response();
            if error.kind == ErrorKind::Unauthenticated
                && let Ok(value) = HeaderValue::from_str(&auth::challenge(
                    &mcp.config,
                    headers,
                    authorization.is_some(),
                ))
            {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, value);
            }
            Err(response)
        }
    }
}

/// Who is calling, in which era, for one message.
struct Ctx {
    mcp: Arc<Mcp>,
    caller: Principal,
    namespace: String,
    /// `None`: a 2026-07-28 request; else the legacy session's id and version.
    session: Option<(String, &'static str)>,
}

impl Ctx {
    fn modern(&self) -> bool {
        self.session.is_none()
    }

    /// A result, with what 2026-07-28 requires of results (`resultType`, and caching hints
    /// on cacheable ones).
    fn finish(&self, mut result: Value, cacheable: bool) -> Value {
        if self.modern()
            && let Some(obj) = result.as_object_mut()
        {
            obj.insert("resultType".into(), json!("complete"));
            if cacheable {
                obj.insert("ttlMs".into(), json!(TTL_MS));
                obj.insert("cacheScope".into(), json!("private"));
            }
        }
        result
    }

    fn capabilities(&self) -> Value {
        if self.modern() {
            json!({"tools": {}, "resources": {}})
        } else {
            json!({"tools": {"listChanged": true}, "resources": {}, "logging": {}})
        }
    }
}

fn server_info() -> Value {
    json!({"name": "toolgrid", "title": "toolgrid", "version": env!("CARGO_PKG_VERSION")})
}

const INSTRUCTIONS: &str = "Tools run by toolgrid: each call runs in a fresh sandbox and is \
recorded. A failed call answers isError with its error kind; a paged result names its next \
page as a resource.";

async fn post(
    State(mcp): State<Arc<Mcp>>,
    Query(query): Query<McpQuery>,
    version: axum::http::Version,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
    body: axum::body::Body,
) -> Response {
    let caller =
        match admit_request(&mcp, &headers, crate::gateway::authn::peer_of(&extensions)).await {
            Ok(caller) => caller,
            Err(response) => return before_body(response, version),
        };
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(_) => {
            let error = RpcError::new(
                jsonrpc::INVALID_REQUEST,
                format!("Request body too large: at most {MAX_BODY_BYTES} bytes"),
            );
            return before_body(rpc_error(413, &error, None), version);
        }
    };
    let message = match jsonrpc::parse(&body) {
        Ok(message) => message,
        Err(error) => return rpc_error(400, &error, None),
    };
    let request_id = match &message {
        Incoming::Request { id, .. } => Some(id.clone()),
        _ => None,
    };
    let mcp_headers = Headers {
        protocol_version: combined(&headers, era::HEADER_PROTOCOL_VERSION),
        method: combined(&headers, era::HEADER_METHOD),
        name: combined(&headers, era::HEADER_NAME),
        session: combined(&headers, era::HEADER_SESSION),
    };
    let era = match era::classify(&message, &mcp_headers) {
        Ok(era) => era,
        Err(refusal) => return rpc_error(refusal.status, &refusal.error, request_id.as_ref()),
    };
    let namespace = match &caller {
        Principal::Agent { .. } => String::new(),
        Principal::Operator { .. } => header_str(&headers, NAMESPACE_HEADER)
            .filter(|n| !n.is_empty())
            .unwrap_or(query.namespace),
    };
    let session = match &era {
        Era::Modern | Era::Initialize => None,
        Era::Session(id) => match mcp.sessions.touch(id, &caller) {
            Ok(version) => Some((id.clone(), version)),
            Err(e) => {
                let error = RpcError::new(jsonrpc::SESSION_NOT_FOUND, e.to_string());
                return rpc_error(404, &error, request_id.as_ref());
            }
        },
    };
    let ctx = Ctx {
        mcp: mcp.clone(),
        caller,
        namespace,
        session,
    };
    match (era, message) {
        (Era::Initialize, Incoming::Request { id, params, .. }) => initialize(ctx, id, params),
        (Era::Initialize, _) => rpc_error(
            400,
            &RpcError::new(
                jsonrpc::INVALID_REQUEST,
                "Invalid Request: initialize is a request",
            ),
            None,
        ),
        (_, Incoming::Notification { method, params }) => {
            notify(&ctx, &method, &params).await;
            StatusCode::ACCEPTED.into_response()
        }
        (_, Incoming::Response) => StatusCode::ACCEPTED.into_response(),
        (_, Incoming::Request { id, method, params }) => request(ctx, id, method, params).await,
    }
}

fn initialize(ctx: Ctx, id: Id, params: Map<String, Value>) -> Response {
    let version = era::negotiate_legacy(params.get("protocolVersion").and_then(Value::as_str));
    let fingerprint = ctx.mcp.fingerprint(&ctx.caller, &ctx.namespace);
    let session = ctx.mcp.sessions.open(&ctx.caller, version, fingerprint);
    let ctx = Ctx {
        session: Some((session.clone(), version)),
        ..ctx
    };
    let result = json!({
        "protocolVersion": version,
        "capabilities": ctx.capabilities(),
        "serverInfo": server_info(),
        "instructions": INSTRUCTIONS,
    });
    let mut response = axum::Json(jsonrpc::result(&id, result)).into_response();
    if let Ok(value) = HeaderValue::from_str(&session) {
        response.headers_mut().insert(era::HEADER_SESSION, value);
    }
    response
}

/// A client notification: `notifications/cancelled` in a legacy session cancels the call
/// its `requestId` names; the rest need nothing.
async fn notify(ctx: &Ctx, method: &str, params: &Map<String, Value>) {
    if method != "notifications/cancelled" {
        return;
    }
    let (Some((session, _)), Some(request)) = (&ctx.session, params.get("requestId")) else {
        return;
    };
    if let Some(call_id) = ctx.mcp.sessions.cancel(session, &request_key(request)) {
        cancel_call(&ctx.mcp.gateway, &ctx.caller, &call_id).await;
    }
}

async fn cancel_call(gateway: &Gateway, caller: &Principal, call_id: &str) {
    if let Err(error) = gateway.cancel(caller, call_id).await {
        tracing::debug!(call = call_id, kind = %error.kind, "MCP cancel: {}", error.message);
    }
}

async fn request(ctx: Ctx, id: Id, method: String, params: Map<String, Value>) -> Response {
    let answer = match method.as_str() {
        "tools/call" => return call_tool(ctx, id, params),
        "server/discover" => Ok(ctx.finish(
            json!({
                "supportedVersions": era::supported_versions(),
                "capabilities": ctx.capabilities(),
                "_meta": {era::META_SERVER_INFO: server_info()},
                "instructions": INSTRUCTIONS,
            }),
            true,
        )),
        "ping" => Ok(ctx.finish(json!({}), false)),
        "logging/setLevel" if !ctx.modern() => Ok(json!({})),
        "tools/list" => list_tools(&ctx, &params).map(|r| ctx.finish(r, true)),
        "resources/list" => Ok(ctx.finish(json!({"resources": []}), true)),
        "resources/templates/list" => Ok(ctx.finish(json!({"resourceTemplates": []}), true)),
        "resources/read" => read_resource(&ctx, &params)
            .await
            .map(|r| ctx.finish(r, true)),
        _ => {
            let error = RpcError::new(
                jsonrpc::METHOD_NOT_FOUND,
                format!("Method not found: {method}"),
            );
            // 2026-07-28: an unknown method is a 404 with the JSON-RPC error.
            let status = if ctx.modern() { 404 } else { 200 };
            return rpc_error(status, &error, Some(&id));
        }
    };
    match answer {
        Ok(result) => axum::Json(jsonrpc::result(&id, result)).into_response(),
        Err(error) => rpc_error(200, &error, Some(&id)),
    }
}

fn list_tools(ctx: &Ctx, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let offset = mcp_tools::parse_cursor(params.get("cursor"))?;
    let tools = ctx.mcp.gateway.model_tools(&ctx.caller, &ctx.namespace);
    let (page, next) = mcp_tools::page(&tools, offset)?;
    let mut result = json!({"tools": page});
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    }
    Ok(result)
}

async fn read_resource(ctx: &Ctx, params: &Map<String, Value>) -> Result<Value, RpcError> {
    let uri = params
        .get("uri")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let not_found = || {
        let code = if ctx.modern() {
            jsonrpc::INVALID_PARAMS
        } else {
            jsonrpc::RESOURCE_NOT_FOUND
        };
        RpcError::new(code, format!("Resource not found: {uri}")).with_data(json!({"uri": uri}))
    };
    let (call_id, page) = results::parse_page_uri(uri).ok_or_else(not_found)?;
    let page = ctx
        .mcp
        .gateway
        .result_page(&ctx.caller, call_id, page)
        .await
        .map_err(|_| not_found())?;
    let mut meta = json!({"toolgrid.dev/page": page.page, "toolgrid.dev/pages": page.pages});
    if page.page + 1 < page.pages {
        meta["toolgrid.dev/next"] = json!(results::page_uri(&page.call_id, page.page + 1));
    }
    Ok(json!({
        "contents": [{"uri": uri, "mimeType": "application/json", "text": page.text}],
        "_meta": meta,
    }))
}

/// What a `tools/call` resolves to before it runs.
struct Resolved {
    tool: ModelTool,
    invocation: Invocation,
}

fn resolve_call(ctx: &Ctx, params: &Map<String, Value>) -> Result<Resolved, RpcError> {
    let invalid = |m: String| RpcError::new(jsonrpc::INVALID_PARAMS, m);
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("Invalid params: name must be a string".into()))?;
    let (tool_name, command) = split_model_name(name);
    let tool = ctx
        .mcp
        .gateway
        .model_tools(&ctx.caller, &ctx.namespace)
        .into_iter()
        .find(|t| t.name == name && t.tool == tool_name && command.is_none_or(|c| c == t.command))
        .ok_or_else(|| invalid(format!("Unknown tool: {name}")))?;
    let arguments = match params.get("arguments") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(args)) => args.clone(),
        Some(_) => {
            return Err(invalid(
                "Invalid params: arguments must be an object".into(),
            ));
        }
    };
    let meta = params.get("_meta");
    let idempotency_key = meta
        .and_then(|m| m.get(mcp_tools::META_IDEMPOTENCY_KEY))
        .and_then(Value::as_str)
        .map(str::to_string);
    let (args, stdin) = split_input(&tool, arguments);
    let invocation = Invocation {
        namespace: ctx.namespace.clone(),
        tool: tool.tool.clone(),
        command: Some(tool.command.clone()),
        argv: Vec::new(),
        args: Some(Value::Object(args)),
        stdin,
        idempotency_key,
        dry_run: false,
        from_program: false,
        // The trace context a client puts in `_meta` (as MCP's tracing convention does).
        traceparent: meta
            .and_then(|m| m.get(toolgrid_trace::TRACEPARENT))
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    Ok(Resolved { tool, invocation })
}

/// Whether an admission refusal is the request's fault (a JSON-RPC error) rather than a
/// refusal of the call (an `isError` result).
fn is_request_error(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::InvalidArgument | ErrorKind::UnknownTool | ErrorKind::UnknownCommand
    )
}

fn call_tool(ctx: Ctx, id: Id, params: Map<String, Value>) -> Response {
    let resolved = match resolve_call(&ctx, &params) {
        Ok(resolved) => resolved,
        Err(error) => return rpc_error(200, &error, Some(&id)),
    };
    let Some(slot) = ctx.mcp.stream_slot(&ctx.caller) else {
        let error = RpcError::new(
            jsonrpc::INVALID_REQUEST,
            format!("Too many open streams: at most {MAX_STREAMS_PER_CALLER} per caller"),
        )
        .with_data(json!({"kind": ErrorKind::RateLimited.as_str()}));
        return rpc_error(429, &error, Some(&id));
    };
    let progress_token = params
        .get("_meta")
        .and_then(|m| m.get("progressToken"))
        .filter(|t| t.is_string() || t.is_i64() || t.is_u64())
        .cloned();
    let (tx, rx) = mpsc::channel::<Value>(64);
    tokio::spawn(run_call(ctx, id, resolved, progress_token, tx));
    let events = futures::stream::unfold((rx, slot), |(mut rx, slot)| async move {
        let message = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(Event::default().data(message.to_string())),
            (rx, slot),
        ))
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response();
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Runs an admitted call to its end, sending progress and then the response on `tx`.
async fn run_call(
    ctx: Ctx,
    id: Id,
    resolved: Resolved,
    progress_token: Option<Value>,
    tx: mpsc::Sender<Value>,
) {
    let key = request_key(&id);
    let outcome = drive_call(&ctx, &key, &resolved, progress_token, &tx).await;
    if let Some((session, _)) = &ctx.session {
        let cancelled = ctx.mcp.sessions.is_cancelled(session, &key);
        ctx.mcp.sessions.finished(session, &key);
        if cancelled {
            // A cancelled request gets no response.
            return;
        }
    }
    let message = match outcome {
        Some(Ok(result)) => jsonrpc::result(&id, ctx.finish(result, false)),
        Some(Err(error)) => error.to_response(Some(&id)),
        None => return,
    };
    let _ = tx.send(message).await;
}

/// The call's `CallToolResult` (or JSON-RPC error); `None` when the stream closed first
/// (the call was then cancelled, in the 2026-07-28 era).
async fn drive_call(
    ctx: &Ctx,
    key: &str,
    resolved: &Resolved,
    progress_token: Option<Value>,
    tx: &mpsc::Sender<Value>,
) -> Option<Result<Value, RpcError>> {
    let gateway = &ctx.mcp.gateway;
    let admitted = match gateway
        .admit(&ctx.caller, resolved.invocation.clone())
        .await
    {
        Ok(admitted) => admitted,
        Err(error) => return Some(refusal(error)),
    };
    let call_id = admitted.record.id.clone();
    if let Some((session, _)) = &ctx.session
        && ctx.mcp.sessions.started(session, key, &call_id)
    {
        cancel_call(gateway, &ctx.caller, &call_id).await;
    }
    let mut record = admitted.record;
    if record.state == toolgrid_core::call::CallState::AwaitingApproval {
        return Some(Ok(mcp_tools::error_result(
            "awaiting-approval",
            "",
            &format!(
                "the call waits for approval; its id is {call_id} (GET /v1/calls/{call_id}?wait=true)"
            ),
            Some(&call_id),
        )));
    }
    if !record.state.is_terminal() {
        let mut follow = Follow::new(gateway, &record, admitted.updates);
        let mut reported = 0usize;
        loop {
            tokio::select! {
                step = follow.next(gateway) => match step {
                    Step::Progress(news) => {
                        let Some(token) = &progress_token else { continue };
                        for report in news.iter().filter(|p| p.stage == TOOL_PROGRESS) {
                            reported += 1;
                            let note = jsonrpc::notification(
                                "notifications/progress",
                                json!({"progressToken": token, "progress": reported, "message": report.message}),
                            );
                            if tx.send(note).await.is_err() {
                                break;
                            }
                        }
                    }
                    Step::Ended(ended) => match *ended {
                        Ok(now) => {
                            record = now;
                            break;
                        }
                        Err(error) => return Some(refusal(error)),
                    },
                },
                () = tx.closed() => {
                    if ctx.modern() {
                        cancel_call(gateway, &ctx.caller, &call_id).await;
                    }
                    return None;
                }
            }
        }
    }
    if let Some(error) = &record.error {
        return Some(Ok(mcp_tools::error_result(
            error.kind.as_str(),
            &error.name,
            &error.message,
            Some(&call_id),
        )));
    }
    if !record.state.is_terminal() {
        return Some(Ok(mcp_tools::error_result(
            ErrorKind::Timeout.as_str(),
            "",
            &format!("the call has not ended yet; its id is {call_id}"),
            Some(&call_id),
        )));
    }
    match gateway.model_result(&ctx.caller, &record).await {
        Ok(shaped) => Some(Ok(mcp_tools::success_result(
            &resolved.tool,
            shaped,
            &call_id,
        ))),
        Err(error) => Some(refusal(error)),
    }
}

/// An admission refusal: invalid arguments and unknown tools are JSON-RPC errors; a refusal
/// of the call (permissions, middleware, limits) is an `isError` result.
fn refusal(error: ApiError) -> Result<Value, RpcError> {
    if is_request_error(error.kind) {
        Err(RpcError::new(
            jsonrpc::INVALID_PARAMS,
            format!("Invalid params: {}", error.message),
        )
        .with_data(json!({"kind": error.kind.as_str()})))
    } else {
        Ok(mcp_tools::error_result(
            error.kind.as_str(),
            "",
            &error.message,
            None,
        ))
    }
}

/// A legacy session's stream of server notifications (`tools/list_changed`).
async fn get_stream(
    State(mcp): State<Arc<Mcp>>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Response {
    let caller =
        match admit_request(&mcp, &headers, crate::gateway::authn::peer_of(&extensions)).await {
            Ok(caller) => caller,
            Err(response) => return response,
        };
    let Some(session) = header_str(&headers, era::HEADER_SESSION) else {
        let error = RpcError::new(
            jsonrpc::INVALID_REQUEST,
            "Method Not Allowed: GET needs the Mcp-Session-Id of a legacy session",
        );
        let mut response = rpc_error(405, &error, None);
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST, DELETE"));
        return response;
    };
    if let Err(e) = mcp.sessions.touch(&session, &caller) {
        return rpc_error(
            404,
            &RpcError::new(jsonrpc::SESSION_NOT_FOUND, e.to_string()),
            None,
        );
    }
    let Some(slot) = mcp.stream_slot(&caller) else {
        let error = RpcError::new(
            jsonrpc::INVALID_REQUEST,
            format!("Too many open streams: at most {MAX_STREAMS_PER_CALLER} per caller"),
        );
        return rpc_error(429, &error, None);
    };
    let (tx, rx) = mpsc::channel::<Value>(16);
    mcp.sessions.listen(&session, tx);
    let events = futures::stream::unfold((rx, slot), |(mut rx, slot)| async move {
        let message = rx.recv().await?;
        Some((
            Ok::<_, std::convert::Infallible>(Event::default().data(message.to_string())),
            (rx, slot),
        ))
    });
    let mut response = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    response
}

/// Ends a legacy session.
async fn delete_session(
    State(mcp): State<Arc<Mcp>>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Response {
    let caller =
        match admit_request(&mcp, &headers, crate::gateway::authn::peer_of(&extensions)).await {
            Ok(caller) => caller,
            Err(response) => return response,
        };
    let Some(session) = header_str(&headers, era::HEADER_SESSION) else {
        let error = RpcError::new(
            jsonrpc::INVALID_REQUEST,
            "Method Not Allowed: DELETE needs the Mcp-Session-Id of a legacy session",
        );
        return rpc_error(405, &error, None);
    };
    match mcp.sessions.close(&session, &caller) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => rpc_error(
            404,
            &RpcError::new(jsonrpc::SESSION_NOT_FOUND, e.to_string()),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_refuses_the_call_as_an_is_error_result_naming_its_kind() {
        let full = ApiError::new(
            ErrorKind::QueueFull,
            "agent default/alice has 4 calls waiting",
        )
        .with_retry_after(1000);
        let result = refusal(full).expect("a refusal of the call, not a JSON-RPC error");
        assert_eq!(result["isError"], true);
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.starts_with("queue-full: "), "{text}");
        let bad = refusal(ApiError::new(ErrorKind::InvalidArgument, "no such option"));
        assert!(bad.is_err(), "a bad request stays a JSON-RPC error");
    }
}
