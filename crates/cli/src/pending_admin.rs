//! TEMPORARY: stands in for `sluice_kafka::admin` and `sluice_nats::admin` until the
//! branches wt-kafka and wt-nats are merged; every call fails, naming that.

#![allow(clippy::unused_async)]

pub mod kafka {
    use anyhow::bail;

    pub async fn create_topic(_: &[String], _: &str, _: i32) -> anyhow::Result<()> {
        bail!("the kafka source is not merged into this branch yet")
    }

    pub async fn produce(
        _: &[String],
        _: &str,
        _: i32,
        _: Vec<(Vec<u8>, Vec<u8>)>,
    ) -> anyhow::Result<()> {
        bail!("the kafka source is not merged into this branch yet")
    }

    pub async fn delete_topic(_: &[String], _: &str) -> anyhow::Result<()> {
        bail!("the kafka source is not merged into this branch yet")
    }
}

pub mod nats {
    use anyhow::bail;

    pub async fn create_stream(_: &str, _: &str, _: &[&str]) -> anyhow::Result<()> {
        bail!("the nats source is not merged into this branch yet")
    }

    pub async fn publish(_: &str, _: &str, _: Vec<Vec<u8>>) -> anyhow::Result<()> {
        bail!("the nats source is not merged into this branch yet")
    }

    pub async fn delete_stream(_: &str, _: &str) -> anyhow::Result<()> {
        bail!("the nats source is not merged into this branch yet")
    }
}
