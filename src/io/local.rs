//! Local files: memory-mapped ([`Mapped`]) or read with `pread` ([`PreadFile`]), the folder
//! [`LocalFolder`], and the checked primitives every local read and write goes through: only
//! regular files are opened for reading ([`open_regular`]), whole-file reads are capped
//! ([`read_bounded`]), names from metadata stay inside their folder ([`join_contained`]), and
//! state files are replaced atomically, never written through a symlink ([`write_atomic`],
//! [`open_state`]).

use std::fs::File;
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::{past_end, ByteSource, Hint, Location, ReadMode};

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
/// refused: the open itself cannot block (`O_NONBLOCK`: opening a FIFO for reading would wait
/// for a writer), and the opened file is checked (a device, such as a symlink to `/dev/zero`,
/// never ends), so a path swapped between a check and the open changes nothing.
pub fn open_regular(path: &Path) -> Result<Option<(File, u64)>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path, e)),
    };
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::corrupt(path, "not a regular file"));
    }
    set_blocking(&f);
    Ok(Some((f, meta.len())))
}

/// Clear `O_NONBLOCK` on `f` (kept only so that opening could not wait; regular files ignore
/// it, but descriptors handed on should carry no surprises).
fn set_blocking(f: &File) {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: fcntl on a descriptor `f` owns; F_SETFL with flags read from the same descriptor.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
    }
}

/// Read a whole regular file of at most `max_bytes` (a FIFO, a device or a longer file is a
/// typed error, never a hang or an unbounded read).
pub fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    // The same read as `read_optional`; a file passed by a caller that is missing, not regular
    // or too long is the caller's argument error rather than a damaged store.
    match read_optional(path, max_bytes) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(Error::io(path, std::io::ErrorKind::NotFound.into())),
        Err(Error::Corrupt { reason, .. }) => Err(Error::invalid("file", format!("{}: {reason}", path.display()))),
        Err(e) => Err(e),
    }
}

/// A whole regular file of at most `max_bytes`, or `None` when it does not exist. Longer (or
/// growing past the cap while read) is [`Error::Corrupt`]; a FIFO, device or folder too.
pub fn read_optional(path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    use std::io::Read;
    let Some((f, len)) = open_regular(path)? else { return Ok(None) };
    if len > max_bytes {
        return Err(Error::corrupt(path, format!("file is {len} bytes, more than the {max_bytes} allowed")));
    }
    let mut out = Vec::with_capacity(len as usize);
    f.take(max_bytes + 1).read_to_end(&mut out).map_err(|e| Error::io(path, e))?;
    if out.len() as u64 > max_bytes {
        return Err(Error::corrupt(path, format!("file grew past the {max_bytes} bytes allowed")));
    }
    Ok(Some(out))
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

    fn exists(&self, name: &str) -> Result<bool> {
        let p = self.path.join(plain_name(&self.path, name)?);
        match std::fs::symlink_metadata(&p) {
            Ok(_) => Ok(std::fs::metadata(&p).is_ok()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::io(&p, e)),
        }
    }

    fn list_dirs(&self) -> Result<Vec<String>> {
        Ok(list_dir(&self.path)?.into_iter().filter(|e| e.is_dir).map(|e| e.name).collect())
    }

    fn child(&self, name: &str) -> Result<Arc<dyn Location>> {
        Ok(Arc::new(LocalFolder { path: join_contained(&self.path, name)?, mode: self.mode }))
    }

    fn put_create(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let p = join_contained(&self.path, name)?;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(&p).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                Error::AlreadyExists { path: p.clone() }
            } else {
                Error::io(&p, e)
            }
        })?;
        f.write_all(&bytes).map_err(|e| Error::io(&p, e))?;
        f.sync_all().map_err(|e| Error::io(&p, e))?;
        crate::io::publish::sync_dir(&self.path)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let p = join_contained(&self.path, name)?;
        let r = match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&p),
            Ok(_) => std::fs::remove_file(&p),
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(&p, e)),
        }
    }

    fn read_small(&self, name: &str, max_bytes: u64) -> Result<Option<Vec<u8>>> {
        read_optional(&self.path.join(plain_name(&self.path, name)?), max_bytes)
    }

    fn open(&self, name: &str, expected_len: u64) -> Result<Box<dyn ByteSource>> {
        let p = self.path.join(plain_name(&self.path, name)?);
        Ok(match self.mode {
            ReadMode::Mmap => Box::new(Mapped::open(p, expected_len)?),
            ReadMode::Pread => Box::new(PreadFile::open(p, expected_len)?),
        })
    }
}

/// A read-only mapping of a whole file (empty files have no mapping).
#[derive(Debug)]
pub struct Mapped {
    path: PathBuf,
    /// Declared before `map`: unregistered before the mapping goes away.
    guard: crate::io::sigbus::Guard,
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
            Some(m) => crate::io::sigbus::Guard::register(m.as_ptr(), m.len()),
            None => crate::io::sigbus::Guard::register(std::ptr::null(), 0),
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

/// `name` if it is a relative path that cannot climb out of `root` (no `..`, not absolute, not
/// empty, no NUL): the check on file names a folder's own manifest lists (the files themselves
/// are then opened only if they are regular files).
fn plain_name<'a>(root: &Path, name: &'a str) -> Result<&'a str> {
    use std::path::Component;
    let ok = !name.is_empty() && !name.contains('\0') && Path::new(name).components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if ok {
        Ok(name)
    } else {
        Err(Error::invalid("path", format!("'{name}' is not a plain name below '{}'", root.display())))
    }
}

/// `root` joined with `name`, a relative path taken from metadata (a file list, a multiscale
/// path, a stream name): refused unless it stays inside `root` — no absolute path, no `..`
/// component, no empty name, no NUL, and no symlink that leads out of `root` (checked on the
/// deepest part of the path that exists). The path need not exist.
pub fn join_contained(root: &Path, name: &str) -> Result<PathBuf> {
    use std::path::Component;
    let bad = |why: &str| Error::invalid("path", format!("'{name}' below '{}' {why}", root.display()));
    if name.is_empty() {
        return Err(bad("is empty"));
    }
    if name.contains('\0') {
        return Err(bad("holds a NUL byte"));
    }
    let mut out = root.to_path_buf();
    let mut linked = false;
    for c in Path::new(name).components() {
        match c {
            Component::Normal(part) => {
                out.push(part);
                linked |= std::fs::symlink_metadata(&out).is_ok_and(|m| m.file_type().is_symlink());
            }
            Component::CurDir => {}
            Component::ParentDir => return Err(bad("climbs out of its folder ('..')")),
            Component::RootDir | Component::Prefix(_) => return Err(bad("is an absolute path")),
        }
    }
    if out == root {
        return Err(bad("names the folder itself"));
    }
    if linked {
        let mut probe = out.as_path();
        while std::fs::symlink_metadata(probe).is_err() {
            probe = probe.parent().unwrap_or(root);
        }
        let real = std::fs::canonicalize(probe).map_err(|e| Error::io(probe, e))?;
        let real_root = std::fs::canonicalize(root).map_err(|e| Error::io(root, e))?;
        if !real.starts_with(&real_root) {
            return Err(bad(&format!("leads out of its folder through a symbolic link (to '{}')", real.display())));
        }
    }
    Ok(out)
}

/// Open a state file (a log or table a pipeline appends to and rewrites) for reading and
/// writing, created when missing, never through a symbolic link (`O_NOFOLLOW`: a link planted
/// in the state folder would otherwise have its target truncated or appended to) and only if it
/// is a regular file. `truncate` empties it; otherwise writes go at the end.
pub fn open_state(path: &Path, truncate: bool) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.read(true).create(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    if truncate {
        o.write(true).truncate(true);
    } else {
        o.append(true);
    }
    let f = o.open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            Error::invalid("path", format!("state file '{}' is a symbolic link; refusing to write through it", path.display()))
        } else {
            Error::io(path, e)
        }
    })?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::invalid("path", format!("state file '{}' is not a regular file", path.display())));
    }
    // Back to blocking I/O (O_NONBLOCK only kept opening a FIFO from waiting for a reader).
    set_blocking(&f);
    Ok(f)
}

/// Create folder `path` and its parents (present ones are fine).
pub fn create_dir_all(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| Error::io(path, e))
}

/// Remove file `path`; one already gone is fine.
pub fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

/// Remove folder `path` and everything in it (symlinks inside are removed, never followed);
/// one already gone is fine.
pub fn remove_tree(path: &Path) -> Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

/// True when anything (a file, a folder, a dangling symlink) is at `path`: what writers that
/// never replace check before they start.
pub fn path_taken(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// The target of symlink `path` (kernel links under `/proc` name namespaces this way).
pub fn read_link(path: &Path) -> Result<PathBuf> {
    std::fs::read_link(path).map_err(|e| Error::io(path, e))
}

/// `path` absolute with every symlink resolved (what another process on this host can open
/// whatever its working folder), or `path` unchanged when it cannot be resolved.
pub fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Size and modification time of the file at `path` (following symlinks), without opening it.
pub fn stat(path: &Path) -> Result<(u64, Option<std::time::SystemTime>)> {
    let m = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    Ok((m.len(), m.modified().ok()))
}

/// Create file `path` for writing; it must not exist ([`Error::AlreadyExists`]) and is never
/// created through a symlink. What writers of new files (store shards in a staging folder,
/// exported query results) open.
pub fn create_new(path: &Path) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            Error::AlreadyExists { path: path.to_path_buf() }
        } else {
            Error::io(path, e)
        }
    })
}

/// One entry of a folder ([`list_dir`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (entries whose names are not UTF-8 are skipped).
    pub name: String,
    /// The folder joined with the name.
    pub path: PathBuf,
    /// A folder (following a symlink).
    pub is_dir: bool,
    /// A regular file (following a symlink).
    pub is_file: bool,
}

/// The entries of folder `dir`, sorted by name.
pub fn list_dir(dir: &Path) -> Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let e = e.map_err(|e| Error::io(dir, e))?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else { continue };
        let path = e.path();
        let meta = std::fs::metadata(&path).ok();
        out.push(DirEntry { name, is_dir: meta.as_ref().is_some_and(|m| m.is_dir()), is_file: meta.as_ref().is_some_and(|m| m.is_file()), path });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Replace `path` with `bytes` atomically: written to a temporary sibling (created new,
/// never following a link), fsynced, renamed over `path`, and the folder fsynced. A reader sees
/// the old file or the new one, never a part; a symlink at `path` is replaced, not followed.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, bytes, true)
}

/// [`write_atomic`]; with `durable` false nothing is fsynced (rendezvous messages and other
/// files that only live as long as the processes reading them): still all or nothing.
pub fn write_atomic_with(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().ok_or_else(|| Error::invalid("path", format!("'{}' names no file", path.display())))?;
    let tmp = dir.join(format!(".{}.tmp-{}-{}", name.to_string_lossy(), std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    let result = (|| -> Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_NOFOLLOW).open(&tmp).map_err(|e| Error::io(&tmp, e))?;
        f.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
        if durable {
            f.sync_all().map_err(|e| Error::io(&tmp, e))?;
        }
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
        if durable {
            crate::io::publish::sync_dir(&dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
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
        // SAFETY: (test) a valid NUL-terminated path.
        let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        assert!(matches!(folder.read_small("fifo", 100), Err(Error::Corrupt { .. })));
        assert!(matches!(Mapped::open(fifo.clone(), 0), Err(Error::Corrupt { .. })));
        assert!(matches!(PreadFile::open(fifo, 0), Err(Error::Corrupt { .. })));
        std::os::unix::fs::symlink("/dev/zero", dir.path().join("zero")).unwrap();
        assert!(matches!(folder.read_small("zero", 100), Err(Error::Corrupt { .. })));
    }

    #[test]
    fn state_files_and_folders_through_the_door() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // open_state: created, appended, truncated; never through a symlink; never a FIFO.
        let p = d.join("log");
        {
            use std::io::Write;
            open_state(&p, false).unwrap().write_all(b"abc").unwrap();
            open_state(&p, false).unwrap().write_all(b"de").unwrap();
        }
        assert_eq!(std::fs::read(&p).unwrap(), b"abcde");
        drop(open_state(&p, true).unwrap());
        assert_eq!(std::fs::read(&p).unwrap(), b"");
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        std::os::unix::fs::symlink(&victim, d.join("link")).unwrap();
        for truncate in [false, true] {
            let e = open_state(&d.join("link"), truncate).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }) && e.to_string().contains("symbolic link"), "{e}");
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me", "the link's target is untouched");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: (test) a valid NUL-terminated path.
        let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        assert!(matches!(open_state(&fifo, false), Err(Error::InvalidArgument { .. })), "a FIFO is refused at once");
        assert!(matches!(read_optional(&fifo, 10), Err(Error::Corrupt { .. })));
        assert!(read_bounded(&fifo, 10).is_err());
        assert!(read_optional(&d.join("none"), 10).unwrap().is_none());
        // write_atomic replaces a symlink instead of writing through it, and leaves no temp file.
        write_atomic(&d.join("link"), b"new").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(std::fs::read(d.join("link")).unwrap(), b"new");
        assert!(!std::fs::symlink_metadata(d.join("link")).unwrap().file_type().is_symlink());
        write_atomic_with(&d.join("msg"), b"m", false).unwrap();
        let names: Vec<String> = list_dir(d).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, ["fifo", "link", "log", "msg", "victim"], "sorted, no temporary left");
        // create_new: never replaces, never follows a link.
        assert!(matches!(create_new(&d.join("msg")), Err(Error::AlreadyExists { .. })));
        std::os::unix::fs::symlink(d.join("nowhere"), d.join("dangling")).unwrap();
        assert!(create_new(&d.join("dangling")).is_err());
        assert!(!d.join("nowhere").exists());
    }

    #[test]
    fn local_folder_location() {
        let dir = tempfile::tempdir().unwrap();
        let root = LocalFolder::new(dir.path(), ReadMode::Mmap);
        std::fs::create_dir_all(dir.path().join("b/c")).unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        assert_eq!(root.list_dirs().unwrap(), ["a", "b"]);
        assert!(root.exists("f").unwrap() && !root.exists("g").unwrap());
        let b = root.child("b").unwrap();
        assert_eq!(b.path(), dir.path().join("b"));
        assert_eq!(b.list_dirs().unwrap(), ["c"]);
        for bad in ["..", "../x", "/etc", "", "b/../../x"] {
            assert!(root.child(bad).is_err(), "{bad:?}");
            assert!(root.read_small(bad, 10).is_err(), "{bad:?}");
        }
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        assert!(root.child("out").is_err(), "no folder through a symlink out of the root");
        std::os::unix::fs::symlink(dir.path().join("a"), dir.path().join("alias")).unwrap();
        assert_eq!(root.child("alias").unwrap().path(), dir.path().join("alias"), "a symlink inside the root is fine");
        root.put_create("m", b"1".to_vec()).unwrap();
        assert!(matches!(root.put_create("m", b"2".to_vec()), Err(Error::AlreadyExists { .. })));
        assert_eq!(root.read_small("m", 10).unwrap().unwrap(), b"1");
        root.delete("b").unwrap();
        root.delete("m").unwrap();
        root.delete("never-was").unwrap();
        assert_eq!(root.list_dirs().unwrap(), ["a", "alias", "out"], "folders, symlinked ones included");
        assert!(!root.exists("m").unwrap());
        assert!(!root.is_remote());
    }
}
