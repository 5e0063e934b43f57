//! Running a connector's sub-commands for one source: the files it is handed (its
//! configuration, the catalog, the state) in a private temporary folder, `check`,
//! `discover` (once per source instance: the catalog is kept) and `read` from a state.

use crate::config::{ConnectorConfig, Settings};
use crate::process::Process;
use crate::protocol::{Message, Protocol, Stream};
use serde_json::Value;
use sluice_source_sdk::SourceError;
use std::marker::PhantomData;
use std::path::PathBuf;
use tempfile::TempDir;
use tokio::sync::OnceCell;

/// How source `name` runs its connector.
pub struct Launch<P> {
    pub name: String,
    pub config: ConnectorConfig,
    /// The streams `discover` found, once asked.
    offered: OnceCell<Vec<Stream>>,
    protocol: PhantomData<fn() -> P>,
}

impl<P: Protocol> Launch<P> {
    pub fn new(name: &str, config: &ConnectorConfig) -> Launch<P> {
        Launch {
            name: name.to_string(),
            config: config.clone(),
            offered: OnceCell::new(),
            protocol: PhantomData,
        }
    }

    /// The connector's `check` (a tap's `discover`): `Config` naming the source and the
    /// connector's own message when it fails.
    pub async fn check(&self) -> Result<(), SourceError> {
        let (files, config) = self.files()?;
        let Some(args) = P::check_args(&config) else {
            return self.offered().await.map(|_| ());
        };
        let output = self.run_whole(args, files).await?;
        let mut failure = None;
        for line in output.split(|b| *b == b'\n') {
            match P::parse(line) {
                Ok(Message::Status(Ok(()))) => return Ok(()),
                Ok(Message::Status(Err(message))) | Ok(Message::Error { message, .. }) => {
                    failure = Some(message)
                }
                _ => {}
            }
        }
        Err(self.config_error(&format!(
            "the connector's check failed: {}",
            failure.unwrap_or_else(|| "it answered no CONNECTION_STATUS".to_string())
        )))
    }

    /// The configuration with the defaults the connector's spec declares filled in
    /// where an inline configuration leaves a top-level key out (Airbyte connectors
    /// read their spec's defaults only through a platform's form); a file, or a
    /// protocol without a spec, is left as it is.
    pub async fn with_defaults(&self) -> Result<ConnectorConfig, SourceError> {
        let mut config = self.config.clone();
        let (Settings::Inline(settings), Some(args)) = (&mut config.config, P::spec_args()) else {
            return Ok(config);
        };
        let (files, _) = self.files()?;
        let spec = self.run_whole(args, files).await?;
        for (key, default) in P::defaults(&spec) {
            settings.entry(key).or_insert(default);
        }
        Ok(config)
    }

    /// The streams the connector offers (its `discover`, run once).
    pub async fn offered(&self) -> Result<&[Stream], SourceError> {
        let streams = self
            .offered
            .get_or_try_init(|| async {
                let (files, config) = self.files()?;
                let output = self.run_whole(P::discover_args(&config), files).await?;
                P::catalog(&output).map_err(|e| {
                    self.config_error(&format!("the connector's discover failed: {e}"))
                })
            })
            .await?;
        Ok(streams)
    }

    /// Starts `read` of the selected streams from `state` (the state file's content;
    /// null: from the start).
    pub async fn read(&self, state: &Value) -> Result<Process, SourceError> {
        let offered = self.offered().await?;
        let catalog =
            P::configured(offered, &self.config.streams).map_err(|e| self.config_error(&e))?;
        let (files, config) = self.files()?;
        let dir = files.path();
        let catalog_path = dir.join("catalog.json");
        self.write(&catalog_path, &catalog)?;
        let state_path = (!state.is_null()).then(|| dir.join("state.json"));
        if let Some(path) = &state_path {
            self.write(path, state)?;
        }
        let args = P::read_args(&config, &catalog_path, state_path.as_deref());
        self.spawn(args, files)
    }

    /// Runs a sub-command to its end and returns its stdout; a non-zero exit is the
    /// connector's error as a configuration error (check and discover fail for what the
    /// user wrote, not for a passing fault).
    async fn run_whole(
        &self,
        args: Vec<std::ffi::OsString>,
        files: TempDir,
    ) -> Result<Vec<u8>, SourceError> {
        let mut process = self.spawn(args, files)?;
        let output = process.read_to_end().await?;
        for line in output.split(|b| *b == b'\n') {
            if let Ok(
                Message::Error { message, .. }
                | Message::Log {
                    error: true,
                    message,
                },
            ) = P::parse(line)
            {
                process.said_error(&message);
            }
        }
        match process.finish().await {
            Ok(()) => Ok(output),
            Err(SourceError::Io { error, .. }) => Err(self.config_error(&error.to_string())),
            Err(other) => Err(other),
        }
    }

    fn spawn(&self, args: Vec<std::ffi::OsString>, files: TempDir) -> Result<Process, SourceError> {
        let program = self.config.program(P::PREFIX);
        Process::spawn(&self.name, &program, args, Some(files), self.config.timeout)
    }

    /// A private folder for the connector's files, and the path of its configuration
    /// (written there when inline).
    fn files(&self) -> Result<(TempDir, PathBuf), SourceError> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-connector-")
            .tempdir()
            .map_err(|error| SourceError::Io {
                name: self.name.clone(),
                path: std::env::temp_dir().display().to_string(),
                error,
            })?;
        let config = match &self.config.config {
            Settings::File(path) => path.clone(),
            Settings::Inline(settings) => {
                let path = dir.path().join("config.json");
                self.write(&path, &Value::Object(settings.clone()))?;
                path
            }
        };
        Ok((dir, config))
    }

    fn write(&self, path: &std::path::Path, value: &Value) -> Result<(), SourceError> {
        let text = serde_json::to_vec(value).expect("JSON serializes");
        std::fs::write(path, text).map_err(|error| SourceError::Io {
            name: self.name.clone(),
            path: path.display().to_string(),
            error,
        })
    }

    pub fn config_error(&self, reason: &str) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason: format!("{} connector: {reason}", P::NAME),
        }
    }
}
