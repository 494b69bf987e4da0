//! The one URL parse of the crate: a plain path, `file://`, or an object-store URL
//! (`s3://`, `gs://`, `az://`, `http(s)://`, ... with the `remote` feature).

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// True for a URL that names an object store (`scheme://...`, not `file://`). Such a URL is
/// opened through [`crate::io::resolve`] / [`Uri::parse`]; this only classifies.
pub fn is_url(path: &Path) -> bool {
    path.to_str().is_some_and(|s| s.contains("://") && !s.starts_with("file://"))
}

/// A path or `file://` URL as a local path (`file:///x` and `file://localhost/x` become `/x`);
/// anything else is returned as is.
pub fn local_path(path: &Path) -> PathBuf {
    match path.to_str().and_then(|s| s.strip_prefix("file://")) {
        Some(rest) => PathBuf::from(rest.strip_prefix("localhost").filter(|r| r.starts_with('/')).unwrap_or(rest)),
        None => path.to_path_buf(),
    }
}

/// One file or object (or a folder / prefix of them) named by a URI.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Uri {
    /// A path on a local file system.
    File(PathBuf),
    /// A key (prefix) in an object store.
    #[cfg(feature = "remote")]
    Remote(crate::io::object::Remote),
}

impl Uri {
    /// Parse a URI: a plain path, `file:///abs` (or `file://localhost/abs`), or an object-store
    /// URL. A scheme this build cannot read is a typed error naming the ones it can.
    pub fn parse(uri: &str) -> Result<Uri> {
        if let Some(rest) = uri.strip_prefix("file://") {
            let rest = rest.strip_prefix("localhost").unwrap_or(rest);
            if !rest.starts_with('/') {
                return Err(Error::invalid("uri", format!("'{uri}': a file:// URI needs an absolute path")));
            }
            return Ok(Uri::File(PathBuf::from(rest)));
        }
        if uri.is_empty() {
            return Err(Error::invalid("uri", "empty URI"));
        }
        if uri.contains('\0') {
            return Err(Error::invalid("uri", format!("{uri:?} holds a NUL byte")));
        }
        if let Some((scheme, _)) = uri.split_once("://") {
            #[cfg(feature = "remote")]
            {
                let _ = scheme;
                return Ok(Uri::Remote(crate::io::object::connect(uri.trim_end_matches('/'))?));
            }
            #[cfg(not(feature = "remote"))]
            return Err(Error::invalid("uri", format!("'{uri}': this build of zrecord has no object-store support (feature `remote`) for '{scheme}://'; local paths and file:// only")));
        }
        Ok(Uri::File(PathBuf::from(uri)))
    }

    /// [`Uri::parse`] for a path-typed argument (a non-UTF-8 path is always local).
    pub fn parse_path(path: &Path) -> Result<Uri> {
        match path.to_str() {
            Some(s) => Uri::parse(s),
            None => Ok(Uri::File(path.to_path_buf())),
        }
    }

    /// The local path, when this is one.
    pub fn local(&self) -> Option<&Path> {
        match self {
            Uri::File(p) => Some(p),
            #[cfg(feature = "remote")]
            Uri::Remote(_) => None,
        }
    }

    /// Whether this names an object store.
    pub fn is_remote(&self) -> bool {
        self.local().is_none()
    }

    /// The URI of `key` below this one. `key` comes from metadata (a multiscale path, a chunk
    /// key): it must stay below this URI (no `..`, no absolute path, no symlink out of a local
    /// folder).
    pub fn join(&self, key: &str) -> Result<Uri> {
        match self {
            Uri::File(p) => Ok(Uri::File(crate::io::join_contained(p, key)?)),
            #[cfg(feature = "remote")]
            Uri::Remote(r) => {
                if key.split('/').any(|c| c == "..") || key.starts_with('/') || key.contains('\0') {
                    return Err(Error::invalid("path", format!("'{key}' below '{}' leaves its prefix", r.url())));
                }
                Ok(Uri::Remote(r.join(key)))
            }
        }
    }

    /// The URI of `key` below this one, for a key this crate built itself (chunk keys from
    /// grid indices): joined without the checks of [`Uri::join`].
    #[cfg_attr(not(feature = "zarr"), allow(dead_code))]
    pub(crate) fn join_built(&self, key: &str) -> Uri {
        match self {
            Uri::File(p) => Uri::File(p.join(key)),
            #[cfg(feature = "remote")]
            Uri::Remote(r) => Uri::Remote(r.join(key)),
        }
    }

    /// The path (local) or URL (remote), for messages and errors.
    pub fn path(&self) -> PathBuf {
        match self {
            Uri::File(p) => p.clone(),
            #[cfg(feature = "remote")]
            Uri::Remote(r) => PathBuf::from(r.url()),
        }
    }

    /// The whole object, or `None` when it does not exist. Larger than `max_bytes` is a typed
    /// error (never an unbounded read); a local path that is not a regular file (a FIFO, a
    /// device, a folder) too.
    pub fn read_all(&self, max_bytes: u64) -> Result<Option<Vec<u8>>> {
        let too_big = |n: u64| Error::invalid("max_read_bytes", format!("'{}' is {n} bytes, more than the {max_bytes} allowed", self.path().display()));
        match self {
            Uri::File(p) => {
                let Some((f, len)) = crate::io::open_regular(p)? else { return Ok(None) };
                if len > max_bytes {
                    return Err(too_big(len));
                }
                let mut b = vec![0u8; len as usize];
                f.read_exact_at(&mut b, 0).map_err(|e| Error::io(p, e))?;
                Ok(Some(b))
            }
            #[cfg(feature = "remote")]
            Uri::Remote(r) => match r.get_small("", max_bytes) {
                Err(Error::Corrupt { reason, .. }) if reason.contains("more than") => Err(Error::invalid("max_read_bytes", format!("'{}': {reason}", r.url()))),
                other => other,
            },
        }
    }

    /// Ranges of this object closer than this many bytes are best fetched by one read
    /// ([`crate::io::plan::coalesce`]): 0 for local files (only touching ranges merge), the
    /// registered `zrecord_coalesce_gap` for objects.
    pub fn coalesce_gap(&self) -> u64 {
        match self {
            Uri::File(_) => 0,
            #[cfg(feature = "remote")]
            Uri::Remote(r) => r.opts.coalesce_gap,
        }
    }

    /// `len` bytes from `offset` (the object must exist and hold them).
    pub fn read_range(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let n = usize::try_from(len).map_err(|_| Error::invalid("len", format!("{len} bytes cannot be read at once")))?;
        match self {
            Uri::File(p) => {
                let (f, size) = crate::io::open_regular(p)?.ok_or_else(|| Error::io(p, std::io::ErrorKind::NotFound.into()))?;
                if offset.checked_add(len).is_none_or(|end| end > size) {
                    return Err(crate::io::past_end(p, offset, n, size));
                }
                let mut b = vec![0u8; n];
                f.read_exact_at(&mut b, offset).map_err(|e| Error::io(p, e))?;
                Ok(b)
            }
            #[cfg(feature = "remote")]
            Uri::Remote(r) => {
                let end = offset.checked_add(len).ok_or_else(|| Error::invalid("range", format!("{offset} + {len} overflows")))?;
                let (b, _) = r.get_opt_range("", Some(object_store::GetRange::Bounded(offset..end)))?.ok_or_else(|| Error::NotFound { path: self.path(), reason: "the object is gone".into() })?;
                if b.len() as u64 != len {
                    return Err(Error::corrupt(self.path(), format!("asked for {len} bytes at {offset}, got {}", b.len())));
                }
                Ok(b)
            }
        }
    }

    /// `n` bytes at the start (`from_start`) or end of the object, and the object's size;
    /// `None` when it does not exist. An object shorter than `n` gives no bytes.
    pub fn read_edge(&self, n: u64, from_start: bool) -> Result<Option<(Vec<u8>, u64)>> {
        match self {
            Uri::File(p) => {
                let Some((f, size)) = crate::io::open_regular(p)? else { return Ok(None) };
                if size < n {
                    return Ok(Some((Vec::new(), size)));
                }
                let mut b = vec![0u8; n as usize];
                f.read_exact_at(&mut b, if from_start { 0 } else { size - n }).map_err(|e| Error::io(p, e))?;
                Ok(Some((b, size)))
            }
            #[cfg(feature = "remote")]
            Uri::Remote(r) => {
                use object_store::GetRange;
                let range = if from_start { GetRange::Bounded(0..n) } else { GetRange::Suffix(n) };
                r.get_opt_range("", Some(range))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_classifies_paths_and_urls() {
        assert_eq!(Uri::parse("/x/y").unwrap(), Uri::File("/x/y".into()));
        assert_eq!(Uri::parse("file:///x/y").unwrap(), Uri::File("/x/y".into()));
        assert_eq!(Uri::parse("file://localhost/x").unwrap(), Uri::File("/x".into()));
        assert!(Uri::parse("file://rel").is_err());
        assert!(Uri::parse("").is_err());
        assert!(is_url(Path::new("s3://b/x")) && !is_url(Path::new("file:///x")) && !is_url(Path::new("/x")));
        assert_eq!(local_path(Path::new("file:///tmp/x")), PathBuf::from("/tmp/x"));
        assert_eq!(local_path(Path::new("file://localhost/tmp/x")), PathBuf::from("/tmp/x"));
        #[cfg(feature = "remote")]
        assert!(matches!(Uri::parse("nosuch://b/x"), Err(Error::InvalidArgument { .. })));
    }

    #[test]
    fn local_reads_are_bounded_and_contained() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"0123456789").unwrap();
        let root = Uri::File(dir.path().to_path_buf());
        let a = root.join("a").unwrap();
        assert_eq!(a.read_all(10).unwrap().unwrap(), b"0123456789");
        assert!(matches!(a.read_all(9), Err(Error::InvalidArgument { name: "max_read_bytes", .. })));
        assert_eq!(a.read_range(2, 3).unwrap(), b"234");
        assert!(matches!(a.read_range(8, 3), Err(Error::Corrupt { .. })));
        assert!(a.read_range(u64::MAX, 2).is_err());
        assert_eq!(a.read_edge(4, false).unwrap().unwrap(), (b"6789".to_vec(), 10));
        assert!(root.join("b").unwrap().read_all(10).unwrap().is_none());
        for bad in ["../a", "/etc/passwd", "x/../../a", ""] {
            assert!(matches!(root.join(bad), Err(Error::InvalidArgument { .. })), "{bad}");
        }
        std::os::unix::fs::symlink("/etc", dir.path().join("out")).unwrap();
        assert!(root.join("out/passwd").is_err(), "a symlink out of the folder");
        assert!(root.join("out/none/deeper").is_err(), "also when the rest does not exist");
        std::fs::create_dir(dir.path().join("in")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("in"), dir.path().join("alias")).unwrap();
        assert!(root.join("alias/x").is_ok(), "a symlink that stays inside is fine");
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: (test) a valid NUL-terminated path.
        let made = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(made, 0);
        let f = root.join("fifo").unwrap();
        assert!(f.read_all(10).is_err() && f.read_range(0, 1).is_err() && f.read_edge(1, true).is_err(), "a FIFO is refused, not waited on");
    }
}
