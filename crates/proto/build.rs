//! Compiles `proto/*.proto` with protox (pure Rust), so no `protoc` install is needed.
//! The seed's protocol (`proto/`) and Flow's current one (`proto/current/`) define
//! messages of the same packages with different fields, so each is compiled on its
//! own, into a folder of its own.

use std::path::PathBuf;

fn compile(root: &str, files: &[&str], out_dir: PathBuf) {
    for file in files {
        println!("cargo:rerun-if-changed={root}/{file}");
    }
    std::fs::create_dir_all(&out_dir).expect("create the generated code's folder");
    let mut compiler = protox::Compiler::new([root]).expect("find the .proto files' root");
    compiler
        .include_source_info(true)
        .include_imports(true)
        .open_files(files)
        .expect("compile .proto files");
    // The encoded descriptor set, beside the code: what a reflecting codec (the current
    // protocol's JSON) reads the messages' fields from.
    std::fs::write(
        out_dir.join("descriptors.bin"),
        compiler.encode_file_descriptor_set(),
    )
    .expect("write the descriptor set");
    tonic_prost_build::configure()
        .out_dir(out_dir)
        .compile_fds(compiler.file_descriptor_set())
        .expect("generate Rust code from descriptors");
}

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    compile(
        "proto",
        &["flow.proto", "materialize.proto"],
        out.join("seed"),
    );
    compile(
        "proto/current",
        &["consumer.proto", "flow.proto", "materialize.proto"],
        out.join("current"),
    );
}
