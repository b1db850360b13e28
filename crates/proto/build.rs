//! Generates the gRPC code from `proto/` with `protox`, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "../../proto/toolgrid/v1/tools.proto",
        "../../proto/toolgrid/v1/worker.proto",
        "../../proto/toolgrid/v1/workspaces.proto",
    ];
    let descriptors = protox::compile(files, ["../../proto"])?;
    // `Assign` carries secret values: its `Debug` is written by hand (src/lib.rs) and
    // shows neither them nor the environment.
    tonic_prost_build::configure()
        .skip_debug([".toolgrid.v1.Assign"])
        .compile_fds(descriptors)?;
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    Ok(())
}
