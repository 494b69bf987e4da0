//! File-based collectives for ranks without MPI: every rank of a group calls the same
//! collectives in the same order, exchanging small messages through files in a shared folder.
//!
//! Call `n` of rank `r` writes `{dir}/{ns}.{n}.{r}` (written to a hidden sibling, then renamed,
//! so a reader never sees half a message) and waits until all `size` files of call `n` exist.
//! Once a rank has read every file of call `n`, every rank has finished call `n - 1`, so it
//! removes its own file of call `n - 1`: a long run leaves at most two calls' files behind.
//!
//! Nothing here hangs: a rank that never arrives makes the others fail after the timeout with
//! an error naming the missing ranks.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// File-based `allgather` / `barrier` for `size` ranks sharing a folder.
#[derive(Debug)]
pub struct FileComm {
    dir: PathBuf,
    rank: usize,
    size: usize,
    ns: String,
    seq: u64,
    timeout: Duration,
}

impl FileComm {
    /// Rank `rank` of `size` in namespace `ns` (unique within `dir` among the groups using it;
    /// letters, digits, `-` and `_`). The folder is created if missing.
    pub fn new(dir: impl AsRef<Path>, rank: usize, size: usize, ns: &str) -> Result<FileComm> {
        if size == 0 || rank >= size {
            return Err(Error::invalid("rank", format!("rank {rank} is not in a group of {size}")));
        }
        check_ns(ns)?;
        let dir = dir.as_ref().to_path_buf();
        crate::io::create_dir_all(&dir)?;
        Ok(FileComm { dir, rank, size, ns: ns.to_string(), seq: 0, timeout: Duration::from_secs(120) })
    }

    /// The same communicator waiting at most `timeout` for the other ranks.
    pub fn with_timeout(mut self, timeout: Duration) -> FileComm {
        self.timeout = timeout;
        self
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The shared folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The namespace.
    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// Every rank's `msg`, in rank order.
    pub fn allgather(&mut self, msg: &[u8]) -> Result<Vec<Vec<u8>>> {
        let seq = self.seq;
        self.seq += 1;
        let file = |r: usize| self.dir.join(format!("{}.{seq}.{r}", self.ns));
        write_atomic(&file(self.rank), msg)?;
        let deadline = Instant::now() + self.timeout;
        let mut out: Vec<Option<Vec<u8>>> = vec![None; self.size];
        let mut pause = Duration::from_micros(200);
        loop {
            for (r, slot) in out.iter_mut().enumerate() {
                if slot.is_none() {
                    if let Some(b) = crate::io::read_optional(&file(r), MAX_MESSAGE_BYTES)? {
                        *slot = Some(b);
                    }
                }
            }
            let missing: Vec<usize> = out.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(r, _)| r).collect();
            if missing.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    what: format!(
                        "rank {} of {} waited {:.1} s in collective call {seq} of '{}' in {} for rank(s) {missing:?}",
                        self.rank,
                        self.size,
                        self.timeout.as_secs_f64(),
                        self.ns,
                        self.dir.display()
                    ),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
        if seq > 0 {
            // Every rank wrote call `seq`, so every rank is done reading call `seq - 1`.
            let _ = crate::io::remove_file(&self.dir.join(format!("{}.{}.{}", self.ns, seq - 1, self.rank)));
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Wait until every rank has reached the same call.
    pub fn barrier(&mut self) -> Result<()> {
        self.allgather(&[]).map(|_| ())
    }
}

/// Namespaces become file names: a restricted alphabet keeps them from naming other files.
pub(crate) fn check_ns(ns: &str) -> Result<()> {
    if ns.is_empty() || ns.len() > 100 || !ns.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(Error::invalid("namespace", format!("'{ns}' must be 1-100 letters, digits, '-' or '_'")));
    }
    Ok(())
}

/// Largest rendezvous message read (a FIFO, device or longer file is a typed error).
pub(crate) const MAX_MESSAGE_BYTES: u64 = 64 << 20;

/// Write `bytes` to `path` through a hidden sibling and a rename: readers see all or nothing.
/// Not fsynced: rendezvous files live only as long as the ranks reading them.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::io::write_atomic_with(path, bytes, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allgather_across_threads_in_rank_order_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let size = 4;
        let results: Vec<Vec<Vec<Vec<u8>>>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..size)
                .map(|r| {
                    let d = dir.path().to_path_buf();
                    s.spawn(move || {
                        let mut c = FileComm::new(&d, r, size, "t").unwrap();
                        let mut got = Vec::new();
                        for call in 0..5u8 {
                            got.push(c.allgather(&[r as u8, call]).unwrap());
                        }
                        c.barrier().unwrap();
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for got in &results {
            for (call, msgs) in got.iter().enumerate() {
                let want: Vec<Vec<u8>> = (0..size).map(|r| vec![r as u8, call as u8]).collect();
                assert_eq!(msgs, &want);
            }
        }
        // Only the files of the last two calls remain.
        let mut left: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        left.sort();
        assert!(left.iter().all(|n| n.starts_with("t.4.") || n.starts_with("t.5.")), "{left:?}");
    }

    #[test]
    fn missing_rank_times_out_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = FileComm::new(dir.path(), 0, 3, "x").unwrap().with_timeout(Duration::from_millis(100));
        let e = c.allgather(b"hi").unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("[1, 2]"), "{e}");
    }

    #[test]
    fn bad_arguments_are_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(FileComm::new(dir.path(), 2, 2, "a"), Err(Error::InvalidArgument { .. })));
        assert!(matches!(FileComm::new(dir.path(), 0, 0, "a"), Err(Error::InvalidArgument { .. })));
        assert!(matches!(FileComm::new(dir.path(), 0, 1, "../a"), Err(Error::InvalidArgument { .. })));
        assert!(matches!(FileComm::new(dir.path(), 0, 1, "a.b"), Err(Error::InvalidArgument { .. })));
    }
}
