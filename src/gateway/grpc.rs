//! The gRPC `Tools` service.

use super::convert::{call_to_proto, oplog_to_proto};
use super::{Gateway, Invocation};
use crate::error::{ApiError, ErrorKind};
use crate::proto::{self, tools_server::Tools};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

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

fn invocation(request: proto::InvokeRequest) -> Result<Invocation, ApiError> {
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
        let tools = self.gateway.list_tools(&request.into_inner().namespace);
        Ok(Response::new(proto::ListToolsResponse { tools }))
    }

    async fn invoke(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        let admitted = self
            .gateway
            .invoke(invocation(request.into_inner())?)
            .await?;
        Ok(Response::new(call_to_proto(
            &admitted.record,
            admitted.deduplicated,
        )))
    }

    async fn invoke_stream(
        &self,
        request: Request<proto::InvokeRequest>,
    ) -> Result<Response<InvokeStream>, Status> {
        let admitted = self
            .gateway
            .admit(invocation(request.into_inner())?)
            .await?;
        let gateway = self.gateway.clone();
        let stream = async_stream(gateway, admitted);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_call(
        &self,
        request: Request<proto::GetCallRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        let request = request.into_inner();
        let record = if request.id.is_empty() {
            if request.idempotency_key.is_empty() {
                return Err(ApiError::new(
                    ErrorKind::InvalidArgument,
                    "give a call id or an idempotency key",
                )
                .into());
            }
            self.gateway
                .find_call(&request.namespace, &request.idempotency_key)
                .await?
        } else {
            self.gateway.get_call(&request.id).await?
        };
        let record = if request.wait && !record.state.is_terminal() {
            let limit = self.gateway.wait_limit(&record).min(MAX_WAIT);
            self.gateway.wait(&record.id, limit).await?
        } else {
            record
        };
        Ok(Response::new(call_to_proto(&record, false)))
    }

    async fn list_calls(
        &self,
        request: Request<proto::ListCallsRequest>,
    ) -> Result<Response<proto::ListCallsResponse>, Status> {
        let request = request.into_inner();
        let calls = self
            .gateway
            .list_calls(&request.namespace, &request.tool, request.limit)
            .await?
            .iter()
            .map(|r| call_to_proto(r, false))
            .collect();
        Ok(Response::new(proto::ListCallsResponse { calls }))
    }

    async fn get_oplog(
        &self,
        request: Request<proto::GetOplogRequest>,
    ) -> Result<Response<proto::GetOplogResponse>, Status> {
        let request = request.into_inner();
        let call_id = request.call_id;
        let (page, next) = self.gateway.oplog_page(&call_id, request.from_seq).await?;
        let entries = page.iter().map(oplog_to_proto).collect();
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
        let request = request.into_inner();
        let rows = self
            .gateway
            .list_resources(&request.kind, &request.namespace)?;
        Ok(Response::new(proto::ListResourcesResponse { rows }))
    }

    async fn approve(
        &self,
        _request: Request<proto::DecisionRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        Err(Status::unimplemented(
            "approval middleware is not available yet",
        ))
    }

    async fn deny(
        &self,
        _request: Request<proto::DecisionRequest>,
    ) -> Result<Response<proto::Call>, Status> {
        Err(Status::unimplemented(
            "approval middleware is not available yet",
        ))
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
        let mut updates = gateway.watch(&record.id);
        let mut sent = 0usize;
        let deadline = tokio::time::Instant::now() + gateway.wait_limit(&record);
        let final_record = loop {
            let (news, finished) = {
                let update = updates.borrow_and_update();
                (
                    update.progress[sent.min(update.progress.len())..].to_vec(),
                    update.finished.clone(),
                )
            };
            for p in news {
                sent += 1;
                if tx
                    .send(Ok(progress(&p.stage, p.worker, p.epoch, p.message)))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            if let Some(done) = finished {
                break Ok(done);
            }
            let current = gateway.get_call(&record.id).await;
            if let Ok(current) = &current
                && current.state.is_terminal()
            {
                break Ok(current.clone());
            }
            match tokio::time::timeout_at(deadline, updates.changed()).await {
                Ok(Ok(())) => {}
                _ => break gateway.get_call(&record.id).await,
            }
        };
        let event = final_record.map(|r| proto::InvokeEvent {
            event: Some(proto::invoke_event::Event::Call(call_to_proto(
                &r,
                admitted.deduplicated,
            ))),
        });
        let _ = tx.send(event.map_err(Status::from)).await;
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
