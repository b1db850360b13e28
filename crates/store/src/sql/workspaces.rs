//! Agents' workspaces: versions and blobs, the base version a call starts from, and the
//! checks and writes of a workspace commit.

use super::SqlStore;
use super::codec::parse_json;
use super::conn::{Conn, Row, built_query, query};
use super::rows::placeholders;
use super::writer::Write;
use crate::{CallWorkspace, StoreError, Workspaces};
use async_trait::async_trait;
use std::collections::HashSet;
use toolgrid_core::call::{CallError, CallSpec, CallState, ErrorKind, now_ms};
use toolgrid_core::workspace::{self, WorkspaceKey};

/// Commits a workspace version on `base` written by no call's run (see
/// [`Workspaces::commit_workspace`]): the new version, or `None` when the head moved.
struct CommitWorkspace {
    key: WorkspaceKey,
    base: u64,
    commit: workspace::Commit,
    call_id: String,
}

#[async_trait]
impl Write for CommitWorkspace {
    type Output = Option<u64>;

    async fn apply(&self, conn: &mut dyn Conn, again: bool) -> Result<Option<u64>, StoreError> {
        let CommitWorkspace {
            key,
            base,
            commit,
            call_id,
        } = self;
        let head = head_version(conn, key).await?;
        if head != *base {
            // Run again, this very commit may be the head already.
            if again && head == base + 1 {
                let row = query(
                    "SELECT tree_digest, call_id FROM workspace_versions \
                     WHERE namespace = $1 AND agent = $2 AND version = $3",
                )
                .bind(key.namespace.as_str())
                .bind(key.agent.as_str())
                .bind(head as i64)
                .fetch_one(&mut *conn)
                .await?;
                if row.try_get::<String>("tree_digest")? == commit.tree.digest()
                    && row.try_get::<String>("call_id")? == *call_id
                {
                    return Ok(Some(head));
                }
            }
            return Ok(None);
        }
        insert_version(conn, key, base + 1, commit, call_id).await?;
        Ok(Some(base + 1))
    }
}

/// At a call's first assignment, records the head of the workspace it sees as its base:
/// every later assignment (a replay after failover) starts from the same version. Returns
/// the base (`None` for a call without a workspace).
pub(super) async fn pin_workspace_base(
    conn: &mut dyn Conn,
    call_id: &str,
    namespace: &str,
    spec: &CallSpec,
) -> Result<Option<u64>, StoreError> {
    let Some(key) = WorkspaceKey::of_call(namespace, &spec.access) else {
        return Ok(None);
    };
    let head = head_version(conn, &key).await?;
    query("UPDATE calls SET workspace_base = $2 WHERE id = $1 AND workspace_base IS NULL")
        .bind(call_id)
        .bind(head as i64)
        .execute(&mut *conn)
        .await?;
    Ok(Some(head))
}

/// The newest stored version of a workspace (0 when none is).
pub(super) async fn head_version(
    conn: &mut dyn Conn,
    key: &WorkspaceKey,
) -> Result<u64, StoreError> {
    let row = query(
        "SELECT MAX(version) AS head FROM workspace_versions WHERE namespace = $1 AND agent = $2",
    )
    .bind(key.namespace.as_str())
    .bind(key.agent.as_str())
    .fetch_one(&mut *conn)
    .await?;
    Ok(row.try_get::<Option<i64>>("head")?.unwrap_or(0) as u64)
}

/// Why a succeeded call's workspace commit cannot be taken (the call then fails with it),
/// checked in the transaction that would end the call. `Ok(None)`: the commit may go in
/// (or the call is not running under `epoch`, which the completion itself refuses).
pub(super) async fn commit_refusal(
    conn: &mut dyn Conn,
    call_id: &str,
    epoch: u64,
    commit: &workspace::Commit,
) -> Result<Option<CallError>, StoreError> {
    let row = query(
        "SELECT namespace, spec_json, workspace_base FROM calls \
         WHERE id = $1 AND epoch = $2 AND state = 'running'",
    )
    .bind(call_id)
    .bind(epoch as i64)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else { return Ok(None) };
    let namespace: String = row.try_get("namespace")?;
    let spec: CallSpec = parse_json(&row.try_get::<String>("spec_json")?, "spec")?;
    let invalid = |message: String| Ok(Some(CallError::new(ErrorKind::WorkspaceInvalid, message)));
    let Some(key) = WorkspaceKey::written_by(&namespace, &spec.access) else {
        return invalid("the worker sent a workspace for a call that may not write one".into());
    };
    let Some(base) = row.try_get::<Option<i64>>("workspace_base")? else {
        return invalid("the call has no base version".into());
    };
    let head = head_version(conn, &key).await?;
    if head != base as u64 {
        return Ok(Some(CallError::new(
            ErrorKind::WorkspaceConflict,
            format!("workspace {key} is at version {head}, not at {base} where the call started"),
        )));
    }
    if let Err(exceeded) = workspace::Limits::default().check(&commit.tree) {
        return Ok(Some(CallError::new(
            ErrorKind::WorkspaceLimit,
            exceeded.to_string(),
        )));
    }
    if let Err(error) = commit.tree.validate() {
        return invalid(error.to_string());
    }
    let mut sent = HashSet::new();
    for (digest, bytes) in &commit.blobs {
        if workspace::blob_digest(bytes) != *digest {
            return invalid(format!("blob {digest} does not match its bytes"));
        }
        sent.insert(digest.as_str());
    }
    let missing: Vec<String> = commit
        .tree
        .files
        .values()
        .map(|f| f.digest.clone())
        .filter(|d| !sent.contains(d.as_str()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let stored = stored_blobs(conn, &missing).await?;
    if let Some(absent) = missing.iter().find(|d| !stored.contains(*d)) {
        return invalid(format!("blob {absent} was neither sent nor stored"));
    }
    for (path, file) in &commit.tree.files {
        if let Some((_, bytes)) = commit.blobs.iter().find(|(d, _)| *d == file.digest)
            && bytes.len() as u64 != file.size
        {
            return invalid(format!(
                "{path}: size {} does not match its blob",
                file.size
            ));
        }
    }
    Ok(None)
}

/// Which of `digests` are stored.
async fn stored_blobs(
    conn: &mut dyn Conn,
    digests: &[String],
) -> Result<HashSet<String>, StoreError> {
    let mut out = HashSet::new();
    for chunk in digests.chunks(100) {
        let sql = format!(
            "SELECT digest FROM workspace_blobs WHERE digest IN ({})",
            placeholders(1, chunk.len())
        );
        // Only numbered placeholders are formatted into the statement.
        let mut query = built_query(sql);
        for digest in chunk {
            query = query.bind(digest.as_str());
        }
        for row in query.fetch_all(&mut *conn).await? {
            out.insert(row.try_get::<String>("digest")?);
        }
    }
    Ok(out)
}

/// Writes a commit as version `base + 1` of the call's workspace (checked by
/// [`commit_refusal`] in the same transaction).
pub(super) async fn commit_version(
    conn: &mut dyn Conn,
    call_id: &str,
    commit: &workspace::Commit,
) -> Result<(), StoreError> {
    let row = query("SELECT namespace, spec_json, workspace_base FROM calls WHERE id = $1")
        .bind(call_id)
        .fetch_one(&mut *conn)
        .await?;
    let namespace: String = row.try_get("namespace")?;
    let spec: CallSpec = parse_json(&row.try_get::<String>("spec_json")?, "spec")?;
    let key = WorkspaceKey::written_by(&namespace, &spec.access)
        .ok_or_else(|| StoreError::Corrupt(format!("call {call_id} writes no workspace")))?;
    let base = row
        .try_get::<Option<i64>>("workspace_base")?
        .ok_or_else(|| StoreError::Corrupt(format!("call {call_id} has no base version")))?;
    insert_version(conn, &key, base as u64 + 1, commit, call_id).await
}

/// Inserts version `version` of workspace `key` with the blobs it brings.
async fn insert_version(
    conn: &mut dyn Conn,
    key: &WorkspaceKey,
    version: u64,
    commit: &workspace::Commit,
    call_id: &str,
) -> Result<(), StoreError> {
    let now = now_ms();
    for (digest, bytes) in &commit.blobs {
        query(
            "INSERT INTO workspace_blobs (digest, size, bytes, created_at_ms) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (digest) DO NOTHING",
        )
        .bind(digest.as_str())
        .bind(bytes.len() as i64)
        .bind(bytes.as_slice())
        .bind(now)
        .execute(&mut *conn)
        .await?;
    }
    query(
        "INSERT INTO workspace_versions (namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(key.namespace.as_str())
    .bind(key.agent.as_str())
    .bind(version as i64)
    .bind(commit.tree.to_json())
    .bind(commit.tree.digest())
    .bind(now)
    .bind(call_id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

fn version_from_row(row: &Row) -> Result<workspace::Version, StoreError> {
    let tree = workspace::Tree::from_json(&row.try_get::<String>("tree_json")?)
        .map_err(|e| StoreError::Corrupt(format!("workspace tree: {e}")))?;
    Ok(workspace::Version {
        key: WorkspaceKey::new(
            row.try_get::<String>("namespace")?,
            row.try_get::<String>("agent")?,
        ),
        version: row.try_get::<i64>("version")? as u64,
        tree,
        tree_digest: row.try_get("tree_digest")?,
        created_at_ms: row.try_get("created_at_ms")?,
        call_id: row.try_get("call_id")?,
    })
}

#[async_trait]
impl Workspaces for SqlStore {
    async fn call_workspace(&self, call_id: &str) -> Result<Option<CallWorkspace>, StoreError> {
        let row = query(
            "SELECT namespace, spec_json, workspace_base, state, epoch FROM calls WHERE id = $1",
        )
        .bind(call_id)
        .fetch_optional(&mut *self.reads.acquire().await?)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let namespace: String = row.try_get("namespace")?;
        let spec: CallSpec = parse_json(&row.try_get::<String>("spec_json")?, "spec")?;
        let Some(key) = WorkspaceKey::of_call(&namespace, &spec.access) else {
            return Ok(None);
        };
        let state: String = row.try_get("state")?;
        Ok(Some(CallWorkspace {
            key,
            filesystem: spec.access.filesystem,
            base: row
                .try_get::<Option<i64>>("workspace_base")?
                .map(|v| v as u64),
            state: CallState::parse(&state)
                .ok_or_else(|| StoreError::Corrupt(format!("call state {state:?}")))?,
            epoch: row.try_get::<i64>("epoch")? as u64,
        }))
    }

    async fn workspace_head(&self, key: &WorkspaceKey) -> Result<workspace::Version, StoreError> {
        let row = query(
            "SELECT namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id \
             FROM workspace_versions WHERE namespace = $1 AND agent = $2 \
             ORDER BY version DESC LIMIT 1",
        )
        .bind(key.namespace.as_str())
        .bind(key.agent.as_str())
        .fetch_optional(&mut *self.reads.acquire().await?)
        .await?;
        match row {
            Some(row) => version_from_row(&row),
            None => Ok(workspace::Version::empty(key.clone())),
        }
    }

    async fn workspace_version(
        &self,
        key: &WorkspaceKey,
        version: u64,
    ) -> Result<Option<workspace::Version>, StoreError> {
        if version == 0 {
            return Ok(Some(workspace::Version::empty(key.clone())));
        }
        let row = query(
            "SELECT namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id \
             FROM workspace_versions WHERE namespace = $1 AND agent = $2 AND version = $3",
        )
        .bind(key.namespace.as_str())
        .bind(key.agent.as_str())
        .bind(version.min(i64::MAX as u64) as i64)
        .fetch_optional(&mut *self.reads.acquire().await?)
        .await?;
        row.map(|row| version_from_row(&row)).transpose()
    }

    async fn workspace_history(
        &self,
        key: &WorkspaceKey,
    ) -> Result<Vec<workspace::Version>, StoreError> {
        let rows = query(
            "SELECT namespace, agent, version, tree_json, tree_digest, created_at_ms, call_id \
             FROM workspace_versions WHERE namespace = $1 AND agent = $2 ORDER BY version",
        )
        .bind(key.namespace.as_str())
        .bind(key.agent.as_str())
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        rows.iter().map(version_from_row).collect()
    }

    async fn blobs(&self, digests: &[String]) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut out = Vec::new();
        for chunk in digests.chunks(100) {
            let sql = format!(
                "SELECT digest, bytes FROM workspace_blobs WHERE digest IN ({})",
                placeholders(1, chunk.len())
            );
            // Only numbered placeholders are formatted into the statement.
            let mut query = built_query(sql);
            for digest in chunk {
                query = query.bind(digest.as_str());
            }
            for row in query.fetch_all(&mut *self.reads.acquire().await?).await? {
                out.push((row.try_get("digest")?, row.try_get("bytes")?));
            }
        }
        Ok(out)
    }

    async fn commit_workspace(
        &self,
        key: &WorkspaceKey,
        base: u64,
        commit: workspace::Commit,
        call_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        self.write(CommitWorkspace {
            key: key.clone(),
            base,
            commit,
            call_id: call_id.into(),
        })
        .await
    }
}
