//! The `toolgrid` binary: every subcommand lives in [`toolgrid::cli`].

fn main() -> std::process::ExitCode {
    toolgrid::cli::main()
}
