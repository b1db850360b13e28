//! Link settings of the `toolgrid` and `toolgrid-worker` binaries.

use std::path::Path;

/// The functions a release build runs to start, serve calls and idle, one mangled name a
/// line (`scripts/symbol-order.sh` writes it).
const SYMBOL_ORDER: &str = "link/symbol-order.txt";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed={SYMBOL_ORDER}");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" {
        // Relative relocations packed (DT_RELR; glibc 2.36+ loads them): a
        // position-independent binary's table of them is a bitmap of a few KiB instead of
        // 2.7 MB, which the loader reads at every start and which stayed resident in every
        // process (BENCHMARKS.md). Rust links x86_64 Linux binaries with its own LLD, which
        // has the flag; so do GNU ld 2.38+ and mold, and an older GNU ld warns and ignores it.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    if var("PROFILE") == "release" && links_with_rust_lld(&var) {
        // The functions a process runs laid out together at the start of the code: a
        // process keeps every page of the binary it ran resident, with the 64 KiB around
        // each (the kernel maps them in one fault). An idle control plane ran 5.4 MiB of
        // functions spread over 21 MiB of such windows (BENCHMARKS.md). Names the binary
        // does not have are skipped: a list from an older build only orders less.
        let order = Path::new(&var("CARGO_MANIFEST_DIR")).join(SYMBOL_ORDER);
        if order.is_file() {
            println!(
                "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
                order.display()
            );
            println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        }
    }
}

/// Whether the binaries are linked by Rust's own LLD, which takes a symbol ordering file:
/// x86_64 Linux with no linker of the user's choosing (GNU ld has no such option).
fn links_with_rust_lld(var: &impl Fn(&str) -> String) -> bool {
    var("TARGET") == "x86_64-unknown-linux-gnu"
        && var("RUSTC_LINKER").is_empty()
        && !var("CARGO_ENCODED_RUSTFLAGS").contains("link")
}
