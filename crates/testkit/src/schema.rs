//! Checking a connector's configuration schema as the runtime uses it.

use serde_json::Value;

/// Checks a configuration's schema the way the runtime checks a document against one
/// (`sluice_doc`): it compiles, admits each of `admitted` and refuses each of
/// `refused`. For each config's tests: the crate's examples, and an
/// unknown key where the type denies them.
pub fn assert_schema_judges(schema: &Value, admitted: &[Value], refused: &[Value]) {
    let compiled = sluice_doc::Schema::compile(schema)
        .unwrap_or_else(|e| panic!("the schema does not compile: {e}\n{schema:#}"));
    for config in admitted {
        if let Err(e) = compiled.validate(config) {
            panic!("the schema refuses {config}: {e:?}\n{schema:#}");
        }
    }
    for config in refused {
        assert!(
            compiled.validate(config).is_err(),
            "the schema admits {config}\n{schema:#}"
        );
    }
}
