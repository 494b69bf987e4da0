//! The one path from record sources to Arrow: [`Scanner`] turns a selection of ids over a
//! dataset's streams into record batches (`_id` plus one column per projected stream), and
//! [`stream_field`] / [`batch_column`] give the schema and the column of any gathered batch.
//! SQL scans, the `gather()` / `loader()` table functions, the Arrow loader and the Python
//! views all go through here, so a stream reads back as the same Arrow type everywhere:
//! dense -> `arrow.fixed_shape_tensor` (or the primitive for scalars), ragged -> `List` /
//! `arrow.variable_shape_tensor`, utf8 -> `Utf8View`, binary -> `Binary`.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, RecordBatchOptions, RecordBatchReader, UInt64Array};
use arrow_schema::{ArrowError, DataType, Field, FieldRef, Schema, SchemaRef};

use crate::arrow::{column_from_ragged, dense_to_arrow};
use crate::error::Result;
use crate::memory::Allocator;
use crate::store::{Batch, ChunkIds, Chunks, Dataset, Layout, Logical, ReadOptions, RecordSource, Selection, SourceView};

/// The record id column.
pub const ID_COLUMN: &str = "_id";

/// Target bytes of one scanned batch: rows per batch are capped to stay near it (8192 rows of
/// 150 KB images would be 1.2 GB).
pub const BATCH_BYTES: u64 = 32 << 20;

impl Batch {
    /// The batch as the Arrow column of its logical type, sharing the batch's memory.
    pub fn to_arrow(&self, name: &str, logical: Logical) -> Result<(FieldRef, ArrayRef)> {
        match self {
            Batch::Dense(t) => dense_to_arrow(name, t),
            Batch::Ragged(b) => column_from_ragged(name, b, logical),
        }
    }
}

/// The Arrow field a source's records read back as, from its description alone (no read).
pub fn stream_field(name: &str, source: &dyn RecordSource) -> Result<FieldRef> {
    source.record_type().field(name)
}

/// A gathered batch of `source` as its Arrow column.
pub fn batch_column(name: &str, source: &dyn RecordSource, batch: &Batch) -> Result<ArrayRef> {
    Ok(batch.to_arrow(name, source.logical())?.1)
}

/// Decoded bytes of one record of `source`: exact for dense sources, the store's average for
/// ragged ones (1 KiB when unknown).
pub fn record_bytes_hint(source: &dyn RecordSource) -> u64 {
    match source.layout() {
        Layout::Dense { item_shape } => item_shape.iter().product::<usize>() as u64 * source.dtype().size() as u64,
        Layout::Ragged { .. } => source.store().map(|s| s.stats().raw_bytes / s.len().max(1)).unwrap_or(1024),
    }
}

/// One output column of a scan: the record id, or stream `i` of the dataset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanColumn {
    /// `_id` (UInt64).
    Id,
    /// Stream number `i`.
    Stream(usize),
}

impl ScanColumn {
    /// Column `c` of a full scan (`Scanner::all_columns`): `_id`, then the streams in order.
    pub fn at(c: usize) -> ScanColumn {
        match c {
            0 => ScanColumn::Id,
            c => ScanColumn::Stream(c - 1),
        }
    }
}

/// Scans a dataset's streams into Arrow record batches.
#[derive(Clone, Debug)]
pub struct Scanner {
    dataset: Dataset,
    allocator: Allocator,
    options: ReadOptions,
}

impl Scanner {
    /// A scanner of `dataset` gathering into `allocator`.
    pub fn new(dataset: Dataset, allocator: &Allocator) -> Scanner {
        Scanner { dataset, allocator: allocator.clone(), options: ReadOptions::default() }
    }

    /// The same scanner with `options`.
    pub fn with_options(mut self, options: ReadOptions) -> Scanner {
        self.options = options;
        self
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// Every column: `_id`, then each stream.
    pub fn all_columns(&self) -> Vec<ScanColumn> {
        (0..=self.dataset.streams().len()).map(ScanColumn::at).collect()
    }

    /// The schema of `columns`.
    pub fn schema(&self, columns: &[ScanColumn]) -> Result<SchemaRef> {
        let fields = columns
            .iter()
            .map(|c| match c {
                ScanColumn::Id => Ok(Arc::new(Field::new(ID_COLUMN, DataType::UInt64, false))),
                ScanColumn::Stream(i) => {
                    let s = self.stream(*i)?;
                    stream_field(&s.name, s.source.as_ref())
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Schema::new(fields)))
    }

    fn stream(&self, i: usize) -> Result<&crate::store::Stream> {
        self.dataset.streams().get(i).ok_or_else(|| crate::Error::invalid("column", format!("stream {i} of {}", self.dataset.streams().len())))
    }

    /// Rows per batch for `columns`: at most `max_rows`, and about [`BATCH_BYTES`] of records.
    pub fn rows_per_batch(&self, columns: &[ScanColumn], max_rows: usize) -> usize {
        let row_bytes: u64 = columns
            .iter()
            .filter_map(|c| match c {
                ScanColumn::Stream(i) => self.dataset.streams().get(*i).map(|s| record_bytes_hint(s.source.as_ref())),
                ScanColumn::Id => None,
            })
            .sum();
        max_rows.min((BATCH_BYTES / row_bytes.max(1)).max(1) as usize).max(1)
    }

    /// The records of `selection` (in its order) as batches of at most `batch_rows` rows.
    /// Streams not in `columns` are never read.
    pub fn scan(&self, selection: Selection, columns: &[ScanColumn], batch_rows: usize) -> Result<ScanReader> {
        let schema = self.schema(columns)?;
        let mut out = Vec::with_capacity(columns.len());
        for c in columns {
            out.push(match c {
                ScanColumn::Id => None,
                ScanColumn::Stream(i) => {
                    let s = self.stream(*i)?;
                    Some((s.name.clone(), SourceView::new(s.source.clone(), &self.allocator).with_options(self.options)))
                }
            });
        }
        Ok(ScanReader { schema, columns: out, chunks: Chunks::new(selection, batch_rows) })
    }
}

/// The batches of one scan: a `RecordBatchReader`.
pub struct ScanReader {
    schema: SchemaRef,
    columns: Vec<Option<(String, SourceView)>>,
    chunks: Chunks,
}

impl ScanReader {
    /// The next batch, with zrecord's error type.
    pub fn next_batch(&mut self) -> Option<Result<RecordBatch>> {
        let ids = self.chunks.next()?;
        Some(self.build(&ids))
    }

    fn build(&self, ids: &ChunkIds) -> Result<RecordBatch> {
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        for c in &self.columns {
            cols.push(match c {
                None => Arc::new(UInt64Array::from(ids.to_vec())),
                Some((name, view)) => batch_column(name, view.source().as_ref(), &view.gather_ids(ids.ids())?)?,
            });
        }
        let opts = RecordBatchOptions::new().with_row_count(Some(ids.len()));
        Ok(RecordBatch::try_new_with_options(self.schema.clone(), cols, &opts)?)
    }
}

impl Iterator for ScanReader {
    type Item = std::result::Result<RecordBatch, ArrowError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_batch().map(|r| r.map_err(ArrowError::from))
    }
}

impl RecordBatchReader for ScanReader {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }
}
