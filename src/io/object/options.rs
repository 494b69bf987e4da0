//! Storage options: the `zrecord_*` read plan, registrations per URL prefix, secrets and pickling.

#[allow(unused_imports)]
use super::*;

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
    pub(super) fn set(&mut self, key: &str, value: &str) -> Result<bool> {
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
    pub(super) fn concurrency(&self) -> usize {
        let by_bytes = (self.max_inflight_bytes / self.max_request_bytes.max(1)).max(1);
        self.max_inflight.min(by_bytes as usize).max(1)
    }
}

/// Storage options registered per URL prefix (longest match wins).
/// `(URL prefix, options, whether secrets travel with pickles)`.
pub(super) type Registered = Vec<(String, Vec<(String, String)>, bool)>;

pub(super) fn registered() -> &'static Mutex<Registered> {
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
pub(super) fn credential_variables(url: &str) -> &'static str {
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
pub(super) fn has_credentials(scheme: &str, options: &[(String, String)]) -> bool {
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
pub(super) type Registration = (String, Vec<(String, String)>, bool);

/// The registration that applies to `url`.
pub(super) fn registration_for(url: &str) -> Option<Registration> {
    let r = registered().lock().unwrap_or_else(|p| p.into_inner());
    r.iter().filter(|(p, _, _)| url == p || url.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with('/'))).max_by_key(|(p, _, _)| p.len()).cloned()
}

pub(super) fn options_for(url: &str) -> Vec<(String, String)> {
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
