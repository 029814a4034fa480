//! Compiles the kubelet plugin registration API and the DRA plugin API (service versions v1
//! and v1beta1, the DRA resource health API v1 and v1alpha1) with protox, a pure-Rust protobuf compiler, so building needs no system `protoc`.

const PROTOS: &[&str] = &[
    "pluginregistration/v1/api.proto",
    "dra/v1/api.proto",
    "dra/v1beta1/api.proto",
    "dra-health/v1/api.proto",
    "dra-health/v1alpha1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for p in PROTOS {
        println!("cargo:rerun-if-changed=proto/{p}");
    }
    let fds = protox::compile(PROTOS, ["proto"])?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
