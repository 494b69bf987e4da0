//! Dataset roots: aligned named streams (one store each) under one folder.
//!
//! A root written by `COPY ... STORED AS ZRECORD` (or [`DatasetWriter`]) holds one store per
//! column plus `dataset.json` (stream names, their folders, and what a uint8 ragged stream means:
//! tensor, utf8 or binary), and is published by one atomic rename once every stream is complete.
//! A folder without `dataset.json` whose sub-folders are stores is accepted too (streams sorted
//! by folder name), so stores written separately can be queried together.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::arrow::{ColumnLayout, Logical, StreamWriter};
use crate::error::{Error, Result};
use crate::store::{format, rename_noreplace, sync_dir, Store, WriterOptions};

/// The file naming a dataset root's streams.
pub const DATASET_FILE: &str = "dataset.json";
const DATASET_FORMAT: &str = "zrecord-dataset";
const DATASET_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize)]
struct DatasetManifest {
    format: String,
    version: u32,
    record_count: u64,
    streams: Vec<StreamEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct StreamEntry {
    name: String,
    path: String,
    #[serde(default)]
    logical: Logical,
}

/// One named stream of a dataset.
#[derive(Clone, Debug)]
pub struct Stream {
    /// Column name.
    pub name: String,
    /// The opened store.
    pub store: Store,
    /// What the records mean to Arrow.
    pub logical: Logical,
}

impl Stream {
    /// The stream's store layout.
    pub fn layout(&self) -> ColumnLayout {
        match &self.store {
            Store::Dense(s) => ColumnLayout::Dense { dtype: s.dtype(), item_shape: s.item_shape().to_vec() },
            Store::Ragged(s) => ColumnLayout::Ragged { dtype: s.dtype(), ndim: s.ndim(), logical: self.logical },
        }
    }
}

/// Aligned streams with one record count.
#[derive(Clone, Debug)]
pub struct Dataset {
    path: PathBuf,
    streams: Vec<Stream>,
    len: u64,
}

/// The column name of a single store: its folder name without extension.
fn store_column_name(path: &Path) -> String {
    path.file_stem().or_else(|| path.file_name()).map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "data".into())
}

impl Dataset {
    /// Open a store (one stream named after its folder, extension dropped) or a dataset root.
    pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
        let path = path.as_ref();
        if path.join(format::MANIFEST).exists() {
            let store = Store::open(path)?;
            let len = store.len();
            let stream = Stream { name: store_column_name(path), store, logical: Logical::Tensor };
            return Ok(Dataset { path: path.to_path_buf(), streams: vec![stream], len });
        }
        let meta = path.join(DATASET_FILE);
        let streams = if meta.exists() {
            let text = fs::read(&meta).map_err(|e| Error::io(&meta, e))?;
            let m: DatasetManifest = serde_json::from_slice(&text).map_err(|e| Error::corrupt(&meta, format!("dataset JSON: {e}")))?;
            if m.format != DATASET_FORMAT {
                return Err(Error::corrupt(&meta, format!("format is '{}', not '{DATASET_FORMAT}'", m.format)));
            }
            if m.version != DATASET_VERSION {
                return Err(Error::UnsupportedVersion { path: meta, found: m.version, supported: DATASET_VERSION });
            }
            let mut streams = Vec::with_capacity(m.streams.len());
            for e in m.streams {
                if e.path.contains("..") || e.path.starts_with('/') {
                    return Err(Error::corrupt(&meta, format!("stream '{}' path '{}' leaves the root", e.name, e.path)));
                }
                let store = Store::open(path.join(&e.path))?;
                if e.logical != Logical::Tensor {
                    let ok = matches!(&store, Store::Ragged(s) if s.dtype() == crate::DType::UInt8 && s.ndim() == 1);
                    if !ok {
                        return Err(Error::corrupt(&meta, format!("stream '{}' is marked {} but is not a uint8 ndim-1 ragged store", e.name, e.logical.name())));
                    }
                }
                streams.push(Stream { name: e.name, store, logical: e.logical });
            }
            streams
        } else if path.is_dir() {
            let mut dirs: Vec<PathBuf> = fs::read_dir(path)
                .map_err(|e| Error::io(path, e))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join(format::MANIFEST).exists())
                .collect();
            dirs.sort();
            let mut streams = Vec::with_capacity(dirs.len());
            for d in dirs {
                let store = Store::open(&d)?;
                streams.push(Stream { name: store_column_name(&d), store, logical: Logical::Tensor });
            }
            streams
        } else {
            return Err(Error::NotFound { path: path.to_path_buf(), reason: "no manifest.json or dataset.json (and not a folder)".into() });
        };
        if streams.is_empty() {
            return Err(Error::NotFound { path: path.to_path_buf(), reason: "neither a store nor a dataset root (no streams found)".into() });
        }
        Dataset::from_streams(path.to_path_buf(), streams)
    }

    /// Streams given directly (names must be unique; record counts must agree).
    pub fn from_streams(path: PathBuf, streams: Vec<Stream>) -> Result<Dataset> {
        let len = streams.first().map(|s| s.store.len()).unwrap_or(0);
        for (i, s) in streams.iter().enumerate() {
            if s.name == "_id" || s.name == "_step" {
                return Err(Error::invalid("stream", format!("stream name '{}' is reserved", s.name)));
            }
            if streams[..i].iter().any(|o| o.name == s.name) {
                return Err(Error::invalid("stream", format!("stream name '{}' appears twice", s.name)));
            }
            if s.store.len() != len {
                return Err(Error::invalid(
                    "dataset",
                    format!("streams are not aligned: '{}' has {} records but '{}' has {len}", s.name, s.store.len(), streams[0].name),
                ));
            }
        }
        Ok(Dataset { path, streams, len })
    }

    /// Where it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The streams, in column order.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// Records per stream.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when there are no records.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Writes a dataset root: one stream per column, published atomically by [`DatasetWriter::finish`];
/// dropped unfinished, it removes everything it wrote.
pub struct DatasetWriter {
    dest: PathBuf,
    tmp: PathBuf,
    columns: Vec<(String, ColumnLayout, String, Option<StreamWriter>)>,
}

static TMP_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn folder_name(i: usize, name: &str) -> String {
    let clean: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).take(64).collect();
    format!("{i:03}-{clean}")
}

impl DatasetWriter {
    /// Start writing `columns` (name and layout) to `dest`, which must not exist.
    pub fn create(dest: impl AsRef<Path>, columns: &[(String, ColumnLayout)], options: WriterOptions) -> Result<DatasetWriter> {
        let dest = dest.as_ref().to_path_buf();
        if fs::symlink_metadata(&dest).is_ok() {
            return Err(Error::AlreadyExists { path: dest });
        }
        if columns.is_empty() {
            return Err(Error::invalid("columns", "a dataset needs at least one column"));
        }
        let name = dest.file_name().ok_or_else(|| Error::invalid("path", format!("'{}' has no final component", dest.display())))?;
        let parent = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
        let tmp = parent.join(format!(
            ".{}.zrecord-tmp-{}-{}",
            name.to_string_lossy(),
            std::process::id(),
            TMP_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, e))?;
        let mut w = DatasetWriter { dest, tmp, columns: Vec::with_capacity(columns.len()) };
        for (i, (name, layout)) in columns.iter().enumerate() {
            if w.columns.iter().any(|c| &c.0 == name) {
                return Err(Error::invalid("columns", format!("column name '{name}' appears twice")));
            }
            let folder = folder_name(i, name);
            let sw = StreamWriter::create(&w.tmp.join(&folder), layout, options.clone())?;
            w.columns.push((name.clone(), layout.clone(), folder, Some(sw)));
        }
        Ok(w)
    }

    /// Append one batch: column `i` of `batch` to stream `i`.
    pub fn append(&mut self, batch: &arrow_array::RecordBatch) -> Result<()> {
        if batch.num_columns() != self.columns.len() {
            return Err(Error::invalid("batch", format!("{} columns for {} streams", batch.num_columns(), self.columns.len())));
        }
        for (col, (name, layout, _, w)) in batch.columns().iter().zip(self.columns.iter_mut()) {
            let w = w.as_mut().ok_or(Error::Closed { what: "dataset writer" })?;
            w.append_array(name, layout, col.as_ref())?;
        }
        Ok(())
    }

    /// Records written per stream.
    pub fn len(&self) -> u64 {
        self.columns.first().and_then(|c| c.3.as_ref()).map(|w| w.len()).unwrap_or(0)
    }

    /// True before the first record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Publish every stream, check the counts agree, write `dataset.json` and rename the root
    /// into place (never replacing an existing path).
    pub fn finish(mut self) -> Result<PathBuf> {
        let mut entries = Vec::with_capacity(self.columns.len());
        let mut count = None;
        for (name, layout, folder, w) in &mut self.columns {
            let w = w.take().ok_or(Error::Closed { what: "dataset writer" })?;
            let n = w.len();
            if *count.get_or_insert(n) != n {
                return Err(Error::invalid("dataset", format!("column '{name}' has {n} records, others {}", count.unwrap_or(0))));
            }
            w.finish()?;
            let logical = match layout {
                ColumnLayout::Ragged { logical, .. } => *logical,
                ColumnLayout::Dense { .. } => Logical::Tensor,
            };
            entries.push(StreamEntry { name: name.clone(), path: folder.clone(), logical });
        }
        let m = DatasetManifest { format: DATASET_FORMAT.into(), version: DATASET_VERSION, record_count: count.unwrap_or(0), streams: entries };
        let bytes = serde_json::to_vec_pretty(&m).map_err(|e| Error::invalid("dataset", e.to_string()))?;
        let mpath = self.tmp.join(DATASET_FILE);
        {
            use std::io::Write;
            let mut f = fs::File::create_new(&mpath).map_err(|e| Error::io(&mpath, e))?;
            f.write_all(&bytes).map_err(|e| Error::io(&mpath, e))?;
            f.sync_all().map_err(|e| Error::io(&mpath, e))?;
        }
        sync_dir(&self.tmp)?;
        rename_noreplace(&self.tmp, &self.dest)?;
        if let Some(parent) = self.dest.parent() {
            sync_dir(if parent.as_os_str().is_empty() { Path::new(".") } else { parent })?;
        }
        self.tmp = PathBuf::new();
        Ok(self.dest.clone())
    }
}

impl Drop for DatasetWriter {
    fn drop(&mut self) {
        // Writers first (they clean their own temp folders), then the root's.
        self.columns.clear();
        if !self.tmp.as_os_str().is_empty() {
            let _ = fs::remove_dir_all(&self.tmp);
        }
    }
}
