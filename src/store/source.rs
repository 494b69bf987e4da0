//! The record-source contract: anything that can gather ids into one pooled batch.
//!
//! Dense and ragged stores implement [`RecordSource`]; so will Zarr crop lists, remote stores and
//! distributed stores, each in its own module. The loader, the dataset [`Scanner`]
//! (crate::arrow::Scanner), SQL and the Python views consume `Arc<dyn RecordSource>` and never
//! match on kinds: a new kind of data is one implementation of this trait plus a thin Python
//! class.
//!
//! ```
//! use std::sync::Arc;
//! use zrecord::prelude::*;
//! use zrecord::store::{Batch, ReadOptions, RecordSource, RecordType, SourceView};
//!
//! /// Record `i` is the int64 scalar `i * i`: a source computed on the fly.
//! #[derive(Debug)]
//! struct Squares(u64);
//!
//! impl RecordSource for Squares {
//!     fn name(&self) -> String { "squares".into() }
//!     fn len(&self) -> u64 { self.0 }
//!     fn record_type(&self) -> RecordType { RecordType::dense(DType::Int64, vec![]) }
//!     fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _: &ReadOptions) -> Result<Batch> {
//!         ids.validate(self.0, std::path::Path::new("squares"))?;
//!         let v: Vec<i64> = (0..ids.len()).map(|k| (ids.get(k) * ids.get(k)) as i64).collect();
//!         Ok(Batch::Dense(Tensor::from_slice(allocator, &v, &[v.len()])?))
//!     }
//! }
//!
//! let view = SourceView::new(Arc::new(Squares(10)), &Allocator::default());
//! let b = view.gather(&[3, 9]).unwrap();
//! assert_eq!(b.as_dense().unwrap().as_slice::<i64>().unwrap(), &[9, 81]);
//! ```

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, Tensor};
use crate::store::format::Logical;
use crate::store::gather::Ids;
use crate::store::Store;

/// What a source's records are: one description for every kind of source, serialisable (it
/// travels in dataset manifests, distributed shard announcements and `info` output).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct RecordType {
    /// Element type.
    pub dtype: DType,
    /// Record shape.
    pub layout: Layout,
    /// What the records mean.
    #[serde(default)]
    pub logical: Logical,
}

impl RecordType {
    /// Dense records of `item_shape` tensors.
    pub fn dense(dtype: DType, item_shape: Vec<usize>) -> RecordType {
        RecordType { dtype, layout: Layout::Dense { item_shape }, logical: Logical::Tensor }
    }

    /// Ragged records of `ndim` dimensions.
    pub fn ragged(dtype: DType, ndim: usize) -> RecordType {
        RecordType { dtype, layout: Layout::Ragged { ndim }, logical: Logical::Tensor }
    }

    /// The same records meaning `logical` (strings, bytes).
    pub fn with_logical(self, logical: Logical) -> RecordType {
        RecordType { logical, ..self }
    }
}

impl std::fmt::Display for RecordType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.logical {
            Logical::Tensor => write!(f, "{} {}", self.dtype, self.layout),
            other => write!(f, "{other} ({} {})", self.dtype, self.layout),
        }
    }
}

/// A source's name, length and record type ([`RecordSource::info`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceInfo {
    /// Path, URL or description.
    pub name: String,
    /// Number of records.
    pub len: u64,
    /// What the records are.
    #[serde(flatten)]
    pub record_type: RecordType,
}

/// The shape of a source's records.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Layout {
    /// Every record has this shape (`[]`: scalars).
    Dense {
        /// The record shape.
        item_shape: Vec<usize>,
    },
    /// Records have variable shapes of this many dimensions.
    Ragged {
        /// Dimensions of every record (>= 1).
        ndim: usize,
    },
}

impl Layout {
    /// `"dense"` / `"ragged"`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Layout::Dense { .. } => "dense",
            Layout::Ragged { .. } => "ragged",
        }
    }

    /// Record dimensions.
    pub fn ndim(&self) -> usize {
        match self {
            Layout::Dense { item_shape } => item_shape.len(),
            Layout::Ragged { ndim } => *ndim,
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Layout::Dense { item_shape } => write!(f, "dense {item_shape:?}"),
            Layout::Ragged { ndim } => write!(f, "ragged ndim {ndim}"),
        }
    }
}

/// How a gather reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadOptions {
    /// Check record checksums (a store checks each record the first time it reads it, then
    /// trusts it). Default true.
    pub verify_checksums: bool,
    /// Let one gather use the gather crew's threads. Default true; loaders with their own
    /// worker threads turn it off (their parallelism is across batches).
    pub parallel: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions { verify_checksums: true, parallel: true }
    }
}

/// One gathered batch of a source: a dense tensor `[n, *item_shape]` or packed ragged records.
#[derive(Clone, Debug)]
pub enum Batch {
    /// `[n, *item_shape]`.
    Dense(Tensor),
    /// Packed records (values, cu_seqlens, shapes).
    Ragged(RaggedBatch),
}

impl Batch {
    /// Records in the batch.
    pub fn len(&self) -> usize {
        match self {
            Batch::Dense(t) => t.shape().first().copied().unwrap_or(0),
            Batch::Ragged(b) => b.len(),
        }
    }

    /// True when the batch holds no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        match self {
            Batch::Dense(t) => t.dtype(),
            Batch::Ragged(b) => b.dtype(),
        }
    }

    /// Bytes of record data (ragged: the packed values).
    pub fn nbytes(&self) -> usize {
        match self {
            Batch::Dense(t) => t.nbytes(),
            Batch::Ragged(b) => b.values().nbytes(),
        }
    }

    /// The dense tensor, if dense.
    pub fn as_dense(&self) -> Option<&Tensor> {
        match self {
            Batch::Dense(t) => Some(t),
            Batch::Ragged(_) => None,
        }
    }

    /// The ragged batch, if ragged.
    pub fn as_ragged(&self) -> Option<&RaggedBatch> {
        match self {
            Batch::Ragged(b) => Some(b),
            Batch::Dense(_) => None,
        }
    }

    /// The dense tensor, or a [`Error::WrongKind`] naming `source`.
    pub fn into_dense(self, source: &str) -> Result<Tensor> {
        match self {
            Batch::Dense(t) => Ok(t),
            Batch::Ragged(_) => Err(Error::WrongKind { path: source.into(), expected: "dense", found: "ragged" }),
        }
    }

    /// The ragged batch, or a [`Error::WrongKind`] naming `source`.
    pub fn into_ragged(self, source: &str) -> Result<RaggedBatch> {
        match self {
            Batch::Ragged(b) => Ok(b),
            Batch::Dense(_) => Err(Error::WrongKind { path: source.into(), expected: "ragged", found: "dense" }),
        }
    }
}

/// Anything that gathers records by id `0..len` into pooled batches.
///
/// Contract: `gather` returns records in the order of `ids` (duplicates kept), validates every
/// id before reading (an out-of-range id is [`Error::IndexOutOfRange`]), places the batch in
/// `allocator`, and returns [`Batch::Dense`] for [`Layout::Dense`] sources (shape
/// `[ids.len(), *item_shape]`, element type `dtype()`) and [`Batch::Ragged`] for ragged ones
/// (`ndim` columns of shapes). The loader and the scanner rely on it.
pub trait RecordSource: Send + Sync + std::fmt::Debug {
    /// A name for messages: a path, a URL or a description.
    fn name(&self) -> String;

    /// Number of records.
    fn len(&self) -> u64;

    /// True when there is no record.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What the records are: element type, shape, meaning (one description for every source;
    /// `dtype`, `layout` and `logical` read it).
    fn record_type(&self) -> RecordType;

    /// Element type.
    fn dtype(&self) -> DType {
        self.record_type().dtype
    }

    /// Record shape.
    fn layout(&self) -> Layout {
        self.record_type().layout
    }

    /// What the records mean (`utf8` / `binary` for uint8 ndim-1 ragged byte strings).
    fn logical(&self) -> Logical {
        self.record_type().logical
    }

    /// Name, length and record type in one value (what `zrec info` and Python's `info()`
    /// print; serialisable).
    fn info(&self) -> SourceInfo {
        SourceInfo { name: self.name(), len: self.len(), record_type: self.record_type() }
    }

    /// Records `ids`, in order, into `allocator`.
    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, options: &ReadOptions) -> Result<Batch>;

    /// The local zrecord store behind this source, if there is one (for statistics, codec,
    /// verification and dictionary training).
    fn store(&self) -> Option<Store> {
        None
    }
}

/// A record source bound to an allocator and read options: what the loader, the scanner and
/// the Python views gather through.
#[derive(Clone, Debug)]
pub struct SourceView {
    source: Arc<dyn RecordSource>,
    allocator: Allocator,
    options: ReadOptions,
    /// The source's dtype and layout, read once: every batch is checked against them.
    dtype: DType,
    layout: Layout,
}

impl SourceView {
    /// `source` reading into `allocator` with default options.
    pub fn new(source: Arc<dyn RecordSource>, allocator: &Allocator) -> SourceView {
        let (dtype, layout) = (source.dtype(), source.layout());
        SourceView { source, allocator: allocator.clone(), options: ReadOptions::default(), dtype, layout }
    }

    /// The same view with `options`.
    pub fn with_options(mut self, options: ReadOptions) -> SourceView {
        self.options = options;
        self
    }

    /// The source.
    pub fn source(&self) -> &Arc<dyn RecordSource> {
        &self.source
    }

    /// The allocator batches are placed in.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// The read options.
    pub fn options(&self) -> ReadOptions {
        self.options
    }

    /// Set whether one gather may use the gather crew's threads.
    pub fn set_parallel(&mut self, on: bool) {
        self.options.parallel = on;
    }

    /// Records in the source.
    pub fn len(&self) -> u64 {
        self.source.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records `ids`, in order.
    pub fn gather(&self, ids: &[u64]) -> Result<Batch> {
        self.gather_ids(Ids::List(ids))
    }

    /// Records described by `ids` (a list or a strided range). Checks the source kept the
    /// contract (batch kind, length, dtype), so a faulty source is an error, not a wrong column.
    pub fn gather_ids(&self, ids: Ids<'_>) -> Result<Batch> {
        let b = self.source.gather(ids, &self.allocator, &self.options)?;
        let layout_ok = match (&b, &self.layout) {
            (Batch::Dense(t), Layout::Dense { item_shape }) => t.shape().get(1..) == Some(&item_shape[..]),
            (Batch::Ragged(r), Layout::Ragged { ndim }) => r.ndim() == *ndim,
            _ => false,
        };
        if !layout_ok || b.len() != ids.len() || b.dtype() != self.dtype {
            return Err(Error::invalid(
                "record source",
                format!(
                    "source '{}' ({} {}) returned a batch of {} {} records for {} ids",
                    self.source.name(),
                    self.dtype,
                    self.layout,
                    b.len(),
                    b.dtype(),
                    ids.len()
                ),
            ));
        }
        Ok(b)
    }
}

/// A source read with another logical type (a version-1 store that `dataset.json` marks as
/// strings): everything else is the inner source's.
#[derive(Debug)]
struct WithLogical {
    inner: Arc<dyn RecordSource>,
    logical: Logical,
}

impl RecordSource for WithLogical {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn len(&self) -> u64 {
        self.inner.len()
    }

    fn record_type(&self) -> crate::store::RecordType {
        crate::store::RecordType { dtype: self.inner.dtype(), layout: self.inner.layout(), logical: self.logical }
    }

    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, options: &ReadOptions) -> Result<Batch> {
        self.inner.gather(ids, allocator, options)
    }

    fn store(&self) -> Option<Store> {
        self.inner.store()
    }
}

/// `source` read as `logical` (byte strings need uint8 ndim-1 ragged records).
pub fn with_logical(source: Arc<dyn RecordSource>, logical: Logical) -> Result<Arc<dyn RecordSource>> {
    if source.logical() == logical {
        return Ok(source);
    }
    if logical.is_bytes() && !(source.dtype() == DType::UInt8 && source.layout() == (Layout::Ragged { ndim: 1 })) {
        return Err(Error::invalid("logical", format!("source '{}' ({} {}) cannot be read as {logical}", source.name(), source.dtype(), source.layout())));
    }
    Ok(Arc::new(WithLogical { inner: source, logical }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_types_describe_and_serialise() {
        let d = RecordType::dense(DType::Float16, vec![3, 4]);
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, r#"{"dtype":"float16","layout":{"kind":"dense","item_shape":[3,4]},"logical":"tensor"}"#);
        assert_eq!(serde_json::from_str::<RecordType>(&json).unwrap(), d);
        let s = RecordType { logical: Logical::Utf8, ..RecordType::ragged(DType::UInt8, 1) };
        assert_eq!(serde_json::from_str::<RecordType>(&serde_json::to_string(&s).unwrap()).unwrap(), s);
        assert_eq!(s.to_string(), "utf8 (uint8 ragged ndim 1)");
        assert_eq!(d.to_string(), "float16 dense [3, 4]");
        // `logical` defaults to tensor; an unknown dtype is an error naming it.
        assert_eq!(serde_json::from_str::<RecordType>(r#"{"dtype":"int8","layout":{"kind":"ragged","ndim":2}}"#).unwrap(), RecordType::ragged(DType::Int8, 2));
        let e = serde_json::from_str::<RecordType>(r#"{"dtype":"int9","layout":{"kind":"ragged","ndim":2}}"#).unwrap_err();
        assert!(e.to_string().contains("int9"), "{e}");
        // A source's accessors all read its record type; info() carries it with name and length.
        #[derive(Debug)]
        struct Fixed;
        impl RecordSource for Fixed {
            fn name(&self) -> String {
                "fixed".into()
            }
            fn len(&self) -> u64 {
                7
            }
            fn record_type(&self) -> RecordType {
                RecordType { logical: Logical::Binary, ..RecordType::ragged(DType::UInt8, 1) }
            }
            fn gather(&self, _: Ids<'_>, _: &Allocator, _: &ReadOptions) -> Result<Batch> {
                Err(Error::Internal("not gathered in this test".into()))
            }
        }
        assert_eq!((Fixed.dtype(), Fixed.layout(), Fixed.logical()), (DType::UInt8, Layout::Ragged { ndim: 1 }, Logical::Binary));
        let info = Fixed.info();
        assert_eq!((info.name.as_str(), info.len), ("fixed", 7));
        let v: serde_json::Value = serde_json::to_value(&info).unwrap();
        assert_eq!(v["dtype"], "uint8");
        assert_eq!(v["logical"], "binary");
        assert_eq!(v["len"], 7);
    }
}
