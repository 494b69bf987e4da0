//! Remote Zarr arrays through `object_store`: `http(s)://host/path`, `s3://bucket/prefix`,
//! `gs://` and `az://` (credentials and endpoints from the environment and the storage
//! options registered for the URL, see [`crate::store::object`]). Reads run on the crate's
//! shared I/O runtime; callers block on them from any thread (rayon workers, DataFusion's
//! runtime).

use object_store::GetRange;

use crate::error::Result;
use crate::store::object;

/// A remote folder or object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Remote(object::Remote);

impl Remote {
    /// Parse an object-store URL; `None` for a local path (or `file://`).
    pub fn parse(uri: &str) -> Result<Option<Remote>> {
        if !object::is_url(std::path::Path::new(uri)) {
            return Ok(None);
        }
        Ok(Some(Remote(object::connect(uri.trim_end_matches('/'))?)))
    }

    /// The folder `key` below this one.
    pub fn join(&self, key: &str) -> Remote {
        Remote(self.0.join(key))
    }

    /// `scheme://authority/prefix`.
    pub fn display(&self) -> String {
        self.0.url()
    }

    /// The object's bytes in `range` (all when `None`) and the object's full size; `None`
    /// when it does not exist.
    pub fn get(&self, range: Option<GetRange>) -> Result<Option<(Vec<u8>, u64)>> {
        self.0.get_opt_range("", range)
    }
}
