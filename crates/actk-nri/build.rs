//! Compiles the NRI and ttrpc protos (proto/, written for actk from the published ones) with
//! protox, a pure-Rust protobuf compiler: messages only (ttrpc is framed by hand, src/ttrpc.rs).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nri/api.proto");
    println!("cargo:rerun-if-changed=proto/ttrpc/ttrpc.proto");
    let fds = protox::compile(["nri/api.proto", "ttrpc/ttrpc.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(false).build_server(false).compile_fds(fds)?;
    Ok(())
}
