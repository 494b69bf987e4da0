//! The Python exception mapping, declared once.

use pyo3::create_exception;
use pyo3::exceptions::{PyFileExistsError, PyFileNotFoundError, PyIndexError, PyMemoryError, PyOSError, PyRuntimeError, PyTimeoutError, PyTypeError, PyValueError};
use pyo3::PyErr;

use crate::error::Error;

create_exception!(zrecord, CorruptStoreError, PyOSError, "A store file is truncated, damaged or of an unknown version.");

/// Map a zrecord error to the matching Python exception.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    exception(&e, msg)
}

/// The Python exception of `e`'s kind carrying `msg` (callers may pass a fuller message, e.g.
/// DataFusion's context around the zrecord error).
pub(crate) fn exception(e: &Error, msg: String) -> PyErr {
    match e {
        Error::IndexOutOfRange { .. } => PyIndexError::new_err(msg),
        Error::DtypeMismatch { .. } | Error::UnknownDtype { .. } | Error::WrongKind { .. } => PyTypeError::new_err(msg),
        Error::AlreadyExists { .. } => PyFileExistsError::new_err(msg),
        Error::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        Error::Corrupt { .. } | Error::Codec { .. } | Error::UnsupportedVersion { .. } => CorruptStoreError::new_err(msg),
        Error::OutOfMemory { .. } | Error::MemoryLimit { .. } => PyMemoryError::new_err(msg),
        Error::Panicked { .. } | Error::Internal(_) => PyRuntimeError::new_err(msg),
        Error::Context { source, .. } => exception(source, msg),
        Error::Shared(inner) => exception(inner, msg),
        Error::Timeout { .. } | Error::Peer { timed_out: true, .. } => PyTimeoutError::new_err(msg),
        Error::Peer { .. } => pyo3::exceptions::PyConnectionError::new_err(msg),
        Error::External { .. } | Error::Arrow(_) if !std::ptr::eq(e.root(), e) => exception(e.root(), msg),
        Error::Remote { kind: crate::error::RemoteKind::NotFound, .. } => PyFileNotFoundError::new_err(msg),
        Error::Remote { kind: crate::error::RemoteKind::PermissionDenied, .. } => pyo3::exceptions::PyPermissionError::new_err(msg),
        Error::Remote { .. } => PyOSError::new_err(msg),
        Error::Io { source, .. } => PyOSError::new_err((source.raw_os_error().unwrap_or(0), msg)),
        _ => PyValueError::new_err(msg),
    }
}

/// `.map_err(to_py)` shorthand.
pub(crate) trait IntoPy<T> {
    fn py_err(self) -> pyo3::PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self) -> pyo3::PyResult<T> {
        self.map_err(to_py)
    }
}
