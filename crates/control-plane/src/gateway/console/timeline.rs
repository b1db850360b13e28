//! A call's oplog as a readable sequence: one line per entry with its time offset from the
//! call's start, its kind and a sentence (pure; no IO, no HTML).

use std::collections::HashMap;
use toolgrid_core::call::{Ended, OplogEntry, OplogRecord};

/// One line of a call's timeline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    pub seq: u64,
    /// Milliseconds after the call was created (negative only for a skewed clock).
    pub offset_ms: i64,
    /// The entry's kind as the oplog names it (`assigned`, `http-request`, ...).
    pub kind: String,
    /// What happened, in words.
    pub summary: String,
}

/// The timeline of a call created at `created_at_ms` with these oplog entries.
///
/// An HTTP response names the request it answers (method and URL); an entry that no
/// longer parses is shown as unreadable, with its stored payload.
pub fn timeline(created_at_ms: i64, records: &[OplogRecord]) -> Vec<Line> {
    let mut requests: HashMap<u64, (String, String)> = HashMap::new();
    records
        .iter()
        .map(|record| {
            let summary = match record.entry() {
                Ok(entry) => {
                    if let OplogEntry::HttpRequest(request) = &entry {
                        requests.insert(request.seq, (request.method.clone(), request.url.clone()));
                    }
                    summarize(&entry, &requests)
                }
                Err(error) => format!("unreadable entry ({error}): {}", record.payload),
            };
            Line {
                seq: record.seq,
                offset_ms: record.recorded_at_ms - created_at_ms,
                kind: record.kind.clone(),
                summary,
            }
        })
        .collect()
}

/// The line that ends a timeline cut at one page: the entries from seq `next` on are
/// not shown here.
pub fn more(next: u64, last: Option<&Line>) -> Line {
    Line {
        seq: next,
        offset_ms: last.map_or(0, |l| l.offset_ms),
        kind: "more".to_string(),
        summary: format!(
            "the timeline shows the oplog's first page; read entries from seq {next} on with `toolgrid oplog` or the API"
        ),
    }
}

fn request_name(requests: &HashMap<u64, (String, String)>, seq: u64) -> String {
    match requests.get(&seq) {
        Some((method, url)) => format!("HTTP {method} {url}"),
        None => format!("HTTP request {seq}"),
    }
}

/// One entry in words.
fn summarize(entry: &OplogEntry, requests: &HashMap<u64, (String, String)>) -> String {
    match entry {
        OplogEntry::CallStarted(started) => {
            let mut text = format!(
                "admitted: {}/{} {} (release {} version {}){}",
                started.namespace,
                started.tool,
                started.command,
                started.release,
                started.version,
                if started.dry_run { ", dry run" } else { "" }
            );
            for decision in &started.middleware {
                let name = if decision.middleware.is_empty() {
                    "built-in".to_string()
                } else {
                    decision.middleware.clone()
                };
                text.push_str(&format!(
                    "; {name} ({}): {}",
                    decision.kind,
                    verdict_name(decision.verdict)
                ));
                if !decision.message.is_empty() {
                    text.push_str(&format!(" ({})", decision.message));
                }
            }
            text
        }
        OplogEntry::Assigned(assigned) => format!(
            "assigned to worker {} epoch {}",
            assigned.worker, assigned.epoch
        ),
        OplogEntry::Fenced(fenced) => format!(
            "fenced (epoch {} ended): {}",
            fenced.previous_epoch, fenced.reason
        ),
        OplogEntry::Replay(replay) => format!(
            "replay on worker {} (attempt {}, epoch {}): {} recorded host calls",
            replay.worker, replay.attempt, replay.epoch, replay.entries
        ),
        OplogEntry::ToolCall(call) => format!(
            "tool call {}: {}.{} (child key {})",
            call.seq, call.tool, call.command, call.idempotency_key
        ),
        OplogEntry::ToolResult(result) => {
            let child = result.call.as_deref().unwrap_or("none recorded");
            match &result.outcome {
                toolgrid_core::call::NestedOutcome::Value(_) => {
                    format!(
                        "tool call {} \u{2192} succeeded (child call {child})",
                        result.seq
                    )
                }
                toolgrid_core::call::NestedOutcome::Error(error) => format!(
                    "tool call {} \u{2192} {}: {} (child call {child})",
                    result.seq, error.kind, error.message
                ),
            }
        }
        OplogEntry::WallClock(_) => "host call: wall clock read".to_string(),
        OplogEntry::MonotonicClock(_) => "host call: monotonic clock read".to_string(),
        OplogEntry::Random(random) => format!(
            "host call: {} random bytes ({})",
            random.bytes.len(),
            random.source.as_str()
        ),
        OplogEntry::HttpRequest(request) => format!(
            "HTTP {} {} (request {}, attempt {}, {} body bytes)",
            request.method, request.url, request.seq, request.attempt, request.body_bytes
        ),
        OplogEntry::HttpResponse(response) => format!(
            "{} \u{2192} {}",
            request_name(requests, response.seq),
            response.status
        ),
        OplogEntry::HttpError(error) => format!(
            "{} \u{2192} error: {}",
            request_name(requests, error.seq),
            error.message
        ),
        OplogEntry::HttpDenied(denied) => format!(
            "{} \u{2192} denied: {}",
            request_name(requests, denied.seq),
            denied.message
        ),
        OplogEntry::Progress(progress) => format!("progress: {}", progress.message),
        OplogEntry::Approval(decision) => {
            let verb = if decision.approved {
                "approved"
            } else {
                "denied"
            };
            if decision.reason.is_empty() {
                format!("approval: {verb} by {}", decision.by)
            } else {
                format!("approval: {verb} by {}: {}", decision.by, decision.reason)
            }
        }
        OplogEntry::Retry(retry) => format!(
            "attempt {} failed {}: {}; retrying in {} ms",
            retry.attempt, retry.error.kind, retry.error.message, retry.backoff_ms
        ),
        OplogEntry::Outcome(outcome) => match (outcome.state, &outcome.error) {
            (Ended::Succeeded, _) => "outcome: succeeded".to_string(),
            (Ended::Failed, Some(error)) => {
                format!("outcome: failed {}: {}", error.kind, error.message)
            }
            (Ended::Failed, None) => "outcome: failed".to_string(),
        },
    }
}

fn verdict_name(verdict: toolgrid_core::call::Verdict) -> &'static str {
    use toolgrid_core::call::Verdict;
    match verdict {
        Verdict::Allow => "allow",
        Verdict::Deny => "deny",
        Verdict::Rewrite => "rewrite",
        Verdict::AwaitApproval => "await approval",
        Verdict::Applied => "applied",
        Verdict::Error => "error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn record(seq: u64, at: i64, payload: Value) -> OplogRecord {
        OplogRecord {
            seq,
            epoch: 1,
            kind: payload["kind"].as_str().unwrap_or("bogus").to_string(),
            payload: payload.to_string(),
            recorded_at_ms: at,
        }
    }

    #[test]
    fn entries_read_as_sentences() {
        let records = vec![
            record(
                1,
                1_250,
                json!({"kind": "approval", "approved": true, "by": "operator:admin", "atMs": 1_250, "reason": "looks fine"}),
            ),
            record(
                2,
                1_300,
                json!({"kind": "assigned", "worker": "w-1", "epoch": 3}),
            ),
            record(
                3,
                1_400,
                json!({"kind": "fenced", "reason": "worker lost", "previousEpoch": 3}),
            ),
            record(4, 2_000, json!({"kind": "outcome", "state": "succeeded"})),
        ];
        let lines = timeline(1_000, &records);
        let summaries: Vec<&str> = lines.iter().map(|l| l.summary.as_str()).collect();
        assert_eq!(
            summaries,
            [
                "approval: approved by operator:admin: looks fine",
                "assigned to worker w-1 epoch 3",
                "fenced (epoch 3 ended): worker lost",
                "outcome: succeeded",
            ]
        );
        assert_eq!(lines[0].offset_ms, 250);
        assert_eq!(lines[3].offset_ms, 1_000);
        assert_eq!(lines[1].kind, "assigned");
    }

    #[test]
    fn a_response_names_its_request() {
        let request = json!({
            "kind": "http-request", "seq": 1, "method": "GET", "url": "https://example.test/a",
            "headers": [], "bodySha256": "", "bodyBytes": 0, "idempotencyKey": "k", "attempt": 1
        });
        let response = json!({"kind": "http-response", "seq": 1, "status": 404, "headers": [], "bodyBase64": ""});
        let lines = timeline(0, &[record(1, 0, request), record(2, 0, response)]);
        assert_eq!(
            lines[1].summary,
            "HTTP GET https://example.test/a \u{2192} 404"
        );
    }

    #[test]
    fn a_failed_outcome_names_its_kind_and_an_unreadable_entry_is_shown() {
        let failed = json!({"kind": "outcome", "state": "failed", "error": {"kind": "approval-timeout", "message": "nobody decided"}});
        let broken = OplogRecord {
            seq: 2,
            epoch: 0,
            kind: "assigned".into(),
            payload: "{not json".into(),
            recorded_at_ms: 0,
        };
        let lines = timeline(0, &[record(1, 0, failed), broken]);
        assert_eq!(
            lines[0].summary,
            "outcome: failed approval-timeout: nobody decided"
        );
        assert!(lines[1].summary.starts_with("unreadable entry"));
        assert!(lines[1].summary.ends_with("{not json"));
    }
}
