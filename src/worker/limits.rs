//! Per-call sandbox limits: linear memory, stdout size, and the stderr tail.
//!
//! Each limit that trips sets a flag on [`Tripwires`], so the runtime can name the exact
//! error kind whatever the guest did next (a guest may catch a failed write and loop on).

use bytes::{Bytes, BytesMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Flags raised when a limit trips.
#[derive(Default, Debug)]
pub struct Tripwires {
    pub memory: AtomicBool,
    pub output: AtomicBool,
}

impl Tripwires {
    pub fn memory_tripped(&self) -> bool {
        self.memory.load(Ordering::SeqCst)
    }

    pub fn output_tripped(&self) -> bool {
        self.output.load(Ordering::SeqCst)
    }
}

/// The error a guest's growth beyond its memory limit traps with.
#[derive(Debug, thiserror::Error)]
#[error("memory limit of {limit} bytes exceeded (the guest asked for {requested} bytes)")]
pub struct MemoryLimitExceeded {
    pub limit: u64,
    pub requested: u64,
}

/// Caps the sum of a call's linear memories (a component may have several) and its tables.
pub struct MemoryLimiter {
    limit: u64,
    used: u64,
    trips: Arc<Tripwires>,
}

impl MemoryLimiter {
    pub fn new(limit: u64, trips: Arc<Tripwires>) -> Self {
        MemoryLimiter {
            limit,
            used: 0,
            trips,
        }
    }
}

impl wasmtime::ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current) as u64;
        let requested = self.used.saturating_add(growth);
        if requested > self.limit {
            self.trips.memory.store(true, Ordering::SeqCst);
            return Err(MemoryLimitExceeded {
                limit: self.limit,
                requested,
            }
            .into());
        }
        self.used = requested;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Tables hold references, not data; a generous fixed cap stops table bombs.
        Ok(desired <= 1_000_000)
    }
}

/// The error a write past the output limit traps with.
#[derive(Debug, thiserror::Error)]
#[error("output limit of {limit} bytes exceeded")]
pub struct OutputLimitExceeded {
    pub limit: u64,
}

/// A guest's stdout: kept whole up to `limit` bytes; a write beyond it trips the wire and
/// traps the guest.
#[derive(Clone)]
pub struct CappedOutput {
    buffer: Arc<Mutex<BytesMut>>,
    limit: usize,
    trips: Arc<Tripwires>,
}

impl CappedOutput {
    pub fn new(limit: u64, trips: Arc<Tripwires>) -> Self {
        CappedOutput {
            buffer: Arc::default(),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            trips,
        }
    }

    pub fn contents(&self) -> Bytes {
        self.buffer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .freeze()
    }

    fn push(&self, bytes: &[u8]) -> Result<(), OutputLimitExceeded> {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        if buffer.len() + bytes.len() > self.limit {
            self.trips.output.store(true, Ordering::SeqCst);
            return Err(OutputLimitExceeded {
                limit: self.limit as u64,
            });
        }
        buffer.extend_from_slice(bytes);
        Ok(())
    }
}

/// A guest's stderr: only the last `keep` bytes are kept; never fails.
#[derive(Clone)]
pub struct TailOutput {
    buffer: Arc<Mutex<BytesMut>>,
    keep: usize,
}

impl TailOutput {
    pub fn new(keep: usize) -> Self {
        TailOutput {
            buffer: Arc::default(),
            keep,
        }
    }

    pub fn contents(&self) -> Bytes {
        self.buffer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .freeze()
    }

    fn push(&self, bytes: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = &bytes[bytes.len().saturating_sub(self.keep)..];
        buffer.extend_from_slice(bytes);
        let excess = buffer.len().saturating_sub(self.keep);
        if excess > 0 {
            let _ = buffer.split_to(excess);
        }
    }
}

/// Both outputs behave as WASI output streams and as async writers.
trait Sink: Clone + Send + Sync + 'static {
    fn accept(&self, bytes: &[u8]) -> Result<(), OutputLimitExceeded>;
}

impl Sink for CappedOutput {
    fn accept(&self, bytes: &[u8]) -> Result<(), OutputLimitExceeded> {
        self.push(bytes)
    }
}

impl Sink for TailOutput {
    fn accept(&self, bytes: &[u8]) -> Result<(), OutputLimitExceeded> {
        self.push(bytes);
        Ok(())
    }
}

struct Stream<S>(S);

#[async_trait::async_trait]
impl<S: Sink> Pollable for Stream<S> {
    async fn ready(&mut self) {}
}

impl<S: Sink> OutputStream for Stream<S> {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.0
            .accept(&bytes)
            .map_err(|e| StreamError::Trap(wasmtime::Error::new(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(64 * 1024)
    }
}

impl<S: Sink> AsyncWrite for Stream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(
            self.0
                .accept(buf)
                .map(|()| buf.len())
                .map_err(std::io::Error::other),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

macro_rules! stdout_stream {
    ($ty:ty) => {
        impl IsTerminal for $ty {
            fn is_terminal(&self) -> bool {
                false
            }
        }

        impl StdoutStream for $ty {
            fn p2_stream(&self) -> Box<dyn OutputStream> {
                Box::new(Stream(self.clone()))
            }

            fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
                Box::new(Stream(self.clone()))
            }
        }
    };
}

stdout_stream!(CappedOutput);
stdout_stream!(TailOutput);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::ResourceLimiter;

    #[test]
    fn memory_limit_counts_every_memory_and_trips() {
        let trips = Arc::new(Tripwires::default());
        let mut limiter = MemoryLimiter::new(1 << 20, trips.clone());
        assert!(limiter.memory_growing(0, 512 << 10, None).unwrap());
        assert!(limiter.memory_growing(0, 256 << 10, None).unwrap());
        assert!(!trips.memory_tripped());
        let err = limiter
            .memory_growing(256 << 10, 768 << 10, None)
            .unwrap_err();
        assert!(err.downcast_ref::<MemoryLimitExceeded>().is_some());
        assert!(trips.memory_tripped());
    }

    #[test]
    fn stdout_is_capped_and_stderr_keeps_its_tail() {
        let trips = Arc::new(Tripwires::default());
        let out = CappedOutput::new(8, trips.clone());
        let mut stream = out.p2_stream();
        stream.write(Bytes::from_static(b"12345")).unwrap();
        assert!(stream.write(Bytes::from_static(b"6789")).is_err());
        assert!(trips.output_tripped());
        assert_eq!(&out.contents()[..], b"12345");

        let err = TailOutput::new(4);
        let mut stream = err.p2_stream();
        stream.write(Bytes::from_static(b"abcdef")).unwrap();
        stream.write(Bytes::from_static(b"gh")).unwrap();
        assert_eq!(&err.contents()[..], b"efgh");
    }
}
