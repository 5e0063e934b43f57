//! The files output on a local folder (a temporary one per test): each transaction's
//! batch is one file under its final name, published only if the name is free; a
//! restart discards what its generation wrote and removes the temporaries of writers
//! that died, and a former holder of the shard still writing never publishes over the
//! new holder's batches.

use serde_json::json;
use sluice_files_output::{Config, FilesEndpoint, Resource, parse_batch_file_name};
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, OutputEndpoint, Target,
};
use std::path::{Path, PathBuf};

fn endpoint(directory: &Path, generation: Generation) -> FilesEndpoint {
    let config: Config =
        sluice_output_sdk::config::parse(&json!({ "directory": directory })).unwrap();
    let resource = Resource {
        path: "views".into(),
    };
    let target = Target {
        materialization: "m".into(),
        resource: json!({"path": "views"}),
        format: Format::Json,
        header: None,
        generation,
        former_writers: false,
    };
    FilesEndpoint::new(&config, &resource, &target).unwrap()
}

fn generation() -> Generation {
    Generation {
        id: GenerationId::mint(),
        adopts_unstamped: false,
    }
}

/// Transaction `txn`'s lines `lines` as one push.
fn lines(txn: u64, lines: &[&str]) -> Buffer {
    let mut buffer = Buffer::default();
    buffer.start(txn);
    for line in lines {
        buffer.push(b"", format!("{line}\n").as_bytes());
    }
    buffer
}

/// Transaction `txn`'s batch of `content`, written whole.
async fn batch(e: &mut FilesEndpoint, txn: u64, content: &[&str]) {
    e.batch_start(txn, BatchKind::Delta).await.unwrap();
    e.push(&lines(txn, content)).await.unwrap();
    e.batch_end().await.unwrap();
}

/// `(txn, contents)` of every batch file of the binding, in name order, and the names
/// of the temporary files beside them.
fn folder(directory: &Path) -> (Vec<(u64, String)>, Vec<String>) {
    let dir: PathBuf = directory.join("views");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let (temporaries, batches): (Vec<String>, Vec<String>) =
        names.into_iter().partition(|n| n.starts_with('.'));
    let batches = (batches.iter())
        .map(|name| {
            let file = parse_batch_file_name(name).unwrap_or_else(|| panic!("{name}"));
            (file.txn, std::fs::read_to_string(dir.join(name)).unwrap())
        })
        .collect();
    (batches, temporaries)
}

#[tokio::test]
async fn a_restart_discards_written_transactions_and_removes_a_dead_writers_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let g = generation();
    let mut e = endpoint(dir.path(), g);
    e.open().await.unwrap();
    batch(&mut e, 1, &["a"]).await;
    batch(&mut e, 2, &["b", "c"]).await;
    e.batch_start(3, BatchKind::Delta).await.unwrap();
    e.push(&lines(3, &["d"])).await.unwrap();
    drop(e); // a crash: the temporary stays, its lock goes with the process
    let (batches, temporaries) = folder(dir.path());
    assert_eq!(batches, vec![(1, "a\n".into()), (2, "b\nc\n".into())]);
    assert_eq!(temporaries.len(), 1, "{temporaries:?}");
    assert!(temporaries[0].ends_with(".tmp"), "{temporaries:?}");

    let mut e = endpoint(dir.path(), g);
    e.open().await.unwrap();
    assert_eq!(folder(dir.path()).1, Vec::<String>::new());
    batch(&mut e, 2, &["replayed"]).await; // written: discarded
    batch(&mut e, 3, &["d"]).await;
    assert_eq!(
        folder(dir.path()),
        (
            vec![(1, "a\n".into()), (2, "b\nc\n".into()), (3, "d\n".into())],
            vec![]
        )
    );
}

/// A former holder Z of the shard and the new holder H write the same transaction at
/// once (the same bytes, as the runtime replays it): H's start leaves Z's temporary to
/// it, the first to finish publishes the batch, the other's is discarded, and neither
/// publishes the other's half-written file.
#[tokio::test]
async fn writers_of_one_transaction_at_once_publish_it_once_whole() {
    let dir = tempfile::tempdir().unwrap();
    let g = generation();
    let mut former = endpoint(dir.path(), g);
    former.open().await.unwrap();
    batch(&mut former, 1, &["a"]).await;
    former.batch_start(2, BatchKind::Delta).await.unwrap();
    former.push(&lines(2, &["b"])).await.unwrap();

    let mut holder = endpoint(dir.path(), g);
    holder.open().await.unwrap();
    assert_eq!(
        folder(dir.path()).1.len(),
        1,
        "the former holder's temporary is kept"
    );
    holder.batch_start(2, BatchKind::Delta).await.unwrap();
    holder.push(&lines(2, &["b"])).await.unwrap();
    former.push(&lines(2, &["c"])).await.unwrap();
    former.batch_end().await.unwrap();
    holder.push(&lines(2, &["c"])).await.unwrap();
    holder.batch_end().await.unwrap(); // the name is taken: discarded
    batch(&mut holder, 3, &["d"]).await;

    assert_eq!(
        folder(dir.path()),
        (
            vec![(1, "a\n".into()), (2, "b\nc\n".into()), (3, "d\n".into())],
            vec![]
        )
    );
}

/// A former holder that finishes its batch after the new holder replayed the
/// transaction and went on publishes nothing: the new holder's file stays as it is.
#[tokio::test]
async fn a_former_writers_late_batch_is_discarded_not_published_over_the_new_holders() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let g = generation();
    let mut former = endpoint(dir.path(), g);
    former.open().await.unwrap();
    former.batch_start(1, BatchKind::Delta).await.unwrap();
    former.push(&lines(1, &["a"])).await.unwrap();

    let mut holder = endpoint(dir.path(), g);
    holder.open().await.unwrap();
    batch(&mut holder, 1, &["a", "b"]).await;
    batch(&mut holder, 2, &["c"]).await;
    let published = dir
        .path()
        .join("views")
        .join(sluice_files_output::batch_file_name(
            g.id,
            1,
            BatchKind::Delta,
            Format::Json,
        ));
    let inode = std::fs::metadata(&published).unwrap().ino();

    former.push(&lines(1, &["b"])).await.unwrap();
    former.batch_end().await.unwrap();
    assert_eq!(std::fs::metadata(&published).unwrap().ino(), inode);
    assert_eq!(
        folder(dir.path()),
        (vec![(1, "a\nb\n".into()), (2, "c\n".into())], vec![])
    );
}
