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
//! Only results and error text are redacted: the arguments a call was made with, and the
//! oplog entries a worker records of a tool's host calls (HTTP responses), are kept as they
//! are.

use crate::call::{CallError, RedactRules};
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

    #[test]
    fn no_rules_change_nothing() {
        let r = Redactor::new(&RedactRules::default()).unwrap();
        let mut v = json!({"a": ["b"]});
        r.redact_value(&mut v);
        assert_eq!(v, json!({"a": ["b"]}));
    }
}
