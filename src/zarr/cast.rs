//! Element casts on assembly (source dtype -> requested output dtype) and the run walker that
//! writes a decoded chunk's selected voxels into a sample's slot.

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::zarr::select::Run;

/// Converts `n` contiguous elements from `src` to `dst` (both possibly unaligned).
pub(crate) type Kernel = unsafe fn(*const u8, *mut u8, usize);

/// Plain copy of `n` elements of `SIZE` bytes.
unsafe fn copy_kernel<const SIZE: usize>(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: the caller guarantees `n * SIZE` readable bytes at `src`, writable at `dst`, and
    // that the regions do not overlap (a decoded chunk and the output slot).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n * SIZE) }
}

trait Real: Copy {
    fn f32(self) -> f32;
    fn f64(self) -> f64;
}

macro_rules! real_prim {
    ($($t:ty),*) => {$(
        impl Real for $t {
            #[inline(always)]
            fn f32(self) -> f32 { self as f32 }
            #[inline(always)]
            fn f64(self) -> f64 { self as f64 }
        }
    )*};
}
real_prim!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

macro_rules! real_half {
    ($($t:ty),*) => {$(
        impl Real for $t {
            #[inline(always)]
            fn f32(self) -> f32 { self.to_f32() }
            #[inline(always)]
            fn f64(self) -> f64 { self.to_f64() }
        }
    )*};
}
real_half!(f16, bf16);

macro_rules! conv_kernel {
    ($s:ty, $d:ty, $f:expr) => {{
        unsafe fn k(src: *const u8, dst: *mut u8, n: usize) {
            let f: fn($s) -> $d = $f;
            let (src, dst) = (src.cast::<$s>(), dst.cast::<$d>());
            for i in 0..n {
                // SAFETY: the caller guarantees `n` readable source and writable destination
                // elements; unaligned accesses because decoded chunk buffers carry no alignment
                // promise.
                unsafe { dst.add(i).write_unaligned(f(src.add(i).read_unaligned())) }
            }
        }
        k as Kernel
    }};
}

/// Float targets from any real source.
macro_rules! to_float {
    ($s:ty, $dst:expr) => {
        match $dst {
            DType::Float32 => Some(conv_kernel!($s, f32, |x| Real::f32(x))),
            DType::Float64 => Some(conv_kernel!($s, f64, |x| Real::f64(x))),
            DType::Float16 => Some(conv_kernel!($s, f16, |x| f16::from_f64(Real::f64(x)))),
            DType::BFloat16 => Some(conv_kernel!($s, bf16, |x| bf16::from_f64(Real::f64(x)))),
            _ => None,
        }
    };
}

/// Lossless integer widenings.
macro_rules! widen {
    ($s:ty, $dst:expr, [$(($dt:ident, $d:ty)),*]) => {
        match $dst {
            $(DType::$dt => Some(conv_kernel!($s, $d, |x| <$d>::from(x))),)*
            _ => None,
        }
    };
}

/// The kernel converting `src` elements to `dst`: the same type (a copy), any real type to
/// float32 / float64 / float16 / bfloat16, and integer widenings that lose nothing.
pub(crate) fn kernel(src: DType, dst: DType) -> Result<Kernel> {
    if src == dst {
        return Ok(match src.size() {
            1 => copy_kernel::<1>,
            2 => copy_kernel::<2>,
            4 => copy_kernel::<4>,
            8 => copy_kernel::<8>,
            16 => copy_kernel::<16>,
            _ => return Err(Error::invalid("dtype", format!("{src} has no copy kernel"))),
        });
    }
    let k = match src {
        DType::Bool | DType::UInt8 => to_float!(u8, dst).or_else(|| widen!(u8, dst, [(UInt16, u16), (UInt32, u32), (UInt64, u64), (Int16, i16), (Int32, i32), (Int64, i64)])),
        DType::UInt16 => to_float!(u16, dst).or_else(|| widen!(u16, dst, [(UInt32, u32), (UInt64, u64), (Int32, i32), (Int64, i64)])),
        DType::UInt32 => to_float!(u32, dst).or_else(|| widen!(u32, dst, [(UInt64, u64), (Int64, i64)])),
        DType::UInt64 => to_float!(u64, dst),
        DType::Int8 => to_float!(i8, dst).or_else(|| widen!(i8, dst, [(Int16, i16), (Int32, i32), (Int64, i64)])),
        DType::Int16 => to_float!(i16, dst).or_else(|| widen!(i16, dst, [(Int32, i32), (Int64, i64)])),
        DType::Int32 => to_float!(i32, dst).or_else(|| widen!(i32, dst, [(Int64, i64)])),
        DType::Int64 => to_float!(i64, dst),
        DType::Float16 => to_float!(f16, dst),
        DType::BFloat16 => to_float!(bf16, dst),
        DType::Float32 => to_float!(f32, dst),
        DType::Float64 => to_float!(f64, dst),
        _ => None,
    };
    // A bool source only widens to integers / floats as 0 / 1 (it is stored as one byte).
    k.ok_or_else(|| {
        Error::invalid(
            "dtype",
            format!("cannot cast {src} to {dst}: outputs are the source type, float32, float64, float16, bfloat16, or an integer type that holds every {src} value"),
        )
    })
}

/// The fill value converted to the output type.
pub(crate) fn convert_one(k: Kernel, src: &[u8], dst_size: usize) -> Vec<u8> {
    let mut out = vec![0u8; dst_size];
    // SAFETY: `src` holds one source element, `out` one destination element.
    unsafe { k(src.as_ptr(), out.as_mut_ptr(), 1) };
    out
}

/// A raw output pointer shared by the tasks of one batch. Tasks write disjoint elements.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub *mut u8);
// SAFETY: the pointer targets one output allocation that outlives the batch's tasks, and every
// task writes a disjoint set of elements (each output element maps to exactly one source
// element, which lies in exactly one chunk), so sharing it across threads cannot race.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// The address `offset` bytes in.
    ///
    /// # Safety
    /// `offset` must lie inside the output allocation.
    #[inline]
    pub(crate) unsafe fn at(self, offset: usize) -> *mut u8 {
        // SAFETY: the caller keeps `offset` inside the allocation.
        unsafe { self.0.add(offset) }
    }
}

/// Copy the selected voxels of one decoded chunk into a sample slot.
///
/// `src` is the chunk in C order with element strides `src_strides`; `dst` the slot (output
/// type) with element strides `dst_strides`; `runs[d]` the runs along axis `d`. `copy` is the
/// element size when the kernel is a plain copy (the innermost runs are then `memcpy`s).
///
/// # Safety
/// Every run must lie inside the chunk and the slot; `dst` must be valid for writes of the
/// slot's elements and not be read or written elsewhere at the same elements.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scatter(
    k: Kernel,
    copy: Option<usize>,
    src: *const u8,
    src_size: usize,
    src_strides: &[u64],
    dst: *mut u8,
    dst_size: usize,
    dst_strides: &[u64],
    runs: &[&[Run]],
) {
    if runs.is_empty() {
        // SAFETY: a 0-d array: one element each side.
        unsafe { k(src, dst, 1) };
        return;
    }
    let w = Walk { k, copy, src_size, dst_size, src_strides, dst_strides, runs };
    // SAFETY: forwarded from the caller.
    unsafe { w.walk(0, src, dst) }
}

struct Walk<'a> {
    k: Kernel,
    copy: Option<usize>,
    src_size: usize,
    dst_size: usize,
    src_strides: &'a [u64],
    dst_strides: &'a [u64],
    runs: &'a [&'a [Run]],
}

impl Walk<'_> {
    /// Axis `d` onwards, from element addresses `src` / `dst` of the outer position.
    unsafe fn walk(&self, d: usize, src: *const u8, dst: *mut u8) {
        let (ss, ds) = (self.src_strides[d] as usize * self.src_size, self.dst_strides[d] as usize * self.dst_size);
        if d + 1 == self.runs.len() {
            for r in self.runs[d] {
                // SAFETY: the caller's contract: each run lies inside both buffers.
                unsafe {
                    let (s, t) = (src.add(r.src as usize * ss), dst.add(r.dst as usize * ds));
                    match self.copy {
                        Some(size) => std::ptr::copy_nonoverlapping(s, t, r.len as usize * size),
                        None => (self.k)(s, t, r.len as usize),
                    }
                }
            }
            return;
        }
        if let (true, Some(size), [inner]) = (d + 2 == self.runs.len(), self.copy, self.runs[d + 1]) {
            // The last two axes of a plain copy whose rows are one run each (a crop's part of
            // one chunk): one copy per row, without a call per row. A batch of crops is
            // mostly rows of a few dozen elements, so the per-row cost decides the cached path.
            let (s_row, d_row) = (self.src_strides[d + 1] as usize * self.src_size, self.dst_strides[d + 1] as usize * self.dst_size);
            let (s_off, d_off, n) = (inner.src as usize * s_row, inner.dst as usize * d_row, inner.len as usize * size);
            for r in self.runs[d] {
                // SAFETY: as above: row `r.src + i` of the chunk and `r.dst + i` of the slot,
                // `n` bytes at the inner run's offsets, lie inside both buffers.
                unsafe {
                    let mut s = src.add(r.src as usize * ss + s_off);
                    let mut t = dst.add(r.dst as usize * ds + d_off);
                    for _ in 0..r.len {
                        std::ptr::copy_nonoverlapping(s, t, n);
                        s = s.add(ss);
                        t = t.add(ds);
                    }
                }
            }
            return;
        }
        for r in self.runs[d] {
            for i in 0..r.len as usize {
                // SAFETY: as above, for the outer axes' positions.
                unsafe { self.walk(d + 1, src.add((r.src as usize + i) * ss), dst.add((r.dst as usize + i) * ds)) };
            }
        }
    }
}

/// Write `n` copies of the element `fill` from `dst` on (doubling copies, no buffer).
///
/// # Safety
/// `dst` must be valid for writes of `n * fill.len()` bytes, not used elsewhere meanwhile.
pub(crate) unsafe fn fill_repeat(dst: *mut u8, n: usize, fill: &[u8]) {
    let total = n * fill.len();
    if total == 0 {
        return;
    }
    if fill.iter().all(|&b| b == fill[0]) {
        // SAFETY: `total` writable bytes at `dst` (the caller's contract).
        unsafe { std::ptr::write_bytes(dst, fill[0], total) };
        return;
    }
    // SAFETY: the first element, then copies of the already written prefix into the
    // following, disjoint bytes, all inside the `total` bytes the caller gave.
    unsafe {
        std::ptr::copy_nonoverlapping(fill.as_ptr(), dst, fill.len());
        let mut done = fill.len();
        while done < total {
            let k = done.min(total - done);
            std::ptr::copy_nonoverlapping(dst, dst.add(done), k);
            done += k;
        }
    }
}

/// Write `fill` (one output element) at every position the runs select.
///
/// # Safety
/// As [`scatter`] for the destination.
pub(crate) unsafe fn fill_runs(fill: &[u8], dst: *mut u8, dst_strides: &[u64], runs: &[&[Run]]) {
    let size = fill.len();
    let longest = runs.last().map(|rs| rs.iter().map(|r| r.len).max().unwrap_or(0)).unwrap_or(1) as usize;
    let row: Vec<u8> = fill.iter().copied().cycle().take(longest.max(1) * size).collect();
    let zero_strides = vec![0u64; runs.len()];
    // A source that repeats `fill` along the innermost axis, with zero outer strides.
    let k: Kernel = match size {
        1 => copy_kernel::<1>,
        2 => copy_kernel::<2>,
        4 => copy_kernel::<4>,
        8 => copy_kernel::<8>,
        _ => copy_kernel::<16>,
    };
    // Runs read from `row` at src offsets r.src: rebase every innermost run to 0.
    let mut rebased: Vec<Vec<Run>> = runs.iter().map(|r| r.to_vec()).collect();
    if let Some(l) = rebased.last_mut() {
        for r in l.iter_mut() {
            r.src = 0;
        }
    }
    let refs: Vec<&[Run]> = rebased.iter().map(|v| v.as_slice()).collect();
    // SAFETY: `row` holds `longest` elements, the most any innermost run reads from offset 0
    // with zero strides; the destination contract is the caller's.
    unsafe { scatter(k, Some(size), row.as_ptr(), size, &zero_strides, dst, size, dst_strides, &refs) };
}

/// C-order element strides of `shape`.
pub(crate) fn strides(shape: &[u64]) -> Vec<u64> {
    let mut s = vec![1u64; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn casts_match_reference() {
        let k = kernel(DType::UInt16, DType::Float32).unwrap();
        let src: Vec<u16> = vec![0, 1, 65535, 300];
        let mut dst = vec![0f32; 4];
        // SAFETY: `src` holds 4 u16 and `dst` 4 f32: the kernel reads and writes 4 elements.
        unsafe { k(src.as_ptr().cast(), dst.as_mut_ptr().cast(), 4) };
        assert_eq!(dst, vec![0.0, 1.0, 65535.0, 300.0]);
        let k = kernel(DType::Float32, DType::BFloat16).unwrap();
        let src = [1.0f32, -2.5, 1.3125];
        let mut dst = [bf16::ZERO; 3];
        // SAFETY: 3 f32 in, 3 bf16 out, as the kernel's types.
        unsafe { k(src.as_ptr().cast(), dst.as_mut_ptr().cast(), 3) };
        assert_eq!(dst, [bf16::from_f32(1.0), bf16::from_f32(-2.5), bf16::from_f32(1.3125)]);
        let k = kernel(DType::Int16, DType::Int64).unwrap();
        let src = [-5i16, 7];
        let mut dst = [0i64; 2];
        // SAFETY: 2 i16 in, 2 i64 out, as the kernel's types.
        unsafe { k(src.as_ptr().cast(), dst.as_mut_ptr().cast(), 2) };
        assert_eq!(dst, [-5, 7]);
        for (s, d) in [(DType::UInt16, DType::Int16), (DType::Float32, DType::Int32), (DType::Int32, DType::UInt32), (DType::Complex64, DType::Float32)] {
            assert!(kernel(s, d).is_err(), "{s} -> {d} must be refused");
        }
    }

    #[test]
    fn fill_repeat_writes_every_element() {
        for n in [0usize, 1, 3, 64, 1000] {
            let mut out = vec![0u8; n * 4 + 4];
            // SAFETY: `out` has room for n 4-byte elements (and 4 more bytes, checked untouched).
            unsafe { fill_repeat(out.as_mut_ptr(), n, &0x0102_0304u32.to_ne_bytes()) };
            assert!(out[..n * 4].chunks(4).all(|c| c == 0x0102_0304u32.to_ne_bytes()));
            assert_eq!(&out[n * 4..], &[0, 0, 0, 0], "wrote past the end for n = {n}");
            let mut same = vec![0u8; n * 2];
            // SAFETY: `same` holds exactly n 2-byte elements.
            unsafe { fill_repeat(same.as_mut_ptr(), n, &[9, 9]) };
            assert!(same.iter().all(|&b| b == 9));
        }
    }

    #[test]
    fn scatter_runs_2d() {
        // chunk 3x4, values 0..12; take rows [2, 0], cols [1..3) and [3] -> out 2x3
        let src: Vec<u8> = (0..12).collect();
        let mut out = vec![255u8; 6];
        let rows = [Run { src: 2, dst: 0, len: 1 }, Run { src: 0, dst: 1, len: 1 }];
        let cols = [Run { src: 1, dst: 0, len: 2 }, Run { src: 3, dst: 2, len: 1 }];
        let k = kernel(DType::UInt8, DType::UInt8).unwrap();
        // SAFETY: the runs stay inside the 3x4 source and the 2x3 output (1-byte elements).
        unsafe { scatter(k, None, src.as_ptr(), 1, &strides(&[3, 4]), out.as_mut_ptr(), 1, &strides(&[2, 3]), &[&rows, &cols]) };
        assert_eq!(out, vec![9, 10, 11, 1, 2, 3]);
        let mut out2 = vec![0u16; 6];
        // SAFETY: the runs stay inside the 2x3 u16 output.
        unsafe { fill_runs(&7u16.to_ne_bytes(), out2.as_mut_ptr().cast(), &strides(&[2, 3]), &[&rows[..1], &cols]) };
        assert_eq!(out2, vec![7, 7, 7, 0, 0, 0]);
    }

    #[test]
    fn scatter_copies_3d_crops_row_by_row() {
        // A 4x5x6 u16 chunk, values 0..120; z rows [1..3) -> out z 0..2, y [0..2) -> 1..3 and
        // [4] -> 0, x one run [2..5) -> 1..4 (one copy per row) and, second case, two x runs
        // (the general walk): both against a reference computed element by element.
        let src: Vec<u16> = (0..120).collect();
        let zs = [Run { src: 1, dst: 0, len: 2 }];
        let ys = [Run { src: 4, dst: 0, len: 1 }, Run { src: 0, dst: 1, len: 2 }];
        let one_x = [Run { src: 2, dst: 1, len: 3 }];
        let two_x = [Run { src: 0, dst: 0, len: 1 }, Run { src: 3, dst: 2, len: 2 }];
        let k = kernel(DType::UInt16, DType::UInt16).unwrap();
        for xs in [&one_x[..], &two_x[..]] {
            let mut out = vec![u16::MAX; 2 * 3 * 4];
            // SAFETY: every run stays inside the 4x5x6 source and the 2x3x4 output.
            unsafe { scatter(k, Some(2), src.as_ptr().cast(), 2, &strides(&[4, 5, 6]), out.as_mut_ptr().cast(), 2, &strides(&[2, 3, 4]), &[&zs, &ys, xs]) };
            let mut want = vec![u16::MAX; 2 * 3 * 4];
            for z in &zs {
                for y in &ys {
                    for x in xs {
                        for (i, j, l) in run_positions(z, y, x) {
                            want[(z.dst as usize + i) * 12 + (y.dst as usize + j) * 4 + x.dst as usize + l] = src[(z.src as usize + i) * 30 + (y.src as usize + j) * 6 + x.src as usize + l];
                        }
                    }
                }
            }
            assert_eq!(out, want, "x runs {xs:?}");
        }
    }

    fn run_positions(z: &Run, y: &Run, x: &Run) -> Vec<(usize, usize, usize)> {
        let mut v = Vec::new();
        for i in 0..z.len as usize {
            for j in 0..y.len as usize {
                for l in 0..x.len as usize {
                    v.push((i, j, l));
                }
            }
        }
        v
    }
}
