//! Remote Zarr arrays through `object_store`: `http(s)://host/path` and `s3://bucket/prefix`
//! (credentials, region and endpoint from the usual `AWS_*` variables). Reads run on one
//! shared runtime; callers block on them from any thread (rayon workers, DataFusion's runtime).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, OnceLock};

use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};

use crate::error::{Error, Result};

/// A remote folder: a store and a prefix in it.
#[derive(Clone)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    /// `scheme://authority` (messages).
    root: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.display())
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("zrecord-zarr-io")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("cannot start the Zarr I/O runtime: {e}"))
    })
}

/// Run `f` on the I/O runtime and wait for it (safe inside another runtime's thread too).
fn block<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handle = runtime().spawn(f);
    match futures::executor::block_on(handle) {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

fn stores() -> &'static Mutex<HashMap<String, Arc<dyn ObjectStore>>> {
    static S: OnceLock<Mutex<HashMap<String, Arc<dyn ObjectStore>>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Remote {
    /// Parse `http(s)://...` or `s3://...`; `None` for other schemes.
    pub fn parse(uri: &str) -> Result<Option<Remote>> {
        let Some((scheme, rest)) = uri.split_once("://") else { return Ok(None) };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.is_empty() {
            return Err(Error::invalid("uri", format!("'{uri}' names no host or bucket")));
        }
        let root = format!("{scheme}://{authority}");
        let store = {
            let mut cache = stores().lock().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = cache.get(&root) {
                s.clone()
            } else {
                let s: Arc<dyn ObjectStore> = match scheme {
                    "http" | "https" => Arc::new(
                        object_store::http::HttpBuilder::new()
                            .with_url(root.clone())
                            .with_client_options(object_store::ClientOptions::new().with_allow_http(true))
                            .build()
                            .map_err(|e| Error::invalid("uri", format!("'{uri}': {e}")))?,
                    ),
                    "s3" => Arc::new(
                        object_store::aws::AmazonS3Builder::from_env()
                            .with_bucket_name(authority)
                            .build()
                            .map_err(|e| Error::invalid("uri", format!("'{uri}': {e}")))?,
                    ),
                    _ => return Ok(None),
                };
                cache.insert(root.clone(), s.clone());
                s
            }
        };
        Ok(Some(Remote { store, prefix: path.trim_matches('/').to_string(), root }))
    }

    /// The folder `key` below this one.
    pub fn join(&self, key: &str) -> Remote {
        let prefix = if self.prefix.is_empty() { key.to_string() } else { format!("{}/{key}", self.prefix) };
        Remote { store: self.store.clone(), prefix, root: self.root.clone() }
    }

    /// `scheme://authority/prefix`.
    pub fn display(&self) -> String {
        format!("{}/{}", self.root, self.prefix)
    }

    fn err(&self, e: object_store::Error) -> Error {
        Error::io(self.display(), std::io::Error::other(e.to_string()))
    }

    /// The object's bytes in `range` (all when `None`) and the object's full size; `None`
    /// when it does not exist.
    pub fn get(&self, range: Option<GetRange>) -> Result<Option<(Vec<u8>, u64)>> {
        let store = self.store.clone();
        let path = ObjectPath::from(self.prefix.as_str());
        let r = block(async move {
            let opts = GetOptions { range, ..Default::default() };
            let res = store.get_opts(&path, opts).await?;
            let size = res.meta.size;
            let bytes = res.bytes().await?;
            Ok::<_, object_store::Error>((bytes.to_vec(), size))
        });
        match r {
            Ok(v) => Ok(Some(v)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(e)),
        }
    }
}

impl PartialEq for Remote {
    fn eq(&self, other: &Remote) -> bool {
        self.root == other.root && self.prefix == other.prefix
    }
}

impl Eq for Remote {}

impl std::hash::Hash for Remote {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.root.hash(h);
        self.prefix.hash(h);
    }
}
