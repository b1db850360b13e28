//! A running call's program calls a tool (code mode): the worker's request is checked
//! against the session that holds the call, then handed to the [`NestedCaller`] (the
//! gateway, which sits above the scheduler and admits the child call as the parent's own
//! caller).

use super::Scheduler;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, Weak};
use toolgrid_core::call::{CallRecord, ErrorKind, NestedAnswer, NestedOutcome, NestedRequest};
use toolgrid_core::ids::{CallId, Epoch, WorkerId};
use toolgrid_proto as proto;
use tracing::Instrument as _;

/// Admits a program's tool call as a child of `parent` and answers when it ends.
#[async_trait::async_trait]
pub trait NestedCaller: Send + Sync {
    async fn call_nested(
        &self,
        parent: &CallRecord,
        seq: u64,
        request: NestedRequest,
    ) -> NestedAnswer;
}

/// The tool call requests of one worker stream being answered, by call and number. The
/// worker's door sends a request again only on a new stream; a request sent again on the
/// same stream while its first is answered is dropped, so a hostile worker cannot grow the
/// control plane's tasks and waits beyond one per call and number.
#[derive(Clone, Debug, Default)]
pub(crate) struct InFlight(Arc<Mutex<HashSet<(String, u64)>>>);

/// A request being answered; it leaves [`InFlight`] when dropped.
#[derive(Debug)]
pub(crate) struct Answering {
    set: InFlight,
    key: (String, u64),
}

impl InFlight {
    /// Request `seq` of `call` begins being answered, unless it already is.
    pub(crate) fn begin(&self, call: &str, seq: u64) -> Option<Answering> {
        let key = (call.to_string(), seq);
        self.set().insert(key.clone()).then(|| Answering {
            set: self.clone(),
            key,
        })
    }

    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<(String, u64)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.set.set().remove(&self.key);
    }
}

impl Scheduler {
    /// Where programs' tool calls go (held weakly: the gateway holds the scheduler).
    pub fn set_nested_caller(&self, caller: Weak<dyn NestedCaller>) {
        *self.nested.write().unwrap_or_else(|e| e.into_inner()) = Some(caller);
    }

    fn nested_caller(&self) -> Option<Arc<dyn NestedCaller>> {
        self.nested
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(Weak::upgrade)
    }

    /// Answers a worker's `ToolCallRequest`: only for a call the session holds under the
    /// request's epoch (`not-held`, `stale-epoch` otherwise, as `unavailable`: the worker's
    /// run is being taken away anyway).
    pub(crate) async fn nested_call(
        &self,
        worker: &WorkerId,
        session: u64,
        request: proto::ToolCallRequest,
    ) -> proto::ToolCallAnswer {
        let answer = self.nested_answer(worker, session, &request).await;
        proto::convert::nested_answer_to_wire(request.request_id, &answer)
    }

    async fn nested_answer(
        &self,
        worker: &WorkerId,
        session: u64,
        request: &proto::ToolCallRequest,
    ) -> NestedAnswer {
        let refused = |kind, message: String| NestedAnswer {
            call: None,
            outcome: NestedOutcome::error(kind, message),
        };
        let holding = self.lock().holding(
            &CallId::from(request.call_id.as_str()),
            worker,
            session,
            Epoch::from(request.epoch),
        );
        let parent = match holding {
            Ok(call) => call.record,
            Err(refusal) => {
                tracing::warn!(call = %request.call_id, worker = worker.as_str(), %refusal, "a tool call of a call the worker does not hold was refused");
                return refused(
                    ErrorKind::Unavailable,
                    format!("the worker does not hold the call ({refusal})"),
                );
            }
        };
        if !parent.spec.code_mode {
            tracing::warn!(call = %request.call_id, tool = %parent.tool, "a tool call of a tool that does not declare codeMode was refused");
            return refused(
                ErrorKind::PermissionDenied,
                format!(
                    "tool {} does not declare codeMode: its calls may not call other tools",
                    parent.tool
                ),
            );
        }
        // A hostile worker's request is bounded and checked like a guest's.
        let nested =
            match NestedRequest::from_wire(&request.tool, &request.command, &request.args_json) {
                Ok(nested) => nested,
                Err(message) => return refused(ErrorKind::InvalidArgument, message),
            };
        if request.seq == 0 || request.seq > toolgrid_core::call::MAX_NESTED_CALLS {
            return refused(
                ErrorKind::ToolCallLimit,
                format!("tool call number {} is out of range", request.seq),
            );
        }
        match self.nested_caller() {
            Some(caller) => {
                // Under the worker's span of the host call: the child call's admission,
                // run and completion join the parent call's trace.
                let span = tracing::info_span!("tool_call", parent = %parent.id, seq = request.seq, tool = %nested.tool, command = %nested.command);
                toolgrid_trace::adopt(&span, &request.traceparent);
                caller
                    .call_nested(&parent, request.seq, nested)
                    .instrument(span)
                    .await
            }
            None => refused(
                ErrorKind::Unavailable,
                "this control plane admits no tool calls from programs".into(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_sent_again_while_it_is_answered_is_dropped() {
        let in_flight = InFlight::default();
        let first = in_flight.begin("c1", 1).expect("the first is answered");
        assert!(in_flight.begin("c1", 1).is_none(), "sent again: dropped");
        let other = in_flight
            .begin("c1", 2)
            .expect("another number is another request");
        let elsewhere = in_flight.begin("c2", 1).expect("another call's");
        drop(first);
        assert!(
            in_flight.begin("c1", 1).is_some(),
            "once answered, it may come again"
        );
        drop((other, elsewhere));
        assert!(in_flight.set().is_empty());
    }

    /// A gateway that answers every request and remembers it was asked.
    #[derive(Default)]
    struct Answering(Mutex<Vec<u64>>);

    #[async_trait::async_trait]
    impl NestedCaller for Answering {
        async fn call_nested(
            &self,
            _parent: &CallRecord,
            seq: u64,
            _request: NestedRequest,
        ) -> NestedAnswer {
            self.0.lock().unwrap().push(seq);
            NestedAnswer {
                call: Some("child".into()),
                outcome: NestedOutcome::Value(serde_json::json!(1)),
            }
        }
    }

    #[tokio::test]
    async fn a_tool_call_of_a_call_the_session_does_not_hold_is_refused_unasked() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = toolgrid_store::open(&url).await.unwrap();
        let scheduler = Scheduler::new(
            store,
            Arc::new(crate::scheduler::CallWatch::default()),
            crate::scheduler::SchedulerConfig::default(),
        );
        let answering = Arc::new(Answering::default());
        let gateway: Arc<dyn NestedCaller> = answering.clone();
        scheduler.set_nested_caller(Arc::downgrade(&gateway));
        let request = proto::ToolCallRequest {
            call_id: "someone-elses".into(),
            epoch: 1,
            request_id: 7,
            seq: 1,
            tool: "fetch".into(),
            command: "get".into(),
            args_json: "{}".into(),
            traceparent: String::new(),
        };
        let answer = scheduler
            .nested_call(&WorkerId::from("w1"), 1, request)
            .await;
        assert!(!answer.ok);
        assert_eq!(answer.request_id, 7);
        assert_eq!(answer.error_kind, ErrorKind::Unavailable.as_str());
        assert!(answer.error_message.contains("does not hold"), "{answer:?}");
        assert!(answer.child_call_id.is_empty());
        assert!(
            answering.0.lock().unwrap().is_empty(),
            "the gateway was asked"
        );
    }
}
