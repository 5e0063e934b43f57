//! TEMPORARY: stands in for `sluice_nats::admin` until the branch wt-nats is merged;
//! every call fails, naming that.

#![allow(clippy::unused_async)]

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
