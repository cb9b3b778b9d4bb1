//! Compiles the gRPC proto with protox (pure Rust), so building needs no system `protoc`.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["podpath/v1/api.proto"], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("podpath_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        .btree_map(".")
        .build_server(true)
        .build_client(true)
        // Malformed messages are INVALID_ARGUMENT (tonic-prost says INTERNAL).
        .codec_path("crate::grpc_codec::ProstCodec")
        .compile_fds(fds)?;
    Ok(())
}
