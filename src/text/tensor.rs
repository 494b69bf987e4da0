//! [`StringTensor`]: a batch of UTF-8 strings in Arrow's `Utf8View` layout.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, BooleanArray, LargeStringArray, StringArray, StringViewArray, UInt32Array, UInt64Array};
use arrow_buffer::{BooleanBuffer, Buffer, NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::DataType;
use rayon::prelude::*;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::RaggedBatch;

/// Rows handled per parallel task (below this many rows everything runs on the caller).
pub(crate) const ROWS_PER_TASK: usize = 4096;

/// Rows per parallel task for `n` rows holding `bytes` of string data: about 128 KiB of strings
/// per task (64..=4096 rows), so a batch of long documents still spreads over every thread.
pub(crate) fn rows_per_task(n: usize, bytes: usize) -> usize {
    let avg = bytes / n.max(1) + 16;
    (128 * 1024 / avg).clamp(64, ROWS_PER_TASK)
}

/// Whether `n` rows of `bytes` are worth splitting over the pool.
pub(crate) fn worth_parallel(n: usize, bytes: usize) -> bool {
    n >= 128 && (bytes >= 256 * 1024 || n >= 2 * ROWS_PER_TASK)
}

/// Longest string stored inline in its view.
const INLINE_MAX: usize = 12;

/// Bytes one data buffer of a view array may address (views hold u32 offsets).
const BUFFER_MAX: usize = u32::MAX as usize;

/// The integer type of an exchange layout's offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OffsetType {
    /// int32 offsets (Arrow `Utf8`), payload up to 2 GiB.
    Int32,
    /// int64 offsets (Arrow `LargeUtf8`).
    Int64,
    /// uint32 offsets (GPU buffers), payload up to 4 GiB.
    UInt32,
}

impl OffsetType {
    /// The offsets' element type.
    pub fn dtype(self) -> DType {
        match self {
            OffsetType::Int32 => DType::Int32,
            OffsetType::Int64 => DType::Int64,
            OffsetType::UInt32 => DType::UInt32,
        }
    }

    /// Largest payload the offsets can address.
    pub fn max_bytes(self) -> usize {
        match self {
            OffsetType::Int32 => i32::MAX as usize,
            OffsetType::Int64 => i64::MAX as usize,
            OffsetType::UInt32 => u32::MAX as usize,
        }
    }

    /// Parse `int32` / `int64` / `uint32` (also `i32`, `i64`, `u32`).
    pub fn parse(name: &str) -> Result<OffsetType> {
        match name {
            "int32" | "i32" => Ok(OffsetType::Int32),
            "int64" | "i64" => Ok(OffsetType::Int64),
            "uint32" | "u32" => Ok(OffsetType::UInt32),
            other => Err(Error::invalid("offsets", format!("'{other}' is not an offset type (int32, int64, uint32)"))),
        }
    }
}

/// What a length filter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LengthUnit {
    /// UTF-8 bytes.
    Bytes,
    /// Unicode scalar values (Python's `len(str)`).
    Chars,
}

/// A batch of UTF-8 strings (nulls allowed) in Arrow's `Utf8View` layout.
///
/// Cloning is cheap (buffers are shared). Conversions say what they copy: from `Utf8View`
/// nothing; from `Utf8` / `LargeUtf8`, offsets + bytes or a ragged utf8 batch only the 16-byte
/// views are built (the string bytes are shared); exports to an offsets layout copy the bytes
/// once (a view array's strings are not contiguous in general).
#[derive(Clone, Debug)]
pub struct StringTensor {
    array: StringViewArray,
}

impl StringTensor {
    /// Wrap a `Utf8View` array (zero-copy).
    pub fn new(array: StringViewArray) -> StringTensor {
        StringTensor { array }
    }

    /// Build from strings (copies them into one buffer).
    pub fn from_strs<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> StringTensor {
        let mut b = arrow_array::builder::StringViewBuilder::new();
        for s in items {
            b.append_value(s.as_ref());
        }
        StringTensor { array: b.finish() }
    }

    /// Build from optional strings (`None` is a null row).
    pub fn from_opt_strs<S: AsRef<str>>(items: impl IntoIterator<Item = Option<S>>) -> StringTensor {
        let mut b = arrow_array::builder::StringViewBuilder::new();
        for s in items {
            b.append_option(s.as_ref().map(|s| s.as_ref()));
        }
        StringTensor { array: b.finish() }
    }

    /// From any Arrow string array (`Utf8`, `LargeUtf8`, `Utf8View`, or a dictionary of
    /// them). Returns the tensor and whether string bytes were copied (never for the three
    /// plain types: `Utf8View` is taken as is, the offsets types get views over their data
    /// buffer).
    pub fn from_arrow(array: &dyn Array) -> Result<(StringTensor, bool)> {
        match array.data_type() {
            DataType::Utf8View => Ok((StringTensor { array: array.as_string_view().clone() }, false)),
            DataType::Utf8 => {
                let a = array.as_string::<i32>();
                let t = views_over(a.offsets(), a.values().clone(), a.nulls().cloned())?;
                Ok((t, false))
            }
            DataType::LargeUtf8 => {
                let a = array.as_string::<i64>();
                let t = views_over(a.offsets(), a.values().clone(), a.nulls().cloned())?;
                Ok((t, false))
            }
            DataType::Dictionary(_, v) if matches!(**v, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
                let plain = arrow_cast::cast(array, &DataType::Utf8View)?;
                Ok((StringTensor { array: plain.as_string_view().clone() }, true))
            }
            dt => Err(Error::invalid("strings", format!("an Arrow array of type {dt} is not a string array (Utf8, LargeUtf8, Utf8View)"))),
        }
    }

    /// From the exchange layout: `offsets` (n + 1 entries, non-decreasing, within `bytes`)
    /// addressing UTF-8 `bytes`, with optional validity. Every check names the first bad
    /// position; the bytes are shared, not copied.
    pub fn from_offsets<O: Offset>(offsets: &[O], bytes: Buffer, validity: Option<NullBuffer>) -> Result<StringTensor> {
        let offs = check_offsets(offsets, bytes.len())?;
        if let Some(v) = &validity {
            if v.len() != offs.len() - 1 {
                return Err(Error::invalid("validity", format!("{} entries for {} strings", v.len(), offs.len() - 1)));
            }
        }
        check_utf8(&offs, bytes.as_slice())?;
        Ok(build_views(&offs, &bytes, validity))
    }

    /// From a gathered ragged batch of uint8 ndim-1 records (a `utf8` store's records); the
    /// batch memory is shared, UTF-8 is checked.
    pub fn from_ragged(batch: &RaggedBatch) -> Result<StringTensor> {
        batch.check()?;
        if batch.dtype() != DType::UInt8 || batch.ndim() != 1 {
            return Err(Error::invalid("batch", format!("a string batch needs uint8 ndim-1 records, not {} ndim {}", batch.dtype(), batch.ndim())));
        }
        let bytes = crate::arrow::tensor_buffer(batch.values());
        StringTensor::from_offsets(batch.cu_seqlens_slice(), bytes, None)
    }

    /// The strings as Arrow `Utf8View` (zero-copy).
    pub fn as_arrow(&self) -> &StringViewArray {
        &self.array
    }

    /// The strings as Arrow `Utf8View` (zero-copy).
    pub fn into_arrow(self) -> StringViewArray {
        self.array
    }

    /// Number of strings.
    pub fn len(&self) -> usize {
        self.array.len()
    }

    /// True when there are no strings.
    pub fn is_empty(&self) -> bool {
        self.array.is_empty()
    }

    /// Number of null rows.
    pub fn null_count(&self) -> usize {
        self.array.null_count()
    }

    /// Row `i` (`None` when null); panics like a slice when `i >= len`.
    pub fn value(&self, i: usize) -> Option<&str> {
        self.array.is_valid(i).then(|| self.array.value(i))
    }

    /// Row `i`, checked.
    pub fn get(&self, i: usize) -> Result<Option<&str>> {
        if i >= self.len() {
            return Err(out_of_range(i as i128, self.len()));
        }
        Ok(self.value(i))
    }

    /// Bytes of string data the rows address (not counting shared, unreferenced buffer space).
    pub fn total_bytes(&self) -> usize {
        self.array.views().iter().map(|v| *v as u32 as usize).sum()
    }

    /// Drop buffer space no row refers to (after a filter or take); copies the live strings.
    pub fn compact(&self) -> StringTensor {
        StringTensor { array: self.array.gc() }
    }

    /// Export as offsets + one contiguous payload (copies the bytes), with the validity.
    /// Fails with a typed error when the payload does not fit the offset type.
    pub fn to_offsets(&self, kind: OffsetType) -> Result<(Vec<u8>, Vec<u8>, Option<NullBuffer>)> {
        let total = self.total_bytes();
        if total > kind.max_bytes() {
            return Err(Error::invalid("offsets", format!("{total} bytes of strings do not fit {kind:?} offsets (at most {})", kind.max_bytes())));
        }
        let n = self.len();
        let mut data = Vec::with_capacity(total);
        let width = kind.dtype().size();
        let mut offs = Vec::with_capacity((n + 1) * width);
        let push = |offs: &mut Vec<u8>, at: usize| match kind {
            OffsetType::Int32 => offs.extend_from_slice(&(at as i32).to_le_bytes()),
            OffsetType::Int64 => offs.extend_from_slice(&(at as i64).to_le_bytes()),
            OffsetType::UInt32 => offs.extend_from_slice(&(at as u32).to_le_bytes()),
        };
        push(&mut offs, 0);
        for i in 0..n {
            // Null rows keep their (usually empty) bytes so that offsets stay monotone.
            data.extend_from_slice(self.array.value(i).as_bytes());
            push(&mut offs, data.len());
        }
        Ok((offs, data, self.array.nulls().cloned()))
    }

    /// As an Arrow `Utf8` array (copies the bytes once).
    pub fn to_string_array(&self) -> Result<StringArray> {
        let (offs, data, nulls) = self.to_offsets(OffsetType::Int32)?;
        let offs = ScalarBuffer::<i32>::new(Buffer::from_vec(offs), 0, self.len() + 1);
        // SAFETY-free: `try_new` re-validates offsets and UTF-8 (cheap next to the copy).
        Ok(StringArray::try_new(OffsetBuffer::new(offs), Buffer::from_vec(data), nulls)?)
    }

    /// As an Arrow `LargeUtf8` array (copies the bytes once).
    pub fn to_large_string_array(&self) -> Result<LargeStringArray> {
        let (offs, data, nulls) = self.to_offsets(OffsetType::Int64)?;
        let offs = ScalarBuffer::<i64>::new(Buffer::from_vec(offs), 0, self.len() + 1);
        Ok(LargeStringArray::try_new(OffsetBuffer::new(offs), Buffer::from_vec(data), nulls)?)
    }

    /// As an Arrow array of `data_type` (`Utf8View` zero-copy, `Utf8` / `LargeUtf8` one copy).
    pub fn to_arrow_type(&self, data_type: &DataType) -> Result<ArrayRef> {
        Ok(match data_type {
            DataType::Utf8View => Arc::new(self.array.clone()),
            DataType::Utf8 => Arc::new(self.to_string_array()?),
            DataType::LargeUtf8 => Arc::new(self.to_large_string_array()?),
            dt => return Err(Error::invalid("type", format!("strings export to Utf8View, Utf8 or LargeUtf8, not {dt}"))),
        })
    }

    // ---- operations ----------------------------------------------------------------------

    /// Rows that start with `prefix` (null rows give null). The view's 4-byte prefix rejects
    /// most rows without touching string data: one branch-free pass over the views, then the
    /// rest of a longer prefix compared on the candidates only.
    pub fn starts_with(&self, prefix: &str) -> BooleanArray {
        BooleanArray::new(self.prefix_bits(prefix), self.array.nulls().cloned())
    }

    fn prefix_bits(&self, prefix: &str) -> BooleanBuffer {
        let p = prefix.as_bytes();
        let plen = u32::try_from(p.len()).unwrap_or(u32::MAX);
        let mask = ((1u64 << (8 * p.len().min(4))) - 1) as u32;
        let head = (view_prefix(p) >> 32) as u32 & mask;
        let mut words = view_words(self.array.views(), |len, prefix| (len >= plen) & ((prefix & mask) == head));
        let views: &[u128] = self.array.views();
        if p.len() > 4 {
            // The candidates' first four bytes matched: compare the rest. A short row (inline,
            // at most 12 bytes) holds it in its view (one masked compare of the view's bytes
            // 8..16: string bytes 4..12); a long one in its buffer, after the 4 bytes matched.
            let buffers = self.array.data_buffers();
            let rest = &p[4..];
            let (want, keep_mask) = if p.len() <= INLINE_MAX {
                let mut w = [0u8; 8];
                w[..rest.len()].copy_from_slice(rest);
                (u64::from_le_bytes(w), u64::MAX >> (8 * (8 - rest.len())))
            } else {
                (0, 0) // no inline row is long enough
            };
            let check = |i: usize| {
                let v = views[i];
                let len = v as u32 as usize;
                if len <= INLINE_MAX {
                    ((v >> 64) as u64 & keep_mask) == want && p.len() <= INLINE_MAX
                } else {
                    let (buf, off) = ((v >> 64) as u32 as usize, (v >> 96) as u32 as usize);
                    buffers[buf].get(off + 4..off + p.len()) == Some(rest)
                }
            };
            // A long candidate's bytes are a cache miss each (documents lie kilobytes apart):
            // the next word's candidates are prefetched while this word's are compared.
            let touch = |i: usize| {
                let v = views[i];
                if v as u32 as usize > INLINE_MAX {
                    if let Some(b) = buffers.get((v >> 64) as u32 as usize) {
                        crate::store::reader::prefetch_line(b.as_ptr().wrapping_add((v >> 96) as u32 as usize + 4));
                    }
                }
            };
            if views.len() >= 1 << 16 {
                // 64 rows a word: tasks of ROWS_PER_TASK rows, each clearing its own words.
                words.par_chunks_mut(ROWS_PER_TASK / 64).enumerate().for_each(|(c, ws)| for_each_set_prefetched(ws, |i| touch(c * ROWS_PER_TASK + i), |i| check(c * ROWS_PER_TASK + i)));
            } else {
                for_each_set_prefetched(&mut words, touch, check);
            }
        }
        BooleanBuffer::new(Buffer::from_vec(words), 0, views.len())
    }

    /// The rows that start with `prefix` (null rows dropped); the bytes are shared.
    pub fn filter_by_prefix(&self, prefix: &str) -> Result<StringTensor> {
        Ok(self.filter_bits(self.valid_only(self.prefix_bits(prefix))))
    }

    /// The rows whose length in `unit` lies in `min..=max` (null rows dropped); bytes shared.
    pub fn filter_length(&self, min: usize, max: usize, unit: LengthUnit) -> Result<StringTensor> {
        Ok(self.filter_bits(self.valid_only(self.length_bits(min, max, unit))))
    }

    /// Rows equal to `value` (null rows give null); compares length and prefix first.
    pub fn eq_scalar(&self, value: &str) -> BooleanArray {
        let p = value.as_bytes();
        let head = view_prefix(p) | (p.len() as u64);
        let views = self.array.views();
        let bits = par_mask(self.len(), |i| {
            let v = views[i];
            if v as u64 != head {
                return false;
            }
            p.len() <= 4 || self.array.value(i).as_bytes() == p
        });
        BooleanArray::new(bits, self.array.nulls().cloned())
    }

    /// Elementwise equality with `other` (same length; null where either side is null).
    pub fn eq(&self, other: &StringTensor) -> Result<BooleanArray> {
        if other.len() != self.len() {
            return Err(Error::ShapeMismatch { expected: format!("{} strings", self.len()), found: format!("{} strings", other.len()) });
        }
        let (a, b) = (self.array.views(), other.array.views());
        let bits = par_mask(self.len(), |i| {
            if a[i] as u64 != b[i] as u64 {
                return false;
            }
            (a[i] as u32 as usize) <= 4 || self.array.value(i).as_bytes() == other.array.value(i).as_bytes()
        });
        Ok(BooleanArray::new(bits, NullBuffer::union(self.array.nulls(), other.array.nulls())))
    }

    /// Length of every row in `unit` (null rows give null).
    pub fn lengths(&self, unit: LengthUnit) -> UInt32Array {
        let views = self.array.views();
        let mut out = vec![0u32; self.len()];
        let bytes = self.total_bytes();
        let per = rows_per_task(self.len(), bytes);
        let fill = |(c, chunk): (usize, &mut [u32])| {
            for (j, o) in chunk.iter_mut().enumerate() {
                let i = c * per + j;
                *o = match unit {
                    LengthUnit::Bytes => views[i] as u32,
                    LengthUnit::Chars => char_count(&self.array, i),
                };
            }
        };
        if unit == LengthUnit::Chars && worth_parallel(self.len(), bytes) {
            out.par_chunks_mut(per).enumerate().for_each(fill);
        } else {
            out.chunks_mut(per).enumerate().for_each(fill);
        }
        UInt32Array::new(ScalarBuffer::from(out), self.array.nulls().cloned())
    }

    /// Rows whose length in `unit` lies in `min..=max` (null rows give null).
    pub fn length_between(&self, min: usize, max: usize, unit: LengthUnit) -> BooleanArray {
        BooleanArray::new(self.length_bits(min, max, unit), self.array.nulls().cloned())
    }

    fn length_bits(&self, min: usize, max: usize, unit: LengthUnit) -> BooleanBuffer {
        let views: &[u128] = self.array.views();
        let (lo, hi) = (min.min(u32::MAX as usize + 1) as u64, max.min(u32::MAX as usize) as u64);
        let words = match unit {
            LengthUnit::Bytes if lo > hi || lo > u32::MAX as u64 => vec![0u64; views.len().div_ceil(64)],
            LengthUnit::Bytes => {
                // One unsigned compare per row: len - lo wraps past the span when len < lo.
                let (lo, span) = (lo as u32, hi as u32 - lo as u32);
                view_words(self.array.views(), |len, _| len.wrapping_sub(lo) <= span)
            }
            LengthUnit::Chars => {
                // A string of b bytes has between ceil(b / 4) and b chars: the bytes decide
                // for most rows; the rest (and non-ASCII ones) count their chars.
                let mut words = view_words(self.array.views(), |len, _| (len as u64 >= lo) & ((len as u64).div_ceil(4) <= hi));
                let buffers = self.array.data_buffers();
                for_each_set(&mut words, |i| {
                    let s = view_bytes(&views[i], buffers);
                    let b = s.len() as u64;
                    if (lo..=hi).contains(&b) && (lo..=hi).contains(&b.div_ceil(4)) {
                        return true;
                    }
                    let chars = if s.is_ascii() { b } else { count_chars(s) as u64 };
                    (lo..=hi).contains(&chars)
                });
                words
            }
        };
        BooleanBuffer::new(Buffer::from_vec(words), 0, views.len())
    }

    /// XXH3-64 of every row's UTF-8 bytes with `seed` (null rows give null). Equal to
    /// `xxhash.xxh3_64_intdigest(s.encode(), seed)`.
    pub fn hash(&self, seed: u64) -> UInt64Array {
        let views: &[u128] = self.array.views();
        let buffers = self.array.data_buffers();
        let mut out = vec![0u64; self.len()];
        let bytes = self.total_bytes();
        let per = rows_per_task(self.len(), bytes);
        let fill = |(c, chunk): (usize, &mut [u64])| {
            let vs = &views[c * per..c * per + chunk.len()];
            for (o, v) in chunk.iter_mut().zip(vs) {
                *o = xxh3(view_bytes(v, buffers), seed);
            }
        };
        if worth_parallel(self.len(), bytes) {
            out.par_chunks_mut(per).enumerate().for_each(fill);
        } else {
            out.chunks_mut(per).enumerate().for_each(fill);
        }
        UInt64Array::new(ScalarBuffer::from(out), self.array.nulls().cloned())
    }

    /// The rows at `ids`, in order, repeats allowed (bytes shared, views copied).
    pub fn take(&self, ids: &[u64]) -> Result<StringTensor> {
        let n = self.len() as u64;
        if let Some(&bad) = ids.iter().find(|&&i| i >= n) {
            return Err(out_of_range(bad as i128, self.len()));
        }
        let idx = UInt64Array::from(ids.to_vec());
        let a = arrow_select::take::take(&self.array, &idx, None)?;
        Ok(StringTensor { array: a.as_string_view().clone() })
    }

    /// The rows where `mask` is true (false and null drop the row); bytes shared.
    pub fn filter(&self, mask: &BooleanArray) -> Result<StringTensor> {
        if mask.len() != self.len() {
            return Err(Error::ShapeMismatch { expected: format!("a mask of {} entries", self.len()), found: format!("{} entries", mask.len()) });
        }
        let bits = match mask.nulls() {
            Some(n) => mask.values() & n.inner(),
            None => mask.values().clone(),
        };
        Ok(self.filter_bits(bits))
    }

    /// The rows whose bit is set (null rows stay null); the views of those rows are copied,
    /// the string buffers shared.
    fn filter_bits(&self, bits: BooleanBuffer) -> StringTensor {
        let views: &[u128] = self.array.views();
        let count = bits.count_set_bits();
        if count == views.len() {
            return self.clone(); // every row kept: share the views too
        }
        let mut out = Vec::with_capacity(count);
        let nulls = match self.array.nulls() {
            None if count >= views.len() / 2 => {
                // Dense selections: every view is written and the cursor advances by its bit
                // (no branch per row, no per-element capacity check).
                out.resize(views.len(), 0);
                let mut pos = 0;
                let chunks = bits.bit_chunks();
                let mut base = 0;
                let mut take = |w: u64, rows: usize, base: usize, pos: &mut usize| {
                    for (j, &v) in views[base..base + rows].iter().enumerate() {
                        out[*pos] = v;
                        *pos += ((w >> j) & 1) as usize;
                    }
                };
                for w in chunks.iter() {
                    take(w, 64, base, &mut pos);
                    base += 64;
                }
                take(chunks.remainder_bits(), chunks.remainder_len(), base, &mut pos);
                out.truncate(pos);
                None
            }
            None => {
                out.extend(bits.set_indices().map(|i| views[i]));
                None
            }
            Some(n) => {
                let mut valid = arrow_buffer::BooleanBufferBuilder::new(count);
                for i in bits.set_indices() {
                    out.push(views[i]);
                    valid.append(n.is_valid(i));
                }
                Some(NullBuffer::new(valid.finish()))
            }
        };
        // SAFETY: every view is copied unchanged from a valid array whose buffers the result
        // shares in the same order, so each still addresses valid UTF-8 within its buffer; the
        // validity (when any) has one entry per copied view.
        let array = unsafe { StringViewArray::new_unchecked(ScalarBuffer::from(out), self.array.data_buffers().to_vec(), nulls.filter(|n| n.null_count() > 0)) };
        StringTensor { array }
    }

    /// Set bits of `bits` that are also valid rows.
    fn valid_only(&self, bits: BooleanBuffer) -> BooleanBuffer {
        match self.array.nulls() {
            Some(n) => &bits & n.inner(),
            None => bits,
        }
    }

    /// All rows of `parts`, in order (bytes shared where Arrow can).
    pub fn concat(parts: &[&StringTensor]) -> Result<StringTensor> {
        if parts.is_empty() {
            return Ok(StringTensor::from_strs(std::iter::empty::<&str>()));
        }
        let arrays: Vec<&dyn Array> = parts.iter().map(|p| &p.array as &dyn Array).collect();
        let a = arrow_select::concat::concat(&arrays)?;
        Ok(StringTensor { array: a.as_string_view().clone() })
    }
}

impl PartialEq for StringTensor {
    fn eq(&self, other: &StringTensor) -> bool {
        self.len() == other.len() && (0..self.len()).all(|i| self.value(i) == other.value(i))
    }
}

/// XXH3-64 with a seed.
pub(crate) fn xxh3(bytes: &[u8], seed: u64) -> u64 {
    // Seed 0 is the default secret: no per-call secret derivation for long inputs.
    if seed == 0 {
        twox_hash::XxHash3_64::oneshot(bytes)
    } else {
        twox_hash::XxHash3_64::oneshot_with_seed(seed, bytes)
    }
}

fn out_of_range(index: i128, len: usize) -> Error {
    Error::IndexOutOfRange { index, len: len as u64, store: "string tensor".into() }
}

/// The first (up to) four bytes of `p` as a view's prefix word, shifted into the view's bits
/// 32..64 (little-endian, zero padded).
fn view_prefix(p: &[u8]) -> u64 {
    let mut w = [0u8; 4];
    let k = p.len().min(4);
    w[..k].copy_from_slice(&p[..k]);
    (u32::from_le_bytes(w) as u64) << 32
}

fn char_count(a: &StringViewArray, i: usize) -> u32 {
    count_chars(view_bytes(&a.views()[i], a.data_buffers())) as u32
}

/// A row's bytes from its view: inline in the view (up to 12 bytes) or in a data buffer.
#[inline(always)]
pub(crate) fn view_bytes<'a>(view: &'a u128, buffers: &'a [Buffer]) -> &'a [u8] {
    let len = *view as u32 as usize;
    if len <= INLINE_MAX {
        // SAFETY: the crate builds for little-endian targets only (lib.rs), where the u128's
        // memory is the view's 16 bytes in Arrow's order: the length (4 bytes), then up to 12
        // inline bytes; `len <= 12`, so bytes 4..4 + len lie inside the borrowed view.
        return unsafe { std::slice::from_raw_parts((view as *const u128 as *const u8).add(4), len) };
    }
    let (buf, off) = ((*view >> 64) as u32 as usize, (*view >> 96) as u32 as usize);
    &buffers[buf][off..off + len]
}

/// Bitmap words of the rows whose view satisfies the branch-free predicate `f` (nulls not
/// considered), in one pass; `f` sees a view's first two 32-bit words (length, 4-byte prefix),
/// read with a stride of four words so the loop vectorises. Split over the pool only when large
/// enough to pay for waking it.
fn view_words(views: &ScalarBuffer<u128>, f: impl Fn(u32, u32) -> bool + Sync) -> Vec<u64> {
    const PARALLEL_ROWS: usize = 1 << 16;
    let words32: &[u32] = views.inner().typed_data::<u32>();
    let mut words = vec![0u64; views.len().div_ceil(64)];
    let fill = |(ws, ls): (&mut [u64], &[u32])| {
        // Predicates into 64 flag bytes, then 8 flags at a time into bits: the multiply
        // gathers byte k's low bit into bit 56 + k.
        let mut flags = [0u8; 64];
        for (w, chunk) in ws.iter_mut().zip(ls.chunks(256)) {
            for (fl, view) in flags.iter_mut().zip(chunk.chunks_exact(4)) {
                *fl = f(view[0], view[1]) as u8;
            }
            flags[chunk.len() / 4..].fill(0);
            let mut bits = 0u64;
            for (k, eight) in flags.chunks_exact(8).enumerate() {
                let x = u64::from_le_bytes([eight[0], eight[1], eight[2], eight[3], eight[4], eight[5], eight[6], eight[7]]);
                bits |= (x.wrapping_mul(0x0102_0408_1020_4080) >> 56) << (8 * k);
            }
            *w = bits;
        }
    };
    if views.len() >= PARALLEL_ROWS {
        words.par_chunks_mut(ROWS_PER_TASK / 64).zip(words32.par_chunks(ROWS_PER_TASK * 4)).for_each(fill);
    } else {
        fill((&mut words, words32));
    }
    words
}

/// Chars in UTF-8 `s`: every byte that is not a continuation byte (0b10xx_xxxx) starts one.
fn count_chars(s: &[u8]) -> usize {
    s.iter().filter(|&&b| (b as i8) >= -0x40).count()
}

/// Clear each set bit of `words` whose row fails `keep`.
fn for_each_set(words: &mut [u64], keep: impl Fn(usize) -> bool) {
    for (k, w) in words.iter_mut().enumerate() {
        let mut rest = *w;
        while rest != 0 {
            let j = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if !keep(k * 64 + j) {
                *w &= !(1u64 << j);
            }
        }
    }
}

/// [`for_each_set`], calling `touch` on the set rows of the next word before `keep` runs on
/// this word's (a prefetch distance of one word).
fn for_each_set_prefetched(words: &mut [u64], touch: impl Fn(usize), keep: impl Fn(usize) -> bool) {
    let ahead = |k: usize, w: u64| {
        let mut rest = w;
        while rest != 0 {
            touch(k * 64 + rest.trailing_zeros() as usize);
            rest &= rest - 1;
        }
    };
    if let Some(&w) = words.first() {
        ahead(0, w);
    }
    for k in 0..words.len() {
        if let Some(&w) = words.get(k + 1) {
            ahead(k + 1, w);
        }
        let w = &mut words[k];
        let mut rest = *w;
        while rest != 0 {
            let j = rest.trailing_zeros() as usize;
            rest &= rest - 1;
            if !keep(k * 64 + j) {
                *w &= !(1u64 << j);
            }
        }
    }
}

/// A bitmap of `n` rows where `f(i)` is true, computed 64 rows per word, in parallel when large.
pub(crate) fn par_mask(n: usize, f: impl Fn(usize) -> bool + Sync) -> BooleanBuffer {
    const WORDS: usize = ROWS_PER_TASK / 64;
    let mut words = vec![0u64; n.div_ceil(64)];
    let fill = |(c, chunk): (usize, &mut [u64])| {
        for (j, word) in chunk.iter_mut().enumerate() {
            let base = (c * WORDS + j) * 64;
            let mut w = 0u64;
            for i in base..(base + 64).min(n) {
                w |= (f(i) as u64) << (i - base);
            }
            *word = w;
        }
    };
    if n >= 2 * ROWS_PER_TASK {
        words.par_chunks_mut(WORDS).enumerate().for_each(fill);
    } else {
        words.chunks_mut(WORDS).enumerate().for_each(fill);
    }
    BooleanBuffer::new(Buffer::from_vec(words), 0, n)
}

/// An integer type of exchange-layout offsets.
pub trait Offset: Copy + Send + Sync + std::fmt::Display {
    /// The value as a byte position, `None` when negative.
    fn position(self) -> Option<usize>;
}

impl Offset for i32 {
    fn position(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}

impl Offset for i64 {
    fn position(self) -> Option<usize> {
        usize::try_from(self).ok()
    }
}

impl Offset for u32 {
    fn position(self) -> Option<usize> {
        Some(self as usize)
    }
}

/// Offsets as byte positions: n + 1 entries, non-decreasing, within `len` bytes.
fn check_offsets<O: Offset>(offsets: &[O], len: usize) -> Result<Vec<usize>> {
    if offsets.is_empty() {
        return Err(Error::invalid("offsets", "offsets need n + 1 entries (at least one, 0 for no strings)"));
    }
    if offsets.len() == 1 {
        // No strings: the one offset addresses nothing. An empty slice of a larger array (or
        // an empty chunk after a filter) keeps its position in data it no longer carries.
        offsets[0].position().ok_or_else(|| Error::invalid("offsets", format!("offset 0 is negative ({})", offsets[0])))?;
        return Ok(vec![0]);
    }
    let mut out = Vec::with_capacity(offsets.len());
    let mut prev = 0usize;
    for (k, &o) in offsets.iter().enumerate() {
        let p = o.position().ok_or_else(|| Error::invalid("offsets", format!("offset {k} is negative ({o})")))?;
        if p > len {
            return Err(Error::invalid("offsets", format!("offset {k} is {p}, past the {len} bytes of string data")));
        }
        if k > 0 && p < prev {
            return Err(Error::invalid("offsets", format!("offsets decrease at position {k} ({prev} then {p})")));
        }
        prev = p;
        out.push(p);
    }
    Ok(out)
}

/// The bytes every row addresses are valid UTF-8 and every row boundary is a char boundary;
/// the error names the first bad row and byte.
fn check_utf8(offs: &[usize], bytes: &[u8]) -> Result<()> {
    let (lo, hi) = (offs[0], offs[offs.len() - 1]);
    let region = &bytes[lo..hi];
    let bad_row = |at: usize| offs.partition_point(|&o| o <= at).saturating_sub(1);
    if let Err(e) = std::str::from_utf8(region) {
        let at = lo + e.valid_up_to();
        let row = bad_row(at);
        return Err(Error::invalid("strings", format!("string {row} is not valid UTF-8 (bad byte at position {} of the string, byte {at} of the data)", at - offs[row])));
    }
    // The whole region is UTF-8; a row boundary inside a multi-byte char would split it.
    for (k, &o) in offs.iter().enumerate() {
        if o < hi && (bytes[o] as i8) < -0x40 {
            let row = k.min(offs.len() - 2);
            return Err(Error::invalid("strings", format!("offset {k} ({o}) splits a multi-byte UTF-8 character, so string {row} is not valid UTF-8")));
        }
    }
    Ok(())
}

/// Views over validated rows of `bytes` (split into several buffers past 4 GiB).
fn build_views(offs: &[usize], bytes: &Buffer, validity: Option<NullBuffer>) -> StringTensor {
    let n = offs.len() - 1;
    let mut views = Vec::with_capacity(n);
    let mut buffers: Vec<Buffer> = Vec::new();
    // The buffer being filled: bytes `base..end` of `bytes`.
    let mut current: Option<(usize, usize)> = None;
    let s = bytes.as_slice();
    for k in 0..n {
        let (lo, hi) = (offs[k], offs[k + 1]);
        let len = hi - lo;
        if len <= INLINE_MAX {
            let mut raw = [0u8; 16];
            raw[..4].copy_from_slice(&(len as u32).to_le_bytes());
            raw[4..4 + len].copy_from_slice(&s[lo..hi]);
            views.push(u128::from_le_bytes(raw));
            continue;
        }
        let (base, end) = match current {
            Some((base, end)) if hi - base <= BUFFER_MAX => (base, end.max(hi)),
            Some((base, end)) => {
                buffers.push(bytes.slice_with_length(base, end - base));
                (lo, hi)
            }
            None => (lo, hi),
        };
        current = Some((base, end));
        let view = arrow_data::ByteView::new(len as u32, &s[lo..lo + 4]).with_buffer_index(buffers.len() as u32).with_offset((lo - base) as u32);
        views.push(view.as_u128());
    }
    if let Some((base, end)) = current {
        buffers.push(bytes.slice_with_length(base, end - base));
    }
    // SAFETY: every view was built above from validated offsets: inline views hold the row's
    // bytes, the others address `lo - base .. + len` inside buffer `buffers.len()` at the time,
    // which is the slice `base..end` pushed when that buffer closes (end >= hi); all rows are valid
    // UTF-8 (`check_utf8`) and the validity (if any) has n entries (checked by the caller).
    let array = unsafe { StringViewArray::new_unchecked(ScalarBuffer::from(views), buffers, validity) };
    StringTensor { array }
}

/// Views over an Arrow offsets array's data (already valid: Arrow checked it on construction).
fn views_over<O: arrow_array::OffsetSizeTrait + Offset>(offsets: &OffsetBuffer<O>, values: Buffer, nulls: Option<NullBuffer>) -> Result<StringTensor> {
    // Arrow arrays are valid by construction, but an array imported through the C Data
    // Interface is only as good as its producer: check bounds and UTF-8 again (cheap).
    let checked = check_offsets(offsets.as_ref(), values.len())?;
    check_utf8(&checked, values.as_slice())?;
    Ok(build_views(&checked, &values, nulls))
}
