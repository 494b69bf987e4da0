//! The one door to bytes: every file, object and URL the crate reads or writes goes through
//! this module (stores, dataset roots, Zarr arrays, text-pipeline state, tokenizer files,
//! distributed rendezvous files, publish).
//!
//! - [`resolve`] turns a path or URL into a [`Location`] (a folder of named files: a local
//!   folder, or a prefix on an object store with the `remote` feature); [`Uri`] is the same
//!   parse for one object (what Zarr reads). Nothing outside `io` tells URLs from paths.
//! - [`ByteSource`] is one opened file: its length, positional reads, a borrowed-slice fast path
//!   for mapped files, and hints. Local files are memory-mapped ([`Mapped`], mappings guarded
//!   against SIGBUS) or read with `pread` ([`PreadFile`]); remote objects are read through a
//!   range cache and staged in coalesced requests before a gather ([`prepare`]).
//! - Local reads refuse what is not a regular file (a FIFO would hang, a device never ends)
//!   and cap every whole-file read ([`read_bounded`]); names taken from metadata are joined
//!   inside their folder only ([`join_contained`]); state files are written atomically and
//!   never through a symlink ([`write_atomic`], [`open_state`]).
//! - [`publish`]: staging folders and the atomic, never-replacing publish every writer uses.
//! - [`runtime`]: the one tokio runtime builder and the shared I/O runtime.

use std::mem::MaybeUninit;
use std::path::Path;
use std::sync::Arc;

use crate::error::{Error, Result};

mod local;
pub mod plan;
#[cfg(feature = "remote")]
pub mod object;
pub mod publish;
pub mod runtime;
pub mod shm;
pub(crate) mod sigbus;
mod uri;

pub use local::{
    canonical, create_dir_all, create_new, join_contained, list_dir, open_regular, open_state, path_taken, read_bounded, read_link, read_optional, remove_file, remove_tree, stat, write_atomic,
    write_atomic_with, DirEntry, LocalFolder, Mapped, PreadFile,
};
pub use uri::{is_url, local_path, Uri};

/// Register storage options (credentials, endpoints, `zrecord_*` read-plan keys) for every URL
/// below `prefix`. Without the `remote` feature there are no object stores to configure: a
/// typed error.
pub fn register_storage_options(prefix: &str, options: Vec<(String, String)>) -> Result<()> {
    #[cfg(feature = "remote")]
    return object::register_storage_options(prefix, options);
    #[cfg(not(feature = "remote"))]
    {
        let _ = options;
        Err(Error::invalid("storage_options", format!("'{prefix}': this build of zrecord has no object-store support (feature `remote`)")))
    }
}

/// The folder at `uri` (a path, `file://`, or an object-store URL with the `remote` feature),
/// its local files read with `mode`. The one resolver: every module that opens a store, a
/// dataset root or a state folder by name comes through here.
pub fn resolve(uri: impl AsRef<Path>, mode: ReadMode) -> Result<Arc<dyn Location>> {
    match Uri::parse_path(uri.as_ref())? {
        Uri::File(p) => Ok(Arc::new(LocalFolder::new(p, mode))),
        #[cfg(feature = "remote")]
        Uri::Remote(r) => Ok(Arc::new(object::ObjectLocation::new(r))),
    }
}

/// Bring the byte ranges `(source, start, end)` a gather is about to read into memory, all
/// sources' requests in flight together; what is staged stays pinned while the returned guard
/// lives. Local sources need nothing (their reads are served by the page cache): `None`.
/// `pages`: round each range out to aligned pages (index and shape rows, whose neighbours are
/// likely wanted next) rather than fetching exact ranges coalesced across small gaps.
pub fn prepare(wanted: Vec<(&dyn ByteSource, u64, u64)>, pages: bool) -> Result<Option<Prepared>> {
    #[cfg(feature = "remote")]
    {
        let objects: Vec<(&object::ObjectFile, u64, u64)> = wanted.iter().filter_map(|(s, a, z)| s.as_object().map(|o| (o, *a, *z))).collect();
        if objects.is_empty() {
            return Ok(None);
        }
        let plan = if pages { object::Plan::Pages } else { object::Plan::Ranges };
        Ok(Some(Prepared(object::preload(objects, plan)?)))
    }
    #[cfg(not(feature = "remote"))]
    {
        let _ = (wanted, pages);
        Ok(None)
    }
}

/// Ranges [`prepare`] staged, pinned until this is dropped.
#[derive(Default)]
pub struct Prepared(#[cfg(feature = "remote")] object::Staged);

impl Prepared {
    /// Keep `other`'s ranges pinned too.
    pub fn absorb(&mut self, other: Prepared) {
        #[cfg(feature = "remote")]
        self.0.absorb(other.0);
        #[cfg(not(feature = "remote"))]
        let _ = other;
    }
}

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
    /// contained, see `io::sigbus`). Nonzero means the bytes read can no longer be trusted.
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

    /// The object-store file behind this source, when it is one: what [`prepare`] stages.
    #[cfg(feature = "remote")]
    #[doc(hidden)]
    fn as_object(&self) -> Option<&object::ObjectFile> {
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

impl dyn ByteSource + '_ {
    /// `len` bytes at `offset` into a new vector.
    pub fn read_vec(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut v: Vec<u8> = Vec::with_capacity(len);
        self.read_at(offset, &mut v.spare_capacity_mut()[..len])?;
        // SAFETY: `read_at` succeeded, so all `len` bytes were written.
        unsafe { v.set_len(len) };
        Ok(v)
    }

    /// The whole source into a new buffer with positional reads of 4 MiB
    /// ([`ByteSource::read_at_cold`]: sequential, so the kernel reads ahead, where faults through a
    /// mapping set for random access would wait page by page). A size that cannot be allocated
    /// is an error, not an abort.
    pub fn read_all_cold(&self) -> Result<Box<[u8]>> {
        const PIECE: usize = 4 << 20;
        let n = usize::try_from(self.len()).map_err(|_| Error::invalid("file", format!("{} bytes do not fit in memory", self.len())))?;
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(n).map_err(|_| Error::invalid("file", format!("cannot allocate {n} bytes to hold {}", self.path().display())))?;
        self.advise(Hint::WillNeed, 0, n as u64);
        while v.len() < n {
            let at = v.len();
            let k = (n - at).min(PIECE);
            self.read_at_cold(at as u64, &mut v.spare_capacity_mut()[..k])?;
            // SAFETY: `read_at_cold` succeeded, so it wrote all `k` bytes after the first `at`
            // (within the capacity reserved above).
            unsafe { v.set_len(at + k) };
        }
        Ok(v.into_boxed_slice())
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

/// A folder of named files: where a store's (or a dataset root's) files are found.
pub trait Location: Send + Sync {
    /// The folder's path or URL (for error messages and `path()`).
    fn path(&self) -> &Path;

    /// Whether reads go over the network (gathers then [`prepare`] their ranges first, and
    /// opening many stores is worth doing concurrently).
    fn is_remote(&self) -> bool {
        false
    }

    /// Whether file `name` exists in the folder.
    fn exists(&self, name: &str) -> Result<bool>;

    /// The immediate sub-folders (names, sorted).
    fn list_dirs(&self) -> Result<Vec<String>>;

    /// The folder `name` below this one (a relative path that stays inside: no `..`, no
    /// absolute path, no symlink out of a local folder).
    fn child(&self, name: &str) -> Result<Arc<dyn Location>>;

    /// Write `bytes` as file `name` only if nothing of that name exists
    /// ([`Error::AlreadyExists`] otherwise), durably (fsynced, folder too): the publish step of
    /// a manifest.
    fn put_create(&self, name: &str, bytes: Vec<u8>) -> Result<()>;

    /// Remove `name` and everything below it (missing is fine).
    fn delete(&self, name: &str) -> Result<()>;

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
