//! Opening a store (manifest, index, shapes, data shards, dictionary: one step each, over a
//! [`Location`]'s byte sources), validated sizes, and per-record reads with bounds and checksum
//! checks. Nothing here is O(record count) except [`StoreCore::verify`].

use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;
use twox_hash::XxHash3_64;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::io::{ByteSource, Hint, Location};
use crate::store::writer::source_hash_hex;
use crate::store::residency::Residency;
use crate::store::codec::{Codec, DecodeContext, Decoder};
use crate::store::format::{self, IndexEntry, Kind, Manifest, ENTRY_BYTES, HEADER_BYTES};
use crate::store::writer::file_hash_hex;

/// Largest manifest accepted (a manifest lists at most 258 files: a few KiB).
/// Largest dictionary accepted.
pub(crate) const MAX_DICTIONARY_BYTES: u64 = 64 << 20;

/// Bytes of an upcoming record that [`StoreCore::prefetch`] asks for (larger records stream
/// well through the hardware prefetcher once started).
const PREFETCH_BYTES: usize = 16 << 10;
/// Records up to this size have every cache line prefetched, larger ones the first line of each
/// page.
const PREFETCH_ALL_LINES: usize = 4 << 10;

/// Hint the CPU to load a record's stored bytes: every line of a small record (its copy then
/// streams from cache instead of waiting for the hardware prefetcher to ramp up on each record);
/// of a larger one the first line of each page, up to [`PREFETCH_BYTES`].
#[inline(always)]
fn prefetch_record(src: &[u8]) {
    let len = src.len().min(PREFETCH_BYTES);
    let base = src.as_ptr() as usize;
    let step = if len <= PREFETCH_ALL_LINES { 64 } else { 4096 };
    let mut at = base;
    while at < base + len {
        prefetch_line(at as *const u8);
        at = (at / step + 1) * step;
    }
}

#[inline(always)]
pub(crate) fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no architectural effect,
    // and `p` points into a live mapping anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// `WILLNEED` for sorted byte ranges of `f`, ranges on the same or adjacent pages merged.
pub(crate) fn advise_merged(f: &StoreFile, ranges: impl Iterator<Item = (u64, u64)>) {
    const PAGE: u64 = 4096;
    let mut cur: Option<(u64, u64)> = None;
    for (a, z) in ranges {
        cur = match cur {
            Some((ca, cz)) if a <= cz + PAGE => Some((ca, cz.max(z))),
            Some((ca, cz)) => {
                f.source().advise(Hint::WillNeed, ca, cz - ca);
                Some((a, z))
            }
            None => Some((a, z)),
        };
    }
    if let Some((ca, cz)) = cur {
        f.source().advise(Hint::WillNeed, ca, cz - ca);
    }
}

/// Largest ragged ndim accepted (keeps shape rows on the stack).
pub(crate) const MAX_NDIM: usize = 32;

/// When a read checks the record checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// Never (bounds and sizes are still checked).
    Off,
    /// The first time the record is read from this opened store.
    FirstRead,
    /// Every time (`verify`).
    Always,
}

/// Records whose checksum already passed in this opened store. Reads verify a record the
/// first time it is gathered and trust it afterwards (a published store is immutable), so
/// repeated epochs read at unchecked speed while every record is still checked once. Memory
/// grows with the records read (one bit each, in 8 KiB pages), never at open.
pub(crate) struct VerifiedSet {
    pages: OnceLock<Box<[OnceLock<BitPage>]>>,
    len: u64,
}

const VERIFIED_PAGE_RECORDS: u64 = 1 << 16;

/// One bit per record of a page.
type BitPage = Box<[AtomicU64]>;

impl VerifiedSet {
    fn new(len: u64) -> Self {
        VerifiedSet { pages: OnceLock::new(), len }
    }

    fn page(&self, id: u64) -> Option<&[AtomicU64]> {
        self.pages.get()?.get((id / VERIFIED_PAGE_RECORDS) as usize)?.get().map(|p| &p[..])
    }

    #[inline]
    pub(crate) fn contains(&self, id: u64) -> bool {
        let bit = id % VERIFIED_PAGE_RECORDS;
        self.page(id).map(|p| p[(bit / 64) as usize].load(Ordering::Relaxed) & (1 << (bit % 64)) != 0).unwrap_or(false)
    }

    #[inline]
    pub(crate) fn insert(&self, id: u64) {
        let pages = self.pages.get_or_init(|| {
            (0..self.len.div_ceil(VERIFIED_PAGE_RECORDS)).map(|_| OnceLock::new()).collect()
        });
        let Some(slot) = pages.get((id / VERIFIED_PAGE_RECORDS) as usize) else { return };
        let page = slot.get_or_init(|| (0..VERIFIED_PAGE_RECORDS / 64).map(|_| AtomicU64::new(0)).collect());
        let bit = id % VERIFIED_PAGE_RECORDS;
        page[(bit / 64) as usize].fetch_or(1 << (bit % 64), Ordering::Relaxed);
    }
}

/// One file of an opened store: its byte source, and for a mapped source its bytes cached as
/// a slice at open, so the hot path reads them with no dynamic call (the seam costs nothing on
/// the mmap path).
/// Where a record's stored bytes are (see [`StoreCore::locate`]).
pub(crate) enum Located<'a> {
    /// In a mapped shard: its bounds-checked bytes.
    Mapped { entry: IndexEntry, src: &'a [u8] },
    /// Read with positional reads (an unmapped source, or cold mode).
    Unmapped { entry: IndexEntry },
}

pub(crate) struct StoreFile {
    src: Arc<dyn ByteSource>,
    mapped: Option<(std::ptr::NonNull<u8>, usize)>,
    /// The source's size (read once: the hot path bounds-checks against it).
    len: u64,
    /// The whole file in process memory, once [`StoreFile::copy_in_background`] has read it.
    copy: Arc<OnceLock<Box<[u8]>>>,
    copying: std::sync::atomic::AtomicBool,
}

// SAFETY: the cached pointer is to immutable bytes owned by `src` (which is Send + Sync);
// sharing or sending it is as safe as sharing `src` itself.
unsafe impl Send for StoreFile {}
// SAFETY: as above; nothing is ever written through the pointer.
unsafe impl Sync for StoreFile {}

impl StoreFile {
    fn new(src: Box<dyn ByteSource>) -> StoreFile {
        let src: Arc<dyn ByteSource> = Arc::from(src);
        let mapped = src.as_slice().map(|s| (std::ptr::NonNull::from(s).cast::<u8>(), s.len()));
        let len = src.len();
        StoreFile { src, mapped, len, copy: Arc::default(), copying: std::sync::atomic::AtomicBool::new(false) }
    }

    /// The mapped bytes, if the source is mapped.
    #[inline(always)]
    pub(crate) fn as_slice(&self) -> Option<&[u8]> {
        // SAFETY: `ByteSource::as_slice` promises the same bytes, valid and unchanged, for as
        // long as the source lives; `src` is owned here and never replaced, and the returned
        // slice borrows `self`, so it cannot outlive `src`.
        self.mapped.map(|(p, n)| unsafe { std::slice::from_raw_parts(p.as_ptr().cast_const(), n) })
    }

    /// The whole file as one slice: its copy in process memory when there is one, else the
    /// mapping (if mapped). The index and shapes files are read through this.
    #[inline(always)]
    pub(crate) fn bytes(&self) -> Option<&[u8]> {
        match self.copy.get() {
            Some(c) => Some(c),
            None => self.as_slice(),
        }
    }

    /// True once the file is held in process memory ([`StoreFile::copy_in_background`]).
    pub(crate) fn copied(&self) -> bool {
        self.copy.get().is_some()
    }

    /// Read the whole file into process memory on a thread of its own (once per opened store;
    /// nothing for files over `max` bytes), so its pages no longer come from storage: cold
    /// mode keeps a store's index (and shapes) this way, and a random gather then waits for
    /// one read per record instead of two dependent ones (the entry's page, then the record).
    /// Readers use the file as before until the copy is complete; a failed read leaves none.
    pub(crate) fn copy_in_background(&self, max: u64) {
        if self.len > max || self.copying.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (src, copy) = (self.src.clone(), self.copy.clone());
        // No thread (resources exhausted): no copy, nothing else changes.
        let _ = std::thread::Builder::new().name("zrecord-resident".into()).spawn(move || {
            if let Ok(bytes) = src.read_all_cold() {
                let _ = copy.set(bytes);
            }
        });
    }

    /// The byte source.
    pub(crate) fn source(&self) -> &dyn ByteSource {
        self.src.as_ref()
    }

    pub(crate) fn path(&self) -> &Path {
        self.src.path()
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    pub(crate) fn read_at(&self, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        self.src.read_at(offset, out)
    }
}

/// An opened store of either kind.
pub(crate) struct StoreCore {
    pub(crate) verified: VerifiedSet,
    pub(crate) path: PathBuf,
    pub(crate) manifest: Manifest,
    pub(crate) kind: Kind,
    pub(crate) dtype: DType,
    pub(crate) codec: Codec,
    pub(crate) item_shape: Vec<usize>,
    pub(crate) ndim: usize,
    pub(crate) len: u64,
    /// Dense: decoded bytes per record.
    pub(crate) record_bytes: usize,
    pub(crate) index: StoreFile,
    pub(crate) shapes: Option<StoreFile>,
    pub(crate) shards: Vec<StoreFile>,
    pub(crate) dictionary: Option<Vec<u8>>,
    /// Mixed into record checksum seeds (the dictionary's key when the manifest says so).
    pub(crate) seed_key: u64,
    pub(crate) decoder: Decoder,
    /// Records gathered through this opened store (a counter for tests and metrics).
    pub(crate) records_read: std::sync::atomic::AtomicU64,
    /// Cold-read mode and the mapped-residency bound (see [`Residency`]).
    pub(crate) residency: Residency,
    /// The files are on an object store: gathers stage their ranges first ([`StoreCore::stage`]).
    pub(crate) remote: bool,
}

/// What the manifest says, checked: the parts of a [`StoreCore`] that need no file but it.
struct Described {
    dtype: DType,
    codec: Codec,
    item_shape: Vec<usize>,
    ndim: usize,
    record_bytes: usize,
}

/// Step 1: read and check the manifest.
fn read_manifest(loc: &dyn Location) -> Result<Manifest> {
    let path = loc.path();
    let mpath = path.join(format::MANIFEST);
    match loc.read_small(format::MANIFEST, format::MAX_MANIFEST_BYTES)? {
        Some(bytes) => Manifest::from_bytes(&bytes, &mpath),
        None => Err(Error::NotFound { path: path.to_path_buf(), reason: "no manifest.json (not a published zrecord store)".into() }),
    }
}

/// Step 2: the dtype, codec and record geometry the manifest describes.
fn describe(manifest: &Manifest, mpath: &Path) -> Result<Described> {
    let bad = |reason: String| Error::corrupt(mpath, reason);
    let dtype = DType::from_name(&manifest.dtype).map_err(|_| bad(format!("unknown dtype '{}'", manifest.dtype)))?;
    let codec: Codec = manifest.codec.parse().map_err(|_| bad(format!("unknown codec '{}'", manifest.codec)))?;
    let s = manifest.data_shards as usize;
    if !(1..=255).contains(&s) {
        return Err(bad(format!("data_shards {s} outside 1..=255")));
    }
    let (item_shape, ndim, record_bytes) = match manifest.kind {
        Kind::Dense => {
            let shape: Vec<usize> = manifest.item_shape.as_ref().ok_or_else(|| bad("dense store without item_shape".into()))?
                .iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
            let rb = shape.iter().try_fold(dtype.size(), |a, &d| a.checked_mul(d))
                .filter(|&b| b as u64 <= format::MAX_RECORD_BYTES)
                .ok_or_else(|| bad(format!("item_shape {shape:?} exceeds the record size limit")))?;
            let nd = shape.len();
            (shape, nd, rb)
        }
        Kind::Ragged => {
            let nd = manifest.ndim.ok_or_else(|| bad("ragged store without ndim".into()))? as usize;
            if nd == 0 || nd > MAX_NDIM {
                return Err(bad(format!("ragged ndim {nd} outside 1..={MAX_NDIM}")));
            }
            (Vec::new(), nd, 0)
        }
    };
    Ok(Described { dtype, codec, item_shape, ndim, record_bytes })
}

/// The size the manifest lists for file `name`.
fn listed(manifest: &Manifest, mpath: &Path, name: &str) -> Result<u64> {
    manifest.file(name).map(|f| f.bytes).ok_or_else(|| Error::corrupt(mpath, format!("manifest does not list {name}")))
}

/// Step 3: every file's expected size (index sized for the record count, shape rows for the
/// count and ndim, shards as listed), in the order index, shapes (ragged), shards.
fn expected_files(manifest: &Manifest, mpath: &Path, ndim: usize) -> Result<Vec<(String, u64)>> {
    let len = manifest.record_count;
    let overflow = || Error::corrupt(mpath, "record count overflows");
    let want = (HEADER_BYTES as u64).checked_add(len.checked_mul(ENTRY_BYTES as u64).ok_or_else(overflow)?).ok_or_else(overflow)?;
    if listed(manifest, mpath, format::INDEX)? != want {
        return Err(Error::corrupt(mpath, format!("index size {} does not match {len} records", listed(manifest, mpath, format::INDEX)?)));
    }
    let mut files = vec![(manifest.stored_name(format::INDEX), want)];
    if manifest.kind == Kind::Ragged {
        let want = (len as u128) * (ndim as u128) * 8 + HEADER_BYTES as u128;
        if listed(manifest, mpath, format::SHAPES)? as u128 != want {
            return Err(Error::corrupt(mpath, format!("shapes size does not match {len} records of ndim {ndim}")));
        }
        files.push((manifest.stored_name(format::SHAPES), want as u64));
    }
    for i in 0..manifest.data_shards as usize {
        let name = format::shard_name(i);
        files.push((manifest.stored_name(&name), listed(manifest, mpath, &name)?));
    }
    Ok(files)
}

/// Step 4: open them all (a remote location opens them concurrently) and check each header.
#[allow(clippy::type_complexity)]
fn open_files(loc: &dyn Location, manifest: &Manifest, mpath: &Path, ndim: usize) -> Result<(Box<dyn ByteSource>, Option<Box<dyn ByteSource>>, Vec<Box<dyn ByteSource>>)> {
    let files = expected_files(manifest, mpath, ndim)?;
    let mut opened = loc.open_all(&files)?.into_iter();
    let mut next = || opened.next().ok_or_else(|| Error::corrupt(mpath, "a location opened fewer files than asked"));
    let index = next()?;
    let (entry, _) = format::read_header(&header_of(index.as_ref())?, format::INDEX_MAGIC, index.path())?;
    if entry as usize != ENTRY_BYTES {
        return Err(Error::corrupt(index.path(), format!("entry size {entry}, expected {ENTRY_BYTES}")));
    }
    let shapes = if manifest.kind == Kind::Ragged {
        let m = next()?;
        let (nd, _) = format::read_header(&header_of(m.as_ref())?, format::SHAPES_MAGIC, m.path())?;
        if nd as usize != ndim {
            return Err(Error::corrupt(m.path(), format!("header ndim {nd}, manifest ndim {ndim}")));
        }
        Some(m)
    } else {
        None
    };
    let mut shards = Vec::with_capacity(manifest.data_shards as usize);
    for i in 0..manifest.data_shards as usize {
        let m = next()?;
        let (id, _) = format::read_header(&header_of(m.as_ref())?, format::DATA_MAGIC, m.path())?;
        if id as usize != i {
            return Err(Error::corrupt(m.path(), format!("header says shard {id}")));
        }
        shards.push(m);
    }
    Ok((index, shapes, shards))
}

/// Step 6 (zstd_dict): the dictionary, small, checked in full.
fn read_dictionary(loc: &dyn Location, manifest: &Manifest, mpath: &Path, codec: Codec) -> Result<Option<Vec<u8>>> {
    if codec != Codec::ZstdDict {
        return Ok(None);
    }
    let dpath = loc.path().join(manifest.stored_name(format::DICTIONARY));
    let entry = manifest.file(format::DICTIONARY).ok_or_else(|| Error::corrupt(mpath, "zstd_dict store lists no dictionary"))?;
    let d = loc
        .read_small(&manifest.stored_name(format::DICTIONARY), MAX_DICTIONARY_BYTES)?
        .ok_or_else(|| Error::corrupt(&dpath, "dictionary file is missing"))?;
    if d.len() as u64 != entry.bytes || file_hash_hex(&d) != entry.xxh3 {
        return Err(Error::corrupt(&dpath, "dictionary size or checksum mismatch"));
    }
    Ok(Some(d))
}

/// The first [`HEADER_BYTES`] of a file (shorter files give what they have, and fail the header check).
fn header_of(src: &dyn ByteSource) -> Result<Vec<u8>> {
    let n = src.len().min(HEADER_BYTES as u64) as usize;
    src.read_vec(0, n)
}

/// Read `N` bytes at `at` of a file: the mapped slice when there is one, else a positional read.
#[inline(always)]
fn read_fixed<const N: usize>(f: &StoreFile, at: usize) -> Result<[u8; N]> {
    match f.bytes() {
        Some(b) => b.get(at..at + N).and_then(|b| b.try_into().ok()).ok_or_else(|| Error::corrupt(f.path(), format!("read at {at} past the end"))),
        None => f.source().read_array::<N>(at as u64),
    }
}

impl StoreCore {
    /// Open the store in a local folder, memory-mapped.
    pub(crate) fn open(path: &Path) -> Result<StoreCore> {
        let loc = crate::io::resolve(path, crate::io::ReadMode::Mmap)?;
        if !loc.is_remote() && !loc.path().is_dir() {
            return Err(Error::NotFound { path: loc.path().to_path_buf(), reason: "no such folder".into() });
        }
        StoreCore::open_at(&*loc)
    }

    /// Open the store at any [`Location`].
    pub(crate) fn open_at(loc: &dyn Location) -> Result<StoreCore> {
        let path = loc.path().to_path_buf();
        let mpath = path.join(format::MANIFEST);
        let manifest = read_manifest(loc)?;
        let d = describe(&manifest, &mpath)?;
        let (index, shapes, shards) = open_files(loc, &manifest, &mpath, d.ndim)?;
        // A dense store's data files must be able to produce all its records: raw records are
        // stored as they are, and zstd expands at most MAX_ZSTD_EXPANSION-fold. So no gather can
        // ask for more memory than the files could produce.
        if manifest.kind == Kind::Dense {
            let held: u128 = shards.iter().map(|s| s.len().saturating_sub(HEADER_BYTES as u64) as u128).sum();
            let can_produce = if d.codec == Codec::Raw { held } else { held * crate::store::codec::MAX_ZSTD_EXPANSION as u128 };
            if d.record_bytes as u128 * manifest.record_count as u128 > can_produce {
                return Err(Error::corrupt(
                    &mpath,
                    format!("{} {} records of {} bytes cannot come from data files of {held} bytes", manifest.record_count, d.codec, d.record_bytes),
                ));
            }
        }
        let dictionary = read_dictionary(loc, &manifest, &mpath, d.codec)?;
        let decoder = Decoder::new(d.codec, dictionary.as_deref(), &path)?;
        let len = manifest.record_count;
        let remote = loc.is_remote();
        let seed_key = if manifest.checksums_bind_dictionary { format::dictionary_key(dictionary.as_deref()) } else { 0 };
        Ok(StoreCore {
            seed_key,
            verified: VerifiedSet::new(len),
            records_read: std::sync::atomic::AtomicU64::new(0),
            residency: Residency::default(),
            remote,
            path,
            kind: manifest.kind,
            dtype: d.dtype,
            codec: d.codec,
            item_shape: d.item_shape,
            ndim: d.ndim,
            len,
            record_bytes: d.record_bytes,
            manifest,
            index: StoreFile::new(index),
            shapes: shapes.map(StoreFile::new),
            shards: shards.into_iter().map(StoreFile::new).collect(),
            dictionary,
            decoder,
        })
    }

    /// Index entry of record `id` (`id < len`).
    #[inline]
    pub(crate) fn entry(&self, id: u64) -> Result<IndexEntry> {
        let at = HEADER_BYTES + id as usize * ENTRY_BYTES;
        Ok(IndexEntry::decode(&read_fixed::<ENTRY_BYTES>(&self.index, at)?))
    }

    /// Shape row of ragged record `id` into `out[..ndim]`; returns its element count.
    #[inline]
    pub(crate) fn shape_into(&self, id: u64, out: &mut [u64; MAX_NDIM]) -> Result<u64> {
        let Some(sh) = &self.shapes else { return Ok(0) };
        let at = HEADER_BYTES + id as usize * self.ndim * 8;
        let mut n: u64 = 1;
        let mut row_buf = [MaybeUninit::<u8>::uninit(); MAX_NDIM * 8];
        let row: &[u8] = match sh.bytes() {
            Some(b) => b.get(at..at + self.ndim * 8).ok_or_else(|| Error::corrupt(sh.path(), format!("shape row of record {id} past the end")))?,
            None => {
                let buf = &mut row_buf[..self.ndim * 8];
                sh.read_at(at as u64, buf)?;
                // SAFETY: `read_at` succeeded, so every byte of `buf` was written.
                unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), buf.len()) }
            }
        };
        for (d, c) in out.iter_mut().zip(row.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            *d = u64::from_le_bytes(b);
            n = n.checked_mul(*d).ok_or_else(|| Error::corrupt(sh.path(), format!("shape of record {id} overflows")))?;
        }
        if (n == 0 && !self.manifest.allow_empty) || n.saturating_mul(self.dtype.size() as u64) > format::MAX_RECORD_BYTES {
            return Err(Error::corrupt(sh.path(), format!("record {id} has impossible shape {:?}", &out[..self.ndim])));
        }
        Ok(n)
    }

    /// Check record `id`'s stored bytes against its index checksum.
    #[inline]
    fn check_record(&self, id: u64, shape: Option<&[u64]>, stored: &[u8], e: &IndexEntry, file: &StoreFile) -> Result<()> {
        if XxHash3_64::oneshot_with_seed(format::record_seed(id, shape) ^ self.seed_key, stored) != e.checksum {
            return Err(Error::corrupt(file.path(), format!("checksum mismatch for record {id} (data or index damaged)")));
        }
        Ok(())
    }

    fn shard(&self, id: u64, e: &IndexEntry) -> Result<&StoreFile> {
        self.shards.get(e.shard as usize).ok_or_else(|| {
            Error::corrupt(self.index.path(), format!("record {id} names shard {} of {}", e.shard, self.shards.len()))
        })
    }

    #[cold]
    fn out_of_shard(&self, id: u64, e: &IndexEntry, shard: &StoreFile) -> Error {
        Error::corrupt(
            self.index.path(),
            format!("record {id} points at bytes {}+{} beyond {} ({} bytes)", e.offset, e.stored_len, shard.path().display(), shard.len()),
        )
    }

    /// Every file of the store.
    pub(crate) fn files(&self) -> impl Iterator<Item = &StoreFile> {
        std::iter::once(&self.index).chain(self.shapes.iter()).chain(self.shards.iter())
    }


    /// For a store on an object store, fetch everything a gather of `ids` reads, before it
    /// reads: the index pages (and shape rows) of the ids, then the records' byte ranges, each
    /// step's requests coalesced and in flight together (see `io::object::preload`). The
    /// ranges stay pinned in the store's cache until the returned guard drops. Local stores:
    /// nothing.
    pub(crate) fn stage(&self, ids: crate::store::Ids<'_>) -> Result<Option<crate::io::Prepared>> {
        if !self.remote || ids.is_empty() {
            return Ok(None);
        }
        let n = ids.len();
        fn rows<'a>(f: &'a StoreFile, ids: crate::store::Ids<'_>, row: usize, out: &mut Vec<(&'a dyn ByteSource, u64, u64)>) {
            let src = f.source();
            out.extend((0..ids.len()).map(|k| {
                let a = (HEADER_BYTES as u64).saturating_add(ids.get(k).saturating_mul(row as u64));
                (src, a, a.saturating_add(row as u64))
            }));
        }
        let mut meta: Vec<(&dyn ByteSource, u64, u64)> = Vec::new();
        rows(&self.index, ids, ENTRY_BYTES, &mut meta);
        if let Some(sh) = &self.shapes {
            rows(sh, ids, self.ndim * 8, &mut meta);
        }
        let pages = crate::io::prepare(meta, true)?;
        let mut data: Vec<(&dyn ByteSource, u64, u64)> = Vec::with_capacity(n);
        for k in 0..n {
            let id = ids.get(k);
            let e = self.entry(id)?;
            let shard = self.shard(id, &e)?;
            data.push((shard.source(), e.offset, e.offset.saturating_add(e.stored_len as u64)));
        }
        let mut staged = crate::io::prepare(data, false)?.unwrap_or_default();
        if let Some(p) = pages {
            staged.absorb(p);
        }
        Ok(Some(staged))
    }

    /// Hint the CPU to start loading record `id` (mapped shards only): every line of a small
    /// record, else the first line of each page it spans (up to [`PREFETCH_BYTES`]), which
    /// starts the TLB walk and the hardware prefetcher early, so a random gather of small records overlaps memory latency instead of
    /// paying it serially.
    #[inline]
    pub(crate) fn prefetch(&self, id: u64) {
        if id >= self.len {
            return;
        }
        let Some(index) = self.index.bytes() else { return };
        let at = HEADER_BYTES + id as usize * ENTRY_BYTES;
        let Some(raw) = index.get(at..at + ENTRY_BYTES) else { return };
        let e = IndexEntry::decode(raw);
        let Some(bytes) = self.shards.get(e.shard as usize).and_then(|s| s.as_slice()) else { return };
        let start = e.offset as usize;
        if let Some(src) = start.checked_add(e.stored_len as usize).and_then(|end| bytes.get(start..end)) {
            prefetch_record(src);
        }
    }

    /// Hint the CPU to load the index entry of record `id`.
    #[inline]
    pub(crate) fn prefetch_entry(&self, id: u64) {
        if id < self.len {
            if let Some(index) = self.index.bytes() {
                let at = HEADER_BYTES + id as usize * ENTRY_BYTES;
                if let Some(p) = index.get(at..) {
                    prefetch_line(p.as_ptr());
                }
            }
        }
    }

    /// Decode record `id` into `out`, whose length is its decoded size.
    #[inline]
    pub(crate) fn read_into(
        &self,
        ctx: &mut DecodeContext<'_>,
        id: u64,
        shape: Option<&[u64]>,
        out: &mut [MaybeUninit<u8>],
        check: Check,
    ) -> Result<()> {
        let at = self.locate(id)?;
        self.read_located_into(ctx, id, shape, out, check, &at)
    }

    fn must_verify(&self, id: u64, check: Check) -> bool {
        match check {
            Check::Off => false,
            Check::FirstRead => !self.verified.contains(id),
            Check::Always => true,
        }
    }

    /// Where record `id`'s stored bytes are: a bounds-checked slice of its mapped shard, or
    /// (shard not mapped, or cold mode) only its index entry. Gathers locate a run of records
    /// first and copy them after, so the index reads overlap instead of each one stalling the
    /// copy of the record before it.
    #[inline]
    pub(crate) fn locate(&self, id: u64) -> Result<Located<'_>> {
        let entry = self.entry(id)?;
        let shard = self.shard(id, &entry)?;
        // Cold mode reads with positional reads, waiting for storage once per record instead
        // of page-faulting through the mapping page by page.
        let mapped = if self.residency.cold.load(Ordering::Relaxed) { None } else { shard.as_slice() };
        let Some(bytes) = mapped else { return Ok(Located::Unmapped { entry }) };
        let start = entry.offset as usize;
        let src = match start.checked_add(entry.stored_len as usize) {
            Some(end) if start >= HEADER_BYTES => bytes.get(start..end),
            _ => None,
        };
        match src {
            Some(src) => Ok(Located::Mapped { entry, src }),
            None => Err(self.out_of_shard(id, &entry, shard)),
        }
    }

    /// Hint the CPU to load a located record's bytes (see [`StoreCore::prefetch`]).
    #[inline]
    pub(crate) fn prefetch_located(&self, at: &Located<'_>) {
        if let Located::Mapped { src, .. } = at {
            prefetch_record(src);
        }
    }

    /// [`StoreCore::read_into`] for a record already located.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn read_located_into(
        &self,
        ctx: &mut DecodeContext<'_>,
        id: u64,
        shape: Option<&[u64]>,
        out: &mut [MaybeUninit<u8>],
        check: Check,
        at: &Located<'_>,
    ) -> Result<()> {
        match at {
            Located::Mapped { entry, src } => self.read_located(ctx, id, shape, out, check, entry, src),
            Located::Unmapped { entry } => {
                let verify = self.must_verify(id, check);
                let shard = self.shard(id, entry)?;
                self.read_unmapped(ctx, id, shape, out, entry, shard, verify)?;
                if verify {
                    self.verified.insert(id);
                }
                Ok(())
            }
        }
    }

    /// Mapped fast path: copy/decode straight from the mapping (`src` is bounds-checked).
    #[inline]
    #[allow(clippy::too_many_arguments)]
    fn read_located(
        &self,
        ctx: &mut DecodeContext<'_>,
        id: u64,
        shape: Option<&[u64]>,
        out: &mut [MaybeUninit<u8>],
        check: Check,
        e: &IndexEntry,
        src: &[u8],
    ) -> Result<()> {
        let verify = self.must_verify(id, check);
        let shard = self.shard(id, e)?;
        if self.codec == Codec::Raw && verify {
            // Copy first, then hash the copy while it is hot in L1/L2: one trip to memory
            // instead of two.
            ctx.decode_into(src, out, shard.path())?;
            // SAFETY: `decode_into` succeeded, so all of `out` was just written.
            let written = unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<u8>(), out.len()) };
            self.check_record(id, shape, written, e, shard)?;
        } else {
            if verify {
                self.check_record(id, shape, src, e, shard)?;
            }
            ctx.decode_into(src, out, shard.path())?;
        }
        if verify {
            self.verified.insert(id);
        }
        Ok(())
    }

    /// `read_into` for a source that is not mapped (or a mapped one in cold mode): positional reads (raw records straight into
    /// their output slot, compressed ones through the context's scratch buffer). Out of line so
    /// the mapped fast path stays small enough to inline into the gather loops.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn read_unmapped(
        &self,
        ctx: &mut DecodeContext<'_>,
        id: u64,
        shape: Option<&[u64]>,
        out: &mut [MaybeUninit<u8>],
        e: &IndexEntry,
        shard: &StoreFile,
        verify: bool,
    ) -> Result<()> {
        let (start, len) = (e.offset as usize, e.stored_len as usize);
        if start < HEADER_BYTES || start.checked_add(len).is_none_or(|end| end as u64 > shard.len()) {
            return Err(self.out_of_shard(id, e, shard));
        }
        if self.codec == Codec::Raw {
            if len != out.len() {
                return Err(Error::corrupt(shard.path(), format!("raw record {id} is {len} bytes, expected {}", out.len())));
            }
            shard.source().read_at_cold(e.offset, out)?;
            if verify {
                // SAFETY: `read_at` succeeded, so all of `out` was just written.
                let written = unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<u8>(), out.len()) };
                self.check_record(id, shape, written, e, shard)?;
            }
            return Ok(());
        }
        let mut scratch = std::mem::take(&mut ctx.scratch);
        scratch.clear();
        scratch.reserve(len);
        let r = shard.source().read_at_cold(e.offset, &mut scratch.spare_capacity_mut()[..len]).and_then(|()| {
            // SAFETY: `read_at` succeeded: `len` bytes were written.
            unsafe { scratch.set_len(len) };
            if verify {
                self.check_record(id, shape, &scratch, e, shard)?;
            }
            ctx.decode_into(&scratch, out, shard.path())
        });
        ctx.scratch = scratch;
        r
    }

    /// The store folder.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Check every file's whole checksum and every record's checksum and decode.
    /// `progress(records_done)` is called as records complete.
    /// Fail if any mapped file was cut short under this open store (a contained SIGBUS):
    /// the bytes just read may be zeros standing in for lost pages.
    #[inline]
    pub(crate) fn check_files_intact(&self) -> Result<()> {
        for f in self.files() {
            if f.source().lost_pages() != 0 {
                return Err(Error::corrupt(
                    f.path(),
                    "the file was truncated while the store was open (pages of its mapping vanished); stores must not be modified in place — reopen it or restore the file",
                ));
            }
        }
        Ok(())
    }

    /// Files whose size on disk no longer matches the manifest (truncated or extended in
    /// place after the store was opened).
    fn check_sizes_on_disk(&self) -> Result<()> {
        let files = std::iter::once(&self.index).chain(self.shapes.iter()).chain(self.shards.iter());
        for f in files {
            let name = f.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if let (Some(want), Ok((len, _))) = (self.manifest.file(&name), crate::io::stat(f.path())) {
                if len != want.bytes {
                    return Err(Error::corrupt(f.path(), format!("file is now {len} bytes, manifest says {} (modified in place after open)", want.bytes)));
                }
            }
        }
        Ok(())
    }

    pub(crate) fn verify(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        self.check_sizes_on_disk()?;
        // Whole files, in parallel.
        let mut files: Vec<&dyn ByteSource> = vec![self.index.source()];
        files.extend(self.shapes.iter().map(|s| s.source()));
        files.extend(self.shards.iter().map(|s| s.source()));
        files.par_iter().try_for_each(|m| {
            let name = m.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let want = self.manifest.file(&name).map(|f| f.xxh3.as_str()).unwrap_or("");
            if source_hash_hex(*m)? != want {
                return Err(Error::corrupt(m.path(), "file checksum mismatch"));
            }
            Ok(())
        })?;
        // Records, in parallel chunks; each decoded into a scratch buffer.
        const CHUNK: u64 = 4096;
        let chunks = self.len.div_ceil(CHUNK);
        let done = std::sync::atomic::AtomicU64::new(0);
        (0..chunks).into_par_iter().try_for_each(|c| -> Result<()> {
            let mut ctx = self.decoder.context();
            let mut buf: Vec<MaybeUninit<u8>> = Vec::new();
            let mut shape = [0u64; MAX_NDIM];
            let hi = ((c + 1) * CHUNK).min(self.len);
            // Remote stores: the chunk's index pages and records in large concurrent requests.
            let _staged = self.stage(crate::store::Ids::Range { start: c * CHUNK, step: 1, len: (hi - c * CHUNK) as usize })?;
            for id in c * CHUNK..hi {
                let (n_bytes, sh) = match self.kind {
                    Kind::Dense => (self.record_bytes, None),
                    Kind::Ragged => {
                        let n = self.shape_into(id, &mut shape)?;
                        (n as usize * self.dtype.size(), Some(&shape[..self.ndim]))
                    }
                };
                buf.resize(n_bytes, MaybeUninit::uninit());
                self.read_into(&mut ctx, id, sh, &mut buf[..n_bytes], Check::Always)?;
            }
            let d = done.fetch_add(hi - c * CHUNK, std::sync::atomic::Ordering::Relaxed) + (hi - c * CHUNK);
            progress(d);
            Ok(())
        })?;
        self.check_files_intact()?;
        Ok(self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verified_set_marks_records_once() {
        let v = VerifiedSet::new(200_000);
        assert!(v.pages.get().is_none(), "nothing allocated before the first read");
        for id in [0u64, 63, 64, 65_535, 65_536, 199_999] {
            assert!(!v.contains(id));
            v.insert(id);
            assert!(v.contains(id));
        }
        assert!(!v.contains(1) && !v.contains(65_537));
        v.insert(300_000); // beyond the last page: ignored, no panic
        assert!(!v.contains(300_000));
        let pages = v.pages.get().unwrap();
        assert_eq!(pages.len(), 4);
        assert!(pages[2].get().is_none(), "untouched pages stay unallocated");
    }
}
