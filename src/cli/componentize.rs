//! `toolgrid componentize`: a WASI preview 1 command module becomes a preview 2 component
//! through the wasi_snapshot_preview1 command adapter that matches this wasmtime; with
//! `--middleware`, a core module implementing `wit/middleware.wit` with the canonical ABI
//! (built from C, say) becomes a wasm middleware component.

use anyhow::Context;
use std::path::PathBuf;
use wasi_preview1_component_adapter_provider::{
    WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME, WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
};

#[derive(clap::Args, Debug)]
pub struct ComponentizeArgs {
    /// The preview 1 module (exports `_start`).
    input: PathBuf,
    /// Where to write the component.
    output: PathBuf,
    /// The input is a wasm middleware's core module (exports `memory`, `cabi_realloc` and
    /// `toolgrid:middleware/decide@0.1.0#decide`, imports nothing), not a WASI command.
    #[arg(long)]
    middleware: bool,
}

pub fn run(args: ComponentizeArgs) -> anyhow::Result<()> {
    let module = std::fs::read(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    if args.middleware {
        let component = toolgrid_core::artifact::middleware_component(&module)
            .context("not a wasm middleware module")?;
        std::fs::write(&args.output, &component)
            .with_context(|| format!("cannot write {}", args.output.display()))?;
        eprintln!(
            "wrote {} ({} bytes, a middleware from a {}-byte module)",
            args.output.display(),
            component.len(),
            module.len()
        );
        return Ok(());
    }
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .context("not a WASI preview 1 module")?
        .adapter(
            WASI_SNAPSHOT_PREVIEW1_ADAPTER_NAME,
            WASI_SNAPSHOT_PREVIEW1_COMMAND_ADAPTER,
        )
        .context("cannot load the command adapter")?
        .validate(true)
        .encode()
        .context("cannot encode the component")?;
    std::fs::write(&args.output, &component)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    eprintln!(
        "wrote {} ({} bytes, from a {}-byte module)",
        args.output.display(),
        component.len(),
        module.len()
    );
    Ok(())
}
