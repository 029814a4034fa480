//! Compiles proto/podresources/v1/api.proto (the kubelet's PodResources API, the subset actk
//! reads) with protox, a pure-Rust protobuf compiler, so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/podresources/v1/api.proto");
    let fds = protox::compile(["podresources/v1/api.proto"], ["proto"])?;
    // The server is built too: tests emulate the kubelet's side of the socket.
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
