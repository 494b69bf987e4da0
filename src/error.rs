//! The one error type of the crate. Every variant names what was wrong and where.

use std::path::PathBuf;

/// Result alias used throughout zrecord.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in zrecord, with typed payloads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An operating-system I/O error on a named file or folder.
    #[error("I/O error on '{path}': {source}")]
    Io {
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The destination of a writer already exists; stores are never overwritten.
    #[error("destination '{path}' already exists; zrecord stores are immutable, choose a new path")]
    AlreadyExists {
        /// The existing path.
        path: PathBuf,
    },
    /// No store (or no published store) exists at the path.
    #[error("no zrecord store at '{path}': {reason}")]
    NotFound {
        /// The path that was opened.
        path: PathBuf,
        /// What was missing.
        reason: String,
    },
    /// A store file is damaged: truncated, bit-flipped or inconsistent.
    #[error("corrupt store file '{path}': {reason}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// What check failed.
        reason: String,
    },
    /// The store was written by an unknown format version.
    #[error("store '{path}' has format version {found}; this build reads version {supported}")]
    UnsupportedVersion {
        /// The store's manifest.
        path: PathBuf,
        /// Version found on disk.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The store at the path is of the other kind (dense vs ragged).
    #[error("store '{path}' is {found}, not {expected}")]
    WrongKind {
        /// The store.
        path: PathBuf,
        /// Kind the caller asked for.
        expected: &'static str,
        /// Kind on disk.
        found: &'static str,
    },
    /// A dtype name that is not in the catalog.
    #[error("unknown or unsupported dtype '{name}'; supported: {supported}")]
    UnknownDtype {
        /// The rejected name.
        name: String,
        /// The catalog names.
        supported: String,
    },
    /// A codec name or configuration that is not valid.
    #[error("invalid codec: {reason}")]
    InvalidCodec {
        /// What is wrong.
        reason: String,
    },
    /// Data of one dtype where another is needed (input to a store, a typed view of a tensor,
    /// a Zarr array's type).
    #[error("dtype mismatch{}: expected {expected}, found {found}", if what.is_empty() { String::new() } else { format!(" ({what})") })]
    DtypeMismatch {
        /// The dtype needed.
        expected: crate::dtype::DType,
        /// The dtype given.
        found: crate::dtype::DType,
        /// What was being checked (a field, a record): empty when obvious.
        what: String,
    },
    /// Input data has the wrong shape.
    #[error("shape mismatch: expected {expected}, found {found}")]
    ShapeMismatch {
        /// What the store needs.
        expected: String,
        /// What was given.
        found: String,
    },
    /// Input is not C-contiguous.
    #[error("input {what} is not C-contiguous (shape {shape:?}, strides {strides:?}); make it contiguous first")]
    NotContiguous {
        /// Which input.
        what: String,
        /// Its shape.
        shape: Vec<usize>,
        /// Its strides in elements.
        strides: Vec<isize>,
    },
    /// A ragged batch whose offsets or shapes are inconsistent.
    #[error("invalid ragged batch: {reason}")]
    InvalidRagged {
        /// What is wrong.
        reason: String,
    },
    /// A single record larger than the 2 GiB record limit.
    #[error("record {index} is {bytes} bytes; a record may be at most 2 GiB ({limit} bytes)")]
    RecordTooLarge {
        /// Position in the input batch.
        index: usize,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// More values in one packed ragged append than int32 offsets can address.
    #[error("one packed ragged append holds {count} values; the limit is i32::MAX ({limit}); split the append")]
    TooManyValues {
        /// Values given.
        count: u64,
        /// The limit.
        limit: u64,
    },
    /// An index outside `0..len`.
    #[error("index {index} out of range for store '{store}' of {len} records")]
    IndexOutOfRange {
        /// The offending index.
        index: i128,
        /// The number of records.
        len: u64,
        /// The store path.
        store: PathBuf,
    },
    /// An argument outside its allowed range.
    #[error("invalid argument {name}: {reason}")]
    InvalidArgument {
        /// The argument.
        name: &'static str,
        /// Why it is rejected.
        reason: String,
    },
    /// A codec failure while encoding or decoding a record.
    #[error("codec error on '{path}': {reason}")]
    Codec {
        /// The file involved.
        path: PathBuf,
        /// What zstd said.
        reason: String,
    },
    /// The writer or allocator was already closed.
    #[error("{what} is closed")]
    Closed {
        /// What was closed.
        what: &'static str,
    },
    /// Memory for an output region could not be had.
    #[error("out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// The size asked for.
        bytes: usize,
    },
    /// An allocation would take an allocator past its `max_bytes` cap.
    #[error("allocating {bytes} bytes would exceed the allocator's max_bytes of {max_bytes} ({live} bytes are live)")]
    MemoryLimit {
        /// The size asked for.
        bytes: usize,
        /// Bytes live in the allocator at the time.
        live: usize,
        /// The cap.
        max_bytes: usize,
    },
    /// Code run on a worker thread (a loader's transform or sampler) panicked; the panic is
    /// caught there and delivered as this step's result instead of leaving the consumer waiting.
    #[error("{what} panicked at step {step}: {message}")]
    Panicked {
        /// What panicked.
        what: &'static str,
        /// The step being produced.
        step: u64,
        /// The panic message.
        message: String,
    },
    /// An Arrow error (array construction, casts, IPC), kept whole.
    #[error("Arrow error: {0}")]
    Arrow(#[from] arrow_schema::ArrowError),
    /// An error of another library (DataFusion planning or execution, an image decoder, a
    /// tokenizer), kept whole: [`Error::root`] finds a zrecord error carried inside it.
    #[error("{what} error: {source}")]
    External {
        /// Which library.
        what: &'static str,
        /// Its error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// A broken invariant of zrecord itself (a bug: please report it), never bad input.
    #[error("internal error (a zrecord bug, please report it): {0}")]
    Internal(String),
    /// A wait that ran out of time.
    #[error("timed out: {what}")]
    Timeout {
        /// What was waited for.
        what: String,
    },
    /// A request to an object store failed for good (after retries for transient failures).
    #[error("{} request for '{url}'{} failed{}: {message}", kind.describe(), range.map(|(a, z)| format!(" bytes {a}..{z}")).unwrap_or_default(), status.map(|s| format!(" with HTTP status {s}")).unwrap_or_default())]
    Remote {
        /// The object's URL.
        url: String,
        /// The byte range asked for, if any.
        range: Option<(u64, u64)>,
        /// The HTTP status, when there was one.
        status: Option<u16>,
        /// What kind of failure.
        kind: RemoteKind,
        /// The store client's message.
        message: String,
    },
    /// A rank of a distributed store did not serve a variable: it exited, refused the
    /// connection, answered wrongly, or did not answer within the timeout.
    #[error("rank {rank} did not serve '{variable}'{}: {message}", if *timed_out { " in time" } else { "" })]
    Peer {
        /// The rank.
        rank: usize,
        /// The variable.
        variable: String,
        /// What happened.
        message: String,
        /// True when the timeout ran out.
        timed_out: bool,
    },
    /// One error reported to several callers (a pipeline's sticky failure).
    #[error("{0}")]
    Shared(std::sync::Arc<Error>),
    /// An error with what was being done when it happened.
    #[error("{context}: {source}")]
    Context {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<Error>,
    },
}

/// The kind of an [`Error::Remote`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteKind {
    /// The object does not exist (404).
    NotFound,
    /// Credentials missing or refused (401, 403).
    PermissionDenied,
    /// Anything else (5xx after retries, connection failures, bad responses).
    Other,
}

impl RemoteKind {
    fn describe(&self) -> &'static str {
        match self {
            RemoteKind::NotFound => "object not found:",
            RemoteKind::PermissionDenied => "permission denied:",
            RemoteKind::Other => "object store",
        }
    }
}

impl Error {
    /// Wrap an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    /// A corruption error naming the damaged file.
    pub fn corrupt(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Corrupt { path: path.into(), reason: reason.into() }
    }

    /// An invalid-argument error.
    pub fn invalid(name: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { name, reason: reason.into() }
    }

    /// An invalid-ragged-batch error.
    pub fn ragged(reason: impl Into<String>) -> Self {
        Error::InvalidRagged { reason: reason.into() }
    }

    /// True when the error means the store on disk is damaged.
    pub fn is_corruption(&self) -> bool {
        matches!(self.root(), Error::Corrupt { .. } | Error::Codec { .. } | Error::UnsupportedVersion { .. })
    }

    /// Add what was being done to an error.
    pub fn context(self, context: impl Into<String>) -> Self {
        Error::Context { context: context.into(), source: Box::new(self) }
    }

    /// An error of another library, kept whole.
    pub fn external(what: &'static str, source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>) -> Self {
        Error::External { what, source: source.into() }
    }

    /// The innermost zrecord error: through [`Error::Context`] layers, and through foreign
    /// errors (DataFusion, Arrow) that carry a zrecord error somewhere in their source chain.
    pub fn root(&self) -> &Error {
        let mut cur = self;
        loop {
            match cur {
                Error::Context { source, .. } => cur = source,
                Error::Shared(inner) => cur = inner,
                Error::External { source, .. } => match find_in(source.as_ref()) {
                    Some(inner) => cur = inner,
                    None => return cur,
                },
                Error::Arrow(a) => match find_in(a) {
                    Some(inner) => cur = inner,
                    None => return cur,
                },
                _ => return cur,
            }
        }
    }
}

/// The first zrecord [`Error`] in `e`'s chain (`e` itself, then its sources), if any.
pub fn find_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Error> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    let mut hops = 0;
    while let Some(c) = cur {
        if let Some(z) = c.downcast_ref::<Error>() {
            return Some(z);
        }
        hops += 1;
        if hops > 64 {
            return None;
        }
        cur = c.source();
    }
    None
}

/// `.context(...)` on results.
pub trait ResultExt<T> {
    /// Wrap the error with what was being done.
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> ResultExt<T> for Result<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| e.context(context()))
    }
}

impl From<Error> for arrow_schema::ArrowError {
    /// Kept whole as an external error; a wrapped Arrow error is unwrapped.
    fn from(e: Error) -> Self {
        match e {
            Error::Arrow(a) => a,
            other => arrow_schema::ArrowError::ExternalError(Box::new(other)),
        }
    }
}

/// Run `f`, turning a panic into [`Error::Panicked`].
pub(crate) fn catch_panic<R>(what: &'static str, step: u64, f: impl FnOnce() -> Result<R>) -> Result<R> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".into());
        Err(Error::Panicked { what, step, message })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zrecord_errors_are_found_inside_foreign_ones() {
        let a: arrow_schema::ArrowError = Error::OutOfMemory { bytes: 5 }.into();
        let wrapped = Error::Arrow(a);
        assert!(matches!(wrapped.root(), Error::OutOfMemory { bytes: 5 }));
        let ext = Error::external("test", arrow_schema::ArrowError::from(Error::corrupt("/x", "bad")));
        assert!(ext.root().is_corruption() && ext.is_corruption());
        let plain = Error::external("test", std::io::Error::other("no"));
        assert!(std::ptr::eq(plain.root(), &plain));
        assert_eq!(plain.to_string(), "test error: no");
        let c = Error::corrupt("/y", "z").context("opening y");
        assert!(c.is_corruption());
        assert_eq!(c.to_string(), "opening y: corrupt store file '/y': z");
        assert!(std::error::Error::source(&c).is_some());
    }
}
