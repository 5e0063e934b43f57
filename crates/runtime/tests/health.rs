//! A source's health as a run serves it: a source whose input cannot be reached fails
//! its calls with a retryable error, so the loop reopens it, and `/api/status` shows it
//! unhealthy with that error (`sluice_source_health` 1) until it reads again, then
//! healthy (0). The memory it says it holds and its own metrics are served beside, in
//! the status and in `/metrics`; the endpoint, which never failed, is healthy
//! throughout. Timings are never compared.

mod common;

use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_runtime::metrics::status::{HealthState, ShardView};
use sluice_runtime::registry::Registry;
use sluice_source_sdk::{
    FaultTolerance, InvalidConfig, Metric, Opening, Position, QueueLimits, Records, Resume, Source,
    SourceError, SourceKind, Step, Unit, kind,
};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Calls of `queue` still to be refused, across every instance the loop opens.
static REFUSALS: AtomicUsize = AtomicUsize::new(3);

const REFUSED: &str = "connection refused";

/// A source whose input is unreachable for its first [`REFUSALS`] reads, then reads
/// three documents and idles.
struct Flaky {
    next: u64,
}

struct FlakyKind;

impl SourceKind for FlakyKind {
    const NAME: &'static str = "flaky";
    type Config = Value;

    fn prepare(_: &mut Value, _: &Path) -> Result<(), InvalidConfig> {
        Ok(())
    }

    fn open(_: &Opening<'_>, _: &Value) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(Flaky { next: 0 }))
    }
}

#[async_trait]
impl Source for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::AtLeastOnce
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        self.next = position.as_u64().unwrap_or(0);
        Ok(())
    }

    async fn replay(&mut self, _: &Resume, _: &mut Records) -> Result<Step, SourceError> {
        unreachable!("at least once: never replayed")
    }

    async fn queue(&mut self, _: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        let refused = REFUSALS.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        });
        if refused.is_ok() {
            return Err(SourceError::Io {
                name: "flaky".into(),
                path: "127.0.0.1:1".into(),
                error: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, REFUSED),
            });
        }
        let mut records = 0;
        if self.next < 3 {
            let text = json!({"id": self.next.to_string()}).to_string();
            let position = Position {
                source: Arc::from("flaky"),
                line: self.next + 1,
                byte_offset: 0,
                unit: Unit::Sequence,
            };
            out.push_json(text.as_bytes(), position, text.len());
            self.next += 1;
            records = 1;
        }
        Ok(Step {
            records,
            bytes: 0,
            errors: Vec::new(),
            end_of_input: false,
            advances: false,
            unit_continues: false,
            resume: Resume::Seek {
                position: json!(self.next),
            },
        })
    }

    fn memory(&self) -> u64 {
        4096
    }

    fn metrics(&self) -> Vec<Metric> {
        vec![
            Metric::gauge("pending_messages", "Messages the client has pending.", 7)
                .label("partition", 0),
        ]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_source_is_unhealthy_with_its_error_until_it_reads_again() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new().with_source(kind::<FlakyKind>());
    let yaml = format!(
        r#"
delivery: at_least_once
collections:
  acme/views:
    key: [/id]
    schema: {{type: object, required: [id], properties: {{id: {{type: string}}}}}}
sources:
  flaky:
    target: acme/views
    flaky: {{}}
materializations:
  views:
    endpoint: {{memory: {{}}}}
    bindings: [{{source: acme/views, resource: {{table: t}}}}]
runtime:
  recovery_log: {}
"#,
        dir.path().join("log").display()
    );
    let common::Following {
        metrics, stop, run, ..
    } = common::follow(&yaml, dir.path(), registry).await;
    let wait_for = async |what: &str, done: &dyn Fn(&ShardView) -> bool| -> ShardView {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(!run.is_finished(), "the run goes on");
            let snapshot = metrics.status.snapshot();
            if let Some(shard) = snapshot.shards.first().filter(|s| done(s)) {
                return shard.clone();
            }
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let series = |name: &str| {
        let text = metrics.render();
        let prefix = format!(r#"{name}{{materialization="views",shard="00000000-ffffffff""#);
        (text.lines())
            .find(|line| line.starts_with(&prefix))
            .map(|line| line.rsplit(' ').next().unwrap().to_string())
    };

    let shard = wait_for("the source unhealthy", &|s| {
        s.sources["flaky"].health != HealthState::Healthy
    })
    .await;
    let HealthState::Unhealthy { reason } = &shard.sources["flaky"].health else {
        panic!("{:?}", shard.sources["flaky"].health);
    };
    assert!(reason.contains(REFUSED), "{reason}");
    assert!(reason.contains("source flaky"), "{reason}");
    assert_eq!(series("sluice_source_health").as_deref(), Some("1"));
    assert_eq!(
        shard.endpoint.health,
        HealthState::Healthy,
        "not the endpoint's"
    );

    let shard = wait_for("three documents, healthy", &|s| {
        s.documents == 3 && s.sources["flaky"].health == HealthState::Healthy
    })
    .await;
    assert_eq!(REFUSALS.load(Ordering::SeqCst), 0);
    assert!(shard.retries >= 1);
    assert_eq!(series("sluice_source_health").as_deref(), Some("0"));
    assert_eq!(series("sluice_endpoint_health").as_deref(), Some("0"));

    let shard = wait_for("its memory sampled", &|s| s.sources["flaky"].memory > 0).await;
    let source = &shard.sources["flaky"];
    assert_eq!(source.memory, 4096);
    assert_eq!(source.metrics[0].name, "pending_messages");
    assert_eq!(source.metrics[0].labels["partition"], "0");
    assert_eq!(
        series("sluice_source_memory_bytes").as_deref(),
        Some("4096")
    );
    let text = metrics.render();
    assert!(
        text.contains(
            r#"sluice_source_custom{materialization="views",shard="00000000-ffffffff",source="flaky",name="pending_messages",partition="0"} 7"#
        ),
        "{text}"
    );

    stop.send_replace(true);
    run.await.unwrap().unwrap();
}
