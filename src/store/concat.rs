//! A record source made of parts read one after another: record ids are global, part `k`
//! holds ids `starts[k] .. starts[k] + len(k)`.
//!
//! This is how a stream of a multi-part dataset root reads (the parts a distributed or
//! partitioned `COPY` wrote in parallel, one per partition): each part is an ordinary store,
//! and this source maps a batch's global ids to the parts that hold them. A batch inside one
//! part (what sequential scans and most loader batches of a large part are) is that part's
//! own gather, with no extra copy; a batch spanning parts gathers each part's records in one
//! request and places them in batch order.

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, Tensor, TensorView};
use crate::store::format::Logical;
use crate::store::gather::Ids;
use crate::store::{Batch, Layout, ReadOptions, RecordSource};

/// Parts read as one source (see the module documentation).
#[derive(Debug)]
pub struct ConcatSource {
    name: String,
    parts: Vec<Arc<dyn RecordSource>>,
    /// `starts[k]`: the global id of part `k`'s first record; `starts[parts.len()]` = len.
    starts: Vec<u64>,
    dtype: DType,
    layout: Layout,
    logical: Logical,
}

/// The ids of one batch that one part holds, as part-local ids, and where they go in the batch.
#[derive(Default)]
struct Group {
    local: Vec<u64>,
    pos: Vec<usize>,
}

impl ConcatSource {
    /// `parts` in order (at least one), all of one dtype, layout and logical type.
    pub fn new(name: impl Into<String>, parts: Vec<Arc<dyn RecordSource>>) -> Result<ConcatSource> {
        let name = name.into();
        let first = parts.first().ok_or_else(|| Error::invalid("parts", format!("'{name}' has no parts")))?;
        let (dtype, layout, logical) = (first.dtype(), first.layout(), first.logical());
        let mut starts = Vec::with_capacity(parts.len() + 1);
        let mut at = 0u64;
        for (k, p) in parts.iter().enumerate() {
            if p.dtype() != dtype || p.layout() != layout || p.logical() != logical {
                return Err(Error::invalid(
                    "parts",
                    format!(
                        "part {k} of '{name}' ({}: {} {} {}) differs from part 0 ({} {} {})",
                        p.name(),
                        p.dtype(),
                        p.layout(),
                        p.logical(),
                        dtype,
                        layout,
                        logical
                    ),
                ));
            }
            starts.push(at);
            at = at.checked_add(p.len()).ok_or_else(|| Error::invalid("parts", format!("record count of '{name}' overflows")))?;
        }
        starts.push(at);
        Ok(ConcatSource { name, parts, starts, dtype, layout, logical })
    }

    /// The parts, in id order.
    pub fn parts(&self) -> &[Arc<dyn RecordSource>] {
        &self.parts
    }

    /// The part holding global id `id` (`id < len`) and its id in that part.
    fn locate(&self, id: u64) -> (usize, u64) {
        // Empty parts share their start with the next part: the last part starting at or
        // before `id` is the non-empty one holding it.
        let k = self.starts[..self.parts.len()].partition_point(|&s| s <= id) - 1;
        (k, id - self.starts[k])
    }

    /// The one part holding every id of `ids` (validated), as that part's ids, if there is one.
    fn within_one<'a>(&self, ids: &Ids<'a>) -> Option<(usize, Local<'a>)> {
        if ids.is_empty() {
            return None;
        }
        let (k, _) = self.locate(ids.get(0));
        let (lo, hi) = (self.starts[k], self.starts[k + 1]);
        let inside = |x: u64| x >= lo && x < hi;
        match *ids {
            Ids::Range { start, step, len } => {
                let last = (start as i128 + step as i128 * (len as i128 - 1)) as u64;
                (inside(start) && inside(last)).then(|| (k, Local::Ids(Ids::Range { start: start - lo, step, len })))
            }
            Ids::List(l) if l.iter().all(|&x| inside(x)) => {
                // The first part's ids are the global ids: no copy.
                Some((k, if lo == 0 { Local::Ids(Ids::List(l)) } else { Local::Shifted(l.iter().map(|&x| x - lo).collect()) }))
            }
            Ids::List(_) => None,
        }
    }
}

/// A batch's ids as one part's ids.
enum Local<'a> {
    Ids(Ids<'a>),
    Shifted(Vec<u64>),
}

impl RecordSource for ConcatSource {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn len(&self) -> u64 {
        self.starts[self.parts.len()]
    }

    fn record_type(&self) -> crate::store::RecordType {
        crate::store::RecordType { dtype: self.dtype, layout: self.layout.clone(), logical: self.logical }
    }

    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, options: &ReadOptions) -> Result<Batch> {
        ids.validate(self.len(), std::path::Path::new(&self.name))?;
        if ids.is_empty() {
            return self.parts[0].gather(Ids::List(&[]), allocator, options);
        }
        if let Some((k, local)) = self.within_one(&ids) {
            return match local {
                Local::Ids(i) => self.parts[k].gather(i, allocator, options),
                Local::Shifted(v) => self.parts[k].gather(Ids::List(&v), allocator, options),
            };
        }
        // Spanning parts: one gather per part, then placed in batch order.
        let mut groups: Vec<Group> = (0..self.parts.len()).map(|_| Group::default()).collect();
        for i in 0..ids.len() {
            let (k, local) = self.locate(ids.get(i));
            groups[k].local.push(local);
            groups[k].pos.push(i);
        }
        let mut got: Vec<(usize, Batch)> = Vec::new();
        for (k, g) in groups.iter().enumerate() {
            if !g.local.is_empty() {
                got.push((k, self.parts[k].gather(Ids::List(&g.local), allocator, options)?));
            }
        }
        let n = ids.len();
        match &self.layout {
            Layout::Dense { item_shape } => {
                let row = item_shape.iter().product::<usize>() * self.dtype.size();
                let mut alloc = allocator.allocate(n * row)?;
                let out = alloc.as_uninit_mut();
                let mut filled = 0usize;
                for (k, b) in &got {
                    let t = b.as_dense().ok_or_else(|| self.wrong_kind(*k))?;
                    let bytes = t.as_bytes();
                    if bytes.len() != groups[*k].pos.len() * row {
                        return Err(self.short(*k, bytes.len(), groups[*k].pos.len() * row));
                    }
                    for (src, &p) in bytes.chunks_exact(row.max(1)).zip(&groups[*k].pos) {
                        // SAFETY: `p < n`, so `p * row + row <= n * row`, the allocation's
                        // usable size; source and destination are different allocations.
                        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr().add(p * row).cast::<u8>(), row) };
                    }
                    filled += groups[*k].pos.len();
                }
                debug_assert_eq!(filled, n);
                let mut shape = vec![n];
                shape.extend_from_slice(item_shape);
                // SAFETY: every position 0..n was written exactly once above (the groups
                // partition the batch's positions and each part returned one row per id).
                Ok(Batch::Dense(unsafe { Tensor::from_initialized(Arc::new(alloc), 0, self.dtype, shape) }))
            }
            Layout::Ragged { ndim } => {
                let ndim = *ndim;
                let size = self.dtype.size();
                let mut slots: Vec<Option<TensorView<'_>>> = (0..n).map(|_| None).collect();
                for (k, b) in &got {
                    let rb = b.as_ragged().ok_or_else(|| self.wrong_kind(*k))?;
                    let (cu, shapes, values) = (rb.cu_seqlens_slice(), rb.shapes_slice(), rb.values().as_bytes());
                    for (j, &p) in groups[*k].pos.iter().enumerate() {
                        let (a, z) = (cu[j] as usize * size, cu[j + 1] as usize * size);
                        let shape = shapes[j * ndim..(j + 1) * ndim].iter().map(|&d| d as usize).collect();
                        slots[p] = Some(TensorView::new(&values[a..z], self.dtype, shape));
                    }
                }
                let views: Vec<TensorView<'_>> =
                    slots.into_iter().enumerate().map(|(i, s)| s.ok_or_else(|| self.short(0, i, n))).collect::<Result<_>>()?;
                Ok(Batch::Ragged(RaggedBatch::pack(allocator, self.dtype, ndim, views.iter())?))
            }
        }
    }
}

impl ConcatSource {
    fn wrong_kind(&self, k: usize) -> Error {
        Error::invalid("parts", format!("part {k} of '{}' returned a batch of the wrong kind", self.name))
    }

    fn short(&self, k: usize, got: usize, want: usize) -> Error {
        Error::invalid("parts", format!("part {k} of '{}' returned {got} where {want} were expected", self.name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Allocator;

    /// Record `i` of a part starting at global id `base`: dense `[2]` int64 `(base + i) * [1, 10]`,
    /// or ragged `[(base + i) % 3 + 1]` filled with `base + i`.
    #[derive(Debug)]
    struct Part {
        base: u64,
        n: u64,
        ragged: bool,
    }

    impl RecordSource for Part {
        fn name(&self) -> String {
            format!("part@{}", self.base)
        }
        fn len(&self) -> u64 {
            self.n
        }

        fn record_type(&self) -> crate::store::RecordType {
            crate::store::RecordType { dtype: DType::Int64, layout: {
            if self.ragged {
            Layout::Ragged { ndim: 1 }
            } else {
            Layout::Dense { item_shape: vec![2] }
            }
        }, logical: crate::store::Logical::Tensor }
        }
        fn gather(&self, ids: Ids<'_>, allocator: &Allocator, _: &ReadOptions) -> Result<Batch> {
            ids.validate(self.n, std::path::Path::new("part"))?;
            let g: Vec<i64> = (0..ids.len()).map(|k| (self.base + ids.get(k)) as i64).collect();
            if self.ragged {
                let recs: Vec<Vec<i64>> = g.iter().map(|&v| vec![v; (v % 3 + 1) as usize]).collect();
                let shapes: Vec<[usize; 1]> = recs.iter().map(|r| [r.len()]).collect();
                let pairs: Vec<(&[i64], &[usize])> = recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..])).collect();
                Ok(Batch::Ragged(RaggedBatch::from_records(allocator, 1, &pairs)?))
            } else {
                let v: Vec<i64> = g.iter().flat_map(|&x| [x, x * 10]).collect();
                Ok(Batch::Dense(Tensor::from_slice(allocator, &v, &[g.len(), 2])?))
            }
        }
    }

    fn concat(sizes: &[u64], ragged: bool) -> ConcatSource {
        let mut base = 0;
        let parts = sizes
            .iter()
            .map(|&n| {
                let p: Arc<dyn RecordSource> = Arc::new(Part { base, n, ragged });
                base += n;
                p
            })
            .collect();
        ConcatSource::new("t", parts).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn global_ids_map_to_parts_in_any_order_with_repeats_and_empty_parts() {
        let alloc = Allocator::cpu(1 << 20);
        for ragged in [false, true] {
            let c = concat(&[3, 0, 4, 0, 0, 5], ragged);
            assert_eq!(c.len(), 12);
            for ids in [vec![11u64, 0, 3, 3, 7, 2, 6, 11], vec![4, 5, 6], vec![7, 8, 9, 10, 11], vec![2, 3], vec![]] {
                let b = c.gather(Ids::List(&ids), &alloc, &ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(b.len(), ids.len());
                if ragged {
                    let r = b.as_ragged().unwrap_or_else(|| panic!("ragged"));
                    for (k, &id) in ids.iter().enumerate() {
                        let rec = r.record(k).unwrap_or_else(|e| panic!("{e}"));
                        assert_eq!(rec.as_slice::<i64>().unwrap_or_else(|e| panic!("{e}")), &vec![id as i64; (id % 3 + 1) as usize][..]);
                    }
                } else {
                    let want: Vec<i64> = ids.iter().flat_map(|&x| [x as i64, x as i64 * 10]).collect();
                    assert_eq!(b.as_dense().unwrap_or_else(|| panic!("dense")).as_slice::<i64>().unwrap_or_else(|e| panic!("{e}")), &want[..]);
                }
            }
            // Strided ranges inside one part and across parts, both directions.
            for (start, step, len) in [(7u64, 1i64, 5usize), (11, -1, 12), (0, 4, 3), (8, -2, 3)] {
                let b = c.gather(Ids::Range { start, step, len }, &alloc, &ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
                let ids: Vec<u64> = (0..len).map(|k| (start as i64 + step * k as i64) as u64).collect();
                let want = c.gather(Ids::List(&ids), &alloc, &ReadOptions::default()).unwrap_or_else(|e| panic!("{e}"));
                match (&b, &want) {
                    (Batch::Dense(a), Batch::Dense(w)) => assert_eq!(a.as_bytes(), w.as_bytes()),
                    (Batch::Ragged(a), Batch::Ragged(w)) => {
                        assert_eq!(a.values().as_bytes(), w.values().as_bytes());
                        assert_eq!(a.cu_seqlens_slice(), w.cu_seqlens_slice());
                    }
                    _ => panic!("batch kinds differ"),
                }
            }
            let err = c.gather(Ids::List(&[3, 12]), &alloc, &ReadOptions::default());
            assert!(matches!(err, Err(Error::IndexOutOfRange { index: 12, len: 12, .. })), "{err:?}");
        }
    }

    #[test]
    fn parts_must_agree() {
        let a: Arc<dyn RecordSource> = Arc::new(Part { base: 0, n: 2, ragged: false });
        let b: Arc<dyn RecordSource> = Arc::new(Part { base: 2, n: 2, ragged: true });
        assert!(matches!(ConcatSource::new("t", vec![a, b]), Err(Error::InvalidArgument { .. })));
        assert!(ConcatSource::new("t", vec![]).is_err());
    }
}
