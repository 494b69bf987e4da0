//! Arrow record batches -> a dataset root, streamed batch by batch and published atomically.

use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_schema::Schema;

use crate::arrow::StreamWriter;
use crate::error::{Error, Result};
use crate::store::dataset::{DatasetManifest, StreamEntry, DATASET_FILE};
use crate::store::{RecordType, Staging, WriterOptions};

/// Writes a dataset root: one stream per column, published atomically by
/// [`DatasetWriter::finish`] (every stream complete, counts equal, `dataset.json` last, one
/// no-replace rename); dropped unfinished, it removes everything it wrote. Memory stays bounded
/// by one input batch whatever the dataset size.
pub struct DatasetWriter {
    // Dropped first: unfinished stream writers clean up before the staging folder goes.
    columns: Vec<Column>,
    staging: Staging,
    metadata: Option<serde_json::Value>,
}

struct Column {
    name: String,
    layout: RecordType,
    writer: Option<StreamWriter>,
}

fn folder_name(i: usize, name: &str) -> String {
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).take(64).collect();
    format!("{i:03}-{clean}")
}

impl DatasetWriter {
    /// Start writing `columns` (name and layout) to `dest`, which must not exist.
    pub fn create(dest: impl AsRef<Path>, columns: &[(String, RecordType)], options: WriterOptions) -> Result<DatasetWriter> {
        let each: Vec<_> = columns.iter().map(|(n, l)| (n.clone(), l.clone(), options.clone())).collect();
        DatasetWriter::create_each(dest, &each)
    }

    /// Start writing `columns` (name, layout and that stream's writer options: codec,
    /// dictionary, ...) to `dest`, which must not exist.
    pub fn create_each(dest: impl AsRef<Path>, columns: &[(String, RecordType, WriterOptions)]) -> Result<DatasetWriter> {
        if columns.is_empty() {
            return Err(Error::invalid("columns", "a dataset needs at least one column"));
        }
        let staging = Staging::create(dest)?;
        let mut w = DatasetWriter { staging, columns: Vec::with_capacity(columns.len()), metadata: None };
        for (i, (name, layout, options)) in columns.iter().enumerate() {
            if w.columns.iter().any(|c| &c.name == name) {
                return Err(Error::invalid("columns", format!("column name '{name}' appears twice")));
            }
            if name == "_id" || name == "_step" {
                return Err(Error::invalid("columns", format!("column name '{name}' is reserved")));
            }
            let folder = folder_name(i, name);
            let sw = StreamWriter::create(&w.staging.path().join(&folder), layout, options.clone())?;
            w.columns.push(Column { name: name.clone(), layout: layout.clone(), writer: Some(sw) });
        }
        Ok(w)
    }

    /// Start writing the columns of `schema` (layouts from [`RecordType::of_field`]).
    pub fn for_schema(dest: impl AsRef<Path>, schema: &Schema, options: WriterOptions) -> Result<DatasetWriter> {
        let columns = schema.fields().iter().map(|f| Ok((f.name().clone(), RecordType::of_field(f)?))).collect::<Result<Vec<_>>>()?;
        DatasetWriter::create(dest, &columns, options)
    }

    /// Append one batch: column `i` of `batch` to stream `i`.
    pub fn append(&mut self, batch: &RecordBatch) -> Result<()> {
        if batch.num_columns() != self.columns.len() {
            return Err(Error::invalid("batch", format!("{} columns for {} streams", batch.num_columns(), self.columns.len())));
        }
        for (col, c) in batch.columns().iter().zip(self.columns.iter_mut()) {
            let w = c.writer.as_mut().ok_or(Error::Closed { what: "dataset writer" })?;
            w.append_array(&c.name, &c.layout, col.as_ref())?;
        }
        Ok(())
    }

    /// Append every batch of a reader (streamed: one batch in memory at a time).
    pub fn append_reader(&mut self, reader: impl Iterator<Item = std::result::Result<RecordBatch, arrow_schema::ArrowError>>) -> Result<u64> {
        let mut rows = 0u64;
        for b in reader {
            let b = b?;
            rows += b.num_rows() as u64;
            self.append(&b)?;
        }
        Ok(rows)
    }

    /// Set `dataset.json`'s free-form `metadata` (written at [`DatasetWriter::finish`]).
    pub fn set_metadata(&mut self, metadata: serde_json::Value) {
        self.metadata = Some(metadata);
    }

    /// Records written per stream.
    pub fn len(&self) -> u64 {
        self.columns.first().and_then(|c| c.writer.as_ref()).map(|w| w.len()).unwrap_or(0)
    }

    /// True before the first record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where the root is published.
    pub fn path(&self) -> &Path {
        self.staging.dest()
    }

    /// The `dataset.json` entries of a root written with `columns` (folder names and logical
    /// types as [`DatasetWriter::create`] lays them out).
    pub fn stream_entries(columns: &[(String, RecordType)]) -> Vec<StreamEntry> {
        columns
            .iter()
            .enumerate()
            .map(|(i, (name, layout))| {
                StreamEntry { name: name.clone(), path: folder_name(i, name), logical: layout.logical }
            })
            .collect()
    }

    /// Publish every stream, check the counts agree, write `dataset.json` and rename the root
    /// into place (never replacing an existing path).
    pub fn finish(mut self) -> Result<PathBuf> {
        let mut count = None;
        for c in &mut self.columns {
            let w = c.writer.take().ok_or(Error::Closed { what: "dataset writer" })?;
            let n = w.len();
            if *count.get_or_insert(n) != n {
                return Err(Error::invalid("dataset", format!("column '{}' has {n} records, others {}", c.name, count.unwrap_or(0))));
            }
            w.finish()?;
        }
        let columns: Vec<(String, RecordType)> = self.columns.iter().map(|c| (c.name.clone(), c.layout.clone())).collect();
        let entries = DatasetWriter::stream_entries(&columns);
        let mut manifest = DatasetManifest::new(count.unwrap_or(0), entries);
        manifest.metadata = self.metadata.take();
        // Every stream is published (and fsynced) inside the staging folder: publish the root.
        self.staging.publish(DATASET_FILE, &manifest.to_bytes()?)
    }
}
