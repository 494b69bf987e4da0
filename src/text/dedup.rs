//! [`ExactDedup`]: exact deduplication by XXH3-64, bounded in memory, persistent, exactly once.
//!
//! Seen hashes live in an in-memory set up to `max_memory` bytes; past that they are spilled
//! as sorted runs to the state folder (looked up by binary search over the mapped run), or,
//! without a folder, the insert fails with [`Error::MemoryLimit`]. Persistence is a log:
//! `dedup.log` holds every committed hash (little-endian u64, append-only), `dedup.committed`
//! how many of them are committed (written by temp + fsync + rename). [`ExactDedup::commit`]
//! appends the hashes inserted since the last commit and fsyncs; a log tail beyond the
//! committed count (a crash between the two) is cut off when the folder is opened again, so a
//! replay after a crash sees exactly the committed state. A pipeline that stores the count in
//! its own atomic checkpoint opens with [`ExactDedup::open_at`] instead.

use std::collections::HashSet;
use std::fs::File;
use std::hash::BuildHasherDefault;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::text::quality::IdHasher;

const LOG: &str = "dedup.log";
const COMMITTED: &str = "dedup.committed";

/// Bytes one hash costs in the in-memory set (hashbrown: 8 bytes + control byte, at 7/8 load).
const BYTES_PER_HASH: usize = 10;

type HashSet64 = HashSet<u64, BuildHasherDefault<IdHasher>>;

/// A sorted run of spilled hashes, mapped.
#[derive(Debug)]
struct Run {
    /// The run file, mapped (through the guarded mapping every local file read uses).
    map: crate::io::Mapped,
    path: PathBuf,
}

impl Run {
    /// The run's bytes: sorted little-endian u64 hashes.
    fn words(&self) -> &[u8] {
        use crate::io::ByteSource;
        self.map.as_slice().unwrap_or(&[])
    }

    fn contains(&self, h: u64) -> bool {
        let words = self.words();
        let n = words.len() / 8;
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let v = u64::from_le_bytes(words[mid * 8..mid * 8 + 8].try_into().unwrap_or([0; 8]));
            match v.cmp(&h) {
                std::cmp::Ordering::Equal => return true,
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        false
    }
}

/// Exact dedup over XXH3-64 hashes of documents.
#[derive(Debug)]
pub struct ExactDedup {
    mem: HashSet64,
    pending: Vec<u64>,
    runs: Vec<Run>,
    dir: Option<PathBuf>,
    log: Option<File>,
    committed: u64,
    max_memory: usize,
    next_run: usize,
}

fn io(path: &Path, source: std::io::Error) -> Error {
    Error::Io { path: path.to_path_buf(), source }
}

impl ExactDedup {
    /// An in-memory dedup set of at most `max_memory` bytes (inserting past it is an error).
    pub fn in_memory(max_memory: usize) -> ExactDedup {
        ExactDedup { mem: HashSet64::default(), pending: Vec::new(), runs: Vec::new(), dir: None, log: None, committed: 0, max_memory, next_run: 0 }
    }

    /// Open (or create) a persistent dedup set in `dir` at its last commit.
    pub fn open(dir: impl AsRef<Path>, max_memory: usize) -> Result<ExactDedup> {
        let dir = dir.as_ref();
        crate::io::create_dir_all(dir)?;
        let committed = read_count(&dir.join(COMMITTED))?;
        ExactDedup::open_at(dir, max_memory, committed)
    }

    /// Open `dir` at exactly `committed` hashes (a count kept in the caller's own checkpoint);
    /// a longer log is cut back to it, a shorter one is an error (the checkpoint is newer than
    /// the log it names: the folder was swapped or damaged).
    pub fn open_at(dir: impl AsRef<Path>, max_memory: usize, committed: u64) -> Result<ExactDedup> {
        let dir = dir.as_ref().to_path_buf();
        crate::io::create_dir_all(&dir)?;
        // Spill runs are caches of the log: rebuilt below.
        for e in crate::io::list_dir(&dir)? {
            let p = e.path;
            if e.name.starts_with("run-") && e.name.ends_with(".bin") {
                crate::io::remove_file(&p)?;
            }
        }
        let log_path = dir.join(LOG);
        let mut log = crate::io::open_state(&log_path, false)?;
        let len = log.metadata().map_err(|e| io(&log_path, e))?.len();
        let want = committed.checked_mul(8).ok_or_else(|| Error::invalid("committed", format!("{committed} hashes")))?;
        if len < want {
            return Err(Error::corrupt(&log_path, format!("the checkpoint names {committed} committed hashes but the log holds {}", len / 8)));
        }
        if len > want {
            log.set_len(want).map_err(|e| io(&log_path, e))?;
            log.sync_all().map_err(|e| io(&log_path, e))?;
        }
        let mut d = ExactDedup { mem: HashSet64::default(), pending: Vec::new(), runs: Vec::new(), dir: Some(dir), log: None, committed, max_memory, next_run: 0 };
        log.seek(SeekFrom::Start(0)).map_err(|e| io(&log_path, e))?;
        let mut reader = std::io::BufReader::with_capacity(1 << 20, &log);
        let mut buf = [0u8; 8];
        for _ in 0..committed {
            reader.read_exact(&mut buf).map_err(|e| io(&log_path, e))?;
            let h = u64::from_le_bytes(buf);
            if !d.contains(h) {
                d.mem.insert(h);
                d.maybe_spill()?;
            }
        }
        drop(reader);
        d.log = Some(log);
        Ok(d)
    }

    /// Hashes seen (committed and pending).
    pub fn len(&self) -> u64 {
        self.committed + self.pending.len() as u64
    }

    /// True when nothing was seen.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Committed hashes (the count a checkpoint stores).
    pub fn committed(&self) -> u64 {
        self.committed
    }

    fn contains(&self, h: u64) -> bool {
        self.mem.contains(&h) || self.runs.iter().any(|r| r.contains(h))
    }

    /// True when `h` was not seen before (it is then recorded).
    pub fn insert_one(&mut self, h: u64) -> Result<bool> {
        if self.contains(h) {
            return Ok(false);
        }
        self.mem.insert(h);
        self.pending.push(h);
        self.maybe_spill()?;
        Ok(true)
    }

    /// For each hash in order: true when it was not seen before (it is then recorded, so a
    /// repeat later in the same slice is false).
    pub fn insert(&mut self, hashes: &[u64]) -> Result<Vec<bool>> {
        hashes.iter().map(|&h| self.insert_one(h)).collect()
    }

    /// Record the pending hashes durably; returns the committed count.
    pub fn commit(&mut self) -> Result<u64> {
        self.commit_upto(self.len())
    }

    /// Record durably the hashes inserted up to the moment the set held `count` (a count
    /// [`ExactDedup::len`] returned earlier; later inserts stay pending). A pipeline that
    /// prefetches records this count with each batch and commits up to the batch it delivered.
    pub fn commit_upto(&mut self, count: u64) -> Result<u64> {
        if count < self.committed || count > self.len() {
            return Err(Error::invalid("count", format!("{count} is outside the committed {} .. seen {}", self.committed, self.len())));
        }
        let k = (count - self.committed) as usize;
        let Some(dir) = self.dir.clone() else {
            self.committed += k as u64;
            self.pending.drain(..k);
            return Ok(self.committed);
        };
        let log_path = dir.join(LOG);
        if let Some(log) = self.log.as_mut() {
            let mut bytes = Vec::with_capacity(k * 8);
            for h in &self.pending[..k] {
                bytes.extend_from_slice(&h.to_le_bytes());
            }
            log.write_all(&bytes).map_err(|e| io(&log_path, e))?;
            log.sync_data().map_err(|e| io(&log_path, e))?;
        }
        self.committed += k as u64;
        self.pending.drain(..k);
        write_atomic(&dir, COMMITTED, self.committed.to_string().as_bytes())?;
        Ok(self.committed)
    }

    fn maybe_spill(&mut self) -> Result<()> {
        if self.mem.len() * BYTES_PER_HASH <= self.max_memory {
            return Ok(());
        }
        let Some(dir) = self.dir.clone() else {
            return Err(Error::MemoryLimit { bytes: BYTES_PER_HASH, live: self.mem.len() * BYTES_PER_HASH, max_bytes: self.max_memory });
        };
        let mut v: Vec<u64> = self.mem.drain().collect();
        v.sort_unstable();
        let path = dir.join(format!("run-{}.bin", self.next_run));
        self.next_run += 1;
        let mut f = crate::io::open_state(&path, true)?;
        let mut bytes = Vec::with_capacity(v.len() * 8);
        for h in &v {
            bytes.extend_from_slice(&h.to_le_bytes());
        }
        f.write_all(&bytes).map_err(|e| io(&path, e))?;
        drop(f);
        // The run file was just written by us and is never modified or truncated while mapped
        // (runs are removed only when the set is reopened or merged, after unmapping).
        let map = crate::io::Mapped::open(path.clone(), bytes.len() as u64)?;
        self.runs.push(Run { map, path });
        if self.runs.len() > 8 {
            self.merge_runs(&dir)?;
        }
        Ok(())
    }

    /// Merge every run into one (lookups stay at one binary search per run, runs <= 8).
    fn merge_runs(&mut self, dir: &Path) -> Result<()> {
        let mut all: Vec<u64> = Vec::new();
        for r in &self.runs {
            all.extend(r.words().chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))));
        }
        all.sort_unstable();
        all.dedup();
        let old: Vec<PathBuf> = self.runs.drain(..).map(|r| r.path).collect();
        let path = dir.join(format!("run-{}.bin", self.next_run));
        self.next_run += 1;
        let mut f = crate::io::open_state(&path, true)?;
        let bytes: Vec<u8> = all.iter().flat_map(|h| h.to_le_bytes()).collect();
        f.write_all(&bytes).map_err(|e| io(&path, e))?;
        drop(f);
        let map = crate::io::Mapped::open(path.clone(), bytes.len() as u64)?;
        self.runs.push(Run { map, path });
        for p in old {
            crate::io::remove_file(&p)?;
        }
        Ok(())
    }
}

/// A count stored as text in `path` (0 when the file does not exist; a FIFO, a device or a
/// file longer than a count is a typed error).
pub(crate) fn read_count(path: &Path) -> Result<u64> {
    match crate::io::read_optional(path, 64)? {
        Some(b) => {
            let text = std::str::from_utf8(&b).map_err(|_| Error::corrupt(path, "not UTF-8"))?;
            text.trim().parse().map_err(|_| Error::corrupt(path, format!("'{}' is not a count", text.trim())))
        }
        None => Ok(0),
    }
}

/// Replace `dir/name` with `bytes` durably (see [`crate::io::write_atomic`]).
pub(crate) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    crate::io::write_atomic(&dir.join(name), bytes)
}
