//! Byte sources: how a reader gets at the bytes of a store's files.
//!
//! [`StoreCore`](crate::store) reads every file through [`ByteSource`] (size, positional reads,
//! and a borrowed-slice fast path for mapped files) and finds its files through a [`Location`]
//! (a folder of named files). Two local implementations live here: memory-mapped files (the
//! default: gathers copy or decode straight from the page cache) and positional reads (`pread`,
//! no mapping: for cold data larger than memory, where page faults would serialise random
//! reads). Remote stores add an object-store location behind the same two traits.

use std::fs::File;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, Result};

/// The bytes of one file of a store.
pub trait ByteSource: Send + Sync {
    /// Where the bytes come from (for error messages).
    fn path(&self) -> &Path;

    /// Size in bytes.
    fn len(&self) -> u64;

    /// True for an empty file.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole file as one borrowed slice, when it is mapped (the fast path). Sources that
    /// return `None` are read with [`ByteSource::read_at`]. Contract: a source that returns a
    /// slice returns the same one (same address, length and bytes) for as long as it lives;
    /// readers cache it at open.
    fn as_slice(&self) -> Option<&[u8]>;

    /// Fill all of `out` with the bytes at `offset..offset + out.len()`; a range past the end
    /// is an [`Error::Corrupt`] naming the file.
    fn read_at(&self, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()>;

    /// Accesses to this source's mapping that found the file cut short under it (SIGBUS
    /// contained, see `store::sigbus`). Nonzero means the bytes read can no longer be trusted.
    fn lost_pages(&self) -> u64 {
        0
    }

    /// Tell the kernel how bytes will be used (a hint: never fails, may do nothing). Local
    /// files pass it on; other sources ignore it.
    fn advise(&self, _hint: Hint, _offset: u64, _len: u64) {}

    /// Whether the bytes at `offset..offset + len` are all in memory (the page cache), when
    /// the source can tell (mapped files); `None` otherwise.
    fn resident(&self, _offset: u64, _len: u64) -> Option<bool> {
        None
    }

    /// [`ByteSource::read_at`] for data that is probably not in memory: a mapped source reads
    /// with a positional read (one system call that waits for the storage once) instead of
    /// page-faulting through its mapping one page at a time.
    fn read_at_cold(&self, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        self.read_at(offset, out)
    }

    /// The object-store file behind this source, when it is one (gathers stage its ranges
    /// first: see `store::object::preload`).
    fn as_object(&self) -> Option<&crate::store::object::ObjectFile> {
        None
    }
}

/// How a reader is about to use a byte range (see [`ByteSource::advise`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hint {
    /// These bytes are read soon: start reading them from storage now (asynchronously).
    WillNeed,
    /// Accesses are random: no read-around on page faults (the whole source).
    Random,
    /// Drop this process's mapped pages of the whole source (they stay in the page cache).
    Release,
    /// [`Hint::Release`], then ask the kernel to drop the file's pages from the page cache.
    Evict,
}

/// Fill `out` from `file` at `offset` with positional reads (retrying short reads and EINTR).
fn pread_exact(file: &File, path: &Path, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut done = 0usize;
    while done < out.len() {
        let rest = &mut out[done..];
        // SAFETY: `rest` is a live, writable region of `rest.len()` bytes that pread fills
        // (it never reads it); `fd` is open for the lifetime of `file`.
        let n = unsafe { libc::pread(fd, rest.as_mut_ptr().cast(), rest.len(), (offset + done as u64) as libc::off_t) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(Error::io(path, e));
        }
        if n == 0 {
            return Err(Error::corrupt(path, format!("file ended at {} while reading {} bytes at {offset}", offset + done as u64, out.len())));
        }
        done += n as usize;
    }
    Ok(())
}

/// `posix_fadvise` on `file` (a hint: errors ignored).
fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise only reads its integer arguments; `file` is open for the call.
    let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset as libc::off_t, len as libc::off_t, advice) };
}

impl dyn ByteSource + '_ {
    /// `len` bytes at `offset` into a new vector.
    pub fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut v: Vec<u8> = Vec::with_capacity(len);
        self.read_at(offset, &mut v.spare_capacity_mut()[..len])?;
        // SAFETY: `read_at` succeeded, so all `len` bytes were written.
        unsafe { v.set_len(len) };
        Ok(v)
    }

    /// A fixed-size array at `offset`.
    pub fn read_array<const N: usize>(&self, offset: u64) -> Result<[u8; N]> {
        if let Some(s) = self.as_slice() {
            let at = usize::try_from(offset).unwrap_or(usize::MAX);
            return s
                .get(at..at.saturating_add(N))
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| past_end(self.path(), offset, N, self.len()));
        }
        let mut out = [MaybeUninit::<u8>::uninit(); N];
        self.read_at(offset, &mut out)?;
        // SAFETY: `read_at` succeeded, so every byte of `out` was written.
        Ok(out.map(|b| unsafe { b.assume_init() }))
    }
}

pub(crate) fn past_end(path: &Path, offset: u64, len: usize, size: u64) -> Error {
    Error::corrupt(path, format!("read of {len} bytes at offset {offset} runs past the end of the file ({size} bytes)"))
}

/// Where a store's files are found.
pub trait Location: Send + Sync {
    /// The store's path or URL (for error messages and `path()`).
    fn path(&self) -> &Path;

    /// A small file read whole (manifest, dictionary); `None` when it does not exist.
    fn read_small(&self, name: &str, max_bytes: u64) -> Result<Option<Vec<u8>>>;

    /// Open file `name`, checking that it is exactly `expected_len` bytes long.
    fn open(&self, name: &str, expected_len: u64) -> Result<Box<dyn ByteSource>>;

    /// Open every `(name, expected_len)`, in order (a remote location sends the requests
    /// together; the default opens one after another).
    fn open_all(&self, files: &[(String, u64)]) -> Result<Vec<Box<dyn ByteSource>>> {
        files.iter().map(|(n, len)| self.open(n, *len)).collect()
    }
}

/// How a local store's files are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadMode {
    /// Memory-map every file (default).
    #[default]
    Mmap,
    /// Positional reads (`pread`), no mapping.
    Pread,
}

/// A local folder.
#[derive(Clone, Debug)]
pub struct LocalFolder {
    path: PathBuf,
    mode: ReadMode,
}

impl LocalFolder {
    /// The folder at `path`, read with `mode`.
    pub fn new(path: impl Into<PathBuf>, mode: ReadMode) -> LocalFolder {
        LocalFolder { path: path.into(), mode }
    }
}

/// Open `path` if it is a regular file (`None` when it does not exist). Anything else is
/// refused before opening: opening a FIFO for reading blocks until a writer appears, and a
/// device (a symlink to `/dev/zero`) never ends. Checked again on the opened file, in case the
/// path was swapped in between.
pub(crate) fn open_regular(path: &Path) -> Result<Option<(File, u64)>> {
    let not_regular = || Error::corrupt(path, "not a regular file");
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(_) => return Err(not_regular()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    }
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    Ok(Some((f, meta.len())))
}

/// Read a whole regular file of at most `max_bytes` (a FIFO, a device or a longer file is a
/// typed error, never a hang or an unbounded read).
pub(crate) fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    if std::fs::metadata(path).is_ok_and(|m| !m.is_file()) {
        return Err(Error::invalid("file", format!("{} is not a regular file", path.display())));
    }
    let (f, len) = open_regular(path)?.ok_or_else(|| Error::NotFound { path: path.to_path_buf(), reason: "no such file".into() })?;
    if len > max_bytes {
        return Err(Error::invalid("file", format!("{} is {len} bytes, more than the {max_bytes} allowed", path.display())));
    }
    let mut out = Vec::with_capacity(len as usize);
    f.take(max_bytes + 1).read_to_end(&mut out).map_err(|e| Error::io(path, e))?;
    if out.len() as u64 > max_bytes {
        return Err(Error::invalid("file", format!("{} grew past the {max_bytes} bytes allowed while being read", path.display())));
    }
    Ok(out)
}

/// Open a regular file of the store, checking its size.
fn open_file(path: &Path, expected_len: u64) -> Result<(File, u64)> {
    let (f, len) = open_regular(path)?.ok_or_else(|| Error::corrupt(path, "file listed in the manifest is missing"))?;
    if len != expected_len {
        return Err(Error::corrupt(path, format!("file is {len} bytes, manifest says {expected_len} (truncated or extended)")));
    }
    Ok((f, len))
}

impl Location for LocalFolder {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_small(&self, name: &str, max_bytes: u64) -> Result<Option<Vec<u8>>> {
        use std::io::Read;
        let p = self.path.join(name);
        let Some((f, len)) = open_regular(&p)? else { return Ok(None) };
        if len > max_bytes {
            return Err(Error::corrupt(&p, format!("file is {len} bytes, more than the {max_bytes} allowed")));
        }
        let mut out = Vec::with_capacity(len as usize);
        f.take(max_bytes + 1).read_to_end(&mut out).map_err(|e| Error::io(&p, e))?;
        if out.len() as u64 > max_bytes {
            return Err(Error::corrupt(&p, format!("file grew past the {max_bytes} bytes allowed")));
        }
        Ok(Some(out))
    }

    fn open(&self, name: &str, expected_len: u64) -> Result<Box<dyn ByteSource>> {
        let p = self.path.join(name);
        Ok(match self.mode {
            ReadMode::Mmap => Box::new(Mapped::open(p, expected_len)?),
            ReadMode::Pread => Box::new(PreadFile::open(p, expected_len)?),
        })
    }
}

/// A read-only mapping of a whole file (empty files have no mapping).
pub struct Mapped {
    path: PathBuf,
    /// Declared before `map`: unregistered before the mapping goes away.
    guard: crate::store::sigbus::Guard,
    map: Option<Mmap>,
    /// Opened on the first cold read ([`ByteSource::read_at_cold`]).
    file: std::sync::OnceLock<Option<File>>,
}

impl Mapped {
    /// Map `path`, which must be exactly `expected_len` bytes.
    pub fn open(path: PathBuf, expected_len: u64) -> Result<Mapped> {
        let (f, len) = open_file(&path, expected_len)?;
        let map = if len == 0 {
            None
        } else {
            // SAFETY: the file is opened read-only and stores are immutable once published; a
            // concurrent external modification would violate the store contract (documented),
            // and every read is bounds-checked against the mapping length.
            Some(unsafe { Mmap::map(&f) }.map_err(|e| Error::io(&path, e))?)
        };
        let guard = match &map {
            Some(m) => crate::store::sigbus::Guard::register(m.as_ptr(), m.len()),
            None => crate::store::sigbus::Guard::register(std::ptr::null(), 0),
        };
        Ok(Mapped { path, guard, map, file: std::sync::OnceLock::new() })
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

impl ByteSource for Mapped {
    fn path(&self) -> &Path {
        &self.path
    }

    fn len(&self) -> u64 {
        self.bytes().len() as u64
    }

    #[inline]
    fn as_slice(&self) -> Option<&[u8]> {
        Some(self.bytes())
    }

    fn read_at(&self, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        let b = self.bytes();
        let at = usize::try_from(offset).unwrap_or(usize::MAX);
        let src = b.get(at..at.saturating_add(out.len())).ok_or_else(|| past_end(&self.path, offset, out.len(), b.len() as u64))?;
        // SAFETY: `src` and `out` have equal lengths; the mapping and `out` do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr().cast::<u8>(), src.len()) };
        Ok(())
    }

    fn lost_pages(&self) -> u64 {
        self.guard.faults()
    }

    fn resident(&self, offset: u64, len: u64) -> Option<bool> {
        const PAGE: usize = 4096;
        let m = self.map.as_ref()?;
        let at = usize::try_from(offset).ok()?.min(m.len());
        let end = at.saturating_add(usize::try_from(len).ok()?).min(m.len());
        if end <= at {
            return Some(true);
        }
        let base = m.as_ptr() as usize;
        let first = (base + at) & !(PAGE - 1);
        let pages = (base + end - first).div_ceil(PAGE);
        let mut vec = [0u8; 64];
        let pages = pages.min(vec.len());
        // SAFETY: `first..first + pages * PAGE` lies within the live mapping `m` (page-aligned
        // start at or after the mapping's first page, which is page-aligned; at most up to the
        // page holding `end`); mincore writes one byte per page into `vec`, which has room.
        let r = unsafe { libc::mincore(first as *mut libc::c_void, pages * PAGE, vec.as_mut_ptr()) };
        (r == 0).then(|| vec[..pages].iter().all(|v| v & 1 == 1))
    }

    fn read_at_cold(&self, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        let end = offset.checked_add(out.len() as u64).filter(|&e| e <= self.len());
        if end.is_none() {
            return Err(past_end(&self.path, offset, out.len(), self.len()));
        }
        // The same file the mapping shows (stores are immutable); if it cannot be opened now,
        // the mapping still can be read.
        match self.file.get_or_init(|| File::open(&self.path).ok()) {
            Some(f) => pread_exact(f, &self.path, offset, out),
            None => self.read_at(offset, out),
        }
    }

    fn advise(&self, hint: Hint, offset: u64, len: u64) {
        let Some(m) = &self.map else { return };
        match hint {
            Hint::WillNeed => {
                let at = usize::try_from(offset).unwrap_or(usize::MAX).min(m.len());
                let n = usize::try_from(len).unwrap_or(usize::MAX).min(m.len() - at);
                if n > 0 {
                    let _ = m.advise_range(memmap2::Advice::WillNeed, at, n);
                }
            }
            Hint::Random => {
                let _ = m.advise(memmap2::Advice::Random);
            }
            Hint::Release | Hint::Evict => {
                // SAFETY: the mapping is read-only and the file is immutable (the
                // store contract): dropping its pages only makes the next access fault the same
                // bytes back in from the file. No reference can observe a change.
                let _ = unsafe { m.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
                if hint == Hint::Evict {
                    if let Ok(f) = File::open(&self.path) {
                        fadvise(&f, 0, 0, libc::POSIX_FADV_DONTNEED);
                    }
                }
            }
        }
    }
}

/// A file read with positional reads (no mapping, no page faults on the reading thread).
pub struct PreadFile {
    path: PathBuf,
    file: File,
    len: u64,
}

impl PreadFile {
    /// Open `path`, which must be exactly `expected_len` bytes.
    pub fn open(path: PathBuf, expected_len: u64) -> Result<PreadFile> {
        let (file, len) = open_file(&path, expected_len)?;
        Ok(PreadFile { path, file, len })
    }
}

impl ByteSource for PreadFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn as_slice(&self) -> Option<&[u8]> {
        None
    }

    fn advise(&self, hint: Hint, offset: u64, len: u64) {
        match hint {
            Hint::WillNeed => fadvise(&self.file, offset, len, libc::POSIX_FADV_WILLNEED),
            Hint::Random => fadvise(&self.file, 0, 0, libc::POSIX_FADV_RANDOM),
            Hint::Release => {}
            Hint::Evict => fadvise(&self.file, 0, 0, libc::POSIX_FADV_DONTNEED),
        }
    }

    fn read_at(&self, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        let end = offset.checked_add(out.len() as u64).filter(|&e| e <= self.len);
        if end.is_none() {
            return Err(past_end(&self.path, offset, out.len(), self.len));
        }
        pread_exact(&self.file, &self.path, offset, out)
    }

}

/// xxh3 of a whole source, hex (streamed in 1 MiB pieces for unmapped sources).
pub(crate) fn source_hash_hex(src: &dyn ByteSource) -> Result<String> {
    use std::hash::Hasher;
    if let Some(s) = src.as_slice() {
        return Ok(crate::store::writer::file_hash_hex(s));
    }
    let mut h = twox_hash::XxHash3_64::with_seed(0);
    let mut at = 0u64;
    let mut buf: Vec<u8> = Vec::with_capacity(1 << 20);
    while at < src.len() {
        let n = (src.len() - at).min(1 << 20) as usize;
        src.read_at(at, &mut buf.spare_capacity_mut()[..n])?;
        // SAFETY: `read_at` succeeded, so the first `n` bytes were written (capacity >= n).
        unsafe { buf.set_len(n) };
        h.write(&buf);
        buf.clear();
        at += n as u64;
    }
    Ok(format!("{:016x}", h.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapped_and_pread_agree_and_check_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let m: Box<dyn ByteSource> = Box::new(Mapped::open(p.clone(), 5000).unwrap());
        let r: Box<dyn ByteSource> = Box::new(PreadFile::open(p.clone(), 5000).unwrap());
        for s in [&m, &r] {
            assert_eq!(s.len(), 5000);
            assert_eq!(s.read_vec(4000, 1000).unwrap(), &data[4000..]);
            assert_eq!(s.read_array::<4>(10).unwrap(), [70, 77, 84, 91]);
            assert!(matches!(s.read_vec(4001, 1000), Err(Error::Corrupt { .. })));
            assert!(s.read_array::<8>(u64::MAX - 2).is_err());
            assert_eq!(source_hash_hex(s.as_ref()).unwrap(), crate::store::writer::file_hash_hex(&data));
        }
        assert!(r.as_slice().is_none() && m.as_slice() == Some(&data[..]));
        assert!(matches!(Mapped::open(p.clone(), 4999), Err(Error::Corrupt { .. })));
        assert!(matches!(PreadFile::open(dir.path().to_path_buf(), 0), Err(Error::Corrupt { .. })), "a folder is not a store file");
        let folder = LocalFolder::new(dir.path(), ReadMode::Pread);
        assert_eq!(folder.read_small("f", 5000).unwrap().unwrap(), data);
        assert!(folder.read_small("f", 4999).is_err(), "size cap");
        assert!(folder.read_small("missing", 10).unwrap().is_none());
        // A FIFO or a device in place of a store file is refused at once (opening a FIFO for
        // reading would block until a writer appears; a device never ends).
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY (test): a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(folder.read_small("fifo", 100), Err(Error::Corrupt { .. })));
        assert!(matches!(Mapped::open(fifo.clone(), 0), Err(Error::Corrupt { .. })));
        assert!(matches!(PreadFile::open(fifo, 0), Err(Error::Corrupt { .. })));
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero")).unwrap();
        assert!(matches!(folder.read_small("zero", 100), Err(Error::Corrupt { .. })));
    }
}

