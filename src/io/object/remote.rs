//! Connecting: one object store per bucket and options, and the requests on a folder of it ([`Remote`]).

#[allow(unused_imports)]
use super::*;

/// A folder on an object store: the store, the key prefix, and the read plan.
#[derive(Clone)]
pub struct Remote {
    pub(super) store: Arc<dyn ObjectStore>,
    /// Key prefix without a trailing slash ("" for the bucket root).
    pub(super) prefix: String,
    /// `scheme://authority` (messages).
    pub(super) root: String,
    pub(crate) opts: RemoteOptions,
    /// Whether credentials were configured (options or environment): a refused request
    /// without any says so.
    pub(super) credentials: bool,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.url())
    }
}

pub(super) type StoreKey = (String, Vec<(String, String)>);

pub(super) fn stores() -> &'static Mutex<HashMap<StoreKey, Arc<dyn ObjectStore>>> {
    static S: OnceLock<Mutex<HashMap<StoreKey, Arc<dyn ObjectStore>>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Connect to the folder at `url` with the options registered for it.
pub fn connect(url: &str) -> Result<Remote> {
    connect_with(url, &options_for(url.trim_end_matches('/')))
}

/// Connect to the folder at `url` with explicit storage options.
pub fn connect_with(url: &str, options: &[(String, String)]) -> Result<Remote> {
    let bad = |reason: String| Error::invalid("url", format!("'{url}': {reason}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("not a URL (scheme://...)".into()))?;
    let (authority, key) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() {
        return Err(bad("names no host, bucket or container".into()));
    }
    let scheme = scheme.to_ascii_lowercase();
    let root = format!("{scheme}://{authority}");
    let mut opts = RemoteOptions::default();
    let mut store_opts: Vec<(String, String)> = Vec::new();
    for (k, v) in options {
        let k = k.to_ascii_lowercase();
        if !opts.set(&k, v)? {
            store_opts.push((k, v.clone()));
        }
    }
    store_opts.sort();
    let cache_key = (root.clone(), store_opts.clone());
    let store = {
        let mut cache = stores().lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(&cache_key) {
            Some(s) => s.clone(),
            None => {
                let s = build_store(&scheme, &root, &store_opts, &opts).map_err(&bad)?;
                cache.insert(cache_key, s.clone());
                s
            }
        }
    };
    let prefix = key.trim_matches('/').to_string();
    if prefix.split('/').any(|c| c == "..") {
        return Err(bad("'..' is not allowed in an object key".into()));
    }
    let credentials = has_credentials(&scheme, options);
    Ok(Remote { store, prefix, root, opts, credentials })
}

/// The connected object store for `url`'s bucket (`scheme://authority`, the store), for
/// registering with DataFusion's object-store registry.
pub fn object_store_for(url: &str) -> Result<(String, Arc<dyn ObjectStore>)> {
    let r = connect(url)?;
    Ok((r.root.clone(), r.store.clone()))
}

/// Apply `options` to a builder through its `with_config`, refusing keys it does not know.
macro_rules! configure {
    ($builder:expr, $key:ty, $scheme:expr, $options:expr) => {{
        let mut b = $builder;
        for (k, v) in $options {
            let key: $key = k.parse().map_err(|_| format!("unknown storage option '{k}' for {}://", $scheme))?;
            b = b.with_config(key, v.clone());
        }
        b
    }};
}

pub(super) fn build_store(scheme: &str, root: &str, options: &[(String, String)], opts: &RemoteOptions) -> std::result::Result<Arc<dyn ObjectStore>, String> {
    let retry = object_store::RetryConfig {
        backoff: object_store::BackoffConfig { init_backoff: Duration::from_millis(50), max_backoff: Duration::from_secs(5), base: 2.0 },
        max_retries: opts.max_retries,
        retry_timeout: Duration::from_secs(opts.retry_timeout_s),
    };
    let e = |e: object_store::Error| e.to_string();
    Ok(match scheme {
        "s3" | "s3a" => {
            let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(root).with_retry(retry);
            // A plain-http endpoint (a local S3 server) needs http allowed; say so once here
            // rather than make every user set both.
            let endpoint = options
                .iter()
                .find(|(k, _)| matches!(k.as_str(), "aws_endpoint" | "endpoint" | "aws_endpoint_url" | "endpoint_url"))
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                .or_else(|| std::env::var("AWS_ENDPOINT").ok());
            if endpoint.is_some_and(|u| u.starts_with("http://")) {
                b = b.with_allow_http(true);
            }
            Arc::new(configure!(b, object_store::aws::AmazonS3ConfigKey, scheme, options).build().map_err(e)?)
        }
        "gs" => {
            let b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(root).with_retry(retry);
            Arc::new(configure!(b, object_store::gcp::GoogleConfigKey, scheme, options).build().map_err(e)?)
        }
        "az" | "adl" | "azure" | "abfs" | "abfss" => {
            let b = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(root).with_retry(retry);
            Arc::new(configure!(b, object_store::azure::AzureConfigKey, scheme, options).build().map_err(e)?)
        }
        "http" | "https" => {
            let mut client = object_store::ClientOptions::new().with_allow_http(true);
            for (k, v) in options {
                let key: object_store::ClientConfigKey = k.parse().map_err(|_| format!("unknown storage option '{k}' for {scheme}://"))?;
                client = client.with_config(key, v.clone());
            }
            Arc::new(object_store::http::HttpBuilder::new().with_url(root).with_client_options(client).with_retry(retry).build().map_err(e)?)
        }
        other => return Err(format!("unsupported URL scheme '{other}' (s3, gs, az, abfs, http, https or file)")),
    })
}

/// The first `n` bytes of `key` (fewer when shorter) and its full size; `None` when missing.
pub(super) async fn head_of(store: Arc<dyn ObjectStore>, key: ObjectPath, n: u64) -> object_store::Result<Option<(Bytes, u64)>> {
    let get = |range: Option<GetRange>| {
        let (store, key) = (store.clone(), key.clone());
        async move {
            let res = store.get_opts(&key, GetOptions { range, ..Default::default() }).await?;
            let size = res.meta.size;
            Ok::<_, object_store::Error>((res.bytes().await?, size))
        }
    };
    match get((n > 0).then_some(GetRange::Bounded(0..n))).await {
        Ok(v) => Ok(Some(v)),
        // An empty object answers a ranged GET with 416: read it whole.
        Err(e) if n > 0 && status_of(&e.to_string()) == Some(416) => match get(None).await {
            Ok(v) => Ok(Some(v)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        },
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The HTTP status an object_store error carries, when its message names one.
pub(super) fn status_of(message: &str) -> Option<u16> {
    for marker in ["status code: ", "status: ", "HTTP status "] {
        if let Some(at) = message.find(marker) {
            let digits: String = message[at + marker.len()..].chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(s) = digits.parse::<u16>() {
                return Some(s);
            }
        }
    }
    None
}

impl Remote {
    /// The folder `key` below this one.
    pub fn join(&self, key: &str) -> Remote {
        let key = key.trim_matches('/');
        let prefix = match (self.prefix.is_empty(), key.is_empty()) {
            (_, true) => self.prefix.clone(),
            (true, false) => key.to_string(),
            (false, false) => format!("{}/{key}", self.prefix),
        };
        Remote { store: self.store.clone(), prefix, root: self.root.clone(), opts: self.opts.clone(), credentials: self.credentials }
    }

    /// `scheme://authority/prefix`.
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            self.root.clone()
        } else {
            format!("{}/{}", self.root, self.prefix)
        }
    }

    /// The read plan.
    pub fn options(&self) -> &RemoteOptions {
        &self.opts
    }

    pub(super) fn key(&self, name: &str) -> ObjectPath {
        ObjectPath::from(match (self.prefix.is_empty(), name.is_empty()) {
            (_, true) => self.prefix.clone(),
            (true, false) => name.to_string(),
            (false, false) => format!("{}/{name}", self.prefix),
        })
    }

    pub(crate) fn url_of(&self, name: &str) -> String {
        if name.is_empty() {
            self.url()
        } else {
            format!("{}/{name}", self.url())
        }
    }

    /// The typed error for a failed request on `name` (over `range`).
    pub(crate) fn error(&self, name: &str, range: Option<Range<u64>>, e: object_store::Error) -> Error {
        let message = e.to_string();
        let (kind, status) = match &e {
            object_store::Error::NotFound { .. } => (RemoteKind::NotFound, Some(404)),
            object_store::Error::PermissionDenied { .. } => (RemoteKind::PermissionDenied, Some(403)),
            object_store::Error::Unauthenticated { .. } => (RemoteKind::PermissionDenied, Some(401)),
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. } => {
                return Error::AlreadyExists { path: PathBuf::from(self.url_of(name)) }
            }
            _ => {
                let status = status_of(&message);
                let kind = match status {
                    Some(404) => RemoteKind::NotFound,
                    Some(401 | 403) => RemoteKind::PermissionDenied,
                    _ => RemoteKind::Other,
                };
                (kind, status)
            }
        };
        let lacks_credentials = !self.credentials
            && (kind == RemoteKind::PermissionDenied || ["credential", "169.254.169.254", "instance metadata", "metadata endpoint", "latest/api/token", "latest/meta-data", "imds"].iter().any(|w| message.to_ascii_lowercase().contains(w)));
        let (kind, message) = if lacks_credentials {
            (
                RemoteKind::PermissionDenied,
                format!(
                    "no credentials for {}: none in its storage options (zrecord.set_storage_options) nor in this process's environment ({}); \
                     a worker process gets them from the pickled object or from its own environment ({message})",
                    self.root,
                    credential_variables(&self.root)
                ),
            )
        } else {
            (kind, message)
        };
        Error::Remote { url: self.url_of(name), range: range.map(|r| (r.start, r.end)), status, kind, message }
    }

    /// `name`'s bytes in `range`.
    pub(crate) fn get_range(&self, name: &str, range: Range<u64>) -> Result<Bytes> {
        let (store, key) = (self.store.clone(), self.key(name));
        let r = range.clone();
        block(async move { store.get_range(&key, r).await }).map_err(|e| self.error(name, Some(range), e))
    }

    /// `name`'s first `n` bytes (fewer when shorter) and its full size; `None` when missing.
    pub(crate) fn get_head(&self, name: &str, n: u64) -> Result<Option<(Bytes, u64)>> {
        let (store, key) = (self.store.clone(), self.key(name));
        block(head_of(store, key, n)).map_err(|e| self.error(name, Some(0..n), e))
    }

    /// Object `name`'s bytes in `range` (all when `None`) and its full size; `None` when it
    /// does not exist.
    pub(crate) fn get_opt_range(&self, name: &str, range: Option<GetRange>) -> Result<Option<(Vec<u8>, u64)>> {
        let (store, key) = (self.store.clone(), self.key(name));
        let r = block(async move {
            let res = store.get_opts(&key, GetOptions { range, ..Default::default() }).await?;
            let size = res.meta.size;
            Ok::<_, object_store::Error>((res.bytes().await?.to_vec(), size))
        });
        match r {
            Ok(v) => Ok(Some(v)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(name, None, e)),
        }
    }

    /// A whole small object; `None` when it does not exist.
    pub(crate) fn get_small(&self, name: &str, max_bytes: u64) -> Result<Option<Vec<u8>>> {
        let (store, key) = (self.store.clone(), self.key(name));
        let r = block(async move {
            let res = store.get_opts(&key, GetOptions::default()).await?;
            if res.meta.size > max_bytes {
                return Ok(Err(res.meta.size));
            }
            Ok::<_, object_store::Error>(Ok(res.bytes().await?))
        });
        match r {
            Ok(Ok(b)) if b.len() as u64 <= max_bytes => Ok(Some(b.to_vec())),
            Ok(Ok(b)) => Err(Error::corrupt(self.url_of(name), format!("object is {} bytes, more than the {max_bytes} allowed", b.len()))),
            Ok(Err(size)) => Err(Error::corrupt(self.url_of(name), format!("object is {size} bytes, more than the {max_bytes} allowed"))),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(name, None, e)),
        }
    }

    /// Whether object `name` exists.
    pub fn exists(&self, name: &str) -> Result<bool> {
        let (store, key) = (self.store.clone(), self.key(name));
        match block(async move { store.head(&key).await }) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.error(name, None, e)),
        }
    }

    /// Write `bytes` as `name` only if no object of that name exists ([`Error::AlreadyExists`]
    /// otherwise): the publish step.
    pub(crate) fn put_create(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let (store, key) = (self.store.clone(), self.key(name));
        let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
        block(async move { store.put_opts(&key, PutPayload::from(bytes), opts).await }).map(|_| ()).map_err(|e| self.error(name, None, e))
    }

    /// Upload local file `src` as `name` (multipart above 8 MiB, parts in parallel).
    pub(crate) fn upload(&self, src: &Path, name: &str) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let (store, key) = (self.store.clone(), self.key(name));
        let src_path = src.to_path_buf();
        let r = block(async move {
            let mut file = tokio::fs::File::open(&src_path).await.map_err(|e| Err(Error::io(&src_path, e)))?;
            let mut w = object_store::buffered::BufWriter::with_capacity(store, key, 8 << 20).with_max_concurrency(4);
            let mut buf = vec![0u8; 4 << 20];
            loop {
                use tokio::io::AsyncReadExt;
                let n = file.read(&mut buf).await.map_err(|e| Err(Error::io(&src_path, e)))?;
                if n == 0 {
                    break;
                }
                if let Err(e) = w.write_all(&buf[..n]).await {
                    let _ = w.abort().await;
                    return Err(Ok(e));
                }
            }
            w.shutdown().await.map_err(Ok)
        });
        match r {
            Ok(()) => Ok(()),
            Err(Err(e)) => Err(e),
            Err(Ok(io)) => {
                // BufWriter reports object_store errors through io::Error; keep the message.
                Err(Error::Remote { url: self.url_of(name), range: None, status: status_of(&io.to_string()), kind: RemoteKind::Other, message: io.to_string() })
            }
        }
    }

    /// Delete every object below `name/` (or `name` itself); missing objects are fine.
    pub(crate) fn delete_tree(&self, name: &str) -> Result<u64> {
        let store = self.store.clone();
        let prefix = self.key(name);
        let r = block(async move {
            let keys: Vec<ObjectPath> = store.list(Some(&prefix)).map_ok(|m| m.location).try_collect().await?;
            let n = keys.len() as u64;
            for k in keys {
                match store.delete(&k).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(n)
        });
        r.map_err(|e| self.error(name, None, e))
    }

    /// Delete object `name` (missing is fine).
    pub(crate) fn delete(&self, name: &str) -> Result<()> {
        let (store, key) = (self.store.clone(), self.key(name));
        match block(async move { store.delete(&key).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error(name, None, e)),
        }
    }

    /// The immediate sub-folders of this folder (names, sorted).
    pub fn list_dirs(&self) -> Result<Vec<String>> {
        let store = self.store.clone();
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let r = block(async move { store.list_with_delimiter(prefix.as_ref()).await });
        let listed = r.map_err(|e| self.error("", None, e))?;
        let mut dirs: Vec<String> = listed.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_string)).collect();
        dirs.sort();
        Ok(dirs)
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
