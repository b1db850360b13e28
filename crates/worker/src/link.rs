//! The worker's side of one attachment: sending events and waiting for oplog acks.

use toolgrid_core::call::OplogEntry;
use toolgrid_sandbox::http::AppendError;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot, watch};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use toolgrid_proto::worker_link_client::WorkerLinkClient;
use toolgrid_proto::{self as proto, WorkerEvent, worker_event};

/// Puts the worker's bearer token on every `WorkerLink` request.
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// `authorization: Bearer TOKEN` (marked sensitive, so it is never logged); `None`
    /// sends no token. Fails when the token is not a valid header value.
    pub fn new(token: Option<&str>) -> Result<Self, String> {
        let Some(token) = token else {
            return Ok(Bearer(None));
        };
        let mut value: MetadataValue<Ascii> = format!("Bearer {}", token.trim())
            .parse()
            .map_err(|_| "the worker token holds characters a header cannot carry".to_string())?;
        value.set_sensitive(true);
        Ok(Bearer(Some(value)))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// Where a worker's token comes from.
#[derive(Clone, Default)]
pub enum WorkerCredential {
    /// No token (a control plane that takes none refuses this worker).
    #[default]
    None,
    Token(String),
    /// Read at every attach: the file may change (a restarted `toolgrid up` writes a new
    /// join token; a projected ServiceAccount token is rotated).
    File(PathBuf),
}

impl std::fmt::Debug for WorkerCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerCredential::None => f.write_str("None"),
            WorkerCredential::Token(_) => f.write_str("Token(..)"),
            WorkerCredential::File(path) => write!(f, "File({})", path.display()),
        }
    }
}

impl WorkerCredential {
    /// The token to present now (a file is read again each time).
    pub fn bearer(&self) -> Result<Bearer, String> {
        let token = match self {
            WorkerCredential::None => None,
            WorkerCredential::Token(token) => Some(token.clone()),
            WorkerCredential::File(path) => {
                Some(super::credential::read_token_file(path).map_err(|e| e.to_string())?)
            }
        };
        Bearer::new(token.as_deref())
    }
}

/// A `WorkerLink` client that authenticates every request.
pub type LinkClient = WorkerLinkClient<InterceptedService<Channel, Bearer>>;

/// A client on `channel` sending `bearer`.
pub fn link_client(channel: Channel, bearer: Bearer) -> LinkClient {
    WorkerLinkClient::with_interceptor(channel, bearer)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

/// One attachment's stream.
pub struct Link {
    tx: mpsc::Sender<WorkerEvent>,
    channel: Channel,
    credential: WorkerCredential,
    acks: Mutex<HashMap<u64, oneshot::Sender<proto::AppendAck>>>,
    /// Programs' tool calls waiting for their answer, by request id.
    answers: Mutex<HashMap<u64, oneshot::Sender<proto::ToolCallAnswer>>>,
    next_request: AtomicU64,
}

impl Link {
    pub fn new(
        tx: mpsc::Sender<WorkerEvent>,
        channel: Channel,
        credential: WorkerCredential,
    ) -> Self {
        Link {
            tx,
            channel,
            credential,
            acks: Mutex::default(),
            answers: Mutex::default(),
            next_request: AtomicU64::new(1),
        }
    }

    /// A client for other RPCs (artifact downloads) on this attachment's connection,
    /// presenting the token as it is now (a projected token is rotated while a stream
    /// lives).
    pub fn client(&self) -> Result<LinkClient, String> {
        Ok(link_client(self.channel.clone(), self.credential.bearer()?))
    }

    pub async fn send(&self, event: worker_event::Event) -> bool {
        self.tx
            .send(WorkerEvent { event: Some(event) })
            .await
            .is_ok()
    }

    /// Commits entries (numbered from `first_wseq` within the epoch) and waits until the
    /// control plane says they are durable. Entries too large for one message go as
    /// several appends, in order, each acknowledged before the next.
    pub async fn append(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<OplogEntry>,
    ) -> Result<(), AppendError> {
        let mut wseq = first_wseq;
        for batch in proto::link_batches(proto::entries_to_wire(&entries)) {
            let count = batch.len() as u64;
            self.append_one(call_id, epoch, wseq, batch).await?;
            wseq += count;
        }
        Ok(())
    }

    async fn append_one(
        &self,
        call_id: &str,
        epoch: u64,
        first_wseq: u64,
        entries: Vec<proto::OplogEntry>,
    ) -> Result<(), AppendError> {
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (ack_tx, ack_rx) = oneshot::channel();
        self.acks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(request_id, ack_tx);
        let append = proto::OplogAppend {
            call_id: call_id.to_string(),
            epoch,
            request_id,
            entries,
            sync: true,
            first_wseq,
        };
        if !self.send(worker_event::Event::Append(append)).await {
            self.acks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&request_id);
            return Err(AppendError::Unacknowledged("the stream is closed".into()));
        }
        match ack_rx.await {
            Ok(ack) if ack.ok => Ok(()),
            // Not (or no longer) this session's call under this epoch.
            Ok(ack) if ack.error == "stale-epoch" || ack.error == "not-held" => {
                Err(AppendError::Fenced)
            }
            Ok(ack) => Err(AppendError::Unacknowledged(ack.error)),
            Err(_) => Err(AppendError::Unacknowledged(
                "the stream closed before the ack".into(),
            )),
        }
    }

    pub fn acknowledge(&self, ack: proto::AppendAck) {
        if let Some(waiter) = self
            .acks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ack.request_id)
        {
            let _ = waiter.send(ack);
        }
    }

    /// Sends a program's tool call and waits for its answer; `None` when the stream closed
    /// first (the caller sends it again on the next attachment: the control plane finds the
    /// same child call).
    pub async fn tool_call(
        &self,
        mut request: proto::ToolCallRequest,
    ) -> Option<proto::ToolCallAnswer> {
        let request_id = self.next_request.fetch_add(1, Ordering::Relaxed);
        request.request_id = request_id;
        let (tx, rx) = oneshot::channel();
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(request_id, tx);
        if !self.send(worker_event::Event::ToolCall(request)).await {
            self.answers
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&request_id);
            return None;
        }
        rx.await.ok()
    }

    pub fn answer(&self, answer: proto::ToolCallAnswer) {
        if let Some(waiter) = self
            .answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&answer.request_id)
        {
            let _ = waiter.send(answer);
        }
    }

    /// Fails every append and tool call still waiting: the stream is gone.
    pub fn close(&self) {
        self.acks.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.answers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// The current attachment, if any; calls outlive attachments.
#[derive(Clone)]
pub struct LinkSlot {
    current: Arc<watch::Sender<Option<Arc<Link>>>>,
}

impl LinkSlot {
    pub fn new() -> Self {
        LinkSlot {
            current: Arc::new(watch::Sender::new(None)),
        }
    }

    pub fn get(&self) -> Option<Arc<Link>> {
        self.current.borrow().clone()
    }

    pub fn set(&self, link: Arc<Link>) {
        self.current.send_replace(Some(link));
    }

    pub fn clear(&self) {
        self.current.send_replace(None);
    }

    /// Waits until an attachment other than `previous` is current, and returns it.
    pub async fn next_after(&self, previous: Option<&Arc<Link>>) -> Arc<Link> {
        let mut watch = self.current.subscribe();
        loop {
            if let Some(link) = watch.borrow_and_update().clone()
                && previous.is_none_or(|p| !Arc::ptr_eq(p, &link))
            {
                return link;
            }
            // The sender lives as long as this slot.
            if watch.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Default for LinkSlot {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    fn sent(credential: &WorkerCredential) -> Option<String> {
        let mut bearer = credential.bearer().expect("a bearer");
        let request = bearer.call(tonic::Request::new(())).unwrap();
        request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap().to_string())
    }

    #[test]
    fn a_token_file_is_read_again_for_every_request_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("join-token");
        std::fs::write(&path, "first\n").unwrap();
        let credential = WorkerCredential::File(path.clone());
        assert_eq!(sent(&credential).as_deref(), Some("Bearer first"));
        std::fs::write(&path, "second").unwrap();
        assert_eq!(sent(&credential).as_deref(), Some("Bearer second"));
        std::fs::remove_file(&path).unwrap();
        assert!(credential.bearer().is_err());

        assert_eq!(sent(&WorkerCredential::None), None);
        let token = WorkerCredential::Token("s3cret".into());
        assert_eq!(sent(&token).as_deref(), Some("Bearer s3cret"));
        assert!(!format!("{token:?}").contains("s3cret"));
        assert!(
            WorkerCredential::Token("line\nbreak".into())
                .bearer()
                .is_err(),
            "a token a header cannot carry"
        );
    }
}
