//! The key set of `toolgrid up`: a file in the data directory ([`KEY_FILE`], mode 0600,
//! replaced atomically), rotated at start and then hourly by [`IdentityKeys::spawn_rotation`].
//! In a cluster the same document ([`to_file`], [`from_file`]) lives in a Secret the
//! controller keeps and rotates; it swaps the set in with [`IdentityKeys::replace`].

use super::IdentityClaims;
use super::keys::{KeyError, PublicKey, SigningKey, SigningKeys, plan};
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use toolgrid_core::secret::SecretValue;

/// The file under the data directory holding the key set.
pub const KEY_FILE: &str = "identity-keys.json";

/// How often the running platform applies the rotation plan.
pub const ROTATION_CHECK: Duration = Duration::from_secs(3600);

/// Why the key file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a toolgrid identity key file ({message}): delete it to make new keys")]
    Invalid { path: PathBuf, message: String },
    #[error(transparent)]
    Key(#[from] KeyError),
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn unb64(text: &str) -> Result<Vec<u8>, String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|e| e.to_string())
}

/// The file's JSON.
#[derive(Serialize, Deserialize)]
struct KeyFile {
    version: u32,
    current: StoredKey,
    #[serde(default)]
    next: Option<StoredKey>,
    #[serde(default)]
    previous: Vec<StoredPublic>,
}

#[derive(Serialize, Deserialize)]
struct StoredKey {
    kid: String,
    created: i64,
    /// The PKCS#8 document, base64url.
    pkcs8: String,
}

#[derive(Serialize, Deserialize)]
struct StoredPublic {
    kid: String,
    created: i64,
    retired: i64,
    /// The public key, base64url.
    x: String,
}

impl StoredKey {
    fn of(key: &SigningKey) -> StoredKey {
        StoredKey {
            kid: key.kid.clone(),
            created: key.created,
            pkcs8: b64(key.pkcs8().expose()),
        }
    }

    fn key(&self) -> Result<SigningKey, String> {
        let key = SigningKey::from_pkcs8(SecretValue::new(unb64(&self.pkcs8)?), self.created)
            .map_err(|e| e.to_string())?;
        if key.kid != self.kid {
            return Err(format!("key {:?} has the id {:?}", self.kid, key.kid));
        }
        Ok(key)
    }
}

/// Serializes `keys` as the key file holds them (private keys included).
pub fn to_file(keys: &SigningKeys) -> Vec<u8> {
    let file = KeyFile {
        version: 1,
        current: StoredKey::of(&keys.current),
        next: keys.next.as_ref().map(StoredKey::of),
        previous: keys
            .previous
            .iter()
            .map(|p| StoredPublic {
                kid: p.kid.clone(),
                created: p.created,
                retired: p.retired,
                x: b64(&p.x),
            })
            .collect(),
    };
    let mut text = serde_json::to_vec_pretty(&file).unwrap_or_default();
    text.push(b'\n');
    text
}

/// The key set a document written by [`to_file`] holds, or why it is not one.
pub fn from_file(bytes: &[u8]) -> Result<SigningKeys, String> {
    let file: KeyFile = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if file.version != 1 {
        return Err(format!("version {}", file.version));
    }
    let previous = file
        .previous
        .iter()
        .map(|p| {
            let key = PublicKey {
                kid: p.kid.clone(),
                created: p.created,
                retired: p.retired,
                x: unb64(&p.x)?,
            };
            if key.is_consistent() {
                Ok(key)
            } else {
                Err(format!("retired key {:?} does not match its id", p.kid))
            }
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(SigningKeys {
        current: file.current.key()?,
        next: file.next.as_ref().map(StoredKey::key).transpose()?,
        previous,
    })
}

/// The key set stored at `path`, if there is one.
pub fn load(path: &Path) -> Result<Option<SigningKeys>, StoreError> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(StoreError::Read {
                path: path.to_path_buf(),
                source,
            });
        }
    };
    from_file(&bytes)
        .map(Some)
        .map_err(|message| StoreError::Invalid {
            path: path.to_path_buf(),
            message,
        })
}

/// Writes `keys` to `path`, readable by its owner only: to a temporary file beside it,
/// then renamed over it, so a reader (or a crash) never sees half a file.
pub fn save(path: &Path, keys: &SigningKeys) -> Result<(), StoreError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let write = |source| StoreError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".{}.tmp", std::process::id()));
    let temp = PathBuf::from(temp);
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temp)?;
        // A temporary file left by a crashed start keeps its mode on open: set it again.
        use std::os::unix::fs::PermissionsExt as _;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        file.write_all(&to_file(keys))?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        if let Some(dir) = path.parent()
            && let Ok(dir) = std::fs::File::open(dir)
        {
            let _ = dir.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result.map_err(write)
}

/// The key set at `path` after the rotation plan for `now` (made when there is none), and
/// whether it changed; a changed set is saved before it is returned.
pub fn load_or_create(path: &Path, now: i64) -> Result<(SigningKeys, bool), StoreError> {
    let stored = load(path)?;
    let step = plan(stored.as_ref(), now);
    match stored {
        Some(keys) if step.is_keep() => Ok((keys, false)),
        stored => {
            let keys = match stored {
                Some(keys) => keys.advance(step, now)?,
                None => SigningKeys::fresh(now)?,
            };
            save(path, &keys)?;
            Ok((keys, true))
        }
    }
}

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default()
}

/// The running platform's key set, shared by whoever mints tokens and the JWKS route, and
/// swapped whole when it rotates.
#[derive(Clone)]
pub struct IdentityKeys {
    keys: Arc<RwLock<SigningKeys>>,
    /// Where the set is saved; none for a set held in memory only.
    path: Option<PathBuf>,
}

impl std::fmt::Debug for IdentityKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityKeys")
            .field("keys", &*self.read())
            .field("path", &self.path)
            .finish()
    }
}

impl IdentityKeys {
    /// The key set of the data directory `data` (its [`KEY_FILE`]), rotated as due now.
    pub fn open(data: &Path) -> Result<IdentityKeys, StoreError> {
        let path = data.join(KEY_FILE);
        let (keys, changed) = load_or_create(&path, now_s())?;
        if changed {
            let (file, kid) = (path.display(), &keys.current.kid);
            tracing::info!(%file, %kid, "identity signing keys saved");
        }
        Ok(IdentityKeys {
            keys: Arc::new(RwLock::new(keys)),
            path: Some(path),
        })
    }

    /// A key set held in memory only (tests, and a cluster, whose controller keeps it in a
    /// Secret and swaps rotations in with [`IdentityKeys::replace`]).
    pub fn in_memory(keys: SigningKeys) -> IdentityKeys {
        IdentityKeys {
            keys: Arc::new(RwLock::new(keys)),
            path: None,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, SigningKeys> {
        self.keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A copy of the key set as it is now.
    pub fn snapshot(&self) -> SigningKeys {
        self.read().clone()
    }

    /// A token for `claims` at `now_s` (unix seconds), signed by the current key.
    pub fn mint(&self, claims: &IdentityClaims, now_s: i64) -> String {
        super::token::mint(&self.read(), claims, now_s)
    }

    /// The JWKS to publish now.
    pub fn jwks(&self) -> Value {
        super::jwks::jwks(&self.read())
    }

    /// Swaps in `keys` (stored elsewhere already), for every clone of this handle: the next
    /// token is signed, and the next JWKS published, from it.
    pub fn replace(&self, keys: SigningKeys) {
        *self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = keys;
    }

    /// Applies the rotation plan for `now`: the new set is saved first (when there is a
    /// file), then swapped in. Whether anything changed.
    pub fn rotate(&self, now: i64) -> Result<bool, StoreError> {
        let current = self.snapshot();
        let step = plan(Some(&current), now);
        if step.is_keep() {
            return Ok(false);
        }
        let kid = current.current.kid.clone();
        let keys = current.advance(step, now)?;
        if let Some(path) = &self.path {
            save(path, &keys)?;
        }
        let signing = &keys.current.kid;
        tracing::info!(?step, from = %kid, %signing, "identity signing keys rotated");
        self.replace(keys);
        Ok(true)
    }

    /// Applies the rotation plan every [`ROTATION_CHECK`] until the process ends; a set
    /// that cannot be saved stays as it is and is tried again at the next check.
    pub fn spawn_rotation(&self) -> tokio::task::JoinHandle<()> {
        let keys = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(ROTATION_CHECK);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                if let Err(error) = keys.rotate(now_s()) {
                    tracing::warn!(%error, "identity keys not rotated; retrying in an hour");
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::keys::{PUBLISH_AHEAD, ROTATE_AFTER};
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const NOW: i64 = 1_800_000_000;
    const D: i64 = 24 * 3600;

    #[test]
    fn the_key_file_is_made_once_for_the_owner_only_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        assert!(load(&path).unwrap().is_none());
        let (first, changed) = load_or_create(&path, NOW).unwrap();
        assert!(changed);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let (again, changed) = load_or_create(&path, NOW + 3600).unwrap();
        assert!(!changed);
        assert_eq!(again, first);
        // Nothing but the file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [KEY_FILE]);
    }

    #[test]
    fn a_rotation_is_saved_with_every_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let (first, _) = load_or_create(&path, NOW).unwrap();
        let ahead = NOW + (ROTATE_AFTER - PUBLISH_AHEAD).as_secs() as i64;
        let (with_next, changed) = load_or_create(&path, ahead).unwrap();
        assert!(changed && with_next.next.is_some());
        let (switched, changed) = load_or_create(&path, NOW + 30 * D).unwrap();
        assert!(changed);
        assert_eq!(switched.current, with_next.next.clone().unwrap());
        assert_eq!(switched.previous[0].kid, first.current.kid);
        assert_eq!(load(&path).unwrap().unwrap(), switched);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        std::fs::write(&path, "{}").unwrap();
        let error = load_or_create(&path, NOW).unwrap_err().to_string();
        assert!(
            error.contains(KEY_FILE) && error.contains("delete it"),
            "{error}"
        );
        // A key whose id was edited.
        let keys = SigningKeys::fresh(NOW).unwrap();
        let mut file: Value = serde_json::from_slice(&to_file(&keys)).unwrap();
        file["current"]["kid"] = "forged".into();
        std::fs::write(&path, file.to_string()).unwrap();
        assert!(load(&path).is_err());
    }

    #[test]
    fn the_shared_handle_mints_with_the_key_it_holds_and_swaps_on_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let (keys, _) = load_or_create(&path, NOW).unwrap();
        let handle = IdentityKeys {
            keys: Arc::new(RwLock::new(keys.clone())),
            path: Some(path.clone()),
        };
        let other = handle.clone();
        assert!(!handle.rotate(NOW + D).unwrap());
        assert!(handle.rotate(NOW + 30 * D).unwrap());
        let now = other.snapshot();
        assert_ne!(now.current.kid, keys.current.kid, "a clone sees the swap");
        assert_eq!(load(&path).unwrap().unwrap(), now, "saved before swapped");
        assert_eq!(other.jwks()["keys"].as_array().unwrap().len(), 2);
        let claims = IdentityClaims {
            issuer: "http://127.0.0.1:1".into(),
            audience: "http://127.0.0.1:2".into(),
            namespace: "default".into(),
            agent: "a".into(),
            tool: "t".into(),
            call: "c".into(),
        };
        let token = other.mint(&claims, NOW + 30 * D);
        assert!(token.starts_with("eyJ"));
        let debug = format!("{handle:?}");
        let secret = b64(now.current.pkcs8().expose());
        assert!(
            !debug.contains(&secret) && debug.contains(&now.current.kid),
            "{debug}"
        );
    }

    #[test]
    fn a_set_stored_elsewhere_reads_back_and_swaps_in_for_every_clone() {
        let keys = SigningKeys::fresh(NOW).unwrap();
        assert_eq!(from_file(&to_file(&keys)).unwrap(), keys);
        assert!(from_file(b"{}").is_err());
        let handle = IdentityKeys::in_memory(keys.clone());
        let other = handle.clone();
        let rotated = keys.advance(plan(None, NOW), NOW + 30 * D).unwrap();
        handle.replace(rotated.clone());
        assert_eq!(other.snapshot(), rotated);
        assert_eq!(
            other.jwks()["keys"][0]["kid"],
            Value::from(rotated.current.kid.clone())
        );
    }
}
