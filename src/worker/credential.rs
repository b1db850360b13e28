//! What a worker presents to the control plane when it attaches: the join token of
//! `toolgrid up` (given once), or, in a cluster, the pod's projected ServiceAccount token
//! (audience `toolgrid-worker`), which kubelet rotates in place: it is read again on every
//! (re)attach, never kept.

use std::path::{Path, PathBuf};

/// The largest token file read (projected tokens are a few KiB).
pub const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;

/// How a worker proves who it is.
#[derive(Clone, PartialEq, Eq)]
pub enum WorkerCredential {
    /// A secret shared with the control plane (`toolgrid worker --join-token`).
    JoinToken(String),
    /// A file holding a token that may change at any time (a projected ServiceAccount
    /// token: `TOOLGRID_WORKER_TOKEN_FILE`, set in the worker pods the controller makes).
    TokenFile(PathBuf),
}

/// Never prints a token.
impl std::fmt::Debug for WorkerCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkerCredential::JoinToken(_) => f.write_str("JoinToken(<redacted>)"),
            WorkerCredential::TokenFile(path) => f.debug_tuple("TokenFile").field(path).finish(),
        }
    }
}

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

impl WorkerCredential {
    /// The bearer token to present now: the join token, or the token file's current
    /// contents (surrounding whitespace trimmed). Call it for every attach.
    pub fn bearer(&self) -> Result<String, CredentialError> {
        match self {
            WorkerCredential::JoinToken(token) => {
                let token = token.trim();
                if token.is_empty() {
                    return Err(CredentialError::Empty("--join-token".into()));
                }
                Ok(token.to_string())
            }
            WorkerCredential::TokenFile(path) => read_token_file(path),
        }
    }
}

fn read_token_file(path: &Path) -> Result<String, CredentialError> {
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
        let credential = WorkerCredential::TokenFile(path.clone());
        assert_eq!(credential.bearer().unwrap(), "first-token");
        // kubelet swaps the file (through a symlink) before the token expires.
        std::fs::write(&path, "rotated-token").unwrap();
        assert_eq!(credential.bearer().unwrap(), "rotated-token");
    }

    #[test]
    fn a_missing_empty_or_oversized_token_file_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let credential = WorkerCredential::TokenFile(path.clone());
        assert!(matches!(
            credential.bearer(),
            Err(CredentialError::Unreadable { .. })
        ));
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(
            credential.bearer(),
            Err(CredentialError::Empty(_))
        ));
        std::fs::write(&path, vec![b'a'; MAX_TOKEN_FILE_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            credential.bearer(),
            Err(CredentialError::TooLarge(_))
        ));
    }

    #[test]
    fn a_join_token_is_presented_as_given_and_never_printed() {
        let credential = WorkerCredential::JoinToken("j0in-s3cret".into());
        assert_eq!(credential.bearer().unwrap(), "j0in-s3cret");
        assert!(!format!("{credential:?}").contains("s3cret"));
        assert!(matches!(
            WorkerCredential::JoinToken(String::new()).bearer(),
            Err(CredentialError::Empty(_))
        ));
    }
}
