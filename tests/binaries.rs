//! The two binaries. `toolgrid-worker`, the binary a WorkerPool's pods run, is `toolgrid
//! worker` alone: the tests that start workers beside `toolgrid up --no-workers` (failover,
//! drain, worker authentication) run it (`common::WorkerProcess`); `up`'s own workers are
//! `toolgrid worker`. Here: the two take the same arguments, the worker binary is a worker
//! only, and both are linked with their relative relocations packed (`build.rs`). A release
//! build also lays out the functions a process runs together (`link/symbol-order.txt`).

use crate::common::{TOOLGRID, TOOLGRID_WORKER};
use object::read::ReadCache;
use object::{Object, ObjectSection, ObjectSymbol};
use std::collections::BTreeSet;
use std::process::Command;

/// The sizes of a binary's packed (`.relr.dyn`) and unpacked (`.rela.dyn`) dynamic
/// relocations, read from its section headers.
fn relocations(binary: &str) -> (u64, u64) {
    let file = std::fs::File::open(binary).expect("open the binary");
    let cache = ReadCache::new(file);
    let elf = object::File::parse(&cache).expect("an ELF file");
    let size = |name: &str| elf.section_by_name(name).map_or(0, |s| s.size());
    (size(".relr.dyn"), size(".rela.dyn"))
}

/// The loader reads a position-independent binary's relocation table at every start, and
/// it stayed resident in every process: 2.7 MB of `.rela.dyn` in the release `toolgrid`,
/// nearly all of them relative relocations, which `-z pack-relative-relocs` writes as a
/// bitmap instead.
#[test]
fn both_binaries_pack_their_relative_relocations() {
    for binary in [TOOLGRID, TOOLGRID_WORKER] {
        let (packed, unpacked) = relocations(binary);
        assert!(packed > 0, "{binary}: no .relr.dyn");
        assert!(
            unpacked < 64 * 1024,
            "{binary}: {unpacked} bytes of .rela.dyn left unpacked"
        );
    }
}

/// The long options a `--help` lists.
fn options(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let line = line.strip_prefix("-h, ").unwrap_or(line);
            let line = line.strip_prefix("-V, ").unwrap_or(line);
            line.strip_prefix("--").map(|rest| {
                rest.split([' ', '=', '<'])
                    .next()
                    .unwrap_or(rest)
                    .to_string()
            })
        })
        .collect()
}

fn help(command: &mut Command) -> String {
    let output = command.arg("--help").output().expect("run --help");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).expect("help is UTF-8")
}

#[test]
fn toolgrid_worker_takes_the_arguments_of_toolgrid_worker() {
    let alone = options(&help(&mut Command::new(TOOLGRID_WORKER)));
    let subcommand = options(&help(Command::new(TOOLGRID).arg("worker")));
    for option in [
        "control-plane",
        "pool",
        "slots",
        "cache",
        "join-token-file",
        "token-file",
    ] {
        assert!(alone.contains(option), "--{option} missing: {alone:?}");
    }
    // `--version` is the binary's own; the rest is the same command.
    let alone: BTreeSet<_> = alone.into_iter().filter(|o| o != "version").collect();
    let subcommand: BTreeSet<_> = subcommand.into_iter().filter(|o| o != "version").collect();
    assert_eq!(alone, subcommand);
    let version = Command::new(TOOLGRID_WORKER)
        .arg("--version")
        .output()
        .expect("run --version");
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("toolgrid-worker {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn toolgrid_worker_runs_no_other_command() {
    for command in ["up", "worker", "call"] {
        let output = Command::new(TOOLGRID_WORKER)
            .arg(command)
            .output()
            .expect("run toolgrid-worker");
        // clap's usage error: exit status 2, the argument named.
        assert_eq!(output.status.code(), Some(2), "{output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("unexpected argument '{command}'")),
            "{stderr}"
        );
    }
}

/// A mangled name without its legacy hash (`17h<16 hex>E`), which differs between the debug
/// build the tests run and the release build the order was made from.
fn unhashed(name: &str) -> &str {
    match name.len().checked_sub(20) {
        Some(at)
            if name.is_char_boundary(at)
                && name[at..].starts_with("17h")
                && name.ends_with('E') =>
        {
            &name[..at]
        }
        _ => name,
    }
}

/// `link/symbol-order.txt` (written by `scripts/symbol-order.sh` from a release build) names
/// functions of this code base: the control plane's and the worker's, each once, and all
/// but a few still found in this build. A list gone stale would order nothing and the
/// release binaries' memory would grow back unnoticed until the next bench.
#[test]
fn the_symbol_order_names_functions_of_this_code_base() {
    let order = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("link/symbol-order.txt"),
    )
    .expect("link/symbol-order.txt");
    let names: Vec<&str> = order.lines().collect();
    assert!(names.len() > 1000, "{} names", names.len());
    let distinct: BTreeSet<&str> = names.iter().copied().collect();
    assert_eq!(distinct.len(), names.len(), "a name is listed twice");
    for part in [
        "toolgrid_control_plane",
        "toolgrid_worker",
        "toolgrid_store",
    ] {
        assert!(
            names.iter().any(|n| n.contains(part)),
            "no function of {part} is ordered"
        );
    }
    let file = std::fs::File::open(TOOLGRID).expect("open the binary");
    let cache = ReadCache::new(file);
    let elf = object::File::parse(&cache).expect("an ELF file");
    let built: BTreeSet<String> = elf
        .symbols()
        .filter_map(|s| s.name().ok().map(|n| unhashed(n).to_string()))
        .collect();
    let found = names.iter().filter(|n| built.contains(unhashed(n))).count();
    assert!(
        found * 10 >= names.len() * 9,
        "only {found} of the {} ordered functions are in this build: run scripts/symbol-order.sh",
        names.len()
    );
}
