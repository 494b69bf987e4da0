//! Stores and dataset roots on object storage: `s3://`, `gs://`, `az://` (and `abfs(s)://`,
//! `adl://`, `azure://`), `http(s)://` through the `object_store` crate. (`file://` URLs are local
//! folders: they open memory-mapped.)
//!
//! - **Configuration**: credentials and endpoints come from the environment (`AWS_*`,
//!   `GOOGLE_*`, `AZURE_*`, as object_store reads them) and from storage options registered for a
//!   URL prefix ([`register_storage_options`]; Python `zrecord.open(url, storage_options=...)`),
//!   with the keys object_store, delta-rs and Lance use (`aws_endpoint`, `aws_region`,
//!   `allow_http`, `google_service_account`, `azure_storage_account_name`, ...), plus zrecord's
//!   own `zrecord_*` keys for the read plan (see [`RemoteOptions`]).
//! - **Reads** ([`ObjectLocation`], [`ObjectFile`]): opening a store reads its manifest and the
//!   64-byte header of each file (one ranged GET each, sent together), nothing else. A gather
//!   first stages what it needs ([`preload`]): the index pages (and shape rows) of its ids, then
//!   its records' byte ranges, coalesced per file across gaps below `zrecord_coalesce_gap`, split
//!   at `zrecord_max_request_bytes`, and fetched concurrently (at most `zrecord_max_inflight`
//!   requests and `zrecord_max_inflight_bytes` bytes in flight); records are then checked and
//!   decoded from those buffers straight into the gather's pooled output, as from a local file.
//!   Fetched ranges stay in a per-store cache bounded by `zrecord_cache_bytes` (least recently
//!   used out first; ranges a running gather staged are pinned until it ends), so index pages
//!   of a store that fits are fetched once. Transient failures (5xx, 429, timeouts, dropped
//!   connections) are retried with exponential backoff by object_store's client
//!   (`zrecord_max_retries`, `zrecord_retry_timeout_s`); permanent ones are
//!   [`Error::Remote`] naming the URL, the byte range and the status.
//! - **Writes** ([`upload_published`], used by [`crate::store::Staging`]): a writer builds its
//!   output in a local staging folder as always; publishing uploads every data file under a fresh
//!   `data_dir` below the destination (multipart uploads for large files), then writes the
//!   manifest last with a create-only put. A crashed writer leaves only objects no manifest names;
//!   a second writer to the same URL gets [`Error::AlreadyExists`] and deletes what it uploaded;
//!   an existing store is never overwritten. [`leftovers`] lists unreferenced data folders
//!   (`zrec gc URL`).

use std::collections::{BTreeMap, HashMap};
use std::mem::MaybeUninit;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::error::{Error, RemoteKind, Result};
use crate::io::{ByteSource, Location};

use crate::io::runtime::block;

/// How remote reads are planned (the `zrecord_*` storage options).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RemoteOptions {
    /// Ranges of one file closer than this are fetched as one request (`zrecord_coalesce_gap`).
    pub coalesce_gap: u64,
    /// Largest single ranged request (`zrecord_max_request_bytes`).
    pub max_request_bytes: u64,
    /// Requests in flight at once (`zrecord_max_inflight`).
    pub max_inflight: usize,
    /// Bytes in flight at once (`zrecord_max_inflight_bytes`).
    pub max_inflight_bytes: u64,
    /// Bytes of fetched ranges kept per opened store (`zrecord_cache_bytes`).
    pub cache_bytes: u64,
    /// A local folder keeping fetched ranges across gathers, processes and runs
    /// (`zrecord_cache_dir`; none by default).
    pub cache_dir: Option<PathBuf>,
    /// Bound on the bytes in `cache_dir` (`zrecord_cache_dir_bytes`, default 10 GiB): the
    /// least recently written ranges go first.
    pub cache_dir_bytes: u64,
    /// Index and shape files are fetched in aligned pages of this size (`zrecord_page_bytes`).
    pub page_bytes: u64,
    /// Retries of a transient failure (`zrecord_max_retries`).
    pub max_retries: usize,
    /// Give up retrying after this long (`zrecord_retry_timeout_s`).
    pub retry_timeout_s: u64,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            coalesce_gap: 128 << 10,
            max_request_bytes: 8 << 20,
            max_inflight: 32,
            max_inflight_bytes: 256 << 20,
            cache_bytes: 256 << 20,
            cache_dir: None,
            cache_dir_bytes: 10 << 30,
            page_bytes: 64 << 10,
            max_retries: 6,
            retry_timeout_s: 60,
        }
    }
}

impl RemoteOptions {
    /// Apply one `zrecord_*` key; `Ok(false)` when the key is not one of ours.
    fn set(&mut self, key: &str, value: &str) -> Result<bool> {
        let num = || -> Result<u64> {
            value.trim().parse::<u64>().map_err(|_| Error::invalid("storage_options", format!("{key} must be a non-negative integer, got '{value}'")))
        };
        let positive = |v: u64, max: u64| -> Result<u64> {
            if v == 0 || v > max {
                return Err(Error::invalid("storage_options", format!("{key} must be in 1..={max}, got {v}")));
            }
            Ok(v)
        };
        match key {
            "zrecord_coalesce_gap" => self.coalesce_gap = num()?.min(1 << 30),
            "zrecord_max_request_bytes" => self.max_request_bytes = positive(num()?, 1 << 30)?,
            "zrecord_max_inflight" => self.max_inflight = positive(num()?, 1024)? as usize,
            "zrecord_max_inflight_bytes" => self.max_inflight_bytes = positive(num()?, 16 << 30)?,
            "zrecord_cache_bytes" => self.cache_bytes = num()?.min(1 << 40),
            "zrecord_cache_dir" => self.cache_dir = (!value.trim().is_empty()).then(|| PathBuf::from(value.trim())),
            "zrecord_cache_dir_bytes" => self.cache_dir_bytes = positive(num()?, 1 << 50)?,
            "zrecord_page_bytes" => self.page_bytes = positive(num()?, 64 << 20)?,
            "zrecord_max_retries" => self.max_retries = num()?.min(100) as usize,
            "zrecord_retry_timeout_s" => self.retry_timeout_s = positive(num()?, 3600)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Requests that may be in flight together.
    fn concurrency(&self) -> usize {
        let by_bytes = (self.max_inflight_bytes / self.max_request_bytes.max(1)).max(1);
        self.max_inflight.min(by_bytes as usize).max(1)
    }
}

/// Storage options registered per URL prefix (longest match wins).
/// `(URL prefix, options, whether secrets travel with pickles)`.
type Registered = Vec<(String, Vec<(String, String)>, bool)>;

fn registered() -> &'static Mutex<Registered> {
    static R: OnceLock<Mutex<Registered>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Vec::new()))
}

/// Use `options` for every URL at or below `prefix` (replacing what was registered for that
/// exact prefix). Keys are checked when a store is connected. Objects pickled for another
/// process carry these options (see [`options_to_pickle`]); the secret ones only when
/// `pickle_secrets`.
pub fn register_storage_options(prefix: &str, options: Vec<(String, String)>) -> Result<()> {
    register_storage_options_with(prefix, options, true)
}

/// [`register_storage_options`], choosing whether secret options travel with pickles.
pub fn register_storage_options_with(prefix: &str, options: Vec<(String, String)>, pickle_secrets: bool) -> Result<()> {
    let prefix = prefix.trim_end_matches('/').to_string();
    if !prefix.contains("://") {
        return Err(Error::invalid("storage_options", format!("'{prefix}' is not a URL (scheme://...)")));
    }
    // Fail now on bad keys rather than at the first read.
    connect_with(&format!("{prefix}/"), &options)?;
    let mut r = registered().lock().unwrap_or_else(|p| p.into_inner());
    r.retain(|(p, _, _)| *p != prefix);
    r.push((prefix, options, pickle_secrets));
    Ok(())
}

/// Whether options are registered for exactly `prefix`.
pub fn storage_options_registered(prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    registered().lock().unwrap_or_else(|p| p.into_inner()).iter().any(|(p, _, _)| p == prefix)
}

/// A storage option that is a credential: kept out of pickles when asked.
pub fn is_secret_option(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["secret", "token", "password", "access_key", "account_key", "sas", "service_account_key", "credential", "bearer"].iter().any(|s| k.contains(s))
}

/// The environment variables that hold credentials for `url`'s scheme (messages).
fn credential_variables(url: &str) -> &'static str {
    match url.split_once("://").map(|(s, _)| s.to_ascii_lowercase()).as_deref() {
        Some("s3" | "s3a") => "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_WEB_IDENTITY_TOKEN_FILE",
        Some("gs" | "gcs") => "GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_SERVICE_ACCOUNT",
        Some("az" | "abfs" | "abfss" | "azure") => "AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, AZURE_CLIENT_SECRET",
        _ => "none needed for this scheme",
    }
}

/// Whether credentials are configured for a store of `scheme`: a credential among `options`
/// (or anonymous access asked for), or in the environment. Schemes without credentials (http)
/// always have them.
fn has_credentials(scheme: &str, options: &[(String, String)]) -> bool {
    if options.iter().any(|(k, _)| is_secret_option(k) || k.contains("skip_signature") || k.contains("profile") || k.contains("use_emulator") || k.contains("anonymous")) {
        return true;
    }
    let env = |names: &[&str]| names.iter().any(|n| std::env::var_os(n).is_some_and(|v| !v.is_empty()));
    match scheme {
        "s3" | "s3a" => env(&["AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_SKIP_SIGNATURE"]),
        "gs" | "gcs" => env(&["GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY"]),
        "az" | "abfs" | "abfss" | "azure" => env(&["AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_TOKEN", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_STORAGE_USE_EMULATOR"]),
        _ => true,
    }
}

/// A registration: `(prefix, options, pickle_secrets)`.
type Registration = (String, Vec<(String, String)>, bool);

/// The registration that applies to `url`.
fn registration_for(url: &str) -> Option<Registration> {
    let r = registered().lock().unwrap_or_else(|p| p.into_inner());
    r.iter().filter(|(p, _, _)| url == p || url.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with('/'))).max_by_key(|(p, _, _)| p.len()).cloned()
}

fn options_for(url: &str) -> Vec<(String, String)> {
    registration_for(url.trim_end_matches('/')).map(|(_, o, _)| o).unwrap_or_default()
}

/// What an object reading `url` carries into another process when pickled: the prefix its
/// options were registered for and those options (without the secret ones when they were
/// registered with `pickle_secrets = false`; the other process then takes credentials from
/// its environment). `None` for local paths and URLs without registered options.
pub fn options_to_pickle(url: &str) -> Option<(String, Vec<(String, String)>)> {
    if !url.contains("://") {
        return None;
    }
    let (prefix, options, secrets) = registration_for(url.trim_end_matches('/'))?;
    Some((prefix, options.into_iter().filter(|(k, _)| secrets || !is_secret_option(k)).collect()))
}

/// A folder on an object store: the store, the key prefix, and the read plan.
#[derive(Clone)]
pub struct Remote {
    store: Arc<dyn ObjectStore>,
    /// Key prefix without a trailing slash ("" for the bucket root).
    prefix: String,
    /// `scheme://authority` (messages).
    root: String,
    opts: RemoteOptions,
    /// Whether credentials were configured (options or environment): a refused request
    /// without any says so.
    credentials: bool,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.url())
    }
}

type StoreKey = (String, Vec<(String, String)>);

fn stores() -> &'static Mutex<HashMap<StoreKey, Arc<dyn ObjectStore>>> {
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

fn build_store(scheme: &str, root: &str, options: &[(String, String)], opts: &RemoteOptions) -> std::result::Result<Arc<dyn ObjectStore>, String> {
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
async fn head_of(store: Arc<dyn ObjectStore>, key: ObjectPath, n: u64) -> object_store::Result<Option<(Bytes, u64)>> {
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
fn status_of(message: &str) -> Option<u16> {
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

    fn key(&self, name: &str) -> ObjectPath {
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

/// Fetched byte ranges of one opened store's files, bounded in bytes; least recently used out
/// first, except ranges pinned by a running gather.
struct RangeCache {
    map: BTreeMap<(u32, u64), CachedRange>,
    bytes: u64,
    clock: u64,
    budget: u64,
}

struct CachedRange {
    data: Bytes,
    used: u64,
    pins: u32,
    /// Record bytes staged for one gather: dropped when the last gather using them ends
    /// (metadata pages stay, least recently used out first).
    transient: bool,
}

impl RangeCache {
    /// The cached range of `file` covering `at..at + len`: its start and bytes.
    fn find(&mut self, file: u32, at: u64, len: u64) -> Option<(u64, Bytes)> {
        self.clock += 1;
        let clock = self.clock;
        // Ranges may overlap (a page and a record range inside it): look at the few nearest
        // ones starting at or before `at`.
        let (&(_, start), e) = self.map.range_mut((file, 0)..=(file, at)).rev().take(4).find(|((_, start), e)| start + e.data.len() as u64 >= at + len)?;
        e.used = clock;
        Some((start, e.data.clone()))
    }

    fn insert(&mut self, file: u32, start: u64, data: Bytes, pin: bool, transient: bool) {
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

    fn unpin(&mut self, file: u32, start: u64) {
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

    fn evict(&mut self) {
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

/// A store folder on an object store.
pub struct ObjectLocation {
    remote: Remote,
    path: PathBuf,
    cache: Arc<Mutex<RangeCache>>,
    next_file: std::sync::atomic::AtomicU32,
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
const OPEN_HEAD_BYTES: u64 = 64;

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
    fn file(&self, name: &str, expected_len: u64, head: Option<(Bytes, u64)>) -> Result<Box<dyn ByteSource>> {
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
    remote: Remote,
    name: String,
    path: PathBuf,
    len: u64,
    id: u32,
    cache: Arc<Mutex<RangeCache>>,
    /// This object's ranges in the local disk cache, when one is configured.
    disk: Option<DiskObject>,
}

impl ObjectFile {
    fn cache(&self) -> std::sync::MutexGuard<'_, RangeCache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The page-aligned range around `at..at + len`, clipped to the object.
    fn page_of(&self, at: u64, len: u64) -> Range<u64> {
        let page = self.remote.opts.page_bytes.max(1);
        let a = at / page * page;
        let z = (at + len).div_ceil(page).saturating_mul(page).min(self.len);
        a..z
    }
}

/// Copy `data[from..]` into `out`.
fn copy_out(data: &[u8], from: usize, out: &mut [MaybeUninit<u8>]) {
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

/// A local folder of fetched byte ranges shared by every store configured with it (and by other
/// processes): `<dir>/<object key>/<start>-<end>`, each written to a temporary name and renamed,
/// bounded in bytes (oldest files out first). A range read back is as trustworthy as one
/// fetched: record checksums are checked on first read in every process.
pub(crate) struct DiskCache {
    dir: PathBuf,
    budget: u64,
    /// Bytes in the folder (scanned once, then kept up to date by this process's writes).
    total: Mutex<Option<u64>>,
}

impl DiskCache {
    /// The cache at `dir` (one per folder in this process).
    fn at(dir: &Path, budget: u64) -> Arc<DiskCache> {
        static ALL: OnceLock<Mutex<HashMap<PathBuf, Arc<DiskCache>>>> = OnceLock::new();
        let mut all = ALL.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|p| p.into_inner());
        all.entry(dir.to_path_buf()).or_insert_with(|| Arc::new(DiskCache { dir: dir.to_path_buf(), budget, total: Mutex::new(None) })).clone()
    }

    fn files(&self) -> Vec<(std::time::SystemTime, u64, PathBuf)> {
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
    fn added(&self, n: u64) {
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
struct DiskObject {
    cache: Arc<DiskCache>,
    folder: PathBuf,
    /// start -> end of the ranges on disk (listed once, then kept up to date).
    ranges: Mutex<Option<BTreeMap<u64, u64>>>,
}

impl DiskObject {
    fn new(cache: Arc<DiskCache>, url: &str, size: u64) -> DiskObject {
        // Objects of published stores never change (each upload has its own folder); the
        // size in the key keeps a replaced object of another length apart anyway.
        let key = twox_hash::XxHash3_64::oneshot(format!("{url}\n{size}").as_bytes());
        let folder = cache.dir.join(format!("{key:016x}"));
        DiskObject { cache, folder, ranges: Mutex::new(None) }
    }

    fn with_ranges<T>(&self, f: impl FnOnce(&mut BTreeMap<u64, u64>) -> T) -> T {
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
    fn read(&self, r: Range<u64>) -> Option<Bytes> {
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
    fn write(&self, r: Range<u64>, data: &[u8]) {
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

/// Ranges a gather staged, pinned in their caches until this is dropped.
#[derive(Default)]
pub(crate) struct Staged {
    pins: Vec<(Arc<Mutex<RangeCache>>, u32, u64)>,
}

impl Staged {
    /// Keep `other`'s pins too.
    pub(crate) fn absorb(&mut self, mut other: Staged) {
        self.pins.append(&mut other.pins);
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (cache, file, start) in self.pins.drain(..) {
            cache.lock().unwrap_or_else(|p| p.into_inner()).unpin(file, start);
        }
    }
}

/// How [`preload`] rounds the ranges of a file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Aligned pages (index and shape rows: neighbours are likely wanted later).
    Pages,
    /// Exact ranges, coalesced across small gaps (record bytes).
    Ranges,
}

/// Bring every `(file, start, end)` range into the caches of its file, fetching what is
/// missing with coalesced ranged requests, all files' requests in flight together. The staged
/// ranges stay pinned while the returned guard lives.
pub(crate) fn preload(wanted: Vec<(&ObjectFile, u64, u64)>, plan: Plan) -> Result<Staged> {
    let mut staged = Staged::default();
    let Some(first) = wanted.first() else { return Ok(staged) };
    let opts = first.0.remote.opts.clone();
    // Group per file; drop ranges already cached (pinning them).
    let mut per_file: Vec<(&ObjectFile, Vec<Range<u64>>)> = Vec::new();
    for (f, a, z) in wanted {
        if z <= a {
            continue;
        }
        let (a, z) = if plan == Plan::Pages { let r = f.page_of(a, z - a); (r.start, r.end) } else { (a, z.min(f.len)) };
        match per_file.iter_mut().find(|(g, _)| std::ptr::eq(*g, f)) {
            Some((_, v)) => v.push(a..z),
            None => per_file.push((f, std::iter::once(a..z).collect())),
        }
    }
    let mut jobs: Vec<(usize, Vec<Range<u64>>)> = Vec::new();
    for (i, (f, ranges)) in per_file.iter_mut().enumerate() {
        ranges.sort_unstable_by_key(|r| (r.start, r.end));
        let mut missing: Vec<Range<u64>> = Vec::new();
        {
            let mut cache = f.cache();
            for r in ranges.iter() {
                if let Some((start, _)) = cache.find(f.id, r.start, r.end - r.start) {
                    if let Some(e) = cache.map.get_mut(&(f.id, start)) {
                        e.pins += 1;
                        staged.pins.push((f.cache.clone(), f.id, start));
                    }
                    continue;
                }
                missing.push(r.clone());
            }
        }
        // Ranges kept on local disk (earlier runs or processes) are read from there.
        if let Some(disk) = &f.disk {
            missing.retain(|r| match disk.read(r.clone()) {
                Some(data) => {
                    f.cache().insert(f.id, r.start, data, true, plan == Plan::Ranges);
                    staged.pins.push((f.cache.clone(), f.id, r.start));
                    false
                }
                None => true,
            });
        }
        // Coalesce across gaps, split at the request size limit.
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in missing {
            match merged.last_mut() {
                Some(m) if r.start <= m.end.saturating_add(opts.coalesce_gap) && r.end.max(m.end) - m.start <= opts.max_request_bytes => m.end = m.end.max(r.end),
                _ => merged.push(r),
            }
        }
        let mut split: Vec<Range<u64>> = Vec::with_capacity(merged.len());
        for m in merged {
            let mut a = m.start;
            while a < m.end {
                let z = (a + opts.max_request_bytes).min(m.end);
                split.push(a..z);
                a = z;
            }
        }
        if !split.is_empty() {
            jobs.push((i, split));
        }
    }
    if jobs.is_empty() {
        return Ok(staged);
    }
    // One stream of requests over every file, bounded together.
    type Task = (usize, Range<u64>, Arc<dyn ObjectStore>, ObjectPath);
    let tasks: Vec<Task> = jobs
        .iter()
        .flat_map(|(i, rs)| {
            let f = per_file[*i].0;
            rs.iter().map(move |r| (*i, r.clone(), f.remote.store.clone(), f.remote.key(&f.name)))
        })
        .collect();
    let concurrency = opts.concurrency();
    type Fetch = futures::future::BoxFuture<'static, (usize, Range<u64>, object_store::Result<Bytes>)>;
    let futs: Vec<Fetch> = tasks
        .into_iter()
        .map(|(i, r, store, key)| -> Fetch {
            Box::pin(async move {
                let res = store.get_range(&key, r.clone()).await;
                (i, r, res)
            })
        })
        .collect();
    let fetched = block(async move { futures::stream::iter(futs).buffer_unordered(concurrency).collect::<Vec<_>>().await });
    let mut first_err: Option<Error> = None;
    for (i, r, res) in fetched {
        let f = per_file[i].0;
        match res {
            Ok(data) if data.len() as u64 == r.end - r.start => {
                if let Some(disk) = &f.disk {
                    disk.write(r.clone(), &data);
                }
                f.cache().insert(f.id, r.start, data, true, plan == Plan::Ranges);
                staged.pins.push((f.cache.clone(), f.id, r.start));
            }
            Ok(data) => {
                first_err.get_or_insert_with(|| Error::corrupt(&f.path, format!("asked for {} bytes at {}, the server sent {}", r.end - r.start, r.start, data.len())));
            }
            Err(e) => {
                first_err.get_or_insert_with(|| f.remote.error(&f.name, Some(r), e));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(staged),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory_remote(opts: RemoteOptions) -> Remote {
        Remote { store: Arc::new(object_store::memory::InMemory::new()), prefix: "root/store".into(), root: "memory://test".into(), credentials: true, opts }
    }

    fn put(r: &Remote, name: &str, data: Vec<u8>) {
        let (store, key) = (r.store.clone(), r.key(name));
        block(async move { store.put(&key, PutPayload::from(data)).await }).unwrap_or_else(|e| panic!("{e}"));
    }

    fn read(f: &dyn ByteSource, at: u64, n: usize) -> Result<Vec<u8>> {
        f.read_vec(at, n)
    }

    #[test]
    fn ranges_coalesce_cache_and_pin() {
        let opts = RemoteOptions { coalesce_gap: 100, max_request_bytes: 1000, page_bytes: 256, cache_bytes: 4096, ..Default::default() };
        let r = memory_remote(opts);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        put(&r, "f", data.clone());
        let loc = ObjectLocation::new(r);
        assert!(matches!(loc.open("f", 9_999), Err(Error::Corrupt { .. })), "size is checked at open");
        assert!(matches!(loc.open("missing", 10), Err(Error::Remote { kind: crate::error::RemoteKind::NotFound, status: Some(404), .. })));
        let src = loc.open("f", 10_000).unwrap_or_else(|e| panic!("{e}"));
        let f = src.as_object().unwrap_or_else(|| panic!("an object file"));
        // 3 ranges within the gap merge into one request; a far one is its own; a long one splits.
        let staged = preload(vec![(f, 1000, 1010), (f, 1050, 1060), (f, 1100, 1200), (f, 5000, 5010), (f, 6000, 8500)], Plan::Ranges)
            .unwrap_or_else(|e| panic!("{e}"));
        {
            let c = f.cache();
            let starts: Vec<u64> = c.map.keys().filter(|k| k.0 == f.id).map(|k| k.1).collect();
            assert_eq!(starts, vec![0, 1000, 5000, 6000, 7000, 8000]);
            assert!(c.map.values().filter(|e| e.pins > 0).count() == 5);
        }
        for (at, n) in [(1000u64, 200usize), (1055, 3), (5000, 10), (6000, 1000), (7990, 20)] {
            if at == 7990 {
                // spans two cached requests: served by a fresh read, still exact
            }
            assert_eq!(read(src.as_ref(), at, n).unwrap_or_else(|e| panic!("{e}")), data[at as usize..at as usize + n]);
        }
        assert!(matches!(read(src.as_ref(), 9_990, 20), Err(Error::Corrupt { .. })), "past the end");
        drop(staged);
        {
            let c = f.cache();
            assert!(c.bytes <= 4096, "unpinned ranges are evicted down to the budget");
            assert!(c.map.keys().all(|k| ![1000, 5000, 6000, 7000, 8000].contains(&k.1)), "staged record ranges go when their gather ends: {:?}", c.map.keys().collect::<Vec<_>>());
        }
        // Pages: index-like reads round to aligned pages.
        let _s = preload(vec![(f, 300, 316), (f, 2000, 2016)], Plan::Pages).unwrap_or_else(|e| panic!("{e}"));
        let c = f.cache();
        assert!(c.map.contains_key(&(f.id, 256)) && c.map.contains_key(&(f.id, 1792)), "{:?}", c.map.keys().collect::<Vec<_>>());
    }

    #[test]
    fn options_are_checked() {
        let mut o = RemoteOptions::default();
        assert!(o.set("zrecord_max_inflight", "8").unwrap_or(false));
        assert_eq!(o.max_inflight, 8);
        assert!(matches!(o.set("zrecord_max_inflight", "0"), Err(Error::InvalidArgument { .. })));
        assert!(matches!(o.set("zrecord_coalesce_gap", "lots"), Err(Error::InvalidArgument { .. })));
        assert!(!o.set("aws_region", "x").unwrap_or(true));
        let e = connect_with("s3://bucket/x", &[("no_such_option".into(), "1".into())]);
        assert!(matches!(e, Err(Error::InvalidArgument { .. })), "{e:?}");
        assert!(matches!(connect_with("s3:///x", &[]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(connect_with("ftp://host/x", &[]), Err(Error::InvalidArgument { .. })));
        assert!(matches!(connect_with("s3://b/a/../c", &[]), Err(Error::InvalidArgument { .. })));
        assert_eq!(status_of("Server returned non-2xx status code: 503 Service Unavailable"), Some(503));
    }

    /// A store written locally, published to an (in-memory) object store, opened there and
    /// gathered: same records and order as the local store; index pages and record ranges are
    /// staged, not read one by one; a second publish to the same place fails and leaves
    /// nothing; a damaged object is caught by the checksums.
    #[test]
    fn store_round_trip_over_an_object_store() {
        use crate::prelude::*;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        for codec in [Codec::Raw, Codec::Zstd] {
            let local = dir.path().join(format!("ragged-{}", codec.name()));
            let mut w = RaggedWriter::create(&local, DType::Int32, 1, WriterOptions { codec, data_shards: 3, ..Default::default() })
                .unwrap_or_else(|e| panic!("{e}"));
            let recs: Vec<Vec<i32>> = (0..500).map(|i| (0..(i % 37 + 1)).map(|j| i * 100 + j).collect()).collect();
            let shapes: Vec<[usize; 1]> = recs.iter().map(|r| [r.len()]).collect();
            let packed = PackedRagged::from_records(1, recs.iter().zip(&shapes).map(|(r, s)| (&r[..], &s[..]))).unwrap_or_else(|e| panic!("{e}"));
            w.append(&packed.as_input()).unwrap_or_else(|e| panic!("{e}"));
            w.finish().unwrap_or_else(|e| panic!("{e}"));

            let opts = RemoteOptions { page_bytes: 1024, coalesce_gap: 64, ..Default::default() };
            let remote = memory_remote(opts);
            let manifest = std::fs::read(local.join(crate::store::format::MANIFEST)).unwrap_or_else(|e| panic!("{e}"));
            crate::store::publish::upload_store(&local, &remote, &manifest).unwrap_or_else(|e| panic!("{e}"));
            let again = crate::store::publish::upload_store(&local, &remote, &manifest);
            assert!(matches!(again, Err(Error::AlreadyExists { .. })), "{again:?}");
            assert!(crate::store::publish::remote_leftovers(&remote, false).unwrap_or_else(|e| panic!("{e}")).is_empty(), "the losing writer cleaned up");

            let loc = ObjectLocation::new(remote.clone());
            let store = Store::open_at(&loc).unwrap_or_else(|e| panic!("{e}"));
            let Store::Ragged(rs) = store else { panic!("a ragged store") };
            let view = rs.bind(&Allocator::default());
            let ids: Vec<u64> = vec![499, 0, 17, 17, 250, 3, 498, 100];
            let b = view.gather(&ids).unwrap_or_else(|e| panic!("{e}"));
            let want: Vec<i32> = ids.iter().flat_map(|&i| recs[i as usize].clone()).collect();
            assert_eq!(b.values().as_slice::<i32>().unwrap_or_else(|e| panic!("{e}")), &want[..]);
            let all: Vec<u64> = (0..500).collect();
            let b = view.gather(&all).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(b.values().as_slice::<i32>().unwrap_or_else(|e| panic!("{e}")).len(), recs.iter().map(|r| r.len()).sum::<usize>());
            assert!(matches!(view.gather(&[500]), Err(Error::IndexOutOfRange { .. })));

            // A flipped byte in a data object: the record's checksum catches it on a fresh open.
            let (shard, mut bytes) = first_shard(&remote);
            let last = bytes.len() - 1;
            bytes[last] ^= 0x55;
            put(&remote, &shard, bytes);
            let store = Store::open_at(&ObjectLocation::new(remote.clone())).unwrap_or_else(|e| panic!("{e}"));
            let Store::Ragged(rs) = store else { panic!("a ragged store") };
            let r = rs.bind(&Allocator::default()).gather(&all);
            assert!(matches!(r, Err(Error::Corrupt { .. }) | Err(Error::Codec { .. })), "{r:?}");
        }
    }

    /// Ranges fetched once are kept in the local disk folder and served from there by a later
    /// opening (another process, another run): with the object's bytes replaced on the server
    /// by garbage of the same size, records gathered before still read back exactly; others
    /// fail their checksums. The folder stays within its bound.
    #[test]
    fn disk_cache_serves_ranges_across_openings() {
        use crate::prelude::*;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let local = dir.path().join("dense");
        let mut w = DenseWriter::create(&local, DType::UInt8, &[1000], WriterOptions::default()).unwrap_or_else(|e| panic!("{e}"));
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        w.append_slice(&data).unwrap_or_else(|e| panic!("{e}"));
        w.finish().unwrap_or_else(|e| panic!("{e}"));
        let cache_dir = dir.path().join("cache");
        let opts = RemoteOptions { cache_dir: Some(cache_dir.clone()), cache_dir_bytes: 64 << 10, coalesce_gap: 0, ..Default::default() };
        let remote = memory_remote(opts);
        let manifest = std::fs::read(local.join(crate::store::format::MANIFEST)).unwrap_or_else(|e| panic!("{e}"));
        crate::store::publish::upload_store(&local, &remote, &manifest).unwrap_or_else(|e| panic!("{e}"));
        let ids = [7u64, 150, 3];
        let want: Vec<u8> = ids.iter().flat_map(|&i| data[i as usize * 1000..(i as usize + 1) * 1000].to_vec()).collect();
        let gather = |ids: &[u64]| -> Result<Vec<u8>> {
            let Store::Dense(s) = Store::open_at(&ObjectLocation::new(remote.clone()))? else { panic!("dense") };
            Ok(s.bind(&Allocator::default()).gather(ids)?.as_bytes().to_vec())
        };
        assert_eq!(gather(&ids).unwrap_or_else(|e| panic!("{e}")), want);
        // garbage on the server, same size, header kept
        let (shard, mut bytes) = first_shard(&remote);
        for b in &mut bytes[crate::store::format::HEADER_BYTES..] {
            *b = !*b;
        }
        put(&remote, &shard, bytes);
        let again = gather(&[150, 3, 7, 7]).unwrap_or_else(|e| panic!("{e}"));
        assert!(again == [&want[1000..], &want[..1000], &want[..1000]].concat(), "served from disk");
        assert!(matches!(gather(&[42]), Err(Error::Corrupt { .. })), "not cached: fetched, and the checksum catches the garbage");
        // the bound holds
        for k in 0..150u64 {
            let _ = gather(&[k + 40]);
        }
        let total: u64 = walk(&cache_dir);
        assert!(total <= 64 << 10, "{total}");
    }

    /// The object name and bytes of the first data shard of the store published at `remote`.
    fn first_shard(remote: &Remote) -> (String, Vec<u8>) {
        let m = crate::store::format::Manifest::from_bytes(
            &remote.get_small(crate::store::format::MANIFEST, 1 << 20).unwrap_or_else(|e| panic!("{e}")).unwrap_or_default(),
            Path::new("m"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let shard = m.stored_name(&crate::store::format::shard_name(0));
        let bytes = remote.get_small(&shard, 1 << 30).unwrap_or_else(|e| panic!("{e}")).unwrap_or_default();
        (shard, bytes)
    }

    fn walk(p: &Path) -> u64 {
        std::fs::read_dir(p).map(|rd| rd.flatten().map(|e| if e.path().is_dir() { walk(&e.path()) } else { e.metadata().map(|m| m.len()).unwrap_or(0) }).sum()).unwrap_or(0)
    }
}
