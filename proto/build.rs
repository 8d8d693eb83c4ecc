//! Generates the sqlbee.v1 messages and services from the .proto files at
//! build time (needs `protoc`, installed by `./x setup`), so the generated
//! code always matches the protocol definition.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["sqlbee/v1/ingest.proto", "sqlbee/v1/query.proto"];
    for proto in protos {
        println!("cargo::rerun-if-changed={proto}");
    }
    tonic_prost_build::configure().codec_path("crate::codec::SliceCodec").compile_protos(&protos, &["."])?;
    Ok(())
}
