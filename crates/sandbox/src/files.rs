//! A release's read-only files on a worker (`spec.files`): each fetched once by digest and
//! kept beside the compiled-code cache, then laid out as one directory per guest directory,
//! holding exactly the files the release mounts there, for the sandbox to preopen read-only
//! ([`ReadOnlyMount`]).
//!
//! ```text
//! CACHE/files/blobs/<sha256 hex>          the bytes, checked against their digest
//! CACHE/files/dirs/<sha256 of the layout>/NAME   hard links (or copies) of the blobs
//! ```
//!
//! A blob or directory is written under a temporary name and renamed into place, so a
//! reader (another call, another worker sharing the cache) sees all of it or none. A blob
//! found on disk is hashed again once per process before it is trusted.

use crate::workspace::ReadOnlyMount;
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tokio::sync::OnceCell;
use toolgrid_core::artifact::{FileRef, check_file_path, digest_of, is_valid_digest};

/// Why a release's files could not be made ready for a call.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    #[error("release file {path:?}: {message}")]
    Invalid { path: String, message: String },
    #[error("cannot fetch release file {digest}: {message}")]
    Fetch { digest: String, message: String },
    #[error("release file {digest} does not match its digest (got {actual})")]
    DigestMismatch { digest: String, actual: String },
    #[error("cannot lay out the release's files: {0}")]
    Io(#[from] std::io::Error),
}

/// The files of every release this worker has run, by digest and by layout.
pub struct ReleaseFiles {
    root: PathBuf,
    blobs: Mutex<HashMap<String, Arc<OnceCell<PathBuf>>>>,
    dirs: Mutex<HashMap<String, Arc<OnceCell<PathBuf>>>>,
}

impl ReleaseFiles {
    pub fn new(cache_dir: &Path) -> Self {
        ReleaseFiles {
            root: cache_dir.join("files"),
            blobs: Mutex::default(),
            dirs: Mutex::default(),
        }
    }

    /// The read-only directories for `files`, fetching (with `fetch`, by digest) the blobs
    /// this worker does not have yet.
    pub async fn mounts<F, Fut>(
        &self,
        files: &[FileRef],
        fetch: F,
    ) -> Result<Vec<ReadOnlyMount>, FilesError>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, String>>,
    {
        let mut by_dir: BTreeMap<&str, Vec<&FileRef>> = BTreeMap::new();
        for file in files {
            check_file_path(&file.path).map_err(|e| FilesError::Invalid {
                path: file.path.clone(),
                message: e.to_string(),
            })?;
            if !is_valid_digest(&file.digest) {
                return Err(FilesError::Invalid {
                    path: file.path.clone(),
                    message: format!("{:?} is not a sha256 digest", file.digest),
                });
            }
            by_dir.entry(file.dir()).or_default().push(file);
        }
        let mut mounts = Vec::with_capacity(by_dir.len());
        for (guest, files) in by_dir {
            let mut blobs = Vec::with_capacity(files.len());
            for file in &files {
                blobs.push((file.name(), self.blob(&file.digest, &fetch).await?));
            }
            mounts.push(ReadOnlyMount {
                dir: self.dir(&blobs).await?,
                guest: guest.to_string(),
            });
        }
        Ok(mounts)
    }

    /// The path of the blob of `digest`, fetched and written once.
    async fn blob<F, Fut>(&self, digest: &str, fetch: &F) -> Result<PathBuf, FilesError>
    where
        F: Fn(String) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, String>>,
    {
        let cell = cell_of(&self.blobs, digest);
        let hex = digest.trim_start_matches("sha256:");
        let path = self.root.join("blobs").join(hex);
        cell.get_or_try_init(|| async {
            let on_disk = path.clone();
            let checked =
                tokio::task::spawn_blocking(move || -> std::io::Result<Option<String>> {
                    match std::fs::read(&on_disk) {
                        Ok(bytes) => Ok(Some(digest_of(&bytes))),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                        Err(e) => Err(e),
                    }
                })
                .await
                .map_err(std::io::Error::other)??;
            if checked.as_deref() == Some(digest) {
                return Ok(path.clone());
            }
            let bytes = fetch(digest.to_string())
                .await
                .map_err(|message| FilesError::Fetch {
                    digest: digest.to_string(),
                    message,
                })?;
            let actual = digest_of(&bytes);
            if actual != digest {
                return Err(FilesError::DigestMismatch {
                    digest: digest.to_string(),
                    actual,
                });
            }
            let target = path.clone();
            tokio::task::spawn_blocking(move || write_atomically(&target, &bytes))
                .await
                .map_err(std::io::Error::other)??;
            Ok(path.clone())
        })
        .await
        .cloned()
    }

    /// The directory holding exactly `blobs` under their names, made once.
    async fn dir(&self, blobs: &[(&str, PathBuf)]) -> Result<PathBuf, FilesError> {
        let mut layout = Sha256::new();
        for (name, blob) in blobs {
            layout.update(name.as_bytes());
            layout.update([0]);
            layout.update(blob.as_os_str().as_encoded_bytes());
            layout.update([0]);
        }
        let key = hex::encode(layout.finalize());
        let cell = cell_of(&self.dirs, &key);
        let path = self.root.join("dirs").join(&key);
        let entries: Vec<(String, PathBuf)> = blobs
            .iter()
            .map(|(name, blob)| (name.to_string(), blob.clone()))
            .collect();
        cell.get_or_try_init(|| async {
            let target = path.clone();
            tokio::task::spawn_blocking(move || lay_out(&target, &entries))
                .await
                .map_err(std::io::Error::other)??;
            Ok::<_, FilesError>(path.clone())
        })
        .await
        .cloned()
    }
}

fn cell_of(
    cells: &Mutex<HashMap<String, Arc<OnceCell<PathBuf>>>>,
    key: &str,
) -> Arc<OnceCell<PathBuf>> {
    let mut cells = cells.lock().unwrap_or_else(|e| e.into_inner());
    cells.entry(key.to_string()).or_default().clone()
}

/// A unique temporary name beside `path`.
fn temporary(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    path.with_extension(format!("tmp{}.{n}", std::process::id()))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = temporary(path);
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Makes `dir` hold exactly `entries` (name → blob, each checked this process): hard links,
/// or copies across file systems. It is made afresh once per process and swapped in, so an
/// earlier process's directory (whose links may predate a blob fetched again) is never used;
/// a call still holding the old one keeps its open handle.
fn lay_out(dir: &Path, entries: &[(String, PathBuf)]) -> std::io::Result<()> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = temporary(dir);
    let made = (|| {
        std::fs::create_dir(&tmp)?;
        for (name, blob) in entries {
            let link = tmp.join(name);
            if std::fs::hard_link(blob, &link).is_err() {
                std::fs::copy(blob, &link)?;
            }
        }
        if dir.exists() {
            let old = temporary(dir);
            std::fs::rename(dir, &old)?;
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(&tmp, dir)
    })();
    if made.is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    made
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn file(path: &str, bytes: &[u8]) -> FileRef {
        FileRef {
            path: path.into(),
            digest: digest_of(bytes),
            size: bytes.len() as u64,
        }
    }

    #[tokio::test]
    async fn files_are_fetched_once_and_laid_out_by_directory() {
        let cache = tempfile::tempdir().unwrap();
        let files = ReleaseFiles::new(cache.path());
        let fetches = AtomicUsize::new(0);
        let contents: HashMap<String, Vec<u8>> = [b"zip".to_vec(), b"model".to_vec()]
            .into_iter()
            .map(|b| (digest_of(&b), b))
            .collect();
        let fetch = |digest: String| {
            fetches.fetch_add(1, Ordering::SeqCst);
            let bytes = contents.get(&digest).cloned();
            async move { bytes.ok_or_else(|| "unknown".to_string()) }
        };
        let refs = [
            file("/usr/local/lib/python315.zip", b"zip"),
            file("/opt/model/weights.bin", b"model"),
        ];
        let mounts = files.mounts(&refs, fetch).await.unwrap();
        let mut guests: Vec<_> = mounts.iter().map(|m| m.guest.as_str()).collect();
        guests.sort();
        assert_eq!(guests, ["/opt/model", "/usr/local/lib"]);
        let lib = mounts.iter().find(|m| m.guest == "/usr/local/lib").unwrap();
        assert_eq!(
            std::fs::read(lib.dir.join("python315.zip")).unwrap(),
            b"zip"
        );
        assert_eq!(std::fs::read_dir(&lib.dir).unwrap().count(), 1);
        // The same files again: nothing fetched, the same directories.
        let again = files.mounts(&refs, fetch).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
        assert_eq!(again[0].dir, mounts[0].dir);
        // Another process (a fresh cache object) trusts the blobs on disk once checked.
        let other = ReleaseFiles::new(cache.path());
        other.mounts(&refs, fetch).await.unwrap();
        assert_eq!(fetches.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_blob_that_does_not_match_its_digest_is_refused_and_an_altered_one_fetched_again() {
        let cache = tempfile::tempdir().unwrap();
        let files = ReleaseFiles::new(cache.path());
        let refs = [file("/usr/lib/x/data", b"right")];
        let wrong = |_: String| async { Ok(b"wrong".to_vec()) };
        let error = files.mounts(&refs, wrong).await.unwrap_err();
        assert!(
            matches!(error, FilesError::DigestMismatch { .. }),
            "{error}"
        );

        let right = |_: String| async { Ok(b"right".to_vec()) };
        let mounts = files.mounts(&refs, right).await.unwrap();
        assert_eq!(std::fs::read(mounts[0].dir.join("data")).unwrap(), b"right");
        // Altered on disk: a fresh process hashes it, fetches it again and lays out its
        // directory afresh.
        let blob = cache
            .path()
            .join("files/blobs")
            .join(refs[0].digest.trim_start_matches("sha256:"));
        std::fs::write(&blob, b"tampered").unwrap();
        let other = ReleaseFiles::new(cache.path());
        let fetched = AtomicUsize::new(0);
        let counting = |_: String| {
            fetched.fetch_add(1, Ordering::SeqCst);
            async { Ok(b"right".to_vec()) }
        };
        let mounts = other.mounts(&refs, counting).await.unwrap();
        assert_eq!(fetched.load(Ordering::SeqCst), 1);
        assert_eq!(std::fs::read(&blob).unwrap(), b"right");
        assert_eq!(std::fs::read(mounts[0].dir.join("data")).unwrap(), b"right");
    }

    #[tokio::test]
    async fn a_path_in_the_workspace_or_with_dot_dot_is_refused() {
        let cache = tempfile::tempdir().unwrap();
        let files = ReleaseFiles::new(cache.path());
        let never = |_: String| async { Err::<Vec<u8>, _>("not asked".to_string()) };
        for path in ["/workspace/x", "/usr/../etc/passwd", "relative/x"] {
            let error = files.mounts(&[file(path, b"x")], never).await.unwrap_err();
            assert!(
                matches!(error, FilesError::Invalid { .. }),
                "{path}: {error}"
            );
        }
    }
}
