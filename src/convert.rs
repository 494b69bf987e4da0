//! Dataset conversion: Arrow record batches from any producer (a Hugging Face `Dataset`,
//! Parquet / Arrow IPC / CSV / JSON files, Polars, DuckDB) into a new dataset root, streamed
//! batch by batch and published atomically once every column is complete.
//!
//! [`Converter`] plans every column from the schema (and, when present, the Hugging Face
//! `Features` the schema or the caller carries) before any data is read, so a column without a
//! store layout fails first, naming the column, its HF feature and what to do. It then adapts
//! what the plain Arrow mapping of [`RecordType::of_field`] cannot take:
//!
//! | input | stream |
//! |---|---|
//! | HF `Array2D..Array5D` (nested lists of a fixed shape) | Dense of that shape |
//! | HF `ArrayND` with a dynamic first dimension | Ragged, ndim N |
//! | HF `Image` (`struct<bytes, path>`) with `decode_images` | Ragged uint8 `HWC`/`CHW`, or Dense with `resize` |
//! | dictionary-encoded columns | their value type |
//! | everything else | as `COPY ... STORED AS ZRECORD` ([`RecordType::of_field`]) |
//!
//! With `train_dict`, the first input (up to [`DICT_SAMPLE_FACTOR`] x the dictionary size per
//! column) is held back, a zstd dictionary is trained per column on its records, and the
//! columns are written with `zstd_dict` (a column too small to train falls back to `zstd`).

pub mod files;
mod ipc_check;
mod image;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, FixedSizeListArray, ListArray, RecordBatch, UInt64Array};
use arrow_buffer::{OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, FieldRef, Schema};
use serde_json::Value;

use crate::arrow::{variable_shape_column, DatasetWriter, EXTENSION_NAME_KEY};
use crate::error::{Error, Result};
use crate::store::codec::DictSamples;
use crate::store::{Codec, Layout, Logical, RecordType, WriterOptions};

pub use files::{open_files, FileFormat, FileInput};
pub use image::{ImageLayout, ImageMode, ImageOptions};

/// Small input batches are gathered up to this many bytes before they are written, so each
/// write gives the writer's parallel encoders enough work (Hugging Face caches hold batches of
/// 1,000 rows; CSV and JSON readers yield 8,192).
pub const COALESCE_BYTES: usize = 16 << 20;

/// Default trained dictionary size (zstd's own default, 110 KiB).
pub const DEFAULT_DICT_SIZE: usize = 112_640;
/// Input held back per column to train a dictionary: this many times the dictionary size.
pub const DICT_SAMPLE_FACTOR: usize = 100;

/// How to convert.
#[derive(Clone, Debug)]
pub struct ConvertOptions {
    /// Codec, level, data shards, `allow_empty` (and a fixed dictionary for `zstd_dict`).
    pub writer: WriterOptions,
    /// Columns to keep, in this order (default: all, in schema order).
    pub columns: Option<Vec<String>>,
    /// Decode HF `Image` columns (else they are refused with a message saying so).
    pub images: Option<ImageOptions>,
    /// Train a zstd dictionary of this many bytes per column on the first input.
    pub train_dict: Option<usize>,
    /// Hugging Face `Features` JSON (default: the schema's `huggingface` metadata, if any).
    pub features: Option<Value>,
    /// Extra entries for `dataset.json`'s `metadata` (source description, HF info).
    pub metadata: serde_json::Map<String, Value>,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            writer: WriterOptions::with_codec(Codec::Zstd),
            columns: None,
            images: None,
            train_dict: None,
            features: None,
            metadata: Default::default(),
        }
    }
}

/// How one input column becomes a stream.
#[derive(Clone, Debug)]
enum Adapt {
    /// Written as it is.
    Direct,
    /// Cast first (dictionary-encoded columns).
    Cast(DataType),
    /// Nested lists of a fixed shape -> nested FixedSizeList (HF ArrayND).
    FixedLists(Vec<usize>),
    /// Nested lists with a dynamic first dimension -> variable_shape_tensor (HF ArrayND).
    RaggedLists(Vec<usize>),
    /// Encoded images decoded to pixels.
    Image(ImageOptions),
}

#[derive(Debug)]
struct Plan {
    name: String,
    input: usize,
    adapt: Adapt,
    /// Known before data except for resized images of native channel count.
    layout: Option<RecordType>,
    /// Channel count of a resized image column, fixed by its first image.
    channels: Option<usize>,
    /// The codec its stream is written with (set when the streams are created).
    codec: Codec,
}

/// What a finished conversion wrote.
#[derive(Clone, Debug)]
pub struct ConvertReport {
    /// The published root.
    pub path: PathBuf,
    /// Records per stream.
    pub rows: u64,
    /// Record payload bytes written (before compression).
    pub bytes: u64,
    /// Per stream: name, layout, codec used.
    pub streams: Vec<(String, RecordType, Codec)>,
}

/// Staged record batches: per batch, its adapted columns.
type StagedBatches = Vec<Vec<(FieldRef, ArrayRef)>>;

#[derive(Default)]
struct Staged {
    batches: StagedBatches,
    bytes: usize,
}

impl Staged {
    fn push(&mut self, cols: Vec<(FieldRef, ArrayRef)>, bytes: usize) {
        self.batches.push(cols);
        self.bytes += bytes;
    }

    /// Take what is staged (the batches go to the writer with [`write_staged`]).
    fn take(&mut self) -> StagedBatches {
        self.bytes = 0;
        std::mem::take(&mut self.batches)
    }
}

/// Write staged batches as one batch per column (concatenated when there are several).
fn write_staged(w: &mut DatasetWriter, batches: StagedBatches) -> Result<()> {
    match batches.len() {
        0 => Ok(()),
        1 => append(w, &batches[0]),
        _ => {
            let ncols = batches[0].len();
            let mut cols = Vec::with_capacity(ncols);
            for k in 0..ncols {
                let parts: Vec<&dyn Array> = batches.iter().map(|b| b[k].1.as_ref()).collect();
                cols.push((batches[0][k].0.clone(), arrow_select::concat::concat(&parts)?));
            }
            append(w, &cols)
        }
    }
}

/// The dataset writer on a thread of its own: while it concatenates, encodes and writes one
/// staged group, the caller adapts and stages the next (on 2 cores the serial part of a
/// conversion, reading the source and concatenating, no longer waits for the encoder). One
/// group is in flight at most, so memory stays bounded at two groups. The first error stops
/// the thread; the next `send` or [`WriteBehind::join`] returns it.
struct WriteBehind {
    tx: Option<std::sync::mpsc::SyncSender<StagedBatches>>,
    thread: Option<std::thread::JoinHandle<(DatasetWriter, Result<()>)>>,
}

impl WriteBehind {
    fn start(mut w: DatasetWriter) -> Result<WriteBehind> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<StagedBatches>(0);
        let thread = std::thread::Builder::new()
            .name("zrecord-convert".into())
            .spawn(move || {
                for batches in rx {
                    if let Err(e) = write_staged(&mut w, batches) {
                        return (w, Err(e));
                    }
                }
                (w, Ok(()))
            })
            .map_err(|e| Error::invalid("convert", format!("cannot start the writer thread: {e}")))?;
        Ok(WriteBehind { tx: Some(tx), thread: Some(thread) })
    }

    /// Hand a group to the writer thread (waits while it still writes the previous one).
    fn send(&mut self, batches: StagedBatches) -> Result<()> {
        if batches.is_empty() {
            return Ok(());
        }
        let sent = self.tx.as_ref().map(|tx| tx.send(batches).is_ok()).unwrap_or(false);
        if sent {
            return Ok(());
        }
        // The thread stopped: it failed on an earlier group.
        self.join().and(Err(Error::Closed { what: "converter writer thread" }))
    }

    /// Every group written (or the first error): the writer back, to publish.
    fn join(&mut self) -> Result<DatasetWriter> {
        self.tx = None;
        let thread = self.thread.take().ok_or(Error::Closed { what: "converter writer thread" })?;
        let (w, r) = thread.join().map_err(|_| Error::invalid("convert", "the writer thread panicked"))?;
        r.map(|()| w)
    }
}

impl Drop for WriteBehind {
    // Abandoned (an error or abort): wait for the thread, whose writer then removes its
    // staging folder, so nothing of the conversion remains once the converter is gone.
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum State {
    /// Holding batches back to train dictionaries (or no data yet).
    Pending(Staged),
    /// Streams created; small batches staged until [`COALESCE_BYTES`].
    Writing(WriteBehind, Staged),
    Done,
}

/// Streams record batches into a new dataset root; see the module docs.
pub struct Converter {
    dest: PathBuf,
    plans: Vec<Plan>,
    options: ConvertOptions,
    state: State,
    rows: u64,
    bytes: u64,
    metadata: Value,
}

/// The Hugging Face `Features` JSON that `datasets` stores in a schema's `huggingface`
/// metadata (Arrow caches, `save_to_disk`, `to_parquet`), if any.
pub fn hf_features(schema: &Schema) -> Option<Value> {
    let v: Value = serde_json::from_str(schema.metadata().get("huggingface")?).ok()?;
    v.get("info")?.get("features").cloned()
}

/// A short description of a Hugging Face feature, for messages: `Image`, `List(Value('int32'))`.
fn describe_feature(f: &Value) -> String {
    let t = f.get("_type").and_then(|t| t.as_str()).unwrap_or("?");
    match t {
        "Value" => format!("Value('{}')", f.get("dtype").and_then(|d| d.as_str()).unwrap_or("?")),
        "List" | "Sequence" | "LargeList" => {
            let inner = f.get("feature").map(describe_feature).unwrap_or_else(|| "?".into());
            match f.get("length").and_then(|l| l.as_i64()).filter(|&l| l >= 0) {
                Some(l) => format!("{t}({inner}, length={l})"),
                None => format!("{t}({inner})"),
            }
        }
        t if is_array_nd(t) => format!(
            "{t}(shape={}, dtype='{}')",
            f.get("shape").map(|s| s.to_string()).unwrap_or_default(),
            f.get("dtype").and_then(|d| d.as_str()).unwrap_or("?")
        ),
        t => t.to_string(),
    }
}

fn is_array_nd(t: &str) -> bool {
    matches!(t, "Array2D" | "Array3D" | "Array4D" | "Array5D")
}

fn column_error(name: &str, feature: Option<&Value>, why: impl std::fmt::Display) -> Error {
    match feature {
        Some(f) => Error::invalid("column", format!("column '{name}' (HF feature {}): {why}", describe_feature(f))),
        None => Error::invalid("column", format!("column '{name}': {why}")),
    }
}

fn plan_column(field: &Field, input: usize, feature: Option<&Value>, options: &ConvertOptions) -> Result<Plan> {
    let name = field.name().clone();
    let ftype = feature.and_then(|f| f.get("_type")).and_then(|t| t.as_str());
    let ext = field.metadata().get(EXTENSION_NAME_KEY).map(|s| s.as_str()).unwrap_or("");
    let encoded_struct = matches!(field.data_type(), DataType::Struct(fs)
        if fs.iter().any(|f| f.name() == "bytes") && fs.iter().all(|f| f.name() == "bytes" || f.name() == "path"));
    let plan = |adapt: Adapt, layout: Option<RecordType>| Ok(Plan { name: name.clone(), input, adapt, layout, channels: None, codec: options.writer.codec });
    match ftype {
        Some("Image") => {
            let Some(opts) = &options.images else {
                return Err(column_error(
                    &name,
                    feature,
                    "images are stored encoded (PNG/JPEG bytes); pass decode_images=\"HWC\" (or \"CHW\", with resize=(h, w) for a dense \
                     column) to decode them into pixels, or cast the column to binary (e.g. .map(lambda r: {'img': r['img']['bytes']}) \
                     after ds.cast_column('img', Image(decode=False))) to store the encoded bytes",
                ));
            };
            return plan(Adapt::Image(opts.clone()), image_layout(opts, None));
        }
        Some(t @ ("Audio" | "Video" | "Pdf" | "Nifti")) => {
            return Err(column_error(
                &name,
                feature,
                format!(
                    "decoded {t} has no tensor layout here; map it to an array column first (e.g. ds.map(lambda r: {{'{name}': r['{name}']['array']}}) \
                     with Features Sequence(Value('float32'))), or store its encoded bytes as a binary column"
                ),
            ))
        }
        Some(t) if is_array_nd(t) => {
            let f = feature.unwrap_or(&Value::Null);
            let shape: Vec<Option<usize>> = f
                .get("shape")
                .and_then(|s| s.as_array())
                .map(|a| a.iter().map(|d| d.as_u64().map(|d| d as usize)).collect())
                .ok_or_else(|| column_error(&name, feature, "its feature has no shape"))?;
            if shape.len() < 2 || shape[1..].iter().any(|d| d.is_none()) {
                return Err(column_error(&name, feature, "only the first dimension of an ArrayND may be dynamic (None)"));
            }
            let inner: Vec<usize> = shape[1..].iter().map(|d| d.unwrap_or(0)).collect();
            let leaf = leaf_field(field);
            let probe = Field::new("probe", leaf.data_type().clone(), true).with_metadata(leaf.metadata().clone());
            let dtype = match RecordType::of_field(&probe) {
                Ok(RecordType { dtype, layout: Layout::Dense { item_shape }, .. }) if item_shape.is_empty() => dtype,
                _ => return Err(column_error(&name, feature, format!("element type {} is not a tensor element", leaf.data_type()))),
            };
            return match shape[0] {
                Some(d0) => {
                    let mut full = vec![d0];
                    full.extend_from_slice(&inner);
                    plan(Adapt::FixedLists(full.clone()), Some(RecordType::dense(dtype, full)))
                }
                None => plan(Adapt::RaggedLists(inner), Some(RecordType::ragged(dtype, shape.len()))),
            };
        }
        _ => {}
    }
    if ext.starts_with("datasets.features.features.Array") {
        return Err(column_error(&name, feature, format!("{ext} without its Hugging Face features (pass features=ds.features)")));
    }
    if encoded_struct && ftype.is_none() {
        if let Some(opts) = &options.images {
            return plan(Adapt::Image(opts.clone()), image_layout(opts, None));
        }
        return Err(column_error(
            &name,
            feature,
            "struct<bytes, path> looks like an encoded Hugging Face Image or Audio column; pass decode_images=\"HWC\" for images, or select its \
             bytes field as a binary column",
        ));
    }
    if let DataType::Dictionary(_, value) = field.data_type() {
        let cast = Field::new(&name, value.as_ref().clone(), field.is_nullable());
        let layout = RecordType::of_field(&cast).map_err(|e| e.context(describe_context(&name, feature)))?;
        return plan(Adapt::Cast(value.as_ref().clone()), Some(layout));
    }
    if *field.data_type() == DataType::Null {
        return Err(column_error(&name, feature, "every value is null (Arrow type null); drop the column or fill it"));
    }
    let layout = RecordType::of_field(field).map_err(|e| match feature {
        Some(_) => e.context(describe_context(&name, feature)),
        None => e,
    })?;
    plan(Adapt::Direct, Some(layout))
}

fn describe_context(name: &str, feature: Option<&Value>) -> String {
    match feature {
        Some(f) => format!("column '{name}' (HF feature {})", describe_feature(f)),
        None => format!("column '{name}'"),
    }
}

/// The innermost non-list field of nested lists.
fn leaf_field(field: &Field) -> &Field {
    let mut cur = field;
    while let DataType::List(c) | DataType::LargeList(c) | DataType::FixedSizeList(c, _) = cur.data_type() {
        cur = c;
    }
    cur
}

fn image_layout(opts: &ImageOptions, channels: Option<usize>) -> Option<RecordType> {
    match opts.resize {
        None => Some(RecordType::ragged(crate::DType::UInt8, 3)),
        Some(_) => {
            let c = opts.mode.map(|m| m.channels()).or(channels)?;
            let item_shape = image::dense_shape(opts, c).into_iter().map(|d| d as usize).collect();
            Some(RecordType::dense(crate::DType::UInt8, item_shape))
        }
    }
}

/// (offsets as i64, values) of a list array.
fn list_parts(column: &str, a: &ArrayRef) -> Result<(Vec<i64>, ArrayRef)> {
    Ok(match a.data_type() {
        DataType::List(_) => {
            let l = a.as_list::<i32>();
            (l.value_offsets().iter().map(|&o| o as i64).collect(), l.values().clone())
        }
        DataType::LargeList(_) => {
            let l = a.as_list::<i64>();
            (l.value_offsets().to_vec(), l.values().clone())
        }
        DataType::FixedSizeList(_, d) => {
            let l = a.as_fixed_size_list();
            let d = *d as i64;
            let base = l.offset() as i64 * d;
            ((0..=l.len() as i64).map(|i| base + i * d).collect(), l.values().clone())
        }
        dt => return Err(Error::invalid("column", format!("column '{column}': expected nested lists, found {dt}"))),
    })
}

/// Nested lists whose every level has the extent `shape[k]` -> nested FixedSizeList.
/// `rows_per` is how many elements of this level make one input row (for messages).
fn fixed_lists(column: &str, a: &ArrayRef, shape: &[usize], base: u64, rows_per: usize) -> Result<ArrayRef> {
    let Some((&d, rest)) = shape.split_first() else { return Ok(a.clone()) };
    if a.null_count() > 0 {
        let i = (0..a.len()).find(|&i| a.is_null(i)).unwrap_or(0);
        return Err(Error::invalid("column", format!("column '{column}' has a null at row {}; zrecord stores hold no nulls", base + (i / rows_per) as u64)));
    }
    let (offs, values) = list_parts(column, a)?;
    for (i, w) in offs.windows(2).enumerate() {
        if (w[1] - w[0]) as usize != d {
            return Err(Error::invalid(
                "column",
                format!(
                    "column '{column}' row {}: a dimension has {} elements where the feature's shape says {d}",
                    base + (i / rows_per) as u64,
                    w[1] - w[0]
                ),
            ));
        }
    }
    let n = a.len();
    let child = values.slice(offs[0] as usize, n * d);
    let child = fixed_lists(column, &child, rest, base, rows_per * d)?;
    let item = Arc::new(Field::new("item", child.data_type().clone(), true));
    Ok(Arc::new(FixedSizeListArray::try_new(item, d as i32, child, None)?))
}

/// The flat leaf values under nested FixedSizeLists (`len * product` elements).
fn flatten_fixed(a: &ArrayRef) -> ArrayRef {
    let mut cur = a.clone();
    while let DataType::FixedSizeList(_, d) = cur.data_type() {
        let l = cur.as_fixed_size_list();
        let start = l.offset() * *d as usize;
        cur = l.values().slice(start, l.len() * *d as usize);
    }
    cur
}

/// Nested lists with a dynamic first dimension and fixed `inner` ones -> the
/// variable_shape_tensor struct `{data: List<T>, shape: FixedSizeList<uint64, ndim>}`.
fn ragged_lists(column: &str, a: &ArrayRef, inner: &[usize], base: u64) -> Result<(FieldRef, ArrayRef)> {
    if a.null_count() > 0 {
        let i = (0..a.len()).find(|&i| a.is_null(i)).unwrap_or(0);
        return Err(Error::invalid("column", format!("column '{column}' has a null at row {}; zrecord stores hold no nulls", base + i as u64)));
    }
    let (offs, values) = list_parts(column, a)?;
    let n = a.len();
    let count = (offs[n] - offs[0]) as usize;
    let rows = values.slice(offs[0] as usize, count);
    // Every row's sub-arrays must have the fixed inner shape; each row has its own first extent.
    let fixed = fixed_lists(column, &rows, inner, base, 1)?;
    let leaf = flatten_fixed(&fixed);
    let per: usize = inner.iter().product();
    let mut data_offs = Vec::with_capacity(n + 1);
    let mut shapes = Vec::with_capacity(n * (inner.len() + 1));
    for w in offs.windows(2) {
        let start = (w[0] - offs[0]) as usize * per;
        data_offs.push(i32::try_from(start).map_err(|_| Error::TooManyValues { count: start as u64, limit: i32::MAX as u64 })?);
        shapes.push((w[1] - w[0]) as u64);
        shapes.extend(inner.iter().map(|&d| d as u64));
    }
    let end = count * per;
    data_offs.push(i32::try_from(end).map_err(|_| Error::TooManyValues { count: end as u64, limit: i32::MAX as u64 })?);
    let item = Arc::new(Field::new("item", leaf.data_type().clone(), true));
    let data = ListArray::try_new(item, OffsetBuffer::new(ScalarBuffer::from(data_offs)), leaf, None)?;
    let ndim = inner.len() + 1;
    let shape = FixedSizeListArray::try_new(Arc::new(Field::new("item", DataType::UInt64, false)), ndim as i32, Arc::new(UInt64Array::from(shapes)), None)?;
    variable_shape_column(column, data, shape)
}

/// The values buffer of a flat primitive array and the byte range its elements occupy (no copy).
fn primitive_bytes(a: &dyn Array, dtype: crate::DType) -> Option<(arrow_buffer::Buffer, std::ops::Range<usize>)> {
    let size = dtype.size();
    let d = a.to_data();
    let buf = d.buffers().first()?.clone();
    let range = d.offset() * size..(d.offset() + d.len()) * size;
    (range.end <= buf.len()).then_some((buf, range))
}

/// Add each record's stored bytes of `a` (a column of `layout`) to `samples`, until its budget
/// is spent. Layouts a dictionary does not help (bool) add nothing.
fn record_samples(layout: &RecordType, a: &ArrayRef, samples: &mut DictSamples) {
    let mut each = |b: &[u8]| samples.push(b);
    let dtype = &layout.dtype;
    match (&layout.layout, layout.logical) {
        (Layout::Dense { item_shape }, _) if *dtype != crate::DType::Bool => {
            let per = item_shape.iter().product::<usize>() * dtype.size();
            let leaf = flatten_fixed(a);
            if let Some((buf, range)) = primitive_bytes(leaf.as_ref(), *dtype) {
                for r in buf.as_slice()[range].chunks_exact(per.max(1)) {
                    if !each(r) {
                        break;
                    }
                }
            }
        }
        (Layout::Ragged { .. }, Logical::Tensor) if *dtype != crate::DType::Bool => {
            let list = match a.data_type() {
                DataType::Struct(_) => a.as_struct().column(0).clone(),
                _ => a.clone(),
            };
            let Ok((offs, values)) = list_parts("", &list) else { return };
            let size = dtype.size();
            let Some((buf, range)) = primitive_bytes(values.as_ref(), *dtype) else { return };
            let bytes = &buf.as_slice()[range];
            for w in offs.windows(2) {
                match bytes.get(w[0] as usize * size..w[1] as usize * size) {
                    Some(r) if each(r) => {}
                    _ => break,
                }
            }
        }
        (Layout::Ragged { .. }, Logical::Utf8 | Logical::Binary) => {
            let strings: Box<dyn Iterator<Item = &[u8]>> = match a.data_type() {
                DataType::Utf8 => Box::new(a.as_string::<i32>().iter().flatten().map(str::as_bytes)),
                DataType::LargeUtf8 => Box::new(a.as_string::<i64>().iter().flatten().map(str::as_bytes)),
                DataType::Utf8View => Box::new(a.as_string_view().iter().flatten().map(str::as_bytes)),
                DataType::Binary => Box::new(a.as_binary::<i32>().iter().flatten()),
                DataType::LargeBinary => Box::new(a.as_binary::<i64>().iter().flatten()),
                DataType::BinaryView => Box::new(a.as_binary_view().iter().flatten()),
                _ => return,
            };
            for b in strings {
                if !each(b) {
                    break;
                }
            }
        }
        _ => {}
    }
}

impl Converter {
    /// Plan the conversion of batches of `schema` into a new root at `dest` (which must not
    /// exist). Every column is checked here, before any data.
    pub fn new(dest: impl AsRef<Path>, schema: &Schema, options: ConvertOptions) -> Result<Converter> {
        let dest = dest.as_ref().to_path_buf();
        if crate::io::path_taken(&dest) {
            return Err(Error::AlreadyExists { path: dest });
        }
        if options.writer.codec == Codec::ZstdDict && options.writer.dictionary.is_none() && options.train_dict.is_none() {
            return Err(Error::InvalidCodec { reason: "codec zstd_dict needs a dictionary: pass one, or train_dict to train one per column".into() });
        }
        if let Some(size) = options.train_dict {
            if !(256..=(16 << 20)).contains(&size) {
                return Err(Error::invalid("train_dict", format!("dictionary size {size} bytes; expected 256 B ..= 16 MiB")));
            }
        }
        let features = options.features.clone().or_else(|| hf_features(schema));
        let wanted: Vec<(usize, &Field)> = match &options.columns {
            None => schema.fields().iter().enumerate().map(|(i, f)| (i, f.as_ref())).collect(),
            Some(cols) => {
                if cols.is_empty() {
                    return Err(Error::invalid("columns", "an empty column list; pass None for every column"));
                }
                cols.iter()
                    .map(|c| {
                        schema.index_of(c).map(|i| (i, schema.field(i))).map_err(|_| {
                            let have: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                            Error::invalid("columns", format!("no column '{c}' in the source (it has {have:?})"))
                        })
                    })
                    .collect::<Result<_>>()?
            }
        };
        if wanted.is_empty() {
            return Err(Error::invalid("source", "the source has no columns"));
        }
        let plans = wanted
            .iter()
            .map(|(i, f)| plan_column(f, *i, features.as_ref().and_then(|fs| fs.get(f.name())), &options))
            .collect::<Result<Vec<_>>>()?;
        let mut metadata = serde_json::Map::new();
        if let Some(fs) = &features {
            let mut hf = serde_json::Map::new();
            hf.insert("features".into(), fs.clone());
            let labels: serde_json::Map<String, Value> = plans
                .iter()
                .filter_map(|p| {
                    let f = fs.get(&p.name)?;
                    let f = if f.get("_type").and_then(|t| t.as_str()) == Some("ClassLabel") { f } else { f.get("feature")? };
                    (f.get("_type").and_then(|t| t.as_str()) == Some("ClassLabel")).then(|| (p.name.clone(), f.get("names").cloned().unwrap_or(Value::Null)))
                })
                .collect();
            if !labels.is_empty() {
                hf.insert("class_labels".into(), Value::Object(labels));
            }
            metadata.insert("huggingface".into(), Value::Object(hf));
        }
        for (k, v) in &options.metadata {
            match (metadata.get_mut(k), v) {
                (Some(Value::Object(have)), Value::Object(add)) => have.extend(add.clone()),
                _ => {
                    metadata.insert(k.clone(), v.clone());
                }
            }
        }
        Ok(Converter { dest, plans, options, state: State::Pending(Staged::default()), rows: 0, bytes: 0, metadata: Value::Object(metadata) })
    }

    /// Where the root is published.
    pub fn path(&self) -> &Path {
        &self.dest
    }

    /// Rows converted so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Record payload bytes converted so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn adapt(&mut self, batch: &RecordBatch) -> Result<Vec<(FieldRef, ArrayRef)>> {
        let base = self.rows;
        let schema = batch.schema();
        let mut out = Vec::with_capacity(self.plans.len());
        for p in &mut self.plans {
            let field = schema.fields().get(p.input).ok_or_else(|| Error::invalid("batch", format!("batch has no column {}", p.input)))?;
            if field.name() != &p.name {
                return Err(Error::invalid("batch", format!("batch column {} is '{}', the plan's is '{}'", p.input, field.name(), p.name)));
            }
            let a = batch.column(p.input);
            out.push(match &p.adapt {
                Adapt::Direct => (field.clone(), a.clone()),
                Adapt::Cast(dt) => {
                    let c = arrow_cast::cast(a, dt)?;
                    (Arc::new(Field::new(&p.name, dt.clone(), field.is_nullable())), c)
                }
                Adapt::FixedLists(shape) => {
                    let arr = fixed_lists(&p.name, a, shape, base, 1)?;
                    (Arc::new(Field::new(&p.name, arr.data_type().clone(), false)), arr)
                }
                Adapt::RaggedLists(inner) => ragged_lists(&p.name, a, inner, base)?,
                Adapt::Image(opts) => {
                    let r = image::decode_column(&p.name, a.as_ref(), opts, base, &mut p.channels)?;
                    if p.layout.is_none() {
                        p.layout = image_layout(opts, p.channels);
                    }
                    r
                }
            });
        }
        Ok(out)
    }

    /// Convert one batch (its schema must be the planned one).
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        if matches!(self.state, State::Done) {
            return Err(Error::Closed { what: "converter" });
        }
        if batch.num_rows() == 0 {
            return Ok(());
        }
        let r = self.push_inner(batch);
        if r.is_err() {
            // Streams may now differ in length: nothing of this conversion is published.
            self.state = State::Done;
        }
        r
    }

    fn push_inner(&mut self, batch: &RecordBatch) -> Result<()> {
        let cols = self.adapt(batch)?;
        let bytes: u64 = cols.iter().map(|(_, a)| a.to_data().get_slice_memory_size().unwrap_or(0) as u64).sum();
        self.rows += batch.num_rows() as u64;
        self.bytes += bytes;
        let (State::Pending(staged) | State::Writing(_, staged)) = &mut self.state else { return Err(Error::Closed { what: "converter" }) };
        staged.push(cols, bytes as usize);
        match &mut self.state {
            // Held back until there is enough input to train on (or at once without training).
            State::Pending(staged) if self.options.train_dict.is_none_or(|size| staged.bytes >= size * DICT_SAMPLE_FACTOR * self.plans.len()) => {
                self.start()?
            }
            State::Writing(w, staged) if staged.bytes >= COALESCE_BYTES => w.send(staged.take())?,
            _ => {}
        }
        Ok(())
    }

    /// Create the streams (training dictionaries on the held input first); what was held is
    /// written with the next flush.
    fn start(&mut self) -> Result<()> {
        let State::Pending(held) = std::mem::replace(&mut self.state, State::Done) else { return Ok(()) };
        let mut columns = Vec::with_capacity(self.plans.len());
        for (k, p) in self.plans.iter_mut().enumerate() {
            let layout = match (&p.layout, &p.adapt) {
                (Some(l), _) => l.clone(),
                // Resized images of native channel count with no data: assume RGB.
                (None, Adapt::Image(o)) => image_layout(o, Some(3)).ok_or_else(|| Error::invalid("column", "image layout"))?,
                (None, _) => return Err(Error::invalid("column", format!("column '{}' has no layout", p.name))),
            };
            let mut opts = self.options.writer.clone();
            if let Some(size) = self.options.train_dict {
                let mut samples = DictSamples::new(size * DICT_SAMPLE_FACTOR);
                for cols in &held.batches {
                    record_samples(&layout, &cols[k].1, &mut samples);
                }
                // A column too small (or too uniform) to train on is written with plain zstd.
                (opts.codec, opts.dictionary) = match samples.train(size) {
                    Ok(d) => (Codec::ZstdDict, Some(d)),
                    Err(_) => (Codec::Zstd, None),
                };
            }
            p.codec = opts.codec;
            p.layout = Some(layout.clone());
            columns.push((p.name.clone(), layout, opts));
        }
        let mut w = DatasetWriter::create_each(&self.dest, &columns)?;
        w.set_metadata(self.metadata.clone());
        let mut w = WriteBehind::start(w)?;
        let mut staged = held;
        if staged.bytes >= COALESCE_BYTES {
            w.send(staged.take())?;
        }
        self.state = State::Writing(w, staged);
        Ok(())
    }

    /// Publish the root: every stream complete, record counts equal, `dataset.json` last, one
    /// atomic rename. An empty input publishes an empty dataset.
    pub fn finish(mut self) -> Result<ConvertReport> {
        if matches!(self.state, State::Pending(..)) {
            self.start()?;
        }
        let State::Writing(mut behind, mut staged) = std::mem::replace(&mut self.state, State::Done) else {
            return Err(Error::Closed { what: "converter (an earlier batch failed: nothing was published)" });
        };
        behind.send(staged.take())?;
        let path = behind.join()?.finish()?;
        let streams = self.plans.into_iter().filter_map(|p| Some((p.name, p.layout?, p.codec))).collect();
        Ok(ConvertReport { path, rows: self.rows, bytes: self.bytes, streams })
    }
}

fn append(w: &mut DatasetWriter, cols: &[(FieldRef, ArrayRef)]) -> Result<()> {
    // Nullable: nulls are refused by the stream writers with the column and row, not here.
    let fields: Vec<FieldRef> = cols.iter().map(|(f, _)| Arc::new(f.as_ref().clone().with_nullable(true))).collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new_with_options(
        schema,
        cols.iter().map(|(_, a)| a.clone()).collect(),
        &arrow_array::RecordBatchOptions::new().with_row_count(cols.first().map(|(_, a)| a.len())),
    )?;
    w.append(&batch)
}

/// Convert every batch of `batches` (schema `schema`) into a new root at `dest`, calling
/// `progress(rows, bytes)` after each batch and stopping with an error when `cancel` returns
/// true (nothing is published then).
pub fn convert_batches(
    dest: impl AsRef<Path>,
    schema: &Schema,
    batches: impl Iterator<Item = Result<RecordBatch>>,
    options: ConvertOptions,
    progress: &mut dyn FnMut(u64, u64),
    cancel: &dyn Fn() -> bool,
) -> Result<ConvertReport> {
    let mut c = Converter::new(dest, schema, options)?;
    for b in batches {
        if cancel() {
            return Err(Error::invalid("convert", "interrupted: nothing was published"));
        }
        c.push(&b?)?;
        progress(c.rows(), c.bytes());
    }
    if cancel() {
        return Err(Error::invalid("convert", "interrupted: nothing was published"));
    }
    c.finish()
}
