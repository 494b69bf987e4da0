//! The Zrecord container: typed, immutable, ordered record stores.
//!
//! Writers ([`DenseWriter`], [`RaggedWriter`]) build a store once and publish it atomically;
//! stores ([`DenseStore`], [`RaggedStore`], or [`Store::open`] for either) memory-map it, and
//! views bound to an [`crate::memory::Allocator`] gather records into pooled memory.
//! The on-disk format is specified in [`format`].

/// `RecordSource` for a store type and `From<view>` for `SourceView`: the two store kinds
/// differ only in their layout and gather function.
macro_rules! store_source {
    ($store:ident, $view:ident, $kind:ident, $gather:ident) => {
        impl crate::store::RecordSource for $store {
            fn name(&self) -> String {
                self.core.path.display().to_string()
            }

            fn len(&self) -> u64 {
                self.core.len
            }

            fn record_type(&self) -> crate::store::RecordType {
                crate::store::RecordType { dtype: self.core.dtype, layout: {
                match self.core.kind {
                Kind::Dense => crate::store::Layout::Dense { item_shape: self.core.item_shape.clone() },
                Kind::Ragged => crate::store::Layout::Ragged { ndim: self.core.ndim },
                }
            }, logical: self.core.manifest.logical }
            }

            fn gather(&self, ids: Ids<'_>, allocator: &Allocator, options: &crate::store::ReadOptions) -> Result<crate::store::Batch> {
                $gather(&self.core, allocator, ids, options.verify_checksums, options.parallel).map(crate::store::Batch::$kind)
            }

            fn store(&self) -> Option<Store> {
                Some(Store::$kind(self.clone()))
            }
        }

        impl From<$view> for crate::store::SourceView {
            /// The generic view of the same store, allocator and options.
            fn from(v: $view) -> crate::store::SourceView {
                let options = crate::store::ReadOptions { verify_checksums: v.verify, parallel: v.parallel };
                crate::store::SourceView::new(Arc::new($store::from_core(v.core)), &v.allocator).with_options(options)
            }
        }
    };
}

pub mod codec;
mod concat;
mod crew;
pub mod dataset;
mod dense;
pub mod format;
mod gather;
mod ragged;
pub mod publish;
pub(crate) mod reader;
mod residency;
#[cfg(all(test, feature = "remote"))]
mod remote_tests;
pub mod selection;
mod source;
mod writer;

use std::path::Path;
use std::sync::Arc;

pub use codec::{Codec, DEFAULT_LEVEL};
pub use concat::ConcatSource;
pub use dense::{DenseStore, DenseView, DenseWriter};
pub use format::{Kind, Logical};
pub use gather::Ids;
pub use ragged::{RaggedStore, RaggedView, RaggedWriter};
pub use crate::io::{ByteSource, Hint, LocalFolder, Location, ReadMode};
pub use publish::Staging;
pub use dataset::{Dataset, Stream, StreamInfo};
pub use selection::{ChunkIds, Chunks, IdSet, Selection};
pub use source::{with_logical, Batch, Layout, ReadOptions, RecordSource, RecordType, SourceInfo, SourceView};
pub use writer::WriterOptions;

use crate::dtype::DType;
use crate::error::Result;
use crate::memory::{Allocator, RaggedBatch, Tensor};
use reader::StoreCore;

/// Sizes and counts of a store.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StoreStats {
    /// Records.
    pub record_count: u64,
    /// Decoded bytes of all records.
    pub raw_bytes: u64,
    /// Encoded bytes of all records.
    pub stored_bytes: u64,
    /// Bytes of all files on disk, manifest included.
    pub file_bytes: u64,
    /// Data shard files.
    pub data_shards: u32,
    /// zstd level (0 for raw).
    pub level: i32,
}

impl StoreStats {
    fn of(core: &StoreCore) -> StoreStats {
        let m = &core.manifest;
        let manifest_len = crate::io::stat(&core.path.join(format::MANIFEST)).map(|(len, _)| len).unwrap_or(0);
        StoreStats {
            record_count: m.record_count,
            raw_bytes: m.raw_bytes,
            stored_bytes: m.stored_bytes,
            file_bytes: m.files.iter().map(|f| f.bytes).sum::<u64>() + manifest_len,
            data_shards: m.data_shards,
            level: m.level,
        }
    }

    /// `raw_bytes / stored_bytes` (1.0 for an empty store).
    pub fn compression_ratio(&self) -> f64 {
        if self.stored_bytes == 0 {
            1.0
        } else {
            self.raw_bytes as f64 / self.stored_bytes as f64
        }
    }
}

/// A store of either kind, as found on disk.
#[derive(Clone, Debug)]
pub enum Store {
    /// Fixed item shape.
    Dense(DenseStore),
    /// Variable shapes.
    Ragged(RaggedStore),
}

impl From<DenseStore> for Store {
    fn from(s: DenseStore) -> Store {
        Store::Dense(s)
    }
}

impl From<RaggedStore> for Store {
    fn from(s: RaggedStore) -> Store {
        Store::Ragged(s)
    }
}

/// Whether a published store (a `manifest.json`) is at `path`: a folder or an object-store URL.
pub fn is_store(path: &Path) -> Result<bool> {
    crate::io::resolve(path, ReadMode::Mmap)?.exists(format::MANIFEST)
}

impl Store {
    /// Open whichever kind of store is at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Store> {
        Ok(Store::from_core(Arc::new(StoreCore::open(path.as_ref())?)))
    }

    /// Open the store at any [`Location`] (a local folder read with positional reads instead
    /// of a mapping, or the remote locations to come).
    pub fn open_at(location: &dyn Location) -> Result<Store> {
        Ok(Store::from_core(Arc::new(StoreCore::open_at(location)?)))
    }

    fn from_core(core: Arc<StoreCore>) -> Store {
        match core.kind {
            Kind::Dense => Store::Dense(DenseStore::from_core(core)),
            Kind::Ragged => Store::Ragged(RaggedStore::from_core(core)),
        }
    }

    /// The store as a record source.
    pub fn source(&self) -> Arc<dyn RecordSource> {
        match self {
            Store::Dense(s) => Arc::new(s.clone()),
            Store::Ragged(s) => Arc::new(s.clone()),
        }
    }

    /// What the records mean (from the manifest; `tensor` for version-1 stores).
    pub fn logical(&self) -> Logical {
        self.core().manifest.logical
    }

    /// Whether the store may hold empty records.
    pub fn allows_empty(&self) -> bool {
        self.core().manifest.allow_empty
    }

    /// The format version the store was written with.
    pub fn format_version(&self) -> u32 {
        self.core().manifest.version
    }

    fn core(&self) -> &StoreCore {
        match self {
            Store::Dense(s) => &s.core,
            Store::Ragged(s) => &s.core,
        }
    }

    /// Dense or ragged.
    pub fn kind(&self) -> Kind {
        self.core().kind
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.core().len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.core().dtype
    }

    /// Drop this process's mapped pages of the store's files (resident memory goes down; the
    /// next reads fault them back from the page cache or storage, same bytes). With `evict`
    /// also ask the kernel to drop the files from the page cache (cold-read benchmarks).
    pub fn release_pages(&self, evict: bool) {
        self.core().release_pages(evict);
    }

    /// Bound the store's mapped residency: once `bytes` have been gathered since the last
    /// release, its mapped pages are released ([`Store::release_pages`]), so a dataset larger
    /// than RAM does not fill the process's resident set with pages it read once. `None`
    /// (default): no bound, the kernel reclaims as it sees fit.
    pub fn set_max_mapped_bytes(&self, bytes: Option<u64>) {
        self.core().residency.max_mapped.store(bytes.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }

    /// True while gathers run in cold mode: they found the store's pages on storage, not in
    /// memory, and now request every page of a batch up front (see the README, "Cold data").
    pub fn is_cold(&self) -> bool {
        self.core().residency.cold.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Put gathers in (or out of) cold mode now instead of waiting for a slow gather to do it.
    pub fn set_cold(&self, cold: bool) {
        self.core().residency.decided.store(true, std::sync::atomic::Ordering::Relaxed);
        if cold {
            self.core().enter_cold();
        } else {
            self.core().residency.cold.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Times the mapped pages were released (explicitly or by the bound).
    pub fn page_releases(&self) -> u64 {
        self.core().residency.releases.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Records gathered through this opened store so far (every handle and view of it share
    /// the count): what a scan really read.
    pub fn records_read(&self) -> u64 {
        self.core().records_read.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Codec.
    pub fn codec(&self) -> Codec {
        self.core().codec
    }

    /// Dense item shape (empty for ragged).
    pub fn item_shape(&self) -> &[usize] {
        &self.core().item_shape
    }

    /// Record ndim (dense: item shape length).
    pub fn ndim(&self) -> usize {
        self.core().ndim
    }

    /// Folder path.
    pub fn path(&self) -> &Path {
        self.core().path()
    }

    /// Sizes and counts.
    pub fn stats(&self) -> StoreStats {
        StoreStats::of(self.core())
    }

    /// Check every byte; `progress(records_done)`.
    pub fn verify_with(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        self.core().verify(progress)
    }

    /// Check every byte.
    pub fn verify(&self) -> Result<u64> {
        self.core().verify(&|_| {})
    }
}

/// Anything a dictionary can be trained from.
pub trait DictSource {
    /// Up to `max_records` sample records, as decoded bytes.
    fn dict_samples(&self, max_records: usize) -> Result<Vec<Vec<u8>>>;
}

/// Evenly spaced ids over `0..n`, at most `k` of them.
fn spaced(n: u64, k: usize) -> Vec<u64> {
    let k = (k as u64).min(n);
    (0..k).map(|i| (i as u128 * n as u128 / k.max(1) as u128) as u64).collect()
}

impl DictSource for DenseView {
    fn dict_samples(&self, max_records: usize) -> Result<Vec<Vec<u8>>> {
        let ids = spaced(self.len(), max_records);
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1024) {
            out.extend(self.gather(chunk)?.dict_samples(usize::MAX)?);
        }
        Ok(out)
    }
}

impl DictSource for RaggedView {
    fn dict_samples(&self, max_records: usize) -> Result<Vec<Vec<u8>>> {
        let ids = spaced(self.len(), max_records);
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(1024) {
            out.extend(self.gather(chunk)?.dict_samples(usize::MAX)?);
        }
        Ok(out)
    }
}

impl DictSource for Store {
    fn dict_samples(&self, max_records: usize) -> Result<Vec<Vec<u8>>> {
        let a = Allocator::cpu(0);
        match self {
            Store::Dense(s) => s.bind(&a).dict_samples(max_records),
            Store::Ragged(s) => s.bind(&a).dict_samples(max_records),
        }
    }
}

impl DictSource for Tensor {
    /// A dense batch: each record along axis 0 is a sample.
    fn dict_samples(&self, max_records: usize) -> Result<Vec<Vec<u8>>> {
        let n = self.shape().first().copied().unwrap_or(0);
        if n == 0 {
            return Ok(Vec::new());
        }
        let rb = self.nbytes() / n;
        Ok(self.as_bytes().chunks(rb.max(1)).take(max_records).map(|c| c.to_vec()).collect())
    }
}

impl DictSource for RaggedBatch {
    fn dict_samples(&self, max_records: usize) -> Result<Vec<Vec<u8>>> {
        self.check()?;
        let cu = self.cu_seqlens_slice();
        let es = self.dtype().size();
        let v = self.values().as_bytes();
        Ok(cu.windows(2).take(max_records).map(|w| v[w[0] as usize * es..w[1] as usize * es].to_vec()).collect())
    }
}

impl DictSource for [Vec<u8>] {
    fn dict_samples(&self, max_records: usize) -> Result<Vec<Vec<u8>>> {
        Ok(self.iter().take(max_records).cloned().collect())
    }
}

/// Default dictionary size: 110 KiB, as the zstd command line uses.
pub const DEFAULT_DICT_SIZE: usize = 112_640;
/// Records sampled for training.
pub const DICT_SAMPLE_RECORDS: usize = 20_000;

/// Train a zstd dictionary of at most `max_size` bytes from a store, view, batch or samples.
pub fn train_dict<S: DictSource + ?Sized>(source: &S, max_size: usize) -> Result<Vec<u8>> {
    let samples = source.dict_samples(DICT_SAMPLE_RECORDS)?;
    codec::train_dict_from_samples(samples.iter().map(|s| s.as_slice()), max_size)
}
