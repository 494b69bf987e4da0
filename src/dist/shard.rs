//! Rows a rank owns in process memory, shared with readers on the same host without a copy on
//! the owner's side: the rows live in a sealed `memfd` mapping ([`crate::io::shm`]); a reader on
//! the same host maps the same file through `/proc/<owner pid>/fd/<fd>` and gathers from it
//! like from a local store.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use memmap2::{MmapOptions, MmapRaw};

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{numel, Allocator, Tensor};
use crate::store::{Batch, Ids, Layout, ReadOptions, RecordSource};

/// Shared shards up to this size are mapped with every page present (MAP_POPULATE).
const POPULATE_BYTES: usize = 16 << 30;

/// Dense rows `[rows, *item_shape]` of one dtype in a shared mapping.
pub struct SharedRows {
    name: String,
    rows: u64,
    dtype: DType,
    item_shape: Vec<usize>,
    row_bytes: usize,
    map: MmapRaw,
    /// The memfd, kept open by the owner so that readers can reach it under /proc.
    file: Option<File>,
    writable: bool,
}

impl std::fmt::Debug for SharedRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedRows('{}', {} x {} {:?})", self.name, self.rows, self.dtype, self.item_shape)
    }
}

/// Bytes of `rows` rows of `row_bytes`, or a typed error when it does not fit in memory sizes.
fn total_bytes(rows: u64, row_bytes: usize) -> Result<usize> {
    usize::try_from(rows)
        .ok()
        .and_then(|r| r.checked_mul(row_bytes))
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::invalid("nrows", format!("{rows} rows of {row_bytes} bytes do not fit in memory")))
}

impl SharedRows {
    /// Zero-filled rows owned by this process (the writer side: `init` + `update`, or `add`).
    pub fn create(name: &str, rows: u64, dtype: DType, item_shape: Vec<usize>) -> Result<SharedRows> {
        let row_bytes = numel(&item_shape)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::invalid("shape", format!("rows of shape {item_shape:?} overflow")))?;
        let bytes = total_bytes(rows, row_bytes)?;
        // Sealed at this size: a reader's mapping can never be cut short under it.
        let file = crate::io::shm::create_shared(name, bytes)?;
        let map = MmapOptions::new().len(bytes.max(1)).map_raw(&file).map_err(|e| Error::io("memfd", e))?;
        Ok(SharedRows { name: name.to_string(), rows, dtype, item_shape, row_bytes, map, file: Some(file), writable: true })
    }

    /// The owner's rows seen from another process on the same host, read-only.
    pub fn open_peer(name: &str, pid: u32, fd: i32, rows: u64, dtype: DType, item_shape: Vec<usize>) -> Result<SharedRows> {
        let row_bytes = numel(&item_shape).and_then(|n| n.checked_mul(dtype.size())).ok_or_else(|| Error::invalid("shape", format!("{item_shape:?}")))?;
        let bytes = total_bytes(rows, row_bytes)?;
        let path = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
        let (file, _) = crate::io::shm::open_shared(pid, fd, bytes as u64).map_err(|e| e.context(format!("shared rows of '{name}'")))?;
        // Map every page up front (the owner's pages are resident already): random rows then
        // cost a copy, not a page fault each. Very large shards fault in as they are read.
        let mut opts = MmapOptions::new();
        opts.len(bytes.max(1));
        if bytes <= POPULATE_BYTES {
            opts.populate();
        }
        let map = opts.map_raw_read_only(&file).map_err(|e| Error::io(&path, e))?;
        Ok(SharedRows { name: name.to_string(), rows, dtype, item_shape, row_bytes, map, file: None, writable: false })
    }

    /// The memfd's descriptor (owner side), for readers on the same host.
    pub fn fd(&self) -> Option<i32> {
        self.file.as_ref().map(|f| f.as_raw_fd())
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Record shape.
    pub fn item_shape(&self) -> &[usize] {
        &self.item_shape
    }

    /// Overwrite rows `offset..offset + bytes.len() / row_bytes` (owner only).
    pub fn write_rows(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(Error::invalid("update", format!("'{}' is another rank's shard; only its owner writes it", self.name)));
        }
        if self.row_bytes == 0 || !bytes.len().is_multiple_of(self.row_bytes) {
            return Err(Error::ShapeMismatch { expected: format!("whole rows of {} bytes", self.row_bytes), found: format!("{} bytes", bytes.len()) });
        }
        let n = (bytes.len() / self.row_bytes) as u64;
        if offset.checked_add(n).is_none_or(|end| end > self.rows) {
            return Err(Error::IndexOutOfRange { index: offset as i128 + n as i128 - 1, len: self.rows, store: self.name.clone().into() });
        }
        let at = offset as usize * self.row_bytes;
        // SAFETY: `at + bytes.len()` lies within the mapping (checked above against `rows`, and
        // the mapping holds `rows * row_bytes` bytes); the mapping is writable (owner side) and
        // `bytes` cannot overlap it (it is the caller's memory, validated as a separate buffer).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.as_mut_ptr().add(at), bytes.len()) };
        Ok(())
    }

    /// Rows `ids` into positions `pos` of `out` (split over the pool when large and allowed).
    pub(crate) fn copy_rows_to(&self, ids: &[u64], pos: &[usize], out: &crate::dist::node::Out, parallel: bool) -> Result<()> {
        use rayon::prelude::*;
        if out.row() != self.row_bytes || ids.len() != pos.len() {
            return Err(Error::invalid("gather", format!("rows of {} bytes into a destination of {}-byte rows", self.row_bytes, out.row())));
        }
        if let Some(&bad) = ids.iter().find(|&&i| i >= self.rows) {
            return Err(Error::IndexOutOfRange { index: bad as i128, len: self.rows, store: self.name.clone().into() });
        }
        let copy = |(is, ps): (&[u64], &[usize])| -> Result<()> {
            for (&i, &p) in is.iter().zip(ps) {
                self.copy_row(i, out.row_ptr(p)?);
            }
            Ok(())
        };
        const PARALLEL_BYTES: usize = 4 << 20;
        if parallel && ids.len().saturating_mul(self.row_bytes) >= PARALLEL_BYTES && ids.len() > 1 {
            let per = ids.len().div_ceil(rayon::current_num_threads() * 4).max(1);
            ids.par_chunks(per).zip(pos.par_chunks(per)).try_for_each(copy)
        } else {
            copy((ids, pos))
        }
    }

    /// Copy row `id` into `dst` (`row_bytes` long). `id < rows` is the caller's check.
    fn copy_row(&self, id: u64, dst: *mut u8) {
        // SAFETY: `id < rows` (every gather validates ids first), so the row lies within the
        // mapping; `dst` points at `row_bytes` writable bytes of the destination (a fresh
        // allocation, or a row bounds-checked by `Out::row_ptr`). The owner
        // may be writing the same row (`update` outside an epoch): the bytes are then a mix of
        // old and new, as with the RMA windows of the original, never out of bounds.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(id as usize * self.row_bytes), dst, self.row_bytes) };
    }
}

impl RecordSource for SharedRows {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn len(&self) -> u64 {
        self.rows
    }

    fn record_type(&self) -> crate::store::RecordType {
        crate::store::RecordType { dtype: self.dtype, layout: Layout::Dense { item_shape: self.item_shape.clone() }, logical: crate::store::Logical::Tensor }
    }

    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, options: &ReadOptions) -> Result<Batch> {
        ids.validate(self.rows, std::path::Path::new(&self.name))?;
        let n = ids.len();
        let bytes = n.checked_mul(self.row_bytes).ok_or_else(|| Error::invalid("ids", "batch too large"))?;
        let mut alloc = allocator.allocate(bytes)?;
        let ids: Vec<u64> = (0..n).map(|k| ids.get(k)).collect();
        let pos: Vec<usize> = (0..n).collect();
        // SAFETY: the fresh allocation's `bytes` writable bytes, ours alone during the copy.
        let out = unsafe { crate::dist::node::Out::new(alloc.as_uninit_mut().as_mut_ptr().cast::<u8>(), bytes, self.row_bytes) };
        self.copy_rows_to(&ids, &pos, &out, options.parallel)?;
        let mut shape = vec![n];
        shape.extend_from_slice(&self.item_shape);
        // SAFETY: every row 0..n was written by copy_rows_to (it fails before returning otherwise).
        Ok(Batch::Dense(unsafe { Tensor::from_initialized(std::sync::Arc::new(alloc), 0, self.dtype, shape) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_peer_sees_updates() {
        let s = SharedRows::create("v", 5, DType::Int32, vec![3]).unwrap();
        let vals: Vec<i32> = (0..15).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        s.write_rows(0, &bytes).unwrap();
        let a = Allocator::default();
        let b = s.gather(Ids::List(&[4, 0, 4]), &a, &ReadOptions::default()).unwrap();
        assert_eq!(b.as_dense().unwrap().as_slice::<i32>().unwrap(), &[12, 13, 14, 0, 1, 2, 12, 13, 14]);
        let peer = SharedRows::open_peer("v", std::process::id(), s.fd().unwrap(), 5, DType::Int32, vec![3]).unwrap();
        s.write_rows(1, &[7u8; 12]).unwrap();
        let b = peer.gather(Ids::List(&[1]), &a, &ReadOptions::default()).unwrap();
        assert_eq!(b.as_dense().unwrap().as_bytes(), &[7u8; 12]);
        assert!(matches!(peer.write_rows(0, &[0; 12]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(s.write_rows(4, &[0; 24]), Err(Error::IndexOutOfRange { .. })));
        assert!(matches!(s.write_rows(0, &[0; 5]), Err(Error::ShapeMismatch { .. })));
        assert!(matches!(s.gather(Ids::List(&[5]), &a, &ReadOptions::default()), Err(Error::IndexOutOfRange { .. })));
    }

    #[test]
    fn absurd_sizes_are_typed_errors() {
        assert!(matches!(SharedRows::create("v", u64::MAX, DType::Float64, vec![1 << 20]), Err(Error::InvalidArgument { .. })));
        let s = SharedRows::create("e", 0, DType::UInt8, vec![4]).unwrap();
        assert_eq!(s.gather(Ids::List(&[]), &Allocator::default(), &ReadOptions::default()).unwrap().len(), 0);
    }
}
