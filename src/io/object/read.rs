//! Reading: a store folder on an object store ([`ObjectLocation`]) and its files ([`ObjectFile`]).

#[allow(unused_imports)]
use super::*;

/// A store folder on an object store.
pub struct ObjectLocation {
    pub(super) remote: Remote,
    pub(super) path: PathBuf,
    pub(super) cache: Arc<Mutex<RangeCache>>,
    pub(super) next_file: std::sync::atomic::AtomicU32,
}

impl ObjectLocation {
    /// The folder at `remote`.
    pub fn new(remote: Remote) -> ObjectLocation {
        let path = PathBuf::from(remote.url());
        let budget = remote.opts.cache_bytes;
        ObjectLocation {
            remote,
            path,
            cache: Arc::new(Mutex::new(RangeCache { map: BTreeMap::new(), bytes: 0, clock: 0, budget })),
            next_file: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// The folder at `url` (options registered for it applied).
    pub fn connect(url: &str) -> Result<ObjectLocation> {
        Ok(ObjectLocation::new(connect(url)?))
    }

    /// The remote folder.
    pub fn remote(&self) -> &Remote {
        &self.remote
    }
}

/// Header bytes fetched when a file is opened (the format's header is 64 bytes).
pub(super) const OPEN_HEAD_BYTES: u64 = 64;

impl Location for ObjectLocation {
    fn path(&self) -> &Path {
        &self.path
    }

    fn is_remote(&self) -> bool {
        true
    }

    fn exists(&self, name: &str) -> Result<bool> {
        self.remote.exists(name)
    }

    fn list_dirs(&self) -> Result<Vec<String>> {
        self.remote.list_dirs()
    }

    fn child(&self, name: &str) -> Result<Arc<dyn Location>> {
        if name.is_empty() || name.split('/').any(|c| c == ".." || c.is_empty()) || name.contains('\0') {
            return Err(Error::invalid("path", format!("'{name}' below '{}' is not a plain relative path", self.remote.url())));
        }
        Ok(Arc::new(ObjectLocation::new(self.remote.join(name))))
    }

    fn put_create(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        self.remote.put_create(name, bytes)
    }

    fn delete(&self, name: &str) -> Result<()> {
        self.remote.delete_tree(name).map(|_| ())
    }

    fn read_small(&self, name: &str, max_bytes: u64) -> Result<Option<Vec<u8>>> {
        self.remote.get_small(name, max_bytes)
    }

    fn open(&self, name: &str, expected_len: u64) -> Result<Box<dyn ByteSource>> {
        let head = self.remote.get_head(name, OPEN_HEAD_BYTES.min(expected_len))?;
        self.file(name, expected_len, head)
    }

    fn open_all(&self, files: &[(String, u64)]) -> Result<Vec<Box<dyn ByteSource>>> {
        // Every file's header in one round trip.
        let futs: Vec<_> = files
            .iter()
            .map(|(name, len)| {
                let n = OPEN_HEAD_BYTES.min(*len);
                let fut = head_of(self.remote.store.clone(), self.remote.key(name), n);
                async move { fut.await.map_err(|e| (n, e)) }
            })
            .collect();
        let heads = block(futures::future::join_all(futs));
        files
            .iter()
            .zip(heads)
            .map(|((name, len), head)| {
                let head = head.map_err(|(n, e)| self.remote.error(name, Some(0..n), e))?;
                self.file(name, *len, head)
            })
            .collect()
    }
}

impl ObjectLocation {
    /// The opened file `name` given its header fetch.
    pub(super) fn file(&self, name: &str, expected_len: u64, head: Option<(Bytes, u64)>) -> Result<Box<dyn ByteSource>> {
        let url = self.remote.url_of(name);
        let Some((head, size)) = head else {
            // A 404, as for any other object: FileNotFoundError in Python (the docs' rule).
            return Err(Error::Remote {
                url,
                range: None,
                status: Some(404),
                kind: crate::error::RemoteKind::NotFound,
                message: "an object listed in the store's manifest is missing".into(),
            });
        };
        if size != expected_len {
            return Err(Error::corrupt(&url, format!("object is {size} bytes, the manifest says {expected_len}")));
        }
        let id = self.next_file.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let disk = self.remote.opts.cache_dir.as_ref().map(|d| DiskObject::new(DiskCache::at(d, self.remote.opts.cache_dir_bytes), &url, size));
        let file = ObjectFile { remote: self.remote.clone(), name: name.to_string(), path: PathBuf::from(url), len: size, id, cache: self.cache.clone(), disk };
        if !head.is_empty() {
            self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(id, 0, head, false, false);
        }
        Ok(Box::new(file))
    }
}

/// One object of a remote store, read through its store's range cache.
pub struct ObjectFile {
    pub(super) remote: Remote,
    pub(super) name: String,
    pub(super) path: PathBuf,
    pub(super) len: u64,
    pub(super) id: u32,
    pub(super) cache: Arc<Mutex<RangeCache>>,
    /// This object's ranges in the local disk cache, when one is configured.
    pub(super) disk: Option<DiskObject>,
}

impl ObjectFile {
    pub(super) fn cache(&self) -> std::sync::MutexGuard<'_, RangeCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The page-aligned range around `at..at + len`, clipped to the object.
    pub(super) fn page_of(&self, at: u64, len: u64) -> Range<u64> {
        let page = self.remote.opts.page_bytes.max(1);
        let a = at / page * page;
        let z = (at + len).div_ceil(page).saturating_mul(page).min(self.len);
        a..z
    }
}

/// Copy `data[from..]` into `out`.
pub(super) fn copy_out(data: &[u8], from: usize, out: &mut [MaybeUninit<u8>]) {
    let src = &data[from..from + out.len()];
    // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; `src` and `out` are distinct live
    // regions of `out.len()` bytes (a cache buffer cannot alias the caller's output).
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), out.as_mut_ptr().cast::<u8>(), out.len()) };
}

impl ByteSource for ObjectFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn len(&self) -> u64 {
        self.len
    }

    fn as_slice(&self) -> Option<&[u8]> {
        None
    }

    fn read_at(&self, offset: u64, out: &mut [MaybeUninit<u8>]) -> Result<()> {
        let len = out.len() as u64;
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(crate::io::past_end(&self.path, offset, out.len(), self.len));
        }
        if len == 0 {
            return Ok(());
        }
        let hit = self.cache().find(self.id, offset, len);
        if let Some((start, data)) = hit {
            copy_out(&data, (offset - start) as usize, out);
            return Ok(());
        }
        // A miss (a read no gather staged: verify, a scan's first touch, a range evicted under
        // a concurrent gather): fetch the aligned page around small reads and keep it; large
        // reads go straight through.
        let page = self.remote.opts.page_bytes;
        let range = if len <= page { self.page_of(offset, len) } else { offset..offset + len };
        let data = self.remote.get_range(&self.name, range.clone())?;
        if data.len() as u64 != range.end - range.start {
            return Err(Error::corrupt(&self.path, format!("asked for {} bytes at {}, the server sent {}", range.end - range.start, range.start, data.len())));
        }
        copy_out(&data, (offset - range.start) as usize, out);
        if len <= page {
            self.cache().insert(self.id, range.start, data, false, false);
        }
        Ok(())
    }

    fn as_object(&self) -> Option<&ObjectFile> {
        Some(self)
    }
}
