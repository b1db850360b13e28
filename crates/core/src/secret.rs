//! A secret's value while it is on its way to, or inside, the worker that runs a call.
//!
//! Values are never part of the call model that is stored ([`crate::call::CallAccess`] names keys
//! only): the scheduler resolves them when it assigns a call, they travel in the `Assign`
//! message, and the worker uses them for that run and forgets them. [`SecretValue`] keeps
//! them out of logs by accident: its `Debug` and `Display` print a placeholder. Secrets
//! (and tokens) are compared in constant time ([`bytes_equal`], [`secrets_match`]).

pub mod reference;
pub mod scrub;

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

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Whether two digests are equal, in time that does not depend on where they differ.
pub fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bytes_equal(a, b)
}

/// Whether two byte strings are equal, in time that depends only on their lengths.
pub fn bytes_equal(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
pub fn secrets_match(expected: &str, presented: &str) -> bool {
    bytes_equal(expected.as_bytes(), presented.as_bytes())
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

    #[test]
    fn a_secret_value_never_prints() {
        let value = SecretValue::new("s3cr3t-value");
        assert_eq!(format!("{value:?}"), "SecretValue(<redacted>)");
        assert_eq!(format!("{value}"), "<redacted>");
        let map = std::collections::BTreeMap::from([("k".to_string(), value.clone())]);
        assert!(!format!("{map:?}").contains("s3cr3t"));
        assert_eq!(value.expose_str(), Some("s3cr3t-value"));
    }

    #[test]
    fn digests_compare_by_value() {
        let a = sha256(b"token-a");
        assert!(digests_equal(&a, &sha256(b"token-a")));
        assert!(!digests_equal(&a, &sha256(b"token-b")));
    }
}
