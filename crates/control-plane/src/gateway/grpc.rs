//! The gRPC `Tools` service, behind [`AuthenticatedTools`]: every RPC is authenticated
//! before it reaches the service, which reads the caller from the request's extensions.

use super::authn::{ACT_AS, AUTHORIZATION};
use super::{Gateway, Invocation};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use toolgrid_core::auth::Principal;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_proto::call_to_proto;
use toolgrid_proto::status::status_of;
use toolgrid_proto::{self as proto, tools_server::Tools};

/// Wraps the `Tools` server: authenticates each request (`authorization`, `toolgrid-as`
/// metadata) and hands the [`Principal`] to the service in the request's extensions; an
/// unauthenticated request is answered `UNAUTHENTICATED` without reaching it.
#[derive(Clone)]
pub struct AuthenticatedTools<S> {
    inner: S,
    gateway: Arc<Gateway>,
}

impl<S> AuthenticatedTools<S> {
    pub fn new(inner: S, gateway: Arc<Gateway>) -> Self {
        AuthenticatedTools { inner, gateway }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for AuthenticatedTools<S> {
    const NAME: &'static str = S::NAME;
}

type Body = tonic::body::Body;

impl<S> tower::Service<http::Request<Body>> for AuthenticatedTools<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        // The clone that was made ready is the one that serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let gateway = self.gateway.clone();
        Box::pin(async move {
            let header = |headers: &http::HeaderMap, name: &str| {
                headers.get(name).map(|v| v.to_str().map(str::to_string))
            };
            let found = (
                header(request.headers(), AUTHORIZATION),
                header(request.headers(), ACT_AS),
            );
            let (authorization, act_as) = match found {
                (Some(Err(_)), _) | (_, Some(Err(_))) => {
                    let status = status_of(ApiError::new(
                        ErrorKind::Unauthenticated,
                        "the authorization metadata is not text",
                    ));
                    return Ok(status.into_http());
                }
                (a, b) => (a.and_then(Result::ok), b.and_then(Result::ok)),
            };
            let peer = peer_of(request.extensions());
            let started = std::time::Instant::now();
            match gateway
                .authenticate(authorization.as_deref(), act_as.as_deref(), peer)
                .await
            {
                Ok(principal) => {
                    crate::metrics::stage(crate::metrics::Stage::Authenticate, started.elapsed());
                    request.extensions_mut().insert(principal);
                    inner.call(request).await
                }
                Err(error) => Ok(status_of(error).into_http()),
            }
        })
    }
}

/// The client's address of a gRPC request (as `tonic::Request::remote_addr` reads it).
fn peer_of(extensions: &http::Extensions) -> Option<std::net::IpAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            extensions
                .get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|info| info.get_ref().remote_addr())
        })
        .map(|addr| addr.ip())
}

/// The caller [`AuthenticatedTools`] put in the request.
fn caller<T>(request: &Request<T>) -> Result<Principal, Status> {
    request
        .extensions()
        .get::<Principal>()
        .cloned()
        .ok_or_else(|| {
            status_of(ApiError::new(
                ErrorKind::Unauthenticated,
                "the request was not authenticated",
            ))
        })
}

/// The longest `GetCall` with `wait` blocks.
const MAX_WAIT: Duration = Duration::from_secs(600);

pub struct ToolsService {
    gateway: Arc<Gateway>,
}

impl ToolsService {
    pub fn new(gateway: Arc<Gateway>) -> Self {
        ToolsService { gateway }
    }
}

/// The call a request asks for, with the caller's trace context from its `traceparent`
/// metadata.
fn invocation(request: Request<proto::InvokeRequest>) -> Result<Invocation, ApiError> {
    let traceparent = request
        .metadata()
        .get(toolgrid_trace::TRACEPARENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let request = request.into_inner();
    let args = if request.args_json.trim().is_empty() {
        None
    } else {
        Some(serde_json::from_str(&request.args_json).map_err(|e| {
            ApiError::new(
                ErrorKind::InvalidArgument,
                format!("args_json is not JSON: {e}"),
            )
        })?)
    };
    Ok(Invocation {
        namespace: request.namespace,
        tool: request.tool,
        command: Some(request.command).filter(|c| !c.is_empty()),
        argv: request.argv,
        args,
        stdin: request.stdin,
        idempotency_key: Some(request.idempotency_key).filter(|k| !k.is_empty()),
        dry_run: request.dry_run,
        from_program: false,
        traceparent,
    })
}

type InvokeStream = Pin<Box<dyn Stream<Item = Result<proto::InvokeEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Tools for ToolsService {
    type InvokeStreamStream = InvokeStream;

    async fn list_tools(
        &self,
        request: Request<proto::ListToolsRequest>,
    ) -> Result<Response<proto::ListToolsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        if !request.format.is_empty() {
            let rendered = self
                .gateway
                .model_schemas(&caller, &request.namespace, &request.format, &request.tools)
                .map_err(status_of)?;
            return Ok(Response::new(proto::ListToolsResponse {
                tools: Vec::new(),
                model_tools_json: rendered.to_string(),
            }));
        }
        let mut tools = self.gateway.list_tools(&caller, &request.namespace);
        if !request.tools.is_empty() {
            for name in &request.tools {
                if !tools.iter().any(|t| &t.name == name) {
                    return Err(status_of(ApiError::new(
                        ErrorKind::UnknownTool,
                        format!("no tool {name:?} that you may call in this namespace"),
                    )));
                }
            }
            tools.retain(|t| request.tools.contains(&t.name));
        }
        Ok(Response::new(proto::ListToolsResponse {
            tools,
            model_tools_json: String::new(),
        }))
    }

    async fn invoke(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        let caller = caller(&request)?;
        let admitted = self
            .gateway
            .invoke(&caller, invocation(request).map_err(status_of)?)
            .await
            .map_err(status_of)?;
        Ok(Response::new(call_to_proto(
            &admitted.record,
            admitted.deduplicated,
        )))
    }

    async fn invoke_stream(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<InvokeStream>, Status> {
        let caller = caller(&request)?;
        let admitted = self
            .gateway
            .admit(&caller, invocation(request).map_err(status_of)?)
            .await
            .map_err(status_of)?;
        let gateway = self.gateway.clone();
        let stream = async_stream(gateway, admitted);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_call(
        &self,
        request: Request<proto::GetCallRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let record = if request.id.is_empty() {
            if request.idempotency_key.is_empty() {
                return Err(status_of(ApiError::new(
                    ErrorKind::InvalidArgument,
                    "give a call id or an idempotency key",
                )));
            }
            self.gateway
                .find_call(&caller, &request.namespace, &request.idempotency_key)
                .await
                .map_err(status_of)?
        } else {
            self.gateway
                .get_call(&caller, &request.id)
                .await
                .map_err(status_of)?
        };
        let record = if request.wait && !record.state.is_terminal() {
            let limit = self.gateway.wait_limit(&record).min(MAX_WAIT);
            self.gateway
                .wait(&record.id, limit)
                .await
                .map_err(status_of)?
        } else {
            record
        };
        Ok(Response::new(call_to_proto(&record, false)))
    }

    async fn list_calls(
        &self,
        request: Request<proto::ListCallsRequest>,
    ) -> Result<Response<proto::ListCallsResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let records = if request.awaiting_approval {
            // Also the calls the caller may decide (an approver's), oldest first.
            let mut waiting = self
                .gateway
                .awaiting_approval(&caller, &request.namespace)
                .await
                .map_err(status_of)?;
            waiting.retain(|r| request.tool.is_empty() || r.tool == request.tool);
            if request.limit > 0 {
                waiting.truncate(request.limit as usize);
            }
            waiting
        } else {
            self.gateway
                .list_calls(&caller, &request.namespace, &request.tool, request.limit)
                .await
                .map_err(status_of)?
        };
        let calls = records.iter().map(|r| call_to_proto(r, false)).collect();
        Ok(Response::new(proto::ListCallsResponse { calls }))
    }

    async fn get_oplog(
        &self,
        request: Request<proto::GetOplogRequest>,
    ) -> Result<Response<proto::GetOplogResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let call_id = request.call_id;
        let (page, next) = self
            .gateway
            .oplog_page(&caller, &call_id, request.from_seq)
            .await
            .map_err(status_of)?;
        let entries = page.iter().map(proto::OplogRecord::from).collect();
        Ok(Response::new(proto::GetOplogResponse {
            call_id,
            entries,
            more: next.is_some(),
            next_seq: next.unwrap_or_default(),
        }))
    }

    async fn list_resources(
        &self,
        request: Request<proto::ListResourcesRequest>,
    ) -> Result<Response<proto::ListResourcesResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let rows = self
            .gateway
            .list_resources(&caller, &request.kind, &request.namespace)
            .map_err(status_of)?;
        Ok(Response::new(proto::ListResourcesResponse { rows }))
    }

    async fn refresh_source(
        &self,
        request: Request<proto::RefreshSourceRequest>,
    ) -> Result<Response<proto::RefreshSourceResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let report = self
            .gateway
            .refresh_source(&caller, &request.namespace, &request.name)
            .await
            .map_err(status_of)?;
        Ok(Response::new(proto::RefreshSourceResponse {
            ready: if report.ready { "True" } else { "False" }.into(),
            reason: report.reason,
            message: report.message,
            added: report.diff.added,
            removed: report.diff.removed,
            changed: report.diff.changed,
            tools: report.tools,
            refresh_error: report.refresh_error.unwrap_or_default(),
        }))
    }

    async fn drain_worker(
        &self,
        request: Request<proto::DrainWorkerRequest>,
    ) -> Result<Response<proto::DrainWorkerResponse>, Status> {
        let caller = caller(&request)?;
        let busy = self
            .gateway
            .drain_worker(&caller, &request.into_inner().worker)
            .map_err(status_of)?;
        Ok(Response::new(proto::DrainWorkerResponse { busy }))
    }

    async fn rollout(
        &self,
        request: Request<proto::RolloutRequest>,
    ) -> Result<Response<proto::RolloutResponse>, Status> {
        use toolgrid_core::rollout::Order;
        let caller = caller(&request)?;
        let request = request.into_inner();
        let order = match proto::RolloutAction::try_from(request.action) {
            Ok(proto::RolloutAction::Status) => None,
            Ok(proto::RolloutAction::Promote) => Some(Order::Promote { full: false }),
            Ok(proto::RolloutAction::PromoteFull) => Some(Order::Promote { full: true }),
            Ok(proto::RolloutAction::Abort) => Some(Order::Abort),
            Err(_) => {
                return Err(status_of(ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("rollout action {} is not known", request.action),
                )));
            }
        };
        let namespace = if request.namespace.is_empty() {
            "default"
        } else {
            &request.namespace
        };
        let binding = (!request.binding.is_empty()).then_some(request.binding.as_str());
        let live = self
            .gateway
            .rollout(&caller, namespace, &request.tool, binding, order)
            .await
            .map_err(status_of)?;
        Ok(Response::new(proto::RolloutResponse {
            rollouts: live
                .into_iter()
                .map(|l| {
                    let p = &l.record.progress;
                    proto::RolloutRow {
                        namespace: l.binding.namespace.clone(),
                        binding: l.binding.name.clone(),
                        stable: l.stable.clone(),
                        canary: l.record.canary.clone(),
                        weight: u32::from(l.weight),
                        phase: p.phase.to_string(),
                        step: l.step,
                        steps: l.steps.iter().map(|&w| u32::from(w)).collect(),
                        message: p.message.clone(),
                        stable_calls: l.stable_now.calls,
                        stable_errors: l.stable_now.errors,
                        canary_calls: l.canary_now.calls,
                        canary_errors: l.canary_now.errors,
                        step_started_ms: p.step_started_ms,
                    }
                })
                .collect(),
        }))
    }

    async fn cancel(
        &self,
        request: Request<proto::CancelRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        let caller = caller(&request)?;
        let record = self
            .gateway
            .cancel(&caller, &request.into_inner().call_id)
            .await
            .map_err(status_of)?;
        Ok(Response::new(call_to_proto(&record, false)))
    }

    async fn approve(
        &self,
        request: Request<proto::DecisionRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let record = self
            .gateway
            .decide(&caller, &request.call_id, true, &request.reason)
            .await
            .map_err(status_of)?;
        Ok(Response::new(call_to_proto(&record, false)))
    }

    async fn deny(
        &self,
        request: Request<proto::DecisionRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let record = self
            .gateway
            .decide(&caller, &request.call_id, false, &request.reason)
            .await
            .map_err(status_of)?;
        Ok(Response::new(call_to_proto(&record, false)))
    }

    async fn list_audit(
        &self,
        request: Request<proto::ListAuditRequest>,
    ) -> Result<Response<proto::ListAuditResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let filter = super::audit::audit_filter(
            &request.namespace,
            &request.agent,
            &request.tool,
            (request.since_ms != 0).then_some(request.since_ms),
            request.limit,
        );
        let records = self
            .gateway
            .list_audit(&caller, filter)
            .await
            .map_err(status_of)?;
        Ok(Response::new(proto::ListAuditResponse {
            records_json: records
                .iter()
                .filter_map(|r| serde_json::to_string(r).ok())
                .collect(),
        }))
    }

    async fn why(
        &self,
        request: Request<proto::WhyRequest>,
    ) -> Result<Response<proto::WhyResponse>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let (agent, access) = self
            .gateway
            .why(&caller, &request.agent, &request.tool)
            .map_err(status_of)?;
        Ok(Response::new(proto::WhyResponse {
            namespace: agent.namespace,
            agent: agent.name,
            tools: access.into_iter().map(tool_access_to_proto).collect(),
        }))
    }
}

fn tool_access_to_proto(access: super::authz::ToolAccess) -> proto::ToolAccess {
    match access.verdict {
        Ok(allowed) => proto::ToolAccess {
            tool: access.tool,
            allowed: true,
            binding: allowed.binding.name,
            release: allowed.release.name,
            commands: allowed.commands,
            ..Default::default()
        },
        Err(refusal) => proto::ToolAccess {
            tool: access.tool,
            allowed: false,
            binding: refusal.binding().unwrap_or_default().to_string(),
            cause: refusal.cause().into(),
            reason: match &refusal {
                super::authz::Refusal::BindingNotReady { reason, .. } => reason.to_string(),
                super::authz::Refusal::ReleaseRange { .. } => {
                    toolgrid_api::conditions::Reason::NoMatchingRelease.to_string()
                }
                _ => String::new(),
            },
            message: refusal.to_string(),
            ..Default::default()
        },
    }
}

/// Progress then the final call record.
fn async_stream(
    gateway: Arc<Gateway>,
    admitted: super::Admitted,
) -> impl Stream<Item = Result<proto::InvokeEvent, Status>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let record = admitted.record;
        // A call that waits for approval comes back at once; the caller asks again later.
        if record.state == toolgrid_core::call::CallState::AwaitingApproval {
            let event = proto::InvokeEvent {
                event: Some(proto::invoke_event::Event::Call(call_to_proto(
                    &record,
                    admitted.deduplicated,
                ))),
            };
            let _ = tx.send(Ok(event)).await;
            return;
        }
        let progress =
            |stage: &str, worker: String, epoch: u64, message: String| proto::InvokeEvent {
                event: Some(proto::invoke_event::Event::Progress(proto::Progress {
                    call_id: record.id.clone(),
                    stage: stage.into(),
                    message,
                    worker,
                    epoch,
                })),
            };
        if tx
            .send(Ok(progress("accepted", String::new(), 0, String::new())))
            .await
            .is_err()
        {
            return;
        }
        let mut follow = super::follow::Follow::new(&gateway, &record, admitted.updates);
        let followed = async {
            loop {
                match follow.next(&gateway).await {
                    super::follow::Step::Progress(news) => {
                        for p in news {
                            if tx
                                .send(Ok(progress(&p.stage, p.worker, p.epoch, p.message)))
                                .await
                                .is_err()
                            {
                                return None;
                            }
                        }
                    }
                    super::follow::Step::Ended(ended) => return Some(*ended),
                }
            }
        };
        // A caller that went away (a call queued for long, then forgotten) leaves nothing
        // behind: the call goes on, its follower stops now.
        let final_record = tokio::select! {
            _ = tx.closed() => return,
            followed = followed => match followed {
                Some(record) => record,
                None => return,
            },
        };
        let event = final_record.map(|r| proto::InvokeEvent {
            event: Some(proto::invoke_event::Event::Call(call_to_proto(
                &r,
                admitted.deduplicated,
            ))),
        });
        let _ = tx.send(event.map_err(status_of)).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
