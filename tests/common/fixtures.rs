//! WebAssembly fixtures: the example tools, and small guests written in WAT that misbehave
//! on purpose.

use std::path::{Path, PathBuf};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Copies the example tools and manifests into `root` (`root/tools`, `root/manifests`).
pub fn examples(root: &Path) -> PathBuf {
    let manifests = root.join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    for entry in std::fs::read_dir(repo().join("examples/manifests")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, manifests.join(path.file_name().unwrap())).unwrap();
    }
    for tool in ["semver", "textstats", "uuid", "fetch"] {
        let dir = root.join("tools").join(tool);
        std::fs::create_dir_all(&dir).unwrap();
        let wasm = format!("{tool}.wasm");
        std::fs::copy(
            repo().join("examples/tools").join(tool).join(&wasm),
            dir.join(&wasm),
        )
        .unwrap();
    }
    manifests
}

/// Spins forever.
pub const LOOP: &str =
    r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;

/// Grows its memory until something stops it.
pub const MEMORY_BOMB: &str = r#"(module (memory (export "memory") 1)
  (func (export "_start") (loop (drop (memory.grow (i32.const 16))) (br 0))))"#;

/// Writes 60 000 bytes to stdout, forever.
pub const OUTPUT_FLOOD: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 60000))
    (loop (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16))) (br 0))))"#;

/// Executes `unreachable`.
pub const TRAP: &str =
    r#"(module (memory (export "memory") 1) (func (export "_start") unreachable))"#;

/// Prints `{"ok": true}` and exits 0.
pub const OK_JSON: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "{\"ok\": true}")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 12))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))"#;

/// Writes `wat` compiled to `dir/name`.
pub fn write_wat(dir: &Path, name: &str, wat: &str) -> PathBuf {
    let bytes = wat::parse_str(wat).expect("valid WAT");
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A Tool with one `default` command and its release, as YAML documents.
pub fn tool_manifest(name: &str, artifact: &str, timeout: &str, limits: &str) -> String {
    format!(
        r#"---
apiVersion: toolgrid.dev/v1alpha1
kind: Tool
metadata: {{name: {name}}}
spec: {{effect: read, timeout: {timeout}, commands: [{{name: default}}]}}
---
apiVersion: toolgrid.dev/v1alpha1
kind: ToolRelease
metadata: {{name: {name}-1.0.0}}
spec: {{tool: {name}, version: 1.0.0, artifact: {{file: {artifact}}}, limits: {limits}}}
"#
    )
}

/// The `slow` test fixture as a Tool and its release (YAML documents, `---` between them,
/// none after): `slow run --base URL --run ID [--steps N] [--sleep-ms M]`, allowed to reach
/// 127.0.0.1 on `witness_port` (a witness's).
pub fn slow_manifest(witness_port: u16) -> String {
    let wasm = repo().join("tests/fixtures/tools/slow/slow.wasm");
    format!(
        "apiVersion: toolgrid.dev/v1alpha1\nkind: Tool\nmetadata: {{name: slow}}\n\
         spec:\n  effect: read\n  timeout: 60s\n  repeatWindow: 0s\n  commands:\n    - name: run\n      \
         options:\n        - {{name: base, schema: {{type: string}}, required: true}}\n        \
         - {{name: run, schema: {{type: string}}, required: true}}\n        \
         - {{name: steps, schema: {{type: integer}}}}\n        \
         - {{name: sleep-ms, schema: {{type: integer}}}}\n      result: {{type: object}}\n---\n\
         apiVersion: toolgrid.dev/v1alpha1\nkind: ToolRelease\nmetadata: {{name: slow-1.0.0}}\n\
         spec:\n  tool: slow\n  version: 1.0.0\n  artifact: {{file: {}}}\n  \
         network: {{egress: [{{host: 127.0.0.1, ports: [{witness_port}], allowPrivate: true}}]}}\n",
        wasm.display(),
    )
}

/// An in-process worker runtime (4 slots, pooling) with its compiled-code cache in `cache`.
pub fn runtime(cache: &Path) -> toolgrid_sandbox::Runtime {
    toolgrid_sandbox::Runtime::new(&toolgrid_sandbox::RuntimeConfig {
        cache_dir: cache.to_path_buf(),
        slots: 4,
        max_memory_bytes: 1 << 30,
        pooling: true,
    })
    .unwrap()
}
