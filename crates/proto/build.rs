//! Compiles `proto/*.proto` with protox (pure Rust), so no `protoc` install is needed.

fn main() {
    let files = ["proto/flow.proto", "proto/materialize.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"]).expect("compile .proto files");
    tonic_prost_build::configure()
        .compile_fds(descriptors)
        .expect("generate Rust code from descriptors");
}
