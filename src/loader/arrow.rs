//! The loader as an Arrow `RecordBatchReader`: one RecordBatch per step and view position,
//! columns `_step`, `_id`, then one column per stream (`arrow.fixed_shape_tensor`, `List<T>` or
//! `arrow.variable_shape_tensor`, sharing the gathered memory).

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchReader, UInt64Array};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema, SchemaRef};

use crate::arrow::{column_from_ragged, dense_to_arrow, Logical};
use crate::error::{Error, Result};
use crate::loader::pipeline::{Loader, Shard, StreamView, Value};
use crate::loader::sampler::Sampler;
use crate::loader::LoaderOptions;

/// One gathered stream value as its Arrow column (ragged uint8 streams as strings / bytes when
/// `logical` says so).
pub(crate) fn value_column(name: &str, v: &Value, logical: Logical) -> Result<(FieldRef, ArrayRef)> {
    match v {
        Value::Dense(t) => dense_to_arrow(name, t),
        Value::Ragged(b) => column_from_ragged(name, b, logical),
    }
}

fn column(name: &str, v: &Value) -> Result<(FieldRef, ArrayRef)> {
    value_column(name, v, Logical::Tensor)
}

/// Steps of a [`Loader`] as Arrow record batches; bounded by `steps` when given.
pub struct LoaderBatchReader {
    loader: Loader<Vec<Shard>>,
    schema: SchemaRef,
    pending: std::collections::VecDeque<RecordBatch>,
    steps_left: Option<u64>,
}

impl LoaderBatchReader {
    /// A reader over a new loader; `steps` bounds the stream (endless when `None`).
    pub fn new(streams: Vec<(String, Vec<StreamView>)>, sampler: Sampler, options: LoaderOptions, steps: Option<u64>) -> Result<Self> {
        // The schema comes from an empty gather of every stream (no records read).
        let mut fields: Vec<FieldRef> = vec![
            Arc::new(Field::new("_step", DataType::UInt64, false)),
            Arc::new(Field::new("_id", DataType::UInt64, false)),
        ];
        for (name, views) in &streams {
            let v = views.first().ok_or_else(|| Error::invalid("streams", format!("stream '{name}' has no views")))?;
            let empty = match v {
                StreamView::Dense(d) => Value::Dense(d.gather(&[])?),
                StreamView::Ragged(r) => Value::Ragged(r.gather(&[])?),
            };
            fields.push(column(name, &empty)?.0);
        }
        let start = sampler.step();
        let mut loader = Loader::new(streams, sampler, options)?;
        loader.seek(start)?;
        Ok(LoaderBatchReader { loader, schema: Arc::new(Schema::new(fields)), pending: Default::default(), steps_left: steps })
    }

    fn batches(&self, shards: Vec<Shard>) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::with_capacity(shards.len());
        for sh in shards {
            let mut cols: Vec<ArrayRef> = vec![
                Arc::new(UInt64Array::from(vec![sh.step; sh.ids.len()])),
                Arc::new(UInt64Array::from(sh.ids.clone())),
            ];
            for (name, v) in &sh.values {
                cols.push(column(name, v)?.1);
            }
            out.push(RecordBatch::try_new(self.schema.clone(), cols).map_err(|e| Error::invalid("arrow", e.to_string()))?);
        }
        Ok(out)
    }
}

impl Iterator for LoaderBatchReader {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(b) = self.pending.pop_front() {
            return Some(Ok(b));
        }
        if let Some(left) = self.steps_left.as_mut() {
            if *left == 0 {
                return None;
            }
            *left -= 1;
        }
        let shards = match self.loader.next_step()? {
            Ok(s) => s,
            Err(e) => return Some(Err(ArrowError::ExternalError(Box::new(e)))),
        };
        match self.batches(shards) {
            Ok(bs) => {
                self.pending.extend(bs);
                self.pending.pop_front().map(Ok)
            }
            Err(e) => Some(Err(ArrowError::ExternalError(Box::new(e)))),
        }
    }
}

impl RecordBatchReader for LoaderBatchReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}
