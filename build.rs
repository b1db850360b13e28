//! Link settings of the `toolgrid` and `toolgrid-worker` binaries.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        // Relative relocations packed (DT_RELR; glibc 2.36+ loads them): a
        // position-independent binary's table of them is a bitmap of a few KiB instead of
        // 2.7 MB, which the loader reads at every start and which stayed resident in every
        // process (BENCHMARKS.md). Rust links x86_64 Linux binaries with its own LLD, which
        // has the flag; so do GNU ld 2.38+ and mold, and an older GNU ld warns and ignores it.
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
