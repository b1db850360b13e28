//! Generates the gRPC code from `proto/` with `protox`, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/toolgrid/v1/tools.proto",
        "proto/toolgrid/v1/worker.proto",
        "proto/toolgrid/v1/workspaces.proto",
    ];
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    Ok(())
}
