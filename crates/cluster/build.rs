//! Compiles `proto/etcd.proto` (the part of etcd's API the cluster uses) with protox,
//! so no `protoc` install is needed.

fn main() {
    let file = "proto/etcd.proto";
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file], ["proto"]).expect("compile etcd.proto");
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(descriptors)
        .expect("generate Rust code from descriptors");
}
