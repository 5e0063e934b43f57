//! Avro (to be written): the binding's selected fields and `_op` as an Avro record.

use super::{Buffer, Encoder, Fields};
use crate::change::Change;
use crate::{OutputError, Result};

pub struct Avro;

impl Avro {
    pub fn new(
        _fields: Fields,
        _schema_id: Option<u32>,
        _key_schema_id: Option<u32>,
    ) -> Result<Avro> {
        Err(OutputError::Config("format avro is not built yet".into()))
    }
}

impl Encoder for Avro {
    fn encode(&mut self, _change: &Change<'_>, _out: &mut Buffer) -> Result<()> {
        Ok(())
    }
}
