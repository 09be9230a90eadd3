//! Compiles the protos with `protox` (pure Rust), so no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "kvtier/v1/kvtier.proto",
        "kvtier/v1/wire.proto",
        "kvstore/kvstore.proto",
    ];
    let root = "../../proto";
    for f in &files {
        println!("cargo:rerun-if-changed={root}/{f}");
    }
    let fds = protox::compile(files, [root])?;
    // The encoded descriptors, for gRPC server reflection (grpcurl, grpcui, Postman).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("kvtier_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        // Payloads are MB-sized: decode them as `bytes::Bytes` (zero-copy slices of
        // the receive buffer) instead of `Vec<u8>`.
        .bytes(".")
        // List lengths are checked before decoding (src/bounded.rs).
        .codec_path("crate::bounded::BoundedCodec")
        .compile_fds(fds)?;
    Ok(())
}
