//! The shared writer machinery: a hidden temp folder beside the destination, `data_shards`
//! parallel workers each owning one data file, a streamed index, and atomic publish.
//!
//! Appends are processed in bounded windows (at most [`WINDOW_BYTES_PER_SHARD`] input bytes
//! or [`WINDOW_RECORDS_PER_SHARD`] records per shard), so memory stays bounded whatever the
//! size of one append. Each window is split into `data_shards` contiguous parts of about equal
//! bytes, encoded and written in parallel, and its index entries are then appended in order.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};


use rayon::prelude::*;
use std::hash::Hasher;

use twox_hash::XxHash3_64;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::store::codec::{Codec, Encoder, DEFAULT_LEVEL};
use crate::store::format::{self, FileEntry, IndexEntry, Kind, Logical, Manifest, ENTRY_BYTES};
use crate::store::publish::Staging;

/// Input bytes per shard per window.
pub const WINDOW_BYTES_PER_SHARD: usize = 16 << 20;
/// Records per shard per window.
pub const WINDOW_RECORDS_PER_SHARD: usize = 1 << 16;

/// Options of [`crate::store::DenseWriter`] and [`crate::store::RaggedWriter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriterOptions {
    /// Record codec.
    pub codec: Codec,
    /// zstd level (ignored by `raw`); default 3.
    pub level: i32,
    /// Parallel writers / data files, 1..=255; default 4.
    pub data_shards: usize,
    /// Dictionary bytes, required by (and only allowed with) `zstd_dict`.
    pub dictionary: Option<Vec<u8>>,
    /// What the records mean (recorded in the manifest); `utf8` / `binary` need uint8 ndim-1
    /// ragged stores. Default `tensor`.
    pub logical: Logical,
    /// Ragged stores: accept empty records (zero extents). Default false: an empty record is
    /// an input error, as in format version 1.
    pub allow_empty: bool,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions { codec: Codec::Raw, level: DEFAULT_LEVEL, data_shards: 4, dictionary: None, logical: Logical::Tensor, allow_empty: false }
    }
}

impl WriterOptions {
    /// Default options with the given codec.
    pub fn with_codec(codec: Codec) -> Self {
        WriterOptions { codec, ..Default::default() }
    }

    /// `zstd_dict` with the given dictionary.
    pub fn zstd_dict(dictionary: Vec<u8>) -> Self {
        WriterOptions { codec: Codec::ZstdDict, dictionary: Some(dictionary), ..Default::default() }
    }

    /// Set the zstd level.
    pub fn level(mut self, level: i32) -> Self {
        self.level = level;
        self
    }

    /// Set the number of data shards.
    pub fn data_shards(mut self, n: usize) -> Self {
        self.data_shards = n;
        self
    }

    /// Set the logical type recorded in the manifest.
    pub fn logical(mut self, logical: Logical) -> Self {
        self.logical = logical;
        self
    }

    /// Accept empty ragged records.
    pub fn allow_empty(mut self, on: bool) -> Self {
        self.allow_empty = on;
        self
    }

    fn validate(&self) -> Result<()> {
        if !(1..=255).contains(&self.data_shards) {
            return Err(Error::invalid("data_shards", format!("{} is outside 1..=255", self.data_shards)));
        }
        let (lo, hi) = (zstd::zstd_safe::min_c_level(), zstd::zstd_safe::max_c_level());
        if self.codec != Codec::Raw && !(lo..=hi).contains(&self.level) {
            return Err(Error::invalid("level", format!("{} is outside zstd's {lo}..={hi}", self.level)));
        }
        match (self.codec, &self.dictionary) {
            (Codec::ZstdDict, None) => Err(Error::InvalidCodec { reason: "zstd_dict needs dictionary bytes (train one with train_dict)".into() }),
            (Codec::ZstdDict, Some(d)) if d.is_empty() => Err(Error::InvalidCodec { reason: "the dictionary is empty".into() }),
            (Codec::Raw | Codec::Zstd, Some(_)) => Err(Error::InvalidCodec { reason: format!("a dictionary was given but codec is {}; use zstd_dict", self.codec) }),
            _ => Ok(()),
        }
    }
}

/// A file being written, hashed as it goes.
struct HashedFile {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: XxHash3_64,
    bytes: u64,
}

impl HashedFile {
    fn create(path: PathBuf, header: &[u8]) -> Result<HashedFile> {
        let f = crate::io::create_new(&path)?;
        let mut h = HashedFile { path, out: BufWriter::with_capacity(1 << 20, f), hasher: XxHash3_64::with_seed(0), bytes: 0 };
        h.write(header)?;
        Ok(h)
    }

    fn write(&mut self, b: &[u8]) -> Result<()> {
        self.out.write_all(b).map_err(|e| Error::io(&self.path, e))?;
        self.hasher.write(b);
        self.bytes += b.len() as u64;
        Ok(())
    }

    /// Start writing back what was written so far without waiting for it, so the final
    /// fsync has little left to flush (Linux `sync_file_range`; a no-op elsewhere).
    fn start_writeback(&mut self) -> Result<()> {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            self.out.flush().map_err(|e| Error::io(&self.path, e))?;
            let fd = self.out.get_ref().as_raw_fd();
            // SAFETY: `fd` is an open file descriptor owned by `self.out`; sync_file_range only
            // schedules writeback of the file's dirty pages and touches no memory of ours.
            // Failure is harmless (the final fsync still makes the data durable).
            unsafe { libc::sync_file_range(fd, 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        }
        Ok(())
    }

    fn finish(self) -> Result<FileEntry> {
        let name = self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let f = self.out.into_inner().map_err(|e| Error::io(&self.path, e.into_error()))?;
        f.sync_all().map_err(|e| Error::io(&self.path, e))?;
        Ok(FileEntry { name, bytes: self.bytes, xxh3: format!("{:016x}", self.hasher.finish()) })
    }
}

struct ShardWorker {
    id: u16,
    file: HashedFile,
}

/// One record handed to the writer: its decoded bytes and, for ragged, its shape row.
pub(crate) type RecordRef<'a> = (&'a [u8], Option<&'a [u64]>);

/// The kind-independent writer.
pub(crate) struct WriterCore {
    /// The hidden folder being written; publishing renames it to the destination.
    staging: Staging,
    kind: Kind,
    dtype: DType,
    item_shape: Option<Vec<usize>>,
    ndim: Option<usize>,
    options: WriterOptions,
    dictionary_entry: Option<FileEntry>,
    /// Mixed into every record checksum seed ([`format::dictionary_key`]).
    seed_key: u64,
    shards: Vec<ShardWorker>,
    index: Option<HashedFile>,
    shapes: Option<HashedFile>,
    pool: rayon::ThreadPool,
    /// Idle zstd encoders for the compressed path (one per concurrently encoding thread).
    encoders: std::sync::Mutex<Vec<Encoder>>,
    count: u64,
    raw_bytes: u64,
    stored_bytes: u64,
    /// Index entries of the window being appended (kept to reuse the allocation).
    pending: Vec<IndexEntry>,
    /// Set when an append failed half-way; the writer then refuses to publish.
    failed: Option<String>,
    /// Records of the running append written so far (updated per window), for progress bars.
    progress: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl WriterCore {
    pub(crate) fn create(
        path: &Path,
        kind: Kind,
        dtype: DType,
        item_shape: Option<Vec<usize>>,
        ndim: Option<usize>,
        options: WriterOptions,
    ) -> Result<WriterCore> {
        options.validate()?;
        if options.allow_empty && kind != Kind::Ragged {
            return Err(Error::invalid("allow_empty", "only ragged stores can hold empty records"));
        }
        if options.logical.is_bytes() && (kind != Kind::Ragged || dtype != DType::UInt8 || ndim != Some(1)) {
            return Err(Error::invalid("logical", format!("{} records need a uint8 ndim-1 ragged store", options.logical)));
        }
        // From here on, dropping `staging` removes the temp folder.
        let staging = Staging::create(path)?;
        let tmp_path = staging.path().to_path_buf();

        // Validates level and dictionary up front: a bad one fails `create`, not an append.
        let first = Encoder::new(options.codec, options.level, options.dictionary.as_deref())?;
        let dictionary_entry = match &options.dictionary {
            Some(d) => {
                let p = tmp_path.join(format::DICTIONARY);
                let f = HashedFile::create(p, d)?;
                Some(f.finish()?)
            }
            None => None,
        };
        let seed_key = if options.codec == Codec::ZstdDict { format::dictionary_key(options.dictionary.as_deref()) } else { 0 };
        let mut shards = Vec::with_capacity(options.data_shards);
        for i in 0..options.data_shards {
            let p = tmp_path.join(format::shard_name(i));
            let file = HashedFile::create(p, &format::header(format::DATA_MAGIC, i as u32, 0))?;
            shards.push(ShardWorker { id: i as u16, file });
        }
        let index = Some(HashedFile::create(tmp_path.join(format::INDEX), &format::header(format::INDEX_MAGIC, ENTRY_BYTES as u32, 0))?);
        let shapes = match ndim {
            Some(nd) if kind == Kind::Ragged => Some(HashedFile::create(
                tmp_path.join(format::SHAPES),
                &format::header(format::SHAPES_MAGIC, nd as u32, 0),
            )?),
            _ => None,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(options.data_shards)
            .thread_name(|i| format!("zrecord-writer-{i}"))
            .build()
            .map_err(|e| Error::invalid("data_shards", format!("cannot start writer threads: {e}")))?;
        Ok(WriterCore {
            staging,
            kind,
            dtype,
            item_shape,
            ndim,
            options,
            dictionary_entry,
            seed_key,
            shards,
            index,
            shapes,
            pool,
            encoders: std::sync::Mutex::new(vec![first]),
            count: 0,
            raw_bytes: 0,
            stored_bytes: 0,
            pending: Vec::new(),
            failed: None,
            progress: None,
        })
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn path(&self) -> &Path {
        self.staging.dest()
    }

    pub(crate) fn options(&self) -> &WriterOptions {
        &self.options
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        if let Some(reason) = &self.failed {
            return Err(Error::invalid("writer", format!("an earlier append failed ({reason}); this writer cannot publish")));
        }
        Ok(())
    }

    /// Report the records of each later append written so far into `counter` (per window).
    pub(crate) fn set_progress(&mut self, counter: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>) {
        self.progress = counter;
    }

    /// Append `n` validated records; `record(i)` returns record `i` of the input.
    pub(crate) fn append_records<'a, F>(&mut self, n: usize, record: F) -> Result<()>
    where
        F: Fn(usize) -> RecordRef<'a> + Sync,
    {
        self.check_usable()?;
        let r = self.append_inner(n, &record);
        if let Err(e) = &r {
            self.failed = Some(e.to_string());
        }
        r
    }

    fn append_inner<'a, F>(&mut self, n: usize, record: &F) -> Result<()>
    where
        F: Fn(usize) -> RecordRef<'a> + Sync,
    {
        let s = self.shards.len();
        let window_bytes = WINDOW_BYTES_PER_SHARD * s;
        let window_records = WINDOW_RECORDS_PER_SHARD * s;
        let mut start = 0usize;
        while start < n {
            // Window [start, end): bounded in bytes and records.
            let mut end = start;
            let mut bytes = 0usize;
            while end < n && end - start < window_records && (bytes < window_bytes || end == start) {
                bytes += record(end).0.len();
                end += 1;
            }
            let stored = if self.options.codec == Codec::Raw {
                self.append_window_raw(start, end, bytes, record)?
            } else {
                self.append_window_compressed(start, end, record)?
            };
            self.finish_window(start, end, bytes, stored, record)?;
            if let Some(p) = &self.progress {
                p.store(end as u64, std::sync::atomic::Ordering::Relaxed);
            }
            start = end;
        }
        Ok(())
    }

    /// Raw window: split into `data_shards` contiguous parts of about equal bytes; each shard
    /// worker copies its part straight from the input into its file. Leaves the window's index
    /// entries in `self.pending`.
    fn append_window_raw<'a, F>(&mut self, start: usize, end: usize, bytes: usize, record: &F) -> Result<u64>
    where
        F: Fn(usize) -> RecordRef<'a> + Sync,
    {
        let s = self.shards.len();
        let mut cuts = Vec::with_capacity(s + 1);
        cuts.push(start);
        let mut acc = 0usize;
        let mut k = start;
        for part in 1..s {
            let target = bytes / s * part;
            while k < end && acc < target {
                acc += record(k).0.len();
                k += 1;
            }
            cuts.push(k);
        }
        cuts.push(end);
        let mut entries = std::mem::take(&mut self.pending);
        entries.clear();
        entries.resize(end - start, IndexEntry { offset: 0, stored_len: 0, shard: 0, checksum: 0 });
        let mut jobs = Vec::with_capacity(s);
        let mut rest: &mut [IndexEntry] = &mut entries;
        for (w, win) in self.shards.iter_mut().zip(cuts.windows(2)) {
            let (mine, tail) = rest.split_at_mut(win[1] - win[0]);
            rest = tail;
            jobs.push((w, win[0], mine));
        }
        let base_id = self.count;
        let seed_key = self.seed_key;
        let stored: Result<Vec<u64>> = self.pool.install(|| {
            jobs.into_par_iter()
                .map(|(w, lo, out)| write_raw_part(w, lo, out, record, base_id + (lo - start) as u64, seed_key))
                .collect()
        });
        self.pending = entries;
        Ok(stored?.into_iter().sum())
    }

    /// Append the window's index entries (in `self.pending`) and shape rows, update counters.
    fn finish_window<'a, F>(&mut self, start: usize, end: usize, bytes: usize, stored: u64, record: &F) -> Result<()>
    where
        F: Fn(usize) -> RecordRef<'a> + Sync,
    {
        let mut buf = Vec::with_capacity(self.pending.len() * ENTRY_BYTES);
        for e in &self.pending {
            buf.extend_from_slice(&e.encode());
        }
        self.index.as_mut().ok_or(Error::Closed { what: "writer" })?.write(&buf)?;
        if let Some(shapes) = self.shapes.as_mut() {
            let mut sb = Vec::new();
            for i in start..end {
                for d in record(i).1.unwrap_or(&[]) {
                    sb.extend_from_slice(&d.to_le_bytes());
                }
            }
            shapes.write(&sb)?;
        }
        self.count += (end - start) as u64;
        self.raw_bytes += bytes as u64;
        self.stored_bytes += stored;
        Ok(())
    }

    /// Compressed window: encode ~1 MiB chunks with work stealing (so every core stays busy to
    /// the end of the window), then each shard writes its chunks (chunk `j` goes to shard
    /// `j % data_shards`) in order. Leaves the window's index entries in `self.pending`.
    fn append_window_compressed<'a, F>(&mut self, start: usize, end: usize, record: &F) -> Result<u64>
    where
        F: Fn(usize) -> RecordRef<'a> + Sync,
    {
        const CHUNK_BYTES: usize = 1 << 20;
        const CHUNK_RECORDS: usize = 4096;
        let mut chunks = Vec::new();
        let mut lo = start;
        while lo < end {
            let mut hi = lo;
            let mut b = 0usize;
            while hi < end && hi - lo < CHUNK_RECORDS && (b < CHUNK_BYTES || hi == lo) {
                b += record(hi).0.len();
                hi += 1;
            }
            chunks.push((lo, hi));
            lo = hi;
        }
        let base_id = self.count;
        let (codec, level, dictionary) = (self.options.codec, self.options.level, self.options.dictionary.as_deref());
        let seed_key = self.seed_key;
        let encoders = &self.encoders;
        let path = self.staging.path().to_path_buf();
        let encoded: Result<Vec<EncodedChunk>> = self.pool.install(|| {
            chunks
                .par_iter()
                .map(|&(lo, hi)| {
                    let pooled = encoders.lock().unwrap_or_else(|p| p.into_inner()).pop();
                    let mut enc = match pooled {
                        Some(e) => e,
                        None => Encoder::new(codec, level, dictionary)?,
                    };
                    let r = encode_chunk(&mut enc, lo, hi, record, base_id + (lo - start) as u64, seed_key, &path);
                    encoders.lock().unwrap_or_else(|p| p.into_inner()).push(enc);
                    r
                })
                .collect()
        });
        let encoded = encoded?;
        let s = self.shards.len();
        let mut entries = std::mem::take(&mut self.pending);
        entries.clear();
        entries.resize(end - start, IndexEntry { offset: 0, stored_len: 0, shard: 0, checksum: 0 });
        // Disjoint entry slices per chunk, grouped by the shard that writes the chunk.
        let mut groups: Vec<Vec<(&EncodedChunk, &mut [IndexEntry])>> = (0..s).map(|_| Vec::new()).collect();
        let mut rest: &mut [IndexEntry] = &mut entries;
        for (j, c) in encoded.iter().enumerate() {
            let (mine, tail) = rest.split_at_mut(c.lens.len());
            rest = tail;
            groups[j % s].push((c, mine));
        }
        let written: Result<Vec<()>> = self.pool.install(|| {
            self.shards
                .par_iter_mut()
                .zip(groups.into_par_iter())
                .map(|(w, group)| {
                    for (c, out) in group {
                        let mut offset = w.file.bytes;
                        for ((slot, &len), &sum) in out.iter_mut().zip(&c.lens).zip(&c.sums) {
                            *slot = IndexEntry { offset, stored_len: len, shard: w.id, checksum: sum };
                            offset += len as u64;
                        }
                        w.file.write(&c.data)?;
                    }
                    w.file.start_writeback()
                })
                .collect()
        });
        written?;
        let stored = encoded.iter().map(|c| c.data.len() as u64).sum();
        self.pending = entries;
        Ok(stored)
    }

    /// Flush, fsync, write the manifest last, and rename into place.
    pub(crate) fn finish(mut self) -> Result<PathBuf> {
        self.check_usable()?;
        let mut files = Vec::new();
        if let Some(d) = self.dictionary_entry.take() {
            files.push(d);
        }
        for w in std::mem::take(&mut self.shards) {
            files.push(w.file.finish()?);
        }
        if let Some(ix) = self.index.take() {
            files.push(ix.finish()?);
        }
        if let Some(sh) = self.shapes.take() {
            files.push(sh.finish()?);
        }
        let manifest = Manifest {
            format: "zrecord".into(),
            version: format::FORMAT_VERSION,
            kind: self.kind,
            dtype: self.dtype.name().into(),
            item_shape: self.item_shape.as_ref().map(|s| s.iter().map(|&d| d as u64).collect()),
            ndim: self.ndim.map(|n| n as u32),
            logical: self.options.logical,
            allow_empty: self.options.allow_empty,
            checksums_bind_dictionary: self.seed_key != 0,
            codec: self.options.codec.name().into(),
            level: if self.options.codec == Codec::Raw { 0 } else { self.options.level },
            record_count: self.count,
            data_shards: self.options.data_shards as u32,
            raw_bytes: self.raw_bytes,
            stored_bytes: self.stored_bytes,
            files,
            created_by: concat!("zrecord ", env!("CARGO_PKG_VERSION")).into(),
            data_dir: None,
        };
        self.staging.publish(format::MANIFEST, &manifest.to_bytes()?)
    }
}

/// One chunk of encoded records, ready to be written to a shard.
struct EncodedChunk {
    data: Vec<u8>,
    lens: Vec<u32>,
    sums: Vec<u64>,
}

#[allow(clippy::too_many_arguments)]
fn encode_chunk<'a, F>(enc: &mut Encoder, lo: usize, hi: usize, record: &F, first_id: u64, seed_key: u64, path: &Path) -> Result<EncodedChunk>
where
    F: Fn(usize) -> RecordRef<'a> + Sync,
{
    let mut c = EncodedChunk { data: Vec::new(), lens: Vec::with_capacity(hi - lo), sums: Vec::with_capacity(hi - lo) };
    for i in lo..hi {
        let (bytes, shape) = record(i);
        let e = enc.encode(bytes, path)?;
        let len = u32::try_from(e.len()).map_err(|_| Error::RecordTooLarge { index: i, bytes: bytes.len() as u64, limit: format::MAX_RECORD_BYTES })?;
        c.sums.push(XxHash3_64::oneshot_with_seed(format::record_seed(first_id + (i - lo) as u64, shape) ^ seed_key, e));
        c.lens.push(len);
        c.data.extend_from_slice(e);
    }
    Ok(c)
}

fn write_raw_part<'a, F>(w: &mut ShardWorker, lo: usize, out: &mut [IndexEntry], record: &F, first_id: u64, seed_key: u64) -> Result<u64>
where
    F: Fn(usize) -> RecordRef<'a> + Sync,
{
    let mut stored = 0u64;
    for (k, slot) in out.iter_mut().enumerate() {
        let (bytes, shape) = record(lo + k);
        let offset = w.file.bytes;
        let stored_len = u32::try_from(bytes.len()).map_err(|_| Error::RecordTooLarge {
            index: lo + k,
            bytes: bytes.len() as u64,
            limit: format::MAX_RECORD_BYTES,
        })?;
        let checksum = XxHash3_64::oneshot_with_seed(format::record_seed(first_id + k as u64, shape) ^ seed_key, bytes);
        *slot = IndexEntry { offset, stored_len, shard: w.id, checksum };
        stored += bytes.len() as u64;
        w.file.write(bytes)?;
    }
    w.file.start_writeback()?;
    Ok(stored)
}

/// xxh3 of a whole byte slice, hex, as the manifest records it.
pub(crate) fn file_hash_hex(bytes: &[u8]) -> String {
    format!("{:016x}", XxHash3_64::oneshot(bytes))
}

/// xxh3 of a whole source, hex (streamed in 1 MiB pieces for unmapped sources).
pub(crate) fn source_hash_hex(src: &dyn crate::io::ByteSource) -> Result<String> {
    use std::hash::Hasher;
    if let Some(s) = src.as_slice() {
        return Ok(file_hash_hex(s));
    }
    let mut h = twox_hash::XxHash3_64::with_seed(0);
    let mut at = 0u64;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    while at < src.len() {
        let n = (src.len() - at).min(1 << 20) as usize;
        src.read_at(at, &mut buf.spare_capacity_mut()[..n])?;
        // SAFETY: `read_at` succeeded, so the first `n` bytes were written (capacity >= n).
        unsafe { buf.set_len(n) };
        h.write(&buf);
        buf.clear();
        at += n as u64;
    }
    Ok(format!("{:016x}", h.finish()))
}
