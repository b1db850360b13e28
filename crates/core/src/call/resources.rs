//! The bookkeeping of declared resources the store keeps between runs, and what changed in
//! it from one catalog to the next.

use serde_json::Value;
use std::collections::HashMap;

/// What the store remembers of a resource between runs: its generation (bumped when the
/// spec changes) and last status, so conditions keep their transition times.
#[derive(Clone, Debug, PartialEq)]
pub struct ResourceRecord {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub spec_hash: String,
    pub generation: i64,
    pub status: Value,
}

/// A resource's identity in the bookkeeping: its kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceRecordKey {
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl ResourceRecord {
    pub fn key(&self) -> ResourceRecordKey {
        ResourceRecordKey {
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// What changed in the bookkeeping from one save to the next: the records that are new or
/// differ, and the resources that are gone. A reload that changed one tool writes that
/// tool's record (and those of what its change touched), not every record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceChanges {
    /// Records to write, new or replacing the stored one.
    pub saved: Vec<ResourceRecord>,
    /// Resources whose records go.
    pub removed: Vec<ResourceRecordKey>,
}

impl ResourceChanges {
    /// The changes that turn the records `before` into `after` (both by key), in key order.
    pub fn between(
        before: &HashMap<ResourceRecordKey, ResourceRecord>,
        after: &HashMap<ResourceRecordKey, ResourceRecord>,
    ) -> ResourceChanges {
        let mut saved: Vec<ResourceRecord> = after
            .iter()
            .filter(|(key, record)| before.get(*key) != Some(*record))
            .map(|(_, record)| record.clone())
            .collect();
        saved.sort_by_key(ResourceRecord::key);
        let mut removed: Vec<ResourceRecordKey> = before
            .keys()
            .filter(|key| !after.contains_key(*key))
            .cloned()
            .collect();
        removed.sort();
        ResourceChanges { saved, removed }
    }

    pub fn is_empty(&self) -> bool {
        self.saved.is_empty() && self.removed.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(kind: &str, name: &str, generation: i64) -> ResourceRecord {
        ResourceRecord {
            kind: kind.into(),
            namespace: "default".into(),
            name: name.into(),
            spec_hash: format!("h{generation}"),
            generation,
            status: json!({"observedGeneration": generation}),
        }
    }

    fn by_key(records: &[ResourceRecord]) -> HashMap<ResourceRecordKey, ResourceRecord> {
        records.iter().map(|r| (r.key(), r.clone())).collect()
    }

    #[test]
    fn unchanged_records_are_not_written_again() {
        let records = [record("Tool", "a", 1), record("ToolRelease", "a-1", 1)];
        let changes = ResourceChanges::between(&by_key(&records), &by_key(&records));
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn new_changed_and_removed_records_are_the_changes() {
        let before = [
            record("Tool", "a", 1),
            record("Tool", "b", 1),
            record("ToolRelease", "b-1", 1),
        ];
        let mut status_only = record("ToolRelease", "b-1", 1);
        status_only.status = json!({"observedGeneration": 1, "ready": false});
        let after = [
            record("Tool", "a", 2),
            status_only.clone(),
            record("Tool", "c", 1),
        ];
        let changes = ResourceChanges::between(&by_key(&before), &by_key(&after));
        assert_eq!(
            changes.saved,
            vec![record("Tool", "a", 2), record("Tool", "c", 1), status_only]
        );
        assert_eq!(changes.removed, vec![record("Tool", "b", 1).key()]);
    }

    #[test]
    fn the_same_name_in_another_kind_is_another_resource() {
        let before = [record("Tool", "a", 1)];
        let after = [record("ToolRelease", "a", 1)];
        let changes = ResourceChanges::between(&by_key(&before), &by_key(&after));
        assert_eq!(changes.saved, vec![record("ToolRelease", "a", 1)]);
        assert_eq!(changes.removed, vec![record("Tool", "a", 1).key()]);
    }

    #[test]
    fn everything_is_new_when_nothing_was_saved() {
        let after = [record("Tool", "a", 1), record("Tool", "b", 1)];
        let changes = ResourceChanges::between(&HashMap::new(), &by_key(&after));
        assert_eq!(changes.saved, after.to_vec());
        assert!(changes.removed.is_empty());
    }
}
