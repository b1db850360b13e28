//! Release artifacts: read from their source, checked against their digest, and validated
//! as WASI commands before a release can be Ready.

use super::manifest::Sourced;
use k8s_openapi::api::core::v1::ConfigMap;
use toolgrid_api::conditions::Reason;
use toolgrid_api::{ArtifactSource, ToolRelease};
use toolgrid_core::artifact::{FileRef, MAX_RELEASE_FILES, check_file_path};
use toolgrid_core::artifact::{digest_of, is_valid_digest};
use toolgrid_core::spec::ReleaseFile;

pub use toolgrid_core::artifact::MAX_ARTIFACT_BYTES;

/// What became of a release's artifact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArtifactOutcome {
    Ready {
        digest: String,
        size: u64,
        /// `module` or `component`.
        kind: &'static str,
        /// The release's read-only files (`spec.files`), each loaded and checked.
        files: Vec<FileRef>,
        /// The commands that run their own artifact (`spec.commands`), each loaded and
        /// checked.
        commands: Vec<CommandRef>,
    },
    Failed {
        /// CamelCase condition reason.
        reason: Reason,
        message: String,
    },
}

/// An artifact's outcome and, when Ready, its bytes (to put in the store).
#[derive(Clone, Debug)]
pub struct LoadedArtifact {
    pub outcome: ArtifactOutcome,
    pub bytes: Option<Vec<u8>>,
    /// The bytes of the release's files and of its commands' artifacts and files, by
    /// digest, when Ready (to put in the store; empty when they are known to be stored
    /// already).
    pub file_bytes: Vec<(String, Vec<u8>)>,
}

/// A command's own artifact (`spec.commands[]`), loaded and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandRef {
    /// The Tool's command.
    pub name: String,
    pub digest: String,
    pub size: u64,
    /// `module` or `component`.
    pub kind: &'static str,
    /// The command's read-only files (`spec.commands[].files`).
    pub files: Vec<FileRef>,
}

/// A command's artifact and files with their bytes (those read now), by digest.
#[derive(Clone, Debug)]
pub struct LoadedCommand {
    pub command: CommandRef,
    pub bytes: Vec<(String, Vec<u8>)>,
}

/// Largest number of commands a release may give their own artifact.
pub const MAX_COMMAND_ARTIFACTS: usize = 16;

impl LoadedArtifact {
    /// An artifact that is not Ready, and why.
    pub fn failed(reason: Reason, message: impl Into<String>) -> Self {
        LoadedArtifact {
            outcome: ArtifactOutcome::Failed {
                reason,
                message: message.into(),
            },
            bytes: None,
            file_bytes: Vec::new(),
        }
    }

    /// This artifact with the release's files: Ready only when every file is.
    pub fn with_files(mut self, files: Vec<Result<LoadedFile, (Reason, String)>>) -> Self {
        let ArtifactOutcome::Ready { files: refs, .. } = &mut self.outcome else {
            return self;
        };
        for file in files {
            match file {
                Ok(file) => {
                    refs.push(file.file);
                    if let Some(bytes) = file.bytes {
                        self.file_bytes
                            .push((refs[refs.len() - 1].digest.clone(), bytes));
                    }
                }
                Err((reason, message)) => return LoadedArtifact::failed(reason, message),
            }
        }
        self
    }
}

impl LoadedArtifact {
    /// This artifact with its commands' (`spec.commands`): Ready only when every one is.
    pub fn with_commands(mut self, commands: Vec<Result<LoadedCommand, (Reason, String)>>) -> Self {
        let ArtifactOutcome::Ready { commands: refs, .. } = &mut self.outcome else {
            return self;
        };
        for command in commands {
            match command {
                Ok(command) => {
                    refs.push(command.command);
                    self.file_bytes.extend(command.bytes);
                }
                Err((reason, message)) => return LoadedArtifact::failed(reason, message),
            }
        }
        self
    }

    /// `spec.commands[index]` loaded like a release (its artifact and its files), as that
    /// command; a failure's message names the command's fields.
    pub fn into_command(self, index: usize, name: &str) -> Result<LoadedCommand, (Reason, String)> {
        match self.outcome {
            ArtifactOutcome::Ready {
                digest,
                size,
                kind,
                files,
                ..
            } => {
                let mut bytes = self.file_bytes;
                if let Some(artifact) = self.bytes {
                    bytes.push((digest.clone(), artifact));
                }
                Ok(LoadedCommand {
                    command: CommandRef {
                        name: name.to_string(),
                        digest,
                        size,
                        kind,
                        files,
                    },
                    bytes,
                })
            }
            ArtifactOutcome::Failed { reason, message } => {
                Err((reason, about_command(index, &message)))
            }
        }
    }
}

/// A message about a release's `spec.artifact` or `spec.files` made about
/// `spec.commands[index]`'s.
pub fn about_command(index: usize, message: &str) -> String {
    message
        .replacen(
            "spec.artifact",
            &format!("spec.commands[{index}].artifact"),
            1,
        )
        .replacen("spec.files", &format!("spec.commands[{index}].files"), 1)
}

/// One of a release's files, checked against its digest.
#[derive(Clone, Debug)]
pub struct LoadedFile {
    pub file: FileRef,
    /// Its bytes (none when they were stored before and not read again).
    pub bytes: Option<Vec<u8>>,
}

/// Checks a release's `spec.files` as declared (how many, their paths, their digests)
/// before any is read.
pub fn check_files(files: &[ReleaseFile]) -> Result<(), (Reason, String)> {
    if files.len() > MAX_RELEASE_FILES {
        return Err((
            Reason::InvalidReleaseFile,
            format!(
                "spec.files: {} files; a release may mount at most {MAX_RELEASE_FILES}",
                files.len()
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, file) in files.iter().enumerate() {
        check_file_path(&file.path).map_err(|e| {
            (
                Reason::InvalidReleaseFile,
                format!("spec.files[{i}].path: {e}"),
            )
        })?;
        if !seen.insert(file.path.as_str()) {
            return Err((
                Reason::InvalidReleaseFile,
                format!("spec.files[{i}].path: {:?} is mounted twice", file.path),
            ));
        }
        match file.artifact.digest.as_deref() {
            None => {
                return Err((
                    Reason::InvalidReleaseFile,
                    format!(
                        "spec.files[{i}].artifact.digest is required: a file is pinned by digest"
                    ),
                ));
            }
            Some(digest) if !is_valid_digest(digest) => {
                return Err((
                    Reason::InvalidDigest,
                    format!(
                        "spec.files[{i}].artifact.digest {digest:?} is not of the form sha256:<64 lowercase hex digits>"
                    ),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Checks the bytes of `spec.files[index]` against its digest.
pub fn check_file(
    index: usize,
    file: &ReleaseFile,
    bytes: Vec<u8>,
) -> Result<LoadedFile, (Reason, String)> {
    let digest = digest_of(&bytes);
    let expected = file.artifact.digest.as_deref().unwrap_or_default();
    if digest != expected {
        return Err((
            Reason::DigestMismatch,
            format!(
                "spec.files[{index}].artifact.digest is {expected} but the file's digest is {digest}"
            ),
        ));
    }
    Ok(LoadedFile {
        file: FileRef {
            path: file.path.clone(),
            digest,
            size: bytes.len() as u64,
        },
        bytes: Some(bytes),
    })
}

/// A message about `spec.artifact` made about `spec.files[index].artifact`.
pub fn about_file(index: usize, (reason, message): (Reason, String)) -> (Reason, String) {
    (
        reason,
        message.replacen("spec.artifact", &format!("spec.files[{index}].artifact"), 1),
    )
}

/// Verifies `bytes` against the expected digest (if any) and validates them as a command.
pub fn check_bytes(bytes: Vec<u8>, expected: Option<&str>) -> LoadedArtifact {
    let digest = digest_of(&bytes);
    if let Some(expected) = expected
        && expected != digest
    {
        return LoadedArtifact::failed(
            Reason::DigestMismatch,
            format!("spec.artifact.digest is {expected} but the artifact's digest is {digest}"),
        );
    }
    match toolgrid_core::artifact::validate_command(&bytes) {
        Ok(kind) => LoadedArtifact {
            outcome: ArtifactOutcome::Ready {
                digest,
                size: bytes.len() as u64,
                kind,
                files: Vec::new(),
                commands: Vec::new(),
            },
            bytes: Some(bytes),
            file_bytes: Vec::new(),
        },
        Err(error) => LoadedArtifact::failed(Reason::InvalidArtifact, error.to_string()),
    }
}

/// The single source an artifact names, or why it names none or several.
pub fn source_kind(artifact: &ArtifactSource) -> Result<&'static str, String> {
    let set: Vec<&str> = [
        artifact.file.as_ref().map(|_| "file"),
        artifact.config_map.as_ref().map(|_| "configMap"),
        artifact.url.as_ref().map(|_| "url"),
    ]
    .into_iter()
    .flatten()
    .collect();
    match set.as_slice() {
        [one] => Ok(one),
        [] => Err("spec.artifact: name exactly one of file, configMap or url".into()),
        many => Err(format!(
            "spec.artifact: name exactly one source, not {}",
            many.join(" and ")
        )),
    }
}

/// Loads a release's artifact in a manifest directory: a file relative to the manifest, or
/// a key of a ConfigMap declared beside it, with its files and its commands' artifacts
/// (`spec.commands`). URLs are fetched by the cluster controller.
pub fn load_local(
    release: &Sourced<ToolRelease>,
    config_maps: &[Sourced<ConfigMap>],
) -> LoadedArtifact {
    let spec = &release.object.spec;
    let namespace = release
        .object
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default();
    let dir = release.source.dir();
    let loaded = load_local_parts(&spec.artifact, &spec.files, dir, namespace, config_maps);
    let commands = spec
        .commands
        .iter()
        .enumerate()
        .map(|(i, command)| {
            load_local_parts(
                &command.artifact,
                &command.files,
                dir,
                namespace,
                config_maps,
            )
            .into_command(i, &command.name)
        })
        .collect();
    loaded.with_commands(commands)
}

/// An artifact and its files in a manifest directory, as a release's.
fn load_local_parts(
    artifact: &ArtifactSource,
    files: &[ReleaseFile],
    dir: &std::path::Path,
    namespace: &str,
    config_maps: &[Sourced<ConfigMap>],
) -> LoadedArtifact {
    let loaded = match read_local(artifact, dir, namespace, config_maps) {
        Ok(bytes) => check_bytes(bytes, artifact.digest.as_deref()),
        Err((reason, message)) => return LoadedArtifact::failed(reason, message),
    };
    if let Err((reason, message)) = check_files(files) {
        return LoadedArtifact::failed(reason, message);
    }
    let files = files
        .iter()
        .enumerate()
        .map(|(i, file)| {
            read_local(&file.artifact, dir, namespace, config_maps)
                .map_err(|e| about_file(i, e))
                .and_then(|bytes| check_file(i, file, bytes))
        })
        .collect();
    loaded.with_files(files)
}

/// The bytes an artifact names in a manifest directory (`dir`: the manifest's), not yet
/// checked against its digest, or why there are none.
pub fn read_local(
    artifact: &ArtifactSource,
    dir: &std::path::Path,
    namespace: &str,
    config_maps: &[Sourced<ConfigMap>],
) -> Result<Vec<u8>, (Reason, String)> {
    let source = source_kind(artifact).map_err(|m| (Reason::InvalidArtifactSource, m))?;
    if let Some(digest) = &artifact.digest
        && !is_valid_digest(digest)
    {
        return Err((
            Reason::InvalidDigest,
            format!(
                "spec.artifact.digest {digest:?} is not of the form sha256:<64 lowercase hex digits>"
            ),
        ));
    }
    match source {
        "file" => {
            let relative = artifact.file.as_deref().unwrap_or_default();
            let path = dir.join(relative);
            read_artifact_file(&path).map_err(|error| match error {
                ArtifactFileError::Unreadable(error) => (
                    Reason::ArtifactNotFound,
                    format!(
                        "spec.artifact.file: cannot read {}: {error}",
                        path.display()
                    ),
                ),
                error => (
                    Reason::InvalidArtifactFile,
                    format!("spec.artifact.file: {}: {error}", path.display()),
                ),
            })
        }
        "configMap" => {
            let Some(reference) = &artifact.config_map else {
                return Err((
                    Reason::InvalidArtifactSource,
                    "spec.artifact.configMap is empty".into(),
                ));
            };
            config_map_key(config_maps, namespace, &reference.name, &reference.key)
                .map_err(|m| (Reason::ArtifactNotFound, m))
        }
        _ => {
            if artifact.digest.is_none() {
                return Err((
                    Reason::InvalidArtifactSource,
                    "spec.artifact.url requires spec.artifact.digest".into(),
                ));
            }
            Err((
                Reason::UnsupportedSource,
                "spec.artifact.url is fetched by the cluster controller; in a manifest directory use file or configMap".into(),
            ))
        }
    }
}

/// A wasm Middleware's component: its digest and bytes, or why it cannot be used.
#[derive(Clone, Debug)]
pub enum WasmArtifact {
    Ready {
        digest: String,
        bytes: std::sync::Arc<Vec<u8>>,
    },
    Failed {
        reason: Reason,
        message: String,
    },
}

/// Verifies a wasm middleware's bytes against the expected digest (if any) and checks they
/// are a middleware component ([`toolgrid_core::artifact::validate_middleware`]).
pub fn check_middleware_bytes(bytes: Vec<u8>, expected: Option<&str>) -> WasmArtifact {
    let digest = digest_of(&bytes);
    if let Some(expected) = expected
        && expected != digest
    {
        return WasmArtifact::Failed {
            reason: Reason::DigestMismatch,
            message: format!(
                "spec.wasm.artifact.digest is {expected} but the artifact's digest is {digest}"
            ),
        };
    }
    match toolgrid_core::artifact::validate_middleware(&bytes) {
        Ok(()) => WasmArtifact::Ready {
            digest,
            bytes: std::sync::Arc::new(bytes),
        },
        Err(error) => WasmArtifact::Failed {
            reason: Reason::InvalidArtifact,
            message: format!("spec.wasm.artifact: {error}"),
        },
    }
}

/// Loads the component of a wasm Middleware in a manifest directory (`None`: not a wasm
/// step), like a release's artifact ([`load_local`]).
pub fn load_local_middleware(
    middleware: &Sourced<toolgrid_api::Middleware>,
    config_maps: &[Sourced<ConfigMap>],
) -> Option<WasmArtifact> {
    let artifact = &middleware.object.spec.wasm.as_ref()?.artifact;
    let namespace = middleware
        .object
        .metadata
        .namespace
        .as_deref()
        .unwrap_or_default();
    Some(
        match read_local(artifact, middleware.source.dir(), namespace, config_maps) {
            Ok(bytes) => check_middleware_bytes(bytes, artifact.digest.as_deref()),
            Err((reason, message)) => WasmArtifact::Failed {
                reason,
                message: message.replacen("spec.artifact", "spec.wasm.artifact", 1),
            },
        },
    )
}

/// Why an artifact file is not read.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactFileError {
    #[error("{0}")]
    Unreadable(#[from] std::io::Error),
    #[error("not a regular file (it is {0}); name a .wasm file")]
    NotAFile(&'static str),
    #[error("the file is larger than the {MAX_ARTIFACT_BYTES} bytes an artifact may have")]
    TooLarge,
}

/// Reads an artifact file: a regular file (a symbolic link to one is fine) of at most
/// [`MAX_ARTIFACT_BYTES`]; never a device, pipe or directory, and never more than that many
/// bytes even if the file grows while it is read.
pub fn read_artifact_file(path: &std::path::Path) -> Result<Vec<u8>, ArtifactFileError> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)?;
    let metadata = file.metadata()?;
    let file_type = metadata.file_type();
    if !file_type.is_file() {
        use std::os::unix::fs::FileTypeExt as _;
        let what = if file_type.is_dir() {
            "a directory"
        } else if file_type.is_char_device() {
            "a character device"
        } else if file_type.is_block_device() {
            "a block device"
        } else if file_type.is_fifo() {
            "a pipe"
        } else if file_type.is_socket() {
            "a socket"
        } else {
            "not a regular file"
        };
        return Err(ArtifactFileError::NotAFile(what));
    }
    if metadata.len() > MAX_ARTIFACT_BYTES {
        return Err(ArtifactFileError::TooLarge);
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(MAX_ARTIFACT_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_ARTIFACT_BYTES {
        return Err(ArtifactFileError::TooLarge);
    }
    Ok(bytes)
}

/// The bytes under `key` of a ConfigMap (`binaryData`, else `data`).
pub fn config_map_key(
    config_maps: &[Sourced<ConfigMap>],
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Vec<u8>, String> {
    config_map_entry(config_maps, namespace, name, key).map(|(_, bytes)| bytes)
}

/// The ConfigMap `namespace/name` and the bytes under its `key`.
pub fn config_map_entry<'a>(
    config_maps: &'a [Sourced<ConfigMap>],
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<(&'a ConfigMap, Vec<u8>), String> {
    let cm = config_maps
        .iter()
        .find(|cm| {
            cm.object.metadata.name.as_deref() == Some(name)
                && cm.object.metadata.namespace.as_deref() == Some(namespace)
        })
        .ok_or_else(|| format!("spec.artifact.configMap: no ConfigMap {namespace}/{name}"))?;
    let bytes = bytes_of(&cm.object, key).ok_or_else(|| {
        format!("spec.artifact.configMap: ConfigMap {namespace}/{name} has no key {key:?}")
    })?;
    Ok((&cm.object, bytes))
}

/// A key of a ConfigMap, from `binaryData` or `data`.
pub fn bytes_of(cm: &ConfigMap, key: &str) -> Option<Vec<u8>> {
    cm.binary_data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .or_else(|| {
            cm.data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|s| s.clone().into_bytes())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_is_ready_with_its_files_and_not_ready_when_one_is_wrong() {
        use super::super::manifest::{ResourceSet, load_text};
        let module = wat::parse_str(r#"(module (func (export "_start")))"#).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tool.wasm"), &module).unwrap();
        std::fs::write(dir.path().join("lib.zip"), b"zip bytes").unwrap();
        let lib = digest_of(b"zip bytes");
        let release = |name: &str, files: &str| {
            format!(
                "apiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: {name}}}\n\
                 spec: {{tool: t, version: 1.0.0, artifact: {{file: tool.wasm}}, files: [{files}]}}\n---\n"
            )
        };
        let text = [
            release("good", &format!("{{path: /usr/lib/x/lib.zip, artifact: {{file: lib.zip, digest: \"{lib}\"}}}}")),
            release("unpinned", "{path: /usr/lib/x/lib.zip, artifact: {file: lib.zip}}"),
            release(
                "wrong",
                &format!("{{path: /usr/lib/x/lib.zip, artifact: {{file: lib.zip, digest: \"sha256:{}\"}}}}", "0".repeat(64)),
            ),
            release("missing", &format!("{{path: /usr/lib/x/a, artifact: {{file: nope, digest: \"{lib}\"}}}}")),
            release("in-workspace", &format!("{{path: /workspace/a, artifact: {{file: lib.zip, digest: \"{lib}\"}}}}")),
            release(
                "twice",
                &format!("{{path: /x/a, artifact: {{file: lib.zip, digest: \"{lib}\"}}}}, {{path: /x/a, artifact: {{file: lib.zip, digest: \"{lib}\"}}}}"),
            ),
        ]
        .concat();
        let mut set = ResourceSet::default();
        load_text(&dir.path().join("r.yaml"), &text, &mut set);
        let outcome = |name: &str| {
            let release = set
                .releases
                .iter()
                .find(|r| r.object.metadata.name.as_deref() == Some(name))
                .unwrap();
            load_local(release, &set.config_maps)
        };
        let good = outcome("good");
        match &good.outcome {
            ArtifactOutcome::Ready { files, .. } => assert_eq!(
                files,
                &[FileRef {
                    path: "/usr/lib/x/lib.zip".into(),
                    digest: lib.clone(),
                    size: 9
                }]
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(good.file_bytes, [(lib.clone(), b"zip bytes".to_vec())]);
        let reason = |name: &str| match outcome(name).outcome {
            ArtifactOutcome::Failed { reason, message } => (reason, message),
            other => panic!("{name}: {other:?}"),
        };
        assert_eq!(reason("unpinned").0, Reason::InvalidReleaseFile);
        let (wrong, message) = reason("wrong");
        assert_eq!(wrong, Reason::DigestMismatch);
        assert!(
            message.starts_with("spec.files[0].artifact.digest"),
            "{message}"
        );
        let (missing, message) = reason("missing");
        assert_eq!(missing, Reason::ArtifactNotFound);
        assert!(
            message.starts_with("spec.files[0].artifact.file"),
            "{message}"
        );
        assert_eq!(reason("in-workspace").0, Reason::InvalidReleaseFile);
        let (twice, message) = reason("twice");
        assert_eq!(twice, Reason::InvalidReleaseFile);
        assert!(message.contains("mounted twice"), "{message}");
    }

    /// A command's own artifact and files are loaded and checked like the release's, their
    /// bytes go to the store with the release's, and a failure names the command's field.
    #[test]
    fn a_commands_artifact_is_loaded_with_its_files_and_its_failures_name_it() {
        use super::super::manifest::{ResourceSet, load_text};
        let js = wat::parse_str(r#"(module (func (export "_start")))"#).unwrap();
        let py = wat::parse_str(r#"(module (func (export "_start") nop))"#).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("js.wasm"), &js).unwrap();
        std::fs::write(dir.path().join("py.wasm"), &py).unwrap();
        std::fs::write(dir.path().join("lib.zip"), b"stdlib").unwrap();
        let (py_digest, lib) = (digest_of(&py), digest_of(b"stdlib"));
        let release = |name: &str, command: &str| {
            format!(
                "apiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: {name}}}\n\
                 spec: {{tool: code, version: 1.0.0, artifact: {{file: js.wasm}}, commands: [{command}]}}\n---\n"
            )
        };
        let zeros = format!("sha256:{}", "0".repeat(64));
        let text = [
            release("good", &format!("{{name: python, artifact: {{file: py.wasm, digest: \"{py_digest}\"}}, files: [{{path: /lib/py.zip, artifact: {{file: lib.zip, digest: \"{lib}\"}}}}]}}")),
            release("wrong", &format!("{{name: python, artifact: {{file: py.wasm, digest: \"{zeros}\"}}}}")),
            release("missing-file", &format!("{{name: python, artifact: {{file: py.wasm, digest: \"{py_digest}\"}}, files: [{{path: /lib/py.zip, artifact: {{file: nope, digest: \"{lib}\"}}}}]}}")),
            release("not-wasm", &format!("{{name: python, artifact: {{file: lib.zip, digest: \"{lib}\"}}}}")),
        ]
        .concat();
        let mut set = ResourceSet::default();
        load_text(&dir.path().join("r.yaml"), &text, &mut set);
        assert!(set.invalid.is_empty(), "{:?}", set.invalid);
        let outcome = |name: &str| {
            let release = set
                .releases
                .iter()
                .find(|r| r.object.metadata.name.as_deref() == Some(name))
                .unwrap();
            load_local(release, &set.config_maps)
        };
        let good = outcome("good");
        match &good.outcome {
            ArtifactOutcome::Ready {
                digest, commands, ..
            } => {
                assert_eq!(digest, &digest_of(&js));
                assert_eq!(
                    commands,
                    &[CommandRef {
                        name: "python".into(),
                        digest: py_digest.clone(),
                        size: py.len() as u64,
                        kind: "module",
                        files: vec![FileRef {
                            path: "/lib/py.zip".into(),
                            digest: lib.clone(),
                            size: 6
                        }],
                    }]
                );
            }
            other => panic!("{other:?}"),
        }
        let stored: Vec<&str> = good.file_bytes.iter().map(|(d, _)| d.as_str()).collect();
        assert_eq!(stored, [lib.as_str(), py_digest.as_str()]);
        let failed = |name: &str| match outcome(name).outcome {
            ArtifactOutcome::Failed { reason, message } => (reason, message),
            other => panic!("{name}: {other:?}"),
        };
        let (reason, message) = failed("wrong");
        assert_eq!(reason, Reason::DigestMismatch);
        assert!(
            message.starts_with("spec.commands[0].artifact.digest"),
            "{message}"
        );
        let (reason, message) = failed("missing-file");
        assert_eq!(reason, Reason::ArtifactNotFound);
        assert!(
            message.starts_with("spec.commands[0].files[0].artifact.file"),
            "{message}"
        );
        assert_eq!(failed("not-wasm").0, Reason::InvalidArtifact);
    }

    #[test]
    fn a_wasm_middleware_component_is_loaded_from_a_file_or_a_config_map_and_checked() {
        use super::super::manifest::{ResourceSet, load_text};
        let core = wat::parse_str(
            r#"(module (memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "toolgrid:middleware/decide@0.1.0#decide") (param i32 i32) (result i32) (i32.const 0)))"#,
        )
        .unwrap();
        let component = toolgrid_core::artifact::middleware_component(&core).unwrap();
        let digest = digest_of(&component);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("m.wasm"), &component).unwrap();
        std::fs::write(dir.path().join("core.wasm"), &core).unwrap();
        let text = format!(
            r#"apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: file}}
spec: {{wasm: {{artifact: {{file: m.wasm, digest: "{digest}"}}}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: core}}
spec: {{wasm: {{artifact: {{file: core.wasm}}}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: missing}}
spec: {{wasm: {{artifact: {{file: nope.wasm}}}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: pinned-wrong}}
spec: {{wasm: {{artifact: {{configMap: {{name: mw, key: m.wasm}}, digest: "sha256:{zeros}"}}}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: from-config-map}}
spec: {{wasm: {{artifact: {{configMap: {{name: mw, key: m.wasm}}}}}}}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: Middleware
metadata: {{name: not-wasm}}
spec: {{audit: {{}}}}
---
apiVersion: v1
kind: ConfigMap
metadata: {{name: mw}}
binaryData: {{m.wasm: "{b64}"}}
"#,
            zeros = "0".repeat(64),
            b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &component),
        );
        let mut set = ResourceSet::default();
        load_text(&dir.path().join("m.yaml"), &text, &mut set);
        assert!(set.invalid.is_empty(), "{:?}", set.invalid);
        let load = |name: &str| {
            let m = set
                .middleware
                .iter()
                .find(|m| m.object.metadata.name.as_deref() == Some(name))
                .unwrap();
            load_local_middleware(m, &set.config_maps)
        };
        let failed = |name: &str| match load(name) {
            Some(WasmArtifact::Failed { reason, message }) => (reason, message),
            other => panic!("{name}: {other:?}"),
        };
        for name in ["file", "from-config-map"] {
            let Some(WasmArtifact::Ready { digest: d, bytes }) = load(name) else {
                panic!("{name} loads")
            };
            assert_eq!(
                (d.as_str(), bytes.as_slice()),
                (digest.as_str(), &component[..])
            );
        }
        assert_eq!(failed("core").0, Reason::InvalidArtifact);
        assert!(failed("core").1.contains("core module"));
        assert_eq!(failed("missing").0, Reason::ArtifactNotFound);
        assert!(failed("missing").1.starts_with("spec.wasm.artifact.file"));
        assert_eq!(failed("pinned-wrong").0, Reason::DigestMismatch);
        assert!(load("not-wasm").is_none());
    }

    #[test]
    fn an_artifact_file_is_a_regular_file_of_bounded_size() {
        let error = read_artifact_file(std::path::Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(
            error,
            ArtifactFileError::NotAFile("a character device")
        ));
        assert_eq!(
            error.to_string(),
            "not a regular file (it is a character device); name a .wasm file"
        );
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            read_artifact_file(dir.path()),
            Err(ArtifactFileError::NotAFile("a directory"))
        ));
        let path = dir.path().join("tool.wasm");
        std::fs::write(&path, b"\0asm").unwrap();
        assert_eq!(read_artifact_file(&path).unwrap(), b"\0asm");
        // A sparse file larger than the limit is refused without being read.
        let big = std::fs::File::create(dir.path().join("big.wasm")).unwrap();
        big.set_len(MAX_ARTIFACT_BYTES + 1).unwrap();
        assert!(matches!(
            read_artifact_file(&dir.path().join("big.wasm")),
            Err(ArtifactFileError::TooLarge)
        ));
        assert!(matches!(
            read_artifact_file(&dir.path().join("missing.wasm")),
            Err(ArtifactFileError::Unreadable(_))
        ));
    }
}

/// What a release's local artifacts are now, without reading them: its spec's sources and,
/// for each file, its path, size, modification time and inode. Equal fingerprints mean the
/// bytes loaded before are still the bytes on disk, so a reload of the directory need not
/// read, hash and validate them again (a 154 MB runtime takes seconds). `None` when a
/// source is not a local file (a ConfigMap, a URL) or a file cannot be looked at: such a
/// release is loaded every time.
pub fn local_fingerprint(release: &Sourced<ToolRelease>) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let spec = &release.object.spec;
    let dir = release.source.dir();
    let mut sources: Vec<&ArtifactSource> = vec![&spec.artifact];
    sources.extend(spec.files.iter().map(|f| &f.artifact));
    for command in &spec.commands {
        sources.push(&command.artifact);
        sources.extend(command.files.iter().map(|f| &f.artifact));
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_string(spec).ok()?.hash(&mut hasher);
    for source in sources {
        if source.config_map.is_some() || source.url.is_some() {
            return None;
        }
        let path = dir.join(source.file.as_deref()?);
        let meta = std::fs::metadata(&path).ok()?;
        (
            path,
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec(),
            meta.ino(),
        )
            .hash(&mut hasher);
    }
    Some(hasher.finish())
}

#[cfg(test)]
mod fingerprint_tests {
    use super::*;
    use crate::manifest::{ResourceSet, load_text};

    fn release(dir: &std::path::Path, artifact: &str) -> Sourced<ToolRelease> {
        let mut set = ResourceSet::default();
        load_text(
            &dir.join("r.yaml"),
            &format!(
                "apiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: t-1.0.0}}\n\
                 spec: {{tool: t, version: 1.0.0, artifact: {artifact}}}\n"
            ),
            &mut set,
        );
        set.releases.remove(0)
    }

    #[test]
    fn a_fingerprint_changes_with_the_file_or_the_spec_and_only_local_files_have_one() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.wasm"), b"one").unwrap();
        let by_file = release(dir.path(), "{file: a.wasm}");
        let first = local_fingerprint(&by_file).expect("a local file");
        assert_eq!(local_fingerprint(&by_file), Some(first), "nothing changed");
        // The same path with other bytes: another fingerprint, so it is loaded again.
        std::fs::write(dir.path().join("a.wasm"), b"other").unwrap();
        let second = local_fingerprint(&by_file).unwrap();
        assert_ne!(first, second);
        // The spec changed (a digest named).
        let pinned = release(
            dir.path(),
            &format!("{{file: a.wasm, digest: \"sha256:{}\"}}", "0".repeat(64)),
        );
        assert_ne!(local_fingerprint(&pinned), Some(second));
        // A missing file, a ConfigMap or a URL: loaded every time.
        assert_eq!(
            local_fingerprint(&release(dir.path(), "{file: gone.wasm}")),
            None
        );
        assert_eq!(
            local_fingerprint(&release(dir.path(), "{configMap: {name: c, key: k}}")),
            None
        );
    }
}
