//! Generated gRPC types and services for `toolgrid.v1` (see `proto/toolgrid/v1/`).

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("toolgrid.v1");

// The wire carries an oplog entry as its kind and its payload's JSON, converted here once.

impl From<&crate::call::OplogEntry> for OplogEntry {
    fn from(entry: &crate::call::OplogEntry) -> Self {
        let (kind, payload) = entry.to_parts();
        OplogEntry {
            kind: kind.as_str().to_string(),
            payload: payload.to_string().into_bytes(),
        }
    }
}

impl TryFrom<&OplogEntry> for crate::call::OplogEntry {
    type Error = crate::call::EntryError;

    fn try_from(entry: &OplogEntry) -> Result<Self, Self::Error> {
        crate::call::OplogEntry::from_text(&entry.kind, &entry.payload)
    }
}

/// Converts a batch of entries for the wire.
pub fn entries_to_wire(entries: &[crate::call::OplogEntry]) -> Vec<OplogEntry> {
    entries.iter().map(OplogEntry::from).collect()
}

/// Reads a batch of entries off the wire; the first that does not parse is the error.
pub fn entries_from_wire(
    entries: &[OplogEntry],
) -> Result<Vec<crate::call::OplogEntry>, crate::call::EntryError> {
    entries
        .iter()
        .map(crate::call::OplogEntry::try_from)
        .collect()
}
