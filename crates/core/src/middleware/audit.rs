//! Audit records: built from a call (or a refusal), with excluded arguments left out.
//!
//! Every call gets exactly one record: an ended call's is written by the store in the
//! commit that ends it ([`record_of`]), a refused call's by the gateway when it refuses it.
//! The call's audit steps ([`AuditOptions`], fixed at admission) leave arguments out and
//! can copy the record to the control plane's stdout as one JSON line ([`stdout_line`]).

use crate::call::{AuditOptions, AuditOutcome, AuditRecord, CallRecord, CallState};
use serde_json::Value;

/// The name in `excludeArgs` that leaves out every argument.
pub const ALL_ARGS: &str = "*";

/// The audit record of a call that ended (succeeded or failed) at `at_ms`. Its arguments
/// are the call's, less the ones its audit steps exclude; a call still in flight reads as
/// failed (only ended calls are audited).
pub fn record_of(call: &CallRecord, at_ms: i64) -> AuditRecord {
    let excluded = call
        .spec
        .chain
        .audit
        .as_ref()
        .map(|a| a.exclude_args.as_slice())
        .unwrap_or(&[]);
    let outcome = match (call.state, &call.error) {
        (CallState::Succeeded, _) => AuditOutcome::Succeeded,
        _ => AuditOutcome::Failed,
    };
    AuditRecord {
        call_id: call.id.clone(),
        at_ms,
        namespace: call.namespace.clone(),
        agent: call.spec.access.agent.clone().unwrap_or_default(),
        caller: call.spec.caller.clone(),
        tool: call.tool.clone(),
        command: call.command.clone(),
        args: exclude_args(&call.args, excluded),
        decisions: call.spec.chain.decisions.clone(),
        outcome,
        error_kind: call.error.as_ref().map(|e| e.kind),
        error_message: call
            .error
            .as_ref()
            .map(|e| e.message.clone())
            .unwrap_or_default(),
        duration_ms: (call.finished_at_ms.unwrap_or(at_ms) - call.created_at_ms).max(0),
        dry_run: call.spec.dry_run,
    }
}

/// `args` less the arguments named in `excluded`: `null` when `excluded` holds `"*"`.
/// Arguments that are not an object are kept whole unless everything is excluded.
pub fn exclude_args(args: &Value, excluded: &[String]) -> Value {
    if excluded.iter().any(|e| e == ALL_ARGS) {
        return Value::Null;
    }
    match args {
        Value::Object(map) if !excluded.is_empty() => Value::Object(
            map.iter()
                .filter(|(k, _)| !excluded.iter().any(|e| e == *k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The record as one JSON line for stdout, when the call's audit steps ask for it.
pub fn stdout_line(options: Option<&AuditOptions>, record: &AuditRecord) -> Option<String> {
    options
        .filter(|o| o.stdout)
        .and_then(|_| serde_json::to_string(record).ok())
}

/// Reads a `since` bound for listing audit records, relative to `now_ms`: a duration back
/// from now (`10m`, `2h`, `1h 30m`), an RFC 3339 time (`2026-01-02T03:04:05Z`), or Unix
/// milliseconds. Empty means no bound.
pub fn parse_since(text: &str, now_ms: i64) -> Result<Option<i64>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(Some(ms));
    }
    if let Ok(ago) = humantime::parse_duration(text) {
        let ago = i64::try_from(ago.as_millis()).unwrap_or(i64::MAX);
        return Ok(Some(now_ms.saturating_sub(ago)));
    }
    match humantime::parse_rfc3339_weak(text) {
        Ok(at) => {
            let ms = at
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
                .unwrap_or(0);
            Ok(Some(ms))
        }
        Err(_) => Err(format!(
            "since {text:?} is neither a duration (10m), an RFC 3339 time nor Unix milliseconds"
        )),
    }
}

/// Writes one audit line to stdout, whole (the lock keeps concurrent lines apart). A
/// stdout that is closed or full loses the line rather than failing the call (`println!`
/// would panic); the store keeps the record either way.
pub fn print_line(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::{
        CallError, CallSpec, ChainRecord, Decision, ErrorKind, Filesystem, StepKind, Verdict,
    };
    use crate::fixtures::{access, record};
    use serde_json::json;

    fn call(state: CallState, error: Option<CallError>, exclude: &[&str]) -> CallRecord {
        let spec = CallSpec {
            access: access("ranger", Filesystem::None),
            caller: "agent:default/ranger".into(),
            dry_run: true,
            chain: ChainRecord {
                decisions: vec![Decision {
                    middleware: "audit-all".into(),
                    kind: StepKind::Audit,
                    verdict: Verdict::Applied,
                    message: String::new(),
                }],
                audit: Some(AuditOptions {
                    exclude_args: exclude.iter().map(|s| s.to_string()).collect(),
                    stdout: false,
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        CallRecord {
            tool: "semver".into(),
            command: "bump".into(),
            release: "semver-1.0.0".into(),
            release_digest: String::new(),
            state,
            args: json!({"version": "1.0.0", "token": "t0p"}),
            spec,
            epoch: 1,
            error,
            created_at_ms: 1_000,
            finished_at_ms: Some(1_250),
            ..record("c1")
        }
    }

    #[test]
    fn a_succeeded_call() {
        let r = record_of(&call(CallState::Succeeded, None, &["token"]), 2_000);
        assert_eq!(r.call_id, "c1");
        assert_eq!(r.at_ms, 2_000);
        assert_eq!(r.outcome, AuditOutcome::Succeeded);
        assert_eq!(r.agent, "ranger");
        assert_eq!(r.caller, "agent:default/ranger");
        assert_eq!((r.tool.as_str(), r.command.as_str()), ("semver", "bump"));
        assert_eq!(r.args, json!({"version": "1.0.0"}));
        assert_eq!(r.duration_ms, 250);
        assert!(r.dry_run);
        assert_eq!(r.decisions.len(), 1);
        assert_eq!(r.error_kind, None);
        assert_eq!(r.error_message, "");
    }

    #[test]
    fn a_failed_call() {
        let error = CallError::new(ErrorKind::Timeout, "too slow");
        let mut c = call(CallState::Failed, Some(error), &["*"]);
        c.finished_at_ms = None;
        let r = record_of(&c, 1_600);
        assert_eq!(r.outcome, AuditOutcome::Failed);
        assert_eq!(r.error_kind, Some(ErrorKind::Timeout));
        assert_eq!(r.error_message, "too slow");
        assert_eq!(r.args, Value::Null);
        assert_eq!(r.duration_ms, 600, "unfinished: up to at_ms");
    }

    #[test]
    fn excluding_arguments() {
        let args = json!({"a": 1, "b": 2});
        assert_eq!(exclude_args(&args, &[]), args);
        assert_eq!(exclude_args(&args, &["b".into()]), json!({"a": 1}));
        assert_eq!(exclude_args(&args, &["*".into()]), Value::Null);
        assert_eq!(exclude_args(&json!([1]), &["a".into()]), json!([1]));
        assert_eq!(exclude_args(&json!([1]), &["*".into()]), Value::Null);
    }

    #[test]
    fn since_bounds() {
        let now = 1_700_000_000_000;
        assert_eq!(parse_since("", now), Ok(None));
        assert_eq!(parse_since("10m", now), Ok(Some(now - 600_000)));
        assert_eq!(parse_since("1h 30m", now), Ok(Some(now - 5_400_000)));
        assert_eq!(parse_since("12345", now), Ok(Some(12_345)));
        assert_eq!(
            parse_since("2023-11-14T22:13:20Z", now),
            Ok(Some(1_700_000_000_000))
        );
        assert!(
            parse_since("yesterday", now)
                .unwrap_err()
                .contains("yesterday")
        );
    }

    #[test]
    fn stdout_only_when_asked() {
        let r = record_of(&call(CallState::Succeeded, None, &[]), 2_000);
        assert_eq!(stdout_line(None, &r), None);
        let off = AuditOptions::default();
        assert_eq!(stdout_line(Some(&off), &r), None);
        let on = AuditOptions {
            stdout: true,
            ..Default::default()
        };
        let line = stdout_line(Some(&on), &r).unwrap();
        assert!(!line.contains('\n'));
        let back: AuditRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, r);
    }
}
