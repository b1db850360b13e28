//! Secret values held in memory: never printed, compared in constant time.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::sync::Arc;

/// The value of one Secret key. `Debug` and `Display` print `<redacted>`, never the
/// value; [`SecretValue::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(Arc<[u8]>);

impl SecretValue {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        SecretValue(Arc::from(bytes.into()))
    }

    /// The plaintext: for the one place that must use it (a worker's request, a digest).
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// The plaintext as UTF-8, when it is.
    pub fn expose_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// SHA-256 of the value, what lookup tables keep instead of the value.
    pub fn digest(&self) -> [u8; 32] {
        sha256(&self.0)
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
    let mut difference = 0u8;
    for (x, y) in a.iter().zip(b.iter()) {
        difference |= std::hint::black_box(x ^ y);
    }
    difference == 0
}

#[cfg(test)]
mod tests {
    use super::*;

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
