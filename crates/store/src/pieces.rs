//! An artifact read in pieces ([`Artifacts::read_artifact`](crate::Artifacts::read_artifact)):
//! a worker fetching the Python runtime's 104.5 MB module is sent it a piece at a time, and
//! the store never holds it whole to do so.

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

/// The pieces of one artifact, in order, each at most the size asked for, read as they are
/// taken by a reader that stops when this is dropped.
#[derive(Debug)]
pub struct ArtifactPieces {
    size: u64,
    pieces: mpsc::Receiver<Result<Vec<u8>, StoreError>>,
    /// Bytes handed out so far.
    given: u64,
}

impl ArtifactPieces {
    /// An artifact of `size` bytes whose pieces come through `pieces`; an error ends them.
    pub(crate) fn read(size: u64, pieces: mpsc::Receiver<Result<Vec<u8>, StoreError>>) -> Self {
        ArtifactPieces {
            size,
            pieces,
            given: 0,
        }
    }

    /// The artifact's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The next piece; `None` after the last. After an error, nothing more comes.
    pub async fn next(&mut self) -> Option<Result<Vec<u8>, StoreError>> {
        match self.pieces.recv().await {
            Some(piece) => {
                if let Ok(piece) = &piece {
                    self.given += piece.len() as u64;
                }
                Some(piece)
            }
            // A reader that stopped short (it gave up waiting, or failed to start) is an
            // error, once: never a shorter artifact.
            None if self.given < self.size => {
                let short = StoreError::Unavailable {
                    attempts: 1,
                    last: format!(
                        "the artifact's read ended after {} of its {} bytes",
                        self.given, self.size
                    ),
                };
                self.given = self.size;
                Some(Err(short))
            }
            None => None,
        }
    }
}

/// A reader's hand-over of its next piece (or of why it has none): whether it goes on. It
/// stops after an error, when the one who asked has gone, or when the piece was not taken
/// within [`STALL`]; the pieces then end short, which their taker reports as an error.
pub(crate) async fn hand_over(
    pieces: &mpsc::Sender<Result<Vec<u8>, StoreError>>,
    piece: Result<Vec<u8>, StoreError>,
) -> bool {
    hand_over_within(pieces, piece, STALL).await
}

/// [`hand_over`], giving up after `stall`.
async fn hand_over_within(
    pieces: &mpsc::Sender<Result<Vec<u8>, StoreError>>,
    piece: Result<Vec<u8>, StoreError>,
    stall: Duration,
) -> bool {
    let failed = piece.is_err();
    let taken = tokio::time::timeout(stall, pieces.send(piece)).await;
    matches!(taken, Ok(Ok(()))) && !failed
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A stall short enough for a test to wait out.
    const SHORT: Duration = Duration::from_millis(50);

    #[tokio::test]
    async fn a_reader_gives_up_on_a_piece_not_taken_within_the_stall() {
        let (tx, rx) = mpsc::channel(1);
        // The piece ahead fits; the next waits for a taker that does not come.
        assert!(hand_over_within(&tx, Ok(vec![1]), SHORT).await);
        let waiting = std::time::Instant::now();
        assert!(!hand_over_within(&tx, Ok(vec![2]), SHORT).await);
        assert!(waiting.elapsed() >= SHORT);
        // The reader stopped there: its taker gets the piece before, then the short end.
        drop(tx);
        let mut pieces = ArtifactPieces::read(2, rx);
        assert_eq!(pieces.next().await.unwrap().unwrap(), [1]);
        let short = pieces.next().await.unwrap().unwrap_err();
        assert!(
            matches!(&short, StoreError::Unavailable { last, .. } if last.contains("after 1 of its 2 bytes")),
            "{short:?}"
        );
    }

    #[tokio::test]
    async fn a_reader_goes_on_while_its_pieces_are_taken_and_stops_otherwise() {
        let (tx, mut rx) = mpsc::channel(1);
        assert!(hand_over(&tx, Ok(vec![1])).await);
        // Taken after the reader began to wait: it goes on.
        let taker = tokio::spawn(async move {
            tokio::time::sleep(SHORT).await;
            let first = rx.recv().await;
            (first, rx)
        });
        assert!(hand_over(&tx, Ok(vec![2])).await);
        let (first, mut rx) = taker.await.unwrap();
        assert_eq!(first.unwrap().unwrap(), [1]);
        assert_eq!(rx.recv().await.unwrap().unwrap(), [2]);
        // An error is handed over, and ends the reading.
        let failed = StoreError::Corrupt("a piece could not be read".into());
        assert!(!hand_over(&tx, Err(failed)).await);
        assert!(rx.recv().await.unwrap().is_err());
        // The taker gone: nothing more is read.
        drop(rx);
        assert!(!hand_over(&tx, Ok(vec![3])).await);
    }
}
