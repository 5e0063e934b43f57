//! Specs, seed ↔ current: the materialization spec, its bindings, collections,
//! projections and field selections.

use super::*;

pub(super) fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The seed spec as the current protocol has it. The seed's endpoint type has no
/// current counterpart: every connector is `LOCAL` (Sluice runs it, as a process or at
/// an address). Fields Sluice does not have (journal read suffix, priority,
/// serialization policy, network ports, triggers) are left empty.
pub fn spec_to_current(spec: flow::MaterializationSpec) -> cf::MaterializationSpec {
    cf::MaterializationSpec {
        name: spec.materialization,
        connector_type: cf::materialization_spec::ConnectorType::Local as i32,
        config_json: spec.endpoint_spec_json.into_bytes(),
        bindings: spec.bindings.into_iter().map(binding_to_current).collect(),
        ..Default::default()
    }
}

/// The current spec as the seed protocol has it. The connector type has no seed
/// counterpart: the endpoint type is `INVALID` (no Sluice driver reads it).
pub fn spec_from_current(spec: cf::MaterializationSpec) -> flow::MaterializationSpec {
    flow::MaterializationSpec {
        materialization: spec.name,
        endpoint_type: flow::EndpointType::Invalid as i32,
        endpoint_spec_json: text(spec.config_json),
        bindings: spec
            .bindings
            .into_iter()
            .map(binding_from_current)
            .collect(),
    }
}

pub fn binding_to_current(
    b: flow::materialization_spec::Binding,
) -> cf::materialization_spec::Binding {
    cf::materialization_spec::Binding {
        state_key: state_key(&b.resource_path, b.backfill),
        resource_config_json: b.resource_spec_json.into_bytes(),
        resource_path: b.resource_path,
        collection: b.collection.map(collection_to_current),
        field_selection: b.field_selection.map(field_selection_to_current),
        delta_updates: b.delta_updates,
        backfill: b.backfill,
        ..Default::default()
    }
}

pub fn binding_from_current(
    b: cf::materialization_spec::Binding,
) -> flow::materialization_spec::Binding {
    flow::materialization_spec::Binding {
        resource_spec_json: text(b.resource_config_json),
        resource_path: b.resource_path,
        collection: b.collection.map(collection_from_current),
        field_selection: b.field_selection.map(field_selection_from_current),
        delta_updates: b.delta_updates,
        backfill: b.backfill,
    }
}

/// A binding's state key as Flow derives it (`assemble::state_key`): the resource path
/// joined with `/` and percent-encoded but for letters, digits and `-_+.=` (so a `/`
/// inside a component cannot be told from the joints, as in Flow), then `.v<backfill>`
/// when the binding has been backfilled.
pub fn state_key(resource_path: &[String], backfill: u32) -> String {
    let mut key = String::new();
    for c in resource_path.join("/").chars() {
        if c.is_alphanumeric() || matches!(c, '-' | '_' | '+' | '.' | '=') {
            key.push(c);
        } else {
            let mut utf8 = [0; 4];
            for byte in c.encode_utf8(&mut utf8).bytes() {
                key.push_str(&format!("%{byte:02X}"));
            }
        }
    }
    if backfill > 0 {
        key.push_str(&format!(".v{backfill}"));
    }
    key
}

/// The seed collection as the current protocol has it; the schema is the write schema
/// (the seed has one schema, and no schema URI in the current one).
pub fn collection_to_current(c: flow::CollectionSpec) -> cf::CollectionSpec {
    cf::CollectionSpec {
        name: c.collection,
        key: c.key_ptrs,
        uuid_ptr: c.uuid_ptr,
        partition_fields: c.partition_fields,
        projections: c
            .projections
            .into_iter()
            .map(projection_to_current)
            .collect(),
        ack_template_json: c.ack_json_template,
        write_schema_json: c.schema_json.into_bytes(),
        read_schema_json: Vec::new(),
    }
}

/// The current collection as the seed has it: its write schema, else its read schema.
pub fn collection_from_current(c: cf::CollectionSpec) -> flow::CollectionSpec {
    let schema = if c.write_schema_json.is_empty() {
        c.read_schema_json
    } else {
        c.write_schema_json
    };
    flow::CollectionSpec {
        collection: c.name,
        schema_uri: String::new(),
        key_ptrs: c.key,
        uuid_ptr: c.uuid_ptr,
        partition_fields: c.partition_fields,
        projections: c
            .projections
            .into_iter()
            .map(projection_from_current)
            .collect(),
        ack_json_template: c.ack_template_json,
        schema_json: text(schema),
    }
}

fn projection_to_current(p: flow::Projection) -> cf::Projection {
    cf::Projection {
        ptr: p.ptr,
        field: p.field,
        explicit: p.user_provided,
        is_partition_key: p.is_partition_key,
        is_primary_key: p.is_primary_key,
        inference: p.inference.map(|i| cf::Inference {
            types: i.types,
            string: i.string.map(|s| cf::inference::String {
                content_type: s.content_type,
                format: s.format,
                max_length: s.max_length,
                content_encoding: if s.is_base64 {
                    "base64".into()
                } else {
                    String::new()
                },
            }),
            title: i.title,
            description: i.description,
            exists: if i.must_exist {
                cf::inference::Exists::Must
            } else {
                cf::inference::Exists::May
            } as i32,
            ..Default::default()
        }),
    }
}

fn projection_from_current(p: cf::Projection) -> flow::Projection {
    flow::Projection {
        ptr: p.ptr,
        field: p.field,
        user_provided: p.explicit,
        is_partition_key: p.is_partition_key,
        is_primary_key: p.is_primary_key,
        inference: p.inference.map(|i| flow::Inference {
            must_exist: i.exists == cf::inference::Exists::Must as i32,
            types: i.types,
            string: i.string.map(|s| flow::inference::String {
                content_type: s.content_type,
                format: s.format,
                is_base64: s.content_encoding == "base64",
                max_length: s.max_length,
            }),
            title: i.title,
            description: i.description,
        }),
    }
}

pub(super) fn json_map_to_current(
    map: std::collections::HashMap<String, String>,
) -> BTreeMap<String, Vec<u8>> {
    map.into_iter().map(|(k, v)| (k, v.into_bytes())).collect()
}

pub(super) fn json_map_from_current<M: IntoIterator<Item = (String, Vec<u8>)>>(
    map: M,
) -> std::collections::HashMap<String, String> {
    map.into_iter().map(|(k, v)| (k, text(v))).collect()
}

pub fn field_selection_to_current(f: flow::FieldSelection) -> cf::FieldSelection {
    cf::FieldSelection {
        keys: f.keys,
        values: f.values,
        document: f.document,
        field_config_json_map: json_map_to_current(f.field_config_json)
            .into_iter()
            .collect(),
    }
}

pub fn field_selection_from_current(f: cf::FieldSelection) -> flow::FieldSelection {
    flow::FieldSelection {
        keys: f.keys,
        values: f.values,
        document: f.document,
        field_config_json: json_map_from_current(f.field_config_json_map),
    }
}
