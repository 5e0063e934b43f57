//! Fuzz targets (issue 34) of the HTTP source's body reader and the pgoutput decoder
//! (each through a `#[doc(hidden)]` entry point of its crate), and of the inverses of the Avro and CSV encoders. Whatever the bytes, each decoder returns
//! `Ok` or `Err`: never a panic, a hang, or an allocation the input's length does not
//! bound.
//!
//! Each target is a bounded `#[test]` (2 s of generated inputs, after the corpus in
//! `tests/__fuzz__/<target>/corpus`), and runs coverage-guided on stable Rust with
//! `cargo bolero test -p sluice-fuzz <target>`: see docs/fuzzing.md.

use apache_avro::{Schema, from_avro_datum};
use bytes::BytesMut;
use serde_json::{Value, json};
use sluice_output_sdk::encode::{
    Encoder, Encoding, Field, Fields, avro_schemas, encoder, read_csv_row,
};
use sluice_output_sdk::{Buffer, Change, Format, Op};
use sluice_sink_sdk::arrow::ColumnKind;
use std::sync::OnceLock;
use std::time::Duration;

/// How long each target generates inputs in a normal test run.
const TEST_TIME: Duration = Duration::from_secs(2);

/// Longest generated input: longer ones find little more and cost more per run.
const MAX_LEN: usize = 4096;

// The HTTP source's body reader.

/// `Batch::parse` on any request body: `Ok` or `Err`; what it accepts frames as a step's
/// data and reads back as itself.
#[test]
fn fuzz_body_parse_accepts_or_refuses_any_bytes() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            if let Ok(batch) = sluice_http::Batch::parse(bytes) {
                assert!(batch.bytes() <= bytes.len() as u64);
                let mut data = Vec::new();
                sluice_http::frame(&mut data, 1, Some("k"), 2, &batch);
                let framed = sluice_http::unframe(&data).expect("a framed batch unframes");
                assert_eq!(framed.len(), 1);
                assert_eq!(framed[0].batch, batch);
            }
        });
}

/// `unframe` on any step data read back from a store: `Ok` or `Err`.
#[test]
fn fuzz_unframe_reads_or_refuses_any_bytes() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let _ = sluice_http::unframe(bytes);
            // The same after the magic, so that generated inputs reach the frames.
            let mut data = b"SLH1".to_vec();
            data.extend_from_slice(bytes);
            let _ = sluice_http::unframe(&data);
        });
}

// The postgres_cdc source's pgoutput decoder.

/// `decode` on any message of the replication stream: a message or `Malformed`.
#[test]
fn fuzz_pgoutput_decode_returns_a_message_or_malformed() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let _ = sluice_postgres_cdc::decode_pgoutput(BytesMut::from(bytes));
        });
}

// The Avro encoder's inverse: apache-avro's datum reader, as tests read what the encoder
// writes.

/// apache-avro allocates a string's or bytes' claimed length (512 MiB at most by
/// default) before reading it: a reader of outside input bounds that first (a
/// process-wide setting, made once before any datum is read).
const MAX_AVRO_ALLOCATION: usize = 1 << 20;

/// A binding with a field of each kind, keys first.
fn avro_fields() -> Fields {
    let field = |name: &str, kind, nullable| Field {
        name: name.into(),
        ptr: format!("/{name}"),
        kind,
        nullable,
    };
    Fields {
        materialization: "fuzz".into(),
        name: "views".into(),
        keys: vec![
            field("id", ColumnKind::Utf8, false),
            field("shard", ColumnKind::Int64, false),
        ],
        values: vec![
            field("n", ColumnKind::Int64, true),
            field("score", ColumnKind::Float64, true),
            field("ok", ColumnKind::Boolean, true),
            field("name", ColumnKind::Utf8, true),
            field("meta", ColumnKind::Json, true),
            field("count", ColumnKind::Int64, false),
        ],
    }
}

/// The value and key schemas of [`avro_fields`], parsed.
fn avro_schemas_parsed() -> &'static (Schema, Schema) {
    static SCHEMAS: OnceLock<(Schema, Schema)> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        apache_avro::util::max_allocation_bytes(MAX_AVRO_ALLOCATION);
        let (value, key) = avro_schemas(&avro_fields()).expect("the schemas derive");
        (
            Schema::parse_str(&value).expect("the value schema parses"),
            Schema::parse_str(&key).expect("the key schema parses"),
        )
    })
}

/// One datum of `schema` read from the front of `bytes`, as JSON, and the number of bytes
/// left after it.
fn read_datum(schema: &Schema, bytes: &[u8]) -> Result<(Value, usize), String> {
    let mut rest = bytes;
    let datum = from_avro_datum(schema, &mut rest, None).map_err(|e| e.to_string())?;
    let value = Value::try_from(datum).map_err(|e| e.to_string())?;
    Ok((value, rest.len()))
}

/// apache-avro's datum reader on any bytes, with the value and the key schemas the
/// encoder derives: `Ok` or `Err`.
#[test]
fn fuzz_avro_datums_decode_or_fail() {
    let (value_schema, key_schema) = avro_schemas_parsed();
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            let _ = read_datum(value_schema, bytes);
            let _ = read_datum(key_schema, bytes);
        });
}

/// A generated document of [`avro_fields`]: id, shard, n, score, ok, name, meta, count.
type AvroDoc = (
    String,
    i64,
    Option<i64>,
    Option<f64>,
    Option<bool>,
    Option<String>,
    Option<Vec<String>>,
    i64,
);

/// What the encoder writes for any document reads back, to its last byte, as the
/// document's fields.
#[test]
fn fuzz_avro_encoded_documents_read_back() {
    let (value_schema, key_schema) = avro_schemas_parsed();
    bolero::check!()
        .with_type::<AvroDoc>()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|(id, shard, n, score, ok, name, meta, count)| {
            let doc = json!({"id": id, "shard": shard, "n": n, "score": score, "ok": ok,
                             "name": name, "meta": meta, "count": count});
            let mut avro = encoder(
                &Encoding {
                    format: Format::Avro,
                    ..Encoding::default()
                },
                avro_fields(),
            )
            .expect("the encoder builds");
            let messages = encode(avro.as_mut(), &doc);
            assert_eq!(messages.len(), 1);
            let (key, value) = &messages[0];
            assert_eq!(
                read_datum(key_schema, key),
                Ok((json!({"id": id, "shard": shard}), 0))
            );
            let meta = meta.as_ref().map(|m| json!(m).to_string());
            // A double that is not finite is JSON's null in the document.
            let expected = json!({"id": id, "shard": shard, "n": n, "score": doc["score"],
                                  "ok": ok, "name": name, "meta": meta, "count": count,
                                  "_op": "insert"});
            assert_eq!(read_datum(value_schema, value), Ok((expected, 0)));
        });
}

/// The messages of inserting `doc`, as (key, value).
fn encode(encoder: &mut dyn Encoder, doc: &Value) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Buffer::default();
    out.start(1);
    let change = Change {
        txn: 1,
        op: Op::Insert,
        before: None,
        after: Some(doc),
    };
    encoder
        .encode(&change, &mut out)
        .expect("the document encodes");
    out.messages()
        .map(|m| (m.key.to_vec(), m.value.to_vec()))
        .collect()
}

// The CSV encoder's inverse.

/// `read_csv_row` on any line: its cells, which hold no more than its bytes, or `Err`.
#[test]
fn fuzz_csv_rows_read_or_fail() {
    bolero::check!()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|bytes: &[u8]| {
            if let Ok(cells) = read_csv_row(bytes) {
                assert!(!cells.is_empty());
                let text: usize = cells.iter().flatten().map(String::len).sum();
                assert!(text <= bytes.len());
            }
        });
}

/// A row the encoder writes for any cells (text or null) reads back as those cells and
/// `_op`, and its header as the fields' names and `_op`.
#[test]
fn fuzz_csv_encoded_rows_read_back() {
    bolero::check!()
        .with_type::<Vec<Option<String>>>()
        .with_test_time(TEST_TIME)
        .with_iterations(usize::MAX)
        .with_max_len(MAX_LEN)
        .for_each(|cells| {
            let names: Vec<String> = (0..cells.len()).map(|i| format!("c{i}")).collect();
            let fields = Fields {
                materialization: "fuzz".into(),
                name: "rows".into(),
                keys: Vec::new(),
                values: (names.iter())
                    .map(|name| Field {
                        name: name.clone(),
                        ptr: format!("/{name}"),
                        kind: ColumnKind::Utf8,
                        nullable: true,
                    })
                    .collect(),
            };
            let doc: serde_json::Map<String, Value> = (names.iter().cloned())
                .zip(cells.iter().map(|c| json!(c)))
                .collect();
            let mut csv = encoder(
                &Encoding {
                    format: Format::Csv,
                    ..Encoding::default()
                },
                fields,
            )
            .expect("the encoder builds");
            let header = csv.header().expect("a CSV file has a header");
            let mut expected: Vec<Option<String>> = names.into_iter().map(Some).collect();
            expected.push(Some("_op".into()));
            assert_eq!(read_csv_row(&header), Ok(expected));

            let messages = encode(csv.as_mut(), &Value::Object(doc));
            assert_eq!(messages.len(), 1);
            let mut expected = cells.clone();
            expected.push(Some("insert".into()));
            assert_eq!(read_csv_row(&messages[0].1), Ok(expected));
        });
}
