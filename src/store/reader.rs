//! Opening a store: manifest, memory-mapped index / shapes / data shards, validated sizes, and
//! per-record reads with bounds and checksum checks. Nothing here is O(record count) except
//! [`StoreCore::verify`].

use std::fs::File;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use memmap2::Mmap;
use rayon::prelude::*;
use twox_hash::XxHash3_64;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::store::codec::{Codec, DecodeContext, Decoder};
use crate::store::format::{self, IndexEntry, Kind, Manifest, ENTRY_BYTES, HEADER_BYTES};
use crate::store::writer::file_hash_hex;

/// Bytes of an upcoming record that [`StoreCore::prefetch`] asks for (larger records stream
/// well through the hardware prefetcher once started).
const PREFETCH_BYTES: usize = 16 << 10;

#[inline(always)]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults and has no architectural effect,
    // and `p` points into a live mapping anyway.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Largest ragged ndim accepted (keeps shape rows on the stack).
pub(crate) const MAX_NDIM: usize = 32;

/// A read-only mapping of a whole file (empty files have no mapping).
pub(crate) struct Mapped {
    pub(crate) path: PathBuf,
    map: Option<Mmap>,
}

impl Mapped {
    fn open(path: PathBuf, expected_len: u64) -> Result<Mapped> {
        let f = File::open(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::corrupt(&path, "file listed in the manifest is missing"),
            _ => Error::io(&path, e),
        })?;
        let len = f.metadata().map_err(|e| Error::io(&path, e))?.len();
        if len != expected_len {
            return Err(Error::corrupt(&path, format!("file is {len} bytes, manifest says {expected_len} (truncated or extended)")));
        }
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the file is opened read-only and stores are immutable once published; a
            // concurrent external modification would violate the store contract (documented),
            // and every read below is bounds-checked against the mapping length.
            Some(unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&path, e))?)
        };
        Ok(Mapped { path, map })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

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
    pub(crate) index: Mapped,
    pub(crate) shapes: Option<Mapped>,
    pub(crate) shards: Vec<Mapped>,
    pub(crate) dictionary: Option<Vec<u8>>,
    pub(crate) decoder: Decoder,
    /// Records gathered through this opened store (a counter for tests and metrics).
    pub(crate) records_read: std::sync::atomic::AtomicU64,
}

impl StoreCore {
    pub(crate) fn open(path: &Path) -> Result<StoreCore> {
        let path = path.to_path_buf();
        if !path.is_dir() {
            return Err(Error::NotFound { path, reason: "no such folder".into() });
        }
        let mpath = path.join(format::MANIFEST);
        let mbytes = match std::fs::read(&mpath) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound { path, reason: "no manifest.json (not a published zrecord store)".into() })
            }
            Err(e) => return Err(Error::io(&mpath, e)),
        };
        let manifest = Manifest::from_bytes(&mbytes, &mpath)?;
        let bad = |reason: String| Error::corrupt(&mpath, reason);
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
        let len = manifest.record_count;
        let listed = |name: &str| -> Result<u64> {
            manifest.file(name).map(|f| f.bytes).ok_or_else(|| bad(format!("manifest does not list {name}")))
        };
        // Index.
        let want_index = (HEADER_BYTES as u64).checked_add(len.checked_mul(ENTRY_BYTES as u64).ok_or_else(|| bad("record count overflows".into()))?)
            .ok_or_else(|| bad("record count overflows".into()))?;
        if listed(format::INDEX)? != want_index {
            return Err(bad(format!("index size {} does not match {len} records", listed(format::INDEX)?)));
        }
        let index = Mapped::open(path.join(format::INDEX), want_index)?;
        let (entry, _) = format::read_header(index.bytes(), format::INDEX_MAGIC, &index.path)?;
        if entry as usize != ENTRY_BYTES {
            return Err(Error::corrupt(&index.path, format!("entry size {entry}, expected {ENTRY_BYTES}")));
        }
        // Shapes.
        let shapes = match manifest.kind {
            Kind::Ragged => {
                let want = (len as u128) * (ndim as u128) * 8 + HEADER_BYTES as u128;
                if listed(format::SHAPES)? as u128 != want {
                    return Err(bad(format!("shapes size does not match {len} records of ndim {ndim}")));
                }
                let m = Mapped::open(path.join(format::SHAPES), want as u64)?;
                let (nd, _) = format::read_header(m.bytes(), format::SHAPES_MAGIC, &m.path)?;
                if nd as usize != ndim {
                    return Err(Error::corrupt(&m.path, format!("header ndim {nd}, manifest ndim {ndim}")));
                }
                Some(m)
            }
            Kind::Dense => None,
        };
        // Shards.
        let mut shards = Vec::with_capacity(s);
        for i in 0..s {
            let name = format::shard_name(i);
            let m = Mapped::open(path.join(&name), listed(&name)?)?;
            let (id, _) = format::read_header(m.bytes(), format::DATA_MAGIC, &m.path)?;
            if id as usize != i {
                return Err(Error::corrupt(&m.path, format!("header says shard {id}")));
            }
            shards.push(m);
        }
        // Dictionary: small, checked in full.
        let dictionary = match codec {
            Codec::ZstdDict => {
                let dpath = path.join(format::DICTIONARY);
                let entry = manifest.file(format::DICTIONARY).ok_or_else(|| bad("zstd_dict store lists no dictionary".into()))?;
                let d = std::fs::read(&dpath).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => Error::corrupt(&dpath, "dictionary file is missing"),
                    _ => Error::io(&dpath, e),
                })?;
                if d.len() as u64 != entry.bytes || file_hash_hex(&d) != entry.xxh3 {
                    return Err(Error::corrupt(&dpath, "dictionary size or checksum mismatch"));
                }
                Some(d)
            }
            _ => None,
        };
        let decoder = Decoder::new(codec, dictionary.as_deref(), &path)?;
        Ok(StoreCore {
            verified: VerifiedSet::new(len),
            records_read: std::sync::atomic::AtomicU64::new(0),
            path,
            kind: manifest.kind,
            manifest,
            dtype,
            codec,
            item_shape,
            ndim,
            len,
            record_bytes,
            index,
            shapes,
            shards,
            dictionary,
            decoder,
        })
    }

    /// Index entry of record `id` (`id < len`).
    #[inline]
    pub(crate) fn entry(&self, id: u64) -> IndexEntry {
        let at = HEADER_BYTES + id as usize * ENTRY_BYTES;
        IndexEntry::decode(&self.index.bytes()[at..at + ENTRY_BYTES])
    }

    /// Shape row of ragged record `id` into `out[..ndim]`; returns its element count.
    #[inline]
    pub(crate) fn shape_into(&self, id: u64, out: &mut [u64; MAX_NDIM]) -> Result<u64> {
        let Some(sh) = &self.shapes else { return Ok(0) };
        let at = HEADER_BYTES + id as usize * self.ndim * 8;
        let row = &sh.bytes()[at..at + self.ndim * 8];
        let mut n: u64 = 1;
        for (d, c) in out.iter_mut().zip(row.chunks_exact(8)) {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            *d = u64::from_le_bytes(b);
            n = n.checked_mul(*d).ok_or_else(|| Error::corrupt(&sh.path, format!("shape of record {id} overflows")))?;
        }
        if n == 0 || n.saturating_mul(self.dtype.size() as u64) > format::MAX_RECORD_BYTES {
            return Err(Error::corrupt(&sh.path, format!("record {id} has impossible shape {:?}", &out[..self.ndim])));
        }
        Ok(n)
    }

    /// The stored bytes of record `id`, bounds-checked and (if `verify`) checksum-checked.
    #[inline]
    pub(crate) fn stored(&self, id: u64, e: &IndexEntry, shape: Option<&[u64]>, verify: bool) -> Result<&[u8]> {
        let shard = self.shards.get(e.shard as usize).ok_or_else(|| {
            Error::corrupt(&self.index.path, format!("record {id} names shard {} of {}", e.shard, self.shards.len()))
        })?;
        let bytes = shard.bytes();
        let start = e.offset as usize;
        let end = start.checked_add(e.stored_len as usize);
        let src = match end {
            Some(end) if start >= HEADER_BYTES && end <= bytes.len() => &bytes[start..end],
            _ => {
                return Err(Error::corrupt(
                    &self.index.path,
                    format!("record {id} points at bytes {start}+{} beyond {} ({} bytes)", e.stored_len, shard.path.display(), bytes.len()),
                ))
            }
        };
        if verify && XxHash3_64::oneshot_with_seed(format::record_seed(id, shape), src) != e.checksum {
            return Err(Error::corrupt(&shard.path, format!("checksum mismatch for record {id} (data or index damaged)")));
        }
        Ok(src)
    }

    pub(crate) fn shard_path(&self, e: &IndexEntry) -> &Path {
        self.shards.get(e.shard as usize).map(|s| s.path.as_path()).unwrap_or(&self.path)
    }

    /// Hint the CPU to start loading record `id`: the first line of each page it spans (up to
    /// [`PREFETCH_BYTES`]), which starts the TLB walk and the hardware prefetcher early, so a
    /// random gather of small records overlaps memory latency instead of paying it serially.
    #[inline]
    pub(crate) fn prefetch(&self, id: u64) {
        if id >= self.len {
            return;
        }
        let e = self.entry(id);
        let Some(shard) = self.shards.get(e.shard as usize) else { return };
        let bytes = shard.bytes();
        let start = e.offset as usize;
        let len = (e.stored_len as usize).min(PREFETCH_BYTES);
        if len == 0 || start.saturating_add(len) > bytes.len() {
            return;
        }
        let base = bytes.as_ptr() as usize;
        let mut at = start;
        while at < start + len {
            prefetch_line((base + at) as *const u8);
            at = (at / 4096 + 1) * 4096;
        }
    }

    /// Hint the CPU to load the index entry of record `id`.
    #[inline]
    pub(crate) fn prefetch_entry(&self, id: u64) {
        if id < self.len {
            let at = HEADER_BYTES + id as usize * ENTRY_BYTES;
            prefetch_line(self.index.bytes()[at..].as_ptr());
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
        let e = self.entry(id);
        let verify = match check {
            Check::Off => false,
            Check::FirstRead => !self.verified.contains(id),
            Check::Always => true,
        };
        if self.codec == Codec::Raw && verify {
            // Copy first, then hash the copy while it is hot in L1/L2: one trip to memory
            // instead of two.
            let src = self.stored(id, &e, shape, false)?;
            ctx.decode_into(src, out, self.shard_path(&e))?;
            // SAFETY: `decode_into` succeeded, so all of `out` was just written.
            let written = unsafe { std::slice::from_raw_parts(out.as_ptr().cast::<u8>(), out.len()) };
            if XxHash3_64::oneshot_with_seed(format::record_seed(id, shape), written) != e.checksum {
                return Err(Error::corrupt(self.shard_path(&e), format!("checksum mismatch for record {id} (data or index damaged)")));
            }
            self.verified.insert(id);
            return Ok(());
        }
        let src = self.stored(id, &e, shape, verify)?;
        ctx.decode_into(src, out, self.shard_path(&e))?;
        if verify {
            self.verified.insert(id);
        }
        Ok(())
    }

    /// The store folder.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Check every file's whole checksum and every record's checksum and decode.
    /// `progress(records_done)` is called as records complete.
    pub(crate) fn verify(&self, progress: &(dyn Fn(u64) + Sync)) -> Result<u64> {
        // Whole files, in parallel.
        let mut files: Vec<&Mapped> = vec![&self.index];
        files.extend(self.shapes.iter());
        files.extend(self.shards.iter());
        files.par_iter().try_for_each(|m| {
            let name = m.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let want = self.manifest.file(&name).map(|f| f.xxh3.as_str()).unwrap_or("");
            if file_hash_hex(m.bytes()) != want {
                return Err(Error::corrupt(&m.path, "file checksum mismatch"));
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
