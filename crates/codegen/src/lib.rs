//! Typed code from tool definitions: `toolgrid gen client --lang python|typescript [TOOL...]
//! -o DIR` writes a typed client per tool, calling the HTTP API, and code mode describes the
//! tools a program may call with [`typescript::stubs`].
//!
//! The generators ([`python`], [`typescript`]) are pure: a [`ToolDef`] in, one source file
//! out, each spelling JSON Schema as its types through the one walker in `types`. Whatever
//! a manifest says, what they write is valid and inert in the target language:
//! identifiers come from `names::Idents` (kebab-case to snake/camel case, keywords
//! and clashes escaped, never empty, never starting with a digit), and every text from
//! the manifest (descriptions, names on the wire, enum values) is written as an escaped
//! string literal or a comment that cannot close early.

mod defs;
mod names;
pub mod python;
mod types;
pub mod typescript;

pub use defs::ToolDef;

use toolgrid_core::error::{ApiError, ErrorKind};

/// Writes one file per tool to `dir`.
pub fn write_clients(
    dir: &std::path::Path,
    tools: &[ToolDef],
    lang: &str,
) -> Result<Vec<std::path::PathBuf>, ApiError> {
    let io = |e: std::io::Error| {
        ApiError::new(
            ErrorKind::InvalidArgument,
            format!("cannot write to {}: {e}", dir.display()),
        )
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut written = Vec::new();
    for tool in tools {
        let (file, text) = match lang {
            "python" => (python::file_name(tool), python::generate(tool)),
            "typescript" => (typescript::file_name(tool), typescript::generate(tool)),
            other => {
                return Err(ApiError::new(
                    ErrorKind::InvalidArgument,
                    format!("unknown language {other:?}: use python or typescript"),
                ));
            }
        };
        let path = dir.join(file);
        std::fs::write(&path, text).map_err(io)?;
        written.push(path);
    }
    Ok(written)
}
