//! Residency of a local store's mapped files: cold-read mode (a store whose gathers wait for
//! storage switches to positional reads and explicit read-ahead hints) and the bound on mapped
//! bytes a store keeps before releasing its pages.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::io::Hint;
use crate::store::format::{ENTRY_BYTES, HEADER_BYTES};
use crate::store::reader::{advise_merged, StoreCore, StoreFile};

/// How a store's gathers meet storage. Gathers from a mapping that is not in the page cache
/// fault one page at a time per thread (queue depth 2 on two cores, plus the kernel's
/// read-around of pages nobody asked for). A gather far slower than memory switches the store
/// to cold mode: from then on each gather first asks the kernel for every page it needs — the
/// index entries (and shape rows) of all its ids, then all its records' bytes — in one burst
/// of `WILLNEED` hints, so the device works at the queue depth of the batch, and page faults
/// stop reading around, and records are read with positional reads (one wait per record instead
/// of one page fault per page). When a few records of a batch probe resident (`mincore`), the
/// data is back in memory and the store leaves cold mode.
///
/// From the end of the first cold gather on, the index and shapes files (up to
/// [`MAX_RESIDENT_COPY`]) are copied into process memory in the background, so once the copy is
/// complete a cold gather waits for its records only.
///
/// The first gather decides before it reads: when the pages of a few of its records (or their
/// index entries) are not resident, the store starts in cold mode, so the first batch after
/// opening cold data does not fault its way through storage before a slow gather reveals it.
#[derive(Default)]
pub(crate) struct Residency {
    pub(crate) cold: std::sync::atomic::AtomicBool,
    /// The first gather's residency probe ran (or the mode was set explicitly).
    pub(crate) decided: std::sync::atomic::AtomicBool,
    random_set: std::sync::atomic::AtomicBool,
    /// Bound on bytes gathered between two releases of the mapped pages (0: none).
    pub(crate) max_mapped: AtomicU64,
    since_release: AtomicU64,
    /// Times the mapped pages were released (for tests and metrics).
    pub(crate) releases: AtomicU64,
}

/// A gather slower than `COLD_FACTOR` times this estimate of a memory-speed gather (per record
/// plus per byte) is reading from storage.
const WARM_NS_PER_RECORD: u64 = 500;
const WARM_BYTES_PER_NS: u64 = 2;
const COLD_FACTOR: u64 = 8;
/// ... and slower than this (a thread preempted for a moment is not storage).
const COLD_MIN_NS: u64 = 200_000;
/// Largest index (or shapes) file that cold mode copies into process memory: 24 bytes per
/// record, so stores up to ~5.6M records (a copy of 1-2% of 2 KiB records' data).
pub(crate) const MAX_RESIDENT_COPY: u64 = 128 << 20;
/// Records of a cold batch probed for residency (`mincore`), and bytes of each.
const PROBES: usize = 4;
const PROBE_BYTES: u64 = 64 << 10;

impl StoreCore {
    /// In cold mode, ask the kernel for every page a gather of `ids` will touch, all at once
    /// (see [`Residency`]). Does nothing otherwise.
    pub(crate) fn prefetch_cold(&self, ids: crate::store::Ids<'_>) {
        if ids.is_empty() || self.remote {
            return;
        }
        if !self.residency.decided.load(Ordering::Relaxed) && !self.residency.decided.swap(true, Ordering::Relaxed) && self.probe_not_resident(ids) {
            self.enter_cold();
        }
        if !self.residency.cold.load(Ordering::Relaxed) {
            return;
        }
        let n = ids.len();
        // Back in memory (a later epoch, or the page cache grew)? Probe a few records of the
        // batch: all resident leaves cold mode before paying for hints and system calls.
        let probe = |k: usize| -> Option<bool> {
            let e = self.entry(ids.get(k)).ok()?;
            self.shards.get(e.shard as usize)?.source().resident(e.offset, (e.stored_len as u64).min(PROBE_BYTES))
        };
        let probes = n.min(PROBES);
        if (0..probes).all(|j| probe(j * n / probes) == Some(true)) {
            self.residency.cold.store(false, Ordering::Relaxed);
            return;
        }
        let rows = |f: &StoreFile, row: usize| {
            let mut at: Vec<u64> = (0..n).map(|k| (HEADER_BYTES + ids.get(k) as usize * row) as u64).collect();
            at.sort_unstable();
            advise_merged(f, at.into_iter().map(|a| (a, a + row as u64)));
        };
        // (Once the index and shapes are held in memory, only the records come from storage.)
        if !self.index.copied() {
            rows(&self.index, ENTRY_BYTES);
        }
        if let Some(sh) = self.shapes.as_ref().filter(|sh| !sh.copied()) {
            rows(sh, self.ndim * 8);
        }
        // The entries' pages are on their way: read them (waiting for those pages only) and
        // ask for the records, per shard, adjacent ranges merged.
        let mut ranges: Vec<(u16, u64, u64)> = Vec::with_capacity(n);
        for k in 0..n {
            if let Ok(e) = self.entry(ids.get(k)) {
                ranges.push((e.shard, e.offset, e.offset.saturating_add(e.stored_len as u64)));
            }
        }
        ranges.sort_unstable();
        for (i, shard) in self.shards.iter().enumerate() {
            advise_merged(shard, ranges.iter().filter(|r| r.0 as usize == i).map(|r| (r.1, r.2)));
        }
    }

    /// Whether a few of `ids`' index entries or records are not in memory (`mincore`): the
    /// first gather's probe. Looks at an entry only once its index page is known resident (no
    /// fault before the decision).
    fn probe_not_resident(&self, ids: crate::store::Ids<'_>) -> bool {
        let n = ids.len();
        let probes = n.min(PROBES);
        (0..probes).any(|j| {
            let id = ids.get(j * n / probes);
            let at = (HEADER_BYTES as u64).saturating_add(id.saturating_mul(ENTRY_BYTES as u64));
            match self.index.source().resident(at, ENTRY_BYTES as u64) {
                Some(false) => return true,
                None => return false,
                Some(true) => {}
            }
            let Ok(e) = self.entry(id) else { return false };
            self.shards.get(e.shard as usize).and_then(|s| s.source().resident(e.offset, (e.stored_len as u64).clamp(1, PROBE_BYTES))) == Some(false)
        })
    }

    /// Cold mode on (and, once, read-around off: from then on this store's pages come in by
    /// explicit hints).
    pub(crate) fn enter_cold(&self) {
        let r = &self.residency;
        if !r.cold.swap(true, Ordering::Relaxed) && !r.random_set.swap(true, Ordering::Relaxed) {
            for f in self.files() {
                f.source().advise(Hint::Random, 0, f.len());
            }
        }
    }

    /// Start copying the index and shapes files (when not larger than [`MAX_RESIDENT_COPY`])
    /// into process memory, once (see [`StoreFile::copy_in_background`]): a cold gather of
    /// records whose entries are not in memory either waits for two dependent reads per
    /// record, the entry's page, then the record. Started after the first cold gather, so the
    /// copy's reads do not compete with that gather's.
    pub(crate) fn hold_metadata(&self) {
        self.index.copy_in_background(MAX_RESIDENT_COPY);
        if let Some(sh) = &self.shapes {
            sh.copy_in_background(MAX_RESIDENT_COPY);
        }
    }

    /// After a gather's reads of `records` records, `bytes` bytes, took `elapsed` (hints not
    /// counted): switch cold mode on or off, and release mapped pages past the residency bound.
    pub(crate) fn observe(&self, records: usize, bytes: usize, elapsed: std::time::Duration) {
        let r = &self.residency;
        if records == 0 || self.remote {
            return;
        }
        let warm_ns = records as u64 * WARM_NS_PER_RECORD + bytes as u64 / WARM_BYTES_PER_NS;
        let ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        // Slow reads switch cold mode on; `prefetch_cold` switches it off.
        if ns > warm_ns.saturating_mul(COLD_FACTOR).max(COLD_MIN_NS) {
            self.enter_cold();
        }
        if r.cold.load(Ordering::Relaxed) {
            self.hold_metadata();
        }
        let max = r.max_mapped.load(Ordering::Relaxed);
        if max > 0 && r.since_release.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64 > max {
            r.since_release.store(0, Ordering::Relaxed);
            self.release_pages(false);
        }
    }

    /// Drop this process's mapped pages of every file (they refault from the page cache or
    /// the file on the next read); with `evict`, also ask the kernel to drop the files from the
    /// page cache (what a benchmark of cold reads does before each batch).
    pub(crate) fn release_pages(&self, evict: bool) {
        self.residency.releases.fetch_add(1, Ordering::Relaxed);
        for f in self.files() {
            f.source().advise(if evict { Hint::Evict } else { Hint::Release }, 0, f.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::prelude::*;
    use std::sync::atomic::Ordering;

    /// The first gather's probe: a store whose pages were evicted starts that gather in cold
    /// mode (before reading anything); one whose pages are in memory stays warm; an explicit
    /// `set_cold` is not overridden by the probe.
    #[test]
    fn the_first_gather_decides_the_mode_from_residency() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d");
        let rb = 4096usize;
        let n = 512usize;
        let data: Vec<u8> = (0..n * rb).map(|i| (i * 31 % 251) as u8).collect();
        let mut w = DenseWriter::create(&path, DType::UInt8, &[rb], WriterOptions::with_codec(Codec::Raw)).unwrap();
        w.append_slice(&data).unwrap();
        w.finish().unwrap();
        let ids: Vec<u64> = vec![7, 300, 3, 511, 128];
        let want: Vec<u8> = ids.iter().flat_map(|&i| data[i as usize * rb..(i as usize + 1) * rb].to_vec()).collect();

        // Resident (just read whole): warm.
        let alloc = Allocator::cpu(1 << 24);
        {
            let warm = DenseStore::open(&path).unwrap();
            let _ = warm.bind(&alloc).gather(&(0..n as u64).collect::<Vec<_>>()).unwrap();
            let again = DenseStore::open(&path).unwrap();
            let core = &again.core;
            assert!((0..n as u64).all(|i| core.shards[0].source().resident(i * rb as u64, rb as u64) == Some(true)), "pages just read are resident");
            core.prefetch_cold(crate::store::Ids::List(&ids));
            assert!(!core.residency.cold.load(Ordering::Relaxed), "resident pages: warm");
        } // (their mappings go: nothing of ours keeps the pages in memory)

        // Evicted: cold from the first gather on, the bytes unchanged.
        let cold = DenseStore::open(&path).unwrap();
        let core = &cold.core;
        core.release_pages(true);
        let evicted = ids.iter().any(|&i| core.shards[0].source().resident(i * rb as u64, rb as u64) == Some(false));
        core.prefetch_cold(crate::store::Ids::List(&ids));
        // (A file system that keeps every page, tmpfs, has nothing to evict.)
        assert_eq!(core.residency.cold.load(Ordering::Relaxed), evicted, "evicted pages ({evicted}): cold before the first read");
        assert_eq!(cold.bind(&alloc).gather(&ids).unwrap().as_bytes(), &want[..]);

        // An explicit mode stands.
        let chosen = DenseStore::open(&path).unwrap();
        chosen.core.release_pages(true);
        Store::from(chosen.clone()).set_cold(false);
        chosen.core.prefetch_cold(crate::store::Ids::List(&ids));
        assert!(!chosen.core.residency.cold.load(Ordering::Relaxed), "set_cold(false) is not overridden");
    }

    /// Cold mode holds the index and shapes in process memory: once copied, entries and shape
    /// rows come from the copy (the same bytes as the files), gathers after the files were
    /// evicted return the same records, and the copy outlives `release_pages`. A file over the
    /// size bound is not copied.
    #[test]
    fn cold_mode_keeps_index_and_shapes_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let alloc = Allocator::cpu(1 << 24);
        let wait_copied = |f: &crate::store::reader::StoreFile| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while !f.copied() {
                assert!(std::time::Instant::now() < deadline, "index copy never completed");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };

        // Dense: 3 shards, so entries name different shards and offsets.
        let path = dir.path().join("d");
        let (rb, n) = (96usize, 5000usize);
        let data: Vec<u8> = (0..n * rb).map(|i| (i * 7 % 253) as u8).collect();
        let mut w = DenseWriter::create(&path, DType::UInt8, &[rb], WriterOptions::with_codec(Codec::Raw).data_shards(3)).unwrap();
        w.append_slice(&data).unwrap();
        w.finish().unwrap();
        let dense = DenseStore::open(&path).unwrap();
        let core = &dense.core;
        let from_file: Vec<_> = (0..n as u64).map(|i| core.entry(i).unwrap()).collect();
        assert!(!core.index.copied());
        // A gather as slow as storage turns cold mode on, and the copy starts when it ends.
        core.observe(1, rb, std::time::Duration::from_secs(1));
        assert!(core.residency.cold.load(Ordering::Relaxed));
        wait_copied(&core.index);
        let on_disk = std::fs::read(path.join(crate::store::format::INDEX)).unwrap();
        assert_eq!(core.index.bytes().unwrap(), &on_disk[..], "the copy is the file");
        assert!(core.index.as_slice().is_none_or(|m| !std::ptr::eq(m.as_ptr(), core.index.bytes().unwrap().as_ptr())), "entries come from the copy");
        let from_copy: Vec<_> = (0..n as u64).map(|i| core.entry(i).unwrap()).collect();
        assert_eq!(from_copy, from_file);
        assert!(core.entry(n as u64).is_err(), "past the last entry is still an error");
        core.release_pages(true);
        assert!(core.index.copied(), "release_pages keeps the copy");
        let ids: Vec<u64> = vec![4999, 0, 1234, 1234, 2500, 17];
        let want: Vec<u8> = ids.iter().flat_map(|&i| data[i as usize * rb..(i as usize + 1) * rb].to_vec()).collect();
        assert_eq!(dense.bind(&alloc).gather(&ids).unwrap().as_bytes(), &want[..]);

        // Ragged: the shapes too.
        let path = dir.path().join("r");
        let recs: Vec<Vec<i32>> = (0..3000).map(|i| (0..(i % 37 + 1)).map(|j| i * 100 + j).collect()).collect();
        let shapes: Vec<[usize; 1]> = recs.iter().map(|r| [r.len()]).collect();
        let packed = PackedRagged::from_records(1, recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..]))).unwrap();
        let mut w = RaggedWriter::create(&path, DType::Int32, 1, WriterOptions::with_codec(Codec::Raw).data_shards(2)).unwrap();
        w.append(&packed.as_input()).unwrap();
        w.finish().unwrap();
        let ragged = RaggedStore::open(&path).unwrap();
        Store::from(ragged.clone()).set_cold(true);
        ragged.core.hold_metadata();
        wait_copied(&ragged.core.index);
        wait_copied(ragged.core.shapes.as_ref().unwrap());
        ragged.core.release_pages(true);
        let ids: Vec<u64> = vec![2999, 5, 36, 37, 1500];
        let b = ragged.bind(&alloc).gather(&ids).unwrap();
        let want: Vec<i32> = ids.iter().flat_map(|&i| recs[i as usize].clone()).collect();
        assert_eq!(b.values().as_slice::<i32>().unwrap(), &want[..]);
        let lens: Vec<i32> = b.cu_seqlens_slice().windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(lens, ids.iter().map(|&i| recs[i as usize].len() as i32).collect::<Vec<_>>());

        // Over the bound: no copy.
        let other = DenseStore::open(dir.path().join("d")).unwrap();
        other.core.index.copy_in_background(100);
        assert!(!other.core.index.copied());
        assert_eq!(other.core.entry(3).unwrap(), from_file[3]);
    }
}
