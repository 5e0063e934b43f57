//! Helpers shared by the driver SDK's integration tests: specs, opens, arena messages.

#![allow(dead_code)]

use sluice_driver_sdk::arena::{LoadBuilder, StoreBuilder, StoreDoc};
use sluice_driver_sdk::client::{self, ClientReceiver, ClientSender, Response};
use sluice_driver_sdk::flow;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Prepare, Store};
use sluice_driver_sdk::materialize::transaction_response::Opened;
use sluice_driver_sdk::{Driver, Endpoint, Result};
use std::sync::Arc;

/// A materialization with one binding per `(table, delta_updates)`.
pub fn spec(name: &str, endpoint: &str, tables: &[(&str, bool)]) -> flow::MaterializationSpec {
    flow::MaterializationSpec {
        materialization: name.into(),
        endpoint_type: flow::EndpointType::SluiceMemory as i32,
        endpoint_spec_json: endpoint.into(),
        bindings: tables
            .iter()
            .map(|(table, delta)| flow::materialization_spec::Binding {
                resource_spec_json: format!(r#"{{"table":"{table}"}}"#),
                resource_path: vec![table.to_string()],
                delta_updates: *delta,
                ..Default::default()
            })
            .collect(),
    }
}

pub fn open(spec: &flow::MaterializationSpec, key_begin: u32, key_end: u32) -> Open {
    Open {
        materialization: Some(spec.clone()),
        version: "v1".into(),
        key_begin,
        key_end,
        driver_checkpoint_json: b"{}".to_vec(),
    }
}

/// One Load of `binding` for `keys`.
pub fn load(binding: u32, keys: &[&[u8]]) -> Load {
    let mut b = LoadBuilder::new();
    for key in keys {
        b.push(binding, key);
    }
    b.finish().pop().unwrap_or(Load {
        binding,
        ..Default::default()
    })
}

/// One Store of `binding` for `(key, doc, exists)`.
pub fn store(binding: u32, docs: &[(&[u8], &str, bool)]) -> Store {
    let mut b = StoreBuilder::new();
    for (key, doc, exists) in docs {
        b.push(
            binding,
            StoreDoc {
                key,
                values: &[],
                doc: doc.as_bytes(),
                exists: *exists,
            },
        );
    }
    b.finish().pop().unwrap_or(Store {
        binding,
        ..Default::default()
    })
}

/// Connects to `driver` in-process and opens `spec` over `[key_begin, key_end]`.
pub async fn connect(
    driver: Arc<dyn Driver>,
    spec: &flow::MaterializationSpec,
    key_begin: u32,
    key_end: u32,
) -> Result<(ClientSender, ClientReceiver, Opened)> {
    let endpoint = InProcess::new("test", driver);
    client::open(
        endpoint.transactions().await?,
        open(spec, key_begin, key_end),
    )
    .await
}

/// One whole transaction without loads: Acknowledge, Prepare with `checkpoint`, `stores`,
/// Commit; returns once DriverCommitted arrived, or the first error.
pub async fn transaction(
    tx: &mut ClientSender,
    rx: &mut ClientReceiver,
    checkpoint: &[u8],
    stores: Vec<Store>,
) -> Result<()> {
    tx.acknowledge().await?;
    assert!(matches!(rx.recv().await?, Response::Acknowledged));
    tx.prepare(Prepare {
        flow_checkpoint: checkpoint.to_vec(),
    })
    .await?;
    assert!(matches!(rx.recv().await?, Response::Prepared(_)));
    for s in stores {
        tx.store(s).await?;
    }
    tx.commit().await?;
    assert!(matches!(rx.recv().await?, Response::DriverCommitted));
    Ok(())
}
