//! Each source's and endpoint's *kind*, looked up by its key in the [`Registry`] the
//! binary fills: it reads its own configuration, its errors placed under its key; a
//! misspelt key is named with what it may have meant.

use super::sources::SOURCE_FIELDS;
use super::{
    ConfigError, EndpointDef, MaterializationDef, Pipeline, PipelineFile, ReadAhead, SourceDef,
    invalid,
};
use crate::registry::Registry;
use serde_json::{Map, Value};
use sluice_source_sdk::InvalidConfig;
use std::collections::BTreeMap;
use std::path::Path;

impl PipelineFile {
    /// Has each source's and endpoint's kind read its configuration.
    pub(super) fn read_kinds(
        self,
        base_dir: &Path,
        registry: &Registry,
    ) -> Result<Pipeline, ConfigError> {
        let mut sources = BTreeMap::new();
        for (name, source) in self.sources {
            let place = format!("sources.{name}");
            let names = registry.source_names();
            let (kind, config) = read_kind(
                &place,
                source.kinds,
                (SOURCE_FIELDS, &names),
                "source",
                |kind, config| {
                    let kind = registry
                        .source(kind)
                        .expect("one_kind returns a known kind");
                    kind.parse(config, base_dir)
                },
            )?;
            let target = source.target.ok_or_else(|| {
                invalid(
                    &place,
                    "missing field `target`: the collection this source writes into",
                )
            })?;
            let def = SourceDef {
                target,
                on_error: source.on_error,
                dead_letter: source.dead_letter,
                read_ahead: ReadAhead {
                    max_queued_records: source.max_queued_records,
                    max_queued_bytes: source.max_queued_bytes,
                },
                envelope: source.envelope,
                pinned: registry.source(&kind).and_then(|k| k.pinned()),
                singleton: registry.source(&kind).and_then(|k| k.singleton()),
                config,
            };
            sources.insert(name, def);
        }
        let mut materializations = BTreeMap::new();
        for (name, m) in self.materializations {
            let place = format!("materializations.{name}.endpoint");
            let names = registry.driver_names();
            let (kind, config) = read_kind(
                &place,
                m.endpoint,
                (&[], &names),
                "driver",
                |kind, config| {
                    let kind = registry
                        .driver(kind)
                        .expect("one_kind returns a known kind");
                    kind.parse(config, base_dir)
                },
            )?;
            let driver = registry.driver(&kind).expect("parsed by its kind");
            let def = MaterializationDef {
                pinned: driver.pinned(&config),
                singleton: driver.singleton(&config),
                endpoint: EndpointDef { kind, config },
                bindings: m.bindings,
                shard: m.shard,
            };
            materializations.insert(name, def);
        }
        if self.cluster.is_some() {
            // A cluster moves shards between machines: what a part keeps outside the
            // recovery log would stay behind.
            let sources = (sources.iter())
                .map(|(name, s)| (format!("sources.{name}"), s.config.kind(), s.pinned));
            let endpoints = (materializations.iter()).map(|(name, m)| {
                let place = format!("materializations.{name}.endpoint");
                (place, m.endpoint.kind.as_str(), m.pinned)
            });
            for (place, kind, pinned) in sources.chain(endpoints) {
                if let Some(why) = pinned {
                    return Err(invalid(
                        place,
                        format!(
                            "a {kind} cannot run under `cluster:`, whose shards move between \
                             members: {why}; run it without `cluster:`"
                        ),
                    ));
                }
            }
        }
        Ok(Pipeline {
            collections: self.collections,
            sources,
            materializations,
            runtime: self.runtime,
            delivery: self.delivery,
            cluster: self.cluster,
            defaulted: Vec::new(),
            file: Value::Null,
        })
    }
}

/// Reads the one kind (of `what`, with names `known`) among the `keys` of the source or
/// endpoint at `place`: `parse(kind, config)`, its errors placed under the kind's key.
fn read_kind<T>(
    place: &str,
    keys: Map<String, Value>,
    (fields, known): (&[&str], &[&str]),
    what: &str,
    parse: impl FnOnce(&str, Value) -> Result<T, InvalidConfig>,
) -> Result<(String, T), ConfigError> {
    let (kind, config) =
        one_kind(keys, fields, known, what).map_err(|message| invalid(place, message))?;
    let config = parse(&kind, config)
        .map_err(|e| invalid(e.place_in(&format!("{place}.{kind}")), e.message))?;
    Ok((kind, config))
}

/// The one kind among the keys left over in a source or endpoint, and its
/// configuration; `known` are the kinds (of `what`: "source", "driver") this binary has,
/// `fields` the part's other keys (for what an unknown key may have meant).
fn one_kind(
    keys: Map<String, Value>,
    fields: &[&str],
    known: &[&str],
    what: &str,
) -> Result<(String, Value), String> {
    let known_list = known.join(", ");
    if let Some(unknown) = keys.keys().find(|k| !known.contains(&k.as_str())) {
        let meant = (fields.iter().chain(known))
            .map(|name| (edit_distance(unknown, name), name))
            .filter(|&(distance, _)| distance <= 2)
            .min()
            .map(|(_, name)| format!(", did you mean `{name}`?"))
            .unwrap_or_default();
        return Err(format!(
            "unknown field `{unknown}`{meant} (the {what} kinds are {known_list})"
        ));
    }
    let mut kinds = keys.into_iter();
    match (kinds.next(), kinds.next()) {
        (Some(kind), None) => Ok(kind),
        (None, _) => Err(format!("set exactly one of the {what} kinds {known_list}")),
        (Some((first, _)), Some((second, _))) => Err(format!(
            "set exactly one of the {what} kinds {known_list}, not both `{first}` and `{second}`"
        )),
    }
}

/// Levenshtein distance of `a` and `b`, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_or_endpoint_names_exactly_one_known_kind() {
        let known = ["datagen", "file"];
        for (keys, expected) in [
            (vec!["file"], Ok("file")),
            (vec!["datagen"], Ok("datagen")),
            (
                vec![],
                Err("set exactly one of the source kinds datagen, file"),
            ),
            (
                vec!["file", "datagen"],
                Err(
                    "set exactly one of the source kinds datagen, file, not both `datagen` and `file`",
                ),
            ),
            (
                vec!["kafka"],
                Err("unknown field `kafka` (the source kinds are datagen, file)"),
            ),
            (
                vec!["file", "kafka"],
                Err("unknown field `kafka` (the source kinds are datagen, file)"),
            ),
            (
                vec!["taget", "file"],
                Err(
                    "unknown field `taget`, did you mean `target`? (the source kinds are datagen, file)",
                ),
            ),
            (
                vec!["fille"],
                Err(
                    "unknown field `fille`, did you mean `file`? (the source kinds are datagen, file)",
                ),
            ),
        ] {
            let map: Map<String, Value> = keys
                .iter()
                .map(|k| (k.to_string(), Value::String(format!("{k} config"))))
                .collect();
            let got = one_kind(map, SOURCE_FIELDS, &known, "source");
            match expected {
                Ok(kind) => assert_eq!(
                    got,
                    Ok((kind.to_string(), Value::String(format!("{kind} config")))),
                    "{keys:?}"
                ),
                Err(message) => assert_eq!(got, Err(message.to_string()), "{keys:?}"),
            }
        }
    }
}
