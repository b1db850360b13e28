//! The outcomes of checking artifacts kept in ConfigMaps, kept from one resolve to the
//! next.
//!
//! Checking an artifact hashes it and validates it as WebAssembly: 28 KB of a small tool
//! takes about a quarter of a millisecond, and a catalog of a thousand releases was checked
//! whole at every resolve (most of a resolve's CPU). A ConfigMap's key holds the same bytes
//! for as long as the ConfigMap keeps its uid and resourceVersion, so the outcome of
//! checking them against a release's declared digest is kept under those. An entry not
//! used in a resolve is dropped at the next one: what is kept is what the catalog uses.

use std::collections::HashMap;
use toolgrid_catalog::artifacts::ArtifactOutcome;

/// What identifies the bytes checked and what they were checked against.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CheckKey {
    pub namespace: String,
    pub config_map: String,
    pub key: String,
    pub uid: String,
    pub resource_version: String,
    /// The digest the release declares, if any.
    pub expected: Option<String>,
}

/// Outcomes by [`CheckKey`], in rounds (one per resolve).
#[derive(Debug, Default)]
pub struct Checked {
    /// Used in the round under way.
    current: HashMap<CheckKey, ArtifactOutcome>,
    /// Kept from the round before, until used (then moved to `current`) or the next round.
    previous: HashMap<CheckKey, ArtifactOutcome>,
}

impl Checked {
    /// Starts a round: what the last round did not use is forgotten.
    pub fn next_round(&mut self) {
        self.previous = std::mem::take(&mut self.current);
    }

    pub fn get(&mut self, key: &CheckKey) -> Option<ArtifactOutcome> {
        if let Some(outcome) = self.current.get(key) {
            return Some(outcome.clone());
        }
        let (key, outcome) = self.previous.remove_entry(key)?;
        self.current.insert(key, outcome.clone());
        Some(outcome)
    }

    pub fn put(&mut self, key: CheckKey, outcome: ArtifactOutcome) {
        self.current.insert(key, outcome);
    }

    /// Outcomes kept (the round under way's and the last one's).
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolgrid_api::conditions::Reason;

    fn key(version: &str) -> CheckKey {
        CheckKey {
            namespace: "default".into(),
            config_map: "artifacts".into(),
            key: "tool.wasm".into(),
            uid: "u1".into(),
            resource_version: version.into(),
            expected: Some("sha256:ab".into()),
        }
    }

    fn outcome(message: &str) -> ArtifactOutcome {
        ArtifactOutcome::Failed {
            reason: Reason::DigestMismatch,
            message: message.into(),
        }
    }

    #[test]
    fn an_outcome_is_kept_while_resolves_use_it_and_dropped_after_one_that_does_not() {
        let mut checked = Checked::default();
        checked.next_round();
        checked.put(key("1"), outcome("a"));
        checked.next_round();
        assert_eq!(checked.get(&key("1")), Some(outcome("a")), "used again");
        // Another version of the ConfigMap is other bytes: not found.
        assert_eq!(checked.get(&key("2")), None);
        let mut other = key("1");
        other.expected = Some("sha256:cd".into());
        assert_eq!(checked.get(&other), None, "checked against another digest");
        checked.next_round();
        assert_eq!(checked.len(), 1);
        // A round that does not use it, then the next: gone.
        checked.next_round();
        checked.next_round();
        assert!(checked.is_empty());
        assert_eq!(checked.get(&key("1")), None);
    }
}
