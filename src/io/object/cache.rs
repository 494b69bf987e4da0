//! Caches of fetched ranges: per opened store in memory ([`RangeCache`]) and on disk across runs ([`DiskCache`]).

#[allow(unused_imports)]
use super::*;

/// Fetched byte ranges of one opened store's files, bounded in bytes; least recently used out
/// first, except ranges pinned by a running gather.
pub(super) struct RangeCache {
    pub(super) map: BTreeMap<(u32, u64), CachedRange>,
    pub(super) bytes: u64,
    pub(super) clock: u64,
    pub(super) budget: u64,
}

pub(super) struct CachedRange {
    pub(super) data: Bytes,
    pub(super) used: u64,
    pub(super) pins: u32,
    /// Record bytes staged for one gather: dropped when the last gather using them ends
    /// (metadata pages stay, least recently used out first).
    pub(super) transient: bool,
}

impl RangeCache {
    /// The cached range of `file` covering `at..at + len`: its start and bytes.
    pub(super) fn find(&mut self, file: u32, at: u64, len: u64) -> Option<(u64, Bytes)> {
        self.clock += 1;
        let clock = self.clock;
        // Ranges may overlap (a page and a record range inside it): look at the few nearest
        // ones starting at or before `at`.
        let (&(_, start), e) = self.map.range_mut((file, 0)..=(file, at)).rev().take(4).find(|((_, start), e)| start + e.data.len() as u64 >= at + len)?;
        e.used = clock;
        Some((start, e.data.clone()))
    }

    pub(super) fn insert(&mut self, file: u32, start: u64, data: Bytes, pin: bool, transient: bool) {
        self.clock += 1;
        let n = data.len() as u64;
        let old = self.map.insert((file, start), CachedRange { data, used: self.clock, pins: pin as u32, transient });
        if let Some(old) = old {
            self.bytes -= old.data.len() as u64;
            if let Some(e) = self.map.get_mut(&(file, start)) {
                e.pins += old.pins;
                e.transient &= old.transient;
            }
        }
        self.bytes += n;
        self.evict();
    }

    pub(super) fn unpin(&mut self, file: u32, start: u64) {
        if let Some(e) = self.map.get_mut(&(file, start)) {
            e.pins = e.pins.saturating_sub(1);
            if e.pins == 0 && e.transient {
                let n = e.data.len() as u64;
                self.map.remove(&(file, start));
                self.bytes -= n;
            }
        }
        self.evict();
    }

    pub(super) fn evict(&mut self) {
        if self.bytes <= self.budget {
            return;
        }
        // Oldest unpinned first, down to 3/4 of the budget (amortises the sort).
        let mut victims: Vec<(u64, (u32, u64))> = self.map.iter().filter(|(_, e)| e.pins == 0).map(|(k, e)| (e.used, *k)).collect();
        victims.sort_unstable();
        let target = self.budget / 4 * 3;
        for (_, k) in victims {
            if self.bytes <= target {
                break;
            }
            if let Some(e) = self.map.remove(&k) {
                self.bytes -= e.data.len() as u64;
            }
        }
    }
}

/// A local folder of fetched byte ranges shared by every store configured with it (and by other
/// processes): `<dir>/<object key>/<start>-<end>`, each written to a temporary name and renamed,
/// bounded in bytes (oldest files out first). A range read back is as trustworthy as one
/// fetched: record checksums are checked on first read in every process.
pub(crate) struct DiskCache {
    pub(super) dir: PathBuf,
    pub(super) budget: u64,
    /// Bytes in the folder (scanned once, then kept up to date by this process's writes).
    pub(super) total: Mutex<Option<u64>>,
}

impl DiskCache {
    /// The cache at `dir` (one per folder in this process).
    pub(super) fn at(dir: &Path, budget: u64) -> Arc<DiskCache> {
        static ALL: OnceLock<Mutex<HashMap<PathBuf, Arc<DiskCache>>>> = OnceLock::new();
        let mut all = ALL.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
        all.entry(dir.to_path_buf()).or_insert_with(|| Arc::new(DiskCache { dir: dir.to_path_buf(), budget, total: Mutex::new(None) })).clone()
    }

    pub(super) fn files(&self) -> Vec<(std::time::SystemTime, u64, PathBuf)> {
        let mut out = Vec::new();
        let Ok(objects) = std::fs::read_dir(&self.dir) else { return out };
        for o in objects.flatten() {
            let Ok(rd) = std::fs::read_dir(o.path()) else { continue };
            for f in rd.flatten() {
                if let Ok(m) = f.metadata() {
                    if m.is_file() {
                        out.push((m.modified().unwrap_or(std::time::UNIX_EPOCH), m.len(), f.path()));
                    }
                }
            }
        }
        out
    }

    /// Account `n` new bytes; over the bound, delete the oldest files down to 3/4 of it.
    pub(super) fn added(&self, n: u64) {
        let mut total = self.total.lock().unwrap_or_else(|p| p.into_inner());
        let t = total.get_or_insert_with(|| self.files().iter().map(|f| f.1).sum());
        *t += n;
        if *t <= self.budget {
            return;
        }
        let mut files = self.files();
        files.sort();
        let mut now: u64 = files.iter().map(|f| f.1).sum();
        for (_, len, path) in files {
            if now <= self.budget / 4 * 3 {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                now -= len;
            }
        }
        *t = now;
    }
}

/// One object's ranges in a [`DiskCache`].
pub(super) struct DiskObject {
    pub(super) cache: Arc<DiskCache>,
    pub(super) folder: PathBuf,
    /// start -> end of the ranges on disk (listed once, then kept up to date).
    pub(super) ranges: Mutex<Option<BTreeMap<u64, u64>>>,
}

impl DiskObject {
    pub(super) fn new(cache: Arc<DiskCache>, url: &str, size: u64) -> DiskObject {
        // Objects of published stores never change (each upload has its own folder); the
        // size in the key keeps a replaced object of another length apart anyway.
        let key = twox_hash::XxHash3_64::oneshot(format!("{url}\n{size}").as_bytes());
        let folder = cache.dir.join(format!("{key:016x}"));
        DiskObject { cache, folder, ranges: Mutex::new(None) }
    }

    pub(super) fn with_ranges<T>(&self, f: impl FnOnce(&mut BTreeMap<u64, u64>) -> T) -> T {
        let mut g = self.ranges.lock().unwrap_or_else(|p| p.into_inner());
        let map = g.get_or_insert_with(|| {
            let mut m = BTreeMap::new();
            if let Ok(rd) = std::fs::read_dir(&self.folder) {
                for e in rd.flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some((a, z)) = name.split_once('-') {
                        if let (Ok(a), Ok(z)) = (u64::from_str_radix(a, 16), u64::from_str_radix(z, 16)) {
                            if z > a {
                                m.insert(a, z);
                            }
                        }
                    }
                }
            }
            m
        });
        f(map)
    }

    /// The bytes of `r` when a range on disk covers it.
    pub(super) fn read(&self, r: Range<u64>) -> Option<Bytes> {
        use std::os::unix::fs::FileExt;
        let (a, z) = self.with_ranges(|m| m.range(..=r.start).next_back().map(|(&a, &z)| (a, z)))?;
        if z < r.end {
            return None;
        }
        let path = self.folder.join(format!("{a:016x}-{z:016x}"));
        let file = std::fs::File::open(&path).ok().filter(|f| f.metadata().is_ok_and(|m| m.len() == z - a));
        let Some(file) = file else {
            // Evicted (by this or another process) or damaged: forget it.
            self.with_ranges(|m| m.remove(&a));
            let _ = std::fs::remove_file(&path);
            return None;
        };
        let mut buf = vec![0u8; (r.end - r.start) as usize];
        file.read_exact_at(&mut buf, r.start - a).ok()?;
        Some(Bytes::from(buf))
    }

    /// Keep `data`, the bytes of `r` (best effort: a full disk only costs the cache).
    pub(super) fn write(&self, r: Range<u64>, data: &[u8]) {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if std::fs::create_dir_all(&self.folder).is_err() {
            return;
        }
        let name = format!("{:016x}-{:016x}", r.start, r.end);
        let tmp = self.folder.join(format!(".{name}.{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
        if std::fs::write(&tmp, data).is_err() || std::fs::rename(&tmp, self.folder.join(&name)).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        self.with_ranges(|m| m.insert(r.start, r.end));
        self.cache.added(data.len() as u64);
    }
}
