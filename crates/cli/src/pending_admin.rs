//! TEMPORARY: stands in for `sluice_kafka::admin` and `sluice_nats::admin` until the
//! branches wt-kafka and wt-nats are merged; every call fails, naming that.

#![allow(clippy::unused_async)]

pub mod kafka {
    use anyhow::bail;

    pub struct Admin;

    impl Admin {
        pub async fn connect(_: &[String]) -> anyhow::Result<Admin> {
            bail!("the kafka source is not merged into this branch yet")
        }

        pub async fn create_topic(&self, _: &str, _: i32) -> anyhow::Result<()> {
            Ok(())
        }

        pub async fn produce(
            &self,
            _: &str,
            _: i32,
            _: impl IntoIterator<Item = (Option<Vec<u8>>, Vec<u8>)>,
        ) -> anyhow::Result<Vec<i64>> {
            Ok(Vec::new())
        }

        pub async fn delete_topic(&self, _: &str) -> anyhow::Result<()> {
            Ok(())
        }
    }
}

pub mod nats {
    use anyhow::bail;
    use bytes::Bytes;

    pub struct Admin;

    impl Admin {
        pub async fn connect(_: &str) -> anyhow::Result<Admin> {
            bail!("the nats source is not merged into this branch yet")
        }

        pub async fn create_stream(&self, _: &str, _: &[&str]) -> anyhow::Result<()> {
            Ok(())
        }

        pub async fn publish_batch(
            &self,
            _: &str,
            _: impl IntoIterator<Item = Bytes>,
        ) -> anyhow::Result<u64> {
            Ok(0)
        }

        pub async fn delete_stream(&self, _: &str) -> anyhow::Result<()> {
            Ok(())
        }
    }
}
