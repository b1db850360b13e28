//! The gRPC port's connections, as h2 should write to them: a unary response in one write.
//!
//! h2 keeps a DATA frame's payload of 256 bytes or more out of its write buffer when the
//! connection takes vectored writes (a `writev` of the buffer and the payload), and then
//! buffers nothing more until that is written and the connection flushed. A response's
//! trailers, queued right after its DATA, so went out in a write of their own: under
//! `toolgrid bench calls` (responses of 250 to 300 bytes) each call's response was two TCP
//! segments, 279 and 10 bytes, the client woke for each (a response is whole only with its
//! trailers), and answered the pair with an ACK of its own.
//!
//! [`OneWrite`] says it takes no vectored writes, so h2 uses its other threshold, 1 KiB: a
//! smaller payload is copied into h2's buffer beside the frames around it, and the response
//! leaves in one `write`. A larger payload h2 writes in two parts (its buffer, then the rest
//! of the payload) and then flushes; `OneWrite` holds writes until a flush, up to
//! [`CAPACITY`], so those too leave in one `write`, as the `writev` did. h2 writes only in
//! its flush, which always ends with one of the connection: nothing waits in the buffer.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, BufWriter, ReadBuf};
use tonic::transport::server::Connected;

/// The most bytes held until a flush (h2's largest frame by default, and its frame head):
/// a write that does not fit goes out on its own, after what is held.
pub const CAPACITY: usize = 16 * 1024 + 64;

/// A connection whose writes go out at its flushes (see the module's docs).
#[derive(Debug)]
pub struct OneWrite<T>(BufWriter<T>);

impl<T: AsyncWrite> OneWrite<T> {
    pub fn new(inner: T) -> Self {
        OneWrite(BufWriter::with_capacity(CAPACITY, inner))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for OneWrite<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for OneWrite<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    // What h2 reads to choose its threshold; `poll_write_vectored` is the trait's default.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

impl<T: Connected + AsyncWrite> Connected for OneWrite<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncWriteExt;

    /// Records each write it is given.
    #[derive(Clone, Default)]
    struct Writes(Arc<Mutex<Vec<Vec<u8>>>>);

    impl AsyncWrite for Writes {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.0.lock().unwrap().push(buf.to_vec());
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn writes_leave_at_the_flush_in_one_write() {
        let writes = Writes::default();
        let mut conn = OneWrite::new(writes.clone());
        assert!(!conn.is_write_vectored(), "h2 must copy small payloads");
        // h2's buffer, then the rest of a large payload, then its flush.
        conn.write_all(&[1; 1024]).await.unwrap();
        conn.write_all(&[2; 3000]).await.unwrap();
        assert!(
            writes.0.lock().unwrap().is_empty(),
            "nothing before the flush"
        );
        conn.flush().await.unwrap();
        {
            let seen = writes.0.lock().unwrap();
            assert_eq!(seen.len(), 1);
            assert_eq!(seen[0].len(), 4024);
            assert_eq!(&seen[0][1020..1028], &[1, 1, 1, 1, 2, 2, 2, 2]);
        }
        // The trailers, flushed on their own, go on their own.
        conn.write_all(&[3; 10]).await.unwrap();
        conn.flush().await.unwrap();
        assert_eq!(writes.0.lock().unwrap()[1], vec![3; 10]);
    }

    #[tokio::test]
    async fn a_write_larger_than_the_buffer_goes_after_what_is_held() {
        let writes = Writes::default();
        let mut conn = OneWrite::new(writes.clone());
        conn.write_all(&[1; 100]).await.unwrap();
        conn.write_all(&vec![2; CAPACITY + 1]).await.unwrap();
        conn.flush().await.unwrap();
        let seen = writes.0.lock().unwrap();
        let sizes: Vec<usize> = seen.iter().map(Vec::len).collect();
        assert_eq!(sizes, vec![100, CAPACITY + 1]);
    }
}
