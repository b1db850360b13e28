//! What a worker presents to the control plane when it attaches: the join token of
//! `toolgrid up` (given once), or, in a cluster, the pod's projected ServiceAccount token
//! (audience `toolgrid-worker`), which kubelet rotates in place: it is read again on every
//! (re)attach, never kept.

use std::path::{Path, PathBuf};

/// The largest token file read (projected tokens are a few KiB).
pub const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("cannot read the worker token file {path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the worker token file {0} is larger than {MAX_TOKEN_FILE_BYTES} bytes")]
    TooLarge(PathBuf),
    #[error("the worker token {0} is empty")]
    Empty(String),
}

/// A token file's current contents (surrounding whitespace trimmed): read again for every
/// attach, bounded, and never empty.
pub fn read_token_file(path: &Path) -> Result<String, CredentialError> {
    use std::io::Read as _;
    let unreadable = |source| CredentialError::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(unreadable)?;
    let mut bytes = Vec::new();
    file.take(MAX_TOKEN_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_TOKEN_FILE_BYTES {
        return Err(CredentialError::TooLarge(path.to_path_buf()));
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        unreadable(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            e.utf8_error(),
        ))
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(CredentialError::Empty(path.display().to_string()));
    }
    Ok(token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_again_each_time_so_a_rotated_token_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first-token\n").unwrap();
        assert_eq!(read_token_file(&path).unwrap(), "first-token");
        // kubelet swaps the file (through a symlink) before the token expires.
        std::fs::write(&path, "rotated-token").unwrap();
        assert_eq!(read_token_file(&path).unwrap(), "rotated-token");
    }

    #[test]
    fn a_missing_empty_or_oversized_token_file_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        assert!(matches!(
            read_token_file(&path),
            Err(CredentialError::Unreadable { .. })
        ));
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(
            read_token_file(&path),
            Err(CredentialError::Empty(_))
        ));
        std::fs::write(&path, vec![b'a'; MAX_TOKEN_FILE_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            read_token_file(&path),
            Err(CredentialError::TooLarge(_))
        ));
    }
}
