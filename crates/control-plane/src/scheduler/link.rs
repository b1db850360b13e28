//! The control plane's side of `WorkerLink`: one `Attach` stream per worker session, and
//! artifact downloads by digest. Every RPC is authenticated first (the bearer token in its
//! metadata, by the [`WorkerAuthenticator`]); a session then acts only on the calls it holds.

use super::{ResultAnswer, Scheduler};
use crate::auth::worker::bearer_token;
use crate::auth::{WorkerAuthError, WorkerAuthenticator, WorkerIdentity};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::ids::{CallId, WorkerId};
use toolgrid_proto::status::status_of;
use toolgrid_proto::worker_link_server::WorkerLink;
use toolgrid_proto::{self as proto, ControlEvent, WorkerEvent, control_event, worker_event};
use toolgrid_store::Store;

/// Bytes per artifact chunk.
const CHUNK: usize = 1 << 20;

/// The longest worker id or pool name (`namespace/name`) a worker may register with.
const MAX_NAME: usize = 512;

/// How long a worker has to send `Register` once its stream is open.
const REGISTER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

pub struct WorkerLinkService {
    scheduler: Arc<Scheduler>,
    store: Arc<dyn Store>,
    auth: Arc<dyn WorkerAuthenticator>,
}

impl WorkerLinkService {
    pub fn new(
        scheduler: Arc<Scheduler>,
        store: Arc<dyn Store>,
        auth: Arc<dyn WorkerAuthenticator>,
    ) -> Self {
        WorkerLinkService {
            scheduler,
            store,
            auth,
        }
    }

    /// Who sent `metadata`'s bearer token; a refusal is the status the RPC ends with.
    async fn authenticate(
        &self,
        metadata: &tonic::metadata::MetadataMap,
    ) -> Result<WorkerIdentity, Status> {
        let token = match metadata.get("authorization") {
            None => None,
            Some(value) => {
                let value = value
                    .to_str()
                    .map_err(|_| refused(WorkerAuthError::Malformed("not ASCII")))?;
                Some(bearer_token(value).map_err(refused)?)
            }
        };
        self.auth.authenticate(token).await.map_err(|error| {
            tracing::warn!(%error, "worker refused");
            refused(error)
        })
    }
}

/// The status a refused worker gets, with its named kind.
fn refused(error: WorkerAuthError) -> Status {
    crate::metrics::refused("worker", error.kind().as_str());
    status_of(ApiError::new(error.kind(), error.to_string()))
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn event(event: control_event::Event) -> Result<ControlEvent, Status> {
    Ok(ControlEvent { event: Some(event) })
}

#[tonic::async_trait]
impl WorkerLink for WorkerLinkService {
    type AttachStream = EventStream<ControlEvent>;
    type FetchArtifactStream = EventStream<proto::ArtifactChunk>;
    type FetchWorkspaceStream = EventStream<proto::WorkspaceChunk>;

    async fn attach(
        &self,
        request: Request<Streaming<WorkerEvent>>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        // Before anything the worker sends is read.
        let identity = self.authenticate(request.metadata()).await?;
        let mut inbound = request.into_inner();
        // An authenticated worker still may not hold a stream open without registering.
        let first = tokio::time::timeout(REGISTER_TIMEOUT, inbound.next())
            .await
            .map_err(|_| Status::deadline_exceeded("no Register in time"))?
            .ok_or_else(|| Status::invalid_argument("the stream ended before Register"))??;
        let Some(worker_event::Event::Register(register)) = first.event else {
            return Err(Status::invalid_argument(
                "the first event of a worker stream must be Register",
            ));
        };
        if register.worker_id.is_empty() || register.pool.is_empty() {
            return Err(Status::invalid_argument(
                "Register needs a worker id and a pool",
            ));
        }
        if register.worker_id.len() > MAX_NAME || register.pool.len() > MAX_NAME {
            return Err(Status::invalid_argument(format!(
                "a worker id and a pool name have at most {MAX_NAME} bytes"
            )));
        }
        if let Err(error) = self.auth.authorize_pool(&identity, &register.pool) {
            tracing::warn!(worker = %register.worker_id, pool = %register.pool, %error, "worker refused");
            return Err(refused(error));
        }
        let (tx, rx) = mpsc::channel(1024);
        let stop = Arc::new(tokio::sync::Notify::new());
        let worker = WorkerId::from(register.worker_id.as_str());
        let registration = self
            .scheduler
            .register(&worker, &register, tx.clone(), stop.clone())
            .await
            .map_err(|error| {
                status_of(ApiError::new(ErrorKind::WorkerIdInUse, error.to_string()))
            })?;
        let session = registration.session;
        let config = self.scheduler.config();
        let registered = proto::Registered {
            heartbeat_interval_ms: config.heartbeat_interval.as_millis() as u32,
            lease_ms: config.lease.as_millis() as u32,
            abandon: registration
                .abandon
                .into_iter()
                .map(CallId::into_string)
                .collect(),
            session_secret: registration.secret,
        };
        tx.send(event(control_event::Event::Registered(registered)))
            .await
            .map_err(|_| Status::unavailable("worker stream closed"))?;

        let scheduler = self.scheduler.clone();
        let in_flight = super::nested::InFlight::default();
        tokio::spawn(async move {
            let reason = loop {
                let next = tokio::select! {
                    next = inbound.next() => next,
                    _ = stop.notified() => break "session ended by the control plane".to_string(),
                };
                let message = match next {
                    None => break "stream closed".to_string(),
                    Some(Err(status)) => break format!("stream broke: {}", status.message()),
                    Some(Ok(message)) => message,
                };
                if !scheduler.is_current(&worker, session) {
                    // A newer session or a lapsed lease replaced this one: refuse the rest.
                    break "session replaced".to_string();
                }
                match message.event {
                    Some(worker_event::Event::Heartbeat(heartbeat)) => {
                        scheduler.heartbeat(&worker, session, &heartbeat);
                    }
                    Some(worker_event::Event::Append(append)) => {
                        let (scheduler, tx, worker) =
                            (scheduler.clone(), tx.clone(), worker.clone());
                        tokio::spawn(async move {
                            let ack = scheduler.append(&worker, session, &append).await;
                            let _ = tx.send(event(control_event::Event::Ack(ack))).await;
                        });
                    }
                    Some(worker_event::Event::Result(result)) => {
                        let (scheduler, tx, worker) =
                            (scheduler.clone(), tx.clone(), worker.clone());
                        tokio::spawn(async move {
                            let call_id = result.call_id.clone();
                            let answer = scheduler.complete(&worker, session, result).await;
                            let error = match answer {
                                ResultAnswer::Stored | ResultAnswer::Retry => String::new(),
                                ResultAnswer::Refused => "refused".to_string(),
                                ResultAnswer::NotHeld(refusal) => refusal.as_str().to_string(),
                            };
                            let ack = proto::ResultAck {
                                call_id,
                                ok: answer == ResultAnswer::Stored,
                                retry: answer == ResultAnswer::Retry,
                                error,
                            };
                            let _ = tx.send(event(control_event::Event::ResultAck(ack))).await;
                        });
                    }
                    Some(worker_event::Event::Abandoned(abandoned)) => {
                        scheduler.abandoned(&worker, session, &abandoned);
                    }
                    Some(worker_event::Event::Progress(progress)) => {
                        // A refused report changes nothing; there is no answer to send.
                        let _ = scheduler.progress(&worker, session, &progress);
                    }
                    Some(worker_event::Event::ToolCall(request)) => {
                        // Answered when the child call ends (an approval may hold it long).
                        // A request sent again while its first is answered is dropped: the
                        // first's answer comes back on this stream.
                        let Some(answering) = in_flight.begin(&request.call_id, request.seq) else {
                            tracing::warn!(call = %request.call_id, seq = request.seq, "a tool call request sent again while it is answered was dropped");
                            continue;
                        };
                        let (scheduler, tx, worker) =
                            (scheduler.clone(), tx.clone(), worker.clone());
                        tokio::spawn(async move {
                            let _answering = answering;
                            let answer = scheduler.nested_call(&worker, session, request).await;
                            let _ = tx
                                .send(event(control_event::Event::ToolAnswer(answer)))
                                .await;
                        });
                    }
                    Some(worker_event::Event::Register(_)) => {
                        break "a second Register on one stream".to_string();
                    }
                    None => {}
                }
            };
            scheduler.worker_lost(&worker, session, &reason);
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_artifact(
        &self,
        request: Request<proto::FetchArtifactRequest>,
    ) -> Result<Response<Self::FetchArtifactStream>, Status> {
        let identity = self.authenticate(request.metadata()).await?;
        let digest = request.into_inner().digest;
        // Only for a call running in a pool this worker may serve: a worker of one tenant's
        // pool cannot read another tenant's tools by digest. Refused as not found, naming
        // nothing about the artifact.
        let pools = self.scheduler.pools_running(&digest);
        if !pools
            .iter()
            .any(|pool| self.auth.authorize_pool(&identity, pool).is_ok())
        {
            return Err(status_of(ApiError::new(
                ErrorKind::NotFound,
                format!("no artifact {digest} for a call this worker may run"),
            )));
        }
        // A piece at a time, read as the worker takes them: the Python runtime's module is
        // 104.5 MB, and several workers may fetch it at once.
        let pieces = self
            .store
            .read_artifact(&digest, CHUNK)
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .ok_or_else(|| Status::not_found(format!("no artifact {digest}")))?;
        let total_size = pieces.size();
        // Ends after the last piece, or after an error.
        let chunks = futures::stream::unfold(Some(pieces), move |pieces| async move {
            let mut pieces = pieces?;
            let chunk = pieces
                .next()
                .await?
                .map(|data| proto::ArtifactChunk { data, total_size })
                .map_err(|e| Status::internal(e.to_string()));
            let more = chunk.is_ok().then_some(pieces);
            Some((chunk, more))
        });
        Ok(Response::new(Box::pin(chunks)))
    }

    async fn fetch_workspace(
        &self,
        request: Request<proto::FetchWorkspaceRequest>,
    ) -> Result<Response<Self::FetchWorkspaceStream>, Status> {
        let identity = self.authenticate(request.metadata()).await?;
        let request = request.into_inner();
        // Only a worker that may serve the call's pool gets its workspace (in a cluster, a
        // pool's ServiceAccount; a join secret serves every pool).
        let call = self
            .store
            .get_call(&request.call_id)
            .await
            .map_err(|e| Status::internal(e.to_string()))?
            .ok_or_else(|| Status::not_found(format!("no call {}", request.call_id)))?;
        self.auth
            .authorize_pool(&identity, &call.spec.pool)
            .map_err(refused)?;
        let chunks = workspace_chunks(self.store.as_ref(), &request.call_id, request.epoch).await?;
        Ok(Response::new(Box::pin(tokio_stream::iter(
            chunks.into_iter().map(Ok),
        ))))
    }
}

/// The chunks of the version a call started from: its tree first, then each blob in pieces
/// of at most [`CHUNK`] bytes. Only for a call running under `epoch`; the link gives them only to an authenticated
/// worker that may serve the call's pool.
pub async fn workspace_chunks(
    store: &dyn Store,
    call_id: &str,
    epoch: u64,
) -> Result<Vec<proto::WorkspaceChunk>, Status> {
    let internal = |e: toolgrid_store::StoreError| Status::internal(e.to_string());
    let seen = store
        .call_workspace(call_id)
        .await
        .map_err(internal)?
        .ok_or_else(|| Status::not_found(format!("call {call_id} has no workspace")))?;
    if seen.state != toolgrid_core::call::CallState::Running || seen.epoch != epoch {
        return Err(Status::failed_precondition(format!(
            "call {call_id} is not running under epoch {epoch}"
        )));
    }
    let base = seen.base.ok_or_else(|| {
        Status::failed_precondition(format!("call {call_id} has no base version yet"))
    })?;
    let version = store
        .workspace_version(&seen.key, base)
        .await
        .map_err(internal)?
        .ok_or_else(|| Status::internal(format!("workspace {} has no version {base}", seen.key)))?;
    let mut digests: Vec<String> = version
        .tree
        .files
        .values()
        .map(|f| f.digest.clone())
        .collect();
    digests.sort();
    digests.dedup();
    let blobs = store.blobs(&digests).await.map_err(internal)?;
    if blobs.len() != digests.len() {
        return Err(Status::internal(format!(
            "workspace {} version {base} misses blobs",
            seen.key
        )));
    }
    let mut chunks = vec![proto::WorkspaceChunk {
        version: base,
        files: proto::tree_to_wire(&version.tree),
        ..Default::default()
    }];
    for (digest, bytes) in blobs {
        if bytes.is_empty() {
            chunks.push(proto::WorkspaceChunk {
                digest: digest.clone(),
                ..Default::default()
            });
        }
        for (i, piece) in bytes.chunks(CHUNK).enumerate() {
            chunks.push(proto::WorkspaceChunk {
                digest: digest.clone(),
                offset: (i * CHUNK) as u64,
                data: piece.to_vec(),
                ..Default::default()
            });
        }
    }
    Ok(chunks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::call::{CallAccess, CallStarted, Filesystem, NewCall, RunSummary};
    use toolgrid_core::workspace::{Commit, Tree, blob_digest};
    use toolgrid_store::{CallOutcome, CallSpec};

    fn call(id: &str, agent: &str, filesystem: Filesystem) -> NewCall {
        NewCall {
            id: id.into(),
            namespace: "default".into(),
            tool: "t".into(),
            command: "c".into(),
            release: "r".into(),
            release_digest: "sha256:00".into(),
            args: serde_json::json!({}),
            spec: CallSpec {
                access: CallAccess {
                    agent: Some(agent.into()),
                    filesystem,
                    ..CallAccess::default()
                },
                ..CallSpec::default()
            },
            stdin: Vec::new(),
            idempotency_key: None,
            request_hash: id.into(),
            started: CallStarted {
                namespace: "default".into(),
                tool: "t".into(),
                command: "c".into(),
                release: "r".into(),
                version: "1.0.0".into(),
                digest: "sha256:00".into(),
                args: serde_json::json!({}),
                argv: Vec::new(),
                stdin_bytes: 0,
                idempotency_key: None,
                dry_run: false,
                middleware: Vec::new(),
            },
            assign_to: None,
            repeat_window_ms: None,
            dry_run_result: None,
        }
    }

    #[tokio::test]
    async fn a_workspace_goes_only_to_the_current_assignment_tree_first_then_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = toolgrid_store::open(&url).await.unwrap();
        // Version 1 of alice's workspace, with a blob larger than one chunk.
        let big = vec![7u8; CHUNK + 10];
        let files: [(&str, &[u8]); 3] = [("a", b"one"), ("big", &big), ("empty", b"")];
        store
            .create_call(call("w", "alice", Filesystem::ReadWrite))
            .await
            .unwrap();
        let epoch = store.assign_call("w", "w1").await.unwrap();
        let commit = Commit {
            tree: Tree::from_rows(
                files
                    .iter()
                    .map(|(p, b)| (p.to_string(), blob_digest(b), b.len() as u64)),
            )
            .unwrap(),
            blobs: files
                .iter()
                .map(|(_, b)| (blob_digest(b), b.to_vec()))
                .collect(),
        };
        let outcome = CallOutcome {
            result: Ok(serde_json::json!({})),
            run: RunSummary {
                exit_code: 0,
                stdout_bytes: 0,
                run_micros: 0,
                epoch,
                worker: "w1".into(),
                replayed: 0,
            },
            workspace: Some(commit.clone()),
        };
        store
            .complete_call("w", epoch, 0, vec![], outcome)
            .await
            .unwrap();

        store
            .create_call(call("r", "alice", Filesystem::ReadOnly))
            .await
            .unwrap();
        let epoch = store.assign_call("r", "w2").await.unwrap();
        let chunks = workspace_chunks(store.as_ref(), "r", epoch).await.unwrap();
        assert_eq!(chunks[0].version, 1);
        assert_eq!(
            toolgrid_proto::tree_from_wire(&chunks[0].files).unwrap(),
            commit.tree
        );
        let mut blobs: std::collections::HashMap<String, Vec<u8>> = Default::default();
        for chunk in &chunks[1..] {
            let blob = blobs.entry(chunk.digest.clone()).or_default();
            assert_eq!(chunk.offset, blob.len() as u64);
            assert!(chunk.data.len() <= CHUNK);
            blob.extend_from_slice(&chunk.data);
        }
        assert_eq!(blobs.len(), 3);
        assert_eq!(blobs[&blob_digest(&big)], big);

        // Not for an older (or a future) epoch, an ended call, or a call without access.
        let refused = workspace_chunks(store.as_ref(), "r", epoch + 1)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        store.fence_call("r", epoch, "test").await.unwrap();
        let refused = workspace_chunks(store.as_ref(), "r", epoch)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        let refused = workspace_chunks(store.as_ref(), "w", 1).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "ended");
        store
            .create_call(call("n", "alice", Filesystem::None))
            .await
            .unwrap();
        let epoch = store.assign_call("n", "w1").await.unwrap();
        let refused = workspace_chunks(store.as_ref(), "n", epoch)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::NotFound);
    }

    /// Workers whose token is the name of their ServiceAccount; a pool `NS/NAME` is served
    /// by ServiceAccount `NAME-worker`.
    struct NamedAccounts;

    #[async_trait::async_trait]
    impl WorkerAuthenticator for NamedAccounts {
        async fn authenticate(
            &self,
            token: Option<&str>,
        ) -> Result<WorkerIdentity, WorkerAuthError> {
            let token = token.ok_or(WorkerAuthError::Missing)?;
            Ok(WorkerIdentity::ServiceAccount(
                toolgrid_core::ids::ObjectKey::new("default", token),
            ))
        }

        fn authorize_pool(
            &self,
            identity: &WorkerIdentity,
            pool: &str,
        ) -> Result<(), WorkerAuthError> {
            let key = toolgrid_core::ids::ObjectKey::new(
                "default",
                pool.rsplit('/').next().unwrap_or(pool),
            );
            let expected = format!("{}-worker", key.name);
            crate::auth::worker::may_serve(identity, &key, Some(&expected))
        }
    }

    #[tokio::test]
    async fn a_workspace_goes_only_to_a_worker_that_may_serve_the_calls_pool() {
        use toolgrid_proto::worker_link_server::WorkerLink as _;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = toolgrid_store::open(&url).await.unwrap();
        let mut new = call("r", "alice", Filesystem::ReadOnly);
        new.spec.pool = "default/gpu".into();
        store.create_call(new).await.unwrap();
        let epoch = store.assign_call("r", "w1").await.unwrap();
        let scheduler = crate::scheduler::Scheduler::new(
            store.clone(),
            Arc::new(crate::scheduler::CallWatch::default()),
            crate::scheduler::SchedulerConfig::default(),
        );
        let link = WorkerLinkService::new(scheduler, store, Arc::new(NamedAccounts));
        let ask = |account: &str| {
            let mut request = Request::new(proto::FetchWorkspaceRequest {
                call_id: "r".into(),
                epoch,
            });
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {account}").parse().unwrap(),
            );
            request
        };
        let refused = link
            .fetch_workspace(ask("cpu-worker"))
            .await
            .err()
            .expect("another pool's worker is refused");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert!(link.fetch_workspace(ask("gpu-worker")).await.is_ok());
        let refused = link
            .fetch_workspace(Request::new(proto::FetchWorkspaceRequest {
                call_id: "r".into(),
                epoch,
            }))
            .await
            .err()
            .expect("no token, no workspace");
        assert_eq!(refused.code(), tonic::Code::Unauthenticated);
    }
}
