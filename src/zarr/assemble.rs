//! Planning and execution of one batch: every chunk a batch needs is read once (adjacent
//! inner chunks of a shard in one read), decoded on a bounded worker pool, and its selected
//! voxels written straight into each sample's slot of one output allocation, cast on the way.

use std::borrow::Cow;
use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use lru::LruCache;
use rayon::prelude::*;
use zarrs::array::{ArrayToBytesCodecTraits, CodecOptions, FillValue};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{numel, Allocation, Allocator, Tensor};
use crate::zarr::cast::{convert_one, fill_repeat, fill_runs, kernel, scatter, strides, Kernel, OutPtr};
use crate::io::Uri;
use crate::zarr::meta::{index_shape, ArrayMeta, ChunkLayout, FastDecode};
use crate::zarr::select::{runs_by_chunk, Query, Run};

/// Cache sizes (entries).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Opened arrays (metadata and codec chains) kept.
    pub array_entries: usize,
    /// Shard indexes kept.
    pub shard_index_entries: usize,
    /// Bytes of decoded chunks kept across batches (0: none). Counts toward a pipeline's
    /// memory budget.
    pub chunk_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits { array_entries: 256, shard_index_entries: 8192, chunk_bytes: 0 }
    }
}

/// Decoded chunks by (array, chunk), bounded in bytes.
struct ChunkCache {
    lru: LruCache<(u64, Vec<u64>), Arc<Vec<u8>>>,
    bytes: usize,
    limit: usize,
}

impl ChunkCache {
    fn get(&mut self, k: &(u64, Vec<u64>)) -> Option<Arc<Vec<u8>>> {
        self.lru.get(k).cloned()
    }

    fn put(&mut self, k: (u64, Vec<u64>), v: Arc<Vec<u8>>) {
        if v.len() > self.limit {
            return;
        }
        self.bytes += v.len();
        if let Some(old) = self.lru.put(k, v) {
            self.bytes -= old.len();
        }
        while self.bytes > self.limit {
            match self.lru.pop_lru() {
                Some((_, old)) => self.bytes -= old.len(),
                None => break,
            }
        }
    }
}

thread_local! {
    /// One zstd decompression context per worker thread, reused for every chunk.
    static ZSTD: std::cell::RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { std::cell::RefCell::new(None) };
}

/// Decode one zstd frame of exactly `size` bytes with this thread's context.
fn zstd_decode(src: &[u8], size: usize) -> std::io::Result<Vec<u8>> {
    ZSTD.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(zstd::bulk::Decompressor::new()?);
        }
        let d = slot.as_mut().ok_or_else(|| std::io::Error::other("zstd context"))?;
        let mut out = Vec::with_capacity(size);
        let n = d.decompress_to_buffer(src, &mut out)?;
        if n != size {
            return Err(std::io::Error::other(format!("zstd frame decoded to {n} bytes, expected {size}")));
        }
        Ok(out)
    })
}

/// Executor limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Threads that read and decode (0: one per core).
    pub decode_workers: usize,
    /// The largest single read: adjacent inner chunks of a shard are merged up to this size,
    /// and no one encoded chunk may be larger.
    pub max_read_bytes: usize,
    /// The largest decoded chunk (decode scratch per worker).
    pub max_chunk_bytes: usize,
    /// Hard budget of a pipeline: output slots + per-worker read buffers and decode scratch.
    pub max_memory_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { decode_workers: 0, max_read_bytes: 16 << 20, max_chunk_bytes: 16 << 20, max_memory_bytes: 2 << 30 }
    }
}

impl Limits {
    /// Workers actually used.
    pub fn workers(&self) -> usize {
        if self.decode_workers == 0 {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        } else {
            self.decode_workers
        }
    }

    /// Bytes of read buffers and decode scratch the workers may hold at once.
    pub fn scratch_bytes(&self) -> usize {
        self.workers().saturating_mul(self.max_read_bytes.saturating_add(self.max_chunk_bytes))
    }

    fn check(&self) -> Result<()> {
        if self.decode_workers > 1024 {
            return Err(Error::invalid("decode_workers", format!("{} is more than 1024", self.decode_workers)));
        }
        if self.max_read_bytes == 0 || self.max_chunk_bytes == 0 {
            return Err(Error::invalid("limits", "max_read_bytes and max_chunk_bytes must be positive"));
        }
        Ok(())
    }
}

/// Counters since the assembler was made (`snapshot` reads them).
#[derive(Default, Debug)]
struct Counters {
    samples: AtomicU64,
    batches: AtomicU64,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    selected_bytes: AtomicU64,
    output_bytes: AtomicU64,
    chunks_decoded: AtomicU64,
    chunks_filled: AtomicU64,
    decode_ns: AtomicU64,
    read_ns: AtomicU64,
    assemble_ns: AtomicU64,
    array_hits: AtomicU64,
    array_misses: AtomicU64,
    index_hits: AtomicU64,
    index_misses: AtomicU64,
    chunk_hits: AtomicU64,
}

/// Per-stage statistics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stats {
    /// Samples assembled.
    pub samples: u64,
    /// Batches assembled.
    pub batches: u64,
    /// Reads issued (chunk files, merged shard ranges, shard indexes).
    pub reads: u64,
    /// Encoded bytes read.
    pub bytes_read: u64,
    /// Source bytes the samples selected (inside the arrays).
    pub selected_bytes: u64,
    /// Output bytes written.
    pub output_bytes: u64,
    /// Chunks decoded.
    pub chunks_decoded: u64,
    /// Chunks absent on storage, written as the fill value.
    pub chunks_filled: u64,
    /// Seconds spent decoding, summed over workers.
    pub decode_seconds: f64,
    /// Seconds spent reading, summed over workers.
    pub read_seconds: f64,
    /// Wall seconds of batch assembly.
    pub assemble_seconds: f64,
    /// Array metadata cache hits / misses.
    pub array_cache_hits: u64,
    /// Array metadata cache misses.
    pub array_cache_misses: u64,
    /// Shard index cache hits.
    pub index_cache_hits: u64,
    /// Shard index cache misses.
    pub index_cache_misses: u64,
    /// Chunks taken from the decoded-chunk cache.
    pub chunk_cache_hits: u64,
}

impl Stats {
    /// Encoded bytes read per selected source byte.
    pub fn read_amplification(&self) -> f64 {
        if self.selected_bytes == 0 {
            0.0
        } else {
            self.bytes_read as f64 / self.selected_bytes as f64
        }
    }
}

/// A shard's index: `(offset, nbytes)` per inner chunk, `None` when the shard is absent.
#[derive(Debug)]
struct ShardIndex {
    entries: Option<Vec<u64>>,
}

type ArrayKey = (String, Option<usize>);
/// (array id, chunk or shard grid indices).
type GridKey = (u64, Vec<u64>);

/// Opens arrays (cached), plans batches and runs them.
pub struct Assembler {
    limits: Limits,
    arrays: Mutex<LruCache<ArrayKey, Arc<ArrayMeta>>>,
    indexes: Mutex<LruCache<GridKey, Arc<ShardIndex>>>,
    pool: Option<rayon::ThreadPool>,
    counters: Counters,
    options: CodecOptions,
    chunks: Option<Mutex<ChunkCache>>,
}

impl std::fmt::Debug for Assembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Assembler({:?})", self.limits)
    }
}

/// One sample's plan.
struct SamplePlan {
    meta: Arc<ArrayMeta>,
    /// Per axis: (chunk index, runs).
    axes: Vec<Vec<(u64, Vec<Run>)>>,
    kernel: Kernel,
    /// Element size when the output type is the source type (innermost runs are memcpys).
    copy: Option<usize>,
    fill_out: Vec<u8>,
    prefill: bool,
}

/// A chunk some samples need, and where its voxels go.
struct ChunkJob {
    meta: Arc<ArrayMeta>,
    coords: Vec<u64>,
    /// (sample, per-axis index into that sample's `axes[d]`).
    targets: Vec<(usize, Vec<usize>)>,
}

/// One read: an object's byte range (whole object when `range` is `None`) holding chunks.
struct ReadTask {
    location: Uri,
    range: Option<(u64, u64)>,
    /// (job, offset in the read, encoded length).
    chunks: Vec<(usize, u64, u64)>,
}

impl Assembler {
    /// An assembler with its own pool of `limits.decode_workers` threads (the global rayon
    /// pool when 0).
    pub fn new(limits: Limits, cache: CacheLimits) -> Result<Assembler> {
        limits.check()?;
        let nz = |n: usize, what: &'static str| NonZeroUsize::new(n).ok_or_else(|| Error::invalid(what, "must be positive"));
        let pool = if limits.decode_workers == 0 {
            None
        } else {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(limits.decode_workers)
                    .thread_name(|i| format!("zrecord-zarr-{i}"))
                    .build()
                    .map_err(|e| Error::invalid("decode_workers", e.to_string()))?,
            )
        };
        Ok(Assembler {
            limits,
            arrays: Mutex::new(LruCache::new(nz(cache.array_entries, "array_entries")?)),
            indexes: Mutex::new(LruCache::new(nz(cache.shard_index_entries, "shard_index_entries")?)),
            pool,
            counters: Counters::default(),
            options: CodecOptions::default().with_concurrent_target(1),
            chunks: (cache.chunk_bytes > 0).then(|| Mutex::new(ChunkCache { lru: LruCache::unbounded(), bytes: 0, limit: cache.chunk_bytes })),
        })
    }

    /// The limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The array at `uri` (cached).
    pub fn array(&self, uri: &str, level: Option<usize>) -> Result<Arc<ArrayMeta>> {
        let key = (uri.to_string(), level);
        if let Some(m) = self.arrays.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            self.counters.array_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(m.clone());
        }
        self.counters.array_misses.fetch_add(1, Ordering::Relaxed);
        let m = Arc::new(ArrayMeta::open(uri, level)?);
        self.arrays.lock().unwrap_or_else(|p| p.into_inner()).put(key, m.clone());
        Ok(m)
    }

    /// Statistics so far.
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            samples: g(&c.samples),
            batches: g(&c.batches),
            reads: g(&c.reads),
            bytes_read: g(&c.bytes_read),
            selected_bytes: g(&c.selected_bytes),
            output_bytes: g(&c.output_bytes),
            chunks_decoded: g(&c.chunks_decoded),
            chunks_filled: g(&c.chunks_filled),
            decode_seconds: g(&c.decode_ns) as f64 * 1e-9,
            read_seconds: g(&c.read_ns) as f64 * 1e-9,
            assemble_seconds: g(&c.assemble_ns) as f64 * 1e-9,
            array_cache_hits: g(&c.array_hits),
            array_cache_misses: g(&c.array_misses),
            index_cache_hits: g(&c.index_hits),
            index_cache_misses: g(&c.index_misses),
            chunk_cache_hits: g(&c.chunk_hits),
        }
    }

    fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }

    /// Assemble `queries` into one new tensor `[n, *shape]` of `dtype` (the source type when
    /// `None`) placed in `allocator`. Every sample must have the same shape (`shape`, or the
    /// first sample's).
    pub fn gather(&self, queries: &[Query], dtype: Option<DType>, shape: Option<&[usize]>, allocator: &Allocator) -> Result<Tensor> {
        let plans = self.plan_samples(queries, dtype, shape)?;
        let (out_dtype, sample_shape) = plans.1.clone();
        let mut full = vec![queries.len()];
        full.extend_from_slice(&sample_shape);
        let bytes = numel(&full).and_then(|n| n.checked_mul(out_dtype.size())).ok_or_else(|| Error::invalid("shape", format!("{full:?} overflows")))?;
        let mut alloc = allocator.allocate(bytes)?;
        self.run(&plans.0, out_dtype, &sample_shape, &mut alloc, bytes)?;
        // SAFETY: `run` wrote every element of the `bytes` bytes (samples prefilled where
        // their selection leaves the array; every other element belongs to exactly one chunk,
        // written by its task or filled when the chunk is absent).
        Ok(unsafe { Tensor::from_initialized(Arc::new(alloc), 0, out_dtype, full) })
    }

    /// Assemble into `alloc` (a pipeline slot); returns the tensor shape.
    pub(crate) fn assemble_into(&self, queries: &[Query], dtype: DType, shape: &[usize], alloc: &mut Allocation) -> Result<Vec<usize>> {
        let plans = self.plan_samples(queries, Some(dtype), Some(shape))?;
        let mut full = vec![queries.len()];
        full.extend_from_slice(shape);
        let bytes = numel(&full).and_then(|n| n.checked_mul(dtype.size())).ok_or_else(|| Error::invalid("shape", "overflow"))?;
        if bytes > alloc.capacity() {
            return Err(Error::invalid("batch", format!("{bytes} bytes do not fit the {}-byte slot", alloc.capacity())));
        }
        self.run(&plans.0, dtype, shape, alloc, bytes)?;
        Ok(full)
    }

    /// The whole array at `uri` in one allocation (shape = the array's).
    pub fn read(&self, uri: &str, level: Option<usize>, dtype: Option<DType>, allocator: &Allocator) -> Result<Tensor> {
        let meta = self.array(uri, level)?;
        let sel: Vec<(i64, i64)> = meta.shape.iter().map(|&s| (0, s as i64)).collect();
        let mut q = Query::crop(uri, &sel);
        q.level = level;
        let t = self.gather(std::slice::from_ref(&q), dtype, None, allocator)?;
        let shape: Vec<usize> = meta.shape.iter().map(|&s| s as usize).collect();
        t.reshaped(shape)
    }

    #[allow(clippy::type_complexity)]
    fn plan_samples(&self, queries: &[Query], dtype: Option<DType>, shape: Option<&[usize]>) -> Result<(Vec<SamplePlan>, (DType, Vec<usize>))> {
        let mut plans = Vec::with_capacity(queries.len());
        let mut common: Option<(DType, Vec<usize>)> = shape.map(|s| (dtype.unwrap_or(DType::UInt8), s.to_vec()));
        for (i, q) in queries.iter().enumerate() {
            let ctx = |e: Error| e.context(format!("sample {i} ('{}')", q.uri));
            let meta = self.array(&q.uri, q.level).map_err(ctx)?;
            let positions = q.resolve(&meta.shape).map_err(ctx)?;
            let sshape: Vec<usize> = positions.iter().map(|p| p.len()).collect();
            let out_dtype = dtype.unwrap_or(meta.dtype);
            match &mut common {
                None => common = Some((out_dtype, sshape.clone())),
                Some((d, s)) => {
                    if shape.is_none() && dtype.is_none() && *d != out_dtype {
                        return Err(ctx(Error::DtypeMismatch { expected: *d, found: meta.dtype, what: "samples disagree on their dtype; pass dtype= to cast".into() }));
                    }
                    if dtype.is_some() {
                        *d = out_dtype;
                    }
                    if *s != sshape {
                        return Err(ctx(Error::ShapeMismatch { expected: format!("sample shape {s:?}"), found: format!("{sshape:?}") }));
                    }
                }
            }
            if meta.chunk_bytes() > self.limits.max_chunk_bytes as u64 {
                return Err(ctx(Error::invalid("max_chunk_bytes", format!("a decoded chunk of {:?} {} is {} bytes, more than limits.max_chunk_bytes = {}", meta.read_chunk, meta.dtype, meta.chunk_bytes(), self.limits.max_chunk_bytes))));
            }
            let k = kernel(meta.dtype, out_dtype).map_err(ctx)?;
            let fill_out = convert_one(k, &meta.fill, out_dtype.size());
            let mut prefill = false;
            let mut axes = Vec::with_capacity(positions.len());
            for (d, p) in positions.iter().enumerate() {
                let (runs, outside) = runs_by_chunk(p, meta.read_chunk[d]);
                prefill |= outside;
                axes.push(runs);
            }
            let copy = (meta.dtype == out_dtype).then(|| out_dtype.size());
            plans.push(SamplePlan { meta, axes, kernel: k, copy, fill_out, prefill });
        }
        let common = common.ok_or_else(|| Error::invalid("queries", "an empty batch needs a sample shape"))?;
        Ok((plans, common))
    }

    fn run(&self, plans: &[SamplePlan], out_dtype: DType, sample_shape: &[usize], alloc: &mut Allocation, bytes: usize) -> Result<()> {
        let t0 = Instant::now();
        let sample_numel: usize = sample_shape.iter().product();
        let sample_bytes = sample_numel * out_dtype.size();
        let dst_strides = strides(&sample_shape.iter().map(|&s| s as u64).collect::<Vec<_>>());
        let out = OutPtr(alloc.as_mut_ptr());
        debug_assert!(sample_bytes * plans.len() <= bytes);

        // Chunk jobs, deduplicated across samples.
        let mut jobs: Vec<ChunkJob> = Vec::new();
        let mut job_of: HashMap<(u64, Vec<u64>), usize> = HashMap::new();
        let mut selected = 0u64;
        for (s, p) in plans.iter().enumerate() {
            let inside: u64 = p.axes.iter().map(|a| a.iter().map(|(_, r)| r.iter().map(|r| r.len).sum::<u64>()).sum::<u64>()).product();
            selected += inside * p.meta.dtype.size() as u64;
            if p.axes.iter().any(|a| a.is_empty()) {
                continue;
            }
            let nd = p.axes.len();
            let mut idx = vec![0usize; nd];
            'combos: loop {
                let coords: Vec<u64> = (0..nd).map(|d| p.axes[d][idx[d]].0).collect();
                let j = match job_of.entry((p.meta.id, coords)) {
                    std::collections::hash_map::Entry::Occupied(e) => *e.get(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        jobs.push(ChunkJob { meta: p.meta.clone(), coords: e.key().1.clone(), targets: Vec::new() });
                        *e.insert(jobs.len() - 1)
                    }
                };
                jobs[j].targets.push((s, idx.clone()));
                let mut d = nd;
                loop {
                    if d == 0 {
                        break 'combos;
                    }
                    d -= 1;
                    idx[d] += 1;
                    if idx[d] < p.axes[d].len() {
                        break;
                    }
                    idx[d] = 0;
                }
            }
        }

        // Chunks already decoded (cache), then reads: unsharded chunks one object each;
        // sharded ones by shard, via the index.
        let mut cached: Vec<(usize, Arc<Vec<u8>>)> = Vec::new();
        let mut todo: Vec<usize> = Vec::with_capacity(jobs.len());
        match &self.chunks {
            Some(c) => {
                let mut c = c.lock().unwrap_or_else(|p| p.into_inner());
                for (j, job) in jobs.iter().enumerate() {
                    match c.get(&(job.meta.id, job.coords.clone())) {
                        Some(b) => cached.push((j, b)),
                        None => todo.push(j),
                    }
                }
                self.counters.chunk_hits.fetch_add(cached.len() as u64, Ordering::Relaxed);
            }
            None => todo.extend(0..jobs.len()),
        }
        let (tasks, fills) = self.read_tasks(&jobs, &todo, plans)?;

        // Prefill samples whose selection leaves the array.
        for (s, p) in plans.iter().enumerate() {
            if p.prefill {
                // SAFETY: each sample's slot is `sample_bytes` inside the allocation; samples
                // are disjoint; nothing else runs yet.
                unsafe { fill_repeat(out.at(s * sample_bytes), sample_bytes / p.fill_out.len(), &p.fill_out) };
            }
        }

        let sizes = (out_dtype.size(), sample_bytes);
        let result: Result<()> = self.install(|| {
            fills.par_iter().for_each(|&j| {
                self.counters.chunks_filled.fetch_add(1, Ordering::Relaxed);
                for (s, idx) in &jobs[j].targets {
                    let p = &plans[*s];
                    let runs: Vec<&[Run]> = idx.iter().enumerate().map(|(d, &i)| p.axes[d][i].1.as_slice()).collect();
                    // SAFETY: the runs of target `s` lie inside its slot; the elements they
                    // select belong to this chunk alone.
                    unsafe { fill_runs(&p.fill_out, out.at(s * sizes.1), &dst_strides, &runs) };
                }
            });
            cached.par_iter().for_each(|(j, b)| self.scatter_chunk(&jobs[*j], b, plans, out, &dst_strides, sizes));
            tasks.par_iter().try_for_each(|t| self.run_task(t, &jobs, plans, out, &dst_strides, sizes))
        });
        result?;
        let c = &self.counters;
        c.samples.fetch_add(plans.len() as u64, Ordering::Relaxed);
        c.batches.fetch_add(1, Ordering::Relaxed);
        c.selected_bytes.fetch_add(selected, Ordering::Relaxed);
        c.output_bytes.fetch_add((sample_bytes * plans.len()) as u64, Ordering::Relaxed);
        c.assemble_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn read_tasks(&self, jobs: &[ChunkJob], todo: &[usize], plans: &[SamplePlan]) -> Result<(Vec<ReadTask>, Vec<usize>)> {
        let mut tasks = Vec::new();
        let mut fills = Vec::new();
        let mut shards: HashMap<(u64, Vec<u64>), Vec<usize>> = HashMap::new();
        for &j in todo {
            let job = &jobs[j];
            match &job.meta.layout {
                ChunkLayout::Chunked { .. } => tasks.push(ReadTask { location: job.meta.object(&job.coords), range: None, chunks: vec![(j, 0, 0)] }),
                ChunkLayout::Sharded { per_shard, .. } => {
                    let shard: Vec<u64> = job.coords.iter().zip(per_shard).map(|(c, p)| c / p).collect();
                    shards.entry((job.meta.id, shard)).or_default().push(j);
                }
            }
        }
        if shards.is_empty() {
            return Ok((tasks, fills));
        }
        // Shard indexes: cached ones first, the rest read in parallel.
        let mut keys: Vec<(u64, Vec<u64>)> = shards.keys().cloned().collect();
        keys.sort();
        let mut found: HashMap<(u64, Vec<u64>), Arc<ShardIndex>> = HashMap::new();
        let mut missing = Vec::new();
        {
            let mut cache = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
            for k in &keys {
                match cache.get(k) {
                    Some(ix) => {
                        self.counters.index_hits.fetch_add(1, Ordering::Relaxed);
                        found.insert(k.clone(), ix.clone());
                    }
                    None => missing.push(k.clone()),
                }
            }
        }
        self.counters.index_misses.fetch_add(missing.len() as u64, Ordering::Relaxed);
        let loaded: Vec<Result<(GridKey, Arc<ShardIndex>)>> = self.install(|| {
            missing
                .par_iter()
                .map(|k| {
                    let j = shards[k][0];
                    let ix = self.load_index(&jobs[j].meta, &k.1).map_err(|e| e.context(format!("sample {} ('{}')", jobs[j].targets[0].0, plans[jobs[j].targets[0].0].meta.uri)))?;
                    Ok((k.clone(), Arc::new(ix)))
                })
                .collect()
        });
        {
            let mut cache = self.indexes.lock().unwrap_or_else(|p| p.into_inner());
            for r in loaded {
                let (k, ix) = r?;
                cache.put(k.clone(), ix.clone());
                found.insert(k, ix);
            }
        }
        for k in keys {
            let members = &shards[&k];
            let meta = &jobs[members[0]].meta;
            let ChunkLayout::Sharded { per_shard, .. } = &meta.layout else { continue };
            let ix = &found[&k];
            let Some(entries) = &ix.entries else {
                fills.extend_from_slice(members);
                continue;
            };
            let mut ranges: Vec<(u64, u64, usize)> = Vec::new();
            for &j in members {
                let mut flat = 0u64;
                for (d, c) in jobs[j].coords.iter().enumerate() {
                    flat = flat * per_shard[d] + c % per_shard[d];
                }
                let (off, n) = (entries[2 * flat as usize], entries[2 * flat as usize + 1]);
                if off == u64::MAX && n == u64::MAX {
                    fills.push(j);
                } else {
                    if n > self.limits.max_read_bytes as u64 {
                        return Err(Error::invalid("max_read_bytes", format!("'{}': inner chunk {:?} is {n} encoded bytes, more than limits.max_read_bytes = {}", meta.uri, jobs[j].coords, self.limits.max_read_bytes)));
                    }
                    ranges.push((off, n, j));
                }
            }
            // One planner for shard reads and store preloads: touching chunks (or, remote,
            // chunks closer than the location's coalesce gap) are one read.
            let location = meta.object(&k.1);
            let wanted: Vec<std::ops::Range<u64>> = ranges.iter().map(|&(off, n, _)| off..off + n).collect();
            for read in crate::io::plan::coalesce(&wanted, location.coalesce_gap(), self.limits.max_read_bytes as u64) {
                let chunks = read.members.iter().map(|&i| (ranges[i].2, ranges[i].0 - read.range.start, ranges[i].1)).collect();
                tasks.push(ReadTask { location: location.clone(), range: Some((read.range.start, read.len())), chunks });
            }
        }
        Ok((tasks, fills))
    }

    fn load_index(&self, meta: &ArrayMeta, shard: &[u64]) -> Result<ShardIndex> {
        let ChunkLayout::Sharded { per_shard, index, index_at_start, index_size, .. } = &meta.layout else {
            return Err(Error::invalid("layout", "not sharded"));
        };
        let loc = meta.object(shard);
        let path = loc.path();
        // The index size follows from metadata alone (chunks per shard): bounded before a byte
        // is fetched or allocated. An index is read whole and decoded like a chunk, so either
        // limit admits it (a small max_read_bytes caps merging, not the index).
        let cap = self.limits.max_read_bytes.max(self.limits.max_chunk_bytes) as u64;
        if *index_size > cap {
            return Err(Error::invalid(
                "max_read_bytes",
                format!("'{}': the shard index of {} inner chunks is {index_size} bytes, more than limits.max_read_bytes / max_chunk_bytes allow ({cap})", meta.uri, per_shard.iter().product::<u64>()),
            ));
        }
        let t0 = Instant::now();
        let Some((buf, len)) = loc.read_edge(*index_size, *index_at_start)? else {
            return Ok(ShardIndex { entries: None });
        };
        if len < *index_size {
            return Err(Error::corrupt(&path, format!("shard of {len} bytes is shorter than its {index_size}-byte index")));
        }
        self.counters.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_read.fetch_add(*index_size, Ordering::Relaxed);
        let shape = index_shape(per_shard)?;
        let decoded = index
            .decode(Cow::Borrowed(&buf), &shape, &zarrs::array::data_type::uint64(), &FillValue::from(u64::MAX), &self.options)
            .and_then(|b| b.into_fixed().map_err(|e| zarrs::array::CodecError::Other(e.to_string())))
            .map_err(|e| Error::corrupt(&path, format!("shard index: {e}")))?;
        let entries: Vec<u64> = decoded.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().unwrap_or([0; 8]))).collect();
        // Every present entry must lie inside the shard's data region.
        let (lo, hi) = if *index_at_start { (*index_size, len) } else { (0, len - index_size) };
        for (i, e) in entries.chunks_exact(2).enumerate() {
            let (off, n) = (e[0], e[1]);
            if off == u64::MAX && n == u64::MAX {
                continue;
            }
            if off < lo || off.checked_add(n).is_none_or(|end| end > hi) {
                return Err(Error::corrupt(&path, format!("shard index entry {i} ({off}, {n}) lies outside the shard's data ({lo}..{hi})")));
            }
        }
        Ok(ShardIndex { entries: Some(entries) })
    }

    /// Write one decoded chunk's selected voxels into every slot that wants them.
    fn scatter_chunk(&self, job: &ChunkJob, decoded: &[u8], plans: &[SamplePlan], out: OutPtr, dst_strides: &[u64], sizes: (usize, usize)) {
        let meta = &job.meta;
        debug_assert_eq!(decoded.len() as u64, meta.chunk_bytes());
        let src_strides = strides(&meta.read_chunk);
        for (s, idx) in &job.targets {
            let p = &plans[*s];
            let runs: Vec<&[Run]> = idx.iter().enumerate().map(|(d, &i)| p.axes[d][i].1.as_slice()).collect();
            // SAFETY: `decoded` holds the whole chunk (checked by the decoders), the runs lie
            // inside it (offsets < chunk shape) and inside sample `s`'s slot; the elements they
            // select are this chunk's alone.
            unsafe { scatter(p.kernel, p.copy, decoded.as_ptr(), meta.dtype.size(), &src_strides, out.at(s * sizes.1), sizes.0, dst_strides, &runs) };
        }
    }

    fn run_task(&self, t: &ReadTask, jobs: &[ChunkJob], plans: &[SamplePlan], out: OutPtr, dst_strides: &[u64], sizes: (usize, usize)) -> Result<()> {
        let path = t.location.path();
        let path = path.as_path();
        let t0 = Instant::now();
        let buf = match t.range {
            None => t.location.read_all(self.limits.max_read_bytes as u64).map_err(|e| e.context(format!("'{}'", jobs[t.chunks[0].0].meta.uri)))?,
            Some((off, n)) => Some(t.location.read_range(off, n)?),
        };
        self.counters.read_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let Some(buf) = buf else {
            // A missing chunk file: the fill value.
            for &(j, _, _) in &t.chunks {
                self.counters.chunks_filled.fetch_add(1, Ordering::Relaxed);
                for (s, idx) in &jobs[j].targets {
                    let p = &plans[*s];
                    let runs: Vec<&[Run]> = idx.iter().enumerate().map(|(d, &i)| p.axes[d][i].1.as_slice()).collect();
                    // SAFETY: as in `run`: the runs lie in sample `s`'s slot, this chunk's alone.
                    unsafe { fill_runs(&p.fill_out, out.at(s * sizes.1), dst_strides, &runs) };
                }
            }
            return Ok(());
        };
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        self.counters.bytes_read.fetch_add(buf.len() as u64, Ordering::Relaxed);
        // The chunks of a merged read decode in parallel (a shard's neighbours often merge into
        // one read; decoding them one after another would leave the other workers idle).
        t.chunks.par_iter().try_for_each(|&(j, off, n)| -> Result<()> {
            let job = &jobs[j];
            let meta = &job.meta;
            let encoded = if t.range.is_none() { &buf[..] } else { &buf[off as usize..(off + n) as usize] };
            let t1 = Instant::now();
            let size = meta.chunk_bytes() as usize;
            let codec_err = |e: String| {
                let s = job.targets[0].0;
                Error::Codec { path: path.to_path_buf(), reason: format!("chunk {:?} of '{}' (sample {s}): {e}", job.coords, meta.uri) }
            };
            let decoded: Cow<'_, [u8]> = match meta.fast {
                FastDecode::Raw => {
                    if encoded.len() != size {
                        return Err(codec_err(format!("{} stored bytes for a raw chunk of {size}", encoded.len())));
                    }
                    Cow::Borrowed(encoded)
                }
                FastDecode::Zstd => Cow::Owned(zstd_decode(encoded, size).map_err(|e| codec_err(e.to_string()))?),
                FastDecode::None => {
                    let codecs = match &meta.layout {
                        ChunkLayout::Chunked { codecs } => codecs,
                        ChunkLayout::Sharded { inner, .. } => inner,
                    };
                    let arr = meta.zarrs_array();
                    let shape = meta.chunk_shape_nz();
                    let d = codecs
                        .decode(Cow::Borrowed(encoded), &shape, arr.data_type(), arr.fill_value(), &self.options)
                        .and_then(|b| b.into_fixed().map_err(|e| zarrs::array::CodecError::Other(e.to_string())))
                        .map_err(|e| codec_err(e.to_string()))?;
                    if d.len() != size {
                        return Err(codec_err(format!("decoded to {} bytes, expected {size}", d.len())));
                    }
                    Cow::Owned(d.into_owned())
                }
            };
            self.counters.decode_ns.fetch_add(t1.elapsed().as_nanos() as u64, Ordering::Relaxed);
            self.counters.chunks_decoded.fetch_add(1, Ordering::Relaxed);
            match &self.chunks {
                Some(c) => {
                    let arc = Arc::new(decoded.into_owned());
                    self.scatter_chunk(job, &arc, plans, out, dst_strides, sizes);
                    c.lock().unwrap_or_else(|p| p.into_inner()).put((meta.id, job.coords.clone()), arc);
                }
                None => self.scatter_chunk(job, &decoded, plans, out, dst_strides, sizes),
            }
            Ok(())
        })
    }
}

/// The assembler shared by SQL crop tables and `zarr.read` (global rayon pool).
pub fn shared_assembler() -> Arc<Assembler> {
    static A: std::sync::OnceLock<Arc<Assembler>> = std::sync::OnceLock::new();
    A.get_or_init(|| Arc::new(Assembler::new(Limits::default(), CacheLimits::default()).unwrap_or_else(|_| unreachable!("default limits are valid")))).clone()
}
