//! The HTTP front door: the same operations as gRPC, as JSON.
//!
//! - `POST /v1/namespaces/{ns}/tools/{tool}/{command}:call` with
//!   `{"args": {...}, "argv": [...], "stdin": "...", "idempotencyKey": "..."}` (or an
//!   `Idempotency-Key` header): the call record once it ends. 200 when it succeeded; a
//!   failed call comes with the status of its error kind (422 for a tool's own failure).
//!   A call that waits for approval is answered at once with 202 and state
//!   `awaiting-approval`.
//! - `GET /v1/calls/{id}` (`?wait=true` blocks until it ends, `?wait=SECONDS` at most that
//!   long), `GET /v1/calls/{id}/oplog` (in pages: `more`, `nextSeq`, `?fromSeq=`),
//!   `GET /v1/calls` (`?awaitingApproval=true`: the calls waiting that the caller may read
//!   or decide), `GET /v1/namespaces/{ns}/tools`, `GET /v1/why?agent=&tool=`.
//! - `GET /v1/tools?format=openai|anthropic|json-schema` (default `json-schema`;
//!   `&namespace=`, `&tool=A&tool=B` or `&tool=A,B`): the caller's callable commands as
//!   that model API's tool definitions (`{format, tools, names, notes}`, see
//!   [`toolgrid_catalog::model_formats`]); an unknown format or query parameter is
//!   `invalid-argument`, a tool the caller cannot see `unknown-tool`.
//! - `GET /v1/calls/{id}/result?page=N` (N from 0, default 0): page N of the call's
//!   result as `{"callId", "page", "pages", "text", "next"}` (see `docs/results.md`);
//!   `not-found` past the last page, for a call without a result or one the caller may not
//!   read; `invalid-argument` for a page that is not a number. `?view=model` on
//!   `POST ...:call` and `GET /v1/calls/{id}` adds `modelResult`: what a model-facing front
//!   door returns under the Tool's `resultPolicy`.
//! - `POST /v1/calls/{id}/approve`, `POST /v1/calls/{id}/deny` with `{"reason": "..."}`:
//!   the decided call. `POST /v1/calls/{id}/cancel`: the cancelled call (409
//!   `not-cancellable` when it has ended).
//! - The `:call` route with `Accept: text/event-stream` answers a stream of server-sent
//!   events (progress, then the call record; see [`super::sse`]).
//! - `/healthz`, `/readyz` (probes) and `/.well-known/jwks.json` (the public keys of
//!   identity tokens for upstreams, see [`crate::identity`]) are open; `/metrics`
//!   (aggregate counters, no call data) answers operators only ([`metrics`]); every `/v1`
//!   route authenticates first (`Authorization: Bearer TOKEN`, an operator may add
//!   `Toolgrid-As: AGENT`): 401 without a valid token.
//! - `/mcp`: the MCP server ([`super::mcp`]), with its protected-resource metadata at
//!   `/.well-known/oauth-protected-resource[/mcp]`.
//! - `/ui`: the console ([`super::console`]), authenticated by a session cookie.

use super::authn::{ACT_AS, AUTHORIZATION};
use super::convert::call_to_json;
use super::http_error::{HttpError, http_status};
use super::{Gateway, Invocation};
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use toolgrid_core::auth::Principal;
use toolgrid_core::error::{ApiError, ErrorKind};

/// The HTTP API over a gateway; `ready` says whether the platform takes calls yet.
pub fn router(gateway: Arc<Gateway>, ready: Arc<dyn Fn() -> bool + Send + Sync>) -> axum::Router {
    router_with(gateway, ready, super::mcp::McpConfig::default())
}

/// [`router`], with `/mcp` configured by `mcp`.
pub fn router_with(
    gateway: Arc<Gateway>,
    ready: Arc<dyn Fn() -> bool + Send + Sync>,
    mcp: super::mcp::McpConfig,
) -> axum::Router {
    let api = axum::Router::new()
        .route("/v1/namespaces/{ns}/tools/{tool}/{command}", post(call))
        .route("/v1/namespaces/{ns}/tools", get(list_tools))
        .route("/v1/tools", get(model_tools))
        .route("/v1/calls", get(list_calls))
        .route("/v1/calls/{id}", get(get_call))
        .route("/v1/calls/{id}/oplog", get(get_oplog))
        .route("/v1/calls/{id}/result", get(get_result_page))
        .route("/v1/calls/{id}/approve", post(approve))
        .route("/v1/calls/{id}/deny", post(deny))
        .route("/v1/calls/{id}/cancel", post(cancel))
        .route("/v1/why", get(why))
        .route("/v1/audit", get(list_audit))
        .route_layer(axum::middleware::from_fn_with_state(
            gateway.clone(),
            authenticate,
        ));
    axum::Router::new()
        .merge(api)
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route(crate::identity::JWKS_PATH, get(jwks))
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready() {
                        (StatusCode::OK, "ready")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                    }
                }
            }),
        )
        .with_state(gateway.clone())
        .merge(super::mcp::routes(gateway.clone(), mcp))
        .merge(super::console::routes(gateway))
}

/// `GET /.well-known/jwks.json`: the public keys identity tokens for upstreams are signed
/// with (see [`crate::identity`]), open to anyone; 404 when this platform signs none.
async fn jwks(State(gateway): State<Arc<Gateway>>) -> Response {
    let Some(keys) = gateway.identity() else {
        return HttpError(ApiError::new(
            ErrorKind::NotFound,
            "this platform signs no identity tokens",
        ))
        .into_response();
    };
    use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
    let max_age = crate::identity::JWKS_MAX_AGE.as_secs();
    (
        [
            (CONTENT_TYPE, "application/json".to_string()),
            (CACHE_CONTROL, format!("max-age={max_age}")),
        ],
        keys.jwks().to_string(),
    )
        .into_response()
}

/// `GET /metrics`: the Prometheus figures, for an operator's bearer token only (they name
/// every namespace's tools, agents and pools): 401 `unauthenticated` without a valid token,
/// 403 `permission-denied` for an agent's. `Toolgrid-As` is not honoured here.
async fn metrics(
    State(gateway): State<Arc<Gateway>>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Response {
    let authorization = headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok());
    let peer = super::authn::peer_of(&extensions);
    match gateway.authenticate(authorization, None, peer).await {
        Ok(Principal::Operator { .. }) => crate::metrics::global().encode().into_response(),
        Ok(Principal::Agent { agent }) => HttpError(ApiError::new(
            ErrorKind::PermissionDenied,
            format!("agent {agent} may not read /metrics: it is for operators"),
        ))
        .into_response(),
        Err(error) => HttpError(error).into_response(),
    }
}

/// Authenticates a `/v1` request and hands the [`Principal`] on in its extensions.
async fn authenticate(
    State(gateway): State<Arc<Gateway>>,
    mut request: axum::extract::Request,
    next: Next,
) -> Response {
    let header = |headers: &HeaderMap, name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let authorization = header(request.headers(), AUTHORIZATION);
    let act_as = header(request.headers(), ACT_AS);
    let peer = super::authn::peer_of(request.extensions());
    match gateway
        .authenticate(authorization.as_deref(), act_as.as_deref(), peer)
        .await
    {
        Ok(principal) => {
            request.extensions_mut().insert(principal);
            next.run(request).await
        }
        Err(error) => {
            super::http_error::before_body(HttpError(error).into_response(), request.version())
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct CallBody {
    #[serde(default)]
    args: Option<Value>,
    #[serde(default)]
    argv: Vec<String>,
    /// Text stdin.
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    /// A dry run: `read` commands run for real, others are answered without running.
    #[serde(default)]
    dry_run: bool,
}

fn failure_status(record: &toolgrid_store::CallRecord) -> StatusCode {
    match &record.error {
        None if record.state.is_terminal() => StatusCode::OK,
        // Still running when the wait ended.
        None => StatusCode::ACCEPTED,
        Some(error) => http_status(error.kind),
    }
}

async fn call(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path((ns, tool, command)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    JsonBody(body): JsonBody<CallBody>,
) -> Result<Response, HttpError> {
    let Some(command) = command.strip_suffix(":call") else {
        return Err(ApiError::new(
            ErrorKind::NotFound,
            format!("no route: use POST /v1/namespaces/{ns}/tools/{tool}/{command}:call"),
        )
        .into());
    };
    let header_key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let invocation = Invocation {
        namespace: ns,
        tool,
        command: Some(command.to_string()),
        argv: body.argv,
        args: body.args,
        stdin: body.stdin.map(String::into_bytes),
        idempotency_key: body.idempotency_key.or(header_key),
        dry_run: body.dry_run,
        from_program: false,
        traceparent: headers
            .get(toolgrid_trace::TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .map(String::from),
    };
    let model_view = wants_model_view(query.as_deref())?;
    if super::sse::wants_events(&headers) {
        let admitted = gateway.admit(&caller, invocation).await;
        return Ok(super::sse::call_events(gateway, admitted));
    }
    let admitted = gateway.invoke(&caller, invocation).await?;
    let status = failure_status(&admitted.record);
    let mut body = call_to_json(&admitted.record, admitted.deduplicated);
    if model_view {
        add_model_result(&gateway, &caller, &admitted.record, &mut body).await?;
    }
    let mut response = (status, Json(body)).into_response();
    if let Ok(id) = admitted.record.id.parse() {
        response.headers_mut().insert("toolgrid-call-id", id);
    }
    Ok(response)
}

#[derive(Deserialize)]
struct WaitQuery {
    /// `true` (until the call ends), or a number of seconds (a long poll).
    #[serde(default)]
    wait: Option<String>,
    /// `model`: add the model-facing result (`modelResult`).
    #[serde(default)]
    view: Option<String>,
}

/// The value of query parameter `name` in `query` (the last one, decoded).
fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .filter(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
        .last()
}

/// Whether `?view=` asks for the model-facing result.
fn wants_model_view(query: Option<&str>) -> Result<bool, ApiError> {
    view_is_model(query_param(query, "view").as_deref())
}

fn view_is_model(view: Option<&str>) -> Result<bool, ApiError> {
    match view {
        None | Some("") | Some("call") => Ok(false),
        Some("model") => Ok(true),
        Some(other) => Err(ApiError::new(
            ErrorKind::InvalidArgument,
            format!("view must be model or call, not {other:?}"),
        )),
    }
}

/// Adds `modelResult` (what a model-facing front door returns) to an ended call's JSON.
async fn add_model_result(
    gateway: &Gateway,
    caller: &Principal,
    record: &toolgrid_store::CallRecord,
    body: &mut Value,
) -> Result<(), ApiError> {
    if record.state != toolgrid_core::call::CallState::Succeeded {
        return Ok(());
    }
    let model = gateway.model_result(caller, record).await?;
    let mut out = json!({"text": model.text, "truncated": model.truncated});
    if let Some(structured) = model.structured {
        out["structured"] = structured;
    }
    if let Some(page) = model.page {
        out["page"] = json!({"page": page.page, "pages": page.pages, "next": page.next});
    }
    if let Some(file) = model.file {
        out["file"] = json!(file);
    }
    body["modelResult"] = out;
    Ok(())
}

/// `GET /v1/calls/{id}/result?page=N`: one page of a call's result.
async fn get_result_page(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, HttpError> {
    let page = match query_param(query.as_deref(), "page") {
        None => 0,
        Some(text) => text.parse::<u32>().map_err(|_| {
            ApiError::new(
                ErrorKind::InvalidArgument,
                format!("page must be a page number from 0, not {text:?}"),
            )
        })?,
    };
    let page = gateway.result_page(&caller, &id, page).await?;
    let next = (page.page + 1 < page.pages)
        .then(|| super::results::page_uri(&page.call_id, page.page + 1));
    Ok(Json(json!({
        "callId": page.call_id,
        "page": page.page,
        "pages": page.pages,
        "text": page.text,
        "next": next,
    })))
}

/// The longest a `GET /v1/calls/{id}?wait=...` blocks.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// How long `?wait=` asks to wait (`None`: not at all).
fn wait_of(value: Option<&str>) -> Result<Option<Option<Duration>>, ApiError> {
    match value {
        None | Some("") | Some("false") | Some("0") => Ok(None),
        Some("true") => Ok(Some(None)),
        Some(seconds) => seconds
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(|s| Some(Some(Duration::from_secs_f64(s.min(MAX_WAIT.as_secs_f64())))))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("wait must be true, false or a number of seconds, not {seconds:?}"),
                )
            }),
    }
}

async fn get_call(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    Query(query): Query<WaitQuery>,
) -> Result<Response, HttpError> {
    let mut record = gateway.get_call(&caller, &id).await?;
    if let Some(asked) = wait_of(query.wait.as_deref())?
        && !record.state.is_terminal()
    {
        let limit = gateway.wait_limit(&record).min(MAX_WAIT);
        let limit = asked.map_or(limit, |asked| asked.min(limit));
        record = gateway.wait(&id, limit).await?;
    }
    let mut body = call_to_json(&record, false);
    if view_is_model(query.view.as_deref())? {
        add_model_result(&gateway, &caller, &record, &mut body).await?;
    }
    Ok(Json(body).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DecisionBody {
    #[serde(default)]
    reason: String,
}

async fn decide(
    gateway: Arc<Gateway>,
    caller: Principal,
    id: String,
    approve: bool,
    body: DecisionBody,
) -> Result<Json<Value>, HttpError> {
    let record = gateway.decide(&caller, &id, approve, &body.reason).await?;
    Ok(Json(call_to_json(&record, false)))
}

/// Approves a call waiting for approval.
async fn approve(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<DecisionBody>,
) -> Result<Json<Value>, HttpError> {
    decide(gateway, caller, id, true, body).await
}

/// Denies a call waiting for approval.
async fn deny(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<DecisionBody>,
) -> Result<Json<Value>, HttpError> {
    decide(gateway, caller, id, false, body).await
}

/// Cancels a call (`POST /v1/calls/{id}/cancel`): the ended call, once its end is durable.
async fn cancel(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<Value>, HttpError> {
    let record = gateway.cancel(&caller, &id).await?;
    Ok(Json(call_to_json(&record, false)))
}

/// An optional JSON request body read as `T` (`T::default()` when there is none). A body
/// that is not JSON, or not a `T`, is refused as `invalid-argument` in the error envelope,
/// never with the framework's plain-text rejection.
struct JsonBody<T>(T);

impl<S, T> axum::extract::FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: serde::de::DeserializeOwned + Default,
{
    type Rejection = HttpError;

    async fn from_request(request: axum::extract::Request, state: &S) -> Result<Self, HttpError> {
        let invalid = |why: String| {
            HttpError(ApiError::new(
                ErrorKind::InvalidArgument,
                format!("request body: {why}"),
            ))
        };
        let body =
            <Json<Value> as axum::extract::OptionalFromRequest<S>>::from_request(request, state)
                .await
                .map_err(|rejection| invalid(rejection.body_text()))?;
        match body {
            None => Ok(JsonBody(T::default())),
            Some(Json(value)) => serde_json::from_value(value)
                .map(JsonBody)
                .map_err(|e| invalid(e.to_string())),
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct OplogQuery {
    #[serde(default)]
    from_seq: u64,
}

/// One page of a call's oplog (`?fromSeq=N` for the next, when `more` says there is one).
async fn get_oplog(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path(id): Path<String>,
    Query(query): Query<OplogQuery>,
) -> Result<Json<Value>, HttpError> {
    let (page, next) = gateway.oplog_page(&caller, &id, query.from_seq).await?;
    let entries: Vec<Value> = page
        .iter()
        .map(crate::gateway::convert::oplog_to_json)
        .collect();
    let mut body = json!({"callId": id, "entries": entries, "more": next.is_some()});
    if let Some(next) = next {
        body["nextSeq"] = json!(next);
    }
    Ok(Json(body))
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    tool: String,
    #[serde(default)]
    limit: u32,
    #[serde(default, rename = "awaitingApproval")]
    awaiting_approval: bool,
}

#[derive(Deserialize)]
struct AuditQuery {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    agent: String,
    #[serde(default)]
    tool: String,
    /// A duration back from now (`10m`), an RFC 3339 time or Unix milliseconds.
    #[serde(default)]
    since: String,
    #[serde(default)]
    limit: u32,
}

/// `GET /v1/audit`: audit records, newest first (operators only).
async fn list_audit(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<Value>, HttpError> {
    let since =
        toolgrid_core::middleware::audit::parse_since(&query.since, toolgrid_core::call::now_ms())
            .map_err(|message| ApiError::new(ErrorKind::InvalidArgument, message))?;
    let filter = super::audit::audit_filter(
        &query.namespace,
        &query.agent,
        &query.tool,
        since,
        query.limit,
    );
    let records = gateway.list_audit(&caller, filter).await?;
    Ok(Json(json!({ "records": records })))
}

async fn list_calls(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, HttpError> {
    let calls = if query.awaiting_approval {
        let mut waiting = gateway.awaiting_approval(&caller, &query.namespace).await?;
        waiting.retain(|r| query.tool.is_empty() || r.tool == query.tool);
        if query.limit > 0 {
            waiting.truncate(query.limit as usize);
        }
        waiting
    } else {
        gateway
            .list_calls(&caller, &query.namespace, &query.tool, query.limit)
            .await?
    };
    Ok(Json(
        json!({"calls": calls.iter().map(|c| call_to_json(c, false)).collect::<Vec<_>>()}),
    ))
}

async fn list_tools(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Path(ns): Path<String>,
) -> Json<Value> {
    let tools: Vec<Value> = gateway
        .list_tools(&caller, &ns)
        .into_iter()
        .map(|t| {
            json!({
                "name": t.name,
                "namespace": t.namespace,
                "description": t.description,
                "effect": t.effect,
                "release": t.release,
                "version": t.version,
                "commands": t.commands.iter().map(|c| json!({
                    "name": c.name,
                    "description": c.description,
                    "argsSchema": serde_json::from_str::<Value>(&c.args_schema_json).unwrap_or(Value::Null),
                    "stdinSchema": serde_json::from_str::<Value>(&c.stdin_schema_json).ok(),
                    "resultSchema": serde_json::from_str::<Value>(&c.result_schema_json).ok(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    Json(json!({"tools": tools}))
}

/// `GET /v1/tools?format=`: the caller's commands as model tool definitions. The query is
/// read by hand so that every refusal is in the error envelope.
async fn model_tools(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, HttpError> {
    let mut format = String::from("json-schema");
    let mut namespace = String::new();
    let mut tools = Vec::new();
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "format" => format = value.into_owned(),
            "namespace" => namespace = value.into_owned(),
            "tool" => tools.extend(
                value
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(str::to_string),
            ),
            other => {
                return Err(ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("unknown query parameter {other:?}: use format, namespace or tool"),
                )
                .into());
            }
        }
    }
    Ok(gateway
        .model_schemas(&caller, &namespace, &format, &tools)
        .map(Json)?)
}

#[derive(Deserialize)]
struct WhyQuery {
    #[serde(default)]
    agent: String,
    #[serde(default)]
    tool: String,
}

/// Which tools an agent may call, and why not the others.
async fn why(
    State(gateway): State<Arc<Gateway>>,
    Extension(caller): Extension<Principal>,
    Query(query): Query<WhyQuery>,
) -> Result<Json<Value>, HttpError> {
    let (agent, access) = gateway.why(&caller, &query.agent, &query.tool)?;
    let tools: Vec<Value> = access
        .into_iter()
        .map(|a| match a.verdict {
            Ok(allowed) => json!({
                "tool": a.tool,
                "allowed": true,
                "binding": allowed.binding.name,
                "release": allowed.release.name,
                "commands": allowed.commands,
            }),
            Err(refusal) => json!({
                "tool": a.tool,
                "allowed": false,
                "cause": refusal.cause(),
                "binding": refusal.binding(),
                "message": refusal.to_string(),
            }),
        })
        .collect();
    Ok(Json(
        json!({"namespace": agent.namespace, "agent": agent.name, "tools": tools}),
    ))
}
