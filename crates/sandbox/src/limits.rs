//! Per-call sandbox limits: linear memory and the host's buffers for the call, stdout size,
//! and the stderr tail.
//!
//! Each limit that trips sets a flag on [`Tripwires`], so the runtime can name the exact
//! error kind whatever the guest did next (a guest may catch a failed write and loop on).
//! A limit the host enforces outside a guest's call into it (an outgoing request body that
//! streams too long, a response too large, host buffers beyond the memory limit) records its
//! failure on the tripwires: the guest is stopped at its next tick and the call ends with
//! that failure.

use bytes::{Bytes, BytesMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;
use toolgrid_core::error::ErrorKind;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Flags raised when a limit trips.
#[derive(Default, Debug)]
pub struct Tripwires {
    pub memory: AtomicBool,
    pub output: AtomicBool,
    /// The first limit the host tripped on the guest's behalf: the call's outcome.
    host: Mutex<Option<(ErrorKind, String)>>,
}

impl Tripwires {
    pub fn memory_tripped(&self) -> bool {
        self.memory.load(Ordering::SeqCst)
    }

    pub fn output_tripped(&self) -> bool {
        self.output.load(Ordering::SeqCst)
    }

    /// Ends the call with `kind` (the first trip wins): the guest is stopped at its next
    /// tick whatever it does with the error it was given meanwhile.
    pub fn trip(&self, kind: ErrorKind, message: impl Into<String>) {
        if kind == ErrorKind::MemoryLimit {
            self.memory.store(true, Ordering::SeqCst);
        }
        let mut host = self.host.lock().unwrap_or_else(|e| e.into_inner());
        if host.is_none() {
            *host = Some((kind, message.into()));
        }
    }

    /// The limit the host tripped, if any.
    pub fn host_tripped(&self) -> Option<(ErrorKind, String)> {
        self.host.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The error a guest's growth (or the host's buffers for it) beyond its memory limit traps
/// with.
#[derive(Debug, thiserror::Error)]
#[error(
    "memory limit of {limit} bytes exceeded ({requested} bytes asked for, {host} of them held \
     by the host for the call: unread responses and request bodies)"
)]
pub struct MemoryLimitExceeded {
    pub limit: u64,
    pub requested: u64,
    pub host: u64,
}

/// The memory of one call: its linear memories and tables (through [`MemoryLimiter`]) and
/// what the host buffers on its behalf (through [`CallMemory::reserve`]) share one limit.
#[derive(Debug)]
pub struct CallMemory {
    limit: u64,
    linear: AtomicU64,
    host: AtomicU64,
    trips: Arc<Tripwires>,
}

impl CallMemory {
    pub fn new(limit: u64, trips: Arc<Tripwires>) -> Arc<Self> {
        Arc::new(CallMemory {
            limit,
            linear: AtomicU64::default(),
            host: AtomicU64::default(),
            trips,
        })
    }

    /// Bytes the host holds for the call now.
    pub fn host_bytes(&self) -> u64 {
        self.host.load(Ordering::SeqCst)
    }

    fn exceeded(&self, requested: u64) -> MemoryLimitExceeded {
        let error = MemoryLimitExceeded {
            limit: self.limit,
            requested,
            host: self.host.load(Ordering::SeqCst),
        };
        self.trips.trip(ErrorKind::MemoryLimit, error.to_string());
        error
    }

    /// Counts `bytes` the host is about to hold for the call, until the returned guard drops.
    /// Refused (and the call's memory limit tripped) when it would pass the limit.
    pub fn reserve(self: &Arc<Self>, bytes: u64) -> Result<HostBytes, MemoryLimitExceeded> {
        let result = self
            .host
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |host| {
                let total = host
                    .saturating_add(bytes)
                    .saturating_add(self.linear.load(Ordering::SeqCst));
                (total <= self.limit).then_some(host.saturating_add(bytes))
            });
        match result {
            Ok(_) => Ok(HostBytes {
                memory: self.clone(),
                bytes,
            }),
            Err(host) => Err(self.exceeded(
                host.saturating_add(bytes)
                    .saturating_add(self.linear.load(Ordering::SeqCst)),
            )),
        }
    }
}

/// Bytes the host holds for a call; given back when dropped.
#[derive(Debug)]
pub struct HostBytes {
    memory: Arc<CallMemory>,
    bytes: u64,
}

impl HostBytes {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Counts `more` bytes on this reservation.
    pub fn grow(&mut self, more: u64) -> Result<(), MemoryLimitExceeded> {
        let extra = self.memory.reserve(more)?;
        self.bytes += extra.bytes;
        std::mem::forget(extra);
        Ok(())
    }
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        self.memory.host.fetch_sub(self.bytes, Ordering::SeqCst);
    }
}

/// Caps the sum of a call's linear memories (a component may have several) and the host's
/// buffers for it, and its tables.
pub struct MemoryLimiter {
    memory: Arc<CallMemory>,
}

impl MemoryLimiter {
    pub fn new(memory: Arc<CallMemory>) -> Self {
        MemoryLimiter { memory }
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
        let memory = &self.memory;
        let result = memory
            .linear
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |linear| {
                let total = linear
                    .saturating_add(growth)
                    .saturating_add(memory.host.load(Ordering::SeqCst));
                (total <= memory.limit).then_some(linear.saturating_add(growth))
            });
        match result {
            Ok(_) => Ok(true),
            Err(linear) => Err(memory
                .exceeded(
                    linear
                        .saturating_add(growth)
                        .saturating_add(memory.host.load(Ordering::SeqCst)),
                )
                .into()),
        }
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
        if buffer.len().saturating_add(bytes.len()) > self.limit {
            let error = OutputLimitExceeded {
                limit: self.limit as u64,
            };
            self.trips.output.store(true, Ordering::SeqCst);
            // A write that fails with an errno (preview 1) may be ignored by the guest: the
            // call still ends here, as output-limit.
            self.trips.trip(ErrorKind::OutputLimit, error.to_string());
            return Err(error);
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
        let mut limiter = MemoryLimiter::new(CallMemory::new(1 << 20, trips.clone()));
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
    fn host_buffers_share_the_memory_limit_and_are_given_back() {
        let trips = Arc::new(Tripwires::default());
        let memory = CallMemory::new(1 << 20, trips.clone());
        let mut limiter = MemoryLimiter::new(memory.clone());
        assert!(limiter.memory_growing(0, 512 << 10, None).unwrap());
        let held = memory.reserve(256 << 10).unwrap();
        assert_eq!(memory.host_bytes(), 256 << 10);
        // Linear memory cannot grow into what the host holds.
        assert!(limiter.memory_growing(512 << 10, 1 << 20, None).is_err());
        assert!(trips.memory_tripped());
        assert_eq!(
            trips.host_tripped().map(|(kind, _)| kind),
            Some(ErrorKind::MemoryLimit)
        );
        drop(held);
        assert_eq!(memory.host_bytes(), 0);
        let mut held = memory.reserve(300 << 10).unwrap();
        assert!(held.grow(300 << 10).is_err());
        held.grow(100 << 10).unwrap();
        assert_eq!(memory.host_bytes(), 400 << 10);
        drop(held);
        assert_eq!(memory.host_bytes(), 0);
        // A reservation larger than anything is refused without overflow.
        assert!(memory.reserve(u64::MAX).is_err());
        assert_eq!(memory.host_bytes(), 0);
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
