//! Redaction of results and error text. CONTRACT(issue 10, helper E).

/// Replacement text of a redact step that names none.
pub const DEFAULT_REDACTION: &str = "[REDACTED]";
