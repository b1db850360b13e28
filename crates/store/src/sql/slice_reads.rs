//! Artifacts read in pieces on PostgreSQL ([`Artifacts::read_artifact`](crate::Artifacts::read_artifact)):
//! each piece is a `substring` of the stored value, read as the one who asked takes the
//! pieces, at most [`AHEAD`] ahead, giving up when one is not taken within [`STALL`](crate::pieces::STALL).
//!
//! PostgreSQL reads a slice of a value stored out of line and uncompressed without the rest
//! of it: schema 11 stores `artifacts.bytes` so (`STORAGE EXTERNAL`). Read whole, sqlx
//! held the value as received and again as the row's bytes.

use super::conn::query;
use crate::StoreError;
use crate::pieces::{AHEAD, ArtifactPieces, hand_over};
use sqlx::AnyPool;
use tokio::sync::mpsc;

/// Reads artifact `digest` in pieces of at most `piece` bytes (at least one); `None` when
/// it is not stored. An artifact deleted meanwhile ends its pieces with an error.
pub(super) async fn read_artifact(
    reads: &AnyPool,
    digest: &str,
    piece: usize,
) -> Result<Option<ArtifactPieces>, StoreError> {
    let Some(row) = query("SELECT size FROM artifacts WHERE digest = $1")
        .bind(digest)
        .fetch_optional(&mut *reads.acquire().await?)
        .await?
    else {
        return Ok(None);
    };
    let size: i64 = row.try_get("size")?;
    let size = u64::try_from(size)
        .map_err(|_| StoreError::Corrupt(format!("artifact {digest} has size {size}")))?;
    let piece = u64::try_from(piece.max(1)).unwrap_or(u64::MAX);
    let (tx, rx) = mpsc::channel(AHEAD);
    let reads = reads.clone();
    let digest = digest.to_owned();
    tokio::spawn(async move {
        let mut at = 0;
        while at < size {
            let len = piece.min(size - at);
            if !hand_over(&tx, read_piece(&reads, &digest, at, len).await).await {
                return;
            }
            at += len;
        }
    });
    Ok(Some(ArtifactPieces::read(size, rx)))
}

/// The `len` bytes of artifact `digest` from byte `at`.
async fn read_piece(
    reads: &AnyPool,
    digest: &str,
    at: u64,
    len: u64,
) -> Result<Vec<u8>, StoreError> {
    let position = |n: u64| {
        i64::try_from(n).map_err(|_| StoreError::Corrupt(format!("artifact {digest}: {n}")))
    };
    let row = query(
        "SELECT substring(bytes FROM CAST($2 AS INTEGER) FOR CAST($3 AS INTEGER)) AS piece \
         FROM artifacts WHERE digest = $1",
    )
    .bind(digest)
    .bind(position(at + 1)?)
    .bind(position(len)?)
    .fetch_optional(&mut *reads.acquire().await?)
    .await?
    .ok_or_else(|| StoreError::Unavailable {
        attempts: 1,
        last: format!("artifact {digest} was deleted while it was read"),
    })?;
    let piece: Vec<u8> = row.try_get("piece")?;
    if piece.len() as u64 != len {
        return Err(StoreError::Corrupt(format!(
            "artifact {digest}: {} bytes at {at}, not {len}",
            piece.len()
        )));
    }
    Ok(piece)
}
