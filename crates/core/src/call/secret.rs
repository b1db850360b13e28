//! A secret's value while it is on its way to, or inside, the worker that runs a call.
//!
//! Values are never part of the call model that is stored ([`super::CallAccess`] names keys
//! only): the scheduler resolves them when it assigns a call, they travel in the `Assign`
//! message, and the worker uses them for that run and forgets them. [`SecretValue`] keeps
//! them out of logs by accident: its `Debug` and `Display` print a placeholder.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::sync::Arc;

/// The value of one secret key. Formatting it never shows the value; [`SecretValue::expose`]
/// is the one way to read it.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SecretValue(Arc<[u8]>);

impl SecretValue {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        SecretValue(Arc::from(bytes.into()))
    }

    /// The plaintext, for the few places that must use it (the worker substituting a
    /// reference, the scheduler filling an assignment, a digest).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The plaintext as UTF-8, when it is (what headers, URLs and environment variables
    /// can carry).
    pub fn expose_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// SHA-256 of the value, what lookup tables keep instead of the value.
    pub fn digest(&self) -> [u8; 32] {
        Sha256::digest(&self.0).into()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue(<redacted>)")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_never_shows_the_value() {
        let value = SecretValue::new("s3cr3t-value");
        assert_eq!(value.expose_str(), Some("s3cr3t-value"));
        for text in [
            format!("{value:?}"),
            format!("{value}"),
            format!("{:?}", Some(&value)),
            format!("{:#?}", vec![value.clone()]),
        ] {
            assert!(!text.contains("s3cr3t"), "{text}");
        }
    }
}
