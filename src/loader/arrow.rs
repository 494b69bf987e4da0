//! The loader as an Arrow `RecordBatchReader`: one RecordBatch per step and view position,
//! columns `_step`, `_id`, then one column per stream, built by the same functions as SQL scans
//! ([`stream_field`], [`batch_column`]): strings read back as strings here too.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, RecordBatchReader, UInt64Array};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema, SchemaRef};

use crate::arrow::{batch_column, stream_field, ID_COLUMN};
use crate::error::{Error, Result};
use crate::loader::pipeline::{Loader, PositionBatch};
use crate::loader::sampler::Sampler;
use crate::loader::LoaderOptions;
use crate::store::SourceView;

/// The `_step` column.
pub const STEP_COLUMN: &str = "_step";

/// The schema of a loader's batches: `_step`, `_id`, then each stream (from the sources'
/// descriptions: nothing is read).
pub fn loader_schema(streams: &[(String, Vec<SourceView>)]) -> Result<SchemaRef> {
    let mut fields: Vec<FieldRef> = vec![
        Arc::new(Field::new(STEP_COLUMN, DataType::UInt64, false)),
        Arc::new(Field::new(ID_COLUMN, DataType::UInt64, false)),
    ];
    for (name, views) in streams {
        let v = views.first().ok_or_else(|| Error::invalid("streams", format!("stream '{name}' has no views")))?;
        fields.push(stream_field(name, v.source().as_ref())?);
    }
    Ok(Arc::new(Schema::new(fields)))
}

/// One position batch as a record batch of `schema` (whose columns name `_step`, `_id` or a
/// stream of `part`).
pub fn position_record_batch(schema: &SchemaRef, streams: &[(String, Vec<SourceView>)], part: &PositionBatch) -> Result<RecordBatch> {
    let n = part.ids.len();
    let mut cols: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let name = f.name();
        cols.push(match name.as_str() {
            STEP_COLUMN => Arc::new(UInt64Array::from(vec![part.step; n])),
            ID_COLUMN => Arc::new(UInt64Array::from(part.ids.clone())),
            _ => {
                let batch = &part.values.iter().find(|(s, _)| s == name).ok_or_else(|| Error::invalid("loader", format!("stream '{name}' missing")))?.1;
                let (_, views) = streams.iter().find(|(s, _)| s == name).ok_or_else(|| Error::invalid("loader", format!("stream '{name}' missing")))?;
                let view = views.get(part.position).or(views.first()).ok_or_else(|| Error::invalid("loader", format!("stream '{name}' has no views")))?;
                batch_column(name, view.source().as_ref(), batch)?
            }
        });
    }
    let opts = RecordBatchOptions::new().with_row_count(Some(n));
    Ok(RecordBatch::try_new_with_options(schema.clone(), cols, &opts)?)
}

/// Steps of a [`Loader`] as Arrow record batches; bounded by `steps` when given.
pub struct LoaderBatchReader {
    loader: Loader<Vec<PositionBatch>>,
    streams: Vec<(String, Vec<SourceView>)>,
    schema: SchemaRef,
    pending: std::collections::VecDeque<RecordBatch>,
    steps_left: Option<u64>,
}

impl LoaderBatchReader {
    /// A reader over a new loader; `steps` bounds the stream (endless when `None`).
    pub fn new(streams: Vec<(String, Vec<SourceView>)>, sampler: Sampler, options: LoaderOptions, steps: Option<u64>) -> Result<Self> {
        let schema = loader_schema(&streams)?;
        let start = sampler.step();
        let mut loader = Loader::new(streams.clone(), sampler, options)?;
        loader.seek(start)?;
        Ok(LoaderBatchReader { loader, streams, schema, pending: Default::default(), steps_left: steps })
    }

    fn batches(&self, parts: Vec<PositionBatch>) -> Result<Vec<RecordBatch>> {
        parts.iter().map(|p| position_record_batch(&self.schema, &self.streams, p)).collect()
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
        let parts = match self.loader.next_step()? {
            Ok(s) => s,
            Err(e) => return Some(Err(e.into())),
        };
        match self.batches(parts) {
            Ok(bs) => {
                self.pending.extend(bs);
                self.pending.pop_front().map(Ok)
            }
            Err(e) => Some(Err(e.into())),
        }
    }
}

impl RecordBatchReader for LoaderBatchReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}
