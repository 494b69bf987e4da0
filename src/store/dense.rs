//! Dense stores: every record has one fixed item shape.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::memory::{Allocator, Tensor, TensorView};
use crate::store::codec::Codec;
use crate::store::format::{Kind, MAX_RECORD_BYTES};
use crate::store::gather::{gather_dense, Ids};
use crate::store::reader::StoreCore;
use crate::store::writer::{WriterCore, WriterOptions};
use crate::store::format::Logical;
use crate::store::{Store, StoreStats};

/// Builds a dense store. Records are appended in order; [`DenseWriter::finish`] publishes.
/// Dropping an unfinished writer removes everything it wrote.
///
/// ```
/// use zrecord::prelude::*;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("x");
/// let mut w = DenseWriter::create(&path, DType::Float32, &[2, 3], WriterOptions::with_codec(Codec::Zstd)).unwrap();
/// let data: Vec<f32> = (0..24).map(|i| i as f32).collect();
/// w.append_slice(&data).unwrap(); // 4 records of [2, 3]
/// w.finish().unwrap();
/// let store = DenseStore::open(&path).unwrap();
/// let view = store.bind(&Allocator::default());
/// let batch = view.gather(&[3, 0]).unwrap();
/// assert_eq!(batch.shape(), &[2, 2, 3]);
/// assert_eq!(batch.as_slice::<f32>().unwrap()[0], 18.0);
/// ```
pub struct DenseWriter {
    core: WriterCore,
    dtype: DType,
    item_shape: Vec<usize>,
    record_bytes: usize,
}

impl DenseWriter {
    /// Create a new dense store at `path` (which must not exist).
    pub fn create(path: impl AsRef<Path>, dtype: DType, item_shape: &[usize], options: WriterOptions) -> Result<DenseWriter> {
        let bytes = item_shape.iter().fold(dtype.size() as u128, |a, &d| a.saturating_mul(d as u128));
        if bytes > MAX_RECORD_BYTES as u128 {
            return Err(Error::RecordTooLarge { index: 0, bytes: bytes.min(u64::MAX as u128) as u64, limit: MAX_RECORD_BYTES });
        }
        let record_bytes = bytes as usize;
        let core = WriterCore::create(path.as_ref(), Kind::Dense, dtype, Some(item_shape.to_vec()), None, options)?;
        Ok(DenseWriter { core, dtype, item_shape: item_shape.to_vec(), record_bytes })
    }

    /// Append a batch `(n, *item_shape)`; returns once it is written. Validates dtype, shape
    /// and contiguity first: a rejected batch writes nothing.
    pub fn append(&mut self, batch: &TensorView<'_>) -> Result<()> {
        self.core.check_usable()?;
        if batch.dtype != self.dtype {
            return Err(Error::DtypeMismatch { expected: self.dtype, found: batch.dtype, what: "store vs input".into() });
        }
        if batch.shape.len() != self.item_shape.len() + 1 || batch.shape[1..] != self.item_shape[..] {
            return Err(Error::ShapeMismatch {
                expected: format!("(n, {})", self.item_shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
                found: format!("{:?}", batch.shape),
            });
        }
        batch.check("dense batch")?;
        let n = batch.shape[0];
        let rb = self.record_bytes;
        let bytes = batch.bytes;
        self.core.append_records(n, |i| (&bytes[i * rb..(i + 1) * rb], None))
    }

    /// Append typed elements whose count is a multiple of the item size.
    pub fn append_slice<T: Element>(&mut self, data: &[T]) -> Result<()> {
        let per = self.item_shape.iter().product::<usize>();
        if per == 0 || !data.len().is_multiple_of(per) {
            return Err(Error::ShapeMismatch {
                expected: format!("a multiple of {per} elements (item shape {:?})", self.item_shape),
                found: format!("{} elements", data.len()),
            });
        }
        let mut shape = vec![data.len() / per];
        shape.extend_from_slice(&self.item_shape);
        self.append(&TensorView::from_slice(data, &shape))
    }

    /// Report how many records of each later `append` are written (updated per write window)
    /// into `counter`, for a progress display on another thread; `None` stops reporting.
    pub fn set_progress(&mut self, counter: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>) {
        self.core.set_progress(counter);
    }

    /// Records appended so far.
    pub fn len(&self) -> u64 {
        self.core.count()
    }

    /// True before the first record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Destination path.
    pub fn path(&self) -> &Path {
        self.core.path()
    }

    /// Publish atomically (fsync, manifest last, rename) and return the store path.
    pub fn finish(self) -> Result<PathBuf> {
        self.core.finish()
    }
}

/// An opened dense store. Unbound: bind it to an allocator to read.
#[derive(Clone)]
pub struct DenseStore {
    pub(crate) core: Arc<StoreCore>,
}

impl std::fmt::Debug for DenseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DenseStore('{}', {} x {}{:?}, {})", self.core.path.display(), self.len(), self.dtype(), self.item_shape(), self.codec())
    }
}

impl DenseStore {
    /// Open and validate (O(1) in the record count).
    pub fn open(path: impl AsRef<Path>) -> Result<DenseStore> {
        let core = StoreCore::open(path.as_ref())?;
        if core.kind != Kind::Dense {
            return Err(Error::WrongKind { path: core.path.clone(), expected: "dense", found: core.kind.name() });
        }
        Ok(DenseStore { core: Arc::new(core) })
    }

    pub(crate) fn from_core(core: Arc<StoreCore>) -> DenseStore {
        DenseStore { core }
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.core.len
    }

    /// True when the store has no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.core.dtype
    }

    /// Shape of one record.
    pub fn item_shape(&self) -> &[usize] {
        &self.core.item_shape
    }

    /// Codec.
    pub fn codec(&self) -> Codec {
        self.core.codec
    }

    /// Folder path.
    pub fn path(&self) -> &Path {
        &self.core.path
    }

    /// Sizes and counts.
    pub fn stats(&self) -> StoreStats {
        StoreStats::of(&self.core)
    }

    /// What the records mean (from the manifest; `tensor` for version-1 stores).
    pub fn logical(&self) -> Logical {
        self.core.manifest.logical
    }

    /// The format version the store was written with.
    pub fn format_version(&self) -> u32 {
        self.core.manifest.version
    }

    /// The dictionary bytes of a `zstd_dict` store.
    pub fn dictionary(&self) -> Option<&[u8]> {
        self.core.dictionary.as_deref()
    }

    /// Check every byte: file checksums, record checksums, decodes.
    pub fn verify(&self) -> Result<u64> {
        self.core.verify(&|_| {})
    }

    /// Verify with a progress callback (records done so far).
    pub fn verify_with(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        self.core.verify(progress)
    }

    /// A placement view reading into `allocator`.
    pub fn bind(&self, allocator: &Allocator) -> DenseView {
        DenseView { core: self.core.clone(), allocator: allocator.clone(), verify: true, parallel: true }
    }
}

/// A dense store bound to an allocator: the index API.
#[derive(Clone)]
pub struct DenseView {
    core: Arc<StoreCore>,
    allocator: Allocator,
    verify: bool,
    parallel: bool,
}

impl DenseView {
    /// Number of records.
    pub fn len(&self) -> u64 {
        self.core.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.core.dtype
    }

    /// Shape of one record.
    pub fn item_shape(&self) -> &[usize] {
        &self.core.item_shape
    }

    /// Codec.
    pub fn codec(&self) -> Codec {
        self.core.codec
    }

    /// What the records mean (`tensor`, or `utf8` / `binary` byte strings).
    pub fn logical(&self) -> Logical {
        self.core.manifest.logical
    }

    /// The store this view reads.
    pub fn store(&self) -> DenseStore {
        DenseStore::from_core(self.core.clone())
    }

    /// The allocator batches are placed in.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// Whether reads check record checksums (default true): each record is checked the first
    /// time this opened store reads it, then trusted (stores are immutable), so later epochs
    /// read at full speed. Off skips even that first check; bounds are always checked, and
    /// [`DenseStore::verify`] checks every byte regardless.
    pub fn set_verify_checksums(&mut self, on: bool) {
        self.verify = on;
    }

    /// Whether reads check record checksums.
    pub fn verify_checksums(&self) -> bool {
        self.verify
    }

    /// Whether one gather may use the gather crew's threads (default true). Loaders with their own worker
    /// threads turn it off: their parallelism is across batches.
    pub fn set_parallel(&mut self, on: bool) {
        self.parallel = on;
    }

    /// One record, without the batch axis.
    pub fn get(&self, id: u64) -> Result<Tensor> {
        let t = gather_dense(&self.core, &self.allocator, Ids::List(&[id]), self.verify, self.parallel)?;
        let shape = self.core.item_shape.clone();
        t.sub(0, shape)
    }

    /// Records `ids` in that order (duplicates kept), stacked: `[ids.len(), *item_shape]`.
    pub fn gather(&self, ids: &[u64]) -> Result<Tensor> {
        gather_dense(&self.core, &self.allocator, Ids::List(ids), self.verify, self.parallel)
    }

    /// Gather by an [`Ids`] description (list or strided range).
    pub fn gather_ids(&self, ids: Ids<'_>) -> Result<Tensor> {
        gather_dense(&self.core, &self.allocator, ids, self.verify, self.parallel)
    }

    /// Records `range.start..range.end`.
    pub fn range(&self, range: Range<u64>) -> Result<Tensor> {
        if range.start > range.end || range.end > self.len() {
            return Err(Error::IndexOutOfRange { index: range.end as i128, len: self.len(), store: self.core.path.clone() });
        }
        self.gather_ids(Ids::Range { start: range.start, step: 1, len: (range.end - range.start) as usize })
    }

    /// Every record.
    pub fn read_all(&self) -> Result<Tensor> {
        self.range(0..self.len())
    }

    /// Iterate records in order.
    pub fn iter(&self) -> impl Iterator<Item = Result<Tensor>> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }
}

store_source!(DenseStore, DenseView, Dense, gather_dense);
