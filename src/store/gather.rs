//! Gather: compute the exact output layout, take one pooled region, then decode every record
//! straight into its final slot in parallel. No per-record buffers, no second copy.

use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};


use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, RaggedLayout, Tensor};
use crate::store::crew::{Crew, Job};
use crate::store::codec::DecodeContext;
use crate::store::reader::{Check, Located, StoreCore, MAX_NDIM};

/// Below this many output bytes a gather runs on the calling thread.
const PARALLEL_MIN_BYTES: usize = 128 << 10;
/// Parallel gathers hand out chunks of about this many output bytes.
const CHUNK_BYTES: usize = 32 << 10;

/// How many records ahead a gather prefetches.
const PREFETCH_AHEAD: usize = 8;

/// Gathers locate this many records before reading them (see [`read_located_blocks`]).
const LOCATE_BLOCK: usize = 256;

/// Which records to read: an explicit list (order and duplicates kept) or an arithmetic range.
#[derive(Clone, Copy, Debug)]
pub enum Ids<'a> {
    /// Explicit ids.
    List(&'a [u64]),
    /// `start, start + step, ...`, `len` ids (step may be negative).
    Range {
        /// First id.
        start: u64,
        /// Increment.
        step: i64,
        /// Number of ids.
        len: usize,
    },
}

impl Ids<'_> {
    /// Number of ids.
    pub fn len(&self) -> usize {
        match self {
            Ids::List(l) => l.len(),
            Ids::Range { len, .. } => *len,
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Id number `k` (`k < len`).
    #[inline]
    pub fn get(&self, k: usize) -> u64 {
        match self {
            Ids::List(l) => l[k],
            Ids::Range { start, step, .. } => (*start as i128 + *step as i128 * k as i128) as u64,
        }
    }

    /// Error (before any work) if any id is outside `0..n`.
    pub fn validate(&self, n: u64, store: &Path) -> Result<()> {
        let oob = |index: i128| Error::IndexOutOfRange { index, len: n, store: store.to_path_buf() };
        match self {
            Ids::List(l) => match l.iter().find(|&&i| i >= n) {
                Some(&i) => Err(oob(i as i128)),
                None => Ok(()),
            },
            Ids::Range { start, step, len } => {
                if *len == 0 {
                    return Ok(());
                }
                let first = *start as i128;
                let last = first + *step as i128 * (*len as i128 - 1);
                for x in [first, last] {
                    if x < 0 || x >= n as i128 {
                        return Err(oob(x));
                    }
                }
                Ok(())
            }
        }
    }
}

/// The work of one parallel gather, shared with the helper jobs it spawns.
///
/// Chunks are claimed from an atomic cursor: the calling thread starts at once and keeps
/// claiming, helpers join whenever the scheduler wakes them, and the caller waits only for
/// chunks a helper has actually claimed, never for a helper to start. A helper woken after the
/// last chunk was claimed finds nothing and returns without touching the gather's memory. (A
/// scoped split into one task per thread made the caller wait for the slowest wake-up: on a
/// small gather that cost more than the parallelism gained.)
struct Chunks {
    next: AtomicUsize,
    done: AtomicUsize,
    n: usize,
    failed: std::sync::atomic::AtomicBool,
    error: Mutex<Option<Error>>,
    /// The caller's chunk function, its lifetime erased: valid while a chunk is claimed but not
    /// done (the caller does not return from [`run_chunks`] before every chunk is done).
    work: *const (dyn Fn(usize) -> Result<()> + Sync + 'static),
}

// SAFETY: `work` points to a `Sync` closure, only called (from any thread) while the caller
// keeps it alive (see `Chunks::help`); everything else is atomics and a mutex.
unsafe impl Send for Chunks {}
// SAFETY: as above.
unsafe impl Sync for Chunks {}

impl Chunks {
    fn help(&self) {
        loop {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            if k >= self.n {
                return;
            }
            if !self.failed.load(Ordering::Relaxed) {
                // SAFETY: chunk `k` is claimed and not yet counted done, so the caller is still
                // inside `run_chunks` (it waits for `done == n`), and `work` with everything it
                // borrows is alive.
                let work = unsafe { &*self.work };
                let r = crate::error::catch_panic("gather chunk", k as u64, || work(k));
                if let Err(e) = r {
                    self.failed.store(true, Ordering::Relaxed);
                    let mut slot = self.error.lock().unwrap_or_else(|p| p.into_inner());
                    slot.get_or_insert(e);
                }
            }
            // After this, this thread never touches `work` again.
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

impl Job for Chunks {
    fn help(&self) {
        Chunks::help(self);
    }

    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.n
    }
}

/// Run `work(0..n)` with up to `helpers` gather-crew members joining the calling thread (see
/// [`Chunks`] and [`Crew`]). First error wins; a panic in a chunk is an error, never a hang.
fn run_chunks(n: usize, helpers: usize, work: &(dyn Fn(usize) -> Result<()> + Sync)) -> Result<()> {
    let helpers = helpers.min(n.saturating_sub(1));
    if helpers == 0 {
        return (0..n).try_for_each(|k| crate::error::catch_panic("gather chunk", k as u64, || work(k)));
    }
    // SAFETY: only the lifetime is erased (same fat-pointer layout); the pointer is used only
    // while this function has not returned (see `Chunks::work`).
    let work: *const (dyn Fn(usize) -> Result<()> + Sync + 'static) = unsafe { std::mem::transmute(work as *const (dyn Fn(usize) -> Result<()> + Sync + '_)) };
    let shared = Arc::new(Chunks {
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        n,
        failed: std::sync::atomic::AtomicBool::new(false),
        error: Mutex::new(None),
        work,
    });
    match Crew::get() {
        Some(crew) => {
            let job: Arc<dyn Job> = shared.clone();
            crew.post(job.clone(), helpers);
            shared.help();
            crew.retire(&job);
        }
        None => shared.help(),
    }
    // Every chunk is claimed; wait for those still running on helpers (a few microseconds).
    let mut spins = 0u32;
    while shared.done.load(Ordering::Acquire) < n {
        if spins < 64 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
    let e = shared.error.lock().unwrap_or_else(|p| p.into_inner()).take();
    e.map_or(Ok(()), Err)
}

/// Read records `lo..hi` of `ids` (`read(ctx, k, location)` decodes record `k` into its slot)
/// in blocks: every record of a block is located first (its index entry read and its bytes
/// bounds-checked), then read, prefetching a few records ahead. Reading each entry just before
/// its copy made every record wait for a load of the index; located first, the loads overlap
/// (their entries hinted in a tight loop: `locate` is too long a body for the core to overlap
/// more than a few of its own loads). Dense tokens (2 KiB records), 2 threads, alternated runs:
/// 3.5M -> 5.5M records/s.
fn read_located_blocks<'c>(
    core: &'c StoreCore,
    ids: Ids<'_>,
    lo: usize,
    hi: usize,
    mut read: impl FnMut(&mut DecodeContext<'c>, usize, &Located<'c>) -> Result<()>,
) -> Result<()> {
    let mut ctx = core.decoder.context();
    let mut located = Vec::with_capacity((hi - lo).min(LOCATE_BLOCK));
    let mut first = lo;
    while first < hi {
        let end = (first + LOCATE_BLOCK).min(hi);
        for k in first..end {
            core.prefetch_entry(ids.get(k));
        }
        located.clear();
        for k in first..end {
            located.push(core.locate(ids.get(k))?);
        }
        for at in located.iter().take(PREFETCH_AHEAD) {
            core.prefetch_located(at);
        }
        for (j, at) in located.iter().enumerate() {
            let k = first + j;
            match located.get(j + PREFETCH_AHEAD) {
                Some(next) => core.prefetch_located(next),
                // Past this block: the first records of the next one.
                None if k + PREFETCH_AHEAD < hi => core.prefetch(ids.get(k + PREFETCH_AHEAD)),
                None => {}
            }
            read(&mut ctx, k, at)?;
        }
        first = end;
    }
    Ok(())
}

/// Helper jobs worth waking for a gather of `bytes` output bytes.
fn helpers_for(bytes: usize) -> usize {
    if bytes < PARALLEL_MIN_BYTES {
        0
    } else {
        Crew::get().map_or(0, Crew::members)
    }
}

/// An output buffer shared by chunk workers that write disjoint ranges of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut MaybeUninit<u8>);
// SAFETY: workers write disjoint ranges only (each chunk its own records' slots).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// # Safety
    /// `at..at + len` lies within the buffer and no other live slice overlaps it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, at: usize, len: usize) -> &mut [MaybeUninit<u8>] {
        // SAFETY: the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// Dense gather into one tensor `[len, *item_shape]`.
pub(crate) fn gather_dense(core: &StoreCore, allocator: &Allocator, ids: Ids<'_>, verify: bool, parallel: bool) -> Result<Tensor> {
    let verify = if verify { Check::FirstRead } else { Check::Off };
    ids.validate(core.len, &core.path)?;
    core.records_read.fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let rb = core.record_bytes;
    let b = ids.len();
    let total = rb.checked_mul(b).ok_or_else(|| Error::invalid("indices", format!("{b} records of {rb} bytes overflow")))?;
    let mut alloc = allocator.allocate(total)?;
    let _staged = core.stage(ids)?;
    core.prefetch_cold(ids);
    let started = std::time::Instant::now();
    if rb > 0 && b > 0 {
        let out = &mut alloc.as_uninit_mut()[..total];
        // Records `lo..lo + chunk.len() / rb` into `chunk`.
        let run = |lo: usize, chunk: &mut [MaybeUninit<u8>]| -> Result<()> {
            read_located_blocks(core, ids, lo, lo + chunk.len() / rb, |ctx, k, at| {
                let j = k - lo;
                core.read_located_into(ctx, ids.get(k), None, &mut chunk[j * rb..(j + 1) * rb], verify, at)
            })
        };
        let helpers = if parallel { helpers_for(total) } else { 0 };
        if helpers == 0 || b == 1 {
            run(0, out)?;
        } else {
            let per = (CHUNK_BYTES / rb).clamp(1, b);
            let base = OutPtr(out.as_mut_ptr());
            run_chunks(b.div_ceil(per), helpers, &|k| {
                let lo = k * per;
                let hi = (lo + per).min(b);
                // SAFETY: chunk `k` owns records `lo..hi`, bytes `lo * rb..hi * rb` of `out`
                // (`hi <= b`, `b * rb == total`): disjoint from every other chunk's.
                run(lo, unsafe { base.slice(lo * rb, (hi - lo) * rb) })
            })?;
        }
    }
    core.observe(b, total, started.elapsed());
    core.check_files_intact()?;
    let mut shape = Vec::with_capacity(core.item_shape.len() + 1);
    shape.push(b);
    shape.extend_from_slice(&core.item_shape);
    // SAFETY: when this point is reached every record slot of `out` (all `total` bytes) was
    // written by `read_into` (which fails unless it fills its slot exactly); the allocation is
    // not written again.
    Ok(unsafe { Tensor::from_initialized(Arc::new(alloc), 0, core.dtype, shape) })
}

fn write_ne<const N: usize>(dst: &mut [MaybeUninit<u8>], bytes: [u8; N]) {
    for (d, s) in dst.iter_mut().zip(bytes) {
        d.write(s);
    }
}

/// Ragged gather into one packed batch (values, cu_seqlens, shapes in one allocation).
pub(crate) fn gather_ragged(core: &StoreCore, allocator: &Allocator, ids: Ids<'_>, verify: bool, parallel: bool) -> Result<RaggedBatch> {
    let verify = if verify { Check::FirstRead } else { Check::Off };
    ids.validate(core.len, &core.path)?;
    core.records_read.fetch_add(ids.len() as u64, std::sync::atomic::Ordering::Relaxed);
    let b = ids.len();
    let nd = core.ndim;
    let esize = core.dtype.size();
    let _staged = core.stage(ids)?;
    core.prefetch_cold(ids);
    let started = std::time::Instant::now();
    // Pass 1: read (and check) every shape row once; offsets follow from them.
    let mut cu: Vec<i32> = Vec::with_capacity(b + 1);
    let mut shapes: Vec<u64> = Vec::with_capacity(b * nd);
    cu.push(0);
    let mut total: u64 = 0;
    let mut shape = [0u64; MAX_NDIM];
    for k in 0..b {
        total += core.shape_into(ids.get(k), &mut shape)?;
        let t = i32::try_from(total).map_err(|_| Error::TooManyValues { count: total, limit: i32::MAX as u64 })?;
        cu.push(t);
        shapes.extend_from_slice(&shape[..nd]);
    }
    let values_bytes = total as usize * esize;
    let layout = RaggedLayout::new(values_bytes, b, nd);
    let (cu_off, sh_off, size) = (layout.cu_off, layout.shapes_off, layout.total);
    let mut alloc = allocator.allocate(size)?;
    {
        let out = &mut alloc.as_uninit_mut()[..size];
        let (values, meta) = out.split_at_mut(cu_off);
        let values = &mut values[..values_bytes];
        for (k, c) in cu.iter().enumerate() {
            write_ne(&mut meta[k * 4..k * 4 + 4], c.to_ne_bytes());
        }
        let shapes_region = &mut meta[sh_off - cu_off..];
        for (j, d) in shapes.iter().enumerate() {
            write_ne(&mut shapes_region[j * 8..j * 8 + 8], d.to_ne_bytes());
        }
        // Pass 2: decode into place.
        let decode_run = |lo: usize, hi: usize, region: &mut [MaybeUninit<u8>]| -> Result<()> {
            let base = cu[lo] as usize * esize;
            read_located_blocks(core, ids, lo, hi, |ctx, k, at| {
                let a = cu[k] as usize * esize - base;
                let z = cu[k + 1] as usize * esize - base;
                core.read_located_into(ctx, ids.get(k), Some(&shapes[k * nd..(k + 1) * nd]), &mut region[a..z], verify, at)
            })
        };
        let helpers = if parallel { helpers_for(values_bytes) } else { 0 };
        if helpers == 0 {
            decode_run(0, b, values)?;
        } else {
            // Record runs of about CHUNK_BYTES each.
            let mut bounds: Vec<usize> = vec![0];
            let mut lo = 0usize;
            while lo < b {
                let mut hi = lo + 1;
                while hi < b && (cu[hi] - cu[lo]) as usize * esize < CHUNK_BYTES {
                    hi += 1;
                }
                bounds.push(hi);
                lo = hi;
            }
            let base = OutPtr(values.as_mut_ptr());
            run_chunks(bounds.len() - 1, helpers, &|k| {
                let (lo, hi) = (bounds[k], bounds[k + 1]);
                let (a, z) = (cu[lo] as usize * esize, cu[hi] as usize * esize);
                // SAFETY: records `lo..hi` own values bytes `a..z` (cu is non-decreasing and
                // `cu[b] * esize == values_bytes`): disjoint from every other chunk's.
                decode_run(lo, hi, unsafe { base.slice(a, z - a) })
            })?;
        }
    }
    core.observe(b, values_bytes, started.elapsed());
    core.check_files_intact()?;
    // SAFETY: values (all `values_bytes`), cu_seqlens (`b + 1` int32) and shapes (`b * nd`
    // uint64) were all written above; padding between them is never exposed.
    Ok(unsafe { layout.batch(Arc::new(alloc), core.dtype, b, nd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every chunk runs exactly once, on the caller or a helper, whatever the helper count;
    /// the first error is returned; a panicking chunk is an error, not a hang or an abort.
    #[test]
    fn chunks_run_once_and_failures_come_back() {
        for helpers in [0usize, 1, 3, 16] {
            for n in [0usize, 1, 2, 7, 100] {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                run_chunks(n, helpers, &|k| {
                    hits[k].fetch_add(1, Ordering::Relaxed);
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{e}"));
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "helpers {helpers}, n {n}");
            }
            let r = run_chunks(50, helpers, &|k| if k == 20 { Err(Error::invalid("chunk", "twenty")) } else { Ok(()) });
            assert!(matches!(r, Err(Error::InvalidArgument { .. })), "{r:?}");
            let r = run_chunks(50, helpers, &|k| if k == 33 { panic!("chunk thirty-three") } else { Ok(()) });
            match r {
                Err(Error::Panicked { message, step, .. }) => assert_eq!((message.as_str(), step), ("chunk thirty-three", 33)),
                other => panic!("{other:?}"),
            }
        }
    }

    /// Gathers posted from several threads at once share the crew's queue: every chunk of
    /// every job runs exactly once, and back-to-back jobs (members lingering between them) and
    /// jobs after a pause (members parked) both complete.
    #[test]
    fn concurrent_posters_share_the_crew() {
        std::thread::scope(|s| {
            for t in 0..4usize {
                s.spawn(move || {
                    for round in 0..300usize {
                        let n = 1 + (round * 7 + t) % 40;
                        let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        run_chunks(n, 3, &|k| {
                            hits[k].fetch_add(1, Ordering::Relaxed);
                            Ok(())
                        })
                        .unwrap_or_else(|e| panic!("{e}"));
                        assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "thread {t} round {round}");
                        if round % 100 == 99 {
                            // Long enough for lingering members to park.
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                    }
                });
            }
        });
    }

    /// The caller returns while helpers it woke may not have started: the borrowed state the
    /// chunks used is gone by then, and a late helper must not touch it (miri checks this).
    #[test]
    fn late_helpers_touch_nothing_after_return() {
        for _ in 0..20 {
            let data: Vec<u64> = (0..64).collect();
            let sum = AtomicUsize::new(0);
            run_chunks(8, 2, &|k| {
                sum.fetch_add(data[k * 8..k * 8 + 8].iter().sum::<u64>() as usize, Ordering::Relaxed);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
            drop(data);
            assert_eq!(sum.load(Ordering::Relaxed), (0..64).sum::<usize>());
        }
    }
}
