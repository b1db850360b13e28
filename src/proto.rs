//! Generated gRPC types and services for `toolgrid.v1` (see `proto/toolgrid/v1/`).

#![allow(clippy::all, missing_docs)]

tonic::include_proto!("toolgrid.v1");

/// An assignment carries secret values (`secrets`, and revealed ones in `env`): its `Debug`
/// names their keys and never shows a value.
impl std::fmt::Debug for Assign {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assign")
            .field("call_id", &self.call_id)
            .field("epoch", &self.epoch)
            .field("namespace", &self.namespace)
            .field("tool", &self.tool)
            .field("command", &self.command)
            .field("release", &self.release)
            .field("digest", &self.digest)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("attempt", &self.attempt)
            .field("replay", &self.replay.len())
            .finish_non_exhaustive()
    }
}

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

/// Bytes of entries one message on the worker link carries at most (unless a single entry is
/// larger: entries are capped well below the link's 64 MiB message limit, see
/// `call::MAX_RESPONSE_BYTES`).
pub const LINK_BATCH_BYTES: usize = 4 << 20;

/// Splits entries into consecutive batches of at most [`LINK_BATCH_BYTES`] each (a larger
/// single entry travels alone), so no message on the worker link outgrows its limit.
pub fn link_batches(entries: Vec<OplogEntry>) -> Vec<Vec<OplogEntry>> {
    let mut batches = Vec::new();
    let mut batch = Vec::new();
    let mut size = 0;
    for entry in entries {
        let bytes = entry.kind.len() + entry.payload.len() + 8;
        if !batch.is_empty() && size + bytes > LINK_BATCH_BYTES {
            batches.push(std::mem::take(&mut batch));
            size = 0;
        }
        size += bytes;
        batch.push(entry);
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_assignment_debugs_without_its_secret_values() {
        let assign = Assign {
            call_id: "c1".into(),
            env: [("signing-key".to_string(), "r3v3aled".to_string())].into(),
            secrets: [("api-token".to_string(), "s3cr3t".to_string())].into(),
            ..Assign::default()
        };
        let event = ControlEvent {
            event: Some(control_event::Event::Assign(assign)),
        };
        let text = format!("{event:?}");
        assert!(text.contains("c1") && text.contains("api-token"), "{text}");
        assert!(
            !text.contains("r3v3aled") && !text.contains("s3cr3t"),
            "{text}"
        );
    }

    #[test]
    fn link_batches_stay_under_the_budget_and_keep_order() {
        let entry = |n: usize| OplogEntry {
            kind: "http-response".into(),
            payload: vec![b'x'; n],
        };
        let entries = vec![
            entry(3 << 20),
            entry(2 << 20),
            entry(9 << 20),
            entry(10),
            entry(10),
        ];
        let sizes: Vec<Vec<usize>> = link_batches(entries)
            .iter()
            .map(|b| b.iter().map(|e| e.payload.len()).collect())
            .collect();
        assert_eq!(
            sizes,
            [vec![3 << 20], vec![2 << 20], vec![9 << 20], vec![10, 10]]
        );
        assert!(link_batches(Vec::new()).is_empty());
    }
}

// A workspace tree on the wire: one `WorkspaceFile` per file, checked again when read.

/// A tree for the wire.
pub fn tree_to_wire(tree: &crate::workspace::Tree) -> Vec<WorkspaceFile> {
    tree.files
        .iter()
        .map(|(path, file)| WorkspaceFile {
            path: path.to_string(),
            digest: file.digest.clone(),
            size: file.size,
        })
        .collect()
}

/// Reads a tree off the wire (from a peer: every path and digest is validated).
pub fn tree_from_wire(
    files: &[WorkspaceFile],
) -> Result<crate::workspace::Tree, crate::workspace::TreeError> {
    crate::workspace::Tree::from_rows(
        files
            .iter()
            .map(|f| (f.path.clone(), f.digest.clone(), f.size)),
    )
}

/// The workspace a worker's result carries, if any.
pub fn commit_of(
    result: &CallResult,
) -> Result<Option<crate::workspace::Commit>, crate::workspace::TreeError> {
    if !result.has_workspace {
        return Ok(None);
    }
    Ok(Some(crate::workspace::Commit {
        tree: tree_from_wire(&result.workspace_tree)?,
        blobs: result
            .workspace_blobs
            .iter()
            .map(|b| (b.digest.clone(), b.data.clone()))
            .collect(),
    }))
}
