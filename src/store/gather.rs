//! Gather: compute the exact output layout, take one pooled region, then decode every record
//! straight into its final slot in parallel. No per-record buffers, no second copy.

use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Arc;


use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, RaggedLayout, Tensor};
use crate::store::reader::{Check, StoreCore, MAX_NDIM};

/// Below this many output bytes a gather runs on the calling thread.
const PARALLEL_MIN_BYTES: usize = 128 << 10;
/// Aim for tasks of about this many output bytes.
const TASK_BYTES: usize = 256 << 10;

/// How many records ahead a gather prefetches.
const PREFETCH_AHEAD: usize = 8;

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

/// Run `tasks` in parallel on the rayon pool, the calling thread taking the first one itself
/// (so a gather wakes one worker fewer and never idles its caller). First error wins.
fn run_parallel<T: Send>(mut tasks: Vec<T>, f: impl Fn(T) -> Result<()> + Sync) -> Result<()> {
    if tasks.len() <= 1 {
        return tasks.pop().map(&f).unwrap_or(Ok(()));
    }
    let first = tasks.remove(0);
    let mut results: Vec<Result<()>> = tasks.iter().map(|_| Ok(())).collect();
    let mine = rayon::in_place_scope(|s| {
        for (task, slot) in tasks.into_iter().zip(results.iter_mut()) {
            let f = &f;
            s.spawn(move |_| *slot = f(task));
        }
        f(first)
    });
    mine?;
    results.into_iter().collect()
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
    if rb > 0 && b > 0 {
        let out = &mut alloc.as_uninit_mut()[..total];
        // Records `lo..lo + chunk.len() / rb` into `chunk`, prefetching a few ahead.
        let run = |lo: usize, chunk: &mut [MaybeUninit<u8>]| -> Result<()> {
            let mut ctx = core.decoder.context();
            let n = chunk.len() / rb;
            for k in lo..(lo + PREFETCH_AHEAD).min(lo + n) {
                core.prefetch(ids.get(k));
            }
            for (j, slot) in chunk.chunks_exact_mut(rb).enumerate() {
                if j + PREFETCH_AHEAD < n {
                    core.prefetch(ids.get(lo + j + PREFETCH_AHEAD));
                }
                if j + 2 * PREFETCH_AHEAD < n {
                    core.prefetch_entry(ids.get(lo + j + 2 * PREFETCH_AHEAD));
                }
                core.read_into(&mut ctx, ids.get(lo + j), None, slot, verify)?;
            }
            Ok(())
        };
        if !parallel || total < PARALLEL_MIN_BYTES || b == 1 {
            run(0, out)?;
        } else {
            let per_task = (TASK_BYTES / rb).clamp(1, b.div_ceil(rayon::current_num_threads()).max(1));
            let tasks: Vec<(usize, &mut [MaybeUninit<u8>])> =
                out.chunks_mut(rb * per_task).enumerate().map(|(t, c)| (t * per_task, c)).collect();
            run_parallel(tasks, |(lo, chunk)| run(lo, chunk))?;
        }
    }
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
            let mut ctx = core.decoder.context();
            let base = cu[lo] as usize * esize;
            for k in lo..(lo + PREFETCH_AHEAD).min(hi) {
                core.prefetch(ids.get(k));
            }
            for k in lo..hi {
                if k + PREFETCH_AHEAD < hi {
                    core.prefetch(ids.get(k + PREFETCH_AHEAD));
                }
                let a = cu[k] as usize * esize - base;
                let z = cu[k + 1] as usize * esize - base;
                core.read_into(&mut ctx, ids.get(k), Some(&shapes[k * nd..(k + 1) * nd]), &mut region[a..z], verify)?;
            }
            Ok(())
        };
        if !parallel || values_bytes < PARALLEL_MIN_BYTES {
            decode_run(0, b, values)?;
        } else {
            let target = (values_bytes / (rayon::current_num_threads() * 4)).clamp(16 << 10, TASK_BYTES);
            let mut tasks: Vec<(usize, usize, &mut [MaybeUninit<u8>])> = Vec::new();
            let mut rest = values;
            let mut lo = 0usize;
            while lo < b {
                let mut hi = lo + 1;
                while hi < b && (cu[hi] - cu[lo]) as usize * esize < target {
                    hi += 1;
                }
                let n = (cu[hi] - cu[lo]) as usize * esize;
                let (mine, tail) = rest.split_at_mut(n);
                rest = tail;
                tasks.push((lo, hi, mine));
                lo = hi;
            }
            run_parallel(tasks, |(lo, hi, region)| decode_run(lo, hi, region))?;
        }
    }
    core.check_files_intact()?;
    // SAFETY: values (all `values_bytes`), cu_seqlens (`b + 1` int32) and shapes (`b * nd`
    // uint64) were all written above; padding between them is never exposed.
    Ok(unsafe { layout.batch(Arc::new(alloc), core.dtype, b, nd) })
}
