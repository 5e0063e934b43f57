//! The status a run serves while a source cannot connect: a source whose client retries
//! inside one call (as the Kafka client does an unreachable broker) says so through its
//! `Health`, and `/api/status` shows it backing off with its error, its shard degraded
//! rather than running, while the run goes on, until a stop ends the waiting call; the
//! end the shard records says the same. The configuration served hides the source's
//! secrets. Timings are never compared.

mod common;

use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_runtime::metrics::ended;
use sluice_runtime::metrics::status::{Snapshot, SourceState, State};
use sluice_runtime::registry::Registry;
use sluice_source_sdk::{
    FaultTolerance, Health, InvalidConfig, Opening, QueueLimits, Records, Resume, Source,
    SourceError, SourceKind, Step, kind,
};
use std::path::Path;
use std::time::Duration;

const REFUSED: &str = "source down: cannot read brokers 127.0.0.1:1: connection refused";

/// A source whose every connection attempt is refused: its first call retries inside
/// itself, telling its `Health` of each failed attempt, and never returns.
struct Down {
    health: Health,
}

struct DownKind;

impl SourceKind for DownKind {
    const NAME: &'static str = "down";
    type Config = Value;

    fn prepare(_: &mut Value, _: &Path) -> Result<(), InvalidConfig> {
        Ok(())
    }

    fn open(opening: &Opening<'_>, _: &Value) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(Down {
            health: opening.health.clone(),
        }))
    }
}

#[async_trait]
impl Source for Down {
    fn name(&self) -> &str {
        "down"
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    async fn seek(&mut self, _: &Value) -> Result<(), SourceError> {
        Ok(())
    }

    async fn replay(&mut self, _: &Resume, _: &mut Records) -> Result<Step, SourceError> {
        unreachable!("nothing was ever read")
    }

    async fn queue(&mut self, _: QueueLimits, _: &mut Records) -> Result<Step, SourceError> {
        self.health.connecting();
        for _ in 0..2 {
            self.health.retrying(&REFUSED);
            tokio::task::yield_now().await;
        }
        std::future::pending().await
    }

    async fn ready(&mut self) {
        std::future::pending().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_retrying_inside_a_call_backs_off_with_its_error_and_degrades_its_shard() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::new().with_source(kind::<DownKind>());
    let yaml = format!(
        r#"
collections:
  acme/views:
    key: [/id]
    schema: {{type: object, required: [id], properties: {{id: {{type: string}}}}}}
sources:
  down:
    target: acme/views
    down: {{url: "kafka://app:s3cret@127.0.0.1:1", token: t0k}}
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
        pipeline,
        metrics,
        stop,
        run,
    } = common::follow(&yaml, dir.path(), registry).await;

    let backing_off = |snapshot: &Snapshot| {
        let shard = snapshot.shards.first()?;
        Some(shard.clone()).filter(|s| s.sources["down"].state == SourceState::BackingOff)
    };
    let shard = loop {
        assert!(!run.is_finished(), "the run goes on");
        if let Some(shard) = backing_off(&metrics.status.snapshot()) {
            break shard;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(shard.state, State::Degraded);
    let source = &shard.sources["down"];
    let error = source.last_error.as_ref().unwrap();
    assert_eq!((error.message.as_str(), error.retried), (REFUSED, true));
    assert!(source.retries >= 1);
    assert_eq!(shard.last_error.as_ref(), Some(error));
    assert_eq!(shard.bindings[0].resource, "t");
    let config = metrics.status.snapshot().config;
    assert_eq!(
        config["sources"]["down"]["down"],
        json!({"url": "kafka://app:***@127.0.0.1:1", "token": "***"})
    );

    // A stop ends the waiting call; the shard ends stopped, its source as it was.
    stop.send_replace(true);
    run.await.unwrap().unwrap();
    let ended = ended::read(&pipeline.recovery_log().join("views")).unwrap();
    assert_eq!(ended[0].shard.state, State::Stopped);
    let source = &ended[0].shard.sources["down"];
    assert_eq!(source.state, SourceState::BackingOff);
    assert_eq!(source.last_error.as_ref().unwrap().message, REFUSED);
}
