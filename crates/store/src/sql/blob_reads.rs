//! Artifacts read in pieces on SQLite ([`Artifacts::read_artifact`](crate::Artifacts::read_artifact)):
//! a read-only connection of the read's own, on a blocking thread, reads the blob through
//! SQLite's incremental blob I/O a piece at a time, at most [`AHEAD`] pieces ahead of the
//! one who asked, and gives up when a piece is not taken within [`STALL`](crate::pieces::STALL).
//!
//! Read through sqlx, SQLite copied the whole blob out of its pages, and sqlx copied it
//! again into the row's value: a worker fetching the Python runtime's 104.5 MB module made
//! a control plane hold it two and three times over for a moment.

use super::native::database;
use crate::StoreError;
use crate::pieces::{AHEAD, ArtifactPieces, hand_over};
use rusqlite::{OpenFlags, OptionalExtension};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// The SQLite database a store reads blobs from.
#[derive(Clone, Debug)]
pub(super) struct SqliteFile {
    pub(super) path: PathBuf,
    pub(super) busy_timeout: Duration,
}

impl SqliteFile {
    /// Reads artifact `digest` in pieces of at most `piece` bytes (at least one); `None`
    /// when it is not stored. The pieces are one read transaction's: a deletion meanwhile
    /// does not cut them short.
    pub(super) async fn read_artifact(
        &self,
        digest: &str,
        piece: usize,
    ) -> Result<Option<ArtifactPieces>, StoreError> {
        let (found_tx, found) = oneshot::channel();
        let (pieces_tx, pieces) = mpsc::channel(AHEAD);
        let file = self.clone();
        let digest = digest.to_owned();
        let piece = piece.max(1);
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let conn = match file.open() {
                Ok(conn) => conn,
                Err(error) => {
                    let _ = found_tx.send(Err(error));
                    return;
                }
            };
            // One transaction for the lookup and the blob: what the lookup found is what
            // the blob reads, whatever is deleted meanwhile.
            let read = match conn.unchecked_transaction() {
                Ok(read) => read,
                Err(error) => {
                    let _ = found_tx.send(Err(database(error)));
                    return;
                }
            };
            let found = read
                .query_row(
                    "SELECT rowid FROM artifacts WHERE digest = ?1",
                    [&digest],
                    |row| row.get::<_, i64>(0),
                )
                .optional()
                .and_then(|rowid| {
                    rowid
                        .map(|rowid| {
                            read.blob_open(rusqlite::MAIN_DB, "artifacts", "bytes", rowid, true)
                        })
                        .transpose()
                });
            let blob = match found {
                Ok(Some(blob)) => blob,
                Ok(None) => {
                    let _ = found_tx.send(Ok(None));
                    return;
                }
                Err(error) => {
                    let _ = found_tx.send(Err(database(error)));
                    return;
                }
            };
            let size = blob.len();
            if found_tx.send(Ok(Some(size as u64))).is_err() {
                return;
            }
            let mut at = 0;
            while at < size {
                let mut next = vec![0; piece.min(size - at)];
                let read = blob.read_at_exact(&mut next, at).map_err(database);
                at += next.len();
                if !runtime.block_on(hand_over(&pieces_tx, read.map(|()| next))) {
                    return;
                }
            }
        });
        match found.await {
            Ok(Ok(Some(size))) => Ok(Some(ArtifactPieces::read(size, pieces))),
            Ok(Ok(None)) => Ok(None),
            Ok(Err(error)) => Err(error),
            Err(_) => Err(StoreError::Closed),
        }
    }

    /// A read-only connection to the database.
    fn open(&self) -> Result<rusqlite::Connection, StoreError> {
        let conn = rusqlite::Connection::open_with_flags(
            &self.path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(database)?;
        conn.busy_timeout(self.busy_timeout).map_err(database)?;
        Ok(conn)
    }
}
