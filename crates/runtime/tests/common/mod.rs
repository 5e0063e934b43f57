//! What the runtime's pipeline tests share: the in-process memory driver, as the
//! registry lists it and as an endpoint a test keeps to read the store afterwards, and
//! a pipeline following its sources with its metrics and status served.

// Each test binary uses its own part of this.
#![allow(dead_code)]

use async_trait::async_trait;
use serde_json::json;
use sluice_driver_sdk::Builtin;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::{CommitPattern, flow};
use sluice_memory::MemoryDriver;
use sluice_memory::config::EndpointConfig;
use sluice_runtime::config::{EndpointDef, Pipeline};
use sluice_runtime::metrics::Metrics;
use sluice_runtime::pipeline::{self, Connect, Connected, PipelineError, RunOptions};
use sluice_runtime::registry::Registry;
use sluice_runtime::txn::Progress;
use sluice_runtime::types::Summary;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The `memory:` endpoint kind, as a binary registers it.
pub fn memory_kind() -> Builtin {
    Builtin::new::<EndpointConfig>(
        "memory",
        flow::EndpointType::SluiceMemory,
        &["path"],
        || Arc::new(MemoryDriver::new()),
    )
}

/// Connects every materialization to the one in-process endpoint the test holds.
pub struct Connector(pub Arc<InProcess>);

#[async_trait]
impl Connect for Connector {
    async fn connect(
        &self,
        _materialization: &str,
        _state_dir: &Path,
        _endpoint: &EndpointDef,
    ) -> Result<Connected, String> {
        Ok(Connected::flow(
            self.0.clone(),
            flow::EndpointType::SluiceMemory,
            json!({}),
            Some(CommitPattern::RemoteAuthoritative),
        ))
    }
}

/// A pipeline running in the background, following its sources, with the metrics it
/// serves (`/metrics`, `/api/status`) at hand.
pub struct Following {
    pub pipeline: Pipeline,
    pub metrics: Arc<Metrics>,
    /// Sending `true` stops the run.
    pub stop: watch::Sender<bool>,
    pub run: JoinHandle<Result<Vec<(String, Summary)>, PipelineError>>,
}

/// Parses the pipeline file `yaml` in `dir` with `registry` (plus the `memory:`
/// endpoint kind), plans it against one in-process memory endpoint, applies its first
/// start, and runs it following its sources with metrics.
pub async fn follow(yaml: &str, dir: &Path, registry: Registry) -> Following {
    let registry = registry.with_builtin(memory_kind());
    let pipeline = Pipeline::parse(yaml, dir, &registry).unwrap();
    let store = Arc::new(MemoryDriver::new());
    let connector = Connector(Arc::new(InProcess::new("memory", store)));
    let planned = pipeline::plan(&pipeline, &connector).await.unwrap();
    let (stop, stopped) = watch::channel(false);
    pipeline::apply_first_start(&pipeline, &planned, &stopped)
        .await
        .unwrap();
    let metrics = Arc::new(Metrics::new());
    let run = tokio::spawn({
        let (pipeline, metrics) = (pipeline.clone(), metrics.clone());
        async move {
            let options = RunOptions {
                follow: true,
                metrics: Some(metrics),
            };
            let progress = Arc::new(Progress::default());
            pipeline::run(&pipeline, planned, options, progress, stopped).await
        }
    });
    Following {
        pipeline,
        metrics,
        stop,
        run,
    }
}
