//! A call's workspace on the worker's disk: the base version written out into a fresh
//! directory (preopened at `/workspace`), and the directory read back into a tree when a
//! read-write call succeeds.
//!
//! Everything here is bounded by the workspace [`Limits`]: a scan stops at the first file
//! that takes the directory past them (`workspace-limit`), and refuses anything that is
//! not a regular file or a directory, and names that are not UTF-8 (`workspace-invalid`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use toolgrid_core::call::ErrorKind;
use toolgrid_core::workspace::{FileEntry, Limits, PathError, Tree, WorkspacePath, blob_digest};

/// A workspace directory as the runtime preopens it.
#[derive(Clone, Debug)]
pub struct WorkspaceMount {
    /// The host directory holding the call's copy of the base version.
    pub dir: PathBuf,
    /// `readWrite`: the guest may change it (the copy, never the stored version).
    pub writable: bool,
}

/// A directory of a release's read-only files (`spec.files`), preopened read-only at
/// `guest`: the worker makes it, holding exactly the files the release mounts there.
#[derive(Clone, Debug)]
pub struct ReadOnlyMount {
    pub dir: PathBuf,
    pub guest: String,
}

/// Why a workspace could not be written out or read back.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(transparent)]
    Limit(#[from] toolgrid_core::workspace::LimitExceeded),
    #[error("{path}: {why}")]
    Invalid { path: String, why: String },
    #[error("blob {0} is missing")]
    MissingBlob(String),
    #[error("workspace directory: {0}")]
    Io(#[from] std::io::Error),
}

impl WorkspaceError {
    /// The error kind a call that hits this fails with.
    pub fn kind(&self) -> ErrorKind {
        match self {
            WorkspaceError::Limit(_) => ErrorKind::WorkspaceLimit,
            WorkspaceError::Invalid { .. } | WorkspaceError::MissingBlob(_) => {
                ErrorKind::WorkspaceInvalid
            }
            WorkspaceError::Io(_) => ErrorKind::Internal,
        }
    }
}

/// Writes `tree` into the empty directory `dir`, taking each file's bytes from `blobs`.
pub fn materialize(
    dir: &Path,
    tree: &Tree,
    blobs: &HashMap<String, Vec<u8>>,
) -> Result<(), WorkspaceError> {
    for (path, entry) in &tree.files {
        let bytes = blobs
            .get(&entry.digest)
            .ok_or_else(|| WorkspaceError::MissingBlob(entry.digest.clone()))?;
        // A validated path: relative, no `.`/`..`, so it stays under `dir`.
        let target = path.components().fold(dir.to_path_buf(), |p, c| p.join(c));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, bytes)?;
    }
    Ok(())
}

/// What a scan found: the tree and every file's bytes by digest.
#[derive(Debug, Default)]
pub struct Scanned {
    pub tree: Tree,
    pub blobs: HashMap<String, Vec<u8>>,
}

impl Scanned {
    /// The blobs `base` does not reference (the ones the control plane may not have).
    pub fn new_blobs(&self, base: &Tree) -> Vec<(String, Vec<u8>)> {
        let known: std::collections::HashSet<&str> =
            base.files.values().map(|f| f.digest.as_str()).collect();
        let mut out: Vec<(String, Vec<u8>)> = self
            .blobs
            .iter()
            .filter(|(d, _)| !known.contains(d.as_str()))
            .map(|(d, b)| (d.clone(), b.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Reads `dir` back into a tree, within `limits`.
pub fn scan(dir: &Path, limits: &Limits) -> Result<Scanned, WorkspaceError> {
    let mut scanned = Scanned::default();
    let mut files = BTreeMap::new();
    let mut totals = (0u64, 0u64);
    walk(
        dir,
        "",
        0,
        limits,
        &mut totals,
        &mut files,
        &mut scanned.blobs,
    )?;
    scanned.tree = Tree { files };
    Ok(scanned)
}

fn walk(
    dir: &Path,
    prefix: &str,
    depth: usize,
    limits: &Limits,
    totals: &mut (u64, u64),
    files: &mut BTreeMap<WorkspacePath, FileEntry>,
    blobs: &mut HashMap<String, Vec<u8>>,
) -> Result<(), WorkspaceError> {
    let invalid = |path: &str, why: &str| WorkspaceError::Invalid {
        path: path.to_string(),
        why: why.to_string(),
    };
    if depth > toolgrid_core::workspace::MAX_PATH_DEPTH {
        return Err(invalid(prefix, "too deep"));
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| invalid(&name.to_string_lossy(), "the name is not UTF-8"))?;
        let rel = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let path =
            WorkspacePath::parse(&rel).map_err(|e: PathError| invalid(&rel, &e.to_string()))?;
        // Never follow a link: the guest could point one outside the workspace.
        let meta = std::fs::symlink_metadata(entry.path())?;
        if meta.is_dir() {
            walk(&entry.path(), &rel, depth + 1, limits, totals, files, blobs)?;
        } else if meta.is_file() {
            // Counted before it is read: a huge file is refused without reading it.
            totals.0 += meta.len();
            totals.1 += 1;
            limits.check_counts(totals.0, totals.1)?;
            let bytes = std::fs::read(entry.path())?;
            if bytes.len() as u64 != meta.len() {
                totals.0 = totals.0 - meta.len() + bytes.len() as u64;
                limits.check_counts(totals.0, totals.1)?;
            }
            let digest = blob_digest(&bytes);
            files.insert(
                path,
                FileEntry {
                    digest: digest.clone(),
                    size: bytes.len() as u64,
                },
            );
            blobs.entry(digest).or_insert(bytes);
        } else {
            return Err(invalid(&rel, "not a regular file or a directory"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_written_out_scans_back_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let mut blobs = HashMap::new();
        let mut files = BTreeMap::new();
        for (path, bytes) in [
            ("a.txt", &b"one"[..]),
            ("d/e/f.bin", b"\x00\x01"),
            ("d/g", b"one"),
        ] {
            let digest = blob_digest(bytes);
            blobs.insert(digest.clone(), bytes.to_vec());
            files.insert(
                WorkspacePath::parse(path).unwrap(),
                FileEntry {
                    digest,
                    size: bytes.len() as u64,
                },
            );
        }
        let tree = Tree { files };
        materialize(dir.path(), &tree, &blobs).unwrap();
        let scanned = scan(dir.path(), &Limits::default()).unwrap();
        assert_eq!(scanned.tree, tree);
        assert_eq!(scanned.blobs.len(), 2, "one blob per digest");
        assert!(scanned.new_blobs(&tree).is_empty());
        std::fs::write(dir.path().join("new"), b"fresh").unwrap();
        let scanned = scan(dir.path(), &Limits::default()).unwrap();
        assert_eq!(
            scanned.new_blobs(&tree),
            vec![(blob_digest(b"fresh"), b"fresh".to_vec())]
        );
    }

    #[test]
    fn a_scan_stops_at_the_limits_and_refuses_links_and_odd_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"12345").unwrap();
        let small = Limits {
            max_bytes: 4,
            max_files: 10,
        };
        let error = scan(dir.path(), &small).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WorkspaceLimit);
        let few = Limits {
            max_bytes: 100,
            max_files: 1,
        };
        std::fs::write(dir.path().join("b"), b"").unwrap();
        assert_eq!(
            scan(dir.path(), &few).unwrap_err().kind(),
            ErrorKind::WorkspaceLimit
        );

        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let error = scan(dir.path(), &Limits::default()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WorkspaceInvalid, "{error}");
        std::fs::remove_file(dir.path().join("link")).unwrap();

        use std::os::unix::ffi::OsStrExt;
        let odd = std::ffi::OsStr::from_bytes(b"caf\xe9");
        std::fs::write(dir.path().join(odd), b"x").unwrap();
        let error = scan(dir.path(), &Limits::default()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WorkspaceInvalid, "{error}");
    }

    #[test]
    fn a_missing_blob_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let tree = Tree::from_rows([("a".to_string(), blob_digest(b"x"), 1)]).unwrap();
        let error = materialize(dir.path(), &tree, &HashMap::new()).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::WorkspaceInvalid);
    }
}
