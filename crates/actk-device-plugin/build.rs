//! Compiles proto/v1beta1/api.proto (the kubelet device plugin API) and
//! proto/podresources/v1/api.proto (the kubelet's PodResources API) with protox, a pure-Rust
//! protobuf compiler, so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/v1beta1/api.proto");
    println!("cargo:rerun-if-changed=proto/podresources/v1/api.proto");
    let fds = protox::compile(["v1beta1/api.proto", "podresources/v1/api.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
