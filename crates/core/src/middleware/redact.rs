//! Redaction of results and error text: the union of a call's redact steps
//! ([`RedactRules`], fixed at admission) applied by the control plane when a worker's
//! result arrives, before the result and the error are stored or returned.
//!
//! - **paths** are JSON pointers into the result (`/token`, `/items/0/secret`); the value
//!   there (a string, a number, an object, anything) becomes the replacement string. A
//!   pointer that names nothing is skipped; `""` names the whole result.
//! - **patterns** are regular expressions (Rust `regex` syntax) applied, after the paths, to
//!   every string of the result, **object keys included** (a secret can be a key as well as
//!   a value; two keys that redact to the same text keep the later value), and to error
//!   text: [`CallError::message`] and [`CallError::stderr_tail`]. Every match becomes the
//!   replacement, taken literally (`$1` is not expanded).
//!
//! What is *stored* redacted is the result and the error text. The oplog is stored raw (a
//! replay needs the exact responses and reports), and every copy of it an agent reads
//! passes [`Redactor::redact_record`] on the way out (see [`Redactor::redact_entry`] for
//! which fields). The arguments a call was made with are kept and shown as the caller sent
//! them.

use crate::call::{CallError, OplogEntry, OplogRecord, RedactRules};
use serde_json::{Map, Value};

/// Replacement text of a redact step that names none.
pub const DEFAULT_REDACTION: &str = "[REDACTED]";

/// Bound on the compiled size of one pattern (and of its lazy DFA): a pattern that needs
/// more is refused rather than slowing every result down.
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// Compiles one pattern with the size limits redaction uses.
pub fn compile_pattern(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(PATTERN_SIZE_LIMIT)
        .dfa_size_limit(PATTERN_SIZE_LIMIT)
        .build()
}

/// Compiled [`RedactRules`].
#[derive(Clone, Debug)]
pub struct Redactor {
    paths: Vec<String>,
    patterns: Vec<regex::Regex>,
    replacement: String,
}

impl Redactor {
    /// Compiles `rules`; the first pattern that does not compile (or is too large) is the
    /// error.
    pub fn new(rules: &RedactRules) -> Result<Redactor, regex::Error> {
        Ok(Redactor {
            paths: rules.paths.clone(),
            patterns: rules
                .patterns
                .iter()
                .map(|p| compile_pattern(p))
                .collect::<Result<_, _>>()?,
            replacement: rules.replacement.clone(),
        })
    }

    /// Replaces the values the paths name, then every pattern match in every string
    /// (keys included).
    pub fn redact_value(&self, value: &mut Value) {
        for path in &self.paths {
            if let Some(target) = value.pointer_mut(path) {
                *target = Value::String(self.replacement.clone());
            }
        }
        if !self.patterns.is_empty() {
            self.redact_strings(value);
        }
    }

    fn redact_strings(&self, value: &mut Value) {
        match value {
            Value::String(s) => {
                if let Some(redacted) = self.changed(s) {
                    *s = redacted;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.redact_strings(v)),
            Value::Object(object) => {
                let keys_change = object.keys().any(|k| self.changed(k).is_some());
                if keys_change {
                    let old = std::mem::take(object);
                    let mut new = Map::with_capacity(old.len());
                    for (key, v) in old {
                        let key = self.changed(&key).unwrap_or(key);
                        new.insert(key, v);
                    }
                    *object = new;
                }
                object.values_mut().for_each(|v| self.redact_strings(v));
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }

    /// `text` with every match of every pattern replaced, or `None` when nothing matched.
    fn changed(&self, text: &str) -> Option<String> {
        let mut current: Option<String> = None;
        for pattern in &self.patterns {
            let input = current.as_deref().unwrap_or(text);
            if let std::borrow::Cow::Owned(replaced) =
                pattern.replace_all(input, regex::NoExpand(&self.replacement))
            {
                current = Some(replaced);
            }
        }
        current
    }

    /// `text` with every pattern match replaced.
    pub fn redact_text(&self, text: &str) -> String {
        self.changed(text).unwrap_or_else(|| text.to_string())
    }

    /// Redacts an error's message and stderr tail.
    pub fn redact_error(&self, error: &mut CallError) {
        if let Some(message) = self.changed(&error.message) {
            error.message = message;
        }
        if let Some(tail) = self.changed(&error.stderr_tail) {
            error.stderr_tail = tail;
        }
    }

    /// Redacts a call's end: the result value, or the error.
    pub fn redact_result(&self, result: &mut Result<Value, CallError>) {
        match result {
            Ok(value) => self.redact_value(value),
            Err(error) => self.redact_error(error),
        }
    }

    /// Redacts, with the patterns, the text of an oplog entry that a tool or a peer wrote:
    /// HTTP URLs, header values and response bodies (a body is read as UTF-8, invalid bytes
    /// as U+FFFD; one a pattern matches is replaced by its redacted text), progress
    /// messages, HTTP error and refusal messages, fence reasons, approval reasons, and the
    /// errors of retries and of the outcome. The paths name parts of the result, so they
    /// do not apply here. The call's arguments (`call-started`) and the entries' structure
    /// (kinds, numbers, digests) are kept.
    pub fn redact_entry(&self, entry: &mut OplogEntry) {
        if self.patterns.is_empty() {
            return;
        }
        entry.visit_written_text(&mut |s| self.redact_in_place(s), &mut |b| {
            self.redact_body(b)
        });
    }

    /// A stored oplog record as an agent may read it: its entry redacted
    /// ([`Redactor::redact_entry`]). A payload that does not parse as its kind (a corrupted
    /// row) has the patterns applied to its whole text instead.
    pub fn redact_record(&self, record: &mut OplogRecord) {
        if self.patterns.is_empty() {
            return;
        }
        record.rewrite_written_text(&mut |s| self.redact_in_place(s), &mut |b| {
            self.redact_body(b)
        });
    }

    fn redact_in_place(&self, text: &mut String) {
        if let Some(redacted) = self.changed(text) {
            *text = redacted;
        }
    }

    /// A body read as UTF-8 (invalid bytes as U+FFFD); replaced by its redacted text when a
    /// pattern matches.
    fn redact_body(&self, body: &mut Vec<u8>) {
        let redacted = self.changed(&String::from_utf8_lossy(body));
        if let Some(redacted) = redacted {
            *body = redacted.into_bytes();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::call::ErrorKind;
    use serde_json::json;

    fn rules(paths: &[&str], patterns: &[&str]) -> RedactRules {
        RedactRules {
            paths: paths.iter().map(|s| s.to_string()).collect(),
            patterns: patterns.iter().map(|s| s.to_string()).collect(),
            replacement: DEFAULT_REDACTION.into(),
        }
    }

    #[test]
    fn paths_replace_whatever_they_name() {
        let r = Redactor::new(&rules(&["/token", "/nested/list/1", "/missing/x"], &[])).unwrap();
        let mut v = json!({"token": {"a": 1}, "nested": {"list": [1, 2, 3]}, "keep": "ok"});
        r.redact_value(&mut v);
        assert_eq!(
            v,
            json!({"token": "[REDACTED]", "nested": {"list": [1, "[REDACTED]", 3]}, "keep": "ok"})
        );
    }

    #[test]
    fn the_empty_pointer_is_the_whole_result() {
        let r = Redactor::new(&rules(&[""], &[])).unwrap();
        let mut v = json!({"a": 1});
        r.redact_value(&mut v);
        assert_eq!(v, json!("[REDACTED]"));
    }

    #[test]
    fn patterns_reach_every_string_and_key() {
        let r = Redactor::new(&rules(&[], &[r"sk-[a-z0-9]+", r"\d{4}-\d{4}"])).unwrap();
        let mut v = json!({
            "note": "key sk-abc123 and card 1234-5678",
            "items": [{"sk-key9": "x"}, 42, true, null],
            "count": 7
        });
        r.redact_value(&mut v);
        assert_eq!(
            v,
            json!({
                "note": "key [REDACTED] and card [REDACTED]",
                "items": [{"[REDACTED]": "x"}, 42, true, null],
                "count": 7
            })
        );
    }

    #[test]
    fn paths_go_first_and_the_replacement_is_literal() {
        let mut r = rules(&["/a"], &["(secret)"]);
        r.replacement = "$1<gone>".into();
        let r = Redactor::new(&r).unwrap();
        let mut v = json!({"a": "whatever", "b": "my secret"});
        r.redact_value(&mut v);
        assert_eq!(v, json!({"a": "$1<gone>", "b": "my $1<gone>"}));
    }

    #[test]
    fn error_text_is_redacted() {
        let r = Redactor::new(&rules(&["/ignored"], &["hunter2"])).unwrap();
        let mut e = CallError::new(ErrorKind::ToolError, "password hunter2 rejected");
        e.stderr_tail = "hunter2\nhunter2".into();
        e.name = "hunter2-name-is-declared".into();
        r.redact_error(&mut e);
        assert_eq!(e.message, "password [REDACTED] rejected");
        assert_eq!(e.stderr_tail, "[REDACTED]\n[REDACTED]");
        assert_eq!(
            e.name, "hunter2-name-is-declared",
            "declared names are kept"
        );
        assert_eq!(r.redact_text("no match"), "no match");
        let mut result = Err(CallError::new(ErrorKind::ToolError, "hunter2"));
        r.redact_result(&mut result);
        assert_eq!(result.unwrap_err().message, "[REDACTED]");
    }

    #[test]
    fn invalid_and_oversized_patterns_are_errors() {
        assert!(Redactor::new(&rules(&[], &["ok", "(unclosed"])).is_err());
        assert!(matches!(
            compile_pattern(r"\w{1000}\w{1000}\w{1000}"),
            Err(regex::Error::CompiledTooBig(_))
        ));
    }

    fn oplog_record(seq: u64, entry: &OplogEntry) -> OplogRecord {
        let (kind, payload) = entry.to_parts();
        OplogRecord {
            seq,
            epoch: 1,
            kind: kind.as_str().to_string(),
            payload: payload.to_string(),
            recorded_at_ms: 0,
        }
    }

    #[test]
    fn oplog_entries_lose_what_the_patterns_match_and_keep_their_structure() {
        use crate::call::{HttpRequest, HttpResponse, ProgressReport, Retry};
        let r = Redactor::new(&rules(&["/body"], &[r"sk-[a-z0-9]+"])).unwrap();
        let mut response = OplogEntry::HttpResponse(HttpResponse {
            seq: 1,
            status: 200,
            headers: vec![("x-key".into(), "sk-head1".into())],
            body: b"{\"token\":\"sk-body2\",\"n\":1}".to_vec(),
        });
        r.redact_entry(&mut response);
        let OplogEntry::HttpResponse(response) = &response else {
            unreachable!()
        };
        assert_eq!(response.headers, [("x-key".into(), "[REDACTED]".into())]);
        assert_eq!(response.body, b"{\"token\":\"[REDACTED]\",\"n\":1}");
        assert_eq!((response.seq, response.status), (1, 200));

        // A binary body is read lossily: the secret in it goes, the entry still parses.
        let mut binary = OplogEntry::HttpResponse(HttpResponse {
            seq: 2,
            status: 200,
            headers: vec![],
            body: [&[0xff, 0xfe][..], b"sk-bin3"].concat(),
        });
        r.redact_entry(&mut binary);
        let OplogEntry::HttpResponse(binary) = &binary else {
            unreachable!()
        };
        assert!(!contains(&binary.body, "sk-bin3"), "{:?}", binary.body);
        // A body nothing matches is left byte for byte.
        let mut clean = OplogEntry::HttpResponse(HttpResponse {
            seq: 3,
            status: 200,
            headers: vec![],
            body: vec![0xff, 0x00, b'a'],
        });
        let before = clean.clone();
        r.redact_entry(&mut clean);
        assert_eq!(clean, before);

        let mut progress = OplogEntry::Progress(ProgressReport {
            message: "fetched sk-prog4".into(),
        });
        r.redact_entry(&mut progress);
        assert_eq!(
            progress,
            OplogEntry::Progress(ProgressReport {
                message: "fetched [REDACTED]".into()
            })
        );

        let mut request = OplogEntry::HttpRequest(HttpRequest {
            seq: 1,
            method: "GET".into(),
            url: "http://x/?k=sk-url5".into(),
            headers: vec![("x".into(), "sk-h6".into())],
            digested: vec![],
            body_sha256: "sha256:00".into(),
            body_bytes: 0,
            idempotency_key: "k".into(),
            attempt: 1,
        });
        r.redact_entry(&mut request);
        let text = request.payload_text();
        assert!(!text.contains("sk-"), "{text}");
        assert!(text.contains("sha256:00"), "{text}");

        let mut retry = OplogEntry::Retry(Retry {
            attempt: 1,
            error: CallError::new(ErrorKind::ToolError, "upstream said sk-err7"),
            backoff_ms: 10,
        });
        r.redact_entry(&mut retry);
        assert!(!retry.payload_text().contains("sk-err7"));
    }

    #[test]
    fn a_record_is_redacted_through_its_entry_or_as_text_when_it_does_not_parse() {
        use crate::call::HttpResponse;
        let r = Redactor::new(&rules(&[], &[r"sk-[a-z0-9]+"])).unwrap();
        let entry = OplogEntry::HttpResponse(HttpResponse {
            seq: 1,
            status: 200,
            headers: vec![],
            body: b"sk-body1".to_vec(),
        });
        let mut record = oplog_record(4, &entry);
        // Stored as base64, the secret is not visible in the text: only decoding finds it.
        assert!(!record.payload.contains("sk-body1"));
        r.redact_record(&mut record);
        let OplogEntry::HttpResponse(redacted) = record.entry().unwrap() else {
            panic!("{record:?}")
        };
        assert_eq!(redacted.body, b"[REDACTED]");
        assert_eq!((record.seq, record.kind.as_str()), (4, "http-response"));

        let mut broken = OplogRecord {
            seq: 5,
            epoch: 1,
            kind: "progress".into(),
            payload: "not json sk-raw2".into(),
            recorded_at_ms: 0,
        };
        r.redact_record(&mut broken);
        assert_eq!(broken.payload, "not json [REDACTED]");

        // Without patterns, nothing changes (paths are about the result).
        let paths_only = Redactor::new(&rules(&["/body"], &[])).unwrap();
        let mut same = oplog_record(4, &entry);
        paths_only.redact_record(&mut same);
        assert_eq!(same, oplog_record(4, &entry));
    }

    fn contains(haystack: &[u8], needle: &str) -> bool {
        haystack
            .windows(needle.len())
            .any(|w| w == needle.as_bytes())
    }

    #[test]
    fn no_rules_change_nothing() {
        let r = Redactor::new(&RedactRules::default()).unwrap();
        let mut v = json!({"a": ["b"]});
        r.redact_value(&mut v);
        assert_eq!(v, json!({"a": ["b"]}));
    }
}
