//! Artifacts (stored by digest) and the bookkeeping of declared resources.

use super::codec::parse_json;
use super::conn::{Conn, query};
use super::writer::Write;
use super::{Backend, SqlStore};
use crate::{ArtifactPieces, Artifacts, Resources, StoreError};
use async_trait::async_trait;
use std::sync::atomic::Ordering;
use toolgrid_core::call::{ResourceChanges, ResourceRecord, now_ms};

/// Stores an artifact (see [`Artifacts::put_artifact`]).
struct PutArtifact {
    digest: String,
    bytes: Vec<u8>,
}

#[async_trait]
impl Write for PutArtifact {
    type Output = ();

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(), StoreError> {
        let PutArtifact { digest, bytes } = self;
        // An artifact's bytes are never rewritten (its digest names them): stored again,
        // only its time in `artifact_times` changes. Its row is not touched, since SQLite
        // rewrites a row whole, and reads its blob back to do it.
        let stored = query("SELECT 1 AS stored FROM artifacts WHERE digest = $1")
            .bind(digest.as_str())
            .fetch_optional(&mut *conn)
            .await?
            .is_some();
        if !stored {
            insert_artifact(conn, digest, bytes).await?;
        }
        // Storing an artifact again refreshes its time, so retention keeps what the
        // catalog has just stored.
        query(
            "INSERT INTO artifact_times (digest, stored_at_ms) VALUES ($1, $2) \
             ON CONFLICT (digest) DO UPDATE SET stored_at_ms = excluded.stored_at_ms",
        )
        .bind(digest.as_str())
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        Ok(())
    }
}

/// The most of an artifact's bytes sent in one statement on PostgreSQL.
const PIECE: usize = 1 << 20;

/// Inserts an artifact's row without a copy of its bytes on this side. On SQLite the row is
/// made with a blob of zeros that the writer's connection then overwrites in place. On
/// PostgreSQL the bytes go a piece at a time into a large object of the transaction, which
/// the server turns into the row's value and then deletes: bound whole, sqlx encoded them
/// into its buffers twice, and kept the buffer's size after.
async fn insert_artifact(
    conn: &mut dyn Conn,
    digest: &str,
    bytes: &[u8],
) -> Result<(), StoreError> {
    let size = i64::try_from(bytes.len())
        .map_err(|_| StoreError::Database(sqlx::Error::Encode("an artifact too large".into())))?;
    match conn.backend() {
        Backend::Postgres => {
            let object: i64 = query("SELECT CAST(lo_create(0) AS BIGINT) AS object")
                .fetch_one(&mut *conn)
                .await?
                .try_get("object")?;
            for (index, piece) in bytes.chunks(PIECE).enumerate() {
                let at = i64::try_from(index * PIECE).unwrap_or(i64::MAX);
                query("SELECT 1 AS put FROM lo_put(CAST($1 AS OID), $2, $3)")
                    .bind(object)
                    .bind(at)
                    .bind(piece)
                    .execute(&mut *conn)
                    .await?;
            }
            // Another control plane may store the same artifact at the same time: the
            // first row stays (its digest names the same bytes).
            query(
                "INSERT INTO artifacts (digest, size, bytes) \
                 VALUES ($1, $2, lo_get(CAST($3 AS OID))) ON CONFLICT (digest) DO NOTHING",
            )
            .bind(digest)
            .bind(size)
            .bind(object)
            .execute(&mut *conn)
            .await?;
            query("SELECT lo_unlink(CAST($1 AS OID)) AS unlinked")
                .bind(object)
                .execute(&mut *conn)
                .await?;
        }
        Backend::Sqlite => {
            // The blob is the row's last column: SQLite makes the row without the zeros.
            let inserted = query(
                "INSERT INTO artifacts (digest, size, bytes) VALUES ($1, $2, zeroblob($2)) \
                 ON CONFLICT (digest) DO NOTHING RETURNING rowid",
            )
            .bind(digest)
            .bind(size)
            .fetch_optional(&mut *conn)
            .await?;
            if let Some(row) = inserted {
                let rowid: i64 = row.try_get("rowid")?;
                conn.blob_writes()
                    .ok_or(StoreError::Database(sqlx::Error::Configuration(
                        "SQLite's writes go through the writer's own connection".into(),
                    )))?
                    .write_blob("artifacts", "bytes", rowid, bytes)?;
            }
        }
    }
    Ok(())
}

/// Replaces the bookkeeping of every resource (see [`Resources::save_resources`]).
struct SaveResources(Vec<ResourceRecord>);

#[async_trait]
impl Write for SaveResources {
    type Output = ();

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(), StoreError> {
        query("DELETE FROM resources").execute(&mut *conn).await?;
        for record in &self.0 {
            upsert_resource(conn, record).await?;
        }
        Ok(())
    }
}

/// Writes and deletes some resources' records (see [`Resources::update_resources`]).
struct UpdateResources(ResourceChanges);

#[async_trait]
impl Write for UpdateResources {
    type Output = ();

    async fn apply(&self, conn: &mut dyn Conn, _again: bool) -> Result<(), StoreError> {
        for key in &self.0.removed {
            query("DELETE FROM resources WHERE kind = $1 AND namespace = $2 AND name = $3")
                .bind(key.kind.as_str())
                .bind(key.namespace.as_str())
                .bind(key.name.as_str())
                .execute(&mut *conn)
                .await?;
        }
        for record in &self.0.saved {
            upsert_resource(conn, record).await?;
        }
        Ok(())
    }
}

/// Writes one resource's record, replacing the stored one (applied again, the same).
async fn upsert_resource(conn: &mut dyn Conn, r: &ResourceRecord) -> Result<(), StoreError> {
    query(
        "INSERT INTO resources (kind, namespace, name, spec_hash, generation, status_json) \
         VALUES ($1, $2, $3, $4, $5, $6) \
         ON CONFLICT (kind, namespace, name) DO UPDATE SET spec_hash = excluded.spec_hash, \
         generation = excluded.generation, status_json = excluded.status_json",
    )
    .bind(r.kind.as_str())
    .bind(r.namespace.as_str())
    .bind(r.name.as_str())
    .bind(r.spec_hash.as_str())
    .bind(r.generation)
    .bind(r.status.to_string())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[async_trait]
impl Artifacts for SqlStore {
    async fn put_artifact(&self, digest: &str, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.write(PutArtifact {
            digest: digest.into(),
            bytes,
        })
        .await
    }

    async fn get_artifact(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let row = query("SELECT bytes FROM artifacts WHERE digest = $1")
            .bind(digest)
            .fetch_optional(&mut *self.reads.acquire().await?)
            .await?;
        Ok(row.map(|r| r.try_get("bytes")).transpose()?)
    }

    async fn read_artifact(
        &self,
        digest: &str,
        piece: usize,
    ) -> Result<Option<ArtifactPieces>, StoreError> {
        match &self.blob_reads {
            Some(file) => file.read_artifact(digest, piece).await,
            None => super::slice_reads::read_artifact(&self.reads, digest, piece).await,
        }
    }

    fn artifact_purges(&self) -> u64 {
        self.artifact_purges.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Resources for SqlStore {
    async fn load_resources(&self) -> Result<Vec<ResourceRecord>, StoreError> {
        let rows = query(
            "SELECT kind, namespace, name, spec_hash, generation, status_json FROM resources",
        )
        .fetch_all(&mut *self.reads.acquire().await?)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(ResourceRecord {
                    kind: row.try_get("kind")?,
                    namespace: row.try_get("namespace")?,
                    name: row.try_get("name")?,
                    spec_hash: row.try_get("spec_hash")?,
                    generation: row.try_get("generation")?,
                    status: parse_json(&row.try_get::<String>("status_json")?, "resource status")?,
                })
            })
            .collect()
    }

    async fn save_resources(&self, records: Vec<ResourceRecord>) -> Result<(), StoreError> {
        self.write(SaveResources(records)).await
    }

    async fn update_resources(&self, changes: ResourceChanges) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        self.write(UpdateResources(changes)).await
    }
}
