//! Tensors backed by pooled allocations, the packed ragged batch, and borrowed input views.

use std::sync::Arc;

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::memory::{Allocation, Allocator};

/// A dense, C-contiguous, immutable tensor living in (part of) an [`Allocation`].
///
/// Cloning shares the allocation; the region returns to its pool when the last clone, DLPack
/// capsule or Arrow buffer referring to it is dropped.
#[derive(Clone)]
pub struct Tensor {
    alloc: Arc<Allocation>,
    offset: usize,
    dtype: DType,
    shape: Vec<usize>,
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({}, {:?})", self.dtype, self.shape)
    }
}

pub(crate) fn numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl Tensor {
    /// Wrap bytes `offset..offset + numel(shape) * dtype.size()` of `alloc`.
    ///
    /// # Safety
    /// Every byte of that range must have been initialised, and nothing may write to it
    /// afterwards (the tensor hands out shared slices of it).
    pub(crate) unsafe fn from_initialized(
        alloc: Arc<Allocation>,
        offset: usize,
        dtype: DType,
        shape: Vec<usize>,
    ) -> Tensor {
        debug_assert!(
            offset + numel(&shape).unwrap_or(usize::MAX) * dtype.size() <= alloc.capacity()
        );
        Tensor { alloc, offset, dtype, shape }
    }

    /// Copy typed data into a fresh allocation with the given shape.
    pub fn from_slice<T: Element>(allocator: &Allocator, data: &[T], shape: &[usize]) -> Result<Tensor> {
        let n = numel(shape).ok_or_else(|| Error::invalid("shape", format!("{shape:?} overflows")))?;
        if n != data.len() {
            return Err(Error::ShapeMismatch {
                expected: format!("{n} elements for shape {shape:?}"),
                found: format!("{} elements", data.len()),
            });
        }
        let bytes = std::mem::size_of_val(data);
        let mut alloc = allocator.allocate(bytes)?;
        // SAFETY: source and destination are distinct regions of at least `bytes` bytes; `T`
        // is plain old data (the `Element` contract).
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().cast::<u8>(), alloc.as_mut_ptr(), bytes) };
        // SAFETY: the first `bytes` bytes were just written and are not written again.
        Ok(unsafe { Tensor::from_initialized(Arc::new(alloc), 0, T::DTYPE, shape.to_vec()) })
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape (C order).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape).unwrap_or(0)
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }

    /// Address of the first element.
    pub fn data_ptr(&self) -> *const u8 {
        // SAFETY: `offset` lies within the allocation (checked at construction).
        unsafe { self.alloc.as_ptr().add(self.offset) }
    }

    /// The raw bytes, in C order.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: the constructor's contract: these bytes are initialised and never written
        // while any Tensor exists; the allocation outlives `&self`.
        unsafe { std::slice::from_raw_parts(self.data_ptr(), self.nbytes()) }
    }

    /// The elements as a typed slice; errors when `T` is not the tensor's dtype.
    pub fn as_slice<T: Element>(&self) -> Result<&[T]> {
        if T::DTYPE != self.dtype {
            return Err(Error::DtypeMismatch { expected: self.dtype, found: T::DTYPE, what: "typed view of a tensor".into() });
        }
        let p = self.data_ptr();
        if !(p as usize).is_multiple_of(std::mem::align_of::<T>()) {
            return Err(Error::invalid("tensor", "data is not aligned for the element type"));
        }
        // SAFETY: dtype matches `T` (same size, POD), the pointer is aligned for `T` and the
        // range is initialised (see `as_bytes`).
        Ok(unsafe { std::slice::from_raw_parts(p.cast::<T>(), self.numel()) })
    }

    /// The allocation this tensor lives in (shared with its batch siblings).
    pub fn allocation(&self) -> &Arc<Allocation> {
        &self.alloc
    }

    /// A borrowed view, valid `append` input.
    pub fn view(&self) -> TensorView<'_> {
        TensorView::new(self.as_bytes(), self.dtype, self.shape.clone())
    }

    /// Record `i` along the first axis, without copying (shares the allocation).
    pub fn index_axis0(&self, i: usize) -> Result<Tensor> {
        let n = *self.shape.first().ok_or_else(|| Error::invalid("tensor", "0-d tensor has no axis 0"))?;
        if i >= n {
            return Err(Error::invalid("index", format!("{i} out of range for axis 0 of length {n}")));
        }
        let inner = self.shape[1..].to_vec();
        let stride = numel(&inner).unwrap_or(0) * self.dtype.size();
        Ok(Tensor { alloc: self.alloc.clone(), offset: self.offset + i * stride, dtype: self.dtype, shape: inner })
    }

    /// The same elements with another shape of equal element count (no copy).
    pub fn reshaped(&self, shape: Vec<usize>) -> Result<Tensor> {
        if numel(&shape) != Some(self.numel()) {
            return Err(Error::ShapeMismatch { expected: format!("{} elements", self.numel()), found: format!("shape {shape:?}") });
        }
        Ok(Tensor { alloc: self.alloc.clone(), offset: self.offset, dtype: self.dtype, shape })
    }

    /// The same bytes as another dtype and shape of equal byte size (no copy).
    pub fn reinterpret(&self, dtype: DType, shape: Vec<usize>) -> Result<Tensor> {
        let n = numel(&shape).and_then(|n| n.checked_mul(dtype.size()));
        if n != Some(self.nbytes()) || !(self.data_ptr() as usize).is_multiple_of(dtype.size()) {
            return Err(Error::ShapeMismatch { expected: format!("{} bytes", self.nbytes()), found: format!("{dtype} {shape:?}") });
        }
        Ok(Tensor { alloc: self.alloc.clone(), offset: self.offset, dtype, shape })
    }

    /// The sub-tensor of `shape` starting `byte_offset` bytes into this one; it must lie
    /// within this tensor's bytes (checked: offsets may come from memory a consumer wrote).
    pub(crate) fn sub(&self, byte_offset: usize, shape: Vec<usize>) -> Result<Tensor> {
        let bytes = numel(&shape).and_then(|n| n.checked_mul(self.dtype.size()));
        match bytes.and_then(|b| byte_offset.checked_add(b)) {
            Some(end) if end <= self.nbytes() => Ok(Tensor { alloc: self.alloc.clone(), offset: self.offset + byte_offset, dtype: self.dtype, shape }),
            _ => Err(Error::ragged(format!(
                "a view of shape {shape:?} at byte {byte_offset} does not fit in a tensor of {} bytes",
                self.nbytes()
            ))),
        }
    }
}

/// Where values, offsets and shapes of a ragged batch sit in its one allocation.
pub(crate) struct RaggedLayout {
    pub(crate) values_bytes: usize,
    pub(crate) cu_off: usize,
    pub(crate) shapes_off: usize,
    pub(crate) total: usize,
}

impl RaggedLayout {
    pub(crate) fn new(values_bytes: usize, n: usize, ndim: usize) -> RaggedLayout {
        let cu_off = values_bytes.div_ceil(64) * 64;
        let shapes_off = (cu_off + (n + 1) * 4).div_ceil(64) * 64;
        RaggedLayout { values_bytes, cu_off, shapes_off, total: shapes_off + n * ndim * 8 }
    }

    /// # Safety
    /// All three regions of `alloc` must be initialised.
    pub(crate) unsafe fn batch(&self, alloc: Arc<Allocation>, dtype: DType, n: usize, ndim: usize) -> RaggedBatch {
        let total = self.values_bytes / dtype.size().max(1);
        // SAFETY: per this function's contract.
        unsafe {
            RaggedBatch {
                values: Tensor::from_initialized(alloc.clone(), 0, dtype, vec![total]),
                cu_seqlens: Tensor::from_initialized(alloc.clone(), self.cu_off, DType::Int32, vec![n + 1]),
                shapes: Tensor::from_initialized(alloc, self.shapes_off, DType::UInt64, vec![n, ndim]),
            }
        }
    }
}

fn write_bytes(dst: &mut [std::mem::MaybeUninit<u8>], src: &[u8]) {
    let dst = &mut dst[..src.len()];
    // SAFETY: `dst` is exactly `src.len()` long (the slicing above panics otherwise, never
    // reached with the layouts above) and the regions are distinct.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), src.len()) };
}

fn pod_bytes<T: Element>(v: &[T]) -> &[u8] {
    // SAFETY: `T` is plain old data; the byte view covers exactly the slice.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// A packed batch of variable-shape records: `values` (1-D, the store dtype), `cu_seqlens`
/// (int32, `n + 1` record offsets in elements, starting at 0) and `shapes` (uint64, `[n, ndim]`).
/// All three live in one allocation.
#[derive(Clone, Debug)]
pub struct RaggedBatch {
    pub(crate) values: Tensor,
    pub(crate) cu_seqlens: Tensor,
    pub(crate) shapes: Tensor,
}

impl RaggedBatch {
    /// Pack typed records (each with its shape) into a batch in one fresh allocation.
    pub fn from_records<T: Element>(
        allocator: &Allocator,
        ndim: usize,
        records: &[(&[T], &[usize])],
    ) -> Result<RaggedBatch> {
        let views: Vec<TensorView<'_>> = records.iter().map(|(d, shape)| TensorView::from_slice(d, shape)).collect();
        RaggedBatch::pack(allocator, T::DTYPE, ndim, views.iter())
    }

    /// Copy a validated packed input into one fresh allocation.
    pub fn copy_from_input(allocator: &Allocator, input: &RaggedInput<'_>) -> Result<RaggedBatch> {
        let dtype = input.values.dtype;
        let ndim = input.shapes.shape.get(1).copied().unwrap_or(0);
        // A batch may hold empty records; writers decide whether a store accepts them.
        let valid = input.validate_with(dtype, ndim, true)?;
        let n = valid.len;
        let layout = RaggedLayout::new(input.values.bytes.len(), n, ndim);
        let mut alloc = allocator.allocate(layout.total)?;
        let out = alloc.as_uninit_mut();
        write_bytes(&mut out[..layout.values_bytes], input.values.bytes);
        write_bytes(&mut out[layout.cu_off..], pod_bytes(&valid.cu_seqlens));
        write_bytes(&mut out[layout.shapes_off..], pod_bytes(&valid.shapes));
        // SAFETY: the three regions were just written in full.
        Ok(unsafe { layout.batch(Arc::new(alloc), dtype, n, ndim) })
    }

    /// Pack C-contiguous records of one dtype and ndim into one fresh allocation.
    pub fn pack<'v>(allocator: &Allocator, dtype: DType, ndim: usize, records: impl Iterator<Item = &'v TensorView<'v>> + Clone) -> Result<RaggedBatch> {
        let mut n = 0usize;
        let mut values_bytes = 0usize;
        for (i, r) in records.clone().enumerate() {
            if r.dtype != dtype {
                return Err(Error::DtypeMismatch { expected: dtype, found: r.dtype, what: format!("record {i}") });
            }
            if r.shape.len() != ndim {
                return Err(Error::ShapeMismatch { expected: format!("{ndim}-d records"), found: format!("record {i} of shape {:?}", r.shape) });
            }
            r.check(&format!("record {i}"))?;
            values_bytes += r.bytes.len();
            n += 1;
        }
        let total = values_bytes / dtype.size().max(1);
        if total > i32::MAX as usize {
            return Err(Error::TooManyValues { count: total as u64, limit: i32::MAX as u64 });
        }
        let layout = RaggedLayout::new(values_bytes, n, ndim);
        let mut alloc = allocator.allocate(layout.total)?;
        let out = alloc.as_uninit_mut();
        let mut at = 0usize;
        let mut cu: Vec<i32> = Vec::with_capacity(n + 1);
        let mut shapes: Vec<u64> = Vec::with_capacity(n * ndim);
        cu.push(0);
        for r in records {
            write_bytes(&mut out[at..at + r.bytes.len()], r.bytes);
            at += r.bytes.len();
            cu.push((at / dtype.size()) as i32);
            shapes.extend(r.shape.iter().map(|&d| d as u64));
        }
        write_bytes(&mut out[layout.cu_off..], pod_bytes(&cu));
        write_bytes(&mut out[layout.shapes_off..], pod_bytes(&shapes));
        // SAFETY: values, offsets and shapes were all written above.
        Ok(unsafe { layout.batch(Arc::new(alloc), dtype, n, ndim) })
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.cu_seqlens.numel().saturating_sub(1)
    }

    /// True when the batch holds no record (`cu_seqlens == [0]`).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Dimensions of each record.
    pub fn ndim(&self) -> usize {
        self.shapes.shape().get(1).copied().unwrap_or(0)
    }

    /// Element type of the values.
    pub fn dtype(&self) -> DType {
        self.values.dtype()
    }

    /// Packed values, 1-D.
    pub fn values(&self) -> &Tensor {
        &self.values
    }

    /// int32 record offsets, `len() + 1` long.
    pub fn cu_seqlens(&self) -> &Tensor {
        &self.cu_seqlens
    }

    /// uint64 shapes, `[len(), ndim]`.
    pub fn shapes(&self) -> &Tensor {
        &self.shapes
    }

    /// Offsets as a slice.
    pub fn cu_seqlens_slice(&self) -> &[i32] {
        self.cu_seqlens.as_slice::<i32>().unwrap_or(&[])
    }

    /// Shapes as a flat slice (`len() * ndim`).
    pub fn shapes_slice(&self) -> &[u64] {
        self.shapes.as_slice::<u64>().unwrap_or(&[])
    }

    /// Record `i` as a shape-restored tensor view (no copy). Its offsets and shape row are
    /// checked first (they live in memory a DLPack consumer may have written).
    pub fn record(&self, i: usize) -> Result<Tensor> {
        if i >= self.len() {
            return Err(Error::invalid("index", format!("{i} out of range for batch of {} records", self.len())));
        }
        let (start, shape) = self.record_meta(i)?;
        let shape: Vec<usize> = shape.iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect();
        // `sub` bounds-checks against the values, so a cu_seqlens past the end is an error too.
        self.values.sub(start * self.dtype().size(), shape)
    }

    /// Record `i`'s first value and shape row, checked against each other (`i < len`).
    fn record_meta(&self, i: usize) -> Result<(usize, &[u64])> {
        let cu = self.cu_seqlens_slice();
        let nd = self.ndim();
        let row = self.shapes_slice().get(i * nd..(i + 1) * nd).ok_or_else(|| Error::ragged(format!("shapes has no row {i}")))?;
        let (a, b) = (cu[i], cu[i + 1]);
        let numel = row.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        if a < 0 || b < a || numel != Some((b - a) as u64) {
            return Err(Error::ragged(format!("record {i}: cu_seqlens [{a}, {b}) and shape {row:?} disagree (batch metadata was modified)")));
        }
        Ok((a as usize, row))
    }

    /// Check the batch's metadata: `cu_seqlens` starts at 0, never decreases and ends at the
    /// value count; every shape row holds its record's element count. Batches made here always
    /// pass; one whose exported `cu_seqlens` or `shapes` a consumer wrote to may not, and is
    /// then an error instead of an out-of-bounds read.
    pub fn check(&self) -> Result<()> {
        let cu = self.cu_seqlens_slice();
        let n = self.len();
        if cu.first() != Some(&0) {
            return Err(Error::ragged("cu_seqlens must start at 0 (batch metadata was modified)"));
        }
        for i in 0..n {
            self.record_meta(i)?;
        }
        if cu[n] as usize != self.values.numel() {
            return Err(Error::ragged(format!("cu_seqlens ends at {} but values hold {} elements (batch metadata was modified)", cu[n], self.values.numel())));
        }
        Ok(())
    }

    /// Every record as a tensor view (each record's metadata checked).
    pub fn to_tensors(&self) -> Result<Vec<Tensor>> {
        (0..self.len()).map(|i| self.record(i)).collect()
    }

    /// A borrowed view, valid `append` input (a gathered batch transcodes directly).
    pub fn as_input(&self) -> RaggedInput<'_> {
        RaggedInput { values: self.values.view(), cu_seqlens: self.cu_seqlens.view(), shapes: self.shapes.view() }
    }
}

/// A borrowed, possibly strided n-d array: the input of `DenseWriter::append`.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
    pub(crate) strides: Option<Vec<isize>>,
}

impl<'a> TensorView<'a> {
    /// A C-contiguous view of `bytes` as `dtype` with `shape`.
    pub fn new(bytes: &'a [u8], dtype: DType, shape: Vec<usize>) -> Self {
        TensorView { bytes, dtype, shape, strides: None }
    }

    /// A C-contiguous view of a typed slice.
    pub fn from_slice<T: Element>(data: &'a [T], shape: &[usize]) -> Self {
        // SAFETY: `T` is plain old data; the byte view covers exactly the slice.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        TensorView::new(bytes, T::DTYPE, shape.to_vec())
    }

    /// Declare strides (in elements), as a producer such as DLPack reports them. Appends
    /// accept only strides that describe C-contiguous memory.
    pub fn with_strides(mut self, strides: Vec<isize>) -> Self {
        self.strides = Some(strides);
        self
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Check strides describe C-contiguous memory and the byte length matches the shape.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        if let Some(strides) = &self.strides {
            let bad = || Error::NotContiguous { what: what.to_string(), shape: self.shape.clone(), strides: strides.clone() };
            if strides.len() != self.shape.len() {
                return Err(bad());
            }
            let mut expected: isize = 1;
            // An empty array addresses no element: its strides are irrelevant.
            let empty = self.shape.contains(&0);
            for (&dim, &st) in self.shape.iter().zip(strides).rev() {
                if empty {
                    break;
                }
                if dim > 1 && st != expected {
                    return Err(bad());
                }
                expected = expected.saturating_mul(dim as isize);
            }
        }
        let n = numel(&self.shape).ok_or_else(|| Error::invalid("shape", format!("{:?} overflows", self.shape)))?;
        let want = n.checked_mul(self.dtype.size());
        if want != Some(self.bytes.len()) {
            return Err(Error::ShapeMismatch {
                expected: format!("{} bytes for {what} of shape {:?} {}", want.unwrap_or(usize::MAX), self.shape, self.dtype),
                found: format!("{} bytes", self.bytes.len()),
            });
        }
        Ok(())
    }

    pub(crate) fn typed<T: Element>(&self, what: &str) -> Result<std::borrow::Cow<'a, [T]>> {
        if self.dtype != T::DTYPE {
            return Err(Error::DtypeMismatch { expected: T::DTYPE, found: self.dtype, what: what.to_string() });
        }
        self.check(what)?;
        let n = self.bytes.len() / std::mem::size_of::<T>();
        if (self.bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()) {
            // SAFETY: aligned, in bounds, POD element type (checked dtype).
            Ok(std::borrow::Cow::Borrowed(unsafe { std::slice::from_raw_parts(self.bytes.as_ptr().cast::<T>(), n) }))
        } else {
            // Misaligned producer memory: copy the (small) metadata array.
            let mut v = Vec::<T>::with_capacity(n);
            // SAFETY: `v` has room for `n` elements; bytes are POD of the same total size.
            unsafe {
                std::ptr::copy_nonoverlapping(self.bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), self.bytes.len());
                v.set_len(n);
            }
            Ok(std::borrow::Cow::Owned(v))
        }
    }
}

/// Borrowed packed ragged input: the input of `RaggedWriter::append`.
#[derive(Clone, Debug)]
pub struct RaggedInput<'a> {
    /// 1-D packed values.
    pub values: TensorView<'a>,
    /// int32 `[n + 1]` offsets.
    pub cu_seqlens: TensorView<'a>,
    /// uint64 `[n, ndim]` shapes.
    pub shapes: TensorView<'a>,
}

impl<'a> RaggedInput<'a> {
    /// Three borrowed views.
    pub fn new(values: TensorView<'a>, cu_seqlens: TensorView<'a>, shapes: TensorView<'a>) -> Self {
        RaggedInput { values, cu_seqlens, shapes }
    }

    /// From typed slices; `shapes` is row-major `[n, ndim]`.
    pub fn from_slices<T: Element>(values: &'a [T], cu_seqlens: &'a [i32], shapes: &'a [u64], ndim: usize) -> Self {
        let n = cu_seqlens.len().saturating_sub(1);
        RaggedInput {
            values: TensorView::from_slice(values, &[values.len()]),
            cu_seqlens: TensorView::from_slice(cu_seqlens, &[cu_seqlens.len()]),
            shapes: TensorView::from_slice(shapes, &[n, ndim]),
        }
    }
}

/// The checked metadata of a [`RaggedInput`].
#[derive(Debug)]
pub struct ValidRagged<'a> {
    /// Number of records.
    pub len: usize,
    /// Offsets (`len + 1`).
    pub cu_seqlens: std::borrow::Cow<'a, [i32]>,
    /// Shapes (`len * ndim`).
    pub shapes: std::borrow::Cow<'a, [u64]>,
}

impl<'a> RaggedInput<'a> {
    /// Check the packed-batch contract against a store's `dtype` and `ndim`: 1-D contiguous
    /// values of that dtype, int32 offsets starting at 0, strictly increasing (records are
    /// nonempty) and ending at the value count, uint64 shapes `[n, ndim]` agreeing with the
    /// offsets, at most `i32::MAX` values.
    pub fn validate(&self, dtype: DType, ndim: usize) -> Result<ValidRagged<'a>> {
        self.validate_with(dtype, ndim, false)
    }

    /// [`RaggedInput::validate`], with empty records (equal consecutive offsets, a zero extent
    /// in the shape) accepted when `allow_empty`.
    pub fn validate_with(&self, dtype: DType, ndim: usize, allow_empty: bool) -> Result<ValidRagged<'a>> {
        let v = &self.values;
        if v.dtype != dtype {
            return Err(Error::DtypeMismatch { expected: dtype, found: v.dtype, what: "store vs input".into() });
        }
        if v.shape.len() != 1 {
            return Err(Error::ShapeMismatch { expected: "1-D values".into(), found: format!("values of shape {:?}", v.shape) });
        }
        v.check("values")?;
        let nvals = v.shape[0] as u64;
        if nvals > i32::MAX as u64 {
            return Err(Error::TooManyValues { count: nvals, limit: i32::MAX as u64 });
        }
        if self.cu_seqlens.shape.len() != 1 {
            return Err(Error::ShapeMismatch { expected: "1-D cu_seqlens".into(), found: format!("{:?}", self.cu_seqlens.shape) });
        }
        // Owned copies, validated and then used: memory the caller shares with other threads
        // (a Python buffer while the GIL is released) may change after the check, and the
        // offsets decide which bytes are read.
        let cu: std::borrow::Cow<'a, [i32]> = std::borrow::Cow::Owned(self.cu_seqlens.typed::<i32>("cu_seqlens")?.into_owned());
        let shapes: std::borrow::Cow<'a, [u64]> = std::borrow::Cow::Owned(self.shapes.typed::<u64>("shapes")?.into_owned());
        if cu.is_empty() {
            return Err(Error::ragged("cu_seqlens is empty; it needs n + 1 offsets starting at 0"));
        }
        let n = cu.len() - 1;
        if self.shapes.shape != [n, ndim] {
            return Err(Error::ShapeMismatch {
                expected: format!("shapes ({n}, {ndim}) for {n} records of ndim {ndim}"),
                found: format!("{:?}", self.shapes.shape),
            });
        }
        if cu[0] != 0 {
            return Err(Error::ragged(format!("cu_seqlens must start at 0, starts at {}", cu[0])));
        }
        for k in 0..n {
            let (a, b) = (cu[k], cu[k + 1]);
            if b < a || (b == a && !allow_empty) {
                return Err(Error::ragged(if b == a {
                    format!("record {k} is empty (cu_seqlens[{k}] == cu_seqlens[{}] == {a}); stored records must be nonempty unless the writer allows empty records (allow_empty)", k + 1)
                } else {
                    format!("cu_seqlens must strictly increase: cu_seqlens[{}] = {b} < cu_seqlens[{k}] = {a}", k + 1)
                }));
            }
            let row = &shapes[k * ndim..(k + 1) * ndim];
            let numel = row.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
            if numel != Some((b - a) as u64) {
                return Err(Error::ragged(format!(
                    "record {k}: shape {row:?} holds {} elements but cu_seqlens gives {}",
                    numel.map(|x| x.to_string()).unwrap_or("overflowing".into()),
                    b - a
                )));
            }
        }
        if cu[n] as u64 != nvals {
            return Err(Error::ragged(format!("cu_seqlens ends at {} but values holds {nvals} elements", cu[n])));
        }
        Ok(ValidRagged { len: n, cu_seqlens: cu, shapes })
    }
}

/// Owned packed ragged data built from records: handy for building append input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PackedRagged<T> {
    /// Packed values.
    pub values: Vec<T>,
    /// Offsets, starting at 0.
    pub cu_seqlens: Vec<i32>,
    /// Row-major shapes `[n, ndim]`.
    pub shapes: Vec<u64>,
    /// Dimensions per record.
    pub ndim: usize,
}

impl<T: Element> PackedRagged<T> {
    /// Pack `(data, shape)` records. Errors on a shape whose element count differs from the
    /// data length, a wrong ndim, or more than `i32::MAX` values.
    pub fn from_records<'r>(ndim: usize, records: impl IntoIterator<Item = (&'r [T], &'r [usize])>) -> Result<Self> {
        let mut p = PackedRagged { values: Vec::new(), cu_seqlens: vec![0], shapes: Vec::new(), ndim };
        for (i, (data, shape)) in records.into_iter().enumerate() {
            if shape.len() != ndim {
                return Err(Error::ShapeMismatch { expected: format!("{ndim}-d record"), found: format!("record {i} of shape {shape:?}") });
            }
            if numel(shape) != Some(data.len()) {
                return Err(Error::ShapeMismatch { expected: format!("record {i}: shape {shape:?}"), found: format!("{} elements", data.len()) });
            }
            p.values.extend_from_slice(data);
            let end = i32::try_from(p.values.len()).map_err(|_| Error::TooManyValues { count: p.values.len() as u64, limit: i32::MAX as u64 })?;
            p.cu_seqlens.push(end);
            p.shapes.extend(shape.iter().map(|&d| d as u64));
        }
        Ok(p)
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Borrow as append input.
    pub fn as_input(&self) -> RaggedInput<'_> {
        RaggedInput::from_slices(&self.values, &self.cu_seqlens, &self.shapes, self.ndim)
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_from_slice_and_views() {
        let a = Allocator::cpu(1 << 20);
        let t = Tensor::from_slice(&a, &[1i32, 2, 3, 4, 5, 6], &[2, 3]).unwrap();
        assert_eq!(t.as_slice::<i32>().unwrap(), &[1, 2, 3, 4, 5, 6]);
        assert!(t.as_slice::<u32>().is_err());
        let r = t.index_axis0(1).unwrap();
        assert_eq!(r.shape(), &[3]);
        assert_eq!(r.as_slice::<i32>().unwrap(), &[4, 5, 6]);
        assert!(t.index_axis0(2).is_err());
        assert!(Tensor::from_slice(&a, &[1u8, 2], &[3]).is_err());
    }

    #[test]
    fn contiguity_check() {
        let data = [0f32; 6];
        let v = TensorView::from_slice(&data, &[2, 3]);
        assert!(v.check("x").is_ok());
        assert!(v.clone().with_strides(vec![3, 1]).check("x").is_ok());
        assert!(matches!(v.clone().with_strides(vec![1, 2]).check("x"), Err(Error::NotContiguous { .. })));
        // Size-1 dims may have any stride.
        let w = TensorView::from_slice(&data, &[1, 6]).with_strides(vec![99, 1]);
        assert!(w.check("x").is_ok());
        let short = TensorView::new(&[0u8; 5], DType::Float32, vec![2]);
        assert!(matches!(short.check("x"), Err(Error::ShapeMismatch { .. })));
    }

    #[test]
    fn ragged_from_records() {
        let a = Allocator::cpu(1 << 20);
        let r0 = [1i64, 2, 3];
        let r1 = [4i64];
        let b = RaggedBatch::from_records(&a, 1, &[(&r0[..], &[3][..]), (&r1[..], &[1][..])]).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.cu_seqlens_slice(), &[0, 3, 4]);
        assert_eq!(b.shapes_slice(), &[3, 1]);
        assert_eq!(b.record(1).unwrap().as_slice::<i64>().unwrap(), &[4]);
        assert!(b.record(2).is_err());
        let bad = RaggedBatch::from_records(&a, 1, &[(&r0[..], &[2][..])]);
        assert!(bad.is_err());
    }
}
