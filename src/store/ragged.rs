//! Ragged stores: records of one dtype and ndim whose shapes vary.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, RaggedInput};
use crate::store::codec::Codec;
use crate::store::format::{Kind, MAX_RECORD_BYTES};
use crate::store::gather::{gather_ragged, Ids};
use crate::store::reader::{StoreCore, MAX_NDIM};
use crate::store::writer::{WriterCore, WriterOptions};
use crate::store::format::Logical;
use crate::store::{Store, StoreStats};

/// Builds a ragged store from packed batches (`values`, `cu_seqlens`, `shapes`).
///
/// ```
/// use zrecord::prelude::*;
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("tokens");
/// let mut w = RaggedWriter::create(&path, DType::Int32, 1, WriterOptions::default()).unwrap();
/// let r0 = [1, 2, 3];
/// let r1 = [4];
/// let packed = PackedRagged::from_records(1, [(&r0[..], &[3usize][..]), (&r1[..], &[1usize][..])]).unwrap();
/// w.append(&packed.as_input()).unwrap();
/// w.finish().unwrap();
/// let view = RaggedStore::open(&path).unwrap().bind(&Allocator::default());
/// let b = view.gather(&[1, 0]).unwrap();
/// assert_eq!(b.cu_seqlens_slice(), &[0, 1, 4]);
/// assert_eq!(b.values().as_slice::<i32>().unwrap(), &[4, 1, 2, 3]);
/// ```
pub struct RaggedWriter {
    core: WriterCore,
    dtype: DType,
    ndim: usize,
}

impl RaggedWriter {
    /// Create a new ragged store at `path` (which must not exist); `ndim >= 1`.
    pub fn create(path: impl AsRef<Path>, dtype: DType, ndim: usize, options: WriterOptions) -> Result<RaggedWriter> {
        if ndim == 0 {
            return Err(Error::invalid("ndim", "ragged records need ndim >= 1; store scalars in a dense store with item_shape ()"));
        }
        if ndim > MAX_NDIM {
            return Err(Error::invalid("ndim", format!("{ndim} exceeds the maximum of {MAX_NDIM}")));
        }
        let core = WriterCore::create(path.as_ref(), Kind::Ragged, dtype, None, Some(ndim), options)?;
        Ok(RaggedWriter { core, dtype, ndim })
    }

    /// Append a packed batch; returns once it is written. The whole batch is validated first
    /// (a rejected batch writes nothing).
    pub fn append(&mut self, batch: &RaggedInput<'_>) -> Result<()> {
        self.core.check_usable()?;
        let valid = batch.validate_with(self.dtype, self.ndim, self.allows_empty())?;
        let (cu, shapes) = (&valid.cu_seqlens[..], &valid.shapes[..]);
        let esize = self.dtype.size();
        // Every record is at most 2 GiB (a store limit, beyond the packed-batch rules).
        for k in 0..valid.len {
            let bytes = (cu[k + 1] - cu[k]) as u64 * esize as u64;
            if bytes > MAX_RECORD_BYTES {
                return Err(Error::RecordTooLarge { index: k, bytes, limit: MAX_RECORD_BYTES });
            }
        }
        let n = valid.len;
        let v = &batch.values;
        let bytes = v.bytes;
        let nd = self.ndim;
        self.core.append_records(n, |i| {
            (&bytes[cu[i] as usize * esize..cu[i + 1] as usize * esize], Some(&shapes[i * nd..(i + 1) * nd]))
        })
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

    /// Whether empty records are accepted ([`WriterOptions::allow_empty`]).
    pub fn allows_empty(&self) -> bool {
        self.core.options().allow_empty
    }

    /// True before the first record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Destination path.
    pub fn path(&self) -> &Path {
        self.core.path()
    }

    /// Publish atomically and return the store path.
    pub fn finish(self) -> Result<PathBuf> {
        self.core.finish()
    }
}

/// An opened ragged store. Unbound: bind it to an allocator to read.
#[derive(Clone)]
pub struct RaggedStore {
    pub(crate) core: Arc<StoreCore>,
}

impl std::fmt::Debug for RaggedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RaggedStore('{}', {} x {} ndim {}, {})", self.core.path.display(), self.len(), self.dtype(), self.ndim(), self.codec())
    }
}

impl RaggedStore {
    /// Open and validate (O(1) in the record count).
    pub fn open(path: impl AsRef<Path>) -> Result<RaggedStore> {
        let core = StoreCore::open(path.as_ref())?;
        if core.kind != Kind::Ragged {
            return Err(Error::WrongKind { path: core.path.clone(), expected: "ragged", found: core.kind.name() });
        }
        Ok(RaggedStore { core: Arc::new(core) })
    }

    pub(crate) fn from_core(core: Arc<StoreCore>) -> RaggedStore {
        RaggedStore { core }
    }

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

    /// Dimensions of each record.
    pub fn ndim(&self) -> usize {
        self.core.ndim
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

    /// Check every byte.
    pub fn verify(&self) -> Result<u64> {
        self.core.verify(&|_| {})
    }

    /// Verify with a progress callback.
    pub fn verify_with(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        self.core.verify(progress)
    }

    /// A placement view reading into `allocator`.
    pub fn bind(&self, allocator: &Allocator) -> RaggedView {
        RaggedView { core: self.core.clone(), allocator: allocator.clone(), verify: true, parallel: true }
    }
}

/// A ragged store bound to an allocator.
#[derive(Clone)]
pub struct RaggedView {
    core: Arc<StoreCore>,
    allocator: Allocator,
    verify: bool,
    parallel: bool,
}

impl RaggedView {
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

    /// Dimensions of each record.
    pub fn ndim(&self) -> usize {
        self.core.ndim
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
    pub fn store(&self) -> RaggedStore {
        RaggedStore::from_core(self.core.clone())
    }

    /// The allocator batches are placed in.
    pub fn allocator(&self) -> &Allocator {
        &self.allocator
    }

    /// Whether reads check record checksums (default true; once per record per opened
    /// store, see [`crate::store::DenseView::set_verify_checksums`]).
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

    /// One record as a one-record batch.
    pub fn get(&self, id: u64) -> Result<RaggedBatch> {
        self.gather(&[id])
    }

    /// Records `ids` in order (duplicates kept), packed.
    pub fn gather(&self, ids: &[u64]) -> Result<RaggedBatch> {
        gather_ragged(&self.core, &self.allocator, Ids::List(ids), self.verify, self.parallel)
    }

    /// Gather by an [`Ids`] description.
    pub fn gather_ids(&self, ids: Ids<'_>) -> Result<RaggedBatch> {
        gather_ragged(&self.core, &self.allocator, ids, self.verify, self.parallel)
    }

    /// Records `range.start..range.end`.
    pub fn range(&self, range: Range<u64>) -> Result<RaggedBatch> {
        if range.start > range.end || range.end > self.len() {
            return Err(Error::IndexOutOfRange { index: range.end as i128, len: self.len(), store: self.core.path.clone() });
        }
        self.gather_ids(Ids::Range { start: range.start, step: 1, len: (range.end - range.start) as usize })
    }

    /// Every record.
    pub fn read_all(&self) -> Result<RaggedBatch> {
        self.range(0..self.len())
    }

    /// Iterate one-record batches in order.
    pub fn iter(&self) -> impl Iterator<Item = Result<RaggedBatch>> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }
}

store_source!(RaggedStore, RaggedView, Ragged, gather_ragged);
