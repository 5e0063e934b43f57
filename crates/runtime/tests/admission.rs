//! Admission: every combination of delivery, source fault tolerance and sink guarantee
//! against the table in `admission.rs`, and `plan` refusing a pipeline before it asks any
//! driver anything, naming the part, what it declares and what would admit it.

mod common;

use async_trait::async_trait;
use serde_json::Value;
use sluice_datagen::DatagenKind;
use sluice_driver_sdk::CommitPattern::*;
use sluice_runtime::admission::{
    BindingReplay, Delivery, Replay, SinkGuarantee, admit, admit_bindings,
};
use sluice_runtime::config::Pipeline;
use sluice_runtime::pipeline::{PipelineError, plan};
use sluice_runtime::registry::{Command, Registry};
use sluice_sink_sdk::{
    Consistency, EpochSink, InputMode, Placement, RecordBatch, Recovery, SchemaPlan, SinkBinding,
    SinkContract, SinkError, SinkKind, WriteResult,
};
use sluice_source_sdk::FaultTolerance;
use sluice_source_sdk::kind;
use std::path::Path;

const TOLERANCES: [FaultTolerance; 3] = [
    FaultTolerance::None,
    FaultTolerance::AtLeastOnce,
    FaultTolerance::ExactlyOnce,
];

fn guarantees() -> Vec<SinkGuarantee> {
    let mut all = vec![SinkGuarantee::Flow(None)];
    for p in [
        RemoteAuthoritative,
        RecoveryLogIdempotentApply,
        RecoveryLogNonTransactional,
    ] {
        all.push(SinkGuarantee::Flow(Some(p)));
    }
    for consistency in [
        Consistency::Ephemeral,
        Consistency::AtLeastOnce,
        Consistency::CheckpointCommittable,
    ] {
        for placement in [Placement::Singleton, Placement::MultiWriter] {
            for input in [
                InputMode::AppendOnly,
                InputMode::KeyedUpsert,
                InputMode::FullChangelog,
            ] {
                all.push(SinkGuarantee::Epoch(SinkContract {
                    consistency,
                    placement,
                    input,
                }));
            }
        }
    }
    all
}

/// The table of `admission.rs`, written out independently.
fn source_admitted(delivery: Delivery, t: FaultTolerance) -> bool {
    match delivery {
        Delivery::ExactlyOnce => t == FaultTolerance::ExactlyOnce,
        Delivery::AtLeastOnce => t != FaultTolerance::None,
    }
}

fn sink_admitted(delivery: Delivery, g: SinkGuarantee) -> bool {
    match (delivery, g) {
        (Delivery::AtLeastOnce, SinkGuarantee::Flow(_)) => true,
        (Delivery::ExactlyOnce, SinkGuarantee::Flow(p)) => {
            matches!(p, Some(RemoteAuthoritative | RecoveryLogIdempotentApply))
        }
        (Delivery::ExactlyOnce, SinkGuarantee::Epoch(c)) => {
            c.consistency == Consistency::CheckpointCommittable
        }
        (Delivery::AtLeastOnce, SinkGuarantee::Epoch(c)) => c.consistency != Consistency::Ephemeral,
    }
}

#[test]
fn every_combination_is_admitted_exactly_as_the_table_says() {
    let mut combinations = 0;
    for delivery in [Delivery::ExactlyOnce, Delivery::AtLeastOnce] {
        for a in TOLERANCES {
            for b in TOLERANCES {
                for guarantee in guarantees() {
                    combinations += 1;
                    let sources = [("a".to_string(), a), ("b".to_string(), b)];
                    let refusals = admit(
                        delivery,
                        &sources,
                        ("materializations.m.endpoint", guarantee),
                    );
                    let mut expected = Vec::new();
                    for (name, t) in &sources {
                        if !source_admitted(delivery, *t) {
                            expected.push(format!("sources.{name}"));
                        }
                    }
                    if !sink_admitted(delivery, guarantee) {
                        expected.push("materializations.m.endpoint".to_string());
                    }
                    let places: Vec<String> = refusals.iter().map(|r| r.place.clone()).collect();
                    assert_eq!(places, expected, "{delivery:?} {a:?} {b:?} {guarantee:?}");
                    for r in &refusals {
                        assert!(!r.declares.is_empty() && !r.remedy.is_empty(), "{r}");
                    }
                }
            }
        }
    }
    assert_eq!(combinations, 2 * 3 * 3 * (4 + 18));
}

#[test]
fn refusals_say_what_the_part_declares_and_what_would_admit_it() {
    let r = admit(
        Delivery::ExactlyOnce,
        &[("events".into(), FaultTolerance::AtLeastOnce)],
        ("materializations.v.endpoint", SinkGuarantee::Flow(None)),
    );
    assert!(
        r[0].to_string()
            .starts_with("sources.events: declares at-least-once"),
        "{}",
        r[0]
    );
    assert!(r[0].remedy.contains("delivery: at_least_once"), "{}", r[0]);
    assert!(
        r[1].declares.contains("undeclared commit pattern"),
        "{}",
        r[1]
    );
    assert!(r[1].remedy.contains("pattern: authoritative"), "{}", r[1]);
}

/// An epoch sink that only declares its contract (`{consistency: …}`).
struct Declaring(SinkContract);

#[async_trait]
impl EpochSink for Declaring {
    fn contract(&self) -> SinkContract {
        self.0
    }
    async fn resolve_schema(&mut self, _: &[SinkBinding]) -> Result<SchemaPlan, SinkError> {
        Ok(SchemaPlan::default())
    }
    async fn prepare_schema(&mut self, _: &SchemaPlan) -> Result<(), SinkError> {
        Ok(())
    }
    async fn open(&mut self, _: &[SinkBinding]) -> Result<(), SinkError> {
        unreachable!("admission opens nothing")
    }
    async fn recover(&mut self, _: &Recovery) -> Result<(), SinkError> {
        unreachable!("admission opens nothing")
    }
    async fn begin_epoch(&mut self, _: u64) -> Result<(), SinkError> {
        unreachable!("admission opens nothing")
    }
    async fn write_batch(&mut self, _: usize, _: &RecordBatch) -> Result<WriteResult, SinkError> {
        unreachable!("admission opens nothing")
    }
    async fn pre_commit(&mut self, _: u64) -> Result<Option<Value>, SinkError> {
        unreachable!("admission opens nothing")
    }
    async fn commit_epoch(&mut self, _: u64, _: &Value) -> Result<(), SinkError> {
        unreachable!("admission opens nothing")
    }
    async fn rollback_epoch(&mut self, _: u64) -> Result<(), SinkError> {
        unreachable!("admission opens nothing")
    }
}

fn declaring(config: &Value) -> Result<Box<dyn EpochSink>, SinkError> {
    let consistency = match config["consistency"].as_str() {
        Some("checkpoint") => Consistency::CheckpointCommittable,
        Some("at_least_once") => Consistency::AtLeastOnce,
        _ => Consistency::Ephemeral,
    };
    Ok(Box::new(Declaring(SinkContract {
        consistency,
        ..SinkContract::default()
    })))
}

fn registry() -> Registry {
    Registry::new()
        .with_source(kind::<DatagenKind>())
        .with_builtin(common::memory_kind())
        .with_driver(Command)
        .with_builtin(SinkKind {
            name: "declaring",
            paths: &[],
            endpoint_schema: || "{}".into(),
            resource_schema: || r#"{"type":"object"}"#.into(),
            build: declaring,
            resource_path: |r| Ok(vec![r["table"].as_str().unwrap_or("t").to_string()]),
        })
}

fn pipeline(delivery: &str, endpoint: &str) -> Pipeline {
    // The epoch sink takes changes only: its binding says so (a standard one is refused).
    let delta = endpoint.starts_with("declaring");
    let yaml = format!(
        r#"
delivery: {delivery}
collections:
  acme/views:
    key: [/user]
    schema: {{type: object, required: [user], properties: {{user: {{type: string}}}}}}
sources:
  gen: {{target: acme/views, datagen: {{seed: 1, documents: 10, keys: 3}}}}
materializations:
  views:
    endpoint: {{{endpoint}}}
    bindings: [{{source: acme/views, resource: {{table: t}}, delta_updates: {delta}}}]
"#
    );
    Pipeline::parse(&yaml, Path::new("/tmp"), &registry()).unwrap()
}

async fn refusal(delivery: &str, endpoint: &str) -> Option<String> {
    match plan(&pipeline(delivery, endpoint), &registry()).await {
        Ok(_) => None,
        Err(e @ PipelineError::Refused { .. }) => Some(e.to_string()),
        Err(other) => panic!("{endpoint}: not a refusal: {other}"),
    }
}

#[tokio::test]
async fn plan_refuses_weaker_parts_before_asking_any_driver() {
    // The command does not exist: a refusal must come before it is ever started.
    let undeclared = refusal("exactly_once", "command: {program: /nonexistent/driver}")
        .await
        .expect("an undeclared external driver is refused");
    assert!(
        undeclared
            .contains("materializations.views.endpoint: is a driver of undeclared commit pattern"),
        "{undeclared}"
    );
    let ephemeral = refusal("at_least_once", "declaring: {}")
        .await
        .expect("refused");
    assert!(ephemeral.contains("at-least-once delivery"), "{ephemeral}");
    assert!(
        ephemeral.contains("epoch sink of ephemeral consistency"),
        "{ephemeral}"
    );
    let durable = refusal("exactly_once", "declaring: {consistency: at_least_once}")
        .await
        .expect("refused");
    assert!(durable.contains("checkpoint-committable"), "{durable}");

    assert_eq!(
        refusal("at_least_once", "declaring: {consistency: at_least_once}").await,
        None
    );
    assert_eq!(
        refusal("exactly_once", "declaring: {consistency: checkpoint}").await,
        None
    );
    assert_eq!(refusal("exactly_once", "memory: {}").await, None);
    assert_eq!(refusal("at_least_once", "memory: {}").await, None);
}

/// The bindings of a materialization as effectively-once admission sees them: none, all
/// idempotent, or one counting (a sum).
fn binding_sets() -> Vec<Vec<BindingReplay>> {
    let binding = |i: usize, replay: Replay| BindingReplay {
        place: format!("materializations.m.bindings[{i}]"),
        replay,
    };
    let sum = || Replay::Counts("/total: sum".into());
    vec![
        vec![],
        vec![binding(0, Replay::Idempotent)],
        vec![
            binding(0, Replay::Idempotent),
            binding(1, Replay::Idempotent),
        ],
        vec![binding(0, Replay::Idempotent), binding(1, sum())],
        vec![binding(0, Replay::Counts("delta updates".into()))],
    ]
}

#[test]
fn idempotent_bindings_admit_at_least_once_parts_under_exactly_once() {
    let mut combinations = 0;
    for delivery in [Delivery::ExactlyOnce, Delivery::AtLeastOnce] {
        for a in TOLERANCES {
            for b in TOLERANCES {
                for guarantee in guarantees() {
                    for bindings in binding_sets() {
                        combinations += 1;
                        // Written out independently of admission.rs.
                        let effectively_once = delivery == Delivery::ExactlyOnce
                            && !bindings.is_empty()
                            && bindings.iter().all(|b| b.replay == Replay::Idempotent);
                        let sources = [("a".to_string(), a), ("b".to_string(), b)];
                        let mut expected = Vec::new();
                        for (name, t) in &sources {
                            let admitted = match effectively_once {
                                true => *t != FaultTolerance::None,
                                false => source_admitted(delivery, *t),
                            };
                            if !admitted {
                                expected.push(format!("sources.{name}"));
                            }
                        }
                        let relaxed = effectively_once
                            && guarantee == SinkGuarantee::Flow(Some(RecoveryLogNonTransactional));
                        if !sink_admitted(delivery, guarantee) && !relaxed {
                            expected.push("materializations.m.endpoint".to_string());
                        }
                        let refusals = admit_bindings(
                            delivery,
                            &sources,
                            ("materializations.m.endpoint", guarantee),
                            &bindings,
                        );
                        let places: Vec<String> =
                            refusals.iter().map(|r| r.place.clone()).collect();
                        assert_eq!(
                            places, expected,
                            "{delivery:?} {a:?} {b:?} {guarantee:?} {bindings:?}"
                        );
                    }
                }
            }
        }
    }
    assert_eq!(combinations, 2 * 3 * 3 * (4 + 18) * 5);
}

#[test]
fn a_refusal_idempotence_would_lift_names_the_reduction_that_stops_it() {
    let bindings = &binding_sets()[3];
    let refusals = admit_bindings(
        Delivery::ExactlyOnce,
        &[("faker".into(), FaultTolerance::AtLeastOnce)],
        (
            "materializations.m.endpoint",
            SinkGuarantee::Flow(Some(RecoveryLogNonTransactional)),
        ),
        bindings,
    );
    assert_eq!(refusals.len(), 2);
    for r in &refusals {
        assert!(
            r.remedy
                .contains("(materializations.m.bindings[1] has /total: sum)"),
            "{r}"
        );
    }
    // An undeclared driver is not lifted: it may not even write what it is sent whole.
    let undeclared = admit_bindings(
        Delivery::ExactlyOnce,
        &[],
        ("materializations.m.endpoint", SinkGuarantee::Flow(None)),
        &binding_sets()[1],
    );
    assert_eq!(undeclared.len(), 1, "{undeclared:?}");
}

#[test]
fn a_bindings_replay_names_its_first_counting_reduction() {
    let reducer = |schema: Value| {
        sluice_doc::Schema::compile(&schema)
            .unwrap()
            .reducer()
            .clone()
    };
    let lww = reducer(serde_json::json!({"type": "object"}));
    let of = |delta, r: &sluice_doc::Reducer| BindingReplay::of("b".into(), delta, r).replay;
    assert_eq!(of(false, &lww), Replay::Idempotent);
    assert_eq!(of(true, &lww), Replay::Counts("delta updates".into()));
    let sum = reducer(
        serde_json::json!({"type": "object", "reduce": {"strategy": "merge"},
        "properties": {"total": {"type": "number", "reduce": {"strategy": "sum"}}}}),
    );
    assert_eq!(of(false, &sum), Replay::Counts("/total: sum".into()));
    assert!(
        of(false, &sum)
            .to_string()
            .contains("not idempotent under replay (/total: sum)")
    );
}
