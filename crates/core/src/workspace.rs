//! Workspaces: each agent's durable file tree, versioned and content-addressed.
//!
//! A workspace is a sequence of versions `0, 1, 2, …` of a [`Tree`] (a sorted map from a
//! relative [`WorkspacePath`] to the sha256 digest and size of the file's bytes). Version 0
//! is the empty tree and is never stored. A call whose binding grants `readOnly` sees the
//! version its first assignment found (its **base**) read-only; `readWrite` sees a
//! copy-on-write view of the base, committed as base + 1 in the same store transaction as
//! the call's success, and only if the head is still the base. The blobs are kept once
//! per digest.
//!
//! This module is pure: paths, trees, diffs, limits, who may read a workspace, and the
//! one-writer-per-workspace rule the scheduler applies ([`WriteLocks`]). The store keeps
//! versions and blobs (migration 5, see docs/store.md); the worker writes a version out into
//! a directory and scans it back (its `workspace` module).

use crate::auth::Principal;
use crate::call::{CallAccess, Filesystem};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Default most bytes of all files of one workspace version (32 MiB). A commit's new blobs
/// travel to the control plane in one `CallResult` message, which must stay well under the
/// worker link's 64 MiB message limit together with the call's stdout (at most 16 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 32 << 20;
/// Default most files of one workspace version.
pub const DEFAULT_MAX_FILES: u64 = 10_000;
/// Longest path accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 1024;
/// Deepest path accepted, in components.
pub const MAX_PATH_DEPTH: usize = 32;
/// Where a call sees its workspace inside the sandbox.
pub const GUEST_DIR: &str = crate::guest::WORKSPACE_DIR;

/// Why a path is refused. Paths come from tools (the files they wrote), workers and callers
/// (`toolgrid workspace cat`): all hostile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("empty path")]
    Empty,
    #[error("path {0:?} is absolute: workspace paths are relative to the workspace")]
    Absolute(String),
    #[error("path {0:?} has a `.` or `..` component")]
    DotComponent(String),
    #[error("path {0:?} has an empty component (`//` or a trailing `/`)")]
    EmptyComponent(String),
    #[error("path {0:?} holds a backslash or a NUL byte")]
    BadCharacter(String),
    #[error("path is not UTF-8: {0}")]
    NotUtf8(String),
    #[error("path is longer than {MAX_PATH_BYTES} bytes or deeper than {MAX_PATH_DEPTH}")]
    TooLong,
}

/// A validated path inside a workspace: relative, `/`-separated, UTF-8, no `.`/`..`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WorkspacePath(String);

impl WorkspacePath {
    pub fn parse(path: &str) -> Result<Self, PathError> {
        if path.is_empty() {
            return Err(PathError::Empty);
        }
        if path.len() > MAX_PATH_BYTES {
            return Err(PathError::TooLong);
        }
        if path.starts_with('/') {
            return Err(PathError::Absolute(path.into()));
        }
        if path.contains('\\') || path.contains('\0') {
            return Err(PathError::BadCharacter(path.into()));
        }
        let mut depth = 0;
        for component in path.split('/') {
            depth += 1;
            match component {
                "" => return Err(PathError::EmptyComponent(path.into())),
                "." | ".." => return Err(PathError::DotComponent(path.into())),
                _ => {}
            }
        }
        if depth > MAX_PATH_DEPTH {
            return Err(PathError::TooLong);
        }
        Ok(WorkspacePath(path.to_string()))
    }

    /// A path from raw bytes (a file name on disk, a wire field): refused if not UTF-8.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PathError> {
        let text = std::str::from_utf8(bytes)
            .map_err(|_| PathError::NotUtf8(String::from_utf8_lossy(bytes).into_owned()))?;
        WorkspacePath::parse(text)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The components, in order.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }
}

impl TryFrom<String> for WorkspacePath {
    type Error = PathError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        WorkspacePath::parse(&value)
    }
}

impl From<WorkspacePath> for String {
    fn from(value: WorkspacePath) -> Self {
        value.0
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The digest of a blob: `sha256:<64 lower-case hex digits>`.
pub fn blob_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Whether `digest` has the shape [`blob_digest`] produces.
pub fn is_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// One file of a tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    /// [`blob_digest`] of the file's bytes.
    pub digest: String,
    pub size: u64,
}

/// A workspace version's files, sorted by path. Directories are implied by the paths (an
/// empty directory is not kept); only regular files are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Tree {
    pub files: BTreeMap<WorkspacePath, FileEntry>,
}

/// Why a tree is not acceptable as a version.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("{path}: {digest:?} is not a sha256 digest")]
    BadDigest { path: String, digest: String },
    #[error("{path} is both a file and a directory")]
    FileAndDirectory { path: String },
}

impl Tree {
    /// Sum of the file sizes.
    pub fn total_bytes(&self) -> u64 {
        self.files.values().map(|f| f.size).sum()
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// A content digest of the whole tree (its canonical JSON): two trees with the same
    /// files at the same paths have the same digest.
    pub fn digest(&self) -> String {
        blob_digest(self.to_json().as_bytes())
    }

    /// The canonical JSON text the store keeps.
    pub fn to_json(&self) -> String {
        // Plain strings and integers: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| "{}".into())
    }

    /// Reads a tree from its JSON text, validating every path and digest.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let tree: Tree = serde_json::from_str(text).map_err(|e| e.to_string())?;
        tree.validate().map_err(|e| e.to_string())?;
        Ok(tree)
    }

    /// Builds a tree from untrusted `(path, digest, size)` rows (a worker's result).
    pub fn from_rows(
        rows: impl IntoIterator<Item = (String, String, u64)>,
    ) -> Result<Self, TreeError> {
        let mut files = BTreeMap::new();
        for (path, digest, size) in rows {
            let path = WorkspacePath::parse(&path)?;
            files.insert(path, FileEntry { digest, size });
        }
        let tree = Tree { files };
        tree.validate()?;
        Ok(tree)
    }

    /// Checks every digest's shape, and that no path is both a file and a directory.
    pub fn validate(&self) -> Result<(), TreeError> {
        for (path, entry) in &self.files {
            if !is_digest(&entry.digest) {
                return Err(TreeError::BadDigest {
                    path: path.to_string(),
                    digest: entry.digest.clone(),
                });
            }
        }
        // Sorted: a directory `a` shows up as `a/...` right after the file `a` if both exist
        // (no byte below '/' may separate them except ones that sort before `/`), so look
        // at every file's directory prefixes.
        for path in self.files.keys() {
            let text = path.as_str();
            for (i, _) in text.match_indices('/') {
                let dir = &text[..i];
                if let Ok(dir) = WorkspacePath::parse(dir)
                    && self.files.contains_key(&dir)
                {
                    return Err(TreeError::FileAndDirectory { path: dir.0 });
                }
            }
        }
        Ok(())
    }

    /// The files directly under `dir` (or the root for `None`), with the subdirectories as
    /// names ending in `/`, sorted.
    pub fn list(&self, dir: Option<&WorkspacePath>) -> Vec<(String, Option<&FileEntry>)> {
        let prefix = dir.map(|d| format!("{}/", d.as_str())).unwrap_or_default();
        let mut out: BTreeMap<String, Option<&FileEntry>> = BTreeMap::new();
        for (path, entry) in &self.files {
            let Some(rest) = path.as_str().strip_prefix(&prefix) else {
                continue;
            };
            match rest.split_once('/') {
                Some((sub, _)) => {
                    out.insert(format!("{sub}/"), None);
                }
                None => {
                    out.insert(rest.to_string(), Some(entry));
                }
            }
        }
        out.into_iter().collect()
    }
}

/// How a workspace may grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub max_bytes: u64,
    pub max_files: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bytes: DEFAULT_MAX_BYTES,
            max_files: DEFAULT_MAX_FILES,
        }
    }
}

/// A tree over its workspace's limits (`workspace-limit`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    #[error("the workspace would hold {bytes} bytes, more than its limit of {limit}")]
    Bytes { bytes: u64, limit: u64 },
    #[error("the workspace would hold {files} files, more than its limit of {limit}")]
    Files { files: u64, limit: u64 },
}

impl Limits {
    pub fn check(&self, tree: &Tree) -> Result<(), LimitExceeded> {
        self.check_counts(tree.total_bytes(), tree.len() as u64)
    }

    /// The same check over running totals (a scan stops at the first excess).
    pub fn check_counts(&self, bytes: u64, files: u64) -> Result<(), LimitExceeded> {
        if files > self.max_files {
            return Err(LimitExceeded::Files {
                files,
                limit: self.max_files,
            });
        }
        if bytes > self.max_bytes {
            return Err(LimitExceeded::Bytes {
                bytes,
                limit: self.max_bytes,
            });
        }
        Ok(())
    }
}

/// What happened to one path between two trees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Removed,
    Modified,
}

impl ChangeKind {
    /// One letter, as `toolgrid workspace diff` shows it.
    pub fn letter(self) -> char {
        match self {
            ChangeKind::Added => 'A',
            ChangeKind::Removed => 'D',
            ChangeKind::Modified => 'M',
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub path: WorkspacePath,
    pub kind: ChangeKind,
}

/// The changes from `old` to `new`, sorted by path.
pub fn diff(old: &Tree, new: &Tree) -> Vec<Change> {
    let mut out = Vec::new();
    let mut a = old.files.iter().peekable();
    let mut b = new.files.iter().peekable();
    loop {
        let change = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some((path, _)), None) => {
                let path = (*path).clone();
                a.next();
                Some((path, ChangeKind::Removed))
            }
            (None, Some((path, _))) => {
                let path = (*path).clone();
                b.next();
                Some((path, ChangeKind::Added))
            }
            (Some((pa, ea)), Some((pb, eb))) => match pa.cmp(pb) {
                std::cmp::Ordering::Less => {
                    let path = (*pa).clone();
                    a.next();
                    Some((path, ChangeKind::Removed))
                }
                std::cmp::Ordering::Greater => {
                    let path = (*pb).clone();
                    b.next();
                    Some((path, ChangeKind::Added))
                }
                std::cmp::Ordering::Equal => {
                    let changed = ea != eb;
                    let path = (*pa).clone();
                    a.next();
                    b.next();
                    changed.then_some((path, ChangeKind::Modified))
                }
            },
        };
        if let Some((path, kind)) = change {
            out.push(Change { path, kind });
        }
    }
    out
}

/// Names one agent's workspace.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkspaceKey {
    pub namespace: String,
    pub agent: String,
}

impl WorkspaceKey {
    pub fn new(namespace: impl Into<String>, agent: impl Into<String>) -> Self {
        WorkspaceKey {
            namespace: namespace.into(),
            agent: agent.into(),
        }
    }

    /// The workspace a call in `namespace` with `access` sees, if any.
    pub fn of_call(namespace: &str, access: &CallAccess) -> Option<Self> {
        match (&access.agent, access.filesystem) {
            (Some(agent), Filesystem::ReadOnly | Filesystem::ReadWrite) => {
                Some(WorkspaceKey::new(namespace, agent.clone()))
            }
            _ => None,
        }
    }

    /// The workspace a call writes, if it writes one.
    pub fn written_by(namespace: &str, access: &CallAccess) -> Option<Self> {
        match access.filesystem {
            Filesystem::ReadWrite => WorkspaceKey::of_call(namespace, access),
            _ => None,
        }
    }
}

impl fmt::Display for WorkspaceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.agent)
    }
}

/// One stored version of a workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub key: WorkspaceKey,
    pub version: u64,
    pub tree: Tree,
    /// [`Tree::digest`] of `tree`.
    pub tree_digest: String,
    pub created_at_ms: i64,
    /// The call whose success committed it.
    pub call_id: String,
}

impl Version {
    /// Version 0: the empty tree every workspace starts from (not stored).
    pub fn empty(key: WorkspaceKey) -> Self {
        let tree = Tree::default();
        Version {
            key,
            version: 0,
            tree_digest: tree.digest(),
            tree,
            created_at_ms: 0,
            call_id: String::new(),
        }
    }
}

/// What a succeeded read-write call commits: its final tree and the blobs the base did not
/// have. The version it becomes (base + 1) is the store's to decide.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Commit {
    pub tree: Tree,
    /// `(digest, bytes)` of blobs the store may not have yet.
    pub blobs: Vec<(String, Vec<u8>)>,
}

/// Whether `principal` may read the workspace `key`: operators read any; an agent reads
/// only its own. (Wired to the caller authentication of the front doors.)
pub fn may_read(principal: &Principal, key: &WorkspaceKey) -> bool {
    match principal {
        Principal::Operator { .. } => true,
        Principal::Agent { agent } => agent.namespace == key.namespace && agent.name == key.agent,
    }
}

/// The scheduler's one-writer-per-workspace rule: a read-write call holds its workspace
/// from its first assignment until it ends (across fencing and re-assignment, so a replay
/// commits on the base it started from); another read-write call of the same workspace is
/// not assigned meanwhile. Read-only calls and calls without a workspace never wait.
#[derive(Debug, Default)]
pub struct WriteLocks {
    holders: HashMap<WorkspaceKey, String>,
}

impl WriteLocks {
    /// Whether `call_id` (which writes `key`, if `Some`) may be assigned now.
    pub fn may_assign(&self, key: Option<&WorkspaceKey>, call_id: &str) -> bool {
        match key.and_then(|k| self.holders.get(k)) {
            Some(holder) => holder == call_id,
            None => true,
        }
    }

    /// Records `call_id` as the writer of `key`; false if another call holds it.
    pub fn take(&mut self, key: Option<&WorkspaceKey>, call_id: &str) -> bool {
        let Some(key) = key else { return true };
        match self.holders.get(key) {
            Some(holder) => holder == call_id,
            None => {
                self.holders.insert(key.clone(), call_id.to_string());
                true
            }
        }
    }

    /// The call ended (or is forgotten): its workspace is free.
    pub fn release(&mut self, call_id: &str) {
        self.holders.retain(|_, holder| holder != call_id);
    }

    pub fn holder(&self, key: &WorkspaceKey) -> Option<&str> {
        self.holders.get(key).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ObjectKey;

    fn tree(files: &[(&str, &[u8])]) -> Tree {
        Tree {
            files: files
                .iter()
                .map(|(p, b)| {
                    (
                        WorkspacePath::parse(p).unwrap(),
                        FileEntry {
                            digest: blob_digest(b),
                            size: b.len() as u64,
                        },
                    )
                })
                .collect(),
        }
    }

    #[test]
    fn hostile_paths_are_refused_by_name() {
        assert_eq!(WorkspacePath::parse(""), Err(PathError::Empty));
        assert!(matches!(
            WorkspacePath::parse("/etc/passwd"),
            Err(PathError::Absolute(_))
        ));
        for dots in ["..", "../x", "a/../b", "a/./b", ".", "a/.."] {
            assert!(
                matches!(WorkspacePath::parse(dots), Err(PathError::DotComponent(_))),
                "{dots}"
            );
        }
        for empty in ["a//b", "a/", "a/b/"] {
            assert!(
                matches!(
                    WorkspacePath::parse(empty),
                    Err(PathError::EmptyComponent(_))
                ),
                "{empty}"
            );
        }
        assert!(matches!(
            WorkspacePath::parse("a\\..\\b"),
            Err(PathError::BadCharacter(_))
        ));
        assert!(matches!(
            WorkspacePath::parse("a\0b"),
            Err(PathError::BadCharacter(_))
        ));
        assert!(matches!(
            WorkspacePath::from_bytes(b"caf\xe9"),
            Err(PathError::NotUtf8(_))
        ));
        assert_eq!(
            WorkspacePath::parse(&"a".repeat(MAX_PATH_BYTES + 1)),
            Err(PathError::TooLong)
        );
        assert_eq!(
            WorkspacePath::parse(&vec!["d"; MAX_PATH_DEPTH + 1].join("/")),
            Err(PathError::TooLong)
        );
        assert_eq!(
            WorkspacePath::parse("notes/..hidden/a.txt")
                .unwrap()
                .as_str(),
            "notes/..hidden/a.txt"
        );
        // A serialized tree with a hostile path does not load.
        assert!(Tree::from_json(r#"{"../x":{"digest":"sha256:00","size":0}}"#).is_err());
    }

    #[test]
    fn a_tree_refuses_bad_digests_and_a_file_that_is_also_a_directory() {
        let good = blob_digest(b"x");
        assert!(
            Tree::from_rows([("a/b".into(), good.clone(), 1)]).is_ok(),
            "a nested file"
        );
        assert!(matches!(
            Tree::from_rows([("a".into(), "md5:00".into(), 1)]),
            Err(TreeError::BadDigest { .. })
        ));
        assert!(matches!(
            Tree::from_rows([
                ("a".into(), good.clone(), 1),
                ("a/b".into(), good.clone(), 1)
            ]),
            Err(TreeError::FileAndDirectory { .. })
        ));
        assert!(matches!(
            Tree::from_rows([("/a".into(), good, 1)]),
            Err(TreeError::Path(PathError::Absolute(_)))
        ));
    }

    #[test]
    fn the_tree_digest_depends_on_content_not_on_insertion_order() {
        let a = tree(&[("x", b"1"), ("d/y", b"2")]);
        let b = tree(&[("d/y", b"2"), ("x", b"1")]);
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), tree(&[("x", b"1"), ("d/y", b"3")]).digest());
        assert_eq!(Tree::from_json(&a.to_json()).unwrap(), a);
    }

    #[test]
    fn diff_names_added_removed_and_modified_paths_in_order() {
        let old = tree(&[("a", b"1"), ("b", b"2"), ("c", b"3")]);
        let new = tree(&[("b", b"2"), ("c", b"4"), ("d", b"5")]);
        let changes: Vec<(String, ChangeKind)> = diff(&old, &new)
            .into_iter()
            .map(|c| (c.path.to_string(), c.kind))
            .collect();
        assert_eq!(
            changes,
            vec![
                ("a".into(), ChangeKind::Removed),
                ("c".into(), ChangeKind::Modified),
                ("d".into(), ChangeKind::Added),
            ]
        );
        assert!(diff(&old, &old).is_empty());
    }

    #[test]
    fn limits_count_bytes_and_files() {
        let limits = Limits {
            max_bytes: 3,
            max_files: 2,
        };
        assert!(limits.check(&tree(&[("a", b"12"), ("b", b"3")])).is_ok());
        assert_eq!(
            limits.check(&tree(&[("a", b"12"), ("b", b"34")])),
            Err(LimitExceeded::Bytes { bytes: 4, limit: 3 })
        );
        assert_eq!(
            limits.check(&tree(&[("a", b""), ("b", b""), ("c", b"")])),
            Err(LimitExceeded::Files { files: 3, limit: 2 })
        );
    }

    #[test]
    fn list_shows_files_and_subdirectories_of_one_level() {
        let t = tree(&[("a", b"1"), ("d/x", b"2"), ("d/e/y", b"3")]);
        let root: Vec<String> = t.list(None).into_iter().map(|(n, _)| n).collect();
        assert_eq!(root, vec!["a", "d/"]);
        let d = WorkspacePath::parse("d").unwrap();
        let sub: Vec<String> = t.list(Some(&d)).into_iter().map(|(n, _)| n).collect();
        assert_eq!(sub, vec!["e/", "x"]);
    }

    #[test]
    fn an_agent_reads_only_its_own_workspace_and_operators_read_any() {
        let key = WorkspaceKey::new("team", "reporter");
        let me = Principal::Agent {
            agent: ObjectKey::new("team", "reporter"),
        };
        let other = Principal::Agent {
            agent: ObjectKey::new("team", "writer"),
        };
        let elsewhere = Principal::Agent {
            agent: ObjectKey::new("other", "reporter"),
        };
        assert!(may_read(&me, &key));
        assert!(!may_read(&other, &key));
        assert!(!may_read(&elsewhere, &key));
        assert!(may_read(
            &Principal::Operator {
                subject: "admin".into()
            },
            &key
        ));
    }

    #[test]
    fn only_read_write_calls_of_an_agent_take_the_write_lock() {
        let mut access = crate::fixtures::access("a", Filesystem::ReadWrite);
        assert_eq!(
            WorkspaceKey::written_by("ns", &access),
            Some(WorkspaceKey::new("ns", "a"))
        );
        access.filesystem = Filesystem::ReadOnly;
        assert_eq!(WorkspaceKey::written_by("ns", &access), None);
        assert!(WorkspaceKey::of_call("ns", &access).is_some());
        access.filesystem = Filesystem::None;
        assert_eq!(WorkspaceKey::of_call("ns", &access), None);
        access.filesystem = Filesystem::ReadWrite;
        access.agent = None;
        assert_eq!(WorkspaceKey::written_by("ns", &access), None);
    }

    #[test]
    fn one_writer_per_workspace_until_it_releases() {
        let mut locks = WriteLocks::default();
        let ws = WorkspaceKey::new("ns", "a");
        let other = WorkspaceKey::new("ns", "b");
        assert!(locks.take(Some(&ws), "c1"));
        assert!(locks.may_assign(Some(&ws), "c1"), "the holder again");
        assert!(!locks.may_assign(Some(&ws), "c2"));
        assert!(!locks.take(Some(&ws), "c2"));
        assert!(locks.may_assign(Some(&other), "c2"), "another workspace");
        assert!(locks.may_assign(None, "c3"), "no workspace written");
        locks.release("c1");
        assert!(locks.take(Some(&ws), "c2"));
        assert_eq!(locks.holder(&ws), Some("c2"));
    }
}
