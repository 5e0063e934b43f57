//! Collection schemas: compile errors, validation errors, inference and projections.

use serde_json::{Value, json};
use sluice_doc::Pointer;
use sluice_doc::Strategy;
use sluice_doc::schema::{Inference, Schema, SchemaError};

fn compile(schema: Value) -> Schema {
    Schema::compile(&schema).expect("schema compiles")
}

fn reduce_error(schema: Value) -> (String, String) {
    match Schema::compile(&schema) {
        Err(SchemaError::Reduce { location, reason }) => (location, reason),
        Err(other) => panic!("expected a reduce error, got {other}"),
        Ok(_) => panic!("expected a reduce error for {schema}"),
    }
}

fn views_schema() -> Value {
    json!({
        "type": "object",
        "required": ["user_id", "stats"],
        "reduce": {"strategy": "merge"},
        "properties": {
            "user_id": {"type": "string"},
            "views": {"type": "integer", "reduce": {"strategy": "sum"}},
            "last_seen": {"type": "string", "format": "date-time", "reduce": {"strategy": "maximize"}},
            "stats": {
                "type": "object",
                "required": ["count"],
                "properties": {"count": {"type": "integer"}, "ratio": {"type": ["number", "null"]}},
            },
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        },
    })
}

fn inference(schema: &Schema, ptr: &str) -> Inference {
    schema.inference(&Pointer::parse(ptr).unwrap())
}

#[test]
fn compiles_annotations_into_the_reducer() {
    let schema = compile(views_schema());
    assert_eq!(
        schema.reducer().strategy(),
        &Strategy::Merge { key: vec![] }
    );
    let mut doc = json!({"user_id": "u", "views": 1, "last_seen": "2024-01-01"});
    schema
        .reducer()
        .reduce(
            &mut doc,
            json!({"user_id": "u", "views": 2, "last_seen": "2023-12-31"}),
            false,
        )
        .unwrap();
    assert_eq!(
        doc,
        json!({"user_id": "u", "views": 3, "last_seen": "2024-01-01"})
    );
}

#[test]
fn keyed_strategies_parse_their_key_pointers() {
    let schema = compile(json!({"reduce": {"strategy": "maximize", "key": ["/a", "/b/0"]}}));
    let key = vec![
        Pointer::parse("/a").unwrap(),
        Pointer::parse("/b/0").unwrap(),
    ];
    assert_eq!(schema.reducer().strategy(), &Strategy::Maximize { key });
}

#[test]
fn unknown_strategy_is_an_error_naming_the_schema_location() {
    let (location, reason) =
        reduce_error(json!({"properties": {"a": {"reduce": {"strategy": "average"}}}}));
    assert_eq!(location, "#/properties/a/reduce");
    assert!(reason.contains("unknown strategy \"average\""), "{reason}");
}

#[test]
fn malformed_reduce_annotations_are_errors() {
    let cases = [
        (json!({"reduce": "sum"}), "expected an object"),
        (json!({"reduce": {}}), "missing \"strategy\""),
        (
            json!({"reduce": {"strategy": 1}}),
            "strategy must be a string",
        ),
        (
            json!({"reduce": {"strategy": "sum", "key": ["/a"]}}),
            "strategy \"sum\" has no option \"key\"",
        ),
        (
            json!({"reduce": {"strategy": "merge", "key": "/a"}}),
            "key must be an array",
        ),
        (
            json!({"reduce": {"strategy": "merge", "key": ["a"]}}),
            "invalid JSON pointer",
        ),
        (
            json!({"reduce": {"strategy": "merge", "extra": 1}}),
            "has no option \"extra\" (its options: key, delete)",
        ),
    ];
    for (schema, expect) in cases {
        let (location, reason) = reduce_error(schema.clone());
        assert_eq!(location, "#/reduce", "{schema}");
        assert!(reason.contains(expect), "{schema}: {reason}");
    }
}

#[test]
fn annotations_in_definitions_name_their_location() {
    let (location, _) = reduce_error(json!({
        "$defs": {"bad~/name": {"reduce": {"strategy": "nope"}}},
        "properties": {"a": {"$ref": "#/$defs/bad~0~1name"}},
    }));
    assert_eq!(location, "#/$defs/bad~0~1name/reduce");
}

#[test]
fn an_invalid_json_schema_is_refused() {
    let err = Schema::compile(&json!({"type": "nonsense"})).unwrap_err();
    assert!(matches!(err, SchemaError::Invalid(_)), "{err}");
}

#[test]
fn valid_documents_pass() {
    let schema = compile(views_schema());
    schema
        .validate(&json!({"user_id": "u", "stats": {"count": 1}, "views": 3}))
        .unwrap();
}

#[test]
fn validation_errors_name_the_document_pointer() {
    let schema = compile(views_schema());
    let err = schema
        .validate(&json!({"user_id": "u", "stats": {"count": "one"}}))
        .unwrap_err();
    assert_eq!(err.pointer, "/stats/count");
    assert!(
        err.reason.contains("\"one\"") && err.reason.contains("integer"),
        "{}",
        err.reason
    );
    assert!(
        err.to_string()
            .starts_with("document is invalid at /stats/count: "),
        "{err}"
    );

    let err = schema
        .validate(&json!({"user_id": "u", "stats": {"count": 1}, "tags": ["a", 2]}))
        .unwrap_err();
    assert_eq!(err.pointer, "/tags/1");
}

#[test]
fn a_missing_required_property_is_reported_at_its_own_location() {
    let schema = compile(views_schema());
    let err = schema
        .validate(&json!({"stats": {"count": 1}}))
        .unwrap_err();
    assert_eq!(err.pointer, "/user_id");
    assert!(err.reason.starts_with("missing"), "{}", err.reason);
    assert!(
        err.to_string()
            .starts_with("document is invalid at /user_id: missing"),
        "{err}"
    );
}

#[test]
fn inference_reports_types_existence_and_format() {
    let schema = compile(views_schema());
    let expect = |types: &[&str], must_exist: bool, format: Option<&str>| Inference {
        types: types.iter().map(|t| t.to_string()).collect(),
        must_exist,
        format: format.map(str::to_string),
        default: None,
    };
    assert_eq!(inference(&schema, ""), expect(&["object"], true, None));
    assert_eq!(
        inference(&schema, "/user_id"),
        expect(&["string"], true, None)
    );
    assert_eq!(
        inference(&schema, "/views"),
        expect(&["integer"], false, None)
    );
    assert_eq!(
        inference(&schema, "/last_seen"),
        expect(&["string"], false, Some("date-time"))
    );
    assert_eq!(
        inference(&schema, "/stats/count"),
        expect(&["integer"], true, None)
    );
    assert_eq!(
        inference(&schema, "/stats/ratio"),
        expect(&["null", "number"], false, None)
    );
    assert_eq!(
        inference(&schema, "/tags/0"),
        expect(&["string"], false, None)
    );
}

#[test]
fn must_exist_needs_required_along_the_whole_path() {
    let schema = compile(json!({
        "required": ["a", "list"],
        "properties": {
            "a": {"properties": {"b": {"type": "string"}}, "required": []},
            "c": {"required": ["d"], "properties": {"d": {"type": "string"}}},
            "list": {"type": "array", "minItems": 1},
        },
    }));
    assert!(inference(&schema, "/a").must_exist);
    assert!(!inference(&schema, "/a/b").must_exist);
    assert!(
        !inference(&schema, "/c/d").must_exist,
        "/c itself is optional"
    );
    assert!(!inference(&schema, "/unknown").must_exist);
    assert!(
        inference(&schema, "/list/0").must_exist,
        "minItems 1 guarantees the first item"
    );
    assert!(!inference(&schema, "/list/1").must_exist);
}

#[test]
fn inference_follows_refs_all_of_and_unions_any_of() {
    let schema = compile(json!({
        "$defs": {"id": {"type": "string", "format": "uuid"}},
        "allOf": [{"required": ["id"]}],
        "properties": {
            "id": {"$ref": "#/$defs/id"},
            "n": {"type": "number", "allOf": [{"type": "integer"}]},
            "either": {"anyOf": [{"type": "string"}, {"type": "boolean"}]},
            "e": {"enum": ["a", 1]},
        },
        "additionalProperties": {"type": "boolean"},
    }));
    let id = inference(&schema, "/id");
    assert_eq!(
        (id.types, id.must_exist, id.format.as_deref()),
        (vec!["string".to_string()], true, Some("uuid"))
    );
    assert_eq!(inference(&schema, "/n").types, ["integer"]);
    assert_eq!(inference(&schema, "/either").types, ["boolean", "string"]);
    assert_eq!(inference(&schema, "/e").types, ["integer", "string"]);
    assert_eq!(inference(&schema, "/other").types, ["boolean"]);
}

/// Without `$schema` a schema is read in draft 2019-09, as Flow reads it: array-form
/// `items` are the first items' schemas and `additionalItems` the rest's (2020-12 refuses
/// the array form); a declared `$schema` wins.
#[test]
fn schemas_without_a_dialect_are_read_as_draft_2019_09() {
    let tuple = json!({
        "type": "array",
        "items": [{"type": "string"}, {"type": "integer"}],
        "additionalItems": false
    });
    let schema = compile(tuple.clone());
    assert!(schema.validate(&json!(["a", 1])).is_ok());
    assert!(schema.validate(&json!(["a"])).is_ok());
    let err = schema.validate(&json!([1])).unwrap_err();
    assert_eq!(err.pointer, "/0");
    assert!(schema.validate(&json!(["a", 1, true])).is_err());

    let mut declared = tuple;
    declared["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    let err = Schema::compile(&declared).unwrap_err();
    assert!(matches!(err, SchemaError::Invalid(_)), "{err}");

    // 2020-12's tuple keyword means nothing in 2019-09, unless the schema declares 2020-12.
    let prefixed = json!({"prefixItems": [{"type": "string"}], "items": {"type": "integer"}});
    assert!(compile(prefixed.clone()).validate(&json!(["a"])).is_err());
    let mut declared = prefixed;
    declared["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
    let schema = compile(declared);
    assert!(schema.validate(&json!(["a", 1])).is_ok());
    assert!(schema.validate(&json!([1])).is_err());
}

/// Inference reads items in the schema's dialect: the tuple's schema for its indices,
/// `additionalItems` past them (2019-09); `prefixItems`, then `items` (2020-12).
#[test]
fn inference_reads_array_items_in_the_schema_dialect() {
    let schema = compile(json!({
        "type": "object",
        "required": ["pair"],
        "properties": {
            "pair": {
                "type": "array",
                "minItems": 1,
                "items": [{"type": "string", "format": "date"}, {"type": "integer"}],
                "additionalItems": {"type": "boolean"}
            },
            "list": {"items": {"type": "number"}, "additionalItems": {"type": "string"}}
        }
    }));
    let at = |ptr| inference(&schema, ptr);
    assert_eq!(
        (
            at("/pair/0").types,
            at("/pair/0").must_exist,
            at("/pair/0").format
        ),
        (vec!["string".to_string()], true, Some("date".to_string()))
    );
    assert_eq!(at("/pair/1").types, ["integer"]);
    assert!(!at("/pair/1").must_exist);
    assert_eq!(at("/pair/7").types, ["boolean"]);
    // `additionalItems` beside object-form `items` is no keyword: `items` covers all.
    assert_eq!(at("/list/3").types, ["number"]);

    let schema = compile(json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "prefixItems": [{"type": "string"}],
        "items": {"type": "integer"},
    }));
    assert_eq!(inference(&schema, "/0").types, ["string"]);
    assert_eq!(inference(&schema, "/1").types, ["integer"]);
}

/// A location's `default`, where a key location a document lacks takes its value from:
/// found through `$ref` and `allOf` (the schema's own first), kept across `anyOf` only if
/// every branch agrees; it never makes the location exist (Flow: only `required` does).
#[test]
fn inference_finds_defaults_through_refs_and_all_of() {
    let schema = compile(json!({
        "$defs": {"region": {"type": "string", "default": "eu"}},
        "type": "object",
        "properties": {
            "region": {"$ref": "#/$defs/region"},
            "tier": {"default": 1, "allOf": [{"default": 2}]},
            "nested": {"properties": {"id": {"type": "integer", "default": 0}}},
            "either": {"anyOf": [{"default": "a"}, {"default": "b"}]},
            "same": {"anyOf": [{"default": "a"}, {"default": "a"}]},
            "none": {"type": "string"}
        },
        "allOf": [{"properties": {"late": {"default": [1, 2]}}}]
    }));
    let default = |ptr| inference(&schema, ptr).default;
    assert_eq!(default("/region"), Some(json!("eu")));
    assert!(!inference(&schema, "/region").must_exist);
    assert_eq!(default("/tier"), Some(json!(1)));
    assert_eq!(default("/nested/id"), Some(json!(0)));
    assert_eq!(default("/late"), Some(json!([1, 2])));
    assert_eq!(default("/either"), None);
    assert_eq!(default("/same"), Some(json!("a")));
    assert_eq!(default("/none"), None);
    assert_eq!(default("/unknown"), None);
}

#[test]
fn an_unconstrained_location_may_be_anything() {
    let schema = compile(json!({"type": "object"}));
    let any = inference(&schema, "/x/y");
    assert_eq!(
        any.types,
        ["array", "boolean", "null", "number", "object", "string"]
    );
    assert!(!any.must_exist);
}

#[test]
fn top_level_properties_include_refs_and_all_of_sorted() {
    let schema = compile(json!({
        "$defs": {"base": {"properties": {"b": {}, "a/x": {}}}},
        "$ref": "#/$defs/base",
        "allOf": [{"properties": {"c": {}}}],
        "properties": {"d": {}, "b": {}},
    }));
    let fields: Vec<(String, String)> = schema
        .top_level_properties()
        .into_iter()
        .map(|(name, ptr)| (name, ptr.tokens().map(|t| format!("/{t}")).collect()))
        .collect();
    let expect = [("a/x", "/a/x"), ("b", "/b"), ("c", "/c"), ("d", "/d")];
    assert_eq!(fields, expect.map(|(n, p)| (n.to_string(), p.to_string())));
    assert_eq!(
        schema.top_level_properties()[0]
            .1
            .tokens()
            .collect::<Vec<_>>(),
        ["a/x"]
    );
}

#[test]
fn schemas_and_reducers_are_shareable_across_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Schema>();
    shareable::<sluice_doc::Reducer>();
}

/// jsonschema reading `schema` as a collection schema is read: in draft 2019-09 unless its
/// `$schema` says otherwise.
fn flow_reference(schema: &Value) -> jsonschema::Validator {
    let options = jsonschema::options();
    let options = match schema.get("$schema") {
        Some(_) => options,
        None => options.with_draft(jsonschema::Draft::Draft201909),
    };
    options.build(schema).expect("reference compiles")
}

/// Documents are validated in their compact form (`Schema::validate_doc`); whatever the
/// keywords, the verdict is the one jsonschema gives for the same document as a `Value`,
/// read in the same dialect.
#[test]
fn compact_documents_get_the_verdicts_of_their_values() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use sluice_doc::compact::Doc;

    let schemas = [
        json!({"type": "integer"}),
        json!({"type": ["string", "null"], "minLength": 2, "maxLength": 3}),
        json!({"enum": [1, "a", [1, 2], {"x": 1.0}, null]}),
        json!({"const": {"a": [1, {"b": 2}]}}),
        json!({"minimum": -1, "exclusiveMaximum": 2.5, "multipleOf": 0.5}),
        json!({"type": "array", "uniqueItems": true, "maxItems": 3, "items": {"type": ["integer", "string"]}}),
        json!({"type": "array", "prefixItems": [{"type": "string"}], "contains": {"const": 1}}),
        json!({
            "type": "object",
            "required": ["a"],
            "properties": {"a": {"type": "number"}, "b": {"$ref": "#/$defs/short"}},
            "patternProperties": {"^x": {"type": "boolean"}},
            "additionalProperties": false,
            "$defs": {"short": {"type": "string", "maxLength": 1}}
        }),
        json!({"propertyNames": {"pattern": "^[a-c]$"}, "minProperties": 1, "maxProperties": 2}),
        json!({"anyOf": [{"type": "object", "required": ["b"]}, {"type": "array"}], "not": {"const": []}}),
        json!({"oneOf": [{"type": "integer"}, {"minimum": 0}]}),
        json!({"if": {"type": "object", "required": ["a"]}, "then": {"required": ["b"]}, "else": {"type": "array"}}),
        json!({"dependentRequired": {"a": ["c"]}, "unevaluatedProperties": {"type": "integer"}, "properties": {"a": true}}),
        // Schemas of types and properties alone, whose verdicts come from their structure.
        json!({
            "type": "object",
            "required": ["a"],
            "properties": {
                "a": {"type": "integer", "reduce": {"strategy": "sum"}},
                "b": {"type": ["string", "null"]},
                "c": {"type": "array", "items": {"type": "number"}}
            },
            "additionalProperties": {"type": "boolean"}
        }),
        json!({"type": ["object", "array"], "items": {"type": "object", "properties": {"x": false}}, "properties": {"a": true}}),
        json!({"properties": {"b": {"type": "object", "additionalProperties": {"type": "string"}, "required": ["a", "x"], "properties": {"a": {"type": "integer"}}}}}),
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "required": ["a", "b"], "items": false}),
        json!({"type": ["integer", "string"], "title": "integers, 1.0 included"}),
        json!({"type": "object", "properties": {"a": {"type": "string", "format": "date-time"}}}),
        // Items in 2019-09 forms (the default), and 2020-12's declared.
        json!({"type": "array", "items": [{"type": "string"}, {"type": "integer"}], "additionalItems": false}),
        json!({"items": [{"type": ["string", "null"]}], "additionalItems": {"type": "object", "properties": {"a": {"type": "integer"}}}}),
        json!({"type": ["array", "object"], "items": {"type": "integer"}, "additionalItems": false}),
        json!({"properties": {"a": {"items": [true, false]}, "b": {"additionalItems": false}}, "required": ["a"]}),
        json!({"$schema": "https://json-schema.org/draft/2019-09/schema", "items": [{"type": "number"}], "format": "date"}),
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}}),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..4).prop_map(Value::from),
        (-6i32..6).prop_map(|k| json!(f64::from(k) / 2.0)),
        "[abcxé]{0,4}".prop_map(Value::from),
    ];
    let any_json = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[abcx]", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    for schema_json in schemas {
        let schema = compile(schema_json.clone());
        let reference = flow_reference(&schema_json);
        let mut runner = TestRunner::new(Config {
            cases: 300,
            ..Config::default()
        });
        let (valid, invalid) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        runner
            .run(&any_json, |value| {
                let want = reference.is_valid(&value);
                let got = schema.validate_doc(&Doc::from(&value)).is_ok();
                prop_assert_eq!(got, want, "schema {} document {}", schema_json, value);
                let verdicts = if want { &valid } else { &invalid };
                verdicts.set(verdicts.get() + 1);
                Ok(())
            })
            .unwrap();
        // Values random cases rarely hit (the const and enum members written other ways, the
        // numeric bounds), and enough plain ones that these alone give every schema both
        // verdicts: the coverage check below must not depend on the random draw.
        for value in [
            json!({"a": [1.0, {"b": 2}]}),
            json!([1.0, 2]),
            json!({"x": 1}),
            json!({"a": 1, "c": 2}),
            json!(["s", 1.0]),
            json!({"a": 1.5, "b": "é", "x": true}),
            json!({"b": 1}),
            json!(-1),
            json!({"a": 1, "b": 2}),
            json!({"a": "s", "c": 1.0}),
            // The numeric bounds, met and missed: 2.5 is excluded, 0.25 is no multiple of 0.5.
            json!(-1.5),
            json!(2.5),
            json!(0.25),
            json!("ab"),
            json!(null),
            json!([]),
            json!({}),
            json!({"a": 1.0, "b": null, "c": [1.5, 2], "x": true}),
            json!({"a": 1, "b": {"a": 2.0, "x": "s"}}),
        ] {
            let want = reference.is_valid(&value);
            let got = schema.validate_doc(&Doc::from(&value)).is_ok();
            assert_eq!(got, want, "schema {schema_json} document {value}");
            let verdicts = if want { &valid } else { &invalid };
            verdicts.set(verdicts.get() + 1);
        }
        let (valid, invalid) = (valid.get(), invalid.get());
        assert!(
            valid > 0 && invalid > 0,
            "schema {schema_json}: {valid} valid, {invalid} invalid: the cases miss one verdict"
        );
    }
}
