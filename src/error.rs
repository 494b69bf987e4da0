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
    /// Input data has a different dtype than the store.
    #[error("dtype mismatch: store has {expected}, input has {found}")]
    DtypeMismatch {
        /// The store dtype.
        expected: String,
        /// The input dtype.
        found: String,
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
        matches!(self, Error::Corrupt { .. } | Error::Codec { .. } | Error::UnsupportedVersion { .. })
    }
}
