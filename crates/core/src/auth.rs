//! Who calls ([`Principal`]), and secret values held in memory: never printed, compared in
//! constant time.

use sha2::{Digest as _, Sha256};

pub use crate::call::SecretValue;
use crate::ids::ObjectKey;

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// May call anything and read everything (the admin token of `toolgrid up`, or a subject
    /// Kubernetes RBAC allows to operate toolgrid). May act as an agent (`--as`).
    Operator { subject: String },
    /// An Agent: calls only its bound tools, reads only its own calls.
    Agent { agent: ObjectKey },
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
