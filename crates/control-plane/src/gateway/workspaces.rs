//! The gRPC `Workspaces` service: agents' workspace versions, files and diffs, read from
//! the store. An agent reads only its own workspace, operators any
//! ([`toolgrid_core::workspace::may_read`], applied by [`authorize_read`]).

use std::pin::Pin;
use std::sync::Arc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};
use toolgrid_core::auth::Principal;
use toolgrid_core::error::{ApiError, ErrorKind};
use toolgrid_core::workspace::{self, WorkspaceKey, WorkspacePath};
use toolgrid_proto::status::status_of;
use toolgrid_proto::{self as proto, workspaces_server::Workspaces};
use toolgrid_store::Workspaces as WorkspaceStore;

/// Bytes per file chunk.
const CHUNK: usize = 1 << 20;

pub struct WorkspacesService {
    store: Arc<dyn WorkspaceStore>,
}

impl WorkspacesService {
    pub fn new(store: Arc<dyn WorkspaceStore>) -> Self {
        WorkspacesService { store }
    }
}

/// Whether the caller may read workspace `key`: `PermissionDenied` for an agent reading
/// another agent's workspace. `principal` is the authenticated caller, which the front
/// door's authentication leaves in the request's extensions; `None` only where callers are
/// not authenticated at all, and then every read is allowed like every other read.
pub fn authorize_read(principal: Option<&Principal>, key: &WorkspaceKey) -> Result<(), ApiError> {
    match principal {
        None => Err(ApiError::new(
            ErrorKind::Unauthenticated,
            "the request was not authenticated",
        )),
        Some(principal) if !workspace::may_read(principal, key) => Err(ApiError::new(
            ErrorKind::PermissionDenied,
            format!("the workspace of agent {key} belongs to another agent"),
        )),
        Some(_) => Ok(()),
    }
}

/// The workspace a request names, after checking the caller may read it.
fn key_of<T>(request: &Request<T>, namespace: &str, agent: &str) -> Result<WorkspaceKey, ApiError> {
    if agent.is_empty() {
        return Err(ApiError::new(ErrorKind::InvalidArgument, "name an agent"));
    }
    let namespace = if namespace.is_empty() {
        "default"
    } else {
        namespace
    };
    let key = WorkspaceKey::new(namespace, agent);
    authorize_read(request.extensions().get::<Principal>(), &key)?;
    Ok(key)
}

async fn version_of(
    store: &dyn WorkspaceStore,
    key: &WorkspaceKey,
    version: Option<u64>,
) -> Result<workspace::Version, ApiError> {
    match version {
        None => Ok(store.workspace_head(key).await?),
        Some(v) => store.workspace_version(key, v).await?.ok_or_else(|| {
            ApiError::new(
                ErrorKind::NotFound,
                format!("workspace {key} has no version {v}"),
            )
        }),
    }
}

fn version_to_proto(version: &workspace::Version) -> proto::WorkspaceVersion {
    proto::WorkspaceVersion {
        namespace: version.key.namespace.clone(),
        agent: version.key.agent.clone(),
        version: version.version,
        tree_digest: version.tree_digest.clone(),
        files: proto::tree_to_wire(&version.tree),
        total_bytes: version.tree.total_bytes(),
        created_at_ms: version.created_at_ms,
        call_id: version.call_id.clone(),
    }
}

type FileStream = Pin<Box<dyn Stream<Item = Result<proto::WorkspaceFileChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Workspaces for WorkspacesService {
    type ReadWorkspaceFileStream = FileStream;

    async fn get_workspace_version(
        &self,
        request: Request<proto::GetWorkspaceVersionRequest>,
    ) -> Result<Response<proto::WorkspaceVersion>, Status> {
        let key = key_of(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().agent,
        )
        .map_err(status_of)?;
        let version = version_of(self.store.as_ref(), &key, request.get_ref().version)
            .await
            .map_err(status_of)?;
        Ok(Response::new(version_to_proto(&version)))
    }

    async fn list_workspace_versions(
        &self,
        request: Request<proto::ListWorkspaceVersionsRequest>,
    ) -> Result<Response<proto::ListWorkspaceVersionsResponse>, Status> {
        let key = key_of(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().agent,
        )
        .map_err(status_of)?;
        let versions = self
            .store
            .workspace_history(&key)
            .await
            .map_err(ApiError::from)
            .map_err(status_of)?
            .iter()
            .map(|v| proto::WorkspaceVersionSummary {
                version: v.version,
                tree_digest: v.tree_digest.clone(),
                file_count: v.tree.len() as u64,
                total_bytes: v.tree.total_bytes(),
                created_at_ms: v.created_at_ms,
                call_id: v.call_id.clone(),
            })
            .collect();
        Ok(Response::new(proto::ListWorkspaceVersionsResponse {
            versions,
        }))
    }

    async fn read_workspace_file(
        &self,
        request: Request<proto::ReadWorkspaceFileRequest>,
    ) -> Result<Response<FileStream>, Status> {
        let key = key_of(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().agent,
        )
        .map_err(status_of)?;
        let path = WorkspacePath::parse(&request.get_ref().path)
            .map_err(|e| ApiError::new(ErrorKind::InvalidArgument, format!("bad path: {e}")))
            .map_err(status_of)?;
        let version = version_of(self.store.as_ref(), &key, request.get_ref().version)
            .await
            .map_err(status_of)?;
        let file = version
            .tree
            .files
            .get(&path)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::NotFound,
                    format!(
                        "workspace {key} version {} has no file {path}",
                        version.version
                    ),
                )
            })
            .map_err(status_of)?;
        let bytes = self
            .store
            .blobs(std::slice::from_ref(&file.digest))
            .await
            .map_err(ApiError::from)
            .map_err(status_of)?
            .into_iter()
            .next()
            .map(|(_, bytes)| bytes)
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::Internal,
                    format!("blob {} is missing", file.digest),
                )
            })
            .map_err(status_of)?;
        let total = bytes.len() as u64;
        let mut chunks: Vec<Result<proto::WorkspaceFileChunk, Status>> = bytes
            .chunks(CHUNK)
            .map(|c| {
                Ok(proto::WorkspaceFileChunk {
                    data: c.to_vec(),
                    total_size: total,
                })
            })
            .collect();
        if chunks.is_empty() {
            chunks.push(Ok(proto::WorkspaceFileChunk {
                data: Vec::new(),
                total_size: 0,
            }));
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(chunks))))
    }

    async fn diff_workspace_versions(
        &self,
        request: Request<proto::DiffWorkspaceVersionsRequest>,
    ) -> Result<Response<proto::DiffWorkspaceVersionsResponse>, Status> {
        let key = key_of(
            &request,
            &request.get_ref().namespace,
            &request.get_ref().agent,
        )
        .map_err(status_of)?;
        let from = version_of(self.store.as_ref(), &key, Some(request.get_ref().from))
            .await
            .map_err(status_of)?;
        let to = version_of(self.store.as_ref(), &key, Some(request.get_ref().to))
            .await
            .map_err(status_of)?;
        let changes = workspace::diff(&from.tree, &to.tree)
            .into_iter()
            .map(|c| proto::WorkspaceChange {
                path: c.path.to_string(),
                kind: match c.kind {
                    workspace::ChangeKind::Added => "added",
                    workspace::ChangeKind::Removed => "removed",
                    workspace::ChangeKind::Modified => "modified",
                }
                .into(),
            })
            .collect();
        Ok(Response::new(proto::DiffWorkspaceVersionsResponse {
            changes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_core::ids::ObjectKey;

    #[test]
    fn an_agent_is_refused_another_agents_workspace_by_name() {
        let key = WorkspaceKey::new("default", "alice");
        let bob = Principal::Agent {
            agent: ObjectKey::new("default", "bob"),
        };
        let alice = Principal::Agent {
            agent: ObjectKey::new("default", "alice"),
        };
        let admin = Principal::Operator {
            subject: "admin".into(),
        };
        assert_eq!(
            authorize_read(Some(&bob), &key).unwrap_err().kind,
            ErrorKind::PermissionDenied
        );
        assert!(authorize_read(Some(&alice), &key).is_ok());
        assert!(authorize_read(Some(&admin), &key).is_ok());
    }
}
