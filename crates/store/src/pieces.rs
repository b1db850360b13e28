//! An artifact read in pieces ([`Artifacts::read_artifact`](crate::Artifacts::read_artifact)):
//! a worker fetching the Python runtime's 104.5 MB module is sent it a piece at a time, and
//! the store that can (SQLite) never holds it whole to do so.

use crate::StoreError;
use std::time::Duration;
use tokio::sync::mpsc;

/// Pieces a reader reads before the one who asked takes them.
pub(crate) const AHEAD: usize = 2;

/// How long a piece waits to be taken before its reader gives up: a reader holds a read
/// transaction (SQLite, where it keeps the write-ahead log from starting over) or a task
/// and the pool's connections (PostgreSQL), so one who stops taking pieces (a worker
/// stalled, or hostile) must not hold them for good.
pub(crate) const STALL: Duration = Duration::from_secs(30);

/// The pieces of one artifact, in order, each at most the size asked for.
#[derive(Debug)]
pub struct ArtifactPieces {
    size: u64,
    from: From,
}

#[derive(Debug)]
enum From {
    /// The bytes read whole (a store that cannot read a blob in pieces): handed out a
    /// piece at a time.
    Whole {
        bytes: Vec<u8>,
        at: usize,
        piece: usize,
    },
    /// Pieces read as they are asked for, by a reader that stops when this is dropped;
    /// `given` bytes so far.
    Read {
        pieces: mpsc::Receiver<Result<Vec<u8>, StoreError>>,
        given: u64,
    },
}

impl ArtifactPieces {
    /// `bytes`, handed out in pieces of at most `piece` bytes (at least one).
    pub fn whole(bytes: Vec<u8>, piece: usize) -> Self {
        ArtifactPieces {
            size: bytes.len() as u64,
            from: From::Whole {
                bytes,
                at: 0,
                piece: piece.max(1),
            },
        }
    }

    /// An artifact of `size` bytes whose pieces come through `pieces`; an error ends them.
    pub(crate) fn read(size: u64, pieces: mpsc::Receiver<Result<Vec<u8>, StoreError>>) -> Self {
        ArtifactPieces {
            size,
            from: From::Read { pieces, given: 0 },
        }
    }

    /// The artifact's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The next piece; `None` after the last. After an error, nothing more comes.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>, StoreError>> {
        match &mut self.from {
            From::Whole { bytes, at, piece } => {
                let rest = bytes.get(*at..).filter(|rest| !rest.is_empty())?;
                let next = rest[..rest.len().min(*piece)].to_vec();
                *at += next.len();
                Some(Ok(next))
            }
            From::Read { pieces, given } => match pieces.recv().await {
                Some(piece) => {
                    if let Ok(piece) = &piece {
                        *given += piece.len() as u64;
                    }
                    Some(piece)
                }
                // A reader that stopped short (it gave up waiting, or failed to start) is
                // an error, once: never a shorter artifact.
                None if *given < self.size => {
                    let short = StoreError::Unavailable {
                        attempts: 1,
                        last: format!(
                            "the artifact's read ended after {given} of its {} bytes",
                            self.size
                        ),
                    };
                    *given = self.size;
                    Some(Err(short))
                }
                None => None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn whole_bytes_come_out_in_pieces_of_at_most_the_size_asked() {
        let mut pieces = ArtifactPieces::whole((0..10u8).collect(), 4);
        assert_eq!(pieces.size(), 10);
        let mut got = Vec::new();
        while let Some(piece) = pieces.next().await {
            got.push(piece.unwrap());
        }
        assert_eq!(got, [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]);

        let mut empty = ArtifactPieces::whole(Vec::new(), 4);
        assert!(empty.next().await.is_none());
    }

    #[tokio::test]
    async fn pieces_that_end_short_end_with_an_error_once() {
        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok(vec![1, 2, 3])).await.unwrap();
        drop(tx);
        let mut pieces = ArtifactPieces::read(10, rx);
        assert_eq!(pieces.next().await.unwrap().unwrap(), [1, 2, 3]);
        let short = pieces.next().await.unwrap().unwrap_err();
        assert!(
            matches!(&short, StoreError::Unavailable { last, .. } if last.contains("after 3 of its 10 bytes")),
            "{short:?}"
        );
        assert!(pieces.next().await.is_none());

        let (tx, rx) = mpsc::channel(4);
        tx.send(Ok(vec![1, 2])).await.unwrap();
        drop(tx);
        let mut whole = ArtifactPieces::read(2, rx);
        assert_eq!(whole.next().await.unwrap().unwrap(), [1, 2]);
        assert!(whole.next().await.is_none());
    }
}
